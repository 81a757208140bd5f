"""Source edits on the loops of a C++/OpenMP kernel, for the offline proposer.

Each edit is one step an engineer takes on its own: thread the outermost loop, vectorize an
innermost loop (with the reduction clause its scalar accumulators need), or swap `std::exp` for
an inline polynomial the vectorizer can inline. Steps compound: a vectorized loop of exponentials
pays off only once the exponential can be vectorized, and threads multiply whatever a thread does.
An edit that makes wrong code is caught by the evaluator's checks like any other wrong kernel.
"""
from __future__ import annotations

import re

_FOR = re.compile(r"\bfor\s*\(")
_PRAGMA_BEFORE = re.compile(r"#pragma omp[^\n]*\n[ \t]*$")
_DECL = re.compile(r"\b(?:float|double|int|int64_t|int32_t|size_t|auto|unsigned|long)\s+(\w+)\s*(?:=|;|\[)")
_ASSIGN = re.compile(r"(?<![\w\]\.>])(\w+)\s*(\+=|-=|\*=|=)(?!=)")

FAST_EXP = """static inline float kf_fast_exp(float x) {
    // exp(x) = 2^n * e^r with r in [-ln2/2, ln2/2]: a degree-6 polynomial in r, then the
    // exponent bits set directly. Branch-free, so an `omp simd` loop vectorizes it.
    x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
    const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;   // round to nearest: floorf
                                                                   // would not vectorize
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.3981999e-3f;
    p = p * r + 8.3334519e-3f;
    p = p * r + 4.1665795e-2f;
    p = p * r + 1.6666665e-1f;
    p = p * r + 5.0000001e-1f;
    p = p * r * r + r + 1.0f;
    union { int i; float f; } s;
    s.i = ((int)n + 127) << 23;
    return p * s.f;
}
"""


def _match(src: str, i: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes the one at src[i]."""
    depth = 0
    for j in range(i, len(src)):
        if src[j] == open_:
            depth += 1
        elif src[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


def loops(src: str) -> list[dict]:
    """Every `for` loop: header start, body span, whether a pragma precedes it, whether its
    body holds another loop. Comments are not expected inside kernel loops."""
    out = []
    for m in _FOR.finditer(src):
        head_end = _match(src, m.end() - 1, "(", ")")
        if head_end < 0:
            continue
        k = head_end
        while k < len(src) and src[k] in " \t\n":
            k += 1
        if k < len(src) and src[k] == "{":
            body_end = _match(src, k, "{", "}")
        elif _FOR.match(src, k):
            body_end = -2                      # filled in below: the nested loop's end
        else:
            body_end = src.find(";", k) + 1
        line_start = src.rfind("\n", 0, m.start()) + 1
        out.append({"start": m.start(), "line": line_start, "header": (m.start(), head_end),
                    "body": (k, body_end), "pragma": bool(_PRAGMA_BEFORE.search(src[:line_start]))})
    for lp in reversed(out):                   # a body that is a bare nested loop ends where it does
        if lp["body"][1] == -2:
            inner = next(o for o in out if o["start"] == lp["body"][0])
            lp["body"] = (lp["body"][0], inner["body"][1])
    for lp in out:
        a, b = lp["body"]
        lp["inner"] = not any(a <= o["start"] < b for o in out if o is not lp)
    return out


def _indent(src: str, line_start: int) -> str:
    line = src[line_start:src.find("\n", line_start)]
    return line[:len(line) - len(line.lstrip())]


def add_parallel(src: str) -> str | None:
    """`#pragma omp parallel for` on the outermost loop of kf_forward that has none."""
    f = src.find("kf_forward")
    if f < 0:
        return None
    ls = [lp for lp in loops(src) if lp["start"] > f]
    top = [lp for lp in ls if not any(o["body"][0] <= lp["start"] < o["body"][1] for o in ls if o is not lp)]
    if not top or top[0]["pragma"]:
        return None
    lp = top[0]
    return src[:lp["line"]] + f"{_indent(src, lp['line'])}#pragma omp parallel for schedule(static)\n" + src[lp["line"]:]


def _reductions(body: str, header: str) -> list[str] | None:
    """Reduction clauses for the scalars declared outside the loop that its body accumulates
    into; None when it writes such a scalar in a way no clause covers."""
    local = set(_DECL.findall(body)) | set(_DECL.findall(header))
    clauses = []
    for name, op in set(_ASSIGN.findall(body)):
        if name in local:
            continue
        if op == "+=":
            clauses.append(f"reduction(+:{name})")
        elif op == "=" and re.search(rf"\b{name}\s*=\s*[^;]*[<>][^;]*\?[^;]*:[^;]*\b{name}\b", body):
            kind = "max" if re.search(rf"\b{name}\s*=[^;]*>\s*{name}\b", body) else "min"
            clauses.append(f"reduction({kind}:{name})")
        else:
            return None
    return sorted(set(clauses))


def add_simd(src: str, rng) -> str | None:
    """`#pragma omp simd` (with reduction clauses) on an innermost loop that has no pragma."""
    options = []
    for lp in loops(src):
        if not lp["inner"] or lp["pragma"]:
            continue
        body = src[lp["body"][0]:lp["body"][1]]
        red = _reductions(body, src[lp["header"][0]:lp["header"][1]])
        if red is not None:
            options.append((lp, red))
    if not options:
        return None
    lp, red = rng.choice(options)
    pragma = " ".join(["#pragma omp simd", *red])
    return src[:lp["line"]] + f"{_indent(src, lp['line'])}{pragma}\n" + src[lp["line"]:]


def fast_exp(src: str) -> str | None:
    """std::exp / expf -> kf_fast_exp, a branch-free polynomial the vectorizer can inline."""
    new = re.sub(r"\b(?:std::exp|expf)\s*\(", "kf_fast_exp(", src)
    if new == src:
        return None
    at = new.find('extern "C"')
    at = at if at >= 0 else 0
    return new[:at] + FAST_EXP + "\n" + new[at:]
