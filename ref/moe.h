/* ref/moe.h: the sparse MoE block of layers 3-59 (spec §3.12-3.14), split into the discrete
 * routing decision (m3_moe_route) and the continuous expert math (m3_moe_experts), so tests,
 * the comparator and `m3 replay` can teacher-force expert ids and weights.
 *
 * Router (§3.12): l = x Wg^T (router_logits) in p->router_dtype: with BF16 the fp32 gate and
 *   the bias are rounded to bf16 (what from_pretrained(dtype=bf16) holds), x is cast to bf16,
 *   the logits are bf16(fp32 GEMM); with F32 everything is fp32.
 *   sigma_e = sigmoid(l_e) (fp32); selection by sigma_e + b_e (the bias is for choosing
 *   only); top K by (value desc, expert id asc): ties go to the lower id;
 *   w_k = sigma_k / sum_k' sigma_k' (fp32, sum in selection order, no epsilon) = the
 *   `expert_weights` stage, BEFORE routed_scaling_factor.
 * Experts (§3.13): y_e = MLP_e(x) (ref/mlp.h, swiglu_oai); R = sum_k w_k y_{e_k} summed in
 *   ascending expert id; routed = rsf * R. hf (p->moe_bf16_combine): each product
 *   bf16(y_e * w_k), a bf16 running sum starting from 0 in ascending id, bf16(rsf * R).
 * Shared expert (§3.14): m3_mlp with the shared weights (weight 1, not scaled);
 *   m3_moe_add_shared: out = routed + S (bf16(2R + S) under act_bf16).
 * Shapes: x [T, D]; Wg [E, D] fp32; bias [E] fp32; logits [T, E]; ids [T, K] int32;
 *   wts [T, K] fp32 aligned with ids; margin [T]; y [T, D].
 * Threads: the expert GEMMs split output-row tiles; the combine splits tokens. No reduction
 *   is split, so results are bit-identical for any thread count.
 * docs/numerics.md §3.12-3.14. */
#ifndef M3_MOE_H
#define M3_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"
#include "ref/mlp.h"
#include "ref/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct m3_moe_params {
    int n_expert;       /* E (128) */
    int top_k;          /* K (4), 1 <= K <= E */
    int dim;            /* D (6144) */
    int ffn;            /* F per routed expert (3072) */
    int shared_ffn;     /* shared expert F (3072); 0 = no shared expert */
    float routed_scale; /* routed_scaling_factor (2.0) */
    float alpha;        /* swiglu_alpha (1.702f) */
    float limit;        /* swiglu_limit (7.0f) */
} m3_moe_params;

/* Borrowed MoE weights of one layer. */
typedef struct m3_moe_weights {
    const float *gate;             /* borrowed [E, D] fp32 router gate (checkpoint F32) */
    const float *bias;             /* borrowed [E] fp32 e_score_correction_bias; NULL = none */
    const m3_mlp_weights *experts; /* borrowed array [E]; only the experts used are read */
    m3_mlp_weights shared;         /* shared expert (gate/up/down NULL when shared_ffn == 0) */
} m3_moe_weights;

/* logits [T, E] = router GEMM per p->router_dtype (see above). scratch: at least
 * m3_moe_scratch_bytes(n_tok, mp) bytes (holds bf16(x) when the router runs in bf16). */
void m3_moe_router_logits(float *logits, const float *x, int n_tok, const float *gate,
                          const m3_moe_params *mp, const m3_profile *p, void *scratch);

/* Selection + renormalised weights from logits. ids/wts [T, K] in selection order
 * (value desc, id asc). margin [T] (may be NULL): (sigma+b) of the K-th minus the (K+1)-th
 * candidate (+inf when K == E), for dumps and tie classification. bias may be NULL. */
void m3_moe_route(int32_t *ids, float *wts, float *margin, const float *logits,
                  const float *bias, int n_tok, const m3_moe_params *mp, const m3_profile *p);

/* Scratch for m3_moe_router_logits and m3_moe_experts: token lists plus one expert's
 * gathered input rows, g/u (a in place) and output rows: 2*T*D + 2*T*F floats + ints. */
size_t m3_moe_scratch_bytes(int n_tok, const m3_moe_params *mp);

/* y [T, D] = rsf * sum_k wts[t,k] * expert[ids[t,k]](x[t]) (routed part only, see above).
 * m3_moe_experts_fused (atom with quantized experts, spec §3.14, variant shared_fused): the
 * shared expert is computed here as expert #E with weight 1.0 and the routed weights carry
 * rsf (w_k * rsf, exact for rsf = 2); the caller then skips m3_mlp(shared) and
 * m3_moe_add_shared: y = sum_k (rsf wts[t,k]) y_{e_k} + 1.0 * Shared(x[t]) summed in
 * ascending id with the shared expert last (id E), no final x rsf; the rounding is the
 * combine's (hf: per product and per step; otherwise one rounding of the sum under act_bf16
 * instead of bf16(bf16(rsf R) + S)). Experts run through m3_mlp_pass with n_pass = n_tok,
 * so activation quantization bounds see the whole pass.
 * ids/wts may come from a dump (teacher forcing). An id outside [0, E) or repeated within a
 * row returns M3_ERR_ARG (with a message) and leaves y unspecified. y must not alias x. */
m3_status m3_moe_experts(float *y, const float *x, const int32_t *ids, const float *wts,
                         int n_tok, const m3_moe_weights *w, const m3_moe_params *mp,
                         const m3_profile *p, void *scratch);

m3_status m3_moe_experts_fused(float *y, const float *x, const int32_t *ids, const float *wts,
                               int n_tok, const m3_moe_weights *w, const m3_moe_params *mp,
                               const m3_profile *p, void *scratch);

/* The shared expert's params (dim, shared_ffn, alpha, limit) from the MoE params. */
m3_mlp_params m3_moe_shared_params(const m3_moe_params *mp);

/* y[i] = y[i] + s[i] (routed + shared) with the profile's rounding (bf16 when act_bf16). */
void m3_moe_add_shared(float *y, const float *s, int64_t n, const m3_profile *p);

#ifdef __cplusplus
}
#endif
#endif
