"""Loading a suite candidate where it runs (its runner, or the judge on the in-process path): a
built extension imported under the name its PyInit_ symbol carries, or a ModelNew file imported
with torch's JIT build pointed at what the compile step already built. Kept apart from the
backend so that the runner, which imports this, does not import the backends."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from pathlib import Path


def module_name(artifact: str) -> str:
    return "kf_ext_" + Path(artifact).name.split(".")[0]


def load_suite_kernel(artifact: str, task, arch_list: str = "", modules: dict | None = None):
    """The extension's `forward` (`backward` for a robust-kbench backward task), imported under
    the name its PyInit_ symbol carries; for a ModelNew file, its ModelNew class. Runs where the
    candidate may run: its runner (or the judge, on the in-process path)."""
    import torch  # noqa: F401  (its libraries and pybind11 casters must be loaded first)

    if artifact.endswith(".py"):
        from kfray.tasks.package import import_file

        os.environ["TORCH_EXTENSIONS_DIR"] = artifact + ".ext"      # the compile step's build
        _load_prebuilt_extensions()
        if arch_list:
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
        cls = getattr(import_file(artifact, "ModelNew file"), "ModelNew", None)
        if not isinstance(cls, type):
            raise RuntimeError("the file defines no class ModelNew")
        return cls
    modules = {} if modules is None else modules
    if artifact not in modules:
        name = module_name(artifact)
        loader = importlib.machinery.ExtensionFileLoader(name, artifact)
        spec = importlib.util.spec_from_file_location(name, artifact, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        modules[artifact] = mod
    suite = getattr(task, "suite", None)
    name = suite.binds if suite is not None else "forward"
    fn = getattr(modules[artifact], name, None)
    if not callable(fn):
        raise RuntimeError(f'the extension binds no function `{name}`; add m.def("{name}", &{name}) '
                           "to its PYBIND11_MODULE")
    return fn


def _load_prebuilt_extensions() -> None:
    """torch's JIT build (load_inline, load) in the sandbox: an extension the compile step built
    already (its library in its build folder) is imported as it is, with no ninja and no lock file.
    Otherwise torch builds as usual, in a private copy of a folder it cannot write (isolation keeps
    the compile cache read-only). A copy is never reused as it is: ninja's files name the folder
    they were made in, so a copy rebuilds, which took an nvcc build's time inside the time limit."""
    import inspect

    from torch.utils import cpp_extension as ce

    if getattr(ce._jit_compile, "kfray_prebuilt", False):
        return
    original = ce._jit_compile
    signature = inspect.signature(original)

    def jit_compile(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        a = call.arguments
        name, folder = a["name"], a["build_directory"]
        if not a.get("is_standalone") and os.path.isfile(os.path.join(folder, f"{name}.so")):
            return ce._import_module_from_library(name, folder, a.get("is_python_module", True))
        a["build_directory"] = _writable_copy(folder)
        return original(*call.args, **call.kwargs)

    jit_compile.kfray_prebuilt = True
    ce._jit_compile = jit_compile


def _writable_copy(ext_dir: str) -> str:
    """The build folder, or under isolation (a read-only compile cache) a private copy of it in the
    sandbox's /tmp: torch's builder takes a lock file in the folder it builds in."""
    if not os.path.isdir(ext_dir) or os.access(ext_dir, os.W_OK):
        return ext_dir
    import shutil
    import tempfile

    copy = os.path.join(tempfile.mkdtemp(prefix="kf_ext_"), "ext")
    shutil.copytree(ext_dir, copy, symlinks=True)
    return copy
