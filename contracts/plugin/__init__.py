"""The suite's pytest plugin (registered through the ``pytest11`` entry point as ``smv``).

- decides the Triton mode before Triton is imported (interpreter when no GPU is visible);
- registers the hardware markers ``gpu``, ``cuda``, ``rocm``, ``gfx942``, ``gfx950`` and ``slow`` (so
  ``--strict-markers`` works) and skips tests whose hardware is missing, saying what was needed and what was found;
- runs ``slow`` tests only with ``--run-slow``;
- parametrizes a ``target`` fixture over the emulated targets (``--target`` repeatable; default all three);
- registers the Hypothesis profiles dev / ci / nightly and loads ``ci`` when ``CI`` is set, else ``dev``;
- ``--changed-since REF`` keeps only the test files a change since REF touched (contracts.engine.changes: each
  test file's imports from this suite, the impl modules its contracts ran, the files it names); a change the
  suite cannot map to tests (the engine, oracles, fuzz, shared fixtures, pyproject.toml) keeps every test;
- gives tests an ``smv_repro_dir`` fixture (``--smv-repro-dir``, default ``.smv/pytest-repro`` under the rootdir)
  where failing contract rows keep their reproducers after pytest exits, and :func:`row_failure` to say so.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import impl  # noqa: F401  - must run before anything imports Triton
from contracts.markers import HARDWARE_MARKERS, MARKERS, marker_status

#: relative to the rootdir; outside pytest's tmp_path so the reproducer outlives the run
DEFAULT_REPRO_DIR = os.path.join(".smv", "pytest-repro")


def _one_torch_thread():
    """The checks run many tiny tensor ops; torch's intra-op thread pool only adds contention there (measured on
    2-core CI machines: a [2,576]x[576,5] matmul took ms instead of us under load), and xdist already uses the cores."""
    if not os.environ.get("SMV_TORCH_THREADS_KEEP"):
        import torch

        torch.set_num_threads(1)


def pytest_addoption(parser):
    group = parser.getgroup("smv", "sparse-mla-verify")
    group.addoption("--run-slow", action="store_true", default=False, help="also run tests marked slow (nightly)")
    group.addoption("--target", action="append", default=None, dest="smv_targets",
                    help="emulated target for the `target` fixture (repeatable; default: gfx942, gfx950, generic)")
    group.addoption("--smv-profile", default=None, choices=("dev", "ci", "nightly"),
                    help="Hypothesis profile (default: ci when $CI is set, else dev)")
    group.addoption("--smv-repro-dir", default=None, metavar="DIR",
                    help=f"where failing contract rows write their reproducers for `smv repro` "
                         f"(default: {DEFAULT_REPRO_DIR} under the rootdir)")
    group.addoption("--changed-since", default=None, metavar="REF", dest="smv_changed_since",
                    help="only the test files a change since REF (a commit of this suite: git diff REF...HEAD plus "
                         "uncommitted files) touched; an engine, oracle or fuzz change keeps every test")


def pytest_configure(config):
    _one_torch_thread()
    for name, desc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {desc}")
    from hypothesis import settings

    from fuzz.profiles import default_profile, register_profiles

    register_profiles()
    explicit = config.getoption("hypothesis_profile", default=None)
    if not explicit:
        settings.load_profile(config.getoption("smv_profile") or default_profile())
    names = config.getoption("smv_targets") or []
    from impl.targets import TARGET_NAMES

    bad = [n for n in names if n not in TARGET_NAMES]
    if bad:
        raise pytest.UsageError(f"--target: unknown {bad}; expected some of {', '.join(TARGET_NAMES)}")


def pytest_report_header(config):
    from impl.runtime import detect_device, triton_mode

    d = detect_device()
    return f"smv: device {d.kind} {d.name} ({d.arch}), Triton {triton_mode()}"


def pytest_generate_tests(metafunc):
    if "target" in metafunc.fixturenames and "target" not in getattr(metafunc.function, "_smv_no_target", ()):
        if any(m.name == "parametrize" and "target" in str(m.args[0]) for m in metafunc.definition.iter_markers()):
            return
        from impl.targets import TARGET_NAMES, TARGETS

        names = metafunc.config.getoption("smv_targets") or list(TARGET_NAMES)
        metafunc.parametrize("target", [TARGETS[n] for n in names], ids=names)


def _changed_since(config, items) -> None:
    """``--changed-since REF``: deselect the test files the change did not touch, and say what was kept and why."""
    ref = config.getoption("smv_changed_since", default=None)
    if not ref:
        return
    from contracts.engine import changes

    try:
        files = changes.changed_files(changes.SUITE_ROOT, ref)
    except changes.ChangesError as exc:
        raise pytest.UsageError(f"--changed-since: {exc}") from None
    keep, why = changes.select_tests(files)
    config._smv_changed_since = (ref, files, keep, why)
    if keep is None:
        return
    keep = {str(changes.SUITE_ROOT / t) for t in keep}
    drop = [i for i in items if str(i.path) not in keep]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if str(i.path) in keep]


def pytest_report_collectionfinish(config, items):
    got = getattr(config, "_smv_changed_since", None)
    if not got:
        return None
    ref, files, keep, why = got
    kept = "every test file" if keep is None else (f"{len(keep)} test files" if keep else "no test file")
    return [f"smv: --changed-since {ref}: {len(files)} files changed; running {kept}"] + [f"  {w}" for w in why[:40]]


def pytest_sessionfinish(session, exitstatus):
    got = getattr(session.config, "_smv_changed_since", None)
    if got and got[2] == [] and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK  # nothing the tests cover changed: that is no failure


def pytest_collection_modifyitems(config, items):
    _changed_since(config, items)
    run_slow = config.getoption("run_slow")
    for item in items:
        for m in HARDWARE_MARKERS + ("slow",):
            if item.get_closest_marker(m) is None:
                continue
            runs, reason = marker_status(m, run_slow=run_slow)
            if not runs:
                item.add_marker(pytest.mark.skip(reason=f"[{m}] {reason}"))
                break


def repro_dir_for(config) -> str:
    """The absolute folder failing contract rows write their reproducers to (created on first use)."""
    chosen = config.getoption("smv_repro_dir", default=None)
    path = Path(chosen) if chosen else Path(config.rootpath) / DEFAULT_REPRO_DIR
    return str(path.resolve())


@pytest.fixture
def smv_repro_dir(request) -> str:
    """Pass as ``run_contract(..., repro_dir=smv_repro_dir)``: a failing row's case lands there, not in a tmp dir
    pytest deletes, so the ``smv repro`` line in the failure can be run after pytest exits."""
    return repro_dir_for(request.config)


def row_failure(row, limit: int = 10) -> str:
    """The failure message of a contract row that did not pass: status and reason, the first ``limit``
    violations, and the ``smv repro`` line when the row wrote a reproducer."""
    lines = [f"{row.contract} on {row.target}: {row.status}: {row.reason}"]
    lines += [f"  {v}" for v in row.violations[:limit]]
    if len(row.violations) > limit:
        lines.append(f"  ... {len(row.violations) - limit} more")
    if row.repro:
        lines.append(f"replay: smv repro {row.repro}")
    return "\n".join(lines)
