"""Print vLLM's releases on the package index from ``--since`` on, oldest first, one line, space-separated (what
``ci/nightly.sh`` audits side by side). Pre-releases and yanked-looking versions that are not PEP 440 are left out.
Exit 1, printing nothing, when the index cannot be read."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys

from packaging.version import InvalidVersion, Version


def releases(since: str, index_output: str) -> list[str]:
    """The final releases listed in ``pip index versions vllm``'s output that are at least ``since``, oldest first."""
    m = re.search(r"Available versions:\s*(.+)", index_output)
    if not m:
        return []
    out = []
    for v in (x.strip() for x in m.group(1).split(",")):
        try:
            parsed = Version(v)
        except InvalidVersion:
            continue
        if not parsed.is_prerelease and not parsed.is_devrelease and parsed >= Version(since):
            out.append(parsed)
    return [str(v) for v in sorted(out)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--since", default="0.22.0", help="the oldest release to list (default 0.22.0)")
    args = ap.parse_args(argv)
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "vllm", "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=120)
    found = releases(args.since, proc.stdout)
    if not found:
        print(f"vllm_releases: no vllm release >= {args.since} listed ({proc.stderr.strip()[-200:]})", file=sys.stderr)
        return 1
    print(" ".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
