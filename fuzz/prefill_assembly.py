"""Strategies and builders for the DSv4 prefill assembly (SPEC sections 3 and 9): chunk plans and combined
top-k + SWA index rows.

``assembly_cases``: a prefill batch of 1..8 requests for a C4A (ratio 4), C128A (ratio 128) or SWA-only (ratio 1,
no top-k, N = 0) layer; windows 3, 4, 8 and DSv4's 128; prefixes longer and shorter than the window, empty ones and
q_len 1; request sizes near the limits (so five of them overflow the area budget of four), small ones (many per
chunk) or mixed, so chunks end where the budget is crossed; gather lengths shortened by a bounded replay in some
requests. Top-k rows hold mostly causal local ids (< (pos + 1) // ratio), some invalid ones (-1, -2, N, N + 1, M,
INT32 extremes) and the boundary N - 1; every entry past a token's topk_len and every column past ``topk`` is a
live-looking id in [0, N), so a read past the length shows. The top-k tensor is int32 or int64, 2-D or [T, 1, K],
contiguous, row-padded or column-major, and query_start_loc starts past 0 (decode tokens before the prefills).
An SWA-only layer's top-k tensor is never empty (its callers pass the indexer's buffer; upstream's kernel cannot
take zero columns).

Image visibility (DSv4's vision variant): ``max_image_tokens`` 0 (text), or 3 / window + 5 with no image span in
the batch (rows widened, no visibility tensors) or with spans (per request, inclusive [start, end] positions, at most
``max_image_tokens`` tokens each, as an image is) placed so the first request's query tokens sit at a span's edges
(its first and last token, one before, one after) and a span may run past the sequence so far (an image split
across prefill steps); the per-token visible counts come from ``oracles.prefill_assembly.ref_image_visibility``.

``AssemblyCase.workspace`` pins the chunk's (N, M) instead of planning (upstream's older expected table uses N 8,
M 20); ``expect`` holds literal unpadded row prefixes for pinned examples.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case
from impl.runtime import kernel_device
from oracles import prefill_assembly as ref

INT32_MIN = -(2 ** 31)
INT32_MAX = 2 ** 31 - 1
Layer = Literal["c4a", "c128a", "swa_only"]
LAYER_RATIO = {"c4a": 4, "c128a": 128, "swa_only": 1}
TopkLayout = Literal["contiguous", "padded", "colmajor"]
TOPK_LAYOUTS: tuple[str, ...] = typing.get_args(TopkLayout)
#: extra columns of the padded top-k layout (never read)
TOPK_ROW_PAD = 5


@dataclass(frozen=True)
class AssemblyCase(Case):
    """One prefill batch: per request ``seq_lens`` / ``query_lens``, ``replay_cut`` prefix tokens below a replay
    start (the exact gather is q_len + min(max(prefix - cut, 0), window - 1)); a layer of ``ratio`` with ``topk``
    top-k entries (0: SWA-only) in rows ``topk_extra`` columns wider; the planner's ``max_model_len`` and
    ``max_num_batched_tokens``; top-k values invalid with probability ``invalid_rate`` (INT32 extremes among them
    when ``int32_extremes``); the top-k tensor as ``topk_dtype`` / ``topk_3d`` / ``topk_layout``; query_start_loc
    offset by ``qsl_base``. ``workspace`` = (N, M): one chunk of every request with that workspace instead of the
    plan. ``topk_rows``: every token's top-k row given literally (``topk + topk_extra`` wide) instead of drawn from
    the seed. ``expect``: the literal unpadded prefix of every token's row (pinned examples only)."""

    KIND = "prefill-assembly"
    ADDED_FIELDS = ('max_image_tokens', 'image_spans')
    seed: int
    ratio: int
    topk: int
    topk_extra: int
    window: int
    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    replay_cut: tuple[int, ...]
    max_model_len: int
    max_num_batched_tokens: int
    invalid_rate: float
    int32_extremes: bool
    topk_dtype: Literal["int32", "int64"]
    topk_3d: bool
    topk_layout: TopkLayout
    qsl_base: int
    workspace: tuple[int, int] | None = None
    topk_rows: tuple[tuple[int, ...], ...] | None = None
    expect: tuple[tuple[int, ...], ...] | None = None
    max_image_tokens: int = 0
    image_spans: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self):
        super().__post_init__()
        if self.max_image_tokens < 0:
            raise ValueError(f"max_image_tokens: expected an int >= 0, got {self.max_image_tokens!r}")
        for span in self.image_spans:
            if (len(span) != 3 or not 0 <= span[0] < len(self.seq_lens) or not 0 <= span[1] <= span[2]
                    or span[2] - span[1] + 1 > self.max_image_tokens):
                raise ValueError(f"image_spans: expected (request, start, end) with 0 <= start <= end and at most "
                                 f"max_image_tokens = {self.max_image_tokens} tokens, got {span!r}")
        n = len(self.seq_lens)
        if n < 1 or len(self.query_lens) != n or len(self.replay_cut) != n:
            raise ValueError(f"seq_lens/query_lens/replay_cut: expected the same number (>= 1) of requests, got "
                             f"{len(self.seq_lens)}/{len(self.query_lens)}/{len(self.replay_cut)}")
        for name in ("ratio", "window", "max_model_len", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {getattr(self, name)!r}")
        for name in ("seed", "topk", "topk_extra", "qsl_base"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {getattr(self, name)!r}")
        for r, (s, q, c) in enumerate(zip(self.seq_lens, self.query_lens, self.replay_cut)):
            if not 1 <= q <= self.max_num_batched_tokens or not q <= s <= self.max_model_len or c < 0:
                raise ValueError(f"request {r}: expected 1 <= q_len <= max_num_batched_tokens, q_len <= seq_len <= "
                                 f"max_model_len and replay_cut >= 0, got seq {s}, q {q}, cut {c}")
        if not 0.0 <= self.invalid_rate < 1.0:
            raise ValueError(f"invalid_rate: expected a probability in [0, 1), got {self.invalid_rate!r}")
        width = self.topk + self.topk_extra
        if self.topk_rows is not None and (len(self.topk_rows) != sum(self.query_lens)
                                           or any(len(r) != width for r in self.topk_rows)):
            raise ValueError(f"topk_rows: expected {sum(self.query_lens)} rows of {width} entries")
        if self.expect is not None and len(self.expect) != sum(self.query_lens):
            raise ValueError(f"expect: expected one row per query token ({sum(self.query_lens)}), got "
                             f"{len(self.expect)}")

    @property
    def gather_lens(self) -> list[int]:
        """Exact gather lengths (SPEC 9's prefill gather-length kernel: the prefix below the replay start holds no
        window KV)."""
        return [q + min(max(s - q - c, 0), self.window - 1)
                for s, q, c in zip(self.seq_lens, self.query_lens, self.replay_cut)]


def _budget_tile(ratio: int, window: int, mml: int, mnbt: int, pick: int):
    """(c, seq, q): c in 5..7 requests of that shape whose chunk area c * (seq // ratio + q + min(prefix, window -
    1)) equals the area budget exactly (SPEC 9: such a chunk still fits), or None; ``pick`` chooses among them."""
    compressed = 0 if ratio <= 1 else -(-mml // ratio)
    budget = ref.SPEC_PREFILL_CHUNK_SIZE * (compressed + window + mnbt)
    found = []
    for c in (5, 6, 7):
        if budget % c:
            continue
        width = budget // c
        for q in range(1, mnbt + 1):
            for s in range(q, mml + 1):
                n = s // ratio if ratio > 1 else 0
                if n + q + min(s - q, window - 1) == width:
                    found.append((c, s, q))
                    break
    return found[pick % len(found)] if found else None


def _rotated(lo: int, hi: int, start: int):
    n = hi - lo + 1
    return st.integers(0, n - 1).map(lambda x: lo + (start - lo + x) % n)


def assembly_cases():
    """See the module docstring. The first derandomized cases are C4A batches that cross the budget."""
    @st.composite
    def build(draw):
        layer = draw(st.sampled_from(["c4a", "c128a", "swa_only"]))
        ratio = LAYER_RATIO[layer]
        window = draw(st.sampled_from([4, 3, 8, 128]))
        mnbt = draw(_rotated(2, 16, 8))
        if layer == "c128a":
            mml = draw(st.integers(130, 520))
            topk = draw(st.sampled_from([4, 128]))
        elif layer == "c4a":
            mml = draw(st.integers(max(mnbt, 8), 72))
            topk = draw(st.sampled_from([8, 4, 512]))
        else:
            mml = draw(st.integers(max(mnbt, 4), 60))
            topk = 0
        mml = max(mml, mnbt)
        n = draw(_rotated(1, 8, 5))
        sizing = draw(st.sampled_from(["near_max", "mixed", "small", "at_budget"]))
        seqs, qs = [], []
        tile = _budget_tile(ratio, window, mml, mnbt, draw(st.integers(0, 2 ** 16))) if sizing == "at_budget" else None
        if tile is not None:  # c requests whose area is exactly the budget, then one more
            c, s_t, q_t = tile
            seqs, qs = [s_t] * c, [q_t] * c
            n, sizing = 1, "small"
        elif sizing == "at_budget":
            sizing = "near_max"
        for _ in range(n):
            kind = sizing if sizing != "mixed" else draw(st.sampled_from(["near_max", "small"]))
            if kind == "near_max":
                q = draw(st.integers(max(1, mnbt - 2), mnbt))
                s = draw(st.integers(max(q, mml - 8), mml))
            else:
                q = draw(st.sampled_from([1, 1, 2, 3]))
                q = min(q, mnbt)
                prefix = draw(st.sampled_from([0, 1, window - 1, window, window + 2, 2 * window]))
                s = min(q + prefix, mml)
            seqs.append(s)
            qs.append(q)
        cuts = draw(st.lists(st.sampled_from([0, 0, 0, 1, 2, 5, 1000]), min_size=len(seqs), max_size=len(seqs)))
        image = draw(st.sampled_from(["off", "spans", "width"]))
        mit = 0 if image == "off" else draw(st.sampled_from([window + 5, 3]))
        spans = ()
        if image == "spans":
            spans = tuple(_span_at_edge(r, seqs[r], qs[r], mit, draw(st.integers(0, 2 ** 16)))
                          for r in sorted(set([0] + draw(st.lists(st.integers(0, len(seqs) - 1), max_size=2)))))
        return AssemblyCase(
            seed=draw(st.integers(0, 2 ** 31 - 1)), ratio=ratio, topk=topk,
            topk_extra=draw(st.sampled_from([0, 3] if topk else [3, 1])), window=window, seq_lens=tuple(seqs),
            query_lens=tuple(qs),
            replay_cut=tuple(cuts), max_model_len=mml, max_num_batched_tokens=mnbt,
            invalid_rate=draw(st.sampled_from([0.2, 0.0, 0.5])), int32_extremes=draw(st.booleans()),
            topk_dtype=draw(st.sampled_from(["int32", "int64"])), topk_3d=draw(st.booleans()),
            topk_layout=draw(st.sampled_from(TOPK_LAYOUTS)), qsl_base=draw(st.sampled_from([3, 0])),
            max_image_tokens=mit, image_spans=spans)

    return build()


def _span_at_edge(req: int, seq_len: int, q_len: int, mit: int, pick: int) -> tuple[int, int, int]:
    """An image span of request ``req`` (a whole image of ``mit`` tokens half the time, else 1..``mit``) with an
    edge at, or one off, one of the request's query tokens: starting at its first query token, one before or after
    it; ending at the last token so far, one before it, or past it (the image continues in a later prefill step).
    A whole image ending at the last token gives that token mit - 1 visible tokens to its left: past a window
    shorter than the image."""
    length = mit if pick % 2 else 1 + pick // 2 % mit
    pick //= 2 * mit
    first, last = seq_len - q_len, seq_len - 1
    start = [first, first - 1, first + 1, last - length + 1, last - length + 2, last - length][pick % 6]
    start = max(0, start)
    return (req, start, start + length - 1)


# --- inputs ------------------------------------------------------------------------------------------------------

@dataclass
class ChunkInputs:
    """One chunk's arguments (tensors on the kernel device) and the same data as lists for the oracle."""

    start: int
    end: int
    N: int
    M: int
    topk_indices: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    gather_lens: torch.Tensor
    topk_rows: list[list[int]]
    qsl: list[int]
    seqs: list[int]
    gathers: list[int]
    left_visible: torch.Tensor | None = None
    right_visible: torch.Tensor | None = None
    left: list[int] | None = None
    right: list[int] | None = None

    def image_kwargs(self, case: "AssemblyCase") -> dict:
        """The image arguments of ``combine_topk_swa_indices`` for this chunk ({} for a text case)."""
        if not case.max_image_tokens and self.left_visible is None:
            return {}
        return dict(max_image_tokens=case.max_image_tokens, left_visible=self.left_visible,
                    right_visible=self.right_visible)


@dataclass
class AssemblyInputs:
    plan: list[tuple[int, int, int, int]]  # the oracle's (or the pinned workspace's)
    chunks: list[ChunkInputs]
    topk_full: torch.Tensor  # the batch's top-k tensor (the chunks' rows are views into it)


def image_visibility(case: AssemblyCase) -> tuple[list[int] | None, list[int] | None]:
    """Every query token's visible image counts (batch order) from the case's spans, or (None, None) without
    spans (upstream passes no visibility tensors for a batch with no image)."""
    if not case.image_spans:
        return None, None
    left, right = [], []
    for r, (s, q) in enumerate(zip(case.seq_lens, case.query_lens)):
        spans = [(a, b) for req, a, b in case.image_spans if req == r]
        for pos in range(s - q, s):
            lv, rv = ref.ref_image_visibility(pos, spans, case.max_image_tokens)
            left.append(lv)
            right.append(rv)
    return left, right


def oracle_plan(case: AssemblyCase) -> list[tuple[int, int, int, int]]:
    if case.workspace is not None:
        n, m = case.workspace
        return [(0, len(case.seq_lens), n, m)]
    return ref.ref_plan_chunks(list(case.seq_lens), list(case.query_lens), ratio=case.ratio,
                               max_model_len=case.max_model_len, max_num_batched_tokens=case.max_num_batched_tokens,
                               window=case.window)


def _chunk_of_requests(plan):
    """Each request's chunk tuple, in request order."""
    return [c for c in plan for _ in range(c[0], c[1])]


def build_assembly_inputs(case: AssemblyCase, device: str | None = None) -> AssemblyInputs:
    """Every tensor of ``case`` from its seed (or its literal ``topk_rows``) on the kernel device."""
    device = device or kernel_device()
    gen = torch.Generator().manual_seed(case.seed)
    plan = oracle_plan(case)
    K = case.topk + case.topk_extra
    T = sum(case.query_lens)
    # per token: its request's chunk N and M, and how many compressed rows it may see
    n_t, m_t, vis_t = [], [], []
    for s, q, (_, _, n_c, m_c) in zip(case.seq_lens, case.query_lens, _chunk_of_requests(plan)):
        n_t += [n_c] * q
        m_t += [m_c] * q
        vis_t += [(s - q + i + 1) // case.ratio for i in range(q)]
    n_t, m_t, vis_t = (torch.tensor(x, dtype=torch.int64).reshape(T, 1) for x in (n_t, m_t, vis_t))
    topk_len = vis_t.clamp(max=case.topk)
    col = torch.arange(K, dtype=torch.int64).reshape(1, K)
    u = torch.rand(T, K, generator=gen, dtype=torch.float64)
    causal = (torch.rand(T, K, generator=gen, dtype=torch.float64) * vis_t).floor().to(torch.int64)
    junk = (torch.rand(T, K, generator=gen, dtype=torch.float64) * n_t).floor().to(torch.int64)
    extremes = [INT32_MIN, INT32_MAX] if case.int32_extremes else []
    invalid = torch.cat([torch.full((T, 1), -1), torch.full((T, 1), -2), n_t, n_t + 1, m_t]
                        + [torch.full((T, 1), x) for x in extremes], dim=1)
    pick = torch.randint(0, invalid.shape[1], (T, K), generator=gen)
    vals = torch.where(u < case.invalid_rate, invalid.gather(1, pick),
                       torch.where((u < case.invalid_rate + 0.1) & (n_t > 0), n_t - 1, causal))
    # never read past topk_len: a live-looking id, so a read there changes the row
    vals = torch.where(col < topk_len, vals, junk)
    rows = vals.tolist()
    if case.topk_rows is not None:
        rows = [list(r) for r in case.topk_rows]
    dt = torch.int32 if case.topk_dtype == "int32" else torch.int64
    dense = torch.tensor(rows, dtype=torch.int64).reshape(T, K).to(dt)
    if case.topk_layout == "padded":
        buf = torch.full((T, K + TOPK_ROW_PAD), 0, dtype=dt)
        buf[:, :K] = dense
        topk_full = buf.to(device)[:, :K]
    elif case.topk_layout == "colmajor":
        topk_full = dense.t().contiguous().to(device).t()
    else:
        topk_full = dense.to(device)
    qsl = [case.qsl_base]
    for q in case.query_lens:
        qsl.append(qsl[-1] + q)
    qsl_t = torch.tensor(qsl, dtype=torch.int32, device=device)
    seq_t = torch.tensor(case.seq_lens, dtype=torch.int32, device=device)
    gathers = case.gather_lens
    g_t = torch.tensor(gathers, dtype=torch.int32, device=device)
    left, right = image_visibility(case)
    chunks = []
    for s, e, n_c, m_c in plan:
        t0, t1 = qsl[s] - qsl[0], qsl[e] - qsl[0]
        tk = topk_full[t0:t1]
        if case.topk_3d:
            tk = tk.unsqueeze(1)
        ch = ChunkInputs(s, e, n_c, m_c, tk, qsl_t[s:e + 1], seq_t[s:e], g_t[s:e], rows[t0:t1],
                         qsl[s:e + 1], list(case.seq_lens[s:e]), gathers[s:e])
        if left is not None:
            ch.left, ch.right = left[t0:t1], right[t0:t1]
            ch.left_visible = torch.tensor(ch.left, dtype=torch.int32, device=device)
            ch.right_visible = torch.tensor(ch.right, dtype=torch.int32, device=device)
        chunks.append(ch)
    return AssemblyInputs(plan, chunks, topk_full)


# --- declared dimensions (fuzz.dimensions) ----------------------------------------------------------------------

LAYERS: tuple[str, ...] = typing.get_args(Layer)
RATIO_LAYER = {r: name for name, r in LAYER_RATIO.items()}
WINDOWS = (3, 4, 8, 128)
#: the first request's prefix (seq_len - q_len) against the window: the SWA part's start max(pos - window + 1, 0)
PREFIX_CLASSES = ("0", "1", "w-1", "w", "w+1")
#: the first request's q_len around the combine kernel's BLOCK_T = 16 tokens per program
COMBINE_TILE = 16
QLEN_CLASSES = ("1", "t-1", "t", "t+1")
INVALID_KINDS = ("none", "slots", "int32")
#: image visibility: a text model, rows widened for images but none in the batch, image spans in the batch
IMAGE_KINDS = ("off", "width", "spans")


def _prefix_len(cls: str, window: int) -> int:
    return {"0": 0, "1": 1, "w-1": window - 1, "w": window, "w+1": window + 1}[cls]


def _qlen(cls: str) -> int:
    t = COMBINE_TILE
    return {"1": 1, "t-1": t - 1, "t": t, "t+1": t + 1}[cls]


def classify_assembly(case: AssemblyCase, target=None) -> dict:
    """The dimension values an assembly case hits (prefix, q_len and replay are its first request's; a value in
    no class is left out)."""
    s, q, cut = case.seq_lens[0], case.query_lens[0], case.replay_cut[0]
    p = s - q
    out = {
        "replay": "shortened" if min(max(p - cut, 0), case.window - 1) < min(p, case.window - 1) else "full",
        "invalid": "none" if case.topk == 0 or case.invalid_rate == 0 else ("int32" if case.int32_extremes
                                                                            else "slots"),
        "topk_layout": case.topk_layout,
        "topk_dtype": case.topk_dtype,
        "topk_3d": case.topk_3d,
        "qsl_base": "zero" if case.qsl_base == 0 else "offset",
        "image": "off" if not case.max_image_tokens else ("spans" if case.image_spans else "width"),
    }
    if case.ratio in RATIO_LAYER and (case.ratio == 1) == (case.topk == 0):
        out["layer"] = RATIO_LAYER[case.ratio]
    if case.window in WINDOWS:
        out["window"] = case.window
    cls = next((c for c in PREFIX_CLASSES if _prefix_len(c, case.window) == p), None)
    if cls is not None:
        out["prefix"] = cls
    cls = next((c for c in QLEN_CLASSES if _qlen(c) == q), None)
    if cls is not None:
        out["q_len"] = cls
    return out


def force_assembly(case: AssemblyCase, combo: dict, target=None) -> AssemblyCase:
    """``case`` rewritten to hit ``combo`` (the first request's prefix, q_len and replay cut; the layer, window,
    invalid entries and the top-k tensor's form); max_model_len and max_num_batched_tokens grow where the first
    request needs it; the other requests as drawn."""
    f = {x.name: getattr(case, x.name) for x in dataclasses.fields(case)}
    f["topk_rows"] = f["expect"] = f["workspace"] = None
    if "layer" in combo:
        layer = combo["layer"]
        if RATIO_LAYER.get(case.ratio) != layer or (layer == "swa_only") != (case.topk == 0):
            f["ratio"] = LAYER_RATIO[layer]
            f["topk"] = {"c4a": (8, 4, 512)[case.seed % 3], "c128a": (4, 128)[case.seed % 2], "swa_only": 0}[layer]
            if layer == "swa_only":
                f["topk_extra"] = f["topk_extra"] or 3
    if "window" in combo:
        f["window"] = combo["window"]
    seqs, qs, cuts = list(case.seq_lens), list(case.query_lens), list(case.replay_cut)
    p = seqs[0] - qs[0]
    if "q_len" in combo:
        qs[0] = _qlen(combo["q_len"])
    if "prefix" in combo:
        p = _prefix_len(combo["prefix"], f["window"])
    seqs[0] = qs[0] + p
    if "replay" in combo:
        cuts[0] = 0 if combo["replay"] == "full" else max(p, 1)
    f["seq_lens"], f["query_lens"], f["replay_cut"] = tuple(seqs), tuple(qs), tuple(cuts)
    f["max_model_len"] = max(f["max_model_len"], seqs[0])
    f["max_num_batched_tokens"] = max(f["max_num_batched_tokens"], qs[0])
    if "invalid" in combo:
        inv = combo["invalid"]
        f["invalid_rate"] = 0.0 if inv == "none" else (case.invalid_rate or 0.2)
        f["int32_extremes"] = inv == "int32"
    for k in ("topk_layout", "topk_dtype", "topk_3d"):
        if k in combo:
            f[k] = combo[k]
    if "qsl_base" in combo:
        f["qsl_base"] = 0 if combo["qsl_base"] == "zero" else (case.qsl_base or 3)
    img = combo.get("image")
    # an image longer than the window: its last tokens see back past the window start
    mit = max(case.max_image_tokens, f["window"] + 5)
    if img == "off":
        f["max_image_tokens"], f["image_spans"] = 0, ()
    elif img == "width":
        f["max_image_tokens"], f["image_spans"] = mit, ()
    elif img == "spans":
        f["max_image_tokens"] = mit
        # a whole image ending at the first request's last token (its left part reaches past a short window)
        f["image_spans"] = (_span_at_edge(0, seqs[0], qs[0], mit, 1 + 2 * mit * 3),)
    return AssemblyCase(**f)


def _assembly_allowed(c: dict, target=None) -> bool:
    if c.get("prefix") == "0" and c.get("replay") == "shortened":
        return False  # no prefix, nothing a replay could cut
    if c.get("layer") == "swa_only" and c.get("invalid", "none") != "none":
        return False  # no top-k part: no entry to be invalid
    return True


def assembly_family_examples(target=None) -> list[AssemblyCase]:
    base = AssemblyCase(seed=1, ratio=4, topk=4, topk_extra=0, window=4, seq_lens=(6, 3), query_lens=(2, 1),
                        replay_cut=(0, 0), max_model_len=16, max_num_batched_tokens=4, invalid_rate=0.0,
                        int32_extremes=False, topk_dtype="int32", topk_3d=False, topk_layout="contiguous",
                        qsl_base=0)
    return [base, base.replace(seed=2, ratio=1, topk=0, topk_extra=3, seq_lens=(1,), query_lens=(1,),
                               replay_cut=(0,)),
            base.replace(seed=3, ratio=128, topk=4, window=8, seq_lens=(200, 9), query_lens=(3, 2),
                         max_model_len=256, replay_cut=(1000, 0))]


def _declare_assembly():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "prefill-assembly",
        (Dimension("layer", LAYERS, "C4A, C128A (top-k kept in [0, N)) or SWA-only (no top-k part, N = 0)"),
         Dimension("prefix", PREFIX_CLASSES, "first request's prefix against the window: where the SWA part "
                                             "starts, a full window or not"),
         Dimension("window", WINDOWS, "SWA window; 128 (DSv4's) makes rows of several 128-column blocks"),
         Dimension("replay", ("full", "shortened"), "the first request's gather as planned, or shortened by a "
                                                    "bounded replay (the window starts at the first gathered token)"),
         Dimension("invalid", INVALID_KINDS, "top-k ids: causal only, plus -1/-2/N/N+1/M, plus INT32 extremes"),
         Dimension("q_len", QLEN_CLASSES, "first request's query tokens around the kernel's 16 tokens per program"),
         Dimension("topk_layout", TOPK_LAYOUTS, "top-k tensor contiguous, row-padded or column-major"),
         Dimension("topk_dtype", ("int32", "int64"), "top-k tensor dtype"),
         Dimension("topk_3d", (False, True), "top-k [T, K] or [T, 1, K]"),
         Dimension("qsl_base", ("zero", "offset"), "query_start_loc starting at 0 or past decode tokens"),
         Dimension("image", IMAGE_KINDS, "image visibility: text, rows widened by max_image_tokens with no span, "
                                         "image spans with query tokens at their edges")),
        (("layer", "prefix"), ("prefix", "replay"), ("layer", "invalid"), ("layer", "window"),
         ("prefix", "window"), ("image", "window"), ("image", "q_len"), ("image", "replay")),
        classify_assembly, force_assembly, _assembly_allowed, assembly_family_examples), "prefill-assembly-oracle")


ASSEMBLY_DIMENSIONS = _declare_assembly()
