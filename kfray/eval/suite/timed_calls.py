"""The timed calls of a candidate in its runner (the judge's side, mixed into
kfray.eval.suite.remote_case.RemoteKernel): fresh inputs per call, the runner's own times logged
beside the judge's clock, and the outputs of the calls the judge checks, chosen at random after
each call has answered, copied into slots the judge owns."""
from __future__ import annotations

import random
import time

from kfray.eval import wire

SAMPLED_CALLS = 8          # timed calls per configuration whose outputs the judge keeps to check


class TimedCalls:
    """The timing half of a RemoteKernel, which gives it `runner`, `share`, `_sync` and `call`."""

    def init_timing(self) -> None:
        self.timing = False                              # fresh inputs per call, outputs sampled
        self.slots = None                                # (runner key, judge tensors) of timed outputs
        self.check = None                                # (input set, outputs) -> raises when wrong
        self.call_limit = None                           # (seconds, factor, reference seconds) of one call
        self.rotation: list = []                         # input sets timed calls alternate
        self.calls = 0
        self.last_idx = 0
        self.overhead = 0.0
        self.copies: list[float] = []                    # seconds of each checked call's output copy
        self.copy_s = 0.0                                # what such a copy costs, as the judge measured it
        self.flush_bytes = 0                             # the L2 flush the runner makes before each timed call
        self.rng = random.Random()

    def start_timing(self, trials: int, flush_bytes: int = 0) -> list:
        """From now on every call gets fresh input tensors and some calls' outputs are kept; the
        log of (judge's seconds, claimed seconds) per call, emptied. With flush_bytes the runner
        writes that many bytes before each timed call on its own stream, as KernelBench does in its
        process (the judge's flush, in another CUDA context, left the candidate's launches no head
        start: 12_Matmul_with_diagonal_matrices measured 0.68x against itself on the H200)."""
        self.timing, self.slots, self.overhead, self.calls = True, None, 0.0, 0
        self.copies, self.copy_s = [], 0.0
        self.flush_bytes = int(flush_bytes)
        self.sample_p = min(1.0, SAMPLED_CALLS / max(1, trials))
        self.runner.log.clear()
        return self.runner.log

    def stop_timing(self) -> list:
        self.timing, self.slots, self.rotation, self.check = False, None, [], None

    def kept_outputs(self) -> list:
        """The last timed call's outputs, copied by the runner into the judge's slots. The copy's
        round trip is logged (`copies`): a kernel that finishes its work only when its outputs
        are asked for makes it slow (kfray.eval.defences.copy_check)."""
        t0 = time.perf_counter()
        ans = self.runner.request({"op": "torch_copy_kept"})
        self.copies.append(time.perf_counter() - t0)
        if not ans.get("ok"):
            raise wire.WireError("the runner kept no outputs of its last timed call")
        return list(self.slots[1])

    def _make_slots(self, outs: list, xs) -> None:
        """Output slots shaped like the first timed call's outputs, shared with the runner, and
        what the runner's part of a timed call outside the kernel costs here (its warm-up spin, a
        clone of the inputs, the L2 flush), which the outside clock allows for, and a copy into
        the slots (`copy_s`), which a checked call's copy is held to."""
        import torch

        from kfray.eval.suite.common import WARM_SPIN_S, flush_l2

        slots = [torch.empty_like(o.detach()) for o in outs]
        shared = self.share(slots)
        self.slots = (shared.key, shared)
        best, best_copy = float("inf"), float("inf")
        for _ in range(3):
            self._sync()
            t0 = time.perf_counter()
            copies = [x.clone() for x in xs if isinstance(x, torch.Tensor)]
            if self.flush_bytes:
                flush_l2(self.flush_bytes)
            self._sync()
            t1 = time.perf_counter()
            for s, o in zip(shared, outs):
                s.copy_(o.detach())
            self._sync()
            best, best_copy = min(best, t1 - t0), min(best_copy, time.perf_counter() - t1)
            del copies
        self.overhead, self.copy_s = best + WARM_SPIN_S, best_copy

    def _timed(self, req: dict):
        from kfray.eval.remote import RunnerFailed

        limit = self.call_limit[0] if self.call_limit else None
        try:
            return self.runner.timed(req, timeout=limit)
        except RunnerFailed as e:
            if self.call_limit and str(e).startswith("timeout: no result"):
                lim, factor, ref_s = self.call_limit
                raise RunnerFailed(f"timeout: one call of the kernel took over {lim:.3g} s, more than {factor:g}x its "
                                   f"reference's {ref_s:.3g} s (eval.slow_factor) [kfray rule: time limit sized to the "
                                   "reference]") from None
            raise
