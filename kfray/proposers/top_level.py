"""The top-level items of a C++ kernel file (functions, structs, constants), and the name each one
declares: enough to carry a helper the parent defines into a child that calls it but dropped it
(kfray.proposers.fixups). Comments, strings and preprocessor lines are skipped, not parsed."""
from __future__ import annotations

import re
from dataclasses import dataclass

_DECLARED = re.compile(r"\b([A-Za-z_]\w*)\s*(?:\(|\[|=|;|\{|$)")
_KEYWORDS = {"struct", "class", "union", "enum", "namespace", "extern", "static", "inline", "const", "constexpr",
             "template", "typename", "void", "int", "float", "double", "char", "bool", "long", "unsigned",
             "signed", "short", "auto", "operator", "alignas", "__attribute__", "__restrict", "__restrict__"}


@dataclass
class Item:
    start: int          # offset of the item's first line
    end: int            # offset just past its closing brace or semicolon
    name: str           # the name it declares ("" if none was found)

    def text(self, source: str) -> str:
        return source[self.start:self.end]


def _skip(source: str, i: int) -> int:
    """Past a comment, string or character literal that starts at i (i itself where none does)."""
    if source.startswith("//", i):
        j = source.find("\n", i)
        return len(source) if j < 0 else j
    if source.startswith("/*", i):
        j = source.find("*/", i + 2)
        return len(source) if j < 0 else j + 2
    if source[i] in "\"'":
        q, j = source[i], i + 1
        while j < len(source) and source[j] != q:
            j += 2 if source[j] == "\\" else 1
        return j + 1
    return i


def _declared(head: str) -> str:
    """The name a declaration's head declares: the first identifier, outside parentheses and angle
    brackets, followed by `(`, `[`, `=`, `;`, `{` or the head's end."""
    flat, depth = [], 0
    for ch in head:
        if ch in "(<":
            if depth == 0:
                flat.append(ch)
            depth += 1
        elif ch in ")>":
            depth = max(0, depth - 1)
        elif depth == 0:
            flat.append(ch)
    for m in _DECLARED.finditer("".join(flat).strip()):
        if m.group(1) not in _KEYWORDS:
            return m.group(1)
    return ""


def items(source: str) -> list[Item]:
    """Top-level items in order; preprocessor lines and comments between them are not items (nor
    is what an `extern "C" { ... }` or namespace block holds: a kernel's helpers are at file scope)."""
    out: list[Item] = []
    i, n, depth, start, head_end = 0, len(source), 0, -1, -1
    while i < n:
        j = _skip(source, i)
        if j != i:
            i = j
            continue
        ch = source[i]
        if depth == 0 and start < 0:
            line_start = source.rfind("\n", 0, i) + 1
            if ch == "#" and not source[line_start:i].strip():        # a preprocessor line, continuations too
                while True:
                    e = source.find("\n", i)
                    if e < 0 or not source[i:e].rstrip().endswith("\\"):
                        break
                    i = e + 1
                i = n if e < 0 else e
                continue
            if not ch.isspace():
                start, head_end = line_start if not source[line_start:i].strip() else i, -1
        if ch == "{":
            if depth == 0 and head_end < 0:
                head_end = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0 and start >= 0:
                k = i + 1
                while k < n and source[k] in " \t":
                    k += 1
                if k < n and source[k] == ";":
                    i = k
                out.append(_item(source, start, i + 1, head_end))
                start = -1
        elif ch == ";" and depth == 0 and start >= 0:
            out.append(_item(source, start, i + 1, head_end))
            start = -1
        elif ch == "=" and depth == 0 and start >= 0 and head_end < 0:
            head_end = i
        i += 1
    return out


def _item(source: str, start: int, end: int, head_end: int) -> Item:
    head = source[start:head_end if head_end >= 0 else end].strip().rstrip(";")
    return Item(start, end, _declared(head))


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.M)
_OPEN = re.compile(r"^[ \t]*#[ \t]*if(?:n?def)?\b")
_CLOSE = re.compile(r"^[ \t]*#[ \t]*endif\b")


def defined_macros(source: str) -> set[str]:
    """The names a source's `#define` lines define."""
    return set(_DEFINE.findall(source))


def macro_blocks(source: str) -> list[tuple[str, set[str]]]:
    """Each top-level `#if ... #endif` group and each `#define` outside one, with the macro names it
    defines: (text, names). Groups are kept whole, so a carried macro keeps its alternatives."""
    out, group, depth = [], [], 0
    for line in source.splitlines(keepends=True):
        if depth or _OPEN.match(line):
            group.append(line)
            depth += 1 if _OPEN.match(line) else -1 if _CLOSE.match(line) else 0
            if depth == 0:
                text = "".join(group)
                out.append((text, set(_DEFINE.findall(text))))
                group = []
        elif _DEFINE.match(line):
            out.append((line, set(_DEFINE.findall(line))))
    return [(t, names) for t, names in out if names]
