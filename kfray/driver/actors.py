"""The run's Ray actors: evaluators per hardware class (with their queue), the compile-cache
server, the prompt evolver and the islands; and their release at the end."""
from __future__ import annotations

import time
from dataclasses import dataclass

import ray

from kfray.config import EvalConfig
from kfray.errors import KfrayError
from kfray.eval.evaluator import make_evaluators, release_gangs
from kfray.eval.queue import EvalQueue
from kfray.languages import language_of
from kfray.search.prompt_evolver import evolver_name, make_prompt_evolver
from kfray.search.island import IslandActor


def when_up(call, wait_s: float = 120.0):
    """The answer to `call()` (a fresh actor call each try). While Ray restarts a killed actor it
    answers ActorUnavailableError (islands run with max_task_retries=0): ask again until it is back."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return ray.get(call())
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


@dataclass
class HardwareClass:
    """One kind of device: its evaluators, their queue, the language its kernels are written in."""

    label: str
    cfg: EvalConfig
    language: str
    evaluators: list
    queue: EvalQueue
    facts: dict


def start_classes(co) -> None:
    """Evaluators of every hardware class (and the shared compile cache), then the prompt evolver."""
    co.classes = []
    # The server only pays between nodes: on one node every evaluator shares its disk cache, and
    # the server was one more process (~2 CPU-s to start) that every build was copied into.
    if any(e.share_cache for e in co.class_cfgs) and sum(1 for n in ray.nodes() if n.get("Alive")) > 1:
        from kfray.eval.compile_cache import CacheServer
        server = ray.remote(CacheServer).options(name=f"{co.name}-compile-cache", num_cpus=0).remote()
        co.actors.append(server)
        for e in co.class_cfgs:
            if e.share_cache:
                e.cache_server = f"{co.name}-compile-cache"
    for n, e in enumerate(co.class_cfgs):
        count = e.evaluators
        if count == 0 and e.backend in ("cuda", "torch_ext_cuda"):
            count = int(ray.cluster_resources().get("GPU", 0))
        if count < 1:
            raise KfrayError(f"no evaluators: eval.evaluators is {e.evaluators} and the cluster offers no "
                             f"device for backend {e.backend}")
        evaluators = make_evaluators(e.backend, e, count, co.name, label=e.label or f"{e.backend}{n or ''}")
        co.actors += evaluators
        try:
            infos = ray.get([ev.info.remote() for ev in evaluators], timeout=300)
        except ray.exceptions.GetTimeoutError:
            raise KfrayError(f"evaluators did not start within 300 s: the cluster may lack the resources "
                             f"they ask for (backend {e.backend}, num_cpus={e.num_cpus}, resources "
                             f"{e.resources or '-'}; {count} of them); lower eval.evaluators or add nodes") from None
        label = e.label or infos[0]["hardware"]
        co.placement.update({i["name"]: i.get("node", "") for i in infos})
        if any(c.label == label for c in co.classes):
            raise KfrayError(f"two hardware classes are both called {label!r}; give each a `label`")
        # One job queued behind the running one hides the dispatch latency; GPU evaluators also
        # compile ahead on `compile_workers` threads.
        depth = 2 if e.backend in ("cpu", "sim") else e.compile_workers + 1
        co.classes.append(HardwareClass(label, e, language_of(e), evaluators, EvalQueue(evaluators, depth),
                                        infos[0]["facts"]))
    co.by_label = {c.label: c for c in co.classes}
    co.evaluators = [ev for c in co.classes for ev in c.evaluators]
    co.hardware = co.classes[0].label
    co.device_facts = co.classes[0].facts
    co.evolver = make_prompt_evolver(evolver_name(co.name), co.cfg.prompts, co.cfg.proposer, co.cfg.search.seed)
    co.actors.append(co.evolver)
    if co.cfg.proposer.kind == "llm":      # the endpoints' request limiters live as long as the run
        from kfray.proposers.llm import LLMProposer
        endpoints = {e.url: e for e in LLMProposer(co.cfg.proposer).endpoints.values()}
        co.actors += [e.slots.handle() for e in endpoints.values()]


def start_islands(co, ref: str) -> None:
    """`search.islands` islands per hardware class, each targeting that class's device. Creating
    an actor does not wait for it: every task's islands boot together, while the seeds compile."""
    s = co.cfg.search
    cls = ray.remote(IslandActor)
    handles = co.islands.setdefault(ref, [])
    for hc in co.classes:
        for _ in range(s.islands):
            i = co.ledger.add_island(ref, hc.label)
            # No CPUs reserved (they wait on proposers and actors) and spread over the cluster,
            # so islands are not all pinned to the head node.
            a = cls.options(name=f"{co.name}-island-{ref}-{i}", num_cpus=0, max_restarts=-1,
                            max_task_retries=0, scheduling_strategy="SPREAD").remote(
                i, ref, hc.language, s, co.cfg.proposer, evolver_name(co.name), hc.facts, hc.label, s.seed)
            handles.append(a)
            co.actors.append(a)


def shutdown(co) -> None:
    """Evaluators close their sandboxes; every actor and placement group of the run is released."""
    try:
        ray.get([e.shutdown.remote() for e in getattr(co, "evaluators", [])], timeout=10)
    except Exception:
        pass
    for a in co.actors:
        try:
            ray.kill(a)
        except Exception:
            pass
    release_gangs(co.name)
