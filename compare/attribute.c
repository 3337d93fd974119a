/* compare/attribute.c: see attribute.h. The factor table, the baseline capture, the
 * per-factor runs (tap callbacks that compare one stage at a time) and the verdicts. */
#include "compare/attribute.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compare/tol.h"
#include "ref/config.h"
#include "ref/model.h"
#include "ref/profile.h"
#include "ref/variant.h"

/* ---- the factor table ------------------------------------------------------------------
 * One row per factor. A factor is a profile and variant keys applied on top of the fp32
 * baseline; everything else stays at the baseline. "all" is the production recipe of spec
 * §5.11 ("native": MXFP8 experts, fp8 KV, fp8 index cache, top-k reuse every 4th sparse
 * layer) on the atom profile; ptpc is not a factor here. */
static const m3_attr_factor factors[] = {
    {"fp32", "fp32", "", "output", "control: the baseline again; every number must be 0", true,
     false},
    {"hf", "hf", "", "output", "transformers bf16 rounding points (spec §0, §3.17)", false, false},
    {"atom", "atom", "", "output", "ATOM's bf16 rounding points and conventions (spec §0, §9)",
     false, false},
    {"mxfp4", "fp32", "experts=mxfp4", "mlp_out", "MXFP4 routed + shared experts (spec §5.4)",
     false, false},
    {"mxfp8", "fp32", "experts=mxfp8", "mlp_out", "MXFP8 routed + shared experts (spec §5.5)",
     false, false},
    {"kv-fp8", "fp32", "kv_cache=fp8", "attn_out",
     "fp8 main KV cache, per-token scales (spec §4.7)", false, false},
    {"index-fp8", "fp32", "index_cache=fp8", "index_scores",
     "fp8 index-key cache at unit scale (spec §4.8, §3.8)", false, false},
    {"topk-reuse", "fp32", "topk_reuse=4", "index_topk",
     "sparse layers reuse the top-k of the last computing layer, freq 4 (spec §3.9)", false, false},
    {"all", "atom", "experts=mxfp8,kv_cache=fp8,index_cache=fp8,topk_reuse=4", "output",
     "everything together: atom + the native recipe of spec §5.11 (MXFP8, fp8 KV and index, "
     "reuse 4)",
     false, true},
};
#define N_FACTORS ((int)(sizeof factors / sizeof factors[0]))

const m3_attr_factor *m3_attr_factors(int *n) {
    *n = N_FACTORS;
    return factors;
}

const m3_attr_factor *m3_attr_factor_find(const char *name) {
    for (int i = 0; i < N_FACTORS; i++)
        if (!strcmp(factors[i].name, name)) return &factors[i];
    return NULL;
}

const char *m3_attr_mode_name(int mode) {
    return mode == M3_ATTR_FORCED ? "forced" : "free";
}

static const char *const stage_names[M3_ATTR_N_STAGE] = {
    "index_scores", "index_topk", "attn_out", "attn_proj", "expert_ids", "mlp_out", "output"};

const char *m3_attr_stage_name(int s) {
    return s >= 0 && s < M3_ATTR_N_STAGE ? stage_names[s] : "?";
}
bool m3_attr_stage_is_set(int s) {
    return s == M3_ATTR_INDEX_TOPK || s == M3_ATTR_EXPERT_IDS;
}
int m3_attr_stage_find(const char *name) {
    for (int s = 0; s < M3_ATTR_N_STAGE; s++)
        if (!strcmp(stage_names[s], name)) return s;
    return -1;
}

/* ---- baseline capture ------------------------------------------------------------------ */

/* One captured baseline stage: "layers/NN/<stage>" or "logits". Float data as float, ids as
 * int32; router_logits are kept as the sigmoid scores used to classify expert flips. */
typedef struct capture {
    char key[M3_KEY_MAX];
    m3_tensor t; /* owned data */
} capture;

typedef struct base_ctx {
    capture *c;
    int n, cap;
    int n_layer;
    size_t bytes;
} base_ctx;

static const capture *cap_find(const base_ctx *b, const char *key) {
    for (int i = 0; i < b->n; i++)
        if (!strcmp(b->c[i].key, key)) return &b->c[i];
    return NULL;
}

/* "layers/NN/<stage>" -> layer and stage name; false for any other key. */
static bool parse_layer_key(const char *key, int *layer, char *stage, size_t cap) {
    if (strncmp(key, "layers/", 7)) return false;
    char *end;
    long L = strtol(key + 7, &end, 10);
    if (end == key + 7 || *end != '/' || L < 0 || L > 100000) return false;
    snprintf(stage, cap, "%s", end + 1);
    *layer = (int)L;
    return true;
}

/* Which baseline stages are held: the compared ones, the layer inputs (forcing), the
 * score stages that classify flips, the last layer's output and the logits. A layer's
 * output is the next layer's input (ref/layer.h), so only the last one is kept. */
static bool want_capture(const base_ctx *b, const char *key) {
    int L;
    char st[64];
    if (!strcmp(key, "logits")) return true;
    if (!parse_layer_key(key, &L, st, sizeof st)) return false;
    if (!strcmp(st, "output")) return L == b->n_layer - 1;
    return !strcmp(st, "input") || !strcmp(st, "router_logits") || (m3_attr_stage_find(st) >= 0);
}

static m3_status base_tap(void *ctx, const char *key, const m3_tensor *t, const char *dt) {
    (void)dt;
    base_ctx *b = ctx;
    /* every factor is measured against the baseline: a NaN there would read as "no error"
     * (NaN agrees with NaN). index_scores holds +Inf for forced blocks by construction. */
    if (t->dtype == M3_DT_F32 && !strstr(key, "index_scores")) {
        const float *x = t->data;
        for (int64_t i = 0, n = m3_tensor_numel(t); i < n; i++)
            if (!isfinite(x[i]))
                return m3_errorf(M3_ERR_NUMERIC,
                                 "%s at flat index %lld: the baseline must be finite "
                                 "(non-finite weights? m3 run --dump shows where it starts)",
                                 isnan(x[i]) ? "NaN" : "Inf", (long long)i);
    }
    if (!want_capture(b, key)) return M3_OK;
    if (t->dtype != M3_DT_F32 && t->dtype != M3_DT_I32)
        return m3_errorf(M3_ERR_FORMAT, "baseline stage %s: unexpected dtype", key);
    if (b->n == b->cap) {
        int nc = b->cap ? 2 * b->cap : 64;
        capture *c = realloc(b->c, (size_t)nc * sizeof *c);
        if (!c) return m3_errorf(M3_ERR_NOMEM, "baseline capture: out of memory");
        b->c = c;
        b->cap = nc;
    }
    capture *c = &b->c[b->n];
    memset(c, 0, sizeof *c);
    snprintf(c->key, sizeof c->key, "%s", key);
    c->t = *t;
    size_t bytes = (size_t)m3_tensor_numel(t) * 4;
    c->t.data = malloc(bytes ? bytes : 1);
    if (!c->t.data) return m3_errorf(M3_ERR_NOMEM, "baseline capture %s: out of memory", key);
    memcpy(c->t.data, t->data, bytes);
    size_t n = strlen(key);
    if (n > 14 && !strcmp(key + n - 14, "/router_logits")) {
        /* the expert selection score without the routing bias (not a dump stage): the same
         * approximation `m3 compare` makes without router_bias (docs/compare.md) */
        float *s = c->t.data;
        for (int64_t i = 0; i < m3_tensor_numel(t); i++)
            s[i] = 1.0f / (1.0f + expf(-s[i]));
    }
    b->bytes += bytes;
    b->n++;
    return M3_OK;
}

static void base_free(base_ctx *b) {
    for (int i = 0; i < b->n; i++)
        free(b->c[i].t.data);
    free(b->c);
    memset(b, 0, sizeof *b);
}

/* m3_fetch_fn for teacher forcing from the baseline. */
static m3_status base_fetch(void *ctx, const char *key, m3_tensor *out) {
    const base_ctx *b = ctx;
    const capture *c = cap_find(b, key);
    if (!c)
        return m3_errorf(M3_ERR_MISSING, "baseline has no stage '%s' to teacher-force from", key);
    *out = c->t;
    size_t bytes = (size_t)m3_tensor_numel(&c->t) * 4;
    out->data = malloc(bytes ? bytes : 1);
    if (!out->data) return m3_errorf(M3_ERR_NOMEM, "teacher forcing %s: out of memory", key);
    memcpy(out->data, c->t.data, bytes);
    return M3_OK;
}

/* ---- one factor run -------------------------------------------------------------------- */

typedef struct run_ctx {
    const base_ctx *base;
    m3_attr_run *run;
    int n_layer;
    double tie_abs[M3_ATTR_N_STAGE], tie_rel[M3_ATTR_N_STAGE];
} run_ctx;

static m3_status compare_logits(run_ctx *c, const capture *b, const m3_tensor *t) {
    if (m3_tensor_numel(t) != m3_tensor_numel(&b->t) || t->rank != 2)
        return m3_errorf(M3_ERR_SHAPE, "logits: shape differs from the baseline's");
    m3_attr_logits *lg = &c->run->logits;
    int64_t rows = t->shape[0], V = t->shape[1];
    lg->present = true;
    lg->diff = m3_diff_f32(b->t.data, t->data, rows * V, V, 0.01);
    double kl_sum = 0, kl_max = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t ta, tb;
        double dp;
        double kl = m3_logits_row((const float *)b->t.data + r * V, (const float *)t->data + r * V,
                                  V, &ta, &tb, &dp);
        kl_sum += kl;
        if (kl > kl_max || isnan(kl)) kl_max = kl;
        lg->top1_agree += ta == tb;
    }
    lg->rows = rows;
    lg->kl_mean = rows ? kl_sum / (double)rows : 0;
    lg->kl_max = kl_max;
    return M3_OK;
}

static m3_status run_tap(void *ctx, const char *key, const m3_tensor *t, const char *dt) {
    (void)dt;
    run_ctx *c = ctx;
    if (!strcmp(key, "logits")) {
        const capture *b = cap_find(c->base, key);
        return b ? compare_logits(c, b, t) : M3_OK;
    }
    int L;
    char st[64], bkey[M3_KEY_MAX];
    if (!parse_layer_key(key, &L, st, sizeof st) || L >= c->n_layer) return M3_OK;
    int s = m3_attr_stage_find(st);
    if (s < 0) return M3_OK;
    /* layer L's output is stored as layer L+1's input */
    if (s == M3_ATTR_OUTPUT && L + 1 < c->n_layer)
        m3_layer_key(bkey, "", c->n_layer, L + 1, "input");
    else
        snprintf(bkey, sizeof bkey, "%s", key);
    const capture *b = cap_find(c->base, bkey);
    if (!b) return M3_OK; /* a stage the baseline does not have: nothing to compare with */
    m3_attr_cell *cell = &c->run->layer[L];
    int64_t n = m3_tensor_numel(t);
    int64_t row = t->rank ? t->shape[t->rank - 1] : 1;
    int64_t brow = b->t.rank ? b->t.shape[b->t.rank - 1] : 1;
    if (m3_attr_stage_is_set(s)) {
        if (t->dtype != M3_DT_I32 || b->t.dtype != M3_DT_I32 || row < 1 || brow < 1 ||
            n / row != m3_tensor_numel(&b->t) / brow)
            return m3_errorf(M3_ERR_SHAPE, "%s: rows differ from the baseline's", key);
        /* the baseline's own scores classify near-tie flips (docs/compare.md) */
        const float *score = NULL;
        int64_t n_score = 0;
        char skey[M3_KEY_MAX];
        m3_layer_key(skey, "", c->n_layer, L,
                     s == M3_ATTR_INDEX_TOPK ? "index_scores" : "router_logits");
        const capture *sc = cap_find(c->base, skey);
        if (sc && sc->t.rank >= 1 && sc->t.dtype == M3_DT_F32) {
            n_score = sc->t.shape[sc->t.rank - 1];
            if (m3_tensor_numel(&sc->t) / n_score == n / row) score = sc->t.data;
        }
        m3_setdiff_init(&cell->set[s]);
        m3_setdiff_rows(&cell->set[s], b->t.data, (int)brow, t->data, (int)row, n / row, score,
                        n_score, c->tie_abs[s], c->tie_rel[s], 0);
    } else {
        if (t->dtype != M3_DT_F32 || n != m3_tensor_numel(&b->t))
            return m3_errorf(M3_ERR_SHAPE, "%s: %lld elements, the baseline has %lld", key,
                             (long long)n, (long long)m3_tensor_numel(&b->t));
        cell->diff[s] = m3_diff_f32(b->t.data, t->data, n, row, 0.01);
    }
    cell->present[s] = true;
    return M3_OK;
}

/* Apply "k=v,k=v" to v. With `drop`, keys this build cannot run (M3_ERR_UNSUPPORTED) are
 * skipped and appended to left_out; without, the first one is returned. applied receives
 * the keys that were set. */
static m3_status apply_keys(m3_variant *v, const char *keys, bool drop, char *applied, size_t acap,
                            char *left_out, size_t lcap) {
    m3_variant_default(v);
    applied[0] = left_out[0] = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", keys);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        M3_ASSERT(eq); /* the table is ours */
        *eq = 0;
        m3_variant trial = *v;
        m3_status s = m3_variant_set(&trial, kv, eq + 1);
        if (!s) s = m3_variant_check(&trial);
        /* A key that ref/variant.h documents but this build's setters do not know yet (today:
         * topk_reuse) is a capability this build lacks, not a bad argument. */
        if (s == M3_ERR_ARG && strstr(m3_last_error(), "unknown variant option"))
            s = m3_errorf(M3_ERR_UNSUPPORTED, "variant key '%s' is not implemented in this build",
                          kv);
        char *dst = applied;
        size_t cap = acap;
        if (s == M3_ERR_UNSUPPORTED && drop) {
            m3_clear_error();
            dst = left_out, cap = lcap;
        } else if (s) {
            return s;
        } else {
            *v = trial;
        }
        size_t len = strlen(dst);
        snprintf(dst + len, cap - len, "%s%s=%s", len ? "," : "", kv, eq + 1);
    }
    return M3_OK;
}

/* The one place that hands a variant to the reference model (m3_model_set_variant, before
 * the first forward). A variant the model cannot run comes back as M3_ERR_UNSUPPORTED and the
 * factor is then "unavailable in this build". */
static m3_status open_model(m3_model **m, const m3_attr_opts *o, const m3_profile *p,
                            const m3_variant *v) {
    M3_TRY(m3_model_open(m, o->model, o->override_json, p));
    m3_status s = m3_model_set_variant(*m, v);
    if (s) {
        m3_model_close(*m);
        *m = NULL;
    }
    return s;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Run factor f in mode `mode` into r->run. UNSUPPORTED marks the factor unavailable. */
static m3_status run_factor(m3_attr_result *r, int f, int mode, const m3_attr_opts *o,
                            const base_ctx *base, const m3_tol *tol) {
    const m3_attr_factor *fac = r->factor[f];
    m3_attr_run *run = &r->run[f * M3_ATTR_N_MODE + mode];
    double t0 = now_s();
    m3_profile p;
    M3_TRY(m3_profile_by_name(&p, fac->profile));
    m3_variant v;
    char left[256];
    m3_status s = apply_keys(&v, fac->keys, fac->combined, r->applied[f], sizeof r->applied[f],
                             left, sizeof left);
    if (fac->combined) snprintf(r->left_out[f], sizeof r->left_out[f], "%s", left);
    m3_model *m = NULL;
    if (!s) s = open_model(&m, o, &p, &v);
    run_ctx rc = {.base = base, .run = run, .n_layer = r->n_layer};
    const m3_tol_row *ti = m3_tol_find(tol, "index_topk"), *te = m3_tol_find(tol, "expert_ids");
    rc.tie_abs[M3_ATTR_INDEX_TOPK] = ti->tie_abs;
    rc.tie_rel[M3_ATTR_INDEX_TOPK] = ti->tie_rel;
    rc.tie_abs[M3_ATTR_EXPERT_IDS] = te->tie_abs;
    rc.tie_rel[M3_ATTR_EXPERT_IDS] = te->tie_rel;
    if (!s) {
        run->layer = calloc((size_t)r->n_layer, sizeof *run->layer);
        if (!run->layer) s = m3_errorf(M3_ERR_NOMEM, "out of memory");
    }
    m3_hooks hk = {.tap = run_tap,
                   .tap_ctx = &rc,
                   .fetch = mode == M3_ATTR_FORCED ? base_fetch : NULL,
                   .fetch_ctx = (void *)base,
                   .force_input = mode == M3_ATTR_FORCED};
    if (!s) s = m3_model_forward(m, o->tokens, NULL, o->n_tok, &hk, "", NULL, &run->next);
    m3_model_close(m);
    if (s == M3_ERR_UNSUPPORTED) {
        r->available[f] = false;
        snprintf(r->why[f], sizeof r->why[f], "%s", m3_last_error());
        m3_clear_error();
        free(run->layer);
        run->layer = NULL;
        memset(&run->logits, 0, sizeof run->logits);
        return M3_OK;
    }
    if (s) return m3_error_context(s, "factor %s (%s mode)", fac->name, m3_attr_mode_name(mode));
    run->ran = true;
    run->seconds = now_s() - t0;
    return M3_OK;
}

m3_status m3_attribute(m3_attr_result **out, const m3_attr_opts *o) {
    *out = NULL;
    double t0 = now_s();
    if (!o->mode[M3_ATTR_FREE] && !o->mode[M3_ATTR_FORCED])
        return m3_errorf(M3_ERR_ARG, "attribute: no mode to run");
    m3_attr_result *r = calloc(1, sizeof *r);
    if (!r) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    snprintf(r->model, sizeof r->model, "%s", o->model);
    r->n_tok = o->n_tok;
    r->mode[0] = o->mode[0];
    r->mode[1] = o->mode[1];
    int nf = o->factors ? o->n_factors : N_FACTORS;
    r->n_factor = nf;
    r->factor = calloc((size_t)nf, sizeof *r->factor);
    r->available = calloc((size_t)nf, sizeof *r->available);
    r->why = calloc((size_t)nf, sizeof *r->why);
    r->applied = calloc((size_t)nf, sizeof *r->applied);
    r->left_out = calloc((size_t)nf, sizeof *r->left_out);
    r->run = calloc((size_t)nf * M3_ATTR_N_MODE, sizeof *r->run);
    m3_status s = M3_OK;
    if (!r->factor || !r->available || !r->why || !r->applied || !r->left_out || !r->run)
        s = m3_errorf(M3_ERR_NOMEM, "out of memory");
    for (int f = 0; !s && f < nf; f++) {
        r->factor[f] = o->factors ? m3_attr_factor_find(o->factors[f]) : &factors[f];
        if (!r->factor[f])
            s = m3_errorf(M3_ERR_ARG, "--factors: unknown factor '%s'", o->factors[f]);
        r->available[f] = true;
    }

    /* the baseline, free-running, with its stages captured */
    m3_profile p32;
    m3_profile_fp32(&p32);
    m3_model *m = NULL;
    base_ctx base = {0};
    if (!s) s = m3_model_open(&m, o->model, o->override_json, &p32);
    if (!s) {
        const m3_config *c = m3_model_config(m);
        r->n_layer = base.n_layer = c->n_layer;
        r->layer_sparse = calloc((size_t)c->n_layer, sizeof(bool));
        r->layer_moe = calloc((size_t)c->n_layer, sizeof(bool));
        if (!r->layer_sparse || !r->layer_moe) s = m3_errorf(M3_ERR_NOMEM, "out of memory");
        for (int L = 0; !s && L < c->n_layer; L++) {
            r->layer_sparse[L] = c->layer_sparse[L];
            r->layer_moe[L] = c->layer_moe[L];
        }
    }
    m3_hooks hk = {.tap = base_tap, .tap_ctx = &base};
    if (!s) s = m3_model_forward(m, o->tokens, NULL, o->n_tok, &hk, "", NULL, &r->base_next);
    if (s) m3_error_context(s, "baseline (fp32)");
    m3_model_close(m);
    r->capture_bytes = base.bytes;

    m3_tol tol;
    m3_tol_builtin(&tol);
    for (int f = 0; !s && f < nf; f++)
        for (int mode = 0; !s && mode < M3_ATTR_N_MODE; mode++)
            if (o->mode[mode] && r->available[f]) s = run_factor(r, f, mode, o, &base, &tol);
    /* a factor that became unavailable in its second mode has no first-mode result either:
     * keep the outputs consistent */
    for (int f = 0; !s && f < nf; f++)
        if (!r->available[f])
            for (int mode = 0; mode < M3_ATTR_N_MODE; mode++) {
                m3_attr_run *run = &r->run[f * M3_ATTR_N_MODE + mode];
                free(run->layer);
                memset(run, 0, sizeof *run);
            }
    base_free(&base);
    if (s) {
        m3_attr_result_free(r);
        return s;
    }
    r->seconds = now_s() - t0;
    *out = r;
    return M3_OK;
}

void m3_attr_result_free(m3_attr_result *r) {
    if (!r) return;
    if (r->run)
        for (int i = 0; i < r->n_factor * M3_ATTR_N_MODE; i++)
            free(r->run[i].layer);
    free(r->run);
    free(r->factor);
    free(r->available);
    free(r->why);
    free(r->applied);
    free(r->left_out);
    free(r->layer_sparse);
    free(r->layer_moe);
    free(r);
}

const m3_attr_run *m3_attr_get(const m3_attr_result *r, int f, int mode) {
    M3_ASSERT(f >= 0 && f < r->n_factor && mode >= 0 && mode < M3_ATTR_N_MODE);
    return &r->run[f * M3_ATTR_N_MODE + mode];
}

double m3_attr_nmse(const m3_attr_result *r, int f, int mode, int L, int s) {
    const m3_attr_run *run = m3_attr_get(r, f, mode);
    if (!run->ran || L < 0 || L >= r->n_layer || !run->layer[L].present[s] ||
        m3_attr_stage_is_set(s))
        return NAN;
    return m3_diff_nmse(&run->layer[L].diff[s]);
}

int64_t m3_attr_flips(const m3_attr_result *r, int f, int mode, int L, int s) {
    const m3_attr_run *run = m3_attr_get(r, f, mode);
    if (!run->ran || L < 0 || L >= r->n_layer || !run->layer[L].present[s] ||
        !m3_attr_stage_is_set(s))
        return 0;
    return run->layer[L].set[s].rows - run->layer[L].set[s].rows_equal;
}

int m3_attr_verdict_mode(const m3_attr_result *r) {
    return r->mode[M3_ATTR_FORCED] ? M3_ATTR_FORCED : M3_ATTR_FREE;
}

/* A non-finite mismatch (NaN / Inf where the baseline is finite) outranks any NMSE. */
static double rank_value(const m3_attr_result *r, int f, int mode, int L) {
    const m3_attr_run *run = m3_attr_get(r, f, mode);
    if (!run->ran) return -1;
    if (run->layer[L].present[M3_ATTR_OUTPUT] &&
        run->layer[L].diff[M3_ATTR_OUTPUT].nonfinite_mismatch)
        return INFINITY;
    double e = m3_attr_nmse(r, f, mode, L, M3_ATTR_OUTPUT);
    return isnan(e) ? -1 : e;
}

void m3_attr_verdict(const m3_attr_result *r, int mode, int L, char *buf, size_t cap) {
    int idx[64], n = 0;
    for (int f = 0; f < r->n_factor && n < 64; f++)
        if (!r->factor[f]->control && !r->factor[f]->combined && rank_value(r, f, mode, L) >= 0)
            idx[n++] = f;
    for (int i = 1; i < n; i++) /* by contribution, descending (stable: table order on ties) */
        for (int j = i;
             j > 0 && rank_value(r, idx[j], mode, L) > rank_value(r, idx[j - 1], mode, L); j--) {
            int t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    int len = snprintf(buf, cap, "layer %0*d: ", r->n_layer >= 100 ? 3 : 2, L);
    if (len < 0 || (size_t)len >= cap) return;
    char *p = buf + len;
    size_t left = cap - (size_t)len;
    if (n == 0) {
        snprintf(p, left, "no single factor was run (only the control or the combined row)");
        return;
    }
    double top = rank_value(r, idx[0], mode, L);
    if (top == 0) {
        snprintf(p, left, "no factor changes the output (all NMSE 0)");
        return;
    }
    /* "dominates" when the runner-up is at least 2x smaller, else "leads" */
    double second = n > 1 ? rank_value(r, idx[1], mode, L) : 0;
    /* the top factor's set flips, which usually explain a jump in NMSE */
    char fl[96] = "";
    int64_t fi = m3_attr_flips(r, idx[0], mode, L, M3_ATTR_INDEX_TOPK),
            fe = m3_attr_flips(r, idx[0], mode, L, M3_ATTR_EXPERT_IDS);
    if (fi || fe)
        snprintf(fl, sizeof fl, "; flips: index_topk %lld, expert_ids %lld", (long long)fi,
                 (long long)fe);
    int k = isinf(top) ? snprintf(p, left, "%s (non-finite values%s) dominates",
                                  r->factor[idx[0]]->name, fl)
                       : snprintf(p, left, "%s (NMSE %.1e%s) %s", r->factor[idx[0]]->name, top, fl,
                                  second * 2 <= top ? "dominates" : "leads");
    for (int i = 1; i < n && i < 3 && k >= 0 && (size_t)k < left; i++) {
        double e = rank_value(r, idx[i], mode, L);
        char num[32];
        if (e == 0)
            snprintf(num, sizeof num, "0");
        else
            snprintf(num, sizeof num, "%.1e", e);
        k += snprintf(p + k, left - (size_t)k, "%s %s %s", i == 1 ? ";" : ",",
                      r->factor[idx[i]]->name, num);
    }
}
