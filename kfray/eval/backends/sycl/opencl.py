"""Form `opencl` (language `opencl`): OpenCL C kernels with the same `@kf.launch` declarations as
the jit form; dimension d of a declaration is what `get_global_id(d)` counts.

The compile tool checks the build for the device; the sandbox builds the program again with
`dpctl.program` (once per source and options) and submits its kernels on the backend's queue.
@kf.param values are `-D` flags: OpenCL C has no headers for them to rewrite.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kfray.eval.backends.sycl.form import CTYPE
from kfray.eval.backends.sycl.kernel_form import KernelCall, KernelForm
from kfray.eval.compile_cache import CompileCache
from kfray.source import Launch, define_flags

OPENCL_STD = ["-cl-std=CL3.0"]         # OpenCL C 3.0 (work_group_reduce_*, sub-groups) unless flags say


class OpenCLCall(KernelCall):
    """The kernels of one OpenCL C program, submitted through dpctl; events go to the backend."""

    def __init__(self, form: OpenCLForm, manifest: dict, launches: list[Launch], task):
        super().__init__(form, manifest, launches, task)
        import dpctl.program as dp

        key = CompileCache.key(source=manifest["source"], options=manifest["options"])
        prog = form.programs.get(key)
        if prog is None:
            try:
                prog = dp.create_program_from_source(self.backend.queue, manifest["source"], manifest["options"])
            except Exception as e:
                raise RuntimeError(f"dpctl could not build the OpenCL C program: {type(e).__name__} {e}") from None
            form.programs[key] = prog
        self.kernels = {}
        for ln in launches:
            if ln.kernel not in self.kernels:
                if not prog.has_sycl_kernel(ln.kernel):
                    raise RuntimeError(f"no __kernel named {ln.kernel!r} in the OpenCL C program")
                self.kernels[ln.kernel] = prog.get_sycl_kernel(ln.kernel)

    def __call__(self, args: dict[str, Any]) -> int:
        b = self.backend
        kargs = [args[n].mem if n in self.tensors else CTYPE[self.dtypes[n]](args[n]) for n in self.names]
        for ln, (g, loc) in zip(self.launches, self.ranges(args)):
            # SYCL's last dimension is OpenCL's dimension 0: reverse, so get_global_id(d) counts entry d.
            ev = b.queue.submit(self.kernels[ln.kernel], kargs, list(g[::-1]), list(loc[::-1]))
            b.record("dpctl", ev)
        return 0


class OpenCLForm(KernelForm):
    name = "opencl"
    language = "opencl"
    tool_language = "opencl"
    seconds_fact = "opencl_build_s"
    call = OpenCLCall

    def __init__(self, backend):
        super().__init__(backend)
        self.programs: dict[str, Any] = {}     # sandbox side: built programs by source and options

    def prepare(self, source: str, params: dict[str, Any]) -> tuple[str, list[str], tuple[int, int]]:
        flags = list(self.backend.cfg.flags)
        std = [] if any(str(f).startswith("-cl-std") for f in flags) else OPENCL_STD
        return source, std + define_flags(params) + flags, (0, 0)

    def payload(self, source: str, opts: list[str], binary: Path) -> dict[str, Any]:
        return {"source": source, "options": " ".join(opts)}
