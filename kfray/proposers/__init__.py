"""Proposers write children: the offline proposer (templates, parameters, source edits) and the
LLM proposer, behind kfray.proposers.base.Proposer."""

__all__: list[str] = []       # modules are imported by name: kfray.proposers.offline, .llm, ...
