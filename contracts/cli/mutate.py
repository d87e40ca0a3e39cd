"""``smv mutate``: a mutation score nobody hand-picked.

cosmic-ray (a maintained mutation tool that rewrites source text, which ``@triton.jit`` kernels need: tools that
wrap functions at run time break them) lists every mutation its operators can make in ``impl/``'s modules; a
seeded sample of them is applied, one at a time, to a temporary copy of the suite's code folders (taken from one
copy per session), and the contracts that cover the mutated module run on it through the zoo's subprocess audit
(``contracts.zoo.runner.AuditRun``: ci profile, generated cases only, every target, each row to its first failing
case, a time cap per mutant), stopped at the first failed row, the contracts most likely to kill first. A kill is
checked once per row against the unmutated copy (:class:`Baseline`): a row that fails there too kills nothing.

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
import subprocess
import sys
import tempfile
import threading
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

#: how often a running audit's report is read for a failed row (the audit rewrites audit.json after every row)
POLL_SECONDS = 0.5
#: set by :func:`stop_all` (SIGTERM, the session's budget): no mutant starts and the running audits are killed;
#: ``_STOP_WHY[0]`` says why (``budget``: a cut mutant is recorded as ``error``; anything else: not recorded)
_STOP = threading.Event()
_STOP_WHY = [""]
_LIVE: "set[subprocess.Popen]" = set()
_LIVE_LOCK = threading.Lock()


@dataclass
class AuditOutcome:
    """What one mutant's audit subprocess left: its exit code (None when stopped here), the tail of its output, the
    rows of its audit.json (None when it wrote none) and why it was stopped (``first-fail``: a row failed, so the
    rows after it were not run; ``timeout``: the cap ran out; ``interrupted``: the session was stopped)."""
    returncode: "int | None"
    output: str
    rows: "list | None"
    stopped: str = ""


def stop_all(why: str = "signal") -> None:
    """Stop the session: no further mutant starts and every running audit's process group is killed."""
    _STOP_WHY[0] = _STOP_WHY[0] or why
    _STOP.set()
    with _LIVE_LOCK:
        for p in list(_LIVE):
            _kill_group(p)


def _kill_group(p: "subprocess.Popen") -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_rows(path: Path) -> "list | None":
    try:
        return json.loads(path.read_text())["results"]
    except (OSError, ValueError, KeyError):  # not written yet (the audit writes it atomically after each row)
        return None


def watch(cmd: list, *, env: dict, cwd: Path, report: Path, timeout: float) -> AuditOutcome:
    """Run ``cmd`` (an audit writing ``report/audit.json`` after every row) in its own process group and stop it
    at the first failed row: a kill needs one failing row, and the rows after it cost a survivor's time."""
    log = Path(cwd) / "audit-output.txt"
    deadline, seen = time.monotonic() + timeout, 0.0
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        with _LIVE_LOCK:
            _LIVE.add(p)
        stopped = ""
        try:
            while p.poll() is None:
                if _STOP.is_set():
                    stopped = "interrupted"
                elif time.monotonic() > deadline:
                    stopped = "timeout"
                else:
                    m = (report / "audit.json").stat().st_mtime if (report / "audit.json").exists() else 0.0
                    if m != seen:
                        seen = m
                        rows = _read_rows(report / "audit.json") or []
                        stopped = "first-fail" if any(r.get("status") == "fail" for r in rows) else ""
                    if not stopped:
                        time.sleep(POLL_SECONDS)
                        continue
                _kill_group(p)
                p.wait()
                break
            if not stopped and _STOP.is_set() and p.returncode < 0:  # stop_all killed it between two polls
                stopped = "interrupted"
        finally:
            if p.poll() is None:
                _kill_group(p)
            p.wait()
            with _LIVE_LOCK:
                _LIVE.discard(p)
    text = log.read_text(errors="replace")
    return AuditOutcome(None if stopped else p.returncode, text[-4000:], _read_rows(report / "audit.json"),
                        stopped)


def audit_until_fail(report: Path, contracts, targets, *, budget: float, timeout: float, code_root: Path,
                     findings: "str | None", cwd: "Path | None" = None) -> AuditOutcome:
    """The zoo's subprocess audit (``contracts.zoo.runner.AuditRun``: ci profile, generated cases, each row to its
    first failing case) of ``contracts`` in the order given, on ``code_root``, stopped at the first failed row.
    Triton's kernel cache is the snapshot's own (``TRITON_CACHE_DIR``), so a natively compiled kernel of one
    mutant (or of the unmutated code) is never what another mutant runs."""
    from contracts.zoo.runner import AuditRun

    cwd = Path(cwd or code_root)
    run = AuditRun(code_root=code_root, cwd=cwd, findings=findings)
    env = run.env()
    env["TRITON_CACHE_DIR"] = str(cwd / ".triton-cache")
    return watch(run.command(report, contracts, targets, budget), env=env, cwd=cwd, report=report,
                 timeout=timeout)


def order_contracts(contracts, module: str, history: "dict | None", reached=()) -> list[str]:
    """The covering contracts in the order their rows run: those measured running the mutated function
    (``reached``: :func:`reached_by`) first, then those that killed most mutants of ``module``, then most mutants
    anywhere (``history``: :func:`kill_history`), the rest as listed. With the audit stopped at the first failed
    row, a kill costs the rows before it; every covering contract still runs on a survivor."""
    h, reached = history or {}, set(reached)
    return sorted(contracts, key=lambda c: (c not in reached, -h.get((module, c), 0), -h.get(("", c), 0)))


def enclosing_function(source: str, line: int) -> "str | None":
    """The module-level function or class whose text (decorators included) holds ``line``; None at module level."""
    for n in ast.parse(source).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([n.lineno] + [d.lineno for d in n.decorator_list])
            if first <= line <= (n.end_lineno or n.lineno):
                return n.name
    return None


def reached_by(root: Path, module: str, source: str, line: int) -> list[str]:
    """The contracts ``tests/entry_points.json`` (the measured record of which contract ran which impl function,
    tests/test_entry_points.py) saw running the function that holds ``line``; [] where there is no record."""
    name = enclosing_function(source, line)
    try:
        record = json.loads((root / "tests" / "entry_points.json").read_text())["exercised"]
    except (OSError, ValueError, KeyError):
        return []
    return list(record.get(f"{Path(module).stem}.{name}", [])) if name else []


def kill_history(reports=(), catalogs=None, results=(), zoo: bool = True) -> dict:
    """``(module, contract)`` and ``("", contract)`` -> how many mutants that contract killed: the zoo catalogs'
    planted bugs (``file`` -> ``expect``; ``zoo`` False leaves them out), earlier mutate.json reports' ``fired``,
    and ``results`` (this session's)."""
    from contracts.zoo.runner import load_catalogs

    h: dict = {}

    def add(module, fired):
        for c in fired:
            h[(module, c)] = h.get((module, c), 0) + 1
            h[("", c)] = h.get(("", c), 0) + 1
    for m in (load_catalogs(catalogs) if zoo else ()):
        add(m.file, m.expect)
    for path in reports:
        for r in json.loads(Path(path).read_text()).get("results", []):
            add(r.get("module", ""), r.get("fired") or [])
    for r in results:
        add(r.module, r.fired)
    return h


class Baseline:
    """The unmutated code's verdict per (contract, target) row, measured once per session when a mutant's kill
    rests on that row: a row that fails without any mutant kills nothing (a contract broken by a change in progress,
    or a finding not yet recorded), so its contract is left out of every mutant's audit from then on."""

    def __init__(self, root: Path, cap: float, findings: "str | None"):
        self.root, self.cap, self.findings = root, cap, findings
        self.rows: dict = {}
        self.broken: dict = {}  # contract -> why it is left out
        self._lock = threading.Lock()
        self._pending: dict = {}

    def fails(self, contract: str, target: str) -> bool:
        key = (contract, target)
        with self._lock:
            ev, owner = self._pending.get(key), False
            if key not in self.rows and ev is None:
                ev, owner = self._pending.setdefault(key, threading.Event()), True
        if owner:
            status = "error"
            try:
                status = self._measure(contract, target)
            finally:
                with self._lock:
                    self.rows[key] = status
                ev.set()
        elif ev is not None:
            ev.wait()
        return self.rows.get(key) == "fail"

    def _measure(self, contract: str, target: str) -> str:
        tmp = Path(tempfile.mkdtemp(prefix="smv-mutate-baseline-"))
        try:
            out = audit_until_fail(tmp / "report", [contract], [target], budget=audit_budget(self.cap),
                                   timeout=self.cap, code_root=self.root, findings=self.findings, cwd=tmp)
            rows = [r for r in out.rows or [] if (r["contract"], r["target"]) == (contract, target)]
            return rows[0]["status"] if rows else ("interrupted" if out.stopped == "interrupted" else "error")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def void(self, rows: list) -> "list[str] | None":
        """The contracts of ``rows`` (failed rows of one mutant) when every one of them fails without the mutant
        too (they are left out from now on), [] when the kill stands, None when the session was stopped before the
        unmutated rows were measured (no verdict)."""
        failed = [(r["contract"], r["target"]) for r in rows if r["status"] == "fail"]
        if not failed or any(not self.fails(c, t) for c, t in failed):
            if any(self.rows.get(k) == "interrupted" for k in failed):
                return None
            return []
        with self._lock:
            for c, t in failed:
                self.broken.setdefault(c, f"{c} fails on {t} without the mutant")
        return sorted({c for c, _ in failed})


def run_one(site: Site, source: str, mutated: str, contracts: list[str], *, root: Path, cap: float,
            targets=None, findings: str | None = None, keep: bool = False,
            baseline: "Baseline | None" = None) -> MutantResult:
    """Audit ``contracts`` (in that order) on a temporary copy of the code folders with ``site``'s module replaced by
    ``mutated``, stopping at the first failed row; with ``baseline`` a kill resting only on rows that fail without
    the mutant is void: those contracts are left out and the audit runs again."""
    from contracts.zoo.runner import _copy_tree, _findings_file
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
        return _judge_on(res, tmp, list(targets or TARGET_NAMES), cap, findings, baseline)
    finally:
        res.seconds = time.monotonic() - t0
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def _judge_on(res: MutantResult, tmp: Path, targets: list, cap: float, findings, baseline) -> MutantResult:
    """The audits of one mutant's snapshot ``tmp``: again without the contracts a void kill names, until the
    verdict stands or no contract is left; ``cap`` is for all of them together."""
    deadline = time.monotonic() + cap
    for _ in range(len(res.contracts) + 1):
        left_out = dict(baseline.broken) if baseline else {}
        todo = [c for c in res.contracts if c not in left_out]
        note = f" (left out, failing without any mutant: {', '.join(sorted(left_out))})" if left_out else ""
        if not todo:
            res.status, res.fired = "error", []
            res.detail = f"every covering contract fails without the mutant{note}"
            return res
        shutil.rmtree(tmp / "report", ignore_errors=True)
        left = max(1.0, deadline - time.monotonic())
        out = audit_until_fail(tmp / "report", todo, targets, budget=audit_budget(left), timeout=left,
                               code_root=tmp, findings=findings)
        judge(res, out, cap, todo)
        void = [] if res.status != "killed" or baseline is None or out.rows is None else baseline.void(out.rows)
        if void is None:  # stopped while the unmutated rows ran: the kill is unconfirmed
            return judge(res, AuditOutcome(None, "", None, "interrupted"), cap, todo)
        if not void:
            res.detail += note
            return res
    return res


def judge(res: MutantResult, out: AuditOutcome, cap: float, ran=None) -> MutantResult:
    """``res`` with the verdict ``out`` (the audit of the contracts ``ran``, default all of ``res.contracts``) gives;
    ``interrupted`` (the session was stopped by a signal) is never recorded."""
    ran = list(res.contracts if ran is None else ran)
    rows, tail = out.rows or [], " | ".join(out.output.strip().splitlines()[-3:])
    res.fired = sorted({r["contract"] for r in rows if r["status"] == "fail"})
    if res.fired:
        first = next(r for r in rows if r["status"] == "fail")
        res.status = "killed"
        res.detail = f"{first['contract']} on {first['target']}: {first['reason'][:200]}"
    elif out.stopped == "interrupted" and _STOP_WHY[0] == "budget":
        res.status, res.detail = "error", "not judged: the session's --budget ran out while it ran"
    elif out.stopped == "interrupted":
        res.status, res.detail = "interrupted", "the session was stopped while this mutant ran"
    elif out.stopped == "timeout":
        res.status, res.detail = "timeout", f"time cap of {cap:.0f}s ran out"
    elif out.returncode is not None and out.returncode < 0:
        res.status, res.fired = "killed", ran
        res.detail = f"crash: the contract run died with signal {signal.Signals(-out.returncode).name}"
    elif out.rows is None:
        # the mutated code does not import or the run died: a kill only when the traceback runs through it
        if res.module in out.output or any(s in tail for s in ("Segmentation", "core dumped")):
            res.status, res.fired = "killed", ran
            res.detail = f"crash: no audit report (exit {out.returncode}): {tail[:300]}"
        else:
            res.detail = f"no audit report (exit {out.returncode}): {tail[:300]}"
    else:
        bad = [f"{r['contract']}/{r['target']}: {r['status']} ({r['reason'][:120]})" for r in rows
               if r["status"] in ("error", "incomplete")]
        if bad:
            res.status, res.detail = "error", "; ".join(bad)[:400]
        elif all(r["status"] == "skipped" for r in rows):
            res.status, res.detail = "error", "every covering row was skipped"
        else:
            res.status = "survived"
            res.detail = f"{', '.join(ran)} passed with the mutant applied"
    return res


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
                operators: str = "all", budget: "float | None" = None, history=()) -> dict:
    """Sample ``sample`` mutants (``seed``) of the ``operators`` families over ``modules`` (default ``impl/*.py``)
    and judge each, ``jobs`` at once; with ``report`` ``DIR/mutate.json`` is rewritten after every mutant, so a
    killed session keeps what it judged. ``budget`` (seconds): the session's end; the audits still running then are
    stopped (``error``: not judged) and the mutants not started stay out (``complete`` false). ``history``: earlier
    mutate.json reports whose kills order the covering contracts (:func:`order_contracts`). ``commit`` names the
    code's commit where ``root`` is an exported snapshot rather than a checkout."""
    from contracts.zoo.runner import default_root

    _STOP.clear()
    _STOP_WHY[0] = ""
    root = Path(root) if root else default_root()
    modules = list(modules) if modules else impl_modules(root)
    t0 = time.monotonic()
    snap = Path(tempfile.mkdtemp(prefix="smv-mutate-session-"))
    try:
        return _session(sample, seed, root, snap, modules, cap, report, equivalents, cmap, targets, jobs, progress,
                        findings, commit, operators, budget, history, t0)
    finally:
        shutil.rmtree(snap, ignore_errors=True)


def _session(sample, seed, root, snap, modules, cap, report, equivalents, cmap, targets, jobs, progress, findings,
             commit, operators, budget, history, t0) -> dict:
    """:func:`run_session` on ``snap``, the session's one copy of the code folders: every mutant's copy and the
    baseline come from it, so the code judged does not change under a session however long it runs."""
    from contracts.zoo.runner import _copy_tree, _findings_file

    _copy_tree(root, snap)
    fams = families_of(operators)
    sites = enumerate_sites(snap, modules, operators)
    equiv = load_equivalents(equivalents) if not isinstance(equivalents, dict) else equivalents
    cmap = cmap if cmap is not None else contract_map(snap)
    sources = {m: (snap / m).read_text() for m in modules}
    findings = findings if findings is not None else _findings_file()
    baseline = Baseline(snap, mutant_cap(cap, 1), findings)
    picked = pick(sites, sources, sample, seed, fams)
    head = {"schema_version": MUTATE_SCHEMA_VERSION, "tool": _tool_version(fams), "operators": fams,
            "seed": seed, "sample": sample,
            "population": len(sites), "commit": commit or _commit(root), "cap": cap, "modules": modules,
            "contract_map": {m: cmap.get(m, []) for m in modules}}
    results: list[MutantResult | None] = [None] * len(picked)
    base_history = kill_history(history)
    lock = threading.Lock()
    state = {"finished": 0, "skipped": 0}

    def one(k: int) -> None:
        site, mutated = picked[k]
        line, before, after = changed_lines(sources[site.module], mutated)
        mid = mutant_id(site.module, site.operator, before, after)
        covering = cmap.get(site.module, [])
        if _STOP.is_set():
            with lock:
                state["skipped"] += 1
            return
        if mid in equiv:
            r = MutantResult(mid, site.module, site.operator, site.occurrence, line, before, after, "equivalent",
                             covering, detail=equiv[mid]["why"])
        else:
            with lock:
                h = kill_history(results=[x for x in results if x is not None], zoo=False)
            h = {key: base_history.get(key, 0) + h.get(key, 0) for key in set(base_history) | set(h)}
            reached = reached_by(root, site.module, sources[site.module], line)
            r = run_one(site, sources[site.module], mutated, order_contracts(covering, site.module, h, reached),
                        root=snap, cap=cap, targets=targets, findings=findings, baseline=baseline)
            if r.status == "interrupted":
                return
        with lock:
            results[k] = r
            state["finished"] += 1
            _write(report, head, results, fams, t0, False)
            if progress:
                progress(state["finished"], len(picked), r)

    _write(report, head, results, fams, t0, False)
    _run_all(one, len(picked), jobs, None if budget is None else budget - (time.monotonic() - t0))
    complete = all(r is not None for r in results)
    doc = _write(report, head, results, fams, t0, complete)
    return {**doc, "not_started": state["skipped"]}


def _run_all(one, n: int, jobs: int, budget: "float | None") -> None:
    """``one(k)`` for k < n, ``jobs`` at once (threads: each waits on its audit subprocess); ``budget`` seconds on,
    :func:`stop_all` ends the session."""
    from concurrent.futures import ThreadPoolExecutor

    timer = threading.Timer(max(0.0, budget), stop_all, ("budget",)) if budget is not None else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        if jobs <= 1:
            for k in range(n):
                one(k)
        else:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                list(pool.map(one, range(n)))
    finally:
        if timer:
            timer.cancel()


def pick(sites: list[Site], sources: dict, sample: int, seed: int, fams) -> list[tuple[Site, str]]:
    """The first ``sample`` sites in :func:`sample_order` whose mutation changes the source, with that source."""
    picked: list[tuple[Site, str]] = []
    for i in sample_order(sites, seed, fams):
        if len(picked) >= sample:
            break
        s = sites[i]
        mutated = mutated_source(sources[s.module], s)
        if mutated is not None and mutated != sources[s.module]:
            picked.append((s, mutated))
    return picked


def _write(report, head: dict, results: list, fams, t0: float, complete: bool) -> dict:
    """The session's document so far; written atomically to ``report/mutate.json`` when ``report`` is given."""
    from contracts.engine.reports import write_json

    done = [r for r in results if r is not None]
    doc = {**head, **summarize(done), "families": by_family(done, fams), "complete": complete,
           "judged": len(done), "seconds": round(time.monotonic() - t0, 2), "results": [r.as_json() for r in done]}
    if report is not None:
        write_json(os.path.join(str(report), "mutate.json"), doc)
    return doc


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


def triage_lines(doc: dict, equiv: dict) -> list[str]:
    """Every mutant of a mutate.json document left for a reader (survived, timeout, error): its status, operator,
    file:line, the diff, and whether ``equiv`` (the equivalents file) records it equivalent, with why."""
    out = []
    for r in doc.get("results", []):
        if r["status"] not in ("survived", "timeout", "error"):
            continue
        e = equiv.get(r["id"])
        out.append(f"{r['status']} {r['id']}  {r['operator']}  {r['module']}:{r['line']}  "
                   + (f"recorded equivalent: {e['why'][:100]}" if e else "not recorded equivalent"))
        out += [f"    - {x}" for x in r["before"].splitlines()] + [f"    + {x}" for x in r["after"].splitlines()]
        if r["status"] != "survived":
            out.append(f"    ({r['detail'][:160]})")
    return out


def main_cli(args) -> int:
    """The handler of ``smv mutate`` (exit 0 when nothing survived, 1 when a mutant survived, 2 for misuse)."""
    if getattr(args, "triage", None):
        doc = json.loads(Path(args.triage).read_text())
        lines = triage_lines(doc, load_equivalents(args.equivalents))
        print("\n".join(lines) if lines else "nothing survived, timed out or errored")
        return 0

    def on_term(signum, _frame):  # the results so far are on disk already: stop the audits, let finally-blocks clean
        stop_all()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)

    def progress(i, n, r):
        if not args.no_progress:
            print(progress_line(i, n, r), file=sys.stderr, flush=True)

    doc = run_session(args.sample, seed=args.seed, modules=args.module, cap=args.cap, report=args.report,
                      equivalents=args.equivalents, jobs=args.jobs, progress=progress, targets=args.target,
                      operators=getattr(args, "operators", "all"), budget=getattr(args, "budget", None),
                      history=getattr(args, "history", None) or ())
    print(f"mutation score {doc['score']}: {doc['killed']} killed, {doc['survived']} survived, "
          f"{doc['equivalent']} equivalent, {doc['timeout']} timeout, {doc['error']} error, "
          f"{doc['incompetent']} incompetent, {doc['uncovered']} uncovered of {doc['judged']} sampled "
          f"(population {doc['population']}, seed {doc['seed']}, commit {doc['commit']}) in {doc['seconds']:.0f}s"
          + (f"; {doc['not_started']} not started within the budget" if doc.get("not_started") else ""))
    for f, c in doc["families"].items():
        print(f"  {f}: score {c['score']}, {c['killed']} killed, {c['survived']} survived, {c['equivalent']} "
              f"equivalent, {c['timeout']} timeout, {c['error']} error, {c['incompetent']} incompetent")
    for line in triage_lines(doc, load_equivalents(args.equivalents)):
        print("  " + line)
    if args.report:
        print(f"report: {os.path.join(args.report, 'mutate.json')}")
    return 1 if doc["survived"] else 0
