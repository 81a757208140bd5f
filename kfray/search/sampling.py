"""Parent and inspiration selection over an archive, and the target cell for a child.

Three modes, as in KernelFoundry: exploration (cells chosen least often), exploitation
(fitness-weighted), and uniform random. Inspirations come from other cells.
"""
from __future__ import annotations

import math
import random

from kfray.proposers.base import Elite
from kfray.search.archive import Archive


def _weighted(rng: random.Random, elites: list[Elite], weights: list[float]) -> Elite:
    total = sum(weights)
    if total <= 0:
        return rng.choice(elites)
    return rng.choices(elites, weights=weights, k=1)[0]


def select_parent(archive: Archive, rng: random.Random, explore: float, exploit: float,
                  random_w: float) -> tuple[Elite | None, str]:
    """Pick a parent elite; returns (elite, mode). (None, 'empty') when the archive is empty."""
    elites = archive.elites()
    if not elites:
        return None, "empty"
    mode = rng.choices(["explore", "exploit", "random"], weights=[explore, exploit, random_w], k=1)[0]
    if mode == "explore":
        weights = [1.0 / (1 + archive.visits.get(tuple(e.candidate.cell), 0)) ** 2 for e in elites]
    elif mode == "exploit":
        best = max(e.result.fitness for e in elites)
        weights = [math.exp(4.0 * (e.result.fitness - best) / max(best, 1e-9)) for e in elites]
    else:
        weights = [1.0] * len(elites)
    parent = _weighted(rng, elites, weights)
    cell = tuple(parent.candidate.cell)
    archive.visits[cell] = archive.visits.get(cell, 0) + 1
    return parent, mode


def select_inspirations(archive: Archive, parent: Elite | None, k: int, rng: random.Random) -> list[Elite]:
    """Up to k elites from cells other than the parent's, better ones more likely."""
    others = [e for e in archive.elites() if parent is None or e.candidate.cell != parent.candidate.cell]
    picked: list[Elite] = []
    while others and len(picked) < k:
        e = _weighted(rng, others, [1.0 + max(0.0, o.result.fitness) for o in others])
        picked.append(e)
        others.remove(e)
    return picked


def target_cell(archive: Archive, parent: Elite | None, rng: random.Random) -> tuple[int, ...] | None:
    """For a correct parent: one step up on one dimension. Otherwise an empty cell, if any."""
    dims = archive.dims
    if parent is not None and parent.result.correct:
        cell = list(parent.candidate.cell)
        options = [i for i in range(len(dims)) if cell[i] + 1 < dims[i]]
        if options:
            i = rng.choice(options)
            cell[i] += 1
            return tuple(cell)
        return tuple(cell)
    filled = set(archive.cells())
    empty = [c for c in _all_cells(dims) if c not in filled]
    return rng.choice(empty) if empty else None


def _all_cells(dims: tuple[int, ...]) -> list[tuple[int, ...]]:
    cells: list[tuple[int, ...]] = [()]
    for d in dims:
        cells = [c + (i,) for c in cells for i in range(d)]
    return cells
