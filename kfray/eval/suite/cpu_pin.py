"""Both sides' runners on one CPU while they are timed. A launch-bound model (hundreds of small
kernels a call) runs at the speed its process gets from the core it is on; two runners left where
the scheduler put them compared a reference with itself at 0.51x on an H100 (24_EfficientNetB2:
every block of the kernel's runner slower, every block of the reference's the same). The two never
run at once (the candidate's processes are stopped while the reference is timed), so one core
serves both alike. The core is not the judge's own nor its hyperthread sibling."""
from __future__ import annotations

import os
from pathlib import Path


def cpu_of(pid: int) -> int | None:
    """The CPU `pid` last ran on (/proc/<pid>/stat, field 39); None where it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return int(text[text.rindex(")") + 2:].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def siblings(cpu: int) -> set[int]:
    """`cpu` and the hardware threads that share its core."""
    out = {cpu}
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return out
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def pin_together(pids: list[int]) -> int | None:
    """Every pid's main thread on one CPU of this process's set: the first pid's current one when
    it is not on the judge's core, else the first other. None (nothing changed) where there is no
    such CPU or the kernel refuses."""
    try:
        allowed = os.sched_getaffinity(0)
    except OSError:
        return None
    here = cpu_of(os.getpid())
    free = sorted(allowed - (siblings(here) if here is not None else set()))
    if not free or not pids:
        return None
    now = cpu_of(pids[0])
    cpu = now if now in free else free[0]
    try:
        for pid in pids:
            os.sched_setaffinity(pid, {cpu})
    except OSError:
        return None
    return cpu
