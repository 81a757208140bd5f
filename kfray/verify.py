"""`kfray verify TASK KERNEL`: check and time one kernel file as it is, without a search.

Made for the kernels a suite publishes (KernelBench, robust-kbench): the file's form picks the
backend (kfray.eval.backends.torch_ext.backend_for): a PyTorch extension (`.cpp` / `.cu` that
includes torch/extension.h) or a kf_forward kernel (`.cpp` / `.cu`). The kernel runs in the
sandbox like any candidate and is judged by the same rules; the result is printed, not stored.
"""
from __future__ import annotations

from pathlib import Path

from kfray.candidate import TIER_NAMES, Candidate, EvalResult
from kfray.errors import KfrayError

VERIFY_TIMEOUT_S = 600.0


def verify(task_ref: str, kernel: str, backend: str | None = None, overrides: list[str] = ()) -> tuple[EvalResult, str]:
    """(result, backend name) of one evaluation of the kernel file on the task."""
    from kfray.config import load_config
    from kfray.eval.backends.torch_ext import LANGUAGE, backend_for, is_torch_extension
    from kfray.eval.evaluator import Evaluator
    from kfray.tasks import load_task

    path = Path(kernel)
    if not path.is_file():
        raise KfrayError(f"{kernel}: no such kernel file")
    source = path.read_text(errors="replace")
    task = load_task(task_ref)                       # a task that cannot load fails here, in one line
    name = backend or backend_for(source, path.name)
    language = LANGUAGE if is_torch_extension(source) else ("cuda" if "cuda" in name else "cpp")
    cfg = load_config(None, list(overrides)).eval
    cfg.backend = name
    if not any(o.replace(" ", "").startswith("eval.timeout_s=") for o in overrides):
        # One kernel, not a search: time for large problems, whose inputs and checks run on the host.
        cfg.timeout_s = max(cfg.timeout_s, VERIFY_TIMEOUT_S)
    ev = Evaluator(name, cfg, "verify")
    try:
        out = ev.evaluate(Candidate(task=task.ref or task_ref, language=language, source=source),
                          task.ref or task_ref, tune=False)
    finally:
        ev.shutdown()
    return EvalResult.from_dict(out), name


def format_result(res: EvalResult, backend: str, kernel: str, task_ref: str) -> str:
    lines = [f"kfray verify: {kernel} on {task_ref}",
             f"  backend   {backend} ({res.hardware})",
             f"  compile   {res.stage_seconds.get('compile', 0.0):.1f} s"
             f"{' (cached)' if res.facts.get('compile_cached') else ''}",
             f"  result    {TIER_NAMES.get(res.tier, res.tier)} (tier {res.tier})"]
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
