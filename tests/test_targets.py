"""Target model, detection, the SMV_TARGET override, AITER detection and `smv targets --json`."""
import json
import subprocess
import sys
import types

import pytest

from contracts.cli import smv as cli
from impl import runtime, targets
from impl.targets import GENERIC, GFX942, GFX950, TARGETS, Target


def test_architecture_differences_are_fields():
    assert (GFX942.main_cache_fp8, GFX950.main_cache_fp8, GENERIC.main_cache_fp8) == ("fnuz", "ocp", "ocp")
    assert {t.extra_cache_fp8 for t in TARGETS.values()} == {"ocp"}
    assert (GFX942.split_cap, GFX950.split_cap, GENERIC.split_cap) == (16, 32, None)
    assert (GFX942.cu_count, GFX950.cu_count) == (304, 256)
    assert [t.name for t in TARGETS.values() if t.sanitizes_writer] == ["gfx950"]
    assert (GFX950.writer_scale_code_cap, GFX942.writer_scale_code_cap, GENERIC.writer_scale_code_cap) == (254, 255, 255)
    assert (GFX942.ragged_view_rule, GFX950.ragged_view_rule, GENERIC.ragged_view_rule) == ("full", "source", "full")
    assert [t.name for t in TARGETS.values() if t.adaptive_splits_in_capture] == ["gfx950"]
    assert GENERIC.split_selector is None and GENERIC.decode_family == "generic"
    with pytest.raises(Exception):
        GFX950.split_cap = 16  # frozen


def test_get_target_errors():
    assert targets.get_target("gfx942") is GFX942
    assert targets.get_target(GFX950) is GFX950
    with pytest.raises(ValueError, match="unknown architecture 'gfx90a'.*gfx942, gfx950, generic"):
        targets.get_target("gfx90a")
    with pytest.raises(TypeError, match="expected a Target"):
        targets.get_target(942)


@pytest.mark.parametrize("arch,name", [("gfx942:sramecc+:xnack-", "gfx942"), ("gfx950", "gfx950"),
                                       ("gfx90a", "generic"), ("sm_90", "generic"), ("cpu", "generic")])
def test_target_for_arch(arch, name):
    assert targets.target_for_arch(arch).name == name


def test_detection_from_rocm_device_and_override(monkeypatch):
    monkeypatch.setattr(targets, "detect_device", lambda: runtime.DeviceInfo("rocm", "MI355X", "gfx950"))
    monkeypatch.delenv("SMV_TARGET", raising=False)
    assert targets.detect_target() is GFX950
    monkeypatch.setenv("SMV_TARGET", "gfx942")
    assert targets.detect_target() is GFX942
    monkeypatch.setenv("SMV_TARGET", "mi300")
    with pytest.raises(ValueError, match="SMV_TARGET='mi300' is not a known target"):
        targets.detect_target()


def test_cu_count_pinned_unless_real_hardware(monkeypatch):
    monkeypatch.setattr(targets, "detect_device", lambda: runtime.DeviceInfo("cpu", "cpu", "cpu"))
    assert targets.effective_cu_count(GFX942) == 304
    assert targets.effective_cu_count(GFX950) == 256


def _fake_module(monkeypatch, with_ops: bool):
    mod = types.ModuleType("aiter")
    mod.__spec__ = types.SimpleNamespace(name="aiter")
    if with_ops:
        mod.ops = types.ModuleType("aiter.ops")
        monkeypatch.setitem(sys.modules, "aiter.ops", mod.ops)
    monkeypatch.setitem(sys.modules, "aiter", mod)
    monkeypatch.setattr(targets.importlib.util, "find_spec",
                        lambda name: object() if name == "aiter" or (with_ops and name == "aiter.ops") else None)


def test_aiter_detection_rejects_pypi_aiter(monkeypatch):
    _fake_module(monkeypatch, with_ops=False)
    st = targets.aiter_status()
    assert not st.importable and "not AMD AITER" in st.reason


def test_aiter_detection_accepts_amd_aiter(monkeypatch):
    _fake_module(monkeypatch, with_ops=True)
    st = targets.aiter_status()
    assert st.importable and "aiter.ops" in st.reason


def test_aiter_absent_here():
    st = targets.aiter_status()
    assert not st.importable and st.reason


def test_targets_json_shape():
    out = subprocess.run([sys.executable, "-m", "contracts.cli", "targets", "--json"], capture_output=True,
                         text=True, check=True).stdout
    doc = json.loads(out)
    assert set(doc) >= {"schema_version", "device", "triton_mode", "targets", "aiter", "markers"}
    assert set(doc["device"]) == {"kind", "name", "arch"}
    assert doc["targets"] == ["gfx942", "gfx950", "generic"]
    assert set(doc["aiter"]) == {"importable", "reason"}
    assert set(doc["markers"]) == {"gpu", "cuda", "rocm", "gfx942", "gfx950", "slow"}
    for st in doc["markers"].values():
        assert isinstance(st["runs"], bool) and st["reason"]
    if runtime.detect_device().kind == "cpu":
        assert doc["triton_mode"] == "interpreter" and doc["device"]["kind"] == "cpu"
        assert doc["markers"]["gpu"]["runs"] is False


def test_targets_text_output(capsys):
    assert cli.main(["targets"]) == 0
    out = capsys.readouterr().out
    assert "gfx942" in out and "fnuz" in out and "markers:" in out


def test_bad_smv_target_is_rejected_without_a_device(monkeypatch):
    monkeypatch.setenv("SMV_TARGET", "gfx999")
    monkeypatch.setattr(targets, "detect_device", lambda: pytest.fail("env_override must not need the device"))
    with pytest.raises(ValueError, match="SMV_TARGET='gfx999' is not a known target; expected one of gfx942, "
                                         "gfx950, generic"):
        targets.env_override()
    monkeypatch.setenv("SMV_TARGET", "")
    assert targets.env_override() is None
    monkeypatch.setenv("SMV_TARGET", "gfx950")
    assert targets.env_override() is GFX950


# --- the Triton-mode trap: each scenario in a fresh interpreter, since the mode is decided once per process ------

_ON_CPU = runtime.detect_device().kind == "cpu"
_cpu_only = pytest.mark.skipif(not _ON_CPU, reason="the trap exists only where no GPU is visible")


def _python(code: str, **env_changes):
    import os

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-W", "always::RuntimeWarning", "-c", code], capture_output=True,
                          text=True, env=env, timeout=300)


@_cpu_only
def test_triton_imported_first_still_runs_our_kernels_and_says_why():
    r = _python("import triton\nimport impl, torch\nfrom impl.runtime import triton_mode\n"
                "from impl.codec_kernels import fp8_decode_triton\n"
                "print(triton_mode(), fp8_decode_triton(torch.tensor([0, 56], dtype=torch.uint8), 'ocp').tolist())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["interpreter", "[0.0,", "1.0]"]
    assert "TritonModeWarning: triton was imported before impl" in r.stderr
    assert "import impl before triton, or set TRITON_INTERPRET=1" in r.stderr


@_cpu_only
def test_triton_that_froze_its_mode_is_explained_at_import_and_at_the_device_check():
    # a Triton whose knobs say "native" whatever the environment says
    r = _python("import sys, types, torch\n"
                "fake = types.ModuleType('triton')\n"
                "fake.knobs = types.SimpleNamespace(runtime=types.SimpleNamespace(interpret=False))\n"
                "sys.modules['triton'] = fake\n"
                "import impl\nfrom impl.runtime import triton_mode\nprint(triton_mode())\n"
                "from impl.validation import require_kernel_device\nrequire_kernel_device('q', torch.zeros(2))")
    assert r.stdout.strip() == "native"
    assert "TritonModeWarning: triton was imported before impl and fixed its mode at import" in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: q: kernels run on 'cuda' here, got a tensor on cpu (Triton runs natively "
                           "but no GPU is visible: triton was imported before impl")
    assert "set TRITON_INTERPRET=1 before starting Python" in last


@_cpu_only
def test_explicit_native_mode_on_a_cpu_names_the_variable_in_the_device_error():
    r = _python("import impl, torch\nfrom impl.validation import require_kernel_device\n"
                "require_kernel_device('q', torch.zeros(2))", TRITON_INTERPRET="0")
    assert "TritonModeWarning" not in r.stderr
    assert "no GPU is visible: TRITON_INTERPRET='0' is set" in r.stderr.strip().splitlines()[-1]


def test_interpreter_spellings_match_tritons_own():
    for value, mode in (("1", "interpreter"), ("true", "interpreter"), ("ON", "interpreter"), ("0", "native"),
                        ("", "native"), ("off", "native")):
        r = _python("import impl\nfrom impl.runtime import triton_mode\nprint(triton_mode())", TRITON_INTERPRET=value)
        assert r.stdout.strip() == mode, (value, r.stderr)
