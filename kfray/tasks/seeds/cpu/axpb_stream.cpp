// y = a * x + b at the machine's copy bandwidth. Threads take SLICE-float pieces as they come free
// (a thread the OS delays costs one piece), or with SLICE 0 one contiguous slice each. The body is
// AVX-512 / AVX2 fused multiply-adds (a portable omp simd loop elsewhere); with NT the stores are
// non-temporal: y bypasses the cache, so no line of y is read before it is written (a third of
// the traffic of a plain store). PF prefetches x that many floats ahead. Elements before the first
// aligned vector and after the last are done one at a time.
#include <cstdint>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
// @kf.param NT in [1, 0]
// @kf.param UNROLL in [4, 2, 1]
// @kf.param PF in [0, 512, 2048]
// @kf.param SLICE in [65536, 0, 262144]

#if defined(__AVX512F__)
#define VW 16
#define VT __m512
#define VSET(v) _mm512_set1_ps(v)
#define VLOAD(p) _mm512_loadu_ps(p)
#define VFMA(a, x, b) _mm512_fmadd_ps(a, x, b)
#define VSTORE(p, v) _mm512_store_ps(p, v)
#define VSTREAM(p, v) _mm512_stream_ps(p, v)
#elif defined(__AVX2__)
#define VW 8
#define VT __m256
#define VSET(v) _mm256_set1_ps(v)
#define VLOAD(p) _mm256_loadu_ps(p)
#define VFMA(a, x, b) _mm256_fmadd_ps(a, x, b)
#define VSTORE(p, v) _mm256_store_ps(p, v)
#define VSTREAM(p, v) _mm256_stream_ps(p, v)
#endif

static void kf_slice(const float* __restrict x, float* __restrict y, float a, float b, int64_t lo, int64_t hi) {
    int64_t i = lo;
#ifdef VW
    while (i < hi && (reinterpret_cast<uintptr_t>(y + i) & (VW * 4 - 1))) { y[i] = a * x[i] + b; ++i; }
    const VT va = VSET(a), vb = VSET(b);
    for (; i + UNROLL * VW <= hi; i += UNROLL * VW) {
        if (PF) _mm_prefetch(reinterpret_cast<const char*>(x + i + PF), _MM_HINT_T0);   // PF floats ahead
        #pragma GCC unroll 4
        for (int u = 0; u < UNROLL; ++u) {
            const VT v = VFMA(va, VLOAD(x + i + u * VW), vb);
            if (NT) VSTREAM(y + i + u * VW, v); else VSTORE(y + i + u * VW, v);
        }
    }
#else
    #pragma omp simd
    for (int64_t j = lo; j < hi; ++j) y[j] = a * x[j] + b;
    i = hi;
#endif
    for (; i < hi; ++i) y[i] = a * x[i] + b;
}

extern "C" int kf_forward(const float* __restrict x, float* __restrict y, float a, float b, int64_t n) {
    if (n <= 0) return 0;
    if (n < (1 << 14)) { kf_slice(x, y, a, b, 0, n); return 0; }   // too small to share
    #pragma omp parallel
    {
        if (SLICE == 0) {                      // one contiguous slice per thread
            const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
            const int64_t per = ((n + nt - 1) / nt + 15) / 16 * 16;   // whole 64-byte lines per thread
            const int64_t lo = t * per < n ? t * per : n, hi = lo + per < n ? lo + per : n;
            kf_slice(x, y, a, b, lo, hi);
        } else {                               // SLICE-float pieces to whichever thread is free
            const int64_t piece = SLICE > 0 ? SLICE : 1, pieces = (n + piece - 1) / piece;
            #pragma omp for schedule(dynamic)
            for (int64_t p = 0; p < pieces; ++p)
                kf_slice(x, y, a, b, p * piece, p * piece + piece < n ? p * piece + piece : n);
        }
#ifdef VW
        if (NT) _mm_sfence();                  // streamed stores visible before the call returns
#endif
    }
    return 0;
}
