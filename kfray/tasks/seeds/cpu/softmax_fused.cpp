// Row softmax that reads x from memory once: each row is taken in CH-wide chunks; a chunk's max
// (read from memory) updates the running max, its exponentials (now read from L1) are written to y
// with the running sum, and the running sum is rescaled only when the max grows (online softmax,
// once per chunk, not per element). A last pass over y (in cache) scales each chunk by
// exp(chunk max - row max) / sum. The exponential is a branch-free polynomial written with AVX2
// intrinsics, 8 lanes and 4 independent accumulators: the compiler's own vectorization of the same
// loop fell back to its scalar copy and ran at a fifth of numpy's speed. Other machines get the same
// polynomial in a portable loop. Threads take blocks of ROWS_PER_TASK rows as they come free.
#include <cmath>
#include <cstdint>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
// @kf.param CH in [1024, 256, 512, 2048]
// @kf.param ROWS_PER_TASK in [4, 1, 16]

namespace kfm {
// exp(x) = 2^n * e^r, r in [-ln2/2, ln2/2]; degree-6 polynomial; exponent bits set directly
static inline float exp(float x) {
    x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
    const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;     // round to nearest, no libm
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.3981999e-3f;
    p = p * r + 8.3334519e-3f;
    p = p * r + 4.1665795e-2f;
    p = p * r + 1.6666665e-1f;
    p = p * r + 5.0000001e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } two_n;
    two_n.i = ((int32_t)n + 127) << 23;
    return p * two_n.f;
}

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.7f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.3981999e-3f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#endif
}  // namespace kfm

// max of w floats
static inline float chunk_max(const float* __restrict x, int64_t w) {
    float mx = -INFINITY;
    int64_t c = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (w >= 32) {
        __m256 m0 = _mm256_loadu_ps(x), m1 = _mm256_loadu_ps(x + 8), m2 = _mm256_loadu_ps(x + 16),
               m3 = _mm256_loadu_ps(x + 24);
        for (c = 32; c + 32 <= w; c += 32) {
            m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + c));
            m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + c + 8));
            m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + c + 16));
            m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + c + 24));
        }
        mx = kfm::hmax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    }
#endif
    for (; c < w; ++c) mx = x[c] > mx ? x[c] : mx;
    return mx;
}

// y[c] = exp(x[c] - m) for w floats; returns their sum
static inline float chunk_exp(const float* __restrict x, float* __restrict y, int64_t w, float m) {
    float s = 0.f;
    int64_t c = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 vm = _mm256_set1_ps(m);
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    for (; c + 32 <= w; c += 32) {
        const __m256 e0 = kfm::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c), vm));
        const __m256 e1 = kfm::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c + 8), vm));
        const __m256 e2 = kfm::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c + 16), vm));
        const __m256 e3 = kfm::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c + 24), vm));
        _mm256_storeu_ps(y + c, e0);
        _mm256_storeu_ps(y + c + 8, e1);
        _mm256_storeu_ps(y + c + 16, e2);
        _mm256_storeu_ps(y + c + 24, e3);
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
        s2 = _mm256_add_ps(s2, e2);
        s3 = _mm256_add_ps(s3, e3);
    }
    for (; c + 8 <= w; c += 8) {
        const __m256 e = kfm::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c), vm));
        _mm256_storeu_ps(y + c, e);
        s0 = _mm256_add_ps(s0, e);
    }
    s = kfm::hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
#endif
    for (; c < w; ++c) { const float e = kfm::exp(x[c] - m); y[c] = e; s += e; }
    return s;
}

static inline void chunk_scale(float* __restrict y, int64_t w, float f) {
    int64_t c = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 vf = _mm256_set1_ps(f);
    for (; c + 16 <= w; c += 16) {
        _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_loadu_ps(y + c), vf));
        _mm256_storeu_ps(y + c + 8, _mm256_mul_ps(_mm256_loadu_ps(y + c + 8), vf));
    }
#endif
    for (; c < w; ++c) y[c] *= f;
}

static void kf_row(const float* __restrict in, float* __restrict out, int64_t cols, float* __restrict cm) {
    float m = -INFINITY, s = 0.f;
    int64_t nch = 0;
    for (int64_t c0 = 0; c0 < cols; c0 += CH, ++nch) {
        const int64_t w = cols - c0 < CH ? cols - c0 : CH;
        const float mx = chunk_max(in + c0, w);
        if (mx > m) {                        // online: rescale the running sum once per chunk
            s = s * kfm::exp(m - mx);       // s is 0 while m is -inf
            m = mx;
        }
        s += chunk_exp(in + c0, out + c0, w, m);
        cm[nch] = m;                         // the max this chunk's exponentials are relative to
    }
    const float inv = 1.f / s;
    int64_t k = 0;
    for (int64_t c0 = 0; c0 < cols; c0 += CH, ++k) {
        const int64_t w = cols - c0 < CH ? cols - c0 : CH;
        chunk_scale(out + c0, w, (cm[k] == m ? 1.f : kfm::exp(cm[k] - m)) * inv);
    }
}

extern "C" int kf_forward(const float* __restrict x, float* __restrict y, int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return 0;
    const int64_t nch = (cols + CH - 1) / CH;
    #pragma omp parallel
    {
        float stack_cm[64];
        float* cm = nch <= 64 ? stack_cm : new float[nch];
        #pragma omp for schedule(dynamic)
        for (int64_t r0 = 0; r0 < rows; r0 += ROWS_PER_TASK)
            for (int64_t r = r0; r < r0 + ROWS_PER_TASK && r < rows; ++r)
                kf_row(x + r * cols, y + r * cols, cols, cm);
        if (cm != stack_cm) delete[] cm;
    }
    return 0;
}
