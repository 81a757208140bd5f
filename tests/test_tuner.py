"""The inner template tuner: budgeted search over @kf.param settings, inside an evaluation."""
from __future__ import annotations

import random

import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.config import EvalConfig, SearchConfig
from kfray.proposers.base import Elite, ProposalContext
from kfray.proposers.offline import OfflineProposer
from kfray.prompts.builder import user_message
from kfray.search.island import Island
from kfray.eval.tuner import setting_key, tune
from kfray.source import parse_params
from kfray.tasks import load_task

SPACE_SRC = """
// @kf.param BM in [8, 16, 32, 64]
// @kf.param BN in [8, 16, 32, 64]
// @kf.param U in [1, 2, 4]
// @kf.require BM * BN <= 1024
"""


def _fake(speed_of):
    calls = []

    def evaluate_setting(p):
        calls.append(dict(p))
        s = speed_of(p)
        if s is None:
            return EvalResult(candidate_id="x", tier=4, reason="wrong values")
        return EvalResult(candidate_id="x", tier=5, times={"s": 1.0}, ref_times={"s": s})
    return evaluate_setting, calls


def test_small_space_is_exhaustive():
    space = parse_params("// @kf.param B in [1, 2, 4]\n// @kf.param C in [1, 2]\n// @kf.require B * C <= 4")
    assert len(list(space.settings())) == 5
    ev, calls = _fake(lambda p: p["B"] * 0.5 + p["C"])
    out = tune(space, {"B": 1, "C": 1}, ev, budget=8, rng=random.Random(0))
    assert out.exhaustive and len(calls) == 5 and calls[0] == {"B": 1, "C": 1}
    assert all(space.allows(p) for p in calls)
    assert out.best_params == {"B": 2, "C": 2} and out.best.speedup == pytest.approx(3.0)


def test_large_space_respects_budget_and_requires_and_climbs():
    space = parse_params(SPACE_SRC)
    assert space.size() == 48 and len(list(space.settings())) < 48

    def speed(p):      # unimodal, best at BM=32, BN=16, U=2
        return 20.0 - abs(p["BM"] - 32) / 8 - abs(p["BN"] - 16) / 8 - abs(p["U"] - 2)

    for seed in range(5):
        ev, calls = _fake(speed)
        out = tune(space, {"BM": 8, "BN": 8, "U": 1}, ev, budget=6, rng=random.Random(seed))
        assert len(calls) == 6 and not out.exhaustive
        assert all(space.allows(p) for p in calls) and len({setting_key(p) for p in calls}) == 6
        assert out.best.speedup > speed({"BM": 8, "BN": 8, "U": 1})       # coordinate search moved uphill
    ev, calls = _fake(speed)
    out = tune(space, {"BM": 8, "BN": 8, "U": 1}, ev, budget=40, rng=random.Random(1))
    assert out.best_params == {"BM": 32, "BN": 16, "U": 2}


def test_cached_settings_count_and_are_not_measured_again():
    space = parse_params(SPACE_SRC)
    ev, calls = _fake(lambda p: p["U"])
    first = tune(space, {"BM": 8, "BN": 8, "U": 1}, ev, budget=3, rng=random.Random(0))
    assert len(calls) == 3
    calls.clear()
    # the budget is per source: a second candidate measures only its own new setting
    again = tune(space, {"BM": 64, "BN": 16, "U": 4}, ev, budget=3, rng=random.Random(0), tried=first.results)
    assert calls == [{"BM": 64, "BN": 16, "U": 4}] and again.new_evaluations == 1
    assert again.best_params == {"BM": 64, "BN": 16, "U": 4} and len(again.results) == 4
    calls.clear()
    tune(space, {"BM": 64, "BN": 16, "U": 4}, ev, budget=3, rng=random.Random(0), tried=again.results)
    assert calls == []


def test_broken_source_is_not_tuned():
    space = parse_params(SPACE_SRC)
    calls = []

    def compile_error(p):
        calls.append(p)
        return EvalResult(candidate_id="x", tier=1, reason="error: expected ';'")

    out = tune(space, {"BM": 8, "BN": 8, "U": 1}, compile_error, budget=6, rng=random.Random(0))
    assert len(calls) == 1 and out.best.tier == 1


def test_wrong_settings_lose_to_correct_ones():
    space = parse_params("// @kf.param B in [1, 2, 4, 8]")
    ev, _ = _fake(lambda p: None if p["B"] == 8 else float(p["B"]))
    out = tune(space, {"B": 8}, ev, budget=4, rng=random.Random(0))
    assert out.best_params == {"B": 4} and out.best.correct


def test_evaluator_tunes_on_its_device_and_caches(tmp_cache):
    from kfray.eval.evaluator import Evaluator

    task = load_task("softmax")
    seed = next(s for s in task.seeds_for("cpp") if s.name == "naive")      # ROW_STEP in [1, 2, 4, 8]
    ev = Evaluator("cpu", EvalConfig(tune_budget=4, trials=1, repeats=3, min_time_s=0.0,
                                     cache_dir=str(tmp_cache)))
    try:
        c = Candidate(task="softmax", language="cpp", source=seed.source, params={"ROW_STEP": 2})
        r = EvalResult.from_dict(ev.evaluate(c, "builtin:softmax"))
        assert r.correct and r.candidate_id == c.id
        tuning = r.facts["tuning"]
        assert sorted(t["params"]["ROW_STEP"] for t in tuning) == [1, 2, 4, 8]
        assert r.facts["tuning_evaluations"] == 4 and r.facts["tuning_settings"] == 4
        best = max(tuning, key=lambda t: t["speedup"])
        assert r.facts["tuned_params"] == best["params"]
        assert r.speedup == pytest.approx(best["speedup"], rel=1e-3)
        assert [t["speedup"] for t in tuning] == sorted((t["speedup"] for t in tuning), reverse=True)
        # same source, another setting: everything is cached, nothing is measured again
        c2 = Candidate(task="softmax", language="cpp", source=seed.source + "\n// a comment\n",
                       params={"ROW_STEP": 8})
        r2 = EvalResult.from_dict(ev.evaluate(c2, "builtin:softmax"))
        assert r2.facts["tuning_evaluations"] == 0 and r2.facts["tuned_params"] == r.facts["tuned_params"]
        assert r2.candidate_id == c2.id
        # a source without tunables is evaluated once, as before
        plain = "#include <cstdint>\n" + seed.source.replace("// @kf.param ROW_STEP in [1, 2, 4, 8]", "#define ROW_STEP 1")
        r3 = EvalResult.from_dict(ev.evaluate(Candidate(task="softmax", language="cpp", source=plain),
                                              "builtin:softmax"))
        assert r3.correct and "tuning" not in r3.facts
        # tuning off
        ev.cfg.tune_budget = 0
        c4 = Candidate(task="softmax", language="cpp", source=seed.source + "\n// other\n", params={"ROW_STEP": 1})
        assert "tuning" not in ev.evaluate(c4, "builtin:softmax")["facts"]
    finally:
        ev.shutdown()


def test_island_adopts_tuned_params_and_prompt_shows_tuning():
    task = load_task("axpb")
    seed = task.seeds_for("cpp")[0]
    isl = Island(0, "axpb", "cpp", SearchConfig(), OfflineProposer())
    c = isl.describe(Candidate(task="axpb", language="cpp", source=seed.source, params={"UNROLL": 1}))
    res = EvalResult(candidate_id=c.id, tier=5, times={"n1M": 1.0}, ref_times={"n1M": 2.0},
                     facts={"tuned_params": {"UNROLL": 4},
                            "tuning": [{"params": {"UNROLL": 4}, "tier": 5, "speedup": 2.0},
                                       {"params": {"UNROLL": 1}, "tier": 5, "speedup": 1.5},
                                       {"params": {"UNROLL": 16}, "tier": 4, "speedup": 0.0}]})
    isl.seed([(c, res)])
    elite = isl.archive.get(c.cell)
    assert elite.candidate.params == {"UNROLL": 4}
    ctx = ProposalContext(task=task, language="cpp", parent=Elite(elite.candidate, res), inspirations=[],
                          target_cell=None, meta_prompt=None, device_facts={}, island=0, generation=1)
    text = user_message(ctx)
    assert "Parameter settings measured for the parent" in text
    assert "- UNROLL=4: 2.000x" in text and "- UNROLL=16: failed (tier 4)" in text
    # ingest reports the adopted params so the coordinator can store them
    kid = isl.propose(1)[0]
    kid.params = {"UNROLL": 2}          # evaluated at 2, the tuner found 8 better
    rec = isl.ingest([(kid, EvalResult(candidate_id=kid.id, tier=5, times={"n1M": 1.0}, ref_times={"n1M": 1.0},
                                       facts={"tuned_params": {"UNROLL": 8}}))])[0]
    assert rec["params"] == {"UNROLL": 8} and kid.params == {"UNROLL": 8}
