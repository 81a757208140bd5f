"""A prompt budget in tokens: what matters most goes in first, the rest only while room remains.

A local model with a 4k context that is handed 3,000 tokens of prompt has no room left to answer,
and a small model reads a short prompt better. Sections carry a priority: the task, the contract,
the parent and its feedback (or a failed kernel's diagnostics) are always kept; device facts,
directives, meta-prompt advice and inspirations follow in that order while they fit. The kept
sections are shown in their usual order.
"""
from __future__ import annotations

from dataclasses import dataclass

CHARS_PER_TOKEN = 3.2           # code and prose through a BPE tokenizer (Qwen, Llama): 3-4 chars


def estimate_tokens(text: str) -> int:
    return int(len(text) / CHARS_PER_TOKEN) + 1


@dataclass
class Section:
    text: str
    priority: int = 0            # 0: always kept; higher numbers are dropped first


def fit(sections: list[Section], budget_tokens: int, reserve: int = 0) -> tuple[str, list[int]]:
    """The sections that fit `budget_tokens` (less `reserve` for the system message), in their
    original order, and the indexes of those dropped. Priority-0 sections are kept even if over."""
    if budget_tokens <= 0:
        return "\n".join(s.text for s in sections), []
    room = budget_tokens - reserve - sum(estimate_tokens(s.text) for s in sections if s.priority == 0)
    keep = {i for i, s in enumerate(sections) if s.priority == 0}
    for i in sorted((i for i, s in enumerate(sections) if s.priority > 0),
                    key=lambda i: (sections[i].priority, i)):
        cost = estimate_tokens(sections[i].text)
        if cost <= room:
            keep.add(i)
            room -= cost
    dropped = [i for i in range(len(sections)) if i not in keep]
    return "\n".join(s.text for i, s in enumerate(sections) if i in keep), dropped
