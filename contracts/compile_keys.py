"""The key Triton compiles a kernel launch under (its *specialization*), derived on the host.

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
Triton's real binder.

The compile-once contract (contracts/cp_gather.py) and the engine's per-row count
(contracts/engine/specializations.py) both take the key from here.
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
