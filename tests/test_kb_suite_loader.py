"""KernelBench loading of the real suite's harder files, on tiny fixtures in its layout: bool and half
precision tensors, models only a real construction can build (`.item()` in __init__), missing
packages and network weights named plainly, and the suite spec (tolerance, bytes needed)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kfray.errors import TaskError  # noqa: E402
from kfray.tasks import discover  # noqa: E402
from kfray.tasks.base import Scalar, Task, Tensor  # noqa: E402
from kfray.tasks.kernelbench import load_kernelbench  # noqa: E402
from kfray.tasks.suite_spec import KB_TOLERANCE, format_gib, over_limit  # noqa: E402
from kfray.tasks.torch_ref import build_real as _build_real  # noqa: E402

FIX = Path(__file__).parent / "data" / "kernelbench" / "level_fixtures"


def _module_of(path: Path):
    """The module the loader imported for a fixture (it stays registered in sys.modules)."""
    return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(path))


def _real_bytes(path: Path) -> int:
    """Inputs + parameters/buffers + outputs of a problem, counted by running it for real."""
    spec = importlib.util.spec_from_file_location("kb_fixture_" + path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.Model(*mod.get_init_inputs())
    inputs = mod.get_inputs()
    with torch.no_grad():
        res = model(*inputs)
    outs = list(res) if isinstance(res, tuple) else [res]
    ts = inputs + list(model.parameters()) + list(model.buffers()) + outs
    return sum(t.numel() * t.element_size() for t in ts)


def test_bool_inputs_and_outputs_load_and_run_in_kf_forward_form():
    t = load_kernelbench(FIX / "1_Masked_select_bool.py")
    assert [(a.name, a.dtype) for a in t.args if isinstance(a, Tensor)] == \
        [("x", "float32"), ("mask", "bool"), ("out0", "float32"), ("out1", "bool")]
    assert "const bool* mask" in t.signature("cpp") and "bool* out1" in t.signature("cpp")
    assert t.suite.functional_error == "" and t.suite.rtol == t.suite.atol == KB_TOLERANCE["float32"]
    a = t.make_args("default", np.random.default_rng(0))
    assert a["mask"].dtype == np.bool_ and a["mask"].any() and not a["mask"].all()
    ref = t.run_reference(a)
    assert ref["out1"].dtype == np.bool_
    np.testing.assert_array_equal(ref["out0"], np.where(a["mask"], a["x"], 0))
    np.testing.assert_array_equal(ref["out1"], a["x"] > 0)


def test_a_task_of_kfray_own_form_takes_a_bool_argument():
    t = Task("masked_scale", "y = mask ? 2x : 0", [Tensor("x", "float32", ("n",)), Tensor("mask", "bool", ("n",)),
                                                    Tensor("y", "float32", ("n",), "out"), Scalar("n", "int64", "n")],
             {"small": {"n": 1000}}, reference=lambda a: {"y": np.where(a["mask"], 2 * a["x"], 0)})
    assert t.signature("cpp") == 'extern "C" int kf_forward(const float* x, const bool* mask, float* y, int64_t n)'
    a = t.make_args("small", np.random.default_rng(1))
    assert a["mask"].dtype == np.bool_ and 300 < a["mask"].sum() < 700      # a fair coin per element
    assert t.run_reference(a)["y"].dtype == np.float32


@pytest.mark.parametrize("name,dtype", [("2_Half_linear_gelu.py", "float16"), ("3_Bf16_scale.py", "bfloat16")])
def test_half_precision_loads_for_other_kernel_forms_with_the_suite_tolerance(name, dtype):
    t = load_kernelbench(FIX / name)
    assert {a.dtype for a in t.args if isinstance(a, Tensor)} == {dtype}
    assert t.suite.rtol == t.suite.atol == KB_TOLERANCE[dtype] == 1e-2
    assert t.rtol >= 1e-2
    assert dtype in t.suite.functional_error and "\n" not in t.suite.functional_error
    with pytest.raises(TaskError, match="kf_forward kernels cannot take"):
        t.signature("cpp")
    assert t.suite.bytes_needed == _real_bytes(FIX / name)
    found = dict(discover(str(FIX)))                # listing such a task does not fail either
    assert found[f"kernelbench:{(FIX / name).resolve()}"] is None


def test_a_model_only_a_real_construction_builds_loads_without_a_real_forward():
    t = load_kernelbench(FIX / "4_Item_in_init.py")
    assert _module_of(FIX / "4_Item_in_init.py").REAL_FORWARDS == []
    assert t.outputs[0].dims(t.shapes["default"]) == (64, 128)
    a = t.make_args("default", np.random.default_rng(0))
    assert np.isfinite(t.run_reference(a)["out"]).all()


def test_real_construction_stops_at_its_size_limit():
    with pytest.raises(TaskError, match="more than .* GiB of tensors"):
        _build_real(torch, lambda: torch.nn.Linear(1024, 1024), 1 << 20, "big.py")
    assert isinstance(_build_real(torch, lambda: torch.nn.Linear(16, 16), 1 << 20, "small.py"), torch.nn.Linear)


def test_a_missing_package_is_named_with_how_to_install_it():
    with pytest.raises(TaskError) as e:
        load_kernelbench(FIX / "5_Needs_missing_package.py")
    assert str(e.value) == (f"{FIX / '5_Needs_missing_package.py'}: needs the package kfray_no_such_package_xyz "
                            f"(pip install kfray_no_such_package_xyz)")


def test_network_weights_are_named_and_never_fetched(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(TaskError, match="needs model weights from the network .*which kfray does not fetch"):
        load_kernelbench(FIX / "6_Pretrained_weights.py")
    assert set(_module_of(FIX / "6_Pretrained_weights.py").SEEN_OFFLINE) == {"1"}   # offline whenever built
    assert "HF_HUB_OFFLINE" not in os.environ                                  # and restored after


def test_bytes_needed_counts_inputs_parameters_and_outputs():
    t = load_kernelbench(FIX / "1_Masked_select_bool.py")
    assert t.suite.bytes_needed == 8 * 16 * (4 + 1 + 4 + 1) == _real_bytes(FIX / "1_Masked_select_bool.py")
    t = load_kernelbench(FIX / "4_Item_in_init.py")
    assert t.suite.bytes_needed == 4 * (64 * 256 + 128 * 256 + 128 + 64 * 128)


def test_the_memory_check_message():
    assert format_gib(1.5 * 2**30) == "1.5 GiB"
    assert over_limit(3 * 2**30, 2 * 2**30) == "needs 3 GiB, limit 2 GiB"
    assert over_limit(2 * 2**30, 2 * 2**30) is None and over_limit(10**15, 0) is None
    msg = over_limit(2**30 + 1, 2**30)                   # just over: the figures still differ
    assert msg.startswith("needs 1 GiB") and "1,073,741,825 bytes" in msg


def test_a_task_is_loaded_once_per_process_and_again_once_its_file_changes(tmp_path):
    import os

    from kfray.tasks import load_task

    p = tmp_path / "level1" / "7_Scale.py"
    p.parent.mkdir()
    src = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
           "        super().__init__()\n\n    def forward(self, x):\n        return x * {k}\n\n\n"
           "def get_inputs():\n    return [torch.randn(8, 16)]\n\n\ndef get_init_inputs():\n    return []\n")
    p.write_text(src.format(k=2.0))
    ref = f"kernelbench:{p}"
    first = load_task(ref)
    assert load_task(ref) is first                       # a sweep's evaluators do not reload it
    p.write_text(src.format(k=3.0) + "# edited\n")
    os.utime(p, ns=(first_ns := p.stat().st_mtime_ns + 10**9, first_ns))
    again = load_task(ref)
    assert again is not first
    assert "x * 3.0" in again.seeds_for("suite")[0].source and "x * 2.0" in first.seeds_for("suite")[0].source
