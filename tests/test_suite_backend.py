"""Which backend a suite-form kernel file runs on (issue 25, "the GPU by default"): wherever PyTorch
sees a GPU, torch_ext_cuda, whatever the file holds; without one, torch_ext_cpu unless the file
holds CUDA code. Suite sweeps on GPUs run one evaluator per GPU unless told otherwise. And Ray's own
lines stay out of the terminal unless --verbose."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kfray.tasks.suite_form import suite_backend, suite_backend_note

DATA = Path(__file__).parent / "data"
RELU = "kernelbench:" + str(DATA / "kernelbench" / "level1" / "1_Relu.py")

MODELNEW_CUDA = '''import torch
from torch.utils.cpp_extension import load_inline
cuda_src = "__global__ void relu(const float* x, float* y, int n) { }"
ext = load_inline("relu", cpp_sources="", cuda_sources=cuda_src, functions=["relu"])

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu(x)
'''
MODELNEW_TRITON = '''import torch
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return y
'''
MODELNEW_TORCH = '''import torch


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.clamp_min(x, 0.0)
'''
EXT_CPP = '''#include <torch/extension.h>
torch::Tensor forward(torch::Tensor x) { return torch::relu(x); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }
'''
EXT_CU = (DATA / "suite_kernels" / "relu_ext.cu").read_text()
KF_FORWARD = '#include <cstdint>\nextern "C" int kf_forward(const float* x, float* y, int64_t n) { return 0; }\n'


@pytest.mark.parametrize("source, filename", [
    (MODELNEW_CUDA, "relu_cuda.py"), (MODELNEW_TRITON, "relu_triton.py"), (MODELNEW_TORCH, "relu_torch.py"),
    (MODELNEW_TORCH, ""), (EXT_CPP, "relu.cpp"), (EXT_CU, "relu.cu"), (EXT_CU, "")])
def test_every_suite_form_runs_on_the_gpu_where_pytorch_sees_one(source, filename):
    assert suite_backend(source, filename, gpu_available=True) == "torch_ext_cuda"


@pytest.mark.parametrize("source, filename, backend", [
    (MODELNEW_CUDA, "relu_cuda.py", "torch_ext_cuda"),     # CUDA sources need a GPU: torch_ext_cuda says so
    (MODELNEW_TRITON, "relu_triton.py", "torch_ext_cuda"),
    (MODELNEW_TORCH, "relu_torch.py", "torch_ext_cpu"),
    (MODELNEW_TORCH, "", "torch_ext_cpu"),                  # ModelNew by its content, not its name
    (EXT_CPP, "relu.cpp", "torch_ext_cpu"),
    (EXT_CU, "relu.cu", "torch_ext_cuda"),
    (EXT_CU, "", "torch_ext_cuda")])                        # __global__ / <<< without a name
def test_without_a_gpu_only_cuda_code_asks_for_torch_ext_cuda(source, filename, backend):
    assert suite_backend(source, filename, gpu_available=False) == backend


@pytest.mark.parametrize("gpu", [True, False])
def test_a_kf_forward_kernel_is_no_suite_form_and_left_to_its_own_rule(gpu):
    assert suite_backend(KF_FORWARD, "k.cpp", gpu) is None
    assert suite_backend("__global__ void k() {}", "k.cu", gpu) is None


def test_doctor_says_which_backend_suite_files_run_on_and_why(capsys):
    assert "torch_ext_cuda" in suite_backend_note("NVIDIA H200") and "H200" in suite_backend_note("NVIDIA H200")
    assert "torch_ext_cpu" in suite_backend_note("")
    from kfray.cli import main

    main(["doctor"])
    line = [ln for ln in capsys.readouterr().out.splitlines() if " suites " in ln]
    assert line and ("torch_ext_cuda" in line[0] or "torch_ext_cpu" in line[0]), line


def test_verify_takes_the_gpu_where_pytorch_sees_one_and_backend_still_decides(tmp_path, monkeypatch):
    """The evaluator is stubbed: what is checked is the backend verify hands it, with PyTorch
    seeing a GPU (faked) and not."""
    pytest.importorskip("torch")
    import kfray.tasks.suite_form as sf
    import kfray.verify as kv

    seen = {}
    monkeypatch.setattr(sf, "torch_gpu", lambda: "Fake GPU")

    class Stop(Exception):
        pass

    def fake_evaluator(name, cfg, run):
        seen["backend"] = name
        raise Stop

    import kfray.eval.evaluator as ke
    monkeypatch.setattr(ke, "Evaluator", fake_evaluator)
    kernel = tmp_path / "relu_torch.py"
    kernel.write_text(MODELNEW_TORCH)
    with pytest.raises(Stop):
        kv.verify(RELU, str(kernel))
    assert seen["backend"] == "torch_ext_cuda"          # a GPU seen: the GPU, for plain PyTorch too
    monkeypatch.setattr(sf, "torch_gpu", lambda: "")
    with pytest.raises(Stop):
        kv.verify(RELU, str(kernel))
    assert seen["backend"] == "torch_ext_cpu"
    with pytest.raises(Stop):
        kv.verify(RELU, str(kernel), "torch_ext_cuda")   # --backend still decides
    assert seen["backend"] == "torch_ext_cuda"


def test_a_sweep_on_gpus_runs_one_evaluator_per_gpu_unless_told():
    from kfray.config import load_config
    from kfray.sweep.cli import gpu_evaluators_default

    cfg = load_config(None, ["eval.backend=torch_ext_cuda"])
    assert gpu_evaluators_default(cfg, user_set=False) and cfg.eval.evaluators == 0
    cfg = load_config(None, ["eval.backend=torch_ext_cuda", "eval.evaluators=3"])
    assert not gpu_evaluators_default(cfg, user_set=True) and cfg.eval.evaluators == 3
    cfg = load_config(None, ["eval.backend=torch_ext_cpu"])
    assert not gpu_evaluators_default(cfg, user_set=False) and cfg.eval.evaluators == 2


def _gpu_skip() -> str | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return "PyTorch sees no CUDA device"
        import triton  # noqa: F401
    except Exception as e:
        return f"no CUDA PyTorch with Triton ({type(e).__name__})"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_skip() is not None, reason=_gpu_skip() or "")
@pytest.mark.parametrize("name, source", [("relu_triton.py", MODELNEW_TRITON), ("relu_torch.py", MODELNEW_TORCH)])
def test_verify_runs_triton_and_pure_pytorch_modelnew_on_the_gpu_by_default(name, source, tmp_path):
    from kfray.verify import verify

    kernel = tmp_path / name
    kernel.write_text(source)
    res, backend = verify(RELU, str(kernel), None, [f"eval.cache_dir={tmp_path / 'cache'}",
                                                     "eval.suite_perf_trials=20"])
    assert backend == "torch_ext_cuda"
    assert res.correct, res.reason
    assert res.hardware.startswith("cuda:"), res.hardware


# --- a quiet terminal ---------------------------------------------------------------------------
RAY_NOISE = ("Token authentication is enabled", "Started a local Ray instance", "View the dashboard",
             "worker processes have been started")


def test_ray_start_up_lines_stay_out_of_the_terminal_unless_verbose():
    """Ray started the way kfray's commands start it (kfray.cluster.connect), in a process of its
    own: nothing of Ray's on stdout or stderr; KFRAY_VERBOSE=1 (what --verbose sets) lets its
    INFO lines through."""
    code = ("from kfray.cluster import connect\nimport ray\nconnect(num_cpus=1)\n"
            "print('kfray-ok', ray.is_initialized(), flush=True)\nray.shutdown()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "KFRAY_VERBOSE"))}
    # both at once (each starts its own Ray instance): a Ray start is mostly waiting
    runs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=e) for e in (env, {**env, "KFRAY_VERBOSE": "1"})]
    (quiet_out, quiet_err), (_, loud_err) = [r.communicate(timeout=180) for r in runs]
    assert runs[0].returncode == 0, quiet_err[-2000:]
    assert "kfray-ok True" in quiet_out
    for noise in RAY_NOISE:
        assert noise not in quiet_err and noise not in quiet_out, (noise, quiet_err[-2000:])
    assert runs[1].returncode == 0 and "Started a local Ray instance" in loud_err, loud_err[-2000:]


def test_the_raylet_worker_pool_warning_is_dropped_and_other_raylet_lines_kept(monkeypatch):
    import logging

    from ray._private import worker as ray_worker

    from kfray.cluster import _quiet_ray

    shown: list[str] = []

    def show(data, ignore_prefix, **kw):        # Ray's own printer, as _quiet_ray finds it
        shown.extend(data["lines"])

    monkeypatch.setattr(ray_worker, "print_to_stdstream", show)   # restored after (an earlier test may
    level = logging.getLogger("ray").level                          # have quietened Ray already)
    try:
        _quiet_ray()
        _quiet_ray()                                     # once is enough: it does not wrap itself
        warn = ("WARNING: 18 PYTHON worker processes have been started on node: abc with address: 127.0.0.1, "
                "which is 9x the maximum expected startup concurrency (2).")
        ray_worker.print_to_stdstream({"lines": [warn], "pid": "raylet", "is_err": False}, ignore_prefix=False)
        ray_worker.print_to_stdstream({"lines": ["the actor died: out of memory"], "pid": "raylet",
                                       "is_err": False}, ignore_prefix=False)
        assert not any("worker processes have been started" in ln for ln in shown)
        assert shown == ["the actor died: out of memory"]
    finally:
        logging.getLogger("ray").setLevel(level)


def test_run_sweep_and_verify_take_verbose():
    from kfray.cli import build_parser

    p = build_parser()
    assert p.parse_args(["run", "--verbose"]).verbose
    assert p.parse_args(["sweep", "x", "--verbose"]).verbose
    assert p.parse_args(["verify", "t", "k", "--verbose"]).verbose
    assert not p.parse_args(["run"]).verbose
