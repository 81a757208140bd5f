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

    # how many times an island asks again for a child that repeated a kernel already tried: free
    # for a proposer of its own, a whole answer of the model's slot for an LLM
    repeat_asks = 11

    def feedback(self, cand: Candidate, record: dict) -> None:
        """What became of a child this proposer wrote (an island's ingest record); default: ignored."""

    def repeated(self, cand: Candidate, dropped: bool = True) -> None:
        """`cand` repeated a kernel already tried and is not evaluated (`dropped`: nor sent on, so
        no feedback will come for it); default: ignored."""

    def usage_by_model(self) -> dict:
        """Token and cost accounting, per model ({} for proposers that call no model)."""
        return {}

    def restore_usage(self, usage: dict) -> None:
        """Resume: accounting from an island checkpoint (spend before a restart still counts)."""
