"""`kfray sweep` and `kfray tasks` (and `python -m kfray.sweep`)."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from kfray.errors import KfrayError
from kfray.tasks.suite_spec import RKB_MODES
from kfray.sweep.plan import plan, split_flagged
from kfray.sweep.run import run_sweep
from kfray.sweep.tables import markdown

def add_sweep_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("suite", help="suite name (e.g. llama32-1b), a folder of tasks, a KernelBench repo or level "
                                 "folder, a robust-kbench tasks folder, or a task")
    p.add_argument("--level", type=int, help="KernelBench level: use SUITE/levelN (or SUITE/KernelBench/levelN)")
    p.add_argument("--tasks", help="comma list of task names (or name prefixes) to keep")
    p.add_argument("--rkb-mode", choices=RKB_MODES, default="",
                   help="robust-kbench configuration mode of the tasks found (default: single, as the suite runs)")
    p.add_argument("--include-flagged", action="store_true",
                   help="also run the tasks the suite's filter_results.json flags (skipped by default)")
    p.add_argument("--config", help="YAML config (see configs/)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--budget-total", type=int, default=0, help="evaluations for the whole sweep, split over tasks "
                                                              "(default: search.budget per task)")
    p.add_argument("--budget-tokens", type=int, default=0, help="LLM tokens for the whole sweep, shared by all tasks "
                                                               "(proposer.token_budget)")
    p.add_argument("--budget-cost", type=float, default=0.0, help="LLM cost for the whole sweep, shared by all tasks "
                                                                 "(proposer.max_cost)")
    p.add_argument("--torch-compile", action=argparse.BooleanOptionalAction, default=None,
                   help="also time torch.compile of PyTorch references, for a second speedup column "
                        "(default: on, unless the config sets eval.torch_compile)")
    p.add_argument("--run-dir", help="output folder (default runs/<timestamp>)")
    p.add_argument("--address", help="Ray cluster address (auto, ray://host:port); default: start locally")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_verbose_arg(p)
    return p


def add_verbose_arg(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--verbose", action="store_true",
                   help="also show Ray's own lines (start-up notices, worker-pool warnings), kept out by default")
    return p


def add_tasks_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("path", nargs="?", help="suite name, folder or file (default: the built-in tasks)")
    p.add_argument("--level", type=int, help="KernelBench level folder under PATH")
    p.add_argument("--rkb-mode", choices=RKB_MODES, default="",
                   help="robust-kbench configuration mode of the tasks found (default: single, as the suite runs)")
    return p


def cmd_sweep(args) -> int:
    from kfray.config import load_config
    from kfray.report import print_summary
    from kfray.languages import language_of

    cfg = load_config(args.config, args.set or [])
    if args.address:
        cfg.address = args.address
    if args.torch_compile is not None:
        cfg.eval.torch_compile = args.torch_compile
    elif not _names_key(args, "eval.torch_compile"):
        cfg.eval.torch_compile = True      # a sweep's table reports both baselines
    language = language_of(cfg.eval)
    refs, skipped = plan(args.suite, args.level, args.tasks, language, cfg.proposer.kind == "offline",
                         getattr(args, "rkb_mode", ""))
    if not _names_key(args, "eval.backend") and suite_form_default(cfg, refs, skipped):
        language = language_of(cfg.eval)
        refs, skipped = plan(args.suite, args.level, args.tasks, language, cfg.proposer.kind == "offline",
                             getattr(args, "rkb_mode", ""))
    gpu_evaluators_default(cfg, _names_key(args, "eval.evaluators"))
    for ref, why in skipped.items():
        print(f"kfray: skipping {ref}: {why}", file=sys.stderr)
    if not getattr(args, "include_flagged", False):
        refs, flagged = split_flagged(refs)
        if flagged:
            print(f"kfray: skipping {len(flagged)} task(s) the suite itself flags as degenerate "
                  f"(filter_results.json; --include-flagged runs them): "
                  + "; ".join(f"{r}: {w}" for r, w in flagged.items()), file=sys.stderr)
    from kfray.proposers.preflight import preflight_llm
    preflight_llm(cfg.proposer)
    summary = run_sweep(cfg, refs, args.run_dir, skipped, progress=not args.quiet,
                        budget_total=args.budget_total, title=f"kfray sweep: {args.suite}",
                        budget_tokens=args.budget_tokens, budget_cost=args.budget_cost)
    print_summary(summary)
    sw = summary["sweep"]
    print(markdown(sw["rows"], sw["suite"], f"kfray sweep: {args.suite}", sw["budget"]))
    print(f"run folder: {summary['run_dir']} (sweep.md, sweep_tasks.csv, sweep_fast_p.csv, summary.json)")
    return 0


def suite_form_default(cfg, refs: list[str], skipped: dict[str, str]) -> bool:
    """A sweep of a suite's tasks (KernelBench, robust-kbench), with no backend asked for, searches
    in the suite's own form, so that its best kernels are files the suite's harness takes: on the
    GPU PyTorch sees (torch_ext_cuda), else on the CPU (torch_ext_cpu). Returns whether it changed
    eval.backend, and says so."""
    from kfray.tasks import load_task

    def is_suite(ref: str) -> bool:
        try:
            return getattr(load_task(ref), "suite", None) is not None
        except KfrayError:            # skipped as it cannot load: it decides nothing
            return False

    if cfg.eval.backend.startswith("torch_ext") or not all(map(is_suite, refs)) \
            or not any(map(is_suite, [*refs, *skipped])):
        return False
    from kfray.tasks.suite_form import torch_gpu

    cfg.eval.backend = "torch_ext_cuda" if torch_gpu() else "torch_ext_cpu"
    print(f"kfray: suite tasks are searched in the suite's own form: eval.backend={cfg.eval.backend} "
          "(--set eval.backend=cpu or cuda searches kfray's kf_forward form instead)", file=sys.stderr)
    return True


def gpu_evaluators_default(cfg, user_set: bool) -> bool:
    """A sweep on GPUs (cuda, torch_ext_cuda) runs one evaluator per GPU of the cluster
    (eval.evaluators=0) unless the user set eval.evaluators: the default of 2 is the CPU's, and a
    one-GPU machine could not start them (a config with hardware classes sizes its own). Returns
    whether it changed eval.evaluators."""
    if user_set or cfg.hardware or cfg.eval.backend not in ("cuda", "torch_ext_cuda") or cfg.eval.evaluators == 0:
        return False
    cfg.eval.evaluators = 0
    print(f"kfray: {cfg.eval.backend}: one evaluator per GPU (eval.evaluators=0; --set eval.evaluators=N for "
          "another count)", file=sys.stderr)
    return True


def _names_key(args, key: str) -> bool:
    """Whether --set or the config file sets `key` (dotted), so a sweep default must not override it."""
    if any(o.partition("=")[0].strip() == key for o in args.set or []):
        return True
    if not args.config:
        return False
    import yaml

    try:
        data = yaml.safe_load(Path(args.config).read_text()) or {}
    except Exception:
        return False
    for k in key.split("."):
        if not isinstance(data, dict) or k not in data:
            return False
        data = data[k]
    return True


def reason_key(msg: str) -> str:
    """A short key that groups load errors of one kind across tasks: the message's first line without
    where it happened, quoted names or numbers, cut before its details."""
    from kfray.tasks.robust_kbench import SUITE_BUG

    line = msg.splitlines()[0] if msg else ""
    if SUITE_BUG in line:
        return f"{SUITE_BUG}: its config passes a setting that Model() or get_inputs() does not take"
    line = re.sub(r"^\S*[/\\]\S*?(?: \(configuration [^)]*\))?: ", "", line)    # the file and configuration
    line = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "X", line)
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    line = re.split(r" \(|; |: ", line)[0]
    return line[:90] or "unknown"


def cmd_tasks(args) -> int:
    """List what a folder holds; exit 1 when some tasks cannot load, with a count per reason."""
    from rich.console import Console
    from rich.table import Table

    from kfray.tasks import discover, load_task, suite_names

    path, level = getattr(args, "path", None), getattr(args, "level", None)
    found = discover(path, level, getattr(args, "rkb_mode", "") or "")
    t = Table(title=f"tasks in {path}" if path else "built-in tasks", show_lines=False)
    for c in ("task", "status", "shape configs", "seeds"):
        t.add_column(c, overflow="fold")
    reasons: dict[str, list[str]] = {}
    flagged = []
    for ref, err in found:
        if err:
            reasons.setdefault(reason_key(err), []).append(ref)
            t.add_row(ref, f"[red]cannot load[/red]: {err}", "", "")
            continue
        task = load_task(ref)
        suite = getattr(task, "suite", None)
        shapes = ", ".join(task.shapes)
        if len(shapes) > 80:
            shapes = f"{len(task.shapes)} config{'s' if len(task.shapes) > 1 else ''}: {shapes[:70]}..."
        status = "ok: " + task.description.splitlines()[0][:90]
        if suite is not None and suite.flagged:
            flagged.append(ref)
            status = f"[yellow]flagged by the suite ({', '.join(suite.flagged)})[/yellow]; " + status
        if suite is not None and suite.functional_error:
            status += f" [yellow]kf_forward: {suite.functional_error}[/yellow]"
        t.add_row(ref.split(":", 1)[1] if ref.startswith("builtin:") else ref, status, shapes,
                  ", ".join(f"{s.language}:{s.name}" for s in task.seeds) or "-")
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(t)
    bad = sum(len(r) for r in reasons.values())
    print(f"{len(found) - bad} of {len(found)} tasks load" + (f"; {bad} cannot:" if bad else ""))
    def names(refs: list[str], most: int) -> str:
        root = Path(path).resolve() if path else None
        short = []
        for r in refs[:most]:
            tail = r.split(":", 1)[-1]
            try:
                short.append(str(Path(tail).relative_to(root)) if root else tail)
            except ValueError:
                short.append(Path(tail).name)
        return ", ".join(short) + (", ..." if len(refs) > most else "")

    for key, refs in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(refs):4d}  {key} ({names(refs, 4)})")
    if flagged:
        print(f"{len(flagged)} flagged by the suite's filter_results.json (kfray sweep skips them unless "
              f"--include-flagged): {names(flagged, 12)}")
    if path is None and suite_names():
        print(f"suites shipped with kfray: {', '.join(suite_names())} (kfray tasks SUITE lists one)")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kfray.sweep", description=__doc__.splitlines()[0])
    add_sweep_args(p)
    args = p.parse_args(argv)
    if args.verbose:
        from kfray.cluster import set_verbose

        set_verbose(True)
    try:
        return cmd_sweep(args)
    except KfrayError as e:
        print(f"kfray: error: {e}", file=sys.stderr)
        return 2


