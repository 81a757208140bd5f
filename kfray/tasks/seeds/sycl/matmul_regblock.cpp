// C = A @ B with register blocking: each work-item accumulates an RM x RN block of C in registers
// (rows TY apart, columns TX apart, so neighbouring work-items still read neighbouring B), reusing
// every A value RN times and every B value RM times. Blocks inside C take a fast path with plain
// loads; blocks on the edge clamp their loads (which costs vectorized gathers) and skip stores.
#include <sycl/sycl.hpp>
// @kf.param TX in [16, 8, 32]
// @kf.param TY in [1, 2, 4]
// @kf.param RM in [4, 2, 8]
// @kf.param RN in [4, 2, 1]
// @kf.require RM * RN <= 16
// @kf.launch matmul_regblock global=((m + TY * RM - 1) // (TY * RM) * TY, (n + TX * RN - 1) // (TX * RN) * TX) local=(TY, TX)

namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;

template <bool EDGE>
static inline void block(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k,
                         int64_t row0, int64_t col0) {
    float acc[RM][RN];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j) acc[i][j] = 0.f;
    for (int64_t p = 0; p < k; ++p) {
        float a[RM], b[RN];
#pragma unroll
        for (int i = 0; i < RM; ++i) a[i] = A[(EDGE ? sycl::min(row0 + i * TY, m - 1) : row0 + i * TY) * k + p];
#pragma unroll
        for (int j = 0; j < RN; ++j) b[j] = B[p * n + (EDGE ? sycl::min(col0 + j * TX, n - 1) : col0 + j * TX)];
#pragma unroll
        for (int i = 0; i < RM; ++i)
#pragma unroll
            for (int j = 0; j < RN; ++j) acc[i][j] = sycl::fma(a[i], b[j], acc[i][j]);
    }
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j)
            if (!EDGE || (row0 + i * TY < m && col0 + j * TX < n)) C[(row0 + i * TY) * n + col0 + j * TX] = acc[i][j];
}

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<2>))
void matmul_regblock(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k) {
    const auto it = syclext::this_work_item::get_nd_item<2>();
    const int64_t row0 = it.get_group(0) * (TY * RM) + it.get_local_id(0);
    const int64_t col0 = it.get_group(1) * (TX * RN) + it.get_local_id(1);
    if (row0 + (RM - 1) * TY < m && col0 + (RN - 1) * TX < n) block<false>(A, B, C, m, n, k, row0, col0);
    else block<true>(A, B, C, m, n, k, row0, col0);
}
