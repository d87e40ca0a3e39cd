"""Report files: audit.json (versioned; a promise to users' CI), audit.md, JUnit XML, zoo.json."""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

AUDIT_SCHEMA_VERSION = 1
ZOO_SCHEMA_VERSION = 1
STATUSES = ("pass", "fail", "error", "skipped", "incomplete")
ZOO_STATUSES = ("killed", "survived", "stale", "error")

AUDIT_JSON_SCHEMA = {
    "type": "object",
    "required": ["schema_version", "run", "device", "targets", "results"],
    "properties": {
        "schema_version": {"type": "integer"},
        "run": {"type": "object"},
        "device": {"type": "object", "required": ["kind", "name", "arch"]},
        "targets": {"type": "array", "items": {"type": "string"}},
        "results": {"type": "array", "items": {
            "type": "object",
            "required": ["contract", "target", "status", "reason", "cases", "seconds", "violations", "repro"],
            "properties": {
                "contract": {"type": "string"}, "target": {"type": "string"},
                "status": {"enum": list(STATUSES)}, "reason": {"type": "string"},
                "cases": {"type": "integer"}, "seconds": {"type": "number"},
                "violations": {"type": "array", "items": {
                    "type": "object", "required": ["message", "where", "expected", "got"]}},
                "repro": {"type": ["string", "null"]},
            }}},
    },
}


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


def write_json(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1, default=repr)
    os.replace(tmp, path)  # never leave a half-written report behind


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def audit_markdown(doc: dict) -> str:
    rows = doc["results"]
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    dev = doc["device"]
    lines = [f"# smv audit: {'PASS' if doc['run'].get('ok') else 'FAIL'}", "",
             f"device: {dev['kind']} {dev['name']} ({dev['arch']}), Triton {doc['run'].get('triton_mode')}, "
             f"profile {doc['run'].get('profile')}, budget {doc['run'].get('budget')}s, "
             f"{doc['run'].get('seconds', 0):.1f}s", "",
             " · ".join(f"{k}: {v}" for k, v in counts.items() if v), "",
             "| contract | target | status | cases | seconds | reason |", "|---|---|---|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['contract']} | {r['target']} | **{r['status']}** | {r['cases']} | {r['seconds']:.1f} | "
                     f"{_md_escape(r['reason'])[:160]} |")
    bad = [r for r in rows if r["status"] in ("fail", "error", "incomplete")]
    for r in bad:
        lines += ["", f"## {r['contract']} on {r['target']}: {r['status']}", "", _md_escape(r["reason"]), ""]
        for v in r["violations"][:10]:
            lines.append(f"- {_md_escape(v['message'])} at `{v['where']}`: expected `{v['expected']}`, "
                         f"got `{v['got']}`")
        if r.get("repro"):
            lines += ["", f"Replay: `smv repro {r['repro']}`"]
    return "\n".join(lines) + "\n"


def audit_junit(doc: dict) -> bytes:
    rows = doc["results"]
    suite = ET.Element("testsuite", name="smv-audit", tests=str(len(rows)),
                       failures=str(sum(r["status"] in ("fail", "incomplete") for r in rows)),
                       errors=str(sum(r["status"] == "error" for r in rows)),
                       skipped=str(sum(r["status"] == "skipped" for r in rows)),
                       time=f"{doc['run'].get('seconds', 0):.3f}")
    for r in rows:
        tc = ET.SubElement(suite, "testcase", classname=f"smv.{r['contract']}", name=r["target"],
                           time=f"{r['seconds']:.3f}")
        body = "\n".join(f"{v['message']} at {v['where']}: expected {v['expected']}, got {v['got']}"
                         for v in r["violations"])
        if r.get("repro"):
            body += f"\nreplay: smv repro {r['repro']}"
        if r["status"] == "fail":
            ET.SubElement(tc, "failure", message=r["reason"][:500]).text = body
        elif r["status"] == "incomplete":
            ET.SubElement(tc, "failure", message="incomplete: " + r["reason"][:500], type="incomplete")
        elif r["status"] == "error":
            ET.SubElement(tc, "error", message=r["reason"][:500])
        elif r["status"] == "skipped":
            ET.SubElement(tc, "skipped", message=r["reason"][:500])
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)
