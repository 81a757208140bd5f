"""robust-kbench tasks: a folder with `func_forward.py` (`forward_fn`, `Model`, `get_inputs(**config)`,
`input_names`) and `config_forward.json` becomes a Task (ref `rkb:DIR`); `rkb:DIR#backward` uses
`func_backward.py` / `config_backward.json` where the folder has them.

The configurations are those robust-kbench itself runs (robust_kbench/config_task.py): a ref suffix
picks its mode, `rkb:DIR` = single (its default), `@multi` (multi_input_settings and
multi_init_settings), `@multi_input` or `@multi_init`, e.g. `rkb:DIR#backward@multi`. Each mode reads
its own input / init lists (multi_shared only when both flags are on), every init x input x shared
product is one configuration (shared applied last to both; duplicates removed, suite order kept),
named by the suite's own config string. `task.suite` (a SuiteSpec) carries them all.

The kf_forward layout (one C signature) is built from the configurations that share the first one's
signature; where some cannot (resnet_block: a downsample weight only some configurations have) the
task still loads and `suite.functional_error` says why. Settings that only feed `Model(...)` (e.g.
init_method) may be anything: they shape the parameters, which the kernel gets as tensors.

Backward: the kernel gets the forward inputs, the parameters and `grad_out` (the gradient flowing
into the forward's output) and writes the gradient of every floating input and parameter
(`grad_<name>`); the reference is `torch.autograd.grad` through `Model.forward`.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
from pathlib import Path

from kfray.errors import TaskError
from kfray.tasks import suite_form
from kfray.tasks.package import import_file
from kfray.tasks.suite_spec import RKB, RKB_MODES, RKB_TOLERANCE, RkbConfig, SuiteSpec
from kfray.tasks.torch_ref import Problem, build_torch_task, kf_forward_error, need_torch

RTOL = ATOL = RKB_TOLERANCE
FILTER_FILE = "filter_results.json"
SUITE_BUG = "the suite's own bug"       # words `kfray tasks` groups such failures by


def is_rkb_dir(path: Path) -> bool:
    return path.is_dir() and (path / "func_forward.py").is_file()


def config_string(init_c: dict, input_c: dict) -> str:
    """robust-kbench's name of a configuration (ConfigTask.get_configs), character for character."""
    s = "_".join([f"{k}_{v}" for k, v in init_c.items()] + [f"{k}_{v}" for k, v in input_c.items()])
    return s.replace(" ", "_").replace(".", "_").replace("-", "_").replace("=", "_")


def config_combinations(configs: dict, where: str, mode: str = "single") -> list[RkbConfig]:
    """The configurations robust-kbench runs in `mode`, in its order, duplicates removed."""
    if mode not in RKB_MODES:
        raise TaskError(f"{where}: unknown robust-kbench mode {mode!r} (known: {', '.join(RKB_MODES)})")
    multi_input, multi_init = mode in ("multi", "multi_input"), mode in ("multi", "multi_init")
    keys = {"input": f"{'multi' if multi_input else 'single'}_input_configs",
            "init": f"{'multi' if multi_init else 'single'}_init_configs",
            "shared": f"{'multi' if multi_input and multi_init else 'single'}_shared_configs"}
    lists = {}
    for kind, key in keys.items():
        if key not in configs:
            raise TaskError(f"{where}: mode {mode} needs {key}, which the file lacks")
        val = configs[key]
        if not isinstance(val, list) or not all(isinstance(v, dict) for v in val):
            raise TaskError(f"{where}: {key} must be a list of objects")
        lists[kind] = val
    out, seen = [], set()
    for init, inp, shared in itertools.product(lists["init"], lists["input"], lists["shared"]):
        init_c, input_c = {**init, **shared}, {**inp, **shared}
        key = json.dumps([init_c, input_c], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(RkbConfig(config_string(init_c, input_c), init_c, input_c))
    if not out:
        raise TaskError(f"{where}: mode {mode} has no configurations (an empty {'/'.join(keys.values())} list)")
    return out


def shape_names(configs: list[RkbConfig]) -> list[str]:
    """Shape config names: the suite's config strings ("default" for an empty one), made unique."""
    out: list[str] = []
    for c in configs:
        name, i = c.name or "default", 2
        while name in out:
            name, i = f"{c.name or 'default'}_{i}", i + 1
        out.append(name)
    return out


def flagged(root: Path) -> tuple[str, ...]:
    """The filter_* flags of the suite's filter_results.json that are true (the suite's own verdict
    that the task is degenerate: constant output, inputs without effect...); the LLM's text is ignored."""
    f = root / FILTER_FILE
    if not f.is_file():
        return ()
    try:
        data = json.loads(f.read_text())
    except (json.JSONDecodeError, OSError) as e:
        raise TaskError(f"{f}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TaskError(f"{f}: must be a JSON object")
    return tuple(k for k, v in data.items() if k.startswith("filter_") and v is True)


def suite_bug(fn, settings: dict, call: str, cfg_file: Path) -> str:
    """Why `fn(**settings)` must raise TypeError for a keyword it does not take ("" if it takes them
    all): a configuration file that does not fit its own task, which the suite cannot run either."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ""
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return ""
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    extra = [k for k in settings if k not in names]
    if not extra:
        return ""
    return (f"{cfg_file}: {SUITE_BUG}: it passes {', '.join(extra)} to {call}, which takes no such argument "
            f"(TypeError: unexpected keyword argument {extra[0]!r}), so robust-kbench cannot run it either")


def load_rkb(path: str | Path, backward: bool = False, mode: str = "single"):
    """The task robust-kbench runs from folder `path` in `mode` (RKB_MODES), forward or backward."""
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
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise TaskError(f"{cfg_file}: not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise TaskError(f"{cfg_file}: must be a JSON object")
    combos = config_combinations(raw, str(cfg_file), mode)
    flags = flagged(root)
    mod = import_file(func, "robust-kbench task")
    for attr in ("Model", "get_inputs"):
        if not hasattr(mod, attr):
            raise TaskError(f"{func}: not a robust-kbench task: it defines no {attr}")
    Model, get_inputs = mod.Model, mod.get_inputs
    for c in combos:
        why = suite_bug(Model, c.init, "Model()", cfg_file) or suite_bug(get_inputs, c.inputs, "get_inputs()", cfg_file)
        if why:
            raise TaskError(why)

    names = shape_names(combos)
    combos = [dataclasses.replace(c, name=n) for c, n in zip(combos, names)]
    settings = {c.name: {**c.init, **c.inputs} for c in combos}
    key = lambda cfg: json.dumps(cfg, sort_keys=True, default=str)
    of = {key(settings[c.name]): c for c in combos}       # the problem hands make_* the merged settings
    model_only = {k for c in combos for k in c.init} - {k for c in combos for k in c.inputs}
    problem = Problem(
        where=str(func),
        make_model=lambda cfg: Model(**of[key(cfg)].init),
        make_inputs=lambda cfg: list(get_inputs(**of[key(cfg)].inputs)),
        input_names=list(getattr(mod, "input_names", []) or []), configs=settings,
        size_names={c.name: list(c.inputs) + [k for k in c.init if k not in c.inputs] for c in combos},
        source_text=func.read_text(), title=root.name)
    note = (f"Correctness is checked on the {len(combos)} configurations robust-kbench runs in its {mode} mode "
            f"(init x input x shared settings of {cfg_file.name}).")
    desc = (f"robust-kbench task {root.name} ({direction}): compute exactly what "
            + ("Model.forward computes" if not backward else
               "the backward pass of Model.forward computes: the gradients of the forward inputs and "
               "parameters given grad_out, the gradient flowing into the output")
            + ", as one or more kernels.")
    info: dict = {}
    name = (root.name + ("_backward" if backward else "")) + ("" if mode == "single" else f"@{mode}")
    build = _backward_task if backward else _forward_task
    task = build(problem, name, desc, note, model_only, info)
    dropped = info.get("dropped", {})
    errors = [kf_forward_error(task)]
    if dropped:
        errors.append(f"only {len(combos) - len(dropped)} of {len(combos)} configurations fit one kf_forward "
                      f"signature: {next(iter(dropped.values()))}")
    task.suite = SuiteSpec(kind=RKB, path=str(root), direction=direction, mode=mode, configs=tuple(combos),
                           flagged=flags, bytes_needed=max(info.get("bytes", {}).values(), default=0),
                           functional_error="; ".join(e for e in errors if e))
    task.seeds = suite_form.seeds(task.suite)
    return task


def _forward_task(problem: Problem, name: str, desc: str, note: str, model_only, info: dict):
    return build_torch_task(problem, name, desc, RTOL, ATOL, note, model_only=model_only, trace_info=info)


def _backward_task(problem: Problem, name: str, desc: str, note: str, model_only, info: dict):
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
    return build_torch_task(bw, name, desc, RTOL, ATOL, note, model_only=model_only, trace_info=info)
