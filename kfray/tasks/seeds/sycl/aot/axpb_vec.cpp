// y = a * x + b with sycl::vec<float, VEC> loads and stores; a scalar tail covers n % VEC.
#include <sycl/sycl.hpp>
#include <cstdint>
// @kf.param VEC in [4, 8, 16]
// @kf.param WG in [256, 64, 128, 512]

extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n, sycl::queue* queue) {
    if (n <= 0) return 0;
    using vf = sycl::vec<float, VEC>;
    const int64_t nv = (n + VEC - 1) / VEC;
    const size_t global = (size_t)((nv + WG - 1) / WG * WG);
    queue->parallel_for(sycl::nd_range<1>(global, WG), [=](sycl::nd_item<1> it) {
        const int64_t base = (int64_t)it.get_global_id(0) * VEC;
        if (base + VEC <= n) {
            const vf v = *reinterpret_cast<const vf*>(x + base);
            *reinterpret_cast<vf*>(y + base) = sycl::fma(vf(a), v, vf(b));
        } else {
            for (int64_t j = base; j < n; ++j) y[j] = sycl::fma(a, x[j], b);
        }
    });
    return 0;
}
