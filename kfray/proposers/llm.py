"""LLM proposer: an OpenAI-compatible chat endpoint writes the child kernel.

The call itself (a slot of the endpoint's concurrency limit, streaming, retries) is kfray.proposers.chat's. The
model answers with a whole file (`edit_mode: rewrite`; one that rewrote only part of its parent is made whole from
it, kfray.proposers.fragments) or with SEARCH/REPLACE blocks against the parent (`diff`, kfray.proposers.diff_edit),
or the proposer picks per call by a UCB bandit over the two (`auto`). A candidate marked `ctx.repair` is a failed
kernel sent back once with its diagnostics. `propose` never raises: a failure is a tier-0 candidate whose
`no_code_reason` says why.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import yaml

from kfray.candidate import Candidate
from kfray.config import ProposerConfig
from kfray.errors import ConfigError, KfrayError
from kfray.prompts.budget import Section, estimate_tokens, fit
from kfray.prompts.builder import build_messages, edit_base
from kfray.proposers.answers import (LOOP_SPAN, answer_tokens, complete, extract_code, fenced_blocks, looping,
                                    open_block, written)
from kfray.proposers.base import Proposer, ProposalContext
from kfray.proposers.chat import Endpoint
from kfray.proposers.diff_edit import EditError, apply_edits, has_edits, parse_edits
from kfray.proposers.fragments import C_LIKE, complete_from_parent
from kfray.proposers.futile import prompt_key
from kfray.proposers.slots import EndpointSlots, default_limit, is_local
from kfray.source import parse_params

META_SECTIONS = ("philosophy", "strategies", "pitfalls", "analysis")
MODES = ("diff", "rewrite")
EDIT_FAILED = "the edit does not apply: "


class LLMProposer(Proposer):
    """Proposes children by asking a chat model; also rewrites meta-prompts for the PromptEvolver.

    With `proposer.models` it chooses among several models per call (by weight, or by a UCB bandit
    over the improvement each model's children brought), accounts tokens and cost per model in a
    `Ledger` (shared by all islands when `ledger` is a RemoteLedger), and reports `exhausted` once
    `proposer.max_cost` or `proposer.token_budget` is spent."""

    name = "llm"

    def __init__(self, cfg: ProposerConfig, ledger=None):
        from kfray.proposers.models import Ledger, ModelSpec, parse_models

        self.cfg = cfg
        self.base_url = (cfg.base_url or os.environ.get("OPENAI_BASE_URL", "")).strip()
        specs = parse_models(cfg)
        if not specs:
            model = (cfg.model or os.environ.get("KFRAY_MODEL", "")).strip()
            if not model:
                raise ConfigError("LLM proposer: no model; set proposer.model (or proposer.models) in the "
                                  "config or the KFRAY_MODEL environment variable")
            specs = [ModelSpec(model=model)]
        self.models = specs
        self.model = specs[0].model
        self.endpoints: dict[str, Endpoint] = {}     # model -> its endpoint
        by_endpoint: dict[tuple[str, str], Endpoint] = {}
        for spec in specs:
            url = (spec.base_url or self.base_url).strip()
            if not url:
                raise ConfigError("LLM proposer: no endpoint; set proposer.base_url in the config "
                                  "or the OPENAI_BASE_URL environment variable"
                                  + (f" (or base_url of model {spec.model})" if len(specs) > 1 else ""))
            key_env = spec.api_key_env or cfg.api_key_env
            key = os.environ.get(key_env, "")
            if not key:
                if is_local(url):
                    key = "EMPTY"  # local servers (vLLM, llama.cpp) accept any key
                else:
                    raise ConfigError(f"LLM proposer: endpoint {url} needs an API key; "
                                      f"set the environment variable {key_env} "
                                      f"(or proposer.api_key_env to the variable that holds it)")
            if (url, key) not in by_endpoint:
                slots = EndpointSlots(url, default_limit(url, getattr(cfg, "max_concurrent", 0)))
                by_endpoint[(url, key)] = Endpoint(url, key, cfg, slots)
            self.endpoints[spec.model] = by_endpoint[(url, key)]
        # model -> (openai client, base url), as preflight and doctor use them
        self.clients = {m: (e.client, e.url) for m, e in self.endpoints.items()}
        if not self.base_url:
            self.base_url = self.clients[self.model][1]
        self.client = self.clients[self.model][0]
        self.ledger = ledger if ledger is not None else Ledger()
        self.pending: dict[str, int] = {}       # model -> children not yet scored
        self.usage = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "failures": 0}
        self.modes = {m: [0, 0.0] for m in MODES}    # edit mode -> [rewards, reward sum] (auto)
        self.written: dict[str, tuple[str, str]] = {}  # candidate id -> (model, edit mode)
        self.asked: dict[str, str] = {}        # candidate id -> its request's key (kfray.proposers.futile)
        self.last: dict = {}                   # what the last proposal cost and how it parsed
        # when this proposer's current batch began (wall time, set by its island): every request
        # of the batch waits for a slot with that rank (kfray.proposers.slots); None: when sent
        self.batch_began: float | None = None

    def begin_batch(self) -> None:
        self.batch_began = time.time()

    # -- choosing a model, accounting ------------------------------------------------------------

    def choose(self, rng=None):
        """The ModelSpec for the next call (weights, or the UCB bandit when proposer.bandit is on)."""
        import random as _random

        from kfray.proposers.models import choose_model

        if len(self.models) == 1:
            return self.models[0]
        snap = self.ledger.snapshot() if getattr(self.cfg, "bandit", False) else {}
        return choose_model(self.models, snap, rng if rng is not None else _random, self.cfg.bandit,
                            self.cfg.bandit_c, self.cfg.bandit_cost, self.pending)

    @property
    def exhausted(self) -> bool:
        from kfray.proposers.models import over_budget

        if not (self.cfg.max_cost > 0 or self.cfg.token_budget > 0):
            return False
        return over_budget(self.ledger.snapshot(), self.cfg.max_cost, self.cfg.token_budget)

    def feedback(self, cand: Candidate, record: dict) -> None:
        """Score the model that wrote `cand` by its child's improvement (for the bandit)."""
        from kfray.proposers.models import reward

        origin = record.get("origin") or cand.origin
        model, mode = self.written.pop(cand.id, (origin[4:] if origin.startswith("llm:") else "", ""))
        self.asked.pop(cand.id, None)
        value = reward(float(record.get("improvement", 0.0)))
        if mode in self.modes:
            self.modes[mode][0] += 1
            self.modes[mode][1] += value
        if model not in self.clients:
            return
        self.pending[model] = max(0, self.pending.get(model, 0) - 1)
        self.ledger.reward(model, value)

    # A repeated answer is asked again proposer.repeat_asks times, then edited (kfray.search.repeats)
    repeat_asks = property(lambda self: max(0, int(getattr(self.cfg, "repeat_asks", 1))))

    REPEAT_HEAT = 0.3               # temperature added per repeat, up to 1.3

    def repeated(self, cand: Candidate, dropped: bool = True) -> None:
        model, _mode = (self.written.pop if dropped else self.written.get)(cand.id, ("", ""))
        key = self.asked.pop(cand.id, None)
        if key is not None and model in self.endpoints:     # kept by the endpoint, for every island
            self.endpoints[model].slots.note(key, cand.source, cand.params)
        if model in self.clients:
            if dropped:
                self.pending[model] = max(0, self.pending.get(model, 0) - 1)
            self.ledger.repeat(model, remembered=key is None)

    def usage_by_model(self) -> dict:
        return self.ledger.snapshot()

    def restore_usage(self, usage: dict) -> None:
        if usage:
            self.ledger.floor(usage)

    # -- the chat call -------------------------------------------------------------------------

    def complete(self, messages: list[dict], spec=None, purpose: str = "proposal", base: str | None = None,
                 mode: str = "", temperature: float | None = None, language: str = "") -> str:
        """One chat completion, with our retries. Raises KfrayError naming the endpoint on failure.
        `purpose` is what the request is accounted as (kfray.proposers.models.PURPOSES); `base` and
        `mode`, the source the answer edits or rewrites, bound a local model's answer (answer_tokens),
        and a local model's whole file in `language` ends where its code block does (answers.written)
        or where it begins to repeat itself (answers.looping)."""
        spec = spec or self.choose()
        endpoint = self.endpoints[spec.model]
        limit = answer_tokens(base, mode, self.cfg.max_tokens) if mode and is_local(endpoint.url) else None
        # a whole file ends at its closing fence, or at its first word-for-word repeat (a diff's
        # REPLACE repeats its SEARCH by design)
        whole = limit and mode == "rewrite" and language
        done = (lambda text: written(text, language) or looping(text)) if whole else None
        try:
            ans = endpoint.complete(spec.model, messages, max_tokens=limit, rank=self.batch_began,
                                    temperature=temperature, done=done)
        except KfrayError:
            self.usage["failures"] += 1
            self.ledger.charge(spec.model, 0, 0, 0.0, failed=True)
            raise
        self.usage["calls"] += 1
        self.usage["prompt_tokens"] += ans.prompt_tokens
        self.usage["completion_tokens"] += ans.completion_tokens
        self.ledger.charge(spec.model, ans.prompt_tokens, ans.completion_tokens,
                           spec.cost(ans.prompt_tokens, ans.completion_tokens), purpose=purpose)
        self.last.update(prompt_tokens=ans.prompt_tokens, completion_tokens=ans.completion_tokens,
                         request_s=ans.seconds, waited_s=ans.waited_s)
        return ans.text

    def choose_mode(self, ctx: ProposalContext) -> str:
        """diff or rewrite for this call: the config's, or with `auto` a UCB choice between them
        (reward: the child's improvement, as for models); a repair is a diff unless `rewrite`; with
        nothing to edit (no parent, no seed), a rewrite."""
        mode = getattr(self.cfg, "edit_mode", "diff")
        if edit_base(ctx) is None:          # no parent and no seed: nothing to edit
            return "rewrite"
        if mode != "auto":
            return mode
        if ctx.repair:
            return "diff"
        n_total = sum(n for n, _ in self.modes.values())
        untried = [m for m in MODES if self.modes[m][0] == 0]
        if untried:
            return min(untried, key=lambda m: self.written_count(m))
        return max(MODES, key=lambda m: self.modes[m][1] / self.modes[m][0]
                   + self.cfg.bandit_c * math.sqrt(2 * math.log(n_total) / self.modes[m][0]))

    def written_count(self, mode: str) -> int:
        return sum(1 for _, m in self.written.values() if m == mode)

    # -- proposals -----------------------------------------------------------------------------

    def propose(self, ctx: ProposalContext, rng) -> Candidate:
        t0, ctx = time.monotonic(), dataclasses.replace(ctx, comments=getattr(self.cfg, "comments", True))
        parent = ctx.parent.candidate if ctx.parent else None
        spec = self.choose(rng)
        mode = self.choose_mode(ctx)
        cand = Candidate(task=ctx.task.name, language=ctx.language, source="", island=ctx.island,
                         parent_id=parent.id if parent else None,
                         prompt_id=ctx.meta_prompt.id if ctx.meta_prompt else None,
                         origin="llm:repair" if ctx.repair else f"llm:{spec.model}", generation=ctx.generation)
        self.pending[spec.model] = self.pending.get(spec.model, 0) + 1
        self.written[cand.id] = (spec.model, mode)
        for d in (self.written, self.asked):
            while len(d) > 4096:
                d.pop(next(iter(d)))
        self.last = {"mode": mode, "repair": ctx.repair, "parsed": False, "answers": [], "edit_error": ""}
        try:
            messages = build_messages(ctx, mode, getattr(self.cfg, "prompt_tokens", 0))
            heat = min(1.3, self.cfg.temperature + self.REPEAT_HEAT * ctx.repeats) if ctx.repeats else None
            key = prompt_key(spec.model, mode, heat, messages)
            known = self.endpoints[spec.model].slots.remembered(key)
            if known is not None:       # this very request came back as a repeat twice: not asked again
                cand.source, cand.params = known
                self.last.update(parsed=True, remembered=True)
                cand.propose_seconds = time.monotonic() - t0
                return cand
            self.asked[cand.id] = key
            text = self.complete(messages, spec, "repair" if ctx.repair else "proposal", edit_base(ctx), mode, heat,
                                 ctx.language)
            self.last["answers"] = [text]
            code, why = self.read_answer(text, ctx, mode)
            if code is None and mode == "diff" and getattr(self.cfg, "repair", False):
                # edits that do not apply, or a snippet that is neither edits nor a file: ask once
                # more for the whole file (asked to retry its edits in the same conversation, a 1.5B
                # model apologised and wrote no code)
                self.last["edit_error"] = why
                tokens = dict(prompt_tokens=self.last.get("prompt_tokens", 0),
                              completion_tokens=self.last.get("completion_tokens", 0))
                text = self.complete(build_messages(ctx, "rewrite", getattr(self.cfg, "prompt_tokens", 0)), spec,
                                     "retry", edit_base(ctx), "rewrite", heat, ctx.language)
                for k, v in tokens.items():
                    self.last[k] += v
                self.last["answers"].append(text)
                code, why = self.read_answer(text, ctx, "rewrite")
            if code is None:
                cand.no_code_reason = why
            else:
                self.last["parsed"] = True
                whole = complete_from_parent(code, edit_base(ctx)) if ctx.language in C_LIKE else (code, [])
                cand.source, self.last["borrowed"] = whole
                cand.params = self._pick_params(cand.source, parent.params if parent else {})
        except Exception as e:  # never raise from propose: a failure is a tier-0 candidate
            cand.no_code_reason = str(e) or type(e).__name__
        self.last["no_code_reason"] = cand.no_code_reason
        cand.propose_seconds = time.monotonic() - t0
        return cand

    @staticmethod
    def read_answer(text: str, ctx: ProposalContext, mode: str) -> tuple[str | None, str]:
        """(the child's source, "") or (None, why not). In diff mode, SEARCH/REPLACE blocks are applied
        to the parent; a whole file in a fenced block is taken as well (small models do that)."""
        base = edit_base(ctx)
        if has_edits(text) and base is not None:
            try:
                return apply_edits(base, parse_edits(text)), ""
            except EditError as e:
                return None, f"{EDIT_FAILED}{e}"
        code = extract_code(text, ctx.language)
        if code is not None:
            return code, ""
        entry = {"opencl": "__kernel", "sycl_jit": "@kf.launch"}.get(ctx.language, "kf_forward")
        blocks, tail = fenced_blocks(text), open_block(text)
        if tail is not None and not blocks and looping(text):
            return None, (f"the model began to repeat itself word for word ({len(text)} characters; the last "
                          f"{LOOP_SPAN} stand earlier in its answer), and its answer was closed there: "
                          f"...{text.rstrip()[-120:]}")
        if tail is not None and not blocks and not complete(tail[1], tail[0]):
            return None, (f"the answer ends inside its code block ({len(text)} characters, its braces unclosed): "
                          "cut off at the server's length limit or proposer.max_tokens, or left unfinished: "
                          f"...{text.rstrip()[-120:]}")
        what = (f"no code block with {entry} in the model's answer" if blocks
                else "no SEARCH/REPLACE block and no code block in the model's answer" if mode == "diff"
                else "no code block in the model's answer")
        return None, f"{what}: {text.strip()[:200] or '<empty answer>'}"

    @staticmethod
    def _pick_params(code: str, parent_params: dict) -> dict:
        """Keep the parent's value where the new space still allows it, else the first allowed setting."""
        space = parse_params(code)
        default = space.default()
        if not default:
            return {}
        merged = {n: parent_params[n] if parent_params.get(n) in vals else default[n]
                  for n, vals in space.values.items()}
        try:
            return merged if space.allows(merged) else default
        except ValueError:
            return default

    # -- meta-prompt evolution -----------------------------------------------------------------

    def rewrite_meta_prompt(self, sections: dict[str, str], feedback: str) -> dict[str, str] | None:
        """Ask the model for improved meta-prompt sections; None when the answer cannot be parsed."""
        current = "\n\n".join(f"### {k}\n{sections.get(k, '').strip()}" for k in META_SECTIONS)
        system = "You improve the instructions given to a kernel-writing model. Be concrete and brief."
        # Held to the prompt budget like a proposal: the sections and the ask always go; the
        # feedback's paragraphs (the scores first, then the other parent's sections) while they fit.
        parts = [Section(f"These meta-prompt sections steer a model that writes fast GPU kernels:\n\n{current}\n\n"
                         "## Performance feedback")]
        parts += [Section(par.strip(), k + 1) for k, par in enumerate(feedback.strip().split("\n\n")) if par.strip()]
        parts.append(Section(f"\nRewrite the four sections to produce faster correct kernels. Answer with exactly one "
                             f"```yaml code block holding a mapping with exactly the keys "
                             f"{', '.join(META_SECTIONS)}; each value is a string (use YAML block scalars `|`)."))
        user, _dropped = fit(parts, getattr(self.cfg, "prompt_tokens", 0) or 0, reserve=estimate_tokens(system))
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        try:
            text = self.complete(messages, purpose="prompt")
        except KfrayError:
            return None
        return parse_sections(text)


def parse_sections(text: str) -> dict[str, str] | None:
    """The four meta-prompt sections from a YAML or JSON mapping (fenced or bare), else None."""
    candidates = [body for _, body in fenced_blocks(text)] + [text]
    for body in candidates:
        data = None
        for load in (json.loads, yaml.safe_load):
            try:
                data = load(body)
                break
            except Exception:
                continue
        if not isinstance(data, dict):
            continue
        out = {}
        for k in META_SECTIONS:
            v = data.get(k)
            if isinstance(v, list):
                v = "\n".join(f"- {x}" for x in v)
            if not isinstance(v, str) or not v.strip():
                break
            out[k] = v.strip()
        else:
            return out
    return None
