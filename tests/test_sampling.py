"""Parent / inspiration selection and the child's target cell."""
from __future__ import annotations

import random
from collections import Counter

from kfray.candidate import Candidate, EvalResult
from kfray.search.archive import Archive
from kfray.search.sampling import select_inspirations, select_parent, target_cell


def _put(a: Archive, cell, tier=5, speedup=1.0) -> Candidate:
    c = Candidate(task="axpb", language="cpp", source=f"// {cell}", cell=tuple(cell))
    a.insert(c, EvalResult(candidate_id=c.id, tier=tier, times={"s": 1.0}, ref_times={"s": speedup}))
    return c


def _archive() -> Archive:
    a = Archive(dims=(4, 4, 4))
    _put(a, (0, 0, 0), speedup=2.0)    # fitness 7 (best)
    _put(a, (1, 0, 0), speedup=0.5)    # fitness 5.5
    _put(a, (0, 1, 0), tier=1)         # fitness 1
    _put(a, (0, 0, 1), speedup=1.0)    # fitness 6
    return a


def test_empty_archive():
    a = Archive()
    assert select_parent(a, random.Random(0), 0.2, 0.7, 0.1) == (None, "empty")
    assert a.visits == {}
    assert select_inspirations(a, None, 3, random.Random(0)) == []


def test_exploit_favours_the_fittest():
    a = _archive()
    rng = random.Random(1)
    counts = Counter()
    for _ in range(400):
        parent, mode = select_parent(a, rng, explore=0.0, exploit=1.0, random_w=0.0)
        assert mode == "exploit"
        counts[parent.candidate.cell] += 1
    assert counts.most_common(1)[0][0] == (0, 0, 0)
    assert counts[(0, 0, 0)] > 0.35 * 400
    assert counts[(0, 0, 0)] > counts[(0, 0, 1)] > counts[(0, 1, 0)]


def test_exploit_weighs_speed_not_the_tier_offset():
    """Fitness is tier + speedup, so 5.76 against 5.38 looks close; a kernel at half the best speed
    must still be picked far less often than the best, at any speedup scale."""
    for best, half in ((0.76, 0.38), (2.0, 1.0), (40.0, 20.0)):
        a = Archive(dims=(4, 4, 4))
        _put(a, (0, 0, 0), speedup=best)
        _put(a, (1, 0, 0), speedup=half)
        rng = random.Random(3)
        counts = Counter(select_parent(a, rng, explore=0.0, exploit=1.0, random_w=0.0)[0].candidate.cell
                         for _ in range(400))
        assert counts[(1, 0, 0)] < 0.15 * counts[(0, 0, 0)], (best, counts)


def test_explore_favours_rarely_visited_cells():
    a = _archive()
    rng = random.Random(2)
    counts = Counter()
    for _ in range(300):
        # Every cell but one was chosen often already.
        a.visits = {(0, 0, 0): 10, (1, 0, 0): 10, (0, 0, 1): 10, (0, 1, 0): 0}
        parent, mode = select_parent(a, rng, explore=1.0, exploit=0.0, random_w=0.0)
        assert mode == "explore"
        counts[parent.candidate.cell] += 1
    assert counts[(0, 1, 0)] > 0.9 * 300        # the failed but never visited cell


def test_random_mode_is_roughly_uniform():
    a = _archive()
    rng = random.Random(3)
    counts = Counter(select_parent(a, rng, 0.0, 0.0, 1.0)[0].candidate.cell for _ in range(800))
    assert set(counts) == set(a.cells())
    assert min(counts.values()) > 120            # expected 200 each


def test_modes_follow_their_weights():
    a = _archive()
    rng = random.Random(4)
    modes = Counter(select_parent(a, rng, 0.2, 0.7, 0.1)[1] for _ in range(1000))
    assert set(modes) == {"explore", "exploit", "random"}
    assert modes["exploit"] > modes["explore"] > modes["random"]


def test_visits_are_counted():
    a = _archive()
    rng = random.Random(5)
    picked = Counter()
    for _ in range(50):
        parent, _ = select_parent(a, rng, 0.3, 0.4, 0.3)
        picked[tuple(parent.candidate.cell)] += 1
    assert sum(a.visits.values()) == 50
    assert a.visits == dict(picked)


def test_inspirations_exclude_parent_and_are_distinct():
    a = _archive()
    rng = random.Random(6)
    parent = a.get((0, 0, 0))
    for k in range(0, 6):
        ins = select_inspirations(a, parent, k, rng)
        cells = [e.candidate.cell for e in ins]
        assert (0, 0, 0) not in cells
        assert len(cells) == len(set(cells))
        assert len(ins) == min(k, len(a) - 1)


def test_inspirations_without_parent_may_use_every_cell():
    a = _archive()
    ins = select_inspirations(a, None, 10, random.Random(7))
    assert sorted(e.candidate.cell for e in ins) == sorted(a.cells())


def test_single_elite_has_no_inspirations():
    a = Archive()
    _put(a, (1, 1, 1))
    assert select_inspirations(a, a.get((1, 1, 1)), 3, random.Random(0)) == []


def test_target_cell_steps_up_one_dimension_for_correct_parent():
    a = _archive()
    _put(a, (1, 2, 1), speedup=1.2)
    parent = a.get((1, 2, 1))
    rng = random.Random(8)
    seen_dims = set()
    for _ in range(100):
        t = target_cell(a, parent, rng)
        diffs = [t[i] - parent.candidate.cell[i] for i in range(3)]
        assert sorted(diffs) == [0, 0, 1], (t, diffs)
        seen_dims.add(diffs.index(1))
    assert seen_dims == {0, 1, 2}


def test_target_cell_only_steps_where_there_is_room():
    a = Archive(dims=(4, 4, 4))
    _put(a, (3, 0, 3))
    parent = a.get((3, 0, 3))
    rng = random.Random(9)
    assert {target_cell(a, parent, rng) for _ in range(30)} == {(3, 1, 3)}


def test_target_cell_for_failed_parent_is_empty():
    a = _archive()
    parent = a.get((0, 1, 0))                  # tier 1
    rng = random.Random(10)
    filled = set(a.cells())
    targets = {target_cell(a, parent, rng) for _ in range(100)}
    assert targets and not (targets & filled)
    assert all(len(t) == 3 and all(0 <= x < 4 for x in t) for t in targets)
    assert len(targets) > 10                   # drawn among the 60 empty cells
    # No parent at all behaves the same way.
    assert target_cell(a, None, rng) not in filled


def test_target_cell_failed_parent_full_archive_is_none():
    a = Archive(dims=(2, 2))
    for cell in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        _put(a, cell, tier=2)
    assert target_cell(a, a.get((0, 0)), random.Random(0)) is None
