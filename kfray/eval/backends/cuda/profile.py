"""Nsight Compute facts for an elite: achieved occupancy, DRAM and SM throughput as a share of
peak, and the main warp-stall reasons, read by `ncu --csv` from one kf_forward call.

Why only elites: ncu replays each kernel many times (one pass per metric group) and takes seconds,
so it stays off the per-candidate path; the run profiles each task's best at its end
(eval.ncu) and the facts go into the summary, the report and, as an elite's facts, the prompts.
Best effort: no ncu, no counters (gVisor), a timeout: a fact dict with `error`, never an exception.
"""
from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
from typing import Any

STALLS = ("long_scoreboard", "short_scoreboard", "barrier", "mio_throttle", "lg_throttle", "math_pipe_throttle",
          "wait", "not_selected", "membar", "imc_miss", "no_instruction", "dispatch_stall", "tex_throttle")
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    **{f"stall_{s}": f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS},
}


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> dict[str, Any]:
    """ncu's `--csv` page (one row per kernel launch and metric) -> the facts of the launch that
    took longest (kf_forward's main kernel), with the top three stall reasons."""
    start = text.find('"ID"')
    if start < 0:
        return {"error": "ncu printed no metrics" + (f": {text.strip()[-200:]}" if text.strip() else "")}
    by_name = {v: k for k, v in METRICS.items()}
    launches: dict[str, dict[str, Any]] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        key, value = by_name.get(row.get("Metric Name", "")), _number(row.get("Metric Value", ""))
        if key is None or value is None:
            continue
        launch = launches.setdefault(row["ID"], {"kernel": row.get("Kernel Name", "?")})
        if row.get("Metric Unit") in ("usecond", "msecond", "second") and key == "duration_ns":
            value *= {"usecond": 1e3, "msecond": 1e6, "second": 1e9}[row["Metric Unit"]]
        launch[key] = value
    if not launches:
        return {"error": "ncu printed none of the requested metrics"}
    main = max(launches.values(), key=lambda d: d.get("duration_ns", 0.0))
    stalls = sorted(((k[6:], v) for k, v in main.items() if k.startswith("stall_")), key=lambda kv: -kv[1])
    out = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in main.items() if not k.startswith("stall_")}
    out["main_stalls"] = [{"reason": r, "cycles_per_issue": round(v, 2)} for r, v in stalls[:3] if v > 0]
    out["launches"] = len(launches)
    return out


def ncu_command(artifact: str, task_ref: str, shape: str, ncu: str = "ncu") -> list[str]:
    """ncu over the profiling driver; --clock-control none leaves the card's clocks alone and
    --profile-from-start off limits it to the kf_forward call (not the input draws)."""
    return [ncu, "--csv", "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
            "--metrics", ",".join(METRICS.values()),
            sys.executable, "-m", "kfray.eval.backends.cuda", "profile", artifact, task_ref, shape]


def find_ncu() -> str | None:
    """ncu on PATH, else where the CUDA toolkit or Nsight Compute installs put it."""
    found = shutil.which("ncu")
    if found:
        return found
    import glob
    for pattern in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda-*/bin/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def profile_artifact(artifact: str, task_ref: str, shape: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """The ncu facts of one kf_forward call of a built kernel, or {"error": why not}."""
    ncu = find_ncu()
    if ncu is None:
        return {"error": "ncu is not on PATH"}
    try:
        p = subprocess.run(ncu_command(artifact, task_ref, shape, ncu), capture_output=True, text=True,
                           timeout=timeout_s, env={**os.environ, "CUPY_TF32": "0"})
    except subprocess.TimeoutExpired:
        return {"error": f"ncu took over {timeout_s:.0f} s"}
    facts = parse_ncu_csv(p.stdout)
    if "error" in facts and p.returncode != 0:
        facts["error"] += f" (exit {p.returncode}: {p.stderr.strip()[-300:]})"
    facts["shape"] = shape
    return facts


def run_driver(artifact: str, task_ref: str, shape: str) -> int:
    """Under ncu: draw one shape's inputs, then one kf_forward call between profiler start/stop."""
    import ctypes

    import cupy as cp
    import numpy as np

    from kfray.tasks import load_task
    from kfray.tasks.base import Tensor

    task = load_task(task_ref)
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    args = task.make_args(shape, np.random.default_rng(0), xp=cp)
    lib = ctypes.CDLL(artifact)
    fn = lib.kf_forward
    fn.restype = ctypes.c_int
    ctype = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int32": ctypes.c_int32, "int64": ctypes.c_int64}
    fn.argtypes = [ctypes.c_void_p if isinstance(a, Tensor) else ctype[a.dtype] for a in task.args] + [ctypes.c_void_p]
    call = [args[a.name].data.ptr if isinstance(a, Tensor) else args[a.name] for a in task.args] + [stream.ptr]
    fn(*call)                                  # warm: module load outside the profiled range
    stream.synchronize()
    cp.cuda.profiler.start()
    rc = fn(*call)
    stream.synchronize()
    cp.cuda.profiler.stop()
    return rc
