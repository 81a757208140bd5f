// Row softmax, one sub-group per row, single pass for the statistics: each lane keeps an online
// (running max, rescaled sum) pair over its strided columns, then the lanes merge their pairs with
// sub-group collectives; a second sweep writes the outputs. ROWS_PER_WG sub-groups share a work-group.
#include <sycl/sycl.hpp>
// @kf.param SG in [16, 8, 32]
// @kf.param ROWS_PER_WG in [1, 2, 4, 8]
// @kf.launch softmax_online global=((rows + ROWS_PER_WG - 1) // ROWS_PER_WG * ROWS_PER_WG * SG) local=(ROWS_PER_WG * SG)

namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<SG>))
void softmax_online(const float* x, float* y, int64_t rows, int64_t cols) {
    const auto it = syclext::this_work_item::get_nd_item<1>();
    const auto sg = it.get_sub_group();
    const int64_t r = it.get_group(0) * ROWS_PER_WG + sg.get_group_id()[0];
    if (r >= rows) return;                      // a whole sub-group leaves together
    const int lane = sg.get_local_id()[0];
    const float* in = x + r * cols;
    float* out = y + r * cols;
    float m = -std::numeric_limits<float>::infinity(), s = 0.f;
    for (int64_t c = lane; c < cols; c += SG) {  // online: a new max rescales the running sum
        const float v = in[c];
        const float nm = sycl::fmax(m, v);
        s = s * sycl::exp(m - nm) + sycl::exp(v - nm);
        m = nm;
    }
    const float M = sycl::reduce_over_group(sg, m, sycl::maximum<float>());
    const float S = sycl::reduce_over_group(sg, s * sycl::exp(m - M), sycl::plus<float>());
    const float inv = 1.f / S;
    for (int64_t c = lane; c < cols; c += SG) out[c] = sycl::exp(in[c] - M) * inv;
}
