"""Under the interpreter a launch option a native compiler refuses still fails: a warp count that is not a power of
two (NVIDIA's and AMD's compilers both refuse it; the interpreter would otherwise ignore it, so a mutant or a build
setting it passed every contract here and failed every launch on a GPU)."""
import time

import pytest
import torch

import impl  # noqa: F401 - chooses Triton's mode before triton is imported
from contracts.engine import specializations
from impl.runtime import kernel_device, triton_mode


def test_a_warp_count_that_is_not_a_power_of_two_fails_the_launch():
    if triton_mode() != "interpreter":
        pytest.skip("natively the compiler itself refuses it")
    import triton
    import triton.language as tl

    @triton.jit
    def copy(src, dst, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(dst + i, tl.load(src + i))

    src = torch.arange(8, dtype=torch.float32, device=kernel_device())
    dst = torch.zeros_like(src)
    start = time.monotonic()
    specializations.begin()
    try:
        copy[(1,)](src, dst, N=8, num_warps=4)
        assert torch.equal(dst, src)
        with pytest.raises(AssertionError, match="num_warps must be a power of 2, got 5"):
            copy[(1,)](src, dst, N=8, num_warps=5)
    finally:
        specializations.end(start)
        specializations.drain(start)
