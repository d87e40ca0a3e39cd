"""The decode benchmarks (every kernel family, the reduce, the torch gather + SDPA baseline, the copy and matmul
ceilings), kept under their old command. They are pytest-benchmark tests in ``tests/benchmarks/bench_decode.py``;
this runs them through ``smv bench`` and prints its table.

    python3 benchmarks/bench_decode.py [--json FILE] [--compare FILE]
"""
import sys

from contracts.cli.bench import cli

if __name__ == "__main__":
    sys.exit(cli(["-k", "bench_decode", *sys.argv[1:]]))
