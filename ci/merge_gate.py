#!/usr/bin/env python3
"""Merge gate: turn an ``audit.json`` into a verdict (exit 0 = mergeable).

A row blocks the merge when its status is fail, error or incomplete; so does a report in which no row passed (all
skipped) unless ``--allow-empty``. A ``known`` row (every violation it met is a recorded finding, findings.toml) is
accepted like a pass: a new violation would have made it ``fail``. ``--require-contract`` / ``--require-target`` also
block when a named contract or target is missing from the report or has no passing (or known) row, so a gate cannot
pass by running less. Rows of a subject other than ours name it.

Reach (audit.json 12: each failing row's ``reach_class``). For a subject other than ours (upstream vLLM), a failing
row blocks only when its case lies in a gated reach - by default ``production`` and ``caller-contract``
(``--gate-reach`` chooses); an ``adversarial`` one (corrupt or foreign data) is listed as a hardening note and does
not block. A failing row without a reach class (an older report, a family that declares no domain) blocks. For ours
nothing loosens: our implementation keeps every promise at every reach.
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
#: 9 what the stand-ins served each subject and the findings lifecycle across subjects (no verdict depends on them),
#: 10 run.changed_since (--changed-since REF: the rows a change selected; a report it selected nothing for has no
#: rows and passes), 11 run.plan (the audit's estimate and actual seconds; no verdict depends on it), 12 each row's
#: reach_class (how production reaches its failing case: the gate's reach policy for upstream subjects)
SUPPORTED_SCHEMAS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
REACH_CLASSES = ("production", "caller-contract", "adversarial")
#: the reaches that block an upstream subject's failing row by default
DEFAULT_GATE_REACH = ("production", "caller-contract")
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


def _hardening(r, gate_reach) -> bool:
    """An upstream subject's failing row whose case lies outside every gated reach: a note, not a block."""
    ours = (r.get("subject") or {}).get("name", "ours") == "ours"
    return (not ours and r["status"] == "fail" and r.get("reach_class") in REACH_CLASSES
            and r["reach_class"] not in gate_reach)


def hardening_notes(doc: dict, gate_reach=DEFAULT_GATE_REACH) -> list[str]:
    return [f"{_where(r)}: {r['reach_class']}: {r['reason']}" for r in doc.get("results", [])
            if _hardening(r, gate_reach)]


def verdict(doc: dict, require_contracts=(), require_targets=(), *, allow_empty: bool = False,
            gate_reach=DEFAULT_GATE_REACH) -> tuple[bool, list[str]]:
    problems: list[str] = []
    if doc.get("schema_version") not in SUPPORTED_SCHEMAS:
        return False, [f"unsupported audit.json schema_version {doc.get('schema_version')!r} "
                       f"(this gate reads {', '.join(map(str, SUPPORTED_SCHEMAS))})"]
    rows = doc.get("results", [])
    nothing_changed = (doc.get("run") or {}).get("changed_since", {}).get("selected") == []
    if not rows and not nothing_changed:
        problems.append("the audit ran no rows")
    for r in rows:
        if r["status"] in BLOCKING and not _hardening(r, gate_reach):
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
    p.add_argument("--gate-reach", default=",".join(DEFAULT_GATE_REACH), metavar="R[,R]",
                   help="the reaches whose failing rows block for a subject other than ours (default "
                        "production,caller-contract; 'all' adds adversarial); ours always blocks on every reach")
    args = p.parse_args(argv)
    gate_reach = REACH_CLASSES if args.gate_reach.strip() == "all" else tuple(
        x.strip() for x in args.gate_reach.split(",") if x.strip())
    bad = [x for x in gate_reach if x not in REACH_CLASSES]
    if bad or not gate_reach:
        print(f"merge gate: --gate-reach: expected some of {', '.join(REACH_CLASSES)} or all, got "
              f"{args.gate_reach!r}", file=sys.stderr)
        return 2
    try:
        with open(args.audit_json) as fh:
            doc = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"merge gate: cannot read {args.audit_json}: {exc}", file=sys.stderr)
        return 2
    ok, problems = verdict(doc, args.require_contract, args.require_target, allow_empty=args.allow_empty,
                           gate_reach=gate_reach)
    counts: dict[str, int] = {}
    for r in doc.get("results", []):
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"merge gate: {'PASS' if ok else 'BLOCK'} ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))})")
    for line in problems:
        print(f"  - {line}")
    notes = hardening_notes(doc, gate_reach)
    if notes:
        print(f"  {len(notes)} hardening note{'s' if len(notes) > 1 else ''} (failing rows whose cases lie outside "
              f"the gated reaches {', '.join(gate_reach)}; they do not block):")
        for line in notes:
            print(f"    - {line}")
    for r in doc.get("results", []):
        if r.get("status") == "known":
            print(f"  known: {_where(r)}: {', '.join(r.get('findings') or []) or r.get('reason', '')}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
