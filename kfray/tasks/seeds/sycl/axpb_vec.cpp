// y = a * x + b with sycl::vec loads: each work-item handles VEC consecutive floats as one vector
// (USM allocations are aligned, so x + VEC*i is too); a scalar tail covers n % VEC.
#include <sycl/sycl.hpp>
// @kf.param VEC in [4, 8, 16]
// @kf.param WG in [64, 128, 256, 512]
// @kf.launch axpb_vec global=(((n + VEC - 1) // VEC + WG - 1) // WG * WG) local=(WG)

namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void axpb_vec(const float* x, float* y, float a, float b, int64_t n) {
    using vf = sycl::vec<float, VEC>;
    const int64_t i = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
    const int64_t base = i * VEC;
    if (base + VEC <= n) {
        const vf v = *reinterpret_cast<const vf*>(x + base);
        *reinterpret_cast<vf*>(y + base) = sycl::fma(vf(a), v, vf(b));
    } else {
        for (int64_t j = base; j < n; ++j) y[j] = sycl::fma(a, x[j], b);
    }
}
