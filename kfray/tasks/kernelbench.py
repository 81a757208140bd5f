"""KernelBench problems: one Python file with `class Model(nn.Module)`, `get_inputs()`,
`get_init_inputs()` and module-level size constants becomes a Task (ref `kernelbench:PATH`).

The model's parameters and buffers become explicit input tensors (see kfray/tasks/torch_ref.py);
the one shape config, `default`, holds the file's size constants, each also passed to the kernel
as a scalar. PyTorch (eager) is the reference and the baseline the speedups are measured against.
"""
from __future__ import annotations

import inspect
from pathlib import Path

from kfray.errors import TaskError
from kfray.tasks.package import import_file
from kfray.tasks.torch_ref import Problem, build_torch_task, module_constants, need_torch

RTOL = ATOL = 1e-3


def is_problem_file(path: Path) -> bool:
    if path.suffix != ".py" or path.name.startswith("_"):
        return False
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    return "class Model" in text and "def get_inputs" in text


def load_kernelbench(path: str | Path):
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise TaskError(f"{where}: no such KernelBench problem file")
    need_torch(where)
    mod = import_file(path, "KernelBench problem")
    for attr in ("Model", "get_inputs"):
        if not hasattr(mod, attr):
            raise TaskError(f"{where}: not a KernelBench problem: it defines no {attr}")
    Model, get_inputs = mod.Model, mod.get_inputs
    get_init = getattr(mod, "get_init_inputs", lambda: [])
    consts = module_constants(path, mod)
    try:
        init_vals = list(get_init())
    except Exception as e:
        raise TaskError(f"{where}: get_init_inputs() failed: {type(e).__name__}: {e}") from None
    settings = dict(consts)
    for i, v in enumerate(init_vals):   # init values that are no named constant get a name of their own
        if isinstance(v, (int, float)) and not isinstance(v, bool) and \
                not any(type(c) is type(v) and c == v for c in consts.values()):
            settings[f"init{i}"] = v
    try:
        params = list(inspect.signature(Model.forward).parameters)[1:]
        names = [p for p in params if inspect.signature(Model.forward).parameters[p].kind
                 in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    problem = Problem(
        where=where,
        make_model=lambda cfg: Model(*init_vals),
        make_inputs=lambda cfg: list(get_inputs()),
        input_names=names, configs={"default": settings}, size_names={"default": list(consts)},
        source_text=path.read_text(), title=path.stem)
    level = path.parent.name
    desc = (f"KernelBench {level} problem {path.stem}: compute exactly what Model.forward computes, "
            f"as one or more kernels.")
    return build_torch_task(problem, path.stem, desc, RTOL, ATOL)
