"""Loads upstream vLLM's audited modules from a source tree, one fresh import per emulated architecture.

The tree is a vLLM checkout, an installed vLLM, or the modules extracted from a release wheel
(:func:`fetch_tree`). Exactly the modules in :data:`NEEDED` are imported from it; every other ``vllm.*`` module is a
stand-in (:mod:`.standins`). Arch flags, fp8 dtypes and default arguments bind when a module is imported, so each
target gets its own import: :meth:`Tree.load` returns a :class:`Loaded`, whose :meth:`~Loaded.active` context puts
that target's modules into ``sys.modules`` (upstream imports lazily inside functions) and restores the previous
ones after. Upstream's source is read as it is; the only changes are the named :class:`Rewrite` s, each applied
only where it is needed, and each listed in the report.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import threading
import types
from dataclasses import dataclass, field

from contracts.subjects import SubjectSpecError
from contracts.subjects.vllm import standins

#: the audited modules, as paths relative to the tree's root (SPEC section 9)
NEEDED: tuple[str, ...] = (
    "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
    "vllm/models/deepseek_v4/amd/rocm.py",
    "vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py",
    "vllm/models/deepseek_v4/common/ops/fused_indexer_q.py",
    "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py",
    "vllm/model_executor/models/deepseek_v2.py",
)
#: third-party packages the audited modules import at top level for types they never use on the audited paths;
#: inert when not installed (only ``transformers``' config classes, in deepseek_v2)
THIRD_PARTY_STANDINS = ("transformers",)
#: the one module a tree must hold to be a vLLM tree this suite can audit
MARKER = NEEDED[0]


def module_name(path: str) -> str:
    return path[:-3].replace("/", ".")


@dataclass(frozen=True)
class Rewrite:
    """A minimal, named change to upstream source: exact text ``find`` -> ``replace`` in ``path``; ``when`` says
    where it applies ("interpreter", "native" or "always"); ``why`` is shown in the report."""

    id: str
    path: str
    find: str
    replace: str
    why: str
    when: str = "always"
    regex: bool = False

    def apply(self, source: str) -> tuple[str, int]:
        if self.regex:
            return re.subn(self.find, self.replace, source)
        n = source.count(self.find)
        return source.replace(self.find, self.replace), n


#: rewrites registered by the adapters and the fidelity layer (``register_rewrite``)
REWRITES: list[Rewrite] = []


def register_rewrite(rw: Rewrite) -> Rewrite:
    if all(r.id != rw.id for r in REWRITES):
        REWRITES.append(rw)
    return rw


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the ``vllm`` namespace while one target's modules load (see the module docstring)."""

    def __init__(self, root: str, standin_mods: dict, rewrites: list[Rewrite], applied: list):
        self.root = root
        self.standins = standin_mods
        self.rewrites = rewrites
        self.applied = applied
        self.needed = {module_name(p): p for p in NEEDED if os.path.exists(os.path.join(root, p))}
        self.packages = set()
        for name in self.needed:
            parts = name.split(".")
            for i in range(1, len(parts)):
                self.packages.add(".".join(parts[:i]))

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top in THIRD_PARTY_STANDINS and (fullname in sys.modules or importlib.machinery.PathFinder.find_spec(
                top) is not None):
            return None
        if not (top == "vllm" or top in THIRD_PARTY_STANDINS):
            return None
        real = fullname in self.needed
        origin = os.path.join(self.root, self.needed[fullname]) if real else None
        # every stand-in and inert module may have submodules imported from it
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=origin, is_package=not real)
        if not real:
            spec.submodule_search_locations = (
                [os.path.join(self.root, *fullname.split("."))] if fullname in self.packages else [])
        return spec

    def create_module(self, spec):
        name = spec.name
        if name in self.standins:
            return self.standins[name]
        if name in self.needed:
            return None  # a plain module, executed from the tree's source below
        m = standins.InertModule(name)
        m.__path__ = list(spec.submodule_search_locations or [])
        return m

    def exec_module(self, module):
        name = module.__name__
        if name not in self.needed or name in self.standins:
            return
        rel = self.needed[name]
        path = os.path.join(self.root, rel)
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
        for rw in self.rewrites:
            if rw.path != rel:
                continue
            source, n = rw.apply(source)
            if n == 0:
                raise SubjectSpecError(f"{path}: rewrite {rw.id} no longer matches upstream's source "
                                       f"(expected {rw.find!r}); this version needs a new adapter")
            self.applied.append({"id": rw.id, "file": rel, "count": n, "why": rw.why})
        module.__file__ = path
        code = compile(source, path, "exec")
        exec(code, module.__dict__)


@dataclass
class Loaded:
    """One target's fresh import of the audited modules."""

    arch: str
    modules: dict  # vllm.* name -> module (stand-ins and inert ones included)
    rewrites: list = field(default_factory=list)

    def __getitem__(self, short: str):
        """``loaded["ops"]`` etc.: the audited modules by short name (see :data:`SHORT`)."""
        return self.modules[SHORT[short]]

    @contextlib.contextmanager
    def active(self):
        """Put this target's ``vllm.*`` modules into ``sys.modules`` while upstream code runs (it imports lazily
        inside functions), then restore what was there."""
        with _ACTIVE_LOCK:
            saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
            for k in saved:
                del sys.modules[k]
            sys.modules.update(self.modules)
            try:
                yield self
            finally:
                for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
                    mod = sys.modules.pop(k)
                    if k not in self.modules:  # imported lazily by upstream code during the call: keep it
                        self.modules[k] = mod
                sys.modules.update(saved)


_ACTIVE_LOCK = threading.RLock()

SHORT = {
    "ops": "vllm.v1.attention.ops.rocm_aiter_mla_sparse",
    "rocm": "vllm.models.deepseek_v4.amd.rocm",
    "compress": "vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache",
    "builder": "vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse",
    "deepseek_v2": "vllm.model_executor.models.deepseek_v2",
}


@dataclass
class Tree:
    """A vLLM source tree holding (at least) the audited modules."""

    root: str
    version: str
    source: str
    wheel_sha256: str | None = None

    def module_hashes(self) -> dict:
        return {p: _sha256(os.path.join(self.root, p)) for p in NEEDED if os.path.exists(os.path.join(self.root, p))}

    def load(self, arch: str, fp8_dtype, cu_count: int, *, rewrites: list[Rewrite] | None = None,
             extra_standins: dict | None = None) -> Loaded:
        """Import the audited modules afresh for one architecture."""
        mods = standins.build(arch, fp8_dtype, cu_count)
        for name, attrs in (extra_standins or {}).items():
            m = mods.get(name) or standins.InertModule(name)
            m.__dict__.update(attrs)
            mods[name] = m
        applied: list = []
        finder = _Finder(self.root, mods, list(REWRITES if rewrites is None else rewrites), applied)
        with _ACTIVE_LOCK:
            saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
            for k in saved:
                del sys.modules[k]
            third = {k for k in sys.modules if k.split(".")[0] in THIRD_PARTY_STANDINS}
            sys.meta_path.insert(0, finder)
            standins.IMPORTING.set(True)
            try:
                for name in finder.needed:
                    importlib.import_module(name)
                loaded = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
            finally:
                standins.IMPORTING.set(False)
                sys.meta_path.remove(finder)
                for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
                    del sys.modules[k]
                for k in [k for k in sys.modules if k.split(".")[0] in THIRD_PARTY_STANDINS and k not in third]:
                    del sys.modules[k]
                sys.modules.update(saved)
        return Loaded(arch, loaded, applied)


# --- finding a tree --------------------------------------------------------------------------------------------------

def cache_dir() -> str:
    return os.environ.get("SMV_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sparse-mla-verify")


_META = "smv-subject.json"


def _version_of(root: str) -> str:
    meta = os.path.join(root, _META)
    if os.path.exists(meta):
        with open(meta) as fh:
            return json.load(fh).get("version", "unknown")
    vf = os.path.join(root, "vllm", "_version.py")
    if os.path.exists(vf):
        with open(vf) as fh:
            m = re.search(r"""(?:__version__|version)\s*(?::\s*str)?\s*=\s*['"]([^'"]+)['"]""", fh.read())
        if m:
            return m.group(1)
    return "unknown"


def tree_at(path: str) -> Tree:
    """``vllm@PATH``: a checkout (or a tree from :func:`fetch_tree`) whose ``vllm/`` holds the audited modules."""
    root = os.path.abspath(os.path.expanduser(path))
    if os.path.basename(root) == "vllm" and os.path.exists(os.path.join(os.path.dirname(root), MARKER)):
        root = os.path.dirname(root)
    if not os.path.isdir(root):
        raise SubjectSpecError(f"vllm@{path}: no such directory")
    if not os.path.exists(os.path.join(root, MARKER)):
        raise SubjectSpecError(f"vllm@{path}: not a vLLM tree with the sparse-MLA ROCm modules (no {MARKER})")
    sha = None
    meta = os.path.join(root, _META)
    if os.path.exists(meta):
        with open(meta) as fh:
            sha = json.load(fh).get("wheel_sha256")
    return Tree(root, _version_of(root), root, sha)


def installed_tree() -> Tree:
    """``vllm``: the installed package, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SubjectSpecError("subject vllm: vLLM is not installed in this environment "
                               "(use vllm==VERSION to download a release, or vllm@PATH for a checkout)")
    root = os.path.dirname(list(spec.submodule_search_locations)[0])
    if not os.path.exists(os.path.join(root, MARKER)):
        raise SubjectSpecError(f"subject vllm: the installed vLLM at {root} has no {MARKER}")
    try:
        from importlib.metadata import version

        v = version("vllm")
    except Exception:  # noqa: BLE001
        v = _version_of(root)
    return Tree(root, v, f"installed: {root}")


_VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")


def fetch_tree(version: str, to: str | None = None, *, quiet: bool = True) -> Tree:
    """``vllm==X``: download the release wheel once (``pip download --no-deps``), extract only the audited
    modules into ``to`` (default: the user cache) with a ``smv-subject.json`` naming the wheel and its sha256."""
    import subprocess
    import tempfile
    import zipfile

    if not _VERSION_RE.match(version):
        raise SubjectSpecError(f"vllm=={version}: not a version number")
    dest = os.path.abspath(to) if to else os.path.join(cache_dir(), f"vllm-{version}")
    if os.path.exists(os.path.join(dest, _META)) and os.path.exists(os.path.join(dest, MARKER)):
        return tree_at(dest)
    with tempfile.TemporaryDirectory(prefix="smv-wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "-q", f"vllm=={version}", "-d", tmp]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SubjectSpecError(f"vllm=={version}: could not run pip download ({exc})") from None
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if proc.returncode != 0 or not wheels:
            err = (proc.stderr or proc.stdout).strip().splitlines()
            last = next((line for line in reversed(err) if line.startswith("ERROR")), err[-1] if err else "")
            if "No matching distribution" in (proc.stderr or "") or "from versions" in (proc.stderr or ""):
                why = "no such release on the package index"
            elif any(s in (proc.stderr or "") for s in ("NewConnectionError", "Failed to establish", "Temporary failure",
                                                         "Network is unreachable", "ProxyError", "ConnectionError")):
                why = "the package index cannot be reached (no network?)"
            else:
                why = last or f"pip exited {proc.returncode}"
            raise SubjectSpecError(f"vllm=={version}: download failed: {why}")
        wheel = os.path.join(tmp, wheels[0])
        sha = _sha256(wheel)
        part = dest + ".part"
        if os.path.exists(part):
            import shutil

            shutil.rmtree(part)
        os.makedirs(part)
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            missing = [p for p in NEEDED if p not in names]
            if MARKER in missing:
                raise SubjectSpecError(f"vllm=={version}: the wheel has no {MARKER} (a release before the "
                                       f"sparse-MLA ROCm path?)")
            for p in NEEDED:
                if p in names:
                    zf.extract(p, part)
        with open(os.path.join(part, _META), "w") as fh:
            json.dump({"name": "vllm", "version": version, "wheel": wheels[0], "wheel_sha256": sha,
                       "modules": [p for p in NEEDED if p in names]}, fh, indent=1)
        if os.path.exists(dest):
            import shutil

            shutil.rmtree(dest)
        os.replace(part, dest)
    return tree_at(dest)
