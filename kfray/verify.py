"""`kfray verify TASK KERNEL`: check and time one kernel file as it is, without a search.

Made for the kernels a suite publishes (KernelBench, robust-kbench): a file in a suite's form, a
KernelBench `ModelNew` file (`.py`: CUDA sources, Triton or plain PyTorch) or a PyTorch extension
(`.cpp` / `.cu` that includes torch/extension.h, binding `forward`, or `backward` for a
robust-kbench backward task), runs on the GPU wherever PyTorch sees one (torch_ext_cuda), else on
the CPU (kfray.tasks.suite_form.suite_backend); a kf_forward kernel (`.cpp` / `.cu`) by its code
(kfray.eval.backends.torch_ext.backend_for). `--backend` overrides both. The kernel
runs in the sandbox like any candidate; on a suite's task the verdict is the suite's, with kfray's
defences on top (kfray/eval/suite/). The result is printed, not stored.
"""
from __future__ import annotations

from pathlib import Path

from kfray.candidate import TIER_NAMES, Candidate, EvalResult
from kfray.errors import KfrayError

VERIFY_TIMEOUT_S = 600.0


def verify(task_ref: str, kernel: str, backend: str | None = None, overrides: list[str] = (),
           judges: dict | None = None) -> tuple[EvalResult, str]:
    """(result, backend name) of one evaluation of the kernel file on the task.

    `judges`, where many kernels are verified in one process: the evaluators to keep between calls,
    one per backend and configuration (each one's sandbox costs seconds of PyTorch import to start);
    the caller shuts them down. A candidate runs in a runner of its own either way."""
    from kfray.config import load_config
    from kfray.eval.backends.torch_ext import backend_for, language_of
    from kfray.eval.evaluator import Evaluator
    from kfray.source import parse_params
    from kfray.tasks import load_task
    from kfray.tasks.suite_form import suite_backend, torch_gpu

    path = Path(kernel)
    if not path.is_file():
        raise KfrayError(f"{kernel}: no such kernel file")
    source = path.read_text(errors="replace")
    task = load_task(task_ref)                       # a task that cannot load fails here, in one line
    name = backend or suite_backend(source, path.name, bool(torch_gpu())) or backend_for(source, path.name)
    language = language_of(source, path.name)
    if language == "cpp" and "cuda" in name:
        language = "cuda"
    cfg = load_config(None, list(overrides)).eval
    cfg.backend = name
    if not any(o.replace(" ", "").startswith("eval.timeout_s=") for o in overrides):
        # One kernel, not a search: time for large problems, whose inputs and checks run on the host.
        cfg.timeout_s = max(cfg.timeout_s, VERIFY_TIMEOUT_S)
    try:       # a kernel that declares @kf.param tunables runs at their first (its own default) values
        params = parse_params(source).default()
    except ValueError as e:
        raise KfrayError(f"{kernel}: {e}") from None
    key = (name, repr(cfg))
    ev = judges.get(key) if judges is not None else None
    if ev is None:
        ev = Evaluator(name, cfg, "verify")
        if judges is not None:
            judges[key] = ev
    try:
        out = ev.evaluate(Candidate(task=task.ref or task_ref, language=language, source=source, params=params),
                          task.ref or task_ref, tune=False)
    finally:
        if judges is None:
            ev.shutdown()
    res = EvalResult.from_dict(out)
    if params:
        res.facts["params"] = params
    if res.facts.get("not_charged"):       # the task does not fit (kfray/eval/fits.py): not the kernel's verdict
        raise KfrayError(f"{task_ref}: {res.reason} (a larger device, or a higher eval.memory_limit_mb on the CPU)")
    return res, name


def format_result(res: EvalResult, backend: str, kernel: str, task_ref: str) -> str:
    suite = res.facts.get("suite")
    if isinstance(suite, dict):
        return _format_suite(res, suite, backend, kernel, task_ref)
    lines = [f"kfray verify: {kernel} on {task_ref}",
             f"  backend   {backend} ({res.hardware})",
             f"  compile   {res.stage_seconds.get('compile', 0.0):.1f} s"
             f"{' (cached)' if res.facts.get('compile_cached') else ''}",
             f"  result    {TIER_NAMES.get(res.tier, res.tier)} (tier {res.tier})"]
    if res.facts.get("params"):
        lines.insert(3, "  params    " + ", ".join(f"{k}={v}" for k, v in res.facts["params"].items()))
    if res.reason:
        lines.append("  reason    " + res.reason.strip().replace("\n", "\n            "))
    for shape, t in res.times.items():
        ref = res.ref_times.get(shape, 0.0)
        lines.append(f"  {shape}: {t * 1e3:.4f} ms, reference {ref * 1e3:.4f} ms, "
                     f"{ref / t if t > 0 else 0.0:.2f}x")
    if res.correct:
        against = "eager PyTorch on the same device" if backend.startswith("torch_ext") else "the task's reference"
        lines.append(f"  speedup   {res.speedup:.2f}x (geometric mean over {len(res.times)} shape configs, "
                     f"against {against})")
    return "\n".join(lines)


def _format_suite(res: EvalResult, suite: dict, backend: str, kernel: str, task_ref: str) -> str:
    """The suite's verdict and figures first, kfray's beside them."""
    name = suite.get("name", "the suite")
    lines = [f"kfray verify: {kernel} on {task_ref}",
             f"  backend   {backend} ({res.hardware})",
             f"  compile   {res.stage_seconds.get('compile', 0.0):.1f} s"
             f"{' (cached)' if res.facts.get('compile_cached') else ''}",
             f"  result    {TIER_NAMES.get(res.tier, res.tier)} (tier {res.tier}): {name}'s verdict"
             + (f", {suite.get('trials')} trials per configuration at rtol={suite.get('rtol'):g}, "
                f"atol={suite.get('atol'):g}, then kfray's checks" if res.correct else "")]
    if res.reason:
        lines.append("  reason    " + res.reason.strip().replace("\n", "\n            "))
    if res.correct:
        for shape, row in res.facts.get("per_shape", {}).items():
            cmp = f", torch.compile {row['compile_mean_ms']:.4f} ms" if "compile_mean_ms" in row else ""
            lines.append(f"  {shape}: mean {row['mean_ms']:.4f} ms, eager PyTorch {row['ref_mean_ms']:.4f} ms{cmp} "
                         f"({row['samples']} samples); medians {row['median_ms']:.4f} / {row['ref_median_ms']:.4f} ms")
        where = f"; the reference timed {suite['reference_timed']}" if suite.get("reference_timed") else ""
        lines.append(f"  speedup   {suite.get('speedup', 0.0):.3f}x {name}'s way ({suite.get('statistic', '')}, "
                     f"against eager PyTorch{where})")
        pub = suite.get("published")
        if pub:
            lines.append(f"            {pub['speedup']:.3f}x against KernelBench's published eager time "
                         f"({pub['mean_ms']:.4g} ms on {pub['hardware'] or 'its hardware'})")
        if "speedup_compile" in suite:
            lines.append(f"            {suite['speedup_compile']:.3f}x against torch.compile (max-autotune)")
        elif suite.get("compile_note"):
            lines.append(f"            torch.compile: {suite['compile_note']}")
        lines.append(f"            {res.speedup:.3f}x kfray's way (geometric mean over {len(res.times)} "
                     "configurations of median-time ratios)")
        lines.append("  stages    " + ", ".join(f"{k} {v:.1f} s" for k, v in res.stage_seconds.items()))
    return "\n".join(lines)
