"""Change selection (``--changed-since REF``): what a change touched selects the audit rows, zoo entries and tests
that cover it; a change the suite cannot map runs everything.

Pure functions over file lists and sources; the only side effects are reading files and asking ``git``.

Which repository REF names depends on the subject:

- ``ours`` and the upstream subjects without a repository (``vllm==X``, a downloaded wheel; ``vllm``, the installed
  package): REF is a commit of this suite's repository, and the suite's own change is what matters. For ``ours`` an
  impl module that changed selects the contracts that ran its code (``tests/entry_points.json``'s measured record of
  which contract ran which impl function), the contracts of the module named after it (``contracts/decode.py`` checks
  ``impl/decode.py``) and the contracts whose module imports it directly (directly or through impl's own imports).
  For an upstream subject an impl-only change selects nothing: its rows judge upstream's code (the nightly audit
  compares upstream with ours again).
- ``vllm@PATH``, a git checkout: REF is a commit of that checkout. The audited upstream functions whose source
  changed select the rows of the families whose adapters need them (the adapters' ``NEEDS``), following the names
  each needed function uses through its module and the audited modules it imports from; a changed top-level
  statement that binds no name (an ``if`` around definitions, a bare call) selects every family reading that module.
  A tree that is not a git checkout (``smv subject fetch``'s) has no history: that is a usage error (exit 2).

For every subject a changed contract module (``contracts/X.py``) or adapter (``contracts/subjects/vllm/adapters/F.py``)
selects its rows; a changed engine, oracle, fuzz module, the tests' shared fixtures, ``pyproject.toml`` or
``findings.toml`` (see :data:`EVERYTHING`) selects everything. Documentation (``*.md``) selects nothing. Any other
file selects everything, saying why.

Zoo entries: an entry is selected when its ``file`` changed, its catalog changed, or one of its ``expect`` contracts
had its own code changed (its module or its family's adapter). Tests: each ``tests/**/test_*.py`` maps to the files it
imports from this suite, transitively, except through the engine, CLI, plugin, zoo, registry and subjects (kept as
files without their imports: through the registry they reach every impl module, and a change to them runs
everything), plus the files whose path or name its source mentions and, for a changed contract module or adapter,
the contract ids it names; a test whose map meets the change is selected.

Known limit: the measured record sees calls, not reads of module-level constants from another impl module, so a
constant of impl/X.py that only impl/Y.py reads at import selects X's contracts and Y's only if Y's contracts ran
X's code (re-measure the record with ``python tests/test_entry_points.py`` after adding a contract; a contract the
record never saw is selected by any impl change).
"""
from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SUITE_ROOT = Path(__file__).resolve().parents[2]
RECORD = "tests/entry_points.json"
PACKAGES = ("impl", "contracts", "oracles", "fuzz")

#: a change to any of these runs everything (the engine, the shared subject layer, oracles, strategies, fixtures)
EVERYTHING: tuple[str, ...] = (
    "contracts/__init__.py", "contracts/core.py", "contracts/registry.py", "contracts/markers.py",
    "contracts/engine/*", "contracts/cli/*", "contracts/plugin/*", "contracts/zoo/runner.py", "contracts/zoo/__init__.py",
    "contracts/subjects/__init__.py", "contracts/subjects/base.py", "contracts/subjects/code.py",
    "contracts/subjects/fidelity.py", "contracts/subjects/vllm/__init__.py", "contracts/subjects/vllm/loader.py",
    "contracts/subjects/vllm/standins.py", "contracts/subjects/vllm/context.py",
    "contracts/subjects/vllm/adapters/__init__.py",
    "oracles/*", "fuzz/*", "impl/__init__.py", "tests/conftest.py", "tests/planted_*.py",
    "pyproject.toml", "findings.toml",
)
#: files no audit row, zoo entry or test runs: they select nothing (a test that names one is still selected)
INERT: tuple[str, ...] = ("*.md", "findings/notes/*", "ci/*", ".github/*", "benchmarks/*", ".gitignore", ".ci/*")


class ChangesError(ValueError):
    """REF cannot be resolved, or the subject has no repository to take changes from (a usage error: exit 2)."""


@dataclass
class Selection:
    """What a change selects for one subject. ``contracts`` is None for everything."""

    ref: str
    repo: str
    changed: list
    contracts: "set | None" = None
    why: list = field(default_factory=list)
    #: the contracts whose own code changed (their module or their family's adapter): the zoo entries expecting them
    #: run again, since what judges the planted bugs changed
    judging: set = field(default_factory=set)

    @property
    def everything(self) -> bool:
        return self.contracts is None

    def as_json(self) -> dict:
        return {"ref": self.ref, "repo": self.repo, "changed": list(self.changed),
                "selected": "all" if self.everything else sorted(self.contracts), "why": list(self.why)}


def _match(path: str, patterns) -> bool:
    return any(fnmatch.fnmatch(path, p) for p in patterns)


# --- git --------------------------------------------------------------------------------------------------------

def _git(repo, *args) -> str:
    try:
        p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ChangesError(f"git {' '.join(args)} in {repo}: {exc}") from None
    if p.returncode:
        raise ChangesError(f"git {' '.join(args)} in {repo}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return p.stdout


def repo_root(path) -> str:
    """The top of the git work tree holding ``path``; ChangesError when it is none."""
    if not os.path.isdir(path):
        raise ChangesError(f"{path}: no such directory")
    try:
        return _git(path, "rev-parse", "--show-toplevel").strip()
    except ChangesError:
        raise ChangesError(f"{path} is not a git checkout: --changed-since needs the history of the code under "
                           f"audit (drop --changed-since to audit everything)") from None


def changed_files(repo, ref: str) -> list:
    """Files (relative to the work tree's top) changed on this branch since its merge base with ``ref``
    (``git diff REF...HEAD``), plus uncommitted changes and untracked files."""
    top = repo_root(repo)
    try:
        _git(top, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except ChangesError:
        raise ChangesError(f"--changed-since {ref}: no such commit in {top}") from None
    out = set(_git(top, "diff", "--name-only", f"{ref}...HEAD").split())
    out |= set(_git(top, "diff", "--name-only", "HEAD").split())
    out |= set(_git(top, "ls-files", "--others", "--exclude-standard").split())
    return sorted(out)


def file_at(repo, ref: str, path: str) -> "str | None":
    """``path``'s text at the merge base of ``ref`` and HEAD (None when it did not exist there)."""
    top = repo_root(repo)
    base = _git(top, "merge-base", ref, "HEAD").strip() or ref
    try:
        return _git(top, "show", f"{base}:{path}")
    except ChangesError:
        return None


# --- the suite's maps ---------------------------------------------------------------------------------------------

def contract_modules() -> dict:
    """``{contract id: "contracts/X.py"}`` for every registered contract."""
    from contracts.registry import load_all

    return {cid: c.module.replace(".", "/") + ".py" for cid, c in load_all().items()}


def measured(root=SUITE_ROOT) -> dict:
    """``{impl module name: {contract ids that ran its code}}`` from the measured record."""
    try:
        exercised = json.loads((Path(root) / RECORD).read_text())["exercised"]
    except (OSError, ValueError, KeyError):
        return {}
    out: dict = {}
    for fn, cids in exercised.items():
        out.setdefault(fn.split(".")[0], set()).update(cids)
    return out


def _imports(path: Path, root: Path) -> set:
    """Repo-relative files of our packages (and tests' local modules) that ``path`` imports, at any depth of code."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    out = set()
    for n in names:
        parts = n.split(".")
        if parts[0] not in PACKAGES and not (path.parent.name == "tests" and (root / "tests" / f"{parts[0]}.py").exists()):
            continue
        base = root / "tests" if parts[0] not in PACKAGES else root
        for cand in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
            if cand.is_file():
                out.add(cand.relative_to(root).as_posix())
    return out


def _impl_module(path: str) -> "str | None":
    m = re.fullmatch(r"impl/(\w+)\.py", path)
    return m.group(1) if m and m.group(1) != "__init__" else None


def _family_contracts(family: str, cmods: dict, record: dict) -> set:
    """Contracts that call a family's entry points: those that ran impl/<family>.py, and contracts/<family>.py's."""
    return set(record.get(family, ())) | {c for c, m in cmods.items() if m == f"contracts/{family}.py"}


def _impl_closure(path: str, root, cache: dict) -> set:
    """The impl files ``path`` imports itself, and what those import within impl/."""
    seen, todo = set(), [d for d in _imports_cached(path, root, cache) if d.startswith("impl/")]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += [d for d in _imports_cached(p, root, cache) if d.startswith("impl/")]
    return seen


def _imports_cached(path: str, root, cache: dict) -> set:
    if path not in cache:
        cache[path] = _imports(Path(root) / path, Path(root))
    return cache[path]


def _direct_users(impl_mod: str, cmods: dict, root, cache: dict) -> set:
    """Contracts whose module imports impl/<impl_mod>.py itself, or through impl's own imports (it computes
    expectations with it, whatever the subject)."""
    target = f"impl/{impl_mod}.py"
    return {c for c, m in cmods.items() if target in _impl_closure(m, root, cache)}


def select_suite(changed, *, upstream: bool = False, ref: str = "", repo: str = "", root=SUITE_ROOT) -> Selection:
    """What the suite's ``changed`` files select for ``ours`` (``upstream`` False) or for an upstream subject audited
    against the suite's change (a wheel, the installed package)."""
    root = Path(root)
    sel = Selection(ref, repo, sorted(changed), set())
    cmods, record, cache = contract_modules(), measured(root), {}
    unmeasured = set(cmods) - set().union(*record.values()) if record else set(cmods)
    for f in sel.changed:
        if _match(f, EVERYTHING):
            sel.contracts = None
            sel.why.append(f"{f}: shared by every row (engine, subjects layer, oracles, fuzz, fixtures or config)")
            continue
        by_module = {c for c, m in cmods.items() if m == f}
        if by_module:
            sel.why.append(f"{f}: its contracts {', '.join(sorted(by_module))}")
            _add(sel, by_module)
            sel.judging |= by_module
            continue
        fam = re.fullmatch(r"contracts/subjects/vllm/adapters/(\w+)\.py", f)
        if fam:
            got = _family_contracts(fam.group(1), cmods, record)
            sel.why.append(f"{f}: the {fam.group(1)} family's contracts {', '.join(sorted(got)) or '(none)'}")
            _add(sel, got)
            sel.judging |= got
            continue
        mod = _impl_module(f)
        if mod is not None:
            direct = _direct_users(mod, cmods, root, cache)
            if upstream:
                # an upstream subject's rows judge upstream's code; the nightly audit compares it with ours again
                got = set()
                sel.why.append(f"{f}: our impl code: no upstream row judges it (the nightly audit compares "
                               f"upstream with ours again)")
            elif mod not in record and not (root / f).exists():
                got = set()
                sel.why.append(f"{f}: removed impl module no contract ran")
            elif mod not in record:
                sel.contracts = None
                sel.why.append(f"{f}: an impl module the measured record ({RECORD}) never saw run: cannot map it")
                continue
            else:
                got = set(record[mod]) | _family_contracts(mod, cmods, {}) | direct | unmeasured
                sel.why.append(f"{f}: contracts that ran it ({RECORD}), import it or are named after it: "
                               f"{', '.join(sorted(got))}")
            _add(sel, got)
            continue
        if f.startswith("contracts/zoo/") and f.endswith(".toml"):
            sel.why.append(f"{f}: a zoo catalog (selects its entries, no audit rows)")
            continue
        if re.fullmatch(r"tests/(.*/)?test_[^/]*\.py", f) or f.startswith("tests/"):
            sel.why.append(f"{f}: a test (selects itself, no audit rows)")
            continue
        if _match(f, INERT):
            sel.why.append(f"{f}: not run by any audit row")
            continue
        sel.contracts = None
        sel.why.append(f"{f}: not mapped to any contract: runs everything")
    if not sel.changed:
        sel.why.append("nothing changed")
    return sel


def _add(sel: Selection, got) -> None:
    if sel.contracts is not None:
        sel.contracts |= set(got)


# --- upstream checkouts (vllm@PATH) ---------------------------------------------------------------------------

def _units(source: str) -> tuple:
    """``({name: source of the statement binding it}, [anonymous top-level statements' dumps], {local: (module,
    name)} imports)`` of a module's top level (inside module-level if/try/with too)."""
    tree = ast.parse(source)
    named, anon, imported = {}, [], {}

    def visit(stmts):
        for node in stmts:
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                anon.append(ast.dump(getattr(node, "test", None) or ast.Pass()))
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, ()))
                for h in getattr(node, "handlers", ()):
                    visit(h.body)
                continue
            seg = ast.dump(node)
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                tgts = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [n.id for t in tgts for n in ast.walk(t) if isinstance(n, ast.Name)]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    local = a.asname or a.name.split(".")[0]
                    names.append(local)
                    if isinstance(node, ast.ImportFrom) and node.module:
                        imported[local] = (node.module, a.name)
            if names:
                for n in names:
                    named[n] = named.get(n, "") + seg
            elif not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Constant):
                anon.append(seg)  # a bare call or statement (a docstring is none)

    visit(tree.body)
    return named, anon, imported


def _uses(named: dict, name: str) -> set:
    """Identifiers the statement(s) binding ``name`` mention (names and attribute names)."""
    if name not in named:
        return set()
    found = set(re.findall(r"(?:Name\(id|attr|FunctionDef\(name|ClassDef\(name)='(\w+)'", named[name]))
    return found - {name}


class _Parsed(dict):
    """Module path -> its units now (named, anonymous, imported), parsed once."""

    def __init__(self, tree_root: str):
        super().__init__()
        self.tree_root = tree_root

    def __missing__(self, path: str):
        try:
            self[path] = _units((Path(self.tree_root) / path).read_text())
        except (OSError, SyntaxError, UnicodeDecodeError):
            self[path] = ({}, ["<unreadable>"], {})
        return self[path]


def _changed_units(touched: dict, top: str, ref: str, parsed: _Parsed) -> dict:
    """Per audited module a change touched: (the names whose definitions changed, whether an anonymous top-level
    statement changed); a module new since ``ref`` or unparsable then counts as changed throughout."""
    changes: dict = {}
    for path, f in touched.items():
        old_src = file_at(top, ref, f)
        named, anon, _ = parsed[path]
        try:
            o_named, o_anon, _ = _units(old_src) if old_src is not None else (None, None, None)
        except SyntaxError:
            o_named = None
        if o_named is None:
            changes[path] = (set(named), True)
            continue
        diff = {n for n in set(named) | set(o_named) if named.get(n) != o_named.get(n)}
        changes[path] = (diff, sorted(anon) != sorted(o_anon))
    return changes


def _family_reach(needs, parsed: _Parsed, loader) -> set:
    """Every (module, name) a family's needed symbols use, followed through their modules and the audited modules
    they import from."""
    loaded = set(loader.NEEDED)
    reach: set = set()
    todo = [(loader.module_path(loader.SHORT[n.module]), n.symbol.split(".")[0]) for n in needs
            if n.module in loader.SHORT]
    while todo:
        path, name = todo.pop()
        if (path, name) in reach:
            continue
        reach.add((path, name))
        named, _, imported = parsed[path]
        for used in _uses(named, name):
            if used in named and used not in imported:
                todo.append((path, used))
            elif used in imported and loader.module_path(imported[used][0]) in loaded:
                todo.append((loader.module_path(imported[used][0]), imported[used][1]))
    return reach


def select_checkout(tree_root, ref: str) -> Selection:
    """What changed in a vLLM git checkout since ``ref`` selects: the families whose needed upstream functions (or
    what they use) changed, and their contracts."""
    import importlib
    import pkgutil

    from contracts.subjects.vllm import adapters as adapters_pkg, loader

    tree_root = os.path.abspath(tree_root)
    top = repo_root(tree_root)
    changed = changed_files(top, ref)
    prefix = os.path.relpath(tree_root, top).replace(os.sep, "/")
    prefix = "" if prefix == "." else prefix + "/"
    sel = Selection(ref, top, changed, set())
    rel = {f: f[len(prefix):] for f in changed if f.startswith(prefix)}
    touched = {r: f for f, r in rel.items() if r in set(loader.NEEDED)}
    sel.why += [f"{f}: not an audited module (no adapter loads it)" for f in changed if rel.get(f) not in touched]
    if not touched:
        return sel
    parsed = _Parsed(tree_root)
    changes = _changed_units(touched, top, ref, parsed)
    cmods, record = contract_modules(), measured()
    for info in sorted(pkgutil.iter_modules(adapters_pkg.__path__), key=lambda i: i.name):
        needs = getattr(importlib.import_module(f"{adapters_pkg.__name__}.{info.name}"), "NEEDS", ())
        reach = _family_reach(needs, parsed, loader)
        hit = sorted(f"{p}:{n}" for p, n in reach if p in changes and n in changes[p][0])
        hit += sorted({f"{p}: a top-level statement binding no name" for p, _ in reach
                       if p in changes and changes[p][1]})
        if hit:
            got = _family_contracts(info.name, cmods, record)
            sel.contracts |= got
            sel.why.append(f"{info.name} family ({', '.join(sorted(got)) or 'no contract'}): {', '.join(hit)} "
                           f"changed")
    if not sel.contracts:
        sel.why.append("no function an adapter needs (or anything it uses) changed")
    return sel


# --- zoo entries and tests ---------------------------------------------------------------------------------------

def select_mutants(mutants, sel: Selection, *, changed_code=(), changed_catalogs=()) -> list:
    """The zoo entries a selection covers: all when it is everything; else those whose ``file`` is in
    ``changed_code`` (paths relative to the subject's root), whose catalog changed, or that expect a selected
    contract."""
    if sel.everything:
        return list(mutants)
    cats = {os.path.abspath(c) for c in changed_catalogs}
    return [m for m in mutants if m.file in set(changed_code) or os.path.abspath(m.catalog) in cats
            or set(m.expect) & sel.judging]


def test_files(root=SUITE_ROOT) -> list:
    root = Path(root)
    return sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py"))


#: modules a test reaches only as machinery: following their imports would reach every impl module (the registry
#: loads every contract), and a change to them runs everything anyway
_MACHINERY = ("contracts/engine/", "contracts/cli/", "contracts/plugin/", "contracts/zoo/", "contracts/registry.py",
              "contracts/__init__.py", "contracts/subjects/")


def _test_closure(test: str, root, cache: dict) -> set:
    """The files a test imports, and what those import in turn - except through the machinery (:data:`_MACHINERY`),
    which is kept as a file without its imports."""
    seen, todo = set(), [test]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        if p != test and p.startswith(_MACHINERY):
            continue
        todo += _imports_cached(p, root, cache)
    return seen


def test_dependencies(test: str, root=SUITE_ROOT, *, cache: "dict | None" = None) -> set:
    """The files ``test`` depends on (see the module docstring)."""
    root = Path(root)
    cache = {} if cache is None else cache
    deps = _test_closure(test, root, cache)
    if "contracts/subjects/vllm/__init__.py" in deps:
        deps |= {p.relative_to(root).as_posix() for p in (root / "contracts/subjects/vllm/adapters").glob("*.py")}
    # the contracts a test runs check other impl modules too, but the audit step judges those rows: a test is
    # selected by the code it imports, not by every module its contracts happened to reach
    return deps


def select_tests(changed, root=SUITE_ROOT) -> tuple:
    """``(None or [test files], [why])``: None runs every test. A test is also selected when its source names a
    contract the change selects for ours (a test of the engine that runs that contract by id)."""
    root = Path(root)
    ours_sel = select_suite(changed, root=root)
    why, everything = [], False
    tests = test_files(root)
    texts = {t: (root / t).read_text(errors="replace") for t in tests}
    cache: dict = {}
    deps = {t: test_dependencies(t, root, cache=cache) for t in tests}
    chosen: set = set()
    for f in sorted(changed):
        if _match(f, EVERYTHING):
            everything = True
            why.append(f"{f}: shared by every test")
            continue
        hit = {t for t in tests if f == t or f in deps[t]}
        name = os.path.basename(f)
        hit |= {t for t in tests if f in texts[t] or (not f.endswith("__init__.py") and name in texts[t])}
        if ours_sel.contracts and not _match(f, INERT) and not _impl_module(f):
            per_file = select_suite([f], root=root).contracts or set()
            hit |= {t for t in tests if any(f'"{c}"' in texts[t] for c in per_file)}
        if hit:
            chosen |= hit
            why.append(f"{f}: {', '.join(sorted(hit))}")
        elif _match(f, INERT) or _impl_module(f) or f.startswith(("contracts/", "tests/")):
            why.append(f"{f}: no test imports or names it")
        else:
            everything = True
            why.append(f"{f}: no test can be mapped to it: runs every test")
    return (None if everything else sorted(chosen)), why


# --- front ends: what `smv audit|zoo --changed-since REF` select per subject --------------------------------------

def _is_checkout_subject(sub) -> bool:
    return sub.name != "ours" and str(getattr(sub, "spec", "") or "").split("#")[0].startswith("vllm@")


def for_subject(sub, ref: str, root=SUITE_ROOT) -> Selection:
    """The selection for one subject: a vllm@PATH subject by its checkout's history, any other by the suite's."""
    if _is_checkout_subject(sub):
        return select_checkout(sub.tree.root, ref)
    top = repo_root(root)
    return select_suite(changed_files(top, ref), upstream=sub.name != "ours", ref=ref, repo=top, root=root)


def audit_selection(subjects, ref: str, root=SUITE_ROOT) -> dict:
    """``run_audit(changed_since=...)``: ``{"selected": {label: ids or None}, "report": run.changed_since}``;
    ``report`` is ``{"ref", "changed", "selected": "all" | [ids], "why", "subjects": {label: Selection json}}``."""
    per = {sub.label: for_subject(sub, ref, root) for sub in subjects}
    changed = sorted({f for s in per.values() for f in s.changed})
    everything = any(s.everything for s in per.values())
    union = sorted({c for s in per.values() if not s.everything for c in s.contracts})
    why = [f"{label}: {w}" if len(per) > 1 else w for label, s in per.items() for w in s.why]
    return {"selected": {label: s.contracts for label, s in per.items()},
            "report": {"ref": ref, "changed": changed, "selected": "all" if everything else union, "why": why,
                       "subjects": {label: s.as_json() for label, s in per.items()}}}


def zoo_selection(mutants, subject, ref: str, root=SUITE_ROOT) -> tuple:
    """``(selected mutants, zoo.json changed_since)`` for ``smv zoo --changed-since REF``."""
    from contracts.subjects import ours

    sub = subject or ours()
    sel = for_subject(sub, ref, root)
    top = sel.repo or repo_root(root)
    if _is_checkout_subject(sub):  # entries' files are relative to the tree's root, changes to the repo's top
        prefix = os.path.relpath(sub.tree.root, top).replace(os.sep, "/")
        prefix = "" if prefix == "." else prefix + "/"
        code = [f[len(prefix):] for f in sel.changed if f.startswith(prefix)]
        catalogs = []
    else:
        code = sel.changed if sub.name == "ours" else []
        catalogs = [os.path.join(top, f) for f in sel.changed if f.endswith(".toml")]
    picked = select_mutants(mutants, sel, changed_code=code, changed_catalogs=catalogs)
    doc = sel.as_json()
    doc["mutants"] = "all" if len(picked) == len(mutants) and sel.everything else [m.id for m in picked]
    return picked, doc
