"""Mutation operators for Triton code that cosmic-ray does not have (``smv mutate --operators triton``).

Each operator finds its positions in a module's ``ast`` and rewrites the source text there, by position, so the
rest of the file keeps its formatting (as cosmic-ray does). Positions are listed in a fixed order (the module's
nodes in ``ast.walk`` order, then by position), so ``(module, operator, occurrence)`` names one mutation and a
seed picks the same sample every time. Operators (named ``triton/<Name>``):

- ``StrideToPackedWidth``: a ``t.stride(k)`` handed to a kernel (any ``.stride(k)`` outside a test, a comparison, a
  message or an assertion) -> the packed width of that dimension, ``prod(t.shape[k + 1:])``.
- ``DropMask``: a ``mask=`` dropped from ``tl.load``/``tl.store`` (a load's ``other=`` with it: Triton refuses an
  ``other`` without a mask). ``FlipMaskBound``: a comparison written in a ``mask=`` flipped at its bound
  (``<`` <-> ``<=``, ``>`` <-> ``>=``).
- ``LoadOtherToOne`` / ``LoadOtherToNegInf`` / ``LoadOtherToNaN``: a load's zero ``other=`` -> a poison;
  ``LoadOtherToZero``: any other ``other=`` (``-inf``, ``-1``, ...) -> 0.
- ``BlockSizeDouble`` / ``BlockSizeHalve``: a block size (a ``BLOCK*=`` keyword at a launch or in its meta
  ``dict(...)``, a ``tl.constexpr`` parameter's default, a module constant named ``*BLOCK*``) x 2 or // 2.
- ``DropInt64Widening``: ``x.to(tl.int64)`` -> ``x``; ``Int64CastToInt32``: ``tl.int64`` in a cast
  (``.to(...)``, ``tl.cast(...)``) -> ``tl.int32``.
- ``DropDoNotSpecialize``: one entry of ``@triton.jit(do_not_specialize=[...])`` dropped.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

PREFIX = "triton/"


@dataclass(frozen=True)
class Edit:
    """Replace the source bytes ``[start, end)`` with ``text`` (several edits of one mutation never overlap)."""
    start: int
    end: int
    text: str


#: one mutation: (line of the site, its edits)
Mutation = tuple[int, tuple[Edit, ...]]


class _Src:
    """Byte offsets of ``ast`` positions (col_offset counts UTF-8 bytes) and the text between them."""

    def __init__(self, source: str):
        self.data = source.encode()
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def pos(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node) -> tuple[int, int]:
        return self.pos(node.lineno, node.col_offset), self.pos(node.end_lineno, node.end_col_offset)

    def text(self, node) -> str:
        a, b = self.span(node)
        return self.data[a:b].decode()


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _kw(call: ast.Call, name: str):
    return next((k for k in call.keywords if k.arg == name), None)


def _is_load_store(n) -> bool:
    return isinstance(n, ast.Call) and _dotted(n.func) in ("tl.load", "tl.store")


def _is_jit(dec) -> bool:
    return _dotted(dec.func if isinstance(dec, ast.Call) else dec) == "triton.jit"


def _parents(tree) -> dict:
    out = {}
    for n in ast.walk(tree):
        for c in ast.iter_child_nodes(n):
            out[c] = n
    return out


# --- the operators: each yields (line, edits) in a fixed order --------------------------------------------------------

def _stride_sites(tree, src: _Src, parents) -> list[Mutation]:
    out = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "stride"
                and len(n.args) == 1 and isinstance(n.args[0], ast.Constant) and type(n.args[0].value) is int
                and n.args[0].value >= 0):
            continue
        p, guarded = n, False
        while p in parents:
            q = parents[p]
            if isinstance(q, (ast.Compare, ast.JoinedStr, ast.Assert, ast.Raise)) or \
                    (isinstance(q, (ast.If, ast.While, ast.IfExp)) and p is q.test):
                guarded = True
                break
            p = q
        if not guarded:
            recv = src.text(n.func.value)
            width = f"__import__('math').prod(({recv}).shape[{n.args[0].value + 1}:])"
            out.append((n.lineno, (Edit(*src.span(n), width),)))
    return out


def _drop_keyword(call: ast.Call, kw: ast.keyword, src: _Src) -> Edit:
    """Delete ``, kw=...`` (from the end of what precedes it to its end)."""
    items = sorted([*call.args, *call.keywords], key=lambda x: (x.lineno, x.col_offset))
    i = items.index(kw)
    if i == 0:
        raise ValueError("a leading keyword")  # tl.load/tl.store always lead with the pointer
    return Edit(src.span(items[i - 1])[1], src.span(kw)[1], "")


def _drop_mask_sites(tree, src: _Src, parents) -> list[Mutation]:
    out = []
    for n in ast.walk(tree):
        if _is_load_store(n) and (m := _kw(n, "mask")) is not None:
            edits = [_drop_keyword(n, m, src)]
            if (o := _kw(n, "other")) is not None:
                edits.append(_drop_keyword(n, o, src))
            out.append((n.lineno, tuple(sorted(edits, key=lambda e: e.start))))
    return out


_FLIP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">")}


def _flip_bound_sites(tree, src: _Src, parents) -> list[Mutation]:
    out = []
    for n in ast.walk(tree):
        if not (_is_load_store(n) and (m := _kw(n, "mask")) is not None):
            continue
        for c in ast.walk(m.value):
            if not isinstance(c, ast.Compare):
                continue
            for left, op, right in zip([c.left, *c.comparators], c.ops, c.comparators):
                if type(op) not in _FLIP:
                    continue
                a, b = src.span(left)[1], src.span(right)[0]
                old, new = _FLIP[type(op)]
                k = src.data[a:b].find(old.encode())
                if k >= 0:
                    out.append((c.lineno, (Edit(a + k, a + k + len(old), new),)))
    return out


def _is_zero(v) -> bool:
    return isinstance(v, ast.Constant) and type(v.value) in (int, float) and v.value == 0


def _other_sites(kind: str):
    poison = {"one": "1.0", "neginf": "float(\"-inf\")", "nan": "float(\"nan\")"}

    def sites(tree, src: _Src, parents) -> list[Mutation]:
        out = []
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Call) and _dotted(n.func) == "tl.load"
                    and (o := _kw(n, "other")) is not None):
                continue
            if kind in poison and _is_zero(o.value):
                out.append((o.value.lineno, (Edit(*src.span(o.value), poison[kind]),)))
            elif kind == "zero" and not _is_zero(o.value):
                out.append((o.value.lineno, (Edit(*src.span(o.value), "0"),)))
        return out
    return sites


def _block_values(tree) -> list:
    """The expressions that are block sizes (see the module docstring)."""
    vals = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            vals += [k.value for k in n.keywords if k.arg and k.arg.startswith("BLOCK")]
        elif isinstance(n, ast.FunctionDef) and any(_is_jit(d) for d in n.decorator_list):
            args = n.args.posonlyargs + n.args.args
            for a, d in zip(args[len(args) - len(n.args.defaults):], n.args.defaults):
                if a.annotation is not None and _dotted(a.annotation) == "tl.constexpr" and \
                        isinstance(d, ast.Constant) and type(d.value) is int:
                    vals.append(d)
    for n in tree.body:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and type(n.value.value) is int \
                and any(isinstance(t, ast.Name) and "BLOCK" in t.id for t in n.targets):
            vals.append(n.value)
    return vals


def _block_sites(how: str):
    def sites(tree, src: _Src, parents) -> list[Mutation]:
        out = []
        for v in _block_values(tree):
            text = src.text(v)
            if isinstance(v, ast.Constant):
                new = str(v.value * 2 if how == "double" else v.value // 2)
            else:
                new = f"({text}) * 2" if how == "double" else f"({text}) // 2"
            if new != text:
                out.append((v.lineno, (Edit(*src.span(v), new),)))
        return out
    return sites


def _int64_casts(tree):
    """(call, the ``tl.int64`` node) of ``x.to(tl.int64, ...)`` and ``tl.cast(x, tl.int64, ...)``."""
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        if isinstance(n.func, ast.Attribute) and n.func.attr == "to" and n.args and _dotted(n.args[0]) == "tl.int64":
            yield n, n.args[0]
        elif _dotted(n.func) == "tl.cast" and len(n.args) >= 2 and _dotted(n.args[1]) == "tl.int64":
            yield n, n.args[1]


def _drop_widening_sites(tree, src: _Src, parents) -> list[Mutation]:
    return [(n.lineno, (Edit(*src.span(n), src.text(n.func.value)),)) for n, _ in _int64_casts(tree)
            if isinstance(n.func, ast.Attribute) and n.func.attr == "to" and len(n.args) == 1 and not n.keywords]


def _int32_cast_sites(tree, src: _Src, parents) -> list[Mutation]:
    return [(d.lineno, (Edit(*src.span(d), "tl.int32"),)) for _, d in _int64_casts(tree)]


def _dns_sites(tree, src: _Src, parents) -> list[Mutation]:
    out = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.FunctionDef):
            continue
        for dec in n.decorator_list:
            if not (isinstance(dec, ast.Call) and _is_jit(dec) and (k := _kw(dec, "do_not_specialize"))
                    and isinstance(k.value, (ast.List, ast.Tuple))):
                continue
            elts = k.value.elts
            for i, e in enumerate(elts):
                if len(elts) == 1:
                    edit = Edit(*src.span(e), "")
                elif i + 1 < len(elts):
                    edit = Edit(src.span(e)[0], src.span(elts[i + 1])[0], "")
                else:
                    edit = Edit(src.span(elts[i - 1])[1], src.span(e)[1], "")
                out.append((e.lineno, (edit,)))
    return out


OPERATORS = {
    "StrideToPackedWidth": _stride_sites,
    "DropMask": _drop_mask_sites,
    "FlipMaskBound": _flip_bound_sites,
    "LoadOtherToOne": _other_sites("one"),
    "LoadOtherToNegInf": _other_sites("neginf"),
    "LoadOtherToNaN": _other_sites("nan"),
    "LoadOtherToZero": _other_sites("zero"),
    "BlockSizeDouble": _block_sites("double"),
    "BlockSizeHalve": _block_sites("halve"),
    "DropInt64Widening": _drop_widening_sites,
    "Int64CastToInt32": _int32_cast_sites,
    "DropDoNotSpecialize": _dns_sites,
}


def operator_names() -> list[str]:
    return [PREFIX + k for k in OPERATORS]


def _mutations(source: str, operator: str) -> list[Mutation]:
    tree = ast.parse(source)
    muts = OPERATORS[operator.removeprefix(PREFIX)](tree, _Src(source), _parents(tree))
    return sorted(muts, key=lambda m: (m[1][0].start, m[1][0].end))


def positions(source: str) -> list[tuple[str, int, int]]:
    """Every (operator, occurrence, line) of ``source``, operators in ``OPERATORS`` order, occurrences by position."""
    out = []
    for name in operator_names():
        out += [(name, occ, line) for occ, (line, _) in enumerate(_mutations(source, name))]
    return out


def apply(source: str, operator: str, occurrence: int) -> str | None:
    """``source`` with ``operator``'s ``occurrence``-th mutation applied (None when there is no such position)."""
    muts = _mutations(source, operator)
    if not 0 <= occurrence < len(muts):
        return None
    data = _Src(source).data
    for e in sorted(muts[occurrence][1], key=lambda e: e.start, reverse=True):
        data = data[:e.start] + e.text.encode() + data[e.end:]
    return data.decode()
