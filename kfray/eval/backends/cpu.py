"""CPU backend: C++ with OpenMP, built by g++ into a shared library and called through ctypes."""
from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import time
from functools import lru_cache
from typing import Any

import numpy as np

from kfray.config import kernel_threads, usable_cores
from kfray.errors import BackendError
from kfray.eval.backends.base import Backend, Build, CompileError
from kfray.eval.backends.cpu_peaks import cpu_peaks
from kfray.eval.backends.cpu_pch import pch_flags
from kfray.eval.compile_cache import CompileCache
from kfray.source import define_flags
from kfray.tasks.base import Tensor

BASE_FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC"]
GUARD_BYTES = 4096     # canary zone before and after every buffer a kernel gets
ALIGN_BYTES = 64
_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double,
           "int32": ctypes.c_int32, "int64": ctypes.c_int64}


def compiler() -> str:
    env = os.environ.get("CXX", "")
    cxx = env or shutil.which("g++")
    if not cxx:
        raise BackendError("the cpu backend needs g++ and none is on PATH; install it "
                           "(Debian/Ubuntu: apt-get install g++) or set CXX to a C++ compiler")
    if env and not shutil.which(env):
        raise BackendError(f"CXX is set to {env!r}, which is not an executable compiler; set CXX to a C++ "
                           "compiler (e.g. CXX=g++) or unset it to use g++ from PATH")
    return cxx


@lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    try:
        proc = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise BackendError(f"the C++ compiler {cxx!r} cannot be run ({type(e).__name__}: {e}); install g++ "
                           "(Debian/Ubuntu: apt-get install g++) or set CXX to a working C++ compiler") from None
    lines = (proc.stdout or proc.stderr).splitlines()
    if proc.returncode != 0 or not lines:
        raise BackendError(f"the C++ compiler {cxx!r} failed to report its version (exit {proc.returncode}); "
                           "set CXX to a working C++ compiler")
    return lines[0]


@lru_cache(maxsize=None)
def cpu_facts() -> dict[str, Any]:
    name = platform.processor() or "cpu"
    flags = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and name in ("", "cpu", "x86_64"):
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = line.split(":", 1)[1]
                break
    except OSError:
        pass
    simd = [f for f in ("avx512f", "avx2", "fma", "avx", "sse4_2", "neon") if f" {f} " in f" {flags} "]

    def cache(level: str) -> int:
        for idx in range(8):
            base = f"/sys/devices/system/cpu/cpu0/cache/index{idx}/"
            try:
                if open(base + "level").read().strip() == level and "Instruction" not in open(base + "type").read():
                    s = open(base + "size").read().strip()
                    return int(s[:-1]) * (1024 if s.endswith("K") else 1024 * 1024) if s[-1] in "KM" else int(s)
            except OSError:
                continue
        return 0

    return {"name": name, "cores": usable_cores(), "simd": simd,
            "l1d_bytes": cache("1"), "l2_bytes": cache("2"), "cache_bytes": cache("3") or cache("2"),
            "vector_width_floats": 16 if "avx512f" in simd else 8 if "avx2" in simd else 4}


class CpuBackend(Backend):
    name = "cpu"
    language = "cpp"
    split = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.cache = CompileCache(cfg.cache_dir or None, cfg.cache_server, cfg.isolation)

    def hardware_class(self) -> str:
        return "cpu"

    def device_facts(self) -> dict[str, Any]:
        facts = dict(cpu_facts())
        facts["threads_for_kernels"] = kernel_threads(self.cfg)
        if getattr(self, "_peaks", None) is None:     # measured copy bandwidth and FMA peak, where a run
            try:                                        # on this machine measured them (never here)
                cxx = compiler()
                self._peaks = cpu_peaks(cxx, compiler_version(cxx), facts["name"], facts["threads_for_kernels"],
                                        self.cache.root, measure_now=False)
            except BackendError:
                self._peaks = {}
        facts.update(self._peaks)
        return facts

    def compile(self, source: str, params: dict[str, Any], task) -> Build:
        cxx = compiler()
        try:
            flags = BASE_FLAGS + list(self.cfg.flags) + define_flags(params)
        except ValueError as e:
            raise CompileError(str(e)) from None
        key = CompileCache.key(source=source, flags=flags, compiler=compiler_version(cxx),
                               cpu=cpu_facts()["name"], kind="cpu-so")
        t0 = time.perf_counter()
        hit = self.cache.lookup(key, ".so")
        if hit:
            return Build(str(hit), time.perf_counter() - t0, True)
        pch = pch_flags(source, cxx, compiler_version(cxx), flags, self.cache.root)   # same build, faster
        tmp, rc, text = self.cache.compile_source(
            key, source, ".cpp", lambda src, out: [cxx, *flags, *pch, str(src), "-o", str(out)],
            self.cfg.compile_timeout_s)
        if rc != 0 or not tmp.exists():
            raise CompileError(text[-4000:] or f"compiler exited with {rc}")
        path = self.cache.commit(tmp, key, ".so")
        return Build(str(path), time.perf_counter() - t0, False)

    def load(self, artifact: str, task):
        lib = ctypes.CDLL(artifact, mode=ctypes.RTLD_LOCAL)
        try:
            fn = lib.kf_forward
        except AttributeError:
            raise RuntimeError("the library does not export kf_forward (declare it extern \"C\")") from None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p if isinstance(a, Tensor) else _CTYPES[a.dtype] for a in task.args]
        names = [a.name for a in task.args]
        tensors = {a.name for a in task.args if isinstance(a, Tensor)}

        def call(args: dict[str, Any]) -> int:
            return fn(*[args[n].ctypes.data if n in tensors else args[n] for n in names])

        call.keepalive = lib  # the library must outlive the callable
        return call

    def load_remote(self, runner, arena, artifact: str, task):
        """kf_forward loaded in the candidate's runner; the buffers it gets live in `arena`."""
        from kfray.eval.remote import RemoteKernel

        self.arena = arena
        return RemoteKernel(runner, arena, artifact, task)

    def to_device(self, args):
        # Own copies, so a kernel cannot reach the harness's arrays; each between guard zones.
        return {k: (self._guarded_copy(v) if isinstance(v, np.ndarray) else v) for k, v in args.items()}

    # --- guard zones: writes outside a buffer are caught, not silently absorbed -------------------
    def _canary_bytes(self) -> np.ndarray:
        if getattr(self, "_canary", None) is None:
            self._canary = np.frombuffer(os.urandom(GUARD_BYTES), dtype=np.uint8)   # unguessable
        return self._canary

    def _guarded_copy(self, v: np.ndarray) -> np.ndarray:
        """A copy of `v`, 64-byte aligned, between two GUARD_BYTES zones filled with random canary bytes."""
        canary = self._canary_bytes()
        nb = v.nbytes
        arena = getattr(self, "arena", None)          # shared with the candidate's runner
        size = nb + 2 * GUARD_BYTES + ALIGN_BYTES
        buf = arena.empty(size) if arena is not None else np.empty(size, dtype=np.uint8)
        off = GUARD_BYTES + (-buf.ctypes.data) % ALIGN_BYTES
        buf[off - GUARD_BYTES:off] = canary
        buf[off + nb:off + nb + GUARD_BYTES] = canary
        out = buf[off:off + nb].view(v.dtype).reshape(v.shape)
        out[...] = v
        return out

    def check_guards(self, dev: dict[str, Any]) -> str | None:
        """None when every guard zone around `dev`'s buffers is intact, else what was overwritten."""
        canary = self._canary_bytes()
        for name, a in dev.items():
            if not isinstance(a, np.ndarray):
                continue
            root = a
            while isinstance(root.base, np.ndarray):
                root = root.base
            if root is a or root.dtype != np.uint8 or root.ndim != 1:
                continue
            off = a.ctypes.data - root.ctypes.data
            end = off + a.nbytes
            if off < GUARD_BYTES or end + GUARD_BYTES > root.nbytes:
                continue
            lo, hi = root[off - GUARD_BYTES:off], root[end:end + GUARD_BYTES]
            where = []
            if not np.array_equal(lo, canary):
                first = int(np.argmax(lo != canary))
                where.append(f"up to {GUARD_BYTES - first} bytes before its start")
            if not np.array_equal(hi, canary):
                last = GUARD_BYTES - 1 - int(np.argmax((hi != canary)[::-1]))
                where.append(f"up to {last + 1} bytes past its end")
            if where:
                return (f"the kernel wrote outside tensor {name} ({' and '.join(where)}: the guard zone around it "
                        f"changed); write only {name}[0 .. {a.size - 1}]")
        return None
