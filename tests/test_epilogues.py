"""Reduce epilogues: inverse GPT-J RoPE and the MXFP8 output, against the float64 references in oracles.epilogues."""
import dataclasses
import json
import math

import pytest
import torch
from hypothesis import given, settings

import impl  # noqa: F401  (sets the Triton mode before anything imports triton)
from contracts.core import collecting_margins
from contracts.epilogues import epilogue_oracle_agreement
from fuzz.cases import CaseError
from fuzz.epilogues import (EpilogueCase, Mxfp8Case, Mxfp8Group, RopeCase, epilogue_cases, mxfp8_boundary_groups,
                            next_f32)
from impl.epilogues import MXFP8_SCALE_CODE_CAP, inverse_rope_gptj, mxfp8_quantize
from impl.runtime import kernel_device
from impl.targets import get_target
from oracles import epilogues as ref

DEV = kernel_device()


def _f32(vals):
    return torch.tensor(vals, dtype=torch.float64).to(torch.float32)


# --- MXFP8 -----------------------------------------------------------------------------------------------------

def test_reference_scale_code_edges():
    assert ref.mxfp8_scale_code(448.0) == (127, True)
    assert ref.mxfp8_scale_code(math.nextafter(448.0, math.inf))[0] == 128
    assert ref.mxfp8_scale_code(math.nextafter(448.0, 0.0)) == (127, False)
    assert ref.mxfp8_scale_code(0.0) == (0, False)
    assert ref.mxfp8_scale_code(math.inf) == (254, False)
    assert ref.mxfp8_scale_code(1e-45)[0] == 0
    assert ref.mxfp8_scale_code(3.4028234663852886e38)[0] == 127 + 120  # ceil(log2(FLT_MAX / 448)) = 120


def test_boundaries_reached_and_byte_exact():
    """Values on the scale edges (amax = 448 * 2^k, and one ulp either side) and on e4m3 rounding ties, in their own
    groups so each is its group's amax or shares it: the kernel matches the reference byte for byte, and the
    reference's counters show both kinds of boundary were really exercised."""
    lanes = [v for group in mxfp8_boundary_groups() for v in group]
    x = _f32(lanes).reshape(1, -1).to(DEV)
    codes, scales = mxfp8_quantize(x)
    want = ref.mxfp8_quantize(x.cpu())
    assert want["edges"] >= 5 and want["ties"] >= 5, (want["edges"], want["ties"])
    assert torch.equal(scales.cpu(), want["scales"])
    assert torch.equal(codes.cpu(), want["codes"])


def test_subnormal_quotient_edge_is_exact():
    """amax one ulp above 448 * 2^-127: the exact code is 1 (k = -126), while an fp32 amax / 448 rounds to exactly
    2^-127 (a subnormal) and would give code 0."""
    amax = next_f32(math.ldexp(448.0, -127), True)
    assert float(torch.tensor(amax, dtype=torch.float32) / 448.0) == math.ldexp(1.0, -127)
    x = _f32([amax] + [0.0] * 31).reshape(1, 32).to(DEV)
    _, scales = mxfp8_quantize(x)
    assert ref.mxfp8_scale_code(float(x[0, 0]))[0] == 1
    assert scales.tolist() == [[1]]


def test_nonfinite_lanes():
    """inf gives the cap (254, never 255) and saturates to +-448; NaN lanes are ignored by amax and encode to 0x7F;
    an all-zero group gets code 0."""
    g = [math.inf, -1.0, 2.0] + [0.5] * 29
    h = [math.nan, 3.0] + [1.0] * 30
    z = [0.0] * 31 + [-0.0]
    x = _f32(g + h + z).reshape(1, 96).to(DEV)
    codes, scales = mxfp8_quantize(x)
    assert MXFP8_SCALE_CODE_CAP == 254
    assert scales.tolist() == [[254, ref.mxfp8_scale_code(3.0)[0], 0]]
    assert int(codes[0, 0]) == 0x7E and int(codes[0, 32]) == 0x7F
    assert int(codes[0, 95]) == 0x80 and int(codes[0, 64]) == 0
    want = ref.mxfp8_quantize(x.cpu())
    assert torch.equal(codes.cpu(), want["codes"]) and torch.equal(scales.cpu(), want["scales"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reduce_rows_round_trip(dtype):
    """[b, h, 512] rows over a wide dynamic range (bf16 subnormals included, which the interpreter's own bf16 loads
    get wrong): byte-exact against the reference, and decoding gives x back within e4m3's half-ulp (2^-4
    relative) for every lane at least 2^-6 of its group's scale (below that e4m3 is subnormal)."""
    g = torch.Generator().manual_seed(7)
    exps = torch.arange(-140, 120, 16, dtype=torch.float64)[: 16]
    x = (torch.randn(2, 3, 512, generator=g, dtype=torch.float64)
         * torch.pow(2.0, exps).repeat_interleave(32)).to(torch.float32).to(dtype).to(DEV)
    codes, scales = mxfp8_quantize(x)
    want = ref.mxfp8_quantize(x.cpu())
    assert codes.shape == (2, 3, 512) and scales.shape == (2, 3, 16)
    assert torch.equal(codes.cpu(), want["codes"]) and torch.equal(scales.cpu(), want["scales"])
    from oracles.formats import fp8_decode

    scale = torch.pow(2.0, scales.cpu().to(torch.float64) - 127).repeat_interleave(32, dim=-1)
    back = fp8_decode(codes.cpu(), "ocp") * scale
    xd = x.cpu().to(torch.float64)
    normal = xd.abs() >= scale * 2.0 ** -6
    assert normal.sum() > 1000
    assert bool(((back - xd).abs() <= xd.abs() * 2.0 ** -4)[normal].all())


def test_mxfp8_bad_input():
    with pytest.raises(ValueError, match="multiple of 32"):
        mxfp8_quantize(torch.zeros(2, 48, device=DEV))
    with pytest.raises(TypeError, match="x"):
        mxfp8_quantize(torch.zeros(2, 32, dtype=torch.float16, device=DEV))
    codes = torch.full((2, 32), 0xA5, dtype=torch.uint8, device=DEV)
    with pytest.raises(ValueError, match="scales"):
        mxfp8_quantize(torch.zeros(2, 32, device=DEV), codes=codes,
                       scales=torch.zeros(2, 2, dtype=torch.uint8, device=DEV))
    assert set(codes.flatten().tolist()) == {0xA5}


# --- inverse RoPE ----------------------------------------------------------------------------------------------

def _cos_sin(P, seed=0):
    g = torch.Generator().manual_seed(seed)
    theta = torch.rand(P, 32, generator=g, dtype=torch.float64) * 2 * math.pi
    return torch.cat([theta.cos(), theta.sin()], 1).to(torch.float32)


def _check(got, x, cos_sin, positions, out_dtype):
    want, mag = ref.inverse_rope_gptj(x.cpu(), cos_sin.cpu(), positions)
    bound = ref.rope_error_bound(want, mag, out_dtype)
    g = got.cpu().to(torch.float64)
    head = x.shape[2] - 64
    assert torch.equal(g[:, :, :head], x.cpu()[:, :, :head].to(out_dtype).to(torch.float64))
    assert bool(((g - want).abs() <= bound)[:, :, head:].all())


@pytest.mark.parametrize("in_dtype, out_dtype", [(torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                                                 (torch.bfloat16, torch.bfloat16)])
def test_inverse_rope_matches_reference(in_dtype, out_dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 512, generator=g).to(in_dtype).to(DEV)
    cs = _cos_sin(9).to(DEV)
    positions = [8, 0, 3]
    out = torch.full(x.shape, float("nan"), dtype=out_dtype, device=DEV)
    got = inverse_rope_gptj(x, cs, torch.tensor(positions, device=DEV), out=out)
    assert got.data_ptr() == out.data_ptr()
    _check(got, x, cs, positions, out_dtype)


def test_inverse_undoes_the_writers_rotation():
    """Rotating with the writer's forward rule (even' = e*cos - o*sin, odd' = o*cos + e*sin, SPEC 4) and then
    applying the epilogue gives the rows back. Derived bounds: the kernel is within ``rope_error_bound`` of the exact
    inverse of its float32 input, and that exact inverse is within u32 * (|a cos| + |b sin|) + 2^-23 |orig| of the
    original rows (float32 input rounding, and the table's cos^2 + sin^2 = 1 +- 2^-23)."""
    g = torch.Generator().manual_seed(2)
    orig = torch.randn(2, 3, 64, generator=g, dtype=torch.float64)
    cs = _cos_sin(4, seed=3)
    positions = [3, 1]
    fwd = orig.clone()
    for t, p in enumerate(positions):
        c, s = cs[p, :32].double(), cs[p, 32:].double()
        e, o = orig[t, :, 0::2], orig[t, :, 1::2]
        fwd[t, :, 0::2] = e * c - o * s
        fwd[t, :, 1::2] = o * c + e * s
    fwd32 = fwd.to(torch.float32)
    got = inverse_rope_gptj(fwd32.to(DEV), cs.to(DEV), torch.tensor(positions, device=DEV)).cpu().double()
    want, mag = ref.inverse_rope_gptj(fwd32, cs, positions)
    assert bool(((got - want).abs() <= ref.rope_error_bound(want, mag, torch.float32)).all())
    # the float32 table has cos^2 + sin^2 = 1 only to within 2^-23 (each entry rounded by 2^-24 relative), and the
    # inverse of the forward rotation is orig * (cos^2 + sin^2): that adds 2^-23 |orig|
    assert bool(((want - orig).abs() <= (2.0 ** -24 * mag + 2.0 ** -23 * orig.abs()) * 1.01).all())


def test_inverse_rope_in_place_and_nonfinite():
    x = torch.randn(1, 2, 128).to(DEV)
    x[0, 0, 64] = math.inf
    x[0, 1, 127] = math.nan
    before = x.clone()
    cs = _cos_sin(2).to(DEV)
    got = inverse_rope_gptj(x, cs, torch.tensor([1], device=DEV), out=x)
    assert got.data_ptr() == x.data_ptr()
    want, mag = ref.inverse_rope_gptj(before.cpu(), cs.cpu(), [1])
    g = got.cpu().double()
    assert torch.equal(torch.isnan(g), torch.isnan(want))
    assert torch.equal(torch.isinf(g), torch.isinf(want)) and torch.equal(g[torch.isinf(g)], want[torch.isinf(want)])
    fin = torch.isfinite(want)
    assert bool(((g - want).abs() <= ref.rope_error_bound(want, mag, torch.float32))[fin].all())


def test_inverse_rope_bad_input_writes_nothing():
    x = torch.randn(2, 1, 64, device=DEV)
    cs = _cos_sin(3).to(DEV)
    out = torch.full_like(x, 7.0)
    with pytest.raises(ValueError, match="positions"):
        inverse_rope_gptj(x, cs, torch.tensor([0, 3], device=DEV), out=out)
    with pytest.raises(ValueError, match="positions"):
        inverse_rope_gptj(x, cs, torch.tensor([-1, 0], device=DEV), out=out)
    with pytest.raises(ValueError, match="cos_sin"):
        inverse_rope_gptj(x, cs[:, :32], torch.tensor([0, 1], device=DEV), out=out)
    with pytest.raises(ValueError, match="x"):
        inverse_rope_gptj(torch.randn(2, 1, 32, device=DEV), cs, torch.tensor([0, 1], device=DEV))
    with pytest.raises(TypeError, match="positions"):
        inverse_rope_gptj(x, cs, torch.tensor([0.0, 1.0], device=DEV), out=out)
    with pytest.raises(ValueError, match="out"):
        inverse_rope_gptj(x, cs, torch.tensor([0, 1], device=DEV), out=x[:, :, :].view(2, 1, 64)[:1])
    assert set(out.flatten().tolist()) == {7.0}


# --- the typed case of epilogue-oracle-agreement ------------------------------------------------------------------

@settings(max_examples=30, deadline=None, database=None)
@given(epilogue_cases())
def test_epilogue_case_round_trips_through_json(case):
    assert EpilogueCase.from_json(case.to_json()) == case
    text = json.dumps(case.to_json())  # through real JSON text too (NaN != NaN, so compare the texts)
    assert json.dumps(EpilogueCase.from_json(json.loads(text)).to_json()) == text


_ROPE = RopeCase(seed=3, tokens=2, heads=1, width=64, max_pos=5, positions=(4, 0), scale=1.0,
                 specials=((3, math.inf),), in_dtype="float32", out_dtype="bfloat16", cos_sin="angles")
_MXFP8 = Mxfp8Case(seed=1, rows=1, width=64, dtype="float32", layout="strided",
                   groups=(Mxfp8Group(kind="random", exp=-3, specials=((0, math.nan),)), Mxfp8Group(kind="zero")))


@pytest.mark.parametrize("case", [EpilogueCase(epilogue="rope", rope=_ROPE),
                                  EpilogueCase(epilogue="mxfp8", mxfp8=_MXFP8)], ids=["rope", "mxfp8"])
def test_epilogue_case_rejects_a_missing_field(case):
    inner = case.epilogue
    for f in dataclasses.fields(case):
        doc = case.to_json()
        del doc[f.name]
        with pytest.raises(CaseError, match=f"missing field {f.name}"):
            EpilogueCase.from_json(doc)
    for f in dataclasses.fields(getattr(case, inner)):
        if f.name in type(getattr(case, inner)).ADDED_FIELDS:  # older cases replay with its default
            continue
        doc = case.to_json()
        del doc[inner][f.name]
        with pytest.raises(CaseError, match=f"{inner}: missing field {f.name}"):
            EpilogueCase.from_json(doc)


def test_epilogue_case_rejects_inconsistent_parameters():
    with pytest.raises(CaseError, match="needs exactly its own parameters"):
        EpilogueCase.from_json({**EpilogueCase(epilogue="rope", rope=_ROPE).to_json(), "epilogue": "mxfp8"})
    with pytest.raises(ValueError, match="positions"):
        RopeCase(seed=0, tokens=1, heads=1, width=64, max_pos=2, positions=(2,))
    with pytest.raises(ValueError, match="groups"):
        Mxfp8Case(seed=0, rows=2, width=32, groups=(Mxfp8Group(kind="zero"),))
    with pytest.raises(ValueError, match="32 lanes"):
        Mxfp8Group(kind="values", values=(1.0,) * 31)


def test_epilogue_check_records_the_rope_margin_only():
    """RoPE lanes are compared against a bound: the check reports how close the worst lane came (a ratio in
    [0, 1] on a pass); MXFP8 is byte-exact and reports none."""
    with collecting_margins() as rope_margins:
        assert epilogue_oracle_agreement(EpilogueCase(epilogue="rope", rope=_ROPE), get_target("gfx950")) == []
    assert len(rope_margins) == 1 and 0 <= rope_margins[0] <= 1
    with collecting_margins() as mx_margins:
        assert epilogue_oracle_agreement(EpilogueCase(epilogue="mxfp8", mxfp8=_MXFP8), get_target("gfx950")) == []
    assert mx_margins == []


# --- out aliasing x ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("alias", ["in-place", "restrided", "shifted", "adjacent"])
def test_rope_out_aliasing_x(alias):
    """An out that is x, or disjoint from it in its storage, is written correctly; one that overlaps x otherwise is
    refused (the contract also accepts a correct result there)."""
    case = RopeCase(seed=5, tokens=2, heads=2, width=128, max_pos=3, positions=(2, 0), alias=alias)
    assert epilogue_oracle_agreement(EpilogueCase(epilogue="rope", rope=case), get_target("gfx950")) == []
    from fuzz.epilogues import rope_input, rope_out

    x, cs, pos = rope_input(case, DEV)
    x, out = rope_out(case, x, torch.float32)
    if alias in ("restrided", "shifted"):
        with pytest.raises(ValueError, match="overlaps x"):
            inverse_rope_gptj(x, cs, pos, out=out)
    else:
        assert inverse_rope_gptj(x, cs, pos, out=out).data_ptr() == out.data_ptr()


def test_rope_alias_needs_one_dtype():
    with pytest.raises(ValueError, match="alias"):
        RopeCase(seed=0, tokens=1, heads=1, width=64, max_pos=1, positions=(0,), out_dtype="bfloat16",
                 alias="in-place")


def test_declared_family_forces_the_alias_rows():
    from fuzz.epilogues import EPILOGUE_DIMENSIONS, epilogue_examples

    t = get_target("gfx950")
    rows = EPILOGUE_DIMENSIONS.covering_array(t, 2)
    assert {r["alias"] for r in rows} == {"separate", "in-place", "restrided", "shifted", "adjacent", "tail"}
    forced = [EPILOGUE_DIMENSIONS.force(epilogue_examples(t)[0], r, t) for r in rows]
    assert all(c.rope.alias == "separate" or (c.rope.tokens, c.rope.heads) == (2, 2)
               for c in forced if c.epilogue == "rope")
