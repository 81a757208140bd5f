"""The suites' timing: their statistic on both sides of every configuration (CUDA events; KernelBench
with an L2 flush per trial), kfray's medians beside it, a torch.compile column on request, and the
timed runs' results checked."""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from kfray.candidate import TIER_WRONG_VALUES
from kfray.eval.suite.common import (KB_PERF_TRIALS, KB_WARMUP, KERNELBENCH, RKB, RKB_PERF_TRIALS, RKB_WARMUP,
                                     SUITE_NAMES, SUITE_SEED, Verdict, allclose_reason, flush_l2,
                                     outputs)
from kfray.eval.suite.cpu_pin import cpu_of, pin_together
from kfray.eval.suite.judge import Judge
from kfray.eval.suite.runners import Case
from kfray.eval.suite.side_timer import SideTimer, time_case

# Each side's timed calls are split into up to this many blocks, the two sides' blocks alternating
# in the order kernel, reference, reference, kernel, ...: a slow stretch of the host (launch-bound
# models read 0.78x and 1.30x against themselves on an H100 when each side was one block) falls on
# both sides, and a steady drift cancels. The suite's statistic is unchanged: the mean of the same
# number of calls a side. A launch-bound model's stretches are short: one block of 25 calls at 1.5x
# the others' time (48_Mamba2ReturnY, an H100) read 0.90x with 4 blocks a side; 10 blocks of 10
# share such stretches more evenly.
ROUNDS = 10
ROUNDS_MAX_BYTES = 1 << 30    # larger inputs: one block a side, so that only one side's sets are alive at once
LATER_WARMUP = 1              # untimed calls before each later block
# The last stretch of a paced wait is spun, not slept: on a busy host a woken process can wait out
# another's scheduler slice (1-3 ms), and a paced reference with a 0.48 ms cadence, sleeping all but
# the last WARM_SPIN_S, ran at 3.1x it while a second pytest worker was busy; a spinning one keeps its CPU.
PACE_SPIN_S = 3e-3
MIN_BLOCK = 10                # calls a block at least (fewer blocks where trials are few): a block's cadence
                              # is the median of its calls' start-to-start gaps, which the next block's paced
                              # reference keeps


class Clock:
    """The suites' timers: CUDA events on the current stream (the backend's time_call, which also
    counts host wall time when work outlives the stream), host perf_counter on the CPU."""

    def __init__(self, backend, flush_l2: bool):
        self.backend, self.flush_l2 = backend, flush_l2 and backend.device == "cuda"

    def flush(self) -> None:
        if self.flush_l2:
            flush_l2()

    def samples(self, call: Callable[[], Any], warmup: int, trials: int, before: Callable[[], Any] | None = None,
                budget_s: float = 0.0, in_runner: bool = False, pace: float = 0.0) -> list[float]:
        """With `in_runner` the call runs in another process (a runner), which flushes L2 on its own
        stream before each call and times it with its own events: the judge's flush and events, in
        another CUDA context, are left out (the samples are 0; the caller reads the runner's). With `pace`, each
        call starts that many seconds after the last one began (sleeping the rest): the reference's
        calls keep the candidate's cadence, whose every call waits on the wire. The cadence of
        these calls (median start to start) is left in `period`."""
        t0 = time.perf_counter()
        self.warmed = 0
        starts: list[float] = []

        def keep_pace():
            if pace and starts:          # sleep, then spin the last stretch: a sleep overshoots by
                until = starts[-1] + pace     # tens of microseconds idle, and by a scheduler slice on a
                # busy host (PACE_SPIN_S); the clock read once: preempted between two reads, a judge
                # slept a negative length
                left = until - time.perf_counter() - PACE_SPIN_S
                if left > 0:
                    time.sleep(left)
                while time.perf_counter() < until:
                    pass
            starts.append(time.perf_counter())

        for _ in range(warmup):
            keep_pace()
            if before:
                before()
            call()
            self.backend.synchronize()
            self.warmed += 1
            if budget_s and time.perf_counter() - t0 > budget_s / 4:
                break                     # a slow problem: warm, and the budget is for samples
        out: list[float] = []
        starts.clear()
        start = time.perf_counter()
        for _ in range(trials):
            keep_pace()
            if before:
                before()
            self.backend.synchronize()
            if in_runner:                 # timed by the runner's own events (the wire's log): no events
                call()                    # of the judge's context between its calls
                out.append(0.0)
            else:
                self.flush()
                out.append(self.backend.time_call(call))
            if budget_s and len(out) >= 5 and time.perf_counter() - start > budget_s:
                break                     # a slow problem: enough samples for a mean
        self.period = float(np.median(np.diff(starts))) if len(starts) > 1 else 0.0
        return out


def stats(ts: list[float]) -> dict:
    a = np.asarray(ts, dtype=float)
    return {"mean": float(a.mean()), "median": float(np.median(a)),
            "iqr": float(np.percentile(a, 75) - np.percentile(a, 25)), "samples": int(a.size)}


def measure(backend, judge: Judge, cases: list[Case], job: dict) -> dict:
    """Both sides timed per configuration; the suite's figures and kfray's beside them."""
    spec = judge.spec
    kb = spec.kind == KERNELBENCH
    trials = int(job.get("suite_perf_trials") or (KB_PERF_TRIALS if kb else RKB_PERF_TRIALS))
    warmup = KB_WARMUP if kb else RKB_WARMUP
    warmup = min(warmup, max(1, trials // 4))
    budget = float(job.get("suite_time_budget_s") or 0.0)
    rounds = max(1, int(job.get("suite_rounds") or ROUNDS))
    clock = Clock(backend, flush_l2=kb)
    seed = SUITE_SEED
    remote = cases[0].remote if cases else None
    via = remote.reference_ready() if hasattr(remote, "reference_ready") else None   # loaded before any timing
    pinned = None
    if via is not None and backend.device == "cuda" and job.get("suite_pin_cpu", True):
        pinned = pin_together([remote.runner.pid, via.runner.pid])
    times, ref_times, per_shape, spreads = {}, {}, {}, []
    means_new, means_ref, means_cmp, cmp_note = [], [], [], ""
    pace_on = job.get("suite_ref_pace", True)
    for case in cases:
        ts_new, ts_ref, blocks, side = time_both(judge, clock, case, seed, kb, warmup, trials, budget, rounds,
                                                    pace_on)
        s_new, s_ref = stats(ts_new), stats(ts_ref)
        times[case.name], ref_times[case.name] = s_new["median"], s_ref["median"]
        spreads.append(s_new["iqr"] / s_new["median"] if s_new["median"] > 0 else 0.0)
        means_new.append(s_new["mean"])
        means_ref.append(s_ref["mean"])
        row = {"mean_ms": s_new["mean"] * 1e3, "ref_mean_ms": s_ref["mean"] * 1e3, "samples": s_new["samples"],
               "median_ms": s_new["median"] * 1e3, "ref_median_ms": s_ref["median"] * 1e3,
               "period_ms": side["periods"][0] * 1e3, "ref_period_ms": side["periods"][1] * 1e3}
        if len(blocks) > 1:   # each block's mean, kernel and reference: where the two sides drifted apart
            row["blocks_ms"] = [[round(a * 1e3, 5), round(b * 1e3, 5)] for a, b, _ in blocks]
        if via is not None:   # the CPUs each side's runner was on after its blocks
            row["runner_cpus"] = [sorted({c[i] for _, _, c in blocks if c[i] is not None}) for i in (0, 1)]
        copies = side["copies"]
        if copies:            # the timed calls the judge checked, and their copies' round trips
            row["checked_calls"], row["copy_ms"] = len(copies), float(np.median(copies)) * 1e3
        if job.get("torch_compile") and not cmp_note:
            try:
                pace = side["periods"][0] if pace_on else 0.0
                ts_c, _ = time_case(judge, clock, case, seed, "ref", warmup, trials, budget, compiled=True, pace=pace)
                means_cmp.append(stats(ts_c)["mean"])
                row["compile_mean_ms"] = means_cmp[-1] * 1e3
            except Exception as e:
                cmp_note = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        per_shape[case.name] = row
    avg_new, avg_ref = float(np.mean(means_new)), float(np.mean(means_ref))
    suite = {"name": SUITE_NAMES[spec.kind], "verdict": "correct", "trials": f"{spec.trials}/{spec.trials}",
             "statistic": statistic(kb, backend.device, trials),
             "avg_mean_ms": avg_new * 1e3, "ref_avg_mean_ms": avg_ref * 1e3,
             "speedup": avg_ref / avg_new if avg_new > 0 else 0.0, "configs": len(cases),
             "rtol": spec.rtol, "atol": spec.atol,
             "reference_timed": "in a runner of its own" if via is not None else "in the judge",
             "runners_cpu": pinned,
             "blocks": f"up to {rounds} a side, alternating, for inputs up to {ROUNDS_MAX_BYTES >> 20} MiB"}
    if getattr(remote, "reference_note", ""):
        suite["reference_note"] = remote.reference_note
    if means_cmp and len(means_cmp) == len(cases):
        suite["compile_avg_mean_ms"] = float(np.mean(means_cmp)) * 1e3
        suite["speedup_compile"] = float(np.mean(means_cmp)) / avg_new if avg_new > 0 else 0.0
    elif cmp_note:
        suite["compile_note"] = cmp_note
    return {"times": times, "ref_times": ref_times, "per_shape": per_shape, "suite": suite,
            "noise": float(max(spreads) if spreads else 0.0)}


def runner_cpus(case: Case) -> tuple:
    """(the CPU the kernel's runner is on, the reference runner's), None where it has none."""
    remote = getattr(case, "remote", None)
    new = getattr(remote, "runner", None)
    ref = getattr(getattr(remote, "reference", None), "runner", None)
    return tuple(cpu_of(r.pid) if r is not None and r.pid else None for r in (new, ref))


def blocks_of(trials: int, rounds: int) -> list[int]:
    """`trials` split into `rounds` blocks as even as they go, of MIN_BLOCK calls at least."""
    rounds = max(1, min(rounds, trials // MIN_BLOCK))
    return [trials // rounds + (1 if i < trials % rounds else 0) for i in range(rounds)]


def time_both(judge: Judge, clock: Clock, case: Case, seed: int, kb: bool, warmup: int, trials: int,
              budget: float, rounds: int, pace_on: bool):
    """Both sides of one configuration: (kernel samples, reference samples, each block pair's means,
    {"periods": (kernel period, reference period), "copies": the kernel's checked calls' copies'
    round trips}). KernelBench's reference makes as many calls as the kernel
    made, warm-ups too (one model pair for every trial: the same calls keep their state alike);
    robust-kbench's has its own budget. The timed results are checked at the end (check_timed)."""
    new = SideTimer(judge, clock, case, seed, "new")
    if new.input_bytes > ROUNDS_MAX_BYTES or new.backward_remote:
        rounds = 1
    ts_new, ts_ref, blocks, p_new, p_ref = [], [], [], [], []
    ref = None
    spent_new = spent_ref = 0.0

    def run_new(w: int, n: int) -> list[float]:
        nonlocal spent_new
        t0 = time.perf_counter()
        got = new.run(w, n, max(budget - spent_new, 1e-9) if budget else 0.0, of=trials)
        spent_new += time.perf_counter() - t0
        p_new.append(clock.period)
        return got

    def run_ref(w: int, n: int) -> list[float]:
        nonlocal spent_ref
        pace = float(np.median(p_new)) if pace_on and p_new else 0.0
        t0 = time.perf_counter()
        got = ref.run(w, n, 0.0 if kb or not budget else max(budget - spent_ref, 1e-9), pace=pace, of=trials)
        spent_ref += time.perf_counter() - t0
        p_ref.append(clock.period)
        return got

    sizes = blocks_of(trials, rounds)
    for r, n in enumerate(sizes):
        w = warmup if r == 0 else min(warmup, LATER_WARMUP)
        if r % 2 == 0:                   # kernel first
            a = run_new(w, n)
            if ref is None:
                if rounds == 1:          # one side's sets alive at a time
                    new.drop()
                    judge.memory.settle(f"{case.name}: kernel timed")
                ref = SideTimer(judge, clock, case, seed, "ref", like=None if rounds == 1 else new)
            b = run_ref(clock.warmed if kb else w, len(a) if kb else n)
        else:                            # reference first: a drift within the pair falls on both
            b = run_ref(w, n)
            a = run_new(w, len(b) if kb else n)
        ts_new += a
        ts_ref += b
        blocks.append((float(np.mean(a)), float(np.mean(b)), runner_cpus(case)))
        if len(a) < n or (budget and spent_new >= budget):
            break                        # the budget ran out: a slow problem has its samples
    new.check_clock(beside=ref)
    ref.check_clock(beside=new)
    _, _, last_new = new.result()
    m_ref, _, last_ref = ref.result()
    check_timed(judge, case, last_new, last_ref, m_ref)
    new.drop()
    ref.drop()
    del last_new, last_ref, m_ref
    judge.memory.settle(f"{case.name}: reference timed")
    periods = (float(np.median(p_new)), float(np.median(p_ref)))
    return ts_new, ts_ref, blocks, {"periods": periods, "copies": new.copies}


def peak_memory(backend) -> dict:
    """The sandbox's peak host memory (resident) and, on CUDA, peak device memory, in GiB."""
    import resource

    out = {"peak_host_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if backend.device == "cuda":
        import torch

        out["peak_device_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def statistic(kb: bool, device: str, trials: int) -> str:
    timer = "CUDA-event" if device == "cuda" else "host-timer"
    if kb:
        return f"mean of {trials} {timer} trials" + (" after an L2 flush each" if device == "cuda" else "")
    return f"config-averaged mean of {trials} {timer} samples"


def check_timed(judge: Judge, case: Case, last_new, last_ref, m_ref=None) -> None:
    """The timed runs' last results against the reference's on the same inputs, and the timed
    calls the judge kept at random against the reference on their input set: a kernel that skips
    work when it senses timing, or returns what it kept from an earlier call, fails here."""
    spec = judge.spec
    if last_new is None or last_ref is None:
        return
    if isinstance(last_new, dict):
        pairs = [(k, last_ref.get(k), last_new.get(k)) for k in last_ref]
    else:
        a, b = outputs(last_ref, "the reference"), outputs(last_new, "the kernel")
        pairs = [(f"output {i}", x, y) for i, (x, y) in enumerate(zip(a, b))]
    for name, w, g in pairs:
        if g is None:
            raise Verdict(TIER_WRONG_VALUES, f"configuration {case.name}, timed runs: {name} missing")
        why = allclose_reason(w, g, spec.rtol, spec.atol, name, broadcast=spec.kind == RKB)
        if why:
            raise Verdict(TIER_WRONG_VALUES, f"configuration {case.name}, after the timed runs: {why}; the kernel "
                          "must compute its result on every call [kfray rule]")
