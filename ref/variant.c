/* ref/variant.c: see variant.h. The per-part keys live in variant_quant.c and
 * variant_cache.c; this file only dispatches. */
#include "ref/variant.h"

#include <stdio.h>
#include <string.h>

void m3_variant_default(m3_variant *v) {
    memset(v, 0, sizeof *v);
    v->experts = M3_EXPERTS_STORED;
    v->experts_scale = M3_MX_SCALE_EVEN; /* Quark's offline weight rule (spec §5.4) */
    v->experts_round = M3_MX_ROUND_RNE;
    v->moe_act_bound = 256;              /* ATOM's A16W4 -> A4W4 switch (spec §5.11) */
    v->shared_fused = M3_TRI_AUTO;
    v->ptpc_zero_row = M3_PTPC_ZERO_NAN;
    v->fp8_kind = M3_FP8_E4M3FN;
    v->fp8_overflow = M3_FP8_SATURATE;
    v->index_q_fp8_prefill = M3_TRI_AUTO;
}

m3_status m3_variant_set(m3_variant *v, const char *key, const char *value) {
    char k[64];
    size_t n = strlen(key);
    if (n >= sizeof k) return m3_errorf(M3_ERR_ARG, "variant key '%.40s...' too long", key);
    for (size_t i = 0; i <= n; i++) k[i] = key[i] == '-' ? '_' : key[i];
    m3_status s = m3_variant_set_quant(v, k, value);
    if (s != M3_ERR_MISSING) return s;
    s = m3_variant_set_cache(v, k, value);
    if (s != M3_ERR_MISSING) return s;
    return m3_errorf(M3_ERR_ARG, "unknown variant option '%s'", key);
}

m3_status m3_variant_check(const m3_variant *v) {
    if (v->topk_reuse > 1 && v->topk_pattern[0])
        return m3_errorf(M3_ERR_ARG, "give at most one of topk_reuse and topk_pattern");
    return m3_variant_check_cache(v);
}

int m3_variant_json(const m3_variant *v, char *buf, size_t n) {
    char a[1024], b[1024];
    m3_variant_json_quant(v, a, sizeof a);
    m3_variant_json_cache(v, b, sizeof b);
    return snprintf(buf, n, "{%s%s%s}", a, a[0] && b[0] ? "," : "", b);
}

bool m3_variant_is_default(const m3_variant *v) {
    m3_variant d;
    m3_variant_default(&d);
    char a[2048], b[2048];
    m3_variant_json(v, a, sizeof a);
    m3_variant_json(&d, b, sizeof b);
    return strcmp(a, b) == 0;
}
