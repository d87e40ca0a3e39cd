"""audit.json's per-row time_split: compile / kernel / oracle / harness, measured (contracts/engine/timesplit.py)."""
from __future__ import annotations

import time
import types

import pytest

from contracts.engine import reports, timesplit
from contracts.engine.runner import RowResult, run_contract
from contracts.subjects import Family, Subject, bound
from impl.targets import get_target

NAP = 0.06


class _Slow:
    """A subject class: its methods are the subject's code, however a contract reaches them."""

    def __init__(self, nap):
        time.sleep(nap)
        self.nap = nap

    @classmethod
    def make(cls, nap):
        return cls(nap)

    def run(self):
        time.sleep(self.nap)
        return self._inner()

    def _inner(self):
        return 1


_Slow.__module__ = "impl.test_timesplit_fake"  # a class from the subject's package


class _FakeSubject(Subject):
    """A subject with one family: ``slow.nap(s)`` sleeps, ``slow.Slow`` is a class, ``slow.VALUE`` a constant."""

    def __init__(self):
        super().__init__("ours", "test")

    def bind(self, target):
        return types.SimpleNamespace(slow=Family("slow", nap=lambda s: time.sleep(s), Slow=_Slow, VALUE=7),
                                     target=get_target(target))


def test_a_row_splits_its_seconds_between_kernel_oracle_and_harness(register):
    slow_oracle = timesplit.timed_oracle(lambda s: time.sleep(s))

    def check(case, target):
        """Naps in the subject, an oracle and itself."""
        sub = bound(target)
        assert sub.slow.VALUE == 7
        sub.slow.nap(NAP)  # the subject: kernel
        slow_oracle(NAP / 2)  # an oracle function
        time.sleep(NAP / 3)  # the contract's own comparison: harness
        return []

    c = register("test-split", check, examples=lambda t: [0], max_cases=2, min_cases=1)
    row = run_contract(c, "gfx942", profile="dev", budget=30, subject=_FakeSubject())
    assert row.status == "pass" and row.cases == 3
    s = row.time_split
    assert set(s) == set(timesplit.KEYS) and s["compile"] == 0.0
    assert 3 * NAP <= s["kernel"] < 3 * NAP + 0.5
    assert 1.5 * NAP <= s["oracle"] < 1.5 * NAP + 0.5
    assert s["harness"] >= NAP  # the naps outside both
    assert abs(sum(s.values()) - row.seconds) < 1e-6
    doc = row.as_json()
    assert set(doc["time_split"]) == set(timesplit.KEYS)
    assert abs(sum(doc["time_split"].values()) - doc["seconds"]) < 0.01


def test_methods_of_a_subject_class_are_the_subjects_time(register):
    def check(case, target):
        """Makes a subject object and runs it."""
        obj = bound(target).slow.Slow.make(NAP)  # the constructor inside a classmethod: one interval
        obj.run()
        return []

    c = register("test-split-class", check, examples=lambda t: [0], max_cases=0, min_cases=0)
    row = run_contract(c, "gfx942", profile="dev", budget=30, subject=_FakeSubject())
    assert row.status == "pass" and row.pinned_cases == 1
    assert 2 * NAP <= row.time_split["kernel"] < 2 * NAP + 0.5
    assert isinstance(_Slow(0), _Slow)  # patched in place: the class and its instances stay what they were


def test_compile_hooks_move_compilation_out_of_kernel_time():
    triton = pytest.importorskip("triton")
    runtime = triton.knobs.runtime

    def launch():  # what a JIT launch does on a cache miss
        runtime.jit_cache_hook(key="k")
        time.sleep(NAP)
        runtime.jit_post_compile_hook(key="k")
        time.sleep(NAP / 2)

    fn = timesplit.timed_call(launch)
    since = time.monotonic()
    with timesplit.measuring():
        fn()
    s = timesplit.drain(since, 2 * NAP)
    assert NAP <= s["compile"] < NAP + 0.3
    assert NAP / 2 <= s["kernel"] < NAP / 2 + 0.3
    assert abs(sum(s.values()) - 2 * NAP) < 1e-6 or s["harness"] == 0.0


def test_the_compile_hooks_chain_onto_hooks_already_there():
    seen = []
    pre = timesplit._chain_pre(lambda **kw: seen.append(("pre", kw)) or True)
    post = timesplit._chain_post(lambda **kw: seen.append(("post", kw)))
    with timesplit.measuring() as clock:
        assert pre(key=1) is True  # that hook skipped the compile: no end will come, nothing is left pending
        assert clock.pending == []
        post(key=2)
    assert seen == [("pre", {"key": 1}), ("post", {"key": 2})]
    assert timesplit._chain_pre(None)(key=3) is False  # no hook before ours: Triton compiles


def test_outside_a_check_the_instruments_pass_through():
    calls = []
    fn = timesplit.timed_call(lambda x: calls.append(x) or x)
    assert fn(4) == 4 and calls == [4]
    assert timesplit.timed_call(fn) is fn
    assert timesplit.drain(time.monotonic(), 1.0) == {"compile": 0.0, "kernel": 0.0, "oracle": 0.0, "harness": 1.0}


def test_every_public_oracle_function_is_timed_and_the_comparison_is_not():
    import contracts.decode
    import contracts.decode_reduce
    from oracles import compare, decode, decode_reduce, formats

    assert decode.ref_sparse_attn_decode.__smv_oracle__ and formats.fp8_decode.__smv_oracle__
    # names a contract imported from an oracle module are the timed functions too
    assert contracts.decode_reduce.ref_reduce is decode_reduce.ref_reduce
    assert decode_reduce.ref_reduce.__smv_oracle__
    assert contracts.decode.ref_decode is decode
    assert not getattr(compare.attention_comparison, "__smv_oracle__", False)
    assert decode.ref_sparse_attn_decode.__wrapped__.__module__ == "oracles.decode"


def test_the_audit_merges_its_two_passes_splits():
    from contracts.engine.audit import _merge

    a = RowResult("c", "gfx942", "pass", pinned_cases=1, generated_cases=2, seconds=3.0,
                  time_split={"compile": 1.0, "kernel": 1.0, "oracle": 0.5, "harness": 0.5})
    b = RowResult("c", "gfx942", "pass", generated_cases=2, seconds=1.0,
                  time_split={"compile": 0.0, "kernel": 0.5, "oracle": 0.25, "harness": 0.25})
    m = _merge(a, b)
    assert m.time_split == {"compile": 1.0, "kernel": 1.5, "oracle": 0.75, "harness": 0.75}
    assert m.seconds == 4.0


def test_schema_6_requires_each_rows_time_split(tmp_path):
    from contracts.engine.audit import format_table, run_audit

    doc, code = run_audit(["split-bounds"], ["gfx942"], budget=60, profile="dev", progress=False,
                          report_dir=str(tmp_path))
    assert code == 0 and doc["schema_version"] == reports.AUDIT_SCHEMA_VERSION >= 6
    assert reports.validate(doc, reports.audit_schema(6)) == []
    (row,) = doc["results"]
    assert abs(sum(row["time_split"].values()) - row["seconds"]) < 0.01
    broken = dict(doc, results=[{k: v for k, v in row.items() if k != "time_split"}])
    assert any("time_split" in e for e in reports.validate(broken, reports.audit_schema(6)))
    assert reports.validate(broken, reports.audit_schema(5)) == []
    line = next(ln for ln in format_table(doc).splitlines() if ln.startswith("split-bounds"))
    assert timesplit.format_split(row["time_split"]) in line
    md = (tmp_path / "audit.md").read_text()
    assert "compile / kernel / oracle / harness" in md


def test_inside_a_check_an_oracle_runs_torch_on_one_thread():
    import torch

    seen = []
    oracle = timesplit.timed_oracle(lambda: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        oracle()  # outside a check: as it is
        with timesplit.measuring():
            oracle()
        assert seen == [2, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
