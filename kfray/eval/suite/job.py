"""One evaluation of a suite-form kernel on a suite task, in the sandbox worker: the suite's verdict,
kfray's checks, the stream probe, the timing, a last check on fresh inputs."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from kfray.candidate import TIER_CORRECT, TIER_RUNTIME_ERROR
from kfray.eval.defences import review_flag
from kfray.eval.suite.common import SUITE_NAMES, Verdict
from kfray.eval.suite.judge import Judge
from kfray.eval.suite.runners import runner_for
from kfray.eval.suite.timing import measure, peak_memory
from kfray.eval.timing_turn import timing_turn
from kfray.tasks.suite_spec import SuiteSpec


CALLS_PER_SIDE = 12       # calls of each side outside the timing: suite trials, kfray's, the probe


def size_limits(judge: Judge, cases: list, kernel: Any, job: dict) -> None:
    """Time limits that follow the reference's own time: one reference call is timed first; a
    runner's call may take `slow_factor` times that (at least 10 s) before it is charged as a
    timeout, and the job asks its evaluator for the time both sides need (up to max_timeout_s)."""
    import torch

    from kfray.eval.suite.common import SUITE_SEED, making, set_seed, to_device, to_module

    extend = job.get("extend")
    factor = float(job.get("slow_factor") or 20.0)
    if extend is None and getattr(kernel, "runner", None) is None:
        return
    case, sp, dev = cases[0], judge.spec, judge.device
    grad = torch.enable_grad() if sp.direction == "backward" else torch.no_grad()
    with grad, making(sp, dev):
        set_seed(SUITE_SEED)
        xs = to_device(case.make_inputs(), dev)
        set_seed(SUITE_SEED)
        model = to_module(case.make_ref(), dev)
        judge.sync()
        t0 = time.perf_counter()
        out = case.call_ref(model, xs)
        judge.sync()
        ref_s = time.perf_counter() - t0
        del out, xs, model
    judge.ref_call_s = ref_s
    runner = getattr(kernel, "runner", None)
    if runner is not None:
        kernel.call_limit = (max(10.0, factor * ref_s), factor, ref_s)
    if extend is not None:
        trials = int(job.get("suite_perf_trials") or 100) + 10
        need = len(cases) * ref_s * (CALLS_PER_SIDE + trials) * (2 + factor / 4)
        extend(float(job.get("call_deadline_s") or 0.0) + need)


def run_suite_job(backend, kernel: Any, task, job: dict) -> dict:
    """Verdict and figures of a suite-form kernel on a suite task; a plain result dict."""
    with timing_turn(job):
        return _run_suite_job(backend, kernel, task, job)


def _run_suite_job(backend, kernel: Any, task, job: dict) -> dict:
    import torch

    spec: SuiteSpec = task.suite
    stages: dict[str, float] = {}
    rng = np.random.default_rng()
    t0 = time.perf_counter()
    if backend.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    judge = None
    try:
        from kfray.eval.suite.remote_case import RemoteKernel
        remote = kernel if isinstance(kernel, RemoteKernel) else None
        if remote is not None:                 # the candidate side in its runner, the reference here
            cases = remote.cases(runner_for(spec, None, task).cases())
        else:
            cases = runner_for(spec, kernel, task).cases()
        judge = Judge(backend, spec, rng, remote)
        judge.memory.settle("start")          # what an earlier candidate left in this judge's cache
        t_limits = time.perf_counter()
        size_limits(judge, cases, kernel, job)
        stages["size_limits"] = time.perf_counter() - t_limits
        judge.memory.settle("reference timed once")
        if remote is not None:                 # its runner loaded meanwhile: what is left of that wait
            t_load = time.perf_counter()
            remote.ready()
            stages["load_wait"] = time.perf_counter() - t_load
        judge.suite_trials(cases)
        stages["correctness"] = time.perf_counter() - t0
        if backend.device == "cuda" and spec.direction == "forward":
            from kfray.eval.suite.stream_probe import probe_case

            why = probe_case(backend, judge, cases[0])
            judge.memory.settle("stream probe")
            if why:
                raise Verdict(TIER_RUNTIME_ERROR, f"configuration {cases[0].name}: {why} [kfray rule]", recycle=True)
        judge.fresh_trials(cases)
        stages["kfray_checks"] = time.perf_counter() - t0 - stages["correctness"]
        sticky = backend.check_sticky_error()
        if sticky:
            raise Verdict(TIER_RUNTIME_ERROR, sticky, recycle=True)
        if remote is not None:                 # the next job's runners, forked ahead, idle from now on
            from kfray.eval.spares import settle_spares
            settle_spares(remote.runner)
        t1 = time.perf_counter()
        figures = measure(backend, judge, cases, job)
        stages["timing"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        judge.fresh_trials(cases)              # after the timing: a kernel that counts calls or keeps results
        stages["recheck"] = time.perf_counter() - t2
    except Verdict as v:
        stages.setdefault("correctness", time.perf_counter() - t0)
        out = {"tier": v.tier, "reason": v.reason, "stage_seconds": stages,
               "facts": {"suite": {"name": SUITE_NAMES.get(spec.kind, spec.kind), "verdict": "rejected"}}}
        if judge is not None and judge.memory.log:
            out["facts"]["judge_memory"] = judge.memory.log
        if v.recycle:
            out["recycle"] = True
        return out
    except torch.cuda.OutOfMemoryError as e:
        return {"tier": TIER_RUNTIME_ERROR, "reason": f"out of device memory: {str(e).splitlines()[0]}",
                "stage_seconds": stages, "recycle": True,
                "facts": {"judge_memory": judge.memory.log} if judge is not None else {}}
    figures["suite"]["max_diff"] = judge.max_diff
    figures["suite"].update(peak_memory(backend))
    facts = {"form": "suite", "suite": figures["suite"], "per_shape": figures["per_shape"]}
    if remote is not None and remote.load_facts:
        facts["runner_load_s"] = remote.load_facts
    if judge.memory.count:                # device memory given back between steps: its share of the stages
        facts["settle_s"] = {"seconds": round(judge.memory.seconds, 4), "times": judge.memory.count}
    if judge.memory.log:
        facts["judge_memory"] = judge.memory.log
    reason = ""
    if judge.flags:                       # times the judge's own clock cannot account for
        facts["flags"] = judge.flags
        facts["untrusted"] = "; ".join(judge.flags)
        reason = "flagged, speedup not trusted (counts as 0): " + "; ".join(judge.flags)
    else:
        review = review_flag(figures["times"], figures["ref_times"])
        if review:
            facts["review"] = review
    return {"tier": TIER_CORRECT, "reason": reason, "times": figures["times"], "ref_times": figures["ref_times"],
            "noise": figures["noise"], "facts": facts, "stage_seconds": stages}
