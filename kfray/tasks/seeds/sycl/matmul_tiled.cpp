// C = A @ B with TILE x TILE tiles of A and B staged in work-group local memory: each element
// loaded from global memory is reused TILE times; group barriers separate loading from use.
#include <sycl/sycl.hpp>
// @kf.param TILE in [16, 8, 32]
// @kf.launch matmul_tiled global=((m + TILE - 1) // TILE * TILE, (n + TILE - 1) // TILE * TILE) local=(TILE, TILE)

namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<2>))
void matmul_tiled(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k) {
    const auto it = syclext::this_work_item::get_nd_item<2>();
    const auto g = it.get_group();
    static syclexp::work_group_static<float[TILE * TILE]> As;   // work-group local memory
    static syclexp::work_group_static<float[TILE * TILE]> Bs;
    const int ty = it.get_local_id(0), tx = it.get_local_id(1);
    const int64_t row = it.get_global_id(0), col = it.get_global_id(1);
    float acc = 0.f;
    for (int64_t k0 = 0; k0 < k; k0 += TILE) {
        As[ty * TILE + tx] = (row < m && k0 + tx < k) ? A[row * k + k0 + tx] : 0.f;
        Bs[ty * TILE + tx] = (k0 + ty < k && col < n) ? B[(k0 + ty) * n + col] : 0.f;
        sycl::group_barrier(g);
#pragma unroll
        for (int p = 0; p < TILE; ++p) acc = sycl::fma(As[ty * TILE + p], Bs[p * TILE + tx], acc);
        sycl::group_barrier(g);
    }
    if (row < m && col < n) C[row * n + col] = acc;
}
