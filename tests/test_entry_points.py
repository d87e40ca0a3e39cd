"""Every public entry point of impl/ is under a contract (issue 13 item 8).

impl's public functions are its modules' module-level functions whose names do not start with ``_`` (plain ones and
``@triton.jit`` device helpers alike, each defined in that module, not imported into it), plus every function and
class a module's ``__all__`` lists (a class counts as exercised when any of its methods runs).

"Exercised" is measured, not declared: :func:`measure` runs every registered contract on every target under the
``ci`` profile (its pinned examples and one generated case) with a trace function installed, and records which
impl code objects ran under which contract. Under the Triton interpreter a ``@triton.jit`` function runs as Python
code compiled from impl's own source file, so device helpers are seen as well as host functions. What runs in
another process (no contract module's check starts one today) would not be seen. The record keeps the committed
contracts' rows only.

The measurement costs minutes, so it is ``slow`` (nightly, ``--run-slow``) and is kept in
``tests/entry_points.json``; the fast tests judge the current public functions against that record, the
allow-list and the known gaps below, and fail on a public function the record never saw run (a new entry
point without a contract, or one whose contract came after the record: re-measure with
``SMV_WRITE_ENTRY_POINTS=1 pytest --run-slow tests/test_entry_points.py -k measured``, or
``python tests/test_entry_points.py``).
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMPL_DIR = ROOT / "impl"
RECORD = Path(__file__).resolve().parent / "entry_points.json"
RECORD_SCHEMA_VERSION = 1
TARGETS = ("generic", "gfx942", "gfx950")

#: public functions that are not entry points, each with why no contract needs to reach it; every name here must
#: still be a public function of impl (a stale entry fails)
ALLOWED_UNEXERCISED: dict[str, str] = {
    "graph_capture.GraphReplayError": "an exception class with no code of its own (a trace sees no raise); "
                                      "graph-replay-agreement catches it (contracts/graph_capture.py)",
    "decode.decode_variant": "benchmark configuration, see decode.current_variant; tests/test_decode.py runs it",
    "decode.set_decode_variant": "benchmark configuration, see decode.current_variant; tests/test_decode.py runs it",
    "indexer_logits.logits_variant": "benchmark configuration (which LogitsVariant the paged logits kernel is built "
                                     "with), never what it computes; tests/test_bench.py runs it and the "
                                     "contracts judge a variant through SMV_LOGITS_VARIANT",
    "graph_capture.describe_launch_diff": "words GraphReplayError's message; runs only when a replay's launch differs "
                                          "from the capture's, which correct code never does",
    "runtime.configure_triton_mode": "runs once at `import impl` (impl/__init__.py), before any contract, and every "
                                     "kernel launch the contracts make depends on it",
    "interpreter_fastpath.install": "runs once at `import impl` under the interpreter (a speed-up of Triton's "
                                    "interpreter, not of what any kernel computes); tests/test_interpreter_fastpath.py",
    "interpreter_fastpath.fast_patch_lang": "built by install(); tests/test_interpreter_fastpath.py runs it",
    "interpreter_fastpath.installed": "says whether install() took effect; not an entry point",
    "targets.aiter_status": "asks the host whether AMD AITER is importable; the contracts state AITER's use "
                            "themselves (cache-key-staleness passes use_aiter=False, opus-routing-guard patches the "
                            "OPUS loader) instead of asking the host; tests/test_targets.py tests it",
    "targets.detect_target": "host detection for the CLI's default target; contracts judge every named target "
                             "explicitly; tests/test_targets.py and tests/test_hardware.py test it",
    "targets.env_override": "reads SMV_TARGET for host detection (see targets.detect_target); tests/test_targets.py",
    "targets.target_for_arch": "maps a detected gfx arch to a target for host detection (see "
                               "targets.detect_target); tests/test_targets.py",
}

#: public entry points that no contract runs today: real gaps, kept here so that the fast test stays green while it
#: says so, and fails as soon as one of them is reached (drop it from here then) or another joins them
KNOWN_GAPS: dict[str, str] = {
}


def public_functions() -> dict[str, object]:
    """``"module.name"`` -> object for every public function of ``impl/*.py`` (see the module docstring)."""
    import impl  # noqa: F401  (first: impl sets the Triton mode before triton is imported)
    from triton.runtime.jit import KernelInterface

    out: dict[str, object] = {}
    for info in sorted(pkgutil.iter_modules([str(IMPL_DIR)]), key=lambda i: i.name):
        mod = importlib.import_module(f"impl.{info.name}")
        # a @triton.jit function is a KernelInterface (JITFunction, or InterpretedFunction under the interpreter)
        names = {n for n, obj in vars(mod).items() if not n.startswith("_")
                 and (inspect.isfunction(obj) or isinstance(obj, KernelInterface))
                 and _defined_in(obj, mod)}
        # __all__'s functions and classes (a constant there, graph_capture.MODES, has no code to run)
        names |= {n for n in getattr(mod, "__all__", ()) if callable(getattr(mod, n))}
        for n in sorted(names):
            out[f"{info.name}.{n}"] = getattr(mod, n)
    return out


def _defined_in(obj, mod) -> bool:
    fn = getattr(obj, "fn", obj)  # a JITFunction wraps the Python function it was made from
    return getattr(fn, "__module__", None) == mod.__name__


def measure(contract_ids=None) -> dict:
    """Run every registered contract (or those named) on every target under the ``ci`` profile, pinned examples and
    one generated case, with a trace function that records each impl code object that runs; returns the record
    (``exercised``: ``"module.qualname"`` -> the contracts under which it ran, for module-level functions and the
    methods of classes)."""
    from contracts import registry
    from contracts.engine.runner import run_contract

    impl_prefix = str(IMPL_DIR) + os.sep
    hits: dict[tuple[str, str], set[str]] = {}
    current = [""]

    def trace(frame, event, arg):
        co = frame.f_code
        if co.co_filename.startswith(impl_prefix):
            hits.setdefault((Path(co.co_filename).stem, co.co_qualname), set()).add(current[0])
        return None  # no line events: calls only

    rows = []
    contracts = registry.load_all()
    for cid in sorted(contracts):
        if contract_ids and cid not in contract_ids:
            continue
        for t in TARGETS:
            current[0] = cid
            old = sys.gettrace()
            sys.settrace(trace)
            threading.settrace(trace)
            try:
                row = run_contract(contracts[cid], t, profile="ci", budget=60.0, max_examples=1)
                rows.append({"contract": cid, "target": t, "status": row.status})
            finally:
                sys.settrace(old)
                threading.settrace(None)
    exercised: dict[str, list[str]] = {}
    for (mod, qual), cids in hits.items():
        if "<locals>" in qual or qual.startswith("<"):
            continue
        exercised[f"{mod}.{qual}"] = sorted(cids)
    return {"schema_version": RECORD_SCHEMA_VERSION,
            "measured_with": "tests/test_entry_points.py::measure: every contract x every target, profile ci, "
                             "pinned examples + 1 generated case, sys.settrace call events",
            "rows": rows, "exercised": dict(sorted(exercised.items()))}


def contracts_reaching(name: str, exercised: dict[str, list[str]], obj) -> list[str]:
    """The contracts under which ``name`` ran (for a class: any of its methods)."""
    if inspect.isclass(obj):
        mod, cls = name.split(".", 1)
        return sorted({c for k, cs in exercised.items() if k.startswith(f"{mod}.{cls}.") for c in cs})
    return exercised.get(name, [])


def _load_record() -> dict:
    rec = json.loads(RECORD.read_text())
    assert rec["schema_version"] == RECORD_SCHEMA_VERSION
    return rec


def unexercised(record: dict) -> list[str]:
    pub = public_functions()
    return sorted(n for n, obj in pub.items()
                  if n not in ALLOWED_UNEXERCISED and not contracts_reaching(n, record["exercised"], obj))


def _gap_violations(missing: list[str]) -> list[str]:
    out = []
    new = sorted(set(missing) - set(KNOWN_GAPS))
    if new:
        out.append("public impl functions no contract runs (give each a contract, or allow-list it with its reason "
                   f"if it is not an entry point): {new}")
    closed = sorted(set(KNOWN_GAPS) - set(missing))
    if closed:
        out.append(f"known gaps a contract now reaches (or that are gone): drop them from KNOWN_GAPS: {closed}")
    return out


# --- fast: the current public functions against the recorded measurement ------------------------------------------

def test_every_public_entry_point_is_exercised_by_a_contract():
    problems = _gap_violations(unexercised(_load_record()))
    assert not problems, "; ".join(problems)


def test_the_allow_list_names_current_public_functions_that_no_contract_runs():
    pub = public_functions()
    rec = _load_record()
    stale = sorted(n for n in ALLOWED_UNEXERCISED if n not in pub)
    assert not stale, f"allow-listed names that are no public impl function: {stale}"
    reached = sorted(n for n in ALLOWED_UNEXERCISED if contracts_reaching(n, rec["exercised"], pub[n]))
    assert not reached, f"allow-listed names a contract does run (drop them from the allow-list): {reached}"
    assert all(why.strip() for why in ALLOWED_UNEXERCISED.values()) and all(w.strip() for w in KNOWN_GAPS.values())
    assert not set(ALLOWED_UNEXERCISED) & set(KNOWN_GAPS)


def test_the_record_is_a_measurement_of_every_target():
    # a contract added after the record cannot make a reached function unreached, so the fast tests do not ask for
    # a re-measurement then (the slow test measures every registered contract afresh)
    rec = _load_record()
    by_contract: dict[str, set] = {}
    for r in rec["rows"]:
        by_contract.setdefault(r["contract"], set()).add(r["target"])
    assert by_contract and all(ts == set(TARGETS) for ts in by_contract.values())
    assert {c for cs in rec["exercised"].values() for c in cs} <= set(by_contract)


def test_the_listing_sees_plain_functions_device_helpers_and_all():
    pub = public_functions()
    assert "decode.sparse_attn_decode" in pub and "prefill.sparse_attn_prefill" in pub
    assert "triton_helpers.fp8_encode_bits" in pub  # a @triton.jit device helper
    assert "graph_capture.DecodeGraph" in pub and "graph_capture.MODES" not in pub  # __all__'s callables
    assert not any(n.split(".", 1)[1].startswith("_") for n in pub)
    assert "decode.get_target" not in pub  # imported, not defined there


# --- slow: the measurement itself -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_measured_record_is_current():
    """Re-measure; the fresh measurement must reach every public function not allow-listed and must agree with the
    committed record on which functions are reached (``SMV_WRITE_ENTRY_POINTS=1`` rewrites the record instead)."""
    fresh = measure()
    if os.environ.get("SMV_WRITE_ENTRY_POINTS") == "1":
        RECORD.write_text(json.dumps(fresh, indent=1) + "\n")
    problems = _gap_violations(unexercised(fresh))
    assert not problems, "; ".join(problems)
    pub = public_functions()
    old = _load_record()
    differ = sorted(n for n, obj in pub.items()
                    if bool(contracts_reaching(n, fresh["exercised"], obj))
                    != bool(contracts_reaching(n, old["exercised"], obj)))
    assert not differ, f"the committed record is stale for {differ}: re-measure with SMV_WRITE_ENTRY_POINTS=1"


if __name__ == "__main__":  # SMV_WRITE_ENTRY_POINTS-free way to write the record: python tests/test_entry_points.py
    sys.path.insert(0, str(ROOT))
    RECORD.write_text(json.dumps(measure(), indent=1) + "\n")
