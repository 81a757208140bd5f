"""Correctness the suite's way, then kfray's defences: the trials of every configuration."""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from kfray.candidate import TIER_RUNTIME_ERROR, TIER_WRONG_SHAPE, TIER_WRONG_VALUES
from kfray.eval.suite.common import (LATE_WAIT_S, RKB, SUITE_NAMES, Verdict, all_close, allclose_reason, changed,
                                     gradients, making, max_diff, outputs, overlaps, set_seed, snapshot, state_of,
                                     suite_seeds, tensors, to_device, to_module)
from kfray.eval.suite.device_memory import DeviceMemory
from kfray.eval.suite.runners import Case
from kfray.tasks.suite_spec import SuiteSpec


def params_and_inputs(model, xs: list) -> tuple[list, list[str]]:
    ts, names = [], []
    for i, x in enumerate(tensors(xs)):
        ts.append(x)
        names.append(f"input {i}")
    for n, p in state_of(model).items():
        ts.append(p)
        names.append(f"parameter {n}")
    return ts, names


def plain_name(n: str) -> str:
    """A candidate model's state name as the reference names it (a kfray-form extension's model
    wraps the suite's model as `inner`)."""
    return n.removeprefix("inner.")


def align_buffers(new, ref) -> None:
    """The reference's buffers (running statistics and the like) copied into the candidate's model,
    so both sides' next call starts from the same state whatever each was called before (KernelBench
    keeps one model pair for every trial and its timing; the two are not called alike)."""
    import torch

    theirs = dict(ref.named_buffers()) if hasattr(ref, "named_buffers") else {}
    if not theirs:
        return
    remote = getattr(new, "kernel", None)
    if remote is not None:
        remote.set_state(new, theirs)
        return
    with torch.no_grad():
        for n, t in state_of(new).items():
            r = theirs.get(plain_name(n))
            if r is not None and r.shape == t.shape and r.dtype == t.dtype:
                t.copy_(r)


def unexplained_change(new, before: dict, ref, rtol: float, atol: float) -> str | None:
    """The first parameter or buffer that the kernel's call changed and the reference's own call
    did not leave the same way (a reference in training mode updates BatchNorm running statistics:
    a kernel that does the same is right, not a reward hack); None when every change is explained."""
    theirs = state_of(ref)
    for n, t in state_of(new).items():
        t = t.detach()
        if changed([t], [before[n]], [n]) is None:
            continue
        r = theirs.get(plain_name(n))
        if r is None or r.shape != t.shape or not all_close(t, r, rtol, atol, double=True, equal_nan=True):
            return f"parameter {n}"
    return None


def call_kernel(fn: Callable, *args):
    try:
        return fn(*args)
    except Verdict:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise Verdict(TIER_RUNTIME_ERROR, f"{type(e).__name__}: {msg[0][:400] if msg else ''}",
                      recycle="CUDA" in str(e) or "cuda" in str(e)) from None


class Judge:
    """The suite's trials for every configuration, then kfray's own checks."""

    def __init__(self, backend, spec: SuiteSpec, rng: np.random.Generator, remote=None):
        self.backend, self.spec, self.rng = backend, spec, rng
        self.device = backend.device
        self.max_diff = 0.0
        self.flags: list[str] = []                  # timing the judge's clock cannot account for
        self.memory = DeviceMemory(self.device, remote)   # remote: the candidate's runner side, if any


    def sync(self) -> None:
        self.backend.synchronize()

    # -- forward ------------------------------------------------------------------------------------
    def forward_trial(self, case: Case, seed: int, kernel_first: bool, fresh: bool = False) -> None:
        """One trial. kernel_first=False is KernelBench's order (reference, then candidate);
        robust-kbench's is kernel, reference, kernel (kernel_first=True, with the second call)."""
        import torch

        sp, tag = self.spec, f"configuration {case.name}, {'kfray fresh-input' if fresh else 'suite'} trial seed {seed}"
        with torch.no_grad(), making(sp, self.device):
            set_seed(seed)
            xs = case.prepare(to_device(case.make_inputs(), self.device))
            if sp.kind == RKB:
                set_seed(seed)
                ref = to_module(case.make_ref(), self.device)
                set_seed(seed)
                new = to_module(case.make_new(), self.device)
            else:
                ref, new = to_module(case.make_ref(), self.device), to_module(case.make_new(), self.device)
            align_buffers(new, ref)
            watched, names = params_and_inputs(new, xs)
            before = {n: t.detach().clone() for n, t in state_of(new).items()}
            outs_ref = None
            # Each side's call starts from the trial's seed: a reference that draws random numbers
            # (dropout in training mode) draws the same ones as its copy does.
            if not kernel_first:
                set_seed(seed)
                outs_ref = outputs(call_kernel(case.call_ref, ref, xs), "the reference")
                self.sync()
            snaps = snapshot(watched)
            set_seed(seed)
            t0 = time.perf_counter()
            outs = outputs(call_kernel(case.call_new, new, xs), "the kernel")
            self.sync()
            call_s = time.perf_counter() - t0
            self._own_memory(outs, watched, names, tag)
            early = snapshot(outs)
            time.sleep(min(LATE_WAIT_S[1], max(LATE_WAIT_S[0], 2 * call_s)))
            self.sync()
            if changed(outs, early, [f"output {i}" for i in range(len(outs))]):
                raise Verdict(TIER_RUNTIME_ERROR, f"{tag}: an output changed after the kernel returned: work was "
                              "still running (another stream or thread); finish or join all work before returning",
                              recycle=True)
            n_in = len(tensors(xs))
            bad = changed(watched[:n_in], snaps[:n_in], names[:n_in])
            if bad:
                raise Verdict(TIER_WRONG_VALUES, f"{tag}: the kernel changed {bad} (inputs must come back "
                              "unchanged) [kfray rule]")
            if kernel_first:
                set_seed(seed)
                outs_ref = outputs(call_kernel(case.call_ref, ref, xs), "the reference")
                self.sync()
            self._params_as_reference(new, before, ref, tag)
            calls = [outs]
            if sp.kind == RKB and not fresh:
                calls.append(outputs(call_kernel(case.call_new, new, xs), "the kernel (second call)"))
                self.sync()
            for k, got in enumerate(calls):
                if len(got) != len(outs_ref):
                    raise Verdict(TIER_WRONG_SHAPE, f"{tag}: the kernel returned {len(got)} tensors, the reference "
                                  f"{len(outs_ref)}")
                for i, (w, g) in enumerate(zip(outs_ref, got)):
                    self.max_diff = max(self.max_diff, max_diff(w, g) if w.shape == g.shape else 0.0)
                    why = allclose_reason(w, g, sp.rtol, sp.atol, f"output {i}", broadcast=sp.kind == RKB)
                    if why:
                        rule = "kfray rule: the kernel ran before the reference existed" if fresh else \
                            f"{SUITE_NAMES[sp.kind]}'s rule"
                        call = f", call {k + 1}" if len(calls) > 1 else ""
                        raise Verdict(TIER_WRONG_VALUES, f"{tag}{call}: {why} [{rule}]")

    def check_timed_call(self, config: str, idx: int, want: list, got: list) -> None:
        """A timed call the judge kept, at random, against the reference on the same input set."""
        if len(got) != len(want):
            raise Verdict(TIER_WRONG_SHAPE, f"configuration {config}: a timed call returned {len(got)} tensors, "
                          f"the reference {len(want)}")
        for i, (w, g) in enumerate(zip(want, got)):
            why = allclose_reason(w, g, self.spec.rtol, self.spec.atol, f"output {i}", broadcast=self.spec.kind == RKB)
            if why:
                raise Verdict(TIER_WRONG_VALUES, f"configuration {config}, a timed call on input set {idx}: {why}; "
                              "the kernel must compute its result on every call, from the inputs it is given "
                              "[kfray rule: spot checks of timed calls]")

    def _params_as_reference(self, new, before: dict, ref, tag: str) -> None:
        bad = unexplained_change(new, before, ref, self.spec.rtol, self.spec.atol)
        if bad:
            raise Verdict(TIER_WRONG_VALUES, f"{tag}: the kernel changed {bad}, which the reference leaves "
                          "otherwise (parameters must come back as the reference leaves them) [kfray rule]")

    def _own_memory(self, outs: list, watched: list, names: list[str], tag: str) -> None:
        for i, o in enumerate(outs):
            for t, n in zip(watched, names):
                if overlaps(o, t):
                    raise Verdict(TIER_WRONG_VALUES, f"{tag}: output {i} shares memory with {n} (a view of it or "
                                  "written in place); the kernel must return a tensor of its own [kfray rule; "
                                  f"{SUITE_NAMES[self.spec.kind]} itself would not reject this]")

    # -- backward -----------------------------------------------------------------------------------
    def backward_trial(self, case: Case, seed: int, fresh: bool = False) -> None:
        """robust-kbench's check_backward_correctness: kernel side first, then the reference; every
        .grad of the parameters and of the inputs compared. The kernel's side runs in its runner
        where it has one (suite/backward_side.py), on the inputs, parameters and upstream gradient
        made here."""
        import torch

        from kfray.eval.suite.backward_side import kernel_side

        sp, tag = self.spec, f"configuration {case.name}, {'kfray fresh-input' if fresh else 'suite'} trial seed {seed}"
        with making(sp, self.device):
            set_seed(seed)
            xs_ref = to_device(case.make_inputs(), self.device)
            set_seed(seed)
            xs_new = case.prepare(to_device(case.make_inputs(), self.device))
            for x in tensors(xs_new) + tensors(xs_ref):
                if x.requires_grad and not x.is_leaf:
                    x.retain_grad()
            set_seed(seed)
            ref = to_module(case.make_ref(), self.device)
            set_seed(seed)
            new = to_module(case.make_new(), self.device)
            side = kernel_side(case, new, xs_new, seed)
            watched, names = params_and_inputs(new, xs_new)
            n_in = len(tensors(xs_new))
            snaps = snapshot(watched[:n_in])
            before = {n: t.detach().clone() for n, t in state_of(new).items()}
            out = call_kernel(side.forward)
            self.sync()
            set_seed(seed)
            g = torch.randn_like(out)
            t0 = time.perf_counter()
            call_kernel(side.backward, g)
            self.sync()
            call_s = time.perf_counter() - t0
            grads_new = side.grads()
            early = {k: v.clone() for k, v in grads_new.items()}
            time.sleep(min(LATE_WAIT_S[1], max(LATE_WAIT_S[0], 2 * call_s)))
            self.sync()
            late = changed(list(grads_new.values()), list(early.values()), list(grads_new))
            if late:
                raise Verdict(TIER_RUNTIME_ERROR, f"{tag}: gradient {late} changed after backward returned: work "
                              "was still running (another stream or thread)", recycle=True)
            bad = changed([w.detach() for w in watched[:n_in]], snaps, names[:n_in])
            if bad:
                raise Verdict(TIER_WRONG_VALUES, f"{tag}: the backward kernel changed {bad} (inputs must come back "
                              "unchanged) [kfray rule]")
            ref.zero_grad()
            out_ref = case.call_ref(ref, xs_ref)
            set_seed(seed)
            g_ref = torch.randn_like(out_ref)
            out_ref.backward(g_ref)
            self.sync()
            grads_ref = gradients(ref, xs_ref)
            self._params_as_reference(new, before, ref, tag)
        if set(grads_new) != set(grads_ref):
            raise Verdict(TIER_WRONG_SHAPE, f"{tag}: gradients of {sorted(set(grads_ref) - set(grads_new))} missing, "
                          f"{sorted(set(grads_new) - set(grads_ref))} unexpected")
        for k in grads_ref:
            w, got = grads_ref[k], grads_new[k]
            if w.shape == got.shape:
                self.max_diff = max(self.max_diff, max_diff(w, got))
            why = allclose_reason(w, got, sp.rtol, sp.atol, f"gradient {k}", broadcast=True)
            if why:
                raise Verdict(TIER_WRONG_VALUES, f"{tag}: {why} [{'kfray fresh-input check' if fresh else 'robust-kbench rule'}]")

    def trial(self, case: Case, seed: int, kernel_first: bool = False, fresh: bool = False) -> None:
        if self.spec.direction == "backward":
            self.backward_trial(case, seed, fresh)
        else:
            self.forward_trial(case, seed, kernel_first, fresh)
        self.memory.settle(f"{case.name}: {'fresh' if fresh else 'suite'} trial")

    def suite_trials(self, cases: list[Case]) -> None:
        seeds = suite_seeds(self.spec.trials)
        for case in cases:
            for s in seeds:
                self.trial(case, s, kernel_first=self.spec.kind == RKB)

    def fresh_trials(self, cases: list[Case], n: int = 1) -> None:
        """kfray on top: seeds the suite never draws, the kernel first (nothing to copy from)."""
        for case in cases:
            for _ in range(n):
                self.trial(case, int(self.rng.integers(2**31)), kernel_first=True, fresh=True)
