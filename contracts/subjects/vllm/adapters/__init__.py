"""Adapters from our API to upstream's calls, one module per family (named after impl's modules). Each module
defines ``build(ctx: contracts.subjects.vllm.BoundContext) -> contracts.subjects.Family``; an entry point a
family leaves out is ``EntryMissing`` (a ``skipped`` row naming it)."""
from impl.runtime import detect_device, triton_mode  # the host probes native_fnuz_unavailable asks (tests patch them)


def native_fnuz_unavailable(target, what: str) -> None:
    """``SubjectUnavailable`` where upstream's code for ``target`` would use FNUZ fp8 (gfx942's platform flavour,
    upstream's ``FP8_DTYPE`` there) in a Triton kernel on an NVIDIA GPU: Triton there has no FNUZ type and refuses
    to compile it, so the row cannot run on this host (under the interpreter, or on gfx942 itself, it does).
    ``what`` says which of upstream's kernels, e.g. "decode reads its main (SWA) cache"."""
    from contracts.subjects.base import SubjectUnavailable

    if target.main_cache_fp8 == "fnuz" and triton_mode() == "native" and detect_device().kind == "cuda":
        raise SubjectUnavailable(f"upstream's {target.name} {what} as FNUZ fp8, which does not exist on NVIDIA GPUs "
                                 f"(native Triton here)")


class Need:
    """One upstream symbol an adapter needs: ``module`` is the loader's short name (``ops``, ``rocm``, ...: see
    ``loader.SHORT``), ``symbol`` a name or dotted path in it (``Class.method``); ``since`` is the release that
    introduced it, where that is newer than the oldest audited release (a subject older than that predates it).
    ``entry`` names the one entry (or route) of the family that uses it, when only one does: such a symbol is
    checked when that entry runs (``check_needs(..., entry=...)``), not when the family is bound, so a release
    that predates it skips that entry's rows and keeps the rest of the family."""

    __slots__ = ("module", "symbol", "since", "entry")

    def __init__(self, module: str, symbol: str, since: str | None = None, entry: str | None = None):
        self.module, self.symbol, self.since, self.entry = module, symbol, since, entry

    def __repr__(self):
        return (f"Need({self.module!r}, {self.symbol!r}" + (f", since={self.since!r}" if self.since else "")
                + (f", entry={self.entry!r}" if self.entry else "") + ")")


def needs(spec: dict, since: dict | None = None, entry: dict | None = None) -> tuple:
    """``{"ops": ["a", "b"], "rocm": [...]}`` (and ``since={"ops.a": "0.34.0"}``, ``entry={"ops.a": "route"}``)
    -> a tuple of :class:`Need`."""
    since, entry = since or {}, entry or {}
    return tuple(Need(m, s, since.get(f"{m}.{s}"), entry.get(f"{m}.{s}")) for m, syms in spec.items() for s in syms)


def _release(version: str):
    """``version`` as a comparable release, or None (a git describe, "unknown", anything not PEP 440)."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - packaging comes with pytest
        return None
    try:
        return Version(version)
    except InvalidVersion:
        return None


def predates(version: str, since: str) -> bool:
    """Whether a subject at ``version`` is older than the release ``since`` (a dev or pre-release of ``since``
    itself is not: a branch on its way to that release may already hold the symbol, and says so by having it)."""
    v, s = _release(version), _release(since)
    return v is not None and s is not None and v.release < s.release


_ABSENT = object()


def _lookup(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part, _ABSENT)
        if obj is _ABSENT:
            break
    return obj


def _check_variant(ctx, family: str, need, obj, path: str) -> None:
    """A need in a module the subject's model variant remaps: ``SymbolNotInVariant`` (a ``skipped`` row) when the
    variant's module lacks the symbol, or has only a stand-in where the plain module defines it (the variant takes
    it from a module the audit does not load, or inherits it from one)."""
    from contracts.subjects.base import SymbolNotInVariant
    from contracts.subjects.vllm import loader, standins

    got = _lookup(obj, need.symbol)
    loaded = getattr(ctx, "loaded", None)
    plain = loaded.modules.get(loader.SHORT[need.module]) if loaded is not None else None
    own = _lookup(plain, need.symbol) if plain is not None else _ABSENT
    stand_in = standins.is_placeholder(got) and own is not _ABSENT and not standins.is_placeholder(own)
    if got is not _ABSENT and not stand_in:
        return
    variant = getattr(ctx.subject, "variant", None)
    plain_path = loader.module_path(loader.SHORT[need.module])
    what = (f"has only a stand-in for it ({got.__qualname__}: from a module the audit does not load)" if stand_in
            else "has no such symbol")
    counterpart = loader.VARIANTS[variant].counterparts.get(need.symbol.split(".")[0]) \
        if variant in loader.VARIANTS else None
    raise SymbolNotInVariant(f"the {family} adapter needs {need.symbol} (as in {plain_path}); model variant "
                             f"{variant}'s {path} {what}" + (f" ({counterpart})" if counterpart else ""))


def check_needs(ctx, family: str, required, entry: str | None = None) -> None:
    """Every :class:`Need` of ``family`` present in this subject's modules, else ``SymbolTooNew`` (a ``skipped``
    row: the subject's release predates the symbol) or ``SymbolMissing`` (an ``error`` row: missing or renamed in a
    tree that should have it), naming the symbol and the module it was looked for in. In a module the subject's
    model variant remaps (``vllm==X#deepseek_v41``), a symbol the variant does not define is ``SymbolNotInVariant``
    (a ``skipped`` row). ``entry`` None (the family being bound) checks the needs of no particular entry; an
    entry's name checks only the needs tagged with it."""
    from contracts.subjects.base import EntryMissing, SymbolMissing, SymbolTooNew
    from contracts.subjects.vllm import loader

    version = getattr(ctx.subject, "release", ctx.subject.version)  # a model variant's version names it too
    remapped = getattr(ctx.subject, "remapped", ())
    for need in required:
        if getattr(need, "entry", None) != entry:
            continue
        try:
            obj = ctx[need.module]
        except EntryMissing:
            continue  # the whole module is missing from the tree: the entry that reads it skips, saying why
        path = ctx.path_of(need.module) if hasattr(ctx, "path_of") else loader.module_path(loader.SHORT[need.module])
        if need.module in remapped:
            _check_variant(ctx, family, need, obj, path)
            continue
        for part in need.symbol.split("."):
            if not hasattr(obj, part):
                if need.since and predates(version, need.since):
                    raise SymbolTooNew(f"the {family} adapter needs {need.symbol} in {path}, which came in vLLM "
                                       f"{need.since}; this subject is {version}")
                raise SymbolMissing(f"the {family} adapter needs {need.symbol} in {path}, which this tree does not "
                                    f"have (renamed or removed upstream?): the adapter needs a look")
            obj = getattr(obj, part)


def aiter_flags_off(cls) -> dict:
    """``{name: False}`` for every ``_use_aiter...`` attribute the methods of upstream's layer class ``cls`` read
    or set (0.33.0 has ``_use_aiter_sparse_mla``; 0.34.0 splits it into ``..._decode`` and ``..._prefill``): a
    stand-in layer built for a call has AITER off, whatever upstream names its flags in the release under audit.
    Read off the methods' code objects (their attribute names), so no source file is needed."""
    import types as _types

    names: set = set()

    def walk(code):
        names.update(n for n in code.co_names if n.startswith("_use_aiter"))
        for c in code.co_consts:
            if isinstance(c, _types.CodeType):
                walk(c)

    for klass in cls.__mro__:
        for value in vars(klass).values():
            fn = getattr(value, "__func__", value)
            for f in (fn, getattr(fn, "fget", None)):
                if isinstance(getattr(f, "__code__", None), _types.CodeType):
                    walk(f.__code__)
    return {name: False for name in sorted(names)}
