"""Migration topologies: ring, fully connected, custom adjacency, and their errors."""
from __future__ import annotations

import pytest

from kfray.search.migration import destinations


def test_ring():
    assert destinations("ring", 4) == {0: [1], 1: [2], 2: [3], 3: [0]}
    assert destinations("ring", 2) == {0: [1], 1: [0]}


def test_full():
    d = destinations("full", 4)
    assert d == {0: [1, 2, 3], 1: [0, 2, 3], 2: [0, 1, 3], 3: [0, 1, 2]}
    assert all(i not in targets for i, targets in d.items())


@pytest.mark.parametrize("topology", ["ring", "full", "custom"])
def test_single_island_sends_nowhere(topology):
    assert destinations(topology, 1) == {0: []}
    assert destinations(topology, 0) == {}


def test_custom():
    adj = [[1, 2], [], [0]]
    assert destinations("custom", 3, adj) == {0: [1, 2], 1: [], 2: [0]}


def test_custom_result_is_a_copy():
    adj = [[1], [0]]
    d = destinations("custom", 2, adj)
    d[0].append(1)
    assert adj == [[1], [0]]


@pytest.mark.parametrize("adj", [None, [], [[1], [0]], [[1], [2], [0], [1]]])
def test_custom_needs_one_list_per_island(adj):
    with pytest.raises(ValueError, match="one adjacency list per island"):
        destinations("custom", 3, adj)


@pytest.mark.parametrize("adj,bad", [
    ([[0], [2], [0]], "adjacency\\[0\\]"),        # to itself
    ([[1], [3], [0]], "adjacency\\[1\\]"),        # out of range
    ([[1], [2], [-1]], "adjacency\\[2\\]"),       # negative
    ([[1], ["2"], [0]], "adjacency\\[1\\]"),      # not an int
])
def test_custom_invalid_islands(adj, bad):
    with pytest.raises(ValueError, match=bad):
        destinations("custom", 3, adj)


def test_unknown_topology():
    with pytest.raises(ValueError, match="unknown topology 'star'"):
        destinations("star", 3)


def test_a_round_half_in_does_not_wake_the_drivers_loop_until_the_rest_is_in(ray_local):
    """One island has given its emigrants, the other is still in a minute-long LLM call. The
    driver's loop sleeps on Migrations.refs(): that must not hold the emigrants already in, or the
    loop's wait returns at once, every time, and the driver spins beside the model. When the slow
    island answers, the round goes on."""
    import threading

    ray = ray_local
    from kfray.driver.migrate import Migrations

    @ray.remote(num_cpus=0)
    class Slow:
        def __init__(self):
            self.go = threading.Event()

        def emigrants(self):
            self.go.wait(60)
            return []

        def release(self):
            self.go.set()

    slow = Slow.options(max_concurrency=2).remote()
    fast, late = ray.put([]), slow.emigrants.remote()
    mig = Migrations(co=None)
    mig.asking[(fast, late)] = ("task", 1)
    ray.wait([fast], timeout=30)
    mig.step()
    assert (fast, late) in mig.asking, "the round went on without the slow island"
    ready, _ = ray.wait(mig.refs(), num_returns=1, timeout=0.5)
    assert ready == [], "the loop would wake at once on emigrants already taken"
    ray.get(slow.release.remote())
    ready, _ = ray.wait(mig.refs(), num_returns=1, timeout=30)
    assert ready == [late], "the slow island's answer must wake the loop"
    mig._send = lambda ref, round_, outgoing: None      # the round's sending is test_search's matter
    mig.step()
    assert not mig.asking and not mig.arrived
