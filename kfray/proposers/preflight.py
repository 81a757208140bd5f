"""An LLM endpoint checked once before a run starts."""
from __future__ import annotations

from kfray.errors import KfrayError


def preflight_llm(proposer_cfg) -> None:
    """With the LLM proposer, call each endpoint once before anything starts: a run against an
    endpoint that does not answer fails at once with one line, instead of filling its budget with
    tier-0 candidates after minutes of retries."""
    if getattr(proposer_cfg, "kind", "") != "llm":
        return
    import openai

    from kfray.proposers.llm import LLMProposer

    proposer = LLMProposer(proposer_cfg)            # ConfigError: no endpoint, no model, no key
    clients = getattr(proposer, "clients", None) or {proposer.model: (proposer.client, proposer.base_url)}
    endpoints = {url: client for client, url in clients.values()}
    for url, client in endpoints.items():
        try:
            client.with_options(timeout=10.0, max_retries=0).models.list()
        except openai.APIConnectionError as e:     # refused, DNS, TLS, time-out
            raise KfrayError(f"the LLM endpoint {url} does not answer ({type(e).__name__}: {e}); start the "
                             "server, or fix proposer.base_url (or $OPENAI_BASE_URL), or run with "
                             "--set proposer.kind=offline") from None
        except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
            raise KfrayError(f"the LLM endpoint {url} refused the API key (HTTP {e.status_code}); set the key "
                             f"in ${proposer_cfg.api_key_env} (proposer.api_key_env names the variable)") from None
        except openai.APIStatusError:
            pass                                    # it answered (some servers have no /models): reachable


def llm_doctor(proposer_cfg, max_tokens: int = 48) -> tuple[list[tuple[str, str, bool]], bool]:
    """`kfray doctor --llm`: each endpoint's models, one tiny streamed completion per configured
    model, its time to the first token and tokens per second. Rows of (what, value, ok)."""
    import time

    import openai

    from kfray.proposers.llm import LLMProposer

    proposer = LLMProposer(proposer_cfg)            # ConfigError: no endpoint, no model, no key
    rows = []
    for url in dict.fromkeys(url for _, url in proposer.clients.values()):
        client = next(c for c, u in proposer.clients.values() if u == url)
        try:
            names = [m.id for m in client.with_options(timeout=10.0, max_retries=0).models.list()]
            rows.append(("endpoint", f"{url}: models {', '.join(names) or '(none listed)'}", True))
        except openai.OpenAIError as e:
            rows.append(("endpoint", f"{url}: {type(e).__name__}: {e}", False))
    for model, (client, url) in proposer.clients.items():
        msgs = [{"role": "user", "content": "Write a C function that returns the sum of two ints. Code only."}]
        t0 = time.monotonic()
        first, chunks, usage = None, 0, None
        try:
            stream = client.with_options(timeout=proposer_cfg.timeout_s, max_retries=0).chat.completions.create(
                model=model, messages=msgs, max_tokens=max_tokens, temperature=0.0, stream=True,
                stream_options={"include_usage": True})
            with stream:
                for ev in stream:
                    usage = getattr(ev, "usage", None) or usage
                    if any(ch.delta is not None and ch.delta.content for ch in ev.choices or []):
                        first = first or time.monotonic()
                        chunks += 1
        except openai.OpenAIError as e:
            rows.append((f"model {model}", f"completion failed: {type(e).__name__}: {e}", False))
            continue
        end = time.monotonic()
        n = (usage.completion_tokens if usage is not None and usage.completion_tokens else chunks)
        if first is None:
            rows.append((f"model {model}", "answered with no text", False))
            continue
        rate = (n - 1) / (end - first) if n > 1 and end > first else 0.0
        rows.append((f"model {model}", f"{n} tokens; first after {first - t0:.2f} s; {rate:.1f} tokens/s", True))
    return rows, all(ok for _, _, ok in rows)
