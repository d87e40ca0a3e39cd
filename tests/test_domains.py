"""fuzz/domains.py: every contract's case family declares a production domain, and reach_class sorts cases into
production / caller-contract / adversarial as each bound declares."""
from __future__ import annotations

import time
import warnings
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NonInteractiveExampleWarning

from fuzz import domains
from fuzz.cache_writers import CompressorCase, SwaCase, WriterCase
from fuzz.indexer_writer import DirectCase, IndexerWriterCase
from fuzz.router import RouterCase
from fuzz.splits import SplitCase
from impl.targets import TARGETS


def _contracts():
    from contracts.registry import load_all  # tests may import contracts; fuzz/ may not
    return load_all()


def _one_case(c, target):
    if c.examples is not None:
        ex = list(c.examples(target) or [])
        if ex:
            return ex[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        return c.cases(target).example()


def _rows():
    return [(cid, t) for cid, c in sorted(_contracts().items()) for t in c.targets]


@pytest.mark.parametrize("cid,target", _rows())
def test_every_contract_case_family_declares_a_domain(cid, target):
    c = _contracts()[cid]
    case = _one_case(c, TARGETS[target])
    assert domains.reach_class(case) is not None, (
        f"{cid} on {target}: case family {type(case).__name__} (KIND {getattr(type(case), 'KIND', '')!r}) declares "
        f"no production domain in fuzz/domains.py")
    assert domains.reach_class(case) in ("production", "caller-contract", "adversarial")


def test_case_types_of_contracts_are_declared():
    for cid, c in _contracts().items():
        if c.case_type is not None:
            assert c.case_type.KIND in domains.DOMAINS, f"{cid}: {c.case_type.__name__} has no domain"


def test_every_bound_cites_an_upstream_function():
    assert domains.DOMAINS
    for kind, bounds in domains.DOMAINS.items():
        for b in bounds:
            path, _, func = b.caller.partition("::")
            assert path.endswith(".py") and "/" in path and func.strip(), (kind, b.name, b.caller)
            assert "0.3" in b.caller, f"{kind}/{b.name}: cite the release"
            assert b.outside in ("caller-contract", "adversarial")
    with pytest.raises(ValueError):
        domains.Bound("x", lambda c: True, "no citation")


def test_undeclared_family_is_none():
    class Stranger:
        KIND = "not-a-family"
    assert domains.reach_class(Stranger()) is None
    assert domains.outside(Stranger()) == []


# --- handcrafted cases ---------------------------------------------------------------------------------------------

def _direct(**kw):
    base = dict(seed=1, T=2, slots=(0, -1), log_scale=(0, 0), block_size=16, num_blocks=1)
    base.update(kw)
    return DirectCase(**base)


def test_indexer_direct_inside_and_outside():
    assert domains.reach_class(_direct()) == "production"
    assert domains.reach_class(IndexerWriterCase(direct=_direct())) == "production"
    odd = _direct(block_size=7, num_blocks=1, layout="normal")
    assert domains.reach_class(odd) == "caller-contract"
    assert "block-size-1-or-16k" in domains.outside(odd)
    assert domains.reach_class(IndexerWriterCase(direct=odd)) == "caller-contract"
    assert "direct.block-size-1-or-16k" in domains.outside(IndexerWriterCase(direct=odd))
    assert domains.reach_class(_direct(slots=(0, -2 ** 31))) == "caller-contract"
    assert domains.reach_class(_direct(specials=((0, 3, "nan"),))) == "adversarial"
    # adversarial wins over caller-contract
    assert domains.reach_class(_direct(block_size=7, layout="normal", specials=((0, 3, "inf"),))) == "adversarial"


def _compressor(**kw):
    base = dict(seed=1, ratio=4, state_block_size=4, positions=(3,), reqs=(0,), slots=(0,), block_size=64,
                num_blocks=1, padded=True)
    base.update(kw)
    return CompressorCase(**base)


def test_compressor_inside_and_outside():
    assert domains.reach_class(_compressor()) == "production"
    assert domains.reach_class(_compressor(ratio=128, state_block_size=8, positions=(127,), block_size=2)) \
        == "production"
    assert domains.reach_class(_compressor(specials=((0, "kv", 5, "inf"),))) == "adversarial"
    assert domains.reach_class(_compressor(weight="nan")) == "adversarial"
    assert domains.reach_class(_compressor(weight="huge")) == "adversarial"
    assert domains.reach_class(_compressor(block_size=3)) == "caller-contract"
    assert domains.outside(_compressor(block_size=3)) == ["compressed-block-256-over-ratio"]
    assert domains.reach_class(WriterCase(compressor=_compressor(specials=((0, "score", 1, "nan"),)))) \
        == "adversarial"
    swa = SwaCase(seed=0, T=1, slots=(0,), log_scale=(0,), block_size=64, num_blocks=1, padded=True)
    assert domains.reach_class(WriterCase(swa=swa)) == "production"


def test_router_and_splits():
    r = RouterCase(seed=0, tokens=2, experts=256, n_group=8, topk_group=4, topk=8, renormalize=True,
                   routed_scaling_factor=2.5, gate_dtype="fp32")
    assert domains.reach_class(r) == "production"
    bad = RouterCase(seed=0, tokens=2, experts=6, n_group=4, topk_group=2, topk=2, renormalize=True,
                     routed_scaling_factor=1.0, gate_dtype="bf16")
    assert domains.reach_class(bad) == "caller-contract"
    s = SplitCase(batch=105, heads=16, avg_main=128, avg_extra=384, ragged_slack=0, cu_count=304)
    assert domains.reach_class(s) == "production"
    s0 = SplitCase(batch=1, heads=16, avg_main=0, avg_extra=0, ragged_slack=0, cu_count=304)
    assert domains.reach_class(s0) == "caller-contract"


def test_reach_class_is_deterministic_and_cheap():
    cases = [_direct(), _direct(block_size=7, layout="normal"), _compressor(specials=((0, "kv", 5, "inf"),))]
    first = [domains.reach_class(c) for c in cases]
    t0 = time.perf_counter()
    for _ in range(1000):
        for c, want in zip(cases, first):
            assert domains.reach_class(c) == want
    per_call = (time.perf_counter() - t0) / (1000 * len(cases))
    assert per_call < 1e-3, f"reach_class took {per_call * 1e6:.0f} us per call"


# --- fractions on generated cases (reported, not asserted) ----------------------------------------------------------

def test_fractions_on_generated_cases(capsys):
    """Draw ~20 cases per contract (first target) and print the production / caller-contract / adversarial
    fractions. Informational: the generators aim at the edges, so production is expected to be rare."""
    lines = []
    for cid, c in sorted(_contracts().items()):
        target = TARGETS[c.targets[0]]
        counts: Counter = Counter()

        @settings(max_examples=20, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(st.data())
        def draw(data):
            counts[domains.reach_class(data.draw(c.cases(target)))] += 1

        draw()
        n = sum(counts.values()) or 1
        lines.append(f"{cid:32s} n={n:3d} " + " ".join(
            f"{k}={counts.get(k, 0) / n:.2f}" for k in ("production", "caller-contract", "adversarial")))
        assert None not in counts, f"{cid}: a generated case has no declared domain"
    with capsys.disabled():
        print("\nreach fractions per contract:\n" + "\n".join(lines))
