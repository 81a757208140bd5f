// Row softmax, one work-group per row; work-items stride over the row and reduce_over_group
// combines their partial max and sum (whole program).
#include <sycl/sycl.hpp>
#include <cstdint>
#include <limits>
// @kf.param WG in [64, 32, 128, 256]

extern "C" int kf_forward(const float* x, float* y, int64_t rows, int64_t cols, sycl::queue* queue) {
    if (rows <= 0 || cols <= 0) return 0;
    queue->parallel_for(sycl::nd_range<1>((size_t)rows * WG, WG), [=](sycl::nd_item<1> it) {
        const auto g = it.get_group();
        const int64_t r = it.get_group(0);
        const int64_t lid = it.get_local_id(0);
        const float* in = x + r * cols;
        float* out = y + r * cols;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t c = lid; c < cols; c += WG) m = sycl::fmax(m, in[c]);
        m = sycl::reduce_over_group(g, m, sycl::maximum<float>());
        float s = 0.f;
        for (int64_t c = lid; c < cols; c += WG) s += sycl::exp(in[c] - m);
        s = sycl::reduce_over_group(g, s, sycl::plus<float>());
        const float inv = 1.f / s;
        for (int64_t c = lid; c < cols; c += WG) out[c] = sycl::exp(in[c] - m) * inv;
    });
    return 0;
}
