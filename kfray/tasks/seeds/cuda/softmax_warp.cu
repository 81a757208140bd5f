// Row softmax, one warp per row, WARPS rows per block. One streaming pass keeps an online
// (max, sum) pair per lane (the sum is rescaled whenever the max grows); warp shuffles merge the
// lanes' pairs; a second pass writes exp(x - max) / sum. Rows move as float4 when cols % 4 == 0
// and both pointers are 16-byte aligned.
#include <cstdint>
#include <cuda_runtime.h>
// @kf.param WARPS in [4, 8, 2, 16]
#ifndef WARPS
#define WARPS 4
#endif

__device__ __forceinline__ void online_add(float& m, float& s, float v) {
    if (v > m) {
        s = s * expf(m - v) + 1.f;       // expf(-inf) == 0 when m was still -inf
        m = v;
    } else {
        s += expf(v - m);
    }
}

__device__ __forceinline__ void warp_merge(float& m, float& s) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float mo = __shfl_xor_sync(0xffffffffu, m, off);
        const float so = __shfl_xor_sync(0xffffffffu, s, off);
        const float mn = fmaxf(m, mo);
        const float a = (m == -INFINITY) ? 0.f : s * expf(m - mn);
        const float b = (mo == -INFINITY) ? 0.f : so * expf(mo - mn);
        m = mn;
        s = a + b;
    }
}

template <bool VEC>
__global__ void __launch_bounds__(WARPS * 32) softmax_warp_kernel(const float* __restrict__ x,
                                                                  float* __restrict__ y,
                                                                  int64_t rows, int64_t cols) {
    const int lane = threadIdx.x & 31;
    const int64_t warps_total = (int64_t)gridDim.x * WARPS;
    for (int64_t r = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5); r < rows; r += warps_total) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = -INFINITY, s = 0.f;
        if (VEC) {
            const float4* x4 = reinterpret_cast<const float4*>(xr);
            const int64_t c4 = cols >> 2;
            for (int64_t c = lane; c < c4; c += 32) {
                const float4 v = __ldg(x4 + c);
                online_add(m, s, v.x);
                online_add(m, s, v.y);
                online_add(m, s, v.z);
                online_add(m, s, v.w);
            }
        } else {
            for (int64_t c = lane; c < cols; c += 32) online_add(m, s, __ldg(xr + c));
        }
        warp_merge(m, s);
        const float inv = 1.f / s;
        if (VEC) {
            const float4* x4 = reinterpret_cast<const float4*>(xr);
            float4* y4 = reinterpret_cast<float4*>(yr);
            const int64_t c4 = cols >> 2;
            for (int64_t c = lane; c < c4; c += 32) {
                const float4 v = __ldg(x4 + c);
                float4 o;
                o.x = expf(v.x - m) * inv;
                o.y = expf(v.y - m) * inv;
                o.z = expf(v.z - m) * inv;
                o.w = expf(v.w - m) * inv;
                y4[c] = o;
            }
        } else {
            for (int64_t c = lane; c < cols; c += 32) yr[c] = expf(__ldg(xr + c) - m) * inv;
        }
    }
}

extern "C" int kf_forward(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return 0;
    int64_t blocks = (rows + WARPS - 1) / WARPS;
    if (blocks > 0x7fffffffLL) blocks = 0x7fffffffLL;
    const bool vec = (cols % 4 == 0) && ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) & 15) == 0;
    if (vec)
        softmax_warp_kernel<true><<<(unsigned)blocks, WARPS * 32, 0, stream>>>(x, y, rows, cols);
    else
        softmax_warp_kernel<false><<<(unsigned)blocks, WARPS * 32, 0, stream>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}
