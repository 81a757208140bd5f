"""A model's answer that repeats a kernel: asked again (`proposer.repeat_asks` times, the prompt
naming a change), then made new by one of the offline proposer's edits instead of dropped.

A one-slot local model answers a request in about 40 s, and half of a 1.5B model's answers hand
back their parent or a near-duplicate of an elite (15 of 30 requests in a 45-minute run). Asking
again costs another answer with the same odds; an edit of the answer costs nothing, and the
evaluators still get a kernel the island has not tried. Its origin, `llm+edit`, says that the model
wrote it and kfray changed it; the budget counts it as the proposal it replaces.
"""
from __future__ import annotations

import dataclasses

from kfray.candidate import Candidate, EvalResult
from kfray.proposal import Elite, ProposalContext
from kfray.source import source_hash

EDITED = "llm+edit"
EDIT_TRIES = 8


def ask(island, ctx: ProposalContext) -> Candidate:
    """One child for `ctx`: the proposer's answer, asked again while it repeats a kernel the island
    has seen (or is a near-duplicate of an elite) and asks remain, and a model's last repeat edited."""
    attempts = 1 + min(island.RETRIES - 1, getattr(island.proposer, "repeat_asks", island.RETRIES))
    for attempt in range(attempts):
        child = island.describe(island.proposer.propose(ctx, island.rng))
        if not child.source.strip() or island.proposer.exhausted or not repeats(island, child):
            return child
        last = attempt + 1 == attempts
        edited = edit(island, ctx, child) if last and child.origin.startswith("llm") else None
        island.proposer.repeated(child, dropped=not last or edited is not None)
        ctx.repeats += 1
        if edited is not None:
            return edited
    return child                  # the last repeat comes back as a known result


def repeats(island, child: Candidate, count: bool = True) -> bool:
    """Seen by the island already, or a near-duplicate of its cell's elite (counted where `count`:
    a model's answer is, kfray's own tries at an edit are not)."""
    if source_hash(child.source, child.params) in island.seen:
        return True
    near = island.is_near_duplicate(child)
    island.near_duplicates += near and count
    return near


def edit(island, ctx: ProposalContext, child: Candidate) -> Candidate | None:
    """A kernel the island has not seen, made from `child` by one offline edit (its operators,
    weights and target cell as the offline proposer uses them); None where no edit gives one."""
    from kfray.proposers.offline import OfflineProposer

    result = ctx.parent.result if ctx.parent is not None else EvalResult(candidate_id=child.id, tier=0)
    base = dataclasses.replace(ctx, parent=Elite(child, result))
    offline = OfflineProposer()
    for _ in range(EDIT_TRIES):
        try:
            c = island.describe(offline.propose(base, island.rng))
        except Exception:  # noqa: BLE001 - an edit that misreads a model's source is no edit
            return None
        if not c.source.strip() or repeats(island, c, count=False):
            continue
        c.origin, c.parent_id, c.prompt_id = EDITED, child.parent_id, child.prompt_id
        c.propose_seconds = child.propose_seconds + c.propose_seconds
        return c
    return None
