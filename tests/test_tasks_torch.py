"""KernelBench and robust-kbench loaders: the functional conversion, every configuration checked,
a kernel right on one configuration and wrong on another fails, backward through autograd."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kfray.candidate import Candidate, EvalResult  # noqa: E402
from kfray.config import EvalConfig  # noqa: E402
from kfray.errors import TaskError  # noqa: E402
from kfray.tasks import discover, load_task  # noqa: E402
from kfray.tasks.robust_kbench import config_combinations  # noqa: E402

DATA = Path(__file__).parent / "data"
KB = DATA / "kernelbench"
RKB = DATA / "rkb"


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    from kfray.eval.evaluator import Evaluator

    ev = Evaluator("cpu", EvalConfig(cache_dir=str(tmp_path_factory.mktemp("cache")), timeout_s=60))
    yield ev
    ev.shutdown()


def _eval(ev, ref, source) -> EvalResult:
    return EvalResult.from_dict(ev.evaluate(Candidate(task=ref, language="cpp", source=source, params={})))


# --- KernelBench ---------------------------------------------------------------------------------
def test_level_folder_lists_every_file_with_its_ref_or_reason():
    found = dict(discover(str(KB), level=1))
    names = {Path(r.split(":", 1)[1]).name: e for r, e in found.items()}
    assert set(names) == {"1_Relu.py", "2_Linear_bias.py", "3_Softmax_rows.py", "4_Half_precision_gelu.py",
                          "5_Bias_norm.py"}
    assert names["4_Half_precision_gelu.py"] is None          # loads: suite-form kernels can take float16
    half = load_task("kernelbench:" + str(KB / "level1" / "4_Half_precision_gelu.py"))
    assert "float16" in half.suite.functional_error            # kf_forward kernels cannot, and say so
    assert all(e is None for n, e in names.items() if n != "4_Half_precision_gelu.py")
    assert dict(discover(str(KB / "level1"))) == found
    with pytest.raises(TaskError, match="no level7 folder"):
        discover(str(KB), level=7)


def test_parameters_become_explicit_inputs_and_the_reference_uses_them():
    t = load_task(f"kernelbench:{KB / 'level1' / '2_Linear_bias.py'}")
    assert t.signature("cpp") == ('extern "C" int kf_forward(const float* x, const float* fc_weight, '
                                  'const float* fc_bias, float* out, int64_t rows, int64_t n_in, int64_t n_out)')
    assert t.shapes == {"default": {"rows": 16, "n_in": 48, "n_out": 24}}
    assert "class Model" in t.description and "`fc_weight`: model parameter `fc.weight`" in t.description
    a1 = t.make_args("default", np.random.default_rng(1))
    a2 = t.make_args("default", np.random.default_rng(2))
    assert not np.allclose(a1["fc_weight"], a2["fc_weight"])          # fresh parameters per draw
    assert np.isnan(a1["out"]).all()
    out = t.run_reference(a1)["out"]
    assert np.allclose(out, a1["x"] @ a1["fc_weight"].T + a1["fc_bias"], atol=1e-5)
    # buffers too: BatchNorm's running statistics are arguments
    bn = load_task(f"kernelbench:{KB / 'level1' / '5_Bias_norm.py'}")
    assert [a.name for a in bn.inputs] == ["x", "bn_weight", "bn_bias", "bn_running_mean", "bn_running_var",
                                           "bn_num_batches_tracked"]


RELU = """#include <cstdint>
extern "C" int kf_forward(const float* x, float* out, int64_t batch, int64_t features) {
    for (int64_t i = 0; i < batch * features; ++i) out[i] = x[i] > 0.f ? x[i] : 0.f;
    return 0;
}"""

LINEAR = """#include <cstdint>
extern "C" int kf_forward(const float* x, const float* w, const float* b, float* out,
                          int64_t rows, int64_t n_in, int64_t n_out) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < n_out; ++o) {
            float s = b[o];
            for (int64_t k = 0; k < n_in; ++k) s += x[r * n_in + k] * w[o * n_in + k];
            out[r * n_out + o] = s;
        }
    return 0;
}"""


def test_kernelbench_kernels_run_in_the_sandbox(evaluator):
    r = _eval(evaluator, f"kernelbench:{KB / 'level1' / '1_Relu.py'}", RELU)
    assert r.tier == 5, r.reason
    # an elementwise loop and torch's own relu are within a small factor of each other
    assert 0.2 < r.speedup < 20 and r.ref_times["default"] > 0, (r.times, r.ref_times)
    ref = f"kernelbench:{KB / 'level1' / '2_Linear_bias.py'}"
    assert _eval(evaluator, ref, LINEAR).tier == 5
    r = _eval(evaluator, ref, LINEAR.replace("float s = b[o];", "float s = 0.f;"))     # forgets the bias
    assert r.tier == 4 and "output out" in r.reason


# --- robust-kbench -------------------------------------------------------------------------------
def test_config_combinations_follow_the_suite_modes_with_shared_last():
    cfg = json.loads((RKB / "scaled_leaky" / "config_forward.json").read_text())
    assert [(c.init, c.inputs) for c in config_combinations(cfg, "x")] == [({"slope": 0.1, "cols": 64},
                                                                            {"rows": 16, "cols": 64})]
    combos = config_combinations(cfg, "x", "multi")
    assert len(combos) == 8                       # 2 init x 2 input x 2 shared
    assert {(c.init["slope"], c.init["cols"], c.inputs["rows"], c.inputs["cols"]) for c in combos} == {
        (s, c, r, c) for s in (0.1, 0.3) for c in (64, 40) for r in (16, 33)}
    combos = config_combinations({"single_input_configs": [{"n": 1, "k": 2}], "single_init_configs": [{}],
                                  "single_shared_configs": [{"k": 5}]}, "x")
    assert [(c.init, c.inputs) for c in combos] == [({"k": 5}, {"n": 1, "k": 5})]
    with pytest.raises(TaskError, match="needs single_input_configs, which the file lacks"):
        config_combinations({"other": 1}, "x")


def test_rkb_task_has_a_shape_config_per_combination():
    t = load_task(f"rkb:{RKB / 'scaled_leaky'}@multi")
    assert len(t.shapes) == 8
    assert t.signature("cpp") == ('extern "C" int kf_forward(const float* x, const float* gain, float* out, '
                                  'int64_t rows, int64_t cols, float slope)')
    for shape, cfg in t.shapes.items():
        a = t.make_args(shape, np.random.default_rng(0))
        assert a["x"].shape == (cfg["rows"], cfg["cols"]) and a["slope"] == pytest.approx(cfg["slope"])
        x, g = a["x"], a["gain"]
        assert np.allclose(t.run_reference(a)["out"], np.where(x > 0, x, cfg["slope"] * x) * g, atol=1e-6)
    found = dict(discover(str(RKB)))
    assert "not valid JSON" in found[f"rkb:{RKB / 'broken_config'}"]
    assert found[f"rkb:{RKB / 'linear_tanh'}#backward"] is None


LEAKY = """#include <cstdint>
extern "C" int kf_forward(const float* x, const float* gain, float* out, int64_t rows, int64_t cols, float slope) {
    const int64_t C = cols;
    const float s = SLOPE;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < C; ++c) {
            float v = x[r * C + c];
            out[r * C + c] = (v > 0.f ? v : s * v) * gain[c];
        }
    return 0;
}"""


def test_kernel_right_on_one_config_and_wrong_on_another_fails(evaluator):
    ref = f"rkb:{RKB / 'scaled_leaky'}@multi"
    r = _eval(evaluator, ref, LEAKY.replace("SLOPE", "slope"))
    assert r.tier == 5, r.reason
    assert set(r.times) == set(load_task(ref).shapes)
    r = _eval(evaluator, ref, LEAKY.replace("SLOPE", "cols == 64 ? slope : 0.2f"))   # right only where cols == 64
    assert r.tier == 4 and "cols_40" in r.reason


LINEAR_TANH_BACKWARD = """#include <cmath>
#include <cstdint>
#include <vector>
extern "C" int kf_forward(const float* x, const float* gout, const float* w, const float* b,
                          float* gx, float* gw, float* gb, int64_t batch, int64_t nin, int64_t nout) {
    std::vector<float> gpre(batch * nout);
    for (int64_t r = 0; r < batch; ++r)
        for (int64_t o = 0; o < nout; ++o) {
            float s = b[o];
            for (int64_t k = 0; k < nin; ++k) s += x[r * nin + k] * w[o * nin + k];
            float t = std::tanh(s);
            gpre[r * nout + o] = gout[r * nout + o] * (1.f - t * t);
        }
    for (int64_t r = 0; r < batch; ++r)
        for (int64_t k = 0; k < nin; ++k) {
            float s = 0.f;
            for (int64_t o = 0; o < nout; ++o) s += gpre[r * nout + o] * w[o * nin + k];
            gx[r * nin + k] = s;
        }
    for (int64_t o = 0; o < nout; ++o) {
        float sb = 0.f;
        for (int64_t r = 0; r < batch; ++r) sb += gpre[r * nout + o];
        gb[o] = sb;
        for (int64_t k = 0; k < nin; ++k) {
            float s = 0.f;
            for (int64_t r = 0; r < batch; ++r) s += gpre[r * nout + o] * x[r * nin + k];
            gw[o * nin + k] = s;
        }
    }
    return 0;
}"""


def test_backward_task_is_checked_on_every_combination(evaluator):
    ref = f"rkb:{RKB / 'linear_tanh'}#backward@multi"
    t = load_task(ref)
    assert [o.name for o in t.outputs] == ["grad_x", "grad_weight", "grad_bias"]
    assert len(t.shapes) == 4
    r = _eval(evaluator, ref, LINEAR_TANH_BACKWARD)
    assert r.tier == 5, r.reason
    r = _eval(evaluator, ref, LINEAR_TANH_BACKWARD.replace("gb[o] = sb;", "gb[o] = 0.5f * sb;"))
    assert r.tier == 4 and "grad_bias" in r.reason


# --- listing stays cheap at KernelBench sizes ----------------------------------------------------------
PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        {body}


rows = {rows}
cols = {cols}


def get_inputs():
    return [torch.rand(rows, cols)]


def get_init_inputs():
    return []
"""


def test_shapes_come_from_fake_tensors_never_a_full_size_run(tmp_path):
    import time

    def problem(name, body, rows, cols):
        p = tmp_path / f"{name}.py"
        p.write_text(PROBLEM.format(body=body, rows=rows, cols=cols))
        return f"kernelbench:{p}"

    # `.cpu()` has no meta kernel: fake tensors trace it; 32768 x 32768 floats (4 GiB) are never allocated
    t0 = time.perf_counter()
    t = load_task(problem("copy_out", "return torch.relu(x).cpu().sum(dim=1)", 32768, 32768))
    assert time.perf_counter() - t0 < 20
    assert [a.shape for a in t.args if getattr(a, "role", "") == "out"] == [("rows",)]
    # control flow on the data: no shape inference works; small, it runs once for real, big, it is refused
    body = "return x * 2 if x.sum() > 0 else x"
    assert load_task(problem("small_branch", body, 8, 16)).shapes == {"default": {"rows": 8, "cols": 16}}
    with pytest.raises(TaskError, match="too costly just to learn the output shapes"):
        load_task(problem("big_branch", body, 32768, 32768))
