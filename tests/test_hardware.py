"""Tests for real gfx942 (MI300X) and gfx950 (MI355X) GPUs, each with a CPU twin.

Every marked test calls one function with the real device's facts; its unmarked twin calls the same function with
a fake device (a ROCm torch reporting ``gcnArchName`` and a CU count), a fake AMD AITER package, or both, so the code
path of every hardware test also runs on every CPU and nothing marked is only ever skipped.

- target detection: ``gcnArchName`` -> target, the device's own CU count, the markers that run;
- every contract on the detected target, carrying the device's own CU count (natively on the hardware; on the twin
  the generated cases only, ``min_cases`` of them, under the interpreter);
- the AITER OPUS prefill route on gfx950: the guard lets a 1024-row prefill through, the real op runs (no Triton
  fallback) and its output agrees with the float64 oracle.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch

from contracts.markers import HARDWARE_MARKERS, marker_status
from contracts.plugin import row_failure
from contracts.registry import load_all
from contracts.engine.runner import run_contract
from impl import prefill as pf
from impl import runtime, targets
from impl.targets import TARGETS, Target
from oracles import compare as cmp
from oracles import prefill as ref_prefill

CONTRACTS = load_all()
ARCHS = ("gfx942", "gfx950")
#: as in tests/test_contracts.py: the ci profile bounds the rows, the budget only guards against hangs
ROW_BUDGET = 300.0


@dataclasses.dataclass(frozen=True)
class FakeDeviceProperties:
    """What ``torch.cuda.get_device_properties`` returns on a ROCm build, as far as the suite reads it."""

    name: str
    gcnArchName: str
    multi_processor_count: int


#: partitioned (CPX-mode) parts: CU counts unlike the pinned 304 / 256, so reading the pinned count instead of the
#: device's shows
FAKE_DEVICES = {
    "gfx942": FakeDeviceProperties("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 38),
    "gfx950": FakeDeviceProperties("AMD Instinct MI355X", "gfx950:sramecc+:xnack-", 32),
}


def on(arch: str):
    """``arch`` as a parameter that needs that hardware."""
    return pytest.param(arch, marks=getattr(pytest.mark, arch), id=arch)


@contextlib.contextmanager
def rocm_device(props: FakeDeviceProperties | None):
    """While the block runs, torch reports one ROCm device with ``props`` (None: the real device, untouched), and
    ``SMV_TARGET`` is unset so the device alone decides the target."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(targets.ENV_OVERRIDE, raising=False)
        if props is not None:
            mp.setattr(torch.cuda, "is_available", lambda: True)
            mp.setattr(torch.version, "hip", "6.4.0", raising=False)
            mp.setattr(torch.cuda, "get_device_properties", lambda device=0: props)
            mp.setattr(runtime, "_DEVICE", None)  # detection caches; re-detect now, restore the real one after
        yield


def device_facts(props: FakeDeviceProperties | None):
    return props if props is not None else torch.cuda.get_device_properties(0)


def device_target(props: FakeDeviceProperties | None) -> Target:
    """The detected target of the device (real, or reporting ``props``), carrying the device's own CU count."""
    with rocm_device(props):
        t = targets.detect_target()
        return dataclasses.replace(t, cu_count=targets.effective_cu_count(t))


# --- detection ---------------------------------------------------------------------------------------------------

def check_detection(arch: str, props: FakeDeviceProperties | None) -> None:
    with rocm_device(props):
        facts = device_facts(props)
        dev = runtime.detect_device()
        assert dev.kind == "rocm" and dev.name == facts.name
        assert dev.arch == str(facts.gcnArchName).split(":")[0], "the feature flags after ':' are not the arch"
        t = targets.detect_target()
        assert t is TARGETS[arch], f"{facts.gcnArchName!r} detected as {t.name}"
        assert targets.effective_cu_count(t) == facts.multi_processor_count
        for other in TARGETS.values():  # a target this device is not keeps its pinned count
            if other is not t:
                assert targets.effective_cu_count(other) == other.cu_count, other.name
        runs = {m: marker_status(m, dev)[0] for m in HARDWARE_MARKERS}
        assert runs == {"gpu": True, "cuda": False, "rocm": True, "gfx942": arch == "gfx942",
                        "gfx950": arch == "gfx950"}
        assert device_target(props).cu_count == facts.multi_processor_count


@pytest.mark.parametrize("arch", [on(a) for a in ARCHS])
def test_detection(arch):
    check_detection(arch, None)


@pytest.mark.parametrize("arch", ARCHS)
def test_detection_twin(arch):
    before = runtime.detect_device()
    check_detection(arch, FAKE_DEVICES[arch])
    assert runtime.detect_device() == before, "the fake device outlived its test"


def test_detection_twin_without_feature_flags():
    check_detection("gfx950", dataclasses.replace(FAKE_DEVICES["gfx950"], gcnArchName="gfx950"))


# --- every contract on the detected target ----------------------------------------------------------------------

def check_contract_on_device(arch: str, contract_id: str, props: FakeDeviceProperties | None, repro_dir: str, *,
                             max_examples: int | None = None, use_examples: bool = True, profile: str = "ci",
                             seed: int | None = None, min_cases: int | None = None) -> None:
    t = device_target(props)
    assert t.name == arch
    assert t.cu_count == device_facts(props).multi_processor_count
    if props is None:
        assert runtime.triton_mode() == "native", "a visible GPU must run the kernels natively"
    c = CONTRACTS[contract_id]
    row = run_contract(c, t, profile=profile, budget=ROW_BUDGET, repro_dir=repro_dir, max_examples=max_examples,
                       use_examples=use_examples, seed=seed)
    # a twin's deliberately small case limit leaves the row "incomplete" (below the contract's minimum): that is
    # the limit's doing, and its cases passed
    limited = min_cases is not None and row.status == "incomplete" and not row.violations \
        and row.reason.startswith("the case limit stopped the row")
    if row.status != "pass" and not limited:
        pytest.fail(row_failure(row), pytrace=False)
    assert row.cases >= (c.min_cases if min_cases is None else min_cases)


# subject-agreement compares a subject with ours: on ours it is skipped by design (tests/test_vllm_decode.py)
ROWS = [(a, cid) for a in ARCHS for cid in sorted(CONTRACTS)
        if CONTRACTS[cid].applies_to(a) and not CONTRACTS[cid].extra.get("skipped_on_ours")]


@pytest.mark.parametrize(("arch", "contract_id"),
                         [pytest.param(a, cid, marks=getattr(pytest.mark, a), id=f"{a}-{cid}") for a, cid in ROWS])
def test_contract_natively(arch, contract_id, smv_repro_dir):
    check_contract_on_device(arch, contract_id, None, smv_repro_dir)


@pytest.mark.parametrize(("arch", "contract_id"), [pytest.param(a, cid, id=f"{a}-{cid}") for a, cid in ROWS])
def test_contract_natively_twin(arch, contract_id, smv_repro_dir):
    # pinned examples and the covering arrays already run on every emulated target in tests/test_contracts.py; the
    # twin proves the path from a device's properties to its target (the target it detects, the CU count it reads)
    # into a contract's run, so one seeded draw is enough (dev: no covering array, which would repeat
    # test_contracts' rows at their cost; the real device's run above keeps every row's minimum)
    check_contract_on_device(arch, contract_id, FAKE_DEVICES[arch], smv_repro_dir, max_examples=1,
                             use_examples=False, profile="dev", seed=0, min_cases=1)


# --- the AITER OPUS prefill route -------------------------------------------------------------------------------

OPUS_SQ, OPUS_HEADS, OPUS_D, OPUS_SKV, OPUS_K = pf.OPUS_MIN_QUERIES, 2, 512, 64, 6
OPUS_SCALE = 0.0625


def _opus_inputs(device: str):
    """A 1024-row bf16 prefill every SPEC 3 guard condition admits, with dense indices holding -1, -2 and slots past
    skv (masked: OPUS may only be given valid rows) and a topk_length cutting some rows short."""
    g = torch.Generator().manual_seed(42)
    q = torch.randn(OPUS_SQ, OPUS_HEADS, OPUS_D, generator=g).to(torch.bfloat16)
    kv = torch.randn(OPUS_SKV, OPUS_D, generator=g).to(torch.bfloat16)
    dense = torch.randint(-2, OPUS_SKV + 3, (OPUS_SQ, OPUS_K), generator=g, dtype=torch.int32)
    topk = torch.randint(0, OPUS_K + 1, (OPUS_SQ,), generator=g, dtype=torch.int32)
    sink = torch.randn(OPUS_HEADS, generator=g, dtype=torch.float32)
    out = torch.full_like(q, math.nan)
    return tuple(x.to(device) for x in (q, kv, dense, topk, sink, out))


def _mirrored_on_a_gpu(guard):
    """``guard`` asked about fake GPU tensors with the shapes, dtypes and strides of its CPU arguments: SPEC 3's
    "q on the GPU" is the one condition a CPU cannot meet, and the real guard still decides every other one."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def mirror(t):
        return None if t is None else torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="cuda:0")

    def asked(q, kv, attn_sink, out, *, target=None):
        with FakeTensorMode():
            return guard(mirror(q), mirror(kv), mirror(attn_sink), mirror(out), target=target)

    return asked


def check_opus_route(props: FakeDeviceProperties | None) -> None:
    t = device_target(props)
    assert t.opus_eligible
    st = targets.aiter_status()
    if not st.importable:
        pytest.skip(f"needs AMD AITER (the amd-aiter distribution) importable: {st.reason}")
    pf.get_aiter_sparse_prefill_opus.cache_clear()
    op = pf.get_aiter_sparse_prefill_opus()
    assert op is not None, f"AMD AITER imports but {pf.AITER_OPUS_MODULE}.{pf.AITER_OPUS_NAME} does not load"
    q, kv, dense, topk, sink, out = _opus_inputs(runtime.kernel_device())
    calls = {"opus": 0, "triton": 0}

    def counted(name, fn):
        def call(*args, **kw):
            calls[name] += 1
            return fn(*args, **kw)
        return call

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pf, "get_aiter_sparse_prefill_opus", lambda: counted("opus", op))
        mp.setattr(pf, "sparse_attn_prefill_triton", counted("triton", pf.sparse_attn_prefill_triton))
        if q.device.type == "cpu":
            mp.setattr(pf, "can_use_aiter_sparse_prefill_opus", _mirrored_on_a_gpu(pf.can_use_aiter_sparse_prefill_opus))
        pf.sparse_attn_prefill(q, kv, dense, OPUS_SCALE, sink, out, topk_length=topk, target=t)
    assert calls == {"opus": 1, "triton": 0}, f"expected the OPUS route alone (an OPUS RuntimeError falls back): {calls}"
    ref = ref_prefill.ref_sparse_attn_prefill(q, kv, softmax_scale=OPUS_SCALE, attn_sink=sink, out_width=OPUS_D,
                                              dense=dense.tolist(), topk_length=topk.tolist())
    tol = ref_prefill.prefill_tolerance(ref, "bfloat16", runtime.triton_mode(), OPUS_D)
    bad = cmp.compare_attention(out.detach().cpu(), ref.out, tol)
    assert not bad, "OPUS output vs float64 oracle: " + "; ".join(f"{m.kind} at {m.where}: expected {m.expected}, "
                                                                 f"got {m.got}" for m in bad)


def _fake_opus(q, kv, indices, indptr, ext_kv, ext_indices, ext_indptr, attn_sink, softmax_scale, out=None):
    """AITER's ``pa_sparse_prefill_opus`` in plain torch: each row attends to its paged rows and its extend rows
    plus the sink. Like the real op it requires every index to be a valid row, so an unfiltered -1 fails loudly."""
    for name, idx, src in (("indices", indices, kv), ("extend indices", ext_indices, ext_kv)):
        if idx.numel() and not bool(((idx >= 0) & (idx < src.shape[0])).all()):
            raise IndexError(f"fake OPUS: {name} hold rows outside [0, {src.shape[0]})")
    kvf, extf = kv.float(), ext_kv.float()
    for r in range(q.shape[0]):
        rows = torch.cat([kvf[indices[indptr[r]:indptr[r + 1]].long()],
                          extf[ext_indices[ext_indptr[r]:ext_indptr[r + 1]].long()]])
        s = softmax_scale * (q[r].float() @ rows.T)
        p = torch.softmax(torch.cat([s, attn_sink.float()[:, None]], dim=1), dim=1)[:, :-1]
        out[r] = (p @ rows)[:, :out.shape[-1]].to(out.dtype)
    return out


@pytest.fixture
def fake_aiter(fake_module):
    """AMD AITER as the suite finds it: ``aiter`` with ``aiter.ops`` and ``aiter.ops.pa_sparse_prefill_opus``."""
    module = fake_module
    leaf = module(pf.AITER_OPUS_MODULE, **{pf.AITER_OPUS_NAME: _fake_opus})
    module("aiter", ops=module("aiter.ops", pa_sparse_prefill_opus=leaf))
    pf.get_aiter_sparse_prefill_opus.cache_clear()
    yield
    pf.get_aiter_sparse_prefill_opus.cache_clear()


@pytest.mark.gfx950
def test_real_aiter_opus_route():
    check_opus_route(None)


def test_real_aiter_opus_route_twin(fake_aiter):
    check_opus_route(FAKE_DEVICES["gfx950"])


def test_opus_route_twin_catches_an_unfiltered_index(fake_aiter, monkeypatch):
    # the twin's fake op holds the route to AITER's valid-rows requirement: masked entries passed on fail it
    monkeypatch.setattr(pf, "valid_entries_only", lambda idx, ptr, n: (idx, ptr - ptr[0]))
    with pytest.raises(IndexError, match="outside"):
        check_opus_route(FAKE_DEVICES["gfx950"])
