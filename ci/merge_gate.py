#!/usr/bin/env python3
"""Merge gate: turn an ``audit.json`` into a verdict (exit 0 = mergeable).

A row blocks the merge when its status is fail, error or incomplete. ``--require-contract`` / ``--require-target``
also block when a named contract or target is missing from the report or was only skipped, so a gate cannot pass by
running less. Standard library only: the gate runs where the suite may not be installed.
"""
from __future__ import annotations

import argparse
import json
import sys

SUPPORTED_SCHEMA = 1
BLOCKING = ("fail", "error", "incomplete")


def verdict(doc: dict, require_contracts=(), require_targets=()) -> tuple[bool, list[str]]:
    problems: list[str] = []
    if doc.get("schema_version") != SUPPORTED_SCHEMA:
        return False, [f"unsupported audit.json schema_version {doc.get('schema_version')!r} "
                       f"(this gate reads {SUPPORTED_SCHEMA})"]
    rows = doc.get("results", [])
    if not rows:
        problems.append("the audit ran no rows")
    for r in rows:
        if r["status"] in BLOCKING:
            line = f"{r['contract']} on {r['target']}: {r['status']}: {r['reason']}"
            if r.get("repro"):
                line += f" (replay: smv repro {r['repro']})"
            problems.append(line)
    ran = {(r["contract"], r["target"]) for r in rows if r["status"] == "pass"}
    for c in require_contracts:
        if not any(rc == c for rc, _ in ran):
            problems.append(f"required contract {c} did not pass on any target")
    for t in require_targets:
        if not any(rt == t for _, rt in ran):
            problems.append(f"required target {t} has no passing row")
    return not problems, problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("audit_json")
    p.add_argument("--require-contract", action="append", default=[])
    p.add_argument("--require-target", action="append", default=[])
    args = p.parse_args(argv)
    try:
        with open(args.audit_json) as fh:
            doc = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"merge gate: cannot read {args.audit_json}: {exc}", file=sys.stderr)
        return 2
    ok, problems = verdict(doc, args.require_contract, args.require_target)
    counts: dict[str, int] = {}
    for r in doc.get("results", []):
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"merge gate: {'PASS' if ok else 'BLOCK'} ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))})")
    for line in problems:
        print(f"  - {line}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
