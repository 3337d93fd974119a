/* ref/rope.h: partial NeoX rotary embedding, and the q/k norm + rope step (spec §3.5, §3.6).
 *
 * Math: h = R/2. inv[i] = 1/theta^(2i/R) (fp32, p->rope_inv), a = f32(f32(p)*inv[i])
 *   (p->rope_angle), c = cos a, s = sin a (from the angle, evaluated in double and rounded to
 *   fp32; bf16(c), bf16(s) when p->rope_cs_bf16). For i < h, with e the head vector:
 *     e'[i]   = e[i]  *c[i] + (-e[i+h])*s[i]
 *     e'[i+h] = e[i+h]*c[i] +   e[i]  *s[i]
 *   dims R..head_dim-1 pass through. Positions are absolute, 0-based.
 * Shapes: x rows of n_head heads x head_dim (row pitch ld elements, so q/k/index slices of a
 *   packed qkv row work), pos [T] int32 >= 0, R = rot_dim even, R <= head_dim.
 * Numerics: fp32 products and sum in the order above (torch's q*cos + rotate_half(q)*sin);
 *   p->qk_round == M3_QK_ROUND_PER_OP rounds each product and the sum to bf16 (hf);
 *   otherwise no rounding inside the rope. m3_qk_norm_rope applies the whole §3.6 table.
 * docs/numerics.md §3.6. */
#ifndef M3_ROPE_H
#define M3_ROPE_H

#include <stdint.h>

#include "ref/base.h"
#include "ref/num/bf16.h"
#include "ref/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

#define M3_ROPE_MAX_DIM 512 /* largest rot_dim supported (asserted) */

/* inv[i], i < rot_dim/2, per the chosen evaluation (see m3_rope_inv in ref/profile.h). */
void m3_rope_inv_freq(float *inv, int rot_dim, float theta, m3_rope_inv mode);

/* The rotation tables for one position: c[i], s[i] for i < rot_dim/2, from inv (as made
 * by m3_rope_inv_freq), with p->rope_angle and p->rope_cs_bf16 applied. */
void m3_rope_cos_sin(float *c, float *s, int32_t pos, const float *inv, int rot_dim,
                     const m3_profile *p);

/* Rotate every head of every token in place (see the header comment). */
void m3_rope_neox(float *x, int ld, const int32_t *pos, int n_tok, int n_head, int head_dim,
                  int rot_dim, float theta, const m3_profile *p);

/* Per-head Gemma RMSNorm with weight w [head_dim] (shared by all heads) followed by the
 * rope, in place, with the profile's rounding points (§3.6 table):
 *   NONE    fp32 throughout;
 *   PER_OP  bf16(norm) for all dims, then the per-op bf16 rope (hf);
 *   ONCE    fp32 norm and rope, then one bf16 rounding of every dim (atom).
 * Used for q (H heads), k (Hkv), index_q (G) and index_k (1 head). rot_dim may be 0. */
void m3_qk_norm_rope(float *x, int ld, const int32_t *pos, int n_tok, int n_head, int head_dim,
                     const m3_bf16 *w, float eps, int rot_dim, float theta,
                     const m3_profile *p);

#ifdef __cplusplus
}
#endif
#endif
