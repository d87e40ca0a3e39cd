"""Codec and layout contracts (``impl.formats``): the foundation every writer and reader stands on.

Each compares three independent paths: the Triton device functions (``codec_kernels``), the host codecs
(``formats``) and the reference (oracles.formats), plus torch's own fp8 dtypes. The first two are the current
subject's (``bound(target)``; for ``ours``, impl.codec_kernels launching impl.triton_helpers, and impl.formats). A
subject may have only some of them (upstream decodes most codes inline in its kernels): each check runs the paths the
subject has, and a contract whose paths it has none of is ``skipped`` naming the first.
"""
from __future__ import annotations

import math

import torch

from contracts.core import ALL_TARGETS, Violation, compare_exact, contract, fmt
from fuzz import capabilities
from fuzz import formats as fz
from fuzz.formats import ExhaustiveCase, Fp8Case, LayoutCase, Ue8m0Case
from contracts.subjects import EntryMissing, SubjectError, SubjectSkip, bound, current
from impl import formats
from impl.targets import Target
from oracles import formats as ref

_TORCH_FP8 = {"ocp": torch.float8_e4m3fn, "fnuz": torch.float8_e4m3fnuz}
ALL_CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8)
#: every code, then again reversed, then a partial third pass: longer than two of the codec kernels' 256-element
#: blocks, so a launch that handles only its first block (or reads another program's) shows
CODE_SPAN = torch.cat([ALL_CODES, ALL_CODES.flip(0), ALL_CODES[:131]])
SPAN_MIN = 2 * 256 + 1


def _span(x: torch.Tensor) -> torch.Tensor:
    """``x`` repeated past :data:`SPAN_MIN` elements (a case's few values, spread over three kernel blocks)."""
    return x.repeat(-(-SPAN_MIN // max(int(x.numel()), 1))) if x.numel() else x


def subject_has(target: Target, family: str, name: str) -> bool:
    """Whether the current subject has the entry point ``family.name`` on ``target``."""
    try:
        getattr(getattr(bound(target), family), name)
    except EntryMissing:
        return False
    return True


def subject_entries(target: Target, *names: str) -> dict:
    """The current subject's entry points among ``names`` ("family.name") that it has, by name; when it has none of
    them, the first one's :class:`EntryMissing` (the row is skipped, naming it)."""
    sub = bound(target)
    found, first = {}, None
    for full in names:
        family, name = full.split(".")
        try:
            found[full] = getattr(getattr(sub, family), name)
        except EntryMissing as exc:
            first = first or exc
    if not found:
        raise first
    return found


def _flavours(target: Target) -> list[str]:
    """The fp8 flavours a target's caches use: main (FNUZ on gfx942) and extra (OCP everywhere)."""
    return sorted({target.main_cache_fp8, target.extra_cache_fp8})


def _fp8_cases(target: Target):
    return fz.fp8_cases(_flavours(target))


def _fp8_examples(target: Target) -> list[Fp8Case]:
    return [Fp8Case(flavour=fl, values=tuple(fz.fp8_boundary_values(fl))) for fl in _flavours(target)]


FP8_ENTRIES = ("formats.fp8_decode", "codec_kernels.fp8_decode_triton", "formats.fp8_encode",
               "codec_kernels.fp8_encode_triton")


# --- memory layouts of the codecs' inputs (fuzz.formats.CODEC_LAYOUTS, issue 30) ------------------------------------

#: what a strided view's gaps hold: a code and a value other than most of a case's (a reader that ignores the stride
#: or the view's offset reads them)
CODE_FILL = 0x5A
VALUE_FILL = 1234.5
SCALE_FILL = 3.0
LAYOUT_REFUSAL_UNCLEAR = "refusal of a non-packed input layout does not name the argument"
LAYOUT_REFUSAL_REFUSED_PACKED = "a codec refused its packed input"
LAYOUT_INPUT_WRITTEN = "a codec wrote into its input's buffer"
LAYOUT_SHAPE = "a codec's output shape differs from its input's"


def _where(layout: str, violations: list[Violation]) -> list[Violation]:
    """The violations of a non-packed layout with the layout in front of their location (the message as packed)."""
    return violations if layout == "contiguous" else _at(f"input_layout={layout}:", violations)


def laid_out_call(out: list[Violation], name: str, fn, x: torch.Tensor, layout: str, fill, arg: str, *args):
    """Run codec ``fn`` on ``x`` laid out as ``layout`` (fuzz.formats.lay_out_codec_input). Returns ``(inputs,
    outputs)``, both flat in the view's logical order (the reference is run on the inputs: a packed copy of the
    view), or None when there is nothing to compare: a refusal of a non-packed layout (a ValueError/TypeError
    naming ``arg``, the input buffer unchanged, is fine), or an output of another shape (a violation). Any layout:
    the input's whole buffer must be unchanged."""
    buf, view = fz.lay_out_codec_input(x, layout, fill)
    before = buf.clone()

    def written() -> bool:
        return not torch.equal(buf.reshape(-1).view(torch.uint8), before.reshape(-1).view(torch.uint8))

    try:
        got = fn(view, *args)
    except (ValueError, TypeError) as exc:
        if layout == "contiguous":
            out.append(Violation(LAYOUT_REFUSAL_REFUSED_PACKED, name, "outputs", f"{type(exc).__name__}: {exc}"))
        elif arg not in str(exc):
            out.append(Violation(LAYOUT_REFUSAL_UNCLEAR, f"{name} (input_layout={layout})", f"names {arg}",
                                 str(exc)[:200]))
        if written():
            out.append(Violation(LAYOUT_INPUT_WRITTEN, f"{name} (input_layout={layout}, refused)", "unchanged",
                                 "bytes changed"))
        return None
    if written():
        out.append(Violation(LAYOUT_INPUT_WRITTEN, f"{name} (input_layout={layout})", "unchanged", "bytes changed"))
    if tuple(got.shape) != tuple(view.shape):
        out.append(Violation(LAYOUT_SHAPE, f"{name} (input_layout={layout})", str(list(view.shape)),
                             str(list(got.shape))))
        return None
    return view.contiguous().reshape(-1), got.reshape(-1)


def _decode_all_codes(flavour: str, entries: dict, layout: str = "contiguous") -> list[Violation]:
    out: list[Violation] = []
    want = ref.fp8_decode(ALL_CODES, flavour)
    torch_vals = ALL_CODES.view(_TORCH_FP8[flavour]).to(torch.float64)
    out += compare_exact(f"torch {flavour} decode vs reference", torch_vals, want)
    for name, entry in (("host fp8_decode", "formats.fp8_decode"),
                        ("triton fp8_decode_bits", "codec_kernels.fp8_decode_triton")):
        if entry in entries:
            r = laid_out_call(out, f"{name}[{flavour}]", entries[entry], CODE_SPAN, layout, CODE_FILL, "codes",
                              flavour)
            if r is not None:
                codes, got = r
                out += _where(layout, compare_exact(f"{name}[{flavour}]", got, ref.fp8_decode(codes, flavour)))
    return out


@contract("fp8-codec-exact", targets=ALL_TARGETS, cases=_fp8_cases, examples=_fp8_examples, min_cases=5,
          case_type=Fp8Case, numeric=False)
def fp8_codec_exact(case: Fp8Case, target: Target) -> list[Violation]:
    """fp8 e4m3 decode and encode are exact for the flavours the target's caches use.

    Decode: all 256 codes (spread over three of the Triton launch's blocks) through the Triton helper and the host
    codec equal the reference and torch's
    float8_e4m3fn / float8_e4m3fnuz, NaN positions included. Encode: round-to-nearest-even, saturating to +-max
    (FNUZ 240, OCP 448; inf too), NaN -> the flavour's NaN code. The codes decoded and the values encoded are laid
    out as the case's ``input_layout`` says (packed, a stride-2 view past a buffer's start, column-major 2-D): each
    codec gives, in the input's shape, exactly the reference's answer for a packed copy of the view, and writes
    nothing into the input's buffer (or refuses the layout with a ValueError/TypeError naming the argument). Source:
    SPEC 1.2 (FNUZ main cache on gfx942, OCP extra cache everywhere; a flavour mix-up costs ~1.87x in scale); DESIGN
    "Numerics"; issue 30 (memory layouts).
    """
    flavour, layout = case.flavour, case.input_layout
    entries = subject_entries(target, *FP8_ENTRIES)
    out = _decode_all_codes(flavour, entries, layout)
    x = _span(torch.tensor([fz.f32(v) for v in case.values], dtype=torch.float32))
    for name, entry in (("host fp8_encode", "formats.fp8_encode"), ("triton fp8_encode_bits",
                                                                    "codec_kernels.fp8_encode_triton")):
        if entry not in entries:
            continue
        r = laid_out_call(out, f"{name}[{flavour}]", entries[entry], x, layout, VALUE_FILL, "x", flavour)
        if r is None:
            continue
        xin, got = r
        want = ref.fp8_encode(xin, flavour)
        bad = (got != want).nonzero().flatten().tolist()
        for i in bad[:5]:
            out.append(Violation(f"{name}[{flavour}] differs from the nearest-even reference",
                                 f"input {xin[i].item()!r}" + ("" if layout == "contiguous" else
                                                              f" (input_layout={layout}, element {i})"),
                                 hex(int(want[i])), hex(int(got[i]))))
    want = ref.fp8_encode(x, flavour)
    # torch's cast agrees on in-range finite values (it is not saturating, so only compare there)
    finite = torch.isfinite(x) & (x.abs() <= fz.FP8_MAX[flavour])
    if bool(finite.any()):
        tv = x[finite].to(_TORCH_FP8[flavour]).view(torch.uint8)
        rv = want[finite]
        for i in (tv != rv).nonzero().flatten().tolist()[:3]:
            out.append(Violation(f"reference encode[{flavour}] disagrees with torch", f"input {x[finite][i].item()!r}",
                                 hex(int(tv[i])), hex(int(rv[i]))))
    return out


def _ue8_cases(target: Target):
    return fz.ue8m0_cases(target.writer_scale_code_cap)


def _ue8_examples(target: Target) -> list[Ue8m0Case]:
    edges = [math.ldexp(1.0, e) for e in (-149, -127, -126, -1, 0, 1, 126, 127)]
    edges += [fz.next32(v, math.inf) for v in edges] + [math.inf, math.nan]
    return [Ue8m0Case(cap=target.writer_scale_code_cap, scales=tuple(fz.f32(v) for v in edges))]


UE8M0_ENTRIES = ("formats.ue8m0_decode", "formats.ue8m0_decode_reader", "codec_kernels.ue8m0_decode_reader_triton",
                 "formats.ue8m0_encode", "codec_kernels.ue8m0_encode_triton")


@contract("ue8m0-codec-exact", targets=ALL_TARGETS, cases=_ue8_cases, examples=_ue8_examples, min_cases=5,
          case_type=Ue8m0Case, numeric=False)
def ue8m0_codec_exact(case: Ue8m0Case, target: Target) -> list[Violation]:
    """UE8M0 scale codes decode and encode exactly, with the production readers' special codes.

    Host decode equals torch's float8_e8m0fnu for all 256 codes (255 is NaN there). The Triton reader reproduces
    production readers: code 0 -> 2^-127 (not flushed to zero), code 255 -> +inf, so inf * 0 = NaN shows downstream.
    Encode clamp(ceil(log2(s)) + 127, 0, cap) is exact for subnormal, power-of-two and neighbouring scales, with
    cap 254 on sanitizing writers (gfx950) and 255 otherwise. The codes decoded and the scales encoded are laid out
    as the case's ``input_layout`` says, judged as in ``fp8-codec-exact`` (the reference's answer for a packed copy,
    in the input's shape, the input's buffer untouched, or a refusal naming the argument). Source: SPEC 1.2 and 4
    (why cap at 254); issue 30 (memory layouts).
    """
    out: list[Violation] = []
    entries = subject_entries(target, *UE8M0_ENTRIES)
    torch_vals = ALL_CODES.view(torch.float8_e8m0fnu).to(torch.float64)
    want_host = ref.ue8m0_decode(ALL_CODES, reader=False)
    out += compare_exact("torch float8_e8m0fnu vs reference", torch_vals, want_host)
    layout = case.input_layout
    for name, entry, reader in (("host ue8m0_decode", "formats.ue8m0_decode", False),
                                ("host ue8m0_decode_reader", "formats.ue8m0_decode_reader", True),
                                ("triton ue8m0_decode_reader", "codec_kernels.ue8m0_decode_reader_triton", True)):
        if entry in entries:
            r = laid_out_call(out, name, entries[entry], CODE_SPAN, layout, CODE_FILL, "codes")
            if r is not None:
                codes, got = r
                out += _where(layout, compare_exact(name, got, ref.ue8m0_decode(codes, reader=reader)))
    cap = case.cap
    s = _span(torch.tensor([fz.f32(v) for v in case.scales], dtype=torch.float32))
    for name, entry in (("host ue8m0_encode", "formats.ue8m0_encode"),
                        ("triton ue8m0_encode_bits", "codec_kernels.ue8m0_encode_triton")):
        if entry not in entries:
            continue
        r = laid_out_call(out, f"{name} (cap {cap})", entries[entry], s, layout, SCALE_FILL, "scale", cap)
        if r is None:
            continue
        sin, got = r
        want = ref.ue8m0_encode(sin, cap)
        for i in (got != want).nonzero().flatten().tolist()[:5]:
            out.append(Violation(f"{name} (cap {cap}) differs from the reference",
                                 f"scale {sin[i].item()!r}" + ("" if layout == "contiguous" else
                                                              f" (input_layout={layout}, element {i})"),
                                 str(int(want[i])), str(int(got[i]))))
    return out


# --- layouts -------------------------------------------------------------------------------------------------------

def _make_view(case: LayoutCase):
    """A cache view into a larger byte pool, filled with a sentinel so stray writes show."""
    bs, nb = case.block_size, case.num_blocks
    if case.layout == "fp8_ds_mla":
        token_bytes = formats.DSV4_TOKEN_BYTES
    else:
        token_bytes = formats.INDEXER_TOKEN_BYTES
    stride = bs * token_bytes + case.stride_pad
    pool = torch.full(((nb + case.offset_blocks + 1) * stride,), 0xA5, dtype=torch.uint8)
    view = pool.as_strided((nb, bs, token_bytes), (stride, token_bytes, 1), case.offset_blocks * stride)
    return pool, view, stride


def _layout_cases(target: Target):
    layouts = _subject_layouts(target)
    if len(layouts) in (0, 3):  # none: the check skips the row, naming the missing entry point
        return fz.layout_cases()
    return fz.layout_cases().filter(lambda c: c.layout in layouts)


def _layout_examples(target: Target) -> list[LayoutCase]:
    layouts = _subject_layouts(target) or ["fp8_ds_mla", "indexer-normal", "indexer-shuffle"]
    return [c for c in _all_layout_examples() if c.layout in layouts]


def _all_layout_examples() -> list[LayoutCase]:
    return [LayoutCase(layout="fp8_ds_mla", block_size=64, num_blocks=2, stride_pad=64, offset_blocks=1, seed=1,
                       num_tokens=3),
            LayoutCase(layout="indexer-shuffle", block_size=16, num_blocks=2, stride_pad=0, offset_blocks=0, seed=2,
                       num_tokens=4)]


LAYOUT_ENTRIES = {"fp8_ds_mla": ("formats.pack_fp8_ds_mla", "formats.unpack_fp8_ds_mla"),
                  "indexer": ("formats.pack_indexer_k", "formats.unpack_indexer_k")}


def _layout_entries(target: Target, layout: str) -> dict:
    return subject_entries(target, *LAYOUT_ENTRIES["fp8_ds_mla" if layout == "fp8_ds_mla" else "indexer"])


def _subject_layouts(target: Target) -> list[str]:
    """The case layouts whose packer or unpacker the current subject has."""
    out = []
    for lay in ("fp8_ds_mla", "indexer-normal", "indexer-shuffle"):
        try:
            _layout_entries(target, lay)
        except EntryMissing:
            continue
        out.append(lay)
    return out


_FUZZ_LAYOUTS: dict = {}


def _fuzz_layouts(target: Target) -> tuple:
    """:func:`_subject_layouts` for the cache-layout family's ``allowed`` (``fuzz.capabilities.CACHE_LAYOUTS``),
    cached per subject and target (it is asked once per partial combination)."""
    sub = current()
    key = (sub.name, getattr(sub, "version", None), target.name)
    if key not in _FUZZ_LAYOUTS:
        _FUZZ_LAYOUTS[key] = tuple(_subject_layouts(target))
    return _FUZZ_LAYOUTS[key]


capabilities.provide(capabilities.CACHE_LAYOUTS, _fuzz_layouts)


def _at(where: str, violations: list[Violation]) -> list[Violation]:
    """The violations with ``where`` in front of their location (the message stays the same for every slot)."""
    return [Violation(v.message, f"{where} {v.where}".strip(), v.expected, v.got) for v in violations]


def _unpack_call(out: list[Violation], what: str, fn, *args, **kw):
    """Run a subject's unpacker; an exception on a valid cache view is a violation of its own (stable message, the
    exception in ``got``) and gives None."""
    try:
        return fn(*args, **kw)
    except (KeyboardInterrupt, SystemExit, SubjectSkip, SubjectError):  # not a verdict about the subject
        raise
    except Exception as exc:  # noqa: BLE001 - a valid view the unpacker cannot read is the finding
        out.append(Violation(f"{what} raised on a valid cache view", what, "the tokens",
                             f"{type(exc).__name__}: {exc}"[:240]))
        return None


@contract("cache-layout-roundtrip", targets=ALL_TARGETS, cases=_layout_cases, examples=_layout_examples,
          min_cases=5, case_type=LayoutCase, numeric=False)
def cache_layout_roundtrip(case: LayoutCase, target: Target) -> list[Violation]:
    """Cache pack/unpack put every byte exactly where SPEC 1.2/1.3 says, through ``stride(0)``, and nowhere else.

    fp8_ds_mla: per block a data region (448 B fp8 NoPE + 128 B bf16 RoPE per token) then a scale region (7 UE8M0
    codes + a 0 pad byte per token), blocks at ``stride(0)`` bytes (views into a shared pool). Indexer-K: fp8 region
    (NORMAL token-major or SHUFFLE 16x16 tiles) then fp32 scales. The packer's bytes are read back at the reference's
    absolute offsets and vice versa; every byte the reference does not name keeps its sentinel. A subject with an
    unpacker but no packer (upstream's indexer-K gather) reads tokens the reference placed; an unpacker that raises
    on a valid view is a violation.
    """
    out: list[Violation] = []
    entries = _layout_entries(target, case.layout)
    g = torch.Generator().manual_seed(case.seed)
    pool, view, stride = _make_view(case)
    bs, nb = case.block_size, case.num_blocks
    nslots = bs * nb
    n = min(case.num_tokens, nslots)
    slots = torch.randperm(nslots, generator=g)[:n]
    flat, base = ref.storage_bytes(view)
    touched = torch.zeros(flat.numel(), dtype=torch.bool)

    def check_or_place(packed: bool, s: int, what: str, idx: torch.Tensor, want: torch.Tensor):
        touched[idx] = True
        if packed:
            out.extend(_at(f"slot {s}", compare_exact(what, flat[idx], want, limit=2)))
        else:
            flat[idx] = want

    if case.layout == "fp8_ds_mla":
        pack, unpack = entries.get("formats.pack_fp8_ds_mla"), entries.get("formats.unpack_fp8_ds_mla")
        nope = torch.randint(0, 256, (n, 448), generator=g, dtype=torch.int32).to(torch.uint8)
        scale = torch.randint(0, 256, (n, 7), generator=g, dtype=torch.int32).to(torch.uint8)
        rope = torch.randn(n, 64, generator=g).to(torch.bfloat16)
        if pack is not None:
            pack(view, slots, nope, scale, rope)
        rope_bytes = rope.view(torch.uint8).reshape(n, 128)
        for i, s in enumerate(slots.tolist()):
            spans = ref.fp8_ds_mla_token_spans(s, bs, stride)
            for name, want in (("nope", nope[i]), ("rope", rope_bytes[i]), ("scale", scale[i]),
                               ("pad", torch.zeros(1, dtype=torch.uint8))):
                a, b = spans[name]
                check_or_place(pack is not None, s, f"{name} bytes", torch.arange(base + a, base + b), want)
        # the other direction: the tokens read back through the unpacker
        got = _unpack_call(out, "unpack_fp8_ds_mla", unpack, view, slots) if unpack is not None else None
        if got is not None:
            out += compare_exact("unpacked nope", got["nope"], nope, limit=2)
            out += compare_exact("unpacked scale", got["scale"], scale, limit=2)
            out += compare_exact("unpacked rope", got["rope"].view(torch.uint8), rope.view(torch.uint8), limit=2)
    else:
        pack, unpack = entries.get("formats.pack_indexer_k"), entries.get("formats.unpack_indexer_k")
        lay = case.layout.split("-")[1]
        codes = torch.randint(0, 256, (n, 128), generator=g, dtype=torch.int32).to(torch.uint8)
        kscale = torch.rand(n, generator=g, dtype=torch.float32) + 0.5
        if pack is not None:
            pack(view, slots, codes, kscale, layout=lay)
        for i, s in enumerate(slots.tolist()):
            offs, so = ref.indexer_k_token_spans(s, bs, stride, lay)
            check_or_place(pack is not None, s, f"fp8 bytes ({lay})", torch.tensor(offs) + base, codes[i])
            check_or_place(pack is not None, s, "scale bytes", torch.arange(base + so, base + so + 4),
                           kscale[i:i + 1].view(torch.uint8))
        got = _unpack_call(out, "unpack_indexer_k", unpack, view, slots, layout=lay) if unpack is not None else None
        if got is not None:
            got_codes, got_scale = got
            out += compare_exact("unpacked indexer codes", got_codes, codes, limit=2)
            out += compare_exact("unpacked indexer scales", got_scale, kscale, limit=2)
    stray = ((flat != 0xA5) & ~touched).nonzero().flatten()
    if len(stray):
        out.append(Violation("bytes outside the written tokens changed", f"storage byte {int(stray[0])}",
                             "sentinel 0xa5", fmt(int(flat[stray[0]]))))
    return out


# --- exhaustive: every input of the codec's small domain --------------------------------------------------------

def _exhaustive(cid: str, codec: str, targets: tuple[str, ...], params_of=None):
    """Register an exhaustive contract over ``fz.EXHAUSTIVE_PARAMS[codec]`` (or ``params_of(target)``): each case
    runs the codec on its whole domain, so one generated case per parameter is the whole check (no pinned examples:
    they would repeat the same run). The codecs take no target, only a flavour or cap, so each contract runs on the
    one target whose parameters are all of them."""
    def params(target: Target) -> list[str]:
        return sorted(params_of(target) if params_of else fz.EXHAUSTIVE_PARAMS[codec])

    def register(check):
        contract(cid, targets=targets, cases=lambda t: fz.exhaustive_cases(codec, params(t)), min_cases=1,
                 max_cases=len(fz.EXHAUSTIVE_PARAMS[codec]), case_type=ExhaustiveCase, numeric=False,
                 skip_reason="target-independent codec, checked exhaustively on " + targets[0] + " (every flavour "
                             "and cap there)")(check)
        from contracts.core import CONTRACTS
        CONTRACTS[cid].extra["exhaustive"] = True  # read by the audit's reach (no pairs to declare: every input)
        return check
    return register


def _mismatches(what: str, inputs: torch.Tensor, want: torch.Tensor, got: torch.Tensor, *, limit: int = 5,
                show=hex) -> list[Violation]:
    """One violation per differing input (the first ``limit``), the message naming how many of the domain differ."""
    want, got = want.to(torch.int64).flatten(), got.to(torch.int64).flatten()
    bad = (got != want).nonzero().flatten()
    n = len(bad)
    return [Violation(f"{what} differs from the reference", f"input {inputs.flatten()[i].item()!r} "
                      f"({n} of {want.numel()} inputs differ)", show(int(want[i])), show(int(got[i])))
            for i in bad[:limit].tolist()]


def _wide(entry: str, fn):
    """The entry point to run over a whole domain: for ``ours``' Triton launchers, the same device function
    (``fp8_encode_bits`` / ``ue8m0_encode_bits``) launched by :mod:`contracts.scale_probes` over 4,096 lanes a
    program (about 15 times faster under the interpreter than the launchers' 256; ``fp8-codec-exact`` and
    ``ue8m0-codec-exact`` cover the launchers themselves); any other entry as it is."""
    from contracts import scale_probes
    from contracts.subjects import is_ours

    if not is_ours():
        return fn
    return {"codec_kernels.fp8_encode_triton": scale_probes.fp8_encode_codes,
            "codec_kernels.ue8m0_encode_triton": scale_probes.ue8m0_encode_codes}.get(entry, fn)


def _fp8_domain() -> torch.Tensor:
    return torch.cat([fz.all_bf16_values(), fz.binade_boundaries()])


@_exhaustive("fp8-encode-exhaustive", "fp8-encode", ("gfx942",), params_of=_flavours)
def fp8_encode_exhaustive(case: ExhaustiveCase, target: Target) -> list[Violation]:
    """fp8 e4m3 encode is exact on every bf16 value and on both sides of every fp32 binade boundary.

    Inputs: all 65,536 bf16 bit patterns (both zeros, subnormals, +-inf, every NaN) and 2^k - ulp, 2^k, 2^k + ulp
    for every k from -149 to 127 (plus the largest finite and inf), both signs. The host codec and the Triton
    helper must give the reference's round-to-nearest-even, saturating code for each (the reference's table search
    is itself checked against torch's float8 casts on the in-range finite inputs). fp8 decode is exhaustive in
    ``fp8-codec-exact`` (all 256 codes); that contract's generated encode inputs are ties and their neighbours.
    Source: SPEC 1.2, DESIGN "Numerics".
    """
    flavour = case.param
    entries = subject_entries(target, "formats.fp8_encode", "codec_kernels.fp8_encode_triton")
    x = _fp8_domain()
    want = ref.fp8_encode_vec(x, flavour)
    out: list[Violation] = []
    finite = torch.isfinite(x) & (x.abs() <= fz.FP8_MAX[flavour])
    out += _mismatches(f"reference encode[{flavour}] vs torch's cast", x[finite],
                       x[finite].to(_TORCH_FP8[flavour]).view(torch.uint8), want[finite])
    for name, entry in (("host fp8_encode", "formats.fp8_encode"),
                        ("triton fp8_encode_bits", "codec_kernels.fp8_encode_triton")):
        if entry in entries:
            out += _mismatches(f"{name}[{flavour}]", x, want, _wide(entry, entries[entry])(x, flavour))
    return out


def _ue8m0_domain() -> torch.Tensor:
    """Every positive (or NaN) bf16 value and every positive fp32 binade boundary: the scales a writer can pass."""
    b = fz.all_bf16_values()
    b = b[(b > 0) | torch.isnan(b)]
    s = fz.binade_boundaries(signed=False)
    return torch.cat([b, s[s > 0]])


@_exhaustive("ue8m0-encode-exhaustive", "ue8m0-encode", ("gfx950",))
def ue8m0_encode_exhaustive(case: ExhaustiveCase, target: Target) -> list[Violation]:
    """UE8M0 scale encode clamp(ceil(log2(s)) + 127, 0, cap) is exact on every positive bf16 value and on both
    sides of every fp32 binade boundary, subnormals included, for both caps (254 on sanitizing writers, 255).

    Inputs: the 32,513 bf16 patterns that are positive or NaN (+inf included) and 2^k - ulp, 2^k, 2^k + ulp for
    k = -149..127 plus the largest finite. Host codec and Triton helper against the reference's frexp. UE8M0 decode
    is exhaustive in ``ue8m0-codec-exact`` (all 256 codes). Source: SPEC 1.2 and 4.
    """
    cap = int(case.param)
    entries = subject_entries(target, "formats.ue8m0_encode", "codec_kernels.ue8m0_encode_triton")
    s = _ue8m0_domain()
    want = ref.ue8m0_encode_vec(s, cap)
    out: list[Violation] = []
    for name, entry in (("host ue8m0_encode", "formats.ue8m0_encode"),
                        ("triton ue8m0_encode_bits", "codec_kernels.ue8m0_encode_triton")):
        if entry in entries:
            out += _mismatches(f"{name} (cap {cap})", s, want, _wide(entry, entries[entry])(s, cap), show=str)
    return out


@_exhaustive("mx-scale-exhaustive", "mx-scale", ("gfx950",))
def mx_scale_exhaustive(case: ExhaustiveCase, target: Target) -> list[Violation]:
    """The MXFP8 group code and the MXFP4 block code are exact for every bf16 amax and on both sides of every fp32
    binade boundary.

    Each input is put alone in a 32-lane group (other lanes 0) and run through impl's own device function
    (``impl.epilogues.mxfp8_scale_code`` with the MXFP8 kernel's NaN-ignoring amax; ``impl.indexer_writer.
    quantize_mxfp4_blocks``) by :mod:`contracts.scale_probes`. MXFP8: clamp(ceil(log2(amax / 448)) + 127, 0, 254)
    with the exact quotient, 0 for an all-zero group (the low-amax branch below 2^-100 included). MXFP4: amax floored
    at 6 * 2^-126, clamp(ceil(log2(amax / 6)), -127, 127) + 127, 254 for inf, 255 for a NaN block. Only subject
    ``ours`` (the probes call impl's device functions; other subjects' kernels are judged by the epilogue and
    indexer-writer contracts). The NoPE-group and indexer-K scales are not probed here: their device functions take
    one fixed tile per call, too slow under the interpreter for 65,536 inputs.
    """
    from contracts import scale_probes
    from contracts.subjects import is_ours

    if not is_ours():
        raise EntryMissing("epilogues.mxfp8_scale_code", "a device function of impl, probed directly")
    x = _fp8_domain()
    if case.param == "mxfp8":
        amax = torch.where(torch.isnan(x), torch.zeros_like(x), x.abs())
        return _mismatches("mxfp8_scale_code", x, ref.mxfp8_group_code(amax), scale_probes.mxfp8_group_codes(x),
                           show=str)
    return _mismatches("quantize_mxfp4_blocks scale code", x, ref.mxfp4_block_code(x),
                       scale_probes.mxfp4_block_codes(x), show=str)
