"""EvalQueue: one work queue per hardware class that keeps every evaluator busy.

Pull-style, like `ray.util.ActorPool`: an evaluator gets its next job as soon as it finishes one,
so fast and slow devices share the load. A job whose evaluator dies is put back at the front and
goes to the next free evaluator. Ray restarts the dead one; until a probe call answers, it gets
no work (a node that left the cluster may never bring it back). An evaluator that raises for a task
(no compiler on its node, a task that will not load there) is marked down for that task only, with
the reason in `notes`; its job goes to another evaluator, and where none can run the task it comes
back as a failed evaluation that says why. Nothing polled is lost.
"""
from __future__ import annotations

import collections
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from kfray.candidate import TIER_RUNTIME_ERROR, Candidate, EvalResult

MAX_ATTEMPTS = 3


class EvalQueue:
    def __init__(self, evaluators: list, depth: int = 1):
        self.evaluators = list(evaluators)
        self.depth = depth
        self.waiting: collections.deque[Candidate] = collections.deque()
        self.in_flight: dict[Any, tuple[Candidate, int]] = {}   # ObjectRef -> (candidate, evaluator idx)
        self.load = [0] * len(self.evaluators)
        self.attempts: dict[str, int] = {}
        self.requeued = 0
        self.per_evaluator = [0] * len(self.evaluators)
        self.down: dict[int, Any] = {}          # evaluator idx -> probe ObjectRef while it is unhealthy
        self.refused: dict[str, dict[int, str]] = {}    # task -> {evaluator idx: why it cannot run it}
        self.notes: list[str] = []              # one line per evaluator marked down for a task, for the user
        self._unrunnable: list[tuple[Candidate, EvalResult]] = []

    def submit(self, cand: Candidate) -> None:
        self.waiting.append(cand)
        self._dispatch()

    def _dispatch(self) -> None:
        self._check_probes()
        while self.waiting:
            cand = self.waiting[0]
            refused = self.refused.get(cand.task, {})
            if len(refused) == len(self.evaluators):        # nobody here can run this task
                self.waiting.popleft()
                why = "; ".join(sorted(set(refused.values())))[:1000]
                self._unrunnable.append((cand, EvalResult(candidate_id=cand.id, tier=TIER_RUNTIME_ERROR,
                                                          reason=f"no evaluator can run task {cand.task}: {why}")))
                continue
            healthy = [i for i in range(len(self.evaluators)) if i not in self.down and i not in refused]
            if not healthy:
                return
            idx = min(healthy, key=lambda i: self.load[i])
            if self.load[idx] >= self.depth:
                return
            self.waiting.popleft()
            ref = self.evaluators[idx].evaluate.remote(cand.to_dict(), cand.task)
            self.in_flight[ref] = (cand, idx)
            self.load[idx] += 1

    def _check_probes(self) -> None:
        if not self.down:
            return
        ready, _ = ray.wait(list(self.down.values()), num_returns=len(self.down), timeout=0)
        for idx, ref in list(self.down.items()):
            if ref in ready:
                try:
                    ray.get(ref)
                    del self.down[idx]                          # it came back
                except RayActorError:
                    self.down[idx] = self.evaluators[idx].info.remote()   # still restarting: ask again

    def cannot_run(self, task: str) -> str | None:
        """Why no evaluator here can run `task` (each raised for it), or None while one can."""
        refused = self.refused.get(task, {})
        if len(refused) < len(self.evaluators):
            return None
        return "; ".join(sorted(set(refused.values())))

    def refs(self) -> list:
        """The evaluations in flight (and health probes), for a caller that waits on several kinds
        of work at once."""
        return list(self.in_flight) + list(self.down.values())

    def __len__(self) -> int:
        return len(self.waiting) + len(self.in_flight) + len(self._unrunnable)

    def poll(self, timeout: float = 0.05) -> list[tuple[Candidate, EvalResult]]:
        """Results that are ready within `timeout`; lost jobs are requeued, never dropped."""
        done: list[tuple[Candidate, EvalResult]] = []
        ready = ray.wait(list(self.in_flight), num_returns=len(self.in_flight), timeout=timeout)[0] \
            if self.in_flight else []
        for ref in ready:
            cand, idx = self.in_flight.pop(ref)
            self.load[idx] -= 1
            try:
                res = EvalResult.from_dict(ray.get(ref))
                self.per_evaluator[idx] += 1
            except (RayActorError, GetTimeoutError) as e:
                if idx not in self.down:
                    self.down[idx] = self.evaluators[idx].info.remote()
                n = self.attempts[cand.id] = self.attempts.get(cand.id, 0) + 1
                if n < MAX_ATTEMPTS:
                    self.requeued += 1
                    self.waiting.appendleft(cand)
                    continue
                res = EvalResult(candidate_id=cand.id, tier=TIER_RUNTIME_ERROR,
                                 reason=f"its evaluator died {n} times while evaluating it: {type(e).__name__}")
            except RayTaskError as e:                       # this evaluator cannot run this task
                why = _first_line(e)
                refused = self.refused.setdefault(cand.task, {})
                if idx not in refused:
                    self.notes.append(f"evaluator {idx} is down for task {cand.task}: {why}")
                refused[idx] = why
                self.waiting.appendleft(cand)
                continue
            done.append((cand, res))
        self._dispatch()
        done, self._unrunnable = self._unrunnable + done, []     # with those no evaluator can run
        return done


def _first_line(e: RayTaskError) -> str:
    """The error the evaluator raised (KfrayError's one line), without Ray's traceback."""
    cause = getattr(e, "cause", None)
    text = str(cause) if cause is not None else str(e)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (f"{type(cause).__name__}: " if cause is not None else "") + (lines[0][:300] if lines else "error")
