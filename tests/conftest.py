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
