"""PyTorch CUDA extensions (robust-kbench `.cu` kernels, KernelBench ModelNew on the GPU): built by
nvcc like the CPU form is by g++, called on tensors on GPU 0, timed with CUDA events."""
from __future__ import annotations


import time
from typing import Any, Callable

from kfray.errors import BackendError
from kfray.eval.backends.torch_ext import TorchExtCpuBackend

# What torch.utils.cpp_extension gives nvcc, so published kernels build as they did for their authors.
NVCC_TORCH_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                    "--expt-relaxed-constexpr"]
LEFT_RUNNING_S = 50e-6            # a device sync this much longer than the stream's: work elsewhere


class TorchExtCudaBackend(TorchExtCpuBackend):
    """CUDA extensions built by nvcc, called on tensors on GPU 0 and timed with CUDA events."""

    name = "torch_ext_cuda"
    device = "cuda"
    suffix = ".cu"

    def __init__(self, cfg):
        super().__init__(cfg)
        from kfray.eval.backends.cuda import detect_arch

        self.arch = detect_arch(cfg)
        self._events = None
        self._facts: dict[str, Any] | None = None

    def hardware_class(self) -> str:
        from kfray.eval.backends.cuda import gpu_properties

        props = gpu_properties()
        return "cuda:" + str(props.get("name", "gpu")).strip().replace(" ", "_") if props else f"cuda:{self.arch}"

    def device_facts(self) -> dict[str, Any]:
        """The CUDA backend's facts, measured bandwidth and fp32 rate included (CuPy); learned once,
        since an evaluation asks several times (fit, cache size, peak fractions)."""
        from kfray.eval.backends.cuda import CudaBackend

        if self._facts is None:
            try:
                self._facts = CudaBackend(self.cfg).device_facts()
            except Exception:
                self._facts = {"name": "CUDA GPU", "arch": self.arch}
        return dict(self._facts)

    def _compiler(self) -> tuple[str, str]:
        from kfray.eval.backends.cuda import nvcc_path, nvcc_version

        nvcc = nvcc_path()
        return nvcc, nvcc_version(nvcc)

    def _common_flags(self, info: dict) -> list[str]:
        return [f"-std={info['std']}", "-O3", f"-arch={self.arch}", "-Xcompiler", "-fPIC", *NVCC_TORCH_FLAGS,
                *[f"-I{d}" for d in info["includes"]], "-DTORCH_API_INCLUDE_EXTENSION_H",
                f"-D_GLIBCXX_USE_CXX11_ABI={info['abi']}", *self.cfg.flags]

    def _link_flags(self, info: dict) -> list[str]:
        # A CPU-only torch has no CUDA libraries: the build still compiles (a check without a GPU).
        cuda = ["-lc10_cuda", "-ltorch_cuda"] if info["cuda_libs"] else []
        return ["-shared", f"-L{info['lib']}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", *cuda,
                "-Xlinker", "-rpath", "-Xlinker", info["lib"]]

    def _key_facts(self) -> dict[str, Any]:
        return {"arch": self.arch}

    def _suite_flags(self, task) -> list[str]:
        """robust-kbench builds every kernel with nvcc -O3 --use_fast_math (eval.suite_flags)."""
        suite = getattr(task, "suite", None)
        return ["--use_fast_math"] if self.cfg.suite_flags and suite is not None and suite.kind == "rkb" else []

    def _arch_list(self) -> str:
        digits = self.arch.replace("sm_", "").replace("compute_", "")
        return f"{digits[:-1]}.{digits[-1]}" if digits.isdigit() and len(digits) >= 2 else ""

    def _pch(self, *args) -> list[str]:
        return []     # nvcc cannot use a GCC precompiled header

    def open_device(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise BackendError("the torch_ext_cuda backend needs a CUDA build of PyTorch and a visible GPU")
        torch.cuda.set_device(0)
        torch.backends.cuda.matmul.allow_tf32 = False    # the reference stays true fp32
        torch.backends.cudnn.allow_tf32 = False
        self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        torch.ones(64, device="cuda").sum().item()         # context, allocator, a first kernel
        self.time_call(lambda: None)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def time_call(self, fn: Callable[[], Any]) -> float:
        """CUDA events on the current stream around fn (as KernelBench times); a sample whose work
        outlives the stream (another stream) counts host wall time instead."""
        import torch

        start, stop = self._events
        t0 = time.perf_counter()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        t_stream = time.perf_counter()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        ev = start.elapsed_time(stop) / 1e3
        return max(ev, t1 - t0) if t1 - t_stream > LEFT_RUNNING_S else ev

    def check_sticky_error(self) -> str | None:
        import torch

        if self._events is None:
            return None
        try:
            torch.cuda.synchronize()
        except Exception as e:   # an illegal address and the like: the context is gone
            return f"{type(e).__name__}: {e}"
        return None
