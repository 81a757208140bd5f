"""Sweeps: fast_p and the tables as pure functions, and a real sweep of three task packages that
share two evaluators on the CPU backend."""
from __future__ import annotations

import csv
import json
import math
from argparse import Namespace
from pathlib import Path

import pytest

from kfray.errors import KfrayError
from kfray.sweep import (cmd_tasks, fast_p, geomean_speedup, markdown, plan, run_sweep, select,
                         suite_summary, task_rows, write_results)

DATA = Path(__file__).parent / "data"

RESULTS = [
    {"correct": True, "speedup": 0.8},
    {"correct": True, "speedup": 1.0},      # not > 1
    {"correct": True, "speedup": 1.6},
    {"correct": True, "speedup": 2.5},
    {"correct": False, "speedup": 3.0},     # fast but wrong: never counts
    {"correct": False, "speedup": 0.0},
]


def test_fast_p_against_hand_computed_values():
    assert fast_p(RESULTS) == {0.0: 4 / 6, 1.0: 2 / 6, 1.5: 2 / 6, 2.0: 1 / 6}
    assert fast_p(RESULTS, [0.5, 3.0]) == {0.5: 4 / 6, 3.0: 0.0}
    assert fast_p([]) == {0.0: 0.0, 1.0: 0.0, 1.5: 0.0, 2.0: 0.0}
    assert geomean_speedup(RESULTS) == pytest.approx((0.8 * 1.0 * 1.6 * 2.5) ** 0.25)
    assert geomean_speedup([{"correct": False, "speedup": 2}]) == 0.0


def test_tables_from_a_summary(tmp_path):
    summary = {"tasks": {
        "a": {"correct": True, "best_speedup_vs_reference": 2.0, "best_speedup_vs_seed": 1.5, "evaluated": 8,
              "correct_count": 5, "best_candidate": "x1"},
        "b": {"correct": False, "best_speedup_vs_reference": 0.0, "evaluated": 8, "correct_count": 0}}}
    rows = task_rows(summary, {"c": "cannot load: float16"})
    assert [r["task"] for r in rows] == ["a", "b", "c"] and rows[2]["status"].startswith("skipped")
    suite = suite_summary(rows)
    assert suite["fast_p"] == {"0": 1 / 3, "1": 1 / 3, "1.5": 1 / 3, "2": 0.0}
    assert suite["geomean_speedup"] == pytest.approx(2.0) and "fast_p_compile" not in suite
    files = write_results(rows, suite, tmp_path, "t")
    with open(files["tasks_csv"]) as f:
        got = list(csv.DictReader(f))
    assert [g["task"] for g in got] == ["a", "b", "c"] and "speedup_compile" not in got[0]
    with open(files["fast_p_csv"]) as f:
        fp = {(r["metric"], r["baseline"]): float(r["value"]) for r in csv.DictReader(f)}
    assert fp[("fast_1.5", "eager")] == pytest.approx(1 / 3, abs=1e-4)
    md = Path(files["markdown"]).read_text()
    assert "| fast_2 | 0.000 |" in md and "| a | ok | yes | 2.00x |" in md and "torch.compile" not in md
    # a torch.compile column appears only when some task has that baseline
    rows[0]["speedup_compile"] = 1.2
    suite = suite_summary(rows)
    assert suite["fast_p_compile"]["1"] == pytest.approx(1 / 3) and "vs torch.compile" in markdown(rows, suite)


def test_select_by_name_or_prefix():
    refs = ["kernelbench:/k/level1/1_Relu.py", "kernelbench:/k/level1/19_ReLU_big.py", "package:/p/vscale",
            "rkb:/r/linear_tanh#backward"]
    assert select(refs, "1_") == refs[:1]
    assert select(refs, "vscale,linear_tanh") == refs[2:]
    assert select(refs, None) == refs
    with pytest.raises(KfrayError, match="matches none"):
        select(refs, "nope")


def test_plan_skips_what_cannot_run_with_reasons():
    pytest.importorskip("torch")
    refs, skipped = plan(str(DATA / "kernelbench"), 1, None, "cpp", offline=True)
    assert refs == []                               # KernelBench problems have no seeds for the offline proposer
    assert any("float16" in why for why in skipped.values())
    assert any("offline proposer" in why for why in skipped.values())
    refs, skipped = plan(str(DATA / "kernelbench"), 1, "1_,2_", "cpp", offline=False)
    assert len(refs) == 2 and not skipped


def test_tasks_command_lists_loads_and_errors(capsys):
    pytest.importorskip("torch")                  # robust-kbench tasks need PyTorch to load
    assert cmd_tasks(Namespace(path=str(DATA / "rkb"), level=None)) == 0
    out = capsys.readouterr().out
    assert "cannot load" in out and "not valid JSON" in out and "linear_tanh" in out
    assert cmd_tasks(Namespace(path=None, level=None)) == 0
    out = capsys.readouterr().out
    assert "axpb" in out and "matmul" in out


def test_sweep_of_three_packages_on_two_evaluators(ray_local, tmp_path, tmp_cache):
    from kfray.config import load_config

    cfg = load_config(None, ["search.islands=2", "search.budget=6", "eval.evaluators=2", "eval.backend=cpu",
                             "search.migrate_every=1"])
    refs, skipped = plan(str(DATA / "packages"), None, None, "cpp", offline=True)
    assert len(refs) == 3 and not skipped
    s = run_sweep(cfg, refs, tmp_path / "sweep", skipped, progress=False, budget_total=18)
    assert s["evaluators"] == 2 and sum(s["per_evaluator"]) == s["evaluated"]
    assert len(s["per_evaluator"]) == 2 and all(n > 0 for n in s["per_evaluator"])          # the pool is shared: both worked
    rows = {Path(r["task"].split(":", 1)[1]).name: r for r in s["sweep"]["rows"]}
    assert rows["vscale"]["correct"] and rows["rowmax"]["correct"] and not rows["square_wrong"]["correct"]
    assert all(r["evaluated"] <= 6 for r in rows.values())         # 18 evaluations split over 3 tasks
    # fast_p by hand from the per-task results
    sp = {n: r["speedup"] for n, r in rows.items() if r["correct"]}
    suite = s["sweep"]["suite"]
    for p in (0, 1, 1.5, 2):
        assert suite["fast_p"][f"{p:g}"] == pytest.approx(sum(1 for v in sp.values() if v > p) / 3)
    assert suite["fast_p"]["0"] == pytest.approx(2 / 3)
    assert suite["geomean_speedup"] == pytest.approx(math.sqrt(sp["vscale"] * sp["rowmax"]))
    run = tmp_path / "sweep"
    saved = json.loads((run / "sweep.json").read_text())
    assert saved["suite"] == json.loads(json.dumps(suite))
    assert "| fast_1.5 |" in (run / "sweep.md").read_text()
    assert (run / "sweep_tasks.csv").is_file() and (run / "summary.json").is_file()
