"""Profiler feedback: ncu's CSV read into a candidate's facts (occupancy, DRAM and SM share of
peak, main stalls), shown in the prompt of a profiled parent; best effort where ncu is missing."""
from __future__ import annotations

import shutil

import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.eval.backends.cuda.profile import METRICS, find_ncu, ncu_command, parse_ncu_csv, profile_artifact
from kfray.eval.profile_facts import profile_text
from kfray.proposers.base import Elite, ProposalContext
from kfray.tasks import load_task

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def _rows(launch: int, kernel: str, values: dict) -> str:
    return "".join(f'"{launch}","4242","python3","127.0.0.1","{kernel}","1","13","(256, 1, 1)","(8192, 1, 1)",'
                   f'"0","9.0","Command line profiler metrics","{METRICS[k]}","{u}","{v}"\n'
                   for k, (u, v) in values.items())


# ncu 2025.3 --csv page, shape as it prints it: a banner line, then one row per launch and metric
SAMPLE = ("==PROF== Connected to process 4242 (/usr/bin/python3.12)\n==PROF== Profiling \"k\": 0%....50%....100%\n"
          + HEAD
          + _rows(0, "void softmax_rowcache_kernel<256, 256>(const float *, float *, long, long)", {
              "duration_ns": ("usecond", "74.53"), "achieved_occupancy_pct": ("%", "87.41"),
              "dram_throughput_pct": ("%", "91.2"), "sm_throughput_pct": ("%", "38.05"),
              "stall_long_scoreboard": ("", "9.81"), "stall_barrier": ("", "1.22"), "stall_wait": ("", "0.93"),
              "stall_math_pipe_throttle": ("", "0.11"), "stall_not_selected": ("", "0")})
          + _rows(1, "tiny_helper(float *)", {"duration_ns": ("nsecond", "1,536"), "achieved_occupancy_pct": ("%", "12")}))


def test_csv_gives_the_main_kernels_facts_and_top_stalls():
    f = parse_ncu_csv(SAMPLE)
    assert f["kernel"].startswith("void softmax_rowcache_kernel")       # the longest launch, not the helper
    assert f["duration_ns"] == pytest.approx(74530.0)
    assert (f["achieved_occupancy_pct"], f["dram_throughput_pct"], f["sm_throughput_pct"]) == (87.41, 91.2, 38.05)
    assert [s["reason"] for s in f["main_stalls"]] == ["long_scoreboard", "barrier", "wait"]
    assert f["launches"] == 2
    text = profile_text({**f, "shape": "r8192c4096"})
    assert "achieved occupancy 87%" in text and "DRAM throughput 91% of peak" in text
    assert "long_scoreboard (9.8)" in text and "r8192c4096" in text


def test_thousands_separators_and_units():
    f = parse_ncu_csv(HEAD + _rows(3, "k", {"duration_ns": ("msecond", "1,234.5")}))
    assert f["duration_ns"] == pytest.approx(1.2345e9)


def test_no_metrics_is_an_error_fact_not_an_exception():
    assert "error" in parse_ncu_csv("==ERROR== Failed to initialize the profiler: LibraryNotLoaded\n")
    assert "error" in parse_ncu_csv(HEAD + '"0","1","p","h","k","1","1","(1,1,1)","(1,1,1)","0","9.0","s","other","","1"\n')
    assert profile_text({"error": "ncu is not on PATH"}) == "no profile (ncu is not on PATH)"


def test_without_ncu_profiling_says_why(monkeypatch):
    import kfray.eval.backends.cuda.profile as prof
    monkeypatch.setattr(prof, "find_ncu", lambda: None)
    assert profile_artifact("/tmp/x.so", "softmax@gpu", "r8192c4096") == {"error": "ncu is not on PATH"}


def test_command_leaves_clocks_alone_and_profiles_only_the_call():
    cmd = ncu_command("/k.so", "softmax@gpu", "r8192c4096")
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert METRICS["dram_throughput_pct"] in cmd[cmd.index("--metrics") + 1]
    assert cmd[-4:] == ["profile", "/k.so", "softmax@gpu", "r8192c4096"]


def test_a_profiled_parent_shows_its_profile_in_the_prompt():
    from kfray.prompts.builder import user_message

    task = load_task("softmax")
    seed = task.seeds_for("cuda")[0]
    c = Candidate(task="softmax", language="cuda", source=seed.source, params={"BLOCK": 128})
    r = EvalResult(candidate_id=c.id, tier=5, times={"s": 1.0}, ref_times={"s": 2.0},
                   facts={"profile": {**parse_ncu_csv(SAMPLE), "shape": "r8192c4096"}})
    ctx = ProposalContext(task=task, language="cuda", parent=Elite(c, r), inspirations=[], target_cell=None,
                          meta_prompt=None, device_facts={}, island=0, generation=1)
    msg = user_message(ctx)
    assert "Profiler (Nsight Compute) on the parent" in msg and "achieved occupancy 87%" in msg
    bare = ProposalContext(task=task, language="cuda", parent=Elite(c, EvalResult(candidate_id=c.id, tier=5)),
                           inspirations=[], target_cell=None, meta_prompt=None, device_facts={}, island=0,
                           generation=1)
    assert "Nsight Compute" not in user_message(bare)


@pytest.mark.gpu
@pytest.mark.skipif(find_ncu() is None or shutil.which("nvcc") is None, reason="needs ncu and nvcc")
def test_profile_a_seed_on_the_gpu(tmp_path):
    from kfray.config import EvalConfig
    from kfray.eval.evaluator import Evaluator

    task = load_task("axpb@gpu")
    seed = next(s for s in task.seeds_for("cuda") if s.name == "vec4")
    c = Candidate(task="axpb@gpu", language="cuda", source=seed.source, params={"BLOCK": 256, "BLOCKS_PER_SM": 8})
    ev = Evaluator("cuda", EvalConfig(backend="cuda", cache_dir=str(tmp_path)))
    try:
        f = ev.profile(c.to_dict(), "axpb@gpu")
    finally:
        ev.shutdown()
    assert "error" not in f, f
    assert 0 < f["achieved_occupancy_pct"] <= 100 and f["dram_throughput_pct"] > 20, f
