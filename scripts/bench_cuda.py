#!/usr/bin/env python3
"""CUDA benchmark: what a fixed-budget search finds, how fast kfray evaluates, and the cost of
KernelBench's build path for the same kernel. Prints a table and writes JSON.

    python scripts/bench_cuda.py --budget 40 --out bench_cuda.json

1. A fixed-budget search per built-in task (GPU shape sets): best kernel against the reference
   (CuPy / cuBLAS) and against the roofline time (bytes / measured copy bandwidth, or
   flops / measured fp32 rate).
2. Evaluation throughput of one GPU evaluator actor on the candidates that search produced:
   cold (empty compile cache) and warm (every build cached), with the mean seconds of compile,
   correctness and timing per candidate.
3. Time to make one kernel usable and measured: kfray's path (nvcc to a shared library, sandbox,
   checks, timing) against `torch.utils.cpp_extension.load_inline` (KernelBench's route).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402

from kfray.candidate import Candidate, EvalResult  # noqa: E402
from kfray.config import load_config  # noqa: E402
from kfray.eval.evaluator import make_evaluators  # noqa: E402
from kfray.eval.queue import EvalQueue  # noqa: E402
from kfray.driver import run_search  # noqa: E402
from kfray.store import Store  # noqa: E402
from kfray.tasks import load_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def search(budget: int, work: Path, cache: Path, overrides: list[str] = ()) -> dict:
    cfg = load_config(ROOT / "configs" / "cuda.yaml", [f"search.budget={budget}", f"eval.cache_dir={cache}",
                                                       *overrides])
    cfg.eval.evaluators = 1
    t0 = time.time()
    summary = run_search(cfg, work / "search", progress=False)
    summary["search_wall_s"] = time.time() - t0
    return summary


def roofline(summary: dict, facts: dict, store: Store) -> list[dict]:
    bw = facts.get("copy_bandwidth_gbps") or 0
    rate = (facts.get("fp32_matmul_tflops") or 0) * 1e3
    rows = []
    for ref, t in summary["tasks"].items():
        if not t["correct"]:
            rows.append({"task": ref, "correct": False})
            continue
        cand, res = store.candidate(t["best_candidate"])
        task = load_task(ref)
        for shape, sec in res.times.items():
            nbytes, flops = task.cost(shape)
            floor = max(nbytes / (bw * 1e9) if bw else 0, flops / (rate * 1e9) if rate else 0)
            rows.append({"task": ref, "shape": shape, "kernel_ms": sec * 1e3, "reference_ms": res.ref_times[shape] * 1e3,
                         "speedup_vs_ref": res.ref_times[shape] / sec, "roofline_ms": floor * 1e3,
                         "fraction_of_roofline": floor / sec if sec else 0,
                         "gbps": nbytes / sec / 1e9, "gflops": flops / sec / 1e9,
                         "fraction_of_copy_bw": (nbytes / sec / 1e9) / bw if bw else 0,
                         "params": cand.params})
    return rows


def lineage(store: Store, cand_id: str) -> list[dict]:
    """The best kernel's chain of parents, root first: which operators (edits) made it."""
    chain, seen = [], set()
    while cand_id and cand_id not in seen:
        seen.add(cand_id)
        got = store.candidate(cand_id)
        if got is None:
            break
        c, r = got
        chain.append({"id": c.id, "origin": c.origin, "cell": list(c.cell), "params": c.params,
                      "speedup": round(r.speedup, 3) if r.correct else None})
        cand_id = c.parent_id
    return chain[::-1]


def before_rows(path: Path) -> dict:
    """(task, shape) -> the last recorded row of the main branch (the 'before' column)."""
    if not path.exists():
        return {}
    return {(b["task"], b["shape"]): b for b in json.loads(path.read_text()).get("best", []) if "shape" in b}


def throughput(cands: list[Candidate], cfg_eval, label: str) -> dict:
    [ev] = make_evaluators("cuda", cfg_eval, 1, f"bench-{label}")
    ray.get(ev.info.remote())
    q = EvalQueue([ev], depth=cfg_eval.compile_workers + 1)
    t0 = time.time()
    for c in cands:
        q.submit(c)
    results: list[EvalResult] = []
    while len(q):
        results += [r for _, r in q.poll(0.05)]
    wall = time.time() - t0
    stats = ray.get(ev.stats.remote())
    ray.get(ev.shutdown.remote())
    ray.kill(ev)

    def mean(stage):
        return statistics.mean(r.stage_seconds.get(stage, 0.0) for r in results)

    return {"label": label, "candidates": len(results), "wall_s": wall, "per_minute": 60 * len(results) / wall,
            "compile_s": mean("compile"), "correctness_s": mean("correctness"), "timing_s": mean("timing"),
            "gpu_busy_fraction": stats["device_busy_s"] / wall, "cache": stats["compile_cache"]}


def load_inline_vs_kfray(cache: Path) -> dict:
    """One axpb kernel made usable both ways, from a cold start."""
    from kfray.config import EvalConfig
    from kfray.eval.evaluator import Evaluator

    task = load_task("axpb@gpu")
    seed = task.seeds_for("cuda")[0]
    from kfray.source import parse_params
    params = parse_params(seed.source).default()
    ev = Evaluator("cuda", EvalConfig(backend="cuda", cache_dir=str(cache / "li")))
    t0 = time.time()
    r = EvalResult.from_dict(ev.evaluate(Candidate(task="axpb@gpu", language="cuda", source=seed.source, params=params)))
    kfray_s = time.time() - t0
    ev.shutdown()
    out = {"kfray_s": kfray_s, "kfray_tier": r.tier, "kfray_stages": r.stage_seconds}
    try:
        import torch
        from torch.utils.cpp_extension import load_inline
    except ImportError:
        return {**out, "load_inline_s": None, "note": "torch not installed"}
    defines = "".join(f"#define {k} {v}\n" for k, v in params.items())
    cuda_src = defines + seed.source + r'''
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
torch::Tensor forward(torch::Tensor x, double a, double b) {
    auto y = torch::empty_like(x);
    kf_forward(x.data_ptr<float>(), y.data_ptr<float>(), (float)a, (float)b, x.numel(),
               at::cuda::getCurrentCUDAStream());
    return y;
}
'''
    build = tempfile.mkdtemp(prefix="kfray-load-inline-")
    t0 = time.time()
    mod = load_inline(name=f"kf_axpb_{os.getpid()}", cpp_sources="torch::Tensor forward(torch::Tensor x, double a, double b);",
                      cuda_sources=cuda_src, functions=["forward"], build_directory=build, verbose=False)
    built = time.time() - t0
    x = torch.randn(1 << 24, device="cuda")
    y = mod.forward(x, 2.0, 1.0)
    torch.cuda.synchronize()
    ok = bool(torch.allclose(y, 2.0 * x + 1.0))
    return {**out, "load_inline_s": time.time() - t0, "load_inline_build_s": built, "load_inline_correct": ok,
            "ratio": (time.time() - t0) / kfray_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=40, help="evaluations per task in the search")
    ap.add_argument("--out", default="bench_cuda.json")
    ap.add_argument("--skip-load-inline", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true", help="no cold/warm re-evaluation of the candidates")
    ap.add_argument("--set", action="append", default=[], help="config override for the search, e.g. eval.ncu=false")
    ap.add_argument("--before", default=str(ROOT / "scripts" / "results" / "bench_cuda_h200.json"),
                    help="an earlier JSON whose best rows are the 'before' column")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kfray-bench-cuda-"))
    cache = work / "cache"
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    from kfray.config import EvalConfig
    from kfray.eval.backends.cuda import CudaBackend
    facts = CudaBackend(EvalConfig(backend="cuda", cache_dir=str(cache))).device_facts()
    print("device:", json.dumps(facts))

    summary = search(args.budget, work, cache / "search", args.set)
    store = Store(work / "search" / "kfray.db")
    best = roofline(summary, facts, store)
    chains = {ref: lineage(store, t["best_candidate"]) for ref, t in summary["tasks"].items() if t["correct"]}
    pairs = store.evaluated()
    cands = [c for c, r in pairs if c.source]
    by_origin: dict = {}
    for c, r in pairs:                      # does each edit keep kernels correct on the GPU?
        ok, total = by_origin.setdefault(c.task, {}).get(c.origin, (0, 0))
        by_origin[c.task][c.origin] = (ok + bool(r.correct), total + 1)
    store.close()

    cold = warm = None
    if not args.skip_throughput:
        cfg = load_config(ROOT / "configs" / "cuda.yaml").eval
        cfg.cache_dir = str(cache / "throughput")
        cold = throughput(cands, cfg, "cold")
        warm = throughput(cands, cfg, "warm")
    li = None if args.skip_load_inline else load_inline_vs_kfray(cache)

    report = {"device": facts, "search": summary, "best": best, "lineage": chains, "correct_by_origin": by_origin,
              "throughput": [t for t in (cold, warm) if t], "load_inline": li}
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))

    before = before_rows(Path(args.before))
    print("\nbest kernel per task and shape (search budget %d per task); before: %s" % (args.budget, args.before))
    print(f"{'task':12s} {'shape':16s} {'kernel ms':>9s} {'ref ms':>8s} {'vs ref':>7s} {'GB/s':>6s} "
          f"{'GFLOP/s':>8s} {'roofline':>8s} {'copy bw':>7s} | {'before vs ref':>13s} {'roofline':>8s}")
    for b in best:
        if "shape" in b:
            o = before.get((b["task"], b["shape"]), {})
            print(f"{b['task']:12s} {b['shape']:16s} {b['kernel_ms']:9.4f} {b['reference_ms']:8.4f} "
                  f"{b['speedup_vs_ref']:7.2f} {b['gbps']:6.0f} {b['gflops']:8.0f} {100 * b['fraction_of_roofline']:7.1f}% "
                  f"{100 * b['fraction_of_copy_bw']:6.1f}% | {o.get('speedup_vs_ref', float('nan')):13.2f} "
                  f"{100 * o.get('fraction_of_roofline', float('nan')):7.1f}%")
    print("\nper task: evaluated / budget, cells, cells per island, ran dry, best's lineage (root first)")
    for ref, t in summary["tasks"].items():
        print(f"{ref:12s} {t['evaluated']:4d} / {t.get('budget', '?')}  cells {t['cells_filled']:2d}  "
              f"islands {t['island_cells']}  dry {t.get('ran_dry')}  {t.get('note', '')}")
        print("    " + " -> ".join(f"{c['origin']}{c['cell']}" for c in chains.get(ref, [])))
        ops = by_origin.get(ref.split("@")[0], by_origin.get(ref, {}))
        print("    correct/evaluated by origin: " + ", ".join(f"{o}:{a}/{b}" for o, (a, b) in sorted(ops.items())))
        if t.get("profile"):
            print(f"    ncu: {json.dumps(t['profile'])[:600]}")
    for t in (cold, warm):
        if t is None:
            continue
        if t is cold:
            print("\nevaluation throughput, one GPU")
            print(f"{'cache':6s} {'cands':>6s} {'per min':>8s} {'compile s':>10s} {'check s':>8s} {'time s':>7s} {'GPU busy':>9s}")
        print(f"{t['label']:6s} {t['candidates']:6d} {t['per_minute']:8.1f} {t['compile_s']:10.3f} "
              f"{t['correctness_s']:8.3f} {t['timing_s']:7.3f} {100 * t['gpu_busy_fraction']:8.0f}%")
    if li:
        print(f"\none kernel made usable: kfray {li['kfray_s']:.2f} s, load_inline "
              f"{li.get('load_inline_s') or float('nan'):.1f} s (x{li.get('ratio') or float('nan'):.0f})")
    print(f"\nJSON: {args.out}")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
