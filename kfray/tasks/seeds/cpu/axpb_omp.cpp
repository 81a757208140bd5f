// y = a * x + b, split across OpenMP threads in static chunks.
#include <cstdint>
// @kf.param CHUNK in [256, 1024, 4096, 16384, 65536, 262144]

extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n) {
    #pragma omp parallel for schedule(static, CHUNK)
    for (int64_t i = 0; i < n; ++i)
        y[i] = a * x[i] + b;
    return 0;
}
