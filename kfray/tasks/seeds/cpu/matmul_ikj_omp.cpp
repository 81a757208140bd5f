// C = A @ B with the i-k-j loop order: B and C are streamed along rows, the j loop is SIMD;
// rows of C across threads.
#include <cstdint>
// @kf.param CHUNK in [1, 8, 32]

extern "C" int kf_forward(const float* __restrict A, const float* __restrict B, float* __restrict C,
                          int64_t m, int64_t n, int64_t k) {
    #pragma omp parallel for schedule(dynamic, CHUNK)
    for (int64_t i = 0; i < m; ++i) {
        float* c = C + i * n;
        for (int64_t j = 0; j < n; ++j) c[j] = 0.f;
        for (int64_t p = 0; p < k; ++p) {
            const float a = A[i * k + p];
            const float* b = B + p * n;
            #pragma omp simd
            for (int64_t j = 0; j < n; ++j) c[j] += a * b[j];
        }
    }
    return 0;
}
