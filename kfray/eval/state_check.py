"""What a judge that ran a candidate in its own process checks before it judges the next one.

Backends that cannot run a candidate apart yet (kfray.eval.defences: the `in_judge` path) load it
in the judge. Restarting that judge after every candidate would cost a CUDA context each time, so
the judge takes a fingerprint of what a candidate could change before the candidate loads and
compares it after: the clocks and every public function of time, os, numpy, cupy and torch (by
identity), torch's global flags, the environment, the modules loaded and the threads running.
Any difference recycles the judge, and the result says what changed. A candidate that replaced a
function or module or flipped a torch flag had its hands on the judge's own clocks and reference
while it was judged: its verdict is void (`tampered`).
"""
from __future__ import annotations

import os
import sys
import threading

_MODULES = ("time", "os", "math", "numpy", "cupy", "torch", "torch.nn.functional", "torch.cuda", "ctypes")


def _functions(mod) -> dict[str, int]:
    out = {}
    for name in dir(mod):
        if name.startswith("__"):
            continue
        try:
            v = getattr(mod, name)
        except Exception:
            continue
        if callable(v):
            out[name] = id(v)
    return out


def _torch_flags() -> dict[str, object]:
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    b = torch.backends
    flags = {"matmul.allow_tf32": b.cuda.matmul.allow_tf32, "cudnn.allow_tf32": b.cudnn.allow_tf32,
             "cudnn.benchmark": b.cudnn.benchmark, "cudnn.deterministic": b.cudnn.deterministic,
             "fp16_reduced": b.cuda.matmul.allow_fp16_reduced_precision_reduction,
             "float32_matmul_precision": torch.get_float32_matmul_precision(),
             "deterministic": torch.are_deterministic_algorithms_enabled(), "threads": torch.get_num_threads(),
             "grad": torch.is_grad_enabled(), "default_dtype": str(torch.get_default_dtype())}
    flags["tensor"] = sum(id(getattr(torch.Tensor, n, None)) for n in dir(torch.Tensor) if not n.startswith("__"))
    flags["event.elapsed_time"] = id(getattr(getattr(torch.cuda, "Event", None), "elapsed_time", None))
    return flags


def fingerprint() -> dict[str, object]:
    fp: dict[str, object] = {"modules": {k: id(m) for k, m in list(sys.modules.items())},
                             "threads": threading.active_count(),
                             "environ": hash(frozenset(os.environ.items())), "torch": _torch_flags()}
    for name in _MODULES:
        mod = sys.modules.get(name)
        if mod is not None:
            fp[f"fn:{name}"] = _functions(mod)
    return fp


def changes(before: dict, after: dict, own_modules=lambda name: False) -> list[str]:
    """What differs between two fingerprints. Modules imported for the first time are not a change
    (the harness imports lazily, and a name nothing imports reaches no one); a module removed or
    replaced by another object is, unless `own_modules` says it is the candidate's own."""
    out = []
    mods_before, mods_after = before["modules"], after["modules"]
    moved = sorted(n for n, i in mods_before.items() if mods_after.get(n) != i and not own_modules(n))
    if moved:
        out.append(f"modules removed or replaced: {moved[:5]}")
    if after["threads"] > before["threads"]:
        out.append(f"{after['threads'] - before['threads']} thread(s) left running")
    if after["environ"] != before["environ"]:
        out.append("the environment changed")
    for k, v in before["torch"].items():
        if after["torch"].get(k) != v:
            out.append(f"torch {k} changed")
    for k, v in before.items():
        if k.startswith("fn:"):
            now = after.get(k, {})
            moved = [n for n, i in v.items() if now.get(n) != i]
            if moved:
                out.append(f"{k[3:]}.{moved[0]} replaced" + (f" (and {len(moved) - 1} more)" if len(moved) > 1 else ""))
    return out


def tampered(changed: list[str]) -> list[str]:
    """The changes that void the verdict of the candidate that made them (threads and environment
    only recycle the judge: runtimes start threads of their own on first use)."""
    return [c for c in changed if "replaced" in c or c.startswith(("torch ", "modules removed"))]
