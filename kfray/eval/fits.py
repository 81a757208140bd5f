"""Will a suite task fit? Checked in the evaluator's process before anything compiles or runs, so a
problem too large for the device, or for the sandbox's memory limit, is refused with what it needs
and is never charged to a kernel.

The suite harness (kfray/eval/suite/) holds a configuration's inputs and parameters, a
snapshot of them (the inputs-unchanged check), and both sides' outputs: about three times the
task's bytes (inputs + parameters + outputs) at its peak.
"""
from __future__ import annotations

from kfray.tasks.suite_spec import over_limit

HARNESS_FACTOR = 3
HOST_RUNTIME_BYTES = 3 << 29        # PyTorch's own address space in a CPU sandbox, about 1.5 GiB


def fit_message(task, backend_name: str, cfg, device_facts: dict | None = None) -> str | None:
    """None when the task fits, else 'needs X GiB, limit Y GiB (what the limit is)'."""
    spec = getattr(task, "suite", None)
    need = int(getattr(spec, "bytes_needed", 0) or 0) * HARNESS_FACTOR
    if need <= 0:
        return None
    if "cuda" in backend_name:
        facts = device_facts or {}
        total = int(float(facts.get("global_memory_gb", 0) or 0) * 1e9)
        why = over_limit(need, total)
        return f"{why} (memory of {facts.get('name', 'the GPU')})" if why else None
    limit = int(getattr(cfg, "memory_limit_mb", 0) or 0) << 20
    why = over_limit(need + HOST_RUNTIME_BYTES, limit)
    return f"{why} (the sandbox's address-space limit, eval.memory_limit_mb={cfg.memory_limit_mb})" if why else None
