"""Tasks whose reference is a PyTorch module: the functional form shared by the KernelBench and
robust-kbench loaders.

A module `Model(...)` with inputs `get_inputs(...)` becomes a Task whose arguments are, in order:
the forward inputs, the model's parameters and buffers (explicit tensors: a kernel gets them as
pointers, the reference loads them into the module with `torch.func.functional_call`), the
output(s) (`out`, or `out0, out1, ...`), then int64/float scalars for every size and setting of the
shape config (`batch_size`, `dim`, ...), so that one kernel serves every configuration.

Fresh inputs come from the problem's own `get_inputs` and a fresh `Model(...)` under a seed drawn
from the harness's generator, so their distributions are the problem's (uniform for log, integer
targets for losses, BatchNorm running variances of one...).

The pieces live in torch_problem (Problem, shared helpers), torch_trace (shapes of one
configuration), torch_task (TorchTask: inputs and reference) and torch_layout (build_torch_task);
this module is the one loaders and the evaluator import them from.
"""
from __future__ import annotations

from kfray.tasks.torch_layout import build_torch_task
from kfray.tasks.torch_problem import (PIP_NAMES, Problem, c_ident, kf_forward_error, missing_package,
                                       module_constants, need_torch, outputs_of, tensor_bytes, torch_dtype_name)
from kfray.tasks.torch_task import CONFIG_KEY, TorchTask
from kfray.tasks.torch_trace import REAL_BUILD_LIMIT, REAL_TRACE_LIMIT, build_real, trace

__all__ = ["CONFIG_KEY", "PIP_NAMES", "REAL_BUILD_LIMIT", "REAL_TRACE_LIMIT", "Problem", "TorchTask",
           "build_real", "build_torch_task", "c_ident", "kf_forward_error", "missing_package", "module_constants",
           "need_torch", "outputs_of", "tensor_bytes", "torch_dtype_name", "trace"]
