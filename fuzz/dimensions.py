"""Declared input dimensions of a case family, and the covering arrays that reach their interacting pairs.

A family declares its dimensions (each a name and a few values or classes: a layout, an fp8 flavour, a block-size
class, a flag that changes a code path, where a poison sits, a segment-length class around the kernel's tile) and
which of them interact. Pairs (nightly: triples) of values are required among interacting dimensions only; a
dimension that interacts with none is required value by value. Two functions tie cases to dimensions:

- ``classify(case, target) -> {dimension: value}``: the values a drawn case hits (a dimension it cannot tell is left
  out);
- ``force(case, combo, target) -> case``: the case rewritten to hit ``combo`` (a value per dimension), everything
  else as drawn. The runner feeds the rows of the covering array through it, one generated case per row, so the
  array's cases keep the generator's shapes and seeds.

``allowed(partial, target) -> bool`` rules out combinations that cannot exist on a target (adaptive splits off
gfx950, say), or that a case cannot carry (a compressor's weight kind on an SWA-insert case). Covering arrays come from ``allpairspy``.
Families are declared for contract ids with :func:`declare` (mostly in the fuzz modules of
:data:`DECLARING_MODULES`, a few beside their contract); a contract without one reports no declared pairs.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

#: covering strength per profile: dev draws freely (reach is reported, not required); ci reaches every interacting
#: pair; nightly every interacting triple (where the array stays within :data:`NIGHTLY_MAX_ROWS`, else pairs)
STRENGTH = {"dev": 0, "ci": 2, "nightly": 3}
NIGHTLY_MAX_ROWS = 400
#: the fuzz modules that declare families (each declares on import, beside its generators)
DECLARING_MODULES = ("fuzz.decode", "fuzz.cache_writers", "fuzz.cp_gather", "fuzz.indexer_logits",
                     "fuzz.sparse_metadata", "fuzz.dispatch", "fuzz.dsv4_step", "fuzz.epilogues", "fuzz.formats",
                     "fuzz.graph_buffers", "fuzz.graph_capture", "fuzz.indexer_writer", "fuzz.metamorphic",
                     "fuzz.prefill", "fuzz.prefill_assembly", "fuzz.ragged", "fuzz.router", "fuzz.splits",
                     "fuzz.decode_reduce", "fuzz.dequant", "fuzz.layer_rope", "fuzz.bad_input")


@dataclass(frozen=True)
class Dimension:
    name: str
    values: tuple
    doc: str = ""

    def __post_init__(self):
        if not self.values or len(set(self.values)) != len(self.values):
            raise ValueError(f"dimension {self.name}: expected distinct values, got {self.values!r}")


@dataclass
class Family:
    """The declared dimensions of one case family (see the module doc)."""

    name: str
    dimensions: tuple[Dimension, ...]
    interactions: tuple[tuple[str, ...], ...]
    classify: Callable[[Any, Any], dict]
    force: Callable[[Any, dict, Any], Any]
    allowed: Callable[[dict, Any], bool] | None = None
    #: a few deliberately plain cases of the family (``examples(target) -> [case, ...]``): the tests force every
    #: covering row onto each of them and check it classifies as that row
    examples: Callable[[Any], list] | None = None

    def __post_init__(self):
        names = [d.name for d in self.dimensions]
        if len(set(names)) != len(names):
            raise ValueError(f"family {self.name}: dimension names repeat: {names}")
        for group in self.interactions:
            unknown = [g for g in group if g not in names]
            if unknown or len(group) < 2:
                raise ValueError(f"family {self.name}: interaction {group!r} must name 2+ declared dimensions "
                                 f"(unknown: {unknown})")

    # --- the declared tuples --------------------------------------------------------------------------------
    def _ok(self, partial: dict, target) -> bool:
        return self.allowed is None or bool(self.allowed(partial, target))

    def values(self, name: str, target) -> tuple:
        d = next(d for d in self.dimensions if d.name == name)
        return tuple(v for v in d.values if self._ok({name: v}, target))

    def required(self, target, strength: int = 2) -> list[tuple]:
        """Every tuple the family must reach on ``target``: ``strength`` values of interacting dimensions (a group
        smaller than that: all of it), and each value of a dimension that interacts with none. A tuple is a sorted
        tuple of ``(dimension, value)``."""
        if strength <= 0:
            return []
        order = {d.name: i for i, d in enumerate(self.dimensions)}
        out: set[tuple] = set()
        grouped = {g for group in self.interactions for g in group}
        for group in self.interactions:
            for dims in itertools.combinations(sorted(group, key=order.get), min(strength, len(group))):
                for vals in itertools.product(*(self.values(d, target) for d in dims)):
                    combo = dict(zip(dims, vals))
                    if self._ok(combo, target):
                        out.add(tuple(combo.items()))
        for d in self.dimensions:
            if d.name not in grouped:
                out.update((((d.name, v),) for v in self.values(d.name, target)))
        return sorted(out, key=lambda t: [(order[k], repr(v)) for k, v in t])

    def components(self) -> list[list[str]]:
        """Dimensions joined by interactions (each lone dimension is its own component), in declaration order."""
        parent = {d.name: d.name for d in self.dimensions}

        def root(x):
            while parent[x] != x:
                x = parent[x]
            return x

        for group in self.interactions:
            for g in group[1:]:
                parent[root(g)] = root(group[0])
        comps: dict[str, list[str]] = {}
        for d in self.dimensions:
            comps.setdefault(root(d.name), []).append(d.name)
        return list(comps.values())

    def covering_array(self, target, strength: int = 2) -> list[dict]:
        """Rows (``{dimension: value}``) that together hit every :meth:`required` tuple: one ``allpairspy`` array
        per interaction component, laid side by side (a shorter one cycles). Within a component the array covers
        every pair of its dimensions, declared or not (allpairspy knows no partial interactions): a chain a-b, b-c
        costs the rows of a full a, b, c array, so keep components small and split an interaction that is not one."""
        if strength <= 0:
            return []
        from allpairspy import AllPairs

        per_comp = []
        for comp in self.components():
            vals = [self.values(d, target) for d in comp]
            if len(comp) == 1:
                rows = [{comp[0]: v} for v in vals[0]]
            else:
                def ok(partial, comp=comp):
                    return self._ok(dict(zip(comp, partial)), target)

                rows = [dict(zip(comp, r)) for r in AllPairs(vals, n=min(strength, len(comp)), filter_func=ok)]
                rows += self._top_up(rows, comp, target, strength)
            per_comp.append(rows)
        # lay the components side by side: each merged row takes the first still unplaced row of the next
        # component that ``allowed`` accepts with it (else any accepted one); rows left over start rows of their own
        per_comp.sort(key=len, reverse=True)
        out: list[dict] = [dict(r) for r in per_comp[0]]
        done = [per_comp[0]]
        for comp_rows in per_comp[1:]:
            pending = list(comp_rows)
            for row in out:
                pick = next((p for p in pending if self._ok({**row, **p}, target)), None)
                if pick is not None:
                    pending.remove(pick)
                else:
                    pick = next((p for p in comp_rows if self._ok({**row, **p}, target)), comp_rows[0])
                row.update(pick)
            for p in pending:
                row = dict(p)
                for rows in done:
                    row.update(next((r for r in rows if self._ok({**row, **r}, target)), rows[0]))
                out.append(row)
            done.append(comp_rows)
        order = [d.name for d in self.dimensions]
        return [{k: row[k] for k in order} for row in out]

    def _top_up(self, rows: list[dict], comp: list[str], target, strength: int) -> list[dict]:
        """Rows for the required tuples of ``comp`` that allpairspy's filtered search left out (it drops some
        next to a constraint): each such tuple, the other dimensions at their first value that is allowed."""
        mine = [r for r in self.required(target, strength) if all(k in comp for k, _ in r)]
        have: set = set()
        for row in rows:
            have |= covered_by(mine, frozenset(row.items()))
        extra = []
        for r in mine:
            if r in have:
                continue
            row = dict(r)
            for d in comp:
                if d not in row:
                    row[d] = next((v for v in self.values(d, target) if self._ok({**row, d: v}, target)),
                                  self.values(d, target)[0])
            row = {d: row[d] for d in comp}
            extra.append(row)
            have |= covered_by(mine, frozenset(row.items()))
        return extra

    def hit(self, case, target) -> frozenset:
        """The ``(dimension, value)`` items ``case`` hits, as :meth:`classify` says."""
        return frozenset(self.classify(case, target).items())


def covered_by(required: list[tuple], items: frozenset) -> set[tuple]:
    return {r for r in required if all(i in items for i in r)}


def label(t: tuple) -> str:
    """``"layout=paged & block=odd"``: how a missing tuple is named in a report."""
    return " & ".join(f"{k}={v}" for k, v in t)


def reach_doc(required: list[tuple] | None, covered: set, exhaustive: bool = False) -> dict:
    """The audit row's ``reach``: ``{"pairs_declared", "pairs_covered", "missing", "exhaustive"}``."""
    req = list(required or [])
    return {"pairs_declared": len(req), "pairs_covered": sum(r in covered for r in req),
            "missing": [label(r) for r in req if r not in covered], "exhaustive": bool(exhaustive)}


_DECLARED: dict[str, Family] = {}


def declare(family: Family, *contract_ids: str) -> Family:
    """Declare ``family`` as the case family of each contract id (the contract's ``cases`` draws its cases)."""
    for cid in contract_ids:
        _DECLARED[cid] = family
    return family


def family_for(contract_id: str) -> Family | None:
    return _DECLARED.get(contract_id)


def strength_for(profile: str, family: Family | None, target) -> int:
    """The covering strength a row runs under: the profile's, nightly falling back to pairs past
    :data:`NIGHTLY_MAX_ROWS` rows."""
    s = STRENGTH.get(profile, 0)
    if family is None or s <= 0:
        return 0
    if s > 2 and len(family.covering_array(target, s)) > NIGHTLY_MAX_ROWS:
        return 2
    return s
