"""``smv findings check``: replay each known finding's stored reproducer under a subject and say whether the
finding is still present there, fixed, not applicable, or about code that changed."""
from __future__ import annotations

import json
import os

from contracts.engine.findings import subject_root
from contracts.engine.runner import replay_row
from contracts.subjects import FidelityError, SubjectSkip, using
from impl.targets import TARGET_NAMES


class SubjectLoadError(ValueError):
    """The subject a check replays under cannot be loaded; one line."""


def _repro_target(path: str) -> str | None:
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None  # the replay says what is wrong with the file
    t = doc.get("target") if isinstance(doc, dict) else None
    return t if isinstance(t, str) else None


def _triage(f, subject, root) -> dict:
    """The finding's row before any replay: its ``code_changed``, and a status already when nothing is to replay."""
    changed = not f.code_matches(root) if root is not None and f.functions else None
    row = {"id": f.id, "status": "", "code_changed": changed, "detail": ""}
    gone = [fn for fn in f.functions if root is not None and fn.hash_in(root) is None]
    path = f.reproducer
    if subject.name not in f.subjects:
        row["status"], row["detail"] = "not_applicable", f"about {', '.join(f.subjects)}, not {subject.name}"
    elif gone:
        row["status"], row["detail"] = "not_applicable", f"{gone[0].module} has no {gone[0].qualname}"
    elif not path or not os.path.exists(path):
        where = os.path.relpath(path, os.path.dirname(f.source)) if path else "reproducer"
        row["status"], row["detail"] = "no_reproducer", f"no {where} beside {os.path.basename(f.source)}"
    return row


def _bind_targets(subject, replays) -> None:
    """Bind the subject to every target the reproducers use, so a subject that cannot load says so once."""
    targets = []
    for f, _ in replays:
        t = _repro_target(f.reproducer)
        if t in TARGET_NAMES and t not in targets:  # anything else: the replay says what is wrong, per finding
            targets.append(t)
    for t in targets:
        try:
            with using(subject):
                subject.bind(t)
        except (SubjectSkip, FidelityError):
            continue  # a target this host cannot run: the replay says so, per finding
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - the subject's code does not import
            msg = " ".join(f"{type(exc).__name__}: {exc}".split())
            raise SubjectLoadError(f"subject {subject.label} could not be loaded for {t}: {msg}") from None


def _replay(f, row: dict, subject) -> None:
    try:
        r = replay_row(f.reproducer, subject, findings=[f])
    except (OSError, ValueError) as exc:  # ReproError is a ValueError
        row["status"], row["detail"] = "error", " ".join(str(exc).split())
        return
    hits = [v for v in r.violations if f.explains(v.message)]
    row["status"] = "present" if hits else "fixed"
    row["detail"] = (f"{r.target.name}: {hits[0].message}" if hits else
                     f"{r.target.name}: " + (f"other violations only: {r.violations[0].message}"
                                             if r.violations else "no violation"))


def check(findings, subject) -> list[dict]:
    """Replay each finding's stored reproducer under ``subject`` (a :class:`~contracts.subjects.Subject`):
    ``{"id", "status", "code_changed", "detail"}`` per finding, in file order. ``status``: ``present`` (a violation
    matches the finding's signature), ``fixed`` (none does, whatever the code), ``not_applicable`` (a listed
    function is gone from the subject's tree, or the finding is not about this subject), ``no_reproducer`` (none is
    stored), ``error`` (the reproducer cannot be replayed; ``detail`` says why). ``code_changed``: no hash of some
    listed function matches the subject's tree (None where that cannot be told: no tree, no functions).

    The subject is bound to every target the reproducers to replay use before any is replayed; a subject that
    cannot load raises :class:`SubjectLoadError`."""
    root = subject_root(subject)
    out = [_triage(f, subject, root) for f in findings]
    replays = [(f, row) for f, row in zip(findings, out) if not row["status"]]
    _bind_targets(subject, replays)
    for f, row in replays:
        _replay(f, row, subject)
    return out
