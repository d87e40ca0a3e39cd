"""Report files: audit.json (versioned; a promise to users' CI), audit.md, JUnit XML, zoo.json."""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

from contracts.engine.timesplit import cases_per_second, format_split
from fuzz.domains import REACH_CLASSES

#: 2: run.seed (always), run.commit, run.dirty, run.versions, run.reason, run.allow_empty; per row pinned_cases,
#: generated_cases, stopped_by, margin
#: 3: subjects: per row ``subject`` ({name, version}) and ``findings`` (ids of the known findings that explained
#: its failing cases); status ``known``; run.subjects (each subject's name, version, source, modules' sha256,
#: rewrites, label, spec, seconds, counts) and run.findings ({file, ids}); run.budget is each subject's budget
#: 4: per row ``reach``: ``{"pairs_declared", "pairs_covered", "missing", "exhaustive"}`` (fuzz/dimensions.py)
#: 5: per row ``first_violation``: ``{"cases", "seconds"}`` until the first case that failed the row, or null
#: 6: per row ``time_split``: ``{"compile", "kernel", "oracle", "harness"}``, where the row's seconds went
#: (contracts/engine/timesplit.py: Triton compilation, the subject's calls less their compilation, the oracles' functions,
#: the rest); the four add up to ``seconds``
#: 7: per row ``specializations``: ``{kernel: n}``, the distinct Triton specializations (compile keys) of each
#: kernel the row launched (contracts/engine/specializations.py), and ``run.specializations_source``: ``"compiled"``
#: (native: what Triton's compile hook saw the row compile, new to the process) or ``"predicted"`` (the
#: interpreter: the keys Triton would form from the row's launch arguments)
#: 8: ``run.jobs``: the worker processes that ran the rows side by side (``smv audit --jobs``; 1: one process)
#: 9: ``run.subjects[].standins`` for a vllm subject: every name a stand-in served its code, with what it answered
#: on each target (``[{"name", "served": {target: what}}]``), and ``not_run`` (``[{"what", "why"}]``: its code no row
#: can run here); ``run.lifecycle`` when the audit has more than one
#: subject: for every known finding and every new failure, which subjects show it
#: 10: ``run.changed_since`` with ``--changed-since REF`` (``{"ref", "changed": [files], "selected": "all" | [contract
#: ids], "why": [lines], "subjects": {label: {"ref", "repo", "changed", "selected", "why"}}}``): the rows a change
#: selected (contracts.engine.changes); an audit it selected nothing for has no rows and is ok
#: 11: ``run.plan``: ``{"estimated_seconds", "minimum_seconds", "deadline", "cpu_share", "rows", "rows_measured",
#: "actual_seconds"}``: what the audit planned before it started (contracts.engine.plan: every row's minimum always
#: runs, so the run takes the larger of the minimums and the budget; ``deadline`` is ``--deadline``, null without
#: one) and what it took
#: 12: per row ``reach_class`` and on each violation ``reach_class``: ``production`` (the failing case lies inside
#: the production domain upstream's callers produce), ``caller-contract`` (outside it, but allowed by the function's
#: own signature), ``adversarial`` (corrupt or foreign data) - fuzz/domains.py; null for a row without violations or
#: a case of a family without a declared domain (``reach`` stays the pairwise coverage); per row ``case_reach``:
#: ``{class: n}``, the generated cases by reach class (every generated case records whether it lies inside)
AUDIT_SCHEMA_VERSION = 12
TIME_SPLIT_KEYS = ("compile", "kernel", "oracle", "harness")
SPECIALIZATION_SOURCES = ("compiled", "predicted")
#: 2: ``subject`` at the top level ({name, version, source}) and ``finished``
#: 3: per entry ``time_to_kill`` (``{"cases", "seconds", "contract", "target"}``, ``"crash": true`` for a kill by
#: crash; null for an entry not killed) and at the top level ``time_to_kill`` (``{"killed", "median_seconds",
#: "worst_seconds", "worst", "median_cases", "worst_cases"}`` over the killed entries)
#: 4: ``changed_since`` with ``--changed-since REF`` (``{"ref", "repo", "changed", "selected", "why", "mutants": "all" |
#: [ids]}``); a zoo it selected nothing for has no results and exits 0
#: 5: per entry ``cap_seconds`` (the time cap its audit ran under, derived from the unpatched rows' measured cost;
#: null for an entry not run) and at the top level ``cap`` (``{"floor", "cost_factor", "startup_factor",
#: "baseline": {"seconds", "startup_seconds", "rows", "row_seconds", "error"} | null}``)
ZOO_SCHEMA_VERSION = 5
STATUSES = ("pass", "fail", "error", "skipped", "incomplete", "known")
ZOO_STATUSES = ("killed", "survived", "stale", "error")
STOPPED_BY = ("budget", "max_cases", "exhausted")
VERSION_KEYS = ("smv", "python", "torch", "triton", "hypothesis", "numpy")
SUBJECT_ROW = {"type": "object", "required": ["name", "version"],
               "properties": {"name": {"type": "string"}, "version": {"type": "string"}}}

#: every audit.json this suite has written validates against it; the fields a version added are checked where
#: present, and :func:`audit_schema` requires them for the version that added them
AUDIT_JSON_SCHEMA = {
    "type": "object",
    "required": ["schema_version", "run", "device", "targets", "results"],
    "properties": {
        "schema_version": {"type": "integer"},
        "run": {"type": "object", "required": ["seed", "commit", "versions"], "properties": {
            "seed": {"type": "integer"}, "commit": {"type": ["string", "null"]},
            "versions": {"type": "object", "required": list(VERSION_KEYS),
                         "properties": {k: {"type": ["string", "null"]} for k in VERSION_KEYS}},
            "subjects": {"type": "array", "items": {
                "type": "object", "required": ["name", "version", "source", "modules", "rewrites"],
                "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                               "source": {"type": "string"}, "modules": {"type": "object"},
                               "rewrites": {"type": "array"},
                               "not_run": {"type": "array", "items": {
                                   "type": "object", "required": ["what", "why"]}},
                               "standins": {"type": "array", "items": {
                                   "type": "object", "required": ["name", "served"],
                                   "properties": {"name": {"type": "string"}, "served": {"type": "object"}}}}}}},
            "lifecycle": {"type": "object", "required": ["subjects", "findings", "new_failures"], "properties": {
                "subjects": {"type": "array", "items": {"type": "string"}},
                "findings": {"type": "array", "items": {"type": "object", "required": ["id", "seen"]}},
                "new_failures": {"type": "array", "items": {
                    "type": "object", "required": ["contract", "target", "message", "seen"]}}}},
            "specializations_source": {"enum": list(SPECIALIZATION_SOURCES)},
            "jobs": {"type": "integer"},
            "plan": {"type": "object", "required": ["estimated_seconds", "minimum_seconds", "deadline"],
                     "properties": {"estimated_seconds": {"type": "number"}, "minimum_seconds": {"type": "number"},
                                    "deadline": {"type": ["number", "null"]}}},
            "findings": {"type": "object", "required": ["file", "ids"],
                         "properties": {"file": {"type": ["string", "null"]},
                                        "ids": {"type": "array", "items": {"type": "string"}}}}}},
        "device": {"type": "object", "required": ["kind", "name", "arch"]},
        "targets": {"type": "array", "items": {"type": "string"}},
        "results": {"type": "array", "items": {
            "type": "object",
            "required": ["contract", "target", "status", "reason", "cases", "pinned_cases", "generated_cases",
                         "stopped_by", "margin", "seconds", "violations", "repro"],
            "properties": {
                "contract": {"type": "string"}, "target": {"type": "string"},
                "status": {"enum": list(STATUSES)}, "reason": {"type": "string"},
                "cases": {"type": "integer"}, "seconds": {"type": "number"},
                "pinned_cases": {"type": "integer"}, "generated_cases": {"type": "integer"},
                "stopped_by": {"enum": list(STOPPED_BY) + [None]}, "margin": {"type": ["number", "null"]},
                "violations": {"type": "array", "items": {
                    "type": "object", "required": ["message", "where", "expected", "got"],
                    "properties": {"reach_class": {"enum": [*REACH_CLASSES, None]}}}},
                "reach_class": {"enum": [*REACH_CLASSES, None]},
                "repro": {"type": ["string", "null"]},
                "subject": SUBJECT_ROW,
                "findings": {"type": "array", "items": {"type": "string"}},
                "first_violation": {"type": ["object", "null"], "required": ["cases", "seconds"],
                                    "properties": {"cases": {"type": "integer"}, "seconds": {"type": "number"}}},
                "specializations": {"type": "object"},
                "time_split": {"type": "object", "required": list(TIME_SPLIT_KEYS),
                               "properties": {k: {"type": "number"} for k in TIME_SPLIT_KEYS}},
                "reach": {"type": "object", "required": ["pairs_declared", "pairs_covered", "missing", "exhaustive"],
                          "properties": {"pairs_declared": {"type": "integer"}, "pairs_covered": {"type": "integer"},
                                         "missing": {"type": "array", "items": {"type": "string"}},
                                         "exhaustive": {"type": "boolean"}}},
            }}},
    },
}


def audit_schema(version: int = AUDIT_SCHEMA_VERSION) -> dict:
    """:data:`AUDIT_JSON_SCHEMA` with the fields added by ``version`` (and before) required."""
    import copy

    schema = copy.deepcopy(AUDIT_JSON_SCHEMA)
    if version >= 3:
        schema["properties"]["run"]["required"] += ["subjects", "findings"]
        schema["properties"]["results"]["items"]["required"] += ["subject", "findings"]
    if version >= 4:
        schema["properties"]["results"]["items"]["required"] += ["reach"]
    if version >= 5:
        schema["properties"]["results"]["items"]["required"] += ["first_violation"]
    if version >= 6:
        schema["properties"]["results"]["items"]["required"] += ["time_split"]
    if version >= 7:
        schema["properties"]["run"]["required"] += ["specializations_source"]
        schema["properties"]["results"]["items"]["required"] += ["specializations"]
    if version >= 8:
        schema["properties"]["run"]["required"] += ["jobs"]
    if version >= 11:
        schema["properties"]["run"]["required"] += ["plan"]
    if version >= 12:
        schema["properties"]["results"]["items"]["required"] += ["reach_class"]
    return schema


def validate(doc, schema, path="$") -> list[str]:
    """A small JSON-schema subset validator (type, required, properties, items, enum): enough for our shapes,
    without adding a dependency."""
    errs: list[str] = []
    types = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float),
             "boolean": bool, "null": type(None)}
    if "enum" in schema and doc not in schema["enum"]:
        errs.append(f"{path}: {doc!r} not in {schema['enum']}")
    if "type" in schema:
        allowed = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        ok = any(isinstance(doc, types[t]) and not (t in ("integer", "number") and isinstance(doc, bool))
                 for t in allowed)
        if not ok:
            return errs + [f"{path}: expected {allowed}, got {type(doc).__name__}"]
    if isinstance(doc, dict):
        for k in schema.get("required", []):
            if k not in doc:
                errs.append(f"{path}: missing {k!r}")
        for k, sub in schema.get("properties", {}).items():
            if k in doc:
                errs += validate(doc[k], sub, f"{path}.{k}")
    if isinstance(doc, list) and "items" in schema:
        for i, item in enumerate(doc):
            errs += validate(item, schema["items"], f"{path}[{i}]")
    return errs


def _dist_version(*names: str) -> str | None:
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


from contracts.subjects.base import DIST_NAME, package_version  # noqa: E402,F401 - the suite's version


def versions() -> dict:
    """The versions a result depends on (None for what is not installed). Read from the installed distributions,
    so Triton is not imported here (importing it decides its mode)."""
    import platform

    import hypothesis
    import numpy
    import torch

    return {"smv": package_version(), "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": _dist_version("triton", "pytorch-triton-rocm", "pytorch-triton", "triton-nightly"),
            "hypothesis": hypothesis.__version__, "numpy": numpy.__version__}


def code_root() -> str:
    """The folder the suite's code was imported from (the parent of ``contracts/``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git_commit(root: str | None = None) -> tuple[str | None, bool | None]:
    """(HEAD, dirty) of the git checkout whose top is ``root``; (None, None) when the code is not a checkout's top
    (an installed copy, a zoo's temporary tree inside nothing) or git is missing."""
    import subprocess

    root = root or code_root()

    def git(*args):
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=20)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(root):
            return None, None
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None, None
        status = git("status", "--porcelain", "--untracked-files=no", "--", *_CODE_FOLDERS)
        return head.stdout.strip(), (bool(status.stdout.strip()) if status.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        return None, None


_CODE_FOLDERS = ("impl", "oracles", "contracts", "fuzz")


def provenance() -> dict:
    commit, dirty = git_commit()
    return {"commit": commit, "dirty": dirty, "versions": versions()}


def write_json(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1, default=repr)
    os.replace(tmp, path)  # never leave a half-written report behind


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _md_provenance(run: dict) -> str:
    commit = run.get("commit")
    parts = [f"seed {run.get('seed')}",
             f"commit `{commit[:12]}`" + (" (uncommitted changes)" if run.get("dirty") else "") if commit
             else "commit: not a git checkout"]
    parts += [f"{k} {v}" for k, v in (run.get("versions") or {}).items()]
    return ", ".join(parts)


def _label(d: dict) -> str:
    return d.get("label") or (d["name"] if d["name"] == "ours" else f"{d['name']}=={d['version']}")


def _md_subjects(doc: dict) -> list[str]:
    subs = doc["run"].get("subjects") or []
    if not subs:
        return []
    if len(subs) == 1 and subs[0]["name"] == "ours":
        return [f"subject: `ours` {subs[0]['version']}", ""]
    lines = ["subjects:", ""]
    for d in subs:
        extra = [f"version {d['version']}"]
        if d.get("source"):
            extra.append(f"from `{d['source']}`")
        if d.get("wheel_sha256"):
            extra.append(f"wheel sha256 `{d['wheel_sha256'][:16]}...`")
        if d.get("modules"):
            extra.append(f"{len(d['modules'])} modules loaded")
        lines.append(f"- `{_label(d)}`: " + ", ".join(extra))
        for rw in d.get("rewrites") or []:
            lines.append(f"  - rewrite `{rw.get('id')}` in `{rw.get('file', '')}`: {_md_escape(rw.get('why', ''))}")
        lines += _md_standins(d.get("standins") or [])
        for n in d.get("not_run") or []:
            lines.append(f"  - not run here: `{n['what']}`: {_md_escape(n['why'])}")
    return lines + [""]


def _md_standins(standins: list) -> list[str]:
    """What the stand-ins answered: every platform answer and every name no rule answered, one line each; the
    inert placeholders the import merely bound (classes, decorators), counted."""
    inert = [s for s in standins if set(s["served"].values()) == {"inert placeholder"}]
    lines = []
    for s in standins:
        if s in inert:
            continue
        answers = "; ".join(f"{t}: {w}" for t, w in sorted(s["served"].items()))
        lines.append(f"  - stand-in `{s['name']}`: {_md_escape(answers)}")
    if inert:
        lines.append(f"  - {len(inert)} more names were inert placeholders (bound at import, never reached by a row; "
                     f"listed in audit.json)")
    return lines


def _md_cell(r: dict) -> str:
    if r["status"] == "skipped":
        return "skipped"
    cell = f"**{r['status']}** {r['cases']}"
    if r.get("findings") and r["status"] == "known":
        cell += " (" + ", ".join(r["findings"]) + ")"
    return cell


def _md_rate(r: dict) -> str:
    return f"{r['cases'] / r['seconds']:.3g}" if r.get("cases") and r.get("seconds", 0) > 0 else "-"


def _md_split(r: dict) -> str:
    s = r.get("time_split")
    if not s or not r.get("cases"):
        return "-"
    return " / ".join(f"{s.get(k, 0.0):.2f}" for k in TIME_SPLIT_KEYS)


REACH_TITLES = {"production": "Reach: production (inputs upstream's own callers produce)",
                "caller-contract": "Reach: caller contract (allowed by the function's signature; callers do not "
                                   "produce it)",
                "adversarial": "Reach: adversarial (corrupt or foreign data: hardening notes)",
                None: "Rows without a classified case (errors, skips naming the subject, families without a declared "
                      "domain)"}


def _reach_rank(r: dict) -> int:
    rc = r.get("reach_class")
    return REACH_CLASSES.index(rc) if rc in REACH_CLASSES else len(REACH_CLASSES)


def _md_by_reach(bad: list) -> list[str]:
    """One line: the failing and known rows counted by how production reaches their cases."""
    counts = {rc: sum(1 for r in bad if r.get("reach_class") == rc) for rc in (*REACH_CLASSES, None)}
    if not any(counts[rc] for rc in REACH_CLASSES):
        return []
    return ["", "by reach: " + " · ".join(f"{rc or 'unclassified'}: {n}" for rc, n in counts.items() if n)]


def audit_markdown(doc: dict) -> str:

    rows = doc["results"]
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    dev = doc["device"]
    cols = subject_columns(doc)
    multi = len(cols) > 1
    lines = [f"# smv audit: {'PASS' if doc['run'].get('ok') else 'FAIL'}", "",
             f"device: {dev['kind']} {dev['name']} ({dev['arch']}), Triton {doc['run'].get('triton_mode')}, "
             f"profile {doc['run'].get('profile')}, budget {doc['run'].get('budget')}s"
             + (" per subject" if multi else "") + f", {doc['run'].get('seconds', 0):.1f}s", "",
             _md_provenance(doc["run"]), ""] + _md_subjects(doc) + [
             " · ".join(f"{k}: {v}" for k, v in counts.items() if v), ""]
    if doc["run"].get("reason"):
        lines += [f"**{_md_escape(doc['run']['reason'])}**", ""]
    if multi:
        pairs, cells = by_contract_target(doc)
        lines += ["| contract | target | " + " | ".join(f"`{lab}`" for lab, _, _ in cols) + " |",
                  "|---|---|" + "---|" * len(cols)]
        for p in pairs:
            lines.append(f"| {p[0]} | {p[1]} | " + " | ".join(
                _md_cell(cells[p][lab]) if lab in cells[p] else "-" for lab, _, _ in cols) + " |")
    else:
        lines += ["| contract | target | status | cases | pinned+generated | stopped by | margin | seconds | cases/s "
                  "| compile / kernel / oracle / harness s | reason |",
                  "|---|---|---|---:|---:|---|---:|---:|---:|---:|---|"]
        for r in rows:
            m = r.get("margin")
            lines.append(f"| {r['contract']} | {r['target']} | **{r['status']}** | {r['cases']} | "
                         f"{r.get('pinned_cases', 0)}+{r.get('generated_cases', r['cases'])} | "
                         f"{r.get('stopped_by') or '-'} | {'-' if m is None else f'{m:.3g}'} | {r['seconds']:.1f} | "
                         f"{_md_rate(r)} | {_md_split(r)} | {_md_escape(r['reason'])[:160]} |")
    bad = [r for r in rows if r["status"] in ("fail", "error", "incomplete", "known")
           or (multi and r["status"] == "skipped" and "subject" in r["reason"])]
    lines += _md_by_reach([r for r in bad if r["status"] in ("fail", "known")])
    group = object()
    for r in sorted(bad, key=_reach_rank):
        if r.get("reach_class") != group and any(x.get("reach_class") for x in bad):
            group = r.get("reach_class")
            lines += ["", f"# {REACH_TITLES.get(group, 'Rows without a failing case')}"]
        under = f" under `{_row_label(r)}`" if multi or (r.get("subject") or {}).get("name", "ours") != "ours" else ""
        known = f" ({', '.join(r['findings'])})" if r["status"] == "known" and r.get("findings") else ""
        lines += ["", f"## {r['contract']} on {r['target']}{under}: {r['status']}{known}", "", _md_escape(r["reason"]),
                  ""]
        for v in r["violations"][:10]:
            lines.append(f"- {_md_escape(v['message'])} at `{v['where']}`: expected `{v['expected']}`, "
                         f"got `{v['got']}`")
        if r.get("repro"):
            lines += ["", f"Replay: `smv repro {r['repro']}`"]
    if doc["run"].get("lifecycle"):
        lines += _md_lifecycle(doc["run"]["lifecycle"])
    return "\n".join(lines) + "\n"


def lifecycle(rows: list, labels: list, finding_ids: list) -> dict:
    """Across the subjects of one audit (releases side by side, a branch beside its release): for every known
    finding, which subjects showed it (a ``known`` row listed it), and for every failure no finding explains (one
    entry per contract, target and first violation message), which subjects failed so. ``seen`` maps each label to
    true or false; a finding no subject showed is listed too (fixed, or its row never reached the case)."""
    findings = {fid: {lab: False for lab in labels} for fid in finding_ids}
    new: dict = {}
    for r in rows:
        lab = _row_label(r)
        if lab not in labels:
            continue
        for fid in r.get("findings") or []:
            findings.setdefault(fid, {x: False for x in labels})[lab] = True
        if r["status"] == "fail":
            msg = r["violations"][0]["message"] if r.get("violations") else r["reason"]
            entry = new.setdefault((r["contract"], r["target"], msg), {x: False for x in labels})
            entry[lab] = True
    return {"subjects": list(labels),
            "findings": [{"id": fid, "seen": seen} for fid, seen in findings.items()],
            "new_failures": [{"contract": c, "target": t, "message": m, "seen": seen}
                             for (c, t, m), seen in sorted(new.items())]}


def _md_lifecycle(life: dict) -> list[str]:
    labels = life["subjects"]
    head = "| {} | " + " | ".join(f"`{lab}`" for lab in labels) + " |"
    rule = "|---|" + "---|" * len(labels)
    shown = [f for f in life["findings"] if any(f["seen"].values())]
    lines = ["", "## Findings lifecycle", "",
             f"{len(shown)} of {len(life['findings'])} known findings shown by at least one subject; "
             f"{len(life['new_failures'])} failures no finding explains.", "", head.format("finding"), rule]
    for f in life["findings"]:
        lines.append(f"| {f['id']} | " + " | ".join("shown" if f["seen"][lab] else "-" for lab in labels) + " |")
    if life["new_failures"]:
        lines += ["", head.format("new failure (contract, target: first violation)"), rule]
        for f in life["new_failures"]:
            what = _md_escape(f"{f['contract']} on {f['target']}: {f['message']}")[:200]
            lines.append(f"| {what} | " + " | ".join("fail" if f["seen"][lab] else "-" for lab in labels) + " |")
    return lines


def _row_label(r: dict) -> str:
    s = r.get("subject") or {"name": "ours", "version": ""}
    return s["name"] if s["name"] == "ours" else f"{s['name']}=={s['version']}"


def audit_junit(doc: dict) -> bytes:
    rows = doc["results"]
    multi = len({_row_label(r) for r in rows}) > 1 or len(doc["run"].get("subjects") or []) > 1
    suite = ET.Element("testsuite", name="smv-audit", tests=str(len(rows)),
                       failures=str(sum(r["status"] in ("fail", "incomplete") for r in rows)),
                       errors=str(sum(r["status"] == "error" for r in rows)),
                       skipped=str(sum(r["status"] == "skipped" for r in rows)),
                       time=f"{doc['run'].get('seconds', 0):.3f}")
    for r in rows:
        name = f"{r['target']} [{_row_label(r)}]" if multi else r["target"]
        tc = ET.SubElement(suite, "testcase", classname=f"smv.{r['contract']}", name=name,
                           time=f"{r['seconds']:.3f}")
        if r.get("reach_class"):  # how production reaches the failing case (CI systems group by properties)
            props = ET.SubElement(tc, "properties")
            ET.SubElement(props, "property", name="reach_class", value=r["reach_class"])
        body = "\n".join(f"{v['message']} at {v['where']}: expected {v['expected']}, got {v['got']}"
                         for v in r["violations"])
        if r.get("repro"):
            body += f"\nreplay: smv repro {r['repro']}"
        if r["status"] == "fail":
            reach = f"[{r['reach_class']}] " if r.get("reach_class") else ""
            ET.SubElement(tc, "failure", message=reach + r["reason"][:500]).text = body
        elif r["status"] == "incomplete":
            ET.SubElement(tc, "failure", message="incomplete: " + r["reason"][:500], type="incomplete")
        elif r["status"] == "error":
            ET.SubElement(tc, "error", message=r["reason"][:500])
        elif r["status"] == "skipped":
            ET.SubElement(tc, "skipped", message=r["reason"][:500])
        elif r["status"] == "known":  # accepted: a passing test case that says which findings it met
            ET.SubElement(tc, "system-out").text = r["reason"][:500] + ("\n" + body if body else "")
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


# --- the audit's text table (what `smv audit` prints) --------------------------------------------------------


def _verdict_cell(r: dict) -> str:
    cell = f"{r['status']} {r['cases']}" if r["status"] not in ("skipped",) else r["status"]
    if r["status"] == "known" and r.get("findings"):
        cell += f" ({','.join(r['findings'])})"
    return cell


def subject_columns(doc: dict) -> list[tuple[str, str, str]]:
    """(label, name, version) of each subject, in run order (from ``run.subjects``, else from the rows)."""
    cols = [(d.get("label") or (d["name"] if d["name"] == "ours" else f"{d['name']}=={d['version']}"),
             d["name"], d["version"]) for d in doc["run"].get("subjects") or []]
    if not cols:
        for r in doc["results"]:
            s = r.get("subject") or {"name": "ours", "version": ""}
            lab = s["name"] if s["name"] == "ours" else f"{s['name']}=={s['version']}"
            if all(c[0] != lab for c in cols):
                cols.append((lab, s["name"], s["version"]))
    return cols or [("ours", "ours", "")]


def by_contract_target(doc: dict) -> tuple[list, dict]:
    """The (contract, target) pairs in report order, and each pair's row per subject label."""
    labels = {(n, v): lab for lab, n, v in subject_columns(doc)}
    pairs: list = []
    cells: dict = {}
    for r in doc["results"]:
        s = r.get("subject") or {"name": "ours", "version": None}
        lab = labels.get((s["name"], s["version"])) or (s["name"] if s["name"] == "ours" else
                                                        f"{s['name']}=={s['version']}")
        k = (r["contract"], r["target"])
        if k not in cells:
            pairs.append(k)
            cells[k] = {}
        cells[k][lab] = r
    return pairs, cells


def _subject_line(doc: dict) -> str:
    out = []
    for d in doc["run"].get("subjects") or []:
        lab = d.get("label") or d["name"]
        extra = f" {d['version']}" if d["name"] == "ours" else ""
        src = f" from {d['source']}" if d.get("source") and d["name"] != "ours" else ""
        rw = f", {len(d.get('rewrites') or [])} rewrites" if d.get("rewrites") else ""
        out.append(f"{lab}{extra}{src}{rw}")
    return "subject" + ("s" if len(out) > 1 else "") + ": " + ("; ".join(out) if out else "ours")


def _footer(doc: dict) -> list[str]:
    run = doc["run"]
    c = run["counts"]
    out = [f"{sum(c.values())} rows: " + ", ".join(f"{v} {k}" for k, v in c.items() if v)
           + f" in {run['seconds']:.1f}s -> {'OK' if run['ok'] else 'FAILED'}"
           + (f": {run['reason']}" if run.get("reason") else "")]
    by_reach = _md_by_reach([r for r in doc["results"] if r["status"] in ("fail", "known")])
    if by_reach:
        out.append("failing and known rows " + by_reach[-1])
    out.append(f"seed {run.get('seed')}, commit {(run.get('commit') or 'none')[:12]}"
               + (" (dirty)" if run.get("dirty") else "")
               + (", " + ", ".join(f"{k} {v}" for k, v in run["versions"].items()) if run.get("versions") else ""))
    return out


def format_table(doc: dict) -> str:
    cols = subject_columns(doc)
    if len(cols) > 1:
        return _format_multi(doc, cols)
    rows = doc["results"]
    w = max([len(r["contract"]) for r in rows] + [8])
    out = [_subject_line(doc),
           f"{'contract':<{w}}  {'target':<8}  {'status':<10}  {'cases':>5}  {'pin+gen':>9}  {'stopped by':<10}  "
           f"{'margin':>7}  {'secs':>6}  {'case/s':>6}  {'compile/kernel/oracle/harness s':<31}  reason",
           "-" * (w + 120)]
    for r in rows:
        split = f"{r.get('pinned_cases', 0)}+{r.get('generated_cases', r['cases'])}"
        m = r.get("margin")
        out.append(f"{r['contract']:<{w}}  {r['target']:<8}  {r['status']:<10}  {r['cases']:>5}  {split:>9}  "
                   f"{r.get('stopped_by') or '-':<10}  {'-' if m is None else f'{m:.3g}':>7}  "
                   f"{r['seconds']:>6.1f}  {_rate(r):>6}  {_split_cell(r):<31}  {r['reason'][:80]}")
    return "\n".join(out + _footer(doc))


def _rate(r: dict) -> str:
    """Cases per second of a row (``-`` for a row that checked nothing)."""
    v = cases_per_second(r.get("cases", 0), r.get("seconds", 0.0))
    return "-" if v is None else (f"{v:.3g}" if v < 100 else f"{v:.0f}")


def _split_cell(r: dict) -> str:
    """The row's compile/kernel/oracle/harness seconds (``-`` for a row that checked nothing, or a report that
    predates them)."""
    return format_split(r["time_split"]) if r.get("time_split") and r.get("cases") else "-"


def _format_multi(doc: dict, cols) -> str:
    """One line per contract x target, a verdict column (status and cases) per subject; the reasons of rows that
    are not a plain pass follow the table."""
    pairs, cells = by_contract_target(doc)
    w = max([len(c) for c, _ in pairs] + [8])
    cw = [max(len(lab), 14, *(len(_verdict_cell(cells[p][lab])) for p in pairs if lab in cells[p]))
          for lab, _, _ in cols]
    out = [_subject_line(doc),
           f"{'contract':<{w}}  {'target':<8}  " + "  ".join(f"{lab:<{n}}" for (lab, _, _), n in zip(cols, cw)),
           "-" * (w + 12 + sum(n + 2 for n in cw))]
    notes = []
    for p in pairs:
        row = cells[p]
        out.append(f"{p[0]:<{w}}  {p[1]:<8}  " + "  ".join(
            f"{(_verdict_cell(row[lab]) if lab in row else '-'):<{n}}" for (lab, _, _), n in zip(cols, cw)))
        skipped_alike = len({(r["status"], r["reason"]) for r in row.values()}) == 1 and len(row) == len(cols)
        for lab, _, _ in cols:
            r = row.get(lab)
            if r is None or r["status"] == "pass" or (r["status"] == "skipped" and skipped_alike):
                continue
            notes.append(f"  {lab}: {p[0]} on {p[1]}: {r['status']}: {r['reason'][:140]}"
                         + (f" (replay: smv repro {r['repro']})" if r.get("repro") else ""))
    per = []
    for d in doc["run"].get("subjects") or []:
        c = d.get("counts") or {}
        per.append(f"{d.get('label') or d['name']}: " + (", ".join(f"{v} {k}" for k, v in c.items() if v) or "no rows")
                   + f" in {d.get('seconds', 0):.1f}s")
    return "\n".join(out + (["", "not a plain pass:"] + notes if notes else []) + [""] + per + _footer(doc))
