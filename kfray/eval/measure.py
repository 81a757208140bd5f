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

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from kfray.candidate import TIER_CORRECT, TIER_RUNTIME_ERROR, TIER_WRONG_SHAPE, TIER_WRONG_VALUES

MIN_FRACTION_CLOSE = 0.99
MIN_COSINE = 0.99985
MIN_EXPLAINED = 0.95        # share of the reference's variation about its mean an output must reproduce
EXPLAINED_MIN_SPREAD_ULPS = 1000   # ...where that variation exceeds this many ulps (relative) of the dtype
SPOTS = 64                  # output elements poisoned before, and read back after, each timed call
LATE_WRITE_WAIT_S = (0.005, 0.05)  # pause before looking again at outputs: min, max (2x the call between)
DEFAULT_ROOFLINE_FRACTION = 1.5

_REF_TIMES: dict[tuple, float] = {}   # (task ref, shape) -> reference seconds, per worker lifetime
_CEILINGS: dict[str, Any] = {}        # measured once per worker: CPU copy bandwidth
_KEEP: list = []                      # buffers of the last failing calls: a stray thread may still write there


def _xp(a):
    """The array module of `a`: cupy for device arrays (checks run where the data is), else numpy."""
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def _indexable(a) -> bool:
    """numpy or cupy arrays: the harness can poison and read single elements in place."""
    return isinstance(a, np.ndarray) or type(a).__module__.startswith("cupy")


def _host(a) -> np.ndarray:
    if type(a).__module__.startswith("cupy"):
        return a.get()
    return np.asarray(a)


def tolerance(task) -> tuple[float, float, bool]:
    """(rtol, atol, every element) for a task: a suite's task is held to the suite's own rule,
    allclose over every element at its tolerance, before kfray's rules; other tasks to kfray's."""
    suite = getattr(task, "suite", None)
    if suite is not None:
        return suite.rtol, suite.atol, True
    return task.rtol, task.atol, False


def compare(name: str, got, want, rtol: float, atol: float, poison: float | None = None,
            every: bool = False) -> str | None:
    """None when `got` matches `want`; otherwise a short reason for the prompt.

    `poison`: the magnitude of the finite poison written into the output before the call, if any.
    `every`: the suites' rule first: every element within atol + rtol * |ref| (torch.allclose)."""
    if tuple(got.shape) != tuple(want.shape):
        return f"output {name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    xp = _xp(got)
    g = got.astype(xp.float64).ravel()
    w = xp.asarray(want).astype(xp.float64).ravel()
    unwritten = int(xp.isnan(g).sum()) - int(xp.isnan(w).sum())
    if unwritten > 0:
        return f"output {name}: {unwritten} of {g.size} elements were never written (still NaN) or NaN"
    if poison is not None and g.size:
        held = int((xp.abs(g) == poison).sum()) - int((xp.abs(w) == poison).sum())
        if held > 0:
            return (f"output {name}: {held} of {g.size} elements still hold the value the harness wrote there "
                    f"before the call ({poison:.3g}): never written, or combined with what was there "
                    f"(y[i] += ..., y[i] = max(y[i], ...)); compute every output element from the inputs alone")
    close = xp.abs(g - w) <= atol + rtol * xp.abs(w)
    if every and not bool((close | (xp.isnan(g) & xp.isnan(w))).all()):
        bad = int(xp.argmax(~close))
        return (f"output {name}: {int((~close).sum())} of {g.size} elements outside atol={atol:g} + rtol={rtol:g}*|ref| "
                f"(the suite's rule: allclose over every element); max abs error "
                f"{float(xp.nanmax(xp.abs(g - w))):.3g}; first bad index {bad}: got {float(g[bad]):.6g}, "
                f"expected {float(w[bad]):.6g}")
    frac = float(close.mean()) if g.size else 1.0
    denom = float(xp.linalg.norm(g)) * float(xp.linalg.norm(w))
    cos = float(g @ w) / denom if denom > 0 else (1.0 if bool(xp.allclose(g, w)) else 0.0)
    finite = bool(xp.isfinite(g).all())
    if frac < MIN_FRACTION_CLOSE or cos < MIN_COSINE or not finite:
        bad = int(xp.argmax(~close)) if not bool(close.all()) else 0
        return (f"output {name}: {100 * (1 - frac):.2f}% of elements outside tolerance, cosine {cos:.6f}, "
                f"max abs error {float(xp.nanmax(xp.abs(g - w))):.3g}; first bad index {bad}: "
                f"got {float(g[bad]):.6g}, expected {float(w[bad]):.6g}")
    return _unexplained(name, g, w, getattr(want, "dtype", np.dtype(np.float64)), xp)


def _unexplained(name: str, g, w, dtype, xp) -> str | None:
    """The variance-explained rule: the error must be small against the reference's own spread.

    A loose tolerance on a reference whose elements are all nearly equal (softmax over many columns
    of small inputs: every output near 1/cols) accepts a constant; this does not. It applies only
    where the spread is well above the dtype's rounding, so exact-but-rounded results always pass."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f" or w.size < 2:
        return None
    ok = xp.isfinite(w)
    if not bool(ok.all()):
        g, w = g[ok], w[ok]
        if w.size < 2:
            return None
    spread = float(xp.linalg.norm(w - w.mean()))
    scale = float(xp.linalg.norm(w))
    if spread <= EXPLAINED_MIN_SPREAD_ULPS * float(np.finfo(dtype).eps) * scale:
        return None
    err = float(xp.linalg.norm(g - w))
    unexplained = (err / spread) ** 2
    if unexplained <= 1 - MIN_EXPLAINED:
        return None
    return (f"output {name}: within the tolerance, but it reproduces only {max(0.0, 100 * (1 - unexplained)):.1f}% "
            f"of the reference's variation about its mean (error norm {err:.3g} against a spread of {spread:.3g}; "
            f"{100 * MIN_EXPLAINED:.0f}% needed): a near-constant output on a low-variance reference is not a result")


def _fail(tier: int, reason: str, stages: dict, **extra) -> dict:
    return {"tier": tier, "reason": reason, "stage_seconds": stages, **extra}


# --- poison, snapshots, inputs ----------------------------------------------------------------------
def _finite_poison(rng: np.random.Generator) -> float:
    """A large finite value, different in every evaluation, written with alternating signs."""
    return float(np.float32(rng.uniform(1e29, 1e30)))


def _poison_outputs(args: dict[str, Any], task, value: float) -> None:
    for o in task.outputs:
        a = args[o.name]
        if _indexable(a) and a.dtype.kind == "f" and a.size:
            flat = a.reshape(-1)
            flat[0::2] = value
            flat[1::2] = -value


def _snapshot(backend, a):
    return a.copy() if _indexable(a) else backend.to_host(a).copy()


def _unchanged(backend, a, snap) -> bool:
    if not _indexable(a):
        a = backend.to_host(a)
    xp = _xp(a)
    return bool(xp.array_equal(a, snap, equal_nan=True))


def _input_changed(backend, name: str, a, b) -> str | None:
    """None when input `a` (the kernel's copy) still equals `b` (the harness's pristine one)."""
    if _xp(a) is not _xp(b) or not _indexable(a):
        a, b = backend.to_host(a), backend.to_host(b)
    xp = _xp(a)
    if bool(xp.array_equal(a, b, equal_nan=True)):
        return None
    diff = a != b
    if a.dtype.kind == "f":
        diff &= ~(xp.isnan(a) & xp.isnan(b))
    diff = diff.ravel()
    n, first = int(diff.sum()), int(xp.argmax(diff))
    return (f"input {name} was modified by the kernel ({n} of {a.size} elements changed, first at index {first}: "
            f"was {float(b.ravel()[first]):.6g}, now {float(a.ravel()[first]):.6g}); inputs are read-only, "
            f"write results only to the outputs")


def _guards(backend, dev: dict[str, Any]) -> str | None:
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
    out = _judge(backend, task, shape, args, dev, rc, call_s, poison)
    if out[0] != TIER_CORRECT:
        _hold(dev)     # a failing kernel may have left a thread behind that still writes into these
    return out


def _hold(dev: dict) -> None:
    _KEEP.append(dev)
    del _KEEP[:-4]


def _judge(backend, task, shape: str, args: dict, dev: dict, rc, call_s: float,
           poison: float | None) -> tuple[int, str, dict]:
    if rc != 0:
        return TIER_RUNTIME_ERROR, f"kf_forward returned {rc} on shape {shape}", {}
    out_names = [o.name for o in task.outputs]
    snaps = {n: _snapshot(backend, dev[n]) for n in out_names}
    time.sleep(min(LATE_WRITE_WAIT_S[1], max(LATE_WRITE_WAIT_S[0], 2 * call_s)))
    backend.synchronize()
    for n in out_names:
        if not _unchanged(backend, dev[n], snaps[n]):    # the worker is recycled after this
            return (TIER_RUNTIME_ERROR, f"shape {shape}: output {n} changed after kf_forward returned: work was "
                    "still running (another thread, stream or queue) that a timer would not count; all work must "
                    "be complete when kf_forward returns", {"recycle": True})
    why = _guards(backend, dev)
    if why:
        return TIER_WRONG_VALUES, f"shape {shape}: {why}", {}
    # The reference runs now, after the kernel: its outputs never exist while the kernel runs.
    expected = backend.reference(task, args)
    rtol, atol, every = tolerance(task)
    for n in out_names:
        why = compare(n, snaps[n], expected[n], rtol, atol, poison, every=every)
        if why:
            tier = TIER_WRONG_SHAPE if "has shape" in why else TIER_WRONG_VALUES
            return tier, f"shape {shape}: {why}", {}
    for inp in task.inputs:
        why = _input_changed(backend, inp.name, dev[inp.name], args[inp.name])
        if why:
            return TIER_WRONG_VALUES, f"shape {shape}: {why}", {}
    return TIER_CORRECT, "", {}


def check_correctness(backend, fn: Callable, task, trials: int, rng: np.random.Generator) -> tuple[int, str]:
    tier, reason, _ = _check_all(backend, fn, task, trials, rng)
    return tier, reason


def _check_all(backend, fn, task, trials: int, rng) -> tuple[int, str, dict]:
    for shape in task.shapes:
        for trial in range(trials):
            poison = None if trial % 2 == 0 else _finite_poison(rng)   # NaN, then a finite value
            tier, why, extra = check_once(backend, fn, task, shape, rng, poison)
            if tier != TIER_CORRECT:
                return tier, why.replace(f"shape {shape}", f"shape {shape} (trial {trial + 1})", 1), extra
    return TIER_CORRECT, "", {}


# --- timing ---------------------------------------------------------------------------------------
def _rotation(task, shape: str, cache_bytes: int) -> int:
    nbytes, _ = task.cost(shape)
    if nbytes <= 0:
        return 2
    return int(min(8, max(2, math.ceil(2 * cache_bytes / nbytes))))


def time_fn(backend, call: Callable[[int], Any], n_sets: int, warmup: int, repeats: int,
            max_repeats: int, min_time: float, before: Callable[[int], Any] | None = None,
            after: Callable[[int], Any] | None = None) -> list[float]:
    """Timed calls over rotated input sets; `before`/`after` run around each call, outside the timer."""
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
        times.append(backend.time_call(lambda: call(i)))
        if after:
            after(i)
    return times


class _Spots:
    """Random elements of each float output poisoned (NaN) before every timed call and read back
    right after it: a kernel that skips work when it senses a timing run, or leaves it running
    after it returns, leaves them NaN (or stale); the values are checked against the reference of
    their input set once the timing is over."""

    def __init__(self, task, sets: list[dict], rng: np.random.Generator):
        self.sets, self.rng = sets, rng
        self.names = [o.name for o in task.outputs
                      if all(_indexable(s[o.name]) and s[o.name].dtype.kind == "f" and s[o.name].size for s in sets)]
        self.pending: dict[int, list] = {}
        self.records: list[tuple[int, str, np.ndarray, np.ndarray]] = []   # (set, output, indices, values)
        self.calls = 0
        self.used: set[int] = set()     # input sets the kernel was called on

    def poison(self, i: int) -> None:
        marks = []
        for n in self.names:
            a = self.sets[i][n]
            idx = self.rng.integers(0, a.size, size=min(SPOTS, a.size))
            xp = _xp(a)
            a.reshape(-1)[xp.asarray(idx)] = np.nan
            marks.append((n, idx))
        self.pending[i] = marks

    def read(self, i: int) -> None:
        self.calls += 1
        self.used.add(i)
        for n, idx in self.pending.pop(i, []):
            a = self.sets[i][n]
            xp = _xp(a)
            self.records.append((i, n, idx, _host(a.reshape(-1)[xp.asarray(idx)]).astype(np.float64)))

    def verify(self, i: int, expected: dict, rtol: float, atol: float) -> tuple[int, int, str]:
        """(elements checked, elements wrong, first wrong) over the records of set i."""
        checked = wrong = 0
        first = ""
        for s, n, idx, vals in self.records:
            if s != i:
                continue
            w = _host(expected[n].reshape(-1)[_xp(expected[n]).asarray(idx)]).astype(np.float64)
            ok = (np.abs(vals - w) <= atol + rtol * np.abs(w)) | (np.isnan(vals) & np.isnan(w))
            checked += ok.size
            wrong += int((~ok).sum())
            if not first and not ok.all():
                j = int(np.argmax(~ok))
                first = f"input set {i}, {n}[{int(idx[j])}]: got {vals[j]:.6g}, expected {w[j]:.6g}"
        return checked, wrong, first


def _verify_sets(backend, task, shape: str, hosts: list, sets: list, spots: _Spots) -> tuple[int, str] | None:
    """After timing: every set's outputs, the spot values of every timed call, inputs and guards."""
    checked = wrong = 0
    first = ""
    mismatch = None
    for i, (h, d) in enumerate(zip(hosts, sets)):
        if i not in spots.used:          # few slow repeats: this set was never run
            continue
        why = _guards(backend, d)
        if why:
            return TIER_WRONG_VALUES, f"shape {shape}, timed runs: {why}"
        for inp in task.inputs:
            why = _input_changed(backend, inp.name, d[inp.name], h[inp.name])
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
    if checked and wrong > (1 - MIN_FRACTION_CLOSE) * checked:
        return TIER_WRONG_VALUES, (f"shape {shape}, timed runs: {wrong} of {checked} output elements checked right "
                                   f"after kf_forward returned were wrong or unwritten ({first}): the kernel skipped "
                                   "work when timed, returned results it cached, or left work running after it "
                                   "returned; every call must compute all of its outputs before returning")
    return mismatch


# --- roofline -------------------------------------------------------------------------------------
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
    threads = max(1, int(getattr(backend.cfg, "threads", 1) or 1))
    measure_here = not device_bw and backend.hardware_class() == "cpu"
    if measure_here:
        info["copy_gbps_source"] = (f"numpy copy in the sandbox with each shape's footprint and rotation, "
                                    f"x {threads} thread(s)")
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
            bw = _cpu_copy_gbps(nbytes, n_sets) * threads
            if bw and f["gbps"] > bound * bw:   # measure again before accusing: the machine was busy?
                bw = max(bw, _cpu_copy_gbps(nbytes, n_sets, fresh=True) * threads)
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


# --- one job --------------------------------------------------------------------------------------
def run_job(backend, fn: Callable, task, job: dict) -> dict:
    """Correctness on fresh inputs, then timing of kernel and reference on rotated inputs, then
    checks that the timed runs computed what they should."""
    stages: dict[str, float] = {}
    rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))  # unpredictable inputs
    t0 = time.perf_counter()
    tier, reason, extra = _check_all(backend, fn, task, job["trials"], rng)
    stages["correctness"] = time.perf_counter() - t0
    sticky = backend.check_sticky_error()
    if sticky:
        return {**_fail(TIER_RUNTIME_ERROR, sticky, stages), "recycle": True}
    if tier != TIER_CORRECT:
        return _fail(tier, reason, stages, **extra)

    t0 = time.perf_counter()
    timings, compiled = Timings(), {}
    cache_bytes = job.get("cache_bytes", 32 << 20)
    for shape in task.shapes:
        n_sets = _rotation(task, shape, cache_bytes)
        hosts = [backend.make_args(task, shape, rng) for _ in range(n_sets)]   # pristine, for the reference
        sets = [backend.to_device(h) for h in hosts]
        spots = _Spots(task, sets, rng)
        codes: list = []

        def call(i: int) -> None:
            rc = fn(sets[i])
            if rc != 0:
                codes.append(rc)

        ts = time_fn(backend, call, n_sets, job["warmup"], job["repeats"], job["max_repeats"], job["min_time"],
                     before=spots.poison, after=spots.read)
        backend.synchronize()
        if codes:
            return _fail(TIER_RUNTIME_ERROR, f"kf_forward returned {codes[0]} during the timed runs on shape {shape}",
                         stages)
        bad = _verify_sets(backend, task, shape, hosts, sets, spots)
        if bad:
            return _fail(*bad, stages)
        key = (task.ref, shape, backend.name)
        if key not in _REF_TIMES:
            rts = time_fn(backend, lambda i: backend.reference(task, sets[i]), n_sets, 1, job["repeats"],
                          max(job["repeats"], job["max_repeats"] // 2), job["min_time"])
            _REF_TIMES[key] = float(np.median(rts))
        timings.add(task, shape, ts, n_sets, _REF_TIMES[key], spot_checked=spots.calls)
        if job.get("torch_compile"):     # the second baseline (kfray/eval/torch_compile.py)
            from kfray.eval.torch_compile import compiled_reference_time
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
        tier, why, extra = check_once(backend, fn, task, shape, rng, _finite_poison(rng))
        if tier != TIER_CORRECT:
            stages["recheck"] = time.perf_counter() - t0
            return _fail(tier, f"after the timed runs, a check on fresh inputs failed: {why}", stages, **extra)
    stages["recheck"] = time.perf_counter() - t0

    extra: dict[str, Any] = {}
    if compiled:
        from kfray.eval.torch_compile import compile_facts
        extra["torch_compile"] = compile_facts(compiled)
    return correct_result(backend, task, job, timings, stages, extra)


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
                   extra_facts: dict | None = None) -> dict:
    """The result of a kernel that passed every check. Its timing is checked against the roofline
    last: one faster than the hardware allows is kept but flagged, and its speedup not trusted."""
    t = timings
    flags, roof = roofline_flags(backend, task, job, t.facts, t.rotated)
    out_facts: dict[str, Any] = {"per_shape": t.facts, "roofline": roof, **(extra_facts or {})}
    reason = ""
    if flags:
        out_facts["flags"] = flags
        out_facts["untrusted"] = "; ".join(flags)
        reason = ("flagged, speedup not trusted (counts as 0): " + "; ".join(flags) +
                  ". Faster than the hardware allows means the timing missed work")
    return {"tier": TIER_CORRECT, "reason": reason, "times": t.times, "ref_times": t.ref_times,
            "noise": float(max(t.spreads) if t.spreads else 0.0), "facts": out_facts,
            "stage_seconds": stages}
