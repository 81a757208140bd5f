"""The one interface every proposer implements: context in, candidates out."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from kfray.candidate import Candidate, EvalResult
from kfray.tasks.base import Task


@dataclass
class Elite:
    """A kernel from the archive as a proposer sees it: its candidate and what evaluation said."""

    candidate: Candidate
    result: EvalResult


@dataclass
class MetaPrompt:
    """One member of the co-evolved meta-prompt population (see kfray.prompts.population)."""

    id: str
    generation: int
    sections: dict[str, str]          # philosophy, strategies, pitfalls, analysis
    parents: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)   # operator hints the offline proposer follows


@dataclass
class ProposalContext:
    """Everything a proposer may use to write one child."""

    task: Task
    language: str
    parent: Elite | None              # None: no correct kernel yet; start from a seed
    inspirations: list[Elite]
    target_cell: tuple[int, ...] | None
    meta_prompt: MetaPrompt | None
    device_facts: dict[str, Any]
    island: int
    generation: int
    directives: list[str] = field(default_factory=list)  # short steering lines (QD gradient, tuner)
    occupied: set = field(default_factory=set)          # cells the island's archive already holds


class Proposer(ABC):
    """Writes child candidates. Must never raise on a bad model answer: return a tier-0 candidate."""

    name: str = "proposer"

    @abstractmethod
    def propose(self, ctx: ProposalContext, rng) -> Candidate: ...
