"""An island: one MAP-Elites archive for one task on one hardware class, and its breeding loop.

`Island` is pure logic that tests drive directly; `IslandActor` is the thin Ray shell that asks
the shared PromptEvolver for meta-prompts and reports outcomes back to it.
"""
from __future__ import annotations

import difflib
import random
import re
from typing import Any, Callable

from kfray.candidate import Candidate, EvalResult
from kfray.config import SearchConfig
from kfray.proposal import Elite, MetaPrompt, ProposalContext
from kfray.proposers.base import Proposer
from kfray.search import repair, repeats
from kfray.search.archive import REJECTED, Archive
from kfray.descriptors import DIMENSIONS, describe, step_directive
from kfray.search.qd_gradient import QDGradient, classify
from kfray.source import normalize, parse_params, source_hash
from kfray.search.sampling import select_inspirations, select_parent, target_cell
from kfray.tasks import load_task

GRID = (4, 4, 4)
_TOKEN = re.compile(r"\w+|\S")


def source_similarity(a: str, b: str) -> float:
    """Similarity in [0, 1] of two sources: difflib's ratio over the tokens of their normalised
    text (comments and whitespace do not count)."""
    ta, tb = _TOKEN.findall(normalize(a)), _TOKEN.findall(normalize(b))
    if not ta and not tb:
        return 1.0
    return difflib.SequenceMatcher(None, ta, tb, autojunk=False).ratio()


class Island:
    RETRIES = 12
    MAX_PENDING = 2048

    def __init__(self, index: int, task_ref: str, language: str, cfg: SearchConfig, proposer: Proposer,
                 device_facts: dict | None = None, hardware: str = "", seed: int = 0):
        self.index = index
        self.task = load_task(task_ref)
        self.task_ref = task_ref
        self.language = language
        self.cfg = cfg
        self.proposer = proposer
        self.device_facts = device_facts or {}
        self.hardware = hardware
        self.single = getattr(cfg, "archive", "map_elites") == "single"
        dims = (1, 1, 1) if self.single else GRID
        self.archive = Archive(dims=dims, min_gain=cfg.min_gain)
        self.gradient = QDGradient(dims, cfg.qd_weights, cfg.qd_window)
        self.rng = random.Random(seed * 1000 + index)
        self.generation = 0
        self.evaluated = 0
        self.outcomes: dict[str, int] = {}
        # child id -> (parent id, parent fitness, parent cell or None, the child's origin)
        self._parents: dict[str, tuple] = {}
        self._pending: dict[str, str] = {}     # proposal hash -> child id (known kernels come back as themselves)
        self.seen: set[str] = set()            # source hashes proposed or received
        self.seed_elites: list[Elite] = []
        self.near_duplicates = 0
        self.exhausted = False                 # the proposer's budget is spent: propose no more
        self._stop_keys: set[str] = set()
        self.repairs: list[tuple] = []         # failed LLM children to fix: (cand, result, parent's book)

    @property
    def qd_on(self) -> bool:
        return self.cfg.parents == "archive" and not self.single and (
            self.cfg.qd_weight > 0 or self.cfg.qd_directives or self.cfg.target_strategy == "specialize")

    def describe(self, cand: Candidate) -> Candidate:
        if self.single:
            cand.cell = (0, 0, 0)
        else:
            cand.cell = describe(cand.source, cand.language) if cand.source.strip() else (0, 0, 0)
        return cand

    def is_near_duplicate(self, child: Candidate) -> bool:
        """True when the elite of the child's own cell has the child's parameters and a source at
        least `search.near_duplicate` similar: nothing new to learn from evaluating it."""
        thr = self.cfg.near_duplicate
        if thr <= 0 or not child.source.strip():
            return False
        e = self.archive.get(child.cell)
        if e is None or dict(e.candidate.params) != dict(child.params):
            return False
        return source_similarity(e.candidate.source, child.source) >= thr

    def directives(self, parent: Elite | None, target, gradient) -> list[str]:
        """Short steering lines for the prompt: the step the target cell asks for, and the step the
        QD gradient favours when it is another one."""
        if parent is None or not parent.result.correct or target is None or self.single:
            return []
        here = tuple(parent.candidate.cell)
        out = []
        try:
            for d, (a, b) in enumerate(zip(here, target)):
                if b > a:
                    out.append(f"Target {DIMENSIONS[d]} level {b}: "
                               f"{step_directive(DIMENSIONS[d], b, self.language)}.")
            if gradient is not None and self.cfg.qd_directives:
                for d in self.gradient.favoured(gradient, here, threshold=0.05)[:1]:
                    if target[d] <= here[d]:
                        out.append(f"Raising {DIMENSIONS[d]} has paid off in this search (QD gradient "
                                   f"{gradient[d]:+.2f}); consider: "
                                   f"{step_directive(DIMENSIONS[d], here[d] + 1, self.language)}.")
        except ValueError:      # a language without step directives
            return out
        return out

    def _stop_signal(self) -> Candidate:
        """What an exhausted island hands back instead of nothing: the baseline seed again, which the
        coordinator knows and passes straight back without evaluating it (no budget spent), so a
        generation passes and the summary reports `exhausted`. Without seeds, an empty candidate."""
        base = self.task.baseline_seed(self.language)
        if base is not None:
            c = Candidate(task=self.task_ref, language=self.language, source=base.source, island=self.index,
                          params=parse_params(base.source).default(), origin="stop:budget")
        else:
            c = Candidate(task=self.task_ref, language=self.language, source="", island=self.index,
                          origin="stop:budget", no_code_reason="the proposer's budget is spent")
        self._stop_keys.add(source_hash(c.source, c.params) if c.source.strip() else c.id)
        return self.describe(c)

    def add_fix(self, fixed: Candidate, book: tuple) -> Candidate:
        """A fix of a failed child (kfray.search.repair.due), judged against the failed child's parent."""
        child = self.describe(fixed)
        child.task = self.task_ref
        if child.source.strip():
            self.seen.add(key := source_hash(child.source, child.params))
            self._pending[key] = child.id
        self._parents[child.id] = (*book, child.origin)
        return child

    def propose(self, n: int, meta_prompt: Callable[[], MetaPrompt | None] = lambda: None) -> list[Candidate]:
        """n children of parents drawn from this island's archive (fewer once the proposer is exhausted),
        after the repairs of failed children, which the budget does not count again."""
        self.proposer.begin_batch()
        out = repair.due(self)
        for _ in range(n):
            if self.proposer.exhausted:
                self.exhausted = True
                break
            g = self.gradient.estimate(self.archive) if self.qd_on else None
            if self.cfg.parents == "seeds":      # random search: children of the seeds, no feedback
                parent = self.rng.choice(self.seed_elites) if self.seed_elites else None
                inspirations, target, occupied = [], None, set()
            else:
                qd_w = (lambda els: self.gradient.parent_weights(self.archive, els, g)) if g is not None else None
                parent, _mode = select_parent(self.archive, self.rng, self.cfg.explore, self.cfg.exploit,
                                              self.cfg.random, qd_weights=qd_w,
                                              qd_weight=self.cfg.qd_weight if g is not None else 0.0)
                inspirations = select_inspirations(self.archive, parent, self.cfg.inspirations, self.rng)
                target = target_cell(self.archive, parent, self.rng, self.cfg.target_strategy, g)
                occupied = set(self.archive.cells())
            ctx = ProposalContext(
                task=self.task, language=self.language, parent=parent, inspirations=inspirations,
                target_cell=target, meta_prompt=meta_prompt(),
                device_facts=self.device_facts, island=self.index, generation=self.generation + 1,
                directives=self.directives(parent, target, g), occupied=occupied,
                gradient=g if self.cfg.qd_directives else None, uniform=self.cfg.parents == "seeds")
            child = repeats.ask(self, ctx)
            if child.source.strip():
                key = source_hash(child.source, child.params)
                self.seen.add(key)
                self._pending[key] = child.id
            child.task = self.task_ref
            self._parents[child.id] = (parent.candidate.id if parent else None,
                                       parent.result.fitness if parent else 0.0,
                                       tuple(parent.candidate.cell) if parent else None, child.origin)
            out.append(child)
        if self.exhausted and not out:
            out.append(self._stop_signal())
        # Children the coordinator drops (in flight on another island) never come back: forget
        # the oldest bookkeeping past a bound, so checkpoints stay small.
        for book in (self._parents, self._pending):
            while len(book) > self.MAX_PENDING:
                book.pop(next(iter(book)))
        return out

    def _settle(self, cand: Candidate, res: EvalResult) -> bool:
        """Take the inner tuner's best setting as the candidate's parameters; True when it did."""
        tuned = res.facts.get("tuned_params") if isinstance(res.facts, dict) else None
        if isinstance(tuned, dict) and tuned and tuned != cand.params:
            cand.params = dict(tuned)
            self.seen.add(source_hash(cand.source, cand.params))
            return True
        return False

    def ingest(self, pairs: list[tuple[Candidate, EvalResult]]) -> list[dict]:
        """Insert evaluated children; one generation passes. Returns one record per child.

        A record says what became of the child (outcome, fitness, improvement over its parent) and,
        for children this island bred, the transition: parent and child cells and its kind (new
        cell, replaced, improvement, regression, neutral), which also feeds the QD gradient."""
        records = []
        for cand, res in pairs:
            key = source_hash(cand.source, cand.params) if cand.source.strip() else cand.id
            child_id = cand.id if cand.id in self._parents else self._pending.get(key)
            self._pending.pop(key, None)
            if key in self._stop_keys or cand.origin == "stop:budget":
                self._parents.pop(child_id or cand.id, None)
                if not cand.source.strip():
                    records.append({"candidate_id": cand.id, "prompt_id": None, "outcome": REJECTED.label,
                                    "fitness": res.fitness, "parent_fitness": 0.0, "improvement": 0.0,
                                    "stop": True})
                continue
            pid, pfit, pcell, origin = self._parents.pop(child_id, None) or (cand.parent_id, 0.0, None, cand.origin)
            if child_id is not None and repair.wants_repair(self.proposer, cand, res, origin, len(self.repairs)):
                self.repairs.append((cand, res, (pid, pfit, pcell)))
            tuned = self._settle(cand, res)
            if self.single:                 # known kernels come back with their own cells
                self.describe(cand)
            outcome = self.archive.insert(cand, res).label
            self.evaluated += 1
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            improvement = res.fitness - pfit
            rec = {"candidate_id": cand.id, "prompt_id": cand.prompt_id, "outcome": outcome,
                   "fitness": res.fitness, "parent_fitness": pfit, "improvement": improvement,
                   "parent_id": pid, "parent_cell": list(pcell) if pcell is not None else None,
                   "child_cell": list(cand.cell), "kind": classify(outcome, improvement),
                   "origin": origin, "island": self.index, "generation": self.generation + 1,
                   "params": dict(cand.params) if tuned else None}
            if pcell is not None and child_id is not None:
                self.gradient.add(pcell, cand.cell, pfit, res.fitness, outcome)
                self.proposer.feedback(cand, rec)
            records.append(rec)
        self.generation += 1
        return records

    def seed(self, pairs: list[tuple[Candidate, EvalResult]]) -> None:
        """Seed kernels, evaluated once per task, go into every island's archive."""
        for cand, res in pairs:
            self.seen.add(source_hash(cand.source, cand.params))
            self._settle(cand, res)
            self.describe(cand)
            self.archive.insert(cand, res)
            if cand.source.strip():
                self.seed_elites.append(Elite(cand, res))

    def emigrants(self, k: int) -> list[tuple[Candidate, EvalResult]]:
        return [(e.candidate, e.result) for e in self.archive.top(k)]

    def immigrate(self, pairs: list[tuple[Candidate, EvalResult]]) -> int:
        """Insert elites from another island (same hardware: their timings stand)."""
        self.seen.update(source_hash(c.source, c.params) for c, _ in pairs)
        for c, r in pairs:
            self._settle(c, r)
        return sum(bool(self.archive.insert(self.describe(c), r)) for c, r in pairs)

    def summary(self) -> dict[str, Any]:
        best = self.archive.best()
        out = {"island": self.index, "task": self.task_ref, "generation": self.generation,
               "evaluated": self.evaluated, "cells": len(self.archive), "coverage": self.archive.coverage(),
               "qd_score": self.archive.qd_score(), "best_fitness": best.result.fitness if best else 0.0,
               "best_id": best.candidate.id if best else None, "outcomes": dict(self.outcomes),
               "transitions": self.gradient.total, "near_duplicates": self.near_duplicates,
               "exhausted": self.exhausted, "repairs": len(self.repairs)}
        if self.qd_on:
            out["gradient"] = list(self.gradient.estimate(self.archive))
        usage = self.proposer.usage_by_model()
        if usage:
            out["llm"] = usage
        return out

    def state(self) -> dict:
        """Everything needed to rebuild this island after a crash (archive, RNG, counters)."""
        version, internal, gauss = self.rng.getstate()
        return {"index": self.index, "task": self.task_ref, "generation": self.generation,
                "evaluated": self.evaluated, "outcomes": self.outcomes, "archive": self.archive.to_dict(),
                "rng": [version, list(internal), gauss], "seen": sorted(self.seen),
                "parents": {k: [v[0], v[1], list(v[2]) if v[2] is not None else None, v[3]]
                            for k, v in self._parents.items()},
                "pending": dict(self._pending), "gradient": self.gradient.to_dict(),
                "seed_elites": [[e.candidate.to_dict(), e.result.to_dict()] for e in self.seed_elites],
                "near_duplicates": self.near_duplicates, "exhausted": self.exhausted,
                "repairs": repair.dump(self.repairs),
                "llm_usage": self.proposer.usage_by_model()}

    def restore(self, state: dict) -> None:
        """Become the island a `state()` described (resume, or restart after the actor died)."""
        self.generation, self.evaluated = state["generation"], state["evaluated"]
        self.outcomes = dict(state["outcomes"])
        self.archive = Archive.from_dict(state["archive"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.seen = set(state.get("seen", []))
        self._parents = {}
        for k, v in state.get("parents", {}).items():
            v = list(v) + [None, ""][len(v) - 2:] if len(v) < 4 else v
            self._parents[k] = (v[0], v[1], tuple(v[2]) if v[2] is not None else None, v[3])
        self._pending = dict(state.get("pending", {}))
        if state.get("gradient"):
            self.gradient = QDGradient.from_dict(state["gradient"])
        self.seed_elites = [Elite(Candidate.from_dict(c), EvalResult.from_dict(r))
                            for c, r in state.get("seed_elites", [])]
        self.near_duplicates = state.get("near_duplicates", 0)
        self.exhausted = state.get("exhausted", False)
        self.repairs = repair.load(state.get("repairs", []))
        self.proposer.restore_usage(state.get("llm_usage") or {})

    def replay(self, pairs: list[tuple[Candidate, EvalResult]]) -> None:
        """Insert results the last checkpoint missed (evaluated, but not yet ingested at a crash)."""
        for cand, res in pairs:
            self.seen.add(source_hash(cand.source, cand.params))
            self._settle(cand, res)
            self.archive.insert(self.describe(cand), res)
            if cand.origin.startswith("seed:") and cand.source.strip() and not any(
                    e.candidate.id == cand.id for e in self.seed_elites):
                self.seed_elites.append(Elite(cand, res))


class IslandActor:
    """Ray shell around an Island: fetches meta-prompts, reports each prompt's best child score."""

    def __init__(self, index: int, task_ref: str, language: str, cfg: SearchConfig, proposer_cfg,
                 evolver_name: str | None, device_facts: dict, hardware: str, seed: int):
        from kfray.proposers.offline import make_proposer

        proposer = make_proposer(proposer_cfg)
        if evolver_name and hasattr(proposer, "ledger"):
            # one ledger for every island of the run: the LLM budget and the bandit are run-wide
            from kfray.proposers.models import RemoteLedger, ledger_name
            proposer.ledger = RemoteLedger(ledger_name(evolver_name))
        self.island = Island(index, task_ref, language, cfg, proposer, device_facts, hardware, seed)
        self.evolver_name = evolver_name
        self._evolver = None

    def _get_evolver(self):
        import ray

        if self._evolver is None and self.evolver_name:
            self._evolver = ray.get_actor(self.evolver_name)
        return self._evolver

    def propose(self, n: int) -> list[dict]:
        import ray

        ev = self._get_evolver()
        prompts = ray.get(ev.sample_many.remote(n)) if ev else []   # one call per batch
        return [c.to_dict() for c in self.island.propose(n, lambda: prompts.pop() if prompts else None)]

    def ingest(self, pairs: list[tuple[dict, dict]]) -> dict:
        recs = self.island.ingest([(Candidate.from_dict(c), EvalResult.from_dict(r)) for c, r in pairs])
        ev = self._get_evolver()
        best: dict[str, float] = {}
        for r in recs:
            if r["prompt_id"]:
                best[r["prompt_id"]] = max(best.get(r["prompt_id"], float("-inf")), r["improvement"])
        new_prompts = []
        if ev:
            import ray
            new_prompts = [p for p in ray.get([ev.report.remote(pid, s) for pid, s in best.items()]) if p]
        # A checkpoint every `checkpoint_every` generations, not every ingest: state() grows with
        # the search, and the coordinator replays whatever came after the last one.
        every = max(1, getattr(self.island.cfg, "checkpoint_every", 1))
        state = self.island.state() if self.island.generation % every == 0 or self.island.exhausted else None
        return {"records": recs, "summary": self.island.summary(), "new_prompts": new_prompts,
                "state": state}

    def seed(self, pairs: list[tuple[dict, dict]]) -> None:
        self.island.seed([(Candidate.from_dict(c), EvalResult.from_dict(r)) for c, r in pairs])

    def emigrants(self, k: int) -> list[tuple[dict, dict]]:
        return [(c.to_dict(), r.to_dict()) for c, r in self.island.emigrants(k)]

    def immigrate(self, pairs: list[tuple[dict, dict]]) -> int:
        return self.island.immigrate([(Candidate.from_dict(c), EvalResult.from_dict(r)) for c, r in pairs])

    def summary(self) -> dict:
        return self.island.summary()

    def node(self) -> str:
        """The Ray node this island runs on."""
        import ray
        return ray.get_runtime_context().get_node_id()

    def state(self) -> dict:
        return self.island.state()

    def restore(self, state: dict, missed: list[tuple[dict, dict]] = ()) -> None:
        self.island.restore(state)
        self.island.replay([(Candidate.from_dict(c), EvalResult.from_dict(r)) for c, r in missed])
