// Row softmax, one work-item per row, three passes over the row: max, sum of exp, normalise.
#include <sycl/sycl.hpp>
// @kf.param WG in [64, 128, 256]
// @kf.launch softmax_naive global=((rows + WG - 1) // WG * WG) local=(WG)

namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void softmax_naive(const float* x, float* y, int64_t rows, int64_t cols) {
    const int64_t r = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
    if (r >= rows) return;
    const float* in = x + r * cols;
    float* out = y + r * cols;
    float m = in[0];
    for (int64_t c = 1; c < cols; ++c) m = sycl::fmax(m, in[c]);
    float s = 0.f;
    for (int64_t c = 0; c < cols; ++c) s += sycl::exp(in[c] - m);
    for (int64_t c = 0; c < cols; ++c) out[c] = sycl::exp(in[c] - m) / s;
}
