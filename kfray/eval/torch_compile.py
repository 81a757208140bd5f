"""The torch.compile baseline: the reference of a PyTorch task compiled with `torch.compile` and
timed like the eager one, so a sweep can report speedups over both (KernelBench's two baselines).

Runs in the sandbox worker (`eval.torch_compile: true`); each task, shape config and device is
compiled and timed once per worker. Failing is an answer, never a crash: a task whose reference is
not PyTorch, a missing inductor or C++ compiler, a compile error or a compiled result that
disagrees with eager PyTorch gives no time and a one-line reason, and the table says "n/a".
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from kfray.eval.closeness import compare

_TIMES: dict[tuple, tuple[float | None, str]] = {}   # (task ref, shape, device) -> (seconds, why not)


def compiled_reference_time(backend, task, shape: str, hosts: list[dict], job: dict) -> tuple[float | None, str]:
    """(median seconds of the compiled reference on `hosts`, "") or (None, why there is none)."""
    device = "cuda" if getattr(backend, "name", "") == "cuda" else "cpu"
    key = (task.ref, shape, device)
    if key not in _TIMES:
        try:
            _TIMES[key] = _measure(task, shape, hosts, device, job)
        except Exception as e:   # inductor, the C++ compiler, dynamo: any failure is a reason
            msg = str(e).strip().splitlines()
            _TIMES[key] = (None, f"torch.compile failed: {type(e).__name__}: {msg[0][:200] if msg else ''}")
    return _TIMES[key]


def _measure(task, shape: str, hosts: list[dict], device: str, job: dict) -> tuple[float | None, str]:
    if not hasattr(task, "param_args") or getattr(task, "problem", None) is None:
        return None, "the reference is not PyTorch"
    import torch
    from torch.func import functional_call

    problem = task.problem
    torch.manual_seed(0)
    with torch.no_grad():
        module = problem.make_model(task.configs[shape]).to(device).eval()

    def run(params: dict, pos: tuple):
        if problem.forward is None:
            return functional_call(module, params, pos, tie_weights=True, strict=False)
        return problem.forward(module, params, list(pos))

    torch._dynamo.reset()     # one compile per measurement: `run` shares its code object across tasks
    fn = torch.compile(run, dynamic=False)

    def tensors(h: dict) -> tuple[dict, tuple]:
        t = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in h.items() if isinstance(v, np.ndarray)}
        params = {pname: t[arg] for arg, pname in task.param_args.items()}
        it = iter(task.input_args)
        n_pos = len(task.input_args) + len(task.fixed_inputs)
        return params, tuple(task.fixed_inputs[i] if i in task.fixed_inputs else t[next(it)] for i in range(n_pos))

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    sets = [tensors(h) for h in hosts]
    with torch.no_grad():
        first = fn(*sets[0])        # compiles
        sync()
        got = first if isinstance(first, (tuple, list)) else [first]
        want = task.run_reference(hosts[0])
        for o, g in zip(task.outputs, got):
            bad = compare(o.name, g.detach().cpu().numpy(), want[o.name], task.rtol, task.atol)
            if bad:
                return None, f"the compiled reference disagrees with eager PyTorch: {bad[:200]}"
        for s in sets[1:]:          # warm every input set once
            fn(*s)
        sync()
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < job.get("max_repeats", 50) and (
                len(times) < job.get("repeats", 5) or time.perf_counter() - start < job.get("min_time", 0.02)):
            s = sets[len(times) % len(sets)]
            t0 = time.perf_counter()
            fn(*s)
            sync()
            times.append(time.perf_counter() - t0)
    return float(np.median(times)), ""


def compile_facts(per_shape: dict[str, tuple[float | None, str]]) -> dict[str, Any]:
    """What a result carries: `times` for the shapes that have one, `why_not` for those that do not."""
    out: dict[str, Any] = {"times": {s: t for s, (t, _) in per_shape.items() if t is not None}}
    reasons = sorted({why for t, why in per_shape.values() if t is None})
    if reasons:
        out["why_not"] = "; ".join(reasons)
    return out


def speedup_vs_compile(result) -> tuple[float | None, str]:
    """Geometric-mean speedup of a correct result over the compiled reference, or (None, why not).

    `result`: an EvalResult (or its dict). None when any shape config lacks a compiled time."""
    import math

    d = result if isinstance(result, dict) else result.to_dict()
    tc = (d.get("facts") or {}).get("torch_compile")
    if not tc:
        return None, ""
    comp, times = tc.get("times") or {}, d.get("times") or {}
    if tc.get("why_not") or not times or any(s not in comp for s in times):
        return None, tc.get("why_not") or "no compiled time for every shape config"
    if (d.get("facts") or {}).get("untrusted") or any(t <= 0 for t in times.values()):
        return 0.0, ""
    return math.exp(sum(math.log(comp[s] / t) for s, t in times.items()) / len(times)), ""
