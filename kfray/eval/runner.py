"""The candidate's process: the only place a generated kernel is loaded and run.

A runner is forked fresh for every candidate (kfray.eval.spawner) and holds one socket to its
judge and nothing else: no other descriptor, no judge memory but what the judge shares with it
(the buffers a call works on), no verdict to give. It answers each request with data only, as
JSON (kfray.eval.wire): a call's return code and the seconds the call took by its own clock.
The judge believes none of it unchecked: outputs are read from the shared buffers and compared
by the judge, and the claimed seconds are held against the judge's own clock.

Requests (`op`):
- `map`: descriptors of shared buffers come with it; the runner maps them (ids in order);
- `drop`: buffers the judge freed;
- `load_cdll`: dlopen a built library and take its `kf_forward` with the given argument kinds;
- `call`: kf_forward on the mapped buffers (`["p", id, offset]`) and scalars (`["s", value]`);
- `ping`: nothing (the judge measures the wire's round trip with it before anything is loaded);
- `warm`: open the device now (a spare forked ahead of its job: kfray.eval.spares);
- `cuda_open`, `cuda_map`: the runner's own CUDA context, and device buffers the judge shares by
  IPC handle (kfray.eval.runner_cuda); `call` then passes device pointers and the runner's stream;
- `load_torch`, `torch_call`, `torch_state`: the suite forms (kfray.eval.runner_torch).
"""
from __future__ import annotations

import ctypes
import mmap
import os
import socket
import sys
import time
import traceback

from kfray.eval import wire

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_SCALARS = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int32": ctypes.c_int32,
            "int64": ctypes.c_int64, "ptr": ctypes.c_void_p}


class Runner:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.maps: dict[int, tuple[mmap.mmap, int]] = {}      # id -> (mapping, address)
        self.fn = None
        self.lib = None
        self.torch = None                                      # kfray.eval.runner_torch.TorchSide
        self.cuda = None                                       # kfray.eval.runner_cuda.CudaSide

    # -- shared buffers -------------------------------------------------------------------------
    def op_map(self, req: dict, fds: list[int]) -> dict:
        ids = req.get("ids", [])
        if len(ids) != len(fds):
            raise ValueError(f"{len(ids)} ids for {len(fds)} descriptors")
        for i, fd in zip(ids, fds):
            size = os.fstat(fd).st_size
            # MAP_POPULATE: the pages are mapped now, not at the kernel's first touch. Each rotated
            # input set is a fresh mapping, and faulting 8 MiB in took 1.7 ms of a 0.2 ms axpb call.
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED | _POPULATE, mmap.PROT_READ | mmap.PROT_WRITE) if size else None
            os.close(fd)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mm)) if mm is not None else 0
            self.maps[int(i)] = (mm, addr)
        return {"ok": True}

    def op_drop(self, req: dict) -> dict:
        if self.cuda is not None:
            self.cuda.close(req.get("ids", []))
        for i in req.get("ids", []):
            self.maps.pop(int(i), None)        # the mapping closes when nothing refers to it
        return {"ok": True}

    def address(self, buf: int, offset: int) -> int:
        if self.cuda is not None:
            return self.cuda.address(buf, offset)
        mm, addr = self.maps[buf]
        if mm is None or not 0 <= offset <= len(mm):
            raise ValueError(f"offset {offset} outside buffer {buf}")
        return addr + offset

    # -- kf_forward libraries -------------------------------------------------------------------
    def op_load_cdll(self, req: dict) -> dict:
        self.lib = ctypes.CDLL(req["artifact"], mode=ctypes.RTLD_LOCAL)
        try:
            fn = self.lib.kf_forward
        except AttributeError:
            raise RuntimeError("the library does not export kf_forward (declare it extern \"C\")") from None
        fn.restype = ctypes.c_int
        fn.argtypes = [_SCALARS[k] for k in req["kinds"]] + ([ctypes.c_void_p] if self.cuda is not None else [])
        self.fn = fn
        if self.cuda is not None:                       # the harness's check of launches it did not check
            last = getattr(self.lib, "kf_harness_last_error", None)
            if last is not None:
                last.restype, last.argtypes = ctypes.c_int, []
            self.cuda.last_error = last
        return {"ok": True}

    def op_cuda_open(self, req: dict) -> dict:
        from kfray.eval.runner_cuda import CudaSide

        self.cuda = CudaSide()
        return {"ok": True}

    def op_call(self, req: dict) -> dict:
        args = [self.address(a[1], a[2]) if a[0] == "p" else a[1] for a in req["args"]]
        fn = self.fn
        if self.cuda is not None:
            return self.cuda.call(fn, args)
        t0 = time.perf_counter()
        rc = fn(*args)
        s = time.perf_counter() - t0
        return {"rc": int(rc), "s": s}

    # -- the loop -------------------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            try:
                req, fds = wire.recv(self.sock, want_fds=True)
            except (EOFError, OSError, wire.WireError):
                return
            op = req.get("op")
            seq = req.get("seq")
            try:
                if op == "map":
                    out = self.op_map(req, fds)
                elif op == "ping":
                    out = {"s": 0.0}
                elif op == "warm":
                    out = _warm(req)
                elif op == "call":
                    out = self.op_call(req)
                elif op == "call_held" and self.cuda is not None:
                    args = [self.address(a[1], a[2]) if a[0] == "p" else a[1] for a in req["args"]]
                    out = self.cuda.call_held(self.fn, args, req.get("hold_s", 0.2))
                elif op == "release" and self.cuda is not None:
                    out = self.cuda.release()
                elif op == "drop":
                    out = self.op_drop(req)
                elif op == "load_cdll":
                    out = self.op_load_cdll(req)
                elif op == "cuda_open":
                    out = self.op_cuda_open(req)
                elif op == "cuda_map":
                    if self.cuda is None:
                        raise RuntimeError("device buffers before cuda_open: this runner has no CUDA context")
                    self.cuda.open(req.get("ids", []), req.get("handles", []), req.get("sizes", []))
                    out = {"ok": True}
                elif op == "cuda_selftest":
                    out = self.cuda.selftest(int(req["id"]), int(req["offset"]), int(req["nbytes"]))
                elif op in ("load_torch", "torch_build", "torch_inputs", "torch_call", "torch_state", "torch_probe",
                            "torch_release", "torch_copy_kept", "torch_set_state", "torch_bw_bind", "torch_bw_forward",
                            "torch_backward"):
                    if self.torch is None:
                        from kfray.eval.runner_torch import TorchSide
                        self.torch = TorchSide(self)
                    out, fds_out = self.torch.handle(op, req, fds)
                    wire.send(self.sock, {**out, "seq": seq}, fds_out)
                    for fd in fds_out:
                        os.close(fd)
                    continue
                elif op == "exit":
                    return
                else:
                    out = {"error": f"unknown request {str(op)[:40]!r}"}
            except MemoryError:
                out = {"error": "MemoryError: out of memory in the candidate's process"}
            except Exception as e:
                out = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)[-800:]}"}
            try:
                wire.send(self.sock, {**out, "seq": seq})
            except OSError:
                return


def _warm(req: dict) -> dict:
    """A spare runner opens its device before any job is given to it (kfray.eval.spares)."""
    t0 = time.perf_counter()
    if req.get("device") == "cuda":
        import torch

        torch.cuda.set_device(0)
        torch.cuda.synchronize()
    import torch.utils.cpp_extension  # noqa: F401  (what a suite form's load imports: now, not in the job)
    import kfray.eval.runner_torch  # noqa: F401
    import kfray.eval.suite.runners  # noqa: F401
    import kfray.eval.suite_loading  # noqa: F401
    return {"s": time.perf_counter() - t0}


def runner_main(sock: socket.socket) -> None:
    """The runner's whole life: serve the judge until it hangs up, then leave at once (no atexit
    handler of a kernel's runs)."""
    try:
        Runner(sock).serve()
    finally:
        sys.stdout.flush() if sys.stdout else None
        os._exit(0)
