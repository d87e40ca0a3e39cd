"""``smv audit --jobs N``: the audit's rows on N worker processes instead of one.

A native audit on a cold GPU host is bound by Triton compilation (audit.json's ``time_split``: 94% of a cold H200
audit's seconds), which runs on one core per process while the host has many. The rows are independent, so N
worker processes (``contracts.engine.campaign_worker``, the campaign's workers, pinned round-robin to the visible GPUs)
compile N rows' kernels at once and share the on-disk Triton cache.

The verdicts are the serial audit's: each row runs the same two passes (:func:`contracts.engine.audit.first_pass`, then,
once every row has had its first pass, :func:`contracts.engine.audit.second_pass` over what is left of the budget) with
the same seed, profile, case limits and known findings; a row's first-pass result stays in the worker that ran it,
which also runs its second pass and merges the two. Only the budget's sharing differs: rows run side by side, each
first pass may take up to half of what is left (as serially), and the second passes of one worker's rows share what
is left of the budget between them.

A worker that dies while checking a row makes the row an ``error`` naming the signal, with the case it was
checking as a reproducer (``smv repro`` replays it in a subprocess); one that runs past the row's budget and its
case time limit (the contract's, or ``--case-timeout``) is killed and the row is an ``error`` too (a hang). A new worker takes the next row either way.
The other rows whose first passes the dead worker held run again whole (both passes, the same cases) on a worker that
is alive, so one row's crash never cuts another row's cases short.
"""
from __future__ import annotations

import os
import selectors
import tempfile
import time
from collections import deque

from contracts.registry import get_contract
from contracts.engine.runner import RowResult, run_contract

#: seconds between the heartbeat lines that say what the workers are doing
HEARTBEAT_S = 30.0


class RowDoc:
    """A finished row as its worker answered it (audit.json's row): what the report and the progress lines read."""

    def __init__(self, doc: dict, resumable: bool = False, limit: int | None = None):
        self.doc = doc
        self.resumable = resumable
        self.limit = limit

    def __getattr__(self, name: str):
        try:
            return self.__dict__["doc"][name]
        except KeyError:
            raise AttributeError(name) from None

    def as_json(self) -> dict:
        return self.doc


# ---------------------------------------------------------------------------------------------------------------
# Worker side (called by contracts.engine.campaign_worker for an item that carries "audit")
# ---------------------------------------------------------------------------------------------------------------

#: the pass number of a row run whole (first pass, then second) on a new worker: the worker that held its first pass
#: died on another row, so no live worker holds that pass; the same seed gives the same cases again
AGAIN = 3


def run_item(item: dict, subjects: dict, held: dict) -> dict:
    """One pass of one row in a worker; ``held`` keeps each row's result for its second pass."""
    from contracts.engine import audit
    from contracts.engine import findings as known_findings
    from contracts.registry import load_all
    from contracts.engine.runner import resolve_subject

    a = item["audit"]
    spec = item["subject"]
    if spec not in subjects:
        subjects[spec] = resolve_subject(None if spec == "ours" else spec)
    sub = subjects[spec]
    c = get_contract(item["contract"])
    known = known_findings.load(a["findings_path"], known_contracts=set(load_all()))
    common = dict(profile=item["profile"], seed=item["seed"], repro_dir=a["repro_dir"],
                  max_examples=a["max_examples"], shrink_until=a["shrink_until"], subject=sub, findings=known)
    key = (spec, item["contract"], item["target"])
    start = time.monotonic()
    if a["pass"] == 2:
        r = audit.second_pass(held[key], c, item["budget"], common)
    else:
        r = audit.first_pass(c, item["target"], item["budget"], a["use_examples"], a["first"], common)
        if a["pass"] == AGAIN:  # its first pass died with another worker: both passes here, as the serial audit's
            left = item["budget"] - (time.monotonic() - start)
            if r.status in audit.RESUMABLE and r.resumable and left > 0.05:
                r = audit.second_pass(r, c, left, common)
    held[key] = r
    return {"done": item["g"], "row": r.as_json(), "resumable": bool(r.resumable), "limit": r.limit,
            "describe": sub.describe(), "seconds": round(time.monotonic() - start, 3)}


def merge_describe(into: dict, more: dict) -> dict:
    """A subject's description with what a worker loaded added (its modules' hashes, the rewrites it applied)."""
    out = dict(into)
    out["modules"] = dict(sorted({**(into.get("modules") or {}), **(more.get("modules") or {})}.items()))
    out["rewrites"] = list(into.get("rewrites") or []) + [x for x in more.get("rewrites") or []
                                                         if x not in (into.get("rewrites") or [])]
    if "standins" in into or "standins" in more:  # per name, the targets' answers of both sides
        names: dict = {}
        for s in list(into.get("standins") or []) + list(more.get("standins") or []):
            names.setdefault(s["name"], {}).update(s["served"])
        out["standins"] = [{"name": k, "served": dict(sorted(v.items()))} for k, v in sorted(names.items())]
    return out


# ---------------------------------------------------------------------------------------------------------------
# Supervisor side
# ---------------------------------------------------------------------------------------------------------------

def _failed_row(c, tname: str, sub, status_reason: str, base: "RowDoc | None", seconds: float) -> RowDoc:
    """The row a dead or hung worker leaves: an error, keeping a first pass's counts when there was one."""
    if base is not None:
        doc = dict(base.doc, status="error", reason=status_reason, stopped_by=None)
        doc["seconds"] = round(base.doc["seconds"] + seconds, 3)
    else:
        doc = RowResult(c.id, tname, "error", reason=status_reason, seconds=seconds,
                        subject=sub.as_row()).as_json()
    doc["violations"] = [{"message": status_reason, "where": "", "expected": "a verdict",
                          "got": status_reason.split(":", 1)[0]}] + list(doc.get("violations") or [])[:4]
    return RowDoc(doc)


def audit_subject(sub, ids, targets, *, jobs: int, budget: float, profile: str, seed: int, repro_dir: str,
                  use_examples: bool, max_cases, shrink_until, findings_path, prog, results: list, limit_of,
                  on_row, seconds: dict, described: dict, work_dir: str | None, stream,
                  case_timeout: float | None = None) -> None:
    """Every row of one subject on ``jobs`` workers, within ``budget`` (appended to ``results`` in row order)."""
    from contracts.engine.audit import not_started
    from contracts.engine.workers import Worker, _case_limit, _label_suffix, poll_answers, \
        start_error, stop_workers, unwatch, visible_devices
    from contracts.engine.runner import subject_spec

    spec = subject_spec(sub)
    rows = [(cid, t) for cid in ids for t in targets]
    n_rows = len(rows)
    t0 = time.monotonic()
    deadline = t0 + budget
    first_index = len(results)
    slots: list = [None] * n_rows
    prog.start_subject(sub.label, deadline)
    prog.start_pass(1, n_rows, f"each up to its minimum of generated cases, on {jobs} workers")
    todo: deque = deque()
    for i, (cid, tname) in enumerate(rows):
        c = get_contract(cid)
        if c.applies_to(tname):
            todo.append(i)
            prog.cases_left[(sub.label, cid, tname)] = limit_of(c)
        else:
            slots[i] = run_contract(c, tname, budget=1.0, subject=sub)  # the skipped row, with its reason
    owner: dict[int, str] = {}  # row -> the worker holding its first pass
    second: dict[str, deque] = {}  # worker id -> its rows' second passes still to run
    again: deque = deque()  # rows whose held first pass died with its worker: run whole on another
    phase = [1]
    kind, ids_dev = visible_devices()
    base_dir = work_dir or tempfile.mkdtemp(prefix="smv-audit-")
    serial = [0]
    workers: list = []
    sel = selectors.DefaultSelector()

    def publish() -> None:
        results[first_index:] = [s for s in slots if s is not None]
        on_row()

    def spawn(slot: int):
        dev = (kind, ids_dev[slot % len(ids_dev)]) if ids_dev else ("cpu", None)
        w = Worker(f"a{serial[0]}", dev, base_dir, {})
        serial[0] += 1
        w.slot = slot
        workers.append(w)
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        return w

    def item_for(i: int, pass_no: int, row_budget: float) -> dict:
        cid, tname = rows[i]
        c = get_contract(cid)
        n = limit_of(c)
        return {"g": i, "subject": spec, "contract": cid, "target": tname, "profile": profile, "seed": seed,
                "budget": round(max(0.05, row_budget), 3),
                "audit": {"pass": pass_no, "use_examples": use_examples, "first": min(c.min_cases, n),
                          "max_examples": max_cases, "shrink_until": shrink_until, "repro_dir": repro_dir,
                          "findings_path": findings_path}}

    def finish(w, msg: dict) -> None:
        i = w.item["g"]
        pass_no = w.item["audit"]["pass"]
        if "row" in msg:
            r = RowDoc(msg["row"], resumable=msg.get("resumable", False), limit=msg.get("limit"))
            described[sub.label] = merge_describe(described.get(sub.label) or sub.describe(), msg["describe"])
            if pass_no == AGAIN and r.status == "incomplete" and isinstance(slots[i], RowDoc):
                r = slots[i]  # the re-run's share ran out before the minimum the held pass had reached: keep that
            if pass_no == 1:
                owner[i] = w.id
            else:
                owner.pop(i, None)  # its second pass is done: nothing of it is held any more
        else:  # the harness raised in the worker
            c = get_contract(rows[i][0])
            r = _failed_row(c, rows[i][1], sub, f"error: the worker could not run the row: {msg.get('error')}",
                            slots[i] if pass_no != 1 else None, time.monotonic() - w.item_started)
            owner.pop(i, None)
        slots[i] = r
        w.item = None
        prog.pass_no = min(pass_no, 2)  # a row run again whole reports as its second pass does
        prog.row(i + 1, n_rows, r)
        publish()

    def ready(w) -> None:
        start_failures[0] = 0

    def lost(w, what: str) -> None:
        """``w`` died or hung while checking its row."""
        i = w.item["g"]
        cid, tname = rows[i]
        c = get_contract(cid)
        reason, repro = w.lost(what, _case_limit(c, case_timeout), os.path.join(
            repro_dir, f"{cid}-{tname}{_label_suffix(sub.label)}-{what}.json"), cid, tname, sub.label, spec)
        if repro is None:
            reason += f"; log: {os.path.join(w.dir, 'worker.log')}"
        r = _failed_row(c, tname, sub, reason, slots[i] if w.item["audit"]["pass"] != 1 else None,
                        time.monotonic() - w.item_started)
        r.doc["repro"] = repro
        slots[i] = r
        w.item = None
        prog.row(i + 1, n_rows, r)
        publish()

    def next_item(w):
        left = deadline - time.monotonic()
        if phase[0] == 1:
            if not todo:
                return None
            if left <= 0:
                return None
            i = todo.popleft()
            remaining = len(todo)
            return item_for(i, 1, min(left, max(left / (remaining + 1), 0.5 * left)))
        if left <= 0.05:
            return None
        mine = second.get(w.id)
        if mine:
            i = mine.popleft()
            return item_for(i, 2, left / (len(mine) + len(again) + 1))
        if again:
            i = again.popleft()
            return item_for(i, AGAIN, left / (len(again) + 1))
        return None

    last_beat = time.monotonic()
    start_failures = [0]  # workers in a row that died before they became ready
    try:
        for slot in range(max(1, min(jobs, len(todo)))):
            spawn(slot)
        while True:
            busy = [w for w in workers if w.item is not None]
            if phase[0] == 1 and not todo and not busy:
                phase[0] = 2
                for k in range(n_rows):
                    r = slots[k]
                    if (isinstance(r, RowDoc) and r.resumable and r.status in ("pass", "known")
                            and owner.get(k) in {w.id for w in workers}):
                        second.setdefault(owner[k], deque()).append(k)
                prog.start_pass(2, sum(len(q) for q in second.values()),
                                "sharing what is left for more generated cases")
            if phase[0] == 1 and todo and deadline - time.monotonic() <= 0:
                while todo:  # the budget is spent: what was not started says so
                    i = todo.popleft()
                    cid, tname = rows[i]
                    slots[i] = not_started(cid, tname, limit_of(get_contract(cid)), sub, budget)
                    prog.row(i + 1, n_rows, slots[i])
                publish()
            if phase[0] == 2 and not busy and (deadline - time.monotonic() <= 0.05
                                                or not (again or any(second.get(w.id) for w in workers))):
                break
            for w in workers:
                if w.ready and w.item is None:
                    item = next_item(w)
                    if item is not None:
                        w.start_item(item)
            poll_answers(sel, ready, finish)
            for w in list(workers):
                dead = w.proc.poll() is not None
                hung = not dead and w.stalled(  # as the campaign judges it: no case ended within the limit
                    _case_limit(get_contract(w.item["contract"]), case_timeout) if w.item is not None else 0.0,
                    w.item["budget"] if w.item is not None else 0.0)
                if not (dead or hung):
                    continue
                w.kill()
                if w.item is not None:
                    lost(w, "hang" if hung else "crash")
                elif not w.ready:
                    start_failures[0] += 1
                    if start_failures[0] >= 3 and not (phase[0] == 1 and todo):
                        # only rows held by dead workers were left to run again: they keep their first passes
                        stream.write(f"smv audit: 3 workers in a row died before they could take a row; "
                                     f"{len(again)} row(s) keep their first passes\n")
                        again.clear()
                    elif start_failures[0] >= 3:
                        raise start_error(w, "audit workers")
                unwatch(sel, w)
                workers.remove(w)
                # the first passes it held died with it: those rows run again whole elsewhere, so a crash in one
                # row never cuts another row's cases short (the serial audit would have run their second passes)
                second.pop(w.id, None)
                again.extend(k for k, o in sorted(owner.items()) if o == w.id and isinstance(slots[k], RowDoc)
                             and slots[k].resumable and slots[k].status in ("pass", "known"))
                for k in [k for k, o in owner.items() if o == w.id]:
                    del owner[k]
                if (phase[0] == 1 and todo or again) and deadline - time.monotonic() > 0.05:
                    nw = spawn(w.slot)
                    stream.write(f"smv audit: started worker {nw.id} on {nw.device_name} in place of {w.id}\n")
            if prog.enabled and time.monotonic() - last_beat >= HEARTBEAT_S:
                last_beat = time.monotonic()
                running = [f"{w.item['contract']} on {w.item['target']}" for w in workers if w.item is not None]
                done = sum(s is not None for s in slots)
                stream.write(f"smv audit: {done} of {n_rows} rows done under {sub.label}, {len(running)} running "
                             f"({', '.join(running[:4])}{' ...' if len(running) > 4 else ''}), "
                             f"{max(0.0, deadline - time.monotonic()):.0f}s of budget left\n")
                stream.flush()
    finally:
        stop_workers(workers)
        seconds[sub.label] = time.monotonic() - t0
    for i, (cid, tname) in enumerate(rows):  # a row a dead worker's queue never reached
        if slots[i] is None:
            slots[i] = not_started(cid, tname, limit_of(get_contract(cid)), sub, budget)
    results[first_index:] = slots
