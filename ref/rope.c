/* ref/rope.c: see rope.h. */
#include "ref/rope.h"

#include <math.h>

#include "ref/norm.h"

void m3_rope_inv_freq(float *inv, int rot_dim, float theta, m3_rope_inv mode) {
    M3_ASSERT(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= M3_ROPE_MAX_DIM && theta > 0);
    for (int i = 0; i < rot_dim / 2; i++) {
        if (mode == M3_ROPE_INV_F64) {
            inv[i] = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)rot_dim));
        } else {
            /* torch: arange(0,R,2).float() / R in fp32, base ** that in fp32 (pow evaluated
             * in double and rounded once: correctly rounded in practice, torch's is <= 1
             * ulp), then 1.0 / x as fp32 reciprocal. */
            float e = (float)(2 * i) / (float)rot_dim;
            float pw = (float)pow((double)theta, (double)e);
            inv[i] = 1.0f / pw;
        }
    }
}

void m3_rope_cos_sin(float *c, float *s, int32_t pos, const float *inv, int rot_dim,
                     const m3_profile *p) {
    M3_ASSERT(pos >= 0 && rot_dim % 2 == 0);
    for (int i = 0; i < rot_dim / 2; i++) {
        double a;
        if (p->rope_angle == M3_ROPE_ANGLE_F64)
            a = (double)pos * (double)inv[i];
        else
            a = (double)((float)pos * inv[i]); /* f32(f32(p) * inv): one fp32 product */
        /* cos/sin of the (fp32) angle, evaluated in double and rounded once */
        c[i] = m3_prof_rnd(p->rope_cs_bf16, (float)cos(a));
        s[i] = m3_prof_rnd(p->rope_cs_bf16, (float)sin(a));
    }
}

/* Rotate one head vector e (first rot_dim dims) with tables c, s. per_op: hf's bf16 after
 * each product and after the sum. */
static void rope_head(float *e, const float *c, const float *s, int half, bool per_op) {
    for (int i = 0; i < half; i++) {
        float x1 = e[i], x2 = e[i + half];
        /* torch: q*cos + rotate_half(q)*sin, rotate_half(q) = [-x2, x1] */
        float a1 = m3_prof_rnd(per_op, x1 * c[i]);
        float b1 = m3_prof_rnd(per_op, (-x2) * s[i]);
        float a2 = m3_prof_rnd(per_op, x2 * c[i]);
        float b2 = m3_prof_rnd(per_op, x1 * s[i]);
        e[i] = m3_prof_rnd(per_op, a1 + b1);
        e[i + half] = m3_prof_rnd(per_op, a2 + b2);
    }
}

void m3_rope_neox(float *x, int ld, const int32_t *pos, int n_tok, int n_head, int head_dim,
                  int rot_dim, float theta, const m3_profile *p) {
    M3_ASSERT(n_tok >= 0 && n_head > 0 && head_dim > 0 && ld >= n_head * head_dim && p);
    M3_ASSERT(rot_dim >= 0 && rot_dim % 2 == 0 && rot_dim <= head_dim &&
              rot_dim <= M3_ROPE_MAX_DIM);
    if (rot_dim == 0) return;
    float inv[M3_ROPE_MAX_DIM / 2], c[M3_ROPE_MAX_DIM / 2], s[M3_ROPE_MAX_DIM / 2];
    m3_rope_inv_freq(inv, rot_dim, theta, p->rope_inv);
    bool per_op = p->qk_round == M3_QK_ROUND_PER_OP;
    for (int t = 0; t < n_tok; t++) {
        m3_rope_cos_sin(c, s, pos[t], inv, rot_dim, p);
        for (int h = 0; h < n_head; h++)
            rope_head(x + (size_t)t * ld + (size_t)h * head_dim, c, s, rot_dim / 2, per_op);
    }
}

void m3_qk_norm_rope(float *x, int ld, const int32_t *pos, int n_tok, int n_head, int head_dim,
                     const m3_bf16 *w, float eps, int rot_dim, float theta,
                     const m3_profile *p) {
    M3_ASSERT(p);
    m3_rmsnorm_heads(x, ld, n_tok, n_head, head_dim, w, eps);
    if (p->qk_round == M3_QK_ROUND_PER_OP) /* hf: the norm module returns bf16 */
        for (int t = 0; t < n_tok; t++)
            m3_round_bf16_n(x + (size_t)t * ld, (int64_t)n_head * head_dim);
    m3_rope_neox(x, ld, pos, n_tok, n_head, head_dim, rot_dim, theta, p);
    if (p->qk_round == M3_QK_ROUND_ONCE) /* atom: one rounding after norm + rope */
        for (int t = 0; t < n_tok; t++)
            m3_round_bf16_n(x + (size_t)t * ld, (int64_t)n_head * head_dim);
}
