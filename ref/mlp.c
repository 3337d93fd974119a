/* ref/mlp.c: see mlp.h. */
#include "ref/mlp.h"

#include "ref/num/act.h"

void m3_swiglu(float *a, const float *g, const float *u, int64_t n, float alpha, float limit,
               const m3_profile *p) {
    M3_ASSERT(n >= 0 && p);
    switch (p->swiglu) {
    case M3_SWIGLU_BF16_PER_OP:
        for (int64_t i = 0; i < n; i++) a[i] = m3_swiglu_oai_bf16ops(g[i], u[i], alpha, limit);
        break;
    case M3_SWIGLU_BF16_ONCE:
        for (int64_t i = 0; i < n; i++) a[i] = m3_round_bf16(m3_swiglu_oai(g[i], u[i], alpha, limit));
        break;
    default:
        for (int64_t i = 0; i < n; i++) a[i] = m3_swiglu_oai(g[i], u[i], alpha, limit);
    }
}

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t m3_mlp_scratch_bytes(int n_tok, const m3_mlp_params *mp) {
    size_t gu = al64((size_t)n_tok * (size_t)mp->ffn * sizeof(float));
    int kmax = mp->dim > mp->ffn ? mp->dim : mp->ffn;
    return 2 * gu + m3_linear_q_scratch_bytes(n_tok, kmax);
}

void m3_mlp_pass(float *y, const float *x, int n_tok, int n_pass, const m3_mlp_weights *w,
                 const m3_mlp_params *mp, const m3_profile *p, void *scratch) {
    M3_ASSERT(w && mp && p && n_tok >= 0 && mp->dim > 0 && mp->ffn > 0);
    M3_ASSERT(w->gate && w->up && w->down && y != x);
    if (n_tok == 0) return;
    M3_ASSERT(scratch);
    int D = mp->dim, F = mp->ffn;
    size_t gu = al64((size_t)n_tok * (size_t)F * sizeof(float));
    float *g = scratch, *u = (float *)(void *)((char *)scratch + gu);
    void *qs = (char *)scratch + 2 * gu;
    m3_wmat wg = {w->fmt, w->gate, F, D}, wu = {w->fmt, w->up, F, D};
    m3_wmat wd = {w->fmt, w->down, D, F};
    /* bf16 GEMM outputs under act_bf16; quantized formats quantize x per their m3_wq act
     * (twice for gate and up, identically: the serving path quantizes it once for the
     * fused gate|up GEMM) */
    m3_linear_q(g, F, x, D, &wg, n_tok, n_pass, p, qs);
    m3_linear_q(u, F, x, D, &wu, n_tok, n_pass, p, qs);
    m3_swiglu(g, g, u, (int64_t)n_tok * F, mp->alpha, mp->limit, p);
    m3_linear_q(y, D, g, F, &wd, n_tok, n_pass, p, qs);
}

void m3_mlp(float *y, const float *x, int n_tok, const m3_mlp_weights *w, const m3_mlp_params *mp,
            const m3_profile *p, void *scratch) {
    m3_mlp_pass(y, x, n_tok, n_tok, w, mp, p, scratch);
}
