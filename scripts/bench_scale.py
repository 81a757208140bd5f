#!/usr/bin/env python3
"""Engine scaling benchmark: search throughput with 1..16 simulated evaluators, and the engine's
own cost per candidate, then a model of coordinator and database load at 1,000 GPUs.

    python scripts/bench_scale.py [--sim 0.2] [--counts 1,2,4,8,16] [--out bench_scale.json]

Evaluators use the `sim` backend: each evaluation takes a fixed time (`--sim` seconds) and returns
a synthetic timing, so the figures measure kfray (islands, queue, archive, store), not a compiler.
"""
from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402

from kfray.candidate import Candidate, EvalResult  # noqa: E402
from kfray.config import load_config  # noqa: E402
from kfray.proposers.base import Elite, ProposalContext  # noqa: E402
from kfray.driver import run_search  # noqa: E402


def sim_task(work: Path) -> str:
    """A tiny task package whose seed has 20^3 parameter settings, so the offline proposer never runs
    out of new candidates however many evaluators there are (the built-ins have a few dozen)."""
    pkg = work / "simtask"
    (pkg / "seeds").mkdir(parents=True, exist_ok=True)
    (pkg / "task.yaml").write_text(
        "name: simscale\ndescription: y = alpha * x (engine benchmark)\nlanguages: [cpp]\nargs:\n"
        "  - {name: x, dtype: float32, shape: [n]}\n  - {name: y, dtype: float32, shape: [n], role: out}\n"
        "  - {name: alpha, dtype: float32}\n  - {name: n, dtype: int64, value: n}\n"
        "shapes:\n  n4k: {n: 4096}\nrtol: 1.0e-5\natol: 1.0e-6\nbytes: 8 * n\nflops: n\n")
    (pkg / "reference.py").write_text('def reference(args):\n    return {"y": args["alpha"] * args["x"]}\n')
    vals = ", ".join(str(v) for v in range(1, 21))
    (pkg / "seeds" / "cpp_naive.cpp").write_text(
        f"#include <cstdint>\n// @kf.param A in [{vals}]\n// @kf.param B in [{vals}]\n// @kf.param C in [{vals}]\n"
        'extern "C" int kf_forward(const float* x, float* y, float alpha, int64_t n) {\n'
        "    for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i];\n    return 0;\n}\n")
    return str(pkg)


def throughput(n: int, sim: float, per_evaluator: int, work: Path) -> dict:
    islands = max(2, n)
    cfg = load_config(None, [f"tasks=[{sim_task(work)}]", "eval.backend=sim", f"eval.simulate_s={sim}",
                             f"eval.evaluators={n}", "eval.num_cpus=0", "eval.trials=1", "eval.repeats=2",
                             "eval.min_time_s=0", "eval.tune_budget=0", f"search.islands={islands}", "search.batch=3",
                             f"search.budget={per_evaluator * n + 3}", "search.migrate_every=3"])
    t0 = time.process_time()
    summary = run_search(cfg, work / f"n{n}", progress=False)
    driver_cpu = time.process_time() - t0
    db = sqlite3.connect(work / f"n{n}" / "kfray.db")
    times = [t for (t,) in db.execute("SELECT created FROM candidates WHERE island >= 0 ORDER BY created")]
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    # Steady state: the middle 80 % of completions, without the ramp (actors starting, islands
    # filling the queue) and the drain (the last evaluations finishing after the budget is spent).
    lo, hi = int(0.1 * len(times)), int(0.9 * len(times))
    steady = (hi - lo) / (times[hi] - times[lo]) if hi > lo and times[hi] > times[lo] else rate
    ideal = n / sim
    return {"evaluators": n, "candidates": summary["evaluated"], "per_s": rate, "steady_per_s": steady,
            "ideal_per_s": ideal, "efficiency": rate / ideal, "steady_efficiency": steady / ideal,
            "driver_cpu_ms_per_candidate": 1e3 * driver_cpu / summary["evaluated"],
            "wall_s": summary["wall_seconds"]}


def _timeit(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def overhead(work: Path) -> dict:
    """Milliseconds per candidate for each piece of engine work, measured in this process."""
    from kfray.prompts.builder import build_messages
    from kfray.proposers.offline import OfflineProposer
    from kfray.search.archive import Archive
    from kfray.descriptors import describe
    from kfray.search.sampling import select_inspirations, select_parent, target_cell
    from kfray.source import parse_params, source_hash
    from kfray.store import Store
    from kfray.tasks import load_task

    task = load_task("matmul")
    rng = random.Random(0)
    arch = Archive()
    elites = []
    for s in task.seeds_for("cpp"):
        c = Candidate(task="matmul", language="cpp", source=s.source, params=parse_params(s.source).default())
        c.cell = describe(c.source, "cpp")
        r = EvalResult(candidate_id=c.id, tier=5, times={"a": 1e-3}, ref_times={"a": 1e-3 * rng.uniform(0.5, 2)})
        arch.insert(c, r)
        elites.append(Elite(c, r))
    parent = elites[-1]
    ctx = ProposalContext(task=task, language="cpp", parent=parent, inspirations=elites[:2], target_cell=(1, 1, 1),
                          meta_prompt=None, device_facts={"name": "x"}, island=0, generation=1)
    prop = OfflineProposer()
    child = prop.propose(ctx, rng)
    child.cell = describe(child.source, "cpp")
    res = EvalResult(candidate_id=child.id, tier=5, times={"a": 1e-3}, ref_times={"a": 1e-3})
    store = Store(work / "overhead.db")
    out = {
        "sampling (parent, inspirations, target)": _timeit(lambda: (select_parent(arch, rng, .2, .7, .1),
                                                                  select_inspirations(arch, parent, 2, rng),
                                                                  target_cell(arch, parent, rng)), 2000),
        "offline proposal (incl. descriptors)": _timeit(lambda: prop.propose(ctx, rng), 200),
        "LLM prompt building": _timeit(lambda: build_messages(ctx), 500),
        "descriptors + dedupe hash": _timeit(lambda: (describe(child.source, "cpp"),
                                                      source_hash(child.source, child.params)), 500),
        "archive insert": _timeit(lambda: arch.insert(child, res), 5000),
        "store write (1 row, own transaction)": _timeit(lambda: store.add_candidates(
            [(Candidate(**{**child.to_dict(), "id": Candidate(task="", language="", source="").id,
                           "cell": tuple(child.cell)}), res, None)]), 300),
    }
    rows = [(Candidate(**{**child.to_dict(), "id": f"b{i}", "cell": tuple(child.cell)}), res, None) for i in range(1000)]
    t0 = time.perf_counter()
    store.add_candidates(rows)
    out["store write (batched, per row)"] = (time.perf_counter() - t0) / len(rows) * 1e3

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self, x):
            return x

    e = Echo.remote()
    payload = {"c": child.to_dict(), "r": res.to_dict()}
    ray.get(e.ping.remote(payload))
    out["Ray actor round trip with a candidate"] = _timeit(lambda: ray.get(e.ping.remote(payload)), 300)
    ray.kill(e)
    store.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", type=float, default=0.2, help="seconds per simulated evaluation")
    ap.add_argument("--counts", default="1,2,4,8,16")
    ap.add_argument("--per-evaluator", type=int, default=60, help="candidates per evaluator in each run")
    ap.add_argument("--out", default="bench_scale.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kfray-bench-scale-"))
    counts = [int(c) for c in args.counts.split(",")]
    ray.init(num_cpus=max(counts) + 2, include_dashboard=False, log_to_driver=False, configure_logging=False)

    rows = [throughput(n, args.sim, args.per_evaluator, work) for n in counts]
    costs = overhead(work)
    engine_ms = sum(v for k, v in costs.items() if k not in ("store write (1 row, own transaction)",
                                                               "LLM prompt building"))

    print(f"\nthroughput with simulated evaluators ({args.sim * 1e3:.0f} ms per evaluation)")
    print(f"{'evaluators':>10s} {'cands':>6s} {'per s':>7s} {'steady':>7s} {'ideal':>7s} {'efficiency':>10s} "
          f"{'steady eff.':>11s} {'driver CPU ms/cand':>19s}")
    for r in rows:
        print(f"{r['evaluators']:10d} {r['candidates']:6d} {r['per_s']:7.2f} {r['steady_per_s']:7.2f} "
              f"{r['ideal_per_s']:7.2f} {100 * r['efficiency']:9.1f}% {100 * r['steady_efficiency']:10.1f}% "
              f"{r['driver_cpu_ms_per_candidate']:19.2f}")
    print("\nengine work per candidate (ms)")
    for k, v in costs.items():
        print(f"  {k:42s} {v:8.3f}")
    print(f"  {'total on the offline path':42s} {engine_ms:8.3f}")

    # Model at 1,000 GPUs, from the CUDA benchmark's per-GPU rates (scripts/results/bench_cuda_h200.json).
    per_gpu = {"cold cache (204/min/GPU, H200)": 204 / 60, "warm cache (439/min/GPU, H200)": 439 / 60}
    coord_ms = rows[-1]["driver_cpu_ms_per_candidate"]
    store_ms = costs["store write (batched, per row)"]
    model = []
    print("\nmodel at 1,000 GPUs (one coordinator process, as built)")
    for label, r in per_gpu.items():
        rate = 1000 * r
        model.append({"case": label, "candidates_per_s": rate, "coordinator_cores": rate * coord_ms / 1e3,
                      "sqlite_busy_fraction": rate * store_ms / 1e3})
        print(f"  {label:32s} {rate:7.0f} cand/s -> coordinator {rate * coord_ms / 1e3:6.1f} cores busy, "
              f"SQLite {100 * rate * store_ms / 1e3:5.1f}% busy (batched)")
    report = {"throughput": rows, "overhead_ms": costs, "engine_ms_per_candidate": engine_ms, "model_1000_gpus": model}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"\nJSON: {args.out}")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
