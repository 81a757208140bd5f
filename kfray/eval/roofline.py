"""The roofline check: a timing faster than the hardware allows means the timing missed work.

Split from kfray/eval/measure.py; the device's ceilings are measured once per worker.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from kfray.config import kernel_threads

DEFAULT_ROOFLINE_FRACTION = 1.5
# A numpy copy that writes through the cache reads each destination line before writing it, so it
# moves 3 bytes for the 2 it is credited with; a kernel with streaming stores does not. The CPU
# ceiling is the copy's apparent rate times this (axpb's streaming seed ran at 1.6x of it).
WRITE_ALLOCATE_ALLOWANCE = 1.5

_CEILINGS: dict[str, Any] = {}        # measured once per worker: CPU copy bandwidth


def _cpu_copy_gbps(nbytes: float, n_sets: int, fresh: bool = False) -> float:
    """Copy bandwidth (read + write) of this process with the timed kernel's footprint: n_sets
    pairs of arrays of nbytes/2 each (at most 64 MiB each, already far beyond any cache), rotated
    like the kernel's input sets, so the cache helps the copy exactly as much as it can help the
    kernel. The fastest single copy counts (optimistic). 0.0 when there is no memory for it."""
    half = min(max(int(nbytes // 2) // 8, 1), (64 << 20) // 8)
    key = ("cpu_copy", half, n_sets)
    if fresh or key not in _CEILINGS:
        try:
            pairs = [(np.ones(half), np.empty(half)) for _ in range(n_sets)]
        except MemoryError:
            return 0.0
        best = float("inf")
        for k in range(max(3 * n_sets, 12)):
            src, dst = pairs[k % n_sets]
            t0 = time.perf_counter()
            np.copyto(dst, src)
            if k >= n_sets:                       # the first pass only warms up
                best = min(best, time.perf_counter() - t0)
        _CEILINGS[key] = 2 * half * 8 / best / 1e9
        del pairs
    return _CEILINGS[key]


def _device_facts(backend, job: dict) -> dict:
    facts = job.get("device_facts")
    if isinstance(facts, dict):
        return facts
    if "device_facts" not in _CEILINGS:
        try:
            _CEILINGS["device_facts"] = dict(backend.device_facts())
        except Exception:
            _CEILINGS["device_facts"] = {}
    return _CEILINGS["device_facts"]


def roofline_flags(backend, task, job: dict, per_shape: dict, rotated: dict) -> tuple[list[str], dict]:
    """Flags for shapes whose achieved rate exceeds the bound times the device's ceilings."""
    bound = float(getattr(backend.cfg, "max_roofline_fraction", DEFAULT_ROOFLINE_FRACTION) or 0.0)
    info: dict[str, Any] = {"bound": bound}
    if bound <= 0:
        info["note"] = "eval.max_roofline_fraction is 0: no roofline check"
        return [], info
    facts = _device_facts(backend, job)
    cache_bytes = int(job.get("cache_bytes", facts.get("cache_bytes", 32 << 20)) or 0)
    device_bw = float(facts.get("copy_bandwidth_gbps") or 0.0)
    rate = float(facts.get("fp32_matmul_tflops") or 0.0) * 1e3
    threads = kernel_threads(backend.cfg) if hasattr(backend.cfg, "evaluators") else \
        max(1, int(getattr(backend.cfg, "threads", 1) or 1))
    measure_here = not device_bw and backend.hardware_class() == "cpu"
    if measure_here:
        info["copy_gbps_source"] = (f"numpy copy in the sandbox with each shape's footprint and rotation, "
                                    f"x {threads} thread(s), x {WRITE_ALLOCATE_ALLOWANCE:g} for the copy's write-allocate reads")
    elif device_bw:
        info["copy_gbps"] = round(device_bw, 2)
    else:
        info["note"] = "no copy bandwidth known for this device: the bandwidth bound is not checked"
    if rate:
        info["fp32_gflops"] = round(rate, 1)
    else:
        info["note"] = (info.get("note", "") + "; " if info.get("note") else "") + \
            "no fp32 rate known for this device: the flop-rate bound is not checked"
    flags = []
    for shape, f in per_shape.items():
        nbytes, flops = task.cost(shape)
        n_sets = rotated.get(shape, (0, 0))[1]
        if measure_here and nbytes > 0:
            scale = threads * WRITE_ALLOCATE_ALLOWANCE
            bw = _cpu_copy_gbps(nbytes, n_sets) * scale
            if bw and f["gbps"] > bound * bw:   # measure again before accusing: the machine was busy?
                bw = max(bw, _cpu_copy_gbps(nbytes, n_sets, fresh=True) * scale)
            if bw:
                f["copy_gbps"] = round(bw, 2)
        else:        # a device figure holds for DRAM only: not when the rotated sets fit in its cache
            bw = device_bw if rotated.get(shape, (0, 0))[0] >= 2 * cache_bytes else 0.0
        if bw and nbytes > 0 and f["gbps"] > bound * bw:
            flags.append(f"roofline: shape {shape} moved {f['gbps']:.1f} GB/s, above {bound:g} x the measured copy "
                         f"bandwidth ({bw:.1f} GB/s)")
        if rate and flops > 0 and f["gflops"] > bound * rate:
            flags.append(f"roofline: shape {shape} ran {f['gflops']:.1f} GFLOP/s, above {bound:g} x the measured "
                         f"fp32 rate ({rate:.1f} GFLOP/s)")
    return flags, info
