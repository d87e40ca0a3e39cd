"""The pytest plugin, tested through pytester (the plugin loads from its entry point in the inner run)."""
import pytest

from contracts.markers import MARKERS
from contracts.registry import load_all

# pytester's in-process runs drop the modules first imported inside them; Triton's native extension cannot be
# imported twice in one process (nanobind aborts on a duplicate key), so every kernel module is imported up front
load_all()


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


def test_repro_dir_defaults_under_the_rootdir_and_follows_the_option(pytester):
    pytester.makepyfile("""
        def test_where(smv_repro_dir):
            print("REPRO_DIR=" + smv_repro_dir)
    """)
    res = pytester.runpytest("-s")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines([f"*REPRO_DIR={pytester.path / '.smv' / 'pytest-repro'}"])
    elsewhere = pytester.path / "kept"
    res = pytester.runpytest("-s", "--smv-repro-dir", str(elsewhere))
    res.stdout.fnmatch_lines([f"*REPRO_DIR={elsewhere}"])


#: a zoo mutant (planted bug) whose contract fires in a few seconds: tests/test_contracts.py must fail on it
PLANTED = "gfx942-selector-cap-32"


def _planted_copy(dest):
    """The code folders and tests/test_contracts.py copied to ``dest`` with :data:`PLANTED` applied; returns the
    mutant."""
    import shutil

    from contracts.zoo.runner import CODE_FOLDERS, default_root, load_catalogs

    root = default_root()
    m = next((m for m in load_catalogs() if m.id == PLANTED), None)
    assert m is not None, f"zoo mutant {PLANTED} is gone: pick another quick one for this test"
    for folder in CODE_FOLDERS:
        shutil.copytree(root / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (dest / "tests").mkdir()
    shutil.copy(root / "tests" / "test_contracts.py", dest / "tests")
    src = dest / m.file
    text = src.read_text()
    assert text.count(m.find) == 1, f"zoo mutant {PLANTED} is stale"
    src.write_text(text.replace(m.find, m.replace))
    return m


def test_failing_contract_test_leaves_a_reproducer_that_smv_repro_replays(tmp_path):
    import json
    import os
    import re
    import subprocess
    import sys

    from contracts.zoo.runner import default_root

    planted = tmp_path / "planted"
    planted.mkdir()
    m = _planted_copy(planted)
    cid, tname = m.expect[0], m.targets[0]
    env = dict(os.environ, PYTHONPATH=str(planted), PYTHONDONTWRITEBYTECODE="1")
    env.pop("SMV_TARGET", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(planted),
                           "tests/test_contracts.py", "-k", f"test_contract_holds and {cid}", "--target", tname],
                          cwd=planted, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    # one reproducer; its line shows in the failure and again in the short summary where pytest does not cut the
    # summary to the terminal's width (it does not when CI is set)
    found = set(re.findall(r"replay: smv repro (\S+)", out))
    assert len(found) == 1, out[-3000:]
    (path,) = found
    # absolute and under the rootdir's .smv/, so it can be replayed from anywhere after pytest (and its tmp) is gone
    assert os.path.isabs(path) and os.path.dirname(path) == str(planted / ".smv" / "pytest-repro"), path
    doc = json.loads(open(path).read())
    assert (doc["contract"], doc["target"]) == (cid, tname)

    # replayed on the code that has the bug: the violation again, exit 1
    again = subprocess.run([sys.executable, "-m", "contracts.cli", "repro", path], cwd=planted, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 1 and "VIOLATION" in again.stdout, again.stdout + again.stderr
    # replayed on the real code: the saved case passes, exit 0
    clean_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    fixed = subprocess.run([sys.executable, "-m", "contracts.cli", "repro", path], cwd=default_root(), env=clean_env,
                           capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_hardware_markers_select_every_contract_and_each_has_a_cpu_twin(pytester):
    from contracts.registry import load_all
    from contracts.zoo.runner import default_root

    items, _ = pytester.inline_genitems(str(default_root() / "tests" / "test_hardware.py"))
    marks = {it.name: {m for m in ("gfx942", "gfx950") if it.get_closest_marker(m)} for it in items}
    unmarked = {name for name, m in marks.items() if not m}
    contracts = load_all()
    for arch in ("gfx942", "gfx950"):
        marked = [name for name, m in marks.items() if arch in m]
        for cid in sorted(contracts):
            # subject-agreement compares a subject with ours: nothing to run natively on ours
            if contracts[cid].applies_to(arch) and not contracts[cid].extra.get("skipped_on_ours"):
                assert f"test_contract_natively[{arch}-{cid}]" in marked, (arch, cid)
        assert f"test_detection[{arch}]" in marked
        for name in marked:  # the twin: same function name + _twin, same parameters, runs without the hardware
            func, _, params = name.partition("[")
            twin = f"{func}_twin" + (f"[{params}" if params else "")
            assert twin in unmarked, f"{name} (marked {arch}) has no CPU twin {twin}"
    assert marks["test_real_aiter_opus_route"] == {"gfx950"}
