import importlib.machinery
import sys
import types

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture
def register():
    """Register test-only contracts (``register(id, check, **contract_kwargs)``) and drop them afterwards."""
    from hypothesis import strategies as st

    from contracts import core

    added = []

    def add(cid, check, **kw):
        kw.setdefault("cases", lambda t: st.integers(0, 10 ** 6))
        core.contract(cid, **kw)(check)
        added.append(cid)
        return core.CONTRACTS[cid]

    yield add
    for cid in added:
        core.CONTRACTS.pop(cid, None)


@pytest.fixture
def fake_module(monkeypatch):
    """``fake_module(name, **attrs)`` puts an importable stand-in module (a package, so submodules resolve) into
    ``sys.modules`` for this test: the fakes of AMD AITER are built from it."""
    def make(name, **attrs):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        for k, v in attrs.items():
            setattr(mod, k, v)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    return make


#: the vLLM release the upstream-subject tests pin (CI caches its extracted tree under $SMV_CACHE)
VLLM_PINNED = "0.33.0"


@pytest.fixture(scope="session")
def vllm_subject():
    """Upstream vLLM as a subject, ``parse_subject("vllm==0.33.0")``: the release wheel (336 MB) is downloaded once
    into the user cache (``$SMV_CACHE``, default ``~/.cache/sparse-mla-verify``) and only the audited modules are
    kept; later sessions reuse them without the network. Skipped, saying why, when it cannot be had."""
    from contracts.subjects import SubjectSpecError, parse_subject

    try:
        return parse_subject(f"vllm=={VLLM_PINNED}")
    except SubjectSpecError as exc:
        pytest.skip(f"the vllm=={VLLM_PINNED} subject is unavailable here: {exc}")


#: rows that run longest, heaviest first: on a cold GPU host they compile the most kernel variants (H200 test step,
#: 2026-12-02, -n 14: each of the decode rows ran for a third to two thirds of the 290 s step, and the one that
#: happened to be collected last started at 285 s); the process tests spawn and kill real workers. Started side by
#: side at the beginning, they keep the step's length near the longest one's, not their sum's.
HEAVY_CONTRACTS = ("decode-oracle-agreement", "decode-paths-agree", "mx-scale-exhaustive", "graph-replay-agreement")
HEAVY_TESTS = ("test_crashes_and_hangs_are_findings_with_reproducers_and_the_campaign_goes_on",
               "test_sigkilled_supervisor_resumes_without_losing_or_recounting_anything",
               "test_a_crashing_or_hanging_worker_is_an_error_row_with_a_reproducer_and_the_rest_pass",
               "test_failing_contract_test_leaves_a_reproducer_that_smv_repro_replays")


def _weight(item) -> int:
    callspec = getattr(item, "callspec", None)
    cid = callspec.params.get("contract_id") if callspec else None
    if cid in HEAVY_CONTRACTS:
        return HEAVY_CONTRACTS.index(cid)
    name = getattr(item, "originalname", item.name)
    return len(HEAVY_CONTRACTS) + (0 if name in HEAVY_TESTS else 1)


def pytest_configure(config):
    """Under xdist, at most two items wait on a worker (``--maxschedchunk 1`` unless given): the load scheduler
    otherwise hands out blocks (a quarter of a worker's share at the start) and never moves a queued item to an
    idle worker, so items queued behind a long row while other workers idled (the H200's test step, 2026-12-02)."""
    if config.pluginmanager.hasplugin("xdist") and getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1
    # the audits tests run record their rows' costs (planted contracts among them) in a file of this run's, not in
    # the user's cost model; subprocesses inherit it
    import os
    import tempfile

    os.environ.setdefault("SMV_COST_MODEL", os.path.join(tempfile.mkdtemp(prefix="smv-costs-"), "audit-costs.json"))


@pytest.hookimpl(trylast=True)  # after -k / -m deselection, so the pairs are of the items that run
def pytest_collection_modifyitems(config, items):
    """The heavy items first, each followed by a light one: xdist's load scheduler (with ``--maxschedchunk 1``, as
    ci/gpu_validate.sh runs it) starts each worker on two consecutive items, so no worker starts on two heavy ones;
    the light items keep pytest's order."""
    heavy = sorted((it for it in items if _weight(it) < len(HEAVY_CONTRACTS) + 1), key=_weight)
    light = [it for it in items if _weight(it) == len(HEAVY_CONTRACTS) + 1]
    paired = [it for pair in zip(heavy, light) for it in pair]
    items[:] = paired + heavy[len(paired) // 2:] + light[len(paired) // 2:]
