// RMSNorm, one token after another: a sum of squares pass, then a scale pass.
#include <cmath>
#include <cstdint>

extern "C" int kf_forward(const float* x, const float* w, float* y, int64_t tokens, int64_t hidden, float eps) {
    for (int64_t t = 0; t < tokens; ++t) {
        const float* row = x + t * hidden;
        // KF-EVOLVE-BEGIN
        double ss = 0.0;
        for (int64_t i = 0; i < hidden; ++i)
            ss += (double)row[i] * row[i];
        float inv = 1.0f / std::sqrt((float)(ss / hidden) + eps);
        for (int64_t i = 0; i < hidden; ++i)
            y[t * hidden + i] = row[i] * inv * w[i];
        // KF-EVOLVE-END
    }
    return 0;
}
