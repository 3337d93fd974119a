/* compare/tol.c: the built-in tolerance table and the --tol JSON overrides (see tol.h).
 *
 * Where the numbers come from (numerics spec §3.17, §10):
 *  - fp32 class: an independent fp32 implementation with a different summation order
 *    matched transformers' fp32 forward to NMSE <= 3e-12 on every stage with identical
 *    top-k/expert sets. 1e-9 keeps ~300x headroom for H = 6144 sums and long sequences
 *    while still catching any real bug (a wrong rounding point alone is ~1e-6).
 *  - lowp class: each bf16 rounding adds <= 2^-9 relative error (uniform: NMSE ~1.3e-6 per
 *    rounding point); a faithful hf emulation, teacher-forced, measured NMSE ~1e-5 per
 *    stage. 1e-3 allows that plus a few layers of free-running accumulation; a free-running
 *    bf16-vs-fp32 run drifts to ~5e-2 by the last layer and is meant to be flagged.
 *  - fp32q class (fp32 profile, online quantization in either run): the GPU's fp32 sums
 *    differ from ref's in the last bit and an MX code on a rounding boundary then takes its
 *    neighbour; measured on the H200 (docs/gpu-log/model.md): shared_out NMSE 5.5e-8 in-process,
 *    1.29e-5 in a free run, logits mean KL 5.9e-9. 1e-4 sits above that and stays 10x below
 *    what a wrong scale rule, rounding or block costs per expert call (1e-3..5e-2). Stages
 *    before any quantization keep the fp32 bounds in practice; the class cannot know where
 *    the first quantized op is, so the floor applies to every float stage but embed.
 *
 * The JSON is read through ref/json.h (the project's only cJSON access). */
#include "compare/tol.h"
#include "ref/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *stage;
    double nmse_fp32, nmse_lowp, flip_fp32, flip_lowp, kl_fp32, kl_lowp, top1_fp32, top1_lowp;
    double tie_abs, tie_rel;
    const char *reason;
} builtin_row;

/* stage          nmse fp32/lowp   flip fp32/lowp  kl fp32/lowp  top1 fp32/lowp  tie abs/rel */
static const builtin_row builtin[] = {
    {"tokens", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
     "inputs: must be identical or nothing downstream is comparable"},
    {"positions", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
     "inputs: must be identical or nothing downstream is comparable"},
    {"embed", 1e-12, 1e-5, 0, 0, 0, 0, 0, 0, 0, 0,
     "row lookup of bf16-stored weights is exact; lowp admits an fp32 table rounded to bf16 "
     "(<= 2^-9 rel, NMSE <= 4e-6)"},
    {"input", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "residual stream: sum of all earlier error; fp32 3e-12 measured, lowp drift of a few layers"},
    {"output", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "residual stream: sum of all earlier error; fp32 3e-12 measured, lowp drift of a few layers"},
    {"attn_norm", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "RMSNorm: fp32 sum of squares order only; lowp one bf16 rounding of y plus inherited input error"},
    {"mlp_norm", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "RMSNorm: fp32 sum of squares order only; lowp one bf16 rounding of y plus inherited input error"},
    {"final_norm", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "RMSNorm after the last layer: inherits the whole stack's drift in lowp"},
    {"q_proj", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "GEMM, fp32 accumulation in any order; lowp bf16 in/out (2 roundings)"},
    {"k_proj", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "GEMM, fp32 accumulation in any order; lowp bf16 in/out (2 roundings)"},
    {"v_proj", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "GEMM, fp32 accumulation in any order; lowp bf16 in/out (2 roundings)"},
    {"q", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "q-norm + partial RoPE: hf rounds after norm and each rope op, atom once (§3.6)"},
    {"k", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "k-norm + partial RoPE: hf rounds after norm and each rope op, atom once (§3.6)"},
    {"v", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0, "values: a view of v_proj"},
    {"index_q", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "indexer query after norm + RoPE, same rounding story as q"},
    {"index_k", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "indexer key after norm + RoPE; fp8 index cache needs its own --tol row"},
    {"index_scores", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "raw index dots (forced blocks are +inf on both sides and agree)"},
    {"index_topk", 0, 0, 0, 0.01, 0, 0, 0, 0, 0, 0.0078125,
     "sets: fp32 implementations select identically (§10); lowp: <= 1% real flips; a flip is a "
     "near-tie when the reference block-score gap is <= 2^-7 relative (one bf16 step)"},
    {"attn_out", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "softmax(QK^T)V: accumulation order differs (sparse: selection order, §3.10)"},
    {"attn_proj", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0, "o_proj GEMM on attn_out"},
    {"router_logits", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "router GEMM: hf/atom hold the gate in bf16 (§3.12)"},
    {"expert_ids", 0, 0, 0, 0.01, 0, 0, 0, 0, 0.002, 0,
     "sets: fp32 identical; lowp: <= 1% real flips (§10 measured 1 in 300 near-tie flips); a "
     "near-tie is a sigmoid(logit)+bias gap <= 0.002 = 0.25 x one bf16 ulp of a logit near 1"},
    {"expert_weights", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "renormalised sigmoid weights, compared sorted by expert id on rows whose sets agree"},
    {"shared_out", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "shared expert MLP: 3 GEMMs + swiglu (hf rounds 5x inside swiglu, atom once)"},
    {"mlp_out", 1e-9, 1e-3, 0, 0, 0, 0, 0, 0, 0, 0,
     "MoE combine: hf accumulates in bf16 by expert id, atom in-kernel (§9.5)"},
    {"logits", 1e-9, 1e-3, 0, 0, 1e-9, 1e-3, 0.99, 0.9, 0, 0,
     "lm_head GEMM (bf16 in hf/atom); KL and top-1 gate what generation sees; top-1 may flip on "
     "exact near-ties even in fp32"},
    {"*", 1e-9, 1e-3, 0, 0.01, 1e-9, 1e-3, 0.99, 0.9, 0, 0,
     "any other stage (vision, extra taps): the generic float bounds"},
};

static void set_str(char *dst, size_t cap, const char *s) { snprintf(dst, cap, "%s", s); }

#define FP32Q_FLOOR 1e-4 /* why: header comment, fp32q class */

static double fp32q_of(double fp32, const char *stage) {
    if (fp32 <= 0 || !strcmp(stage, "embed")) return fp32; /* exact stages stay exact */
    return fp32 < FP32Q_FLOOR ? FP32Q_FLOOR : fp32;
}

void m3_tol_builtin(m3_tol *t) {
    memset(t, 0, sizeof *t);
    t->rel_floor = 0.01; /* |a| below 1% of the row RMS does not shrink the denominator */
    t->force_class = -1;
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++) {
        const builtin_row *b = &builtin[i];
        m3_tol_row *r = &t->row[t->n++];
        set_str(r->stage, sizeof r->stage, b->stage);
        r->nmse[M3_TOL_FP32] = b->nmse_fp32, r->nmse[M3_TOL_LOWP] = b->nmse_lowp;
        r->flip[M3_TOL_FP32] = b->flip_fp32, r->flip[M3_TOL_LOWP] = b->flip_lowp;
        r->kl_mean[M3_TOL_FP32] = b->kl_fp32, r->kl_mean[M3_TOL_LOWP] = b->kl_lowp;
        r->top1_min[M3_TOL_FP32] = b->top1_fp32, r->top1_min[M3_TOL_LOWP] = b->top1_lowp;
        /* fp32q: fp32's sets and top-1 (a code flip moves values by one step, it does not
         * reorder near-certain choices; near-tie flips are reported, not failed), floors on
         * the NMSE and KL bounds */
        r->nmse[M3_TOL_FP32Q] = fp32q_of(b->nmse_fp32, b->stage);
        r->kl_mean[M3_TOL_FP32Q] = fp32q_of(b->kl_fp32, b->stage);
        r->flip[M3_TOL_FP32Q] = b->flip_fp32;
        r->top1_min[M3_TOL_FP32Q] = b->top1_fp32;
        r->tie_abs = b->tie_abs, r->tie_rel = b->tie_rel;
        set_str(r->reason, sizeof r->reason, b->reason);
    }
}

const m3_tol_row *m3_tol_find(const m3_tol *t, const char *stage) {
    const m3_tol_row *star = NULL;
    for (int i = 0; i < t->n; i++) {
        if (!strcmp(t->row[i].stage, stage)) return &t->row[i];
        if (!strcmp(t->row[i].stage, "*")) star = &t->row[i];
    }
    M3_ASSERT(star);
    return star;
}

static bool is_fp32_profile(const char *p) {
    return p && (!strcmp(p, "fp32") || !strcmp(p, "float32"));
}

/* a string member of the variant object ("" when absent or not a string) */
static const char *vstr(const m3_json *v, const char *key) {
    const m3_json *m = m3_json_get(v, key);
    return m3_json_is_string(m) ? m3_json_str(m) : "";
}

bool m3_tol_variant_quantizes(const char *v) {
    m3_json *root = NULL;
    if (!v || !v[0] || m3_json_parse(&root, v, strlen(v), "variant attribute") != M3_OK) {
        m3_clear_error(); /* no (or an unreadable) variant: the plain path */
        return false;
    }
    int64_t bound = 0;
    const char *e = vstr(root, "experts");
    const bool q = !strcmp(e, "mxfp8") ||
                   (!strcmp(e, "mxfp4") && m3_json_int(m3_json_get(root, "moe_act_bound"), &bound) &&
                    bound > 0) ||
                   (vstr(root, "ptpc")[0] && strcmp(vstr(root, "ptpc"), "off") != 0) ||
                   !strcmp(vstr(root, "kv_cache"), "fp8") || !strcmp(vstr(root, "index_cache"), "fp8");
    m3_json_free(root);
    return q;
}

int m3_tol_class(const m3_tol *t, const char *pa, const char *pb, const char *va, const char *vb) {
    if (t->force_class >= 0) return t->force_class;
    if (!is_fp32_profile(pa) || !is_fp32_profile(pb)) return M3_TOL_LOWP;
    return m3_tol_variant_quantizes(va) || m3_tol_variant_quantizes(vb) ? M3_TOL_FP32Q : M3_TOL_FP32;
}

const char *m3_tol_class_name(int cls) {
    return cls == M3_TOL_FP32 ? "fp32" : cls == M3_TOL_FP32Q ? "fp32q" : "lowp";
}

static double jnum(const m3_json *j) {
    double d = 0;
    m3_json_double(j, &d);
    return d;
}

/* A tolerance is a finite number >= 0 (fractions: <= 1). A negative, NaN or 1e400 (= Inf)
 * bound would silently fail or pass every stage. */
static m3_status check_bound(double x, const char *name, const char *key, const char *stage) {
    double hi = !strcmp(key, "flip") || !strcmp(key, "top1_min") ? 1.0 : HUGE_VAL;
    if (!(x >= 0 && isfinite(x) && x <= hi))
        return m3_errorf(M3_ERR_FORMAT, "%s: stages.%s.%s = %g: expected a finite number in %s",
                         name, stage, key, x, hi == 1.0 ? "[0, 1]" : "[0, inf)");
    return M3_OK;
}

/* A number, or an object: 1e-4 sets every class; {"fp32": x, "lowp": y, "fp32q": z} sets
 * the classes named. An fp32 value also sets fp32q unless fp32q is given (the file meant the
 * fp32 profile), through the fp32q floor for nmse and kl_mean. */
static m3_status get_pair(const m3_json *v, double out[M3_TOL_NCLASS], const char *name,
                          const char *key, const char *stage) {
    if (m3_json_is_number(v)) {
        M3_TRY(check_bound(jnum(v), name, key, stage));
        out[M3_TOL_FP32] = out[M3_TOL_LOWP] = out[M3_TOL_FP32Q] = jnum(v);
        return M3_OK;
    }
    if (m3_json_is_object(v)) {
        bool q_given = false;
        for (const m3_json *c = m3_json_first(v); c; c = m3_json_next(c))
            q_given |= !strcmp(m3_json_key(c), "fp32q");
        for (const m3_json *c = m3_json_first(v); c; c = m3_json_next(c)) {
            const char *ck = m3_json_key(c);
            int k = !strcmp(ck, "fp32")    ? M3_TOL_FP32
                    : !strcmp(ck, "lowp")  ? M3_TOL_LOWP
                    : !strcmp(ck, "fp32q") ? M3_TOL_FP32Q
                                           : -1;
            if (k < 0 || !m3_json_is_number(c))
                return m3_errorf(M3_ERR_FORMAT, "%s: stages.%s.%s: expected {\"fp32\": x, "
                                 "\"lowp\": y, \"fp32q\": z}", name, stage, key);
            M3_TRY(check_bound(jnum(c), name, key, stage));
            out[k] = jnum(c);
            if (k == M3_TOL_FP32 && !q_given)
                out[M3_TOL_FP32Q] = strcmp(key, "nmse") && strcmp(key, "kl_mean")
                                        ? jnum(c) : fp32q_of(jnum(c), stage);
        }
        return M3_OK;
    }
    return m3_errorf(M3_ERR_FORMAT, "%s: stages.%s.%s: expected a number or {\"fp32\",\"lowp\",\"fp32q\"}",
                     name, stage, key);
}

static m3_status parse_stage(m3_tol *t, const m3_json *s, const char *name) {
    if (!m3_json_is_object(s))
        return m3_errorf(M3_ERR_FORMAT, "%s: stages.%s: expected an object", name, m3_json_key(s));
    if (strlen(m3_json_key(s)) >= sizeof t->row[0].stage)
        return m3_errorf(M3_ERR_FORMAT, "%s: stage name '%.40s...' too long", name, m3_json_key(s));
    m3_tol_row *r = NULL;
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->row[i].stage, m3_json_key(s))) r = &t->row[i];
    if (!r) { /* a new stage (extra tap): start from the "*" row */
        if (t->n == M3_TOL_MAX_ROWS)
            return m3_errorf(M3_ERR_FORMAT, "%s: more than %d tolerance rows", name, M3_TOL_MAX_ROWS);
        r = &t->row[t->n];
        *r = *m3_tol_find(t, "*");
        t->n++;
        set_str(r->stage, sizeof r->stage, m3_json_key(s));
    }
    for (const m3_json *c = m3_json_first(s); c; c = m3_json_next(c)) {
        const char *k = m3_json_key(c);
        if (!strcmp(k, "nmse")) M3_TRY(get_pair(c, r->nmse, name, k, m3_json_key(s)));
        else if (!strcmp(k, "flip")) M3_TRY(get_pair(c, r->flip, name, k, m3_json_key(s)));
        else if (!strcmp(k, "kl_mean")) M3_TRY(get_pair(c, r->kl_mean, name, k, m3_json_key(s)));
        else if (!strcmp(k, "top1_min")) M3_TRY(get_pair(c, r->top1_min, name, k, m3_json_key(s)));
        else if (!strcmp(k, "tie_abs") && m3_json_is_number(c)) {
            M3_TRY(check_bound(jnum(c), name, k, m3_json_key(s)));
            r->tie_abs = jnum(c);
        } else if (!strcmp(k, "tie_rel") && m3_json_is_number(c)) {
            M3_TRY(check_bound(jnum(c), name, k, m3_json_key(s)));
            r->tie_rel = jnum(c);
        }
        else if (!strcmp(k, "reason") && m3_json_is_string(c)) set_str(r->reason, sizeof r->reason, m3_json_str(c));
        else
            return m3_errorf(M3_ERR_FORMAT, "%s: stages.%s: unknown or mistyped key '%s' (known: "
                             "nmse, flip, kl_mean, top1_min, tie_abs, tie_rel, reason)", name, m3_json_key(s), k);
    }
    return M3_OK;
}

m3_status m3_tol_parse(m3_tol *t, const char *json, const char *name) {
    m3_tol_builtin(t);
    m3_json *root = NULL;
    M3_TRY(m3_json_parse(&root, json, strlen(json), name)); /* records line and column */
    m3_status st = M3_OK;
    if (!m3_json_is_object(root)) {
        st = m3_errorf(M3_ERR_FORMAT, "%s: expected a JSON object", name);
        goto done;
    }
    for (const m3_json *c = m3_json_first(root); c && st == M3_OK; c = m3_json_next(c)) {
        if (!strcmp(m3_json_key(c), "rel_floor") && m3_json_is_number(c) && jnum(c) >= 0) {
            t->rel_floor = jnum(c);
        } else if (!strcmp(m3_json_key(c), "class") && m3_json_is_string(c)) {
            if (!strcmp(m3_json_str(c), "auto")) t->force_class = -1;
            else if (!strcmp(m3_json_str(c), "fp32")) t->force_class = M3_TOL_FP32;
            else if (!strcmp(m3_json_str(c), "lowp")) t->force_class = M3_TOL_LOWP;
            else if (!strcmp(m3_json_str(c), "fp32q")) t->force_class = M3_TOL_FP32Q;
            else st = m3_errorf(M3_ERR_FORMAT, "%s: class must be auto, fp32, fp32q or lowp", name);
        } else if (!strcmp(m3_json_key(c), "stages") && m3_json_is_object(c)) {
            for (const m3_json *s = m3_json_first(c); s && st == M3_OK; s = m3_json_next(s)) st = parse_stage(t, s, name);
        } else if (!strcmp(m3_json_key(c), "comment")) {
            /* free text, ignored */
        } else {
            st = m3_errorf(M3_ERR_FORMAT, "%s: unknown or mistyped key '%s' (known: rel_floor, "
                           "class, stages, comment)", name, m3_json_key(c));
        }
    }
done:
    m3_json_free(root);
    return st;
}

m3_status m3_tol_load(m3_tol *t, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return m3_errorf(M3_ERR_IO, "%s: cannot open", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    m3_status st = M3_OK;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > ((size_t)16 << 20)) { st = m3_errorf(M3_ERR_FORMAT, "%s: larger than 16 MiB", path); break; }
            char *nb = realloc(buf, cap);
            if (!nb) { st = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path); break; }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, 4096, f);
        n += r;
        if (r < 4096) {
            if (ferror(f)) st = m3_errorf(M3_ERR_IO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (st == M3_OK) {
        buf[n] = 0;
        st = m3_tol_parse(t, buf, path);
    }
    free(buf);
    return st;
}
