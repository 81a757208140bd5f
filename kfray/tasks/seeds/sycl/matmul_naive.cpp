// C = A @ B (row-major), one work-item per element of C, straight from global memory.
// Dimension 1 of the nd-range walks the columns, so neighbouring work-items read neighbouring B.
#include <sycl/sycl.hpp>
// @kf.param TX in [16, 8, 32, 64]
// @kf.param TY in [4, 1, 2, 8]
// @kf.require TX * TY <= 1024
// @kf.launch matmul_naive global=((m + TY - 1) // TY * TY, (n + TX - 1) // TX * TX) local=(TY, TX)

namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<2>))
void matmul_naive(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k) {
    const auto it = syclext::this_work_item::get_nd_item<2>();
    const int64_t row = it.get_global_id(0), col = it.get_global_id(1);
    if (row >= m || col >= n) return;
    float acc = 0.f;
    for (int64_t p = 0; p < k; ++p) acc += A[row * k + p] * B[p * n + col];
    C[row * n + col] = acc;
}
