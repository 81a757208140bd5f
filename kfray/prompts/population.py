"""The co-evolved meta-prompt population (KernelFoundry): pure Python, so tests drive it without Ray.

Each member is a `MetaPrompt` whose sections are snippets joined by newlines. Islands `sample` a
member, propose kernels with it and `report` the best child score; every `evolve_every` reports a new
member is bred from two fit parents (an LLM rewrite when one is given, else recombination plus one
snippet swap) and the worst reported member retires, so prompt guidance improves with the kernels.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import random
from pathlib import Path
from typing import Any, Callable

import yaml

from kfray.proposal import MetaPrompt

SECTIONS = ("philosophy", "strategies", "pitfalls", "analysis")
MAX_SECTION_CHARS = 700      # a rewritten section, at most: every prompt and the next rewrite carry it
HINTS = ("mutate_params", "switch_strategy", "recombine", "toggle_simd", "toggle_parallel", "")
SNIPPETS_PATH = Path(__file__).with_name("snippets.yaml")

Rewrite = Callable[[dict, str], "dict | None"]
_LIBRARY_CACHE: dict[str, dict[str, list[dict]]] = {}


def load_snippets(path: str | Path | None = None) -> dict[str, list[dict]]:
    """The snippet library: section -> [{text, hint}]. Cached; checked so a typo fails loudly here."""
    p = Path(path) if path else SNIPPETS_PATH
    key = str(p.resolve())
    if key not in _LIBRARY_CACHE:
        data = yaml.safe_load(p.read_text()) or {}
        lib: dict[str, list[dict]] = {}
        for s in SECTIONS:
            items = data.get(s) or []
            if not items:
                raise ValueError(f"{p}: section '{s}' has no snippets")
            lib[s] = []
            for it in items:
                text, hint = str(it["text"]).strip(), str(it.get("hint") or "")
                if hint not in HINTS:
                    raise ValueError(f"{p}: section '{s}': unknown hint {hint!r} (known: {HINTS})")
                lib[s].append({"text": text, "hint": hint})
        _LIBRARY_CACHE[key] = lib
    return _LIBRARY_CACHE[key]


def _new_stats() -> dict:
    return {"uses": 0, "reports": 0, "mean": 0.0, "best": None}


class MetaPromptPopulation:
    """A small population of meta-prompts with per-prompt score statistics."""

    def __init__(self, size: int = 6, explore: float = 0.2, evolve_every: int = 6, seed: int = 0,
                 temperature: float = 1.0, library: dict[str, list[dict]] | None = None):
        self._setup(size, explore, evolve_every, temperature, library)
        self._rng = random.Random(seed)
        seen: set = set()
        for _ in range(self.size):
            for _attempt in range(50):          # different draws per member, while the library allows
                picks = {s: self._rng.sample(self.library[s], min(2, len(self.library[s])))
                         for s in SECTIONS}
                key = tuple(frozenset(p["text"] for p in picks[s]) for s in SECTIONS)
                if key not in seen:
                    break
            seen.add(key)
            sections = {s: "\n".join(p["text"] for p in picks[s]) for s in SECTIONS}
            hints = [p["hint"] for s in SECTIONS for p in picks[s] if p["hint"]]
            self._add(sections, 0, [], hints)

    def _setup(self, size, explore, evolve_every, temperature, library) -> None:
        self.size = max(1, int(size))
        self.explore = float(explore)
        self.evolve_every = max(1, int(evolve_every))
        self.temperature = max(1e-6, float(temperature))
        self.library = library or load_snippets()
        self._hint_of = {p["text"]: p["hint"] for s in SECTIONS for p in self.library[s]}
        self._prompts: dict[str, MetaPrompt] = {}   # every prompt ever made, in creation order
        self._stats: dict[str, dict] = {}
        self._alive: list[str] = []                 # live members, oldest first
        self._next = 1
        self._pending = 0                           # reports since the last evolve

    # ---------------------------------------------------------------- sampling and reporting
    def sample(self, rng=None) -> MetaPrompt:
        """Uniform with probability `explore`, else softmax over mean score (optimistic for untried)."""
        r = rng if rng is not None else self._rng
        ids = self._alive
        if r.random() < self.explore:
            pid = ids[min(int(r.random() * len(ids)), len(ids) - 1)]
        else:
            w = self._weights()
            x, acc, pid = r.random() * sum(w), 0.0, ids[-1]
            for i, wi in zip(ids, w):
                acc += wi
                if x < acc:
                    pid = i
                    break
        self._stats[pid]["uses"] += 1
        return copy.deepcopy(self._prompts[pid])

    def _weights(self) -> list[float]:
        """Softmax weights; a prompt without reports counts as one temperature above the best mean."""
        known = [self._stats[i]["mean"] for i in self._alive if self._stats[i]["reports"]]
        prior = (max(known) if known else 0.0) + self.temperature
        vals = [self._stats[i]["mean"] if self._stats[i]["reports"] else prior for i in self._alive]
        top = max(vals)
        return [math.exp((v - top) / self.temperature) for v in vals]

    def report(self, prompt_id: str, score: float, rewrite: Rewrite | None = None) -> MetaPrompt | None:
        """Record the best child score a prompt produced; every `evolve_every` reports breed a new one.

        Ids that are not alive (retired, or from another run) are ignored so late reports are harmless.
        """
        if prompt_id not in self._alive:
            return None
        score = float(score)
        if not math.isfinite(score):
            score = 0.0
        st = self._stats[prompt_id]
        st["reports"] += 1
        st["mean"] += (score - st["mean"]) / st["reports"]
        st["best"] = score if st["best"] is None else max(st["best"], score)
        self._pending += 1
        if self._pending >= self.evolve_every:
            self._pending = 0
            return self.evolve(rewrite)
        return None

    # ---------------------------------------------------------------- evolution
    def evolve(self, rewrite: Rewrite | None = None) -> MetaPrompt:
        """Breed one member from two tournament winners, add it, and retire the worst if over size."""
        a = self._tournament()
        b = self._tournament(exclude=a)
        pa, pb = self._prompts[a], self._prompts[b]
        sections = None
        if rewrite is not None:
            try:
                sections = self._clean(rewrite(dict(pa.sections), self._feedback(pa, pb)), pa.sections)
            except Exception:  # noqa: BLE001 - a failing model must never stop the search
                sections = None
        if sections is None:
            sections = {s: self._rng.choice((pa, pb)).sections.get(s, "") for s in SECTIONS}
            s = self._rng.choice(SECTIONS)
            sections[s] = self._swap(sections[s], s)
        hints = self._hints_in(sections) or list(dict.fromkeys(pa.hints + pb.hints))
        parents = list(dict.fromkeys([a, b]))
        child = self._add(sections, max(pa.generation, pb.generation) + 1, parents, hints)
        self._retire()
        return copy.deepcopy(child)

    def _tournament(self, exclude: str | None = None, k: int = 2) -> str:
        """Best of k random live members; reported prompts beat unreported ones (evidence first)."""
        pool = [i for i in self._alive if i != exclude] or list(self._alive)
        picks = self._rng.sample(pool, min(k, len(pool)))
        return max(picks, key=lambda i: (self._stats[i]["reports"] > 0, self._stats[i]["mean"]))

    def _swap(self, text: str, section: str) -> str:
        """Replace one line of a section with a library snippet it does not already hold."""
        lines = [ln for ln in text.split("\n") if ln.strip()]
        fresh = [p["text"] for p in self.library[section] if p["text"] not in lines]
        if not fresh:
            return text
        new = self._rng.choice(fresh)
        if lines:
            lines[self._rng.randrange(len(lines))] = new
        else:
            lines = [new]
        return "\n".join(lines)

    @staticmethod
    def _clean(out: Any, base: dict[str, str]) -> dict[str, str] | None:
        """Keep the rewrite's non-empty string sections, the parent's for the rest; None if it gave none."""
        if not isinstance(out, dict):
            return None
        got = {s: _capped(out[s].strip()) for s in SECTIONS if isinstance(out.get(s), str) and out[s].strip()}
        if not got:
            return None
        return {s: got.get(s, base.get(s, "")) for s in SECTIONS}

    def _hints_in(self, sections: dict[str, str]) -> list[str]:
        return [self._hint_of[ln] for s in SECTIONS for ln in sections.get(s, "").split("\n")
                if self._hint_of.get(ln)]

    def _feedback(self, pa: MetaPrompt, pb: MetaPrompt) -> str:
        """What a rewriting model needs: how the parents scored and the other parent's ideas."""
        def line(p: MetaPrompt) -> str:
            st = self._stats[p.id]
            best = "none" if st["best"] is None else f"{st['best']:.3f}"
            return (f"{p.id} (generation {p.generation}): mean child score {st['mean']:.3f}, "
                    f"best {best}, over {st['reports']} reports")
        other = "\n".join(f"[{s}]\n{pb.sections.get(s, '')}" for s in SECTIONS)
        # Two paragraphs, the more needed first: a prompt budget drops the second before the first.
        return ("Scores are the correctness tier (0-5) plus the geometric-mean speedup when correct.\n"
                f"Prompt to rewrite: {line(pa)}.\nOther parent: {line(pb)}.\n"
                "Keep what helped, drop what did not, borrow from the other parent where useful, "
                "and keep each section to a few short sentences.\n\nOther parent's sections:\n" + other)

    def _add(self, sections: dict[str, str], generation: int, parents: list[str],
             hints: list[str]) -> MetaPrompt:
        mp = MetaPrompt(id=f"mp-{self._next:04d}", generation=generation, sections=dict(sections),
                        parents=list(parents), hints=list(hints))
        self._next += 1
        self._prompts[mp.id] = mp
        self._stats[mp.id] = _new_stats()
        self._alive.append(mp.id)
        return mp

    def _retire(self) -> None:
        """Drop the lowest-mean reported member while over size; never untried ones, never the newest."""
        while len(self._alive) > self.size:
            newest = self._alive[-1]
            cands = [i for i in self._alive if i != newest and self._stats[i]["reports"] > 0]
            if not cands:
                return
            self._alive.remove(min(cands, key=lambda i: (self._stats[i]["mean"], self._stats[i]["best"])))

    # ---------------------------------------------------------------- views and persistence
    def members(self) -> list[MetaPrompt]:
        """Live members, oldest first (copies)."""
        return [copy.deepcopy(self._prompts[i]) for i in self._alive]

    def stats(self, prompt_id: str) -> dict:
        return dict(self._stats[prompt_id])

    def __len__(self) -> int:
        return len(self._alive)

    def generations(self) -> int:
        """Distinct generations ever created, retired prompts included."""
        return len({p.generation for p in self._prompts.values()})

    def all_prompts(self) -> list[dict]:
        """Every prompt ever made with its stats and whether it is alive: rows for the store."""
        return [{**dataclasses.asdict(p), **self._stats[i], "alive": i in self._alive}
                for i, p in self._prompts.items()]

    def to_dict(self) -> dict:
        """JSON-serializable state, RNG included, so a resumed run samples exactly as it would have."""
        version, state, gauss = self._rng.getstate()
        return {"size": self.size, "explore": self.explore, "evolve_every": self.evolve_every,
                "temperature": self.temperature, "next": self._next, "pending": self._pending,
                "alive": list(self._alive),
                "prompts": [{**dataclasses.asdict(p), "stats": dict(self._stats[i])}
                            for i, p in self._prompts.items()],
                "rng": [version, list(state), gauss]}

    @classmethod
    def from_dict(cls, d: dict, library: dict[str, list[dict]] | None = None) -> "MetaPromptPopulation":
        pop = cls.__new__(cls)
        pop._setup(d["size"], d["explore"], d["evolve_every"], d.get("temperature", 1.0), library)
        for row in d["prompts"]:
            mp = MetaPrompt(id=row["id"], generation=int(row["generation"]), sections=dict(row["sections"]),
                            parents=list(row.get("parents", [])), hints=list(row.get("hints", [])))
            pop._prompts[mp.id] = mp
            pop._stats[mp.id] = {**_new_stats(), **row.get("stats", {})}
        pop._alive = [i for i in d["alive"] if i in pop._prompts]
        pop._next, pop._pending = int(d["next"]), int(d.get("pending", 0))
        version, state, gauss = d["rng"]
        pop._rng = random.Random()
        pop._rng.setstate((version, tuple(state), gauss))
        return pop


def _capped(text: str) -> str:
    """A model's section cut to MAX_SECTION_CHARS at a line's end (a verbose rewrite would otherwise
    grow every later prompt, and the rewrite after it, past a local model's budget)."""
    if len(text) <= MAX_SECTION_CHARS:
        return text
    keep = ""
    for ln in text.split("\n"):
        if len(keep) + len(ln) + 1 > MAX_SECTION_CHARS:
            break
        keep += ln + "\n"
    return keep.strip() or text[:MAX_SECTION_CHARS].rstrip()
