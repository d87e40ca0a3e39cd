"""Loads upstream vLLM's audited modules from a source tree, one fresh import per emulated architecture.

The tree is a vLLM checkout, an installed vLLM, or the modules extracted from a release wheel
(:func:`fetch_tree`). Exactly the modules in :data:`NEEDED` are imported from it (a model variant's own, in
:data:`VARIANTS`, only for a subject of that variant); every other ``vllm.*`` module is a stand-in
(:mod:`.standins`). Arch flags, fp8 dtypes and default arguments bind when a module is imported, so each target
gets its own import: :meth:`Tree.load` returns a :class:`Loaded`, whose :meth:`~Loaded.active` context puts
that target's modules into ``sys.modules`` (upstream imports lazily inside functions) and restores the previous
ones after. Upstream's source is read as it is; the only changes are the named :class:`Rewrite` s, each applied
only where it is needed, and each listed in the report.

Isolation. While the loader imports and while a :class:`Loaded` is active, a finder placed first on
``sys.meta_path`` answers every ``vllm.*`` import, so neither an installed vLLM nor any other module of the tree's
``vllm/`` directory (a checkout holds all of them) is ever executed. ``transformers`` (imported by
``deepseek_v2`` for two config classes used as annotations) is always inert during the import, installed or not.
``aiter`` is never imported from the environment: PyPI's ``aiter`` is an unrelated package and AMD's would make
the audit depend on the host; an import of it raises :class:`ModuleNotFoundError`, as on a host without AITER.
The adapters that need AITER put in-memory fakes (modules without a ``__file__``) into ``sys.modules`` for the
call; those are seen, a file-backed ``aiter`` already imported in the process is hidden while upstream code runs.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import linecache
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field

from contracts.subjects.base import EntryMissing, SubjectSpecError
from contracts.subjects.vllm import standins

#: the audited modules, as paths relative to the tree's root (SPEC section 9)
NEEDED: tuple[str, ...] = (
    "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
    "vllm/models/deepseek_v4/amd/rocm.py",
    "vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py",
    "vllm/models/deepseek_v4/common/ops/fused_indexer_q.py",
    "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py",
    "vllm/model_executor/models/deepseek_v2.py",
    "vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py",
    "vllm/v1/attention/backends/mla/sparse_swa.py",
    # model variant deepseek_v41 (:data:`VARIANTS`): extracted and recorded with the rest, imported only for it
    "vllm/models/deepseek_v41/amd/rocm.py",
    "vllm/models/deepseek_v41/amd/ops/__init__.py",
    "vllm/models/deepseek_v41/amd/ops/topk_pack.py",
)
#: third-party packages the audited modules import at top level for names they never use on the audited paths;
#: always inert during the import (only ``transformers``' config classes, in deepseek_v2)
THIRD_PARTY_STANDINS = ("transformers",)
#: packages upstream code may import that are never taken from the environment (see the module docstring)
BLOCKED = ("aiter",)
#: the one module a tree must hold to be a vLLM tree this suite can audit
MARKER = NEEDED[0]


def module_name(path: str) -> str:
    name = path[:-3].replace("/", ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def module_path(name: str) -> str:
    """The path of the audited module ``name`` (a package's ``__init__.py``), relative to the tree's root."""
    return next((p for p in NEEDED if module_name(p) == name), name.replace(".", "/") + ".py")


def _top(name: str) -> str:
    return name.partition(".")[0]


@dataclass(frozen=True)
class Rewrite:
    """A minimal, named change to upstream source: exact text ``find`` -> ``replace`` in ``path``; ``when`` says
    where it applies ("interpreter", "native" or "always"); ``why`` is shown in the report. A rewrite that finds
    nothing is an error (:class:`SubjectSpecError` naming it): upstream changed and the adapter needs a look."""

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
    """Serves the ``vllm`` namespace (see the module docstring). ``importing`` is True while a target's modules
    are imported (the audited modules run from the tree, ``transformers`` is inert); False while a
    :class:`Loaded` is active (a module upstream imports lazily is a stand-in or an inert module)."""

    def __init__(self, root: str, standin_mods: dict, rewrites: list[Rewrite], applied: list, *,
                 importing: bool = True, paths: tuple = NEEDED):
        self.root = root
        self.standins = standin_mods
        self.rewrites = rewrites
        self.applied = applied
        self.importing = importing
        self.needed = ({module_name(p): p for p in paths if os.path.exists(os.path.join(root, p))}
                       if importing else {})

    def find_spec(self, fullname, path=None, target=None):
        top = _top(fullname)
        if top in BLOCKED:
            if top in sys.modules:
                return None  # an adapter's in-memory fake is in place: its own submodules resolve as it says
            raise ModuleNotFoundError(f"No module named {top!r} (the audit never imports {top} from the "
                                      f"environment)", name=fullname)
        if not (top == "vllm" or (self.importing and top in THIRD_PARTY_STANDINS)):
            return None
        real = fullname in self.needed
        origin = os.path.join(self.root, self.needed[fullname]) if real else None
        # a stand-in or inert module may have submodules imported from it, which this finder serves as well
        package = not real or self.needed[fullname].endswith("/__init__.py")
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=origin, is_package=package)
        if not real:
            spec.submodule_search_locations = []
        return spec

    def create_module(self, spec):
        name = spec.name
        if name in self.standins:
            return self.standins[name]
        if name in self.needed:
            return None  # a plain module, executed from the tree's source below
        m = standins.InertModule(name)
        m.__path__ = []
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
                raise SubjectSpecError(f"rewrite {rw.id} no longer matches {rel} in {self.root} (it looks for "
                                       f"{_short(rw.find)}): upstream changed there; the adapter needs updating")
            self.applied.append({"id": rw.id, "file": rel, "count": n, "why": rw.why})
        module.__file__ = path
        filename = path
        if any(a["file"] == rel for a in self.applied):
            # Triton reads a kernel's source back through inspect/linecache by its code's file name: a rewritten
            # module compiled under the original path would have its kernels built from the unrewritten file.
            # The rewritten text gets a name of its own, registered in linecache (mtime None: never re-read).
            digest = hashlib.sha256(source.encode()).hexdigest()[:12]
            filename = f"{path}#smv-rewritten-{digest}"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), module.__dict__)


def _short(text: str, n: int = 60) -> str:
    first = text.strip().splitlines()[0] if text.strip() else text
    return repr(first if len(first) <= n else first[:n] + "...")


#: one import or one active target at a time in this process: both swap ``sys.modules`` entries
_ACTIVE_LOCK = threading.RLock()


def _is_vllm(name: str) -> bool:
    return _top(name) == "vllm"


def _hidden_third_party(name: str, mod) -> bool:
    """Environment modules kept out of upstream's reach while it runs: a file-backed (installed) ``aiter``."""
    return _top(name) in BLOCKED and getattr(mod, "__file__", None) is not None


@contextlib.contextmanager
def _swapped(modules: dict, finder: _Finder, hide=lambda name, mod: False):
    """``sys.modules``' ``vllm.*`` entries replaced by ``modules`` (and ``hide``'s picks removed), ``finder``
    first on ``sys.meta_path``; on exit (also on an exception) both are exactly as they were. Yields the dict of
    ``vllm.*`` modules present at the end of the block."""
    saved = {k: v for k, v in sys.modules.items() if _is_vllm(k) or hide(k, v)}
    for k in saved:
        del sys.modules[k]
    sys.modules.update(modules)
    sys.meta_path.insert(0, finder)
    out: dict = {}
    try:
        yield out
    finally:
        try:
            sys.meta_path.remove(finder)
        except ValueError:  # pragma: no cover - someone removed it
            pass
        for k in [k for k in sys.modules if _is_vllm(k)]:
            out[k] = sys.modules.pop(k)
        sys.modules.update(saved)


@dataclass
class Loaded:
    """One target's fresh import of the audited modules."""

    arch: str
    modules: dict  # vllm.* name -> module (stand-ins and inert ones included)
    rewrites: list = field(default_factory=list)
    root: str = ""
    #: the audited modules executed from the tree's source (the others in :data:`NEEDED` are missing from it)
    present: frozenset = frozenset()
    #: a missing audited module's path -> why it is missing (:meth:`Tree.lacking`)
    lacking: dict = field(default_factory=dict)
    #: every name a stand-in served, at import and in the calls since: ``{(module, name): what it answered}``
    served: dict = field(default_factory=dict)
    #: short name -> module name: :data:`SHORT`, or a model variant's map over it (:data:`VARIANTS`)
    short: dict = field(default_factory=lambda: dict(SHORT))

    def __getitem__(self, short: str):
        """``loaded["ops"]`` etc.: the audited modules by short name (see :data:`SHORT`; a model variant maps some
        of them to its own modules). A module this tree does not have is :class:`EntryMissing` naming it and
        saying why (a skipped row), also where another audited module imports it (it is then an inert stand-in in
        :attr:`modules`, never upstream's code)."""
        name = self.short[short]
        if name in self.modules and (name in self.present or not self.present):
            return self.modules[name]
        path = module_path(name)
        raise EntryMissing(path, self.lacking.get(path, "this vLLM tree does not have that module"))

    def path_of(self, short: str) -> str:
        """The path (relative to the tree's root) of the module the short name stands for here."""
        return module_path(self.short[short])

    @contextlib.contextmanager
    def active(self):
        """Put this target's ``vllm.*`` modules into ``sys.modules`` while upstream code runs (it imports lazily
        inside functions), then restore exactly what was there, also when the block raises. A ``vllm.*`` module
        imported for the first time inside the block is a stand-in (never the installed vLLM's, never the tree's
        own file) and is kept for this target's next call."""
        finder = _Finder(self.root, self.modules, [], [], importing=False)
        with _ACTIVE_LOCK:
            after: dict = {}
            try:
                with standins.serving(self.served), _swapped(self.modules, finder, _hidden_third_party) as after:
                    yield self
            finally:
                for k, mod in after.items():  # only what this finder served; an adapter's fakes are its own
                    if k not in self.modules and getattr(getattr(mod, "__spec__", None), "loader", None) is finder:
                        self.modules[k] = mod


SHORT = {
    "ops": "vllm.v1.attention.ops.rocm_aiter_mla_sparse",
    "rocm": "vllm.models.deepseek_v4.amd.rocm",
    "compress": "vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache",
    "grouped_topk": "vllm.model_executor.layers.fused_moe.router.grouped_topk_router",
    "indexer_q": "vllm.models.deepseek_v4.common.ops.fused_indexer_q",
    "builder": "vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse",
    "deepseek_v2": "vllm.model_executor.models.deepseek_v2",
    "swa": "vllm.v1.attention.backends.mla.sparse_swa",
}


@dataclass(frozen=True)
class Variant:
    """A model variant of the vllm subject (``vllm==X#NAME``): another model's copy of an audited module, audited
    by the same adapters. ``modules`` (paths, all in :data:`NEEDED`) are imported only for a subject of this
    variant, after the plain subject's; ``short`` maps short names to the variant's modules over :data:`SHORT`.
    ``counterparts``: a symbol the adapters need that the variant has under another name, and why that one is not
    taken for it (shown in the row's skip reason)."""

    name: str
    modules: tuple
    short: dict
    counterparts: dict = field(default_factory=dict)


#: the model variants a spec may name after ``#``
VARIANTS: dict = {
    "deepseek_v41": Variant(
        "deepseek_v41",
        ("vllm/models/deepseek_v41/amd/ops/__init__.py", "vllm/models/deepseek_v41/amd/ops/topk_pack.py",
         "vllm/models/deepseek_v41/amd/rocm.py"),
        {"rocm": "vllm.models.deepseek_v41.amd.rocm"},
        counterparts={
            "DeepseekV4ROCMAiterMLAAttention": (
                "its DeepseekV41ROCMAiterMLAAttention is not taken for it: same method names, but its forward_mqa "
                "reads other layer attributes and metadata keys (compressed_cache_prefix, compress ratio 0 for "
                "SWA-only, one _use_aiter_sparse_mla flag) and hands _forward_decode no adaptive_splits"),
            "DeepseekV4ROCMAiterMLASparseMetadataBuilder": (
                "its DeepseekV41ROCMAiterMLASparseMetadataBuilder is not taken for it: it does not override "
                "build_for_cudagraph_capture"),
        }),
}
#: the modules only a model variant imports
VARIANT_MODULES: frozenset = frozenset(p for v in VARIANTS.values() for p in v.modules)


def variant_paths(variant: str | None) -> tuple:
    """The modules a subject imports: :data:`NEEDED` less every variant's, then ``variant``'s own."""
    base = tuple(p for p in NEEDED if p not in VARIANT_MODULES)
    return base + (VARIANTS[variant].modules if variant else ())


@dataclass
class Tree:
    """A vLLM source tree holding (at least) the audited modules. ``wheel_sha256`` is set for a tree extracted
    from a release wheel; ``modified`` lists the modules whose content differs from what that wheel held."""

    root: str
    version: str
    source: str
    wheel_sha256: str | None = None
    modified: tuple = ()

    def module_hashes(self) -> dict:
        return {p: _sha256(os.path.join(self.root, p)) for p in NEEDED if os.path.exists(os.path.join(self.root, p))}

    def lacking(self) -> dict:
        """Each :data:`NEEDED` module this tree does not hold -> one line saying why and what to do: the release's
        wheel has no such module; or the tree was extracted by an earlier version of this suite, which did not
        audit it yet (``smv subject fetch`` writes it again); or the checkout does not have it."""
        meta = _read_meta(self.root) if self.wheel_sha256 else None
        absent = set((meta or {}).get("absent", ()))
        recorded = set((meta or {}).get("modules", {})) | absent
        out = {}
        for p in NEEDED:
            if os.path.exists(os.path.join(self.root, p)):
                continue
            if p in absent:
                out[p] = f"vLLM {self.version}'s wheel has no {p}"
            elif meta is not None and p not in recorded:
                out[p] = (f"the tree at {self.root} was extracted from {meta.get('wheel', 'the release wheel')} by "
                          f"an earlier version of this suite, which did not audit {p} yet: write it again with "
                          f"`smv subject fetch vllm=={self.version} --to {self.root}` (vllm=={self.version} "
                          f"refreshes its cached tree by itself)")
            else:
                out[p] = f"the tree at {self.root} has no {p}"
        return out

    def load(self, arch: str, fp8_dtype, cu_count: int, *, rewrites: list[Rewrite] | None = None,
             extra_standins: dict | None = None, variant: str | None = None) -> Loaded:
        """Import the audited modules afresh for one architecture (``gfx942``, ``gfx950``; any other name is a
        device with neither arch flag, upstream's generic fallback); ``variant`` (a :data:`VARIANTS` name) adds its
        modules and its short names."""
        rewrites = list(REWRITES if rewrites is None else rewrites)
        for rw in rewrites:
            if rw.path not in NEEDED:
                raise SubjectSpecError(f"rewrite {rw.id} names {rw.path}, which is not a module the loader imports")
        mods = standins.build(arch, fp8_dtype, cu_count)
        for name, attrs in (extra_standins or {}).items():
            m = mods.get(name) or standins.InertModule(name)
            m.__dict__.update(attrs)
            mods[name] = m
        applied: list = []
        finder = _Finder(self.root, mods, rewrites, applied, paths=variant_paths(variant))

        def hide(name, mod):  # the installed transformers (or aiter) stays out of the import
            return _top(name) in THIRD_PARTY_STANDINS or _hidden_third_party(name, mod)

        with _ACTIVE_LOCK:
            third_before = {k for k in sys.modules if _top(k) in THIRD_PARTY_STANDINS}
            token = standins.IMPORTING.set(True)
            served: dict = {}
            try:
                with standins.serving(served), _swapped(mods, finder, hide) as loaded:
                    for name in finder.needed:
                        importlib.import_module(name)
            finally:
                standins.IMPORTING.reset(token)
                # the inert transformers served during the import goes; an installed one imported before returns
                for k in [k for k in sys.modules if _top(k) in THIRD_PARTY_STANDINS and k not in third_before]:
                    del sys.modules[k]
        short = dict(SHORT, **(VARIANTS[variant].short if variant else {}))
        return Loaded(arch, loaded, applied, self.root, frozenset(finder.needed), self.lacking(), served, short)


# --- finding a tree --------------------------------------------------------------------------------------------------

def cache_dir() -> str:
    """Where ``vllm==X`` trees live: ``$SMV_CACHE``, else ``$XDG_CACHE_HOME/sparse-mla-verify`` (default
    ``~/.cache/sparse-mla-verify``)."""
    return os.environ.get("SMV_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sparse-mla-verify")


_META = "smv-subject.json"
#: the layout of ``smv-subject.json`` this loader writes; a tree in another layout is fetched again
_META_FORMAT = 2


def _read_meta(root: str) -> dict | None:
    try:
        with open(os.path.join(root, _META), encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _git_version(root: str) -> str | None:
    """``git:<describe>`` for the checkout rooted at ``root`` (not for a directory inside some other repo)."""
    try:
        top = subprocess.run(["git", "-C", root, "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             timeout=10)
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(root):
            return None
        d = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return f"git:{d.stdout.strip()}" if d.returncode == 0 and d.stdout.strip() else None


def _version_of(root: str) -> str:
    """A fetched tree's recorded version; else ``vllm/_version.py``'s; else ``git:<describe>``; else unknown."""
    meta = _read_meta(root)
    if meta and meta.get("version"):
        return str(meta["version"])
    vf = os.path.join(root, "vllm", "_version.py")
    if os.path.exists(vf):
        with open(vf, encoding="utf-8", errors="replace") as fh:
            m = re.search(r"""(?:__version__|version)\s*(?::\s*str)?\s*=\s*['"]([^'"]+)['"]""", fh.read())
        if m:
            return m.group(1)
    return _git_version(root) or "unknown"


def _modified(root: str, meta: dict | None) -> tuple:
    recorded = (meta or {}).get("modules")
    if not isinstance(recorded, dict):
        return ()
    return tuple(p for p, sha in sorted(recorded.items())
                 if not os.path.exists(os.path.join(root, p)) or _sha256(os.path.join(root, p)) != sha)


def tree_at(path: str) -> Tree:
    """``vllm@PATH``: a checkout (``PATH/vllm/...``; ``PATH/vllm`` itself is accepted too) or a tree from
    :func:`fetch_tree`, holding the audited modules."""
    root = os.path.abspath(os.path.expanduser(path))
    if os.path.basename(root) == "vllm" and os.path.exists(os.path.join(os.path.dirname(root), MARKER)):
        root = os.path.dirname(root)
    if not os.path.isdir(root):
        raise SubjectSpecError(f"vllm@{path}: no such directory")
    if not os.path.exists(os.path.join(root, MARKER)):
        what = "has a vllm/ package but" if os.path.isdir(os.path.join(root, "vllm")) else "is not a vLLM tree: it"
        raise SubjectSpecError(f"vllm@{path}: {what} has no {MARKER} (a vLLM checkout, or a tree written by "
                               f"`smv subject fetch`, from before the sparse-MLA ROCm path?)")
    meta = _read_meta(root)
    sha = (meta or {}).get("wheel_sha256")
    version = _version_of(root)
    source = root
    modified = ()
    if sha:
        modified = _modified(root, meta)
        stale = _not_asked_for(root)
        source = f"{root} (extracted from {meta.get('wheel', 'the release wheel')}" + (
            f"; modified since: {', '.join(modified)}" if modified else "") + (
            f"; extracted before the suite audited: {', '.join(stale)}" if stale else "") + ")"
    return Tree(root, version, source, sha, modified)


def _installed_spec():
    """vLLM's import spec as the environment would resolve it, without importing it, ignoring ``sys.modules``
    (which may hold the loader's stand-ins) and the loader's own finders."""
    for finder in sys.meta_path:
        if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec("vllm", None)
        except Exception:  # noqa: BLE001 - a broken third-party finder is not vLLM
            continue
        if spec is not None:
            return spec
    return None


def installed_tree() -> Tree:
    """``vllm``: the installed package, found without importing it."""
    spec = _installed_spec()
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise SubjectSpecError("subject vllm: vLLM is not installed in this environment "
                               "(use vllm==VERSION to download a release, or vllm@PATH for a checkout)")
    root = next((os.path.dirname(p) for p in locations if os.path.exists(os.path.join(os.path.dirname(p), MARKER))),
                None)
    if root is None:
        raise SubjectSpecError(f"subject vllm: the installed vLLM at {os.path.dirname(locations[0])} has no "
                               f"{MARKER} (a release before the sparse-MLA ROCm path?)")
    try:
        from importlib.metadata import version

        v = version("vllm")
    except Exception:  # noqa: BLE001 - no distribution metadata (a bare directory on sys.path)
        v = _version_of(root)
    return Tree(root, v, f"installed: {root}")


_VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")
#: pip's network settings for the download: fail in seconds when the index cannot be reached, never hang
PIP_TIMEOUT_S = 15
PIP_RETRIES = 1
#: a stuck download (the index answers, then stalls) ends after this long
DOWNLOAD_LIMIT_S = 1800
#: how long a process waits for another one fetching the same release
LOCK_WAIT_S = DOWNLOAD_LIMIT_S + 120

_NETWORK_SIGNS = ("NewConnectionError", "Failed to establish", "Temporary failure in name resolution",
                  "Name or service not known", "Network is unreachable", "ProxyError", "ConnectionError",
                  "ConnectTimeoutError", "Read timed out", "connection broken", "SSLError")


def _complete(dest: str) -> bool:
    """``dest`` holds a tree this loader fetched, in the current layout, covering every :data:`NEEDED` module,
    each unchanged since extraction."""
    meta = _read_meta(dest)
    if not meta or meta.get("format") != _META_FORMAT or not isinstance(meta.get("modules"), dict):
        return False
    if not set(NEEDED) <= set(meta["modules"]) | set(meta.get("absent", ())):
        return False  # this loader needs a module the tree was not asked for
    return os.path.exists(os.path.join(dest, MARKER)) and not _modified(dest, meta)


@contextlib.contextmanager
def _locked(lock_path: str, what: str):
    """An exclusive lock on ``lock_path`` between processes (POSIX ``flock``; where there is none, the atomic
    rename in :func:`fetch_tree` alone keeps the tree whole). Waits at most :data:`LOCK_WAIT_S`."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield False
        return
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SubjectSpecError(f"{what}: another process has held {lock_path} for over "
                                           f"{LOCK_WAIT_S} s") from None
                time.sleep(0.2)
        yield True
    finally:
        os.close(fd)  # releases the lock


def _pip_failure(version: str, proc) -> SubjectSpecError:
    out = "\n".join(s for s in (proc.stderr, proc.stdout) if s)
    m = re.search(r"\(from versions: ([^)]*)\)", out)
    if m and m.group(1).strip() not in ("", "none"):
        known = [v.strip() for v in m.group(1).split(",") if v.strip()]
        return SubjectSpecError(f"vllm=={version}: no such release on the package index (newest: {known[-1]})")
    if any(s in out for s in _NETWORK_SIGNS):
        return SubjectSpecError(f"vllm=={version}: the package index cannot be reached (no network?)")
    if m or "No matching distribution" in out:
        return SubjectSpecError(f"vllm=={version}: no vllm release found on the package index (no network, or "
                                f"an index without vllm?)")
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "")
    return SubjectSpecError(f"vllm=={version}: download failed: {last or f'pip exited {proc.returncode}'}")


def _download_wheel(version: str, tmp: str) -> str:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--no-input", "--progress-bar", "off", "--timeout", str(PIP_TIMEOUT_S), "--retries", str(PIP_RETRIES),
           f"vllm=={version}", "-d", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_LIMIT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SubjectSpecError(f"vllm=={version}: the download did not finish in {DOWNLOAD_LIMIT_S} s") from None
    except OSError as exc:
        raise SubjectSpecError(f"vllm=={version}: could not run pip download ({exc})") from None
    wheels = sorted(f for f in os.listdir(tmp) if f.endswith(".whl"))
    if proc.returncode != 0 or not wheels:
        raise _pip_failure(version, proc)
    return os.path.join(tmp, wheels[0])


def _extract(wheel: str, version: str, part: str) -> None:
    """The audited modules of ``wheel`` into ``part``, with ``smv-subject.json`` (written last)."""
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise SubjectSpecError(f"vllm=={version}: {os.path.basename(wheel)} is not a readable wheel") from None
    with zf:
        names = set(zf.namelist())
        if MARKER not in names:
            raise SubjectSpecError(f"vllm=={version}: the wheel has no {MARKER} (a release before the sparse-MLA "
                                   f"ROCm path?)")
        present = [p for p in NEEDED if p in names]
        for p in present:  # fixed names from NEEDED: nothing in the archive chooses where a file goes
            target = os.path.join(part, p)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with zf.open(p) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    meta = {"format": _META_FORMAT, "name": "vllm", "version": version, "wheel": os.path.basename(wheel),
            "wheel_sha256": _sha256(wheel), "modules": {p: _sha256(os.path.join(part, p)) for p in present},
            "absent": [p for p in NEEDED if p not in names]}
    with open(os.path.join(part, _META), "w", encoding="utf-8") as fh:
        json.dump(meta, fh, indent=1)


def _not_asked_for(dest: str) -> list:
    """The :data:`NEEDED` modules a tree this loader wrote was never asked for (it was extracted by an earlier
    version of the suite, with a shorter list): the tree must be extracted again to hold them."""
    meta = _read_meta(dest)
    if not meta or not isinstance(meta.get("modules"), dict):
        return []
    return [p for p in NEEDED if p not in set(meta["modules"]) | set(meta.get("absent", ()))]


def _copy_complete(src: str, part: str, version: str) -> bool:
    """Copy the complete tree ``src`` (the user cache's extraction of the same release) into ``part``, checking
    every module against its recorded sha256; False (nothing usable) when ``src`` is not such a tree."""
    if not (_complete(src) and _version_of(src) == version):
        return False
    meta = _read_meta(src)
    for p, sha in meta["modules"].items():
        target = os.path.join(part, p)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(src, p), target)
        if _sha256(target) != sha:  # changed under us: download instead
            return False
    shutil.copyfile(os.path.join(src, _META), os.path.join(part, _META))
    return True


def fetch_tree(version: str, to: str | None = None, *, quiet: bool = True) -> Tree:
    """``vllm==X``: download the release wheel once (``pip download --no-deps``, pip's own index settings), extract
    only the audited modules into ``to`` (default: ``cache_dir()/vllm-X``) with a ``smv-subject.json`` naming the
    wheel, its sha256 and each module's. A complete tree already there is reused without touching the network.

    A tree an earlier version of this suite extracted lacks the modules added to :data:`NEEDED` since: it is not
    complete, and is extracted again whole (one line on stderr says which modules it lacked), from the user
    cache's complete tree of the release when ``to`` names another folder, else from the wheel, downloaded again
    (pip's own cache or ``PIP_FIND_LINKS`` may serve it). Its record then names the wheel, its sha256 and every
    module's, as a first fetch would.

    Safe between processes: one fetch per destination at a time (a lock file beside it); the tree is assembled in
    a private directory and renamed into place whole, so a reader sees no tree or a complete one. ``to`` may name
    a new or empty directory, or one an earlier fetch wrote; anything else is refused, never overwritten."""
    if not _VERSION_RE.match(version or ""):
        raise SubjectSpecError(f"vllm=={version}: not a version number (e.g. vllm==0.33.0)")
    dest = os.path.abspath(os.path.expanduser(to)) if to else os.path.join(cache_dir(), f"vllm-{version}")
    if _complete(dest) and _version_of(dest) == version:
        return tree_at(dest)
    try:
        return _fetch_locked(version, dest, quiet)
    except OSError as exc:  # an unwritable cache, a full disk: one line, like every other spec error
        where = f" {exc.filename}" if exc.filename else ""
        raise SubjectSpecError(f"vllm=={version}: cannot write the tree at {dest} ({exc.strerror or exc}{where})") \
            from None


def _fetch_locked(version: str, dest: str, quiet: bool) -> Tree:
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    with _locked(dest + ".lock", f"vllm=={version}") as exclusive:
        if _complete(dest) and _version_of(dest) == version:
            return tree_at(dest)  # another process fetched it while this one waited
        if os.path.isdir(dest) and os.listdir(dest) and _read_meta(dest) is None:
            raise SubjectSpecError(f"vllm=={version}: {dest} exists and is not a tree written by smv; give an empty "
                                   f"or new directory")
        if os.path.exists(dest) and not os.path.isdir(dest):
            raise SubjectSpecError(f"vllm=={version}: {dest} exists and is not a directory")
        base = os.path.basename(dest)
        if exclusive:  # under the lock, any leftover part is a dead process's
            for name in os.listdir(parent):
                if name.startswith(base + ".part-") or name.startswith(base + ".old-"):
                    shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        stale = _not_asked_for(dest) if _version_of(dest) == version else []
        if stale:  # always said: the refresh may download the wheel again
            print(f"smv: the vllm=={version} tree at {dest} was extracted by an earlier version of this suite and "
                  f"lacks {', '.join(stale)}: extracting it again", file=sys.stderr, flush=True)
        part = tempfile.mkdtemp(prefix=base + ".part-", dir=parent)
        os.chmod(part, 0o755)  # mkdtemp's is private; the tree is a cache others on the host may read
        try:
            cached = os.path.join(cache_dir(), f"vllm-{version}")
            if os.path.realpath(cached) == os.path.realpath(dest) or not _copy_complete(cached, part, version):
                shutil.rmtree(part, ignore_errors=True)  # whatever a failed copy left
                os.makedirs(part)
                os.chmod(part, 0o755)
                if not quiet:
                    print(f"smv: downloading vllm=={version} (the wheel is large; once, into {parent})",
                          file=sys.stderr, flush=True)
                with tempfile.TemporaryDirectory(prefix="smv-wheel-") as tmp:
                    _extract(_download_wheel(version, tmp), version, part)
            _install(part, dest)
        finally:
            shutil.rmtree(part, ignore_errors=True)
    return tree_at(dest)


def _install(part: str, dest: str) -> None:
    """Move the complete tree ``part`` to ``dest`` in one rename; an old tree there is moved aside first."""
    old = None
    if os.path.exists(dest):
        old = tempfile.mkdtemp(prefix=os.path.basename(dest) + ".old-", dir=os.path.dirname(dest))
        os.rmdir(old)
        os.rename(dest, old)
    try:
        os.rename(part, dest)
    except OSError:
        if _complete(dest):  # without a lock another process may have won the rename: its tree is as good
            return
        raise
    finally:
        if old:
            shutil.rmtree(old, ignore_errors=True)


def planted_copy(root: str, dest: str, rel: str, find: str, replace: str) -> str:
    """A copy of the tree at ``root`` in ``dest`` with the one occurrence of ``find`` in ``rel`` replaced: a
    planted bug, auditable as ``vllm@dest``. ``find`` must occur exactly once (else ``ValueError``)."""
    shutil.copytree(root, dest)
    path = os.path.join(dest, rel)
    with open(path, encoding="utf-8") as fh:
        src = fh.read()
    if src.count(find) != 1:
        raise ValueError(f"{rel}: the text to replace occurs {src.count(find)} times, not once: {_short(find)}")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(src.replace(find, replace))
    return dest
