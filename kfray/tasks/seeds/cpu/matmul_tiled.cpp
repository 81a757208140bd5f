// C = A @ B in BM x BN tiles with a BK-deep panel: each tile accumulates in a local register/L1
// block (acc), so A and B are reused from cache. Tiles are independent (threads).
#include <cstdint>
// @kf.param BM in [8, 16, 32]
// @kf.param BN in [32, 64, 128]
// @kf.param BK in [32, 64, 128]
// @kf.require BM * BN <= 4096

extern "C" int kf_forward(const float* __restrict A, const float* __restrict B, float* __restrict C,
                          int64_t m, int64_t n, int64_t k) {
    for (int64_t i0 = 0; i0 < m; i0 += BM)
        for (int64_t j0 = 0; j0 < n; j0 += BN) {
            float acc[BM][BN];
            for (int ii = 0; ii < BM; ++ii)
                for (int jj = 0; jj < BN; ++jj) acc[ii][jj] = 0.f;
            const int64_t iend = i0 + BM < m ? i0 + BM : m;
            const int64_t jend = j0 + BN < n ? j0 + BN : n;
            for (int64_t p0 = 0; p0 < k; p0 += BK) {
                const int64_t pend = p0 + BK < k ? p0 + BK : k;
                for (int64_t i = i0; i < iend; ++i)
                    for (int64_t p = p0; p < pend; ++p) {
                        const float a = A[i * k + p];
                        const float* b = B + p * n;
                        for (int64_t j = j0; j < jend; ++j) acc[i - i0][j - j0] += a * b[j];
                    }
            }
            for (int64_t i = i0; i < iend; ++i)
                for (int64_t j = j0; j < jend; ++j) C[i * n + j] = acc[i - i0][j - j0];
        }
    return 0;
}
