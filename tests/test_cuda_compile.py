"""CUDA backend, host side only: nvcc builds, ptxas facts, diagnostics, the cache. No GPU needed."""
from __future__ import annotations

import shutil

import pytest

from kfray.config import EvalConfig
from kfray.eval.backends.base import CompileError
from kfray.eval.backends.cuda import CudaBackend, normalize_arch, parse_ptxas
from kfray.source import parse_params
from kfray.tasks import load_task

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

SEEDS = [(t, s) for t in ("axpb", "softmax", "matmul") for s in load_task(t).seeds_for("cuda")]

PTXAS_SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z3bigPfi' for 'sm_90'
ptxas info    : Function properties for _Z3bigPfi
    1200 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 1200 bytes cumulative stack size
ptxas info    : Compile time = 124.200 ms
ptxas info    : Compiling entry function '_Z3fooPKfPfl' for 'sm_90'
ptxas info    : Function properties for _Z3fooPKfPfl
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 1.696 ms
ptxas info    : Function properties for _Z6helperPfi
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'old_style' for 'sm_75'
ptxas info    : Used 12 registers, 2048 bytes smem, 352 bytes cmem[0]
"""


@pytest.fixture
def backend(tmp_cache, monkeypatch):
    monkeypatch.setenv("KFRAY_CUDA_ARCH", "sm_90")
    return CudaBackend(EvalConfig(backend="cuda"))


def test_every_seed_has_the_exact_signature():
    assert len(SEEDS) >= 8
    for task, seed in SEEDS:
        assert load_task(task).signature("cuda") in seed.source, f"{task}/{seed.name}"
    names = {t: {s.name for s in load_task(t).seeds_for("cuda")} for t in ("axpb", "softmax", "matmul")}
    want = {"axpb": {"naive", "vec4", "ilp"}, "softmax": {"naive", "block", "warp", "rowcache"},
            "matmul": {"naive", "tiled", "regblock", "sgemm"}}
    for task, strategies in want.items():
        assert strategies <= names[task], (task, names[task])
        assert load_task(task).baseline_seed("cuda").name == "naive"


@pytest.mark.parametrize("task,seed", SEEDS, ids=[f"{t}-{s.name}" for t, s in SEEDS])
def test_seed_compiles_with_ptxas_facts(backend, task, seed):
    params = parse_params(seed.source).default()
    assert params, f"{task}/{seed.name} declares no @kf.param"
    build = backend.compile(seed.source, params, load_task(task))
    assert not build.cached and build.artifact.endswith(".so")
    facts = build.facts
    assert facts["kernels"], facts
    assert any(k["registers"] > 0 for k in facts["kernels"].values())
    assert facts["max_registers"] > 0 and facts["spills"] == 0
    assert facts["arch"] == "sm_90"
    print(f"{task}/{seed.name}: {build.seconds:.2f} s, {facts['max_registers']} registers")


def test_every_setting_of_a_small_space_compiles(backend):
    task = load_task("softmax")
    seed = next(s for s in task.seeds_for("cuda") if s.name == "block")
    settings = list(parse_params(seed.source).settings())
    assert len(settings) >= 2 and len({s["BLOCK"] for s in settings}) >= 2, settings   # a space, not one point
    for setting in settings:
        b = backend.compile(seed.source, setting, task)
        assert max(k["smem_bytes"] for k in b.facts["kernels"].values()) == 4 * setting["BLOCK"]


def test_compile_error_carries_the_diagnostics(backend):
    src = ('#include <cstdint>\n' + load_task("axpb").signature("cuda")
           + ' {\n    undefined_helper(x);\n    return 0;\n}\n')
    with pytest.raises(CompileError) as e:
        backend.compile(src, {}, load_task("axpb"))
    msg = str(e.value)
    assert "undefined_helper" in msg and "kernel.cu" in msg and "is undefined" in msg
    assert ".tmp" not in msg and str(backend.cache.root) not in msg


def test_bad_parameter_is_a_compile_error(backend):
    seed = load_task("axpb").seeds_for("cuda")[0]
    with pytest.raises(CompileError):
        backend.compile(seed.source, {"BLOCK": "256; rm -rf /"}, load_task("axpb"))


def test_second_compile_is_a_cache_hit_with_the_same_facts(backend, tmp_cache):
    task = load_task("matmul")
    seed = next(s for s in task.seeds_for("cuda") if s.name == "regblock")
    params = parse_params(seed.source).default()
    first = backend.compile(seed.source, params, task)
    again = backend.compile(seed.source, params, task)
    assert again.cached and again.artifact == first.artifact and again.facts == first.facts
    # a fresh backend (another evaluator) sharing the folder sees it too
    other = CudaBackend(EvalConfig(backend="cuda"))
    assert other.compile(seed.source, params, task).cached
    # a different arch or parameter setting is a different build
    other.arch = "sm_80"
    assert not other.compile(seed.source, params, task).cached
    assert not backend.compile(seed.source, {**params, "BK": 32 if params["BK"] != 32 else 8}, task).cached


def test_parse_ptxas_sample():
    f = parse_ptxas(PTXAS_SAMPLE)
    assert set(f["kernels"]) == {"_Z3bigPfi", "_Z3fooPKfPfl", "old_style"}
    assert f["kernels"]["_Z3bigPfi"] == {"registers": 255, "smem_bytes": 0, "spill_stores": 24,
                                         "spill_loads": 16, "stack_bytes": 1200}
    assert f["kernels"]["_Z3fooPKfPfl"] == {"registers": 10, "smem_bytes": 1024, "spill_stores": 0,
                                            "spill_loads": 0, "stack_bytes": 0}
    assert f["kernels"]["old_style"]["registers"] == 12 and f["kernels"]["old_style"]["smem_bytes"] == 2048
    assert f["max_registers"] == 255
    assert f["spills"] == 24 + 16 + 4 + 4     # device functions' spills count too
    assert parse_ptxas("") == {"kernels": {}, "max_registers": 0, "max_smem_bytes": 0, "spills": 0}


def test_arch_names(monkeypatch, tmp_cache):
    assert normalize_arch("90") == normalize_arch("9.0") == normalize_arch("sm_90") == "sm_90"
    assert normalize_arch("sm_90a") == "sm_90a" and normalize_arch("compute_80") == "sm_80"
    monkeypatch.setenv("KFRAY_CUDA_ARCH", "8.6")
    b = CudaBackend(EvalConfig(backend="cuda"))
    assert b.arch == "sm_86"


def test_no_gpu_facts_and_hardware_class(backend):
    from kfray.eval.backends.cuda import gpu_properties

    if gpu_properties() is not None:
        pytest.skip("a GPU is visible here")
    assert backend.hardware_class() == "cuda:sm_90"
    assert backend.device_facts() == {"name": "no GPU visible", "arch": "sm_90"}
