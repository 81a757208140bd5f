"""The suites' timing: their statistic on both sides of every configuration (CUDA events; KernelBench
with an L2 flush per trial), kfray's medians beside it, a torch.compile column on request, and the
timed runs' results checked."""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

import numpy as np

from kfray.candidate import TIER_WRONG_VALUES
from kfray.eval.suite.common import (KB_PERF_TRIALS, KB_WARMUP, KERNELBENCH, L2_FLUSH_BYTES, RKB, RKB_PERF_TRIALS,
                                     RKB_WARMUP, SUITE_NAMES, SUITE_SEED, WARM_SPIN_S, Verdict, allclose_reason,
                                     flush_l2, gradients, making, outputs, set_seed, tensors, to_device, to_module)
from kfray.eval.defences import clock_check, copy_check
from kfray.eval.remote import paused
from kfray.eval.suite.judge import Judge

ROTATION_MAX_BYTES = 4 << 30      # inputs up to this size get a second set for the timed calls to alternate
from kfray.eval.suite.runners import Case
from kfray.tasks.suite_spec import SuiteSpec


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
                until = starts[-1] + pace     # tens of microseconds, a share of a small task's period
                if until - time.perf_counter() > WARM_SPIN_S:
                    time.sleep(until - time.perf_counter() - WARM_SPIN_S)
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


def time_case(judge: Judge, clock: Clock, case: Case, seed: int, side: str, warmup: int, trials: int,
               budget_s: float, compiled: bool = False, pace: float = 0.0) -> tuple[list[float], Any]:
    """Samples of one side on one configuration, and its last result (to check). `pace`: the
    reference's calls start this many seconds apart (the candidate's measured cadence)."""
    import torch

    sp, dev = judge.spec, judge.device
    candidate = case.remote
    via = getattr(candidate, "reference", None) if side == "ref" and not compiled else None
    if via is not None:       # the reference in its own runner, timed as the candidate is in its own
        case, side = via.case_for(case), "new"
    with making(sp, dev):
        set_seed(seed)
        xs = to_device(case.make_inputs(), dev)
        if side == "new":
            xs = case.prepare(xs)
        set_seed(seed)
        model = to_module(case.make_new() if side == "new" else case.make_ref(), dev)
    remote = case.remote if side == "new" and not compiled else None
    if remote is not None and sp.direction == "backward":     # autograd through the kernel, in its runner
        from kfray.eval.suite.backward_side import time_backward

        return time_backward(judge, clock, case, model, xs, seed, warmup, trials, budget_s)
    if remote is not None:           # a second input set of other values, timed calls alternate
        rotation = [xs]
        if sum(t.numel() * t.element_size() for t in tensors(xs)) <= ROTATION_MAX_BYTES:
            with making(sp, dev):
                set_seed(seed + 1)
                rotation.append(case.prepare(to_device(case.make_inputs(), dev)))
        remote.rotation = rotation
        remote.check = None
    if remote is not None and via is None:       # the reference's own runner is not checked: it is the reference
        with torch.no_grad(), making(sp, dev):   # the reference's result on each set: timed calls kept at
            set_seed(seed)                       # random are checked against it at once, nothing stored
            ref_model = to_module(case.make_ref(), dev)
            refs = [[o.detach() for o in outputs(case.call_ref(ref_model, s), "the reference")] for s in rotation]
            again = outputs(case.call_ref(ref_model, rotation[0]), "the reference")
            del ref_model
        judge.sync()
        # A reference that draws random numbers (dropout in training mode) gives each call its
        # own result: timed calls, which run unseeded, cannot be checked against it.
        steady = len(again) == len(refs[0]) and not any(
            allclose_reason(w, g, sp.rtol, sp.atol, "output") for w, g in zip(refs[0], again))
        remote.check = (lambda idx, outs: judge.check_timed_call(case.name, idx, refs[idx], outs)) if steady else None
    # The candidate's every call waits on the wire; the reference's calls keep its cadence (`pace`,
    # the candidate's median start-to-start period, measured just before), so that neither side's
    # timing has idle gaps the other lacks: on the H200 a 2 ms idle before each call slowed a 54 us
    # KernelBench problem to 80 us. Meanwhile the candidate's processes are stopped
    # (kfray.eval.remote.paused).
    hold = contextlib.nullcontext()
    if via is not None:                   # the candidate's processes stopped, the reference's runner not
        hold, pace = paused(candidate, spare=(via.runner.pid,)), 0.0
    elif side == "ref" and case.remote is not None:
        if not pace:                      # no cadence measured: at least the wire's round trip
            pace = case.remote.runner.round_trip[0]
        hold = paused(case.remote)
    else:
        pace = 0.0
    call_side = case.call_new if side == "new" else case.call_ref
    if compiled:
        call_side = compiled_reference(case, sp)
    last: list = [None]
    if sp.direction == "backward":
        state: dict = {}

        def before():
            model.zero_grad()
            for x in tensors(xs):         # inputs' grads too: every timed backward starts alike
                x.grad = None
            with torch.enable_grad():
                state["out"] = call_side(model, xs)
            # The same upstream gradient on every call and on both sides, however many calls each
            # side made: the last timed calls' gradients are compared (check_timed). Drawn from the
            # shared generator, two sides that timed unlike numbers of calls had different ones.
            set_seed(seed)
            state["g"] = torch.randn_like(state["out"])

        def call():
            state["out"].backward(state["g"])

        with hold:
            ts = clock.samples(call, warmup, trials, before, budget_s, pace=pace)
        last[0] = gradients(model, xs)
    else:
        # The candidate's runner calls the kernel on fresh clones of the inputs, made just before
        # the flush; the paced reference does the same. The clone's GPU work matters, not only its
        # memory: on the H200 a call that followed an idle GPU read 0.5-1.7 % slower than one that
        # followed a clone (level-1 references measured 1.012x against themselves without it).
        fresh = [xs] if side == "ref" and case.remote is not None and not compiled else None

        def clone_inputs():
            fresh[0] = [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]

        def call():
            last[0] = None                 # one output alive at a time: full-size problems are large
            last[0] = call_side(model, fresh[0] if fresh else xs)

        with torch.no_grad():
            if remote is None:
                with hold:
                    ts = clock.samples(call, warmup, trials, clone_inputs if fresh else None, budget_s, pace=pace)
            else:                 # the runner's own times, held against the judge's clock
                log = remote.start_timing(trials, L2_FLUSH_BYTES if clock.flush_l2 else 0)
                try:
                    with hold:
                        ts = clock.samples(call, warmup, trials, None, budget_s, in_runner=True)
                    if last[0] is not None and remote.check is not None:   # the last call's, on its own set
                        remote.check(remote.last_idx, remote.kept_outputs())
                finally:
                    remote.stop_timing()
                last[0] = None
                pairs = log[-len(ts):]
                quiet = remote.runner.quiet_round_trip()
                why = clock_check(pairs, quiet, remote.overhead) or copy_check(remote.copies, remote.copy_s, quiet)
                if why:
                    whose = "the reference's runner (the kernel may have tampered with it): " if via else ""
                    judge.flags.append(f"configuration {case.name}: {whose}{why}")
                ts = [c for _, c, _ in pairs]
    return ts, (model, xs, last[0])


def compiled_reference(case: Case, spec: SuiteSpec):
    """torch.compile(mode="max-autotune") of the reference, as robust-kbench's torch_eval builds it
    (of forward_fn) and KernelBench's ref timing does (of the model)."""
    import torch

    if spec.kind == RKB:
        fn = None

        def call(m, xs):
            nonlocal fn
            if fn is None:
                import inspect
                ref_fn = inspect.signature(m.forward).parameters["fn"].default
                fn = torch.compile(ref_fn, mode="max-autotune")
            return m(*xs, fn=fn)
        return call
    cache: dict = {}

    def call(m, xs):
        if "m" not in cache:
            cache["m"] = torch.compile(m, mode="max-autotune")
        return cache["m"](*xs)
    return call


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
    clock = Clock(backend, flush_l2=kb)
    seed = SUITE_SEED
    remote = cases[0].remote if cases else None
    via = remote.reference_ready() if hasattr(remote, "reference_ready") else None   # loaded before any timing
    times, ref_times, per_shape, spreads = {}, {}, {}, []
    means_new, means_ref, means_cmp, cmp_note = [], [], [], ""
    for case in cases:
        ts_new, (m_new, xs_new, last_new) = time_case(judge, clock, case, seed, "new", warmup, trials, budget)
        del m_new, xs_new                  # the reference makes the same inputs again from the seed
        judge.memory.settle(f"{case.name}: kernel timed")
        period_new = clock.period
        pace = period_new if job.get("suite_ref_pace", True) else 0.0
        if kb:        # one model pair for every trial: the same calls on both sides keep their state alike
            ts_ref, (m_ref, xs_ref, last_ref) = time_case(judge, clock, case, seed, "ref", clock.warmed, len(ts_new),
                                                          0.0, pace=pace)
        else:
            ts_ref, (m_ref, xs_ref, last_ref) = time_case(judge, clock, case, seed, "ref", warmup, trials, budget,
                                                          pace=pace)
        check_timed(judge, case, last_new, last_ref, m_ref)
        del m_ref, xs_ref, last_new, last_ref
        judge.memory.settle(f"{case.name}: reference timed")
        s_new, s_ref = stats(ts_new), stats(ts_ref)
        times[case.name], ref_times[case.name] = s_new["median"], s_ref["median"]
        spreads.append(s_new["iqr"] / s_new["median"] if s_new["median"] > 0 else 0.0)
        means_new.append(s_new["mean"])
        means_ref.append(s_ref["mean"])
        row = {"mean_ms": s_new["mean"] * 1e3, "ref_mean_ms": s_ref["mean"] * 1e3, "samples": s_new["samples"],
               "median_ms": s_new["median"] * 1e3, "ref_median_ms": s_ref["median"] * 1e3,
               "period_ms": period_new * 1e3, "ref_period_ms": clock.period * 1e3}
        copies = getattr(case.remote, "copies", None) or []
        if copies:            # the timed calls the judge checked, and their copies' round trips
            row["checked_calls"], row["copy_ms"] = len(copies), float(np.median(copies)) * 1e3
        if job.get("torch_compile") and not cmp_note:
            try:
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
             "reference_timed": "in a runner of its own" if via is not None else "in the judge"}
    if getattr(remote, "reference_note", ""):
        suite["reference_note"] = remote.reference_note
    if means_cmp and len(means_cmp) == len(cases):
        suite["compile_avg_mean_ms"] = float(np.mean(means_cmp)) * 1e3
        suite["speedup_compile"] = float(np.mean(means_cmp)) / avg_new if avg_new > 0 else 0.0
    elif cmp_note:
        suite["compile_note"] = cmp_note
    return {"times": times, "ref_times": ref_times, "per_shape": per_shape, "suite": suite,
            "noise": float(max(spreads) if spreads else 0.0)}


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
