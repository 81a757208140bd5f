"""GPU references: the expected outputs computed on the device the candidate runs on.

CuPy for the built-in tasks (matmul goes to cuBLAS), eager PyTorch for tasks that bring a
device reference. Inputs are CuPy arrays or scalars. CuPy and PyTorch are imported lazily.
"""
from __future__ import annotations

from typing import Any, Callable

from kfray.tasks.base import NP_TYPES


def _axpb_gpu(a):
    return {"y": a["a"] * a["x"] + a["b"]}


def _softmax_gpu(a):
    import cupy as cp

    x = a["x"]
    e = cp.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


def _matmul_gpu(a):
    import cupy as cp

    return {"C": cp.matmul(a["A"], a["B"])}


GPU_REFERENCES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "axpb": _axpb_gpu, "softmax": _softmax_gpu, "matmul": _matmul_gpu,
}


def gpu_reference_for(task) -> Callable | None:
    """The CuPy reference of a built-in task ('axpb', 'builtin:axpb', 'axpb@gpu'...), else None."""
    for ref in (task.ref, task.name):
        base = str(ref or "").partition("@")[0]
        kind, _, name = base.partition(":") if ":" in base else ("builtin", "", base)
        if kind == "builtin" and name in GPU_REFERENCES:
            return GPU_REFERENCES[name]
    return None


def torch_cuda_available() -> bool:
    """PyTorch with CUDA is importable here (the torch extra on a GPU node)."""
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def torch_reference(cp, stream, task, args: dict[str, Any]) -> dict[str, Any]:
    """Eager PyTorch on this GPU, on the kernel's own stream, so the baseline is timed on the
    device the candidate runs on (the way KernelBench times it), not on the host."""
    import torch

    outs = {o.name for o in task.outputs}
    dev = {k: v for k, v in args.items() if k not in outs}
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
        res = task.device_reference(dev, device="cuda:0")
    return {o.name: cp.from_dlpack(res[o.name].detach().contiguous()).astype(NP_TYPES[o.dtype], copy=False)
            for o in task.outputs}
