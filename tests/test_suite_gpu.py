"""Suite-form kernels on a real GPU: the suite's verdict, kfray's stream probe on top.

Skipped cleanly where PyTorch sees no CUDA device or nvcc is missing.
"""
from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
RELU = "kernelbench:" + str(DATA / "kernelbench" / "level1" / "1_Relu.py")


def _skip_reason() -> str | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return "PyTorch sees no CUDA device"
        from kfray.eval.backends.cuda import nvcc_path

        nvcc_path()
    except Exception as e:
        return f"no usable CUDA PyTorch or nvcc ({type(e).__name__}: {str(e)[:120]})"
    return None


_SKIP = _skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]


def _verify(task: str, kernel: Path, tmp_path, *sets: str):
    from kfray.verify import verify

    res, _ = verify(task, str(kernel), "torch_ext_cuda",
                    [f"eval.cache_dir={tmp_path}", "eval.suite_perf_trials=20", *sets])
    return res


def test_extension_on_the_current_stream_is_correct_with_kernelbench_figures(tmp_path):
    res = _verify(RELU, DATA / "suite_kernels" / "relu_ext.cu", tmp_path)
    assert res.correct, res.reason
    suite = res.facts["suite"]
    assert suite["name"] == "KernelBench" and suite["speedup"] > 0 and "L2 flush" in suite["statistic"]


def test_extension_that_works_on_its_own_stream_is_rejected(tmp_path):
    res = _verify(RELU, DATA / "suite_kernels" / "relu_ext_own_stream.cu", tmp_path)
    assert not res.correct
    assert "stream" in res.reason, res.reason


def test_modelnew_with_load_inline_cuda_is_correct(tmp_path):
    kernel = tmp_path / "relu_new.py"
    src = (DATA / "suite_kernels" / "relu_ext.cu").read_text().replace(
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"forward\", &forward); }", "")
    kernel.write_text(
        "import torch\nfrom torch.utils.cpp_extension import load_inline\n"
        f"SRC = r'''{src}'''\n"
        "mod = load_inline(name='kf_gpu_relu', cpp_sources='torch::Tensor forward(torch::Tensor x);',\n"
        "                  cuda_sources=SRC, functions=['forward'])\n\n"
        "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return mod.forward(x)\n")
    res = _verify(RELU, kernel, tmp_path / "cache")
    assert res.correct, res.reason


def test_block_size_edit_of_an_extension_written_as_its_best_file_is_correct(tmp_path):
    """The offline search's block-size edit on a suite extension, baked into the file a search writes as
    its best (a #define ahead of the source), builds without kfray's flags and stays correct."""
    import random

    from kfray.proposers.cuda_edits import block_size
    from kfray.tasks import load_task
    from kfray.tasks.suite_form import best_file

    edited = block_size((DATA / "suite_kernels" / "relu_ext_threads.cu").read_text(), random.Random(0))
    suffix, text = best_file(edited, {"KF_BLOCK_THREADS": 1024}, load_task(RELU).suite, "torch_ext_cuda")
    kernel = tmp_path / f"best{suffix}"
    kernel.write_text(text)
    res = _verify(RELU, kernel, tmp_path / "cache")
    assert suffix == ".cu" and res.correct, res.reason
