/* ref/variant_quant.c: the quantized-expert / online-quant keys of m3_variant (variant.h);
 * what each one does is docs/quantization.md. */
#include "ref/variant.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *experts_names[] = {"bf16", "mxfp4", "mxfp8", "stored"};
static const char *scale_names[] = {"floor", "even", "rceil"};
static const char *round_names[] = {"rne", "rna"};
static const char *tri_names[] = {"auto", "on", "off"};
static const char *zero_names[] = {"nan", "one"};

/* index of value in names[0..n), -1 if absent */
static int pick(const char *value, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(value, names[i])) return i;
    return -1;
}

static m3_status bad(const char *key, const char *value, const char *want) {
    return m3_errorf(M3_ERR_ARG, "--%s must be %s, got '%s'", key, want, value);
}

m3_status m3_variant_set_quant(m3_variant *v, const char *key, const char *value) {
    int i;
    if (!strcmp(key, "experts")) {
        if ((i = pick(value, experts_names, 4)) < 0)
            return bad("experts", value, "bf16, mxfp4, mxfp8 or stored");
        v->experts = (m3_experts_mode)i;
    } else if (!strcmp(key, "experts_scale")) {
        if ((i = pick(value, scale_names, 3)) < 0)
            return bad("experts-scale", value, "floor, even or rceil");
        v->experts_scale = (m3_mx_scale_rule)i;
    } else if (!strcmp(key, "experts_round")) {
        if ((i = pick(value, round_names, 2)) < 0) return bad("experts-round", value, "rne or rna");
        v->experts_round = (m3_mx_round)i;
    } else if (!strcmp(key, "moe_act_bound")) {
        char *end;
        errno = 0;
        long n = strtol(value, &end, 10);
        if (errno || end == value || *end || n < 0 || n > INT_MAX)
            return bad("moe-act-bound", value, "a token count >= 0 (0 = never)");
        v->moe_act_bound = (int)n;
    } else if (!strcmp(key, "shared_fused")) {
        if ((i = pick(value, tri_names, 3)) < 0)
            return bad("shared-fused", value, "auto, on or off");
        v->shared_fused = (m3_tri)i;
    } else if (!strcmp(key, "moe_stage2_act")) {
        if (strcmp(value, "same") && strcmp(value, "none"))
            return bad("moe-stage2-act", value, "same or none");
        v->moe_stage2_plain = !strcmp(value, "none");
    } else if (!strcmp(key, "ptpc")) {
        if (strcmp(value, "off") && strcmp(value, "fp8")) return bad("ptpc", value, "off or fp8");
        v->ptpc = !strcmp(value, "fp8");
    } else if (!strcmp(key, "ptpc_zero_row")) {
        if ((i = pick(value, zero_names, 2)) < 0) return bad("ptpc-zero-row", value, "nan or one");
        v->ptpc_zero_row = (m3_ptpc_zero_row)i;
    } else {
        return M3_ERR_MISSING;
    }
    return M3_OK;
}

int m3_variant_json_quant(const m3_variant *v, char *buf, size_t n) {
    return snprintf(buf, n,
                    "\"experts\":\"%s\",\"experts_scale\":\"%s\",\"experts_round\":\"%s\","
                    "\"moe_act_bound\":%d,\"shared_fused\":\"%s\",\"moe_stage2_act\":\"%s\","
                    "\"ptpc\":\"%s\",\"ptpc_zero_row\":\"%s\"",
                    experts_names[v->experts], scale_names[v->experts_scale],
                    round_names[v->experts_round], v->moe_act_bound, tri_names[v->shared_fused],
                    v->moe_stage2_plain ? "none" : "same", v->ptpc ? "fp8" : "off",
                    zero_names[v->ptpc_zero_row]);
}
