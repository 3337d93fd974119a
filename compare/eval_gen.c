/* compare/eval_gen.c: see eval_gen.h. */
#include "compare/eval_gen.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- variant names ------------------------------------------------------------------ */

/* The one table from modifier names to variant keys (topk-reuseN is parsed apart). */
static const struct {
    const char *mod, *key, *value;
} mod_table[] = {
    {"mxfp8", "experts", "mxfp8"},
    {"mxfp4", "experts", "mxfp4"},
    {"kv-fp8", "kv_cache", "fp8"},
    {"index-fp8", "index_cache", "fp8"},
};

static bool is_base(const char *s, size_t n) {
    return (n == 4 && !strncmp(s, "fp32", 4)) || (n == 2 && !strncmp(s, "hf", 2)) ||
           (n == 4 && !strncmp(s, "atom", 4));
}

static m3_status add_key(m3_eval_variant *out, const char *key, const char *value) {
    /* one modifier per key: "mxfp4+mxfp8" is a mistake, not a last-wins */
    char pat[80];
    snprintf(pat, sizeof pat, "%s=", key);
    if (strstr(out->keys, pat))
        return m3_errorf(M3_ERR_ARG, "variant '%s': %s is set twice", out->name, key);
    m3_status s = m3_variant_set(&out->variant, key, value);
    /* a key of this table that ref/variant does not know yet is a missing feature */
    if (s == M3_ERR_ARG && strstr(m3_last_error(), "unknown variant option"))
        return m3_errorf(M3_ERR_UNSUPPORTED, "variant '%s': %s=%s is not implemented in this "
                         "build", out->name, key, value);
    if (s) return m3_error_context(s, "variant '%s'", out->name);
    size_t l = strlen(out->keys);
    snprintf(out->keys + l, sizeof out->keys - l, "%s%s=%s", l ? " " : "", key, value);
    return M3_OK;
}

m3_status m3_eval_variant_resolve(m3_eval_variant *out, const char *name) {
    memset(out, 0, sizeof *out);
    if (!name[0] || strlen(name) >= sizeof out->name)
        return m3_errorf(M3_ERR_ARG, "variant '%.60s': empty or too long", name);
    strcpy(out->name, name);
    m3_variant_default(&out->variant);
    size_t n = strcspn(name, "+");
    const char *p = name;
    char base[8] = "atom";
    if (is_base(name, n)) {
        memcpy(base, name, n);
        base[n] = 0;
        p = name + n;
        if (*p == '+' && !*++p) return m3_errorf(M3_ERR_ARG, "variant '%s': ends with '+'", name);
    }
    M3_TRY(m3_profile_by_name(&out->profile, base));
    while (*p) {
        n = strcspn(p, "+");
        char mod[64];
        if (n == 0 || n >= sizeof mod)
            return m3_errorf(M3_ERR_ARG, "variant '%s': empty or too long part", name);
        memcpy(mod, p, n);
        mod[n] = 0;
        p += n;
        if (*p == '+' && !*++p) return m3_errorf(M3_ERR_ARG, "variant '%s': ends with '+'", name);
        bool found = false;
        for (size_t i = 0; i < sizeof mod_table / sizeof mod_table[0]; i++)
            if (!strcmp(mod, mod_table[i].mod)) {
                M3_TRY(add_key(out, mod_table[i].key, mod_table[i].value));
                found = true;
            }
        if (!found && !strncmp(mod, "topk-reuse", 10)) {
            char *end;
            errno = 0;
            long k = strtol(mod + 10, &end, 10);
            if (end == mod + 10 || *end || errno || k < 1 || k > 64)
                return m3_errorf(M3_ERR_ARG, "variant '%s': '%s': expected topk-reuseN, N in "
                                 "1..64", name, mod);
            char v[16];
            snprintf(v, sizeof v, "%ld", k);
            M3_TRY(add_key(out, "topk_reuse", v));
            found = true;
        }
        if (!found)
            return m3_errorf(M3_ERR_ARG, "variant '%s': unknown part '%s' (base fp32|hf|atom; "
                             "modifiers mxfp8, mxfp4, kv-fp8, index-fp8, topk-reuseN)", name, mod);
    }
    m3_status s = m3_variant_check(&out->variant);
    if (s) return m3_error_context(s, "variant '%s'", name);
    return M3_OK;
}

m3_status m3_eval_model_open(m3_run_model **rm, const char *model_dir, const char *backend,
                             const m3_eval_variant *v) {
    m3_run_opts o;
    memset(&o, 0, sizeof o);
    o.model = model_dir;
    o.backend = backend;
    o.profile = v->profile.name;
    o.variant = v->variant;
    m3_status s = m3_run_model_open(rm, &o, &v->profile);
    /* name the variant where it is the cause (refused keys, a schedule the model rejects),
     * not in front of an unreadable checkpoint or a missing device */
    if (s == M3_ERR_UNSUPPORTED || s == M3_ERR_ARG)
        return m3_error_context(s, "variant '%s'", v->name);
    return s;
}

/* ---- generation --------------------------------------------------------------------- */

const char *m3_gen_stop_name(m3_gen_stop s) {
    return s == M3_GEN_STOP_EOS ? "eos" : s == M3_GEN_STOP_STRING ? "stop_string" : "max_gen_toks";
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void m3_gen_result_free(m3_gen_result *r) {
    free(r->tokens);
    free(r->text);
    memset(r, 0, sizeof *r);
}

/* Earliest occurrence of any stop string in text, or NULL. */
static char *first_stop(char *text, const m3_gen_opts *o) {
    char *best = NULL;
    for (int i = 0; i < o->n_stop_strings; i++) {
        char *h = strstr(text, o->stop_strings[i]);
        if (h && (!best || h < best)) best = h;
    }
    return best;
}

/* A NaN / Inf logit means broken weights or an overflow: greedy argmax would still pick a
 * token and the eval would score garbage as if the model had answered. */
static m3_status check_logits(const float *x, int V, int n_gen) {
    for (int i = 0; i < V; i++)
        if (!isfinite(x[i]))
            return m3_errorf(M3_ERR_NUMERIC,
                             "generate: logit %d is %s after %d generated tokens (non-finite "
                             "weights or activations; m3 run --dump finds the first such stage)",
                             i, isnan(x[i]) ? "NaN" : "Inf", n_gen);
    return M3_OK;
}

m3_status m3_generate_greedy(m3_run_model *m, const m3_tokenizer *t, const int32_t *prompt,
                             int n_prompt, const m3_gen_opts *o, m3_gen_result *r) {
    memset(r, 0, sizeof *r);
    if (n_prompt < 1 || o->max_gen_toks < 1)
        return m3_errorf(M3_ERR_ARG, "generate: empty prompt or max_gen_toks < 1");
    r->tokens = malloc((size_t)o->max_gen_toks * sizeof *r->tokens);
    if (!r->tokens) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    const int V = m3_run_model_config(m)->vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    if (!logits) {
        m3_gen_result_free(r);
        return m3_errorf(M3_ERR_NOMEM, "out of memory");
    }
    m3_run_model_reset(m);
    /* the GPU's caches cannot grow once filled: the whole context first (no-op on ref, and
     * on the GPU when an earlier item already reserved as much) */
    m3_status s = m3_run_model_reserve(m, n_prompt + o->max_gen_toks);
    if (s) {
        free(logits);
        m3_gen_result_free(r);
        return s;
    }
    int32_t next = 0;
    double t0 = now_s();
    s = m3_run_model_forward(m, prompt, NULL, n_prompt, NULL, "", logits, &next);
    if (!s) s = check_logits(logits, V, 0);
    r->prefill_s = now_s() - t0;
    r->stop = M3_GEN_STOP_MAX;
    while (!s) {
        bool is_stop = false;
        for (int i = 0; i < o->n_stop_ids; i++) is_stop |= next == o->stop_ids[i];
        if (is_stop) {
            r->stop = M3_GEN_STOP_EOS;
            break;
        }
        r->tokens[r->n_tokens++] = next;
        free(r->text);
        r->text = NULL;
        size_t len;
        s = m3_tokenizer_decode(t, r->tokens, r->n_tokens, true, &r->text, &len);
        if (s) break;
        char *hit = first_stop(r->text, o);
        if (hit) {
            *hit = 0;
            r->stop = M3_GEN_STOP_STRING;
            break;
        }
        if (r->n_tokens == o->max_gen_toks) break;
        t0 = now_s();
        s = m3_run_model_forward(m, &r->tokens[r->n_tokens - 1], NULL, 1, NULL, "", logits,
                                 &next);
        if (!s) s = check_logits(logits, V, r->n_tokens);
        r->decode_s += now_s() - t0;
        r->n_decode++;
    }
    if (!s && !r->text) {
        r->text = calloc(1, 1); /* nothing kept: an empty response */
        if (!r->text) s = m3_errorf(M3_ERR_NOMEM, "out of memory");
    }
    free(logits);
    if (s) m3_gen_result_free(r);
    return s;
}

int m3_gen_first_divergence(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb;
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return na == nb ? -1 : n;
}
