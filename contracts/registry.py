"""Imports every contract module so their ``@contract`` declarations register. Add new modules here."""
from __future__ import annotations

import importlib
import os

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
    "contracts.layer_rope",
    "contracts.bad_input",
)

#: more modules to import after the suite's own, comma-separated (a team's own contracts, a test's planted ones):
#: every process of a campaign imports them too, since its workers inherit the environment
EXTRA_MODULES_ENV = "SMV_CONTRACT_MODULES"

_loaded = False


def extra_modules() -> list[str]:
    return [m.strip() for m in os.environ.get(EXTRA_MODULES_ENV, "").split(",") if m.strip()]


def load_all() -> dict[str, Contract]:
    global _loaded
    if not _loaded:
        for mod in CONTRACT_MODULES:
            importlib.import_module(mod)
        for mod in extra_modules():
            try:
                importlib.import_module(mod)
            except ImportError as exc:
                raise ValueError(f"{EXTRA_MODULES_ENV}: cannot import contract module {mod!r}: {exc}") from None
        _loaded = True
    return CONTRACTS


def get_contract(cid: str) -> Contract:
    contracts = load_all()
    try:
        return contracts[cid]
    except KeyError:
        raise ValueError(f"unknown contract {cid!r}; known: {', '.join(sorted(contracts))}") from None
