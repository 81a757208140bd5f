"""The CUDA side of a candidate's runner: its own context, the judge's buffers opened by IPC, and
kf_forward timed on the runner's stream.

The runner is forked before anything touched the device, so it opens its own context here through
the driver API (libcuda, by ctypes: no CuPy import, no NVRTC, a few milliseconds). It opens the
device buffers the judge shares (cuIpcOpenMemHandle): the judge lays poison in them, checks them
and reads the outputs there, in its own context. A call is timed as the judge's in-process path
times one: CUDA events on the runner's stream, held by a spinning kernel while kf_forward launches
so that the host's launch overhead is not counted (kfray.eval.backends.cuda.timing), and host wall
time instead when the context still had work after the stream finished (another stream). The
context is synchronized before the answer goes: a sticky error ends this runner, never the judge.
"""
from __future__ import annotations

import ctypes
import time

# kfray.eval.backends.cuda.probe.StreamHold's kernel, as PTX (nvcc --ptx -arch=compute_75; ISA 7.0
# so that drivers from CUDA 11 on load it): spin until flag[0] is set or timeout_ns pass.
HOLD_PTX = r"""
.version 7.0
.target sm_75
.address_size 64
.visible .entry kf_hold(
	.param .u64 kf_hold_param_0,
	.param .u64 kf_hold_param_1
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<8>;
	ld.param.u64 	%rd5, [kf_hold_param_0];
	ld.param.u64 	%rd3, [kf_hold_param_1];
	cvta.to.global.u64 	%rd1, %rd5;
	mov.u64 %rd4, %globaltimer;
$L__BB0_1:
	ld.volatile.global.u32 	%r1, [%rd1];
	setp.ne.s32 	%p1, %r1, 0;
	@%p1 bra 	$L__BB0_4;
	mov.u64 %rd6, %globaltimer;
	sub.s64 	%rd7, %rd6, %rd4;
	setp.le.u64 	%p2, %rd7, %rd3;
	@%p2 bra 	$L__BB0_1;
	mov.u32 	%r2, 1;
	st.volatile.global.u32 	[%rd1+4], %r2;
$L__BB0_4:
	ret;
}
"""

HOLD_S = 0.02                 # longest a timed call keeps the stream held (timing.TIMING_HOLD_S)
LEFT_RUNNING_SLACK_S = 20e-6  # as kfray.eval.backends.cuda.timing
IPC_HANDLE_BYTES = 64
_V2 = ("cuMemHostGetDevicePointer", "cuIpcOpenMemHandle", "cuEventElapsedTime", "cuMemcpyDtoH", "cuMemcpyHtoD")   # cuda.h maps these to _v2


class _IpcHandle(ctypes.Structure):
    # bytes, not c_char: a c_char array takes a value only up to its first zero byte
    _fields_ = [("reserved", ctypes.c_ubyte * IPC_HANDLE_BYTES)]


def ipc_handle(hex_text: str) -> _IpcHandle:
    """The driver's handle struct from the judge's hex text, all 64 bytes of it."""
    raw = bytes.fromhex(str(hex_text))
    if len(raw) != IPC_HANDLE_BYTES:
        raise ValueError(f"an IPC handle of {len(raw)} bytes")
    return _IpcHandle.from_buffer_copy(raw)


class CudaError(RuntimeError):
    """A driver call failed; the message names the call and the error."""


class CudaSide:
    """The runner's device: context, stream, events, hold kernel and the buffers it opened."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.maps: dict[int, tuple[int, int]] = {}          # buffer id -> (device pointer, bytes)
        self._check("cuInit", 0)
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self._check("cuDeviceGet", ctypes.byref(dev), 0)
        self._check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self._check("cuCtxSetCurrent", ctx)
        self.stream, self.start, self.stop = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        self._check("cuStreamCreate", ctypes.byref(self.stream), 1)        # CU_STREAM_NON_BLOCKING
        self._check("cuEventCreate", ctypes.byref(self.start), 0)
        self._check("cuEventCreate", ctypes.byref(self.stop), 0)
        mod, self.hold = ctypes.c_void_p(), ctypes.c_void_p()
        self._check("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(HOLD_PTX.encode()))
        self._check("cuModuleGetFunction", ctypes.byref(self.hold), mod, b"kf_hold")
        host, self.flag_dev = ctypes.c_void_p(), ctypes.c_uint64()
        self._check("cuMemHostAlloc", ctypes.byref(host), ctypes.c_size_t(16), 1 | 2)      # PORTABLE | DEVICEMAP
        self._check("cuMemHostGetDevicePointer", ctypes.byref(self.flag_dev), host, 0)
        self.flags = (ctypes.c_int32 * 4).from_address(host.value)
        self.idle_sync_s = self._idle_sync()
        self.last_error = None

    # -- the driver ---------------------------------------------------------------------------
    def _fn(self, name: str):
        for n in ((name + "_v2", name) if name in _V2 else (name,)):
            f = getattr(self.cu, n, None)
            if f is not None:
                return f
        raise CudaError(f"the CUDA driver has no {name}")

    def _check(self, name: str, *args) -> None:
        r = self._fn(name)(*args)
        if r != 0:
            raise CudaError(f"{name} failed: {self.error_text(r)}")

    def error_text(self, code: int) -> str:
        s = ctypes.c_char_p()
        if self.cu.cuGetErrorString(int(code), ctypes.byref(s)) == 0 and s.value:
            return f"{s.value.decode(errors='replace')} (CUresult {code})"
        return f"CUresult {code}"

    def _idle_sync(self, samples: int = 30) -> float:
        ts = []
        for _ in range(samples):
            t0 = time.perf_counter()
            self._check("cuCtxSynchronize")
            ts.append(time.perf_counter() - t0)
        ts.sort()
        return ts[int(0.75 * (len(ts) - 1))]

    # -- buffers ------------------------------------------------------------------------------
    def open(self, ids: list, handles: list, sizes: list) -> None:
        for i, h, n in zip(ids, handles, sizes):
            ptr = ctypes.c_uint64()
            self._check("cuIpcOpenMemHandle", ctypes.byref(ptr), ipc_handle(h), 1)  # lazy peer access
            self.maps[int(i)] = (ptr.value, int(n))

    def close(self, ids: list) -> None:
        for i in ids:
            got = self.maps.pop(int(i), None)
            if got is not None:
                self._fn("cuIpcCloseMemHandle")(ctypes.c_uint64(got[0]))

    def address(self, buf: int, offset: int) -> int:
        ptr, size = self.maps[buf]
        if not 0 <= offset <= size:
            raise ValueError(f"offset {offset} outside device buffer {buf}")
        return ptr + offset

    def selftest(self, buf: int, offset: int, nbytes: int) -> dict:
        """Before any candidate is loaded: read a buffer the judge filled, write it back reversed,
        and time an empty call, so the judge knows sharing and timing work on this machine."""
        host = (ctypes.c_char * nbytes)()
        ptr = ctypes.c_uint64(self.address(buf, offset))
        self._check("cuMemcpyDtoH", host, ptr, ctypes.c_size_t(nbytes))
        seen = bytes(host)
        back = (ctypes.c_char * nbytes).from_buffer_copy(seen[::-1])
        self._check("cuMemcpyHtoD", ptr, back, ctypes.c_size_t(nbytes))
        self._check("cuCtxSynchronize")
        return {"seen": seen.hex(), "s": self.call(lambda *a: 0, [])["s"]}

    # -- a timed call -------------------------------------------------------------------------
    def _arm(self, hold_s: float = HOLD_S) -> None:
        self.flags[0] = self.flags[1] = 0
        flag, timeout = ctypes.c_uint64(self.flag_dev.value), ctypes.c_uint64(int(hold_s * 1e9))
        params = (ctypes.c_void_p * 2)(ctypes.addressof(flag), ctypes.addressof(timeout))
        self._check("cuLaunchKernel", self.hold, 1, 1, 1, 1, 1, 1, 0, self.stream, params, None)

    def call(self, fn, args: list) -> dict:
        """kf_forward(args..., stream): its return code, cudaGetLastError() after it, and its seconds."""
        self._arm()
        t0 = time.perf_counter()
        try:
            self._check("cuEventRecord", self.start, self.stream)
            rc = fn(*args, self.stream.value)
            self._check("cuEventRecord", self.stop, self.stream)
        finally:
            self.flags[0] = 1
        self._check("cuEventSynchronize", self.stop)
        t_stream = time.perf_counter()
        self._check("cuCtxSynchronize")                  # a sticky error ends this runner here
        t1 = time.perf_counter()
        ms = ctypes.c_float()
        self._check("cuEventElapsedTime", ctypes.byref(ms), self.start, self.stop)
        ev, wall = ms.value / 1e3, t1 - t0
        left_running = (t1 - t_stream) > self.idle_sync_s + LEFT_RUNNING_SLACK_S and wall > 1.5 * ev
        err = int(self.last_error()) if self.last_error is not None else 0
        return {"rc": int(rc), "err": err, "s": max(wall, ev) if left_running else ev}

    # -- the stream probe (kfray.eval.backends.cuda.split.probe_remote) ---------------------------
    def call_held(self, fn, args: list, hold_s: float) -> dict:
        """kf_forward launched behind a held stream, answered before the hold ends: the judge
        then looks at the outputs, which nothing ordered on the stream can have written yet."""
        self._arm(min(max(float(hold_s), 0.0), 1.0))
        try:
            rc = fn(*args, self.stream.value)
        except BaseException:
            self.flags[0] = 1
            raise
        return {"rc": int(rc)}

    def release(self) -> dict:
        self.flags[0] = 1
        self._check("cuCtxSynchronize")
        return {"timed_out": bool(self.flags[1])}
