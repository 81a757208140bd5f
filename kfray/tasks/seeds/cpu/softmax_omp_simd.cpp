// Row softmax: rows across threads; SIMD reductions; exponentials written once and rescaled.
#include <cmath>
#include <cstdint>
// @kf.param CHUNK in [1, 2, 4, 8, 16, 32, 64]

extern "C" int kf_forward(const float* __restrict x, float* __restrict y, int64_t rows, int64_t cols) {
    #pragma omp parallel for schedule(dynamic, CHUNK)
    for (int64_t r = 0; r < rows; ++r) {
        const float* in = x + r * cols;
        float* out = y + r * cols;
        float m = -INFINITY;
        #pragma omp simd reduction(max:m)
        for (int64_t c = 0; c < cols; ++c) m = in[c] > m ? in[c] : m;
        float s = 0.f;
        #pragma omp simd reduction(+:s)
        for (int64_t c = 0; c < cols; ++c) { float e = std::exp(in[c] - m); out[c] = e; s += e; }
        const float inv = 1.f / s;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) out[c] *= inv;
    }
    return 0;
}
