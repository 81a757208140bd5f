"""The SYCL runtime as kfray finds it: packages, OpenCL ICD set-up, devices, facts, Ray resources.

Everything here works from the pip packages of the `sycl` extra (dpctl, intel-sycl-rt,
intel-opencl-rt) or from a oneAPI install named by $KFRAY_SYCL_ROOT, and imports dpctl lazily, so
the module imports where SYCL is missing.

- `ensure_icd_env()` sets OCL_ICD_FILENAMES to intel-opencl-rt's libintelocl.so when it is unset
  (the .icd file that package ships points at a build machine's path, so without this dpctl sees
  no OpenCL CPU device). It must run before the SYCL runtime's first device query in a process.
- `select_device(filter)` returns a dpctl device, or raises BackendError that lists what exists
  and names the fix.
- `probe(filter)` asks a fresh process (`python -m kfray.eval.backends.sycl --probe`) for the
  devices, so the caller's own SYCL runtime never starts.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from kfray.errors import BackendError

FIX = ("The usual fix: point OCL_ICD_FILENAMES at the Intel OpenCL CPU runtime of the intel-opencl-rt "
       "package (export OCL_ICD_FILENAMES={lib}); its shipped .icd file points nowhere. For Intel GPUs "
       "install the GPU compute runtime (Level Zero / intel-opencl-icd) on the machine.")


def _dist_file(dist: str, name: str) -> Path | None:
    """Absolute path of the file `name` (a basename or path suffix) installed by pip package `dist`."""
    try:
        files = metadata.files(dist) or []
        d = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).replace("\\", "/").endswith(name):
            p = Path(d.locate_file(f)).resolve()
            if p.exists():
                return p
    return None


@lru_cache(maxsize=None)
def opencl_cpu_runtime() -> Path | None:
    """libintelocl.so of intel-opencl-rt (or of $KFRAY_SYCL_ROOT/lib), if installed."""
    p = _dist_file("intel-opencl-rt", "/libintelocl.so")
    if p is None and os.environ.get("KFRAY_SYCL_ROOT"):
        cand = Path(os.environ["KFRAY_SYCL_ROOT"]) / "lib" / "libintelocl.so"
        p = cand if cand.exists() else None
    return p


def ensure_icd_env() -> str | None:
    """Set OCL_ICD_FILENAMES to intel-opencl-rt's CPU runtime when it is unset; returns its value."""
    if not os.environ.get("OCL_ICD_FILENAMES"):
        lib = opencl_cpu_runtime()
        if lib is not None:
            os.environ["OCL_ICD_FILENAMES"] = str(lib)
    return os.environ.get("OCL_ICD_FILENAMES")


@dataclass(frozen=True)
class SyclRoot:
    include: Path       # holds sycl/sycl.hpp and CL/cl.h
    lib: Path           # holds libsycl.so (and libOpenCL.so, maybe elsewhere)
    opencl_lib: Path | None
    version: str


@lru_cache(maxsize=None)
def sycl_root() -> SyclRoot:
    """Where the SYCL headers and libsycl live: $KFRAY_SYCL_ROOT, else the intel-sycl-rt package."""
    env = os.environ.get("KFRAY_SYCL_ROOT")
    if env:
        root = Path(env)
        if not (root / "include" / "sycl" / "sycl.hpp").exists():
            raise BackendError(f"KFRAY_SYCL_ROOT={env} has no include/sycl/sycl.hpp")
        ocl = root / "lib" / "libOpenCL.so"
        return SyclRoot(root / "include", root / "lib", ocl if ocl.exists() else None, f"root:{env}")
    hpp = _dist_file("intel-sycl-rt", "include/sycl/sycl.hpp")
    lib = _dist_file("intel-sycl-rt", "/libsycl.so")
    if hpp is None or lib is None:
        raise BackendError("the sycl backend needs the SYCL runtime headers and libsycl: "
                           "pip install 'kfray[sycl]' (dpctl, intel-sycl-rt, intel-opencl-rt), "
                           "or set KFRAY_SYCL_ROOT to a oneAPI compiler folder")
    ocl = _dist_file("intel-opencl-rt", "/libOpenCL.so") or (lib.parent / "libOpenCL.so")
    return SyclRoot(hpp.parent.parent, lib.parent, ocl if ocl.exists() else None,
                    metadata.version("intel-sycl-rt"))


def import_dpctl():
    ensure_icd_env()
    try:
        import dpctl
    except ImportError as e:
        raise BackendError(f"the sycl backend needs dpctl ({e}); pip install 'kfray[sycl]' "
                           "(dpctl, intel-sycl-rt, intel-opencl-rt)") from None
    return dpctl


def _no_device_message(filter_str: str, found: list) -> str:
    lib = opencl_cpu_runtime()
    have = ", ".join(f"{d.filter_string} ({d.name})" for d in found) or "none"
    what = f"no SYCL device matches {filter_str!r}" if filter_str else "dpctl finds no SYCL device"
    icd = os.environ.get("OCL_ICD_FILENAMES", "")
    return (f"{what} (devices found: {have}; OCL_ICD_FILENAMES={icd or 'unset'}). "
            + FIX.format(lib=lib or "<env>/lib/libintelocl.so"))


def list_devices() -> list:
    dpctl = import_dpctl()
    try:
        return list(dpctl.get_devices())
    except Exception:   # a broken ICD or adapter: report it as "no device"
        return []


def select_device(filter_str: str = ""):
    """The dpctl device `filter_str` names (e.g. opencl:cpu, level_zero:gpu:0), else the default."""
    dpctl = import_dpctl()
    found = list_devices()
    if not found:
        raise BackendError(_no_device_message(filter_str, found))
    try:
        return dpctl.SyclDevice(filter_str) if filter_str else dpctl.select_default_device()
    except Exception:
        raise BackendError(_no_device_message(filter_str, found)) from None


def device_kind(dev) -> str:
    """cpu | gpu | accelerator, from a dpctl device."""
    return str(dev.device_type).rsplit(".", 1)[-1]


def device_facts(dev) -> dict[str, Any]:
    """Facts for prompts and for the harness (cache_bytes sizes the rotation of timing inputs)."""
    def get(attr, default=None):
        try:
            return getattr(dev, attr)
        except Exception:
            return default

    kind = device_kind(dev)
    facts: dict[str, Any] = {
        "name": str(get("name", "sycl device")).strip(),
        "vendor": get("vendor", ""),
        "device_type": kind,
        "backend": str(get("backend", "")).rsplit(".", 1)[-1],
        "filter": get("filter_string", ""),
        "driver_version": get("driver_version", ""),
        "compute_units": get("max_compute_units", 0),
        "max_work_group_size": get("max_work_group_size", 0),
        "sub_group_sizes": list(get("sub_group_sizes", []) or []),
        "local_mem_bytes": get("local_mem_size", 0),
        "global_mem_bytes": get("global_mem_size", 0),
        "global_mem_cache_bytes": get("global_mem_cache_size", 0),
        "cache_line_bytes": get("global_mem_cache_line_size", 0),
        "native_vector_width_float": get("native_vector_width_float", 0),
        "max_clock_mhz": get("max_clock_frequency", 0),
        "fp64": bool(get("has_aspect_fp64", False)),
    }
    cache = int(facts["global_mem_cache_bytes"] or 0)
    if kind == "cpu":   # the device is this machine's CPU: its last-level cache is what inputs must beat
        from kfray.eval.backends.cpu import cpu_facts
        cf = cpu_facts()
        cache = max(cache, int(cf.get("cache_bytes") or 0))
        facts["simd"] = cf.get("simd", [])
    facts["cache_bytes"] = cache or (32 << 20)
    return facts


def probe(filter_str: str = "") -> dict[str, Any]:
    """Devices and the selected device's facts, found by a fresh Python process.

    A process whose SYCL runtime already started without OCL_ICD_FILENAMES cannot see the OpenCL
    CPU device any more (Ray's workers are such processes: Ray asks dpctl for Intel GPUs when a
    worker starts), so the evaluator side never asks dpctl itself. Returns {"devices": [facts],
    "selected": facts or None, "error": message or None}."""
    return dict(_probe(filter_str))


@lru_cache(maxsize=None)
def _probe(filter_str: str):
    import json
    import sys

    ensure_icd_env()
    cmd = [sys.executable, "-m", "kfray.eval.backends.sycl", "--probe", filter_str]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return {"devices": [], "selected": None, "error": "SYCL device discovery timed out after 300 s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        return {"devices": [], "selected": None,
                "error": f"SYCL device discovery failed (exit {proc.returncode}): {tail}"}
    return json.loads(lines[-1])


def probe_report(filter_str: str) -> dict[str, Any]:
    """What `--probe` prints: discovery done in this process (which must not have asked dpctl yet)."""
    ensure_icd_env()
    out: dict[str, Any] = {"devices": [], "selected": None, "error": None}
    try:
        out["devices"] = [device_facts(d) for d in list_devices()]
        out["selected"] = device_facts(select_device(filter_str))
    except BackendError as e:
        out["error"] = str(e)
    return out


def node_resources() -> dict[str, float]:
    """Ray resources a node with SYCL devices can advertise (`ray start --resources '<json>'`)."""
    res: dict[str, float] = {}
    for d in list_devices():
        kind = device_kind(d)
        if kind in ("cpu", "gpu"):
            res[f"sycl_{kind}"] = res.get(f"sycl_{kind}", 0) + 1
            name = "".join(c if c.isalnum() else "_" for c in str(d.name).strip())
            res[f"sycl_device:{name}"] = res.get(f"sycl_device:{name}", 0) + 1
    return res


def evaluator_resources(cfg, cluster: dict) -> dict[str, float]:
    """The custom resource an evaluator reserves, when the cluster advertises one for its device."""
    f = (cfg.sycl_device or "").lower()
    kinds = ["sycl_gpu"] if "gpu" in f else ["sycl_cpu"] if "cpu" in f else ["sycl_gpu", "sycl_cpu"]
    for k in kinds:
        if cluster.get(k, 0) > 0:
            return {k: 0.001}
    return {}
