"""Migration rounds: the top elites of each island go to its neighbours along the topology.

Between islands of one hardware class the elites' timings stand. An elite that crosses to other
hardware (same language) is timed again there first, and competes with that result."""
from __future__ import annotations

import ray

from kfray.candidate import Candidate, EvalResult
from kfray.search.migration import destinations


def migrate(co, ref: str) -> None:
    s, led = co.cfg.search, co.ledger
    islands = co.islands[ref]
    labels = led.tasks[ref].labels
    if len(islands) < 2 or s.migrants == 0:
        led.tasks[ref].next_migration += s.migrate_every
        return
    round_ = led.migration_due(ref)
    co.migrations += 1
    outgoing = ray.get([isl.emigrants.remote(s.migrants) for isl in islands])
    rows = []
    for src, dsts in destinations(s.topology, len(islands), s.adjacency).items():
        for dst in dsts:
            pairs = outgoing[src]
            a, b = co.by_label[labels[src]], co.by_label[labels[dst]]
            if a is b:
                accepted = ray.get(islands[dst].immigrate.remote(pairs))
                rows += [(ref, round_, src, dst, c["id"], accepted > 0) for c, _ in pairs]
            elif a.language == b.language:
                for c, _ in pairs:
                    known = led.known_on(ref, b.label, c)
                    if known:                     # already timed on b: that result competes
                        ray.get(islands[dst].immigrate.remote([known]))
                        rows.append((ref, round_, src, dst, known[0]["id"], True))
                        continue
                    copy = Candidate.from_dict({**c, "id": Candidate(task="", language="", source="").id,
                                                "island": dst, "parent_id": c["id"], "origin": f"migrant:{a.label}"})
                    if not led.retime(ref, copy, b.label, dst):     # timing it again would overspend
                        break
                    b.queue.submit(copy)
                    rows.append((ref, round_, src, dst, c["id"], True))
    co.store.add_migrations(rows)


def arrive(co, ref: str, dst: int, pair: tuple[dict, dict]) -> None:
    """A migrant's result on its new hardware: record the cross-hardware pair, then it competes."""
    c, r = Candidate.from_dict(pair[0]), EvalResult.from_dict(pair[1])
    origin = EvalResult.from_dict(co.ledger.tasks[ref].results[c.parent_id])
    co.cross_hardware.append({
        "task": ref, "kernel": c.parent_id, "tuned_on": origin.hardware, "timed_on": r.hardware,
        "speedup_tuned_on": round(origin.speedup, 4), "speedup_timed_on": round(r.speedup, 4),
        "tier_timed_on": r.tier})
    ray.get(co.islands[ref][dst].immigrate.remote([pair]))
