"""CUDA-event timing of one call on the harness's stream, without the host's launch overhead.

Timing holds our stream with a spinning kernel (StreamHold) while fn launches, so CUDA events time
the device work back to back (NVBench's blocking-kernel method). A sample counts host wall time
instead when, after our stream finished, cudaDeviceSynchronize still waited this much longer than
on an idle device: work was left running on another stream.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

LEFT_RUNNING_SLACK_S = 20e-6
TIMING_HOLD_S = 0.02      # longest a timed call keeps the stream held (for kernels that sync inside)


def idle_sync_seconds(cp, samples: int = 30) -> float:
    """How long cudaDeviceSynchronize takes on an idle device (75th percentile): the baseline
    against which time_on_stream spots work left running elsewhere."""
    ts = []
    for _ in range(samples):
        t0 = time.perf_counter()
        cp.cuda.runtime.deviceSynchronize()
        ts.append(time.perf_counter() - t0)
    return float(np.percentile(ts, 75))


def time_on_stream(cp, stream, events, hold, idle_sync_s: float, fn: Callable[[], Any]) -> float:
    """Seconds of device work fn queues on `stream`, from CUDA events (`events`: start, stop).

    With the hold kernel (the usual case) the stream is held while fn launches and released
    once the stop event is queued, so the events time the device work back to back without the
    host's launch overhead. Work still running elsewhere after our stream finished makes the
    sample count host wall time, launch to completion; so does a large gap without a hold."""
    start, stop = events
    if hold is not None:
        hold.arm(stream, TIMING_HOLD_S)
    t0 = time.perf_counter()
    try:
        start.record(stream)
        fn()
        stop.record(stream)
    finally:
        if hold is not None:
            hold.release()
    stop.synchronize()
    t_stream = time.perf_counter()
    cp.cuda.runtime.deviceSynchronize()
    t1 = time.perf_counter()
    ev = cp.cuda.get_elapsed_time(start, stop) / 1e3
    wall = t1 - t0
    left_running = (t1 - t_stream) > idle_sync_s + LEFT_RUNNING_SLACK_S and wall > 1.5 * ev
    unheld_gap = hold is None and wall > 1.5 * ev + 50e-6
    if left_running or unheld_gap:
        return max(wall, ev)
    return ev
