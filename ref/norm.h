/* ref/norm.h: Gemma RMSNorm, with the residual add fused in front (spec §3.2, §3.5).
 *
 * Math:   s = r + h;  mu = (sum_i s_i^2) / n;  rho = 1 / sqrtf(mu + eps);
 *         y_i = (s_i * rho) * (1 + w_i)        ((1 + w) in fp32 from the stored bf16 w)
 * Shapes: r, h, y [T, D]; w [D] bf16. Per-head variant: rows of n_head heads of head_dim.
 * Numerics: fp32 sum of squares in index order; rho = 1.0f / sqrtf(mu + eps) (correctly
 *   rounded sqrtf, then an fp32 division: torch.rsqrt on CPU is 1/sqrt as well); products in
 *   the order (s*rho)*(1+w). m3_rmsnorm and m3_rmsnorm_heads never round; m3_rmsnorm_add
 *   applies the profile: residual_bf16 -> s stored bf16 and (unless norm_reads_f32_sum, atom)
 *   the norm reads the rounded s; act_bf16 -> y rounded to bf16 once.
 * Special values: NaN/inf propagate (no clamps).
 * docs/numerics.md §3.2. */
#ifndef M3_NORM_H
#define M3_NORM_H

#include <stdint.h>

#include "ref/base.h"
#include "ref/num/bf16.h"
#include "ref/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = RMSNorm(x) * (1 + w), fp32, not rounded. y may alias x. */
void m3_rmsnorm(float *y, const float *x, const m3_bf16 *w, int n_tok, int dim, float eps);

/* Residual add + norm with the profile's rounding points.
 *   resid [T, D] in/out: on entry r, on exit the new residual s = r + h (bf16(s) when
 *   p->residual_bf16). h [T, D] may be NULL: then s = r (layer 0's input norm, the final
 *   norm; s is still rounded when residual_bf16, a no-op for bf16 inputs).
 *   y [T, D] = norm(s) (norm of the fp32 sum when p->norm_reads_f32_sum), bf16(y) when
 *   p->act_bf16. y must not alias resid or h. */
void m3_rmsnorm_add(float *y, float *resid, const float *h, const m3_bf16 *w, int n_tok,
                    int dim, float eps, const m3_profile *p);

/* Per-head norm in place (q/k/index norms, §3.5): each of the n_head head vectors of
 * head_dim values of each token row (row pitch ld elements) is normalised with the same
 * w [head_dim]. fp32, not rounded (m3_qk_norm_rope in ref/rope.h applies the profile). */
void m3_rmsnorm_heads(float *x, int ld, int n_tok, int n_head, int head_dim, const m3_bf16 *w,
                      float eps);

/* y = x + h elementwise with the profile's residual rounding (bf16 when residual_bf16).
 * The residual add that is not followed by a norm (the last layer's output when no final
 * norm is wanted, tests). y may alias x or h. */
void m3_residual_add(float *y, const float *x, const float *h, int64_t n, const m3_profile *p);

#ifdef __cplusplus
}
#endif
#endif
