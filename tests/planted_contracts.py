"""Contracts with planted faults for the campaign tests: a worker process imports this module through
``SMV_CONTRACT_MODULES`` (with this folder on ``PYTHONPATH``), so the faults happen in real worker processes.

Each contract draws plain integers; the fault fires on a value the generator reaches within a few cases and that
a replay of the saved case reaches again. Never imported by the suite itself.
"""
from __future__ import annotations

import ctypes
import os
import time

from hypothesis import strategies as st

from contracts import core


def _small(t):
    return st.integers(0, 40)


@core.contract("planted-abort", cases=_small, min_cases=1, targets=("gfx942",))
def _abort(case, target):
    """Aborts the process on a value that is 7 modulo 10 (stands for a kernel's out-of-bounds abort)."""
    if case % 10 == 7:
        os.abort()
    return []


@core.contract("planted-segv", cases=_small, min_cases=1, targets=("gfx942",))
def _segv(case, target):
    """Reads address 0 on a value that is 7 modulo 10: a real SIGSEGV."""
    if case % 10 == 7:
        ctypes.string_at(0)
    return []


@core.contract("planted-hang", cases=_small, min_cases=1, targets=("gfx942",))
def _hang(case, target):
    """Never returns on a value that is 7 modulo 10 (stands for a kernel that spins)."""
    if case % 10 == 7:
        while True:
            time.sleep(1)
    return []


@core.contract("planted-stuck", cases=_small, min_cases=1, targets=("gfx942",))
def _stuck(case, target):
    """Never returns, whatever the case: a hang that does not depend on which values a Hypothesis version draws."""
    while True:
        time.sleep(1)


@core.contract("planted-lost-device", cases=_small, min_cases=1, targets=("gfx942",))
def _lost_device(case, target):
    """Raises what CUDA raises after a kernel's illegal access, whatever the case (on a GPU the error then sticks to
    the process's context and every later launch fails with it)."""
    raise RuntimeError("CUDA error: an illegal memory access was encountered (planted)")


_WARMED = []


@core.contract("planted-warm", cases=lambda t: st.integers(0, 10 ** 6), min_cases=1, targets=("gfx942", "gfx950"))
def _warm(case, target):
    """Holds on every value; the first case in a process takes 2.5 s (stands for compiling): two workers each take
    one of its two rows and hold it for its second pass, whichever worker becomes ready first."""
    if not _WARMED:
        time.sleep(2.5)
        _WARMED.append(True)
    return []


@core.contract("planted-odd", cases=lambda t: st.integers(0, 10 ** 6), min_cases=1)
def _odd(case, target):
    """Fails on odd integers; the message carries the value, so only a masked signature merges two of them."""
    return [core.Violation(f"odd value {case}", "", "even", str(case))] if case % 2 else []


@core.contract("planted-rare", cases=lambda t: st.integers(0, 2 ** 20), min_cases=1, targets=("gfx942", "gfx950"))
def _rare(case, target):
    """Fails on a value the generator finds only after tens to about a thousand cases (above 4096 and 5 modulo
    211): a second host that replays the first one's saved failure fails on its first case."""
    if case > 4096 and case % 211 == 5:
        return [core.Violation(f"5 modulo 211: {case}", "", "another residue", str(case))]
    return []


@core.contract("planted-slow", cases=lambda t: st.integers(0, 10 ** 6), min_cases=1)
def _slow(case, target):
    """Passes, slowly (stands for a real check's cost)."""
    time.sleep(0.02)
    return []
