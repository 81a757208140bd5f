"""Tasks and their loaders. `load_task(ref)` turns a reference string into a Task.

Reference forms: `axpb` or `builtin:axpb` (built-in).
"""
from __future__ import annotations

from functools import lru_cache

from kfray.errors import TaskError
from kfray.tasks.base import Scalar, Seed, Task, Tensor
from kfray.tasks.builtin import BUILTIN

__all__ = ["Task", "Tensor", "Scalar", "Seed", "load_task", "builtin_names"]


def builtin_names() -> list[str]:
    return sorted(BUILTIN)


@lru_cache(maxsize=64)
def load_task(ref: str) -> Task:
    kind, _, name = ref.partition(":") if ":" in ref else ("builtin", "", ref)
    if kind == "builtin":
        if name not in BUILTIN:
            raise TaskError(f"no built-in task named {name!r}; built-in tasks are: {', '.join(builtin_names())}")
        return BUILTIN[name]()
    raise TaskError(f"task reference {ref!r}: unknown loader {kind!r} (known: builtin)")
