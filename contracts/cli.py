"""The ``smv`` command: targets, audit, zoo, repro, list."""
from __future__ import annotations

import argparse
import json
import os
import sys

import impl  # noqa: F401  - decides the Triton mode before anything imports Triton

SCHEMA_VERSION = 1


def _targets_doc() -> dict:
    from contracts.markers import MARKERS, marker_status
    from impl.runtime import detect_device, triton_mode
    from impl.targets import TARGET_NAMES, aiter_status

    dev = detect_device()
    return {
        "schema_version": SCHEMA_VERSION,
        "device": dev.as_json(),
        "triton_mode": triton_mode(),
        "targets": list(TARGET_NAMES),
        "aiter": aiter_status().as_json(),
        "markers": {m: dict(zip(("runs", "reason"), marker_status(m, dev))) for m in MARKERS},
    }


def cmd_targets(args) -> int:
    from impl.targets import TARGETS, detect_target

    doc = _targets_doc()
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    d = doc["device"]
    print(f"device:      {d['kind']} {d['name']} ({d['arch']})")
    print(f"triton:      {doc['triton_mode']}")
    print(f"detected:    {detect_target().name}" + (f" (SMV_TARGET={os.environ['SMV_TARGET']})"
                                                     if os.environ.get("SMV_TARGET") else ""))
    print(f"aiter:       {'yes' if doc['aiter']['importable'] else 'no'} - {doc['aiter']['reason']}")
    print("targets:")
    for name in doc["targets"]:
        t = TARGETS[name]
        print(f"  {name:<8} main fp8 {t.main_cache_fp8}, decode {t.decode_family}, splits "
              f"{t.split_selector or '-'} (cap {t.split_cap or '-'}), sanitizing writer {t.sanitizes_writer}, "
              f"CUs {t.cu_count}")
    print("markers:")
    for m, st in doc["markers"].items():
        print(f"  {m:<7} {'runs' if st['runs'] else 'skips'}: {st['reason']}")
    return 0


def cmd_list(args) -> int:
    from contracts.registry import load_all

    for cid, c in sorted(load_all().items()):
        print(f"{cid:<28} [{', '.join(c.targets)}] {c.summary}")
    return 0


def cmd_audit(args) -> int:
    from contracts.audit import format_table, run_audit
    from fuzz.profiles import default_profile

    import signal

    def _term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)  # a CI timeout's SIGTERM still leaves the rows done so far on disk
    try:
        doc, code = run_audit(args.contract, args.target, budget=args.budget,
                              profile=args.profile or default_profile(), seed=args.seed, report_dir=args.report,
                              junit=args.junit, progress=not args.no_progress, argv=["smv"] + sys.argv[1:],
                              use_examples=not args.generator_only, max_cases=args.max_cases or None)
    except ValueError as exc:
        print(f"smv audit: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        where = f"; rows done so far are in {args.report}" if args.report else ""
        print(f"smv audit: interrupted{where}", file=sys.stderr)
        return 130
    print(format_table(doc))
    if args.report:
        print(f"reports: {os.path.join(args.report, 'audit.json')}, {os.path.join(args.report, 'audit.md')}")
    if args.junit:
        print(f"junit: {args.junit}")
    return code


def cmd_zoo(args) -> int:
    from contracts.reports import write_json
    from contracts.zoo.runner import load_catalogs, run_zoo

    try:
        mutants = load_catalogs(args.catalog or None)
    except ValueError as exc:
        print(f"smv zoo: {exc}", file=sys.stderr)
        return 2
    if args.mutant:
        known = {m.id for m in mutants}
        unknown = [m for m in args.mutant if m not in known]
        if unknown:
            print(f"smv zoo: unknown mutant(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.id in args.mutant]
    total = len(mutants)
    done = [0]

    partial: dict = {}

    def on_result(r):
        done[0] += 1
        if args.report:  # keep what is known if the zoo is killed part-way
            partial[r.id] = r.as_json()
            write_json(os.path.join(args.report, "zoo.json"),
                       {"schema_version": 1, "finished": False, "results": list(partial.values()),
                        "kill_rate": sum(x["status"] == "killed" for x in partial.values()) / len(partial)})
        print(f"[{done[0]}/{total}] {r.status.upper():<8} {r.id} ({r.seconds:.1f}s) {r.detail[:160]}",
              file=sys.stderr, flush=True)

    doc = run_zoo(mutants, cap=args.cap, jobs=args.jobs, budget=args.budget, on_result=on_result)
    doc["finished"] = True
    if args.report:
        write_json(os.path.join(args.report, "zoo.json"), doc)
    counts: dict[str, int] = {}
    for r in doc["results"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"{total} mutants: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
          + f"; kill rate {doc['kill_rate']:.0%} in {doc['seconds']:.0f}s")
    for r in doc["results"]:
        if r["status"] != "killed":
            print(f"  {r['status'].upper()}: {r['id']}: {r['detail']}")
    return 0 if all(r["status"] == "killed" for r in doc["results"]) else 1


def cmd_fuzz(args) -> int:
    from contracts.campaign import parse_duration, run_campaign

    try:
        budget = parse_duration(args.budget)
        round_s = parse_duration(args.round)
        if args.contract:
            from contracts.registry import get_contract

            for c in args.contract:
                get_contract(c)
    except ValueError as exc:
        print(f"smv fuzz: {exc}", file=sys.stderr)
        return 2
    doc, code = run_campaign(budget, args.report, contract_ids=args.contract, target_names=args.target,
                             round_seconds=round_s, seed=args.seed, profile=args.profile)
    print(f"{doc['rounds']} rounds, {sum(doc['cases'].values())} cases, {len(doc['failures'])} distinct failures "
          f"in {doc['seconds']:.0f}s; summary in {os.path.join(args.report, 'campaign.json')}")
    for f in doc["failures"]:
        print(f"  {f['status'].upper()} {f['contract']} on {f['target']}: {f['reason'][:160]}"
              + (f" (replay: smv repro {f['repro']})" if f["repro"] else ""))
    return code


def cmd_repro(args) -> int:
    from contracts.runner import replay

    try:
        c, t, case, violations = replay(args.file)
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        print(f"smv repro: {exc}", file=sys.stderr)
        return 2
    print(f"{c.id} on {t.name}: case {json.dumps(case, default=repr)[:400]}")
    if not violations:
        print("no violation: the saved case passes now")
        return 0
    for v in violations:
        print(f"  VIOLATION {v}")
    return 1


def build_parser() -> argparse.ArgumentParser:
    from impl.targets import TARGET_NAMES

    p = argparse.ArgumentParser(prog="smv", description="sparse-MLA verification suite")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("targets", help="device, Triton mode, emulated targets, AITER, hardware markers")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_targets)
    ls = sub.add_parser("list", help="list the registered contracts")
    ls.set_defaults(func=cmd_list)
    a = sub.add_parser("audit", help="run contracts on targets within a budget; exit 0 only if nothing failed")
    a.add_argument("--contract", action="append", help="contract id (repeatable; default: all)")
    a.add_argument("--target", action="append", choices=TARGET_NAMES, help="target (repeatable; default: all)")
    a.add_argument("--budget", type=float, default=120.0, help="seconds shared by all rows (default 120)")
    a.add_argument("--seed", type=int, default=None)
    a.add_argument("--profile", choices=("dev", "ci", "nightly"), default=None,
                   help="Hypothesis profile (default: ci when $CI is set, else dev)")
    a.add_argument("--report", metavar="DIR", help="write DIR/audit.json and DIR/audit.md")
    a.add_argument("--junit", metavar="FILE", help="write JUnit XML")
    a.add_argument("--no-progress", action="store_true", help="no per-row progress lines on stderr")
    a.add_argument("--max-cases", type=int, default=100,
                   help="generated cases per row at most (default 100; 0 = the profile's count); the budget bounds "
                        "each row too")
    a.add_argument("--generator-only", action="store_true",
                   help="skip the pinned regression examples: only generated cases count")
    a.set_defaults(func=cmd_audit)
    z = sub.add_parser("zoo", help="plant each catalogued bug and prove its contracts catch it")
    z.add_argument("--catalog", action="append", help="TOML catalog (repeatable; default: the built-in ones)")
    z.add_argument("--mutant", action="append", help="only this mutant id (repeatable)")
    z.add_argument("--budget", type=float, default=None, help="seconds for the whole zoo (default: no limit)")
    z.add_argument("--cap", type=float, default=90.0, help="time cap per mutant in seconds (default 90)")
    z.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="mutants run at once")
    z.add_argument("--report", metavar="DIR", help="write DIR/zoo.json")
    z.set_defaults(func=cmd_zoo)
    f = sub.add_parser("fuzz", help="nightly fuzz campaign: audit rounds under the nightly profile until the budget")
    f.add_argument("--budget", default="8h", help="duration: 8h, 30m, 90s, 1h30m or seconds (default 8h)")
    f.add_argument("--round", default="10m", help="one round's budget, shared by its rows (default 10m)")
    f.add_argument("--contract", action="append", help="contract id (repeatable; default: all)")
    f.add_argument("--target", action="append", choices=TARGET_NAMES, help="target (repeatable; default: all)")
    f.add_argument("--seed", type=int, default=None, help="base seed (round i uses seed + i)")
    f.add_argument("--profile", choices=("dev", "ci", "nightly"), default="nightly")
    f.add_argument("--report", default="smv-fuzz", metavar="DIR", help="campaign.json and repro/ (default smv-fuzz)")
    f.set_defaults(func=cmd_fuzz)
    r = sub.add_parser("repro", help="replay a saved failing case")
    r.add_argument("file")
    r.set_defaults(func=cmd_repro)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not os.environ.get("SMV_TORCH_THREADS_KEEP"):
        import torch

        torch.set_num_threads(1)  # checks are many tiny ops: threads only contend (see pytest_plugin)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
