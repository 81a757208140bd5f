// y = a * x + b with fewer, longer work-items: each handles ITEMS elements spaced one global size
// apart, so neighbouring work-items still touch neighbouring floats (coalesced) while the launch
// shrinks ITEMS-fold (less scheduling work per element).
#include <sycl/sycl.hpp>
// @kf.param ITEMS in [4, 8, 16, 32]
// @kf.param WG in [64, 128, 256, 512]
// @kf.launch axpb_stride global=((n + ITEMS * WG - 1) // (ITEMS * WG) * WG) local=(WG)

namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void axpb_stride(const float* x, float* y, float a, float b, int64_t n) {
    const auto it = syclext::this_work_item::get_nd_item<1>();
    const int64_t stride = it.get_global_range(0);
    int64_t i = it.get_global_id(0);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k, i += stride)
        if (i < n) y[i] = sycl::fma(a, x[i], b);
}
