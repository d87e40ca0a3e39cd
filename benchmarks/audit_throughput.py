"""Cases per second per row of audits side by side, with each row's compile / kernel / oracle / harness split.

    python benchmarks/audit_throughput.py cpu=CPU/audit.json native=GPU/audit.json [warm=GPU2/audit.json] \\
        [--contract ID]... [--markdown]

Each argument is LABEL=PATH to an audit.json (schema 6 or later: rows carry ``time_split``); the first is the
reference every other column is divided by. A row's rate is its ``cases`` over its ``seconds``; "w/o compile" is
the rate with the row's compile seconds taken out (what a row gets once its kernels are in Triton's cache).
"bound" is the reference row's seconds over its oracle and harness seconds: the speed-up over the reference that a
run with free compiles and kernels would reach if its oracle and harness cost what they cost in the reference (a row
whose bound is under 10 cannot reach 10x the CPU by faster kernels alone). The last lines give each audit's
whole-run rate: all cases over the run's wall seconds, which is what ``--jobs`` moves.
"""
from __future__ import annotations

import argparse
import json
import sys


def load(spec: str) -> tuple[str, dict]:
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise SystemExit(f"audit_throughput: expected LABEL=PATH, got {spec!r}")
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"audit_throughput: {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema_version", 0) < 6:
        raise SystemExit(f"audit_throughput: {path}: not an audit.json of schema 6 or later (no time_split)")
    return label, doc


def rate(cases: int, seconds: float) -> float | None:
    return cases / seconds if cases and seconds > 0 else None


def rows_of(doc: dict) -> dict:
    return {(r["contract"], r["target"]): r for r in doc["results"]
            if r["status"] in ("pass", "known", "fail") and r["cases"]}


def bound(r: dict) -> float | None:
    """The row's seconds over its oracle and harness seconds (None without a split)."""
    ts = r.get("time_split") or {}
    floor = ts.get("oracle", 0.0) + ts.get("harness", 0.0)
    return r["seconds"] / floor if floor > 0 and r["seconds"] > 0 else None


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(audits: list[tuple[str, dict]], contracts=None) -> list[list[str]]:
    ref_label, ref = audits[0]
    ref_rows = rows_of(ref)
    keys = [k for k in ref_rows if not contracts or k[0] in contracts]
    for _, doc in audits[1:]:
        keys += [k for k in rows_of(doc) if k not in keys and (not contracts or k[0] in contracts)]
    head = ["contract", "target"]
    for label, _ in audits:
        head += [f"{label} cases", f"{label} case/s", f"{label} w/o compile", f"{label} split c/k/o/h s"]
        head += [f"{label} / {ref_label}"] if label != ref_label else ["bound"]
    out = [head]
    for k in keys:
        line = [k[0], k[1]]
        base = None
        for label, doc in audits:
            r = rows_of(doc).get(k)
            if r is None:
                line += ["-", "-", "-", "-", "-"]
                continue
            ts = r.get("time_split") or {}
            here = rate(r["cases"], r["seconds"])
            warm = rate(r["cases"], r["seconds"] - ts.get("compile", 0.0))
            split = "/".join(f"{ts.get(x, 0.0):.1f}" for x in ("compile", "kernel", "oracle", "harness"))
            line += [str(r["cases"]), fmt(here), fmt(warm), split]
            if label == ref_label:
                base = here
                line += [fmt(bound(r), 1) + "x" if bound(r) else "-"]
            else:
                line += [fmt(here / base if here and base else None) + "x"]
        out.append(line)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="audit_throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("audits", nargs="+", metavar="LABEL=PATH")
    p.add_argument("--contract", action="append", help="only these contracts (repeatable)")
    p.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = p.parse_args(argv)
    audits = [load(a) for a in args.audits]
    rows = table(audits, args.contract)
    if args.markdown:
        print("| " + " | ".join(rows[0]) + " |")
        print("|" + "---|" * len(rows[0]))
        for r in rows[1:]:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print()
    for label, doc in audits:
        run = doc["run"]
        total = sum(r["cases"] for r in doc["results"])
        print(f"{label}: {total} cases over {run['seconds']:.1f}s wall ({fmt(rate(total, run['seconds']))} cases/s), "
              f"jobs {run.get('jobs', 1)}, {doc['device'].get('name')}, triton {run.get('triton_mode')}, "
              f"counts {', '.join(f'{k} {v}' for k, v in run['counts'].items() if v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
