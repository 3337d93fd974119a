/* ref/embed.h: token embedding lookup (spec §3.1).
 * Math: y[t,:] = E[ids[t], :]. No scaling. Shapes: ids [T] int32, E [V, D] bf16, y [T, D].
 * Numerics: bf16 -> fp32 is exact; nothing to round in any profile.
 * docs/numerics.md §3.1. */
#ifndef M3_EMBED_H
#define M3_EMBED_H

#include <stdint.h>

#include "ref/base.h"
#include "ref/num/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ids come from user input: an id outside [0, n_vocab) returns M3_ERR_ARG with a message
 * naming the token index and id, and y is left untouched. */
m3_status m3_embed(float *y, const int32_t *ids, int n_tok, const m3_bf16 *table, int n_vocab,
                   int dim);

#ifdef __cplusplus
}
#endif
#endif
