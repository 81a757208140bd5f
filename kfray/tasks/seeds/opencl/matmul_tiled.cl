// C = A @ B with TILE x TILE tiles of A and B staged in __local memory; barriers separate the
// loading of a tile from its use.
// @kf.param TILE in [16, 8, 32]
// @kf.launch matmul_tiled global=((n + TILE - 1) // TILE * TILE, (m + TILE - 1) // TILE * TILE) local=(TILE, TILE)
__kernel void matmul_tiled(__global const float* A, __global const float* B, __global float* C,
                           long m, long n, long k) {
    __local float As[TILE][TILE];
    __local float Bs[TILE][TILE];
    const int tx = get_local_id(0), ty = get_local_id(1);
    const long col = get_global_id(0), row = get_global_id(1);
    float acc = 0.f;
    for (long k0 = 0; k0 < k; k0 += TILE) {
        As[ty][tx] = (row < m && k0 + tx < k) ? A[row * k + k0 + tx] : 0.f;
        Bs[ty][tx] = (k0 + ty < k && col < n) ? B[(k0 + ty) * n + col] : 0.f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int p = 0; p < TILE; ++p) acc = fma(As[ty][p], Bs[p][tx], acc);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (row < m && col < n) C[row * n + col] = acc;
}
