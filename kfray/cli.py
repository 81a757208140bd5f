"""Command line: `kfray run / tasks / status / report / verify / doctor`.

Errors a user can fix (KfrayError) print one line and exit 2; no traceback.
"""
from __future__ import annotations

import argparse
import shutil
import sys

from kfray.errors import KfrayError
from kfray.proposers.preflight import preflight_llm


DEFAULT_RUN_SECONDS = 45.0     # the default run's proposing: the whole command then takes 75-90 s on 2 cores


def limit_default_run(cfg, config_path) -> None:
    """The default run (no config file, the offline proposer) proposes for DEFAULT_RUN_SECONDS, then
    its queued kernels finish and its bests are re-timed; a config file, an LLM proposer or
    --set search.time_limit_s (0: none) runs the budget out instead."""
    if config_path is None and cfg.proposer.kind == "offline" and "search.time_limit_s" not in cfg.explicit:
        cfg.search.time_limit_s = DEFAULT_RUN_SECONDS


def _cmd_run(args) -> int:
    from kfray.config import load_config
    from kfray.report import print_summary
    from kfray.driver import run_search

    cfg = load_config(args.config, args.set or [])
    limit_default_run(cfg, args.config)
    if args.address:
        cfg.address = args.address
    if args.task:
        cfg.tasks = args.task
    preflight_llm(cfg.proposer)
    _preflight_compiler(cfg)
    summary = run_search(cfg, args.run_dir, progress=not args.quiet)
    print_summary(summary)
    print(f"run folder: {summary['run_dir']} (summary.json, kfray.db, best/)")
    return 0


def _preflight_compiler(cfg) -> None:
    """A run on this machine alone whose evaluators all build with g++ stops before Ray starts
    where there is no compiler (on a cluster, each node says so for itself and the rest go on)."""
    import os

    from kfray.config import hardware_classes
    from kfray.eval.backends.cpu import compiler

    local = not (cfg.address or os.environ.get("RAY_ADDRESS"))
    if local and all(e.backend in ("cpu", "torch_ext_cpu") for e in hardware_classes(cfg)):
        compiler()


def _cmd_resume(args) -> int:
    from kfray.report import print_summary
    from kfray.driver import resume_search

    cfg = _stored_config(args.run_dir)
    if cfg is not None:
        preflight_llm(cfg.proposer)
    summary = resume_search(args.run_dir, progress=not args.quiet)
    print_summary(summary)
    return 0


def _stored_config(run_dir: str):
    """The configuration a run folder's database holds, or None (resume_search then says why)."""
    from pathlib import Path

    from kfray.config import config_from_dict
    from kfray.store import Store

    db = Path(run_dir) / "kfray.db"
    if not db.is_file():
        return None
    try:
        store = Store(db)
        try:
            meta = store.meta()
        finally:
            store.close()
        return config_from_dict(meta["config"], where=str(db)) if "config" in meta else None
    except KfrayError:
        raise
    except Exception:
        return None


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


def _cmd_verify(args) -> int:
    from kfray.verify import format_result, verify

    res, backend = verify(args.task, args.kernel, args.backend, args.set or [])
    print(format_result(res, backend, args.kernel, args.task))
    return 0 if res.correct else 1


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
    from kfray.config import load_config
    from kfray.eval.isolation import describe

    line, ok = describe(load_config(args.config, args.set or []).eval.isolation)
    rows.append(("isolation", line, ok))
    from kfray.tasks.suite_form import suite_backend_note

    rows.append(("suites", suite_backend_note(), True))
    if args.llm:
        from kfray.proposers.preflight import llm_doctor

        cfg = load_config(args.config, ["proposer.kind=llm"] + (args.set or []))
        rows += llm_doctor(cfg.proposer)[0]
    for name, val, ok in rows:
        print(f"{'ok ' if ok else 'BAD'} {name:9s} {val}")
    return 0 if all(ok for _, _, ok in rows) else 1


def build_parser() -> argparse.ArgumentParser:
    from kfray.sweep import add_sweep_args, add_tasks_args, add_verbose_arg, cmd_sweep, cmd_tasks

    p = argparse.ArgumentParser(prog="kfray", description="Island-model MAP-Elites search for fast kernels, on Ray.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a search (no CONFIG: built-in tasks, CPU backend, offline proposer)")
    r.add_argument("config", nargs="?", help="YAML config (see configs/)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. search.islands=2")
    r.add_argument("--run-dir", help="output folder (default runs/<timestamp>)")
    r.add_argument("--address", help="Ray cluster address (auto, ray://host:port); default: start locally")
    r.add_argument("--task", action="append", help="task to search (repeatable); overrides the config's tasks")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    add_verbose_arg(r)
    r.set_defaults(fn=_cmd_run)
    rs = sub.add_parser("resume", help="continue a stopped run from its database (nothing is evaluated twice)")
    rs.add_argument("run_dir")
    rs.add_argument("--quiet", action="store_true", help="no progress bar")
    add_verbose_arg(rs)
    rs.set_defaults(fn=_cmd_resume)
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
    v = sub.add_parser("verify", help="check and time one kernel file on a task, e.g. a published KernelBench or "
                                      "robust-kbench PyTorch-extension kernel (.cpp / .cu)")
    v.add_argument("task", help="task reference, e.g. kernelbench:FILE.py or rkb:DIR")
    v.add_argument("kernel", help="kernel file: a PyTorch extension or a kf_forward kernel")
    v.add_argument("--backend", choices=["cpu", "cuda", "torch_ext_cpu", "torch_ext_cuda"],
                   help="default: a suite's form (ModelNew .py, torch/extension.h included) runs on "
                        "torch_ext_cuda where PyTorch sees a GPU, else torch_ext_cpu (CUDA code: torch_ext_cuda); "
                        "a kf_forward kernel on cuda for .cu or CUDA code, else cpu (kfray doctor shows the choice)")
    v.add_argument("--set", action="append", metavar="KEY=VALUE", help="an eval setting, e.g. eval.repeats=20")
    add_verbose_arg(v)
    v.set_defaults(fn=_cmd_verify)
    d = sub.add_parser("doctor", help="check compilers, packages, whether generated code can be isolated "
                                      "(--llm: the LLM endpoint too)")
    d.add_argument("config", nargs="?", help="YAML config whose eval.isolation (and, with --llm, proposer) to check")
    d.add_argument("--llm", action="store_true", help="the LLM endpoint: its models, one tiny completion, "
                                                      "tokens per second")
    d.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config key, e.g. eval.isolation=strict or "
                        "proposer.base_url=http://127.0.0.1:8080/v1")
    d.set_defaults(fn=_cmd_doctor)
    return p


def _kfray_cause(e: BaseException) -> KfrayError | None:
    """The KfrayError behind `e`: itself, or what a Ray actor or task raised (RayTaskError.cause,
    ActorDiedError's creation-task error), so a compiler missing on an evaluator's node reads the
    same as one missing here."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        cause = getattr(e, "cause", None)
        if isinstance(cause, BaseException):
            e = cause
            continue
        if isinstance(e, KfrayError):
            return e
        e = e.__cause__ or e.__context__
    return None


def _error(e: KfrayError) -> int:
    import os

    from kfray.errors import RunStopped

    # Other evaluations that failed the same way would print their tracebacks at exit.
    os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
    if isinstance(e, RunStopped):
        print(f"kfray: {e}", file=sys.stderr)
        return e.exit_code
    print(f"kfray: error: {e}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "verbose", False):
        from kfray.cluster import set_verbose

        set_verbose(True)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("kfray: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        cause = _kfray_cause(e)
        if cause is None:
            raise
        return _error(cause)


if __name__ == "__main__":
    sys.exit(main())
