"""Kernels judged the way their suite judges them, through `kfray verify` (compile cache, sandbox):
KernelBench ModelNew files and robust-kbench extensions, forward and backward, with the suite's
verdict first and kfray's defences on top, and the figures both ways."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import contextlib  # noqa: E402

from kfray.errors import KfrayError  # noqa: E402
from kfray.eval.suite import suite_seeds  # noqa: E402
from kept_judges import JUDGES  # noqa: E402
from kfray.verify import verify  # noqa: E402

DATA = Path(__file__).parent / "data"
RELU = "kernelbench:" + str(DATA / "kernelbench" / "level1" / "1_Relu.py")
BOOL = "kernelbench:" + str(DATA / "kernelbench" / "level_fixtures" / "1_Masked_select_bool.py")
RKB = DATA / "rkb_form" / "linear_relu"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")


def _times_agree(suite: dict) -> None:
    """The suite's speedup is what its own two times say (the reference's mean over the kernel's),
    and both were measured."""
    assert suite["avg_mean_ms"] > 0 and suite["ref_avg_mean_ms"] > 0, suite
    assert suite["speedup"] == pytest.approx(suite["ref_avg_mean_ms"] / suite["avg_mean_ms"], rel=1e-6), suite


MODELNEW = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
{body}
'''
BODIES = {
    "right": "        return torch.clamp_min(x, 0.0)",
    "tail": "        y = torch.relu(x)\n        y.view(-1)[-5:] = 0.25   # the last elements left wrong\n        return y",
    "off": "        return torch.relu(x) + 5e-4",
    "in_place": "        return x.relu_()",
}


@pytest.fixture
def cache(suite_cache):
    return suite_cache


def _verify(task: str, kernel: Path, cache: Path, *sets: str):
    """`kfray verify` of one file, through evaluators kept for the file: every kernel still runs in a
    runner of its own, forked from the judge's clean zygote, so one test's kernel cannot reach the
    next test's (and a judge that a kernel could change would fail the tests after it)."""
    res, backend = verify(task, str(kernel), None, [f"eval.cache_dir={cache}", "eval.suite_perf_trials=10", *sets],
                          judges=JUDGES)
    return res, backend


def _modelnew(tmp_path: Path, name: str) -> Path:
    p = tmp_path / f"{name}_new.py"
    p.write_text(MODELNEW.format(body=BODIES[name]))
    return p


def test_the_suites_trial_seeds_are_drawn_after_manual_seed_42():
    torch.manual_seed(42)
    want = [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(5)]
    assert suite_seeds(5) == want and len(set(want)) == 5


def test_comparisons_piece_by_piece_say_what_whole_tensor_ones_say(monkeypatch):
    """Full-size outputs are compared in pieces (bounded temporaries); the verdict, the count of
    bad elements, the first bad index and the largest difference are those of the whole tensors."""
    import torch

    from kfray.eval.suite import common

    torch.manual_seed(0)
    want = torch.randn(5, 19)
    got = want.clone()
    got.view(-1)[37] += 1.0
    got.view(-1)[80] = float("nan")
    whole = common.allclose_reason(want, got, 1e-4, 1e-4, "output 0")
    monkeypatch.setattr(common, "CHUNK_ELEMS", 10)
    assert common.allclose_reason(want, got, 1e-4, 1e-4, "output 0") == whole
    assert "2 of 95 elements" in whole and "first at flat index 37" in whole
    assert common.max_diff(want, got) == float("inf")
    got.view(-1)[80] = want.view(-1)[80]
    assert abs(common.max_diff(want, got) - 1.0) < 1e-6
    assert common.allclose_reason(want, want.clone(), 1e-4, 1e-4, "output 0") is None
    late = want.clone()
    late.view(-1)[94] += 1e-3                       # in the last piece only
    assert common.changed([late], [want], ["input 0"]) == "input 0"
    assert common.changed([want.clone()], [want], ["input 0"]) is None


def test_outputs_equal_to_the_references_bit_for_bit_are_judged_as_allclose_judges_them(monkeypatch):
    """The comparisons skip allclose for pieces equal element for element; what they say must not
    change: NaN is never alike (unless the rule says equal_nan), -0.0 is 0.0, and a piece that
    differs is still found when the others are equal."""
    import torch

    from kfray.eval.suite import common

    monkeypatch.setattr(common, "CHUNK_ELEMS", 8)
    want = torch.randn(4, 10)
    assert common.all_close(want, want.clone(), 0.0, 0.0) and common.max_diff(want, want.clone()) == 0.0
    zero = torch.zeros(3)
    assert common.all_close(zero, -zero, 0.0, 0.0)
    nan = want.clone()
    nan.view(-1)[3] = float("nan")
    assert not common.all_close(nan, nan.clone(), 1.0, 1.0)
    assert common.all_close(nan, nan.clone(), 1.0, 1.0, equal_nan=True)
    assert common.max_diff(nan, nan.clone()) == float("inf")
    off = want.clone()
    off.view(-1)[-1] += 1.0                          # the last piece differs, the others are equal
    assert not common.all_close(want, off, 1e-4, 1e-4)
    assert "1 of 40 elements" in common.allclose_reason(want, off, 1e-4, 1e-4, "output 0")
    assert abs(common.max_diff(want, off) - 1.0) < 1e-6


def test_a_modelnew_file_gets_kernelbenchs_verdict_and_both_figures(tmp_path, cache):
    res, backend = _verify(RELU, _modelnew(tmp_path, "right"), cache, "eval.suite_perf_trials=40")
    assert backend == "torch_ext_cpu"
    assert res.correct, res.reason
    suite = res.facts["suite"]
    assert suite["name"] == "KernelBench" and suite["trials"] == "5/5"
    assert suite["rtol"] == suite["atol"] == 1e-4
    # clamp_min against relu: the same order of magnitude, the suite's way and kfray's way, and the
    # two figures agree with each other
    assert 0.1 < suite["speedup"] < 10 and 0.1 < res.speedup < 10, (suite["speedup"], res.speedup)
    assert 1 / 3 < suite["speedup"] / res.speedup < 3, (suite["speedup"], res.speedup)
    row = res.facts["per_shape"]["default"]
    assert row["samples"] == 40
    # the judge checked timed calls (at random, and the last), each copied after it had answered:
    # 40 timed and 3 + 3 x 1 warm-up calls, 8 of them checked on average, and each block's last again
    assert 1 <= row["checked_calls"] <= 40 + 6 + 4 and row["copy_ms"] > 0, row
    # both sides timed in four alternating blocks of 10 calls; the blocks make up the means
    sizes = [10, 10, 10, 10]
    assert len(row["blocks_ms"]) == 4, row
    for side, key in ((0, "mean_ms"), (1, "ref_mean_ms")):
        whole = sum(n * b[side] for n, b in zip(sizes, row["blocks_ms"])) / 40
        assert abs(whole - row[key]) <= 1e-3 * row[key] + 1e-5, (side, row)


class _DriftingSide:
    """A side whose every call takes a little longer than the call before it, on either side: a
    host that slows down steadily while both sides are timed. Records the order of the blocks."""
    clock_calls = [0]

    def __init__(self, judge, clock, case, seed, side, like=None):
        self.side, self.clock, self.order = side, clock, judge.order
        self.input_bytes, self.backward_remote, self.copies = 1024, False, []

    def run(self, warmup, trials, budget_s, pace=0.0, of=0):
        self.order.append((self.side, trials))
        self.clock.warmed, self.clock.period = warmup, 1e-3
        out = []
        for _ in range(warmup + trials):
            self.clock_calls[0] += 1
            out.append(1e-3 * (1 + 0.01 * self.clock_calls[0]))
        return out[warmup:]

    def result(self):
        return None, None, None

    def drop(self):
        pass

    def check_clock(self, beside=None):
        pass


@pytest.mark.parametrize("rounds", [1, 4])
def test_a_steady_slowdown_falls_on_both_sides_when_their_blocks_alternate(monkeypatch, rounds):
    """Each side's calls in blocks, the sides alternating kernel, reference, reference, kernel: a
    host that slows down steadily during the timing charges both sides alike. In one block a
    side (the control) the side timed second reads slower by the whole drift."""
    import types

    from kfray.eval.suite import timing

    monkeypatch.setattr(timing, "SideTimer", _DriftingSide)
    _DriftingSide.clock_calls[0] = 0
    judge = types.SimpleNamespace(order=[], spec=None, memory=types.SimpleNamespace(settle=lambda step: None))
    clock = types.SimpleNamespace(warmed=0, period=0.0)
    case = types.SimpleNamespace(name="default")
    ts_new, ts_ref, blocks, _ = timing.time_both(judge, clock, case, 42, True, 3, 100, 0.0, rounds, True)
    assert len(ts_new) == len(ts_ref) == 100
    ratio = float(np.mean(ts_ref)) / float(np.mean(ts_new))
    if rounds == 4:
        assert judge.order == [("new", 25), ("ref", 25), ("ref", 25), ("new", 25),
                               ("new", 25), ("ref", 25), ("ref", 25), ("new", 25)]
        assert len(blocks) == 4 and abs(ratio - 1) < 0.02, ratio
    else:
        assert judge.order == [("new", 100), ("ref", 100)] and not blocks[1:]
        assert ratio > 1.3, ratio


def test_kernelbenchs_published_baseline_gives_a_speedup_against_its_own_time(tmp_path, cache):
    base = tmp_path / "baseline_time_torch.json"
    base.write_text('{"level1": {"1_Relu.py": {"mean": 0.5, "std": 0.01, "hardware": "NVIDIA H100 80GB HBM3"}}}')
    res, _ = _verify(RELU, _modelnew(tmp_path, "right"), cache, f"eval.suite_baseline={base}")
    pub = res.facts["suite"]["published"]
    assert pub["mean_ms"] == 0.5 and pub["hardware"] == "NVIDIA H100 80GB HBM3"
    assert pub["speedup"] == pytest.approx(0.5 / res.facts["suite"]["avg_mean_ms"])


@pytest.mark.parametrize("name,words", [
    ("tail", ["5 of 8000 elements", "KernelBench's rule"]),
    ("off", ["8000 of 8000 elements", "max |diff| 0.0005", "KernelBench's rule"]),
    ("in_place", ["shares memory with input 0", "kfray rule", "KernelBench itself would not reject this"]),
])
def test_kernels_the_suite_rejects_are_rejected_and_kfray_says_whose_rule(tmp_path, cache, name, words):
    res, _ = _verify(RELU, _modelnew(tmp_path, name), cache)
    assert res.tier == 4
    for w in words:
        assert w in res.reason, res.reason


def test_a_bool_input_reaches_modelnew_as_a_bool_mask(tmp_path, cache):
    k = tmp_path / "mask_new.py"
    k.write_text("import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x, mask):\n"
                 "        assert mask.dtype == torch.bool\n"
                 "        return x * mask, x > 0\n")
    res, _ = _verify(BOOL, k, cache)
    assert res.correct, res.reason


def test_a_problem_larger_than_the_limit_says_what_it_needs_before_anything_runs(tmp_path, cache):
    with pytest.raises(KfrayError, match=r"needs [\d.]+ GiB, limit 1 GiB .*memory_limit_mb=1024.*nothing was run"):
        _verify(RELU, _modelnew(tmp_path, "right"), cache, "eval.memory_limit_mb=1024")


def test_a_load_inline_modelnew_is_built_into_the_compile_cache_once(tmp_path, cache):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not on PATH")
    k = tmp_path / "inline_new.py"
    k.write_text('''import torch
from torch.utils.cpp_extension import load_inline

mod = load_inline(name="kf_relu_inline", functions=["relu_fwd"], cpp_sources="""
#include <torch/extension.h>
torch::Tensor relu_fwd(torch::Tensor x) { return torch::clamp_min(x, 0); }
""")


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return mod.relu_fwd(x)
''')
    first, _ = _verify(RELU, k, cache)
    assert first.correct, first.reason
    assert not first.facts["compile_cached"]
    # The sandbox imports what the compile step built: with no compiler left, nothing can be rebuilt.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CXX", "/nonexistent/c++")
        again, _ = _verify(RELU, k, cache)
    assert again.correct and again.facts["compile_cached"], again.reason


def test_a_modelnew_that_builds_nothing_skips_the_build_step_and_keeps_its_verdicts(tmp_path, cache):
    """A pure-PyTorch ModelNew goes to the compile cache as it is, without a PyTorch import just to
    see that it imports: right is still right, wrong still wrong, a syntax error still a compile
    error that names its line, and a file that defines ModelNew out of sight is still imported."""
    from kfray.config import EvalConfig
    from kfray.eval.backends.base import CompileError
    from kfray.eval.backends.torch_ext import TorchExtCpuBackend
    from kfray.tasks import load_task

    mine = tmp_path / "cache"           # built here, not found in the session's cache
    right, _ = _verify(RELU, _modelnew(tmp_path, "right"), mine)
    assert right.correct and right.facts["imported"] is False, right.facts
    wrong, _ = _verify(RELU, _modelnew(tmp_path, "tail"), mine)
    assert wrong.tier == 4 and "elements outside" in wrong.reason and wrong.facts["imported"] is False, wrong.reason
    backend, task = TorchExtCpuBackend(EvalConfig(cache_dir=str(mine))), load_task(RELU)
    with pytest.raises(CompileError, match=r"does not parse: .*\(line 3\)"):
        backend.compile("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x)\n", {}, task)
    hidden = "import torch\nModelNew = type('ModelNew', (torch.nn.Module,), {'forward': lambda s, x: x.relu()})\n"
    assert "imported" not in backend.compile(hidden, {}, task).facts        # imported once, as before


@needs_gxx
def test_robust_kbench_forward_extension_is_timed_the_suites_way(cache):
    res, backend = _verify(f"rkb:{RKB}@multi", RKB / "forward.cpp", cache)
    assert backend == "torch_ext_cpu"
    assert res.correct, res.reason
    suite = res.facts["suite"]
    assert suite["name"] == "robust-kbench" and suite["configs"] == 8     # 2 x 2 x 2 in multi mode
    # the suite's figure: the ratio of configuration-averaged mean times
    rows = res.facts["per_shape"].values()
    avg = sum(r["ref_mean_ms"] for r in rows) / sum(r["mean_ms"] for r in rows)
    assert suite["speedup"] == pytest.approx(avg, rel=1e-6)


@needs_gxx
@pytest.mark.parametrize("kernel,correct", [("backward.cpp", True), ("backward_wrong.cpp", False)])
def test_robust_kbench_backward_kernels_run_through_the_tasks_autograd_function(cache, kernel, correct):
    res, _ = _verify(f"rkb:{RKB}#backward", RKB / kernel, cache)
    assert res.correct is correct, res.reason
    # autograd through the kernel ran in its runner, not in the judge
    assert "runner_round_trip_us" in res.facts and "in_judge_because" not in res.facts
    if correct:
        assert res.facts["suite"]["name"] == "robust-kbench"
        _times_agree(res.facts["suite"])
    else:
        assert "gradient" in res.reason and "robust-kbench rule" in res.reason


@needs_gxx
def test_a_forward_extension_on_a_backward_task_is_told_what_to_bind(cache):
    res, _ = _verify(f"rkb:{RKB}#backward", RKB / "forward.cpp", cache)
    assert res.tier == 2 and "binds no function `backward`" in res.reason


LLM_MODELNEW = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """ReLU as one clamp."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.clamp_min(x, 0.0)
'''


def test_an_llm_search_evolves_a_kernelbench_task_in_kernelbenchs_form(ray_local, tmp_path, tmp_cache):
    """The search proposes ModelNew files (the model answers in KernelBench's form, told its contract),
    judges them the suite's way, and writes the best as a ModelNew file the suite's form takes."""
    from kfray.config import load_config
    from kfray.driver import run_search
    from llm_server import ScriptedServer

    answer = f"A single clamp replaces the ReLU.\n\n```python\n{LLM_MODELNEW}```\n"
    with ScriptedServer([answer]) as srv:
        # budget 2: the reference seed and the model's kernel (the scripted model has no third kernel to
        # give: a budget of 3 spent ~25 s asking it again, ~700 requests, until the island ran dry)
        cfg = load_config(None, [f"tasks=[{RELU}]", "search.islands=1", "search.budget=2", "search.batch=1",
                                 "eval.evaluators=1", "eval.backend=torch_ext_cpu", "eval.suite_perf_trials=10",
                                 "eval.timeout_s=120", f"eval.cache_dir={tmp_cache}", "proposer.kind=llm",
                                 f"proposer.base_url={srv.base_url}", "proposer.api_key_env=KFRAY_TEST_NO_KEY",
                                 "proposer.model=test-model", "proposer.max_retries=0"])
        summary = run_search(cfg, tmp_path / "run", progress=False)
        prompts = [m["content"] for r in srv.requests for m in r["messages"]]
    s = summary["tasks"][RELU]
    assert s["correct"] and s["evaluated"] >= 2 and s["suite"]["name"] == "KernelBench"
    _times_agree(s["suite"])
    assert any("class ModelNew(nn.Module)" in p and "KernelBench's own harness" in p for p in prompts)
    best = list((tmp_path / "run" / "best").glob("*.py"))
    assert len(best) == 1 and "class ModelNew" in best[0].read_text()
    res, _ = verify(RELU, str(best[0]), None, [f"eval.cache_dir={tmp_cache}", "eval.suite_perf_trials=5"])
    assert res.correct, res.reason


KF_RELU = '''#include <cstdint>
extern "C" int kf_forward(const float* x, float* out, int64_t batch, int64_t features) {
    const int64_t n = batch * features;
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] > 0.f ? x[i] : 0.f;
    TAIL
    return 0;
}
'''


@pytest.mark.parametrize("tail,correct", [("", True), ("for (int64_t i = n - 5; i < n; ++i) out[i] = 0.25f;", False),
                                          ("for (int64_t i = 0; i < n; ++i) out[i] += 5e-4f;", False)])
def test_kf_forward_kernels_on_a_kernelbench_task_are_held_to_its_rule_too(tmp_path, cache, tail, correct):
    """A tail bug or an error of 5e-4 fails: on a suite's task every element must be within the
    suite's tolerance (atol 1e-4), whatever kfray's own task tolerance would be."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not on PATH")
    k = tmp_path / "relu.cpp"
    k.write_text(KF_RELU.replace("TAIL", tail))
    res, backend = _verify(RELU, k, cache)
    assert backend == "cpu"
    assert res.correct is correct, res.reason
    if not correct:
        assert "every element must be within it" in res.reason and "atol=0.0001" in res.reason


@needs_gxx
def test_a_robust_kbench_task_without_a_kernel_starts_from_its_own_forward_fn(tmp_path, cache):
    """The baseline seed: the task's forward_fn inside an extension, `None` arguments included."""
    from kfray.tasks import load_task
    task = load_task(f"rkb:{DATA / 'rkb_suite' / 'optional_arg'}")
    seeds = {s.name: s for s in task.seeds}
    assert set(seeds) == {"reference_function"}
    k = tmp_path / "reference.cpp"
    k.write_text(seeds["reference_function"].source)
    res, _ = _verify(f"rkb:{DATA / 'rkb_suite' / 'optional_arg'}", k, cache)
    assert res.correct, res.reason
    assert res.facts["suite"]["configs"] == 2
    _times_agree(res.facts["suite"])


BN_TRAIN = "kernelbench:" + str(DATA / "kernelbench" / "level_fixtures" / "7_Batchnorm_train.py")


@pytest.mark.parametrize("body,correct", [
    ("        return self.bn(x)", True),                                   # running stats move as the reference's do
    ("        self.bn.weight.data.add_(1.0)\n        return self.bn(x) if False else torch.nn.functional.batch_norm("
     "x, self.bn.running_mean, self.bn.running_var, self.bn.weight - 1.0, self.bn.bias, True, 0.1, 1e-5)", False),
])
def test_parameters_must_come_back_as_the_reference_leaves_them(tmp_path, cache, body, correct):
    k = tmp_path / "bn_new.py"
    k.write_text("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                 "    def __init__(self, features):\n        super().__init__()\n"
                 "        self.bn = nn.BatchNorm1d(features)\n\n    def forward(self, x):\n" + body + "\n")
    res, _ = _verify(BN_TRAIN, k, cache)
    assert res.correct is correct, res.reason
    if not correct:
        assert "parameter bn.weight" in res.reason and "kfray rule" in res.reason


@needs_gxx
def test_a_reference_that_updates_running_statistics_is_correct_in_the_suites_form(tmp_path, cache):
    """robust-kbench's BatchNorm tasks: forward_fn updates its running-statistics arguments."""
    from kfray.tasks import load_task
    ref = f"rkb:{DATA / 'rkb_suite' / 'batchnorm_train'}"
    k = tmp_path / "bn_reference.cpp"
    k.write_text(next(s.source for s in load_task(ref).seeds if s.name == "reference_function"))
    res, _ = _verify(ref, k, cache)
    assert res.correct, res.reason


def test_a_suite_task_has_time_for_each_of_its_configurations():
    """robust-kbench judges and times every configuration on its own (1000 samples a side): the
    sandbox's limit is eval.timeout_s per configuration on a suite's task, once on kfray's own."""
    from kfray.config import EvalConfig
    from kfray.eval.evaluator import Evaluator
    from kfray.tasks import load_task

    ev = Evaluator("cpu", EvalConfig(timeout_s=30))
    try:
        job = {"torch_compile": False, "task_ref": "x"}
        rkb = "rkb:" + str(DATA / "rkb_form" / "linear_relu")
        assert ev._timeout(job, load_task(rkb + "@multi")) == 30 * 8
        assert ev._timeout(job, load_task(rkb)) == 30
        assert ev._timeout(job, load_task("axpb")) == 30       # kfray's own task: one limit for all shapes
    finally:
        ev.shutdown()


def test_timed_backward_calls_share_one_upstream_gradient_however_many_calls_a_side_makes(tmp_path):
    """After the timed runs the two sides' last gradients are compared. A time budget cuts each side
    at its own count of calls, so every call must backpropagate the same upstream gradient: a
    gradient drawn from the shared generator after N calls differs from one after M."""
    from kfray.config import EvalConfig
    from kfray.eval.backends.torch_ext import TorchExtCpuBackend
    from kfray.eval.suite.judge import Judge
    from kfray.eval.suite.runners import RkbRunner
    from kfray.eval.suite.side_timer import time_case
    from kfray.eval.suite.timing import Clock
    from kfray.tasks import load_task

    spec = load_task(f"rkb:{RKB}#backward").suite
    backend = TorchExtCpuBackend(EvalConfig(cache_dir=str(tmp_path)))
    judge = Judge(backend, spec, np.random.default_rng(0))
    case = RkbRunner(spec, None).cases()[0]
    last = []
    for warmup, trials in ((1, 2), (3, 7)):
        _, (_, _, grads) = time_case(judge, Clock(backend, flush_l2=False), case, 1234, "ref", warmup, trials, 0.0)
        last.append(grads)
    assert last[0].keys() == last[1].keys() and len(last[0]) >= 2
    for name in last[0]:
        assert torch.equal(last[0][name], last[1][name]), name


@needs_gxx
def test_the_references_calls_keep_the_kernels_cadence(tmp_path, cache):
    """Each candidate call waits on the wire to its runner, and clones and copies around it; a
    reference timed back to back would idle less between calls (on the H200 that alone made a
    few-microsecond task 0.5x against itself). With eval.suite_ref_pace (the default) each
    reference call starts as long after the last as the candidate's did; off, it does not."""
    from kfray.tasks import load_task
    ref = f"rkb:{DATA / 'rkb_suite' / 'optional_arg'}"
    k = tmp_path / "reference.cpp"
    k.write_text(next(s.source for s in load_task(ref).seeds if s.name == "reference_function"))
    ratios = {}
    for pace in ("true", "false"):
        res, _ = _verify(ref, k, cache, f"eval.suite_ref_pace={pace}")
        assert res.correct, res.reason
        ratios[pace] = [r["ref_period_ms"] / r["period_ms"] for r in res.facts["per_shape"].values()]
    assert all(0.9 <= x <= 1.25 for x in ratios["true"]), ratios
    assert min(ratios["false"]) < 0.9, ratios                       # the control: unpaced, it idles less


# --- robust-kbench backward kernels in their runner -------------------------------------------------------
@contextlib.contextmanager
def _in_runner(artifact: str, task):
    """The kernel loaded in a runner forked for it, this process its judge (as the sandbox's judge is)."""
    from kfray.eval.remote import RemoteRunner
    from kfray.eval.spawner import Spawner
    from kfray.eval.suite.remote_case import RemoteKernel

    spawner = Spawner()
    runner = RemoteRunner(spawner)
    try:
        yield RemoteKernel(runner, artifact, task, "cpu")
    finally:
        runner.close()
        spawner.close()


def _built(kernel: Path, task, cache: Path):
    from kfray.config import EvalConfig
    from kfray.eval.backends.torch_ext import TorchExtCpuBackend

    backend = TorchExtCpuBackend(EvalConfig(cache_dir=str(cache)))
    return backend, backend.compile(kernel.read_text(), {}, task).artifact


@needs_gxx
@pytest.mark.parametrize("kernel,mode", [("backward.cpp", "@multi"), ("backward_wrong.cpp", "")])
def test_a_backward_kernel_in_its_runner_gets_the_verdict_it_gets_in_the_judge(cache, kernel, mode):
    """Moving the kernel's side to its runner changes no verdict: the same inputs, parameters and
    upstream gradient (the judge's, after the suite's seeds), so the same reason to the digit."""
    from kfray.eval.suite import run_suite_job
    from kfray.tasks import load_task

    task = load_task(f"rkb:{RKB}#backward{mode}")
    backend, artifact = _built(RKB / kernel, task, cache)
    with _in_runner(artifact, task) as remote:
        apart = run_suite_job(backend, remote, task, {"suite_perf_trials": 10})
    here = run_suite_job(backend, backend.load(artifact, task), task, {"suite_perf_trials": 10})
    assert (apart["tier"], apart["reason"]) == (here["tier"], here["reason"]), (apart["reason"], here["reason"])
    if here["tier"] == 5:
        assert apart["facts"]["suite"]["configs"] == 8 and set(apart["times"]) == set(here["times"])


@needs_gxx
def test_timed_backward_calls_in_the_runner_share_one_upstream_gradient_too(cache):
    """The same rule with the kernel's side in its runner: however many calls it makes, its last
    gradients are those of the judge's one `g` on the judge's parameters, the reference's own."""
    from kfray.eval.suite.judge import Judge
    from kfray.eval.suite.runners import RkbRunner
    from kfray.eval.suite.side_timer import time_case
    from kfray.eval.suite.timing import Clock
    from kfray.tasks import load_task

    task = load_task(f"rkb:{RKB}#backward")
    backend, artifact = _built(RKB / "backward.cpp", task, cache)
    judge = Judge(backend, task.suite, np.random.default_rng(0))
    clock = Clock(backend, flush_l2=False)
    with _in_runner(artifact, task) as remote:
        case = remote.cases(RkbRunner(task.suite, None).cases())[0]
        _, (_, _, want) = time_case(judge, clock, case, 1234, "ref", 2, 3, 0.0)
        for warmup, trials in ((1, 2), (3, 7)):
            ts, (_, _, got) = time_case(judge, clock, case, 1234, "new", warmup, trials, 0.0)
            assert len(ts) == trials and got.keys() == want.keys() and len(want) >= 2
            for name in want:
                torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, msg=name)


def _no_cuda() -> str | None:
    try:
        if not torch.cuda.is_available():
            return "PyTorch sees no CUDA device"
        from kfray.eval.backends.cuda import nvcc_path

        nvcc_path()
    except Exception as e:
        return f"no usable CUDA PyTorch or nvcc ({type(e).__name__}: {str(e)[:120]})"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(_no_cuda() is not None, reason=_no_cuda() or "")
@pytest.mark.parametrize("wrong", [False, True])
def test_a_cuda_backward_kernel_is_judged_from_its_runner_on_the_gpu(tmp_path, wrong):
    """A .cu backward kernel on the GPU: inputs, parameters and `g` go to its runner by CUDA IPC,
    its gradients come back the same way; a wrong one is rejected by name."""
    src = (DATA / "rkb_form" / "backward_relu.cu").read_text()
    k = tmp_path / "backward.cu"
    k.write_text(src.replace("out[i] > 0.f ? g[i] : 0.f", "g[i]") if wrong else src)
    res, _ = verify(f"rkb:{RKB}#backward@multi", str(k), "torch_ext_cuda",
                    [f"eval.cache_dir={tmp_path / 'cache'}", "eval.suite_perf_trials=20"])
    assert res.correct is not wrong, res.reason
    assert "runner_round_trip_us" in res.facts
    if wrong:
        assert "gradient" in res.reason and "robust-kbench rule" in res.reason, res.reason
    else:
        assert not res.facts.get("untrusted"), res.facts
        _times_agree(res.facts["suite"])


ELAPSED_PATCH = r"""
#include <pybind11/eval.h>
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    pybind11::exec(R"(
import torch
_real = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: _real(self, end) * 0.25
)");
    m.def("backward", &backward);
}
"""


@pytest.mark.gpu
@pytest.mark.skipif(_no_cuda() is not None, reason=_no_cuda() or "")
def test_a_cuda_backward_kernel_that_quarters_its_event_timer_is_flagged(tmp_path):
    """The issue's elapsed_time hack from a backward kernel: its runner's CUDA events report a
    quarter of the time; the judge's own clock around each request does not agree."""
    src = (DATA / "rkb_form" / "backward_relu.cu").read_text()
    src = src.replace('PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("backward", &backward); }', ELAPSED_PATCH)
    assert "elapsed_time" in src
    k = tmp_path / "backward.cu"
    k.write_text(src)
    res, _ = verify(f"rkb:{RKB}#backward@multi", str(k), "torch_ext_cuda",
                    [f"eval.cache_dir={tmp_path / 'cache'}", "eval.suite_perf_trials=20"])
    assert res.correct, res.reason
    assert "outside clock" in res.facts.get("untrusted", ""), res.facts
