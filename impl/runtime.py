"""Device discovery and the Triton execution mode (native or interpreter).

Kept free of Triton imports: it must run before Triton is first imported, because Triton reads
``TRITON_INTERPRET`` when a kernel is first launched and caches decisions per process.
"""
from __future__ import annotations

import os
import sys
import warnings
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
        import platform

        _DEVICE = DeviceInfo("cpu", _cpu_name(), platform.machine() or "cpu")
    return _DEVICE


def _cpu_name() -> str:
    """The processor's model name (Linux /proc/cpuinfo, else what ``platform`` knows), so a report says which CPU
    produced its timings."""
    import platform

    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


class TritonModeWarning(RuntimeWarning):
    """Triton was imported before ``impl`` on a machine with no GPU."""


#: how to get the interpreter when Triton must not run natively
TRITON_MODE_FIX = "import impl before triton, or set TRITON_INTERPRET=1 before starting Python"
#: Triton's own reading of TRITON_INTERPRET (anything else, "0" and "" included, is false)
_TRUE = ("1", "true", "on", "yes", "y")
#: why Triton was left native with no GPU visible, when impl could not switch it (named by the kernel-device errors)
_NATIVE_WITHOUT_GPU: str | None = None


def _triton_follows_env_now() -> bool:
    """Whether the Triton already imported still reads TRITON_INTERPRET when a kernel is decorated. Triton with
    ``knobs`` reads it through ``knobs.runtime.interpret`` (re-read from the environment unless set in code);
    older Triton reads the variable inside ``@triton.jit`` itself."""
    runtime = getattr(getattr(sys.modules.get("triton"), "knobs", None), "runtime", None)
    if runtime is None:
        return True
    try:
        return bool(runtime.interpret)
    except Exception:  # an unexpected knobs layout: trust the variable, as older Triton does
        return True


def configure_triton_mode() -> None:
    """Turn the Triton interpreter on when nothing can run kernels natively.

    An explicit ``TRITON_INTERPRET`` (0 or 1) always wins. Otherwise: a visible GPU -> native, none -> interpreter.
    Triton chooses native or interpreted per kernel, when ``@triton.jit`` decorates it, and ``impl``'s kernels are
    decorated only after this runs: so even when Triton was imported first, setting the variable here still
    reaches every kernel of ours. What it cannot reach (kernels decorated before ``import impl``, or a Triton that
    froze the setting at import) is said in a :class:`TritonModeWarning` and in the kernel-device errors.
    """
    global _NATIVE_WITHOUT_GPU
    if "TRITON_INTERPRET" in os.environ:
        return
    if detect_device().kind != "cpu":
        return
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" not in sys.modules:
        return
    if _triton_follows_env_now():
        warnings.warn(
            "triton was imported before impl with no GPU visible and TRITON_INTERPRET unset: impl switched the "
            "Triton interpreter on for its own kernels, but any kernel decorated before `import impl` stays native "
            f"and cannot run here ({TRITON_MODE_FIX})", TritonModeWarning, stacklevel=3)
        return
    del os.environ["TRITON_INTERPRET"]
    _NATIVE_WITHOUT_GPU = "triton was imported before impl and fixed its mode at import"
    warnings.warn(
        f"{_NATIVE_WITHOUT_GPU}, with no GPU visible: Triton stays native and no kernel can run here "
        f"({TRITON_MODE_FIX})", TritonModeWarning, stacklevel=3)


def triton_mode() -> str:
    return "interpreter" if os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE else "native"


def native_without_gpu_hint() -> str:
    """Why kernel inputs are wanted on 'cuda' although no GPU is visible, for the kernel-device errors ('' when
    Triton's mode fits the machine)."""
    if triton_mode() != "native" or detect_device().kind != "cpu":
        return ""
    if _NATIVE_WITHOUT_GPU:
        why = _NATIVE_WITHOUT_GPU
    elif "TRITON_INTERPRET" in os.environ:
        why = f"TRITON_INTERPRET={os.environ['TRITON_INTERPRET']!r} is set"
    else:
        why = "impl did not choose the mode (was triton imported first?)"
    return f" (Triton runs natively but no GPU is visible: {why}; {TRITON_MODE_FIX})"


def kernel_device() -> str:
    """Where kernel inputs must live: 'cuda' when Triton compiles natively, 'cpu' under the interpreter."""
    return "cpu" if triton_mode() == "interpreter" else "cuda"
