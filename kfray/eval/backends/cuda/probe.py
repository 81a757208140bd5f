"""The stream contract: every piece of a kernel's work must be ordered on the `stream` it is given.

CUDA events on that stream time only what is ordered there, so work elsewhere would look free.
StreamHold (a spinning kernel that keeps a stream waiting) makes that visible; the probe here uses
it once per kernel, and kfray.eval.suite.stream_probe uses it for PyTorch-form kernels.
"""
from __future__ import annotations

import ctypes
import time
from typing import Callable

import numpy as np

from kfray.eval.backends.cuda.returncode import ReturnCode, kernel_return_code

PROBE_CALL = 2            # which call of a loaded kernel checks the stream contract (1 loads modules)
PROBE_HOLD_S = 0.2
PROBE_WAIT_S = 0.002      # how long the probe watches the outputs while the stream is held
STREAM_CONTRACT = ("launch every kernel and copy on `stream`, or order other streams after it and "
                   "join them back (cudaEventRecord + cudaStreamWaitEvent) before returning")

PROBE_WROTE_EARLY = 10001
PROBE_READ_EARLY = 10002
PROBE_LEFT_RUNNING = 10003


class StreamHold:
    """A one-thread kernel that keeps a stream waiting until the host writes a flag (or a timeout
    passes), built by NVRTC through CuPy. Flag memory is pinned, mapped host memory."""

    SOURCE = r'''
extern "C" __global__ void kf_hold(volatile int* flag, unsigned long long timeout_ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (flag[0] == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > timeout_ns) { flag[1] = 1; return; }
    }
}
'''

    def __init__(self, cp):
        rt = cp.cuda.runtime
        self._cp = cp
        self.ptr = rt.hostAlloc(16, rt.hostAllocMapped | rt.hostAllocPortable)  # UVA: same address on device
        self.flags = (ctypes.c_int32 * 4).from_address(self.ptr)
        self.kernel = cp.RawKernel(self.SOURCE, "kf_hold")

    @classmethod
    def create(cls, cp) -> "StreamHold | None":
        try:
            hold = cls(cp)
            s = cp.cuda.Stream(non_blocking=True)
            hold.arm(s, 1.0)
            hold.release()
            s.synchronize()
            return None if hold.timed_out() else hold
        except Exception:
            return None          # no NVRTC: plain event timing

    def arm(self, stream, timeout_s: float) -> None:
        self.flags[0] = 0
        self.flags[1] = 0
        self.kernel((1,), (1,), (np.uint64(self.ptr), np.uint64(int(timeout_s * 1e9))), stream=stream)

    def release(self) -> None:
        self.flags[0] = 1

    def timed_out(self) -> bool:
        return bool(self.flags[1])


def probe_stream_contract(cp, st, probe_stream, hold: StreamHold, invoke: Callable[[], int],
                          ins: list, outs: list) -> int:
    """Check the stream contract once per kernel: all its work must be ordered on `st`.

    Events on our stream time only what is ordered there, so work elsewhere would look free.
    The call runs again with our stream held and the inputs still to arrive on it (poisoned,
    their restore queued behind the hold): outputs written meanwhile, outputs still changing
    after our stream finished, or a result that differs from an unhurried run, all mean work
    off the stream. Such a kernel is a runtime error with the reason. `st` is the current
    stream and stays current; `probe_stream` is a second stream for the probe's own reads."""
    outs = [o for o in outs if o.dtype.kind == "f"]
    ins = [x for x in ins if x.dtype.kind == "f"]
    if not outs:
        return 0
    cp.cuda.runtime.deviceSynchronize()
    first = [o.copy() for o in outs]          # the unhurried result of the call just made
    saved = [x.copy() for x in ins]
    for o in outs:
        o.fill(np.nan)
    for x in ins:
        x.fill(np.nan)
    st.synchronize()

    def unwritten() -> bool:
        # use() and back, not `with`: leaving a `with` block does not restore a stream that
        # was made current by use(), and the harness's uploads would drift to the null stream.
        probe_stream.use()
        try:
            return all(bool(cp.isnan(o.ravel()).all()) for o in outs)   # kernels warmed in open_device
        finally:
            st.use()

    hold.arm(st, PROBE_HOLD_S)
    written = False
    try:
        for x, src in zip(ins, saved):
            x.data.copy_from_device_async(src.data, x.nbytes, st)
        rc = invoke()
        deadline = time.perf_counter() + PROBE_WAIT_S
        while not written and time.perf_counter() < deadline:
            written = not unwritten()
    finally:
        hold.release()
    st.synchronize()
    probe_stream.use()
    try:
        snap = [o.copy() for o in outs]
        probe_stream.synchronize()
        cp.cuda.runtime.deviceSynchronize()
        late = any(not bool(cp.array_equal(a, o, equal_nan=True)) for a, o in zip(snap, outs))
        differs = any(not bool(cp.array_equal(a, o, equal_nan=True)) for a, o in zip(first, outs))
    finally:
        st.use()
    if rc != 0:
        return kernel_return_code(rc)
    if hold.timed_out():
        return 0                      # it waited on the held stream itself: no verdict
    if written:
        return ReturnCode(PROBE_WROTE_EARLY, "it wrote its outputs while work queued earlier on "
                          f"`stream` had not finished (work off the stream): {STREAM_CONTRACT}",
                          after_zero=True)
    if late:
        return ReturnCode(PROBE_LEFT_RUNNING, "work it launched was still writing the outputs after "
                          f"`stream` had finished: {STREAM_CONTRACT}", after_zero=True)
    if differs:
        return ReturnCode(PROBE_READ_EARLY, "its result changes when `stream` is busy with earlier "
                          f"work: it reads its inputs off the stream before they are ready; {STREAM_CONTRACT}",
                          after_zero=True)
    return 0
