/* The closeness rule of kfray/eval/closeness.py in one pass over an output and its reference.
 *
 * numpy needs about twenty passes over the arrays for the same figures (NaN counts, poison counts,
 * |g - w|, the tolerance test, float64 sums); for the multi-megabyte outputs of the built-in tasks
 * that cost more than the kernel being judged. Built with -ffp-contract=off so the tolerance test
 * rounds as numpy's float32 arithmetic does, and with reassociation allowed so the float64 sums
 * vectorize (their order changes the last bits of the cosine, never a verdict's meaning). */
#include <math.h>
#include <stdint.h>

typedef struct {
    int64_t nan_g, nan_w;        /* NaN elements in output / reference */
    int64_t poison_g, poison_w;  /* elements whose magnitude equals the poison */
    int64_t close;               /* |g - w| <= atol + rtol * |w| */
    int64_t not_close_unpaired;  /* not close, and not NaN in both */
    int64_t first_not_close;     /* -1 when every element is close */
    int64_t nonfinite_g;
    int64_t finite_w;
    double dot, gg, ww;          /* float64 sums over every element */
    double sum_w_finite, ww_finite;
    double spread2, err2;        /* over finite reference elements: sum (w - mean)^2, sum (g - w)^2 */
} kf_stats;

/* Branch-free (x != x is NaN, x - x == 0 is finite, NaN compares false) with 32-bit counters
 * over blocks, so the loop vectorizes; the first element out of tolerance is looked for
 * afterwards, and only when there is one. */
#define KF_BLOCK (1 << 20)
#define KF_CLOSE(T, ABS, NAME)                                                                    \
int NAME(const T* g, const T* w, int64_t n, double rtol_d, double atol_d, double poison_d,          \
         kf_stats* s) {                                                                            \
    const T rtol = (T)rtol_d, atol = (T)atol_d, poison = (T)poison_d;                             \
    int64_t c[8] = {0};                                                                            \
    double dot = 0, gg = 0, ww = 0, sw = 0, wwf = 0, sk = 0, sk2 = 0, e2 = 0;                      \
    T k0 = 0;                    /* the shift: the first finite reference element */                \
    for (int64_t i = 0; i < n; i++) if ((w[i] - w[i]) == 0) { k0 = w[i]; break; }                 \
    const double K = k0;                                                                           \
    for (int64_t b0 = 0; b0 < n; b0 += KF_BLOCK) {                                                 \
        const int m = (int)(n - b0 < KF_BLOCK ? n - b0 : KF_BLOCK);                                \
        const T* gb = g + b0; const T* wb = w + b0;                                                \
        int nan_g = 0, nan_w = 0, pg = 0, pw = 0, close = 0, unp = 0, nonf = 0, fin = 0;          \
        for (int i = 0; i < m; i++) {                                                              \
            const T a = gb[i], b = wb[i];                                                          \
            const int na = a != a, nb = b != b;                                                    \
            nan_g += na; nan_w += nb;                                                              \
            pg += ABS(a) == poison; pw += ABS(b) == poison;                                        \
            const T d = ABS(a - b);                                                                \
            const int ok = d <= atol + rtol * ABS(b);                                              \
            close += ok;                                                                           \
            unp += (!ok) & !(na & nb);                                                             \
            const int fa = (a - a) == 0, fb = (b - b) == 0;                                        \
            nonf += !fa;                                                                           \
            const T bf = fb ? b : 0;                                                               \
            const double da = a, db = b, dbf = bf;                                                 \
            dot += da * db; gg += da * da; ww += db * db;                                          \
            fin += fb; sw += dbf; wwf += dbf * dbf;                                                \
            const double dk = fb ? db - K : 0.0, de = fb ? (double)a - db : 0.0;                  \
            sk += dk; sk2 += dk * dk; e2 += de * de;                                               \
        }                                                                                          \
        c[0] += nan_g; c[1] += nan_w; c[2] += pg; c[3] += pw; c[4] += close; c[5] += unp;          \
        c[6] += nonf; c[7] += fin;                                                                 \
    }                                                                                              \
    int64_t first = -1;                                                                            \
    for (int64_t i = 0; c[4] < n && i < n; i++)                                                    \
        if (!(ABS(g[i] - w[i]) <= atol + rtol * ABS(w[i]))) { first = i; break; }                 \
    if (!(poison_d > 0)) { c[2] = 0; c[3] = 0; }                                                   \
    s->nan_g = c[0]; s->nan_w = c[1]; s->poison_g = c[2]; s->poison_w = c[3]; s->close = c[4];    \
    s->not_close_unpaired = c[5]; s->first_not_close = first; s->nonfinite_g = c[6];               \
    s->finite_w = c[7]; s->dot = dot; s->gg = gg; s->ww = ww; s->sum_w_finite = sw;                \
    s->ww_finite = wwf;                                                                            \
    s->spread2 = c[7] ? sk2 - sk * sk / (double)c[7] : 0.0; /* shifted data: no cancellation */   \
    s->err2 = e2;                                                                                  \
    return 0;                                                                                      \
}

KF_CLOSE(float, fabsf, kf_close_f32)
KF_CLOSE(double, fabs, kf_close_f64)

