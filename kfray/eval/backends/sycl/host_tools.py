"""kfray's C++ host tools for SYCL: built with g++ on first use, and the ctypes binding of the library.

- `host_tools()` builds the host library (kfray_sycl_host.so: loads SYCLBINs, launches kernels on a
  dpctl queue, reads event timestamps) and the compile tool (kfray_sycl_compile: one process per
  candidate compile) against the SYCL headers, into the compile cache, keyed by their sources and
  the runtime version.
- `bind_host_library()` loads the library and declares its C functions for ctypes.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from kfray.errors import BackendError
from kfray.eval.backends.sycl.runtime import SyclRoot, sycl_root

HOST_DIR = Path(__file__).parent.with_name("sycl_host")     # kfray/eval/backends/sycl_host
HOST_SOURCES = ("kfray_sycl_host.cpp", "kfray_sycl_compile.cpp")
ERR_CAP = 4096                                               # bytes of an error message buffer
ARG_KIND = {"float32": 1, "float64": 2, "int32": 3, "int64": 4}   # argument kinds of kf_launch (0: pointer)
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


def error_buffer():
    """A buffer the library writes an error message into (ERR_CAP bytes)."""
    return ctypes.create_string_buffer(ERR_CAP)


def bind_host_library(path: Path) -> ctypes.CDLL:
    """The host library, loaded with its functions' ctypes signatures declared."""
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    sigs = {"kf_bundle_load": (vp, [vp, cp, sz, cp, sz]), "kf_bundle_free": (None, [vp]),
            "kf_kernel_get": (vp, [vp, cp, cp, sz]), "kf_kernel_free": (None, [vp]),
            "kf_kernel_max_wg": (sz, [vp, vp]),
            "kf_launch": (vp, [vp, vp, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(vp),
                               ctypes.c_int, ctypes.POINTER(sz), ctypes.POINTER(sz), cp, sz]),
            "kf_barrier": (vp, [vp, cp, sz]),
            "kf_event_times": (ctypes.c_int, [vp, ctypes.POINTER(ctypes.c_uint64),
                                              ctypes.POINTER(ctypes.c_uint64), cp, sz]),
            "kf_event_free": (None, [vp]), "kf_queue_wait": (ctypes.c_int, [vp, cp, sz])}
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib
