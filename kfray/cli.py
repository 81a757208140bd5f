"""Command line: `kfray run / tasks / status / doctor`.

Errors a user can fix (KfrayError) print one line and exit 2; no traceback.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
from pathlib import Path

from kfray.errors import KfrayError


def _cmd_run(args) -> int:
    from kfray.config import load_config
    from kfray.report import print_summary
    from kfray.run import run_search

    cfg = load_config(args.config, args.set or [])
    if args.address:
        cfg.address = args.address
    if args.task:
        cfg.tasks = args.task
    summary = run_search(cfg, args.run_dir, progress=not args.quiet)
    print_summary(summary)
    print(f"run folder: {summary['run_dir']} (summary.json, kfray.db, best/)")
    return 0


def _cmd_tasks(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from kfray.tasks import builtin_names, load_task

    t = Table(title="built-in tasks")
    for c in ("task", "description", "shape configs", "seeds"):
        t.add_column(c)
    for name in builtin_names():
        task = load_task(name)
        t.add_row(name, task.description, ", ".join(task.shapes),
                  ", ".join(f"{s.language}:{s.name}" for s in task.seeds))
    Console().print(t)
    return 0


def _cmd_status(args) -> int:
    from rich.console import Console
    from rich.table import Table

    db = Path(args.run_dir) / "kfray.db"
    if not db.is_file():
        raise KfrayError(f"{args.run_dir}: no kfray.db here; give the folder a `kfray run --run-dir` wrote")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    meta = {k: json.loads(v) for k, v in con.execute("SELECT key, value FROM meta")}
    t = Table(title=f"{args.run_dir}: {meta.get('status', '?')}")
    for c in ("task", "island", "candidates", "correct", "best speedup", "cells"):
        t.add_column(c, justify="right")
    q = ("SELECT task, island, COUNT(*), SUM(tier = 5), MAX(CASE WHEN tier = 5 THEN speedup END), "
         "COUNT(DISTINCT CASE WHEN outcome IN ('new_cell','replaced','seed') THEN cell END) "
         "FROM candidates GROUP BY task, island ORDER BY task, island")
    for task, island, n, ok, best, cells in con.execute(q):
        t.add_row(task, "seeds" if island < 0 else str(island), str(n), str(ok or 0),
                  f"{best:.2f}x" if best else "-", str(cells))
    Console().print(t)
    tiers = dict(con.execute("SELECT tier, COUNT(*) FROM candidates GROUP BY tier"))
    mig = con.execute("SELECT COUNT(DISTINCT task || '/' || round) FROM migrations").fetchone()[0]
    gens = con.execute("SELECT COUNT(DISTINCT generation) FROM prompts").fetchone()[0]
    print(f"tiers: {tiers}; migrations: {mig}; prompt generations: {gens}")
    return 0


def _cmd_doctor(args) -> int:
    rows = []
    rows.append(("python", sys.version.split()[0], True))
    for tool in ("g++", "nvcc", "icpx"):
        p = shutil.which(tool)
        rows.append((tool, p or "not found", bool(p) or tool != "g++"))
    for mod in ("ray", "numpy", "openai", "yaml", "cupy", "dpctl"):
        try:
            m = __import__(mod)
            rows.append((mod, getattr(m, "__version__", "ok"), True))
        except Exception as e:
            rows.append((mod, f"not importable ({type(e).__name__})", mod not in ("ray", "numpy", "openai", "yaml")))
    for name, val, ok in rows:
        print(f"{'ok ' if ok else 'BAD'} {name:8s} {val}")
    return 0 if all(ok for _, _, ok in rows) else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kfray", description="Island-model MAP-Elites search for fast kernels, on Ray.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a search (no CONFIG: built-in tasks, CPU backend, offline proposer)")
    r.add_argument("config", nargs="?", help="YAML config (see configs/)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. search.islands=2")
    r.add_argument("--run-dir", help="output folder (default runs/<timestamp>)")
    r.add_argument("--address", help="Ray cluster address (auto, ray://host:port); default: start locally")
    r.add_argument("--task", action="append", help="task to search (repeatable); overrides the config's tasks")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(fn=_cmd_run)
    t = sub.add_parser("tasks", help="list the tasks kfray can load")
    t.set_defaults(fn=_cmd_tasks)
    s = sub.add_parser("status", help="progress of a running or finished search, from its database")
    s.add_argument("run_dir")
    s.set_defaults(fn=_cmd_status)
    d = sub.add_parser("doctor", help="check compilers and packages")
    d.set_defaults(fn=_cmd_doctor)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KfrayError as e:
        print(f"kfray: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kfray: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
