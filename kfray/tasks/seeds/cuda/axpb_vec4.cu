// y = a * x + b with 16-byte float4 loads and stores in a grid-stride loop.
// A scalar head brings x to 16-byte alignment and a scalar tail covers n % 4; when x and y are
// misaligned differently, float4 cannot serve both and a scalar grid-stride kernel runs instead.
#include <cstdint>
#include <cuda_runtime.h>
// @kf.param BLOCK in [256, 128, 512, 1024]
// @kf.param BLOCKS_PER_SM in [8, 4, 16]
#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef BLOCKS_PER_SM
#define BLOCKS_PER_SM 8
#endif

__global__ void __launch_bounds__(BLOCK) axpb_vec4_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                          float a, float b, int64_t n, int64_t head) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if (tid < head) y[tid] = fmaf(a, x[tid], b);
    const int64_t nv = (n - head) >> 2;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + head);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y + head);
    for (int64_t i = tid; i < nv; i += stride) {
        const float4 v = __ldg(x4 + i);
        float4 r;
        r.x = fmaf(a, v.x, b);
        r.y = fmaf(a, v.y, b);
        r.z = fmaf(a, v.z, b);
        r.w = fmaf(a, v.w, b);
        y4[i] = r;
    }
    const int64_t t = head + nv * 4 + tid;   // at most 3 tail elements
    if (tid < 4 && t < n) y[t] = fmaf(a, x[t], b);
}

__global__ void __launch_bounds__(BLOCK) axpb_scalar_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                            float a, float b, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = fmaf(a, x[i], b);
}

extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n, cudaStream_t stream) {
    if (n <= 0) return 0;
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 80;
    const uintptr_t ax = reinterpret_cast<uintptr_t>(x) & 15, ay = reinterpret_cast<uintptr_t>(y) & 15;
    const int64_t max_blocks = (int64_t)sms * BLOCKS_PER_SM;
    if (ax != ay) {
        int64_t blocks = (n + BLOCK - 1) / BLOCK;
        if (blocks > max_blocks) blocks = max_blocks;
        axpb_scalar_kernel<<<(unsigned)blocks, BLOCK, 0, stream>>>(x, y, a, b, n);
        return (int)cudaGetLastError();
    }
    int64_t head = (int64_t)((16 - ax) & 15) / 4;
    if (head > n) head = n;
    const int64_t nv = (n - head) / 4;
    int64_t blocks = (nv + BLOCK - 1) / BLOCK;
    if (blocks > max_blocks) blocks = max_blocks;
    if (blocks < 1) blocks = 1;                  // head and tail still need a thread
    axpb_vec4_kernel<<<(unsigned)blocks, BLOCK, 0, stream>>>(x, y, a, b, n, head);
    return (int)cudaGetLastError();
}
