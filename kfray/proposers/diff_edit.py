"""SEARCH/REPLACE edits: how a small model changes a parent kernel without rewriting all of it.

A model that must return a whole file of 100 lines breaks something it did not mean to touch;
one that returns only the lines it changes does not (OpenEvolve and ShinkaEvolve ask for the
same format). An answer holds one or more blocks:

    <<<<<<< SEARCH
    lines copied exactly from the parent
    =======
    the lines that replace them
    >>>>>>> REPLACE

Pure functions; errors say which block failed and why, so the message can go back to the model.
"""
from __future__ import annotations

import re

_BLOCK_RE = re.compile(
    r"^[ \t]*<{5,9}[ \t]*SEARCH[ \t]*\n(.*?)^[ \t]*={5,9}[ \t]*\n(.*?)^[ \t]*>{5,9}[ \t]*REPLACE[ \t]*$",
    re.M | re.S)
_MARKER_RE = re.compile(r"^[ \t]*(<{5,9}[ \t]*SEARCH|>{5,9}[ \t]*REPLACE)", re.M)


class EditError(ValueError):
    """An answer's edits cannot be applied to the parent; the message says which block and why."""


def has_edits(text: str) -> bool:
    """True when the answer contains SEARCH/REPLACE markers (well-formed or not)."""
    return bool(_MARKER_RE.search(text or ""))


def parse_edits(text: str) -> list[tuple[str, str]]:
    """(search, replace) of every block, in order. EditError when markers are there but no block
    is well formed (a SEARCH without its ======= or REPLACE line)."""
    blocks = [(m.group(1), m.group(2)) for m in _BLOCK_RE.finditer(text or "")]
    if not blocks and has_edits(text):
        raise EditError("the SEARCH/REPLACE markers are malformed: each block needs a '<<<<<<< SEARCH' "
                        "line, the old lines, a '=======' line, the new lines and a '>>>>>>> REPLACE' line")
    return blocks


def _norm(line: str) -> str:
    return " ".join(line.split())


def _find(lines: list[str], search: list[str], exact: bool) -> int:
    n = len(search)
    key = search if exact else [_norm(s) for s in search]
    for i in range(len(lines) - n + 1):
        window = lines[i:i + n] if exact else [_norm(s) for s in lines[i:i + n]]
        if window == key:
            return i
    return -1


def _fuzzy(lines: list[str], search: list[str], cutoff: float) -> int:
    """The one window of len(search) lines most like the block (whitespace ignored), if it is at
    least `cutoff` alike and clearly better than the runner-up; else -1. Small models copy a line
    almost right (a renamed variable, a dropped cast)."""
    import difflib

    n, key = len(search), "\n".join(_norm(s) for s in search)
    scores = sorted(((difflib.SequenceMatcher(None, key, "\n".join(_norm(s) for s in lines[i:i + n])).ratio(), i)
                     for i in range(len(lines) - n + 1)), reverse=True)
    if not scores or scores[0][0] < cutoff or (len(scores) > 1 and scores[1][0] > scores[0][0] - 0.05):
        return -1
    return scores[0][1]


def _closest(lines: list[str], first: str) -> str:
    """The parent line most like the block's first line, for the error message."""
    import difflib

    target = _norm(first)
    best = difflib.get_close_matches(target, [_norm(s) for s in lines], n=1, cutoff=0.5)
    if not best:
        return ""
    i = [_norm(s) for s in lines].index(best[0])
    return f"; closest parent line {i + 1}: {lines[i].strip()[:80]!r}"


def apply_edits(source: str, edits: list[tuple[str, str]], fuzzy: float = 0.9) -> str:
    """The parent with each block's SEARCH lines replaced, in order.

    A block matches exactly, or else line by line with whitespace ignored (small models re-indent),
    or else (with `fuzzy` > 0) the one window of as many lines at least that alike; the first match
    is replaced. EditError names the first block that matches nowhere."""
    if not edits:
        raise EditError("no SEARCH/REPLACE block in the answer")
    lines = source.splitlines()
    for k, (search, replace) in enumerate(edits, 1):
        old = search.splitlines()
        new = replace.splitlines()
        where = f"SEARCH block {k} of {len(edits)}"
        while old and not old[0].strip():      # blank edges carry no anchor
            old = old[1:]
        while old and not old[-1].strip():
            old = old[:-1]
        if not old:
            raise EditError(f"{where} is empty: copy the lines to change from the parent into it")
        i = _find(lines, old, exact=True)
        if i < 0:
            i = _find(lines, old, exact=False)
        if i < 0 and fuzzy > 0:
            i = _fuzzy(lines, old, fuzzy)
        if i < 0:
            raise EditError(f"{where} does not match the parent: its first line {old[0].strip()[:80]!r} "
                            f"({len(old)} lines) is not in the parent{_closest(lines, old[0])}")
        lines[i:i + len(old)] = new
    return "\n".join(lines) + "\n"
