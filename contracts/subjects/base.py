"""The subjects' base: what every subject is (``Subject``, ``Family``), the exceptions that end a row without a
verdict about the code, ``ours`` (impl/), and the subject a running row judges (``current``, ``using``).

The package's overview follows (``contracts.subjects`` re-exports all of this).

Subjects: the code under audit.

A subject is a set of entry points in the shape of our own API (``impl/``), grouped in families named after impl's
modules (``decode``, ``splits``, ``cache_writers``, ...). ``ours`` is impl itself; ``vllm`` is upstream vLLM's real
ROCm modules behind adapters (:mod:`contracts.subjects.vllm`). Contracts never call ``impl`` directly for the code
they judge: they ask :func:`bound` for the current subject's entry points on their target::

    sub = bound(target)
    got = sub.splits.select_num_splits(...)

The runner sets the subject for each row (:func:`using`); with none set it is ``ours``, so a check called directly
(tests, ``smv repro``) judges impl/. An entry point the subject lacks raises :class:`EntryMissing`, which the runner
turns into a ``skipped`` row naming it; :class:`SubjectUnavailable` (the subject cannot run that row on this host,
e.g. FNUZ fp8 on NVIDIA) is ``skipped`` with its reason; :class:`FidelityError` (the interpreter's corrections are
not known good for this Triton) is ``error``. None of them is a verdict about the subject's code.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
from dataclasses import dataclass, field

from impl.targets import Target, get_target


class SubjectSpecError(ValueError):
    """A ``--subject`` value that names no usable subject; the message is one line (the CLI exits 2)."""


class SubjectSkip(Exception):
    """Base of the exceptions that end a row without a verdict about the subject's code."""


class EntryMissing(SubjectSkip):
    """The subject has no such entry point (``family.name``)."""

    def __init__(self, entry: str, why: str = ""):
        self.entry = entry
        self.why = why
        super().__init__(entry)

    def reason(self, label: str) -> str:
        return f"subject {label} has no entry point {self.entry}" + (f" ({self.why})" if self.why else "")


class SubjectUnavailable(SubjectSkip):
    """The subject cannot run this row on this host (the message says why)."""

    def reason(self, label: str) -> str:
        return f"subject {label}: {self}"


class SubjectError(RuntimeError):
    """The subject cannot provide what a row needs - its code did not load, a symbol an adapter needs is missing or
    changed, a vLLM facility only a stand-in serves was reached: the row ends ``error`` naming the cause, never a
    verdict about the subject's code."""


class FidelityError(SubjectError):
    """The interpreter cannot be trusted to compute what a GPU computes for this subject's kernels."""


class SymbolMissing(SubjectError):
    """An upstream symbol an adapter needs is missing from the subject or has another shape (an ``error`` row)."""


class SymbolTooNew(SubjectSkip):
    """An upstream symbol an adapter needs came in a release newer than the subject's (a ``skipped`` row)."""

    def reason(self, label: str) -> str:
        return f"subject {label}: {self}"


class SymbolNotInVariant(SubjectSkip):
    """A model variant's module (``vllm==X#deepseek_v41``) has no own definition of an upstream symbol an adapter
    needs (its model has no such symbol, or takes it from a module the audit does not load): a ``skipped`` row."""

    def reason(self, label: str) -> str:
        return f"subject {label}: {self}"


def failure_cause(exc: BaseException, subject: "Subject | None" = None) -> str:
    """One line naming what went wrong: the exception, and where the subject's own source raised it
    (``ImportError: cannot import name 'X' from 'vllm.platforms.rocm' (upstream vllm/v1/.../ops.py:26)``): the
    innermost frame in the subject's tree, so a reader sees the upstream line, not the harness's."""
    import traceback

    text = f"{type(exc).__name__}: {exc}"
    root = getattr(getattr(subject, "tree", None), "root", None)
    if not root:
        return text
    root = os.path.join(os.path.abspath(root), "")
    where = None
    for fr in traceback.extract_tb(exc.__traceback__):
        name = fr.filename.split("#smv-rewritten-", 1)[0]  # the loader's name for a rewritten module
        if name.startswith(root):
            where = f"{name[len(root):]}:{fr.lineno}"
    return f"{text} (upstream {where})" if where else text


#: the repository this code runs from (the suite's own root: ``ours`` is its impl/)
_SUITE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIST_NAME = "sparse-mla-verify"


def package_version() -> str:
    """The suite's version: a source checkout's pyproject.toml when this code runs from one (an editable
    install's metadata keeps the version it was installed at), else the installed distribution's metadata."""
    from importlib import metadata

    try:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        with open(os.path.join(_SUITE_ROOT, "pyproject.toml"), "rb") as fh:
            project = tomllib.load(fh).get("project", {})
        if project.get("name") == DIST_NAME and project.get("version"):
            return str(project["version"])
    except (OSError, ValueError):
        pass
    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return "unknown"


#: wraps a subject's bound entry points so each call reports its time; the engine installs its timer
#: (contracts.engine.timesplit.install), and without one the entry points are returned as they are
_CALL_TIMER: list = [lambda bound_entries: bound_entries]


def set_call_timer(wrap) -> None:
    """Install ``wrap(bound) -> bound``, applied to every subject's bound entry points from now on."""
    _CALL_TIMER[0] = wrap


class Family:
    """A subject's entry points of one family; any name it lacks is :class:`EntryMissing`, never AttributeError
    (so a contract asking for it gets a ``skipped`` row naming the entry point)."""

    def __init__(self, name: str, **entries):
        self._name = name
        self.__dict__.update(entries)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise EntryMissing(f"{self._name}.{name}")


@dataclass
class Subject:
    """What is under audit. ``name`` is ``ours`` or ``vllm``; ``version`` the code's version; ``source`` where it
    came from (a path, a wheel, the installed package); ``modules`` maps each loaded module's path to its sha256;
    ``rewrites`` lists every named rewrite the loader applied to the subject's source."""

    name: str
    version: str
    source: str = ""
    modules: dict = field(default_factory=dict)
    rewrites: list = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name if self.name == "ours" else f"{self.name}=={self.version}"

    def bind(self, target: Target):  # pragma: no cover - overridden
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "version": self.version, "source": self.source,
                "modules": dict(sorted(self.modules.items())), "rewrites": list(self.rewrites)}

    def as_row(self) -> dict:
        return {"name": self.name, "version": self.version}


class _OursBound:
    """impl/'s modules as families: ``sub.decode`` is ``impl.decode``."""

    def __init__(self, target: Target):
        self.target = target

    def __getattr__(self, family: str):
        if family.startswith("__"):
            raise AttributeError(family)
        try:
            return importlib.import_module(f"impl.{family}")
        except ModuleNotFoundError as exc:
            if exc.name == f"impl.{family}":
                raise EntryMissing(family) from None
            raise


class OursSubject(Subject):
    def __init__(self):
        super().__init__("ours", package_version(), _SUITE_ROOT)
        self._bound: dict = {}

    def bind(self, target: Target):
        t = get_target(target)
        if t.name not in self._bound:
            self._bound[t.name] = _CALL_TIMER[0](_OursBound(t))  # calls report their time (audit.json time_split)
        return self._bound[t.name]


_OURS: OursSubject | None = None


def ours() -> OursSubject:
    global _OURS
    if _OURS is None:
        _OURS = OursSubject()
    return _OURS


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("smv_subject", default=None)


def current() -> Subject:
    """The subject the running row judges (``ours`` when none is set)."""
    return _CURRENT.get() or ours()


@contextlib.contextmanager
def using(subject: Subject | None):
    token = _CURRENT.set(subject)
    try:
        yield subject or ours()
    finally:
        _CURRENT.reset(token)


def bound(target: "Target | str"):
    """The current subject's entry points on ``target`` (families as attributes), each call timed as the
    subject's (the engine's timer, when one is installed: :func:`set_call_timer`)."""
    return _CALL_TIMER[0](current().bind(get_target(target)))


def is_ours() -> bool:
    return current().name == "ours"
