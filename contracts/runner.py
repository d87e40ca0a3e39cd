"""Runs one contract on one target under a Hypothesis profile and a time budget, and replays saved cases."""
from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass, field

from hypothesis import given, settings

from contracts.core import Contract, Violation
from fuzz.profiles import profile_settings
from impl.targets import Target, get_target

REPRO_SCHEMA_VERSION = 1


@dataclass
class RowResult:
    contract: str
    target: str
    status: str  # pass | fail | error | skipped | incomplete
    reason: str = ""
    cases: int = 0
    seconds: float = 0.0
    violations: list[Violation] = field(default_factory=list)
    repro: str | None = None
    case: object = None

    def as_json(self) -> dict:
        return {"contract": self.contract, "target": self.target, "status": self.status, "reason": self.reason,
                "cases": self.cases, "seconds": round(self.seconds, 3),
                "violations": [v.as_json() for v in self.violations], "repro": self.repro}


class _Falsified(Exception):
    pass


def checked(contract: Contract, case, target: Target) -> list[Violation]:
    """Run the check; an exception raised by the code under test is itself a violation (with its location)."""
    try:
        out = contract.check(case, target)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - a crash of the code under test is a finding
        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""
        return [Violation(f"check raised {type(exc).__name__}: {exc}", where, "no exception", type(exc).__name__)]
    if out is None:
        raise TypeError(f"contract {contract.id}: check returned None; it must return a list of Violation")
    return list(out)


def write_repro(path: str, contract: Contract, target: Target, case, violations: list[Violation]) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    doc = {"schema_version": REPRO_SCHEMA_VERSION, "contract": contract.id, "target": target.name,
           "case": case, "violations": [v.as_json() for v in violations]}
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, default=repr)
    return path


def run_contract(contract: Contract, target: "Target | str", *, profile: str = "ci", budget: float = 60.0,
                 seed: int | None = None, repro_dir: str | None = None, progress=None,
                 use_examples: bool = True, max_examples: int | None = None) -> RowResult:
    """Check ``contract`` on ``target``: pinned examples first, then generated cases until the profile's count or
    the budget runs out, shrinking any failure. ``progress(n_cases)`` is called after each case.
    ``use_examples=False`` skips the pinned examples (the zoo uses it: kills must come from the generator).
    ``max_examples`` overrides the profile's count (the budget still bounds the row)."""
    t = get_target(target)
    row = RowResult(contract.id, t.name, "pass")
    if not contract.applies_to(t):
        row.status, row.reason = "skipped", contract.skip_reason
        return row
    start = time.monotonic()
    deadline = start + budget
    state: dict = {"cases": 0, "generated": 0, "failing": None}

    def record(case, violations):
        state["failing"] = (case, violations)

    try:
        for case in (contract.examples(t) if contract.examples and use_examples else []):
            v = checked(contract, case, t)
            state["cases"] += 1
            if v:
                record(case, v)
                break
        if state["failing"] is None:
            base = profile_settings(profile)
            n = base.max_examples if max_examples is None else max_examples
            n = n if contract.max_cases is None else min(n, contract.max_cases)
            grace = max(10.0, budget * 0.5)

            @settings(base, max_examples=n)
            @given(contract.cases(t))
            def _property(case):
                now = time.monotonic()
                if state["failing"] is None and now > deadline:
                    return  # budget spent: stop checking, let Hypothesis wind down
                if state["failing"] is not None and now > deadline + grace:
                    return  # stop shrinking; the last failing case stands
                v = checked(contract, case, t)
                if state["failing"] is None:
                    state["cases"] += 1
                    state["generated"] += 1
                    if progress:
                        progress(state["cases"])
                if v:
                    record(case, v)
                    raise _Falsified(str(v[0]))

            if seed is not None:
                from hypothesis import seed as hseed

                _property = hseed(seed)(_property)
            try:
                _property()
            except _Falsified:
                pass
            except Exception as exc:  # Hypothesis' own errors (flaky replay after the shrink cut-off, ...)
                if state["failing"] is None:
                    raise exc
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - harness failure, not a contract verdict
        row.status = "error"
        row.reason = f"{type(exc).__name__}: {exc}"
        row.seconds = time.monotonic() - start
        row.cases = state["cases"]
        return row

    row.seconds = time.monotonic() - start
    row.cases = state["cases"]
    if state["failing"] is not None:
        case, violations = state["failing"]
        row.status = "fail"
        row.case = case
        row.violations = violations
        row.reason = str(violations[0]) if violations else "failed"
        if repro_dir is not None:
            row.repro = write_repro(os.path.join(repro_dir, f"repro-{contract.id}-{t.name}.json"),
                                    contract, t, case, violations)
    elif state["generated"] < contract.min_cases:  # pinned examples do not count: the generator must have run
        row.status = "incomplete"
        row.reason = (f"only {state['generated']} of at least {contract.min_cases} generated cases ran within "
                      f"{budget:.1f}s")
    return row


def replay(path: str) -> tuple[Contract, Target, object, list[Violation]]:
    """Re-run the case saved in a repro file; returns the violations it gives now."""
    from contracts.registry import get_contract

    with open(path) as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or "contract" not in doc or "case" not in doc:
        raise ValueError(f"{path}: not an smv repro file (needs 'contract', 'target' and 'case')")
    c = get_contract(doc["contract"])
    t = get_target(doc["target"])
    return c, t, doc["case"], checked(c, doc["case"], t)
