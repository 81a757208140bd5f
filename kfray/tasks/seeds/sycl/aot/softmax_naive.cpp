// Row softmax, one work-item per row, three passes: max, sum of exp, normalise (whole program).
#include <sycl/sycl.hpp>
#include <cstdint>
// @kf.param WG in [64, 128, 256]

extern "C" int kf_forward(const float* x, float* y, int64_t rows, int64_t cols, sycl::queue* queue) {
    if (rows <= 0 || cols <= 0) return 0;
    const size_t global = (size_t)((rows + WG - 1) / WG * WG);
    queue->parallel_for(sycl::nd_range<1>(global, WG), [=](sycl::nd_item<1> it) {
        const int64_t r = it.get_global_id(0);
        if (r >= rows) return;
        const float* in = x + r * cols;
        float* out = y + r * cols;
        float m = in[0];
        for (int64_t c = 1; c < cols; ++c) m = sycl::fmax(m, in[c]);
        float s = 0.f;
        for (int64_t c = 0; c < cols; ++c) s += sycl::exp(in[c] - m);
        for (int64_t c = 0; c < cols; ++c) out[c] = sycl::exp(in[c] - m) / s;
    });
    return 0;
}
