"""Behavioral descriptors: place a kernel in the MAP-Elites grid by static analysis of its source.

Why: the archive keeps one elite per (memory, compute, parallelism) cell, so each cell must be
cheap, deterministic and independent of the kernel's speed. Each dimension has 4 levels; a
kernel's level is the highest one whose pattern set matches (0 if none). Patterns live in
per-language tables (dim -> [(level, regex or tuple of regexes that must ALL match)]), so adding
a language is adding a table. Comments are stripped first so they never change the cell.
"""
from __future__ import annotations

import functools

import re

from kfray.languages import LANGUAGES, family
from kfray.source import COMMENT_OR_LITERAL

DIMENSIONS = ("memory", "compute", "parallelism")
LEVELS = 4

_NAMES = {
    "memory": ("plain global memory", "vectorized/coalesced loads", "shared/local memory tiles",
               "register blocking + prefetch/double buffering"),
    "compute": ("multi-pass", "fused/FMA", "single-pass/streaming reductions",
                "tiled/blocked algorithms"),
    "parallelism": ("thread-only", "work-group cooperation", "warp/sub-group intrinsics",
                    "hierarchical"),
}


def _r(p: str, flags: int = re.M) -> re.Pattern:
    return re.compile(p, flags)


# -- patterns shared by several languages -------------------------------------------------------
_EXP = r"(?:\w+::)*(?:__|native_)?exp2?f?\s*\("
_FMA = _r(r"\bfmaf?\s*\(|__fmaf?_r[nzud]\b|\bmad(?:24)?\s*\(|_mm\d*_fn?m(?:add|sub)\w*")
_ONLINE = (_r(r"(?i)online|welford"),
           _r(r"\b([\w.]+(?:\[[^\]\n]*\])?)\s*=\s*\1\s*\*\s*" + _EXP),   # s = s * exp(m_old - m)
           _r(r"\*=\s*" + _EXP),                                            # s *= exp(m_old - m)
           _r(r"\b([\w.]+(?:\[[^\]\n]*\])?)\s*=\s*" + _EXP + r"[^;\n]*\)\s*\*\s*\1\b"))
_TM = r"(?:[A-Z0-9_]*TILE[A-Z0-9_]*|[A-Z0-9_]*BLOCK[A-Z0-9_]*|B[MNK]|T[MNK]|TS)\b"
_TLOOP = r"for\s*\([^;]*=\s*\w*0\s*;[^;]*;\s*\w+\s*\+=\s*" + _TM   # for (k0 = 0; ...; k0 += TILE)
_TSTEP = _r(_TLOOP + r"|<[^;\n]*/\s*" + _TM)                     # ... or t < (K + TILE - 1) / TILE
_TWO_TSTEPS = _r(_TLOOP + r"[\s\S]*?" + _TLOOP)                  # two tiled loop levels
_MMA = _r(r"\b(?:wmma|mma|joint_matrix|mma_sync)\b")
_DBUF = _r(r"\w+\s*\[\s*2\s*\]\s*\[|(?i:double_?buf|ping_?pong)")

# C++ / OpenMP (CPU)
_OMP_PAR = _r(r"#\s*pragma\s+omp\s+(?:parallel|target|teams|taskloop)\b")
_SIMD = _r(r"#\s*pragma\s+omp\b[^\n]*\bsimd\b|\b_mm\d*_\w+\s*\(|\b__m(?:128|256|512)[di]?\b"
           r"|\bfloat32x4_t\b|\bsvfloat32_t\b")
_LOCAL_TILE = _r(r"^\s+(?:float|double|int|half|_Float16)\s+\w+\s*\[\s*\w+\s*\]\s*\[\s*\w+\s*\]"
                 r"|^\s+(?:float|double)\s+\w+\s*\[\s*(?:" + _TM + r"|\w+\s*\*\s*\w+)\s*\]")
CPP = {
    "memory": [(1, _SIMD), (2, _LOCAL_TILE), (3, _r(r"__builtin_prefetch|_mm_prefetch")), (3, _DBUF)],
    "compute": [(1, _FMA), *[(2, p) for p in _ONLINE], (3, _TWO_TSTEPS), (3, (_TSTEP, _LOCAL_TILE)),
                (3, _MMA)],
    "parallelism": [(1, _OMP_PAR), (2, (_OMP_PAR, _SIMD)),
                    (3, (_OMP_PAR, _SIMD, _r(r"\bcollapse\s*\(|\btaskloop\b|\bteams\b")))],
}

# CUDA
_SHARED = _r(r"__shared__")
_WARP = _r(r"__shfl_\w*sync\b|__reduce_\w+_sync\b|tiled_partition|__ballot_sync\b|coalesced_threads")
_BLOCK = _r(r"__syncthreads\s*\(|__shared__|this_thread_block")
# The offline CUDA edits (kfray/proposers/cuda_edits.py) move kernels along these: cache hints
# count as memory level 1, an explicit unroll factor (instruction-level parallelism) as compute
# level 1, and an occupancy-shaped launch (grid-stride loop, min-blocks launch bounds, occupancy
# query) as parallelism level 1.
_CUDA_OCCUPANCY = _r(r"gridDim\.x\s*\*\s*blockDim\.x|cudaOccupancy\w+"
                     r"|__launch_bounds__\s*\((?:[^(),]|\([^()]*\))+,")
CUDA = {
    "memory": [(1, _r(r"\b(?:float[24]|double2|half2|__half2|int4|uint4|__nv_bfloat162)\b"
                      r"|__ld(?:g|cs|cg|lu|ca)\s*\(|__st(?:cs|cg|wt)\s*\(")),
               (2, _SHARED), (3, _r(r"cp\.async|__pipeline_\w+|memcpy_async|cuda::pipeline")),
               (3, _r(r"__shared__[^;]*\[\s*2\s*\]\s*\[")),
               (3, (_SHARED, _r(r"^\s*(?:float|double|half|__half)\s+\w+\s*\[[^\]\n]+\]\s*\[")))],
    "compute": [(1, _FMA), (1, _r(r"#\s*pragma\s+unroll\s+\d")), *[(2, p) for p in _ONLINE],
                (3, (_TSTEP, _SHARED)), (3, _TWO_TSTEPS), (3, _MMA)],
    "parallelism": [(1, _BLOCK), (1, _CUDA_OCCUPANCY), (2, _WARP), (3, (_WARP, _BLOCK)),
                    (3, _r(r"__cluster_dims__|cluster_group|this_cluster|this_grid|grid\.sync"))],
}

# SYCL (whole programs and run-time compiled free-function kernels)
_SLM = _r(r"local_accessor|group_local_memory|target::local\b|work_group_static|work_group_memory"
          r"|work_group_scratch_memory")
_SUBGROUP = _r(r"sub_group|shift_group_(?:left|right)|permute_group_by_xor|select_from_group"
               r"|reqd_sub_group_size")
_SYCL_VEC = _r(r"\bvec\s*<|\bmarray\s*<|\bfloat[248]\b|\.load\s*\(|\bgroup_(?:load|store)\b"
               r"|block_(?:load|store)|\.as\s*<\s*(?:sycl::)?vec")
_SYCL_BARRIER = _r(r"group_barrier|\bbarrier\s*\(")
_SYCL_WG = _r(r"group_barrier|\bbarrier\s*\(|reduce_over_group|group_broadcast|joint_reduce"
              r"|(?:inclusive|exclusive)_scan_over_group|(?:any|all|none)_of_group|get_group\s*\(\s*\)")
_SYCL_REGTILE = _r(r"^\s*(?:float|double|half|sycl::half)\s+\w+\s*\[[^\]\n]+\]\s*\[")
_SYCL_HIER = _r(r"parallel_for_work_(?:group|item)|\broot_group\b")
SYCL = {
    "memory": [(1, _SYCL_VEC), (2, _SLM), (3, _r(r"\bprefetch\s*\(")), (3, (_SLM, _DBUF)),
               (3, (_SLM, _SYCL_REGTILE))],
    "compute": [(1, _FMA), *[(2, p) for p in _ONLINE], (3, (_TSTEP, _SLM)), (3, _TWO_TSTEPS),
                (3, _MMA), (3, _r(r"joint_matrix_mad"))],
    "parallelism": [(1, _r(r"\bnd_range\b|\bnd_item\b")), (1, _SYCL_WG), (1, _SLM), (2, _SUBGROUP),
                    (3, _SYCL_HIER), (3, (_SUBGROUP, _SLM)), (3, (_SUBGROUP, _SYCL_BARRIER))],
}
# Run-time compiled kernels are nd-range kernels by construction (nd_range_kernel, get_nd_item),
# so there only real cooperation counts as work-group parallelism.
SYCL_JIT = {**SYCL, "parallelism": [(1, _SYCL_WG), (1, _SLM), (2, _SUBGROUP), (3, _SYCL_HIER),
                                    (3, (_SUBGROUP, _SLM)), (3, (_SUBGROUP, _SYCL_BARRIER))]}

# OpenCL C
_CL_LOCAL = _r(r"\b__local\b|\blocal\s+(?:float|double|half|int|uint)\b")
_CL_SUB = _r(r"sub_group_\w+|get_sub_group")
_CL_WG = _r(r"barrier\s*\(\s*CLK_LOCAL_MEM_FENCE|\bget_local_id\b|\bwork_group_\w+|\b__local\b")
OPENCL = {
    "memory": [(1, _r(r"\bv(?:load|store)\d+\b|\b(?:float|half|int)(?:2|4|8|16)\b")), (2, _CL_LOCAL),
               (3, _r(r"\bprefetch\s*\(|async_work_group_copy")), (3, (_CL_LOCAL, _DBUF))],
    "compute": [(1, _FMA), *[(2, p) for p in _ONLINE], (3, (_TSTEP, _CL_LOCAL)), (3, _TWO_TSTEPS),
                (3, _MMA)],
    "parallelism": [(1, _CL_WG), (2, _CL_SUB), (3, (_CL_SUB, _CL_WG))],
}

TABLES = {"cpp": CPP, "cuda": CUDA, "sycl": SYCL, "sycl_jit": SYCL_JIT, "opencl": OPENCL}



def strip_comments(source: str) -> str:
    """Drop // and /* */ comments (keeping string literals and line breaks)."""
    return COMMENT_OR_LITERAL.sub(lambda m: m.group(1) or "\n" * m.group(0).count("\n"), source)


def _suite_language(source: str) -> str:
    """Suite-form kernels (a PyTorch extension or a ModelNew file with CUDA sources inside) are
    described by the CUDA tables when they hold CUDA kernels, else by the C++ ones."""
    return "cuda" if "__global__" in source else "cpp"


def _table(language: str) -> dict:
    if language not in TABLES and language in LANGUAGES:      # e.g. suite: read by its family's table
        language = family(language)
    if language not in TABLES:
        raise ValueError(f"unknown kernel language {language!r}; expected one of {sorted(TABLES)}")
    return TABLES[language]


@functools.lru_cache(maxsize=4096)
def describe(source: str, language: str) -> tuple[int, int, int]:
    """The (memory, compute, parallelism) cell of `source`, each level in 0..LEVELS-1.
    Cached: most children only change parameters, so the same source is described again and again."""
    if language == "suite":
        language = _suite_language(source)
    table, code = _table(language), strip_comments(source)

    def level(dim: str) -> int:
        hits = [lvl for lvl, pat in table[dim]
                if all(p.search(code) for p in (pat if isinstance(pat, tuple) else (pat,)))]
        return max(hits, default=0)

    return tuple(level(d) for d in DIMENSIONS)  # type: ignore[return-value]


def _check(dim: str, level: int) -> None:
    if dim not in DIMENSIONS:
        raise ValueError(f"unknown descriptor dimension {dim!r}; expected one of {DIMENSIONS}")
    if not 0 <= level < LEVELS:
        raise ValueError(f"descriptor level {level} out of range 0..{LEVELS - 1}")


def level_name(dim: str, level: int) -> str:
    _check(dim, level)
    return _NAMES[dim][level]


_LEVEL0 = {"memory": "read and write global memory directly with plain scalar accesses",
           "compute": "use a straightforward multi-pass computation",
           "parallelism": "give each thread independent elements with no cooperation"}
_STEPS = {  # language -> dim -> directives for levels 1..3
    "cpp": {"memory": ("vectorize the inner loops with #pragma omp simd or AVX intrinsics (__m256, _mm256_*)",
                       "accumulate in a local fixed-size tile array such as float acc[BM][BN] that stays in cache",
                       "block into registers and prefetch upcoming data with __builtin_prefetch or double buffers"),
            "compute": ("fuse the passes and use fused multiply-add (std::fma)",
                        "make reductions single-pass (online max/sum with rescaling)",
                        "tile the loops by block-size macros (i0 += BM, k0 += BK) to reuse data from cache"),
            "parallelism": ("parallelize the outer loop with #pragma omp parallel for",
                            "combine #pragma omp parallel for with #pragma omp simd inner loops",
                            "go hierarchical: omp parallel with collapse(2) or taskloop over tiles plus omp simd")},
    "cuda": {"memory": ("use vectorized float4 loads (reinterpret_cast<const float4*>) or __ldg",
                        "stage tiles of the inputs in __shared__ memory",
                        "add register tiles and double-buffer shared memory with cp.async / cuda::memcpy_async"),
             "compute": ("fuse the passes into one kernel and use fmaf / __fmaf_rn",
                         "make reductions single-pass (online softmax: running max rescales the running sum)",
                         "use a tiled algorithm (for k0 += TILE over __shared__ tiles) or wmma/mma tensor cores"),
             "parallelism": ("cooperate within a block through __shared__ memory and __syncthreads()",
                             "use warp shuffles (__shfl_down_sync) for reductions",
                             "reduce hierarchically: warp shuffles within warps, then shared memory across warps")},
    "sycl": {"memory": ("use vectorized loads with sycl::vec<float, 4>",
                        "stage tiles of the inputs in sycl::local_accessor work-group local memory",
                        "add register blocking and prefetch / double-buffer the local-memory tiles"),
             "compute": ("fuse the passes and use sycl::fma",
                         "make reductions single-pass (online max/sum with rescaling)",
                         "use a tiled algorithm over local-memory tiles (k0 += TILE) or joint_matrix"),
             "parallelism": ("use an nd_range kernel with work-group cooperation (group_barrier)",
                             "use sub-group operations (reduce_over_group on the sub_group, shift_group_left)",
                             "combine sub-group reductions with work-group local memory cooperation")},
    "sycl_jit": {"memory": ("load and store sycl::vec<float, 4> through the USM pointers (reinterpret_cast)",
                            "stage tiles in work-group local memory: static syclexp::work_group_static<float[N]>",
                            "add register blocking (a private acc[RM][RN] tile) over local-memory tiles, and "
                            "double-buffer or prefetch them"),
                 "compute": ("fuse the passes and use sycl::fma",
                             "make reductions single-pass (online max/sum with rescaling)",
                             "use a tiled algorithm over local-memory tiles (k0 += TILE) or joint_matrix"),
                 "parallelism": ("cooperate within the work-group: it.get_group() with sycl::group_barrier and "
                                 "sycl::reduce_over_group",
                                 "use sub-group collectives (reduce_over_group on it.get_sub_group(), "
                                 "shift_group_left, select_from_group)",
                                 "combine sub-group reductions with work-group local memory and group_barrier")},
    "opencl": {"memory": ("use vectorized vload4 / float4 accesses",
                          "stage tiles of the inputs in __local memory",
                          "add register blocking and prefetch or double-buffer the __local tiles"),
               "compute": ("fuse the passes and use fma / mad",
                           "make reductions single-pass (online max/sum with rescaling)",
                           "use a tiled algorithm over __local tiles (k0 += TILE)"),
               "parallelism": ("cooperate within a work-group via __local memory and barrier(CLK_LOCAL_MEM_FENCE)",
                               "use sub-group functions (sub_group_reduce_add, sub_group_shuffle)",
                               "combine sub-group reductions with work-group __local cooperation")},
}


def step_directive(dim: str, level: int, language: str) -> str:
    """A short imperative asking a proposer to move a kernel to `level` on `dim`."""
    _check(dim, level)
    _table(language)
    return _LEVEL0[dim] if level == 0 else _STEPS[language if language in _STEPS else family(language)][dim][level - 1]


def change_directive(language: str, rng, avoid: list[str] = ()) -> list[str]:
    """One concrete change, drawn from the language's steps, for a model that handed its parent back:
    a small model told only "change the code" repeats itself; told what to change, it changes that.
    Steps the prompt already asks for (`avoid`, its directive lines) are left out. []: no steps."""
    try:
        steps = [step_directive(d, k, language) for d in DIMENSIONS for k in range(1, LEVELS)]
    except ValueError:          # a language without step directives
        return []
    steps = [s for s in steps if not any(s in a for a in avoid)]
    return [f"Make this one change to the parent, and keep the rest of it: {rng.choice(steps)}."] if steps else []
