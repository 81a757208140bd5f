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
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kfray.errors import TaskError
from kfray.source import safe_eval
from kfray.tasks.base import C_TYPES, DTYPES, ITEMSIZE, NP_TYPES, Scalar, Task, Tensor

CONFIG_KEY = "_kf_config"       # a hidden entry of the args dict: which shape config made them
_C_WORDS = {"int", "float", "double", "char", "long", "short", "void", "const", "return", "if", "else", "for",
            "while", "do", "struct", "class", "auto", "new", "delete", "this", "stream", "queue", "default",
            "register", "signed", "unsigned", "switch", "case", "break", "continue", "static", "inline"}


def need_torch(where: str):
    try:
        import torch
    except ImportError:
        raise TaskError(f"{where}: this task's reference is PyTorch, which is not installed "
                        f"(pip install 'kfray[torch]' or pip install torch)") from None
    return torch


def torch_dtype_name(t, where: str, what: str) -> str:
    """The task dtype of a tensor: any of DTYPES (half precision loads too; kf_forward_error says
    that kf_forward kernels cannot take it)."""
    name = str(t.dtype).replace("torch.", "")
    if name not in DTYPES:
        raise TaskError(f"{where}: {what} has dtype {name}, which kfray tasks cannot hold yet "
                        f"(supported: {', '.join(DTYPES)})")
    return name


def kf_forward_error(task: Task) -> str:
    """One line on why kf_forward kernels cannot take this task ('' when they can): a tensor of a
    dtype outside C_TYPES. Other kernel forms (PyTorch extensions, ModelNew) still run it."""
    odd: dict[str, list[str]] = {}
    for a in task.args:
        if a.dtype not in C_TYPES:
            odd.setdefault(a.dtype, []).append(a.name)
    if not odd:
        return ""
    what = "; ".join(f"{d} tensors ({', '.join(n)})" for d, n in odd.items())
    return (f"{what}: kf_forward kernels take only {', '.join(C_TYPES)}; "
            f"a PyTorch extension or ModelNew kernel can run this task")


def tensor_bytes(task: Task) -> int:
    """Bytes of every tensor argument (inputs, parameters/buffers, outputs) on the largest shape config."""
    return max(sum(ITEMSIZE[a.dtype] * int(np.prod(a.dims(cfg), dtype=np.int64)) for a in task.args
                   if isinstance(a, Tensor)) for cfg in task.shapes.values())


PIP_NAMES = {"sklearn": "scikit-learn", "cv2": "opencv-python", "PIL": "pillow", "yaml": "pyyaml",
             "skimage": "scikit-image"}


def missing_package(e: BaseException | None) -> str | None:
    """'needs the package einops (pip install einops)' when `e` (or what it was raised from) is a
    missing import, else None: an ImportError message alone does not say what to do."""
    while e is not None:
        if isinstance(e, ModuleNotFoundError) and e.name:
            top = e.name.split(".")[0]
            return f"needs the package {top} (pip install {PIP_NAMES.get(top, top)})"
        e = e.__cause__ or e.__context__
    return None


def c_ident(name: str, taken: set[str]) -> str:
    s = re.sub(r"\W", "_", name).strip("_") or "arg"
    if s[0].isdigit():
        s = "t_" + s
    if s in _C_WORDS:
        s += "_"
    base, i = s, 2
    while s in taken:
        s = f"{base}_{i}"
        i += 1
    taken.add(s)
    return s


def module_constants(path: Path, mod) -> dict[str, int | float]:
    """Module-level `NAME = number` assignments of a file, in file order (the problem's sizes)."""
    out = {}
    try:
        tree = ast.parse(path.read_text())
    except SyntaxError:
        return out
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            n = node.targets[0].id
            v = getattr(mod, n, None)
            if not n.startswith("_") and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[n] = v
    return out


def outputs_of(res, where: str) -> list:
    import torch

    if isinstance(res, torch.Tensor):
        return [res]
    if isinstance(res, (tuple, list)) and res and all(isinstance(r, torch.Tensor) for r in res):
        return list(res)
    raise TaskError(f"{where}: forward returns {type(res).__name__}, not a tensor or a tuple of tensors")


@dataclass
class Problem:
    """How to build one configuration of a PyTorch problem."""

    where: str                                         # file or folder, for messages
    make_model: Callable[[dict], Any]                  # config -> nn.Module
    make_inputs: Callable[[dict], list]                # config -> list of forward inputs
    input_names: list[str]
    configs: dict[str, dict]                           # shape config name -> settings (any values)
    size_names: dict[str, list[str]]                   # per config, names to try for dims, in order
    source_text: str = ""
    title: str = ""
    forward: Callable | None = None                    # (module, inputs) -> outputs; default module(*inputs)
    output_names: list[str] = field(default_factory=list)
    param_prefix: str = ""                             # stripped from parameter names to make arg names


@dataclass
class TorchTask(Task):
    """A Task whose reference runs a PyTorch module in functional form."""

    problem: Any = None
    param_args: dict[str, str] = field(default_factory=dict)   # arg name -> module parameter/buffer name
    input_args: list[str] = field(default_factory=list)        # arg names of the forward inputs, in order
    fixed_inputs: dict[int, Any] = field(default_factory=dict) # forward positions that are not tensors
    configs: dict[str, dict] = field(default_factory=dict)     # shape config -> problem settings
    suite: Any = None                                          # SuiteSpec: how the suite itself runs it
    _templates: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    # --- inputs ----------------------------------------------------------------------------------
    def make_args(self, shape: str, rng: np.random.Generator) -> dict[str, Any]:
        torch = need_torch(self.problem.where)
        cfg = self.shapes[shape]
        settings = self.configs[shape]
        torch.manual_seed(int(rng.integers(0, 2**31 - 1)))
        with torch.no_grad():
            model = self.problem.make_model(settings)
            inputs = self.problem.make_inputs(settings)
        params = dict(model.named_parameters())
        params.update(dict(model.named_buffers()))
        out: dict[str, Any] = {}
        tensors_in = [x for x in inputs if isinstance(x, torch.Tensor)]
        for name, t in zip(self.input_args, tensors_in):
            out[name] = t.detach().cpu().contiguous().numpy().copy()
        for name, pname in self.param_args.items():
            out[name] = params[pname].detach().cpu().contiguous().numpy().copy()
        for a in self.args:
            if isinstance(a, Tensor) and a.role == "out":
                dims = a.dims(cfg)
                dt = NP_TYPES[a.dtype]
                out[a.name] = np.full(dims, np.nan, dtype=dt) if np.issubdtype(dt, np.floating) \
                    else np.full(dims, -1, dtype=dt)
            elif isinstance(a, Scalar):
                v = safe_eval(str(a.value), cfg)
                out[a.name] = int(v) if a.dtype.startswith("int") else float(np.float32(v))
        out[CONFIG_KEY] = shape
        return out

    # --- reference -------------------------------------------------------------------------------
    def _which(self, args: dict[str, Any]) -> str:
        shape = args.get(CONFIG_KEY)
        if isinstance(shape, str) and shape in self.shapes:
            return shape
        for name, cfg in self.shapes.items():      # fall back: the config the tensors' shapes fit
            ok = True
            for a in self.args:
                v = args.get(a.name)
                if isinstance(a, Tensor) and a.role == "in" and v is not None:
                    ok &= tuple(getattr(v, "shape", ())) == a.dims(cfg)
                elif isinstance(a, Scalar) and v is not None:
                    ok &= bool(np.isclose(float(v), float(safe_eval(str(a.value), cfg)), rtol=1e-6))
            if ok:
                return name
        raise TaskError(f"{self.problem.where}: the arguments fit none of the shape configs {list(self.shapes)}")

    def _template(self, shape: str, device: str = "cpu"):
        key = (shape, device)
        if key not in self._templates:
            torch = need_torch(self.problem.where)
            torch.manual_seed(0)
            with torch.no_grad():
                self._templates[key] = self.problem.make_model(self.configs[shape]).to(device).eval()
        return self._templates[key]

    def _call(self, shape: str, tensors: dict[str, Any], device: str):
        torch = need_torch(self.problem.where)
        from torch.func import functional_call

        module = self._template(shape, device)
        params = {pname: tensors[arg] for arg, pname in self.param_args.items()}
        pos, it = [], iter(self.input_args)
        n_pos = len(self.input_args) + len(self.fixed_inputs)
        for i in range(n_pos):
            pos.append(self.fixed_inputs[i] if i in self.fixed_inputs else tensors[next(it)])
        fwd = self.problem.forward
        with torch.no_grad():
            if fwd is None:
                res = functional_call(module, params, tuple(pos), tie_weights=True, strict=False)
            else:
                res = fwd(module, params, pos)
        outs = outputs_of(res, self.problem.where)
        return {o.name: r for o, r in zip(self.outputs, outs)}

    def run_reference(self, args: dict[str, Any]) -> dict[str, np.ndarray]:
        torch = need_torch(self.problem.where)
        shape = self._which(args)
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in args.items()
                   if isinstance(v, np.ndarray)}
        res = self._call(shape, tensors, "cpu")
        return {o.name: res[o.name].detach().cpu().numpy().astype(NP_TYPES[o.dtype], copy=False)
                for o in self.outputs}

    def device_reference(self, args: dict[str, Any], device: str = "cuda") -> dict[str, Any]:
        """The reference on the evaluator's GPU: args hold device arrays (CuPy or torch, via DLPack);
        returns torch tensors on that device (CuPy takes them with cupy.from_dlpack / cupy.asarray).
        Backends that can should time this, not the CPU path, as the eager-PyTorch baseline."""
        torch = need_torch(self.problem.where)
        shape = self._which(args)
        tensors = {}
        for k, v in args.items():
            if isinstance(v, torch.Tensor):
                tensors[k] = v
            elif isinstance(v, np.ndarray):
                tensors[k] = torch.from_numpy(v).to(device)
            elif hasattr(v, "__dlpack__"):
                tensors[k] = torch.from_dlpack(v)
        return self._call(shape, tensors, device)


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
            per_cfg[cname] = _trace(torch, problem, settings, cname)
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


REAL_TRACE_LIMIT = 64 << 20     # bytes of inputs + parameters below which a trace may run for real
REAL_BUILD_LIMIT = 4 << 30      # bytes a model may allocate when it must be constructed for real


def _build_real(torch, make, limit: int, where: str):
    """Construct a model for real on the CPU, for one whose __init__ meta and fake tensors cannot run
    (it calls `.item()`, say), stopping as soon as its new tensors pass `limit` bytes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Guard(TorchDispatchMode):
        used = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not any(r.alias_info for r in func._schema.returns):   # a new tensor: no view, no in-place
                for t in out if isinstance(out, (tuple, list)) else [out]:
                    if isinstance(t, torch.Tensor):
                        Guard.used += t.numel() * t.element_size()
                if Guard.used > limit:
                    raise TaskError(f"{where}: meta and fake tensors cannot construct the model, and "
                                    f"constructing it for real takes more than {limit / 2**30:.3g} GiB of "
                                    f"tensors (kfray's limit for learning its shapes on the host)")
            return out

    torch.manual_seed(0)
    with torch.device("cpu"), torch.no_grad(), Guard():
        return make()


class _SlowOnMeta(Exception):
    """A model whose meta-device forward takes seconds (an LSTM of 512 steps: 13 s) where
    FakeTensorMode takes milliseconds: the trace goes straight to fake tensors."""


def _trace(torch, problem: Problem, settings: dict, cname: str) -> dict:
    """Shapes and dtypes of inputs, parameters and outputs of one configuration.

    Listing a task must stay cheap whatever its sizes (KernelBench's reach 32768 x 32768), so the
    forward runs on the meta device, then under FakeTensorMode (ops without a meta kernel, `.cpu()`,
    CUDA-only inputs); a model that neither can construct (`.item()` in __init__) is constructed for
    real on the CPU, its forward still fake; only a problem whose tensors are small is ever run for
    real, on the CPU."""
    where = f"{problem.where} (configuration {cname})"
    sized: list[int] = []                  # bytes of inputs + parameters, as the fake attempt saw them

    def build(ctx, model=None):
        with ctx, torch.no_grad():
            if model is None:
                model = problem.make_model(settings)
            if isinstance(ctx, torch.device) and ctx.type == "meta" and \
                    any(isinstance(m, torch.nn.RNNBase) for m in model.modules()):
                raise _SlowOnMeta("RNN layers run step by step on the meta device: fake tensors instead")
            inputs = problem.make_inputs(settings)
            if not isinstance(inputs, (list, tuple)):
                raise TaskError(f"{where}: get_inputs must return a list, got {type(inputs).__name__}")
            tensors = [t for t in list(inputs) + list(model.parameters()) + list(model.buffers())
                       if isinstance(t, torch.Tensor)]
            sized[:] = [sum(t.numel() * t.element_size() for t in tensors)]
            res = model(*inputs) if problem.forward is None else problem.forward(
                model, {**dict(model.named_parameters()), **dict(model.named_buffers())}, list(inputs))
        return model, list(inputs), res

    def fake():
        from torch._subclasses.fake_tensor import FakeTensorMode
        return FakeTensorMode(allow_non_fake_inputs=True)

    def why(e: Exception) -> str:
        return missing_package(e) or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    errors = []
    real = None                            # a model constructed for real, when meta and fake cannot
    for ctx in (lambda: torch.device("meta"), fake):
        try:
            model, inputs, res = build(ctx())
            errors.clear()
            break
        except TaskError:
            raise
        except Exception as e:
            errors.append(e)
    else:
        if not sized:                      # the model could not even be constructed: build it for real
            try:
                real = _build_real(torch, lambda: problem.make_model(settings), REAL_BUILD_LIMIT, where)
            except TaskError:
                raise
            except Exception as e:
                raise TaskError(f"{where}: building the model failed: {why(e)} (on the meta device: "
                                f"{why(errors[0])})") from None
            try:
                model, inputs, res = build(fake(), real)
                errors.clear()
            except TaskError:
                raise
            except Exception as e:
                errors.append(e)
    if errors:
        if not sized:
            raise TaskError(f"{where}: building the model or its inputs failed: {why(errors[-1])}") from None
        if sized[0] > REAL_TRACE_LIMIT:
            raise TaskError(f"{where}: its forward runs neither on the meta device nor with fake tensors "
                            f"({why(errors[-1])}), and a real run with {sized[0] / 2**20:.0f} MiB of tensors is "
                            f"too costly just to learn the output shapes") from None
        try:                               # small enough: one real run is cheap
            torch.manual_seed(0)
            model, inputs, res = build(torch.device("cpu"), real)
        except TaskError:
            raise
        except Exception as e:
            raise TaskError(f"{where}: building the model or running its forward failed: {why(e)}") from None
    fixed, tin = {}, []
    names = problem.input_names
    for i, x in enumerate(inputs):
        nm = names[i] if i < len(names) else f"input{i}"
        if isinstance(x, torch.Tensor):
            tin.append((nm, tuple(x.shape), torch_dtype_name(x, where, f"input {nm}")))
        elif isinstance(x, (int, float, bool)) or x is None:
            fixed[i] = x
        else:
            raise TaskError(f"{where}: input {nm} is a {type(x).__name__}; only tensors and numbers are supported")
    params, is_param = [], []
    pnames = set()
    for pname, p in list(model.named_parameters()) + list(model.named_buffers()):
        if pname in pnames:
            continue
        pnames.add(pname)
        params.append((pname, tuple(p.shape), torch_dtype_name(p, where, f"parameter {pname}")))
        is_param.append(isinstance(p, torch.nn.Parameter))
    outs = [(f"out{i}", tuple(o.shape), torch_dtype_name(o, where, "the output"))
            for i, o in enumerate(outputs_of(res, where))]
    return {"inputs": tin, "params": params, "is_param": is_param, "outputs": outs, "fixed_pos": fixed}
