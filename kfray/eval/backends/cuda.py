"""CUDA backend: nvcc builds each candidate into a shared library that ctypes calls with CuPy arrays.

Host side (the evaluator) only needs `nvcc`: compile works with no GPU and no driver. The arch comes
from $KFRAY_CUDA_ARCH, else from the visible GPU, else sm_90. `-Xptxas -v` gives registers, shared
memory and spills per kernel; they travel with the build as a JSON sidecar in the compile cache.

Sandbox side: CuPy owns the device. Every CuPy operation of the harness (uploads, reference,
downloads) runs on one non-blocking stream, which is also the `cudaStream_t` handed to kf_forward.
Timing: CUDA events on that stream while a tiny spinning kernel holds it until fn has launched
everything (so launch overhead is not timed); a sample that leaves work running on other streams
counts host wall time. Once per kernel a probe checks the stream contract (all work ordered on
`stream`) and reports a violation as a runtime error, since events cannot see work elsewhere.
CuPy is imported inside methods only, so this module imports where CuPy is missing.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kfray.errors import BackendError
from kfray.eval.backends.base import Backend, Build, CompileError
from kfray.eval.compile_cache import CompileCache
from kfray.source import define_flags
from kfray.tasks.base import NP_TYPES, Tensor

DEFAULT_ARCH = "sm_90"
BASE_FLAGS = ["-O3", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v", "-lineinfo"]
_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double,
           "int32": ctypes.c_int32, "int64": ctypes.c_int64}

# Pre-included into every candidate (its own file, so the candidate's line numbers are unchanged).
# nvcc links cudart statically into each library and keeps its symbols hidden, so only code inside
# the library can read that runtime's last error (a bad launch configuration, say): this does.
HARNESS_HEADER = """\
#include <cuda_runtime.h>
extern "C" __attribute__((visibility("default"))) int kf_harness_last_error(void) {
    return (int)cudaGetLastError();
}
"""

# Timing holds our stream with a spinning kernel while fn launches, so CUDA events time the device
# work back to back, without the host's launch overhead. A sample counts host wall time instead
# when, after our stream finished, cudaDeviceSynchronize still waited this much longer than on an
# idle device: work was left running on another stream.
LEFT_RUNNING_SLACK_S = 20e-6
TIMING_HOLD_S = 0.02      # longest a timed call keeps the stream held (for kernels that sync inside)
PROBE_CALL = 2            # which call of a loaded kernel checks the stream contract (1 loads modules)
PROBE_HOLD_S = 0.2
PROBE_WAIT_S = 0.002      # how long the probe watches the outputs while the stream is held
STREAM_CONTRACT = ("launch every kernel and copy on `stream`, or order other streams after it and "
                   "join them back (cudaEventRecord + cudaStreamWaitEvent) before returning")

COPY_BYTES = 256 << 20
MATMUL_N = 4096


# --------------------------------------------------------------------------------------------
# nvcc and ptxas
# --------------------------------------------------------------------------------------------
def nvcc_path() -> str:
    found = os.environ.get("NVCC") or shutil.which("nvcc")
    if not found:
        for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
                found = os.path.join(root, "bin", "nvcc")
                break
    if not found:
        raise BackendError("the cuda backend needs nvcc and none was found on PATH, in $CUDA_HOME/bin or "
                           "/usr/local/cuda/bin; install the CUDA toolkit or set NVCC to the compiler")
    return found


@lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown"


def normalize_arch(arch: str | int) -> str:
    """'sm_90', '90', '9.0', 'compute_90' -> 'sm_90' (suffixes such as sm_90a are kept)."""
    a = str(arch).strip().lower()
    if a.startswith(("sm_", "compute_")):
        return "sm_" + a.split("_", 1)[1]
    a = a.replace(".", "")
    if not re.fullmatch(r"\d{2,3}[af]?", a):
        raise BackendError(f"cannot read CUDA arch {arch!r}: use the form sm_90 (or 90, 9.0)")
    return "sm_" + a


_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'(?: for '([^']+)')?")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_STACK_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str) -> dict[str, Any]:
    """Per-kernel registers, shared memory, stack and spills from `ptxas -v` output (pure)."""
    kernels: dict[str, dict[str, int]] = {}
    frames: dict[str, tuple[int, int, int]] = {}      # every function with a properties block
    entry = None            # kernel whose "Used N registers" line comes next
    props_of = None         # function whose stack-frame line comes next
    for line in text.splitlines():
        m = _ENTRY_RE.search(line)
        if m:
            entry = m.group(1)
            kernels.setdefault(entry, {"registers": 0, "smem_bytes": 0, "spill_stores": 0,
                                       "spill_loads": 0, "stack_bytes": 0})
            continue
        m = _PROPS_RE.search(line)
        if m:
            props_of = m.group(1)
            continue
        m = _STACK_RE.search(line)
        if m and props_of:
            frames[props_of] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            props_of = None
            continue
        m = _REGS_RE.search(line)
        if m and entry:
            kernels[entry]["registers"] = int(m.group(1))
            s = _SMEM_RE.search(line)
            kernels[entry]["smem_bytes"] = int(s.group(1)) if s else 0
            entry = None
    for name, (stack, st, ld) in frames.items():
        if name in kernels:
            kernels[name].update(stack_bytes=stack, spill_stores=st, spill_loads=ld)
    spills = sum(st + ld for st, ld in ((f[1], f[2]) for f in frames.values()))
    return {"kernels": kernels,
            "max_registers": max((k["registers"] for k in kernels.values()), default=0),
            "max_smem_bytes": max((k["smem_bytes"] for k in kernels.values()), default=0),
            "spills": spills}


def _demangle(names: list[str], nvcc: str) -> dict[str, str]:
    """Readable kernel names via cu++filt (next to nvcc) or c++filt; {} when neither exists."""
    tool = None
    for cand in (os.path.join(os.path.dirname(os.path.realpath(nvcc)), "cu++filt"),
                 "/usr/local/cuda/bin/cu++filt", shutil.which("cu++filt"), shutil.which("c++filt")):
        if cand and os.access(cand, os.X_OK):
            tool = cand
            break
    if not tool or not names:
        return {}
    try:
        out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True,
                             timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {n: d.strip() for n, d in zip(names, out) if d.strip() and d.strip() != n}


# --------------------------------------------------------------------------------------------
# device discovery (host side: queries only, no CUDA context is created here)
# --------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def gpu_properties() -> dict[str, Any] | None:
    """Properties of device 0 as CuPy reports them, or None without CuPy or a visible GPU."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        props = dict(cupy.cuda.runtime.getDeviceProperties(0))
    except Exception:
        return None
    out: dict[str, Any] = {}
    for k, v in props.items():
        if isinstance(v, bytes):
            v = v.hex() if k == "uuid" else v.decode(errors="replace").rstrip("\x00")
        out[k] = v
    try:  # clockRate left cudaDeviceProp in CUDA 13; the attribute remains
        import cupy

        rt = cupy.cuda.runtime
        out.setdefault("clockRate", rt.deviceGetAttribute(rt.cudaDevAttrClockRate, 0))
        out.setdefault("memoryClockRate", rt.deviceGetAttribute(rt.cudaDevAttrMemoryClockRate, 0))
    except Exception:
        pass
    return out


def _detect_arch(cfg) -> str:
    env = os.environ.get("KFRAY_CUDA_ARCH", "").strip()
    if env:
        return normalize_arch(env)
    props = gpu_properties()
    if props and props.get("major") is not None:
        return f"sm_{props['major']}{props.get('minor', 0)}"
    return normalize_arch(getattr(cfg, "cuda_arch", "") or DEFAULT_ARCH)


def _static_facts(props: dict[str, Any], arch: str) -> dict[str, Any]:
    g = props.get
    l2 = int(g("l2CacheSize", 0) or 0)
    return {
        "name": str(g("name", "CUDA GPU")),
        "arch": arch,
        "compute_capability": f"{g('major', 0)}.{g('minor', 0)}",
        "sm_count": int(g("multiProcessorCount", 0) or 0),
        "global_memory_gb": round(int(g("totalGlobalMem", 0) or 0) / 1e9, 1),
        "l2_bytes": l2,
        "cache_bytes": l2 or (32 << 20),
        "shared_mem_per_block_bytes": int(g("sharedMemPerBlock", 0) or 0),
        "shared_mem_per_block_optin_bytes": int(g("sharedMemPerBlockOptin", 0) or 0),
        "shared_mem_per_sm_bytes": int(g("sharedMemPerMultiprocessor", 0) or 0),
        "registers_per_block": int(g("regsPerBlock", 0) or 0),
        "registers_per_sm": int(g("regsPerMultiprocessor", 0) or 0),
        "warp_size": int(g("warpSize", 32) or 32),
        "max_threads_per_block": int(g("maxThreadsPerBlock", 0) or 0),
        "max_threads_per_sm": int(g("maxThreadsPerMultiProcessor", 0) or 0),
        "clock_mhz": round(int(g("clockRate", 0) or 0) / 1e3),
        "memory_bus_bits": int(g("memoryBusWidth", 0) or 0),
        "uuid": str(g("uuid", "")),
        "pci_bus_id": f"{int(g('pciDomainID', 0) or 0):04x}:{int(g('pciBusID', 0) or 0):02x}:"
                      f"{int(g('pciDeviceID', 0) or 0):02x}",
    }


def measure_device() -> dict[str, Any]:
    """Copy bandwidth (read + write) and fp32 matmul rate of device 0; run in a throwaway process."""
    os.environ["CUPY_TF32"] = "0"   # fp32 means fp32: no tensor-core TF32 in cuBLAS
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)

    def timed(fn, reps: int) -> float:
        fn()
        stream.synchronize()
        ts = []
        for _ in range(reps):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            fn()
            b.record(stream)
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
        return float(np.median(ts))

    with stream:
        src = cp.ones(COPY_BYTES // 4, dtype=cp.float32)
        dst = cp.empty_like(src)
        t_copy = timed(lambda: dst.data.copy_from_device_async(src.data, COPY_BYTES, stream), 5)
        del src, dst
        a = cp.random.standard_normal((MATMUL_N, MATMUL_N), dtype=cp.float32)
        b = cp.random.standard_normal((MATMUL_N, MATMUL_N), dtype=cp.float32)
        t_mm = timed(lambda: cp.matmul(a, b), 5)
    return {"copy_bandwidth_gbps": round(2 * COPY_BYTES / t_copy / 1e9, 1),
            "fp32_matmul_tflops": round(2 * MATMUL_N ** 3 / t_mm / 1e12, 2)}


class _ReturnCode(int):
    """A nonzero kf_forward result that prints with its meaning (measure.py only formats rc).

    `after_zero`: kf_forward itself returned 0 and the harness found the problem afterwards."""

    def __new__(cls, code: int, text: str, after_zero: bool = False):
        obj = super().__new__(cls, code)
        obj.text = text
        obj.after_zero = after_zero
        return obj

    def __str__(self) -> str:
        if self.after_zero:
            return f"0, but {self.text}"
        return f"{int(self)} ({self.text})" if self.text else str(int(self))

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else format(int(self), spec)


PROBE_WROTE_EARLY = 10001
PROBE_READ_EARLY = 10002
PROBE_LEFT_RUNNING = 10003


class _Hold:
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
    def create(cls, cp) -> "_Hold | None":
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


def cuda_error_text(code: int) -> str:
    try:
        import cupy

        return str(cupy.cuda.runtime.CUDARuntimeError(int(code)))
    except Exception:
        return ""


# --------------------------------------------------------------------------------------------
# GPU references (CuPy; matmul goes to cuBLAS). Inputs are CuPy arrays or scalars.
# --------------------------------------------------------------------------------------------
def _axpb_gpu(a):
    return {"y": a["a"] * a["x"] + a["b"]}


def _softmax_gpu(a):
    import cupy as cp

    x = a["x"]
    e = cp.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


def _matmul_gpu(a):
    import cupy as cp

    return {"C": cp.matmul(a["A"], a["B"])}


GPU_REFERENCES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "axpb": _axpb_gpu, "softmax": _softmax_gpu, "matmul": _matmul_gpu,
}


def gpu_reference_for(task) -> Callable | None:
    """The CuPy reference of a built-in task ('axpb', 'builtin:axpb', 'axpb@gpu'...), else None."""
    for ref in (task.ref, task.name):
        base = str(ref or "").partition("@")[0]
        kind, _, name = base.partition(":") if ":" in base else ("builtin", "", base)
        if kind == "builtin" and name in GPU_REFERENCES:
            return GPU_REFERENCES[name]
    return None


class CudaBackend(Backend):
    name = "cuda"
    language = "cuda"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.cache = CompileCache(cfg.cache_dir or None, cfg.cache_server)
        self.arch = _detect_arch(cfg)
        self._facts: dict[str, Any] | None = None
        # sandbox state
        self.stream = None
        self._cp = None
        self._idle_sync_s = 0.0
        self._hold = None
        self._events = None
        self._probe_stream = None

    # --- host side ---------------------------------------------------------------------------
    def hardware_class(self) -> str:
        props = gpu_properties()
        if props:
            return "cuda:" + str(props.get("name", "gpu")).strip().replace(" ", "_")
        return f"cuda:{self.arch}"

    def device_facts(self) -> dict[str, Any]:
        if self._facts is not None:
            return dict(self._facts)
        props = gpu_properties()
        if not props:
            self._facts = {"name": "no GPU visible", "arch": self.arch}
            return dict(self._facts)
        facts = _static_facts(props, self.arch)
        ident = facts["uuid"] or facts["pci_bus_id"]
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{facts['name']}-{ident}")
        path = self.cache.root / "devices" / f"{slug}.json"
        measured = None
        try:
            measured = json.loads(path.read_text())
        except (OSError, ValueError):
            pass
        if not isinstance(measured, dict):
            measured = self._measure_in_subprocess()
            if "measure_error" not in measured:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(measured, indent=1))
                os.replace(tmp, path)
        facts.update(measured)
        self._facts = facts
        return dict(facts)

    def _measure_in_subprocess(self) -> dict[str, Any]:
        # A throwaway process, so the evaluator never holds a CUDA context (nor its memory) on the
        # GPU that its sandbox uses.
        env = {**os.environ, "CUPY_TF32": "0"}
        try:
            proc = subprocess.run([sys.executable, "-m", "kfray.eval.backends.cuda", "measure"],
                                  capture_output=True, text=True, timeout=300, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode == 0 and lines:
                return json.loads(lines[-1])
            return {"measure_error": (proc.stderr or proc.stdout).strip()[-500:] or f"exit {proc.returncode}"}
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            return {"measure_error": f"{type(e).__name__}: {e}"}

    def _harness_path(self) -> Path:
        digest = hashlib.sha256(HARNESS_HEADER.encode()).hexdigest()[:16]
        path = self.cache.root / "harness" / f"kf_harness_{digest}.h"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # threads compile at once
            tmp.write_text(HARNESS_HEADER)
            os.replace(tmp, path)
        return path

    def compile(self, source: str, params: dict[str, Any], task) -> Build:
        nvcc = nvcc_path()
        try:
            flags = BASE_FLAGS + [f"-arch={self.arch}"] + list(self.cfg.flags) + define_flags(params)
        except ValueError as e:
            raise CompileError(str(e)) from None
        key = CompileCache.key(source=source, flags=flags, arch=self.arch, compiler=nvcc_version(nvcc),
                               harness=HARNESS_HEADER, kind="cuda-so")
        t0 = time.perf_counter()
        hit = self.cache.lookup(key, ".so")
        if hit:
            try:
                facts = json.loads(self.cache.path(key, ".json").read_text())
            except (OSError, ValueError):
                facts = {}
            return Build(str(hit), time.perf_counter() - t0, True, facts)
        # An argument list, never a shell string: nothing from a model reaches a shell.
        tmp, rc, text = self.cache.compile_source(
            key, source, ".cu", lambda src, out: [nvcc, *flags, "--pre-include", str(self._harness_path()), str(src),
                                                  "-o", str(out)], self.cfg.compile_timeout_s)
        if rc != 0 or not tmp.exists():
            lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("ptxas info")
                     and not re.match(r"\s+\d+ bytes stack frame", ln)]
            msg = "\n".join(lines) or text
            raise CompileError(msg.strip()[-4000:] or f"nvcc exited with {rc}")
        facts = parse_ptxas(text)
        names = _demangle(list(facts["kernels"]), nvcc)
        for mangled, readable in names.items():
            facts["kernels"][mangled]["demangled"] = readable
        facts["arch"] = self.arch
        warnings = [ln for ln in text.splitlines() if "warning" in ln.lower()]
        if warnings:
            facts["compile_warnings"] = "\n".join(warnings)[-1500:]
        # The sidecar first: whoever sees the .so under its key also finds the facts.
        side = self.cache.temp_path(key, ".json")
        side.write_text(json.dumps(facts, indent=1))
        self.cache.commit(side, key, ".json")
        path = self.cache.commit(tmp, key, ".so")
        return Build(str(path), time.perf_counter() - t0, False, facts)

    # --- sandbox side ------------------------------------------------------------------------
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
        self._hold = _Hold.create(cp)
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
        ts = []
        for _ in range(30):
            t0 = time.perf_counter()
            cp.cuda.runtime.deviceSynchronize()
            ts.append(time.perf_counter() - t0)
        self._idle_sync_s = float(np.percentile(ts, 75))

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
                return _ReturnCode(rc, cuda_error_text(rc) if 0 < rc < 10000 else "")
            if err != 0:
                return _ReturnCode(err, f"cudaGetLastError() then reported {cuda_error_text(err) or err}: "
                                   "a launch failed and kf_forward did not check it", after_zero=True)
            if state["calls"] == PROBE_CALL and self._hold is not None:
                return self._probe(lambda: invoke(args), [args[n] for n in inputs], [args[n] for n in outputs])
            return 0

        call.keepalive = lib  # the library must outlive the callable
        return call

    def _probe(self, invoke: Callable[[], int], ins: list, outs: list) -> int:
        """Check the stream contract once per kernel: all its work must be ordered on `stream`.

        Events on our stream time only what is ordered there, so work elsewhere would look free.
        The call runs again with our stream held and the inputs still to arrive on it (poisoned,
        their restore queued behind the hold): outputs written meanwhile, outputs still changing
        after our stream finished, or a result that differs from an unhurried run, all mean work
        off the stream. Such a kernel is a runtime error with the reason."""
        cp = self._cp
        st = self.stream
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
            self._probe_stream.use()
            try:
                return all(bool(cp.isnan(o.ravel()).all()) for o in outs)   # kernels warmed in open_device
            finally:
                st.use()

        self._hold.arm(st, PROBE_HOLD_S)
        written = False
        try:
            for x, src in zip(ins, saved):
                x.data.copy_from_device_async(src.data, x.nbytes, st)
            rc = invoke()
            deadline = time.perf_counter() + PROBE_WAIT_S
            while not written and time.perf_counter() < deadline:
                written = not unwritten()
        finally:
            self._hold.release()
        st.synchronize()
        self._probe_stream.use()
        try:
            snap = [o.copy() for o in outs]
            self._probe_stream.synchronize()
            cp.cuda.runtime.deviceSynchronize()
            late = any(not bool(cp.array_equal(a, o, equal_nan=True)) for a, o in zip(snap, outs))
            differs = any(not bool(cp.array_equal(a, o, equal_nan=True)) for a, o in zip(first, outs))
        finally:
            st.use()
        if rc != 0:
            return _ReturnCode(rc, cuda_error_text(rc) if 0 < rc < 10000 else "")
        if self._hold.timed_out():
            return 0                      # it waited on the held stream itself: no verdict
        if written:
            return _ReturnCode(PROBE_WROTE_EARLY, "it wrote its outputs while work queued earlier on "
                               f"`stream` had not finished (work off the stream): {STREAM_CONTRACT}",
                               after_zero=True)
        if late:
            return _ReturnCode(PROBE_LEFT_RUNNING, "work it launched was still writing the outputs after "
                               f"`stream` had finished: {STREAM_CONTRACT}", after_zero=True)
        if differs:
            return _ReturnCode(PROBE_READ_EARLY, "its result changes when `stream` is busy with earlier "
                               f"work: it reads its inputs off the stream before they are ready; {STREAM_CONTRACT}",
                               after_zero=True)
        return 0

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
        out = {k: (cp.array(v, copy=True) if isinstance(v, (np.ndarray, cp.ndarray)) else v)
               for k, v in args.items()}
        self.stream.synchronize()
        cp.cuda.runtime.deviceSynchronize()   # uploads are complete whatever stream they took
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
        """Seconds of device work fn queues on our stream, from CUDA events.

        With the hold kernel (the usual case) the stream is held while fn launches and released
        once the stop event is queued, so the events time the device work back to back without the
        host's launch overhead (NVBench's blocking-kernel method). Work still running elsewhere
        after our stream finished makes the sample count host wall time, launch to completion."""
        cp = self._ensure_open()
        start, stop = self._events
        hold = self._hold
        if hold is not None:
            hold.arm(self.stream, TIMING_HOLD_S)
        t0 = time.perf_counter()
        try:
            start.record(self.stream)
            fn()
            stop.record(self.stream)
        finally:
            if hold is not None:
                hold.release()
        stop.synchronize()
        t_stream = time.perf_counter()
        cp.cuda.runtime.deviceSynchronize()
        t1 = time.perf_counter()
        ev = cp.cuda.get_elapsed_time(start, stop) / 1e3
        wall = t1 - t0
        left_running = (t1 - t_stream) > self._idle_sync_s + LEFT_RUNNING_SLACK_S and wall > 1.5 * ev
        unheld_gap = hold is None and wall > 1.5 * ev + 50e-6
        if left_running or unheld_gap:
            return max(wall, ev)
        return ev

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
        if getattr(task, "device_reference", None) is not None and _torch_cuda():
            return self._torch_reference(task, args)
        host = {k: (cp.asnumpy(v, stream=self.stream, blocking=True) if isinstance(v, cp.ndarray) else v)
                for k, v in args.items()}
        res = task.run_reference(host)
        return {k: cp.asarray(v) for k, v in res.items()}

    def _torch_reference(self, task, args: dict[str, Any]) -> dict[str, Any]:
        """Eager PyTorch on this GPU, on the kernel's own stream, so the baseline is timed on the
        device the candidate runs on (the way KernelBench times it), not on the host."""
        import torch

        cp = self._cp
        outs = {o.name for o in task.outputs}
        dev = {k: v for k, v in args.items() if k not in outs}
        with torch.cuda.stream(torch.cuda.ExternalStream(self.stream.ptr)):
            res = task.device_reference(dev, device="cuda:0")
        return {o.name: cp.from_dlpack(res[o.name].detach().contiguous()).astype(NP_TYPES[o.dtype], copy=False)
                for o in task.outputs}

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


if __name__ == "__main__":
    if sys.argv[1:] == ["measure"]:
        print(json.dumps(measure_device()))
    else:
        print("usage: python -m kfray.eval.backends.cuda measure", file=sys.stderr)
        sys.exit(2)


def _torch_cuda() -> bool:
    """PyTorch with CUDA is importable here (the torch extra on a GPU node)."""
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False
