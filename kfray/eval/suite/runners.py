"""The two suites' ways of building and calling: per configuration, how to make the models and
inputs and how to run each side (robust-kbench: `Model.forward(*inputs, fn=...)`; KernelBench:
`Model(*init)` and the candidate's `ModelNew(*init)`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kfray.candidate import TIER_RUNTIME_ERROR
from kfray.eval.suite.common import Verdict, set_seed
from kfray.tasks.package import import_file
from kfray.tasks.suite_spec import KERNELBENCH, RKB, SUITE_SEED, SuiteSpec


@dataclass
class Case:
    """One configuration: how to make its models and inputs, run each side, and name it."""

    name: str
    make_inputs: Callable[[], list]
    make_ref: Callable[[], Any]                # -> the reference module
    make_new: Callable[[], Any]                # -> the candidate module (or the same class, other fn)
    call_ref: Callable[[Any, list], Any]
    call_new: Callable[[Any, list], Any]
    prepare: Callable[[list], list] = lambda xs: xs    # where both sides see the inputs (remote_case)
    remote: Any = None                                 # the candidate's runner side, when it has one
    index: int = 0                                     # its place among the configurations (the runner's name for it)


class RkbRunner:
    """robust-kbench: Model(**init), get_inputs(**inputs), forward through `fn`."""

    def __init__(self, spec: SuiteSpec, kernel: Any):
        self.spec = spec
        func = Path(spec.path) / f"func_{spec.direction}.py"
        if not func.is_file():
            func = Path(spec.path) / "func_forward.py"
        self.mod = import_file(func, "robust-kbench task")
        if spec.direction == "backward":
            auto = getattr(self.mod, "AutogradFunction", None)
            if auto is None:
                raise Verdict(TIER_RUNTIME_ERROR, f"{func}: the task defines no AutogradFunction for backward kernels")
            auto.backward_fn = kernel
            self.new_fn = auto.apply
        else:
            self.new_fn = kernel

    def cases(self) -> list[Case]:
        out = []
        for c in self.spec.configs:
            out.append(Case(
                name=c.name,
                make_inputs=lambda c=c: list(self.mod.get_inputs(**c.inputs)),
                make_ref=lambda c=c: self.mod.Model(**c.init),
                make_new=lambda c=c: self.mod.Model(**c.init),
                call_ref=lambda m, xs: m(*xs, fn=self.mod.forward_fn),
                call_new=lambda m, xs: m(*xs, fn=self.new_fn)))
        return out


class KbRunner:
    """KernelBench: Model(*get_init_inputs()), get_inputs(); the candidate is a ModelNew class or a
    kfray-form extension `forward(inputs..., parameters...)` wrapped as a module."""

    def __init__(self, spec: SuiteSpec, kernel: Any, task):
        self.spec, self.task = spec, task
        self.mod = import_file(Path(spec.path), "KernelBench problem")
        self.kernel = kernel

    def _new(self, init: list):
        import torch

        if isinstance(self.kernel, type):                    # a ModelNew class
            return self.kernel(*init)
        fwd = self.kernel                                     # an extension's forward
        mod_cls = self.mod.Model
        names = list(self.task.param_args.values()) if self.task is not None else []

        class ExtModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = mod_cls(*init)

            def forward(self, *xs):
                tensors = dict(self.inner.named_parameters())
                tensors.update(dict(self.inner.named_buffers()))
                return fwd(*xs, *[tensors[n] for n in names])

        return ExtModel()

    def cases(self) -> list[Case]:
        init = self.init_inputs()
        holder: dict[str, Any] = {}

        def model(side: str):          # one of each for every trial, each built after set_seed(42) as
            if side not in holder:     # KernelBench builds them (only the side a process needs)
                set_seed(SUITE_SEED)
                holder[side] = self.mod.Model(*init) if side == "ref" else self._new(init)
            return holder[side]

        return [Case(name="default",
                     make_inputs=lambda: list(self.mod.get_inputs()),
                     make_ref=lambda: model("ref"), make_new=lambda: model("new"),
                     call_ref=lambda m, xs: m(*xs), call_new=lambda m, xs: m(*xs))]

    def init_inputs(self) -> list:
        set_seed(SUITE_SEED)
        get = getattr(self.mod, "get_init_inputs", lambda: [])
        return list(get())


def runner_for(spec: SuiteSpec, kernel, task):
    if spec.kind == RKB:
        return RkbRunner(spec, kernel)
    if spec.kind == KERNELBENCH:
        return KbRunner(spec, kernel, task)
    raise Verdict(TIER_RUNTIME_ERROR, f"unknown suite {spec.kind!r}")
