"""``smv mutate``: a mutation score nobody hand-picked.

cosmic-ray (a maintained mutation tool that rewrites source text, which ``@triton.jit`` kernels need: tools that
wrap functions at run time break them) lists every mutation its operators can make in ``impl/``'s modules; a
seeded sample of them is applied, one at a time, to a temporary copy of the suite's code folders, and the contracts
that cover the mutated module run on it through the zoo's subprocess audit (``contracts.zoo.runner._audit``: ci
profile, generated cases only, every target, a time cap per mutant).

Verdicts per mutant: ``killed`` (a covering contract's row failed, or the run crashed), ``survived`` (every covering
contract passed), ``equivalent`` (listed in ``contracts/cli/mutate_equivalent.toml`` with why: not run, not scored),
``timeout`` (the cap ran out), ``error`` (no verdict: a row errored or no report), ``incompetent`` (the mutated
source does not compile), ``uncovered`` (no contract maps to the module). ``score = killed / (killed + survived)``.

The module -> contracts map is derived, never hand-kept: the zoo catalogs' ``file`` -> ``expect``, the families each
contract module reaches through its subject (``theirs.decode.plan_decode`` -> ``impl/decode.py``), the impl modules
a contract module imports (``impl.targets`` and ``impl.runtime`` aside: every one does), and the contracts of every
impl module that imports it (transitively: a helper's code runs inside its callers).
"""
from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

#: 2: top-level ``operators`` (the families sampled) and ``families`` (the summary per family) were added
MUTATE_SCHEMA_VERSION = 2
#: the operator families ``--operators`` picks from: cosmic-ray's default set, and ours for Triton code
FAMILIES = ("cosmic-ray", "triton")
DEFAULT_CAP = 90.0
EQUIVALENT_FILE = Path(__file__).resolve().parent / "mutate_equivalent.toml"
#: impl modules every contract module imports for plumbing: an import of them says nothing about coverage
_PLUMBING = {"targets", "runtime"}


@dataclass
class Site:
    """One mutation cosmic-ray can make: ``operator``'s ``occurrence``-th position in ``module``."""
    module: str  # relative to the root: impl/decode.py
    operator: str
    occurrence: int
    line: int

    @property
    def key(self) -> str:
        return f"{self.module}:{self.operator}:{self.occurrence}"


@dataclass
class MutantResult:
    id: str
    module: str
    operator: str
    occurrence: int
    line: int
    before: str
    after: str
    status: str
    contracts: list[str] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    seconds: float = 0.0
    detail: str = ""

    def as_json(self) -> dict:
        return {"id": self.id, "module": self.module, "operator": self.operator, "occurrence": self.occurrence,
                "line": self.line, "before": self.before, "after": self.after, "status": self.status,
                "contracts": self.contracts, "fired": self.fired, "seconds": round(self.seconds, 2),
                "detail": self.detail}


# --- the mutations: cosmic-ray's operators ------------------------------------------------------------------------

def _operators():
    """cosmic-ray's operator instances (those taking no arguments: its default set), as (name, instance)."""
    import cosmic_ray.plugins

    out = []
    for name in cosmic_ray.plugins.operator_names():
        cls = cosmic_ray.plugins.get_operator(name)
        if not cls.arguments():
            out.append((name, cls()))
    return out


def impl_modules(root: Path, folder: str = "impl") -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / folder).glob("*.py") if p.name != "__init__.py")


def family(operator: str) -> str:
    """``triton`` for ``triton/...`` operators (``contracts.cli.mutate_triton``), else ``cosmic-ray``."""
    return "triton" if operator.startswith("triton/") else "cosmic-ray"


def families_of(operators: str) -> list[str]:
    """``--operators``: ``all``, or one family."""
    if operators == "all":
        return list(FAMILIES)
    if operators not in FAMILIES:
        raise ValueError(f"--operators: expected all, {' or '.join(FAMILIES)}, got {operators!r}")
    return [operators]


def enumerate_sites(root: Path, modules: list[str], operators: str = "cosmic-ray") -> list[Site]:
    """Every (module, operator, occurrence) of the ``operators`` families: cosmic-ray's in the order ``cosmic-ray
    init`` numbers occurrences in (so ``occurrence`` means the same to its ``mutate_code``), then ours, by module."""
    fams = families_of(operators)
    sites = _cosmic_ray_sites(root, modules) if "cosmic-ray" in fams else []
    if "triton" in fams:
        from contracts.cli import mutate_triton

        for mod in modules:
            sites += [Site(mod, op, occ, line) for op, occ, line in mutate_triton.positions((root / mod).read_text())]
    return sites


def _cosmic_ray_sites(root: Path, modules: list[str]) -> list[Site]:
    from cosmic_ray.ast import ast_nodes, get_ast_from_path

    ops = _operators()
    sites = []
    for mod in modules:
        tree = get_ast_from_path(root / mod)
        nodes = list(ast_nodes(tree))
        for name, op in ops:
            occ = 0
            for node in nodes:
                for start, _end in op.mutation_positions(node):
                    sites.append(Site(mod, name, occ, start[0]))
                    occ += 1
    return sites


def mutated_source(source: str, site: Site) -> str | None:
    if family(site.operator) == "triton":
        from contracts.cli import mutate_triton

        return mutate_triton.apply(source, site.operator, site.occurrence)
    import cosmic_ray.plugins
    from cosmic_ray.mutating import mutate_code

    return mutate_code(source, cosmic_ray.plugins.get_operator(site.operator)(), site.occurrence)


def changed_lines(before: str, after: str) -> tuple[int, str, str]:
    """(first changed line, the original lines, the mutated lines) of a one-site mutation."""
    a, b = before.splitlines(), after.splitlines()
    sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            return i1 + 1, "\n".join(x.strip() for x in a[i1:i2]), "\n".join(x.strip() for x in b[j1:j2])
    return 0, "", ""


def mutant_id(module: str, operator: str, before: str, after: str) -> str:
    """Stable across edits elsewhere in the module: the module, the operator and the changed text."""
    digest = hashlib.sha1(f"{module}\0{operator}\0{before}\0{after}".encode()).hexdigest()[:10]
    return f"{Path(module).stem}-{digest}"


# --- equivalents ---------------------------------------------------------------------------------------------------

def load_equivalents(path: "str | Path | None" = None) -> dict[str, dict]:
    """``[[equivalent]]`` entries (``module``, ``operator``, ``before``, ``after``, ``why``) keyed by mutant id."""
    path = Path(path) if path else EQUIVALENT_FILE
    if not path.is_file():
        return {}
    with open(path, "rb") as fh:
        doc = tomllib.load(fh)
    out = {}
    for i, e in enumerate(doc.get("equivalent", [])):
        missing = [k for k in ("module", "operator", "before", "after", "why") if not str(e.get(k, "")).strip()]
        if missing:
            raise ValueError(f"{path}: equivalent #{i + 1} lacks {', '.join(missing)}")
        out[mutant_id(e["module"], e["operator"], e["before"].strip(), e["after"].strip())] = e
    return out


# --- module -> contracts -------------------------------------------------------------------------------------------

def _impl_imports(path: Path, names: set[str]) -> set[str]:
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module:
            if n.module == "impl":
                out |= {a.name for a in n.names if a.name in names}
            elif n.module.startswith("impl."):
                out.add(n.module.split(".")[1])
            elif n.level and n.module in names:  # from .x import y inside impl
                out.add(n.module)
        elif isinstance(n, ast.Import):
            out |= {a.name.split(".")[1] for a in n.names if a.name.startswith("impl.")}
    return out & names


def declared_contracts(root: Path) -> dict[str, set[str]]:
    """contract module -> the ids its ``@contract(...)`` decorators declare, read from the source (importing every
    contract module costs seconds; the registry's module list is all that is imported)."""
    from contracts.registry import CONTRACT_MODULES

    out: dict[str, set[str]] = {}
    for mod in CONTRACT_MODULES:
        src = root / (mod.replace(".", "/") + ".py")
        if not src.is_file():
            continue
        tree = ast.parse(src.read_text())
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                  for t in n.targets if isinstance(t, ast.Name)}
        for n in ast.walk(tree):
            for d in getattr(n, "decorator_list", ()):
                if isinstance(d, ast.Call) and getattr(d.func, "id", getattr(d.func, "attr", "")) == "contract" \
                        and d.args:
                    a = d.args[0]
                    cid = a.value if isinstance(a, ast.Constant) else consts.get(getattr(a, "id", ""))
                    if isinstance(cid, str):
                        out.setdefault(mod, set()).add(cid)
    return out


def contract_map(root: Path, catalogs=None) -> dict[str, list[str]]:
    """``impl/<m>.py`` -> the contract ids that cover it (see the module docstring for how it is derived)."""
    from contracts.zoo.runner import load_catalogs

    names = {Path(m).stem for m in impl_modules(root)}
    cover: dict[str, set[str]] = {n: set() for n in names}
    for m in load_catalogs(catalogs):
        stem = Path(m.file).stem
        if m.file.startswith("impl/") and stem in cover:
            cover[stem] |= set(m.expect)
    by_module = declared_contracts(root)
    for mod, ids in by_module.items():
        src = root / (mod.replace(".", "/") + ".py")
        if not src.is_file():
            continue
        tree = ast.parse(src.read_text())
        fams = {n.value.attr for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr in names}
        fams |= _impl_imports(src, names) - _PLUMBING
        # entry points named as strings ("codec_kernels.fp8_decode_triton"), which the subject resolves at run time
        fams |= {n.value.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 and re.fullmatch(r"[a-z_0-9]+\.[A-Za-z_0-9]+", n.value) and n.value.split(".")[0] in names}
        for f in fams:
            cover[f] |= ids
    # a module's code also runs inside every impl module that imports it (transitively): their contracts judge it
    # too (a helper's masked-load fill is seen only by the kernels that call it)
    importers: dict[str, set[str]] = {n: set() for n in names}
    for n in names:
        for dep in _impl_imports(root / "impl" / f"{n}.py", names):
            importers[dep].add(n)
    direct = {n: set(ids) for n, ids in cover.items()}
    for n in sorted(names):
        seen, todo = set(), list(importers[n])
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            cover[n] |= direct[x]
            todo += importers[x]
    return {f"impl/{n}.py": sorted(ids) for n, ids in sorted(cover.items())}


def mutant_cap(cap: float, n_contracts: int) -> float:
    """A mutant's time cap: ``cap`` for up to 4 covering contracts, growing in proportion beyond (a helper module
    that 20 contracts cover gets 5 x ``cap``: their rows share the audit's budget)."""
    return cap * max(1.0, n_contracts / 4)


def audit_budget(cap: float) -> float:
    """The audit's own budget within a mutant's time cap: what is left after ~25 s for the subprocess to import
    torch and Triton and write its report, and never under the zoo's share (60 %)."""
    return max(cap - 25.0, cap * 0.6, 5.0)


# --- running one mutant -------------------------------------------------------------------------------------------

def run_one(site: Site, source: str, mutated: str, contracts: list[str], *, root: Path, cap: float,
            targets=None, findings: str | None = None, keep: bool = False) -> MutantResult:
    """Audit ``contracts`` on a temporary copy of the code folders with ``site``'s module replaced by
    ``mutated``."""
    from contracts.zoo.runner import _audit, _copy_tree, _findings_file
    from impl.targets import TARGET_NAMES

    line, before, after = changed_lines(source, mutated)
    res = MutantResult(mutant_id(site.module, site.operator, before, after), site.module, site.operator,
                       site.occurrence, line or site.line, before, after, "error", list(contracts))
    t0 = time.monotonic()
    try:
        compile(mutated, site.module, "exec")
    except SyntaxError as exc:
        res.status, res.detail = "incompetent", f"the mutated source does not compile: {exc.msg}"
        return res
    if not contracts:
        res.status, res.detail = "uncovered", "no contract maps to this module"
        return res
    findings = findings if findings is not None else _findings_file()
    cap = mutant_cap(cap, len(contracts))
    tmp = Path(tempfile.mkdtemp(prefix=f"smv-mutate-{res.id}-"))
    try:
        _copy_tree(root, tmp)
        (tmp / site.module).write_text(mutated)
        try:
            proc = _audit(tmp / "report", contracts, list(targets or TARGET_NAMES), budget=audit_budget(cap),
                          timeout=cap, code_root=tmp, cwd=tmp, findings=findings)
        except __import__("subprocess").TimeoutExpired:
            res.status, res.detail = "timeout", f"time cap of {cap:.0f}s ran out"
            return res
        tail = " | ".join((proc.stderr or proc.stdout or "").strip().splitlines()[-3:])
        if proc.returncode < 0:
            res.status, res.fired = "killed", list(contracts)
            res.detail = f"crash: the contract run died with signal {signal.Signals(-proc.returncode).name}"
            return res
        audit = tmp / "report" / "audit.json"
        if not audit.is_file():
            # the mutated code does not import or the run died: a kill only when the traceback runs through it
            if site.module in (proc.stderr or "") or any(s in tail for s in ("Segmentation", "core dumped")):
                res.status, res.fired = "killed", list(contracts)
                res.detail = f"crash: no audit report (exit {proc.returncode}): {tail[:300]}"
            else:
                res.detail = f"no audit report (exit {proc.returncode}): {tail[:300]}"
            return res
        rows = json.loads(audit.read_text())["results"]
        res.fired = sorted({r["contract"] for r in rows if r["status"] == "fail"})
        if res.fired:
            first = next(r for r in rows if r["status"] == "fail")
            res.status = "killed"
            res.detail = f"{first['contract']} on {first['target']}: {first['reason'][:200]}"
            return res
        bad = [f"{r['contract']}/{r['target']}: {r['status']} ({r['reason'][:120]})" for r in rows
               if r["status"] in ("error", "incomplete")]
        if bad:
            res.status, res.detail = "error", "; ".join(bad)[:400]
        elif all(r["status"] == "skipped" for r in rows):
            res.status, res.detail = "error", "every covering row was skipped"
        else:
            res.status = "survived"
            res.detail = f"{', '.join(contracts)} passed with the mutant applied"
        return res
    finally:
        res.seconds = time.monotonic() - t0
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


# --- the session --------------------------------------------------------------------------------------------------

def summarize(results: list[MutantResult]) -> dict:
    counts = {s: sum(r.status == s for r in results)
              for s in ("killed", "survived", "equivalent", "timeout", "error", "incompetent", "uncovered")}
    judged = counts["killed"] + counts["survived"]
    return {"score": round(counts["killed"] / judged, 4) if judged else None, **counts}


def by_family(results: list[MutantResult], fams) -> dict:
    """``summarize`` per operator family sampled."""
    return {f: summarize([r for r in results if family(r.operator) == f]) for f in fams}


def sample_order(sites: list[Site], seed: int, fams) -> list[int]:
    """The order sites are drawn in: each family's sites shuffled by ``random.Random(seed)`` (cosmic-ray's alone
    draw exactly as before the Triton operators came), then the families taken in turn, so a sample of ``all``
    holds as many Triton mutants as cosmic-ray ones (while both last) instead of ~2 % of them."""
    per = []
    for f in fams:
        idx = [i for i, s in enumerate(sites) if family(s.operator) == f]
        random.Random(seed).shuffle(idx)
        per.append(idx)
    order = []
    for k in range(max((len(p) for p in per), default=0)):
        order += [p[k] for p in per if k < len(p)]
    return order


def _commit(root: Path) -> str:
    from contracts.engine.reports import git_commit

    head, dirty = git_commit(str(root))
    return "unknown (not a checkout)" if head is None else head + (" (dirty)" if dirty else "")


def run_session(sample: int, *, seed: int = 0, root: "Path | None" = None, modules=None, cap: float = DEFAULT_CAP,
                report: "str | Path | None" = None, equivalents=None, cmap=None, targets=None, jobs: int = 1,
                progress=None, findings: str | None = None, commit: str | None = None,
                operators: str = "all") -> dict:
    """Sample ``sample`` mutants (``seed``) of the ``operators`` families over ``modules`` (default ``impl/*.py``)
    and judge each; with ``report`` ``DIR/mutate.json`` is rewritten after every mutant, so a killed session keeps
    what it judged. ``commit`` names the code's commit where ``root`` is an exported snapshot rather than a
    checkout."""
    from concurrent.futures import ThreadPoolExecutor

    from contracts.engine.reports import write_json
    from contracts.zoo.runner import default_root

    root = Path(root) if root else default_root()
    modules = list(modules) if modules else impl_modules(root)
    t0 = time.monotonic()
    fams = families_of(operators)
    sites = enumerate_sites(root, modules, operators)
    order = sample_order(sites, seed, fams)
    equiv = load_equivalents(equivalents) if not isinstance(equivalents, dict) else equivalents
    cmap = cmap if cmap is not None else contract_map(root)
    sources = {m: (root / m).read_text() for m in modules}
    picked: list[tuple[Site, str]] = []
    for i in order:
        if len(picked) >= sample:
            break
        s = sites[i]
        mutated = mutated_source(sources[s.module], s)
        if mutated is not None and mutated != sources[s.module]:
            picked.append((s, mutated))
    head = {"schema_version": MUTATE_SCHEMA_VERSION, "tool": _tool_version(fams), "operators": fams,
            "seed": seed, "sample": sample,
            "population": len(sites), "commit": commit or _commit(root), "cap": cap, "modules": modules,
            "contract_map": {m: cmap.get(m, []) for m in modules}}
    results: list[MutantResult | None] = [None] * len(picked)

    def write(complete: bool):
        if report is None:
            return
        done = [r for r in results if r is not None]
        write_json(os.path.join(str(report), "mutate.json"),
                   {**head, **summarize(done), "families": by_family(done, fams), "complete": complete,
                    "judged": len(done),
                    "seconds": round(time.monotonic() - t0, 2), "results": [r.as_json() for r in done]})

    import threading

    lock = threading.Lock()
    finished = [0]

    def one(k: int) -> None:
        site, mutated = picked[k]
        line, before, after = changed_lines(sources[site.module], mutated)
        mid = mutant_id(site.module, site.operator, before, after)
        if mid in equiv:
            r = MutantResult(mid, site.module, site.operator, site.occurrence, line, before, after, "equivalent",
                             cmap.get(site.module, []), detail=equiv[mid]["why"])
        else:
            r = run_one(site, sources[site.module], mutated, cmap.get(site.module, []), root=root, cap=cap,
                        targets=targets, findings=findings)
        with lock:
            results[k] = r
            finished[0] += 1
            write(False)
            if progress:
                progress(finished[0], len(picked), r)

    write(False)
    if jobs <= 1:
        for k in range(len(picked)):
            one(k)
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, range(len(picked))))
    write(True)
    done = [r for r in results if r is not None]
    return {**head, **summarize(done), "families": by_family(done, fams), "complete": True, "judged": len(done),
            "seconds": round(time.monotonic() - t0, 2), "results": [r.as_json() for r in done]}


def _tool_version(fams=("cosmic-ray",)) -> str:
    names = []
    if "cosmic-ray" in fams:
        try:
            from importlib.metadata import version

            names.append(f"cosmic-ray {version('cosmic-ray')}")
        except Exception:  # noqa: BLE001 - the version is informative only
            names.append("cosmic-ray")
    if "triton" in fams:
        names.append("smv triton operators")
    return " + ".join(names)


def _window(before: str, after: str, width: int = 48) -> tuple[str, str]:
    """The part of a long changed line around its first differing character."""
    i = next((k for k, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    lo = max(0, i - width // 2)
    return before[lo:lo + width], after[lo:lo + width]


def progress_line(i: int, n: int, r: MutantResult) -> str:
    b, a = _window(r.before, r.after)
    return (f"[{i}/{n}] {r.status:<10} {r.module}:{r.line} {r.operator.split('/')[-1]}  {b!r} -> {a!r}  "
            f"{r.seconds:.1f}s  {r.detail[:100]}")


def main_cli(args) -> int:
    """The handler of ``smv mutate`` (exit 0 when nothing survived, 1 when a mutant survived, 2 for misuse)."""
    def on_term(signum, _frame):  # the results so far are on disk already; let finally-blocks clean up
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)

    def progress(i, n, r):
        if not args.no_progress:
            print(progress_line(i, n, r), file=sys.stderr, flush=True)

    doc = run_session(args.sample, seed=args.seed, modules=args.module, cap=args.cap, report=args.report,
                      equivalents=args.equivalents, jobs=args.jobs, progress=progress, targets=args.target,
                      operators=getattr(args, "operators", "all"))
    print(f"mutation score {doc['score']}: {doc['killed']} killed, {doc['survived']} survived, "
          f"{doc['equivalent']} equivalent, {doc['timeout']} timeout, {doc['error']} error, "
          f"{doc['incompetent']} incompetent, {doc['uncovered']} uncovered of {doc['judged']} sampled "
          f"(population {doc['population']}, seed {doc['seed']}, commit {doc['commit']}) in {doc['seconds']:.0f}s")
    for f, c in doc["families"].items():
        print(f"  {f}: score {c['score']}, {c['killed']} killed, {c['survived']} survived, {c['equivalent']} "
              f"equivalent, {c['timeout']} timeout, {c['error']} error, {c['incompetent']} incompetent")
    for r in doc["results"]:
        if r["status"] == "survived":
            print(f"  survived {r['id']}  {r['module']}:{r['line']}  {r['before'][:60]!r} -> {r['after'][:60]!r}")
    if args.report:
        print(f"report: {os.path.join(args.report, 'mutate.json')}")
    return 1 if doc["survived"] else 0
