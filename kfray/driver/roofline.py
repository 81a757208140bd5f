"""The end-of-run roofline of each CPU task's best: the machine's measured copy bandwidth and
fp32 FMA peak (kfray.eval.backends.cpu_peaks, measured once per machine and thread count, here on
the driver's machine, which for a CPU run on one machine is the evaluators' own) and the best's
share of them, per shape and overall, as the GPU's facts give its copy bandwidth and fp32 rate.
A memory-bound best is also held against a copy of each shape's footprint timed as the harness
timed the best (its median call over the same rotation, with the kernels' idle time between calls),
which re-timing measures right after each round's kernels of the task (kfray.driver.retime)."""
from __future__ import annotations

from typing import Any

from kfray.config import kernel_threads
from kfray.eval.backends.cpu import compiler, compiler_version, cpu_facts
from kfray.eval.backends.cpu_peaks import cache_root, copy_like_a_kernel, cpu_peaks, roofline_entry
from kfray.eval.timed_runs import rotation


def machine_peaks(cfg) -> dict[str, Any]:
    """This machine's peaks on an eval config's thread count: from the cache, else measured now."""
    cxx = compiler()
    threads = kernel_threads(cfg)
    return cpu_peaks(cxx, compiler_version(cxx), cpu_facts()["name"], threads, cache_root(cfg))


def task_copies(cfg, task, gaps_us: dict[str, float] | None = None) -> dict[str, float]:
    """shape -> GB/s of a copy of that shape's footprint, rotated and timed as the harness times a
    kernel (cpu_peaks.copy_like_a_kernel), with `gaps_us[shape]` idle between calls (the kernels'
    own cadence), for the shapes of a task re-timed on a CPU class (eval config `cfg`) that the
    machine's copy bandwidth bounds; {} otherwise or when it cannot be measured. Re-timing calls it
    right after each round's kernels of the task, so that the two share a moment of the machine: at
    the end of a run other work still comes and goes (a copy timed a few seconds later read from
    0.5x to 1.9x of one timed beside the kernels)."""
    if cfg.backend != "cpu":
        return {}
    try:
        peaks = machine_peaks(cfg)
        bw, peak = float(peaks.get("machine_copy_gbps") or 0), float(peaks.get("fp32_fma_peak_gflops") or 0)
        if bw <= 0 or peak <= 0:
            return {}
        cxx = compiler()
        out = {}
        for shape in task.shapes:
            nbytes, flops = task.cost(shape)
            if nbytes <= 0 or flops / nbytes >= peak / bw:     # compute-bound: the FMA peak is its ceiling
                continue
            sets = rotation(task, shape, int(cpu_facts().get("cache_bytes") or 32 << 20))
            gbps = copy_like_a_kernel(cxx, compiler_version(cxx), kernel_threads(cfg), cache_root(cfg), nbytes, sets,
                                      (gaps_us or {}).get(shape, 0.0))
            if gbps > 0:
                out[shape] = gbps
        return out
    except Exception:       # noqa: BLE001 - figures for the summary, never a failed run
        return {}


def add_rooflines(co, per_task: dict[str, dict[str, Any]]) -> None:
    """entry["roofline"] for each task whose correct best ran on a cpu class (nothing otherwise)."""
    peaks: dict[int, dict] = {}
    for ref, entry in per_task.items():
        best = co.ledger.tasks[ref].best
        hc = co.by_label.get(entry.get("best_hardware") or "")
        if not entry.get("correct") or not best or hc is None or hc.cfg.backend != "cpu":
            continue
        threads = kernel_threads(hc.cfg)
        if threads not in peaks:
            try:
                peaks[threads] = machine_peaks(hc.cfg)
            except Exception:       # noqa: BLE001 - figures for the summary, never a failed run
                peaks[threads] = {}
        task = co.tasks[ref]
        # the re-timed figure where there is one, and the copies timed beside it (kfray.driver.retime)
        again = (entry.get("retimed") or {}).get(entry.get("best_candidate"), {})
        times = again.get("times") or best[1].times
        same_way = again.get("copy_gbps_same_way") or {}
        roof = roofline_entry(task, times, peaks[threads], same_way)
        if roof:
            entry["roofline"] = roof
