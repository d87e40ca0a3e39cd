"""Which functions a module of a subject's tree defines, and the sha256 of each one's source: how findings are
matched to code (findings.toml ``functions``), how a subject says which upstream code it has, and how a change
selects what to audit (contracts.engine.changes)."""
from __future__ import annotations

import ast
import hashlib
import os
import re

#: ``(module file, mtime_ns, size) -> {qualname: sha256}``: each module is parsed once per content
_DEFS: dict = {}


def _defs_of(source: str) -> dict:
    """``{qualname: sha256}`` of every def and class a module defines at its top level (also inside module-level
    ``if``/``try``/``with`` blocks) and of their methods and nested classes; a name defined twice keeps its last
    definition, the one that binds."""
    tree = ast.parse(source)
    out: dict = {}
    # ast's lines (ends kept): \r\n, \r or \n end one, nothing else does; its column offsets count UTF-8 bytes
    lines = [ln.encode("utf-8") for ln in re.split(r"(?<=\n)|(?<=\r)(?!\n)", source)]

    def segment(node) -> str:
        """What ``ast.get_source_segment`` gives from the first decorator's '@' (at the def's own column; the
        decorator's col_offset is past it) to the end of the def, without splitting the source once per def."""
        first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        start, end = first - 1, node.end_lineno - 1
        if start == end:
            return lines[start][node.col_offset:node.end_col_offset].decode("utf-8")
        return b"".join([lines[start][node.col_offset:], *lines[start + 1:end],
                         lines[end][:node.end_col_offset]]).decode("utf-8")

    def visit(stmts, prefix: str) -> None:
        for node in stmts:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + node.name
                out[name] = hashlib.sha256(segment(node).encode("utf-8")).hexdigest()
                if isinstance(node, ast.ClassDef):
                    visit(node.body, name + ".")
            elif not prefix and isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in ("body", "orelse", "handlers", "finalbody"):
                    for part in getattr(node, block, ()):
                        visit(part.body if isinstance(part, ast.ExceptHandler) else [part], prefix)

    visit(tree.body, "")
    return out


def module_defs(root: str, module: str) -> dict | None:
    """``{qualname: sha256}`` for ``module`` (a path relative to ``root``); None when the tree has no such file or
    it does not parse. Cached per file and content (size and modification time)."""
    path = os.path.join(root, module)
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    if key not in _DEFS:
        try:
            with open(path, encoding="utf-8") as fh:
                _DEFS[key] = _defs_of(fh.read())
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            _DEFS[key] = None
    return _DEFS[key]


def function_sha256(root: str, module: str, qualname: str) -> str | None:
    """The sha256 of the source of ``qualname`` (``f``, ``Class``, ``Class.method``) in the tree at ``root``: the
    exact source segment of its ``def`` or ``class``, decorators included (from the first decorator's ``@`` to the
    end of the last statement), UTF-8 encoded. None when the module or the name is absent."""
    return (module_defs(root, module) or {}).get(qualname)
