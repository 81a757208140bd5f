// y = a * x + b: threads over blocks, SIMD lanes and fused multiply-add inside each block.
#include <cmath>
#include <cstdint>
// @kf.param BLOCK in [1024, 2048, 4096, 8192, 16384, 32768, 65536]

extern "C" int kf_forward(const float* __restrict x, float* __restrict y, float a, float b, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t start = 0; start < n; start += BLOCK) {
        int64_t end = start + BLOCK < n ? start + BLOCK : n;
        #pragma omp simd
        for (int64_t i = start; i < end; ++i)
            y[i] = std::fma(a, x[i], b);
    }
    return 0;
}
