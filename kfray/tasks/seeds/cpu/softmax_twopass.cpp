// Row softmax in two passes per row: the max, then the exponentials written once with their sum
// accumulated on the way, and a SIMD rescale. One thread; the max and sum loops are reductions
// that want `simd reduction(...)`, and rows are independent (threads).
#include <cmath>
#include <cstdint>
// @kf.param ROWS_PER_TASK in [1, 2, 4, 8, 16, 32, 64]

extern "C" int kf_forward(const float* __restrict x, float* __restrict y, int64_t rows, int64_t cols) {
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS_PER_TASK)
    for (int64_t r = r0; r < r0 + ROWS_PER_TASK && r < rows; ++r) {
        const float* in = x + r * cols;
        float* out = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = in[c] > m ? in[c] : m;
        float s = 0.f;
        for (int64_t c = 0; c < cols; ++c) { float e = std::exp(in[c] - m); out[c] = e; s += e; }
        const float inv = 1.f / s;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) out[c] *= inv;
    }
    return 0;
}
