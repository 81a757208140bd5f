"""One judge at a time on a host, where asked: with KFRAY_TIMING_LOCK naming a file, a judge holds
an exclusive lock on it while it checks and times a candidate, so that evaluators of several runs,
or test workers that share the cores, never time side by side (their builds, loads and searches
go on meanwhile). Unset, as it is by default, nothing is locked: the evaluators of one run share
the cores as eval.threads sizes them. The wait is not the kernel's time: the job's deadline is
moved on by it."""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager

_depth = 0          # held already by this process: a nested turn would wait on itself, so it takes none


def _lock_file(path: str) -> int:
    """The lock file opened, or -1: a lock that cannot be opened must not cost the evaluation.
    Read-only is enough for flock, and all the sandbox's file view offers (eval/isolation.py)."""
    try:
        return os.open(path, os.O_RDONLY) if os.path.exists(path) else os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return -1


@contextmanager
def timing_turn(job: dict | None = None):
    global _depth
    path = os.environ.get("KFRAY_TIMING_LOCK", "")
    fd = _lock_file(path) if path and not _depth else -1
    try:
        if fd >= 0:
            t0 = time.perf_counter()
            fcntl.flock(fd, fcntl.LOCK_EX)
            waited = time.perf_counter() - t0
            if job and waited > 0.01 and job.get("extend") and job.get("call_deadline_s") and job.get("started"):
                job["extend"](time.perf_counter() - job["started"] + float(job["call_deadline_s"]))
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
    finally:
        if fd >= 0:
            os.close(fd)        # closing the file releases the lock
