/* ref/quant.h: array-level quantization of row-major matrices (spec m3-numerics.md §5.4-5.7).
 * Scalar rules live in ref/num/{fp8,mx}.h; this file only walks rows and blocks, so the
 * numerics contract is theirs. Threads split rows only (results independent of the count).
 * Callers own every buffer. Shapes: x, y are [rows, cols] f32, row-major, dense.
 *
 * MX (MXFP4 / MXFP8): blocks of p->block (32) consecutive elements along cols, which must
 * be the contracted dim (K). The last block of a row may be partial (cols % block).
 *   codes  [rows, m3_mx_row_bytes(cols, p)] uint8. fp8 elements: one byte each. e2m1: two
 *          per byte, element 2j in the low nibble of byte j unless p->high_even_nibble; for
 *          odd cols the unused nibble of a row's last byte is 0.
 *   scales [rows, m3_mx_n_blocks(cols, p)] e8m0.
 *
 * ptpc fp8 (per-token activations, per-channel weights): one fp32 scale per row, rows being
 * tokens of an activation [T, D] or output channels of a weight [out, in]:
 *   amax = max_j |x[r,j]|; a NaN anywhere in the row makes amax NaN (then scale and every
 *   code are NaN: never hidden by a max that skips NaN).
 *   M3_FP8Q_DIV (default, §4.7): s = amax / fp8_max; q = cvt_fp8(x / s)       (fp32 divisions)
 *   M3_FP8Q_RCP (§5.6 form):      s = amax * f32(1/fp8_max); q = cvt_fp8(x * f32(1/s)); the
 *                                 hardware rcp (__builtin_amdgcn_rcpf) is approximated by an
 *                                 IEEE fp32 division: UNVERIFIED to the bit.
 *   amax == 0 (ptpc_zero_row): M3_PTPC_ZERO_NAN -> s = 0 and every code NaN (0/0), the TP=1
 *   activation path; M3_PTPC_ZERO_ONE -> s = 1 and codes = cvt_fp8(x) (+-0).
 *   cvt_fp8 is m3_f32_to_fp8 (RNE) with p->ovf. Dequant: y = fp32(q) * s.
 *   fp8_max is a parameter and need not be the kind's max: §4.7's Triton KV writers use 240
 *   with e4m3fn.
 *
 * e4m3fn -> e4m3fnuz checkpoint conversion (§5.7, fn_to_fnuz): bytes are reinterpreted, so
 * each value halves, and every scale is doubled to compensate. 0x80 (-0 in fn, the NaN code
 * in fnuz) becomes 0x00. The fn NaN codes 0x7F / 0xFF are NOT remapped: they become +-240 in
 * fnuz (+-480 after the doubled scale), as ATOM does. Every other code keeps its dequantized
 * value exactly. */
#ifndef M3_QUANT_H
#define M3_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"
#include "ref/num/fp8.h"
#include "ref/num/mx.h"

/* ---- MX -------------------------------------------------------------------------------- */

int m3_mx_n_blocks(int cols, const m3_mx_params *p);       /* ceil(cols / block) */
int64_t m3_mx_row_bytes(int cols, const m3_mx_params *p);  /* (cols+1)/2 for e2m1, else cols */

void m3_mx_quantize(uint8_t *codes, m3_e8m0 *scales, const float *x, int rows, int cols,
                    const m3_mx_params *p);
void m3_mx_dequantize(float *y, const uint8_t *codes, const m3_e8m0 *scales, int rows, int cols,
                      const m3_mx_params *p);

/* ---- ptpc fp8 -------------------------------------------------------------------------- */

typedef enum m3_ptpc_zero_row { M3_PTPC_ZERO_NAN = 0, M3_PTPC_ZERO_ONE = 1 } m3_ptpc_zero_row;
typedef enum m3_fp8q_arith { M3_FP8Q_DIV = 0, M3_FP8Q_RCP = 1 } m3_fp8q_arith;

typedef struct m3_fp8q_params {
    m3_fp8_kind kind;
    m3_fp8_overflow ovf;        /* fp8_overflow */
    m3_ptpc_zero_row zero_row;  /* ptpc_zero_row */
    m3_fp8q_arith arith;        /* how scale and x/scale are formed */
    float fp8_max;              /* FP8_MAX of the writer */
} m3_fp8q_params;

/* kind's max, saturate, zero row NaN (the §5.9 atom default), DIV. */
m3_fp8q_params m3_fp8q_params_default(m3_fp8_kind kind);

/* q [rows, cols], scale [rows]. */
void m3_fp8_quantize_rows(m3_fp8 *q, float *scale, const float *x, int rows, int cols,
                          const m3_fp8q_params *p);
void m3_fp8_dequantize_rows(float *y, const m3_fp8 *q, const float *scale, int rows, int cols,
                            m3_fp8_kind kind);

/* ---- e4m3fn -> e4m3fnuz ---------------------------------------------------------------- */

/* The byte mapping of §5.7 for one code. */
m3_fp8 m3_fp8_fn_to_fnuz_code(m3_fp8 c);
/* n codes; dst may alias src. */
void m3_fp8_fn_to_fnuz(m3_fp8 *dst, const m3_fp8 *src, int64_t n);
/* fp32 scales (per tensor / channel / token): s *= 2, exact. */
void m3_fp8_fn_to_fnuz_scales_f32(float *s, int64_t n);
/* e8m0 scales (MXFP8 blocks): byte + 1; 0xFF (NaN) stays. A byte 254 has no doubled e8m0:
 * returns M3_ERR_NUMERIC and leaves s unchanged. */
m3_status m3_fp8_fn_to_fnuz_scales_e8m0(m3_e8m0 *s, int64_t n);

#endif
