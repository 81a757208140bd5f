// Row softmax with an online (single-pass) max and sum: a running max rescales the running sum,
// so each row is read once for the statistics and once to write; blocks of rows are independent.
#include <cmath>
#include <cstdint>
// @kf.param LANES in [4, 8, 16, 32]
// @kf.param ROWS_PER_TASK in [1, 2, 4, 8, 16]

extern "C" int kf_forward(const float* __restrict x, float* __restrict y, int64_t rows, int64_t cols) {
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS_PER_TASK)
    for (int64_t r = r0; r < r0 + ROWS_PER_TASK && r < rows; ++r) {
        const float* in = x + r * cols;
        float* out = y + r * cols;
        float m[LANES], s[LANES];
        for (int l = 0; l < LANES; ++l) { m[l] = -INFINITY; s[l] = 0.f; }
        int64_t c = 0;
        for (; c + LANES <= cols; c += LANES)
            for (int l = 0; l < LANES; ++l) {
                float v = in[c + l];
                float nm = v > m[l] ? v : m[l];
                s[l] = s[l] * std::exp(m[l] - nm) + std::exp(v - nm);   // online rescale
                m[l] = nm;
            }
        float M = -INFINITY, S = 0.f;
        for (int l = 0; l < LANES; ++l) M = m[l] > M ? m[l] : M;
        for (int l = 0; l < LANES; ++l) if (s[l] > 0.f) S += s[l] * std::exp(m[l] - M);
        for (; c < cols; ++c) { float v = in[c]; float nm = v > M ? v : M; S = S * std::exp(M - nm) + std::exp(v - nm); M = nm; }
        const float inv = 1.f / S;
        for (int64_t k = 0; k < cols; ++k) out[k] = std::exp(in[k] - M) * inv;
    }
    return 0;
}
