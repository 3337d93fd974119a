/* gpu/quant.hip: MX quantize-dequantize of bf16 rows on the device, the twin of ref/quant.c's
 * m3_mx_quantize + m3_mx_dequantize (and of ref/linear.c's activation quantization, which is
 * the same two steps block by block). The scalar rules are ref/num/mx.h's own functions,
 * compiled as device code (m3_mx_block_scale, m3_mx_encode, m3_mx_decode): the result is
 * bit-identical to the reference by construction, for every element type, scale rule,
 * rounding mode, overflow mode and zero-block rule of m3_mx_params (tests/gpu_quant.c).
 *
 * Storage: the dequantized values are written back as bf16, exactly. Why exact: a result is
 * code * 2^k with at most 4 significant bits (e4m3 / e5m2 / e2m1), so only the bf16
 * subnormal range (below 2^-126, step 2^-133) could lose bits. A bf16 input there is a
 * multiple of 2^-133; where the element grid around it is finer than 2^-133 the input lies
 * on that grid and is returned unchanged, and where it is coarser the grid step is a power
 * of two >= 2^-133, so the result is again a multiple of 2^-133: a bf16 value. NaN (a block
 * holding NaN or inf, or fp8 overflow to NaN) stays NaN (quiet, sign kept).
 *
 * One thread per 32-element block (m3_mx_params.block must be 32, cols a multiple of 32):
 * four 16-byte loads, the scale, 32 encode/decode pairs, four 16-byte stores. y may alias x
 * (each thread reads its block before writing it). Cost: one thread runs its 32 encodes in
 * series, so few rows are latency bound (measured on the H200: ~25 us per launch for one
 * decode row); one lane per element with a 32-lane max is the known fix (not built here). */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "ref/num/bf16.h"
#include "ref/num/mx.h"

#define QDQ_THREADS 256

static __global__ void __launch_bounds__(QDQ_THREADS)
    mx_qdq_k(m3_bf16 *y, const m3_bf16 *x, int64_t n_blk, m3_mx_params p) {
    const int64_t i = (int64_t)blockIdx.x * QDQ_THREADS + threadIdx.x;
    if (i >= n_blk) return;
    float v[32];
#pragma unroll
    for (int h = 0; h < 4; h++) m3_vec<m3_bf16>::load(x, i * 32 + h * 8, v + 8 * h);
    const m3_e8m0 b = m3_mx_block_scale(v, 32, &p);
#pragma unroll
    for (int k = 0; k < 32; k++) v[k] = m3_mx_decode(m3_mx_encode(v[k], b, &p), b, p.elem);
#pragma unroll
    for (int h = 0; h < 4; h++) m3_vec<m3_bf16>::store(y, i * 32 + h * 8, v + 8 * h);
}

extern "C" m3_status m3_gpu_mx_qdq_bf16(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x, int64_t rows,
                                        int cols, const m3_mx_params *mx) {
    M3_ASSERT(g && mx && rows >= 0 && cols >= 0);
    if (mx->block != 32 || cols % 32)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu mx_qdq: block %d, cols %d (needs block 32 and "
                         "cols %% 32 == 0)", mx->block, cols);
    const int64_t n_blk = rows * (cols / 32);
    if (n_blk == 0) return M3_OK;
    M3_ASSERT(m3_aligned16(d_x) && m3_aligned16(d_y));
    mx_qdq_k<<<m3_grid_1d(n_blk, QDQ_THREADS), QDQ_THREADS, 0, g->stream>>>(d_y, d_x, n_blk, *mx);
    M3_LAUNCHED(g, "mx_qdq_k");
    return M3_OK;
}
