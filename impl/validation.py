"""Argument checks shared by every public entry point: errors name the argument, what was expected and what was
given, and are raised before anything is launched or written."""
from __future__ import annotations

import torch

from impl.runtime import kernel_device, native_without_gpu_hint


def dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def require_tensor(name: str, t, dtypes, dim: int | None = None, device=None) -> None:
    """``t`` is a tensor of one of ``dtypes`` (a dtype or a tuple), with ``dim`` dimensions and on ``device`` when
    those are given."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    allowed = dtypes if isinstance(dtypes, tuple) else (dtypes,)
    if t.dtype not in allowed:
        raise TypeError(f"{name}: expected dtype {' or '.join(dtype_name(d) for d in allowed)}, "
                        f"got {dtype_name(t.dtype)}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name}: expected a {dim}-D tensor, got shape {list(t.shape)}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name}: expected device {device}, got {t.device}")


def require_kernel_device(name: str, t: torch.Tensor) -> None:
    """Kernel inputs live where Triton runs: the GPU natively, the CPU under the interpreter."""
    want = kernel_device()
    if t.device.type != want:
        raise ValueError(f"{name}: kernels run on '{want}' here, got a tensor on {t.device}"
                         f"{native_without_gpu_hint()}")


def require_valid_indptr(indptr_name: str, indptr: torch.Tensor, indices_name: str, indices_numel: int, *,
                         starts_at_zero: bool = False, max_row: int | None = None,
                         max_row_name: str = "max_per_row") -> None:
    """Host check (one device->host copy) that a ragged indptr starts at >= 0 (or exactly 0), never decreases,
    holds at most ``max_row`` entries per row when given, and ends within its indices. Callers inside a graph
    capture must skip it: it syncs."""
    ip = indptr.to("cpu", torch.int64)
    if starts_at_zero and int(ip[0]) != 0:
        raise ValueError(f"{indptr_name}: expected indptr[0] == 0, got {int(ip[0])}")
    if int(ip[0]) < 0:
        raise ValueError(f"{indptr_name}: expected indptr[0] >= 0, got {int(ip[0])}")
    steps = ip[1:] - ip[:-1]
    if bool((steps < 0).any()):
        r = int((steps < 0).nonzero()[0])
        raise ValueError(f"{indptr_name}: expected a non-decreasing indptr, got indptr[{r}] = {int(ip[r])} > "
                         f"indptr[{r + 1}] = {int(ip[r + 1])}")
    if max_row is not None and bool((steps > max_row).any()):
        r = int((steps > max_row).nonzero()[0])
        raise ValueError(f"{indptr_name}: row {r} holds {int(steps[r])} entries, more than {max_row_name} = "
                         f"{max_row}")
    if int(ip[-1]) > indices_numel:
        raise ValueError(f"{indptr_name}: indptr[-1] = {int(ip[-1])} exceeds {indices_name}.numel() = "
                         f"{indices_numel}")
