"""What the subject under audit can do, as the declared families' ``allowed`` and ``force`` ask it.

``fuzz/`` never imports ``contracts/`` (DESIGN.md, Layout): a family that must adapt to the subject (a layout it has
no packer for, an indexer-writer variant it cannot write, a writer it lacks) asks here by name, and the contract
module that owns the subject's entry points answers, registering a provider beside its contract on import
(``provide(SWA_INSERT, fn)``). Data flows strategy -> case -> subject -> contract; this hook lets the one answer the
strategy needs flow back without an import. A family is looked up for a contract the engine has loaded, so its
provider is in place whenever a subject is being audited; unanswered, a question gets its ``default``: everything,
what ``ours`` (impl/) can do.

The strategies themselves (``layout_cases``, ``indexer_writer_cases(variants)``, ``writer_cases`` /
``compressor_cases``) take what the subject has as explicit arguments; only the family callbacks, reached from the
engine through :class:`fuzz.dimensions.Family` as ``(partial, target)``, ask here.
"""
from __future__ import annotations

from typing import Any, Callable

#: the cache layouts ("fp8_ds_mla", "indexer-normal", "indexer-shuffle") whose packer or unpacker the subject has
CACHE_LAYOUTS = "cache-layouts"
#: what the subject's indexer-K writers can write (the shape of ``impl.indexer_writer.VARIANTS``)
INDEXER_WRITER_VARIANTS = "indexer-writer-variants"
#: whether the subject has the SWA insert (``cache_writers.quantize_and_insert_k_cache``)
SWA_INSERT = "swa-insert"

_PROVIDERS: dict[str, Callable[[Any], Any]] = {}


def provide(name: str, fn: Callable[[Any], Any]) -> None:
    """Answer ``name`` with ``fn(target)`` for the subject under audit (the latest provider wins)."""
    _PROVIDERS[name] = fn


def ask(name: str, target, default: Any) -> Any:
    """The current subject's answer to ``name`` on ``target``; ``default`` when no provider is registered."""
    fn = _PROVIDERS.get(name)
    return default if fn is None else fn(target)
