// y = a * x + b: one element per work-item (the OpenCL C baseline).
// @kf.param WG in [64, 128, 256, 512]
// @kf.launch axpb_naive global=((n + WG - 1) // WG * WG) local=(WG)
__kernel void axpb_naive(__global const float* x, __global float* y, float a, float b, long n) {
    const long i = get_global_id(0);
    if (i < n) y[i] = a * x[i] + b;
}
