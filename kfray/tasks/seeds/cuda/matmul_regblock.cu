// C = A @ B (row-major): a block computes a BM x BN tile of C, staging BK-deep panels of A
// (transposed) and B in shared memory; each thread accumulates a TM x TN register block, reading
// TM values of A and TN of B from shared memory per step for TM * TN FMAs. A thread's rows and
// columns are strided by the thread grid, so shared reads avoid bank conflicts and stores coalesce.
#include <cstdint>
#include <cuda_runtime.h>
// @kf.param BM in [64, 128, 32]
// @kf.param BN in [64, 128, 32]
// @kf.param BK in [16, 8, 32]
// @kf.param TM in [4, 8, 2]
// @kf.param TN in [4, 8, 2]
// @kf.require BM % TM == 0 and BN % TN == 0
// @kf.require (BM // TM) * (BN // TN) >= 64 and (BM // TM) * (BN // TN) <= 1024
// @kf.require (BM + BN) * BK * 4 <= 49152
#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 64
#endif
#ifndef BK
#define BK 16
#endif
#ifndef TM
#define TM 4
#endif
#ifndef TN
#define TN 4
#endif
#define THREADS_M (BM / TM)
#define THREADS_N (BN / TN)
#define NT (THREADS_M * THREADS_N)

__global__ void __launch_bounds__(NT) matmul_regblock_kernel(const float* __restrict__ A,
                                                             const float* __restrict__ B,
                                                             float* __restrict__ C,
                                                             int64_t m, int64_t n, int64_t k) {
    __shared__ float As[BK][BM];          // A panel, transposed: As[p][i]
    __shared__ float Bs[BK][BN];
    const int tid = threadIdx.x;
    const int tx = tid % THREADS_N;       // column group
    const int ty = tid / THREADS_N;       // row group
    const int64_t row0 = (int64_t)blockIdx.y * BM;
    const int64_t col0 = (int64_t)blockIdx.x * BN;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
    float ra[TM], rb[TN];
    for (int64_t k0 = 0; k0 < k; k0 += BK) {
        for (int e = tid; e < BM * BK; e += NT) {
            const int r = e / BK, c = e % BK;
            const int64_t gr = row0 + r, gc = k0 + c;
            As[c][r] = (gr < m && gc < k) ? A[gr * k + gc] : 0.f;
        }
        for (int e = tid; e < BK * BN; e += NT) {
            const int r = e / BN, c = e % BN;
            const int64_t gr = k0 + r, gc = col0 + c;
            Bs[r][c] = (gr < k && gc < n) ? B[gr * n + gc] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int p = 0; p < BK; ++p) {
#pragma unroll
            for (int i = 0; i < TM; ++i) ra[i] = As[p][ty + i * THREADS_M];
#pragma unroll
            for (int j = 0; j < TN; ++j) rb[j] = Bs[p][tx + j * THREADS_N];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int64_t r = row0 + ty + i * THREADS_M;
        if (r >= m) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int64_t c = col0 + tx + j * THREADS_N;
            if (c < n) C[r * n + c] = acc[i][j];
        }
    }
}

extern "C" int kf_forward(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return 0;
    const int64_t gx = (n + BN - 1) / BN, gy = (m + BM - 1) / BM;
    if (gx > 0x7fffffffLL || gy > 65535) return (int)cudaErrorInvalidValue;
    dim3 grid((unsigned)gx, (unsigned)gy);
    matmul_regblock_kernel<<<grid, NT, 0, stream>>>(A, B, C, m, n, k);
    return (int)cudaGetLastError();
}
