"""The offline proposer's CUDA edits: each applies where its pattern is, keeps the kf_forward
contract, moves the kernel's descriptor cell the way it should, and still builds with nvcc.
A GPU test (marked, skipped without one) checks that edited kernels stay correct."""
from __future__ import annotations

import random
import shutil
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import pytest

from kfray.descriptors import describe
from kfray.proposers import cuda_edits, cuda_reductions
from kfray.source import parse_params
from kfray.tasks import load_task

EDITS = {**cuda_edits.EDITS, **cuda_reductions.EDITS}


def seed(task: str, name: str) -> str:
    return next(s.source for s in load_task(task).seeds_for("cuda") if s.name == name)


# (edit, task, seed, descriptor dimension it must raise: (index, at least), or None)
CASES = [
    ("vector_io", "axpb", "naive", (0, 1)),
    ("grid_stride", "axpb", "naive", (2, 1)),
    ("grid_stride", "softmax", "block", None),
    ("unroll", "softmax", "naive", (1, 1)),
    ("launch_bounds", "matmul", "naive", (2, 1)),
    ("launch_bounds", "matmul", "sgemm", None),
    ("cache_hints", "axpb", "naive", (0, 1)),
    ("cache_hints", "softmax", "warp", None),
    ("pad_shared", "matmul", "tiled", None),
    ("warp_reduce", "softmax", "block", (2, 3)),
    ("online_softmax", "softmax", "naive", (1, 2)),
]


def _edited(edit, task, name, rs=0):
    return EDITS[edit](seed(task, name), random.Random(rs))


@pytest.mark.parametrize("edit,task,name,moves", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_edit_applies_keeps_contract_and_moves_cell(edit, task, name, moves):
    src = seed(task, name)
    out = EDITS[edit](src, random.Random(0))
    assert out and out != src
    assert load_task(task).signature("cuda") in out and out.count("kf_forward(") == 1
    space = parse_params(out)
    assert space.allows(space.default())
    if moves:
        dim, level = moves
        assert describe(src, "cuda")[dim] < level <= describe(out, "cuda")[dim], (describe(src, "cuda"), describe(out, "cuda"))


def test_edits_do_not_apply_where_their_pattern_is_absent():
    assert cuda_edits.vector_io(seed("matmul", "naive"), random.Random(0)) is None     # not elementwise
    assert cuda_reductions.warp_reduce(seed("softmax", "warp")) is None                # shuffles already
    assert cuda_reductions.online_softmax(seed("softmax", "block")) is None            # reductions between
    assert cuda_edits.pad_shared(seed("axpb", "naive"), random.Random(0)) is None      # no shared tile
    sgemm = seed("matmul", "sgemm")
    assert "As[2][BK][BM]" in sgemm and "As[2][BK][BM + 1]" not in (cuda_edits.pad_shared(sgemm, random.Random(0)) or "")


def test_vector_io_moves_four_floats_per_access_with_a_scalar_tail():
    out = cuda_edits.vector_io(seed("axpb", "naive"), random.Random(0))
    assert "reinterpret_cast<const float4*>(x)[kf_i]" in out and "reinterpret_cast<float4*>(y)[kf_i] = kf_o" in out
    assert "kf_v * 4 + kf_t" in out and "& 15) == 0" in out            # tail and alignment guard
    assert "+ 3) / 4)" in out                                            # a quarter of the blocks


def test_unroll_and_launch_bounds_draw_their_parameter():
    seen_unroll = {cuda_edits.unroll(seed("softmax", "naive"), random.Random(i)).count("#pragma unroll 8") > 0
                   for i in range(12)}
    assert seen_unroll == {True, False}
    lbs = {cuda_edits.launch_bounds(seed("axpb", "ilp"), random.Random(i)).split("__launch_bounds__(")[1].split(")")[0]
           for i in range(12)}
    assert {"BLOCK, 2", "BLOCK, 4", "BLOCK, 8"} <= lbs


def test_grid_stride_adds_an_occupancy_parameter():
    out = cuda_edits.grid_stride(seed("axpb", "naive"), random.Random(0))
    assert "i += (int64_t)gridDim.x * blockDim.x" in out
    assert "cudaOccupancyMaxActiveBlocksPerMultiprocessor" in out
    assert set(parse_params(out).values["KF_WAVES"]) == {1, 2, 4, 8}
    again = cuda_edits.grid_stride(out, random.Random(1))
    assert again is None or again.count("kf_grid_cap(long long") == 1   # one helper, never two


def _compound() -> str:
    rng, src = random.Random(5), seed("axpb", "naive")
    for edit in ("vector_io", "grid_stride", "launch_bounds", "cache_hints", "unroll"):
        src = EDITS[edit](src, rng) or src
    return src


def test_edits_compound():
    src = _compound()
    assert describe(src, "cuda") == (1, 1, 1), describe(src, "cuda")
    assert "kf_grid_cap" in src and "__launch_bounds__" in src and "#pragma unroll" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_edited_kernels_compile(tmp_cache, monkeypatch):
    """Compile-only: every edit's output (and a chain of five) still builds, without spills."""
    from kfray.config import EvalConfig
    from kfray.eval.backends.cuda import CudaBackend

    monkeypatch.setenv("KFRAY_CUDA_ARCH", "sm_90")
    backend = CudaBackend(EvalConfig(backend="cuda"))
    jobs = [(t, _edited(e, t, n)) for e, t, n, _ in CASES] + [("axpb", _compound())]

    def build(job):
        task, src = job
        return backend.compile(src, parse_params(src).default(), load_task(task))

    with ThreadPoolExecutor(2) as pool:
        builds = list(pool.map(build, jobs))
    for b in builds:
        assert b.artifact.endswith(".so") and b.facts["spills"] == 0, b.facts


def _gpu_reason() -> str | None:
    try:
        import cupy
        return None if cupy.cuda.runtime.getDeviceCount() > 0 and shutil.which("nvcc") else "no GPU or nvcc"
    except Exception as e:
        return f"no usable GPU ({type(e).__name__})"


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_reason() is not None, reason=_gpu_reason() or "")
def test_edited_kernels_are_correct_on_the_gpu(tmp_path):
    from kfray.candidate import Candidate, EvalResult
    from kfray.config import EvalConfig
    from kfray.eval.evaluator import Evaluator

    ev = Evaluator("cuda", EvalConfig(backend="cuda", cache_dir=str(tmp_path), timeout_s=120))
    try:
        for task, src in [(t, _edited(e, t, n)) for e, t, n, _ in CASES] + [("axpb", _compound())]:
            c = Candidate(task=task, language="cuda", source=src, params=parse_params(src).default())
            r = EvalResult.from_dict(ev.evaluate(c))
            assert r.tier == 5, (task, r.reason)
    finally:
        ev.shutdown()


SUITE_KERNELS = Path(__file__).parent / "data" / "suite_kernels"
SUITE_EXT = (SUITE_KERNELS / "relu_ext.cu").read_text()


def suite_ext_with_threads() -> str:
    """The suite-form ReLU extension with its block size in a host constant, as published kernels write it."""
    return (SUITE_KERNELS / "relu_ext_threads.cu").read_text()


def test_block_size_makes_a_host_constant_block_a_tunable():
    src = suite_ext_with_threads()
    out = cuda_edits.block_size(src, random.Random(0))
    assert "const int threads = KF_BLOCK_THREADS;" in out
    space = parse_params(out)
    assert space.values["KF_BLOCK_THREADS"] == (256, 64, 128, 512, 1024)      # its own value first
    assert cuda_edits.block_size(out, random.Random(0)) is None                 # a tunable already
    assert cuda_edits.block_size(SUITE_EXT, random.Random(0)) is None            # a literal: nothing to name
    dim3 = src.replace("const int threads = 256;", "const dim3 threads(256);")
    assert cuda_edits.block_size(dim3, random.Random(0)) is None
    defined = "#define THREADS 128\n" + src.replace("const int threads = 256;\n", "").replace("threads", "THREADS")
    assert set(parse_params(cuda_edits.block_size(defined, random.Random(0))).values["KF_BLOCK_THREADS"]) == \
        {32, 64, 128, 256, 512}


def test_offline_search_edits_suite_cuda_extensions_not_modelnew_files():
    """A suite task's CUDA extension gets the CUDA edits (robust-kbench kernels are searched without a
    model); each child still binds the suite's function and its best file builds without kfray's flags."""
    from collections import Counter

    from kfray.candidate import Candidate, EvalResult
    from kfray.proposers.base import ProposalContext
    from kfray.proposers.offline import OfflineProposer, operators_for
    from kfray.search.archive import Elite
    from kfray.tasks.suite_form import best_file

    task = load_task("kernelbench:" + str(Path(__file__).parent / "data" / "kernelbench" / "level1" / "1_Relu.py"))
    src = suite_ext_with_threads()
    assert "block_size" in operators_for("suite", src) and "unroll" in operators_for("suite", src)
    modelnew = task.seeds_for("suite")[0].source
    assert "block_size" not in operators_for("suite", modelnew)
    parent = Elite(Candidate(task=task.name, language="suite", source=src, params={}),
                   EvalResult(candidate_id="p", tier=5, times={"s": 1.0}, ref_times={"s": 1.0}))
    rng, ops = random.Random(3), Counter()
    for i in range(40):
        ctx = ProposalContext(task=task, language="suite", parent=parent, inspirations=[], target_cell=None,
                              meta_prompt=None, device_facts={}, island=0, generation=i + 1, occupied=set())
        child = OfflineProposer().propose(ctx, rng)
        ops[child.origin.split(":", 1)[1]] += 1
        if "ModelNew" in child.source:
            continue                                    # switched to the reference seed
        assert 'm.def("forward", &forward)' in child.source
        space = parse_params(child.source)
        assert set(child.params) == set(space.values) and space.allows(child.params)
        _, text = best_file(child.source, child.params, task.suite, "torch_ext_cuda")
        assert all(f"#define {k} {v}\n" in text for k, v in child.params.items())
    assert {"block_size", "cache_hints"} <= set(ops), ops
