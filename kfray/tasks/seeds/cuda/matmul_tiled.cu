// C = A @ B (row-major) with TILE x TILE shared-memory tiles: a block stages one tile of A and one
// of B per step (zero-filled outside the matrices), then every thread reuses them TILE times.
#include <cstdint>
#include <cuda_runtime.h>
// @kf.param TILE in [16, 32, 8]
#ifndef TILE
#define TILE 16
#endif

__global__ void __launch_bounds__(TILE * TILE) matmul_tiled_kernel(const float* __restrict__ A,
                                                                   const float* __restrict__ B,
                                                                   float* __restrict__ C,
                                                                   int64_t m, int64_t n, int64_t k) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t row = (int64_t)blockIdx.y * TILE + ty;
    const int64_t col = (int64_t)blockIdx.x * TILE + tx;
    float acc = 0.f;
    for (int64_t k0 = 0; k0 < k; k0 += TILE) {
        As[ty][tx] = (row < m && k0 + tx < k) ? A[row * k + k0 + tx] : 0.f;
        Bs[ty][tx] = (k0 + ty < k && col < n) ? B[(k0 + ty) * n + col] : 0.f;
        __syncthreads();
#pragma unroll
        for (int p = 0; p < TILE; ++p) acc = fmaf(As[ty][p], Bs[p][tx], acc);
        __syncthreads();
    }
    if (row < m && col < n) C[row * n + col] = acc;
}

extern "C" int kf_forward(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return 0;
    const int64_t gx = (n + TILE - 1) / TILE, gy = (m + TILE - 1) / TILE;
    if (gx > 0x7fffffffLL || gy > 65535) return (int)cudaErrorInvalidValue;
    dim3 block(TILE, TILE);
    dim3 grid((unsigned)gx, (unsigned)gy);
    matmul_tiled_kernel<<<grid, block, 0, stream>>>(A, B, C, m, n, k);
    return (int)cudaGetLastError();
}
