"""The worker processes the engine runs rows on (``smv fuzz`` and ``smv audit --jobs``): starting one pinned to a
device, sending it items, reading its answers, telling a crash or a hang from a finished row, and stopping it.
Each worker is ``contracts.engine.campaign_worker`` in its own process; a case it was checking when it died is
kept as a reproducer."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

#: a case that runs longer than this is a hang (seconds; the interpreter's limit is INTERPRETER_SCALE times it);
#: a contract may set its own with ``extra={"case_timeout": S}``
DEFAULT_CASE_TIMEOUT = 300.0


INTERPRETER_SCALE = 2.0


#: a worker ended by one of these was stopped from outside (a user, the OOM killer, a scheduler), not by its case
OUTSIDE_SIGNALS = (-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP)


#: a worker's time to start (import torch, Triton, every contract) before it is a crash
WORKER_START_TIMEOUT = 300.0

#: a worker exits with this status after answering a row when its device context is lost (an illegal address, a
#: device-side assert: CUDA and HIP keep such an error for the rest of the process), so the rows after it run on a
#: fresh worker instead of all failing with the same error
DEVICE_LOST_EXIT = 75


#: what CUDA and HIP say of an error that sticks to the context (every later call in the process fails with it)
STICKY_DEVICE_ERRORS = ("illegal memory access", "illegal address", "device-side assert", "unspecified launch failure",
                        "misaligned address", "illegal instruction", "cudaErrorIllegalAddress",
                        "hipErrorIllegalAddress",
                        "HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION", "Memory access fault",
                        "not supported on global/shared address space", "cudaErrorInvalidAddressSpace")
_sticky_errors: list[str] = []


def note_device_error(exc: BaseException) -> None:
    """Remember ``exc`` (raised by a check) when it is a sticky device error, for :func:`device_lost`."""
    text = str(exc)
    if any(s in text for s in STICKY_DEVICE_ERRORS):
        _sticky_errors.append(f"{type(exc).__name__}: {text.splitlines()[0]}")


def device_lost() -> str | None:
    """Why this process's accelerator context can run nothing more (the sticky error a check raised, or the one a
    synchronize and a one-element launch meet now), or None where it still works or no accelerator was used."""
    if _sticky_errors:
        return _sticky_errors[0]
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
    except Exception as exc:  # noqa: BLE001 - any failure here means the context is unusable
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def device_lost_line(who: str, msg: dict) -> str | None:
    """The supervisor's line for an answer whose worker then exits because its device context is lost (the
    answer's ``device_lost``), else None."""
    why = msg.get("device_lost")
    if not why:
        return None
    return (f"{who} lost its device context after this row ({why}); the row failed with it, with a reproducer, "
            f"and the rows after it run on a fresh worker\n")


def visible_devices() -> tuple[str, list[str]]:
    """The kind of GPU this process sees ('cuda', 'rocm' or 'cpu') and the ids a worker can be pinned to (as the
    visibility variable names them)."""
    from impl.runtime import triton_mode

    if triton_mode() == "interpreter":
        return "cpu", []
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    except Exception:  # noqa: BLE001 - no usable torch GPU build: the CPU
        return "cpu", []
    if not count:
        return "cpu", []
    var = "HIP_VISIBLE_DEVICES" if kind == "rocm" else "CUDA_VISIBLE_DEVICES"
    named = [x.strip() for x in os.environ.get(var, "").split(",") if x.strip()]
    return kind, (named[:count] if len(named) >= count else [str(i) for i in range(count)])


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class WorkerStartError(RuntimeError):
    """Workers die before they can take a row (a broken install, a contract module that does not import)."""


def _atomic_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1, default=repr)
    os.replace(tmp, path)


class Worker:
    """One worker process and what the supervisor knows of it."""

    def __init__(self, wid: str, device: tuple[str, str | None], report_dir: str, env_extra: dict):
        self.id = wid
        self.device = device
        self.dir = os.path.join(report_dir, "workers", wid)
        os.makedirs(os.path.join(self.dir, "repro"), exist_ok=True)
        self.case_file = os.path.join(self.dir, "case.json")
        self.trace_file = os.path.join(self.dir, "trace.json")
        env = dict(os.environ, **env_extra, SMV_CASE_FILE=self.case_file, SMV_CASE_TRACE=self.trace_file,
                   PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        kind, dev = device
        if kind == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = dev
        elif kind == "rocm":
            env["HIP_VISIBLE_DEVICES"] = dev
        self.proc = subprocess.Popen([sys.executable, "-m", "contracts.engine.campaign_worker", "--dir", self.dir,
                                      "--parent", str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, start_new_session=True, text=True, bufsize=1)
        self.started = time.monotonic()
        self.ready = False
        #: it answered its last row and is exiting (its device context was lost): hand it nothing more
        self.retiring = False
        self.item: dict | None = None
        self.item_started = 0.0
        self.buf = ""
        self.stats = {"id": wid, "device": self.device_name, "status": "starting", "pid": self.proc.pid,
                      "cases": 0, "items": 0, "seconds": 0.0}

    @property
    def device_name(self) -> str:
        kind, dev = self.device
        return "cpu" if kind == "cpu" else f"{kind}:{dev}"

    def send(self, msg: dict) -> None:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def start_item(self, item: dict) -> None:
        """Hand the worker ``item``: its case and trace files are cleared first, so they are this item's."""
        self.item = item
        self.item_started, self.item_wall = time.monotonic(), time.time()
        for f in (self.case_file, self.trace_file):
            if os.path.exists(f):
                os.unlink(f)
        try:
            self.send({"item": item})
        except (BrokenPipeError, OSError):
            pass  # it died: the supervisor's poll records it

    def read_answers(self) -> "list[dict] | None":
        """The whole JSON lines the worker answered since the last call; None once its pipe is closed."""
        chunk = os.read(self.proc.stdout.fileno(), 65536).decode(errors="replace")
        if not chunk:
            return None
        self.buf += chunk
        out = []
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def stalled(self, limit: float, before_first_case: float) -> bool:
        """No case of the current item ended within ``limit`` seconds (``before_first_case`` more before the
        first one: the item's own setup), or the worker never became ready."""
        if self.item is not None and time.monotonic() - self.last_activity() > limit + (
                before_first_case if self.last_case() is None else 0.0):
            return True
        return not self.ready and time.monotonic() - self.started > WORKER_START_TIMEOUT

    def lost(self, what: str, limit: float, repro_path: str, cid: str, target: str, label: str, spec: str
             ) -> "tuple[str, str | None]":
        """Why the current item ended without a verdict (``what``: "crash" or "hang", ``limit`` the case time
        limit), and the reproducer written at ``repro_path`` for the case it was checking (None before its first
        case)."""
        if what == "hang":
            reason = (f"hang: a case ran past its time limit of {limit:g}s; worker {self.id} on {self.device_name} "
                      f"was killed")
            outcome = {"kind": "hang", "timeout": limit}
        else:
            how = _signal_name(self.proc.returncode)
            reason = f"crash: worker {self.id} on {self.device_name} died ({how}) while checking a case"
            outcome = {"kind": "crash", "how": how, "returncode": self.proc.returncode, "timeout": limit}
        case = self.last_case()
        if case is None:
            return reason + " (before its first case: no reproducer)", None
        write_outcome_repro(repro_path, case, cid, target, label, spec, outcome, self.log_tail())
        return reason + f" ({case.get('phase')} case)", repro_path

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def last_case(self) -> dict | None:
        try:
            with open(self.case_file) as fh:
                return json.load(fh)
        except (OSError, json.JSONDecodeError):
            return None

    def last_activity(self) -> float:
        """When the current case (or, before the first, the item) started, on the monotonic clock."""
        try:
            age = time.time() - os.stat(self.case_file).st_mtime
            return max(self.item_started, time.monotonic() - age)
        except OSError:
            return self.item_started

    def counts(self) -> int:
        """Cases the current item had finished (from the runner's trace)."""
        try:
            with open(self.trace_file) as fh:
                t = json.load(fh)
            return int(t.get("pinned", 0)) + int(t.get("generated", 0))
        except (OSError, ValueError, json.JSONDecodeError):
            return 0

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(os.path.join(self.dir, "worker.log"), "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - n))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""


def start_error(w, what: str = "workers") -> "WorkerStartError":
    """The error that ends a supervisor once 3 ``what`` in a row died before they could take a row (``w`` last)."""
    return WorkerStartError(f"3 {what} in a row died before they could take a row; the last one's log "
                            f"({os.path.join(w.dir, 'worker.log')}) ends: {w.log_tail(600).strip()[-600:]}")


def unwatch(sel, w) -> None:
    """Stop watching ``w``'s pipe in ``sel`` (a closed pipe may already be unregistered)."""
    try:
        sel.unregister(w.proc.stdout)
    except (KeyError, ValueError):
        pass


def poll_answers(sel, on_ready, on_done, timeout: float = 0.2) -> None:
    """One round of a supervisor's message loop (``smv fuzz``'s and the audit pool's): wait up to ``timeout`` on the
    workers' pipes registered in ``sel``, mark a worker ``ready`` and call ``on_ready(w)`` when it says so, and call
    ``on_done(w, msg)`` for the answer to its current item; a closed pipe is unregistered (the death check sees it)."""
    for key, _ in sel.select(timeout=timeout):
        w = key.data
        answers = w.read_answers()
        if answers is None:
            sel.unregister(w.proc.stdout)
            continue
        _dispatch(w, answers, on_ready, on_done)


def _dispatch(w, answers: list, on_ready, on_done) -> None:
    for msg in answers:
        if "ready" in msg:
            w.ready = True
            on_ready(w)
        elif "done" in msg and w.item is not None and msg["done"] == w.item["g"]:
            on_done(w, msg)


def drain_answers(w, on_ready, on_done) -> None:
    """The answers a dead worker left in its pipe, dispatched as :func:`poll_answers` does: a worker that answers
    its row and then exits (``DEVICE_LOST_EXIT``) may be seen dead before the answer is read, and its row must keep
    its verdict rather than become a crash."""
    import select

    pipe = w.proc.stdout
    while pipe is not None and not pipe.closed and select.select([pipe], [], [], 0)[0]:
        answers = w.read_answers()
        if answers is None:
            return
        _dispatch(w, answers, on_ready, on_done)


def stop_workers(workers: list) -> None:
    """Ask the idle workers to exit, give them five seconds, then kill every worker (busy ones at once)."""
    for w in workers:
        if w.item is None and w.proc.poll() is None:
            try:
                w.send({"exit": True})
            except OSError:
                pass
    deadline = time.monotonic() + 5
    for w in workers:
        if w.item is None:
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        w.kill()


def write_outcome_repro(path: str, case: dict, cid: str, target: str, label: str, spec: str, outcome: dict,
                        log_tail: str) -> None:
    """A reproducer (schema 4) for the case a worker was checking when it crashed or hung: ``smv repro`` replays it
    in a subprocess and says whether the crash or hang comes back."""
    _atomic_json(path, {"schema_version": 4, "contract": cid, "target": target,
                        "subject": case.get("subject", label), "subject_spec": case.get("subject_spec", spec),
                        "case": case["case"], "violations": [], "outcome": outcome, "log_tail": log_tail})


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def _case_limit(contract, override: float | None) -> float:
    from impl.runtime import triton_mode

    if override is not None:
        return override
    base = float(contract.extra.get("case_timeout", DEFAULT_CASE_TIMEOUT))
    return base * (INTERPRETER_SCALE if triton_mode() == "interpreter" else 1.0)


def _label_suffix(label: str) -> str:
    return "" if label == "ours" else "-" + re.sub(r"[^A-Za-z0-9.]+", "-", label).strip("-")
