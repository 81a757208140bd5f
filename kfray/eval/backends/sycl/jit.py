"""Form `jit` (language `sycl_jit`): SYCL C++ free-function kernels compiled at run time by the
`sycl_ext_oneapi_kernel_compiler` extension of intel-sycl-rt.

The candidate holds kernels only, plus one `@kf.launch` declaration per launch. Each kernel is an
`extern "C"` free function with `SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<N>))`
that takes the task's arguments in order (tensors as pointers to USM memory, scalars by value).
@kf.param values are `#define`d after the includes (kfray.eval.backends.sycl.defines). A build is
kept in the compile cache as the SYCLBIN of its object-state bundle; in the sandbox
`kfray_sycl_host.so` links it for the device and launches its kernels on the backend's queue.
"""
from __future__ import annotations

import base64
import ctypes
import os
import subprocess
from pathlib import Path
from typing import Any

from kfray.eval.backends.sycl.defines import inject_defines, line_shift
from kfray.eval.backends.sycl.diagnostics import clean_diagnostics
from kfray.eval.backends.sycl.form import CTYPE
from kfray.eval.backends.sycl.host_tools import ARG_KIND, ERR_CAP, error_buffer
from kfray.eval.backends.sycl.kernel_form import KernelCall, KernelForm
from kfray.source import Launch

JIT_OPTIONS: list[str] = []            # the kernel compiler's defaults (-O2 style) are kept


class JitCall(KernelCall):
    """The kernels of one SYCLBIN, launched through the host library; events go to the backend."""

    def __init__(self, form: KernelForm, manifest: dict, launches: list[Launch], task):
        super().__init__(form, manifest, launches, task)
        backend = self.backend
        lib, err = backend.lib, error_buffer()
        data = base64.b64decode(manifest["syclbin"])
        self.bundle = lib.kf_bundle_load(backend.qptr, data, len(data), err, ERR_CAP)
        if not self.bundle:
            raise RuntimeError(err.value.decode(errors="replace"))
        self.kernels = {}
        for ln in launches:
            if ln.kernel not in self.kernels:
                k = lib.kf_kernel_get(self.bundle, ln.kernel.encode(), err, ERR_CAP)
                if not k:
                    raise RuntimeError(err.value.decode(errors="replace"))
                self.kernels[ln.kernel] = k
        n = len(self.names)
        self.kinds = (ctypes.c_int * n)(*[0 if a.name in self.tensors else ARG_KIND[a.dtype] for a in task.args])

    def __call__(self, args: dict[str, Any]) -> int:
        b = self.backend
        lib = b.lib
        store = [ctypes.c_void_p(args[n].ptr) if n in self.tensors else CTYPE[self.dtypes[n]](args[n])
                 for n in self.names]
        values = (ctypes.c_void_p * len(store))(*[ctypes.addressof(s) for s in store])
        err = error_buffer()
        for ln, (g, loc) in zip(self.launches, self.ranges(args)):
            dims = len(g)
            ev = lib.kf_launch(b.qptr, self.kernels[ln.kernel], len(store), self.kinds, values, dims,
                               (ctypes.c_size_t * dims)(*g), (ctypes.c_size_t * dims)(*loc), err, ERR_CAP)
            if not ev:
                raise RuntimeError(err.value.decode(errors="replace"))
            b.record("host", ev)
        return 0

    def __del__(self):
        lib = getattr(self.backend, "lib", None)
        if lib is None:
            return
        for k in getattr(self, "kernels", {}).values():
            lib.kf_kernel_free(k)
        if getattr(self, "bundle", None):
            lib.kf_bundle_free(self.bundle)


class JitForm(KernelForm):
    name = "jit"
    language = "sycl_jit"
    tool_language = "sycl"
    seconds_fact = "jit_compile_s"
    call = JitCall

    def __init__(self, backend):
        super().__init__(backend)
        self.no_pch = False          # set when the kernel compiler rejects the auto-PCH option

    def options(self) -> list[str]:
        """Kernel-compiler options: a persistent auto-PCH of the SYCL headers next to the host tools
        (about 0.6 s less per kernel once built; $KFRAY_SYCL_PCH=0 turns it off)."""
        if os.environ.get("KFRAY_SYCL_PCH", "1") == "0" or self.no_pch:
            return list(JIT_OPTIONS)
        pch = self.backend.tools().library.parent / "pch"
        pch.mkdir(parents=True, exist_ok=True)
        return [*JIT_OPTIONS, f"--persistent-auto-pch={pch}"]

    def prepare(self, source: str, params: dict[str, Any]) -> tuple[str, list[str], tuple[int, int]]:
        opts = self.options() + list(self.backend.cfg.flags)
        return inject_defines(source, params), opts, line_shift(source, params)

    def build(self, out: Path, kernels: list[str], opts: list[str], text: str):
        proc = self.run_tool(out, kernels, opts, text)
        if proc.returncode == 1 and "auto-pch" in (proc.stderr or "").lower() and not self.no_pch:
            self.no_pch = True               # this runtime's compiler lacks it: build without
            opts = [o for o in opts if not o.startswith("--persistent-auto-pch")]
            proc = self.run_tool(out, kernels, opts, text)
        return proc, opts

    def payload(self, source: str, opts: list[str], binary: Path) -> dict[str, Any]:
        return {"syclbin": base64.b64encode(binary.read_bytes()).decode()}

    def warnings(self, proc: subprocess.CompletedProcess, shift: tuple[int, int]) -> str:
        return clean_diagnostics(proc.stdout, shift)
