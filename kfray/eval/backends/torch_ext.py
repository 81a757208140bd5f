"""PyTorch-extension kernels: the form KernelBench and robust-kbench publish their kernels in.

A candidate in language `torch_ext` is one C++ (`.cpp`, CPU) or CUDA (`.cu`, GPU) file that does
`#include <torch/extension.h>` and binds `forward` with
`PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }` (`backward` for a
robust-kbench backward task); a `modelnew` candidate is a KernelBench ModelNew file. Both are judged
on suite tasks by kfray/eval/suite/: the suite's verdict, kfray's defences on top.

It is compiled straight with g++ / nvcc, not with torch.utils.cpp_extension.load_inline (which
spends most of a minute on its own machinery), into the content-addressed compile cache, keyed
by source, flags, compiler and torch version. The module name, `kf_ext_<key>`, comes from that
key, so the library's PyInit_ symbol matches the name the sandbox imports it under
(importlib's ExtensionFileLoader). Parsing torch/extension.h is most of a compile: g++ builds
include a precompiled torch/extension.h, built once per flag set (59 s and 0.75 GB on 2 cores),
and then take 20 s instead of 51 s (a one-line extension, measured side by side on 2 idle
cores); `KFRAY_TORCH_PCH=0` turns it off.

Two backends: `torch_ext_cpu` (g++, tensors on the CPU, perf_counter timing) and
`torch_ext_cuda` (nvcc, tensors on GPU 0, CUDA-event timing); `backend_for` picks one for a file.
"""
from __future__ import annotations

import ast
import os
import re
import sysconfig
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kfray.config import kernel_threads
from kfray.errors import BackendError
from kfray.eval.backends.base import Backend, Build, CompileError
from kfray.eval.compile_cache import CompileCache, run_compiler
from kfray.eval.suite_loading import load_suite_kernel
from kfray.source import define_flags
from kfray.tasks.suite_form import is_modelnew, is_torch_extension

LANGUAGE = "torch_ext"
MODELNEW = "modelnew"             # a KernelBench ModelNew file (Python, usually load_inline)
MIN_COMPILE_TIMEOUT_S = 300.0     # torch/extension.h alone takes 10-90 s to compile

_MODELNEW_CUDA_RE = re.compile(r"cuda_sources|__global__|\.cuda\(|device\s*=\s*['\"]cuda|triton")
# Imports a ModelNew file once, outside the sandbox's time limit, so that the load_inline builds it
# runs land in a build folder of the compile cache; the sandbox imports it again from there.
_MODELNEW_BUILD = r"""
import os, shutil, sys, importlib.util
src, out, ext_dir, arch = sys.argv[1:5]
os.environ["TORCH_EXTENSIONS_DIR"] = ext_dir
if arch:
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
spec = importlib.util.spec_from_file_location("kfray_modelnew", src)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
if not isinstance(getattr(mod, "ModelNew", None), type):
    sys.exit("error: the file defines no class ModelNew (KernelBench evaluates ModelNew)")
shutil.copyfile(src, out)
"""
_CUDA_RE = re.compile(r"__global__|<<<|#\s*include\s*[<\"](cuda|ATen/cuda|c10/cuda)")


def language_of(source: str, filename: str = "") -> str:
    """The candidate language of a kernel file as published: modelnew, torch_ext, cuda or cpp."""
    if filename.endswith(".py") or is_modelnew(source):
        return MODELNEW
    if is_torch_extension(source):
        return LANGUAGE
    return "cuda" if backend_for(source, filename) == "cuda" else "cpp"


def backend_for(source: str, filename: str = "") -> str:
    """The backend that runs a kernel file: torch_ext_cuda / cuda for CUDA sources (.cu, or
    __global__ / <<< / CUDA headers), torch_ext_cpu / cpu otherwise; ModelNew files by what they
    build (CUDA sources, .cuda(), Triton: torch_ext_cuda)."""
    if filename.endswith(".py") or is_modelnew(source):
        return "torch_ext_cuda" if _MODELNEW_CUDA_RE.search(source) else "torch_ext_cpu"
    gpu = filename.endswith((".cu", ".cuh")) or bool(_CUDA_RE.search(source))
    if is_torch_extension(source):
        return "torch_ext_cuda" if gpu else "torch_ext_cpu"
    return "cuda" if gpu else "cpu"


def builds_nothing(source: str) -> bool:
    """Whether a ModelNew file can skip the build step: it never mentions torch.utils.cpp_extension
    (the only build that step runs ahead) and defines class ModelNew in plain sight. Importing such a
    file there only checked that it imports, at the cost of a PyTorch import (~2 CPU-s) per
    candidate; its runner imports it anyway, and says what is wrong with it then. A build hidden from
    this check still happens, in the runner, in a private copy of the build folder
    (kfray.eval.suite_loading). A syntax error is a compile error here, as it was."""
    if "cpp_extension" in source or "load_inline" in source:
        return False
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise CompileError(f"the ModelNew file does not parse: {e.msg} (line {e.lineno})") from None
    return any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)


@lru_cache(maxsize=None)
def torch_build_info() -> dict[str, Any]:
    """Where torch's headers and libraries are, and the ABI its extensions must match."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        raise BackendError("torch_ext kernels need PyTorch (pip install torch)") from None
    lib = Path(torch.__file__).parent / "lib"
    # The C++ standard torch builds its own extensions with (C++20 from torch 2.10 on, C++17 before).
    std = "c++20" if "-std=c++20" in Path(cpp_extension.__file__).read_text() else "c++17"
    return {"version": torch.__version__, "std": std, "lib": str(lib),
            "includes": list(cpp_extension.include_paths()) + [sysconfig.get_paths()["include"]],
            "abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
            "cuda_libs": (lib / "libtorch_cuda.so").exists() and (lib / "libc10_cuda.so").exists()}


PCH_HEADER = "kf_torch_extension.h"
PCH_TIMEOUT_S = 600.0


def _build_pch(cc: str, common: list[str], header: Path, gch: Path, timeout: float) -> bool:
    """torch/extension.h precompiled to `gch`, under a file lock: the evaluators and threads of one
    machine that ask at once wait for one build (about a minute on 2 cores, 0.8 GB) instead of each
    making it."""
    import fcntl

    try:
        header.parent.mkdir(parents=True, exist_ok=True)
        with open(header.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if gch.exists():
                return True
            if not header.exists():
                header.write_text("#include <torch/extension.h>\n")
            tmp = gch.with_name(f"{gch.name}.{os.getpid()}.tmp")
            rc, _ = run_compiler([cc, *common, "-x", "c++-header", str(header), "-o", str(tmp)], timeout)
            if rc != 0 or not tmp.exists():
                tmp.unlink(missing_ok=True)
                return False
            os.replace(tmp, gch)
            return True
    except OSError:
        return False


class TorchExtCpuBackend(Backend):
    """C++ extensions built by g++, called on CPU tensors."""

    name = "torch_ext_cpu"
    language = LANGUAGE
    device = "cpu"
    suffix = ".cpp"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.cache = CompileCache(cfg.cache_dir or None, cfg.cache_server, cfg.isolation)
        self._modules: dict[str, Any] = {}

    # --- host side ---------------------------------------------------------------------------
    def hardware_class(self) -> str:
        return "cpu"

    def device_facts(self) -> dict[str, Any]:
        from kfray.eval.backends.cpu import cpu_facts

        return {**cpu_facts(), "threads_for_kernels": kernel_threads(self.cfg)}

    def _compiler(self) -> tuple[str, str]:
        from kfray.eval.backends.cpu import compiler, compiler_version

        cxx = compiler()
        return cxx, compiler_version(cxx)

    def _common_flags(self, info: dict) -> list[str]:
        """Flags shared by the precompiled header and every build (no -D of the candidate)."""
        return [f"-std={info['std']}", "-O3", "-march=native", "-fopenmp", "-fPIC",
                *[f"-I{d}" for d in info["includes"]], "-DTORCH_API_INCLUDE_EXTENSION_H",
                f"-D_GLIBCXX_USE_CXX11_ABI={info['abi']}", *self.cfg.flags]

    def _link_flags(self, info: dict) -> list[str]:
        return ["-shared", f"-L{info['lib']}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
                f"-Wl,-rpath,{info['lib']}"]

    def _key_facts(self) -> dict[str, Any]:
        from kfray.eval.backends.cpu import cpu_facts

        return {"cpu": cpu_facts()["name"]}

    def _arch_list(self) -> str:
        return ""

    def _suite_flags(self, task) -> list[str]:
        return []

    def _compile_modelnew(self, source: str, task) -> Build:
        """A ModelNew file that builds an extension is built by importing it once (its load_inline
        runs then) into a build folder beside its cache entry; the artifact is the file itself, which
        is all a file that builds nothing needs (`builds_nothing`)."""
        import sys

        info = torch_build_info()
        key = CompileCache.key(source=source, torch=info["version"], kind=f"{self.name}-modelnew",
                               **self._key_facts())
        t0 = time.perf_counter()
        def built(p) -> bool:       # the file and its build folder: a ModelNew build is both
            return p is not None and Path(str(p) + ".ext").exists()

        hit = self.cache.lookup(key, ".py")
        if built(hit):
            return Build(str(hit), time.perf_counter() - t0, True, {"form": MODELNEW})
        with self.cache.building(key, ".py") as done:      # made by another process while this one waited
            if built(done):
                return Build(str(done), time.perf_counter() - t0, True, {"form": MODELNEW})
            ext_dir = str(self.cache.path(key, ".py")) + ".ext"
            facts = {"form": MODELNEW}
            if builds_nothing(source):
                tmp = self.cache.temp_path(key, ".py")
                tmp.write_text(source)
                facts["imported"] = False
            else:
                timeout = max(self.cfg.compile_timeout_s, MIN_COMPILE_TIMEOUT_S)
                tmp, rc, text = self.cache.compile_source(
                    key, source, ".py",
                    lambda src, out: [sys.executable, "-c", _MODELNEW_BUILD, str(src), str(out), ext_dir,
                                      self._arch_list()],
                    timeout)
                if rc != 0 or not tmp.exists():
                    raise CompileError(_diagnostics(text) or f"importing the ModelNew file exited with {rc}")
            Path(ext_dir).mkdir(parents=True, exist_ok=True)
            path = self.cache.commit(tmp, key, ".py")
            return Build(str(path), time.perf_counter() - t0, False, facts)

    def compile(self, source: str, params: dict[str, Any], task) -> Build:
        if is_modelnew(source):
            if getattr(task, "suite", None) is None or task.suite.kind != "kernelbench":
                raise CompileError(f"task {task.name}: a ModelNew file needs a KernelBench task")
            return self._compile_modelnew(source, task)
        if not is_torch_extension(source):
            raise CompileError("a torch_ext kernel must #include <torch/extension.h> and bind forward with "
                               "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"forward\", &forward); }")
        if not hasattr(task, "device_reference"):
            raise CompileError(f"task {task.name}: torch_ext kernels need a task with a PyTorch reference "
                               "(KernelBench or robust-kbench)")
        info = torch_build_info()
        cc, version = self._compiler()
        try:
            common = self._common_flags(info) + self._suite_flags(task) + define_flags(params)
        except ValueError as e:
            raise CompileError(str(e)) from None
        link = self._link_flags(info)
        key = CompileCache.key(source=source, flags=common, link=link, compiler=version, torch=info["version"],
                               kind=f"{self.name}-so", **self._key_facts())
        t0 = time.perf_counter()
        hit = self.cache.lookup(key, ".so")
        if hit:
            return Build(str(hit), time.perf_counter() - t0, True)
        with self.cache.building(key, ".so") as done:      # made by another process while this one waited
            if done is not None:
                return Build(str(done), time.perf_counter() - t0, True)
            timeout = max(self.cfg.compile_timeout_s, MIN_COMPILE_TIMEOUT_S)
            pch = self._pch(cc, version, self._common_flags(info), info, timeout)
            name = "kf_ext_" + key
            tmp, rc, text = self.cache.compile_source(
                key, source, self.suffix,
                lambda src, out: [cc, *common, *pch, f"-DTORCH_EXTENSION_NAME={name}", str(src), "-o", str(out), *link],
                timeout)
            if rc != 0 or not tmp.exists():
                raise CompileError(_diagnostics(text) or f"{Path(cc).name} exited with {rc}")
            path = self.cache.commit(tmp, key, ".so")
            return Build(str(path), time.perf_counter() - t0, False, {"pch": bool(pch)})

    def _pch(self, cc: str, version: str, common: list[str], info: dict, timeout: float) -> list[str]:
        """Flags that include a precompiled torch/extension.h, built on first use into its own folder
        (KFRAY_PCH_DIR, else `pch` in the compile cache), one build per flag set however many
        evaluators ask at once; [] when off (KFRAY_TORCH_PCH=0), for another compiler than g++, or
        when it cannot be built (it only saves time: g++ then reads the plain header, and a
        precompiled header that does not fit the flags is ignored the same way). The folder goes on
        the command line as -I, so an isolated compiler is shown it."""
        if os.environ.get("KFRAY_TORCH_PCH", "1") == "0" or "g++" not in Path(cc).name and "GCC" not in version:
            return []
        key = CompileCache.key(flags=common, compiler=version, torch=info["version"], kind="torch-ext-pch")
        folder = Path(os.environ.get("KFRAY_PCH_DIR") or self.cache.root / "pch") / key
        header = folder / PCH_HEADER
        gch = folder / (PCH_HEADER + ".gch")
        if not gch.exists() and not _build_pch(cc, common, header, gch, max(timeout, PCH_TIMEOUT_S)):
            return []
        return [f"-I{folder}", "-include", PCH_HEADER]

    # --- sandbox side ------------------------------------------------------------------------
    split = True

    def warm_request(self) -> dict:
        """What a runner forked ahead of its job does first (kfray.eval.spares): open the device."""
        return {"op": "warm", "device": self.device}

    def load(self, artifact: str, task) -> Callable:
        """The kernel loaded in this process (the judge's in-process path, where no runner can be made)."""
        return load_suite_kernel(artifact, task, self._arch_list(), self._modules)

    def load_remote(self, runner, arena, artifact: str, task):
        """The kernel loaded in the candidate's runner, forward and backward (robust-kbench backward
        tasks run autograd through the kernel there: kfray/eval/suite/backward_side.py)."""
        from kfray.eval.suite.remote_case import RemoteKernel

        suite = getattr(task, "suite", None)
        if suite is None:
            return None
        ref = self._reference_side(runner, task)
        try:
            kernel = RemoteKernel(runner, artifact, task, self.device, self._arch_list(), post=True)
        except BaseException:
            if ref is not None:
                ref.runner.close()
            raise
        kernel.reference = ref
        return kernel

    def _reference_side(self, runner, task):
        """The reference in a runner of its own, forked from the same clean zygote and loading
        while the candidate loads (eval.suite_ref_timing): both sides are then timed through the
        same process, wire and allocator. On the H200 the reference timed in the judge read about
        1 % slower than the same model in a runner (level 1 against itself: fast_1.0 0.83)."""
        from kfray.eval.remote import RunnerFailed
        from kfray.eval.spares import new_runner
        from kfray.eval.suite.remote_case import RemoteKernel

        want = getattr(self.cfg, "suite_ref_timing", "auto")
        if want == "judge" or task.suite.direction != "forward" or (want == "auto" and self.device != "cuda"):
            return None
        try:
            return RemoteKernel(new_runner(runner.spawner, runner.deadline_s), "", task, self.device,
                                side="ref", post=True)
        except (RunnerFailed, OSError):
            return None           # the reference is timed in the judge, as before

    def run_job(self, fn: Callable, task, job: dict) -> dict:
        from kfray.candidate import TIER_RUNTIME_ERROR
        from kfray.eval.suite import run_suite_job

        if getattr(task, "suite", None) is None:
            return {"tier": TIER_RUNTIME_ERROR, "reason": f"task {task.name} is no suite task: PyTorch-form kernels "
                    "need a KernelBench or robust-kbench task"}
        return run_suite_job(self, fn, task, job)

    def make_args(self, task, shape: str, rng) -> dict[str, Any]:
        """The task's inputs (and shape-config marker) for one draw; the extension allocates outputs."""
        outs = {o.name for o in task.outputs}
        return {k: v for k, v in task.make_args(shape, rng).items() if k not in outs}

    def to_device(self, args: dict[str, Any]) -> dict[str, Any]:
        """Torch tensors of our own (copies), on this backend's device."""
        import torch

        return {k: (torch.from_numpy(np.array(v, copy=True)).to(self.device) if isinstance(v, np.ndarray) else v)
                for k, v in args.items()}

    def to_host(self, value: Any) -> np.ndarray:
        import torch

        if isinstance(value, torch.Tensor):
            return value.detach().cpu().numpy()
        return np.asarray(value)

    def reference(self, task, args: dict[str, Any]) -> dict[str, np.ndarray]:
        """The eager PyTorch reference on this backend's device, as host arrays."""
        return {k: self.to_host(v) for k, v in task.device_reference(args, self.device).items()}


def _diagnostics(text: str, limit: int = 4000) -> str:
    """The compiler's errors first (torch's headers fill its output with warnings), then the rest."""
    lines = text.splitlines()
    errors = [i for i, ln in enumerate(lines) if re.search(r"\berror\s*:|undefined reference", ln)]
    if not errors:
        return text[-limit:]
    out = "\n".join(lines[errors[0]:])
    return out[:limit]
