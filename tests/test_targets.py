"""Target model, detection, the SMV_TARGET override, AITER detection and `smv targets --json`."""
import json
import subprocess
import sys
import types

import pytest

from contracts import cli
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
