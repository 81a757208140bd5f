"""Runners forked a job ahead, with their device opened.

A suite candidate's runner, and its reference's, each open a CUDA context before anything else,
about half a second on an H200. So at the start of each job, once it has taken its own runners,
the judge forks the next job's from its clean zygote, and they open their device and import what
a suite form loads while this job's checks run; the judge waits for them to finish before it
times anything, so that no spare works while a kernel is timed. A spare lives beside one
candidate before it serves the next: it is not dumpable (the zygote's flag), so that candidate
cannot trace it or read its memory, and all it can do is signal it; the next job takes only a
spare that is still running, not stopped, and has answered its warm-up, and kills the rest.
"""
from __future__ import annotations

import os

from kfray.eval.remote import RemoteRunner, RunnerFailed
from kfray.eval.spawner import process_state

WARM_TIMEOUT_S = 60.0


class Spares:
    def __init__(self, spawner, warm: dict):
        self.spawner, self.warm = spawner, warm      # warm: the request that opens the device
        self.ready: list[tuple[RemoteRunner, int | None]] = []   # (runner, its warm-up's seq until answered)
        self.made = 0                                 # runners this job asked for: the next gets as many

    def runner(self, deadline_s: float) -> RemoteRunner:
        """A spare that is warm and still well, else a fresh runner: one that failed, died or was
        stopped is killed and costs the candidate nothing."""
        self.made += 1
        while self.ready:
            r, seq = self.ready.pop(0)
            try:
                if seq is not None:
                    r.answer(seq, timeout=WARM_TIMEOUT_S, want_fds=False)
                if process_state(r.pid) not in ("S", "R", "D"):
                    raise RunnerFailed("not running")
            except (RunnerFailed, OSError):
                r.close()
                continue
            r.deadline_s, r.spare = deadline_s, True
            return r
        return RemoteRunner(self.spawner, deadline_s=deadline_s)

    def discard(self) -> None:
        """Kill the spares this job did not take."""
        for r, _ in self.ready:
            r.close()
        self.ready = []

    def refill(self) -> None:
        """The next job's runners, as many as this job took, each opening its device now. Only
        where the judge is its namespace's init: elsewhere it cannot end what a candidate started."""
        n, self.made = min(self.made, 2), 0       # a candidate's runner and its reference's
        self.discard()
        if os.getpid() != 1:
            return
        for _ in range(n):
            try:
                r = RemoteRunner(self.spawner, deadline_s=WARM_TIMEOUT_S)
                self.ready.append((r, r.post(self.warm)))
            except (RunnerFailed, OSError, RuntimeError):
                break

    def settle(self) -> None:
        """Wait until every spare has opened its device (before the judge times anything)."""
        kept = []
        for r, seq in self.ready:
            try:
                if seq is not None:
                    r.answer(seq, timeout=WARM_TIMEOUT_S, want_fds=False)
                kept.append((r, None))
            except (RunnerFailed, OSError):
                r.close()
        self.ready = kept

    def pids(self) -> set[int]:
        return {r.pid for r, _ in self.ready}


def new_runner(spawner, deadline_s: float) -> RemoteRunner:
    """The next runner for this job: a spare where the judge keeps them (`spawner.spares`)."""
    spares = getattr(spawner, "spares", None)
    if spares is not None:
        return spares.runner(deadline_s)
    return RemoteRunner(spawner, deadline_s=deadline_s)


def settle_spares(runner) -> None:
    """Before the judge times a kernel run by `runner`: the spares of its judge are warm and idle."""
    spares = getattr(getattr(runner, "spawner", None), "spares", None)
    if spares is not None:
        spares.settle()
