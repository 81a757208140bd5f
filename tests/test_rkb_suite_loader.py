"""robust-kbench tasks load with the configurations robust-kbench itself runs: its modes, its config
strings, settings that only build the model, configurations that change the kernel's arguments, the
suite's filter flags, and `kfray tasks` failing loudly (with counts) when a task cannot load."""
from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kfray.cli import main  # noqa: E402
from kfray.errors import TaskError  # noqa: E402
from kfray.sweep import plan, split_flagged  # noqa: E402
from kfray.tasks import discover, load_task  # noqa: E402
from kfray.tasks.robust_kbench import config_combinations  # noqa: E402

SUITE = Path(__file__).parent / "data" / "rkb_suite"
INIT_STRING = SUITE / "init_string"


def suite_get_configs(configs: dict, multi_input: bool, multi_init: bool) -> list[tuple[dict, dict, str]]:
    """robust-kbench's ConfigTask.get_configs (robust_kbench/config_task.py), as the oracle."""
    input_configs = configs["multi_input_configs" if multi_input else "single_input_configs"]
    init_configs = configs["multi_init_configs" if multi_init else "single_init_configs"]
    shared_configs = configs["multi_shared_configs" if multi_input and multi_init else "single_shared_configs"]
    out = []
    for init_config, input_config, shared_config in itertools.product(init_configs, input_configs, shared_configs):
        init_c, input_c = {**init_config, **shared_config}, {**input_config, **shared_config}
        s = "_".join([f"{k}_{v}" for k, v in init_c.items()] + [f"{k}_{v}" for k, v in input_c.items()])
        out.append((init_c, input_c, s.replace(" ", "_").replace(".", "_").replace("-", "_").replace("=", "_")))
    return out


@pytest.mark.parametrize("mode,flags,count", [("single", (False, False), 1), ("multi_input", (True, False), 2),
                                              ("multi_init", (False, True), 2), ("multi", (True, True), 8)])
def test_each_mode_runs_the_suites_configurations_in_its_order(mode, flags, count):
    raw = json.loads((INIT_STRING / "config_forward.json").read_text())
    want, seen = [], set()
    for init_c, input_c, name in suite_get_configs(raw, *flags):       # duplicates removed, order kept
        key = json.dumps([init_c, input_c], sort_keys=True)
        if key not in seen:
            seen.add(key)
            want.append((name, init_c, input_c))
    suffix = "" if mode == "single" else f"@{mode}"
    task = load_task(f"rkb:{INIT_STRING}{suffix}")
    got = [(c.name, c.init, c.inputs) for c in task.suite.configs]
    assert got == want and len(got) == count
    assert list(task.shapes) == [name for name, _, _ in want]            # shape configs named as the suite names them
    assert task.suite.mode == mode and task.suite.direction == "forward" and not task.suite.functional_error
    if mode == "single":
        assert list(task.shapes) == ["init_method_ones_gain_0_5_cols_8_rows_4_cols_8"]
    if mode == "multi":                                                   # multi_shared only with both flags
        assert {c.inputs["cols"] for c in task.suite.configs} == {8, 5}
    else:
        assert {c.inputs["cols"] for c in task.suite.configs} == {8}


def test_a_string_init_setting_that_varies_loads_and_builds_each_model():
    task = load_task(f"rkb:{INIT_STRING}@multi_init")
    assert [c.init["init_method"] for c in task.suite.configs] == ["ones", "random"]
    assert task.signature("cpp") == ('extern "C" int kf_forward(const float* x, const float* weight, float* out, '
                                     'int64_t rows, int64_t cols, float gain)')
    weights = {}
    for shape, cfg in task.configs.items():
        a = task.make_args(shape, np.random.default_rng(0))
        assert np.allclose(task.run_reference(a)["out"], a["x"] * a["weight"])
        weights[cfg["init_method"]] = a["weight"]
    assert np.allclose(weights["ones"], 0.5) and not np.allclose(weights["random"], 0.5)


def test_the_worker_reloads_the_same_mode_from_the_ref_backward_too():
    ref = f"rkb:{INIT_STRING}#backward@multi"
    task = load_task(ref)
    assert task.ref == ref and task.suite.direction == "backward" and task.suite.mode == "multi"
    assert len(task.suite.configs) == 8 and list(task.shapes) == [c.name for c in task.suite.configs]
    assert [o.name for o in task.outputs] == ["grad_x", "grad_weight"]
    load_task.cache_clear()                                               # as a fresh worker process would
    assert list(load_task(ref).shapes) == list(task.shapes)
    with pytest.raises(TaskError, match="unknown robust-kbench mode @both"):
        load_task(f"rkb:{INIT_STRING}@both")


def test_the_judge_rebuilds_the_task_it_is_sent_as_the_worker_loads_it(tmp_path, monkeypatch):
    """The evaluator sends its judge the suite task as data (no second load and trace): the judge's
    copy has the same spec, configurations in the suite's order, parameter names and name, and its
    path holds from another folder."""
    from kfray.tasks.suite_spec import suite_task, suite_task_data

    monkeypatch.chdir(SUITE.parent)
    ref = f"rkb:{SUITE.name}/{INIT_STRING.name}#backward@multi"      # a relative path, as a user types it
    task = load_task(ref)
    data = json.loads(json.dumps(suite_task_data(task)))           # through a wire: plain data only
    monkeypatch.chdir(tmp_path)
    got = suite_task(data)
    assert got.suite == dataclasses.replace(task.suite, path=str(INIT_STRING.resolve()))
    assert [c.name for c in got.suite.configs] == list(task.shapes) and len(got.suite.configs) == 8
    assert got.param_args == task.param_args and got.name == task.name and got.ref == ref
    assert Path(got.suite.path).is_dir()


def test_a_mode_whose_lists_the_file_lacks_says_which():
    cfg = SUITE / "flagged" / "config_forward.json"
    with pytest.raises(TaskError) as e:
        load_task(f"rkb:{SUITE / 'flagged'}@multi")
    assert str(cfg) in str(e.value) and "multi_input_configs" in str(e.value)
    with pytest.raises(TaskError, match="multi_init_configs"):
        config_combinations({"single_input_configs": [{}], "single_shared_configs": [{}]}, "x", "multi_init")


def test_configurations_that_change_the_kernels_arguments_still_load():
    task = load_task(f"rkb:{SUITE / 'optional_arg'}")
    assert [c.init["proj"] for c in task.suite.configs] == [False, True]   # the suite runs both
    assert len(task.shapes) == 1                                          # kf_forward: the first one's layout
    assert "proj_weight" not in task.signature("cpp")
    err = task.suite.functional_error
    assert "1 of 2 configurations" in err and "proj_weight" in err and "\n" not in err
    shape = next(iter(task.shapes))
    a = task.make_args(shape, np.random.default_rng(0))
    assert np.allclose(task.run_reference(a)["out"], a["x"] * a["weight"])
    assert task.suite.bytes_needed == 4 * (4 * 8 + 8 + 8 + 4 * 8)         # the proj configuration: the largest


def test_filter_flags_are_shown_and_skipped_by_a_sweep(capsys):
    task = load_task(f"rkb:{SUITE / 'flagged'}")
    assert task.suite.flagged == ("filter_output_std",)                  # true flags only, not the LLM's text
    refs, skipped = plan(str(SUITE), None, None, "cpp", offline=False)
    assert f"rkb:{SUITE / 'flagged'}" in refs and f"rkb:{SUITE / 'suite_bug'}" in skipped
    kept, flagged = split_flagged(refs)
    assert f"rkb:{SUITE / 'flagged'}" not in kept and len(kept) == len(refs) - 1
    assert "filter_output_std" in flagged[f"rkb:{SUITE / 'flagged'}"]
    main(["tasks", str(SUITE / "flagged")])
    out = capsys.readouterr().out
    assert "flagged by the suite (filter_output_std)" in out and "kfray sweep skips them" in out


def test_tasks_command_fails_with_a_count_per_reason(capsys):
    assert main(["tasks", str(SUITE)]) == 1
    out = capsys.readouterr().out
    assert "5 of 6 tasks load; 1 cannot" in out
    line = next(ln for ln in out.splitlines() if "suite's own bug" in ln and "suite_bug" in ln)
    assert line.split()[0] == "1" and "Model()" in line
    why = dict(discover(str(SUITE)))[f"rkb:{SUITE / 'suite_bug'}"]        # the message in the table, one line
    assert "the suite's own bug" in why and "kernel_size" in why and "TypeError" in why and "\n" not in why
    assert main(["tasks", str(SUITE / "init_string")]) == 0


def test_a_suite_prefix_on_a_folder_of_tasks_lists_every_task_in_it():
    from kfray.tasks import resolve

    plain = resolve(str(SUITE))
    assert resolve(f"rkb:{SUITE}") == plain and len(plain) >= 4
    assert resolve(f"rkb:{SUITE}/init_string") == [f"rkb:{SUITE}/init_string"]     # one task stays one ref
