"""What a model's answer holds: its fenced code blocks, the kernel among them, whether a block left
open is a whole file, and how long a local model's answer may run. Pure text functions, shared by
the LLM proposer and the client that streams its answers."""
from __future__ import annotations

import re

_CODE_TAGS = {"", "cpp", "c++", "cuda", "cu", "c", "sycl", "opencl", "cl"}
_SUITE_TAGS = _CODE_TAGS | {"python", "py"}      # a KernelBench ModelNew file is Python
_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.M | re.S)


def _entry(language: str) -> re.Pattern:
    return re.compile({"opencl": r"__kernel\b|\bkernel\s+void\b", "sycl_jit": r"@kf\.launch\b",
                       "suite": r"^class\s+ModelNew\b|PYBIND11_MODULE"}.get(language, r"\bkf_forward\b"), re.M)


def _tags(language: str) -> set:
    return _SUITE_TAGS if language == "suite" else _CODE_TAGS


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(tag, body) of every fenced code block, tag lower-cased."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(text or "")]


def extract_code(text: str, language: str) -> str | None:
    """The kernel source in a model's answer: the largest code block that holds the entry point (for
    OpenCL any `__kernel`, for run-time SYCL a `@kf.launch` declaration, else `kf_forward`), or None."""
    marker, tags = _entry(language), _tags(language)
    usable = [body for tag, body in fenced_blocks(text) if tag in tags and marker.search(body)]
    tail = open_block(text)
    if tail is not None and tail[0] in tags and marker.search(tail[1]) and complete(tail[1], tail[0]):
        usable.append(tail[1])
    if not usable:
        return None
    return max(usable, key=len).strip() + "\n"


_OPEN_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*)\Z", re.M | re.S)


def open_block(text: str) -> tuple[str, str] | None:
    """(tag, body) of a code block the answer opens last and never closes: a small model forgets
    the closing fence, and an answer cut at its length limit ends inside its block."""
    text = text or ""
    closed = list(_FENCE_RE.finditer(text))
    m = _OPEN_FENCE_RE.search(text, closed[-1].end() if closed else 0)
    return (m.group(1).lower(), m.group(2)) if m else None


def complete(body: str, tag: str) -> bool:
    """Whether a block without its closing fence holds a whole file: Python that parses, or C-like
    source whose braces close (comments and strings aside, roughly)."""
    if tag in ("python", "py"):
        import ast

        try:
            ast.parse(body)
            return True
        except SyntaxError:
            return False
    code = re.sub(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", "", body, flags=re.S)
    return code.count("{") > 0 and code.count("{") == code.count("}") and code.rstrip().endswith(("}", ";"))


def answer_tokens(base: str | None, mode: str, ceiling: int) -> int:
    """The most a local model may write in one answer: one and a half times the source it rewrites
    (a whole file and a few lines around it), about that source for edits, at least 512 tokens,
    never more than proposer.max_tokens. In a 45-minute run of a 1.5B model on 2 cores, three
    answers wrote on past their file and ended with no closing fence, one of them 6.3 minutes of
    the server's time with nothing evaluated meanwhile (proposer.max_tokens was 4096); with twice
    the source, two answers of another run looped to their 1923-token limit, 200 s each."""
    if not base:
        return ceiling
    est = len(base) // 3 + 1                   # code: about three characters a token
    want = 3 * est // 2 + 256 if mode == "rewrite" else est + 256
    return min(ceiling, max(512, want))


LOOP_SPAN = 400      # characters: about 130 tokens of code, 15 s of a 1.5B model on one core


def looping(text: str, span: int = LOOP_SPAN) -> bool:
    """Whether an answer has begun to repeat itself word for word: its last `span` characters stand
    earlier in it already. A small model in a loop writes the same block until its token limit (in a
    45-minute run of a 1.5B model on 2 cores, one answer wrote its helper and entry point three times
    over, 236 s of the server's 2,700, and ended unfinished); a kernel seldom holds 400 characters
    twice, and the loop is seen at its first repeat."""
    return len(text) >= 2 * span and text.find(text[-span:]) < len(text) - span


def written(text: str, language: str) -> bool:
    """Whether a whole-file answer has written its file: a closed code block that holds the entry
    point and is whole itself (a block that only repeats the contract's signature is not). What a
    small model writes after it is prose the proposer never reads, so a streamed answer ends there
    (on a one-slot server, every token is the whole server's time)."""
    return "```" in text and any(tag in _tags(language) and _entry(language).search(body) and complete(body, tag)
                                   for tag, body in fenced_blocks(text))
