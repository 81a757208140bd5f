// Wrong on purpose: doubles instead of squaring.
#include <cstdint>
// @kf.param UNROLL in [1, 2]

extern "C" int kf_forward(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        y[i] = x[i] + x[i];
    return 0;
}
