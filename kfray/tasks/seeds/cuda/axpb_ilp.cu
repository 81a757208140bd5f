// y = a * x + b, UNROLL elements per thread: all loads first, then all FMAs and stores, so each
// thread keeps UNROLL independent memory requests in flight. Element j of a thread sits BLOCK
// apart from element j-1, so every load and store of a warp stays coalesced.
#include <cstdint>
#include <cuda_runtime.h>
// @kf.param UNROLL in [4, 2, 8, 16]
// @kf.param BLOCK in [256, 128, 512]
// @kf.require BLOCK * UNROLL <= 8192
#ifndef UNROLL
#define UNROLL 4
#endif
#ifndef BLOCK
#define BLOCK 256
#endif

__global__ void __launch_bounds__(BLOCK) axpb_ilp_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                         float a, float b, int64_t n) {
    const int64_t base = (int64_t)blockIdx.x * (BLOCK * UNROLL) + threadIdx.x;
    float v[UNROLL];
    if (base + (int64_t)(UNROLL - 1) * BLOCK < n) {          // full tile: no bounds checks
#pragma unroll
        for (int j = 0; j < UNROLL; ++j) v[j] = __ldg(x + base + (int64_t)j * BLOCK);
#pragma unroll
        for (int j = 0; j < UNROLL; ++j) y[base + (int64_t)j * BLOCK] = fmaf(a, v[j], b);
    } else {
#pragma unroll
        for (int j = 0; j < UNROLL; ++j) {
            const int64_t i = base + (int64_t)j * BLOCK;
            v[j] = i < n ? __ldg(x + i) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < UNROLL; ++j) {
            const int64_t i = base + (int64_t)j * BLOCK;
            if (i < n) y[i] = fmaf(a, v[j], b);
        }
    }
}

extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n, cudaStream_t stream) {
    if (n <= 0) return 0;
    const int64_t per_block = (int64_t)BLOCK * UNROLL;
    const int64_t blocks = (n + per_block - 1) / per_block;
    if (blocks > 0x7fffffffLL) return (int)cudaErrorInvalidValue;
    axpb_ilp_kernel<<<(unsigned)blocks, BLOCK, 0, stream>>>(x, y, a, b, n);
    return (int)cudaGetLastError();
}
