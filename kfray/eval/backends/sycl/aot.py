"""Form `aot` (language `sycl`): whole SYCL programs built ahead of time by `icpx -fsycl` (or
`acpp`), when one is on PATH, exporting `extern "C" int kf_forward(<task args>, sycl::queue* queue)`.

The program submits its own work, so the backend times a call between two barriers on its queue.
@kf.param values are `#define`d after the includes, as for the jit form.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from kfray.errors import BackendError
from kfray.eval.backends.base import Build, CompileError
from kfray.eval.backends.sycl.defines import inject_defines, line_shift
from kfray.eval.backends.sycl.diagnostics import clean_diagnostics
from kfray.eval.backends.sycl.form import CTYPE, SourceForm
from kfray.eval.compile_cache import CompileCache
from kfray.tasks.base import Tensor


class AotForm(SourceForm):
    name = "aot"
    language = "sycl"
    host_barriers = True

    def __init__(self, backend):
        super().__init__(backend)
        self.compiler = shutil.which("icpx") or shutil.which("acpp") or ""
        if not self.compiler:
            raise BackendError("eval.sycl_form 'aot' compiles whole SYCL programs with icpx -fsycl (or acpp), "
                               "and neither is on PATH; install the oneAPI DPC++ compiler, or use "
                               "sycl_form 'jit' (run-time compiled kernels) or 'opencl'")

    def compile(self, source: str, params: dict[str, Any], task) -> Build:
        b, cxx = self.backend, self.compiler
        # params as #defines after the includes, as for jit (see kfray.eval.backends.sycl.defines)
        source, shift = inject_defines(source, params), line_shift(source, params)
        if Path(cxx).name.startswith("acpp"):
            flags = ["-O3", "-std=c++17", "-shared", "-fPIC"]
        else:
            flags = ["-fsycl", "-O3", "-std=c++17", "-shared", "-fPIC"]
        flags += list(b.cfg.flags)
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
        key = CompileCache.key(source=source, flags=flags, compiler=version, kind="sycl-aot")
        t0 = time.perf_counter()
        hit = b.cache.lookup(key, ".so")
        if hit:
            return Build(str(hit), time.perf_counter() - t0, True, {"sycl_form": "aot"})
        tmp, rc, text = b.cache.compile_source(
            key, source, ".cpp", lambda src, out: [cxx, *flags, str(src), "-o", str(out)], b.cfg.compile_timeout_s)
        if rc != 0 or not tmp.exists():
            raise CompileError(clean_diagnostics(text, shift) or f"{Path(cxx).name} exited with {rc}")
        path = b.cache.commit(tmp, key, ".so")
        return Build(str(path), time.perf_counter() - t0, False, {"sycl_form": "aot"})

    def load(self, artifact: str, task):
        lib = ctypes.CDLL(artifact, mode=ctypes.RTLD_LOCAL)
        try:
            fn = lib.kf_forward
        except AttributeError:
            raise RuntimeError('the library does not export kf_forward (declare it extern "C")') from None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p if isinstance(a, Tensor) else CTYPE[a.dtype] for a in task.args] \
            + [ctypes.c_void_p]
        names = [a.name for a in task.args]
        tensors = {a.name for a in task.args if isinstance(a, Tensor)}
        b = self.backend

        def call(args: dict[str, Any]) -> int:
            return fn(*[args[n].ptr if n in tensors else args[n] for n in names], b.qptr)

        call.keepalive = lib
        return call
