"""``smv bench`` and ``contracts.cli.bench``: everything that does not need a GPU.

The JSON the table and the plot read is written by pytest-benchmark itself (through ``pytester``), from a bench module
that times a fake GPU through the same ``CudaEventClock`` and ``install_clock`` the GPU benchmarks use: each call
advances the fake GPU's clock by a chosen time, so every figure in the JSON and the table follows from those times.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.cli import bench

ROOT = Path(__file__).resolve().parent.parent

#: chosen GPU times in seconds: torch baseline per batch, and each family's time as a fraction of it
TORCH_S = {1: 40e-6, 64: 200e-6, 512: 1200e-6}
FAMILY_FRACTION = {"generic": 0.5, "gfx942": 0.25, "gfx950": 0.2}
REDUCE_S = {1: 6e-6, 64: 40e-6, 512: 250e-6}
COPY_BPS, MATMUL_FPS = 4.0e12, 8.0e14
NUM_SPLITS = 4

FAKE_BENCH = '''
import pytest
from contracts.cli import bench

class FakeGpu:
    now_ms = 0.0

class FakeEvent:
    def record(self):
        self.t = FakeGpu.now_ms
    def synchronize(self):
        pass
    def elapsed_time(self, other):
        return other.t - self.t

SCALE = {scale!r}
TORCH_S = {torch_s!r}
FRACTION = {fraction!r}
REFS = bench.References({copy!r}, {matmul!r}, dict(TORCH_S))

def gpu_call(seconds):
    def run():
        FakeGpu.now_ms += seconds * SCALE * 1e3
    return run

def timed(benchmark, seconds):
    clock = bench.CudaEventClock(FakeEvent)
    bench.install_clock(benchmark, clock)
    # a stray start in a previous round must not shift this one: setup resets, as in bench_decode.py
    clock()
    benchmark.pedantic(gpu_call(seconds), setup=clock.reset, rounds=5, warmup_rounds=1, iterations=1)
    return bench.benchmark_median(benchmark)

def record(benchmark, seconds, **kw):
    benchmark.extra_info.update(bench.derived_figures(seconds=seconds, device="Fake H200", **kw))

@pytest.mark.parametrize("batch", bench.BATCHES, ids=lambda b: f"b{{b}}")
@pytest.mark.parametrize("family", bench.FAMILIES)
def test_decode(benchmark, family, batch):
    fig = bench.decode_figures(batch)
    s = timed(benchmark, TORCH_S[batch] * FRACTION[family])
    record(benchmark, s, kind="decode", family=family, batch=batch, refs=REFS, bytes=fig["bytes"],
           flops=fig["flops"], num_splits=None if family == "generic" else {splits})

@pytest.mark.parametrize("batch", bench.BATCHES, ids=lambda b: f"b{{b}}")
@pytest.mark.parametrize("family", bench.SPLIT_FAMILIES)
def test_reduce(benchmark, family, batch):
    fig = bench.reduce_figures(batch, {splits})
    record(benchmark, timed(benchmark, {reduce_s!r}[batch]), kind="reduce", family=family, batch=batch, refs=REFS,
           num_splits={splits}, **fig)

@pytest.mark.parametrize("batch", bench.BATCHES, ids=lambda b: f"b{{b}}")
def test_torch_baseline(benchmark, batch):
    fig = bench.decode_figures(batch)
    record(benchmark, timed(benchmark, TORCH_S[batch]), kind="baseline", family="torch", batch=batch, refs=REFS,
           bytes=fig["bytes"], flops=fig["flops"])

def test_copy_ceiling(benchmark):
    fig = bench.copy_figures()
    record(benchmark, timed(benchmark, fig["bytes"] / {copy!r}), kind="ceiling", family="copy", refs=REFS, **fig)

def test_matmul_ceiling(benchmark):
    fig = bench.matmul_figures()
    record(benchmark, timed(benchmark, fig["flops"] / {matmul!r}), kind="ceiling", family="matmul", refs=REFS,
           **fig)

@pytest.mark.parametrize("tokens", (64, 512))
@pytest.mark.parametrize("variant", ("hit", "miss"))
def test_metadata_build(benchmark, variant, tokens):
    s = timed(benchmark, (100e-6 if variant == "hit" else 400e-6) * tokens / 64)
    benchmark.extra_info.update(bench.derived_figures(kind="metadata", family="metadata", seconds=s, bytes=0,
                                flops=0, refs=bench.References(), variant=variant, tokens=tokens, target="gfx950"))
'''


def _fixture_json(pytester, name="bench.json", scale=1.0) -> Path:
    """Run the fake-GPU bench module under pytest-benchmark and return the JSON it wrote."""
    pytester.makepyfile(bench_fake=FAKE_BENCH.format(scale=scale, torch_s=TORCH_S, fraction=FAMILY_FRACTION,
                                                     copy=COPY_BPS, matmul=MATMUL_FPS, splits=NUM_SPLITS,
                                                     reduce_s=REDUCE_S))
    out = pytester.path / name
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTEST_XDIST_WORKER", raising=False)  # under xdist pytest-benchmark would time nothing
        res = pytester.runpytest_inprocess(str(pytester.path / "bench_fake.py"), f"--benchmark-json={out}",
                                           "-p", "no:cacheprovider", "-q")
    res.assert_outcomes(passed=9 + 6 + 3 + 2 + 4)
    return out


# --- figures ----------------------------------------------------------------------------------------------------

def test_decode_figures_count_each_cache_row_once_and_q_and_out():
    from impl import formats

    # a row's bytes from the layout itself: one block's used bytes over its tokens
    row = formats.Fp8DsMlaLayout(64).used_block_bytes // 64
    for batch in bench.BATCHES:
        f = bench.decode_figures(batch)
        tokens = bench.SWA + bench.EXTRA
        assert f["tokens_per_query"] == tokens == 640
        q_and_out = 2 * batch * bench.HEADS * formats.DSV4_HEAD_DIM * torch_bf16_bytes()
        assert f["bytes"] == batch * tokens * row + q_and_out
        # QK^T and PV: a multiply-add (2 FLOPs) per head, token and dimension, twice
        assert f["flops"] == 2 * 2 * batch * bench.HEADS * tokens * formats.DSV4_HEAD_DIM


def torch_bf16_bytes() -> int:
    import torch

    return torch.tensor([], dtype=torch.bfloat16).element_size()


def test_reduce_figures_match_the_workspace_it_reads():
    import torch

    from impl.decode import DecodeWorkspace

    ws = DecodeWorkspace.allocate(3, 5, 7, "cpu")
    read = sum(t.numel() * t.element_size() for t in (ws.part_m, ws.part_l, ws.part_acc))
    written = torch.empty(3, 7, 512, dtype=torch.bfloat16).numel() * 2
    assert bench.reduce_figures(3, 5, 7)["bytes"] == read + written


def test_derived_figures_divide_by_the_references():
    refs = bench.References(copy_bytes_per_s=2e12, matmul_flops_per_s=1e15, torch_seconds={64: 3e-4})
    info = bench.derived_figures(kind="decode", family="gfx950", seconds=1e-4, bytes=10 ** 8, flops=4 * 10 ** 11,
                                 refs=refs, batch=64, num_splits=8)
    assert info["smv_bench"] == bench.EXTRA_INFO_VERSION and info["num_splits"] == 8
    assert info["bytes_per_s"] == pytest.approx(1e12) and info["gb_per_s"] == pytest.approx(1000)
    assert info["tflop_per_s"] == pytest.approx(4000)
    assert info["fraction_of_copy_ceiling"] == pytest.approx(0.5)
    assert info["fraction_of_matmul_ceiling"] == pytest.approx(4.0)
    assert info["ratio_to_torch"] == pytest.approx(3.0) and info["torch_seconds"] == 3e-4
    json.dumps(info)  # extra_info must survive pytest-benchmark's JSON
    # not timed (benchmark disabled): figures kept, nothing derived, nothing invented
    off = bench.derived_figures(kind="decode", family="gfx950", seconds=None, bytes=1, flops=1, refs=refs, batch=64)
    assert off["seconds"] is None and off["ratio_to_torch"] is None and off["bytes"] == 1
    # the reduce has no torch counterpart
    red = bench.derived_figures(kind="reduce", family="gfx950", seconds=1e-5, bytes=1, flops=1, refs=refs, batch=64)
    assert red["ratio_to_torch"] is None


# --- the workloads: the same calls the GPU benchmarks time, run once under the interpreter ----------------------

def test_workload_calls_compute_the_decode_the_baseline_computes():
    """Every callable a GPU benchmark times computes attention over the same rows as the torch baseline (bf16
    rounding apart), and the reduce alone reproduces the full decode's output: the benchmarks time the right work.
    Tiny shapes and one CU keep the interpreter quick; the shapes a GPU times differ only in size."""
    import torch

    from impl.runtime import kernel_device

    w = bench.DecodeWorkload(2, kernel_device(), heads=3, swa=8, extra=16, cu_count=1)
    base = w.baseline_call()().float().cpu()
    assert base.shape == (2, 3, 512) and torch.isfinite(base).all()
    tol = 2 ** -7 * base.abs().amax() + 1e-3  # a few bf16 ulps of the largest output
    for family in bench.FAMILIES:
        fn, plan = w.decode_call(family)
        out = fn().float().cpu()
        err = (out - base).abs().max().item()
        assert err <= tol, f"{family}: max |decode - baseline| = {err} > {tol}"
        if family in bench.SPLIT_FAMILIES:
            red, rplan = w.reduce_call(family)
            assert rplan == plan
            assert torch.equal(red().float().cpu(), out), f"{family}: the reduce alone differs from the decode"
    with pytest.raises(ValueError, match="family"):
        w.reduce_call("generic")


def test_workload_cache_slots_hold_the_rows_the_baseline_dequantizes():
    """The device cache repeats its host blocks; slot s must hold host slot s % (host slots), which is what the
    baseline's dequantized copy assumes."""
    from impl import formats

    view, host = bench._rand_cache(5 * 16 + 3, 16, "ocp", __import__("torch").Generator().manual_seed(1), "cpu")
    assert view.shape[0] == 6 and host.shape[0] == 6  # fewer blocks than DISTINCT_BLOCKS: all distinct
    big, small = bench._rand_cache(70 * 4, 4, "ocp", __import__("torch").Generator().manual_seed(2), "cpu")
    assert small.shape[0] == bench.DISTINCT_BLOCKS and big.shape[0] == 70
    m = small.shape[0] * small.shape[1]
    for s in (0, 3, m - 1, m, m + 5, 70 * 4 - 1):
        got = formats.unpack_fp8_ds_mla(big, [s])
        want = formats.unpack_fp8_ds_mla(small, [s % m])
        for k in want:
            assert bool((got[k] == want[k]).all()), f"slot {s}: {k} differs from host slot {s % m}"


# --- timing ------------------------------------------------------------------------------------------------------

class _Ev:
    log: list = []

    def __init__(self, clock_ms):
        self.clock_ms = clock_ms

    def record(self):
        self.t = self.clock_ms[0]
        _Ev.log.append(("record", self.t))

    def synchronize(self):
        _Ev.log.append(("sync", self.t))

    def elapsed_time(self, other):
        return other.t - self.t


def test_cuda_event_clock_times_between_events_and_waits_only_at_the_end():
    now = [0.0]
    _Ev.log = []
    clock = bench.CudaEventClock(lambda: _Ev(now))
    assert clock() == 0.0
    assert _Ev.log == [("record", 0.0)]  # the start does not synchronise: the GPU keeps the host's lead
    now[0] = 2.5
    assert clock() == pytest.approx(2.5e-3)
    assert _Ev.log[-1] == ("sync", 2.5)
    clock()  # a stray start
    clock.reset()
    now[0] = 3.0
    assert clock() == 0.0 and (now.__setitem__(0, 4.0) or clock()) == pytest.approx(1e-3)


def test_measure_runs_the_pedantic_protocol():
    now, calls = [0.0], []
    clock = bench.CudaEventClock(lambda: _Ev(now))

    def fn():
        calls.append("fn")
        now[0] += calls.count("fn")  # call n takes n ms on the fake GPU

    times = bench.measure(fn, lambda: calls.append("flush"), clock, rounds=3, warmup_rounds=2)
    assert calls == ["flush", "fn"] * 5
    assert times == pytest.approx([3e-3, 4e-3, 5e-3])  # calls 3, 4 and 5: the two warm-up rounds are dropped


def test_install_clock_refuses_a_fixture_without_a_timer():
    with pytest.raises(RuntimeError, match="_timer"):
        bench.install_clock(object(), bench.CudaEventClock(lambda: None))


def test_pytest_benchmark_records_the_gpu_clock_time(pytester):
    """pytest-benchmark's pedantic runner, timed by the installed clock, stores exactly the fake GPU's times: the
    stats are GPU time, not host time, and the extra_info ratios land in its JSON."""
    doc = bench.load_results(_fixture_json(pytester))
    by = {b["name"]: b for b in doc["benchmarks"]}
    for batch, t in TORCH_S.items():
        st = by[f"test_decode[gfx950-b{batch}]"]
        assert st["stats"]["median"] == pytest.approx(t * FAMILY_FRACTION["gfx950"])
        assert st["stats"]["rounds"] == 5 and st["options"]["timer"] == "cuda_event_clock"
        assert st["extra_info"]["ratio_to_torch"] == pytest.approx(1 / FAMILY_FRACTION["gfx950"])
        assert by[f"test_torch_baseline[b{batch}]"]["stats"]["median"] == pytest.approx(t)
    copy = by["test_copy_ceiling"]["extra_info"]
    assert copy["fraction_of_copy_ceiling"] == pytest.approx(1.0)
    assert copy["copy_ceiling_bytes_per_s"] == COPY_BPS


# --- table and plot from the JSON --------------------------------------------------------------------------------

def _line(table: str, *needles: str) -> str:
    hits = [ln for ln in table.splitlines() if all(n in ln for n in needles)]
    assert len(hits) == 1, f"expected one line with {needles} in:\n{table}"
    return hits[0]


def test_table_shows_each_family_beside_torch_and_the_ceilings(pytester):
    doc = bench.load_results(_fixture_json(pytester))
    table = bench.format_table(doc)
    head = table.splitlines()[0]
    assert "Fake H200" in head and f"copy {COPY_BPS / 1e12:.2f} TB/s" in head and f"{MATMUL_FPS / 1e12:.0f}" in head
    for batch, t_torch in TORCH_S.items():
        fig = bench.decode_figures(batch)
        for family, frac in FAMILY_FRACTION.items():
            t = t_torch * frac
            cells = _line(table, f"triton {family}", f"{batch:>5}  ").split()
            assert f"{t * 1e6:.1f}" in cells, cells
            assert f"{1 / frac:.2f}x" in cells  # speed-up over torch
            assert f"{100 * fig['bytes'] / t / COPY_BPS:.1f}%" in cells
        base = _line(table, "torch gather + SDPA", f"{batch:>5}  ").split()
        assert f"{t_torch * 1e6:.1f}" in base and "1.00x" in base
        red = _line(table, "reduce gfx942", f"{batch:>5}  ").split()
        assert f"{REDUCE_S[batch] * 1e6:.1f}" in red and red[-1] == "-"  # no torch counterpart
    assert _line(table, "triton gfx950 (S=4)", "    1  ")
    rows = [ln.split() for ln in table.splitlines()]
    assert ["64", "100.0", "400.0", "4.00"] in rows  # metadata, tokens 64: hit 100 us, miss 400 us
    assert ["512", "800.0", "3200.0", "4.00"] in rows


def test_table_compares_against_a_previous_run(pytester):
    now = bench.load_results(_fixture_json(pytester, "now.json"))
    before = bench.load_results(_fixture_json(pytester, "before.json", scale=0.5))
    table = bench.format_table(now, before, "before.json")
    assert "vs before.json" in table.splitlines()[1]
    assert _line(table, "triton gfx942", "   64  ").split()[-1] == "2.00x"  # twice as slow as before
    assert "hit vs before.json" in table
    assert ["512", "800.0", "3200.0", "4.00", "2.00x", "2.00x"] in [ln.split() for ln in table.splitlines()]


def test_plot_writes_a_roofline_png(pytester, tmp_path):
    pytest.importorskip("matplotlib", reason="the roofline needs the optional extra: pip install "
                                             "'sparse-mla-verify[plot]'")
    src = _fixture_json(pytester)
    out = tmp_path / "roofline.png"
    rc = bench.main(_args(["--plot", str(src), "--out", str(out)]))
    assert rc == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_plot_without_matplotlib_names_the_extra(pytester, tmp_path, monkeypatch, capsys):
    src = _fixture_json(pytester)
    capsys.readouterr()  # the inner pytest run's output
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as when it is not installed
    rc = bench.main(_args(["--plot", str(src), "--out", str(tmp_path / "r.png")]))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "pip install 'sparse-mla-verify[plot]'" in err
    assert not (tmp_path / "r.png").exists()


# --- the command ------------------------------------------------------------------------------------------------

def _args(argv):
    p = argparse.ArgumentParser(prog="smv")
    bench.add_parser(p.add_subparsers(dest="cmd", required=True))
    return p.parse_args(["bench", *argv])


def test_add_parser_registers_bench_with_main():
    a = _args(["--json", "o.json", "--compare", "old.json", "-k", "gfx950 and b64"])
    assert a.func is bench.main
    assert (a.json, a.compare, a.keyword, a.plot, a.out, a.require_gpu) == ("o.json", "old.json", "gfx950 and b64",
                                                                           None, None, False)


@pytest.mark.parametrize("argv, needle", [
    (["--plot", "x.json", "-k", "gfx950"], "--plot renders an existing JSON"),
    (["--plot", "x.json", "--json", "y.json"], "takes only --out, got --json"),
    (["--out", "r.png"], "--out: only with --plot"),
    (["--json", " "], "--json: expected a file name"),
    (["-k", ""], "-k: expected an expression"),
    (["--plot", "missing.json"], "missing.json: no such file"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, needle, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    rc = bench.main(_args(argv))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("content, needle", [
    ("{not json", "not JSON (line 1"),
    ('{"benchmarks": 3}', "not a pytest-benchmark JSON"),
    ('{"benchmarks": [{"name": "x", "stats": {}}]}', "benchmarks[0] has no stats.median"),
])
def test_a_malformed_json_names_the_file(content, needle, tmp_path, capsys):
    f = tmp_path / "bad.json"
    f.write_text(content)
    for argv in (["--plot", str(f)], ["--compare", str(f)]):
        rc = bench.main(_args(argv))
        err = capsys.readouterr().err.strip()
        assert rc == 2 and str(f) in err and needle in err, err


class _FakeRun:
    """Stands in for the pytest subprocess: records the command and writes the JSON a real run would."""

    def __init__(self, rc, src=None):
        self.rc, self.src, self.cmd, self.cwd = rc, src, None, None

    def __call__(self, cmd, cwd):
        self.cmd, self.cwd = cmd, cwd
        out = next(Path(c.split("=", 1)[1]) for c in cmd if c.startswith("--benchmark-json="))
        if self.src is not None:
            out.write_text(Path(self.src).read_text())
        return self.rc


def test_run_builds_the_pytest_command_and_prints_the_table(pytester, monkeypatch, capsys, tmp_path):
    src = _fixture_json(pytester)
    capsys.readouterr()
    fake = _FakeRun(0, src)
    monkeypatch.setattr(bench, "_spawn", fake)
    monkeypatch.setattr("contracts.markers.marker_status", lambda m, *a, **k: (True, "found cuda device"))
    out = tmp_path / "deep" / "b.json"
    rc = bench.main(_args(["--json", str(out), "--compare", str(src), "-k", "decode"]))
    text = capsys.readouterr().out
    assert rc == 0
    cmd = fake.cmd
    assert cmd[:3] == [sys.executable, "-m", "pytest"]
    files = [Path(c) for c in cmd if c.endswith(".py") and not c.startswith("-")]
    assert {f.name for f in files} == {"bench_decode.py", "bench_indexer.py", "bench_metadata.py"} and all(f.is_file() for f in files)
    assert f"--benchmark-json={out.resolve()}" in cmd and f"--benchmark-compare={Path(src).resolve()}" in cmd
    assert cmd[cmd.index("-k") + 1] == "decode" and Path(fake.cwd) == ROOT
    assert out.is_file() and "vs bench.json" in text and "torch gather + SDPA" in text
    assert f"pytest-benchmark JSON in {out.resolve()}" in text


@pytest.mark.parametrize("rc, expect, needle", [(5, 2, "no benchmark matches it"), (4, 2, "refused the options"),
                                               (1, 1, None)])
def test_run_maps_pytest_exit_codes(rc, expect, needle, pytester, monkeypatch, capsys):
    src = _fixture_json(pytester) if rc == 1 else None
    capsys.readouterr()
    monkeypatch.setattr(bench, "_spawn", _FakeRun(rc, src))
    monkeypatch.setattr("contracts.markers.marker_status", lambda m, *a, **k: (True, "found cuda device"))
    got = bench.main(_args(["-k", "nothing"]))
    cap = capsys.readouterr()
    assert got == expect
    if needle:
        assert needle in cap.err and len(cap.err.strip().splitlines()) == 1
    else:
        assert "torch gather + SDPA" in cap.out  # a failed benchmark still shows what did run


def test_require_gpu_on_a_cpu_host_exits_1_before_running(monkeypatch, capsys):
    fake = _FakeRun(0)
    monkeypatch.setattr(bench, "_spawn", fake)
    monkeypatch.setattr("contracts.markers.marker_status", lambda m, *a, **k: (False, "needs a GPU: found none"))
    assert bench.main(_args(["--require-gpu"])) == 1
    assert fake.cmd is None and "--require-gpu" in capsys.readouterr().err


def test_plain_pytest_does_not_collect_the_benchmarks(pytester):
    res = pytester.runpytest_inprocess("--collect-only", "-q", str(ROOT / "tests" / "benchmarks"),
                                       "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.NO_TESTS_COLLECTED


class _InProcessRun:
    """Runs the command ``smv bench`` builds through pytester, in this process: the real pytest, plugin and
    pytest-benchmark, without a second interpreter's start-up."""

    def __init__(self, pytester):
        self.pytester, self.result = pytester, None

    def __call__(self, cmd, cwd):
        assert cmd[:3] == [sys.executable, "-m", "pytest"]
        self.result = self.pytester.runpytest_inprocess(*cmd[3:])
        return int(self.result.ret)


def _on_cpu() -> bool:
    from impl.runtime import detect_device

    return detect_device().kind == "cpu"


@pytest.mark.skipif(not _on_cpu(), reason="checks a CPU host's behaviour: this machine has a GPU")
def test_smv_bench_on_a_cpu_host_skips_the_gpu_benchmarks_and_exits_0(pytester, monkeypatch, capsys, tmp_path):
    """The GPU benchmarks are skipped with the marker's reason, one line says so, nothing is timed, exit 0, and
    ``--json`` still leaves a pytest-benchmark-shaped file (with no benchmarks) for a CI to pick up."""
    run = _InProcessRun(pytester)
    monkeypatch.setattr(bench, "_spawn", run)
    out = tmp_path / "b.json"
    rc = bench.main(_args(["--json", str(out), "-k", "bench_decode"]))
    cap = capsys.readouterr()
    text = cap.out
    assert rc == 0, "\n".join(run.result.outlines + run.result.errlines) + cap.err
    # decode, its subject columns, FlashMLA's column, reduce, its subject columns, torch, ceilings
    run.result.assert_outcomes(skipped=9 + 9 + 3 + 6 + 6 + 3 + 2)
    reasons = [ln for ln in run.result.outlines if ln.startswith("SKIPPED")]
    assert reasons and all("[gpu] needs a real GPU (CUDA or ROCm): found no GPU" in ln for ln in reasons), reasons
    first = [ln for ln in text.splitlines() if ln.startswith("smv bench:")][0]
    assert first.startswith("smv bench: no GPU here") and "nothing on a GPU is timed" in first
    assert bench.load_results(out)["benchmarks"] == []
    assert "no benchmark results" in text


@pytest.mark.slow
@pytest.mark.skipif(not _on_cpu(), reason="checks a CPU host's behaviour: this machine has a GPU")
def test_python_m_contracts_bench_on_a_cpu_host_exits_0(tmp_path):
    """The same through a real subprocess, as CI calls it (slow: a second interpreter imports torch)."""
    out = tmp_path / "b.json"
    res = subprocess.run([sys.executable, "-m", "contracts.cli.bench", "--json", str(out), "-k", "bench_decode"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[0].startswith("smv bench: no GPU here")
    assert "20 skipped" in res.stdout and json.loads(out.read_text())["benchmarks"] == []


def test_host_seconds_times_the_queueing_between_drains(monkeypatch):
    import time

    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    events = []

    def fn():
        events.append("fn")
        now[0] += 0.5 if events.count("fn") % 2 else 0.25  # calls 1 and 3 take 0.5 s, call 2 0.25 s

    assert bench.host_seconds(fn, lambda: events.append("sync"), calls=3) == 0.5
    assert events == ["sync", "fn"] * 3 + ["sync"]


def test_table_flags_a_host_bound_time(pytester):
    doc = bench.load_results(_fixture_json(pytester))
    assert "!" not in bench.format_table(doc)
    b = next(b for b in doc["benchmarks"] if b["name"] == "test_decode[gfx942-b1]")
    b["extra_info"]["host_bound"] = True
    table = bench.format_table(doc)
    assert f"{TORCH_S[1] * FAMILY_FRACTION['gfx942'] * 1e6:.1f}!" in _line(table, "triton gfx942", "    1  ")
    assert sum("includes launch overhead" in ln for ln in table.splitlines()) == 1


def test_spawn_does_not_pass_on_an_xdist_workers_variables(monkeypatch):
    seen = {}

    def fake_run(cmd, cwd=None, env=None):
        seen.update(env=env, cwd=cwd)
        return subprocess.CompletedProcess(cmd, 3)

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("SMV_KEEP_ME", "1")
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    assert bench._spawn(["pytest"], ROOT) == 3
    assert "PYTEST_XDIST_WORKER" not in seen["env"] and seen["env"]["SMV_KEEP_ME"] == "1" and seen["cwd"] == ROOT


@pytest.fixture
def triton_imported():
    """Triton imported before pytester snapshots sys.modules: the snapshot's restore would drop it, and its C
    extension refuses a second import in one process (a later test importing triton would abort)."""
    import triton  # noqa: F401


def test_the_gpu_benchmark_module_runs_end_to_end_on_fakes(triton_imported, pytester, monkeypatch):
    """A dry run of tests/benchmarks/bench_decode.py itself, here: its fixtures, its calls and its records, with
    fake CUDA events (host clock), the hardware marker lifted, tiny shapes and batch 1, under the interpreter. It
    times nothing meaningful; it proves the module the GPU host runs has no error this machine could have shown."""
    import time

    # hermetic: a caller's upstream tree (a relative path) does not exist in pytester's directory
    monkeypatch.delenv("SMV_BENCH_SUBJECT", raising=False)

    import torch

    import contracts.plugin as plugin

    class HostEvent:
        def record(self):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    class TinyWorkload(bench.DecodeWorkload):
        def __init__(self, batch, device):
            super().__init__(batch, device, heads=2, swa=8, extra=16, cu_count=1)

    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=True: HostEvent())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(plugin, "marker_status", lambda m, **k: (True, "dry run"))
    monkeypatch.setattr(bench, "DecodeWorkload", TinyWorkload)
    # the CPU has no graphs: a "replay" here is the call itself, so the graph rounds' path runs end to end
    monkeypatch.setattr(bench, "graph_replay", lambda fn, device: fn)
    monkeypatch.setattr(bench, "BATCHES", (1,))
    monkeypatch.setattr(bench, "GPU_ROUNDS", 2)
    monkeypatch.setattr(bench, "GPU_WARMUP_ROUNDS", 0)
    monkeypatch.setattr(bench, "CEILING_ROUNDS", 2)
    monkeypatch.setattr(bench, "COPY_BYTES", 1 << 12)
    monkeypatch.setattr(bench, "MATMUL_SIZE", 16)
    monkeypatch.setattr(bench, "FLUSH_BYTES", 1 << 12)
    monkeypatch.setattr(bench.L2Flush.__init__, "__defaults__", (1 << 12,))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    # FlashMLA's column is not part of the dry run: with fakes for events and graphs and two heads it would time
    # nothing it can run (a GPU host carrying FlashMLA runs that column in the real benchmark)
    from contracts.subjects import flashmla

    monkeypatch.setattr(flashmla, "unavailable_reason", lambda *a, **k: "dry run of the module (fakes)")
    out = pytester.path / "dry.json"
    res = pytester.runpytest_inprocess(str(ROOT / "tests" / "benchmarks" / "bench_decode.py"), "-p",
                                       "no:cacheprovider", "-q", f"--benchmark-json={out}")
    monkeypatch.delenv("SMV_BENCH_SUBJECT", raising=False)
    # the subject columns need SMV_BENCH_SUBJECT; FlashMLA's column is skipped in this dry run (see above)
    res.assert_outcomes(passed=3 + 2 + 1 + 2, skipped=3 + 2 + 1)
    doc = bench.load_results(out)
    infos = {b["name"]: b["extra_info"] for b in doc["benchmarks"]}
    assert set(infos) == {"test_decode[generic-b1]", "test_decode[gfx942-b1]", "test_decode[gfx950-b1]",
                          "test_reduce[gfx942-b1]", "test_reduce[gfx950-b1]", "test_torch_baseline[b1]",
                          "test_copy_ceiling", "test_matmul_ceiling"}
    for name, info in infos.items():
        assert info["smv_bench"] == bench.EXTRA_INFO_VERSION and info["seconds"] > 0, name
        assert info["copy_ceiling_bytes_per_s"] > 0 and info["matmul_ceiling_flops_per_s"] > 0, name
        assert isinstance(info["host_bound"], bool) and info["host_launch_seconds"] > 0, name
    for name, info in infos.items():
        timed_twice = name.startswith(("test_decode[", "test_reduce["))
        assert (info.get("graph_seconds") or 0) > 0 if timed_twice else "graph_seconds" not in info, name
    assert infos["test_decode[gfx950-b1]"]["ratio_to_torch"] > 0
    assert infos["test_decode[gfx950-b1]"]["bytes"] == bench.decode_figures(1, 2, 8, 16)["bytes"]
    table = bench.format_table(doc)
    for label in ("triton generic", "triton gfx942", "triton gfx950", "torch gather + SDPA", "reduce gfx950"):
        assert label in table


def test_subject_decode_column_runs_the_subjects_entry_point(vllm_subject):
    """The subject's column calls the subject's own decode (upstream's wrapper and kernels here, under the
    interpreter) on the workload's inputs; its output is the same function as ours."""
    import torch

    from impl.runtime import kernel_device

    w = bench.DecodeWorkload(1, kernel_device(), heads=2, swa=8, extra=16, cu_count=1)
    fn, _ = w.subject_decode_call(vllm_subject, "generic")
    got = fn().float()
    ours, _ = w.decode_call("generic")
    want = ours().float()
    assert got.shape == want.shape and bool(torch.isfinite(got).all())
    # both round p and the output to bf16: a few ulps of the output's scale
    assert float((got - want).abs().max()) <= 4 * 2.0 ** -8 * float(want.abs().max())


def test_subject_reduce_column_reduces_our_partials_to_our_output(vllm_subject):
    """The subject's reduce column launches the subject's own reduce kernel on the partials ours reduces: the same
    work on the same bytes, so the two outputs agree to the bf16 rounding of the output."""
    import torch

    from impl.runtime import kernel_device

    w = bench.DecodeWorkload(2, kernel_device(), heads=2, swa=8, extra=16, cu_count=2)
    for family in bench.SPLIT_FAMILIES:
        ours, plan = w.reduce_call(family)
        want = ours().float().clone()
        fn, splan = w.subject_reduce_call(vllm_subject, family)
        assert splan == plan
        fn().fill_(float("nan"))  # the timed call must write the output itself
        got = fn().float()
        assert bool(torch.isfinite(got).all())
        assert float((got - want).abs().max()) <= 2 * 2.0 ** -8 * float(want.abs().max()), family


def test_table_gives_each_subject_row_its_time_over_ours():
    def b(name, seconds, **info):
        base = {"smv_bench": bench.EXTRA_INFO_VERSION, "kind": "decode", "batch": 64, "bytes": 1000, "flops": 1000}
        base.update(info)
        return {"name": name, "fullname": name, "stats": {"median": seconds}, "extra_info": base}

    doc = {"benchmarks": [b("test_decode[gfx950-b64]", 2e-6, family="gfx950", num_splits=2),
                          b("test_decode_subject[gfx950-b64]", 3e-6, family="gfx950", subject="vllm==0.33.0"),
                          b("test_decode[generic-b64]", 1e-6, family="generic", num_splits=1)]}
    table = bench.format_table(doc)
    assert "vs subj" in table.splitlines()[0] and "graph us" not in table
    row = _line(table, "vllm==0.33.0 gfx950")
    assert row.split()[-1] == "1.50x"  # the subject's 3 us over our 2 us
    # a subject's reduce is set against our reduce, not our whole decode
    red = {"benchmarks": doc["benchmarks"] + [
        b("test_reduce[gfx950-b64]", 4e-6, kind="reduce", family="gfx950", num_splits=2),
        b("test_reduce_subject[gfx950-b64]", 5e-6, kind="reduce", family="gfx950", subject="vllm==0.33.0")]}
    table = bench.format_table(red)
    assert _line(table, "vllm==0.33.0 reduce gfx950").split()[-1] == "1.25x"
    assert _line(table, "vllm==0.33.0 gfx950").split()[-1] == "1.50x"
    assert _line(table, "triton gfx950").rstrip().endswith("x") is False or "1.50x" not in _line(table, "triton gfx950")


def test_graph_median_says_why_there_is_no_graph_figure(monkeypatch):
    assert bench.graph_median(lambda: None, "cpu", lambda: None, rounds=2, warmup_rounds=0) == (
        None, "no CUDA graphs on this device")

    def refuses(fn, device):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(bench, "graph_replay", refuses)
    secs, why = bench.graph_median(lambda: None, "cuda", lambda: None, rounds=2, warmup_rounds=0)
    assert secs is None and why == "RuntimeError: operation not permitted when stream is capturing"


def test_table_sets_a_subject_against_ours_by_their_graph_replays_where_both_have_one():
    def b(name, seconds, **info):
        base = {"smv_bench": bench.EXTRA_INFO_VERSION, "kind": "decode", "batch": 64, "bytes": 1000, "flops": 1000}
        base.update(info)
        return {"name": name, "fullname": name, "stats": {"median": seconds}, "extra_info": base}

    # the subject's event-timed call is host-bound (3 ms); replayed from a graph it is 300 us against our 200 us
    doc = {"benchmarks": [
        b("test_decode[gfx950-b64]", 210e-6, family="gfx950", num_splits=2, graph_seconds=200e-6),
        b("test_decode_subject[gfx950-b64]", 3e-3, family="gfx950", subject="vllm==0.33.0", host_bound=True,
          graph_seconds=300e-6),
        b("test_decode[gfx942-b64]", 100e-6, family="gfx942", num_splits=1, graph_seconds=90e-6),
        b("test_decode_subject[gfx942-b64]", 150e-6, family="gfx942", subject="vllm==0.33.0",
          graph_error="no CUDA graphs on this device")]}
    table = bench.format_table(doc)
    assert "graph us" in table.splitlines()[0]
    sub = _line(table, "vllm==0.33.0 gfx950").split()
    assert sub[-1] == "1.50x" and "300.0" in sub  # 300 / 200, not 3000 / 210
    # one side without a graph figure: both event-timed calls, 150 / 100
    assert _line(table, "vllm==0.33.0 gfx942").split()[-1] == "1.50x"
    assert " - " in _line(table, "vllm==0.33.0 gfx942")
    assert any(line.startswith("graph us:") and "vs subj" in line for line in table.splitlines())


def test_table_shows_the_indexer_path_beside_torch_the_copy_ceiling_and_the_subject():
    def b(name, seconds, **info):
        base = {"smv_bench": bench.EXTRA_INFO_VERSION, "bytes": 4_000_000, "flops": 0,
                "copy_ceiling_bytes_per_s": 4e12}
        base.update(info)
        return {"name": name, "fullname": name, "stats": {"median": seconds}, "extra_info": base}

    gather = dict(kind="gather", tokens=65536, block_size=64, layout="normal")
    logits = dict(kind="logits", requests=64, heads=64, context=8192, layout="normal")
    doc = {"benchmarks": [
        b("test_gather[t65536-normal]", 2e-6, family="gfx950", fraction_of_copy_ceiling=0.5, ratio_to_torch=4.0,
          **gather),
        b("test_logits[normal]", 60e-6, family="paged", ratio_to_torch=16.0, **logits),
        # the torch reference shares the shape and layout; sorted after ours, it must not become the subject's match
        b("test_logits_torch[normal]", 1e-3, family="torch-reference", **logits),
        b("test_logits_subject[normal]", 30e-6, family="paged", subject="vllm==0.33.0", **logits)]}
    lines = bench.format_table(doc).splitlines()
    assert any(line.startswith("indexer path") and "vs subj" in line for line in lines)
    g = _line("\n".join(lines), "gather 65536 tok bs 64")
    assert "triton gfx950" in g and " 50.0%" in g and "4.00x" in g and "2000" in g  # 4 MB in 2 us
    sub = _line("\n".join(lines), "vllm==0.33.0 paged")
    assert sub.split()[-1] == "0.50x"  # the subject's 30 us over our 60 us: ours is slower
    assert "16.00x" in _line("\n".join(lines), "triton paged")


# --- compiler statistics and benchmarks/decode_variants.py ----------------------------------------------------------

class _FakeCompiled:
    def __init__(self, regs, spills, shared):
        self.n_regs, self.n_spills = None, None
        self._want = (regs, spills)
        self.metadata = argparse.Namespace(shared=shared, num_warps=4, num_stages=1)

    def _init_handles(self):
        self.n_regs, self.n_spills = self._want


class _FakeJit:
    """A @triton.jit function's shape as Triton 3.x keeps its binaries: device -> (kernel cache, ..., binder)."""

    def __init__(self):
        self.device_caches = {0: ({}, {}, "target", "backend", None)}

    def add(self, key, ck):
        self.device_caches[0][0][key] = ck
        self.device_caches[0][1][key] = "not a kernel"


def test_stats_watch_reports_the_binaries_each_variant_added():
    k = _FakeJit()
    k.add("old", _FakeCompiled(40, 0, 1024))
    w = bench.StatsWatch({"partial": k})
    assert w.new() == {}
    k.add("new", _FakeCompiled(255, 12, 81920))
    got = w.new()
    assert got == {"partial": {"n_regs": 255, "n_spills": 12, "shared": 81920, "num_warps": 4, "num_stages": 1}}
    assert w.new() == {}
    assert bench.format_stats(got) == "partial: 255r/12sp/80K"
    assert bench.compiled_kernels(object()) == []


def _load_decode_variants():
    import importlib.util

    spec = importlib.util.spec_from_file_location("decode_variants", ROOT / "benchmarks" / "decode_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_decode_variants_names_valid_variants_and_parses_them_from_the_environment():
    from impl import decode as D

    dv = _load_decode_variants()
    for family, vs in dv.VARIANTS.items():
        assert vs[0] == ("default", {}), family
        assert len({n for n, _ in vs}) == len(vs), family
        for _, fields in vs:
            D.DecodeVariant(**fields)
    for family, vs in dv.VARIANTS.items():  # the benchmark times the single-read build the library names
        if "single-read" in dict(vs):
            assert D.DecodeVariant(**dict(vs)["single-read"]) == D.SINGLE_READ_VARIANTS[dv.KERNEL_FAMILY[family]]
    got = D.parse_variants("gfx950:rope16,block_h=64,extra_tile=32,num_stages=1; gfx942:rope16=0,num_warps=8")
    assert got == {"gfx950": D.DecodeVariant(rope16=True, block_h=64, extra_tile=32, num_stages=1),
                   "gfx942": D.DecodeVariant(num_warps=8)}
    for bad in ("gfx999:rope16", "gfx950:nonsense", "gfx950:extra_tile=48", "gfx950:rope16=maybe",
                "gfx950:block_h=48", "gfx950:k512", "gfx950:i32_offsets"):
        with pytest.raises(ValueError):
            D.parse_variants(bad)


def test_decode_variants_dry_run_checks_every_row_and_writes_its_json(tmp_path, capsys):
    """The GPU script's own steps on the interpreter at a tiny shape: fp8 paths, oracle checks into poisoned
    buffers, bit identity with the default; no timing, and the statistics line says why there are none."""
    dv = _load_decode_variants()
    out = tmp_path / "dv.json"
    rc = dv.main(["--dry-run", "--no-upstream", "--families", "generic", "--variants", "single-read",
                  "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    doc = json.loads(out.read_text())
    from impl.triton_helpers import native_fp8_flavours

    hw = {(fl, "hardware") for fl in native_fp8_flavours()}  # none under the interpreter
    assert {(r["flavour"], r["path"]) for r in doc["fp8"]} == {("ocp", "bits"), ("fnuz", "bits")} | hw
    assert all(r["exact"] for r in doc["fp8"])
    rows = [r for r in doc["rows"] if r["family"] == "generic"]
    assert {(r["batch"], r["variant"]) for r in rows} == {(b, v) for b in (1, 2) for v in ("default", "single-read")}
    assert all(r["oracle"]["ok"] and r["oracle"]["nan_positions_equal"] for r in rows)
    from impl.runtime import triton_mode

    if triton_mode() == "interpreter":  # natively each build schedules its fp32 work itself (test_decode says so)
        assert all(r["vs_default"]["bit_identical"] for r in rows if r["variant"] != "default")

    if triton_mode() == "interpreter":
        assert "compiler statistics: none" in text
    else:
        assert all(r.get("stats") is not None for r in rows) and not any(r.get("us") for r in rows)


def test_decode_variants_summary_compares_graph_figures_so_a_host_bound_adapter_is_not_charged():
    """Batch 64 as the H200 measured it: upstream's decode by events is its adapter's host time (1482.6 us), its
    graph replay 191.4; the summary's ratios use the graph figures of the line, best included, and a torch row
    with no graph median is shown by events and marked; without graph figures the whole line is by events."""
    dv = _load_decode_variants()

    def row(impl, us, graph=None, variant=None, **kw):
        r = {"batch": 64, "family": "gfx950", "impl": impl, "us": us, "timing": "do_bench", **kw}
        if graph is not None:
            r["graph_us"] = graph
        if variant:
            r["variant"] = variant
        return r

    rows = [row("ours default", 142.6, 136.9, "default", oracle={"ok": True}),
            row("ours single-read", 100.7, 96.3, "single-read", oracle={"ok": True}),
            row("ours x64", 90.0, 99.0, "x64", oracle={"ok": True}),  # faster by events, slower replayed
            row("ours reduce", 11.5),
            row("upstream", 1482.6, 191.4),
            {"batch": 64, "family": "torch", "impl": "torch gather + SDPA", "us": 163.0, "timing": "do_bench"}]
    line = next(ln for ln in dv.summary_table({"rows": rows}).splitlines() if ln.startswith("   64 gfx950"))
    assert line.split() == ["64", "gfx950", "191.4", "136.9", "single-read", "96.3", "0.72", "0.50", "163.0*",
                            "graph"]
    assert "* torch us by events" in dv.summary_table({"rows": rows})
    events = [{k: v for k, v in r.items() if k != "graph_us"} for r in rows]
    line = next(ln for ln in dv.summary_table({"rows": events}).splitlines() if ln.startswith("   64 gfx950"))
    assert line.split() == ["64", "gfx950", "1482.6", "142.6", "x64", "90.0", "0.10", "0.06", "163.0", "events"]
    assert "torch us by events" not in dv.summary_table({"rows": events})
    # a line by events shows torch by events too, unmarked, even where torch has a graph figure
    mixed = events[:-1] + [dict(events[-1], graph_us=150.0)]
    line = next(ln for ln in dv.summary_table({"rows": mixed}).splitlines() if ln.startswith("   64 gfx950"))
    assert line.split()[-2:] == ["163.0", "events"]


def test_decode_variants_skips_only_calls_that_faulted_in_their_compile_worker():
    dv = _load_decode_variants()
    got = dv.faulted_jobs([
        {"job": "gfx950 k512", "ok": False, "error": "RuntimeError: CUDA error: an illegal memory access was encountered"},
        {"job": "gfx942 w8", "ok": False, "error": "OutOfResources: out of resource: shared memory"},
        {"job": "generic default", "ok": True}])
    assert list(got) == ["gfx950 k512"]  # a compile failure is retried (and reported) by the main process


def test_generation_floor_times_the_contracts_own_strategy_and_divides_the_reference(tmp_path, capsys):
    """benchmarks/generation_floor.py: draws from a contract's own strategy (no check runs), ms per case, and a
    reference audit.json row's seconds per case over that floor; a row the reference lacks has no bound."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("generation_floor", ROOT / "benchmarks" / "generation_floor.py")
    gf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gf)
    ref_path = tmp_path / "audit.json"
    split = {"compile": 0.0, "kernel": 1.5, "oracle": 0.1, "harness": 0.4}
    ref_path.write_text(json.dumps({"schema_version": 7, "results": [
        {"contract": "decode-reduce-oracle", "target": "gfx942", "status": "pass", "cases": 4, "seconds": 2.0,
         "time_split": split},
        {"contract": "decode-reduce-oracle", "target": "gfx950", "status": "skipped", "cases": 0, "seconds": 0.0}]}))
    ref = gf.reference_rows(str(ref_path))
    assert ref == {("decode-reduce-oracle", "gfx942"): (0.5, pytest.approx(4.0))}
    rows = gf.measure(["decode-reduce-oracle"], 3, ref)
    assert [r["target"] for r in rows] == ["gfx942", "gfx950"]
    assert all(r["cases"] == 3 and r["generation_ms"] > 0 for r in rows)
    assert rows[0]["gen_bound"] == pytest.approx(500.0 / rows[0]["generation_ms"])
    assert rows[0]["harness_bound"] == pytest.approx(4.0)  # 2.0 s over 0.1 + 0.4
    assert "gen_bound" not in rows[1]
    out = tmp_path / "floor.json"
    assert gf.main(["--contract", "decode-reduce-oracle", "--cases", "2", "--reference", str(ref_path),
                    "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rows have a generation bound under 10" in text and len(json.loads(out.read_text())["rows"]) == 2
    with pytest.raises(SystemExit):
        gf.main(["--contract", "no-such-contract"])
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({"schema_version": 5, "results": []}))
    with pytest.raises(SystemExit, match="schema 6"):
        gf.reference_rows(str(bad))


def test_profile_decode_summarizes_an_ncu_raw_export(tmp_path):
    """benchmarks/profile_decode.py --summarize reads ncu's ``--csv --page raw`` shape (metric names, a unit row,
    one row per launch): durations in microseconds, shared memory in KiB, the stall reasons largest first."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("profile_decode", ROOT / "benchmarks" / "profile_decode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    stall = mod.STALL_PREFIX + "{}" + mod.STALL_SUFFIX
    head = ["ID", "Kernel Name", "gpu__time_duration.sum", "launch__shared_mem_per_block_dynamic",
            stall.format("long_scoreboard"), stall.format("wait"), stall.format("lg_throttle")]
    units = ["", "", "nsecond", "byte", "", "", ""]
    rows = [["0", "_sparse_decode_gfx942_partial_kernel", "144,500", "88064", "1.5", "0.25", "7.75"],
            ["1", "_sparse_attn_decode_partial_kernel", "204000", "90112", "1.0", "2.0", "0"]]
    path = tmp_path / "raw.csv"
    path.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in [head, units, *rows]) + "\n")
    lines = mod.summarize(path).splitlines()
    assert lines[0].startswith("kernel") and len(lines) == 3
    ours, up = lines[1], lines[2]
    assert ours.startswith("_sparse_decode_gfx942_partial_kernel") and " 144.5 " in ours and " 86.0 " in ours
    assert ours.index("lg_throttle 7.8") < ours.index("long_scoreboard 1.5") < ours.index("wait 0.2")
    assert " 204.0 " in up and "lg_throttle" not in up  # a zero stall is not listed


# --- issue 31 items 3 and 4: the size rule, the logits builds, and the GPU script that measures them ---------------

def test_decode_variants_times_the_size_rules_two_builds():
    """decode_variants.py's "narrow" and "single-read" rows are the two builds impl.decode's size rule picks
    between, so the table sets the default beside both."""
    from impl import decode as D

    dv = _load_decode_variants()
    for family in ("gfx942", "gfx950"):
        rule = D.DEFAULT_VARIANTS[family]
        assert isinstance(rule, D.SizeRule)
        vs = dict(dv.VARIANTS[family])
        assert D.DecodeVariant(**vs["narrow"]) == rule.narrow == D.NARROW_VARIANTS[family]
        assert D.DecodeVariant(**vs["single-read"]) == rule.wide
    assert D.DEFAULT_VARIANTS["generic"] == D.NARROW_VARIANTS["generic"]  # generic keeps upstream's design


def test_size_rule_picks_by_the_launch_size_and_the_launch_runs_that_build():
    """The H200 points the rule was set from (64 heads; the targets' CU counts 304 / 256): 16-head blocks at batch 1
    and on gfx942 at batch 64 (S = 1), the single-read build at batch 512 and on gfx950 at batch 64 (S = 2). A
    launch runs what the rule picks for the CU count it is given, and both builds give the same values."""
    from fuzz import decode as fz
    from impl import decode as D
    from impl.targets import get_target

    g942, g950 = D.DEFAULT_VARIANTS["gfx942"], D.DEFAULT_VARIANTS["gfx950"]
    for rule, batch, s, wide in ((g942, 1, 16, False), (g942, 64, 1, False), (g942, 512, 1, True),
                                 (g950, 1, 32, False), (g950, 64, 2, True), (g950, 512, 1, True)):
        cu = get_target("gfx942" if rule is g942 else "gfx950").cu_count
        assert rule.pick(batch, s, 64, cu) == (rule.wide if wide else rule.narrow), (batch, s)
    with pytest.raises(ValueError):
        D.SizeRule(D.NARROW_VARIANTS["gfx942"], D.NARROW_VARIANTS["gfx942"])
    with pytest.raises(ValueError):
        D.SizeRule(g942.narrow, g942.wide, fill=0)
    with pytest.raises(TypeError):
        D.SizeRule(g942.narrow, "wide")
    case = fz.DecodeCase(seed=7, batch=1, heads=3, main_bs=4, extra_bs=8, main_lens=(9,), extra_lens=(40,),
                         invalid_rate=0.0, indptr_offset=0, tail_junk=1, scale=0.11, sink="mixed", poison="none",
                         padded=True, q_transposed=False, cu_count=1)
    t = get_target("gfx950")
    inp = fz.build_decode_inputs(case, t)
    # a plan with no build recorded (as one made by hand): each launch picks by the CU count it is given
    plan = dataclasses.replace(D.plan_decode(t, 1, 3, inp.main_indices.numel(), inp.extra_indices.numel(),
                                             cu_count=1), build=None)
    outs, blocks = {}, {}
    for cu in (1, 2 * plan.num_splits + 1):  # fills half of one CU / leaves more than half of the CUs idle
        seen = []
        with D.launch_observer(lambda r: seen.append(dict(r.meta))):
            outs[cu] = D.sparse_attn_decode(inp.q, inp.main_cache, inp.main_indices, inp.main_indptr,
                                            inp.extra_cache, inp.extra_indices, inp.extra_indptr,
                                            attn_sink=inp.attn_sink, softmax_scale=inp.softmax_scale, target=t,
                                            cu_count=cu, plan=plan).cpu()
        blocks[cu] = seen[0]["BLOCK_H_"]
        assert fz._build_class(case.replace(num_splits=plan.num_splits, cu_count=cu), t) == \
            ("wide" if blocks[cu] == 64 else "narrow")
    assert blocks == {1: 64, 2 * plan.num_splits + 1: 16}
    a, b = outs[1].float(), outs[2 * plan.num_splits + 1].float()
    assert torch_equal_nan(a, b) and float((a - b).abs().nan_to_num().max()) <= 2 ** -6 * float(a.abs().max())


def torch_equal_nan(a, b) -> bool:
    import torch

    return bool(torch.equal(a.isnan(), b.isnan()))


def _load_logits_variants():
    import importlib.util

    spec = importlib.util.spec_from_file_location("logits_variants", ROOT / "benchmarks" / "logits_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_logits_builds_compute_the_defaults_bits_and_parse_from_the_environment():
    """Every LogitsVariant the benchmark times is a valid build; under the interpreter each gives the default's
    bits on NORMAL and SHUFFLE caches whether or not its page_tile guard lets it in (block sizes that do and do not
    divide the tile; the guards themselves below); the override parses and restores."""
    import torch

    from fuzz.indexer_logits import IndexerLogitsCase, build_decode_inputs
    from impl import indexer_logits as il
    from impl.targets import get_target

    lv = _load_logits_variants()
    assert lv.VARIANTS[0][0] == "default" and len({n for n, _ in lv.VARIANTS}) == len(lv.VARIANTS)
    assert il.LogitsVariant(**lv.VARIANTS[0][1]) == il.DEFAULT_LOGITS_VARIANT  # the row times the library's default
    builds = [il.LogitsVariant(**f) for _, f in lv.VARIANTS] + [il.LogitsVariant(block=16, page_tile=True,
                                                                                 scale32=True, tiles=2)]
    # one of each program the interpreter runs (warps, stages, fp8_dot and f16 do not change it here)
    builds = list({(v.block, v.tiles, v.fill, v.page_tile, v.scale32): v for v in builds}.values())
    for layout, bs in (("shuffle", 16), ("normal", 32)):
        case = IndexerLogitsCase(seed=1, mode="decode", heads=5, topk=4, next_n=2, block_size=bs, layout=layout,
                                 context_lens=(70, 3), max_model_len=80, extra_columns=1)
        inp = build_decode_inputs(case, "ocp")

        def call():
            return il.fp8_paged_mqa_logits(inp.q, inp.cache, inp.weights, inp.context_lens, inp.block_table,
                                           case.max_model_len, layout=case.layout, target="gfx950")
        ref = call().view(torch.int32).clone()
        for v in builds:
            with il.logits_variant(v) as active:
                assert active == v
                assert torch.equal(call().view(torch.int32), ref), (layout, bs, v)
        assert il._logits_variant == il.DEFAULT_LOGITS_VARIANT
    t = get_target("gfx950")
    odd = torch.empty(2 * 64 * 132 + 2, dtype=torch.uint8)[2:].view(2, 64, 132)  # 2-byte aligned only
    _, meta = il._paged_launch(il.LogitsVariant(page_tile=True, scale32=True), 1, 128, 64, odd, t)
    assert meta["PAGE_TILE"] is True and meta["SCALE32"] is False
    _, meta = il._paged_launch(il.LogitsVariant(page_tile=True, block=128), 1, 256, 64, odd, t)
    assert meta["PAGE_TILE"] is False  # a 128-position tile spans two 64-token pages
    grid, meta = il._paged_launch(il.LogitsVariant(fill=1.0), 4, 8192, 64, odd, t)
    assert grid[0] * grid[1] >= t.cu_count and meta["TILES"] < il.TILES_PER_PROGRAM
    assert il._parse_logits_variant("page_tile,scale32=1,block=32,tiles=4,fill=0.5,num_warps=8") == \
        il.LogitsVariant(block=32, tiles=4, fill=0.5, page_tile=True, scale32=True, num_warps=8)
    assert il._parse_logits_variant("fp8_dot,fp8_promote=0,f16") == \
        il.LogitsVariant(fp8_dot=True, fp8_promote=False, f16=True)
    assert il._parse_logits_variant(" ") is None
    for bad in ("nonsense", "block=48", "tiles=0", "fill=-1"):
        with pytest.raises(ValueError):
            il._parse_logits_variant(bad)
    with pytest.raises(TypeError):
        with il.logits_variant("page_tile"):
            pass


def test_logits_variants_dry_run_checks_every_build_against_the_oracle(tmp_path, capsys):
    lv = _load_logits_variants()
    out = tmp_path / "lv.json"
    rc = lv.main(["--dry-run", "--variants", "page+s32,page+s32+fill,page+s32+b128", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    rows = json.loads(out.read_text())["rows"]
    assert [r["impl"] for r in rows] == ["default", "page+s32", "page+s32+fill", "page+s32+b128"]
    assert all(r["oracle"]["ok"] and r["oracle"]["worst_err_over_tol"] <= 1.0 for r in rows)
    assert all(r["bit_identical_to_default"] for r in rows[1:])
    assert rows[2]["launch"]["grid"][1] > rows[1]["launch"]["grid"][1]  # fill: more, shorter programs
    assert "logits_variants: 4 rows" in text


def test_logits_check_fails_a_wrong_logit_and_a_lost_mask():
    """The script's check can fail: one logit moved past the contract's bound, or a masked column not -inf."""
    import torch

    lv = _load_logits_variants()
    ref = {"logits": torch.tensor([[1.0, 2.0, float("-inf")]], dtype=torch.float64),
           "tol": torch.tensor([[1e-6, 1e-6, 0.0]], dtype=torch.float64),
           "visible": torch.tensor([[True, True, False]])}
    good = torch.tensor([[1.0, 2.0, float("-inf")]])
    assert lv.check(ref, good)["ok"]
    assert not lv.check(ref, torch.tensor([[1.0, 2.001, float("-inf")]]))["ok"]
    assert not lv.check(ref, torch.tensor([[1.0, 2.0, 0.0]]))["ok"]
    assert not lv.check(ref, torch.tensor([[1.0, float("nan"), float("-inf")]]))["ok"]


def test_defaults_h200_script_is_valid_bash_names_existing_rows_and_writes_three_files():
    text = (ROOT / "benchmarks" / "defaults_h200.sh").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "defaults_h200.sh")]).returncode == 0
    dv = _load_decode_variants()
    line = next(x for x in text.splitlines() if x.startswith("dv_variants="))
    names = line.split("=", 1)[1].strip('"').split(",")
    for n in names:
        assert any(n in dict(dv.VARIANTS[f]) for f in ("gfx942", "gfx950")), n
    for f in ("gfx942", "gfx950"):
        assert {"default", "narrow", "single-read"} <= set(names) & set(dict(dv.VARIANTS[f]))
    import re

    written = set(re.findall(r'"\$out/([\w.]+)"', text))
    assert written == {"summary.txt", "log.txt", "defaults.json"}


def test_a_plan_launches_the_build_picked_when_it_was_made():
    """A frozen plan (a graph's, or one handed to an eager decode) runs one build whatever the rows of the launch:
    natively the two builds' bits differ (their warps), so a replay with fewer rows than captured would otherwise
    differ from the capture-size launch. Planned at batch 512 (wide) and launched with 1 row: still wide; a plan made
    by hand (no build recorded) is picked per launch as before; the build is not part of the plan's identity."""
    from impl import decode as D
    from impl.targets import get_target

    t = get_target("gfx942")
    rule = D.DEFAULT_VARIANTS["gfx942"]
    big = D.plan_decode(t, 512, 64, 512 * 128, 512 * 512)
    assert big.build == "wide" and rule.pick(1, big.num_splits, 64, t.cu_count) is rule.narrow
    assert D._launch_variant(big, 1, 64, t, None) is rule.wide
    small = D.plan_decode(t, 1, 64, 128, 512)
    assert small.build == "narrow" and D._launch_variant(small, 512, 64, t, None) is rule.narrow
    by_hand = D.DecodePlan(big.family, big.num_splits, big.head_blocks)
    assert by_hand.build is None and by_hand == big
    assert D._launch_variant(by_hand, 1, 64, t, None) is rule.narrow
    assert D.plan_decode(get_target("generic"), 512, 64, 512 * 128).build is None  # no size rule there


def _nvidia_tools_present() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists()


@pytest.mark.skipif(not _nvidia_tools_present(), reason="this Triton has no NVIDIA backend tools (cuobjdump)")
def test_sm90_static_compiles_our_wide_build_for_sm90_on_a_cpu_host(tmp_path):
    """benchmarks/sm90_static.py compiles the decode natively for sm_90 in a fresh process (no GPU, no launch) and
    reads the cubin: the wide build's partial kernel runs warpgroup MMAs on 64-row tiles and stays within sm_90's
    255 registers; an unknown row is refused by name."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the tool compiles natively
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sm90_static.py"), "--rows", "gfx942:single-read",
                        "logits:bf16", "logits:default", "logits:fp8dev", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    logits = {r["row"]: r for r in rows if r["row"].startswith("logits:")}
    rows = [r for r in rows if not r["row"].startswith("logits:")]
    # the logits builds as logits_variants.py's comment counts them: the default's fp16 operands drop the bf16
    # conversion's F2F and PRMT; the fp8 operands run fp8 warpgroup MMAs (k32) with no conversion at all
    bf16, f16, f8 = (logits[f"logits:{n}"] for n in ("bf16", "default", "fp8dev"))
    assert bf16["sass"].get("F2F", 0) > 0 and bf16["sass"].get("HGMMA", 0) > 0
    assert "F2F" not in f16["sass"] and f16["instructions"] < bf16["instructions"] and f16["sass"].get("HGMMA")
    assert f8["sass"].get("QGMMA", 0) > 0 and all("k32" in s for s in f8["wgmma"]) and "F2FP" not in f8["sass"]
    kernels = {r["kernel"]: r for r in rows}
    partial = next(r for k, r in kernels.items() if "partial" in k)
    assert any("reduce" in k for k in kernels)
    assert partial["grid"][2] == 1  # 64 heads in one program
    assert partial["sass"].get("HGMMA", 0) > 0 and all(s.startswith("m64") for s in partial["wgmma"])
    assert 0 < partial["registers"] <= 255 and partial["shared_bytes"] > 0
    assert "gfx942:single-read" in p.stdout and "partial" in p.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sm90_static.py"), "--rows", "gfx942:nope"],
                         capture_output=True, text=True, timeout=300,
                         env=env)
    assert bad.returncode != 0 and "unknown row 'gfx942:nope'" in (bad.stderr + bad.stdout)
