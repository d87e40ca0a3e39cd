"""The ``vllm`` subject: upstream vLLM's real ROCm modules (:mod:`.loader`), loaded with stand-ins
(:mod:`.standins`), behind adapters to our API (:mod:`.adapters`, one module per family named after impl's).

``sub = VllmSubject(tree).bind(target)`` imports the audited modules afresh for that target (arch flags, fp8
dtype and CU count as the target says) and gives families whose entry points take our arguments and call
upstream's code. Under the Triton interpreter every call runs with the interpreter-fidelity corrections
(:mod:`contracts.subjects.fidelity`) and the host-wrapper rewrites; natively, only the rewrites that host needs.
"""
from __future__ import annotations

import importlib
import pkgutil

from contracts.subjects.base import EntryMissing, Subject, SubjectSpecError
from contracts.subjects.vllm.adapters import check_needs
from contracts.subjects.vllm.context import BoundContext
from impl.targets import Target, get_target

#: adapter modules, one per family (``contracts/subjects/vllm/adapters/<family>.py``); each defines
#: ``build(ctx) -> Family``
def adapter_families() -> list[str]:
    from contracts.subjects.vllm import adapters

    return sorted(m.name for m in pkgutil.iter_modules(adapters.__path__) if not m.name.startswith("_"))


class _VllmBound:
    def __init__(self, ctx: BoundContext):
        self._ctx = ctx
        self._families: dict = {}

    @property
    def target(self):
        return self._ctx.target

    @property
    def ctx(self) -> BoundContext:
        """The context the adapters get (its ``loaded`` is this target's import)."""
        return self._ctx

    def __getattr__(self, family: str):
        if family.startswith("__") or family.startswith("_"):
            raise AttributeError(family)
        if family not in self._families:
            try:
                mod = importlib.import_module(f"contracts.subjects.vllm.adapters.{family}")
            except ModuleNotFoundError as exc:
                if exc.name == f"contracts.subjects.vllm.adapters.{family}":
                    raise EntryMissing(family, "no adapter for this family") from None
                raise
            # the upstream symbols the adapter needs, checked before it builds: a missing one ends the rows that
            # use this family skipped (the release predates it) or error (renamed or removed), naming it
            check_needs(self._ctx, family, getattr(mod, "NEEDS", ()))
            self._families[family] = mod.build(self._ctx)
        return self._families[family]


class VllmSubject(Subject):
    """Upstream vLLM from one :class:`~contracts.subjects.vllm.loader.Tree`; :meth:`bind` imports it afresh per
    target (once per target per subject).

    ``variant`` names a model variant (:data:`~contracts.subjects.vllm.loader.VARIANTS`): its modules are imported
    too and its short names (``remapped``) resolve to them. The version then says it (``0.34.0#deepseek_v41``, so
    the label is ``vllm==0.34.0#deepseek_v41`` and the variant's rows are a subject of their own in the reports);
    ``release`` is the tree's version alone (what a symbol's ``since`` is compared with)."""

    def __init__(self, tree, variant: str | None = None):
        super().__init__("vllm", tree.version + (f"#{variant}" if variant else ""), tree.source)
        from contracts.subjects.vllm.loader import VARIANTS

        self.tree = tree
        self.release = tree.version
        self.variant = variant
        self.remapped = frozenset(VARIANTS[variant].short) if variant else frozenset()
        self.wheel_sha256 = tree.wheel_sha256
        self._bound: dict = {}

    def bind(self, target):
        t = get_target(target)
        if t.name not in self._bound:
            import torch

            from contracts.subjects import fidelity

            # every adapter registers its rewrites when imported: all of them before the one import per target
            for family in adapter_families():
                importlib.import_module(f"contracts.subjects.vllm.adapters.{family}")
            fp8 = torch.float8_e4m3fnuz if t.main_cache_fp8 == "fnuz" else torch.float8_e4m3fn
            loaded = self.tree.load(t.name, fp8, t.cu_count, rewrites=fidelity.rewrites_for_host(),
                                    variant=self.variant)
            for rw in loaded.rewrites:
                if all(r["id"] != rw["id"] or r["file"] != rw["file"] for r in self.rewrites):
                    self.rewrites.append(rw)
            self._bound[t.name] = _VllmBound(BoundContext(self, t, loaded))
        return self._bound[t.name]

    def describe(self) -> dict:
        """name, version, source, modules ``{path: sha256}`` (as on disk, before any rewrite), rewrites applied so
        far ``[{id, file, count, why}]``, and ``wheel_sha256`` for a tree extracted from a release wheel."""
        if not self.modules:
            self.modules = self.tree.module_hashes()
        d = super().describe()
        if self.wheel_sha256:
            d["wheel_sha256"] = self.wheel_sha256
        d["standins"] = self.standins_served()
        d["not_run"] = self.not_run()
        return d

    def not_run(self) -> list:
        """Upstream code of this tree the audit cannot run here, each with the reason: ``[{"what", "why"}]`` (an
        entry about a function lists it only where the tree has that function)."""
        from contracts.subjects.code import module_defs

        out = []
        for module, qualname, why in NOT_RUN:
            if module and qualname not in (module_defs(self.tree.root, module) or {}):
                continue
            out.append({"what": f"{module}::{qualname}" if module else qualname, "why": why})
        return out

    def standins_served(self) -> list:
        """Every name a stand-in served to this subject's code, with what it answered on each target bound so far:
        ``[{"name": "vllm.platforms.rocm._ON_GFX1151", "served": {"gfx942": "_ON_GFX1151 = False", ...}}]``,
        sorted by name: what the audit assumed about the rest of vLLM."""
        out: dict = {}
        for tname, b in sorted(self._bound.items()):
            for (module, name), what in b.ctx.loaded.served.items():
                out.setdefault(f"{module}.{name}", {})[tname] = what
        return [{"name": k, "served": v} for k, v in sorted(out.items())]


#: upstream code no row can run here, and why: (module path or "" for code outside the tree, name, reason)
NOT_RUN = (
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py", "_mask_candidates_fused_kernel",
     "the single-launch decode candidate mask (gfx942/gfx950, 0.34.0) uses inline assembly (s_waitcnt vmcnt(0)), "
     ".cv loads and workgroup barriers: neither the Triton interpreter nor an NVIDIA GPU runs it, and no contract "
     "reaches it"),
    ("", "aiter.ops.triton.attention.pa_prefill_sparse and aiter.ops.pa_sparse_prefill_opus",
     "AITER's prefill kernels are ROCm-only: upstream's routes to them are judged with fakes that record what "
     "upstream hands them (aiter-prefill-routing, opus-routing-guard); the kernels themselves are not"),
    ("", "AITER's triton_sparse_mla_fwd (its store's inverse RoPE)",
     "ROCm-only: inverse-rope-exactly-once drives forward_mqa with a fake store that rotates exactly the rows it is "
     "given positions for"),
    ("vllm/models/deepseek_v41/amd/rocm.py", "DeepseekV41ROCMAiterMLAAttention",
     "DeepSeek-V4.1's layer reads other attributes and metadata than V4's stand-in layer gives: the layer-level "
     "contracts skip it (vllm==X#deepseek_v41 runs the helpers it shares with V4)"),
)


def vllm_subject(spec: str) -> VllmSubject:
    """``vllm``, ``vllm==X`` or ``vllm@PATH``, each optionally ``#VARIANT`` -> the subject (see
    :func:`contracts.subjects.parse_subject`). The variant is checked before any tree is looked for (a typo costs no
    download); the last ``#`` of a spec starts it."""
    from contracts.subjects.vllm import loader

    variant = None
    if "#" in spec:
        spec, _, variant = spec.rpartition("#")
        if variant not in loader.VARIANTS:
            raise SubjectSpecError(f"{spec}#{variant}: unknown model variant {variant!r} (known: "
                                   f"{', '.join(sorted(loader.VARIANTS))})")
    if spec == "vllm":
        tree = loader.installed_tree()
    elif spec.startswith("vllm=="):
        tree = loader.fetch_tree(spec[len("vllm=="):].strip())
    elif spec.startswith("vllm@"):
        path = spec[len("vllm@"):].strip()
        if not path:
            raise SubjectSpecError("vllm@: give the path of a vLLM checkout or a fetched tree after the @")
        tree = loader.tree_at(path)
    else:
        raise SubjectSpecError(f"unknown subject {spec!r}")
    return VllmSubject(tree, variant)
