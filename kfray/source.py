"""Kernel source annotations: `@kf.param`, `@kf.require`, `@kf.launch`, plus normalisation for dedupe.

    // @kf.param BLOCK  in [64, 128, 256, 512]
    // @kf.require BLOCK * UNROLL <= 4096

Expressions are evaluated by a tiny AST walker (arithmetic, comparisons, and/or, names), never `eval`.
"""
from __future__ import annotations

import ast
import hashlib
import itertools
import json
import operator
import re
from dataclasses import dataclass
from typing import Any, Iterator

_PARAM_RE = re.compile(r"@kf\.param\s+([A-Za-z_]\w*)\s+in\s+\[([^\]]*)\]")
_REQUIRE_RE = re.compile(r"@kf\.require\s+(.+?)\s*(?:\*/)?\s*$", re.M)
_LINE_COMMENT = re.compile(r"//[^\n]*")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)


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
