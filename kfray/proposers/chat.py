"""One chat completion against one endpoint: a slot first, then the request, with our retries.

The openai client's own retries are off (max_retries=0) so that retry policy, backoff and the
error a user sees are ours: rate limits, 5xx, timeouts and connection failures are retried with
exponential backoff; anything else fails at once.

A request is sent only while holding one of the endpoint's slots (kfray.proposers.slots), so the
time spent waiting behind other islands is never part of its timeout, and a long queue never
makes the client drop a request and send it again. `proposer.timeout_s` applies to the request in
flight: with streaming (the default) it is an idle timeout between tokens, so a slow local model
that keeps answering is never cut off; without streaming it bounds the whole answer.
"""
from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass

import openai

from kfray.errors import KfrayError

_MAX_RETRY_AFTER_S = 30.0


@dataclass
class Answer:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0            # the request in flight (all attempts), waiting for a slot excluded
    waited_s: float = 0.0           # waiting for a slot


def _delay(err: Exception, attempt: int, backoff_s: float) -> float:
    """Retry-After when the server sent one (capped), else exponential backoff."""
    resp = getattr(err, "response", None)
    if resp is not None:
        ra = resp.headers.get("retry-after")
        if ra is not None:
            try:
                return min(max(float(ra), 0.0), _MAX_RETRY_AFTER_S)
            except ValueError:
                pass
    return backoff_s * (2 ** attempt)


def retryable(err: Exception) -> bool:
    if isinstance(err, (openai.RateLimitError, openai.APIConnectionError)):  # incl. APITimeoutError
        return True
    return isinstance(err, openai.APIStatusError) and err.status_code >= 500


class Endpoint:
    """An OpenAI-compatible endpoint: its client, its slots, and how to call it."""

    def __init__(self, url: str, key: str, cfg, slots):
        self.url, self.cfg, self.slots = url, cfg, slots
        # connect: a server that is not there fails fast; read: the idle gap between tokens
        timeout = openai.Timeout(cfg.timeout_s, connect=min(10.0, cfg.timeout_s))
        self.client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=timeout)

    def _once(self, model: str, messages: list[dict], max_tokens: int, temperature: float | None = None,
              done=None) -> Answer:
        cfg = self.cfg
        heat = cfg.temperature if temperature is None else temperature
        # A fresh sampling seed per request: llama.cpp's server restores a cached prompt's state, its
        # sampler's generator included, so the same prompt gave the same answer word for word. In a
        # 45-minute local run an island asked one prompt 12 times in a row (7.5 minutes of the
        # model), and each answer was the duplicate of a kernel already evaluated.
        seed = random.SystemRandom().randrange(1 << 31)
        if not getattr(cfg, "stream", True):
            resp = self.client.chat.completions.create(model=model, messages=messages, seed=seed,
                                                       temperature=heat, max_tokens=max_tokens)
            u = resp.usage
            text = resp.choices[0].message.content or "" if resp.choices else ""
            return Answer(text, (u.prompt_tokens or 0) if u else 0, (u.completion_tokens or 0) if u else 0)
        stream = self.client.chat.completions.create(
            model=model, messages=messages, temperature=heat, max_tokens=max_tokens, seed=seed,
            stream=True, stream_options={"include_usage": True})
        parts, chunks, usage, ended = [], 0, None, False
        with stream:            # leaving it closes the connection: a server then stops writing
            for ev in stream:
                if getattr(ev, "usage", None) is not None:
                    usage = ev.usage
                for ch in ev.choices or []:
                    if ch.delta is not None and ch.delta.content:
                        parts.append(ch.delta.content)
                        chunks += 1
                        # asked at a fence's backtick, and every 16 tokens (an answer may end unfenced)
                        ended = ended or (done is not None and ("`" in ch.delta.content or chunks % 16 == 0)
                                          and done("".join(parts)))
                if ended:
                    break
        text = "".join(parts)
        if usage is not None:
            return Answer(text, usage.prompt_tokens or 0, usage.completion_tokens or 0)
        # servers that send no usage on a stream: one chunk is one token (llama.cpp, vLLM);
        # the prompt is estimated from its characters
        return Answer(text, sum(len(str(m.get("content", ""))) for m in messages) // 4, chunks)

    def complete(self, model: str, messages: list[dict], max_tokens: int | None = None,
                 rank: float | None = None, temperature: float | None = None, done=None) -> Answer:
        """One answer, retried on transient errors; raises KfrayError naming the endpoint. `rank`:
        its place among the requests waiting for a slot (kfray.proposers.slots); `temperature`:
        this request's, where not the config's; `done(text)`: true once a streamed answer holds all
        that will be read of it, which ends the answer there."""
        cfg = self.cfg
        attempts = cfg.max_retries + 1
        holder = uuid.uuid4().hex
        waited = spent = 0.0
        for attempt in range(attempts):
            t0 = time.monotonic()
            try:
                with self.slots.hold(holder, rank):
                    t1 = time.monotonic()
                    waited += t1 - t0
                    try:
                        ans = self._once(model, messages, max_tokens or cfg.max_tokens, temperature, done)
                    finally:
                        spent += time.monotonic() - t1
            except openai.OpenAIError as e:
                if retryable(e) and attempt + 1 < attempts:
                    time.sleep(_delay(e, attempt, cfg.backoff_s))   # slot released while backing off
                    continue
                what = f"after {attempt + 1} attempts" if retryable(e) else "(not retried)"
                raise KfrayError(f"LLM endpoint {self.url} (model {model}) failed {what}: "
                                 f"{type(e).__name__}: {e}") from None
            ans.seconds, ans.waited_s = spent, waited
            return ans
        raise AssertionError("unreachable")
