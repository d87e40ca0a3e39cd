"""The vllm subject's ragged helpers (upstream's dense->ragged conversion, C4A global slots and SWA decode-index
kernel behind our signatures): where upstream agrees with ours and where it differs by design (the messages the
proposed findings match), the memory guard that keeps an upstream read from leaving the tensors it was handed, a
planted bug reaching the contract, and the loader with a tree extracted before sparse_swa.py was audited."""
from __future__ import annotations

import json
import os
import shutil
import zipfile

import pytest
import torch

from contracts import ragged as cr
from contracts.subjects import EntryMissing, parse_subject, using
from contracts.subjects.vllm import loader
from contracts.subjects.vllm.adapters import ragged as adapter
from contracts.subjects.vllm.loader import NEEDED, planted_copy
from fuzz import ragged as fz
from fuzz.ragged import INT32_MAX, RaggedCase, SwaPart
from impl import ragged as ours
from impl.runtime import triton_mode
from impl.targets import get_target

pytestmark = pytest.mark.skipif(triton_mode() == "native", reason="interpreter-only: upstream's kernels on CPU "
                                "tensors; natively the vllm subject is judged by `smv audit --subject`")

SWA = "vllm/v1/attention/backends/mla/sparse_swa.py"
ROCM = "vllm/models/deepseek_v4/amd/rocm.py"
I32 = torch.int32


@pytest.fixture(scope="module")
def up(vllm_subject):
    return vllm_subject.bind("gfx950").ragged


def _table(rows, pad=0):
    buf = torch.full((len(rows), len(rows[0]) + pad), fz.POISON_BLOCK, dtype=I32)
    buf[:, :len(rows[0])] = torch.tensor(rows, dtype=I32)
    return buf[:, :len(rows[0])]


# --- agreement, and the differences by design -------------------------------------------------------------------

def test_upstreams_swa_window_equals_ours_inside_the_table(up):
    # windows crossing block boundaries (block size 3, window 4), a padding token, two requests, int64 positions
    table = _table([[7, 3, 9, 4], [5, 8, 2, 6]])
    pos, req = torch.tensor([5, 1, -1, 10, 0, 3]), torch.tensor([0, 0, 1, 1, 1, 0], dtype=I32)
    got, want = up.compute_swa_indices_and_lens(pos, req, table, 3, 4), ours.compute_swa_indices_and_lens(
        pos, req, table, 3, 4)
    assert got[0].dtype == got[1].dtype == I32 and tuple(got[0].shape) == (6, 1, 4)
    assert got[1].tolist() == want[1].tolist() == [4, 2, 0, 4, 1, 4]
    assert got[0].tolist() == want[0].tolist()
    # positions 2..5 of request 0 -> blocks 7, 3, 3, 3 -> slots 7*3+2, 3*3+0, 3*3+1, 3*3+2
    assert got[0][0, 0].tolist() == [23, 9, 10, 11]


def test_upstreams_c4a_slots_read_the_prefix_and_keep_a_hole_as_minus_one(up):
    # M3.ragged: 4 valid ids, upstream reads columns 0..3 (the -1 stays, id 2 is dropped); ours compacts
    table = _table([[10, 11, 12]])
    local = torch.tensor([[3, -1, 5, 1, -1, 2]], dtype=I32)
    idx, ptr = up.compute_global_topk_ragged_indices_and_indptr(local, torch.tensor([0], dtype=I32), table, 3)
    assert ptr.tolist() == [0, 4] and idx.tolist() == [33, -1, 35, 31]
    assert ours.compute_global_topk_ragged_indices_and_indptr(local, torch.tensor([0], dtype=I32), table, 3)[0] \
        .tolist() == [33, 35, 31, 32]


def test_upstream_reads_past_a_rows_width_and_a_negative_block_gives_a_negative_slot(up):
    # URH1: id 9 (column 3 of a table 3 wide) reads the padded buffer's next column; block -1 -> slot -3 + offset
    table = _table([[10, -1, 12]], pad=2)
    local = torch.tensor([[9, 4]], dtype=I32)
    idx, _ = up.compute_global_topk_ragged_indices_and_indptr(local, torch.tensor([0], dtype=I32), table, 3)
    assert idx.tolist() == [fz.POISON_BLOCK * 3, -2]
    assert ours.compute_global_topk_ragged_indices_and_indptr(local, torch.tensor([0], dtype=I32), table, 3)[0] \
        .tolist() == [-1, -1]


def test_a_load_outside_the_tables_storage_is_never_launched(up, monkeypatch):
    table = _table([[10, 11, 12]])
    far = torch.tensor([[INT32_MAX]], dtype=I32)
    with pytest.raises(adapter.OutOfBoundsRead, match=r"element 2147483647 of a storage of \[0, 3\)"):
        up.compute_global_topk_ragged_indices_and_indptr(far, torch.tensor([0], dtype=I32), table, 1)
    with pytest.raises(adapter.OutOfBoundsRead, match="request 1 is outside the block table's 1 rows"):
        up.compute_swa_indices_and_lens(torch.tensor([2]), torch.tensor([1], dtype=I32), table, 4, 2)
    # an empty view: torch hands the kernel address 0
    with pytest.raises(adapter.OutOfBoundsRead, match=r"storage of \[0, 0\)"):
        up.compute_swa_indices_and_lens(torch.tensor([0]), torch.tensor([0], dtype=I32), table[:, :0], 4, 2)
    # without the address model, the interpreter guard stops the same read before it happens
    monkeypatch.setattr(adapter, "_check_table_loads", lambda *a, **k: None)
    with pytest.raises(adapter.OutOfBoundsAccess, match="outside every tensor handed to its launch"):
        up.compute_global_topk_ragged_indices_and_indptr(far, torch.tensor([0], dtype=I32), table, 1)


def test_the_contract_words_upstreams_differences_as_the_proposed_findings_match(vllm_subject):
    t = get_target("gfx950")
    with using(vllm_subject):
        msgs = [{v.message for v in cr.ragged_helpers_oracle(c, t)} for c in cr._examples(t)]
    assert msgs[0] == {
        "dense->ragged: a row holds only its valid entries, compacted (the oracle keeps every one of the first len "
        "entries in place, -1 for an invalid one)",
        "global slots: the first count(>= 0) columns are read in place of the valid entries (a -1 hole kept, a valid "
        "entry after it dropped) at a token whose top-k row has -1 holes",
        "global slots: an entry whose block id is negative maps to a slot other than -1",
        "global slots: a local id past the block table's width maps to a slot (expected -1)",
        "SWA window: an entry whose block id is negative maps to a slot other than -1",
        "SWA window: a position past the block table's width maps to a slot (expected -1)"}
    assert msgs[1] == {"compute_global_topk_ragged_indices_and_indptr raised OutOfBoundsRead on a valid input",
                       "compute_swa_indices_and_lens raised OutOfBoundsRead on a valid input"}
    assert msgs[2] == {"build_ragged_indices_from_dense raised RuntimeError on a valid input (an empty batch)",
                       "compute_swa_indices_and_lens raised OutOfBoundsRead on a valid input"}
    # ours passes the same cases
    assert all(not cr.ragged_helpers_oracle(c, t) for c in cr._examples(t))


def test_a_window_planted_upstream_one_position_early_reaches_the_contract(vllm_subject, tmp_path):
    tree = planted_copy(vllm_subject.tree.root, str(tmp_path / "tree"), SWA,
                        "    start_pos = tl.maximum(pos - (window_size - 1) - left_add, 0)",
                        "    start_pos = tl.maximum(pos - window_size - left_add, 0)")
    case = RaggedCase(swa=SwaPart(positions=(5,), token_to_req=(0,), window=3), block_table=((1, 2, 3),),
                      table_width=3, block_size=2)
    with using(parse_subject(f"vllm@{tree}")):
        v = cr.ragged_helpers_oracle(case, get_target("gfx950"))
    # (the empty dense and C4A parts give URH3's message; the window's is the planted bug's)
    assert [x.message for x in v if "SWA" in x.message] == [
        "SWA window: a token's length differs from min(position + 1, window)"]


# --- a tree without sparse_swa.py ---------------------------------------------------------------------------------

def _stale_copy(root: str, dest) -> str:
    """The tree as an earlier suite extracted it: without sparse_swa.py, its record not listing it."""
    shutil.copytree(root, dest)
    os.remove(os.path.join(dest, SWA))
    meta_path = os.path.join(dest, "smv-subject.json")
    meta = json.load(open(meta_path))
    del meta["modules"][SWA]
    json.dump(meta, open(meta_path, "w"))
    return str(dest)


def test_a_tree_extracted_before_sparse_swa_skips_that_entry_only_and_says_how_to_refresh(vllm_subject, tmp_path):
    tree = loader.tree_at(_stale_copy(vllm_subject.tree.root, tmp_path / "old"))
    assert "extracted before the suite audited: " + SWA in tree.source
    assert SWA not in tree.module_hashes() and set(tree.module_hashes()) == set(NEEDED) - {SWA}
    why = tree.lacking()[SWA]
    assert "earlier version of this suite" in why and f"smv subject fetch vllm==0.33.0 --to {tree.root}" in why
    sub = parse_subject(f"vllm@{tree.root}").bind("gfx950")
    with pytest.raises(EntryMissing) as exc:  # rocm.py imports it: an inert stand-in is in sys.modules, not served
        sub.ragged.compute_swa_indices_and_lens(torch.tensor([1]), torch.tensor([0], dtype=I32), _table([[1]]), 2, 2)
    assert exc.value.entry == SWA and exc.value.why == why
    # the other helpers still run upstream's code
    idx, ptr = sub.ragged.compute_global_topk_ragged_indices_and_indptr(
        torch.tensor([[0, 1]], dtype=I32), torch.tensor([0], dtype=I32), _table([[4]]), 2)
    assert idx.tolist() == [8, 9] and ptr.tolist() == [0, 2]


def _fake_wheel(folder, version: str) -> str:
    path = os.path.join(folder, f"vllm-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as zf:
        for i, p in enumerate(NEEDED):
            zf.writestr(p, f"V = {i}\n")
    return path


def test_a_cached_release_extracted_before_sparse_swa_is_extracted_again_with_its_record(tmp_path, monkeypatch,
                                                                                         capfd):
    monkeypatch.setenv("SMV_CACHE", str(tmp_path / "cache"))
    wheel = _fake_wheel(tmp_path, "9.9.4")
    downloads = []

    def download(version, tmp):
        downloads.append(version)
        return shutil.copy(wheel, tmp)

    monkeypatch.setattr(loader, "_download_wheel", download)
    first = loader.fetch_tree("9.9.4")
    old = _stale_copy(first.root, tmp_path / "elsewhere")
    shutil.rmtree(first.root)
    shutil.copytree(old, first.root)  # the cache as an earlier suite left it
    capfd.readouterr()
    again = loader.fetch_tree("9.9.4")
    assert f"lacks {SWA}: extracting it again" in capfd.readouterr().err and downloads == ["9.9.4", "9.9.4"]
    meta = json.load(open(os.path.join(again.root, "smv-subject.json")))
    assert set(meta["modules"]) == set(NEEDED) and meta["wheel_sha256"] == again.wheel_sha256
    assert again.module_hashes() == meta["modules"] and not again.lacking()
    # another folder with the old tree: copied from the (now complete) cache, no download
    elsewhere = loader.fetch_tree("9.9.4", to=old)
    assert downloads == ["9.9.4", "9.9.4"] and elsewhere.module_hashes() == meta["modules"]
    assert json.load(open(os.path.join(old, "smv-subject.json"))) == meta
