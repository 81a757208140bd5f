"""What a SYCL source form is to the backend: how a candidate in that form is compiled and loaded.

SyclBackend picks one form from `eval.sycl_form` when it is made and hands it `compile` and `load`;
what differs between forms lives in the form, what they share (the device, its queue, memory and
timing) stays in the backend.
"""
from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable

from kfray.eval.backends.base import Build

if TYPE_CHECKING:
    from kfray.eval.backends.sycl.backend import SyclBackend

# ctypes types of the task's scalar dtypes, to pass scalars by value.
CTYPE = {"float32": ctypes.c_float, "float64": ctypes.c_double,
         "int32": ctypes.c_int32, "int64": ctypes.c_int64}


class SourceForm(ABC):
    name = ""               # its eval.sycl_form value
    language = ""           # the candidate language it takes
    host_barriers = False   # the candidate's own host code submits the work: time a call between barriers

    def __init__(self, backend: SyclBackend):
        self.backend = backend

    @abstractmethod
    def compile(self, source: str, params: dict[str, Any], task) -> Build:
        """Compile (params already validated) into the compile cache; raise CompileError."""

    @abstractmethod
    def load(self, artifact: str, task) -> Callable[[dict[str, Any]], int]:
        """fn(device_args) -> 0 for an artifact of `compile` (sandbox side: the queue is open)."""
