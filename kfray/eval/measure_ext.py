"""Correctness and timing of a PyTorch-extension kernel (language `torch_ext`), in the sandbox worker.

Calling form: the extension's `forward` gets torch tensors on the backend's device, and
- by default (KernelBench's nn.Module problems): Model.forward's inputs in order (non-tensor inputs
  as Python numbers, in their places), then every parameter and buffer of the model, in
  `named_parameters()` then `named_buffers()` order: the task's kernel arguments
  (TorchTask.input_args, then param_args) without the outputs and sizes;
- when Model.forward takes an `fn` argument (robust-kbench's functional problems,
  `def forward(self, x, fn=forward_fn): return fn(x, self.weight, self.slope)`): exactly what
  Model.forward hands to `fn`, settings such as a slope included, the extension standing in for
  forward_fn, which is how robust-kbench runs its own kernels.
It returns the output tensor, or a tuple of them in the task's output order.

The rules of kfray.eval.measure, for a kernel that allocates its own outputs (so nothing to poison):
- every shape config, fresh inputs, two calls on different inputs before any reference runs; each
  output must have the task's shape, dtype and device, share no memory with an input (a view or an
  in-place result) nor with the other call's output (a cached or reused tensor), must not change
  after forward returned (work left running), and both calls must match their own reference, the
  first one checked after the second call; inputs and parameters must come back unchanged;
- timing: medians over input sets rotated so a cache cannot hold them (backend.time_call: perf_counter
  on the CPU, CUDA events on the GPU), against eager PyTorch on the same device, timed as
  KernelBench does (`module(*inputs)`, each set's parameters swapped in outside the timer); every
  set's last output is checked after the timing, and a fresh check of every shape follows it.
"""
from __future__ import annotations

import copy
import inspect
import os
import time
from typing import Any, Callable

import numpy as np

from kfray.candidate import TIER_CORRECT, TIER_RUNTIME_ERROR, TIER_WRONG_SHAPE, TIER_WRONG_VALUES
from kfray.eval.measure import (_REF_TIMES, LATE_WRITE_WAIT_S, _fail, _input_changed, _rotation, compare,
                                Timings, correct_result, time_fn)


def positional(task, tensors: dict) -> list:
    """Model.forward's positional inputs: the set's tensors, with fixed non-tensor values in their places."""
    it = iter(task.input_args)
    n = len(task.input_args) + len(task.fixed_inputs)
    return [task.fixed_inputs[i] if i in task.fixed_inputs else tensors[next(it)] for i in range(n)]


def _takes_fn(module) -> bool:
    try:
        return "fn" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


def bind(task, fwd: Callable, tensors: dict, shape: str, device: str) -> Callable[[], Any]:
    """A call of the extension on one input set, in the calling form above."""
    from torch.func import functional_call

    pos = positional(task, tensors)
    module = task._template(shape, device)
    if not _takes_fn(module):
        params = [tensors[a] for a in task.param_args]
        return lambda: fwd(*pos, *params)
    pmap = {p: tensors[a] for a, p in task.param_args.items()}
    seen, marker = [], object()

    def record(*args, **kwargs):
        seen.append((args, kwargs))
        return marker

    try:   # what Model.forward hands to fn, once: timed calls then skip the module
        out = functional_call(module, pmap, tuple(pos), {"fn": record}, strict=False)
    except Exception:
        out = None
    if out is marker and len(seen) == 1:
        args, kwargs = seen[0]
        return lambda: fwd(*args, **kwargs)
    return lambda: functional_call(module, pmap, tuple(pos), {"fn": fwd}, strict=False)


def _form(task, res, shape: str, device: str) -> tuple[list | None, str]:
    """(output tensors, '') when `res` has the task's outputs' number, shapes, dtypes and device."""
    import torch

    outs = [res] if isinstance(res, torch.Tensor) else list(res) if isinstance(res, (tuple, list)) else None
    if outs is None or not all(isinstance(t, torch.Tensor) for t in outs):
        return None, f"forward returned {type(res).__name__}, not a tensor or a tuple of tensors"
    if len(outs) != len(task.outputs):
        return None, (f"forward returned {len(outs)} tensors; the task has {len(task.outputs)} outputs "
                      f"({', '.join(o.name for o in task.outputs)})")
    for o, t in zip(task.outputs, outs):
        want = o.dims(task.shapes[shape])
        dtype = str(t.dtype).replace("torch.", "")
        if tuple(t.shape) != want:
            return None, f"output {o.name} has shape {tuple(t.shape)}, expected {want}"
        if dtype != o.dtype:
            return None, f"output {o.name} has dtype {dtype}, expected {o.dtype}"
        if t.device.type != device:
            return None, f"output {o.name} is on {t.device}, expected {device}"
    return outs, ""


def _span(t) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _shared(task, outs: list[list], sets: list[dict]) -> str | None:
    """Why an output is not a tensor of its own (it views an input, or the other call's output)."""
    import torch

    for got, tensors in zip(outs, sets):
        for o, t in zip(task.outputs, got):
            for k, v in tensors.items():
                if isinstance(v, torch.Tensor) and _overlap(_span(t), _span(v)):
                    return (f"output {o.name} shares memory with input {k} (a view of it, or written in place); "
                            "forward must return a new tensor")
    for o, a in zip(task.outputs, outs[0]):
        if any(_overlap(_span(a), _span(b)) for b in outs[1]):
            return (f"output {o.name}: forward returned the same memory on two calls with different inputs "
                    "(a cached or reused tensor); allocate every output on every call")
    return None


def check_pair(backend, fwd: Callable, task, shape: str, rng) -> tuple[int, str, dict]:
    """Two calls on fresh, different inputs, then their checks; (tier, reason, extra result keys)."""
    hosts = [backend.make_args(task, shape, rng) for _ in range(2)]
    sets = [backend.to_device(h) for h in hosts]
    results, call_s = [], 0.0
    for s in sets:
        call = bind(task, fwd, s, shape, backend.device)
        t0 = time.perf_counter()
        results.append(call())
        backend.synchronize()
        call_s = max(call_s, time.perf_counter() - t0)
    outs = []
    for res in results:
        got, why = _form(task, res, shape, backend.device)
        if why:
            return TIER_WRONG_SHAPE, f"shape {shape}: {why}", {}
        outs.append(got)
    why = _shared(task, outs, sets)
    if why:
        return TIER_WRONG_VALUES, f"shape {shape}: {why}", {}
    snaps = [[backend.to_host(t).copy() for t in got] for got in outs]
    time.sleep(min(LATE_WRITE_WAIT_S[1], max(LATE_WRITE_WAIT_S[0], 2 * call_s)))
    backend.synchronize()
    for got, snap in zip(outs, snaps):
        for o, t, s in zip(task.outputs, got, snap):
            if not np.array_equal(backend.to_host(t), s, equal_nan=True):
                return (TIER_RUNTIME_ERROR, f"shape {shape}: output {o.name} changed after forward returned: work "
                        "was still running (another thread or stream); finish all work before returning",
                        {"recycle": True})
    # The reference runs now, after both calls: its outputs never exist while the kernel runs.
    for j, (h, s, snap) in enumerate(zip(hosts, sets, snaps)):
        expected = backend.reference(task, backend.to_device(h))
        for o, got in zip(task.outputs, snap):
            why = compare(o.name, got, expected[o.name], task.rtol, task.atol)
            if why:
                return TIER_WRONG_VALUES, f"shape {shape} (call {j + 1} of 2, fresh inputs): {why}", {}
        for inp in task.inputs:
            why = _input_changed(backend, inp.name, backend.to_host(s[inp.name]), h[inp.name])
            if why:
                return TIER_WRONG_VALUES, f"shape {shape}: {why}", {}
    return TIER_CORRECT, "", {}


def _reference_timer(task, shape: str, device: str, sets: list[dict]):
    """(before, call) for time_fn: eager PyTorch as KernelBench times it, module(*inputs), on a copy
    of the task's module whose parameters are set i's (swapped in by `before`, outside the timer)."""
    import torch

    if task.problem.forward is not None:
        return None, lambda i: task.device_reference(sets[i], device)
    module = copy.deepcopy(task._template(shape, device))
    pos = [positional(task, s) for s in sets]

    def install(i: int) -> None:
        for arg, pname in task.param_args.items():
            owner, _, leaf = pname.rpartition(".")
            m = module.get_submodule(owner) if owner else module
            t = sets[i][arg]
            is_param = isinstance(getattr(m, leaf), torch.nn.Parameter)
            setattr(m, leaf, torch.nn.Parameter(t, requires_grad=False) if is_param else t)

    return install, lambda i: module(*pos[i])


def _verify_sets(backend, task, shape: str, hosts: list, sets: list, last: list) -> tuple[int, str] | None:
    """After timing: each set's last output against its reference, and its inputs unchanged."""
    for i, (h, s, res) in enumerate(zip(hosts, sets, last)):
        if res is None:                   # few slow repeats: this set was never run
            continue
        got, why = _form(task, res, shape, backend.device)
        if why:
            return TIER_WRONG_SHAPE, f"shape {shape}, timed runs: {why}"
        for inp in task.inputs:
            why = _input_changed(backend, inp.name, backend.to_host(s[inp.name]), h[inp.name])
            if why:
                return TIER_WRONG_VALUES, f"shape {shape}, timed runs: {why}"
        expected = backend.reference(task, backend.to_device(h))
        for o, t in zip(task.outputs, got):
            why = compare(o.name, backend.to_host(t), expected[o.name], task.rtol, task.atol)
            if why:
                return TIER_WRONG_VALUES, (f"shape {shape}, after the timed runs (input set {i}): {why}; forward "
                                           "must compute its outputs on every call")
    return None


def _time_shape(backend, fwd: Callable, task, shape: str, n_sets: int, rng, job: dict):
    """(times, None) of the extension on rotated input sets, the reference timed once per worker
    into _REF_TIMES; (times, (tier, reason)) when the timed runs' outputs are wrong."""
    hosts = [backend.make_args(task, shape, rng) for _ in range(n_sets)]
    sets = [backend.to_device(h) for h in hosts]
    calls = [bind(task, fwd, s, shape, backend.device) for s in sets]
    last: list = [None] * n_sets

    def call(i: int) -> None:
        last[i] = calls[i]()

    ts = time_fn(backend, call, n_sets, job["warmup"], job["repeats"], job["max_repeats"], job["min_time"])
    backend.synchronize()
    bad = _verify_sets(backend, task, shape, hosts, sets, last)
    key = (task.ref, shape, backend.name)
    if not bad and key not in _REF_TIMES:
        before, ref_call = _reference_timer(task, shape, backend.device, sets)
        rts = time_fn(backend, ref_call, n_sets, 1, job["repeats"], max(job["repeats"], job["max_repeats"] // 2),
                      job["min_time"], before=before)
        _REF_TIMES[key] = float(np.median(rts))
    return ts, bad


def run_ext_job(backend, fwd: Callable, task, job: dict) -> dict:
    """Correctness on fresh inputs, timing of extension and reference, checks of the timed runs."""
    import torch

    if not hasattr(task, "device_reference"):
        return _fail(TIER_RUNTIME_ERROR, f"task {task.name} has no PyTorch reference: torch_ext kernels need "
                     "a KernelBench or robust-kbench task", {})
    with torch.no_grad():
        return _run(backend, fwd, task, job)


def _run(backend, fwd: Callable, task, job: dict) -> dict:
    stages: dict[str, float] = {}
    rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))  # unpredictable inputs
    pairs = max(1, (job["trials"] + 1) // 2)
    t0 = time.perf_counter()
    for shape in task.shapes:
        for _ in range(pairs):
            tier, why, extra = check_pair(backend, fwd, task, shape, rng)
            if tier != TIER_CORRECT:
                stages["correctness"] = time.perf_counter() - t0
                return _fail(tier, why, stages, **extra)
    stages["correctness"] = time.perf_counter() - t0
    sticky = backend.check_sticky_error()
    if sticky:
        return {**_fail(TIER_RUNTIME_ERROR, sticky, stages), "recycle": True}

    t0 = time.perf_counter()
    timings = Timings()
    for shape in task.shapes:
        n_sets = _rotation(task, shape, job.get("cache_bytes", 32 << 20))
        ts, bad = _time_shape(backend, fwd, task, shape, n_sets, rng, job)
        if bad:
            return _fail(*bad, stages)
        timings.add(task, shape, ts, n_sets, _REF_TIMES[(task.ref, shape, backend.name)])
    stages["timing"] = time.perf_counter() - t0
    sticky = backend.check_sticky_error()
    if sticky:
        return {**_fail(TIER_RUNTIME_ERROR, sticky, stages), "recycle": True}

    t0 = time.perf_counter()    # fresh inputs once more: a kernel that counts calls or keeps results
    for shape in task.shapes:
        tier, why, extra = check_pair(backend, fwd, task, shape, rng)
        if tier != TIER_CORRECT:
            stages["recheck"] = time.perf_counter() - t0
            return _fail(tier, f"after the timed runs, a check on fresh inputs failed: {why}", stages, **extra)
    stages["recheck"] = time.perf_counter() - t0

    return correct_result(backend, task, job, timings, stages, {"form": "torch_ext"})
