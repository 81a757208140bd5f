// y = a * x + b, one element at a time on one thread.
#include <cstdint>
// @kf.param UNROLL in [1, 2, 4, 8, 16]

extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n) {
    int64_t i = 0;
    for (; i + UNROLL <= n; i += UNROLL)
        for (int u = 0; u < UNROLL; ++u)
            y[i + u] = a * x[i + u] + b;
    for (; i < n; ++i)
        y[i] = a * x[i] + b;
    return 0;
}
