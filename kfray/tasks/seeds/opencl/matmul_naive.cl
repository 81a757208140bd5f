// C = A @ B (row-major), one work-item per element of C. Dimension 0 (get_global_id(0)) walks the
// columns, so neighbouring work-items read neighbouring elements of B.
// @kf.param TX in [16, 8, 32, 64]
// @kf.param TY in [4, 1, 2, 8]
// @kf.require TX * TY <= 1024
// @kf.launch matmul_naive global=((n + TX - 1) // TX * TX, (m + TY - 1) // TY * TY) local=(TX, TY)
__kernel void matmul_naive(__global const float* A, __global const float* B, __global float* C,
                           long m, long n, long k) {
    const long col = get_global_id(0), row = get_global_id(1);
    if (row >= m || col >= n) return;
    float acc = 0.f;
    for (long p = 0; p < k; ++p) acc += A[row * k + p] * B[p * n + col];
    C[row * n + col] = acc;
}
