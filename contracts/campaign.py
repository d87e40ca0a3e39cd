"""``smv fuzz``: a long fuzz campaign (the nightly job) over every contract and target.

The campaign runs rounds of the audit under the ``nightly`` Hypothesis profile, whose example database persists under
``.smv/hypothesis`` (failures found on earlier nights are replayed first), each round with a fresh seed, until the
budget is spent. Every distinct failure is kept as a replayable reproducer in ``DIR/repro/`` and listed in
``DIR/campaign.json``, which is rewritten after every round so a killed campaign loses nothing.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time

#: 2: ``round_log`` (each round's seed, budget, seconds and cases) and ``seed`` on every failure
#: 3: ``subjects`` (the labels audited) and ``subject`` on every failure; ``cases`` keys gain ``@<subject>`` for a
#: subject other than ours
CAMPAIGN_SCHEMA_VERSION = 3


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


def run_campaign(budget: float, report_dir: str, *, contract_ids=None, target_names=None, round_seconds: float = 600,
                 seed: int | None = None, profile: str = "nightly", stream=None, subjects=None) -> tuple[dict, int]:
    """Audit rounds of ``round_seconds`` (the last one shorter) until ``budget`` seconds are spent; round ``i`` uses
    seed ``base_seed + i``. A round ends within one case of its share and never past the campaign's end: the
    shrinking of a failure is cut off there too. ``subjects`` (default ours) share each round's budget equally.
    A known row (every violation a recorded finding) is no failure."""
    from contracts.audit import run_audit
    from contracts.registry import load_all

    if not budget > 0 or not round_seconds > 0:
        raise ValueError(f"budget / round: expected positive durations, got {budget!r} / {round_seconds!r}")
    stream = stream or sys.stderr
    os.makedirs(os.path.join(report_dir, "repro"), exist_ok=True)
    from contracts.runner import resolve_subject

    load_all()  # importing every contract module is set-up, not a round's time
    subs = [resolve_subject(x) for x in (subjects or [None])]
    t0 = time.monotonic()
    end = t0 + budget
    base_seed = seed if seed is not None else int(time.time()) % (2 ** 31)
    doc = {"schema_version": CAMPAIGN_SCHEMA_VERSION, "budget": budget, "profile": profile, "base_seed": base_seed,
           "rounds": 0, "seconds": 0.0, "cases": {}, "round_log": [], "failures": [], "finished": False,
           "subjects": [x.label for x in subs]}
    seen: dict[tuple, dict] = {}

    def save():
        doc["seconds"] = round(time.monotonic() - t0, 1)
        tmp = os.path.join(report_dir, "campaign.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1)
        os.replace(tmp, os.path.join(report_dir, "campaign.json"))

    round_dir = os.path.join(report_dir, "last-round")
    try:
        while True:
            left = end - time.monotonic()
            if left < min(1.0, round_seconds):
                break
            r = doc["rounds"]
            r_start = time.monotonic()
            rdoc, _ = run_audit(contract_ids, target_names, budget=min(round_seconds, left) / len(subs),
                                profile=profile, seed=base_seed + r, report_dir=round_dir, progress=False,
                                shrink_until=end, subjects=subs)
            doc["rounds"] = r + 1
            doc["round_log"].append({"round": r, "seed": base_seed + r, "budget": round(min(round_seconds, left), 3),
                                     "seconds": round(time.monotonic() - r_start, 3),
                                     "cases": sum(row["cases"] for row in rdoc["results"]),
                                     "counts": rdoc["run"]["counts"]})
            for row in rdoc["results"]:
                s = row.get("subject") or {"name": "ours"}
                label = "ours" if s["name"] == "ours" else f"{s['name']}=={s['version']}"
                key = f"{row['contract']}/{row['target']}" + ("" if label == "ours" else f"@{label}")
                doc["cases"][key] = doc["cases"].get(key, 0) + row["cases"]
                if row["status"] not in ("fail", "error"):
                    continue
                first = row["violations"][0]["message"] if row["violations"] else row["reason"]
                sig = (label, row["contract"], row["target"], row["status"], first)
                if sig in seen:
                    seen[sig]["occurrences"] += 1
                    continue
                repro = None
                if row.get("repro") and os.path.exists(row["repro"]):
                    repro = os.path.join(report_dir, "repro", f"{row['contract']}-{row['target']}"
                                         + ("" if label == "ours" else "-" + re.sub(r"[^A-Za-z0-9.]+", "-", label))
                                         + f"-round{r}.json")
                    shutil.copyfile(row["repro"], repro)
                entry = {"contract": row["contract"], "target": row["target"], "subject": label,
                         "status": row["status"],
                         "reason": row["reason"], "violations": row["violations"][:5], "repro": repro,
                         "round": r, "seed": base_seed + r, "occurrences": 1}
                seen[sig] = entry
                doc["failures"].append(entry)
                stream.write(f"NEW {row['status'].upper()}: {key}: {row['reason'][:200]}"
                             + (f"\n    replay: smv repro {repro}" if repro else "") + "\n")
            total = sum(doc["cases"].values())
            stream.write(f"round {r + 1}: {total} cases so far, {len(doc['failures'])} distinct failures, "
                         f"{max(0.0, end - time.monotonic()):.0f}s left\n")
            stream.flush()
            save()
    except KeyboardInterrupt:
        stream.write("smv fuzz: interrupted; the campaign so far is saved\n")
    doc["finished"] = True
    save()
    return doc, (1 if doc["failures"] else 0)
