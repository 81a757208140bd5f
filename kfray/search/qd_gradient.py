"""The QD gradient: which way to move in the behavioural grid, learnt from parent -> child transitions.

Every child an island breeds is one transition: the parent's cell and fitness, the child's cell and
fitness, and what the archive did with it. Per dimension of the grid, three estimates say whether a
step *up* that dimension pays off:

- fitness gradient: mean squashed fitness change (tanh of the change) of children that stepped up
  on the dimension, minus that of children that did not;
- improvement-rate gradient: the share of children that stepped up and improved (a new cell, a
  replaced elite, or a fitness gain over the parent), minus the share of the others;
- exploration gradient: how empty or weak the upper levels of the dimension are, minus the lower
  levels (need of a level = 1 - mean normalised fitness held by its cells, an empty cell holding 0).

Means are shrunk towards zero (a `prior` of pseudo-observations), so a few transitions move the
estimate a little and many move it a lot. The combined gradient is the weighted sum (default
0.4 / 0.4 / 0.2), each component in [-1, 1]. Pure Python and JSON-serialisable: the island holds
one and tests drive it directly.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Iterable


class Kind(StrEnum):
    """A parent -> child transition's kind (a string too: records and the database hold it as is)."""

    NEW_CELL = "new_cell"
    REPLACED = "replaced"
    IMPROVEMENT = "improvement"
    REGRESSION = "regression"
    NEUTRAL = "neutral"


NEW_CELL, REPLACED, IMPROVEMENT, REGRESSION, NEUTRAL = Kind
KINDS = tuple(Kind)
SUCCESS = (NEW_CELL, REPLACED, IMPROVEMENT)


def classify(archive_outcome: str, delta: float, eps: float = 1e-9) -> Kind:
    """The transition's kind: the archive's verdict when it took the child, else the fitness change."""
    if archive_outcome in (NEW_CELL, REPLACED):
        return Kind(archive_outcome)
    if delta > eps:
        return IMPROVEMENT
    if delta < -eps:
        return REGRESSION
    return NEUTRAL


@dataclass
class Transition:
    parent_cell: tuple
    child_cell: tuple
    parent_fitness: float
    child_fitness: float
    outcome: str          # the archive's verdict: new_cell | replaced | rejected
    kind: str             # new_cell | replaced | improvement | regression | neutral

    @property
    def delta(self) -> float:
        return self.child_fitness - self.parent_fitness

    def to_dict(self) -> dict:
        return {"parent_cell": list(self.parent_cell), "child_cell": list(self.child_cell),
                "parent_fitness": self.parent_fitness, "child_fitness": self.child_fitness,
                "outcome": self.outcome, "kind": self.kind}

    @classmethod
    def from_dict(cls, d: dict) -> "Transition":
        return cls(tuple(d["parent_cell"]), tuple(d["child_cell"]), d["parent_fitness"], d["child_fitness"],
                   d["outcome"], d["kind"])


class QDGradient:
    """Per-dimension gradient estimates from a sliding window of transitions."""

    def __init__(self, dims: Iterable[int] = (4, 4, 4), weights: Iterable[float] = (0.4, 0.4, 0.2),
                 window: int = 256, prior: float = 4.0):
        self.dims = tuple(dims)
        self.weights = tuple(float(w) for w in weights)
        if len(self.weights) != 3:
            raise ValueError(f"QD gradient weights are (fitness, improvement rate, exploration), got {self.weights}")
        self.prior = float(prior)
        self.transitions: deque[Transition] = deque(maxlen=max(1, int(window)))
        self.total = 0

    def __len__(self) -> int:
        return len(self.transitions)

    def add(self, parent_cell, child_cell, parent_fitness: float, child_fitness: float,
            outcome: str) -> Transition:
        t = Transition(tuple(parent_cell), tuple(child_cell), float(parent_fitness), float(child_fitness),
                       outcome, classify(outcome, float(child_fitness) - float(parent_fitness)))
        if len(t.parent_cell) == len(self.dims) == len(t.child_cell):
            self.transitions.append(t)
            self.total += 1
        return t

    # -- the three components -------------------------------------------------------------------
    def fitness_gradient(self) -> list[float]:
        out = []
        for d in range(len(self.dims)):
            up, rest = [], []
            for t in self.transitions:
                (up if t.child_cell[d] > t.parent_cell[d] else rest).append(math.tanh(t.delta))
            out.append(sum(up) / (len(up) + self.prior) - sum(rest) / (len(rest) + self.prior))
        return out

    def rate_gradient(self) -> list[float]:
        n = len(self.transitions)
        base = sum(t.kind in SUCCESS for t in self.transitions) / n if n else 0.0
        out = []
        for d in range(len(self.dims)):
            su = nu = sr = nr = 0
            for t in self.transitions:
                ok = t.kind in SUCCESS
                if t.child_cell[d] > t.parent_cell[d]:
                    nu, su = nu + 1, su + ok
                else:
                    nr, sr = nr + 1, sr + ok
            rate_up = (su + self.prior * base) / (nu + self.prior)
            rate_rest = (sr + self.prior * base) / (nr + self.prior)
            out.append(rate_up - rate_rest)
        return out

    def need(self, archive) -> dict[tuple, float]:
        """Need of every filled cell: 1 - its elite's fitness / the best fitness (empty cells: 1)."""
        elites = archive.elites()
        best = max((e.result.fitness for e in elites), default=0.0)
        return {tuple(e.candidate.cell): 1.0 - (max(e.result.fitness, 0.0) / best if best > 0 else 0.0)
                for e in elites}

    def exploration_gradient(self, archive) -> list[float]:
        need = self.need(archive)
        cap = 1
        for n in self.dims:
            cap *= n
        out = []
        for d, levels in enumerate(self.dims):
            if levels < 2:
                out.append(0.0)
                continue
            per_level = cap // levels
            level_need = []
            for lvl in range(levels):
                filled = [v for c, v in need.items() if c[d] == lvl]
                # empty cells need 1 each; filled ones what their elite leaves to be desired
                level_need.append((per_level - len(filled) + sum(filled)) / per_level)
            half = levels // 2
            lower, upper = level_need[:half], level_need[half:]
            out.append(sum(upper) / len(upper) - sum(lower) / len(lower))
        return out

    def components(self, archive) -> dict[str, list[float]]:
        return {"fitness": self.fitness_gradient(), "rate": self.rate_gradient(),
                "explore": self.exploration_gradient(archive)}

    def estimate(self, archive) -> tuple[float, ...]:
        """The combined gradient: weights . (fitness, improvement rate, exploration), per dimension."""
        comp = self.components(archive)
        wf, wr, we = self.weights
        return tuple(round(wf * f + wr * r + we * e, 6)
                     for f, r, e in zip(comp["fitness"], comp["rate"], comp["explore"]))

    # -- uses --------------------------------------------------------------------------------------
    def parent_weights(self, archive, elites: list, gradient: tuple[float, ...] | None = None) -> list[float]:
        """How well each elite sits for a step along the gradient: for every dimension the gradient
        favours (positive) and the elite still has room to climb, the gradient's strength, more when
        the cell one step up is empty or weak. A small floor keeps every elite possible."""
        g = gradient if gradient is not None else self.estimate(archive)
        need = self.need(archive)
        out = []
        for e in elites:
            cell = tuple(e.candidate.cell)
            w = 0.02
            for d, gd in enumerate(g):
                if gd <= 0 or cell[d] + 1 >= self.dims[d]:
                    continue
                up = cell[:d] + (cell[d] + 1,) + cell[d + 1:]
                w += gd * (0.5 + 0.5 * need.get(up, 1.0))
            out.append(w)
        return out

    def favoured(self, gradient: tuple[float, ...], cell: tuple | None = None,
                 threshold: float = 0.0) -> list[int]:
        """Dimensions the gradient favours above `threshold`, strongest first; with a cell, only
        those it can still climb."""
        dims = [d for d, g in enumerate(gradient) if g > threshold
                and (cell is None or cell[d] + 1 < self.dims[d])]
        return sorted(dims, key=lambda d: -gradient[d])

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in KINDS}
        for t in self.transitions:
            out[t.kind] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"dims": list(self.dims), "weights": list(self.weights), "window": self.transitions.maxlen,
                "prior": self.prior, "total": self.total, "transitions": [t.to_dict() for t in self.transitions]}

    @classmethod
    def from_dict(cls, d: dict) -> "QDGradient":
        g = cls(d["dims"], d["weights"], d["window"], d.get("prior", 4.0))
        g.transitions.extend(Transition.from_dict(t) for t in d.get("transitions", []))
        g.total = d.get("total", len(g.transitions))
        return g
