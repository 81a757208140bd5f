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
