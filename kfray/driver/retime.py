"""The winner's curse, undone: a run's best is its single highest noisy measurement out of many,
so at the end the top few correct kernels of each task are timed again before a best is named.

Each is timed `search.retime_rounds` times, round-robin over the task's top kernels and over the
evaluators of its hardware class, every time with its reference timed afresh beside it in the same
job (on the CPU one job at a time: concurrent timings there share the cores and the memory bus).
A kernel's re-timed figure is the median of those speedups, with their range as the spread; the
task's best is the best by that median, and its first figure is kept beside it. The task's
baseline seed is re-timed in the same rounds, so "vs seed" compares like with like.
"""
from __future__ import annotations

import json
import statistics
from typing import Any

import ray

from kfray.candidate import Candidate, EvalResult
from kfray.driver.roofline import task_copies
from kfray.source import source_hash


def _kernel_key(c: dict, res: EvalResult) -> str:
    """What was timed: the source at the setting its result was measured at. Candidates that share
    it share one (cached) measurement, so re-timing two of them would time one kernel twice."""
    params = res.facts.get("tuned_params") or c.get("params") or {}
    return source_hash(c.get("source", "")) + json.dumps(params, sort_keys=True)


def contenders(book, top: int) -> list[tuple[dict, dict]]:
    """The task's `top` fastest trusted, correct kernels (candidate, result dicts), fastest first,
    each a different kernel (source and setting)."""
    seen, out = set(), []
    for c, r in sorted(book.known.values(), key=lambda p: EvalResult.from_dict(p[1]).speedup, reverse=True):
        res = EvalResult.from_dict(r)
        key = _kernel_key(c, res)
        if res.speedup <= 0 or c["id"] in seen or key in seen:
            continue
        seen.update((c["id"], key))
        out.append((c, r))
        if len(out) == top:
            break
    return out


def summarize(first: float, speedups: list[float], lost: list[str] = (), times: list[dict] = (),
              copies: list[dict] = ()) -> dict[str, Any]:
    """A kernel's re-timed figure: median and range of the rounds that stayed correct, and why
    each other round counts for nothing (a user asks why a best was timed fewer times than set).
    `times` (each round's seconds per shape) gives the median per shape, and `copies` (each round's
    copy of the same footprints, GB/s per shape) the median copy, for the CPU roofline."""
    out: dict[str, Any] = {"first": round(first, 4), "retimed": 0.0, "low": 0.0, "high": 0.0, "rounds": 0}
    if speedups:
        out.update(retimed=round(statistics.median(speedups), 4), low=round(min(speedups), 4),
                   high=round(max(speedups), 4), rounds=len(speedups))
    shapes = set.intersection(*(set(t) for t in times)) if times else set()
    if shapes:
        out["times"] = {s: statistics.median(t[s] for t in times) for s in sorted(shapes)}
    copied = set.intersection(*(set(c) for c in copies)) if copies and all(copies) else set()
    if copied:
        out["copy_gbps_same_way"] = {s: round(statistics.median(c[s] for c in copies), 2) for s in sorted(copied)}
    if lost:
        out["lost_rounds"] = list(lost)
    return out


def idle_gaps(per_shape: dict[str, list[float]]) -> dict[str, float]:
    """shape -> the median idle time (us) between the timed calls of a round's kernels: the cadence
    the copy they are held against is timed at."""
    return {s: statistics.median(v) for s, v in per_shape.items() if v}


def baseline(co, ref: str, label: str) -> tuple[dict, dict] | None:
    """The task's baseline seed (its simplest) as evaluated on this hardware class, if correct."""
    hc = co.by_label.get(label) or co.classes[0]
    seeds = co.tasks[ref].seeds_for(hc.language)
    for c, r in co.ledger.tasks[ref].seed_pairs.get(hc.label, []):
        if seeds and c.get("origin") == f"seed:{seeds[0].name}" and EvalResult.from_dict(r).speedup > 0:
            return c, r
    return None


def _field(co, ref: str, book, top: int) -> tuple[list[tuple[dict, dict]], tuple[dict, dict] | None]:
    """(the task's contenders, its baseline seed or None): what the rounds time."""
    top_k = contenders(book, top)
    return top_k, baseline(co, ref, top_k[0][1].get("hardware", "")) if top_k else None


def retime_bests(co) -> dict[str, dict[str, Any]]:
    """{task: {"best": candidate id, "kernels": {id: summarize(...)}, "seed": summarize(...) of the
    baseline seed or None}} for every task with a correct kernel; {} with search.retime_top or
    retime_rounds at 0."""
    top, rounds = co.cfg.search.retime_top, co.cfg.search.retime_rounds
    if top <= 0 or rounds <= 0:
        return {}
    fields = {ref: _field(co, ref, book, top) for ref, book in co.ledger.tasks.items()}
    timed = {ref: top_k + ([seed] if seed and all(seed[0]["id"] != c["id"] for c, _ in top_k) else [])
             for ref, (top_k, seed) in fields.items()}
    jobs: list[tuple[str, dict, Any, bool, int]] = []    # (task, candidate dict, evaluator, alone, round)
    turn: dict[str, int] = {}
    cfg_of: dict[str, Any] = {}
    for rnd in range(rounds):
        for ref, pairs in timed.items():
            for c, r in pairs:
                hc = co.by_label.get(r.get("hardware", "")) or co.classes[0]
                k = turn[hc.label] = turn.get(hc.label, -1) + 1
                # CPU evaluators share the machine's cores and memory bandwidth: two timed at once
                # would slow each other, so the CPU's re-timings run one at a time.
                jobs.append((ref, c, hc.evaluators[k % len(hc.evaluators)], hc.cfg.backend == "cpu", rnd))
                cfg_of[ref] = hc.cfg
    ahead = {i: ev.evaluate.remote(c, ref, False, True) for i, (ref, c, ev, alone, _) in enumerate(jobs) if not alone}
    got: dict[tuple[str, str], list[float]] = {}
    times: dict[tuple[str, str], list[dict]] = {}
    copies: dict[tuple[int, str], dict] = {}          # (round, task) -> the copy timed right after its kernels
    gaps: dict[tuple[int, str], dict] = {}            # (round, task) -> shape -> its kernels' idle us between calls
    rounds_of: dict[tuple[str, str], list[int]] = {}  # the rounds a kernel stayed correct in
    lost: dict[tuple[str, str], list[str]] = {}
    for i, (ref, c, ev, alone, rnd) in enumerate(jobs):
        key = (ref, c["id"])
        try:
            res = EvalResult.from_dict(ray.get(ev.evaluate.remote(c, ref, False, True) if alone else ahead[i]))
        except ray.exceptions.RayError as e:
            lost.setdefault(key, []).append(f"evaluator lost: {str(e).splitlines()[0][:200]}")
            continue
        finally:    # the CPU's ceiling, timed beside the kernels it is held against (driver/roofline.py)
            if alone and (i + 1 == len(jobs) or jobs[i + 1][0] != ref or jobs[i + 1][4] != rnd):
                copies[(rnd, ref)] = task_copies(cfg_of[ref], co.tasks[ref], idle_gaps(gaps.get((rnd, ref), {})))
        if res.speedup > 0:
            for shape, f in (res.facts.get("per_shape") or {}).items():
                if isinstance(f, dict) and f.get("idle_us") is not None:
                    gaps.setdefault((rnd, ref), {}).setdefault(shape, []).append(float(f["idle_us"]))
            got.setdefault(key, []).append(res.speedup)
            times.setdefault(key, []).append(dict(res.times))
            rounds_of.setdefault(key, []).append(rnd)
        else:
            lost.setdefault(key, []).append(f"tier {res.tier}: {res.reason[:300]}")
    out: dict[str, dict[str, Any]] = {}
    for ref, (top_k, seed) in fields.items():
        figures = {c["id"]: summarize(EvalResult.from_dict(r).speedup, got.get((ref, c["id"]), []),
                                      lost.get((ref, c["id"]), []), times.get((ref, c["id"]), []),
                                      [copies.get((k, ref)) or {} for k in rounds_of.get((ref, c["id"]), [])])
                   for c, r in timed[ref]}
        kernels = {c["id"]: figures[c["id"]] for c, _ in top_k}
        if kernels:
            best = max(kernels, key=lambda i: kernels[i]["retimed"])
            out[ref] = {"best": best, "kernels": kernels, "seed": figures[seed[0]["id"]] if seed else None}
    return out


def best_pair(co, ref: str, retimed: dict) -> tuple[Candidate, EvalResult] | None:
    """The task's best after re-timing, as (candidate, its first result), or None."""
    info = retimed.get(ref)
    if not info or info["kernels"][info["best"]]["retimed"] <= 0:
        return None
    for c, r in co.ledger.tasks[ref].known.values():
        if c["id"] == info["best"]:
            return Candidate.from_dict(c), EvalResult.from_dict(r)
    return None
