"""The ``smv`` command: targets, list, show, audit, zoo, fuzz, repro, subject, findings."""
from __future__ import annotations

import argparse
import difflib
import inspect
import json
import math
import os
import re
import shutil
import sys
import textwrap

import impl  # noqa: F401  - decides the Triton mode before anything imports Triton
from contracts.engine.reports import package_version

SCHEMA_VERSION = 1
#: ``smv list --json`` (DESIGN.md "Interfaces"): add fields, never remove; bump on any change of meaning
LIST_SCHEMA_VERSION = 1
ZOO_LIST_SCHEMA_VERSION = 1


class UsageError(ValueError):
    """A bad command line or environment: one line on stderr, exit 2."""


# --- docstrings as users read them -------------------------------------------------------------------------------

_ROLE = re.compile(r":[A-Za-z]+(?::[A-Za-z]+)?:`(~?)([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``", re.S)
_INTERPRETED = re.compile(r"(?<![`\w])`([^`]+)`_?(?!`)")
#: a period after these ends no sentence
_ABBREVIATIONS = ("e.g", "i.e", "cf", "vs", "etc", "approx", "resp", "no", "fig", "eq")


def plain_doc(doc: str) -> str:
    """A docstring without RST markup: roles (``:func:`~a.b``` -> ``b``), inline literals and interpreted text lose
    their backticks, a paragraph-ending ``::`` becomes ``:``; indentation normalised, paragraphs kept."""
    text = inspect.cleandoc(doc or "")

    def role(m):
        target = m.group(2).strip()
        return target.rsplit(".", 1)[-1] if m.group(1) else target

    text = _ROLE.sub(role, text)
    text = _LITERAL.sub(lambda m: m.group(1), text)
    text = _INTERPRETED.sub(lambda m: m.group(1), text)
    text = re.sub(r"(?<=\S)::(?=\s*$)", ":", text, flags=re.M)
    text = re.sub(r"^\s*::\s*$\n?", "", text, flags=re.M)
    return text.strip()


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line, markup stripped (the whole paragraph
    when it has no sentence end)."""
    para = re.split(r"\n\s*\n", plain_doc(doc), maxsplit=1)[0]
    para = " ".join(para.split())
    for m in re.finditer(r"[.!?](?=\s|$)", para):
        word = re.search(r"(\S+)$", para[: m.start()])
        if word and word.group(1).lower().lstrip("(\"'") in _ABBREVIATIONS:
            continue
        rest = para[m.end():].lstrip()
        if not rest or rest[0].isupper() or rest[0].isdigit() or rest[0] in "(\"'":
            return para[: m.end()]
    return para


def close_matches(word: str, choices) -> list[str]:
    """Ids a mistyped ``word`` may have meant: the ones containing it, then difflib's close matches."""
    choices = sorted(choices)
    contain = [c for c in choices if word and word.lower() in c]
    near = difflib.get_close_matches(word, choices, n=3, cutoff=0.5)
    return list(dict.fromkeys(contain[:3] + near))[:4]


def unknown_message(kind: str, word: str, choices, listing: str) -> str:
    near = close_matches(word, choices)
    hint = f"did you mean {', '.join(near)}?" if near else f"`{listing}` shows them"
    return f"unknown {kind} {word!r}; {hint}"


def _wrap(text: str, indent: str) -> str:
    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 110))
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


# --- checks of option values that argparse cannot make itself ------------------------------------------------------

def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _int_at_least(minimum: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = what
    return parse


def _duration(text: str) -> float:
    from contracts.engine.campaign import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


def _shard(text: str):
    from contracts.engine.campaign import parse_shard

    try:
        parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
    return text.strip()


def _check_contract_ids(ids) -> None:
    from contracts.registry import load_all

    known = load_all()
    for cid in ids or ():
        if cid not in known:
            raise UsageError(unknown_message("contract", cid, known, "smv list"))


def _check_output_path(option: str, path: str | None, *, folder: bool) -> None:
    """The report folder (or file) must be creatable: every existing part of its path a folder, the nearest
    existing one writable. Checked before the run, so a typo does not cost the whole budget."""
    if not path:
        return
    full = os.path.abspath(path)
    if os.path.exists(full):
        if folder and not os.path.isdir(full):
            raise UsageError(f"{option} {path}: exists and is not a folder")
        if not folder and os.path.isdir(full):
            raise UsageError(f"{option} {path}: is a folder, expected a file")
        if not os.access(full if folder else os.path.dirname(full), os.W_OK):
            raise UsageError(f"{option} {path}: not writable")
        return
    parent = os.path.dirname(full)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"{option} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: cannot create it, {parent} is not writable")


_PEP440 = re.compile(r"^([1-9][0-9]*!)?(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))*((a|b|rc)(0|[1-9][0-9]*))?"
                     r"(\.post(0|[1-9][0-9]*))?(\.dev(0|[1-9][0-9]*))?(\+[a-z0-9]+(\.[a-z0-9]+)*)?$", re.I)


def _check_release(spec: str) -> None:
    """``vllm==X`` must name a release version (PEP 440, as the index spells them) before anything asks the
    package index about it: a typo costs no download attempt."""
    if spec.startswith("vllm=="):
        version = spec[len("vllm=="):].partition("#")[0]  # a model variant (#deepseek_v41) follows the version
        if not _PEP440.match(version):
            raise UsageError(f"subject {spec}: {version!r} is not a release version (expected e.g. vllm==0.33.0)")


def _subject(spec: str):
    """A ``--subject`` value as a subject; a spec that names none is one line and exit 2."""
    from contracts.engine.runner import resolve_subject
    from contracts.subjects import SubjectSpecError

    spec = (spec or "").strip()
    _check_release(spec)
    try:
        return resolve_subject(spec)
    except SubjectSpecError as exc:
        raise UsageError(_one_line(exc)) from None


def _check_findings(path: str | None) -> None:
    from contracts.engine.findings import FindingsError, load
    from contracts.registry import load_all

    try:
        load(path, known_contracts=set(load_all()))
    except FindingsError as exc:
        raise UsageError(_one_line(exc)) from None


def _subjects(specs) -> list:
    from contracts.engine.runner import subject_spec

    subs = [_subject(s) for s in (specs or ["ours"])]
    for i, a in enumerate(subs):
        for b in subs[:i]:
            if (a.name, a.version) == (b.name, b.version):  # a report's rows name a subject by these two alone
                raise UsageError(f"--subject {subject_spec(b)} and --subject {subject_spec(a)} are both {a.label}: "
                                 f"their rows could not be told apart (audit them in two runs)")
    return subs


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


def _zoo_by_contract() -> dict[str, list]:
    """The planted bugs naming each contract: ours' catalogs, then the upstream ones (planted into a subject's
    source; subject-agreement's live only there)."""
    from contracts.zoo.runner import UPSTREAM_CATALOG_DIR, load_catalog, load_catalogs

    out: dict[str, list] = {}
    upstream = [m for p in sorted(UPSTREAM_CATALOG_DIR.glob("*.toml")) for m in load_catalog(p)]
    for m in load_catalogs() + upstream:
        for cid in m.expect:
            out.setdefault(cid, []).append(m)
    return out


def _list_doc() -> dict:
    from contracts.registry import load_all

    zoo = _zoo_by_contract()
    return {"schema_version": LIST_SCHEMA_VERSION,
            "contracts": [{"id": cid, "targets": list(c.targets), "summary": first_sentence(c.doc),
                           "doc": plain_doc(c.doc), "zoo": [m.id for m in zoo.get(cid, [])]}
                          for cid, c in sorted(load_all().items())]}


def cmd_list(args) -> int:
    doc = _list_doc()
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    for c in doc["contracts"]:
        print(f"{c['id']}  [{', '.join(c['targets'])}]")
        print(_wrap(c["summary"], "    "))
    return 0


def _source_of(c) -> str:
    try:
        path = inspect.getsourcefile(c.check)
        line = inspect.getsourcelines(c.check)[1]
    except (OSError, TypeError):
        return c.module
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rel = os.path.relpath(path, root) if path else c.module
    return f"{rel}:{line}"


def _show_doc(c) -> dict:
    from impl.targets import TARGET_NAMES

    ct = c.case_type
    return {"id": c.id, "summary": first_sentence(c.doc), "doc": plain_doc(c.doc), "targets": list(c.targets),
            "skipped": {t: c.skip_reason for t in TARGET_NAMES if t not in c.targets},
            "module": c.module, "source": _source_of(c),
            "case_type": f"{ct.__module__}.{ct.__qualname__}" if ct is not None else None,
            "numeric": bool(c.numeric), "min_cases": c.min_cases, "max_cases": c.max_cases,
            "zoo": [{"id": m.id, "title": m.title} for m in _zoo_by_contract().get(c.id, [])]}


def cmd_show(args) -> int:
    from contracts.registry import load_all

    contracts = load_all()
    if args.id not in contracts:
        raise UsageError(unknown_message("contract", args.id, contracts, "smv list"))
    doc = _show_doc(contracts[args.id])
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(doc["id"])
    print()
    for para in re.split(r"\n\s*\n", doc["doc"]):
        print(_wrap(" ".join(para.split()), "  "))
        print()
    print(f"targets:    {', '.join(doc['targets'])}")
    for t, why in doc["skipped"].items():
        print(f"skipped on: {t}: {why}")
    print(f"module:     {doc['module']} ({doc['source']})")
    print(f"case type:  {doc['case_type'] or 'untyped (plain JSON data)'}")
    print("check:      " + ("numeric: agreement within a tolerance; rows report the worst error/tolerance margin"
                            if doc["numeric"] else "exact"))
    most = (f"at most {doc['max_cases']} a row whatever --max-cases says" if doc["max_cases"] else
            "as many as --max-cases and the budget allow")
    print(f"cases:      at least {doc['min_cases']} generated for a row to pass; {most}")
    if doc["zoo"]:
        print("zoo:")
        for m in doc["zoo"]:
            print(f"  {m['id']}: {m['title']}")
    else:
        print("zoo:        no planted bug names this contract")
    return 0


def cmd_audit(args) -> int:
    from contracts.engine.audit import format_table, run_audit
    from contracts.engine.campaign import WorkerStartError
    from fuzz.profiles import default_profile

    import signal

    _check_contract_ids(args.contract)
    _check_output_path("--report", args.report, folder=True)
    _check_output_path("--junit", args.junit, folder=False)
    _check_findings(args.findings)
    subjects = _subjects(args.subject)  # before anything runs: a bad spec costs no budget
    changed = None
    if args.changed_since:  # contracts.engine.changes: which rows the change since REF touched, per subject
        from contracts.engine.changes import ChangesError, audit_selection
        from contracts.engine.runner import resolve_subject

        try:
            changed = audit_selection([resolve_subject(s) for s in (subjects or [None])], args.changed_since)
        except ChangesError as exc:
            print(f"smv audit: --changed-since: {_one_line(exc)}", file=sys.stderr)
            return 2
        picked = changed["report"]["selected"]
        print(f"changed since {args.changed_since}: {len(changed['report']['changed'])} files; selected: "
              + ("every row" if picked == "all" else (", ".join(picked) or "nothing")), file=sys.stderr)

    def _term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)  # a CI timeout's SIGTERM still leaves the rows done so far on disk
    try:
        profile = args.profile or default_profile()
        # ci's count is its promise (25 derandomized cases after each row's covering array); dev and nightly go on
        max_cases = args.max_cases if args.max_cases is not None else (0 if profile == "ci" else 100)
        doc, code = run_audit(args.contract, args.target, budget=args.budget,
                              profile=profile, seed=args.seed, report_dir=args.report,
                              junit=args.junit, progress=not args.no_progress, argv=["smv"] + sys.argv[1:],
                              use_examples=not args.generator_only, max_cases=max_cases or None,
                              allow_empty=args.allow_empty, subjects=subjects, findings_path=args.findings,
                              jobs=args.jobs, case_timeout=args.case_timeout,
                              first_violation=args.first_violation, changed_since=changed,
                              deadline=args.deadline)
    except (ValueError, WorkerStartError) as exc:
        print(f"smv audit: {_one_line(exc)}", file=sys.stderr)
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


def _select_mutants(args, subject=None):
    from contracts.zoo.runner import load_catalogs

    try:
        mutants = load_catalogs(args.catalog or None, subject=subject)
    except ValueError as exc:
        raise UsageError(_one_line(exc)) from None
    if args.mutant:
        known = {m.id for m in mutants}
        for mid in args.mutant:
            if mid not in known:
                raise UsageError(unknown_message("mutant", mid, known, "smv zoo --list"))
        mutants = [m for m in mutants if m.id in args.mutant]
    return mutants


def cmd_zoo(args) -> int:
    from contracts.engine.reports import ZOO_SCHEMA_VERSION, write_json
    from contracts.zoo.runner import is_release_skip, run_zoo, subject_json, ttk_summary

    subject = _subject(args.subject) if args.subject else None
    mutants = _select_mutants(args, subject)
    changed = None
    if getattr(args, "changed_since", None) and not args.list:
        from contracts.engine.changes import ChangesError, zoo_selection

        try:
            mutants, changed = zoo_selection(mutants, subject, args.changed_since)
        except ChangesError as exc:
            raise UsageError(f"--changed-since: {_one_line(exc)}") from None
        if not mutants:
            print(f"smv zoo: nothing the zoo covers changed since {args.changed_since} "
                  f"({len(changed['changed'])} files changed)")
            if args.report:
                write_json(os.path.join(args.report, "zoo.json"),
                           {"schema_version": ZOO_SCHEMA_VERSION, "subject": subject_json(subject),
                            "finished": True, "results": [], "time_to_kill": ttk_summary([]), "kill_rate": 1.0,
                            "seconds": 0.0, "changed_since": changed})
            return 0
    if args.list:
        if args.json:
            print(json.dumps({"schema_version": ZOO_LIST_SCHEMA_VERSION,
                              "mutants": [{"id": m.id, "title": m.title, "expect": list(m.expect),
                                           "targets": list(m.targets), "file": m.file, "catalog": m.catalog,
                                           "provenance": m.provenance} for m in mutants]}, indent=1))
            return 0
        for m in mutants:
            print(f"{m.id}  -> {', '.join(m.expect)}")
            print(_wrap(m.title, "    "))
        return 0
    if args.json:
        raise UsageError("--json goes with --list (a zoo run writes its JSON with --report DIR)")
    _check_output_path("--report", args.report, folder=True)
    _check_findings(args.findings)
    if not mutants:
        raise UsageError("no mutants to run" + (f" for subject {subject.label}" if subject else ""))
    total = len(mutants)
    done = [0]

    partial: dict = {}

    def on_result(r):
        done[0] += 1
        if args.report:  # keep what is known if the zoo is killed part-way
            partial[r.id] = r.as_json()
            write_json(os.path.join(args.report, "zoo.json"),
                       {"schema_version": ZOO_SCHEMA_VERSION, "subject": subject_json(subject), "finished": False,
                        "results": list(partial.values()),
                        "time_to_kill": ttk_summary(list(partial.values())),
                        "kill_rate": sum(x["status"] == "killed" for x in partial.values()) / len(partial)})
        ttk = r.as_json()["time_to_kill"]
        ttk_note = "" if not ttk else (f", killed after {ttk['cases']} cases in {ttk['seconds']:.1f}s"
                                       + (" by a crash" if ttk.get("crash") else ""))
        print(f"[{done[0]}/{total}] {r.status.upper():<8} {r.id} ({r.seconds:.1f}s{ttk_note}) {r.detail[:160]}",
              file=sys.stderr, flush=True)

    doc = run_zoo(mutants, cap=args.cap, jobs=args.jobs, budget=args.budget, on_result=on_result, subject=subject,
                  findings=os.path.abspath(args.findings) if args.findings else None)
    doc["finished"] = True
    if changed is not None:
        doc["changed_since"] = changed
    if args.report:
        write_json(os.path.join(args.report, "zoo.json"), doc)
    counts: dict[str, int] = {}
    for r in doc["results"]:
        key = "skipped (the subject predates them)" if is_release_skip(r) else r["status"]
        counts[key] = counts.get(key, 0) + 1
    under = f" planted into {subject.label}" if subject is not None and subject.name != "ours" else ""
    print(f"{total} mutants{under}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
          + f"; kill rate {doc['kill_rate']:.0%} in {doc['seconds']:.0f}s")
    t = doc["time_to_kill"]
    if t["killed"]:
        print(f"time to kill over {t['killed']} killed: median {t['median_seconds']:.1f}s ({t['median_cases']:g} "
              f"cases), worst {t['worst_seconds']:.1f}s ({t['worst']}); most cases {t['worst_cases']}")
    for r in doc["results"]:
        if r["status"] != "killed":
            print(f"  {r['status'].upper()}: {r['id']}: {r['detail']}")
    # an entry skipped because the subject predates its code is no failure (its detail names both releases)
    return 0 if all(r["status"] == "killed" or is_release_skip(r) for r in doc["results"]) else 1


def cmd_fuzz(args) -> int:
    from contracts.engine.campaign import CampaignBusy, WorkerStartError, run_campaign

    _check_contract_ids(args.contract)
    _check_output_path("--report", args.report, folder=True)
    subjects = _subjects(args.subject)
    try:
        doc, code = run_campaign(args.budget, args.report, contract_ids=args.contract, target_names=args.target,
                                 round_seconds=args.round, seed=args.seed, profile=args.profile, subjects=subjects,
                                 jobs=args.jobs, shard=args.shard, database=args.database,
                                 case_timeout=args.case_timeout)
    except (ValueError, CampaignBusy, WorkerStartError) as exc:
        print(f"smv fuzz: {_one_line(exc)}", file=sys.stderr)
        return 2
    tp = doc["throughput"]["cases_per_second"]
    print(f"{doc['items']} rows checked over {doc['rounds']} rounds on {doc['jobs']} workers"
          + (f" (shard {doc['shard']})" if doc["shard"] else "")
          + f": {sum(doc['cases'].values())} cases" + (f" ({tp:g}/s)" if tp else "")
          + f", {len(doc['failures'])} distinct failures in {doc['seconds']:.0f}s; summary in "
          + os.path.join(args.report, "campaign.json"))
    _print_failures(doc)
    return code


def _print_failures(doc: dict) -> None:
    for f in doc["failures"]:
        under = f" under {f['subject']}" if f.get("subject", "ours") != "ours" else ""
        times = f" x{f['occurrences']}" if f.get("occurrences", 1) > 1 else ""
        print(f"  {f['status'].upper()}{times} {f['contract']} on {f['target']}{under}: {f['reason'][:160]}"
              + (f" (replay: smv repro {f['repro']})" if f.get("repro") else ""))


def cmd_fuzz_merge(args) -> int:
    from contracts.engine.campaign import merge_campaigns

    _check_output_path("--report", args.report, folder=True)
    try:
        doc = merge_campaigns(args.dirs, args.report)
    except ValueError as exc:
        print(f"smv fuzz merge: {_one_line(exc)}", file=sys.stderr)
        return 2
    n = sum(f.get("occurrences", 1) for f in doc["failures"])
    print(f"merged {len(args.dirs)} campaigns: {sum(doc['cases'].values())} cases, {len(doc['failures'])} distinct "
          f"failures ({n} occurrences); summary in {os.path.join(args.report, 'campaign.json')}")
    _print_failures(doc)
    return 1 if doc["failures"] else 0


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _repro_error(path: str, exc: BaseException) -> str:
    """One line that names the file, whatever raised."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{path}: {exc.strerror}"
    if isinstance(exc, json.JSONDecodeError):
        return f"{path}: not valid JSON: {exc}"
    msg = _one_line(exc)
    return msg if path in msg else f"{path}: {msg}"


def _repro_outcome(path: str) -> dict | None:
    """The ``outcome`` of a crash or hang reproducer (a case that killed or hung its campaign worker), else None."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None  # the in-process replay says what is wrong with the file
    out = doc.get("outcome") if isinstance(doc, dict) else None
    return out if isinstance(out, dict) and out.get("kind") in ("crash", "hang") else None


def _replay_in_subprocess(path: str, outcome: dict, timeout: float | None) -> int:
    """Replay a crash or hang reproducer in a child process, so the crash ends that process and a hang can be
    stopped; report the outcome it gives now beside the one recorded."""
    import signal
    import subprocess

    limit = timeout or float(outcome.get("timeout") or 300.0)
    print(f"replaying a {outcome['kind']} reproducer in a subprocess (time limit {limit:g}s): recorded "
          + (f"crash ({outcome.get('how')})" if outcome["kind"] == "crash" else
             f"hang (no verdict within {outcome.get('timeout')}s)"))
    import tempfile
    import time

    with tempfile.TemporaryDirectory(prefix="smv-repro-") as tmp:
        ready = os.path.join(tmp, "ready")
        proc = subprocess.Popen([sys.executable, "-m", "contracts.engine.campaign_worker", "--replay", path],
                                start_new_session=True, env=dict(os.environ, SMV_REPLAY_READY=ready))
        started = time.monotonic()
        since = None  # the limit counts from the end of the child's imports, as a worker's counts per case
        while proc.poll() is None:
            now = time.monotonic()
            if since is None and os.path.exists(ready):
                since = now
            if (since is not None and now - since > limit) or now - started > limit + 300:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                print(f"HANG reproduced: no verdict within {limit:g}s (the process was killed)")
                return 1
            time.sleep(0.05)
    rc = proc.returncode
    if rc < 0:
        try:
            how = signal.Signals(-rc).name
        except ValueError:
            how = f"signal {-rc}"
        print(f"CRASH reproduced: the replay died ({how})")
        return 1
    if rc == 2:
        return 2
    if rc == 1:
        print(f"the case no longer {'crashes' if outcome['kind'] == 'crash' else 'hangs'}, but it fails (above)")
        return 1
    if rc != 0:
        print(f"CRASH reproduced: the replay ended with exit status {rc}")
        return 1
    print(f"no {outcome['kind']}: the saved case passes now")
    return 0


def cmd_repro(args) -> int:
    from contracts.engine.runner import replay_row

    outcome = _repro_outcome(args.file)
    if outcome is not None and not args.subject:
        return _replay_in_subprocess(args.file, outcome, args.timeout)
    subject = _subject(args.subject) if args.subject else None
    try:
        r = replay_row(args.file, subject)
    except (OSError, ValueError) as exc:  # contracts.engine.runner.ReproError is a ValueError
        print(f"smv repro: {_repro_error(args.file, exc)}", file=sys.stderr)
        return 2
    shown = r.case.to_json() if hasattr(r.case, "to_json") else r.case
    under = f" under {r.subject.label}" if r.subject.name != "ours" else ""
    print(f"{r.contract.id} on {r.target.name}{under}: case {json.dumps(shown, default=repr)[:400]}")
    if not r.violations:
        print("no violation: the saved case passes now")
        return 0
    for v in r.violations:
        print(f"  VIOLATION {v}")
    if r.findings:
        print(f"known finding{'s' if len(r.findings) > 1 else ''} {', '.join(r.findings)} (findings.toml) explain"
              f"{'' if len(r.findings) > 1 else 's'} every violation")
    return 1


def cmd_subject_fetch(args) -> int:
    from contracts.subjects import SubjectSpecError
    from contracts.subjects.vllm import loader

    spec = args.spec.strip()
    if not spec.startswith("vllm==") or spec == "vllm==":
        raise UsageError(f"subject fetch: expected vllm==VERSION (a release to download), got {args.spec!r}")
    _check_release(spec)
    version = spec[len("vllm=="):].partition("#")[0]  # the tree holds every model variant's modules
    dest = os.path.abspath(args.to)
    _check_output_path("--to", args.to, folder=True)
    if os.path.isdir(dest) and os.listdir(dest) and not os.path.exists(os.path.join(dest, "smv-subject.json")):
        raise UsageError(f"--to {args.to}: exists and is not empty (give a new folder, or one an earlier fetch wrote)")
    cached = os.path.join(loader.cache_dir(), f"vllm-{version}")
    try:
        if (os.path.realpath(cached) != os.path.realpath(dest)
                and os.path.exists(os.path.join(cached, "smv-subject.json"))
                and os.path.exists(os.path.join(cached, loader.MARKER))
                and not loader._not_asked_for(cached)  # else extracted before a module was audited: fetch again
                and not os.path.exists(os.path.join(dest, "smv-subject.json"))):
            # downloaded before into the user cache: the tree is copied, not downloaded again
            for rel in ("smv-subject.json",) + tuple(loader.NEEDED):
                if os.path.exists(os.path.join(cached, rel)):
                    os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                    shutil.copyfile(os.path.join(cached, rel), os.path.join(dest, rel))
            tree = loader.tree_at(dest)
        else:
            tree = loader.fetch_tree(version, to=dest)
    except SubjectSpecError as exc:
        raise UsageError(_one_line(exc)) from None
    n = len(tree.module_hashes())
    print(f"wrote {dest}: vllm {tree.version}, {n} audited modules"
          + (f", wheel sha256 {tree.wheel_sha256}" if tree.wheel_sha256 else ""))
    print(f"audit it with: smv audit --subject vllm@{dest}")
    return 0


def cmd_subject_show(args) -> int:
    from contracts.engine.runner import subject_spec

    sub = _subject(args.spec)
    doc = sub.describe()
    doc.update({"label": sub.label, "spec": subject_spec(sub)})
    print(json.dumps(doc, indent=1))
    return 0


def cmd_findings_export(args) -> int:
    """A finding as a maintainer receives it: a standalone script and an issue text."""
    from contracts.engine import findings as known_findings
    from contracts.engine.findings_export import ExportError, export

    try:
        fs = {f.id: f for f in known_findings.load(args.findings)}
    except known_findings.FindingsError as exc:
        raise UsageError(_one_line(exc)) from None
    if args.id not in fs:
        raise UsageError(f"no finding {args.id!r} (findings: {', '.join(sorted(fs))})")
    if args.vllm_tree and not os.path.isdir(os.path.join(args.vllm_tree, "vllm")):
        raise UsageError(f"--vllm-tree {args.vllm_tree}: no vllm/ folder there")
    try:
        paths = export(fs[args.id], args.to, args.vllm_tree)
    except ExportError as exc:
        raise UsageError(_one_line(exc)) from None
    print("wrote " + " and ".join(paths))
    print(f"run: python {paths[0]}" + ("" if args.vllm_tree else " --vllm-tree PATH   (or with vLLM installed)"))
    return 0


def cmd_findings_render(args) -> int:
    """FINDINGS.md from its sources; ``--check`` says whether the file on disk is what they give."""
    from contracts.engine import findings as known_findings
    from contracts.engine.findings_render import lifecycle_from_audits, lifecycle_path, render

    path = args.findings or known_findings.default_path()
    try:
        fs = known_findings.load(path)
    except known_findings.FindingsError as exc:
        raise UsageError(_one_line(exc)) from None
    life = None
    if args.audit:
        docs = []
        for a in args.audit:
            try:
                with open(a) as fh:
                    docs.append(json.load(fh))
            except (OSError, ValueError) as exc:
                raise UsageError(f"--audit {a}: {_one_line(exc)}") from None
        life = lifecycle_from_audits(docs)
    text = render(fs, path, life)
    target = args.to or os.path.join(os.path.dirname(os.path.abspath(path)), "FINDINGS.md")
    if args.check:
        try:
            with open(target, encoding="utf-8") as fh:
                same = fh.read() == text
        except OSError:
            same = False
        print(f"{target} is {'up to date' if same else 'stale: run smv findings render'}")
        return 0 if same else 1
    if life is not None:
        with open(lifecycle_path(path), "w", encoding="utf-8") as fh:
            json.dump(life, fh, indent=1)
            fh.write("\n")
    with open(target, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"wrote {target} ({len(fs)} findings)")
    return 0


def cmd_findings_check(args) -> int:
    """Replay every known finding's stored reproducer under one subject; exit 0 whatever the statuses, 2 when the
    subject or the findings file cannot be loaded."""
    from contracts.engine import findings as known_findings
    from contracts.engine.findings_check import SubjectLoadError, check
    from contracts.registry import load_all

    subject = _subject(args.spec)
    try:
        fs = known_findings.load(args.findings, known_contracts=set(load_all()))
        rows = check(fs, subject)
    except (known_findings.FindingsError, SubjectLoadError) as exc:
        raise UsageError(_one_line(exc)) from None
    if args.json:
        print(json.dumps({"schema_version": known_findings.CHECK_SCHEMA_VERSION, "subject": subject.label,
                          "findings": rows}, indent=1))
        return 0
    width = max([len(r["id"]) for r in rows] + [2])
    for r in rows:
        changed = {True: "code changed", False: "code as confirmed", None: "-"}[r["code_changed"]]
        print(f"{r['id']:<{width}}  {r['status']:<14}  {changed:<17}  {r['detail'][:140]}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"{len(rows)} findings on {subject.label}: "
          + ", ".join(f"{counts[k]} {k}" for k in known_findings.CHECK_STATUSES if k in counts)
          + f"; {sum(r['code_changed'] is True for r in rows)} with changed code")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (``smv audit: error: ...``) and exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from impl.targets import TARGET_NAMES

    seconds = _positive_seconds
    p = _Parser(prog="smv", description="sparse-MLA verification suite")
    p.add_argument("-V", "--version", action="version", version=f"smv {package_version()}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    t = sub.add_parser("targets", help="device, Triton mode, emulated targets, AITER, hardware markers")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_targets)
    ls = sub.add_parser("list", help="list the registered contracts")
    ls.add_argument("--json", action="store_true",
                    help="{schema_version, contracts: [{id, targets, summary, doc, zoo}]}")
    ls.set_defaults(func=cmd_list)
    sh = sub.add_parser("show", help="one contract's whole promise, targets, source and planted bugs")
    sh.add_argument("id", metavar="ID")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_show)
    a = sub.add_parser("audit", help="run contracts on targets within a budget; exit 0 only if nothing failed")
    a.add_argument("--contract", action="append", help="contract id (repeatable; default: all)")
    a.add_argument("--target", action="append", choices=TARGET_NAMES, help="target (repeatable; default: all)")
    a.add_argument("--budget", type=seconds, default=None,
                   help="seconds shared by all rows for cases beyond each row's minimum, which always runs: the "
                        "audit takes the larger of the minimums and the budget (default: 120 under dev, 450 under "
                        "ci, 600 under nightly)")
    a.add_argument("--deadline", type=seconds, default=None, metavar="S",
                   help="the hard stop (default none; CI pipelines set it): a row it cuts before its minimum, or "
                        "never starts, is incomplete naming it")
    a.add_argument("--seed", type=int, default=None)
    a.add_argument("--profile", choices=("dev", "ci", "nightly"), default=None,
                   help="Hypothesis profile (default: ci when $CI is set, else dev)")
    a.add_argument("--report", metavar="DIR", help="write DIR/audit.json and DIR/audit.md")
    a.add_argument("--junit", metavar="FILE", help="write JUnit XML")
    a.add_argument("--no-progress", action="store_true", help="no per-row progress lines on stderr")
    a.add_argument("--jobs", type=_int_at_least(1, "a count >= 1"), default=1,
                   help="worker processes that run rows side by side (default 1: one process); a native audit "
                        "compiles on one core per process, so a many-core GPU host gains most; workers share the "
                        "visible GPUs round-robin and the on-disk Triton cache")
    a.add_argument("--case-timeout", type=seconds, default=None, metavar="S",
                   help="with --jobs above 1: a case running longer is a hang, its worker is killed and the row is "
                        "an error (default: the contract's limit, else 300 natively, 600 on the interpreter)")
    a.add_argument("--max-cases", type=_int_at_least(0, "a count >= 0"), default=None,
                   help="generated cases per row at most (default 100, under ci the profile's count; 0 = the "
                        "profile's count); a row's covering array may exceed it, and the budget bounds each row too")
    a.add_argument("--generator-only", action="store_true",
                   help="skip the pinned regression examples: only generated cases count")
    a.add_argument("--first-violation", action="store_true",
                   help="each row stops at its first failing case, unshrunk (what the zoo's kill check needs)")
    a.add_argument("--allow-empty", action="store_true",
                   help="exit 0 even when no row passed (every row skipped); by default that fails the run")
    a.add_argument("--subject", action="append", metavar="SPEC",
                   help="the code under audit (repeatable; default ours): ours, vllm==VERSION (a release, "
                        "downloaded once), vllm@PATH (a checkout or a fetched tree) or vllm (the installed one); "
                        "flashmla or flashmla@PATH (FlashMLA's sparse decode, natively on NVIDIA SM90/SM100); "
                        "each subject gets the whole --budget")
    a.add_argument("--findings", metavar="FILE",
                   help="known findings (default: the suite's findings.toml); a row whose every violation is one "
                        "of them is known, which passes")
    a.add_argument("--changed-since", metavar="REF",
                   help="only the rows a change since REF touched (git diff REF...HEAD plus uncommitted files): REF "
                        "is a commit of this suite for ours, vllm==X and vllm, of the checkout for vllm@PATH; an "
                        "engine, oracle or fuzz change runs everything; nothing selected exits 0 saying so")
    a.set_defaults(func=cmd_audit)
    mu = sub.add_parser("mutate", help="mutation score: a seeded sample of cosmic-ray's mutants of impl/, each "
                                       "judged by the contracts that cover its module")
    mu.add_argument("--sample", type=_int_at_least(1, "a count >= 1"), default=60, help="mutants (default 60)")
    mu.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    mu.add_argument("--report", metavar="DIR", help="write DIR/mutate.json (rewritten after every mutant)")
    mu.add_argument("--cap", type=seconds, default=90.0, help="time cap per mutant in seconds (default 90)")
    mu.add_argument("--jobs", type=_int_at_least(1, "a count >= 1"), default=1, help="mutants run at once")
    mu.add_argument("--module", action="append", metavar="PATH",
                    help="only this module, relative to the root, e.g. impl/decode.py (repeatable; default impl/*.py)")
    mu.add_argument("--target", action="append", choices=TARGET_NAMES, help="target (repeatable; default: all)")
    mu.add_argument("--equivalents", metavar="FILE",
                    help="inspected equivalent mutants (default contracts/cli/mutate_equivalent.toml)")
    mu.add_argument("--no-progress", action="store_true", help="no per-mutant progress lines on stderr")
    mu.add_argument("--operators", choices=("all", "cosmic-ray", "triton"), default="all",
                    help="operator families: cosmic-ray's default set, ours for Triton code (masks, other=, strides, "
                         "block sizes, int64 widening, do_not_specialize), or all (default; sampled in turn)")
    mu.add_argument("--budget", type=seconds, default=None,
                    help="seconds for the whole session: the audits still running then are stopped (error, not judged) "
                         "and no mutant starts after it (default: no limit)")
    mu.add_argument("--history", action="append", metavar="FILE",
                    help="an earlier mutate.json whose kills order the covering contracts (repeatable; the zoo's "
                         "catalogs and this session's kills always count)")
    mu.add_argument("--triage", metavar="FILE",
                    help="run nothing: list FILE's (a mutate.json) survivors, timeouts and errors with operator, "
                         "file:line, diff and whether the equivalents file records them")
    mu.set_defaults(func=lambda args: __import__("contracts.cli.mutate", fromlist=["main_cli"]).main_cli(args))
    z = sub.add_parser("zoo", help="plant each catalogued bug and prove its contracts catch it")
    z.add_argument("--catalog", action="append", help="TOML catalog (repeatable; default: the built-in ones)")
    z.add_argument("--mutant", action="append", help="only this mutant id (repeatable)")
    z.add_argument("--list", action="store_true", help="list the mutants (id, expected contracts, title); run nothing")
    z.add_argument("--json", action="store_true", help="with --list: as JSON")
    z.add_argument("--budget", type=seconds, default=None, help="seconds for the whole zoo (default: no limit)")
    z.add_argument("--cap", type=seconds, default=90.0,
                   help="time cap per mutant in seconds, at least (default 90): a mutant whose expected rows cost more "
                        "on the unpatched tree (measured first, on this machine) gets 3x that cost plus 2x the "
                        "measured process start; zoo.json's cap_seconds says each one's")
    z.add_argument("--jobs", type=_int_at_least(1, "a count >= 1"), default=min(2, os.cpu_count() or 1),
                   help="mutants run at once")
    z.add_argument("--report", metavar="DIR", help="write DIR/zoo.json")
    z.add_argument("--subject", metavar="SPEC",
                   help="plant the bugs into this subject's source (default ours); without --catalog a subject "
                        "other than ours runs the upstream catalogs (contracts/zoo/upstream/*.toml)")
    z.add_argument("--findings", metavar="FILE",
                   help="known findings the mutants' audits use (default: the suite's findings.toml); a known row "
                        "is no kill")
    z.add_argument("--changed-since", metavar="REF",
                   help="only the entries a change since REF touched: its file changed, its catalog changed or it "
                        "expects a contract the change selects (see smv audit --changed-since)")
    z.set_defaults(func=cmd_zoo)
    f = sub.add_parser("fuzz", help="nightly fuzz campaign on every GPU and core; `smv fuzz merge DIR... --report "
                       "OUT` merges shards", description="The nightly campaign: rounds of every row under the "
                       "nightly profile on worker processes until the budget; crashes and hangs are findings; run "
                       "it again on the same --report to resume. `smv fuzz merge DIR... --report OUT` merges the "
                       "report directories of shards.")
    f.add_argument("--budget", type=_duration, default="8h",
                   help="duration: 8h, 30m, 90s, 1h30m or seconds (default 8h)")
    f.add_argument("--round", type=_duration, default="10m",
                   help="one round's budget, shared by its rows: each row runs round/rows seconds (default 10m)")
    f.add_argument("--contract", action="append", help="contract id (repeatable; default: all)")
    f.add_argument("--target", action="append", choices=TARGET_NAMES, help="target (repeatable; default: all)")
    f.add_argument("--seed", type=int, default=None, help="base seed (round i uses seed + i)")
    f.add_argument("--profile", choices=("dev", "ci", "nightly"), default="nightly")
    f.add_argument("--report", default="smv-fuzz", metavar="DIR", help="campaign.json and repro/ (default smv-fuzz)")
    f.add_argument("--subject", action="append", metavar="SPEC", help="the code under audit (repeatable; default ours)")
    f.add_argument("--jobs", type=_int_at_least(1, "a count >= 1"), default=None,
                   help="worker processes (default: one per visible GPU, else one per core); more than the GPUs "
                        "share them round-robin")
    f.add_argument("--shard", type=_shard, default=None, metavar="K/N",
                   help="run only shard K of N of the contract x target x seed space (a CI matrix or Slurm array; "
                        "the shards agree on the day's seed unless --seed is given)")
    f.add_argument("--database", metavar="DIR|redis://HOST:PORT/DB", default=None,
                   help="the shared Hypothesis example database (default .smv/hypothesis, or $SMV_HYPOTHESIS_DB)")
    f.add_argument("--case-timeout", type=seconds, default=None, metavar="S",
                   help="a case running longer is a hang (default: a contract's own, else 300s natively, 600s on "
                        "the interpreter)")
    f.set_defaults(func=cmd_fuzz)
    r = sub.add_parser("repro", help="replay a saved failing case (exit 1 while it fails, 2 for a bad file)")
    r.add_argument("file")
    r.add_argument("--timeout", type=seconds, default=None,
                   help="a crash or hang reproducer's time limit (default: the one it records)")
    r.add_argument("--subject", metavar="SPEC", help="replay under this subject instead of the one the file records")
    r.set_defaults(func=cmd_repro)
    sj = sub.add_parser("subject", help="fetch a vLLM release's audited modules as a tree; show a subject")
    sjs = sj.add_subparsers(dest="subject_cmd", required=True, metavar="ACTION")
    fe = sjs.add_parser("fetch", help="write the audited modules of vllm==VERSION into DIR (for vllm@DIR anywhere)")
    fe.add_argument("spec", metavar="vllm==VERSION")
    fe.add_argument("--to", required=True, metavar="DIR", help="the folder to write (new, or an earlier fetch's)")
    fe.set_defaults(func=cmd_subject_fetch)
    so = sjs.add_parser("show", help="name, version, source, module hashes and rewrites of a subject, as JSON")
    so.add_argument("spec", metavar="SPEC")
    so.set_defaults(func=cmd_subject_show)
    fi = sub.add_parser("findings", help="the known findings (findings.toml): check them on a subject")
    fis = fi.add_subparsers(dest="findings_cmd", required=True, metavar="ACTION")
    fc = fis.add_parser("check", help="replay each finding's stored reproducer under a subject: present, fixed, "
                                      "not_applicable or no_reproducer, and whether its code changed")
    fc.add_argument("--subject", dest="spec", required=True, metavar="SPEC",
                    help="the subject to check: vllm==VERSION, vllm@PATH, vllm, ours")
    fc.add_argument("--json", action="store_true",
                    help="{schema_version, subject, findings: [{id, status, code_changed, detail}]}")
    fc.add_argument("--findings", metavar="FILE", help="known findings (default: the suite's findings.toml); the "
                    "reproducers are FILE's folder's findings/<id>.json")
    fc.set_defaults(func=cmd_findings_check)
    fx = fis.add_parser("export", help="write DIR/repro.py (needs only torch, triton and vLLM or a tree) and "
                                       "DIR/ISSUE.md for a finding")
    fx.add_argument("id", metavar="ID")
    fx.add_argument("--to", required=True, metavar="DIR", help="the folder to write")
    fx.add_argument("--vllm-tree", metavar="PATH", help="the vLLM tree the script runs against by default (a "
                    "checkout or unpacked wheel; default: the installed vllm)")
    fx.add_argument("--findings", metavar="FILE", help="known findings (default: the suite's findings.toml)")
    fx.set_defaults(func=cmd_findings_export)
    fr = fis.add_parser("render", help="write FINDINGS.md from findings.toml, findings/notes/ and the latest "
                                       "audits (findings/lifecycle.json)")
    fr.add_argument("--to", metavar="FILE", help="where to write (default: FINDINGS.md beside findings.toml)")
    fr.add_argument("--check", action="store_true", help="write nothing; exit 1 when the file differs")
    fr.add_argument("--audit", action="append", metavar="FILE", help="audit.json whose rows refresh which subjects "
                    "showed each finding (findings/lifecycle.json; repeatable)")
    fr.add_argument("--findings", metavar="FILE", help="known findings (default: the suite's findings.toml)")
    fr.set_defaults(func=cmd_findings_render)
    from contracts.cli import bench

    bench.add_parser(sub)
    return p


def build_merge_parser() -> argparse.ArgumentParser:
    m = _Parser(prog="smv fuzz merge", description="merge shard report directories into one campaign.json; "
                "failures are deduplicated by contract, target, subject, status and first message (numbers masked)")
    m.add_argument("dirs", nargs="+", metavar="DIR", help="a shard's --report directory (repeatable)")
    m.add_argument("--report", required=True, metavar="OUT", help="write OUT/campaign.json and OUT/repro/")
    m.set_defaults(func=cmd_fuzz_merge)
    return m


def main(argv=None) -> int:
    import warnings

    # the interpreter evaluates kernels with numpy, which warns on the NaN/inf inputs many cases exist for; a
    # finding is a violation in the report, never a stray warning on stderr (pytest's configuration does the same)
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["fuzz", "merge"]:
        args = build_merge_parser().parse_args(argv[2:])
        args.cmd = "fuzz merge"
    else:
        args = build_parser().parse_args(argv)
    prog = f"smv {args.cmd}"
    try:
        from impl.targets import env_override

        env_override()  # a bad SMV_TARGET stops every command before it starts
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if not os.environ.get("SMV_TORCH_THREADS_KEEP"):
        import torch

        torch.set_num_threads(1)  # checks are many tiny ops: threads only contend (see pytest_plugin)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `smv list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
