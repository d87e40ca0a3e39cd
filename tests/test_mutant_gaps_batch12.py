"""Gaps that surviving mutants of ``smv mutate`` (issue 30 item 5, the seed-4242 sample, batch 12) showed, closed in
the generators:

* ``bad-input-refusal`` breaks a two-stage compressor call's ``splits`` (a float, 0, 32; fuzz/bad_input.py): zero
  splits must be refused by the splits check itself, not by the ``R // splits`` division after it (a
  ZeroDivisionError is no refusal); a pinned example carries it;
* the codec contracts hand a packed input that ends where an unreadable page begins (fuzz/formats.py
  ``lay_out_codec_input``), so a codec kernel whose load of its tail block is unmasked faults instead of reading
  bytes it then drops. A fault cannot be caught in this process: the planted kernel runs in a subprocess.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import impl  # noqa: F401  (the Triton mode first)
from contracts import bad_input as cb
from contracts import formats as cf
from fuzz import bad_input as fz
from fuzz import formats as ffm
from fuzz.bad_input import BadInputCase
from impl import compressor as icomp
from impl.runtime import kernel_device
from impl.targets import get_target

TARGET = get_target("generic")


def _splits_example() -> BadInputCase:
    (case,) = [c for c in fz._examples(TARGET) if c.arg == "splits"]
    return case


def test_zero_splits_are_refused_by_the_check_and_a_check_that_lets_zero_through_is_caught(monkeypatch):
    case = _splits_example()
    assert case.breakage == "range-low" and cb.bad_input_refusal(case, TARGET) == []
    real = icomp.compress_norm_rope_store

    def lets_zero_through(*a, **kw):  # a lower bound of 0 instead of 1: the division after the check raises
        if kw.get("splits") == 0:
            icomp.window_rows(kw["ratio"]) // kw["splits"]
        return real(*a, **kw)

    monkeypatch.setattr(cb, "_entry", lambda target, name: lets_zero_through)
    v = cb.bad_input_refusal(case, TARGET)
    assert [x.message for x in v] == [cb.REFUSAL_WRONG_TYPE] and "ZeroDivisionError" in v[0].got


def test_every_splits_breakage_is_refused_by_ours():
    inner = fz._two_stage_plain().to_json()
    for breakage in ("dtype", "range-low", "range-high"):
        case = BadInputCase(entry="compressor.compress_norm_rope_store", arg="splits", breakage=breakage,
                            inner=inner)
        assert cb.bad_input_refusal(case, TARGET) == [], breakage


def test_the_ue8m0_example_passes_on_guarded_packed_inputs():
    x = torch.arange(5, dtype=torch.float32) + 0.5
    buf, view = ffm.lay_out_codec_input(x, "contiguous", 0.0)
    assert buf is view and view.is_contiguous() and torch.equal(view, x)
    (case,) = cf._ue8_examples(TARGET)
    assert case.input_layout == "contiguous" and len(case.scales) % 256  # a tail block: lanes past n exist
    assert cf.ue8m0_codec_exact(case, TARGET) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard page is mprotect on Linux")
@pytest.mark.skipif(kernel_device() != "cpu", reason="the guard page protects host memory, which the interpreter's "
                    "kernels read; on a GPU an unmasked tail load reads the allocator's slack without a fault "
                    "a memory checker such as compute-sanitizer sees it natively)")
def test_an_encode_kernel_that_loads_its_tail_unmasked_faults(tmp_path):
    planted = tmp_path / "planted_codec.py"
    planted.write_text(textwrap.dedent("""
        import impl  # noqa: F401  (the Triton mode first)
        import triton
        import triton.language as tl

        from contracts import formats as cf
        from impl import codec_kernels as ck
        from impl.targets import get_target
        from impl.triton_helpers import ue8m0_encode_bits


        @triton.jit
        def unmasked(src, dst, n, CAP: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(dst + offs, ue8m0_encode_bits(tl.load(src + offs), CAP), mask=m)


        t = get_target("generic")
        (case,) = cf._ue8_examples(t)
        print("real", cf.ue8m0_codec_exact(case, t), flush=True)
        ck._ue8m0_encode_kernel = unmasked
        print("planted", cf.ue8m0_codec_exact(case, t), flush=True)
    """))
    p = subprocess.run([sys.executable, str(planted)], capture_output=True, text=True, timeout=120,
                       cwd=str(Path(__file__).resolve().parents[1]))
    assert "real []" in p.stdout, (p.stdout[-500:], p.stderr[-500:])
    assert "planted" not in p.stdout and p.returncode < 0, (p.returncode, p.stdout[-500:], p.stderr[-500:])
