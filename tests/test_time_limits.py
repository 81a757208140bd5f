"""Time limits sized to the problem (issue 25): a reference slower than eval.timeout_s still gets
its verdict as its own kernel, and a kernel is charged a timeout only when one call is slower than
its reference by eval.slow_factor, with a reason that says so."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from kfray.verify import verify  # noqa: E402

SLOW = '''import time
import torch
import torch.nn as nn


class {cls}(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        time.sleep({sleep})
        return x * 2.0


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''


def _files(tmp_path: Path, kernel_sleep: float) -> tuple[str, Path]:
    d = tmp_path / "kb" / "level1"
    d.mkdir(parents=True)
    task = d / "1_Slow.py"
    task.write_text(SLOW.format(cls="Model", sleep=0.25))
    kernel = tmp_path / "slow_new.py"
    kernel.write_text(SLOW.format(cls="ModelNew", sleep=kernel_sleep))
    return f"kernelbench:{task}", kernel


def test_a_reference_slower_than_the_time_limit_passes_as_its_own_kernel(tmp_path):
    task, kernel = _files(tmp_path, 0.25)
    # eval.timeout_s=2: the two sides' ~40 calls of 0.25 s each take about 10 s
    res, _ = verify(task, str(kernel), "torch_ext_cpu", [f"eval.cache_dir={tmp_path / 'c'}", "eval.timeout_s=2",
                                                          "eval.suite_perf_trials=5"])
    assert res.tier == 5, res.reason
    assert 0.7 < res.facts["suite"]["speedup"] < 1.4, res.facts["suite"]


def test_a_kernel_far_slower_than_its_reference_is_charged_a_timeout_that_says_so(tmp_path):
    task, kernel = _files(tmp_path, 12.0)
    res, _ = verify(task, str(kernel), "torch_ext_cpu", [f"eval.cache_dir={tmp_path / 'c'}", "eval.timeout_s=2",
                                                          "eval.suite_perf_trials=5", "eval.slow_factor=20"])
    assert res.tier == 2 and "timeout" in res.reason and "20x its reference" in res.reason, res.reason
