"""The judge's side of a CUDA kf_forward that runs in its own runner (kfray.eval.runner_cuda).

The judge allocates every buffer the kernel works on (one cudaMalloc each, so that an IPC handle
covers it from its start), lays poison in it and reads the outputs from it in its own context; the
runner opens the same memory by IPC handle. Buffers are pooled by size: a new candidate's runner
opens the handles again, but nothing is allocated again. Nothing is freed while a runner may still
have it open: freed buffers wait for `runner_gone`.
"""
from __future__ import annotations

import itertools
import math
import time
import weakref

import numpy as np

from kfray.eval import wire
from kfray.eval.backends.cuda.returncode import ReturnCode, cuda_error_text, kernel_return_code
from kfray.eval.backends.cuda.probe import PROBE_CALL, PROBE_HOLD_S, PROBE_WAIT_S, PROBE_WROTE_EARLY, STREAM_CONTRACT
from kfray.eval.remote import RemoteKernel


class _Owner:
    """What a buffer's arrays keep alive; its end returns the buffer to the arena."""


class DeviceArena:
    POOL_BYTES = 8 << 30

    def __init__(self, cp):
        self.cp = cp
        self._ids = itertools.count(1)
        self._by_ptr: dict[int, tuple[int, object, int]] = {}     # base pointer -> (id, Memory, bytes)
        self._pool: dict[int, list[tuple[int, object]]] = {}      # bytes -> [(id, Memory)]
        self._pooled = 0
        self._dying: list[object] = []
        self.freed: list[int] = []

    def empty(self, nbytes: int):
        """A uint8 device array of `nbytes` in a buffer of its own."""
        cp = self.cp
        size = max(int(nbytes), 1)
        pooled = self._pool.get(size)
        if pooled:
            bid, mem = pooled.pop()
            self._pooled -= size
        else:
            bid, mem = next(self._ids), cp.cuda.Memory(size)
        owner = _Owner()
        view = cp.cuda.UnownedMemory(mem.ptr, size, owner)
        self._by_ptr[mem.ptr] = (bid, mem, size)
        weakref.finalize(owner, self._free, mem.ptr)
        return cp.ndarray((size,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(view, 0))

    def array(self, shape, dtype):
        dt = self.cp.dtype(dtype)
        nbytes = math.prod(int(d) for d in shape) * dt.itemsize
        return self.empty(nbytes)[:nbytes].view(dt).reshape(shape)

    def _free(self, ptr: int) -> None:
        got = self._by_ptr.pop(ptr, None)
        if got is None:
            return
        bid, mem, size = got
        if self._pooled + size <= self.POOL_BYTES:
            self._pool.setdefault(size, []).append((bid, mem))
            self._pooled += size
        else:
            self.freed.append(bid)
            self._dying.append(mem)

    def locate(self, a) -> tuple[int, int, int]:
        """(buffer id, byte offset of `a` in it, 0)."""
        base = a.data.mem.ptr
        got = self._by_ptr.get(base)
        if got is None:
            raise ValueError("this array does not live in a shared device buffer")
        return got[0], a.data.ptr - base, 0

    def map_request(self, ids: list[int]) -> tuple[dict, list]:
        """What a runner needs to open these buffers: their IPC handles and sizes."""
        rt = self.cp.cuda.runtime
        by_id = {bid: (ptr, size) for ptr, (bid, _, size) in self._by_ptr.items()}
        handles = [bytes(rt.ipcGetMemHandle(by_id[b][0])).hex() for b in ids]
        return {"op": "cuda_map", "ids": ids, "handles": handles, "sizes": [by_id[b][1] for b in ids]}, []

    def take_freed(self) -> list[int]:
        out, self.freed = self.freed, []
        return out

    def runner_gone(self) -> None:
        """No runner has any buffer open: what was freed can go back to the device."""
        self._dying.clear()


def selftest(runner, arena: DeviceArena) -> str | None:
    """Before a judge first trusts its runners with the device: a runner that opened its context
    reads a buffer the judge filled, writes it back reversed, and times an empty call. None when
    all of it holds, else why not (the judge then loads candidates itself, state-checked)."""
    import os

    from kfray.eval.remote import RunnerFailed

    cp = arena.cp
    pattern = os.urandom(64)
    buf = arena.empty(64)
    buf.set(np.frombuffer(pattern, dtype=np.uint8))
    cp.cuda.runtime.deviceSynchronize()
    try:
        (ref,) = runner.share(arena, [buf])
        ans = runner.request({"op": "cuda_selftest", "id": ref[1], "offset": ref[2], "nbytes": 64}, timeout=60)
    except RunnerFailed as e:
        return f"the runner's CUDA side failed its self-test: {e}"
    back = bytes(cp.asnumpy(buf).tobytes())
    if ans.get("seen") != pattern.hex() or back != pattern[::-1]:
        return "a buffer shared by CUDA IPC did not read the same in the judge and its runner"
    s = wire.number(ans.get("s"), "an empty call's seconds", 0.0, 1e6)
    if s > 5e-3:
        return f"an empty timed call took {s * 1e3:.1f} ms in the runner (its stream hold does not release)"
    return None


class RemoteCudaKernel(RemoteKernel):
    """kf_forward in its runner, called with the judge's device buffers; returns its return code
    as the in-process path does (kernel_return_code, a launch error it did not check). The runner
    has opened its CUDA context (`cuda_open`) before this loads the library."""

    def __init__(self, runner, arena: DeviceArena, artifact: str, task, stream):
        super().__init__(runner, arena, artifact, task)
        self.stream = stream
        self.outputs = [a.name for a in task.outputs]
        self.calls = 0

    def __call__(self, args: dict):
        self.stream.synchronize()           # the judge's poison and copies have landed
        self.calls += 1
        rc = super().__call__(args)
        err = wire.integer(self.last_answer.get("err", 0), "cudaGetLastError", 0, 1 << 20)
        if rc != 0:
            return kernel_return_code(rc)
        if err:
            return ReturnCode(err, f"cudaGetLastError() then reported {cuda_error_text(err) or err}: "
                              "a launch failed and kf_forward did not check it", after_zero=True)
        if self.calls == PROBE_CALL:
            return self.probe(args)
        return 0

    def probe(self, args: dict):
        """The stream contract in a runner: the call again with the runner's stream held, and
        the outputs (poisoned) watched from the judge meanwhile; written before the hold ends
        means work off the stream (kfray.eval.backends.cuda.probe, its wrote-early half)."""
        cp = self.arena.cp
        outs = [args[n] for n in self.outputs if n in args and args[n].dtype.kind == "f"]
        if not outs:
            return 0
        for o in outs:
            o.fill(np.nan)
        cp.cuda.runtime.deviceSynchronize()
        payload = self.payload(args)
        written = False
        try:
            ans = self.runner.request({"op": "call_held", "args": payload, "hold_s": PROBE_HOLD_S})
            deadline = time.perf_counter() + PROBE_WAIT_S
            while not written and time.perf_counter() < deadline:
                written = not all(bool(cp.isnan(o.ravel()).all()) for o in outs)
        finally:
            done = self.runner.request({"op": "release"})
        rc = wire.integer(ans.get("rc"), "kf_forward's return code", -(1 << 31), (1 << 31) - 1)
        if rc != 0:
            return kernel_return_code(rc)
        if written and not done.get("timed_out"):
            return ReturnCode(PROBE_WROTE_EARLY, "it wrote its outputs while work queued earlier on "
                              f"`stream` had not finished (work off the stream): {STREAM_CONTRACT}",
                              after_zero=True)
        return 0
