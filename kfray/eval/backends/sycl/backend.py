"""SyclBackend: one SYCL device through dpctl, USM memory, profiling-queue event timestamps.

The source form (`eval.sycl_form`: jit, opencl or aot) is chosen once, when the backend is made,
and does the compiling and loading; the backend owns what every form shares. In the sandbox it
opens an in-order profiling queue on the device and loads kfray's host library; a call's time is
the span from the first kernel's start to the last one's end, read from the SYCL event timestamps.
"""
from __future__ import annotations

import ctypes
import time
from typing import Any, Callable

import numpy as np

from kfray.errors import BackendError
from kfray.eval.backends.base import Backend, Build, CompileError
from kfray.eval.backends.sycl import runtime as rt
from kfray.eval.backends.sycl.aot import AotForm
from kfray.eval.backends.sycl.form import SourceForm
from kfray.eval.backends.sycl.host_tools import ERR_CAP, HostTools, bind_host_library, error_buffer, host_tools
from kfray.eval.backends.sycl.jit import JitForm
from kfray.eval.backends.sycl.memory import UsmArray
from kfray.eval.backends.sycl.opencl import OpenCLForm
from kfray.eval.compile_cache import CompileCache
from kfray.source import define_flags

FORMS: dict[str, type[SourceForm]] = {"jit": JitForm, "opencl": OpenCLForm, "aot": AotForm}
FORM_LANGUAGE = {name: form.language for name, form in FORMS.items()}
LANGUAGE_FORM = {v: k for k, v in FORM_LANGUAGE.items()}


class SyclBackend(Backend):
    name = "sycl"
    language = "sycl_jit"

    def __init__(self, cfg):
        super().__init__(cfg)
        rt.ensure_icd_env()
        self.form = getattr(cfg, "sycl_form", "") or "jit"
        if self.form not in FORMS:
            raise BackendError(f"eval.sycl_form must be one of {', '.join(FORMS)}, got {self.form!r}")
        self.language = FORM_LANGUAGE[self.form]
        self.cache = CompileCache(cfg.cache_dir or None, cfg.cache_server, cfg.isolation)
        self._device = None
        self._facts: dict[str, Any] | None = None
        self._tools: HostTools | None = None
        self.source_form = FORMS[self.form](self)
        # sandbox state
        self.queue = None
        self.lib = None
        self.qptr = None
        self._recording = False
        self._events: list[tuple[str, Any]] = []

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

    def tools(self) -> HostTools:
        if self._tools is None:
            self._tools = host_tools(self.cache.root)
        return self._tools

    def compile(self, source: str, params: dict[str, Any], task) -> Build:
        try:
            define_flags(params)
        except ValueError as e:
            raise CompileError(str(e)) from None
        return self.source_form.compile(source, params, task)

    # --- sandbox side ------------------------------------------------------------------------
    def open_device(self) -> None:
        dpctl = rt.import_dpctl()
        try:
            self.queue = dpctl.SyclQueue(self.device, property=["enable_profiling", "in_order"])
        except Exception as e:
            raise BackendError(f"cannot open a profiling queue on {self.device.filter_string}: {e}") from None
        self.lib = bind_host_library(self.tools().library)
        self.qptr = ctypes.c_void_p(self.queue.addressof_ref())

    def load(self, artifact: str, task) -> Callable[[dict[str, Any]], int]:
        if self.queue is None:
            self.open_device()
        return self.source_form.load(artifact, task)

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
        err = error_buffer()
        if self.lib.kf_queue_wait(self.qptr, err, ERR_CAP) != 0:
            raise RuntimeError(f"the SYCL queue reported an error: {err.value.decode(errors='replace')}")

    def time_call(self, fn: Callable[[], Any]) -> float:
        """Device time of one call: first kernel start to last kernel end, from event timestamps."""
        barriers = self.source_form.host_barriers
        self._events = []
        self._recording = True
        b0 = b1 = None
        t0 = time.perf_counter()
        try:
            if barriers:
                b0 = self.lib.kf_barrier(self.qptr, None, 0)
            fn()
            if barriers:
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
