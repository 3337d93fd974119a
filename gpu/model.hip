/* gpu/model.hip: the whole MiniMax-M3 text forward on one device, twin of ref/model.c:
 * embedding, the decoder layers (gpu/layer.hip), final norm, lm_head, greedy next token, the
 * device KV / index caches for decode, and teacher forcing for replay.
 *
 * Arena layout (a stack, gpu/m3_gpu.h): [resident weights][caches][one pass's temporaries].
 * Weights: resident (every layer uploaded once at open) when they fit in half the arena,
 *   else streamed like ref (each layer uploaded just before it runs, its memory released
 *   right after). Layers only meet through x / h and their own cache, so a teacher-forced
 *   replay could run layer L on device L % n (the roadmap's layer-parallel replay): nothing
 *   here couples two layers' device state.
 * Host work: the embedding rows are read from the checkpoint mapping on the host (an exact
 *   bf16 -> storage copy, as ref's m3_embed) and uploaded; the argmax runs on the host over
 *   the downloaded logits row (ref's m3_argmax, same tie rule).
 * Caches: sized by m3_gpu_model_reserve, or by a forward at n_past 0 (doubling from 64 rows
 *   like ref's). Filled caches cannot grow (the arena has no realloc): a decode loop
 *   reserves prompt + steps first; past that a pass fails with M3_ERR_ARG, caches intact. */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/config.h"
#include "ref/embed.h"
#include "ref/layer.h"
#include "ref/model.h"
#include "ref/weights.h"

struct m3_gpu_model {
    m3_gpu *g;
    m3_config *cfg;
    m3_weights *w;
    m3_profile p;
    m3_gpu_model_opts o;
    bool bf16;     /* activation storage */
    bool resident; /* all weights on the device */
    size_t mark_open, mark_caches;
    m3_gpu_layer_weights **lw; /* [n_layer] when resident */
    const void *head;          /* lm_head [V, D] in the storage type, when resident */
    const m3_bf16 *final_norm; /* [D] */
    m3_gpu_layer_cache *cache; /* [n_layer] */
    int cap, n_past;
    m3_variant v;              /* numerics variant (m3_gpu_model_set_variant) */
    bool *computes;            /* [n_layer] top-k schedule (m3_config_topk_schedule) */
    m3_gpu_topk_share share;   /* top-k reuse within a pass (device memory of the pass) */
    int32_t *bt;               /* paged caches: the sequence's block table [n_blocks] (device) */
    int n_blocks;
};

extern "C" void m3_gpu_model_opts_default(m3_gpu_model_opts *o) {
    o->flash = false;
    o->f32_storage = false;
    o->resident = -1;
    const char *a = getenv("M3_GPU_ATTN"), *st = getenv("M3_GPU_STORAGE"),
               *r = getenv("M3_GPU_RESIDENT");
    if (a && !strcmp(a, "flash")) o->flash = true;
    if (st && !strcmp(st, "f32")) o->f32_storage = true;
    if (r && (!strcmp(r, "0") || !strcmp(r, "1"))) o->resident = r[0] - '0';
}

extern "C" const m3_config *m3_gpu_model_config(const m3_gpu_model *m) { return m->cfg; }
extern "C" int m3_gpu_model_n_past(const m3_gpu_model *m) { return m->n_past; }
extern "C" const char *m3_gpu_model_storage(const m3_gpu_model *m) {
    return m->bf16 ? "bfloat16" : "float32";
}

static void set_n_past(m3_gpu_model *m, int n) {
    m->n_past = n;
    for (int L = 0; m->cache && L < m->cfg->n_layer; L++) m->cache[L].n_past = n;
}
extern "C" void m3_gpu_model_reset(m3_gpu_model *m) { set_n_past(m, 0); }

/* The top-k schedule of the config (spec §3.9): which sparse layers compute their own. */
static m3_status schedule(m3_gpu_model *m) {
    free(m->computes);
    m->computes = (bool *)calloc((size_t)m->cfg->n_layer, sizeof *m->computes);
    if (!m->computes) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    return m3_config_topk_schedule(m->cfg, m->computes);
}

static m3_status upload_all(m3_gpu_model *m);

/* the part of a variant that changes the uploaded weights */
static bool same_weights(const m3_variant *a, const m3_variant *b) {
    char x[1024], y[1024];
    m3_variant_json_quant(a, x, sizeof x);
    m3_variant_json_quant(b, y, sizeof y);
    return strcmp(x, y) == 0;
}

extern "C" m3_status m3_gpu_model_set_variant(m3_gpu_model *m, const m3_variant *v) {
    /* every variant key is implemented on the device (docs/gpu.md "Numerics variants") */
    M3_TRY(m3_variant_check(v));
    /* top-k reuse flags override the config's (and --override's) schedule, as ref */
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
    const bool reupload = !same_weights(&m->v, v);
    m->v = *v;
    set_n_past(m, 0);
    /* the caches are made again by the next reserve, in the variant's forms */
    m3_gpu_release(m->g, m->mark_caches);
    memset(m->cache, 0, (size_t)m->cfg->n_layer * sizeof *m->cache);
    m->cap = 0;
    if (reupload) {
        /* the weights under the new variant: drop everything above the open mark (resident
         * weights, caches) and upload again; a failure leaves the model unusable */
        if (m->lw)
            for (int L = 0; L < m->cfg->n_layer; L++) {
                m3_gpu_layer_weights_free(m->lw[L]);
                m->lw[L] = NULL;
            }
        m->head = NULL;
        m->final_norm = NULL;
        m3_gpu_release(m->g, m->mark_open);
        memset(m->cache, 0, (size_t)m->cfg->n_layer * sizeof *m->cache);
        m->cap = 0;
        M3_TRY(upload_all(m));
    }
    return M3_OK;
}

static void drop_prefix(m3_gpu_model *m, const char *prefix) {
    /* releasing pages is an optimisation: a failure only costs memory */
    if (m3_weights_drop(m->w, prefix) != M3_OK) m3_clear_error();
}

/* ---- checkpoint pieces outside the layers ------------------------------------------------ */

/* lm_head (or the tied embedding) as a tensor view [V, D] */
static m3_status head_tensor(m3_gpu_model *m, m3_tensor *t) {
    const m3_config *c = m->cfg;
    if (c->tie_word_embeddings) {
        M3_TRY(m3_weights_role_get(m->w, M3_W_EMBED, -1, -1, t));
    } else {
        m3_linear_w lw;
        M3_TRY(m3_weights_linear(m->w, M3_W_LM_HEAD, -1, -1, &lw));
        if (lw.fmt != M3_WF_DENSE)
            return m3_errorf(M3_ERR_UNSUPPORTED, "lm_head is quantized: not supported");
        *t = lw.w;
    }
    if (t->rank != 2 || t->shape[0] != c->vocab || t->shape[1] != c->hidden)
        return m3_errorf(M3_ERR_SHAPE, "lm_head: shape disagrees with the config [%d, %d]",
                         c->vocab, c->hidden);
    return M3_OK;
}

/* upload lm_head into the arena in the storage type */
static m3_status upload_head(m3_gpu_model *m, const void **out) {
    const m3_config *c = m->cfg;
    m3_tensor t;
    M3_TRY(head_tensor(m, &t));
    const size_t n = (size_t)c->vocab * (size_t)c->hidden;
    void *d;
    M3_TRY(m3_gpu_alloc(m->g, &d, n * (m->bf16 ? 2 : 4)));
    if (t.dtype == M3_DT_BF16 || t.dtype == M3_DT_F32) {
        M3_TRY(m3_gpu_upload_mat_(m->g, d, m->bf16,
                                  t.dtype == M3_DT_BF16 ? (int)M3_WFMT_BF16 : (int)M3_WFMT_F32,
                                  t.data, n, "lm_head"));
    } else { /* F16: exact to fp32 on the host (fp32 storage only) */
        if (m->bf16)
            return m3_errorf(M3_ERR_UNSUPPORTED, "gpu: lm_head is stored as %s; the "
                             "bf16-storage path takes bf16 weights only (use M3_GPU_STORAGE=f32)",
                             m3_dtype_name(t.dtype));
        float *f = (float *)malloc(n * sizeof *f);
        if (!f) return m3_errorf(M3_ERR_NOMEM, "lm_head: out of memory");
        m3_status s = m3_tensor_rows_f32(&t, 0, c->vocab, f);
        if (!s) s = m3_gpu_upload(m->g, d, f, n * sizeof *f);
        free(f);
        M3_TRY(s);
    }
    *out = d;
    return M3_OK;
}

/* the final norm weight [D] as bf16 (exact conversions only, as ref) */
static m3_status upload_final_norm(m3_gpu_model *m) {
    const int D = m->cfg->hidden;
    m3_tensor t;
    M3_TRY(m3_weights_role_get(m->w, M3_W_FINAL_NORM, -1, -1, &t));
    if (m3_tensor_numel(&t) != D)
        return m3_errorf(M3_ERR_SHAPE, "final norm weight has %lld elements, config implies %d",
                         (long long)m3_tensor_numel(&t), D);
    m3_bf16 *b = (m3_bf16 *)malloc((size_t)D * sizeof *b);
    float *f = (float *)malloc((size_t)D * sizeof *f);
    m3_status s = b && f ? M3_OK : m3_errorf(M3_ERR_NOMEM, "out of memory");
    if (!s && t.dtype == M3_DT_BF16) {
        memcpy(b, t.data, (size_t)D * sizeof *b);
    } else if (!s) {
        s = m3_tensor_rows_f32(&t, 0, 1, f);
        for (int i = 0; !s && i < D; i++) {
            b[i] = m3_f32_to_bf16(f[i]);
            if (m3_bf16_to_f32(b[i]) != f[i] && !isnan(f[i]))
                s = m3_errorf(M3_ERR_UNSUPPORTED, "final norm weight value %g is not a bf16 number",
                              (double)f[i]);
        }
    }
    void *d = NULL;
    if (!s) s = m3_gpu_alloc(m->g, &d, (size_t)D * sizeof *b);
    if (!s) s = m3_gpu_upload(m->g, d, b, (size_t)D * sizeof *b);
    free(b);
    free(f);
    M3_TRY(s);
    m->final_norm = (const m3_bf16 *)d;
    return M3_OK;
}

/* embedding rows [T, D] fp32 on the host (ids validated by the caller) */
static m3_status embed_rows(m3_gpu_model *m, float *x, const int32_t *tok, int T) {
    const m3_config *c = m->cfg;
    m3_tensor t;
    M3_TRY(m3_weights_role_get(m->w, M3_W_EMBED, -1, -1, &t));
    if (t.rank != 2 || t.shape[0] != c->vocab || t.shape[1] != c->hidden)
        return m3_errorf(M3_ERR_SHAPE, "embed_tokens: shape disagrees with the config [%d, %d]",
                         c->vocab, c->hidden);
    if (t.dtype == M3_DT_BF16)
        return m3_embed(x, tok, T, (const m3_bf16 *)t.data, c->vocab, c->hidden);
    for (int i = 0; i < T; i++)
        M3_TRY(m3_tensor_rows_f32(&t, tok[i], 1, x + (size_t)i * c->hidden));
    return M3_OK;
}

/* one layer's weights: host views -> device (the caller releases the arena after use) */
static m3_status upload_layer(m3_gpu_model *m, int L, m3_gpu_layer_weights **out) {
    m3_layer_weights hw;
    /* the variant's forms (quantized experts made on load by ref's own code, the fused
     * shared expert decision): the same host structs ref's forward runs on */
    M3_TRY(m3_layer_weights_load_v(&hw, m->w, m->cfg, L, &m->v, &m->p));
    m3_status s = m3_gpu_layer_weights_upload(m->g, out, &hw, m->cfg, &m->p, m->bf16);
    m3_layer_weights_free(&hw);
    char pfx[96];
    snprintf(pfx, sizeof pfx, "language_model.model.layers.%d.", L);
    drop_prefix(m, pfx);
    return s;
}

/* ---- open / close ------------------------------------------------------------------------ */

static bool bf16_storage_fits(const m3_profile *p) {
    return p->act_bf16 && p->residual_bf16 && p->qk_round != M3_QK_ROUND_NONE &&
           p->attn_out_bf16 && p->swiglu != M3_SWIGLU_F32;
}

static m3_status open_model(m3_gpu_model *m, const char *dir, const char *override_json) {
    M3_TRY(m3_config_load(&m->cfg, dir));
    if (override_json) {
        m3_status s = m3_config_apply_overrides(m->cfg, override_json);
        if (s) return m3_error_context(s, "--override");
    }
    const m3_config *c = m->cfg;
    M3_TRY(schedule(m));
    M3_TRY(m3_weights_open(&m->w, dir));
    M3_TRY(m3_weights_check(m->w, c, NULL));
    m->cache = (m3_gpu_layer_cache *)calloc((size_t)c->n_layer, sizeof *m->cache);
    m->lw = (m3_gpu_layer_weights **)calloc((size_t)c->n_layer, sizeof *m->lw);
    if (!m->cache || !m->lw) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    m->mark_open = m3_gpu_mark(m->g);
    return upload_all(m);
}

/* final norm, then every layer and lm_head when they fit (resident); marks the caches */
static m3_status upload_all(m3_gpu_model *m) {
    const m3_config *c = m->cfg;
    M3_TRY(upload_final_norm(m));
    size_t need = (size_t)c->vocab * c->hidden * (m->bf16 ? 2 : 4);
    for (int L = 0; L < c->n_layer; L++) need += m3_gpu_layer_weights_bytes(c, L, m->bf16);
    const size_t free_b = m3_gpu_arena_bytes(m->g) - m3_gpu_mark(m->g);
    m->resident = m->o.resident == 1 || (m->o.resident < 0 && need <= free_b / 2);
    if (m->resident) {
        for (int L = 0; L < c->n_layer; L++) M3_TRY(upload_layer(m, L, &m->lw[L]));
        M3_TRY(upload_head(m, &m->head));
        drop_prefix(m, c->tie_word_embeddings ? "language_model.model.embed_tokens."
                                              : "language_model.lm_head.");
    }
    m->mark_caches = m3_gpu_mark(m->g);
    return M3_OK;
}

extern "C" m3_status m3_gpu_model_open(m3_gpu_model **out, m3_gpu *g, const char *dir,
                                       const char *override_json, const m3_profile *p,
                                       const m3_gpu_model_opts *o) {
    *out = NULL;
    M3_ASSERT(g && dir && p);
    m3_gpu_model *m = (m3_gpu_model *)calloc(1, sizeof *m);
    if (!m) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    m->g = g;
    m->p = *p;
    m3_variant_default(&m->v);
    if (o) m->o = *o;
    else m3_gpu_model_opts_default(&m->o);
    m->bf16 = !m->o.f32_storage && bf16_storage_fits(p);
    m->mark_open = m3_gpu_mark(g);
    m3_status s = open_model(m, dir, override_json);
    if (s) {
        m3_gpu_model_close(m);
        return s;
    }
    *out = m;
    return M3_OK;
}

extern "C" void m3_gpu_model_close(m3_gpu_model *m) {
    if (!m) return;
    if (m->lw && m->cfg)
        for (int L = 0; L < m->cfg->n_layer; L++) m3_gpu_layer_weights_free(m->lw[L]);
    free(m->lw);
    free(m->cache);
    free(m->computes);
    m3_gpu_release(m->g, m->mark_open);
    m3_weights_close(m->w);
    m3_config_free(m->cfg);
    free(m);
}

/* cache_layout paged: the block table of a sequence of cap tokens, logical block b -> physical
 * n_blocks-1-b (descending, as ref's pool hands blocks out: a reader that confuses logical and
 * physical ids reads the wrong bytes at once) */
static m3_status block_table(m3_gpu_model *m, int cap) {
    const int Bs = m->cfg->index_block, nb = (cap + Bs - 1) / Bs;
    int32_t *h = (int32_t *)malloc((size_t)nb * sizeof *h);
    if (!h) return m3_errorf(M3_ERR_NOMEM, "block table of %d blocks: out of memory", nb);
    for (int b = 0; b < nb; b++) h[b] = nb - 1 - b;
    m3_status s = m3_gpu_alloc(m->g, (void **)&m->bt, (size_t)nb * sizeof *h);
    if (!s) s = m3_gpu_upload(m->g, m->bt, h, (size_t)nb * sizeof *h);
    free(h);
    m->n_blocks = nb;
    return s;
}

/* the variant's parts of a layer cache: the paged KV storage (ref's m3_kv_layer: element type
 * and geometry as ref/model.c chooses them), the fp8 index cache, paged reads */
static m3_status cache_variant(m3_gpu_model *m, m3_gpu_layer_cache *lc, bool sparse) {
    const m3_config *c = m->cfg;
    const m3_variant *v = &m->v;
    lc->variant = v;
    lc->paged = v->cache_layout == M3_LAYOUT_PAGED;
    if (lc->paged) {
        /* "bf16" caches store what the profile holds (ref): bf16 where k / v are rounded */
        const m3_kv_elem el = v->kv_cache == M3_CACHE_FP8 ? M3_KV_FP8
                              : (m->p.act_bf16 && m->p.qk_round != M3_QK_ROUND_NONE) ? M3_KV_BF16
                                                                                    : M3_KV_F32;
        m3_gpu_attn_paged_src *kv = &lc->kv;
        m3_kv_geom_init(&kv->g, c->n_kv_head, c->head_dim, c->index_block, 0, el, v->fp8_kind);
        kv->view = sparse ? M3_KV_VIEW_PAGE : M3_KV_VIEW_BLOCK;
        kv->bt = m->bt;
        kv->n_logical = m->n_blocks;
        const size_t nb = (size_t)m->n_blocks, eb = (size_t)kv->g.elem_bytes;
        const size_t kb = nb * (size_t)kv->g.k_block * eb, vb = nb * (size_t)kv->g.v_stride * eb;
        void *k = NULL, *vv = NULL;
        M3_TRY(m3_gpu_alloc(m->g, &k, kb));
        M3_TRY(m3_gpu_alloc(m->g, &vv, vb));
        /* zero-filled as ref's: padding elements stay 0 */
        M3_TRY(m3_gpu_memset(m->g, k, 0, kb));
        M3_TRY(m3_gpu_memset(m->g, vv, 0, vb));
        kv->k = k;
        kv->v = vv;
        if (el == M3_KV_FP8) {
            const size_t ns = nb * (size_t)c->n_kv_head * (size_t)c->index_block;
            float *ks = NULL, *vs = NULL, *ones = (float *)malloc(ns * sizeof(float));
            if (!ones) return m3_errorf(M3_ERR_NOMEM, "fp8 cache scales: out of memory");
            for (size_t i = 0; i < ns; i++) ones[i] = 1.0f; /* ref's unwritten scale */
            m3_status s = m3_gpu_alloc(m->g, (void **)&ks, ns * sizeof(float));
            if (!s) s = m3_gpu_alloc(m->g, (void **)&vs, ns * sizeof(float));
            if (!s) s = m3_gpu_upload(m->g, ks, ones, ns * sizeof(float));
            if (!s) s = m3_gpu_upload(m->g, vs, ones, ns * sizeof(float));
            free(ones);
            M3_TRY(s);
            kv->k_scale = ks;
            kv->v_scale = vs;
        }
    }
    if (lc->paged && sparse) {
        /* the paged index cache, elements as ref/model.c chooses them: fp8 (unit scale) when
         * the variant says so, bf16 where index keys are rounded, fp32 otherwise; zero-filled
         * as ref's */
        m3_gpu_index_keys *ix = &lc->ix;
        ix->elem = v->index_cache == M3_CACHE_FP8       ? M3_KV_FP8
                   : m->p.qk_round != M3_QK_ROUND_NONE ? M3_KV_BF16
                                                       : M3_KV_F32;
        ix->kind = v->fp8_kind;
        ix->bt = m->bt;
        ix->block = c->index_block;
        const size_t ib = (size_t)m->n_blocks * (size_t)c->index_block *
                          (size_t)c->index_head_dim * (size_t)m3_kv_elem_bytes(ix->elem);
        void *k = NULL;
        M3_TRY(m3_gpu_alloc(m->g, &k, ib));
        M3_TRY(m3_gpu_memset(m->g, k, 0, ib));
        ix->k = k;
    }
    return M3_OK;
}

extern "C" const m3_gpu_layer_cache *m3_gpu_model_layer_cache(const m3_gpu_model *m, int layer) {
    if (!m || m->cap == 0 || layer < 0 || layer >= m->cfg->n_layer) return NULL;
    return &m->cache[layer];
}

extern "C" m3_status m3_gpu_model_reserve(m3_gpu_model *m, int n_ctx) {
    if (n_ctx <= m->cap) return M3_OK;
    if (m->n_past > 0)
        return m3_errorf(M3_ERR_ARG,
                         "gpu: the device caches hold %d tokens and cannot grow past their "
                         "%d rows to %d; reserve the whole context before the first pass",
                         m->n_past, m->cap, n_ctx);
    const m3_config *c = m->cfg;
    int cap = m->cap > 0 ? m->cap : 64;
    while (cap < n_ctx) cap = cap > (1 << 29) ? n_ctx : cap * 2;
    m3_gpu_release(m->g, m->mark_caches);
    m->cap = 0;
    m->bt = NULL;
    m->n_blocks = 0;
    if (m->v.cache_layout == M3_LAYOUT_PAGED) {
        m3_status s = block_table(m, cap);
        if (s) {
            m3_gpu_release(m->g, m->mark_caches);
            return m3_error_context(s, "KV cache of %d tokens", cap);
        }
    }
    for (int L = 0; L < c->n_layer; L++) {
        /* paged: the index keys live in the paged index cache (cache_variant), no
         * contiguous index_k */
        const bool paged = m->v.cache_layout == M3_LAYOUT_PAGED;
        m3_status s = m3_gpu_layer_cache_alloc(m->g, &m->cache[L], c, c->layer_sparse[L] && !paged,
                                               cap, m->bf16);
        if (!s) s = cache_variant(m, &m->cache[L], c->layer_sparse[L]);
        if (s) {
            m3_gpu_release(m->g, m->mark_caches);
            memset(m->cache, 0, (size_t)c->n_layer * sizeof *m->cache);
            return m3_error_context(s, "KV cache of %d tokens", cap);
        }
    }
    m->cap = cap;
    return M3_OK;
}

/* ---- forward ----------------------------------------------------------------------------- */

static m3_status tap_g(const m3_hooks *h, const char *prefix, const char *stage, m3_dtype dt,
                       const void *data, int rank, int64_t d0, int64_t d1, const char *pd) {
    if (!h || !h->tap) return M3_OK;
    char key[M3_KEY_MAX];
    snprintf(key, sizeof key, "%s%s", prefix ? prefix : "", stage);
    m3_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.rank = rank;
    t.data = (void *)data;
    t.shape[0] = d0;
    t.shape[1] = d1;
    m3_status s = h->tap(h->tap_ctx, key, &t, pd);
    return s ? m3_error_context(s, "stage %s", key) : M3_OK;
}

/* a teacher-forced [T, D] float stage into the host buffer x */
static m3_status fetch_rows(const m3_hooks *h, const char *key, float *x, int T, int D) {
    m3_tensor t;
    memset(&t, 0, sizeof t);
    m3_status s = h->fetch(h->fetch_ctx, key, &t);
    if (s) return m3_error_context(s, "teacher-forced %s", key);
    if (t.dtype != M3_DT_F32 || t.rank != 2 || t.shape[0] != T || t.shape[1] != D) {
        free(t.data);
        return m3_errorf(M3_ERR_SHAPE,
                         "teacher-forced %s: expected float [%d, %d], got rank %d [%lld, ...]",
                         key, T, D, t.rank, (long long)t.shape[0]);
    }
    memcpy(x, t.data, (size_t)T * (size_t)D * sizeof(float));
    free(t.data);
    return M3_OK;
}

template <typename TS>
static m3_status forward(m3_gpu_model *m, const int32_t *tok, const int32_t *pos, int T,
                         const m3_hooks *hk, const char *prefix, float *logits_last,
                         int32_t *next, float *hx) {
    const m3_config *c = m->cfg;
    const m3_profile *p = &m->p;
    m3_gpu *g = m->g;
    const int D = c->hidden, V = c->vocab;
    const size_t n = (size_t)T * D;
    const bool dump = hk && hk->tap;
    const bool force_in = hk && hk->fetch && hk->force_input;

    M3_TRY(tap_g(hk, prefix, "tokens", M3_DT_I32, tok, 1, T, 0, "int32"));
    M3_TRY(tap_g(hk, prefix, "positions", M3_DT_I32, pos, 1, T, 0, "int32"));
    int32_t *d_pos;
    TS *x, *h;
    M3_TRY(m3_gpu_alloc(g, (void **)&d_pos, (size_t)T * sizeof(int32_t)));
    M3_TRY(m3_gpu_upload(g, d_pos, pos, (size_t)T * sizeof(int32_t)));
    M3_TRY(m3_gpu_alloc(g, (void **)&x, n * sizeof(TS)));
    M3_TRY(m3_gpu_alloc(g, (void **)&h, n * sizeof(TS)));
    M3_TRY(embed_rows(m, hx, tok, T));
    drop_prefix(m, "language_model.model.embed_tokens.");
    M3_TRY(m3_gpu_ul_(g, x, hx, n));
    M3_TRY(tap_g(hk, prefix, "embed", M3_DT_F32, hx, 2, T, D, m3_stage_dtype(p, "embed")));

    /* top-k reuse never crosses passes (spec §3.9): a fresh share per pass, sized for a
     * selection of top-k blocks per (index head, token) */
    m->share.layer = -1;
    m->share.cap = (size_t)(c->index_n_heads > 0 ? c->index_n_heads : 1) * (size_t)T *
                   (size_t)(c->index_topk > 0 ? c->index_topk : 1);
    M3_TRY(m3_gpu_alloc(g, (void **)&m->share.topk, m->share.cap * sizeof(int32_t)));
    bool h_pending = false;
    char key[M3_KEY_MAX];
    for (int L = 0; L < c->n_layer; L++) {
        m->cache[L].share = &m->share;
        m->cache[L].reuse_topk = c->layer_sparse[L] && !m->computes[L];
        if (force_in) {
            m3_layer_key(key, prefix, c->n_layer, L, "input");
            M3_TRY(fetch_rows(hk, key, hx, T, D));
            M3_TRY(m3_gpu_ul_(g, x, hx, n));
            h_pending = false;
        }
        m3_gpu_layer_weights *lw = m->resident ? m->lw[L] : NULL;
        const size_t wmark = m3_gpu_mark(g);
        if (!lw) M3_TRY(upload_layer(m, L, &lw));
        m3_status s = m3_gpu_layer_forward(g, x, h, &h_pending, T, d_pos, pos, lw, c, p,
                                           &m->cache[L], hk, prefix, &m->o);
        if (!m->resident) {
            m3_gpu_layer_weights_free(lw);
            m3_gpu_release(g, wmark);
        }
        M3_TRY(s);
    }
    if (force_in) {
        m3_layer_key(key, prefix, c->n_layer, c->n_layer - 1, "output");
        M3_TRY(fetch_rows(hk, key, hx, T, D));
        M3_TRY(m3_gpu_ul_(g, x, hx, n));
        h_pending = false;
    }

    /* final norm, then lm_head over every row when dumping, else the last one */
    TS *y;
    M3_TRY(m3_gpu_alloc(g, (void **)&y, n * sizeof(TS)));
    M3_TRY(m3_gpu_norm_add_(g, y, x, h_pending ? h : NULL, m->final_norm, T, D, c->rms_eps, p));
    if (dump) {
        M3_TRY(m3_gpu_dl_(g, hx, y, n));
        M3_TRY(tap_g(hk, prefix, "final_norm", M3_DT_F32, hx, 2, T, D,
                     m3_stage_dtype(p, "final_norm")));
    }
    const void *head = m->head;
    if (!head) {
        M3_TRY(upload_head(m, &head));
        drop_prefix(m, c->tie_word_embeddings ? "language_model.model.embed_tokens."
                                              : "language_model.lm_head.");
    }
    const int rows = dump ? T : 1;
    TS *lg;
    M3_TRY(m3_gpu_alloc(g, (void **)&lg, (size_t)rows * V * sizeof(TS)));
    M3_TRY(m3_gpu_linear_(g, lg, y + (size_t)(T - rows) * D, head, rows, V, D, p));
    float *hl = (float *)malloc((size_t)rows * V * sizeof(float));
    if (!hl) return m3_errorf(M3_ERR_NOMEM, "logits [%d, %d]: out of memory", rows, V);
    m3_status s = m3_gpu_dl_(g, hl, lg, (size_t)rows * V);
    if (!s) s = tap_g(hk, prefix, "logits", M3_DT_F32, hl, 2, rows, V, m3_stage_dtype(p, "logits"));
    const float *last = hl + (size_t)(rows - 1) * V;
    if (!s && logits_last) memcpy(logits_last, last, (size_t)V * sizeof(float));
    if (!s && next) *next = m3_argmax(last, V);
    free(hl);
    return s;
}

extern "C" m3_status m3_gpu_model_forward(m3_gpu_model *m, const int32_t *tok,
                                          const int32_t *pos_in, int T, const m3_hooks *hk,
                                          const char *prefix, float *logits_last,
                                          int32_t *next) {
    const m3_config *c = m->cfg;
    if (T < 1) return m3_errorf(M3_ERR_ARG, "forward: no tokens");
    if ((int64_t)m->n_past + T > c->max_pos)
        return m3_errorf(M3_ERR_ARG, "forward: %d + %d tokens exceed max_position_embeddings %lld",
                         m->n_past, T, (long long)c->max_pos);
    for (int t = 0; t < T; t++) {
        if (tok[t] < 0 || tok[t] >= c->vocab)
            return m3_errorf(M3_ERR_ARG,
                             "token id %d at position %d is outside the vocabulary [0, %d)",
                             tok[t], t, c->vocab);
        if (pos_in && pos_in[t] != m->n_past + t)
            return m3_errorf(M3_ERR_ARG,
                             "position %d of token %d: expected %d (positions must continue the "
                             "cache without gaps)",
                             pos_in[t], t, m->n_past + t);
    }
    M3_TRY(m3_gpu_model_reserve(m, m->n_past + T));
    const size_t n = (size_t)T * (size_t)c->hidden;
    float *hx = (float *)malloc(n * sizeof(float));
    int32_t *pos = (int32_t *)malloc((size_t)T * sizeof *pos);
    m3_status s = M3_OK;
    if (!hx || !pos) s = m3_errorf(M3_ERR_NOMEM, "activations [%d, %d]: out of memory", T, c->hidden);
    if (!s) {
        for (int t = 0; t < T; t++) pos[t] = m->n_past + t;
        const int n0 = m->n_past;
        const size_t mark = m3_gpu_mark(m->g);
        s = m->bf16 ? forward<m3_bf16>(m, tok, pos, T, hk, prefix, logits_last, next, hx)
                    : forward<float>(m, tok, pos, T, hk, prefix, logits_last, next, hx);
        /* make sure nothing still reads the pass's memory before it is handed back */
        if (m3_gpu_sync(m->g) != M3_OK && s == M3_OK) s = M3_ERR_DEVICE;
        m3_gpu_release(m->g, mark);
        /* the caches are append-only: rolling n_past back undoes a failed pass */
        set_n_past(m, s ? n0 : n0 + T);
    }
    free(hx);
    free(pos);
    return s;
}
