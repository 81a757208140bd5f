// y = a * x + b with float4 vload4/vstore4 per work-item and a scalar tail for n % 4.
// @kf.param WG in [64, 128, 256, 512]
// @kf.launch axpb_vec global=(((n + 3) // 4 + WG - 1) // WG * WG) local=(WG)
__kernel void axpb_vec(__global const float* x, __global float* y, float a, float b, long n) {
    const long i = get_global_id(0);
    if (4 * i + 4 <= n) {
        const float4 v = vload4(i, x);
        vstore4(fma((float4)(a), v, (float4)(b)), i, y);
    } else {
        for (long j = 4 * i; j < n; ++j) y[j] = fma(a, x[j], b);
    }
}
