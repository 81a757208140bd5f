// Row softmax, one work-group per row: the WG work-items stride over the row together, so their
// loads are coalesced, and reduce_over_group combines their partial max and sum.
#include <sycl/sycl.hpp>
// @kf.param WG in [16, 32, 64, 128, 256]
// @kf.launch softmax_group global=(rows * WG) local=(WG)

namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void softmax_group(const float* x, float* y, int64_t rows, int64_t cols) {
    const auto it = syclext::this_work_item::get_nd_item<1>();
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
}
