"""The first half of every exported reproducer (``smv findings export``): the exporter copies this module's source
into ``repro.py`` above the finding's own part (``findings/export/<ID>.py``), so the script needs only torch,
Triton and the upstream module - never this suite. It imports nothing of the suite and stays importable on its
own (the tests exercise it directly).

What it gives the finding's part:

* :func:`load_upstream` imports one upstream module: from the installed vLLM, or from a tree (``--vllm-tree``, a
  checkout or an unpacked wheel: the folder holding ``vllm/``). From a tree, every other ``vllm.*`` module the
  module imports at load, and the third-party packages listed in ``THIRD_PARTY_STUBS``, are inert stand-ins built
  here (their names answer anything), except ``vllm.triton_utils``, which is the real Triton, and the small
  helpers in ``HELPERS`` (``cdiv``...), which behave as the real ones. Names the defect
  depends on (an architecture probe, a flag) are set explicitly by the finding's part through ``overrides``.
* :func:`call_upstream` calls an upstream function and returns what it returned, or a :class:`Raised` holding the
  exception it raised: an exception is an observed value, not a failure of the script.
* :func:`main` runs the finding's ``reproduce`` and turns its :class:`Verdict` into the exit code: 1 while the
  defect is present, 0 once fixed, 2 when the script cannot run (an import, a stand-in or the setup failed).
"""
import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import traceback
import types

EXIT_FIXED, EXIT_PRESENT, EXIT_CANNOT_RUN = 0, 1, 2
#: third-party packages upstream modules import at load for names the defects never touch
THIRD_PARTY_STUBS = ("transformers",)
#: set by the exporter: the tree the finding was exported against (None: the installed vllm)
DEFAULT_TREE = None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: small pure vLLM helpers that upstream code calls at run time: their stand-ins behave as the real ones (integer
#: ceiling division, rounding up to a multiple); a part's ``overrides`` still take precedence
HELPERS = {"vllm.utils.math_utils": {"cdiv": _cdiv, "round_up": lambda x, multiple: _cdiv(x, multiple) * multiple}}


class CannotRun(Exception):
    """The script cannot reach the defect here (no vLLM, a module that does not import, a missing name)."""


class Raised:
    """What an upstream call raised (an observed value)."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __repr__(self) -> str:
        return f"raised {type(self.exc).__name__}: {' '.join(str(self.exc).split())[:300]}"


class Verdict:
    """The finding's symptom, checked: ``present`` is True while upstream shows the defect."""

    def __init__(self, present: bool, observed, expected, note: str = ""):
        self.present, self.observed, self.expected, self.note = bool(present), observed, expected, note


def call_upstream(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - upstream's exception is the observed value
        return Raised(exc)


# --- inert stand-ins for what an upstream module imports at load ----------------------------------------------


class _Inert:
    """A name no defect depends on: any attribute, call, item or iteration answers another inert value; a call
    with one callable and nothing else returns that callable (a decorator); as a base class it is ``object``;
    false, so an unset feature flag reads as off."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Inert(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _Inert(f"{self._name}()")

    def __getitem__(self, key):
        return _Inert(f"{self._name}[...]")

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self) -> str:
        return f"<inert {self._name}>"


class _InertModule(types.ModuleType):
    def __init__(self, name: str):
        super().__init__(name)
        self.__path__ = []  # a package: its submodules import as stand-ins too

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Inert(f"{self.__name__}.{attr}")


class _Platform(_Inert):
    """``vllm.platforms.current_platform`` as a ROCm device of one architecture (what the defect's path asks)."""

    def __init__(self, arch: str):
        super().__init__(f"current_platform[{arch}]")
        object.__setattr__(self, "arch", arch)

    def is_rocm(self):
        return True

    def is_cuda(self):
        return False

    def is_fp8_fnuz(self):
        return self.arch == "gfx942"

    def fp8_dtype(self):
        import torch

        return torch.float8_e4m3fnuz if self.is_fp8_fnuz() else torch.float8_e4m3fn


def rocm_overrides(arch: str) -> dict:
    """``overrides`` for :func:`load_upstream` that make the module see a ROCm ``arch`` (gfx942, gfx950, or another
    name for an untuned one): the platform object and the architecture flags and probes of ``vllm.platforms.rocm``."""
    flags = {f"_ON_{a.upper()}": arch == a for a in ("gfx942", "gfx950")}
    flags.update({"_ON_GFX9": arch.startswith("gfx9"), "_ON_MI3XX": arch in ("gfx942", "gfx950")})
    probes = {f"on_{k[4:].lower()}": (lambda v=v: v) for k, v in flags.items()}
    return {"vllm.platforms": {"current_platform": _Platform(arch)}, "vllm.platforms.rocm": {**flags, **probes}}


def _triton_utils():
    import triton
    import triton.language as tl

    mod = types.ModuleType("vllm.triton_utils")
    mod.triton, mod.tl, mod.HAS_TRITON = triton, tl, True
    return mod


class _TreeFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``vllm.*`` (the module under test from the tree, the rest inert) and the third-party stubs."""

    def __init__(self, tree: str, real: set, overrides: dict):
        self.tree, self.real, self.overrides = tree, real, overrides

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top != "vllm" and top not in THIRD_PARTY_STUBS:
            return None
        if name in self.real:
            rel = name.replace(".", os.sep)
            file = os.path.join(self.tree, rel + ".py")
            if not os.path.isfile(file):
                file = os.path.join(self.tree, rel, "__init__.py")
            return importlib.util.spec_from_file_location(name, file)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        mod = _triton_utils() if spec.name == "vllm.triton_utils" else _InertModule(spec.name)
        for attr, value in {**HELPERS.get(spec.name, {}), **self.overrides.get(spec.name, {})}.items():
            setattr(mod, attr, value)
        return mod

    def exec_module(self, module):
        pass


def _dotted(module_path: str) -> str:
    return module_path[:-3].replace("/", ".") if module_path.endswith(".py") else module_path


def load_upstream(module_path: str, overrides: "dict | None" = None, also_real=()) -> types.ModuleType:
    """Import ``module_path`` (``vllm/.../x.py``) from the tree, or from the installed vLLM when no tree is given.
    ``overrides``: ``{module: {name: value}}`` set before the import (on the stand-in, or on the installed module).
    ``also_real``: other tree modules the defect depends on, imported from the tree rather than stood in."""
    overrides = overrides or {}
    name = _dotted(module_path)
    tree = ARGS.vllm_tree
    if not tree:
        try:
            for mod, attrs in overrides.items():
                m = importlib.import_module(mod)
                for attr, value in attrs.items():
                    setattr(m, attr, value)
            return importlib.import_module(name)
        except ImportError as exc:
            raise CannotRun(f"vLLM is not importable here ({exc}); pass --vllm-tree PATH (a checkout or an "
                            f"unpacked wheel: the folder that holds vllm/)") from None
    if not os.path.isfile(os.path.join(tree, module_path)):
        raise CannotRun(f"{tree} has no {module_path}")
    for key in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
        del sys.modules[key]
    sys.meta_path.insert(0, _TreeFinder(os.path.abspath(tree), {name, *map(_dotted, also_real)}, overrides))
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - a module that does not load here cannot show the defect
        raise CannotRun(f"{module_path} did not import from {tree}: {type(exc).__name__}: {exc}") from None


# --- the run ------------------------------------------------------------------------------------------------------


ARGS = argparse.Namespace(vllm_tree=None, interpret=False)


def _parse_args(argv, title: str):
    p = argparse.ArgumentParser(description=title)
    p.add_argument("--vllm-tree", default=os.environ.get("VLLM_TREE") or DEFAULT_TREE,
                   help="a vLLM checkout or unpacked wheel (the folder holding vllm/); default: the installed vllm")
    p.add_argument("--interpret", action="store_true",
                   help="run Triton kernels under Triton's interpreter (the default where torch sees no GPU)")
    return p.parse_args(argv)


def _device_setup(interpret: bool) -> str:
    """``cuda`` on a GPU (ROCm's torch answers to it too), else ``cpu`` with Triton's interpreter (set before Triton
    is imported, so the kernels are interpreted)."""
    import torch

    if interpret or not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
        return "cpu"
    return "cuda"


def main(reproduce, title: str, argv=None) -> int:
    global ARGS
    ARGS = _parse_args(argv, title)
    try:
        ARGS.device = _device_setup(ARGS.interpret)
        verdict = reproduce(ARGS)
    except CannotRun as exc:
        print(f"cannot run: {exc}")
        return EXIT_CANNOT_RUN
    except Exception:  # noqa: BLE001 - a failure of the script's own setup, not the defect
        print("cannot run: the script's setup failed:\n" + traceback.format_exc())
        return EXIT_CANNOT_RUN
    print(f"observed: {verdict.observed}")
    print(f"expected: {verdict.expected}")
    if verdict.note:
        print(verdict.note)
    print("the defect is present" if verdict.present else "the defect is not present (fixed)")
    return EXIT_PRESENT if verdict.present else EXIT_FIXED
