"""Two costs of the Triton interpreter that buy nothing, removed (speed only; what a kernel computes is unchanged).

Under ``TRITON_INTERPRET=1`` a launch patches ``triton.language`` (its builtins, ``tl.tensor``'s methods, ``range``,
the reductions) to interpreted versions, runs every program, and restores the originals. Every call of a
``@triton.jit`` *device* function inside those programs patches the same attributes again (Triton 3.9:
``InterpretedFunction.__call__`` -> ``_patch_lang``), which walks ``inspect.getmembers`` over ``tl``, ``tl.tensor``
and ``tl.math`` each time: about a millisecond per call, a quarter to a third of a writer or decode row's time here,
spent re-installing what is already installed.

:func:`install` wraps the interpreter's ``_patch_lang``: a call made while a launch is running, for language modules
that launch (or an earlier device call in it) has already patched, does nothing; every other call does what Triton
does, unchanged. The launch's own patch and its restore at the end are Triton's. So the interpreted program sees the
same functions either way (``tests/test_interpreter_fastpath.py`` runs a kernel with nested device calls both ways
and compares the bits, and checks ``triton.language`` is restored after each launch).

Second, CPython 3.11 keeps Python frames in 16 KiB chunks and frees a chunk (``munmap``) as soon as the frame at its
start returns: an interpreted program whose calls go back and forth across a chunk's end maps and unmaps a chunk on
every crossing (500,000 pairs in one graph-replay row under pytest, where the deeper stack put the boundary in the
hot loop: 9 s of system time and the row twice as slow as at a shallower depth). Each interpreted launch therefore
runs inside :func:`with_room`, whose frame reserves ~560 KiB: CPython gives it a chunk of 1 MiB, and the launch's
frames fit in the rest of that chunk, so no crossing happens inside a launch whatever the caller's depth.

It does nothing natively (no kernel is interpreted), where the interpreter lacks ``_patch_lang``, or where
``SMV_INTERPRETER_FASTPATH=0`` asks for Triton's own behaviour.
"""
from __future__ import annotations

import os
import threading

_STATE = threading.local()  # .active: the language modules patched by the launch running in this thread, or None
_INSTALLED = False


#: stack slots :func:`with_room`'s frame reserves (8 bytes each): CPython rounds its chunk up to 1 MiB, leaving
#: ~460 KiB (thousands of frames) for the calls made inside it
ROOM_SLOTS = 70_000


def with_room(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, called from a frame that reserves :data:`ROOM_SLOTS` stack slots (see above)."""
    return fn(*args, **kwargs)


with_room.__code__ = with_room.__code__.replace(co_stacksize=ROOM_SLOTS)


class _Nothing:
    """What a skipped device call returns (Triton discards it; a caller that restores it restores nothing)."""

    def restore(self) -> None:
        pass


class _LaunchScope:
    """The launch's own patch scope: restoring it also ends the launch for the fast path."""

    def __init__(self, scope) -> None:
        self._scope = scope

    def restore(self) -> None:
        try:
            self._scope.restore()
        finally:
            _STATE.active = None


def install() -> bool:
    """Wrap the interpreter's ``_patch_lang`` once per process; True when the fast path is in place."""
    global _INSTALLED
    if _INSTALLED:
        return True
    if os.environ.get("SMV_INTERPRETER_FASTPATH", "1").strip() == "0":
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    if original is None or not hasattr(interpreter, "_LangPatchScope"):
        return False
    interpreter._patch_lang = fast_patch_lang(original, tl)
    launch = interpreter.GridExecutor.__call__

    def roomy_launch(self, *args, **kwargs):
        return with_room(launch, self, *args, **kwargs)

    roomy_launch.__wrapped__ = launch
    interpreter.GridExecutor.__call__ = roomy_launch
    _INSTALLED = True
    return True


def fast_patch_lang(original, tl):
    """``original`` (the interpreter's ``_patch_lang``) wrapped: device calls of a running launch skip modules it
    has already patched; launches and every other call run ``original``."""
    langs_of: dict[int, tuple] = {}

    def languages(fn) -> frozenset:
        g = fn.__globals__
        got = langs_of.get(id(g))
        if got is None or got[0] is not g:  # the dict is held, so its id is never reused for another module
            got = langs_of[id(g)] = (g, frozenset(id(v) for v in list(g.values()) if v is tl or v is tl.core))
        return got[1]

    def patch_lang(fn):
        langs = languages(fn)
        active = getattr(_STATE, "active", None)
        if active is None:  # a launch: Triton's patch, ended by its own restore
            scope = original(fn)
            _STATE.active = langs
            return _LaunchScope(scope)
        if langs <= active:  # a device call whose language modules this launch has already patched
            return _Nothing()
        scope = original(fn)  # a module the launch did not patch: exactly what Triton does (it stays patched)
        _STATE.active = active | langs
        return scope

    patch_lang.__wrapped__ = original
    return patch_lang


def installed() -> bool:
    return _INSTALLED
