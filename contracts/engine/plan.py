"""The audit's plan: what each row's minimum costs, what the whole run will take, and how the budget is shared.

A row's minimum (its pinned examples, its covering array and its minimum of generated cases: the audit's first
pass) always runs; the budget only decides how many cases beyond it each row gets, so an audit takes the larger of
the minimums' cost and its budget, never their sum. ``--deadline`` is the one hard stop.

The cost of a row's minimum is kept per (subject name, contract, target, profile) in the user cache
(``$SMV_CACHE``, else ``$XDG_CACHE_HOME/sparse-mla-verify``: ``audit-costs.json``, written atomically). It is kept
as CPU seconds plus the seconds the row waited (sleeps, I/O), so that the estimate for a loaded machine is the CPU
seconds divided by the share of a core this process gets now (:func:`cpu_share`, a short probe before the audit
starts) plus the waits. A row never measured costs :data:`DEFAULT_ROW_SECONDS` (conservative: a typical row on
2 cores under the interpreter takes about one second) until its first cases have run; the live ETA then uses its
own rate.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field

from contracts.engine.runner import RowOptions, RowResult

#: the layout of audit-costs.json; another layout is ignored (and rewritten by the next audit)
COST_SCHEMA = 1
COST_FILE = "audit-costs.json"
#: names another file for the cost model (the tests point it at a temporary one, so their planted contracts never
#: enter the user's)
COST_FILE_ENV = "SMV_COST_MODEL"
#: the minimum's cost of a row never measured, in CPU seconds (measured rows of the quick start average about 1 s)
DEFAULT_ROW_SECONDS = 1.5
#: how much a new measurement moves a row's kept cost (an exponential average: one odd run does not rule)
NEW_WEIGHT = 0.5
#: statuses that are a verdict the run accepts; the rows the second pass may continue
RESUMABLE = ("pass", "known")


def cache_dir() -> str:
    """The user cache (the same folder the vLLM trees use: contracts.subjects.vllm.loader.cache_dir)."""
    return os.environ.get("SMV_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sparse-mla-verify")


def cpu_share(seconds: float = 0.3) -> float:
    """The share of one core this process gets now (1.0 on an idle machine, about 2/3 with two busy processes
    beside it on two cores): a busy loop's CPU time over its wall time."""
    w0, c0 = time.monotonic(), time.thread_time()
    x = 0
    while time.monotonic() - w0 < seconds:
        for _ in range(2000):
            x += 1
    wall, cpu = time.monotonic() - w0, time.thread_time() - c0
    return min(1.0, max(0.05, cpu / wall)) if wall > 0 else 1.0


@dataclass
class RowCost:
    """One row's minimum: CPU seconds, seconds spent waiting, and its cases (pinned + generated)."""
    cpu: float
    wait: float = 0.0
    cases: int = 0

    def seconds(self, share: float) -> float:
        return self.cpu / share + self.wait


def cost_key(subject: str, contract: str, target: str, profile: str) -> str:
    return f"{subject}|{contract}|{target}|{profile}"


@dataclass
class CostModel:
    """The kept costs of rows' minimums (``load`` / ``update`` / ``save``)."""
    path: str
    rows: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | None = None) -> "CostModel":
        """The model at ``path`` (default: the user cache's); a missing, unreadable or foreign file is empty."""
        path = path or os.environ.get(COST_FILE_ENV) or os.path.join(cache_dir(), COST_FILE)
        try:
            with open(path) as fh:
                doc = json.load(fh)
            if doc.get("schema_version") != COST_SCHEMA:
                return cls(path)
            rows = {k: RowCost(float(v["cpu"]), float(v.get("wait", 0.0)), int(v.get("cases", 0)))
                    for k, v in doc.get("rows", {}).items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return cls(path)
        return cls(path, rows)

    def get(self, key: str) -> RowCost | None:
        return self.rows.get(key)

    def update(self, key: str, cpu: float, wait: float, cases: int) -> None:
        old = self.rows.get(key)
        if old is None:
            self.rows[key] = RowCost(cpu, wait, cases)
            return
        a = NEW_WEIGHT
        self.rows[key] = RowCost(a * cpu + (1 - a) * old.cpu, a * wait + (1 - a) * old.wait, cases)

    def save(self) -> bool:
        """Write the model atomically (a temporary file, then ``os.replace``); False when the cache is not
        writable (the audit goes on: the model only plans)."""
        doc = {"schema_version": COST_SCHEMA,
               "rows": {k: {"cpu": round(v.cpu, 4), "wait": round(v.wait, 4), "cases": v.cases}
                        for k, v in sorted(self.rows.items())}}
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".audit-costs-", dir=os.path.dirname(os.path.abspath(self.path)))
            with os.fdopen(fd, "w") as fh:
                json.dump(doc, fh, indent=1)
            os.replace(tmp, self.path)
            return True
        except OSError:
            return False


@dataclass
class SubjectPlan:
    """One subject's rows and what their minimums should cost (seconds at the measured core share)."""
    label: str
    name: str
    rows: dict  # (contract, target) -> estimated seconds of its minimum
    measured: int = 0
    budget: float = 0.0

    @property
    def minimum(self) -> float:
        return sum(self.rows.values())

    @property
    def estimate(self) -> float:
        return max(self.minimum, self.budget)


@dataclass
class AuditPlan:
    """The whole audit's plan: per subject its rows' minimum estimates; the run's estimate is the sum over subjects
    of the larger of the minimum and the budget, cut by the deadline."""
    subjects: list
    share: float
    deadline: float | None = None
    jobs: int = 1

    @property
    def minimum(self) -> float:
        return sum(s.minimum for s in self.subjects) / self.parallel

    @property
    def parallel(self) -> float:
        return float(max(1, min(self.jobs, os.cpu_count() or 1)))

    @property
    def estimate(self) -> float:
        total = sum(max(s.minimum / self.parallel, s.budget) for s in self.subjects)
        return min(total, self.deadline) if self.deadline is not None else total

    def as_json(self, actual: float | None = None) -> dict:
        doc = {"estimated_seconds": round(self.estimate, 1), "minimum_seconds": round(self.minimum, 1),
               "deadline": self.deadline, "cpu_share": round(self.share, 3),
               "rows_measured": sum(s.measured for s in self.subjects),
               "rows": sum(len(s.rows) for s in self.subjects)}
        if actual is not None:
            doc["actual_seconds"] = round(actual, 1)
        return doc

    def line(self) -> str:
        """The one line the audit prints before it starts."""
        rows = sum(len(s.rows) for s in self.subjects)
        measured = sum(s.measured for s in self.subjects)
        budget = sum(s.budget for s in self.subjects)
        cut = f", cut at the deadline of {self.deadline:g}s" if self.deadline is not None else ""
        return (f"smv audit: plan: the minimum of {rows} rows will take about {self.minimum:.0f}s ({measured} "
                f"measured before, {rows - measured} by default; {self.share:.0%} of a core free); budget "
                f"{budget:g}s; estimate {self.estimate:.0f}s{cut}")


def plan_subject(model: CostModel, label: str, name: str, rows, profile: str, share: float,
                 budget: float) -> SubjectPlan:
    """``rows``: the (contract, target) pairs that apply (a row known not to apply costs nothing)."""
    est, measured = {}, 0
    for cid, tname in rows:
        cost = model.get(cost_key(name, cid, tname, profile))
        measured += cost is not None
        est[(cid, tname)] = (cost or RowCost(DEFAULT_ROW_SECONDS)).seconds(share)
    return SubjectPlan(label, name, est, measured, budget)


def record(model: CostModel, name: str, profile: str, r: RowResult, cpu: float, share: float) -> None:
    """Keep the cost of a row's first pass (its minimum) when it gave a verdict that ran its cases."""
    if r.status not in RESUMABLE and r.status != "skipped":
        return
    wait = max(0.0, r.seconds - cpu / share)
    model.update(cost_key(name, r.contract, r.target, profile), max(0.0, cpu), wait, r.cases)


def first_share(left: float, remaining: int) -> float:
    """A first pass's budget (only its shrinking reads it: the minimum runs whatever it is): a fair share of what
    is left, at least half of it."""
    return max(left / max(remaining + 1, 1), 0.5 * left, 1.0)


def not_started(cid: str, tname: str, limit: int, sub, deadline_s: float | None) -> RowResult:
    """The row the deadline ran out before: ``incomplete``, never a pass."""
    return RowResult(cid, tname, "incomplete", stopped_by="budget", limit=limit, subject=sub.as_row(),
                     reason=f"not started: the deadline of {deadline_s or 0:g}s (--deadline) ran out before it")


def not_run_after_device_loss(cid: str, tname: str, limit: int, sub, why: str) -> RowResult:
    """A row the serial audit cannot run: an earlier row left the process's device context lost (``incomplete``,
    never a pass; ``--jobs`` gives the rows after such a row a fresh worker instead). Nothing stopped it: it never
    started, so ``stopped_by`` is null."""
    return RowResult(cid, tname, "incomplete", stopped_by=None, limit=limit, subject=sub.as_row(),
                     reason=f"not started: an earlier row left this process's device context lost ({why}); run "
                            f"with --jobs 2 or more to give the rows after it a fresh worker")


@dataclass
class AuditConfig:
    """What every row of one audit runs under, passed once (the serial audit, the pooled one and its workers)."""
    profile: str
    seed: int
    repro_dir: str
    budget: float
    #: the profile's own count of generated cases (a row's limit when ``max_cases`` is None)
    profile_cases: int
    use_examples: bool = True
    max_cases: int | None = None
    shrink_until: float | None = None
    findings_path: str | None = None
    known: list | None = None
    first_violation: bool = False
    #: the hard stop, a ``time.monotonic()`` instant (None: none), and its length in seconds
    deadline: float | None = None
    deadline_s: float | None = None
    jobs: int = 1
    case_timeout: float | None = None

    def limit_of(self, c) -> int:
        n = self.profile_cases if self.max_cases is None else self.max_cases
        return n if c.max_cases is None else min(n, c.max_cases)

    def first_of(self, c) -> int:
        """The generated cases of a row's minimum (its covering array, when longer, is added by the runner)."""
        return min(c.min_cases, self.limit_of(c))

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def time_left(self, budget_end: float) -> float:
        """Seconds to the budget's end, or to the deadline when that comes first."""
        end = budget_end if self.deadline is None else min(budget_end, self.deadline)
        return end - time.monotonic()

    def row_options(self, sub, budget: float) -> RowOptions:
        return RowOptions(profile=self.profile, budget=max(budget, 0.05), seed=self.seed, repro_dir=self.repro_dir,
                          use_examples=self.use_examples, max_examples=self.max_cases,
                          shrink_until=self.shrink_until, subject=sub, findings=self.known,
                          first_violation=self.first_violation, deadline=self.deadline, deadline_s=self.deadline_s)

    def for_worker(self) -> dict:
        """What a worker needs to rebuild this config (JSON; the deadline as the seconds left to it now)."""
        left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        return {"profile": self.profile, "seed": self.seed, "repro_dir": self.repro_dir, "budget": self.budget,
                "profile_cases": self.profile_cases, "use_examples": self.use_examples,
                "max_cases": self.max_cases, "shrink_until": self.shrink_until,
                "findings_path": self.findings_path, "first_violation": self.first_violation,
                "deadline_in": left, "deadline_s": self.deadline_s}

    @classmethod
    def from_worker(cls, doc: dict, known: list | None) -> "AuditConfig":
        left = doc.get("deadline_in")
        fields_ = {k: v for k, v in doc.items() if k != "deadline_in"}
        return cls(**fields_, known=known, deadline=None if left is None else time.monotonic() + left)


@dataclass
class SubjectRun:
    """Where one subject's rows go (the audit's shared state): the progress display, the results list, the
    callback after each row, per subject label its seconds and its workers' descriptions, the cost model."""
    prog: object
    results: list
    on_row: object
    seconds: dict
    described: dict
    model: CostModel
    share: float
    stream: object = None
    work_dir: str | None = None
