"""A kernel judged and timed the way its suite does, with kfray's defences on top. Runs in the
sandbox worker for tasks that carry a SuiteSpec (kfray/tasks/suite_spec.py).

The suite's verdict comes first and is never replaced: its trials (seeds drawn after
`manual_seed(42)`), its order, its fresh models, `torch.allclose` over every element at its
tolerance.
- robust-kbench (robust_kbench/sandbox/correct_*_fn.py): per configuration and trial, a fresh
  `Model(**init)` for each side; forward: the kernel through `Model.forward(*inputs, fn=kernel)`,
  then the reference, then the kernel again, both kernel outputs compared; backward: the kernel
  installed as `AutogradFunction.backward_fn`, `out.backward(grad)` on both sides, every `.grad`
  of the parameters and inputs compared.
- KernelBench (src/kernelbench/eval.py): one `Model` and one candidate model built after
  `set_seed(42)`; per trial, inputs from `get_inputs()` after `set_seed(seed)`, the reference
  first, then the candidate, `allclose(atol=rtol=tol(precision))`.

kfray's defences come after, each with its own reason: outputs that are views of an input or
parameter, inputs or parameters changed by the kernel, outputs still changing after the call
returned (work left on another stream or thread), and extra trials on fresh seeds where the kernel
runs before the reference exists, both before and after the timing (cached or copied results).
On CUDA the stream contract is probed once (kfray/eval/stream_probe.py).

Figures: the suite's (the mean of CUDA-event samples; KernelBench with an L2 flush before each,
robust-kbench config-averaged), and kfray's beside them (medians, geometric mean of per-config
ratios), against eager PyTorch timed alongside, and torch.compile when asked.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from kfray.candidate import TIER_CORRECT, TIER_RUNTIME_ERROR, TIER_WRONG_SHAPE, TIER_WRONG_VALUES
from kfray.tasks.suite_spec import KERNELBENCH, RKB, SUITE_SEED, SuiteSpec

KB_PERF_TRIALS, KB_WARMUP = 100, 3          # KernelBench timing.py: cuda-event trials, warm-ups
RKB_PERF_TRIALS, RKB_WARMUP = 1000, 25       # robust-kbench run_kernel.py: --rep_time, --warmup_time
L2_FLUSH_BYTES = 256 << 20                   # KernelBench's clear_l2_cache: a 256 MB write per trial
LATE_WAIT_S = (0.005, 0.05)
SUITE_NAMES = {RKB: "robust-kbench", KERNELBENCH: "KernelBench"}


class Verdict(Exception):
    """A failed check: its tier and reason end the evaluation."""

    def __init__(self, tier: int, reason: str, recycle: bool = False):
        super().__init__(reason)
        self.tier, self.reason, self.recycle = tier, reason, recycle


# --- small pieces ---------------------------------------------------------------------------------
def suite_seeds(trials: int) -> list[int]:
    """The trial seeds both suites draw: torch.manual_seed(42), then randint(0, 2**32 - 1) per trial."""
    import torch

    torch.manual_seed(SUITE_SEED)
    return [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(trials)]


def set_seed(seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


def _tensors(xs) -> list:
    import torch

    if isinstance(xs, torch.Tensor):
        return [xs]
    if isinstance(xs, (list, tuple)):
        return [t for x in xs for t in _tensors(x)]
    if isinstance(xs, dict):
        return [t for x in xs.values() for t in _tensors(x)]
    return []


def _to(xs, device: str):
    """Tensors moved to `device` (the suites' easy_to_device); already there: unchanged."""
    import torch

    if isinstance(xs, torch.Tensor):
        return xs if xs.device.type == device else xs.to(device)
    if isinstance(xs, (list, tuple)):
        return type(xs)(_to(x, device) for x in xs)
    return xs


def _outputs(res, who: str) -> list:
    import torch

    if isinstance(res, torch.Tensor):
        return [res]
    if isinstance(res, (tuple, list)) and res and all(isinstance(r, torch.Tensor) for r in res):
        return list(res)
    raise Verdict(TIER_WRONG_SHAPE, f"{who} returned {type(res).__name__}, not a tensor or a tuple of tensors")


def _span(t) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _overlaps(a, b) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0


def _max_diff(a, b) -> float:
    import torch

    d = (a.double() - b.double()).abs()
    d = torch.nan_to_num(d, nan=float("inf"))
    return float(d.max()) if d.numel() else 0.0


def _allclose(want, got, rtol: float, atol: float, what: str, broadcast: bool = False) -> str | None:
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
    if torch.allclose(want, got, rtol=rtol, atol=atol):
        return None
    bad = ~torch.isclose(want, got, rtol=rtol, atol=atol)
    n_bad, n = int(bad.sum()), bad.numel()
    flat = bad.reshape(-1).nonzero()
    first = int(flat[0]) if len(flat) else -1
    return (f"{what}: {n_bad} of {n} elements outside atol={atol:g} + rtol={rtol:g}*|ref| "
            f"(max |diff| {_max_diff(want, got):.3g}; first at flat index {first})")


def _snapshot(ts: list) -> list:
    return [t.detach().clone() for t in ts]


def _changed(ts: list, snaps: list, names: list[str]) -> str | None:
    import torch

    for t, s, n in zip(ts, snaps, names):
        if not torch.equal(t.detach(), s) and not (t.is_floating_point() and
                                                   torch.equal(torch.isnan(t), torch.isnan(s)) and
                                                   torch.equal(torch.nan_to_num(t.detach()), torch.nan_to_num(s))):
            return n
    return None


# --- the two suites' ways of building and calling ---------------------------------------------------
@dataclass
class Case:
    """One configuration: how to make its models and inputs, run each side, and name it."""

    name: str
    make_inputs: Callable[[], list]
    make_ref: Callable[[], Any]                # -> the reference module
    make_new: Callable[[], Any]                # -> the candidate module (or the same class, other fn)
    call_ref: Callable[[Any, list], Any]
    call_new: Callable[[Any, list], Any]


def _making(spec: SuiteSpec, device: str):
    """Where inputs and models are made, so that their random values relate as in the suite.
    KernelBench: on the device (its full-size problems hold many GiB; its seeds give the model
    and the inputs separate streams either way). robust-kbench: on the host, then moved, as the
    suite does: its inputs and models share a seed on the host generator while `grad_output`
    comes from the device's, and a kernel is judged on inputs related exactly that way."""
    import torch

    return torch.device(device) if spec.kind == KERNELBENCH else contextlib.nullcontext()


class RkbRunner:
    """robust-kbench: Model(**init), get_inputs(**inputs), forward through `fn`."""

    def __init__(self, spec: SuiteSpec, kernel: Any, device: str):
        from pathlib import Path

        from kfray.tasks.package import import_file

        self.spec, self.device = spec, device
        func = Path(spec.path) / f"func_{spec.direction}.py"
        if not func.is_file():
            func = Path(spec.path) / "func_forward.py"
        self.mod = import_file(func, "robust-kbench task")
        self.kernel = kernel
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

    def __init__(self, spec: SuiteSpec, kernel: Any, task, device: str):
        from pathlib import Path

        from kfray.tasks.package import import_file

        self.spec, self.device, self.task = spec, device, task
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
        init = [self._cast(x) for x in self.init_inputs()]
        holder: dict[str, Any] = {}

        def models():                  # one pair for every trial, as KernelBench builds them
            if not holder:
                set_seed(SUITE_SEED)
                holder["ref"] = self.mod.Model(*init)
                set_seed(SUITE_SEED)
                holder["new"] = self._new(init)
            return holder

        return [Case(name="default",
                     make_inputs=lambda: [self._cast(x) for x in self.mod.get_inputs()],
                     make_ref=lambda: models()["ref"], make_new=lambda: models()["new"],
                     call_ref=lambda m, xs: m(*xs), call_new=lambda m, xs: m(*xs))]

    def init_inputs(self) -> list:
        set_seed(SUITE_SEED)
        get = getattr(self.mod, "get_init_inputs", lambda: [])
        return list(get())

    @staticmethod
    def _cast(x):
        """KernelBench casts tensor inputs to its precision (fp32 by default); kfray leaves
        non-float tensors (bool masks, integer targets) as they are, which fp32 leaves the same
        for floats."""
        return x


def _runner(spec: SuiteSpec, kernel, task, device: str):
    if spec.kind == RKB:
        return RkbRunner(spec, kernel, device)
    if spec.kind == KERNELBENCH:
        return KbRunner(spec, kernel, task, device)
    raise Verdict(TIER_RUNTIME_ERROR, f"unknown suite {spec.kind!r}")


# --- correctness ------------------------------------------------------------------------------------
def _params_and_inputs(model, xs: list) -> tuple[list, list[str]]:
    ts, names = [], []
    for i, x in enumerate(_tensors(xs)):
        ts.append(x)
        names.append(f"input {i}")
    if model is not None and hasattr(model, "named_parameters"):
        for n, p in list(model.named_parameters()) + list(model.named_buffers()):
            ts.append(p)
            names.append(f"parameter {n}")
    return ts, names


def _call(fn: Callable, *args):
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

    def __init__(self, backend, spec: SuiteSpec, runner, rng: np.random.Generator):
        self.backend, self.spec, self.runner, self.rng = backend, spec, runner, rng
        self.device = backend.device
        self.max_diff = 0.0

    def sync(self) -> None:
        self.backend.synchronize()

    # -- forward ------------------------------------------------------------------------------------
    def forward_trial(self, case: Case, seed: int, kernel_first: bool, fresh: bool = False) -> None:
        """One trial. kernel_first=False is KernelBench's order (reference, then candidate);
        robust-kbench's is kernel, reference, kernel (kernel_first=True, with the second call)."""
        import torch

        sp, tag = self.spec, f"configuration {case.name}, {'kfray fresh-input' if fresh else 'suite'} trial seed {seed}"
        with torch.no_grad(), _making(sp, self.device):
            set_seed(seed)
            xs = _to(case.make_inputs(), self.device)
            if sp.kind == RKB:
                set_seed(seed)
                ref = _to_module(case.make_ref(), self.device)
                set_seed(seed)
                new = _to_module(case.make_new(), self.device)
            else:
                ref, new = _to_module(case.make_ref(), self.device), _to_module(case.make_new(), self.device)
            watched, names = _params_and_inputs(new, xs)
            snaps = _snapshot(watched)
            outs_ref = None
            if not kernel_first:
                outs_ref = _outputs(_call(case.call_ref, ref, xs), "the reference")
                self.sync()
            t0 = time.perf_counter()
            outs = _outputs(_call(case.call_new, new, xs), "the kernel")
            self.sync()
            call_s = time.perf_counter() - t0
            self._own_memory(outs, watched, names, tag)
            early = _snapshot(outs)
            time.sleep(min(LATE_WAIT_S[1], max(LATE_WAIT_S[0], 2 * call_s)))
            self.sync()
            if _changed(outs, early, [f"output {i}" for i in range(len(outs))]):
                raise Verdict(TIER_RUNTIME_ERROR, f"{tag}: an output changed after the kernel returned: work was "
                              "still running (another stream or thread); finish or join all work before returning",
                              recycle=True)
            bad = _changed(watched, snaps, names)
            if bad:
                raise Verdict(TIER_WRONG_VALUES, f"{tag}: the kernel changed {bad} (inputs and parameters must "
                              "come back unchanged) [kfray rule]")
            if kernel_first:
                outs_ref = _outputs(_call(case.call_ref, ref, xs), "the reference")
                self.sync()
            calls = [outs]
            if sp.kind == RKB and not fresh:
                calls.append(_outputs(_call(case.call_new, new, xs), "the kernel (second call)"))
                self.sync()
            for k, got in enumerate(calls):
                if len(got) != len(outs_ref):
                    raise Verdict(TIER_WRONG_SHAPE, f"{tag}: the kernel returned {len(got)} tensors, the reference "
                                  f"{len(outs_ref)}")
                for i, (w, g) in enumerate(zip(outs_ref, got)):
                    self.max_diff = max(self.max_diff, _max_diff(w, g) if w.shape == g.shape else 0.0)
                    why = _allclose(w, g, sp.rtol, sp.atol, f"output {i}", broadcast=sp.kind == RKB)
                    if why:
                        rule = "kfray rule: the kernel ran before the reference existed" if fresh else \
                            f"{SUITE_NAMES[sp.kind]}'s rule"
                        call = f", call {k + 1}" if len(calls) > 1 else ""
                        raise Verdict(TIER_WRONG_VALUES, f"{tag}{call}: {why} [{rule}]")

    def _own_memory(self, outs: list, watched: list, names: list[str], tag: str) -> None:
        for i, o in enumerate(outs):
            for t, n in zip(watched, names):
                if _overlaps(o, t):
                    raise Verdict(TIER_WRONG_VALUES, f"{tag}: output {i} shares memory with {n} (a view of it or "
                                  "written in place); the kernel must return a tensor of its own [kfray rule; "
                                  f"{SUITE_NAMES[self.spec.kind]} itself would not reject this]")

    # -- backward -----------------------------------------------------------------------------------
    def backward_trial(self, case: Case, seed: int, fresh: bool = False) -> None:
        """robust-kbench's check_backward_correctness: kernel side first, then the reference; every
        .grad of the parameters and of the inputs compared."""
        import torch

        sp, tag = self.spec, f"configuration {case.name}, {'kfray fresh-input' if fresh else 'suite'} trial seed {seed}"
        with _making(sp, self.device):
            set_seed(seed)
            xs_ref = _to(case.make_inputs(), self.device)
            set_seed(seed)
            xs_new = _to(case.make_inputs(), self.device)
            for x in _tensors(xs_new) + _tensors(xs_ref):
                if x.requires_grad and not x.is_leaf:
                    x.retain_grad()
            set_seed(seed)
            ref = _to_module(case.make_ref(), self.device)
            set_seed(seed)
            new = _to_module(case.make_new(), self.device)
            watched, names = _params_and_inputs(new, xs_new)
            snaps = _snapshot(watched)
            new.zero_grad()
            out = _call(case.call_new, new, xs_new)
            self.sync()
            set_seed(seed)
            g = torch.randn_like(out)
            t0 = time.perf_counter()
            _call(out.backward, g)
            self.sync()
            call_s = time.perf_counter() - t0
            grads_new = _gradients(new, xs_new)
            early = {k: v.clone() for k, v in grads_new.items()}
            time.sleep(min(LATE_WAIT_S[1], max(LATE_WAIT_S[0], 2 * call_s)))
            self.sync()
            for k, v in grads_new.items():
                if not torch.equal(torch.nan_to_num(v), torch.nan_to_num(early[k])):
                    raise Verdict(TIER_RUNTIME_ERROR, f"{tag}: gradient {k} changed after backward returned: work "
                                  "was still running (another stream or thread)", recycle=True)
            bad = _changed([w.detach() for w in watched], snaps, names)
            if bad:
                raise Verdict(TIER_WRONG_VALUES, f"{tag}: the backward kernel changed {bad} (inputs and parameters "
                              "must come back unchanged) [kfray rule]")
            ref.zero_grad()
            out_ref = case.call_ref(ref, xs_ref)
            set_seed(seed)
            g_ref = torch.randn_like(out_ref)
            out_ref.backward(g_ref)
            self.sync()
            grads_ref = _gradients(ref, xs_ref)
        if set(grads_new) != set(grads_ref):
            raise Verdict(TIER_WRONG_SHAPE, f"{tag}: gradients of {sorted(set(grads_ref) - set(grads_new))} missing, "
                          f"{sorted(set(grads_new) - set(grads_ref))} unexpected")
        for k in grads_ref:
            w, got = grads_ref[k], grads_new[k]
            if w.shape == got.shape:
                self.max_diff = max(self.max_diff, _max_diff(w, got))
            why = _allclose(w, got, sp.rtol, sp.atol, f"gradient {k}", broadcast=True)
            if why:
                raise Verdict(TIER_WRONG_VALUES, f"{tag}: {why} [{'kfray fresh-input check' if fresh else 'robust-kbench rule'}]")

    def trial(self, case: Case, seed: int, kernel_first: bool = False, fresh: bool = False) -> None:
        if self.spec.direction == "backward":
            self.backward_trial(case, seed, fresh)
        else:
            self.forward_trial(case, seed, kernel_first, fresh)

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


def _to_module(m, device: str):
    return m.to(device) if hasattr(m, "to") else m


def _gradients(model, xs) -> dict:
    """robust-kbench's collect_gradients: every parameter's .grad, then every input's."""
    out = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            out[f"param_{n}"] = p.grad.detach().clone()
    for i, x in enumerate(xs if isinstance(xs, (list, tuple)) else [xs]):
        if getattr(x, "grad", None) is not None:
            out[f"input_{i}"] = x.grad.detach().clone()
    return out


# --- timing -----------------------------------------------------------------------------------------
class Clock:
    """The suites' timers: CUDA events on the current stream (the backend's time_call, which also
    counts host wall time when work outlives the stream), host perf_counter on the CPU."""

    def __init__(self, backend, flush_l2: bool):
        self.backend, self.flush_l2 = backend, flush_l2 and backend.device == "cuda"

    def flush(self) -> None:
        if self.flush_l2:
            import torch

            dummy = torch.empty(L2_FLUSH_BYTES // 8, dtype=torch.int64, device="cuda")
            dummy.fill_(42)
            del dummy

    def samples(self, call: Callable[[], Any], warmup: int, trials: int, before: Callable[[], Any] | None = None,
                budget_s: float = 0.0) -> list[float]:
        t0 = time.perf_counter()
        for _ in range(warmup):
            if before:
                before()
            call()
            self.backend.synchronize()
            if budget_s and time.perf_counter() - t0 > budget_s / 4:
                break                     # a slow problem: warm, and the budget is for samples
        out: list[float] = []
        start = time.perf_counter()
        for _ in range(trials):
            if before:
                before()
            self.backend.synchronize()
            self.flush()
            out.append(self.backend.time_call(call))
            if budget_s and len(out) >= 5 and time.perf_counter() - start > budget_s:
                break                     # a slow problem: enough samples for a mean
        return out


def _time_case(judge: Judge, clock: Clock, case: Case, seed: int, side: str, warmup: int, trials: int,
               budget_s: float, compiled: bool = False) -> tuple[list[float], Any]:
    """Samples of one side on one configuration, and its last result (to check)."""
    import torch

    sp, dev = judge.spec, judge.device
    with _making(sp, dev):
        set_seed(seed)
        xs = _to(case.make_inputs(), dev)
        set_seed(seed)
        model = _to_module(case.make_new() if side == "new" else case.make_ref(), dev)
    call_side = case.call_new if side == "new" else case.call_ref
    if compiled:
        call_side = _compiled(case, sp)
    last: list = [None]
    if sp.direction == "backward":
        state: dict = {}

        def before():
            model.zero_grad()
            for x in _tensors(xs):         # inputs' grads too: every timed backward starts alike
                x.grad = None
            with torch.enable_grad():
                state["out"] = call_side(model, xs)
            state["g"] = torch.randn_like(state["out"])

        def call():
            state["out"].backward(state["g"])

        ts = clock.samples(call, warmup, trials, before, budget_s)
        last[0] = _gradients(model, xs)
    else:
        def call():
            last[0] = None                 # one output alive at a time: full-size problems are large
            last[0] = call_side(model, xs)

        with torch.no_grad():
            ts = clock.samples(call, warmup, trials, None, budget_s)
    return ts, (model, xs, last[0])


def _compiled(case: Case, spec: SuiteSpec):
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


def _stats(ts: list[float]) -> dict:
    a = np.asarray(ts, dtype=float)
    return {"mean": float(a.mean()), "median": float(np.median(a)),
            "iqr": float(np.percentile(a, 75) - np.percentile(a, 25)), "samples": int(a.size)}


# --- the job ------------------------------------------------------------------------------------------
def run_suite_job(backend, kernel: Any, task, job: dict) -> dict:
    """Verdict and figures of a suite-form kernel on a suite task; a plain result dict."""
    import torch

    spec: SuiteSpec = task.suite
    stages: dict[str, float] = {}
    rng = np.random.default_rng()
    t0 = time.perf_counter()
    if backend.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        runner = _runner(spec, kernel, task, backend.device)
        cases = runner.cases()
        judge = Judge(backend, spec, runner, rng)
        judge.suite_trials(cases)
        stages["correctness"] = time.perf_counter() - t0
        if backend.device == "cuda" and spec.direction == "forward":
            from kfray.eval.stream_probe import probe_case

            why = probe_case(backend, judge, cases[0])
            if why:
                raise Verdict(TIER_RUNTIME_ERROR, f"configuration {cases[0].name}: {why} [kfray rule]", recycle=True)
        judge.fresh_trials(cases)
        stages["kfray_checks"] = time.perf_counter() - t0 - stages["correctness"]
        sticky = backend.check_sticky_error()
        if sticky:
            raise Verdict(TIER_RUNTIME_ERROR, sticky, recycle=True)
        t1 = time.perf_counter()
        figures = _measure(backend, judge, cases, job)
        stages["timing"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        judge.fresh_trials(cases)              # after the timing: a kernel that counts calls or keeps results
        stages["recheck"] = time.perf_counter() - t2
    except Verdict as v:
        stages.setdefault("correctness", time.perf_counter() - t0)
        out = {"tier": v.tier, "reason": v.reason, "stage_seconds": stages,
               "facts": {"suite": {"name": SUITE_NAMES.get(spec.kind, spec.kind), "verdict": "rejected"}}}
        if v.recycle:
            out["recycle"] = True
        return out
    except torch.cuda.OutOfMemoryError as e:
        return {"tier": TIER_RUNTIME_ERROR, "reason": f"out of device memory: {str(e).splitlines()[0]}",
                "stage_seconds": stages, "recycle": True}
    figures["suite"]["max_diff"] = judge.max_diff
    figures["suite"].update(_peak_memory(backend))
    return {"tier": TIER_CORRECT, "reason": "", "times": figures["times"], "ref_times": figures["ref_times"],
            "noise": figures["noise"], "facts": {"form": "suite", "suite": figures["suite"],
                                                 "per_shape": figures["per_shape"]},
            "stage_seconds": stages}


def _measure(backend, judge: Judge, cases: list[Case], job: dict) -> dict:
    """Both sides timed per configuration; the suite's figures and kfray's beside them."""
    spec = judge.spec
    kb = spec.kind == KERNELBENCH
    trials = int(job.get("suite_perf_trials") or (KB_PERF_TRIALS if kb else RKB_PERF_TRIALS))
    warmup = KB_WARMUP if kb else RKB_WARMUP
    warmup = min(warmup, max(1, trials // 4))
    budget = float(job.get("suite_time_budget_s") or 0.0)
    clock = Clock(backend, flush_l2=kb)
    seed = SUITE_SEED
    times, ref_times, per_shape, spreads = {}, {}, {}, []
    means_new, means_ref, means_cmp, cmp_note = [], [], [], ""
    for case in cases:
        ts_new, (m_new, xs_new, last_new) = _time_case(judge, clock, case, seed, "new", warmup, trials, budget)
        del m_new, xs_new                  # the reference makes the same inputs again from the seed
        ts_ref, (m_ref, xs_ref, last_ref) = _time_case(judge, clock, case, seed, "ref", warmup, trials, budget)
        _check_timed(judge, case, last_new, last_ref)
        del m_ref, xs_ref, last_new, last_ref
        s_new, s_ref = _stats(ts_new), _stats(ts_ref)
        times[case.name], ref_times[case.name] = s_new["median"], s_ref["median"]
        spreads.append(s_new["iqr"] / s_new["median"] if s_new["median"] > 0 else 0.0)
        means_new.append(s_new["mean"])
        means_ref.append(s_ref["mean"])
        row = {"mean_ms": s_new["mean"] * 1e3, "ref_mean_ms": s_ref["mean"] * 1e3, "samples": s_new["samples"],
               "median_ms": s_new["median"] * 1e3, "ref_median_ms": s_ref["median"] * 1e3}
        if job.get("torch_compile") and not cmp_note:
            try:
                ts_c, _ = _time_case(judge, clock, case, seed, "ref", warmup, trials, budget, compiled=True)
                means_cmp.append(_stats(ts_c)["mean"])
                row["compile_mean_ms"] = means_cmp[-1] * 1e3
            except Exception as e:
                cmp_note = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        per_shape[case.name] = row
    avg_new, avg_ref = float(np.mean(means_new)), float(np.mean(means_ref))
    suite = {"name": SUITE_NAMES[spec.kind], "verdict": "correct", "trials": f"{spec.trials}/{spec.trials}",
             "statistic": _statistic(kb, backend.device, trials),
             "avg_mean_ms": avg_new * 1e3, "ref_avg_mean_ms": avg_ref * 1e3,
             "speedup": avg_ref / avg_new if avg_new > 0 else 0.0, "configs": len(cases),
             "rtol": spec.rtol, "atol": spec.atol}
    if means_cmp and len(means_cmp) == len(cases):
        suite["compile_avg_mean_ms"] = float(np.mean(means_cmp)) * 1e3
        suite["speedup_compile"] = float(np.mean(means_cmp)) / avg_new if avg_new > 0 else 0.0
    elif cmp_note:
        suite["compile_note"] = cmp_note
    return {"times": times, "ref_times": ref_times, "per_shape": per_shape, "suite": suite,
            "noise": float(max(spreads) if spreads else 0.0)}


def _peak_memory(backend) -> dict:
    """The sandbox's peak host memory (resident) and, on CUDA, peak device memory, in GiB."""
    import resource

    out = {"peak_host_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if backend.device == "cuda":
        import torch

        out["peak_device_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def _statistic(kb: bool, device: str, trials: int) -> str:
    timer = "CUDA-event" if device == "cuda" else "host-timer"
    if kb:
        return f"mean of {trials} {timer} trials" + (" after an L2 flush each" if device == "cuda" else "")
    return f"config-averaged mean of {trials} {timer} samples"


def _check_timed(judge: Judge, case: Case, last_new, last_ref) -> None:
    """The timed runs' last results against the reference's on the same inputs: a kernel that skips
    work when it senses timing fails here."""
    spec = judge.spec
    if last_new is None or last_ref is None:
        return
    if isinstance(last_new, dict):
        pairs = [(k, last_ref.get(k), last_new.get(k)) for k in last_ref]
    else:
        a, b = _outputs(last_ref, "the reference"), _outputs(last_new, "the kernel")
        pairs = [(f"output {i}", x, y) for i, (x, y) in enumerate(zip(a, b))]
    for name, w, g in pairs:
        if g is None:
            raise Verdict(TIER_WRONG_VALUES, f"configuration {case.name}, timed runs: {name} missing")
        why = _allclose(w, g, spec.rtol, spec.atol, name, broadcast=spec.kind == RKB)
        if why:
            raise Verdict(TIER_WRONG_VALUES, f"configuration {case.name}, after the timed runs: {why}; the kernel "
                          "must compute its result on every call [kfray rule]")

