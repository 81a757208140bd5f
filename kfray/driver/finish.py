"""The end of a run: islands' final states, each task's best kernel written as a file (in a
suite's own form for suite tasks), and summary.json."""
from __future__ import annotations

import json
import re
import time
from typing import Any

import ray

from kfray.candidate import TIER_CORRECT, EvalResult
from kfray.driver.actors import when_up
from kfray.driver.roofline import add_rooflines
from kfray.driver.retime import best_pair, retime_bests
from kfray.languages import suffix
from kfray.tasks import suite_form


def finish(co, t_start: float, stopped: str = "") -> dict[str, Any]:
    """summary.json and the best files. `stopped`: the signal that stopped the run, which still gets
    its summary, from what the driver holds where the actors no longer answer (no re-timing then)."""
    led = co.ledger
    order = [(ref, i, isl) for ref, isls in co.islands.items() for i, isl in enumerate(isls)]
    if stopped:
        island_states, prompts, cache = _last_known(co, order)
    else:
        island_states = [when_up(isl.state.remote) for _, _, isl in order]
        for k, (ref, i, isl) in enumerate(order):     # an island Ray restarted after its last call answers empty
            if island_states[k]["generation"] != led.tasks[ref].generations[i]:
                co.recover_island(ref, i)
                island_states[k] = when_up(isl.state.remote)
        nodes = [when_up(isl.node.remote) for _, _, isl in order]
        co.placement.update({f"island-{s['task']}-{s['index']}": n for s, n in zip(island_states, nodes)})
        co.store.set_meta(placement=co.placement)
        cache = cache_stats(co.evaluators)
        co.store.save_islands(island_states)
        co.save_prompts(force=True)
        prompts = ray.get(co.evolver.all_prompts.remote())
    per_task = {}
    retimed = {} if stopped else retime_bests(co)     # before the best is named: its first figure was the luckiest
    for ref in retimed:
        pair = best_pair(co, ref, retimed)
        if pair is not None:
            led.tasks[ref].best = pair
    profiles = {} if stopped else profile_bests(co)
    for ref in led.tasks:
        per_task[ref] = task_entry(co, ref, island_states, retimed.get(ref))
        if ref in profiles:
            per_task[ref]["profile"] = profiles[ref]
    add_rooflines(co, per_task)        # CPU: each best against the machine's copy bandwidth and FMA peak
    summary = {
        "tasks": per_task,
        "islands": len(order),
        "evaluators": len(co.evaluators),
        "hardware": co.hardware,
        "migrations": co.migrations,
        "prompt_generations": len({p["generation"] for p in prompts}),
        "evaluated": sum(t.evaluated for t in led.tasks.values()),
        "hardware_classes": [c.label for c in co.classes],
        "compile_cache": cache,
        "cross_hardware": co.cross_hardware,
        "requeued": sum(c.queue.requeued for c in co.classes),
        "island_restores": co.island_restores,
        "per_evaluator": [n for c in co.classes for n in c.queue.per_evaluator],
        "wall_seconds": round(time.time() - t_start, 2),
        "run_dir": str(co.run_dir),
    }
    usage = run_usage(co, island_states)
    if usage:                          # tokens and cost per model (LLM runs), and requests by purpose
        from kfray.proposers.models import request_counts

        summary["llm"] = usage
        llm_cands = sum(1 for t in led.tasks.values() for c, _ in t.known.values()
                        if str(c.get("origin", "")).startswith("llm"))
        summary["llm_requests"] = request_counts(usage, llm_cands)
    if stopped:
        summary["stopped"] = stopped
    (co.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if not stopped:
        co.store.set_meta(status="finished", finished=time.time())
    return summary


def _last_known(co, order: list) -> tuple[list[dict], list, dict]:
    """Island states, prompts and cache figures for a stopped run: asked for briefly, else the last
    checkpoints the driver holds (the signal may have taken Ray down with the driver)."""
    try:
        states = ray.get([isl.state.remote() for _, _, isl in order], timeout=10)
        prompts = ray.get(co.evolver.all_prompts.remote(), timeout=10)
    except Exception:
        states = [co.ledger.tasks[ref].checkpoints.get(i) or {"task": ref, "index": i, "archive": {"elites": []}}
                  for ref, i, _ in order]
        prompts = []
    return states, prompts, {}


def vs_seed(best: dict, seed: dict) -> float:
    """The best over the seed, both re-timed in the same rounds: from their own median times per
    shape where both have them, so that the reference's time, measured once beside each and the
    noisiest of the three where it shares the cores (a BLAS), does not enter twice; else the ratio
    of their re-timed speedups."""
    a, b = best.get("times") or {}, seed.get("times") or {}
    shared = [s for s in set(a) & set(b) if a[s] > 0 and b[s] > 0]
    # the seed's times as the reference: EvalResult's own geometric mean over shapes
    over = EvalResult(candidate_id="", tier=TIER_CORRECT, times={s: a[s] for s in shared},
                      ref_times={s: b[s] for s in shared}).speedup
    return round(over if over > 0 else best["retimed"] / seed["retimed"], 4)


def task_entry(co, ref: str, island_states: list[dict], retimed: dict | None = None) -> dict[str, Any]:
    """One task's summary entry; its best kernel written under best/. With `retimed`
    (kfray.driver.retime), the best's speedup is its re-timed median, with its range and first figure."""
    entry = co.ledger.tally(ref, co.classes[0].label, set(co.by_label))
    again = (retimed or {}).get("kernels", {}).get(entry["best_candidate"])
    if entry["correct"] and again and again["retimed"] > 0:
        seed = entry["best_speedup_vs_seed"] / entry["best_speedup_vs_reference"] \
            if entry["best_speedup_vs_reference"] else 0.0
        entry["best_speedup_first"] = again["first"]
        entry["best_speedup_vs_reference"] = again["retimed"]
        base = retimed.get("seed")                 # the baseline seed, re-timed in the same rounds
        entry["best_speedup_vs_seed"] = vs_seed(again, base) if base and base["retimed"] > 0 \
            else round(again["retimed"] * seed, 4)
        entry["best_spread"] = [again["low"], again["high"]]
        entry["retimed"] = retimed["kernels"]
    best = co.ledger.tasks[ref].best
    suite = getattr(co.tasks[ref], "suite", None)
    if entry["correct"]:
        write_best(co, ref, best[0], entry["best_speedup_vs_reference"], entry["best_hardware"], suite)
    cells = {tuple(e["candidate"]["cell"]) for s in island_states if s["task"] == ref for e in s["archive"]["elites"]}
    entry["cells_filled"] = len(cells)
    entry["island_cells"] = [len(s["archive"]["elites"]) for s in island_states if s["task"] == ref]
    order = ["correct", "best_speedup_vs_reference", "best_speedup_vs_seed", "best_hardware", "best_by_hardware",
             "best_candidate", "best_params", "cells_filled", "island_cells", "evaluated", "correct_count", "migrations",
             "best_speedup_first", "best_spread", "retimed"]
    entry = {k: entry[k] for k in order if k in entry}
    entry.update(dry_note(co.ledger.ran_dry(ref)))
    figures = best[1].facts.get("suite") if entry["correct"] else None
    if suite is not None and isinstance(figures, dict):      # the suite's own figures of the best
        entry["suite"] = {k: figures[k] for k in ("name", "speedup", "speedup_compile", "avg_mean_ms",
                                                  "ref_avg_mean_ms") if k in figures}
    return entry


def profile_bests(co) -> dict[str, dict]:
    """eval.ncu: each task's best kernel profiled by an evaluator of its hardware class (all at
    once, after the search: elites only, never the per-candidate path); the facts are kept with
    the best's result, so the report and later prompts see them."""
    jobs = {}
    for ref, t in co.ledger.tasks.items():
        if not t.best or not t.best[1].correct:
            continue
        c, r = t.best
        hc = co.by_label.get(r.hardware) or co.classes[0]
        if hc.cfg.backend == "cuda" and hc.cfg.ncu and hc.evaluators:
            jobs[ref] = hc.evaluators[0].profile.remote(c.to_dict(), ref)
    out = {}
    for ref, fut in jobs.items():
        try:
            out[ref] = ray.get(fut)
        except ray.exceptions.RayError as e:
            out[ref] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        c, r = co.ledger.tasks[ref].best
        r.facts["profile"] = out[ref]
        co.store.set_facts(c.id, r.facts)
    return out


def dry_note(d: dict) -> dict[str, Any]:
    """The summary's budget keys for a task, with a sentence when it ran dry or took leftovers."""
    out = {k: d[k] for k in ("ran_dry", "budget", "budget_given", "budget_taken", "budget_unspent")}
    if d["ran_dry"]:
        out["note"] = (f"ran out of new kernels after {d['proposals']} proposals; "
                       + (f"gave {d['budget_given']} evaluations to other tasks" if d["budget_given"]
                          else f"{d['budget_unspent']} evaluations left unspent (no task could take them)"))
    elif d["budget_taken"]:
        out["note"] = f"took {d['budget_taken']} evaluations from tasks that ran dry"
    return out


def write_best(co, ref: str, c, speedup: float, label: str, suite) -> None:
    best_dir = co.run_dir / "best"
    best_dir.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^\w.@-]+", "_", ref).strip("_")     # refs may be paths
    if c.language == "suite" and suite is not None:      # a file the suite takes unchanged
        ext, text = suite_form.best_file(c.source, c.params, suite, co.by_label[label].cfg.backend)
        (best_dir / f"{safe}{ext}").write_text(text)
    else:
        (best_dir / f"{safe}{suffix(c.language)}").write_text(
            f"// kfray best kernel for {ref}: speedup {speedup:.3f}x over the reference\n"
            f"// params: {json.dumps(c.params)}\n" + c.source)


def cache_stats(evaluators: list) -> dict:
    """Compile-cache hits over every evaluator: local, fetched from another node, compiled."""
    try:
        per = ray.get([ev.stats.remote() for ev in evaluators], timeout=30)
    except Exception:
        return {}
    tot = {k: sum(p["compile_cache"].get(k, 0) for p in per) for k in ("hits", "remote_hits", "misses")}
    n = sum(tot.values())
    tot["hit_rate"] = round((tot["hits"] + tot["remote_hits"]) / n, 4) if n else 0.0
    return tot


def llm_usage(island_states: list[dict]) -> dict:
    """Tokens and cost per model (each island holds the run-wide ledger's latest snapshot)."""
    from kfray.proposers.models import merged

    return merged(s.get("llm_usage") for s in island_states)


def run_usage(co, island_states: list[dict]) -> dict:
    """The larger of each count in the islands' snapshots and the ledger actor's own: a stopped run's
    island states are its last checkpoints, which were minutes old (a 45-minute local run's summary
    counted 30 requests; the server had answered 52)."""
    from kfray.proposers.models import merged

    return merged([llm_usage(island_states), ledger_usage(co)])


def ledger_usage(co) -> dict:
    """The run-wide ledger's own snapshot, for a stopped run whose islands did not answer in time: an
    island in the middle of a model's answer (minutes on a local server) answers nothing else, and
    the stored checkpoints carry an older usage, if any. The ledger actor never waits on a model."""
    from kfray.proposers.models import ledger_name
    from kfray.search.prompt_evolver import evolver_name

    if co.cfg.proposer.kind != "llm":
        return {}
    try:
        actor = ray.get_actor(ledger_name(evolver_name(co.name)))
        return ray.get(actor.snapshot.remote(), timeout=5) or {}
    except Exception:                 # Ray already down with the driver, or no request was ever made
        return {}
