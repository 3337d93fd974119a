/* ref/model.c: see model.h. */
#include "ref/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/embed.h"
#include "ref/linear.h"
#include "ref/norm.h"

struct m3_model {
    m3_config *cfg;
    m3_weights *w;
    m3_profile p;
    m3_variant v; /* numerics variant (m3_model_set_variant) */
    m3_layer_cache *cache; /* [n_layer] */
    /* caches and top-k reuse (docs/caches.md) */
    bool *computes;        /* [n_layer] top-k schedule (m3_config_topk_schedule) */
    bool any_reuse;
    bool paged;
    m3_block_table bt;     /* the sequence's block table (paged layout) */
    m3_kv_layer *kv;       /* [n_layer] paged storage, NULL when contiguous */
    m3_topk_share share;
    int n_past;
    void *scratch;
    size_t scratch_bytes;
    /* Resident weights: a checkpoint small enough (M3_REF_RESIDENT, see m3_model_open) keeps
     * each layer's loaded weights (and their quantize-on-load copies) across passes instead
     * of loading, converting and releasing them per pass: decode of a tiny model is then
     * bound by its math, not by re-reading the file. Numbers are identical either way (the
     * same load function builds the same views). */
    bool resident;
    m3_layer_weights *lw; /* [n_layer] when resident */
    bool *lw_ok;          /* [n_layer] lw[L] holds the current variant's weights */
};

static void free_resident(m3_model *m) {
    if (m->lw)
        for (int L = 0; L < m->cfg->n_layer; L++)
            if (m->lw_ok[L]) m3_layer_weights_free(&m->lw[L]);
    if (m->lw_ok) memset(m->lw_ok, 0, (size_t)m->cfg->n_layer * sizeof *m->lw_ok);
}

/* The top-k schedule of the config (spec §3.9), and which layers reuse. */
static m3_status schedule(m3_model *m) {
    free(m->computes);
    m->computes = calloc((size_t)m->cfg->n_layer, sizeof *m->computes);
    if (!m->computes) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    M3_TRY(m3_config_topk_schedule(m->cfg, m->computes));
    m->any_reuse = false;
    for (int L = 0; L < m->cfg->n_layer; L++)
        if (m->cfg->layer_sparse[L] && !m->computes[L]) m->any_reuse = true;
    return M3_OK;
}

static void free_paged(m3_model *m) {
    if (m->kv)
        for (int L = 0; L < m->cfg->n_layer; L++)
            m3_kv_layer_free(&m->kv[L]);
    free(m->kv);
    m->kv = NULL;
    m3_block_table_free(&m->bt);
    m->paged = false;
}

m3_status m3_model_set_variant(m3_model *m, const m3_variant *v) {
    const m3_config *c = m->cfg;
    M3_TRY(m3_variant_check(v));
    /* top-k reuse flags override the config's (and --override's) schedule */
    if (v->topk_reuse > 1 || v->topk_pattern[0]) {
        char js[256];
        if (v->topk_pattern[0])
            snprintf(js, sizeof js, "{\"use_index_cache\":true,\"index_topk_pattern\":\"%s\"}",
                     v->topk_pattern);
        else
            snprintf(js, sizeof js,
                     "{\"use_index_cache\":true,\"index_topk_freq\":%d,"
                     "\"index_skip_topk_offset\":%d,\"index_topk_pattern\":null}",
                     v->topk_reuse, v->topk_skip_offset);
        M3_TRY(m3_config_apply_overrides(m->cfg, js));
    }
    M3_TRY(schedule(m));
    m->v = *v;
    free_resident(m); /* quantized experts are built per variant */
    free_paged(m);
    if (v->cache_layout == M3_LAYOUT_PAGED) {
        /* "bf16" caches store what the profile holds: bf16 where k / v / index keys are rounded
         * (hf, atom), fp32 under the fp32 profile, so the layout alone never changes a number */
        m3_kv_elem kv_el = v->kv_cache == M3_CACHE_FP8 ? M3_KV_FP8
                           : (m->p.act_bf16 && m->p.qk_round != M3_QK_ROUND_NONE) ? M3_KV_BF16
                                                                                  : M3_KV_F32;
        m3_kv_elem ix_el = v->index_cache == M3_CACHE_FP8 ? M3_KV_FP8
                           : m->p.qk_round != M3_QK_ROUND_NONE                  ? M3_KV_BF16
                                                                                  : M3_KV_F32;
        m->kv = calloc((size_t)c->n_layer, sizeof *m->kv);
        if (!m->kv) return m3_errorf(M3_ERR_NOMEM, "out of memory");
        m3_kv_geom g;
        m3_kv_geom_init(&g, c->n_kv_head, c->head_dim, c->index_block, 0, kv_el, v->fp8_kind);
        for (int L = 0; L < c->n_layer; L++)
            m3_kv_layer_init(&m->kv[L], &g, c->layer_sparse[L] ? M3_KV_VIEW_PAGE : M3_KV_VIEW_BLOCK,
                             c->layer_sparse[L] ? c->index_head_dim : 0, ix_el);
        m->paged = true;
    }
    m3_model_reset(m);
    return M3_OK;
}

m3_status m3_model_open(m3_model **out, const char *dir, const char *override_json,
                        const m3_profile *p) {
    *out = NULL;
    m3_model *m = calloc(1, sizeof *m);
    if (!m) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    m->p = *p;
    m3_variant_default(&m->v);
    m3_status s = m3_config_load(&m->cfg, dir);
    if (!s && override_json) {
        s = m3_config_apply_overrides(m->cfg, override_json);
        if (s) m3_error_context(s, "--override");
    }
    if (!s) s = schedule(m);
    if (!s) s = m3_weights_open(&m->w, dir);
    if (!s) s = m3_weights_check(m->w, m->cfg, NULL);
    if (!s) {
        m->cache = calloc((size_t)m->cfg->n_layer, sizeof *m->cache);
        if (!m->cache) s = m3_errorf(M3_ERR_NOMEM, "out of memory");
    }
    if (!s) {
        /* M3_REF_RESIDENT=1 / 0 forces; by default a checkpoint of at most 512 MiB stays
         * resident (tiny and test models; the real one streams layer by layer) */
        const char *r = getenv("M3_REF_RESIDENT");
        m->resident = r && (!strcmp(r, "0") || !strcmp(r, "1"))
                          ? r[0] == '1'
                          : m3_weights_bytes(m->w) <= ((int64_t)512 << 20);
        if (m->resident) {
            m->lw = calloc((size_t)m->cfg->n_layer, sizeof *m->lw);
            m->lw_ok = calloc((size_t)m->cfg->n_layer, sizeof *m->lw_ok);
            if (!m->lw || !m->lw_ok) s = m3_errorf(M3_ERR_NOMEM, "out of memory");
        }
    }
    if (s) {
        m3_model_close(m);
        return s;
    }
    *out = m;
    return M3_OK;
}

void m3_model_close(m3_model *m) {
    if (!m) return;
    if (m->cache && m->cfg)
        for (int L = 0; L < m->cfg->n_layer; L++)
            m3_layer_cache_free(&m->cache[L]);
    free(m->cache);
    if (m->cfg) free_paged(m);
    if (m->cfg) free_resident(m);
    free(m->lw);
    free(m->lw_ok);
    free(m->computes);
    free(m->share.topk);
    free(m->scratch);
    m3_weights_close(m->w);
    m3_config_free(m->cfg);
    free(m);
}

const m3_variant *m3_model_variant(const m3_model *m) {
    return &m->v;
}

const m3_config *m3_model_config(const m3_model *m) {
    return m->cfg;
}
const m3_profile *m3_model_profile(const m3_model *m) {
    return &m->p;
}
int m3_model_n_past(const m3_model *m) {
    return m->n_past;
}

static void set_n_past(m3_model *m, int n) {
    m->n_past = n;
    for (int L = 0; L < m->cfg->n_layer; L++)
        m->cache[L].n_past = n;
}

void m3_model_reset(m3_model *m) {
    set_n_past(m, 0);
}

int32_t m3_argmax(const float *x, int n) {
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}

/* ---- helpers ----------------------------------------------------------------------------- */

static m3_status tap_g(const m3_hooks *h, const char *prefix, const char *stage, m3_dtype dt,
                       const void *data, int rank, int64_t d0, int64_t d1, const char *pd) {
    if (!h || !h->tap) return M3_OK;
    char key[M3_KEY_MAX];
    snprintf(key, sizeof key, "%s%s", prefix ? prefix : "", stage);
    m3_tensor t = {.dtype = dt, .rank = rank, .data = (void *)data};
    t.shape[0] = d0;
    t.shape[1] = d1;
    m3_status s = h->tap(h->tap_ctx, key, &t, pd);
    return s ? m3_error_context(s, "stage %s", key) : M3_OK;
}

/* Fetch a teacher-forced [T, D] float stage into x. */
static m3_status fetch_rows(const m3_hooks *h, const char *key, float *x, int T, int D) {
    m3_tensor t;
    memset(&t, 0, sizeof t);
    m3_status s = h->fetch(h->fetch_ctx, key, &t);
    if (s) return m3_error_context(s, "teacher-forced %s", key);
    if (t.dtype != M3_DT_F32 || t.rank != 2 || t.shape[0] != T || t.shape[1] != D) {
        free(t.data);
        return m3_errorf(M3_ERR_SHAPE,
                         "teacher-forced %s: expected float [%d, %d], got rank %d "
                         "[%lld, ...]",
                         key, T, D, t.rank, (long long)t.shape[0]);
    }
    memcpy(x, t.data, (size_t)T * (size_t)D * sizeof(float));
    free(t.data);
    return M3_OK;
}

/* A norm weight [n] as bf16 into buf (exact conversions only). */
static m3_status norm_bf16(m3_weights *w, m3_wrole role, int n, m3_bf16 *buf, const m3_bf16 **out) {
    m3_tensor t;
    M3_TRY(m3_weights_role_get(w, role, -1, -1, &t));
    if (m3_tensor_numel(&t) != n)
        return m3_errorf(M3_ERR_SHAPE, "final norm weight has %lld elements, config implies %d",
                         (long long)m3_tensor_numel(&t), n);
    if (t.dtype == M3_DT_BF16) {
        *out = t.data;
        return M3_OK;
    }
    float *f = malloc((size_t)n * sizeof *f);
    if (!f) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    m3_status s = m3_tensor_rows_f32(&t, 0, 1, f);
    for (int i = 0; !s && i < n; i++) {
        buf[i] = m3_f32_to_bf16(f[i]);
        if (m3_bf16_to_f32(buf[i]) != f[i] && !isnan(f[i]))
            s = m3_errorf(M3_ERR_UNSUPPORTED, "final norm weight value %g is not a bf16 number",
                          (double)f[i]);
    }
    free(f);
    *out = buf;
    return s;
}

/* lm_head (or the tied embedding) as an m3_wmat; F16 is converted into *owned (fp32). */
static m3_status head_wmat(m3_model *m, m3_wmat *wm, float **owned) {
    const m3_config *c = m->cfg;
    m3_tensor t;
    *owned = NULL;
    if (c->tie_word_embeddings) {
        M3_TRY(m3_weights_role_get(m->w, M3_W_EMBED, -1, -1, &t));
    } else {
        m3_linear_w lw;
        M3_TRY(m3_weights_linear(m->w, M3_W_LM_HEAD, -1, -1, &lw));
        if (lw.fmt != M3_WF_DENSE)
            return m3_errorf(M3_ERR_UNSUPPORTED, "lm_head is quantized: not supported");
        t = lw.w;
    }
    if (t.rank != 2 || t.shape[0] != c->vocab || t.shape[1] != c->hidden)
        return m3_errorf(M3_ERR_SHAPE, "lm_head: shape disagrees with the config [%d, %d]",
                         c->vocab, c->hidden);
    wm->n_out = c->vocab;
    wm->n_in = c->hidden;
    if (t.dtype == M3_DT_BF16 || t.dtype == M3_DT_F32) {
        wm->fmt = t.dtype == M3_DT_BF16 ? M3_WFMT_BF16 : M3_WFMT_F32;
        wm->data = t.data;
        return M3_OK;
    }
    *owned = malloc((size_t)c->vocab * (size_t)c->hidden * sizeof(float));
    if (!*owned) return m3_errorf(M3_ERR_NOMEM, "lm_head: out of memory");
    M3_TRY(m3_tensor_rows_f32(&t, 0, c->vocab, *owned));
    wm->fmt = M3_WFMT_F32;
    wm->data = *owned;
    return M3_OK;
}

static m3_status embed_rows(m3_model *m, float *x, const int32_t *tok, int T) {
    const m3_config *c = m->cfg;
    m3_tensor t;
    M3_TRY(m3_weights_role_get(m->w, M3_W_EMBED, -1, -1, &t));
    if (t.rank != 2 || t.shape[0] != c->vocab || t.shape[1] != c->hidden)
        return m3_errorf(M3_ERR_SHAPE, "embed_tokens: shape disagrees with the config [%d, %d]",
                         c->vocab, c->hidden);
    if (t.dtype == M3_DT_BF16) return m3_embed(x, tok, T, t.data, c->vocab, c->hidden);
    for (int i = 0; i < T; i++) /* ids were validated by the caller */
        M3_TRY(m3_tensor_rows_f32(&t, tok[i], 1, x + (size_t)i * c->hidden));
    return M3_OK;
}

static void drop_prefix(m3_model *m, const char *prefix) {
    if (m->resident) return; /* kept views point into these pages */
    /* releasing pages is an optimisation: a failure only costs memory */
    if (m3_weights_drop(m->w, prefix) != M3_OK) m3_clear_error();
}

/* ---- forward ----------------------------------------------------------------------------- */

static m3_status forward(m3_model *m, const int32_t *tok, const int32_t *pos, int T,
                         const m3_hooks *hk, const char *prefix, float *logits_last, int32_t *next,
                         float *x, float *h) {
    const m3_config *c = m->cfg;
    const m3_profile *p = &m->p;
    const int D = c->hidden, V = c->vocab, n_ctx = m->n_past + T;
    const bool dump = hk && hk->tap;
    const bool force_in = hk && hk->fetch && hk->force_input;

    M3_TRY(tap_g(hk, prefix, "tokens", M3_DT_I32, tok, 1, T, 0, "int32"));
    M3_TRY(tap_g(hk, prefix, "positions", M3_DT_I32, pos, 1, T, 0, "int32"));
    M3_TRY(embed_rows(m, x, tok, T));
    drop_prefix(m, "language_model.model.embed_tokens.");
    M3_TRY(tap_g(hk, prefix, "embed", M3_DT_F32, x, 2, T, D, m3_stage_dtype(p, "embed")));

    /* scratch for the largest layer of this pass */
    size_t need = 0;
    for (int L = 0; L < c->n_layer; L++) {
        size_t b = m3_layer_scratch_bytes(c, L, T, n_ctx);
        if (m->paged || m->any_reuse) b += m3_layer_paged_scratch_bytes(c, L, T, n_ctx);
        if (b > need) need = b;
    }
    if (need > m->scratch_bytes) {
        free(m->scratch);
        m->scratch = malloc(need);
        m->scratch_bytes = m->scratch ? need : 0;
        if (!m->scratch) return m3_errorf(M3_ERR_NOMEM, "layer scratch of %zu bytes", need);
    }

    if (m->paged) M3_TRY(m3_block_table_reserve(&m->bt, (n_ctx + c->index_block - 1) / c->index_block));
    m->share.layer = -1; /* top-k reuse never crosses passes (spec §3.9) */
    bool h_pending = false;
    char key[M3_KEY_MAX], pfx[96];
    for (int L = 0; L < c->n_layer; L++) {
        m3_layer_cache *lc = &m->cache[L];
        M3_TRY(m3_layer_cache_reserve(lc, c, c->layer_sparse[L], n_ctx));
        if (m->paged) M3_TRY(m3_kv_layer_reserve(&m->kv[L], m->bt.n_pool));
        lc->paged = m->paged ? &m->kv[L] : NULL;
        lc->bt = &m->bt;
        lc->variant = &m->v;
        lc->share = &m->share;
        lc->reuse_topk = c->layer_sparse[L] && !m->computes[L];
        if (force_in) {
            m3_layer_key(key, prefix, c->n_layer, L, "input");
            M3_TRY(fetch_rows(hk, key, x, T, D));
            h_pending = false;
        }
        m3_layer_weights lw_pass, *lw = &lw_pass;
        if (m->resident) {
            lw = &m->lw[L];
            if (!m->lw_ok[L]) {
                M3_TRY(m3_layer_weights_load_v(lw, m->w, c, L, &m->v, &m->p));
                m->lw_ok[L] = true;
            }
        } else {
            M3_TRY(m3_layer_weights_load_v(lw, m->w, c, L, &m->v, &m->p));
        }
        m3_status s = m3_layer_forward(x, h, &h_pending, T, pos, lw, c, p, &m->cache[L], hk,
                                       prefix, m->scratch, m->scratch_bytes);
        if (!m->resident) {
            m3_layer_weights_free(lw);
            snprintf(pfx, sizeof pfx, "language_model.model.layers.%d.", L);
            drop_prefix(m, pfx);
        }
        M3_TRY(s);
    }
    if (force_in) {
        m3_layer_key(key, prefix, c->n_layer, c->n_layer - 1, "output");
        M3_TRY(fetch_rows(hk, key, x, T, D));
        h_pending = false;
    }

    /* final norm: y = Norm(x_n) with the last layer's pending add; y reuses h's rows when the
     * sum is consumed (rmsnorm_add forbids aliasing, so write y into the scratch) */
    float *y = m->scratch;
    M3_ASSERT(m->scratch_bytes >= (size_t)T * D * sizeof(float));
    m3_bf16 *wbuf = malloc((size_t)D * sizeof(m3_bf16));
    if (!wbuf) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    const m3_bf16 *wn = NULL;
    m3_status s = norm_bf16(m->w, M3_W_FINAL_NORM, D, wbuf, &wn);
    if (!s) m3_rmsnorm_add(y, x, h_pending ? h : NULL, wn, T, D, c->rms_eps, p);
    free(wbuf);
    M3_TRY(s);
    M3_TRY(tap_g(hk, prefix, "final_norm", M3_DT_F32, y, 2, T, D, m3_stage_dtype(p, "final_norm")));

    /* lm_head: every row when dumping, else only the last (what greedy decoding needs) */
    m3_wmat wm;
    float *owned = NULL;
    M3_TRY(head_wmat(m, &wm, &owned));
    int rows = dump ? T : 1;
    float *lg = malloc((size_t)rows * (size_t)V * sizeof(float));
    if (!lg) {
        free(owned);
        return m3_errorf(M3_ERR_NOMEM, "logits [%d, %d]: out of memory", rows, V);
    }
    m3_linear_p(lg, V, y + (size_t)(T - rows) * D, D, &wm, rows, p);
    free(owned);
    drop_prefix(m, c->tie_word_embeddings ? "language_model.model.embed_tokens."
                                          : "language_model.lm_head.");
    s = tap_g(hk, prefix, "logits", M3_DT_F32, lg, 2, rows, V, m3_stage_dtype(p, "logits"));
    const float *last = lg + (size_t)(rows - 1) * V;
    if (!s && logits_last) memcpy(logits_last, last, (size_t)V * sizeof(float));
    if (!s && next) *next = m3_argmax(last, V);
    free(lg);
    return s;
}

m3_status m3_model_forward(m3_model *m, const int32_t *tok, const int32_t *pos_in, int T,
                           const m3_hooks *hk, const char *prefix, float *logits_last,
                           int32_t *next) {
    const m3_config *c = m->cfg;
    if (T < 1) return m3_errorf(M3_ERR_ARG, "forward: no tokens");
    if ((int64_t)m->n_past + T > c->max_pos)
        return m3_errorf(M3_ERR_ARG, "forward: %d + %d tokens exceed max_position_embeddings %lld",
                         m->n_past, T, (long long)c->max_pos);
    for (int t = 0; t < T; t++) {
        if (tok[t] < 0 || tok[t] >= c->vocab)
            return m3_errorf(M3_ERR_ARG,
                             "token id %d at position %d is outside the vocabulary "
                             "[0, %d)",
                             tok[t], t, c->vocab);
        if (pos_in && pos_in[t] != m->n_past + t)
            return m3_errorf(M3_ERR_ARG,
                             "position %d of token %d: expected %d (positions must "
                             "continue the cache without gaps)",
                             pos_in[t], t, m->n_past + t);
    }
    size_t n = (size_t)T * (size_t)c->hidden;
    float *x = malloc(n * sizeof(float)), *h = malloc(n * sizeof(float));
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    m3_status s = M3_OK;
    if (!x || !h || !pos)
        s = m3_errorf(M3_ERR_NOMEM, "activations [%d, %d]: out of memory", T, c->hidden);
    if (!s) {
        for (int t = 0; t < T; t++)
            pos[t] = m->n_past + t;
        int n0 = m->n_past;
        s = forward(m, tok, pos, T, hk, prefix, logits_last, next, x, h);
        /* the caches are append-only: rolling n_past back undoes a failed pass */
        set_n_past(m, s ? n0 : n0 + T);
    }
    free(x);
    free(h);
    free(pos);
    return s;
}
