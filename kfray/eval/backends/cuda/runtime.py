"""The CUDA backend's sandbox side: what runs in the worker process, next to the candidate's code.

CuPy owns the device. Every CuPy operation of the harness (uploads, reference, downloads) runs on
one non-blocking stream, which is also the `cudaStream_t` handed to kf_forward. Timing: CUDA
events on that stream (kfray.eval.backends.cuda.timing). Once per kernel a probe checks the
stream contract (all work ordered on `stream`) and reports a violation as a runtime error, since
events cannot see work elsewhere (kfray.eval.backends.cuda.probe). CuPy is imported inside
methods only, so this module imports where CuPy is missing.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Callable

import numpy as np

from kfray.errors import BackendError
from kfray.eval.backends.base import Backend
from kfray.eval.backends.cuda.probe import PROBE_CALL, StreamHold, probe_stream_contract
from kfray.eval.backends.cuda.references import gpu_reference_for, torch_cuda_available, torch_reference
from kfray.eval.backends.cuda.returncode import ReturnCode, cuda_error_text, kernel_return_code
from kfray.eval.backends.cuda.timing import idle_sync_seconds, time_on_stream
from kfray.tasks.base import NP_TYPES, Tensor

_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double,
           "int32": ctypes.c_int32, "int64": ctypes.c_int64}


class CudaRuntime(Backend):
    """Backend's sandbox-side methods for CUDA shared libraries called through ctypes with CuPy
    arrays; CudaBackend adds the host side (compile, device facts). Candidates run in their own
    runner (`load_remote`, kfray.eval.backends.cuda.split); `load` loads one in this process."""

    split = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.device_arena = None
        self.split_note = None        # why candidates cannot run in their own runner here, if so
        self._split_checked = False
        self.stream = None
        self._cp = None
        self._idle_sync_s = 0.0
        self._hold = None
        self._events = None
        self._probe_stream = None

    def open_device(self) -> None:
        os.environ["CUPY_TF32"] = "0"   # the matmul reference stays true fp32
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() < 1:
            raise BackendError("the cuda backend found no visible GPU")
        self._cp = cp
        cp.cuda.Device(0).use()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.stream.use()            # every CuPy op of the harness is ordered with the kernel
        self._probe_stream = cp.cuda.Stream(non_blocking=True)
        self._events = (cp.cuda.Event(), cp.cuda.Event())
        self._hold = StreamHold.create(cp)
        # Warm up context, allocator, events, cuBLAS and the probe's kernels (a module loading
        # while our stream is held would wait for the hold), then measure an idle device sync.
        x = cp.ones((64, 64), dtype=cp.float32)
        cp.matmul(x, x)
        for dt in (cp.float32, cp.float64):
            w = cp.zeros(64, dtype=dt)
            bool(cp.isnan(w.ravel()).all())
            w.fill(np.nan)
            bool(cp.array_equal(w, w.copy(), equal_nan=True))
        self.time_call(lambda: None)
        self.synchronize()
        self._idle_sync_s = idle_sync_seconds(cp)

    def _ensure_open(self):
        if self._cp is None:
            self.open_device()
        return self._cp

    def load(self, artifact: str, task):
        self._ensure_open()
        lib = ctypes.CDLL(artifact, mode=ctypes.RTLD_LOCAL)
        try:
            fn = lib.kf_forward
        except AttributeError:
            raise RuntimeError("the library does not export kf_forward (declare it extern \"C\")") from None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p if isinstance(a, Tensor) else _CTYPES[a.dtype] for a in task.args] \
            + [ctypes.c_void_p]
        try:
            last_error = lib.kf_harness_last_error
            last_error.restype = ctypes.c_int
            last_error.argtypes = []
        except AttributeError:
            last_error = None
        names = [a.name for a in task.args]
        tensors = {a.name for a in task.args if isinstance(a, Tensor)}
        inputs = [a.name for a in task.inputs]
        outputs = [a.name for a in task.outputs]
        stream_ptr = self.stream.ptr
        state = {"calls": 0}

        def invoke(args: dict[str, Any]) -> int:
            return fn(*[args[n].data.ptr if n in tensors else args[n] for n in names], stream_ptr)

        def call(args: dict[str, Any]) -> int:
            state["calls"] += 1
            rc = invoke(args)
            err = last_error() if last_error is not None else 0   # a launch it did not check
            if rc != 0:
                return kernel_return_code(rc)
            if err != 0:
                return ReturnCode(err, f"cudaGetLastError() then reported {cuda_error_text(err) or err}: "
                                  "a launch failed and kf_forward did not check it", after_zero=True)
            if state["calls"] == PROBE_CALL and self._hold is not None:
                return probe_stream_contract(self._cp, self.stream, self._probe_stream, self._hold,
                                             lambda: invoke(args), [args[n] for n in inputs],
                                             [args[n] for n in outputs])
            return 0

        call.keepalive = lib  # the library must outlive the callable
        return call

    def load_remote(self, runner, arena, artifact: str, task):
        """kf_forward loaded in the candidate's runner, on device buffers it opens by IPC handle;
        None (the candidate then loads here, state-checked) where this judge's first runner could
        not open a context or failed the self-test (kfray.eval.backends.cuda.split.selftest)."""
        from kfray.eval.backends.cuda.split import DeviceArena, RemoteCudaKernel, selftest
        from kfray.eval.remote import RunnerFailed

        if self.split_note:
            return None
        cp = self._ensure_open()
        if self.device_arena is None:
            self.device_arena = DeviceArena(cp)
        try:
            runner.request({"op": "cuda_open"}, timeout=120)
        except RunnerFailed as e:
            if self._split_checked:
                raise
            self.split_note = f"the runner could not open a CUDA context: {e}"
            return None
        if not self._split_checked:
            self.split_note = selftest(runner, self.device_arena)
            self._split_checked = True
            if self.split_note:
                self.device_arena = None
                return None
        return RemoteCudaKernel(runner, self.device_arena, artifact, task, self.stream)

    def runner_gone(self) -> None:
        if self.device_arena is not None:
            self.device_arena.runner_gone()

    def make_args(self, task, shape: str, rng) -> dict[str, Any]:
        """Inputs drawn on the GPU (host numpy is far too slow for GPU-sized tensors), unless the
        task makes its own inputs (torch-based tasks), which are then uploaded."""
        from kfray.tasks.base import Task
        if type(task).make_args is Task.make_args:
            cp = self._ensure_open()
            self.stream.use()
            args = task.make_args(shape, rng, xp=cp)
            self.stream.synchronize()
            return args
        return task.make_args(shape, rng)

    def to_device(self, args: dict[str, Any]) -> dict[str, Any]:
        cp = self._ensure_open()
        self.stream.use()
        out = {k: (self._own_copy(cp, v) if isinstance(v, (np.ndarray, cp.ndarray)) else v)
               for k, v in args.items()}
        self.stream.synchronize()
        cp.cuda.runtime.deviceSynchronize()   # uploads are complete whatever stream they took
        return out

    def _own_copy(self, cp, v):
        """The kernel's copy of v: in a buffer shared with its runner where it runs apart."""
        if self.device_arena is None:
            return cp.array(v, copy=True)
        out = self.device_arena.array(v.shape, v.dtype)
        cp.copyto(out, cp.asarray(v))
        return out

    def to_host(self, value: Any) -> np.ndarray:
        cp = self._ensure_open()
        if isinstance(value, cp.ndarray):
            return cp.asnumpy(value, stream=self.stream, blocking=True)
        return np.asarray(value)

    def synchronize(self) -> None:
        cp = self._ensure_open()
        self.stream.synchronize()
        cp.cuda.runtime.deviceSynchronize()   # also work a kernel launched on other streams

    def time_call(self, fn: Callable[[], Any]) -> float:
        """Seconds of device work fn queues on our stream, from CUDA events (see timing.py)."""
        cp = self._ensure_open()
        return time_on_stream(cp, self.stream, self._events, self._hold, self._idle_sync_s, fn)

    def reference(self, task, args: dict[str, Any]) -> dict[str, Any]:
        cp = self._ensure_open()
        self.stream.use()
        gpu = gpu_reference_for(task)
        if gpu is not None:
            outs = {o.name for o in task.outputs}
            dev = {k: (cp.asarray(v) if isinstance(v, np.ndarray) else v)
                   for k, v in args.items() if k not in outs}
            res = gpu(dev)
            return {o.name: res[o.name].astype(NP_TYPES[o.dtype], copy=False) for o in task.outputs}
        if self._hold is not None:
            self._hold.release()     # the host path waits on the stream: a held stream would stall it
        if getattr(task, "device_reference", None) is not None and torch_cuda_available():
            return torch_reference(cp, self.stream, task, args)
        host = {k: (cp.asnumpy(v, stream=self.stream, blocking=True) if isinstance(v, cp.ndarray) else v)
                for k, v in args.items()}
        res = task.run_reference(host)
        return {k: cp.asarray(v) for k, v in res.items()}

    def check_sticky_error(self) -> str | None:
        if self._cp is None:
            return None
        cp = self._cp
        try:
            cp.cuda.runtime.deviceSynchronize()
            if self.stream is not None:
                self.stream.synchronize()
        except cp.cuda.runtime.CUDARuntimeError as e:
            return str(e)
        except Exception as e:  # anything else from the runtime here means the context is unusable
            return f"{type(e).__name__}: {e}"
        return None
