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
    gradient: tuple | None = None     # the QD gradient per dimension (positive: stepping up pays)
    uniform: bool = False             # random search: uniform operators and parameters, no steering


class Proposer(ABC):
    """Writes child candidates. Must never raise on a bad model answer: return a tier-0 candidate."""

    name: str = "proposer"

    @abstractmethod
    def propose(self, ctx: ProposalContext, rng) -> Candidate: ...

    @property
    def exhausted(self) -> bool:
        """True once the proposer's budget (tokens, cost) is spent: the island stops proposing."""
        return False

    def feedback(self, cand: Candidate, record: dict) -> None:
        """What became of a child this proposer wrote (an island's ingest record); default: ignored."""

    def usage_by_model(self) -> dict:
        """Token and cost accounting, per model ({} for proposers that call no model)."""
        return {}

    def restore_usage(self, usage: dict) -> None:
        """Resume: accounting from an island checkpoint (spend before a restart still counts)."""
