// Row softmax in three passes per row (max, sum of exponentials, normalise), one thread.
#include <cmath>
#include <cstdint>
// @kf.param ROW_STEP in [1, 2, 4, 8]

extern "C" int kf_forward(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_STEP)
    for (int64_t r = r0; r < r0 + ROW_STEP && r < rows; ++r) {
        const float* in = x + r * cols;
        float* out = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = in[c] > m ? in[c] : m;
        float s = 0.f;
        for (int64_t c = 0; c < cols; ++c) s += std::exp(in[c] - m);
        for (int64_t c = 0; c < cols; ++c) out[c] = std::exp(in[c] - m) / s;
    }
    return 0;
}
