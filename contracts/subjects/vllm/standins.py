"""Stand-ins for the parts of vLLM the audited modules import but the audit does not exercise.

Loading upstream's ROCm modules with their real imports would pull in about 300 modules and 40 packages. The loader
instead serves, for every ``vllm.*`` module that is not one of the audited ones (``loader.NEEDED``), either one of
the small documented stand-ins built by :func:`build` (the ones whose values the code under audit really reads) or
an *inert* module.

The stand-ins, per emulated architecture (``gfx942``, ``gfx950``; any other name has neither arch flag):

- ``vllm.platforms``: ``current_platform``, a :class:`Platform` that is ROCm with the target's fp8 dtype and CU
  count; any other attribute of it is an inert placeholder.
- ``vllm.platforms.rocm``: the three families of names upstream keeps growing there, each answered from the
  target by a rule (:func:`platform_answer`), never from a list of names: arch flags ``_ON_<X>`` bound at import,
  probes ``on_<x>()``, and ``get_<family>_version()``. ``<x>`` is a gfx name or prefix (``gfx942``, ``gfx9``,
  ``gfx12x``: an ``x`` is any digit), an Instinct model (``mi300``, ``mi3xx``), or an ISA family (``cdna``,
  ``cdna3``, ``rdna``, ``navi``, ``radeon``). A name no rule answers is an inert placeholder: permissive while the
  module body runs, and a :class:`StandInCalled` naming it once a row reaches it. Every name served, and what it
  answered on each target, is recorded (:func:`served`) and listed in the report.
- ``vllm.logger``: ``init_logger`` giving a logger under ``smv.subject.*`` (``*_once`` variants log at debug).
- ``vllm.envs``: every ``VLLM_*`` flag is unset and reads False (none of the audited paths is switched on by one);
  ``is_set(name)`` is False.
- ``vllm.triton_utils``: the real ``triton`` and ``triton.language`` (``HAS_TRITON`` True).
- ``vllm.utils.torch_utils``: ``direct_register_custom_op`` registers nothing (upstream registers its host
  wrappers as torch custom ops; the audit calls them as plain functions); the rest is inert.
- ``vllm.utils.math_utils``: ``cdiv`` and ``round_up`` (integer ceiling division and rounding up to a multiple,
  which host code computes sizes with); the rest is inert.

An inert module's every attribute is a *placeholder* class. While the loader executes module bodies
(:data:`IMPORTING`) a placeholder may be subclassed, subscripted (``X[T]``), or-ed into a type union, used as a
decorator (it returns what it decorates) or called (a decorator factory, a constant built at import: the result is
another placeholder), and reads as false. Once loaded, calling a placeholder, testing its truth or iterating it
raises :class:`StandInCalled` naming it: a row that reaches one is never silently judged against a fake but ends
loudly with the name of what it needed. A class upstream derives from a placeholder is upstream's own and is
instantiated normally; only its stand-in base's ``__init__`` raises (after import) when reached.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import types


from contracts.subjects.base import SubjectError


class StandInCalled(SubjectError):
    """Audited code called a vLLM facility the loader does not provide."""


#: True while the loader executes module bodies (set in the loading thread's context only, and reset after): there
#: placeholders are permissive (see the module docstring); everywhere else they raise :class:`StandInCalled`
IMPORTING: contextvars.ContextVar = contextvars.ContextVar("smv_standin_importing", default=False)

_PLACEHOLDER = "_smv_placeholder"


def _refuse(what: str):
    raise StandInCalled(f"{what}, but the audit loads only a stand-in for it (vLLM facility not provided)")


def _placeholder_init(self, *args, **kwargs):
    if not IMPORTING.get():
        base = next((c for c in type(self).__mro__ if c.__dict__.get(_PLACEHOLDER)), type(self))
        _refuse(f"{type(self).__qualname__}.__init__ reached its base {base.__qualname__}.__init__")


class _InertMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item):
        return cls

    def __call__(cls, *args, **kwargs):
        if not cls.__dict__.get(_PLACEHOLDER):
            return super().__call__(*args, **kwargs)  # upstream's own class derived from a placeholder
        if not IMPORTING.get():
            _refuse(f"{cls.__qualname__} was called")
        # a bare decorator (@eager_break_during_capture): what it decorates, unchanged
        if len(args) == 1 and not kwargs and (callable(args[0]) or isinstance(args[0], type)):
            return args[0]
        return _inert(f"{cls.__qualname__}()")

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __bool__(cls):
        if cls.__dict__.get(_PLACEHOLDER) and not IMPORTING.get():
            _refuse(f"{cls.__qualname__} was tested for truth")
        return not cls.__dict__.get(_PLACEHOLDER)

    def __iter__(cls):
        if not IMPORTING.get():
            _refuse(f"{cls.__qualname__} was iterated")
        return iter(())


def _inert(qualname: str) -> type:
    return _InertMeta(qualname.rsplit(".", 1)[-1], (), {
        "__qualname__": qualname, "__module__": "smv.standin", _PLACEHOLDER: True, "__init__": _placeholder_init})


def is_placeholder(obj) -> bool:
    """Whether ``obj`` is an inert placeholder (not upstream's own class derived from one)."""
    return isinstance(obj, _InertMeta) and bool(obj.__dict__.get(_PLACEHOLDER))


class InertModule(types.ModuleType):
    """A module whose every attribute not set on it is an inert placeholder (see the module docstring)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        import sys

        # ``from vllm import envs``: a submodule already served (a stand-in) wins over a placeholder
        value = sys.modules.get(f"{self.__name__}.{name}")
        if value is None:
            value = _inert(f"{self.__name__}.{name}")
            record(self.__name__, name, "inert placeholder")
        setattr(self, name, value)
        return value


_DEVICE_NAMES = {"gfx942": "AMD Instinct MI300X", "gfx950": "AMD Instinct MI355X"}


class Platform:
    """``vllm.platforms.current_platform`` as the audited code reads it: ROCm, the target's fp8 dtype and CU
    count; any other attribute is an inert placeholder."""

    def __init__(self, arch: str, fp8_dtype, cu_count: int):
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
        import torch

        return self._fp8 == torch.float8_e4m3fnuz

    def get_device_name(self, device_id=0):
        return _DEVICE_NAMES.get(self.arch, "generic")

    def get_cu_count(self, device_id=0):
        return self._cu

    def num_compute_units(self, device_id=0):
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
        if name.startswith("VLLM_"):
            record("vllm.envs", name, f"{name} = False (unset)")
            return False
        record("vllm.envs", name, "inert placeholder")
        return _inert(f"vllm.envs.{name}")

    def is_set(name):
        return name in flags

    m.__getattr__ = __getattr__
    m.is_set = is_set
    return m


def _direct_register_custom_op(op_name, op_func, mutates_args=None, fake_impl=None, **kw):
    """Upstream registers its host wrappers as torch custom ops; the audit calls them as plain functions."""
    return None


def _cdiv(a: int, b: int) -> int:
    """Ceiling of ``a / b`` for integers."""
    return -(a // -b)


def _round_up(x: int, multiple: int) -> int:
    """The least multiple of ``multiple`` that is >= ``x``."""
    return _cdiv(x, multiple) * multiple


#: what each emulated architecture is, for the rule below: its Instinct models and its ISA family and generation
_ARCH_FACTS = {
    "gfx942": {"models": ("mi300", "mi308", "mi325"), "isa": ("cdna", 3)},
    "gfx950": {"models": ("mi350", "mi355"), "isa": ("cdna", 4)},
}
#: ISA families a ROCm arch flag may name; the emulated targets are all CDNA
_ISA_FAMILIES = ("cdna", "rdna", "navi", "radeon")
_FLAG_RE = re.compile(r"^(?:_ON_|on_)([A-Za-z0-9]+)$")
_VERSION_RE = re.compile(r"^get_([a-z0-9]+)_version$")


def _pattern_match(pattern: str, name: str) -> bool:
    """``pattern`` is a prefix of ``name`` where each ``x`` of the pattern stands for any one character."""
    return len(pattern) <= len(name) and all(p in ("x", c) for p, c in zip(pattern, name))


def platform_answer(name: str, arch: str):
    """What the emulated device answers for a ``vllm.platforms.rocm`` name, or ``None`` where no rule knows it.

    ``_ON_<X>`` and ``on_<x>`` (a bool): ``gfx...`` is true when the pattern is a prefix of the target's gfx name
    (``gfx9``, ``gfx94``, ``gfx942``; ``x`` any digit, so ``gfx1x`` and ``gfx12x`` are false on CDNA); ``mi...``
    likewise against the target's Instinct models; ``cdna<N>``/``rdna<N>``/``navi``/``radeon`` against its ISA.
    ``get_<family>_version`` (an int): the target's generation of that ISA family, 0 when it is not one (what
    upstream's own fallback returns off ROCm). Any other architecture name (``generic``) is a device that is none
    of these: every flag false, every version 0."""
    facts = _ARCH_FACTS.get(arch)
    m = _VERSION_RE.match(name)
    if m:
        family = m.group(1)
        if family not in _ISA_FAMILIES:
            return None
        return facts["isa"][1] if facts and facts["isa"][0] == family else 0
    m = _FLAG_RE.match(name)
    if not m:
        return None
    token = m.group(1).lower()
    if token.startswith("gfx") and re.fullmatch(r"gfx[0-9a-fx]+", token):
        return bool(facts) and _pattern_match(token, arch)
    if re.fullmatch(r"mi[0-9x]+", token):
        return bool(facts) and any(_pattern_match(token, model) for model in facts["models"])
    family = next((f for f in _ISA_FAMILIES if token.startswith(f)), None)
    if family is not None and re.fullmatch(r"[0-9x]*", token[len(family):]):
        if not facts or facts["isa"][0] != family:
            return False
        gen = token[len(family):]
        return not gen or _pattern_match(gen, str(facts["isa"][1]))
    return None


class RocmModule(types.ModuleType):
    """``vllm.platforms.rocm`` for one emulated architecture: every name is answered by :func:`platform_answer`
    (a flag's bool, a probe returning it, a version getter), or is an inert placeholder where no rule knows it."""

    def __init__(self, name: str, arch: str):
        super().__init__(name)
        self._smv_arch = arch

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        answer = platform_answer(name, self._smv_arch)
        if answer is None:
            value = _inert(f"{self.__name__}.{name}")
            record(self.__name__, name, "not answered (inert: a row that reaches it is an error)")
        elif name.startswith(("get_", "on_")):  # a probe or a version getter: a function returning the answer
            value = _constant(name, answer)
            record(self.__name__, name, f"{name}() = {answer}")
        else:
            value = answer
            record(self.__name__, name, f"{name} = {answer}")
        setattr(self, name, value)
        return value


def _constant(name: str, value):
    def probe(*args, **kwargs):
        return value

    probe.__name__ = probe.__qualname__ = name
    return probe


#: what the stand-ins served while the current :func:`serving` block ran: ``{(module, name): what}``
_SERVED: contextvars.ContextVar = contextvars.ContextVar("smv_standin_served", default=None)


def record(module: str, name: str, what: str) -> None:
    """Note that a stand-in served ``module.name`` (answered as ``what``) to the import or a row."""
    served = _SERVED.get()
    if served is not None:
        served.setdefault((module, name), what)


@contextlib.contextmanager
def serving(into: dict):
    """Record into ``into`` every name the stand-ins serve while the block runs (see :func:`record`)."""
    token = _SERVED.set(into)
    try:
        yield into
    finally:
        _SERVED.reset(token)


def build(arch: str, fp8_dtype, cu_count: int, env_flags: dict | None = None) -> dict:
    """The stand-in modules for one emulated architecture: ``{module name: module}``, fresh objects per call."""
    import triton
    import triton.language as tl

    mods: dict = {}

    def mod(name, cls=types.ModuleType, **attrs):
        m = cls(name)
        m.__dict__.update(attrs)
        mods[name] = m
        return m

    mod("vllm.platforms", current_platform=Platform(arch, fp8_dtype, cu_count))
    mods["vllm.platforms.rocm"] = RocmModule("vllm.platforms.rocm", arch)
    mod("vllm.logger", init_logger=_Logger)
    mods["vllm.envs"] = _envs_module(env_flags or {})
    mod("vllm.triton_utils", tl=tl, triton=triton, HAS_TRITON=True)
    mod("vllm.utils.torch_utils", InertModule, direct_register_custom_op=_direct_register_custom_op)
    mod("vllm.utils.math_utils", InertModule, cdiv=_cdiv, round_up=_round_up)
    return mods


STANDIN_NAMES = ("vllm.platforms", "vllm.platforms.rocm", "vllm.logger", "vllm.envs", "vllm.triton_utils",
                 "vllm.utils.torch_utils", "vllm.utils.math_utils")
