// C = A @ B as a packed sgemm: B is packed once per BK-deep slice into NR-wide panels (zero-padded,
// contiguous along k), each thread packs MR rows of A at a time, and a register micro-kernel keeps
// an MR x NR block of C in vector registers (AVX-512: NR = 32, AVX2: NR = 16, portable: NR = 16 with
// omp simd). Threads share the B panels and take row panels (or single tiles, SCHED) as they
// come free, so a thread the OS delays costs one panel, not half the work. Edge tiles go through a local
// tile, so any m, n, k is right.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
// @kf.param MR in [12, 8, 6, 4]
// @kf.param BK in [256, 384, 128, 512]
// @kf.param SCHED in [0, 1]

#if defined(__AVX512F__)
#define NR 32
#else
#define NR 16
#endif

static inline void kf_micro(int64_t kc, const float* __restrict a, const float* __restrict b,
                            float* __restrict c, int64_t ldc, bool add) {
#if defined(__AVX512F__)
    __m512 acc0[MR], acc1[MR];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) { acc0[r] = _mm512_setzero_ps(); acc1[r] = _mm512_setzero_ps(); }
    for (int64_t p = 0; p < kc; ++p) {
        const __m512 b0 = _mm512_load_ps(b + p * NR), b1 = _mm512_load_ps(b + p * NR + 16);
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
            const __m512 av = _mm512_set1_ps(a[p * MR + r]);
            acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
            acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
        float* cr = c + r * ldc;
        if (add) {
            acc0[r] = _mm512_add_ps(acc0[r], _mm512_loadu_ps(cr));
            acc1[r] = _mm512_add_ps(acc1[r], _mm512_loadu_ps(cr + 16));
        }
        _mm512_storeu_ps(cr, acc0[r]);
        _mm512_storeu_ps(cr + 16, acc1[r]);
    }
#elif defined(__AVX2__)
    __m256 acc0[MR], acc1[MR];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) { acc0[r] = _mm256_setzero_ps(); acc1[r] = _mm256_setzero_ps(); }
    for (int64_t p = 0; p < kc; ++p) {
        const __m256 b0 = _mm256_load_ps(b + p * NR), b1 = _mm256_load_ps(b + p * NR + 8);
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
            const __m256 av = _mm256_broadcast_ss(a + p * MR + r);
            acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
            acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
        float* cr = c + r * ldc;
        if (add) {
            acc0[r] = _mm256_add_ps(acc0[r], _mm256_loadu_ps(cr));
            acc1[r] = _mm256_add_ps(acc1[r], _mm256_loadu_ps(cr + 8));
        }
        _mm256_storeu_ps(cr, acc0[r]);
        _mm256_storeu_ps(cr + 8, acc1[r]);
    }
#else
    float acc[MR][NR];
    for (int r = 0; r < MR; ++r)
        for (int j = 0; j < NR; ++j) acc[r][j] = add ? c[r * ldc + j] : 0.f;
    for (int64_t p = 0; p < kc; ++p)
        for (int r = 0; r < MR; ++r) {
            const float av = a[p * MR + r];
            #pragma omp simd
            for (int j = 0; j < NR; ++j) acc[r][j] += av * b[p * NR + j];
        }
    for (int r = 0; r < MR; ++r)
        for (int j = 0; j < NR; ++j) c[r * ldc + j] = acc[r][j];
#endif
}

static float* kf_grow(float** buf, size_t* cap, size_t floats) {
    if (*cap < floats) {
        std::free(*buf);
        *buf = static_cast<float*>(std::aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64));
        *cap = *buf ? floats : 0;
    }
    return *buf;
}

extern "C" int kf_forward(const float* __restrict A, const float* __restrict B, float* __restrict C,
                          int64_t m, int64_t n, int64_t k) {
    if (m <= 0 || n <= 0) return 0;
    if (k <= 0) { for (int64_t i = 0; i < m; ++i) std::memset(C + i * n, 0, n * sizeof(float)); return 0; }
    static float* bbuf = nullptr;
    static size_t bcap = 0;
    const int64_t npan = (n + NR - 1) / NR, mpan = (m + MR - 1) / MR;
    const int64_t kcmax = k < BK ? k : BK;
    float* bp = kf_grow(&bbuf, &bcap, (size_t)(npan * NR * kcmax));
    if (!bp) return 1;
    for (int64_t pc = 0; pc < k; pc += BK) {
        const int64_t kc = k - pc < BK ? k - pc : BK;
        #pragma omp parallel
        {
            #pragma omp for schedule(static)
            for (int64_t jp = 0; jp < npan; ++jp) {           // pack B[pc:pc+kc, jp*NR:+NR]
                float* dst = bp + jp * NR * kc;
                const int64_t j0 = jp * NR, w = n - j0 < NR ? n - j0 : NR;
                for (int64_t p = 0; p < kc; ++p) {
                    const float* src = B + (pc + p) * n + j0;
                    for (int64_t j = 0; j < w; ++j) dst[p * NR + j] = src[j];
                    for (int64_t j = w; j < NR; ++j) dst[p * NR + j] = 0.f;
                }
            }
            float ap[MR * BK] __attribute__((aligned(64)));
            float tile[MR * NR] __attribute__((aligned(64)));
            #pragma omp for schedule(dynamic) nowait
            for (int64_t ipj = 0; ipj < mpan * (SCHED ? npan : 1); ++ipj) {
                const int64_t ip = SCHED ? ipj / npan : ipj;
                const int64_t i0 = ip * MR, h = m - i0 < MR ? m - i0 : MR;
                for (int64_t p = 0; p < kc; ++p) {          // pack A[i0:i0+MR, pc:pc+kc], MR-interleaved
                    for (int64_t r = 0; r < h; ++r) ap[p * MR + r] = A[(i0 + r) * k + pc + p];
                    for (int64_t r = h; r < MR; ++r) ap[p * MR + r] = 0.f;
                }
                const int64_t jlo = SCHED ? ipj % npan : 0, jhi = SCHED ? jlo + 1 : npan;
                for (int64_t jp = jlo; jp < jhi; ++jp) {
                    const int64_t j0 = jp * NR, w = n - j0 < NR ? n - j0 : NR;
                    if (h == MR && w == NR) {
                        kf_micro(kc, ap, bp + jp * NR * kc, C + i0 * n + j0, n, pc > 0);
                    } else {                                  // edge tile: through a local tile
                        for (int64_t r = 0; r < h; ++r)
                            for (int64_t j = 0; j < w; ++j) tile[r * NR + j] = pc > 0 ? C[(i0 + r) * n + j0 + j] : 0.f;
                        kf_micro(kc, ap, bp + jp * NR * kc, tile, NR, true);
                        for (int64_t r = 0; r < h; ++r)
                            for (int64_t j = 0; j < w; ++j) C[(i0 + r) * n + j0 + j] = tile[r * NR + j];
                    }
                }
            }
        }
    }
    return 0;
}
