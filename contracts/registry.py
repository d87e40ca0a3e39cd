"""Imports every contract module so their ``@contract`` declarations register. Add new modules here."""
from __future__ import annotations

import importlib

from contracts.core import CONTRACTS, Contract

CONTRACT_MODULES: tuple[str, ...] = (
    "contracts.formats",
    "contracts.sparse_metadata",
    "contracts.router",
    "contracts.decode",
    "contracts.splits",
    "contracts.graph_buffers",
    "contracts.epilogues",
    "contracts.dispatch",
    "contracts.cache_writers",
    "contracts.graph_capture",
    "contracts.prefill",
    "contracts.prefill_assembly",
    "contracts.cp_gather",
    "contracts.indexer_writer",
    "contracts.indexer_logits",
    "contracts.int64_probes",
    "contracts.ragged",
    "contracts.dsv4_step",
    "contracts.metamorphic",
    "contracts.decode_reduce",
    "contracts.dequant",
)

_loaded = False


def load_all() -> dict[str, Contract]:
    global _loaded
    if not _loaded:
        for mod in CONTRACT_MODULES:
            importlib.import_module(mod)
        _loaded = True
    return CONTRACTS


def get_contract(cid: str) -> Contract:
    contracts = load_all()
    try:
        return contracts[cid]
    except KeyError:
        raise ValueError(f"unknown contract {cid!r}; known: {', '.join(sorted(contracts))}") from None
