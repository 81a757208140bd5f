"""SYCL backend through dpctl: three source forms, USM memory, profiling-queue event timestamps.

Forms (`eval.sycl_form`), each a candidate language:

- `jit` (language `sycl_jit`): SYCL C++ free-function kernels compiled at run time by the
  `sycl_ext_oneapi_kernel_compiler` extension of intel-sycl-rt. The candidate holds kernels only,
  plus one launch declaration per kernel launch, run in order:

      // @kf.launch softmax_rows global=(rows * WG) local=(WG)

  Each kernel is an `extern "C"` free function with
  `SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<N>))` that takes the task's
  arguments in the task's order (tensors as pointers to USM memory, scalars by value). Range
  expressions are over the shape config, the task's scalars and the @kf.param values; dimension d
  of the declaration is what `get_global_id(d)` counts (SYCL order: the last one varies fastest).
  @kf.param values are `#define`d right after the source's last `#include` (diagnostics are
  mapped back to the source's own line numbers), not passed as `-D`: names such as N, M, K or WG
  would otherwise rewrite the SYCL headers themselves.
- `opencl` (language `opencl`): OpenCL C kernels with the same launch declarations; dimension d is
  what `get_global_id(d)` counts. Built in the sandbox with `dpctl.program`; params are `-D` flags.
- `aot` (language `sycl`): whole SYCL programs built ahead of time by `icpx -fsycl` (or `acpp`),
  when one is on PATH, exporting `extern "C" int kf_forward(<task args>, sycl::queue* queue)`.

Where things run: `compile` runs in the evaluator and never executes candidate code: a separate
process (`kfray_sycl_compile`, kfray's C++ tool) compiles the source for the device and returns
the clang / OpenCL build log as the CompileError; a jit build is kept in the compile cache as
the SYCLBIN of its object-state bundle. Loading, launching and timing happen in the sandbox worker:
`kfray_sycl_host.so` links the SYCLBIN for the device, and launches kernels on the `sycl::queue*`
behind a dpctl SyclQueue (in order, with profiling enabled); a call's time is the span from the
first kernel's start to the last one's end, read from the SYCL event timestamps.
"""
from __future__ import annotations

import base64
import ctypes
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kfray.errors import BackendError
from kfray.eval.backends import sycl_runtime as rt
from kfray.eval.backends.base import Backend, Build, CompileError
from kfray.eval.compile_cache import CompileCache
from kfray.source import define_flags, safe_eval
from kfray.tasks.base import Scalar, Tensor

FORM_LANGUAGE = {"jit": "sycl_jit", "opencl": "opencl", "aot": "sycl"}
LANGUAGE_FORM = {v: k for k, v in FORM_LANGUAGE.items()}
JIT_OPTIONS: list[str] = []            # the kernel compiler's defaults (-O2 style) are kept
OPENCL_STD = ["-cl-std=CL3.0"]         # OpenCL C 3.0 (work_group_reduce_*, sub-groups) unless flags say
MAX_DIAGNOSTIC_CHARS = 4000
_ERR_CAP = 4096
_KIND = {"float32": 1, "float64": 2, "int32": 3, "int64": 4}     # argument kinds of the host library
_CTYPE = {"float32": ctypes.c_float, "float64": ctypes.c_double,
          "int32": ctypes.c_int32, "int64": ctypes.c_int64}

# Re-exported for callers that only import this module.
ensure_icd_env = rt.ensure_icd_env
evaluator_resources = rt.evaluator_resources
node_resources = rt.node_resources
select_device = rt.select_device


# --- launch declarations ------------------------------------------------------------------------
# A declaration is a kernel name followed by key=(...) pairs; prose that mentions @kf.launch is not.
_LAUNCH_RE = re.compile(r"@kf\.launch[ \t]+([A-Za-z_]\w*[ \t]+\w+[ \t]*=[^\n]*)")


@dataclass(frozen=True)
class Launch:
    kernel: str
    global_size: tuple[str, ...]
    local_size: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "global": list(self.global_size), "local": list(self.local_size)}

    @classmethod
    def from_dict(cls, d: dict) -> "Launch":
        return cls(d["kernel"], tuple(d["global"]), tuple(d["local"]))


def _balanced(text: str, start: int) -> tuple[str, int]:
    """The text inside the parentheses that open at text[start]; and the index after them."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
    raise ValueError("unbalanced parentheses")


def _split_top(text: str) -> tuple[str, ...]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    parts.append(cur.strip())
    return tuple(p for p in parts if p)


def parse_launches(source: str) -> list[Launch]:
    """The `@kf.launch` declarations of a source, in order; ValueError names what is wrong."""
    out = []
    for m in _LAUNCH_RE.finditer(source):
        line = m.group(1).strip().rstrip("*/").strip()
        what = f"bad launch declaration '@kf.launch {line}'"
        name = re.match(r"([A-Za-z_]\w*)\s*", line)
        if not name:
            raise ValueError(f"{what}: expected a kernel name first")
        rest, sizes = line[name.end():], {}
        while rest.strip():
            kv = re.match(r"\s*(global|local)\s*=\s*", rest)
            if not kv or rest[kv.end():kv.end() + 1] != "(":
                raise ValueError(f"{what}: expected global=(...) local=(...)")
            try:
                body, end = _balanced(rest, kv.end())
            except ValueError:
                raise ValueError(f"{what}: unbalanced parentheses") from None
            sizes[kv.group(1)] = _split_top(body)
            rest = rest[end:]
        if "global" not in sizes or "local" not in sizes:
            raise ValueError(f"{what}: both global=(...) and local=(...) are required")
        g, loc = sizes["global"], sizes["local"]
        if not 1 <= len(g) <= 3 or len(g) != len(loc):
            raise ValueError(f"{what}: global and local need the same number of dimensions (1 to 3)")
        out.append(Launch(name.group(1), g, loc))
    return out


def _as_size(value: Any, expr: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"'{expr}' is not a number")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"'{expr}' = {value} is not a whole number (use // for integer division)")
        value = int(value)
    if value <= 0:
        raise ValueError(f"'{expr}' = {value} must be positive")
    return int(value)


def launch_ranges(launch: Launch, env: dict[str, Any], max_wg: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Global and local sizes of one launch, checked as SYCL requires them."""
    g = tuple(_as_size(safe_eval(e, env), e) for e in launch.global_size)
    loc = tuple(_as_size(safe_eval(e, env), e) for e in launch.local_size)
    for d, (gs, ls) in enumerate(zip(g, loc)):
        if gs % ls:
            raise ValueError(f"launch of {launch.kernel}: global size {gs} is not a multiple of the local size "
                             f"{ls} in dimension {d} (round it up, e.g. ((n + L - 1) // L) * L, and guard "
                             f"the tail in the kernel)")
    wg = int(np.prod(loc))
    if max_wg and wg > max_wg:
        raise ValueError(f"launch of {launch.kernel}: work-group size {wg} exceeds the device's maximum {max_wg}")
    return g, loc


def shape_env(task, shape: str) -> dict[str, Any]:
    """Names a launch expression may use for a shape config: its sizes and the task's fixed scalars."""
    cfg = dict(task.shapes[shape])
    env = dict(cfg)
    for a in task.args:
        if isinstance(a, Scalar) and a.value is not None:
            try:
                env[a.name] = safe_eval(str(a.value), cfg)
            except ValueError:
                pass
    return env


def _define_block(source: str, params: dict[str, Any]) -> tuple[int, str]:
    """Where the #defines go (index of the line they follow, -1 for the top) and the block itself."""
    define_flags(params)   # validates names and values
    lines = source.splitlines()
    last = max((i for i, ln in enumerate(lines) if re.match(r"\s*#\s*include\b", ln)), default=-1)
    # The declaration ends clang's preamble before the #defines, so the preamble (the includes) is
    # the same for every setting and the kernel compiler's persistent auto-PCH serves them all.
    block = "using kf_tunables_follow = int;\n" + "".join(f"#define {k} {v}\n" for k, v in sorted(params.items()))
    return last, block


def inject_defines(source: str, params: dict[str, Any]) -> str:
    """`#define NAME VALUE` for each param right after the source's last #include."""
    if not params:
        return source
    last, block = _define_block(source, params)
    lines = source.splitlines(keepends=True)
    if last >= 0 and not lines[last].endswith("\n"):
        lines[last] += "\n"
    return "".join(lines[:last + 1]) + block + "".join(lines[last + 1:])


def line_shift(source: str, params: dict[str, Any]) -> tuple[int, int]:
    """(first line moved, lines inserted) by inject_defines, to put diagnostics back on the source's lines."""
    if not params:
        return 0, 0
    last, block = _define_block(source, params)
    return last + 2, block.count("\n")


_RTC_FILE = re.compile(r"\brtc_\d+\.cpp\b")
_JIT_INCLUDE = re.compile(r"/sycl-jit-toolchain/+bin/compiler/\.\./\.\./include/")
_LOC = re.compile(r"\bkernel\.cpp:(\d+)")
_SNIPPET = re.compile(r"^(\s*)(\d+)( \|)", re.M)


def clean_diagnostics(text: str, shift: tuple[int, int] = (0, 0)) -> str:
    """Compiler output as the prompt should see it: file kernel.cpp, the source's own line numbers."""
    text = _RTC_FILE.sub("kernel.cpp", text)
    text = _JIT_INCLUDE.sub("<sycl>/", text)
    text = text.replace("Device compilation failed\nDetailed information:\n\t", "")
    first, count = shift
    if count:
        def back(n: int) -> int:
            return n - count if n >= first + count else n
        text = _LOC.sub(lambda m: f"kernel.cpp:{back(int(m.group(1)))}", text)
        text = _SNIPPET.sub(lambda m: f"{m.group(1)}{back(int(m.group(2)))}{m.group(3)}", text)
    text = text.strip()
    if len(text) > MAX_DIAGNOSTIC_CHARS:   # the first errors matter most
        text = text[:MAX_DIAGNOSTIC_CHARS] + "\n[... diagnostics truncated ...]"
    return text


# Constructs known to crash this kernel compiler, with what to use instead (they reach the prompt).
CRASH_HINTS = [("group_local_memory", "group_local_memory_for_overwrite is known to crash it: declare work-group "
                "local memory as `static syclexp::work_group_static<float[N]> tile;` instead")]


def _signal_name(sig: int) -> str:
    import signal
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


# --- the contract, as a prompt states it ----------------------------------------------------------
_OCL_TYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "long"}
_SYCL_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t"}


def kernel_parameters(task, language: str) -> str:
    """The parameter list every kernel of a run-time form takes: the task's arguments, in order."""
    parts = []
    for a in task.args:
        if language == "opencl":
            t = _OCL_TYPES[a.dtype]
            parts.append(f"__global {'const ' if a.role == 'in' else ''}{t}* {a.name}" if isinstance(a, Tensor)
                         else f"{t} {a.name}")
        else:
            t = _SYCL_TYPES[a.dtype]
            parts.append(f"{'const ' if a.role == 'in' else ''}{t}* {a.name}" if isinstance(a, Tensor)
                         else f"{t} {a.name}")
    return ", ".join(parts)


def kernel_contract(task, language: str) -> str:
    """What a candidate in a run-time form (sycl_jit, opencl) must contain, for the prompt builder."""
    names = sorted({*(k for cfg in task.shapes.values() for k in cfg),
                    *(a.name for a in task.args if isinstance(a, Scalar) and a.value is not None)})
    params = kernel_parameters(task, language)
    launch = ("Declare every launch, in order, on its own comment line, with the global and local sizes as "
              f"expressions over {', '.join(names)} and your @kf.param names (// is integer division; each "
              "global size must be a multiple of its local size):\n"
              "// @kf.launch my_kernel global=((n + WG - 1) // WG * WG) local=(WG)\n")
    if language == "opencl":
        return ("OpenCL C kernels only (no host code). Every launched kernel takes the task's arguments in "
                f"order:\n__kernel void my_kernel({params})\n" + launch
                + "Dimension d of a declaration is what get_global_id(d) counts. OpenCL C 3.0 "
                "(work_group_reduce_*, sub_group_* functions) is available; @kf.param values arrive as -D macros.")
    return ("SYCL C++ free-function kernels compiled at run time (no host code, no queue). Every launched "
            "kernel is declared\n#include <sycl/sycl.hpp>\nnamespace syclext = sycl::ext::oneapi;\n"
            "namespace syclexp = sycl::ext::oneapi::experimental;\n"
            "extern \"C\" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))\n"
            f"void my_kernel({params})\n"
            "and takes the task's arguments in that order; it gets its nd_item from "
            "syclext::this_work_item::get_nd_item<1>() (use nd_range_kernel<2> / get_nd_item<2> for 2-D). "
            + launch
            + "Dimension d of a declaration is what get_global_id(d) counts (the last one varies fastest). "
            "Work-group local memory: static syclexp::work_group_static<float[N]> tile; "
            "(group_local_memory_for_overwrite crashes this compiler). A sub-group size is a second property: "
            "SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>)). @kf.param values arrive as "
            "#defines after your #includes.")


# --- device memory ------------------------------------------------------------------------------
class UsmArray:
    """A tensor in USM device memory, with the host array it came from (for the reference)."""

    __slots__ = ("mem", "shape", "dtype", "host", "ptr")

    def __init__(self, mem, shape, dtype, host):
        self.mem, self.shape, self.dtype, self.host = mem, tuple(shape), np.dtype(dtype), host
        self.ptr = int(mem._pointer)

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, dtype=self.dtype)
        if out.nbytes:
            self.mem.copy_to_host(out.reshape(-1).view(np.uint8))
        return out

    # Enough of the ndarray protocol for the harness to compare it where it expects arrays.
    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def astype(self, dtype) -> np.ndarray:
        return self.numpy().astype(dtype)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1


# --- the backend --------------------------------------------------------------------------------
class SyclBackend(Backend):
    name = "sycl"
    language = "sycl_jit"

    def __init__(self, cfg):
        super().__init__(cfg)
        rt.ensure_icd_env()
        self.form = getattr(cfg, "sycl_form", "") or "jit"
        if self.form not in FORM_LANGUAGE:
            raise BackendError(f"eval.sycl_form must be one of {', '.join(FORM_LANGUAGE)}, got {self.form!r}")
        self.language = FORM_LANGUAGE[self.form]
        self.cache = CompileCache(cfg.cache_dir or None, cfg.cache_server)
        self._device = None
        self._facts: dict[str, Any] | None = None
        self._tools: rt.HostTools | None = None
        self._no_pch = False                 # set when the kernel compiler rejects the auto-PCH option
        self.aot_compiler = ""
        if self.form == "aot":
            self.aot_compiler = shutil.which("icpx") or shutil.which("acpp") or ""
            if not self.aot_compiler:
                raise BackendError("eval.sycl_form 'aot' compiles whole SYCL programs with icpx -fsycl (or acpp), "
                                   "and neither is on PATH; install the oneAPI DPC++ compiler, or use "
                                   "sycl_form 'jit' (run-time compiled kernels) or 'opencl'")
        # sandbox state
        self.queue = None
        self.lib = None
        self._recording = False
        self._events: list[tuple[str, Any]] = []
        self._programs: dict[str, Any] = {}

    # --- host side ---------------------------------------------------------------------------
    @property
    def device(self):
        """The dpctl device (sandbox side only: it starts the SYCL runtime in this process)."""
        if self._device is None:
            self._device = rt.select_device(getattr(self.cfg, "sycl_device", ""))
            self._facts = None
        return self._device

    def hardware_class(self) -> str:
        f = self.device_facts()
        name = "".join(c if c.isalnum() else "_" for c in f["name"]).strip("_")
        return f"sycl_{f['device_type']}:{name}"

    def device_facts(self) -> dict[str, Any]:
        """Facts of the device: from dpctl in the sandbox, from a discovery process elsewhere."""
        if self._facts is None:
            if self._device is not None:
                facts = rt.device_facts(self._device)
            else:
                found = rt.probe(getattr(self.cfg, "sycl_device", ""))
                if not found["selected"]:
                    raise BackendError(found["error"] or "no SYCL device")
                facts = found["selected"]
            facts["sycl_form"] = self.form
            self._facts = facts
        return dict(self._facts)

    def jit_options(self) -> list[str]:
        """Kernel-compiler options: a persistent auto-PCH of the SYCL headers next to the host tools
        (about 0.6 s less per kernel once built; $KFRAY_SYCL_PCH=0 turns it off)."""
        if os.environ.get("KFRAY_SYCL_PCH", "1") == "0" or self._no_pch:
            return list(JIT_OPTIONS)
        pch = self.tools().library.parent / "pch"
        pch.mkdir(parents=True, exist_ok=True)
        return [*JIT_OPTIONS, f"--persistent-auto-pch={pch}"]

    def tools(self) -> rt.HostTools:
        if self._tools is None:
            self._tools = rt.host_tools(self.cache.root)
        return self._tools

    def compile(self, source: str, params: dict[str, Any], task) -> Build:
        try:
            defines = define_flags(params)
        except ValueError as e:
            raise CompileError(str(e)) from None
        if self.form == "aot":   # params as #defines after the includes, as for jit (see the module doc)
            return self._compile_aot(inject_defines(source, params), line_shift(source, params))
        try:
            launches = parse_launches(source)
        except ValueError as e:
            raise CompileError(str(e)) from None
        if not launches:
            raise CompileError("the source declares no kernel launch: add one line per launch, e.g. "
                               "// @kf.launch my_kernel global=((n + 255) // 256 * 256) local=(256)")
        max_wg = int(self.device_facts().get("max_work_group_size") or 0)
        for shape in task.shapes:
            env = {**shape_env(task, shape), **params}
            for ln in launches:
                try:
                    launch_ranges(ln, env, max_wg)
                except ValueError as e:
                    raise CompileError(f"shape {shape}: {e}") from None
        if self.form == "jit":
            text, lang, opts = inject_defines(source, params), "sycl", self.jit_options() + list(self.cfg.flags)
            shift = line_shift(source, params)
        else:
            std = [] if any(str(f).startswith("-cl-std") for f in self.cfg.flags) else OPENCL_STD
            text, lang, opts = source, "opencl", std + defines + list(self.cfg.flags)
            shift = (0, 0)
        f = self.device_facts()
        key = CompileCache.key(source=text, opts=opts, kind=f"sycl-{self.form}", device=f["name"],
                               driver=f["driver_version"], filter=f["filter"], tools=str(self.tools().compiler))
        t0 = time.perf_counter()
        hit = self.cache.lookup(key, ".json")
        if hit:
            return Build(str(hit), time.perf_counter() - t0, True, {"sycl_form": self.form})
        tmp_bin = self.cache.temp_path(key, ".bin")
        kernels = [f"--kernel={k}" for k in dict.fromkeys(ln.kernel for ln in launches)]
        proc = self._run_tool(lang, tmp_bin, kernels, opts, text)
        if proc.returncode == 1 and lang == "sycl" and "auto-pch" in (proc.stderr or "").lower() and not self._no_pch:
            self._no_pch = True               # this runtime's compiler lacks it: build without
            opts = [o for o in opts if not o.startswith("--persistent-auto-pch")]
            proc = self._run_tool(lang, tmp_bin, kernels, opts, text)
        seconds = time.perf_counter() - t0
        try:
            if proc.returncode != 0 or not tmp_bin.exists():
                msg = clean_diagnostics(proc.stderr or proc.stdout, shift)
                if proc.returncode < 0:
                    msg = (f"the SYCL kernel compiler crashed ({_signal_name(-proc.returncode)}) on this source"
                           + "".join(f"; {hint}" for pat, hint in CRASH_HINTS if pat in text)
                           + (f"\n{msg}" if msg else ""))
                elif proc.returncode not in (0, 1):
                    msg = f"the SYCL compile tool failed (exit {proc.returncode}): {msg}"
                raise CompileError(msg or f"the SYCL compiler exited with {proc.returncode}")
            manifest: dict[str, Any] = {"form": self.form, "launches": [ln.to_dict() for ln in launches],
                                        "params": params}
            if self.form == "jit":
                manifest["syclbin"] = base64.b64encode(tmp_bin.read_bytes()).decode()
            else:
                manifest["source"] = source
                manifest["options"] = " ".join(opts)
        finally:
            tmp_bin.unlink(missing_ok=True)
        tmp = self.cache.temp_path(key, ".json")
        tmp.write_text(json.dumps(manifest))
        path = self.cache.commit(tmp, key, ".json")
        facts: dict[str, Any] = {"sycl_form": self.form, "jit_compile_s" if self.form == "jit" else
                                 "opencl_build_s": round(seconds, 3)}
        warnings = clean_diagnostics(proc.stdout, shift) if self.form == "jit" else ""
        if warnings:
            facts["compile_log"] = warnings[:1000]
        return Build(str(path), seconds, False, facts)

    def _run_tool(self, lang: str, out: Path, kernels: list[str], opts: list[str], text: str):
        cmd = [str(self.tools().compiler), self.device_facts()["filter"], lang, str(out), *kernels, "--", *opts]
        try:
            # An argument list and the source on stdin: nothing from a model reaches a shell.
            return subprocess.run(cmd, input=text, capture_output=True, text=True,
                                  timeout=self.cfg.compile_timeout_s)
        except subprocess.TimeoutExpired:
            out.unlink(missing_ok=True)
            raise CompileError(f"the SYCL compiler timed out after {self.cfg.compile_timeout_s:.0f} s") from None

    def _compile_aot(self, source: str, shift: tuple[int, int]) -> Build:
        cxx = self.aot_compiler
        if Path(cxx).name.startswith("acpp"):
            flags = ["-O3", "-std=c++17", "-shared", "-fPIC"]
        else:
            flags = ["-fsycl", "-O3", "-std=c++17", "-shared", "-fPIC"]
        flags += list(self.cfg.flags)
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
        key = CompileCache.key(source=source, flags=flags, compiler=version, kind="sycl-aot")
        t0 = time.perf_counter()
        hit = self.cache.lookup(key, ".so")
        if hit:
            return Build(str(hit), time.perf_counter() - t0, True, {"sycl_form": "aot"})
        tmp, rc, text = self.cache.compile_source(
            key, source, ".cpp", lambda src, out: [cxx, *flags, str(src), "-o", str(out)], self.cfg.compile_timeout_s)
        if rc != 0 or not tmp.exists():
            raise CompileError(clean_diagnostics(text, shift) or f"{Path(cxx).name} exited with {rc}")
        path = self.cache.commit(tmp, key, ".so")
        return Build(str(path), time.perf_counter() - t0, False, {"sycl_form": "aot"})

    # --- sandbox side ------------------------------------------------------------------------
    def open_device(self) -> None:
        dpctl = rt.import_dpctl()
        try:
            self.queue = dpctl.SyclQueue(self.device, property=["enable_profiling", "in_order"])
        except Exception as e:
            raise BackendError(f"cannot open a profiling queue on {self.device.filter_string}: {e}") from None
        lib = ctypes.CDLL(str(self.tools().library), mode=ctypes.RTLD_LOCAL)
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
        self.lib = lib
        self.qptr = ctypes.c_void_p(self.queue.addressof_ref())

    def load(self, artifact: str, task) -> Callable[[dict[str, Any]], int]:
        if self.queue is None:
            self.open_device()
        if artifact.endswith(".so"):
            return self._load_aot(artifact, task)
        manifest = json.loads(Path(artifact).read_text())
        launches = [Launch.from_dict(d) for d in manifest["launches"]]
        if manifest["form"] == "jit":
            return _JitCall(self, manifest, launches, task)
        return _OpenCLCall(self, manifest, launches, task)

    def _load_aot(self, artifact: str, task):
        lib = ctypes.CDLL(artifact, mode=ctypes.RTLD_LOCAL)
        try:
            fn = lib.kf_forward
        except AttributeError:
            raise RuntimeError('the library does not export kf_forward (declare it extern "C")') from None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p if isinstance(a, Tensor) else _CTYPE[a.dtype] for a in task.args] \
            + [ctypes.c_void_p]
        names = [a.name for a in task.args]
        tensors = {a.name for a in task.args if isinstance(a, Tensor)}

        def call(args: dict[str, Any]) -> int:
            return fn(*[args[n].ptr if n in tensors else args[n] for n in names], self.qptr)

        call.keepalive = lib
        return call

    def _err(self):
        return ctypes.create_string_buffer(_ERR_CAP)

    def record(self, kind: str, event) -> None:
        """Keep a launch's event while a call is timed; otherwise let it go."""
        if self._recording:
            self._events.append((kind, event))
        elif kind == "host":
            self.lib.kf_event_free(event)

    def to_device(self, args: dict[str, Any]) -> dict[str, Any]:
        import dpctl.memory as dm

        out = {}
        for k, v in args.items():
            if isinstance(v, np.ndarray):
                a = np.ascontiguousarray(v)
                mem = dm.MemoryUSMDevice(max(a.nbytes, 1), queue=self.queue)
                if a.nbytes:
                    mem.copy_from_host(a.reshape(-1).view(np.uint8))
                out[k] = UsmArray(mem, a.shape, a.dtype, v)
            else:
                out[k] = v
        return out

    def to_host(self, value: Any) -> np.ndarray:
        if isinstance(value, UsmArray):
            return value.numpy()
        return np.asarray(value)

    def synchronize(self) -> None:
        if self.lib is None:
            return
        err = self._err()
        if self.lib.kf_queue_wait(self.qptr, err, _ERR_CAP) != 0:
            raise RuntimeError(f"the SYCL queue reported an error: {err.value.decode(errors='replace')}")

    def time_call(self, fn: Callable[[], Any]) -> float:
        """Device time of one call: first kernel start to last kernel end, from event timestamps."""
        self._events = []
        self._recording = True
        b0 = b1 = None
        t0 = time.perf_counter()
        try:
            if self.form == "aot":
                b0 = self.lib.kf_barrier(self.qptr, None, 0)
            fn()
            if self.form == "aot":
                b1 = self.lib.kf_barrier(self.qptr, None, 0)
        finally:
            self._recording = False
        self.synchronize()
        wall = time.perf_counter() - t0
        spans = []
        events = self._events
        self._events = []
        if b0 and b1:
            events = [("host", b0), *events, ("host", b1)]
        for kind, ev in events:
            if kind == "host":
                s, e = ctypes.c_uint64(), ctypes.c_uint64()
                if self.lib.kf_event_times(ev, ctypes.byref(s), ctypes.byref(e), None, 0) == 0:
                    spans.append((s.value, e.value))
                self.lib.kf_event_free(ev)
            else:
                try:
                    spans.append((ev.profiling_info_start, ev.profiling_info_end))
                except Exception:
                    pass
        if spans:
            dev = (max(e for _, e in spans) - min(s for s, _ in spans)) * 1e-9
            if 0 < dev <= wall * 1.5:
                return dev
        return wall

    def reference(self, task, args: dict[str, Any]) -> dict[str, Any]:
        host = {k: (v.host if isinstance(v, UsmArray) else v) for k, v in args.items()}
        return task.run_reference(host)

    def check_sticky_error(self) -> str | None:
        return None


def _match_shape(task, args: dict[str, Any]) -> str | None:
    dims = {a.name: tuple(args[a.name].shape) for a in task.args
            if isinstance(a, Tensor) and hasattr(args.get(a.name), "shape")}
    for shape, cfg in task.shapes.items():
        try:
            if all(a.dims(cfg) == dims[a.name] for a in task.args if isinstance(a, Tensor) and a.name in dims):
                return shape
        except ValueError:
            continue
    return None


class _KernelCall:
    """Shared by the jit and OpenCL forms: argument marshalling and cached launch ranges."""

    def __init__(self, backend: SyclBackend, manifest: dict, launches: list[Launch], task):
        self.backend, self.task, self.launches = backend, task, launches
        self.params = manifest.get("params", {})
        self.names = [a.name for a in task.args]
        self.tensors = {a.name for a in task.args if isinstance(a, Tensor)}
        self._ranges: dict[tuple, list] = {}

    def ranges(self, args: dict[str, Any]) -> list:
        key = tuple((n, args[n].shape if n in self.tensors else args[n]) for n in self.names
                    if n in self.tensors or isinstance(args[n], int))
        if key not in self._ranges:
            shape = _match_shape(self.task, args)
            env = dict(shape_env(self.task, shape)) if shape else {}
            env.update({n: args[n] for n in self.names if n not in self.tensors})
            env.update(self.params)
            max_wg = int(self.backend.device_facts().get("max_work_group_size") or 0)
            try:
                self._ranges[key] = [launch_ranges(ln, env, max_wg) for ln in self.launches]
            except ValueError as e:
                raise RuntimeError(f"bad launch declaration: {e}") from None
        return self._ranges[key]


class _JitCall(_KernelCall):
    def __init__(self, backend: SyclBackend, manifest: dict, launches: list[Launch], task):
        super().__init__(backend, manifest, launches, task)
        lib, err = backend.lib, backend._err()
        data = base64.b64decode(manifest["syclbin"])
        self.bundle = lib.kf_bundle_load(backend.qptr, data, len(data), err, _ERR_CAP)
        if not self.bundle:
            raise RuntimeError(err.value.decode(errors="replace"))
        self.kernels = {}
        for ln in launches:
            if ln.kernel not in self.kernels:
                k = lib.kf_kernel_get(self.bundle, ln.kernel.encode(), err, _ERR_CAP)
                if not k:
                    raise RuntimeError(err.value.decode(errors="replace"))
                self.kernels[ln.kernel] = k
        n = len(self.names)
        self.kinds = (ctypes.c_int * n)(*[0 if a.name in self.tensors else _KIND[a.dtype] for a in task.args])
        self.dtypes = {a.name: a.dtype for a in task.args if isinstance(a, Scalar)}

    def __call__(self, args: dict[str, Any]) -> int:
        b = self.backend
        lib = b.lib
        store = [ctypes.c_void_p(args[n].ptr) if n in self.tensors else _CTYPE[self.dtypes[n]](args[n])
                 for n in self.names]
        values = (ctypes.c_void_p * len(store))(*[ctypes.addressof(s) for s in store])
        err = b._err()
        for ln, (g, loc) in zip(self.launches, self.ranges(args)):
            dims = len(g)
            ev = lib.kf_launch(b.qptr, self.kernels[ln.kernel], len(store), self.kinds, values, dims,
                               (ctypes.c_size_t * dims)(*g), (ctypes.c_size_t * dims)(*loc), err, _ERR_CAP)
            if not ev:
                raise RuntimeError(err.value.decode(errors="replace"))
            b.record("host", ev)
        return 0

    def __del__(self):
        lib = getattr(self.backend, "lib", None)
        if lib is None:
            return
        for k in getattr(self, "kernels", {}).values():
            lib.kf_kernel_free(k)
        if getattr(self, "bundle", None):
            lib.kf_bundle_free(self.bundle)


class _OpenCLCall(_KernelCall):
    def __init__(self, backend: SyclBackend, manifest: dict, launches: list[Launch], task):
        super().__init__(backend, manifest, launches, task)
        import dpctl.program as dp

        key = CompileCache.key(source=manifest["source"], options=manifest["options"])
        prog = backend._programs.get(key)
        if prog is None:
            try:
                prog = dp.create_program_from_source(backend.queue, manifest["source"], manifest["options"])
            except Exception as e:
                raise RuntimeError(f"dpctl could not build the OpenCL C program: {type(e).__name__} {e}") from None
            backend._programs[key] = prog
        self.kernels = {}
        for ln in launches:
            if ln.kernel not in self.kernels:
                if not prog.has_sycl_kernel(ln.kernel):
                    raise RuntimeError(f"no __kernel named {ln.kernel!r} in the OpenCL C program")
                self.kernels[ln.kernel] = prog.get_sycl_kernel(ln.kernel)
        self.dtypes = {a.name: a.dtype for a in task.args if isinstance(a, Scalar)}

    def __call__(self, args: dict[str, Any]) -> int:
        b = self.backend
        kargs = [args[n].mem if n in self.tensors else _CTYPE[self.dtypes[n]](args[n]) for n in self.names]
        for ln, (g, loc) in zip(self.launches, self.ranges(args)):
            # SYCL's last dimension is OpenCL's dimension 0: reverse, so get_global_id(d) counts entry d.
            ev = b.queue.submit(self.kernels[ln.kernel], kargs, list(g[::-1]), list(loc[::-1]))
            b.record("dpctl", ev)
        return 0


if __name__ == "__main__":   # what this machine offers: python -m kfray.eval.backends.sycl [filter]
    import sys

    rt.main(sys.argv[1:])
