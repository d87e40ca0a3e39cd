"""The specialization-key predictor (contracts/engine/specializations.py) and the bound on what a kernel contract compiles.

* The predicted key of each argument equals what Triton's own binder (``create_function_from_signature`` with the
  base backend, run on the host) forms, for several signatures: plain ints of each class, ints under
  ``do_not_specialize`` / ``do_not_specialize_on_alignment``, bools, floats, None, aligned and unaligned tensors,
  annotated and constexpr parameters.
* A kernel contract's row counts few distinct specializations over a fixed number of cases (the bound the
  ``do_not_specialize`` lists in impl/ keep), and planting a specializing argument back (dropping
  ``num_heads`` from the generic decode kernel's list) breaks that bound.
"""
from __future__ import annotations

import inspect

import pytest
import torch
import triton
import triton.language as tl

from contracts.engine import specializations as sp
from impl.runtime import triton_mode

INTERPRETER = triton_mode() == "interpreter"


def _k_plain(a, b, c, p, q, F: tl.constexpr):
    pass


def _k_annotated(a: tl.int64, b: tl.int32, x: tl.float32, flag, p, q, r, W: tl.constexpr = 4):
    pass


SIGNATURES = [
    (_k_plain, {}),
    (_k_plain, {"do_not_specialize": ["a", "p"]}),
    (_k_plain, {"do_not_specialize_on_alignment": ["b", "q"]}),
    (_k_annotated, {"do_not_specialize": [1], "do_not_specialize_on_alignment": ["r"]}),
]


def _launches():
    t = torch.zeros(64, dtype=torch.float32)
    h = torch.zeros(64, dtype=torch.bfloat16)
    u = torch.zeros(64, dtype=torch.uint8)
    ints = [1, 0, 16, 48, 17, -16, -1, 2 ** 31, 2 ** 31 + 16, 2 ** 63]
    views = [t, t[1:], h, h[8:], u, u[3:], t[4:]]
    out = []
    for i, a in enumerate(ints):
        b, c = ints[(i + 3) % len(ints)], ints[(i + 5) % len(ints)]
        p, q = views[i % len(views)], views[(i + 2) % len(views)]
        out.append((a, b, c, p, q))
    return out, (t, h, u)


def _binder(fn, kw):
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import KernelParam, create_function_from_signature

    sig = inspect.signature(fn)
    dns, dnsa = kw.get("do_not_specialize", []), kw.get("do_not_specialize_on_alignment", [])
    params = [KernelParam(i, p, i in dns or p.name in dns, i in dnsa or p.name in dnsa)
              for i, p in enumerate(sig.parameters.values())]
    return params, create_function_from_signature(sig, params, BaseBackend)


@pytest.mark.parametrize("fn,kw", SIGNATURES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_predicted_key_equals_tritons_binder(fn, kw):
    params, binder = _binder(fn, kw)

    class Fake:  # what kernel_params reads from an InterpretedFunction: the function and the @jit keywords
        pass

    kernel = Fake()
    kernel.fn, kernel.kwargs = fn, kw
    launches, _ = _launches()
    predicted, real = [], []
    for a, b, c, p, q in launches:
        if fn is _k_plain:
            args, kwargs = (a, b, c, p, q, a), {"num_warps": 4}
        else:
            args, kwargs = (a, b, 1.5, bool(a % 2), p, q, p), {"num_stages": 2}
        _, spec, _ = binder(*args, **kwargs)
        key = sp.specialization_key(kernel, args, kwargs)
        assert [tuple(s) for s in spec] == [v for _, v in key[:-1]], (fn.__name__, kw, args)
        predicted.append(key)
        real.append(str(spec))
    # two launches share a predicted key exactly when Triton's binder gives them one
    assert len(set(map(repr, predicted))) == len(set(real))


def test_options_are_part_of_the_key():
    class Fake:
        pass

    kernel = Fake()
    kernel.fn, kernel.kwargs = _k_plain, {}
    t = torch.zeros(8)
    k1 = sp.specialization_key(kernel, (2, 3, 5, t, t, 0), {"num_warps": 4})
    k2 = sp.specialization_key(kernel, (2, 3, 5, t, t, 0), {"num_warps": 8})
    k3 = sp.specialization_key(kernel, (4, 7, 9, t, t, 0), {"num_warps": 4})
    assert k1 != k2 and k1 == k3
    assert sp.varying_parameters([k1, k2]) == {"options": 2}


# --- the bound -----------------------------------------------------------------------------------------------------

#: decode-oracle-agreement on generic, seed 1, the 2 pinned and 14 generated cases: distinct specializations of the
#: generic decode kernel. Before the do_not_specialize list on its bounds-only ints (head count, block sizes, slot
#: counts) the same cases needed 13, with num_heads alone specialized again 11 (benchmarks/GPU_THROUGHPUT.md); what
#: remains varies with the code paths (HAS_EXTRA, HAS_SINK, the sink's dtype) and the alignment of the caches and
#: their block strides, which production compiles too. The layout dimensions (padded, lane-strided and sliced q,
#: out and caches) add stride alignments of their own: 9 with them.
GENERIC_DECODE_BOUND = 9
GENERIC_KERNEL = "impl.decode._sparse_decode_generic_kernel"


def _generic_decode_keys() -> int:
    from contracts.registry import get_contract, load_all
    from contracts.engine.runner import run_contract

    load_all()
    row = run_contract(get_contract("decode-oracle-agreement"), "generic", profile="dev", budget=60, seed=1,
                       max_examples=14)
    assert row.status == "pass", row.reason
    return sp.counts(row.spec_keys).get(GENERIC_KERNEL, 0)


@pytest.mark.skipif(not INTERPRETER, reason="the predicted count is the interpreter's (natively: compiled ones)")
def test_generic_decode_specializations_stay_bounded_and_a_planted_one_breaks_the_bound(monkeypatch):
    n = _generic_decode_keys()
    assert 1 <= n <= GENERIC_DECODE_BOUND, n
    # plant: num_heads specialized again (1, multiples of 16 and the rest are three binaries)
    from impl import decode

    kernel = decode._sparse_decode_generic_kernel
    planted = [a for a in kernel.kwargs["do_not_specialize"] if a != "num_heads"]
    monkeypatch.setitem(kernel.kwargs, "do_not_specialize", planted)
    monkeypatch.setattr(kernel, "__smv_params__", None, raising=False)
    assert _generic_decode_keys() > GENERIC_DECODE_BOUND


# --- audit.json 7 ---------------------------------------------------------------------------------------------------

def test_schema_7_requires_each_rows_specializations(tmp_path):
    from contracts.engine import reports
    from contracts.engine.audit import run_audit

    doc, code = run_audit(["indexer-writer-exact"], ["generic"], budget=60, profile="dev", max_cases=6, seed=1,
                          progress=False, report_dir=str(tmp_path))
    assert code == 0 and doc["schema_version"] == reports.AUDIT_SCHEMA_VERSION >= 7
    assert reports.validate(doc, reports.audit_schema(7)) == []
    assert doc["run"]["specializations_source"] == ("predicted" if INTERPRETER else "compiled")
    (row,) = doc["results"]
    spec = row["specializations"]
    if INTERPRETER:  # natively an earlier test of the process may have compiled them already
        assert set(spec) == {"impl.indexer_writer._indexer_k_quant_kernel",
                             "impl.indexer_writer._indexer_compress_kernel"}
        assert all(1 <= n <= row["cases"] for n in spec.values())
    broken = dict(doc, results=[{k: v for k, v in row.items() if k != "specializations"}])
    assert any("specializations" in e for e in reports.validate(broken, reports.audit_schema(7)))
    assert reports.validate(broken, reports.audit_schema(6)) == []
    no_source = dict(doc, run={k: v for k, v in doc["run"].items() if k != "specializations_source"})
    assert any("specializations_source" in e for e in reports.validate(no_source, reports.audit_schema(7)))
