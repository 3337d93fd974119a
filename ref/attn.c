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
 * n_ctx + 1 ranges) | partition store (m, l, o[Dh]) for attn_partition >= M3_ATTN_MIN_PART */
static size_t slot_floats_p(int n_ctx, int head_dim, int part) {
    size_t nb = (size_t)n_ctx + 1;
    size_t np = part > 0 ? ((size_t)n_ctx + (size_t)part - 1) / (size_t)part + 1 : 0;
    size_t f = (size_t)n_ctx + (size_t)head_dim + 2 * nb + np * ((size_t)head_dim + 2);
    return (f + 15) & ~(size_t)15;
}

size_t m3_attn_scratch_bytes(int n_ctx, const m3_attn_params *ap) {
    M3_ASSERT(n_ctx > 0 && ap);
    return (size_t)m3_threads() * slot_floats_p(n_ctx, ap->head_dim, M3_ATTN_MIN_PART) *
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

static void attn_row(const attn_job *j, float *slot, int t, int h) {
    const m3_attn_params *ap = j->ap;
    const m3_profile *p = j->p;
    int Dh = ap->head_dim, Hkv = ap->n_kv_head, g = h / (ap->n_head / Hkv);
    size_t kv_pitch = (size_t)Hkv * Dh;
    float *z = slot;                   /* [n_ctx] scores in accumulation order */
    float *o = z + j->n_ctx;           /* [Dh] */
    int32_t *rng = (int32_t *)(o + Dh); /* [2 * (n_ctx + 1)] */
    float *parts = (float *)(rng + 2 * ((size_t)j->n_ctx + 1));
    const float *qv = j->q + (size_t)t * j->ld_q + (size_t)h * Dh;
    float *out = j->out + (size_t)t * ap->n_head * Dh + (size_t)h * Dh;

    int nr = key_ranges(j, t, g, rng);
    /* 1. scores in accumulation order */
    int n = 0;
    for (int r = 0; r < nr; r++)
        for (int kk = rng[2 * r]; kk < rng[2 * r + 1]; kk++) {
            float d = m3_dot_f32(qv, j->k + (size_t)kk * kv_pitch + (size_t)g * Dh, Dh);
            if (p->attn_scores == M3_SCORES_BF16_EAGER)
                z[n++] = m3_round_bf16(m3_round_bf16(d) * ap->scale);
            else
                z[n++] = d * ap->scale;
        }
    int part = p->attn_partition > 0 ? p->attn_partition : n;
    int n_part = (n + part - 1) / part;
    M3_ASSERT(n > 0);
    /* 2. per partition: max, exp, denominator, P.V (one partition when not partitioned) */
    int i0 = 0, r = 0, kk = rng[0];
    for (int pi = 0; pi < n_part; pi++) {
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
        for (int i = i0; i < i1; i++) {
            while (kk >= rng[2 * r + 1]) kk = rng[2 * ++r];
            float pr;
            if (n_part > 1) /* partitioned: unnormalised P, normalised per partition below */
                pr = m3_prof_rnd(p->attn_p_bf16, z[i]);
            else
                pr = m3_prof_rnd(p->attn_p_bf16, z[i] / den);
            const float *vv = j->v + (size_t)kk * kv_pitch + (size_t)g * Dh;
            for (int d = 0; d < Dh; d++) o[d] += pr * vv[d];
            kk++;
        }
        if (n_part == 1) {
            for (int d = 0; d < Dh; d++) out[d] = m3_prof_rnd(p->attn_out_bf16, o[d]);
            return;
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
    int64_t rows = (int64_t)j->n_tok * j->ap->n_head;
    /* strided rows: causal rows get longer with t, so interleave them across slots */
    for (int64_t row = s; row < rows; row += j->n_slots)
        attn_row(j, slot, (int)(row / j->ap->n_head), (int)(row % j->ap->n_head));
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
    size_t ns = scratch_bytes / (j->slot_f * sizeof(float));
    M3_ASSERTF(scratch && ns >= 1, "attention scratch %zu bytes < one slot %zu", scratch_bytes,
               j->slot_f * sizeof(float));
    int64_t rows = (int64_t)j->n_tok * ap->n_head;
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
