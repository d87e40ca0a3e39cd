"""Host-side cost of ``SparseMLAMetadataBuilder.build()``, partition cache hit vs miss, kept under its old command.
It is a pytest-benchmark test in ``tests/benchmarks/bench_metadata.py``; this runs it through ``smv bench``.

    python3 benchmarks/bench_metadata.py [--json FILE] [--compare FILE]
"""
import sys

from contracts.cli.bench import cli

if __name__ == "__main__":
    sys.exit(cli(["-k", "bench_metadata", *sys.argv[1:]]))
