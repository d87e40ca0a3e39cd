"""Known findings: ``findings.toml``, the machine-readable side of FINDINGS.md.

Each ``[[finding]]`` says which contract it concerns, on which subjects and targets it holds, the upstream code it is
about (the sha256 of each function's source where it was confirmed), the releases it was confirmed in, and the
violation signature it produces (regular expressions matched with ``re.search`` against a violation's message)::

    schema_version = 2

    [[finding]]
    id = "M3"
    title = "one line"
    kind = "upstream-bug"            # or "semantic-difference"
    contract = "shrink-tail-extents"
    subjects = ["vllm"]
    confirmed_in = ["0.33.0"]        # shell-style patterns: "0.33.*", "*" (every version, a branch's too)
    targets = ["gfx942", "gfx950"]
    function = "vllm/...py::Builder.build"    # free text for a reader
    functions = [                    # optional: the code the finding is about
      {module = "vllm/...py", qualname = "Builder.build", sha256 = ["<64 hex>", ...]},
    ]
    signature = ['^slot mapping: position out of the table maps to slot 0$']
    # optional: repro = "smv repro ...", notes = "..."

A function's hash is the sha256 of the exact source segment of its ``def`` (or ``class``; ``Class.method`` names the
method's ``def``), decorators included (:func:`function_sha256`); ``sha256`` lists every hash the finding was
confirmed on, since the code may change around a finding that stays. A finding *applies* to a row (contract,
subject, version, target) when the subject's tree holds every listed function with one of its hashes (a release or
a branch of any version, a dev build included), or when the version matches ``confirmed_in``. Schema 1 files still
load: their ``versions`` is ``confirmed_in``, and they list no functions.

A case is *known* when every one of its violations matches a signature of some finding that applies to the row
(:func:`classify`); a row whose failing cases are all known is ``known``, not ``fail``, and lists the ids. A case with
one violation no finding explains fails the row as before; when a finding of the row's contract, subject and target
would explain it but the code of one of its functions matches none of its hashes (and the version is not
confirmed), the row fails saying "the code of <qualname> changed since finding <id> was confirmed"
(:func:`code_changed`): someone must triage it.

Each finding's minimal case is stored beside the file as ``findings/<id>.json`` (a reproducer ``smv repro``
reads); :func:`check` replays them under a subject (``smv findings check``). The file is validated strictly: any
problem is a :class:`FindingsError` naming the file, the finding and the field.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass

from contracts.subjects.code import function_sha256, module_defs  # noqa: F401 - findings match code by them
from fuzz.domains import REACH_CLASSES as _REACH_CLASSES

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

#: 2: ``confirmed_in`` (was ``versions``) and ``functions``; a schema-1 file still loads
#: 3: what a maintainer needs: ``reach``, ``severity``, ``consequence``, ``policy`` (required) and ``fixed_in``
FINDINGS_SCHEMA_VERSION = 3
FINDINGS_READS = (1, 2, 3)
#: ``smv findings check --json``
CHECK_SCHEMA_VERSION = 1
CHECK_STATUSES = ("present", "fixed", "not_applicable", "no_reproducer", "error")
KINDS = ("upstream-bug", "semantic-difference")
REQUIRED = ("id", "title", "kind", "contract", "subjects", "confirmed_in", "targets", "function", "signature")
OPTIONAL = ("functions", "repro", "notes")
#: schema 3's additions: every finding says how production reaches it and what follows
REQUIRED_V3 = REQUIRED + ("reach", "severity", "consequence", "policy")
OPTIONAL_V3 = OPTIONAL + ("fixed_in",)
#: how a finding's (or a violation's) case is reached: inputs upstream's own callers produce; inputs outside them
#: the function's signature and docstring still allow; corrupt or foreign data
REACH_CLASSES = _REACH_CLASSES
SEVERITIES = ("crash", "memory-corruption", "wrong-result", "performance", "none")
#: schema 1's fields: ``versions`` where schema 2 has ``confirmed_in``, no ``functions``
REQUIRED_V1 = ("id", "title", "kind", "contract", "subjects", "versions", "targets", "function", "signature")
OPTIONAL_V1 = ("repro", "notes")
FUNCTION_KEYS = ("module", "qualname", "sha256")
_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
_CONTRACT_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_QUALNAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class FindingsError(ValueError):
    """A findings file this code cannot use; the message is one line naming the file and the field."""


# --- the code a finding is about -------------------------------------------------------------------------------------

#: the tree whose code findings are matched against, instead of the subject's own (``smv zoo`` sets it to the
#: unpatched tree while a mutant's audit runs on a patched copy)
CODE_ROOT_ENV = "SMV_FINDINGS_CODE_ROOT"


class CodeRoot(str):
    """A tree's root, and the module paths whose code a model variant takes from another file of it
    (``remap``: a finding's ``vllm/models/deepseek_v4/amd/rocm.py`` is ``.../deepseek_v41/amd/rocm.py`` for a
    ``#deepseek_v41`` subject), so a finding is matched against the code the variant's rows actually ran."""

    remap: dict = {}

    def path(self, module: str) -> str:
        return self.remap.get(module, module)


def subject_root(subject) -> str | None:
    """The root of a subject's source tree (a vllm subject's ``tree.root``, as a :class:`CodeRoot` carrying its
    model variant's remapped modules; :data:`CODE_ROOT_ENV` overrides the directory for a subject that has one);
    None for a subject without one (ours)."""
    tree = getattr(subject, "tree", None)
    root = os.environ.get(CODE_ROOT_ENV) if tree is not None else None
    root = root or getattr(tree, "root", None)
    if not isinstance(root, str):
        return None
    out = CodeRoot(root)
    variant = getattr(subject, "variant", None)
    if variant:
        from contracts.subjects.vllm.loader import SHORT, VARIANTS

        out.remap = {SHORT[short].replace(".", "/") + ".py": name.replace(".", "/") + ".py"
                     for short, name in VARIANTS[variant].short.items()}
    return out


@dataclass(frozen=True)
class FunctionRef:
    module: str
    qualname: str
    sha256: tuple

    def hash_in(self, root: str) -> str | None:
        module = root.path(self.module) if isinstance(root, CodeRoot) else self.module
        return function_sha256(root, module, self.qualname)

    def as_json(self) -> dict:
        return {"module": self.module, "qualname": self.qualname, "sha256": list(self.sha256)}


@dataclass(frozen=True)
class Finding:
    id: str
    title: str
    kind: str
    contract: str
    subjects: tuple
    confirmed_in: tuple
    targets: tuple
    function: str
    signature: tuple  # compiled patterns
    repro: str = ""
    notes: str = ""
    functions: tuple = ()  # FunctionRef
    #: the findings file it was read from (its reproducer lies beside it)
    source: str = ""
    #: schema 3: how production reaches it (:data:`REACH_CLASSES`), what it costs (:data:`SEVERITIES`), the one
    #: sentence a maintainer checks against the code, whether upstream chose it on purpose, the releases that fixed it
    reach: str = ""
    severity: str = ""
    consequence: str = ""
    policy: bool = False
    fixed_in: tuple = ()

    @property
    def versions(self) -> tuple:
        """Schema 1's name for :attr:`confirmed_in`."""
        return self.confirmed_in

    def concerns(self, contract: str, subject: str, target: str) -> bool:
        return contract == self.contract and subject in self.subjects and target in self.targets

    def confirmed(self, version: str) -> bool:
        return any(fnmatch.fnmatchcase(version, v) for v in self.confirmed_in)

    def code_matches(self, root: str | None) -> bool:
        """The tree at ``root`` holds every listed function with one of its hashes (False with no functions)."""
        return bool(self.functions) and root is not None and all(f.hash_in(root) in f.sha256 for f in self.functions)

    def changed_function(self, root: str | None) -> FunctionRef | None:
        """The first listed function whose source in the tree at ``root`` matches none of its hashes (or is gone);
        None when all match, or when there is no tree or no function to compare."""
        if root is None:
            return None
        return next((f for f in self.functions if f.hash_in(root) not in f.sha256), None)

    def applies(self, contract: str, subject: str, version: str, target: str, root: str | None = None) -> bool:
        return self.concerns(contract, subject, target) and (self.confirmed(version) or self.code_matches(root))

    def explains(self, message: str) -> bool:
        return any(p.search(message) for p in self.signature)

    @property
    def reproducer(self) -> str | None:
        """Where its minimal case is stored: ``findings/<id>.json`` beside the findings file (it may not exist)."""
        if not self.source:
            return None
        return os.path.join(os.path.dirname(self.source), "findings", f"{self.id}.json")

    def as_json(self) -> dict:
        return {"id": self.id, "title": self.title, "kind": self.kind, "contract": self.contract,
                "subjects": list(self.subjects), "confirmed_in": list(self.confirmed_in),
                "targets": list(self.targets), "function": self.function,
                "functions": [f.as_json() for f in self.functions],
                "signature": [p.pattern for p in self.signature], "reach": self.reach, "severity": self.severity,
                "consequence": self.consequence, "policy": self.policy, "fixed_in": list(self.fixed_in)}


def default_path() -> str:
    """``findings.toml`` beside FINDINGS.md at the root of the suite's checkout."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "findings.toml")


def _str_list(path, where, key, value) -> tuple:
    if not isinstance(value, list) or not value:
        raise FindingsError(f"{path}: {where}: field {key!r} must be a non-empty list of strings, got {value!r}")
    for v in value:
        if not isinstance(v, str) or not v.strip():
            raise FindingsError(f"{path}: {where}: field {key!r} must hold non-empty strings, got {v!r}")
    if len(set(value)) != len(value):
        raise FindingsError(f"{path}: {where}: field {key!r} lists a value twice: {value!r}")
    return tuple(value)


def _functions(path, where, value) -> tuple:
    if not isinstance(value, list) or not value:
        raise FindingsError(f"{path}: {where}: field 'functions' must be a non-empty array of tables "
                            f"{{module, qualname, sha256}}, got {value!r}")
    out = []
    for j, t in enumerate(value, 1):
        at = f"{where}: field 'functions' entry #{j}"
        if not isinstance(t, dict):
            raise FindingsError(f"{path}: {at}: expected a table {{module, qualname, sha256}}, got {t!r}")
        missing = [k for k in FUNCTION_KEYS if k not in t]
        if missing:
            raise FindingsError(f"{path}: {at}: missing {missing[0]!r}")
        unknown = sorted(set(t) - set(FUNCTION_KEYS))
        if unknown:
            raise FindingsError(f"{path}: {at}: unknown key {unknown[0]!r} (keys: {', '.join(FUNCTION_KEYS)})")
        module, qualname = t["module"], t["qualname"]
        if (not isinstance(module, str) or not module.endswith(".py") or module.startswith("/") or "\\" in module
                or ".." in module.split("/")):
            raise FindingsError(f"{path}: {at}: 'module' must be a .py path relative to the subject's root, got "
                                f"{module!r}")
        if not isinstance(qualname, str) or not _QUALNAME_RE.match(qualname):
            raise FindingsError(f"{path}: {at}: 'qualname' must be a dotted name (f, Class.method), got "
                                f"{qualname!r}")
        hashes = _str_list(path, at, "sha256", t["sha256"])
        bad = [h for h in hashes if not _SHA256_RE.match(h)]
        if bad:
            raise FindingsError(f"{path}: {at}: 'sha256' must hold 64 lowercase hex digits, got {bad[0]!r}")
        if any((f.module, f.qualname) == (module, qualname) for f in out):
            raise FindingsError(f"{path}: {at}: {module}::{qualname} is listed twice")
        out.append(FunctionRef(module, qualname, hashes))
    return tuple(out)


def _schema_of(doc: dict, path: str) -> int:
    extra = sorted(set(doc) - {"schema_version", "finding"})
    if extra:
        raise FindingsError(f"{path}: unknown top-level key {extra[0]!r} (expected schema_version and [[finding]] "
                            f"tables)")
    version = doc.get("schema_version")
    if "schema_version" not in doc:
        raise FindingsError(f"{path}: missing schema_version (expected schema_version = {FINDINGS_SCHEMA_VERSION})")
    if isinstance(version, bool) or version not in FINDINGS_READS:
        raise FindingsError(f"{path}: schema_version {version!r} is not supported (this suite reads "
                            f"{' and '.join(map(str, FINDINGS_READS))})")
    return version


def _check_fields(t: dict, path: str, where: str, version: int) -> None:
    """The table's field names and string fields, against the schema ``version`` reads."""
    required, optional = {1: (REQUIRED_V1, OPTIONAL_V1), 2: (REQUIRED, OPTIONAL)}.get(version,
                                                                                     (REQUIRED_V3, OPTIONAL_V3))
    renamed = {"versions": "confirmed_in"} if version != 1 else {"confirmed_in": "versions"}
    unknown = sorted(set(t) - set(required) - set(optional))
    if unknown:
        hint = (f"schema_version {version} calls it {renamed[unknown[0]]!r}" if unknown[0] in renamed else
                f"schema_version {version} fields: {', '.join(required + optional)}")
        raise FindingsError(f"{path}: {where}: unknown field {unknown[0]!r} ({hint})")
    missing = [k for k in required if k not in t]
    if missing:
        raise FindingsError(f"{path}: {where}: missing field {missing[0]!r}"
                            + (f" (and {', '.join(missing[1:])})" if missing[1:] else ""))
    for key in ("id", "title", "kind", "contract", "function", "repro", "notes", "consequence"):
        if key in t and (not isinstance(t[key], str) or not t[key].strip()):
            raise FindingsError(f"{path}: {where}: field {key!r} must be a non-empty string, got {t[key]!r}")


def _check_names(t: dict, path: str, where: str, seen: set, known_contracts) -> None:
    """The finding's id (well formed, unused), kind and contract (registered, when the registry is given)."""
    fid = t["id"]
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


def _triage(t: dict, path: str, where: str) -> dict:
    """Schema 3's fields, checked: a policy is a semantic difference, never an upstream bug."""
    if "reach" not in t:
        return {}
    if t["reach"] not in REACH_CLASSES:
        raise FindingsError(f"{path}: {where}: field 'reach' must be one of {', '.join(REACH_CLASSES)}, got "
                            f"{t['reach']!r}")
    if t["severity"] not in SEVERITIES:
        raise FindingsError(f"{path}: {where}: field 'severity' must be one of {', '.join(SEVERITIES)}, got "
                            f"{t['severity']!r}")
    if not isinstance(t["policy"], bool):
        raise FindingsError(f"{path}: {where}: field 'policy' must be true or false, got {t['policy']!r}")
    if t["policy"] and t["kind"] == "upstream-bug":
        raise FindingsError(f"{path}: {where}: a policy (upstream's deliberate choice) is a semantic-difference, "
                            f"not an upstream-bug")
    fixed = t.get("fixed_in", [])
    if not isinstance(fixed, list) or not all(isinstance(v, str) and v.strip() for v in fixed):
        raise FindingsError(f"{path}: {where}: field 'fixed_in' must be a list of releases, got {fixed!r}")
    return {"reach": t["reach"], "severity": t["severity"], "consequence": t["consequence"],
            "policy": t["policy"], "fixed_in": tuple(fixed)}


def _parse_one(t: dict, path: str, where: str, version: int) -> Finding:
    from impl.targets import TARGET_NAMES

    subjects = _str_list(path, where, "subjects", t["subjects"])
    confirmed_in = _str_list(path, where, "versions" if version == 1 else "confirmed_in",
                             t["versions" if version == 1 else "confirmed_in"])
    targets = _str_list(path, where, "targets", t["targets"])
    bad = [x for x in targets if x not in TARGET_NAMES]
    if bad:
        raise FindingsError(f"{path}: {where}: field 'targets': unknown target {bad[0]!r} (targets: "
                            f"{', '.join(TARGET_NAMES)})")
    functions = _functions(path, where, t["functions"]) if "functions" in t else ()
    patterns = []
    for s in _str_list(path, where, "signature", t["signature"]):
        try:
            patterns.append(re.compile(s))
        except re.error as exc:
            raise FindingsError(f"{path}: {where}: field 'signature': {s!r} is not a valid regular expression "
                                f"({exc})") from None
    return Finding(t["id"], t["title"], t["kind"], t["contract"], subjects, confirmed_in, targets, t["function"],
                   tuple(patterns), t.get("repro", ""), t.get("notes", ""), functions,
                   os.path.abspath(path) if path else "", **_triage(t, path, where))


def parse(doc: dict, path: str = "findings.toml", *, known_contracts=None) -> list[Finding]:
    """The findings of a decoded TOML document, validated (see the module docstring). ``known_contracts``, when
    given, is the set of registered contract ids: a finding for any other contract is an error (a rename or a
    typo would otherwise make it silently apply to nothing)."""
    version = _schema_of(doc, path)
    tables = doc.get("finding", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise FindingsError(f"{path}: 'finding' must be an array of tables ([[finding]])")
    out: list[Finding] = []
    seen: set[str] = set()
    for i, t in enumerate(tables, 1):
        fid = t.get("id")
        where = f"finding #{i}" + (f" ({fid})" if isinstance(fid, str) else "")
        _check_fields(t, path, where, version)
        _check_names(t, path, where, seen, known_contracts)
        out.append(_parse_one(t, path, where, version))
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


def applicable(findings, contract: str, subject: str, version: str, target: str, *,
               root: str | None = None) -> list[Finding]:
    """The findings that apply to the row: by the code in the subject's tree at ``root`` (:func:`subject_root`),
    or by the version."""
    return [f for f in findings if f.applies(contract, subject, version, target, root)]


def classify(violations, findings, contract: str, subject: str, version: str, target: str, *,
             root: str | None = None) -> list[str] | None:
    """The ids of the findings that explain a case's violations when EVERY violation matches a signature of a
    finding that applies to (contract, subject, version, target) with the tree at ``root``; None when any violation
    is unexplained (or there are none). Each violation is credited to the first finding, in file order, that
    explains it."""
    if not violations:
        return None
    fs = applicable(findings, contract, subject, version, target, root=root)
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


def code_changed(violations, findings, contract: str, subject: str, version: str, target: str, *,
                 root: str | None = None) -> str | None:
    """Why a failing case needs triage rather than a fix: ``"the code of <qualname> changed since finding <id> was
    confirmed"`` when one of its violations matches the signature of a finding of this contract, subject and target
    that does not apply only because the code of one of its functions in the tree at ``root`` matches none of its
    hashes (and the version is not confirmed); else None."""
    for f in findings:
        if not f.concerns(contract, subject, target) or f.applies(contract, subject, version, target, root):
            continue
        changed = f.changed_function(root)
        if changed is None:
            continue
        if any(f.explains(v.message if hasattr(v, "message") else str(v)) for v in violations):
            return f"the code of {changed.qualname} changed since finding {f.id} was confirmed"
    return None
