"""What the OS says the judge and a candidate's processes did during one request: CPU time and
run-queue waits, from /proc and the process CPU clocks. kfray.eval.remote reads them before and
after every call it times (two snapshots a call, a few hundred calls a problem), so the /proc files
stay open and are re-read in place: opening each file anew cost most of a snapshot's 46 us.
"""
from __future__ import annotations

import os
import threading
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_MAX_OPEN = 256                  # a kernel that forks hundreds of processes must not run the judge out of files


class _ProcFiles:
    """/proc files kept open, each re-read from its start (the kernel writes it afresh on every
    read). A file whose process has gone reads as an error; it is opened once more by its path,
    which then names whatever process has that number now."""

    def __init__(self):
        self.fds: dict[str, int] = {}
        self.lock = threading.Lock()

    def read(self, path: str, key: str = "") -> str:
        """`path`'s text; `key` names the open file where the path alone does not (/proc/thread-self
        is another file in each thread)."""
        key = key or path
        with self.lock:
            for again in (False, True):
                fd = self.fds.get(key)
                if fd is None:
                    if len(self.fds) >= _MAX_OPEN:
                        self._close_all()
                    fd = self.fds[key] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    return os.pread(fd, 4096, 0).decode()
                except OSError:
                    os.close(self.fds.pop(key))
                    if again:
                        raise
            raise AssertionError("unreachable")

    def _close_all(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


_FILES = _ProcFiles()


def _schedstat(path: str, key: str = "") -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of one thread, 0 where unknown."""
    try:
        ran, waited = _FILES.read(path, key).split()[:2]
        return int(ran) / 1e9, int(waited) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def _stat_ticks(pid: int, first: int) -> float:
    """Two CPU-time fields of /proc/<pid>/stat from `first` (11: utime + stime, 13: the waited-for
    children's cutime + cstime), in seconds; 0 where unreadable."""
    try:
        fields = _FILES.read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
        return (int(fields[first]) + int(fields[first + 1])) / _TICK
    except (OSError, ValueError, IndexError):
        return 0.0


def _process_cpu(pid: int) -> float:
    """CPU seconds of every thread of process `pid` (its process CPU-time clock, as
    clock_getcpuclockid gives it); 0 where it cannot be read."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        return _stat_ticks(pid, 11)       # a zombie: its clock is gone, its ticks are not


def _children_cpu(pid: int) -> float:
    """CPU seconds of the children process `pid` has waited for: a spinner that exits before the
    judge looks again is counted there."""
    return _stat_ticks(pid, 13)


def candidate_cpu(runner_pid: int, zygote_pid: int = 0) -> float:
    """CPU seconds of the candidate's processes: the runner, and where the judge is its PID
    namespace's init, every other process in it (what the kernel forked, or their waited-for
    children) but the zygote. A kernel's forked spinners are counted like its threads."""
    if os.getpid() != 1:
        return _process_cpu(runner_pid) + _children_cpu(runner_pid)
    from kfray.eval.spawner import others_in_namespace

    total = 0.0
    for pid in others_in_namespace(zygote_pid):
        total += _process_cpu(pid) + _children_cpu(pid)
    return total + _children_cpu(1)      # orphans the judge reaped (a constant, but for this call's)


def cpu_snapshot(runner_pid: int, zygote_pid: int = 0) -> tuple[float, float, float, float]:
    """(the judge thread's run-queue wait, the runner request thread's CPU time and run-queue wait,
    the candidate's processes' CPU time), seconds, from /proc schedstat and the CPU clocks."""
    judge = _schedstat("/proc/thread-self/schedstat", f"thread {threading.get_native_id()}")
    ran, waited = _schedstat(f"/proc/{runner_pid}/task/{runner_pid}/schedstat")
    return judge[1], ran, waited, candidate_cpu(runner_pid, zygote_pid)


def waits_allowed(before: tuple, after: tuple) -> float:
    """Seconds of a request the outside clock may put down to waiting for a CPU: what the judge's
    thread and the runner's request thread stood runnable but off a CPU (on a busy host a request
    waits that long on top of the wire), less the CPU time the runner's other threads used
    meanwhile. A kernel could otherwise make those waits itself (threads or processes of its own
    that keep its request thread off the CPU while another does the work) and claim the time as
    waiting."""
    waits = (after[0] - before[0]) + (after[2] - before[2])
    others = (after[3] - before[3]) - (after[1] - before[1])
    return max(0.0, waits - max(0.0, others))
