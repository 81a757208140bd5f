"""Command line: `kfray run / tasks / status / report / doctor`.

Errors a user can fix (KfrayError) print one line and exit 2; no traceback.
"""
from __future__ import annotations

import argparse
import shutil
import sys

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


def _cmd_resume(args) -> int:
    from kfray.report import print_summary
    from kfray.run import resume_search

    summary = resume_search(args.run_dir, progress=not args.quiet)
    print_summary(summary)
    return 0


def _cmd_status(args) -> int:
    from kfray.report.status import show

    watch, run_dir = args.watch, args.run_dir
    if watch is not None:                     # `status --watch RUN_DIR`: the folder went to --watch
        try:
            watch = float(watch)
        except ValueError:
            watch, run_dir = 2.0, run_dir or watch
        if watch <= 0:
            raise KfrayError(f"--watch {args.watch}: give a positive number of seconds")
    if not run_dir:
        raise KfrayError("status needs a run folder: kfray status RUN_DIR [--watch [SECONDS]]")
    return show(run_dir, watch=watch)


def _cmd_report(args) -> int:
    from kfray.report.html import write_report

    html, pngs = write_report(args.run_dir, args.out)
    print(f"wrote {html} ({len(pngs)} plots in {html.parent / 'report'})")
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
    rs = sub.add_parser("resume", help="continue a stopped run from its database (nothing is evaluated twice)")
    rs.add_argument("run_dir")
    rs.add_argument("--quiet", action="store_true", help="no progress bar")
    rs.set_defaults(fn=_cmd_resume)
    from kfray.sweep import add_sweep_args, add_tasks_args, cmd_sweep, cmd_tasks
    t = sub.add_parser("tasks", help="list the tasks kfray can load (built-ins, a suite, a folder), with why any cannot load")
    add_tasks_args(t)
    t.set_defaults(fn=cmd_tasks)
    w = sub.add_parser("sweep", help="search many tasks at once (suite, task folder, KernelBench level, "
                                     "robust-kbench tasks); fast_p table")
    add_sweep_args(w)
    w.set_defaults(fn=cmd_sweep)
    s = sub.add_parser("status", help="progress of a running or finished search, from its database")
    s.add_argument("run_dir", nargs="?")
    s.add_argument("--watch", nargs="?", const="2", metavar="SECONDS",
                   help="refresh every SECONDS (default 2) until the run finishes or Ctrl-C")
    s.set_defaults(fn=_cmd_status)
    rp = sub.add_parser("report", help="write an HTML report with plots (archives, curves, lineage) for a run")
    rp.add_argument("run_dir")
    rp.add_argument("--out", metavar="FILE", help="HTML file to write (default RUN_DIR/report.html); "
                                                  "the PNGs go in a report/ folder next to it")
    rp.set_defaults(fn=_cmd_report)
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
