"""What the CUDA device is: its properties (queried, no context kept) and a measured copy
bandwidth and fp32 matmul rate, cached per device so prompts and roofline ceilings can use them."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

COPY_BYTES = 256 << 20
MATMUL_N = 4096


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


def static_facts(props: dict[str, Any], arch: str) -> dict[str, Any]:
    """The prompt-facing facts that the device properties give without running anything."""
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


def measure_in_subprocess() -> dict[str, Any]:
    """measure_device in a throwaway process (`python -m kfray.eval.backends.cuda measure`), so the
    evaluator never holds a CUDA context (nor its memory) on the GPU that its sandbox uses."""
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


def gpu_device_facts(cache_root: Path, arch: str) -> dict[str, Any]:
    """Static facts of device 0 plus its measurements, which are kept under cache_root/devices
    (one file per device) since measuring takes seconds; a failed measurement is not kept."""
    props = gpu_properties()
    if not props:
        return {"name": "no GPU visible", "arch": arch}
    facts = static_facts(props, arch)
    ident = facts["uuid"] or facts["pci_bus_id"]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{facts['name']}-{ident}")
    path = cache_root / "devices" / f"{slug}.json"
    measured = None
    try:
        measured = json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    if not isinstance(measured, dict):
        measured = measure_in_subprocess()
        if "measure_error" not in measured:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(measured, indent=1))
            os.replace(tmp, path)
    facts.update(measured)
    return facts
