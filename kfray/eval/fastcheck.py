"""The harness's own checks in native code (kfray/eval/fastcheck.c), for host arrays.

Judging a kernel's output with numpy takes about twenty passes over it, and comparing inputs with
`np.array_equal` makes a boolean array first: on the built-in tasks' multi-megabyte buffers these
checks cost more than the kernels they judge, and they run a dozen times per evaluation. The C
helper computes every figure of the closeness rule in one pass; input checks are a `memcmp`.

The helper is built once per machine with the system C compiler into the compile cache, outside
the sandbox (`ensure_built`; the worker is told where through KFRAY_FASTCHECK_LIB), and loaded by
the sandbox worker. Where it cannot be built, every
check runs in numpy with the same rule (tests/test_fastcheck.py holds both to the same verdicts).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
from pathlib import Path

import numpy as np

from kfray.eval.native_build import build_once, cache_root

SOURCE = Path(__file__).with_name("fastcheck.c")
FLAGS = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math", "-fPIC", "-shared"]


class Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("nan_g", "nan_w", "poison_g", "poison_w", "close",
                                               "not_close_unpaired", "first_not_close", "nonfinite_g",
                                               "finite_w")] + \
               [(n, ctypes.c_double) for n in ("dot", "gg", "ww", "sum_w_finite", "ww_finite",
                                                             "spread2", "err2")]


_state: dict = {}


def _path(root: Path | None = None) -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    return Path(root or cache_root()) / "native" / f"fastcheck-{digest}.so"


def ensure_built(root: Path | None = None) -> Path | None:
    """The helper's library, built if missing; None when no C compiler is present or the build
    fails (the numpy checks are used then)."""
    out = _path(root)
    if out.exists():
        return out
    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    return out if cc and build_once([cc, *FLAGS, str(SOURCE)], out) else None


def _lib():
    if "lib" not in _state:
        lib = None
        path = None
        if os.environ.get("KFRAY_FASTCHECK", "1") != "0":     # "0": the numpy checks (a test compares both)
            path = os.environ.get("KFRAY_FASTCHECK_LIB") or ensure_built()
        if path is not None and Path(path).exists():
            try:
                lib = ctypes.CDLL(str(path))
                for name in ("f32", "f64"):
                    f = getattr(lib, f"kf_close_{name}")
                    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_double,
                                  ctypes.c_double, ctypes.c_double, ctypes.POINTER(Stats)]
            except OSError:
                lib = None
        _state["lib"] = lib
        libc = ctypes.CDLL(None)
        libc.memcmp.restype = ctypes.c_int
        libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        _state["memcmp"] = libc.memcmp
    return _state["lib"]


def native_pair(g, w) -> str | None:
    """'f32' / 'f64' when the pair can be judged natively: contiguous host arrays of one float type."""
    if not (isinstance(g, np.ndarray) and isinstance(w, np.ndarray) and g.dtype == w.dtype
            and g.dtype in (np.float32, np.float64) and g.flags.c_contiguous and w.flags.c_contiguous):
        return None
    if _lib() is None:
        return None
    return "f32" if g.dtype == np.float32 else "f64"


def close_stats(g, w, rtol: float, atol: float, poison: float | None) -> Stats | None:
    """Every figure of the closeness rule for flat arrays g (output) and w (reference), or None
    where the native helper does not apply (the caller computes them in numpy)."""
    kind = native_pair(g, w)
    if kind is None:
        return None
    s = Stats()
    getattr(_state["lib"], f"kf_close_{kind}")(g.ctypes.data, w.ctypes.data, g.size, rtol, atol,
                                                 float(poison or 0.0), ctypes.byref(s))
    return s


def same_bytes(a, b) -> bool | None:
    """True when two contiguous host arrays of one type and shape hold the same bytes; None when
    that cannot be asked this way. Equal bytes mean equal arrays; unequal bytes may still be equal
    arrays (NaN payloads, -0.0), so a False is confirmed by the caller."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
            and a.shape == b.shape and a.flags.c_contiguous and b.flags.c_contiguous):
        return None
    _lib()
    return _state["memcmp"](a.ctypes.data, b.ctypes.data, a.nbytes) == 0
