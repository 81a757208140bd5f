// C = A @ B (row-major), one thread per output element, a BLOCK_X x BLOCK_Y block of threads per
// tile of C; each thread walks its row of A and column of B straight from global memory.
#include <cstdint>
#include <cuda_runtime.h>
// @kf.param BLOCK_X in [16, 32, 8]
// @kf.param BLOCK_Y in [16, 8, 32]
// @kf.require BLOCK_X * BLOCK_Y <= 1024
// @kf.require BLOCK_X * BLOCK_Y >= 64
#ifndef BLOCK_X
#define BLOCK_X 16
#endif
#ifndef BLOCK_Y
#define BLOCK_Y 16
#endif

__global__ void matmul_naive_kernel(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k) {
    const int64_t j = (int64_t)blockIdx.x * BLOCK_X + threadIdx.x;
    const int64_t i = (int64_t)blockIdx.y * BLOCK_Y + threadIdx.y;
    if (i >= m || j >= n) return;
    float acc = 0.f;
    for (int64_t p = 0; p < k; ++p) acc = fmaf(A[i * k + p], B[p * n + j], acc);
    C[i * n + j] = acc;
}

extern "C" int kf_forward(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return 0;
    const int64_t gx = (n + BLOCK_X - 1) / BLOCK_X, gy = (m + BLOCK_Y - 1) / BLOCK_Y;
    if (gx > 0x7fffffffLL || gy > 65535) return (int)cudaErrorInvalidValue;
    dim3 block(BLOCK_X, BLOCK_Y);
    dim3 grid((unsigned)gx, (unsigned)gy);
    matmul_naive_kernel<<<grid, block, 0, stream>>>(A, B, C, m, n, k);
    return (int)cudaGetLastError();
}
