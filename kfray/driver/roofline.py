"""The end-of-run roofline of each CPU task's best: the machine's measured copy bandwidth and
fp32 FMA peak (kfray.eval.backends.cpu_peaks, measured once per machine and thread count, here on
the driver's machine, which for a CPU run on one machine is the evaluators' own) and the best's
share of them, per shape and overall, as the GPU's facts give its copy bandwidth and fp32 rate."""
from __future__ import annotations

from typing import Any

from kfray.config import kernel_threads
from kfray.eval.backends.cpu import compiler, compiler_version, cpu_facts
from kfray.eval.backends.cpu_peaks import cache_root, cpu_peaks, roofline_entry


def machine_peaks(cfg) -> dict[str, Any]:
    """This machine's peaks on an eval config's thread count: from the cache, else measured now."""
    cxx = compiler()
    threads = kernel_threads(cfg)
    return cpu_peaks(cxx, compiler_version(cxx), cpu_facts()["name"], threads, cache_root(cfg))


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
        roof = roofline_entry(co.tasks[ref], best[1].times, peaks[threads])
        if roof:
            entry["roofline"] = roof
