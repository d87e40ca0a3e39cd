"""How many distinct Triton specializations a row compiles (audit.json's per-row ``specializations``).

A native audit on a cold Triton cache spends most of its time compiling (an H200 audit: 126 s of 135 s), and a
kernel compiles once per *specialization key*, not once per launch. Triton 3.x forms the key from the launch's
arguments (``triton/runtime/jit.py``: ``create_function_from_signature`` and the backend's
``get_int_specialization`` / ``get_tensor_specialization``, through ``native_specialize_impl``):

* a ``tl.constexpr`` parameter: its value;
* ``None``: the constexpr None; a bool: ``u1``; a float: ``fp32`` (neither specialized further);
* an int: ``i32`` / ``i64`` / ``u64`` by range, and unless the parameter is in ``do_not_specialize``, the value 1
  becomes the constexpr 1 and a multiple of 16 gets the attribute ``D`` (``tt.divisibility`` 16); the alignment
  attribute is dropped under ``do_not_specialize_on_alignment``;
* a tensor: a pointer to its dtype (``*k`` for a const annotation), with ``D`` when ``data_ptr() % 16 == 0``
  unless the parameter is in ``do_not_specialize`` or ``do_not_specialize_on_alignment``;
* the launch options (``num_warps``, ``num_stages``, ...: keywords that are not parameters).

:func:`specialization_key` derives that key on the host from the kernel's own JIT metadata (Triton's
``KernelParam`` objects), so it works under the interpreter, where nothing compiles; the tests check it against
Triton's real binder. Per row, while a check runs (:class:`contracts.engine.timesplit.measuring` starts and stops the
recorder):

* **natively** the count is of what Triton compiled: its ``jit_cache_hook`` (installed by
  :mod:`contracts.engine.timesplit`) fires once per in-memory cache miss with the kernel and the key; a kernel an earlier
  row of the same process compiled is not compiled again, so a row counts the specializations that were new to
  the process (``run.specializations_source`` = ``"compiled"``);
* **under the interpreter** the count is *predicted*: every launch (``InterpretedFunction.run``) is keyed with
  :func:`specialization_key`, and a row counts its distinct keys per kernel: what the row alone would compile in a
  fresh process (``"predicted"``).

Kernel names are ``module.qualname`` of the ``@triton.jit`` function (``impl.decode._splitk_partial``).
"""
from __future__ import annotations

import inspect
import sys

#: torch dtype name -> Triton's canonical type name (a pointer is ``*`` + it)
_TRITON_TYPE = {
    "bool": "i1", "uint8": "u8", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint16": "u16",
    "uint32": "u32", "uint64": "u64", "float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
    "float8_e4m3fn": "fp8e4nv", "float8_e4m3fnuz": "fp8e4b8", "float8_e5m2": "fp8e5", "float8_e5m2fnuz": "fp8e5b16",
}


def kernel_params(kernel) -> list:
    """The kernel's parameters as Triton's own ``KernelParam`` objects: ``kernel.params`` of a ``JITFunction``; for
    the interpreter's ``InterpretedFunction`` (which keeps only the function and the ``@triton.jit`` keywords) the
    same objects built the way ``JITFunction.__init__`` builds them. Cached on the kernel object."""
    cached = getattr(kernel, "__smv_params__", None)
    if cached is not None:
        return cached
    from triton.runtime.jit import KernelParam

    params = getattr(kernel, "params", None)
    if params and all(isinstance(p, KernelParam) for p in params):
        out = list(params)
    else:
        fn = getattr(kernel, "fn", None)
        if fn is None:
            raise TypeError(f"kernel: expected a Triton JITFunction or InterpretedFunction, got "
                            f"{type(kernel).__name__}")
        kw = getattr(kernel, "kwargs", {}) or {}
        dns = list(kw.get("do_not_specialize") or [])
        dns_oa = list(kw.get("do_not_specialize_on_alignment") or [])
        out = [KernelParam(i, p, i in dns or p.name in dns, i in dns_oa or p.name in dns_oa)
               for i, p in enumerate(inspect.signature(fn).parameters.values())]
    try:
        kernel.__smv_params__ = out
    except AttributeError:  # pragma: no cover - a kernel object without a __dict__
        pass
    return out


def _int_type(v: int) -> str:
    if -2 ** 31 <= v < 2 ** 31:
        return "i32"
    if v >= 2 ** 63:
        return "u64"
    return "i64"


def _specialize(value, spec: bool, align: bool, is_const: bool, name: str) -> tuple:
    if value is None:
        return ("constexpr", None)
    if isinstance(value, bool):
        return ("u1", None)
    if isinstance(value, int):
        if spec and value == 1:
            return ("constexpr", 1)
        return (_int_type(value), ("D" if align and value % 16 == 0 else "") if spec else None)
    if isinstance(value, float):
        return ("fp32", None)
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        dt = str(value.dtype).removeprefix("torch.")
        ty = ("*k" if is_const else "*") + _TRITON_TYPE.get(dt, dt)
        return (ty, ("D" if align and value.data_ptr() % 16 == 0 else "") if spec else None)
    if isinstance(value, tuple):
        parts = [_specialize(v, spec, align, is_const, name) for v in value]
        return (tuple(p[0] for p in parts), tuple(p[1] for p in parts))
    if type(value).__name__ == "constexpr":
        return ("constexpr", value)
    if type(value).__name__ == "dtype":  # a tl.dtype passed as an argument is a constexpr
        return ("constexpr", value)
    raise TypeError(f"{name}: no specialization rule for a {type(value).__name__} argument")


def specialize_value(value, param) -> tuple:
    """Triton's specialization of one argument (the rules in the module docstring)."""
    if param.is_constexpr:
        return ("constexpr", value)
    spec = not param.do_not_specialize
    align = not param.do_not_specialize_on_alignment
    key = _specialize(value, spec, align, param.is_const, param.name)
    ann = param.annotation_type
    if ann:  # an annotated parameter keeps its type; an int 1 under it is (ann, 1), as Triton's binder writes it
        if ann == "u1" or ann[:2] in ("fp", "bf") or not spec:
            return (ann, None)
        return (ann,) + key[1:]
    return key


def _signature(kernel):
    sig = getattr(kernel, "__smv_signature__", None)
    if sig is None:
        sig = inspect.signature(kernel.fn)
        try:
            kernel.__smv_signature__ = sig
        except AttributeError:  # pragma: no cover
            pass
    return sig


def specialization_key(kernel, args: tuple, kwargs: dict) -> tuple:
    """The key a launch ``kernel[grid](*args, **kwargs)`` is compiled under: one (name, specialization) per
    parameter, then the launch options (keywords that are not parameters, e.g. ``num_warps``)."""
    params = kernel_params(kernel)
    names = {p.name for p in params}
    bound_args = _signature(kernel).bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound_args.apply_defaults()
    spec = tuple((p.name, specialize_value(bound_args.arguments[p.name], p)) for p in params)
    options = tuple(sorted((k, repr(v)) for k, v in kwargs.items() if k not in names))
    return spec + (("options", options),)


def kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}"


def key_differences(keys: list) -> str:
    """The parameters whose specialization differs between the distinct ``keys``, with each value seen."""
    first = dict(keys[0])
    seen: dict = {}
    for k in keys:
        for name, val in k:
            seen.setdefault(name, [])
            if val not in seen[name]:
                seen[name].append(val)
    diff = [f"{name}: {' / '.join(map(str, vals))}" for name, vals in seen.items() if len(vals) > 1]
    return "; ".join(diff) if diff else f"(keys differ outside the parameters: {sorted(first)})"


def varying_parameters(keys) -> dict:
    """``{parameter: number of distinct specializations}`` over ``keys`` (one kernel's), for the parameters that
    take more than one: the arguments that multiply the kernel's binaries."""
    seen: dict = {}
    for k in keys:
        for name, val in k:
            seen.setdefault(name, set()).add(repr(val))
    return {name: len(vals) for name, vals in seen.items() if len(vals) > 1}


# --- the per-row recorder -----------------------------------------------------------------------------------------

class Recorder:
    """The distinct (kernel, key) pairs seen while one check ran."""

    def __init__(self):
        self.keys: dict[str, dict] = {}  # kernel -> {repr(key): key}

    def add(self, kernel: str, key) -> None:
        self.keys.setdefault(kernel, {}).setdefault(repr(key), key)


_ACTIVE: Recorder | None = None
#: (monotonic start, recorder) of each check since the last drain
_CHECKS: list = []
#: every (kernel, key) recorded in this process, with its launch count, for :func:`process_keys`
_PROCESS: dict = {}
_LAUNCH_HOOK_INSTALLED = False


def source() -> str:
    """``"compiled"`` when Triton compiles (native), ``"predicted"`` under the interpreter."""
    from impl.runtime import triton_mode

    return "predicted" if triton_mode() == "interpreter" else "compiled"


def begin() -> None:
    global _ACTIVE
    _install_launch_hook()
    _ACTIVE = Recorder()


def end(start: float) -> None:
    global _ACTIVE
    if _ACTIVE is not None:
        _CHECKS.append((start, _ACTIVE))
    _ACTIVE = None


def drain(since: float) -> dict:
    """``{kernel: {repr(key): key}}`` of the checks since ``since`` (earlier ones dropped), for one row."""
    out: dict = {}
    for start, rec in _CHECKS:
        if start >= since:
            for kernel, keys in rec.keys.items():
                out.setdefault(kernel, {}).update(keys)
    _CHECKS.clear()
    return out


def merge(a: dict | None, b: dict | None) -> dict:
    out = {k: dict(v) for k, v in (a or {}).items()}
    for kernel, keys in (b or {}).items():
        out.setdefault(kernel, {}).update(keys)
    return out


def counts(keys: dict | None) -> dict:
    """``{kernel: n}``, sorted by kernel (audit.json)."""
    return {k: len(v) for k, v in sorted((keys or {}).items())}


def process_keys() -> dict:
    """``{kernel: [(key, launches)]}`` of every key recorded while a check ran in this process (a measurement
    script's view: which keys, how often)."""
    return {k: [(key, n) for key, n in v.values()] for k, v in _PROCESS.items()}


def reset_process_keys() -> None:
    _PROCESS.clear()


def _record(kernel_obj_or_name, key) -> None:
    rec = _ACTIVE
    name = kernel_obj_or_name if isinstance(kernel_obj_or_name, str) else kernel_name(kernel_obj_or_name)
    entry = _PROCESS.setdefault(name, {}).setdefault(repr(key), [key, 0])
    entry[1] += 1
    if rec is not None:
        rec.add(name, key)


def compiled(kwargs: dict) -> None:
    """Triton's ``jit_cache_hook`` arguments (``key``, ``fn``: a ``JitFunctionInfo``): one native compilation."""
    if _ACTIVE is None:
        return
    fn = kwargs.get("fn")
    key = kwargs.get("key")
    if fn is None:
        return
    name = f"{getattr(fn, 'module', '?')}.{getattr(fn, 'name', '?')}"
    _record(name, str(key))


def _install_launch_hook() -> None:
    """Under the interpreter, key every launch of an ``InterpretedFunction`` while a check runs (once, and only
    when Triton is already imported; natively no kernel is an ``InterpretedFunction`` and this costs nothing)."""
    global _LAUNCH_HOOK_INSTALLED
    if _LAUNCH_HOOK_INSTALLED or "triton" not in sys.modules:
        return
    _LAUNCH_HOOK_INSTALLED = True
    from triton.runtime.interpreter import InterpretedFunction

    original = InterpretedFunction.run
    if getattr(original, "__smv_keyed__", False):
        return

    def run(self, *args, grid, warmup, **kwargs):
        if _ACTIVE is not None:
            try:
                _record(self, specialization_key(self, args, kwargs))
            except TypeError:  # an argument with no rule: the launch itself will say what is wrong
                pass
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    run.__smv_keyed__ = True
    InterpretedFunction.run = run
