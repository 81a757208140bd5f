"""kfray's defences against reward hacks, one place: which path applies which, and the rules that
are not a check of outputs (the outside clock, the second-look bound).

A search optimizes exactly what the judge measures, so every hole gets found. The checks of
outputs live where they run (correctness.py, timed_runs.py, suite/judge.py); this table says
which path has each, and `kfray doctor` / the README print it.

Paths: `kf_forward` (kfray's own form, the cpu and cuda backends: candidate in its runner, on
memfd or CUDA IPC buffers), `suite` (KernelBench / robust-kbench forms, torch_ext_cpu and
torch_ext_cuda: candidate in its runner), `in_judge` (forms that cannot run a candidate apart yet:
SYCL; kfray.eval.state_check recycles such a judge when the
candidate changed anything it can see, and voids the verdict of one that replaced a function or
flipped a flag).
"""
from __future__ import annotations

import statistics

REVIEW_SPEEDUP = 10.0     # KernelBench asks for a second look at anything faster than this

# (defence, what it stops, paths that apply it)
DEFENCES: list[tuple[str, str, tuple[str, ...]]] = [
    ("data-only wire", "a kernel writing a forged or executable answer into its sockets (JSON, size cap, "
     "schema; nothing is unpickled)", ("kf_forward", "suite", "in_judge")),
    ("verdict apart from the candidate", "patched clocks, patched torch functions, flipped global flags "
     "(inputs, reference, comparison and its timing live in the judge, which never loads a candidate)",
     ("kf_forward", "suite")),
    ("fresh process per candidate", "state left for the next candidate: flags, patched functions, threads, "
     "sys.modules (runners fork from a clean zygote)", ("kf_forward", "suite")),
    ("state check of the judge", "the same, where the candidate ran in the judge: its state is fingerprinted "
     "before the candidate loads, the judge is recycled on any change, and a replaced function or flipped "
     "flag voids the verdict", ("in_judge",)),
    ("outside clock", "faked times: the judge times every call from its side of the wire and flags a "
     "claim that its clock cannot account for", ("kf_forward", "suite")),
    ("candidate paused while the reference is timed", "a kernel loading the machine to slow the reference",
     ("kf_forward", "suite")),
    ("poisoned outputs", "outputs left unwritten or read before written", ("kf_forward", "in_judge")),
    ("fresh inputs on every check, kernel before reference", "cached results, copying the reference",
     ("kf_forward", "suite", "in_judge")),
    ("late-write check", "work left running on another thread or stream after the call returned",
     ("kf_forward", "suite", "in_judge")),
    ("inputs and parameters unchanged", "mutated inputs (zeroed, reused as scratch)",
     ("kf_forward", "suite", "in_judge")),
    ("rotated input sets, fresh tensors per timed call", "memoising by input identity or address",
     ("kf_forward", "suite", "in_judge")),
    ("spot checks of timed calls", "skipping work when timed", ("kf_forward", "suite", "in_judge")),
    ("guard zones", "writes outside a buffer (wrong tails)", ("kf_forward",)),
    ("stream probe", "work on another CUDA stream: the call again with the stream held, outputs written "
     "meanwhile are refused (kf_forward in its runner: the runner's stream held, the outputs watched from "
     "the judge)", ("kf_forward", "suite", "in_judge")),
    ("judge's memory apart", "a runner reaching the judge's own device memory through an IPC handle (which "
     "maps a whole allocation): the judge shares only allocations that hold nothing else of its own",
     ("kf_forward", "suite")),
    ("busy context counts wall time", "work on another CUDA stream, kf_forward in its runner: the runner "
     "syncs its context before it answers, and a call whose context was still busy after its stream "
     "finished is charged its wall time", ("kf_forward",)),
    ("roofline bound", "times faster than the hardware allows", ("kf_forward", "suite", "in_judge")),
    (f"second look above {REVIEW_SPEEDUP:g}x", "anything else too good to be true (flagged, not rejected)",
     ("kf_forward", "suite", "in_judge")),
]


def table() -> str:
    """The defences as a Markdown table (README, doctor)."""
    paths = ("kf_forward", "suite", "in_judge")
    rows = ["| defence | stops | " + " | ".join(paths) + " |", "|---|---|" + "---|" * len(paths)]
    for name, stops, where in DEFENCES:
        rows.append(f"| {name} | {stops} | " + " | ".join("yes" if p in where else "-" for p in paths) + " |")
    return "\n".join(rows)


def fixed_cost(log: list[tuple[float, float, float]], round_trip: tuple[float, float]) -> float:
    """What a runner's request costs beyond its call, the wire and the waits for a CPU (median)."""
    return statistics.median(o - w - c for o, c, w in log) - round_trip[0] if log else 0.0


def clock_check(log: list[tuple[float, float, float]], round_trip: tuple[float, float],
                overhead: float = 0.0, beside: list | None = None) -> str | None:
    """Why a kernel's claimed call times cannot be its own, or None. `log` holds (the judge's
    seconds around the request, the seconds the runner claims for the call, the seconds the OS
    scheduler kept the judge's and the runner's request threads waiting for a CPU meanwhile),
    `round_trip` the median and 90th percentile of an empty request before the candidate was
    loaded, `overhead` what the runner's own part of a request costs beyond the call (input clones,
    output copies), as the judge measured the same work. A claim longer than the request that
    carried it is impossible; a median claim under half of what the judge's clock leaves after the
    wire, the waits for a CPU and that overhead, by more than the wire's jitter, is faked. Without
    the waits, two evaluators sharing two cores got an honest 1.2 ms call flagged one time in 20:
    each request had waited about 2 ms for a CPU. `beside`: the log of another runner that ran the
    same requests on the same inputs (the other side of a suite comparison); its cost beyond its
    calls is the least `overhead` allowed: an honest runner's own part of a request (its syncs,
    events and answer) came to 0.3 ms a call on an H100, which the judge's copies and the wire left
    out, and robust-kbench references were flagged against themselves."""
    if not log:
        return None
    for i, (outside, claim, _) in enumerate(log):
        if claim > outside + 1e-4:
            return (f"timed call {i + 1} claimed {claim * 1e6:.1f} us but the judge's clock saw the whole request "
                    f"take {outside * 1e6:.1f} us [kfray rule: outside clock]")
    rt_med, rt_p90 = round_trip
    if beside:
        overhead = max(overhead, fixed_cost(beside, round_trip))
    med_out = statistics.median(o for o, _, _ in log)
    med_busy = statistics.median(o - w for o, _, w in log)       # the request, less its waits for a CPU
    med_claim = statistics.median(c for _, c, _ in log)
    excess = statistics.median(o - w - c for o, c, w in log) - overhead
    allowed = max(3 * rt_p90 + 200e-6, 0.25 * (med_busy - overhead))
    if excess > allowed and med_claim < 0.5 * (med_busy - rt_med - overhead):
        waits = med_out - med_busy
        return (f"the kernel's process claims {med_claim * 1e6:.1f} us a call, but the judge's clock saw "
                f"{med_out * 1e6:.1f} us a call, of which the wire's round trip is {rt_med * 1e6:.1f} us, "
                f"waits for a CPU {waits * 1e6:.1f} us and its copies {overhead * 1e6:.1f} us: the "
                "claimed times are not the kernel's own (a patched clock or timer) [kfray rule: outside clock]")
    return None


def copy_check(seconds: list[float], copy_s: float, round_trip: tuple[float, float]) -> str | None:
    """Why the copies of checked calls' outputs show work the kernel left for later, or None. The
    judge asks for a call's outputs after the call answered (suite/timed_calls.py); a kernel that
    finishes its result only when asked (a thread that watches the wire) makes the median copy
    request longer than the copy of that size (`copy_s`, the judge's own) and the wire allow."""
    if not seconds:
        return None
    med = statistics.median(seconds)
    allowed = 3 * copy_s + 3 * round_trip[1] + 2e-3
    if med > allowed:
        return (f"the judge's copies of checked calls' outputs took {med * 1e6:.0f} us (median of {len(seconds)}), "
                f"over the {allowed * 1e6:.0f} us that a copy of {copy_s * 1e6:.0f} us and the wire allow: the "
                "kernel's work was not done when its call answered [kfray rule: outside clock]")
    return None


def review_flag(times: dict, ref_times: dict) -> str | None:
    """A speedup beyond REVIEW_SPEEDUP (geometric mean over shapes), for a human's second look."""
    import math

    ratios = [ref_times[s] / t for s, t in times.items() if t and ref_times.get(s)]
    if not ratios:
        return None
    g = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    if g > REVIEW_SPEEDUP:
        return (f"speedup {g:.1f}x is above {REVIEW_SPEEDUP:g}x: worth a second look before it is believed "
                "(KernelBench's rule of thumb)")
    return None
