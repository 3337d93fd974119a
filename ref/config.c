/* ref/config.c: see config.h. Field resolution follows spec/m3-numerics.md §1.1. */
#include "ref/config.h"

#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ref/json.h"

#define MAX_LAYERS 4096 /* sanity bound on per-layer arrays (M3 has 60) */
#define MAX_DIM (1 << 24)

typedef struct {
    m3_config *cfg;
    const m3_json *root; /* the whole document */
    const m3_json *tc;   /* text_config, or root for a flat config */
    const m3_json *sac;  /* sparse_attention_config (may be NULL) */
    const m3_json *rp;   /* rope_parameters of the text model (may be NULL) */
    const char *path;
    const char *tcname; /* "text_config." or "" (for messages) */
    /* the JSON values of the fp32 scalars, for validate()'s messages */
    double rms_eps_json, swiglu_alpha_json, swiglu_limit_json, routed_scale_json;
} ctx;

void m3_warnings_addf(char ***list, int *n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *line = len < 0 ? NULL : malloc((size_t)len + 1);
    char **nl = line ? realloc(*list, (size_t)(*n + 1) * sizeof *nl) : NULL;
    if (!nl) {
        free(line);
        return;
    }
    va_start(ap, fmt);
    vsnprintf(line, (size_t)len + 1, fmt, ap);
    va_end(ap);
    *list = nl;
    nl[(*n)++] = line;
}

#define cfg_warn(c, ...) m3_warnings_addf(&(c)->warnings, &(c)->n_warnings, __VA_ARGS__)

/* A member treated as absent when JSON null. */
static const m3_json *member(const m3_json *obj, const char *key) {
    const m3_json *j = m3_json_get(obj, key);
    return m3_json_is_null(j) ? NULL : j;
}

/* Text field: text_config first, then the top level (per-field fallback, §1.1). */
static const m3_json *text_get(const ctx *x, const char *key, const char **where) {
    const m3_json *j = member(x->tc, key);
    if (j) {
        if (where) *where = x->tcname;
        return j;
    }
    if (x->tc != x->root) {
        j = member(x->root, key);
        if (where) *where = "";
    }
    return j;
}

/* Integer field from node j (NULL -> def). */
static m3_status int_of(const ctx *x, const m3_json *j, const char *where, const char *key,
                        int64_t lo, int64_t hi, int64_t def, int64_t *out) {
    if (!j) {
        *out = def;
        return M3_OK;
    }
    int64_t v;
    if (!m3_json_int(j, &v))
        return m3_errorf(M3_ERR_FORMAT, "%s: %s%s must be an integer", x->path, where, key);
    if (v < lo || v > hi)
        return m3_errorf(M3_ERR_FORMAT, "%s: %s%s = %lld is out of range [%lld, %lld]", x->path,
                         where, key, (long long)v, (long long)lo, (long long)hi);
    *out = v;
    return M3_OK;
}

static m3_status text_int(const ctx *x, const char *key, int64_t lo, int64_t hi, int64_t def,
                          int *out) {
    const char *where = "";
    const m3_json *j = text_get(x, key, &where);
    int64_t v;
    M3_TRY(int_of(x, j, where, key, lo, hi, def, &v));
    *out = (int)v;
    return M3_OK;
}

static m3_status num_of(const ctx *x, const m3_json *j, const char *where, const char *key,
                        double def, double *out) {
    if (!j) {
        *out = def;
        return M3_OK;
    }
    if (!m3_json_double(j, out))
        return m3_errorf(M3_ERR_FORMAT, "%s: %s%s must be a number", x->path, where, key);
    if (!isfinite(*out))
        return m3_errorf(M3_ERR_FORMAT, "%s: %s%s must be finite", x->path, where, key);
    return M3_OK;
}

static m3_status text_num(const ctx *x, const char *key, double def, double *out) {
    const char *where = "";
    const m3_json *j = text_get(x, key, &where);
    return num_of(x, j, where, key, def, out);
}

static m3_status bool_of(const ctx *x, const m3_json *j, const char *where, const char *key,
                         bool def, bool *out) {
    if (!j) {
        *out = def;
        return M3_OK;
    }
    if (!m3_json_bool(j, out))
        return m3_errorf(M3_ERR_FORMAT, "%s: %s%s must be true or false", x->path, where, key);
    return M3_OK;
}

/* Index geometry: the legacy key inside sparse_attention_config overrides the flat key. */
static m3_status index_int(const ctx *x, const char *flat, const char *legacy, int def, int *out) {
    const m3_json *j = member(x->sac, legacy);
    if (j) {
        char where[64];
        snprintf(where, sizeof where, "%ssparse_attention_config.", x->tcname);
        int64_t v;
        M3_TRY(int_of(x, j, where, legacy, 0, MAX_DIM, def, &v));
        *out = (int)v;
        return M3_OK;
    }
    return text_int(x, flat, 0, MAX_DIM, def, out);
}

/* Per-layer flags from a list of strings (names[1] -> true, names[0] -> false) or of 0/1. */
static m3_status layer_list(const ctx *x, const m3_json *arr, const char *where, const char *key,
                            const char *name_false, const char *name_true, bool *flags) {
    int n = x->cfg->n_layer;
    if (!m3_json_is_array(arr))
        return m3_errorf(M3_ERR_FORMAT, "%s: %s%s must be a list", x->path, where, key);
    if (m3_json_size(arr) != n)
        return m3_errorf(M3_ERR_FORMAT, "%s: %s%s has %d entries, expected num_hidden_layers = %d",
                         x->path, where, key, m3_json_size(arr), n);
    int i = 0;
    for (const m3_json *e = m3_json_first(arr); e; e = m3_json_next(e), i++) {
        const char *s = m3_json_str(e);
        bool b;
        if (s && name_true && !strcmp(s, name_true))
            flags[i] = true;
        else if (s && name_false && !strcmp(s, name_false))
            flags[i] = false;
        else if (!s && !name_true && m3_json_bool(e, &b))
            flags[i] = b;
        else if (s)
            return m3_errorf(M3_ERR_FORMAT, "%s: %s%s[%d] = \"%.40s\" is not \"%s\" or \"%s\"",
                             x->path, where, key, i, s, name_false, name_true);
        else
            return m3_errorf(M3_ERR_FORMAT, "%s: %s%s[%d] must be %s", x->path, where, key, i,
                             name_true ? "a string" : "0 or 1");
    }
    return M3_OK;
}

static m3_status read_layers(ctx *x) {
    m3_config *c = x->cfg;
    const char *where = "";
    /* attention type: flat layer_types, then sparse_attention_freq */
    const m3_json *lt = text_get(x, "layer_types", &where);
    const m3_json *saf = member(x->sac, "sparse_attention_freq");
    char sacw[64];
    snprintf(sacw, sizeof sacw, "%ssparse_attention_config.", x->tcname);
    if (lt) {
        M3_TRY(layer_list(x, lt, where, "layer_types", "full_attention", "minimax_m3_sparse",
                          c->layer_sparse));
    } else if (saf) {
        M3_TRY(layer_list(x, saf, sacw, "sparse_attention_freq", NULL, NULL, c->layer_sparse));
    } else {
        for (int i = 0; i < c->n_layer; i++) c->layer_sparse[i] = false;
        cfg_warn(c, "%s: no layer_types or sparse_attention_freq: every layer is full attention "
                    "(that is not MiniMax-M3)", x->path);
    }
    /* MLP type: flat mlp_layer_types, then moe_layer_freq */
    const m3_json *mt = text_get(x, "mlp_layer_types", &where);
    const char *w2 = "";
    const m3_json *mf = text_get(x, "moe_layer_freq", &w2);
    if (mt) {
        M3_TRY(layer_list(x, mt, where, "mlp_layer_types", "dense", "sparse", c->layer_moe));
    } else if (mf) {
        M3_TRY(layer_list(x, mf, w2, "moe_layer_freq", NULL, NULL, c->layer_moe));
    } else {
        for (int i = 0; i < c->n_layer; i++) c->layer_moe[i] = true;
        cfg_warn(c, "%s: no mlp_layer_types or moe_layer_freq: every layer is MoE (M3 has dense "
                    "layers 0-2)", x->path);
    }
    c->n_sparse = c->n_moe = 0;
    for (int i = 0; i < c->n_layer; i++) {
        c->n_sparse += c->layer_sparse[i];
        c->n_moe += c->layer_moe[i];
    }
    /* legacy-only checks (§1.1): a value-carrying indexer and other score types are not
     * specified */
    const m3_json *st = member(x->sac, "sparse_score_type");
    if (st && (!m3_json_str(st) || strcmp(m3_json_str(st), "max")))
        return m3_errorf(M3_ERR_FORMAT, "%s: %ssparse_score_type must be \"max\"", x->path, sacw);
    const m3_json *dv = member(x->sac, "sparse_disable_index_value");
    if (dv) {
        bool *tmp = calloc((size_t)c->n_layer, sizeof *tmp);
        if (!tmp) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", x->path);
        bool all;
        m3_status s = M3_OK;
        if (m3_json_bool(dv, &all)) {
            for (int i = 0; i < c->n_layer; i++) tmp[i] = all;
        } else {
            s = layer_list(x, dv, sacw, "sparse_disable_index_value", NULL, NULL, tmp);
        }
        for (int i = 0; s == M3_OK && i < c->n_layer; i++)
            if (c->layer_sparse[i] && !tmp[i])
                s = m3_errorf(M3_ERR_UNSUPPORTED,
                              "%s: %ssparse_disable_index_value[%d] = 0 on a sparse layer (a "
                              "value-carrying indexer is not specified)",
                              x->path, sacw, i);
        free(tmp);
        M3_TRY(s);
    }
    const m3_json *bs = member(x->sac, "sparse_block_size");
    int64_t bsv;
    if (bs && m3_json_int(bs, &bsv) && bsv != 128)
        cfg_warn(c, "%s: sparse_block_size %lld != 128: ATOM refuses it", x->path, (long long)bsv);
    return M3_OK;
}

static m3_status read_overrides(const ctx *x, const m3_json *obj, const char *where,
                                bool strict) {
    m3_config *c = x->cfg;
    /* a bad value is a bad argument on the command line, a malformed file in config.json */
    m3_status es = strict ? M3_ERR_ARG : M3_ERR_FORMAT;
    /* read into temporaries: a failed apply leaves cfg unchanged */
    bool uic = c->use_index_cache;
    int64_t freq = c->index_topk_freq, off = c->index_skip_topk_offset;
    const char *pat = c->index_topk_pattern;
    bool pat_set = false;
    for (const m3_json *m = m3_json_first(obj); m; m = m3_json_next(m)) {
        const char *k = m3_json_key(m);
        if (!strcmp(k, "use_index_cache")) {
            if (!m3_json_bool(m, &uic))
                return m3_errorf(es, "%s: %suse_index_cache must be true or false",
                                 x->path, where);
        } else if (!strcmp(k, "index_topk_freq")) {
            if (!m3_json_int(m, &freq) || freq < 1 || freq > INT_MAX)
                return m3_errorf(es, "%s: %sindex_topk_freq must be an integer >= 1",
                                 x->path, where);
        } else if (!strcmp(k, "index_skip_topk_offset")) {
            if (!m3_json_int(m, &off) || off < 0 || off > INT_MAX)
                return m3_errorf(es,
                                 "%s: %sindex_skip_topk_offset must be an integer >= 0", x->path,
                                 where);
        } else if (!strcmp(k, "index_topk_pattern")) {
            if (m3_json_is_null(m)) {
                pat = NULL;
            } else if (m3_json_str(m)) {
                pat = m3_json_str(m);
            } else {
                return m3_errorf(es, "%s: %sindex_topk_pattern must be a string",
                                 x->path, where);
            }
            pat_set = true;
        } else if (strict) {
            return m3_errorf(es,
                             "%s: unknown override '%.60s' (known: use_index_cache, "
                             "index_topk_freq, index_topk_pattern, index_skip_topk_offset)",
                             x->path, k);
        }
    }
    char *np = NULL;
    if (pat_set && pat) {
        np = strdup(pat);
        if (!np) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", x->path);
    }
    c->use_index_cache = uic;
    c->index_topk_freq = (int)freq;
    c->index_skip_topk_offset = (int)off;
    if (pat_set) {
        free(c->index_topk_pattern);
        c->index_topk_pattern = np;
    }
    return M3_OK;
}

static m3_status read_quant(ctx *x) {
    m3_config *c = x->cfg;
    m3_quant_config *q = &c->quant;
    const char *where = "";
    const m3_json *qc = member(x->root, "quantization_config");
    if (!qc) qc = text_get(x, "quantization_config", &where);
    if (!qc) return M3_OK;
    if (!m3_json_is_object(qc))
        return m3_errorf(M3_ERR_FORMAT, "%s: quantization_config must be an object", x->path);
    const char *method = m3_json_get_str(qc, "quant_method", NULL);
    if (!method)
        return m3_errorf(M3_ERR_FORMAT, "%s: quantization_config.quant_method missing", x->path);
    q->group_size = 32;
    snprintf(q->scale_format, sizeof q->scale_format, "e8m0");
    const m3_json *ex = NULL;
    const char *exname = "exclude";
    if (!strcmp(method, "quark")) {
        q->method = M3_QUANT_QUARK;
        const m3_json *g = member(qc, "global_quant_config");
        const m3_json *wq = member(g, "weight");
        if (!m3_json_is_object(wq))
            return m3_errorf(M3_ERR_FORMAT,
                             "%s: quantization_config.global_quant_config.weight missing",
                             x->path);
        const char *dt = m3_json_get_str(wq, "dtype", "");
        if (!strcmp(dt, "mx")) dt = m3_json_get_str(wq, "mx_element_dtype", "");
        if (!strcmp(dt, "fp4") || !strcmp(dt, "fp4_e2m1"))
            q->weight_dtype = M3_DT_F4;
        else if (!strcmp(dt, "fp8_e4m3") || !strcmp(dt, "fp8"))
            q->weight_dtype = M3_DT_F8_E4M3;
        else
            return m3_errorf(M3_ERR_UNSUPPORTED,
                             "%s: quantization_config weight dtype \"%.32s\" is not supported "
                             "(fp4, fp8_e4m3)",
                             x->path, dt);
        int64_t gs;
        M3_TRY(int_of(x, member(wq, "group_size"), "quantization_config.weight.", "group_size",
                      1, 1 << 20, 32, &gs));
        q->group_size = (int)gs;
        snprintf(q->scale_format, sizeof q->scale_format, "%s",
                 m3_json_get_str(wq, "scale_format", "e8m0"));
        if (strcmp(q->scale_format, "e8m0"))
            return m3_errorf(M3_ERR_UNSUPPORTED,
                             "%s: quantization_config scale_format \"%s\" is not supported "
                             "(e8m0)",
                             x->path, q->scale_format);
        snprintf(q->round_method, sizeof q->round_method, "%s",
                 m3_json_get_str(wq, "round_method", ""));
        snprintf(q->scale_mode, sizeof q->scale_mode, "%s",
                 m3_json_get_str(wq, "scale_calculation_mode", ""));
        const m3_json *it = member(g, "input_tensors");
        if (it) {
            q->has_input_quant = true;
            q->input_dynamic = m3_json_get_bool(it, "is_dynamic", false);
        }
    } else if (!strcmp(method, "mxfp8")) {
        q->method = M3_QUANT_MXFP8;
        q->weight_dtype = M3_DT_F8_E4M3;
        const m3_json *bs = member(qc, "weight_block_size");
        int64_t b0 = 0, b1 = 0;
        if (bs && !(m3_json_size(bs) == 2 && m3_json_int(m3_json_at(bs, 0), &b0) &&
                    m3_json_int(m3_json_at(bs, 1), &b1) && b0 == 1 && b1 > 0 && b1 <= 4096))
            return m3_errorf(M3_ERR_UNSUPPORTED,
                             "%s: quantization_config.weight_block_size must be [1, G]",
                             x->path);
        if (bs) q->group_size = (int)b1;
        const char *as = m3_json_get_str(qc, "activation_scheme", "dynamic");
        q->has_input_quant = true;
        q->input_dynamic = !strcmp(as, "dynamic");
        ex = member(qc, "ignored_layers");
        exname = "ignored_layers";
        if (!ex) {
            ex = member(qc, "modules_to_not_convert");
            exname = "modules_to_not_convert";
        }
    } else {
        return m3_errorf(M3_ERR_UNSUPPORTED,
                         "%s: quantization_config.quant_method \"%.32s\" is not supported (quark, "
                         "mxfp8)",
                         x->path, method);
    }
    if (!ex) ex = member(qc, "exclude");
    if (ex) {
        if (!m3_json_is_array(ex))
            return m3_errorf(M3_ERR_FORMAT, "%s: quantization_config.%s must be a list", x->path,
                             exname);
        int n = m3_json_size(ex);
        q->exclude = calloc((size_t)(n ? n : 1), sizeof *q->exclude);
        if (!q->exclude) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", x->path);
        for (const m3_json *e = m3_json_first(ex); e; e = m3_json_next(e)) {
            const char *s = m3_json_str(e);
            if (!s)
                return m3_errorf(M3_ERR_FORMAT,
                                 "%s: quantization_config.%s[%d] must be a string", x->path,
                                 exname, q->n_exclude);
            q->exclude[q->n_exclude] = strdup(s);
            if (!q->exclude[q->n_exclude])
                return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", x->path);
            q->n_exclude++;
        }
    }
    return M3_OK;
}

static m3_status read_vision(ctx *x) {
    m3_config *c = x->cfg;
    m3_vision_config *v = &c->vision;
    const m3_json *vc = member(x->root, "vision_config");
    const char *w = "vision_config.";
    if (vc && !m3_json_is_object(vc))
        return m3_errorf(M3_ERR_FORMAT, "%s: vision_config must be an object", x->path);
    v->present = vc != NULL;
    int64_t t;
#define VINT(field, key, def)                                                                     \
    do {                                                                                          \
        M3_TRY(int_of(x, member(vc, key), w, key, 0, MAX_DIM, def, &t));                          \
        v->field = (int)t;                                                                        \
    } while (0)
    VINT(hidden, "hidden_size", 0);
    VINT(n_head, "num_attention_heads", 0);
    VINT(n_layer, "num_hidden_layers", 0);
    VINT(inter, "intermediate_size", 0);
    VINT(patch, "patch_size", 14);
    VINT(n_channels, "num_channels", 3);
    /* merge / temporal patch: vision_config.*, then img_token_compression_config.* (inside
     * vision_config, then top level), default 2 / 2 (§1.1) */
    const m3_json *itc = member(vc, "img_token_compression_config");
    if (!itc) itc = member(x->root, "img_token_compression_config");
    const m3_json *j = member(vc, "spatial_merge_size");
    const char *jw = w;
    if (!j) {
        j = member(itc, "spatial_merge_size");
        jw = "img_token_compression_config.";
    }
    M3_TRY(int_of(x, j, jw, "spatial_merge_size", 1, 64, 2, &t));
    v->merge = (int)t;
    j = member(vc, "temporal_patch_size");
    jw = w;
    if (!j) {
        j = member(itc, "temporal_patch_size");
        jw = "img_token_compression_config.";
    }
    M3_TRY(int_of(x, j, jw, "temporal_patch_size", 1, 64, 2, &t));
    v->temporal_patch = (int)t;
#undef VINT
    double d;
    M3_TRY(num_of(x, member(vc, "layer_norm_eps"), w, "layer_norm_eps", 1e-5, &d));
    v->layer_norm_eps = (float)d;
    const m3_json *vrp = member(vc, "rope_parameters");
    j = member(vrp, "rope_theta");
    if (j) {
        M3_TRY(num_of(x, j, "vision_config.rope_parameters.", "rope_theta", 1e4, &v->rope_theta));
    } else {
        M3_TRY(num_of(x, member(vc, "rope_theta"), w, "rope_theta", 1e4, &v->rope_theta));
    }
    if (v->present) {
        if (v->hidden <= 0 || v->n_head <= 0 || v->n_layer <= 0 || v->inter <= 0 ||
            v->patch <= 0 || v->n_channels <= 0)
            return m3_errorf(M3_ERR_FORMAT,
                             "%s: vision_config: hidden_size, num_attention_heads, "
                             "num_hidden_layers, intermediate_size, patch_size must be positive",
                             x->path);
        if (v->hidden % v->n_head)
            return m3_errorf(M3_ERR_FORMAT,
                             "%s: vision_config.hidden_size %d is not divisible by "
                             "num_attention_heads %d",
                             x->path, v->hidden, v->n_head);
        if (!(v->layer_norm_eps > 0))
            return m3_errorf(M3_ERR_FORMAT, "%s: vision_config.layer_norm_eps must be > 0",
                             x->path);
    }
    /* projector: P = projector_hidden_size (default: text hidden); merged = H * merge^2 with H
     * the TEXT hidden size: the projector maps each patch to H before 2x2 windows are
     * concatenated (spec §6.6; a fixture with P != H stores merge_linear_1 as [P, 4H]) */
    M3_TRY(int_of(x, member(x->root, "projector_hidden_size"), "", "projector_hidden_size", 0,
                  MAX_DIM, c->hidden, &t));
    c->projector_hidden = (int)t;
    int64_t derived = (int64_t)c->hidden * v->merge * v->merge;
    M3_TRY(int_of(x, member(x->root, "merged_hidden_size"), "", "merged_hidden_size", 0,
                  (int64_t)MAX_DIM * 64, derived, &t));
    if (t != derived)
        cfg_warn(c, "%s: merged_hidden_size %lld != hidden_size * merge^2 = %lld (using "
                    "the derived value, as transformers does)", x->path, (long long)t,
                 (long long)derived);
    c->merged_hidden = (int)derived;
    M3_TRY(int_of(x, member(x->root, "image_token_index"), "", "image_token_index", -1, INT_MAX,
                  200025, &t));
    c->image_token_id = (int)t;
    M3_TRY(int_of(x, member(x->root, "video_token_index"), "", "video_token_index", -1, INT_MAX,
                  200026, &t));
    c->video_token_id = (int)t;
    return M3_OK;
}

/* bos/eos may be an int, null, or (eos) a list: take the first element. */
static m3_status token_id(const ctx *x, const char *key, int def, int *out) {
    const char *where = "";
    const m3_json *j = text_get(x, key, &where);
    if (m3_json_is_array(j)) j = m3_json_at(j, 0);
    int64_t v;
    M3_TRY(int_of(x, j, where, key, -1, INT_MAX, def, &v));
    *out = (int)v;
    return M3_OK;
}

static m3_status validate(const ctx *x) {
    const m3_config *c = x->cfg;
    const char *p = x->path;
#define POS(v, name)                                                                              \
    if ((v) <= 0) return m3_errorf(M3_ERR_FORMAT, "%s: %s%s must be positive", p, x->tcname, name)
    POS(c->hidden, "hidden_size");
    POS(c->n_layer, "num_hidden_layers");
    POS(c->n_head, "num_attention_heads");
    POS(c->n_kv_head, "num_key_value_heads");
    POS(c->head_dim, "head_dim");
    POS(c->vocab, "vocab_size");
    if (c->n_head % c->n_kv_head)
        return m3_errorf(M3_ERR_FORMAT,
                         "%s: num_attention_heads %d is not divisible by num_key_value_heads %d",
                         p, c->n_head, c->n_kv_head);
    if (c->rot_dim <= 0 || c->rot_dim > c->head_dim || c->rot_dim % 2)
        return m3_errorf(M3_ERR_FORMAT,
                         "%s: rotary width int(head_dim %d * partial_rotary_factor %g) = %d must "
                         "be even and in (0, head_dim]",
                         p, c->head_dim, c->partial_rotary, c->rot_dim);
    /* the model computes with these in fp32 (rope theta too, ref/layer.c): a value that is
     * finite in JSON but 0 or Inf once rounded to fp32 would silently give NaN or 0 */
#define F32POS(v, name)                                                                           \
    if (!((float)(v) > 0.0f && isfinite((float)(v))))                                             \
    return m3_errorf(M3_ERR_FORMAT, "%s: %s = %g must be > 0 and finite in float32", p, name,      \
                     (double)(v))
    F32POS(x->rms_eps_json, "rms_norm_eps");
    F32POS(c->rope_theta, "rope_theta");
    F32POS(x->swiglu_limit_json, "swiglu_limit");
    F32POS(x->routed_scale_json, "routed_scaling_factor");
#undef F32POS
    if (!isfinite(c->swiglu_alpha))
        return m3_errorf(M3_ERR_FORMAT, "%s: swiglu_alpha = %g must be finite in float32", p,
                         x->swiglu_alpha_json);
    if (c->n_moe > 0) {
        POS(c->expert_inter, "intermediate_size");
        POS(c->n_expert, "num_local_experts");
        POS(c->top_k, "num_experts_per_tok");
        if (c->top_k > c->n_expert)
            return m3_errorf(M3_ERR_FORMAT,
                             "%s: num_experts_per_tok %d exceeds num_local_experts %d", p,
                             c->top_k, c->n_expert);
        if (c->n_shared_experts < 0 || (c->n_shared_experts > 0 && c->shared_inter <= 0))
            return m3_errorf(M3_ERR_FORMAT, "%s: shared_intermediate_size must be positive", p);
    }
    if (c->n_moe < c->n_layer) POS(c->dense_inter, "dense_intermediate_size");
    if (c->n_sparse > 0) {
        POS(c->index_n_heads, "index_n_heads");
        POS(c->index_head_dim, "index_head_dim");
        POS(c->index_block, "index_block_size");
        POS(c->index_topk, "index_topk_blocks");
        if (c->index_n_heads != c->n_kv_head)
            return m3_errorf(M3_ERR_FORMAT,
                             "%s: index_n_heads %d != num_key_value_heads %d (index head g is "
                             "paired with KV group g)",
                             p, c->index_n_heads, c->n_kv_head);
        if (c->index_head_dim < c->rot_dim)
            return m3_errorf(M3_ERR_FORMAT,
                             "%s: index_head_dim %d is narrower than the rotary width %d", p,
                             c->index_head_dim, c->rot_dim);
        if (c->index_local + c->index_init > c->index_topk)
            return m3_errorf(M3_ERR_FORMAT,
                             "%s: index local %d + init %d blocks exceed index_topk_blocks %d", p,
                             c->index_local, c->index_init, c->index_topk);
    }
    if (c->max_pos <= 0) return m3_errorf(M3_ERR_FORMAT, "%s: max_position_embeddings must be positive", p);
#undef POS
    return M3_OK;
}

static m3_status parse_into(m3_config *c, const m3_json *root, const char *path) {
    ctx x = {.cfg = c, .root = root, .path = path};
    if (!m3_json_is_object(root))
        return m3_errorf(M3_ERR_FORMAT, "%s: the top level must be a JSON object", path);
    const m3_json *tc = member(root, "text_config");
    if (tc && !m3_json_is_object(tc))
        return m3_errorf(M3_ERR_FORMAT, "%s: text_config must be an object", path);
    x.tc = tc ? tc : root;
    x.tcname = tc ? "text_config." : "";
    const char *where = "";
    x.sac = text_get(&x, "sparse_attention_config", &where);
    if (x.sac && !m3_json_is_object(x.sac))
        return m3_errorf(M3_ERR_FORMAT, "%s: sparse_attention_config must be an object", path);
    x.rp = text_get(&x, "rope_parameters", &where);
    if (x.rp && !m3_json_is_object(x.rp))
        return m3_errorf(M3_ERR_FORMAT, "%s: rope_parameters must be an object", path);
    snprintf(c->model_type, sizeof c->model_type, "%s",
             m3_json_get_str(root, "model_type", m3_json_get_str(x.tc, "model_type", "")));

    M3_TRY(text_int(&x, "hidden_size", 0, MAX_DIM, 0, &c->hidden));
    M3_TRY(text_int(&x, "num_hidden_layers", 0, MAX_LAYERS, 0, &c->n_layer));
    M3_TRY(text_int(&x, "num_attention_heads", 0, 1 << 16, 0, &c->n_head));
    M3_TRY(text_int(&x, "num_key_value_heads", 0, 1 << 16, c->n_head, &c->n_kv_head));
    M3_TRY(text_int(&x, "head_dim", 0, 1 << 16, c->n_head > 0 ? c->hidden / c->n_head : 0,
                    &c->head_dim));
    M3_TRY(text_int(&x, "vocab_size", 0, 1 << 30, 0, &c->vocab));
    int64_t mp;
    M3_TRY(int_of(&x, text_get(&x, "max_position_embeddings", &where), where,
                  "max_position_embeddings", 0, INT64_C(1) << 40, 524288, &mp));
    c->max_pos = mp;
    double d;
    M3_TRY(text_num(&x, "rms_norm_eps", 1e-6, &d));
    x.rms_eps_json = d;
    c->rms_eps = (float)d; /* the model uses f32(eps) = 9.99999997e-07 */
    /* rope theta: rope_parameters.rope_theta, then rope_theta, default 5e6 (HF) */
    const m3_json *j = member(x.rp, "rope_theta");
    if (j)
        M3_TRY(num_of(&x, j, "rope_parameters.", "rope_theta", 5e6, &c->rope_theta));
    else
        M3_TRY(text_num(&x, "rope_theta", 5e6, &c->rope_theta));
    j = member(x.rp, "partial_rotary_factor");
    if (j)
        M3_TRY(num_of(&x, j, "rope_parameters.", "partial_rotary_factor", 1.0,
                      &c->partial_rotary));
    else
        M3_TRY(text_num(&x, "partial_rotary_factor", 1.0, &c->partial_rotary));
    if (!(c->partial_rotary > 0.0 && c->partial_rotary <= 1.0))
        return m3_errorf(M3_ERR_FORMAT, "%s: partial_rotary_factor %g must be in (0, 1]", path,
                         c->partial_rotary);
    /* int() truncation as in Python; the product is exact for the factors in use */
    c->rot_dim = (int)((double)c->head_dim * c->partial_rotary);
    M3_TRY(text_int(&x, "rotary_dim", -1, 1 << 16, -1, &c->rotary_dim_key));
    if (c->rotary_dim_key >= 0 && c->rotary_dim_key != c->rot_dim)
        cfg_warn(c, "%s: rotary_dim %d disagrees with int(head_dim * partial_rotary_factor) = %d; "
                    "rotary_dim is ignored (as in transformers and ATOM)",
                 path, c->rotary_dim_key, c->rot_dim);
    M3_TRY(text_num(&x, "swiglu_alpha", 1.702, &d));
    x.swiglu_alpha_json = d;
    c->swiglu_alpha = (float)d;
    M3_TRY(text_num(&x, "swiglu_limit", 7.0, &d));
    x.swiglu_limit_json = d;
    c->swiglu_limit = (float)d;
    M3_TRY(text_int(&x, "dense_intermediate_size", 0, MAX_DIM, 0, &c->dense_inter));
    M3_TRY(text_int(&x, "intermediate_size", 0, MAX_DIM, 0, &c->expert_inter));
    M3_TRY(text_int(&x, "n_shared_experts", 0, 64, 1, &c->n_shared_experts));
    M3_TRY(text_int(&x, "shared_intermediate_size", 0, MAX_DIM,
                    c->expert_inter * c->n_shared_experts, &c->shared_inter));
    /* num_local_experts, alias num_experts */
    const char *ek = text_get(&x, "num_local_experts", NULL) ? "num_local_experts" : "num_experts";
    M3_TRY(text_int(&x, ek, 0, 1 << 16, 0, &c->n_expert));
    M3_TRY(text_int(&x, "num_experts_per_tok", 0, 1 << 16, 0, &c->top_k));
    M3_TRY(text_num(&x, "routed_scaling_factor", 1.0, &d));
    x.routed_scale_json = d;
    c->routed_scale = (float)d;
    bool b;
    M3_TRY(bool_of(&x, text_get(&x, "tie_word_embeddings", &where), where, "tie_word_embeddings",
                   false, &b));
    c->tie_word_embeddings = b;
    M3_TRY(token_id(&x, "bos_token_id", 200034, &c->bos_id));
    M3_TRY(token_id(&x, "eos_token_id", 200020, &c->eos_id));

    M3_TRY(index_int(&x, "index_n_heads", "sparse_num_index_heads", 4, &c->index_n_heads));
    M3_TRY(index_int(&x, "index_head_dim", "sparse_index_dim", 128, &c->index_head_dim));
    M3_TRY(index_int(&x, "index_block_size", "sparse_block_size", 128, &c->index_block));
    M3_TRY(index_int(&x, "index_topk_blocks", "sparse_topk_blocks", 16, &c->index_topk));
    M3_TRY(index_int(&x, "index_local_blocks", "sparse_local_block", 1, &c->index_local));
    M3_TRY(index_int(&x, "index_init_blocks", "sparse_init_block", 0, &c->index_init));

    if (c->n_layer <= 0)
        return m3_errorf(M3_ERR_FORMAT, "%s: %snum_hidden_layers must be positive", path,
                         x.tcname);
    c->layer_sparse = calloc((size_t)c->n_layer, sizeof *c->layer_sparse);
    c->layer_moe = calloc((size_t)c->n_layer, sizeof *c->layer_moe);
    if (!c->layer_sparse || !c->layer_moe) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
    M3_TRY(read_layers(&x));

    /* overrides: text_config first, then top level (top level wins on conflict: it is
     * where serving recipes put --hf-overrides) */
    c->index_topk_freq = 1;
    if (x.tc != root) M3_TRY(read_overrides(&x, x.tc, "text_config.", false));
    M3_TRY(read_overrides(&x, root, "", false));

    M3_TRY(validate(&x));
    M3_TRY(read_vision(&x));
    M3_TRY(read_quant(&x));
    bool *tmp = malloc((size_t)c->n_layer * sizeof *tmp);
    if (!tmp) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
    m3_status s = m3_config_topk_schedule(c, tmp);
    free(tmp);
    return s;
}

m3_status m3_config_parse(m3_config **out, const char *json_text, size_t len, const char *path) {
    *out = NULL;
    m3_config *c = calloc(1, sizeof *c);
    if (!c) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
    c->path = strdup(path);
    c->json_text = malloc(len + 1);
    if (!c->path || !c->json_text) {
        m3_config_free(c);
        return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(c->json_text, json_text, len);
    c->json_text[len] = 0;
    c->json_len = len;
    m3_json *root = NULL;
    m3_status s = m3_json_parse(&root, json_text, len, path);
    if (s == M3_OK) s = parse_into(c, root, path);
    m3_json_free(root);
    if (s != M3_OK) {
        m3_config_free(c);
        return s;
    }
    *out = c;
    return M3_OK;
}

m3_status m3_config_load(m3_config **out, const char *model_dir_or_file) {
    *out = NULL;
    char path[4096];
    struct stat st;
    if (stat(model_dir_or_file, &st) != 0)
        return m3_errorf(M3_ERR_IO, "%s: no such file or directory", model_dir_or_file);
    if (S_ISDIR(st.st_mode)) {
        size_t n = strlen(model_dir_or_file);
        snprintf(path, sizeof path, "%s%sconfig.json", model_dir_or_file,
                 n && model_dir_or_file[n - 1] == '/' ? "" : "/");
    } else {
        snprintf(path, sizeof path, "%s", model_dir_or_file);
    }
    /* 16 MiB: a config is a few KB; a huge file is not a config */
    m3_json *root = NULL;
    char *text = NULL;
    size_t len = 0;
    M3_TRY(m3_json_parse_file(&root, path, (size_t)16 << 20, &text, &len));
    m3_json_free(root); /* parsed again below from the same text: one code path */
    m3_status s = m3_config_parse(out, text, len, path);
    free(text);
    return s;
}

m3_status m3_config_apply_overrides(m3_config *cfg, const char *json_text) {
    m3_json *root = NULL;
    M3_TRY(m3_json_parse(&root, json_text, strlen(json_text), "--override"));
    ctx x = {.cfg = cfg, .root = root, .tc = root, .path = "--override", .tcname = ""};
    m3_status s = M3_OK;
    if (!m3_json_is_object(root))
        s = m3_errorf(M3_ERR_ARG, "--override: expected a JSON object");
    /* keep the old values to restore on a schedule error */
    bool uic = cfg->use_index_cache;
    int freq = cfg->index_topk_freq, off = cfg->index_skip_topk_offset;
    char *pat = cfg->index_topk_pattern ? strdup(cfg->index_topk_pattern) : NULL;
    if (s == M3_OK) s = read_overrides(&x, root, "", true);
    if (s == M3_OK) {
        bool *tmp = malloc((size_t)cfg->n_layer * sizeof *tmp);
        s = tmp ? m3_config_topk_schedule(cfg, tmp) : m3_errorf(M3_ERR_NOMEM, "out of memory");
        free(tmp);
        if (s != M3_OK) {
            cfg->use_index_cache = uic;
            cfg->index_topk_freq = freq;
            cfg->index_skip_topk_offset = off;
            free(cfg->index_topk_pattern);
            cfg->index_topk_pattern = pat;
            pat = NULL;
            s = m3_error_context(M3_ERR_ARG, "--override");
        }
    }
    free(pat);
    m3_json_free(root);
    return s;
}

void m3_config_free(m3_config *cfg) {
    if (!cfg) return;
    free(cfg->path);
    free(cfg->json_text);
    free(cfg->layer_sparse);
    free(cfg->layer_moe);
    free(cfg->index_topk_pattern);
    for (int i = 0; i < cfg->quant.n_exclude; i++) free(cfg->quant.exclude[i]);
    free(cfg->quant.exclude);
    for (int i = 0; i < cfg->n_warnings; i++) free(cfg->warnings[i]);
    free(cfg->warnings);
    free(cfg);
}

void m3_config_emit_warnings(const m3_config *cfg) {
    for (int i = 0; i < cfg->n_warnings; i++) m3_warn("%s", cfg->warnings[i]);
}

int m3_config_sparse_ordinal(const m3_config *cfg, int layer) {
    M3_ASSERT(layer >= 0 && layer < cfg->n_layer);
    if (!cfg->layer_sparse[layer]) return -1;
    int o = 0;
    for (int i = 0; i < layer; i++) o += cfg->layer_sparse[i];
    return o;
}

m3_status m3_config_topk_schedule(const m3_config *cfg, bool *computes) {
    int o = 0;
    const char *pat = cfg->index_topk_pattern;
    size_t plen = pat ? strlen(pat) : 0;
    for (int L = 0; L < cfg->n_layer; L++) {
        if (!cfg->layer_sparse[L]) {
            computes[L] = false;
            continue;
        }
        bool reuse = false;
        if (cfg->use_index_cache) {
            if (pat) {
                /* pattern overrides freq; ordinals beyond its length compute */
                reuse = (size_t)o < plen && pat[o] == 'S';
            } else if (cfg->index_topk_freq > 1) {
                int rel = o - cfg->index_skip_topk_offset;
                if (rel < 0) rel = 0;
                reuse = rel % cfg->index_topk_freq != 0;
            }
        }
        /* spec §3.9: a reuse before any computing layer is unspecified -> error */
        if (reuse && o == 0)
            return m3_errorf(M3_ERR_FORMAT,
                             "%s: index_topk_pattern[0] = 'S': the first sparse layer (%d) has no "
                             "top-k to reuse",
                             cfg->path ? cfg->path : "config", L);
        computes[L] = !reuse;
        o++;
    }
    return M3_OK;
}

bool m3_config_module_quantized(const m3_config *cfg, const char *module_name) {
    const m3_quant_config *q = &cfg->quant;
    if (q->method == M3_QUANT_NONE) return false;
    size_t n = strlen(module_name);
    for (int i = 0; i < q->n_exclude; i++) {
        const char *p = q->exclude[i];
        if (fnmatch(p, module_name, 0) == 0) return false;
        if (q->method == M3_QUANT_MXFP8) {
            /* vLLM-style ignored_layers name modules, possibly without our prefix */
            size_t m = strlen(p);
            if (m < n && module_name[n - m - 1] == '.' && !strcmp(module_name + n - m, p))
                return false;
        }
    }
    return true;
}

m3_kv_bytes m3_config_kv_bytes(const m3_config *c) {
    m3_kv_bytes k;
    int64_t kv_elems = (int64_t)c->n_layer * 2 * c->n_kv_head * c->head_dim; /* K and V */
    int64_t idx_elems = (int64_t)c->n_sparse * c->index_head_dim; /* one index-K head */
    k.bf16 = kv_elems * 2 + idx_elems * 2;
    k.fp8 = kv_elems + idx_elems * 2;
    k.fp8_scales = (int64_t)c->n_layer * 2 * c->n_kv_head * 4; /* fp32, per token per head */
    k.fp8_all = kv_elems + idx_elems + k.fp8_scales;
    return k;
}
