// Row softmax, one block per row: the block's threads stride over the row (coalesced), and the
// row max and the row sum are combined with tree reductions in shared memory.
#include <cstdint>
#include <cuda_runtime.h>
// @kf.param BLOCK in [256, 128, 512, 1024]
#ifndef BLOCK
#define BLOCK 256
#endif

__global__ void __launch_bounds__(BLOCK) softmax_block_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                              int64_t rows, int64_t cols) {
    __shared__ float red[BLOCK];
    const int t = threadIdx.x;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = t; c < cols; c += BLOCK) m = fmaxf(m, xr[c]);
        red[t] = m;
        __syncthreads();
        for (int s = BLOCK / 2; s > 0; s >>= 1) {
            if (t < s) red[t] = fmaxf(red[t], red[t + s]);
            __syncthreads();
        }
        m = red[0];
        __syncthreads();
        float sum = 0.f;
        for (int64_t c = t; c < cols; c += BLOCK) sum += expf(xr[c] - m);
        red[t] = sum;
        __syncthreads();
        for (int s = BLOCK / 2; s > 0; s >>= 1) {
            if (t < s) red[t] += red[t + s];
            __syncthreads();
        }
        const float inv = 1.f / red[0];
        __syncthreads();                       // red is reused by the next row
        for (int64_t c = t; c < cols; c += BLOCK) yr[c] = expf(xr[c] - m) * inv;
    }
}

extern "C" int kf_forward(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return 0;
    const int64_t blocks = rows < 0x7fffffffLL ? rows : 0x7fffffffLL;
    softmax_block_kernel<<<(unsigned)blocks, BLOCK, 0, stream>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}
