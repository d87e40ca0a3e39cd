"""The indexer-K gather (impl/cp_gather.py): bad input refused before any launch with outputs and cache untouched,
the masks behind ``check_metadata=False``, and what each variant compiles: the specialization keys derived from the
kernels' JIT metadata agree with Triton's own binder here and with Triton's compiled variants on a GPU; legacy
compiles one variant per token count, gfx950 one for every token and batch count."""
from __future__ import annotations

import inspect

import pytest
import torch

from contracts import cp_gather as cc
from fuzz import cp_gather as fg
from fuzz.cp_gather import CompileOnceCase, CpGatherCase
from impl import cp_gather as ig
from impl.runtime import kernel_device, triton_mode
from impl.targets import get_target
from oracles import cp_gather as ocg

DEV = kernel_device()


def _inputs(**kw):
    base = dict(seed=5, layout="normal", block_size=3, num_blocks=3, seq_lens=(4, 2), table_width=2,
                table=((2, 0), (1, 1)), extra_tokens=1)
    return fg.build_gather_inputs(CpGatherCase(**{**base, **kw}), DEV)


def _args(inp):
    return [inp["k_cache"], inp["k_fp8"], inp["k_scale"], inp["block_table"], inp["cu_seqlen"], inp["token_to_seq"]]


BAD = [
    # (what to change, exception, message)
    (lambda a: a.__setitem__(3, a[3][:, :1]), ValueError, r"block_table: sequence 0 holds 4 tokens, which need 2"),
    (lambda a: a.__setitem__(4, a[4][:2]), ValueError, r"cu_seqlen: expected 3 entries"),
    (lambda a: a.__setitem__(5, a[5][:-1]), ValueError, r"token_to_seq: expected 7 entries"),
    (lambda a: a.__setitem__(1, a[1].float()), TypeError, r"k_fp8: expected dtype uint8, got float32"),
    (lambda a: a.__setitem__(2, a[2][:, :1]), ValueError, r"k_scale: expected shape \[7, 4\]"),
    (lambda a: a.__setitem__(1, a[1][:, :64]), ValueError, r"k_fp8: expected shape \[7, 128\]"),
    (lambda a: a.__setitem__(4, a[4].long()), TypeError, r"must share one index dtype"),
    (lambda a: a.__setitem__(3, a[3].float()), TypeError, r"block_table: expected dtype int32 or int64"),
    (lambda a: a.__setitem__(5, torch.zeros(7, dtype=torch.int32, device="meta")), ValueError, r"token_to_seq: "),
    (lambda a: a.__setitem__(4, torch.tensor([0, 4, 3], dtype=torch.int32, device=DEV)), ValueError,
     r"non-decreasing cu_seqlen"),
    (lambda a: a.__setitem__(4, torch.tensor([0, 4, 9], dtype=torch.int32, device=DEV)), ValueError,
     r"last entry 9 exceeds the 7 rows"),
    (lambda a: a.__setitem__(0, a[0][:, :, :128]), ValueError, r"k_cache: expected shape \[num_blocks, block_size"),
]


@pytest.mark.parametrize("i", range(len(BAD)))
def test_bad_input_is_refused_before_any_launch(i):
    change, exc, msg = BAD[i]
    inp = _inputs()
    args = _args(inp)
    change(args)
    before = [x.clone() if x.device.type != "meta" else None for x in args]
    kernel = ig.gather_kernel("gfx950")
    with cc.captured_launches(kernel) as cap, pytest.raises(exc, match=msg):
        ig.cp_gather_indexer_k_quant_cache(*args, layout="normal", target="gfx950")
    assert cap.launches == []
    for x, b in zip(args, before):
        if b is not None:
            assert torch.equal(x, b)


def test_bad_layouts_and_flags_are_refused():
    inp = _inputs()
    with pytest.raises(ValueError, match=r"layout: SHUFFLE \(the default for a block size other than 1\)"):
        ig.cp_gather_indexer_k_quant_cache(*_args(inp), target="generic")
    with pytest.raises(ValueError, match="layout: expected None, 'normal' or 'shuffle', got 'NORMAL'"):
        ig.cp_gather_indexer_k_quant_cache(*_args(inp), layout="NORMAL", target="generic")
    with pytest.raises(TypeError, match="check_metadata: expected a bool"):
        ig.cp_gather_indexer_k_quant_cache(*_args(inp), layout="normal", target="generic", check_metadata=1)


@pytest.mark.parametrize("target", ["generic", "gfx950"])
def test_without_host_checks_the_kernel_masks_what_the_host_would_refuse(target):
    case = CpGatherCase(seed=8, layout="normal", block_size=2, num_blocks=3, seq_lens=(5, 3), table_width=1,
                        table=((2,), (0,)), token_to_seq_edits=((6, -1),))
    inp = fg.build_gather_inputs(case, DEV)
    before = inp["k_fp8"].cpu().clone(), inp["k_scale"].cpu().clone()
    with pytest.raises(ValueError, match="block_table: sequence 0 holds 5 tokens"):
        ig.cp_gather_indexer_k_quant_cache(*_args(inp), layout="normal", target=target)
    ig.cp_gather_indexer_k_quant_cache(*_args(inp), layout="normal", target=target, check_metadata=False)
    want_f, want_s = ocg.ref_cp_gather(inp["k_cache"].cpu(), *before, case.table, case.cu_seqlen,
                                       case.token_to_seq, "normal")
    assert torch.equal(inp["k_fp8"].cpu(), want_f) and torch.equal(inp["k_scale"].cpu(), want_s)
    # tokens 2..4 of sequence 0 have no table column: zero scale, fp8 row kept; token 6 is invalid: both kept
    assert inp["k_scale"].cpu()[2:5].eq(0).all() and torch.equal(inp["k_fp8"].cpu()[2:5], before[0][2:5])
    assert torch.equal(inp["k_scale"].cpu()[6], before[1][6])


def test_no_tokens_launches_nothing():
    k_cache = torch.zeros(2, 1, 132, dtype=torch.uint8, device=DEV)
    e = torch.zeros(0, dtype=torch.int32, device=DEV)
    with cc.captured_launches(ig.gather_kernel("gfx950")) as cap:
        ig.cp_gather_indexer_k_quant_cache(k_cache, torch.zeros(0, 128, dtype=torch.uint8, device=DEV),
                                           torch.zeros(0, 4, dtype=torch.uint8, device=DEV),
                                           torch.zeros(1, 1, dtype=torch.int32, device=DEV),
                                           torch.tensor([0, 0], dtype=torch.int32, device=DEV), e, target="gfx950")
    assert cap.launches == []


# --- what each variant compiles -----------------------------------------------------------------------------------

def _launch_series(case: CompileOnceCase, target: str):
    """Launch ``target``'s gather over the case's (T, B) pairs; the captured launches."""
    g = torch.Generator().manual_seed(case.seed)
    cache = fg.build_compile_cache(case, DEV, g)
    table = fg.build_persistent_table(case, DEV, g)
    kernel = ig.gather_kernel(target)
    with cc.captured_launches(kernel) as cap:
        for i in range(len(case.launches)):
            inp = fg.build_launch_inputs(case, i, DEV, g, table)
            ig.cp_gather_indexer_k_quant_cache(cache, inp["k_fp8"], inp["k_scale"], inp["block_table"],
                                               inp["cu_seqlen"], inp["token_to_seq"], layout=case.layout,
                                               target=target)
    assert len(cap.launches) == len(case.launches)
    return kernel, cap.launches


def _partition(labels) -> list[int]:
    first: dict = {}
    return [first.setdefault(x, len(first)) for x in labels]


SERIES = CompileOnceCase(seed=4, layout="shuffle", block_size=16, num_blocks=2, table_width=3,
                         launches=((1, 1), (2, 16), (16, 2), (17, 3), (32, 5), (5, 4), (48, 16)))


def test_legacy_compiles_one_variant_per_token_count_and_gfx950_one_in_all():
    _, legacy = _launch_series(SERIES, "generic")
    tokens = [T for T, _ in SERIES.launches]
    assert len({launch.key for launch in legacy}) == len(set(tokens)) == 7
    assert _partition(launch.key for launch in legacy) == _partition(tokens)
    _, gfx950 = _launch_series(SERIES, "gfx950")
    assert len({launch.key for launch in gfx950}) == 1
    # rows of one persistent table, 28 bytes further each launch: still one
    _, sliced = _launch_series(fg.compile_once_examples()[1], "gfx950")
    assert len({launch.key for launch in sliced}) == 1
    assert cc.compile_once(fg.compile_once_examples()[0], get_target("gfx950")) == []
    # the contract's check, handed the legacy variant, names the token count as the specialized parameter
    (v,) = cc.compile_once(fg.compile_once_examples()[0], get_target("generic"))
    assert "6 compilations for one geometry" in v.message and "NUM_TOKENS" in v.where


def _triton_binder_keys(kernel, launches) -> list[str]:
    """Triton's own specialization of each launch (its binder, run on the host: no device needed)."""
    from triton.backends import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(inspect.signature(kernel.fn), cc.kernel_params(kernel), BaseBackend)
    return [str(binder(*launch.args, **launch.kwargs)[1:]) for launch in launches]


@pytest.mark.parametrize("target", ["generic", "gfx950"])
def test_derived_keys_agree_with_tritons_binder_parameter_by_parameter(target):
    from triton.backends import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    kernel, launches = _launch_series(SERIES, target)
    binder = create_function_from_signature(inspect.signature(kernel.fn), cc.kernel_params(kernel), BaseBackend)
    for launch in launches:
        _, spec, _ = binder(*launch.args, **launch.kwargs)
        assert [tuple(s) for s in spec] == [v for _, v in launch.key[:-1]]
    assert _partition(_triton_binder_keys(kernel, launches)) == _partition(launch.key for launch in launches)


def test_specialize_value_follows_tritons_rules():
    from triton._C.libtriton import native_specialize_impl
    from triton.backends import BaseBackend
    from triton.runtime.jit import KernelParam

    def p(dns, dnsa):
        return KernelParam(0, inspect.Parameter("x", inspect.Parameter.POSITIONAL_OR_KEYWORD), dns, dnsa)

    buf = torch.empty(64, dtype=torch.uint8)
    values = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 63, True, False, 1.5, None,
              buf, buf[1:], buf[16:], buf.view(torch.int32), buf.view(torch.float8_e4m3fn),
              buf.view(torch.float8_e4m3fnuz), buf.view(torch.bfloat16), buf.view(torch.int64)]
    for v in values:
        for dns in (False, True):
            for dnsa in (False, True):
                want = native_specialize_impl(BaseBackend, v, False, not dns, not dnsa)
                assert cc.specialize_value(v, p(dns, dnsa)) == tuple(want), (v, dns, dnsa)


def check_native_variants_agree(native: bool) -> None:
    """On a GPU: the compiled kernels Triton returns for the series partition the launches as the derived keys
    do, and the kernel cache grows by at most that many variants. The CPU twin takes Triton's host binder as the
    native side."""
    for target in ("generic", "gfx950"):
        kernel = ig.gather_kernel(target)
        before = cc.native_variants(kernel)
        _, launches = _launch_series(SERIES, target)
        derived = _partition(launch.key for launch in launches)
        if native:
            assert all(launch.compiled is not None for launch in launches)
            compiled = _partition(id(launch.compiled) for launch in launches)
            assert cc.native_variants(kernel) - before <= len(set(compiled))
        else:
            compiled = _partition(_triton_binder_keys(kernel, launches))
        assert compiled == derived, target
        assert len(set(derived)) == (1 if target == "gfx950" else 7)


@pytest.mark.gpu
def test_derived_keys_agree_with_tritons_compiled_variants():
    if triton_mode() != "native":
        pytest.skip("needs Triton compiling natively on a GPU; it runs in the interpreter here")
    check_native_variants_agree(native=True)


def test_derived_keys_agree_with_tritons_compiled_variants_twin():
    if triton_mode() == "native":
        pytest.skip("the native test runs here")
    check_native_variants_agree(native=False)


def test_capture_puts_the_kernel_back():
    kernel = ig.gather_kernel("gfx950")
    assert "run" not in vars(kernel)
    with cc.captured_launches(kernel):
        assert "run" in vars(kernel)
    assert "run" not in vars(kernel)
