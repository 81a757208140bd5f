"""Source edits on CUDA kernels, for the offline proposer: the steps a CUDA engineer takes on
memory traffic and occupancy. Each is a pure function `source -> source | None` (None: the edit
does not apply), draws its own parameter (an unroll factor, a minimum of resident blocks, a
number of waves) and leaves kf_forward's signature alone. Edits compound: a grid-stride loop
makes room for 128-bit loads, launch bounds then trade registers for resident blocks.

- `vector_io`: an elementwise kernel moves float4 (128-bit loads and stores) in a grid-stride
  loop, with a scalar tail and a scalar path for misaligned pointers; its grid shrinks fourfold.
- `grid_stride`: a one-element-per-thread kernel walks the array in a grid-stride loop, and a
  kernel that strides by the grid gets an occupancy-aware grid: resident blocks per SM
  (cudaOccupancyMaxActiveBlocksPerMultiprocessor) x SMs x KF_WAVES, a new `@kf.param`.
- `unroll`: `#pragma unroll N` on an inner loop of a kernel (instruction-level parallelism), or a
  new factor for one.
- `launch_bounds`: `__launch_bounds__(block[, min blocks])` on a kernel launched with a
  compile-time block size, or another minimum of resident blocks for one that has it.
- `cache_hints`: reads of read-only pointers through the read-only cache (`__ldg`), or a swap
  between `__ldg`, `__ldcs` (streaming: evict first) and `__ldcg` (L2 only).
- `pad_shared`: one padding column on a 2-D shared tile, against bank conflicts.
- `block_size`: a block size the host code sets as a constant (`const int threads = 256;`,
  `#define BLOCK 256`) becomes a tunable, `@kf.param KF_BLOCK_<NAME>`, powers of two around it:
  how published suite kernels (robust-kbench's) are searched without a model.
Reductions (warp shuffles, online softmax) live in kfray/proposers/cuda_reductions.py.
"""
from __future__ import annotations

import re

from kfray.proposers.cuda_kernels import (add_param, ensure_include, kernels, launches,
                                          pointer_params, static_block)
from kfray.proposers.loop_edits import loops

_INDEX = re.compile(r"^\s*(?:const\s+)?(?:int64_t|int|long|size_t|unsigned)\s+(\w+)\s*=\s*([^;]*blockIdx\.x[^;]*"
                    r"threadIdx\.x[^;]*|[^;]*threadIdx\.x[^;]*blockIdx\.x[^;]*);\s*\n\s*if\s*\(\s*\1\s*<\s*(\w+)\s*\)"
                    r"\s*([^;{}]+;)\s*$")
_STRIDES = re.compile(r"gridDim\.x")
_HINTS = ("__ldg", "__ldcs", "__ldcg")


def _guarded(src: str, k: dict):
    """(index, expr, bound, statement) of a kernel whose whole body is `i = <global id>; if (i < n) s;`."""
    m = _INDEX.match(src[k["body"][0] + 1:k["body"][1] - 1].rstrip() + "\n")
    return m.groups() if m else None


def _replace_body(src: str, k: dict, body: str) -> str:
    return src[:k["body"][0]] + "{\n" + body + "}" + src[k["body"][1]:]


def _cap_grid(src: str, name: str, rng) -> str | None:
    """Launches of `name` with a scalar grid get min(grid, resident blocks x SMs x KF_WAVES)."""
    sites = [s for s in launches(src, name) if "grid" not in s["text"][0] and "kf_grid_cap" not in s["text"][0]]
    if not sites:
        return None
    for s in reversed(sites):
        g, b = s["text"]
        cap = f"kf_grid_cap((long long)({g}), (const void*){name}{s['targs']}, (int)({b}))"
        src = src[:s["grid"][0]] + cap + src[s["grid"][1]:]
    if "kf_grid_cap(long long" not in src:
        helper = ("static unsigned kf_grid_cap(long long want, const void* kernel, int block) {\n"
                  "    // resident blocks per SM x SMs x KF_WAVES: enough blocks to fill the GPU, no more\n"
                  "    int dev = 0, sms = 0, per_sm = 0;\n"
                  "    cudaGetDevice(&dev);\n"
                  "    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 80;\n"
                  "    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, 0) != cudaSuccess || per_sm <= 0) per_sm = 1;\n"
                  "    const long long cap = (long long)sms * per_sm * KF_WAVES;\n"
                  "    return (unsigned)(want < 1 ? 1 : (want < cap ? want : cap));\n}\n\n")
        at = src.find('extern "C"')
        if at < 0:
            return None
        src = src[:at] + helper + src[at:]
        src = add_param(src, "KF_WAVES", [1, 2, 4, 8], rng.choice([1, 2, 4, 8]))
    return src


def grid_stride(src: str, rng) -> str | None:
    """A guarded one-element kernel becomes a grid-stride loop; grid-stride kernels get an
    occupancy-aware grid (see the module docstring)."""
    for k in kernels(src):
        g = _guarded(src, k)
        if g:
            i, expr, n, stmt = g
            body = f"    for (int64_t {i} = {expr}; {i} < {n}; {i} += (int64_t)gridDim.x * blockDim.x)\n        {stmt}\n"
            return _cap_grid(_replace_body(src, k, body), k["name"], rng)
    for k in kernels(src):
        if _STRIDES.search(src[k["body"][0]:k["body"][1]]):
            out = _cap_grid(src, k["name"], rng)
            if out:
                return out
    return None


def vector_io(src: str, rng) -> str | None:
    """An elementwise float kernel (`i = <global id>; if (i < n) y[i] = f(x[i], ...);`) moves
    float4: four elements per load and store, a scalar tail, a scalar path when misaligned."""
    for k in kernels(src):
        g = _guarded(src, k)
        ptrs = pointer_params(k["params"])
        if not g or not ptrs or not re.search(r"\bfloat\s*\*", k["params"]):
            continue
        i, expr, n, stmt = g
        m = re.fullmatch(rf"(\w+)\[\s*{i}\s*\]\s*=\s*(.+);", stmt.strip())
        if not m or m.group(1) not in ptrs or ptrs[m.group(1)]:
            continue
        out, rhs = m.group(1), m.group(2)
        reads = set(re.findall(rf"\b(\w+)\[\s*{i}\s*\]", rhs))
        bare = re.sub(rf"\b\w+\[\s*{i}\s*\]", "", rhs)
        if not reads <= set(ptrs) or re.search(rf"\b{i}\b|\[", bare):
            continue                                  # other indexing: not a plain map
        names = sorted(reads | {out})
        lanes = []
        for c in "xyzw":
            lanes.append(f"        kf_o.{c} = " + re.sub(rf"\b(\w+)\[\s*{i}\s*\]", rf"kf_\1.{c}", rhs) + ";\n")
        loads = "".join(f"        const float4 kf_{p} = reinterpret_cast<const float4*>({p})[kf_i];\n" for p in sorted(reads))
        aligned = " | ".join(f"reinterpret_cast<uintptr_t>({p})" for p in names)
        body = (f"    const int64_t kf_t = {expr};\n"
                f"    const int64_t kf_s = (int64_t)gridDim.x * blockDim.x;\n"
                f"    const int64_t kf_v = (({aligned}) & 15) == 0 ? (int64_t)({n}) / 4 : 0;\n"
                f"    for (int64_t kf_i = kf_t; kf_i < kf_v; kf_i += kf_s) {{\n{loads}"
                f"        float4 kf_o;\n{''.join(lanes)}"
                f"        reinterpret_cast<float4*>({out})[kf_i] = kf_o;\n    }}\n"
                f"    for (int64_t {i} = kf_v * 4 + kf_t; {i} < {n}; {i} += kf_s) {stmt}\n")
        new = _replace_body(src, k, body)
        for s in reversed(launches(new, k["name"])):
            g0, g1 = s["grid"]
            if "grid" in s["text"][0]:
                return None
            new = new[:g0] + f"(unsigned)(((long long)({s['text'][0]}) + 3) / 4)" + new[g1:]
        return ensure_include(new, "cstdint")
    return None


def unroll(src: str, rng) -> str | None:
    """`#pragma unroll N` on an inner kernel loop without one, or a new N for one that has it."""
    spans = [k["body"] for k in kernels(src)]
    options = []
    for lp in loops(src):
        if not lp["inner"] or not any(a < lp["start"] < b for a, b in spans):
            continue
        before = src[:lp["line"]].rstrip(" \t")
        prev = before[before.rfind("\n", 0, len(before) - 1) + 1:]
        m = re.match(r"\s*#pragma unroll(?:\s+(\d+))?\s*$", prev)
        if m and not m.group(1):
            continue                                   # fully unrolled already
        options.append((lp, m, len(before) - len(prev)))
    if not options:
        return None
    lp, m, prev_at = rng.choice(options)
    factors = [f for f in (2, 4, 8) if not m or f != int(m.group(1))]
    pragma = f"#pragma unroll {rng.choice(factors)}\n"
    if m:
        return src[:prev_at] + pragma + src[lp["line"]:]
    return src[:lp["line"]] + pragma + src[lp["line"]:]


def launch_bounds(src: str, rng) -> str | None:
    """`__launch_bounds__` where the block size is known at compile time, or a new minimum of
    resident blocks per SM where it is there (more blocks: fewer registers each)."""
    options = []
    for k in kernels(src):
        if k["lb"] is not None:
            parts = [p.strip() for p in re.split(r",(?![^()]*\))", k["lb"])]
            now = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 1
            if len(parts) <= 2:
                options.append((k, parts[0], now))
            continue
        sizes = {static_block(src, s["text"][1]) for s in launches(src, k["name"])}
        if len(sizes) == 1 and None not in sizes:
            options.append((k, sizes.pop(), None))
    if not options:
        return None
    k, block, now = rng.choice(options)
    minb = rng.choice([b for b in (1, 2, 4, 8) if b != now])
    lb = f"{block}, {minb}" if minb > 1 else block
    if now is not None:
        a, b = k["lb_span"]
        return src[:a] + lb + src[b:]
    return src[:k["name_at"]] + f"__launch_bounds__({lb}) " + src[k["name_at"]:]


def cache_hints(src: str, rng) -> str | None:
    """Read-only loads through `__ldg`, or a swap of the cache hint on the loads that have one."""
    used = [h for h in _HINTS if re.search(rf"\b{h}\s*\(", src)]
    if used:
        old = rng.choice(used)
        new = rng.choice([h for h in _HINTS if h != old])
        return re.sub(rf"\b{old}(\s*\()", rf"{new}\1", src)
    out = src
    for k in reversed(kernels(src)):
        a, b = k["body"]
        body = out[a:b]
        ro = [p for p, const in pointer_params(k["params"]).items() if const]
        ro += re.findall(r"\bconst\s+float\s*\*\s*(?:__restrict__\s+)?(\w+)\s*=", body)   # read-only aliases
        for p in ro:
            body = re.sub(rf"(?<![\w&.])({p}\[[^\[\];]+\])", r"__ldg(&\1)", body)
        out = out[:a] + body + out[b:]
    return out if out != src else None


def pad_shared(src: str, rng) -> str | None:
    """`__shared__ float T[A][B]` -> `[A][B + 1]` for a tile read by plain indexing only."""
    options = [m for m in re.finditer(r"__shared__\s+(?:float|double)\s+(\w+)\s*\[([^\]]+)\]\s*\[([^\]+]+)\]\s*;", src)
               if not re.search(rf"reinterpret_cast<[^>]*>\s*\(\s*&?\s*{m.group(1)}\b|&{m.group(1)}\b", src)]
    if not options:
        return None
    m = rng.choice(options)
    a, b = m.span(3)
    return src[:a] + f"{m.group(3).strip()} + 1" + src[b:]


_BLOCK_CONST = (r"^[ \t]*(?:static\s+)?(?:const\s+|constexpr\s+)*(?:int|unsigned|size_t|int64_t)\s+{name}"
                r"\s*=\s*(?P<val>\d+)\s*;", r"^[ \t]*#[ \t]*define[ \t]+{name}[ \t]+\(?(?P<val>\d+)\)?[ \t]*(?://.*)?$")


def block_size(src: str, rng) -> str | None:
    """A launch's block size set by the host as a constant becomes `KF_BLOCK_<NAME>`, declared
    with powers of two from a quarter to four times it (32..1024), its value first. Whatever the
    kernel derives from the constant (shared sizes, template arguments) follows it; a kernel that
    assumes the old size fails the verdict like any wrong candidate."""
    options = {}
    for k in kernels(src):
        for s in launches(src, k["name"]):
            name = s["text"][1].strip()
            if not re.fullmatch(r"[A-Za-z_]\w*", name) or name.startswith("KF_") or name in options:
                continue
            for pat in _BLOCK_CONST:
                m = re.search(pat.format(name=re.escape(name)), src, re.M)
                if m and 32 <= int(m["val"]) <= 1024 and int(m["val"]) & (int(m["val"]) - 1) == 0:
                    options[name] = m
                    break
    if not options:
        return None
    name = rng.choice(sorted(options))
    m, v = options[name], int(options[name]["val"])
    param = f"KF_BLOCK_{name.upper()}"
    new = src[:m.start("val")] + param + src[m.end("val"):]
    return add_param(new, param, [x for x in (v // 4, v // 2, v, v * 2, v * 4) if 32 <= x <= 1024], v)


EDITS = {"vector_io": vector_io, "grid_stride": grid_stride, "unroll": unroll, "launch_bounds": launch_bounds,
         "cache_hints": cache_hints, "pad_shared": pad_shared,
         "block_size": block_size}
