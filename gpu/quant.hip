/* gpu/quant.hip: MX quantize-dequantize of bf16 rows on the device, the twin of ref/quant.c's
 * m3_mx_quantize + m3_mx_dequantize (and of ref/linear.c's activation quantization, which is
 * the same two steps block by block). The scalar rules are ref/num/mx.h's own functions,
 * compiled as device code (m3_mx_scale_byte, m3_mx_encode, m3_mx_decode): the result is
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
 * One lane per element, 32 consecutive lanes per MX block (m3_mx_params.block must be 32,
 * cols a multiple of 32, so a block never straddles a warp of 32 or 64): a 5-step butterfly
 * over the 32 lanes gives the block's largest |x| bit pattern (non-negative floats order like
 * their bit patterns; NaN / inf give a pattern >= 0x7F800000, which m3_mx_scale_byte maps to
 * the NaN scale, exactly what m3_mx_block_scale returns for such a block), then each lane
 * encodes and decodes its own element. The earlier form, one thread running a block's 32
 * encodes in series, was latency bound at decode sizes (~25 us per launch for one 6144-wide
 * row on the H200). y may alias x (a lane reads its element before the butterfly and writes
 * it after; the block's other elements belong to lanes of the same warp). */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "ref/num/bf16.h"
#include "ref/num/mx.h"

#define QDQ_THREADS 256

static __global__ void __launch_bounds__(QDQ_THREADS)
    mx_qdq_k(m3_bf16 *y, const m3_bf16 *x, int64_t n, m3_mx_params p) {
    const int64_t i = (int64_t)blockIdx.x * QDQ_THREADS + threadIdx.x;
    /* n and QDQ_THREADS are multiples of 32: a block's 32 lanes are all in or all out */
    if (i >= n) return;
    const float v = m3_bf16_to_f32(x[i]);
    uint32_t amax = m3_f32_bits(v) & 0x7FFFFFFFu;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) { /* lanes i ^ m stay inside the 32-aligned block */
        const uint32_t o = (uint32_t)M3_SHFL_XOR((int)amax, m);
        amax = o > amax ? o : amax;
    }
    const m3_e8m0 b = m3_mx_scale_byte(m3_bits_f32(amax), &p);
    y[i] = m3_f32_to_bf16(m3_mx_decode(m3_mx_encode(v, b, &p), b, p.elem));
}

extern "C" m3_status m3_gpu_mx_qdq_bf16(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x, int64_t rows,
                                        int cols, const m3_mx_params *mx) {
    M3_ASSERT(g && mx && rows >= 0 && cols >= 0);
    if (mx->block != 32 || cols % 32)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu mx_qdq: block %d, cols %d (needs block 32 and "
                         "cols %% 32 == 0)", mx->block, cols);
    const int64_t n = rows * cols;
    if (n == 0) return M3_OK;
    mx_qdq_k<<<m3_grid_1d(n, QDQ_THREADS), QDQ_THREADS, 0, g->stream>>>(d_y, d_x, n, *mx);
    M3_LAUNCHED(g, "mx_qdq_k");
    return M3_OK;
}
