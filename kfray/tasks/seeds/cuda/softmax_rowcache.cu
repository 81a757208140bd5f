// Row softmax in one read and one write of global memory: a group of TPR threads (a warp, or
// several warps of a block) owns a row and keeps it in registers as VPT float4 per thread, so the
// max, the sum of exponentials and the output come from registers, never from a second read.
// Warp shuffles reduce inside a warp; TPR > 32 adds one shared-memory step across the row's warps.
// TPR is picked at launch as the smallest power of two that holds the row. Rows that do not fit
// (or misaligned or cols % 4 != 0) fall back to a single-pass online softmax per warp.
#include <cstdint>
#include <cuda_runtime.h>
// @kf.param VPT in [4, 2, 8]
// @kf.param BLOCK in [256, 128, 512]
#ifndef VPT
#define VPT 4
#endif
#ifndef BLOCK
#define BLOCK 256
#endif

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

template <int TPR, int NT>
__global__ void __launch_bounds__(NT) softmax_rowcache_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                              int64_t rows, int64_t cols) {
    constexpr int RPB = NT / TPR;             // rows per block
    constexpr int WPR = TPR / 32;             // warps per row
    __shared__ float red_max[NT / 32];
    __shared__ float red_sum[NT / 32];
    const int t = threadIdx.x % TPR;
    const int warp = threadIdx.x >> 5;
    const int64_t r = (int64_t)blockIdx.x * RPB + threadIdx.x / TPR;
    const bool live = r < rows;
    const int64_t c4 = cols >> 2;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + (live ? r : 0) * cols);
    float4 v[VPT];
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        const int64_t c = t + (int64_t)j * TPR;
        if (live && c < c4) {
            v[j] = __ldcs(x4 + c);
            m = fmaxf(m, fmaxf(fmaxf(v[j].x, v[j].y), fmaxf(v[j].z, v[j].w)));
        } else {
            v[j] = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        }
    }
    m = warp_max(m);
    if (WPR > 1) {
        if ((threadIdx.x & 31) == 0) red_max[warp] = m;
        __syncthreads();
        const int w0 = (threadIdx.x / TPR) * WPR;
        m = red_max[w0];
#pragma unroll
        for (int w = 1; w < WPR; ++w) m = fmaxf(m, red_max[w0 + w]);
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        v[j].x = expf(v[j].x - m);
        v[j].y = expf(v[j].y - m);
        v[j].z = expf(v[j].z - m);
        v[j].w = expf(v[j].w - m);
        s += (v[j].x + v[j].y) + (v[j].z + v[j].w);
    }
    s = warp_sum(s);
    if (WPR > 1) {
        if ((threadIdx.x & 31) == 0) red_sum[warp] = s;
        __syncthreads();
        const int w0 = (threadIdx.x / TPR) * WPR;
        s = red_sum[w0];
#pragma unroll
        for (int w = 1; w < WPR; ++w) s += red_sum[w0 + w];
    }
    if (!live) return;
    const float inv = 1.f / s;
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y + r * cols);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        const int64_t c = t + (int64_t)j * TPR;
        if (c < c4) __stcs(y4 + c, make_float4(v[j].x * inv, v[j].y * inv, v[j].z * inv, v[j].w * inv));
    }
}

__device__ __forceinline__ void online_add(float& m, float& s, float v) {
    if (v > m) {
        s = s * expf(m - v) + 1.f;
        m = v;
    } else {
        s += expf(v - m);
    }
}

// Any shape: one warp per row, a single pass for (max, sum) merged by shuffles, then the output.
__global__ void __launch_bounds__(256) softmax_online_warp_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                                  int64_t rows, int64_t cols) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows) return;
    const float* xr = x + r * cols;
    float m = -INFINITY, s = 0.f;
    for (int64_t c = lane; c < cols; c += 32) online_add(m, s, __ldg(xr + c));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float mo = __shfl_xor_sync(0xffffffffu, m, off);
        const float so = __shfl_xor_sync(0xffffffffu, s, off);
        const float mn = fmaxf(m, mo);
        s = (m == -INFINITY ? 0.f : s * expf(m - mn)) + (mo == -INFINITY ? 0.f : so * expf(mo - mn));
        m = mn;
    }
    const float inv = 1.f / s;
    for (int64_t c = lane; c < cols; c += 32) y[r * cols + c] = expf(__ldg(xr + c) - m) * inv;
}

template <int TPR>
static void launch_rows(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
    constexpr int NT = TPR > BLOCK ? TPR : BLOCK;
    constexpr int RPB = NT / TPR;
    const int64_t blocks = (rows + RPB - 1) / RPB;
    softmax_rowcache_kernel<TPR, NT><<<(unsigned)blocks, NT, 0, stream>>>(x, y, rows, cols);
}

extern "C" int kf_forward(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return 0;
    if (rows > 0x3fffffffLL) return (int)cudaErrorInvalidValue;
    const bool aligned = (cols % 4 == 0) && ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) & 15) == 0;
    const int64_t c4 = cols >> 2;
    int tpr = 32;
    while (tpr < 1024 && (int64_t)tpr * VPT < c4) tpr <<= 1;
    if (!aligned || (int64_t)tpr * VPT < c4) {
        softmax_online_warp_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(x, y, rows, cols);
        return (int)cudaGetLastError();
    }
    switch (tpr) {
        case 32: launch_rows<32>(x, y, rows, cols, stream); break;
        case 64: launch_rows<64>(x, y, rows, cols, stream); break;
        case 128: launch_rows<128>(x, y, rows, cols, stream); break;
        case 256: launch_rows<256>(x, y, rows, cols, stream); break;
        case 512: launch_rows<512>(x, y, rows, cols, stream); break;
        default: launch_rows<1024>(x, y, rows, cols, stream); break;
    }
    return (int)cudaGetLastError();
}
