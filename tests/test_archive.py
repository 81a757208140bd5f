"""MAP-Elites archive: insert outcomes, noise-aware replacement, tiers, grid bounds, stats, JSON round trip."""
from __future__ import annotations

import json

import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.search.archive import NEW_CELL, REJECTED, REPLACED, Archive


def _cand(cell=(0, 0, 0), source="int x;", **kw) -> Candidate:
    return Candidate(task="axpb", language="cpp", source=source, cell=tuple(cell), **kw)


def _res(cand: Candidate, tier: int = 5, speedup: float = 1.0, noise: float = 0.0) -> EvalResult:
    return EvalResult(candidate_id=cand.id, tier=tier, times={"s": 1.0}, ref_times={"s": speedup},
                      noise=noise)


def _put(a: Archive, cell, tier=5, speedup=1.0, noise=0.0) -> tuple[str, Candidate]:
    c = _cand(cell)
    return a.insert(c, _res(c, tier, speedup, noise)), c


def test_eval_result_speedup_and_fitness():
    r = EvalResult(candidate_id="x", tier=5, times={"s": 1.0}, ref_times={"s": 2.0})
    assert r.speedup == pytest.approx(2.0)
    assert r.fitness == pytest.approx(7.0)
    wrong = EvalResult(candidate_id="y", tier=4, times={"s": 1.0}, ref_times={"s": 2.0})
    assert wrong.speedup == 0.0 and wrong.fitness == 4.0


def test_insert_new_cell_then_replaced_then_rejected():
    a = Archive()
    out, first = _put(a, (1, 2, 3), speedup=1.0)
    assert out == NEW_CELL
    assert a.get((1, 2, 3)).candidate is first
    out, better = _put(a, (1, 2, 3), speedup=1.5)
    assert out == REPLACED
    assert a.get((1, 2, 3)).candidate is better
    out, worse = _put(a, (1, 2, 3), speedup=1.2)
    assert out == REJECTED
    assert a.get((1, 2, 3)).candidate is better
    assert len(a) == 1


def test_gain_below_min_gain_is_rejected():
    a = Archive(min_gain=0.02)
    _put(a, (0, 0, 0), speedup=2.0)
    out, _ = _put(a, (0, 0, 0), speedup=2.03)      # +1.5 % < 2 %
    assert out == REJECTED
    out, c = _put(a, (0, 0, 0), speedup=2.1)       # +5 % > 2 %
    assert out == REPLACED
    assert a.get((0, 0, 0)).candidate is c


def test_larger_min_gain_floor_is_respected():
    a = Archive(min_gain=0.2)
    _put(a, (0, 0, 0), speedup=1.0)
    assert _put(a, (0, 0, 0), speedup=1.15)[0] == REJECTED
    assert _put(a, (0, 0, 0), speedup=1.25)[0] == REPLACED


def test_noise_of_the_old_elite_raises_the_bar():
    a = Archive(min_gain=0.02)
    _put(a, (0, 0, 0), speedup=2.0, noise=0.1)
    assert _put(a, (0, 0, 0), speedup=2.1)[0] == REJECTED   # +5 % < 10 % noise
    assert _put(a, (0, 0, 0), speedup=2.3)[0] == REPLACED   # +15 % > 10 % noise


def test_noise_of_the_new_result_raises_the_bar():
    a = Archive(min_gain=0.02)
    _put(a, (0, 0, 0), speedup=2.0, noise=0.0)
    assert _put(a, (0, 0, 0), speedup=2.1, noise=0.1)[0] == REJECTED
    assert _put(a, (0, 0, 0), speedup=2.3, noise=0.1)[0] == REPLACED


def test_higher_tier_always_wins():
    a = Archive()
    _put(a, (0, 0, 0), tier=4)
    out, c = _put(a, (0, 0, 0), tier=5, speedup=0.01, noise=5.0)   # slow and noisy, but correct
    assert out == REPLACED and a.get((0, 0, 0)).candidate is c
    b = Archive()
    _put(b, (0, 0, 0), tier=1)
    assert _put(b, (0, 0, 0), tier=2)[0] == REPLACED
    assert _put(b, (0, 0, 0), tier=3)[0] == REPLACED


def test_lower_tier_never_replaces():
    a = Archive()
    _, keep = _put(a, (0, 0, 0), tier=5, speedup=0.1)
    assert _put(a, (0, 0, 0), tier=4)[0] == REJECTED
    assert _put(a, (0, 0, 0), tier=1)[0] == REJECTED
    assert a.get((0, 0, 0)).candidate is keep


@pytest.mark.parametrize("tier", [1, 2, 3, 4])
def test_incorrect_same_tier_never_replaces(tier):
    a = Archive()
    _, keep = _put(a, (2, 2, 2), tier=tier)
    out, _ = _put(a, (2, 2, 2), tier=tier, speedup=100.0)
    assert out == REJECTED
    assert a.get((2, 2, 2)).candidate is keep


@pytest.mark.parametrize("cell", [(4, 0, 0), (0, 4, 0), (0, 0, 4), (-1, 0, 0), (0, 0), (0, 0, 0, 0), ()])
def test_cell_outside_grid_raises(cell):
    a = Archive(dims=(4, 4, 4))
    c = _cand((0, 0, 0))
    c.cell = tuple(cell)
    with pytest.raises(ValueError):
        a.insert(c, _res(c))
    assert len(a) == 0


def test_non_cubic_grid_bounds():
    a = Archive(dims=(2, 3))
    assert _put(a, (1, 2))[0] == NEW_CELL
    with pytest.raises(ValueError):
        _put(a, (2, 0))
    assert a.capacity() == 6


def test_coverage_qd_score_top_best():
    a = Archive(dims=(4, 4, 4))
    assert a.coverage() == 0.0 and a.qd_score() == 0.0
    assert a.best() is None and a.top(3) == []
    _, c1 = _put(a, (0, 0, 0), speedup=1.0)        # fitness 6
    _, c2 = _put(a, (1, 0, 0), speedup=3.0)        # fitness 8
    _, c3 = _put(a, (0, 1, 0), tier=4)             # fitness 4
    _, c4 = _put(a, (0, 0, 1), speedup=2.0)        # fitness 7
    assert a.coverage() == pytest.approx(4 / 64)
    assert a.qd_score() == pytest.approx(6 + 8 + 4 + 7)
    assert a.best().candidate is c2
    assert [e.candidate for e in a.top(3)] == [c2, c4, c1]
    assert [e.candidate for e in a.top(10)] == [c2, c4, c1, c3]
    assert a.contains_id(c3.id) and not a.contains_id("nope")


def test_replacement_does_not_change_coverage():
    a = Archive()
    _put(a, (0, 0, 0), speedup=1.0)
    _put(a, (0, 0, 0), speedup=2.0)
    assert a.coverage() == pytest.approx(1 / 64)
    assert a.qd_score() == pytest.approx(7.0)


def test_round_trip_through_json():
    a = Archive(dims=(4, 4, 4), min_gain=0.05)
    _put(a, (0, 1, 2), speedup=1.5, noise=0.03)
    _put(a, (3, 3, 3), tier=2)
    c = _cand((1, 1, 1), source="// k\nint y;", params={"BLOCK": 128}, parent_id="abc",
              origin="offline:mutate_params", generation=4, island=2)
    a.insert(c, EvalResult(candidate_id=c.id, tier=5, times={"a": 0.5, "b": 2.0},
                           ref_times={"a": 1.0, "b": 3.0}, facts={"gbps": 12.5}, hardware="cpu"))
    a.visits[(0, 1, 2)] = 3
    a.visits[(1, 1, 1)] = 1

    b = Archive.from_dict(json.loads(json.dumps(a.to_dict())))

    assert b.dims == a.dims and b.min_gain == a.min_gain
    assert sorted(b.cells()) == sorted(a.cells())
    for cell in a.cells():
        ea, eb = a.get(cell), b.get(cell)
        assert eb.candidate == ea.candidate
        assert eb.result == ea.result
        assert eb.result.fitness == pytest.approx(ea.result.fitness)
    assert b.visits == {(0, 1, 2): 3, (1, 1, 1): 1}
    assert b.get((1, 1, 1)).candidate.params == {"BLOCK": 128}
    assert b.qd_score() == pytest.approx(a.qd_score())
    # The restored archive still applies the same rules.
    c2 = _cand((0, 1, 2))
    assert b.insert(c2, _res(c2, speedup=1.52)) == REJECTED
