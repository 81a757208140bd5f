"""The contract of the run-time kernel forms (sycl_jit, opencl), as a prompt states it.

It is text for the model, built from the task alone, so it lives with the prompts rather than with
the SYCL backend that enforces it; the prompt builder must not reach up into the backends.
"""
from __future__ import annotations

from kfray.tasks.base import Scalar, Tensor

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
