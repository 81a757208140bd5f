// y = a * x + b: one element per work-item (the baseline).
// SYCL C++ free-function kernel, compiled at run time; launched as the @kf.launch line declares.
#include <sycl/sycl.hpp>
// @kf.param WG in [64, 128, 256, 512]
// @kf.launch axpb_naive global=((n + WG - 1) // WG * WG) local=(WG)

namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void axpb_naive(const float* x, float* y, float a, float b, int64_t n) {
    const int64_t i = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
    if (i < n) y[i] = a * x[i] + b;
}
