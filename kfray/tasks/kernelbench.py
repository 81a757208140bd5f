"""KernelBench problems: one Python file with `class Model(nn.Module)`, `get_inputs()`,
`get_init_inputs()` and module-level size constants becomes a Task (ref `kernelbench:PATH`).

The model's parameters and buffers become explicit input tensors (see kfray/tasks/torch_ref.py);
the one shape config, `default`, holds the file's size constants, each also passed to the kernel
as a scalar. PyTorch (eager) is the reference and the baseline the speedups are measured against.
"""
from __future__ import annotations

import inspect
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

from kfray.errors import TaskError
from kfray.tasks import suite_form
from kfray.tasks.base import Tensor
from kfray.tasks.package import import_file
from kfray.tasks.suite_spec import KB_TOLERANCE, KERNELBENCH, SuiteSpec
from kfray.tasks.torch_ref import (Problem, build_torch_task, kf_forward_error, missing_package, module_constants,
                                   need_torch, tensor_bytes)

RTOL = ATOL = 1e-3                      # kfray's own tolerance (the suite's own is in task.suite)
# Weights a problem fetches from the network (level4: transformers' from_pretrained): kfray does not.
NETWORK_WEIGHTS = re.compile(r"\bfrom_pretrained\s*\(|\bhf_hub_download\b|\bsnapshot_download\b")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@contextmanager
def offline():
    """Hugging Face libraries offline while a problem is imported and built, so one that wants
    weights it has not cached fails at once instead of downloading gigabytes; restored after."""
    old = {k: os.environ.get(k) for k in OFFLINE_ENV}
    os.environ.update(OFFLINE_ENV)
    hub = sys.modules.get("huggingface_hub.constants")     # read the variable at import: set it too
    hub_old = getattr(hub, "HF_HUB_OFFLINE", None)
    if hub is not None:
        hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if hub is not None:
            hub.HF_HUB_OFFLINE = hub_old


def precision(task) -> str:
    """The problem's own precision: its lowest floating dtype (KernelBench's default is float32)."""
    dts = {a.dtype for a in task.args if isinstance(a, Tensor)}
    return next((d for d in ("bfloat16", "float16") if d in dts), "float32")


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
    text = path.read_text(errors="replace")
    try:
        with offline():
            task = _load(path, where, text)
    except TaskError as e:
        reason = str(e).removeprefix(f"{where}: ")
        pkg = missing_package(e)
        if NETWORK_WEIGHTS.search(text):
            raise TaskError(f"{where}: needs model weights from the network (from_pretrained / the Hugging "
                            f"Face Hub), which kfray does not fetch" +
                            (f"; it also {pkg}" if pkg else f" (offline, it fails: {reason})")) from None
        if pkg:
            raise TaskError(f"{where}: {pkg}") from None
        raise
    tol = KB_TOLERANCE[precision(task)]
    task.rtol, task.atol = max(RTOL, tol), max(ATOL, tol)
    task.suite = SuiteSpec(kind=KERNELBENCH, path=str(path), rtol=tol, atol=tol, bytes_needed=tensor_bytes(task),
                           functional_error=kf_forward_error(task))
    task.seeds = suite_form.seeds(task.suite)
    return task


def _load(path: Path, where: str, text: str):
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
        raise TaskError(f"{where}: get_init_inputs() failed: {missing_package(e) or f'{type(e).__name__}: {e}'}") \
            from None
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
        source_text=text, title=path.stem)
    level = path.parent.name
    desc = (f"KernelBench {level} problem {path.stem}: compute exactly what Model.forward computes, "
            f"as one or more kernels.")
    return build_torch_task(problem, path.stem, desc, RTOL, ATOL)
