// Row softmax, one thread per row, three passes over the row: max, sum of exp, normalise.
// Simple and correct for any shape, but neighbouring threads read addresses a row apart.
#include <cstdint>
#include <cuda_runtime.h>
// @kf.param BLOCK in [128, 64, 256]
#ifndef BLOCK
#define BLOCK 128
#endif

__global__ void softmax_naive_kernel(const float* x, float* y, int64_t rows, int64_t cols) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float m = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
    float s = 0.f;
    for (int64_t c = 0; c < cols; ++c) s += expf(xr[c] - m);
    const float inv = 1.f / s;
    for (int64_t c = 0; c < cols; ++c) yr[c] = expf(xr[c] - m) * inv;
}

extern "C" int kf_forward(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return 0;
    const int64_t blocks = (rows + BLOCK - 1) / BLOCK;
    softmax_naive_kernel<<<(unsigned)blocks, BLOCK, 0, stream>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}
