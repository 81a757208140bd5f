"""What the run-time kernel forms (jit, opencl) share: the launches their sources declare with
`@kf.launch`, a compile by kfray's compile tool, and a JSON manifest as the artifact.

`compile` runs in the evaluator and never executes candidate code: a separate process
(`kfray_sycl_compile`) compiles the source for the device and returns the clang / OpenCL build log
as the CompileError. In the sandbox a KernelCall launches the declared kernels in order on the
backend's queue.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from abc import abstractmethod
from pathlib import Path
from typing import Any

from kfray.eval import isolation
from kfray.eval.backends.base import Build, CompileError
from kfray.eval.backends.sycl.diagnostics import CRASH_HINTS, clean_diagnostics, signal_name
from kfray.eval.backends.sycl.form import SourceForm
from kfray.eval.compile_cache import CompileCache
from kfray.source import Launch, launch_ranges, parse_launches, safe_eval
from kfray.tasks.base import Scalar, Tensor


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


def match_shape(task, args: dict[str, Any]) -> str | None:
    """The shape config whose tensor dimensions the arguments have, if any."""
    dims = {a.name: tuple(args[a.name].shape) for a in task.args
            if isinstance(a, Tensor) and hasattr(args.get(a.name), "shape")}
    for shape, cfg in task.shapes.items():
        try:
            if all(a.dims(cfg) == dims[a.name] for a in task.args if isinstance(a, Tensor) and a.name in dims):
                return shape
        except ValueError:
            continue
    return None


class KernelForm(SourceForm):
    tool_language = ""      # the source language the compile tool is told: sycl | opencl
    seconds_fact = ""       # the fact that records how long the compile took
    call: type[KernelCall]  # what `load` makes of a manifest

    @abstractmethod
    def prepare(self, source: str, params: dict[str, Any]) -> tuple[str, list[str], tuple[int, int]]:
        """The text the compile tool gets, its options, and the line shift of the diagnostics."""

    @abstractmethod
    def payload(self, source: str, opts: list[str], binary: Path) -> dict[str, Any]:
        """What the manifest holds besides the launches, for `load` to make the kernels from."""

    def warnings(self, proc: subprocess.CompletedProcess, shift: tuple[int, int]) -> str:
        """Compiler warnings of a successful build worth keeping in the facts."""
        return ""

    def build(self, out: Path, kernels: list[str], opts: list[str], text: str):
        """Run the compile tool; returns the finished process and the options it was given."""
        return self.run_tool(out, kernels, opts, text), opts

    def compile(self, source: str, params: dict[str, Any], task) -> Build:
        b = self.backend
        try:
            launches = parse_launches(source)
        except ValueError as e:
            raise CompileError(str(e)) from None
        if not launches:
            raise CompileError("the source declares no kernel launch: add one line per launch, e.g. "
                               "// @kf.launch my_kernel global=((n + 255) // 256 * 256) local=(256)")
        max_wg = int(b.device_facts().get("max_work_group_size") or 0)
        for shape in task.shapes:
            env = {**shape_env(task, shape), **params}
            for ln in launches:
                try:
                    launch_ranges(ln, env, max_wg)
                except ValueError as e:
                    raise CompileError(f"shape {shape}: {e}") from None
        text, opts, shift = self.prepare(source, params)
        f = b.device_facts()
        key = CompileCache.key(source=text, opts=opts, kind=f"sycl-{self.name}", device=f["name"],
                               driver=f["driver_version"], filter=f["filter"], tools=str(b.tools().compiler))
        t0 = time.perf_counter()
        hit = b.cache.lookup(key, ".json")
        if hit:
            return Build(str(hit), time.perf_counter() - t0, True, {"sycl_form": self.name})
        tmp_bin = b.cache.temp_path(key, ".bin")
        kernels = [f"--kernel={k}" for k in dict.fromkeys(ln.kernel for ln in launches)]
        proc, opts = self.build(tmp_bin, kernels, opts, text)
        seconds = time.perf_counter() - t0
        try:
            if proc.returncode != 0 or not tmp_bin.exists():
                msg = clean_diagnostics(proc.stderr or proc.stdout, shift)
                if proc.returncode < 0:
                    msg = (f"the SYCL kernel compiler crashed ({signal_name(-proc.returncode)}) on this source"
                           + "".join(f"; {hint}" for pat, hint in CRASH_HINTS if pat in text)
                           + (f"\n{msg}" if msg else ""))
                elif proc.returncode not in (0, 1):
                    msg = f"the SYCL compile tool failed (exit {proc.returncode}): {msg}"
                raise CompileError(msg or f"the SYCL compiler exited with {proc.returncode}")
            manifest: dict[str, Any] = {"form": self.name, "launches": [ln.to_dict() for ln in launches],
                                        "params": params, **self.payload(source, opts, tmp_bin)}
        finally:
            tmp_bin.unlink(missing_ok=True)
        tmp = b.cache.temp_path(key, ".json")
        tmp.write_text(json.dumps(manifest))
        path = b.cache.commit(tmp, key, ".json")
        facts: dict[str, Any] = {"sycl_form": self.name, self.seconds_fact: round(seconds, 3)}
        warnings = self.warnings(proc, shift)
        if warnings:
            facts["compile_log"] = warnings[:1000]
        return Build(str(path), seconds, False, facts)

    def run_tool(self, out: Path, kernels: list[str], opts: list[str], text: str):
        b = self.backend
        cmd = [str(b.tools().compiler), b.device_facts()["filter"], self.tool_language, str(out), *kernels,
               "--", *opts]
        pch = [o.split("=", 1)[1] for o in opts if o.startswith("--persistent-auto-pch=")]
        plan = b.cache.compile_plan(cmd, out.parent, pch)   # eval.isolation: no home, no network
        env = None
        if plan is not None:
            cmd, env = isolation.wrap(cmd, plan), isolation.scrubbed_env(os.environ)
        try:
            # An argument list and the source on stdin: nothing from a model reaches a shell.
            return subprocess.run(cmd, input=text, capture_output=True, text=True, env=env,
                                  timeout=b.cfg.compile_timeout_s)
        except subprocess.TimeoutExpired:
            out.unlink(missing_ok=True)
            raise CompileError(f"the SYCL compiler timed out after {b.cfg.compile_timeout_s:.0f} s") from None

    def load(self, artifact: str, task):
        manifest = json.loads(Path(artifact).read_text())
        launches = [Launch.from_dict(d) for d in manifest["launches"]]
        return self.call(self, manifest, launches, task)


class KernelCall:
    """Shared by the jit and OpenCL forms: argument marshalling and cached launch ranges."""

    def __init__(self, form: KernelForm, manifest: dict, launches: list[Launch], task):
        self.form, self.backend, self.task, self.launches = form, form.backend, task, launches
        self.params = manifest.get("params", {})
        self.names = [a.name for a in task.args]
        self.tensors = {a.name for a in task.args if isinstance(a, Tensor)}
        self.dtypes = {a.name: a.dtype for a in task.args if isinstance(a, Scalar)}
        self._ranges: dict[tuple, list] = {}

    def ranges(self, args: dict[str, Any]) -> list:
        key = tuple((n, args[n].shape if n in self.tensors else args[n]) for n in self.names
                    if n in self.tensors or isinstance(args[n], int))
        if key not in self._ranges:
            shape = match_shape(self.task, args)
            env = dict(shape_env(self.task, shape)) if shape else {}
            env.update({n: args[n] for n in self.names if n not in self.tensors})
            env.update(self.params)
            max_wg = int(self.backend.device_facts().get("max_work_group_size") or 0)
            try:
                self._ranges[key] = [launch_ranges(ln, env, max_wg) for ln in self.launches]
            except ValueError as e:
                raise RuntimeError(f"bad launch declaration: {e}") from None
        return self._ranges[key]
