"""What Hypothesis's case generation alone costs per case, per kernel contract and target: the floor of a row's
harness, which no GPU removes.

    python benchmarks/generation_floor.py [--contract ID]... [--cases N] [--reference CPU/audit.json] [--json F]

Each row draws N cases from the contract's own strategy (``Contract.cases(target)``) through ``@given`` in
Hypothesis's generate phase, with no check, no input tensors and no example database, and reports milliseconds per
case. With ``--reference`` (an audit.json, schema 6 or later) it divides that row's seconds per case by the
generation floor: the most a native run of the same cases could gain over the reference if kernels, compiles,
oracles and the rest of the harness were free ("gen bound"), beside audit_throughput.py's harness bound. A row whose gen bound is under 10 cannot reach 10x
the reference without cheaper generation (fewer draws per case), however fast everything else becomes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: the kernel contracts benchmarks/GPU_THROUGHPUT.md measures natively and on the CPU
KERNEL_CONTRACTS = ("decode-oracle-agreement", "graph-replay-agreement", "decode-paths-agree", "decode-reduce-oracle",
                    "prefill-oracle-agreement", "indexer-logits-agreement", "writer-oracle-exact",
                    "indexer-writer-exact", "gather-oracle-exact", "epilogue-oracle-agreement",
                    "dsv4-step-agreement")


def generation_ms(strategy, cases: int, seed: int = 0) -> tuple[float, int]:
    """(milliseconds per generated case, cases generated) for ``cases`` draws of ``strategy``, after two untimed
    draws (the strategy's first use builds it and imports what it needs)."""
    from hypothesis import HealthCheck, Phase, given, settings

    drawn = [0]

    def runner(n):
        @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def draw(case):
            drawn[0] += 1

        draw._hypothesis_internal_use_seed = seed
        return draw

    runner(2)()
    drawn[0] = 0
    timed = runner(cases)
    t0 = time.perf_counter()
    timed()
    dt = time.perf_counter() - t0
    if not drawn[0]:
        raise RuntimeError("the strategy generated no case")
    return dt * 1e3 / drawn[0], drawn[0]


def _audit_throughput():
    """benchmarks/audit_throughput.py, which reads audit.json and gives each row its harness bound."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("audit_throughput", Path(__file__).with_name("audit_throughput.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference_rows(path: str) -> dict:
    """``{(contract, target): (seconds per case, harness bound or None)}`` of an audit.json's rows that checked
    cases (audit_throughput.py's reading of it, schema 6 or later)."""
    at = _audit_throughput()
    _, doc = at.load(f"reference={path}")
    return {k: (r["seconds"] / r["cases"], at.bound(r)) for k, r in at.rows_of(doc).items() if r["seconds"] > 0}


def measure(contract_ids, cases: int, reference: dict | None = None, progress=None) -> list[dict]:
    from contracts.registry import get_contract
    from impl.targets import get_target

    rows = []
    for cid in contract_ids:
        c = get_contract(cid)
        for t in c.targets:
            ms, n = generation_ms(c.cases(get_target(t)), cases)
            row = {"contract": cid, "target": t, "cases": n, "generation_ms": ms}
            if reference is not None and (cid, t) in reference:
                per_case, harness_bound = reference[(cid, t)]
                row["reference_ms"] = per_case * 1e3
                row["gen_bound"] = per_case * 1e3 / ms
                row["harness_bound"] = harness_bound
            rows.append(row)
            if progress:
                progress(row)
    return rows


def line(row: dict) -> str:
    ref = f"{row['reference_ms']:>10.1f}" if "reference_ms" in row else f"{'-':>10}"
    bound = f"{row['gen_bound']:>9.1f}" if "gen_bound" in row else f"{'-':>9}"
    hb = f"{row['harness_bound']:>13.1f}" if row.get("harness_bound") is not None else f"{'-':>13}"
    return (f"{row['contract']:<27} {row['target']:<8} {row['cases']:>5} {row['generation_ms']:>8.2f} {ref} {bound}"
            f" {hb}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contract", action="append", help="a contract id (repeatable; default: the kernel contracts)")
    p.add_argument("--cases", type=int, default=60, help="cases drawn per row (default 60)")
    p.add_argument("--reference", help="an audit.json whose rows' seconds per case are divided by the floor")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    if args.cases < 1:
        p.error("--cases must be at least 1")
    ids = args.contract or list(KERNEL_CONTRACTS)
    try:
        from contracts.registry import get_contract

        for cid in ids:
            get_contract(cid)
    except ValueError as exc:
        p.error(str(exc))
    ref = reference_rows(args.reference) if args.reference else None
    print(f"{'contract':<27} {'target':<8} {'cases':>5} {'gen ms':>8} {'ref ms':>10} {'gen bound':>9} {'harness bound':>13}", flush=True)
    rows = measure(ids, args.cases, ref, progress=lambda r: print(line(r), flush=True))
    if ref is not None:
        under = [r for r in rows if r.get("gen_bound", 99) < 10]
        print(f"{len(under)} of {sum('gen_bound' in r for r in rows)} rows have a generation bound under 10")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
