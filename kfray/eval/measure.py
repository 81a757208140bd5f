"""Correctness and timing of one loaded kernel, backend-agnostic. Runs inside the sandbox worker.

Correctness (DESIGN.md): for every shape config and several fresh random inputs, outputs are
poisoned before the run; an output is right when the elementwise error is within
atol + rtol*|ref| on at least 99 % of elements, its cosine similarity with the reference is at
least 0.99985, and no element is left unwritten. Inputs must come back unchanged.
Timing: warm-up, then the median of repeats over input sets rotated so no cache holds them all.

A search finds every hole in its harness, so nothing a kernel reports is believed unchecked
(tests/test_reward_hacks.py has a kernel for each hack):

- the reference runs only after the kernel has returned: its outputs never exist in memory while
  the kernel runs, so there is nothing to find and copy;
- outputs are poisoned before every call: NaN, and on alternate trials a large finite value of
  either sign (a kernel that reads outputs before writing them, `y[i] = max(y[i], ...)`, fails);
- outputs are copied the moment the call returns and compared again after a pause: a change means
  work left running on another thread or stream, which a timer would miss;
- beyond the 99 % / cosine rules an output must reproduce the reference's variation about its own
  mean: a near-constant output that a loose tolerance accepts on a low-variance reference fails;
- every buffer sits between guard zones (backends with `check_guards`): writes outside it fail;
- timed runs are checked too: random spots of each output are poisoned before every timed call
  and read back after it; every input set's outputs, inputs and guards are checked against the
  reference computed for that set, and a fresh-input check of every shape follows the timing
  (kernels that skip work when they sense timing, or return results cached from earlier calls);
- an achieved bandwidth or flop rate above `eval.max_roofline_fraction` times the device's
  measured copy bandwidth / fp32 rate is flagged (`facts["flags"]`, `facts["untrusted"]`), and an
  untrusted result's speedup counts as 0.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from kfray.candidate import TIER_CORRECT, TIER_RUNTIME_ERROR
from kfray.eval.closeness import MIN_COSINE, MIN_FRACTION_CLOSE, compare, tolerance
from kfray.eval.correctness import check_all, check_correctness, check_once, finite_poison
from kfray.eval.defences import clock_check, review_flag
from kfray.eval.remote import claimed_times, paused
from kfray.eval.roofline import roofline_flags
from kfray.eval.timed_runs import Spots, rotation, time_fn, verify_timed_sets
from kfray.eval.timing_turn import timing_turn
from kfray.eval.torch_compile import compile_facts, compiled_reference_time

# The checks live in closeness/correctness/timed_runs/roofline; callers may still import them from here.
__all__ = ["run_job", "Timings", "correct_result", "compare", "tolerance", "MIN_COSINE", "MIN_FRACTION_CLOSE",
           "check_correctness", "check_once", "time_fn", "roofline_flags"]

_REF_TIMES: dict[tuple, float] = {}   # (task ref, shape) -> reference seconds, per worker lifetime
                                      # (a re-timing times it afresh; the driver keeps one per task)


def _fail(tier: int, reason: str, stages: dict, **extra) -> dict:
    return {"tier": tier, "reason": reason, "stage_seconds": stages, **extra}


def _host_clock(fn: Callable[[], Any]) -> float:
    """The judge's wall time of a call made in a runner (its device work is the runner's to time)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --- one job --------------------------------------------------------------------------------------
def run_job(backend, fn: Callable, task, job: dict) -> dict:
    """Correctness on fresh inputs, then timing of kernel and reference on rotated inputs, then
    checks that the timed runs computed what they should."""
    # Unpredictable inputs, and the draw recorded so that the verdict can be replayed (eval.input_seed).
    seed = int(job.get("input_seed") or 0) or int.from_bytes(os.urandom(7), "little")
    backend._pool = None              # the input pool too is drawn from this job's seed (kfray.eval.draws)
    with timing_turn(job):
        out = _run_job(backend, fn, task, job, np.random.default_rng(seed))
    out.setdefault("facts", {})["input_seed"] = seed
    return out


def _run_job(backend, fn: Callable, task, job: dict, rng) -> dict:
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    tier, reason, extra = check_all(backend, fn, task, job["trials"], rng)
    stages["correctness"] = time.perf_counter() - t0
    sticky = backend.check_sticky_error()
    if sticky:
        return {**_fail(TIER_RUNTIME_ERROR, sticky, stages), "recycle": True}
    if tier != TIER_CORRECT:
        return _fail(tier, reason, stages, **extra)

    t0 = time.perf_counter()
    timings, compiled, faked = Timings(), {}, []
    cache_bytes = job.get("cache_bytes", 32 << 20)
    for shape in task.shapes:
        n_sets = rotation(task, shape, cache_bytes)
        hosts = [backend.make_args(task, shape, rng) for _ in range(n_sets)]   # pristine, for the reference
        sets = [backend.to_device(h) for h in hosts]
        # The spot checks draw from a stream of their own: how many timed calls there are depends
        # on the clock, and the draws that follow (next shape's inputs, the recheck) must not.
        spots = Spots(task, sets, np.random.default_rng(int(rng.integers(1 << 62))))
        codes: list = []

        def call(i: int) -> None:
            rc = fn(sets[i])
            if rc != 0:
                codes.append(rc)

        log = claimed_times(fn)        # in a runner: its claimed times count, checked below
        starts: list[float] = []
        ts = time_fn(backend, call, n_sets, job["warmup"], job["repeats"], job["max_repeats"], job["min_time"],
                     before=spots.poison, after=spots.read, clock=None if log is None else _host_clock, starts=starts)
        backend.synchronize()
        if log is not None:            # the candidate's own times, held against the judge's clock
            pairs = log[-len(ts):]
            why = clock_check(pairs, fn.runner.quiet_round_trip())
            if why:
                faked.append(f"shape {shape}: {why}")
            ts = [c for _, c, _ in pairs]
        if codes:
            return _fail(TIER_RUNTIME_ERROR, f"kf_forward returned {codes[0]} during the timed runs on shape {shape}",
                         stages)
        bad = verify_timed_sets(backend, task, shape, hosts, sets, spots)
        if bad:
            return _fail(*bad, stages)
        key = (task.ref, shape, backend.name)
        if key not in _REF_TIMES or job.get("fresh_reference"):
            with paused(fn):           # nothing of the candidate's runs while its reference is timed
                rts = time_fn(backend, lambda i: backend.reference(task, sets[i]), n_sets, 1, job["repeats"],
                              max(job["repeats"], job["max_repeats"] // 2), job["min_time"])
            _REF_TIMES[key] = float(np.median(rts))
        # the cadence of the timed calls: a copy held against the kernel is timed at the same one
        period = float(np.median(np.diff(starts))) if len(starts) > 1 else 0.0
        timings.add(task, shape, ts, n_sets, _REF_TIMES[key], spot_checked=spots.calls, period_us=round(period * 1e6, 1),
                    idle_us=round(max(0.0, period - float(np.median(ts))) * 1e6, 1))
        if job.get("torch_compile"):     # the second baseline (kfray/eval/torch_compile.py)
            compiled[shape] = compiled_reference_time(backend, task, shape, hosts, job)
        del sets, hosts, spots
    stages["timing"] = time.perf_counter() - t0
    sticky = backend.check_sticky_error()
    if sticky:
        return {**_fail(TIER_RUNTIME_ERROR, sticky, stages), "recycle": True}

    # Fresh inputs once more, now that the kernel has been timed: a kernel that counts its calls
    # or keeps results from earlier calls is caught here if the spot checks missed it.
    t0 = time.perf_counter()
    for shape in task.shapes:
        tier, why, extra = check_once(backend, fn, task, shape, rng, finite_poison(rng))
        if tier != TIER_CORRECT:
            stages["recheck"] = time.perf_counter() - t0
            return _fail(tier, f"after the timed runs, a check on fresh inputs failed: {why}", stages, **extra)
    stages["recheck"] = time.perf_counter() - t0

    extra: dict[str, Any] = {}
    if compiled:
        extra["torch_compile"] = compile_facts(compiled)
    return correct_result(backend, task, job, timings, stages, extra, faked)


@dataclass
class Timings:
    """What the timing of a correct kernel gathers per shape, for `correct_result`."""
    times: dict = field(default_factory=dict)       # shape -> median seconds
    ref_times: dict = field(default_factory=dict)   # shape -> reference seconds
    spreads: list = field(default_factory=list)     # relative IQR of each shape's timings
    facts: dict = field(default_factory=dict)       # shape -> achieved GB/s, GFLOP/s, repeats...
    rotated: dict = field(default_factory=dict)     # shape -> (bytes the rotated sets touch, sets)

    def add(self, task, shape: str, ts, n_sets: int, ref_time: float, **more_facts) -> None:
        med = float(np.median(ts))
        q75, q25 = np.percentile(ts, [75, 25])
        nbytes, flops = task.cost(shape)
        self.times[shape] = med
        self.ref_times[shape] = ref_time
        self.spreads.append(float((q75 - q25) / med) if med > 0 else 0.0)
        self.rotated[shape] = (n_sets * nbytes, n_sets)
        self.facts[shape] = {"gbps": nbytes / med / 1e9 if med > 0 else 0.0,
                             "gflops": flops / med / 1e9 if med > 0 else 0.0, "repeats": len(ts), **more_facts}


def correct_result(backend, task, job: dict, timings: Timings, stages: dict,
                   extra_facts: dict | None = None, faked: list[str] = ()) -> dict:
    """The result of a kernel that passed every check. Its timing is checked against the judge's
    own clock and the roofline last: a time the judge's clock cannot account for, or one faster
    than the hardware allows, is kept but flagged, and its speedup not trusted."""
    t = timings
    flags, roof = roofline_flags(backend, task, job, t.facts, t.rotated)
    flags = list(faked) + list(flags)
    out_facts: dict[str, Any] = {"per_shape": t.facts, "roofline": roof, **(extra_facts or {})}
    review = review_flag(t.times, t.ref_times)
    if review and not flags:
        out_facts["review"] = review
    reason = ""
    if flags:
        out_facts["flags"] = flags
        out_facts["untrusted"] = "; ".join(flags)
        reason = ("flagged, speedup not trusted (counts as 0): " + "; ".join(flags) +
                  ". Faster than the hardware allows means the timing missed work")
    return {"tier": TIER_CORRECT, "reason": reason, "times": t.times, "ref_times": t.ref_times,
            "noise": float(max(t.spreads) if t.spreads else 0.0), "facts": out_facts,
            "stage_seconds": stages}
