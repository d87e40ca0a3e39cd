"""What the vllm subject's adapters do on an NVIDIA host, checked here on the CPU (with the two host probes the
adapters ask replaced).

A native audit of upstream on the H200 found two harness faults: upstream's gfx942 indexer kernels (paged logits,
the indexer-K writer) failed to compile because they use FNUZ fp8, which Triton on NVIDIA does not have (a failed
row, where decode and the gather already said the row cannot run there), and upstream's paged-logits output buffer
came from the adapter's workspace on the CPU whatever the inputs' device (a failed row on gfx950). The second is
checked on torch's ``meta`` device."""
from __future__ import annotations

import pytest
import torch

import contracts.subjects.vllm.adapters as adapters
import impl.runtime as runtime
from contracts.subjects import SubjectUnavailable
from contracts.subjects.vllm.adapters import native_fnuz_unavailable
from contracts.subjects.vllm.adapters.indexer_logits import _PoisonedWorkspace
from fuzz.indexer_logits import IndexerLogitsCase, build_decode_inputs
from impl.targets import get_target


@pytest.fixture
def nvidia_host(monkeypatch):
    monkeypatch.setattr(adapters, "triton_mode", lambda: "native")
    monkeypatch.setattr(adapters, "detect_device", lambda: runtime.DeviceInfo("cuda", "NVIDIA H200", "sm_90"))


def test_fnuz_rows_cannot_run_on_an_nvidia_host_and_say_why(nvidia_host):
    with pytest.raises(SubjectUnavailable, match="upstream's gfx942 indexer-K writer stores its codes as FNUZ fp8, "
                                                 "which does not exist on NVIDIA GPUs"):
        native_fnuz_unavailable(get_target("gfx942"), "indexer-K writer stores its codes")
    for name in ("gfx950", "generic"):  # OCP fp8: Triton on NVIDIA compiles it
        native_fnuz_unavailable(get_target(name), "anything")


@pytest.mark.parametrize("host", [("interpreter", "cpu"), ("native", "rocm")])
def test_fnuz_rows_run_under_the_interpreter_and_on_amd(monkeypatch, host):
    mode, kind = host
    monkeypatch.setattr(adapters, "triton_mode", lambda: mode)
    monkeypatch.setattr(adapters, "detect_device", lambda: runtime.DeviceInfo(kind, "x", "gfx942"))
    native_fnuz_unavailable(get_target("gfx942"), "anything")


def test_the_poisoned_workspace_hands_out_buffers_on_the_callers_device():
    ws = _PoisonedWorkspace()
    ws.device = torch.device("meta")
    (a, b) = ws.get_simultaneous(((3, 4), torch.float32), ((2,), torch.int32))
    assert a.device.type == b.device.type == "meta" and a.shape == (3, 4) and b.dtype == torch.int32
    ws.device = "cpu"
    (c,) = ws.get_simultaneous(((2, 2), torch.float32))
    assert torch.isnan(c).all()


def test_the_indexer_adapters_refuse_their_fnuz_triton_paths_on_an_nvidia_host(vllm_subject, nvidia_host):
    fam = vllm_subject.bind("gfx942").indexer_logits
    case = IndexerLogitsCase(seed=5, mode="decode", heads=4, topk=3, next_n=1, block_size=64, layout="normal",
                             context_lens=(20, 3), max_model_len=64)
    inp = build_decode_inputs(case, "fnuz", "cpu")
    args = (inp.q, inp.cache, inp.weights, inp.context_lens, inp.block_table, 64)
    with pytest.raises(SubjectUnavailable, match="gfx942 paged-logits Triton kernel"):
        fam.fp8_paged_mqa_logits(*args, layout="normal")  # C4A at block size 64: the dispatcher's Triton path
    with pytest.raises(SubjectUnavailable, match="gfx942 paged-logits Triton kernel"):
        fam.fp8_paged_mqa_logits_triton(*args)
    # the torch reference (a SHUFFLE cache) has no FNUZ kernel: it still runs
    out = fam.fp8_paged_mqa_logits(*args, layout="shuffle")
    assert out.shape == (2, 64)
    writer = vllm_subject.bind("gfx942").indexer_writer
    k = torch.randn(2, 128, dtype=torch.bfloat16)
    cache = torch.zeros(4, 1, 132, dtype=torch.uint8)
    with pytest.raises(SubjectUnavailable, match="gfx942 indexer-K writer"):
        writer.indexer_k_quant_and_cache(k, cache, torch.tensor([0, 1]))
