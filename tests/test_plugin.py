"""The pytest plugin, tested through pytester (the plugin loads from its entry point in the inner run)."""
import pytest

from contracts.markers import MARKERS


def test_markers_listed(pytester):
    res = pytester.runpytest("--markers")
    out = res.stdout.str()
    for m in MARKERS:
        assert f"@pytest.mark.{m}:" in out


def test_strict_markers_accepts_ours_and_rejects_unknown(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.gfx950
        def test_a(): pass
        @pytest.mark.slow
        def test_b(): pass
        @pytest.mark.notamarker
        def test_c(): pass
    """)
    res = pytester.runpytest("--strict-markers")
    res.stdout.fnmatch_lines(["*'notamarker' not found in `markers` configuration option*"])


def test_missing_hardware_is_skipped_with_what_was_needed_and_found(pytester):
    from contracts.markers import marker_status

    pytester.makepyfile("""
        import pytest
        @pytest.mark.gfx950
        def test_needs_mi355x(): pass
        @pytest.mark.cuda
        def test_needs_cuda(): pass
        def test_plain(): pass
    """)
    res = pytester.runpytest("-rs")
    runs = {m: marker_status(m)[0] for m in ("gfx950", "cuda")}
    res.assert_outcomes(passed=1 + sum(runs.values()), skipped=2 - sum(runs.values()))
    for m in ("gfx950", "cuda"):
        if not runs[m]:
            reason = marker_status(m)[1]
            res.stdout.fnmatch_lines([f"*[[]{m}[]] {reason[:40]}*"])
    if not runs["gfx950"]:
        res.stdout.fnmatch_lines(["*[[]gfx950[]] needs a real gfx950 (MI355X) GPU: found*"])


def test_slow_runs_only_with_run_slow(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.slow
        def test_slow(): pass
    """)
    pytester.runpytest("-rs").assert_outcomes(skipped=1)
    pytester.runpytest("--run-slow").assert_outcomes(passed=1)


def test_target_fixture_parametrized_and_selectable(pytester):
    pytester.makepyfile("""
        def test_t(target):
            assert target.name in ("gfx942", "gfx950", "generic")
            if target.name == "gfx942":
                assert target.main_cache_fp8 == "fnuz" and target.split_cap == 16
    """)
    res = pytester.runpytest("-v")
    res.assert_outcomes(passed=3)
    res.stdout.fnmatch_lines(["*test_t?gfx942?*PASSED*", "*test_t?gfx950?*PASSED*", "*test_t?generic?*PASSED*"])
    res = pytester.runpytest("-v", "--target", "gfx950")
    res.assert_outcomes(passed=1)
    res = pytester.runpytest("--target", "gfx999")
    assert res.ret != 0
    res.stderr.fnmatch_lines(["*--target: unknown*gfx999*"])


def test_hypothesis_profile_ci_when_CI_set(pytester, monkeypatch):
    pytester.makepyfile("""
        from hypothesis import settings
        def test_profile():
            s = settings()
            assert s.derandomize is True and s.database is None, (s.derandomize, s.database)
    """)
    monkeypatch.setenv("CI", "true")
    pytester.runpytest().assert_outcomes(passed=1)


def test_interpreter_chosen_exactly_when_no_gpu(pytester):
    pytester.makepyfile("""
        import os
        from impl.runtime import detect_device
        def test_mode():
            want = "1" if detect_device().kind == "cpu" else None
            assert os.environ.get("TRITON_INTERPRET") == want
    """)
    pytester.runpytest().assert_outcomes(passed=1)
