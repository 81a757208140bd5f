"""MetaPromptPopulation as pure logic, and the PromptEvolver actor as a thin shell over it."""
from __future__ import annotations

import json
import random

from kfray.config import PromptConfig
from kfray.prompts.population import HINTS, SECTIONS, MetaPromptPopulation, load_snippets


def test_library_and_initial_members():
    lib = load_snippets()
    for s in SECTIONS:
        assert 5 <= len(lib[s]) <= 8
        assert all(p["hint"] in HINTS for p in lib[s])
    pop = MetaPromptPopulation(size=6, seed=1)
    mps = pop.members()
    assert [m.id for m in mps] == [f"mp-{i:04d}" for i in range(1, 7)]
    assert all(m.generation == 0 and m.parents == [] for m in mps)
    assert all(len(m.sections[s].split("\n")) == 2 for m in mps for s in SECTIONS)
    assert len({tuple(m.sections[s] for s in SECTIONS) for m in mps}) == 6   # different draws
    assert all(all(h for h in m.hints) for m in mps)
    assert pop.generations() == 1


def test_sampling_favours_the_better_prompt():
    pop = MetaPromptPopulation(size=2, explore=0.1, evolve_every=1000, seed=0)
    good, bad = (m.id for m in pop.members())
    for _ in range(3):
        pop.report(good, 6.0)
        pop.report(bad, 2.0)
    rng = random.Random(7)
    draws = [pop.sample(rng).id for _ in range(2000)]
    assert draws.count(good) > 0.85 * len(draws)
    assert draws.count(bad) > 0          # exploration still tries it
    assert pop.stats(good)["uses"] + pop.stats(bad)["uses"] == 2000


def test_untried_prompt_gets_an_optimistic_prior():
    pop = MetaPromptPopulation(size=3, explore=0.0, evolve_every=1000, seed=0)
    a, b, new = (m.id for m in pop.members())
    pop.report(a, 5.0)
    pop.report(b, 5.0)
    draws = [pop.sample().id for _ in range(600)]
    assert draws.count(new) > draws.count(a) and draws.count(new) > draws.count(b)


def test_report_evolves_every_n_and_generations_grow():
    pop = MetaPromptPopulation(size=4, evolve_every=3, seed=2)
    made = []
    for k in range(12):
        mp = pop.sample()
        new = pop.report(mp.id, float(k % 5))
        if new is not None:
            made.append(new)
            assert len(new.parents) >= 1 and new.generation >= 1
            assert set(new.sections) == set(SECTIONS)
        assert (new is not None) == ((k + 1) % 3 == 0)
    assert len(made) == 4
    assert pop.generations() >= 2
    assert pop.report("mp-9999", 1.0) is None            # unknown ids are ignored


def test_retirement_keeps_size_and_spares_untried_and_newest():
    pop = MetaPromptPopulation(size=3, evolve_every=1000, seed=3)
    a, b, c = (m.id for m in pop.members())
    pop.report(a, 1.0)
    pop.report(b, 4.0)                                  # c has no reports: must survive
    child = pop.evolve()
    alive = [m.id for m in pop.members()]
    assert len(alive) == 3
    assert a not in alive and b in alive and c in alive and child.id in alive
    assert len(pop.all_prompts()) == 4                 # the retired prompt is still on record
    child2 = pop.evolve()                               # only b reported, newest is child2
    assert child2.id in [m.id for m in pop.members()]
    assert len(pop) == 3 and c in [m.id for m in pop.members()]
    # nothing retirable: the population may grow past size rather than drop untried prompts
    pop2 = MetaPromptPopulation(size=2, evolve_every=1000, seed=3)
    pop2.evolve()
    assert len(pop2) == 3


def test_rewrite_is_used_and_falls_back():
    pop = MetaPromptPopulation(size=3, evolve_every=1000, seed=4)
    seen = {}

    def rewrite(sections, feedback):
        seen["sections"], seen["feedback"] = sections, feedback
        return {"strategies": "Use tensor cores.", "bogus": 3}

    mp = pop.evolve(rewrite)
    assert mp.sections["strategies"] == "Use tensor cores."
    assert set(mp.sections) == set(SECTIONS) and "mean child score" in seen["feedback"]
    parent = next(r for r in pop.all_prompts() if r["id"] == mp.parents[0])
    assert mp.sections["pitfalls"] == parent["sections"]["pitfalls"]

    def boom(sections, feedback):
        raise RuntimeError("model down")

    lib_texts = {p["text"] for s in SECTIONS for p in load_snippets()[s]}
    for bad in (lambda s, f: None, boom, lambda s, f: {"philosophy": ""}):
        mp = pop.evolve(bad)                            # recombination: library lines only
        lines = [ln for s in SECTIONS for ln in mp.sections[s].split("\n")]
        assert all(ln in lib_texts or ln == "Use tensor cores." for ln in lines)
        assert mp.generation >= 1


def test_round_trip_gives_identical_samples():
    pop = MetaPromptPopulation(size=4, evolve_every=2, seed=5)
    for k in range(5):
        pop.report(pop.sample().id, float(k))
    clone = MetaPromptPopulation.from_dict(json.loads(json.dumps(pop.to_dict())))
    assert clone.to_dict() == pop.to_dict()
    assert clone.all_prompts() == pop.all_prompts()
    for k in range(20):
        x, y = pop.sample(), clone.sample()
        assert x == y
        nx, ny = pop.report(x.id, k * 0.3), clone.report(y.id, k * 0.3)
        assert nx == ny
    assert clone.to_dict() == pop.to_dict()


REWRITE = """```yaml
philosophy: |
  Profile first.
strategies: |
  - One pass per row.
pitfalls: |
  - Tails.
analysis: |
  Profile first.
```"""


def test_evolver_asks_the_model_to_rewrite_prompts(monkeypatch):
    """With an llm proposer, the evolver's new meta-prompt is the model's rewrite (a real HTTP
    server on 127.0.0.1 scripts the answer); with the offline proposer nothing asks a model."""
    from llm_server import ScriptedServer

    from kfray.config import ProposerConfig
    from kfray.search.prompt_evolver import PromptEvolver

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with ScriptedServer([REWRITE]) as srv:
        ev = PromptEvolver(PromptConfig(population=2, evolve_every=1),
                           ProposerConfig(kind="llm", base_url=srv.base_url, model="scripted"))
        new = ev.report(ev.sample().id, 5.0)
        asked = len(srv.requests)
        # with fewer proposals left in the run than a prompt generation, a new prompt is bred
        # without a request (the driver says so: kfray.driver.loop)
        ev.wind_down()
        late = ev.report(ev.sample().id, 6.0)
        assert len(srv.requests) == asked and late is not None and late["generation"] == 2
    assert asked == 1 and "Performance feedback" in srv.requests[0]["messages"][1]["content"]
    assert new["sections"]["analysis"] == "Profile first." and new["generation"] == 1
    offline = PromptEvolver(PromptConfig(population=2, evolve_every=1), ProposerConfig(kind="offline"))
    assert offline.report(offline.sample().id, 5.0)["sections"]["analysis"] != "Profile first."


def test_prompt_evolver_actor(ray_local):
    ray = ray_local
    from kfray.search.prompt_evolver import make_prompt_evolver

    name = "test-prompt-evolver"
    h = make_prompt_evolver(name, PromptConfig(population=3, evolve_every=2), seed=0)
    try:
        news = []
        for k in range(4):
            mp = ray.get(h.sample.remote())
            assert set(mp.sections) == set(SECTIONS)
            new = ray.get(h.report.remote(mp.id, float(k)))
            if new is not None:
                news.append(new)
        assert len(news) == 2 and news[0]["generation"] >= 1
        # Every island that asks for the evolver by name gets the one that has the reports so far,
        # not a fresh population (different settings and seed are ignored).
        again = make_prompt_evolver(name, PromptConfig(population=7), seed=9)
        assert ray.get(again.generations.remote()) == ray.get(h.generations.remote()) >= 2
        ray.get(again.report.remote(ray.get(again.sample.remote()).id, 9.0))
        assert len(ray.get(h.all_prompts.remote())) == len(ray.get(again.all_prompts.remote()))
        same = again
        snap = ray.get(same.snapshot.remote())
        assert MetaPromptPopulation.from_dict(snap).generations() >= 2
        rows = ray.get(h.all_prompts.remote())
        assert len(rows) == 5          # the population of 3 and the 2 generations' children
        assert {"id", "generation", "sections", "parents", "hints", "uses", "reports", "mean",
                "best"} <= set(rows[0])
    finally:
        ray.kill(h)
