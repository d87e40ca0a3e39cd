"""``smv audit``: every requested contract on every requested target within one shared time budget."""
from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone

from contracts import reports
from contracts.registry import get_contract, load_all
from contracts.runner import RowResult, run_contract
from impl.runtime import detect_device, triton_mode
from impl.targets import TARGET_NAMES, get_target

DEFAULT_BUDGET = 120.0
FAILING = ("fail", "error", "incomplete")


class _Progress:
    """One rewritten status line on a terminal, plain lines otherwise."""

    def __init__(self, stream, enabled: bool):
        self.stream = stream
        self.enabled = enabled
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()

    def case(self, i, n, cid, target, cases):
        if self.tty:
            self.stream.write(f"\r\x1b[K[{i}/{n}] {cid} on {target}: {cases} cases")
            self.stream.flush()

    def row(self, i, n, r: RowResult):
        if not self.enabled:
            return
        line = f"[{i}/{n}] {r.status.upper():<10} {r.contract} on {r.target} ({r.cases} cases, {r.seconds:.1f}s)"
        if r.status in FAILING:
            line += f": {r.reason[:200]}"
        if r.repro:
            line += f"\n    replay: smv repro {r.repro}"
        self.stream.write(("\r\x1b[K" if self.tty else "") + line + "\n")
        self.stream.flush()


def run_audit(contract_ids=None, target_names=None, *, budget: float = DEFAULT_BUDGET, profile: str = "ci",
              seed: int | None = None, report_dir: str | None = None, junit: str | None = None,
              progress: bool = True, stream=None, argv=None, use_examples: bool = True,
              max_cases: int | None = None) -> tuple[dict, int]:
    stream = stream or sys.stderr
    contracts = load_all()
    ids = list(contract_ids) if contract_ids else sorted(contracts)
    for cid in ids:
        get_contract(cid)  # clear error for an unknown id, before any work
    targets = [get_target(t).name for t in (target_names or TARGET_NAMES)]
    rows_todo = [(cid, t) for cid in ids for t in targets]
    repro_dir = report_dir or os.path.join(".smv", "repro")
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    prog = _Progress(stream, progress)
    results: list[RowResult] = []
    remaining = sum(get_contract(c).applies_to(t) for c, t in rows_todo)

    def make_doc(final: bool) -> dict:
        rows = list(results)
        if not final:  # rows not reached (a killed or interrupted run) are reported as incomplete, never dropped
            done = {(r.contract, r.target) for r in results}
            rows += [RowResult(c, t, "incomplete", reason="not reached: the audit was interrupted")
                     for c, t in rows_todo if (c, t) not in done]
        ok = final and not any(r.status in FAILING for r in rows)
        return {
            "schema_version": reports.AUDIT_SCHEMA_VERSION,
            "run": {"started": started.isoformat(), "seconds": round(time.monotonic() - t0, 3), "budget": budget,
                    "profile": profile, "seed": seed, "triton_mode": triton_mode(), "ok": ok, "finished": final,
                    "pinned_examples": use_examples, "max_cases": max_cases, "command": " ".join(argv) if argv else None,
                    "counts": {s: sum(r.status == s for r in rows) for s in reports.STATUSES}},
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
        # Pass 1: every row up to its minimum number of generated cases (plus its pinned examples). A row stops
        # there, so it may take up to half of what is left: an expensive row is not starved by a fair share, and
        # only a budget too small for all the minimums together leaves rows incomplete.
        for i, (cid, tname) in enumerate(rows_todo, 1):
            c = get_contract(cid)
            if c.applies_to(tname):
                left = budget - (time.monotonic() - t0)
                row_budget = max(left / max(remaining, 1), 0.5 * left, 0.5)
                remaining -= 1
            else:
                row_budget = 0.0
            first = c.min_cases if max_cases is None else min(c.min_cases, max_cases)
            r = run_contract(c, tname, profile=profile, budget=row_budget, seed=seed, repro_dir=repro_dir,
                             use_examples=use_examples, max_examples=first,
                             progress=lambda n, i=i, cid=cid, tname=tname: prog.case(i, len(rows_todo), cid,
                                                                                     tname, n))
            results.append(r)
            prog.row(i, len(rows_todo), r)
            save(make_doc(final=False))
        # Pass 2: the rest of the budget, shared by the rows still passing, for more generated cases.
        more = [k for k, r in enumerate(results) if r.status == "pass"]
        for n_left, k in zip(range(len(more), 0, -1), more):
            left = budget - (time.monotonic() - t0)
            if left <= 0.5:
                break
            r0 = results[k]
            c = get_contract(r0.contract)
            r = run_contract(c, r0.target, profile=profile, budget=left / n_left,
                             seed=None if seed is None else seed + 1, repro_dir=repro_dir, use_examples=False,
                             max_examples=max_cases)
            results[k] = _merge(r0, r)
            if results[k].status != "pass":
                prog.row(k + 1, len(rows_todo), results[k])
            save(make_doc(final=False))
    except KeyboardInterrupt:
        save(make_doc(final=False))
        raise
    doc = make_doc(final=True)
    save(doc)
    if junit:
        os.makedirs(os.path.dirname(os.path.abspath(junit)), exist_ok=True)
        with open(junit, "wb") as fh:
            fh.write(reports.audit_junit(doc))
    return doc, (0 if doc["run"]["ok"] else 1)


def _merge(first: RowResult, second: RowResult) -> RowResult:
    """One row from the two passes: cases and time add up; a failure or a harness error of the second pass wins;
    the second pass running out of budget is no loss (the first already reached the minimum)."""
    merged = RowResult(first.contract, first.target, first.status, first.reason, first.cases + second.cases,
                       first.seconds + second.seconds, first.violations, first.repro, first.case)
    if second.status in ("fail", "error"):
        merged.status, merged.reason = second.status, second.reason
        merged.violations, merged.repro, merged.case = second.violations, second.repro, second.case
    return merged


def format_table(doc: dict) -> str:
    rows = doc["results"]
    w = max([len(r["contract"]) for r in rows] + [8])
    out = [f"{'contract':<{w}}  {'target':<8}  {'status':<10}  {'cases':>5}  {'secs':>6}  reason",
           "-" * (w + 50)]
    for r in rows:
        out.append(f"{r['contract']:<{w}}  {r['target']:<8}  {r['status']:<10}  {r['cases']:>5}  "
                   f"{r['seconds']:>6.1f}  {r['reason'][:80]}")
    c = doc["run"]["counts"]
    out.append(f"{sum(c.values())} rows: " + ", ".join(f"{v} {k}" for k, v in c.items() if v)
               + f" in {doc['run']['seconds']:.1f}s -> {'OK' if doc['run']['ok'] else 'FAILED'}")
    return "\n".join(out)
