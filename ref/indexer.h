/* ref/indexer.h: the lightning indexer of sparse layers: block scores and top-k block
 * selection per index head (spec §3.8). Selection is a discrete output kept apart from the
 * attention (m3_attn_sparse) so tests and replay can teacher-force it.
 *
 * Math: for token t at position p and index head g, over keys j <= p:
 *     z_gj = sigma_idx * sum_d iq[t,g,d] * ik[j,d]       (sigma_idx = p->index_scale)
 *   block b = j / Bs; nb = p/Bs + 1 candidate blocks;
 *     S_g(p,b) = max_{j in b, j <= p} z_gj;
 *   forced: init blocks b < init_blocks (only when p->index_init_blocks) := p->init_boost,
 *     then local blocks b >= max(0, nb - local_blocks) := p->local_boost (local wins);
 *   NaN: p->index_nan (highest, or -1e30).
 *   Keep the top min(K, nb) blocks ordered by (score desc, block id asc) (the documented
 *   reference tie rule), left-packed; the remaining slots are -1.
 * Shapes: iq [T, G*Di] (row pitch ld_q), ik [S_k, Di] (one key head shared by the G heads),
 *   pos [T] (pos[t] < n_ctx = S_k), topk [G, T, W] int32 with
 *   W = m3_indexer_width(n_ctx, ...): K, or min(K, ceil(S_k/Bs)) for M3_TOPK_WIDTH_HF;
 *   scores (optional) [G, T, NB], NB = ceil(S_k/Bs): the block scores used for selection
 *   (forced values included; blocks > b_p are -inf) for the `index_scores` dump;
 *   margin (optional) [G, T]: S_(K) - S_(K+1) of the sorted candidates, +inf when nb <= K.
 * Numerics: the dot is m3_dot_f32 (fp32, fixed order) of the stored (already rounded per
 *   profile) iq/ik values, times sigma_idx in fp32 (skipped when it is 1, an exact no-op).
 *   Ties: a row counts as a tie straddling rank K when nb > K and S_(K) - S_(K+1) <=
 *   p->topk_tie_margin (equal scores when the margin is 0).
 * Threads: over (g, t) rows. docs/numerics.md §3.8. */
#ifndef M3_INDEXER_H
#define M3_INDEXER_H

#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"
#include "ref/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct m3_indexer_params {
    int n_index_head;   /* G  (4); equals Hkv (index head g pairs with KV group g) */
    int index_head_dim; /* Di (128) */
    int block;          /* Bs (128) */
    int topk;           /* K  (16), counts the forced blocks */
    int local_blocks;   /* 1 */
    int init_blocks;    /* 0 (atom only, see p->index_init_blocks) */
} m3_indexer_params;

/* Output width W (last dim of topk) for a key history of n_ctx keys. */
int m3_indexer_width(int n_ctx, const m3_indexer_params *ip, const m3_profile *p);

/* Scratch: m3_threads() slots of ceil(n_ctx/Bs) scores and ids each; fewer bytes -> fewer
 * slots (at least one must fit: asserted). */
size_t m3_indexer_scratch_bytes(int n_ctx, const m3_indexer_params *ip);

/* Select the blocks. scores, margin and n_ties may be NULL. Returns the number of tied rows
 * through *n_ties. */
void m3_indexer_topk(int32_t *topk, float *scores, float *margin, int *n_ties, const float *iq,
                     int ld_q, const float *ik, const int32_t *pos, int n_tok, int n_ctx,
                     const m3_indexer_params *ip, const m3_profile *p, void *scratch,
                     size_t scratch_bytes);

#ifdef __cplusplus
}
#endif
#endif
