"""The SYCL runtime as kfray finds it: packages, OpenCL ICD set-up, devices, facts, host tools.

Everything here works from the pip packages of the `sycl` extra (dpctl, intel-sycl-rt,
intel-opencl-rt) or from a oneAPI install named by $KFRAY_SYCL_ROOT, and imports dpctl lazily, so
the module imports where SYCL is missing.

- `ensure_icd_env()` sets OCL_ICD_FILENAMES to intel-opencl-rt's libintelocl.so when it is unset
  (the .icd file that package ships points at a build machine's path, so without this dpctl sees
  no OpenCL CPU device). It must run before the SYCL runtime's first device query in a process.
- `select_device(filter)` returns a dpctl device, or raises BackendError that lists what exists
  and names the fix.
- `host_tools()` builds kfray's C++ host library and compile tool with g++ against the SYCL
  headers on first use, into the compile cache, keyed by their sources and the runtime version.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from kfray.errors import BackendError

HOST_DIR = Path(__file__).with_name("sycl_host")
HOST_SOURCES = ("kfray_sycl_host.cpp", "kfray_sycl_compile.cpp")
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
    cmd = [sys.executable, "-m", "kfray.eval.backends.sycl_runtime", "--probe", filter_str]
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


def _probe_main(filter_str: str) -> dict[str, Any]:
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


# --- host tools ---------------------------------------------------------------------------------
_BUILD_LOCK = threading.Lock()


@dataclass(frozen=True)
class HostTools:
    library: Path       # kfray_sycl_host.so: loaded by ctypes in the sandbox
    compiler: Path      # kfray_sycl_compile: one process per candidate compile


def _cxx() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if not cxx:
        raise BackendError("the sycl backend builds its host library with g++ and none is on PATH; "
                           "install it (Debian/Ubuntu: apt-get install g++) or set CXX")
    return cxx


def host_tools(cache_root: Path) -> HostTools:
    """Build (once, cached) kfray's SYCL host library and compile tool; return their paths."""
    root = sycl_root()
    cxx = _cxx()
    h = hashlib.sha256()
    for name in HOST_SOURCES:
        h.update((HOST_DIR / name).read_bytes())
    h.update(f"{root.version}|{root.include}|{root.lib}|{root.opencl_lib}|{cxx}".encode())
    out = Path(cache_root) / "sycl-host" / h.hexdigest()[:20]
    tools = HostTools(out / "libkfray_sycl_host.so", out / "kfray_sycl_compile")
    if tools.library.exists() and tools.compiler.exists():
        return tools
    with _BUILD_LOCK:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)          # other processes building the same tools wait
            try:
                if not (tools.library.exists() and tools.compiler.exists()):
                    _build(cxx, root, out, tools)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return tools


def _build(cxx: str, root: SyclRoot, out: Path, tools: HostTools) -> None:
    common = ["-std=c++17", "-O2", "-DSYCL_DISABLE_FSYCL_SYCLHPP_WARNING=1", f"-I{root.include}"]
    # RPATH (not RUNPATH) so the runtime's own dependencies (libsvml, libimf...) resolve too.
    link = [f"-L{root.lib}", "-lsycl", f"-Wl,--disable-new-dtags,-rpath,{root.lib}"]
    ocl = []
    if root.opencl_lib is not None:
        ocl = [f"-L{root.opencl_lib.parent}", "-lOpenCL", f"-Wl,-rpath,{root.opencl_lib.parent}"]
    else:
        ocl = ["-lOpenCL"]
    pid = os.getpid()
    jobs = [
        ([cxx, *common, "-shared", "-fPIC", "-fvisibility=hidden", str(HOST_DIR / HOST_SOURCES[0]),
          "-o", str(out / f".host.{pid}.so"), *link], out / f".host.{pid}.so", tools.library),
        ([cxx, *common, str(HOST_DIR / HOST_SOURCES[1]), "-o", str(out / f".compile.{pid}"), *link, *ocl],
         out / f".compile.{pid}", tools.compiler),
    ]
    procs = [(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), tmp, final)
             for cmd, tmp, final in jobs]
    errors = []
    for p, tmp, final in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0 or not tmp.exists():
            errors.append(err.strip()[-3000:])
            tmp.unlink(missing_ok=True)
        else:
            os.replace(tmp, final)
    if errors:
        raise BackendError("building kfray's SYCL host library with g++ failed:\n" + "\n".join(errors))



def main(argv: list[str]) -> None:
    """`python -m kfray.eval.backends.sycl [FILTER | --resources]`: the devices, the selected one,
    and the Ray resources of this node (`--resources` prints only those, as JSON)."""
    import json

    if argv[:1] == ["--probe"]:
        print(json.dumps(_probe_main(argv[1] if len(argv) > 1 else "")))
        return
    if argv[:1] == ["--resources"]:      # for `ray start --resources "$(...)"` in cluster scripts
        print(json.dumps(node_resources()))
        return
    report = _probe_main(argv[0] if argv else "")
    for d in report["devices"]:
        print(json.dumps(d))
    print(report["error"] or f"selected: {report['selected']['filter']} ({report['selected']['name']})")
    print("ray start --resources '" + json.dumps(node_resources()) + "'")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
