"""Contracts of the indexer-K gather (``cp_gather_indexer_k_quant_cache``, SPEC 5, seed 004 item 4).

* ``gather-oracle-exact``  every output byte equals the byte-level oracle's (``oracles.cp_gather``): copied tokens,
  zero scales of invalid blocks, untouched rows of invalid tokens; the cache is never written.
* ``compile-once``         gfx950's variant compiles one specialization for one cache and table geometry whatever
  the token and batch counts.

``compile-once`` judges a kernel's specializations without compiling on the CPU: each launch of the kernel the
subject names (``bound(target).cp_gather.gather_kernel(target)``) is captured by wrapping the kernel object's
``run`` for the duration of the case (the kernel itself is not edited), and :func:`specialization_key` derives the
key Triton would cache the compilation under from the kernel's own JIT metadata and the launch's argument values.
Natively the compiled kernels Triton returns are counted as well and the two partitions of the launches must agree.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field, replace

import torch
from hypothesis import strategies as st

from contracts.core import ALL_TARGETS, Violation, contract, fmt
from contracts.compile_keys import (  # noqa: F401 - re-exported: the tests and the adapter use them here
    kernel_params, key_differences, specialization_key, specialize_value)
from contracts.subjects import bound
from fuzz import cp_gather as fg
from fuzz.cp_gather import CompileOnceCase, CpGatherCase
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import cp_gather as ocg
from oracles.formats import storage_bytes

# --- gather-oracle-exact ------------------------------------------------------------------------------------------


def host_refusal_reasons(case: CpGatherCase) -> list[str]:
    """What in ``case``'s metadata a subject may refuse before launching (with outputs untouched), instead of
    masking it: sequences longer than their table row covers. (Invalid batch ids, token ranges and block ids live
    in token_to_seq and block_table, which the gather masks.)"""
    return [f"sequence {b} needs more than {case.table_width} table columns" for b in case.narrow_table]


def _row_diffs(what: str, got: torch.Tensor, want: torch.Tensor, kinds: dict, limit: int = 3) -> list[Violation]:
    """One violation per differing row (at most ``limit`` per message), named by what the gather does to it."""
    bad = (got != want).any(dim=1).nonzero().flatten().tolist()
    words = {"copied": "a gathered token", "zero-scale": "a token whose block is invalid (scale must be 0)",
             "untouched": "an invalid token (rows must stay untouched)"}
    out, shown, more = [], Counter(), Counter()
    for t in bad:
        msg = f"{what} row of {words[kinds[t]]} differs from the oracle"
        if shown[msg] >= limit:
            more[msg] += 1
            continue
        shown[msg] += 1
        lanes = (got[t] != want[t]).nonzero().flatten().tolist()
        out.append(Violation(msg, f"{what}[{t}] bytes {lanes[:6]}{'...' if len(lanes) > 6 else ''}",
                             fmt(want[t][lanes[:6]]), fmt(got[t][lanes[:6]])))
    out += [Violation(f"{msg}: {n} more rows", what) for msg, n in more.items()]
    return out


def _run_gather(gather, inp: dict, target: Target, check_metadata: bool):
    return gather(inp["k_cache"], inp["k_fp8"], inp["k_scale"], inp["block_table"], inp["cu_seqlen"],
                  inp["token_to_seq"], layout=inp["layout"], target=target, check_metadata=check_metadata)


def _compare(label: str, case: CpGatherCase, inp: dict, k_fp8_before, k_scale_before, pool_before) -> list:
    got_f, got_s = inp["k_fp8"].cpu().clone(), inp["k_scale"].cpu().clone()
    cache_cpu = _cpu_view(inp["pool"], inp["k_cache"])
    want_f, want_s = ocg.ref_cp_gather(cache_cpu, k_fp8_before, k_scale_before, case.table, case.cu_seqlen,
                                       case.token_to_seq, case.resolved_layout)
    kinds = ocg.gathered_tokens(case.table, case.cu_seqlen, case.token_to_seq, case.num_blocks, case.block_size)
    out = _row_diffs(f"{label}k_fp8", got_f, want_f, kinds) + _row_diffs(f"{label}k_scale", got_s, want_s, kinds)
    changed = int((inp["pool"].cpu() != pool_before).sum())
    if changed:
        out.append(Violation(f"{label}the gather wrote into the cache pool", "k_cache's pool", "unchanged",
                             f"{changed} bytes changed"))
    return out


def _cpu_view(pool: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    cpu = pool.cpu()
    _, base = storage_bytes(view)
    _, pool_base = storage_bytes(pool)
    return cpu[base - pool_base:].as_strided(tuple(view.shape), tuple(view.stride()))


LAYOUT_ARGS = {"table_layout": ("block_table",), "seq_layout": ("cu_seqlen", "token_to_seq"),
               "out_layout": ("k_fp8", "k_scale")}
LAYOUT_REFUSAL_UNCLEAR = "refusal of a non-packed layout does not name the argument"
LAYOUT_REFUSAL_WROTE = "refusal of a non-packed layout changed the outputs or the cache"
LAYOUT_READ_PACKED = "a non-packed layout is read as if packed: the outputs differ from a contiguous copy's"
LAYOUT_GAP_WRITTEN = "the gather wrote outside the strided output rows"


def _laid_out(case: CpGatherCase) -> dict:
    """The case's non-packed layout fields and their values."""
    return {f: getattr(case, f) for f in LAYOUT_ARGS if getattr(case, f) != "contiguous"}


def _snapshot(inp: dict) -> list[torch.Tensor]:
    return [inp["k_fp8_buf"].cpu().clone(), inp["k_scale_buf"].cpu().clone(), inp["pool"].cpu().clone()]


def compare_layout(case: CpGatherCase, target: Target, gather=None) -> list[Violation]:
    """A case whose table, cu_seqlen / token_to_seq or outputs are not packed: the subject refuses with a
    ValueError/TypeError naming one of those arguments, outputs and cache untouched, or writes exactly the output
    bytes it writes from packed copies of the same values (that packed twin judged against the oracle) and no
    byte of the outputs' buffers outside the views. Both runs pass ``check_metadata=False`` (the kernel's masks)."""
    gather = gather or bound(target).cp_gather.cp_gather_indexer_k_quant_cache
    dev = kernel_device()
    laid = _laid_out(case)
    names = [n for f in laid for n in LAYOUT_ARGS[f]]
    packed = replace(case, **{f: "contiguous" for f in laid})
    ref = fg.build_gather_inputs(packed, dev)
    ref_before = [ref["k_fp8"].cpu().clone(), ref["k_scale"].cpu().clone(), ref["pool"].cpu().clone()]
    _run_gather(gather, ref, target, False)
    # the packed twin is judged against the oracle (the values); the laid-out run against the twin (the memory)
    out = _compare("", packed, ref, *ref_before)
    inp = fg.build_gather_inputs(case, dev)
    before = _snapshot(inp)
    try:
        _run_gather(gather, inp, target, False)
    except (ValueError, TypeError) as exc:
        if not any(n in str(exc) for n in names):
            out.append(Violation(LAYOUT_REFUSAL_UNCLEAR, "error message", f"one of {names}", str(exc)[:200]))
        if not all(torch.equal(a, b) for a, b in zip(_snapshot(inp), before)):
            out.append(Violation(LAYOUT_REFUSAL_WROTE, "k_fp8 / k_scale / pool", "unchanged", "bytes differ"))
        return out
    for name in ("k_fp8", "k_scale"):
        got, want = inp[name].cpu(), ref[name].cpu()
        bad = (got != want).any(dim=1).nonzero().flatten().tolist()
        if bad:
            where = f"{name} rows {bad[:6]} ({', '.join(f'{k}={v}' for k, v in laid.items())})"
            out.append(Violation(LAYOUT_READ_PACKED, where, fmt(want[bad[0]][:8]), fmt(got[bad[0]][:8])))
        # the geometry from the tensors where they live: a strided view copied to the host is packed there
        buf_dev, view = inp[f"{name}_buf"], inp[name]
        buf = buf_dev.cpu()
        if buf_dev.data_ptr() != view.data_ptr() or buf_dev.shape != view.shape:
            mask = torch.ones(buf.numel(), dtype=torch.bool)
            _, base = storage_bytes(view)
            _, buf_base = storage_bytes(buf_dev)
            offs = (torch.arange(view.shape[0])[:, None] * view.stride(0) + torch.arange(view.shape[1])[None, :])
            mask[(offs + base - buf_base).flatten()] = False
            first = before[0 if name == "k_fp8" else 1].reshape(-1)
            if not torch.equal(buf.reshape(-1)[mask], first[mask]):
                out.append(Violation(LAYOUT_GAP_WRITTEN, f"{name}'s buffer", "gap bytes unchanged", "written"))
    if not torch.equal(inp["pool"].cpu(), before[2]):
        out.append(Violation("the gather wrote into the cache pool", "k_cache's pool", "unchanged", "bytes changed"))
    return out


def _gather_examples(target: Target) -> list[CpGatherCase]:
    return fg.gather_examples()


@contract("gather-oracle-exact", targets=ALL_TARGETS, cases=lambda target: fg.gather_cases(),
          examples=_gather_examples, min_cases=5, case_type=CpGatherCase, numeric=False)
def gather_oracle_exact(case: CpGatherCase, target: Target) -> list[Violation]:
    """The indexer-K gather copies bytes exactly as the byte-level oracle does (SPEC 5, 1.3).

    For NORMAL, SHUFFLE and the default layout, odd block sizes and caches that are strided views into a larger
    pool, with outputs poisoned by random bytes: a token whose chain token_to_seq -> cu_seqlen range -> table
    column -> block id holds gets its 128 fp8 bytes and 4 scale bytes; a valid token whose table column or block
    id is invalid gets a zero scale and keeps its fp8 row; an invalid token (batch id outside [0, B), or a token
    outside its sequence's range, or a row past the last sequence) keeps both rows; no cache byte changes. Metadata
    the subject may refuse before launching (a sequence longer than its table row) is either refused with a
    ValueError/TypeError and untouched outputs, then judged again with ``check_metadata=False`` (the kernel's masks),
    or masked as above. An empty cache (no blocks) may be refused (ValueError/TypeError/RuntimeError, outputs
    untouched) or gathered as above (every block invalid). A case whose block table, cu_seqlen / token_to_seq or outputs are not packed
    (:func:`compare_layout`) is refused naming one of them, or gives exactly the bytes of packed copies and writes
    nothing between the output rows."""
    gather = bound(target).cp_gather.cp_gather_indexer_k_quant_cache
    if _laid_out(case):
        return compare_layout(case, target, gather)
    dev = kernel_device()
    inp = fg.build_gather_inputs(case, dev)
    k_fp8_before, k_scale_before = inp["k_fp8"].cpu().clone(), inp["k_scale"].cpu().clone()
    pool_before = inp["pool"].cpu().clone()
    refusable = host_refusal_reasons(case)
    if case.num_blocks == 0:
        # an empty cache (no pool has one in production): a subject may refuse it loudly before writing anything
        # (upstream's host code fails reshaping it); one that gathers must give every valid token a zero scale
        try:
            _run_gather(gather, inp, target, True)
        except (ValueError, TypeError, RuntimeError):
            if torch.equal(inp["k_fp8"].cpu(), k_fp8_before) and torch.equal(inp["k_scale"].cpu(), k_scale_before):
                return []
            return [Violation("a gather that refused an empty cache changed its outputs", "k_fp8 / k_scale",
                              "untouched", "written")]
        return _compare("", case, inp, k_fp8_before, k_scale_before, pool_before)
    try:
        _run_gather(gather, inp, target, True)
    except (ValueError, TypeError) as exc:
        if not refusable:
            return [Violation("the gather refused valid input", "call", "a gather", f"{type(exc).__name__}: {exc}")]
        out = []
        if not (torch.equal(inp["k_fp8"].cpu(), k_fp8_before) and torch.equal(inp["k_scale"].cpu(), k_scale_before)):
            out.append(Violation("a refused gather changed its outputs", "k_fp8 / k_scale", "untouched", "written"))
        inp["k_fp8"].copy_(k_fp8_before.to(dev))
        inp["k_scale"].copy_(k_scale_before.to(dev))
        _run_gather(gather, inp, target, False)
        return out + _compare("with check_metadata=False: ", case, inp, k_fp8_before, k_scale_before, pool_before)
    return _compare("", case, inp, k_fp8_before, k_scale_before, pool_before)


# --- the specialization key ---------------------------------------------------------------------------------------

# kernel_params, specialize_value, specialization_key and key_differences live in contracts.compile_keys
# (the audit's per-row count uses them for every kernel); imported here under their old names.


@dataclass
class Launch:
    args: tuple
    kwargs: dict
    key: tuple
    #: what Triton's ``run`` returned: the compiled kernel natively, None under the interpreter
    compiled: object = None


@dataclass
class Capture:
    launches: list = field(default_factory=list)


@contextlib.contextmanager
def captured_launches(kernel):
    """Record every launch of ``kernel`` while the block runs (its key, and the compiled kernel Triton returns),
    by putting a pass-through ``run`` on the kernel object (``kernel[grid](...)`` calls ``self.run``)."""
    cap = Capture()
    own = "run" in vars(kernel)
    previous = vars(kernel).get("run")
    original = kernel.run

    def run(*args, grid, warmup, **kwargs):
        launch = Launch(args, dict(kwargs), specialization_key(kernel, args, kwargs))
        cap.launches.append(launch)
        launch.compiled = original(*args, grid=grid, warmup=warmup, **kwargs)
        return launch.compiled

    kernel.run = run
    try:
        yield cap
    finally:
        if own:
            kernel.run = previous
        else:
            del kernel.run


def native_variants(kernel) -> int | None:
    """How many compiled variants Triton holds for ``kernel`` on the current device (None under the
    interpreter, which compiles nothing)."""
    caches = getattr(kernel, "device_caches", None)
    if caches is None:
        return None
    from triton.runtime.driver import driver

    entry = caches.get(driver.active.get_current_device())
    return 0 if entry is None else len(entry[0])


def alignment_only(keys: list) -> bool:
    """Whether the distinct ``keys`` differ only in the alignment attribute of pointer parameters."""
    seen: dict = {}
    for k in keys:
        for name, val in k:
            seen.setdefault(name, set()).add(val)
    diff = {name: vals for name, vals in seen.items() if len(vals) > 1}
    return bool(diff) and all(len({v[0] for v in vals}) == 1 and str(next(iter(vals))[0]).startswith("*")
                              for vals in diff.values())


def _compile_examples(target: Target) -> list[CompileOnceCase]:
    return fg.compile_once_examples()


@contract("compile-once", targets=("gfx950",), cases=lambda target: fg.compile_once_cases(),
          examples=_compile_examples, min_cases=3, max_cases=5, case_type=CompileOnceCase, numeric=False,
          skip_reason="only gfx950's cp-gather variant promises one compilation across token and batch counts "
                      "(the legacy variant of gfx942 and generic specializes on the token count)")
def compile_once(case: CompileOnceCase, target: Target) -> list[Violation]:
    """gfx950's cp-gather compiles ONE specialization across five or more different token and batch counts
    (seed 004 item 4: ``do_not_specialize`` on the runtime counts, table width and block count constexpr; the
    "compile explosion" of a kernel specialized on the token count).

    For one cache and table geometry, the launches of the kernel the subject names for the target
    (``gather_kernel``) with token counts and batch counts that Triton's integer specialization tells apart (1,
    multiples of 16, others) all share one specialization key, derived from the kernel's JIT metadata
    (constexpr parameters, ``do_not_specialize``, the integer and pointer-alignment rules) and the launch's
    arguments. The block tables are fresh per launch, or rows [i, i + B) of one persistent table (the chunks of one
    prefill slice the persistent block table so), whose addresses need not be 16-byte aligned. Natively, the compiled kernels Triton returns are one object too, and they partition the launches
    as the derived keys do. Every entry call launches that kernel exactly once."""
    sub = bound(target).cp_gather
    gather, kernel = sub.cp_gather_indexer_k_quant_cache, sub.gather_kernel(target)
    dev = kernel_device()
    g = torch.Generator().manual_seed(case.seed)
    cache = fg.build_compile_cache(case, dev, g)
    table = fg.build_persistent_table(case, dev, g)
    out: list[Violation] = []
    before = native_variants(kernel)
    with captured_launches(kernel) as cap:
        for i, (T, B) in enumerate(case.launches):
            n = len(cap.launches)
            inp = fg.build_launch_inputs(case, i, dev, g, table)
            gather(cache, inp["k_fp8"], inp["k_scale"], inp["block_table"], inp["cu_seqlen"], inp["token_to_seq"],
                   layout=case.layout, target=target)
            if len(cap.launches) != n + 1:
                out.append(Violation("an entry call did not launch the kernel gather_kernel names exactly once",
                                     f"T={T}, B={B}", "1 launch", f"{len(cap.launches) - n}"))
    if not cap.launches:
        return out
    keys = list(dict.fromkeys(launch.key for launch in cap.launches))
    compiled = [launch.compiled for launch in cap.launches]
    native = before is not None and all(c is not None for c in compiled)
    objects = list({id(c): c for c in compiled}.values()) if native else []
    seen_natively = (f"; natively {len(objects)} compiled kernels (kernel cache {before} -> "
                     f"{native_variants(kernel)} entries)") if native else ""
    if len(keys) > 1:
        groups = [[f"(T={T}, B={B})" for (T, B), launch in zip(case.launches, cap.launches) if launch.key == k]
                  for k in keys]
        if alignment_only(keys):
            what = (f"the {target.name} cp-gather compiles once per 16-byte alignment of its metadata pointers: "
                    f"{len(keys)} compilations for one geometry")
        else:
            what = (f"the {target.name} cp-gather specializes on the launch's counts: {len(keys)} compilations "
                    "for one geometry")
        out.append(Violation(what, key_differences(keys), "1 specialization",
                             f"{len(keys)}: " + " | ".join(", ".join(gr) for gr in groups) + seen_natively))
    if native:
        if len(objects) > 1 and len(keys) == 1:
            out.append(Violation("Triton compiled the cp-gather more than once for one geometry where the derived "
                                 "keys are one", "native", "1 compiled kernel", seen_natively[2:]))
        by_key = [keys.index(launch.key) for launch in cap.launches]
        by_obj = [next(i for i, o in enumerate(objects) if o is c) for c in compiled]
        if not len(set(zip(by_key, by_obj))) == len(keys) == len(objects):
            out.append(Violation("the derived specialization keys group the launches unlike Triton's compiled "
                                 "kernels", "native", f"derived groups {by_key}", f"compiled groups {by_obj}"))
    return out
