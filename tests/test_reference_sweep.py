"""scripts/reference_sweep.py (issue 25): each problem's own reference as its kernel, per level
correct / total, time to verdict, wall time and failures, in the JSON the benchmark keeps. Here on
the CPU, on a few small problems in KernelBench's layout and a robust-kbench folder."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"


def _script():
    spec = importlib.util.spec_from_file_location("reference_sweep", ROOT / "scripts" / "reference_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reference_sweep_on_a_small_kernelbench_layout(ray_local, tmp_path, tmp_cache, capsys):
    pytest.importorskip("torch")
    kb = tmp_path / "KernelBench" / "KernelBench"
    for level, files in {1: [DATA / "kernelbench" / "level1" / "1_Relu.py"],
                         2: [DATA / "kernelbench" / "level1" / "2_Linear_bias.py"],
                         3: [DATA / "kernelbench" / "level_fixtures" / "7_Batchnorm_train.py",
                             DATA / "kernelbench" / "level_fixtures" / "5_Needs_missing_package.py"]}.items():
        (kb / f"level{level}").mkdir(parents=True)
        for i, f in enumerate(files, 1):
            shutil.copy(f, kb / f"level{level}" / f"{i}_{f.name.split('_', 1)[1]}")
    rkb = tmp_path / "robust-kbench" / "tasks"
    rkb.mkdir(parents=True)
    shutil.copytree(DATA / "rkb" / "broken_config", rkb / "broken_config")      # loads not: not counted
    out = tmp_path / "reference_sweep_cpu.json"
    rc = _script().main(["--kernelbench", str(tmp_path / "KernelBench"), "--rkb", str(tmp_path / "robust-kbench"),
                         "--out", str(out), "--set", "eval.evaluators=2"])
    printed = capsys.readouterr().out
    assert rc == 1                                          # one problem does not load: not all correct
    data = json.loads(out.read_text())
    assert set(data["levels"]) == {"level1", "level2", "level3", "rkb"}
    for name, level in data["levels"].items():
        for key in ("correct", "total", "wall_s", "verdict_s_median", "verdict_s_max", "problems_per_hour", "failed"):
            assert key in level, (name, key)
    lv = data["levels"]
    assert (lv["level1"]["correct"], lv["level1"]["total"]) == (1, 1), lv["level1"]
    assert (lv["level2"]["correct"], lv["level2"]["total"]) == (1, 1), lv["level2"]
    # BatchNorm in training mode, as its own kernel, is correct; the problem that cannot load counts
    assert (lv["level3"]["correct"], lv["level3"]["total"]) == (1, 2), lv["level3"]
    assert list(lv["level3"]["failed"]) == ["2_Needs_missing_package.py"]
    assert "kfray_no_such_package_xyz" in lv["level3"]["failed"]["2_Needs_missing_package.py"]
    assert lv["rkb"]["total"] == 0 and "broken_config" in lv["rkb"]["not_loaded"]
    assert all(level["wall_s"] > 0 for name, level in lv.items() if level["total"] - len(level["failed"]))
    assert data["backend"] == "torch_ext_cpu" and data["gpu"] == "cpu"
    rows = {r["problem"]: r for r in data["problems"]}
    assert rows["1_Relu.py"]["kernel"] == "reference_module" and rows["1_Relu.py"]["verdict_s"] > 0
    # the reference's own time is trusted by kfray's rules too: a flag would print, and count as 0
    assert rows["1_Relu.py"]["flagged"] == "" and lv["level1"]["flagged"] == {}
    shape = rows["1_Relu.py"]["per_shape"]["default"]          # both sides' figures, for a look at the noise
    assert shape["ref_median_ms"] > 0 and shape["period_ms"] > 0 and shape["ref_period_ms"] > 0
    assert "level3: 1 / 2 correct" in printed and "failed  2_Needs_missing_package.py" in printed
    # continued in a second call: what was judged correct is left out, the rest runs again
    again = tmp_path / "again.json"
    rc = _script().main(["--kernelbench", str(tmp_path / "KernelBench"), "--levels", "1,3",
                         "--out", str(again), "--skip-correct", str(out), "--set", "eval.evaluators=1"])
    assert rc == 1
    assert "2 judged correct before, left out" in capsys.readouterr().out
    data = json.loads(again.read_text())
    assert data["problems"] == [] and data["levels"]["level3"]["failed"].keys() == {"2_Needs_missing_package.py"}
