"""``smv findings render``: FINDINGS.md, generated - never edited by hand.

Its sources: ``findings.toml`` (every field), ``findings/notes/<ID>.md`` (a finding's prose: the counterexample,
the reasoning, what this suite does instead), ``findings/notes/_intro.md`` and ``_context.md`` (what surrounds the
findings: the audits' summaries, adapter notes, what is not a finding), and ``findings/lifecycle.json`` (which
subjects' rows showed each finding in the latest audits; ``--audit FILE`` refreshes it). Findings are ordered by
reach (production first), then severity (crash first); a finding seen by a second contract (``U1-agreement``) is
listed under its root."""
from __future__ import annotations

import json
import os
import re

from contracts.engine.findings import REACH_CLASSES, SEVERITIES, Finding

GROUP_TITLES = {
    "production": "Production: inputs upstream's own callers produce",
    "caller-contract": "Caller contract: inputs the function's signature allows that its callers do not produce",
    "adversarial": "Adversarial: corrupt or foreign data (hardening notes)",
    "": "Not yet triaged",
}


def root_id(fid: str) -> str:
    return re.split(r"[-.]", fid)[0]


def notes_dir(findings_path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(findings_path)), "findings", "notes")


def lifecycle_path(findings_path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(findings_path)), "findings", "lifecycle.json")


def lifecycle_from_audits(docs: list[dict]) -> dict:
    """``{"audits": [{"started", "subjects"}], "shown": {id: [subject labels]}}``: which subjects' rows met each
    finding (a ``known`` row lists it) in these audit.json documents."""
    shown: dict[str, list] = {}
    audits = []
    for doc in docs:
        run = doc.get("run", {})
        audits.append({"started": run.get("started"), "subjects": [s.get("label") or s.get("name")
                                                                    for s in run.get("subjects") or []]})
        for row in doc.get("results", []):
            sub = row.get("subject") or {"name": "ours", "version": ""}
            label = sub["name"] if sub["name"] == "ours" else f"{sub['name']}=={sub['version']}"
            for fid in row.get("findings") or []:
                if label not in shown.setdefault(fid, []):
                    shown[fid].append(label)
    return {"audits": audits, "shown": {k: sorted(v) for k, v in sorted(shown.items())}}


def _order(f: Finding) -> tuple:
    reach = REACH_CLASSES.index(f.reach) if f.reach in REACH_CLASSES else len(REACH_CLASSES)
    sev = SEVERITIES.index(f.severity) if f.severity in SEVERITIES else len(SEVERITIES)
    return reach, sev, f.kind != "upstream-bug"


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _index(roots: list, shown: dict) -> list[str]:
    lines = ["| id | kind | reach | severity | policy | confirmed in | fixed in | latest audits | title |",
             "|---|---|---|---|---|---|---|---|---|"]
    for f in roots:
        lines.append(f"| [{f.id}](#{f.id.lower().replace('.', '')}) | {f.kind} | {f.reach or '-'} | "
                     f"{f.severity or '-'} | {'yes' if f.policy else 'no'} | {', '.join(f.confirmed_in)} | "
                     f"{', '.join(f.fixed_in) or '-'} | {', '.join(shown.get(f.id, [])) or '-'} | "
                     f"{_cell(f.title)[:140]} |")
    return lines


def _entry(f: Finding, aliases: list, ndir: str, exportable: bool) -> list[str]:
    lines = [f"### {f.id}", "", f"**{_cell(f.title)}**", "",
             f"- kind: {f.kind}{' (policy: upstream chose this on purpose)' if f.policy else ''}; reach: "
             f"{f.reach or 'not triaged'}; severity: {f.severity or 'not triaged'}",
             f"- contract: `{f.contract}` on {', '.join(f.targets)}; confirmed in {', '.join(f.confirmed_in)}"
             + (f"; fixed in {', '.join(f.fixed_in)}" if f.fixed_in else ""),
             f"- upstream: `{_cell(f.function)}`"]
    for a in aliases:
        lines.append(f"- also seen by `{a.contract}` as {a.id}")
    if f.consequence:
        lines.append(f"- consequence: {_cell(f.consequence)}")
    if exportable:
        lines.append(f"- reproduce without this suite: `smv findings export {f.id} --to DIR` "
                     f"(DIR/repro.py, DIR/ISSUE.md)")
    if f.repro:
        lines.append(f"- replay in this suite: `{_cell(f.repro)}`")
    prose = _read(os.path.join(ndir, f"{f.id}.md"))
    if prose:
        lines += ["", prose]
    return lines + [""]


def render(findings: list[Finding], findings_path: str, lifecycle: dict | None = None) -> str:
    """FINDINGS.md's text."""
    from contracts.engine.findings_export import part_path

    ndir = notes_dir(findings_path)
    if lifecycle is None:
        text = _read(lifecycle_path(findings_path))
        lifecycle = json.loads(text) if text else {}
    shown = lifecycle.get("shown", {})
    ids = {f.id for f in findings}
    roots = sorted((f for f in findings if root_id(f.id) == f.id or root_id(f.id) not in ids), key=_order)
    aliases = {r.id: [f for f in findings if f is not r and root_id(f.id) == r.id] for r in roots}
    out = ["# Findings", "",
           "<!-- generated by `smv findings render` from findings.toml, findings/notes/ and findings/lifecycle.json:"
           " edit those, not this file -->", "", _read(os.path.join(ndir, "_intro.md")), "",
           "Reach: **production** (inputs upstream's own callers produce), **caller-contract** (outside them, but "
           "allowed by the function's signature and docstring), **adversarial** (corrupt or foreign data). "
           "Ordered by reach, then severity.", "", "## Index", ""]
    out += _index(roots, shown) + [""]
    for group in (*REACH_CLASSES, ""):
        members = [f for f in roots if (f.reach or "") == group]
        if not members:
            continue
        out += [f"## {GROUP_TITLES[group]}", ""]
        for f in members:
            out += _entry(f, aliases[f.id], ndir, part_path(f) is not None)
    context = _read(os.path.join(ndir, "_context.md"))
    if context:
        out += ["# Audits and notes", "", context, ""]
    return "\n".join(out).rstrip() + "\n"
