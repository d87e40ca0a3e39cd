"""Campaign throughput: the same `smv fuzz` campaign run with several worker counts, side by side.

Each run starts cold (its own Triton cache and example database, so no run profits from another's compiled
kernels or saved cases) and gets the same budget, seed and rows. Prints cases per second per run, the speed-up
over the first worker count, and each worker's own rate; `--json FILE` keeps everything.

    python benchmarks/fuzz_throughput.py --budget 60 --jobs 1 2               # this host's cores
    python benchmarks/fuzz_throughput.py --budget 90 --jobs 1 4 --contract decode-oracle-agreement   # one GPU
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

DEFAULT_CONTRACTS = ("decode-oracle-agreement", "graph-replay-agreement", "prefill-oracle-agreement",
                     "cache-layout-roundtrip", "ue8m0-codec-exact", "split-bounds")


def run(jobs: int, budget: float, contracts, targets, seed: int, round_s: float, work: str) -> dict:
    rep = os.path.join(work, f"jobs{jobs}")
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(work, f"triton-cache-{jobs}"))
    cmd = [sys.executable, "-m", "contracts.cli", "fuzz", "--budget", str(budget), "--round", str(round_s),
           "--jobs", str(jobs), "--seed", str(seed), "--report", rep, "--database", os.path.join(work, f"db{jobs}")]
    for c in contracts:
        cmd += ["--contract", c]
    for t in targets:
        cmd += ["--target", t]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    with open(os.path.join(rep, "campaign.json")) as fh:
        doc = json.load(fh)
    cases = sum(doc["cases"].values())
    return {"jobs": jobs, "exit": proc.returncode, "wall": round(wall, 1), "seconds": doc["seconds"],
            "cases": cases, "cases_per_second": round(cases / doc["seconds"], 3) if doc["seconds"] else None,
            "items": doc["items"], "failures": len(doc["failures"]), "workers": doc["workers"],
            "rows": doc["throughput"]["rows"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=60.0)
    p.add_argument("--round", type=float, default=None, help="seconds per round (default: the budget / 2)")
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--contract", action="append")
    p.add_argument("--target", action="append")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    contracts = args.contract or list(DEFAULT_CONTRACTS)
    targets = args.target or ["gfx942", "gfx950", "generic"]
    results = []
    with tempfile.TemporaryDirectory(prefix="smv-fuzz-tp-") as work:
        for j in args.jobs:
            r = run(j, args.budget, contracts, targets, args.seed, args.round or args.budget / 2, work)
            results.append(r)
            print(f"jobs {j}: {r['cases']} cases in {r['seconds']}s = {r['cases_per_second']} cases/s "
                  f"({r['items']} rows, {r['failures']} failures, exit {r['exit']})", flush=True)
    base = results[0]["cases_per_second"] or 0
    print("\n| jobs | cases | seconds | cases/s | speed-up | per worker cases/s |\n|---|---|---|---|---|---|")
    for r in results:
        per = ", ".join(f"{w['id']} {w['device']} {w['cases_per_second']}" for w in r["workers"])
        up = f"{r['cases_per_second'] / base:.2f}" if base and r["cases_per_second"] else "-"
        print(f"| {r['jobs']} | {r['cases']} | {r['seconds']} | {r['cases_per_second']} | {up} | {per} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"contracts": contracts, "targets": targets, "budget": args.budget, "results": results}, fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
