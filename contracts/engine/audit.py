"""``smv audit``: every requested contract on every requested target; every row's minimum, then the budget shared
for more cases (contracts.engine.plan), and ``--deadline`` the one hard stop."""
from __future__ import annotations

import os
import secrets
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from contracts.engine import reports, specializations
from contracts.registry import get_contract, load_all
from contracts.engine.audit_pool import merge_describe
from contracts.engine.plan import (RESUMABLE, AuditConfig, AuditPlan, CostModel, SubjectRun, cpu_share,
                                   first_share, not_run_after_device_loss, not_started, plan_subject, record)
from contracts.engine.runner import (RowResult, first_pass, resolve_subject, run_contract, second_pass,
                                     subject_spec)
from contracts.engine.runner import merge_passes as _merge  # noqa: F401 - tests take the merge here
from contracts.engine.reports import format_table  # noqa: F401 - the audit's table: `smv audit` and tests take it here
from contracts.engine.workers import device_lost
from impl.runtime import detect_device, triton_mode
from impl.targets import TARGET_NAMES, get_target

#: the audit's default budget per profile: dev is the quick look (about two minutes); ci gives every row its covering
#: array and the profile's cases, and the whole ci audit still ends within ten minutes on 2 cores; nightly rounds
#: set their own
DEFAULT_BUDGETS = {"dev": 120.0, "ci": 450.0, "nightly": 600.0}
DEFAULT_BUDGET = DEFAULT_BUDGETS["dev"]
FAILING = ("fail", "error", "incomplete")
#: statuses that are a verdict the run accepts (a known row's every violation is a recorded finding)
ACCEPTED = ("pass", "known")
#: the seed of a derandomized profile (ci) when none is given: the same cases on every run, and a recorded seed
DERANDOMIZED_SEED = 0


def _fmt_s(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


class Progress:
    """What the audit is doing, in every pass: a live display on a terminal (``rich`` when it is importable, one
    rewritten line otherwise), plain lines elsewhere (a line per finished row, and a heartbeat line for a long row).
    Counts are the row's totals so far, the same numbers the final table shows. The ETA counts down the plan
    (contracts.engine.plan): in the first pass the larger of the minimums still to run (their planned seconds,
    the running row's less what it has spent) and the budget left; in the second pass the smaller of the budget
    left and the generated cases every row may still run (up to its limit) at the rate measured for that row (or
    the mean rate of the rows measured so far); then the later subjects' estimates; never past the deadline."""

    HEARTBEAT_S = 30.0

    def __init__(self, stream, enabled: bool, deadline: float, plan=None, hard: float | None = None):
        self.stream = stream
        self.enabled = enabled
        self.deadline = deadline  # the budget's end for the current subject
        self.plan = plan  # contracts.engine.plan.AuditPlan (None: no plan, the budget alone)
        self.hard = hard  # the --deadline instant (None: none)
        self.later = 0.0  # the planned seconds of the subjects after this one
        self.minimum_left: dict[tuple, float] = {}  # (contract, target) -> planned seconds of a minimum to run
        self.current: tuple | None = None  # (contract, target, started) of the first pass running now
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self._rich = None
        self._last_beat = time.monotonic()
        self.pass_no = 1
        #: the label of the subject whose rows run now (each subject has the whole budget, one after the other)
        self.subject = "ours"
        self.cases_left: dict[tuple, int] = {}  # (subject, contract, target) -> generated cases it may still run
        self.rate: dict[tuple, float] = {}  # (subject, contract, target) -> seconds per case measured
        if self.tty:
            try:
                from rich.console import Console
                from rich.live import Live
                from rich.text import Text

                self._Text = Text
                self._rich = Live(Text(""), console=Console(file=stream), refresh_per_second=4, transient=True)
                self._rich.start()
            except ImportError:
                self._rich = None

    def close(self):
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def _write(self, line: str) -> None:
        if self._rich is not None:
            self._rich.console.print(line, markup=False, highlight=False)
        else:
            self.stream.write(("\r\x1b[K" if self.tty else "") + line + "\n")
            self.stream.flush()

    def eta(self) -> str:
        now = time.monotonic()
        left = self.deadline - now
        if self.pass_no == 1 and self.minimum_left:
            spent = 0.0
            if self.current is not None and self.current[:2] in self.minimum_left:
                spent = min(self.minimum_left[self.current[:2]], now - self.current[2])
            parallel = self.plan.parallel if self.plan is not None else 1.0
            left = max(left, (sum(self.minimum_left.values()) - spent) / parallel)
        elif self.rate:
            mean = sum(self.rate.values()) / len(self.rate)
            left = min(left, sum(n * self.rate.get(k, mean) for k, n in self.cases_left.items()))
        left = max(0.0, left) + self.later
        if self.hard is not None:
            left = min(left, self.hard - now)
        return f"ETA {_fmt_s(left)}"

    def start_subject(self, label: str, deadline: float) -> None:
        self.subject = label
        self.deadline = deadline
        self.cases_left = {}
        planned = [s for s in (self.plan.subjects if self.plan is not None else []) if s.label == label]
        self.minimum_left = dict(planned[0].rows) if planned else {}
        self.current = None

    def start_pass(self, no: int, rows: int, share: str) -> None:
        self.pass_no = no
        if self.enabled:
            self._write(f"pass {no} under {self.subject}: {rows} rows, {share}; "
                        f"{_fmt_s(self.deadline - time.monotonic())} of budget left, {self.eta()}")

    def case(self, i, n, r0: RowResult | None, cid, target, pinned, generated, limit, row_started):
        """``pinned`` / ``generated``: cases this call has run so far; ``r0`` the row's first pass, if any."""
        if not self.enabled:
            return
        now = time.monotonic()
        key = (self.subject, cid, target)
        if r0 is None and (self.current is None or self.current[:2] != (cid, target)):
            self.current = (cid, target, row_started)
        run_here = pinned + generated
        if run_here and now > row_started:
            self.rate[key] = (now - row_started) / run_here
        if r0 is not None:
            pinned, generated = r0.pinned_cases, r0.generated_cases + generated
        self.cases_left[key] = max(0, limit - generated)
        line = (f"pass {self.pass_no} [{i}/{n}] {cid} on {target} under {self.subject}: {pinned}+{generated} of "
                f"up to {pinned}+{limit} cases, {self.eta()}")
        if self._rich is not None:
            self._rich.update(self._Text(line))
        elif self.tty:
            self.stream.write(f"\r\x1b[K{line}")
            self.stream.flush()
        elif now - self._last_beat >= self.HEARTBEAT_S:
            self._last_beat = now
            self._write(line)

    def row(self, i, n, r: RowResult):
        key = (self.subject, r.contract, r.target)
        if self.pass_no == 1 and r.status in RESUMABLE and r.resumable and r.limit is not None:
            self.cases_left[key] = max(0, r.limit - r.generated_cases)  # what pass 2 may still run
        else:
            self.cases_left.pop(key, None)
        if self.pass_no == 1:  # its minimum has run (or will not)
            self.minimum_left.pop((r.contract, r.target), None)
            self.current = None
        if r.cases and r.seconds > 0:
            self.rate[key] = r.seconds / r.cases
        if not self.enabled:
            return
        stop = "minimum reached" if r.resumable and self.pass_no == 1 else (
            f"stopped by {r.stopped_by}" if r.stopped_by else "")
        line = (f"pass {self.pass_no} [{i}/{n}] {r.status.upper():<10} {r.contract} on {r.target} under "
                f"{self.subject} ({r.pinned_cases}+{r.generated_cases} cases, {r.seconds:.1f}s" + (f", {stop}" if stop else "")
                + (f", margin {r.margin:.3g}" if r.margin is not None else "") + f"), {self.eta()}")
        if r.status in FAILING or r.status == "known":
            line += f": {r.reason[:200]}"
        if r.repro:
            line += f"\n    replay: smv repro {r.repro}"
        self._last_beat = time.monotonic()
        self._write(line)


@dataclass
class AuditOptions:
    """The keywords of :func:`run_audit` (see there)."""
    budget: float | None = None
    profile: str = "ci"
    seed: int | None = None
    report_dir: str | None = None
    junit: str | None = None
    progress: bool = True
    stream: object = None
    argv: list | None = None
    use_examples: bool = True
    max_cases: int | None = None
    allow_empty: bool = False
    shrink_until: float | None = None
    subjects: list | None = None
    findings_path: str | None = None
    jobs: int = 1
    case_timeout: float | None = None
    first_violation: bool = False
    deadline: float | None = None
    cost_model: str | None = None
    #: contracts.engine.changes.audit_selection's answer: per subject label the contract ids a change selects
    #: (None: all), and the report recorded as ``run.changed_since``
    changed_since: dict | None = None
    budget_scales: bool = False

    def check(self) -> None:
        if self.budget is None:
            self.budget = DEFAULT_BUDGETS.get(self.profile, DEFAULT_BUDGET)
            self.budget_scales = True  # the profile's budget is for every row: a change's selection takes its share
        for name in ("budget",) + (("deadline",) if self.deadline is not None else ()):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name}: expected a positive number of seconds, got {v!r}")
        m = self.max_cases
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
            raise ValueError(f"max_cases: expected 0 (the profile's count) or a positive integer, got {m!r}")
        self.max_cases = m or None
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
            raise ValueError(f"jobs: expected a count >= 1, got {self.jobs!r}")
        self.stream = self.stream or sys.stderr


def run_audit(contract_ids=None, target_names=None, **options) -> tuple[dict, int]:
    """Run the rows and write the reports; returns the audit.json document and the exit code (0 = ok). The
    keywords are :class:`AuditOptions`' fields.

    Every row's minimum (its pinned examples, its covering array and its minimum of generated cases) runs whatever
    the budget (``budget``, default :data:`DEFAULT_BUDGETS` of the profile): the budget only shares out the cases
    beyond the minimums, so the audit takes the larger of the two. ``deadline`` (seconds, default none) is the one
    hard stop: a row it cuts before its minimum, or never starts, is ``incomplete`` naming it. Before it starts the
    audit prints its plan (contracts.engine.plan: the minimums' estimated cost, from the costs kept in the user
    cache, ``cost_model`` overriding the file) unless ``progress`` is False; audit.json's ``run.plan`` records
    the estimate and the actual seconds.

    ``max_cases``: generated cases per row in total (0 or None: the profile's count). ``allow_empty``: an audit in
    which no row passed (all skipped) is ok; by default it is not, so a gate cannot pass with nothing run.
    ``seed``: drawn (and recorded) when not given; a derandomized profile uses :data:`DERANDOMIZED_SEED`.
    ``shrink_until``: a ``time.monotonic()`` instant after which no failure is shrunk further (the campaign's end).
    ``subjects``: the code under audit, subjects or specs (default: ours); each one runs every row with the whole
    budget, one subject after the other. ``findings_path``: the known findings (default: the repository's
    findings.toml); a ``known`` row is accepted like a pass. ``jobs``: worker processes that run the rows side by
    side (contracts.engine.audit_pool; 1: every row in this process); with workers, a case that runs past
    ``case_timeout`` seconds (default: the contract's limit, else 300 natively and 600 on the interpreter) is a
    hang. ``first_violation``: each row stops at its own first failing case, unshrunk (the zoo's kill check)."""
    o = AuditOptions(**options)
    o.check()
    return _Audit(contract_ids, target_names, o).run()


class _Audit:
    """One audit: its rows, its plan, its reports."""

    def __init__(self, contract_ids, target_names, o: AuditOptions):
        from contracts.engine import findings as known_findings
        from fuzz.profiles import profile_settings

        self.o = o
        contracts = load_all()
        self.ids = list(contract_ids) if contract_ids else sorted(contracts)
        for cid in self.ids:
            get_contract(cid)  # clear error for an unknown id, before any work
        self.targets = [get_target(t).name for t in (target_names or TARGET_NAMES)]
        self.subs = _subjects(o.subjects)
        if o.budget_scales and o.changed_since is not None and self.ids:
            # a default budget is the profile's for every contract: a change that selects some takes their share
            share = max(len(self.ids_of(sub)) for sub in self.subs) / len(self.ids)
            o.budget = max(min(30.0, o.budget), o.budget * share)
        self.known = known_findings.load(o.findings_path, known_contracts=set(contracts))
        base = profile_settings(o.profile)
        seed = o.seed
        if seed is None:
            seed = DERANDOMIZED_SEED if base.derandomize else secrets.randbelow(2 ** 32)
        self.cfg = AuditConfig(o.profile, seed, o.report_dir or os.path.join(".smv", "repro"), o.budget,
                               base.max_examples, o.use_examples, o.max_cases, o.shrink_until, o.findings_path,
                               self.known, o.first_violation, deadline_s=o.deadline, jobs=o.jobs,
                               case_timeout=o.case_timeout)
        self.rows_todo = [(sub, cid, t) for sub in self.subs for cid in self.ids_of(sub) for t in self.targets]
        self.results: list[RowResult] = []
        self.sub_seconds: dict[str, float] = {}
        #: per subject label, its description as the audit workers saw it (what they loaded, the rewrites applied)
        self.described_by_workers: dict[str, dict] = {}
        self.provenance = reports.provenance()

    def ids_of(self, sub) -> list:
        """The contracts this subject's rows run: all asked for, or those a change selects (--changed-since)."""
        picked = ((self.o.changed_since or {}).get("selected") or {}).get(sub.label)
        return self.ids if picked is None else [c for c in self.ids if c in set(picked)]

    def plan(self) -> AuditPlan:
        model = CostModel.load(self.o.cost_model)
        share = cpu_share()
        subjects = [plan_subject(model, sub.label, sub.name, [(c, t) for c in self.ids_of(sub) for t in self.targets
                                                             if get_contract(c).applies_to(t)],
                                 self.o.profile, share, self.o.budget) for sub in self.subs]
        self.model = model
        return AuditPlan(subjects, share, self.o.deadline, self.o.jobs)

    def run(self) -> tuple[dict, int]:
        o = self.o
        self.started = datetime.now(timezone.utc)
        self.plan_ = self.plan()
        if o.progress:
            o.stream.write(self.plan_.line() + "\n")
            o.stream.flush()
        self.t0 = time.monotonic()
        self.cfg.deadline = None if o.deadline is None else self.t0 + o.deadline
        prog = Progress(o.stream, o.progress, self.t0 + o.budget, plan=self.plan_, hard=self.cfg.deadline)
        run = SubjectRun(prog, self.results, lambda: self.save(self.make_doc(final=False)), self.sub_seconds,
                         self.described_by_workers, self.model, self.plan_.share, o.stream, o.report_dir)
        try:
            for k, sub in enumerate(self.subs):
                prog.later = sum(s.estimate for s in self.plan_.subjects[k + 1:])
                rows = [(cid, t) for cid in self.ids_of(sub) for t in self.targets]
                if o.jobs > 1:
                    from contracts.engine import audit_pool

                    audit_pool.audit_subject(sub, rows, self.cfg, run)
                else:
                    _audit_subject(sub, rows, self.cfg, run)
        except KeyboardInterrupt:
            prog.close()
            self.save(self.make_doc(final=False))
            raise
        finally:
            prog.close()  # a live display must not outlive the audit, whatever ends it
            self.model.save()  # what the minimums cost this time: the next audit's plan
        return self.finish()

    def finish(self) -> tuple[dict, int]:
        doc = self.make_doc(final=True)
        self.save(doc)
        if self.o.junit:
            os.makedirs(os.path.dirname(os.path.abspath(self.o.junit)), exist_ok=True)
            with open(self.o.junit, "wb") as fh:
                fh.write(reports.audit_junit(doc))
        return doc, (0 if doc["run"]["ok"] else 1)

    def doc_rows(self, final: bool) -> list:
        rows = list(self.results)
        if not final:  # rows not reached (a killed or interrupted run) are reported as incomplete, never dropped
            done = {_row_key(r) for r in self.results}
            rows += [RowResult(c, t, "incomplete", reason="not reached: the audit was interrupted",
                               subject=sub.as_row())
                     for sub, c, t in self.rows_todo if (sub.name, sub.version, c, t) not in done]
        return rows

    def verdict(self, rows: list, final: bool) -> tuple[bool, str]:
        failing = [r for r in rows if r.status in FAILING]
        passed = sum(r.status in ACCEPTED for r in rows)
        reason = ""
        if failing:
            reason = f"{len(failing)} of {len(rows)} rows " + ", ".join(
                f"{sum(r.status == s for r in failing)} {s}" for s in FAILING if any(r.status == s for r in failing))
        elif not passed:
            reason = ("no row passed: every row was skipped" if rows else "no row passed: the audit had no rows")
            reason += "; accepted (--allow-empty)" if self.o.allow_empty else " (pass --allow-empty to accept that)"
        return final and not failing and (passed > 0 or self.o.allow_empty), reason

    def described(self, rows: list) -> list:
        out = []
        for sub in self.subs:
            d = sub.describe()  # after the rows ran: the modules loaded and the rewrites applied are filled in
            if sub.label in self.described_by_workers:
                d = merge_describe(d, self.described_by_workers[sub.label])
            mine = [r for r in rows if (r.subject or {}).get("name") == sub.name
                    and (r.subject or {}).get("version") == sub.version]
            d.update({"label": sub.label, "spec": subject_spec(sub),
                      "seconds": round(self.sub_seconds.get(sub.label, 0.0), 3),
                      "counts": {st: sum(r.status == st for r in mine) for st in reports.STATUSES}})
            out.append(d)
        return out

    def make_doc(self, final: bool) -> dict:
        from contracts.engine import findings as known_findings

        o, rows = self.o, self.doc_rows(final)
        ok, reason = self.verdict(rows, final)
        described = self.described(rows)
        seconds = time.monotonic() - self.t0
        run = {"started": self.started.isoformat(), "seconds": round(seconds, 3), "budget": o.budget,
               "profile": o.profile, "seed": self.cfg.seed, "commit": self.provenance["commit"],
               "dirty": self.provenance["dirty"], "versions": self.provenance["versions"],
               "triton_mode": triton_mode(), "specializations_source": specializations.source(),
               "jobs": o.jobs, "ok": ok, "reason": reason, "finished": final, "allow_empty": o.allow_empty,
               "pinned_examples": o.use_examples, "max_cases": o.max_cases,
               "command": " ".join(o.argv) if o.argv else None,
               "counts": {s: sum(r.status == s for r in rows) for s in reports.STATUSES},
               "subjects": described, "plan": self.plan_.as_json(actual=seconds)}
        if o.changed_since is not None:
            run["changed_since"] = o.changed_since.get("report")
        if len(self.subs) > 1:
            run["lifecycle"] = reports.lifecycle([r.as_json() for r in rows], [d["label"] for d in described],
                                                 [f.id for f in self.known])
        run["findings"] = {"file": known_findings.default_path() if o.findings_path is None
                           else os.path.abspath(o.findings_path), "ids": [f.id for f in self.known]}
        return {"schema_version": reports.AUDIT_SCHEMA_VERSION, "run": run, "device": detect_device().as_json(),
                "targets": self.targets, "results": [r.as_json() for r in rows]}

    def save(self, doc: dict) -> None:
        """Written after every row, atomically: a killed audit still leaves a readable report."""
        if self.o.report_dir:
            reports.write_json(os.path.join(self.o.report_dir, "audit.json"), doc)
            with open(os.path.join(self.o.report_dir, "audit.md"), "w") as fh:
                fh.write(reports.audit_markdown(doc))


def _row_key(r: RowResult) -> tuple:
    return ((r.subject or {}).get("name"), (r.subject or {}).get("version"), r.contract, r.target)


def _subjects(specs) -> list:
    subs = [resolve_subject(s) for s in (specs or [None])]
    for i, a in enumerate(subs):
        for b in subs[:i]:
            if (a.name, a.version) == (b.name, b.version):  # rows name a subject by these two alone
                raise ValueError(f"subjects {subject_spec(b)} and {subject_spec(a)} are both {a.label}: their rows "
                                 f"could not be told apart; audit them in two runs")
    return subs


def _spec(sub) -> str:
    return subject_spec(sub)


def _audit_subject(sub, rows: list, cfg: AuditConfig, run: SubjectRun) -> None:
    """Every row of one subject, in two passes, within its own budget (appended to ``run.results``)."""
    t0 = time.monotonic()
    budget_end = t0 + cfg.budget
    run.prog.start_subject(sub.label, budget_end)
    first_index = len(run.results)
    try:
        _first_passes(sub, rows, cfg, run, budget_end)
        _second_passes(sub, rows, cfg, run, first_index, budget_end)
    finally:
        run.seconds[sub.label] = time.monotonic() - t0


def _first_passes(sub, rows: list, cfg: AuditConfig, run: SubjectRun, budget_end: float) -> None:
    """Pass 1: every row up to its minimum (its pinned examples, covering array and minimum of generated cases),
    which the budget never cuts: only the deadline does, and a row the deadline has passed is not started."""
    prog = run.prog
    remaining = sum(get_contract(c).applies_to(t) for c, t in rows)
    prog.cases_left = {(sub.label, c, t): cfg.limit_of(get_contract(c)) for c, t in rows
                       if get_contract(c).applies_to(t)}
    prog.start_pass(1, len(rows), "each up to its minimum of generated cases")
    lost = None
    for i, (cid, tname) in enumerate(rows, 1):
        c = get_contract(cid)
        if not c.applies_to(tname):
            r = run_contract(c, tname, budget=1.0, subject=sub)  # the skipped row, with its reason
        elif lost:
            remaining -= 1
            r = not_run_after_device_loss(cid, tname, cfg.limit_of(c), sub, lost)
        elif cfg.past_deadline():
            remaining -= 1
            r = not_started(cid, tname, cfg.limit_of(c), sub, cfg.deadline_s)
        else:
            remaining -= 1
            r = _first_row(sub, c, tname, cfg, run, (i, len(rows), first_share(budget_end - time.monotonic(),
                                                                                 remaining)))
            lost = device_lost()
            if lost:
                (run.stream or sys.stderr).write(
                    f"smv audit: row {cid} on {tname} left the device context lost ({lost}); the rows after it cannot "
                    f"run in this process (--jobs 2 or more runs them on a fresh worker)\n")
        run.results.append(r)
        prog.row(i, len(rows), r)
        run.on_row()


def _first_row(sub, c, tname: str, cfg: AuditConfig, run: SubjectRun, where: tuple) -> RowResult:
    """One row's first pass, its cost kept for the next plan. ``where``: (row number, rows, budget share)."""
    i, n_rows, share = where
    n = cfg.limit_of(c)
    started, cpu0 = time.monotonic(), time.process_time()
    r = first_pass(c, tname, cfg.row_options(sub, share), cfg.first_of(c),
                   progress=lambda p, g: run.prog.case(i, n_rows, None, c.id, tname, p, g, n, started))
    record(run.model, sub.name, cfg.profile, r, time.process_time() - cpu0, run.share)
    return r


def _second_passes(sub, rows: list, cfg: AuditConfig, run: SubjectRun, first_index: int, budget_end: float) -> None:
    """Pass 2: what is left of the budget (and before the deadline), shared by the rows that passed (or are known)
    and have cases left, continues each row's generated sequence (same seed, the first pass's cases skipped) up to
    its limit."""
    prog, results = run.prog, run.results
    more = [k for k in range(first_index, len(results))
            if results[k].status in RESUMABLE and getattr(results[k], "resumable", False)]
    prog.start_pass(2, len(more), "sharing what is left for more generated cases")
    for n_left, k in zip(range(len(more), 0, -1), more):
        left = cfg.time_left(budget_end)
        if left <= 0.05 or device_lost():
            break
        r0 = results[k]
        started_row = time.monotonic()
        i = k - first_index + 1
        results[k] = second_pass(r0, get_contract(r0.contract), cfg.row_options(sub, left / n_left), left / n_left,
                                 progress=lambda p, g, i=i, r0=r0, s=started_row: prog.case(
                                     i, len(rows), r0, r0.contract, r0.target, p, g, r0.limit, s))
        prog.row(i, len(rows), results[k])
        run.on_row()
