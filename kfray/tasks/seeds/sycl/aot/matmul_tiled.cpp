// C = A @ B with TILE x TILE tiles of A and B in local_accessor memory and group barriers
// (whole program).
#include <sycl/sycl.hpp>
#include <cstdint>
// @kf.param TILE in [16, 8, 32]

extern "C" int kf_forward(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k,
                          sycl::queue* queue) {
    if (m <= 0 || n <= 0) return 0;
    const sycl::range<2> global((size_t)((m + TILE - 1) / TILE * TILE), (size_t)((n + TILE - 1) / TILE * TILE));
    queue->submit([&](sycl::handler& h) {
        sycl::local_accessor<float, 2> As(sycl::range<2>(TILE, TILE), h);
        sycl::local_accessor<float, 2> Bs(sycl::range<2>(TILE, TILE), h);
        h.parallel_for(sycl::nd_range<2>(global, sycl::range<2>(TILE, TILE)), [=](sycl::nd_item<2> it) {
            const int ty = it.get_local_id(0), tx = it.get_local_id(1);
            const int64_t row = it.get_global_id(0), col = it.get_global_id(1);
            float acc = 0.f;
            for (int64_t k0 = 0; k0 < k; k0 += TILE) {
                As[ty][tx] = (row < m && k0 + tx < k) ? A[row * k + k0 + tx] : 0.f;
                Bs[ty][tx] = (k0 + ty < k && col < n) ? B[(k0 + ty) * n + col] : 0.f;
                sycl::group_barrier(it.get_group());
                for (int p = 0; p < TILE; ++p) acc = sycl::fma(As[ty][p], Bs[p][tx], acc);
                sycl::group_barrier(it.get_group());
            }
            if (row < m && col < n) C[row * n + col] = acc;
        });
    });
    return 0;
}
