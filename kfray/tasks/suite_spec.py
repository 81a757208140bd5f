"""How a public suite itself runs one of its tasks: what kfray needs to judge a kernel the suite's
way (kfray/eval/suite/) rather than by its own rules.

A TorchTask loaded from a suite's files carries one `SuiteSpec` (`task.suite`); built-in tasks and
task packages carry none. The spec is plain data, so a worker process rebuilds it from the task ref.
"""
from __future__ import annotations

from dataclasses import dataclass, field

RKB = "rkb"
KERNELBENCH = "kernelbench"
RKB_MODES = ("single", "multi", "multi_input", "multi_init")

# KernelBench's tolerance by precision (src/kernelbench/eval.py, get_tolerance_for_precision),
# used for atol and rtol alike.
KB_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}
# robust-kbench's run_kernel.py defaults (--op_atol / --op_rtol), its trials and timing.
RKB_TOLERANCE = 1e-3
SUITE_TRIALS = 5          # both suites: 5 correctness trials, seeds drawn after manual_seed(42)
SUITE_SEED = 42


@dataclass(frozen=True)
class RkbConfig:
    """One configuration as robust-kbench runs it: its name (the suite's config string), the
    settings for `Model(**init)` and those for `get_inputs(**inputs)`."""

    name: str
    init: dict
    inputs: dict


@dataclass(frozen=True)
class SuiteSpec:
    kind: str                                   # RKB | KERNELBENCH
    path: str                                   # rkb: the task folder; kernelbench: the problem file
    direction: str = "forward"                  # rkb: forward | backward (the function the kernel binds)
    mode: str = "single"                        # rkb: which configurations the suite runs (RKB_MODES)
    configs: tuple[RkbConfig, ...] = ()         # rkb: in the suite's order, duplicates removed
    rtol: float = RKB_TOLERANCE
    atol: float = RKB_TOLERANCE
    trials: int = SUITE_TRIALS
    flagged: tuple[str, ...] = ()               # rkb: filter_results.json flags that are true
    bytes_needed: int = 0                       # inputs + parameters + outputs of the largest config
    functional_error: str = ""                  # why kf_forward kernels cannot take this task ("" if they can)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def binds(self) -> str:
        """The function a suite-form extension kernel must bind."""
        return "backward" if self.direction == "backward" else "forward"


def suite_task_data(task) -> dict:
    """What a judge or a runner needs of a suite task, as plain data: its spec, its parameter
    names, its name and ref (they rebuild it with `suite_task`, without loading and tracing it)."""
    import os
    from dataclasses import asdict

    spec = asdict(task.suite)
    spec["path"] = os.path.abspath(spec["path"])       # the other process has a folder of its own
    return {"spec": spec, "param_args": dict(getattr(task, "param_args", {}) or {}),
            "name": str(getattr(task, "name", "")), "ref": str(getattr(task, "ref", "") or "")}


def suite_task(data: dict):
    """A suite task rebuilt from `suite_task_data`: `suite`, `param_args`, `name`, `ref`."""
    from types import SimpleNamespace

    d = dict(data["spec"])
    d["configs"] = tuple(RkbConfig(**c) for c in d.get("configs", ()))
    d["flagged"], d["notes"] = tuple(d.get("flagged", ())), tuple(d.get("notes", ()))
    return SimpleNamespace(suite=SuiteSpec(**d), param_args=dict(data.get("param_args", {})),
                           name=data.get("name", ""), ref=data.get("ref", ""))


def format_gib(n: float) -> str:
    """Bytes as GiB for messages, e.g. '1.5 GiB', '140 GiB'."""
    return f"{n / 2**30:.3g} GiB"


def over_limit(needed: int, limit: int) -> str | None:
    """None when `needed` bytes fit in `limit` (device memory or a host limit; 0 or less: no limit),
    else the message 'needs X GiB, limit Y GiB', so a task too big fails before anything runs."""
    if limit <= 0 or needed <= limit:
        return None
    a, b = format_gib(needed), format_gib(limit)
    if a == b:                      # just over: the exact figures tell them apart
        a, b = f"{a} ({needed:,} bytes)", f"{b} ({limit:,} bytes)"
    return f"needs {a}, limit {b}"
