/* ref/indexer.c: see indexer.h. One (g, t) row at a time: block scores, then a selection of
 * the top min(K, nb) candidates by (score desc, id asc). */
#include "ref/indexer.h"

#include <math.h>
#include <string.h>

#include "ref/linear.h" /* m3_dot_f32 */

int m3_indexer_width(int n_ctx, const m3_indexer_params *ip, const m3_profile *p) {
    M3_ASSERT(n_ctx > 0 && ip && p && ip->block > 0 && ip->topk > 0);
    if (p->topk_width == M3_TOPK_WIDTH_HF) {
        int nbk = (n_ctx + ip->block - 1) / ip->block;
        return nbk < ip->topk ? nbk : ip->topk;
    }
    return ip->topk;
}

static size_t slot_words(int n_ctx, const m3_indexer_params *ip) {
    size_t nb = (size_t)(n_ctx + ip->block - 1) / (size_t)ip->block;
    /* scores[nb] (float) | order[nb] (int32) | this slot's tie count (one word) */
    return (2 * nb + 1 + 15) & ~(size_t)15;
}

size_t m3_indexer_scratch_bytes(int n_ctx, const m3_indexer_params *ip) {
    return (size_t)m3_threads() * slot_words(n_ctx, ip) * 4;
}

typedef struct {
    int32_t *topk;
    float *scores, *margin;
    const float *iq, *ik;
    int ld_q;
    const int32_t *pos;
    int n_tok, n_ctx, width, nbk;
    const m3_indexer_params *ip;
    const m3_profile *p;
    uint32_t *scratch;
    size_t slot_w;
    int n_slots;
} idx_job;

/* a ranks before b: score desc, NaN highest (the NaN policy was applied before), id asc */
static bool before(float sa, int a, float sb, int b) {
    bool na = isnan(sa), nb = isnan(sb);
    if (na != nb) return na;
    if (!na && sa != sb) return sa > sb;
    return a < b;
}

static void idx_row(idx_job *j, uint32_t *slot, int g, int t, int *tie) {
    const m3_indexer_params *ip = j->ip;
    const m3_profile *p = j->p;
    int B = ip->block, Di = ip->index_head_dim, K = ip->topk;
    int pp = j->pos[t], nb = pp / B + 1;
    float *S = (float *)(void *)slot;
    int32_t *ord = (int32_t *)(slot + (j->nbk > 0 ? j->nbk : 1));
    const float *q = j->iq + (size_t)t * j->ld_q + (size_t)g * Di;
    /* block max over the causally visible keys */
    for (int b = 0; b < nb; b++) {
        int hi = (b + 1) * B < pp + 1 ? (b + 1) * B : pp + 1;
        float m = -INFINITY;
        bool any_nan = false;
        for (int kk = b * B; kk < hi; kk++) {
            float z = m3_dot_f32(q, j->ik + (size_t)kk * Di, Di);
            if (p->index_scale != 1.0f) z *= p->index_scale;
            if (isnan(z)) any_nan = true;
            else if (z > m) m = z;
        }
        /* torch.max propagates NaN; atom maps NaN to -1e30 */
        if (any_nan) m = p->index_nan == M3_INDEX_NAN_NEG ? -1e30f : NAN;
        S[b] = m;
    }
    /* forced blocks: init first, then local (local wins on overlap) */
    if (p->index_init_blocks)
        for (int b = 0; b < ip->init_blocks && b < nb; b++) S[b] = p->init_boost;
    int lo = nb - ip->local_blocks > 0 ? nb - ip->local_blocks : 0;
    for (int b = lo; b < nb; b++) S[b] = p->local_boost;
    /* partial selection sort: only the first min(K+1, nb) ranks are needed */
    for (int b = 0; b < nb; b++) ord[b] = b;
    int need = K + 1 < nb ? K + 1 : nb;
    for (int r = 0; r < need; r++) {
        int best = r;
        for (int c = r + 1; c < nb; c++)
            if (before(S[ord[c]], ord[c], S[ord[best]], ord[best])) best = c;
        int32_t tmp = ord[r];
        ord[r] = ord[best];
        ord[best] = tmp;
    }
    int keep = K < nb ? K : nb;
    int32_t *out = j->topk + ((size_t)g * j->n_tok + t) * j->width;
    for (int r = 0; r < j->width; r++) out[r] = r < keep ? ord[r] : -1;
    float mg = INFINITY;
    if (nb > K) {
        float a = S[ord[K - 1]], b2 = S[ord[K]];
        mg = a - b2; /* NaN when both are forced (inf - inf): still a tie by a == b2 */
        *tie = (a == b2) || (mg <= p->topk_tie_margin);
    }
    if (j->margin) j->margin[(size_t)g * j->n_tok + t] = mg;
    if (j->scores) {
        float *so = j->scores + ((size_t)g * j->n_tok + t) * j->nbk;
        for (int b = 0; b < j->nbk; b++) so[b] = b < nb ? S[b] : -INFINITY;
    }
}

static void idx_slot(void *vctx, int64_t s) {
    idx_job *j = vctx;
    uint32_t *slot = j->scratch + (size_t)s * j->slot_w;
    int64_t rows = (int64_t)j->ip->n_index_head * j->n_tok;
    uint32_t n_tied = 0;
    for (int64_t r = s; r < rows; r += j->n_slots) {
        int tie = 0;
        idx_row(j, slot, (int)(r / j->n_tok), (int)(r % j->n_tok), &tie);
        n_tied += (uint32_t)tie;
    }
    slot[j->slot_w - 1] = n_tied;
}

void m3_indexer_topk(int32_t *topk, float *scores, float *margin, int *n_ties, const float *iq,
                     int ld_q, const float *ik, const int32_t *pos, int n_tok, int n_ctx,
                     const m3_indexer_params *ip, const m3_profile *p, void *scratch,
                     size_t scratch_bytes) {
    M3_ASSERT(ip && p && n_tok >= 0 && n_ctx > 0 && ip->n_index_head > 0);
    M3_ASSERT(ip->block > 0 && ip->topk > 0 && ip->local_blocks >= 0 && ip->init_blocks >= 0);
    M3_ASSERT(ld_q >= ip->n_index_head * ip->index_head_dim);
    M3_ASSERT(p->index_scale > 0.0f);
    for (int t = 0; t < n_tok; t++)
        M3_ASSERTF(pos[t] >= 0 && pos[t] < n_ctx, "pos[%d] = %d, n_ctx %d", t, (int)pos[t],
                   n_ctx);
    if (n_ties) *n_ties = 0;
    if (n_tok == 0) return;
    idx_job j = {.topk = topk, .scores = scores, .margin = margin, .iq = iq, .ik = ik,
                 .ld_q = ld_q, .pos = pos, .n_tok = n_tok, .n_ctx = n_ctx, .ip = ip, .p = p};
    j.width = m3_indexer_width(n_ctx, ip, p);
    j.nbk = (n_ctx + ip->block - 1) / ip->block;
    j.slot_w = slot_words(n_ctx, ip);
    size_t ns = scratch_bytes / (j.slot_w * 4);
    int64_t rows = (int64_t)ip->n_index_head * n_tok;
    M3_ASSERTF(scratch && ns >= 1, "indexer scratch %zu bytes < one slot", scratch_bytes);
    if ((int64_t)ns > rows) ns = (size_t)rows;
    j.n_slots = (int)ns;
    j.scratch = scratch;
    m3_parallel_for(j.n_slots, idx_slot, &j);
    if (n_ties)
        for (int sl = 0; sl < j.n_slots; sl++)
            *n_ties += (int)j.scratch[(size_t)sl * j.slot_w + j.slot_w - 1];
}
