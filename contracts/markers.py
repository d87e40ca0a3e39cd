"""Hardware markers: what each needs, and whether this machine has it. Shared by the pytest plugin and
``smv targets`` so both always tell the same story."""
from __future__ import annotations

from impl.runtime import DeviceInfo, detect_device

MARKERS = {
    "gpu": "needs a real GPU (CUDA or ROCm)",
    "cuda": "needs an NVIDIA GPU with CUDA",
    "rocm": "needs an AMD GPU with ROCm",
    "gfx942": "needs a real gfx942 (MI300X) GPU",
    "gfx950": "needs a real gfx950 (MI355X) GPU",
    "slow": "nightly only: runs with --run-slow",
}
HARDWARE_MARKERS = ("gpu", "cuda", "rocm", "gfx942", "gfx950")


def _found(dev: DeviceInfo) -> str:
    if dev.kind == "cpu":
        return "found no GPU (CPU only; Triton runs in the interpreter)"
    return f"found {dev.kind} device {dev.name!r} ({dev.arch})"


def marker_status(marker: str, dev: DeviceInfo | None = None, run_slow: bool = False) -> tuple[bool, str]:
    """(runs here, reason) for one marker; the reason names what was needed and what was found."""
    dev = dev or detect_device()
    if marker == "slow":
        return (True, "--run-slow given") if run_slow else (False, "slow test: pass --run-slow (nightly) to run it")
    if marker == "gpu":
        ok = dev.kind in ("cuda", "rocm")
    elif marker == "cuda":
        ok = dev.kind == "cuda"
    elif marker == "rocm":
        ok = dev.kind == "rocm"
    elif marker in ("gfx942", "gfx950"):
        ok = dev.kind == "rocm" and dev.arch.startswith(marker)
    else:
        raise ValueError(f"unknown marker {marker!r}")
    need = MARKERS[marker]
    return ok, (f"{need}: {_found(dev)}" if not ok else f"{_found(dev)}")
