"""Cases, strategies and the input builder for the ragged helpers contract (``impl.ragged``): dense top-k rows to
ragged, C4A local ids to global slots, and the SWA decode window (SPEC 1.3 and 2).

A case holds its data explicitly (small lists), so a reproducer is the input itself. The generators aim at the
places these helpers go wrong: -1 holes before valid entries, other negative values and INT32_MIN / INT32_MAX,
positions just past the block table's width and far past it, negative block ids and the largest block id whose
slots still fit int32, request ids outside the table, invalid (padding) tokens, empty rows and empty batches,
lengths past the width, odd block sizes, windows that cross block boundaries, int32 and int64 inputs, and block
tables that are a column slice of a wider buffer (stride > width) whose columns past the width hold
:data:`POISON_BLOCK`: a lookup that does not bound the column reads them.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
#: the block id every column past the table's width holds in its backing buffer (a real, positive id: a lookup
#: that reads past the width gets a plausible slot, never an obvious -1)
POISON_BLOCK = 7777
#: the largest SWA position a case holds: upstream derives a token's position as seq_len - 1 from an int32
#: sequence length, so the window's end (position + 1) must fit int32 (ours takes any int64 position: tests)
MAX_SWA_POSITION = INT32_MAX - 1
BLOCK_SIZES = (1, 2, 3, 5, 16, 64)
#: memory layouts of every tensor input but the block table (which has its own, ``table_pad``) (issue 30; the values
#: the same): packed; "slice" (an offset into a larger buffer, 2-D rows with extra columns); "strided" (every other
#: element / column); "transposed" (the 2-D inputs column-major, the 1-D ones strided). What no view reaches holds
#: :data:`LAYOUT_FILL` (True for is_valid_token): a helper that ignores a stride reads plausible values
INPUT_LAYOUTS = ("contiguous", "slice", "strided", "transposed")
LAYOUT_FILL = 1


def max_block_id(block_size: int) -> int:
    """The largest block id whose slots ``b * bs .. b * bs + bs - 1`` all fit int32."""
    return (INT32_MAX + 1) // block_size - 1


@dataclass(frozen=True)
class DensePart(Case):
    """``build_ragged_indices_from_dense``'s input: ``rows`` [R][width] dense indices, ``lens`` (topk_lens, or None:
    the count of entries >= 0), ``num_rows`` (None: the argument is left out, so the helper's default applies,
    which SPEC 2 makes -1, no check)."""

    KIND = "ragged-dense"
    rows: tuple[tuple[int, ...], ...] = ()
    width: int = 0
    lens: tuple[int, ...] | None = None
    num_rows: int | None = -1

    def __post_init__(self):
        super().__post_init__()
        if self.width < 0 or any(len(r) != self.width for r in self.rows):
            raise ValueError(f"rows: every row must hold width={self.width} (>= 0) entries")
        if self.lens is not None and len(self.lens) != len(self.rows):
            raise ValueError(f"lens: expected {len(self.rows)} entries, got {len(self.lens)}")

    @property
    def effective_num_rows(self) -> int:
        """The ``num_rows`` the helper runs with: the case's, or SPEC 2's default -1 when it is left out."""
        return -1 if self.num_rows is None else self.num_rows


@dataclass(frozen=True)
class GlobalPart(Case):
    """``compute_global_topk_ragged_indices_and_indptr``'s input beside the case's block table: ``rows`` [T][width]
    local compressed-row ids, ``token_to_req``, ``valid`` (is_valid_token, or None)."""

    KIND = "ragged-global"
    rows: tuple[tuple[int, ...], ...] = ()
    width: int = 0
    token_to_req: tuple[int, ...] = ()
    valid: tuple[bool, ...] | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.width < 0 or any(len(r) != self.width for r in self.rows):
            raise ValueError(f"rows: every row must hold width={self.width} (>= 0) entries")
        if len(self.token_to_req) != len(self.rows):
            raise ValueError(f"token_to_req: expected {len(self.rows)} entries, got {len(self.token_to_req)}")
        if self.valid is not None and len(self.valid) != len(self.rows):
            raise ValueError(f"valid: expected {len(self.rows)} entries, got {len(self.valid)}")


@dataclass(frozen=True)
class SwaPart(Case):
    """``compute_swa_indices_and_lens``'s input beside the case's block table: ``positions`` (negative: a padding
    token), ``token_to_req``, ``window``."""

    KIND = "ragged-swa"
    positions: tuple[int, ...] = ()
    token_to_req: tuple[int, ...] = ()
    window: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.window < 1:
            raise ValueError(f"window: expected a positive int, got {self.window!r}")
        if len(self.token_to_req) != len(self.positions):
            raise ValueError(f"token_to_req: expected {len(self.positions)} entries, got {len(self.token_to_req)}")
        if any(p > MAX_SWA_POSITION for p in self.positions):
            raise ValueError(f"positions: at most {MAX_SWA_POSITION} (position + 1 is a sequence length)")


@dataclass(frozen=True)
class RaggedCase(Case):
    """One call of each helper (``dense``, ``glob``, ``swa``), the last two on one block table
    ``[len(block_table)][table_width]`` with ``block_size``, handed as the first ``table_width`` columns of a buffer
    ``table_pad`` columns wider, those holding :data:`POISON_BLOCK`. ``index_dtype`` is the dtype of the dense rows,
    the local ids and the positions; ``aux_dtype`` that of topk_lens, token_to_req and the block table."""

    KIND = "ragged-helpers-oracle"
    ADDED_FIELDS = ('input_layout',)
    dense: DensePart = DensePart()
    glob: GlobalPart = GlobalPart()
    swa: SwaPart = SwaPart()
    index_dtype: Literal["int32", "int64"] = "int32"
    aux_dtype: Literal["int32", "int64"] = "int32"
    block_table: tuple[tuple[int, ...], ...] = ()
    table_width: int = 0
    table_pad: int = 0
    block_size: int = 1
    input_layout: str = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        if self.input_layout not in INPUT_LAYOUTS:
            raise ValueError(f"input_layout: expected one of {INPUT_LAYOUTS}, got {self.input_layout!r}")
        for name in ("table_width", "table_pad"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {getattr(self, name)!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size: expected a positive int, got {self.block_size!r}")
        if any(len(r) != self.table_width for r in self.block_table):
            raise ValueError(f"block_table: every row must hold table_width={self.table_width} entries")
        d, g, w = self.dense, self.glob, self.swa
        ints = [v for r in d.rows + g.rows + self.block_table for v in r] + list(d.lens or ()) + [d.effective_num_rows] + \
            list(g.token_to_req) + list(w.positions) + list(w.token_to_req)
        if any(not INT32_MIN <= v <= INT32_MAX for v in ints):
            raise ValueError("every value must fit int32 (the helpers' index domain)")
        bmax = max_block_id(self.block_size)
        if any(b > bmax for r in self.block_table for b in r):
            raise ValueError(f"block_table: block ids at most {bmax} for block_size {self.block_size} (int32 slots)")


_DT = {"int32": torch.int32, "int64": torch.int64}


def table_tensor(case: RaggedCase, device) -> torch.Tensor:
    """The case's block table: a ``[R, table_width]`` column slice of a ``[R, table_width + table_pad]`` buffer
    whose extra columns hold :data:`POISON_BLOCK`."""
    R, nb = len(case.block_table), case.table_width
    buf = torch.full((R, nb + case.table_pad), POISON_BLOCK, dtype=_DT[case.aux_dtype])
    if R and nb:
        buf[:, :nb] = torch.tensor(case.block_table, dtype=_DT[case.aux_dtype])
    return buf.to(device)[:, :nb]


def lay_out(t: torch.Tensor, layout: str, device) -> torch.Tensor:
    """``t`` (1-D or 2-D, CPU) on ``device`` as ``layout`` (:data:`INPUT_LAYOUTS`), the values the same."""
    if layout == "contiguous":
        return t.to(device)
    fill = True if t.dtype == torch.bool else LAYOUT_FILL
    if t.dim() == 2 and layout == "transposed":
        return t.t().contiguous().to(device).t()
    if t.dim() == 2:
        R, W = t.shape
        buf = torch.full((R + 1, 2 * W + 3), fill, dtype=t.dtype)
        view = (slice(1, R + 1), slice(2, 2 + W)) if layout == "slice" else (slice(0, R), slice(0, 2 * W, 2))
        buf[view] = t
        return buf.to(device)[view]
    n = t.numel()
    buf = torch.full((2 * n + 5,), fill, dtype=t.dtype)
    view = slice(3, 3 + n) if layout == "slice" else slice(0, 2 * n, 2)
    buf[view] = t
    return buf.to(device)[view]


def make_inputs(case: RaggedCase, helper: str, device) -> dict:
    """One helper's (``dense``, ``global``, ``swa``) arguments as tensors on ``device`` (keyword names of
    ``impl.ragged``'s entry points), every one but the block table laid out as ``case.input_layout``."""
    kw = _make_packed_inputs(case, helper, "cpu")
    out = {k: lay_out(v, case.input_layout, device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    if "block_table" in out:  # its own layout (a column slice when table_pad), made on the device
        out["block_table"] = table_tensor(case, device)
    return out


def _make_packed_inputs(case: RaggedCase, helper: str, device) -> dict:
    idt, adt = _DT[case.index_dtype], _DT[case.aux_dtype]
    if helper == "dense":
        d = case.dense
        dense = torch.tensor(d.rows, dtype=idt).reshape(len(d.rows), d.width).to(device)
        lens = None if d.lens is None else torch.tensor(d.lens, dtype=adt).to(device)
        kwargs = {"dense_indices": dense, "topk_lens": lens}
        if d.num_rows is not None:  # None: left out, the entry point's default is what runs
            kwargs["num_rows"] = d.num_rows
        return kwargs
    table = table_tensor(case, device)
    if helper == "global":
        g = case.glob
        local = torch.tensor(g.rows, dtype=idt).reshape(len(g.rows), g.width).to(device)
        valid = None if g.valid is None else torch.tensor(g.valid, dtype=torch.bool).to(device)
        return {"local_indices": local, "token_to_req": torch.tensor(g.token_to_req, dtype=adt).to(device),
                "block_table": table, "block_size": case.block_size, "is_valid_token": valid}
    w = case.swa
    return {"positions": torch.tensor(w.positions, dtype=idt).to(device),
            "token_to_req": torch.tensor(w.token_to_req, dtype=adt).to(device), "block_table": table,
            "block_size": case.block_size, "window": w.window}


# --- strategies -------------------------------------------------------------------------------------------------
# The case's contents come from a Random seeded by one drawn integer: the ci profile's 25 derandomized draws are then
# 25 different inputs (drawn element by element, Hypothesis' mutations repeat one input's structure many times);
# a failing case is stored whole (explicit lists), and its violations name the entry where it differs.

def _table(rng: random.Random, block_size: int):
    """(rows, width, pad): block ids mostly small, with -1, other negative ids, INT32_MIN and the largest id whose
    slots fit int32; now and then an empty table (no rows, or rows of width 0), where every lookup is outside."""
    R = rng.choice([0] + [1, 2, 3] * 3)
    nb = rng.choice([0] + [1, 2, 3, 4] * 2)
    special = [-1, -3, INT32_MIN, max_block_id(block_size)]
    rows = [[rng.choice(special) if rng.random() < 0.15 else rng.randint(0, 40) for _ in range(nb)]
            for _ in range(R)]
    return rows, nb, rng.choice([0, 1, 3])


def _index_value(rng: random.Random, span: int) -> int:
    """An index a producer may emit: valid-looking in [0, span) (most often), -1, another negative, just past
    ``span`` and, rarely, an int32 extreme (one per case is enough to show how it is treated)."""
    k = rng.randrange(40)
    if k == 0:
        return rng.choice([INT32_MIN, INT32_MAX])
    if k < 3:
        return min(span + rng.randrange(4), INT32_MAX)
    if k < 13:
        return -1
    if k == 13:
        return -7
    return rng.randrange(max(span, 1))


def _rows(rng: random.Random, n: int, span: int) -> tuple[list, int]:
    """``n`` rows of one width: with -1 holes before valid entries, valid entries first then -1 (what a top-k
    producer usually emits), all -1 (empty)."""
    width = rng.randint(0, 7)
    rows = []
    for _ in range(n):
        kind = rng.choice(["holes", "holes", "prefix", "empty"])
        row = [-1] * width if kind == "empty" else [_index_value(rng, span) for _ in range(width)]
        if kind == "prefix":
            good = [v for v in row if v >= 0]
            row = good + [-1] * (width - len(good))
        rows.append(row)
    return rows, width


def _request(rng: random.Random, R: int) -> int:
    """A request id: a row of the table, now and then one past it or negative."""
    k = rng.randrange(40)
    return R if k == 0 else -1 if k == 1 else rng.randrange(max(R, 1))


def _dense_part(rng: random.Random) -> DensePart:
    R = rng.randint(0, 5)
    num_rows = rng.choice([None, -1, -1, 0, 5, 33, INT32_MAX])
    rows, width = _rows(rng, R, num_rows if num_rows is not None and num_rows > 0 else 40)
    lens = None if rng.random() < 0.4 else [rng.choice([INT32_MIN, INT32_MAX]) if rng.random() < 0.1 else
                                            rng.randint(-2, width + 3) for _ in range(R)]
    return DensePart(rows=rows, width=width, lens=lens, num_rows=num_rows)


def _global_part(rng: random.Random, R: int, span: int) -> GlobalPart:
    T = rng.randint(0, 5)
    rows, width = _rows(rng, T, span)
    reqs = [_request(rng, R) for _ in range(T)]
    p_invalid = rng.choice([None, 0.5, 0.3])
    valid = None if p_invalid is None else [rng.random() >= p_invalid for _ in range(T)]
    return GlobalPart(rows=rows, width=width, token_to_req=reqs, valid=valid)


def _swa_part(rng: random.Random, R: int, span: int) -> SwaPart:
    T = rng.randint(0, 5)

    def position():
        k = rng.randrange(20)
        if k == 0:
            return rng.choice([-5, INT32_MIN, MAX_SWA_POSITION])
        if k == 1:
            return -1
        if k < 5:  # around the end of the table
            return rng.randint(max(span - 3, 0), span + 3)
        return rng.randint(0, span + 2)

    return SwaPart(positions=[position() for _ in range(T)], token_to_req=[_request(rng, R) for _ in range(T)],
                   window=rng.choice([1, 2, 3, 4, 8, 128]))


def case_from_seed(seed: int) -> RaggedCase:
    """The case the strategy draws for ``seed``: one input for each helper, the dense rows on their own, the C4A
    rows and the SWA positions on one block table of an odd or even block size."""
    rng = random.Random(seed)
    bs = rng.choice(BLOCK_SIZES)
    table, nb, pad = _table(rng, bs)
    R = len(table)
    return RaggedCase(dense=_dense_part(rng), glob=_global_part(rng, R, nb * bs), swa=_swa_part(rng, R, nb * bs),
                      index_dtype=rng.choice(["int32", "int64"]), aux_dtype=rng.choice(["int32", "int64"]),
                      block_table=table, table_width=nb, table_pad=pad, block_size=bs)


def ragged_cases():
    """Cases for ``ragged-helpers-oracle`` (see :func:`case_from_seed`), their inputs laid out as drawn."""
    return st.builds(lambda seed, layout: case_from_seed(seed).replace(input_layout=layout),
                     st.integers(0, 2 ** 32 - 1), st.sampled_from(INPUT_LAYOUTS))


# --- declared dimensions ----------------------------------------------------------------------------------------
# The first token (row) of each part carries the class; the rest stay as drawn. A forced case keeps the drawn
# shapes (a few more entries at most), so it costs what a drawn one does.

BLOCK_CLASSES = ("1", "odd", "64")
TABLE_KINDS = ("plain", "slice")
GLOBAL_ENTRY_KINDS = ("hole", "past-width", "neg-block", "request", "invalid-token")
SWA_POSITION_KINDS = ("padding", "clamped", "cross", "past-width")
NUM_ROWS_KINDS = ("default", "off", "zero", "small", "int32max")
DENSE_LEN_KINDS = ("count", "in-range", "over", "under")


def _block_class(bs: int) -> str:
    return "1" if bs == 1 else ("64" if bs == 64 else ("odd" if bs % 2 else "even"))


def _global_kind(case: RaggedCase) -> str | None:
    """What the first C4A token meets first: an invalid token, a request outside the table, then at its first valid
    entry a column past the width or a negative block id, then a -1 hole before a valid entry."""
    g = case.glob
    if not g.rows:
        return None
    if g.valid is not None and not g.valid[0]:
        return "invalid-token"
    req, row = g.token_to_req[0], g.rows[0]
    if not 0 <= req < len(case.block_table):
        return "request"
    first = next((i for i in row if i >= 0), None)
    if first is not None:
        col = first // case.block_size
        if col >= case.table_width:
            return "past-width"
        if case.block_table[req][col] < 0:
            return "neg-block"
    if _holes(row):
        return "hole"
    return "plain"


def _holes(row) -> bool:
    seen = False
    for v in row:
        if v < 0:
            seen = True
        elif seen:
            return True
    return False


def _swa_kind(case: RaggedCase) -> str | None:
    w = case.swa
    if not w.positions:
        return None
    p, bs = w.positions[0], case.block_size
    if p < 0:
        return "padding"
    if p // bs >= case.table_width:
        return "past-width"
    start = p - w.window + 1
    if start < 0:
        return "clamped"
    return "cross" if start // bs != p // bs else "inside"


def _num_rows_kind(n: int | None) -> str:
    if n is None:
        return "default"
    return {-1: "off", 0: "zero", INT32_MAX: "int32max"}.get(n, "small" if n > 0 else "negative")


def _dense_len_kind(d: DensePart) -> str | None:
    if d.lens is None:
        return "count"
    if not d.rows:
        return None
    n = d.lens[0]
    return "under" if n < 0 else ("over" if n > d.width else "in-range")


def classify_ragged(case: RaggedCase, target=None) -> dict:
    """The dimension values a case hits (a part with no rows leaves its dimension out)."""
    out = {"block": _block_class(case.block_size), "table": "slice" if case.table_pad else "plain",
           "num_rows": _num_rows_kind(case.dense.num_rows), "index_dtype": case.index_dtype,
           "aux_dtype": case.aux_dtype, "input_layout": case.input_layout}
    for k, v in (("global_entry", _global_kind(case)), ("swa_position", _swa_kind(case)),
                 ("dense_len", _dense_len_kind(case.dense))):
        if v is not None:
            out[k] = v
    return out


def force_ragged(case: RaggedCase, combo: dict, target=None) -> RaggedCase:
    """``case`` rewritten to hit ``combo``: block size, table padding, the first C4A token's entry kind, the first
    SWA token's position kind, ``num_rows``, the first dense row's length kind, the dtypes; the rest as drawn."""
    rng = random.Random(zlib.crc32(repr((case.dense, case.glob, case.swa, case.block_table)).encode()))
    bs = case.block_size
    if "block" in combo:
        bs = {"1": 1, "odd": rng.choice([3, 5]), "64": 64}[combo["block"]]
    bmax = max_block_id(bs)
    table = [[min(b, bmax) for b in r] for r in case.block_table]
    R, nb = len(table), case.table_width
    if R < 2 or nb < 2:  # the forced entries need two requests and two columns
        nb = max(nb, 2)
        table = [(list(table[r]) if r < len(table) else []) + [rng.randint(0, 40) for _ in range(nb)]
                 for r in range(max(R, 2))]
        table = [r[:nb] for r in table]
        R = len(table)
    pad = case.table_pad
    if "table" in combo:
        pad = 0 if combo["table"] == "plain" else (pad or 3)
    glob, swa, dense = case.glob, case.swa, case.dense

    if "global_entry" in combo:
        kind = combo["global_entry"]
        rows = [list(r) for r in glob.rows] or [[]]
        reqs = list(glob.token_to_req) or [0]
        width = max(glob.width, 3)
        rows = [r + [-1] * (width - len(r)) for r in rows]
        col = nb - 1 if kind == "neg-block" else 0
        i = col * bs + rng.randrange(bs)
        if kind == "past-width":
            i = nb * bs + rng.randrange(3)
        rows[0] = ([-1, i] if kind == "hole" else [i, -1]) + [rng.randrange(nb * bs) for _ in range(width - 2)]
        if kind == "neg-block":
            table[0][col] = rng.choice([-1, -3, INT32_MIN])
        elif table[0][0] < 0:
            table[0][0] = rng.randint(0, 40)
        reqs[0] = rng.choice([R, -1]) if kind == "request" else 0
        valid = None if glob.valid is None else list(glob.valid) + [True] * (len(rows) - len(glob.valid))
        if kind == "invalid-token":
            valid = valid or [True] * len(rows)
            valid[0] = False
        elif valid is not None:
            valid[0] = True
        glob = GlobalPart(rows=rows, width=width, token_to_req=reqs, valid=valid)

    if "swa_position" in combo:
        kind = combo["swa_position"]
        pos, reqs, window = list(swa.positions) or [0], list(swa.token_to_req) or [0], swa.window
        if kind == "padding":
            pos[0] = rng.choice([-1, -5])
        elif kind == "past-width":
            pos[0] = nb * bs + rng.randrange(3)
        elif kind == "clamped":
            window = max(window, 2)
            pos[0] = min(rng.randrange(window - 1), nb * bs - 1)
        else:  # cross: the window's start in column 0, its end in column 1
            window = min(max(window, 2), bs + 1)
            pos[0] = bs
        reqs[0] = 0
        swa = SwaPart(positions=pos, token_to_req=reqs, window=window)

    if "num_rows" in combo or "dense_len" in combo:
        rows, width, lens = [list(r) for r in dense.rows], dense.width, dense.lens
        num_rows = dense.num_rows
        if "num_rows" in combo:
            num_rows = {"default": None, "off": -1, "zero": 0, "small": rng.choice([5, 33]),
                        "int32max": INT32_MAX}[combo["num_rows"]]
        if not rows:  # one row, its kept values past 1 (where a wrong default or bound shows)
            width = max(width, 3)
            rows = [[rng.randint(1, 40) for _ in range(width)]]
            lens = None if lens is None else [width]
        if "dense_len" in combo:
            kind = combo["dense_len"]
            if kind == "count":
                lens = None
            else:
                lens = list(lens) if lens is not None else [rng.randint(0, width) for _ in rows]
                lens[0] = {"in-range": rng.randint(0, width), "over": width + 1 + rng.randrange(3),
                           "under": rng.choice([-1, -2, INT32_MIN])}[kind]
        dense = DensePart(rows=rows, width=width, lens=lens, num_rows=num_rows)

    return RaggedCase(dense=dense, glob=glob, swa=swa, index_dtype=combo.get("index_dtype", case.index_dtype),
                      aux_dtype=combo.get("aux_dtype", case.aux_dtype), block_table=table, table_width=nb,
                      table_pad=pad, block_size=bs, input_layout=combo.get("input_layout", case.input_layout))


def ragged_family_examples(target=None) -> list[RaggedCase]:
    """Plain cases: one with every part empty, one with a small table and one row per part."""
    return [RaggedCase(), RaggedCase(
        dense=DensePart(rows=((0, 1, -1),), width=3, lens=None, num_rows=-1),
        glob=GlobalPart(rows=((0, 1),), width=2, token_to_req=(0,)),
        swa=SwaPart(positions=(1,), token_to_req=(0,), window=2),
        block_table=((1, 2), (3, 4)), table_width=2, table_pad=0, block_size=1)]


def _declare_ragged():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "ragged",
        (Dimension("block", BLOCK_CLASSES, "block size class: 1, odd (3, 5), the production 64"),
         Dimension("table", TABLE_KINDS, "the block table as is, or a column slice of a wider poisoned buffer"),
         Dimension("global_entry", GLOBAL_ENTRY_KINDS, "the first C4A token: a -1 hole before a valid id, an id "
                   "past the width, a negative block id, a request outside the table, an invalid token"),
         Dimension("swa_position", SWA_POSITION_KINDS, "the first SWA token: padding (negative), a start clamped "
                   "to 0, a window crossing a block boundary, a window reaching past the width"),
         Dimension("num_rows", NUM_ROWS_KINDS, "dense->ragged's num_rows: left out (the default), -1, 0, small, "
                   "INT32_MAX"),
         Dimension("dense_len", DENSE_LEN_KINDS, "the first dense row's length: counted, given in range, past the "
                   "width, negative"),
         Dimension("index_dtype", ("int32", "int64")),
         Dimension("aux_dtype", ("int32", "int64")),
         Dimension("input_layout", INPUT_LAYOUTS, "every input but the table packed, a slice of a larger buffer "
                                                  "(2-D: extra columns), strided, or column-major (issue 30)")),
        (("block", "global_entry"), ("block", "swa_position"), ("table", "global_entry"), ("table", "swa_position"),
         ("num_rows", "dense_len"), ("index_dtype", "num_rows"), ("index_dtype", "aux_dtype"),
         # the layout against what reads the inputs: the dense row's length (counted or given: topk_lens read or
         # not) and the dtypes (the views' element size); the C4A and SWA parts meet it as drawn (one component
         # more would take the ci array past its 25 rows)
         ("input_layout", "dense_len"), ("input_layout", "index_dtype")),
        classify_ragged, force_ragged, None, ragged_family_examples), "ragged-helpers-oracle")


RAGGED_DIMENSIONS = _declare_ragged()
