"""One limit on LLM requests in flight per endpoint, shared by every island and task of a cluster.

A local server (llama.cpp, Ollama) answers one request at a time: if every island sends at once,
requests queue inside the server past the client's timeout, the client drops them and retries
send them again. Instead, a caller first takes a slot here and only then sends its request; the
wait for a slot is not part of the request, so it never counts against the request's timeout.

`Slots` is the pure bookkeeping: waiters served in the order of their rank, then of arrival, and
leases that expire unless renewed, so a process that died holding a slot gives it back within
`lease_s`. A request's rank is when its island's batch began (kfray.proposers.llm): an island that
began first gets each of its requests (the proposals of its batch, a retry as a whole file, a
repair) before islands that began later, so its batch goes to evaluation whole while theirs wait,
rather than every batch being finished only when all of them are. `SlotsActor` is its Ray shell
(a named actor per endpoint, found by every island); `LocalSlots` serves a process without Ray.
"""
from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import deque
from contextlib import contextmanager
from urllib.parse import urlparse

from kfray.proposers.futile import FutilePrompts

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
LEASE_S = 30.0              # a holder renews every LEASE_S / 3; a dead one's slot frees after this
# A freed slot waits this long for the next request of the batch that freed it before a later
# batch may take it: between two requests of a batch its island reads the answer and writes the
# next prompt, and a waiter polling meanwhile would otherwise cut in.
LINGER_S = 0.25
_POLL_S = 0.05
LOCAL_EVOLVE_EVERY = 12     # results between new meta-prompts on a one-slot endpoint (fit_to_endpoint)
# The prompt budget on a one-slot endpoint (fit_to_endpoint): a 1.5B model on 2 cores read prompts at
# 53 tokens/s, half of each request's 53 s, and the 3000-token budget let archive kernels and advice
# ride along beside a parent of up to 2400 tokens. With 1500 the task, contract, parent and output
# format stay whole; what is optional goes first where the parent is long.
LOCAL_PROMPT_TOKENS = 1500


def is_local(url: str) -> bool:
    return (urlparse(url).hostname or "") in LOCAL_HOSTS


def fit_to_endpoint(cfg) -> str:
    """With one LLM endpoint that answers one request at a time (a local server), islands ask one
    proposal at a time (search.batch 1: each answer goes to evaluation as it arrives), at most 2
    islands per task share the slot (no island waits for more than a few answers), they migrate
    after every generation (search.migrate_every 1: a generation is one answer per island, so that
    elites move within minutes), and the model answers with whole files (proposer.edit_mode
    rewrite: a 1.5B model's SEARCH/REPLACE edits failed to apply 8 times in 23, and each failure
    cost a second request for the whole file), and a new meta-prompt is written every
    LOCAL_EVOLVE_EVERY results rather than 6 (each is a request that evaluates nothing: 4 of 48 in a
    45-minute run), prompts are held to LOCAL_PROMPT_TOKENS, and a failed child is mended by the
    fix-ups only, never sent back to the model (proposer.repair_asks off: in three 45-minute runs a
    1.5B model's repairs were 0 of 9 correct, the fix-ups' 10 of 19, and a repair takes the slot
    for a whole answer), and an answer that repeats a kernel is edited by kfray at once rather than
    asked again (proposer.repeat_asks 0: half of a 1.5B model's answers were repeats, and the
    re-asks repeated as often), and sources are shown and asked for without comments
    (proposer.comments false: the server read and wrote for 100 % of a 45-minute run, 60 % of it
    writing, and a fifth of a kernel's characters are comments); only where the configuration did
    not set them.
    Returns the line that says what was chosen ("" if nothing)."""
    import os

    p = cfg.proposer
    if p.kind != "llm" or p.models:
        return ""
    url = p.base_url or os.environ.get("OPENAI_BASE_URL", "")
    if not url or default_limit(url, p.max_concurrent) > 1:
        return ""
    given = getattr(cfg, "explicit", frozenset())
    chosen = []
    if "search.batch" not in given and cfg.search.batch != 1:
        cfg.search.batch = 1
        chosen.append("search.batch=1")
    if "search.islands" not in given and cfg.search.islands > 2:
        cfg.search.islands = 2
        chosen.append("search.islands=2")
    if "search.migrate_every" not in given and cfg.search.migrate_every > 1:
        cfg.search.migrate_every = 1
        chosen.append("search.migrate_every=1")
    if "proposer.edit_mode" not in given and p.edit_mode == "auto":
        p.edit_mode = "rewrite"
        chosen.append("proposer.edit_mode=rewrite")
    if "prompts.evolve_every" not in given and cfg.prompts.evolve_every < LOCAL_EVOLVE_EVERY:
        cfg.prompts.evolve_every = LOCAL_EVOLVE_EVERY
        chosen.append(f"prompts.evolve_every={LOCAL_EVOLVE_EVERY}")
    if "proposer.prompt_tokens" not in given and p.prompt_tokens > LOCAL_PROMPT_TOKENS:
        p.prompt_tokens = LOCAL_PROMPT_TOKENS
        chosen.append(f"proposer.prompt_tokens={LOCAL_PROMPT_TOKENS}")
    if "proposer.comments" not in given and p.comments:
        p.comments = False
        chosen.append("proposer.comments=false")
    if "proposer.repeat_asks" not in given and p.repeat_asks > 0:
        p.repeat_asks = 0
        chosen.append("proposer.repeat_asks=0")
    if "proposer.repair_asks" not in given and p.repair and p.repair_asks:
        p.repair_asks = False
        chosen.append("proposer.repair_asks=false")
    if not chosen:
        return ""
    return (f"{url} answers one request at a time: {', '.join(chosen)}, so that each answer is "
            "evaluated as it arrives and costs one request (set them to override)")


def default_limit(url: str, configured: int) -> int:
    """`proposer.max_concurrent`, or when 0: 1 for a server on this machine, 16 for a remote API."""
    if configured > 0:
        return configured
    return 1 if is_local(url) else 16


class Slots:
    """Leases on `limit` slots, granted first come first served. Pure; the clock is passed in."""

    def __init__(self, limit: int):
        self.limit = max(1, int(limit))
        self.held: dict[str, float] = {}        # holder -> lease expiry
        self.queue: deque[str] = deque()        # waiters, in arrival order
        self.rank: dict[str, float] = {}        # waiter or holder -> rank (lower first; ties by arrival)
        self.linger: tuple[float, float] | None = None    # (rank, until): a slot kept for that batch
        self.granted = 0
        self.peak = 0

    def set_limit(self, limit: int) -> None:
        self.limit = max(1, int(limit))

    def _expire(self, now: float) -> None:
        for h in [h for h, t in self.held.items() if t <= now]:
            del self.held[h]
            self.rank.pop(h, None)

    def try_take(self, holder: str, now: float, lease_s: float = LEASE_S, rank: float | None = None) -> bool:
        """Queue `holder` (once, with its rank: arrival order where none is given) and grant it a
        slot if it comes first among the waiters and one is free."""
        self._expire(now)
        if holder in self.held:
            return True
        if holder not in self.queue:
            self.queue.append(holder)
            self.rank[holder] = now if rank is None else float(rank)
        mine = self.rank.get(holder, 0.0)
        first = min(self.queue, key=lambda h: self.rank.get(h, 0.0))    # min keeps arrival order on ties
        if self.linger and (now >= self.linger[1] or mine <= self.linger[0]):
            self.linger = None
        if first == holder and len(self.held) < self.limit - (self.linger is not None):
            self.queue.remove(holder)
            self.held[holder] = now + lease_s
            self.granted += 1
            self.peak = max(self.peak, len(self.held))
            return True
        return False

    def renew(self, holder: str, now: float, lease_s: float = LEASE_S) -> bool:
        if holder in self.held:
            self.held[holder] = now + lease_s
            return True
        return False

    def release(self, holder: str, now: float | None = None) -> None:
        """Give the slot back; with `now`, it lingers LINGER_S for its batch's next request."""
        if self.held.pop(holder, None) is not None and now is not None:
            self.linger = (self.rank.get(holder, 0.0), now + LINGER_S)
        self.rank.pop(holder, None)
        try:
            self.queue.remove(holder)
        except ValueError:
            pass

    def stats(self) -> dict:
        return {"limit": self.limit, "in_flight": len(self.held), "waiting": len(self.queue),
                "granted": self.granted, "peak": self.peak}


class SlotsActor:
    """The Ray shell of Slots: an async actor, so many callers can wait on it at once. It also keeps
    the endpoint's futile prompts (kfray.proposers.futile), for every island that asks it."""

    def __init__(self, limit: int):
        self.slots = Slots(limit)
        self.futile = FutilePrompts()

    def note(self, key: str, source: str, params: dict) -> None:
        self.futile.note(key, source, params)

    def remembered(self, key: str) -> tuple[str, dict] | None:
        return self.futile.answer(key)

    async def acquire(self, holder: str, limit: int, lease_s: float = LEASE_S, rank: float | None = None) -> bool:
        self.slots.set_limit(limit)
        while not self.slots.try_take(holder, time.monotonic(), lease_s, rank):
            await asyncio.sleep(_POLL_S)
        return True

    def renew(self, holder: str, lease_s: float = LEASE_S) -> bool:
        return self.slots.renew(holder, time.monotonic(), lease_s)

    def release(self, holder: str, linger: bool = True) -> None:
        self.slots.release(holder, time.monotonic() if linger else None)

    def stats(self) -> dict:
        return self.slots.stats()


class LocalSlots:
    """Slots for the threads of one process (a proposer used without Ray: scripts, tests)."""

    def __init__(self, limit: int):
        self.slots = Slots(limit)
        self.futile = FutilePrompts()
        self._lock = threading.Lock()

    def note(self, key: str, source: str, params: dict) -> None:
        with self._lock:
            self.futile.note(key, source, params)

    def remembered(self, key: str) -> tuple[str, dict] | None:
        with self._lock:
            return self.futile.answer(key)

    def acquire(self, holder: str, limit: int, lease_s: float = LEASE_S, rank: float | None = None) -> bool:
        while True:
            with self._lock:
                self.slots.set_limit(limit)
                if self.slots.try_take(holder, time.monotonic(), lease_s, rank):
                    return True
            time.sleep(_POLL_S)

    def renew(self, holder: str, lease_s: float = LEASE_S) -> bool:
        with self._lock:
            return self.slots.renew(holder, time.monotonic(), lease_s)

    def release(self, holder: str, linger: bool = True) -> None:
        with self._lock:
            self.slots.release(holder, time.monotonic() if linger else None)

    def stats(self) -> dict:
        with self._lock:
            return self.slots.stats()


_LOCAL: dict[str, LocalSlots] = {}
_LOCAL_LOCK = threading.Lock()


def actor_name(url: str) -> str:
    return "kfray-llm-slots-" + hashlib.sha1(url.rstrip("/").encode()).hexdigest()[:12]


_HELD: dict[str, object] = {}       # url -> the named actor this process made with `handle()`


def _in_ray_worker() -> bool:
    import ray

    return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE


class EndpointSlots:
    """The slot limiter of one endpoint: the cluster-wide named actor in a Ray worker (islands are
    actors) or in a process that holds it (a run's driver, `handle()`), else a process-wide
    LocalSlots: a script's proposer in a driver with Ray up does not start an actor (a process, ~2
    CPU-s) for itself. `hold()` is a context manager that keeps the lease renewed."""

    def __init__(self, url: str, limit: int):
        self.url, self.limit = url, max(1, int(limit))
        self._actor = None
        self.waited_s = 0.0                     # time spent waiting for slots, for reports

    def _named(self):
        import ray

        cls = ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=1000)(SlotsActor)
        return cls.options(name=actor_name(self.url), get_if_exists=True).remote(self.limit)

    def _backend(self):
        if self._actor is None:
            self._actor = _HELD.get(self.url) or (self._named() if _in_ray_worker() else None)
        if self._actor is not None:
            return self._actor
        with _LOCAL_LOCK:
            return _LOCAL.setdefault(self.url, LocalSlots(self.limit))

    def handle(self):
        """The endpoint's named actor, created here if missing. A named actor dies with the process
        that created it, so a run's driver calls this first and keeps the handle for the run; the
        proposers of this process then use it too."""
        self._actor = _HELD[self.url] = self._named()
        return self._actor

    def _call(self, method: str, *args):
        b = self._backend()
        if isinstance(b, LocalSlots):
            return getattr(b, method)(*args)
        import ray

        try:
            return ray.get(getattr(b, method).remote(*args))
        except ray.exceptions.RayActorError:    # its owner died with it (or the run that held it
            self._actor = None                  # ended): found or made anew, or this process's own
            if _HELD.get(self.url) is b:
                del _HELD[self.url]
            return ray.get(getattr(self._backend(), method).remote(*args))

    def stats(self) -> dict:
        return self._call("stats")

    def note(self, key: str, source: str, params: dict) -> None:
        """The request `key` came back as a kernel already tried (kfray.proposers.futile)."""
        self._call("note", key, source, params)

    def remembered(self, key: str) -> tuple[str, dict] | None:
        """The answer of a request that came back as a repeat often enough, from any island."""
        return self._call("remembered", key)

    @contextmanager
    def hold(self, holder: str, rank: float | None = None):
        """A slot for `holder` while inside; `rank` orders the waiters, lower first. Ranks are wall
        time (now, where none is given): the callers of one endpoint may be on several machines,
        and monotonic clocks are not comparable across them. Only a request of a batch (a rank
        given) keeps its slot lingering for the batch's next one: a request of its own has none,
        and a caller asking one at a time had waited LINGER_S before each of its requests."""
        t0 = time.monotonic()
        self._call("acquire", holder, self.limit, LEASE_S, time.time() if rank is None else rank)
        self.waited_s += time.monotonic() - t0
        stop = threading.Event()

        def renew():
            while not stop.wait(LEASE_S / 3):
                try:
                    self._call("renew", holder, LEASE_S)
                except Exception:       # the actor restarting: the next renewal tries again
                    pass

        t = threading.Thread(target=renew, daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            try:
                self._call("release", holder, rank is not None)
            except Exception:
                pass                    # the lease runs out by itself
