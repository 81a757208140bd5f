"""CUDA backend: nvcc builds each candidate into a shared library that ctypes calls with CuPy arrays.

Host side (the evaluator) only needs `nvcc`: compile works with no GPU and no driver
(toolchain.py). The sandbox side lives in runtime.py; this class adds the host side to it.
"""
from __future__ import annotations

from typing import Any

from kfray.eval.backends.base import Build
from kfray.eval.backends.cuda.device import gpu_device_facts, gpu_properties
from kfray.eval.backends.cuda.runtime import CudaRuntime
from kfray.eval.backends.cuda.toolchain import compile_cuda, detect_arch
from kfray.eval.compile_cache import CompileCache


class CudaBackend(CudaRuntime):
    name = "cuda"
    language = "cuda"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.cache = CompileCache(cfg.cache_dir or None, cfg.cache_server, cfg.isolation)
        self.arch = detect_arch(cfg)
        self._facts: dict[str, Any] | None = None

    def hardware_class(self) -> str:
        props = gpu_properties()
        if props:
            return "cuda:" + str(props.get("name", "gpu")).strip().replace(" ", "_")
        return f"cuda:{self.arch}"

    def device_facts(self) -> dict[str, Any]:
        """Learned once per backend: measuring (or reading the cached measurement) costs seconds."""
        if self._facts is None:
            self._facts = gpu_device_facts(self.cache.root, self.arch)
        return dict(self._facts)

    def compile(self, source: str, params: dict[str, Any], task) -> Build:
        return compile_cuda(source, params, cache=self.cache, arch=self.arch, flags=self.cfg.flags,
                            timeout_s=self.cfg.compile_timeout_s)
