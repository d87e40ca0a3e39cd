"""``smv fuzz``: the nightly campaign over every contract and target, on every GPU and core of a host.

The campaign is a sequence of work items: round ``r`` checks every row (subject x contract x target that applies)
once under the ``nightly`` profile with seed ``base_seed + r``, each row with the per-row share of ``--round``.
Item ``g`` is row ``g % R`` of round ``g // R``; ``--shard K/N`` keeps the items :func:`shard_of` gives to shard
``K``, so the shards of a CI matrix or a Slurm array split the space without talking to each other, together run
exactly what one host would, and each meets every row as the rounds go on.

A small supervisor (this module) runs the items on ``--jobs`` worker processes (``contracts.engine.campaign_worker``),
each pinned to one device by ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` (round-robin when there are more
workers than GPUs). Items go, in order, to whichever worker is idle. Every worker shares one Hypothesis example
database (a folder, or ``redis://`` through Hypothesis' Redis database), so a failure found anywhere is replayed
first wherever its row runs next.

A worker writes every case before checking it (``SMV_CASE_FILE``); when a worker dies (a signal, an abort in a
kernel) the supervisor records a ``crash`` failure whose reproducer is that case, and when a case overruns its
time limit it records a ``hang`` and kills the worker. Either way a new worker takes the next item.

Nothing is lost when any process is killed: every finished item is appended to ``DIR/journal.jsonl`` (flushed and
synced) before it counts, ``DIR/campaign.json`` is rewritten atomically after it, and running ``smv fuzz`` again
on the same directory resumes: the items the journal holds are not run again, the failures it holds are kept, the
budget given counts from the resume. A directory has one live owner at a time (``DIR/.lock``, an advisory lock the
kernel releases when its process dies).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import selectors
import shutil
import signal
import sys
import time
from dataclasses import dataclass

from contracts.engine.workers import (  # noqa: F401 - WorkerStartError is re-exported (smv fuzz catches it here)
    DEVICE_LOST_EXIT, OUTSIDE_SIGNALS, Worker, WorkerStartError, _atomic_json, _case_limit, _label_suffix,
    _signal_name, cpu_count, device_lost_line, drain_answers, poll_answers, start_error, stop_workers, unwatch,
    visible_devices)

#: 2: ``round_log`` (each round's seed, budget, seconds and cases) and ``seed`` on every failure
#: 3: ``subjects`` (the labels audited) and ``subject`` on every failure; ``cases`` keys gain ``@<subject>`` for a
#: subject other than ours
#: 4: the campaign runs on worker processes: ``workers`` [{"id", "device", "status", "cases", "items", "seconds",
#: "cases_per_second", "pid"}], ``jobs``, ``shard``, ``database``, ``sessions`` (one per start or resume),
#: ``throughput`` (cases per second per row and per worker), ``items``; failures gain ``signature``, ``worker``,
#: ``first_violation`` and the statuses ``crash`` and ``hang``; ``round_log`` rounds count items, not one audit
CAMPAIGN_SCHEMA_VERSION = 4
#: a row that fails the same way this many times in a row is retired (see Campaign.retired)
RETIRE_AFTER = 3


def parse_duration(text: "str | float | int") -> float:
    """'8h', '30m', '90s', '1h30m' or a number of seconds."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        s = str(text).strip().lower()
        if re.fullmatch(r"\d+(\.\d+)?", s):
            seconds = float(s)
        else:
            parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", s)
            if not s or not parts or not any(parts.groups()):
                raise ValueError(f"budget: expected a duration like 8h, 30m, 90s or 1h30m, got {text!r}")
            h, m, sec = (float(x) if x else 0.0 for x in parts.groups())
            seconds = h * 3600 + m * 60 + sec
    if seconds <= 0:
        raise ValueError(f"budget: expected a positive duration, got {text!r}")
    return seconds


def parse_shard(text: "str | None") -> "tuple[int, int] | None":
    """'K/N' (1 <= K <= N) as (K, N); None stays None."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"shard: expected K/N with 1 <= K <= N (e.g. 2/8), got {text!r}")
    return int(m.group(1)), int(m.group(2))


_NUMBER = re.compile(r"0x[0-9a-fA-F]+|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|\b(?:nan|inf)\b")


def mask_numbers(message: str) -> str:
    """The message with every number replaced by ``#``: two failures that differ only in their values match."""
    return _NUMBER.sub("#", message)


def failure_signature(f: dict) -> str:
    """What makes two failures the same one: subject, contract, target, status and the first violation's message
    with its numbers masked."""
    first = f["violations"][0]["message"] if f.get("violations") else f.get("reason", "")
    return " | ".join([f.get("subject", "ours"), f["contract"], f["target"], f["status"], mask_numbers(first)])


# --- devices ---------------------------------------------------------------------------------------------------






# --- the directory: lock, journal, document --------------------------------------------------------------------




class CampaignBusy(RuntimeError):
    """Another live process owns the report directory."""


class DirLock:
    """An exclusive advisory lock on ``DIR/.lock``; the kernel drops it when the holder dies, however it dies."""

    def __init__(self, report_dir: str):
        self.path = os.path.join(report_dir, ".lock")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(self.fd)
            raise CampaignBusy(f"{report_dir} is in use by a running campaign (pid {holder}); wait for it, stop "
                               f"it, or give another --report") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Journal:
    """``DIR/journal.jsonl``: the campaign's config, then one line per finished item. Each line is flushed and
    synced before it counts; a line torn by a kill is ignored on reading (its item runs again)."""

    def __init__(self, report_dir: str):
        self.path = os.path.join(report_dir, "journal.jsonl")

    def read(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        out = []
        with open(self.path) as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # the torn tail of a killed write; nothing after it was acknowledged
        return out

    def append(self, doc: dict) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(doc, default=repr) + "\n")
            fh.flush()
            os.fsync(fh.fileno())




def _row_key(row: tuple) -> str:
    label, cid, target = row
    return f"{cid}/{target}" + ("" if label == "ours" else f"@{label}")


def _rate(cases: int, seconds: float) -> float | None:
    return round(cases / seconds, 3) if seconds > 0 else None


class Campaign:
    """The state a campaign directory holds, rebuilt from its journal on resume."""

    def __init__(self, report_dir: str, config: dict, stream):
        self.dir = report_dir
        self.config = config
        self.stream = stream
        self.journal = Journal(report_dir)
        self.done: set[int] = set()
        self.failures: list[dict] = []
        self.by_sig: dict[str, dict] = {}
        self.cases: dict[str, int] = {}
        self.row_seconds: dict[str, float] = {}
        self.rounds: dict[int, dict] = {}
        self.streak: dict[str, tuple] = {}
        self.workers: list[dict] = []
        self.sessions: list[dict] = []

    # journal -> state
    def load(self) -> bool:
        """Read an earlier session's journal; False when there is none. A journal of other parameters is a
        ValueError (resuming it would not be the same campaign)."""
        lines = self.journal.read()
        if not lines:
            return False
        head = lines[0].get("config")
        if head is None:
            raise ValueError(f"{self.journal.path}: not a campaign journal (its first line holds no config)")
        for k in ("contracts", "targets", "subjects", "profile", "round_seconds", "shard", "rows"):
            if head.get(k) != self.config.get(k):
                raise ValueError(f"{self.dir} holds a campaign with another {k} ({head.get(k)!r}, not "
                                 f"{self.config.get(k)!r}); resume it with the same selection, or give another "
                                 f"--report")
        self.config["base_seed"] = head["base_seed"]
        for doc in lines[1:]:
            if "session" in doc:
                self.sessions.append(doc["session"])
            elif "item" in doc:
                self._apply(doc["item"])
            elif "worker" in doc:
                self.workers.append(doc["worker"])
        return True

    def start_journal(self) -> None:
        self.journal.append({"config": self.config})

    def _apply(self, it: dict) -> None:
        self.done.add(it["g"])
        key = it["key"]
        self.cases[key] = self.cases.get(key, 0) + it["cases"]
        self.row_seconds[key] = self.row_seconds.get(key, 0.0) + it["seconds"]
        r = self.rounds.setdefault(it["round"], {"round": it["round"], "seed": it["seed"], "items": 0, "cases": 0,
                                                 "seconds": 0.0})
        r["items"] += 1
        r["cases"] += it["cases"]
        r["seconds"] = round(r["seconds"] + it["seconds"], 3)
        sig = it.get("signature")
        if sig is not None:
            if sig in self.by_sig:
                self.by_sig[sig]["occurrences"] += 1
            elif it.get("failure") is not None:
                f = dict(it["failure"], occurrences=1)
                self.by_sig[sig] = f
                self.failures.append(f)
            last, n = self.streak.get(key, (None, 0))
            self.streak[key] = (sig, n + 1 if last == sig else 1)
        else:
            self.streak[key] = (None, 0)

    def retired(self, key: str) -> bool:
        """A row whose last RETIRE_AFTER items failed the same way: each later one would replay the saved case
        and stop at it again, so the row is left alone for the rest of the campaign."""
        sig, n = self.streak.get(key, (None, 0))
        return sig is not None and n >= RETIRE_AFTER

    def record(self, it: dict) -> "dict | None":
        """Journal a finished item, then count it; returns its failure when that failure is new. A failure seen
        before is journaled by its signature alone."""
        sig = it.get("signature")
        new = sig is not None and sig not in self.by_sig
        if not new:
            it = dict(it, failure=None)
        self.journal.append({"item": it})
        self._apply(it)
        return self.by_sig[sig] if new else None

    def document(self, *, finished: bool, session: dict, live_workers: list[dict]) -> dict:
        R = len(self.config["rows"])
        rows_tp = {k: {"cases": n, "seconds": round(self.row_seconds.get(k, 0.0), 3),
                       "cases_per_second": _rate(n, self.row_seconds.get(k, 0.0))} for k, n in self.cases.items()}
        workers = [dict(w) for w in self.workers] + [dict(w) for w in live_workers]
        for w in workers:
            w["cases_per_second"] = _rate(w["cases"], w["seconds"])
        sessions = self.sessions + [session]
        seconds = round(sum(s["seconds"] for s in sessions), 1)
        total = sum(self.cases.values())
        return {"schema_version": CAMPAIGN_SCHEMA_VERSION, "budget": session["budget"],
                "profile": self.config["profile"], "base_seed": self.config["base_seed"],
                "shard": self.config["shard"], "jobs": session["jobs"], "database": self.config["database"],
                "subjects": self.config["subjects"], "rows": R, "items": len(self.done),
                "rounds": len(self.rounds), "seconds": seconds, "cases": dict(self.cases),
                "round_log": [self.rounds[k] for k in sorted(self.rounds)],
                "failures": self.failures, "workers": workers, "sessions": sessions,
                "retired": sorted(k for k in self.cases if self.retired(k)),
                "throughput": {"cases_per_second": _rate(total, seconds), "rows": rows_tp},
                "finished": finished}


# --- workers ---------------------------------------------------------------------------------------------------
















# --- the supervisor --------------------------------------------------------------------------------------------




def _default_seed(shard) -> int:
    # the shards of one night must agree on the seed without talking: the day's number; a lone campaign: the clock
    return int(time.time() // 86400) if shard else int(time.time()) % (2 ** 31)


@dataclass
class CampaignOptions:
    """What ``smv fuzz`` runs besides its budget and directory: the selection (contracts, targets, subjects; all by
    default), a round's seconds (shared by its rows), the base seed (default: the day's number for a shard, else
    the clock), the profile, ``jobs`` workers (default: one per visible GPU, else per core), ``shard`` K/N, the
    example ``database`` (a folder or ``redis://``), a per-case time limit overriding the contracts' own, and the
    progress stream (stderr)."""

    contract_ids: "list | None" = None
    target_names: "list | None" = None
    subjects: "list | None" = None
    round_seconds: float = 600
    seed: "int | None" = None
    profile: str = "nightly"
    stream: object = None
    jobs: "int | None" = None
    shard: "str | tuple | None" = None
    database: "str | None" = None
    case_timeout: "float | None" = None

    def check(self, budget: float) -> None:
        if not budget > 0 or not self.round_seconds > 0:
            raise ValueError(f"budget / round: expected positive durations, got {budget!r} / "
                             f"{self.round_seconds!r}")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"jobs: expected 1 or more, got {self.jobs!r}")
        if self.case_timeout is not None and not self.case_timeout > 0:
            raise ValueError(f"case timeout: expected a positive number of seconds, got {self.case_timeout!r}")


def _campaign_rows(opts: CampaignOptions) -> tuple[list, dict, list, list]:
    """(rows, labels, contract ids, target names): every (subject spec, contract, target) that applies."""
    from contracts.engine.runner import resolve_subject, subject_spec
    from contracts.registry import get_contract, load_all
    from impl.targets import TARGET_NAMES, get_target

    contracts = load_all()
    ids = list(opts.contract_ids) if opts.contract_ids else sorted(contracts)
    for cid in ids:
        get_contract(cid)
    targets = [get_target(t).name for t in (opts.target_names or TARGET_NAMES)]
    subs = [resolve_subject(x) for x in (opts.subjects or [None])]
    rows = [(subject_spec(s), cid, t) for s in subs for cid in ids for t in targets
            if contracts[cid].applies_to(get_target(t))]
    if not rows:
        raise ValueError("no contract of the selection applies to the selected targets")
    return rows, {subject_spec(s): s.label for s in subs}, ids, targets


def run_campaign(budget: float, report_dir: str, options: "CampaignOptions | None" = None,
                 **fields) -> tuple[dict, int]:
    """Run (or resume) the campaign in ``report_dir`` for ``budget`` seconds; ``options`` (or its fields as
    keywords: :class:`CampaignOptions`) say what and how. Returns the campaign document and the exit code (1 when
    any failure was found, in this session or an earlier one)."""
    from fuzz.profiles import DATABASE_ENV, check_database_spec, database_spec

    opts = options or CampaignOptions(**fields)
    opts.check(budget)
    shard_t = parse_shard(opts.shard) if isinstance(opts.shard, str) or opts.shard is None else tuple(opts.shard)
    db = check_database_spec(opts.database) if opts.database else database_spec()
    stream = opts.stream or sys.stderr
    rows, labels, ids, targets = _campaign_rows(opts)
    os.makedirs(os.path.join(report_dir, "repro"), exist_ok=True)
    lock = DirLock(report_dir)
    try:
        config = {"contracts": ids, "targets": targets, "subjects": list(dict.fromkeys(labels.values())),
                  "profile": opts.profile, "round_seconds": opts.round_seconds,
                  "shard": None if shard_t is None else f"{shard_t[0]}/{shard_t[1]}",
                  "rows": [list(r) for r in rows], "database": db,
                  "base_seed": opts.seed if opts.seed is not None else _default_seed(shard_t)}
        camp = Campaign(report_dir, config, stream)
        _open_or_resume(camp, report_dir, opts.seed)
        sup = Supervisor(camp, budget, opts.jobs, shard_t, opts.case_timeout, {DATABASE_ENV: db}, labels)
        return sup.run()
    finally:
        lock.release()


def _open_or_resume(camp: "Campaign", report_dir: str, seed: "int | None") -> None:
    if camp.load():
        if seed is not None and seed != camp.config["base_seed"]:
            raise ValueError(f"{report_dir} holds a campaign with base seed {camp.config['base_seed']}, not "
                             f"{seed}; resume it without --seed, or give another --report")
        camp.stream.write(f"smv fuzz: resuming {report_dir}: {len(camp.done)} items done, {len(camp.failures)} "
                          f"distinct failures kept\n")
        return
    for stale in ("journal.jsonl", "campaign.json"):
        if os.path.exists(os.path.join(report_dir, stale)):
            os.unlink(os.path.join(report_dir, stale))
    camp.start_journal()


class Supervisor:
    """One session of a campaign: hands the shard's items to idle workers, records each answer, replaces a worker
    that crashed, hung or was killed from outside, and saves ``campaign.json`` after every change."""

    def __init__(self, camp: "Campaign", budget: float, jobs, shard_t, case_timeout, env_extra: dict, labels: dict):
        from contracts.registry import get_contract

        self.camp, self.budget, self.env_extra, self.labels = camp, budget, env_extra, labels
        self.stream = camp.stream
        self.rows = [tuple(r) for r in camp.config["rows"]]
        self.R = len(self.rows)
        self.per_row = camp.config["round_seconds"] / self.R
        self.kind, self.ids = visible_devices()
        self.n_jobs = jobs or (len(self.ids) if self.ids else cpu_count())
        self.t0 = time.monotonic()
        self.end = self.t0 + budget
        self.session = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "budget": budget,
                        "jobs": self.n_jobs, "seconds": 0.0, "ended": None}
        self.k, self.n = shard_t or (1, 1)
        self.limits = {cid: _case_limit(get_contract(cid), case_timeout) for _, cid, _ in self.rows}
        self.keys = [_row_key((labels.get(spec, spec), cid, target)) for spec, cid, target in self.rows]
        self.pending = self._items()
        self.workers: list[Worker] = []
        # worker ids stay unique over every session of the directory, so no session's worker log is overwritten
        wdir = os.path.join(camp.dir, "workers")
        seen = [int(m.group(1)) for m in (re.fullmatch(r"w(\d+)", x) for x in os.listdir(wdir)) if m] \
            if os.path.isdir(wdir) else []
        self.serial = max(seen, default=-1) + 1
        self.interrupted = None
        self.start_failures = 0
        self.retry: list[int] = []
        self.requeued: set[int] = set()
        self.exhausted = False
        self.sel = selectors.DefaultSelector()

    # --- items ---------------------------------------------------------------------------------------------------

    def _items(self):
        """The undone items of this shard, lowest first: those a killed session left, then new ones; none of a
        retired row. Ends when every row is retired."""
        camp, g = self.camp, 0
        while not all(camp.retired(key) for key in self.keys):
            if shard_of(g, self.R, self.n) == self.k and g not in camp.done and not camp.retired(self.keys[g % self.R]):
                yield g
            g += 1

    def item_of(self, g: int) -> dict:
        r, j = divmod(g, self.R)
        spec, cid, target = self.rows[j]
        left = self.end - time.monotonic()
        return {"g": g, "round": r, "seed": self.camp.config["base_seed"] + r, "subject": spec, "contract": cid,
                "target": target, "profile": self.camp.config["profile"],
                "budget": round(max(0.5, min(self.per_row, left)), 3),
                "grace": round(max(1.0, min(10.0, left - min(self.per_row, left))), 3)}

    def _row_of(self, it: dict) -> tuple[str, str, str, str]:
        spec, cid, target = self.rows[it["g"] % self.R]
        return spec, cid, target, self.labels.get(spec, spec)

    # --- workers ---------------------------------------------------------------------------------------------------

    def spawn(self, slot: int) -> Worker:
        dev = (self.kind, self.ids[slot % len(self.ids)]) if self.ids else ("cpu", None)
        w = Worker(f"w{self.serial}", dev, self.camp.dir, self.env_extra)
        self.serial += 1
        w.slot = slot
        self.workers.append(w)
        self.sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        return w

    def retire(self, w: Worker, status: str) -> None:
        w.stats["status"] = status
        w.stats["seconds"] = round(w.stats["seconds"], 3)
        self.camp.workers.append(w.stats)
        self.camp.journal.append({"worker": w.stats})

    def save(self, finished=False) -> None:
        self.session["seconds"] = round(time.monotonic() - self.t0, 1)
        live = [dict(w.stats, seconds=round(w.stats["seconds"], 3)) for w in self.workers]
        _atomic_json(os.path.join(self.camp.dir, "campaign.json"),
                     self.camp.document(finished=finished, session=self.session, live_workers=live))

    def on_ready(self, w: Worker) -> None:
        self.start_failures = 0
        w.stats["status"] = "idle"

    def on_done(self, w: Worker, msg: dict) -> None:
        line = device_lost_line(f"smv fuzz: worker {w.id} on {w.device_name} ({w.item['contract']} on "
                                f"{w.item['target']})", msg)
        if line:
            self.stream.write(line)
            w.retiring = True
        self.finish_item(w, msg)
        w.stats["status"] = "idle"

    # --- answers ---------------------------------------------------------------------------------------------------

    def _failure_of(self, w: Worker, status_out: dict, rec: dict) -> "dict | None":
        it = w.item
        _, cid, target, label = self._row_of(it)
        if "row" in status_out:
            row = status_out["row"]
            rec["cases"], rec["status"] = row["cases"], row["status"]
            rec["first_violation"] = row.get("first_violation")
            if row["status"] not in ("fail", "error"):
                return None
            failure = {"contract": cid, "target": target, "subject": label, "status": row["status"],
                       "reason": row["reason"], "violations": row["violations"][:5],
                       "first_violation": row.get("first_violation")}
            if row.get("repro") and os.path.exists(row["repro"]):
                failure["repro"] = _keep_repro(self.camp.dir, row["repro"], cid, target, label, it["round"])
            return failure
        if "error" in status_out:
            rec["status"] = "error"
            return {"contract": cid, "target": target, "subject": label, "status": "error",
                    "reason": f"the worker could not run the row: {status_out['error']}", "violations": [],
                    "detail": status_out.get("traceback", "")}
        rec["status"] = status_out["status"]  # crash or hang: recorded by the supervisor
        rec["cases"] = status_out.get("cases", 0)
        return status_out["failure"]

    def finish_item(self, w: Worker, status_out: dict) -> None:
        it, camp = w.item, self.camp
        _, cid, target, label = self._row_of(it)
        rec = {"g": it["g"], "round": it["round"], "seed": it["seed"], "key": _row_key((label, cid, target)),
               "worker": w.id, "cases": 0, "seconds": round(time.monotonic() - w.item_started, 3), "status": None,
               "started": round(w.item_wall, 3), "signature": None, "failure": None}
        failure = self._failure_of(w, status_out, rec)
        if failure is not None:
            failure.setdefault("repro", None)
            failure.update(round=it["round"], seed=it["seed"], worker=w.id)
            failure["signature"] = rec["signature"] = failure_signature(failure)
            rec["failure"] = failure
        new = camp.record(rec)
        w.stats["cases"] += rec["cases"]
        w.stats["items"] += 1
        w.stats["seconds"] += rec["seconds"]
        w.item = None
        if new is not None:
            self.stream.write(f"NEW {new['status'].upper()}: {rec['key']} (worker {w.id}, round {it['round']}): "
                              f"{new['reason'][:200]}" + (f"\n    replay: smv repro {new['repro']}" if new['repro']
                                                         else "") + "\n")
        self._round_line(it["round"])
        self.stream.flush()
        self.save()

    def _round_line(self, done_round: int) -> None:
        R, camp = self.R, self.camp
        if all((done_round * R + j) in camp.done for j in range(R) if (done_round * R + j) % self.n == self.k - 1):
            self.stream.write(f"round {done_round + 1}: {sum(camp.cases.values())} cases so far, "
                              f"{len(camp.failures)} distinct failures, "
                              f"{max(0.0, self.end - time.monotonic()):.0f}s left\n")

    def crash_or_hang(self, w: Worker, what: str) -> dict:
        it = w.item
        spec, cid, target, label = self._row_of(it)
        reason, repro = w.lost(what, self.limits[cid], os.path.join(
            self.camp.dir, "repro", f"{cid}-{target}" + _label_suffix(label) + f"-{what}-item{it['g']}.json"),
            cid, target, label, spec)
        failure = {"contract": cid, "target": target, "subject": label, "status": what, "reason": reason,
                   "violations": [{"message": reason, "where": "", "expected": "a verdict", "got": what}],
                   "repro": repro, "log_tail": w.log_tail(800)}
        return {"status": what, "cases": w.counts(), "failure": failure}

    # --- the loop ----------------------------------------------------------------------------------------------------

    def _hand_out(self) -> None:
        """Give idle, ready workers the next items; note when every row is retired."""
        for w in self.workers:
            if not (w.ready and w.item is None and not w.retiring and self._accepting()):
                continue
            g = self.retry.pop(0) if self.retry else next(self.pending, None)
            if g is None:
                if not self.exhausted:
                    self.exhausted = True
                    self.stream.write("smv fuzz: every row fails the same way again and again (retired after "
                                      f"{RETIRE_AFTER} in a row): nothing more to learn, ending early\n")
                return
            w.stats["status"] = "running"
            w.start_item(self.item_of(g))

    def _accepting(self) -> bool:
        return self.end - time.monotonic() >= 0.5 and not self.exhausted

    def _lost_worker(self, w: Worker, hung: bool) -> None:
        """A worker that died or hung: its item is a crash or a hang, or runs again when the signal came from
        outside (once); a worker that never became ready three times over ends the campaign."""
        if hung:
            w.kill()
        if (not hung and w.item is not None and w.proc.returncode in OUTSIDE_SIGNALS
                and w.item["g"] not in self.requeued):
            # a signal a kernel bug does not raise: someone (a user, the OOM killer) stopped the worker; its row
            # runs again on a new worker, once, and is a crash only if that happens twice
            self.requeued.add(w.item["g"])
            self.retry.append(w.item["g"])
            self.stream.write(f"smv fuzz: worker {w.id} was killed from outside "
                              f"({_signal_name(w.proc.returncode)}) while checking "
                              f"{self.keys[w.item['g'] % self.R]}; the row runs again\n")
            w.item = None
            self.retire(w, "killed")
        elif w.item is not None:
            what = "hang" if hung else "crash"
            self.finish_item(w, self.crash_or_hang(w, what))
            self.retire(w, "hung" if hung else "crashed")
        elif w.proc.returncode == DEVICE_LOST_EXIT and w.ready:  # deliberately, between rows: no row lost with it
            self.retire(w, "exited")
        else:
            how = _signal_name(w.proc.returncode) if w.proc.returncode is not None else "no answer"
            self.stream.write(f"smv fuzz: worker {w.id} died before taking a row ({how}); log: "
                              f"{os.path.join(w.dir, 'worker.log')}\n")
            self.retire(w, "crashed")
            if not w.ready:
                self.start_failures += 1
                if self.start_failures >= 3:
                    raise start_error(w)
        self._replace(w)

    def _replace(self, w: Worker) -> None:
        unwatch(self.sel, w)
        w.kill()
        self.workers.remove(w)
        if self.end - time.monotonic() >= 0.5:
            nw = self.spawn(w.slot)
            self.stream.write(f"smv fuzz: started worker {nw.id} on {nw.device_name} in place of {w.id}\n")
        self.save()

    def _check_workers(self) -> None:
        for w in list(self.workers):
            dead = w.proc.poll() is not None
            if dead:
                drain_answers(w, self.on_ready, self.on_done)
            hung = not dead and w.stalled(
                self.limits[self.rows[w.item["g"] % self.R][1]] if w.item is not None else 0.0,
                w.item["budget"] + w.item["grace"] if w.item is not None else 0.0)
            if dead or hung:
                self._lost_worker(w, hung)

    def _beat(self, last: float) -> float:
        if time.monotonic() - last <= 60:
            return last
        busy = sum(1 for w in self.workers if w.item)
        self.stream.write(f"smv fuzz: {time.monotonic() - self.t0:.0f}s of {self.budget:.0f}s: "
                          f"{sum(self.camp.cases.values())} cases, {len(self.camp.failures)} distinct failures, "
                          f"{busy} of {len(self.workers)} workers busy\n")
        self.stream.flush()
        return time.monotonic()

    def _loop(self) -> None:
        for slot in range(self.n_jobs):
            self.spawn(slot)
        self.save()
        last_beat = time.monotonic()
        while self._accepting() or any(w.item for w in self.workers):
            self._hand_out()
            poll_answers(self.sel, self.on_ready, self.on_done)
            self._check_workers()
            last_beat = self._beat(last_beat)
        self.session["ended"] = "retired" if self.exhausted else "budget"

    def _on_signal(self, signum, frame):
        self.interrupted = signal.Signals(signum).name
        raise KeyboardInterrupt

    def run(self) -> tuple[dict, int]:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
        try:
            self._loop()
        except KeyboardInterrupt:
            self.session["ended"] = self.interrupted or "SIGINT"
            self.stream.write(f"smv fuzz: interrupted ({self.session['ended']}); the campaign so far is saved, run "
                              f"the same command again to resume it\n")
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            doc = self._close()
        return doc, (1 if doc["failures"] else 0)

    def _close(self) -> dict:
        camp = self.camp
        stop_workers(self.workers)
        for w in self.workers:
            w.stats["status"] = "interrupted" if w.item is not None else "exited"
            self.retire(w, w.stats["status"])
        self.workers.clear()
        camp.sessions.append(dict(self.session, seconds=round(time.monotonic() - self.t0, 1)))
        camp.journal.append({"session": camp.sessions[-1]})
        doc = camp.document(finished=self.session["ended"] in ("budget", "retired"), session=camp.sessions.pop(),
                            live_workers=[])
        _atomic_json(os.path.join(camp.dir, "campaign.json"), doc)
        return doc


def shard_of(g: int, rows: int, shards: int) -> int:
    """The shard (1-based) that runs item ``g``: row ``j = g % rows`` of round ``r = g // rows`` goes to shard
    ``(r + j) % shards + 1``. The shards split every round evenly, and every row visits every shard as the rounds
    go on, so a failure one shard saved in the shared database is replayed by the others when the row reaches
    them."""
    return (g // rows + g % rows) % shards + 1




def _keep_repro(report_dir: str, src: str, cid: str, target: str, label: str, rnd: int) -> str:
    dst = os.path.join(report_dir, "repro", f"{cid}-{target}{_label_suffix(label)}-round{rnd}.json")
    shutil.copyfile(src, dst)
    return dst


# --- merge -----------------------------------------------------------------------------------------------------


def _load_campaign(d: str) -> dict:
    path = os.path.join(d, "campaign.json")
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise ValueError(f"merge: {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"merge: {path}: not valid JSON: {exc.msg}") from None
    if not isinstance(doc, dict) or doc.get("schema_version") not in (3, CAMPAIGN_SCHEMA_VERSION):
        raise ValueError(f"merge: {path}: not a campaign.json of schema 3 or {CAMPAIGN_SCHEMA_VERSION}")
    return doc


def _first_failure(f: dict, sig: str, d: str, tag: str, out_dir: str) -> dict:
    """A failure's merged entry where it is first met, its reproducer copied into ``OUT/repro/``."""
    g = dict(f, signature=sig, found_in=[d], occurrences=f.get("occurrences", 1), shard=tag)
    src = f.get("repro")
    if src and not os.path.isabs(src) and not os.path.exists(src):
        src = os.path.join(d, "repro", os.path.basename(src))
    if src and os.path.exists(src):
        dst = os.path.join(out_dir, "repro", re.sub(r"[^A-Za-z0-9.]+", "-", tag).strip("-") + "-"
                           + os.path.basename(src))
        shutil.copyfile(src, dst)
        g["repro"] = dst
    return g


def merge_campaigns(dirs: list[str], out_dir: str) -> dict:
    """One ``OUT/campaign.json`` from the shards' report directories: cases and throughput summed, workers listed
    under their shard, failures deduplicated by :func:`failure_signature` (occurrences summed, ``found_in`` naming
    each directory), every kept reproducer copied into ``OUT/repro/``."""
    if not dirs:
        raise ValueError("merge: expected one or more campaign report directories")
    docs = [(d, _load_campaign(d)) for d in dirs]
    os.makedirs(os.path.join(out_dir, "repro"), exist_ok=True)
    cases: dict[str, int] = {}
    row_seconds: dict[str, float] = {}
    failures: list[dict] = []
    by_sig: dict[str, dict] = {}
    workers = []
    for i, (d, doc) in enumerate(docs):
        tag = doc.get("shard") or f"dir{i + 1}"
        for key, nc in doc.get("cases", {}).items():
            cases[key] = cases.get(key, 0) + nc
        for key, tp in (doc.get("throughput") or {}).get("rows", {}).items():
            row_seconds[key] = row_seconds.get(key, 0.0) + tp.get("seconds", 0.0)
        for w in doc.get("workers", []):
            workers.append(dict(w, id=f"{tag}:{w['id']}", shard=tag))
        for f in doc.get("failures", []):
            sig = f.get("signature") or failure_signature(f)
            if sig in by_sig:
                by_sig[sig]["occurrences"] += f.get("occurrences", 1)
                by_sig[sig]["found_in"].append(d)
                continue
            by_sig[sig] = _first_failure(f, sig, d, tag, out_dir)
            failures.append(by_sig[sig])
    seconds = max((doc.get("seconds", 0.0) for _, doc in docs), default=0.0)
    total = sum(cases.values())
    merged = {"schema_version": CAMPAIGN_SCHEMA_VERSION, "merged_from": [
        {"dir": d, "shard": doc.get("shard"), "base_seed": doc.get("base_seed"), "seconds": doc.get("seconds"),
         "cases": sum(doc.get("cases", {}).values()), "finished": doc.get("finished", False)} for d, doc in docs],
        "profile": docs[0][1].get("profile"), "base_seed": docs[0][1].get("base_seed"), "shard": None,
        "subjects": sorted({s for _, doc in docs for s in doc.get("subjects", [])}),
        "rounds": max((doc.get("rounds", 0) for _, doc in docs), default=0), "seconds": seconds,
        "cases": cases, "failures": failures, "workers": workers,
        "throughput": {"cases_per_second": _rate(total, seconds), "rows": {
            k: {"cases": v, "seconds": round(row_seconds.get(k, 0.0), 3),
                "cases_per_second": _rate(v, row_seconds.get(k, 0.0))} for k, v in cases.items()}},
        "finished": all(doc.get("finished", False) for _, doc in docs)}
    _atomic_json(os.path.join(out_dir, "campaign.json"), merged)
    return merged
