"""When a kernel's output counts as the reference's: the comparison rules of kfray/eval/measure.py.

Kept apart, below both the measurement driver and the torch.compile baseline, because both judge
outputs by the same rule (and the baseline must not import the driver that imports it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kfray.eval import fastcheck

MIN_FRACTION_CLOSE = 0.99
MIN_COSINE = 0.99985
MIN_EXPLAINED = 0.95        # share of the reference's variation about its mean an output must reproduce
EXPLAINED_MIN_SPREAD_ULPS = 1000   # ...where that variation exceeds this many ulps (relative) of the dtype


def array_module(a):
    """The array module of `a`: cupy for device arrays (checks run where the data is), else numpy."""
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def indexable(a) -> bool:
    """numpy or cupy arrays: the harness can poison and read single elements in place."""
    return isinstance(a, np.ndarray) or type(a).__module__.startswith("cupy")


def host_array(a) -> np.ndarray:
    """A numpy copy of a host or device array: small reads (spot values) are compared on the host."""
    if type(a).__module__.startswith("cupy"):
        return a.get()
    return np.asarray(a)


def tolerance(task) -> tuple[float, float, bool]:
    """(rtol, atol, every element) for a task: every element within atol + rtol * |ref|, at the
    suite's own tolerance for a suite's task, at the task's stated one otherwise. No share of the
    elements is pardoned (a race that corrupts one element in 20,000 is wrong); the cosine and
    explained-variation rules that follow are further guards, never a pardon."""
    suite = getattr(task, "suite", None)
    if suite is not None:
        return suite.rtol, suite.atol, True
    return task.rtol, task.atol, True


def compare(name: str, got, want, rtol: float, atol: float, poison: float | None = None,
            every: bool = False) -> str | None:
    """None when `got` matches `want`; otherwise a short reason for the prompt.

    `poison`: the magnitude of the finite poison written into the output before the call, if any.
    `every`: the suites' rule first: every element within atol + rtol * |ref| (torch.allclose)."""
    if tuple(got.shape) != tuple(want.shape):
        return f"output {name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    xp = array_module(got)
    g, w = xp.asarray(got).ravel(), xp.asarray(want).ravel()     # device-memory views (USM) read to the host
    if g.dtype.kind != "f" or g.dtype.itemsize < 4 or w.dtype != g.dtype:     # ints, halves: judged in float64
        g, w = g.astype(xp.float64), w.astype(xp.float64)
    s = fastcheck.close_stats(g, w, rtol, atol, poison) or _stats(g, w, rtol, atol, poison, xp)
    unwritten = s.nan_g - s.nan_w
    if unwritten > 0:
        return f"output {name}: {unwritten} of {g.size} elements were never written (still NaN) or NaN"
    held = s.poison_g - s.poison_w
    if poison is not None and g.size and held > 0:
        return (f"output {name}: {held} of {g.size} elements still hold the value the harness wrote there "
                f"before the call ({poison:.3g}): never written, or combined with what was there "
                f"(y[i] += ..., y[i] = max(y[i], ...)); compute every output element from the inputs alone")
    bad = max(s.first_not_close, 0)
    if every and s.not_close_unpaired:
        return (f"output {name}: {g.size - s.close} of {g.size} elements outside tolerance, atol={atol:g} + "
                f"rtol={rtol:g}*|ref| (every element must be within it); max abs error "
                f"{_max_error(g, w, xp):.3g}; first bad index {bad}: got {float(g[bad]):.6g}, "
                f"expected {float(w[bad]):.6g}")
    frac = s.close / g.size if g.size else 1.0
    denom = math.sqrt(s.gg) * math.sqrt(s.ww)
    cos = s.dot / denom if denom > 0 else (1.0 if bool(xp.allclose(g, w)) else 0.0)
    if frac < MIN_FRACTION_CLOSE or not math.isfinite(cos) or cos < MIN_COSINE or s.nonfinite_g:
        return (f"output {name}: {100 * (1 - frac):.2f}% of elements outside tolerance, cosine {cos:.6f}, "
                f"max abs error {_max_error(g, w, xp):.3g}; first bad index {bad}: "
                f"got {float(g[bad]):.6g}, expected {float(w[bad]):.6g}")
    return _unexplained(name, getattr(want, "dtype", np.dtype(np.float64)), s)


def _max_error(g, w, xp) -> float:
    """The largest |g - w| that is not NaN, for a failure's message (NaN when there is none)."""
    d = xp.abs(g - w)
    d = d[~xp.isnan(d)]
    return float(d.max()) if d.size else float("nan")


@dataclass
class _NumpyStats:
    """The figures kfray/eval/fastcheck.c computes in one pass, here with array operations (device
    arrays, and hosts where the helper could not be built)."""
    nan_g: int
    nan_w: int
    poison_g: int
    poison_w: int
    close: int
    not_close_unpaired: int
    first_not_close: int
    nonfinite_g: int
    finite_w: int
    dot: float
    gg: float
    ww: float
    sum_w_finite: float
    ww_finite: float
    spread2: float      # over finite reference elements: sum (w - mean)^2
    err2: float         # ...and sum (g - w)^2


def _stats(g, w, rtol: float, atol: float, poison: float | None, xp) -> _NumpyStats:
    nan_g, nan_w = xp.isnan(g), xp.isnan(w)
    if poison is not None and g.size:
        pg, pw = int((xp.abs(g) == poison).sum()), int((xp.abs(w) == poison).sum())
    else:
        pg = pw = 0
    diff = xp.abs(g - w)
    close = diff <= atol + rtol * xp.abs(w)
    not_close = ~close
    any_bad = bool(not_close.any())
    finite_w = xp.isfinite(w)
    wf = w[finite_w] if not bool(finite_w.all()) else w
    dot, gg, ww = sums64(g, w, xp)
    n_fin = int(finite_w.sum())
    g64, w64 = (g[finite_w] if wf is not w else g).astype(xp.float64), wf.astype(xp.float64)
    sum_w = float(w64.sum())
    d, e = w64 - (sum_w / n_fin if n_fin else 0.0), g64 - w64
    return _NumpyStats(
        nan_g=int(nan_g.sum()), nan_w=int(nan_w.sum()), poison_g=pg, poison_w=pw, close=int(close.sum()),
        not_close_unpaired=int((not_close & ~(nan_g & nan_w)).sum()),
        first_not_close=int(xp.argmax(not_close)) if any_bad else -1,
        nonfinite_g=int((~xp.isfinite(g)).sum()), finite_w=n_fin, dot=dot, gg=gg, ww=ww,
        sum_w_finite=sum_w, ww_finite=float(w64 @ w64), spread2=float(d @ d), err2=float(e @ e))


CHUNK = 1 << 16     # elements per float64 block: sums stay exact-ish without a float64 copy of the array


def sums64(g, w, xp) -> tuple[float, float, float]:
    """(g.w, g.g, w.w) accumulated in float64, a block at a time: a float32 dot product over
    millions of elements loses the digits the cosine rule needs; a whole float64 copy costs more
    than the kernel being judged."""
    if g.dtype == xp.float64 or xp is not np:
        g64, w64 = g.astype(xp.float64, copy=False), w.astype(xp.float64, copy=False)
        return float(g64 @ w64), float(g64 @ g64), float(w64 @ w64)
    dot = gg = ww = 0.0
    for i in range(0, g.size, CHUNK):
        a, b = g[i:i + CHUNK].astype(np.float64), w[i:i + CHUNK].astype(np.float64)
        dot += float(a @ b)
        gg += float(a @ a)
        ww += float(b @ b)
    return dot, gg, ww


def _unexplained(name: str, dtype, s) -> str | None:
    """The variance-explained rule: the error must be small against the reference's own spread.

    A loose tolerance on a reference whose elements are all nearly equal (softmax over many columns
    of small inputs: every output near 1/cols) accepts a constant; this does not. It applies only
    where the spread is well above the dtype's rounding, so exact-but-rounded results always pass.
    Sums over the elements whose reference is finite, in float64."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f" or s.finite_w < 2:
        return None
    spread, scale, err = math.sqrt(max(s.spread2, 0.0)), math.sqrt(s.ww_finite), math.sqrt(s.err2)
    if spread <= EXPLAINED_MIN_SPREAD_ULPS * float(np.finfo(dtype).eps) * scale:
        return None
    unexplained = (err / spread) ** 2
    if unexplained <= 1 - MIN_EXPLAINED:
        return None
    return (f"output {name}: within the tolerance, but it reproduces only {max(0.0, 100 * (1 - unexplained)):.1f}% "
            f"of the reference's variation about its mean (error norm {err:.3g} against a spread of {spread:.3g}; "
            f"{100 * MIN_EXPLAINED:.0f}% needed): a near-constant output on a low-variance reference is not a result")
