/* ref/qload.h: the quantized forms of a layer's weights, made at load time from a variant
 * (ref/variant.h; docs/quantization.md):
 *   experts (routed and shared, spec §3.13-3.14, §5.10-5.11): MXFP4 / MXFP8 weights either
 *     taken as stored from an MX checkpoint (borrowed views) or quantized on load from the
 *     dense weights (experts_scale / experts_round, 1x32 blocks along K, e8m0 scales), plus
 *     the activation quantization the serving path applies (act_in before gate/up, act_mid
 *     before down): MXFP4 -> MX e2m1 rceil when the pass has >= moe_act_bound tokens;
 *     MXFP8 -> MX e4m3fn rceil always. `--experts bf16` on an MX checkpoint decodes it
 *     exactly to fp32.
 *   ptpc (spec §3.3, §5.6): the dense projections (q/k/v/index_q/index_k/o and the dense
 *     MLP) re-quantized to fp8 per output channel (s_w = amax/FP8_MAX, rcp form), with
 *     per-token fp8 activations (ptpc_zero_row for all-zero rows).
 * Weight quantization is exact to specify: w_q = encode(w / 2^k) per block; dequantization
 * (ref/linear.c) is exact. Every buffer made here is owned by the m3_qstore.
 * Shapes: [out, in] as stored; MX scales [out, ceil(in/32)]. */
#ifndef M3_QLOAD_H
#define M3_QLOAD_H

#include <stdbool.h>

#include "ref/base.h"
#include "ref/config.h"
#include "ref/linear.h"
#include "ref/mlp.h"
#include "ref/variant.h"
#include "ref/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-layer store: the activation specs the weights point to and the owned buffers. */
typedef struct m3_qstore {
    m3_actq mx4_in, mx4_mid; /* MXFP4 experts */
    m3_actq mx8_in, mx8_mid; /* MXFP8 experts */
    m3_actq ptpc;            /* ptpc projections */
    void **own;
    int n_own, cap_own;
} m3_qstore;

/* A zeroed store with the activation specs of variant v. Free with m3_qstore_free. */
m3_status m3_qstore_create(m3_qstore **q, const m3_variant *v);
void m3_qstore_free(m3_qstore *q); /* NULL ok: frees every owned buffer */

/* The format a swiglu MLP (gate role rg, layer L, expert e or -1) runs in under v:
 * M3_WFMT_BF16 = plain (the stored dense weights; nothing for qload to do), M3_WFMT_F32 =
 * an MX checkpoint decoded (`--experts bf16`), M3_WFMT_MXFP4 / M3_WFMT_MXFP8. */
m3_status m3_qload_mlp_fmt(m3_weights *w, m3_wrole rg, int L, int e, const m3_variant *v,
                           m3_wfmt *fmt);

/* Load the three linears of a swiglu MLP in format fmt (not BF16) with its activation
 * specs (MX formats). dim D, ffn F as the config implies. */
m3_status m3_qload_mlp(m3_mlp_weights *out, m3_qstore *q, m3_weights *w, m3_wrole rg, m3_wrole ru,
                       m3_wrole rd, int L, int e, int dim, int ffn, m3_wfmt fmt,
                       const m3_variant *v);

/* Replace a dense (BF16 / F32) projection by its ptpc fp8 form (FP8_ROW + q->ptpc). */
m3_status m3_qload_ptpc(m3_wmat *wm, m3_qstore *q);
/* The same for the three matrices of a dense MLP (D = dim, F = ffn). */
m3_status m3_qload_ptpc_mlp(m3_mlp_weights *mw, m3_qstore *q, int dim, int ffn);

/* Quantize a dense fp32 matrix [rows, cols] to MX (codes [rows, row_bytes], scales
 * [rows, ceil(cols/32)]) with the experts' weight rule of v (experts_scale, experts_round,
 * zero block byte 0, low_even nibbles). The one definition used by quantize-on-load and by
 * `m3 quantize`, so the two agree bit for bit. */
void m3_qload_mx_weight(uint8_t *codes, m3_e8m0 *scales, const float *x, int rows, int cols,
                        bool fp4, const m3_variant *v);

#ifdef __cplusplus
}
#endif
#endif
