/* ref/embed.c: see embed.h. */
#include "ref/embed.h"

m3_status m3_embed(float *y, const int32_t *ids, int n_tok, const m3_bf16 *table, int n_vocab,
                   int dim) {
    M3_ASSERT(n_tok >= 0 && dim > 0 && n_vocab > 0);
    /* validate every id first: never leave a half-written output */
    for (int t = 0; t < n_tok; t++)
        if (ids[t] < 0 || ids[t] >= n_vocab)
            return m3_errorf(M3_ERR_ARG, "token %d: id %d outside the vocabulary [0, %d)", t,
                             (int)ids[t], n_vocab);
    for (int t = 0; t < n_tok; t++) {
        const m3_bf16 *row = table + (size_t)ids[t] * (size_t)dim;
        float *out = y + (size_t)t * (size_t)dim;
        for (int i = 0; i < dim; i++) out[i] = m3_bf16_to_f32(row[i]);
    }
    return M3_OK;
}
