"""The contract API: a named, documented predicate over generated cases, returning structured violations.

A contract is declared with :func:`contract`::

    @contract("fp8-codec-exact", targets=ALL_TARGETS, cases=lambda target: st.fixed_dictionaries(...))
    def fp8_codec_exact(case: dict, target: Target) -> list[Violation]:
        '''What it promises; where it comes from (seed / upstream issue).'''

Cases are plain JSON data (ints, floats, strings, lists, dicts; tensors are made inside the check from a seed in the
case), so any failing case can be written to a file and replayed exactly by ``smv repro FILE``.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from impl.targets import TARGET_NAMES, Target

ALL_TARGETS: tuple[str, ...] = TARGET_NAMES
AMD_TARGETS: tuple[str, ...] = ("gfx942", "gfx950")

_ID_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


@dataclass
class Violation:
    """One broken promise: what, where, expected, got (all plain strings, for JSON and humans)."""

    message: str
    where: str = ""
    expected: str = ""
    got: str = ""

    def as_json(self) -> dict:
        return {"message": self.message, "where": self.where, "expected": self.expected, "got": self.got}

    def __str__(self) -> str:
        parts = [self.message]
        if self.where:
            parts.append(f"at {self.where}")
        if self.expected or self.got:
            parts.append(f"expected {self.expected}, got {self.got}")
        return "; ".join(parts)


@dataclass
class Contract:
    id: str
    doc: str
    targets: tuple[str, ...]
    cases: Callable[[Target], Any]  # target -> Hypothesis strategy of JSON-able cases
    check: Callable[[Any, Target], list[Violation]]
    #: pinned regression cases, checked before the generator runs: target -> list of cases
    examples: Callable[[Target], list] | None = None
    #: fewest generated cases for a row to count as ``pass`` (fewer within the budget: ``incomplete``)
    min_cases: int = 5
    #: most cases per run whatever the profile says (for expensive checks)
    max_cases: int | None = None
    #: why the contract does not apply to the targets it leaves out (shown in ``skipped`` rows)
    skip_reason: str = "does not apply to this target"
    module: str = ""
    extra: dict = field(default_factory=dict)
    #: the case family's dataclass (a ``fuzz.cases.Case``): reproducers are read back through its ``from_json``
    case_type: Any = None
    #: a numeric-agreement contract: its check calls :func:`record_margin`, and its rows report the worst
    #: error-to-tolerance ratio over passing cases (exact checks report ``null``)
    numeric: bool = False

    def applies_to(self, target: "Target | str") -> bool:
        name = target if isinstance(target, str) else target.name
        return name in self.targets


CONTRACTS: dict[str, Contract] = {}


def contract(id: str, *, targets=ALL_TARGETS, cases, examples=None, min_cases: int = 5,
             max_cases: int | None = None, skip_reason: str = "does not apply to this target",
             case_type=None, numeric: bool = False):
    """Register ``check(case, target) -> list[Violation]`` as contract ``id``; its docstring is the promise."""
    if not _ID_RE.match(id):
        raise ValueError(f"contract id must be kebab-case, got {id!r}")
    bad = [t for t in targets if t not in TARGET_NAMES]
    if bad:
        raise ValueError(f"contract {id}: unknown targets {bad}")

    def register(check):
        if id in CONTRACTS and CONTRACTS[id].module != check.__module__:
            raise ValueError(f"contract {id} registered twice ({CONTRACTS[id].module}, {check.__module__})")
        if not (check.__doc__ or "").strip():
            raise ValueError(f"contract {id}: the check needs a docstring saying what it promises")
        CONTRACTS[id] = Contract(id=id, doc=check.__doc__, targets=tuple(targets), cases=cases, check=check,
                                 examples=examples, min_cases=min_cases, max_cases=max_cases,
                                 skip_reason=skip_reason, module=check.__module__, case_type=case_type,
                                 numeric=numeric)
        return check

    return register


# --- margins: how close a passing numeric case came to its tolerance ----------------------------------------------

_MARGINS: contextvars.ContextVar = contextvars.ContextVar("smv_margins", default=None)


@contextlib.contextmanager
def collecting_margins():
    """Collect the ratios that :func:`record_margin` reports while the block runs (the runner wraps each check)."""
    sink: list[float] = []
    token = _MARGINS.set(sink)
    try:
        yield sink
    finally:
        _MARGINS.reset(token)


def record_margin(error, tolerance=None) -> float | None:
    """Report a numeric check's worst error-to-tolerance ratio for this case. Called as ``record_margin(ratio)``
    or ``record_margin(err, tol)`` with tensors of the same shape (lanes where ``tol`` is not finite or both are
    zero are left out). A ratio above 1 is a violation the check reports itself; this only measures."""
    if tolerance is None:
        ratio = float(error)
    else:
        import torch

        e = torch.as_tensor(error, dtype=torch.float64).detach().cpu()
        t = torch.as_tensor(tolerance, dtype=torch.float64).detach().cpu().expand_as(e)
        keep = torch.isfinite(e) & torch.isfinite(t) & ~((e == 0) & (t == 0))
        if not bool(keep.any()):
            return None
        r = e[keep] / t[keep]  # tol 0 with err > 0 gives inf: a real excess
        ratio = float(r.max())
    if math.isnan(ratio):
        return None
    sink = _MARGINS.get()
    if sink is not None:
        sink.append(ratio)
    return ratio


# --- notes: what a passing row did not check, said in its reason --------------------------------------------------

_NOTES: contextvars.ContextVar = contextvars.ContextVar("smv_notes", default=None)


@contextlib.contextmanager
def collecting_notes():
    """Collect the distinct texts :func:`record_note` reports while the block runs (the runner wraps each row)."""
    sink: list[str] = []
    token = _NOTES.set(sink)
    try:
        yield sink
    finally:
        _NOTES.reset(token)


def record_note(text: str) -> None:
    """Say that a check left part of its case unchecked for a reason that is no verdict (a path the subject does
    not have, e.g.): a passing row's reason lists each distinct note, so a pass never hides what it skipped."""
    sink = _NOTES.get()
    if sink is not None and text not in sink:
        sink.append(text)


@contextlib.contextmanager
def single_threaded():
    """Run torch on one intra-op thread: these checks are thousands of tiny ops, and on a shared, loaded machine
    the thread pool's hand-offs cost a thousand times the op itself (4.5 ms vs 5 us for a [2,576]x[576,5] matmul,
    measured here)."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


# --- small helpers for writing checks ---------------------------------------------------------------------------

def fmt(x, limit: int = 120) -> str:
    """A short printable form of a value for a Violation field."""
    try:
        import torch

        if isinstance(x, torch.Tensor):
            if x.numel() <= 16:
                s = str(x.tolist())
            else:
                s = f"tensor(shape={list(x.shape)}, dtype={x.dtype})"
            return s if len(s) <= limit else s[: limit - 3] + "..."
    except ImportError:  # pragma: no cover
        pass
    s = repr(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def compare_exact(name: str, got, expected, *, limit: int = 5) -> list[Violation]:
    """Bitwise/elementwise equality of two tensors (NaN == NaN), reporting the first ``limit`` mismatches."""
    import torch

    if tuple(got.shape) != tuple(expected.shape):
        return [Violation(f"{name}: shape differs", name, str(list(expected.shape)), str(list(got.shape)))]
    g, e = got.detach().cpu(), expected.detach().cpu()
    if g.dtype.is_floating_point or e.dtype.is_floating_point:
        g64, e64 = g.to(torch.float64), e.to(torch.float64)
        same = (g64 == e64) | (torch.isnan(g64) & torch.isnan(e64))
    else:
        same = g.to(torch.int64) == e.to(torch.int64)
    bad = (~same).nonzero()
    out = []
    for idx in bad[:limit].tolist():
        ix = tuple(idx)
        out.append(Violation(f"{name} differs", f"{name}{list(ix)}", fmt(e[ix].item()), fmt(g[ix].item())))
    if len(bad) > limit:
        out.append(Violation(f"{name}: {len(bad) - limit} more mismatches", name, "", ""))
    return out
