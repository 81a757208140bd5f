"""Reading a CUDA source the way the CUDA edits need it: its `__global__` kernels (name, launch
bounds, parameters, body) and the places kf_forward launches them (grid and block arguments).
Plain text positions, no compiler: an edit that misreads a kernel makes a wrong or uncompilable
candidate, which the evaluator rejects like any other.
"""
from __future__ import annotations

import re

from kfray.proposers.loop_edits import _match

_GLOBAL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\((?P<lb>(?:[^()]|\([^()]*\))*)\)\s*)?"
                     r"(?P<name>\w+)\s*\(")
_STATIC = re.compile(r"^[A-Z0-9_\s*+\-/()]+$")      # macros and numbers only: known at compile time


def kernels(src: str) -> list[dict]:
    """Each kernel: name, `lb` (launch-bounds text or None) and its span, params text, body span."""
    out = []
    for m in _GLOBAL.finditer(src):
        p_end = _match(src, m.end() - 1, "(", ")")
        b0 = src.find("{", p_end)
        if p_end < 0 or b0 < 0:
            continue
        b1 = _match(src, b0, "{", "}")
        out.append({"name": m.group("name"), "lb": m.group("lb"), "lb_span": m.span("lb"),
                    "name_at": m.start("name"), "params": src[m.end():p_end - 1], "body": (b0, b1)})
    return out


def _split_args(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "(<[" and not (ch == "<" and cur.endswith("<")):
            depth += 1
        elif ch in ")>]" and depth > 0:
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()] if cur.strip() else out


def launches(src: str, name: str) -> list[dict]:
    """Where `name` is launched: template arguments (or ''), grid and block argument spans."""
    out = []
    for m in re.finditer(rf"\b{name}\s*(<[^<>;]*>)?\s*<<<", src):
        end = src.find(">>>", m.end())
        if end < 0:
            continue
        args = _split_args(src[m.end():end])
        if len(args) < 2:
            continue
        g0 = src.index(args[0], m.end())
        b0 = src.index(args[1], g0 + len(args[0]))
        out.append({"targs": m.group(1) or "", "grid": (g0, g0 + len(args[0])), "block": (b0, b0 + len(args[1])),
                    "text": (args[0], args[1])})
    return out


def static_block(src: str, expr: str) -> str | None:
    """The block size of a launch as a compile-time expression (a dim3 variable resolved to the
    product of its sizes), or None when it is only known at run time."""
    expr = expr.strip()
    d = re.search(rf"\bdim3\s+{re.escape(expr)}\s*\(([^;]*)\)\s*;", src) if re.fullmatch(r"\w+", expr) else None
    if d:
        parts = _split_args(d.group(1))
        expr = " * ".join(f"({p})" if re.search(r"[+\-]", p) else p for p in parts)
    return expr if _STATIC.match(expr) else None


def pointer_params(params: str) -> dict[str, bool]:
    """Pointer parameters of a kernel: name -> whether it is const (read only)."""
    out = {}
    for p in _split_args(params):
        m = re.match(r"(const\s+)?(?:float|double|int|int64_t|__half|half)\s*\*\s*(?:__restrict__\s+)?(\w+)$", p)
        if m:
            out[m.group(2)] = bool(m.group(1))
    return out


def add_param(src: str, name: str, values: list, first) -> str:
    """Declare a new `@kf.param` (with its #define default) just after the last include."""
    vals = [first] + [v for v in values if v != first]
    decl = (f"// @kf.param {name} in [{', '.join(map(str, vals))}]\n"
            f"#ifndef {name}\n#define {name} {first}\n#endif\n")
    inc = list(re.finditer(r"^#include[^\n]*\n", src, re.M))
    at = inc[-1].end() if inc else 0
    return src[:at] + decl + src[at:]


def ensure_include(src: str, header: str) -> str:
    return src if f"<{header}>" in src else f"#include <{header}>\n" + src
