"""``smv findings export ID --to DIR``: a finding as a maintainer receives it - ``DIR/repro.py``, a script that needs
only torch, Triton and the upstream module, and ``DIR/ISSUE.md``.

``repro.py`` is the prelude (:mod:`contracts.engine.export_prelude`, copied as text) followed by the finding's own
part, ``findings/export/<ID>.py`` beside findings.toml (a finding seen by a second contract, ``U1-agreement`` or
``F1.w``, shares its root's part: the id up to the first ``-`` or ``.``). The part defines ``reproduce(args)``
returning a ``Verdict`` and opens with a docstring whose ``Input:``, ``Expected:`` and ``Suggested fix:`` paragraphs
go into ISSUE.md with the finding's fields.

Logic that several parts share lives once, in ``findings/export/_shared/<name>.py`` (functions with docstrings,
importing only torch, Triton and the standard library, and using the prelude's names). A part names the snippets it
uses in a module-level ``SHARED = ["name", ...]`` of string literals; repro.py holds each of them once, in the listed
order, between the prelude and the part. A snippet may call the functions of a snippet listed before it."""
from __future__ import annotations

import os
import re

from contracts.engine import export_prelude
from contracts.engine.findings import Finding

SECTIONS = ("Input", "Observed", "Expected", "Suggested fix")


class ExportError(ValueError):
    """No export for this finding, or a part that does not say what ISSUE.md needs; one line."""


def part_path(finding: Finding) -> str | None:
    """The finding's own part, else its root's; None when neither exists."""
    folder = os.path.join(os.path.dirname(finding.source) if finding.source else ".", "findings", "export")
    for fid in dict.fromkeys((finding.id, re.split(r"[-.]", finding.id)[0])):
        path = os.path.join(folder, f"{fid}.py")
        if os.path.isfile(path):
            return path
    return None


def sections(docstring: str) -> dict:
    """``{"Input": text, ...}`` from the paragraphs of a part's docstring that start with a section name."""
    out = {}
    for para in re.split(r"\n\s*\n", docstring.strip()):
        head, _, rest = para.partition(":")
        if head.strip() in SECTIONS:
            out[head.strip()] = " ".join(rest.split())
    return out


def _docstring(source: str, path: str) -> str:
    import ast

    doc = ast.get_docstring(ast.parse(source, path))
    if not doc:
        raise ExportError(f"{path} has no docstring (it says the input, the expected value and a fix)")
    return doc


def shared_names(part: str, path: str) -> list[str]:
    """The snippets a part's ``SHARED`` names, each once, in its order ([] without ``SHARED``)."""
    import ast

    for node in ast.parse(part, path).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SHARED" for t in node.targets):
            value = node.value
            if not (isinstance(value, (ast.List, ast.Tuple)) and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts)):
                raise ExportError(f"{path}: SHARED must be a list of string literals (snippet names)")
            return list(dict.fromkeys(e.value for e in value.elts))
    return []


def snippets(part: str, path: str) -> list[tuple[str, str]]:
    """``[(name, text), ...]``: the snippets the part at ``path`` names, read from ``_shared/`` beside it."""
    folder = os.path.join(os.path.dirname(path), "_shared")
    out = []
    for name in shared_names(part, path):
        file = os.path.join(folder, f"{name}.py")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or not os.path.isfile(file):
            raise ExportError(f"{path}: SHARED names {name!r}, but there is no {os.path.join('_shared', name)}.py")
        with open(file, encoding="utf-8") as fh:
            out.append((name, fh.read()))
    return out


def script(finding: Finding, part: str, tree: str | None, shared: list[tuple[str, str]] = ()) -> str:
    """The text of repro.py: a header naming the finding, the prelude, the shared snippets the part names (``[(name,
    text), ...]``, see :func:`snippets`), the part, the entry point."""
    with open(export_prelude.__file__, encoding="utf-8") as fh:
        prelude = fh.read()
    prelude = prelude.replace("DEFAULT_TREE = None", f"DEFAULT_TREE = {os.path.abspath(tree)!r}" if tree else
                              "DEFAULT_TREE = None", 1)
    title = f"{finding.id}: {finding.title}"
    header = (f"#!/usr/bin/env python3\n# Reproducer for {title[:200]}\n# Upstream: {finding.function}\n"
              f"# Run: python repro.py [--vllm-tree PATH] [--interpret]; exit 1 while the defect is present, 0 once "
              f"fixed, 2 when it cannot run.\n# Needs torch and triton; vLLM installed, or a tree given with "
              f"--vllm-tree. Nothing else.\n")
    tail = f"\n\nif __name__ == \"__main__\":\n    sys.exit(main(reproduce, {title[:300]!r}))\n"
    body = prelude.rstrip()
    if shared:
        names = ", ".join(name for name, _ in shared)
        body += f"\n\n\n# --- shared with other findings' reproducers: {names} " + "-" * max(3, 70 - len(names))
        body += "".join(f"\n\n# shared: {name}\n" + text.strip() for name, text in shared)
    return header + body + "\n\n\n# --- the finding " + "-" * 96 + "\n\n" + part.rstrip() + tail


def issue(finding: Finding, doc: dict, exported_against: str | None) -> str:
    """ISSUE.md: what a maintainer reads first."""
    lines = [f"# {finding.title}", "",
             f"**Where:** `{finding.function}`  ",
             f"**Seen in:** vLLM {', '.join(finding.confirmed_in) or '-'}"
             + (f"; fixed in {', '.join(finding.fixed_in)}" if getattr(finding, "fixed_in", ()) else "") + "  ",
             f"**Targets:** {', '.join(finding.targets)}  "]
    for key, label in (("reach", "Reach"), ("severity", "Severity")):
        value = getattr(finding, key, "")
        if value:
            lines.append(f"**{label}:** {value}  ")
    if getattr(finding, "policy", False):
        lines.append("**Policy:** upstream's behaviour here looks deliberate; this is a difference to document, "
                     "not a bug  ")
    lines.append("")
    consequence = getattr(finding, "consequence", "")
    if consequence:
        lines += ["## Consequence", "", consequence, ""]
    for name in SECTIONS:
        if doc.get(name):
            lines += [f"## {name}", "", doc[name], ""]
    run = "python repro.py" + (f" --vllm-tree {exported_against}" if exported_against else "")
    lines += ["## Reproduce", "", "```", run, "```", "",
              "It prints `observed:` and `expected:` and exits 1 while the defect is present, 0 once fixed and 2 "
              "when it cannot run here. Without a GPU it runs Triton's interpreter.", ""]
    if finding.notes:
        lines += ["## Notes", "", finding.notes, ""]
    return "\n".join(lines)


def export(finding: Finding, out_dir: str, tree: str | None = None) -> list[str]:
    """Write ``out_dir/repro.py`` and ``out_dir/ISSUE.md``; returns their paths."""
    path = part_path(finding)
    if path is None:
        raise ExportError(f"{finding.id} has no exported reproducer (findings/export/{finding.id}.py)")
    with open(path, encoding="utf-8") as fh:
        part = fh.read()
    doc = sections(_docstring(part, path))
    shared = snippets(part, path)
    missing = [s for s in ("Input", "Expected", "Suggested fix") if s not in doc]
    if missing:
        raise ExportError(f"{path}: its docstring lacks the {missing[0]!r} paragraph")
    os.makedirs(out_dir, exist_ok=True)
    repro, md = os.path.join(out_dir, "repro.py"), os.path.join(out_dir, "ISSUE.md")
    with open(repro, "w", encoding="utf-8") as fh:
        fh.write(script(finding, part, tree, shared))
    os.chmod(repro, 0o755)
    with open(md, "w", encoding="utf-8") as fh:
        fh.write(issue(finding, doc, os.path.abspath(tree) if tree else None))
    return [repro, md]
