"""Prompts that came back as kernels already tried, and what they came back as.

A one-slot local model answers the same prompt with nearly the same text, whatever the sampling
seed: in a 45-minute run of the 1.5B model, an island sent the prompt of its best softmax kernel
(7.5 kB) 16 times, and 15 answers were that kernel's entry point alone, the parent again (640 s of
the model's 2,700). Once a prompt has come back as a repeat AFTER times, its next child is the
remembered answer, given without a request: kfray.search.repeats edits it as it edits any repeat,
and the model's time goes to a prompt that may give something new. A model whose answers vary
seldom repeats a prompt twice, and is asked as before.

The memory is the endpoint's (kept beside its slots, kfray.proposers.slots), not an island's: the
islands of a task share elites through migration and so send the same prompt, and in a later run
two islands sent one prompt three times between them, each answered with the same 619 characters
(35 s of the model each), where each island alone had not yet seen it twice.
"""
from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

AFTER = 2           # repeats of one prompt before its answer is remembered rather than asked again
SIZE = 512          # prompts remembered per endpoint (the oldest go first)


def prompt_key(model: str, mode: str, temperature: float | None, messages: list[dict]) -> str:
    """What makes two requests the same request."""
    blob = json.dumps([model, mode, temperature, messages], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class FutilePrompts:
    def __init__(self, after: int = AFTER, size: int = SIZE):
        self.after, self.size = after, size
        self.seen: OrderedDict[str, tuple[int, str, dict]] = OrderedDict()   # key -> (repeats, source, params)

    def note(self, key: str, source: str, params: dict) -> None:
        """The request `key` came back as a kernel already tried: `source` at `params`."""
        n = self.seen.pop(key, (0, "", {}))[0]
        self.seen[key] = (n + 1, source, dict(params))
        while len(self.seen) > self.size:
            self.seen.popitem(last=False)

    def answer(self, key: str) -> tuple[str, dict] | None:
        """The remembered (source, params) of a request that repeated AFTER times, else None."""
        n, source, params = self.seen.get(key, (0, "", {}))
        return (source, dict(params)) if n >= self.after and source.strip() else None
