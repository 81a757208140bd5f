"""The kernel languages kfray searches in, in one place: each one's file suffix, the compiler
that builds it, the family the behavioural descriptors read it as, and which backends run it.
Every part that needs such a fact asks here (the driver, the sweep, task seeds, descriptors,
best-kernel files) instead of keeping its own table.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Language:
    name: str
    suffix: str              # a kernel file of this language
    compiler: str            # what builds it
    family: str              # how descriptors and source edits read it: cpp | cuda
    backends: tuple[str, ...]
    what: str                # one line for messages


LANGUAGES: dict[str, Language] = {lang.name: lang for lang in (
    Language("cpp", ".cpp", "g++ (OpenMP)", "cpp", ("cpu", "sim"), "a kf_forward C++ kernel for the CPU"),
    Language("cuda", ".cu", "nvcc", "cuda", ("cuda",), "a kf_forward CUDA kernel"),
    Language("sycl_jit", ".cpp", "the SYCL runtime's kernel compiler", "cpp", ("sycl",),
             "SYCL kernels compiled at run time"),
    Language("sycl", ".cpp", "icpx -fsycl", "cpp", ("sycl",), "a SYCL program built ahead of time"),
    Language("opencl", ".cl", "the OpenCL runtime", "cpp", ("sycl",), "OpenCL C kernels"),
    Language("torch_ext", ".cpp", "g++ / nvcc against libtorch", "cpp", ("torch_ext_cpu", "torch_ext_cuda"),
             "a PyTorch extension kernel file"),
    Language("suite", ".cu", "the suite's own build", "cuda", ("torch_ext_cpu", "torch_ext_cuda"),
             "a kernel in a suite's own form (robust-kbench extension, KernelBench ModelNew)"),
)}

# The language a backend's candidates are written in (sycl: by eval.sycl_form).
BACKEND_LANGUAGE = {"cpu": "cpp", "sim": "cpp", "cuda": "cuda", "torch_ext_cpu": "suite", "torch_ext_cuda": "suite"}
SYCL_FORM_LANGUAGE = {"jit": "sycl_jit", "aot": "sycl", "opencl": "opencl"}


def language_of_backend(backend: str, sycl_form: str = "jit") -> str:
    """The candidate language of a backend (for sycl, of its source form)."""
    if backend == "sycl":
        return SYCL_FORM_LANGUAGE[sycl_form or "jit"]
    return BACKEND_LANGUAGE[backend]


def language_of(e) -> str:
    """The candidate language of an EvalConfig."""
    return language_of_backend(e.backend, getattr(e, "sycl_form", "jit") or "jit")


def suffix(language: str) -> str:
    return LANGUAGES[language].suffix


def family(language: str) -> str:
    """cpp or cuda: how descriptors and source edits read a language (unknown ones read as cpp)."""
    lang = LANGUAGES.get(language)
    return lang.family if lang else "cpp"
