"""The import graph of the four code packages holds to DESIGN.md's one-way flow.

Every ``import`` and ``from ... import`` counts, at any depth (a lazy import inside a function is still an arrow),
relative imports resolved against the importing module's package. Layers, from the front down:

    front ends (contracts.cli, contracts.plugin, contracts.zoo) -> engine (contracts.engine) -> contracts (one module
    per impl module they check) -> core API (contracts.core, registry, markers, compile_keys) and subjects
    (contracts.subjects) -> fuzz, oracles -> impl

``fuzz/`` imports nothing of ``contracts/``; subjects and the contract modules never import the engine; ``impl/``
imports only itself; ``oracles/`` only ``impl.formats`` of ours. No import circle among the project's modules."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("impl", "oracles", "contracts", "fuzz")
FRONT_ENDS = ("contracts.cli", "contracts.plugin", "contracts.zoo")
CORE_API = ("contracts", "contracts.core", "contracts.registry", "contracts.markers", "contracts.compile_keys")
#: what each layer may import (itself included)
ALLOWED = {
    "front end": {"front end", "engine", "contract", "core", "subjects", "fuzz", "oracles", "impl"},
    "engine": {"engine", "contract", "core", "subjects", "fuzz", "oracles", "impl"},
    "contract": {"contract", "core", "subjects", "fuzz", "oracles", "impl"},
    "core": {"core", "impl"},
    "subjects": {"subjects", "impl"},
    "fuzz": {"fuzz", "oracles", "impl"},
    "oracles": {"oracles", "impl"},
    "impl": {"impl"},
}


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def _resolve(name: str, known) -> str | None:
    """The project module ``name`` lands in (``pkg.mod.attr`` -> ``pkg.mod``); None outside the project."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: {modules it imports}}`` among the project's modules."""
    mods = modules(root)
    graph = {}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(_resolve(a.name, mods) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module
                # `from pkg import mod` is an arrow to pkg.mod; `from pkg.mod import name` to pkg.mod
                out.update(_resolve(f"{source}.{a.name}", mods) for a in node.names)
        out.discard(None)
        out.discard(mod)
        graph[mod] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def layer(mod: str) -> str:
    if mod.startswith(FRONT_ENDS):
        return "front end"
    if mod == "contracts.engine" or mod.startswith("contracts.engine."):
        return "engine"
    if mod == "contracts.subjects" or mod.startswith("contracts.subjects."):
        return "subjects"
    if mod in CORE_API:
        return "core"
    if mod.startswith("contracts."):
        return "contract"
    return mod.split(".")[0]


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for mod, targets in sorted(graph.items()):
        for t in sorted(targets):
            if layer(t) not in ALLOWED[layer(mod)]:
                out.append(f"{mod} ({layer(mod)}) imports {t} ({layer(t)})")
            elif mod.startswith("oracles") and t.startswith("impl") and t != "impl.formats":
                out.append(f"{mod} (oracles) imports {t}: only impl.formats' constants and codecs are shared")
    return out


# --- the project -------------------------------------------------------------------------------------------------


def test_no_import_circle_among_the_projects_modules():
    found = cycles(import_graph(ROOT))
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_imports_run_one_way_front_ends_engine_contracts_subjects_impl():
    bad = wrong_way(import_graph(ROOT))
    assert not bad, "\n".join(bad)


def test_the_graph_sees_the_packages_and_their_lazy_imports():
    g = import_graph(ROOT)
    assert {"impl.decode", "oracles.decode", "contracts.decode", "fuzz.decode", "contracts.engine.runner",
            "contracts.subjects.vllm.loader", "contracts.cli.smv"} <= set(g)
    assert "contracts.engine.runner" in g["contracts.engine.audit"]
    assert "contracts.subjects" in g["contracts.engine.runner"]


# --- the checks catch what they are for (a planted tree) ---------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.parent != tmp_path and not (p.parent / "__init__.py").exists():
            (p.parent / "__init__.py").write_text("")
        p.write_text(text)
    return tmp_path


def test_a_relative_lazy_import_circle_is_found(tmp_path):
    root = _tree(tmp_path, {
        "contracts/engine/audit.py": "def f():\n    from . import pool\n",
        "contracts/engine/pool.py": "def g():\n    from .audit import f\n",
        "contracts/engine/reports.py": "from contracts.engine import audit\n",
    })
    assert cycles(import_graph(root)) == [["contracts.engine.audit", "contracts.engine.pool"]]


def test_wrong_way_arrows_are_named(tmp_path):
    root = _tree(tmp_path, {
        "fuzz/formats.py": "def s():\n    from contracts.formats import subject_has\n",
        "contracts/formats.py": "from contracts.engine.runner import x\n",
        "contracts/engine/runner.py": "x = 1\n",
        "contracts/subjects/base.py": "from ..engine import runner\n",
        "oracles/decode.py": "from impl.decode import k\n",
        "impl/decode.py": "k = 1\n",
        "impl/formats.py": "import oracles.decode\n",
    })
    bad = wrong_way(import_graph(root))
    assert bad == [
        "contracts.formats (contract) imports contracts.engine.runner (engine)",
        "contracts.subjects.base (subjects) imports contracts.engine.runner (engine)",
        "fuzz.formats (fuzz) imports contracts.formats (contract)",
        "impl.formats (impl) imports oracles.decode (oracles)",
        "oracles.decode (oracles) imports impl.decode: only impl.formats' constants and codecs are shared",
    ], bad


if __name__ == "__main__":  # a quick look: python tests/test_import_graph.py
    g = import_graph(ROOT)
    for c in cycles(g):
        print("circle:", " <-> ".join(c))
    for line in wrong_way(g):
        print(line)
    sys.exit(0)
