"""The judge's device memory between the steps of a suite evaluation: given back, and on record.

The candidate runs in another process (its runner). Memory that either process's caching
allocator keeps is memory the other cannot have, and neither's out-of-memory retry can free the
other's cache; a block the judge shared stays allocated until the runner lets go of its mapping.
So after every step that freed large tensors, the judge has the runner drop what the judge no
longer holds and, when the device is short of free memory, both empty their caches; full-size
problems of many GiB then fit beside each other's next step. Each step's figures are kept, so that an out-of-memory verdict
says whose memory the device held.
"""
from __future__ import annotations

import time

MAX_LOG = 48
# Caches are emptied only while the device's free memory is under this share of it: emptying them
# costs cudaFree now and cudaMalloc at the next step (12 times a problem), and a small problem on
# a large device never needs it. What either process no longer uses is let go of every time.
ROOMY = 0.5


def _gib(n: int | float) -> float:
    return round(float(n) / 2**30, 2)


class DeviceMemory:
    def __init__(self, device: str, remote=None):
        self.on = device == "cuda"
        self.remote = remote           # the candidate's runner side (kfray.eval.suite.remote_case)
        self.log: list[dict] = []
        self.seconds, self.count = 0.0, 0     # what settling cost this job

    def settle(self, step: str) -> None:
        """Both processes' freed device memory back to the device; one line of the log."""
        if not self.on:
            return
        t0 = time.perf_counter()
        try:
            self._settle(step)
        finally:
            self.seconds += time.perf_counter() - t0
            self.count += 1

    def _settle(self, step: str) -> None:
        import torch

        free, total = torch.cuda.mem_get_info()
        give_back = free < ROOMY * total      # else what both caches hold cannot crowd the next step
        runner = self.remote.let_go(give_back) if self.remote is not None else None
        torch.cuda.synchronize()
        torch.cuda.ipc_collect()              # blocks the runner has let go of
        if give_back:
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info()
        if len(self.log) >= MAX_LOG:
            return
        row = {"step": step, "judge_allocated_gib": _gib(torch.cuda.memory_allocated()),
               "judge_reserved_gib": _gib(torch.cuda.memory_reserved()), "device_free_gib": _gib(free),
               "given_back": give_back}
        if runner:
            row.update(runner)
        self.log.append(row)
