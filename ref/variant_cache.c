/* ref/variant_cache.c: the cache / top-k reuse keys of m3_variant (variant.h); what they do
 * is in docs/caches.md. kv_cache or index_cache fp8 also selects cache_layout paged (the fp8
 * caches exist only in the paged layout); m3_variant_check_cache rejects fp8 with an
 * explicitly contiguous layout given afterwards. */
#include "ref/variant.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi) return false;
    *out = (int)x;
    return true;
}

static m3_status tri(m3_tri *t, const char *key, const char *v) {
    if (!strcmp(v, "auto"))
        *t = M3_TRI_AUTO;
    else if (!strcmp(v, "on"))
        *t = M3_TRI_ON;
    else if (!strcmp(v, "off"))
        *t = M3_TRI_OFF;
    else
        return m3_errorf(M3_ERR_ARG, "variant %s must be auto, on or off, got '%s'", key, v);
    return M3_OK;
}

m3_status m3_variant_set_cache(m3_variant *v, const char *key, const char *value) {
    if (!strcmp(key, "kv_cache") || !strcmp(key, "index_cache")) {
        m3_cache_dtype *d = key[0] == 'k' ? &v->kv_cache : &v->index_cache;
        if (!strcmp(value, "bf16"))
            *d = M3_CACHE_BF16;
        else if (!strcmp(value, "fp8")) {
            *d = M3_CACHE_FP8;
            v->cache_layout = M3_LAYOUT_PAGED;
        } else
            return m3_errorf(M3_ERR_ARG, "variant %s must be bf16 or fp8, got '%s'", key, value);
        return M3_OK;
    }
    if (!strcmp(key, "fp8_kind")) {
        if (!strcmp(value, "e4m3fn"))
            v->fp8_kind = M3_FP8_E4M3FN;
        else if (!strcmp(value, "e4m3fnuz"))
            v->fp8_kind = M3_FP8_E4M3FNUZ;
        else
            return m3_errorf(M3_ERR_ARG, "variant fp8_kind must be e4m3fn or e4m3fnuz, got '%s'",
                             value);
        return M3_OK;
    }
    if (!strcmp(key, "fp8_overflow")) {
        if (!strcmp(value, "saturate"))
            v->fp8_overflow = M3_FP8_SATURATE;
        else if (!strcmp(value, "nan"))
            v->fp8_overflow = M3_FP8_OVF_NAN;
        else
            return m3_errorf(M3_ERR_ARG, "variant fp8_overflow must be saturate or nan, got '%s'",
                             value);
        return M3_OK;
    }
    if (!strcmp(key, "kv_fp8max")) {
        if (!strcmp(value, "table"))
            v->kv_fp8max = 0;
        else if (!strcmp(value, "240"))
            v->kv_fp8max = 240;
        else if (!strcmp(value, "448"))
            v->kv_fp8max = 448;
        else
            return m3_errorf(M3_ERR_ARG, "variant kv_fp8max must be table, 240 or 448, got '%s'",
                             value);
        return M3_OK;
    }
    if (!strcmp(key, "cache_layout")) {
        if (!strcmp(value, "contiguous"))
            v->cache_layout = M3_LAYOUT_CONTIGUOUS;
        else if (!strcmp(value, "paged"))
            v->cache_layout = M3_LAYOUT_PAGED;
        else
            return m3_errorf(M3_ERR_ARG,
                             "variant cache_layout must be contiguous or paged, got '%s'", value);
        return M3_OK;
    }
    if (!strcmp(key, "index_q_fp8_prefill")) return tri(&v->index_q_fp8_prefill, key, value);
    if (!strcmp(key, "topk_reuse")) {
        if (!parse_int(value, 1, 1 << 20, &v->topk_reuse))
            return m3_errorf(M3_ERR_ARG, "variant topk_reuse wants a positive integer, got '%s'",
                             value);
        return M3_OK;
    }
    if (!strcmp(key, "topk_skip_offset")) {
        if (!parse_int(value, 0, 1 << 20, &v->topk_skip_offset))
            return m3_errorf(M3_ERR_ARG, "variant topk_skip_offset wants an integer >= 0, got '%s'",
                             value);
        return M3_OK;
    }
    if (!strcmp(key, "topk_pattern")) {
        size_t n = strlen(value);
        if (n == 0 || n >= sizeof v->topk_pattern)
            return m3_errorf(M3_ERR_ARG, "variant topk_pattern must have 1..%zu characters",
                             sizeof v->topk_pattern - 1);
        for (size_t i = 0; i < n; i++)
            if (value[i] < 0x21 || value[i] > 0x7E || value[i] == '"' || value[i] == '\\')
                return m3_errorf(M3_ERR_ARG,
                                 "variant topk_pattern: character %zu is not a plain "
                                 "printable character",
                                 i);
        if (value[0] == 'S')
            return m3_errorf(M3_ERR_ARG,
                             "variant topk_pattern '%s': the first sparse layer has "
                             "no top-k to reuse ('S' at ordinal 0)",
                             value);
        memcpy(v->topk_pattern, value, n + 1);
        return M3_OK;
    }
    return M3_ERR_MISSING;
}

m3_status m3_variant_check_cache(const m3_variant *v) {
    if ((v->kv_cache == M3_CACHE_FP8 || v->index_cache == M3_CACHE_FP8) &&
        v->cache_layout != M3_LAYOUT_PAGED)
        return m3_errorf(M3_ERR_ARG, "fp8 caches exist only in the paged layout: drop "
                                     "cache_layout contiguous");
    if (v->index_q_fp8_prefill == M3_TRI_ON && v->cache_layout != M3_LAYOUT_PAGED)
        return m3_errorf(M3_ERR_ARG, "index_q_fp8_prefill on needs cache_layout paged");
    if (v->topk_skip_offset > 0 && v->topk_reuse <= 1)
        return m3_errorf(M3_ERR_ARG, "topk_skip_offset needs topk_reuse > 1");
    return M3_OK;
}

bool m3_variant_index_q_fp8(const m3_variant *v) {
    if (v->index_q_fp8_prefill == M3_TRI_AUTO) return v->index_cache == M3_CACHE_FP8;
    return v->index_q_fp8_prefill == M3_TRI_ON;
}

int m3_variant_json_cache(const m3_variant *v, char *buf, size_t n) {
    static const char *tris[] = {"auto", "on", "off"};
    return snprintf(buf, n,
                    "\"kv_cache\":\"%s\",\"index_cache\":\"%s\",\"cache_layout\":\"%s\","
                    "\"fp8_kind\":\"%s\",\"fp8_overflow\":\"%s\",\"kv_fp8max_writer\":\"%s\","
                    "\"index_q_fp8_prefill\":\"%s\",\"topk_reuse\":%d,\"topk_pattern\":\"%s\","
                    "\"topk_skip_offset\":%d",
                    v->kv_cache == M3_CACHE_FP8 ? "fp8" : "bf16",
                    v->index_cache == M3_CACHE_FP8 ? "fp8" : "bf16",
                    v->cache_layout == M3_LAYOUT_PAGED ? "paged" : "contiguous",
                    v->fp8_kind == M3_FP8_E4M3FNUZ ? "e4m3fnuz" : "e4m3fn",
                    v->fp8_overflow == M3_FP8_OVF_NAN ? "nan" : "saturate",
                    v->kv_fp8max == 0     ? "table"
                    : v->kv_fp8max == 240 ? "240"
                                          : "448",
                    tris[v->index_q_fp8_prefill], v->topk_reuse > 0 ? v->topk_reuse : 1,
                    v->topk_pattern, v->topk_skip_offset);
}
