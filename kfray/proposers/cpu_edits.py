"""CPU (C++/OpenMP) edits for the offline proposer, beyond the loop edits of loop_edits.py.

Each is a pure source transformation that declares its own `@kf.param`, so the inner tuner sets
it and the descriptors see what it adds:

- `parallel_blocks`: threads over rows or blocks of rows: `omp parallel for` with a chunk size
  OMP_CHUNK on the outermost loop of kf_forward (or the chunk added to a bare one). Parallelism 1.
- `collapse_loops`: `collapse(2)` on a threaded loop whose body is a rectangular nested loop,
  so both loops' iterations are shared out. Parallelism 3 with SIMD.
- `vector_math`: std::exp/expf/exp become calls the vectorizer maps onto the toolchain's vector
  math (glibc libmvec: `#pragma omp declare simd` on expf gives _ZGVeN16v_expf, _ZGVdN8v_expf).
- `simd_width`: `simdlen(VLEN)` on `omp simd` loops: AVX-512 (16 floats) or AVX2 (8) forms,
  where g++ -march=native would otherwise prefer 256-bit vectors. Memory 1.
- `assume_aligned`: every pointer argument of kf_forward is declared 64-byte aligned (the judge
  aligns each buffer to 64 bytes), so vector loops need no peeling.
- `prefetch`: `__builtin_prefetch` of the data PF_DIST iterations ahead, in an innermost scalar
  loop (a prefetch keeps g++ from vectorizing a loop, so vectorized loops are left alone). Memory 3.
- `cache_block`: cache blocking of an innermost unit-stride loop: its range is cut in BLOCK_J
  pieces by a loop around its grandparent, so what that nest reads along it (a row of B, of C)
  stays in L1/L2 while the outer loops sweep; each element is still summed in the same order.

An edit that does not apply returns None; one that makes wrong code is caught by the evaluator's
checks like any other wrong kernel.
"""
from __future__ import annotations

import re

from kfray.descriptors import strip_comments
from kfray.proposers.loop_edits import _indent, _match, loops

_PARAM_LINE = re.compile(r"^[ \t]*//[ \t]*@kf\.(?:param|require)\b[^\n]*\n", re.M)
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[^\n]*\n", re.M)
_PAR_FOR = re.compile(r"^([ \t]*#pragma omp parallel for\b)([^\n]*)$", re.M)
_SIMD = re.compile(r"^([ \t]*#pragma omp (?:parallel for |for )?simd\b)([^\n]*)$", re.M)
_EXP_CALL = re.compile(r"(?<![\w:.])(?:std::)?(?:expf|exp)\s*\(")
_PTR_ARG = re.compile(r"(?:const\s+)?(?:float|double|int|int32_t|int64_t|uint8_t)\s*\*\s*(?:__restrict__|__restrict|restrict)?\s*(\w+)\s*(?=[,)])")
_HEADER = re.compile(r"for\s*\(\s*(?:int|int64_t|long|size_t|int32_t|auto)\s+(\w+)\s*=")
_DECL_ALL = re.compile(r"\b(?:float|double|int|int64_t|int32_t|size_t|auto|long)\s*\*?\s*(?:const\s+)?(\w+)\s*=")
_INDEXED = re.compile(r"(\w+)\[([^\[\]]+)\]")
_DEFINED = re.compile(r"\b(?:float|double|auto)\s+$")     # `float exp(`: a definition keeps its name
MVEC_DECL = """extern "C" {
#pragma omp declare simd notinbranch
float expf(float) noexcept;   // glibc libmvec has the vector forms: loops of expf vectorize
}
"""


def declare(src: str, name: str, values: list) -> str | None:
    """`// @kf.param name in [values]` after the source's last annotation (or its includes);
    None when the source already has a parameter of that name."""
    if re.search(rf"@kf\.param\s+{name}\b", src) or re.search(rf"\b{name}\b", src):
        return None
    line = f"// @kf.param {name} in [{', '.join(str(v) for v in values)}]\n"
    marks = list(_PARAM_LINE.finditer(src)) or list(_INCLUDE.finditer(src))
    at = marks[-1].end() if marks else 0
    return src[:at] + line + src[at:]


def _kernel_loops(src: str) -> tuple[int, list[dict]]:
    f = src.find("kf_forward")
    return f, ([lp for lp in loops(src) if lp["start"] > f] if f >= 0 else [])


def _outermost(ls: list[dict]) -> list[dict]:
    return [lp for lp in ls if not any(o["body"][0] <= lp["start"] < o["body"][1] for o in ls if o is not lp)]


def parallel_blocks(src: str, rng=None) -> str | None:
    """Threads over rows or blocks: `omp parallel for schedule(static, OMP_CHUNK)` on the outermost
    loop of kf_forward, or the chunk added to a bare `omp parallel for` there."""
    f, ls = _kernel_loops(src)
    top = _outermost(ls)
    if not top:
        return None
    lp = top[0]
    before = src[:lp["line"]]
    m = None
    for m in _PAR_FOR.finditer(before):
        pass
    if lp["pragma"]:
        if m is None or m.end() + 1 != len(before) or "schedule" in m.group(2) or "simd" in m.group(2):
            return None
        out = declare(src, "OMP_CHUNK", [1, 4, 16, 64])
        if out is None:
            return None
        shift = len(out) - len(src)
        at = m.end() + shift
        return out[:at] + " schedule(static, OMP_CHUNK)" + out[at:]
    if "omp parallel" in src[f:]:                  # threads of its own already: no nesting
        return None
    out = declare(src, "OMP_CHUNK", [1, 4, 16, 64])
    if out is None:
        return None
    at = lp["line"] + len(out) - len(src)
    pragma = f"{_indent(out, at)}#pragma omp parallel for schedule(static, OMP_CHUNK)\n"
    return out[:at] + pragma + out[at:]


def collapse_loops(src: str, rng=None) -> str | None:
    """`collapse(2)` on a threaded loop whose body is a loop whose bounds do not name the outer
    loop's variable (a rectangular nest)."""
    for lp in loops(src):
        if not lp["pragma"]:
            continue
        line_start = src.rfind("\n", 0, lp["line"] - 1) + 1
        pragma = src[line_start:lp["line"]]
        if "parallel for" not in pragma or "collapse" in pragma or "schedule(static," in pragma:
            continue
        head = src[lp["header"][0]:lp["header"][1]]
        var = _HEADER.match(head)
        k = lp["body"][0]
        inner_at = k + 1 if src[k] == "{" else k
        rest = src[inner_at:].lstrip()
        if not var or not rest.startswith("for"):
            continue
        inner_start = len(src) - len(rest)
        inner = next((o for o in loops(src) if o["start"] == inner_start), None)
        if inner is None or re.search(rf"\b{var.group(1)}\b", src[inner["header"][0]:inner["header"][1]]):
            continue
        if src[k] == "{" and src[inner["body"][1]:lp["body"][1] - 1].strip():
            continue                                   # statements beside the inner loop
        end = lp["line"] - 1
        return src[:end] + " collapse(2)" + src[end:]
    return None


def vector_math(src: str, rng=None) -> str | None:
    """exp calls -> expf declared `omp declare simd`: g++ vectorizes `omp simd` loops of them with
    the C library's vector forms (libmvec)."""
    code = strip_comments(src)
    if "omp declare simd" in code or not _SIMD.search(code):
        return None
    calls = [m for m in _EXP_CALL.finditer(code) if not _DEFINED.search(code[:m.start()])]
    if not calls:
        return None
    new = _EXP_CALL.sub(lambda m: m[0] if _DEFINED.search(src[:m.start()]) else "expf(", src)
    incs = list(_INCLUDE.finditer(new))
    at = incs[-1].end() if incs else 0
    return new[:at] + MVEC_DECL + new[at:]


def simd_width(src: str, rng=None) -> str | None:
    """`simdlen(VLEN)` on every `omp simd` pragma that has none (VLEN: 8 = AVX2, 16 = AVX-512)."""
    if "simdlen" in src or not _SIMD.search(src):
        return None
    out = declare(src, "VLEN", [16, 8])
    if out is None:
        return None
    return _SIMD.sub(lambda m: f"{m.group(1)} simdlen(VLEN){m.group(2)}", out)


def assume_aligned(src: str, rng=None) -> str | None:
    """Each pointer argument of kf_forward re-declared 64-byte aligned at the top of its body."""
    m = re.search(r"\bkf_forward\s*\(", src)
    if not m or "__builtin_assume_aligned" in src:
        return None
    close = _match(src, m.end() - 1, "(", ")")
    brace = src.find("{", close)
    if close < 0 or brace < 0 or src[close:brace].strip():
        return None
    args = src[m.end():close - 1]
    names = [n for n in _PTR_ARG.findall(args + ")") if not re.search(rf"\*\s*const\s+{n}\b", args)]
    if not names:
        return None
    ind = _indent(src, src.find("\n", brace) + 1) or "    "
    lines = "".join(f"{ind}{n} = static_cast<decltype({n})>(__builtin_assume_aligned({n}, 64));\n" for n in names)
    return src[:brace + 1] + "\n" + lines + src[brace + 1:].lstrip("\n")


def prefetch(src: str, rng) -> str | None:
    """`__builtin_prefetch` of an array element PF_DIST iterations ahead at the top of an
    innermost loop without a pragma (the loop variable advanced by PF_DIST in its index)."""
    if "__builtin_prefetch" in src:
        return None
    options = []
    for lp in loops(src):
        if not lp["inner"] or lp["pragma"]:
            continue
        var = _HEADER.match(src[lp["header"][0]:lp["header"][1]])
        body = src[lp["body"][0]:lp["body"][1]]
        if not var:
            continue
        v = var.group(1)
        refs = [(a, i) for a, i in _INDEXED.findall(body) if re.search(rf"\b{v}\b", i)]
        if refs:
            options.append((lp, v, refs))
    if not options:
        return None
    lp, v, refs = rng.choice(options)
    arr, idx = rng.choice(refs)
    ahead = re.sub(rf"\b{v}\b", f"({v} + PF_DIST)", idx)
    out = declare(src, "PF_DIST", [16, 64, 256])
    if out is None:
        return None
    shift = len(out) - len(src)
    a, b = lp["body"][0] + shift, lp["body"][1] + shift
    call = f"__builtin_prefetch(&{arr}[{ahead}]);"
    if out[a] == "{":
        return out[:a + 1] + f" {call}" + out[a + 1:]
    return out[:a] + "{ " + call + " " + out[a:b] + " }" + out[b:]


_UNIT = re.compile(r"for\s*\(\s*(?:int64_t|int|long|size_t)\s+(\w+)\s*=\s*([^;]+?)\s*;\s*\1\s*<\s*([^;]+?)\s*;"
                   r"\s*(?:\+\+\1|\1\s*\+\+)\s*\)")
_SIDE = re.compile(r"\]\s*(?:[-+*/]?=)(?!=)|(?<![\w\]])(\w+)\s*(?:[-+*/]=|\+\+|--)|(?:\+\+|--)\s*\w")


def cache_block(src: str, rng) -> str | None:
    """A loop of BLOCK_J-wide pieces of an innermost `for (j = LO; j < HI; ++j)` around that loop's
    grandparent (which has no pragma, and whose other statements only declare: re-running them per
    piece changes nothing); inside, the loop runs over its piece."""
    if "BLOCK_J" in src:
        return None
    ls = loops(src)
    options = []
    for lp in ls:
        m = _UNIT.match(src, lp["header"][0])
        if not lp["inner"] or not m:
            continue
        chain = sorted((o for o in ls if o["body"][0] <= lp["start"] < o["body"][1]), key=lambda o: -o["start"])
        if len(chain) < 2 or chain[1]["pragma"]:
            continue
        top = chain[1]
        text = list(src)
        for o in ls:                               # loop headers step their own variables: not a side effect
            if top["start"] <= o["start"] < top["body"][1]:
                text[o["header"][0]:o["header"][1]] = " " * (o["header"][1] - o["header"][0])
        text = "".join(text)
        outside = text[top["header"][1]:lp["start"]] + text[lp["body"][1]:top["body"][1]]
        inner_decl = set(_DECL_ALL.findall(src[top["start"]:top["body"][1]])) | \
            {_HEADER.match(src[o["header"][0]:o["header"][1]]).group(1) for o in chain[:2]
             if _HEADER.match(src[o["header"][0]:o["header"][1]])}
        bounds = set(re.findall(r"[A-Za-z_]\w*", m.group(2) + " " + m.group(3)))
        if bounds & inner_decl or _SIDE.search(outside):
            continue
        options.append((lp, top, m))
    if not options:
        return None
    lp, top, m = rng.choice(options)
    var, lo, hi = m.group(1), m.group(2), m.group(3)
    out = declare(src, "BLOCK_J", [64, 128, 256, 512])
    if out is None:
        return None
    sh = len(out) - len(src)
    blk = f"{var}_blk"
    head = (f"for (int64_t {var} = {blk}; {var} < (({hi}) < {blk} + BLOCK_J ? ({hi}) : {blk} + BLOCK_J); "
            f"++{var})")
    a, b = lp["header"][0] + sh, lp["header"][1] + sh
    out = out[:a] + head + out[b:]
    at = top["line"] + sh
    ind = _indent(out, at)
    return out[:at] + f"{ind}for (int64_t {blk} = {lo}; {blk} < ({hi}); {blk} += BLOCK_J)\n" + out[at:]


EDITS = {"parallel_blocks": parallel_blocks, "collapse_loops": collapse_loops, "vector_math": vector_math,
         "simd_width": simd_width, "assume_aligned": assume_aligned, "prefetch": prefetch,
         "cache_block": cache_block}
