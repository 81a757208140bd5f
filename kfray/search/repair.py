"""Repair before charging: an LLM child that fails to compile or to check goes back once, with its
diagnostics, to the model for a fix. A small model's first try often misses by one line (a
missing include, a wrong index); the compiler's message is what it needs to get it right.

The island queues the failed child when it ingests it and asks for the fix in its next batch; the
fix is judged against the failed child's own parent and the budget does not count it again
(kfray.driver.ledger admits `llm:repair` children free), so a proposal and its repair are one.

A compile error that the compiler names exactly (a missing header, a parameter the parent
declared, `collapse` on a single loop) is fixed first without the model (kfray.proposers.fixups):
the fixed child has origin `llm+fix`, is free too, and only if it fails again is the model asked.
"""
from __future__ import annotations

from kfray.candidate import TIER_COMPILE_ERROR, TIER_CORRECT, Candidate, EvalResult
from kfray.proposal import Elite, ProposalContext
from kfray.proposers import fixups
from kfray.source import parse_params

MAX_QUEUED = 16
ORIGIN = "llm:repair"
FIXED = "llm+fix"
FREE = (ORIGIN, FIXED)        # origins the budget does not count again


def asks_model(proposer) -> bool:
    """Whether a failure no fix-up mends goes to the model (`proposer.repair_asks`)."""
    return bool(getattr(getattr(proposer, "cfg", None), "repair_asks", True))


def wants_repair(proposer, cand: Candidate, res: EvalResult, origin: str, queued: int) -> bool:
    """An LLM child (not itself a repair) that failed between compiling and checking, with the
    proposer's `repair` on and room in the queue. Where the model is not asked, only a compile
    error of a child not yet fixed up: the fix-ups mend nothing else."""
    if not asks_model(proposer) and (res.tier != TIER_COMPILE_ERROR or origin == FIXED):
        return False
    return (bool(getattr(getattr(proposer, "cfg", None), "repair", False))
            and (origin.startswith("llm:") or origin == FIXED) and origin != ORIGIN and cand.source.strip() != ""
            and TIER_COMPILE_ERROR <= res.tier < TIER_CORRECT and queued < MAX_QUEUED)


def due(island) -> list[Candidate]:
    """The fixes of the island's queued failed children while its proposer has budget, each
    registered by the island against the failed child's parent; none for a failure that no fix-up
    mends where the model is not asked."""
    out = []
    while island.repairs and not island.proposer.exhausted:
        cand, res, book = island.repairs.pop(0)
        fixed = fix_or_ask(island, cand, res)
        if fixed is not None:
            out.append(island.add_fix(fixed, book))
    return out


def fix_or_ask(island, cand: Candidate, res: EvalResult) -> Candidate | None:
    """The failed child fixed without the model where its compiler message says exactly how (not a
    second time), else the model's repair; None where no fix-up applies and the model is not asked
    (`proposer.repair_asks` off: on a one-slot local endpoint, three 45-minute runs of a 1.5B model
    had 0 of 9 model repairs correct against 10 of 19 children the fix-ups mended, and each repair
    took the slot for a whole answer)."""
    if res.tier == TIER_COMPILE_ERROR and cand.origin != FIXED:
        parent = _parent(island, cand.parent_id)
        kernels = [parent.source] if parent else []     # then the island's others, best first
        for e in sorted(list(island.archive.elites()) + list(island.seed_elites), key=lambda e: -e.result.fitness):
            if e.candidate.source not in kernels:
                kernels.append(e.candidate.source)
        donor = fixups.donor(cand.source, res.reason, kernels)
        got = fixups.fix(cand.source, res.reason, donor,
                         "the parent's" if parent and donor == parent.source else "another kernel's")
        if got is not None:
            source, _done = got
            params = {**parse_params(source).default(), **(parent.params if parent else {}), **cand.params}
            params = {k: v for k, v in params.items() if k in parse_params(source).values}
            return Candidate(task=cand.task, language=cand.language, source=source, params=params,
                             island=cand.island, parent_id=cand.id, prompt_id=cand.prompt_id, origin=FIXED,
                             generation=island.generation + 1)
    if not asks_model(island.proposer):
        return None
    return island.proposer.propose(repair_context(island, cand, res), island.rng)


def _parent(island, cand_id: str | None) -> Candidate | None:
    """The failed child's parent, where this island still holds it (archive or seeds)."""
    for e in list(island.archive.elites()) + list(island.seed_elites):
        if e.candidate.id == cand_id:
            return e.candidate
    return None


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
