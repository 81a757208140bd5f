"""Novelty: exact duplicates are never evaluated twice; near-duplicates of an elite are re-proposed."""
from __future__ import annotations

import random

from kfray.candidate import Candidate, EvalResult
from kfray.config import SearchConfig
from kfray.proposers.base import ProposalContext, Proposer
from kfray.search.island import Island, source_similarity
from kfray.source import parse_params
from kfray.tasks import load_task

TASK = load_task("matmul")
BASE = next(s for s in TASK.seeds_for("cpp") if s.name == "tiled").source


def _tweak(src: str) -> str:
    """A cosmetic-plus-trivial edit: a comment, spacing, and one renamed loop bound."""
    return ("// rewritten by a model\n" + src.replace("const int64_t pend", "const  int64_t  pend_")
            .replace("p < pend;", "p < pend_;"))


def test_similarity():
    assert source_similarity(BASE, BASE) == 1.0
    assert source_similarity(BASE, "/* hi */\n" + BASE.replace("\n", "\n\n")) == 1.0   # comments, spacing
    near = source_similarity(BASE, _tweak(BASE))
    assert 0.98 <= near < 1.0
    other = next(s for s in TASK.seeds_for("cpp") if s.name == "naive").source
    assert source_similarity(BASE, other) < 0.6


class _Scripted(Proposer):
    """Hands out the sources it was given, in order, with the parent's params."""

    def __init__(self, sources, origin="llm:test"):
        self.sources = list(sources)
        self.calls = 0
        self.origin = origin

    def propose(self, ctx: ProposalContext, rng) -> Candidate:
        src = self.sources[min(self.calls, len(self.sources) - 1)]
        self.calls += 1
        params = dict(ctx.parent.candidate.params) if ctx.parent else parse_params(src).default()
        return Candidate(task=ctx.task.name, language=ctx.language, source=src, params=params,
                         parent_id=ctx.parent.candidate.id if ctx.parent else None, origin=self.origin)


def _island(sources, near=0.98, origin="llm:test") -> tuple[Island, _Scripted]:
    prop = _Scripted(sources, origin)
    isl = Island(0, "matmul", "cpp", SearchConfig(near_duplicate=near, explore=0, exploit=1, random=0), prop)
    c = isl.describe(Candidate(task="matmul", language="cpp", source=BASE, params=parse_params(BASE).default(),
                               origin="seed:tiled"))
    isl.seed([(c, EvalResult(candidate_id=c.id, tier=5, times={"s": 1.0}, ref_times={"s": 1.0}))])
    return isl, prop


def test_near_duplicate_is_re_proposed_not_evaluated():
    different = next(s for s in TASK.seeds_for("cpp") if s.name == "ikj").source
    isl, prop = _island([_tweak(BASE), _tweak(BASE) + "\n", different])
    kids = isl.propose(1)
    assert len(kids) == 1 and kids[0].source == different
    assert prop.calls == 3 and isl.near_duplicates == 2
    assert isl.summary()["near_duplicates"] == 2


def test_near_duplicate_checks_cell_params_and_threshold():
    isl, _ = _island([BASE])
    elite = isl.archive.elites()[0].candidate
    twin = isl.describe(Candidate(task="matmul", language="cpp", source=_tweak(BASE), params=dict(elite.params)))
    assert twin.cell == elite.cell and isl.is_near_duplicate(twin)
    other_params = dict(elite.params, BK=128 if elite.params["BK"] != 128 else 64)
    assert not isl.is_near_duplicate(isl.describe(Candidate(task="matmul", language="cpp", source=_tweak(BASE),
                                                            params=other_params)))
    off, _ = _island([BASE], near=0.0)
    assert not off.is_near_duplicate(twin)
    strict, _ = _island([BASE], near=0.9999)
    assert not strict.is_near_duplicate(twin)


def test_exact_duplicates_are_never_handed_out_twice():
    isl, prop = _island([BASE])      # the proposer only ever repeats the seed
    seed = isl.archive.elites()[0].candidate
    kids = isl.propose(1)
    assert prop.calls == Island.RETRIES          # it kept asking for something new
    # then the model's last repeat is edited into a kernel the island has not tried (kfray.search.repeats)
    assert kids[0].origin == "llm+edit" and (kids[0].source, kids[0].params) != (seed.source, seed.params)
    own, prop = _island([BASE], origin="offline:test")
    kids = own.propose(1)
    assert prop.calls == Island.RETRIES          # a proposer of its own gives up: the coordinator drops the known kernel
    assert kids[0].source == BASE and kids[0].origin == "offline:test"


def test_offline_search_still_moves_with_the_filter_on():
    from kfray.proposers.offline import OfflineProposer

    isl = Island(0, "softmax", "cpp", SearchConfig(), OfflineProposer(), seed=3)
    seeds = [isl.describe(Candidate(task="softmax", language="cpp", source=s.source, origin=f"seed:{s.name}",
                                    params=parse_params(s.source).default())) for s in isl.task.seeds_for("cpp")]
    isl.seed([(c, EvalResult(candidate_id=c.id, tier=5, times={"s": 1.0}, ref_times={"s": 1.0})) for c in seeds])
    rng = random.Random(0)
    kids = []
    for _ in range(10):
        batch = isl.propose(2)
        kids += batch
        isl.ingest([(k, EvalResult(candidate_id=k.id, tier=5, times={"s": 1.0},
                                   ref_times={"s": 1.0 + rng.random()})) for k in batch])
    from kfray.source import source_hash

    assert len(kids) == 20
    assert len({source_hash(k.source, k.params) for k in kids}) >= 18     # the filter does not stall it
