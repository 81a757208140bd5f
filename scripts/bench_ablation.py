#!/usr/bin/env python3
"""Ablation benchmark: what each search mechanism buys, at equal evaluation budgets.

    python scripts/bench_ablation.py [--seeds 3] [--seed 0] [--budget 30] [--out scripts/results/ablation]

On the built-in tasks (axpb, softmax, matmul) with the CPU backend and the offline proposer, each
variant runs `--seeds` times (search seeds `--seed`, `--seed`+1, ...) with the same budget of
evaluations per task (seed kernels included):

  random       random search: children of the seed kernels only, operators and parameters drawn
               uniformly, no archive feedback (one population, nothing learnt from results)
  ga           one island whose archive is a single cell: a plain elitist GA
  map_elites   one MAP-Elites island (4x4x4 grid), no QD gradient
  islands      `--islands` MAP-Elites islands migrating elites along a ring, no QD gradient
  islands_qd   islands plus the QD gradient (parent sampling, target cells, directives)
  islands_qd_tuner  islands plus QD gradient plus the inner template tuner (eval.tune_budget)

Speedups are over the task's reference, timed once for all runs: per shape, the median of every
reference time any run measured (a reference timed while the machine was busy would otherwise
inflate one run's speedups); and a kernel's time is the median over every run that measured that
kernel (same source and parameters), so that a single noisy measurement does not decide which
search found the faster kernel. Then the contenders (every kernel within 20 % of the best) are timed
again together, `--retime` rounds round-robin, so that the best any variant found, which sets the
target every run is held to, is not the luckiest of many noisy measurements. Per task and variant it reports the best speedup (mean over seeds),
the evaluations needed to reach 95 % of the best speedup any variant found (median over seeds;
"-" where fewer than half the seeds got there), archive coverage and QD score (both over the
common 4x4x4 grid, from every kernel the run evaluated, so a single-cell GA is measured on the
same grid), and the kernel measurements spent (the tuner measures several settings per
evaluation). It writes a table to stdout, `ablation.json` and `ablation.png` (best speedup so far
against evaluations, per task) into `--out`, and the run folders under `--out/runs`.

Reproducible with `--seed`: the same seeds give the same proposals; measured times, and with
them the choices that depend on them, vary with the machine's noise.
"""
from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kfray.config import load_config  # noqa: E402
from kfray.descriptors import describe  # noqa: E402
from kfray.source import source_hash  # noqa: E402

TASKS = ["axpb", "softmax", "matmul"]
QD_OFF = ["search.qd_weight=0", "search.qd_directives=false", "search.target_strategy=mutate"]
QD_ON = ["search.qd_weight=0.3", "search.qd_directives=true", "search.target_strategy=mutate"]
VARIANTS = {
    "random": ["search.islands=1", "search.parents=seeds", "search.near_duplicate=0", "search.migrants=0",
               "eval.tune_budget=0", *QD_OFF],
    "ga": ["search.islands=1", "search.archive=single", "search.migrants=0", "eval.tune_budget=0", *QD_OFF],
    "map_elites": ["search.islands=1", "search.migrants=0", "eval.tune_budget=0", *QD_OFF],
    "islands": ["eval.tune_budget=0", *QD_OFF],
    "islands_qd": ["eval.tune_budget=0", *QD_ON],
    "islands_qd_tuner": [*QD_ON],                     # eval.tune_budget from --tune-budget
}


def run_one(variant: str, seed: int, args, out: Path) -> dict:
    from kfray.driver import run_search

    over = [f"tasks=[{','.join(args.tasks)}]", f"search.budget={args.budget}", f"search.seed={seed}",
            f"search.islands={args.islands}", "search.batch=2", "search.migrate_every=2",
            f"eval.evaluators={args.evaluators}", f"eval.repeats={args.repeats}", f"eval.min_time_s={args.min_time}",
            f"eval.tune_budget={args.tune_budget}", f"eval.cache_dir={out / 'runs' / 'cache'}"]
    cfg = load_config(None, over + VARIANTS[variant])
    run_dir = out / "runs" / f"{variant}-s{seed}"
    if run_dir.exists():
        import shutil
        shutil.rmtree(run_dir)
    t0 = time.time()
    run_search(cfg, run_dir, progress=False)
    return {"variant": variant, "seed": seed, "wall_s": round(time.time() - t0, 1),
            "evals": curves(run_dir / "kfray.db")}


def curves(db_path: Path) -> dict:
    """Per task, in evaluation order: each candidate's tier, per-shape times, the reference times
    its evaluator measured, its cell on the common grid, and the kernel measurements it cost."""
    db = sqlite3.connect(db_path)
    out = {}
    for (task,) in db.execute("SELECT DISTINCT task FROM candidates"):
        evals = []
        for src, lang, params, tier, times, ref_times, facts in db.execute(
                "SELECT source, language, params, tier, times, ref_times, facts FROM candidates WHERE task = ? "
                "ORDER BY created, rowid", (task,)):
            facts = json.loads(facts or "{}")
            evals.append({"key": source_hash(src, json.loads(params or "{}")) if src.strip() else None,
                          "kernel": (src, lang, json.loads(params or "{}")),
                          "tier": tier, "times": json.loads(times or "{}"), "ref": json.loads(ref_times or "{}"),
                          "cell": list(describe(src, lang)) if src.strip() else None,
                          "measured": facts.get("tuning_evaluations", 1) if "tuning" in facts else 1})
        out[task] = evals
    return out


def common_reference(runs: list[dict], task: str) -> dict[str, float]:
    """Per shape, the median reference time over every evaluation of every run: one yardstick for all
    runs, so that a reference timed while the machine was busy does not inflate one run's speedups."""
    per: dict[str, list[float]] = {}
    for r in runs:
        for e in r["evals"][task]:
            for k, v in e["ref"].items():
                if v > 0:
                    per.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in per.items()}


def pooled_times(runs: list[dict], task: str) -> dict:
    """Per kernel (source and parameters), per shape, the median of its times over every run that
    measured it: the seeds and the kernels several runs found are timed many times, so one noisy
    measurement does not decide which search found the faster kernel."""
    per: dict = {}
    for r in runs:
        for e in r["evals"][task]:
            if e["key"] and e["tier"] == 5:
                for k, t in e["times"].items():
                    if t > 0:
                        per.setdefault(e["key"], {}).setdefault(k, []).append(t)
    return {key: {k: statistics.median(v) for k, v in shapes.items()} for key, shapes in per.items()}


def retime(runs: list[dict], tasks: list[str], refs: dict, pooled: dict, rounds: int, args) -> dict:
    """The contenders timed again, together: every kernel within 20 % of the best any run found is
    evaluated `rounds` times, round-robin in one sandbox, and its pooled time per shape becomes the
    common reference time times its median (kernel / reference) ratio over those rounds. Without
    this the "best any variant found" is the maximum of many noisy measurements (the winner's curse),
    and one lucky measurement decides the target every other run is held to."""
    from kfray.candidate import Candidate
    from kfray.config import load_config
    from kfray.eval.evaluator import Evaluator

    cfg = load_config(None, ["eval.tune_budget=0", f"eval.repeats={args.repeats}",
                             f"eval.min_time_s={args.min_time}", "eval.cache_dir=" + str(Path(args.out) / "runs" / "cache")])
    ev = Evaluator("cpu", cfg.eval, name="retime")
    report = {}
    try:
        for t in tasks:
            kernels = {e["key"]: e["kernel"] for r in runs for e in r["evals"][t] if e["key"] in pooled[t]}
            score = {k: speedup({"tier": 5, "times": pooled[t][k], "key": k}, refs[t]) for k in kernels}
            top = max(score.values(), default=0.0)
            picked = sorted((k for k in kernels if score[k] >= 0.8 * top), key=lambda k: -score[k])
            ratios: dict = {k: {} for k in picked}
            for _ in range(rounds):
                for k in picked:
                    src, lang, params = kernels[k]
                    res = ev.evaluate(Candidate(task=t, language=lang, source=src, params=params), t, tune=False)
                    if res["tier"] != 5:
                        continue
                    for shape, tk in res["times"].items():
                        tr = res["ref_times"].get(shape, 0.0)
                        if tk > 0 and tr > 0:
                            ratios[k].setdefault(shape, []).append(tk / tr)
            before = {k: round(score[k], 4) for k in picked}
            for k, per in ratios.items():
                if per:
                    pooled[t][k] = {shape: refs[t][shape] * statistics.median(v) for shape, v in per.items()
                                    if shape in refs[t]}
            after = {k: round(speedup({"tier": 5, "times": pooled[t][k], "key": k}, refs[t]), 4) for k in picked}
            report[t] = {"kernels": len(picked), "rounds": rounds,
                         "best_before": max(before.values(), default=0.0), "best_after": max(after.values(), default=0.0)}
            print(f"re-timed {t}: {len(picked)} kernels x {rounds}: best {report[t]['best_before']:.3f}x -> "
                  f"{report[t]['best_after']:.3f}x", flush=True)
    finally:
        ev.shutdown()
    return report


def speedup(e: dict, ref: dict[str, float], pooled: dict | None = None) -> float:
    if e["tier"] != 5 or not e["times"]:
        return 0.0
    times = (pooled or {}).get(e["key"]) or e["times"]
    logs = [math.log(ref[k] / t) for k, t in times.items() if t > 0 and k in ref]
    return math.exp(sum(logs) / len(logs)) if logs else 0.0


def summarise(evals: list[dict], ref: dict[str, float], pooled: dict | None = None) -> dict:
    """Best speedup so far after each evaluation; coverage and QD score on the common 4x4x4 grid."""
    best, curve, cells = 0.0, [], {}
    for e in evals:
        s = speedup(e, ref, pooled)
        best = max(best, s)
        curve.append(best)
        if e["cell"] is not None:
            c = tuple(e["cell"])
            cells[c] = max(cells.get(c, 0.0), e["tier"] + s)
    return {"curve": curve, "coverage": len(cells) / 64, "qd_score": sum(cells.values()),
            "measured": sum(e["measured"] for e in evals)}


def _finished(db: Path) -> bool:
    row = sqlite3.connect(db).execute("SELECT value FROM meta WHERE key = 'status'").fetchone()
    return bool(row) and json.loads(row[0]) == "finished"


def evals_to(curve: list[float], target: float) -> int | None:
    for i, b in enumerate(curve):
        if b >= target:
            return i + 1
    return None


def analyse(runs: list[dict], tasks: list[str], budget: int, args=None) -> dict:
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    refs = {t: common_reference(runs, t) for t in tasks}
    pooled = {t: pooled_times(runs, t) for t in tasks}
    retimed = retime(runs, tasks, refs, pooled, args.retime, args) if args is not None and args.retime > 0 else {}
    for r in runs:
        r["curves"] = {t: summarise(r["evals"][t], refs[t], pooled[t]) for t in tasks}
    best_any = {t: max(max(r["curves"][t]["curve"] or [0.0]) for r in runs) for t in tasks}
    table = {}
    for t in tasks:
        target = 0.95 * best_any[t]
        for v in variants:
            rs = [r for r in runs if r["variant"] == v]
            finals = [max(r["curves"][t]["curve"] or [0.0]) for r in rs]
            hits = [evals_to(r["curves"][t]["curve"], target) for r in rs]
            # median over seeds, a miss counting as more than the budget
            ranked = sorted(h if h is not None else math.inf for h in hits)
            med = ranked[len(ranked) // 2] if len(ranked) % 2 else (ranked[len(ranked) // 2 - 1] + ranked[len(ranked) // 2]) / 2
            table.setdefault(t, {})[v] = {
                "best_speedup_mean": round(statistics.mean(finals), 4),
                "best_speedup_max": round(max(finals), 4),
                "evals_to_95": None if math.isinf(med) else med,
                "evals_to_95_per_seed": hits,
                "reached_95": sum(h is not None for h in hits),
                "coverage_mean": round(statistics.mean(r["curves"][t]["coverage"] for r in rs), 4),
                "qd_score_mean": round(statistics.mean(r["curves"][t]["qd_score"] for r in rs), 3),
                "measured_mean": round(statistics.mean(r["curves"][t]["measured"] for r in rs), 1),
            }
    check = {}
    for t in tasks:
        isl, rnd = table[t].get("islands"), table[t].get("random")
        if isl and rnd:
            a = isl["evals_to_95"] if isl["evals_to_95"] is not None else math.inf
            b = rnd["evals_to_95"] if rnd["evals_to_95"] is not None else math.inf
            # fewer evaluations, or the same median but more seeds reaching it
            check[t] = a < b or (a == b and isl["reached_95"] > rnd["reached_95"])
    return {"best_any": best_any, "table": table, "islands_beat_random": check,
            "islands_beat_random_on": sum(check.values()), "budget": budget, "reference_times": refs,
            "retimed": retimed}


def print_table(res: dict) -> str:
    lines = []
    head = f"{'task':8} {'variant':17} {'best x (mean/max)':>18} {'evals to 95%':>13} {'reached':>8} " \
           f"{'coverage':>9} {'QD score':>9} {'measured':>9}"
    lines += [head, "-" * len(head)]
    for t, rows in res["table"].items():
        for v, r in rows.items():
            e = "-" if r["evals_to_95"] is None else f"{r['evals_to_95']:g}"
            lines.append(f"{t:8} {v:17} {r['best_speedup_mean']:>9.3f}/{r['best_speedup_max']:<8.3f} {e:>13} "
                         f"{r['reached_95']:>6}/{len(r['evals_to_95_per_seed'])} {r['coverage_mean']:>9.3f} "
                         f"{r['qd_score_mean']:>9.2f} {r['measured_mean']:>9.1f}")
        rt = res.get("retimed", {}).get(t)
        lines.append(f"{t:8} 95% target: {0.95 * res['best_any'][t]:.3f}x (best any variant {res['best_any'][t]:.3f}x"
                     + (f"; {rt['kernels']} contenders re-timed {rt['rounds']}x, best {rt['best_before']:.3f}x"
                        f" before" if rt else "") + ")")
    lines.append(f"islands with migration reach 95% in fewer evaluations than random search on "
                 f"{res['islands_beat_random_on']} of {len(res['islands_beat_random'])} tasks: "
                 + ", ".join(f"{t}: {'yes' if ok else 'no'}" for t, ok in res["islands_beat_random"].items()))
    return "\n".join(lines)


def plot(runs: list[dict], res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(res["table"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 4.2), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        for v in res["table"][t]:
            cs = [r["curves"][t]["curve"] for r in runs if r["variant"] == v]
            n = max(len(c) for c in cs)
            mean = [statistics.mean(c[min(i, len(c) - 1)] for c in cs) for i in range(n)]
            ax.plot(range(1, n + 1), mean, label=v)
        ax.axhline(0.95 * res["best_any"][t], color="grey", ls="--", lw=0.8, label="95% of best")
        ax.set_title(t)
        ax.set_xlabel("evaluations")
        ax.set_ylabel("best speedup so far (mean over seeds)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="runs per variant")
    ap.add_argument("--seed", type=int, default=0, help="first search seed")
    ap.add_argument("--budget", type=int, default=60, help="evaluations per task, seed kernels included")
    ap.add_argument("--islands", type=int, default=4, help="islands of the island variants")
    ap.add_argument("--evaluators", type=int, default=2)
    ap.add_argument("--tune-budget", type=int, default=3, help="eval.tune_budget of the tuner variant")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.01)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default="scripts/results/ablation")
    ap.add_argument("--retime", type=int, default=5,
                    help="rounds of re-timing the contending kernels together before the analysis (0: off)")
    ap.add_argument("--analyse-only", action="store_true", help="re-read the run folders under --out/runs")
    args = ap.parse_args()
    args.tasks = [t for t in args.tasks.split(",") if t]
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        for v in variants:
            if args.analyse_only:
                db = out / "runs" / f"{v}-s{seed}" / "kfray.db"
                if db.exists() and _finished(db):
                    runs.append({"variant": v, "seed": seed, "wall_s": None, "evals": curves(db)})
                continue
            r = run_one(v, seed, args, out)
            runs.append(r)
            own = {t: summarise(r["evals"][t], common_reference([r], t)) for t in args.tasks}
            print(f"[{time.time() - t0:6.0f} s] {v:17} seed {seed}: " + ", ".join(
                f"{t} {max(own[t]['curve'] or [0]):.3f}x" for t in args.tasks) + f"  ({r['wall_s']} s)",
                flush=True)
    if not runs:
        ap.error(f"no runs under {out / 'runs'}")
    res = analyse(runs, args.tasks, args.budget, args)
    res.update({"args": {k: v for k, v in vars(args).items()}, "variants": {v: VARIANTS[v] for v in variants},
                "wall_s": round(time.time() - t0, 1) if not args.analyse_only else None,
                "runs": [{k: r[k] for k in ("variant", "seed", "wall_s")} for r in runs]})
    text = print_table(res)
    print(text)
    (out / "ablation.json").write_text(json.dumps({**res, "curves": [
        {"variant": r["variant"], "seed": r["seed"], **{t: r["curves"][t] for t in args.tasks}} for r in runs]},
        indent=1))
    (out / "ablation.txt").write_text(text + "\n")
    plot(runs, res, out / "ablation.png")
    print(f"wrote {out / 'ablation.json'}, {out / 'ablation.txt'}, {out / 'ablation.png'}"
          + (f" ({res['wall_s']:.0f} s)" if res["wall_s"] else ""))
    if not args.analyse_only:
        import ray
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
