// C = A @ B (row-major), one work-item per element of C (whole program).
#include <sycl/sycl.hpp>
#include <cstdint>
// @kf.param TX in [16, 8, 32]
// @kf.param TY in [4, 1, 2, 8]

extern "C" int kf_forward(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k,
                          sycl::queue* queue) {
    if (m <= 0 || n <= 0) return 0;
    const sycl::range<2> global((size_t)((m + TY - 1) / TY * TY), (size_t)((n + TX - 1) / TX * TX));
    queue->parallel_for(sycl::nd_range<2>(global, sycl::range<2>(TY, TX)), [=](sycl::nd_item<2> it) {
        const int64_t row = it.get_global_id(0), col = it.get_global_id(1);
        if (row >= m || col >= n) return;
        float acc = 0.f;
        for (int64_t p = 0; p < k; ++p) acc += A[row * k + p] * B[p * n + col];
        C[row * n + col] = acc;
    });
    return 0;
}
