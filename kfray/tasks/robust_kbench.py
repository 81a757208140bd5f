"""robust-kbench tasks: a folder with `func_forward.py` (`forward_fn`, `Model`, `get_inputs(**config)`,
`input_names`) and `config_forward.json` becomes a Task (ref `rkb:DIR`); `rkb:DIR#backward` uses
`func_backward.py` / `config_backward.json` where the folder has them.

Every combination of init x input x shared configuration becomes a shape config, so correctness is
checked on all of them, single and multi settings together (deduplicated), the way robust-kbench's
`multi_init_settings` / `multi_input_settings` runs check them. Shared settings apply last.

Backward: the kernel gets the forward inputs, the parameters and `grad_out` (the gradient flowing
into the forward's output) and writes the gradient of every floating input and parameter
(`grad_<name>`); the reference is `torch.autograd.grad` through `Model.forward`.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

from kfray.errors import TaskError
from kfray.tasks.package import import_file
from kfray.tasks.torch_ref import Problem, build_torch_task, need_torch

RTOL = ATOL = 1e-3
KINDS = ("input", "init", "shared")


def is_rkb_dir(path: Path) -> bool:
    return path.is_dir() and (path / "func_forward.py").is_file()


def config_combinations(configs: dict, where: str) -> dict[str, tuple[dict, dict]]:
    """name -> (init settings, input settings) for every distinct combination of the configs."""
    lists = {}
    for kind in KINDS:
        seen, items = set(), []
        for mode in ("single", "multi"):
            val = configs.get(f"{mode}_{kind}_configs")
            if val is None:
                continue
            if not isinstance(val, list) or not all(isinstance(v, dict) for v in val):
                raise TaskError(f"{where}: {mode}_{kind}_configs must be a list of objects")
            for v in val:
                key = json.dumps(v, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    items.append(v)
        lists[kind] = items or [{}]
    if not any(configs.get(f"{m}_{k}_configs") for m in ("single", "multi") for k in KINDS):
        raise TaskError(f"{where}: has none of single/multi_input/init/shared_configs")
    out = {}
    for init, inp, shared in itertools.product(lists["init"], lists["input"], lists["shared"]):
        init_c, input_c = {**init, **shared}, {**inp, **shared}
        merged = {**init_c, **input_c}
        name = "_".join(f"{k}{v}" for k, v in merged.items()) or "default"
        name = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in name)[:80]
        base, i = name, 2
        while name in out:
            name, i = f"{base}_{i}", i + 1
        out[name] = (init_c, input_c)
    return out


def load_rkb(path: str | Path, backward: bool = False):
    root = Path(path)
    direction = "backward" if backward else "forward"
    func = root / f"func_{direction}.py"
    cfg_file = root / f"config_{direction}.json"
    if not func.is_file() and backward:
        func = root / "func_forward.py"      # the backward of the forward function
    if not func.is_file():
        raise TaskError(f"{root}: not a robust-kbench task (no {func.name})")
    if not cfg_file.is_file():
        raise TaskError(f"{root}: robust-kbench task without {cfg_file.name}")
    need_torch(str(func))
    try:
        configs = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise TaskError(f"{cfg_file}: not valid JSON: {e}") from None
    if not isinstance(configs, dict):
        raise TaskError(f"{cfg_file}: must be a JSON object")
    combos = config_combinations(configs, str(cfg_file))
    mod = import_file(func, "robust-kbench task")
    for attr in ("Model", "get_inputs"):
        if not hasattr(mod, attr):
            raise TaskError(f"{func}: not a robust-kbench task: it defines no {attr}")
    names = list(getattr(mod, "input_names", []) or [])
    Model, get_inputs = mod.Model, mod.get_inputs
    settings = {name: {**init_c, **input_c} for name, (init_c, input_c) in combos.items()}
    init_of = {json.dumps(settings[n], sort_keys=True, default=str): combos[n][0] for n in combos}
    input_of = {json.dumps(settings[n], sort_keys=True, default=str): combos[n][1] for n in combos}
    key = lambda cfg: json.dumps(cfg, sort_keys=True, default=str)
    size_names = {n: list(combos[n][1]) + [k for k in combos[n][0] if k not in combos[n][1]] for n in combos}

    problem = Problem(
        where=str(func),
        make_model=lambda cfg: Model(**init_of[key(cfg)]),
        make_inputs=lambda cfg: list(get_inputs(**input_of[key(cfg)])),
        input_names=names, configs=settings, size_names=size_names,
        source_text=func.read_text(), title=root.name)
    note = (f"Correctness is checked on all {len(combos)} configuration combinations "
            f"(init x input x shared settings of {cfg_file.name}).")
    desc = (f"robust-kbench task {root.name} ({direction}): compute exactly what "
            + ("Model.forward computes" if not backward else
               "the backward pass of Model.forward computes: the gradients of the forward inputs and "
               "parameters given grad_out, the gradient flowing into the output")
            + ", as one or more kernels.")
    if backward:
        return _backward_task(problem, root, desc, note)
    return build_torch_task(problem, root.name, desc, RTOL, ATOL, note)


def _backward_task(problem: Problem, root: Path, desc: str, note: str):
    """The backward as a functional problem: inputs + params + grad_out -> gradients."""
    torch = need_torch(problem.where)
    base_model, base_inputs = problem.make_model, problem.make_inputs

    class Backward(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            *xs, grad_out = args
            from torch.func import functional_call

            params = {k: v.detach().requires_grad_(v.is_floating_point())
                      for k, v in list(self.inner.named_parameters()) + list(self.inner.named_buffers())}
            xs = [x.detach().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x
                  for x in xs]
            with torch.enable_grad():
                out = functional_call(self.inner, params, tuple(xs), strict=False)
                wrt = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad] + \
                    [p for p in params.values() if p.requires_grad]
                if out.device.type == "meta":
                    return tuple(torch.empty_like(w) for w in wrt)
                grads = torch.autograd.grad(out, wrt, grad_out, allow_unused=True)
            return tuple(torch.zeros_like(w) if g is None else g for w, g in zip(wrt, grads))

    def make_model(cfg):
        return Backward(base_model(cfg))

    def make_inputs(cfg):
        xs = base_inputs(cfg)
        with torch.no_grad():
            out = base_model(cfg)(*xs)
        return list(xs) + [torch.randn_like(out)]

    first = next(iter(problem.configs.values()))
    with torch.device("meta"):
        m, xs = base_model(first), base_inputs(first)
    names = list(problem.input_names)
    wrt = [f"grad_{names[i] if i < len(names) else f'input{i}'}" for i, x in enumerate(xs)
           if isinstance(x, torch.Tensor) and x.is_floating_point()]
    seen = set()
    for k, v in list(m.named_parameters()) + list(m.named_buffers()):
        if k not in seen and v.is_floating_point():
            wrt.append("grad_" + k)
        seen.add(k)
    bw = Problem(where=problem.where, make_model=make_model, make_inputs=make_inputs,
                 input_names=names + ["grad_out"], configs=problem.configs,
                 size_names=problem.size_names, source_text=problem.source_text, title=problem.title,
                 output_names=wrt, param_prefix="inner.")
    desc += (" The outputs grad_* are the gradients of the floating-point inputs and parameters "
             "(the sum over the batch for parameters, as autograd gives them).")
    return build_torch_task(bw, root.name + "_backward", desc, RTOL, ATOL, note)
