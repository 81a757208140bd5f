"""The suite forms in a candidate's runner: a KernelBench ModelNew, or a PyTorch extension run
through its suite's model, built and called here on tensors the judge shares
(kfray.eval.tensor_wire). The runner makes no input and runs no reference: the judge does both,
in its own process, and compares what comes back.

Requests: `load_torch` (the kernel and the task's cases), `torch_build` (a candidate model after
the suite's seed), `torch_inputs` (an input set, shared), `torch_call` (one call: its claimed time
and its outputs, shared), `torch_state` (the model's parameters and buffers, shared),
`torch_probe` (the stream probe's call with the current stream held), `torch_copy_kept` (the
last timed call's outputs into the judge's slots), `torch_release`; for a
robust-kbench backward task, `torch_bw_bind` (the candidate side's model on the judge's state),
`torch_bw_forward` (its forward through the task's AutogradFunction) and `torch_backward`
(`out.backward(g)` with the judge's `g`: its claimed time and every `.grad`, shared).
"""
from __future__ import annotations

import itertools
import time

from kfray.eval import wire
from kfray.eval.tensor_wire import export_tensor, import_tensor

STATE_PAGE = 48            # parameters and buffers per answer: their descriptors fit the wire's cap
MAX_FLUSH_BYTES = 1 << 30  # the L2 flush before a timed call, at most


class TorchSide:
    def __init__(self, runner):
        self.runner = runner
        self.models: dict[str, tuple] = {}           # key -> (case, model)
        self.bound: dict[str, dict] = {}             # key -> a backward side: case, model, its inputs, pending output
        self._events = None                          # the timed calls' CUDA events (first record, inside the span)
        self.sets: dict[str, list] = {}              # key -> inputs as the judge shared them
        self.held: dict[int, list] = {}              # output id -> tensors the judge may be mapping
        self._ids = itertools.count(1)
        self.device = "cpu"
        self.cases: list = []
        self.kept = None                             # (outputs, the judge's slots) of the last timed call
        self.heap_settled = False

    def handle(self, op: str, req: dict, fds: list[int]) -> tuple[dict, list[int]]:
        for key in req.get("drop", []):          # input sets (and backward sides) the judge let go of
            self.sets.pop(str(key), None)
            self.bound.pop(str(key), None)
        for i in req.get("release", []):         # outputs the judge no longer maps
            self.held.pop(int(i), None)
        try:
            return getattr(self, op)(req, fds)
        except Exception as e:
            import traceback

            msg = str(e).strip().splitlines()
            return {"error": f"{type(e).__name__}: {msg[0][:600] if msg else ''}\n"
                             f"{traceback.format_exc(limit=3)[-600:]}"}, []

    # -- requests -------------------------------------------------------------------------------
    def load_torch(self, req: dict, fds) -> tuple[dict, list]:
        import torch

        from kfray.eval.suite_loading import load_suite_kernel
        from kfray.eval.suite.runners import runner_for
        from kfray.tasks.suite_spec import suite_task

        t0 = time.perf_counter()
        self.device = req["device"]
        if self.device == "cuda":
            torch.cuda.set_device(0)
            torch.cuda.synchronize()                      # the context made now, not at the first call
        t1 = time.perf_counter()
        torch.backends.cuda.matmul.allow_tf32 = False     # the judge's defaults; the candidate may change its own
        torch.backends.cudnn.allow_tf32 = False
        task = suite_task({"spec": req["spec"], "param_args": req.get("param_args", {})})
        self.spec = task.suite
        if req.get("side") == "ref":      # the task's own reference as this runner's model: no kernel here
            import dataclasses

            self.cases = [dataclasses.replace(c, make_new=c.make_ref, call_new=c.call_ref)
                          for c in runner_for(task.suite, None, task).cases()]
        else:
            kernel = load_suite_kernel(req["artifact"], task, req.get("arch", ""))
            self.cases = runner_for(task.suite, kernel, task).cases()
        return {"cases": len(self.cases), "cuda_s": t1 - t0, "import_s": time.perf_counter() - t1}, []

    def torch_build(self, req: dict, fds) -> tuple[dict, list]:
        from kfray.eval.suite.common import making, set_seed, to_module

        case = self.cases[int(req["case"])]
        with making(self.spec, self.device):
            if req.get("seed") is not None:
                set_seed(int(req["seed"]))
            model = to_module(case.make_new(), self.device)
        self.models[str(req["key"])] = (case, model)
        return {"ok": True}, []

    def torch_inputs(self, req: dict, fds: list[int]) -> tuple[dict, list]:
        fds = list(fds)
        xs = []
        for item in req["items"]:
            if "t" in item:
                d = item["t"]
                mine = [fds.pop(0)] if d.get("kind") == "cpu" else []
                xs.append(import_tensor(d, mine, self.device))     # the tensor keeps its mapping
            else:
                xs.append(item.get("v"))
        self.sets[str(req["key"])] = xs
        return {"ok": True}, []

    def _timed(self, fn, flush: int = 0) -> tuple[float, object]:
        """(seconds, fn()): CUDA events around the call on the GPU, after an L2 flush of `flush`
        bytes queued first (KernelBench's order: sync, flush, start, call), else perf_counter. The
        thread has just woken from the wire: it spins first, as the judge's paced calls do
        (kfray.eval.suite.common.WARM_SPIN_S)."""
        from kfray.eval.suite.common import WARM_SPIN_S

        until = time.perf_counter() + WARM_SPIN_S
        while time.perf_counter() < until:
            pass
        if self.device != "cuda":
            t0 = time.perf_counter()
            res = fn()
            return time.perf_counter() - t0, res
        import torch

        if self._events is None:          # made once, as the judge's are: an event is created at its
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        start, stop = self._events
        if flush:
            from kfray.eval.suite.common import flush_l2

            flush_l2(flush)
        start.record()
        res = fn()
        stop.record()
        stop.synchronize()
        s = start.elapsed_time(stop) / 1e3
        torch.cuda.synchronize()
        return s, res

    def _sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def torch_call(self, req: dict, fds) -> tuple[dict, list]:
        import torch

        from kfray.eval.suite.common import outputs

        case, model = self.models[str(req["model"])]
        xs = self.sets[str(req["inputs"])]
        self.kept = None                  # the last timed call's outputs: gone before this call makes its own
        if req.get("seed") is not None:   # the judge seeded its generator before this call
            from kfray.eval.suite.common import set_seed

            set_seed(int(req["seed"]))
        if req.get("fresh"):              # new tensors every call: nothing to memoise by identity
            xs = [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]
            self._settle_heap()
        self._sync()
        flush = wire.integer(req.get("flush", 0), "flush bytes", 0, MAX_FLUSH_BYTES) if self.device == "cuda" else 0
        with torch.no_grad():
            s, res = self._timed(lambda: case.call_new(model, xs), flush)
        outs = outputs(res, "the kernel")
        if req.get("slot") is None:
            return self._export(outs, self.sets[str(req["inputs"])], {"s": s})
        slot = self.sets[str(req["slot"])]         # a timed call: outputs kept until the next, for the judge to ask
        if len(outs) != len(slot) or any(o.shape != t.shape or o.dtype != t.dtype for o, t in zip(outs, slot)):
            return {"s": s, "mismatch": "the kernel's outputs changed shape or type between calls"}, []
        self.kept = (outs, slot)
        return {"s": s}, []

    def _settle_heap(self) -> None:
        """Once, before the first timed call: the heap collected and frozen, so that the collector's
        full passes during the timed calls walk only what the calls themselves make. The heaps of
        the two sides' runners differ by what the judge ran in each (the stream probe imports CuPy
        in the candidate's): a full pass over the larger one fell inside one block of timed calls
        in every run (48_Mamba2ReturnY, an H100: a block of 10 calls at 26-28 ms a call against
        9.7 ms, 0.85x against itself)."""
        if not self.heap_settled:
            import gc

            gc.collect()
            gc.freeze()
            self.heap_settled = True

    def torch_copy_kept(self, req: dict, fds) -> tuple[dict, list]:
        """The last timed call's outputs copied into the judge's slots. The judge asks after the
        call has answered, for the calls it checks: no call can tell beforehand whether it will be
        looked at, and the others skip a copy as large as their outputs."""
        import torch

        if self.kept is None:
            return {"error": "no timed call's outputs are kept"}, []
        outs, slot = self.kept
        self._sync()
        with torch.no_grad():
            for o, t in zip(outs, slot):
                t.copy_(o)
        self._sync()
        return {"ok": True}, []

    def torch_state(self, req: dict, fds) -> tuple[dict, list]:
        from kfray.eval.suite.judge import state_of

        _, model = self.models[str(req["model"])]
        state = list(state_of(model).items())
        start = int(req.get("start", 0))
        page = state[start:start + STATE_PAGE]
        return self._export([t.detach() for _, t in page], [], {"names": [n for n, _ in page],
                                                               "more": start + STATE_PAGE < len(state)})

    def torch_set_state(self, req: dict, fds) -> tuple[dict, list]:
        import torch

        from kfray.eval.suite.judge import plain_name, state_of

        _, model = self.models[str(req["model"])]
        given = dict(zip(req["names"], self.sets[str(req["inputs"])]))
        with torch.no_grad():
            for n, t in state_of(model).items():
                r = given.get(plain_name(n))
                if r is not None and r.shape == t.shape and r.dtype == t.dtype:
                    t.copy_(r.to(t.device))
        return {"ok": True}, []

    def torch_probe(self, req: dict, fds) -> tuple[dict, list]:
        """The stream probe's two calls (kfray.eval.suite.stream_probe), their outputs shared."""
        from kfray.eval.suite.stream_probe import probe_calls

        case, model = self.models[str(req["model"])]
        first, got = probe_calls(case, model, self.sets[str(req["inputs"])])
        if first is None:
            return {"n": 0}, []
        return self._export(list(first) + list(got), [], {"n": len(first)})

    def torch_release(self, req: dict, fds) -> tuple[dict, list]:
        """Outputs the judge no longer maps let go of; with `settle`, this process's cached device
        memory given back too (the judge's next step may need it), and what it still holds."""
        for i in req.get("ids", []):
            self.held.pop(int(i), None)
        self.kept = None
        if self.device != "cuda":
            return {"ok": True}, []
        import torch

        torch.cuda.synchronize()
        torch.cuda.ipc_collect()
        if req.get("settle"):
            torch.cuda.empty_cache()
        return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}, []

    # -- robust-kbench backward: autograd through the kernel, here -------------------------------
    def torch_bw_bind(self, req: dict, fds) -> tuple[dict, list]:
        """The candidate side's model of a configuration, built after the judge's seed as the judge
        built its own, with the judge's shared parameters and buffers in place of its own."""
        import torch

        from kfray.eval.suite.common import making, set_seed, state_of, to_module

        case = self.cases[int(req["case"])]
        with making(self.spec, self.device):
            set_seed(int(req["seed"]))
            model = to_module(case.make_new(), self.device)
        given = dict(zip(req["names"], self.sets[str(req["state"])]))
        mine = state_of(model)
        if set(mine) != set(given):
            raise ValueError(f"the judge's model state {sorted(given)[:8]} is not this model's {sorted(mine)[:8]}")
        with torch.no_grad():
            for n, t in mine.items():
                if given[n].shape != t.shape or given[n].dtype != t.dtype:
                    raise ValueError(f"the judge's {n} is not shaped as this model's")
                t.data = given[n]
        self.bound[str(req["key"])] = {"case": case, "model": model, "inputs": str(req["inputs"]), "out": None}
        return {"ok": True}, []

    def torch_bw_forward(self, req: dict, fds) -> tuple[dict, list]:
        """zero_grad and the forward through the task's AutogradFunction (`fresh`: on new input
        tensors, nothing to memoise by address); then the judge's draw for `g` made here too
        (`redraw`), so that the kernel sees the generator where the suite leaves it."""
        import torch

        from kfray.eval.suite.common import set_seed

        b = self.bound[str(req["model"])]
        b["out"] = None
        xs = self.sets[b["inputs"]]
        if req.get("fresh"):
            xs = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
                  for x in xs]
        for x in xs:
            if isinstance(x, torch.Tensor):
                x.grad = None
        b["model"].zero_grad()
        with torch.enable_grad():
            out = b["case"].call_new(b["model"], xs)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"the task's forward returned {type(out).__name__}, not a tensor")
        b["out"], b["xs"] = out, xs
        if req.get("redraw") is not None:
            set_seed(int(req["redraw"]))
            torch.randn_like(out)
        self._sync()
        if not req.get("want"):
            return {"ok": True}, []
        return self._export([self._own(out.detach())], self.sets[b["inputs"]], {})

    def torch_backward(self, req: dict, fds) -> tuple[dict, list]:
        """`out.backward(g)`, timed as the suite times it; every `.grad` of the parameters, then of
        the inputs (robust-kbench's collect_gradients), shared, or copied into the judge's slots."""
        import torch

        b = self.bound[str(req["model"])]
        out, xs, b["out"] = b["out"], b.get("xs", []), None
        if out is None:
            raise RuntimeError("a backward with no forward before it")
        g = self.sets[str(req["grad"])][0]
        self._sync()
        s, _ = self._timed(lambda: out.backward(g))
        grads = [(f"param_{n}", p.grad) for n, p in b["model"].named_parameters() if p.grad is not None]
        grads += [(f"input_{i}", x.grad) for i, x in enumerate(xs) if getattr(x, "grad", None) is not None]
        names, ts = [n for n, _ in grads], [t.detach() for _, t in grads]
        if req.get("slot") is None:
            return self._export([self._own(t) for t in ts], self.sets[b["inputs"]], {"s": s, "names": names})
        slot = self.sets[str(req["slot"])]
        if names != req.get("names") or any(t.shape != d.shape or t.dtype != d.dtype for t, d in zip(ts, slot)):
            return {"s": s, "mismatch": "the gradients changed between calls"}, []
        with torch.no_grad():
            for t, d in zip(ts, slot):
                d.copy_(t)
        self._sync()
        return {"s": s}, []

    def _own(self, t):
        """`t`, or on CUDA a copy where it lives in memory the judge shared (torch cannot share a
        received allocation on)."""
        import torch

        if self.device != "cuda":
            return t
        ptr = t.untyped_storage().data_ptr()
        for xs in self.sets.values():
            if any(isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() == ptr for x in xs):
                return t.clone()
        return t

    # -- outputs out ------------------------------------------------------------------------------
    def _export(self, outs: list, inputs: list, ans: dict) -> tuple[dict, list]:
        """Each output shared with the judge (or named as one of its inputs when it is one)."""
        import torch

        descs, fds_out, hold = [], [], []
        ptrs = {x.untyped_storage().data_ptr(): i for i, x in enumerate(inputs)
                if isinstance(x, torch.Tensor) and x.untyped_storage().nbytes()}
        for t in outs:
            p = t.untyped_storage().data_ptr() if t.untyped_storage().nbytes() else None
            if p in ptrs and t.device.type == "cpu":
                descs.append({"alias": ptrs[p], "dtype": str(t.dtype).removeprefix("torch."),
                              "shape": list(t.shape), "stride": list(t.stride()), "offset": int(t.storage_offset())})
                continue
            d, f, shared = export_tensor(t.detach())
            descs.append(d)
            fds_out += f
            hold.append(shared)
            hold.append(t)
        oid = next(self._ids)
        self.held[oid] = hold
        ans.update(outputs=descs, id=oid)
        if len(wire.encode(ans)) > 60000:
            raise ValueError("too many outputs to describe")
        return ans, fds_out
