"""The split judge on a real GPU: ModelNew files that hack the way a CUDA harness times and judges
(flags flipped in the constructor, CUDA events patched, a slowed reference function, results kept
by address) and a BatchNorm model in training mode as its own kernel. Pure PyTorch, so no build;
skipped where PyTorch sees no CUDA device."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no GPU")]

from test_judge_apart import CLOCK_PATCH, MEMO, MEMO_BODY, SLOW_RELU, dropout_problem, modelnew  # noqa: E402

PROBLEMS = {
    "relu": ("torch.relu(x)", "def get_inputs():\n    return [torch.randn(32768, 32768)]\n", "x"),
    "relu_small": ("torch.relu(x)", "def get_inputs():\n    return [torch.randn(1024, 256)]\n", "x"),
    "matmul": ("torch.matmul(A, B)", "N = 4096\n\ndef get_inputs():\n    return [torch.rand(N, N), torch.rand(N, N)]\n",
               "A, B"),
}


def problem(tmp_path: Path, name: str, inputs: str | None = None) -> str:
    expr, default_inputs, args = PROBLEMS[name]
    inputs = inputs or default_inputs
    d = tmp_path / "kb" / "level1"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"1_{name}.py"
    p.write_text(f"import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
                 f"        super().__init__()\n\n    def forward(self, {args}):\n        return {expr}\n\n\n"
                 f"{inputs}\n\ndef get_init_inputs():\n    return []\n")
    return f"kernelbench:{p}"


def _verify(task: str, kernel: Path, cache: Path):
    from kfray.verify import verify

    res, backend = verify(task, str(kernel), None, [f"eval.cache_dir={cache}", "eval.suite_perf_trials=20"])
    assert backend == "torch_ext_cuda"
    return res


def _trusted(r) -> bool:
    return r.tier == 5 and not r.facts.get("untrusted")


def test_tf32_flipped_in_the_constructor_does_not_reach_the_reference(tmp_path):
    k = modelnew(tmp_path, "tf32", body="        return torch.matmul(A, B)",
                 init="        torch.backends.cuda.matmul.allow_tf32 = True\n")
    k.write_text(k.read_text().replace("def forward(self, x)", "def forward(self, A, B)"))
    r = _verify(problem(tmp_path, "matmul"), k, tmp_path / "cache")
    # The reference stays fp32 in the judge: TF32 is then either outside the tolerance or, where
    # it passes, a speedup of the kernel's own (the reference is not slowed down with it).
    if _trusted(r):
        assert r.facts["suite"]["ref_avg_mean_ms"] > 0.8 * r.facts["suite"]["avg_mean_ms"] or \
            r.facts["suite"]["speedup"] > 1.5, r.facts["suite"]


def test_patched_cuda_events_are_flagged_by_the_judges_clock(tmp_path):
    patch = CLOCK_PATCH.replace("\\n", "\n") + (
        "_et = torch.cuda.Event.elapsed_time\n"
        "torch.cuda.Event.elapsed_time = lambda self, end: _et(self, end) * 0.01\n")
    k = modelnew(tmp_path, "events", prelude=patch)
    r = _verify(problem(tmp_path, "relu"), k, tmp_path / "cache")
    assert r.tier == 5, r.reason
    assert "outside clock" in r.facts.get("untrusted", ""), f"faked times believed: {r.facts.get('suite')}"


def test_a_slowed_reference_function_gains_nothing(tmp_path):
    k = modelnew(tmp_path, "slowref", prelude=SLOW_RELU)
    r = _verify(problem(tmp_path, "relu"), k, tmp_path / "cache")
    assert r.tier == 5, r.reason
    assert r.facts["suite"]["speedup"] < 2.0, r.facts["suite"]


def test_results_kept_by_address_gain_nothing(tmp_path):
    k = modelnew(tmp_path, "memo", init=MEMO, body=MEMO_BODY)
    r = _verify(problem(tmp_path, "relu"), k, tmp_path / "cache")
    assert not (_trusted(r) and r.facts["suite"]["speedup"] > 3.0), r.facts.get("suite")


def test_batchnorm_in_training_mode_passes_as_its_own_kernel(tmp_path):
    d = tmp_path / "kb" / "level1"
    d.mkdir(parents=True, exist_ok=True)
    p = d / "33_BatchNorm.py"
    p.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                 "    def __init__(self, num_features):\n        super().__init__()\n"
                 "        self.bn = nn.BatchNorm2d(num_features=num_features)\n\n"
                 "    def forward(self, x):\n        return self.bn(x)\n\n\n"
                 "def get_inputs():\n    return [torch.randn(64, 64, 256, 256)]\n\n\n"
                 "def get_init_inputs():\n    return [64]\n")
    k = tmp_path / "bn_new.py"
    k.write_text(p.read_text().replace("class Model(", "class ModelNew("))
    r = _verify(f"kernelbench:{p}", k, tmp_path / "cache")
    assert _trusted(r), r.reason
    assert 0.7 < r.facts["suite"]["speedup"] < 1.4, r.facts["suite"]


def test_device_memory_comes_back_after_each_candidate(tmp_path):
    """A sweep runs hundreds of full-size problems through one judge. What the judge keeps cached
    after a candidate (inputs of 1/40 of the device here, several sets) is reused by the next one,
    never added to; and once the device is short of memory (under half free) the judge gives its
    cache back after each step, so that the next candidate's runner, another process, can have it.
    The input is sized to the card: a candidate's peak is about nine input sets across the judge
    and its runner (4 GiB inputs: 37 GiB), more than an H100 has left once it is short."""
    from kfray.candidate import Candidate, EvalResult
    from kfray.config import EvalConfig
    from kfray.eval.evaluator import Evaluator
    from kfray.eval.suite.device_memory import ROOMY

    total = torch.cuda.mem_get_info()[1]
    rows = max(1024, min(32768, int(total / 40 / (4 * 32768))))       # fp32 rows of 32768: 4 GiB at most
    set_bytes = rows * 32768 * 4
    task = problem(tmp_path, "relu", f"def get_inputs():\n    return [torch.randn({rows}, 32768)]\n")
    source = modelnew(tmp_path, "plain").read_text()
    ev = Evaluator("torch_ext_cuda", EvalConfig(backend="torch_ext_cuda", cache_dir=str(tmp_path / "cache"),
                                                suite_perf_trials=10))

    def one() -> None:
        r = EvalResult.from_dict(ev.evaluate(Candidate(task=task, language="suite", source=source)))
        assert r.tier == 5, r.reason

    try:
        start = torch.cuda.mem_get_info()[0]          # before the judge's process has any device memory
        free = []
        for _ in range(3):
            one()
            free.append(torch.cuda.mem_get_info()[0])
        assert free[2] > free[1] - set_bytes / 2, f"free device memory fell by {(free[1] - free[2]) / 2**30:.1f} " \
            "GiB from the second candidate to the third: the judge's memory grows"
        room, total = torch.cuda.mem_get_info()
        filler = torch.empty(int(room - (ROOMY - 0.05) * total), dtype=torch.uint8, device="cuda")  # device now short
        try:
            one()
            kept = start - filler.numel() - torch.cuda.mem_get_info()[0]
        finally:
            del filler                      # a failed one() must not leave the next test short too
    finally:
        ev.shutdown()
    # the CUDA contexts of the judge and of the runners forked ahead (about 0.5 GiB each), never the
    # input sets and outputs a candidate's steps cached (13.5 GiB on an H100 with 4 GiB inputs)
    assert kept < (4 << 30), f"with the device short of memory the judge still keeps " \
        f"{kept / 2**30:.1f} GiB after a candidate"


def test_the_judges_memory_does_not_grow_from_trial_to_trial(tmp_path):
    """Each trial's input set (4 GiB here) must leave both processes when the trial ends: KernelBench's
    full-size problems hold 16 GiB inputs, and five trials of them kept did not fit an H200."""
    r = _verify(problem(tmp_path, "relu"), modelnew(tmp_path, "plain"), tmp_path / "cache")
    assert r.tier == 5, r.reason
    trials = [m for m in r.facts["judge_memory"] if m["step"].endswith("suite trial")]
    assert len(trials) >= 3, r.facts["judge_memory"]
    grew = trials[-1]["judge_allocated_gib"] - trials[0]["judge_allocated_gib"]
    assert grew < 1.0, f"the judge held {grew:.1f} GiB more after the last trial than after the first"


def test_a_reference_with_dropout_passes_the_stream_probe_as_its_own_kernel(tmp_path):
    """Dropout in training mode (level2/66): the probe's two calls draw one mask, so the reference's
    copy is not taken for work off the stream."""
    task, k = dropout_problem(tmp_path, rows=128, n=4096, p=0.2)
    r = _verify(task, k, tmp_path / "cache")
    assert r.tier == 5, r.reason


SEGMENT_WIPE = """
import ctypes
_cu = ctypes.CDLL("libcuda.so.1")


def _wipe_around(t):
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    if _cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(t.data_ptr())):
        return
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    torch.cuda.synchronize()
    _cu.cuMemsetD8_v2(ctypes.c_uint64(base.value), 0, ctypes.c_size_t(lo - base.value))
    _cu.cuMemsetD8_v2(ctypes.c_uint64(hi), 0, ctypes.c_size_t(base.value + size.value - hi))
    torch.cuda.synchronize()
"""


def test_a_modelnew_that_wipes_the_memory_beside_its_inputs_reaches_none_of_the_judges(tmp_path):
    """An IPC handle maps the whole allocation its tensor lives in. A kernel that returns zeros
    and zeroes everything else there would pass if the judge's own inputs or reference outputs
    shared that allocation; the judge shares copies, alone in a pool of their own."""
    k = modelnew(tmp_path, "wipe", prelude=SEGMENT_WIPE, body="        _wipe_around(x)\n        return torch.zeros_like(x)")
    r = _verify(problem(tmp_path, "relu_small"), k, tmp_path / "cache")
    assert r.tier < 5, f"zeros judged correct: {r.reason}"
