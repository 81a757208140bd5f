// C = A @ B (row-major) as a register-tiled, double-buffered SGEMM: a block of (BM/8) x (BN/8)
// threads computes a BM x BN tile of C, each thread an 8 x 8 micro-tile held in registers as two
// 4 x 4 quarters half a tile apart (so shared reads are conflict-free float4 loads). BK-deep panels
// of A (stored transposed) and B are read with float4 loads into registers while the block
// computes on the other shared-memory buffer, then stored: one barrier per panel.
// Shapes that are not multiples of the tiles (or misaligned) take a plain shared-tile kernel.
#include <cstdint>
#include <cuda_runtime.h>
// @kf.param BM in [128, 64]
// @kf.param BN in [128, 64]
// @kf.param BK in [8, 16]
// @kf.param MINB in [2, 1]
// @kf.require (BM // 8) * (BN // 8) >= 64
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 8
#endif
#ifndef MINB
#define MINB 2
#endif
#define TX (BN / 8)
#define TY (BM / 8)
#define NT (TX * TY)
#define A_LOADS (BM * BK / 4 / NT)
#define B_LOADS (BK * BN / 4 / NT)

__global__ void __launch_bounds__(NT, MINB) matmul_sgemm_kernel(const float* __restrict__ A,
                                                                const float* __restrict__ B,
                                                                float* __restrict__ C,
                                                                int64_t m, int64_t n, int64_t k) {
    __shared__ __align__(16) float As[2][BK][BM];     // A panel, transposed: As[buf][p][i]
    __shared__ __align__(16) float Bs[2][BK][BN];
    const int tid = threadIdx.x;
    const int tx = tid % TX, ty = tid / TX;
    const int64_t row0 = (int64_t)blockIdx.y * BM, col0 = (int64_t)blockIdx.x * BN;
    const float* Ab = A + row0 * k;
    const float* Bb = B + col0;
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
    float4 ra[A_LOADS], rb[B_LOADS];

    // panel 0: global -> registers -> shared buffer 0
#pragma unroll
    for (int l = 0; l < A_LOADS; ++l) {
        const int e = tid + l * NT, r = e / (BK / 4), c = (e % (BK / 4)) * 4;
        ra[l] = __ldg(reinterpret_cast<const float4*>(Ab + (int64_t)r * k + c));
    }
#pragma unroll
    for (int l = 0; l < B_LOADS; ++l) {
        const int e = tid + l * NT, r = e / (BN / 4), c = (e % (BN / 4)) * 4;
        rb[l] = __ldg(reinterpret_cast<const float4*>(Bb + (int64_t)r * n + c));
    }
#pragma unroll
    for (int l = 0; l < A_LOADS; ++l) {
        const int e = tid + l * NT, r = e / (BK / 4), c = (e % (BK / 4)) * 4;
        As[0][c + 0][r] = ra[l].x;
        As[0][c + 1][r] = ra[l].y;
        As[0][c + 2][r] = ra[l].z;
        As[0][c + 3][r] = ra[l].w;
    }
#pragma unroll
    for (int l = 0; l < B_LOADS; ++l) {
        const int e = tid + l * NT, r = e / (BN / 4), c = (e % (BN / 4)) * 4;
        *reinterpret_cast<float4*>(&Bs[0][r][c]) = rb[l];
    }
    __syncthreads();

    int cur = 0;
    for (int64_t k0 = 0; k0 < k; k0 += BK) {
        const bool more = k0 + BK < k;
        if (more) {                               // next panel in flight while this one is used
#pragma unroll
            for (int l = 0; l < A_LOADS; ++l) {
                const int e = tid + l * NT, r = e / (BK / 4), c = (e % (BK / 4)) * 4;
                ra[l] = __ldg(reinterpret_cast<const float4*>(Ab + (int64_t)r * k + k0 + BK + c));
            }
#pragma unroll
            for (int l = 0; l < B_LOADS; ++l) {
                const int e = tid + l * NT, r = e / (BN / 4), c = (e % (BN / 4)) * 4;
                rb[l] = __ldg(reinterpret_cast<const float4*>(Bb + (k0 + BK + r) * n + c));
            }
        }
#pragma unroll
        for (int p = 0; p < BK; ++p) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[cur][p][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[cur][p][BM / 2 + ty * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[cur][p][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[cur][p][BN / 2 + tx * 4]);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) {                               // the other buffer: nobody reads it now
            const int nxt = cur ^ 1;
#pragma unroll
            for (int l = 0; l < A_LOADS; ++l) {
                const int e = tid + l * NT, r = e / (BK / 4), c = (e % (BK / 4)) * 4;
                As[nxt][c + 0][r] = ra[l].x;
                As[nxt][c + 1][r] = ra[l].y;
                As[nxt][c + 2][r] = ra[l].z;
                As[nxt][c + 3][r] = ra[l].w;
            }
#pragma unroll
            for (int l = 0; l < B_LOADS; ++l) {
                const int e = tid + l * NT, r = e / (BN / 4), c = (e % (BN / 4)) * 4;
                *reinterpret_cast<float4*>(&Bs[nxt][r][c]) = rb[l];
            }
            cur = nxt;
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int64_t r = row0 + (i < 4 ? ty * 4 + i : BM / 2 + ty * 4 + (i - 4));
        float* cr = C + r * n + col0;
        *reinterpret_cast<float4*>(cr + tx * 4) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        *reinterpret_cast<float4*>(cr + BN / 2 + tx * 4) = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
    }
}

// Any shape: 16 x 16 shared tiles, zero-filled outside the matrices.
__global__ void __launch_bounds__(256) matmul_any_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                                         float* __restrict__ C, int64_t m, int64_t n, int64_t k) {
    __shared__ float Ts[16][16];
    __shared__ float Us[16][17];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int64_t row = (int64_t)blockIdx.y * 16 + ty, col = (int64_t)blockIdx.x * 16 + tx;
    float acc = 0.f;
    for (int64_t k0 = 0; k0 < k; k0 += 16) {
        Ts[ty][tx] = (row < m && k0 + tx < k) ? A[row * k + k0 + tx] : 0.f;
        Us[ty][tx] = (k0 + ty < k && col < n) ? B[(k0 + ty) * n + col] : 0.f;
        __syncthreads();
#pragma unroll
        for (int p = 0; p < 16; ++p) acc = fmaf(Ts[ty][p], Us[p][tx], acc);
        __syncthreads();
    }
    if (row < m && col < n) C[row * n + col] = acc;
}

extern "C" int kf_forward(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return 0;
    const bool aligned = ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B) |
                           reinterpret_cast<uintptr_t>(C)) & 15) == 0;
    if (aligned && k > 0 && m % BM == 0 && n % BN == 0 && k % BK == 0 && m / BM <= 65535) {
        dim3 grid((unsigned)(n / BN), (unsigned)(m / BM));
        matmul_sgemm_kernel<<<grid, NT, 0, stream>>>(A, B, C, m, n, k);
        return (int)cudaGetLastError();
    }
    const int64_t gx = (n + 15) / 16, gy = (m + 15) / 16;
    if (gx > 0x7fffffffLL || gy > 65535) return (int)cudaErrorInvalidValue;
    matmul_any_kernel<<<dim3((unsigned)gx, (unsigned)gy), 256, 0, stream>>>(A, B, C, m, n, k);
    return (int)cudaGetLastError();
}
