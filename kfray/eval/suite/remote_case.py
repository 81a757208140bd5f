"""The judge's side of a suite-form candidate that runs in its runner (kfray.eval.runner_torch).

The judge keeps its suite's cases as they are for the reference side (inputs, the reference
model and its call) and swaps the candidate side for proxies: `make_new` builds the candidate's
model in the runner after the same seed, `call_new` shares the inputs and maps the outputs back,
`prepare` puts a fresh input set where both processes see it. The judge's checks (suite/judge.py)
then run unchanged on tensors it owns or maps, and none of them executes a line of the candidate.
A backward task keeps its candidate model in the judge too (the judge's own parameters, which the
runner's model then uses): autograd through the kernel runs in the runner (suite/backward_side.py).
"""
from __future__ import annotations

import dataclasses
import itertools
import weakref

from kfray.eval import wire
from kfray.eval.suite.timed_calls import TimedCalls
from kfray.eval.tensor_wire import export_tensor, import_tensor
from kfray.tasks.suite_spec import suite_task_data

MAX_STATE = 100_000        # parameters and buffers of one candidate model, at most


def _runs_in_the_runner(model, xs):
    """The judge's candidate-side call of a backward task that runs apart: there is none here (the
    judge's copy of the task's AutogradFunction has no backward_fn: nothing of the candidate)."""
    raise RuntimeError("a backward kernel that runs in its runner was called in the judge")


class SharedInputs(list):
    """An input set the runner sees too, by its key there; when the judge lets go of it, so does
    the runner (full-size sets are many GiB: none may outlive its trial)."""

    key: str = ""


class RemoteModel:
    """The candidate's model in the runner, as far as the judge's checks look at a model."""

    def __init__(self, kernel: "RemoteKernel", key: str):
        self.kernel, self.key = kernel, key

    def named_parameters(self):
        return self.kernel.state(self.key)

    def named_buffers(self):
        return []


class RemoteKernel(TimedCalls):
    """A suite model in a runner. `side` "new": the candidate's (from `artifact`); "ref": the
    task's own reference, which the judge times in a runner of its own, so that both sides' calls
    go through the same process, wire and allocator (`reference`, made by the backend). With
    `post` the load is sent and its answer read at the first use (`ready`)."""

    def __init__(self, runner, artifact: str, task, device: str, arch: str = "", side: str = "new",
                 post: bool = False):
        self.runner, self.device = runner, device
        self.reference = None                            # the reference's RemoteKernel, when it has one
        self.reference_note = ""
        self.direction = task.suite.direction
        self._keys = itertools.count(1)
        self._dropped: list[str] = []                    # keys of input sets the judge let go of
        self._last: list[int] = []                       # runner output ids to release
        self.init_timing()
        self.pool = None                                 # the judge's tensors a CUDA runner maps
        self.sent: list[tuple[str, int]] = []            # their IPC reference counters
        if device == "cuda":
            import torch

            self.pool = torch.cuda.MemPool()
        # The suite's spec as data: the runner rebuilds its cases without loading the task again
        # (a KernelBench task's load traces its model: seconds, and torch ops a fork must not follow).
        data = suite_task_data(task)
        self.load_facts: dict = {}                       # the runner's own seconds: CUDA context, import
        self._load = runner.post({"op": "load_torch", "artifact": artifact, "spec": data["spec"],
                                  "param_args": data["param_args"], "device": device, "arch": arch, "side": side})
        runner.before_next = self.ready                  # whatever asks the runner next reads the load first
        if not post:
            self.ready()

    def ready(self) -> "RemoteKernel":
        """The load's answer read (once): the runner has its cases. Until then the judge does its own
        work (the candidate's runner opens its CUDA context and imports the file meanwhile)."""
        if self._load is not None:
            seq, self._load = self._load, None
            self.runner.before_next = None
            ans, _ = self.runner.answer(seq, timeout=max(120.0, self.runner.deadline_s), want_fds=False)
            for k in ("cuda_s", "import_s"):
                if isinstance(ans.get(k), (int, float)) and 0 <= ans[k] < 1e4:
                    self.load_facts[k] = round(float(ans[k]), 4)
        return self

    def reference_ready(self):
        """The reference's runner, loaded; None where there is none or it failed (the judge then
        times the reference itself, and `reference_note` says why)."""
        from kfray.eval.remote import RunnerFailed

        if self.reference is None:
            return None
        try:
            return self.reference.ready()
        except RunnerFailed as e:
            self.reference_note = f"the reference's runner failed ({str(e)[:200]})"
            self._end_reference()
            return None

    def _end_reference(self, collect: bool = True) -> None:
        """The reference's runner ended, and what the judge shared with it let go of."""
        ref, self.reference = self.reference, None
        if ref is not None:
            ref.runner.close()
            ref.runner_gone(collect)

    def case_for(self, case):
        """`case` with this runner's model, calls and inputs on its candidate side."""
        return dataclasses.replace(case, make_new=lambda i=case.index: self.build(i), call_new=self.call,
                                   prepare=self.share, remote=self)

    # -- the cases, with their candidate side in the runner -------------------------------------
    def cases(self, local: list) -> list:
        out = []
        for i, c in enumerate(local):
            if self.direction == "backward":     # the judge's own model; its autograd side runs in the runner
                out.append(dataclasses.replace(c, call_new=_runs_in_the_runner, prepare=self.share, remote=self,
                                               index=i))
                continue
            out.append(self.case_for(dataclasses.replace(c, index=i)))
        return out

    def build(self, case: int, seed: int | None = None) -> RemoteModel:
        """The candidate model of configuration `case`, made in the runner after the current seed
        (the judge passes the seed it set: the runner's generator is its own)."""
        from kfray.eval.suite.common import last_seed

        key = f"m{next(self._keys)}"
        self.runner.request({"op": "torch_build", "key": key, "case": case, "seed": last_seed()})
        return RemoteModel(self, key)

    def share(self, xs):
        """The input set where the runner sees it too: CPU tensors moved into shared memory (the
        judge uses the shared copies from now on), CUDA tensors shared as they are."""
        import torch

        seq = list(xs) if isinstance(xs, (list, tuple)) else [xs]
        items, fds, mine = [], [], []
        for x in seq:
            if isinstance(x, torch.Tensor):
                d, f, shared = export_tensor(x.detach() if not x.requires_grad else x, self.pool)
                if d.get("kind") == "cuda":
                    self.sent.append((d["rc"], d["rco"]))
                items.append({"t": d})
                fds += f
                mine.append(shared)
            else:
                items.append({"v": x if isinstance(x, (int, float, str, bool, type(None))) else str(x)})
                mine.append(x)
        key = f"x{next(self._keys)}"
        try:
            self.runner.request({"op": "torch_inputs", "key": key, "items": items, "drop": self._take_dropped()},
                                fds)
        finally:
            import os
            for fd in fds:
                os.close(fd)
        shared = SharedInputs(mine)
        shared.key = key
        weakref.finalize(shared, self._dropped.append, key)
        return shared

    def _take_released(self) -> list[int]:
        """Ids of the runner's outputs the judge mapped last, to let go of with the next request."""
        out, self._last = self._last, []
        return out

    def _take_dropped(self) -> list[str]:
        # Emptied in place: the finalizers of sets still alive append to this very list (a new list
        # here left every later drop in an orphan, and the runner mapping every set to the end).
        out = list(self._dropped)
        self._dropped.clear()
        return out

    def call(self, model: RemoteModel, xs):
        """One call in the runner: its outputs, mapped from the runner's memory. A timed call's
        outputs stay in the runner until its next call; the judge has them copied into slots it
        owns (set up from the first call) for the calls it checks, chosen after each call has
        answered, so no call can tell whether the judge will look. The timed calls of a memory-
        bound problem of 8 GiB a side then skip a copy as long as the kernel's own call."""
        idx = 0
        if self.timing and self.rotation:
            idx = self.calls % len(self.rotation)
            self.calls += 1
            xs = self.rotation[idx]
        self.last_idx = idx
        from kfray.eval.suite.common import last_seed

        req = {"op": "torch_call", "model": model.key, "inputs": xs.key, "fresh": self.timing,
               "release": self._last, "drop": self._take_dropped(),
               "seed": None if self.timing else last_seed()}   # the generator the judge just seeded
        if self.timing and self.flush_bytes:
            req["flush"] = self.flush_bytes
        self._last = []
        if self.timing and self.slots is not None:
            ans, fds = self._timed({**req, "slot": self.slots[0]})
            for fd in fds:
                import os
                os.close(fd)
            if "mismatch" in ans:
                raise wire.WireError(wire.text(ans["mismatch"], "mismatch", 200))
            if self.check is not None and self.rng.random() < self.sample_p:
                self.check(idx, self.kept_outputs())
            return tuple(self.slots[1])
        ans, fds = self._timed(req)
        outs = self._import(ans, fds, xs)
        if self.timing:
            self._make_slots(outs, xs)
        return tuple(outs)

    def _sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def _import(self, ans: dict, fds: list[int], xs) -> list:
        import torch

        descs = ans.get("outputs")
        if not isinstance(descs, list) or len(descs) > 256:
            raise wire.WireError("the runner's outputs are not a list of tensors")
        oid = ans.get("id")
        if isinstance(oid, int):
            self._last.append(oid)
        fds = list(fds)
        outs = []
        try:
            for d in descs:
                if not isinstance(d, dict):
                    raise wire.WireError("an output descriptor is not an object")
                if "alias" in d:                      # one of the judge's own inputs, viewed
                    src = xs[wire.integer(d["alias"], "aliased input", 0, len(xs) - 1)]
                    if not isinstance(src, torch.Tensor):
                        raise wire.WireError("an output names an input that is no tensor")
                    try:
                        outs.append(src.detach().as_strided(
                            [wire.integer(v, "dim", 0, 1 << 40) for v in d.get("shape", [])],
                            [wire.integer(v, "stride", 0, 1 << 44) for v in d.get("stride", [])],
                            wire.integer(d.get("offset", 0), "offset", 0, 1 << 44)))
                    except RuntimeError as e:
                        raise wire.WireError(f"an output view does not fit its input ({e})") from None
                    continue
                mine = [fds.pop(0)] if d.get("kind") == "cpu" and fds else []
                outs.append(import_tensor(d, mine, self.device))
        finally:
            import os
            for fd in fds:
                os.close(fd)
        return outs

    def state(self, key: str) -> list:
        """(name, tensor) of the candidate model's parameters and buffers, mapped from the runner."""
        out: list = []
        while True:                  # a page at a time: a ResNet's state does not fit one answer
            ans, fds = self.runner.request_fds({"op": "torch_state", "model": key, "start": len(out)})
            names = ans.get("names")
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise wire.WireError("the runner's state names are not a list of strings")
            tensors = self._import(ans, fds, [])
            if len(tensors) != len(names):
                raise wire.WireError("the runner's state names and tensors do not match")
            out += zip(names, tensors)
            if not names or not ans.get("more") or len(out) > MAX_STATE:
                return out

    def set_state(self, model: RemoteModel, state: dict) -> None:
        """Copy the judge's tensors into the candidate model's state of the same names."""
        names = list(state)
        shared = self.share([t.detach() for t in state.values()])
        self.runner.request({"op": "torch_set_state", "model": model.key, "names": names, "inputs": shared.key})

    def probe(self, model: RemoteModel, xs) -> tuple[list, list] | tuple[None, None]:
        """The stream probe's two calls, run in the runner (kfray.eval.suite.stream_probe)."""
        ans, fds = self.runner.request_fds({"op": "torch_probe", "model": model.key, "inputs": xs.key})
        n = wire.integer(ans.get("n", 0), "probe outputs", 0, 128)
        if not n:
            return None, None
        outs = self._import(ans, fds, xs)
        return outs[:n], outs[n:]

    def let_go(self, give_back: bool = True) -> dict:
        """The runner drops the input sets and outputs the judge no longer holds and (`give_back`)
        empties its cache of device memory; what it says it still holds (figures for the log,
        never a verdict)."""
        if self.reference is not None and self.reference._load is None:
            self.reference.let_go(give_back)
        if self._load is not None:             # still loading: it holds nothing the judge shared
            return {}
        ans = self.runner.request({"op": "torch_release", "ids": self._last, "drop": self._take_dropped(),
                                   "settle": give_back})
        self._last = []
        out = {}
        for k in ("allocated", "reserved"):
            if isinstance(ans.get(k), int) and 0 <= ans[k] < 1 << 50:
                out[f"runner_{k}_gib"] = round(ans[k] / 2**30, 2)
        return out

    def runner_gone(self, collect: bool = True) -> None:
        """The runner is dead: the judge's memory it mapped is the judge's to free. torch keeps a
        shared CUDA block until its receiver lowers the block's IPC counter, which a killed runner
        never does; the judge lowers them itself (once for each time it shared a block with it),
        then gives the pool and its cached blocks back to the device for the next runner (`collect`:
        once for both runners of a job)."""
        self._end_reference(collect=False)     # the reference's runner ends with the candidate's
        if self.device != "cuda":
            return
        import gc

        import torch

        self.rotation, self.slots, self.check = [], None, None
        sent, self.sent = self.sent, []
        for rc, rco in sent:
            try:
                torch.UntypedStorage._release_ipc_counter_cuda(rc.encode(), rco)
            except (RuntimeError, TypeError):     # the counter file is gone with its last block
                pass
        self.pool = None
        if collect:
            gc.collect()
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()
