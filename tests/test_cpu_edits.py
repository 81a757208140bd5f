"""The CPU edits (kfray/proposers/cpu_edits.py) and the seeds at the machine's limit: each edit
applied to a seed, compiled and judged correct on the cpu backend, at shapes with tails
(`<task>@tails`), and each new seed correct at several of its settings. Speed is measured by
scripts/bench_cpu_default.py, not here."""
from __future__ import annotations

import random

import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.config import EvalConfig
from kfray.descriptors import describe
from kfray.eval.evaluator import Evaluator
from kfray.proposers import cpu_edits, loop_edits
from kfray.source import parse_params
from kfray.tasks import load_task


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    ev = Evaluator("cpu", EvalConfig(cache_dir=str(tmp_path_factory.mktemp("cache")), timeout_s=30, tune_budget=0,
                                     threads=2, repeats=1, max_repeats=1, min_time_s=0.0))
    yield ev
    ev.shutdown()


def _seed(task: str, name: str) -> str:
    return next(s.source for s in load_task(task).seeds_for("cpp") if s.name == name)


def _judge(ev, task: str, source: str, params: dict | None = None) -> EvalResult:
    space = parse_params(source)
    p = params if params is not None else space.default()
    c = Candidate(task=task, language="cpp", source=source, params=p)
    return EvalResult.from_dict(ev.evaluate(c, task_ref=f"{task}@tails"))


# (edit, task, seed, what the descriptors see afterwards: dimension and level, or None)
CASES = [
    ("parallel_blocks", "softmax", "twopass", ("parallelism", 2)),
    ("parallel_blocks", "matmul", "ikj", ("parallelism", 1)),
    ("collapse_loops", "matmul", "naive+parallel", ("parallelism", 1)),
    ("vector_math", "softmax", "twopass+simd", None),
    ("simd_width", "axpb", "simd", None),
    ("simd_width", "softmax", "twopass", None),
    ("assume_aligned", "axpb", "simd", None),
    ("assume_aligned", "matmul", "packed", None),
    ("prefetch", "matmul", "naive", ("memory", 3)),
    ("prefetch", "softmax", "online", ("memory", 3)),
    ("cache_block", "matmul", "ikj", None),
    ("cache_block", "matmul", "tiled", ("compute", 3)),
]
_DIM = {"memory": 0, "compute": 1, "parallelism": 2}


def _base(task: str, name: str) -> str:
    seed, _, step = name.partition("+")
    src = _seed(task, seed)
    if step == "parallel":
        src = loop_edits.add_parallel(src)
    elif step == "simd":
        src = loop_edits.add_simd(src, random.Random(0))
        src = loop_edits.add_simd(src, random.Random(1)) or src
    return src


@pytest.mark.parametrize("edit,task,seed,moves", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_edit_compiles_and_is_correct(evaluator, edit, task, seed, moves):
    src = _base(task, seed)
    new = cpu_edits.EDITS[edit](src, random.Random(3))
    assert new is not None and new != src, f"{edit} does not apply to {task}/{seed}"
    if moves is not None:
        dim, level = moves
        assert describe(new, "cpp")[_DIM[dim]] == level, describe(new, "cpp")
    space = parse_params(new)
    for p in [space.default(), *random.Random(4).sample(list(space.settings()), k=min(1, space.size()))]:
        r = _judge(evaluator, task, new, p)
        assert r.tier == 5, f"{edit} on {task}/{seed} {p}: {r.reason[:600]}"


def test_fast_exp_polynomial_is_vectorized_and_correct(evaluator):
    """loop_edits.fast_exp's polynomial rounds without floorf, so an `omp simd` loop of it vectorizes."""
    src = loop_edits.fast_exp(_base("softmax", "twopass+simd"))
    assert "__builtin_floorf(" not in src and "kf_fast_exp(" in src
    r = _judge(evaluator, "softmax", src)
    assert r.tier == 5, r.reason[:600]


def test_edits_that_do_not_apply_say_so():
    axpb_omp, packed = _seed("axpb", "omp"), _seed("matmul", "packed")
    assert cpu_edits.parallel_blocks(packed) is None          # threads of its own already
    assert cpu_edits.vector_math(axpb_omp) is None            # no exponential
    assert cpu_edits.simd_width(axpb_omp) is None             # no omp simd loop
    assert cpu_edits.collapse_loops(_seed("softmax", "naive")) is None   # no threaded loop
    twice = cpu_edits.prefetch(_seed("matmul", "naive"), random.Random(0))
    assert cpu_edits.prefetch(twice, random.Random(0)) is None
    assert cpu_edits.cache_block(_seed("softmax", "twopass"), random.Random(0)) is None   # accumulates outside


@pytest.mark.parametrize("task,seed", [("axpb", "stream"), ("softmax", "fused"), ("matmul", "packed")])
def test_new_seed_is_correct_at_its_settings(evaluator, task, seed):
    src = _seed(task, seed)
    space = parse_params(src)
    settings = list(space.settings())
    picks = [settings[0], settings[-1], *random.Random(5).sample(settings, k=2)]
    for p in picks:
        r = _judge(evaluator, task, src, p)
        assert r.tier == 5, f"{task}/{seed} {p}: {r.reason[:600]}"


def test_roofline_entry_shares_and_bound():
    from kfray.eval.backends.cpu_peaks import roofline_entry
    from kfray.report.roofline import roofline_cell, roofline_text

    peaks = {"machine_copy_gbps": 20.0, "fp32_fma_peak_gflops": 300.0, "peaks_threads": 2}
    axpb = load_task("axpb")
    times = {s: axpb.cost(s)[0] / 18e9 for s in axpb.shapes}          # 18 GB/s on every shape
    r = roofline_entry(axpb, times, peaks)
    assert r["bound"] == "memory" and r["share_of_copy_bw"] == pytest.approx(0.9, abs=1e-3)
    assert r["share_of_bound"] == r["share_of_copy_bw"] and roofline_cell(r) == "90% copy"
    mm = load_task("matmul")
    r = roofline_entry(mm, {s: mm.cost(s)[1] / 150e9 for s in mm.shapes}, peaks)
    assert r["bound"] == "compute" and roofline_cell(r) == "50% FMA"
    assert "50% of the FMA peak" in roofline_text(r)
    assert roofline_entry(mm, {"sq256": 1e-3}, {}) == {}             # no figures: no entry


def test_a_memory_bound_best_is_held_against_a_copy_timed_the_same_way():
    """The copy of the same footprint, timed by median call (as a kernel is), is the memory bound's
    share; the best-call copy stays beside it."""
    from kfray.eval.backends.cpu_peaks import roofline_entry
    from kfray.report.roofline import roofline_cell, roofline_text

    peaks = {"machine_copy_gbps": 20.0, "fp32_fma_peak_gflops": 300.0, "peaks_threads": 2}
    axpb = load_task("axpb")
    times = {s: axpb.cost(s)[0] / 15e9 for s in axpb.shapes}          # 15 GB/s on every shape
    r = roofline_entry(axpb, times, peaks, {s: 16.0 for s in axpb.shapes})
    assert r["share_of_copy_bw"] == pytest.approx(0.75, abs=1e-3)
    assert r["share_of_copy_same_way"] == pytest.approx(15 / 16, abs=1e-3) == r["share_of_bound"]
    assert roofline_cell(r) == "94% copy"
    assert "94% of a copy of the same footprint" in roofline_text(r) and "75% of the machine's best-call" in roofline_text(r)
    half = roofline_entry(axpb, times, peaks, {next(iter(axpb.shapes)): 16.0})   # not every shape: not used
    assert "share_of_copy_same_way" not in half and half["share_of_bound"] == half["share_of_copy_bw"]


def test_the_probe_times_a_copy_of_a_footprint_by_its_median_call(tmp_path):
    from kfray.eval.backends.cpu import compiler, compiler_version
    from kfray.eval.backends.cpu_peaks import copy_like_a_kernel

    cxx = compiler()
    gbps = copy_like_a_kernel(cxx, compiler_version(cxx), 1, tmp_path, 8 << 20, 4)
    assert 0.5 < gbps < 500, gbps                 # a real memory rate, read + write of 8 MiB a call


def test_the_probes_copy_keeps_the_kernels_cadence(tmp_path):
    """A kernel is called at the harness's cadence (idle time between calls), so the copy it is held
    against leaves the same idle time between its calls: the probe really waits it out."""
    import time

    from kfray.driver.retime import idle_gaps
    from kfray.eval.backends.cpu import compiler, compiler_version
    from kfray.eval.backends.cpu_peaks import copy_like_a_kernel

    cxx = compiler()
    copy_like_a_kernel(cxx, compiler_version(cxx), 1, tmp_path, 1 << 20, 4)           # builds the probe
    t0 = time.perf_counter()
    gbps = copy_like_a_kernel(cxx, compiler_version(cxx), 1, tmp_path, 1 << 20, 4, gap_us=5000)
    waited = time.perf_counter() - t0
    assert 0.5 < gbps < 500, gbps
    assert waited >= 2 * 64 * 0.005, waited        # 64 timed calls a store kind, 5 ms idle after each
    assert idle_gaps({"n1M": [300.0, 900.0, 600.0], "n4M": []}) == {"n1M": 600.0}
