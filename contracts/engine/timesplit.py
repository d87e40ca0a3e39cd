"""Where a row's seconds go: ``compile``, ``kernel``, ``oracle`` and ``harness`` (audit.json's ``time_split``).

Measured, never estimated, by three instruments that are active only while a check runs (:class:`measuring`,
around each ``contract.check`` the runner makes; a row sums its checks with :func:`drain`):

* ``kernel``: the time inside the subject's calls, i.e. the code under test. Contracts reach their subject through
  :func:`contracts.subjects.bound`, which hands out :func:`timed_bound` views: every function of a family (``ours``:
  an ``impl`` module; ``vllm``: an adapter's entry points) is timed where a contract calls it, and the public methods
  of a class reached through a family (``DecodeGraph.capture``, ``graph.replay``) are timed on the class itself.
  On a GPU the device is synchronized before and after each outermost call (never while a stream is capturing a
  graph), so queued work is billed to the call that queued it. Triton compilation inside a call is not kernel time.
* ``compile``: Triton JIT compilation, through Triton's own compile hooks (``triton.knobs.runtime.jit_cache_hook``,
  called before a kernel compiles, and ``jit_post_compile_hook`` after, Triton 3.4 and later; older Triton's
  ``JITFunction.cache_hook`` / ``compiled_hook``). Any hook already installed keeps being called. The interpreter
  compiles nothing: 0.
* ``oracle``: the time inside the public functions of the ``oracles`` modules, wrapped when the module loads
  (:func:`install`; the oracles' source is untouched); inside a check they run torch on one intra-op thread
  (:func:`timed_oracle` says why). ``oracles.compare``, the comparison's error model, is the
  harness's, as are generation, the comparison and Hypothesis (and anything outside the checks, e.g. an oracle a
  generator calls): ``harness`` is the row's seconds less the other three.

Only the outermost instrumented call counts (an oracle calling an oracle, a subject method calling another, are
one interval).
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import inspect
import sys
import time

from contracts.engine import specializations

KEYS = ("compile", "kernel", "oracle", "harness")
#: oracle modules whose time is the harness's: the comparison helpers (DESIGN "Tolerances")
NOT_ORACLE = ("oracles.compare",)
#: classes reached through a subject's family have their methods timed when they come from these packages
SUBJECT_PACKAGES = ("impl", "vllm", "contracts.subjects")


class Clock:
    """One row's accumulated seconds."""

    def __init__(self):
        self.compile = 0.0
        self.kernel = 0.0
        self.oracle = 0.0
        #: the part of ``kernel`` that Triton spent compiling (moved to ``compile``)
        self.compile_in_kernel = 0.0
        self.pending: list[float] = []  # compile starts without their end yet



_ACTIVE: Clock | None = None
_IN_SUBJECT = False
_IN_ORACLE = False
_IN_COMPILE = False


def zero_split(seconds: float = 0.0) -> dict:
    return {"compile": 0.0, "kernel": 0.0, "oracle": 0.0, "harness": max(0.0, seconds)}


def add_splits(a: dict | None, b: dict | None) -> dict:
    a, b = a or zero_split(), b or zero_split()
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in KEYS}


def rounded(split: dict | None, seconds: float = 0.0) -> dict:
    s = split or zero_split(seconds)
    return {k: round(float(s.get(k, 0.0)), 4) for k in KEYS}


#: (monotonic start, compile, kernel without compile, oracle) of each check measured since the last drain
_CHECKS: list[tuple[float, float, float, float]] = []


class measuring:
    """``with measuring():`` runs the instruments for one check (the runner's ``_checked``); the row collects its
    checks with :func:`drain`. Re-entrant: a check inside a check is part of the outer one."""

    def __enter__(self):
        global _ACTIVE
        self.outer = _ACTIVE is not None
        if not self.outer:
            _install_compile_hooks()
            _ACTIVE = Clock()
            self.start = time.monotonic()
            specializations.begin()
        return _ACTIVE

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        if self.outer:
            return
        c, _ACTIVE = _ACTIVE, None
        specializations.end(self.start)
        _CHECKS.append((self.start, c.compile, max(0.0, c.kernel - c.compile_in_kernel), c.oracle))


def drain(since: float, seconds: float) -> dict:
    """The split of a row that started at ``since`` (``time.monotonic()``) and took ``seconds``: the checks measured
    since then (earlier ones, of a replay or a direct call, are dropped), the harness the rest."""
    mine = [c for c in _CHECKS if c[0] >= since]
    _CHECKS.clear()
    compile_s = sum(c[1] for c in mine)
    kernel = sum(c[2] for c in mine)
    oracle = sum(c[3] for c in mine)
    return {"compile": compile_s, "kernel": kernel, "oracle": oracle,
            "harness": max(0.0, seconds - compile_s - kernel - oracle)}


def _sync() -> None:
    """Wait for the GPU's queued work (a no-op on the CPU and while a stream captures a graph)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        cuda = torch.cuda
        if cuda.is_initialized() and not cuda.is_current_stream_capturing():
            cuda.synchronize()
    except Exception:  # noqa: BLE001 - a broken device is the check's to report, not the clock's
        pass


# --- kernel: the subject's calls ----------------------------------------------------------------------------------

def timed_call(fn):
    """``fn`` timed as the subject's code when a row's clock runs (a pass-through otherwise)."""
    if getattr(fn, "__smv_timed__", False):
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        global _IN_SUBJECT
        clock = _ACTIVE
        if clock is None or _IN_SUBJECT or _IN_ORACLE:
            return fn(*args, **kwargs)
        _sync()
        _IN_SUBJECT = True
        c0 = clock.compile
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _sync()
            clock.kernel += time.perf_counter() - t0
            clock.compile_in_kernel += clock.compile - c0
            _IN_SUBJECT = False

    call.__smv_timed__ = True
    return call


_PATCHED: set = set()


def _is_subject_class(cls) -> bool:
    mod = getattr(cls, "__module__", "") or ""
    if not any(mod == p or mod.startswith(p + ".") for p in SUBJECT_PACKAGES):
        return False
    import enum

    return not issubclass(cls, (BaseException, enum.Enum))


def time_class(cls) -> None:
    """Time the public methods (and ``__init__`` / ``__call__``) of ``cls`` and of its bases from the subject's
    packages, on the classes themselves, once."""
    for klass in cls.__mro__:
        if klass in _PATCHED or not _is_subject_class(klass):
            continue
        _PATCHED.add(klass)
        for name, attr in list(vars(klass).items()):
            if name.startswith("_") and name not in ("__init__", "__call__"):
                continue
            if isinstance(attr, classmethod):
                setattr(klass, name, classmethod(timed_call(attr.__func__)))
            elif isinstance(attr, staticmethod):
                setattr(klass, name, staticmethod(timed_call(attr.__func__)))
            elif inspect.isfunction(attr):
                setattr(klass, name, timed_call(attr))


def _timed_entry(value):
    if inspect.isclass(value):
        if _is_subject_class(value):
            time_class(value)
        return value
    if inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value) \
            or isinstance(value, functools.partial):
        return timed_call(value)
    return value


class TimedFamily:
    """A subject family (an ``impl`` module, an adapter's :class:`~contracts.subjects.Family`) whose callables are
    timed; every other attribute, and any error for a missing one, is the family's own."""

    __slots__ = ("_raw", "_cache")

    def __init__(self, raw):
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_cache", {})

    def __getattr__(self, name: str):
        value = getattr(self._raw, name)
        if name.startswith("__"):
            return value
        hit = self._cache.get(name)
        if hit is not None and hit[0] is value:
            return hit[1]
        wrapped = _timed_entry(value)
        self._cache[name] = (value, wrapped)
        return wrapped

    def __setattr__(self, name: str, value) -> None:
        setattr(self._raw, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._raw, name)

    def __dir__(self):
        return dir(self._raw)

    def __repr__(self) -> str:
        return f"timed({self._raw!r})"


def _is_family(value) -> bool:
    import types

    from contracts.subjects import Family  # a cycle at import time: contracts.subjects imports this module

    return isinstance(value, (types.ModuleType, Family))


class TimedBound:
    """A bound subject (``sub.decode``, ``sub.splits``, ...) whose families are :class:`TimedFamily`."""

    __slots__ = ("_raw", "_families")

    def __init__(self, raw):
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_families", {})

    def __getattr__(self, name: str):
        value = getattr(self._raw, name)
        if name.startswith("__") or not _is_family(value):
            return value
        hit = self._families.get(name)
        if hit is None or hit._raw is not value:
            hit = TimedFamily(value)
            self._families[name] = hit
        return hit

    def __setattr__(self, name: str, value) -> None:
        setattr(self._raw, name, value)

    def __dir__(self):
        return dir(self._raw)

    def __repr__(self) -> str:
        return f"timed({self._raw!r})"


def timed_bound(raw):
    """The subject ``raw`` (a ``bind(target)`` result) with its entry points timed."""
    return raw if isinstance(raw, TimedBound) else TimedBound(raw)


# --- compile: Triton's hooks --------------------------------------------------------------------------------------

_HOOKS_INSTALLED = False


def _compile_started() -> None:
    clock = _ACTIVE
    if clock is not None:
        clock.pending.append(time.perf_counter())


def _compile_ended() -> None:
    clock = _ACTIVE
    if clock is not None and clock.pending:
        clock.compile += time.perf_counter() - clock.pending.pop()


def _chain_pre(previous):
    def pre(*args, **kwargs):
        _compile_started()
        specializations.compiled(kwargs)  # the row's count of distinct specializations (audit.json)
        skipped = previous(*args, **kwargs) if previous is not None else False
        if skipped and _ACTIVE is not None and _ACTIVE.pending:  # that hook compiles nothing: no post hook comes
            _ACTIVE.pending.pop()
        return skipped

    pre.__smv_timed__ = True
    return pre


def _chain_post(previous):
    def post(*args, **kwargs):
        _compile_ended()
        return previous(*args, **kwargs) if previous is not None else None

    post.__smv_timed__ = True
    return post


def _install_compile_hooks() -> None:
    """Chain our start/end hooks onto Triton's (once, and only when Triton is already imported: importing it here
    would decide its mode)."""
    global _HOOKS_INSTALLED
    if _HOOKS_INSTALLED:
        return
    triton = sys.modules.get("triton")
    if triton is None:
        return
    _HOOKS_INSTALLED = True
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is not None and hasattr(runtime, "jit_cache_hook") and hasattr(runtime, "jit_post_compile_hook"):
        if not getattr(runtime.jit_cache_hook, "__smv_timed__", False):
            runtime.jit_cache_hook = _chain_pre(runtime.jit_cache_hook)
            runtime.jit_post_compile_hook = _chain_post(runtime.jit_post_compile_hook)
        return
    try:  # Triton before 3.4: class attributes of JITFunction
        from triton.runtime.jit import JITFunction
    except ImportError:  # pragma: no cover - no JIT at all
        return
    if hasattr(JITFunction, "cache_hook") and not getattr(JITFunction.cache_hook, "__smv_timed__", False):
        JITFunction.cache_hook = _chain_pre(JITFunction.cache_hook)
        if hasattr(JITFunction, "compiled_hook"):
            JITFunction.compiled_hook = _chain_post(JITFunction.compiled_hook)


# --- oracle: the oracles' public functions ------------------------------------------------------------------------

def timed_oracle(fn):
    """``fn`` timed as an oracle's when a check runs (a pass-through otherwise). Inside a check the outermost oracle
    call also runs torch on one intra-op thread: the oracles are many small float64 ops on the CPU, and on a host
    whose cores are busy (a loaded CI box; a GPU host's other workers) the thread pool's hand-offs cost more than
    the ops (the fp8 encoder of one 448-value row: 17 ms on 2 threads of a loaded 2-core box, 2.2 ms on one; see
    ``contracts.core.single_threaded``, which some checks take for their own ops)."""
    if getattr(fn, "__smv_oracle__", False):
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        global _IN_ORACLE
        clock = _ACTIVE
        if clock is None or _IN_ORACLE or _IN_SUBJECT:
            return fn(*args, **kwargs)
        _IN_ORACLE = True
        torch = sys.modules.get("torch")
        threads = torch.get_num_threads() if torch is not None else 1
        if threads > 1:
            torch.set_num_threads(1)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock.oracle += time.perf_counter() - t0
            if threads > 1:
                torch.set_num_threads(threads)
            _IN_ORACLE = False

    call.__smv_oracle__ = True
    return call


def _is_oracle_module(name: str) -> bool:
    return name.startswith("oracles.") and name not in NOT_ORACLE


def wrap_oracle_module(mod) -> None:
    """Replace the public functions defined in ``mod`` by timed ones (in the module's namespace, so a later ``from
    oracles.x import f`` binds the timed one)."""
    for name, value in list(vars(mod).items()):
        if (not name.startswith("_") and inspect.isfunction(value) and value.__module__ == mod.__name__
                and not getattr(value, "__smv_oracle__", False)):
            setattr(mod, name, timed_oracle(value))


class _OracleLoader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        wrap_oracle_module(module)

    def __getattr__(self, name):  # get_source, get_filename, ...: the real loader's
        return getattr(self.inner, name)


class _OracleFinder(importlib.abc.MetaPathFinder):
    """Wraps each ``oracles.*`` module as it loads (before anything can import a name from it)."""

    def find_spec(self, fullname, path, target=None):
        if not _is_oracle_module(fullname):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _OracleLoader(spec.loader)
                return spec
        return None


_INSTALLED = False


def install() -> None:
    """Time the oracles: the modules already loaded now, the others as they load."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    from contracts.subjects.base import set_call_timer

    set_call_timer(timed_bound)  # every subject's entry-point calls report their time to the running row
    for name, mod in list(sys.modules.items()):
        if mod is not None and _is_oracle_module(name):
            wrap_oracle_module(mod)
    sys.meta_path.insert(0, _OracleFinder())


def cases_per_second(cases: int, seconds: float) -> float | None:
    return round(cases / seconds, 3) if cases and seconds > 0 else None


def format_split(split: dict | None) -> str:
    """``compile/kernel/oracle/harness`` seconds, for a table cell."""
    s = split or zero_split()
    return "/".join(f"{s.get(k, 0.0):.1f}" for k in KEYS)
