// y = alpha * x, one element at a time.
#include <cstdint>
// @kf.param UNROLL in [1, 2, 4, 8]

extern "C" int kf_forward(const float* x, float* y, float alpha, int64_t n) {
    int64_t i = 0;
    // KF-EVOLVE-BEGIN
    for (; i + UNROLL <= n; i += UNROLL)
        for (int u = 0; u < UNROLL; ++u)
            y[i + u] = alpha * x[i + u];
    // KF-EVOLVE-END
    for (; i < n; ++i)
        y[i] = alpha * x[i];
    return 0;
}
