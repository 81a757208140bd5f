"""One search over every task of a sweep, then its tables."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kfray.errors import KfrayError
from kfray.sweep.metrics import add_compile_baseline, budget_report, suite_summary, task_rows
from kfray.sweep.plan import islands_per_task
from kfray.sweep.tables import write_results
def run_sweep(cfg, refs: list[str], run_dir: str | Path | None = None, skipped: dict[str, str] | None = None,
              progress: bool = True, budget_total: int = 0, title: str = "kfray sweep",
              budget_tokens: int = 0, budget_cost: float = 0.0) -> dict[str, Any]:
    """One search over every ref with the config's evaluator pool. Evaluations are per task
    (search.budget) or, given budget_total, split evenly, and shared: a task that can use no more
    of its share (search.share_budget) hands the rest to the others; LLM tokens and cost (budget_tokens /
    budget_cost, else proposer.token_budget / proposer.max_cost) are one budget for all tasks: the
    run's islands share one ledger, and once it is spent every task stops proposing and the sweep
    ends with its table. Returns the run summary plus `sweep`."""
    from kfray.driver import Coordinator, default_run_dir

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
