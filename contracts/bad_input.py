"""Refusal contract (``bad-input-refusal``): every public entry point refuses a malformed argument with a
``ValueError`` or ``TypeError`` naming it, before any kernel launch, leaving every buffer it was handed unchanged
(DESIGN "Conventions": bad input gets a clear error before any kernel launches). Cases: :mod:`fuzz.bad_input`."""
from __future__ import annotations

import contextlib
import re

import torch

from contracts.core import ALL_TARGETS, Violation, contract, record_note
from contracts.subjects import SubjectUnavailable, bound, is_ours
from fuzz import bad_input as fz
from fuzz.bad_input import BadInputCase
from impl.runtime import kernel_device
from impl.targets import Target

REFUSAL_MISSING = "a malformed argument was accepted"
REFUSAL_LAUNCHED = "a kernel was launched before the malformed argument was refused"
REFUSAL_WRONG_TYPE = "a malformed argument raised something other than ValueError or TypeError"
REFUSAL_UNNAMED = "the refusal does not name the argument"
REFUSAL_WROTE = "a refused call changed a buffer it was handed"
VALID_REFUSED = "the valid call (before the breakage) was refused"

UPSTREAM_SKIP = ("upstream's entry points leave argument checks to their callers (the model runner and the "
                 "metadata builders); the few checks they hold themselves are asserts (rocm_inverse_rope_rows_'s "
                 "shape and stride asserts, e.g.), which python -O strips, not the ValueError/TypeError refusal this "
                 "contract judges")


class KernelLaunched(BaseException):
    """Raised in place of a Triton launch while a check watches (a BaseException, so no ``except Exception`` in
    the code under test swallows it)."""

    def __init__(self, kernel: str):
        super().__init__(kernel)
        self.kernel = kernel


@contextlib.contextmanager
def launches_refused():
    """Every Triton launch in the block raises :class:`KernelLaunched` instead of running: under the interpreter
    (``InterpretedFunction.run``) and natively (``JITFunction.run``)."""
    from triton.runtime import jit

    classes = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # pragma: no cover - a Triton without the interpreter
        pass
    saved = [(cls, cls.__dict__.get("run")) for cls in classes]

    def refuse(self, *args, **kwargs):
        fn = getattr(self, "fn", None)
        raise KernelLaunched(getattr(fn, "__name__", None) or repr(self))

    try:
        for cls, _ in saved:
            cls.run = refuse
        yield
    finally:
        for cls, original in saved:
            if original is None:
                del cls.run
            else:
                cls.run = original


def _tensors(inputs: dict):
    """Every tensor the call is handed: the arguments, and the tensors an object argument holds (a builder's or
    a graph's persistent buffers, one level down, dicts of tensors included) as ``name.attribute``."""
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor):
            yield name, v
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            for attr, a in vars(v).items():
                items = a.items() if isinstance(a, dict) else [("", a)]
                for key, t in items:
                    if isinstance(t, torch.Tensor):
                        yield f"{name}.{attr}" + (f"[{key}]" if key else ""), t


def _snapshot(inputs: dict) -> dict:
    """A byte copy of the whole storage behind every tensor the call is handed (a view's pool included)."""
    out = {}
    for name, t in _tensors(inputs):
        if t.device.type != "meta":
            st = t.untyped_storage()
            out[name] = (t, torch.empty(0, dtype=torch.uint8, device=t.device).set_(st).cpu().clone())
    return out


def _changed(snap: dict) -> list[str]:
    return [name for name, (t, before) in snap.items()
            if not torch.equal(torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).cpu(),
                               before)]


def _call(fn, inputs: dict, target: Target, call=None):
    """Call ``fn`` (through the entry's ``call(fn, inputs)`` where it has one: an argument packed in a dataclass)
    with launches refused: ``("launched", kernel)``, ``("raised", exc)`` or ``("returned", None)``."""
    try:
        with launches_refused():
            if call is None:
                fn(**inputs, **_target_kw(fn, target))
            else:
                call(fn, dict(inputs))
    except KernelLaunched as exc:
        return "launched", exc.kernel
    except Exception as exc:  # noqa: BLE001 - what was raised is the verdict
        return "raised", exc
    return "returned", None


def _target_kw(fn, target: Target) -> dict:
    import inspect

    try:
        return {"target": target} if "target" in inspect.signature(fn).parameters else {}
    except (TypeError, ValueError):
        return {}


def _entry(target: Target, name: str):
    """``family.function`` or ``family.Class.method`` of the current subject (a method is called with ``self``
    among the keywords: the instance the entry's builder made)."""
    family, *path = name.split(".")
    fn = getattr(bound(target), family)
    for part in path:
        fn = getattr(fn, part)
    return fn


def _names(msg: str, names: tuple[str, ...]) -> bool:
    return any(re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", msg) for n in names)


def _cases(target: Target):
    return fz.bad_input_cases(target)


@contract("bad-input-refusal", targets=ALL_TARGETS, cases=_cases, examples=fz._examples, min_cases=20,
          case_type=BadInputCase)
def bad_input_refusal(case: BadInputCase, target: Target) -> list[Violation]:
    """An entry point handed one malformed argument - a fixed dimension one too small or one too large, a wrong
    dtype, a wrong device (``meta``), a non-contiguous view where contiguity is required, a slot / request / table
    entry / position / indptr just outside its valid range on a token that uses it, a count out of range (negative
    ``num_reqs``), an output sharing one element with an input - raises ``ValueError`` or
    ``TypeError`` whose message names the argument (or, for a size or id that must agree with another argument,
    that argument), before any Triton launch, and every tensor it was handed (an object argument's too: a builder's
    or a captured graph's buffers) is byte-for-byte unchanged. The same
    call before the breakage is accepted (it reaches its launch or returns), so a refusal is never of everything.
    Each case checks every argument x breakage of one entry point, starting from a valid call drawn by that entry's
    own generator (fuzz/bad_input.py). Source: DESIGN "Conventions" (bad input gets a clear error before any kernel
    launches); issue 30 item 2. Subject ``vllm``: skipped (upstream's entry points validate at their callers).
    """
    if not is_ours():
        raise SubjectUnavailable(UPSTREAM_SKIP)
    fn = _entry(target, case.entry)
    out: list[Violation] = []
    accepted: set = set()
    for arg, breakage in case.breakages():
        inner = fz.inner_of(case, arg, breakage, target)
        if inner is None:
            record_note(f"{case.entry}: no valid call drawn carries {arg}: {breakage}")
            continue
        out += _refusal(case, fn, inner, arg, breakage, target, accepted)
    return out


def _refusal(case: BadInputCase, fn, inner, arg: str, breakage: str, target: Target, accepted: set) -> list:
    """One breakage: the valid call accepted (once per valid call), the broken one refused cleanly."""
    entry = fz.ENTRIES[case.entry]
    call = entry.call
    dev = kernel_device()
    key = repr(inner)
    if key not in accepted:
        kind, got = _call(fn, fz.build_call(entry, inner, dev, target), target, call)
        if kind == "raised":
            return [Violation(VALID_REFUSED, f"{case.entry} before breaking {arg}", "a launch or a return",
                              f"{type(got).__name__}: {got}")]
        accepted.add(key)
    inputs = fz.build_call(entry, inner, dev, target)
    what = fz.break_inputs(case.entry, arg, breakage, case.seed, inputs, inner)
    snap = _snapshot(inputs)
    kind, got = _call(fn, inputs, target, call)
    where = f"{case.entry}: {what} ({breakage})"
    out: list[Violation] = []
    if kind == "launched":
        out.append(Violation(REFUSAL_LAUNCHED, where, "ValueError/TypeError before any launch", f"launch of {got}"))
    elif kind == "returned":
        out.append(Violation(REFUSAL_MISSING, where, "ValueError/TypeError", "returned"))
    elif not isinstance(got, (ValueError, TypeError)):
        out.append(Violation(REFUSAL_WRONG_TYPE, where, "ValueError/TypeError", f"{type(got).__name__}: {got}"))
    else:
        # a size or an id that must agree with another argument may be reported against that one
        spec = fz.ENTRIES[case.entry].args[arg]
        agrees = breakage.startswith("dim") or breakage in fz.ID_BREAKAGES
        overlap = (spec.overlaps,) if breakage in fz.OVERLAP_BREAKAGES else ()
        names = (arg,) + (spec.partners if agrees else ()) + overlap
        if not _names(str(got), names):
            out.append(Violation(REFUSAL_UNNAMED, where, " or ".join(names), f"{type(got).__name__}: {got}"))
    changed = _changed(snap)
    if changed:
        out.append(Violation(REFUSAL_WROTE, where, "every buffer unchanged", f"changed: {', '.join(changed)}"))
    return out
