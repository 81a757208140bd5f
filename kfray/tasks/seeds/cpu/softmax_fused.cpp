// Row softmax that reads x from memory once: each row is taken in CH-wide chunks; a chunk's max
// (read from memory) updates the running max, its exponentials (now read from L1) are written to y
// with the running sum, and the running sum is rescaled only when the max grows (online softmax,
// once per chunk, not per element). A last pass over y (in cache) scales each chunk by
// exp(chunk max - row max) / sum. The exponential is a branch-free polynomial that `omp simd`
// vectorizes (AVX-512/AVX2 lanes); threads take blocks of rows as they come free.
#include <cmath>
#include <cstdint>
// @kf.param CH in [1024, 256, 512, 2048]
// @kf.param ROWS_PER_TASK in [4, 1, 16]

namespace kfm {
static inline float exp(float x) {
    // exp(x) = 2^n * e^r, r in [-ln2/2, ln2/2]; degree-6 polynomial; exponent bits set directly
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
}  // namespace kfm

static void kf_row(const float* __restrict in, float* __restrict out, int64_t cols, float* __restrict cm) {
    float m = -INFINITY, s = 0.f;
    int64_t nch = 0;
    for (int64_t c0 = 0; c0 < cols; c0 += CH, ++nch) {
        const int64_t w = cols - c0 < CH ? cols - c0 : CH;
        const float* xi = in + c0;
        float* yo = out + c0;
        float mx = -INFINITY;
        #pragma omp simd reduction(max:mx)
        for (int64_t c = 0; c < w; ++c) mx = xi[c] > mx ? xi[c] : mx;
        if (mx > m) {                        // online: rescale the running sum once per chunk
            s = s * kfm::exp(m - mx);       // s is 0 while m is -inf
            m = mx;
        }
        float cs = 0.f;
        #pragma omp simd reduction(+:cs)
        for (int64_t c = 0; c < w; ++c) { const float e = kfm::exp(xi[c] - m); yo[c] = e; cs += e; }
        s += cs;
        cm[nch] = m;                         // the max this chunk's exponentials are relative to
    }
    const float inv = 1.f / s;
    int64_t k = 0;
    for (int64_t c0 = 0; c0 < cols; c0 += CH, ++k) {
        const int64_t w = cols - c0 < CH ? cols - c0 : CH;
        const float f = (cm[k] == m ? 1.f : kfm::exp(cm[k] - m)) * inv;
        float* yo = out + c0;
        #pragma omp simd
        for (int64_t c = 0; c < w; ++c) yo[c] *= f;
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
