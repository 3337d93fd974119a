/* ref/moe.c: see moe.h. */
#include "ref/moe.h"

#include <math.h>
#include <string.h>

#include "ref/num/act.h"

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

size_t m3_moe_scratch_bytes(int n_tok, const m3_moe_params *mp) {
    M3_ASSERT(mp && n_tok >= 0);
    size_t T = (size_t)n_tok, D = (size_t)mp->dim;
    size_t F = (size_t)(mp->ffn > mp->shared_ffn ? mp->ffn : mp->shared_ffn);
    m3_mlp_params ep = {mp->dim, (int)F, mp->alpha, mp->limit};
    size_t floats = align16(T * D) * 2 + align16(m3_mlp_scratch_bytes(n_tok, &ep) / 4 + 16);
    size_t ints = align16((size_t)mp->n_expert + 1) + align16(T * (size_t)mp->top_k);
    return (floats + ints) * 4;
}

m3_mlp_params m3_moe_shared_params(const m3_moe_params *mp) {
    m3_mlp_params sp = {mp->dim, mp->shared_ffn, mp->alpha, mp->limit};
    return sp;
}

void m3_moe_router_logits(float *logits, const float *x, int n_tok, const float *gate,
                          const m3_moe_params *mp, const m3_profile *p, void *scratch) {
    M3_ASSERT(mp && p && gate && n_tok >= 0);
    if (n_tok == 0) return;
    int D = mp->dim, E = mp->n_expert;
    if (p->router_dtype == M3_DT_BF16) {
        /* the gate held in bf16: x cast to bf16, bf16 GEMM, bf16 logits */
        M3_ASSERT(scratch);
        float *xb = scratch;
        memcpy(xb, x, sizeof(float) * (size_t)n_tok * D);
        m3_round_bf16_n(xb, (int64_t)n_tok * D);
        m3_linear_f32(logits, E, xb, D, gate, true, n_tok, D, E);
        m3_round_bf16_n(logits, (int64_t)n_tok * E);
    } else {
        m3_linear_f32(logits, E, x, D, gate, false, n_tok, D, E);
    }
}

/* a ranks before b: value desc, NaN highest, then the lower expert id */
static bool before(float va, int a, float vb, int b) {
    bool na = isnan(va), nb = isnan(vb);
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return a < b;
}

void m3_moe_route(int32_t *ids, float *wts, float *margin, const float *logits,
                  const float *bias, int n_tok, const m3_moe_params *mp, const m3_profile *p) {
    M3_ASSERT(mp && p && n_tok >= 0);
    int E = mp->n_expert, K = mp->top_k;
    M3_ASSERT(E > 0 && K >= 1 && K <= E && E <= 4096);
    float sig[4096], sel[4096];
    int32_t ord[4096];
    for (int t = 0; t < n_tok; t++) {
        const float *l = logits + (size_t)t * E;
        for (int e = 0; e < E; e++) {
            sig[e] = m3_sigmoidf(l[e]); /* fp32 sigmoid of float(l) */
            /* the bias only steers the choice; held in the router dtype */
            float b = bias ? bias[e] : 0.0f;
            if (p->router_dtype == M3_DT_BF16) b = m3_round_bf16(b);
            sel[e] = sig[e] + b;
            ord[e] = e;
        }
        int need = K + 1 < E ? K + 1 : E;
        for (int r = 0; r < need; r++) {
            int best = r;
            for (int c = r + 1; c < E; c++)
                if (before(sel[ord[c]], ord[c], sel[ord[best]], ord[best])) best = c;
            int32_t tmp = ord[r];
            ord[r] = ord[best];
            ord[best] = tmp;
        }
        float sum = 0.0f;
        for (int k = 0; k < K; k++) sum += sig[ord[k]];
        for (int k = 0; k < K; k++) {
            ids[(size_t)t * K + k] = ord[k];
            wts[(size_t)t * K + k] = sig[ord[k]] / sum; /* before routed_scaling_factor */
        }
        if (margin) margin[t] = K < E ? sel[ord[K - 1]] - sel[ord[K]] : INFINITY;
    }
}

static m3_status experts(float *y, const float *x, const int32_t *ids, const float *wts,
                         int n_tok, const m3_moe_weights *w, const m3_moe_params *mp,
                         const m3_profile *p, void *scratch, bool fused) {
    M3_ASSERT(w && mp && p && n_tok >= 0 && y != x);
    int E = mp->n_expert, K = mp->top_k, D = mp->dim, F = mp->ffn;
    const int FS = mp->shared_ffn > F ? mp->shared_ffn : F;
    for (int t = 0; t < n_tok; t++)
        for (int k = 0; k < K; k++) {
            int e = ids[(size_t)t * K + k];
            if (e < 0 || e >= E)
                return m3_errorf(M3_ERR_ARG, "expert_ids[%d][%d] = %d outside [0, %d)", t, k, e,
                                 E);
            for (int k2 = 0; k2 < k; k2++)
                if (ids[(size_t)t * K + k2] == e)
                    return m3_errorf(M3_ERR_ARG, "expert_ids[%d]: expert %d selected twice", t,
                                     e);
        }
    if (n_tok == 0) return M3_OK;
    M3_ASSERT(scratch && w->experts);
    size_t T = (size_t)n_tok;
    float *xe = scratch;                   /* [T, D] gathered rows of one expert */
    float *ye = xe + align16(T * D);       /* [T, D] that expert's output rows */
    float *ms = ye + align16(T * D);       /* the expert MLP's scratch */
    m3_mlp_params msp = {D, FS, mp->alpha, mp->limit};
    int32_t *off = (int32_t *)(ms + align16(m3_mlp_scratch_bytes(n_tok, &msp) / 4 + 16));
    /* [E+1] counting-sort offsets */
    int32_t *ent = off + align16((size_t)E + 1);    /* [T*K] (t*K + k), grouped by expert */
    /* group (token, slot) pairs by expert; within an expert, tokens ascend */
    memset(off, 0, sizeof(int32_t) * ((size_t)E + 1));
    for (size_t i = 0; i < T * K; i++) off[ids[i] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    {
        int32_t fill[4096];
        M3_ASSERT(E <= 4096);
        memcpy(fill, off, sizeof(int32_t) * (size_t)E);
        for (size_t i = 0; i < T * K; i++) ent[fill[ids[i]]++] = (int32_t)i;
    }
    /* R accumulates in y, expert by expert in ascending id: for each token that is its
     * contributions in ascending expert id, starting from 0 (HF's index_add_ order) */
    memset(y, 0, sizeof(float) * T * D);
    m3_mlp_params ep = {D, F, mp->alpha, mp->limit};
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (n == 0) continue;
        const m3_mlp_weights *we = &w->experts[e];
        for (int r = 0; r < n; r++) {
            int t = ent[off[e] + r] / K;
            memcpy(xe + (size_t)r * D, x + (size_t)t * D, sizeof(float) * (size_t)D);
        }
        m3_mlp_pass(ye, xe, n, n_tok, we, &ep, p, ms);
        for (int r = 0; r < n; r++) {
            int i = ent[off[e] + r], t = i / K;
            /* fused shared expert: rsf folded into the routing weight */
            float wk = fused ? wts[i] * mp->routed_scale : wts[i];
            float *yr = y + (size_t)t * D;
            const float *er = ye + (size_t)r * D;
            if (p->moe_bf16_combine)
                for (int d = 0; d < D; d++) yr[d] = m3_round_bf16(yr[d] + m3_round_bf16(er[d] * wk));
            else
                for (int d = 0; d < D; d++) yr[d] += er[d] * wk;
        }
    }
    bool rnd = p->moe_bf16_combine || p->act_bf16;
    if (fused && mp->shared_ffn > 0) {
        /* the shared expert as expert #E over every token, weight 1.0, added last */
        m3_mlp_params sp = m3_moe_shared_params(mp);
        m3_mlp_pass(ye, x, n_tok, n_tok, &w->shared, &sp, p, ms);
        for (size_t i = 0; i < T * D; i++)
            y[i] = p->moe_bf16_combine ? m3_round_bf16(y[i] + ye[i]) : y[i] + ye[i];
    }
    if (fused) {
        for (size_t i = 0; i < T * D; i++) y[i] = m3_prof_rnd(rnd, y[i]);
        return M3_OK;
    }
    /* routed_scaling_factor multiplies the routed sum only; bf16(2R) is exact */
    for (size_t i = 0; i < T * D; i++) y[i] = m3_prof_rnd(rnd, mp->routed_scale * y[i]);
    return M3_OK;
}

void m3_moe_add_shared(float *y, const float *s, int64_t n, const m3_profile *p) {
    M3_ASSERT(n >= 0 && p);
    for (int64_t i = 0; i < n; i++) y[i] = m3_prof_rnd(p->act_bf16, y[i] + s[i]);
}

m3_status m3_moe_experts(float *y, const float *x, const int32_t *ids, const float *wts,
                         int n_tok, const m3_moe_weights *w, const m3_moe_params *mp,
                         const m3_profile *p, void *scratch) {
    return experts(y, x, ids, wts, n_tok, w, mp, p, scratch, false);
}

m3_status m3_moe_experts_fused(float *y, const float *x, const int32_t *ids, const float *wts,
                               int n_tok, const m3_moe_weights *w, const m3_moe_params *mp,
                               const m3_profile *p, void *scratch) {
    return experts(y, x, ids, wts, n_tok, w, mp, p, scratch, true);
}
