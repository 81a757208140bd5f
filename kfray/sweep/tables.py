"""A sweep's results as CSV, Markdown and JSON in the run folder."""
from __future__ import annotations

import csv
import json
from pathlib import Path

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


