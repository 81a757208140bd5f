"""The field's sweep figures: fast_p, the geometric-mean speedup of correct kernels, per-task rows
from a run summary (with torch.compile and the suite's own statistic beside eager), and what the
shared budget spent."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

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
    """One row per task from a run summary (kfray.driver), plus tasks that could not run."""
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
