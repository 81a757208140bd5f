"""The run's books, with no Ray and no SQLite: which proposals are admitted (new kernels only),
how much budget each task has left and who may take a finished task's leftovers, which candidates
an island is waiting for, what an island must replay after a crash, and each task's tally.

The Ray loop (`kfray.driver.loop`) asks the ledger what to do and tells it what happened; the
policy is tested here on its own, in milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kfray.candidate import Candidate, EvalResult
from kfray.search.repair import FREE          # repairs and fix-ups finish a proposal already counted
from kfray.source import source_hash


@dataclass
class Owner:
    """Whose result a candidate in evaluation is: an island's batch, or a migrant on its way."""

    task: str
    island: int
    key: tuple[str, str]          # (hardware label, source hash): computed once, at admission
    retime: bool = False


@dataclass
class TaskBook:
    """One task's figures and memory."""

    ref: str
    budget: int = 0                   # evaluations; grows when a saturated task hands over leftovers
    start_budget: int = 0             # its own share, before any leftovers moved
    spent: int = 0                    # candidates submitted (the budget counts these)
    proposals: int = 0                # everything the islands proposed, duplicates included
    seen: set = field(default_factory=set)              # (label, hash) ever submitted
    known: dict = field(default_factory=dict)           # (label, hash) -> (candidate, result) dicts
    results: dict = field(default_factory=dict)         # candidate id -> result dict
    best: tuple | None = None                           # (Candidate, EvalResult) of highest fitness
    best_by: dict = field(default_factory=dict)         # label -> (Candidate, EvalResult)
    baselines: dict = field(default_factory=dict)       # label -> speedup of the baseline seed
    seed_pairs: dict = field(default_factory=dict)      # label -> [(candidate, result) dicts]
    correct: int = 0
    evaluated: int = 0
    labels: list = field(default_factory=list)          # island index -> hardware label
    generations: list = field(default_factory=list)
    checkpoints: dict = field(default_factory=dict)     # island -> last state() an ingest returned
    since: dict = field(default_factory=dict)           # island -> pairs ingested after that checkpoint
    next_migration: int = 0
    migration_rounds: int = 0
    owed: dict = field(default_factory=dict)            # island -> repairs it has queued (asked for free)


@dataclass
class Admission:
    fresh: list                       # candidates to evaluate now
    known: list                       # (candidate, result) dicts of kernels evaluated before


class TaskLedger:
    """Admission and dedupe, budget, leftover sharing, batches, replay, and the per-task tally."""

    def __init__(self, refs: list[str], budget: int, batch: int, migrate_every: int = 2,
                 share_budget: bool = False, saturate_factor: int = 20):
        self.tasks = {r: TaskBook(r, budget=budget, start_budget=budget) for r in refs}
        self.per_task_budget = budget
        self.batch = batch
        self.migrate_every = migrate_every
        self.share_budget = share_budget
        self.saturated_after = saturate_factor * budget
        self.busy: set[tuple[str, int]] = set()           # islands proposing or waiting on a batch
        self.asked: dict[tuple[str, int], int] = {}       # proposals in flight per island
        self.pending: dict[tuple[str, int], set] = {}     # island -> candidate ids in evaluation
        self.done: dict[tuple[str, int], list] = {}       # island -> (candidate, result) dicts so far
        self.owners: dict[str, Owner] = {}
        self.ref_times: dict[tuple[str, str], dict[str, float]] = {}   # (task, hardware class) -> shape -> s

    # -- islands ----------------------------------------------------------------------------------
    def add_island(self, ref: str, label: str) -> int:
        t = self.tasks[ref]
        t.labels.append(label)
        t.generations.append(0)
        t.next_migration = self.migrate_every
        return len(t.labels) - 1

    # -- proposing --------------------------------------------------------------------------------
    def requests(self, out_of_time: bool = False) -> list[tuple[str, int, int]]:
        """(task, island, how many) to ask for now; each is marked busy and its room reserved."""
        if self.share_budget:
            self.share_leftovers()
        if out_of_time:
            return []
        out = []
        for ref, t in self.tasks.items():
            if t.proposals > self.saturated_after:
                continue
            reserved = sum(len(p) for (r, _), p in self.pending.items() if r == ref)
            reserved += sum(n for (r, _), n in self.asked.items() if r == ref)
            for i in range(len(t.labels)):
                left = t.budget - t.spent - reserved
                if (ref, i) in self.busy or (left <= 0 and not t.owed.get(i)):
                    continue
                n = max(0, min(self.batch, left))       # 0: only the repairs it owes
                self.busy.add((ref, i))
                self.asked[(ref, i)] = n
                reserved += n
                out.append((ref, i, n))
        return out

    def admit(self, ref: str, island: int, proposed: list[Candidate]) -> Admission:
        """What an island proposed: kernels never evaluated (within the budget left) go to the
        evaluators; kernels evaluated before come back as known results; when nothing is new the
        island is free to be asked again."""
        t = self.tasks[ref]
        self.asked.pop((ref, island), None)
        label = t.labels[island]
        fresh, known, keys = [], [], {}
        for c in proposed:
            t.proposals += 1
            key = (label, source_hash(c.source, c.params))
            if c.source.strip() and key in t.seen:
                if key in t.known:       # evaluated before (maybe by another island): its result
                    known.append(t.known[key])
                continue
            t.seen.add(key)
            fresh.append(c)
            keys[c.id] = key
        # a repair finishes the proposal of the failed child it fixes: the budget counted that one
        free = [c for c in fresh if c.origin in FREE]
        fresh = [c for c in fresh if c.origin not in FREE]
        room = max(0, t.budget - t.spent)
        for c in fresh[room:]:          # over the budget: may be proposed again later
            t.seen.discard(keys[c.id])
        fresh = fresh[:room]
        t.spent += len(fresh)
        fresh += free
        if not fresh:
            if not known:
                self.busy.discard((ref, island))
                t.owed.pop(island, None)        # nothing came: it has no repair to give (budget spent)
            return Admission([], known)
        self.pending[(ref, island)] = {c.id for c in fresh}
        self.done[(ref, island)] = list(known)
        for c in fresh:
            self.owners[c.id] = Owner(ref, island, keys[c.id])
        return Admission(fresh, known)

    def failed_proposal(self, ref: str, island: int) -> None:
        """The island died while proposing: it is free again once restored."""
        self.asked.pop((ref, island), None)
        self.busy.discard((ref, island))

    # -- results ----------------------------------------------------------------------------------
    def submit_seed(self, ref: str, label: str, c: Candidate) -> bool:
        """A seed kernel to evaluate once per task and hardware class; False if done before (resume)."""
        t = self.tasks[ref]
        key = (label, source_hash(c.source, c.params))
        if key in t.seen:
            return False
        t.seen.add(key)
        t.spent += 1
        self.owners[c.id] = Owner(ref, -1, key)
        return True

    def seed_result(self, label: str, c: Candidate, r: EvalResult, baseline_name: str) -> None:
        t = self.tasks[c.task]
        self.owners.pop(c.id, None)
        t.seed_pairs.setdefault(label, []).append((c.to_dict(), r.to_dict()))
        self.record(label, c, r)
        if c.origin == f"seed:{baseline_name}" and r.correct:
            t.baselines[label] = r.speedup

    def one_denominator(self, label: str, c: Candidate, r: EvalResult) -> None:
        """Every speedup of a task on one hardware class over the same reference time per shape: the
        first one measured (the seeds', evaluated first). An evaluator re-times its reference after
        a restart, under whatever load there is then; archives compare speedups a few percent
        apart, so a drifting denominator would decide between kernels. The evaluator's own figure
        stays in `facts["ref_times_measured"]`."""
        if not r.ref_times:
            return
        canon = self.ref_times.setdefault((c.task, label), {})
        for shape, s in r.ref_times.items():
            canon.setdefault(shape, s)
        if any(canon[s] != v for s, v in r.ref_times.items()):
            r.facts["ref_times_measured"] = dict(r.ref_times)
            r.ref_times = {s: canon[s] for s in r.ref_times}

    def record(self, label: str, c: Candidate, r: EvalResult, key: tuple | None = None) -> None:
        """Count a result and keep the task's best, overall and per hardware class."""
        self.one_denominator(label, c, r)
        t = self.tasks[c.task]
        if c.source.strip():
            t.known[key or (label, source_hash(c.source, c.params))] = (c.to_dict(), r.to_dict())
        t.results[c.id] = r.to_dict()
        t.evaluated += 1
        t.correct += bool(r.correct)
        if t.best is None or r.fitness > t.best[1].fitness:
            t.best = (c, r)
        if label not in t.best_by or r.fitness > t.best_by[label][1].fitness:
            t.best_by[label] = (c, r)

    def result(self, label: str, c: Candidate, r: EvalResult) -> tuple[str, int, list] | None:
        """A finished evaluation. Returns (task, island, pairs) when it completes an island's batch
        (the island ingests them), or (task, island, [pair]) for a migrant to hand to its island."""
        own = self.owners.pop(c.id)
        self.record(label, c, r, own.key)
        pair = (c.to_dict(), r.to_dict())
        if own.retime:
            return own.task, own.island, [pair]
        slot = (own.task, own.island)
        self.pending[slot].discard(c.id)
        self.done[slot].append(pair)
        if self.pending[slot]:
            return None
        del self.pending[slot]
        return own.task, own.island, self.done.pop(slot)

    def is_retime(self, cand_id: str) -> bool:
        o = self.owners.get(cand_id)
        return bool(o and o.retime)

    # -- ingesting --------------------------------------------------------------------------------
    def ingested(self, ref: str, island: int, pairs: list, generation: int, state: dict | None,
                 exhausted: bool = False, repairs: int = 0) -> bool:
        """An island took its batch; True when every island of the task is due to migrate. An island
        that queued repairs is asked for them even once the budget is spent (they are free)."""
        t = self.tasks[ref]
        t.owed[island] = repairs
        self.busy.discard((ref, island))
        if exhausted:                  # its proposer spent the LLM budget: the task is done
            t.spent = max(t.spent, t.budget)
        t.generations[island] = generation
        if state is not None:
            t.checkpoints[island] = state
            t.since[island] = []
        else:
            t.since.setdefault(island, []).extend(pairs)
        return min(t.generations) >= t.next_migration

    def replay(self, ref: str, island: int, missed: list = ()) -> tuple[dict | None, list]:
        """What a restarted island needs: its last checkpoint (None: start from the seeds) and the
        pairs ingested since, plus any it missed. Those count as ingested after the checkpoint."""
        t = self.tasks[ref]
        missed = t.since.pop(island, []) + list(missed)
        state = t.checkpoints.get(island)
        t.generations[island] = state["generation"] if state else 0
        if missed:
            t.since[island] = missed
        pairs = missed if state else t.seed_pairs.get(t.labels[island], []) + missed
        return state, pairs

    # -- migration --------------------------------------------------------------------------------
    def migration_due(self, ref: str) -> int:
        """Start a migration round: its number."""
        t = self.tasks[ref]
        t.next_migration += self.migrate_every
        t.migration_rounds += 1
        return t.migration_rounds

    def known_on(self, ref: str, label: str, c: dict) -> tuple | None:
        return self.tasks[ref].known.get((label, source_hash(c["source"], c["params"])))

    def retime(self, ref: str, copy: Candidate, label: str, dst: int) -> bool:
        """A migrant to time again on another hardware class, if the budget allows."""
        t = self.tasks[ref]
        if t.spent >= t.budget:
            return False
        t.spent += 1
        self.owners[copy.id] = Owner(ref, dst, (label, source_hash(copy.source, copy.params)), retime=True)
        return True

    # -- budget -----------------------------------------------------------------------------------
    def share_leftovers(self) -> None:
        """A task that can use no more of its share (its islands keep proposing kernels already
        evaluated) and has nothing in flight hands what is left to the tasks that can, evenly."""
        done = [t for t in self.tasks.values() if t.proposals > self.saturated_after and t.spent < t.budget
                and not any(r == t.ref for r, _ in self.busy)]
        for t in done:
            takers = [o for o in self.tasks.values() if o is not t and o.proposals <= self.saturated_after]
            if not takers:
                return
            left, t.budget = t.budget - t.spent, t.spent
            for k, o in enumerate(takers):
                o.budget += left // len(takers) + (1 if k < left % len(takers) else 0)

    def ran_dry(self, ref: str) -> dict[str, Any]:
        """Whether a task ran out of new kernels (its islands only proposed kernels already
        evaluated, `saturate_factor` x its budget times over) and what moved: evaluations it gave
        to other tasks, or took from tasks that ran dry."""
        t = self.tasks[ref]
        dry = t.proposals > self.saturated_after
        unspent = max(0, t.budget - t.spent)
        return {"ran_dry": dry, "proposals": t.proposals, "budget": t.budget,
                "budget_given": max(0, t.start_budget - t.budget),
                "budget_taken": max(0, t.budget - t.start_budget),
                "budget_unspent": unspent}

    def total_budget(self) -> int:
        return sum(t.budget for t in self.tasks.values())

    def total_spent(self) -> int:
        return sum(t.spent for t in self.tasks.values())

    # -- the tally ----------------------------------------------------------------------------------
    def tally(self, ref: str, default_label: str, labels: set | None = None) -> dict[str, Any]:
        """The task's counts and best for the summary (keys as in summary.json's per-task entry);
        the best's hardware class is its own if known (`labels`), else `default_label`."""
        t = self.tasks[ref]
        best_c, best_r = t.best if t.best else (None, None)
        ok = bool(best_r and best_r.correct)
        label = best_r.hardware if ok and best_r.hardware in (labels or set()) else default_label
        baseline = t.baselines.get(label, 0.0)
        return {
            "correct": ok,
            "best_speedup_vs_reference": round(best_r.speedup, 4) if ok else 0.0,
            "best_speedup_vs_seed": round(best_r.speedup / baseline, 4) if ok and baseline > 0 else 0.0,
            "best_hardware": label if ok else None,
            "best_by_hardware": {lb: round(r.speedup, 4) for lb, (_, r) in t.best_by.items() if r.correct},
            "best_candidate": best_c.id if ok else None,
            "best_params": best_c.params if ok else {},
            "evaluated": t.evaluated,
            "correct_count": t.correct,
            "migrations": t.migration_rounds,
        }

    def adopt_tuned_params(self, ref: str, records: list[dict], mine: set) -> None:
        """The inner tuner's best setting becomes the params of the ledger's copies of a candidate."""
        t = self.tasks[ref]
        tuned = {r["candidate_id"]: r["params"] for r in records if r.get("params") and r["candidate_id"] in mine}
        for c, _ in ([t.best] if t.best else []) + list(t.best_by.values()):
            if c.id in tuned:
                c.params = dict(tuned[c.id])
