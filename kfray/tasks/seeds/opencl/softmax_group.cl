// Row softmax, one work-group per row: the work-items stride over the row together (coalesced)
// and combine their partial max and sum with work-group reductions.
// @kf.param WG in [16, 32, 64, 128, 256]
// @kf.launch softmax_group global=(rows * WG) local=(WG)
__kernel void softmax_group(__global const float* x, __global float* y, long rows, long cols) {
    const long r = get_group_id(0);
    const long lid = get_local_id(0);
    __global const float* in = x + r * cols;
    __global float* out = y + r * cols;
    float m = -INFINITY;
    for (long c = lid; c < cols; c += WG) m = fmax(m, in[c]);
    m = work_group_reduce_max(m);
    float s = 0.f;
    for (long c = lid; c < cols; c += WG) s += exp(in[c] - m);
    s = work_group_reduce_add(s);
    const float inv = 1.f / s;
    for (long c = lid; c < cols; c += WG) out[c] = exp(in[c] - m) * inv;
}
