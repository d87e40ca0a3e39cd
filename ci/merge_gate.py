#!/usr/bin/env python3
"""Merge gate: turn an ``audit.json`` into a verdict (exit 0 = mergeable).

A row blocks the merge when its status is fail, error or incomplete; so does a report in which no row passed (all
skipped) unless ``--allow-empty``. A ``known`` row (every violation it met is a recorded finding, findings.toml) is
accepted like a pass: a new violation would have made it ``fail``. ``--require-contract`` / ``--require-target`` also
block when a named contract or target is missing from the report or has no passing (or known) row, so a gate cannot
pass by running less. Rows of a subject other than ours name it.
Standard library only: the gate runs where the suite may not be installed.
"""
from __future__ import annotations

import argparse
import json
import sys

#: audit.json versions this gate reads: 2 only adds fields to 1, 3 adds subjects and the status known, 4 adds each
#: row's reach (a ci row missing a declared pair is already `incomplete`), 5 each row's first_violation, 6 each
#: row's time_split (where its seconds went; no verdict depends on it), 7 each row's specializations (distinct
#: Triton binaries per kernel; no verdict depends on it either), 8 run.jobs (the worker processes that ran the rows),
#: 9 what the stand-ins served each subject and the findings lifecycle across subjects (no verdict depends on them)
SUPPORTED_SCHEMAS = (1, 2, 3, 4, 5, 6, 7, 8, 9)
BLOCKING = ("fail", "error", "incomplete")
#: verdicts that count as a row having checked something and held (or matched only known findings)
ACCEPTED = ("pass", "known")


def _where(r) -> str:
    s = r.get("subject") or {}
    under = "" if s.get("name", "ours") == "ours" else f" under {s.get('name')}=={s.get('version')}"
    return f"{r['contract']} on {r['target']}{under}"


def _statuses(rows, limit: int = 6) -> str:
    shown = ", ".join(f"{_where(r)}: {r['status']}" for r in rows[:limit])
    return shown + (f" and {len(rows) - limit} more" if len(rows) > limit else "")


def verdict(doc: dict, require_contracts=(), require_targets=(), *, allow_empty: bool = False
            ) -> tuple[bool, list[str]]:
    problems: list[str] = []
    if doc.get("schema_version") not in SUPPORTED_SCHEMAS:
        return False, [f"unsupported audit.json schema_version {doc.get('schema_version')!r} "
                       f"(this gate reads {', '.join(map(str, SUPPORTED_SCHEMAS))})"]
    rows = doc.get("results", [])
    if not rows:
        problems.append("the audit ran no rows")
    for r in rows:
        if r["status"] in BLOCKING:
            line = f"{_where(r)}: {r['status']}: {r['reason']}"
            if r.get("repro"):
                line += f" (replay: smv repro {r['repro']})"
            problems.append(line)
    if rows and not allow_empty and not any(r["status"] in ACCEPTED for r in rows):
        problems.append(f"no row passed ({_statuses(rows)}): the audit checked nothing "
                        f"(--allow-empty accepts that)")
    for key, kind, wanted in (("contract", "contract", require_contracts), ("target", "target", require_targets)):
        for name in wanted:
            mine = [r for r in rows if r.get(key) == name]
            if not mine:
                problems.append(f"required {kind} {name} is not in the report")
            elif not any(r["status"] in ACCEPTED for r in mine):
                problems.append(f"required {kind} {name} has no passing row ({_statuses(mine)})")
    return not problems, problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("audit_json")
    p.add_argument("--require-contract", action="append", default=[])
    p.add_argument("--require-target", action="append", default=[])
    p.add_argument("--allow-empty", action="store_true", help="accept a report in which no row passed")
    args = p.parse_args(argv)
    try:
        with open(args.audit_json) as fh:
            doc = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"merge gate: cannot read {args.audit_json}: {exc}", file=sys.stderr)
        return 2
    ok, problems = verdict(doc, args.require_contract, args.require_target, allow_empty=args.allow_empty)
    counts: dict[str, int] = {}
    for r in doc.get("results", []):
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"merge gate: {'PASS' if ok else 'BLOCK'} ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))})")
    for line in problems:
        print(f"  - {line}")
    for r in doc.get("results", []):
        if r.get("status") == "known":
            print(f"  known: {_where(r)}: {', '.join(r.get('findings') or []) or r.get('reason', '')}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
