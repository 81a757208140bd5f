"""One interface for every device (Kernel Tuner style): compile on the host, run in the sandbox.

`compile` runs in the evaluator (or a compile pool) and never touches the device. Everything
else runs inside the sandbox worker process, where generated code is allowed to execute.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


class CompileError(Exception):
    """The compiler rejected the source; the message is its diagnostics."""


@dataclass
class Build:
    artifact: str                 # path of what `load` takes (shared library, cubin, ...)
    seconds: float
    cached: bool
    facts: dict[str, Any] = field(default_factory=dict)   # registers, spills... from the compiler


class Backend(ABC):
    name: str = ""
    language: str = ""
    split: bool = False       # candidates run in their own runner process (load_remote), apart from the judge

    def __init__(self, cfg):
        self.cfg = cfg            # kfray.config.EvalConfig

    # --- host side ---------------------------------------------------------------------------
    @abstractmethod
    def hardware_class(self) -> str:
        """Name of the hardware class this backend's device belongs to (islands target one)."""

    @abstractmethod
    def device_facts(self) -> dict[str, Any]:
        """Facts for prompts: name, cores or SMs, memory, caches, vector/warp widths..."""

    @abstractmethod
    def compile(self, source: str, params: dict[str, Any], task) -> Build:
        """Compile into the content-addressed cache; raise CompileError with the diagnostics."""

    # --- sandbox side ------------------------------------------------------------------------
    def open_device(self) -> None:
        """Called once when a sandbox worker starts."""

    @abstractmethod
    def load(self, artifact: str, task) -> Callable[[dict[str, Any]], int]:
        """Return fn(device_args) -> return code of kf_forward (what `run_job` calls)."""

    def load_remote(self, runner, arena, artifact: str, task) -> Callable[[dict[str, Any]], int]:
        """Like `load`, but the candidate is loaded in `runner` (kfray.eval.remote) and works on
        buffers of `arena` (kfray.eval.shared); backends with `split` implement it."""
        raise NotImplementedError(f"backend {self.name} runs candidates in the judge")

    def run_job(self, fn: Callable, task, job: dict) -> dict:
        """Correctness and timing of a loaded kernel (kfray.eval.measure); a backend whose kernels
        have another calling form (kfray.eval.backends.torch_ext) brings its own."""
        from kfray.eval.measure import run_job
        return run_job(self, fn, task, job)

    def make_args(self, task, shape: str, rng) -> dict[str, Any]:
        """Fresh inputs for one shape config, where this backend is fastest to make them: on the
        host, a task's own draw (torch tasks) or windows of a pool of random values."""
        from kfray.tasks.base import Task
        if type(task).make_args is not Task.make_args:
            return task.make_args(shape, rng)
        if getattr(self, "_pool", None) is None:
            from kfray.eval.draws import InputPool
            self._pool = InputPool()
        return task.make_args(shape, rng, normal=self._pool.normal)

    def to_device(self, args: dict[str, Any]) -> dict[str, Any]:
        return args

    def to_host(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    def synchronize(self) -> None:
        pass

    def time_call(self, fn: Callable[[], Any]) -> float:
        """Seconds one call of fn takes on the device, fully completed."""
        import time
        t0 = time.perf_counter()
        fn()
        self.synchronize()
        return time.perf_counter() - t0

    def reference(self, task, args: dict[str, Any]) -> dict[str, Any]:
        """Run the task's reference on this backend's arrays (host numpy by default)."""
        return task.run_reference(args)

    def check_sticky_error(self) -> str | None:
        """Name of an error that poisons the process (CUDA sticky errors), else None."""
        return None


_BACKENDS: dict[str, str] = {
    "cpu": "kfray.eval.backends.cpu:CpuBackend",
    "cuda": "kfray.eval.backends.cuda:CudaBackend",
    "sycl": "kfray.eval.backends.sycl:SyclBackend",
    "sim": "kfray.eval.backends.sim:SimBackend",
    "torch_ext_cpu": "kfray.eval.backends.torch_ext:TorchExtCpuBackend",
    "torch_ext_cuda": "kfray.eval.backends.torch_ext_cuda:TorchExtCudaBackend",
}


def backend_class(name: str) -> type[Backend]:
    import importlib

    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r} (known: {', '.join(_BACKENDS)})")
    mod, _, cls = _BACKENDS[name].partition(":")
    return getattr(importlib.import_module(mod), cls)


def get_backend(name: str, cfg) -> Backend:
    return backend_class(name)(cfg)
