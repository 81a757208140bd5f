// C = A @ B, row-major, inner product per output element (B read down its columns), one thread.
#include <cstdint>
// @kf.param UNROLL_K in [1, 2, 4, 8]

extern "C" int kf_forward(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k) {
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            float acc = 0.f;
            int64_t p = 0;
            for (; p + UNROLL_K <= k; p += UNROLL_K)
                for (int u = 0; u < UNROLL_K; ++u)
                    acc += A[i * k + p + u] * B[(p + u) * n + j];
            for (; p < k; ++p) acc += A[i * k + p] * B[p * n + j];
            C[i * n + j] = acc;
        }
    return 0;
}
