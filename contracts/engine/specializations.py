"""How many distinct Triton specializations a row compiles (audit.json's per-row ``specializations``), keyed by
:func:`contracts.compile_keys.specialization_key`.

Per row, while a check runs (:class:`contracts.engine.timesplit.measuring` starts and stops the
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

import sys

from contracts.compile_keys import (  # noqa: F401 - the key functions, re-exported for the recorder's callers
    _TRITON_TYPE, _int_type, _signature, _specialize, kernel_name, kernel_params, key_differences, specialization_key,
    specialize_value, varying_parameters)


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
        # the interpreter ignores launch options a native compiler refuses (NVIDIA's and AMD's alike): a warp count
        # that is not a power of two fails every native launch, so it fails here too
        nw = kwargs.get("num_warps")
        if isinstance(nw, int) and (nw < 1 or nw & (nw - 1)):
            raise AssertionError(f"{kernel_name(self)}: num_warps must be a power of 2, got {nw}")
        if _ACTIVE is not None:
            try:
                _record(self, specialization_key(self, args, kwargs))
            except TypeError:  # an argument with no rule: the launch itself will say what is wrong
                pass
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    run.__smv_keyed__ = True
    InterpretedFunction.run = run
