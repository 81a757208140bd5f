"""Repair before charging: an LLM child that fails to compile or to check goes back once, with its
diagnostics, to the model for a fix. A small model's first try often misses by one line (a
missing include, a wrong index); the compiler's message is what it needs to get it right.

The island queues the failed child when it ingests it and asks for the fix in its next batch; the
fix is judged against the failed child's own parent and the budget does not count it again
(kfray.driver.ledger admits `llm:repair` children free), so a proposal and its repair are one.
"""
from __future__ import annotations

from kfray.candidate import TIER_COMPILE_ERROR, TIER_CORRECT, Candidate, EvalResult
from kfray.proposal import Elite, ProposalContext

MAX_QUEUED = 16
ORIGIN = "llm:repair"


def wants_repair(proposer, cand: Candidate, res: EvalResult, origin: str, queued: int) -> bool:
    """An LLM child (not itself a repair) that failed between compiling and checking, with the
    proposer's `repair` on and room in the queue."""
    return (bool(getattr(getattr(proposer, "cfg", None), "repair", False))
            and origin.startswith("llm:") and origin != ORIGIN and cand.source.strip() != ""
            and TIER_COMPILE_ERROR <= res.tier < TIER_CORRECT and queued < MAX_QUEUED)


def repair_context(island, cand: Candidate, res: EvalResult) -> ProposalContext:
    return ProposalContext(task=island.task, language=island.language, parent=Elite(cand, res), inspirations=[],
                           target_cell=None, meta_prompt=None, device_facts=island.device_facts,
                           island=island.index, generation=island.generation + 1, repair=True)


def dump(repairs: list) -> list:
    return [[c.to_dict(), r.to_dict(), [b[0], b[1], list(b[2]) if b[2] is not None else None]]
            for c, r, b in repairs]


def load(rows: list) -> list:
    return [(Candidate.from_dict(c), EvalResult.from_dict(r), (b[0], b[1], tuple(b[2]) if b[2] is not None else None))
            for c, r, b in rows]
