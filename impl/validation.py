"""Argument checks shared by every public entry point: errors name the argument, what was expected and what was
given, and are raised before anything is launched or written."""
from __future__ import annotations

import torch

from impl.runtime import kernel_device


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
        raise ValueError(f"{name}: kernels run on '{want}' here, got a tensor on {t.device}")
