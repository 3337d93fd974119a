/* ref/variant_cache.c: the cache / top-k reuse keys of m3_variant (variant.h).
 * Only the defaults are accepted until the paged fp8 caches land. */
#include "ref/variant.h"

#include <stdio.h>
#include <string.h>

m3_status m3_variant_set_cache(m3_variant *v, const char *key, const char *value) {
    if (!strcmp(key, "kv_cache") || !strcmp(key, "index_cache")) {
        if (!strcmp(value, "bf16")) return M3_OK;
        if (!strcmp(value, "fp8"))
            return m3_errorf(M3_ERR_UNSUPPORTED, "--%s fp8 is not implemented in this build",
                             key[0] == 'k' ? "kv-cache" : "index-cache");
        return m3_errorf(M3_ERR_ARG, "--%s must be bf16 or fp8, got '%s'",
                         key[0] == 'k' ? "kv-cache" : "index-cache", value);
    }
    (void)v;
    return M3_ERR_MISSING;
}

int m3_variant_json_cache(const m3_variant *v, char *buf, size_t n) {
    (void)v;
    return snprintf(buf, n, "\"kv_cache\":\"bf16\",\"index_cache\":\"bf16\",\"topk_reuse\":1,"
                            "\"cache_layout\":\"contiguous\"");
}
