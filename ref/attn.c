/* ref/attn.c: see attn.h. One (token, head) row at a time; a row never splits across
 * threads. The key set of a row is a list of key ranges [lo, hi) visited in order. */
#include "ref/attn.h"

#include <math.h>
#include <string.h>

#include "ref/linear.h" /* m3_dot_f32 */

void m3_attn_params_init(m3_attn_params *ap, int n_head, int n_kv_head, int head_dim) {
    M3_ASSERT(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0);
    ap->n_head = n_head;
    ap->n_kv_head = n_kv_head;
    ap->head_dim = head_dim;
    ap->scale = (float)(1.0 / sqrt((double)head_dim));
}

/* per-slot layout, in floats: z[n_ctx] | o[Dh] | key ranges (2 int32 per range, at most
 * n_ctx + 1 ranges) | key list (n_ctx int32) | partition store (m, l, o[Dh]) for
 * attn_partition >= M3_ATTN_MIN_PART; paged reads add K and V rows [n_ctx, Dh] each, their
 * scales [n_ctx] each, the quantized q [Dh], a P.V tile accumulator [Dh] and the page
 * table [width * Bs/P] */
static size_t slot_floats_p(int n_ctx, int head_dim, int part) {
    size_t nb = (size_t)n_ctx + 1;
    size_t np = part > 0 ? ((size_t)n_ctx + (size_t)part - 1) / (size_t)part + 1 : 0;
    size_t f = (size_t)n_ctx + (size_t)head_dim + 2 * nb + (size_t)n_ctx +
               np * ((size_t)head_dim + 2);
    return (f + 15) & ~(size_t)15;
}

static size_t paged_floats(int n_ctx, int head_dim, int table) {
    size_t f = 2 * (size_t)n_ctx * (size_t)head_dim + 2 * (size_t)n_ctx + 2 * (size_t)head_dim +
               (size_t)table;
    return (f + 15) & ~(size_t)15;
}

size_t m3_attn_scratch_bytes(int n_ctx, const m3_attn_params *ap) {
    M3_ASSERT(n_ctx > 0 && ap);
    return (size_t)m3_threads() * slot_floats_p(n_ctx, ap->head_dim, M3_ATTN_MIN_PART) *
           sizeof(float);
}

size_t m3_attn_paged_scratch_bytes(int n_ctx, int width, const m3_attn_params *ap,
                                   const m3_kv_geom *g) {
    M3_ASSERT(n_ctx > 0 && ap && g);
    int table = (width > 0 ? width : 1) * (g->block / g->page);
    return (size_t)m3_threads() *
           (slot_floats_p(n_ctx, ap->head_dim, M3_ATTN_MIN_PART) +
            paged_floats(n_ctx, ap->head_dim, table)) *
           sizeof(float);
}

typedef struct {
    float *out;
    const float *q, *k, *v;
    int ld_q;
    const int32_t *pos;
    int n_tok, n_ctx;
    const int32_t *topk; /* NULL: dense */
    int width, block;
    const m3_attn_params *ap;
    const m3_profile *p;
    const m3_attn_paged_src *pg; /* NULL: contiguous k, v */
    float *scratch;
    size_t slot_f;
    int n_slots;
} attn_job;

/* Build the key ranges of row (t, g): dense -> one range [0, p]; sparse -> selected full
 * blocks (position order or selection order) then the own block up to p. */
static int key_ranges(const attn_job *j, int t, int g, int32_t *rng) {
    int p = j->pos[t];
    if (!j->topk) {
        rng[0] = 0;
        rng[1] = p + 1;
        return 1;
    }
    int bp = p / j->block, n = 0;
    const int32_t *sel = j->topk + ((size_t)g * j->n_tok + t) * j->width;
    for (int i = 0; i < j->width; i++) {
        int b = sel[i];
        if (b < 0 || b >= bp) continue; /* -1 padding, own block (added last), invalid */
        bool dup = false;
        for (int r = 0; r < n && !dup; r++) dup = rng[2 * r] == b * j->block;
        if (dup) continue;
        rng[2 * n] = b * j->block;
        rng[2 * n + 1] = (b + 1) * j->block;
        n++;
    }
    if (j->p->attn_order == M3_ATTN_ORDER_POSITION) /* insertion sort by block start */
        for (int a = 1; a < n; a++)
            for (int c = a; c > 0 && rng[2 * c - 2] > rng[2 * c]; c--) {
                int32_t lo = rng[2 * c - 2], hi = rng[2 * c - 1];
                rng[2 * c - 2] = rng[2 * c];
                rng[2 * c - 1] = rng[2 * c + 1];
                rng[2 * c] = lo;
                rng[2 * c + 1] = hi;
            }
    rng[2 * n] = bp * j->block; /* own block, always, last */
    rng[2 * n + 1] = p + 1;
    return n + 1;
}

/* The K/V rows of one (token, head) row in accumulation order: row i of K is
 * kb + (keys ? keys[i] : i) * stride (same for V); ks/vs: per-key fp8 scales (NULL: none). */
typedef struct {
    int n;
    const float *kb, *vb;
    size_t stride;
    const int32_t *keys;
    const float *ks, *vs;
    int tile; /* fp8 P.V rescale tile (keys), §4.9 */
} key_rows;

static const float *krow(const key_rows *r, int i) {
    return r->kb + (size_t)(r->keys ? r->keys[i] : i) * r->stride;
}
static const float *vrow(const key_rows *r, int i) {
    return r->vb + (size_t)(r->keys ? r->keys[i] : i) * r->stride;
}

/* Paged gather (§4.1-§4.4): the keys of row (t, head h of kv group g) read through the
 * layer's view, in accumulation order. Dense: keys 0..p via slot(k). Sparse: the page table of
 * m3_kv_sparse_table, keys k < ctx. Values are the stored elements; fp8 elements keep their
 * scales apart when the §4.9 emulation folds them in, else they are dequantized here. */
static void gather_paged(const attn_job *j, float *pbuf, int t, int g, key_rows *r, float *q8) {
    const m3_attn_paged_src *pg = j->pg;
    const m3_kv_layer *kl = pg->kl;
    const m3_kv_geom *G = &kl->g;
    const int Dh = j->ap->head_dim, p = j->pos[t];
    float *kbuf = pbuf, *vbuf = kbuf + (size_t)j->n_ctx * Dh;
    float *ks = vbuf + (size_t)j->n_ctx * Dh, *vs = ks + j->n_ctx;
    int32_t *table = (int32_t *)(q8 + 2 * Dh);
    int n;
    if (j->topk) {
        const int32_t *sel = j->topk + ((size_t)g * j->n_tok + t) * j->width;
        m3_kv_sparse_table(table, &n, sel, j->width, p, pg->bt, G, g,
                           j->p->attn_order == M3_ATTN_ORDER_POSITION);
    } else {
        n = p + 1;
    }
    const bool fp8 = G->elem == M3_KV_FP8;
    for (int i = 0; i < n; i++) {
        int64_t s = j->topk ? m3_kv_table_slot(table, G, i) : m3_block_table_slot(pg->bt, G->block, i);
        float *kr = kbuf + (size_t)i * Dh, *vr = vbuf + (size_t)i * Dh;
        ks[i] = m3_kv_read_k(kl, s, g, kr);
        vs[i] = m3_kv_read_v(kl, s, g, vr);
        if (fp8 && !pg->fp8_pa) /* plain dequantization: value = fp32(byte) * scale */
            for (int d = 0; d < Dh; d++) {
                kr[d] *= ks[i];
                vr[d] *= vs[i];
            }
    }
    r->n = n;
    r->kb = kbuf;
    r->vb = vbuf;
    r->stride = (size_t)Dh;
    r->keys = NULL;
    r->ks = fp8 && pg->fp8_pa ? ks : NULL;
    r->vs = fp8 && pg->fp8_pa ? vs : NULL;
    r->tile = j->topk ? G->page : G->block;
}

/* One (token, head) row. Paged reads: *kg holds the gathered keys of (t, kv group of h);
 * gather them only when !gathered (the heads of one group share them). */
static void attn_row(const attn_job *j, float *slot, int t, int h, key_rows *kg, bool gathered) {
    const m3_attn_params *ap = j->ap;
    const m3_profile *p = j->p;
    int Dh = ap->head_dim, Hkv = ap->n_kv_head, g = h / (ap->n_head / Hkv);
    size_t kv_pitch = (size_t)Hkv * Dh;
    float *z = slot;                   /* [n_ctx] scores in accumulation order */
    float *o = z + j->n_ctx;           /* [Dh] */
    int32_t *rng = (int32_t *)(o + Dh); /* [2 * (n_ctx + 1)] */
    int32_t *keys = rng + 2 * ((size_t)j->n_ctx + 1); /* [n_ctx] */
    float *parts = (float *)(keys + j->n_ctx);
    const float *qv = j->q + (size_t)t * j->ld_q + (size_t)h * Dh;
    float *out = j->out + (size_t)t * ap->n_head * Dh + (size_t)h * Dh;

    key_rows kr;
    float *acc = NULL; /* fp8 P.V tile accumulator [Dh] */
    if (j->pg) {
        float *pbuf = slot + slot_floats_p(j->n_ctx, Dh, M3_ATTN_MIN_PART);
        float *q8 = pbuf + 2 * (size_t)j->n_ctx * Dh + 2 * (size_t)j->n_ctx;
        acc = q8 + Dh;
        if (!gathered) gather_paged(j, pbuf, t, g, kg, q8);
        kr = *kg;
        if (kr.ks) { /* §4.9 step 1: the fp8 kernel casts Q to fp8 with no scale */
            for (int d = 0; d < Dh; d++)
                q8[d] = m3_round_fp8(qv[d], j->pg->kl->g.fp8_kind, j->pg->ovf);
            qv = q8;
        }
    } else {
        int nr = key_ranges(j, t, g, rng), n = 0;
        for (int r = 0; r < nr; r++)
            for (int kk = rng[2 * r]; kk < rng[2 * r + 1]; kk++) keys[n++] = kk;
        kr = (key_rows){.n = n, .kb = j->k + (size_t)g * Dh, .vb = j->v + (size_t)g * Dh,
                        .stride = kv_pitch, .keys = keys};
    }
    const int n = kr.n;
    M3_ASSERT(n > 0);
    /* 1. scores in accumulation order */
    for (int i = 0; i < n; i++) {
        float d = m3_dot_f32(qv, krow(&kr, i), Dh);
        if (kr.ks) /* §4.9 step 2: s = f32(q.k) * softmax_scale * k_scale */
            z[i] = d * ap->scale * kr.ks[i];
        else if (p->attn_scores == M3_SCORES_BF16_EAGER)
            z[i] = m3_round_bf16(m3_round_bf16(d) * ap->scale);
        else
            z[i] = d * ap->scale;
    }
    int part = p->attn_partition > 0 ? p->attn_partition : n;
    int n_part = (n + part - 1) / part;
    const float fmax = kr.vs ? m3_fp8_max(j->pg->kl->g.fp8_kind) : 0.0f;
    /* 2. per partition: max, exp, denominator, P.V (one partition when not partitioned) */
    for (int pi = 0, i0 = 0; pi < n_part; pi++) {
        int i1 = i0 + part < n ? i0 + part : n;
        float m = -INFINITY;
        for (int i = i0; i < i1; i++)
            if (z[i] > m) m = z[i];
        float den = 0.0f;
        for (int i = i0; i < i1; i++) {
            z[i] = expf(z[i] - m);
            den += z[i];
        }
        memset(o, 0, sizeof(float) * (size_t)Dh);
        if (kr.vs) {
            /* §4.9 step 4, fp8 cache: per tile of keys M = max v_scale, P' = fp8(P * v_scale *
             * FP8_MAX / (M + 1e-8)), acc += (P' . V_fp8) * (M / FP8_MAX); P unnormalised, the
             * partition output divided by the unrounded denominator */
            for (int a = i0; a < i1; a += kr.tile) {
                int b = a + kr.tile < i1 ? a + kr.tile : i1;
                float M = 0.0f;
                for (int i = a; i < b; i++)
                    if (kr.vs[i] > M) M = kr.vs[i];
                memset(acc, 0, sizeof(float) * (size_t)Dh);
                for (int i = a; i < b; i++) {
                    float pp = m3_round_fp8(z[i] * kr.vs[i] * fmax / (M + 1e-8f),
                                            j->pg->kl->g.fp8_kind, j->pg->ovf);
                    const float *vv = vrow(&kr, i);
                    for (int d = 0; d < Dh; d++) acc[d] += pp * vv[d];
                }
                float back = M / fmax;
                for (int d = 0; d < Dh; d++) o[d] += acc[d] * back;
            }
            if (n_part == 1) {
                for (int d = 0; d < Dh; d++) out[d] = m3_prof_rnd(p->attn_out_bf16, o[d] / den);
                return;
            }
        } else {
            for (int i = i0; i < i1; i++) {
                float pr;
                if (n_part > 1) /* partitioned: unnormalised P, normalised per partition below */
                    pr = m3_prof_rnd(p->attn_p_bf16, z[i]);
                else
                    pr = m3_prof_rnd(p->attn_p_bf16, z[i] / den);
                const float *vv = vrow(&kr, i);
                for (int d = 0; d < Dh; d++) o[d] += pr * vv[d];
            }
            if (n_part == 1) {
                for (int d = 0; d < Dh; d++) out[d] = m3_prof_rnd(p->attn_out_bf16, o[d]);
                return;
            }
        }
        float *po = parts + (size_t)pi * (Dh + 2);
        po[0] = m;
        po[1] = den;
        for (int d = 0; d < Dh; d++) po[2 + d] = m3_prof_rnd(p->attn_out_bf16, o[d] / den);
        i0 = i1;
    }
    /* 3. merge the partitions with fp32 log-sum-exp weights, in partition order */
    float M = -INFINITY;
    for (int pi = 0; pi < n_part; pi++)
        if (parts[(size_t)pi * (Dh + 2)] > M) M = parts[(size_t)pi * (Dh + 2)];
    float wsum = 0.0f;
    memset(o, 0, sizeof(float) * (size_t)Dh);
    for (int pi = 0; pi < n_part; pi++) {
        const float *po = parts + (size_t)pi * (Dh + 2);
        float w = po[1] * expf(po[0] - M);
        wsum += w;
        for (int d = 0; d < Dh; d++) o[d] += w * po[2 + d];
    }
    for (int d = 0; d < Dh; d++) out[d] = m3_prof_rnd(p->attn_out_bf16, o[d] / wsum);
}

static void attn_slot(void *vctx, int64_t s) {
    const attn_job *j = vctx;
    float *slot = j->scratch + (size_t)s * j->slot_f;
    key_rows kg;
    if (j->pg) {
        /* paged: units of (token, kv group); the group's heads reuse one gather of its keys */
        const int Hkv = j->ap->n_kv_head, grp = j->ap->n_head / Hkv;
        int64_t units = (int64_t)j->n_tok * Hkv;
        for (int64_t u = s; u < units; u += j->n_slots)
            for (int i = 0; i < grp; i++)
                attn_row(j, slot, (int)(u / Hkv), (int)(u % Hkv) * grp + i, &kg, i > 0);
        return;
    }
    int64_t rows = (int64_t)j->n_tok * j->ap->n_head;
    /* strided rows: causal rows get longer with t, so interleave them across slots */
    for (int64_t row = s; row < rows; row += j->n_slots)
        attn_row(j, slot, (int)(row / j->ap->n_head), (int)(row % j->ap->n_head), &kg, false);
}

static void attn_run(attn_job *j, void *scratch, size_t scratch_bytes) {
    const m3_attn_params *ap = j->ap;
    M3_ASSERT(ap && j->p && j->n_tok >= 0 && j->n_ctx > 0);
    M3_ASSERT(ap->n_head % ap->n_kv_head == 0);
    M3_ASSERT(j->ld_q >= ap->n_head * ap->head_dim);
    for (int t = 0; t < j->n_tok; t++)
        M3_ASSERTF(j->pos[t] >= 0 && j->pos[t] < j->n_ctx, "pos[%d] = %d, n_ctx %d", t,
                   (int)j->pos[t], j->n_ctx);
    if (j->n_tok == 0) return;
    M3_ASSERTF(j->p->attn_partition == 0 || j->p->attn_partition >= M3_ATTN_MIN_PART,
               "attn_partition %d < %d", j->p->attn_partition, M3_ATTN_MIN_PART);
    j->slot_f = slot_floats_p(j->n_ctx, ap->head_dim,
                              j->p->attn_partition > 0 ? j->p->attn_partition : 0);
    if (j->pg) {
        const m3_kv_geom *g = &j->pg->kl->g;
        M3_ASSERT(g->head_dim == ap->head_dim && g->n_kv == ap->n_kv_head);
        /* the paged part starts at the fixed offset slot_floats_p(.., MIN_PART) */
        j->slot_f = slot_floats_p(j->n_ctx, ap->head_dim, M3_ATTN_MIN_PART) +
                    paged_floats(j->n_ctx, ap->head_dim,
                                 (j->width > 0 ? j->width : 1) * (g->block / g->page));
    }
    size_t ns = scratch_bytes / (j->slot_f * sizeof(float));
    M3_ASSERTF(scratch && ns >= 1, "attention scratch %zu bytes < one slot %zu", scratch_bytes,
               j->slot_f * sizeof(float));
    int64_t rows = (int64_t)j->n_tok * (j->pg ? ap->n_kv_head : ap->n_head);
    if ((int64_t)ns > rows) ns = (size_t)rows;
    j->n_slots = (int)ns;
    j->scratch = scratch;
    m3_parallel_for(j->n_slots, attn_slot, j);
}

void m3_attn_dense(float *out, const float *q, int ld_q, const float *k, const float *v,
                   const int32_t *pos, int n_tok, int n_ctx, const m3_attn_params *ap,
                   const m3_profile *p, void *scratch, size_t scratch_bytes) {
    attn_job j = {.out = out, .q = q, .k = k, .v = v, .ld_q = ld_q, .pos = pos, .n_tok = n_tok,
                  .n_ctx = n_ctx, .topk = NULL, .ap = ap, .p = p};
    attn_run(&j, scratch, scratch_bytes);
}

void m3_attn_sparse(float *out, const float *q, int ld_q, const float *k, const float *v,
                    const int32_t *pos, int n_tok, int n_ctx, const int32_t *topk, int width,
                    int block, const m3_attn_params *ap, const m3_profile *p, void *scratch,
                    size_t scratch_bytes) {
    M3_ASSERT(topk && width >= 0 && block > 0);
    attn_job j = {.out = out, .q = q, .k = k, .v = v, .ld_q = ld_q, .pos = pos, .n_tok = n_tok,
                  .n_ctx = n_ctx, .topk = topk, .width = width, .block = block, .ap = ap,
                  .p = p};
    attn_run(&j, scratch, scratch_bytes);
}

void m3_attn_paged(float *out, const float *q, int ld_q, const m3_attn_paged_src *src,
                   const int32_t *pos, int n_tok, int n_ctx, const int32_t *topk, int width,
                   const m3_attn_params *ap, const m3_profile *p, void *scratch,
                   size_t scratch_bytes) {
    M3_ASSERT(src && src->kl && src->bt && (!topk || width > 0));
    attn_job j = {.out = out, .q = q, .ld_q = ld_q, .pos = pos, .n_tok = n_tok, .n_ctx = n_ctx,
                  .topk = topk, .width = width, .block = src->kl->g.block, .ap = ap, .p = p,
                  .pg = src};
    attn_run(&j, scratch, scratch_bytes);
}
