#!/usr/bin/env python3
"""What the split judge costs: evaluations a minute of one warm evaluator, and how often its judge
had to be recycled, per backend. Every candidate is a distinct source (a comment differs), so
each one is built, gets a runner of its own (or, on the in-judge path, a state check) and is
judged in full. Prints a table and writes JSON.

    python scripts/bench_judge.py --backend cpu --n 30
    python scripts/bench_judge.py --backend cuda --n 60             # on a GPU machine
    python scripts/bench_judge.py --backend torch_ext_cuda --task kernelbench:PATH --n 20
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kfray.candidate import Candidate, EvalResult  # noqa: E402
from kfray.config import EvalConfig  # noqa: E402
from kfray.eval.evaluator import Evaluator  # noqa: E402
from kfray.source import parse_params  # noqa: E402
from kfray.tasks import load_task  # noqa: E402


def sources(backend: str, task, n: int) -> tuple[str, list[str]]:
    """(candidate language, n distinct sources) of the task's first seed for this backend."""
    if backend.startswith("torch_ext"):
        text = Path(task.suite.path).read_text()
        import re
        base = re.sub(r"\bModel\b", "ModelNew", text)
        return "modelnew", [f"# candidate {i}\n{base}" for i in range(n)]
    from kfray.config import EvalConfig
    from kfray.eval.backends.base import get_backend

    seed = task.seeds_for(get_backend(backend, EvalConfig()).language)[0]
    return seed.language, [f"// candidate {i}\n{seed.source}" for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--task", default="axpb")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    task = load_task(a.task)
    lang, srcs = sources(a.backend, task, a.n)
    cache = tempfile.mkdtemp(prefix="kfray-bench-judge-")
    ev = Evaluator(a.backend, EvalConfig(cache_dir=cache, tune_budget=0, suite_perf_trials=20, timeout_s=120))
    builds = [ev.backend.compile(s, parse_params(s).default() if lang != "modelnew" else {}, task) for s in srcs]
    del builds                                        # built first: the figures are the judge's alone
    walls, tiers, recycled = [], [], 0
    ev.evaluate(Candidate(task=a.task, language=lang, source=srcs[0], params={}), a.task)   # warm
    t_all = time.perf_counter()
    for s in srcs:
        t0 = time.perf_counter()
        r = EvalResult.from_dict(ev.evaluate(Candidate(task=a.task, language=lang, source=s,
                                                       params=parse_params(s).default() if lang != "modelnew" else {}),
                                             a.task))
        walls.append(time.perf_counter() - t0)
        tiers.append(r.tier)
        recycled += bool(r.facts.get("sandbox_recycled") or r.facts.get("state_changed"))
    total = time.perf_counter() - t_all
    ev.shutdown()
    row = {"backend": a.backend, "task": a.task, "n": a.n, "correct": tiers.count(5),
           "evals_per_min": 60 * a.n / total, "median_s": statistics.median(walls), "max_s": max(walls),
           "judge_recycled": recycled, "judge_restarts": ev.sandbox.restarts}
    print("| backend | task | n | correct | evals/min | median s | max s | judge recycled |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {a.backend} | {Path(a.task).name} | {a.n} | {row['correct']} | {row['evals_per_min']:.0f} | "
          f"{row['median_s']:.2f} | {row['max_s']:.2f} | {recycled} |")
    if a.out:
        Path(a.out).write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
