"""Every contract family whose entry points take tensors declares a memory-layout dimension (issue 30 item 1,
DESIGN.md "Fuzzing": every tensor input has a declared layout dimension): a dimension whose name contains
"layout". Families without tensor inputs are exempt, each with its reason; families still being given one are in a
named pending set (expected to fail until done: xfail, so they show as XPASS once they declare one and the lead can
remove them). Removing a family's layout dimension fails this test."""
import importlib

import pytest

from contracts import registry
from fuzz import dimensions

#: families whose entry points take no tensor (or whose every case is one fixed layout), and why
EXEMPT = {
    "splits": "the split selectors take counts (batch, heads, numel, CU count), no tensor",
    "layer-rope": "inverse_rope_plan takes token counts and flags, no tensor",
    "int64-probes": "each probe is one layout by construction (a view whose byte offsets pass 2^31); there is no "
                    "other layout of the same probe to vary",
    "bad-input": "its cases are malformed calls; a non-contiguous view is one of the breakages it draws per argument",
}
#: families whose entry point's layouts another family declares (the same function, other value regimes)
COVERED_BY = {
    "nan-free-cache": "cache-writers",  # compress_norm_rope_store; writer-oracle-exact draws its input layouts
}
#: families another engineer is giving a layout dimension (issue 30): expected to pass once done
PENDING_OTHER: set = set()
#: families of this task's scope not given one yet (the lead removes an entry once its family declares one)
PENDING: set = set()
#: contracts that declare no family at all, and why they need none
NO_FAMILY = {
    "fp8-encode-exhaustive": "enumerates every fp32 boundary of the codec in one packed vector; no generated case",
    "ue8m0-encode-exhaustive": "enumerates every exponent in one packed vector; no generated case",
    "mx-scale-exhaustive": "enumerates every amax exponent in one packed vector; no generated case",
    "target-dispatch": "decode_dispatch takes flags only",
    "trust-gate": "trust_extra_cache_nan_free takes a target, a dtype name and flags only",
}


def _families() -> dict:
    registry.load_all()
    for m in dimensions.DECLARING_MODULES:
        importlib.import_module(m)
    out = {}
    for cid in registry.CONTRACTS:
        fam = dimensions.family_for(cid)
        if fam is not None:
            out.setdefault(fam.name, fam)
    return out


def layout_dimensions(family) -> list[str]:
    return [d.name for d in family.dimensions if "layout" in d.name]


FAMILIES = _families()


def _param(name):
    if name in PENDING_OTHER or name in PENDING:
        return pytest.param(name, marks=pytest.mark.xfail(reason=f"{name}: layout dimension pending (issue 30)",
                                                          strict=False))
    return name


@pytest.mark.parametrize("name", [_param(n) for n in sorted(FAMILIES) if n not in EXEMPT and n not in COVERED_BY])
def test_family_declares_a_layout_dimension(name):
    assert layout_dimensions(FAMILIES[name]), (
        f"family {name} (contracts {[c for c in registry.CONTRACTS if dimensions.family_for(c) is FAMILIES[name]]}) "
        "declares no dimension whose name contains 'layout'")


@pytest.mark.parametrize("name,other", sorted(COVERED_BY.items()))
def test_a_covered_family_names_one_that_declares_layouts(name, other):
    assert name in FAMILIES and layout_dimensions(FAMILIES[other])


def test_the_lists_name_only_what_exists_and_do_not_overlap():
    named = [set(EXEMPT), set(COVERED_BY), PENDING_OTHER, PENDING]
    for s in named:
        assert s <= set(FAMILIES), s - set(FAMILIES)
    assert sum(map(len, named)) == len(set().union(*named))
    assert set(NO_FAMILY) <= set(registry.CONTRACTS)


def test_every_contract_without_a_family_is_accounted_for():
    registry.load_all()
    missing = {c for c in registry.CONTRACTS if dimensions.family_for(c) is None}
    assert missing == set(NO_FAMILY)


def test_a_family_that_loses_its_layout_dimension_is_caught():
    fam = FAMILIES["cp-gather"]
    stripped = dimensions.Family(fam.name, tuple(d for d in fam.dimensions if "layout" not in d.name),
                                 tuple(g for g in fam.interactions if not any("layout" in x for x in g)),
                                 fam.classify, fam.force)
    assert layout_dimensions(fam) and not layout_dimensions(stripped)
