"""Static behavioral descriptors: seed cells, per-language samples, comment immunity, errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from kfray.descriptors import (DIMENSIONS, LEVELS, TABLES, describe, level_name,
                                      step_directive, strip_comments)

SEEDS = Path(__file__).resolve().parents[1] / "kfray" / "tasks" / "seeds" / "cpu"


def _seed(name: str) -> str:
    return (SEEDS / f"{name}.cpp").read_text()


def _vector_code(src: str) -> bool:
    """Intrinsics, vector types, or an OpenMP simd pragma, as a reader would spot them."""
    return any(w in src for w in ("_mm", "__m256", "__m512")) or any(
        "#pragma omp" in line and "simd" in line for line in src.splitlines())


@pytest.mark.parametrize("path", sorted(SEEDS.glob("*.cpp")), ids=lambda p: p.stem)
def test_cpu_seed_cells_follow_what_the_source_does(path):
    """Each shipped seed's cell read against what its code visibly does (comments aside): OpenMP
    threads move it off the thread-only column, threads with vector code one further; vector code
    moves it off plain memory, prefetching to the top memory level; fused multiply-adds off
    multi-pass compute; and a task's naive seed is the grid's origin."""
    code = strip_comments(path.read_text())
    mem, comp, par = describe(path.read_text(), "cpp")
    threads, vectors = "#pragma omp parallel" in code, _vector_code(code)
    assert (par > 0) == threads, (mem, comp, par)
    assert (par >= 2) == (threads and vectors), (mem, comp, par)
    assert mem >= 1 or not vectors, (mem, comp, par)
    assert mem == 3 or "prefetch" not in code, (mem, comp, par)
    assert comp >= 1 or "fma" not in code.lower(), (mem, comp, par)
    if path.stem.endswith("_naive"):
        assert (mem, comp, par) == (0, 0, 0)


@pytest.mark.parametrize("task", ["axpb", "softmax", "matmul"])
def test_each_task_seeds_occupy_distinct_cells(task):
    names = sorted(SEEDS.glob(f"{task}_*.cpp"))
    assert len(names) == 4
    cells = {describe(p.read_text(), "cpp") for p in names}
    assert len(cells) == 4, cells


def test_restrict_alone_is_not_vectorized():
    src = "void f(const float* __restrict x, float* __restrict y, int n) {\n" \
          "  for (int i = 0; i < n; ++i) y[i] = 2 * x[i];\n}\n"
    assert describe(src, "cpp") == (0, 0, 0)


def test_cpp_intrinsics_and_prefetch():
    src = """
    void f(const float* x, float* y, long n) {
        #pragma omp parallel for
        for (long i = 0; i < n; i += 8) {
            __builtin_prefetch(x + i + 64);
            __m256 v = _mm256_loadu_ps(x + i);
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(v, v, v));
        }
    }"""
    assert describe(src, "cpp") == (3, 1, 2)


CUDA_NAIVE = """
__global__ void axpb(const float* x, float* y, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}"""

CUDA_TILED_MATMUL = """
#define TILE 16
__global__ void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        As[threadIdx.y][threadIdx.x] = A[row * K + k0 + threadIdx.x];
        Bs[threadIdx.y][threadIdx.x] = B[(k0 + threadIdx.y) * N + col];
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    C[row * N + col] = acc;
}"""

CUDA_WARP_SOFTMAX = """
__global__ void softmax(const float* x, float* y, int cols) {
    const float* in = x + blockIdx.x * cols;
    float m = -INFINITY, s = 0.f;
    for (int c = threadIdx.x; c < cols; c += 32) {
        float v = in[c], nm = fmaxf(m, v);
        s = s * __expf(m - nm) + __expf(v - nm);
        m = nm;
    }
    for (int off = 16; off > 0; off >>= 1) {
        float om = __shfl_down_sync(0xffffffff, m, off), os = __shfl_down_sync(0xffffffff, s, off);
        float nm = fmaxf(m, om);
        s = s * __expf(m - nm) + os * __expf(om - nm);
        m = nm;
    }
    m = __shfl_sync(0xffffffff, m, 0); s = __shfl_sync(0xffffffff, s, 0);
    for (int c = threadIdx.x; c < cols; c += 32) y[blockIdx.x * cols + c] = __expf(in[c] - m) / s;
}"""


def test_cuda_naive_elementwise():
    assert describe(CUDA_NAIVE, "cuda") == (0, 0, 0)


def test_cuda_shared_tiled_matmul():
    mem, comp, par = describe(CUDA_TILED_MATMUL, "cuda")
    assert (mem, comp, par) == (2, 3, 1)


def test_cuda_warp_shuffle_softmax():
    mem, comp, par = describe(CUDA_WARP_SOFTMAX, "cuda")
    assert par >= 2
    assert comp == 2  # online rescale of the running sum
    assert mem == 0


def test_cuda_vectorized_and_double_buffered():
    vec = CUDA_NAIVE.replace("if (i < n) y[i] = a * x[i] + b;",
                             "float4 v = reinterpret_cast<const float4*>(x)[i]; y[i] = fmaf(a, v.x, b);")
    assert describe(vec, "cuda")[:2] == (1, 1)
    dbuf = CUDA_TILED_MATMUL.replace("__shared__ float As[TILE][TILE];", "__shared__ float As[2][TILE][TILE];")
    assert describe(dbuf, "cuda")[0] == 3


def test_block_strided_loop_is_not_tiling():
    src = """__global__ void rsum(const float* x, float* y, int n) {
    __shared__ float s[256]; float a = 0.f;
    for (int i = threadIdx.x; i < n; i += BLOCK_SIZE) a += x[i];
    s[threadIdx.x] = a; __syncthreads();
}"""
    assert describe(src, "cuda") == (2, 0, 1)


def test_comment_mentioning_shared_does_not_change_cell():
    base = describe(CUDA_NAIVE, "cuda")
    commented = CUDA_NAIVE.replace(
        "int i =", "// TODO: stage x in __shared__ memory, __syncthreads(), __shfl_down_sync\n"
                   "    /* __shared__ float tile[TILE][TILE]; for (k0 = 0; k0 < K; k0 += TILE) */ int i =")
    assert describe(commented, "cuda") == base == (0, 0, 0)
    assert "__shared__" not in strip_comments(commented)
    # and a C++ comment mentioning pragmas changes nothing either
    assert describe("// #pragma omp parallel for simd collapse(2)\n" + _seed("axpb_naive"), "cpp") == (0, 0, 0)


def test_string_literal_with_slashes_is_kept():
    assert strip_comments('const char* s = "a//b"; // gone').strip() == 'const char* s = "a//b";'


SYCL_SOFTMAX = """
q.submit([&](sycl::handler& h) {
    sycl::local_accessor<float, 1> scratch(sycl::range<1>(WG / 32), h);
    h.parallel_for(sycl::nd_range<1>(rows * WG, WG), [=](sycl::nd_item<1> it) [[sycl::reqd_sub_group_size(32)]] {
        auto sg = it.get_sub_group();
        float v = x[it.get_global_id(0)];
        float m = sycl::reduce_over_group(sg, v, sycl::maximum<float>());
        if (sg.get_local_id() == 0) scratch[sg.get_group_id()] = m;
        sycl::group_barrier(it.get_group());
        y[it.get_global_id(0)] = sycl::exp(v - scratch[0]);
    });
});"""

SYCL_PLAIN = """
q.parallel_for(sycl::range<1>(n), [=](sycl::id<1> i) { y[i] = a * x[i] + b; });"""


def test_sycl_samples():
    assert describe(SYCL_PLAIN, "sycl") == (0, 0, 0)
    mem, comp, par = describe(SYCL_SOFTMAX, "sycl")
    assert mem == 2 and par == 3
    assert describe(SYCL_PLAIN.replace("a * x[i] + b", "sycl::fma(a, x[i], b)"), "sycl") == (0, 1, 0)


OPENCL_PLAIN = """
__kernel void axpb(__global const float* x, __global float* y, float a, float b) {
    int i = get_global_id(0);
    y[i] = a * x[i] + b;
}"""

OPENCL_REDUCE = """
__kernel void rowsum(__global const float* x, __global float* y, int cols) {
    __local float part[16];
    float4 v = vload4(get_local_id(0), x + get_group_id(0) * cols);
    float s = sub_group_reduce_add(v.x + v.y + v.z + v.w);
    if (get_sub_group_local_id() == 0) part[get_sub_group_id()] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) y[get_group_id(0)] = mad(part[0], 1.0f, part[1]);
}"""


def test_opencl_samples():
    assert describe(OPENCL_PLAIN, "opencl") == (0, 0, 0)
    assert describe(OPENCL_REDUCE, "opencl") == (2, 1, 3)
    only_barrier = OPENCL_PLAIN.replace("y[i] =", "barrier(CLK_LOCAL_MEM_FENCE); y[i] =")
    assert describe(only_barrier, "opencl")[2] == 1


def test_unknown_language_raises_naming_it():
    with pytest.raises(ValueError, match="fortran"):
        describe("program x", "fortran")
    with pytest.raises(ValueError, match="fortran"):
        step_directive("memory", 1, "fortran")


def test_tables_cover_every_dimension_with_valid_levels():
    assert DIMENSIONS == ("memory", "compute", "parallelism") and LEVELS == 4
    for lang, table in TABLES.items():
        assert set(table) == set(DIMENSIONS), lang
        for dim, rows in table.items():
            assert rows and all(0 < lvl < LEVELS for lvl, _ in rows), (lang, dim)


def test_level_names_and_directives():
    assert level_name("memory", 2) == "shared/local memory tiles"
    assert step_directive("memory", 2, "cuda") == "stage tiles of the inputs in __shared__ memory"
    assert step_directive("parallelism", 2, "cuda") == "use warp shuffles (__shfl_down_sync) for reductions"
    for lang in TABLES:
        for dim in DIMENSIONS:
            texts = [step_directive(dim, lvl, lang) for lvl in range(LEVELS)]
            assert all(t and len(t) < 140 for t in texts) and len(set(texts)) == LEVELS
            assert all(level_name(dim, lvl) for lvl in range(LEVELS))
    assert "omp" in step_directive("parallelism", 1, "cpp")
    assert "local_accessor" in step_directive("memory", 2, "sycl")
    assert "__local" in step_directive("memory", 2, "opencl")
    with pytest.raises(ValueError):
        level_name("memory", 4)
    with pytest.raises(ValueError):
        level_name("latency", 0)


SYCL_JIT_NAIVE = """
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void k(const float* x, float* y, float a, float b, int64_t n) {
    const int64_t i = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
    if (i < n) y[i] = a * x[i] + b;
}"""


def test_sycl_jit_patterns():
    # A run-time compiled kernel is an nd-range kernel by construction: that alone is not cooperation.
    assert describe(SYCL_JIT_NAIVE, "sycl_jit") == (0, 0, 0)
    ndr = "q.parallel_for(sycl::nd_range<1>(n, 256), [=](sycl::nd_item<1> it) { y[it.get_global_id(0)] = 0; });"
    assert describe(ndr, "sycl")[2] == 1 and describe(ndr, "sycl_jit")[2] == 0
    vec = SYCL_JIT_NAIVE.replace("y[i] = a * x[i] + b;",
                                 "auto v = *reinterpret_cast<const sycl::vec<float, 4>*>(x + 4 * i);")
    assert describe(vec, "sycl_jit")[0] == 1
    block = SYCL_JIT_NAIVE.replace("y[i] =", "auto v = sg.block_load(x); y[i] =")
    assert describe(block, "sycl_jit")[0] == 1
    wg = SYCL_JIT_NAIVE.replace("y[i] =", "float s = sycl::reduce_over_group(it.get_group(), x[i], "
                                          "sycl::plus<float>()); y[i] =")
    assert describe(wg, "sycl_jit")[2] == 1
    slm = SYCL_JIT_NAIVE.replace("if (i < n)", "static syclexp::work_group_static<float[256]> tile;\n"
                                               "    sycl::group_barrier(g);\n    if (i < n)")
    assert describe(slm, "sycl_jit")[0] == 2 and describe(slm, "sycl_jit")[2] == 1
    shuffle = SYCL_JIT_NAIVE.replace("y[i] =", "float v = sycl::shift_group_left(it.get_sub_group(), x[i], 1); y[i] =")
    assert describe(shuffle, "sycl_jit")[2] == 2
    both = shuffle.replace("if (i < n)", "sycl::group_barrier(it.get_group());\n    if (i < n)")
    assert describe(both, "sycl_jit")[2] == 3
    hier = "q.submit([&](sycl::handler& h) { h.parallel_for_work_group(sycl::range<1>(8), [=](sycl::group<1> g) {"\
           " g.parallel_for_work_item([&](sycl::h_item<1> it) {}); }); });"
    assert describe(hier, "sycl")[2] == 3 and describe(hier, "sycl_jit")[2] == 3
    jm = "joint_matrix<sycl::sub_group, float, use::accumulator, 8, 16> c; joint_matrix_mad(sg, c, a, b, c);"
    assert describe(jm, "sycl_jit")[1] == 3
    regtile = slm.replace("if (i < n)", "float acc[4][4];\n    if (i < n)")
    assert describe(regtile, "sycl_jit")[0] == 3
    assert "work_group_static" in step_directive("memory", 2, "sycl_jit")


def test_cuda_descriptors_see_the_offline_edits():
    """Cache hints, an unroll factor and an occupancy-shaped launch each move a CUDA kernel."""
    assert describe(CUDA_NAIVE.replace("x[i]", "__ldcs(&x[i])"), "cuda")[0] == 1
    unrolled = CUDA_NAIVE.replace("if (i < n)", "#pragma unroll 4\n    for (; i < n; i += gridDim.x * blockDim.x)")
    assert describe(unrolled, "cuda")[1:] == (1, 1)
    bounded = CUDA_NAIVE.replace("__global__ void", "__global__ void __launch_bounds__(BLOCK * 2, 4)")
    assert describe(bounded, "cuda")[2] == 1
    assert describe(CUDA_NAIVE.replace("__global__ void", "__global__ void __launch_bounds__(256)"), "cuda")[2] == 0
