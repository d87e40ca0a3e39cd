"""Every registered contract, on every emulated target, under the ci profile: `pytest` alone proves the suite.
Each row runs its pinned examples and its covering array (every declared pair, or the contract's minimum where that
is more); the profile's random cases after the array are `smv audit --profile ci`'s (the pull-request pipeline),
which keeps plain pytest within ten minutes on 2 cores. A failing row writes its reproducer under
``--smv-repro-dir`` and its failure ends with the ``smv repro`` line."""
import pytest

from contracts.plugin import row_failure
from contracts.registry import load_all
from contracts.engine.runner import run_contract

CONTRACTS = load_all()

# generous: the rows are bounded by the ci profile's example count, the budget only guards against hangs (a cold GPU
# compiles a kernel variant per covering-array row: gfx950's decode row ran out of 120 s on an H200 doing so)
ROW_BUDGET = 300.0


#: contracts that judge a subject against ours (subject-agreement): skipped on ours by design, judged on the vllm
#: subject in tests/test_vllm_decode.py
OURS_CONTRACTS = sorted(cid for cid, c in CONTRACTS.items() if not c.extra.get("skipped_on_ours"))


@pytest.mark.parametrize("contract_id", OURS_CONTRACTS)
def test_contract_holds(contract_id, target, smv_repro_dir):
    c = CONTRACTS[contract_id]
    row = run_contract(c, target, profile="ci", budget=ROW_BUDGET, repro_dir=smv_repro_dir,
                       max_examples=max(c.min_cases, 1))
    if row.status == "skipped":
        assert not c.applies_to(target)
        pytest.skip(f"{contract_id} does not apply to {target.name}: {row.reason}")
    if row.status != "pass":
        pytest.fail(row_failure(row), pytrace=False)
    assert row.cases >= c.min_cases


def test_every_contract_is_documented_and_has_a_planted_bug():
    from contracts.zoo.runner import UPSTREAM_CATALOG_DIR, load_catalog, load_catalogs

    # ours' catalogs, plus the upstream ones: subject-agreement judges a subject against ours, so its planted bug
    # lives in a subject's source
    expected = {c for m in load_catalogs() for c in m.expect}
    expected |= {c for p in sorted(UPSTREAM_CATALOG_DIR.glob("*.toml")) for m in load_catalog(p) for c in m.expect}
    for cid, c in CONTRACTS.items():
        assert c.doc.strip(), cid
        assert cid in expected, f"contract {cid} has no zoo entry proving it can fail"


def test_every_contract_has_a_typed_case_family():
    """Reproducers are read back through the case type: a contract without one could not be replayed strictly."""
    from fuzz.cases import Case
    from impl.targets import TARGETS

    for cid, c in CONTRACTS.items():
        assert isinstance(c.case_type, type) and issubclass(c.case_type, Case) and c.case_type.KIND, cid
        for t in c.targets:
            for ex in (c.examples(TARGETS[t]) if c.examples else []):
                assert isinstance(ex, c.case_type), (cid, t, type(ex))
                assert c.case_type.from_json(ex.to_json()).to_json() == ex.to_json(), (cid, t)
