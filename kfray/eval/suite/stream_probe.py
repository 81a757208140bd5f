"""The stream contract for PyTorch-form kernels (extensions, ModelNew): all work ordered on the
caller's current stream, the stream the suites' CUDA events time.

Events on that stream cannot see work elsewhere, so such a kernel would look free. The probe runs
the kernel once more with the current stream held by a spinning kernel (`StreamHold`, in
kfray/eval/backends/cuda/probe.py) and the floating inputs poisoned with NaN, their restore queued
behind the hold: a kernel whose work is ordered on the stream sees the restored inputs and gives
the unhurried result; one that works on another stream reads the poison meanwhile and gives
something else. A kernel that synchronizes inside waits out the hold's timeout instead, and gets
no verdict from the probe.
"""
from __future__ import annotations

import time

from kfray.tasks.suite_spec import SUITE_SEED

PROBE_HOLD_S = 0.5
PROBE_WAIT_S = 0.005
CONTRACT = ("launch all work on the current stream (at::cuda::getCurrentCUDAStream()), or order other "
            "streams after it and join them back before returning")


_HOLD: list = []


def _stream_hold():
    """The process's StreamHold (built once), or None where NVRTC / CuPy cannot build one."""
    if not _HOLD:
        try:
            import cupy as cp

            from kfray.eval.backends.cuda.probe import StreamHold
            _HOLD.append(StreamHold.create(cp))
        except ImportError:
            _HOLD.append(None)
    return _HOLD[0]


def probe_calls(case, model, xs) -> tuple[list | None, list | None]:
    """The kernel's result unhurried, then with the current stream held and its floating inputs
    restored behind the hold; (None, None) when the probe cannot tell. Runs where the candidate
    runs (its runner, or the judge on the in-process path)."""
    import torch

    from kfray.eval.suite.common import outputs, set_seed, tensors

    hold = _stream_hold()
    if hold is None:
        return None, None
    import cupy as cp

    with torch.no_grad():
        # Both calls draw the same random numbers (a kernel with dropout in training mode gives
        # each unseeded call its own result, which is no sign of another stream).
        set_seed(SUITE_SEED)
        first = [o.clone() for o in outputs(case.call_new(model, xs), "the kernel")]
        torch.cuda.synchronize()
        floats = [x for x in tensors(xs) if x.is_floating_point()]
        if not floats:
            return None, None
        saved = [x.clone() for x in floats]
        for x in floats:
            x.fill_(float("nan"))
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        set_seed(SUITE_SEED)           # before the hold: nothing in it may wait for the device
        hold.arm(cp.cuda.ExternalStream(stream.cuda_stream), PROBE_HOLD_S)
        try:
            for x, s in zip(floats, saved):
                x.copy_(s, non_blocking=True)           # queued behind the hold
            out = case.call_new(model, xs)
            time.sleep(PROBE_WAIT_S)
        finally:
            hold.release()
        torch.cuda.synchronize()
        if hold.timed_out():
            return None, None
        return first, outputs(out, "the kernel")


def probe_case(backend, judge, case) -> str | None:
    """None when the kernel keeps the contract (or the probe cannot tell); else the reason."""
    import torch

    from kfray.eval.suite.common import all_close, making, set_seed, to_device, to_module

    dev = backend.device
    with torch.no_grad(), making(judge.spec, dev):
        set_seed(SUITE_SEED)
        xs = case.prepare(to_device(case.make_inputs(), dev))
        set_seed(SUITE_SEED)
        model = to_module(case.make_new(), dev)
        if case.remote is not None:
            first, got = case.remote.probe(model, xs)
        else:
            first, got = probe_calls(case, model, xs)
        if first is None:
            return None
        for a, b in zip(first, got):
            if a.shape != b.shape or a.dtype != b.dtype or not all_close(a, b, judge.spec.rtol, judge.spec.atol,
                                                                            nan_to_num=True):
                return ("work off the current stream: with that stream held, the kernel's result changed (it "
                        f"read its inputs before work queued earlier on the stream had finished); {CONTRACT}")
    return None
