"""The ``flashmla`` subject and FlashMLA's benchmark column, on the CPU: the spec parses, every row is skipped with
the reason where FlashMLA cannot run, and the conversion of our inputs to FlashMLA's (cache bytes, index lists,
sink, heads) is checked byte by byte against FlashMLA's V4 layout as its wrapper and SPEC 1.2 describe it - read
here by a reader written from that description, not from impl.formats. A fake ``flash_mla`` that computes what
FlashMLA's documentation says its sparse decode computes (float64, from the V4 bytes, refusing what FlashMLA
refuses) then carries the decode contract through the subject end to end."""
from __future__ import annotations

import contextlib
import importlib.util
import math
import types
from pathlib import Path

import pytest
import torch

from contracts.subjects import SubjectSkip, SubjectSpecError, SubjectUnavailable, parse_subject, using
from contracts.subjects import flashmla as fm
from impl import formats

ROOT = Path(__file__).resolve().parent.parent

# FlashMLA's V4 token, from its wrapper and SPEC 1.2: per block of B tokens, B data records of 448 e4m3 NoPE bytes
# and 64 bf16 RoPE values (576 B), then B scale records of 7 UE8M0 codes and a pad byte (8 B); blocks 576-aligned
V4_DATA, V4_SCALE, V4_NOPE, V4_ROPE, V4_CODES = 576, 8, 448, 64, 7


def v4_token(k_cache: torch.Tensor, index: int) -> dict:
    """Token ``index`` of a FlashMLA ``k_cache`` [nb, B, 1, 584] (index = block * B + offset), read from its bytes."""
    nb, bsz, hk, width = k_cache.shape
    assert hk == 1 and width == V4_DATA + V4_SCALE and k_cache.dtype == torch.uint8
    block, off = divmod(int(index), bsz)
    flat = k_cache.as_strided(((nb - 1) * k_cache.stride(0) + bsz * width,), (1,))
    base = block * k_cache.stride(0)
    rec = flat[base + off * V4_DATA: base + (off + 1) * V4_DATA]
    sc = flat[base + bsz * V4_DATA + off * V4_SCALE: base + bsz * V4_DATA + (off + 1) * V4_SCALE]
    return {"nope": rec[:V4_NOPE].clone(), "rope": rec[V4_NOPE:].clone().view(torch.bfloat16),
            "codes": sc[:V4_CODES].clone(), "pad": int(sc[V4_CODES])}


def v4_row(k_cache, index) -> torch.Tensor:
    """The 512 float64 values of a token: e4m3 x 2^(code - 127) per 64 NoPE dims, then the RoPE values. Code 255 is
    NaN, as FlashMLA's SM90 kernel converts its scales (UE8M0 -> bf16 with CUDA's E8M0 conversion, the OCP MX rule:
    deepseek-ai/FlashMLA csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh), and nothing is scrubbed: a NaN code or NaN
    scale of a token it reads gives NaN."""
    t = v4_token(k_cache, index)
    nope = t["nope"].view(torch.float8_e4m3fn).to(torch.float64)
    codes = t["codes"].to(torch.float64)
    scale = torch.where(codes == 255, math.nan, torch.pow(2.0, codes - 127)).repeat_interleave(64)
    return torch.cat([nope * scale, t["rope"].to(torch.float64)])


class FakeFlashMLA(types.SimpleNamespace):
    """``flash_mla`` as its documentation describes the legacy sparse decode: the checks it makes (h_q 64 or 128,
    index width a multiple of 64, page blocks contiguous, block stride a multiple of 576, int32 indices, sink [h_q]
    fp32) and the function (one softmax over the leftmost topk_length entries of each list that are not -1, plus
    the sink as an extra logit; V = K), in float64. An index other than -1 past the cache is an out-of-bounds read
    in FlashMLA: an error here."""

    __version__ = "fake"
    calls = 0

    def has_legacy(self):
        return True

    def get_mla_metadata(self, *a, **k):
        return types.SimpleNamespace(), None

    def _check_cache(self, k):
        assert k.dim() == 4 and k.shape[2] == 1 and k.shape[3] == 584 and k.dtype == torch.uint8
        assert k.stride(-2) == 584 and k.stride(-1) == 1, "each page block must be contiguous"
        assert k.shape[0] == 1 or k.stride(0) % 576 == 0, "stride(0) must be a multiple of 576"
        assert k.data_ptr() % 16 == 0

    def _rows(self, k, idx, n) -> list:
        rows = []
        for i in idx[: int(n)].tolist():
            if i == -1:
                continue
            if not 0 <= i < k.shape[0] * k.shape[1]:
                raise RuntimeError(f"out-of-bounds index {i}")
            rows.append(v4_row(k, i))
        return rows

    def flash_mla_with_kvcache(self, q, k_cache, block_table, cache_seqlens, head_dim_v, sched, *, softmax_scale,
                               is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices_in_kvcache,
                               topk_length, extra_topk_length, use_legacy, kv_format):
        FakeFlashMLA.calls += 1
        assert use_legacy and kv_format == "V4" and is_fp8_kvcache and head_dim_v == 512
        b, s_q, h, d = q.shape
        assert s_q == 1 and h in (64, 128) and d == 512 and q.dtype == torch.bfloat16
        for k, ix, ln in ((k_cache, indices, topk_length), (extra_k_cache, extra_indices_in_kvcache,
                                                           extra_topk_length)):
            if k is None:
                assert ix is None
                continue
            self._check_cache(k)
            assert ix.dtype == torch.int32 and ix.shape[:2] == (b, 1) and ix.shape[2] % 64 == 0
            assert ln.dtype == torch.int32 and tuple(ln.shape) == (b,)
        assert attn_sink is None or (attn_sink.dtype == torch.float32 and tuple(attn_sink.shape) == (h,))
        out = torch.zeros(b, 1, h, 512, dtype=torch.float64)
        sink = (attn_sink.to(torch.float64) if attn_sink is not None
                else torch.full((h,), -math.inf, dtype=torch.float64))
        for r in range(b):
            rows = self._rows(k_cache, indices[r, 0], topk_length[r])
            if extra_k_cache is not None:
                rows += self._rows(extra_k_cache, extra_indices_in_kvcache[r, 0], extra_topk_length[r])
            if rows:
                v = torch.stack(rows)  # [n, 512]; V = K
                out[r, 0] = _softmax_with_sink(softmax_scale * (q[r, 0].to(torch.float64) @ v.T), v, sink)
        return out.to(torch.bfloat16), torch.zeros(b, h, 1)


def _softmax_with_sink(logits, v, sink):
    """[h, 512]: one softmax per head over its logits [h, n] and its sink (an extra logit with a zero value)."""
    m = torch.maximum(logits.max(dim=1).values, sink)
    p = torch.exp(logits - m[:, None])
    return (p @ v) / (p.sum(1) + torch.exp(sink - m))[:, None]


# --- the spec and the skips ----------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _no_flashmla_imported_yet(monkeypatch):
    """Each test sees the package its own search path finds: on a GPU host an earlier test in the same worker may
    have imported the real flash_mla, which ``package_info`` would otherwise report (the process imports that one)."""
    import sys

    for name in [m for m in sys.modules if m == fm.PACKAGE or m.startswith(fm.PACKAGE + ".")]:
        monkeypatch.delitem(sys.modules, name)


def _fake_package(tmp_path) -> Path:
    """A folder holding a ``flash_mla`` package that is found but whose kernels cannot run here."""
    pkg = tmp_path / "fmla" / "flash_mla"
    pkg.mkdir(parents=True)
    (pkg / "VERSION").write_text("9.9.9\n")
    (pkg / "__init__.py").write_text("def has_legacy():\n    return True\n")
    return pkg.parent


def test_subject_spec_parses_and_names_its_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(fm.PATH_ENV, raising=False)
    folder = _fake_package(tmp_path)
    sub = parse_subject(f"flashmla@{folder}")
    assert (sub.name, sub.version, sub.label, sub.spec) == ("flashmla", "9.9.9", "flashmla==9.9.9",
                                                            f"flashmla@{folder}")
    assert sub.source == str(folder / "flash_mla")
    with pytest.raises(SubjectSpecError, match="flashmla@: give the folder"):
        parse_subject("flashmla@ ")
    with pytest.raises(SubjectSpecError, match="flashmla or flashmla@PATH"):
        parse_subject("flashmlax")
    # the environment variable names the folder for a plain "flashmla"
    monkeypatch.setenv(fm.PATH_ENV, str(folder))
    assert parse_subject("flashmla").version == "9.9.9"
    missing = parse_subject(f"flashmla@{tmp_path / 'nowhere'}")
    assert "is not a folder" in missing.reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA (found a CUDA device)")
def test_without_a_gpu_every_decode_row_is_skipped_with_the_reason(tmp_path, monkeypatch):
    import contracts.cache_writers  # noqa: F401 - registers writer-oracle-exact
    import contracts.decode  # noqa: F401 - registers decode-oracle-agreement
    from contracts.core import CONTRACTS
    from contracts.engine.runner import run_contract

    monkeypatch.delenv(fm.PATH_ENV, raising=False)
    sub = parse_subject(f"flashmla@{_fake_package(tmp_path)}")
    assert sub.reason == "no CUDA device (FlashMLA's kernels run on NVIDIA SM90/SM100 only)"
    for cid, target in (("decode-oracle-agreement", "gfx950"), ("decode-oracle-agreement", "gfx942"),
                        ("writer-oracle-exact", "generic")):
        row = run_contract(CONTRACTS[cid], target, profile="dev", budget=10, max_examples=2, subject=sub)
        assert row.status == "skipped", (cid, target, row.status, row.reason)
        assert row.reason == ("subject flashmla==9.9.9: decode.sparse_attn_decode: no CUDA device (FlashMLA's "
                              "kernels run on NVIDIA SM90/SM100 only)")
        assert row.subject == {"name": "flashmla", "version": "9.9.9"}
    assert "no CUDA device" in sub.describe()["unavailable"]


def test_not_installed_is_the_reason_where_no_package_is_found(monkeypatch, tmp_path):
    monkeypatch.delenv(fm.PATH_ENV, raising=False)
    monkeypatch.setattr(fm.importlib.util, "find_spec", lambda name: None)
    why = fm.unavailable_reason()
    assert why.startswith("FlashMLA is not installed") and fm.PATH_ENV in why
    sub = fm.FlashMLASubject()
    assert sub.label == "flashmla==not-installed"
    with pytest.raises(SubjectUnavailable, match="not installed"):
        sub.bind("generic")


def test_a_bound_subject_has_only_the_decode_and_refuses_fnuz(monkeypatch):
    monkeypatch.setattr(fm, "unavailable_reason", lambda *a, **k: None)
    sub = fm.FlashMLASubject()
    with pytest.raises(SubjectUnavailable, match="OCP e4m3 caches only, and gfx942's main cache is FNUZ"):
        sub.bind("gfx942")
    b = sub.bind("gfx950")
    with pytest.raises(SubjectSkip) as exc:
        b.cache_writers
    assert "has no entry point cache_writers (FlashMLA has only the DSv4 sparse decode" in exc.value.reason("s")
    dec = b.decode
    plan = dec.plan_decode("gfx950", 3, 16, 130, 64)
    from impl.decode import DecodePlan

    # FlashMLA's own split bound: one split per 64-entry tile at most; never equal to a plan of ours
    assert (plan.family, plan.num_splits, plan.head_blocks) == ("flashmla", 3 + 1, 1)
    assert plan != DecodePlan("flashmla", 4, 1)


# --- the conversion ------------------------------------------------------------------------------------------------

def _packed_cache(nb, bs, *, padded=True, before=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    pool, view = formats.allocate_fp8_ds_mla_pool(nb, bs, padded=padded, extra_blocks_before=before, fill=0xAB)
    n = nb * bs
    nope = torch.randint(0, 256, (n, V4_NOPE), generator=g, dtype=torch.int32).to(torch.uint8)
    codes = torch.randint(100, 160, (n, V4_CODES), generator=g, dtype=torch.int32).to(torch.uint8)
    rope = torch.randn(n, V4_ROPE, generator=g).to(torch.bfloat16)
    formats.pack_fp8_ds_mla(view, torch.arange(n), nope, codes, rope)
    return pool, view, nope, codes, rope


def _assert_tokens(k_cache, slots, nope, codes, rope):
    for s in slots:
        t = v4_token(k_cache, s)
        assert torch.equal(t["nope"], nope[s]) and torch.equal(t["codes"], codes[s]), s
        assert torch.equal(t["rope"].view(torch.int16), rope[s].view(torch.int16)) and t["pad"] == 0, s


def test_cache_is_passed_as_the_same_bytes_where_flashmla_accepts_them():
    pool, view, nope, codes, rope = _packed_cache(5, 64, before=1)
    k = fm.flashmla_cache(view)
    assert tuple(k.shape) == (5, 64, 1, 584) and k.stride(0) == 37440 and k.stride(-2) == 584
    assert k.data_ptr() == view.data_ptr() and k.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr()
    _assert_tokens(k, range(5 * 64), nope, codes, rope)


@pytest.mark.parametrize("bs,padded,regroup", [(5, False, None), (3, True, 64), (64, False, 64)])
def test_cache_copies_keep_every_token_at_its_slot(bs, padded, regroup):
    """A dense (unpadded) block stride is copied into a padded pool; a refused block size is regrouped into
    64-token blocks; either way every slot reads back the bytes written there, at the same index."""
    fm.CONVERSIONS.clear()
    pool, view, nope, codes, rope = _packed_cache(7, bs, padded=padded, seed=bs)
    k = fm.flashmla_cache(view, regroup)
    assert k.data_ptr() != view.data_ptr() and k.stride(0) % 576 == 0 and k.data_ptr() % 16 == 0
    assert k.shape[1] == (regroup or bs)
    _assert_tokens(k, range(7 * bs), nope, codes, rope)
    assert set(fm.CONVERSIONS) == {"cache-regrouped" if regroup and regroup != bs else "cache-realigned"}


def test_ragged_indices_become_minus_one_padded_lists_with_their_lengths():
    """Row r's entries come first in its list, in order; entries our API calls invalid (negative, INT32 extremes,
    at or past the end of the cache) become -1; past the row's length only -1; the width a multiple of 64; an
    offset indptr and junk past its end are respected."""
    big, small = 2 ** 31 - 1, -2 ** 31
    indices = torch.tensor([99, 3, 7, -1, 40, small, 2, big, 39, 5, 77], dtype=torch.int32)
    indptr = torch.tensor([1, 4, 4, 10], dtype=torch.int32)  # starts at 1; entry 10 is junk past the end
    dense, lens = fm.flashmla_indices(indices, indptr, num_slots=40)
    assert dense.dtype == torch.int32 and tuple(dense.shape) == (3, 1, 64) and dense.is_contiguous()
    assert lens.tolist() == [3, 0, 6] and lens.dtype == torch.int32
    assert dense[0, 0, :3].tolist() == [3, 7, -1] and dense[2, 0, :6].tolist() == [-1, -1, 2, -1, 39, 5]
    assert bool((dense[0, 0, 3:] == -1).all()) and bool((dense[1, 0] == -1).all())
    wide, _ = fm.flashmla_indices(torch.arange(130, dtype=torch.int32), torch.tensor([0, 130]), 1000)
    assert wide.shape[2] == 192 and wide[0, 0, :130].tolist() == list(range(130))
    with pytest.raises(ValueError, match="indptr"):
        fm.flashmla_indices(indices, torch.tensor([0, 5, 2], dtype=torch.int32), 40)


def test_sink_and_heads_are_padded_as_flashmla_takes_them():
    sink = torch.tensor([0.5, -math.inf, math.nan, 3.0, 9.0])
    got = fm.flashmla_sink(sink, 4, 64, "cpu")
    assert got.dtype == torch.float32 and tuple(got.shape) == (64,)
    assert got[0] == 0.5 and got[1] == -math.inf and math.isnan(got[2]) and got[3] == 3.0
    assert bool((got[4:] == -math.inf).all())
    assert fm.flashmla_sink(None, 4, 64, "cpu") is None
    assert fm.head_groups(64) == [(0, 64, 64)] and fm.head_groups(128) == [(0, 128, 128)]
    assert fm.head_groups(3) == [(0, 3, 64)] and fm.head_groups(100) == [(0, 64, 64), (64, 36, 64)]


def test_a_refusal_it_can_convert_for_is_learned_once(monkeypatch):
    monkeypatch.setattr(fm, "LEARNED", {"topk_multiple": 64, "block_size": None})
    assert fm.learn_from(RuntimeError("topk (64) mod B_TOPK (128) must be 0"))
    assert fm.LEARNED["topk_multiple"] == 128
    assert not fm.learn_from(RuntimeError("topk (64) mod B_TOPK (128) must be 0"))
    assert fm.learn_from(RuntimeError("Currently page_block_size must be 64")) and fm.LEARNED["block_size"] == 64
    assert not fm.learn_from(RuntimeError("CUDA error: an illegal memory access was encountered"))


# --- end to end through a fake that computes what FlashMLA documents -------------------------------------------

@pytest.fixture
def fake_flashmla(monkeypatch):
    fake = FakeFlashMLA()
    monkeypatch.setattr(fm, "unavailable_reason", lambda *a, **k: None)
    monkeypatch.setattr(fm, "load", lambda: fake)
    return fake


def _decode_example(target):
    from contracts.decode import _decode_examples

    return _decode_examples(target)


@contextlib.contextmanager
def _softmax_scale_dropped():
    """A planted conversion bug: the adapter hands FlashMLA the default softmax scale instead of the case's."""
    planted = fm.prepare_decode

    def drops_scale(*a, **k):
        p = planted(*a, **k)
        p.scale = formats.DSV4_HEAD_DIM ** -0.5
        return p

    fm.prepare_decode = drops_scale
    try:
        yield
    finally:
        fm.prepare_decode = planted


@pytest.mark.parametrize("target", ["generic", "gfx950"])
def test_the_decode_contract_judges_flashmla_through_the_subject(fake_flashmla, target):
    """The decode contract's pinned examples (INT32 extremes, out-of-range slots, empty rows, NaN-poisoned unread
    slots, -inf and large sinks, 1/3/16 heads, a non-default scale, pinned plans) pass
    through the subject and the fake; a conversion that dropped the softmax scale is caught by the same contract."""
    from contracts.decode import decode_oracle_agreement
    from impl.targets import get_target

    t = get_target(target)
    sub = fm.FlashMLASubject()
    # poisoned referenced rows are left out: our API scrubs NaN after dequantization and reads scale code 255 as
    # +inf (SPEC 1.2, 2); FlashMLA documents neither (a NaN token gives NaN), so only the GPU can say what it does
    cases = [c.replace(poison="none") for c in _decode_example(t)]
    with using(sub):
        for case in cases:
            assert decode_oracle_agreement(case, t) == [], case
        assert fake_flashmla.calls >= len(cases)
        with _softmax_scale_dropped():
            assert decode_oracle_agreement(cases[0], t), "a dropped softmax scale went unseen"


@pytest.mark.parametrize("target", ["generic", "gfx950"])
def test_a_kernel_reading_poisoned_bytes_by_its_own_rules_is_named_by_the_rule(fake_flashmla, target, monkeypatch):
    """Cases whose referenced rows hold NaN codes and scale code 255 (poison "nan"): the fake reads them as FlashMLA's
    kernel does (no scrub, 255 -> NaN), so where such a row is read the oracle disagrees and the contract names the
    rule the kernel follows (contracts.decode.READING_RULES), not a list of NaN lanes. A kernel that scrubs but reads
    code 255 as NaN is named by the other rule (poison "inf": 255 over finite codes), and one that also computes
    wrong (a dropped softmax scale) is not excused by any rule."""
    import sys

    from contracts.decode import NAN_NOT_SCRUBBED, READING_RULES, SCALE_255_NAN, decode_oracle_agreement
    from impl.targets import get_target

    t = get_target(target)
    sub = fm.FlashMLASubject()
    rules = {m for _, m in READING_RULES}

    def named(poison):
        seen = []
        for case in _decode_example(t):
            got = decode_oracle_agreement(case.replace(poison=poison), t)
            assert all(v.message in rules for v in got) and len(got) <= 1, (poison, got)
            seen += [v.message for v in got]
        return seen

    with using(sub):
        assert NAN_NOT_SCRUBBED in named("nan")
        # subject-agreement judges the subject's own output by the same rules (it differs from ours there)
        from contracts.decode import AgreementCase, subject_agreement

        seen = [v.message for c in _decode_example(t)
                for v in subject_agreement(AgreementCase(family="decode", decode=c.replace(poison="nan")), t)]
        assert NAN_NOT_SCRUBBED in seen and set(seen) <= rules, seen
        # findings.toml's FM1 (and its views) explain that violation for FlashMLA 1.0.0, and nothing else does
        from contracts.engine import findings as kf

        for cid in ("decode-oracle-agreement", "decode-paths-agree", "subject-agreement"):
            assert kf.classify([NAN_NOT_SCRUBBED], kf.load(), cid, "flashmla", "1.0.0", "gfx950"), cid
        assert kf.classify([NAN_NOT_SCRUBBED], kf.load(), "decode-oracle-agreement", "flashmla", "1.1.0",
                           "gfx950") is None
        assert kf.classify([NAN_NOT_SCRUBBED], kf.load(), "decode-oracle-agreement", "vllm", "0.34.0",
                           "gfx950") is None
        as_read = sys.modules[__name__].v4_row
        monkeypatch.setattr(sys.modules[__name__], "v4_row", lambda k, i: torch.nan_to_num(as_read(k, i), nan=0.0,
                                                                                             posinf=math.inf,
                                                                                             neginf=-math.inf))
        assert SCALE_255_NAN in named("inf")
        monkeypatch.setattr(sys.modules[__name__], "v4_row", as_read)
        with _softmax_scale_dropped():
            got = decode_oracle_agreement(_decode_example(t)[0].replace(poison="nan"), t)
            assert got and not any(v.message in rules for v in got), got


# --- the benchmark column --------------------------------------------------------------------------------------

def _column():
    spec = importlib.util.spec_from_file_location("smv_bench_flashmla_t", ROOT / "benchmarks" / "flashmla.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA (found a CUDA device)")
def test_the_benchmark_column_is_skipped_here_with_the_reason(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(fm.PATH_ENV, str(_fake_package(tmp_path)))
    col = _column()
    mod, why = col.availability()
    assert mod is None and why == "no CUDA device (FlashMLA's kernels run on NVIDIA SM90/SM100 only)"
    assert col.main([]) == 0
    assert capsys.readouterr().out.strip() == f"flashmla column: skipped: {why}"


def test_the_benchmark_column_checks_its_output_against_the_oracle(fake_flashmla):
    """The column's call on a (tiny) benchmark workload: the same cache bytes (no copy), the oracle check passes
    for the fake's output and fails for a corrupted one."""
    from contracts.cli import bench

    fm.CONVERSIONS.clear()
    col = _column()
    w = bench.DecodeWorkload(2, "cpu", heads=2, swa=8, extra=16)
    run, plan = col.workload_call(fake_flashmla, w)
    got = run().clone()
    assert col.oracle_check(w, got, plan.num_splits)["ok"]
    assert "cache-realigned" not in fm.CONVERSIONS and "cache-regrouped" not in fm.CONVERSIONS
    got[1, 1, 7] = got[1, 1, 7] * 1.5 + 1.0
    bad = col.oracle_check(w, got, plan.num_splits)
    assert not bad["ok"] and bad["mismatches"]
    # 70 heads: two calls of 64 heads (the second padded), each head's output from its own query and sink
    w = bench.DecodeWorkload(1, "cpu", heads=70, swa=4, extra=8, seed=3)
    w.sink = torch.linspace(-3.0, 3.0, 70)
    run, plan = col.workload_call(fake_flashmla, w)
    assert col.oracle_check(w, run(), plan.num_splits)["ok"] and "heads-padded" in fm.CONVERSIONS


def test_the_bench_table_sets_our_fastest_family_against_flashmla():
    """The issue's batch-64 figures as rows: FlashMLA 46.5 us replayed, ours 95.7 (gfx950) and 120.0 (gfx942): the
    line names our fastest family and its time over FlashMLA's, on the graph clock where every row has one."""
    from contracts.cli import bench

    def info(family, us, graph_us, subject=None):
        d = {"smv_bench": 1, "kind": "decode", "family": family, "batch": 64, "bytes": 10 ** 6, "flops": 10 ** 9,
             "graph_seconds": graph_us and graph_us / 1e6}
        if subject:
            d["subject"] = subject
        return {"name": family, "fullname": family, "stats": {"median": us / 1e6}, "extra_info": d}

    doc = {"benchmarks": [info("gfx950", 110.0, 95.7), info("gfx942", 100.0, 120.0),
                          info("sm90", 50.0, 46.5, "flashmla==1.0.0")]}
    table = bench.format_table(doc)
    assert ("batch 64: flashmla==1.0.0 sm90 46.5 us; our fastest, triton gfx950, 95.7 us = 2.06x its time (graph)"
            in table.splitlines())
    doc["benchmarks"][1]["extra_info"]["graph_seconds"] = None  # one row without a replay: all by events
    assert ("batch 64: flashmla==1.0.0 sm90 50.0 us; our fastest, triton gfx942, 100.0 us = 2.00x its time (events)"
            in bench.format_table(doc).splitlines())


def test_decode_variants_summary_gives_flashmla_its_rates_and_our_best_over_its_time():
    spec = importlib.util.spec_from_file_location("dv_t", ROOT / "benchmarks" / "decode_variants.py")
    dv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dv)
    fig = {"bytes": 4_000_000, "flops": 2_000_000_000}
    fmrow = {"batch": 64, "family": "flashmla", "impl": "flashmla==1.0.0 sm90", "us": 50.0, "graph_us": 40.0,
             "oracle": {"ok": True}, **fig}
    dv.rates(fmrow, {"copy_bytes_per_s": 4e12, "matmul_flops_per_s": 800e12})
    assert fmrow["gb_per_s"] == pytest.approx(100.0) and fmrow["tflop_per_s"] == pytest.approx(50.0)
    assert fmrow["fraction_of_copy_ceiling"] == pytest.approx(0.025)
    assert fmrow["fraction_of_matmul_ceiling"] == pytest.approx(0.0625)
    rows = [fmrow,
            {"batch": 64, "family": "gfx950", "impl": "ours single-read", "variant": "single-read", "us": 90.0,
             "graph_us": 80.0, "oracle": {"ok": True}},
            {"batch": 64, "family": "gfx950", "impl": "ours x64", "variant": "x64", "us": 60.0, "graph_us": 70.0,
             "oracle": {"ok": False}},  # wrong output: never "best"
            {"batch": 64, "family": "gfx950", "impl": "ours reduce", "us": 5.0}]
    (line,) = dv.flashmla_lines(rows)
    assert line.split()[:5] == ["64", "flashmla", "40.0", "us", "(graph,"]
    assert "100 GB/s = 2.5% of copy, 50.0 TFLOP/s = 6.2% of bf16 mma" in line
    assert line.endswith("our best gfx950 single-read 80.0 us = 2.00x FlashMLA's time")
