"""Deterministic fix-ups of a model's kernel that failed to compile, before the model is asked again.

A small model's compile errors are mostly of a few kinds that need no model to fix (seen with a
1.5B model: a `std::` name without its header, a template parameter the child uses but no longer
declares, `collapse` on a loop that is not a nest; and in a later run, `omp_get_num_threads`
without <omp.h>, `#include <stdint>`, and `collapse` on a `#pragma omp parallel` that has no
loop; and a helper the parent defines, `kf_row` or `kf_slice`, that the child calls after it
rewrote only `kf_forward`; and in a third, `INFINITY` and AVX intrinsics without their headers,
`#pragma omp parallel for` over a block or a loop OpenMP cannot split, a constant that shadows a
parameter, and `std::min` of two types). Each fix here changes only what a compiler message names
exactly, and says what it did; anything else is left to the model's repair.
"""
from __future__ import annotations

import re

from kfray.proposers import top_level

# Headers of std:: names a kernel uses; the compiler's own "#include <x>" hint wins where it gives one.
STD_HEADERS = {
    **dict.fromkeys(("min", "max", "clamp", "sort", "fill", "copy", "min_element", "max_element",
                     "fill_n", "copy_n", "transform", "minmax"), "algorithm"),
    **dict.fromkeys(("fma", "fmaf", "exp", "expf", "exp2", "log", "logf", "log2", "sqrt", "sqrtf", "rsqrt",
                     "fabs", "fabsf", "pow", "powf", "tanh", "tanhf", "sin", "cos", "floor", "ceil", "round",
                     "isnan", "isinf", "isfinite", "fmax", "fmin", "fmaxf", "fminf", "erf", "erff",
                     "nearbyint", "lround", "trunc", "ldexp", "frexp", "abs"), "cmath"),
    **dict.fromkeys(("memcpy", "memset", "memmove", "memcmp"), "cstring"),
    **dict.fromkeys(("int64_t", "int32_t", "uint32_t", "uint64_t", "int8_t", "uint8_t", "int16_t",
                     "uint16_t", "uintptr_t"), "cstdint"),
    **dict.fromkeys(("size_t", "ptrdiff_t"), "cstddef"),
    **dict.fromkeys(("accumulate", "iota", "inner_product"), "numeric"),
    "numeric_limits": "limits", "vector": "vector", "array": "array", "swap": "utility",
    "move": "utility", "pair": "utility", "thread": "thread", "atomic": "atomic",
    "unique_ptr": "memory", "make_unique": "memory", "function": "functional",
}
_NOT_IN_STD = re.compile(r"['‘`\"](\w+)['’`\"] is not a member of ['‘`\"]std['’`\"]"
                         r"|namespace \"std\" has no member \"(\w+)\"")
_HINT = re.compile(r"#include <([\w./]+)>")
_UNDECLARED = re.compile(r"['‘`\"](\w+)['’`\"] was not declared in this scope|identifier \"(\w+)\" is undefined")
_COLLAPSE_CLAUSE = re.compile(r"[ \t]*\bcollapse[ \t]*\([ \t]*\d+[ \t]*\)")
_COLLAPSE = re.compile(r":(\d+):\d+: error: not enough (?:for )?loops to collapse|"
                       r"\((\d+)\): error: .*collapse")
# A name used without `std::` that the compiler says is undeclared: its header, where it is a C
# library or OpenMP name (not a kernel's own name: those are the model's, or a parameter's).
PLAIN_HEADERS = {**{n: h for n, h in STD_HEADERS.items() if h in ("cmath", "cstring", "cstdint", "cstddef")},
                 **dict.fromkeys(("INFINITY", "NAN", "HUGE_VAL", "HUGE_VALF"), "cmath"),
                 **dict.fromkeys(("FLT_MAX", "FLT_MIN", "FLT_EPSILON", "DBL_MAX"), "cfloat"),
                 **dict.fromkeys(("malloc", "free", "aligned_alloc", "calloc", "realloc", "abort"), "cstdlib"),
                 **dict.fromkeys(("printf", "fprintf", "snprintf"), "cstdio")}
# A C header named without `.h` or its C++ `c` prefix (`#include <stdint>`): the C++ form.
C_HEADERS = ("stdint", "stddef", "stdlib", "stdio", "math", "string", "limits", "assert", "float")
_NO_FILE = re.compile(r"fatal error: ([\w./]+): No such file or directory|cannot open source file \"([\w./]+)\"")
_BAD_CLAUSE = re.compile(r":(\d+):\d+: error: ['‘`\"](\w+)['’`\"] is not valid for ['‘`\"]#pragma omp ([\w ]+)['’`\"]")
_NOT_DECLARED = re.compile(r"['‘`\"](\w+)['’`\"] (?:was not declared in this scope|has not been declared)"
                           r"|identifier \"(\w+)\" is undefined|\"(\w+)\" is not a class or namespace")
_INTRINSIC = re.compile(r"_mm\d*_\w+$|__m(?:64|128|256|512)[a-z]?$|_MM_\w+$")
# `#pragma omp ... for` whose loop OpenMP cannot split: over a block, or a loop not in its canonical form
_NO_LOOP = re.compile(r":(\d+):\d+: error: for statement expected before|"
                      r":(\d+):\d+: error: invalid (?:controlling predicate|increment expression)")
# std::min / std::max of two types (`min(int, int64_t&)`): no template argument can be deduced
_MIXED = re.compile(r":(\d+):(\d+): error: no matching function for call to ['‘`\"](min|max)\(([^,()]+), ([^,()]+)\)['’`\"]")
_FLOATS = ("float", "double")
# a parameter's macro expanded in the child's own declaration of that name (`const int BK = 128;`)
_SHADOWED = re.compile(r"expected unqualified-id before numeric constant\n(?:.*\n)*?.*?:(\d+):\d+: note: in expansion "
                       r"of macro ['‘`\"](\w+)['’`\"]")
_PARAM = re.compile(r"^[ \t]*//[ \t]*@kf\.param[ \t]+(\w+)\b.*$", re.M)
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"].*$", re.M)


def missing_headers(source: str, diagnostics: str) -> list[str]:
    """Standard headers for the std:: names the compiler says are missing, not already included."""
    names = [a or b for a, b in _NOT_IN_STD.findall(diagnostics)]
    if not names:
        return []
    have = set(_INCLUDE.findall(source))
    want = [h for h in _HINT.findall(diagnostics) if "/" not in h]
    want += [STD_HEADERS[n] for n in names if n in STD_HEADERS]
    return [h for h in dict.fromkeys(want) if h not in have]


def plain_headers(source: str, diagnostics: str) -> list[str]:
    """Headers of the C library and OpenMP names the compiler says are undeclared, not included."""
    have = set(_INCLUDE.findall(source))
    want = []
    for a, b in _UNDECLARED.findall(diagnostics):
        name = a or b
        if name.startswith("omp_"):
            want.append("omp.h")
        elif _INTRINSIC.match(name):
            want.append("immintrin.h")
        elif name in PLAIN_HEADERS:
            want.append(PLAIN_HEADERS[name])
    return [h for h in dict.fromkeys(want) if h not in have]


def renamed_headers(source: str, diagnostics: str) -> tuple[str, list[str]]:
    """`#include <stdint>` and the like, which the compiler cannot find, as `#include <cstdint>`."""
    done = []
    for a, b in _NO_FILE.findall(diagnostics):
        name = a or b
        if name in C_HEADERS:
            new, n = re.subn(rf"^([ \t]*#[ \t]*include[ \t]*)[<\"]{name}[>\"]", rf"\1<c{name}>", source, flags=re.M)
            if n:
                source = new
                done.append(f"<{name}> as <c{name}>")
    return source, done


def drop_bad_clauses(source: str, diagnostics: str) -> tuple[str, list[str]]:
    """Without each OpenMP clause the compiler names as not valid for its pragma, on that line."""
    lines = source.splitlines(keepends=True)
    done = []
    for line, clause, pragma in _BAD_CLAUSE.findall(diagnostics):
        at = int(line) - 1
        if 0 <= at < len(lines) and "#pragma omp" in lines[at] and clause in lines[at]:
            lines[at] = re.sub(rf"[ \t]*\b{clause}\b(?:[ \t]*\([^()]*\))?", "", lines[at], count=1)
            done.append(f"dropped {clause} from #pragma omp {pragma.strip()}")
    return "".join(lines), done


def add_includes(source: str, headers: list[str]) -> str:
    """`#include <h>` lines after the source's last include (at the top where it has none)."""
    lines = [f"#include <{h}>" for h in headers]
    last = list(_INCLUDE.finditer(source))
    if not last:
        return "\n".join(lines) + "\n" + source
    end = last[-1].end()
    return source[:end] + "\n" + "\n".join(lines) + source[end:]


def carried_params(source: str, diagnostics: str, parent_source: str | None) -> dict[str, str]:
    """{name: the parent's `@kf.param` line} for names the compiler says are undeclared in the child."""
    if not parent_source:
        return {}
    names = {a or b for a, b in _UNDECLARED.findall(diagnostics)}
    mine = set(_PARAM.findall(source))
    theirs = {m.group(1): m.group(0).strip() for m in _PARAM.finditer(parent_source)}
    return {n: theirs[n] for n in sorted(names) if n in theirs and n not in mine}


def carried_helpers(source: str, diagnostics: str, parent_source: str | None) -> tuple[str, list[str]]:
    """The parent's top-level helpers (functions, structs, constants, namespaces) that the compiler
    says the child lacks, with the parent's helpers, parameters and includes they use in turn, put
    before the child's first item that uses them. (source, names carried)."""
    if not parent_source:
        return source, []
    named = {a or b or c for a, b, c in _NOT_DECLARED.findall(diagnostics)} - {""}
    theirs = {it.name: it for it in top_level.items(parent_source) if it.name}
    mine_items = top_level.items(source)
    mine = {it.name for it in mine_items}
    want = [n for n in named if n in theirs and n not in mine]
    if not want:
        return source, []
    carried: set[str] = set()
    while want:                                   # what the carried helpers use of the parent's, too
        name = want.pop()
        if name in carried:
            continue
        carried.add(name)
        used = set(re.findall(r"\b\w+\b", theirs[name].text(parent_source)))
        want += [n for n in used if n in theirs and n not in mine and n not in carried and n != name]
    block = "".join(theirs[n].text(parent_source).strip("\n") + "\n\n"
                    for n in sorted(carried, key=lambda n: theirs[n].start))
    used = set(re.findall(r"\b\w+\b", block))
    defined = top_level.defined_macros(source)         # the parent's macros the helpers use (VT, VSET)
    macros = [t for t, names in top_level.macro_blocks(parent_source) if names & used and not names & defined]
    for t in macros:
        used |= set(re.findall(r"\b\w+\b", t))
    block = "".join(t.strip("\n") + "\n\n" for t in macros) + block
    uses = [it.start for it in mine_items if any(re.search(rf"\b{n}\b", it.text(source)) for n in carried)]
    at = min(uses) if uses else (mine_items[-1].start if mine_items else len(source))
    out = source[:at] + block + source[at:]
    params = {m.group(1): m.group(0).strip() for m in _PARAM.finditer(parent_source)}
    declared = set(_PARAM.findall(out))
    lines = [line for n, line in params.items() if n in used and n not in declared]
    if lines:
        out = add_param_lines(out, lines)
    have = set(_INCLUDE.findall(out))
    includes = [h for h in dict.fromkeys(_INCLUDE.findall(parent_source)) if h not in have]
    if includes:
        out = add_includes(out, includes)
    return out, sorted(carried, key=lambda n: theirs[n].start)


def defined_names(source: str) -> set[str]:
    """What a kernel defines that another may use: its top-level items, parameters and macros."""
    return {it.name for it in top_level.items(source) if it.name} | set(_PARAM.findall(source)) | \
        top_level.defined_macros(source)


def donor(source: str, diagnostics: str, kernels: list[str]) -> str | None:
    """Of `kernels` (the parent first, then the other kernels the island holds), the one that defines
    the most of what the compiler says the child lacks (helpers, parameters, macros); ties go to
    the earlier. A small model copies helpers from the prompt's other kernels too: in a 40-minute
    run, 6 of 12 fixed children still lacked `kf_slice` or `kf_row`, which their parents did not
    define but the archive's seeds did. None where there is no kernel."""
    if not kernels:
        return None
    named = {a or b or c for a, b, c in _NOT_DECLARED.findall(diagnostics)} - {""}
    named -= {it.name for it in top_level.items(source)}
    scores = [len(named & defined_names(k)) for k in kernels]
    return kernels[scores.index(max(scores))]


def add_param_lines(source: str, lines: list[str]) -> str:
    last = list(_PARAM.finditer(source)) or list(_INCLUDE.finditer(source))
    if not last:
        return "\n".join(lines) + "\n" + source
    end = last[-1].end()
    return source[:end] + "\n" + "\n".join(lines) + source[end:]


def drop_collapse(source: str, diagnostics: str) -> str | None:
    """Without the `collapse(n)` clause of the OpenMP pragma just above each line the compiler says
    has too few loops to collapse; None when there is no such pragma."""
    lines = source.splitlines(keepends=True)
    changed = False
    for a, b in _COLLAPSE.findall(diagnostics):
        at = int(a or b) - 1
        for k in range(min(at, len(lines) - 1), max(at - 4, -1), -1):     # the pragma a few lines up
            if "#pragma omp" in lines[k] and "collapse" in lines[k]:
                lines[k] = _COLLAPSE_CLAUSE.sub("", lines[k])
                changed = True
                break
    return "".join(lines) if changed else None


def _block_has_worksharing(lines: list[str], at: int) -> bool:
    """Whether the `{ ... }` block that opens on line `at` holds a `#pragma omp for`."""
    depth = 0
    for line in lines[at:]:
        if re.search(r"#pragma\s+omp\s+for\b", line):
            return True
        depth += line.count("{") - line.count("}")
        if depth <= 0 and "}" in line:
            return False
    return False


def drop_unsplittable(source: str, diagnostics: str) -> tuple[str, list[str]]:
    """Each `#pragma omp parallel for` just above a line the compiler says is no loop OpenMP can
    split. Over a block (`for statement expected`): `parallel` alone where the block shares out its
    own `#pragma omp for` (what the model meant), else the pragma goes and the block runs as written
    on one thread. Over a loop (`invalid controlling predicate`, `invalid increment expression`):
    its `collapse` goes where it has one (the outer loop may be fine), else the pragma. A bare `omp
    for` inside a parallel region is left to the model (every thread would run the loop). Lines are
    changed in place, so the message's other line numbers still hold."""
    lines = source.splitlines(keepends=True)
    done = []
    for a, b in _NO_LOOP.findall(diagnostics):
        block, at = bool(a), int(a or b) - 1
        for k in range(min(at, len(lines) - 1), max(at - 4, -1), -1):
            if "#pragma omp" not in lines[k]:
                continue
            if not re.search(r"#pragma\s+omp\s+parallel\s+for\b", lines[k]):
                break
            if block and _block_has_worksharing(lines, at):
                lines[k] = re.sub(r"[ \t]*\b(?:collapse|schedule|ordered|lastprivate)\b(?:[ \t]*\([^()]*\))?", "",
                                  re.sub(r"(#pragma\s+omp\s+parallel)\s+for\b", r"\1", lines[k]))
                done.append(f"made the #pragma omp parallel for above line {at + 1} a parallel region: "
                            "its block shares out its own loop")
            elif not block and "collapse" in lines[k]:
                lines[k] = _COLLAPSE_CLAUSE.sub("", lines[k])
                done.append(f"dropped collapse above line {at + 1}, whose loops OpenMP cannot split")
            else:
                lines[k] = "\n"
                done.append(f"dropped #pragma omp parallel for above line {at + 1}, which is no loop OpenMP can split")
            break
    return "".join(lines), done


def _wider(a: str, b: str) -> str | None:
    """The type both arguments of a mixed std::min / std::max convert to without loss, where plain:
    the floating one, the wider float, or the other of `int` and an integer type; else None."""
    a, b = (re.sub(r"\bconst\b|&", "", t).strip() for t in (a, b))
    if a == b:
        return None
    if a in _FLOATS and b in _FLOATS:
        return "double"
    if (a in _FLOATS) != (b in _FLOATS):
        return a if a in _FLOATS else b
    if "int" in (a, b) and re.fullmatch(r"(?:u?int(?:32|64)_t|long(?: long)?(?: int)?|size_t|ptrdiff_t)", b if a == "int" else a):
        return b if a == "int" else a
    return None


def typed_min_max(source: str, diagnostics: str) -> tuple[str, list[str]]:
    """`std::min<T>(` where the compiler names a min or max of two types at a line and column, T
    the wider of the two (_wider); a pair with no plain answer is left to the model. A line's calls
    are done right to left, so the columns of those still to do hold."""
    lines = source.splitlines(keepends=True)
    done = []
    for line, col, name, a, b in sorted(set(_MIXED.findall(diagnostics)), key=lambda m: (int(m[0]), -int(m[1]))):
        at, c, t = int(line) - 1, int(col) - 1, _wider(a, b)
        if t and 0 <= at < len(lines) and lines[at][:c].endswith(name) and lines[at][c:c + 1] == "(":
            lines[at] = lines[at][:c] + f"<{t}>" + lines[at][c:]
            done.append(f"{name}<{t}> for a {name} of {a.strip()} and {b.strip()}")
    return "".join(lines), done


def drop_shadowing(source: str, diagnostics: str) -> tuple[str, list[str]]:
    """Without the child's one-line declaration of a constant named as a parameter (`const int64_t BK
    = 128;` where BK comes with -DBK=...), which the compiler names as the macro's expansion: the
    parameter's value then stands where the constant's did. The line is blanked (numbers hold)."""
    lines = source.splitlines(keepends=True)
    done = []
    for line, name in _SHADOWED.findall(diagnostics):
        at = int(line) - 1
        decl = re.compile(rf"^[ \t]*(?:static[ \t]+)?(?:const(?:expr)?[ \t]+)?[\w:]+[ \t]+{name}[ \t]*=[^;{{}}]*;")
        if 0 <= at < len(lines) and decl.match(lines[at]):
            lines[at] = decl.sub("", lines[at], count=1)
            if not lines[at].strip():
                lines[at] = "\n"
            done.append(f"dropped the child's own constant {name}, which the parameter {name} defines")
    return "".join(lines), done


def fix(source: str, diagnostics: str, parent_source: str | None = None,
        whose: str = "the parent's") -> tuple[str, list[str]] | None:
    """(fixed source, what was done) where a compiler message names a fix exactly, else None.
    `parent_source`: the kernel helpers and parameters are carried from (`whose`, in what was done)."""
    done, out = [], source
    dropped = drop_collapse(out, diagnostics)       # first: the message's line numbers are the source's
    if dropped is not None:
        out = dropped
        done.append("dropped collapse on a loop that is not a nest")
    for step in (drop_bad_clauses, drop_unsplittable, drop_shadowing, typed_min_max):  # each keeps line numbers
        out, did = step(out, diagnostics)
        done += did
    out, renamed = renamed_headers(out, diagnostics)    # same number of lines
    done += ["included " + r for r in renamed]
    out, helpers = carried_helpers(out, diagnostics, parent_source)
    if helpers:
        done.append(f"carried {whose} " + ", ".join(helpers))
    params = carried_params(out, diagnostics, parent_source)
    if params:
        out = add_param_lines(out, list(params.values()))
        done.append(f"carried {whose} @kf.param " + ", ".join(params))
    headers = missing_headers(out, diagnostics)
    headers += [h for h in plain_headers(out, diagnostics) if h not in headers]
    if headers:
        out = add_includes(out, headers)
        done.append("added " + ", ".join(f"<{h}>" for h in headers))
    return (out, done) if done and out != source else None
