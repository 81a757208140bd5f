"""An island: one MAP-Elites archive for one task on one hardware class, and its breeding loop.

`Island` is pure logic that tests drive directly; `IslandActor` is the thin Ray shell that asks
the shared PromptEvolver for meta-prompts and reports outcomes back to it.
"""
from __future__ import annotations

import random
import time
from typing import Any, Callable

from kfray.candidate import Candidate, EvalResult
from kfray.config import SearchConfig
from kfray.proposers.base import Elite, MetaPrompt, ProposalContext, Proposer
from kfray.search.archive import Archive
from kfray.search.descriptors import describe
from kfray.source import source_hash
from kfray.search.sampling import select_inspirations, select_parent, target_cell
from kfray.tasks import load_task


class Island:
    RETRIES = 12

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
        self.archive = Archive(min_gain=cfg.min_gain)
        self.rng = random.Random(seed * 1000 + index)
        self.generation = 0
        self.evaluated = 0
        self.outcomes: dict[str, int] = {}
        self._parents: dict[str, tuple[str | None, float]] = {}   # child id -> (parent id, parent fitness)
        self.seen: set[str] = set()                                 # source hashes proposed or received

    def describe(self, cand: Candidate) -> Candidate:
        cand.cell = describe(cand.source, cand.language) if cand.source.strip() else (0, 0, 0)
        return cand

    def propose(self, n: int, meta_prompt: Callable[[], MetaPrompt | None] = lambda: None) -> list[Candidate]:
        """n children of parents drawn from this island's archive."""
        out = []
        for _ in range(n):
            parent, _mode = select_parent(self.archive, self.rng, self.cfg.explore, self.cfg.exploit,
                                          self.cfg.random)
            ctx = ProposalContext(
                task=self.task, language=self.language, parent=parent,
                inspirations=select_inspirations(self.archive, parent, self.cfg.inspirations, self.rng),
                target_cell=target_cell(self.archive, parent, self.rng), meta_prompt=meta_prompt(),
                device_facts=self.device_facts, island=self.index, generation=self.generation + 1,
                occupied=set(self.archive.cells()))
            for _attempt in range(self.RETRIES):    # a child this island has seen teaches nothing
                child = self.proposer.propose(ctx, self.rng)
                key = source_hash(child.source, child.params)
                if key not in self.seen or not child.source.strip():
                    break
            self.seen.add(key)
            child = self.describe(child)
            child.task = self.task_ref
            self._parents[child.id] = (parent.candidate.id if parent else None,
                                       parent.result.fitness if parent else 0.0)
            out.append(child)
        return out

    def ingest(self, pairs: list[tuple[Candidate, EvalResult]]) -> list[dict]:
        """Insert evaluated children; one generation passes. Returns one record per child."""
        records = []
        for cand, res in pairs:
            outcome = self.archive.insert(cand, res)
            self.evaluated += 1
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            _pid, pfit = self._parents.pop(cand.id, (cand.parent_id, 0.0))
            records.append({"candidate_id": cand.id, "prompt_id": cand.prompt_id, "outcome": outcome,
                            "fitness": res.fitness, "parent_fitness": pfit,
                            "improvement": res.fitness - pfit})
        self.generation += 1
        return records

    def seed(self, pairs: list[tuple[Candidate, EvalResult]]) -> None:
        """Seed kernels, evaluated once per task, go into every island's archive."""
        for cand, res in pairs:
            self.seen.add(source_hash(cand.source, cand.params))
            self.archive.insert(cand, res)

    def emigrants(self, k: int) -> list[tuple[Candidate, EvalResult]]:
        return [(e.candidate, e.result) for e in self.archive.top(k)]

    def immigrate(self, pairs: list[tuple[Candidate, EvalResult]]) -> int:
        """Insert elites from another island (same hardware: their timings stand)."""
        self.seen.update(source_hash(c.source, c.params) for c, _ in pairs)
        return sum(self.archive.insert(c, r) != "rejected" for c, r in pairs)

    def summary(self) -> dict[str, Any]:
        best = self.archive.best()
        return {"island": self.index, "task": self.task_ref, "generation": self.generation,
                "evaluated": self.evaluated, "cells": len(self.archive), "coverage": self.archive.coverage(),
                "qd_score": self.archive.qd_score(), "best_fitness": best.result.fitness if best else 0.0,
                "best_id": best.candidate.id if best else None, "outcomes": dict(self.outcomes)}

    def state(self) -> dict:
        """Everything needed to rebuild this island after a crash (archive, RNG, counters)."""
        version, internal, gauss = self.rng.getstate()
        return {"index": self.index, "task": self.task_ref, "generation": self.generation,
                "evaluated": self.evaluated, "outcomes": self.outcomes, "archive": self.archive.to_dict(),
                "rng": [version, list(internal), gauss], "seen": sorted(self.seen),
                "parents": {k: list(v) for k, v in self._parents.items()}}

    def restore(self, state: dict) -> None:
        """Become the island a `state()` described (resume, or restart after the actor died)."""
        self.generation, self.evaluated = state["generation"], state["evaluated"]
        self.outcomes = dict(state["outcomes"])
        self.archive = Archive.from_dict(state["archive"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.seen = set(state.get("seen", []))
        self._parents = {k: (v[0], v[1]) for k, v in state.get("parents", {}).items()}

    def replay(self, pairs: list[tuple[Candidate, EvalResult]]) -> None:
        """Insert results the last checkpoint missed (evaluated, but not yet ingested at a crash)."""
        for cand, res in pairs:
            self.seen.add(source_hash(cand.source, cand.params))
            self.archive.insert(cand, res)


class IslandActor:
    """Ray shell around an Island: fetches meta-prompts, reports each prompt's best child score."""

    def __init__(self, index: int, task_ref: str, language: str, cfg: SearchConfig, proposer_cfg,
                 evolver_name: str | None, device_facts: dict, hardware: str, seed: int):
        from kfray.proposers.offline import make_proposer

        self.island = Island(index, task_ref, language, cfg, make_proposer(proposer_cfg), device_facts,
                             hardware, seed)
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
        sample = (lambda: ray.get(ev.sample.remote())) if ev else (lambda: None)
        return [c.to_dict() for c in self.island.propose(n, sample)]

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
        return {"records": recs, "summary": self.island.summary(), "new_prompts": new_prompts,
                "state": self.island.state()}

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
