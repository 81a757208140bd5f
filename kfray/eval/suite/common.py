"""What both suites' harnesses share: their seeds, the failed-check exception, tensor helpers, and
where inputs and models are made."""
from __future__ import annotations

import contextlib

from kfray.candidate import TIER_WRONG_SHAPE
from kfray.tasks.suite_spec import KERNELBENCH, RKB, SUITE_SEED, SuiteSpec

KB_PERF_TRIALS, KB_WARMUP = 100, 3          # KernelBench timing.py: cuda-event trials, warm-ups
RKB_PERF_TRIALS, RKB_WARMUP = 1000, 25       # robust-kbench run_kernel.py: --rep_time, --warmup_time
L2_FLUSH_BYTES = 256 << 20                   # KernelBench's clear_l2_cache: a 256 MB write per trial
LATE_WAIT_S = (0.005, 0.05)
# Spun, not slept, just before every timed call on both sides: a thread woken from a blocking wait
# launches slowly for its first milliseconds. On the H200's host, ResNet18 (launch-bound) took
# 3.18 ms a call right after a blocking socket read, 2.50 ms back to back and 2.48 ms with this spin
# after the read; the candidate's runner wakes from the wire before each call, the judge's reference
# calls from a paced sleep, so without it KernelBench's ResNet18 measured 0.71-0.79x against itself.
WARM_SPIN_S = 200e-6
SUITE_NAMES = {RKB: "robust-kbench", KERNELBENCH: "KernelBench"}


class Verdict(Exception):
    """A failed check: its tier and reason end the evaluation."""

    def __init__(self, tier: int, reason: str, recycle: bool = False):
        super().__init__(reason)
        self.tier, self.reason, self.recycle = tier, reason, recycle


def suite_seeds(trials: int) -> list[int]:
    """The trial seeds both suites draw: torch.manual_seed(42), then randint(0, 2**32 - 1) per trial."""
    import torch

    torch.manual_seed(SUITE_SEED)
    return [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(trials)]


_SEED: list[int | None] = [None]


def flush_l2(nbytes: int = L2_FLUSH_BYTES) -> None:
    """KernelBench's clear_l2_cache: a write of nbytes on the current CUDA stream, queued, not waited for."""
    import torch

    torch.empty(nbytes // 8, dtype=torch.int64, device="cuda").fill_(42)


def set_seed(seed: int) -> None:
    import torch

    _SEED[0] = seed
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


def last_seed() -> int | None:
    """The seed `set_seed` set last (a runner sets the same before it builds the candidate)."""
    return _SEED[0]


def tensors(xs) -> list:
    import torch

    if isinstance(xs, torch.Tensor):
        return [xs]
    if isinstance(xs, (list, tuple)):
        return [t for x in xs for t in tensors(x)]
    if isinstance(xs, dict):
        return [t for x in xs.values() for t in tensors(x)]
    return []


def to_device(xs, device: str):
    """Tensors moved to `device` (the suites' easy_to_device); already there: unchanged."""
    import torch

    if isinstance(xs, torch.Tensor):
        return xs if xs.device.type == device else xs.to(device)
    if isinstance(xs, (list, tuple)):
        return type(xs)(to_device(x, device) for x in xs)
    return xs


def outputs(res, who: str) -> list:
    """The tensors a call returned; anything else is the kernel's wrong shape, not a task error."""
    from kfray.errors import TaskError
    from kfray.tasks.torch_ref import outputs_of

    try:
        return outputs_of(res, who)
    except TaskError:
        raise Verdict(TIER_WRONG_SHAPE, f"{who} returned {type(res).__name__}, not a tensor or a tuple of "
                      "tensors") from None


def _span(t) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def overlaps(a, b) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0


CHUNK_ELEMS = 1 << 26     # elements per piece of a comparison: its temporaries stay under 1 GiB


def pieces(a, b):
    """Matching flat pieces of two tensors of one shape. A comparison of whole full-size tensors
    makes temporaries several times their size (a float64 difference of two 7 GiB outputs is 14 GiB
    each), which the candidate's runner, another process, then cannot have."""
    a, b = a.detach().reshape(-1), b.detach().reshape(-1)
    for i in range(0, a.numel(), CHUNK_ELEMS):
        yield a[i:i + CHUNK_ELEMS], b[i:i + CHUNK_ELEMS]


def same(x, y) -> bool:
    """Alike element for element (NaN is never alike): close under any tolerance. One pass and no
    temporaries, where allclose makes several of the tensors' size (145 ms against 8 ms for 16M
    floats on 2 cores): a kernel's output often equals the reference's bit for bit."""
    import torch

    return x.dtype == y.dtype and torch.equal(x, y)


def all_close(a, b, rtol: float, atol: float, nan_to_num: bool = False, double: bool = False,
              equal_nan: bool = False) -> bool:
    """torch.allclose(a, b) over tensors of one shape, piece by piece (optionally of
    nan_to_num'd or float64 copies of each piece)."""
    import torch

    for x, y in pieces(a, b):
        if same(x, y):
            continue
        if double:
            x, y = x.double(), y.double()
        if nan_to_num:
            x, y = torch.nan_to_num(x), torch.nan_to_num(y)
        if not torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan):
            return False
    return True


def max_diff(a, b) -> float:
    import torch

    worst = 0.0
    for x, y in pieces(a, b):
        if same(x, y):
            continue
        d = torch.nan_to_num((x.double() - y.double()).abs(), nan=float("inf"))
        worst = max(worst, float(d.max()))
    return worst


def allclose_reason(want, got, rtol: float, atol: float, what: str, broadcast: bool = False) -> str | None:
    """The suites' rule, torch.allclose over every element; the reason when it fails. With
    `broadcast` (robust-kbench, which compares with a bare torch.allclose), shapes that hold the
    same elements and broadcast together, (1,) against (), are compared as torch.allclose does."""
    import torch

    if tuple(got.shape) != tuple(want.shape):
        same = got.numel() == want.numel()
        try:
            torch.broadcast_shapes(got.shape, want.shape)
        except RuntimeError:
            same = False
        if not (broadcast and same):
            raise Verdict(TIER_WRONG_SHAPE, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        got = got.reshape(want.shape)
    if got.dtype != want.dtype:
        raise Verdict(TIER_WRONG_SHAPE, f"{what}: dtype {got.dtype}, expected {want.dtype}")
    if all_close(want, got, rtol, atol):
        return None
    n_bad, n, first = 0, want.numel(), -1
    for k, (w, g) in enumerate(pieces(want, got)):
        bad = ~torch.isclose(w, g, rtol=rtol, atol=atol)
        nb = int(bad.sum())
        if nb and first < 0:
            first = k * CHUNK_ELEMS + int(bad.nonzero()[0])
        n_bad += nb
    return (f"{what}: {n_bad} of {n} elements outside atol={atol:g} + rtol={rtol:g}*|ref| "
            f"(max |diff| {max_diff(want, got):.3g}; first at flat index {first})")


def snapshot(ts: list) -> list:
    return [t.detach().clone() for t in ts]


def changed(ts: list, snaps: list, names: list[str]) -> str | None:
    """The name of the first tensor that differs from its snapshot (NaN equal to NaN), else None."""
    import torch

    for t, s, n in zip(ts, snaps, names):
        if t.shape != s.shape or t.dtype != s.dtype:
            return n
        for a, b in pieces(t, s):
            alike = same(a, b) or (a.is_floating_point() and torch.equal(torch.isnan(a), torch.isnan(b))
                                   and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))
            if not alike:
                return n
    return None


def making(spec: SuiteSpec, device: str):
    """Where inputs and models are made, so that their random values relate as in the suite.
    KernelBench: on the device (its full-size problems hold many GiB; its seeds give the model
    and the inputs separate streams either way). robust-kbench: on the host, then moved, as the
    suite does: its inputs and models share a seed on the host generator while `grad_output`
    comes from the device's, and a kernel is judged on inputs related exactly that way."""
    import torch

    return torch.device(device) if spec.kind == KERNELBENCH else contextlib.nullcontext()


def to_module(m, device: str):
    return m.to(device) if hasattr(m, "to") else m


def state_of(model) -> dict:
    """A module's parameters and buffers by name (running statistics included)."""
    if model is None or not hasattr(model, "named_parameters"):
        return {}
    return {n: p for n, p in list(model.named_parameters()) + list(model.named_buffers())}


def gradients(model, xs) -> dict:
    """robust-kbench's collect_gradients: every parameter's .grad, then every input's."""
    out = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            out[f"param_{n}"] = p.grad.detach().clone()
    for i, x in enumerate(xs if isinstance(xs, (list, tuple)) else [xs]):
        if getattr(x, "grad", None) is not None:
            out[f"input_{i}"] = x.grad.detach().clone()
    return out
