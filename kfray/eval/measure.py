"""Correctness and timing of one loaded kernel, backend-agnostic. Runs inside the sandbox worker.

Correctness (DESIGN.md): for every shape config and several fresh random inputs, outputs are
poisoned (NaN) before the run; an output is right when the elementwise error is within
atol + rtol*|ref| on at least 99 % of elements, its cosine similarity with the reference is at
least 0.99985, and no element is left unwritten. Inputs must come back unchanged.
Timing: warm-up, then the median of repeats over input sets rotated so no cache holds them all.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any, Callable

import numpy as np

from kfray.candidate import TIER_CORRECT, TIER_RUNTIME_ERROR, TIER_WRONG_SHAPE, TIER_WRONG_VALUES

MIN_FRACTION_CLOSE = 0.99
MIN_COSINE = 0.99985

_REF_TIMES: dict[tuple, float] = {}   # (task ref, shape) -> reference seconds, per worker lifetime


def _xp(a):
    """The array module of `a`: cupy for device arrays (checks run where the data is), else numpy."""
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def compare(name: str, got, want, rtol: float, atol: float) -> str | None:
    """None when `got` matches `want`; otherwise a short reason for the prompt."""
    if tuple(got.shape) != tuple(want.shape):
        return f"output {name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    xp = _xp(got)
    g = got.astype(xp.float64).ravel()
    w = xp.asarray(want).astype(xp.float64).ravel()
    unwritten = int(xp.isnan(g).sum()) - int(xp.isnan(w).sum())
    if unwritten > 0:
        return f"output {name}: {unwritten} of {g.size} elements were never written (still NaN) or NaN"
    close = xp.abs(g - w) <= atol + rtol * xp.abs(w)
    frac = float(close.mean()) if g.size else 1.0
    denom = float(xp.linalg.norm(g)) * float(xp.linalg.norm(w))
    cos = float(g @ w) / denom if denom > 0 else (1.0 if bool(xp.allclose(g, w)) else 0.0)
    finite = bool(xp.isfinite(g).all())
    if frac < MIN_FRACTION_CLOSE or cos < MIN_COSINE or not finite:
        bad = int(xp.argmax(~close)) if not bool(close.all()) else 0
        return (f"output {name}: {100 * (1 - frac):.2f}% of elements outside tolerance, cosine {cos:.6f}, "
                f"max abs error {float(xp.nanmax(xp.abs(g - w))):.3g}; first bad index {bad}: "
                f"got {float(g[bad]):.6g}, expected {float(w[bad]):.6g}")
    return None


def _fail(tier: int, reason: str, stages: dict) -> dict:
    return {"tier": tier, "reason": reason, "stage_seconds": stages}


def check_correctness(backend, fn: Callable, task, trials: int, rng: np.random.Generator) -> tuple[int, str]:
    out_names = [o.name for o in task.outputs]
    for shape in task.shapes:
        for trial in range(trials):
            args = backend.make_args(task, shape, rng)
            expected = backend.reference(task, args)
            dev = backend.to_device(args)        # the kernel's own copies: `args` stays pristine
            rc = fn(dev)
            backend.synchronize()
            if rc != 0:
                return TIER_RUNTIME_ERROR, f"kf_forward returned {rc} on shape {shape}"
            for name in out_names:
                why = compare(name, dev[name], expected[name], task.rtol, task.atol)
                if why:
                    tier = TIER_WRONG_SHAPE if "has shape" in why else TIER_WRONG_VALUES
                    return tier, f"shape {shape} (trial {trial + 1}): {why}"
            for inp in task.inputs:
                a, b = dev[inp.name], args[inp.name]
                if _xp(a) is not _xp(b):
                    a, b = backend.to_host(a), backend.to_host(b)
                if not bool(_xp(a).array_equal(a, b, equal_nan=True)):
                    return TIER_WRONG_VALUES, f"shape {shape}: input {inp.name} was modified by the kernel"
    return TIER_CORRECT, ""


def _rotation(task, shape: str, cache_bytes: int) -> int:
    nbytes, _ = task.cost(shape)
    if nbytes <= 0:
        return 2
    return int(min(8, max(2, math.ceil(2 * cache_bytes / nbytes))))


def time_fn(backend, call: Callable[[int], Any], n_sets: int, warmup: int, repeats: int,
            max_repeats: int, min_time: float) -> list[float]:
    for i in range(warmup):
        call(i % n_sets)
    backend.synchronize()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_repeats and (len(times) < repeats or time.perf_counter() - start < min_time):
        i = len(times) % n_sets
        times.append(backend.time_call(lambda: call(i)))
    return times


def run_job(backend, fn: Callable, task, job: dict) -> dict:
    """Correctness on fresh inputs, then timing of kernel and reference on rotated inputs."""
    stages: dict[str, float] = {}
    rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))  # unpredictable inputs
    t0 = time.perf_counter()
    tier, reason = check_correctness(backend, fn, task, job["trials"], rng)
    stages["correctness"] = time.perf_counter() - t0
    sticky = backend.check_sticky_error()
    if sticky:
        return {**_fail(TIER_RUNTIME_ERROR, sticky, stages), "recycle": True}
    if tier != TIER_CORRECT:
        return _fail(tier, reason, stages)

    t0 = time.perf_counter()
    times, ref_times, spreads, facts = {}, {}, [], {}
    cache_bytes = job.get("cache_bytes", 32 << 20)
    for shape in task.shapes:
        n_sets = _rotation(task, shape, cache_bytes)
        sets = [backend.to_device(backend.make_args(task, shape, rng)) for _ in range(n_sets)]
        ts = time_fn(backend, lambda i: fn(sets[i]), n_sets, job["warmup"], job["repeats"],
                     job["max_repeats"], job["min_time"])
        med = float(np.median(ts))
        times[shape] = med
        q75, q25 = np.percentile(ts, [75, 25])
        spreads.append(float((q75 - q25) / med) if med > 0 else 0.0)
        key = (task.ref, shape, backend.name)
        if key not in _REF_TIMES:
            rts = time_fn(backend, lambda i: backend.reference(task, sets[i]), n_sets, 1, job["repeats"],
                          max(job["repeats"], job["max_repeats"] // 2), job["min_time"])
            _REF_TIMES[key] = float(np.median(rts))
        ref_times[shape] = _REF_TIMES[key]
        nbytes, flops = task.cost(shape)
        facts[shape] = {"gbps": nbytes / med / 1e9 if med > 0 else 0.0,
                        "gflops": flops / med / 1e9 if med > 0 else 0.0, "repeats": len(ts)}
        del sets
    stages["timing"] = time.perf_counter() - t0
    sticky = backend.check_sticky_error()
    if sticky:
        return {**_fail(TIER_RUNTIME_ERROR, sticky, stages), "recycle": True}
    return {"tier": TIER_CORRECT, "reason": "", "times": times, "ref_times": ref_times,
            "noise": float(max(spreads) if spreads else 0.0), "facts": {"per_shape": facts},
            "stage_seconds": stages}
