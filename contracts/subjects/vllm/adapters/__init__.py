"""Adapters from our API to upstream's calls, one module per family (named after impl's modules). Each module
defines ``build(ctx: contracts.subjects.vllm.BoundContext) -> contracts.subjects.Family``; an entry point a
family leaves out is ``EntryMissing`` (a ``skipped`` row naming it)."""
from impl.runtime import detect_device, triton_mode  # the host probes native_fnuz_unavailable asks (tests patch them)


def native_fnuz_unavailable(target, what: str) -> None:
    """``SubjectUnavailable`` where upstream's code for ``target`` would use FNUZ fp8 (gfx942's platform flavour,
    upstream's ``FP8_DTYPE`` there) in a Triton kernel on an NVIDIA GPU: Triton there has no FNUZ type and refuses
    to compile it, so the row cannot run on this host (under the interpreter, or on gfx942 itself, it does).
    ``what`` says which of upstream's kernels, e.g. "decode reads its main (SWA) cache"."""
    from contracts.subjects import SubjectUnavailable

    if target.main_cache_fp8 == "fnuz" and triton_mode() == "native" and detect_device().kind == "cuda":
        raise SubjectUnavailable(f"upstream's {target.name} {what} as FNUZ fp8, which does not exist on NVIDIA GPUs "
                                 f"(native Triton here)")


class Need:
    """One upstream symbol an adapter needs: ``module`` is the loader's short name (``ops``, ``rocm``, ...: see
    ``loader.SHORT``), ``symbol`` a name or dotted path in it (``Class.method``); ``since`` is the release that
    introduced it, where that is newer than the oldest audited release (a subject older than that predates it)."""

    __slots__ = ("module", "symbol", "since")

    def __init__(self, module: str, symbol: str, since: str | None = None):
        self.module, self.symbol, self.since = module, symbol, since

    def __repr__(self):
        return f"Need({self.module!r}, {self.symbol!r}" + (f", since={self.since!r})" if self.since else ")")


def needs(spec: dict, since: dict | None = None) -> tuple:
    """``{"ops": ["a", "b"], "rocm": [...]}`` (and ``since={"ops.a": "0.34.0"}``) -> a tuple of :class:`Need`."""
    since = since or {}
    return tuple(Need(m, s, since.get(f"{m}.{s}")) for m, syms in spec.items() for s in syms)


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


def check_needs(ctx, family: str, required) -> None:
    """Every :class:`Need` of ``family`` present in this subject's modules, else ``SymbolTooNew`` (a ``skipped``
    row: the subject's release predates the symbol) or ``SymbolMissing`` (an ``error`` row: missing or renamed in a
    tree that should have it), naming the symbol and the module it was looked for in."""
    from contracts.subjects import EntryMissing, SymbolMissing, SymbolTooNew
    from contracts.subjects.vllm import loader

    version = ctx.subject.version
    for need in required:
        try:
            obj = ctx[need.module]
        except EntryMissing:
            continue  # the whole module is missing from the tree: the entry that reads it skips, saying why
        path = loader.SHORT[need.module].replace(".", "/") + ".py"
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
