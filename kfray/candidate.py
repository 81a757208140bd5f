"""Candidate and EvalResult: the two records that travel between islands, evaluators and the store.

Plain dataclasses that turn into JSON-able dicts, so they cross Ray and SQLite unchanged.
"""
from __future__ import annotations

import dataclasses
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

# Correctness tiers (DESIGN.md).
TIER_NO_CODE = 0
TIER_COMPILE_ERROR = 1
TIER_RUNTIME_ERROR = 2
TIER_WRONG_SHAPE = 3
TIER_WRONG_VALUES = 4
TIER_CORRECT = 5

TIER_NAMES = {
    0: "no code",
    1: "compile error",
    2: "runtime error",
    3: "wrong shape",
    4: "wrong values",
    5: "correct",
}


def new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class Candidate:
    """One kernel to evaluate: a source in the task's language plus values for its @kf.param tunables."""

    task: str
    language: str
    source: str
    params: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=new_id)
    island: int = -1
    parent_id: str | None = None
    prompt_id: str | None = None
    origin: str = "seed"            # seed | offline:<operator> | llm:<model> | migrant
    generation: int = 0
    cell: tuple[int, ...] = ()
    no_code_reason: str = ""        # set when a proposer produced nothing usable (tier 0)
    propose_seconds: float = 0.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["cell"] = list(self.cell)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Candidate":
        d = dict(d)
        d["cell"] = tuple(d.get("cell", ()))
        return cls(**d)


@dataclass
class EvalResult:
    """What an evaluator learned about one candidate."""

    candidate_id: str
    tier: int
    reason: str = ""                                   # compiler message, mismatch, signal, timeout...
    times: dict[str, float] = field(default_factory=dict)       # shape config name -> median seconds
    ref_times: dict[str, float] = field(default_factory=dict)   # shape config name -> reference seconds
    noise: float = 0.0                                 # relative spread of the timings (IQR / median)
    stage_seconds: dict[str, float] = field(default_factory=dict)  # compile / correctness / timing
    facts: dict[str, Any] = field(default_factory=dict)  # achieved GB/s, GFLOP/s, registers, flags...
    hardware: str = ""
    evaluator: str = ""

    @property
    def correct(self) -> bool:
        return self.tier == TIER_CORRECT

    @property
    def speedup(self) -> float:
        """Geometric mean over shape configs of reference time / candidate time (0 if not correct).

        0 as well when the evaluator flagged the timing as untrusted (`facts["untrusted"]`: faster
        than the device's roofline allows): such a result is never better than correct-and-slow."""
        if not self.correct or not self.times or self.facts.get("untrusted"):
            return 0.0
        ratios = [self.ref_times[k] / t for k, t in self.times.items() if t > 0 and k in self.ref_times]
        if not ratios:
            return 0.0
        return math.exp(sum(math.log(r) for r in ratios) / len(ratios))

    @property
    def fitness(self) -> float:
        """Tier, plus the geometric-mean speedup once the kernel is correct (DESIGN.md)."""
        return self.tier + (self.speedup if self.correct else 0.0)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EvalResult":
        return cls(**d)

    def feedback(self, limit: int = 1500) -> str:
        """A short account for the next prompt: what failed, or how fast it ran."""
        if self.correct:
            per = ", ".join(
                f"{k}: {self.times[k] * 1e3:.3f} ms (reference {self.ref_times.get(k, 0) * 1e3:.3f} ms)"
                for k in self.times)
            return f"correct; speedup {self.speedup:.3f}x over the reference; {per}"
        text = f"{TIER_NAMES.get(self.tier, self.tier)}: {self.reason}"
        return text if len(text) <= limit else text[:limit] + " [...]"
