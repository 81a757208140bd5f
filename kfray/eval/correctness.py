"""Correctness checks of one kernel call: poisoned outputs, late writes, guard zones, untouched inputs.

Split from kfray/eval/measure.py (whose docstring lists the hacks each check stops); the timed
runs reuse `input_changed` and `guard_error` to check their input sets afterwards.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from kfray.candidate import TIER_CORRECT, TIER_RUNTIME_ERROR, TIER_WRONG_SHAPE, TIER_WRONG_VALUES
from kfray.eval import fastcheck
from kfray.eval.closeness import array_module, compare, indexable, tolerance

LATE_WRITE_WAIT_S = (0.005, 0.05)  # pause before looking again at outputs: min, max (2x the call between)

_KEEP: list = []                      # buffers of the last failing calls: a stray thread may still write there


# --- poison, snapshots, inputs ----------------------------------------------------------------------
def finite_poison(rng: np.random.Generator) -> float:
    """A large finite value, different in every evaluation, written with alternating signs."""
    return float(np.float32(rng.uniform(1e29, 1e30)))


def _poison_outputs(args: dict[str, Any], task, value: float) -> None:
    for o in task.outputs:
        a = args[o.name]
        if indexable(a) and a.dtype.kind == "f" and a.size:
            flat = a.reshape(-1)
            flat[0::2] = value
            flat[1::2] = -value


def _snapshot(backend, a):
    return a.copy() if indexable(a) else backend.to_host(a).copy()


def same(a, b) -> bool:
    """Equal arrays, NaN equal to NaN: a memcmp for host buffers (the common case: the same bytes),
    the array comparison to confirm a difference or for device arrays."""
    if fastcheck.same_bytes(a, b):
        return True
    return bool(array_module(a).array_equal(a, b, equal_nan=True))


def _unchanged(backend, a, snap) -> bool:
    if not indexable(a):
        a = backend.to_host(a)
    return same(a, snap)


def input_changed(backend, name: str, a, b) -> str | None:
    """None when input `a` (the kernel's copy) still equals `b` (the harness's pristine one)."""
    if array_module(a) is not array_module(b) or not indexable(a):
        a, b = backend.to_host(a), backend.to_host(b)
    if same(a, b):
        return None
    xp = array_module(a)
    diff = a != b
    if a.dtype.kind == "f":
        diff &= ~(xp.isnan(a) & xp.isnan(b))
    diff = diff.ravel()
    n, first = int(diff.sum()), int(xp.argmax(diff))
    return (f"input {name} was modified by the kernel ({n} of {a.size} elements changed, first at index {first}: "
            f"was {float(b.ravel()[first]):.6g}, now {float(a.ravel()[first]):.6g}); inputs are read-only, "
            f"write results only to the outputs")


def guard_error(backend, dev: dict[str, Any]) -> str | None:
    """Why a write outside a buffer was seen, on backends that lay guard zones; else None."""
    check = getattr(backend, "check_guards", None)
    return check(dev) if check is not None else None


def check_once(backend, fn: Callable, task, shape: str, rng: np.random.Generator,
               poison: float | None) -> tuple[int, str, dict]:
    """One call on fresh inputs with poisoned outputs; (tier, reason, extra result keys)."""
    args = backend.make_args(task, shape, rng)      # outputs NaN; `args` stays pristine
    if poison is not None:
        _poison_outputs(args, task, poison)
    dev = backend.to_device(args)                   # the kernel's own copies
    t0 = time.perf_counter()
    rc = fn(dev)
    backend.synchronize()
    call_s = time.perf_counter() - t0
    apart = getattr(fn, "runner", None) is not None          # the kernel runs in a process of its own
    out = _judge(backend, task, shape, args, dev, rc, call_s, poison, apart)
    if out[0] != TIER_CORRECT:
        _hold(dev)     # a failing kernel may have left a thread behind that still writes into these
    return out


def _hold(dev: dict) -> None:
    _KEEP.append(dev)
    del _KEEP[:-4]


def _judge(backend, task, shape: str, args: dict, dev: dict, rc, call_s: float,
           poison: float | None, apart: bool = False) -> tuple[int, str, dict]:
    """`apart`: the kernel ran in a runner, a process that cannot read the judge's memory, so the
    reference is computed during the pause for late writes instead of after it (its outputs still
    never exist where the kernel could find them)."""
    if rc != 0:
        return TIER_RUNTIME_ERROR, f"kf_forward returned {rc} on shape {shape}", {}
    out_names = [o.name for o in task.outputs]
    snaps = {n: _snapshot(backend, dev[n]) for n in out_names}
    until = time.perf_counter() + min(LATE_WRITE_WAIT_S[1], max(LATE_WRITE_WAIT_S[0], 2 * call_s))
    expected = backend.reference(task, args) if apart else None
    time.sleep(max(0.0, until - time.perf_counter()))
    backend.synchronize()
    late = _late_write(backend, dev, snaps, out_names, shape)
    if late:
        return late
    why = guard_error(backend, dev)
    if why:
        return TIER_WRONG_VALUES, f"shape {shape}: {why}", {}
    # In the judge's own process, the reference runs now, after the kernel and its pause: its
    # outputs never exist while the kernel (or work it left running) could see them.
    if expected is None:
        expected = backend.reference(task, args)
    rtol, atol, every = tolerance(task)
    for n in out_names:
        why = compare(n, snaps[n], expected[n], rtol, atol, poison, every=every)
        if why:
            if _untouched(snaps[n], poison):     # not one element written yet: the write may still be coming
                time.sleep(LATE_WRITE_WAIT_S[1])
                backend.synchronize()
                late = _late_write(backend, dev, snaps, out_names, shape)
                if late:
                    return late
            tier = TIER_WRONG_SHAPE if "has shape" in why else TIER_WRONG_VALUES
            return tier, f"shape {shape}: {why}", {}
    for inp in task.inputs:
        why = input_changed(backend, inp.name, dev[inp.name], args[inp.name])
        if why:
            return TIER_WRONG_VALUES, f"shape {shape}: {why}", {}
    return TIER_CORRECT, "", {}


def _late_write(backend, dev: dict, snaps: dict, out_names: list[str], shape: str) -> tuple | None:
    """The verdict on a kernel whose outputs changed since their snapshot, taken when it returned."""
    for n in out_names:
        if not _unchanged(backend, dev[n], snaps[n]):    # the worker is recycled after this
            return (TIER_RUNTIME_ERROR, f"shape {shape}: output {n} changed after kf_forward returned: work was "
                    "still running (another thread, stream or queue) that a timer would not count; all work must "
                    "be complete when kf_forward returns", {"recycle": True})
    return None


def _untouched(snap, poison: float | None) -> bool:
    """Whether an output holds only what the judge put there before the call (NaN, or the poison's
    alternating signs). Looked at only once it failed: a thread that a busy host starts after the
    first pause (a detached one that sleeps first) has not written yet, and it is a late writer."""
    if not indexable(snap) or snap.dtype.kind != "f" or not snap.size:
        return False
    xp = array_module(snap)
    if poison is None:
        return bool(xp.isnan(snap).all())
    return bool((xp.abs(snap) == snap.dtype.type(poison)).all())


def check_correctness(backend, fn: Callable, task, trials: int, rng: np.random.Generator) -> tuple[int, str]:
    tier, reason, _ = check_all(backend, fn, task, trials, rng)
    return tier, reason


def check_all(backend, fn, task, trials: int, rng) -> tuple[int, str, dict]:
    for shape in task.shapes:
        for trial in range(trials):
            poison = None if trial % 2 == 0 else finite_poison(rng)   # NaN, then a finite value
            tier, why, extra = check_once(backend, fn, task, shape, rng, poison)
            if tier != TIER_CORRECT:
                return tier, why.replace(f"shape {shape}", f"shape {shape} (trial {trial + 1})", 1), extra
    return TIER_CORRECT, "", {}
