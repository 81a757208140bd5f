"""KernelBench's published baseline times (its results/timing/<hardware>/baseline_time_torch*.json):
the eager PyTorch time KernelBench measured per problem, for a speedup against its own figure
(`eval.suite_baseline: PATH`) beside the one against eager PyTorch timed alongside."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from kfray.errors import ConfigError


@lru_cache(maxsize=8)
def _load(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"eval.suite_baseline: {path}: cannot read a KernelBench baseline file: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"eval.suite_baseline: {path}: not a KernelBench baseline file (levels -> problems)")
    return data


def published_baseline(path: str, problem_file: str) -> dict | None:
    """{"mean_ms", "hardware", "file"} for the problem (its level folder and file name), or None."""
    if not path:
        return None
    p = Path(problem_file)
    entry = _load(path).get(p.parent.name, {}).get(p.name)
    if not isinstance(entry, dict) or "mean" not in entry:
        return None
    return {"mean_ms": float(entry["mean"]), "hardware": entry.get("hardware", ""), "file": path}
