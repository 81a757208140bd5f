"""Choosing among several LLMs: weights, the UCB bandit, token/cost accounting, and the budget stop."""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.config import ProposerConfig, SearchConfig, load_config
from kfray.errors import ConfigError
from kfray.proposers.base import Elite, ProposalContext
from kfray.proposers.llm import LLMProposer
from kfray.proposers.models import (Ledger, ModelSpec, choose_model, over_budget, parse_models, reward,
                                    totals, ucb_scores)
from kfray.search.island import Island
from kfray.source import parse_params
from kfray.tasks import load_task
from llm_server import ScriptedServer

SPECS = [ModelSpec("big", 1.0, 0.003, 0.015), ModelSpec("small", 3.0, 0.0002, 0.0006)]


class PerModelServer(ScriptedServer):
    """Answers by the requested model's name (one server, several model names)."""

    def __init__(self, by_model: dict[str, str]):
        super().__init__(["unused"])
        self.by_model = by_model

    def _take(self, body: dict):
        with self._lock:
            self.requests.append(body)
            return self.by_model[body["model"]]


def _good_answer(task) -> str:
    src = task.seeds_for("cpp")[1].source
    return f"Faster:\n```cpp\n{src}\n```"


def _ctx(task):
    seed = task.seeds_for("cpp")[0]
    parent = Candidate(task=task.name, language="cpp", source=seed.source, params=parse_params(seed.source).default(),
                       cell=(0, 0, 0))
    res = EvalResult(candidate_id=parent.id, tier=5, times={"s": 1.0}, ref_times={"s": 1.0})
    return ProposalContext(task=task, language="cpp", parent=Elite(parent, res), inspirations=[], target_cell=None,
                           meta_prompt=None, device_facts={}, island=0, generation=1)


def _cfg(srv, **kw) -> ProposerConfig:
    return ProposerConfig(kind="llm", base_url=srv.base_url, api_key_env="KFRAY_TEST_NO_KEY", timeout_s=10,
                          max_retries=0, backoff_s=0.01, **kw)


def test_parse_models_checks_entries():
    cfg = ProposerConfig(models=[{"model": "a", "weight": 2, "cost_per_1k_input": 1},
                                 {"model": "b", "base_url": "http://x/v1"}, "c"])
    specs = parse_models(cfg)
    assert [s.model for s in specs] == ["a", "b", "c"] and specs[0].weight == 2.0 and specs[1].base_url
    for bad, msg in [([{"weight": 1}], "model is required"), ([{"model": "a", "colour": 1}], "unknown key"),
                     ([{"model": "a", "weight": -1}], ">= 0"), ([{"model": "a"}, {"model": "a"}], "once"),
                     ([{"model": "a", "weight": "x"}], "must be float"), ([3], "mapping")]:
        with pytest.raises(ConfigError, match=msg):
            parse_models(ProposerConfig(models=bad))


def test_weights_without_bandit():
    rng = random.Random(0)
    counts = Counter(choose_model(SPECS, {}, rng).model for _ in range(2000))
    assert 0.65 < counts["small"] / 2000 < 0.85


def test_ucb_shifts_to_the_model_that_improves():
    led = Ledger()
    rng = random.Random(1)
    picks = []
    for _ in range(60):
        m = choose_model(SPECS, led.snapshot(), rng, bandit=True, c=0.5).model
        picks.append(m)
        led.reward(m, reward(0.8 if m == "big" else -2.0))
    assert picks[:2] != [picks[0]] * 2 or len(set(picks[:4])) == 2     # both tried early
    assert Counter(picks[-30:])["big"] >= 25
    scores = ucb_scores(SPECS, led.snapshot(), c=0.5)
    assert scores["big"] > scores["small"]


def test_cost_term_breaks_ties_towards_the_cheaper_model():
    led = Ledger()
    for m in ("big", "small"):
        for _ in range(20):
            led.reward(m, 0.7)
    s = ucb_scores(SPECS, led.snapshot(), c=0.5, cost_weight=0.2)
    assert s["small"] > s["big"]
    assert choose_model(SPECS, led.snapshot(), random.Random(0), True, 0.5, 0.2).model == "small"


def test_ledger_budget_and_floor():
    led = Ledger()
    led.charge("big", 1000, 500, SPECS[0].cost(1000, 500))
    led.charge("small", 2000, 100, SPECS[1].cost(2000, 100))
    led.charge("small", 0, 0, 0.0, failed=True)
    t = totals(led.snapshot())
    assert t["calls"] == 2 and t["tokens"] == 3600 and t["failures"] == 1
    assert t["cost"] == pytest.approx(0.003 + 0.0075 + 0.0004 + 0.00006)
    assert over_budget(led.snapshot(), max_cost=0.01) and not over_budget(led.snapshot(), max_cost=0.1)
    assert over_budget(led.snapshot(), token_budget=3600) and not over_budget(led.snapshot())
    fresh = Ledger(led.snapshot())                 # a restarted ledger re-seeded from a snapshot
    assert fresh.snapshot() == led.snapshot()


def test_bandit_shifts_calls_to_the_model_whose_answers_improve():
    task = load_task("softmax")
    with PerModelServer({"coder-good": _good_answer(task), "coder-bad": "Sorry, I cannot help."}) as srv:
        p = LLMProposer(_cfg(srv, bandit=True, bandit_c=0.3, models=[
            {"model": "coder-good", "cost_per_1k_input": 0.01, "cost_per_1k_output": 0.03},
            {"model": "coder-bad", "weight": 3, "cost_per_1k_input": 0.001}]))
        rng = np.random.default_rng(0)
        for _ in range(30):
            c = p.propose(_ctx(task), rng)
            improvement = 0.5 if c.source else -6.0        # no code: tier 0, far below the parent
            p.feedback(c, {"improvement": improvement, "origin": c.origin})
        asked = [r["model"] for r in srv.requests]
    assert set(asked) == {"coder-good", "coder-bad"}
    assert Counter(asked[-15:])["coder-good"] >= 13, asked
    usage = p.usage_by_model()
    assert usage["coder-good"]["calls"] == asked.count("coder-good")
    assert usage["coder-bad"]["calls"] == asked.count("coder-bad")
    good = usage["coder-good"]
    assert good["cost"] == pytest.approx((good["prompt_tokens"] * 0.01 + good["completion_tokens"] * 0.03) / 1000)
    assert good["rewards"] == asked.count("coder-good") and good["reward_sum"] > usage["coder-bad"]["reward_sum"]


def test_budget_stops_the_island_cleanly():
    task = load_task("softmax")
    with PerModelServer({"m1": _good_answer(task), "m2": _good_answer(task)}) as srv:
        p = LLMProposer(_cfg(srv, max_cost=0.05, models=[{"model": "m1", "cost_per_1k_input": 0.01},
                                                           {"model": "m2", "cost_per_1k_input": 0.02}]))
        isl = Island(0, "softmax", "cpp", SearchConfig(near_duplicate=0.0), p)
        seeds = [Candidate(task="softmax", language="cpp", source=s.source, origin=f"seed:{s.name}",
                           params=parse_params(s.source).default()) for s in task.seeds_for("cpp")]
        isl.seed([(isl.describe(c), EvalResult(candidate_id=c.id, tier=5, times={"s": 1.0}, ref_times={"s": 1.0}))
                  for c in seeds])
        kids = []
        for _ in range(40):
            batch = isl.propose(2)
            if isl.exhausted:
                break
            kids += batch
        calls = len(srv.requests)
    assert isl.exhausted and 0 < calls < 40
    spent = totals(p.usage_by_model())["cost"]
    assert spent >= 0.05 and spent < 0.05 + 0.02 * 2          # stops at the first call past the budget
    # an exhausted island hands back the baseline seed, which the coordinator knows (no evaluation),
    # and ingesting it records nothing: the summary says `exhausted`, so the task's budget closes
    stop = isl.propose(2)
    assert len(stop) == 1 and stop[0].source == task.baseline_seed("cpp").source
    assert isl.ingest([(seeds[0], EvalResult(candidate_id=seeds[0].id, tier=5))]) == []
    assert isl.summary()["exhausted"] and set(isl.summary()["llm"]) == {"m1", "m2"}


def test_token_budget_ends_a_real_run(ray_local, tmp_path, tmp_cache):
    """A whole run on Ray stops once the LLM tokens are spent. The budget is the engine's, so the
    evaluations run on the `sim` backend (a fixed time each, no compiler), at the task's tiny shape."""
    import threading

    from kfray.driver import run_search

    task = load_task("softmax")
    with PerModelServer({"m-a": _good_answer(task), "m-b": "no code here"}) as srv:
        cfg = load_config(None, ["tasks=[softmax@tiny]", "search.islands=2", "search.retime_top=0", "search.budget=40", "search.batch=1",
                                 "eval.evaluators=1", "eval.tune_budget=0", "eval.trials=1",
                                 "eval.backend=sim", "eval.simulate_s=0.3",
                                 f"eval.cache_dir={tmp_cache}", "proposer.kind=llm",
                                 f"proposer.base_url={srv.base_url}", "proposer.api_key_env=KFRAY_TEST_NO_KEY",
                                 "proposer.max_retries=0", "proposer.token_budget=4000", "proposer.bandit=true",
                                 "proposer.models=[{model: m-a, cost_per_1k_input: 0.5}, {model: m-b}]"])
        out = {}
        t = threading.Thread(target=lambda: out.update(run_search(cfg, tmp_path / "run", progress=False)))
        t.start()
        t.join(240)
        assert not t.is_alive(), "the run must end once the token budget is spent"
    m = out["tasks"]["softmax@tiny"]
    assert m["evaluated"] < 40
    llm = out["llm"]
    assert set(llm) <= {"m-a", "m-b"} and sum(r["calls"] for r in llm.values()) >= 1
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in llm.values()) >= 4000
