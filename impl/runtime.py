"""Device discovery and the Triton execution mode (native or interpreter).

Kept free of Triton imports: it must run before Triton is first imported, because Triton reads
``TRITON_INTERPRET`` when a kernel is first launched and caches decisions per process.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" | "cuda" | "rocm"
    name: str
    arch: str  # "gfx942", "gfx950", "sm_90", "cpu", ...

    def as_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "arch": self.arch}


_DEVICE: DeviceInfo | None = None


def detect_device() -> DeviceInfo:
    """The accelerator torch sees: ROCm by ``gcnArchName``, NVIDIA by compute capability, else the CPU."""
    global _DEVICE
    if _DEVICE is not None:
        return _DEVICE
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        if getattr(torch.version, "hip", None):
            arch = str(getattr(props, "gcnArchName", "unknown")).split(":")[0]
            _DEVICE = DeviceInfo("rocm", props.name, arch)
        else:
            _DEVICE = DeviceInfo("cuda", props.name, f"sm_{props.major}{props.minor}")
    else:
        _DEVICE = DeviceInfo("cpu", "cpu", "cpu")
    return _DEVICE


def configure_triton_mode() -> None:
    """Turn the Triton interpreter on when nothing can run kernels natively.

    An explicit ``TRITON_INTERPRET`` (0 or 1) always wins. Otherwise: a visible GPU -> native, none -> interpreter.
    """
    if "TRITON_INTERPRET" in os.environ:
        return
    if "triton" in sys.modules:
        # Too late to switch modes reliably; leave Triton as it is and let triton_mode() report it.
        return
    if detect_device().kind == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"


def triton_mode() -> str:
    return "interpreter" if os.environ.get("TRITON_INTERPRET", "0") == "1" else "native"


def kernel_device() -> str:
    """Where kernel inputs must live: 'cuda' when Triton compiles natively, 'cpu' under the interpreter."""
    return "cpu" if triton_mode() == "interpreter" else "cuda"
