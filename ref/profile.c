/* ref/profile.c: see profile.h. The values of every switch per profile are the tables of
 * spec m3-numerics.md §3 (per component) and §9 (hf vs atom); docs/numerics.md §2. */
#include "ref/profile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void m3_profile_fp32(m3_profile *p) {
    memset(p, 0, sizeof *p);
    p->id = M3_PROFILE_FP32;
    p->name = "fp32";
    p->act_bf16 = false;
    p->residual_bf16 = false;
    p->norm_reads_f32_sum = false;
    p->qk_round = M3_QK_ROUND_NONE;
    p->rope_cs_bf16 = false;
    p->rope_inv = M3_ROPE_INV_TORCH;
    p->rope_angle = M3_ROPE_ANGLE_F32;
    p->attn_scores = M3_SCORES_F32;
    p->attn_p_bf16 = false;
    p->attn_out_bf16 = false;
    p->attn_partition = 0;
    p->attn_order = M3_ATTN_ORDER_POSITION;
    p->index_scale = 1.0f;
    p->local_boost = INFINITY;
    p->init_boost = INFINITY;
    p->index_init_blocks = false; /* HF drops sparse_init_block */
    p->index_nan = M3_INDEX_NAN_HIGHEST;
    p->topk_width = M3_TOPK_WIDTH_K;
    p->topk_tie_margin = 0.0f;
    p->router_dtype = M3_DT_F32;
    p->swiglu = M3_SWIGLU_F32;
    p->moe_bf16_combine = false;
}

void m3_profile_hf(m3_profile *p) {
    m3_profile_fp32(p);
    p->id = M3_PROFILE_HF;
    p->name = "hf";
    p->act_bf16 = true;       /* every torch op on bf16 tensors rounds its output */
    p->residual_bf16 = true;  /* bf16(r + h); the norm reads the rounded sum */
    p->qk_round = M3_QK_ROUND_PER_OP;
    p->rope_cs_bf16 = true;   /* cos.to(x.dtype) */
    p->attn_scores = M3_SCORES_BF16_EAGER;
    p->attn_p_bf16 = true;    /* softmax(dtype=fp32).to(bf16) */
    p->attn_out_bf16 = true;
    p->router_dtype = M3_DT_BF16; /* from_pretrained(dtype=bf16) casts gate and bias (§10) */
    p->swiglu = M3_SWIGLU_BF16_PER_OP;
    p->moe_bf16_combine = true;
}

void m3_profile_atom(m3_profile *p) {
    m3_profile_fp32(p);
    p->id = M3_PROFILE_ATOM;
    p->name = "atom";
    p->act_bf16 = true;
    p->residual_bf16 = true;
    p->norm_reads_f32_sum = true; /* fused add+norm normalises the fp32 sum (§9.2) */
    p->qk_round = M3_QK_ROUND_ONCE; /* fused_qknorm_idxrqknorm: one rounding (§9.3) */
    p->rope_cs_bf16 = true;         /* bf16 cos/sin cache, fp32 arithmetic */
    p->attn_scores = M3_SCORES_F32;
    p->attn_p_bf16 = true;
    p->attn_out_bf16 = true;
    p->attn_partition = 256; /* gluon PA partitions stored bf16 (§4.9, §9.11) */
    p->attn_order = M3_ATTN_ORDER_SELECTION;
    p->index_scale = 0.127517432f; /* 128^-1/2 * log2(e) as fp32 (§1.5) */
    p->local_boost = 1e29f;
    p->init_boost = 1e30f;
    p->index_init_blocks = true;
    p->index_nan = M3_INDEX_NAN_NEG;
    p->topk_width = M3_TOPK_WIDTH_K;
    p->router_dtype = M3_DT_BF16;
    p->swiglu = M3_SWIGLU_BF16_ONCE;
    p->moe_bf16_combine = false; /* kernel-internal combine: fp32 sum, rounded at the end */
}

m3_status m3_profile_by_name(m3_profile *p, const char *name) {
    if (!name) return m3_errorf(M3_ERR_ARG, "profile: no name given (fp32|hf|atom)");
    if (strcmp(name, "fp32") == 0)
        m3_profile_fp32(p);
    else if (strcmp(name, "hf") == 0)
        m3_profile_hf(p);
    else if (strcmp(name, "atom") == 0)
        m3_profile_atom(p);
    else
        return m3_errorf(M3_ERR_ARG, "unknown profile '%s' (expected fp32, hf or atom)", name);
    return M3_OK;
}

static bool parse_float(const char *s, float *out) {
    char *end = NULL;
    float v = strtof(s, &end);
    if (!end || end == s || *end) return false;
    *out = v;
    return true;
}

m3_status m3_profile_set(m3_profile *p, const char *key, const char *v) {
    if (!key || !v) return m3_errorf(M3_ERR_ARG, "profile option: missing key or value");
    float f;
    if (strcmp(key, "router_dtype") == 0) {
        if (strcmp(v, "fp32") == 0 || strcmp(v, "f32") == 0) p->router_dtype = M3_DT_F32;
        else if (strcmp(v, "bf16") == 0) p->router_dtype = M3_DT_BF16;
        else goto bad;
    } else if (strcmp(key, "rope_angle") == 0) {
        if (strcmp(v, "f32") == 0) p->rope_angle = M3_ROPE_ANGLE_F32;
        else if (strcmp(v, "f64") == 0) p->rope_angle = M3_ROPE_ANGLE_F64;
        else goto bad;
    } else if (strcmp(key, "rope_inv") == 0) {
        if (strcmp(v, "torch") == 0) p->rope_inv = M3_ROPE_INV_TORCH;
        else if (strcmp(v, "f64") == 0) p->rope_inv = M3_ROPE_INV_F64;
        else goto bad;
    } else if (strcmp(key, "attn_impl") == 0) {
        if (strcmp(v, "eager") == 0) p->attn_scores = M3_SCORES_BF16_EAGER;
        else if (strcmp(v, "fp32") == 0 || strcmp(v, "sdpa") == 0) p->attn_scores = M3_SCORES_F32;
        else goto bad;
    } else if (strcmp(key, "attn_order") == 0) {
        if (strcmp(v, "position") == 0) p->attn_order = M3_ATTN_ORDER_POSITION;
        else if (strcmp(v, "selection") == 0) p->attn_order = M3_ATTN_ORDER_SELECTION;
        else goto bad;
    } else if (strcmp(key, "attn_partition") == 0) {
        char *end = NULL;
        long n = strtol(v, &end, 10);
        if (!end || *end || end == v || n < 0 || (n > 0 && n < 64) || n > (1L << 30)) goto bad;
        p->attn_partition = (int)n;
    } else if (strcmp(key, "index_scale") == 0) {
        if (strcmp(v, "slog2e") == 0) p->index_scale = 0.127517432f;
        else if (parse_float(v, &f) && f > 0 && isfinite(f)) p->index_scale = f;
        else goto bad;
    } else if (strcmp(key, "local_boost") == 0) {
        if (strcmp(v, "inf") == 0 || strcmp(v, "+inf") == 0) p->local_boost = INFINITY;
        else if (parse_float(v, &f) && !isnan(f)) p->local_boost = f;
        else goto bad;
    } else if (strcmp(key, "topk_width") == 0) {
        if (strcmp(v, "k") == 0 || strcmp(v, "atom") == 0) p->topk_width = M3_TOPK_WIDTH_K;
        else if (strcmp(v, "hf") == 0) p->topk_width = M3_TOPK_WIDTH_HF;
        else goto bad;
    } else if (strcmp(key, "topk_tie_margin") == 0) {
        if (parse_float(v, &f) && f >= 0 && !isnan(f)) p->topk_tie_margin = f;
        else goto bad;
    } else if (strcmp(key, "swiglu") == 0) {
        if (strcmp(v, "fp32") == 0) p->swiglu = M3_SWIGLU_F32;
        else if (strcmp(v, "per_op") == 0) p->swiglu = M3_SWIGLU_BF16_PER_OP;
        else if (strcmp(v, "once") == 0) p->swiglu = M3_SWIGLU_BF16_ONCE;
        else goto bad;
    } else {
        return m3_errorf(M3_ERR_ARG, "unknown profile option '%s'", key);
    }
    return M3_OK;
bad:
    return m3_errorf(M3_ERR_ARG, "profile option %s: bad value '%s'", key, v);
}

static const char *qk_name(m3_qk_round r) {
    return r == M3_QK_ROUND_PER_OP ? "per_op" : r == M3_QK_ROUND_ONCE ? "once" : "none";
}
static const char *swiglu_name(m3_swiglu_round r) {
    return r == M3_SWIGLU_BF16_PER_OP ? "per_op" : r == M3_SWIGLU_BF16_ONCE ? "once" : "fp32";
}

int m3_profile_json(const m3_profile *p, char *buf, size_t n) {
    char lb[32];
    if (isinf(p->local_boost)) snprintf(lb, sizeof lb, "\"inf\"");
    else snprintf(lb, sizeof lb, "%.9g", (double)p->local_boost);
    return snprintf(
        buf, n,
        "{\"profile\":\"%s\",\"router_dtype\":\"%s\",\"rope_angle\":\"%s\",\"rope_inv\":\"%s\","
        "\"attn_impl\":\"%s\",\"attn_order\":\"%s\",\"attn_partition\":%d,"
        "\"index_scale\":%.9g,\"local_boost\":%s,\"topk_width\":\"%s\",\"topk_tie\":\"id_asc\","
        "\"topk_tie_margin\":%.9g,\"qk_round\":\"%s\",\"swiglu\":\"%s\",\"experts_impl\":\"%s\"}",
        p->name, p->router_dtype == M3_DT_BF16 ? "bf16" : "fp32",
        p->rope_angle == M3_ROPE_ANGLE_F64 ? "f64" : "f32",
        p->rope_inv == M3_ROPE_INV_F64 ? "f64" : "torch",
        p->attn_scores == M3_SCORES_BF16_EAGER ? "eager" : "fp32",
        p->attn_order == M3_ATTN_ORDER_SELECTION ? "selection" : "position", p->attn_partition,
        (double)p->index_scale, lb, p->topk_width == M3_TOPK_WIDTH_HF ? "hf" : "k",
        (double)p->topk_tie_margin, qk_name(p->qk_round), swiglu_name(p->swiglu),
        p->moe_bf16_combine ? "eager" : "fused");
}

void m3_round_bf16_n(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = m3_round_bf16(x[i]);
}
