"""One worker process of ``smv fuzz`` (and of ``smv audit --jobs``, contracts.engine.audit_pool): runs the rows its
supervisor hands it, one at a time, and answers each.

The supervisor (``contracts.engine.campaign``) starts it as ``python -m contracts.engine.campaign_worker --dir WDIR``, pinned to
one device by the environment (``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``), with ``SMV_CASE_FILE`` naming
the file the runner rewrites before every check. Commands arrive on stdin as JSON lines (``{"item": {...}}`` or
``{"exit": true}``); answers leave on the process's original stdout, which is kept for them alone: anything else
the row prints (Hypothesis' report, a kernel's message, an abort's last words) goes to ``WDIR/worker.log``. After a
row that leaves its device context lost (a sticky accelerator error) the worker exits with
``workers.DEVICE_LOST_EXIT`` once it has answered, so the supervisor starts a fresh one for the rows after it.

The worker never outlives its supervisor: on Linux the kernel sends it SIGKILL when the supervisor dies
(``PR_SET_PDEATHSIG``), and a watchdog thread exits it when its parent changes or its command pipe closes, so a
SIGKILLed campaign leaves no orphan holding a GPU.

``python -m contracts.engine.campaign_worker --replay FILE`` replays a reproducer in this process (``smv repro`` runs it in
a subprocess for a crash or hang reproducer, so that the crash ends that process, not the command): exit 0 when
the case passes now, 1 when it gives violations, 2 when the file cannot be replayed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback


def _die_with_parent(parent: int) -> None:
    try:  # Linux: the kernel kills this process when the thread that started it ends
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - elsewhere the watchdog below is the guard
        pass
    if os.getppid() != parent:  # the supervisor died before the line above ran
        os._exit(3)

    def watch():
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, name="smv-supervisor-watch", daemon=True).start()


def _run_item(item: dict, wdir: str, subjects: dict) -> dict:
    from contracts.registry import get_contract
    from contracts.engine.runner import resolve_subject, run_contract

    spec = item["subject"]
    if spec not in subjects:
        subjects[spec] = resolve_subject(None if spec == "ours" else spec)
    c = get_contract(item["contract"])
    start = time.monotonic()
    row = run_contract(c, item["target"], profile=item["profile"], budget=item["budget"], seed=item["seed"],
                       repro_dir=os.path.join(wdir, "repro"), shrink_until=start + item["budget"] + item["grace"],
                       subject=subjects[spec])
    doc = row.as_json()
    return {"done": item["g"], "row": doc, "seconds": round(time.monotonic() - start, 3)}


def serve(wdir: str, parent: int) -> int:
    from contracts.engine.workers import DEVICE_LOST_EXIT, device_lost

    _die_with_parent(parent)
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    log = os.open(os.path.join(wdir, "worker.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    import torch

    torch.set_num_threads(1)
    from contracts.registry import load_all

    load_all()
    answers.write(json.dumps({"ready": os.getpid()}) + "\n")
    subjects: dict = {}
    held: dict = {}  # an audit's first passes, for their second passes (contracts.engine.audit_pool)
    case_file = os.environ.get("SMV_CASE_FILE")
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("exit"):
            break
        item = msg["item"]
        if case_file and os.path.exists(case_file):
            os.unlink(case_file)  # a case file left by the previous row must not name this row's crash
        print(f"--- item {item['g']}: {item['contract']} on {item['target']} under {item['subject']}, "
              f"seed {item['seed']}", flush=True)
        try:
            if "audit" in item:
                from contracts.engine.audit_pool import run_item

                out = run_item(item, subjects, held)
            else:
                out = _run_item(item, wdir, subjects)
        except Exception as exc:  # noqa: BLE001 - a harness failure: the supervisor records it as an error
            out = {"done": item["g"], "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-4000:]}
        lost = device_lost()
        if lost:  # every later row would fail with the same error: the supervisor starts a fresh worker
            out["device_lost"] = lost
        answers.write(json.dumps(out, default=repr) + "\n")
        if lost:
            print(f"--- device context lost after item {item['g']}: {lost}; exiting", flush=True)
            answers.flush()
            os._exit(DEVICE_LOST_EXIT)
    return 0


def replay(path: str) -> int:
    from contracts.registry import load_all
    from contracts.engine.runner import replay_row

    load_all()
    ready = os.environ.get("SMV_REPLAY_READY")
    if ready:  # the imports are done: the caller's time limit counts from here
        open(ready, "w").close()

    try:
        r = replay_row(path)
    except (OSError, ValueError) as exc:
        print(f"smv repro: {exc}", file=sys.stderr)
        return 2
    for v in r.violations:
        print(f"  VIOLATION {v}")
    return 1 if r.violations else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m contracts.engine.campaign_worker")
    p.add_argument("--dir")
    p.add_argument("--parent", type=int)
    p.add_argument("--replay", metavar="FILE")
    args = p.parse_args(argv)
    if args.replay:
        import torch

        torch.set_num_threads(1)
        return replay(args.replay)
    return serve(args.dir, args.parent)


if __name__ == "__main__":
    sys.exit(main())
