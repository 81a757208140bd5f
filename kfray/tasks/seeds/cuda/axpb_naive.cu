// y = a * x + b: one element per thread, one block of BLOCK threads per BLOCK elements.
#include <cstdint>
#include <cuda_runtime.h>
// @kf.param BLOCK in [256, 128, 512, 1024]
#ifndef BLOCK
#define BLOCK 256
#endif

__global__ void axpb_naive_kernel(const float* x, float* y, float a, float b, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n, cudaStream_t stream) {
    if (n <= 0) return 0;
    const int64_t blocks = (n + BLOCK - 1) / BLOCK;
    if (blocks > 0x7fffffffLL) return (int)cudaErrorInvalidValue;
    axpb_naive_kernel<<<(unsigned)blocks, BLOCK, 0, stream>>>(x, y, a, b, n);
    return (int)cudaGetLastError();
}
