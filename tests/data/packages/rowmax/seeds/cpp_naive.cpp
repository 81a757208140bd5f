// Row maximum, one row after another.
#include <cstdint>
// @kf.param UNROLL in [1, 4]

extern "C" int kf_forward(const float* x, float* m, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = x + r * cols;
        float best = row[0];
        int64_t c = 1;
        for (; c + UNROLL <= cols; c += UNROLL)
            for (int u = 0; u < UNROLL; ++u)
                best = row[c + u] > best ? row[c + u] : best;
        for (; c < cols; ++c)
            best = row[c] > best ? row[c] : best;
        m[r] = best;
    }
    return 0;
}
