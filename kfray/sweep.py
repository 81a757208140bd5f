"""Sweeps: one search over many tasks at once (a suite, a folder of task packages, a KernelBench
level, robust-kbench tasks) with one shared evaluator pool and one shared budget, then the table
the field reports: per task correct / best speedup over eager PyTorch and over torch.compile, and
for the suite fast_p and the geometric-mean speedup of the correct kernels against each baseline,
written as CSV, Markdown and JSON into the run folder with what the shared budget spent.

    python -m kfray.sweep llama32-1b --set proposer.kind=llm
    python -m kfray.sweep path/to/KernelBench --level 1 --tasks 1_,19_ --budget-total 400 --budget-tokens 2000000
    python -m kfray.sweep tests/data/packages

`cmd_sweep` / `cmd_tasks` are the bodies of `kfray sweep` / `kfray tasks`.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Iterable

from kfray.errors import KfrayError
from kfray.tasks.suite_spec import RKB_MODES

PS = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)      # KernelBench's fast_p thresholds


# --- the numbers -------------------------------------------------------------------------------
def fast_p(results: Iterable[dict], ps: Iterable[float] = PS) -> dict[float, float]:
    """Fraction of tasks whose best kernel is correct AND faster than the reference by more than p
    (KernelBench's fast_p; p = 0 is the fraction correct). `results`: dicts with `correct` (bool)
    and `speedup` (best speedup over the reference). Every result counts in the denominator."""
    rows = list(results)
    out = {}
    for p in ps:
        if not rows:
            out[float(p)] = 0.0
            continue
        hits = sum(1 for r in rows if r.get("correct") and (p <= 0 or float(r.get("speedup") or 0.0) > p))
        out[float(p)] = hits / len(rows)
    return out


def geomean_speedup(results: Iterable[dict]) -> float:
    """Geometric mean of the speedups of the correct kernels (0 when none is correct)."""
    sp = [float(r["speedup"]) for r in results if r.get("correct") and float(r.get("speedup") or 0) > 0]
    return math.exp(sum(math.log(s) for s in sp) / len(sp)) if sp else 0.0


def task_rows(summary: dict, skipped: dict[str, str] | None = None) -> list[dict]:
    """One row per task from a run summary (kfray.run), plus tasks that could not run."""
    rows = []
    for ref, s in summary.get("tasks", {}).items():
        rows.append({
            "task": ref, "status": "ok" if s.get("correct") else "no correct kernel",
            "correct": bool(s.get("correct")),
            "speedup": float(s.get("best_speedup_vs_reference") or 0.0),
            "speedup_compile": ((s.get("suite") or {}).get("speedup_compile") if s.get("suite")
                                else s.get("best_speedup_vs_compile")),
            "compile_note": s.get("compile_note") or "",
            "speedup_vs_seed": float(s.get("best_speedup_vs_seed") or 0.0),
            "evaluated": int(s.get("evaluated", 0)), "correct_count": int(s.get("correct_count", 0)),
            "best_candidate": s.get("best_candidate") or "",
            **({"suite_speedup": float((s.get("suite") or {}).get("speedup") or 0.0),
                "suite": (s.get("suite") or {}).get("name", "")} if s.get("suite") else {}),
        })
    for ref, why in (skipped or {}).items():
        rows.append({"task": ref, "status": f"skipped: {why}", "correct": False, "speedup": 0.0,
                     "speedup_compile": None, "compile_note": "", "speedup_vs_seed": 0.0, "evaluated": 0,
                     "correct_count": 0, "best_candidate": ""})
    return rows


def add_compile_baseline(summary: dict, run_dir: str | Path) -> None:
    """Per task, the best speedup over torch.compile (`best_speedup_vs_compile`) or why there is
    none (`compile_note`), from the results in the run database: with `eval.torch_compile` every
    correct result of a PyTorch task carries its evaluator's compiled-reference times."""
    from kfray.eval.torch_compile import speedup_vs_compile
    from kfray.store import Store

    db = Path(run_dir) / "kfray.db"
    if not db.is_file():
        return
    store = Store(db)
    try:
        for ref, s in summary.get("tasks", {}).items():
            best, notes = None, set()
            for _, r in store.evaluated(ref):
                if not r.correct:
                    continue
                sp, why = speedup_vs_compile(r)
                if sp is not None:
                    best = sp if best is None else max(best, sp)
                elif why:
                    notes.add(why)
            if best is not None:
                s["best_speedup_vs_compile"] = round(best, 4)
            elif notes:
                s["compile_note"] = "; ".join(sorted(notes))
    finally:
        store.close()


def budget_report(cfg, summary: dict) -> dict[str, Any]:
    """What the sweep spent of its shared budgets: evaluations, LLM tokens and cost (all tasks
    together), and which limit, if any, stopped it."""
    from kfray.proposers.models import totals

    used = totals(summary.get("llm") or {})
    p = cfg.proposer
    out: dict[str, Any] = {"evaluations": int(summary.get("evaluated", 0)),
                           "evaluation_budget": cfg.search.budget * len(summary.get("tasks", {})),
                           "tokens": int(used["tokens"]), "token_budget": int(p.token_budget),
                           "cost": round(float(used["cost"]), 6), "cost_budget": float(p.max_cost),
                           "llm_calls": int(used["calls"])}
    stopped = [what for what, hit in (("token", p.token_budget > 0 and used["tokens"] >= p.token_budget),
                                      ("cost", p.max_cost > 0 and used["cost"] >= p.max_cost)) if hit]
    out["stopped_by"] = " and ".join(f"{w} budget" for w in stopped)
    return out


def suite_summary(rows: list[dict], ps: Iterable[float] = PS) -> dict[str, Any]:
    fp = fast_p(rows, ps)
    out = {"tasks": len(rows), "correct": sum(1 for r in rows if r["correct"]),
           "fast_p": {f"{p:g}": v for p, v in fp.items()}, "geomean_speedup": geomean_speedup(rows)}
    if any(r.get("suite_speedup") is not None for r in rows):     # the suite's own statistic, beside kfray's
        way = [{"correct": r["correct"], "speedup": r.get("suite_speedup") or 0.0} for r in rows]
        out["suite"] = next((r["suite"] for r in rows if r.get("suite")), "")
        out["fast_p_suite"] = {f"{p:g}": v for p, v in fast_p(way, ps).items()}
        out["geomean_speedup_suite"] = geomean_speedup(way)
    if any(r.get("speedup_compile") is not None for r in rows):
        comp = [{"correct": r["correct"], "speedup": r.get("speedup_compile") or 0.0} for r in rows]
        out["fast_p_compile"] = {f"{p:g}": v for p, v in fast_p(comp, ps).items()}
        out["geomean_speedup_compile"] = geomean_speedup(comp)
    return out


# --- writers -----------------------------------------------------------------------------------
def _columns(rows: list[dict]) -> list[str]:
    cols = ["task", "status", "correct"] + (["suite_speedup"] if any("suite_speedup" in r for r in rows) else []) + \
        ["speedup"]
    if any(r.get("speedup_compile") is not None or r.get("compile_note") for r in rows):
        cols.append("speedup_compile")
    cols += ["speedup_vs_seed", "evaluated", "correct_count", "best_candidate"]
    return cols + (["compile_note"] if any(r.get("compile_note") for r in rows) else [])


def write_csv(rows: list[dict], suite: dict, run_dir: Path) -> tuple[Path, Path]:
    run_dir.mkdir(parents=True, exist_ok=True)
    cols = _columns(rows)
    tpath = run_dir / "sweep_tasks.csv"
    with tpath.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.4f}" if isinstance(r.get(k), float) else r.get(k)) for k in cols})
    spath = run_dir / "sweep_fast_p.csv"
    with spath.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["metric", "baseline", "value"])
        for p, v in suite["fast_p"].items():
            w.writerow([f"fast_{p}", "eager", f"{v:.4f}"])
        for p, v in suite.get("fast_p_compile", {}).items():
            w.writerow([f"fast_{p}", "torch.compile", f"{v:.4f}"])
        for p, v in suite.get("fast_p_suite", {}).items():
            w.writerow([f"fast_{p}", f"eager, {suite['suite']}'s statistic", f"{v:.4f}"])
        w.writerow(["geomean_speedup_correct", "eager", f"{suite['geomean_speedup']:.4f}"])
        if "geomean_speedup_compile" in suite:
            w.writerow(["geomean_speedup_correct", "torch.compile", f"{suite['geomean_speedup_compile']:.4f}"])
    return tpath, spath


def markdown(rows: list[dict], suite: dict, title: str = "kfray sweep", budget: dict | None = None) -> str:
    cols = [c for c in _columns(rows) if c != "compile_note"]     # notes go below the table
    way = suite.get("suite") or "the suite"
    head = {"task": "task", "status": "status", "correct": "correct", "speedup": "speedup vs reference (eager), kfray's way",
            "suite_speedup": f"speedup vs eager, {way}'s way",
            "speedup_compile": "speedup vs torch.compile", "speedup_vs_seed": "speedup vs seed",
            "evaluated": "evaluated", "correct_count": "correct candidates", "best_candidate": "best candidate"}

    def cell(r, k):
        v = r.get(k)
        if k == "speedup_compile" and r["correct"] and v is None:
            return "n/a"
        if k in ("speedup", "speedup_compile", "speedup_vs_seed", "suite_speedup"):
            return f"{v:.2f}x" if r["correct"] and v else "-"
        if k == "correct":
            return "yes" if v else "no"
        return str(v if v is not None else "").replace("|", "\\|")

    lines = [f"# {title}", "", "| " + " | ".join(head[c] for c in cols) + " |",
             "|" + "|".join("---" if c in ("task", "status", "best_candidate") else "---:" for c in cols) + "|"]
    lines += ["| " + " | ".join(cell(r, c) for c in cols) + " |" for r in rows]
    notes = [f"- {r['task']}: {r['compile_note']}" for r in rows if r.get("compile_note")]
    if notes:
        lines += ["", "torch.compile n/a:"] + notes
    if budget:
        lines += ["", _budget_line(budget)]
    sw = "fast_p_suite" in suite
    lines += ["", f"Suite: {suite['tasks']} tasks, {suite['correct']} correct.", "",
              "| metric |" + (f" vs eager, {way}'s way |" if sw else "") + " vs eager, kfray's way |"
              + (" vs torch.compile |" if "fast_p_compile" in suite else ""),
              "|---|" + ("---:|" if sw else "") + "---:|" + ("---:|" if "fast_p_compile" in suite else "")]
    for p, v in suite["fast_p"].items():
        first = f" {suite['fast_p_suite'][p]:.3f} |" if sw else ""
        comp = f" {suite['fast_p_compile'][p]:.3f} |" if "fast_p_compile" in suite else ""
        lines.append(f"| fast_{p} |{first} {v:.3f} |{comp}")
    first = f" {suite['geomean_speedup_suite']:.3f}x |" if sw else ""
    comp = f" {suite['geomean_speedup_compile']:.3f}x |" if "geomean_speedup_compile" in suite else ""
    lines.append(f"| geomean speedup (correct) |{first} {suite['geomean_speedup']:.3f}x |{comp}")
    return "\n".join(lines) + "\n"


def _budget_line(b: dict) -> str:
    of = f" of {b['evaluation_budget']}" if b.get("evaluation_budget") else ""
    parts = [f"{b['evaluations']} evaluations{of}"]
    if b.get("llm_calls") or b.get("token_budget") or b.get("cost_budget"):
        parts.append(f"{b['tokens']} LLM tokens" + (f" of {b['token_budget']}" if b.get("token_budget") else ""))
        parts.append(f"cost {b['cost']:.4f}" + (f" of {b['cost_budget']:g}" if b.get("cost_budget") else ""))
    stop = f"; stopped: {b['stopped_by']} spent" if b.get("stopped_by") else ""
    return "Budget (shared by all tasks): " + ", ".join(parts) + stop + "."


def write_results(rows: list[dict], suite: dict, run_dir: Path, title: str = "kfray sweep",
                  budget: dict | None = None) -> dict[str, str]:
    run_dir = Path(run_dir)
    tpath, spath = write_csv(rows, suite, run_dir)
    md = run_dir / "sweep.md"
    md.write_text(markdown(rows, suite, title, budget))
    js = run_dir / "sweep.json"
    js.write_text(json.dumps({"tasks": rows, "suite": suite, **({"budget": budget} if budget else {})}, indent=2))
    return {"tasks_csv": str(tpath), "fast_p_csv": str(spath), "markdown": str(md), "json": str(js)}


# --- running -----------------------------------------------------------------------------------
def select(refs: list[str], wanted: str | None) -> list[str]:
    """Keep refs whose last path component (or name) starts with or equals one of the comma list."""
    if not wanted:
        return refs
    keys = [w.strip() for w in wanted.split(",") if w.strip()]

    def base(ref: str) -> str:
        tail = ref.split(":", 1)[-1].rstrip("/")
        return Path(tail.split("#")[0]).stem if "/" in tail or "." in tail else tail

    out = [r for r in refs if any(base(r) == k or base(r).startswith(k) or r == k for k in keys)]
    if not out:
        raise KfrayError(f"--tasks {wanted}: matches none of the {len(refs)} tasks "
                         f"(e.g. {', '.join(base(r) for r in refs[:5])})")
    return out


def plan(spec: str | None, level: int | None, wanted: str | None, language: str, offline: bool,
         rkb_mode: str = ""):
    """(runnable refs, {ref: why skipped}) for a sweep."""
    from kfray.tasks import discover, load_task

    found = discover(spec, level, rkb_mode)
    found = [(r, e) for r, e in found if r in select([x for x, _ in found], wanted)]
    runnable, skipped = [], {}
    for ref, err in found:
        if err:
            skipped[ref] = err
            continue
        t = load_task(ref)
        suite = getattr(t, "suite", None)
        if language != "suite" and suite is not None and suite.functional_error:
            skipped[ref] = (f"kf_forward kernels cannot take it: {suite.functional_error} (the suite's own form "
                            "can: eval.backend=torch_ext_cpu or torch_ext_cuda)")
            continue
        if offline and not t.seeds_for(language):
            skipped[ref] = f"no {language} seed kernel, and the offline proposer needs one (use proposer.kind=llm)"
            continue
        runnable.append(ref)
    return runnable, skipped


def flags_of(ref: str) -> tuple[str, ...]:
    """The suite's own filter flags that are true for a loaded task (robust-kbench's filter_results.json)."""
    from kfray.tasks import load_task

    suite = getattr(load_task(ref), "suite", None)
    return tuple(getattr(suite, "flagged", ()) or ())


def split_flagged(refs: list[str]) -> tuple[list[str], dict[str, str]]:
    """(refs to run, {ref: why left out}) without the tasks the suite itself flags as degenerate
    (constant outputs, inputs without effect...): they are not part of its benchmark, so a sweep
    leaves them out of its table rather than counting them as failures."""
    kept, flagged = [], {}
    for ref in refs:
        flags = flags_of(ref)
        if flags:
            flagged[ref] = f"flagged by the suite's {', '.join(flags)}"
        else:
            kept.append(ref)
    return kept, flagged


def islands_per_task(wanted: int, tasks: int, max_actors: int) -> int:
    """Islands per task in a sweep: each island is a Ray actor process that loads its task (for a
    PyTorch task, torch itself), so a suite of hundreds of tasks gets fewer islands per task rather
    than hundreds of processes; never fewer than one."""
    return max(1, min(wanted, max_actors // max(1, tasks)))


def run_sweep(cfg, refs: list[str], run_dir: str | Path | None = None, skipped: dict[str, str] | None = None,
              progress: bool = True, budget_total: int = 0, title: str = "kfray sweep",
              budget_tokens: int = 0, budget_cost: float = 0.0) -> dict[str, Any]:
    """One search over every ref with the config's evaluator pool. Evaluations are per task
    (search.budget) or, given budget_total, split evenly, and shared: a task that can use no more
    of its share (search.share_budget) hands the rest to the others; LLM tokens and cost (budget_tokens /
    budget_cost, else proposer.token_budget / proposer.max_cost) are one budget for all tasks: the
    run's islands share one ledger, and once it is spent every task stops proposing and the sweep
    ends with its table. Returns the run summary plus `sweep`."""
    from kfray.run import Coordinator, default_run_dir

    if not refs:
        raise KfrayError("nothing to sweep: no task could be loaded"
                         + ("".join(f"\n  {r}: {w}" for r, w in (skipped or {}).items())))
    cfg.tasks = list(refs)
    cfg.search.share_budget = True
    fit = islands_per_task(cfg.search.islands, len(refs), cfg.search.max_island_actors)
    if fit < cfg.search.islands:
        print(f"kfray: {len(refs)} tasks: {fit} island(s) per task, not {cfg.search.islands} "
              f"(search.max_island_actors {cfg.search.max_island_actors})", file=sys.stderr)
        cfg.search.islands = fit
    if budget_total:
        per = budget_total // len(refs)
        if per < 1:
            raise KfrayError(f"--budget-total {budget_total} is less than one evaluation per task ({len(refs)} tasks)")
        cfg.search.budget = per
    if budget_tokens:
        cfg.proposer.token_budget = int(budget_tokens)
    if budget_cost:
        cfg.proposer.max_cost = float(budget_cost)
    run_dir = Path(run_dir or cfg.run_dir or default_run_dir())
    summary = Coordinator(cfg, run_dir, progress).run()
    add_compile_baseline(summary, run_dir)
    rows = task_rows(summary, skipped)
    suite = suite_summary(rows)
    budget = budget_report(cfg, summary)
    files = write_results(rows, suite, run_dir, title, budget)
    summary["sweep"] = {"rows": rows, "suite": suite, "budget": budget, "files": files}
    return summary


# --- commands ----------------------------------------------------------------------------------
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
    from kfray.run import language_of

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
    for ref, why in skipped.items():
        print(f"kfray: skipping {ref}: {why}", file=sys.stderr)
    if not getattr(args, "include_flagged", False):
        refs, flagged = split_flagged(refs)
        if flagged:
            print(f"kfray: skipping {len(flagged)} task(s) the suite itself flags as degenerate "
                  f"(filter_results.json; --include-flagged runs them): "
                  + "; ".join(f"{r}: {w}" for r, w in flagged.items()), file=sys.stderr)
    from kfray.cli import preflight_llm
    preflight_llm(cfg.proposer)
    summary = run_sweep(cfg, refs, args.run_dir, skipped, progress=not args.quiet,
                        budget_total=args.budget_total, title=f"kfray sweep: {args.suite}",
                        budget_tokens=args.budget_tokens, budget_cost=args.budget_cost)
    print_summary(summary)
    sw = summary["sweep"]
    print(markdown(sw["rows"], sw["suite"], f"kfray sweep: {args.suite}", sw["budget"]))
    print(f"run folder: {summary['run_dir']} (sweep.md, sweep_tasks.csv, sweep_fast_p.csv, summary.json)")
    return 0


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
    try:
        return cmd_sweep(args)
    except KfrayError as e:
        print(f"kfray: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
