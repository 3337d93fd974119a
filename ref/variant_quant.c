/* ref/variant_quant.c: the quantized-expert / online-quant keys of m3_variant (variant.h).
 * Only the defaults are accepted until the quantized paths land. */
#include "ref/variant.h"

#include <stdio.h>
#include <string.h>

m3_status m3_variant_set_quant(m3_variant *v, const char *key, const char *value) {
    if (!strcmp(key, "experts")) {
        if (!strcmp(value, "bf16") || !strcmp(value, "stored")) {
            v->experts = !strcmp(value, "bf16") ? M3_EXPERTS_BF16 : M3_EXPERTS_STORED;
            return M3_OK;
        }
        if (!strcmp(value, "mxfp4") || !strcmp(value, "mxfp8"))
            return m3_errorf(M3_ERR_UNSUPPORTED, "--experts %s is not implemented in this build", value);
        return m3_errorf(M3_ERR_ARG, "--experts must be bf16, mxfp4, mxfp8 or stored, got '%s'", value);
    }
    return M3_ERR_MISSING;
}

int m3_variant_json_quant(const m3_variant *v, char *buf, size_t n) {
    static const char *ex[] = {"bf16", "mxfp4", "mxfp8", "stored"};
    return snprintf(buf, n, "\"experts\":\"%s\"", ex[v->experts]);
}
