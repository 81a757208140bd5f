"""Timing over rotated input sets, with spot checks that the timed calls did their work.

Split from kfray/eval/measure.py: a kernel may behave differently when it senses a timing loop,
so every timed call is checked too, once the timing is over (`verify_timed_sets`).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np

from kfray.candidate import TIER_WRONG_VALUES
from kfray.eval.closeness import array_module, compare, host_array, indexable, tolerance
from kfray.eval.correctness import guard_error, input_changed

SPOTS = 64                  # output elements poisoned before, and read back after, each timed call


def rotation(task, shape: str, cache_bytes: int) -> int:
    """How many input sets to rotate through: enough (2 to 8) that together they overflow the cache."""
    nbytes, _ = task.cost(shape)
    if nbytes <= 0:
        return 2
    return int(min(8, max(2, math.ceil(2 * cache_bytes / nbytes))))


def time_fn(backend, call: Callable[[int], Any], n_sets: int, warmup: int, repeats: int,
            max_repeats: int, min_time: float, before: Callable[[int], Any] | None = None,
            after: Callable[[int], Any] | None = None, clock: Callable | None = None,
            starts: list[float] | None = None) -> list[float]:
    """Timed calls over rotated input sets; `before`/`after` run around each call, outside the timer.
    `clock` times one call (default: the backend's device timer). `starts` gets each timed call's
    start on the host clock: the cadence the kernel was called at."""
    clock = clock or backend.time_call
    for i in range(warmup):
        if before:
            before(i % n_sets)
        call(i % n_sets)
        if after:
            backend.synchronize()
            after(i % n_sets)
    backend.synchronize()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_repeats and (len(times) < repeats or time.perf_counter() - start < min_time):
        i = len(times) % n_sets
        if before:
            before(i)
        if starts is not None:
            starts.append(time.perf_counter())
        times.append(clock(lambda: call(i)))
        if after:
            after(i)
    return times


class Spots:
    """Random elements of each float output poisoned (NaN) before every timed call and read back
    right after it: a kernel that skips work when it senses a timing run, or leaves it running
    after it returns, leaves them NaN (or stale); the values are checked against the reference of
    their input set once the timing is over."""

    def __init__(self, task, sets: list[dict], rng: np.random.Generator):
        self.sets, self.rng = sets, rng
        self.names = [o.name for o in task.outputs
                      if all(indexable(s[o.name]) and s[o.name].dtype.kind == "f" and s[o.name].size for s in sets)]
        self.pending: dict[int, list] = {}
        self.records: list[tuple[int, str, np.ndarray, np.ndarray]] = []   # (set, output, indices, values)
        self.calls = 0
        self.used: set[int] = set()     # input sets the kernel was called on

    def poison(self, i: int) -> None:
        marks = []
        for n in self.names:
            a = self.sets[i][n]
            idx = self.rng.integers(0, a.size, size=min(SPOTS, a.size))
            xp = array_module(a)
            a.reshape(-1)[xp.asarray(idx)] = np.nan
            marks.append((n, idx))
        self.pending[i] = marks

    def read(self, i: int) -> None:
        self.calls += 1
        self.used.add(i)
        for n, idx in self.pending.pop(i, []):
            a = self.sets[i][n]
            xp = array_module(a)
            self.records.append((i, n, idx, host_array(a.reshape(-1)[xp.asarray(idx)]).astype(np.float64)))

    def verify(self, i: int, expected: dict, rtol: float, atol: float) -> tuple[int, int, str]:
        """(elements checked, elements wrong, first wrong) over the records of set i."""
        checked = wrong = 0
        first = ""
        for s, n, idx, vals in self.records:
            if s != i:
                continue
            w = host_array(expected[n].reshape(-1)[array_module(expected[n]).asarray(idx)]).astype(np.float64)
            ok = (np.abs(vals - w) <= atol + rtol * np.abs(w)) | (np.isnan(vals) & np.isnan(w))
            checked += ok.size
            wrong += int((~ok).sum())
            if not first and not ok.all():
                j = int(np.argmax(~ok))
                first = f"input set {i}, {n}[{int(idx[j])}]: got {vals[j]:.6g}, expected {w[j]:.6g}"
        return checked, wrong, first


def verify_timed_sets(backend, task, shape: str, hosts: list, sets: list, spots: Spots) -> tuple[int, str] | None:
    """After timing: every set's outputs, the spot values of every timed call, inputs and guards."""
    checked = wrong = 0
    first = ""
    mismatch = None
    for i, (h, d) in enumerate(zip(hosts, sets)):
        if i not in spots.used:          # few slow repeats: this set was never run
            continue
        why = guard_error(backend, d)
        if why:
            return TIER_WRONG_VALUES, f"shape {shape}, timed runs: {why}"
        for inp in task.inputs:
            why = input_changed(backend, inp.name, d[inp.name], h[inp.name])
            if why:
                return TIER_WRONG_VALUES, f"shape {shape}, timed runs: {why}"
        expected = backend.reference(task, h)
        c, w, f = spots.verify(i, expected, task.rtol, task.atol)
        checked, wrong, first = checked + c, wrong + w, first or f
        rtol, atol, every = tolerance(task)
        for o in task.outputs:
            why = None if mismatch else compare(o.name, d[o.name], expected[o.name], rtol, atol, every=every)
            if why:
                mismatch = (TIER_WRONG_VALUES, f"shape {shape}, after the timed runs (input set {i}): {why}; the "
                            "kernel must compute its outputs on every call, timed or not")
        del expected
    if wrong:                           # every element, as on the checked calls
        return TIER_WRONG_VALUES, (f"shape {shape}, timed runs: {wrong} of {checked} output elements checked right "
                                   f"after kf_forward returned were wrong or unwritten ({first}): the kernel skipped "
                                   "work when timed, returned results it cached, or left work running after it "
                                   "returned; every call must compute all of its outputs before returning")
    return mismatch
