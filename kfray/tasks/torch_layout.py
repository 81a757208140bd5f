"""The kernel signature of a PyTorch problem: one argument list (inputs, parameters and buffers,
outputs, sizes as scalars) and one description that serve every shape configuration.

Split from kfray/tasks/torch_ref.py (whose docstring describes the layout).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from kfray.errors import TaskError
from kfray.tasks.base import ITEMSIZE, NP_TYPES, Scalar, Tensor
from kfray.tasks.torch_problem import Problem, c_ident, need_torch
from kfray.tasks.torch_task import TorchTask
from kfray.tasks.torch_trace import trace


def build_torch_task(problem: Problem, name: str, description: str, rtol: float = 1e-3, atol: float = 1e-3,
                     extra_configs_note: str = "", model_only=(), trace_info: dict | None = None) -> TorchTask:
    """Trace every configuration's shapes (on the meta device where possible) and lay out the args.

    `model_only`: settings that only feed the model's constructor (e.g. an init method). They may take
    any values: what they shape reaches the kernel as parameter tensors, so it needs no telling.
    `trace_info`: given a dict, a configuration that cannot share the first one's kernel signature
    (its trace fails, its arguments differ, a non-numeric setting a kernel would need changes) is left
    out of the layout instead of failing the task, as `trace_info["dropped"][config] = one-line why`
    (a suite's own harness may still run it); `trace_info["bytes"][config]` = bytes of the inputs,
    parameters and outputs of every traced configuration."""
    torch = need_torch(problem.where)
    import torch.func  # noqa: F401  (fail early where torch.func is missing)

    dropped: dict[str, str] = {}
    per_cfg, errors = {}, {}
    for cname, settings in problem.configs.items():
        try:
            per_cfg[cname] = trace(torch, problem, settings, cname)
        except TaskError as e:
            if trace_info is None:
                raise
            errors[cname] = e
    if not per_cfg:
        raise next(iter(errors.values()))
    dropped.update({c: str(e).splitlines()[0].split(": ", 1)[-1] for c, e in errors.items()})

    def nbytes(t) -> int:
        return sum(ITEMSIZE[dt] * int(np.prod(shape, dtype=np.int64))
                   for _, shape, dt in t["inputs"] + t["params"] + t["outputs"])

    sizes = {c: nbytes(t) for c, t in per_cfg.items()}
    sig = lambda t: ([(n, len(s), d) for n, s, d in t["inputs"]], [(n, len(s), d) for n, s, d in t["params"]],
                     [(len(s), d) for _, s, d in t["outputs"]], t["fixed_pos"])
    first = per_cfg[next(iter(per_cfg))]
    for cname, tr in list(per_cfg.items()):
        if sig(tr) != sig(first):
            a, b = ({n for n, _, _ in t["inputs"] + t["params"]} for t in (first, tr))
            what = "; ".join(f"{w} {', '.join(sorted(s))}" for w, s in (("adds", b - a), ("drops", a - b)) if s)
            what = what or "changes the ranks or dtypes of its inputs, parameters or outputs"
            if trace_info is None:
                raise TaskError(f"{problem.where}: configuration {cname} {what}, unlike the first; kfray needs "
                                f"one kernel signature for all configurations")
            dropped[cname] = f"its arguments differ from the first configuration's ({what})"
            del per_cfg[cname]

    # -- a non-numeric setting a kernel would need to know cannot change across configurations ------
    model_only = set(model_only)
    is_num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    for k in dict.fromkeys(k for c in per_cfg for k in problem.configs[c]):
        if k in model_only or (re.fullmatch(r"[A-Za-z_]\w*", k) and
                               all(is_num(problem.configs[c].get(k)) for c in per_cfg)):
            continue
        have = [c for c in per_cfg if k in problem.configs[c]]
        vals = sorted({repr(problem.configs[c][k]) for c in have})
        if len(vals) < 2:
            continue
        why = (f"{problem.where}: setting {k!r} takes non-numeric values {vals} across "
               f"configurations; a kernel cannot be told which (only numbers become arguments)")
        if trace_info is None:
            raise TaskError(why)
        for c in have:
            v, v0 = repr(problem.configs[c][k]), repr(problem.configs[have[0]][k])
            if v != v0:
                dropped[c] = f"setting {k!r} is {v}, not {v0}, and a kernel cannot be told which"
                del per_cfg[c]
    cnames = list(per_cfg)
    if trace_info is not None:
        trace_info["dropped"], trace_info["bytes"] = dropped, sizes

    # -- names of the sizes: a dim takes the name of a setting that equals it on every config --------
    numeric = {}
    for cname in cnames:
        for k, v in problem.configs[cname].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and re.fullmatch(r"[A-Za-z_]\w*", k):
                numeric.setdefault(k, None)
    for k in list(numeric):
        if not all(k in problem.configs[c] and isinstance(problem.configs[c][k], (int, float))
                   and not isinstance(problem.configs[c][k], bool) for c in cnames):
            del numeric[k]
    order = [k for k in problem.size_names.get(cnames[0], []) if k in numeric] + \
        [k for k in numeric if k not in problem.size_names.get(cnames[0], [])]
    tables = {c: {k: problem.configs[c][k] for k in order} for c in cnames}
    symbols: dict[tuple, str] = {}
    taken: set[str] = set()

    def dim_names(kind: str, idx: int, tname: str) -> tuple[str, ...]:
        names = []
        for j in range(len(per_cfg[cnames[0]][kind][idx][1])):
            vals = tuple(per_cfg[c][kind][idx][1][j] for c in cnames)
            hit = next((k for k in order if tuple(tables[c][k] for c in cnames) == vals
                        and isinstance(tables[cnames[0]][k], int)), None)
            if hit is None and len(set(vals)) == 1:
                names.append(str(vals[0]))
                continue
            if hit is None:
                if vals not in symbols:
                    symbols[vals] = f"{tname}_d{j}"
                    for c, v in zip(cnames, vals):
                        tables[c][symbols[vals]] = v
                hit = symbols[vals]
            names.append(hit)
        return tuple(names)

    args: list[Tensor | Scalar] = []
    input_args, param_args, mapping = [], {}, []
    for i, (iname, _, dt) in enumerate(first["inputs"]):
        an = c_ident(iname, taken)
        input_args.append(an)
        args.append(Tensor(an, dt, dim_names("inputs", i, an), "in"))
        mapping.append(f"`{an}`: forward input `{iname}`")
    for i, (pname, _, dt) in enumerate(first["params"]):
        an = c_ident(pname[len(problem.param_prefix):] if problem.param_prefix and
                     pname.startswith(problem.param_prefix) else pname, taken)
        param_args[an] = pname
        args.append(Tensor(an, dt, dim_names("params", i, an), "in"))
        mapping.append(f"`{an}`: model {'parameter' if first['is_param'][i] else 'buffer'} `{pname}`")
    outs = first["outputs"]
    for i, (_, _, dt) in enumerate(outs):
        if i < len(problem.output_names):
            an = c_ident(problem.output_names[i], taken)
            mapping.append(f"`{an}`: output")
        else:
            an = c_ident("out" if len(outs) == 1 else f"out{i}", taken)
            mapping.append(f"`{an}`: forward output{'' if len(outs) == 1 else f' {i}'}")
        args.append(Tensor(an, dt, dim_names("outputs", i, an), "out"))
    used = set()
    for a in args:
        for e in a.shape:
            if not e.isdigit():
                used.add(e)
    scal_names = [k for k in tables[cnames[0]] if k in used or k in numeric]
    for k in scal_names:
        v = tables[cnames[0]][k]
        an = c_ident(k, taken)
        args.append(Scalar(an, "int64" if all(isinstance(tables[c][k], int) for c in cnames) else "float32", k))
    shapes = {c: dict(tables[c]) for c in cnames}

    elems = lambda t: "*".join(t.shape) or "1"
    bytes_expr = " + ".join(f"{np.dtype(NP_TYPES[a.dtype]).itemsize}*{elems(a)}"
                            for a in args if isinstance(a, Tensor)) or "0"
    other = {}
    for c in cnames:
        for k, v in problem.configs[c].items():
            if k not in numeric:
                other.setdefault(k, set()).add(repr(v))
    fixed = {k: v for k, v in other.items() if len(v) == 1}
    varies = [k for k in other if k not in fixed]          # model-only settings (checked above)
    desc = description
    desc += "\n\nKernel arguments: " + "; ".join(mapping) + \
        ("; then the sizes and settings " + ", ".join(f"`{s}`" for s in scal_names) if scal_names else "") + "."
    if fixed:
        desc += " Fixed settings: " + ", ".join(f"{k}={next(iter(v))}" for k, v in fixed.items()) + "."
    if varies:
        desc += (" Settings that only build the model, so they reach the kernel through its parameters: "
                 + ", ".join(f"{k} ({', '.join(sorted(other[k]))})" for k in varies) + ".")
    if dropped:
        desc += (f" Only {len(cnames)} of {len(problem.configs)} configurations fit this signature; left out: "
                 + "; ".join(f"{c}: {why}" for c, why in list(dropped.items())[:3])
                 + ("; ..." if len(dropped) > 3 else "") + ".")
    if first["fixed_pos"]:
        desc += " Non-tensor forward inputs (fixed): " + \
            ", ".join(f"position {i} = {v!r}" for i, v in first["fixed_pos"].items()) + "."
    if extra_configs_note:
        desc += " " + extra_configs_note
    if problem.source_text:
        desc += f"\n\nThe PyTorch reference ({Path(problem.where).name}):\n```python\n{problem.source_text.strip()}\n```"
    return TorchTask(name=name, description=desc, args=args, shapes=shapes, reference=lambda a: {},
                     rtol=rtol, atol=atol, bytes_moved=bytes_expr, flops="0", seeds=[], ref="",
                     problem=problem, param_args=param_args, input_args=input_args,
                     fixed_inputs=dict(first["fixed_pos"]), configs={c: problem.configs[c] for c in cnames})
