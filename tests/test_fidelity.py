"""Interpreter fidelity (contracts/subjects/fidelity.py): each correction against torch, each self-test able to fail,
the corrections confined to ``corrected()`` and its thread, the version gate, and the host's source rewrites."""
from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
import threading

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from contracts.subjects import FidelityError
from contracts.subjects import fidelity as fid
from contracts.subjects.vllm import loader

interp = pytest.mark.skipif(not fid.interpreting(), reason="the corrections act under the Triton interpreter only")
known = pytest.mark.skipif(fid.triton_version() not in fid.KNOWN_TRITON,
                           reason=f"triton {fid.triton_version()} is not a version the corrections were verified on")


@triton.jit
def _bf16_add(x_ptr, y_ptr, o_ptr, eq_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)
    y = tl.load(y_ptr + r)
    tl.store(o_ptr + r, x + y)
    tl.store(eq_ptr + r, (x == x).to(tl.int8))


def _run_add():
    x = torch.tensor([1.0, float("nan"), -2.0, 0.5]).to(torch.bfloat16)
    y = torch.tensor([2.0, 1.0, 1.0, 0.25]).to(torch.bfloat16)
    o = torch.empty(4, dtype=torch.bfloat16)
    eq = torch.empty(4, dtype=torch.int8)
    _bf16_add[(1,)](x, y, o, eq, 4)
    return o, eq, x + y, (x == x).to(torch.int8)


def _same(a, b):
    a, b = a.float(), b.float()
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


@interp
@known
def test_self_test_passes_here():
    assert fid.self_test() == []


#: each check, and the corrections it must find missing in the interpreter as it ships
_RAW_FAILURES = [
    (fid._check_bf16_cast, {"bf16-cast"}),
    (fid._check_bf16_ops, {"bf16-arith", "bf16-compare"}),
    (fid._check_bf16_reduce, {"bf16-reduce"}),
    (fid._check_dot, {"bf16-dot", "fp8-dot"}),
    (fid._check_fp8, {"fp8-decode", "fp8-encode"}),
    (fid._check_store_mask, {"store-mask"}),
]


@interp
@known
@pytest.mark.parametrize("check,names", _RAW_FAILURES, ids=lambda v: getattr(v, "__name__", None))
def test_each_check_fails_on_the_uncorrected_interpreter(check, names):
    """The self-test can fail: run without the corrections, each check reports every defect it is there for."""
    assert not fid.active()
    with np.errstate(all="ignore"):
        failures = check(fid.kernels())
    assert {f.split(":", 1)[0] for f in failures} == names, failures


@interp
@known
def test_an_int32_mask_stays_refused_as_the_compiler_refuses_it():
    """Only the splat of a scalar bool is corrected: a mask that is int32 is refused by Triton's semantic layer,
    which the compiler shares, inside corrected() as outside."""
    k = fid.kernels()
    for ctx in (contextlib.nullcontext, fid.corrected):
        with ctx():
            with pytest.raises(Exception, match="boolean"):
                k["store_mask"][(1,)](torch.zeros(1, dtype=torch.int32), 1, True)


@interp
@known
def test_corrected_acts_only_inside_and_restores_on_exit():
    from triton.runtime import interpreter as it

    original = it.InterpreterBuilder.__dict__["binary_op"]
    o, eq, want, want_eq = _run_add()
    assert not _same(o, want) and not torch.equal(eq, want_eq)  # the defect, outside
    with fid.corrected():
        assert fid.active() and it.InterpreterBuilder.__dict__["binary_op"] is not original
        o, eq, want, want_eq = _run_add()
        assert _same(o, want) and torch.equal(eq, want_eq)
        with fid.corrected():  # re-entrant
            assert _same(_run_add()[0], want)
        assert fid.active()
        assert _same(_run_add()[0], want)
    assert not fid.active() and it.InterpreterBuilder.__dict__["binary_op"] is original
    with pytest.raises(KeyError):
        with fid.corrected():
            raise KeyError("boom")
    assert not fid.active() and it.InterpreterBuilder.__dict__["binary_op"] is original


@interp
@known
def test_another_thread_keeps_the_interpreter_as_it_is():
    """The patches check the calling thread: a kernel run by a thread outside corrected() is not corrected."""
    seen = {}

    def other():
        o, _, want, _ = _run_add()
        seen["same"] = _same(o, want)
        seen["active"] = fid.active()

    with fid.corrected():
        th = threading.Thread(target=other)
        th.start()
        th.join()
    assert seen == {"same": False, "active": False}


@interp
def test_unknown_triton_version_is_an_error_not_a_verdict(monkeypatch):
    monkeypatch.setattr(fid, "KNOWN_TRITON", frozenset({"0.0.1"}))
    with fid._uncached_self_test():
        with pytest.raises(FidelityError, match=rf"^triton {re.escape(fid.triton_version())}: interpreter "
                                                r"corrections not verified"):
            with fid.corrected():
                pytest.fail("entered")  # pragma: no cover
        assert fid.self_test()[0].startswith("version: triton")
    assert not fid.active()


@interp
@known
def test_a_failed_self_test_names_the_correction(monkeypatch):
    calls = []

    def fake_checks():
        calls.append(1)
        return ["bf16-dot: bf16 tl.dot: 3 of 256 differ from torch"]

    monkeypatch.setattr(fid, "_run_checks", fake_checks)
    with fid._uncached_self_test():
        for _ in range(2):
            with pytest.raises(FidelityError, match=r"failed their self-test \(bf16-dot\)"):
                with fid.corrected():
                    pytest.fail("entered")  # pragma: no cover
        assert calls == [1]  # once per process: the result is cached
    assert not fid.active()


def test_native_corrected_does_nothing(monkeypatch):
    monkeypatch.setattr(fid, "interpreting", lambda: False)
    monkeypatch.setattr(fid, "KNOWN_TRITON", frozenset())  # not even the version is asked natively
    with fid.corrected():
        assert not fid.active()
    assert fid.self_test() == []


@interp
@known
def test_impl_kernels_give_the_same_bytes_inside_corrected():
    """Our own kernels work from bits, so the corrections leave their results as they are."""
    from impl import codec_kernels as K

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    x = torch.randn(512, generator=torch.Generator().manual_seed(0)) * 100
    outside = [K.fp8_decode_triton(codes, f) for f in ("ocp", "fnuz")] + [K.fp8_encode_triton(x, f)
                                                                         for f in ("ocp", "fnuz")]
    with fid.corrected():
        inside = [K.fp8_decode_triton(codes, f) for f in ("ocp", "fnuz")] + [K.fp8_encode_triton(x, f)
                                                                            for f in ("ocp", "fnuz")]
    for a, b in zip(outside, inside):
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.uint8 else a.nan_to_num(),
                           b.view(torch.uint8) if b.dtype == torch.uint8 else b.nan_to_num())


def test_numpy_codecs_against_torch():
    """The vectorized helpers alone, over every bf16 word and every fp8 code (the kernels' checks use them)."""
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = torch.from_numpy(words.view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    got = fid.bf16_to_f32(words)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 1e3
    assert np.array_equal(fid.f32_to_bf16(x).view(np.int16),
                          torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy())
    for name, td in (("fp8e4nv", torch.float8_e4m3fn), ("fp8e4b8", torch.float8_e4m3fnuz),
                     ("fp8e5", torch.float8_e5m2), ("fp8e5b16", torch.float8_e5m2fnuz)):
        ref = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(td).float().numpy()
        dec = fid._FP8[name].decode
        assert np.array_equal(np.isnan(dec), np.isnan(ref)) and np.array_equal(np.nan_to_num(dec), np.nan_to_num(ref))


# --- rewrites ------------------------------------------------------------------------------------------------------

def _rw(rid, when):
    return loader.Rewrite(rid, loader.NEEDED[0], "x", "y", "test", when=when)


@pytest.mark.parametrize("mode", ["interpreter", "native"])
def test_rewrites_for_host_pick_by_when(monkeypatch, mode):
    rws = [_rw("a", "always"), _rw("i", "interpreter"), _rw("n", "native"),
           loader.Rewrite("native-tl-cat-dim1", loader.NEEDED[0], "x", "y", "t", when="native"),
           loader.Rewrite("native-drop-waves-per-eu", loader.NEEDED[0], "x", "y", "t", when="native"),
           loader.Rewrite("native-fp8-dot-bf16-operands", loader.NEEDED[0], "x", "y", "t", when="native")]
    monkeypatch.setattr(loader, "REWRITES", rws)
    monkeypatch.setattr(fid, "interpreting", lambda: mode == "interpreter")
    # a host with neither tl.cat(dim=) nor HIP: NVIDIA with Triton 3.6
    monkeypatch.setattr(fid, "_triton_cat_has_dim", lambda: False)
    monkeypatch.setattr(fid, "_on_hip", lambda: False)
    ids = [r.id for r in fid.rewrites_for_host()]
    if mode == "interpreter":
        assert ids == ["a", "i"]
    else:
        assert ids == ["a", "n", "native-tl-cat-dim1", "native-drop-waves-per-eu", "native-fp8-dot-bf16-operands"]
        # AMD with a Triton that has tl.cat(dim=): no native rewrite is needed (its fp8 MFMA accumulates in fp32)
        monkeypatch.setattr(fid, "_triton_cat_has_dim", lambda: True)
        monkeypatch.setattr(fid, "_on_hip", lambda: True)
        assert [r.id for r in fid.rewrites_for_host()] == ["a", "n"]


def test_native_rewrites_are_registered():
    ids = {r.id: r for r in loader.REWRITES}
    for rid in ("native-tl-cat-dim1", "native-drop-waves-per-eu", "native-fp8-dot-bf16-operands"):
        assert ids[rid].when == "native" and ids[rid].path == loader.NEEDED[0] and ids[rid].why


def _cat_rewrite():
    return next(r for r in loader.REWRITES if r.id == "native-tl-cat-dim1")


_CAT_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def cat_kernel(a_ptr, b_ptr, c_ptr, d_ptr, o_ptr, M: tl.constexpr, N: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    a = tl.load(a_ptr + rm[:, None] * N + rn[None, :])
    b = tl.load(b_ptr + rm[:, None] * N + rn[None, :])
    c = tl.load(c_ptr + rm[:, None] * N + rn[None, :])
    d = tl.load(d_ptr + rm[:, None] * N + rn[None, :])
    ab = tl.cat(a, b, dim=1)
    cd = tl.cat(c, d, dim=1)
    abcd = tl.cat(ab, cd, dim=1)
    r4 = tl.arange(0, 4 * N)
    tl.store(o_ptr + rm[:, None] * 4 * N + r4[None, :], abcd)
'''


@interp
def test_cat_rewrite_is_the_same_concatenation(tmp_path):
    """The replacement for tl.cat(a, b, dim=1), nested as upstream nests it, equals torch.cat (it was also checked
    natively on an H200 with Triton 3.6, where tl.cat has no dim)."""
    rw = _cat_rewrite()
    new, n = rw.apply(_CAT_KERNEL)
    assert n == 3 and "tl.cat" not in new
    outs = []
    for i, src in enumerate((_CAT_KERNEL, new)):
        path = tmp_path / f"smv_cat_{i}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"smv_cat_{i}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        g = torch.Generator().manual_seed(1)
        xs = [torch.randn(4, 8, generator=g).to(torch.bfloat16) for _ in range(4)]
        o = torch.empty(4, 32, dtype=torch.bfloat16)
        mod.cat_kernel[(1,)](*xs, o, 4, 8)
        outs.append(o)
        assert torch.equal(o, torch.cat(xs, 1))
    sys.modules.pop("smv_cat_0", None)
    sys.modules.pop("smv_cat_1", None)


def test_bf16_operands_hold_every_e4m3_value_exactly():
    """What native-fp8-dot-bf16-operands rests on: each of the 256 OCP e4m3 codes (and FNUZ's) converts to bf16
    without rounding, so a dot over bf16 operands accumulated in fp32 is the fp8 dot an fp32-accumulating MFMA
    computes."""
    codes = torch.arange(256, dtype=torch.uint8)
    for dt in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        f = codes.view(dt)
        a, b = f.to(torch.float32), f.to(torch.bfloat16).to(torch.float32)
        assert torch.equal(torch.isnan(a), torch.isnan(b))
        assert torch.equal(a[~torch.isnan(a)], b[~torch.isnan(b)])


def test_native_rewrites_match_upstream_once_each(vllm_subject):
    """On the pinned release: the four tl.cat(..., dim=1), the one waves_per_eu= and the paged-logits fp8 dot are
    rewritten, nothing else, and the rewritten module still parses."""
    import ast
    import os

    path = os.path.join(vllm_subject.tree.root, loader.NEEDED[0])
    with open(path, encoding="utf-8") as fh:
        src = fh.read()
    counts = {}
    for r in loader.REWRITES:
        if r.id in ("native-tl-cat-dim1", "native-drop-waves-per-eu", "native-fp8-dot-bf16-operands"):
            src, counts[r.id] = r.apply(src)
    assert counts == {"native-tl-cat-dim1": 4, "native-drop-waves-per-eu": 1, "native-fp8-dot-bf16-operands": 1}
    assert "tl.dot(kv.to(tl.bfloat16), tl.trans(q).to(tl.bfloat16))" in src
    assert "dim=1)" not in "".join(line for line in src.splitlines() if "tl.cat(" in line)
    assert "waves_per_eu" not in src
    ast.parse(src)
