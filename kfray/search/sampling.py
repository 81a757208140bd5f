"""Parent and inspiration selection over an archive, and the target cell for a child.

Three modes, as in KernelFoundry: exploration (cells chosen least often), exploitation
(fitness-weighted), and uniform random. Inspirations come from other cells.
"""
from __future__ import annotations

import math
import random

from kfray.proposal import Elite
from kfray.search.archive import Archive


def _weighted(rng: random.Random, elites: list[Elite], weights: list[float]) -> Elite:
    total = sum(weights)
    if total <= 0:
        return rng.choice(elites)
    return rng.choices(elites, weights=weights, k=1)[0]


MODES = ("explore", "exploit", "random")
STRATEGIES = ("mutate", "intensify", "specialize", "balance")
EXPLOIT_SHARPNESS = 4.0     # exploit weight: exp(sharpness * (score - best score))


def mode_weights(archive: Archive, elites: list[Elite], mode: str) -> list[float]:
    """Unnormalised parent weights of one selection mode."""
    if mode == "explore":
        return [1.0 / (1 + archive.visits.get(tuple(e.candidate.cell), 0)) ** 2 for e in elites]
    if mode == "exploit":
        scores = [_exploit_score(e) for e in elites]
        best = max(scores)
        return [math.exp(EXPLOIT_SHARPNESS * (s - best)) for s in scores]
    return [1.0] * len(elites)


def _exploit_score(e: Elite) -> float:
    """Tier, plus the log of the speedup once correct: a kernel at half the best speedup weighs
    2^-4 of the best whatever the speedups are. (On fitness itself, tier + speedup, the tier's
    offset drowned the differences: a kernel at half the best speedup weighed ~0.8 of it, and
    "exploit" was close to uniform among correct kernels.)"""
    r = e.result
    return r.tier + (math.log(r.speedup) if r.correct and r.speedup > 0 else 0.0)


def _normalised(w: list[float]) -> list[float]:
    total = sum(w)
    return [x / total for x in w] if total > 0 else [1.0 / len(w)] * len(w)


def blended_weights(archive: Archive, elites: list[Elite], mode: str, qd_weights: list[float] | None = None,
                    qd_weight: float = 0.0) -> list[float]:
    """A mode's parent probabilities, with the QD-gradient weights blended in at `qd_weight`."""
    base = _normalised(mode_weights(archive, elites, mode))
    if not qd_weights or qd_weight <= 0:
        return base
    qd = _normalised(qd_weights)
    return [(1 - qd_weight) * b + qd_weight * q for b, q in zip(base, qd)]


def parent_probabilities(archive: Archive, explore: float, exploit: float, random_w: float,
                         qd_weights: list[float] | None = None, qd_weight: float = 0.0) -> dict:
    """cell -> probability that `select_parent` picks that cell's elite (the mixture over modes)."""
    elites = archive.elites()
    if not elites:
        return {}
    mix = _normalised([explore, exploit, random_w])
    probs = [0.0] * len(elites)
    for m, share in zip(MODES, mix):
        if share > 0:
            for i, p in enumerate(blended_weights(archive, elites, m, qd_weights, qd_weight)):
                probs[i] += share * p
    return {tuple(e.candidate.cell): p for e, p in zip(elites, probs)}


def select_parent(archive: Archive, rng: random.Random, explore: float, exploit: float,
                  random_w: float, qd_weights=None, qd_weight: float = 0.0) -> tuple[Elite | None, str]:
    """Pick a parent elite; returns (elite, mode). (None, 'empty') when the archive is empty.

    `qd_weights` (a callable elites -> weights, or a list in `archive.elites()` order) are the
    QD gradient's parent weights, blended into the mode's weights at `qd_weight`."""
    elites = archive.elites()
    if not elites:
        return None, "empty"
    mode = rng.choices(list(MODES), weights=[explore, exploit, random_w], k=1)[0]
    if callable(qd_weights):
        qd_weights = qd_weights(elites) if qd_weight > 0 else None
    if qd_weights is not None and qd_weight > 0:
        weights = blended_weights(archive, elites, mode, qd_weights, qd_weight)
    else:
        weights = mode_weights(archive, elites, mode)
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


def target_cell(archive: Archive, parent: Elite | None, rng: random.Random, strategy: str = "mutate",
                gradient: tuple[float, ...] | None = None) -> tuple[int, ...] | None:
    """The cell a child should aim for.

    For a correct parent, by `strategy`: `mutate` one step up on one dimension (chosen at random),
    `intensify` the parent's own cell, `specialize` one step up on the dimension the QD gradient
    favours most (random while the gradient favours none), `balance` one step up on the parent's
    lowest dimension. For a failed parent (or none), an under-explored cell: an empty one, the
    least visited among them near the filled region; None when the archive is full."""
    dims = archive.dims
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown target strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if parent is not None and parent.result.correct:
        cell = list(parent.candidate.cell)
        options = [i for i in range(len(dims)) if cell[i] + 1 < dims[i]]
        if strategy == "intensify" or not options:
            return tuple(cell)
        if strategy == "specialize" and gradient is not None:
            best = max(gradient[i] for i in options)
            if best > 0:
                options = [i for i in options if gradient[i] == best]
        elif strategy == "balance":
            low = min(cell[i] for i in options)
            options = [i for i in options if cell[i] == low]
        i = rng.choice(options)
        cell[i] += 1
        return tuple(cell)
    filled = set(archive.cells())
    empty = [c for c in _all_cells(dims) if c not in filled]
    if not empty:
        return None
    if filled:   # prefer empty cells next to filled ones: reachable in a step or two
        near = [c for c in empty if min(sum(abs(a - b) for a, b in zip(c, f)) for f in filled) <= 1]
        if near and rng.random() < 0.7:
            return rng.choice(near)
    return rng.choice(empty)


def _all_cells(dims: tuple[int, ...]) -> list[tuple[int, ...]]:
    cells: list[tuple[int, ...]] = [()]
    for d in dims:
        cells = [c + (i,) for c in cells for i in range(d)]
    return cells
