"""Known findings: ``findings.toml``, the machine-readable side of FINDINGS.md.

Each ``[[finding]]`` says which contract it concerns, on which subjects, versions and targets it holds, and the
violation signature it produces (regular expressions matched with ``re.search`` against a violation's message)::

    schema_version = 1

    [[finding]]
    id = "M3"
    title = "one line"
    kind = "upstream-bug"            # or "semantic-difference"
    contract = "shrink-tail-extents"
    subjects = ["vllm"]
    versions = ["0.33.0"]            # shell-style patterns: "0.33.*", "*" (every version, a branch's too)
    targets = ["gfx942", "gfx950"]
    function = "vllm/...py::Builder.build"
    signature = ['^slot mapping: position out of the table maps to slot 0$']
    # optional: repro = "smv repro ...", notes = "..."

A case is *known* when every one of its violations matches a signature of some finding that applies to the row
(:func:`classify`); a row whose failing cases are all known is ``known``, not ``fail``, and lists the ids. A case with
one violation no finding explains fails the row as before. The file is validated strictly: any problem is a
:class:`FindingsError` naming the file, the finding and the field.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

FINDINGS_SCHEMA_VERSION = 1
KINDS = ("upstream-bug", "semantic-difference")
REQUIRED = ("id", "title", "kind", "contract", "subjects", "versions", "targets", "function", "signature")
OPTIONAL = ("repro", "notes")
_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
_CONTRACT_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class FindingsError(ValueError):
    """A findings file this code cannot use; the message is one line naming the file and the field."""


@dataclass(frozen=True)
class Finding:
    id: str
    title: str
    kind: str
    contract: str
    subjects: tuple
    versions: tuple
    targets: tuple
    function: str
    signature: tuple  # compiled patterns
    repro: str = ""
    notes: str = ""

    def applies(self, contract: str, subject: str, version: str, target: str) -> bool:
        return (contract == self.contract and subject in self.subjects and target in self.targets
                and any(fnmatch.fnmatchcase(version, v) for v in self.versions))

    def explains(self, message: str) -> bool:
        return any(p.search(message) for p in self.signature)

    def as_json(self) -> dict:
        return {"id": self.id, "title": self.title, "kind": self.kind, "contract": self.contract,
                "subjects": list(self.subjects), "versions": list(self.versions), "targets": list(self.targets),
                "function": self.function, "signature": [p.pattern for p in self.signature]}


def default_path() -> str:
    """``findings.toml`` beside FINDINGS.md at the root of the suite's checkout."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "findings.toml")


def _str_list(path, where, key, value) -> tuple:
    if not isinstance(value, list) or not value:
        raise FindingsError(f"{path}: {where}: field {key!r} must be a non-empty list of strings, got {value!r}")
    for v in value:
        if not isinstance(v, str) or not v.strip():
            raise FindingsError(f"{path}: {where}: field {key!r} must hold non-empty strings, got {v!r}")
    if len(set(value)) != len(value):
        raise FindingsError(f"{path}: {where}: field {key!r} lists a value twice: {value!r}")
    return tuple(value)


def parse(doc: dict, path: str = "findings.toml", *, known_contracts=None) -> list[Finding]:
    """The findings of a decoded TOML document, validated (see the module docstring). ``known_contracts``, when
    given, is the set of registered contract ids: a finding for any other contract is an error (a rename or a
    typo would otherwise make it silently apply to nothing)."""
    from impl.targets import TARGET_NAMES

    extra = sorted(set(doc) - {"schema_version", "finding"})
    if extra:
        raise FindingsError(f"{path}: unknown top-level key {extra[0]!r} (expected schema_version and [[finding]] "
                            f"tables)")
    version = doc.get("schema_version")
    if "schema_version" not in doc:
        raise FindingsError(f"{path}: missing schema_version (expected schema_version = {FINDINGS_SCHEMA_VERSION})")
    if isinstance(version, bool) or version != FINDINGS_SCHEMA_VERSION:
        raise FindingsError(f"{path}: schema_version {version!r} is not supported (this suite reads "
                            f"{FINDINGS_SCHEMA_VERSION})")
    tables = doc.get("finding", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise FindingsError(f"{path}: 'finding' must be an array of tables ([[finding]])")
    out: list[Finding] = []
    seen: set[str] = set()
    for i, t in enumerate(tables, 1):
        fid = t.get("id")
        where = f"finding #{i}" + (f" ({fid})" if isinstance(fid, str) else "")
        missing = [k for k in REQUIRED if k not in t]
        if missing:
            raise FindingsError(f"{path}: {where}: missing field {missing[0]!r}"
                                + (f" (and {', '.join(missing[1:])})" if missing[1:] else ""))
        unknown = sorted(set(t) - set(REQUIRED) - set(OPTIONAL))
        if unknown:
            raise FindingsError(f"{path}: {where}: unknown field {unknown[0]!r} (fields: "
                                f"{', '.join(REQUIRED + OPTIONAL)})")
        for key in ("id", "title", "kind", "contract", "function") + OPTIONAL:
            if key in t and (not isinstance(t[key], str) or not t[key].strip()):
                raise FindingsError(f"{path}: {where}: field {key!r} must be a non-empty string, got {t[key]!r}")
        if not _ID_RE.match(fid):
            raise FindingsError(f"{path}: {where}: field 'id' must be a letter then letters, digits, '.', '_' or "
                                f"'-', got {fid!r}")
        if fid in seen:
            raise FindingsError(f"{path}: {where}: field 'id': {fid!r} is used by an earlier finding")
        seen.add(fid)
        if t["kind"] not in KINDS:
            raise FindingsError(f"{path}: {where}: field 'kind' must be one of {', '.join(KINDS)}, got {t['kind']!r}")
        if not _CONTRACT_RE.match(t["contract"]):
            raise FindingsError(f"{path}: {where}: field 'contract' must be a contract id, got {t['contract']!r}")
        if known_contracts is not None and t["contract"] not in known_contracts:
            raise FindingsError(f"{path}: {where}: field 'contract': no contract {t['contract']!r} is registered")
        subjects = _str_list(path, where, "subjects", t["subjects"])
        versions = _str_list(path, where, "versions", t["versions"])
        targets = _str_list(path, where, "targets", t["targets"])
        bad = [x for x in targets if x not in TARGET_NAMES]
        if bad:
            raise FindingsError(f"{path}: {where}: field 'targets': unknown target {bad[0]!r} (targets: "
                                f"{', '.join(TARGET_NAMES)})")
        patterns = []
        for s in _str_list(path, where, "signature", t["signature"]):
            try:
                patterns.append(re.compile(s))
            except re.error as exc:
                raise FindingsError(f"{path}: {where}: field 'signature': {s!r} is not a valid regular expression "
                                    f"({exc})") from None
        out.append(Finding(fid, t["title"], t["kind"], t["contract"], subjects, versions, targets, t["function"],
                           tuple(patterns), t.get("repro", ""), t.get("notes", "")))
    return out


_CACHE: dict = {}


def load(path: str | None = None, *, known_contracts=None) -> list[Finding]:
    """The findings in ``path`` (default: :func:`default_path`, where a missing file means no findings; a path
    given explicitly must exist). Cached per file and modification time."""
    explicit = path is not None
    path = os.path.abspath(path or default_path())
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if explicit:
            raise FindingsError(f"{path}: no such findings file") from None
        return []
    key = (path, st.st_mtime_ns, st.st_size, None if known_contracts is None else frozenset(known_contracts))
    if key not in _CACHE:
        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except OSError as exc:
            raise FindingsError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise FindingsError(f"{path}: not valid TOML: {exc}") from None
        _CACHE[key] = parse(doc, path, known_contracts=known_contracts)
    return _CACHE[key]


def applicable(findings, contract: str, subject: str, version: str, target: str) -> list[Finding]:
    return [f for f in findings if f.applies(contract, subject, version, target)]


def classify(violations, findings, contract: str, subject: str, version: str, target: str) -> list[str] | None:
    """The ids of the findings that explain a case's violations when EVERY violation matches a signature of a
    finding that applies to (contract, subject, version, target); None when any violation is unexplained (or there
    are none). Each violation is credited to the first finding, in file order, that explains it."""
    if not violations:
        return None
    fs = applicable(findings, contract, subject, version, target)
    if not fs:
        return None
    ids: list[str] = []
    for v in violations:
        msg = v.message if hasattr(v, "message") else str(v)
        f = next((f for f in fs if f.explains(msg)), None)
        if f is None:
            return None
        if f.id not in ids:
            ids.append(f.id)
    return ids
