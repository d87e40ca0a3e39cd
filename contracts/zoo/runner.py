"""``smv zoo``: apply each planted bug to a temporary copy of the code folders and prove its contracts fire.

Each mutant runs ``smv audit`` for its expected contracts in its own subprocess (Triton caches and module state stay
isolated) with a time cap. Verdicts: killed / survived / stale / error (DESIGN.md "Interfaces").
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
DEFAULT_CAP = 90.0
_REQUIRED = ("id", "title", "provenance", "file", "find", "replace", "expect", "targets")


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


@dataclass
class MutantResult:
    id: str
    status: str
    expect: list[str]
    fired: list[str] = field(default_factory=list)
    seconds: float = 0.0
    detail: str = ""

    def as_json(self) -> dict:
        return {"id": self.id, "status": self.status, "expect": self.expect, "fired": self.fired,
                "seconds": round(self.seconds, 2), "detail": self.detail}


def default_root() -> Path:
    """The root of the code under test: the folder holding the ``impl`` package that is running."""
    import impl

    return Path(impl.__file__).resolve().parent.parent


def builtin_catalogs() -> list[Path]:
    return sorted(CATALOG_DIR.glob("*.toml"))


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
        out.append(Mutant(**{k: m[k] for k in _REQUIRED}, catalog=str(path)))
    return out


def load_catalogs(paths=None) -> list[Mutant]:
    mutants: list[Mutant] = []
    seen: dict[str, str] = {}
    for p in (paths or builtin_catalogs()):
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


def run_mutant(m: Mutant, *, root: "Path | None" = None, cap: float = DEFAULT_CAP, keep: bool = False) -> MutantResult:
    root = Path(root) if root else default_root()
    t0 = time.monotonic()
    res = MutantResult(m.id, "error", list(m.expect))
    src_file = root / m.file
    if not src_file.is_file():
        res.status, res.detail = "stale", f"{m.file} does not exist under {root}"
        return res
    text = src_file.read_text()
    n = text.count(m.find)
    if n != 1:
        res.status = "stale"
        res.detail = f"`find` occurs {n} times in {m.file} (must be exactly once)"
        res.seconds = time.monotonic() - t0
        return res
    if m.find == m.replace:
        res.status, res.detail = "stale", "`replace` equals `find`: the patch changes nothing"
        return res
    tmp = Path(tempfile.mkdtemp(prefix=f"smv-zoo-{m.id}-"))
    try:
        _copy_tree(root, tmp)
        (tmp / m.file).write_text(text.replace(m.find, m.replace))
        report = tmp / "report"
        cmd = [sys.executable, "-m", "contracts.cli", "audit", "--profile", "ci", "--no-progress", "--generator-only", "--max-cases", "0",
               "--budget", str(max(cap * 0.6, 5.0)), "--report", str(report)]
        for c in m.expect:
            cmd += ["--contract", c]
        for t in m.targets:
            cmd += ["--target", t]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(tmp) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("SMV_TARGET", None)
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=cap)
        except subprocess.TimeoutExpired:
            res.status, res.detail = "error", f"time cap of {cap:.0f}s ran out"
            return res
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        audit = report / "audit.json"
        if proc.returncode < 0:
            res.status = "killed"
            res.fired = list(m.expect)
            res.detail = f"the contract run crashed with signal {signal.Signals(-proc.returncode).name}"
            return res
        if not audit.is_file():
            crash = any(s in " ".join(tail) for s in ("Segmentation", "core dumped", "illegal memory"))
            res.status = "killed" if crash else "error"
            res.detail = ("the contract run crashed: " if crash else
                          f"no audit report (exit {proc.returncode}); the patched code may not import: ") + \
                " | ".join(tail)
            return res
        doc = json.loads(audit.read_text())
        by_contract: dict[str, list[dict]] = {}
        for row in doc["results"]:
            by_contract.setdefault(row["contract"], []).append(row)
        res.fired = sorted(c for c, rows in by_contract.items() if any(r["status"] == "fail" for r in rows))
        problems = [f"{r['contract']}/{r['target']}: {r['status']} ({r['reason'][:120]})"
                    for rows in by_contract.values() for r in rows if r["status"] in ("error", "incomplete")]
        missing = [c for c in m.expect if c not in res.fired]
        if not missing:
            res.status = "killed"
            first = next(r for rows in by_contract.values() for r in rows if r["status"] == "fail")
            res.detail = f"{first['contract']} on {first['target']}: {first['reason'][:200]}"
        elif problems:
            res.status, res.detail = "error", "; ".join(problems)
        else:
            res.status = "survived"
            res.detail = f"{', '.join(missing)} passed with the bug planted"
        return res
    finally:
        res.seconds = time.monotonic() - t0
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def run_zoo(mutants: list[Mutant], *, root=None, cap: float = DEFAULT_CAP, jobs: int = 2,
            budget: float | None = None, on_result=None) -> dict:
    t0 = time.monotonic()
    results: dict[str, MutantResult] = {}

    def one(m: Mutant) -> MutantResult:
        if budget is not None and time.monotonic() - t0 > budget:
            r = MutantResult(m.id, "error", list(m.expect), detail=f"the zoo budget of {budget:.0f}s ran out first")
        else:
            r = run_mutant(m, root=root, cap=cap)
        if on_result:
            on_result(r)
        return r

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for r in pool.map(one, mutants):
            results[r.id] = r
    ordered = [results[m.id] for m in mutants]
    killed = sum(r.status == "killed" for r in ordered)
    return {"schema_version": 1, "results": [r.as_json() for r in ordered],
            "kill_rate": round(killed / len(ordered), 4) if ordered else 1.0,
            "seconds": round(time.monotonic() - t0, 2)}
