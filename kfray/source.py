"""Kernel source annotations: `@kf.param`, `@kf.require`, `@kf.launch`, plus normalisation for dedupe.

    // @kf.param BLOCK  in [64, 128, 256, 512]
    // @kf.require BLOCK * UNROLL <= 4096
    // @kf.launch softmax_rows global=(rows * WG) local=(WG)

A launch declaration belongs to the source (kernels compiled at run time carry no host code), so it
is parsed here; its sizes are checked as SYCL and OpenCL require them, whatever device runs them.

Expressions are evaluated by a tiny AST walker (arithmetic, comparisons, and/or, names), never `eval`.
"""
from __future__ import annotations

import ast
import hashlib
import itertools
import json
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Iterator

_PARAM_RE = re.compile(r"@kf\.param\s+([A-Za-z_]\w*)\s+in\s+\[([^\]]*)\]")
_REQUIRE_RE = re.compile(r"@kf\.require\s+(.+?)\s*(?:\*/)?\s*$", re.M)
# A declaration is a kernel name followed by key=(...) pairs; prose that mentions @kf.launch is not.
_LAUNCH_RE = re.compile(r"@kf\.launch[ \t]+([A-Za-z_]\w*[ \t]+\w+[ \t]*=[^\n]*)")
_LINE_COMMENT = re.compile(r"//[^\n]*")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
# a string or character literal (group 1), else a comment: comments found outside literals
COMMENT_OR_LITERAL = re.compile(r"(\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*')|//[^\n]*|/\*[\s\S]*?\*/")


@dataclass(frozen=True)
class ParamSpace:
    """The tunables a source declares and the constraints between them."""

    values: dict[str, tuple]
    requires: tuple[str, ...] = ()

    def allows(self, setting: dict[str, Any]) -> bool:
        """False when a constraint fails or cannot be evaluated (e.g. names an unknown macro)."""
        env = dict(setting)
        try:
            return all(bool(safe_eval(r, env)) for r in self.requires)
        except ValueError:
            return False

    def settings(self) -> Iterator[dict[str, Any]]:
        """Every allowed setting, in declaration order."""
        names = list(self.values)
        for combo in itertools.product(*(self.values[n] for n in names)):
            s = dict(zip(names, combo))
            if self.allows(s):
                yield s

    def size(self) -> int:
        n = 1
        for v in self.values.values():
            n *= len(v)
        return n

    def default(self) -> dict[str, Any]:
        """The first allowed setting (declaration order), or {} when there are no tunables."""
        return next(self.settings(), {})


def _literal(tok: str) -> Any:
    tok = tok.strip()
    try:
        return int(tok)
    except ValueError:
        try:
            return float(tok)
        except ValueError:
            return tok.strip("'\"")


def parse_params(source: str) -> ParamSpace:
    values: dict[str, tuple] = {}
    for name, body in _PARAM_RE.findall(source):
        vals = tuple(_literal(t) for t in body.split(",") if t.strip())
        if vals:
            values[name] = vals
    requires = tuple(r.strip() for r in _REQUIRE_RE.findall(source) if r.strip())
    return ParamSpace(values, requires)


def define_flags(params: dict[str, Any]) -> list[str]:
    """`-DNAME=VALUE` for each parameter (names are checked identifiers; values are numbers)."""
    flags = []
    for k, v in sorted(params.items()):
        if not re.fullmatch(r"[A-Za-z_]\w*", str(k)):
            raise ValueError(f"bad parameter name {k!r}")
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ValueError(f"parameter {k} must be a number, got {v!r}")
        flags.append(f"-D{k}={v}")
    return flags


# --- launch declarations ------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """One `@kf.launch` declaration: a kernel and its global and local sizes, as expressions."""

    kernel: str
    global_size: tuple[str, ...]
    local_size: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "global": list(self.global_size), "local": list(self.local_size)}

    @classmethod
    def from_dict(cls, d: dict) -> "Launch":
        return cls(d["kernel"], tuple(d["global"]), tuple(d["local"]))


def _balanced(text: str, start: int) -> tuple[str, int]:
    """The text inside the parentheses that open at text[start]; and the index after them."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
    raise ValueError("unbalanced parentheses")


def _split_top(text: str) -> tuple[str, ...]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    parts.append(cur.strip())
    return tuple(p for p in parts if p)


def parse_launches(source: str) -> list[Launch]:
    """The `@kf.launch` declarations of a source, in order; ValueError names what is wrong."""
    out = []
    for m in _LAUNCH_RE.finditer(source):
        line = m.group(1).strip().rstrip("*/").strip()
        what = f"bad launch declaration '@kf.launch {line}'"
        name = re.match(r"([A-Za-z_]\w*)\s*", line)
        if not name:
            raise ValueError(f"{what}: expected a kernel name first")
        rest, sizes = line[name.end():], {}
        while rest.strip():
            kv = re.match(r"\s*(global|local)\s*=\s*", rest)
            if not kv or rest[kv.end():kv.end() + 1] != "(":
                raise ValueError(f"{what}: expected global=(...) local=(...)")
            try:
                body, end = _balanced(rest, kv.end())
            except ValueError:
                raise ValueError(f"{what}: unbalanced parentheses") from None
            sizes[kv.group(1)] = _split_top(body)
            rest = rest[end:]
        if "global" not in sizes or "local" not in sizes:
            raise ValueError(f"{what}: both global=(...) and local=(...) are required")
        g, loc = sizes["global"], sizes["local"]
        if not 1 <= len(g) <= 3 or len(g) != len(loc):
            raise ValueError(f"{what}: global and local need the same number of dimensions (1 to 3)")
        out.append(Launch(name.group(1), g, loc))
    return out


def _as_size(value: Any, expr: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"'{expr}' is not a number")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"'{expr}' = {value} is not a whole number (use // for integer division)")
        value = int(value)
    if value <= 0:
        raise ValueError(f"'{expr}' = {value} must be positive")
    return int(value)


def launch_ranges(launch: Launch, env: dict[str, Any], max_wg: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Global and local sizes of one launch, checked as SYCL requires them."""
    g = tuple(_as_size(safe_eval(e, env), e) for e in launch.global_size)
    loc = tuple(_as_size(safe_eval(e, env), e) for e in launch.local_size)
    for d, (gs, ls) in enumerate(zip(g, loc)):
        if gs % ls:
            raise ValueError(f"launch of {launch.kernel}: global size {gs} is not a multiple of the local size "
                             f"{ls} in dimension {d} (round it up, e.g. ((n + L - 1) // L) * L, and guard "
                             f"the tail in the kernel)")
    wg = math.prod(loc)
    if max_wg and wg > max_wg:
        raise ValueError(f"launch of {launch.kernel}: work-group size {wg} exceeds the device's maximum {max_wg}")
    return g, loc


def uncommented(source: str) -> str:
    """A C-family source without its comments, the `@kf` annotation lines kept whole: what a slow
    local model reads and writes (a fifth of a seed's characters are comments, and a model that
    is shown comments writes its own). String and character literals are left as they are; a
    source the pattern may misread (a raw string, a comment ended by a line continuation) comes
    back unchanged, as does one whose code would differ from the original's."""
    if 'R"' in source or re.search(r"//[^\n]*\\\n", source):
        return source

    def drop(m: re.Match) -> str:       # each line a comment covered is marked, its breaks kept
        if m.group(1) or "@kf." in m.group(0):
            return m.group(0)
        return "\0" + "\n\0" * m.group(0).count("\n")

    marked = COMMENT_OR_LITERAL.sub(drop, source)
    # a line that held only comments goes; blank lines stay, one at most in a row
    lines = [ln.replace("\0", "").rstrip() for ln in marked.split("\n") if ln.strip(" \t\0") or "\0" not in ln]
    kept = [ln for k, ln in enumerate(lines) if ln or (k and lines[k - 1])]
    bare = "\n".join(kept).strip("\n") + "\n"
    return bare if normalize(bare) == normalize(source) else source


def normalize(source: str) -> str:
    """Source without comments and with collapsed whitespace, so cosmetic edits dedupe.

    `@kf.param` lines are comments but define the tunable space, so they are kept."""
    params = "\n".join(sorted(m.group(0) for m in _PARAM_RE.finditer(source)))
    s = _BLOCK_COMMENT.sub(" ", source)
    s = _LINE_COMMENT.sub(" ", s)
    s = re.sub(r"\s+", " ", s).strip()
    return params + "\n" + s


def source_hash(source: str, params: dict[str, Any] | None = None) -> str:
    """Identity of a candidate for dedupe: normalised source plus its parameter setting."""
    h = hashlib.sha256(normalize(source).encode())
    h.update(json.dumps(params or {}, sort_keys=True).encode())
    return h.hexdigest()[:20]


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}


def safe_eval(expr: str, env: dict[str, Any]) -> Any:
    """Evaluate an arithmetic/boolean expression over `env`; anything else is a ValueError."""
    expr = expr.replace("&&", " and ").replace("||", " or ")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"cannot parse expression {expr!r}: {e.msg}") from None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise ValueError(f"unknown name {node.id!r} in {expr!r}")
            return env[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 2 ** 32):
                raise ValueError(f"exponent too large in {expr!r}")   # 9**9**9 must not freeze us
            try:
                return _BINOPS[type(node.op)](left, right)
            except (ArithmeticError, TypeError) as e:
                raise ValueError(f"cannot evaluate {expr!r}: {e}") from None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else (not v if isinstance(node.op, ast.Not) else v)
        if isinstance(node, ast.BoolOp):
            vals = [ev(v) for v in node.values]
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, right in zip(node.ops, node.comparators):
                r = ev(right)
                if type(op) not in _CMPOPS or not _CMPOPS[type(op)](left, r):
                    return False
                left = r
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            return (min if node.func.id == "min" else max)(*(ev(a) for a in node.args))
        raise ValueError(f"unsupported expression {expr!r}")

    return ev(tree)
