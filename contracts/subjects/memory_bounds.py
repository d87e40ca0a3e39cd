"""The interpreter's memory bound: every load and store of a kernel stays inside the tensors handed to its launch.
Used by the vllm ragged adapter (upstream's kernels, whose addresses it predicts) and by contracts whose kernels
mask lanes they must not touch (an unmasked read past a buffer is invisible in the values)."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from impl.runtime import triton_mode


class OutOfBoundsAccess(RuntimeError):
    """Under the interpreter, a kernel's load or store left the tensors handed to its launch where none was
    expected (an unmasked lane, a planted bug, upstream changed): stopped before the access."""


@contextlib.contextmanager
def bounded_memory():
    """Under the interpreter: every masked-on lane of every load and store of a kernel launched in the block must
    lie inside the storage of one of that launch's tensor arguments; else :class:`OutOfBoundsAccess` (raised before
    the access). Natively: nothing (the address checks before each launch are the guard)."""
    if triton_mode() != "interpreter":
        yield
        return
    import triton.runtime.interpreter as it

    ranges: list = []
    orig_call, orig_load, orig_store = (it.GridExecutor.__call__, it.InterpreterBuilder.create_masked_load,
                                        it.InterpreterBuilder.create_masked_store)

    def call(self, *args, **kwargs):
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor) and a.numel()]
        ranges.append([(t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() +
                        t.untyped_storage().nbytes()) for t in tensors])
        try:
            return orig_call(self, *args, **kwargs)
        except it.InterpreterError as exc:
            if isinstance(exc.__cause__, OutOfBoundsAccess):
                raise exc.__cause__ from None
            raise
        finally:
            ranges.pop()

    def check(ptrs, mask, what):
        if not ranges:
            return
        addr = np.broadcast_to(ptrs.data, np.broadcast_shapes(ptrs.data.shape, mask.data.shape)).astype(np.uint64)
        on = np.broadcast_to(mask.data, addr.shape).astype(bool)
        size = np.uint64(max(ptrs.get_element_ty().primitive_bitwidth // 8, 1))
        inside = np.zeros(addr.shape, dtype=bool)
        for lo, hi in ranges[-1]:
            inside |= (addr >= np.uint64(lo)) & (addr + size <= np.uint64(hi))
        bad = on & ~inside
        if bad.any():
            raise OutOfBoundsAccess(f"a kernel {what}s address {int(addr[bad].flat[0]):#x}, outside every tensor "
                                  f"handed to its launch")

    def load(self, ptrs, mask, other, cache_policy, is_volatile):
        check(ptrs, mask, "load")
        return orig_load(self, ptrs, mask, other, cache_policy, is_volatile)

    def store(self, ptrs, value, mask, cache_policy):
        check(ptrs, mask, "store")
        return orig_store(self, ptrs, value, mask, cache_policy)

    it.GridExecutor.__call__, it.InterpreterBuilder.create_masked_load = call, load
    it.InterpreterBuilder.create_masked_store = store
    try:
        yield
    finally:
        it.GridExecutor.__call__, it.InterpreterBuilder.create_masked_load = orig_call, orig_load
        it.InterpreterBuilder.create_masked_store = orig_store
