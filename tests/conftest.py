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
