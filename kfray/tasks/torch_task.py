"""The Task of a PyTorch problem: fresh inputs from the problem's own generators, and a reference
that runs the module in functional form (on the CPU, or on the evaluator's GPU).

Split from kfray/tasks/torch_ref.py, which builds these (`build_torch_task`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kfray.errors import TaskError
from kfray.source import safe_eval
from kfray.tasks.base import NP_TYPES, Scalar, Task, Tensor
from kfray.tasks.torch_problem import need_torch, outputs_of

CONFIG_KEY = "_kf_config"       # a hidden entry of the args dict: which shape config made them


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
