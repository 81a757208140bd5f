"""The QD gradient: transitions in, per-dimension gradients out; parent sampling, target cells,
directives; and the transitions table of a real run."""
from __future__ import annotations

import json
import random
import sqlite3

import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.config import SearchConfig
from kfray.proposers.base import Elite
from kfray.proposers.offline import OfflineProposer
from kfray.search.archive import Archive
from kfray.search.island import Island
from kfray.search.qd_gradient import QDGradient, classify
from kfray.search.sampling import parent_probabilities, target_cell


def _put(a: Archive, cell, tier=5, speedup=1.0) -> Elite:
    c = Candidate(task="axpb", language="cpp", source=f"// {cell}", cell=tuple(cell))
    a.insert(c, EvalResult(candidate_id=c.id, tier=tier, times={"s": 1.0}, ref_times={"s": speedup}))
    return a.get(cell)


def _archive() -> Archive:
    a = Archive(dims=(4, 4, 4))
    for cell, s in [((0, 0, 0), 1.0), ((1, 0, 0), 1.2), ((0, 1, 0), 1.1), ((0, 0, 1), 1.0), ((3, 0, 0), 1.3)]:
        _put(a, cell, speedup=s)
    return a


def _memory_pays(g: QDGradient, n: int) -> None:
    """n transitions where stepping up `memory` gains and anything else loses."""
    for i in range(n):
        if i % 2 == 0:
            g.add((0, 0, 0), (1, 0, 0), 6.0, 6.8, "new_cell")
        else:
            g.add((1, 0, 0), (1, 1, 0), 6.0, 5.5, "rejected")


def test_classify():
    assert classify("new_cell", -1.0) == "new_cell"
    assert classify("replaced", 0.5) == "replaced"
    assert classify("rejected", 0.2) == "improvement"
    assert classify("rejected", -0.2) == "regression"
    assert classify("rejected", 0.0) == "neutral"


def test_gradients_point_where_children_improved():
    a = _archive()
    g = QDGradient()
    assert g.fitness_gradient() == [0.0, 0.0, 0.0] and g.rate_gradient() == [0.0, 0.0, 0.0]
    _memory_pays(g, 40)
    fit, rate = g.fitness_gradient(), g.rate_gradient()
    assert fit[0] > 0.5 and rate[0] > 0.5, (fit, rate)
    assert fit[1] < 0 and rate[1] < 0           # stepping up compute lost fitness
    combined = g.estimate(a)
    assert combined[0] == max(combined) and combined[0] > 0.3
    assert g.favoured(combined)[0] == 0
    assert g.counts()["new_cell"] == 20 and g.counts()["regression"] == 20
    # few transitions move the estimate less than many (shrinkage)
    few = QDGradient()
    _memory_pays(few, 2)
    assert 0 < few.fitness_gradient()[0] < fit[0]


def test_exploration_gradient_points_to_empty_levels():
    a = _archive()                              # everything sits at compute/parallelism level 0-1
    e = QDGradient().exploration_gradient(a)
    assert all(x >= 0 for x in e) and e[1] > 0 and e[2] > 0
    full = Archive(dims=(2, 2))
    for cell in [(0, 0), (0, 1)]:               # the lower half of dimension 0 is filled, the upper is not
        _put(full, cell, speedup=2.0)
    assert QDGradient(dims=(2, 2)).exploration_gradient(full)[0] == pytest.approx(1.0)


def test_window_and_serialisation():
    g = QDGradient(window=10)
    _memory_pays(g, 25)
    assert len(g) == 10 and g.total == 25
    h = QDGradient.from_dict(json.loads(json.dumps(g.to_dict())))
    assert h.total == 25 and len(h) == 10 and h.fitness_gradient() == g.fitness_gradient()


def test_parent_sampling_weights_change_with_transitions():
    a = _archive()
    g = QDGradient()
    elites = a.elites()

    def probs():
        return parent_probabilities(a, 0.2, 0.7, 0.1, g.parent_weights(a, elites), qd_weight=0.3)

    before = probs()
    assert before == pytest.approx(parent_probabilities(a, 0.2, 0.7, 0.1, g.parent_weights(a, elites), 0.3))
    _memory_pays(g, 40)
    after = probs()
    assert sum(after.values()) == pytest.approx(1.0)
    assert after != pytest.approx(before)
    # the gradient favours memory: an elite that can still climb memory gains on one that cannot
    assert after[(0, 0, 0)] > before[(0, 0, 0)]
    assert after[(3, 0, 0)] / after[(0, 0, 0)] < before[(3, 0, 0)] / before[(0, 0, 0)]
    # without the blend the weights are the plain mode mixture
    plain = parent_probabilities(a, 0.2, 0.7, 0.1)
    assert parent_probabilities(a, 0.2, 0.7, 0.1, g.parent_weights(a, elites), 0.0) == pytest.approx(plain)


def test_target_strategies():
    a = _archive()
    parent = _put(a, (1, 2, 0), speedup=1.5)
    rng = random.Random(0)
    assert {target_cell(a, parent, rng, "intensify") for _ in range(20)} == {(1, 2, 0)}
    assert {target_cell(a, parent, rng, "balance") for _ in range(20)} == {(1, 2, 1)}   # lowest: parallelism
    grad = (0.1, -0.2, 0.4)
    assert {target_cell(a, parent, rng, "specialize", grad) for _ in range(20)} == {(1, 2, 1)}
    assert {target_cell(a, parent, rng, "specialize", (0.5, 0.1, 0.0)) for _ in range(20)} == {(2, 2, 0)}
    # no dimension favoured: specialize falls back to mutate's random step
    assert len({target_cell(a, parent, rng, "specialize", (-1, -1, -1)) for _ in range(60)}) == 3
    failed = _put(a, (2, 2, 2), tier=2)
    assert target_cell(a, failed, rng, "balance") not in set(a.cells())
    with pytest.raises(ValueError, match="target strategy"):
        target_cell(a, parent, rng, "sideways")


class _FixedEval:
    """Fitness rises with the memory level: the island should learn that stepping up memory pays."""

    def __call__(self, c: Candidate) -> EvalResult:
        speed = 1.0 + 0.5 * c.cell[0] + 0.1 * random.Random(c.id).random()
        return EvalResult(candidate_id=c.id, tier=5, times={"s": 1.0}, ref_times={"s": speed})


def test_island_records_transitions_and_steers():
    cfg = SearchConfig(qd_weight=0.3, target_strategy="specialize")
    isl = Island(0, "matmul", "cpp", cfg, OfflineProposer(), seed=1)
    ev = _FixedEval()
    seeds = []
    for s in isl.task.seeds_for("cpp"):
        from kfray.source import parse_params
        c = isl.describe(Candidate(task="matmul", language="cpp", source=s.source, origin=f"seed:{s.name}",
                                   params=parse_params(s.source).default()))
        seeds.append((c, ev(c)))
    isl.seed(seeds)
    weights_before = isl.gradient.parent_weights(isl.archive, isl.archive.elites())
    records = []
    for _ in range(8):
        kids = isl.propose(2)
        records += isl.ingest([(k, ev(k)) for k in kids])
    trans = [r for r in records if r["parent_cell"] is not None]
    assert len(trans) == len(records) == 16
    assert all(r["kind"] in ("new_cell", "replaced", "improvement", "regression", "neutral") for r in trans)
    assert all(len(r["child_cell"]) == 3 and r["parent_id"] for r in trans)
    assert isl.gradient.total == 16 and isl.summary()["transitions"] == 16
    assert len(isl.summary()["gradient"]) == 3
    weights_after = isl.gradient.parent_weights(isl.archive, isl.archive.elites())
    assert weights_after != weights_before[:len(weights_after)] or len(weights_after) != len(weights_before)
    # state round trip keeps the gradient
    twin = Island(0, "matmul", "cpp", cfg, OfflineProposer(), seed=1)
    twin.restore(json.loads(json.dumps(isl.state())))
    assert twin.gradient.total == 16 and twin.gradient.estimate(twin.archive) == isl.gradient.estimate(isl.archive)


def test_directives_name_the_step():
    cfg = SearchConfig()
    isl = Island(0, "softmax", "cpp", cfg, OfflineProposer())
    parent = _put(isl.archive, (0, 1, 1), speedup=1.0)
    lines = isl.directives(parent, (1, 1, 1), (0.0, 0.0, 0.6))
    assert len(lines) == 2
    assert lines[0].startswith("Target memory level 1:") and "simd" in lines[0]
    assert "parallelism" in lines[1] and "QD gradient +0.60" in lines[1]
    assert isl.directives(parent, (1, 1, 1), None) == lines[:1]
    assert isl.directives(None, (1, 1, 1), (0, 0, 1)) == []


def test_transitions_table_fills_during_a_run(session_run):
    """Read from the session's real default search, its matmul task (conftest.py's `session_run`, 2
    islands a task, budget 10)."""
    db = sqlite3.connect(session_run["run_dir"] / "kfray.db")
    db.row_factory = sqlite3.Row
    rows = list(db.execute("SELECT * FROM transitions WHERE task = 'matmul' ORDER BY id"))
    children = db.execute("SELECT COUNT(*) FROM candidates WHERE parent_id IS NOT NULL AND task = 'matmul'").fetchone()[0]
    assert children > 0 and len(rows) >= children
    for r in rows:
        assert r["kind"] in ("new_cell", "replaced", "improvement", "regression", "neutral")
        assert len(json.loads(r["parent_cell"])) == 3 and len(json.loads(r["child_cell"])) == 3
        assert r["delta"] == pytest.approx(r["child_fitness"] - r["parent_fitness"])
    # the islands' QD gradients learnt from them, and the parent weights move as they accumulate
    states = [s for s in (json.loads(s) for s, in db.execute("SELECT state FROM islands")) if s["task"] == "matmul"]
    assert sum(s["gradient"]["total"] for s in states) == len(rows)
    archive = Archive.from_dict(states[0]["archive"])
    g = QDGradient()
    seen = [tuple(round(w, 9) for w in g.parent_weights(archive, archive.elites()))]
    for r in rows:
        g.add(json.loads(r["parent_cell"]), json.loads(r["child_cell"]), r["parent_fitness"],
              r["child_fitness"], r["outcome"])
        seen.append(tuple(round(w, 9) for w in g.parent_weights(archive, archive.elites())))
    assert len(set(seen)) > 2, "parent-sampling weights must change as transitions accumulate"


def test_single_cell_archive_is_a_plain_elitist_ga():
    isl = Island(0, "matmul", "cpp", SearchConfig(archive="single"), OfflineProposer(), seed=2)
    ev = _FixedEval()
    seeds = [Candidate(task="matmul", language="cpp", source=s.source, origin=f"seed:{s.name}", cell=(1, 1, 2))
             for s in isl.task.seeds_for("cpp")]
    isl.seed([(c, ev(isl.describe(Candidate(**{**c.__dict__})))) for c in seeds])
    assert isl.archive.dims == (1, 1, 1) and len(isl.archive) == 1
    kid = isl.propose(1)[0]
    assert kid.cell == (0, 0, 0)
    # a kernel the coordinator already knew comes back with the cell it was described with
    known = Candidate(task="matmul", language="cpp", source=seeds[0].source + "\n", cell=(2, 1, 3))
    recs = isl.ingest([(known, ev(known))])
    assert recs[0]["child_cell"] == [0, 0, 0] and len(isl.archive) == 1
    assert isl.summary()["cells"] == 1 and "gradient" not in isl.summary()
