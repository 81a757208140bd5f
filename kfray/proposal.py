"""What a proposer is given to write one child: the parent elite, inspirations from other cells,
the meta-prompt, steering. Plain data that prompts, proposers and islands all share, so it lives
below all three."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kfray.candidate import Candidate, EvalResult

if TYPE_CHECKING:
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
    repair: bool = False              # `parent` failed (compile error, wrong values): fix it, once
    repeats: int = 0                  # this child's earlier answers repeated kernels already tried
    comments: bool = True             # sources shown with their comments (off: shown and asked without)
