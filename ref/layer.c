/* ref/layer.c: see layer.h. Wiring only: every number is computed by a component. */
#include "ref/layer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/norm.h"
#include "ref/qload.h"
#include "ref/rope.h"

/* ---- keys and dtypes ------------------------------------------------------------------- */

void m3_layer_key(char *buf, const char *prefix, int n_layer, int layer, const char *stage) {
    int n = snprintf(buf, M3_KEY_MAX, "%slayers/%0*d/%s", prefix ? prefix : "",
                     n_layer >= 100 ? 3 : 2, layer, stage);
    M3_ASSERT(n > 0 && n < M3_KEY_MAX);
}

const char *m3_stage_dtype(const m3_profile *p, const char *s) {
    bool b;
    if (!strcmp(s, "input") || !strcmp(s, "output"))
        b = p->residual_bf16;
    else if (!strcmp(s, "q") || !strcmp(s, "k") || !strcmp(s, "index_q") || !strcmp(s, "index_k"))
        b = p->qk_round != M3_QK_ROUND_NONE;
    else if (!strcmp(s, "attn_out"))
        b = p->attn_out_bf16;
    else if (!strcmp(s, "router_logits"))
        b = p->router_dtype == M3_DT_BF16;
    else if (!strcmp(s, "expert_weights") || !strcmp(s, "index_scores"))
        b = false;
    else
        b = p->act_bf16; /* embed, norms, projections, v, attn_proj, MLP outputs, logits */
    return b ? "bfloat16" : "float32";
}

/* ---- weights --------------------------------------------------------------------------- */

static m3_status own(m3_layer_weights *lw, void *p) {
    if (!p) return m3_errorf(M3_ERR_NOMEM, "layer %d: out of memory converting weights", lw->layer);
    if (lw->n_owned == (int)(sizeof lw->owned / sizeof lw->owned[0])) {
        free(p);
        return m3_errorf(M3_ERR_UNSUPPORTED, "layer %d: too many converted weights", lw->layer);
    }
    lw->owned[lw->n_owned++] = p;
    return M3_OK;
}

/* A norm weight [n] as bf16. Other float dtypes are converted when every value is exactly a
 * bf16 (the components hold norm weights in bf16; a lossy conversion would change the math). */
static m3_status get_norm(m3_layer_weights *lw, m3_weights *w, m3_wrole role, int layer, int n,
                          const m3_bf16 **out) {
    m3_tensor t;
    char name[512];
    m3_weight_name(name, sizeof name, role, layer, -1);
    M3_TRY(m3_weights_role_get(w, role, layer, -1, &t));
    if (m3_tensor_numel(&t) != n)
        return m3_errorf(M3_ERR_SHAPE, "tensor %s has %lld elements, config implies %d", name,
                         (long long)m3_tensor_numel(&t), n);
    if (t.dtype == M3_DT_BF16) {
        *out = t.data;
        return M3_OK;
    }
    float *f = malloc((size_t)n * sizeof *f);
    m3_bf16 *b = malloc((size_t)n * sizeof *b);
    if (!f || !b) {
        free(f);
        free(b);
        return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", name);
    }
    m3_status s = m3_tensor_rows_f32(&t, 0, 1, f);
    for (int i = 0; !s && i < n; i++) {
        b[i] = m3_f32_to_bf16(f[i]);
        if (m3_bf16_to_f32(b[i]) != f[i] && !isnan(f[i]))
            s = m3_errorf(M3_ERR_UNSUPPORTED,
                          "tensor %s (%s): value %g at %d is not a bf16 number; norm weights "
                          "are held in bf16",
                          name, m3_dtype_name(t.dtype), (double)f[i], i);
    }
    free(f);
    if (s) {
        free(b);
        return s;
    }
    M3_TRY(own(lw, b));
    *out = b;
    return M3_OK;
}

/* A linear [rows, cols] as an m3_wmat: BF16 and F32 borrowed, F16 converted to fp32 (exact);
 * `want_f32` forces fp32 (mixed-format MLP triples). */
static m3_status get_lin(m3_layer_weights *lw, m3_weights *w, m3_wrole role, int layer, int expert,
                         int rows, int cols, bool want_f32, m3_wmat *out) {
    m3_linear_w l;
    char name[512];
    m3_weight_name(name, sizeof name, role, layer, expert);
    M3_TRY(m3_weights_linear(w, role, layer, expert, &l));
    if (l.fmt != M3_WF_DENSE)
        return m3_errorf(M3_ERR_UNSUPPORTED,
                         "tensor %s is MX-quantized; quantized checkpoints are not supported by "
                         "the reference yet",
                         name);
    if (l.rows != rows || l.cols != cols)
        return m3_errorf(M3_ERR_SHAPE, "tensor %s has shape [%lld, %lld], config implies [%d, %d]",
                         name, (long long)l.rows, (long long)l.cols, rows, cols);
    out->n_out = rows;
    out->n_in = cols;
    if (l.w.dtype == M3_DT_BF16 && !want_f32) {
        out->fmt = M3_WFMT_BF16;
        out->data = l.w.data;
        return M3_OK;
    }
    if (l.w.dtype == M3_DT_F32) {
        out->fmt = M3_WFMT_F32;
        out->data = l.w.data;
        return M3_OK;
    }
    float *f = malloc((size_t)rows * (size_t)cols * sizeof *f);
    if (!f) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", name);
    m3_status s = m3_tensor_rows_f32(&l.w, 0, rows, f);
    if (s) {
        free(f);
        return s;
    }
    M3_TRY(own(lw, f));
    out->fmt = M3_WFMT_F32;
    out->data = f;
    return M3_OK;
}

/* The three matrices of a swiglu MLP in one format (bf16 when all three are stored bf16). */
static m3_status get_mlp(m3_layer_weights *lw, m3_weights *w, m3_wrole rg, m3_wrole ru, m3_wrole rd,
                         int layer, int expert, int dim, int ffn, m3_mlp_weights *out) {
    char name[512];
    bool all_bf16 = true;
    m3_wrole roles[3] = {rg, ru, rd};
    for (int i = 0; i < 3; i++) {
        m3_weight_name(name, sizeof name, roles[i], layer, expert);
        const m3_tensor_info *ti = m3_weights_find(w, name);
        if (!ti) return m3_errorf(M3_ERR_MISSING, "missing tensor %s", name);
        if (ti->dtype != M3_DT_BF16) all_bf16 = false;
    }
    m3_wmat g, u, d;
    M3_TRY(get_lin(lw, w, rg, layer, expert, ffn, dim, !all_bf16, &g));
    M3_TRY(get_lin(lw, w, ru, layer, expert, ffn, dim, !all_bf16, &u));
    M3_TRY(get_lin(lw, w, rd, layer, expert, dim, ffn, !all_bf16, &d));
    out->fmt = all_bf16 ? M3_WFMT_BF16 : M3_WFMT_F32;
    out->gate = g.data;
    out->up = u.data;
    out->down = d.data;
    return M3_OK;
}

/* Router gate [E, D] or bias [E] as fp32 (the checkpoint stores F32; a bf16-cast save is
 * converted exactly). */
static m3_status get_f32(m3_layer_weights *lw, m3_weights *w, m3_wrole role, int layer,
                         int64_t numel, const float **out) {
    m3_tensor t;
    char name[512];
    m3_weight_name(name, sizeof name, role, layer, -1);
    M3_TRY(m3_weights_role_get(w, role, layer, -1, &t));
    if (m3_tensor_numel(&t) != numel)
        return m3_errorf(M3_ERR_SHAPE, "tensor %s has %lld elements, config implies %lld", name,
                         (long long)m3_tensor_numel(&t), (long long)numel);
    if (t.dtype == M3_DT_F32) {
        *out = t.data;
        return M3_OK;
    }
    int64_t rows = t.rank >= 1 ? t.shape[0] : 1;
    float *f = malloc((size_t)numel * sizeof *f);
    if (!f) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", name);
    m3_status s = m3_tensor_rows_f32(&t, 0, rows, f);
    if (s) {
        free(f);
        return s;
    }
    M3_TRY(own(lw, f));
    *out = f;
    return M3_OK;
}

m3_status m3_layer_weights_load(m3_layer_weights *lw, m3_weights *w, const m3_config *c, int L) {
    return m3_layer_weights_load_v(lw, w, c, L, NULL, NULL);
}

/* An expert-like swiglu MLP (routed expert e, or shared with e = -1) in the variant's format:
 * plain (get_mlp) or through ref/qload. *fmt: the format used. */
static m3_status get_xmlp(m3_layer_weights *lw, m3_weights *w, m3_wrole rg, m3_wrole ru,
                          m3_wrole rd, int L, int e, int D, int F, const m3_variant *v,
                          m3_mlp_weights *out, m3_wfmt *fmt) {
    M3_TRY(m3_qload_mlp_fmt(w, rg, L, e, v, fmt));
    if (*fmt == M3_WFMT_BF16) return get_mlp(lw, w, rg, ru, rd, L, e, D, F, out);
    if (!lw->qs) M3_TRY(m3_qstore_create(&lw->qs, v));
    return m3_qload_mlp(out, lw->qs, w, rg, ru, rd, L, e, D, F, *fmt, v);
}

/* ptpc fp8 (spec §3.3): every dense projection of the layer, NOT the MoE (router, experts,
 * shared), lm_head or embedding. */
static m3_status ptpc_layer(m3_layer_weights *lw, const m3_config *c, const m3_variant *v) {
    if (!lw->qs) M3_TRY(m3_qstore_create(&lw->qs, v));
    m3_wmat *pr[] = {&lw->q, &lw->k, &lw->v, &lw->o, &lw->index_q, &lw->index_k};
    for (int i = 0; i < (lw->is_sparse ? 6 : 4); i++) M3_TRY(m3_qload_ptpc(pr[i], lw->qs));
    if (!lw->is_moe) M3_TRY(m3_qload_ptpc_mlp(&lw->mlp, lw->qs, c->hidden, c->dense_inter));
    return M3_OK;
}

m3_status m3_layer_weights_load_v(m3_layer_weights *lw, m3_weights *w, const m3_config *c, int L,
                                  const m3_variant *var, const m3_profile *prof) {
    memset(lw, 0, sizeof *lw);
    m3_variant vdef;
    m3_variant_default(&vdef);
    const m3_variant *v = var ? var : &vdef;
    lw->layer = L;
    lw->is_sparse = c->layer_sparse[L];
    lw->is_moe = c->layer_moe[L];
    int D = c->hidden, H = c->n_head, Hkv = c->n_kv_head, Dh = c->head_dim;
    m3_status s;
#define TRY_(e)                                                                                    \
    do {                                                                                           \
        if ((s = (e)) != M3_OK) goto fail;                                                         \
    } while (0)
    TRY_(get_norm(lw, w, M3_W_IN_NORM, L, D, &lw->in_norm));
    TRY_(get_norm(lw, w, M3_W_POST_NORM, L, D, &lw->post_norm));
    TRY_(get_lin(lw, w, M3_W_Q_PROJ, L, -1, H * Dh, D, false, &lw->q));
    TRY_(get_lin(lw, w, M3_W_K_PROJ, L, -1, Hkv * Dh, D, false, &lw->k));
    TRY_(get_lin(lw, w, M3_W_V_PROJ, L, -1, Hkv * Dh, D, false, &lw->v));
    TRY_(get_lin(lw, w, M3_W_O_PROJ, L, -1, D, H * Dh, false, &lw->o));
    TRY_(get_norm(lw, w, M3_W_Q_NORM, L, Dh, &lw->q_norm));
    TRY_(get_norm(lw, w, M3_W_K_NORM, L, Dh, &lw->k_norm));
    if (lw->is_sparse) {
        int G = c->index_n_heads, Di = c->index_head_dim;
        TRY_(get_lin(lw, w, M3_W_INDEX_Q_PROJ, L, -1, G * Di, D, false, &lw->index_q));
        TRY_(get_lin(lw, w, M3_W_INDEX_K_PROJ, L, -1, Di, D, false, &lw->index_k));
        TRY_(get_norm(lw, w, M3_W_INDEX_Q_NORM, L, Di, &lw->index_q_norm));
        TRY_(get_norm(lw, w, M3_W_INDEX_K_NORM, L, Di, &lw->index_k_norm));
    }
    if (!lw->is_moe) {
        TRY_(get_mlp(lw, w, M3_W_MLP_GATE, M3_W_MLP_UP, M3_W_MLP_DOWN, L, -1, D, c->dense_inter,
                     &lw->mlp));
    } else {
        int E = c->n_expert;
        TRY_(get_f32(lw, w, M3_W_ROUTER, L, (int64_t)E * D, &lw->moe.gate));
        char name[512];
        m3_weight_name(name, sizeof name, M3_W_ROUTER_BIAS, L, -1);
        if (m3_weights_find(w, name)) TRY_(get_f32(lw, w, M3_W_ROUTER_BIAS, L, E, &lw->moe.bias));
        lw->experts_owned = calloc((size_t)E, sizeof *lw->experts_owned);
        if (!lw->experts_owned) {
            s = m3_errorf(M3_ERR_NOMEM, "layer %d: out of memory", L);
            goto fail;
        }
        m3_wfmt xf = M3_WFMT_BF16, f;
        for (int e = 0; e < E; e++) {
            TRY_(get_xmlp(lw, w, M3_W_EXPERT_GATE, M3_W_EXPERT_UP, M3_W_EXPERT_DOWN, L, e, D,
                          c->expert_inter, v, &lw->experts_owned[e], &f));
            if (e == 0) xf = f;
        }
        lw->moe.experts = lw->experts_owned;
        if (c->n_shared_experts > 0 && c->shared_inter > 0)
            TRY_(get_xmlp(lw, w, M3_W_SHARED_GATE, M3_W_SHARED_UP, M3_W_SHARED_DOWN, L, -1, D,
                          c->shared_inter, v, &lw->moe.shared, &f));
        /* spec §3.14: ATOM fuses the shared expert when the experts are MX-quantized */
        bool xq = xf == M3_WFMT_MXFP4 || xf == M3_WFMT_MXFP8;
        lw->shared_fused = c->n_shared_experts > 0 && c->shared_inter > 0 &&
                               (v->shared_fused == M3_TRI_ON ||
                                (v->shared_fused == M3_TRI_AUTO && xq && prof &&
                                 prof->id == M3_PROFILE_ATOM));
    }
    if (v->ptpc) TRY_(ptpc_layer(lw, c, v));
#undef TRY_
    return M3_OK;
fail:
    m3_layer_weights_free(lw);
    return m3_error_context(s, "layer %d", L);
}

void m3_layer_weights_free(m3_layer_weights *lw) {
    if (!lw) return;
    for (int i = 0; i < lw->n_owned; i++)
        free(lw->owned[i]);
    free(lw->experts_owned);
    m3_qstore_free(lw->qs);
    lw->n_owned = 0;
    lw->experts_owned = NULL;
    lw->qs = NULL;
}

/* ---- cache ----------------------------------------------------------------------------- */

m3_status m3_layer_cache_reserve(m3_layer_cache *c, const m3_config *cfg, bool sparse, int need) {
    if (need <= c->cap) return M3_OK;
    int cap = c->cap > 0 ? c->cap : 64;
    while (cap < need)
        cap = cap > (1 << 29) ? need : cap * 2;
    size_t kv = (size_t)cfg->n_kv_head * (size_t)cfg->head_dim;
    float *k = realloc(c->k, (size_t)cap * kv * sizeof(float));
    if (!k) return m3_errorf(M3_ERR_NOMEM, "KV cache of %d tokens: out of memory", cap);
    c->k = k;
    float *v = realloc(c->v, (size_t)cap * kv * sizeof(float));
    if (!v) return m3_errorf(M3_ERR_NOMEM, "KV cache of %d tokens: out of memory", cap);
    c->v = v;
    if (sparse) {
        float *ik = realloc(c->index_k, (size_t)cap * (size_t)cfg->index_head_dim * sizeof(float));
        if (!ik) return m3_errorf(M3_ERR_NOMEM, "index cache of %d tokens: out of memory", cap);
        c->index_k = ik;
    }
    c->cap = cap;
    return M3_OK;
}

void m3_layer_cache_free(m3_layer_cache *c) {
    if (!c) return;
    free(c->k);
    free(c->v);
    free(c->index_k);
    memset(c, 0, sizeof *c);
}

/* ---- scratch --------------------------------------------------------------------------- */

#define ALIGN_UP(n) (((n) + 63) & ~(size_t)63)

typedef struct {
    char *base;
    size_t used, cap;
} arena;

static void *take(arena *a, size_t bytes) {
    size_t b = ALIGN_UP(bytes);
    M3_ASSERTF(a->used + b <= a->cap, "layer scratch too small (%zu + %zu > %zu)", a->used, b,
               a->cap);
    void *p = a->base + a->used;
    a->used += b;
    return p;
}

static void layer_params(const m3_config *c, m3_attn_params *ap, m3_indexer_params *ip,
                         m3_moe_params *mp, m3_mlp_params *dp) {
    m3_attn_params_init(ap, c->n_head, c->n_kv_head, c->head_dim);
    ip->n_index_head = c->index_n_heads;
    ip->index_head_dim = c->index_head_dim;
    ip->block = c->index_block;
    ip->topk = c->index_topk;
    ip->local_blocks = c->index_local;
    ip->init_blocks = c->index_init;
    mp->n_expert = c->n_expert;
    mp->top_k = c->top_k;
    mp->dim = c->hidden;
    mp->ffn = c->expert_inter;
    mp->shared_ffn = c->n_shared_experts > 0 ? c->shared_inter : 0;
    mp->routed_scale = c->routed_scale;
    mp->alpha = c->swiglu_alpha;
    mp->limit = c->swiglu_limit;
    dp->dim = c->hidden;
    dp->ffn = c->dense_inter;
    dp->alpha = c->swiglu_alpha;
    dp->limit = c->swiglu_limit;
}

size_t m3_layer_scratch_bytes(const m3_config *c, int L, int T, int n_ctx) {
    m3_attn_params ap;
    m3_indexer_params ip;
    m3_moe_params mp;
    m3_mlp_params dp;
    layer_params(c, &ap, &ip, &mp, &dp);
    size_t t = (size_t)T, D = (size_t)c->hidden, QW = (size_t)c->n_head * c->head_dim;
    size_t f = sizeof(float), n = 0;
    n += ALIGN_UP(t * D * f);  /* xn (attn_norm, then mlp_norm) */
    n += ALIGN_UP(t * QW * f); /* q_proj -> q */
    n += ALIGN_UP(t * QW * f); /* attn_out */
    n += ALIGN_UP(t * D * f);  /* attn_proj; then the output tap */
    n += ALIGN_UP(m3_attn_scratch_bytes(n_ctx, &ap));
    n += ALIGN_UP(m3_linear_q_scratch_bytes(T, (int)(QW > D ? QW : D))); /* ptpc activations */
    if (c->layer_sparse[L]) {
        size_t G = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
        size_t NB = ((size_t)n_ctx + (size_t)ip.block - 1) / (size_t)ip.block;
        n += ALIGN_UP(t * G * Di * f);                                                /* index_q */
        n += ALIGN_UP(G * t * (size_t)(ip.topk > 0 ? ip.topk : 1) * sizeof(int32_t)); /* topk */
        n += ALIGN_UP(G * t * NB * f); /* index_scores */
        n += ALIGN_UP(G * t * f);      /* margin */
        n += ALIGN_UP(m3_indexer_scratch_bytes(n_ctx, &ip));
    }
    if (c->layer_moe[L]) {
        size_t E = (size_t)c->n_expert, K = (size_t)c->top_k;
        n += ALIGN_UP(t * E * f) + 2 * ALIGN_UP(t * K * 4) + ALIGN_UP(t * f);
        n += ALIGN_UP(t * D * f); /* shared_out */
        n += ALIGN_UP(m3_moe_scratch_bytes(T, &mp));
        m3_mlp_params sp = m3_moe_shared_params(&mp);
        if (sp.ffn > 0) n += ALIGN_UP(m3_mlp_scratch_bytes(T, &sp));
    } else {
        n += ALIGN_UP(m3_mlp_scratch_bytes(T, &dp));
    }
    return n + 64;
}

size_t m3_layer_paged_scratch_bytes(const m3_config *c, int L, int T, int n_ctx) {
    m3_attn_params ap;
    m3_indexer_params ip;
    m3_moe_params mp;
    m3_mlp_params dp;
    layer_params(c, &ap, &ip, &mp, &dp);
    size_t t = (size_t)T, f = sizeof(float), n = 0;
    size_t KW = (size_t)c->n_kv_head * c->head_dim;
    m3_kv_geom g;
    m3_kv_geom_init(&g, c->n_kv_head, c->head_dim, c->index_block, 0, M3_KV_BF16, M3_FP8_E4M3FN);
    n += ALIGN_UP(t * KW * f); /* fp32 k before its rounding (fp8 writers) */
    n += ALIGN_UP(m3_attn_paged_scratch_bytes(n_ctx, ip.topk, &ap, &g));
    if (c->layer_sparse[L]) {
        size_t G = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
        n += ALIGN_UP((size_t)n_ctx * Di * f); /* index keys gathered through the cache */
        n += ALIGN_UP(t * G * Di * f);         /* fp8 index query (prefill) */
        n += ALIGN_UP(t * Di * f);             /* reuse layers: index_k projection */
    }
    return n + 64;
}

/* ---- forward --------------------------------------------------------------------------- */

typedef struct {
    const m3_hooks *h;
    const char *prefix;
    int n_layer, layer;
    const m3_profile *p;
} tapper;

static m3_status tap(const tapper *tp, const char *stage, m3_dtype dt, const void *data, int rank,
                     int64_t d0, int64_t d1, int64_t d2) {
    if (!tp->h || !tp->h->tap) return M3_OK;
    char key[M3_KEY_MAX];
    m3_layer_key(key, tp->prefix, tp->n_layer, tp->layer, stage);
    m3_tensor t = {.dtype = dt, .rank = rank, .data = (void *)data};
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.shape[2] = d2;
    const char *pd = dt == M3_DT_I32 ? "int32" : m3_stage_dtype(tp->p, stage);
    m3_status s = tp->h->tap(tp->h->tap_ctx, key, &t, pd);
    return s ? m3_error_context(s, "stage %s", key) : M3_OK;
}

static bool tapping(const m3_hooks *h) {
    return h && h->tap;
}

/* Fetch a forced selection of shape [d0, d1, *] (rank 3) or [d0, d1] (rank 2). */
static m3_status fetch_sel(const tapper *tp, const char *stage, int rank, int64_t d0, int64_t d1,
                           m3_tensor *t) {
    char key[M3_KEY_MAX];
    m3_layer_key(key, tp->prefix, tp->n_layer, tp->layer, stage);
    memset(t, 0, sizeof *t);
    m3_status s = tp->h->fetch(tp->h->fetch_ctx, key, t);
    if (s) return m3_error_context(s, "teacher-forced %s", key);
    if (t->dtype != M3_DT_I32 || t->rank != rank || t->shape[0] != d0 || t->shape[1] != d1 ||
        (rank == 3 && t->shape[2] < 1)) {
        free(t->data);
        t->data = NULL;
        return m3_errorf(M3_ERR_SHAPE,
                         "teacher-forced %s: expected int32 [%lld, %lld%s], got "
                         "rank %d [%lld, %lld, ...]",
                         key, (long long)d0, (long long)d1, rank == 3 ? ", K" : "", t->rank,
                         (long long)t->shape[0], (long long)(t->rank > 1 ? t->shape[1] : 0));
    }
    return M3_OK;
}

/* Our router's weights for forced experts: sigma of their logits, renormalised over the
 * row (the same fp32 formula as m3_moe_route: sum in slot order, no epsilon). */
static void forced_weights(float *wts, const int32_t *ids, const float *logits, int T, int E,
                           int K) {
    for (int t = 0; t < T; t++) {
        float sig[64], sum = 0.0f;
        M3_ASSERT(K <= 64);
        for (int k = 0; k < K; k++) {
            int e = ids[(size_t)t * K + k];
            sig[k] = (e >= 0 && e < E) ? 1.0f / (1.0f + expf(-logits[(size_t)t * E + e])) : 0.0f;
            sum += sig[k];
        }
        for (int k = 0; k < K; k++)
            wts[(size_t)t * K + k] = sig[k] / sum;
    }
}

/* Record the selection a computing sparse layer used, for the reusing layers after it. */
static m3_status share_topk(m3_topk_share *sh, int L, const int32_t *sel, int G, int T, int W) {
    size_t n = (size_t)G * (size_t)T * (size_t)W;
    if (n > sh->cap) {
        int32_t *p = realloc(sh->topk, n * sizeof *p);
        if (!p) return m3_errorf(M3_ERR_NOMEM, "top-k of layer %d: out of memory", L);
        sh->topk = p;
        sh->cap = n;
    }
    memcpy(sh->topk, sel, n * sizeof *sel);
    sh->layer = L;
    sh->n_tok = T;
    sh->width = W;
    return M3_OK;
}

m3_status m3_layer_forward(float *x, float *h, bool *h_pending, int T, const int32_t *pos,
                           const m3_layer_weights *w, const m3_config *c, const m3_profile *p,
                           m3_layer_cache *cache, const m3_hooks *hooks, const char *prefix,
                           void *scratch, size_t scratch_bytes) {
    M3_ASSERT(x && h && h_pending && pos && w && c && p && cache && T > 0);
    const int L = w->layer, D = c->hidden, H = c->n_head, Hkv = c->n_kv_head, Dh = c->head_dim;
    const int QW = H * Dh, KW = Hkv * Dh, n0 = cache->n_past, n_ctx = n0 + T;
    for (int t = 0; t < T; t++)
        if (pos[t] != n0 + t)
            return m3_errorf(M3_ERR_ARG,
                             "layer %d: position %d of token %d; the contiguous "
                             "cache needs positions %d..%d in order",
                             L, pos[t], t, n0, n_ctx - 1);
    M3_ASSERT(cache->cap >= n_ctx);
    m3_attn_params ap;
    m3_indexer_params ip;
    m3_moe_params mp;
    m3_mlp_params dp;
    layer_params(c, &ap, &ip, &mp, &dp);
    arena a = {.base = scratch, .cap = scratch_bytes};
    tapper tp = {.h = hooks, .prefix = prefix, .n_layer = c->n_layer, .layer = L, .p = p};
    const bool dump = tapping(hooks);
    const size_t t_ = (size_t)T;
    m3_status s = M3_OK;

    /* ---- attention block ---- */
    float *xn = take(&a, t_ * D * sizeof(float));
    m3_rmsnorm_add(xn, x, *h_pending ? h : NULL, w->in_norm, T, D, c->rms_eps, p);
    *h_pending = false;
    M3_TRY(tap(&tp, "input", M3_DT_F32, x, 2, T, D, 0));
    M3_TRY(tap(&tp, "attn_norm", M3_DT_F32, xn, 2, T, D, 0));

    float *q = take(&a, t_ * QW * sizeof(float));
    void *qs = take(&a, m3_linear_q_scratch_bytes(T, QW > D ? QW : D)); /* ptpc activations */
    float *kc = cache->k + (size_t)n0 * KW; /* this pass's rows of the caches */
    float *vc = cache->v + (size_t)n0 * KW;
    m3_linear_q(q, QW, xn, D, &w->q, T, T, p, qs);
    m3_linear_q(kc, KW, xn, D, &w->k, T, T, p, qs);
    m3_linear_q(vc, KW, xn, D, &w->v, T, T, p, qs);
    M3_TRY(tap(&tp, "q_proj", M3_DT_F32, q, 2, T, QW, 0));
    M3_TRY(tap(&tp, "k_proj", M3_DT_F32, kc, 2, T, KW, 0));
    M3_TRY(tap(&tp, "v_proj", M3_DT_F32, vc, 2, T, KW, 0));
    float theta = (float)c->rope_theta;
    m3_qk_norm_rope(q, QW, pos, T, H, Dh, w->q_norm, c->rms_eps, c->rot_dim, theta, p);
    /* paged caches: the fp8 writers of the atom profile quantize from the fp32 k of the fused
     * norm + rope (spec §4.7); with qk_round ONCE that is the same computation before its one
     * rounding, so run it unrounded, keep it, then round exactly as ONCE does */
    m3_kv_layer *pkv = cache->paged;
    const m3_variant *var = cache->variant;
    const bool fp8kv = pkv && pkv->g.elem == M3_KV_FP8;
    const bool atom_writer = p->qk_round == M3_QK_ROUND_ONCE;
    const bool reuse = w->is_sparse && cache->reuse_topk;
    float *kf = NULL;
    if (fp8kv && atom_writer) {
        m3_profile pn = *p;
        pn.qk_round = M3_QK_ROUND_NONE;
        m3_qk_norm_rope(kc, KW, pos, T, Hkv, Dh, w->k_norm, c->rms_eps, c->rot_dim, theta, &pn);
        kf = take(&a, t_ * KW * sizeof(float));
        memcpy(kf, kc, t_ * KW * sizeof(float));
        m3_round_bf16_n(kc, (int64_t)t_ * KW);
    } else {
        m3_qk_norm_rope(kc, KW, pos, T, Hkv, Dh, w->k_norm, c->rms_eps, c->rot_dim, theta, p);
    }
    M3_TRY(tap(&tp, "q", M3_DT_F32, q, 3, T, H, Dh));
    M3_TRY(tap(&tp, "k", M3_DT_F32, kc, 3, T, Hkv, Dh));
    M3_TRY(tap(&tp, "v", M3_DT_F32, vc, 3, T, Hkv, Dh));
    const m3_fp8_overflow ovf = var ? var->fp8_overflow : M3_FP8_SATURATE;
    if (pkv) {
        /* the writer of this layer type (spec §4.7; docs/caches.md): atom dense and reuse
         * layers 240 from the fp32 k, computing sparse layers the fp8 kind's max from bf16(e')
         * with the amax of the fp32 e'; other profiles the kind's max from the k they hold */
        m3_kv_writer wr = {.fp8_max = m3_fp8_max(pkv->g.fp8_kind), .ovf = ovf};
        const float *kval = kc, *kamax = kc;
        if (kf) {
            kamax = kf;
            if (!w->is_sparse || reuse) {
                wr.fp8_max = 240.0f;
                kval = kf;
            }
        }
        if (var && var->kv_fp8max > 0) wr.fp8_max = (float)var->kv_fp8max;
        for (int t = 0; t < T; t++)
            m3_kv_write(pkv, m3_block_table_slot(cache->bt, pkv->g.block, pos[t]),
                        kval + (size_t)t * KW, kamax + (size_t)t * KW, vc + (size_t)t * KW, &wr);
    }
    m3_attn_paged_src psrc = {.kl = pkv, .bt = cache->bt, .fp8_pa = p->attn_partition > 0,
                              .ovf = ovf};

    float *ao = take(&a, t_ * QW * sizeof(float));
    float *ap_out = take(&a, t_ * D * sizeof(float));
    size_t as_bytes = pkv ? m3_attn_paged_scratch_bytes(n_ctx, ip.topk, &ap, &pkv->g)
                          : m3_attn_scratch_bytes(n_ctx, &ap);
    void *as = take(&a, as_bytes);
    if (w->is_sparse) {
        const int G = c->index_n_heads, Di = c->index_head_dim;
        const int NB = (n_ctx + ip.block - 1) / ip.block;
        float *iq = take(&a, t_ * G * Di * sizeof(float));
        /* a reusing layer computes the projections (the packed GEMM runs) but never inserts
         * into its index cache: its projection goes to scratch */
        float *ikc = reuse ? take(&a, t_ * Di * sizeof(float)) : cache->index_k + (size_t)n0 * Di;
        m3_linear_q(iq, G * Di, xn, D, &w->index_q, T, T, p, qs);
        m3_linear_q(ikc, Di, xn, D, &w->index_k, T, T, p, qs);
        /* raw indexer projections: extra stages (not in the schema table) */
        M3_TRY(tap(&tp, "index_q_proj", M3_DT_F32, iq, 2, T, G * Di, 0));
        M3_TRY(tap(&tp, "index_k_proj", M3_DT_F32, ikc, 2, T, Di, 0));
        int W = m3_indexer_width(n_ctx, &ip, p);
        int32_t *topk = take(&a, (size_t)G * t_ * (size_t)(ip.topk > 0 ? ip.topk : 1) * 4);
        float *scores = take(&a, (size_t)G * t_ * (size_t)NB * sizeof(float));
        float *margin = take(&a, (size_t)G * t_ * sizeof(float));
        size_t is_bytes = m3_indexer_scratch_bytes(n_ctx, &ip);
        void *is = take(&a, is_bytes);
        if (!reuse) {
            m3_qk_norm_rope(iq, G * Di, pos, T, G, Di, w->index_q_norm, c->rms_eps, c->rot_dim,
                            theta, p);
            m3_qk_norm_rope(ikc, Di, pos, T, 1, Di, w->index_k_norm, c->rms_eps, c->rot_dim,
                            theta, p);
            M3_TRY(tap(&tp, "index_q", M3_DT_F32, iq, 3, T, G, Di));
            M3_TRY(tap(&tp, "index_k", M3_DT_F32, ikc, 2, T, Di, 0));
            const float *ik_all = cache->index_k, *iq_use = iq;
            if (pkv) {
                /* insert, then read every key back through the index cache (§4.5, §4.8) */
                for (int t = 0; t < T; t++)
                    m3_kv_index_write(pkv, m3_block_table_slot(cache->bt, pkv->g.block, pos[t]),
                                      ikc + (size_t)t * Di, ovf);
                float *ikg = take(&a, (size_t)n_ctx * Di * sizeof(float));
                for (int j = 0; j < n_ctx; j++)
                    m3_kv_index_read(pkv, m3_block_table_slot(cache->bt, pkv->g.block, j),
                                     ikg + (size_t)j * Di);
                ik_all = ikg;
                /* fp8 index cache: prefill casts the query to fp8 without a scale (an fp8 x fp8
                 * dot, fp32 accumulation); decode keeps it (§3.8, §9.9) */
                if (T > 1 && var && m3_variant_index_q_fp8(var)) {
                    float *iq8 = take(&a, t_ * G * Di * sizeof(float));
                    for (size_t i = 0; i < t_ * G * Di; i++)
                        iq8[i] = m3_round_fp8(iq[i], pkv->g.fp8_kind, ovf);
                    iq_use = iq8;
                }
            }
            int n_ties = 0;
            m3_indexer_topk(topk, scores, margin, &n_ties, iq_use, G * Di, ik_all, pos, T, n_ctx,
                            &ip, p, is, is_bytes);
            if (n_ties)
                m3_info("layer %d: %d (head, token) rows with a tie straddling rank %d", L, n_ties,
                        ip.topk);
        } else {
            /* spec §3.9: the top-k of the most recent computing sparse layer of this pass */
            const m3_topk_share *sh = cache->share;
            M3_ASSERT(sh);
            if (sh->layer < 0 || sh->n_tok != T)
                return m3_errorf(M3_ERR_ARG,
                                 "layer %d reuses the top-k of an earlier sparse layer, but no "
                                 "sparse layer computed one in this pass",
                                 L);
            if (sh->width > ip.topk)
                return m3_errorf(M3_ERR_SHAPE, "layer %d: reused top-k width %d > %d", L, sh->width,
                                 ip.topk);
            W = sh->width;
            memcpy(topk, sh->topk, (size_t)G * t_ * (size_t)W * 4);
        }
        m3_tensor forced = {0};
        const int32_t *sel = topk;
        int sel_w = W;
        if (hooks && hooks->force_selection && hooks->fetch) {
            M3_TRY(fetch_sel(&tp, "index_topk", 3, G, T, &forced));
            sel = forced.data;
            sel_w = (int)forced.shape[2];
            for (int64_t i = 0; i < (int64_t)G * T * sel_w; i++)
                if (sel[i] < -1 || sel[i] >= NB) {
                    int bad = sel[i];
                    free(forced.data);
                    return m3_errorf(M3_ERR_ARG,
                                     "teacher-forced layer %d index_topk: block id %d "
                                     "outside [-1, %d)",
                                     L, bad, NB);
                }
        }
        /* the stage is what attention used: the forced selection when teacher-forced; a
         * reusing layer has no scores of its own */
        if (dump && !reuse) s = tap(&tp, "index_scores", M3_DT_F32, scores, 3, G, T, NB);
        if (!s) s = tap(&tp, "index_topk", M3_DT_I32, sel, 3, G, T, sel_w);
        if (!s && pkv && sel_w > ip.topk)
            s = m3_errorf(M3_ERR_SHAPE, "layer %d: index_topk width %d > top-k %d", L, sel_w,
                          ip.topk);
        if (!s && !reuse && cache->share) s = share_topk(cache->share, L, sel, G, T, sel_w);
        if (!s && pkv) /* sparse layers read the cache in prefill and decode (§3.10) */
            m3_attn_paged(ao, q, QW, &psrc, pos, T, n_ctx, sel, sel_w, &ap, p, as, as_bytes);
        else if (!s)
            m3_attn_sparse(ao, q, QW, cache->k, cache->v, pos, T, n_ctx, sel, sel_w, ip.block, &ap,
                           p, as, as_bytes);
        free(forced.data);
        M3_TRY(s);
    } else if (pkv && T == 1) {
        /* dense decode reads the paged cache; dense prefill runs on the chunk's own
         * (unquantized) K/V, as ATOM's flash-attention prefill does (§3.7, §9.12) */
        m3_attn_paged(ao, q, QW, &psrc, pos, T, n_ctx, NULL, 0, &ap, p, as, as_bytes);
    } else {
        m3_attn_dense(ao, q, QW, cache->k, cache->v, pos, T, n_ctx, &ap, p, as, as_bytes);
    }
    cache->n_past = n_ctx;
    M3_TRY(tap(&tp, "attn_out", M3_DT_F32, ao, 2, T, QW, 0));
    m3_linear_q(ap_out, D, ao, QW, &w->o, T, T, p, qs);
    M3_TRY(tap(&tp, "attn_proj", M3_DT_F32, ap_out, 2, T, D, 0));

    /* ---- MLP block: m = x + a (stored per profile), norm of it ---- */
    m3_rmsnorm_add(xn, x, ap_out, w->post_norm, T, D, c->rms_eps, p);
    M3_TRY(tap(&tp, "mlp_norm", M3_DT_F32, xn, 2, T, D, 0));
    if (!w->is_moe) {
        size_t ms = m3_mlp_scratch_bytes(T, &dp);
        m3_mlp(h, xn, T, &w->mlp, &dp, p, take(&a, ms));
    } else {
        const int E = c->n_expert, K = c->top_k;
        float *logits = take(&a, t_ * E * sizeof(float));
        int32_t *ids = take(&a, t_ * K * 4);
        float *wts = take(&a, t_ * K * sizeof(float));
        float *margin = take(&a, t_ * sizeof(float));
        float *sh = take(&a, t_ * D * sizeof(float));
        void *ms = take(&a, m3_moe_scratch_bytes(T, &mp));
        m3_moe_router_logits(logits, xn, T, w->moe.gate, &mp, p, ms);
        M3_TRY(tap(&tp, "router_logits", M3_DT_F32, logits, 2, T, E, 0));
        /* the selection bias is not a schema stage; dumping it lets m3 compare score expert
         * flips as sigmoid(logit) + bias, the quantity the router actually ranks */
        if (w->moe.bias) M3_TRY(tap(&tp, "router_bias", M3_DT_F32, w->moe.bias, 1, E, 0, 0));
        m3_moe_route(ids, wts, margin, logits, w->moe.bias, T, &mp, p);
        if (hooks && hooks->force_selection && hooks->fetch) {
            m3_tensor forced;
            M3_TRY(fetch_sel(&tp, "expert_ids", 2, T, K, &forced));
            memcpy(ids, forced.data, t_ * K * 4);
            free(forced.data);
            forced_weights(wts, ids, logits, T, E, K);
        }
        M3_TRY(tap(&tp, "expert_ids", M3_DT_I32, ids, 2, T, K, 0));
        M3_TRY(tap(&tp, "expert_weights", M3_DT_F32, wts, 2, T, K, 0));
        s = (w->shared_fused ? m3_moe_experts_fused : m3_moe_experts)(h, xn, ids, wts, T, &w->moe,
                                                                       &mp, p, ms);
        if (s) return m3_error_context(s, "layer %d", L);
        m3_mlp_params sp = m3_moe_shared_params(&mp);
        if (sp.ffn > 0 && !w->shared_fused) { /* fused: inside m3_moe_experts */
            m3_mlp(sh, xn, T, &w->moe.shared, &sp, p, take(&a, m3_mlp_scratch_bytes(T, &sp)));
            M3_TRY(tap(&tp, "shared_out", M3_DT_F32, sh, 2, T, D, 0));
            m3_moe_add_shared(h, sh, (int64_t)t_ * D, p);
        }
    }
    *h_pending = true;
    M3_TRY(tap(&tp, "mlp_out", M3_DT_F32, h, 2, T, D, 0));
    if (dump) {
        /* the stored x_{L+1}; the next input norm recomputes the same sum (same rounding) */
        m3_residual_add(ap_out, x, h, (int64_t)t_ * D, p);
        M3_TRY(tap(&tp, "output", M3_DT_F32, ap_out, 2, T, D, 0));
    }
    return M3_OK;
}
