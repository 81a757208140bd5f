"""Tasks and their loaders. `load_task(ref)` turns a reference string into a Task.

Reference forms (a worker process reloads a task from its ref, so refs are paths, not objects):

- `axpb` or `builtin:axpb`: built-in;
- `package:PATH` or just `PATH` of a folder with a task.yaml: a task package (kfray/tasks/package.py);
- `suite:NAME/OP`: a task package shipped in kfray/suites/NAME/OP (e.g. `suite:llama32-1b/rmsnorm`);
- `kernelbench:FILE.py` or a path to such a file: a KernelBench problem;
- `rkb:DIR` or a path to a folder with func_forward.py: a robust-kbench task; `rkb:DIR#backward` its backward.

A suffix `@SET` picks one of the task's named shape sets instead of its default shapes, e.g.
`axpb@gpu` (sizes that fill a GPU); for a robust-kbench task it picks the suite's configuration mode
(`rkb:DIR#backward@multi`; single, its default, multi, multi_input, multi_init).
`discover(path)` lists what a folder holds, with load errors.
"""
from __future__ import annotations

import dataclasses
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

from kfray.errors import KfrayError, TaskError
from kfray.tasks.base import Scalar, Seed, Task, Tensor
from kfray.tasks.builtin import BUILTIN

__all__ = ["Task", "Tensor", "Scalar", "Seed", "load_task", "builtin_names", "discover", "suite_names",
           "suite_root"]

KINDS = ("builtin", "package", "suite", "kernelbench", "rkb")


def builtin_names() -> list[str]:
    return sorted(BUILTIN)


def suite_root() -> Path:
    return Path(str(resources.files("kfray") / "suites"))


def suite_names() -> list[str]:
    root = suite_root()
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))) \
        if root.is_dir() else []


def _split_set(ref: str) -> tuple[str, str]:
    base, at, shape_set = ref.rpartition("@")
    if not at or "/" in shape_set or os.sep in shape_set or not base:
        return ref, ""
    return base, shape_set


TASK_CACHE = 1024      # loaded tasks kept per process: a whole sweep (KernelBench's 250 and robust-kbench)


def load_task(ref: str) -> Task:
    """The task a ref names. Loads are kept per process, keyed on the ref and its file's size and
    modification time, so a sweep loads (and traces) each problem once per evaluator, and a file
    edited since is loaded again."""
    return _load_task(ref, _stamp(ref))


load_task.cache_clear = lambda: _load_task.cache_clear()      # type: ignore[attr-defined]


def _stamp(ref: str) -> tuple:
    base, _ = _split_set(ref)
    rest = base.partition(":")[2] if base.partition(":")[0] in KINDS + ("kb", "robust-kbench") else base
    path = rest.split("#", 1)[0]
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return ()
    return (st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=TASK_CACHE)
def _load_task(ref: str, stamp: tuple) -> Task:
    base, shape_set = _split_set(ref)
    kind, rest = _kind(base)
    if kind == "rkb":          # the suffix is robust-kbench's mode: it decides which configs exist at all
        task = _load_rkb(ref, rest, shape_set or "single")
        return dataclasses.replace(task, ref=ref)
    task = _load(base)
    if shape_set:
        if shape_set not in task.shape_sets:
            raise TaskError(f"task {base!r} has no shape set {shape_set!r} "
                            f"(it has: {', '.join(task.shape_sets) or 'none'})")
        task = dataclasses.replace(task, shapes=task.shape_sets[shape_set])
    return dataclasses.replace(task, ref=ref, name=ref if kind == "builtin" else task.name)


def _kind(ref: str) -> tuple[str, str]:
    """(loader kind, rest) of a ref; a bare existing path is recognised by what it holds."""
    head, colon, rest = ref.partition(":")
    if colon and head in KINDS:
        return head, rest
    if colon and head in ("kb", "robust-kbench"):
        return ("kernelbench" if head == "kb" else "rkb"), rest
    p = Path(ref)
    if p.is_dir() or p.is_file():
        if p.is_file():
            return ("package" if p.name in ("task.yaml", "task.yml") else "kernelbench"), ref
        if (p / "task.yaml").is_file() or (p / "task.yml").is_file():
            return "package", ref
        if (p / "func_forward.py").is_file():
            return "rkb", ref
        return "dir", ref
    if colon:
        return head, rest
    return "builtin", ref


def _load(ref: str) -> Task:
    kind, rest = _kind(ref)
    if kind == "builtin":
        if rest not in BUILTIN:
            hint = f"; or a path to a task folder or file ({rest} does not exist)" if ("/" in rest or
                                                                                      os.sep in rest) else ""
            raise TaskError(f"no built-in task named {rest!r}; built-in tasks are: {', '.join(builtin_names())}{hint}")
        return BUILTIN[rest]()
    if kind in ("package", "suite"):
        from kfray.tasks.package import load_package

        path = suite_root() / rest if kind == "suite" else Path(rest)
        if kind == "suite" and not path.is_dir():
            raise TaskError(f"no suite task {rest!r} (suites: {', '.join(suite_names()) or 'none'}; "
                            f"`kfray tasks SUITE` lists a suite's tasks)")
        return load_package(path)
    if kind == "kernelbench":
        from kfray.tasks.kernelbench import load_kernelbench

        return load_kernelbench(rest)
    if kind == "rkb":
        return _load_rkb(ref, rest, "single")
    if kind == "dir":
        raise TaskError(f"{rest}: a folder, but not a task (no task.yaml, no func_forward.py); "
                        f"`kfray tasks {rest}` lists the tasks inside it")
    raise TaskError(f"task reference {ref!r}: unknown loader {kind!r} (known: {', '.join(KINDS)})")


def _load_rkb(ref: str, rest: str, mode: str) -> Task:
    from kfray.tasks.robust_kbench import load_rkb
    from kfray.tasks.suite_spec import RKB_MODES

    path, _, variant = rest.partition("#")
    if variant not in ("", "forward", "backward"):
        raise TaskError(f"task reference {ref!r}: unknown variant #{variant} (known: #forward, #backward; "
                        f"a mode goes last, as in rkb:DIR#backward@multi)")
    if mode not in RKB_MODES:
        raise TaskError(f"task reference {ref!r}: unknown robust-kbench mode @{mode} "
                        f"(known: {', '.join('@' + m for m in RKB_MODES)})")
    return load_rkb(path, backward=variant == "backward", mode=mode)


# --- listing ---------------------------------------------------------------------------------------
def _refs_in(p: Path, depth: int, rkb_mode: str = "") -> list[str]:
    from kfray.tasks.kernelbench import is_problem_file
    from kfray.tasks.package import is_package
    from kfray.tasks.robust_kbench import is_rkb_dir

    if p.is_file():
        if p.name in ("task.yaml", "task.yml"):
            return [f"package:{p.parent}"]
        return [f"kernelbench:{p}"] if p.suffix == ".py" else []
    if is_package(p):
        return [f"package:{p}"]
    if is_rkb_dir(p):
        out = [f"rkb:{p}"]
        if (p / "func_backward.py").is_file() or (p / "config_backward.json").is_file():
            out.append(f"rkb:{p}#backward")
        return [f"{r}@{rkb_mode}" for r in out] if rkb_mode and rkb_mode != "single" else out
    out: list[str] = []
    try:
        children = sorted(p.iterdir(), key=lambda c: (_natural(c.name)))
    except OSError:
        return out
    pys = [c for c in children if c.is_file() and c.suffix == ".py" and not c.name.startswith("_")]
    if any(is_problem_file(c) for c in pys):      # a KernelBench level folder: list every file, loadable or not
        out += [f"kernelbench:{c}" for c in pys]
    if depth > 0:
        for c in children:
            if c.is_dir() and not c.name.startswith((".", "_")) and c.name != "node_modules":
                out += _refs_in(c, depth - 1, rkb_mode)
    return out


def _natural(name: str):
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def resolve(spec: str | None, level: int | None = None, rkb_mode: str = "") -> list[str]:
    """Task refs for a suite name, a folder (package, robust-kbench tasks, KernelBench levels), a
    file, or None (the built-ins). `level` picks KernelBench's levelN folder under `spec`;
    `rkb_mode` the configuration mode of the robust-kbench tasks found (default: single)."""
    if spec is None:
        return [f"builtin:{n}" for n in builtin_names()]
    p = Path(spec)
    if not p.exists() and spec in suite_names():
        root = suite_root() / spec
        return [f"suite:{spec}/{c.name}" for c in sorted(root.iterdir(), key=lambda c: _natural(c.name))
                if (c / "task.yaml").is_file()]
    head, colon, rest = spec.partition(":")
    if colon and head in ("rkb", "kernelbench", "kb", "robust-kbench") and Path(rest).is_dir() and \
            not (Path(rest) / "func_forward.py").is_file():
        return resolve(rest, level, rkb_mode)     # `rkb:tasks/`: every task of a suite's folder
    if not p.exists():
        if spec.partition(":")[0] in KINDS or spec in BUILTIN:
            return [spec]
        raise TaskError(f"{spec}: no such folder, file or suite (suites: {', '.join(suite_names()) or 'none'})")
    p = p.resolve()
    if level is not None:
        for cand in (p / f"level{level}", p / "KernelBench" / f"level{level}"):
            if cand.is_dir():
                p = cand
                break
        else:
            if p.name != f"level{level}":
                raise TaskError(f"{spec}: no level{level} folder in it (nor in {spec}/KernelBench)")
    return _refs_in(p, depth=3, rkb_mode=rkb_mode)


def try_load(ref: str):
    """(the task, None) when `ref` loads, (None, why not) when it does not."""
    try:
        return load_task(ref), None
    except KfrayError as e:
        return None, str(e)
    except Exception as e:     # a user's file that breaks in a way we did not foresee
        return None, f"{type(e).__name__}: {e}"


def discover(path: str | None = None, level: int | None = None,
             rkb_mode: str = "") -> list[tuple[str, str | None]]:
    """Every task a folder (or suite name, or None: the built-ins) holds, as (ref, None) when it
    loads and (ref, why not) when it does not."""
    return [(ref, try_load(ref)[1]) for ref in resolve(path, level, rkb_mode)]
