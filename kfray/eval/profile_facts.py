"""A kernel's profiler facts (kfray/eval/backends/cuda/profile.py) as one line of text, the same
for the prompts, the terminal summary and the report: what a person reads first when a kernel is
slower than its roofline (is it memory- or compute-bound, does it keep the SMs full, what stalls)."""
from __future__ import annotations


def profile_text(p: dict | None) -> str:
    if not p:
        return ""
    if p.get("error"):
        return f"no profile ({p['error']})"
    parts = []
    for key, name in (("achieved_occupancy_pct", "achieved occupancy"), ("dram_throughput_pct", "DRAM throughput"),
                      ("sm_throughput_pct", "SM throughput")):
        if isinstance(p.get(key), (int, float)):
            parts.append(f"{name} {p[key]:.0f}% of peak" if key != "achieved_occupancy_pct" else f"{name} {p[key]:.0f}%")
    stalls = ", ".join(f"{s['reason']} ({s['cycles_per_issue']:.1f})" for s in p.get("main_stalls") or [])
    if stalls:
        parts.append(f"main stalls: {stalls} cycles per issue")
    where = f" [{p['kernel']}, {p.get('shape', '?')}]" if p.get("kernel") else ""
    return "; ".join(parts) + where
