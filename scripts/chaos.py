#!/usr/bin/env python3
"""Chaos: a search on the CPU backend while evaluators and an island are killed at random, the
driver SIGKILLed part-way through and then resumed. Prints candidates submitted, evaluated, lost.

    python scripts/chaos.py [--tasks axpb,matmul] [--budget 24] [--seed 0] [--run-dir DIR]
                            [--set KEY=VALUE ...]

1. A driver process runs the search (its own local Ray); a chaos thread in it kills a random
   evaluator every few seconds (`ray.kill(..., no_restart=False)`: Ray restarts it, its job in
   flight is lost with it) and one island once.
2. Once a share of the budget is in the database, the driver's whole process group is SIGKILLed
   (the driver and the Ray instance it started): a crash, not a shutdown.
3. `resume_search` continues the run in this process, with the same chaos going on.

Every candidate handed to an evaluation queue is logged (one line each, written through, so a
SIGKILL keeps what was logged). Then:

- in flight at the crash: submitted by the killed driver, not in the database; the budget never
  counted them (a resume counts the database), so the resumed run proposes others in their place;
- lost: submitted by the run that finished but missing from the database, or in the database
  before the crash and missing after it. Must be 0;
- evaluated twice: rows with the same source and parameters. Must be 0;
- the database must end with budget x tasks rows.

Exit status 0 when all of that holds, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# --- helpers shared by both processes ----------------------------------------------------------------
def _rows(db: Path, sql: str = "SELECT COUNT(*) FROM candidates") -> list:
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def _count(db: Path) -> int:
    r = _rows(db)
    return r[0][0] if r else 0


def _config(args):
    from kfray.config import load_config

    return load_config(None, [f"tasks=[{args.tasks}]", "search.islands=2", f"search.budget={args.budget}",
                              "search.batch=2", "search.migrate_every=2", "eval.evaluators=2",
                              f"search.seed={args.seed}", *(args.set or [])])


def _log_submissions(path: Path) -> None:
    """Every candidate handed to an evaluation queue, one id per line, written through."""
    from kfray.eval.queue import EvalQueue

    log = open(path, "a", buffering=1)
    submit = EvalQueue.submit

    def logged(self, cand):
        log.write(cand.id + "\n")
        return submit(self, cand)

    EvalQueue.submit = logged


class Chaos(threading.Thread):
    """Kills a random evaluator of this run every few seconds and one island once."""

    def __init__(self, run_dir: Path, start_after: int, island_after: int, stats: Path, seed: int,
                 gap=(3.5, 7.0)):
        super().__init__(daemon=True)
        self.run_dir, self.db = run_dir, run_dir / "kfray.db"
        self.start_after, self.island_after = start_after, island_after
        self.stats_path, self.rng, self.gap = stats, random.Random(seed), gap
        self.stats = {"evaluators_killed": 0, "islands_killed": 0, "victims": []}
        self.stop = threading.Event()

    def run(self):
        import ray

        while not self.stop.wait(self.rng.uniform(*self.gap)):
            n = _count(self.db)
            if n < self.start_after or not ray.is_initialized():
                continue                 # actors still starting: the run is not in its loop yet
            try:
                names = [a for a in ray.util.list_named_actors() if f"kfray-{self.run_dir.name}-" in a]
            except Exception:
                continue
            evaluators = sorted(a for a in names if "-evaluator-" in a)
            islands = sorted(a for a in names if "-island-" in a)
            victims = [self.rng.choice(evaluators)] if evaluators else []
            if islands and not self.stats["islands_killed"] and n >= self.island_after:
                victims.append(self.rng.choice(islands))
            for v in victims:
                try:
                    ray.kill(ray.get_actor(v), no_restart=False)
                except Exception:
                    continue
                self.stats["islands_killed" if "-island-" in v else "evaluators_killed"] += 1
                self.stats["victims"].append(v.split(f"kfray-{self.run_dir.name}-", 1)[1])
            self.stats_path.write_text(json.dumps(self.stats))


# --- the driver that gets killed ---------------------------------------------------------------------
def _driver(args) -> int:
    from kfray.driver import run_search

    run_dir = Path(args.run_dir)
    chaos_dir = run_dir / "chaos"
    _log_submissions(chaos_dir / "submitted-1.log")
    Chaos(run_dir, args.start_after, args.island_after, chaos_dir / "stats-1.json", args.seed).start()
    run_search(_config(args), run_dir, progress=False)
    return 0


# --- the parent: crash, resume, count ----------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="axpb,matmul")
    p.add_argument("--budget", type=int, default=24, help="evaluations per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-dir")
    p.add_argument("--crash-at", type=float, default=0.45, help="share of the budget evaluated before the SIGKILL")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="extra config override")
    p.add_argument("--phase", default="main", help=argparse.SUPPRESS)
    p.add_argument("--start-after", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--island-after", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase == "driver":
        return _driver(args)

    from kfray.candidate import TIER_NAMES
    from kfray.driver import resume_search
    from kfray.tasks import load_task

    tasks = args.tasks.split(",")
    total = args.budget * len(tasks)
    seeds = sum(len(load_task(t).seeds_for("cpp")) for t in tasks)
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="kfray-chaos-")) / "run"
    chaos_dir = run_dir / "chaos"
    chaos_dir.mkdir(parents=True, exist_ok=True)
    db = run_dir / "kfray.db"
    crash_at = max(seeds + 4, int(total * args.crash_at))
    t0 = time.time()

    # 1. the search, with evaluators and an island killed along the way; then the driver crashes
    cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", "driver", "--run-dir", str(run_dir),
           "--tasks", args.tasks, "--budget", str(args.budget), "--seed", str(args.seed),
           "--start-after", str(seeds + 2), "--island-after", str(seeds + 4)]
    for s in args.set or []:
        cmd += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    print(f"chaos: {args.tasks}, budget {args.budget} per task ({total}), 2 islands per task, 2 evaluators; "
          f"driver SIGKILL at {crash_at} evaluated; run folder {run_dir}", flush=True)
    err = open(chaos_dir / "driver.log", "w")
    proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT),
                            start_new_session=True)
    stats1_path = chaos_dir / "stats-1.json"
    while proc.poll() is None:
        stats1 = json.loads(stats1_path.read_text()) if stats1_path.exists() else {}
        if _count(db) >= crash_at and stats1.get("islands_killed") and stats1.get("evaluators_killed"):
            break
        if _count(db) >= total - 2:       # the chaos never got its kills in: crash anyway, late
            break
        time.sleep(0.2)
    if proc.poll() is not None:
        print(f"chaos: the driver exited by itself (status {proc.returncode}) before the crash; see "
              f"{chaos_dir / 'driver.log'}")
        return 1
    os.killpg(proc.pid, signal.SIGKILL)       # the driver and the Ray instance it started
    proc.wait(30)
    crashed_at = time.time() - t0
    before = {i for i, in _rows(db, "SELECT id FROM candidates")}
    stats1 = json.loads(stats1_path.read_text()) if stats1_path.exists() else {}
    print(f"chaos: driver SIGKILLed after {crashed_at:.0f} s with {len(before)} candidates in the database; "
          f"resuming", flush=True)

    # 2. resume in this process, with the same chaos
    _log_submissions(chaos_dir / "submitted-2.log")
    chaos = Chaos(run_dir, len(before) + 2, len(before) + 4, chaos_dir / "stats-2.json", args.seed + 1)
    chaos.start()
    try:
        summary = resume_search(run_dir, progress=False)
    finally:
        chaos.stop.set()
    stats2 = chaos.stats

    # 3. count
    sub1 = [ln.strip() for ln in open(chaos_dir / "submitted-1.log") if ln.strip()]
    sub2 = [ln.strip() for ln in open(chaos_dir / "submitted-2.log") if ln.strip()]
    after = {i for i, in _rows(db, "SELECT id FROM candidates")}
    hashes = [h for h, in _rows(db, "SELECT src_hash FROM candidates WHERE source != ''")]
    tiers = dict(_rows(db, "SELECT tier, COUNT(*) FROM candidates GROUP BY tier"))
    in_flight = set(sub1) - after
    lost = (set(sub2) - after) | (before - after)
    twice = len(hashes) - len(set(hashes))
    submitted = set(sub1) | set(sub2)
    requeued, restores = summary.get("requeued", 0), summary.get("island_restores", 0)

    rows = [
        ("candidates submitted", len(set(sub1)), len(set(sub2)), len(submitted)),
        ("evaluated (in the database)", len(before), len(after) - len(before), len(after)),
        ("in flight at the crash (not charged, replaced)", len(in_flight), "", len(in_flight)),
        ("lost", "", "", len(lost)),
        ("evaluated twice", "", "", twice),
        ("evaluators killed", stats1.get("evaluators_killed", 0), stats2["evaluators_killed"],
         stats1.get("evaluators_killed", 0) + stats2["evaluators_killed"]),
        ("islands killed", stats1.get("islands_killed", 0), stats2["islands_killed"],
         stats1.get("islands_killed", 0) + stats2["islands_killed"]),
        ("jobs requeued after an evaluator died", "?", requeued, ""),
        ("islands restored from a checkpoint", "?", restores, ""),
        ("budget (evaluations)", "", "", total),
    ]
    w = max(len(r[0]) for r in rows)
    print(f"\n{'':{w}}  {'run':>8}  {'resume':>8}  {'total':>8}")
    for name, a, b, c in rows:
        print(f"{name:{w}}  {a!s:>8}  {b!s:>8}  {c!s:>8}")
    print("\ntiers in the database: " + ", ".join(f"{TIER_NAMES.get(t, t)} {n}" for t, n in sorted(tiers.items())))
    print(f"per task evaluated: " + ", ".join(f"{t}: {v['evaluated']}" for t, v in summary["tasks"].items()))
    ok = not lost and not twice and len(after) == total and all(
        v["evaluated"] == args.budget for v in summary["tasks"].values())
    print(f"\nchaos: {'OK' if ok else 'FAILED'}: {len(lost)} lost, {twice} evaluated twice, "
          f"{len(after)} evaluated of a budget of {total} ({time.time() - t0:.0f} s)")
    (chaos_dir / "result.json").write_text(json.dumps(
        {"ok": ok, "submitted": len(submitted), "evaluated": len(after), "lost": len(lost), "twice": twice,
         "in_flight_at_crash": len(in_flight), "budget": total, "requeued_resume": requeued,
         "island_restores_resume": restores, "kills_run": stats1, "kills_resume": stats2}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
