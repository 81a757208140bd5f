// C = A @ B as a BLIS-style packed sgemm (A: m x k, B: k x n, C: m x n, fp32, row-major).
//
// Why this shape (tuned on a 2-core AMD EPYC, Zen 3: AVX2 with 2 FMA pipes of 4-cycle latency,
// 16 ymm registers, L1d 32 KiB and L2 512 KiB per core, L3 32 MiB):
// - Register micro-kernel: an MR x NR block of C stays in registers for a whole k block; each k step
//   loads NR floats of packed B and broadcasts MR floats of A. AVX2 6 x 16 = 12 accumulators (+2 B,
//   +1 broadcast = 15 of 16 ymm) covers the FMA latency (8 independent chains needed) with 12 FMAs
//   per 8 loads, so the FMA pipes set the pace (~95% of peak with data in cache). On AVX2, MR 8
//   and 12 use NR 8 (no register spills); AVX-512 uses NR 32; a portable omp simd kernel otherwise.
// - Cache blocking: B is packed per BK x BN block (default 256 x 384 floats = 384 KiB, in L2) into
//   NR-wide panels, contiguous along k (aligned loads, one 64-byte line per k step; a panel is
//   16 KiB, half of L1). Each MR-row panel of A streams past the whole block. By default A is not
//   packed (PACKA 0): its MR rows are read in place (6 x 256 floats = 6 KiB, held in L1 across the
//   block's B panels); at these sizes packing A cost more than it saved. PACKA 1 packs it.
// - Balanced blocks: k and n are cut into equal blocks of at most BK and BN (k = 300: 2 x 150).
// - No barrier for packing: each B panel has a flag. The first thread that needs a panel claims it
//   and packs it (FUSE 1: runs the micro-kernel straight from B's rows, storing them packed as it
//   goes); a thread that finds it claimed but not finished reads B's rows in place instead of
//   waiting; after that every use reads the packed panel. Threads start at different panels, so
//   on 2 threads each packs half of B.
// - Threads (OpenMP) take MR-row panels of A as they come free (schedule(dynamic)); the last two
//   panels per thread are cut into column pieces so the threads finish together. A thread the OS
//   delays costs about one panel of work, not a static share. The team is capped at the processors
//   OpenMP sees (threads beyond the cores would only wait for each other) and is 1 for tiny products.
// - Edges: a panel of h < MR rows runs the kernel of exactly h rows; B panels narrower than NR are
//   zero-padded and their tile goes through a local buffer, so any m, n, k (even 1) is right.
// - Prefetch: while an A panel computes, the next one is prefetched into L2, a share of its lines per
//   B panel; packing B prefetches the row 16 ahead (B's rows are 4n bytes apart, a stride the
//   hardware prefetcher follows late). With inputs fresh from memory, as the harness's rotated sets
//   are, this took one thread from 0.87-0.93x OpenBLAS to 0.93-0.97x.
// - Memory: the packed B block and flags belong to the calling thread (thread_local, grown as
//   needed, freed at thread exit); no result or input is remembered from one call to the next.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
// @kf.param MR in [6, 4, 8, 12]
// @kf.param BK in [256, 384, 128, 512]
// @kf.param BN in [384, 256, 768, 2048]
// @kf.param PACKA in [0, 1]
// @kf.param FUSE in [0, 1]

#if defined(__AVX512F__)
#define NR 32
#elif defined(__AVX2__)
#define NR (MR <= 6 ? 16 : 8)
#else
#define NR 16
#endif

// c[0:R, 0:NR] (=, or += when add) sum over p < kc of a[r * lda + p * sa] * b[p * ldb + j].
// MODE 0: b is a packed panel (ldb = NR). MODE 1: b points into B's rows (ldb = n).
// MODE 2: as 1, and each row slice read is also stored into the packed panel bp.
template <int R, int MODE>
static inline void kf_micro(int64_t kc, const float* __restrict a, int64_t lda, int64_t sa,
                            const float* __restrict b, int64_t ldb, float* __restrict bp,
                            float* __restrict c, int64_t ldc, bool add) {
    const int64_t sb = MODE == 0 ? NR : ldb;
#if defined(__AVX512F__)
    constexpr int NV = NR / 16;
    __m512 acc[R][NV];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    #pragma GCC unroll 2
    for (int64_t p = 0; p < kc; ++p) {
        __m512 bv[NV];
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            bv[v] = MODE == 0 ? _mm512_load_ps(b + p * sb + 16 * v) : _mm512_loadu_ps(b + p * sb + 16 * v);
            if (MODE == 2) _mm512_store_ps(bp + p * NR + 16 * v, bv[v]);
        }
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const __m512 av = _mm512_set1_ps(a[r * lda + p * sa]);
            #pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            float* cr = c + r * ldc + 16 * v;
            _mm512_storeu_ps(cr, add ? _mm512_add_ps(acc[r][v], _mm512_loadu_ps(cr)) : acc[r][v]);
        }
#elif defined(__AVX2__)
    constexpr int NV = NR / 8;
    __m256 acc[R][NV];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
    #pragma GCC unroll 4
    for (int64_t p = 0; p < kc; ++p) {
        __m256 bv[NV];
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            bv[v] = MODE == 0 ? _mm256_load_ps(b + p * sb + 8 * v) : _mm256_loadu_ps(b + p * sb + 8 * v);
            if (MODE == 2) _mm256_store_ps(bp + p * NR + 8 * v, bv[v]);
        }
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const __m256 av = _mm256_broadcast_ss(a + r * lda + p * sa);
            #pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            float* cr = c + r * ldc + 8 * v;
            _mm256_storeu_ps(cr, add ? _mm256_add_ps(acc[r][v], _mm256_loadu_ps(cr)) : acc[r][v]);
        }
#else
    float acc[R][NR];
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < NR; ++j) acc[r][j] = 0.f;
    for (int64_t p = 0; p < kc; ++p) {
        const float* bk = b + p * sb;
        if (MODE == 2)
            for (int j = 0; j < NR; ++j) bp[p * NR + j] = bk[j];
        for (int r = 0; r < R; ++r) {
            const float av = a[r * lda + p * sa];
            #pragma omp simd
            for (int j = 0; j < NR; ++j) acc[r][j] += av * bk[j];
        }
    }
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < NR; ++j) c[r * ldc + j] = add ? c[r * ldc + j] + acc[r][j] : acc[r][j];
#endif
}

// A panel of h <= R rows against a packed B panel: the kernel of exactly h rows.
template <int R>
static inline void kf_rows(int64_t h, int64_t kc, const float* a, int64_t lda, int64_t sa, const float* b,
                           float* c, int64_t ldc, bool add) {
    if constexpr (R > 1) {
        if (h < R) { kf_rows<R - 1>(h, kc, a, lda, sa, b, c, ldc, add); return; }
    }
    kf_micro<R, 0>(kc, a, lda, sa, b, NR, nullptr, c, ldc, add);
}

// B[0:kc, 0:w] (row stride n) into an NR-wide panel, zero-padded past w.
static inline void kf_pack_b(float* __restrict dst, const float* __restrict src, int64_t n, int64_t kc, int64_t w) {
    if (w == NR) {
        for (int64_t p = 0; p < kc; ++p) {
            __builtin_prefetch(src + (p + 16) * n, 0, 3);     // B's rows are strided: the row 16 ahead, to L1
            #pragma omp simd
            for (int64_t j = 0; j < NR; ++j) dst[p * NR + j] = src[p * n + j];
        }
        return;
    }
    for (int64_t p = 0; p < kc; ++p) {
        for (int64_t j = 0; j < w; ++j) dst[p * NR + j] = src[p * n + j];
        for (int64_t j = w; j < NR; ++j) dst[p * NR + j] = 0.f;
    }
}

struct KfBuf {                       // a 64-byte aligned, grow-only buffer, freed at thread exit
    float* p = nullptr;
    size_t cap = 0;
    ~KfBuf() { std::free(p); }
    float* get(size_t floats) {
        if (cap < floats) {
            std::free(p);
            p = static_cast<float*>(std::aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64));
            cap = p ? floats : 0;
        }
        return p;
    }
};

enum { KF_EMPTY = 0, KF_PACKING = 1, KF_PACKED = 2 };

extern "C" int kf_forward(const float* __restrict A, const float* __restrict B, float* __restrict C,
                          int64_t m, int64_t n, int64_t k) {
    if (m <= 0 || n <= 0) return 0;
    if (k <= 0) { for (int64_t i = 0; i < m; ++i) std::memset(C + i * n, 0, n * sizeof(float)); return 0; }
    static thread_local KfBuf bbuf, fbuf;
    const int64_t nkb = (k + BK - 1) / BK, kcb = (k + nkb - 1) / nkb;                 // balanced depth <= BK
    const int64_t nnb = (n + BN - 1) / BN, ncb = ((n + nnb - 1) / nnb + NR - 1) / NR * NR;   // and width
    const int64_t mpan = (m + MR - 1) / MR;
    float* bpack = bbuf.get((size_t)(kcb * ncb));
    int* flags = reinterpret_cast<int*>(fbuf.get((size_t)(ncb / NR)));
    if (!bpack || !flags) return 1;
    int nt = omp_get_max_threads();
    const int np = omp_get_num_procs();
    if (nt > np) nt = np;                       // more threads than processors only adds waiting
    if (nt > mpan * 4) nt = (int)(mpan * 4);
    if ((double)m * n * k < (1 << 19)) nt = 1;  // a few microseconds of work: not worth a team
    for (int64_t kb = 0; kb < (k + BK - 1) / BK; ++kb) {                 // BK-deep blocks of k
        const int64_t pc = kb * k / nkb, kc = (kb + 1) * k / nkb - pc;
        const bool add = pc > 0;
        for (int64_t jb = 0; jb * ncb < n; ++jb) {                              // BN-wide blocks of n
            const int64_t jc = jb * ncb, nc = n - jc < ncb ? n - jc : ncb, npan = (nc + NR - 1) / NR;
            // Tasks: one MR-row panel of A against every B panel of the block; on a team, the last
            // 2 panels per thread are cut into up to 4 column pieces, so threads finish together.
            const int64_t tail = nt > 1 ? (mpan < 2 * nt ? mpan : 2 * nt) : 0;
            const int64_t pieces = npan < 4 ? npan : 4, whole = mpan - tail;
            const int64_t ntask = whole + tail * pieces;
            for (int64_t jp = 0; jp < npan; ++jp) flags[jp] = KF_EMPTY;
            #pragma omp parallel num_threads(nt)
            {
                float ap[MR * BK + 8] __attribute__((aligned(64)));
                float tile[MR * NR] __attribute__((aligned(64)));
                static thread_local KfBuf own;          // a panel claimed by another thread, edge case
                const int64_t first = omp_get_thread_num() * npan / omp_get_num_threads();
                #pragma omp for schedule(dynamic) nowait
                for (int64_t t = 0; t < ntask; ++t) {
                    const int64_t ip = t < whole ? t : whole + (t - whole) / pieces;
                    const int64_t piece = t < whole ? 0 : (t - whole) % pieces;
                    const int64_t jlo = t < whole ? 0 : piece * npan / pieces;
                    const int64_t jhi = t < whole ? npan : (piece + 1) * npan / pieces;
                    const int64_t i0 = ip * MR, h = m - i0 < MR ? m - i0 : MR;
                    const float* a = A + i0 * k + pc;
                    int64_t lda = k, sa = 1;
                    if (PACKA) {                               // A[i0:i0+h, pc:pc+kc], MR-interleaved
                        if (h == MR) {
                            int64_t p = 0;
#if defined(__AVX2__) && !defined(__AVX512F__)
                            if (MR == 6)
                            for (; p + 8 <= kc; p += 8) {
                                __m256 r0 = _mm256_loadu_ps(a + p), r1 = _mm256_loadu_ps(a + k + p);
                                __m256 r2 = _mm256_loadu_ps(a + 2 * k + p), r3 = _mm256_loadu_ps(a + 3 * k + p);
                                __m256 r4 = _mm256_loadu_ps(a + 4 * k + p), r5 = _mm256_loadu_ps(a + 5 * k + p);
                                __m256 z = _mm256_setzero_ps();
                                __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
                                __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
                                __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
                                __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
                                __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
                                __m256 u4 = _mm256_shuffle_ps(t4, z, 0x44), u5 = _mm256_shuffle_ps(t4, z, 0xEE);
                                __m256 u6 = _mm256_shuffle_ps(t5, z, 0x44), u7 = _mm256_shuffle_ps(t5, z, 0xEE);
                                float* d = ap + p * MR;
                                _mm256_storeu_ps(d + 0, _mm256_permute2f128_ps(u0, u4, 0x20));
                                _mm256_storeu_ps(d + 6, _mm256_permute2f128_ps(u1, u5, 0x20));
                                _mm256_storeu_ps(d + 12, _mm256_permute2f128_ps(u2, u6, 0x20));
                                _mm256_storeu_ps(d + 18, _mm256_permute2f128_ps(u3, u7, 0x20));
                                _mm256_storeu_ps(d + 24, _mm256_permute2f128_ps(u0, u4, 0x31));
                                _mm256_storeu_ps(d + 30, _mm256_permute2f128_ps(u1, u5, 0x31));
                                _mm256_storeu_ps(d + 36, _mm256_permute2f128_ps(u2, u6, 0x31));
                                _mm256_storeu_ps(d + 42, _mm256_permute2f128_ps(u3, u7, 0x31));
                            }
#endif
                            for (; p < kc; ++p)
                                #pragma GCC unroll 16
                                for (int r = 0; r < MR; ++r) ap[p * MR + r] = a[r * k + p];
                        } else {
                            for (int64_t p = 0; p < kc; ++p)
                                for (int r = 0; r < MR; ++r) ap[p * MR + r] = r < h ? a[r * k + p] : 0.f;
                        }
                        a = ap; lda = 1; sa = MR;
                    }
                    float* crow = C + i0 * n + jc;
                    const int64_t lines = (kc * 4 + 63) / 64, nexth = m - i0 - MR < MR ? m - i0 - MR : MR;
                    for (int64_t jj = jlo; jj < jhi; ++jj) {
                        // the next A panel into L2 while this one computes, a share of its lines per B panel
                        for (int64_t r = 0; r < nexth; ++r)
                            for (int64_t l = jj * lines / npan; l < (jj + 1) * lines / npan; ++l)
                                __builtin_prefetch(A + (i0 + MR + r) * k + pc + 16 * l, 0, 2);   // to L2
                        const int64_t jp = t < whole ? (first + jj) % npan : jj;
                        const int64_t j0 = jc + jp * NR, w = n - j0 < NR ? n - j0 : NR;
                        float* bp = bpack + jp * NR * kc;
                        const float* bsrc = B + pc * n + j0;
                        float* cj = crow + jp * NR;
                        int state = __atomic_load_n(&flags[jp], __ATOMIC_ACQUIRE);
                        if (state == KF_EMPTY) {
                            int expect = KF_EMPTY;
                            if (__atomic_compare_exchange_n(&flags[jp], &expect, KF_PACKING, false,
                                                            __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE)) {
                                if (FUSE && w == NR && h == MR) {      // compute from B's rows, packing them
                                    kf_micro<MR, 2>(kc, a, lda, sa, bsrc, n, bp, cj, n, add);
                                    __atomic_store_n(&flags[jp], KF_PACKED, __ATOMIC_RELEASE);
                                    continue;
                                }
                                kf_pack_b(bp, bsrc, n, kc, w);
                                __atomic_store_n(&flags[jp], KF_PACKED, __ATOMIC_RELEASE);
                                state = KF_PACKED;
                            } else {
                                state = expect;
                            }
                        }
                        if (state != KF_PACKED) {              // another thread is packing it
                            if (w == NR && h == MR) {
                                kf_micro<MR, 1>(kc, a, lda, sa, bsrc, n, nullptr, cj, n, add);
                                continue;
                            }
                            float* mine = own.get((size_t)(kc * NR));
                            if (mine) kf_pack_b(bp = mine, bsrc, n, kc, w);
                            else                               // no memory for a copy: wait for it
                                while (__atomic_load_n(&flags[jp], __ATOMIC_ACQUIRE) != KF_PACKED) {}
                        }
                        if (w == NR) {
                            kf_rows<MR>(h, kc, a, lda, sa, bp, cj, n, add);
                        } else {                               // edge tile: through a local tile
                            kf_rows<MR>(h, kc, a, lda, sa, bp, tile, NR, false);
                            for (int64_t r = 0; r < h; ++r)
                                for (int64_t j = 0; j < w; ++j)
                                    cj[r * n + j] = add ? cj[r * n + j] + tile[r * NR + j] : tile[r * NR + j];
                        }
                    }
                }
            }
        }
    }
    return 0;
}
