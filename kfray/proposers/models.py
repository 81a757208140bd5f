"""Choosing among several LLMs: model specs, a usage ledger with a budget, and a UCB bandit.

A config may list several models (`proposer.models`), each with a weight and a price:

    proposer:
      kind: llm
      bandit: true                 # UCB over the child improvement each model produced
      max_cost: 5.0                # stop proposing once this much was spent (0: no limit)
      models:
        - {model: big-coder, weight: 1, cost_per_1k_input: 0.003, cost_per_1k_output: 0.015}
        - {model: small-coder, weight: 2, cost_per_1k_input: 0.0002, cost_per_1k_output: 0.0006,
           base_url: "http://gpu-box:8000/v1"}

Without the bandit a model is drawn by weight for every call. With it, each call goes to the model
with the highest upper confidence bound on its reward (a child's fitness change squashed to [0, 1]:
0.5 + 0.5 tanh(child - parent)), less `bandit_cost` times its relative price; a model never tried
goes first.

The `Ledger` counts calls, tokens, cost and rewards per model. It is pure; an LLM run's islands
share one through `LedgerActor` (a named Ray actor) so that the budget and the bandit's statistics
are run-wide. Every answer from the ledger is a full snapshot, so a proxy can re-seed a restarted
ledger with what it saw last (`floor`: elementwise maximum), and an island checkpoint carries it too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kfray.errors import ConfigError

PURPOSES = ("proposal", "retry", "repair", "prompt")   # a new kernel, its whole-file retry, a fix, a meta-prompt
FIELDS = ("calls", "prompt_tokens", "completion_tokens", "cost", "failures", "rewards", "reward_sum",
          *(f"req_{p}" for p in PURPOSES), "repeats", "remembered")
# repeats: answers that repeated a kernel already tried; remembered: children given the remembered
# answer of a prompt that had repeated twice, with no request (kfray.proposers.futile)


@dataclass(frozen=True)
class ModelSpec:
    model: str
    weight: float = 1.0
    cost_per_1k_input: float = 0.0
    cost_per_1k_output: float = 0.0
    base_url: str = ""
    api_key_env: str = ""

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.cost_per_1k_input + completion_tokens * self.cost_per_1k_output) / 1000.0


_SPEC_KEYS = {"model": str, "weight": float, "cost_per_1k_input": float, "cost_per_1k_output": float,
              "base_url": str, "api_key_env": str}


def parse_models(cfg) -> list[ModelSpec]:
    """`proposer.models` as ModelSpecs; an empty list means the single `proposer.model`."""
    raw = list(getattr(cfg, "models", None) or [])
    specs = []
    for i, m in enumerate(raw):
        where = f"proposer.models[{i}]"
        if isinstance(m, str):
            m = {"model": m}
        if not isinstance(m, dict):
            raise ConfigError(f"{where} must be a mapping like {{model: NAME, weight: 1}}, got {m!r}")
        unknown = set(m) - set(_SPEC_KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} "
                              f"(known: {', '.join(_SPEC_KEYS)})")
        kw: dict[str, Any] = {}
        for k, v in m.items():
            typ = _SPEC_KEYS[k]
            if typ is float and isinstance(v, (int, float)) and not isinstance(v, bool):
                v = float(v)
            if not isinstance(v, typ):
                raise ConfigError(f"{where}.{k} must be {typ.__name__}, got {v!r}")
            if typ is float and v < 0:
                raise ConfigError(f"{where}.{k} must be >= 0, got {v}")
            kw[k] = v
        if not kw.get("model", "").strip():
            raise ConfigError(f"{where}.model is required")
        specs.append(ModelSpec(**kw))
    if len({s.model for s in specs}) != len(specs):
        raise ConfigError("proposer.models: each model may be listed once")
    if specs and sum(s.weight for s in specs) <= 0:
        raise ConfigError("proposer.models: the weights must not all be 0")
    return specs


def reward(improvement: float) -> float:
    """A child's fitness change (child - parent) as a bandit reward in [0, 1]."""
    return 0.5 + 0.5 * math.tanh(improvement)


class Ledger:
    """Calls, tokens, cost and bandit rewards per model; the budget check. Pure."""

    def __init__(self, snapshot: dict | None = None):
        self.per_model: dict[str, dict[str, float]] = {}
        if snapshot:
            self.floor(snapshot)

    def _row(self, model: str) -> dict[str, float]:
        return self.per_model.setdefault(model, {k: 0 for k in FIELDS})

    def charge(self, model: str, prompt_tokens: int, completion_tokens: int, cost: float,
               failed: bool = False, purpose: str = "proposal") -> dict:
        r = self._row(model)
        if failed:
            r["failures"] += 1
        else:
            r["calls"] += 1
            r[f"req_{purpose if purpose in PURPOSES else 'proposal'}"] += 1
            r["prompt_tokens"] += int(prompt_tokens)
            r["completion_tokens"] += int(completion_tokens)
            r["cost"] += float(cost)
        return self.snapshot()

    def repeat(self, model: str, remembered: bool = False) -> dict:
        """An answer that repeated a kernel already tried: nothing to evaluate (`remembered`: given
        from memory of its prompt, not asked)."""
        self._row(model)["remembered" if remembered else "repeats"] += 1
        return self.snapshot()

    def reward(self, model: str, value: float) -> dict:
        r = self._row(model)
        r["rewards"] += 1
        r["reward_sum"] += float(value)
        return self.snapshot()

    def snapshot(self) -> dict:
        return {m: dict(r) for m, r in self.per_model.items()}

    def floor(self, snapshot: dict) -> dict:
        """Raise every count to at least the snapshot's (re-seeding after a restart or a resume)."""
        for m, row in (snapshot or {}).items():
            r = self._row(m)
            for k in FIELDS:
                r[k] = max(r[k], row.get(k, 0))
        return self.snapshot()


def merged(snapshots) -> dict:
    """One per-model usage from several snapshots of the same run-wide ledger (the largest counts)."""
    per: dict[str, dict] = {}
    for snap in snapshots:
        for model, row in (snap or {}).items():
            cur = per.setdefault(model, {})
            for k, v in row.items():
                cur[k] = max(cur.get(k, 0), v)
    return per


def request_counts(snapshot: dict, llm_candidates: int) -> dict:
    """The model's requests by purpose, and per evaluated LLM candidate (what a slow local endpoint
    costs per kernel): {total, proposal, retry, repair, prompt, repeats, remembered, llm_candidates,
    per_candidate}; `repeats`: answers that repeated a kernel already tried; `remembered`: children
    given such an answer again from memory, with no request."""
    by = {p: int(sum(row.get(f"req_{p}", 0) for row in snapshot.values())) for p in PURPOSES}
    total = sum(by.values())
    repeats = int(sum(row.get("repeats", 0) for row in snapshot.values()))
    remembered = int(sum(row.get("remembered", 0) for row in snapshot.values()))
    return {"total": total, **by, "repeats": repeats, "remembered": remembered, "llm_candidates": llm_candidates,
            "per_candidate": round(total / llm_candidates, 3) if llm_candidates else None}


def requests_text(counts: dict) -> str:
    return (f"LLM requests: {counts['total']} (proposals {counts['proposal']}, whole-file retries {counts['retry']}, "
            f"repairs {counts['repair']}, prompt evolution {counts['prompt']}"
            + (f"; {counts['repeats']} answer(s) repeated a kernel already tried (asked again or edited)" if counts.get("repeats") else "")
            + (f"; {counts['remembered']} child(ren) given the remembered answer of a prompt that repeated, "
               "not asked" if counts.get("remembered") else "")
            + "); "
            + (f"{counts['per_candidate']:.2f} per evaluated LLM candidate ({counts['llm_candidates']})"
               if counts["per_candidate"] is not None else "no LLM candidate evaluated yet"))


def totals(snapshot: dict) -> dict[str, float]:
    out = {k: 0 for k in FIELDS}
    for row in snapshot.values():
        for k in FIELDS:
            out[k] += row.get(k, 0)
    out["tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    return out


def over_budget(snapshot: dict, max_cost: float = 0.0, token_budget: int = 0) -> bool:
    t = totals(snapshot)
    return (max_cost > 0 and t["cost"] >= max_cost) or (token_budget > 0 and t["tokens"] >= token_budget)


def _pick_weighted(rng, items: list, weights: list[float]):
    total = sum(weights)
    x = rng.random() * total
    for item, w in zip(items, weights):
        x -= w
        if x < 0:
            return item
    return items[-1]


def ucb_scores(specs: list[ModelSpec], snapshot: dict, c: float = 1.0, cost_weight: float = 0.0) -> dict[str, float]:
    """UCB1 per model: mean reward + c * sqrt(2 ln N / n) - cost_weight * relative price.

    The price is the observed mean cost per call once a model has answered, else its list price
    for a 1k-in / 1k-out call; relative to the dearest model. Untried models score +inf."""
    def price(s: ModelSpec) -> float:
        r = snapshot.get(s.model, {})
        return r["cost"] / r["calls"] if r.get("calls") else s.cost(1000, 1000)

    prices = {s.model: price(s) for s in specs}
    top = max(prices.values(), default=0.0)
    n_total = sum(snapshot.get(s.model, {}).get("rewards", 0) for s in specs)
    out = {}
    for s in specs:
        r = snapshot.get(s.model, {})
        n = r.get("rewards", 0)
        if n == 0:
            out[s.model] = math.inf
            continue
        bonus = c * math.sqrt(2 * math.log(max(n_total, 1)) / n)
        out[s.model] = r["reward_sum"] / n + bonus - (cost_weight * prices[s.model] / top if top > 0 else 0.0)
    return out


def choose_model(specs: list[ModelSpec], snapshot: dict, rng, bandit: bool = False, c: float = 1.0,
                 cost_weight: float = 0.0, pending: dict | None = None) -> ModelSpec:
    """The model for the next call: by weight, or by UCB with the bandit on.

    `pending` counts calls whose children are not yet scored; an untried model with a call pending
    is not tried again before the others were (so parallel islands spread the first calls)."""
    if len(specs) == 1:
        return specs[0]
    if not bandit:
        return _pick_weighted(rng, specs, [s.weight for s in specs])
    scores = ucb_scores(specs, snapshot, c, cost_weight)
    pending = pending or {}
    untried = [s for s in specs if scores[s.model] == math.inf]
    if untried:
        least = min(pending.get(s.model, 0) for s in untried)
        untried = [s for s in untried if pending.get(s.model, 0) == least]
        return _pick_weighted(rng, untried, [max(s.weight, 1e-9) for s in untried])
    best = max(scores.values())
    tops = [s for s in specs if scores[s.model] >= best - 1e-12]
    return _pick_weighted(rng, tops, [max(s.weight, 1e-9) for s in tops])


# -- sharing one ledger between islands ---------------------------------------------------------

class LedgerActor:
    """The Ray shell of a Ledger, shared by every island of an LLM run."""

    def __init__(self):
        self.ledger = Ledger()

    def charge(self, model, prompt_tokens, completion_tokens, cost, failed=False, purpose="proposal"):
        return self.ledger.charge(model, prompt_tokens, completion_tokens, cost, failed, purpose)

    def reward(self, model, value):
        return self.ledger.reward(model, value)

    def repeat(self, model, remembered=False):
        return self.ledger.repeat(model, remembered)

    def snapshot(self):
        return self.ledger.snapshot()

    def floor(self, snapshot):
        return self.ledger.floor(snapshot)


def ledger_name(evolver: str) -> str:
    """The run-wide ledger actor's name, beside the run's prompt evolver (named `evolver`)."""
    return f"{evolver}-ledger"


class RemoteLedger:
    """A Ledger-like proxy to the named LedgerActor; re-creates and re-seeds it if it died."""

    def __init__(self, name: str):
        self.name = name
        self.last: dict = {}
        self._actor = None

    def _get(self):
        import ray

        if self._actor is None:
            cls = ray.remote(num_cpus=0, max_restarts=0)(LedgerActor)
            self._actor = cls.options(name=self.name, get_if_exists=True, num_cpus=0).remote()
            if self.last:
                ray.get(self._actor.floor.remote(self.last))
        return self._actor

    def _call(self, method: str, *args) -> dict:
        import ray

        for attempt in range(2):
            try:
                self.last = ray.get(getattr(self._get(), method).remote(*args))
                return self.last
            except ray.exceptions.RayActorError:
                self._actor = None
                if attempt:
                    raise
        return self.last

    def charge(self, model, prompt_tokens, completion_tokens, cost, failed=False, purpose="proposal") -> dict:
        return self._call("charge", model, prompt_tokens, completion_tokens, cost, failed, purpose)

    def reward(self, model, value) -> dict:
        return self._call("reward", model, value)

    def repeat(self, model, remembered=False) -> dict:
        return self._call("repeat", model, remembered)

    def snapshot(self) -> dict:
        return self._call("snapshot")

    def floor(self, snapshot) -> dict:
        return self._call("floor", snapshot)
