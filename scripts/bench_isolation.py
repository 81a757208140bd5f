#!/usr/bin/env python3
"""What isolation costs: sandbox start and per-candidate evaluation with eval.isolation none
against namespaces, on the CPU backend (and CUDA where a GPU is present). Prints a table.

    python scripts/bench_isolation.py --candidates 12 --out /tmp/isolation_overhead.md

1. Sandbox start: a fresh worker until it answers ready (median of --starts).
2. One compile of a small kernel through run_compiler (median of --compiles), and `true` started
   directly and through the namespace helper: the per-candidate price of the helper (one
   short-lived Python that sets up the namespaces and execs the compiler).
3. Per candidate, end to end through an Evaluator: compile (cold cache) + correctness + timing,
   over --candidates distinct axpb kernels, with warm sandboxes (their start is measured in 1),
   in rounds of fresh evaluators.
Modes alternate within each measurement, so load on a shared machine hits both alike.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kfray.candidate import Candidate  # noqa: E402
from kfray.config import EvalConfig  # noqa: E402
from kfray.eval import isolation  # noqa: E402
from kfray.eval.compile_cache import CompileCache, run_compiler  # noqa: E402
from kfray.eval.evaluator import Evaluator  # noqa: E402
from kfray.eval.sandbox import Sandbox  # noqa: E402
from kfray.source import parse_params  # noqa: E402
from kfray.tasks import load_task  # noqa: E402

MODES = ("none", "namespaces")


def _cfg(mode: str, cache: str, backend: str) -> EvalConfig:
    return EvalConfig(backend=backend, cache_dir=cache, isolation=mode, tune_budget=0, trials=1, warmup=1,
                      repeats=3, max_repeats=10, min_time_s=0.005, timeout_s=120)


def sandbox_start(backend: str, starts: int, root: Path) -> dict[str, float]:
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(starts):
        for mode in (MODES if i % 2 == 0 else MODES[::-1]):
            sb = Sandbox(backend, _cfg(mode, str(root / mode), backend))
            t0 = time.perf_counter()
            sb._start()
            times[mode].append(time.perf_counter() - t0)
            sb.close()
    return {m: statistics.median(v) for m, v in times.items()}


def one_compile(compiles: int, root: Path) -> dict[str, float]:
    """g++ on a one-function file, as the cpu backend builds a candidate, with and without the namespaces."""
    from kfray.eval.backends.cpu import BASE_FLAGS, compiler

    src = root / "k.cpp"
    src.write_text('extern "C" int kf_forward(const float* x, float* y, float a, float b, long n)'
                   "{ for (long i = 0; i < n; ++i) y[i] = a * x[i] + b; return 0; }\n")
    out = root / "k.so"
    cmd = [compiler(), *BASE_FLAGS, str(src), "-o", str(out)]
    times: dict[str, list[float]] = {m: [] for m in MODES}
    cache = CompileCache(root / "cc")
    for _ in range(compiles):
        for mode in MODES:
            plan = isolation.compile_plan(cmd, root, cache.root) if mode == "namespaces" else None
            t0 = time.perf_counter()
            rc, text = run_compiler(cmd, 120, plan)
            times[mode].append(time.perf_counter() - t0)
            assert rc == 0, text
    return {m: statistics.median(v) for m, v in times.items()}


def helper_alone(runs: int) -> dict[str, float]:
    """/bin/true started directly and through the namespace helper: the fixed price per process."""
    import subprocess

    plan = isolation.sandbox_plan()
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(runs):
        for mode in MODES:
            cmd = isolation.wrap(["true"], plan) if mode == "namespaces" else ["true"]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True)
            times[mode].append(time.perf_counter() - t0)
    return {m: statistics.median(v) for m, v in times.items()}


def per_candidate(backend: str, language: str, n: int, root: Path, rounds: int = 3) -> dict[str, dict[str, float]]:
    """Fresh evaluators (one per mode) each round, so one worker process's luck on a shared
    machine (its core, its memory) does not decide a mode's figure."""
    seed = load_task("axpb").baseline_seed(language)
    params = parse_params(seed.source).default()
    stats: dict[str, dict[str, list[float]]] = {m: {"total": [], "compile": [], "run": []} for m in MODES}
    for rnd in range(rounds):
        evs = {m: Evaluator(backend, _cfg(m, str(root / f"eval-{m}"), backend), f"bench-{m}") for m in MODES}
        try:
            for mode, ev in evs.items():      # a warm sandbox each: its start is measured on its own
                ev.evaluate(Candidate(task="axpb", language=language, source=seed.source + f"\n// warm {rnd}\n",
                                      params=params))
            for i in range(max(1, n // rounds)):
                for mode in (MODES if i % 2 == 0 else MODES[::-1]):     # neither mode always goes first
                    src = seed.source + f"\n// candidate {rnd}.{i}\n"        # a new build each time
                    t0 = time.perf_counter()
                    r = evs[mode].evaluate(Candidate(task="axpb", language=language, source=src, params=params))
                    stats[mode]["total"].append(time.perf_counter() - t0)
                    assert r["tier"] == 5, r["reason"]
                    st = r["stage_seconds"]
                    stats[mode]["compile"].append(st.get("compile", 0.0))
                    stats[mode]["run"].append(sum(v for k, v in st.items() if k != "compile"))
        finally:
            for ev in evs.values():
                ev.shutdown()
    return {m: {k: statistics.median(v) for k, v in s.items()} for m, s in stats.items()}


def _gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--compiles", type=int, default=10)
    ap.add_argument("--candidates", type=int, default=10)
    ap.add_argument("--out", help="also write the table (markdown) here")
    args = ap.parse_args()
    why = isolation.unavailable_reason()
    if why:
        print(f"no namespaces on this machine ({why}): nothing to compare", file=sys.stderr)
        return 1
    rows = []
    backends = [("cpu", "cpp")] + ([("cuda", "cuda")] if _gpu() else [])
    with tempfile.TemporaryDirectory(prefix="kfray-bench-iso-") as tmp:
        root = Path(tmp)
        for backend, language in backends:
            s = sandbox_start(backend, args.starts, root / f"start-{backend}")
            rows.append((backend, "sandbox start (s)", s["none"], s["namespaces"]))
            c = per_candidate(backend, language, args.candidates, root / f"cand-{backend}")
            for k in ("compile", "run", "total"):
                rows.append((backend, f"per candidate: {k} (s, median)", c["none"][k], c["namespaces"][k]))
        h = helper_alone(args.compiles * 2)
        rows.append(("any", "start a process (true) (s, median)", h["none"], h["namespaces"]))
        (root / "gxx").mkdir()
        g = one_compile(args.compiles, root / "gxx")
        rows.append(("cpu", "one g++ compile (s, median)", g["none"], g["namespaces"]))
    lines = ["| backend | measure | isolation none | namespaces | overhead |", "|---|---|---|---|---|"]
    for backend, what, a, b in rows:
        lines.append(f"| {backend} | {what} | {a:.4f} | {b:.4f} | {b - a:+.4f} s ({(b / a - 1) * 100 if a else 0:+.1f} %) |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
