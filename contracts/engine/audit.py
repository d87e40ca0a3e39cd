"""``smv audit``: every requested contract on every requested target within one shared time budget."""
from __future__ import annotations

import os
import secrets
import sys
import time
from datetime import datetime, timezone

from contracts.engine import reports, specializations
from contracts.registry import get_contract, load_all
from contracts.engine.runner import RowResult, run_contract
from contracts.engine.reports import format_table  # noqa: F401 - the audit's table: `smv audit` and tests take it here
from contracts.engine.timesplit import add_splits, zero_split
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
#: rows the second pass may continue (a known row goes on looking for an unknown failure)
RESUMABLE = ("pass", "known")
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
    Counts are the row's totals so far, the same numbers the final table shows. The ETA is the smaller of the
    budget left and the generated cases every row may still run (up to its limit) at the rate measured for that
    row (or the mean rate of the rows measured so far)."""

    HEARTBEAT_S = 30.0

    def __init__(self, stream, enabled: bool, deadline: float):
        self.stream = stream
        self.enabled = enabled
        self.deadline = deadline
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
        left = self.deadline - time.monotonic()
        if self.rate:
            mean = sum(self.rate.values()) / len(self.rate)
            left = min(left, sum(n * self.rate.get(k, mean) for k, n in self.cases_left.items()))
        return f"ETA {_fmt_s(left)}"

    def start_subject(self, label: str, deadline: float) -> None:
        self.subject = label
        self.deadline = deadline
        self.cases_left = {}

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


def run_audit(contract_ids=None, target_names=None, *, budget: float | None = None, profile: str = "ci",
              seed: int | None = None, report_dir: str | None = None, junit: str | None = None,
              progress: bool = True, stream=None, argv=None, use_examples: bool = True,
              max_cases: int | None = None, allow_empty: bool = False,
              shrink_until: float | None = None, subjects=None, findings_path: str | None = None,
              jobs: int = 1, case_timeout: float | None = None) -> tuple[dict, int]:
    """Run the rows and write the reports; returns the audit.json document and the exit code (0 = ok).

    ``max_cases``: generated cases per row in total (0 or None: the profile's count). ``allow_empty``: an audit in
    which no row passed (all skipped) is ok; by default it is not, so a gate cannot pass with nothing run.
    ``seed``: drawn (and recorded) when not given; a derandomized profile uses :data:`DERANDOMIZED_SEED`.
    ``shrink_until``: a ``time.monotonic()`` instant after which no failure is shrunk further (the campaign's end).
    ``subjects``: the code under audit, subjects or specs (default: ours); each one runs every row with the whole
    ``budget`` (default: :data:`DEFAULT_BUDGETS` of the profile), one subject after the other. ``findings_path``: the known findings (default: the repository's
    findings.toml); a ``known`` row is accepted like a pass. ``jobs``: worker processes that run the rows side by
    side (contracts.engine.audit_pool; 1: every row in this process); with workers, a case that runs past ``case_timeout``
    seconds (default: the contract's limit, else 300 natively and 600 on the interpreter) is a hang."""
    from contracts.engine import findings as known_findings
    from contracts.engine.runner import resolve_subject

    if budget is None:
        budget = DEFAULT_BUDGETS.get(profile, DEFAULT_BUDGET)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise ValueError(f"budget: expected a positive number of seconds, got {budget!r}")
    if max_cases is not None and (isinstance(max_cases, bool) or not isinstance(max_cases, int) or max_cases < 0):
        raise ValueError(f"max_cases: expected 0 (the profile's count) or a positive integer, got {max_cases!r}")
    max_cases = max_cases or None
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected a count >= 1, got {jobs!r}")
    stream = stream or sys.stderr
    contracts = load_all()
    ids = list(contract_ids) if contract_ids else sorted(contracts)
    for cid in ids:
        get_contract(cid)  # clear error for an unknown id, before any work
    targets = [get_target(t).name for t in (target_names or TARGET_NAMES)]
    subs = [resolve_subject(s) for s in (subjects or [None])]
    for i, a in enumerate(subs):
        for b in subs[:i]:
            if (a.name, a.version) == (b.name, b.version):  # rows name a subject by these two alone
                raise ValueError(f"subjects {_spec(b)} and {_spec(a)} are both {a.label}: their rows could not be "
                                 f"told apart; audit them in two runs")
    known = known_findings.load(findings_path, known_contracts=set(contracts))
    from fuzz.profiles import profile_settings

    base = profile_settings(profile)
    if seed is None:
        seed = DERANDOMIZED_SEED if base.derandomize else secrets.randbelow(2 ** 32)
    rows_todo = [(sub, cid, t) for sub in subs for cid in ids for t in targets]
    repro_dir = report_dir or os.path.join(".smv", "repro")
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    prog = Progress(stream, progress, t0 + budget)
    results: list[RowResult] = []
    sub_seconds: dict[str, float] = {}
    #: per subject label, its description as the audit workers saw it (what they loaded, the rewrites they applied)
    described_by_workers: dict[str, dict] = {}
    provenance = reports.provenance()

    def limit_of(c) -> int:
        n = base.max_examples if max_cases is None else max_cases
        return n if c.max_cases is None else min(n, c.max_cases)

    def key(r: RowResult) -> tuple:
        return ((r.subject or {}).get("name"), (r.subject or {}).get("version"), r.contract, r.target)

    def make_doc(final: bool) -> dict:
        rows = list(results)
        if not final:  # rows not reached (a killed or interrupted run) are reported as incomplete, never dropped
            done = {key(r) for r in results}
            rows += [RowResult(c, t, "incomplete", reason="not reached: the audit was interrupted",
                               subject=sub.as_row())
                     for sub, c, t in rows_todo if (sub.name, sub.version, c, t) not in done]
        failing = [r for r in rows if r.status in FAILING]
        passed = sum(r.status in ACCEPTED for r in rows)
        reason = ""
        if failing:
            reason = f"{len(failing)} of {len(rows)} rows " + ", ".join(
                f"{sum(r.status == s for r in failing)} {s}" for s in FAILING if any(r.status == s for r in failing))
        elif not passed:
            reason = ("no row passed: every row was skipped" if rows else "no row passed: the audit had no rows")
            reason += "; accepted (--allow-empty)" if allow_empty else " (pass --allow-empty to accept that)"
        ok = final and not failing and (passed > 0 or allow_empty)
        described = []
        for sub in subs:
            d = sub.describe()  # after the rows ran: the modules loaded and the rewrites applied are filled in
            if sub.label in described_by_workers:
                from contracts.engine.audit_pool import merge_describe

                d = merge_describe(d, described_by_workers[sub.label])
            d.update({"label": sub.label, "spec": _spec(sub), "seconds": round(sub_seconds.get(sub.label, 0.0), 3),
                      "counts": {st: sum(r.status == st for r in rows
                                         if (r.subject or {}).get("name") == sub.name
                                         and (r.subject or {}).get("version") == sub.version)
                                 for st in reports.STATUSES}})
            described.append(d)
        return {
            "schema_version": reports.AUDIT_SCHEMA_VERSION,
            "run": {"started": started.isoformat(), "seconds": round(time.monotonic() - t0, 3), "budget": budget,
                    "profile": profile, "seed": seed, "commit": provenance["commit"],
                    "dirty": provenance["dirty"], "versions": provenance["versions"],
                    "triton_mode": triton_mode(), "specializations_source": specializations.source(),
                    "jobs": jobs, "ok": ok,
                    "reason": reason, "finished": final,
                    "allow_empty": allow_empty, "pinned_examples": use_examples, "max_cases": max_cases,
                    "command": " ".join(argv) if argv else None,
                    "counts": {s: sum(r.status == s for r in rows) for s in reports.STATUSES},
                    "subjects": described,
                    **({"lifecycle": reports.lifecycle([r.as_json() for r in rows], [d["label"] for d in described],
                                                       [f.id for f in known])} if len(subs) > 1 else {}),
                    "findings": {"file": known_findings.default_path() if findings_path is None
                                 else os.path.abspath(findings_path),
                                 "ids": [f.id for f in known]}},
            "device": detect_device().as_json(),
            "targets": targets,
            "results": [r.as_json() for r in rows],
        }

    def save(doc: dict) -> None:
        """Written after every row, atomically: a killed audit still leaves a readable report."""
        if report_dir:
            reports.write_json(os.path.join(report_dir, "audit.json"), doc)
            with open(os.path.join(report_dir, "audit.md"), "w") as fh:
                fh.write(reports.audit_markdown(doc))

    try:
        for sub in subs:
            if jobs > 1:
                from contracts.engine import audit_pool

                audit_pool.audit_subject(
                    sub, ids, targets, jobs=jobs, budget=budget, profile=profile, seed=seed, repro_dir=repro_dir,
                    use_examples=use_examples, max_cases=max_cases, shrink_until=shrink_until,
                    findings_path=findings_path, prog=prog, results=results, limit_of=limit_of,
                    on_row=lambda: save(make_doc(final=False)), seconds=sub_seconds,
                    described=described_by_workers,
                    work_dir=report_dir, stream=stream, case_timeout=case_timeout)
                continue
            _audit_subject(sub, ids, targets, budget=budget, profile=profile, seed=seed, repro_dir=repro_dir,
                           use_examples=use_examples, max_cases=max_cases, shrink_until=shrink_until,
                           known=known, prog=prog, results=results, limit_of=limit_of,
                           on_row=lambda: save(make_doc(final=False)), seconds=sub_seconds)
    except KeyboardInterrupt:
        prog.close()
        save(make_doc(final=False))
        raise
    finally:
        prog.close()  # a live display must not outlive the audit, whatever ends it
    doc = make_doc(final=True)
    save(doc)
    if junit:
        os.makedirs(os.path.dirname(os.path.abspath(junit)), exist_ok=True)
        with open(junit, "wb") as fh:
            fh.write(reports.audit_junit(doc))
    return doc, (0 if doc["run"]["ok"] else 1)


def _spec(sub) -> str:
    from contracts.engine.runner import subject_spec

    return subject_spec(sub)


def _audit_subject(sub, ids, targets, *, budget, profile, seed, repro_dir, use_examples, max_cases, shrink_until,
                   known, prog: Progress, results: list, limit_of, on_row, seconds: dict) -> None:
    """Every row of one subject, in two passes, within its own ``budget`` (appended to ``results``)."""
    rows_todo = [(cid, t) for cid in ids for t in targets]
    t0 = time.monotonic()
    deadline = t0 + budget
    prog.start_subject(sub.label, deadline)
    first_index = len(results)
    remaining = sum(get_contract(c).applies_to(t) for c, t in rows_todo)
    common = dict(profile=profile, seed=seed, repro_dir=repro_dir, max_examples=max_cases,
                  shrink_until=shrink_until, subject=sub, findings=known)
    try:
        # Pass 1: every row up to its minimum number of generated cases (plus its pinned examples). A row stops
        # there, so it may take up to half of what is left: an expensive row is not starved by a fair share, and
        # only a budget too small for all the minimums together leaves rows incomplete. A row the budget has
        # already run out for is not started at all (the budget holds to within one case).
        prog.cases_left = {(sub.label, c, t): limit_of(get_contract(c)) for c, t in rows_todo
                           if get_contract(c).applies_to(t)}
        prog.start_pass(1, len(rows_todo), "each up to its minimum of generated cases")
        for i, (cid, tname) in enumerate(rows_todo, 1):
            c = get_contract(cid)
            n = limit_of(c)
            first = min(c.min_cases, n)
            if not c.applies_to(tname):
                r = run_contract(c, tname, budget=1.0, subject=sub)  # the skipped row, with its reason
            else:
                remaining -= 1
                left = deadline - time.monotonic()
                if left <= 0:
                    r = not_started(cid, tname, n, sub, budget)
                else:
                    row_budget = max(left / max(remaining + 1, 1), 0.5 * left)
                    started_row = time.monotonic()
                    r = first_pass(c, tname, row_budget, use_examples, first, common,
                                   progress=lambda p, g, i=i, cid=cid, tname=tname, n=n, s=started_row: prog.case(
                                       i, len(rows_todo), None, cid, tname, p, g, n, s))
            results.append(r)
            prog.row(i, len(rows_todo), r)
            on_row()
        # Pass 2: the rest of the budget, shared by the rows that passed (or are known) and have cases left,
        # continues each row's generated sequence (same seed, the first pass's cases skipped) up to its limit.
        mine = range(first_index, len(results))
        more = [k for k in mine if results[k].status in RESUMABLE and getattr(results[k], "resumable", False)]
        prog.start_pass(2, len(more), "sharing what is left for more generated cases")
        for n_left, k in zip(range(len(more), 0, -1), more):
            left = deadline - time.monotonic()
            if left <= 0.05:
                break
            r0 = results[k]
            c = get_contract(r0.contract)
            started_row = time.monotonic()
            i = k - first_index + 1
            results[k] = second_pass(r0, c, left / n_left, common,
                                     progress=lambda p, g, i=i, r0=r0, s=started_row: prog.case(
                                         i, len(rows_todo), r0, r0.contract, r0.target, p, g, r0.limit, s))
            prog.row(i, len(rows_todo), results[k])
            on_row()
    finally:
        seconds[sub.label] = time.monotonic() - t0


def not_started(cid: str, tname: str, limit: int, sub, budget: float) -> RowResult:
    """The row the budget ran out before: ``incomplete``, never a pass."""
    return RowResult(cid, tname, "incomplete", stopped_by="budget", limit=limit, subject=sub.as_row(),
                     reason=f"not started: the budget of {budget:.1f}s was spent by the rows before it")


def first_pass(c, tname: str, budget: float, use_examples: bool, first: int, common: dict, progress=None
               ) -> RowResult:
    """A row's first pass: its pinned examples and generated cases up to ``first``, within ``budget``; a row that
    met its minimum with more to do is ``resumable`` (the serial audit and an audit worker both run rows so)."""
    r = run_contract(c, tname, budget=budget, use_examples=use_examples, stop_after=first, progress=progress,
                     **common)
    if r.stopped_by == "stop_after":
        # the row met its minimum and has more to do: only the budget can keep it from that now
        r.stopped_by = "budget"
        r.resumable = True
    return r


def second_pass(r0: RowResult, c, budget: float, common: dict, progress=None) -> RowResult:
    """The row continued past its first pass (same seed, those cases skipped), merged with it."""
    r = run_contract(c, r0.target, budget=budget, use_examples=False, skip=r0.generated_cases,
                     known_repro=r0.status != "known", progress=progress, **common)
    return _merge(r0, r)


def _merge(first: RowResult, second: RowResult) -> RowResult:
    """One row from the two passes: generated cases and time add up, the second pass says what stopped the row;
    a failure or a harness error of the second pass wins, then a known case of either; the second pass running
    out of budget is no loss (the first already reached the minimum). A second-pass failure's ``first_violation``
    counts the first pass's cases and seconds too."""
    from contracts.engine.runner import known_reason, with_notes

    margins = [m for m in (first.margin, second.margin) if m is not None]
    merged = RowResult(first.contract, first.target, first.status, first.reason, first.pinned_cases,
                       first.generated_cases + second.generated_cases, first.seconds + second.seconds,
                       first.violations, first.repro, first.case, second.stopped_by or first.stopped_by,
                       max(margins) if margins else None, first.limit, subject=first.subject,
                       findings=list(first.findings) + [f for f in second.findings if f not in first.findings])
    from contracts.engine.runner import reach_verdict
    from fuzz.dimensions import reach_doc

    merged.time_split = add_splits(first.time_split or zero_split(first.seconds),
                                   second.time_split or zero_split(second.seconds))
    merged.spec_keys = specializations.merge(first.spec_keys, second.spec_keys)
    merged.reach_required = first.reach_required
    merged.reach_covered = set(first.reach_covered) | set(second.reach_covered)
    merged.reach_enforced = first.reach_enforced
    merged.notes = list(first.notes) + [n for n in second.notes if n not in first.notes]
    merged.reach = reach_doc(first.reach_required, merged.reach_covered,
                             bool((first.reach or {}).get("exhaustive")))
    if second.status in ("fail", "error"):
        merged.status, merged.reason = second.status, second.reason
        merged.violations, merged.repro, merged.case = second.violations, second.repro, second.case
        if second.first_violation is not None:  # the second pass's own counts, after all of the first's
            merged.first_violation = {"cases": first.cases + second.first_violation["cases"],
                                      "seconds": first.seconds + second.first_violation["seconds"]}
    elif first.status == "known":
        merged.reason = with_notes(known_reason(merged.findings, first.violations), merged.notes)
    elif second.status == "known":
        merged.status = "known"
        merged.violations, merged.repro, merged.case = second.violations, second.repro, second.case
        merged.reason = with_notes(known_reason(merged.findings, second.violations), merged.notes)
    elif merged.status == "pass":
        merged.reason = with_notes("", merged.notes)
    reach_verdict(merged)
    return merged
