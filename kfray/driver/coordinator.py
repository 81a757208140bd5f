"""The coordinator: runs one search from a RunConfig and writes the run folder.

It owns no search logic: islands breed, evaluators measure, the prompt evolver evolves, and the
ledger keeps the books. The coordinator starts the actors, moves candidates between them, and is
the only writer of the run database. SIGTERM (scancel, `ray job stop`, a preempted node) and
Ctrl-C end a run the same way: what finished is recorded, actors are released, one line says
how to resume.
"""
from __future__ import annotations

import math
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray

from kfray.candidate import Candidate, EvalResult
from kfray.cluster import connect
from kfray.config import RunConfig, hardware_classes
from kfray.driver.actors import shutdown, start_classes, start_islands, when_up
from kfray.driver.finish import finish
from kfray.driver.ledger import TaskLedger
from kfray.driver.loop import event_loop
from kfray.errors import KfrayError, RunStopped
from kfray.languages import language_of
from kfray.proposers.slots import fit_to_endpoint
from kfray.search.archive import Archive
from kfray.descriptors import describe
from kfray.source import parse_params, source_hash
from kfray.store import Store
from kfray.tasks import load_task


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


class Coordinator:
    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, progress: bool = True,
                 resume: bool = False):
        self.cfg = cfg
        fitted = fit_to_endpoint(cfg)                 # one local LLM slot: islands and batch that keep it busy
        if fitted and progress:
            print(f"kfray: {fitted}", file=sys.stderr, flush=True)
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
        s = cfg.search
        self.ledger = TaskLedger(list(self.tasks), s.budget, s.batch, s.migrate_every, s.share_budget)
        self.islands: dict[str, list] = {}            # task -> island actor handles
        self.cross_hardware: list[dict] = []
        self.notes: list[str] = []                   # evaluators marked down for a task, and why
        self.placement: dict[str, str] = {}          # actor name -> Ray node id
        self.name = f"kfray-{self.run_dir.name}-{int(time.time() * 1000) % 10**8}"
        self.actors: list = []
        self.migrations = 0
        self.island_restores = 0
        self.stopping: str = ""                       # the signal that asked the run to stop
        self._last_prompt_save = 0.0

    # --- the run -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t_start = time.time()
        connect(self.cfg.address, num_cpus=int(math.ceil(sum(e.evaluators * e.num_cpus for e in self.class_cfgs))))
        self.store = Store(self.run_dir / "kfray.db")
        prior = self.store.meta() if self.resume else {}
        self.store.set_meta(config=self.cfg.to_dict(), status="running", name=self.name,
                            **({"resumed": prior.get("resumed", 0) + 1} if self.resume else {"started": t_start}))
        handlers = self._catch_signals()              # after ray.init, which installs its own
        try:
            start_classes(self)
            self.store.set_meta(hardware=self.hardware, device_facts=self.device_facts,
                                hardware_classes={c.label: c.facts for c in self.classes})
            if "prompt_population" in prior:
                ray.get(self.evolver.restore.remote(prior["prompt_population"]))
            if self.resume:
                self._load_progress()
            for ref in self.tasks:            # actors boot (imports, task loading) while seeds compile
                start_islands(self, ref)
            self._evaluate_seeds()
            ray.get([call for ref in self.tasks for call in self._fill_islands(ref)])   # all at once
            event_loop(self, t_start)
            if self.stopping:
                raise self._stopped(t_start)
            return finish(self, t_start)
        finally:
            if handlers:
                signal.signal(signal.SIGTERM, handlers[0])
                signal.signal(signal.SIGINT, handlers[1])
            shutdown(self)
            self.store.close()

    def _catch_signals(self) -> tuple | None:
        """SIGTERM and Ctrl-C ask the loop to stop (a second one stops at once). Only the main
        thread may install handlers: a run in another thread (an embedding program) keeps theirs."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def stop(signum, frame):
            if self.stopping:
                raise KeyboardInterrupt
            self.stopping = signal.Signals(signum).name
        return signal.signal(signal.SIGTERM, stop), signal.signal(signal.SIGINT, stop)

    def _stopped(self, t_start: float) -> RunStopped:
        """Record what finished, mark the run stopped and write its summary as a finished run does;
        the error's one line says how to go on."""
        rows = []
        for label, c, r in self.poll():
            if c.id in self.ledger.owners:       # counted in the summary, as the loop would have
                self.ledger.result(label, c, r)
            rows.append((c, r, None))
        self.store.add_candidates(rows)
        self.store.set_meta(status="stopped", stopped=time.time())
        try:
            finish(self, t_start, stopped=self.stopping)
        except Exception as e:        # the summary is a convenience; what was recorded stays
            print(f"kfray: the stopped run's summary could not be written ({type(e).__name__}: {e})",
                  file=sys.stderr)
        n = self.store.count("candidates")
        return RunStopped(f"stopped by {self.stopping} with {n} candidates recorded; "
                          f"`kfray resume {self.run_dir}` continues it", self.stopping)

    # --- evaluations -----------------------------------------------------------------------------
    def pending(self) -> int:
        return sum(len(c.queue) for c in self.classes)

    def poll(self) -> list[tuple[str, Candidate, EvalResult]]:
        """Finished evaluations of every class, each result labelled with its hardware class."""
        out = []
        for hc in self.classes:
            for c, r in hc.queue.poll(0):
                r.hardware = hc.label
                out.append((hc.label, c, r))
            while hc.queue.notes:                 # an evaluator that cannot run a task: said once
                note = f"{hc.label}: {hc.queue.notes.pop(0)}"
                print(f"kfray: {note}", file=sys.stderr, flush=True)
                self.notes.append(note)
                self.store.set_meta(notes=self.notes)
        return out

    def check_runnable(self) -> None:
        """A task no evaluator of any class can run is down (its candidates come back failed, with
        the reason); when that is every task, the run cannot do anything: one error that says why."""
        why = {}
        for ref in self.tasks:
            reasons = [hc.queue.cannot_run(ref) for hc in self.classes]
            if all(reasons):
                why[ref] = reasons[0]
        if why and len(why) == len(self.tasks):
            ref = next(iter(why))
            raise KfrayError(f"no evaluator can run task {ref}: {why[ref]}")

    def _evaluate_seeds(self) -> None:
        """Each seed kernel is evaluated once per task and hardware class, and shared by the islands
        of that class."""
        pending = 0
        for ref in self.tasks:
            for hc in self.classes:
                for seed in self.tasks[ref].seeds_for(hc.language):
                    c = Candidate(task=ref, language=hc.language, source=seed.source, origin=f"seed:{seed.name}",
                                  params=parse_params(seed.source).default())
                    c.cell = describe(c.source, c.language)
                    if self.ledger.submit_seed(ref, hc.label, c):      # False: resumed, done before
                        pending += 1
                        hc.queue.submit(c)
        while pending and not self.stopping:
            for label, c, r in self.poll():
                pending -= 1
                self.ledger.seed_result(label, c, r, self.tasks[c.task].seeds_for(self.by_label[label].language)[0].name)
                self.store.add_candidates([(c, r, "seed")])
            self.check_runnable()
            if pending:
                ray.wait([f for hc in self.classes for f in hc.queue.refs()], num_returns=1, timeout=1.0)

    def save_prompts(self, force: bool = False) -> None:
        if not force and time.time() - self._last_prompt_save < 5:
            return
        self._last_prompt_save = time.time()
        snap, prompts = ray.get([self.evolver.snapshot.remote(), self.evolver.all_prompts.remote()])
        self.store.set_meta(prompt_population=snap)
        self.store.upsert_prompts(prompts)

    # --- islands: seeding, resume, recovery ----------------------------------------------------
    def _fill_islands(self, ref: str) -> list:
        """The calls (not yet waited on) that give a task's new islands their seeds, or on resume
        their checkpoints: one wait for every task, not one actor start after another."""
        t = self.ledger.tasks[ref]
        if not self.resume:
            return [isl.seed.remote(t.seed_pairs.get(t.labels[i], [])) for i, isl in enumerate(self.islands[ref])]
        saved = self.store.island_checkpoints(ref)
        evaluated = [(c.to_dict(), r.to_dict()) for c, r in self.store.evaluated(ref)]
        calls = []
        for i, isl in enumerate(self.islands[ref]):
            state = saved.get(i)
            archived = {e["candidate"]["id"] for e in state["archive"]["elites"]} if state else set()
            mine = [(c, r) for c, r in evaluated if c["island"] == i and c["id"] not in archived]
            if state is None:
                calls.append(isl.restore.remote(empty_state(i, ref), t.seed_pairs.get(t.labels[i], []) + mine))
            else:
                t.checkpoints[i] = state
                t.generations[i] = state["generation"]
                calls.append(isl.restore.remote(state, mine))
        every = self.cfg.search.migrate_every
        t.next_migration = (min(t.generations) // every + 1) * every
        return calls

    def recover_island(self, ref: str, i: int, missed: list = ()) -> None:
        """An island actor died (Ray restarted it empty): give it back its last checkpoint."""
        self.island_restores += 1
        state, pairs = self.ledger.replay(ref, i, missed)
        isl = self.islands[ref][i]
        when_up(lambda: isl.restore.remote(state or empty_state(i, ref), pairs))

    def _load_progress(self) -> None:
        """Resume: what the database already holds is spent budget and is never evaluated again."""
        led = self.ledger
        for ref, t in led.tasks.items():
            # The hash each candidate had when proposed: the inner tuner may have changed its stored
            # params since, and the same proposal must not be evaluated again after a resume.
            for hardware, h in self.store.proposed_keys(ref):
                t.seen.add(((self.by_label.get(hardware) or self.classes[0]).label, h))
            for c, r in self.store.evaluated(ref):
                hc = self.by_label.get(r.hardware) or self.classes[0]
                key = (hc.label, source_hash(c.source, c.params))
                t.spent += 1
                t.seen.add(key)
                if c.origin.startswith("seed:"):
                    base = self.tasks[ref].seeds_for(hc.language)     # this class's own baseline seed
                    led.seed_result(hc.label, c, r, base[0].name if base else "")
                else:
                    led.record(hc.label, c, r, key)
            t.migration_rounds = self.store.migration_rounds(ref)
            self.migrations += t.migration_rounds


def empty_state(index: int, task: str) -> dict:
    """A state with nothing in it, for `restore` to replay results into an island seeded afresh."""
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
