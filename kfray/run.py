"""The coordinator: runs one search from a RunConfig and writes the run folder.

It owns no search logic: islands breed, evaluators measure, the prompt evolver evolves. The
coordinator moves candidates between them, keeps the budget, triggers migrations along the
topology, and is the only writer of the run database.
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from kfray.candidate import TIER_CORRECT, Candidate, EvalResult
from kfray.cluster import connect
from kfray.config import EvalConfig, RunConfig, hardware_classes
from kfray.errors import KfrayError
from kfray.eval.evaluator import make_evaluators, release_gangs
from kfray.eval.queue import EvalQueue
from kfray.prompts.evolver import make_prompt_evolver
from kfray.search.descriptors import describe
from kfray.search.island import IslandActor
from kfray.search.migration import destinations
from kfray.source import parse_params, source_hash
from kfray.store import Store
from kfray.tasks import load_task, suite_form

# PyTorch-form backends search suite tasks in the suite's own form (kfray/tasks/suite_form.py).
LANGUAGE = {"cpu": "cpp", "cuda": "cuda", "sycl": "sycl_jit", "sim": "cpp", "torch_ext_cpu": "suite",
            "torch_ext_cuda": "suite"}
# The sycl backend's language follows eval.sycl_form: kernels compiled at run time, whole programs
# built ahead of time by icpx, or OpenCL C.
SYCL_FORM_LANGUAGE = {"jit": "sycl_jit", "aot": "sycl", "opencl": "opencl"}
SUFFIX = {"cpp": ".cpp", "cuda": ".cu", "sycl": ".cpp", "sycl_jit": ".cpp", "opencl": ".cl"}


def language_of(e) -> str:
    """The candidate language of an EvalConfig's backend (and, for sycl, its source form)."""
    if e.backend == "sycl":
        return SYCL_FORM_LANGUAGE[getattr(e, "sycl_form", "jit") or "jit"]
    return LANGUAGE[e.backend]


@dataclass
class HardwareClass:
    """One kind of device: its evaluators, their queue, the language its kernels are written in."""

    label: str
    cfg: EvalConfig
    language: str
    evaluators: list
    queue: EvalQueue
    facts: dict


@dataclass
class TaskState:
    ref: str
    islands: list = field(default_factory=list)
    spent: int = 0                    # candidates submitted for evaluation (the budget counts these)
    budget: int = 0                   # this task's evaluations; with search.share_budget it can grow
    proposals: int = 0                # including duplicates that were not evaluated
    seen: set = field(default_factory=set)
    generations: list = field(default_factory=list)
    next_migration: int = 0
    migration_rounds: int = 0
    best: tuple | None = None         # (candidate, result) with the highest fitness
    correct: int = 0
    evaluated: int = 0
    seed_pairs: dict = field(default_factory=dict)    # hardware label -> [(candidate, result)] of seeds
    labels: list = field(default_factory=list)        # island index -> hardware label
    checkpoints: dict = field(default_factory=dict)   # island index -> latest state() from an ingest
    since: dict = field(default_factory=dict)         # island index -> pairs ingested after that checkpoint
    known: dict = field(default_factory=dict)         # (label, source hash) -> (candidate, result) dicts
    baselines: dict = field(default_factory=dict)     # hardware label -> speedup of the baseline seed
    best_by: dict = field(default_factory=dict)       # hardware label -> (candidate, result)
    results: dict = field(default_factory=dict)       # candidate id -> result dict


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


class Coordinator:
    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, progress: bool = True,
                 resume: bool = False):
        self.cfg = cfg
        self.resume = resume
        self.run_dir = Path(run_dir or cfg.run_dir or default_run_dir())
        self.progress = progress
        self.class_cfgs = hardware_classes(cfg)
        self.tasks = {ref: load_task(ref) for ref in cfg.tasks}
        for e in self.class_cfgs:
            lang = language_of(e)
            for ref, t in self.tasks.items():
                if not t.seeds_for(lang) and cfg.proposer.kind == "offline":
                    raise KfrayError(f"task {ref!r} has no {lang} seed kernels, and the offline proposer "
                                     f"needs one to start from; use the llm proposer or add seeds")
        self.cross_hardware: list[dict] = []
        self.placement: dict[str, str] = {}          # actor name -> Ray node id
        self.name = f"kfray-{self.run_dir.name}-{int(time.time() * 1000) % 10**8}"
        self.actors: list = []
        self.migrations = 0
        self.island_restores = 0
        self._last_prompt_save = 0.0

    # --- set-up --------------------------------------------------------------------------------
    def _start_actors(self):
        self.classes: list[HardwareClass] = []
        if any(e.share_cache for e in self.class_cfgs):
            from kfray.eval.compile_cache import CacheServer
            self.cache_server = ray.remote(CacheServer).options(
                name=f"{self.name}-compile-cache", num_cpus=0).remote()
            self.actors.append(self.cache_server)
            for e in self.class_cfgs:
                if e.share_cache:
                    e.cache_server = f"{self.name}-compile-cache"
        for n, e in enumerate(self.class_cfgs):
            count = e.evaluators
            if count == 0 and e.backend in ("cuda", "torch_ext_cuda"):
                count = int(ray.cluster_resources().get("GPU", 0))
            if count < 1:
                raise KfrayError(f"no evaluators: eval.evaluators is {e.evaluators} and the cluster offers no "
                                 f"device for backend {e.backend}")
            evaluators = make_evaluators(e.backend, e, count, self.name, label=e.label or f"{e.backend}{n or ''}")
            self.actors += evaluators
            try:
                infos = ray.get([ev.info.remote() for ev in evaluators], timeout=300)
            except ray.exceptions.GetTimeoutError:
                raise KfrayError(f"evaluators did not start within 300 s: the cluster may lack the resources "
                                 f"they ask for (backend {e.backend}, num_cpus={e.num_cpus}, resources "
                                 f"{e.resources or '-'}; {count} of them); lower eval.evaluators or add nodes") from None
            label = e.label or infos[0]["hardware"]
            self.placement.update({i["name"]: i.get("node", "") for i in infos})
            if any(c.label == label for c in self.classes):
                raise KfrayError(f"two hardware classes are both called {label!r}; give each a `label`")
            # One job queued behind the running one hides the dispatch latency; GPU evaluators also
            # compile ahead on `compile_workers` threads.
            depth = 2 if e.backend in ("cpu", "sim") else e.compile_workers + 1
            self.classes.append(HardwareClass(label, e, language_of(e), evaluators, EvalQueue(evaluators, depth),
                                              infos[0]["facts"]))
        self.by_label = {c.label: c for c in self.classes}
        self.evaluators = [ev for c in self.classes for ev in c.evaluators]
        self.hardware = self.classes[0].label
        self.device_facts = self.classes[0].facts
        self.evolver = make_prompt_evolver(f"{self.name}-prompt-evolver", self.cfg.prompts, self.cfg.proposer,
                                           self.cfg.search.seed)
        self.actors.append(self.evolver)

    def _pending(self) -> int:
        return sum(len(c.queue) for c in self.classes)

    def _poll(self) -> list[tuple[str, Candidate, EvalResult]]:
        """Finished evaluations of every class, each result labelled with its hardware class."""
        out = []
        for hc in self.classes:
            for c, r in hc.queue.poll(0):
                r.hardware = hc.label
                out.append((hc.label, c, r))
        return out

    def _start_islands(self, st: TaskState):
        """`search.islands` islands per hardware class, each targeting that class's device."""
        s = self.cfg.search
        cls = ray.remote(IslandActor)
        for hc in self.classes:
            for _ in range(s.islands):
                i = len(st.islands)
                # No CPUs reserved (they wait on proposers and actors) and spread over the cluster,
                # so islands are not all pinned to the head node.
                a = cls.options(name=f"{self.name}-island-{st.ref}-{i}", num_cpus=0, max_restarts=-1,
                                max_task_retries=0, scheduling_strategy="SPREAD").remote(
                    i, st.ref, hc.language, s, self.cfg.proposer, f"{self.name}-prompt-evolver",
                    hc.facts, hc.label, s.seed)
                st.islands.append(a)
                st.labels.append(hc.label)
                self.actors.append(a)
        st.generations = [0] * len(st.islands)
        st.next_migration = s.migrate_every

    def _fill_islands(self, st: TaskState) -> list:
        """The calls (not yet waited on) that give a task's new islands their seeds, or on resume
        their checkpoints: one wait for every task, not one actor start after another."""
        if self.resume:
            return self._restore_islands(st)
        return [isl.seed.remote(st.seed_pairs.get(st.labels[i], [])) for i, isl in enumerate(st.islands)]

    def _restore_islands(self, st: TaskState) -> list:
        """Resume: each island from its last checkpoint plus the results it had not yet ingested."""
        saved = {r["island"]: (json.loads(r["state"]), r["updated"]) for r in
                 self.store.rows("SELECT island, state, updated FROM islands WHERE task = ?", (st.ref,))}
        calls = []
        for i, isl in enumerate(st.islands):
            state, updated = saved.get(i, (None, 0.0))
            mine = [(c.to_dict(), r.to_dict()) for c, r in self.store.evaluated(st.ref)
                    if c.island == i and c.id not in _archived_ids(state)]
            if state is None:
                calls.append(isl.restore.remote(_empty_state_like(i, st.ref),
                                                st.seed_pairs.get(st.labels[i], []) + mine))
            else:
                st.checkpoints[i] = state
                st.generations[i] = state["generation"]
                calls.append(isl.restore.remote(state, mine))
        st.next_migration = (min(st.generations) // self.cfg.search.migrate_every + 1) * self.cfg.search.migrate_every
        return calls

    def _recover_island(self, st: TaskState, i: int, missed: list = ()):
        """An island actor died (Ray restarted it empty): give it back its last checkpoint."""
        self.island_restores += 1
        isl = st.islands[i]
        missed = st.since.pop(i, []) + list(missed)
        if i in st.checkpoints:
            ray.get(isl.restore.remote(st.checkpoints[i], missed))
            st.generations[i] = st.checkpoints[i]["generation"]
        else:
            ray.get(isl.restore.remote(_empty_state_like(i, st.ref),
                                       st.seed_pairs.get(st.labels[i], []) + missed))
            st.generations[i] = 0
        if missed:      # what it replayed counts from now on as ingested after the checkpoint
            st.since[i] = missed

    def _load_progress(self, states: dict[str, TaskState]):
        """Resume: what the database already holds is spent budget and is never evaluated again."""
        for ref, st in states.items():
            # The hash each candidate had when proposed: the inner tuner may have changed its stored
            # params since, and the same proposal must not be evaluated again after a resume.
            for row in self.store.rows("SELECT src_hash, hardware FROM candidates WHERE task = ?", (ref,)):
                st.seen.add(((self.by_label.get(row["hardware"]) or self.classes[0]).label, row["src_hash"]))
            for c, r in self.store.evaluated(ref):
                st.spent += 1
                hc = self.by_label.get(r.hardware) or self.classes[0]
                st.seen.add((hc.label, source_hash(c.source, c.params)))
                self._account(st, hc.label, c, r)
                if c.origin.startswith("seed:"):
                    st.seed_pairs.setdefault(hc.label, []).append((c.to_dict(), r.to_dict()))
                    base = self.tasks[ref].seeds_for(hc.language)
                    if base and c.origin == f"seed:{base[0].name}" and r.correct:
                        st.baselines[hc.label] = r.speedup
            st.migration_rounds = (self.store.rows("SELECT MAX(round) AS m FROM migrations WHERE task = ?",
                                                   (ref,))[0]["m"] or 0)
            self.migrations += st.migration_rounds

    def _save_prompts(self, force: bool = False):
        if not force and time.time() - self._last_prompt_save < 5:
            return
        self._last_prompt_save = time.time()
        snap, prompts = ray.get([self.evolver.snapshot.remote(), self.evolver.all_prompts.remote()])
        self.store.set_meta(prompt_population=snap)
        self.store.upsert_prompts(prompts)

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t_start = time.time()
        connect(self.cfg.address, num_cpus=int(math.ceil(sum(e.evaluators * e.num_cpus for e in self.class_cfgs))))
        self.store = Store(self.run_dir / "kfray.db")
        prior = self.store.meta() if self.resume else {}
        self.store.set_meta(config=self.cfg.to_dict(), status="running", name=self.name,
                            **({"resumed": prior.get("resumed", 0) + 1} if self.resume else {"started": t_start}))
        try:
            self._start_actors()
            self.store.set_meta(hardware=self.hardware, device_facts=self.device_facts,
                                hardware_classes={c.label: c.facts for c in self.classes})
            if "prompt_population" in prior:
                ray.get(self.evolver.restore.remote(prior["prompt_population"]))
            states = {ref: TaskState(ref) for ref in self.tasks}
            if self.resume:
                self._load_progress(states)
            for st in states.values():       # actors boot (imports, task loading) while seeds compile
                self._start_islands(st)
            self._evaluate_seeds(states)
            ray.get([call for st in states.values() for call in self._fill_islands(st)])  # all at once
            self._loop(states, t_start)
            return self._finish(states, t_start)
        finally:
            self._shutdown()
            self.store.close()

    def _evaluate_seeds(self, states: dict[str, TaskState]):
        """Each seed kernel is evaluated once per task and hardware class, and shared by the islands
        of that class."""
        pending = 0
        for ref, st in states.items():
            for hc in self.classes:
                for seed in self.tasks[ref].seeds_for(hc.language):
                    c = Candidate(task=ref, language=hc.language, source=seed.source, origin=f"seed:{seed.name}",
                                  params=parse_params(seed.source).default())
                    c.cell = describe(c.source, c.language)
                    key = (hc.label, source_hash(c.source, c.params))
                    if key in st.seen:
                        continue          # resumed: evaluated before the stop
                    st.seen.add(key)
                    st.spent += 1
                    pending += 1
                    hc.queue.submit(c)
        while pending:
            for label, c, r in self._poll():
                pending -= 1
                st = states[c.task]
                st.seed_pairs.setdefault(label, []).append((c.to_dict(), r.to_dict()))
                self._account(st, label, c, r)
                base = self.tasks[c.task].seeds_for(self.by_label[label].language)
                if c.origin == f"seed:{base[0].name}" and r.correct:
                    st.baselines[label] = r.speedup
                self.store.add_candidates([(c, r, "seed")])
            if pending:
                ray.wait([ref for hc in self.classes for ref in hc.queue.refs()], num_returns=1, timeout=1.0)

    def _account(self, st: TaskState, label: str, c: Candidate, r: EvalResult):
        if c.source.strip():
            st.known[(label, source_hash(c.source, c.params))] = (c.to_dict(), r.to_dict())
        st.results[c.id] = r.to_dict()
        st.evaluated += 1
        if r.correct:
            st.correct += 1
        if st.best is None or r.fitness > st.best[1].fitness:
            st.best = (c, r)
        if label not in st.best_by or r.fitness > st.best_by[label][1].fitness:
            st.best_by[label] = (c, r)

    def _loop(self, states: dict[str, TaskState], t_start: float):
        s = self.cfg.search
        proposing: dict[Any, tuple[TaskState, int]] = {}
        ingesting: dict[Any, tuple[TaskState, int, list]] = {}
        batches: dict[tuple[str, int], dict] = {}     # (task, island) -> {"pending": set, "done": list}
        busy: set[tuple[str, int]] = set()
        owner: dict[str, tuple] = {}                 # candidate id -> (task, island) or (task, "retime", ...)
        for st in states.values():
            st.budget = st.budget or s.budget
        bar = _Progress(self.progress, sum(st.budget for st in states.values()), states)
        bar.advance(sum(st.spent for st in states.values()))
        deadline = t_start + s.time_limit_s if s.time_limit_s > 0 else float("inf")
        while True:
            out_of_time = time.time() > deadline
            if s.share_budget:
                # before proposing: a task that finished its own share may take what another left
                _share_leftovers(states, busy, 20 * s.budget)
            for st in states.values():
                reserved = sum(len(b["pending"]) for (t, _), b in batches.items() if t == st.ref)
                reserved += sum(n for f, (t2, _) in proposing.items() if t2 is st for n in [s.batch])
                for i, isl in enumerate(st.islands):
                    left = st.budget - st.spent - reserved
                    if (st.ref, i) in busy or left <= 0 or out_of_time or st.proposals > 20 * s.budget:
                        continue
                    n = min(s.batch, left)
                    proposing[isl.propose.remote(n)] = (st, i)
                    busy.add((st.ref, i))
                    reserved += n
            waitable = list(proposing) + list(ingesting)
            if not waitable and not self._pending():
                break
            # Sleep until anything at all completes (no busy polling: the driver's CPU is the
            # engine's overhead), then take everything that is ready.
            ray.wait(waitable + [r for hc in self.classes for r in hc.queue.refs()], num_returns=1, timeout=1.0)
            ready = ray.wait(waitable, num_returns=len(waitable), timeout=0)[0] if waitable else []
            for ref in ready:
                if ref in proposing:
                    st, i = proposing.pop(ref)
                    try:
                        proposed = ray.get(ref)
                    except ray.exceptions.RayActorError:
                        self._recover_island(st, i)
                        busy.discard((st.ref, i))
                        continue
                    fresh, known = [], []
                    label = st.labels[i]
                    for d in proposed:
                        c = Candidate.from_dict(d)
                        st.proposals += 1
                        h = (label, source_hash(c.source, c.params))
                        if c.source.strip() and h in st.seen:
                            # Evaluated before (maybe by another island): never again. The island
                            # still gets the known kernel and result, as it would get a migrant.
                            if h in st.known:
                                known.append(st.known[h])
                            continue
                        st.seen.add(h)
                        fresh.append(c)
                    # A migrant timed again on other hardware may have taken budget this batch had
                    # reserved: evaluate only what is left (the rest may be proposed again later).
                    room = max(0, st.budget - st.spent)
                    for c in fresh[room:]:
                        st.seen.discard((label, source_hash(c.source, c.params)))
                    fresh = fresh[:room]
                    st.spent += len(fresh)
                    bar.advance(len(fresh))
                    if not fresh and not known:   # nothing new at all: ask again, no generation passes
                        busy.discard((st.ref, i))
                        continue
                    batches[(st.ref, i)] = {"pending": {c.id for c in fresh}, "done": known}
                    for c in fresh:
                        owner[c.id] = (st.ref, i)
                        self.by_label[label].queue.submit(c)
                    if not fresh:
                        ingesting[st.islands[i].ingest.remote(known)] = (st, i, known)
                        del batches[(st.ref, i)]
                else:
                    st, i, pairs = ingesting.pop(ref)
                    busy.discard((st.ref, i))
                    try:
                        info = ray.get(ref)
                    except ray.exceptions.RayActorError:
                        self._recover_island(st, i, pairs)
                        continue
                    if info["summary"]["generation"] != st.generations[i] + 1:
                        # Killed between calls, Ray restarted it empty and it ingested into nothing:
                        # its checkpoint back, plus this batch.
                        self._recover_island(st, i, pairs)
                        continue
                    mine = {c["id"] for c, _ in pairs if c["island"] == i}   # not known kernels of others
                    self.store.set_outcomes([(r["candidate_id"], r["outcome"]) for r in info["records"]
                                             if r["candidate_id"] in mine])
                    # parent -> child transitions (the QD gradient's), parameters the inner tuner chose,
                    # and an island whose proposer spent its budget (LLM cost/tokens): this task is done
                    self.store.add_transitions(st.ref, info["records"], mine)
                    _adopt_tuned_params(st, info["records"], mine)
                    if info["summary"].get("exhausted"):
                        st.spent = max(st.spent, st.budget)
                    st.generations[i] = info["summary"]["generation"]
                    if info["state"] is not None:
                        st.checkpoints[i] = info["state"]
                        st.since[i] = []
                        self.store.save_islands([info["state"]])
                    else:
                        st.since.setdefault(i, []).extend(pairs)
                    if info["new_prompts"]:
                        self._save_prompts()
                    if min(st.generations) >= st.next_migration:
                        try:
                            self._migrate(st, owner)
                        except ray.exceptions.RayActorError:
                            pass    # an island died mid-migration: its next ingest brings it back
            results = self._poll()
            rows = []
            for label, c, r in results:
                key = owner.pop(c.id)
                st = states[key[0]]
                self._account(st, label, c, r)
                rows.append((c, r, None))
                if key[1] == "retime":                # a migrant timed again on its new hardware
                    self._arrive(st, c, r, key[2])
                    continue
                b = batches[key]
                b["pending"].discard(c.id)
                b["done"].append((c.to_dict(), r.to_dict()))
                if not b["pending"]:
                    ingesting[st.islands[key[1]].ingest.remote(b["done"])] = (st, key[1], b["done"])
                    del batches[key]
            self.store.add_candidates(rows)
            if results:
                bar.update(states)
        bar.close()

    def _migrate(self, st: TaskState, owner: dict):
        """Top elites of each island go to its neighbours along the topology; each move is recorded.

        Between islands of one hardware class the elites' timings stand. An elite that crosses to
        other hardware (same language) is timed again there first, and competes with that result."""
        s = self.cfg.search
        st.next_migration += s.migrate_every
        if len(st.islands) < 2 or s.migrants == 0:
            return
        st.migration_rounds += 1
        self.migrations += 1
        outgoing = ray.get([isl.emigrants.remote(s.migrants) for isl in st.islands])
        rows = []
        for src, dsts in destinations(s.topology, len(st.islands), s.adjacency).items():
            for dst in dsts:
                pairs = outgoing[src]
                a, b = self.by_label[st.labels[src]], self.by_label[st.labels[dst]]
                if a is b:
                    accepted = ray.get(st.islands[dst].immigrate.remote(pairs))
                    rows += [(st.ref, st.migration_rounds, src, dst, c["id"], accepted > 0) for c, _ in pairs]
                elif a.language == b.language:
                    for c, r in pairs:
                        if st.spent >= st.budget:     # timing it again would overspend the budget
                            break
                        known = st.known.get((b.label, source_hash(c["source"], c["params"])))
                        if known:                     # already timed on b: that result competes
                            ray.get(st.islands[dst].immigrate.remote([known]))
                            rows.append((st.ref, st.migration_rounds, src, dst, known[0]["id"], True))
                            continue
                        copy = Candidate.from_dict({**c, "id": Candidate(task="", language="", source="").id,
                                                    "island": dst, "parent_id": c["id"],
                                                    "origin": f"migrant:{a.label}"})
                        owner[copy.id] = (st.ref, "retime", dst)
                        st.spent += 1
                        b.queue.submit(copy)
                        rows.append((st.ref, st.migration_rounds, src, dst, c["id"], True))
        self.store.add_migrations(rows)

    def _arrive(self, st: TaskState, c: Candidate, r: EvalResult, dst: int):
        """A migrant's result on its new hardware: record the cross-hardware pair, then it competes."""
        origin = EvalResult.from_dict(st.results[c.parent_id])
        self.cross_hardware.append({
            "task": st.ref, "kernel": c.parent_id, "tuned_on": origin.hardware, "timed_on": r.hardware,
            "speedup_tuned_on": round(origin.speedup, 4), "speedup_timed_on": round(r.speedup, 4),
            "tier_timed_on": r.tier})
        ray.get(st.islands[dst].immigrate.remote([(c.to_dict(), r.to_dict())]))

    # --- the end -------------------------------------------------------------------------------
    def _finish(self, states: dict[str, TaskState], t_start: float) -> dict[str, Any]:
        island_states = ray.get([isl.state.remote() for st in states.values() for isl in st.islands])
        k = 0
        for st in states.values():     # an island Ray restarted after its last call answers empty
            for i, isl in enumerate(st.islands):
                if island_states[k]["generation"] != st.generations[i]:
                    self._recover_island(st, i)
                    island_states[k] = ray.get(isl.state.remote())
                k += 1
        nodes = ray.get([isl.node.remote() for st in states.values() for isl in st.islands])
        self.placement.update({f"island-{s['task']}-{s['index']}": n for s, n in zip(island_states, nodes)})
        self.store.set_meta(placement=self.placement)
        cache = self._cache_stats()
        self.store.save_islands(island_states)
        self._save_prompts(force=True)
        prompts = ray.get(self.evolver.all_prompts.remote())
        best_dir = self.run_dir / "best"
        best_dir.mkdir(parents=True, exist_ok=True)
        per_task = {}
        for ref, st in states.items():
            cells = {tuple(e["candidate"]["cell"]) for s in island_states if s["task"] == ref
                     for e in s["archive"]["elites"]}
            best_c, best_r = st.best if st.best else (None, None)
            ok = bool(best_r and best_r.tier == TIER_CORRECT)
            label = best_r.hardware if ok and best_r.hardware in self.by_label else self.classes[0].label
            baseline = st.baselines.get(label, 0.0)
            suite = getattr(self.tasks[ref], "suite", None)
            if ok:
                safe = re.sub(r"[^\w.@-]+", "_", ref).strip("_")     # refs may be paths
                if best_c.language == "suite" and suite is not None:     # a file the suite takes unchanged
                    suffix, text = suite_form.best_file(best_c.source, best_c.params, suite,
                                                        self.by_label[label].cfg.backend)
                    (best_dir / f"{safe}{suffix}").write_text(text)
                else:
                    (best_dir / f"{safe}{SUFFIX[best_c.language]}").write_text(
                        f"// kfray best kernel for {ref}: speedup {best_r.speedup:.3f}x over the reference\n"
                        f"// params: {json.dumps(best_c.params)}\n" + best_c.source)
            per_task[ref] = {
                "correct": ok,
                "best_speedup_vs_reference": round(best_r.speedup, 4) if ok else 0.0,
                "best_speedup_vs_seed": round(best_r.speedup / baseline, 4) if ok and baseline > 0 else 0.0,
                "best_hardware": label if ok else None,
                "best_by_hardware": {lb: round(r.speedup, 4) for lb, (_, r) in st.best_by.items() if r.correct},
                "best_candidate": best_c.id if ok else None,
                "best_params": best_c.params if ok else {},
                "cells_filled": len(cells),
                "island_cells": [len(s["archive"]["elites"]) for s in island_states if s["task"] == ref],
                "evaluated": st.evaluated,
                "correct_count": st.correct,
                "migrations": st.migration_rounds,
            }
            figures = best_r.facts.get("suite") if ok and best_r is not None else None
            if suite is not None and isinstance(figures, dict):      # the suite's own figures of the best
                per_task[ref]["suite"] = {k: figures[k] for k in ("name", "speedup", "speedup_compile",
                                                                  "avg_mean_ms", "ref_avg_mean_ms") if k in figures}
        summary = {
            "tasks": per_task,
            "islands": sum(len(st.islands) for st in states.values()),
            "evaluators": len(self.evaluators),
            "hardware": self.hardware,
            "migrations": self.migrations,
            "prompt_generations": len({p["generation"] for p in prompts}),
            "evaluated": sum(st.evaluated for st in states.values()),
            "hardware_classes": [c.label for c in self.classes],
            "compile_cache": cache,
            "cross_hardware": self.cross_hardware,
            "requeued": sum(c.queue.requeued for c in self.classes),
            "island_restores": self.island_restores,
            "per_evaluator": [n for c in self.classes for n in c.queue.per_evaluator],
            "wall_seconds": round(time.time() - t_start, 2),
            "run_dir": str(self.run_dir),
        }
        if _llm_usage(island_states):      # tokens and cost per model (LLM runs)
            summary["llm"] = _llm_usage(island_states)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.store.set_meta(status="finished", finished=time.time())
        return summary

    def _cache_stats(self) -> dict:
        """Compile-cache hits over every evaluator: local, fetched from another node, compiled."""
        try:
            per = ray.get([ev.stats.remote() for ev in self.evaluators], timeout=30)
        except Exception:
            return {}
        tot = {k: sum(p["compile_cache"].get(k, 0) for p in per) for k in ("hits", "remote_hits", "misses")}
        n = sum(tot.values())
        tot["hit_rate"] = round((tot["hits"] + tot["remote_hits"]) / n, 4) if n else 0.0
        return tot

    def _shutdown(self):
        evs = getattr(self, "evaluators", [])
        try:
            ray.get([e.shutdown.remote() for e in evs], timeout=10)
        except Exception:
            pass
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        release_gangs(self.name)


def _share_leftovers(states: dict, busy: set, saturated_after: int) -> None:
    """One evaluation budget for all tasks (sweeps): a task that can use no more of its share
    (its islands keep proposing kernels already evaluated) and has nothing in flight hands what is
    left to the tasks that can, evenly."""
    done = [st for st in states.values() if st.proposals > saturated_after and st.spent < st.budget
            and not any(t == st.ref for t, _ in busy)]
    for st in done:
        takers = [o for o in states.values() if o is not st and o.proposals <= saturated_after]
        if not takers:
            return
        left, st.budget = st.budget - st.spent, st.spent
        for k, o in enumerate(takers):
            o.budget += left // len(takers) + (1 if k < left % len(takers) else 0)


class _Progress:
    """A rich progress bar: candidates evaluated, best speedup so far, archive coverage."""

    def __init__(self, enabled: bool, total: int, states):
        self.bar = None
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("[bold]search"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=False)
        self.bar.start()
        self.task = self.bar.add_task("search", total=total, info="")

    def advance(self, n: int):
        if self.bar:
            self.bar.advance(self.task, n)

    def update(self, states):
        if self.bar:
            info = "  ".join(f"{ref}: {st.best[1].speedup:.2f}x" if st.best and st.best[1].correct else f"{ref}: -"
                             for ref, st in states.items())
            self.bar.update(self.task, info=f"best {info}")

    def close(self):
        if self.bar:
            done = self.bar.tasks[0].completed
            self.bar.update(self.task, total=done)
            self.bar.stop()


def _adopt_tuned_params(st: TaskState, records: list[dict], mine: set) -> None:
    """The inner tuner's best setting becomes the params of the coordinator's copies of a candidate."""
    tuned = {r["candidate_id"]: r["params"] for r in records if r.get("params") and r["candidate_id"] in mine}
    for c, _ in ([st.best] if st.best else []) + list(st.best_by.values()):
        if c.id in tuned:
            c.params = dict(tuned[c.id])


def _llm_usage(island_states: list[dict]) -> dict:
    """Tokens and cost per model (each island holds the run-wide ledger's latest snapshot)."""
    per: dict[str, dict] = {}
    for s in island_states:
        for model, row in (s.get("llm_usage") or {}).items():
            cur = per.setdefault(model, {})
            for k, v in row.items():
                cur[k] = max(cur.get(k, 0), v)
    return per


def _archived_ids(state: dict | None) -> set[str]:
    return {e["candidate"]["id"] for e in state["archive"]["elites"]} if state else set()


def _empty_state_like(index: int, task: str) -> dict:
    """A state with nothing in it, for `restore` to replay results into an island seeded afresh."""
    from kfray.search.archive import Archive
    import random
    version, internal, gauss = random.Random(index).getstate()
    return {"index": index, "task": task, "generation": 0, "evaluated": 0, "outcomes": {},
            "archive": Archive().to_dict(), "rng": [version, list(internal), gauss], "seen": [], "parents": {}}


def run_search(cfg: RunConfig, run_dir: str | Path | None = None, progress: bool = True) -> dict[str, Any]:
    return Coordinator(cfg, run_dir, progress).run()


def resume_search(run_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    """Continue a stopped run from its database: nothing evaluated is lost or evaluated again."""
    from kfray.config import config_from_dict

    db = Path(run_dir) / "kfray.db"
    if not db.is_file():
        raise KfrayError(f"{run_dir}: no kfray.db here, nothing to resume; give the folder of an earlier run")
    store = Store(db)
    meta = store.meta()
    store.close()
    if "config" not in meta:
        raise KfrayError(f"{db}: the run's configuration is missing; it cannot be resumed")
    cfg = config_from_dict(meta["config"], where=str(db))
    return Coordinator(cfg, run_dir, progress, resume=True).run()
