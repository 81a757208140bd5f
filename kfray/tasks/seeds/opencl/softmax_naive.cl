// Row softmax, one work-item per row, three passes over the row: max, sum of exp, normalise.
// @kf.param WG in [64, 128, 256]
// @kf.launch softmax_naive global=((rows + WG - 1) // WG * WG) local=(WG)
__kernel void softmax_naive(__global const float* x, __global float* y, long rows, long cols) {
    const long r = get_global_id(0);
    if (r >= rows) return;
    __global const float* in = x + r * cols;
    __global float* out = y + r * cols;
    float m = in[0];
    for (long c = 1; c < cols; ++c) m = fmax(m, in[c]);
    float s = 0.f;
    for (long c = 0; c < cols; ++c) s += exp(in[c] - m);
    for (long c = 0; c < cols; ++c) out[c] = exp(in[c] - m) / s;
}
