"""nvcc and ptxas: finding the compiler, naming the arch, reading `ptxas -v`, building a candidate.

Host side only: everything here works with no GPU and no driver. The arch comes from
$KFRAY_CUDA_ARCH, else from the visible GPU, else sm_90. `-Xptxas -v` gives registers, shared
memory and spills per kernel; they travel with the build as a JSON sidecar in the compile cache.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from kfray.errors import BackendError
from kfray.eval.backends.base import Build, CompileError
from kfray.eval.backends.cuda.device import gpu_properties
from kfray.eval.compile_cache import CompileCache
from kfray.source import define_flags

DEFAULT_ARCH = "sm_90"
BASE_FLAGS = ["-O3", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v", "-lineinfo"]

# Pre-included into every candidate (its own file, so the candidate's line numbers are unchanged).
# nvcc links cudart statically into each library and keeps its symbols hidden, so only code inside
# the library can read that runtime's last error (a bad launch configuration, say): this does.
HARNESS_HEADER = """\
#include <cuda_runtime.h>
extern "C" __attribute__((visibility("default"))) int kf_harness_last_error(void) {
    return (int)cudaGetLastError();
}
"""


def nvcc_path() -> str:
    found = os.environ.get("NVCC") or shutil.which("nvcc")
    if not found:
        for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
                found = os.path.join(root, "bin", "nvcc")
                break
    if not found:
        raise BackendError("the cuda backend needs nvcc and none was found on PATH, in $CUDA_HOME/bin or "
                           "/usr/local/cuda/bin; install the CUDA toolkit or set NVCC to the compiler")
    return found


@lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown"


def normalize_arch(arch: str | int) -> str:
    """'sm_90', '90', '9.0', 'compute_90' -> 'sm_90' (suffixes such as sm_90a are kept)."""
    a = str(arch).strip().lower()
    if a.startswith(("sm_", "compute_")):
        return "sm_" + a.split("_", 1)[1]
    a = a.replace(".", "")
    if not re.fullmatch(r"\d{2,3}[af]?", a):
        raise BackendError(f"cannot read CUDA arch {arch!r}: use the form sm_90 (or 90, 9.0)")
    return "sm_" + a


def detect_arch(cfg) -> str:
    """The arch to build for: $KFRAY_CUDA_ARCH, else the visible GPU's, else cfg.cuda_arch or sm_90."""
    env = os.environ.get("KFRAY_CUDA_ARCH", "").strip()
    if env:
        return normalize_arch(env)
    props = gpu_properties()
    if props and props.get("major") is not None:
        return f"sm_{props['major']}{props.get('minor', 0)}"
    return normalize_arch(getattr(cfg, "cuda_arch", "") or DEFAULT_ARCH)


_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'(?: for '([^']+)')?")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_STACK_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str) -> dict[str, Any]:
    """Per-kernel registers, shared memory, stack and spills from `ptxas -v` output (pure)."""
    kernels: dict[str, dict[str, int]] = {}
    frames: dict[str, tuple[int, int, int]] = {}      # every function with a properties block
    entry = None            # kernel whose "Used N registers" line comes next
    props_of = None         # function whose stack-frame line comes next
    for line in text.splitlines():
        m = _ENTRY_RE.search(line)
        if m:
            entry = m.group(1)
            kernels.setdefault(entry, {"registers": 0, "smem_bytes": 0, "spill_stores": 0,
                                       "spill_loads": 0, "stack_bytes": 0})
            continue
        m = _PROPS_RE.search(line)
        if m:
            props_of = m.group(1)
            continue
        m = _STACK_RE.search(line)
        if m and props_of:
            frames[props_of] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            props_of = None
            continue
        m = _REGS_RE.search(line)
        if m and entry:
            kernels[entry]["registers"] = int(m.group(1))
            s = _SMEM_RE.search(line)
            kernels[entry]["smem_bytes"] = int(s.group(1)) if s else 0
            entry = None
    for name, (stack, st, ld) in frames.items():
        if name in kernels:
            kernels[name].update(stack_bytes=stack, spill_stores=st, spill_loads=ld)
    spills = sum(st + ld for st, ld in ((f[1], f[2]) for f in frames.values()))
    return {"kernels": kernels,
            "max_registers": max((k["registers"] for k in kernels.values()), default=0),
            "max_smem_bytes": max((k["smem_bytes"] for k in kernels.values()), default=0),
            "spills": spills}


def demangle(names: list[str], nvcc: str) -> dict[str, str]:
    """Readable kernel names via cu++filt (next to nvcc) or c++filt; {} when neither exists."""
    tool = None
    for cand in (os.path.join(os.path.dirname(os.path.realpath(nvcc)), "cu++filt"),
                 "/usr/local/cuda/bin/cu++filt", shutil.which("cu++filt"), shutil.which("c++filt")):
        if cand and os.access(cand, os.X_OK):
            tool = cand
            break
    if not tool or not names:
        return {}
    try:
        out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True,
                             timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {n: d.strip() for n, d in zip(names, out) if d.strip() and d.strip() != n}


def harness_path(cache: CompileCache) -> Path:
    """HARNESS_HEADER as a file in the cache (named by its hash), for nvcc's --pre-include."""
    digest = hashlib.sha256(HARNESS_HEADER.encode()).hexdigest()[:16]
    path = cache.root / "harness" / f"kf_harness_{digest}.h"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # threads compile at once
        tmp.write_text(HARNESS_HEADER)
        os.replace(tmp, path)
    return path


def compile_cuda(source: str, params: dict[str, Any], *, cache: CompileCache, arch: str,
                 flags: list[str], timeout_s: float) -> Build:
    """nvcc builds `source` into a shared library under its cache key, the ptxas facts beside it.

    `flags` are the configured extra flags (after the base flags and -arch, before the params)."""
    nvcc = nvcc_path()
    try:
        flags = BASE_FLAGS + [f"-arch={arch}"] + list(flags) + define_flags(params)
    except ValueError as e:
        raise CompileError(str(e)) from None
    key = CompileCache.key(source=source, flags=flags, arch=arch, compiler=nvcc_version(nvcc),
                           harness=HARNESS_HEADER, kind="cuda-so")
    t0 = time.perf_counter()
    hit = cache.lookup(key, ".so")
    if hit:
        try:
            facts = json.loads(cache.path(key, ".json").read_text())
        except (OSError, ValueError):
            facts = {}
        return Build(str(hit), time.perf_counter() - t0, True, facts)
    # An argument list, never a shell string: nothing from a model reaches a shell.
    tmp, rc, text = cache.compile_source(
        key, source, ".cu", lambda src, out: [nvcc, *flags, "--pre-include", str(harness_path(cache)), str(src),
                                              "-o", str(out)], timeout_s)
    if rc != 0 or not tmp.exists():
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("ptxas info")
                 and not re.match(r"\s+\d+ bytes stack frame", ln)]
        msg = "\n".join(lines) or text
        raise CompileError(msg.strip()[-4000:] or f"nvcc exited with {rc}")
    facts = parse_ptxas(text)
    names = demangle(list(facts["kernels"]), nvcc)
    for mangled, readable in names.items():
        facts["kernels"][mangled]["demangled"] = readable
    facts["arch"] = arch
    warnings = [ln for ln in text.splitlines() if "warning" in ln.lower()]
    if warnings:
        facts["compile_warnings"] = "\n".join(warnings)[-1500:]
    # The sidecar first: whoever sees the .so under its key also finds the facts.
    side = cache.temp_path(key, ".json")
    side.write_text(json.dumps(facts, indent=1))
    cache.commit(side, key, ".json")
    path = cache.commit(tmp, key, ".so")
    return Build(str(path), time.perf_counter() - t0, False, facts)
