"""SYCL backend through dpctl: three source forms, USM memory, profiling-queue event timestamps.

Forms (`eval.sycl_form`), each a candidate language and one class:

- `jit` (language `sycl_jit`, jit.py): SYCL C++ free-function kernels compiled at run time by the
  `sycl_ext_oneapi_kernel_compiler` extension of intel-sycl-rt. The candidate holds kernels only,
  plus one launch declaration per kernel launch, run in order (parsed by kfray.source):

      // @kf.launch softmax_rows global=(rows * WG) local=(WG)

  Range expressions are over the shape config, the task's scalars and the @kf.param values;
  dimension d of the declaration is what `get_global_id(d)` counts (SYCL order: the last one
  varies fastest).
- `opencl` (language `opencl`, opencl.py): OpenCL C kernels with the same launch declarations.
- `aot` (language `sycl`, aot.py): whole SYCL programs built ahead of time by `icpx -fsycl` (or
  `acpp`), exporting `extern "C" int kf_forward(<task args>, sycl::queue* queue)`.

The rest, one job a file: backend.py (the device, queue, memory and timing every form shares),
form.py and kernel_form.py (what forms have in common), defines.py (@kf.param as #defines),
diagnostics.py (compiler output for the prompt), memory.py (USM tensors), runtime.py (packages,
devices, facts, Ray resources), host_tools.py (kfray's C++ host library and compile tool) and
__main__.py (`python -m kfray.eval.backends.sycl [FILTER | --resources | --probe FILTER]`).
The prompt's statement of the contract is kfray.prompts.contracts.
"""
from kfray.eval.backends.sycl.backend import FORM_LANGUAGE, FORMS, LANGUAGE_FORM, SyclBackend
from kfray.eval.backends.sycl.defines import inject_defines, line_shift
from kfray.eval.backends.sycl.diagnostics import clean_diagnostics
from kfray.eval.backends.sycl.memory import UsmArray
from kfray.eval.backends.sycl.runtime import ensure_icd_env, evaluator_resources, node_resources, select_device

__all__ = [
    "FORMS", "FORM_LANGUAGE", "LANGUAGE_FORM", "SyclBackend", "UsmArray",
    "clean_diagnostics", "inject_defines", "line_shift",
    "ensure_icd_env", "evaluator_resources", "node_resources", "select_device",
]
