"""Migration topologies: which islands each island sends its elites to."""
from __future__ import annotations


def destinations(topology: str, n: int, adjacency: list | None = None) -> dict[int, list[int]]:
    """Map island index -> islands it sends to. ring: i -> i+1; full: i -> all others."""
    if n <= 1:
        return {i: [] for i in range(n)}
    if topology == "ring":
        return {i: [(i + 1) % n] for i in range(n)}
    if topology == "full":
        return {i: [j for j in range(n) if j != i] for i in range(n)}
    if topology == "custom":
        if not adjacency or len(adjacency) != n:
            raise ValueError(f"custom topology needs one adjacency list per island ({n})")
        out = {}
        for i, targets in enumerate(adjacency):
            bad = [j for j in targets if not isinstance(j, int) or not 0 <= j < n or j == i]
            if bad:
                raise ValueError(f"adjacency[{i}] names invalid islands {bad}")
            out[i] = list(targets)
        return out
    raise ValueError(f"unknown topology {topology!r} (ring, full, custom)")
