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

from kfray.sweep.cli import add_sweep_args, add_tasks_args, add_verbose_arg, cmd_sweep, cmd_tasks, main, reason_key
from kfray.sweep.metrics import (PS, add_compile_baseline, budget_report, fast_p, geomean_speedup, suite_summary,
                                 task_rows)
from kfray.sweep.plan import flags_of, islands_per_task, plan, select, split_flagged
from kfray.sweep.run import run_sweep
from kfray.sweep.tables import markdown, write_csv, write_results

__all__ = ["PS", "add_compile_baseline", "add_sweep_args", "add_tasks_args", "add_verbose_arg", "budget_report", "cmd_sweep",
           "cmd_tasks", "fast_p", "flags_of", "geomean_speedup", "islands_per_task", "main", "markdown", "plan",
           "reason_key", "run_sweep", "select", "split_flagged", "suite_summary", "task_rows", "write_csv",
           "write_results"]
