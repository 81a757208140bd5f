"""The suites' own kernel form, for searching suite tasks as the suites run them (language `suite`):
robust-kbench takes a PyTorch extension (`.cu`, `.cpp` on the CPU) binding `forward`, or `backward`
for a backward task; KernelBench takes a Python file defining `ModelNew`. Here: the seed kernels a
search starts from, the contract a proposer is told, and the file a search's best kernel is
written as, which the suite's own harness takes unchanged.
"""
from __future__ import annotations

import re
from pathlib import Path

from kfray.tasks.base import Seed
from kfray.tasks.suite_spec import KERNELBENCH, RKB, SuiteSpec

LANGUAGE = "suite"
_MODELNEW_RE = re.compile(r"^class\s+ModelNew\b|^ModelNew\s*=", re.M)
_EXTENSION_RE = re.compile(r'^\s*#\s*include\s*[<"]torch/extension\.h[>"]|'
                           r'^\s*PYBIND11_MODULE\s*\(\s*TORCH_EXTENSION_NAME\b', re.M)


def is_modelnew(source: str) -> bool:
    """True for a KernelBench-form Python file: it defines `ModelNew`."""
    return bool(_MODELNEW_RE.search(source))


def is_torch_extension(source: str) -> bool:
    """True for a source in the PyTorch-extension form: it includes torch/extension.h, or binds its
    module under the name torch's extension builder gives it (TORCH_EXTENSION_NAME), as a file that
    needs no more than pybind11 does."""
    return bool(_EXTENSION_RE.search(source))


_CUDA_CODE_RE = re.compile(r"__global__|<<<|#\s*include\s*[<\"](cuda|ATen/cuda|c10/cuda)|cuda_sources|\.cuda\(|"
                           r"device\s*=\s*['\"]cuda|\btriton\b")


def suite_backend(source: str, filename: str = "", gpu_available: bool = False) -> str | None:
    """The backend that runs a kernel file in a suite's form (a KernelBench ModelNew `.py`, whatever
    it holds: CUDA sources, Triton or plain PyTorch; a PyTorch extension `.cpp` / `.cu`) on a
    machine where PyTorch does or does not see a GPU: torch_ext_cuda wherever there is one, as the
    suites run on the GPU; without one torch_ext_cpu, unless the file holds CUDA code (it needs a
    GPU, and torch_ext_cuda says so). None for a file in no suite's form (a kf_forward kernel)."""
    if not (filename.endswith(".py") or is_modelnew(source) or is_torch_extension(source)):
        return None
    if gpu_available:
        return "torch_ext_cuda"
    cuda = filename.endswith((".cu", ".cuh")) or bool(_CUDA_CODE_RE.search(source))
    return "torch_ext_cuda" if cuda else "torch_ext_cpu"


def torch_gpu() -> str:
    """The name of the GPU PyTorch sees ('' for none, or no PyTorch)."""
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    except Exception:
        return ""


def suite_backend_note(gpu: str | None = None) -> str:
    """Which backend kernel files in a suite's form run on here, and why (for `kfray doctor`)."""
    gpu = torch_gpu() if gpu is None else gpu
    what = "suite-form kernels (ModelNew .py, PyTorch extensions) and suite sweeps run on"
    if gpu:
        return (f"{what} torch_ext_cuda: PyTorch sees a GPU ({gpu}); sweeps run one evaluator per GPU "
                "(--backend or eval.backend picks another)")
    try:
        import torch   # noqa: F401
        why = "PyTorch sees no GPU"
    except ImportError:
        why = "PyTorch is not installed (pip install torch)"
    return f"{what} torch_ext_cpu: {why} (files with CUDA code need torch_ext_cuda and a GPU)"


def modelnew_of_problem(problem_source: str) -> str:
    """A ModelNew file that is the problem's own Model (the reference operator): correct by
    construction, the baseline a KernelBench search improves on."""
    return (problem_source.rstrip() + "\n\n\n"
            "class ModelNew(Model):\n"
            '    """The reference operator itself: the starting point for custom kernels."""\n')


_PY_DELIM = "KFRAY_PY"


def reference_extension(func_source: str) -> str:
    """A robust-kbench forward kernel that is the task's own `forward_fn`: its Python source held
    in the extension and called on each `forward`, so it is correct by construction and the suite's
    harness builds it like any other kernel. The baseline a search of that task starts from. Bound
    as the function itself, not behind a pybind11 wrapper: a wrapper's microsecond a call is a large
    share of robust-kbench's smallest tasks (a ReLU of 16 x 16384 runs in a few microseconds).
    It includes pybind11 alone: torch/extension.h is most of a build, and this file uses none of
    it (nvcc, 2 cores: 125 s with it, 18 s without; robust-kbench's `load` builds either)."""
    if f"){_PY_DELIM}" in func_source:
        raise ValueError(f"the task's source contains ){_PY_DELIM}, which ends the embedded string")
    return (
        "// The task's own forward_fn, run from inside a PyTorch extension: the reference operator in\n"
        "// robust-kbench's kernel form (bound as `forward`), the starting point for custom kernels.\n"
        "#include <pybind11/pybind11.h>\n#include <pybind11/eval.h>\n\n"
        "namespace py = pybind11;\n\n"
        f'static const char* kTaskSource = R"{_PY_DELIM}(\n{func_source}\n){_PY_DELIM}";\n\n'
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
        "  py::dict scope;\n"
        '  scope["__builtins__"] = py::module_::import("builtins");\n'
        '  scope["__name__"] = "kfray_task_reference";\n'
        "  py::exec(kTaskSource, scope);\n"
        '  m.attr("forward") = scope["forward_fn"];   // the function itself: no wrapper on each call\n'
        "}\n")


def published_kernels(spec: SuiteSpec) -> list[tuple[str, Path]]:
    """The kernels robust-kbench ships for a task: `forward.cu` / `backward.cu` (or `.cpp`) in the
    task folder, and `highlighted/<task>/<direction>/kernel.cu` beside the tasks folder."""
    folder = Path(spec.path)
    found = [(f"suite_{spec.direction}{suffix.replace('.', '_')}", folder / f"{spec.direction}{suffix}")
             for suffix in (".cu", ".cpp")]
    found.append((f"highlighted_{spec.direction}", folder.parent.parent / "highlighted" / folder.name
                  / spec.direction / "kernel.cu"))
    return [(name, f) for name, f in found
            if f.is_file() and "torch/extension.h" in f.read_text(errors="replace")]


def seeds(spec: SuiteSpec) -> list[Seed]:
    """KernelBench: the reference module as ModelNew. robust-kbench: the kernels the suite publishes
    for the task and, for a forward task, the task's own forward_fn as an extension (the baseline)."""
    if spec.kind == KERNELBENCH:
        return [Seed("reference_module", LANGUAGE, modelnew_of_problem(Path(spec.path).read_text()))]
    out = []
    if spec.kind == RKB:
        out = [Seed(name, LANGUAGE, f.read_text()) for name, f in published_kernels(spec)]
        func = Path(spec.path) / "func_forward.py"
        if spec.direction == "forward" and func.is_file():
            out.append(Seed("reference_function", LANGUAGE, reference_extension(func.read_text())))
    return out


def contract(task) -> str:
    """What a proposer must write for a suite task, in the suite's words."""
    spec: SuiteSpec = task.suite
    if spec.kind == KERNELBENCH:
        return ("Write one complete Python file that defines `class ModelNew(nn.Module)`, taking the same "
                "`__init__` arguments as `Model` and returning from `forward` exactly what `Model.forward` "
                "returns (same shapes and dtypes). Replace PyTorch operators with custom kernels built by "
                "`torch.utils.cpp_extension.load_inline` (CUDA sources for the GPU). This is the file "
                "KernelBench's own harness evaluates: it builds ModelNew after `set_seed(42)` like Model, "
                f"checks {spec.trials} trials with `torch.allclose(atol=rtol={spec.atol:g})` and times "
                "`ModelNew(*init)(*inputs)` with CUDA events. Answer with the whole file in one ```python block.")
    bind = spec.binds
    how = ("`Model.forward(*inputs, fn=forward)`: `forward` receives exactly what `Model.forward` passes to "
           "`fn` (tensors, numbers, None) and returns the output tensor" if bind == "forward" else
           "`AutogradFunction.backward_fn`: the task's `AutogradFunction.backward` calls `backward` with the "
           "arguments shown in its source and expects the gradients it returns; robust-kbench then compares "
           "the `.grad` of every parameter and input")
    return (f"Write one complete PyTorch C++/CUDA extension source (`.cu`) that includes <torch/extension.h> and "
            f'binds `{bind}` with `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("{bind}", &{bind}); }}`. '
            f"robust-kbench builds it with nvcc -O3 --use_fast_math and calls it through {how}. Launch every "
            "kernel on `at::cuda::getCurrentCUDAStream()`. Correct means `torch.allclose(atol=rtol="
            f"{spec.atol:g})` on {spec.trials} trials of every configuration. Answer with the whole file in "
            "one ```cuda block.")


def best_file(source: str, params: dict, spec: SuiteSpec, backend: str) -> tuple[str, str]:
    """(file suffix, text) of a best kernel as the suite takes it: a ModelNew file as it is, an
    extension with its tunables baked in as #defines ahead of the source, so that the file builds
    without kfray's -D flags."""
    if is_modelnew(source) or (spec.kind == KERNELBENCH and not is_torch_extension(source)):
        return ".py", source
    defines = "".join(f"#define {k} {v}\n" for k, v in (params or {}).items())
    return (".cu" if "cuda" in backend else ".cpp"), defines + source
