"""MAP-Elites archive: one elite per behavioural cell. Pure Python, JSON-serialisable.

An elite is replaced only by a candidate whose fitness gain exceeds the measured timing noise
(and a floor, `min_gain`), so the archive does not churn on measurement jitter.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from kfray.candidate import Candidate, EvalResult
from kfray.proposal import Elite


class Outcome(IntEnum):
    """What became of a candidate offered to the archive; ordered, and true when it got in (as
    pyribs' AddStatus): `if archive.insert(c, r):`."""

    REJECTED = 0
    REPLACED = 1
    NEW_CELL = 2

    @property
    def label(self) -> str:
        """As records, the database and summary counts spell it: new_cell, replaced, rejected."""
        return self.name.lower()


NEW_CELL, REPLACED, REJECTED = Outcome.NEW_CELL, Outcome.REPLACED, Outcome.REJECTED


@dataclass
class Archive:
    dims: tuple[int, ...] = (4, 4, 4)
    min_gain: float = 0.02

    def __post_init__(self):
        self._elites: dict[tuple[int, ...], Elite] = {}
        self.visits: dict[tuple[int, ...], int] = {}     # times a cell's elite was chosen as parent

    def insert(self, cand: Candidate, result: EvalResult) -> Outcome:
        """Place a candidate in its cell: NEW_CELL, REPLACED or REJECTED."""
        cell = tuple(cand.cell)
        if len(cell) != len(self.dims) or any(not 0 <= c < d for c, d in zip(cell, self.dims)):
            raise ValueError(f"cell {cell} outside the archive's grid {self.dims}")
        old = self._elites.get(cell)
        if old is None:
            self._elites[cell] = Elite(cand, result)
            return NEW_CELL
        if self.beats(result, old.result):
            self._elites[cell] = Elite(cand, result)
            return REPLACED
        return REJECTED

    def beats(self, new: EvalResult, old: EvalResult) -> bool:
        """True when `new` is better than `old` by more than the noise of either measurement."""
        if new.tier != old.tier:
            return new.tier > old.tier
        if not new.correct:
            return False
        margin = max(self.min_gain, new.noise, old.noise)
        return new.speedup > old.speedup * (1.0 + margin)

    def get(self, cell) -> Elite | None:
        return self._elites.get(tuple(cell))

    def elites(self) -> list[Elite]:
        return list(self._elites.values())

    def cells(self) -> list[tuple[int, ...]]:
        return list(self._elites)

    def __len__(self) -> int:
        return len(self._elites)

    def capacity(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    def coverage(self) -> float:
        return len(self._elites) / self.capacity()

    def best(self) -> Elite | None:
        return max(self._elites.values(), key=lambda e: e.result.fitness, default=None)

    def top(self, k: int) -> list[Elite]:
        return sorted(self._elites.values(), key=lambda e: e.result.fitness, reverse=True)[:k]

    def qd_score(self) -> float:
        """Sum of elite fitness: rewards both quality and diversity."""
        return sum(e.result.fitness for e in self._elites.values())

    def contains_id(self, cand_id: str) -> bool:
        return any(e.candidate.id == cand_id for e in self._elites.values())

    def to_dict(self) -> dict:
        return {"dims": list(self.dims), "min_gain": self.min_gain,
                "visits": [[list(c), n] for c, n in self.visits.items()],
                "elites": [{"candidate": e.candidate.to_dict(), "result": e.result.to_dict()}
                           for e in self._elites.values()]}

    @classmethod
    def from_dict(cls, d: dict) -> "Archive":
        a = cls(tuple(d["dims"]), d["min_gain"])
        for e in d["elites"]:
            c = Candidate.from_dict(e["candidate"])
            a._elites[tuple(c.cell)] = Elite(c, EvalResult.from_dict(e["result"]))
        a.visits = {tuple(c): n for c, n in d.get("visits", [])}
        return a
