"""What a PyTorch problem is (`Problem`) and the small helpers its loaders share: importing torch
with a useful error, dtypes, C identifiers, a problem file's sizes, missing packages.

Kept apart from the tracing and the task so every piece of kfray/tasks/torch_ref.py can import it.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kfray.errors import TaskError
from kfray.tasks.base import C_TYPES, DTYPES, ITEMSIZE, Task, Tensor

_C_WORDS = {"int", "float", "double", "char", "long", "short", "void", "const", "return", "if", "else", "for",
            "while", "do", "struct", "class", "auto", "new", "delete", "this", "stream", "queue", "default",
            "register", "signed", "unsigned", "switch", "case", "break", "continue", "static", "inline"}


def need_torch(where: str):
    """torch, or a TaskError that says how to install it: torch is an optional dependency."""
    try:
        import torch
    except ImportError:
        raise TaskError(f"{where}: this task's reference is PyTorch, which is not installed "
                        f"(pip install 'kfray[torch]' or pip install torch)") from None
    return torch


def torch_dtype_name(t, where: str, what: str) -> str:
    """The task dtype of a tensor: any of DTYPES (half precision loads too; kf_forward_error says
    that kf_forward kernels cannot take it)."""
    name = str(t.dtype).replace("torch.", "")
    if name not in DTYPES:
        raise TaskError(f"{where}: {what} has dtype {name}, which kfray tasks cannot hold yet "
                        f"(supported: {', '.join(DTYPES)})")
    return name


def kf_forward_error(task: Task) -> str:
    """One line on why kf_forward kernels cannot take this task ('' when they can): a tensor of a
    dtype outside C_TYPES. Other kernel forms (PyTorch extensions, ModelNew) still run it."""
    odd: dict[str, list[str]] = {}
    for a in task.args:
        if a.dtype not in C_TYPES:
            odd.setdefault(a.dtype, []).append(a.name)
    if not odd:
        return ""
    what = "; ".join(f"{d} tensors ({', '.join(n)})" for d, n in odd.items())
    return (f"{what}: kf_forward kernels take only {', '.join(C_TYPES)}; "
            f"a PyTorch extension or ModelNew kernel can run this task")


def tensor_bytes(task: Task) -> int:
    """Bytes of every tensor argument (inputs, parameters/buffers, outputs) on the largest shape config."""
    return max(sum(ITEMSIZE[a.dtype] * int(np.prod(a.dims(cfg), dtype=np.int64)) for a in task.args
                   if isinstance(a, Tensor)) for cfg in task.shapes.values())


PIP_NAMES = {"sklearn": "scikit-learn", "cv2": "opencv-python", "PIL": "pillow", "yaml": "pyyaml",
             "skimage": "scikit-image"}


def missing_package(e: BaseException | None) -> str | None:
    """'needs the package einops (pip install einops)' when `e` (or what it was raised from) is a
    missing import, else None: an ImportError message alone does not say what to do."""
    while e is not None:
        if isinstance(e, ModuleNotFoundError) and e.name:
            top = e.name.split(".")[0]
            return f"needs the package {top} (pip install {PIP_NAMES.get(top, top)})"
        e = e.__cause__ or e.__context__
    return None


def c_ident(name: str, taken: set[str]) -> str:
    """A C identifier for `name`, unique among `taken`: argument names reach kernels as C names."""
    s = re.sub(r"\W", "_", name).strip("_") or "arg"
    if s[0].isdigit():
        s = "t_" + s
    if s in _C_WORDS:
        s += "_"
    base, i = s, 2
    while s in taken:
        s = f"{base}_{i}"
        i += 1
    taken.add(s)
    return s


def module_constants(path: Path, mod) -> dict[str, int | float]:
    """Module-level `NAME = number` assignments of a file, in file order (the problem's sizes)."""
    out = {}
    try:
        tree = ast.parse(path.read_text())
    except SyntaxError:
        return out
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            n = node.targets[0].id
            v = getattr(mod, n, None)
            if not n.startswith("_") and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[n] = v
    return out


def outputs_of(res, where: str) -> list:
    """The tensors a forward returned, as a list: a task has one output argument per tensor."""
    import torch

    if isinstance(res, torch.Tensor):
        return [res]
    if isinstance(res, (tuple, list)) and res and all(isinstance(r, torch.Tensor) for r in res):
        return list(res)
    raise TaskError(f"{where}: forward returns {type(res).__name__}, not a tensor or a tuple of tensors")


@dataclass
class Problem:
    """How to build one configuration of a PyTorch problem."""

    where: str                                         # file or folder, for messages
    make_model: Callable[[dict], Any]                  # config -> nn.Module
    make_inputs: Callable[[dict], list]                # config -> list of forward inputs
    input_names: list[str]
    configs: dict[str, dict]                           # shape config name -> settings (any values)
    size_names: dict[str, list[str]]                   # per config, names to try for dims, in order
    source_text: str = ""
    title: str = ""
    forward: Callable | None = None                    # (module, inputs) -> outputs; default module(*inputs)
    output_names: list[str] = field(default_factory=list)
    param_prefix: str = ""                             # stripped from parameter names to make arg names
