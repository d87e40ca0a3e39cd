"""``smv zoo``: apply each planted bug to a temporary copy of the code under test and prove its contracts fire.

Each mutant runs ``smv audit`` for its expected contracts in its own subprocess (Triton caches and module state stay
isolated) with a time cap. Verdicts: killed / survived / stale / error (DESIGN.md "Interfaces").

On the subject ``ours`` the copy is of the suite's code folders (``file`` is relative to the suite's root). On another
subject (``smv zoo --subject vllm==0.33.0``) ``file`` is relative to the subject's tree: the audited modules (and the
tree's version files) are copied into a temporary tree, the bug is planted there, and the audit runs with
``--subject vllm@<that tree>``. A kill is an expected contract's row ``fail``; a row whose violations are all known
findings (``known``) is no kill, so the known findings file is handed to the subprocess.

An upstream catalog entry may name the release its code came in (``since = "0.34.0"``). Planted into an older
subject, where its ``find`` is absent, it is not run: its status stays ``stale`` (zoo.json keeps its four statuses)
with a ``detail`` that starts with ``skipped:`` and names the subject's release and the entry's (see
:func:`release_skip`); such an entry fails no command and is left out of the kill rate.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from impl.targets import TARGET_NAMES

CODE_FOLDERS = ("impl", "oracles", "contracts", "fuzz")
CATALOG_DIR = Path(__file__).resolve().parent
#: catalogs of bugs planted into upstream vLLM's source (``smv zoo --subject vllm...`` with no ``--catalog``)
UPSTREAM_CATALOG_DIR = CATALOG_DIR / "upstream"
#: what a copy of a vllm tree keeps besides the audited modules: the files that say its version
SUBJECT_META = ("smv-subject.json", "vllm/_version.py")
DEFAULT_CAP = 90.0
#: a mutant's time cap in a zoo run (:func:`mutant_cap`): at least the user's ``--cap``, and at least
#: ``COST_FACTOR`` x what its expected rows cost on the unpatched tree plus ``STARTUP_FACTOR`` x the measured start
#: of an audit process - both measured by :func:`measure_baseline` on this machine, under its present load, so a
#: slower or busier machine gets longer caps instead of turning kills into ``error``
COST_FACTOR = 3.0
STARTUP_FACTOR = 2.0
_REQUIRED = ("id", "title", "provenance", "file", "find", "replace", "expect", "targets")
#: optional catalog keys: ``since``, the release of the subject (upstream vLLM) whose code the entry plants into
_OPTIONAL = ("since",)
#: how a ``stale`` result's detail starts when the subject predates the entry (no failure: see release_skip)
RELEASE_SKIP_PREFIX = "skipped: "


@dataclass
class Mutant:
    id: str
    title: str
    provenance: str
    file: str
    find: str
    replace: str
    expect: list[str]
    targets: list[str]
    catalog: str = ""
    #: the subject release the entry's code came in ("" when every audited release has it)
    since: str = ""


@dataclass
class MutantResult:
    id: str
    status: str
    expect: list[str]
    fired: list[str] = field(default_factory=list)
    seconds: float = 0.0
    detail: str = ""
    #: a killed mutant's ``{"cases", "seconds", "contract", "target"}`` (``"crash": True`` for a kill by crash);
    #: see :func:`time_to_kill`
    time_to_kill: dict | None = None
    #: the time cap the mutant's audit ran under (seconds; see :func:`mutant_cap`), None when none was started
    cap_seconds: float | None = None

    def as_json(self) -> dict:
        return {"id": self.id, "status": self.status, "expect": self.expect, "fired": self.fired,
                "seconds": round(self.seconds, 2), "detail": self.detail,
                "time_to_kill": None if self.status != "killed" else self.time_to_kill,
                "cap_seconds": None if self.cap_seconds is None else round(self.cap_seconds, 1)}


def time_to_kill(rows: list[dict], expect: list[str]) -> dict | None:
    """A kill's cost from the audit rows' ``first_violation``: for each expected contract its fastest failing row,
    and of those the slowest (the mutant is killed once every expected contract has fired). ``cases`` are the
    row's cases checked up to and including the first failing one, ``seconds`` the row's time until that check
    ended (generation and checking; not the process start, which ``seconds`` of the entry includes)."""
    worst = None
    for c in expect:
        fv = [(r["first_violation"], r) for r in rows
              if r["contract"] == c and r["status"] == "fail" and r.get("first_violation")]
        if not fv:
            return None
        f, r = min(fv, key=lambda x: x[0]["seconds"])
        if worst is None or f["seconds"] > worst["seconds"]:
            worst = {"cases": f["cases"], "seconds": round(f["seconds"], 3), "contract": c, "target": r["target"]}
    return worst


def _crash_time_to_kill(trace: Path, report: Path, launched: float, ended: float) -> dict:
    """A kill by crash: the row and case the run was in (the runner's case trace), ``cases`` counting the case
    that crashed and the row's first pass when it crashed in the second, ``seconds`` the row's time until the
    process ended. A crash before any case (at import) is 0 cases and the seconds since the process started."""
    try:
        tr = json.loads(trace.read_text())
    except (OSError, ValueError):
        return {"cases": 0, "seconds": round(ended - launched, 3), "contract": None, "target": None, "crash": True}
    cases = tr["pinned"] + tr["generated"] + 1
    seconds = max(0.0, ended - tr["started"])
    if tr.get("skip"):  # the second pass: the first pass's row is in the report saved after it
        try:
            rows = json.loads((report / "audit.json").read_text())["results"]
            first = next(r for r in rows if r["contract"] == tr["contract"] and r["target"] == tr["target"])
            cases += first["cases"]
            seconds += first["seconds"]
        except (OSError, ValueError, StopIteration, KeyError):
            cases += tr["skip"]
    return {"cases": cases, "seconds": round(seconds, 3), "contract": tr["contract"], "target": tr["target"],
            "crash": True}


def ttk_summary(results: list[dict]) -> dict:
    """zoo.json's top-level ``time_to_kill``: the median and the worst over the killed entries that measured one."""
    import statistics

    measured = [r for r in results if r.get("status") == "killed" and r.get("time_to_kill")]
    if not measured:
        return {"killed": 0, "median_seconds": None, "worst_seconds": None, "worst": None, "median_cases": None,
                "worst_cases": None}
    secs = [r["time_to_kill"]["seconds"] for r in measured]
    cases = [r["time_to_kill"]["cases"] for r in measured]
    worst = max(measured, key=lambda r: r["time_to_kill"]["seconds"])
    return {"killed": len(measured), "median_seconds": round(statistics.median(secs), 3),
            "worst_seconds": worst["time_to_kill"]["seconds"], "worst": worst["id"],
            "median_cases": statistics.median(cases), "worst_cases": max(cases)}


def default_root() -> Path:
    """The root of the code under test: the folder holding the ``impl`` package that is running."""
    import impl

    return Path(impl.__file__).resolve().parent.parent


def builtin_catalogs(subject=None) -> list[Path]:
    """The catalogs ``smv zoo`` runs with no ``--catalog``: ours, or upstream's for any other subject."""
    if subject is not None and subject.name != "ours":
        return sorted(UPSTREAM_CATALOG_DIR.glob("*.toml"))
    return sorted(CATALOG_DIR.glob("*.toml"))


def subject_root(subject) -> Path:
    """The folder a catalog's ``file`` is relative to for ``subject``."""
    if subject is None or subject.name == "ours":
        return default_root()
    tree = getattr(subject, "tree", None)
    if tree is None:
        raise ValueError(f"subject {subject.label} has no source tree to plant bugs into")
    return Path(tree.root)


def load_catalog(path: "str | Path") -> list[Mutant]:
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ValueError(f"catalog {path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"catalog {path}: not valid TOML: {exc}") from None
    out = []
    for i, m in enumerate(doc.get("mutant", [])):
        missing = [k for k in _REQUIRED if k not in m]
        if missing:
            raise ValueError(f"catalog {path}: mutant #{i + 1} ({m.get('id', '?')}) lacks {', '.join(missing)}")
        if not re.match(r"^[a-z0-9]+(-[a-z0-9]+)*$", m["id"]):
            raise ValueError(f"catalog {path}: mutant id {m['id']!r} must be kebab-case")
        if not m["expect"]:
            raise ValueError(f"catalog {path}: mutant {m['id']} expects no contract")
        bad = [t for t in m["targets"] if t not in TARGET_NAMES]
        if bad or not m["targets"]:
            raise ValueError(f"catalog {path}: mutant {m['id']} has unknown or no targets {bad}")
        unknown = sorted(set(m) - set(_REQUIRED) - set(_OPTIONAL))
        if unknown:
            raise ValueError(f"catalog {path}: mutant {m['id']} has unknown keys {unknown}")
        since = m.get("since", "")
        if since and not re.match(r"^\d+(\.\d+)*$", str(since)):
            raise ValueError(f"catalog {path}: mutant {m['id']}: since must be a release like \"0.34.0\", got "
                             f"{since!r}")
        out.append(Mutant(**{k: m[k] for k in _REQUIRED}, catalog=str(path), since=str(since)))
    return out


def release_skip(m: Mutant, subject, root: "Path | None" = None) -> str:
    """Why ``m`` is not run on ``subject`` ("" when it is): an entry whose code came in release ``m.since``, planted
    into an older subject release whose file lacks its ``find`` (an absent or repeated text in a subject as new as
    the entry stays a plain ``stale``: the catalog needs a look)."""
    if not m.since or subject is None or subject.name == "ours":
        return ""
    from contracts.subjects.vllm.adapters import predates

    if not predates(subject.version, m.since):
        return ""
    src = Path(root or subject_root(subject)) / m.file
    n = src.read_text().count(m.find) if src.is_file() else 0
    if n == 1:
        return ""
    where = f"`find` occurs {n} times in {m.file}" if src.is_file() else f"{m.file} does not exist"
    return (f"{RELEASE_SKIP_PREFIX}{subject.label} predates this mutant's code, which came in {subject.name} "
            f"{m.since} ({where})")


def is_release_skip(result: dict) -> bool:
    """Whether a zoo.json result is an entry skipped for a subject that predates it (:func:`release_skip`)."""
    return result.get("status") == "stale" and str(result.get("detail", "")).startswith(RELEASE_SKIP_PREFIX)


def load_catalogs(paths=None, subject=None) -> list[Mutant]:
    mutants: list[Mutant] = []
    seen: dict[str, str] = {}
    for p in (paths or builtin_catalogs(subject)):
        for m in load_catalog(p):
            if m.id in seen:
                raise ValueError(f"mutant id {m.id!r} appears in {seen[m.id]} and {m.catalog}")
            seen[m.id] = m.catalog
            mutants.append(m)
    return mutants


def _copy_tree(root: Path, dest: Path) -> None:
    for folder in CODE_FOLDERS:
        src = root / folder
        if src.is_dir():
            shutil.copytree(src, dest / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _copy_subject_tree(root: Path, dest: Path, extra: str) -> None:
    """The audited modules of a vllm tree (a fetched tree is just those; a checkout is much more), its version
    files, and ``extra`` (the file a mutant plants into)."""
    from contracts.subjects.vllm.loader import NEEDED

    for rel in dict.fromkeys(tuple(NEEDED) + SUBJECT_META + (extra,)):
        src = root / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / rel)


def _findings_file() -> str | None:
    from contracts.engine.findings import default_path

    return default_path() if os.path.exists(default_path()) else None


@dataclass
class AuditRun:
    """One ``smv audit`` subprocess of the zoo: which code it imports (``code_root``), where it runs (``cwd``),
    under ``vllm@tree`` when given, with the known findings (``findings``; matched against ``findings_root``'s code
    when given) and the runner's case trace file (``trace``, contracts.engine.runner.CASE_TRACE_ENV)."""

    code_root: Path
    cwd: Path
    tree: "Path | None" = None
    findings: "str | None" = None
    trace: "Path | None" = None
    findings_root: "str | Path | None" = None
    #: each row stops at its first failing case, unshrunk (a kill needs no smallest case; shrinking ran past caps)
    first_violation: bool = True

    def command(self, report: Path, contracts, targets, budget: float) -> list:
        cmd = [sys.executable, "-m", "contracts.cli", "audit", "--profile", "ci", "--no-progress", "--generator-only",
               "--max-cases", "0", "--budget", str(budget), "--report", str(report)]
        cmd += ["--first-violation"] if self.first_violation else []
        cmd += ["--subject", f"vllm@{self.tree}"] if self.tree is not None else []
        cmd += ["--findings", str(self.findings)] if self.findings else []
        for c in contracts:
            cmd += ["--contract", c]
        for t in targets:
            cmd += ["--target", t]
        return cmd

    def env(self) -> dict:
        from contracts.engine.findings import CODE_ROOT_ENV
        from contracts.engine.runner import CASE_TRACE_ENV

        env = dict(os.environ)
        env["PYTHONPATH"] = str(self.code_root) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("SMV_TARGET", None)
        if self.trace is not None:
            env[CASE_TRACE_ENV] = str(self.trace)
        if self.findings_root is not None:
            env[CODE_ROOT_ENV] = str(self.findings_root)
        return env

    def run(self, report: Path, contracts, targets, *, budget: float, timeout: float) -> subprocess.CompletedProcess:
        """``smv audit`` of ``contracts`` on ``targets`` in a subprocess (generated cases only, the ci profile's
        derandomized sequence)."""
        return subprocess.run(self.command(report, contracts, targets, budget), cwd=self.cwd, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)


def _audit(report: Path, contracts, targets, *, budget: float, timeout: float, **where) -> subprocess.CompletedProcess:
    """:meth:`AuditRun.run` with the run's fields as keywords (``code_root``, ``cwd``, ``tree``, ...)."""
    return AuditRun(**where).run(report, contracts, targets, budget=budget, timeout=timeout)


@dataclass
class Baseline:
    """The expected contracts' rows on the unpatched tree, and what they cost there (:func:`measure_baseline`)."""
    #: ``(contract, target) -> audit.json row`` of every row measured
    rows: dict = field(default_factory=dict)
    #: why a part of the measurement failed ("" when none did)
    error: str = ""
    #: the longest measured start of an audit process: its wall time less the audit's own ``run.seconds``
    #: (interpreter, imports, the registry, exit); None when no audit finished
    startup: float | None = None
    #: the whole measurement's wall time
    seconds: float = 0.0

    def as_base(self) -> dict:
        """:func:`baseline`'s shape: ``(contract, target) -> row``, or ``{"error": why}``."""
        return {"error": self.error} if self.error else dict(self.rows)

    def cost(self, m: Mutant) -> float | None:
        """What ``m``'s expected rows cost unpatched, in seconds (a row not measured counts as the dearest one
        measured); None when nothing was measured."""
        if self.startup is None or not self.rows:
            return None
        dearest = max(float(r.get("seconds") or 0.0) for r in self.rows.values())
        return sum(float((self.rows.get((c, t)) or {"seconds": dearest}).get("seconds") or 0.0)
                   for c in m.expect for t in m.targets)

    def as_json(self) -> dict:
        return {"seconds": round(self.seconds, 2), "startup_seconds": None if self.startup is None
                else round(self.startup, 2), "rows": len(self.rows),
                "row_seconds": round(sum(float(r.get("seconds") or 0.0) for r in self.rows.values()), 2),
                "error": self.error}


def mutant_cap(m: Mutant, base: "Baseline | None", floor: float = DEFAULT_CAP) -> tuple[float, str]:
    """``m``'s time cap and how it was derived: ``max(floor, COST_FACTOR x its rows' unpatched cost +
    STARTUP_FACTOR x the measured process start)``; ``floor`` (the user's ``--cap``) when nothing was measured."""
    cost = base.cost(m) if base is not None else None
    if cost is None:
        return floor, f"--cap {floor:g}s, no baseline measured"
    derived = COST_FACTOR * cost + STARTUP_FACTOR * base.startup
    why = (f"max(--cap {floor:g}s, {COST_FACTOR:g} x {cost:.1f}s of unpatched rows + {STARTUP_FACTOR:g} x "
           f"{base.startup:.1f}s process start)")
    return max(floor, derived), why


def _row_groups(mutants: list[Mutant]) -> list[tuple[list[str], list[str]]]:
    """The (contracts, targets) audits that cover every mutant's expected rows: contracts needed on the same
    targets share one audit, so no row runs that no mutant expects (an audit runs contracts x targets)."""
    needs: dict[str, set] = {}
    for m in mutants:
        for c in m.expect:
            needs.setdefault(c, set()).update(m.targets)
    groups: dict[tuple, list[str]] = {}
    for c, ts in sorted(needs.items()):
        groups.setdefault(tuple(sorted(ts)), []).append(c)
    return [(cs, list(ts)) for ts, cs in sorted(groups.items(), key=lambda kv: (kv[1], kv[0]))]


def _startup(doc: dict, launched_wall: float, wall: float) -> "float | None":
    """The audit process's start: from launch until the audit began (interpreter, imports, the registry)."""
    run = doc.get("run") or {}
    try:
        from datetime import datetime

        return max(0.0, datetime.fromisoformat(run["started"]).timestamp() - launched_wall)
    except (KeyError, TypeError, ValueError):
        return max(0.0, wall - float(run.get("seconds") or 0.0)) if run.get("finished") else None


def _measure_group(run: "AuditRun", report: Path, contracts: list, targets: list, cap: float, out: "Baseline",
                   lock) -> None:
    """One audit of a group of unpatched rows; its rows and its process start go into ``out``."""
    budget = max(cap * 0.6, 5.0) * max(1.0, len(contracts) * len(targets) / 2)
    # a measurement, not a verdict: its limit is generous (a busy machine is what it measures), and an audit cut
    # short still gives the rows it saved (audit.json is rewritten after every row)
    limit = budget * 4 + 300
    launched, launched_wall = time.monotonic(), time.time()
    proc, why = None, ""
    try:
        proc = run.run(report, contracts, targets, budget=budget, timeout=limit)
    except subprocess.TimeoutExpired:
        why = f"the unpatched subject's audit ran past {limit:.0f}s"
    wall = time.monotonic() - launched
    try:
        doc = json.loads((report / "audit.json").read_text())
    except (OSError, ValueError):
        doc = None
    if doc is None and not why:
        tail = ((proc.stderr or proc.stdout) if proc else "").strip().splitlines()[-3:]
        why = f"the unpatched subject's audit wrote no report (exit {proc.returncode}): " + " | ".join(tail)
    start = _startup(doc, launched_wall, wall) if doc is not None else None
    with lock:
        if why:
            out.error = out.error or why
        if doc is not None:
            # a row the audit never reached measured nothing: leave it out (it counts as the dearest)
            out.rows.update({(r["contract"], r["target"]): r for r in doc["results"]
                             if not str(r.get("reason", "")).startswith("not reached")})
        if start is not None:
            out.startup = start if out.startup is None else max(out.startup, start)


def measure_baseline(mutants: list[Mutant], subject, *, root: "Path | None" = None, cap: float = DEFAULT_CAP,
                     findings: str | None = None, jobs: int = 1) -> Baseline:
    """Audit the mutants' expected rows on the unpatched tree (ours at ``root``, or a copy of the subject's
    tree), ``jobs`` audits at once (as the mutants run), each row stopping at a first violation as a mutant's
    does; record each row and what it cost (row seconds, and the audit process's start)."""
    findings = findings if findings is not None else _findings_file()
    on_subject = subject is not None and subject.name != "ours"
    t0 = time.monotonic()
    out = Baseline()
    tmp = Path(tempfile.mkdtemp(prefix="smv-zoo-baseline-"))
    lock = threading.Lock()
    try:
        tree = None
        if on_subject:
            tree = tmp / "subject"
            _copy_subject_tree(Path(root) if root else subject_root(subject), tree, "")
            code_root = default_root()
        else:
            code_root = Path(root) if root else default_root()

        run = AuditRun(code_root, tmp, tree, findings)
        groups = _row_groups(mutants)
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            list(pool.map(lambda ig: _measure_group(run, tmp / f"report-{ig[0]}", *ig[1], cap, out, lock),
                          enumerate(groups)))
        return out
    finally:
        out.seconds = time.monotonic() - t0
        shutil.rmtree(tmp, ignore_errors=True)


def baseline(mutants: list[Mutant], subject, *, cap: float = DEFAULT_CAP, findings: str | None = None) -> dict:
    """The expected contracts' rows on the subject's unpatched tree: ``(contract, target) -> row`` (or
    ``{"error": why}``). A contract that already fails there cannot be killed by a planted bug (its failure is not
    the bug's), so :func:`judge_against_baseline` makes such a mutant an ``error`` saying so; record the failure
    in findings.toml (it turns ``known``) or fix the adapter."""
    return measure_baseline(mutants, subject, cap=cap, findings=findings).as_base()


def judge_against_baseline(res: MutantResult, m: Mutant, base: dict) -> MutantResult:
    """A kill counts only where the unpatched subject did not fail the same contract on the same target."""
    if res.status != "killed" or "crash" in res.detail or not base:
        return res
    if "error" in base:
        res.status, res.detail = "error", base["error"]
        return res
    already = [(c, t) for c in m.expect for t in m.targets if (base.get((c, t)) or {}).get("status") == "fail"]
    if not already:
        return res
    res.status = "error"
    res.detail = "; ".join(f"{c} already fails on {t} without the bug ({base[(c, t)]['reason'][:120]})"
                           for c, t in already) + " - record it in findings.toml or fix the adapter"
    return res


def _stale(m: Mutant, root: Path, subject, on_subject: bool) -> "tuple[str, str]":
    """``(reason, source text)``: why the entry cannot be planted here (empty when it can), and the file's text."""
    skip = release_skip(m, subject, root) if on_subject else ""
    if skip:
        return skip, ""
    src_file = root / m.file
    if not src_file.is_file():
        return f"{m.file} does not exist under {root}", ""
    text = src_file.read_text()
    n = text.count(m.find)
    if n != 1:
        return f"`find` occurs {n} times in {m.file} (must be exactly once)", text
    if m.find == m.replace:
        return "`replace` equals `find`: the patch changes nothing", text
    return "", text


def _plant(m: Mutant, text: str, root: Path, tmp: Path, on_subject: bool, findings) -> AuditRun:
    """Write the patched copy under ``tmp``; the audit run that judges it."""
    if on_subject:
        tree = tmp / "subject"
        _copy_subject_tree(root, tree, m.file)
        (tree / m.file).write_text(text.replace(m.find, m.replace))
        # findings match the unpatched tree's code: the planted bug changes a hash, and a finding's usual
        # violation must stay known rather than read as "code changed" (a kill the bug did not earn)
        return AuditRun(default_root(), tmp, tree, findings, tmp / "case-trace.json", root)
    _copy_tree(root, tmp)
    (tmp / m.file).write_text(text.replace(m.find, m.replace))
    return AuditRun(tmp, tmp, None, findings, tmp / "case-trace.json")


def _crashed(res: MutantResult, m: Mutant, proc, run: AuditRun, report: Path, when: tuple) -> bool:
    """A run that died by a signal, or left no report: a kill by crash (a reviewer would have seen it too), or an
    error when the patched code did not import. True when it decided the entry."""
    tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
    if proc.returncode < 0:
        res.status, res.fired = "killed", list(m.expect)
        res.detail = f"the contract run crashed with signal {signal.Signals(-proc.returncode).name}"
        res.time_to_kill = _crash_time_to_kill(run.trace, report, *when)
        return True
    if (report / "audit.json").is_file():
        return False
    crash = any(s in " ".join(tail) for s in ("Segmentation", "core dumped", "illegal memory"))
    res.status = "killed" if crash else "error"
    res.detail = ("the contract run crashed: " if crash else
                  f"no audit report (exit {proc.returncode}); the patched code may not import: ") + " | ".join(tail)
    if crash:
        res.time_to_kill = _crash_time_to_kill(run.trace, report, *when)
    return True


def _judge(res: MutantResult, m: Mutant, doc: dict) -> None:
    """Killed when every expected contract failed somewhere; an error when a row could not judge; else survived."""
    by_contract: dict[str, list[dict]] = {}
    for row in doc["results"]:
        by_contract.setdefault(row["contract"], []).append(row)
    # a kill is a fail: a known row met only recorded findings, which the unpatched code shows as well
    res.fired = sorted(c for c, rows in by_contract.items() if any(r["status"] == "fail" for r in rows))
    problems = [f"{r['contract']}/{r['target']}: {r['status']} ({r['reason'][:120]})"
                for rows in by_contract.values() for r in rows if r["status"] in ("error", "incomplete")]
    missing = [c for c in m.expect if c not in res.fired]
    # an expected contract the subject could not run anywhere (skipped on every target) did not judge the bug
    unjudged = [c for c in missing if by_contract.get(c) and all(r["status"] == "skipped" for r in by_contract[c])]
    problems += [f"{c}: skipped on every target ({by_contract[c][0]['reason'][:120]})" for c in unjudged]
    if not missing:
        res.status = "killed"
        first = next(r for rows in by_contract.values() for r in rows if r["status"] == "fail")
        res.detail = f"{first['contract']} on {first['target']}: {first['reason'][:200]}"
        res.time_to_kill = time_to_kill(doc["results"], m.expect)
    elif problems:
        res.status, res.detail = "error", "; ".join(problems)
    else:
        res.status = "survived"
        known = [c for c in missing if any(r["status"] == "known" for r in by_contract.get(c, []))]
        res.detail = f"{', '.join(missing)} passed with the bug planted" + (
            f" (only known findings: {', '.join(known)})" if known else "")


def run_mutant(m: Mutant, *, root: "Path | None" = None, cap: float = DEFAULT_CAP, keep: bool = False,
               subject=None, findings: str | None = None, cap_why: str = "") -> MutantResult:
    """Plant ``m`` and run its expected contracts. ``subject`` (default ours) says whose code: ``file`` is relative
    to its root (``root`` overrides it). ``findings``: the known-findings file the audit uses (default: the
    suite's findings.toml). ``cap``: the audit process's time cap (``cap_why``: how it was derived, for an error's
    detail; see :func:`mutant_cap`)."""
    on_subject = subject is not None and subject.name != "ours"
    root = Path(root) if root else subject_root(subject)
    findings = findings if findings is not None else _findings_file()
    t0 = time.monotonic()
    res = MutantResult(m.id, "error", list(m.expect))
    stale, text = _stale(m, root, subject, on_subject)
    if stale:
        res.status, res.detail, res.seconds = "stale", stale, time.monotonic() - t0
        return res
    tmp = Path(tempfile.mkdtemp(prefix=f"smv-zoo-{m.id}-"))
    try:
        run = _plant(m, text, root, tmp, on_subject, findings)
        report = tmp / "report"
        launched = time.time()
        res.cap_seconds = cap
        try:
            proc = run.run(report, m.expect, m.targets, budget=max(cap * 0.6, 5.0), timeout=cap)
        except subprocess.TimeoutExpired:
            res.status, res.detail = "error", f"time cap of {cap:.0f}s ran out" + (f" ({cap_why})" if cap_why else "")
            return res
        if not _crashed(res, m, proc, run, report, (launched, time.time())):
            _judge(res, m, json.loads((report / "audit.json").read_text()))
        return res
    finally:
        res.seconds = time.monotonic() - t0
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def subject_json(subject) -> dict:
    """zoo.json's ``subject``: ``{"name", "version", "source"}`` of the subject the bugs were planted into."""
    from contracts.subjects import ours

    sub = subject or ours()
    return {"name": sub.name, "version": sub.version, "source": sub.source}


def run_zoo(mutants: list[Mutant], *, root=None, cap: float = DEFAULT_CAP, jobs: int = 2,
            budget: float | None = None, on_result=None, subject=None, findings: str | None = None) -> dict:
    """Run every mutant (``jobs`` at once). On a subject other than ours the unpatched tree is audited first
    (:func:`baseline`), and a mutant's kill must not be a failure the subject shows without it."""
    t0 = time.monotonic()
    results: dict[str, MutantResult] = {}
    on_subject = subject is not None and subject.name != "ours"
    # entries the subject predates are not run, so they need no baseline either
    runnable = [m for m in mutants if not (on_subject and release_skip(m, subject, root))]
    # the unpatched tree's rows: on a subject they judge the kills; on any tree their cost sets each mutant's cap
    measured = (measure_baseline(runnable, subject, root=None if on_subject else root, cap=cap, findings=findings,
                                 jobs=jobs) if runnable and not (on_subject and root is not None) else None)
    base = measured.as_base() if measured is not None and on_subject else {}

    reporting = threading.Lock()

    def one(m: Mutant) -> MutantResult:
        if budget is not None and time.monotonic() - t0 > budget:
            r = MutantResult(m.id, "error", list(m.expect), detail=f"the zoo budget of {budget:.0f}s ran out first")
        else:
            m_cap, why = mutant_cap(m, measured, cap)
            r = judge_against_baseline(run_mutant(m, root=root, cap=m_cap, subject=subject, findings=findings,
                                                  cap_why=why), m, base)
            if r.status == "error" and r.cap_seconds is not None and "time cap" not in r.detail:
                r.detail += f" [cap {r.cap_seconds:.0f}s: {why}]"

        if on_result:
            with reporting:  # one callback at a time: results that come back at once (skips) must not interleave
                on_result(r)
        return r

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for r in pool.map(one, mutants):
            results[r.id] = r
    ordered = [results[m.id] for m in mutants]
    from contracts.engine.reports import ZOO_SCHEMA_VERSION

    results_json = [r.as_json() for r in ordered]
    judged = [r for r in results_json if not is_release_skip(r)]
    killed = sum(r["status"] == "killed" for r in judged)
    return {"schema_version": ZOO_SCHEMA_VERSION, "subject": subject_json(subject),
            "results": results_json, "time_to_kill": ttk_summary(results_json),
            "kill_rate": round(killed / len(judged), 4) if judged else 1.0,
            "seconds": round(time.monotonic() - t0, 2),
            "cap": {"floor": cap, "cost_factor": COST_FACTOR, "startup_factor": STARTUP_FACTOR,
                    "baseline": measured.as_json() if measured is not None else None}}
