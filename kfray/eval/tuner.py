"""The inner template tuner: a candidate's `@kf.param` settings, searched inside its evaluation.

    // @kf.param BLOCK  in [64, 128, 256, 512]
    // @kf.param UNROLL in [1, 2, 4, 8]
    // @kf.require BLOCK * UNROLL <= 4096

A source that declares tunables is measured at up to `eval.tune_budget` settings that the
`@kf.require` constraints allow, on the evaluator's own device (each setting is compiled with `-D`
and run in the sandbox like any candidate). The candidate's own setting is always measured. When
every allowed setting fits in the budget they are all measured; otherwise, after the candidate's
own setting, a coordinate search: the neighbours of the best setting so far (one parameter one step
along its sorted values), moving whenever one is better, and a random untried setting when no
neighbour is left.

The best setting becomes the candidate's result (`facts["tuned_params"]` says which; the island
adopts it as the candidate's params) and every setting tried is kept in `facts["tuning"]` for the
next prompt. The evaluator caches what it measured per (source, hardware), and the budget is per
(source, hardware) too: a later candidate with the same source (another setting of it, say) costs
only its own setting if that is new, and reports the best of every setting measured so far. So the
tuner's cost is bounded by the number of distinct sources, not of candidates.
"""
from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from kfray.candidate import TIER_COMPILE_ERROR, Candidate, EvalResult
from kfray.source import ParamSpace, parse_params, source_hash

MAX_ENUMERATE = 4096        # larger spaces are sampled, never listed
MAX_SHOWN = 24              # settings kept in facts["tuning"]
CACHE_SOURCES = 512         # sources whose settings an evaluator remembers


def setting_key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


@dataclass
class TuneOutcome:
    best_params: dict
    best: EvalResult
    results: dict = field(default_factory=dict)     # setting key -> (params, EvalResult), cached ones included
    order: list = field(default_factory=list)       # setting keys in the order they were measured
    new_evaluations: int = 0
    exhaustive: bool = False


def _neighbours(space: ParamSpace, p: dict) -> list[dict]:
    """Settings one step away: one parameter moved to the next lower or higher of its values."""
    out = []
    for name, values in space.values.items():
        vals = list(values)
        try:
            vals = sorted(vals)
        except TypeError:
            pass
        if p.get(name) not in vals:
            continue
        i = vals.index(p[name])
        for j in (i - 1, i + 1):
            if 0 <= j < len(vals):
                q = dict(p)
                q[name] = vals[j]
                if space.allows(q):
                    out.append(q)
    return out


def _random_setting(space: ParamSpace, rng: random.Random, tries: int = 64) -> dict | None:
    for _ in range(tries):
        p = {k: rng.choice(v) for k, v in space.values.items()}
        if space.allows(p):
            return p
    return None


def _broken(res: EvalResult) -> bool:
    """A failure no other setting is likely to fix, or one too costly to repeat (a timeout)."""
    return res.tier <= TIER_COMPILE_ERROR or "timeout" in (res.reason or "")


def tune(space: ParamSpace, start: dict, evaluate_setting: Callable[[dict], EvalResult], budget: int,
         rng: random.Random, tried: dict | None = None) -> TuneOutcome:
    """Measure `start`, then more settings of `space` until `budget` settings are measured in all;
    the best by fitness wins.

    `tried` (setting key -> (params, EvalResult)) holds settings measured before: they count for
    the budget and the best, and are never measured again."""
    results: dict = dict(tried or {})
    order: list = []
    spent = 0

    def run(p: dict) -> EvalResult:
        nonlocal spent
        k = setting_key(p)
        if k not in results:
            results[k] = (dict(p), evaluate_setting(dict(p)))
            order.append(k)
            spent += 1
        return results[k][1]

    if not start or not space.allows(start) or set(start) != set(space.values):
        start = space.default() or dict(start)
    first = run(start)
    all_settings = list(space.settings()) if space.size() <= MAX_ENUMERATE else None
    exhaustive = False
    if not (_broken(first) and spent):
        if all_settings is not None:
            untried = [p for p in all_settings if setting_key(p) not in results]
            if len(untried) <= budget - len(results):
                exhaustive = True
                for p in untried:
                    run(p)
        if not exhaustive:
            stale = 0
            while len(results) < budget and stale < 8:
                best_key = max(results, key=lambda k: results[k][1].fitness)
                options = [q for q in _neighbours(space, results[best_key][0]) if setting_key(q) not in results]
                if options:
                    run(rng.choice(options))
                    stale = 0
                    continue
                if all_settings is not None:
                    rest = [p for p in all_settings if setting_key(p) not in results]
                    if not rest:
                        break
                    run(rng.choice(rest))
                else:
                    q = _random_setting(space, rng)
                    if q is None or setting_key(q) in results:
                        stale += 1
                        continue
                    run(q)
    start_key = setting_key(start)
    best_key = max(results, key=lambda k: (results[k][1].fitness, k == start_key))
    params, best = results[best_key]
    return TuneOutcome(dict(params), best, results, order, spent, exhaustive)


# -- inside an Evaluator ------------------------------------------------------------------------

_LOCK = threading.Lock()


def _cache(evaluator) -> OrderedDict:
    with _LOCK:
        c = getattr(evaluator, "_tune_cache", None)
        if c is None:
            c = evaluator._tune_cache = OrderedDict()
        return c


def tune_candidate(evaluator, cand: Candidate, task_ref: str | None) -> dict | None:
    """The evaluator's result for a candidate with tunables, tuned; None when there is nothing to tune
    (no `@kf.param`, a single allowed setting, or tuning off)."""
    budget = int(getattr(evaluator.cfg, "tune_budget", 0) or 0)
    if budget <= 0 or not cand.source.strip():
        return None
    space = parse_params(cand.source)
    if not space.values or space.size() < 2:
        return None
    t0 = time.perf_counter()
    key = (source_hash(cand.source), evaluator.backend.hardware_class())
    cache = _cache(evaluator)
    with _LOCK:
        tried = dict(cache.get(key, {}))

    def evaluate_setting(params: dict) -> EvalResult:
        return EvalResult.from_dict(evaluator.evaluate(dataclasses.replace(cand, params=params), task_ref,
                                                       tune=False))

    rng = random.Random(key[0] + setting_key(cand.params))      # reproducible: str seeds are hashed stably
    out = tune(space, dict(cand.params), evaluate_setting, budget, rng, tried)
    with _LOCK:
        cache[key] = {k: v for k, v in out.results.items()}
        cache.move_to_end(key)
        while len(cache) > CACHE_SOURCES:
            cache.popitem(last=False)
    res = dataclasses.replace(out.best, candidate_id=cand.id, facts=dict(out.best.facts),
                              stage_seconds=dict(out.best.stage_seconds))
    ranked = sorted(out.results.values(), key=lambda pr: -pr[1].fitness)
    res.facts["tuning"] = [{"params": p, "tier": r.tier, "speedup": round(r.speedup, 4)}
                           for p, r in ranked[:MAX_SHOWN]]
    res.facts["tuned_params"] = out.best_params
    res.facts["tuning_evaluations"] = out.new_evaluations
    res.facts["tuning_settings"] = len(out.results)
    res.stage_seconds["tuning"] = time.perf_counter() - t0
    return res.to_dict()
