"""The CLI as a user meets it: the default run, and clear errors for bad input."""
from __future__ import annotations

import json
import sqlite3

import pytest

from kfray.cli import main


@pytest.mark.slow
def test_default_run_through_the_cli(session_run, capsys):
    """`kfray run` as a new user types it: the session's default run (conftest.py's `session_run`,
    through the CLI, on a smaller budget; the full default run is timed in
    scripts/bench_cpu_default.py)."""
    run_dir, s = session_run["run_dir"], session_run["summary"]
    out = session_run["out"]
    assert "best vs seed" in out and "matmul" in out
    assert set(s["tasks"]) == {"axpb", "softmax", "matmul"}
    assert all(t["correct"] for t in s["tasks"].values())
    assert max(t["best_speedup_vs_seed"] for t in s["tasks"].values()) >= 1.5
    assert s["migrations"] >= 1 and s["prompt_generations"] >= 2 and s["islands"] == 6
    db = sqlite3.connect(run_dir / "kfray.db")
    states = [json.loads(state) for (state,) in db.execute("SELECT state FROM islands")]
    assert len(states) == s["islands"] == 6, "one stored state per island"
    assert all(len(state["archive"]["elites"]) >= 2 for state in states)
    assert main(["status", str(run_dir)]) == 0
    assert "prompt generations" in capsys.readouterr().out


def test_unknown_config_key_is_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("search:\n  islandz: 3\n")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'search.islandz'" in err and str(bad) in err and "Traceback" not in err


def test_unknown_task_is_one_clear_line(capsys):
    assert main(["run", "--task", "nosuchtask"]) == 2
    assert "no built-in task named 'nosuchtask'" in capsys.readouterr().err


def test_tasks_lists_the_builtins(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "axpb" in out and "softmax" in out and "matmul" in out


def test_verify_runs_a_kernel_at_its_own_declared_parameter_values(tmp_path, capsys):
    """A kf_forward file that declares @kf.param tunables verifies at their first values, as the
    search starts it, and says which (before, every such file failed to compile)."""
    from kfray.tasks import load_task

    seed = next(s for s in load_task("softmax").seeds_for("cpp") if s.name == "fused")
    kernel = tmp_path / "softmax_fused.cpp"
    kernel.write_text(seed.source)
    assert main(["verify", "builtin:softmax", str(kernel), "--set", "eval.repeats=3",
                 "--set", "eval.min_time_s=0.005", "--set", f"eval.cache_dir={tmp_path / 'cache'}"]) == 0
    out = capsys.readouterr().out
    assert "params    CH=1024, ROWS_PER_TASK=4" in out and "correct (tier 5)" in out, out


def test_the_default_run_is_time_boxed_unless_a_config_or_a_setting_says_otherwise(tmp_path):
    """`kfray run` alone proposes for DEFAULT_RUN_SECONDS (the README's "about 80 s" in all); a
    config file, an LLM proposer or an explicit search.time_limit_s keep their own limits."""
    from kfray.cli import DEFAULT_RUN_SECONDS, limit_default_run
    from kfray.config import load_config

    plain = load_config(None, [])
    limit_default_run(plain, None)
    assert plain.search.time_limit_s == DEFAULT_RUN_SECONDS
    unlimited = load_config(None, ["search.time_limit_s=0"])
    limit_default_run(unlimited, None)
    assert unlimited.search.time_limit_s == 0
    llm = load_config(None, ["proposer.kind=llm"])
    limit_default_run(llm, None)
    assert llm.search.time_limit_s == 0
    f = tmp_path / "own.yaml"
    f.write_text("search:\n  budget: 100\n")
    own = load_config(str(f), [])
    limit_default_run(own, str(f))
    assert own.search.time_limit_s == 0 and own.search.budget == 100
