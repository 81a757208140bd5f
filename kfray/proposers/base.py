"""The one interface every proposer implements: context in, candidates out."""
from __future__ import annotations

from abc import ABC, abstractmethod

from kfray.candidate import Candidate
from kfray.proposal import Elite, MetaPrompt, ProposalContext

__all__ = ["Elite", "MetaPrompt", "ProposalContext", "Proposer"]


class Proposer(ABC):
    """Writes child candidates. Must never raise on a bad model answer: return a tier-0 candidate."""

    name: str = "proposer"

    @abstractmethod
    def propose(self, ctx: ProposalContext, rng) -> Candidate: ...

    @property
    def exhausted(self) -> bool:
        """True once the proposer's budget (tokens, cost) is spent: the island stops proposing."""
        return False

    def begin_batch(self) -> None:
        """An island starts asking for a batch of children (an LLM proposer ranks its requests by it)."""

    def feedback(self, cand: Candidate, record: dict) -> None:
        """What became of a child this proposer wrote (an island's ingest record); default: ignored."""

    def usage_by_model(self) -> dict:
        """Token and cost accounting, per model ({} for proposers that call no model)."""
        return {}

    def restore_usage(self, usage: dict) -> None:
        """Resume: accounting from an island checkpoint (spend before a restart still counts)."""
