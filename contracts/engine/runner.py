"""Runs one contract on one target under a Hypothesis profile and a time budget, and replays saved cases."""
from __future__ import annotations

import json
import os
import re
import time
import traceback
from dataclasses import dataclass, field, replace

from hypothesis import event as hyp_event
from hypothesis import given, settings

from contracts.engine import findings as known_findings
from contracts.engine import specializations, timesplit
from contracts.core import Contract, Violation, collecting_margins, collecting_notes
from contracts.subjects import Subject, SubjectError, SubjectSkip, failure_cause, ours, using
from fuzz import dimensions
from fuzz.cases import Case, CaseError
from fuzz.dimensions import reach_doc
from fuzz.profiles import profile_settings
from impl.targets import Target, get_target

#: 2: a typed case is stored as its ``Case.to_json()`` (with its own ``kind`` and ``schema_version``);
#: 3: ``subject`` (the label of the subject the case ran under) and ``subject_spec`` (the spec it was named by);
#: a version-2 file still replays, as subject ``ours``
#: 4: ``outcome`` {"kind": "crash"|"hang", "how", "timeout"} and ``log_tail`` in the reproducer of a case that killed
#: or hung its campaign worker (``smv repro`` replays those in a subprocess); the other fields are as in 3
REPRO_SCHEMA_VERSION = 4
REPRO_READS = (2, 3, 4)
STOPPED_BY = ("budget", "max_cases", "exhausted")


class ReproError(ValueError):
    """A reproducer file this code cannot replay; the message is one line, ``"<path>: <what>"``."""


@dataclass
class RowResult:
    contract: str
    target: str
    status: str  # pass | fail | known | error | skipped | incomplete
    reason: str = ""
    pinned_cases: int = 0
    generated_cases: int = 0
    seconds: float = 0.0
    violations: list[Violation] = field(default_factory=list)
    repro: str | None = None
    case: object = None
    #: what ended the row: "budget", "max_cases" or "exhausted"; None for a row that never ran
    stopped_by: str | None = None
    #: worst error-to-tolerance ratio over passing cases (numeric contracts that recorded one), else None
    margin: float | None = None
    #: the generated-case limit the row ran under (None: the profile's count)
    limit: int | None = None
    #: the audit's first pass stopped the row at its minimum; a second call (``skip``) may continue it
    resumable: bool = False
    #: the subject the row judged, ``{"name", "version"}`` (None: ours)
    subject: dict | None = None
    #: ids of the known findings (findings.toml) that explained failing cases of this row
    findings: list = field(default_factory=list)
    #: ``{"cases", "seconds"}`` when the row failed: the cases checked up to and including the first one whose
    #: violation failed the row (pinned and generated; the audit's merged row counts both passes), and the row's
    #: seconds until that check ended (before any shrinking); None for a row that did not fail
    first_violation: dict | None = None
    #: ``{"pairs_declared", "pairs_covered", "missing", "exhaustive"}`` (None: nothing declared, nothing run)
    reach: dict | None = None
    #: the declared tuples of this row and those its generated cases hit (for the audit's merge of two passes)
    reach_required: list | None = field(default=None, repr=False)
    reach_covered: set = field(default_factory=set, repr=False)
    #: the generated cases by reach class (fuzz/domains.py): every generated case records whether production's
    #: callers could produce it; "unclassified" for a family without a declared domain
    case_reach: dict = field(default_factory=dict)
    #: a ``ci`` row with a covering array: missing a declared tuple makes it ``incomplete``
    reach_enforced: bool = field(default=False, repr=False)
    #: what the row's checks said they left unchecked (contracts.core.record_note); a pass or known row's reason
    #: ends with them
    notes: list = field(default_factory=list, repr=False)
    #: where the row's seconds went, ``{"compile", "kernel", "oracle", "harness"}`` (contracts.engine.timesplit; None: all
    #: harness, for a row that checked nothing)
    time_split: dict | None = None
    #: ``{kernel: {repr(key): key}}``: the distinct Triton specializations the row's checks compiled (natively) or
    #: would compile (predicted under the interpreter; contracts.engine.specializations); audit.json counts them per kernel
    spec_keys: dict | None = field(default=None, repr=False)

    @property
    def cases(self) -> int:
        return self.pinned_cases + self.generated_cases

    @property
    def reach_class(self) -> str | None:
        """How production reaches the failing case (fuzz/domains.py): the row's violations all come from it."""
        if not self.violations or self.case is None:
            return None
        rc = _case_reach(self.case)
        return None if rc == "unclassified" else rc

    def as_json(self) -> dict:
        return {"contract": self.contract, "target": self.target, "status": self.status, "reason": self.reason,
                "cases": self.cases, "pinned_cases": self.pinned_cases, "generated_cases": self.generated_cases,
                "stopped_by": self.stopped_by, "margin": None if self.margin is None else round(self.margin, 6),
                "seconds": round(self.seconds, 3),
                "violations": [dict(v.as_json(), reach_class=self.reach_class) for v in self.violations],
                "reach_class": self.reach_class, "case_reach": dict(self.case_reach),
                "repro": self.repro, "subject": dict(self.subject or _ours_row()), "findings": list(self.findings),
                "first_violation": None if self.first_violation is None else {
                    "cases": self.first_violation["cases"], "seconds": round(self.first_violation["seconds"], 3)},
                "reach": dict(self.reach) if self.reach is not None else reach_doc(None, set()),
                "time_split": timesplit.rounded(self.time_split, self.seconds),
                "specializations": specializations.counts(self.spec_keys)}


def _case_reach(case) -> str:
    from fuzz.domains import reach_class

    try:
        return reach_class(case) or "unclassified"
    except Exception:  # noqa: BLE001 - a case a domain cannot read is not classified, never a crash
        return "unclassified"


def _ours_row() -> dict:
    from contracts.subjects import ours

    return ours().as_row()


class _Falsified(Exception):
    pass


class _Stop(KeyboardInterrupt):
    """Ends a Hypothesis run from inside the test function without it counting as a failure.

    Hypothesis treats an ordinary exception as a failure (it shrinks it and, with a database, saves it), and any
    other BaseException as fatal (it saves the choices too); only KeyboardInterrupt unwinds it untouched. Raised at
    the start of a call, before the check, so the overrun past a deadline is at most one case's generation."""


def checked(contract: Contract, case, target: Target) -> list[Violation]:
    """Run the check; an exception raised by the code under test is itself a violation (with its location).
    A :class:`~fuzz.cases.CaseError` is not: it says the case itself is malformed, and propagates; nor are the
    subject's :class:`~contracts.subjects.SubjectSkip` (an entry point it lacks, a row it cannot run here) and
    :class:`~contracts.subjects.SubjectError` (fidelity, a missing symbol, a stand-in reached), which say
    nothing about the subject's code."""
    return _checked(contract, case, target)[0]


def _sync_device() -> None:
    """Wait for the kernels this case launched, so an error a kernel raises on the device (reported at the next
    call, asynchronously) is this case's, not the next one's: an H100 audit lost its context while building the
    next case's inputs, and saved that case as the reproducer. No-op where no accelerator was used."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _checked(contract: Contract, case, target: Target) -> tuple[list[Violation], float | None]:
    """The violations and the worst margin the check recorded (None when it recorded none)."""
    with collecting_margins() as margins, timesplit.measuring():
        try:
            out = contract.check(case, target)
            _sync_device()
        except (KeyboardInterrupt, SystemExit, CaseError, SubjectSkip, SubjectError):
            raise
        except BaseException as exc:  # noqa: BLE001 - a crash of the code under test is a finding
            from contracts.engine.workers import note_device_error

            note_device_error(exc)  # a sticky device error: the rows after this one need a fresh process
            tb = traceback.extract_tb(exc.__traceback__)
            where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""
            return [Violation(f"check raised {type(exc).__name__}: {exc}", where, "no exception",
                              type(exc).__name__)], None
    if out is None:
        raise TypeError(f"contract {contract.id}: check returned None; it must return a list of Violation")
    return list(out), (max(margins) if margins else None)


#: a file the runner rewrites before each case it checks (``{"contract", "target", "skip", "pinned", "generated",
#: "started"}``: this call's counts so far and its wall-clock start), so a run that dies mid-case still says which
#: row and case it was in (``smv zoo`` reads it for a kill by crash)
CASE_TRACE_ENV = "SMV_CASE_TRACE"


def _trace(path: str | None, contract_id: str, target: str, state: dict, skip: int, started: float) -> None:
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"contract": contract_id, "target": target, "skip": skip, "pinned": state["pinned"],
                   "generated": state["generated"], "started": started}, fh)
    os.replace(tmp, path)


#: a file that the runner rewrites with the whole case before every check it makes (pinned, generated or a
#: shrink's replay): ``{"contract", "target", "subject", "subject_spec", "phase", "case", "started"}``. A campaign's
#: supervisor reads it when its worker dies or hangs, and keeps the case as the reproducer of that crash or hang
CASE_FILE_ENV = "SMV_CASE_FILE"


def _announce(path: str | None, contract_id: str, target: str, sub: "Subject", case, phase: str) -> None:
    if not path:
        return
    doc = {"contract": contract_id, "target": target, "subject": sub.label, "subject_spec": subject_spec(sub),
           "phase": phase, "case": case_to_json(case), "started": time.time()}
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, default=repr)
    os.replace(tmp, path)


def case_to_json(case):
    """What a reproducer stores for a case: a typed case's ``to_json()``, a plain (legacy) dict as it is."""
    return case.to_json() if isinstance(case, Case) else case


def subject_spec(subject: "Subject | None") -> str:
    """The spec that names ``subject`` again: the one it was parsed from (:func:`resolve_subject` records it), else
    its label."""
    sub = subject or ours()
    return getattr(sub, "spec", None) or sub.label


def resolve_subject(subject: "Subject | str | None") -> Subject:
    """A subject from a spec (``contracts.subjects.parse_subject``; the spec is kept on it for reproducers), or the
    subject itself; None is ours. A bad spec raises :class:`~contracts.subjects.SubjectSpecError`."""
    if subject is None:
        return ours()
    if isinstance(subject, Subject):
        return subject
    from contracts.subjects import parse_subject

    sub = parse_subject(subject)
    if sub.name != "ours":
        sub.spec = subject.strip()
    return sub


def repro_name(contract_id: str, target: str, subject: "Subject | None" = None) -> str:
    """``repro-<contract>-<target>.json`` for ours; other subjects add their label (so one audit of several subjects
    keeps every reproducer)."""
    sub = subject or ours()
    suffix = "" if sub.name == "ours" else "-" + re.sub(r"[^A-Za-z0-9.]+", "-", sub.label).strip("-")
    return f"repro-{contract_id}-{target}{suffix}.json"


def write_repro(path: str, contract: Contract, target: Target, case, violations: list[Violation],
                subject: "Subject | None" = None, findings: list | None = None) -> str:
    sub = subject or ours()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    doc = {"schema_version": REPRO_SCHEMA_VERSION, "contract": contract.id, "target": target.name,
           "subject": sub.label, "case": case_to_json(case), "violations": [v.as_json() for v in violations]}
    if subject_spec(sub) != sub.label:
        doc["subject_spec"] = subject_spec(sub)
    if findings:
        doc["findings"] = list(findings)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1, default=repr)
    os.replace(tmp, path)
    return path


def database_key(contract_id: str, target: str, subject: "Subject | None" = None) -> bytes:
    """What distinguishes one row's entries in the example database: contract, target and subject label."""
    return f"smv-row:{contract_id}:{target}:{(subject or ours()).label}".encode()


@dataclass
class RowOptions:
    """How one call of :func:`run_contract` runs its row: the keywords of ``run_contract``, kept together so that
    the audit and its workers pass them once (``dataclasses.replace`` makes a pass's variant)."""
    profile: str = "ci"
    budget: float = 60.0
    seed: int | None = None
    repro_dir: str | None = None
    progress: object = None
    use_examples: bool = True
    max_examples: int | None = None
    stop_after: int | None = None
    skip: int = 0
    shrink_until: float | None = None
    subject: "Subject | None" = None
    findings: list | None = None
    known_repro: bool = True
    #: the zoo's kill check: the row stops at its first failing case, unshrunk
    first_violation: bool = False
    #: the audit's rows: the budget never cuts a row before its minimum (its pinned examples and its minimum of
    #: generated cases); only ``deadline`` does
    minimum_first: bool = False
    #: a ``time.monotonic()`` instant: the hard stop of every case and of shrinking; a row it cuts before its
    #: minimum is ``incomplete`` naming it. ``deadline_s``: the deadline's length the reason names
    deadline: float | None = None
    deadline_s: float | None = None

    def check(self) -> None:
        if not self.budget > 0:
            raise ValueError(f"budget: expected a positive number of seconds, got {self.budget!r}")
        if self.max_examples is not None and self.max_examples < 0:
            raise ValueError(f"max_examples: expected 0 or more, got {self.max_examples!r}")
        if self.skip < 0 or (self.stop_after is not None and self.stop_after < 0):
            raise ValueError(f"skip / stop_after: expected 0 or more, got {self.skip!r} / {self.stop_after!r}")


def run_contract(contract: Contract, target: "Target | str", opts: RowOptions | None = None, **options
                 ) -> RowResult:
    """Check ``contract`` on ``target``: pinned examples first, then generated cases until the case limit, the
    budget or the generator's space runs out (``stopped_by`` says which), shrinking any failure within a grace
    period. The options are :class:`RowOptions`' fields, as keywords or as ``opts`` (keywords override it).
    ``progress(pinned, generated)`` is called after each case with this call's counts so far. ``use_examples=False``
    skips the pinned examples (the zoo uses it: kills must come from the generator). ``max_examples`` is the row's
    generated-case limit, exactly (default: the profile's count); the contract's own ``max_cases`` caps it further.

    ``subject`` is the code under audit (default: ours); the check runs inside ``contracts.subjects.using`` it.
    An entry point the subject lacks, or a row it cannot run on this host, ends the row ``skipped`` with the
    reason, never a violation; an interpreter the subject's kernels cannot trust ends it ``error``. A pass or
    known row's reason ends with what its checks said they left unchecked (:func:`contracts.core.record_note`).
    ``findings`` (default: the repository's findings.toml) are the known findings: a case whose every violation
    one of them explains does not stop the row (its ids are recorded, the first such case is the reproducer, and
    generation goes on); only a case with an unexplained violation fails the row and is shrunk. The row is
    ``fail`` if any case failed so, else ``known`` if any case was known, else pass or incomplete. A finding
    applies when the subject's tree holds its functions' code as confirmed, or its version is confirmed; a failing
    case that only a finding on since-changed code would explain fails the row with a reason that says so
    (:func:`contracts.engine.findings.code_changed`).
    ``known_repro=False`` writes no reproducer for a known row (the audit's second pass of a row whose first pass
    already wrote one).

    The audit runs a row in two calls that form one generated sequence (:func:`first_pass`, :func:`second_pass`):
    both use the same seed and limit, the first with ``stop_after`` (check that many generated cases, then stop
    with ``stopped_by == "stop_after"``), the second with ``skip`` (the first ``skip`` generated cases are drawn
    again, Hypothesis being deterministic for a seed, but neither checked nor counted). ``minimum_first``: the
    budget does not cut the row before its minimum; ``deadline`` (a ``time.monotonic()`` instant) cuts it anywhere.
    ``shrink_until`` (a ``time.monotonic()`` instant) ends the shrinking of a failure; default: half the budget
    again past the budget's end (or the failure, when that came later), at least 10 s, and never past ``deadline``.
    ``first_violation=True`` (the zoo's kill check) stops the row at its first failing case: no shrink phase,
    no re-check of the failure, and its case is the one reported."""
    opts = replace(opts, **options) if opts is not None else RowOptions(**options)
    opts.check()
    t = get_target(target)
    sub = opts.subject or ours()
    row = RowResult(contract.id, t.name, "pass", subject=sub.as_row())
    if not contract.applies_to(t):
        row.status, row.reason = "skipped", contract.skip_reason
        return row
    known = known_findings.load() if opts.findings is None else opts.findings
    root = known_findings.subject_root(sub)  # a finding applies by the code in the subject's tree, or the version
    mine = known_findings.applicable(known, contract.id, sub.name, sub.version, t.name, root=root)

    def classify(violations):
        if not mine or not violations:
            return None
        return known_findings.classify(violations, mine, contract.id, sub.name, sub.version, t.name, root=root)

    with using(opts.subject), collecting_notes() as notes:
        row = _Row(contract, t, row, sub, classify, opts).run()
    row.notes = list(notes)
    if row.status == "fail":  # a finding's signature on code that changed since it was confirmed: triage it
        changed = known_findings.code_changed(row.violations, known, contract.id, sub.name, sub.version, t.name,
                                              root=root)
        if changed:
            row.reason = f"{changed}: {row.reason}"
    if row.status in ("pass", "known") and notes:  # what the checks left unchecked (contracts.core.record_note)
        row.reason = with_notes(row.reason, notes)
    return row


class _Row:
    """One call's run of one row: its state, and its steps (setup, pinned examples, generated cases, verdict)."""

    def __init__(self, contract: Contract, t: Target, row: RowResult, sub: Subject, classify, o: RowOptions):
        self.c, self.t, self.row, self.sub, self.classify, self.o = contract, t, row, sub, classify, o
        self.start = time.monotonic()
        self.trace = os.environ.get(CASE_TRACE_ENV) or None
        self.case_file = os.environ.get(CASE_FILE_ENV) or None
        self.started_wall = time.time()
        self.soft = self.start + o.budget  # the budget's end
        self.base = profile_settings(o.profile)
        n = self.base.max_examples if o.max_examples is None else o.max_examples
        self.n = n if contract.max_cases is None else min(n, contract.max_cases)
        self.stop_after = o.stop_after
        self.shrink_end = self._shrink_end(self.soft)
        self.state: dict = {"pinned": 0, "generated": 0, "skipped": 0, "failing": None, "stop": None,
                            "margin": None, "known": None, "known_ids": [], "combo": None}
        self.pinned: list = []
        self.array: list = []
        self.required: list = []
        self.exhaustive = self.enforce_reach = self.limit_is_max_cases = False
        self.min_generated = 0

    def _shrink_end(self, after: float) -> float:
        end = after + max(10.0, self.o.budget * 0.5) if self.o.shrink_until is None else self.o.shrink_until
        return end if self.o.deadline is None else min(end, self.o.deadline)

    def out_of_time(self, reached_minimum: bool) -> str | None:
        """"deadline" past the hard stop; "budget" past the budget's end, unless the minimum still protects the
        row; None while there is time."""
        now = time.monotonic()
        if self.o.deadline is not None and now > self.o.deadline:
            return "deadline"
        if now > self.soft and (reached_minimum or not self.o.minimum_first):
            return "budget"
        return None

    def note_margin(self, m) -> None:
        if m is not None and self.c.numeric:
            self.state["margin"] = m if self.state["margin"] is None else max(self.state["margin"], m)

    def note_first(self) -> None:
        # the first case that fails the row, counted when its check ends (a shrink's replays come later); this
        # call's own cases and seconds (the audit's second pass adds the first pass's)
        now = time.monotonic()
        self.state["first_violation"] = {"cases": self.state["pinned"] + self.state["generated"],
                                         "seconds": now - self.start}
        self.shrink_end = self._shrink_end(max(self.soft, now))

    def note_known(self, case, violations, ids) -> None:
        if self.state["known"] is None:
            self.state["known"] = (case, violations, ids)
        self.state["known_ids"] += [i for i in ids if i not in self.state["known_ids"]]

    def setup(self) -> None:
        c, t, o = self.c, self.t, self.o
        # the subject's code for this target, loaded before any case and before the family's dimension filters ask
        # it what it has: a subject that cannot load here is an error row naming the cause (or a skip), never a
        # violation of the first case and never a traceback that ends the audit
        self.sub.bind(t)
        # declared dimensions: under ci (nightly: triples) the generated phase starts with the covering array, one
        # case per row (the generator's case forced to hit it); the array is the row's minimum and overrides the
        # limit
        self.family = dimensions.family_for(c.id)
        self.exhaustive = bool(c.extra.get("exhaustive", False))
        strength = 0 if self.exhaustive else dimensions.strength_for(o.profile, self.family, t)
        self.array = self.family.covering_array(t, strength) if strength else []
        self.required = (self.family.required(t, strength or 2)
                         if self.family is not None and not self.exhaustive else [])
        self.enforce_reach = bool(self.array) and o.profile == "ci"
        self.row.reach_required = self.required
        self.n = max(self.n, len(self.array))
        self.min_generated = max(c.min_cases, len(self.array))
        if self.stop_after is not None:
            self.stop_after = max(self.stop_after, len(self.array))
        self.row.limit = self.n
        # a case limit set by a user or a contract is "max_cases"; the profile's own count is part of "exhausted"
        self.limit_is_max_cases = o.max_examples is not None or c.max_cases is not None
        self.pinned = list(c.examples(t)) if c.examples and o.use_examples and not o.skip else []

    def run_pinned(self) -> None:
        state, c, t = self.state, self.c, self.t
        for case in self.pinned:
            stop = self.out_of_time(reached_minimum=False)
            if stop:
                state["stop"] = stop
                break
            _trace(self.trace, c.id, t.name, state, self.o.skip, self.started_wall)
            _announce(self.case_file, c.id, t.name, self.sub, case, "pinned")
            v, m = _checked(c, case, t)
            state["pinned"] += 1
            if self.o.progress:
                self.o.progress(state["pinned"], 0)
            if v:
                ids = self.classify(v)
                if ids:
                    self.note_known(case, v, ids)
                    continue
                state["failing"] = (case, v)
                self.note_first()
                break
            self.note_margin(m)

    def before_case(self) -> bool:
        """Whether the drawn case is to be checked (False: one an earlier call checked); raises to stop."""
        state, skip = self.state, self.o.skip
        if state["failing"] is None:
            stop = self.out_of_time(reached_minimum=skip + state["generated"] >= min(self.min_generated, self.n))
            if stop:
                state["stop"] = stop
                raise _Stop
            if state["skipped"] < skip:  # checked by the earlier call of this row
                state["skipped"] += 1
                return False
            if skip + state["generated"] >= self.n:
                state["stop"] = "max_cases" if self.limit_is_max_cases else "exhausted"
                raise _Stop
            if self.stop_after is not None and state["generated"] >= self.stop_after:
                state["stop"] = "stop_after"
                raise _Stop
        elif self.o.first_violation:  # Hypothesis' replay of the failure: the first verdict stands, unchecked
            raise _Falsified(str(state["failing"][1][0]) if state["failing"][1] else "failed")
        elif time.monotonic() > self.shrink_end:
            raise _Stop  # stop shrinking; the smallest failing case so far stands
        return True

    def check_case(self, case) -> None:
        """The test function Hypothesis runs on each drawn case."""
        state, c, t = self.state, self.c, self.t
        if not self.before_case():
            return
        if state["failing"] is None:
            pos = state["skipped"] + state["generated"]
            state["combo"] = self.array[pos] if pos < len(self.array) else None
        if state["combo"] is not None:  # a covering-array case (while shrinking: the failing one's row)
            case = self.family.force(case, state["combo"], t)
        if state["failing"] is None:
            _trace(self.trace, c.id, t.name, state, self.o.skip, self.started_wall)
        _announce(self.case_file, c.id, t.name, self.sub, case, "generated" if state["failing"] is None else "shrink")
        try:
            v, m = _checked(c, case, t)
        except CaseError as exc:  # a generator bug: no shrinking, no database entry
            state["case_error"] = exc
            raise _Stop from None
        except (SubjectSkip, SubjectError) as exc:
            if state["failing"] is not None:
                return  # while shrinking: a case the subject cannot run is not the failure
            state["subject_stop"] = exc  # no verdict, so nothing to shrink or save
            raise _Stop from None
        ids = self.classify(v) if v else None
        if state["failing"] is None:
            self.count_case(case, v, m, ids)
        # only an unexplained violation falsifies: the shrinker never moves toward a known signature
        if v and not ids:
            if state["failing"] is None:
                self.note_first()
            state["failing"] = (case, v)
            raise _Falsified(str(v[0]))
        if state["failing"] is None:
            state["combo"] = None

    def count_case(self, case, v, m, ids) -> None:
        """A generated case checked (not a shrink's replay): its reach, its count, its margin or known finding."""
        state = self.state
        if self.family is not None:
            hit = self.family.hit(case, self.t)
            for k, val in sorted(hit, key=repr):
                hyp_event(f"{k}={val}")
            self.row.reach_covered |= dimensions.covered_by(self.required, hit)
        rc = _case_reach(case)
        self.row.case_reach[rc] = self.row.case_reach.get(rc, 0) + 1
        state["generated"] += 1
        if self.o.progress:
            self.o.progress(state["pinned"], state["generated"])
        if not v:
            self.note_margin(m)
        elif ids:
            self.note_known(case, v, ids)

    def hypothesis_test(self):
        """The row's Hypothesis test: the row's settings, database key and seed."""
        c, t, base = self.c, self.t, self.base

        def _property(case):
            self.check_case(case)

        if self.o.first_violation:  # no shrink (nor explain, which needs one): the first failing case ends the row
            from hypothesis import Phase

            s = settings(base, max_examples=self.n, report_multiple_bugs=False,
                         phases=tuple(p for p in base.phases if p not in (Phase.shrink, Phase.explain)))
        else:
            s = settings(base, max_examples=self.n)
        test = s(given(c.cases(t))(_property))
        # the example database's key for this row: Hypothesis would key it by this inner function's source,
        # the same for every row, and replay a failure one contract saved into all the others
        test._hypothesis_internal_database_key = database_key(c.id, t.name, self.sub)
        if self.o.seed is not None:
            # what ``@hypothesis.seed`` sets, without the rest of it: that decorator also turns the example
            # database off, so a seeded nightly row would neither replay earlier failures nor save its own
            test._hypothesis_internal_use_seed = self.o.seed
        return test

    def run_generated(self) -> None:
        state = self.state
        if not (state["failing"] is None and state["stop"] is None and self.n > self.o.skip):
            if state["stop"] is None and state["failing"] is None:
                state["stop"] = "max_cases" if self.limit_is_max_cases else "exhausted"
            return
        from hypothesis.reporting import current_reporter, with_reporter

        outer = current_reporter()

        def _reporter(text):
            # after a stop Hypothesis offers "reproduce this failure by adding @seed(...)": there was none
            if state["stop"] is None:
                outer(text)

        try:
            with with_reporter(_reporter):
                self.hypothesis_test()()
        except _Stop:
            if state.get("case_error") is not None:
                raise state["case_error"] from None
            if state.get("subject_stop") is not None:
                raise state["subject_stop"] from None
        except _Falsified:
            pass
        except (CaseError, SubjectSkip, SubjectError):
            raise
        except Exception as exc:  # Hypothesis' own errors (flaky replay after the shrink cut-off, ...)
            if state["failing"] is None:
                raise exc
        if state["stop"] is None and state["failing"] is None:
            # Hypothesis ended by itself: the limit reached, or no new distinct case left to draw
            if self.o.skip + state["generated"] >= self.n and self.limit_is_max_cases:
                state["stop"] = "max_cases"
            else:
                state["stop"] = "exhausted"

    def run(self) -> RowResult:
        row, sub, t = self.row, self.sub, self.t
        try:
            self.setup()
            self.run_pinned()
            self.run_generated()
        except _Stop:  # pragma: no cover - raised only inside the Hypothesis run
            pass
        except (KeyboardInterrupt, SystemExit):
            raise
        except CaseError as exc:
            row.status = "error"
            row.reason = f"malformed case (a generator or pinned example bug, not a verdict): {exc}"
        except SubjectSkip as exc:  # an entry point the subject lacks, or a row it cannot run here: no verdict
            row.status = "skipped"
            row.reason = exc.reason(sub.label)
        except SubjectError as exc:  # the interpreter's fidelity, a symbol an adapter needs, a stand-in reached
            row.status = "error"
            row.reason = (f"subject {sub.label} on {t.name}: {failure_cause(exc, sub)}" if sub.name != "ours" else
                          str(exc)) or "the interpreter's fidelity for this subject is not established"
        except BaseException as exc:  # noqa: BLE001 - harness failure, not a contract verdict
            row.status = "error"
            row.reason = failure_cause(exc, sub)
            if self.state["pinned"] + self.state["generated"] == 0 and sub.name != "ours":
                row.reason = f"subject {sub.label} could not run on {t.name}: {row.reason}"
        _fill(row, self.state, self.start)
        if row.status in ("error", "skipped"):
            return row
        return self.verdict()

    def verdict(self) -> RowResult:
        row, state = self.row, self.state
        row.findings = list(state["known_ids"])
        done = self.o.skip + state["generated"]
        least = min(self.min_generated, self.n)
        if state["failing"] is not None:
            row.case, row.violations = state["failing"]
            row.status = "fail"
            row.reason = str(row.violations[0]) if row.violations else "failed"
            self.write_repro()
        elif state["known"] is not None:
            row.case, row.violations, ids = state["known"]
            row.status = "known"
            row.reason = known_reason(row.findings, row.violations)
            if self.o.known_repro:
                self.write_repro(ids)
        elif state["pinned"] < len(self.pinned):
            row.status = "incomplete"
            row.reason = f"{self.ran_out(state['stop'])} after {state['pinned']} of {len(self.pinned)} pinned examples"
        elif state["stop"] in ("budget", "deadline") and done < least:
            row.status = "incomplete"
            row.reason = f"{self.ran_out(state['stop'])} after {done} of at least {least} generated cases"
        elif state["stop"] == "max_cases" and done < self.min_generated:
            # a case limit below the contract's minimum is not evidence either; the row says the limit did it, not
            # the clock (an exhausted space, by contrast, means every distinct case was checked)
            row.status = "incomplete"
            row.reason = (f"the case limit stopped the row at {done} generated cases, below the contract's "
                          f"minimum of {self.min_generated}")
        row.reach = reach_doc(self.required, row.reach_covered, self.exhaustive)
        row.reach_enforced = self.enforce_reach
        if self.enforce_reach and self.o.skip == 0:
            reach_verdict(row)
        return row

    def ran_out(self, stop: str) -> str:
        if stop == "deadline":
            return f"the deadline of {self.o.deadline_s or 0:g}s (--deadline) ran out"
        return f"the budget of {self.o.budget:.1f}s ran out"

    def write_repro(self, ids=None) -> None:
        if self.o.repro_dir is not None:
            self.row.repro = write_repro(os.path.join(self.o.repro_dir, repro_name(self.c.id, self.t.name, self.sub)),
                                         self.c, self.t, self.row.case, self.row.violations, self.sub, ids)


def reach_verdict(row: RowResult) -> None:
    """A passing ``ci`` row that missed a declared tuple is ``incomplete``, naming what it missed."""
    missing = (row.reach or {}).get("missing") or []
    if row.status == "pass" and missing and getattr(row, "reach_enforced", False):
        row.status = "incomplete"
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        row.reason = f"declared pairs not reached by the generated cases: {shown}"


def with_notes(reason: str, notes) -> str:
    """``reason`` followed by a row's notes (what its checks left unchecked), ``; `` between them."""
    return "; ".join([reason, *notes] if reason else notes)


def known_reason(ids, violations) -> str:
    """A known row's reason: the finding ids, then the first violation of its first known case."""
    return (f"known finding{'s' if len(ids) > 1 else ''} {', '.join(ids)}: "
            + (str(violations[0]) if violations else "no violation recorded"))


def _fill(row: RowResult, state: dict, start: float) -> None:
    row.seconds = time.monotonic() - start
    row.time_split = timesplit.drain(start, row.seconds)  # the checks this row ran since it started
    row.spec_keys = specializations.drain(start)
    row.pinned_cases = state["pinned"]
    row.generated_cases = state["generated"]
    row.stopped_by = "budget" if state["stop"] == "deadline" else state["stop"]  # a time stop either way
    row.margin = state["margin"]
    row.first_violation = state.get("first_violation")


def _load_repro(path: str):
    """The repro document, its contract, target and case, each checked; any problem is a :class:`ReproError`."""
    from contracts.registry import get_contract

    try:
        with open(path) as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReproError(f"{path}: cannot read the file: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReproError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(doc, dict):
        raise ReproError(f"{path}: not an smv repro file: the JSON is a {type(doc).__name__}, not an object")
    missing = [k for k in ("contract", "target", "case") if k not in doc]
    if missing:
        raise ReproError(f"{path}: not an smv repro file: missing {', '.join(repr(k) for k in missing)} "
                         f"(a repro file has 'schema_version', 'contract', 'target' and 'case')")
    version = doc.get("schema_version")
    if isinstance(version, bool) or version not in REPRO_READS:
        has = "no schema_version" if "schema_version" not in doc else f"schema_version {version!r}"
        raise ReproError(f"{path}: repro file has {has}; the supported versions are "
                         f"{' and '.join(map(str, REPRO_READS))} (re-run the audit to write a fresh one)")
    if not isinstance(doc["contract"], str):
        raise ReproError(f"{path}: 'contract' must be a contract id string, got {doc['contract']!r}")
    if not isinstance(doc["target"], str):
        raise ReproError(f"{path}: 'target' must be a target name string, got {doc['target']!r}")
    try:
        c = get_contract(doc["contract"])
    except ValueError as exc:
        raise ReproError(f"{path}: {exc}") from None
    try:
        t = get_target(doc["target"])
    except (ValueError, KeyError) as exc:
        raise ReproError(f"{path}: unknown target {doc['target']!r}: {exc}") from None
    spec = "ours"  # version 2 knew one subject; a version-3 file without one means it too
    for k in ("subject", "subject_spec"):
        if version >= 3 and k in doc:
            if not isinstance(doc[k], str) or not doc[k].strip():
                raise ReproError(f"{path}: {k!r} must be a subject spec string (ours, vllm==VERSION, vllm@PATH), "
                                 f"got {doc[k]!r}")
            spec = doc[k]
    case = doc["case"]
    if c.case_type is not None:
        try:
            case = c.case_type.from_json(case)
        except CaseError as exc:
            raise ReproError(f"{path}: malformed case for {c.id}: {exc}") from None
    return c, t, case, spec


@dataclass
class Replayed:
    contract: Contract
    target: Target
    case: object
    violations: list
    subject: Subject
    #: ids of the known findings that explain every violation (None: some violation is unexplained, or none)
    findings: list | None = None


def replay_row(path: str, subject: "Subject | str | None" = None, findings: list | None = None) -> Replayed:
    """Re-run the case saved in a repro file under the subject it records (``subject`` overrides it) and say
    whether known findings explain what it gives now. A file that cannot be replayed (unreadable, not JSON, not a
    repro, an unknown contract or target, another schema version, a malformed case, a subject that cannot be
    loaded or lacks the entry point) is a :class:`ReproError` naming the file, never a violation."""
    from contracts.subjects import SubjectSpecError

    c, t, case, spec = _load_repro(path)
    try:
        sub = resolve_subject(spec if subject is None else subject)
    except SubjectSpecError as exc:
        raise ReproError(f"{path}: {exc}" + ("" if subject is not None else
                                             " (--subject replays it under another subject)")) from None
    try:
        with using(sub):
            try:
                sub.bind(t)
            except (SubjectSkip, SubjectError, KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # noqa: BLE001 - the subject cannot load: no verdict either
                raise ReproError(f"{path}: subject {sub.label} could not run on {t.name}: "
                                 f"{failure_cause(exc, sub)}") from None
            v = checked(c, case, t)
    except CaseError as exc:
        raise ReproError(f"{path}: malformed case for {c.id}: {exc}") from None
    except SubjectSkip as exc:
        raise ReproError(f"{path}: cannot replay: {exc.reason(sub.label)}") from None
    except SubjectError as exc:
        raise ReproError(f"{path}: cannot replay: {failure_cause(exc, sub)}") from None
    known = known_findings.load() if findings is None else findings
    ids = known_findings.classify(v, known, c.id, sub.name, sub.version, t.name,
                                  root=known_findings.subject_root(sub))
    return Replayed(c, t, case, v, sub, ids)


def replay(path: str) -> tuple[Contract, Target, object, list[Violation]]:
    """Re-run the case saved in a repro file (under the subject it records); returns the violations it gives now.
    A file that cannot be replayed is a :class:`ReproError` naming the file (see :func:`replay_row`)."""
    r = replay_row(path)
    return r.contract, r.target, r.case, r.violations


# ---------------------------------------------------------------------------------------------------------------
# The audit's two passes of a row (the serial audit and an audit worker both run rows so)
# ---------------------------------------------------------------------------------------------------------------

def first_pass(c: Contract, tname: str, opts: RowOptions, first: int, progress=None) -> RowResult:
    """A row's first pass: its pinned examples and generated cases up to ``first`` (its minimum, which the budget
    never cuts: only ``opts.deadline`` does); a row that met its minimum with more to do is ``resumable``."""
    r = run_contract(c, tname, opts, stop_after=first, progress=progress, minimum_first=True)
    if r.stopped_by == "stop_after":
        # the row met its minimum and has more to do: only the budget can keep it from that now
        r.stopped_by = "budget"
        r.resumable = True
    return r


def second_pass(r0: RowResult, c: Contract, opts: RowOptions, budget: float, progress=None) -> RowResult:
    """The row continued past its first pass (same seed, those cases skipped) within ``budget``, merged with it."""
    r = run_contract(c, r0.target, opts, budget=budget, use_examples=False, skip=r0.generated_cases,
                     known_repro=r0.status != "known", progress=progress)
    return merge_passes(r0, r)


def merge_passes(first: RowResult, second: RowResult) -> RowResult:
    """One row from the two passes: generated cases and time add up, the second pass says what stopped the row;
    a failure or a harness error of the second pass wins, then a known case of either; the second pass running
    out of budget is no loss (the first already reached the minimum). A second-pass failure's ``first_violation``
    counts the first pass's cases and seconds too."""
    margins = [m for m in (first.margin, second.margin) if m is not None]
    merged = RowResult(first.contract, first.target, first.status, first.reason, first.pinned_cases,
                       first.generated_cases + second.generated_cases, first.seconds + second.seconds,
                       first.violations, first.repro, first.case, second.stopped_by or first.stopped_by,
                       max(margins) if margins else None, first.limit, subject=first.subject,
                       findings=list(first.findings) + [f for f in second.findings if f not in first.findings])
    merged.time_split = timesplit.add_splits(first.time_split or timesplit.zero_split(first.seconds),
                                             second.time_split or timesplit.zero_split(second.seconds))
    merged.spec_keys = specializations.merge(first.spec_keys, second.spec_keys)
    merged.reach_required = first.reach_required
    merged.reach_covered = set(first.reach_covered) | set(second.reach_covered)
    merged.case_reach = {k: first.case_reach.get(k, 0) + second.case_reach.get(k, 0)
                         for k in sorted(set(first.case_reach) | set(second.case_reach))}
    merged.reach_enforced = first.reach_enforced
    merged.notes = list(first.notes) + [n for n in second.notes if n not in first.notes]
    merged.reach = reach_doc(first.reach_required, merged.reach_covered,
                             bool((first.reach or {}).get("exhaustive")))
    _merge_verdict(merged, first, second)
    reach_verdict(merged)
    return merged


def _merge_verdict(merged: RowResult, first: RowResult, second: RowResult) -> None:
    if second.status in ("fail", "error"):
        merged.status, merged.reason = second.status, second.reason
        merged.violations, merged.repro, merged.case = second.violations, second.repro, second.case
        if second.first_violation is not None:  # the second pass's own counts, after all of the first's
            merged.first_violation = {"cases": first.cases + second.first_violation["cases"],
                                      "seconds": first.seconds + second.first_violation["seconds"]}
    elif first.status == "known":
        merged.reason = with_notes(known_reason(merged.findings, first.violations), merged.notes)
    elif second.status == "known":
        merged.status = "known"
        merged.violations, merged.repro, merged.case = second.violations, second.repro, second.case
        merged.reason = with_notes(known_reason(merged.findings, second.violations), merged.notes)
    elif merged.status == "pass":
        merged.reason = with_notes("", merged.notes)
