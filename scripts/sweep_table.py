"""A sweep's table in the suite's terms, read from its run database (kfray.db): for a sweep that
was stopped before it wrote sweep.md, or to compare runs. Per task: the suite's verdict on the best
kernel, its speedup the suite's way and kfray's way, which seed or edit it came from; then fast_p
both ways and the evaluation rate (time from the first to the last result).

    python scripts/sweep_table.py RUN_DIR_OR_DB [--since UNIX_TIME] [--until UNIX_TIME] > table.md
"""
from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
from pathlib import Path

from kfray.sweep import PS, fast_p, geomean_speedup


def rows_of(db: Path, since: float = 0.0, until: float = float("inf")) -> tuple[list[dict], dict]:
    con = sqlite3.connect(db)
    got = con.execute("SELECT task, origin, tier, speedup, facts, reason, created FROM candidates "
                      "WHERE created >= ? AND created <= ? ORDER BY created", (since, until)).fetchall()
    tasks: dict[str, dict] = {}
    for task, origin, tier, speedup, facts, reason, created in got:
        suite = (json.loads(facts or "{}") or {}).get("suite") or {}
        t = tasks.setdefault(task, {"task": task, "evaluated": 0, "correct": False, "speedup": 0.0,
                                    "suite_speedup": 0.0, "best": "", "reason": ""})
        t["evaluated"] += 1
        s_way = float(suite.get("speedup") or 0.0)
        if tier == 5 and s_way >= t["suite_speedup"]:
            t.update(correct=True, speedup=float(speedup or 0.0), suite_speedup=s_way, best=origin)
        elif not t["correct"] and not t["reason"]:
            first = (reason or "").splitlines()[0] if reason else ""
            t["reason"] = re.sub(r"^configuration .*?, (suite|kfray fresh-input) trial seed \d+: ", "", first)[:200]
    times = [r[6] for r in got]
    return list(tasks.values()), {"results": len(got), "first": min(times, default=0), "last": max(times, default=0)}


def markdown(rows: list[dict], span: dict) -> str:
    out = ["| task | verdict | speedup, robust-kbench's way | speedup, kfray's way | best kernel | evaluated |",
           "|---|---|---:|---:|---|---:|"]
    for r in sorted(rows, key=lambda r: r["task"]):
        name = r["task"].split("tasks/", 1)[-1]
        verdict = "correct" if r["correct"] else f"rejected: {r['reason']}"
        sp = (f"{r['suite_speedup']:.2f}x", f"{r['speedup']:.2f}x") if r["correct"] else ("-", "-")
        verdict = verdict.replace("|", "\\|")
        out.append(f"| {name} | {verdict} | {sp[0]} | {sp[1]} | {r['best'] or '-'} | {r['evaluated']} |")
    suite_way = [{"correct": r["correct"], "speedup": r["suite_speedup"]} for r in rows]
    kfray_way = [{"correct": r["correct"], "speedup": r["speedup"]} for r in rows]
    a, b = fast_p(suite_way, PS), fast_p(kfray_way, PS)
    out += ["", f"{len(rows)} tasks, {sum(r['correct'] for r in rows)} correct.", "",
            "| metric | robust-kbench's way | kfray's way |", "|---|---:|---:|"]
    out += [f"| fast_{p:g} | {a[p]:.3f} | {b[p]:.3f} |" for p in PS]
    out.append(f"| geomean speedup (correct) | {geomean_speedup(suite_way):.3f}x | {geomean_speedup(kfray_way):.3f}x |")
    wall = span["last"] - span["first"]
    if wall > 0:
        out += ["", f"{span['results']} results in {wall:.0f} s from the first to the last: "
                f"{3600 * len(rows) / wall:.0f} tasks per hour, {3600 * span['results'] / wall:.0f} evaluations per hour."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a run folder or its kfray.db")
    ap.add_argument("--since", type=float, default=0.0, help="only results created at or after this Unix time")
    ap.add_argument("--until", type=float, default=float("inf"), help="only results created up to this Unix time")
    args = ap.parse_args(argv)
    db = Path(args.run)
    db = db / "kfray.db" if db.is_dir() else db
    if not db.is_file():
        print(f"error: {db}: no such database", file=sys.stderr)
        return 2
    rows, span = rows_of(db, args.since, args.until)
    sys.stdout.write(markdown(rows, span))
    return 0


if __name__ == "__main__":
    sys.exit(main())
