"""Per-shape timings of a kernel against its reference and the device's roofline."""
from __future__ import annotations

import math
from typing import Any

_BW_UNITS = {"tbps": 1e3, "gbps": 1.0, "gb_s": 1.0}          # -> GB/s
_FLOP_UNITS = {"tflops": 1e3, "tflop_s": 1e3, "gflops": 1.0, "gflop_s": 1.0}  # -> GFLOP/s


def _numbers(d: Any, prefix: str = ""):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _numbers(v, f"{prefix}{str(k).lower()}.")
    elif isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d) and d > 0:
        yield prefix.rstrip("."), float(d)


def ceilings(device_facts: dict | None) -> dict[str, tuple[str, float] | None]:
    """Bandwidth (GB/s) and fp32 rate (GFLOP/s) found in the device facts, with the key they came from.

    Keys are recognised by their unit: `copy_gbps`, `copy_bandwidth_gbps`, `fp32_gflops`,
    `fp32_matmul_tflops` ...; copy/fp32 figures are preferred over others."""
    bw, fl = [], []
    for key, v in _numbers(device_facts or {}):
        for unit, scale in _BW_UNITS.items():
            if key.endswith(unit):
                bw.append((("copy" in key) or ("bandwidth" in key), key, v * scale))
        for unit, scale in _FLOP_UNITS.items():
            if key.endswith(unit):
                fl.append(("fp32" in key, key, v * scale))
    pick = (lambda xs: max(xs)[1:] if xs else None)
    return {"gbps": pick(bw), "gflops": pick(fl)}


def task_cost(task_ref: str, shape: str) -> tuple[float, float] | None:
    """(bytes, flops) from the task definition, or None when the task cannot be loaded here."""
    try:
        from kfray.tasks import load_task

        task = load_task(task_ref)
        return task.cost(shape) if shape in task.shapes else None
    except Exception:  # noqa: BLE001 - a task from a package this machine lacks: use the facts
        return None


def shape_rows(cand: dict, device_facts: dict | None) -> list[dict]:
    """One row per shape config: time, reference, speedup, bytes, flops, achieved rates, roofline."""
    ceil = ceilings(device_facts)
    per_shape = (cand.get("facts") or {}).get("per_shape", {})
    rows = []
    for shape, t in (cand.get("times") or {}).items():
        ref = (cand.get("ref_times") or {}).get(shape)
        cost = task_cost(cand["task"], shape)
        f = per_shape.get(shape, {})
        if cost is None and t > 0:        # facts hold the achieved rates; bytes = rate * time
            cost = (f.get("gbps", 0.0) * 1e9 * t, f.get("gflops", 0.0) * 1e9 * t)
        nbytes, flops = cost or (0.0, 0.0)
        row = {"shape": shape, "time": t, "ref": ref, "speedup": ref / t if ref and t > 0 else None,
               "bytes": nbytes, "flops": flops,
               "gbps": nbytes / t / 1e9 if t > 0 else 0.0, "gflops": flops / t / 1e9 if t > 0 else 0.0,
               "roof": None, "bound": None, "of_roof": None}
        limits = []
        if ceil["gbps"] and nbytes:
            limits.append((nbytes / (ceil["gbps"][1] * 1e9), "memory"))
        if ceil["gflops"] and flops:
            limits.append((flops / (ceil["gflops"][1] * 1e9), "compute"))
        if limits:
            row["roof"], row["bound"] = max(limits)
            row["of_roof"] = row["roof"] / t if t > 0 else None
        rows.append(row)
    return rows


def roofline_cell(roof: dict | None) -> str:
    """`92% copy` / `61% FMA`: a best's share of the ceiling its task is bound by (summary["roofline"])."""
    if not roof:
        return "-"
    return f"{roof['share_of_bound'] * 100:.0f}% {'copy' if roof['bound'] == 'memory' else 'FMA'}"


def roofline_text(roof: dict) -> str:
    """One line: the best's rates against the machine's measured copy bandwidth and FMA peak."""
    per = roof.get("per_shape", {})
    gbps = max((p["gbps"] for p in per.values()), default=0.0)
    gflops = max((p["gflops"] for p in per.values()), default=0.0)
    same = (f"{roof['share_of_copy_same_way'] * 100:.0f}% of a copy of the same footprint timed the same way "
            f"(median call), " if roof.get("share_of_copy_same_way") else "")
    return (f"{same}{roof['share_of_copy_bw'] * 100:.0f}% of the machine's best-call copy bandwidth "
            f"({roof['machine_copy_gbps']:.1f} GB/s; best shape {gbps:.1f} GB/s), "
            f"{roof['share_of_fma_peak'] * 100:.0f}% of the FMA peak ({roof['fp32_fma_peak_gflops']:.0f} GFLOP/s; "
            f"best shape {gflops:.1f} GFLOP/s) on {roof.get('threads') or '?'} thread(s); {roof['bound']} bound")
