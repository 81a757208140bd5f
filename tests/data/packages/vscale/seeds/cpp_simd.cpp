// y = alpha * x, vectorised by the compiler.
#include <cstdint>
// @kf.param CHUNK in [1024, 8192]

extern "C" int kf_forward(const float* __restrict x, float* __restrict y, float alpha, int64_t n) {
    for (int64_t s = 0; s < n; s += CHUNK) {
        int64_t e = s + CHUNK < n ? s + CHUNK : n;
        #pragma omp simd
        for (int64_t i = s; i < e; ++i)
            y[i] = alpha * x[i];
    }
    return 0;
}
