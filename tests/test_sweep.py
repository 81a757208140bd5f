"""Sweeps: fast_p and the tables as pure functions, and a real sweep of three task packages that
share two evaluators on the CPU backend."""
from __future__ import annotations

import csv
import json
import math
import shutil
import sqlite3
from argparse import Namespace
from pathlib import Path

import pytest

from kfray.errors import KfrayError
from kfray.sweep import (cmd_tasks, fast_p, geomean_speedup, markdown, plan, run_sweep, select,
                         suite_summary, task_rows, write_results)
from kfray.tasks import load_task

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
    assert fast_p(RESULTS) == {0.0: 4 / 6, 0.5: 4 / 6, 0.8: 3 / 6, 1.0: 2 / 6, 1.5: 2 / 6, 2.0: 1 / 6}
    assert fast_p(RESULTS, [0.5, 3.0]) == {0.5: 4 / 6, 3.0: 0.0}
    assert fast_p([]) == {p: 0.0 for p in (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)}
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
    assert suite["fast_p"] == {"0": 1 / 3, "0.5": 1 / 3, "0.8": 1 / 3, "1": 1 / 3, "1.5": 1 / 3, "2": 0.0}
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
    # a suite's own statistic, when the summary carries it, goes beside kfray's
    summary["tasks"]["a"]["suite"] = {"name": "KernelBench", "speedup": 0.9}
    rows = task_rows(summary)
    suite = suite_summary(rows)
    assert suite["fast_p_suite"]["0.8"] == pytest.approx(1 / 2) and suite["fast_p_suite"]["1"] == 0.0
    assert suite["fast_p"]["1"] == pytest.approx(1 / 2)                    # kfray's way: 2.0x
    md = markdown(rows, suite)
    assert "KernelBench's way" in md and "kfray's way" in md and "| fast_1 | 0.000 | 0.500 |" in md


def test_a_large_sweep_gets_fewer_islands_per_task_never_none():
    from kfray.sweep import islands_per_task
    assert islands_per_task(4, 3, 32) == 4          # a few tasks: as configured
    assert islands_per_task(4, 10, 32) == 3         # 30 actors, not 40
    assert islands_per_task(4, 200, 32) == 1        # the whole suite: one island each, never zero


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
    # in the suite's own form every problem runs, from its reference module as a ModelNew seed
    refs, skipped = plan(str(DATA / "kernelbench"), 1, None, "suite", offline=True)
    assert len(refs) == 5 and not skipped
    assert "class ModelNew(Model)" in load_task(refs[0]).seeds_for("suite")[0].source


def test_tasks_command_lists_loads_and_errors(capsys):
    pytest.importorskip("torch")                  # robust-kbench tasks need PyTorch to load
    assert cmd_tasks(Namespace(path=str(DATA / "rkb"), level=None)) == 1          # some cannot load
    out = capsys.readouterr().out
    assert "cannot load" in out and "not valid JSON" in out and "linear_tanh" in out
    assert cmd_tasks(Namespace(path=None, level=None)) == 0
    out = capsys.readouterr().out
    assert "axpb" in out and "matmul" in out


@pytest.mark.slow
def test_sweep_of_three_packages_on_two_evaluators(ray_local, tmp_path, tmp_cache):
    from kfray.config import load_config

    cfg = load_config(None, ["search.retime_top=0", "search.islands=2", "search.budget=6", "eval.evaluators=2", "eval.backend=cpu",
                             "search.migrate_every=1", "eval.tune_budget=0", f"eval.cache_dir={tmp_cache}"])
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
    for p in (0, 1, 1.5, 2):         # fast_0 is the fraction correct: a flagged speedup counts 0 but stays correct
        assert suite["fast_p"][f"{p:g}"] == pytest.approx(sum(1 for v in sp.values() if p <= 0 or v > p) / 3)
    assert suite["fast_p"]["0"] == pytest.approx(2 / 3)
    pos = [v for v in sp.values() if v > 0]      # the geomean is over correct kernels with a speedup that counts
    assert suite["geomean_speedup"] == pytest.approx(math.exp(sum(map(math.log, pos)) / len(pos)) if pos else 0.0)
    run = tmp_path / "sweep"
    saved = json.loads((run / "sweep.json").read_text())
    assert saved["suite"] == json.loads(json.dumps(suite))
    assert "| fast_1.5 |" in (run / "sweep.md").read_text()
    assert (run / "sweep_tasks.csv").is_file() and (run / "summary.json").is_file()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_sweep_of_two_robust_kbench_tasks_in_the_suites_form_on_two_evaluators(ray_local, tmp_path, suite_cache):
    pytest.importorskip("torch")
    from kfray.config import load_config
    from kfray.verify import verify

    # one kernel a task, its first seed (the published forward.cpp / backward.cpp): a torch
    # extension is ~17 CPU-s of g++, and what is checked here is the sweep's figures and files
    cfg = load_config(None, ["search.retime_top=0", "search.islands=1", "search.budget=1", "eval.evaluators=2", "eval.timeout_s=120",
                             "eval.backend=torch_ext_cpu", "eval.suite_perf_trials=10", f"eval.cache_dir={suite_cache}"])
    refs, skipped = plan(str(DATA / "rkb_form"), None, None, "suite", offline=True)
    assert sorted(r.rsplit("/", 1)[-1] for r in refs) == ["linear_relu", "linear_relu#backward"] and not skipped
    s = run_sweep(cfg, refs, tmp_path / "sweep", skipped, progress=False, budget_total=2)
    rows = s["sweep"]["rows"]
    assert all(r["correct"] and r["suite"] == "robust-kbench" for r in rows), rows
    for r in rows:      # robust-kbench's figure: its mean of the reference's means over the kernel's
        fig = s["tasks"][r["task"]]["suite"]
        assert fig["avg_mean_ms"] > 0 and fig["ref_avg_mean_ms"] > 0, fig
        assert r["suite_speedup"] == pytest.approx(fig["ref_avg_mean_ms"] / fig["avg_mean_ms"], rel=1e-6), (r, fig)
    suite = s["sweep"]["suite"]
    assert suite["fast_p_suite"]["0"] == 1.0 and suite["fast_p"]["0"] == 1.0
    assert "robust-kbench's way" in (tmp_path / "sweep" / "sweep.md").read_text()
    best = sorted((tmp_path / "sweep" / "best").glob("*.cpp"))
    assert len(best) == 2
    for ref in refs:                           # each best kernel is a file the suite's form takes as it is
        f = next(b for b in best if b.stem.endswith("backward") == ref.endswith("#backward"))
        # (the sweep's compile cache: a best file that is the kernel the sweep built is not built twice)
        res, _ = verify(ref, str(f), None, ["eval.suite_perf_trials=5", f"eval.cache_dir={suite_cache}"])
        assert res.correct and res.facts["suite"]["name"] == "robust-kbench", res.reason


def test_torch_compile_column_and_its_reasons_in_every_output(tmp_path):
    summary = {"tasks": {
        "a": {"correct": True, "best_speedup_vs_reference": 2.0, "best_speedup_vs_compile": 0.5},
        "b": {"correct": True, "best_speedup_vs_reference": 1.5,
              "compile_note": "torch.compile failed: InductorError: no C++ compiler"},
        "c": {"correct": False}}}
    rows = task_rows(summary)
    suite = suite_summary(rows)
    assert suite["fast_p_compile"] == {"0": pytest.approx(2 / 3), "0.5": 0.0, "0.8": 0.0, "1": 0.0, "1.5": 0.0,
                                       "2": 0.0}
    budget = {"evaluations": 12, "evaluation_budget": 30, "tokens": 900, "token_budget": 800, "cost": 0.0,
              "cost_budget": 0.0, "llm_calls": 3, "stopped_by": "token budget"}
    files = write_results(rows, suite, tmp_path, "t", budget)
    with open(files["tasks_csv"]) as f:
        got = {r["task"]: r for r in csv.DictReader(f)}
    assert got["a"]["speedup_compile"] == "0.5000" and got["b"]["speedup_compile"] == ""
    assert "no C++ compiler" in got["b"]["compile_note"]
    md = Path(files["markdown"]).read_text()
    assert "| a | ok | yes | 2.00x | 0.50x |" in md and "| b | ok | yes | 1.50x | n/a |" in md
    assert "- b: torch.compile failed: InductorError: no C++ compiler" in md
    assert "900 LLM tokens of 800" in md and "stopped: token budget spent" in md
    saved = json.loads(Path(files["json"]).read_text())
    assert saved["tasks"][1]["compile_note"].startswith("torch.compile failed") and saved["budget"] == budget


def test_compiled_reference_failures_are_reasons_not_crashes(monkeypatch):
    torch = pytest.importorskip("torch")
    import numpy as np

    from kfray.eval import torch_compile as tc
    from kfray.tasks import load_task

    class Cpu:
        name = "cpu"

    task = load_task(f"kernelbench:{DATA / 'kernelbench' / 'level1' / '1_Relu.py'}")
    hosts = [task.make_args("default", np.random.default_rng(i)) for i in range(2)]

    def no_compiler(*a, **k):
        raise RuntimeError("InductorError: C++ compiler not found\ndetails")

    monkeypatch.setattr(torch, "compile", no_compiler)
    monkeypatch.setattr(tc, "_TIMES", {})
    t, why = tc.compiled_reference_time(Cpu(), task, "default", hosts, {})
    assert t is None and why == "torch.compile failed: RuntimeError: InductorError: C++ compiler not found"
    assert tc.compiled_reference_time(Cpu(), load_task("axpb"), "small", hosts, {}) == (
        None, "the reference is not PyTorch")
    facts = tc.compile_facts({"default": (t, why)})
    assert tc.speedup_vs_compile({"times": {"default": 1e-3}, "facts": {"torch_compile": facts}}) == (None, why)
    ok = {"times": {"a": 1e-3, "b": 4e-3}, "facts": {"torch_compile": {"times": {"a": 2e-3, "b": 2e-3}}}}
    assert tc.speedup_vs_compile(ok)[0] == pytest.approx(1.0)          # geomean of 2x and 0.5x


def test_sweep_shares_one_token_budget_and_reports_both_baselines(ray_local, tmp_path, tmp_cache):
    """Two PyTorch tasks, one LLM budget: a scripted OpenAI-compatible server answers every call with
    the same correct kernel and `usage` token counts; once the tokens are spent every task stops,
    and the table is written with speedups over eager PyTorch and over torch.compile."""
    import shutil
    import sys
    import threading

    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).parent))
    from llm_server import ScriptedServer

    from kfray.config import load_config

    level = tmp_path / "kb" / "level1"
    level.mkdir(parents=True)
    for name in ("1_Relu.py", "2_Relu_again.py"):       # one signature: one scripted kernel fits both
        shutil.copy(DATA / "kernelbench" / "level1" / "1_Relu.py", level / name)
    relu = ("```cpp\n#include <cstdint>\nextern \"C\" int kf_forward(const float* x, float* out, int64_t batch, "
            "int64_t features) {\n    for (int64_t i = 0; i < batch * features; ++i) out[i] = x[i] > 0.f ? x[i] : 0.f;"
            "\n    return 0;\n}\n```")
    with ScriptedServer([relu]) as srv:
        cfg = load_config(None, ["search.retime_top=0", "search.islands=1", "search.budget=30", "search.batch=1", "eval.evaluators=1",
                                 "eval.tune_budget=0", "eval.trials=1", f"eval.cache_dir={tmp_cache}",
                                 "eval.torch_compile=true", "proposer.kind=llm", f"proposer.base_url={srv.base_url}",
                                 "proposer.model=scripted", "proposer.api_key_env=KFRAY_TEST_NO_KEY",
                                 "proposer.max_retries=0"])
        refs, skipped = plan(str(tmp_path / "kb"), 1, None, "cpp", offline=False)
        assert len(refs) == 2 and not skipped
        out = {}
        t = threading.Thread(target=lambda: out.update(run_sweep(cfg, refs, tmp_path / "sweep", skipped,
                                                                 progress=False, budget_tokens=3000)))
        t.start()
        t.join(300)
        assert not t.is_alive(), "the sweep must end once the shared token budget is spent"
        calls = len(srv.requests)
    sw = out["sweep"]
    b = sw["budget"]
    assert b["stopped_by"] == "token budget" and b["tokens"] >= 3000 and b["token_budget"] == 3000
    assert b["llm_calls"] == calls and b["evaluations"] < b["evaluation_budget"] == 60
    assert calls < 30                         # far fewer calls than the evaluation budget would allow
    rows = {Path(r["task"].split(":", 1)[1]).stem: r for r in sw["rows"]}
    assert set(rows) == {"1_Relu", "2_Relu_again"}
    db = sqlite3.connect(tmp_path / "sweep" / "kfray.db")
    for r in rows.values():
        assert r["correct"], r
        # over torch.compile: the best, over the task's correct kernels, of the geometric mean of
        # the compiled reference's time over the kernel's, as the run's database has them
        got = []
        for times, facts in db.execute("SELECT times, facts FROM candidates WHERE tier = 5 AND task = ?", (r["task"],)):
            times, comp = json.loads(times), json.loads(facts)["torch_compile"]["times"]
            assert times and all(comp[k] > 0 and t > 0 for k, t in times.items()), (times, comp)
            got.append(math.exp(sum(math.log(comp[k] / t) for k, t in times.items()) / len(times)))
        assert got and r["speedup_compile"] == pytest.approx(max(got), rel=1e-3), (r, got)
    md = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "speedup vs torch.compile" in md and "stopped: token budget spent" in md
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["budget"]["stopped_by"] == "token budget"


def test_a_task_that_runs_out_of_new_kernels_leaves_its_budget_to_the_others(ray_local, tmp_path, tmp_cache):
    """One evaluation budget for the suite: a task whose islands can only repeat what was
    evaluated stops early, and the evaluations it leaves go to the tasks that can use them. The budget
    is the engine's, so the evaluations run on the `sim` backend (a fixed time each, no compiler)."""
    import shutil

    from kfray.config import load_config

    fixed = tmp_path / "pkgs" / "fixed"
    shutil.copytree(DATA / "packages" / "vscale", fixed)
    (fixed / "task.yaml").write_text((fixed / "task.yaml").read_text().replace("name: vscale", "name: fixed"))
    (fixed / "seeds" / "cpp_simd.cpp").unlink()
    # one seed, no parameters, no loop the offline proposer can edit: nothing new to propose
    (fixed / "seeds" / "cpp_naive.cpp").write_text(
        '#include <cstdint>\n#include <cstring>\nextern "C" int kf_forward(const float* x, float* y, float alpha, '
        'int64_t n) {\n    std::memcpy(y, x, n * sizeof(float));\n    return alpha == 1.0f ? 0 : 0;\n}\n')
    shutil.copytree(DATA / "packages" / "vscale", tmp_path / "pkgs" / "vscale")
    cfg = load_config(None, ["search.retime_top=0", "search.islands=2", "eval.evaluators=2", "eval.backend=sim",
                             "eval.simulate_s=0.3", "eval.tune_budget=0", f"eval.cache_dir={tmp_cache}"])
    refs, skipped = plan(str(tmp_path / "pkgs"), None, None, "cpp", offline=True)
    assert len(refs) == 2 and not skipped
    s = run_sweep(cfg, refs, tmp_path / "sweep", skipped, progress=False, budget_total=16)
    per = {Path(r["task"].split(":", 1)[1]).name: r["evaluated"] for r in s["sweep"]["rows"]}
    assert per["fixed"] < 8, per                         # it had nothing more to evaluate
    assert per["vscale"] > 8, per                        # and its share went to vscale
    assert per["fixed"] + per["vscale"] <= 16, per       # never more than the suite's budget


def test_a_sweep_of_suite_tasks_searches_in_the_suites_form_unless_told_otherwise(capsys):
    """With no backend asked for, a sweep of robust-kbench or KernelBench tasks writes kernels the
    suite's harness takes (its PyTorch-extension form); kfray's own tasks keep kfray's form."""
    pytest.importorskip("torch")
    from kfray.config import load_config
    from kfray.sweep.cli import suite_form_default

    cfg = load_config(None, [])
    refs, skipped = plan(str(DATA / "rkb_form"), None, None, "cpp", offline=True)
    assert suite_form_default(cfg, refs, skipped)
    assert cfg.eval.backend == "torch_ext_cpu"                 # this machine has no GPU for PyTorch
    assert "eval.backend=torch_ext_cpu" in capsys.readouterr().err
    assert not suite_form_default(cfg, refs, skipped)          # asked once, nothing more to change
    cfg = load_config(None, [])
    packages, none_skipped = plan(str(DATA / "packages"), None, None, "cpp", offline=True)
    assert not suite_form_default(cfg, packages, none_skipped) and cfg.eval.backend == "cpu"
