"""``smv audit --jobs N``: the audit's rows on N worker processes instead of one.

A native audit on a cold GPU host is bound by Triton compilation (audit.json's ``time_split``: 94% of a cold H200
audit's seconds), which runs on one core per process while the host has many. The rows are independent, so N
worker processes (``contracts.engine.campaign_worker``, the campaign's workers, pinned round-robin to the visible GPUs)
compile N rows' kernels at once and share the on-disk Triton cache.

The verdicts are the serial audit's: each row runs the same two passes (:func:`contracts.engine.runner.first_pass`,
its minimum, which only ``--deadline`` cuts, then, once every row has had its first pass,
:func:`contracts.engine.runner.second_pass` over what is left of the budget) with the same seed, profile, case limits
and known findings (one :class:`contracts.engine.plan.AuditConfig`, sent to the workers); a row's first-pass result
stays in the worker that ran it, which also runs its second pass and merges the two. Only the budget's sharing
differs: rows run side by side, and the second passes of one worker's rows share what is left of the budget between
them.

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
from contracts.engine.plan import RESUMABLE, AuditConfig, SubjectRun, first_share, not_started, record
from contracts.engine.runner import (RowResult, first_pass, resolve_subject, run_contract, second_pass,
                                     subject_spec)

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
    from contracts.engine import findings as known_findings
    from contracts.registry import load_all

    a = item["audit"]
    spec = item["subject"]
    if spec not in subjects:
        subjects[spec] = resolve_subject(None if spec == "ours" else spec)
    sub = subjects[spec]
    c = get_contract(item["contract"])
    known = known_findings.load(a["config"]["findings_path"], known_contracts=set(load_all()))
    cfg = AuditConfig.from_worker(a["config"], known)
    opts = cfg.row_options(sub, item["budget"])
    key = (spec, item["contract"], item["target"])
    start, cpu0 = time.monotonic(), time.process_time()
    if a["pass"] == 2:
        r = second_pass(held[key], c, opts, item["budget"])
    else:
        r = first_pass(c, item["target"], opts, a["first"])
        if a["pass"] == AGAIN:  # its first pass died with another worker: both passes here, as the serial audit's
            left = min(item["budget"] - (time.monotonic() - start), cfg.time_left(float("inf")))
            if r.status in RESUMABLE and r.resumable and left > 0.05:
                r = second_pass(r, c, opts, left)
    held[key] = r
    return {"done": item["g"], "row": r.as_json(), "resumable": bool(r.resumable), "limit": r.limit,
            "describe": sub.describe(), "seconds": round(time.monotonic() - start, 3),
            "cpu": round(time.process_time() - cpu0, 3)}


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


def audit_subject(sub, rows: list, cfg: AuditConfig, run: SubjectRun) -> None:
    """Every row of one subject on ``cfg.jobs`` workers: every row's minimum, then what is left of the budget
    (appended to ``run.results`` in row order)."""
    pool = _Pool(sub, rows, cfg, run)
    try:
        pool.spawn_all()
        pool.loop()
    finally:
        pool.stop()
    pool.close_out()


class _Pool:
    """The supervisor of one subject's rows on worker processes."""

    def __init__(self, sub, rows: list, cfg: AuditConfig, run: SubjectRun):
        from contracts.engine.workers import visible_devices

        self.sub, self.rows, self.cfg, self.run, self.prog = sub, rows, cfg, run, run.prog
        self.spec = subject_spec(sub)
        self.n_rows = len(rows)
        self.t0 = time.monotonic()
        self.budget_end = self.t0 + cfg.budget
        self.first_index = len(run.results)
        self.slots: list = [None] * self.n_rows
        self.todo: deque = deque()
        self.owner: dict[int, str] = {}  # row -> the worker holding its first pass
        self.second: dict[str, deque] = {}  # worker id -> its rows' second passes still to run
        self.again: deque = deque()  # rows whose held first pass died with its worker: run whole on another
        self.phase = 1
        self.kind, self.ids_dev = visible_devices()
        self.base_dir = run.work_dir or tempfile.mkdtemp(prefix="smv-audit-")
        self.serial = 0
        self.workers: list = []
        self.sel = selectors.DefaultSelector()
        self.last_beat = time.monotonic()
        self.start_failures = 0  # workers in a row that died before they became ready
        self.prog.start_subject(sub.label, self.budget_end)
        self.prog.start_pass(1, self.n_rows, f"each up to its minimum of generated cases, on {cfg.jobs} workers")
        for i, (cid, tname) in enumerate(rows):
            c = get_contract(cid)
            if c.applies_to(tname):
                self.todo.append(i)
                self.prog.cases_left[(sub.label, cid, tname)] = cfg.limit_of(c)
            else:
                self.slots[i] = run_contract(c, tname, budget=1.0, subject=sub)  # the skipped row, with its reason

    def publish(self) -> None:
        self.run.results[self.first_index:] = [s for s in self.slots if s is not None]
        self.run.on_row()

    def spawn(self, slot: int):
        from contracts.engine.workers import Worker

        dev = (self.kind, self.ids_dev[slot % len(self.ids_dev)]) if self.ids_dev else ("cpu", None)
        w = Worker(f"a{self.serial}", dev, self.base_dir, {})
        self.serial += 1
        w.slot = slot
        self.workers.append(w)
        self.sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        return w

    def spawn_all(self) -> None:
        for slot in range(max(1, min(self.cfg.jobs, len(self.todo)))):
            self.spawn(slot)

    def item_for(self, i: int, pass_no: int, row_budget: float) -> dict:
        cid, tname = self.rows[i]
        c = get_contract(cid)
        return {"g": i, "subject": self.spec, "contract": cid, "target": tname, "profile": self.cfg.profile,
                "seed": self.cfg.seed, "budget": round(max(0.05, row_budget), 3),
                "audit": {"pass": pass_no, "first": self.cfg.first_of(c), "config": self.cfg.for_worker()}}

    def finish(self, w, msg: dict) -> None:
        from contracts.engine.workers import device_lost_line

        i, pass_no = w.item["g"], w.item["audit"]["pass"]
        line = device_lost_line(f"smv audit: worker {w.id} on {w.device_name} ({w.item['contract']} on "
                                f"{w.item['target']})", msg)
        if line:
            self.run.stream.write(line)
            w.retiring = True
        if "row" in msg:
            r = RowDoc(msg["row"], resumable=msg.get("resumable", False), limit=msg.get("limit"))
            label = self.sub.label
            self.run.described[label] = merge_describe(self.run.described.get(label) or self.sub.describe(),
                                                       msg["describe"])
            if pass_no == AGAIN and r.status == "incomplete" and isinstance(self.slots[i], RowDoc):
                r = self.slots[i]  # the re-run was cut before the minimum the held pass had reached: keep that
            if pass_no == 1:
                self.owner[i] = w.id
                cpu, secs = msg.get("cpu") or 0.0, msg.get("seconds") or 0.0
                record(self.run.model, self.sub.name, self.cfg.profile, r, cpu, max(0.05, min(1.0, cpu / secs))
                       if secs > 0 else 1.0)
            else:
                self.owner.pop(i, None)  # its second pass is done: nothing of it is held any more
        else:  # the harness raised in the worker
            c = get_contract(self.rows[i][0])
            r = _failed_row(c, self.rows[i][1], self.sub, f"error: the worker could not run the row: "
                            f"{msg.get('error')}", self.slots[i] if pass_no != 1 else None,
                            time.monotonic() - w.item_started)
            self.owner.pop(i, None)
        self.slots[i] = r
        w.item = None
        self.prog.pass_no = min(pass_no, 2)  # a row run again whole reports as its second pass does
        self.prog.row(i + 1, self.n_rows, r)
        self.publish()

    def ready(self, w) -> None:
        self.start_failures = 0

    def lost(self, w, what: str) -> None:
        """``w`` died or hung while checking its row."""
        from contracts.engine.workers import _case_limit, _label_suffix

        i = w.item["g"]
        cid, tname = self.rows[i]
        c = get_contract(cid)
        reason, repro = w.lost(what, _case_limit(c, self.cfg.case_timeout), os.path.join(
            self.cfg.repro_dir, f"{cid}-{tname}{_label_suffix(self.sub.label)}-{what}.json"), cid, tname,
            self.sub.label, self.spec)
        if repro is None:
            reason += f"; log: {os.path.join(w.dir, 'worker.log')}"
        r = _failed_row(c, tname, self.sub, reason, self.slots[i] if w.item["audit"]["pass"] != 1 else None,
                        time.monotonic() - w.item_started)
        r.doc["repro"] = repro
        self.slots[i] = r
        w.item = None
        self.prog.row(i + 1, self.n_rows, r)
        self.publish()

    def next_item(self, w):
        """Pass 1 hands out every row's minimum (until the deadline); pass 2 what is left of the budget."""
        if self.phase == 1:
            if not self.todo or self.cfg.past_deadline():
                return None
            i = self.todo.popleft()
            return self.item_for(i, 1, first_share(self.budget_end - time.monotonic(), len(self.todo)))
        left = self.cfg.time_left(self.budget_end)
        if left <= 0.05:
            return None
        mine = self.second.get(w.id)
        if mine:
            i = mine.popleft()
            return self.item_for(i, 2, left / (len(mine) + len(self.again) + 1))
        if self.again:
            i = self.again.popleft()
            return self.item_for(i, AGAIN, left / (len(self.again) + 1))
        return None

    def step_phase(self, busy: list) -> bool:
        """Move pass 1 to pass 2 when it is done, mark what the deadline left unstarted; True when all is done."""
        if self.phase == 1 and not self.todo and not busy:
            self.phase = 2
            alive = {w.id for w in self.workers}
            for k, r in enumerate(self.slots):
                if (isinstance(r, RowDoc) and r.resumable and r.status in RESUMABLE
                        and self.owner.get(k) in alive):
                    self.second.setdefault(self.owner[k], deque()).append(k)
            self.prog.start_pass(2, sum(len(q) for q in self.second.values()),
                                 "sharing what is left for more generated cases")
        if self.phase == 1 and self.todo and self.cfg.past_deadline():
            while self.todo:  # the deadline has passed: what was not started says so
                i = self.todo.popleft()
                self.slots[i] = self.not_started(i)
                self.prog.row(i + 1, self.n_rows, self.slots[i])
            self.publish()
        return self.phase == 2 and not busy and (self.cfg.time_left(self.budget_end) <= 0.05 or not (
            self.again or any(self.second.get(w.id) for w in self.workers)))

    def not_started(self, i: int) -> RowResult:
        cid, tname = self.rows[i]
        return not_started(cid, tname, self.cfg.limit_of(get_contract(cid)), self.sub, self.cfg.deadline_s)

    def loop(self) -> None:
        from contracts.engine.workers import poll_answers

        while True:
            busy = [w for w in self.workers if w.item is not None]
            if self.step_phase(busy):
                break
            for w in self.workers:
                if w.ready and w.item is None and not w.retiring:
                    item = self.next_item(w)
                    if item is not None:
                        w.start_item(item)
            poll_answers(self.sel, self.ready, self.finish)
            for w in list(self.workers):
                self.reap(w)
            self.heartbeat()

    def reap(self, w) -> None:
        """A worker that died or hung: its row an error, the first passes it held run again elsewhere."""
        from contracts.engine.workers import _case_limit, drain_answers, start_error, unwatch

        dead = w.proc.poll() is not None
        if dead:
            drain_answers(w, self.ready, self.finish)
        hung = not dead and w.stalled(  # as the campaign judges it: no case ended within the limit
            _case_limit(get_contract(w.item["contract"]), self.cfg.case_timeout) if w.item is not None else 0.0,
            w.item["budget"] if w.item is not None else 0.0)
        if not (dead or hung):
            return
        w.kill()
        if w.item is not None:
            self.lost(w, "hang" if hung else "crash")
        elif not w.ready:
            self.start_failures += 1
            if self.start_failures >= 3 and not (self.phase == 1 and self.todo):
                # only rows held by dead workers were left to run again: they keep their first passes
                self.run.stream.write(f"smv audit: 3 workers in a row died before they could take a row; "
                                      f"{len(self.again)} row(s) keep their first passes\n")
                self.again.clear()
            elif self.start_failures >= 3:
                raise start_error(w, "audit workers")
        unwatch(self.sel, w)
        self.workers.remove(w)
        self.requeue(w)

    def requeue(self, w) -> None:
        # the first passes it held died with it: those rows run again whole elsewhere, so a crash in one row never
        # cuts another row's cases short (the serial audit would have run their second passes)
        self.second.pop(w.id, None)
        self.again.extend(k for k, o in sorted(self.owner.items()) if o == w.id and isinstance(self.slots[k], RowDoc)
                          and self.slots[k].resumable and self.slots[k].status in RESUMABLE)
        for k in [k for k, o in self.owner.items() if o == w.id]:
            del self.owner[k]
        if ((self.phase == 1 and self.todo and not self.cfg.past_deadline())
                or (self.again and self.cfg.time_left(self.budget_end) > 0.05)):
            nw = self.spawn(w.slot)
            self.run.stream.write(f"smv audit: started worker {nw.id} on {nw.device_name} in place of {w.id}\n")

    def heartbeat(self) -> None:
        if not self.prog.enabled or time.monotonic() - self.last_beat < HEARTBEAT_S:
            return
        self.last_beat = time.monotonic()
        running = [f"{w.item['contract']} on {w.item['target']}" for w in self.workers if w.item is not None]
        done = sum(s is not None for s in self.slots)
        self.run.stream.write(f"smv audit: {done} of {self.n_rows} rows done under {self.sub.label}, "
                              f"{len(running)} running ({', '.join(running[:4])}{' ...' if len(running) > 4 else ''})"
                              f", {self.prog.eta()}\n")
        self.run.stream.flush()

    def stop(self) -> None:
        from contracts.engine.workers import stop_workers

        stop_workers(self.workers)
        self.run.seconds[self.sub.label] = time.monotonic() - self.t0

    def close_out(self) -> None:
        for i in range(self.n_rows):  # a row a dead worker's queue never reached
            if self.slots[i] is None:
                self.slots[i] = self.not_started(i)
        self.run.results[self.first_index:] = self.slots
