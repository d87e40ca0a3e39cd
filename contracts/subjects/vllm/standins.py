"""Stand-ins for the parts of vLLM the audited modules import but the audit does not exercise.

Loading upstream's ROCm modules with their real imports would pull in about 300 modules and 40 packages. The loader
instead serves, for every ``vllm.*`` module that is not one of the audited ones (:data:`NEEDED`), either a small
documented stand-in below (the ones whose values the code under audit really reads: the platform and its arch flags,
the fp8 dtype, the logger, the environment flags, Triton) or an *inert* module: any attribute of it is a
placeholder that can be subclassed, subscripted and used as a decorator (it returns what it decorates), and that
raises :class:`StandInCalled`, naming itself, when code under audit actually calls it. A row that reaches one is thus
never silently judged against a fake; it fails loudly with the name of what it needed.
"""
from __future__ import annotations

import contextvars
import logging
import types

import torch


class StandInCalled(RuntimeError):
    """Audited code called a vLLM facility the loader does not provide."""


#: True while the loader executes module bodies: there a call to a placeholder (a decorator factory, a config
#: constant built at import) gives another placeholder; once loaded, a call raises :class:`StandInCalled`
IMPORTING: contextvars.ContextVar = contextvars.ContextVar("smv_standin_importing", default=False)


class _InertMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item):
        return cls

    def __call__(cls, *args, **kwargs):
        # used as a bare decorator (@eager_break_during_capture): return what it decorates
        if len(args) == 1 and not kwargs and (callable(args[0]) or isinstance(args[0], type)):
            return args[0]
        if IMPORTING.get():
            return _inert(f"{cls.__qualname__}()")
        raise StandInCalled(f"{cls.__qualname__} was called, but the audit loads only a stand-in for it")

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __bool__(cls):
        return False

    def __iter__(cls):
        return iter(())


def _inert(qualname: str) -> type:
    return _InertMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "__module__": "smv.standin"})


class InertModule(types.ModuleType):
    """A module whose every attribute is an inert placeholder (see the module docstring)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _inert(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class Platform:
    """``vllm.platforms.current_platform`` as the audited code reads it: ROCm, the target's fp8 dtype."""

    def __init__(self, arch: str, fp8_dtype: torch.dtype, cu_count: int):
        self.arch = arch
        self._fp8 = fp8_dtype
        self._cu = cu_count
        self.device_type = "cuda"
        self.device_name = "cuda"
        self.dispatch_key = "CUDA"

    def is_rocm(self):
        return True

    def is_cuda(self):
        return False

    def is_cuda_alike(self):
        return True

    def is_cpu(self):
        return False

    def is_xpu(self):
        return False

    def fp8_dtype(self):
        return self._fp8

    def is_fp8_fnuz(self):
        return self._fp8 == torch.float8_e4m3fnuz

    def get_device_name(self, device_id=0):
        return {"gfx942": "AMD Instinct MI300X", "gfx950": "AMD Instinct MI355X"}.get(self.arch, "generic")

    def get_cu_count(self, device_id=0):
        return self._cu

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(f"current_platform.{name}")


class _Logger(logging.LoggerAdapter):
    def __init__(self, name):
        super().__init__(logging.getLogger(f"smv.subject.{name}"), {})

    def info_once(self, msg, *a, **k):
        self.debug(msg, *a)

    warning_once = debug_once = info_once


def _envs_module(flags: dict) -> types.ModuleType:
    m = types.ModuleType("vllm.envs")
    m.__dict__.update(flags)

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        # every VLLM_* flag the audited code reads and we do not set is off / unset
        return False if name.startswith("VLLM_") else _inert(f"vllm.envs.{name}")

    m.__getattr__ = __getattr__
    return m


def _direct_register_custom_op(op_name, op_func, mutates_args=None, fake_impl=None, **kw):
    """Upstream registers its host wrappers as torch custom ops; the audit calls them as plain functions."""
    return None


def build(arch: str, fp8_dtype: torch.dtype, cu_count: int, env_flags: dict | None = None) -> dict:
    """The stand-in modules for one emulated architecture: ``{module name: module}``."""
    import triton
    import triton.language as tl

    mods: dict = {}

    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        mods[name] = m
        return m

    platform = Platform(arch, fp8_dtype, cu_count)
    mod("vllm.platforms", current_platform=platform)
    mod("vllm.platforms.rocm", _ON_GFX942=arch == "gfx942", _ON_GFX950=arch == "gfx950",
        on_gfx942=lambda: arch == "gfx942", on_gfx950=lambda: arch == "gfx950",
        on_mi3xx=lambda: arch in ("gfx942", "gfx950"), on_gfx1250=lambda: False,
        on_gfx9=lambda: arch in ("gfx942", "gfx950"))
    mod("vllm.logger", init_logger=_Logger)
    mods["vllm.envs"] = _envs_module(env_flags or {})
    mod("vllm.triton_utils", tl=tl, triton=triton, HAS_TRITON=True)
    return mods


STANDIN_NAMES = ("vllm.platforms", "vllm.platforms.rocm", "vllm.logger", "vllm.envs", "vllm.triton_utils")
