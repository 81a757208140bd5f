"""One side of one configuration (the kernel's or the reference's), set up once and timed in as many
blocks of calls as the caller asks: kfray.eval.suite.timing alternates the two sides' blocks, so
that a slow stretch of the host or the device is shared by both sides instead of counting against
whichever side happened to be timed during it."""
from __future__ import annotations

import contextlib
import statistics
from typing import Any

from kfray.eval.defences import clock_check, copy_check
from kfray.eval.remote import paused
from kfray.eval.suite.common import (L2_FLUSH_BYTES, RKB, Verdict, allclose_reason, gradients, making, outputs, set_seed,
                                     tensors, to_device, to_module)

ROTATION_MAX_BYTES = 4 << 30      # inputs up to this size get a second set for the timed calls to alternate


class SideTimer:
    """`side` "new" or "ref" of `case`. `compiled`: the reference under torch.compile. `like`: the
    kernel's SideTimer, whose spot checks the reference's runner gets too. `run` times a block (the
    suite's samples), `result` is the last call's result and its model and inputs."""

    def __init__(self, judge, clock, case, seed: int, side: str, compiled: bool = False, like=None):
        import torch

        self.judge, self.clock, self.seed, self.compiled = judge, clock, seed, compiled
        sp, dev = judge.spec, judge.device
        self.candidate = case.remote
        via = getattr(self.candidate, "reference", None) if side == "ref" and not compiled else None
        if via is not None:       # the reference in its own runner, timed as the candidate is in its own
            case, side = via.case_for(case), "new"
        self.case, self.side, self.via = case, side, via
        with making(sp, dev):
            set_seed(seed)
            xs = to_device(case.make_inputs(), dev)
            if side == "new":
                xs = case.prepare(xs)
            set_seed(seed)
            self.model = to_module(case.make_new() if side == "new" else case.make_ref(), dev)
        self.xs = xs
        self.input_bytes = sum(t.numel() * t.element_size() for t in tensors(xs))
        self.remote = case.remote if side == "new" and not compiled else None
        self.backward_remote = self.remote is not None and sp.direction == "backward"
        self.last: list = [None]
        self.pairs: list = []             # (judge's seconds, claimed seconds, waits) of every timed call
        self.copies: list = []            # the checked calls' copy round trips
        self.costs: list = []             # (the runner's part of a request, a copy) as the judge measured them, a block
        self.rotation, self.check = [], None
        if self.backward_remote:         # autograd through the kernel, in its runner (backward_side)
            return
        if self.remote is not None:      # a second input set of other values, timed calls alternate
            self.rotation = [xs]
            if self.input_bytes <= ROTATION_MAX_BYTES:
                with making(sp, dev):
                    set_seed(seed + 1)
                    self.rotation.append(case.prepare(to_device(case.make_inputs(), dev)))
        if self.remote is not None and via is None:     # the reference's own runner is not checked: it is the reference
            with torch.no_grad(), making(sp, dev):      # the reference's result on each set: timed calls kept at
                set_seed(seed)                          # random are checked against it at once, nothing stored
                ref_model = to_module(case.make_ref(), dev)
                refs = [[o.detach() for o in outputs(case.call_ref(ref_model, s), "the reference")]
                        for s in self.rotation]
                again = outputs(case.call_ref(ref_model, self.rotation[0]), "the reference")
                del ref_model
            judge.sync()
            # A reference that draws random numbers (dropout in training mode) gives each call its
            # own result: timed calls, which run unseeded, cannot be checked against it.
            steady = len(again) == len(refs[0]) and not any(
                allclose_reason(w, g, sp.rtol, sp.atol, "output") for w, g in zip(refs[0], again))
            if steady:
                self.check = lambda idx, outs: judge.check_timed_call(case.name, idx, refs[idx], outs)
        elif self.remote is not None and like is not None and like.check is not None:
            # The reference's runner gets the kernel's spot checks too (its input sets are made from
            # the same seeds): a checked call's copy and the judge's comparison leave the next call
            # behind work of another CUDA context, and a cost on one side only read as the kernel's
            # (level-3 references 0.89-0.97x against themselves with the checks on one side).
            # A mismatch here is the reference's own: a flag, never the kernel's verdict.
            def check(idx, outs, theirs=like.check):
                try:
                    theirs(idx, outs)
                except Verdict as e:
                    note = f"configuration {case.name}: the reference's runner disagreed with the reference: {e}"
                    if note not in judge.flags:
                        judge.flags.append(note)
            self.check = check
        self.call_side = case.call_new if side == "new" else case.call_ref
        if compiled:
            self.call_side = compiled_reference(case, sp)
        # The candidate's runner calls the kernel on fresh clones of the inputs, made just before
        # the flush; the paced reference does the same. The clone's GPU work matters, not only its
        # memory: on the H200 a call that followed an idle GPU read 0.5-1.7 % slower than one that
        # followed a clone (level-1 references measured 1.012x against themselves without it).
        self.fresh = [xs] if side == "ref" and case.remote is not None and not compiled else None
        self.state: dict = {}

    # -- the calls -------------------------------------------------------------------------------
    def _before_backward(self):
        import torch

        self.model.zero_grad()
        for x in tensors(self.xs):        # inputs' grads too: every timed backward starts alike
            x.grad = None
        with torch.enable_grad():
            self.state["out"] = self.call_side(self.model, self.xs)
        # The same upstream gradient on every call and on both sides, however many calls each
        # side made: the last timed calls' gradients are compared (check_timed). Drawn from the
        # shared generator, two sides that timed unlike numbers of calls had different ones.
        set_seed(self.seed)
        self.state["g"] = torch.randn_like(self.state["out"])

    def _call_backward(self):
        self.state["out"].backward(self.state["g"])

    def _clone_inputs(self):
        import torch

        self.fresh[0] = [x.clone() if isinstance(x, torch.Tensor) else x for x in self.xs]

    def _call(self):
        self.last[0] = None                # one output alive at a time: full-size problems are large
        self.last[0] = self.call_side(self.model, self.fresh[0] if self.fresh else self.xs)

    def _hold(self, pace: float):
        """What runs while this side is timed, and its pace. The candidate's every call waits on the
        wire; the reference's calls keep its cadence (`pace`, the candidate's median start-to-start
        period, measured just before), so that neither side's timing has idle gaps the other lacks:
        on the H200 a 2 ms idle before each call slowed a 54 us KernelBench problem to 80 us.
        Meanwhile the candidate's processes are stopped (kfray.eval.remote.paused)."""
        if self.via is not None:          # the candidate's processes stopped, the reference's runner not
            return paused(self.candidate, spare=(self.via.runner.pid,)), 0.0
        if self.side == "ref" and self.case.remote is not None:
            return paused(self.case.remote), pace or self.case.remote.runner.round_trip[0]
        return contextlib.nullcontext(), 0.0

    # -- a block of timed calls ------------------------------------------------------------------
    def run(self, warmup: int, trials: int, budget_s: float, pace: float = 0.0, of: int = 0) -> list[float]:
        """`trials` timed calls after `warmup` untimed ones (fewer when `budget_s` runs out), a block
        of `of` in all (the spot checks' rate is per side, not per block); the clock's `period` and
        `warmed` are this block's."""
        import torch

        clock, judge, case = self.clock, self.judge, self.case
        if self.backward_remote:
            from kfray.eval.suite.backward_side import time_backward

            ts, (_, _, self.last[0]) = time_backward(judge, clock, case, self.model, self.xs, self.seed, warmup,
                                                     trials, budget_s)
            return ts
        hold, pace = self._hold(pace)
        if judge.spec.direction == "backward":
            with hold:
                ts = clock.samples(self._call_backward, warmup, trials, self._before_backward, budget_s, pace=pace)
            self.last[0] = gradients(self.model, self.xs)
            return ts
        remote = self.remote
        with torch.no_grad():
            if remote is None:
                with hold:
                    return clock.samples(self._call, warmup, trials, self._clone_inputs if self.fresh else None,
                                         budget_s, pace=pace)
            # the runner's own times, held against the judge's clock
            log = remote.start_timing(max(trials, of), L2_FLUSH_BYTES if clock.flush_l2 else 0)
            remote.rotation, remote.check = self.rotation, self.check
            try:
                with hold:
                    ts = clock.samples(self._call, warmup, trials, None, budget_s, in_runner=True)
                if self.last[0] is not None and remote.check is not None:   # the last call's, on its own set
                    remote.check(remote.last_idx, remote.kept_outputs())
            finally:
                remote.stop_timing()
            self.last[0] = None
            pairs = log[-len(ts):]
            self.pairs += pairs
            self.copies += remote.copies
            self.costs.append((remote.overhead, remote.copy_s))
            return [c for _, c, _ in pairs]

    def check_clock(self, beside: "SideTimer | None" = None) -> None:
        """The outside clock over all of this side's blocks (kfray.eval.defences): a flag where the
        runner's claimed times cannot be its calls'. `beside`, the other side's runner, ran the
        same requests on the same inputs: what its requests cost beyond its calls is allowed here
        too (the flag is about times that are too short, so either side may set the other's floor)."""
        if self.remote is None or not self.pairs:
            return
        quiet = self.remote.runner.quiet_round_trip()
        overhead = statistics.median(o for o, _ in self.costs)
        copy_s = max(c for _, c in self.costs)
        why = clock_check(self.pairs, quiet, overhead, beside.pairs if beside is not None else None) or \
            copy_check(self.copies, copy_s, quiet)
        if why:
            whose = "the reference's runner (the kernel may have tampered with it): " if self.via else ""
            flag = f"configuration {self.case.name}: {whose}{why}"
            if flag not in self.judge.flags:
                self.judge.flags.append(flag)

    def drop(self) -> None:
        """Its model and input sets let go of, the last result kept: the other side's fit beside it."""
        self.model = self.xs = self.fresh = None
        self.rotation, self.check, self.state = [], None, {}

    def result(self) -> tuple[Any, Any, Any]:
        """(model, inputs, the last timed call's result): what check_timed compares."""
        return self.model, self.xs, self.last[0]


def compiled_reference(case, spec):
    """torch.compile(mode="max-autotune") of the reference, as robust-kbench's torch_eval builds it
    (of forward_fn) and KernelBench's ref timing does (of the model)."""
    import torch

    if spec.kind == RKB:
        fn = None

        def call(m, xs):
            nonlocal fn
            if fn is None:
                import inspect
                ref_fn = inspect.signature(m.forward).parameters["fn"].default
                fn = torch.compile(ref_fn, mode="max-autotune")
            return m(*xs, fn=fn)
        return call
    cache: dict = {}

    def call(m, xs):
        if "m" not in cache:
            cache["m"] = torch.compile(m, mode="max-autotune")
        return cache["m"](*xs)
    return call


def time_case(judge, clock, case, seed: int, side: str, warmup: int, trials: int, budget_s: float,
              compiled: bool = False, pace: float = 0.0) -> tuple[list[float], Any]:
    """Samples of one side on one configuration in one block, and its last result (to check)."""
    timer = SideTimer(judge, clock, case, seed, side, compiled)
    ts = timer.run(warmup, trials, budget_s, pace)
    timer.check_clock()
    return ts, timer.result()
