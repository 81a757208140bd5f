"""CUDA backend: nvcc builds each candidate into a shared library that ctypes calls with CuPy arrays.

One job per module:
  toolchain   nvcc, arch, flags, `ptxas -v` facts, compile (host side, no GPU needed)
  device      device properties and measured bandwidth / matmul rate (prompt facts)
  timing      CUDA-event timing on the harness's stream
  probe       StreamHold and the stream-contract probe
  returncode  readable kf_forward return codes
  references  GPU references of the built-in tasks (CuPy) and of PyTorch tasks
  runtime     the sandbox side (CudaRuntime)
  backend     CudaBackend: the runtime plus the host side
`python -m kfray.eval.backends.cuda measure` runs the device measurement (__main__.py).
"""
from kfray.eval.backends.cuda.backend import CudaBackend
from kfray.eval.backends.cuda.device import (COPY_BYTES, MATMUL_N, gpu_device_facts, gpu_properties,
                                             measure_device, measure_in_subprocess, static_facts)
from kfray.eval.backends.cuda.probe import (PROBE_CALL, PROBE_HOLD_S, PROBE_LEFT_RUNNING, PROBE_READ_EARLY,
                                            PROBE_WAIT_S, PROBE_WROTE_EARLY, STREAM_CONTRACT, StreamHold,
                                            probe_stream_contract)
from kfray.eval.backends.cuda.references import (GPU_REFERENCES, gpu_reference_for, torch_cuda_available,
                                                 torch_reference)
from kfray.eval.backends.cuda.returncode import ReturnCode, cuda_error_text, kernel_return_code
from kfray.eval.backends.cuda.runtime import CudaRuntime
from kfray.eval.backends.cuda.timing import (LEFT_RUNNING_SLACK_S, TIMING_HOLD_S, idle_sync_seconds,
                                             time_on_stream)
from kfray.eval.backends.cuda.toolchain import (BASE_FLAGS, DEFAULT_ARCH, HARNESS_HEADER, compile_cuda,
                                                demangle, detect_arch, harness_path, normalize_arch,
                                                nvcc_path, nvcc_version, parse_ptxas)

__all__ = [
    # backend
    "CudaBackend", "CudaRuntime",
    # toolchain
    "BASE_FLAGS", "DEFAULT_ARCH", "HARNESS_HEADER", "compile_cuda", "demangle", "detect_arch",
    "harness_path", "normalize_arch", "nvcc_path", "nvcc_version", "parse_ptxas",
    # device
    "COPY_BYTES", "MATMUL_N", "gpu_device_facts", "gpu_properties", "measure_device",
    "measure_in_subprocess", "static_facts",
    # timing
    "LEFT_RUNNING_SLACK_S", "TIMING_HOLD_S", "idle_sync_seconds", "time_on_stream",
    # probe and return codes
    "PROBE_CALL", "PROBE_HOLD_S", "PROBE_LEFT_RUNNING", "PROBE_READ_EARLY", "PROBE_WAIT_S",
    "PROBE_WROTE_EARLY", "STREAM_CONTRACT", "StreamHold", "probe_stream_contract",
    "ReturnCode", "cuda_error_text", "kernel_return_code",
    # references
    "GPU_REFERENCES", "gpu_reference_for", "torch_cuda_available", "torch_reference",
]
