"""The DSv3.2 sparse metadata builder, its work partition and consumer, against the uncached oracle."""
import sys
import types
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import impl  # noqa: F401  (sets the Triton mode before anything imports triton)
import impl.sparse_metadata as sm
from contracts.sparse_metadata import (
    HEAD_DIM,
    KV_LORA_RANK,
    SOFTMAX_SCALE,
    MetadataReplay,
    _common,
    _step_inputs,
    fresh_memory_poisoned,
    single_threaded,
)
from fuzz.cases import CASE_SCHEMA_VERSION, CaseError
from fuzz.sparse_metadata import (
    OP_STRATEGIES,
    MetadataCase,
    MetadataConfig,
    MetadataOp,
    MetadataStep,
    apply_op,
    burst_case,
    config_strategy,
    metadata_case,
    op_strategy,
)
from impl.sparse_metadata import SparseMLAMetadataBuilder
from impl.targets import AiterStatus
from impl.work_partition import compute_work_partition, sparse_decode_from_partition
from oracles import sparse_metadata as oracle


@pytest.fixture(autouse=True)
def _one_thread():
    with single_threaded():
        yield


def _cfg(**kw) -> MetadataConfig:
    return MetadataConfig(**{**dict(seed=0, topk=8, granularity=4, block_size=1, max_tokens=16, num_heads=2), **kw})


def _step(q, s, host=True, holes="prefix", seed=1) -> MetadataStep:
    return MetadataStep(q_lens=tuple(q), seq_lens=tuple(s), host_lens=host, holes=holes, seed=seed)


def _builder(cfg, target="gfx950", **kw):
    return SparseMLAMetadataBuilder(cfg.max_tokens, cfg.num_heads, topk_tokens=cfg.topk,
                                    block_size=cfg.block_size, target=target, kv_granularity=cfg.granularity,
                                    use_aiter=kw.pop("use_aiter", False), **kw)


def _build(b, cfg, step):
    inp = _step_inputs(cfg, step)
    md = b.build(_common(step, inp["block_table"]))
    return md, inp


# --- the stateful machine: the contracts' step logic, driven rule by rule ------------------------------------------

class MetadataMachine(RuleBasedStateMachine):
    """Random sequences of decode / prefill / mixed steps; every step is checked by the contracts' replay."""

    target = "gfx950"

    @initialize(cfg=config_strategy())
    def start(self, cfg):
        self.cfg = cfg
        self.replay = MetadataReplay(cfg, self.target)
        self.prev = None
        self.violations = []

    def _do(self, op):
        self.prev = apply_op(self.prev, op, self.cfg)
        self.violations = self.replay.step(self.prev)

    @rule(op=OP_STRATEGIES["fresh"])
    def fresh(self, op):
        self._do(op)

    @rule(op=OP_STRATEGIES["decode"])
    def decode(self, op):
        self._do(op)

    @rule(op=OP_STRATEGIES["repeat"])
    def repeat(self, op):
        self._do(op)

    @rule(op=OP_STRATEGIES["permute_q"])
    def permute_q(self, op):
        self._do(op)

    @rule(op=OP_STRATEGIES["retime_last"])
    def retime_last(self, op):
        self._do(op)

    @rule(op=OP_STRATEGIES["shrink"])
    def shrink(self, op):
        self._do(op)

    @rule(op=OP_STRATEGIES["grow"])
    def grow(self, op):
        self._do(op)

    @rule(op=OP_STRATEGIES["cross_topk"])
    def cross_topk(self, op):
        self._do(op)

    @invariant()
    def agrees_with_oracle(self):
        assert not getattr(self, "violations", []), "\n".join(str(v) for v in self.violations)


class MetadataMachineGfx942(MetadataMachine):
    target = "gfx942"


_machine_settings = settings(max_examples=8, stateful_step_count=6, deadline=None, database=None,
                             derandomize=True, suppress_health_check=list(HealthCheck))
TestMetadataMachineGfx950 = MetadataMachine.TestCase
TestMetadataMachineGfx950.settings = _machine_settings
TestMetadataMachineGfx942 = MetadataMachineGfx942.TestCase
TestMetadataMachineGfx942.settings = _machine_settings


# --- syncs and recomputes ---------------------------------------------------------------------------------------

def test_hit_costs_no_sync_and_recompute_exactly_one():
    cfg = _cfg()
    b = _builder(cfg)
    _build(b, cfg, _step([1, 1], [20, 30]))
    assert b.counters.snapshot() == (1, 1, 0, 1)  # builds, recomputes, hits, syncs
    md, _ = _build(b, cfg, _step([1, 1], [21, 31], seed=2))  # steady decode past topk: same key
    assert md.cache_hit and b.counters.snapshot() == (2, 1, 1, 1)
    md, _ = _build(b, cfg, _step([1, 1], [3, 31], seed=3))  # a length below topk changed: recompute
    assert not md.cache_hit and b.counters.snapshot() == (3, 2, 1, 2)


def test_missing_seq_lens_cpu_costs_one_counted_copy_and_never_serves_stale():
    cfg = _cfg()
    b = _builder(cfg)
    _build(b, cfg, _step([1, 1], [3, 4], host=False))
    assert b.counters.snapshot() == (1, 1, 0, 2)  # the explicit copy + the recompute
    md, _ = _build(b, cfg, _step([1, 1], [4, 5], host=False, seed=2))  # lengths changed below topk
    assert not md.cache_hit and b.counters.snapshot() == (2, 2, 0, 4)
    md, _ = _build(b, cfg, _step([1, 1], [4, 5], host=False, seed=3))  # same lengths: a hit, one sync for the copy
    assert md.cache_hit and b.counters.snapshot() == (3, 2, 1, 5)
    assert b.counters.sync_reasons[-1].startswith("seq_lens_cpu missing")


# --- the finding: upstream's key is insufficient ------------------------------------------------------------------

def _upstream_key(step, cfg, H=16):
    q, s = np.array(step.q_lens), np.array(step.seq_lens)
    return (int(q.sum()), int(q.max()), H, np.minimum(s, cfg.topk).tobytes())


@pytest.mark.parametrize("a,b", [
    (_step([1, 3], [5, 5]), _step([3, 1], [5, 5], seed=2)),  # query-length distribution swapped
    (_step([4], [9]), _step([4], [12], seed=2)),  # a prefill chunk crossing topk=8
])
def test_upstream_key_collides_where_the_partition_differs(a, b):
    cfg = _cfg()
    assert _upstream_key(a, cfg) == _upstream_key(b, cfg)
    assert oracle.sparse_lengths(a.q_lens, a.seq_lens, 8) != oracle.sparse_lengths(b.q_lens, b.seq_lens, 8)
    builder = _builder(cfg)
    _build(builder, cfg, a)
    md, inp = _build(builder, cfg, b)
    assert not md.cache_hit  # our key tells them apart
    # and serving a's partition for b would give wrong attention: the consumer executes the stale partition
    stale = {k: torch.from_numpy(np.ascontiguousarray(v)).to(torch.int32) for k, v in compute_work_partition(
        np.concatenate([[0], np.cumsum(oracle.sparse_lengths(a.q_lens, a.seq_lens, 8))]), builder.num_cu,
        cfg.granularity).items()}
    builder.fill_global_indices(md, torch.tensor(inp["topk_rows"], dtype=torch.int32))
    T = md.num_tokens
    q = torch.zeros(T, 16, HEAD_DIM, dtype=torch.bfloat16)
    q[:, :2] = inp["q"]
    ref, nat, dot = oracle.sparse_decode_reference(inp["q"], inp["kv"], inp["lists"], SOFTMAX_SCALE, KV_LORA_RANK)
    tol = oracle.attention_tolerance(nat, dot, ref, HEAD_DIM, cfg.topk)  # the derived fp32/bf16 bound
    good = sparse_decode_from_partition(q, inp["kv"], builder.paged_kv_indices, builder.partition, SOFTMAX_SCALE)
    bad = sparse_decode_from_partition(q, inp["kv"], builder.paged_kv_indices, stale, SOFTMAX_SCALE)
    good_err = (good[:, :2].double() - ref).abs()
    bad_err = (bad[:, :2].double() - ref).abs()
    assert not torch.isnan(good_err).any() and (good_err <= tol).all()
    # outside the bound (NaN: a token the stale partition never covered, or a poisoned slot read, counts as outside)
    assert (~(bad_err <= tol)).any()


# --- partition and consumer ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_cu,gran", [(1, 4), (3, 4), (5, 8), (256, 16)])
def test_partition_matches_oracle_and_consumer_matches_attention(num_cu, gran):
    g = torch.Generator().manual_seed(num_cu)
    lens = [0, 7, 13, 1, 0, 20, 4]
    indptr = np.concatenate([[0], np.cumsum(lens)])
    live = compute_work_partition(indptr, num_cu, gran)
    ref = oracle.work_partition(lens, num_cu, gran)
    for name, arr in live.items():
        assert arr.reshape(-1).tolist() == np.asarray(ref[name]).reshape(-1).tolist(), name
    if num_cu == 3:
        assert live["work_meta"][2] > 0  # this shape exercises the reduce maps
    bufs = {k: torch.from_numpy(np.ascontiguousarray(v)).to(torch.int32) for k, v in live.items()}
    slots = 64
    kv = torch.randn(slots, HEAD_DIM, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, slots, (int(indptr[-1]),), generator=g, dtype=torch.int32)
    idx[3] = -1  # a hole is masked
    q = torch.randn(len(lens), 16, HEAD_DIM, generator=g).to(torch.bfloat16)
    out = sparse_decode_from_partition(q, kv, idx, bufs, SOFTMAX_SCALE)
    lists = [idx[indptr[t]:indptr[t + 1]].tolist() for t in range(len(lens))]
    ref_out, nat, dot = oracle.sparse_decode_reference(q, kv, lists, SOFTMAX_SCALE)
    tol = oracle.attention_tolerance(nat, dot, ref_out, HEAD_DIM, 20)
    assert not torch.isnan(out).any()
    assert ((out.double() - ref_out).abs() <= tol).all()
    assert (out[0] == 0).all() and (out[4] == 0).all()  # empty tokens give zeros


def test_global_indices_compact_holes_anywhere():
    cfg = _cfg(block_size=3)
    step = _step([2, 1], [6, 7], holes="anywhere")
    b = _builder(cfg)
    md, inp = _build(b, cfg, step)
    assert any(r[0] == -1 and any(x >= 0 for x in r) for r in inp["topk_rows"])  # holes really are inside
    got = b.fill_global_indices(md, torch.tensor(inp["topk_rows"], dtype=torch.int32))
    assert got.tolist() == [s for lst in inp["lists"] for s in lst]


# --- AITER through a fake module --------------------------------------------------------------------------------

def test_aiter_partition_called_only_on_key_change_with_upstream_arguments(monkeypatch):
    fake = types.ModuleType("aiter")
    fake.get_mla_metadata_v1 = mock.Mock()
    fake.get_mla_metadata_info_v1 = mock.Mock(return_value=[((7,), torch.int32)] * 5 + [((9,), torch.int64)])
    monkeypatch.setitem(sys.modules, "aiter", fake)
    monkeypatch.setattr(sm, "aiter_status", lambda: AiterStatus(True, "fake"))
    cfg = _cfg()
    b = SparseMLAMetadataBuilder(16, 2, topk_tokens=8, target="gfx942")
    assert b.use_aiter
    args, kwargs = fake.get_mla_metadata_info_v1.call_args
    assert args == (16, 1, 16, torch.bfloat16, torch.bfloat16) and kwargs == {"is_sparse": True, "fast_mode": True}
    assert b.partition["reduce_partial_map"].shape == (9,) and b.partition["work_meta"].dtype == torch.int32
    _build(b, cfg, _step([1, 1], [20, 30]))
    _build(b, cfg, _step([1, 1], [21, 31], seed=2))
    assert fake.get_mla_metadata_v1.call_count == 1
    args, kwargs = fake.get_mla_metadata_v1.call_args
    assert args[0].tolist() == [0, 1, 2] and args[1].tolist() == [0, 8, 16] and args[2].tolist() == [1, 1]
    assert args[3:6] == (16, 1, True)
    assert kwargs == {"page_size": 1, "kv_granularity": 16, "max_seqlen_qo": 1, "uni_seqlen_qo": 1,
                      "fast_mode": True}
    _build(b, cfg, _step([1, 1], [2, 31], seed=3))
    assert fake.get_mla_metadata_v1.call_count == 2 and b.counters.host_syncs == 2


def test_no_aiter_means_own_partition(monkeypatch):
    monkeypatch.setattr(sm, "aiter_status", lambda: AiterStatus(False, "absent"))
    assert not SparseMLAMetadataBuilder(4, 2, topk_tokens=8).use_aiter


# --- bad input -----------------------------------------------------------------------------------------------------

def _state(b):
    return ({k: v.clone() for k, v in b.buffers().items()}, b._prev_metadata_key, b._prev_req_extent,
            b._prev_indices_extent, b.counters.recomputes, b.counters.hits, b.counters.builds)


@pytest.mark.parametrize("mutate,match", [
    (lambda c: setattr(c, "seq_lens_cpu", torch.tensor([1, 30], dtype=torch.int32)), "disagree"),  # seq < q_len
    (lambda c: setattr(c, "seq_lens_cpu", torch.tensor([-1, 30], dtype=torch.int32)), "non-negative"),
    (lambda c: setattr(c, "num_actual_tokens", 4), "disagree"),
    (lambda c: setattr(c, "max_query_len", 1), "max_query_len"),
    (lambda c: setattr(c, "seq_lens_cpu", torch.tensor([30], dtype=torch.int32)), "seq_lens_cpu"),
])
def test_bad_input_raises_and_leaves_state(mutate, match):
    cfg = _cfg()
    b = _builder(cfg)
    _build(b, cfg, _step([1, 1, 1], [20, 30, 5]))
    before = _state(b)
    step = _step([2, 1], [20, 30], seed=2)
    common = _common(step, _step_inputs(cfg, step)["block_table"])
    mutate(common)
    with pytest.raises(ValueError, match=match):
        b.build(common)
    after = _state(b)
    for name in before[0]:
        assert torch.equal(before[0][name], after[0][name]), name
    assert before[1:] == after[1:]


def _meta(t):
    """The same tensor on PyTorch's ``meta`` device: a device other than the builder's, without an accelerator."""
    return t.to("meta")


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda c: setattr(c, "query_start_loc", c.query_start_loc.float()), TypeError, "query_start_loc: .*float32"),
    (lambda c: setattr(c, "query_start_loc", _meta(c.query_start_loc)), ValueError, "query_start_loc: .*meta"),
    # float lengths with no host copy were truncated by the explicit copy before the dtype check existed
    (lambda c: (setattr(c, "seq_lens", c.seq_lens.float() + 0.7), setattr(c, "seq_lens_cpu", None)), TypeError,
     "seq_lens: .*float32"),
    (lambda c: setattr(c, "seq_lens", c.seq_lens.float()), TypeError, "seq_lens: .*float32"),
    (lambda c: setattr(c, "seq_lens", _meta(c.seq_lens)), ValueError, "seq_lens: .*meta"),
    (lambda c: setattr(c, "seq_lens_cpu", _meta(c.seq_lens_cpu)), ValueError, "seq_lens_cpu: .*host"),
    (lambda c: setattr(c, "query_start_loc_cpu", _meta(c.query_start_loc_cpu)), ValueError,
     "query_start_loc_cpu: .*host"),
    (lambda c: setattr(c, "block_table", c.block_table.float()), TypeError, "block_table: .*float32"),
    (lambda c: setattr(c, "block_table", _meta(c.block_table)), ValueError, "block_table: .*meta"),
    (lambda c: setattr(c, "block_table", c.block_table[0]), ValueError, "block_table: .*dimension"),
])
def test_bad_tensor_dtype_or_device_raises_and_leaves_state(mutate, exc, match):
    cfg = _cfg()
    b = _builder(cfg)
    _build(b, cfg, _step([1, 1, 1], [20, 30, 5]))
    before = _state(b), b.counters.host_syncs
    step = _step([2, 1], [20, 30], seed=2)
    common = _common(step, _step_inputs(cfg, step)["block_table"])
    mutate(common)
    with pytest.raises(exc, match=match):
        b.build(common)
    after = _state(b), b.counters.host_syncs
    for name in before[0][0]:
        assert torch.equal(before[0][0][name], after[0][0][name]), name
    assert before[0][1:] == after[0][1:] and before[1] == after[1]


def _filled(cfg, step):
    """A builder after one build and a valid fill, its metadata, the step's rows and the filled indices."""
    b = _builder(cfg)
    md, inp = _build(b, cfg, step)
    rows = torch.tensor(inp["topk_rows"], dtype=torch.int32)
    good = b.fill_global_indices(md, rows).clone()
    assert good.tolist() == [s for lst in inp["lists"] for s in lst]
    return b, md, rows, good


@pytest.mark.parametrize("poke,match", [
    (lambda rows, ctx: -2, "token 1, column 0: expected a position >= 0 or the hole marker -1, got -2"),
    # token 1 sits at context position 5 (seq_len 7, q_len 2, offset 0): 6 is the next token's own position
    (lambda rows, ctx: 6, "token 1, column 0: expected a position in the token's context \\(0..5\\), got 6"),
])
def test_fill_rejects_invalid_positions_before_writing(poke, match):
    cfg = _cfg()
    b, md, rows, good = _filled(cfg, _step([1, 2], [4, 7]))
    assert md.context_positions.tolist() == [3, 5, 6]
    rows[1, 0] = poke(rows, md.context_positions)
    with pytest.raises(ValueError, match="topk_indices: " + match):
        b.fill_global_indices(md, rows)
    assert torch.equal(b.paged_kv_indices[:md.num_kv_entries], good)


def test_fill_rejects_positions_past_the_block_table():
    # block_size 2, seq_len 7 needs 4 blocks; a table of 2 blocks covers positions 0..3 only
    cfg = _cfg(block_size=2)
    step = _step([1], [7])
    b = _builder(cfg)
    inp = _step_inputs(cfg, step)
    md = b.build(_common(step, [row[:2] for row in inp["block_table"]]))
    rows = torch.full((1, 8), -1, dtype=torch.int32)
    rows[0, :3] = torch.tensor([1, 5, 3])  # 5 is inside the context (0..6), not inside the table
    before = b.paged_kv_indices.clone()
    with pytest.raises(ValueError, match=r"topk_indices: token 0, column 1: expected a position inside the block "
                                         r"table \(2 blocks of 2: < 4\), got 5"):
        b.fill_global_indices(md, rows)
    assert torch.equal(b.paged_kv_indices, before)
    rows[0, 1] = -1
    table = inp["block_table"][0]
    assert b.fill_global_indices(md, rows).tolist() == [table[0] * 2 + 1, table[1] * 2 + 1] + [-1] * 5


def test_fill_validation_is_opt_out_and_costs_no_sync_on_the_host():
    cfg = _cfg()
    b, md, rows, good = _filled(cfg, _step([1, 2], [4, 7]))
    syncs = b.counters.host_syncs
    assert torch.equal(b.fill_global_indices(md, rows, validate=True), good)
    assert b.counters.host_syncs == syncs  # host rows: the check reads no device memory
    rows[1, 0] = 6  # past the context; unchecked with validate=False, as on an accelerator by default
    got = b.fill_global_indices(md, rows, validate=False)
    assert got[md.paged_kv_indptr[1]].item() == _step_inputs(cfg, _step([1, 2], [4, 7]))["block_table"][1][6]
    with pytest.raises(TypeError, match="validate"):
        b.fill_global_indices(md, rows, validate="yes")


@pytest.mark.parametrize("change,exc,match", [
    (dict(block_table="float"), TypeError, "block_table: .*float32"),
    (dict(block_table="meta"), ValueError, "block_table: .*meta"),
    (dict(topk_indices="meta"), ValueError, "topk_indices: .*meta"),
    (dict(topk_indices="float"), TypeError, "topk_indices: .*float32"),
])
def test_fill_rejects_bad_dtype_or_device_before_writing(change, exc, match):
    import dataclasses

    cfg = _cfg()
    b, md, rows, good = _filled(cfg, _step([1, 2], [4, 7]))
    conv = {"float": lambda t: t.float(), "meta": _meta}
    if "block_table" in change:
        md = dataclasses.replace(md, block_table=conv[change["block_table"]](md.block_table))
    else:
        rows = conv[change["topk_indices"]](rows)
    b.paged_kv_indices[:md.num_kv_entries] = 0
    with pytest.raises(exc, match=match):
        b.fill_global_indices(md, rows)
    assert not b.paged_kv_indices.any()


@pytest.mark.parametrize("kw,exc,match", [
    (dict(use_aiter="no"), TypeError, "use_aiter: expected a bool or None, got str 'no'"),
    (dict(use_aiter=1), TypeError, "use_aiter"),
    (dict(device="nonsense"), ValueError, "device: .*'nonsense'"),
    (dict(device=3.5), ValueError, "device: "),
    (dict(device="meta"), ValueError, "device: .*meta"),
])
def test_bad_constructor_arguments(kw, exc, match):
    with pytest.raises(exc, match=match):
        SparseMLAMetadataBuilder(4, 2, topk_tokens=8, **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a process without a usable CUDA/ROCm device")
def test_unusable_device_is_a_value_error():
    with pytest.raises(ValueError, match="device: 'cuda' is not usable"):
        SparseMLAMetadataBuilder(4, 2, topk_tokens=8, use_aiter=False, device="cuda")


def test_more_tokens_than_max_tokens_raises_before_writing():
    cfg = _cfg(max_tokens=4)
    b = _builder(cfg)
    before = _state(b)
    step = _step([3, 2], [20, 30])
    with pytest.raises(ValueError, match="max_tokens=4"):
        b.build(_common(step, _step_inputs(cfg, step)["block_table"]))
    after = _state(b)
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0]) and before[1:] == after[1:]


def test_fresh_memory_poisoning_fills_empty_and_restores_state():
    assert not torch.are_deterministic_algorithms_enabled()
    with fresh_memory_poisoned():
        t = torch.empty(4, dtype=torch.int32)
    assert t.tolist() == [2**31 - 1] * 4
    assert not torch.are_deterministic_algorithms_enabled()


def test_buffers_are_zero_initialised_and_heads_padded():
    with fresh_memory_poisoned():
        b = SparseMLAMetadataBuilder(5, 3, topk_tokens=4, use_aiter=False)
    assert b.num_heads_padded == 16 and SparseMLAMetadataBuilder(2, 20, topk_tokens=4, use_aiter=False).num_heads_padded == 20
    assert b.paged_kv_indices.shape == (20,) and not b.paged_kv_indices.any() and not b.req_id_per_token.any()
    assert b.qo_indptr.tolist() == list(range(6)) and b.paged_kv_last_page_len.tolist() == [1] * 5
    assert all(not v.any() for v in b.partition.values())


def test_sparse_lengths_rule():
    b = SparseMLAMetadataBuilder(16, 2, topk_tokens=8, use_aiter=False)
    got = b.sparse_lengths(np.array([1, 3, 2]), np.array([0, 10, 2]))
    assert got.tolist() == oracle.sparse_lengths([1, 3, 2], [0, 10, 2], 8) == [0, 8, 8, 8, 1, 2]


# --- typed cases ------------------------------------------------------------------------------------------------------

def _drop_one(doc: dict, path: list) -> str:
    """Delete the field at ``path`` (keys and list indices) of ``doc``; returns its name."""
    holder = doc
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    return path[-1]


def test_metadata_cases_round_trip_and_reject_a_missing_field():
    import json

    from hypothesis import given
    from hypothesis import strategies as st

    from contracts.core import CONTRACTS

    for cid in ("cache-key-staleness", "shrink-tail-extents"):
        assert CONTRACTS[cid].case_type is MetadataCase
    assert CONTRACTS["cache-key-staleness"].numeric and not CONTRACTS["shrink-tail-extents"].numeric

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(metadata_case(), burst_case()), data=st.data())
    def prop(case, data):
        doc = json.loads(json.dumps(case.to_json()))
        assert MetadataCase.from_json(doc) == case
        where = data.draw(st.sampled_from(["case", "config", "step"]))
        if where == "case":
            path = [data.draw(st.sampled_from(["config", "steps"]))]
        elif where == "config":
            path = ["config", data.draw(st.sampled_from(sorted(doc["config"])))]
        else:
            i = data.draw(st.integers(0, len(doc["steps"]) - 1))
            later = MetadataStep.ADDED_FIELDS  # older steps replay with their defaults
            path = ["steps", i, data.draw(st.sampled_from(sorted(k for k in doc["steps"][i] if k not in later)))]
        name = _drop_one(doc, path)
        with pytest.raises(CaseError, match=f"missing field {name}"):
            MetadataCase.from_json(doc)

    prop()


def test_metadata_ops_round_trip():
    import json

    from hypothesis import given

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(op=op_strategy())
    def prop(op):
        assert isinstance(op, MetadataOp)
        assert MetadataOp.from_json(json.loads(json.dumps(op.to_json()))) == op

    prop()


def test_malformed_metadata_cases_are_case_errors():
    good = MetadataCase(config=_cfg(), steps=(_step([1, 3], [5, 5]),)).to_json()
    bad_docs = [
        (dict(good, steps=[]), "at least one step"),
        (dict(good, steps=[dict(good["steps"][0], seq_lens=[5])]), "one entry per request"),
        (dict(good, steps=[dict(good["steps"][0], seq_lens=[5, 2])]), r"requests \[1\]"),
        (dict(good, steps=[dict(good["steps"][0], holes="middle")]), "expected one of"),
        (dict(good, steps=[dict(good["steps"][0], q_lens=[9, 9], seq_lens=[9, 9])]), "max_tokens=16"),
        (dict(good, config=dict(good["config"], topk=0)), "topk: must be >= 1"),
        (dict(good, config=dict(good["config"], topk="8")), "expected an integer"),
        (dict(good, schema_version=CASE_SCHEMA_VERSION + 1), "schema_version"),
    ]
    for doc, match in bad_docs:
        with pytest.raises(CaseError, match=match):
            MetadataCase.from_json(doc)


def test_staleness_check_records_the_attention_margin():
    from contracts.core import CONTRACTS, collecting_margins

    case = MetadataCase(config=_cfg(), steps=(_step([1, 3], [5, 5]), _step([3, 1], [5, 5], seed=2),
                                              _step([1, 1], [6, 6], seed=3)))
    with collecting_margins() as margins:
        assert CONTRACTS["cache-key-staleness"].check(case, "gfx950") == []
    assert len(margins) == 3 and all(0 < m <= 1 for m in margins), margins
    with collecting_margins() as margins:
        assert CONTRACTS["shrink-tail-extents"].check(case, "gfx950") == []
    assert margins == []  # exact: every buffer compared element for element


def test_attention_violation_names_the_worst_lane_the_count_and_the_cosine(monkeypatch):
    import impl.work_partition as wp

    real = wp.sparse_decode_from_partition

    def off_by_a_bit(*args, **kwargs):
        out = real(*args, **kwargs)
        out[0, 1, 7] += 0.5
        out[1, 0, 3] += 4.0
        return out

    monkeypatch.setattr(wp, "sparse_decode_from_partition", off_by_a_bit)
    replay = MetadataReplay(_cfg(), "gfx950")
    v = replay.step(_step([1, 1], [6, 6]), extents=False)
    assert len(v) == 1
    assert v[0].message == "attention from the recompute partition differs from the oracle beyond the derived bound"
    assert "2 of 2048 lanes" in v[0].got and "cosine 0.9" in v[0].got, v[0].got
    assert v[0].where.endswith("out[1, 0, 3]")


def test_key_pair_cases_reach_every_pair_a_weaker_key_would_miss():
    """Key-pair cases hold consecutive steps that agree on everything a weaker key sees but one input: the last
    request re-timed with the same starts and max_query_len (num_tokens), a permutation of the query lengths
    (their distribution), the same query lengths with other sequence lengths (the lengths)."""
    from hypothesis import given, settings

    from fuzz.sparse_metadata import key_pair_case

    seen = set()

    @settings(max_examples=200, database=None, deadline=None)
    @given(key_pair_case())
    def check(case):
        first = case.steps[0]
        assert len(first.q_lens) >= 2 and len(set(first.q_lens)) == len(first.q_lens)
        for a, b in zip(case.steps, case.steps[1:]):
            if a.q_lens[:-1] == b.q_lens[:-1] and a.q_lens[-1] != b.q_lens[-1] and max(a.q_lens) == max(b.q_lens):
                seen.add("num_tokens")
            elif a.q_lens != b.q_lens and sorted(a.q_lens) == sorted(b.q_lens):
                seen.add("distribution")
            elif a.q_lens == b.q_lens and a.seq_lens != b.seq_lens:
                seen.add("lengths" + ("-without-host-copy" if not b.host_lens else ""))

    check()
    assert {"num_tokens", "distribution", "lengths", "lengths-without-host-copy"} <= seen, seen
