"""The suites as the suites run them, measured: published robust-kbench kernels with their verdict
and speedup the suite's way, and KernelBench problems at full size, time to verdict.

    python scripts/bench_suites.py rkb --root PATH/robust-kbench [--kernels all|four] --out results.json
    python scripts/bench_suites.py kb --root PATH/KernelBench/level1 [--limit N] [--budget-s S] --out results.json

`rkb` verifies robust-kbench's own kernels (tasks/*/forward.cu, backward.cu, highlighted/*/*/kernel.cu)
on their tasks (single configuration mode, as run_kernel.py runs them). `kb` verifies, for every
problem of a level, a ModelNew that is the problem's own Model (a correct kernel by construction):
the time from the start of the evaluation to the verdict, compile excluded, per problem, with the
problem's size and the sandbox's peak host and device memory; then fast_p both ways (KernelBench's
mean-based speedup, kfray's median-based) over those results. Prints tables; writes JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kfray.candidate import Candidate, EvalResult
from kfray.config import load_config
from kfray.eval.evaluator import Evaluator
from kfray.tasks import load_task

FOUR = [("layernorm", "forward", "highlighted/layernorm/forward/kernel.cu"),
        ("layernorm", "backward", "tasks/layernorm/backward.cu"),
        ("llama_ffw", "forward", "highlighted/llama_ffw/forward/kernel.cu"),
        ("mnist_conv_relu_pool", "backward", "tasks/mnist_conv_relu_pool/backward.cu")]


def rkb_kernels(root: Path, which: str) -> list[tuple[str, str, Path]]:
    if which == "four":
        return [(t, d, root / k) for t, d, k in FOUR]
    out = []
    for k in sorted((root / "highlighted").glob("*/*/kernel.cu")):
        out.append((k.parent.parent.name, k.parent.name, k))
    for k in sorted((root / "tasks").glob("*/*.cu")):
        if k.stem in ("forward", "backward"):
            out.append((k.parent.name, k.stem, k))
    return out


def _evaluator(backend: str, sets: list[str]) -> Evaluator:
    cfg = load_config(None, sets).eval
    cfg.backend = backend
    return Evaluator(backend, cfg, "bench")


def _compile_all(ev: Evaluator, jobs: list[tuple[str, str]], workers: int) -> dict:
    """Compile every (task ref, source) in parallel into the cache; ref -> error or ''."""
    def one(job):
        ref, src = job
        t0 = time.perf_counter()
        try:
            ev.backend.compile(src, {}, load_task(ref))
            return ref, "", time.perf_counter() - t0
        except Exception as e:
            return ref, f"{type(e).__name__}: {str(e)[:300]}", time.perf_counter() - t0

    with ThreadPoolExecutor(workers) as pool:
        return {r: (e, s) for r, e, s in pool.map(one, jobs)}


def cmd_rkb(args) -> list[dict]:
    root = Path(args.root)
    ev = _evaluator(args.backend, args.set)
    rows = []
    kernels = rkb_kernels(root, args.kernels)
    jobs = []
    for task, direction, path in kernels:
        ref = f"rkb:{root / 'tasks' / task}" + ("#backward" if direction == "backward" else "")
        jobs.append((ref, path.read_text()))
    t0 = time.perf_counter()
    _compile_all(ev, list(dict(((r + str(i)), (r, s)) for i, (r, s) in enumerate(jobs)).values()),
                            args.workers)
    print(f"compiled {len(jobs)} kernels in {time.perf_counter() - t0:.0f} s", flush=True)
    for (task, direction, path), (ref, src) in zip(kernels, jobs):
        t1 = time.perf_counter()
        try:
            res = EvalResult.from_dict(ev.evaluate(Candidate(task=ref, language="torch_ext", source=src), ref,
                                                   tune=False))
        except Exception as e:
            rows.append({"task": task, "direction": direction, "kernel": str(path.relative_to(root)),
                         "tier": -1, "reason": f"{type(e).__name__}: {e}"})
            continue
        s = res.facts.get("suite", {})
        rows.append({"task": task, "direction": direction, "kernel": str(path.relative_to(root)),
                     "tier": res.tier, "correct": res.correct, "reason": res.reason[:300],
                     "suite_speedup": s.get("speedup"), "kfray_speedup": res.speedup if res.correct else None,
                     "avg_mean_ms": s.get("avg_mean_ms"), "ref_avg_mean_ms": s.get("ref_avg_mean_ms"),
                     "configs": s.get("configs"), "speedup_vs_torch_compile": s.get("speedup_compile"),
                     "torch_compile_avg_mean_ms": s.get("compile_avg_mean_ms"), "compile_note": s.get("compile_note"),
                     "seconds": time.perf_counter() - t1,
                     "stages": res.stage_seconds})
        r = rows[-1]
        print(f"{task:24s} {direction:8s} {r['kernel'][:44]:44s} tier {res.tier} "
              f"{(r['suite_speedup'] or 0):7.3f}x suite {(r['kfray_speedup'] or 0):7.3f}x kfray "
              f"{(r['speedup_vs_torch_compile'] or 0):7.3f}x vs torch.compile "
              f"{r['seconds']:6.1f} s  {res.reason[:100]}", flush=True)
    ev.shutdown()
    return rows


def cmd_kb(args) -> list[dict]:
    root = Path(args.root)
    files = sorted((p for p in root.glob("*.py") if not p.name.startswith("_")),
                   key=lambda p: int(p.name.split("_")[0]) if p.name.split("_")[0].isdigit() else 10**6)
    tasks = []
    for p in files:
        try:
            t = load_task(f"kernelbench:{p}")
            tasks.append((p, t, int(getattr(t.suite, "bytes_needed", 0) or 0)))
        except Exception as e:
            print(f"{p.name}: does not load: {e}", flush=True)
    if args.largest:                               # peak memory where it matters: the largest problems
        tasks = sorted(tasks, key=lambda x: x[2])[-args.largest:]
    elif args.limit and len(tasks) > args.limit:     # spread over the sizes, the largest included
        by = sorted(tasks, key=lambda x: x[2])
        step = (len(by) - 1) / (args.limit - 1)
        tasks = sorted({id(by[round(i * step)]): by[round(i * step)] for i in range(args.limit)}.values(),
                       key=lambda x: x[2])
    ev = _evaluator(args.backend, args.set)
    srcs = {str(p): p.read_text() + "\n\nModelNew = Model   # the reference operator: correct by construction\n"
            for p, _, _ in tasks}
    t0 = time.perf_counter()
    _compile_all(ev, [(f"kernelbench:{p}", srcs[str(p)]) for p, _, _ in tasks], args.workers)
    print(f"built {len(tasks)} ModelNew files in {time.perf_counter() - t0:.0f} s", flush=True)
    rows, start = [], time.perf_counter()
    for p, t, nbytes in tasks:
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent; {len(tasks) - len(rows)} problems not run", flush=True)
            break
        ref = f"kernelbench:{p}"
        t1 = time.perf_counter()
        res = EvalResult.from_dict(ev.evaluate(Candidate(task=ref, language="modelnew", source=srcs[str(p)]), ref,
                                               tune=False))
        wall = time.perf_counter() - t1
        s = res.facts.get("suite", {})
        verdict_s = sum(v for k, v in res.stage_seconds.items() if k != "compile")
        rows.append({"problem": p.name, "gib": nbytes / 2**30, "tier": res.tier, "correct": res.correct,
                     "reason": res.reason[:300], "verdict_s": verdict_s, "wall_s": wall,
                     "suite_speedup": s.get("speedup"), "kfray_speedup": res.speedup if res.correct else 0.0,
                     "peak_host_gib": s.get("peak_host_gib"), "peak_device_gib": s.get("peak_device_gib"),
                     "stages": res.stage_seconds})
        print(f"{p.name[:44]:44s} {nbytes / 2**30:7.2f} GiB tier {res.tier} verdict {verdict_s:6.1f} s "
              f"(wall {wall:6.1f}) {(s.get('speedup') or 0):6.3f}x suite {rows[-1]['kfray_speedup']:6.3f}x kfray "
              f"peak dev {s.get('peak_device_gib') or 0:6.2f} GiB host {s.get('peak_host_gib') or 0:5.2f} GiB "
              f"{res.reason[:80]}", flush=True)
    ev.shutdown()
    _kb_summary(rows)
    return rows


def _kb_summary(rows: list[dict]) -> None:
    import numpy as np

    from kfray.sweep import fast_p

    if not rows:
        return
    v = np.array([r["verdict_s"] for r in rows])
    print(f"\ntime to verdict over {len(rows)} problems: median {np.median(v):.1f} s, max {v.max():.1f} s "
          f"({rows[int(v.argmax())]['problem']}); over 60 s: {int((v > 60).sum())}; "
          f"not correct: {sum(not r['correct'] for r in rows)}")
    ps = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
    kb = fast_p([{"correct": r["correct"], "speedup": r["suite_speedup"] or 0} for r in rows], ps)
    kf = fast_p([{"correct": r["correct"], "speedup": r["kfray_speedup"] or 0} for r in rows], ps)
    print("p      " + " ".join(f"{p:>6}" for p in ps))
    print("KB     " + " ".join(f"{kb[p]:6.2f}" for p in ps))
    print("kfray  " + " ".join(f"{kf[p]:6.2f}" for p in ps))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rkb")
    r.add_argument("--root", required=True)
    r.add_argument("--kernels", choices=["all", "four"], default="all")
    k = sub.add_parser("kb")
    k.add_argument("--root", required=True)
    k.add_argument("--limit", type=int, default=0)
    k.add_argument("--budget-s", type=float, default=0.0)
    k.add_argument("--largest", type=int, default=0, help="only the N largest problems")
    for x in (r, k):
        x.add_argument("--out", default="")
        x.add_argument("--backend", default="torch_ext_cuda")
        x.add_argument("--workers", type=int, default=8)
        x.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    rows = cmd_rkb(args) if args.cmd == "rkb" else cmd_kb(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
