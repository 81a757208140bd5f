"""Migration rounds: the top elites of each island go to its neighbours along the topology.

Between islands of one hardware class the elites' timings stand. An elite that crosses to other
hardware (same language) is timed again there first, and competes with that result.

Nothing here waits: an island may be in the middle of a minute-long LLM call, and the driver must
keep polling results meanwhile. A round asks every island for its emigrants (`Migrations.start`),
sends them on once all have answered (`step`, from the event loop), and records each accepted
migrant when its destination has taken it.
"""
from __future__ import annotations

import ray

from kfray.candidate import Candidate, EvalResult
from kfray.search.migration import destinations


class Migrations:
    """The rounds in flight of one run."""

    def __init__(self, co):
        self.co = co
        self.asking: dict[tuple, tuple[str, int]] = {}       # emigrants futures -> (task, round)
        self.sending: dict = {}                              # immigrate future -> rows waiting for its answer
        self.arrived: set = set()                            # emigrants futures in, their round's others not

    def refs(self) -> list:
        """What the loop sleeps on. Not an island's emigrants already in while its round waits for an
        island in a minute-long LLM call: the loop's wait would return at once, every time (the
        driver spun at a third of a core through a 45-minute local-model run, beside the model)."""
        return [f for futs in self.asking for f in futs if f not in self.arrived] + list(self.sending)

    def start(self, ref: str) -> None:
        co, s, led = self.co, self.co.cfg.search, self.co.ledger
        islands = co.islands[ref]
        if len(islands) < 2 or s.migrants == 0:
            led.tasks[ref].next_migration += s.migrate_every
            return
        round_ = led.migration_due(ref)
        co.migrations += 1
        self.asking[tuple(isl.emigrants.remote(s.migrants) for isl in islands)] = (ref, round_)

    def step(self) -> None:
        """Send on the rounds whose emigrants are all in; record the migrants that were taken."""
        for futs, (ref, round_) in list(self.asking.items()):
            self.arrived.update(ray.wait(list(futs), num_returns=len(futs), timeout=0)[0])
            if not self.arrived.issuperset(futs):
                continue
            del self.asking[futs]
            self.arrived.difference_update(futs)
            try:
                outgoing = ray.get(list(futs))
            except ray.exceptions.RayActorError:
                continue        # an island died mid-round: its next ingest brings it back
            self._send(ref, round_, outgoing)
        if not self.sending:
            return
        rows = []
        for fut in ray.wait(list(self.sending), num_returns=len(self.sending), timeout=0)[0]:
            waiting = self.sending.pop(fut)
            try:
                accepted = ray.get(fut) > 0
            except ray.exceptions.RayActorError:
                accepted = False
            rows += [(*row, accepted) for row in waiting]
        if rows:
            self.co.store.add_migrations(rows)

    def _send(self, ref: str, round_: int, outgoing: list) -> None:
        co, led = self.co, self.co.ledger
        islands, labels = co.islands[ref], led.tasks[ref].labels
        rows = []
        for src, dsts in destinations(co.cfg.search.topology, len(islands), co.cfg.search.adjacency).items():
            for dst in dsts:
                pairs = outgoing[src]
                a, b = co.by_label[labels[src]], co.by_label[labels[dst]]
                if a is b:
                    fut = islands[dst].immigrate.remote(pairs)
                    self.sending[fut] = [(ref, round_, src, dst, c["id"]) for c, _ in pairs]
                elif a.language == b.language:
                    for c, _ in pairs:
                        known = led.known_on(ref, b.label, c)
                        if known:                     # already timed on b: that result competes
                            islands[dst].immigrate.remote([known])
                            rows.append((ref, round_, src, dst, known[0]["id"], True))
                            continue
                        copy = Candidate.from_dict({**c, "id": Candidate(task="", language="", source="").id,
                                                    "island": dst, "parent_id": c["id"],
                                                    "origin": f"migrant:{a.label}"})
                        if not led.retime(ref, copy, b.label, dst):     # timing it again would overspend
                            break
                        b.queue.submit(copy)
                        rows.append((ref, round_, src, dst, c["id"], True))
        if rows:
            co.store.add_migrations(rows)


def arrive(co, ref: str, dst: int, pair: tuple[dict, dict]) -> None:
    """A migrant's result on its new hardware: record the cross-hardware pair, then it competes."""
    c, r = Candidate.from_dict(pair[0]), EvalResult.from_dict(pair[1])
    origin = EvalResult.from_dict(co.ledger.tasks[ref].results[c.parent_id])
    co.cross_hardware.append({
        "task": ref, "kernel": c.parent_id, "tuned_on": origin.hardware, "timed_on": r.hardware,
        "speedup_tuned_on": round(origin.speedup, 4), "speedup_timed_on": round(r.speedup, 4),
        "tier_timed_on": r.tier})
    co.islands[ref][dst].immigrate.remote([pair])      # in order after the island's other calls; no wait
