"""Runners forked ahead, between candidates, with their device opened.

A suite candidate's runner, and its reference's, each open a CUDA context before anything else
(`facts.runner_load_s.cuda_s` of a result). The judge forks the next job's runners from its clean
zygote as soon as the last candidate's processes are all dead (the judge, as its PID namespace's
init, has just killed every one of them), and they open their device while the judge frees what
that candidate held. A spare never shares the machine with a candidate before it serves one: the
next job takes the ones it needs before any of its candidate's code runs, and kills the rest.
"""
from __future__ import annotations

import os
import select

from kfray.eval.remote import RemoteRunner, RunnerFailed

WARM_TIMEOUT_S = 60.0


class Spares:
    def __init__(self, spawner, warm: dict):
        self.spawner, self.warm = spawner, warm      # warm: the request that opens the device
        self.ready: list[tuple[RemoteRunner, int]] = []
        self.made = 0                                 # runners this job asked for: the next gets as many

    def runner(self, deadline_s: float) -> RemoteRunner:
        """A spare, else a fresh runner. A spare still opening its device is taken as it is: the
        job's first request queues behind the warm-up, whose answer is read before that request's
        (`RemoteRunner.owed`); one that has answered is checked now, and one that failed is killed
        and costs the candidate nothing."""
        self.made += 1
        while self.ready:
            r, seq = self.ready.pop(0)
            if r.sock is not None and select.select([r.sock], [], [], 0)[0]:
                try:
                    r.answer(seq, timeout=WARM_TIMEOUT_S, want_fds=False)
                except (RunnerFailed, OSError):
                    r.close()
                    continue
            else:
                r.owed.append(seq)
            r.deadline_s, r.spare = deadline_s, True
            return r
        return RemoteRunner(self.spawner, deadline_s=deadline_s)

    def discard(self) -> None:
        """Kill the spares this job did not take (before its candidate's code runs on)."""
        for r, _ in self.ready:
            r.close()
        self.ready = []

    def refill(self) -> None:
        """As many spares as the job that just ended asked for, each opening its device now. Only
        where the judge is its namespace's init: elsewhere it cannot know that nothing the last
        candidate started is still running, and forks nothing ahead."""
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

    def pids(self) -> set[int]:
        return {r.pid for r, _ in self.ready}


def new_runner(spawner, deadline_s: float) -> RemoteRunner:
    """The next runner for this job: a spare where the judge keeps them (`spawner.spares`)."""
    spares = getattr(spawner, "spares", None)
    if spares is not None:
        return spares.runner(deadline_s)
    return RemoteRunner(spawner, deadline_s=deadline_s)
