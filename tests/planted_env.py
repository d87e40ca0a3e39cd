"""The environment of a real ``smv`` subprocess that loads tests/planted_contracts.py into its workers (through
``SMV_CONTRACT_MODULES``, with this folder on ``PYTHONPATH``), shared by the campaign and audit-pool tests. Not a
test module; importing it registers nothing."""
from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def planted_env(**extra) -> dict:
    """``os.environ`` plus the planted contracts, without ``CI`` (so the subprocess picks its own profile), plus
    ``extra``."""
    env = dict(os.environ, SMV_CONTRACT_MODULES="planted_contracts",
               PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("CI", None)
    env.update(extra)
    return env
