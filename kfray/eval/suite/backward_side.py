"""The candidate side of a robust-kbench backward check: `out = model(*xs, fn=AutogradFunction.apply)`,
then `out.backward(g)`, with the kernel installed as the AutogradFunction's `backward_fn`.

Where the candidate has a runner (kfray.eval.runner_torch), this side runs there, and the judge
never imports the extension: the runner builds the Model from the task's func_backward.py (task
code, trusted) after the judge's seed and installs the kernel in its own copy of the task. The
judge keeps all its verdict rests on: the inputs, the parameters (its own Model, built after the
same seed; the runner's Model takes that state as its own, shared, so a write to it is seen), the
upstream gradient `g`, the reference and every comparison. What comes back (the output, whose
shape `g` takes, and each `.grad`) is read from shared memory, and the gradients' names must be
ones the judge's own model and inputs allow. `LocalSide` is the same side in the judge's process,
for a candidate loaded there.
"""
from __future__ import annotations

import time
import weakref

from kfray.candidate import TIER_RUNTIME_ERROR
from kfray.eval import wire
from kfray.eval.defences import clock_check
from kfray.eval.suite.common import Verdict, gradients, set_seed, state_of


class LocalSide:
    """The kernel in this process (a candidate the judge loaded itself)."""

    def __init__(self, case, model, xs):
        self.case, self.model, self.xs, self.out = case, model, xs, None

    def forward(self):
        self.model.zero_grad()
        self.out = self.case.call_new(self.model, self.xs)
        return self.out

    def backward(self, g) -> None:
        self.out.backward(g)

    def grads(self) -> dict:
        return gradients(self.model, self.xs)


class RemoteSide:
    """The kernel's side in the runner, on the judge's model state, inputs and upstream gradient."""

    def __init__(self, remote, case, model, xs, seed: int):
        """`model`: the judge's own, just built after set_seed(seed); `xs`: an input set shared
        with the runner (case.prepare). The runner builds its model after the same seed (so its
        forward draws what the judge's would) and takes the judge's state in place of its own."""
        import torch

        self.remote, self.xs, self.seed = remote, xs, seed
        state = state_of(model)
        shared = remote.share([t.detach() for t in state.values()])
        with torch.no_grad():
            for t, s in zip(state.values(), shared):
                t.data = s.detach()          # the judge's model now lives in the memory the runner's uses
        self.state = shared
        self.allowed = {f"param_{n}" for n, _ in model.named_parameters()} | {f"input_{i}" for i in range(len(xs))}
        self.key = f"b{next(remote._keys)}"
        remote.runner.request({"op": "torch_bw_bind", "key": self.key, "case": case.index, "seed": int(seed),
                               "names": list(state), "state": shared.key, "inputs": xs.key,
                               "drop": remote._take_dropped()})
        weakref.finalize(self, remote._dropped.append, self.key)
        self._g = None                      # (the judge's upstream gradient, its shared copy)
        self.got: dict = {}
        self.slots, self.names, self.overhead = None, [], 0.0

    def _limit(self):
        return self.remote.call_limit[0] if self.remote.call_limit else None

    def forward(self, fresh: bool = False, want: bool = True):
        """zero_grad and the forward in the runner (task code, untimed); its output, for `g`'s
        shape, when `want`. The runner then draws as the judge does for `g` (set_seed(seed),
        randn_like(out)), so its generator stands where the judge's would for the kernel."""
        req = {"op": "torch_bw_forward", "model": self.key, "fresh": bool(fresh), "want": bool(want),
               "redraw": int(self.seed), "release": self.remote._take_released(),
               "drop": self.remote._take_dropped()}
        ans, fds = self.remote.runner.request_fds(req, timeout=self._limit())
        if not want:
            _close(fds)
            return None
        outs = self.remote._import(ans, fds, self.xs)
        if len(outs) != 1 or not outs[0].is_floating_point():
            raise wire.WireError("the runner's forward did not give one floating-point output")
        return outs[0]

    def backward(self, g) -> None:
        """`out.backward(g)` in the runner, its claimed time logged beside the judge's clock. Once
        slots are kept (timing), the runner copies the gradients into them instead of sharing."""
        if self._g is None or self._g[0] is not g:
            self._g = (g, self.remote.share([g.detach()]))
        req = {"op": "torch_backward", "model": self.key, "grad": self._g[1].key,
               "release": self.remote._take_released(), "drop": self.remote._take_dropped()}
        if self.slots is not None:
            req.update(slot=self.slots.key, names=self.names)
        ans, fds = self.remote._timed(req)
        if self.slots is not None:
            _close(fds)
            if "mismatch" in ans:
                raise Verdict(TIER_RUNTIME_ERROR, "the backward kernel's gradients changed names, shapes or types "
                              "between timed calls")
            self.got = dict(zip(self.names, self.slots))
            return
        names = ans.get("names")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names) \
                or len(set(names)) != len(names) or not set(names) <= self.allowed:
            _close(fds)
            raise wire.WireError("the runner's gradient names are not ones of the judge's parameters and inputs")
        grads = self.remote._import(ans, fds, self.xs)
        if len(grads) != len(names):
            raise wire.WireError("the runner's gradient names and tensors do not match")
        self.got = dict(zip(names, grads))

    def grads(self) -> dict:
        return self.got

    def keep_in_slots(self, sync) -> None:
        """From now on each call's gradients are copied by the runner into tensors the judge owns
        (every timed call pays the same copy), and what that copy and the runner's warm-up spin
        cost here, which the outside clock allows for."""
        import torch

        from kfray.eval.suite.common import WARM_SPIN_S

        got = self.got
        slots = self.remote.share([torch.empty_like(t) for t in got.values()])
        best = float("inf")
        for _ in range(3):
            sync()
            t0 = time.perf_counter()
            for s, t in zip(slots, got.values()):
                s.copy_(t)
            sync()
            best = min(best, time.perf_counter() - t0)
        self.slots, self.names, self.overhead = slots, list(got), best + WARM_SPIN_S


def kernel_side(case, model, xs, seed: int):
    """The candidate side of one backward trial: in its runner where the case has one, else here."""
    if case.remote is not None:
        return RemoteSide(case.remote, case, model, xs, seed)
    return LocalSide(case, model, xs)


def time_backward(judge, clock, case, model, xs, seed: int, warmup: int, trials: int, budget_s: float):
    """The kernel's backward timed in its runner, as kfray.eval.suite.timing times it here: per
    call, zero_grad and the forward untimed (on fresh input tensors), then `out.backward(g)` timed,
    with one `g` for every call (set_seed(seed), randn_like of the first output: what the suite's
    draw gives each call, however many calls a side makes). The claimed times count once the
    judge's clock accounts for them. (samples, (model, inputs, the last call's gradients))."""
    import torch

    side = RemoteSide(case.remote, case, model, xs, seed)
    runner = case.remote.runner
    g: list = []

    def before():
        out = side.forward(fresh=True, want=not g)
        if not g:
            set_seed(seed)
            g.append(torch.randn_like(out))

    def call():
        side.backward(g[0])
        if side.slots is None:        # the first (warm-up) call's gradients shape the slots
            side.keep_in_slots(judge.sync)

    def timed() -> tuple[list, list]:
        runner.log.clear()
        ts = clock.samples(call, warmup, trials, before, budget_s)
        return ts, runner.log[-len(ts):]

    ts, pairs = timed()
    extra = request_overhead(judge, case, model, xs, g[0]) if g else 0.0
    why = clock_check(pairs, runner.quiet_round_trip(), max(side.overhead, extra))
    if why:
        # a second look, whose times then count: a burst of load on the host passes, a patched clock
        # does not (an honest backward under load was flagged once in about five runs of the suite)
        ts, pairs = timed()
        why = clock_check(pairs, runner.quiet_round_trip(), max(side.overhead, extra))
    if why:
        judge.flags.append(f"configuration {case.name}: {why}")
    return [c for _, c, _ in pairs], (model, xs, dict(side.grads()))


_NODE: list = []


def _python_node(x):
    """`x` behind an identity autograd node written in Python, as the task's AutogradFunction is:
    its backward runs Python on the autograd engine's device thread, as the kernel's side does."""
    if not _NODE:
        import torch

        class Identity(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                return t.view_as(t)

            @staticmethod
            def backward(ctx, grad):
                return grad

        _NODE.append(Identity)
    return _NODE[0].apply(x)


def request_overhead(judge, case, model, xs, g, reps: int = 5) -> float:
    """What an honest backward request costs beyond its claimed time, measured by the judge doing
    the same on the reference (the task's own forward_fn, with autograd, behind a Python autograd
    node as the kernel's side has) on a copy of the model: the autograd engine's start before the
    first kernel reaches the GPU, which CUDA events do not see (240 us of a 590 us call on an H200
    for a tiny linear layer), then collecting every .grad and copying it out. Without it an honest
    tiny backward was taken for a patched clock."""
    import copy

    import torch

    cuda = judge.device == "cuda"
    model = copy.deepcopy(model)        # its own state: the runner's model shares the original's
    gaps, outs = [], []
    if cuda:                            # made once, as the runner's are
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        xr = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
              for x in xs]
        model.zero_grad()
        with torch.enable_grad():
            out = _python_node(case.call_ref(model, xr))
        judge.sync()
        t0 = time.perf_counter()
        if cuda:
            start.record()
            out.backward(g)
            stop.record()
            stop.synchronize()
            gaps.append(max(0.0, time.perf_counter() - t0 - start.elapsed_time(stop) / 1e3))
        else:
            out.backward(g)
            gaps.append(0.0)
        t1 = time.perf_counter()
        with torch.no_grad():
            for t in gradients(model, xr).values():
                torch.empty_like(t).copy_(t)
        judge.sync()
        outs.append(time.perf_counter() - t1)
    from kfray.eval.suite.common import WARM_SPIN_S

    return sorted(gaps)[reps // 2] + sorted(outs)[reps // 2] + WARM_SPIN_S


def _close(fds) -> None:
    import os

    for fd in fds:
        os.close(fd)
