"""`PromptEvolver`: the one named actor that every island shares, holding a MetaPromptPopulation.

Thin on purpose: all logic lives in kfray.prompts.population, which tests drive without Ray. The actor
only serializes access from many islands and, for an LLM run, lends the proposer's meta-prompt rewrite.
"""
from __future__ import annotations

import dataclasses

from kfray.config import PromptConfig
from kfray.proposal import MetaPrompt
from kfray.prompts.population import MetaPromptPopulation


class PromptEvolver:
    """Holds one population; with an LLM proposer, new prompts are model rewrites (recombination on failure)."""

    def __init__(self, prompt_cfg: PromptConfig, proposer_cfg=None, seed: int = 0, ledger: str = ""):
        self.population = MetaPromptPopulation(size=prompt_cfg.population, explore=prompt_cfg.explore,
                                               evolve_every=prompt_cfg.evolve_every, seed=seed)
        self._rewrite = None
        self.winding_down = False
        if proposer_cfg is not None and getattr(proposer_cfg, "kind", "") == "llm":
            from kfray.proposers.llm import LLMProposer   # only LLM runs need openai
            from kfray.proposers.models import RemoteLedger

            # `ledger`: the run's shared ledger actor, so rewrites count against the run's token and
            # cost budget like the islands' calls do
            self._llm = LLMProposer(proposer_cfg, ledger=RemoteLedger(ledger)) if ledger else LLMProposer(proposer_cfg)
            self._rewrite = self._rewrite_in_budget

    def _rewrite_in_budget(self, sections: dict, feedback: str):
        """A model rewrite while the run's LLM budget lasts and the run has proposals left to use it;
        None (recombination, no request) once it is spent or the run is winding down."""
        if self.winding_down or getattr(self._llm, "exhausted", False):
            return None
        return self._llm.rewrite_meta_prompt(sections, feedback)

    def wind_down(self) -> None:
        """Fewer proposals are left in the run than a prompt generation: a model's rewrite now would be
        a request whose prompt is hardly used (a local model's last one took 38 s of a 45-minute run
        with 3 proposals to go), so new prompts are bred without the model."""
        self.winding_down = True

    def sample(self) -> MetaPrompt:
        return self.population.sample()

    def sample_many(self, n: int) -> list[MetaPrompt]:
        """n draws in one call: an island asks once per batch, not once per child."""
        return [self.population.sample() for _ in range(n)]

    def report(self, prompt_id: str, score: float) -> dict | None:
        """The new prompt as a dict when this report made one, else None."""
        mp = self.population.report(prompt_id, score, rewrite=self._rewrite)
        return dataclasses.asdict(mp) if mp is not None else None

    def snapshot(self) -> dict:
        return self.population.to_dict()

    def all_prompts(self) -> list[dict]:
        return self.population.all_prompts()

    def generations(self) -> int:
        return self.population.generations()

    def restore(self, snapshot: dict) -> None:
        """Continue from a snapshot (a resumed run, or a restart after this actor died)."""
        self.population = MetaPromptPopulation.from_dict(snapshot)


def evolver_name(run_name: str) -> str:
    """The run's prompt-evolver actor, which islands find by this name."""
    return f"{run_name}-prompt-evolver"


def make_prompt_evolver(name: str, prompt_cfg: PromptConfig, proposer_cfg=None, seed: int = 0):
    """Create (or attach to) the named evolver actor; num_cpus=0 so it never blocks evaluators."""
    import ray

    from kfray.proposers.models import ledger_name

    cls = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(PromptEvolver)
    return cls.options(name=name, get_if_exists=True, num_cpus=0).remote(prompt_cfg, proposer_cfg, seed,
                                                                         ledger_name(name))
