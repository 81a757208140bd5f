// C = A @ B with the i-k-j loop order: B and C are streamed along rows, so the j loop is unit
// stride (SIMD once the compiler is told it may); rows of C are independent (threads). ROWS rows
// of C share each B row.
#include <cmath>
#include <cstdint>
// @kf.param ROWS in [1, 2, 4]

extern "C" int kf_forward(const float* __restrict A, const float* __restrict B, float* __restrict C,
                          int64_t m, int64_t n, int64_t k) {
    for (int64_t i0 = 0; i0 < m; i0 += ROWS) {
        const int64_t iend = i0 + ROWS < m ? i0 + ROWS : m;
        for (int64_t i = i0; i < iend; ++i)
            for (int64_t j = 0; j < n; ++j) C[i * n + j] = 0.f;
        for (int64_t p = 0; p < k; ++p) {
            const float* b = B + p * n;
            for (int64_t i = i0; i < iend; ++i) {
                const float a = A[i * k + p];
                float* c = C + i * n;
                for (int64_t j = 0; j < n; ++j) c[j] = std::fma(a, b[j], c[j]);
            }
        }
    }
    return 0;
}
