"""The thin Ray loop: asks the ledger which islands to ask for proposals, sends what it admits to
the evaluators, hands finished batches to their islands, and records each state change once.
All policy (dedupe, budget, batches, replay) is the ledger's."""
from __future__ import annotations

import time
from typing import Any

import ray

from kfray.candidate import Candidate
from kfray.driver.migrate import Migrations, arrive
from kfray.driver.progress import Progress


def event_loop(co, t_start: float) -> None:
    s, led = co.cfg.search, co.ledger
    proposing: dict[Any, tuple[str, int]] = {}
    ingesting: dict[Any, tuple[str, int, list]] = {}
    bar = Progress(co.progress, led.total_budget(), led)
    bar.advance(led.total_spent())
    deadline = t_start + s.time_limit_s if s.time_limit_s > 0 else float("inf")
    mig = Migrations(co)
    wound_down = False
    while not co.stopping:
        if not wound_down and led.total_budget() - led.total_spent() < co.cfg.prompts.evolve_every:
            co.evolver.wind_down.remote()       # too few proposals left to use a model's new prompt
            wound_down = True
        for ref, i, n in led.requests(out_of_time=time.time() > deadline):
            proposing[co.islands[ref][i].propose.remote(n)] = (ref, i)
        waitable = list(proposing) + list(ingesting)
        if not waitable and not co.pending() and not mig.refs():
            break
        # Sleep until anything at all completes (no busy polling: the driver's CPU is the engine's
        # overhead), then take everything that is ready.
        ray.wait(waitable + mig.refs() + [r for hc in co.classes for r in hc.queue.refs()], num_returns=1,
                 timeout=1.0)
        mig.step()
        ready = ray.wait(waitable, num_returns=len(waitable), timeout=0)[0] if waitable else []
        for fut in ready:
            if fut in proposing:
                ref, i = proposing.pop(fut)
                try:
                    proposed = [Candidate.from_dict(d) for d in ray.get(fut)]
                except ray.exceptions.RayActorError:
                    led.failed_proposal(ref, i)
                    co.recover_island(ref, i)
                    continue
                got = led.admit(ref, i, proposed)
                bar.advance(len(got.fresh))
                label = led.tasks[ref].labels[i]
                for c in got.fresh:
                    co.by_label[label].queue.submit(c)
                if not got.fresh and got.known:        # only kernels evaluated before: the island takes them
                    ingesting[co.islands[ref][i].ingest.remote(got.known)] = (ref, i, got.known)
            else:
                ref, i, pairs = ingesting.pop(fut)
                took(co, fut, ref, i, pairs, mig)
        results = co.poll()
        rows = []
        for label, c, r in results:
            retime = led.is_retime(c.id)
            done = led.result(label, c, r)
            rows.append((c, r, None))
            if done and retime:                        # a migrant timed again on its new hardware
                arrive(co, done[0], done[1], done[2][0])
            elif done:
                ref, i, pairs = done
                ingesting[co.islands[ref][i].ingest.remote(pairs)] = (ref, i, pairs)
        co.store.add_candidates(rows)
        co.check_runnable()                # recorded first: nothing polled is lost
        if results:
            bar.update()
    bar.close()


def took(co, fut, ref: str, i: int, pairs: list, mig: Migrations) -> None:
    """An island's answer to a batch: outcomes and transitions recorded, its checkpoint kept, and a
    migration when every island of the task is due."""
    led = co.ledger
    try:
        info = ray.get(fut)
    except ray.exceptions.RayActorError:
        led.busy.discard((ref, i))
        co.recover_island(ref, i, pairs)
        return
    if info["summary"]["generation"] != led.tasks[ref].generations[i] + 1:
        # Killed between calls, Ray restarted it empty and it ingested into nothing: its checkpoint
        # back, plus this batch.
        led.busy.discard((ref, i))
        co.recover_island(ref, i, pairs)
        return
    mine = {c["id"] for c, _ in pairs if c["island"] == i}      # not known kernels of other islands
    co.store.set_outcomes([(r["candidate_id"], r["outcome"]) for r in info["records"] if r["candidate_id"] in mine])
    # parent -> child transitions (the QD gradient's), parameters the inner tuner chose, and an
    # island whose proposer spent its budget (LLM cost/tokens): this task is done
    co.store.add_transitions(ref, info["records"], mine)
    led.adopt_tuned_params(ref, info["records"], mine)
    due = led.ingested(ref, i, pairs, info["summary"]["generation"], info["state"],
                       bool(info["summary"].get("exhausted")), int(info["summary"].get("repairs", 0)))
    if info["state"] is not None:
        co.store.save_islands([info["state"]])
    if info["new_prompts"]:
        co.save_prompts()
    if due:
        mig.start(ref)          # asynchronous: the loop sends the migrants on once all islands answered
