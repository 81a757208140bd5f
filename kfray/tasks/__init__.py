"""Tasks and their loaders. `load_task(ref)` turns a reference string into a Task.

Reference forms: `axpb` or `builtin:axpb` (built-in); a suffix `@SET` picks one of the task's
named shape sets instead of its default shapes, e.g. `axpb@gpu` (sizes that fill a GPU).
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache

from kfray.errors import TaskError
from kfray.tasks.base import Scalar, Seed, Task, Tensor
from kfray.tasks.builtin import BUILTIN

__all__ = ["Task", "Tensor", "Scalar", "Seed", "load_task", "builtin_names"]


def builtin_names() -> list[str]:
    return sorted(BUILTIN)


@lru_cache(maxsize=64)
def load_task(ref: str) -> Task:
    base, _, shape_set = ref.partition("@")
    task = _load(base)
    if shape_set:
        if shape_set not in task.shape_sets:
            raise TaskError(f"task {base!r} has no shape set {shape_set!r} "
                            f"(it has: {', '.join(task.shape_sets) or 'none'})")
        task = dataclasses.replace(task, shapes=task.shape_sets[shape_set])
    return dataclasses.replace(task, ref=ref, name=ref)


def _load(ref: str) -> Task:
    kind, _, name = ref.partition(":") if ":" in ref else ("builtin", "", ref)
    if kind == "builtin":
        if name not in BUILTIN:
            raise TaskError(f"no built-in task named {name!r}; built-in tasks are: {', '.join(builtin_names())}")
        return BUILTIN[name]()
    raise TaskError(f"task reference {ref!r}: unknown loader {kind!r} (known: builtin)")
