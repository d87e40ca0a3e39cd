"""Which launch arguments multiply a kernel contract's Triton specializations (benchmarks/GPU_THROUGHPUT.md).

Runs each named contract on one target for a fixed number of generated cases (the audit's own runner, under the
interpreter the keys are predicted from the launch arguments: contracts/engine/specializations.py), then prints per
kernel the distinct keys, the launches, and each parameter whose specialization varies, with its distinct values.

    .venv/bin/python benchmarks/specializations.py --contract decode-oracle-agreement --target gfx942 \
        --max-cases 40 --seed 1 [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def measure(contract_id: str, target: str, max_cases: int, seed: int, profile: str = "dev",
            budget: float = 600.0) -> dict:
    """One row's figures: cases, seconds, cases/s, ``{kernel: {"keys", "launches", "varying": {param: n}}}``."""
    from contracts.engine import specializations as sp
    from contracts.engine.audit import run_audit

    sp.reset_process_keys()
    t0 = time.monotonic()
    doc, _ = run_audit([contract_id], [target], budget=budget, seed=seed, profile=profile, max_cases=max_cases,
                       progress=False)
    seconds = time.monotonic() - t0
    (row,) = doc["results"]
    kernels = {}
    for kernel, entries in sorted(sp.process_keys().items()):
        keys = [k for k, _ in entries]
        tupled = [k for k in keys if isinstance(k, tuple)]
        kernels[kernel] = {"keys": len(keys), "launches": sum(n for _, n in entries),
                           "varying": sp.varying_parameters(tupled) if tupled else {},
                           "values": _values(tupled)}
    return {"contract": contract_id, "target": target, "status": row["status"], "cases": row["cases"],
            "seconds": round(seconds, 2), "cases_per_s": round(row["cases"] / seconds, 3) if seconds else None,
            "row_specializations": row["specializations"], "kernels": kernels}


def _values(keys) -> dict:
    seen: dict = {}
    for k in keys:
        for name, val in k:
            seen.setdefault(name, [])
            if repr(val) not in seen[name]:
                seen[name].append(repr(val))
    return {n: v for n, v in seen.items() if len(v) > 1}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contract", action="append", required=True)
    ap.add_argument("--target", action="append", default=None)
    ap.add_argument("--max-cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", default="dev")
    ap.add_argument("--values", action="store_true", help="print each varying parameter's distinct values")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import impl  # noqa: F401 - picks the Triton mode before Triton loads

    out = []
    for cid in a.contract:
        for t in a.target or ["gfx942"]:
            r = measure(cid, t, a.max_cases, a.seed, a.profile)
            out.append(r)
            print(f"{cid} {t}: {r['status']}, {r['cases']} cases in {r['seconds']} s ({r['cases_per_s']} cases/s)")
            for kernel, k in r["kernels"].items():
                vary = ", ".join(f"{p} x{n}" for p, n in sorted(k["varying"].items(), key=lambda x: -x[1]))
                print(f"  {kernel}: {k['keys']} keys / {k['launches']} launches; varying: {vary or '-'}")
                if a.values:
                    for p, vals in k["values"].items():
                        print(f"      {p}: {' | '.join(vals)[:300]}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
