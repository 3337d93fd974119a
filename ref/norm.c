/* ref/norm.c: see norm.h. */
#include "ref/norm.h"

#include <math.h>

/* One row: y = (s * rho) * (1 + w). Sum of squares in index order, fp32. */
static void norm_row(float *y, const float *s, const m3_bf16 *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += s[i] * s[i];
    float mu = ss / (float)n;
    float rho = 1.0f / sqrtf(mu + eps);
    for (int i = 0; i < n; i++) y[i] = (s[i] * rho) * (1.0f + m3_bf16_to_f32(w[i]));
}

void m3_rmsnorm(float *y, const float *x, const m3_bf16 *w, int n_tok, int dim, float eps) {
    M3_ASSERT(n_tok >= 0 && dim > 0);
    for (int t = 0; t < n_tok; t++)
        norm_row(y + (size_t)t * dim, x + (size_t)t * dim, w, dim, eps);
}

void m3_rmsnorm_add(float *y, float *resid, const float *h, const m3_bf16 *w, int n_tok,
                    int dim, float eps, const m3_profile *p) {
    M3_ASSERT(n_tok >= 0 && dim > 0 && p);
    M3_ASSERT(y != resid && (h == NULL || y != h));
    for (int t = 0; t < n_tok; t++) {
        float *r = resid + (size_t)t * dim;
        float *yr = y + (size_t)t * dim;
        const float *hr = h ? h + (size_t)t * dim : NULL;
        if (p->norm_reads_f32_sum) {
            /* atom: the fused kernel normalises the fp32 sum; only the stored residual is
             * rounded. y doubles as the fp32 sum buffer before it is overwritten in place. */
            for (int i = 0; i < dim; i++) yr[i] = hr ? r[i] + hr[i] : r[i];
            norm_row(yr, yr, w, dim, eps);
            for (int i = 0; i < dim; i++) {
                float s = hr ? r[i] + hr[i] : r[i];
                r[i] = m3_prof_rnd(p->residual_bf16, s);
            }
        } else {
            /* fp32 / hf: s is (rounded and) stored, then the norm reads the stored value */
            for (int i = 0; i < dim; i++)
                r[i] = m3_prof_rnd(p->residual_bf16, hr ? r[i] + hr[i] : r[i]);
            norm_row(yr, r, w, dim, eps);
        }
        if (p->act_bf16)
            for (int i = 0; i < dim; i++) yr[i] = m3_round_bf16(yr[i]);
    }
}

void m3_rmsnorm_heads(float *x, int ld, int n_tok, int n_head, int head_dim, const m3_bf16 *w,
                      float eps) {
    M3_ASSERT(n_tok >= 0 && n_head > 0 && head_dim > 0 && ld >= n_head * head_dim);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            float *e = x + (size_t)t * ld + (size_t)h * head_dim;
            norm_row(e, e, w, head_dim, eps);
        }
}

void m3_residual_add(float *y, const float *x, const float *h, int64_t n, const m3_profile *p) {
    M3_ASSERT(n >= 0 && p);
    for (int64_t i = 0; i < n; i++) y[i] = m3_prof_rnd(p->residual_bf16, x[i] + h[i]);
}
