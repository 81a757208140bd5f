"""A model's answer that rewrote only part of its parent, made whole from the parent before it is
compiled.

Asked for a whole file, a small model often writes back only `kf_forward`, still calling the
parent's helpers and naming its parameters (`kf_slice`, `kf_row`, `CH`, `ROW_STEP`): in two
40-minute runs with a 1.5B model, 21 of 29 LLM candidates that failed to compile had at least one
such name undeclared. Read as an edit of the parent (the answer's items replace the parent's of
the same name, everything else of the parent stays), the answer compiles on its first build
instead of costing a failed build and a fix-up. An answer that defines everything it uses is
taken as it is.
"""
from __future__ import annotations

import re

from kfray.proposers import top_level
from kfray.proposers.fixups import _INCLUDE, _PARAM, add_includes, add_param_lines, defined_names

_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
C_LIKE = ("cpp", "cuda", "opencl", "sycl")


def borrowed_names(code: str, parent: str) -> set[str]:
    """Names the answer uses but does not define which the parent defines: its helpers, parameters
    and macros."""
    used = set(_WORD.findall(_COMMENT.sub(" ", code)))
    return (used & defined_names(parent)) - defined_names(code)


def complete_from_parent(code: str, parent: str | None) -> tuple[str, list[str]]:
    """(the answer made whole, the parent's names it borrowed); the answer unchanged and [] where it
    borrows nothing. The parent's items the answer redefines are replaced in place, its new items go
    before the first of those (helpers before their use), and the answer's own includes and
    parameter lines are kept."""
    if not parent:
        return code, []
    borrowed = borrowed_names(code, parent)
    if not borrowed:
        return code, []
    ours = top_level.items(code)
    mine = {it.name: it for it in ours if it.name}
    theirs = top_level.items(parent)
    names = {it.name for it in theirs}
    out, at, cursor = [], None, 0           # at: the piece of the parent just before its first replaced item
    for it in theirs:
        if it.name in mine:
            at = len(out) if at is None else at
            out += [parent[cursor:it.start], mine[it.name].text(code)]
            cursor = it.end
    out.append(parent[cursor:])
    new = "".join(it.text(code).strip("\n") + "\n\n" for it in ours if it.name not in names)
    if new and at is None:
        out.append("\n" + new)
    elif new:
        out[at] += new
    whole = "".join(out)
    have = set(_INCLUDE.findall(whole))
    includes = [h for h in dict.fromkeys(_INCLUDE.findall(code)) if h not in have]
    if includes:
        whole = add_includes(whole, includes)
    declared = set(_PARAM.findall(whole))
    lines = [m.group(0).strip() for m in _PARAM.finditer(code) if m.group(1) not in declared]
    if lines:
        whole = add_param_lines(whole, lines)
    return whole, sorted(borrowed)
