"""Nsight Compute over the decode split-K kernels, ours beside upstream's, on the same inputs (issue 15 item 3).

    ncu --clock-control none --profile-from-start off --set full -o $OUT/decode \\
        python3 benchmarks/profile_decode.py --batch 64 --rows gfx942:default gfx942:upstream gfx950:default ...
    python3 benchmarks/profile_decode.py --summarize $OUT/decode.csv      # the table, from ncu's CSV export

Every row is called once outside the profiled range (compiles, warms), then once more between
``cudaProfilerStart`` and ``cudaProfilerStop`` in the order given, so ncu's report holds one partial (and one reduce)
per row, in that order. A row is ``family:variant`` with a variant name of ``benchmarks/decode_variants.py`` (its
``VARIANTS`` table) or ``upstream`` (``SMV_BENCH_SUBJECT`` names the tree), or ``flashmla`` (FlashMLA's SM90 sparse
decode on the same inputs, found as ``benchmarks/flashmla.py`` finds it: its kernels are whatever it launches). ``--summarize`` reads ncu's
``--csv --page raw`` export and prints, per kernel launch: duration, DRAM and L1 throughput, achieved occupancy,
registers, local-memory traffic (spills) and the top stall reasons.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: ncu raw metrics the summary prints (name in the table, metric)
METRICS = [
    ("us", "gpu__time_duration.sum"),
    ("dram%", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("l1%", "l1tex__throughput.avg.pct_of_peak_sustained_active"),
    ("sm%", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("occ%", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    ("regs", "launch__registers_per_thread"),
    ("smemKB", "launch__shared_mem_per_block_static"),
    ("dynKB", "launch__shared_mem_per_block_dynamic"),
    ("localMB", "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"),
    ("instM", "smsp__inst_executed.sum"),
    ("ldsectM", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"),
]
#: ncu's stall reasons: warps stalled per issued instruction, by reason (``..._<reason>_per_issue_active.ratio``)
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def _run(rows: list[str], batch: int) -> int:
    import impl  # noqa: F401 - Triton mode first
    import os

    import torch

    import benchmarks.decode_variants as DV

    work = DV.Work(batch, torch.device("cuda"), 64, 128, 512)
    up = None
    calls = []
    for row in rows:
        family, _, name = row.partition(":")
        if name == "upstream":
            if up is None:
                up = DV.Upstream(os.environ["SMV_BENCH_SUBJECT"])
            fn, _ = up.call(work, family)
            calls.append((row, fn, None))
            continue
        if family == "flashmla":  # FlashMLA's SM90 sparse decode on the same cache bytes and index lists
            col, mod = DV.flashmla_column(False, print)
            if mod is None:
                raise SystemExit(f"row {row}: FlashMLA is not available here")
            fn, _ = col.workload_call(mod, work.w)
            calls.append((row, fn, None))
            continue
        fields = dict(DV.VARIANTS[family])[name]
        run, _, _, _ = work.ours(family)
        calls.append((row, run, (family, name, fields)))

    def call(entry):
        row, fn, var = entry
        if var is None:
            return fn()
        with DV.variant_active(*var):
            return fn()

    for e in calls:  # compile and warm, outside the profiled range
        call(e)
        call(e)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for e in calls:
        torch.cuda.nvtx.range_push(e[0])
        call(e)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.profiler.stop()
    print("profiled rows, in order: " + ", ".join(e[0] for e in calls))
    return 0


def _num(s: str):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def summarize(path: Path) -> str:
    """The table of ncu's ``--csv --page raw`` export at ``path``."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    # ncu's raw CSV: a header row of metric names, a row of units, then one row per launch
    head = rows[0]
    units = rows[1] if len(rows) > 1 and rows[1] and not rows[1][0].strip().isdigit() else None
    data = rows[2:] if units else rows[1:]
    col = {h: i for i, h in enumerate(head)}
    unit = {h: (units[i] if units else "") for h, i in col.items()}
    lines = []
    hdr = (f"{'kernel':<44} " + " ".join(f"{n:>8}" for n, _ in METRICS)
           + "  top stalls (warps stalled per issued instruction)")
    lines.append(hdr)
    for r in data:
        name = r[col["Kernel Name"]] if "Kernel Name" in col else r[0]
        vals = []
        for n, m in METRICS:
            v = _num(r[col[m]]) if m in col else None
            u = unit.get(m, "")
            if v is not None and n == "us":
                v = v / 1e3 if u == "nsecond" else (v * 1e3 if u == "msecond" else v)
            if v is not None and n in ("smemKB", "dynKB"):
                v = v / 1024 if u in ("byte", "") else v
            if v is not None and n == "localMB":
                v = v / 1e6 if u in ("byte", "") else (v / 1e3 if u == "Kbyte" else v)
            if v is not None and n in ("instM", "ldsectM"):
                v = v / 1e6
            vals.append("-" if v is None else (f"{v:.1f}" if abs(v) < 1e5 else f"{v:.3g}"))
        stalls = []
        for h, i in col.items():
            if h.startswith(STALL_PREFIX) and h.endswith(STALL_SUFFIX):
                v = _num(r[i])
                if v:
                    stalls.append((v, h[len(STALL_PREFIX):-len(STALL_SUFFIX)]))
        stalls.sort(reverse=True)
        top = ", ".join(f"{k} {v:.1f}" for v, k in stalls[:4])
        lines.append(f"{name[:44]:<44} " + " ".join(f"{v:>8}" for v in vals) + "  " + top)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rows", nargs="*", default=["gfx942:default", "gfx942:upstream", "gfx950:default",
                                                 "gfx950:upstream"])
    p.add_argument("--summarize", type=Path, default=None, help="print the table of an ncu raw CSV export")
    a = p.parse_args(argv)
    if a.summarize:
        print(summarize(a.summarize))
        return 0
    return _run(a.rows, a.batch)


if __name__ == "__main__":
    sys.exit(main())
