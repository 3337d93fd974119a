/* tests/gpu_attn_paged.c: m3_gpu_attn_paged (gpu/attn.hip) against ref's m3_attn_paged on
 * random paged caches that ref's own writer filled (m3_kv_write: the device reads ref's bytes
 * and scales through a shuffled block table, so addressing, views, padding and the block
 * table are checked along with the math). Dense (page-Bs view) and sparse (page-P re-view,
 * selections with -1 padding, future ids, duplicates, the own block present or absent) reads;
 * fp32, bf16 and fp8 (e4m3fn, FP8_MAX 240 and 448) elements, fp8 dequantized or through the
 * §4.9 emulation (fp8_pa: fp8 Q, K scale in the score, P' per tile); profiles fp32, hf,
 * atom (partitions of 256 keys, selection order). Shapes: M3 (H 64, Hkv 4, Dh 128, Bs 128,
 * P 16: decode over 8 partitions, a prefill chunk, sparse width 16), the tiny fixtures'
 * geometry (Dh 12: padded SHUFFLE rows, Bs 8, P 1) and an odd one (H 8, Hkv 2, Dh 80, Bs 64,
 * P 16). Bounds: GPU_NMSE_F32 for fp32 outputs of the fp32 profile, GPU_NMSE_BF16 for bf16
 * outputs (tests/gpu_test.h), and at least PG_MIN_EXACT of the outputs bit-identical to
 * ref's: the kernel reproduces ref's operation order, so only an exp that differs from glibc's
 * expf in its last bit moves an output (H200, 2026-11-29: 1980305 of 1980400 outputs over the
 * 175 case outputs identical, the worst case 99.78 %, worst NMSE 5.0e-18; a wrong tile,
 * partition, order or scale moves nearly every output of its rows). Outputs are guarded and
 * poisoned.
 * The fast kernel m3_gpu_attn_paged_flash (bf16 outputs: hf and atom; bf16 and fp8
 * elements) is checked against the same ref outputs with PF_NMSE / PF_NMSE_PA (below), on
 * guarded, poisoned outputs, and a second run into a fresh buffer must match the first bit
 * for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/attn.h"
#include "ref/kvcache.h"
#include "tests/gpu_test.h"

typedef struct {
    int T, n_ctx, H, Hkv, Dh, Bs, P;
    int width; /* 0: dense */
} pg_shape;

/* A decode batch (paged_batch_matches_ref): when set, each token of a case is its own
 * sequence (its own block table in one pool, src.bt_ld; positions up to n_ctx - 1); else the
 * T tokens are consecutive rows of one sequence */
static bool g_seqs;

typedef struct {
    m3_kv_elem elem;
    bool pa;      /* fp8_pa */
    float fmax;   /* writer's FP8_MAX */
} pg_store;

static void profile_of(m3_profile *p, int which) {
    if (which == 0) m3_profile_fp32(p);
    else if (which == 1) m3_profile_hf(p);
    else m3_profile_atom(p);
}

#define PG_MIN_EXACT 0.99
/* Flash bounds. bf16 elements and fp8 dequantized on read: the rounding points of the flash
 * kernels (GPU_NMSE_FLASH's reasoning: independent bf16 roundings of P, unnormalised, and of
 * the output; fp8: the V scale folded into that P). PF_NMSE_PA, the §4.9 emulation under a
 * partitioned profile: P' codes and partitions as ref, plus one bf16 rounding of
 * P' M / FP8_MAX (<= 2^-9 relative); an fp8 code that flips because the tensor-core score
 * differs from ref's in its last bits moves one term by 2^-4 relative. Unpartitioned
 * (hf + fp8_pa, which no model path runs): P' is rounded against the chunk's max instead of
 * the row's, independent fp8 roundings of every term: PF_NMSE_PA_FREE. */
#define PF_NMSE GPU_NMSE_FLASH
#define PF_NMSE_PA GPU_NMSE_FLASH
#define PF_NMSE_PA_FREE 1e-3

static int count_exact(const float *a, const float *b, int64_t n) {
    int k = 0;
    for (int64_t i = 0; i < n; i++) k += memcmp(&a[i], &b[i], sizeof(float)) == 0;
    return k;
}

/* A second context on the same device (paged_flash_two_contexts): when set, each flash case
 * also launches on both contexts' streams back to back, with no wait between, and both
 * outputs must equal the first run's bits. The fused merge counts block arrivals in counters
 * that are the context's own (m3_gpu.counters): with shared counters two overlapping launches
 * would count each other's blocks. */
static m3_gpu *g_two;

/* The cache write right before the call (paged_flash_after_write): when set, each decode-kernel
 * case (one token) also runs as the model's step does, a kernel writing the token's own K / V
 * slot (here: a copy of its physical block whose other keys hold the same bytes) launched just
 * before the call, which the decode kernels overlap (programmatic dependent launches: their
 * prologue starts before the launch before them has ended, m3_gpu.h); the position's slot held
 * other values before, and an earlier call read them. The output must equal the plain run's
 * bits. */
static bool g_after;

/* The launch before writes at the call's positions (paged_flash_after_cache_write): when set
 * (T = 1), the device cache holds other K/V at the token's position, and the flash call runs
 * right after m3_gpu_qk_norm_rope_cache writes the token's own K/V there (no wait between:
 * the cluster kernel is a programmatic dependent of that launch and reads the block table
 * before its grid wait, K/V, q, pos and the selection after it). */
static bool g_chain;

static void pg_case(m3_gpu *g, const pg_shape *s, const pg_store *st, int prof, bool flash) {
    m3_profile p;
    profile_of(&p, prof);
    m3_attn_params ap;
    m3_attn_params_init(&ap, s->H, s->Hkv, s->Dh);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 900 + (uint64_t)s->T * 31 + (uint64_t)s->n_ctx * 7 +
                                         (uint64_t)st->elem * 3 + (uint64_t)st->pa + prof);
    const int T = s->T, C = s->n_ctx, KW = s->Hkv * s->Dh, ldq = s->H * s->Dh + 8;
    const bool sparse = s->width > 0;
    /* the layer: ref's geometry and writer, blocks mapped through a shuffled table */
    m3_kv_geom geo;
    m3_kv_geom_init(&geo, s->Hkv, s->Dh, s->Bs, s->P, st->elem, M3_FP8_E4M3FN);
    m3_kv_layer kl;
    m3_kv_layer_init(&kl, &geo, sparse ? M3_KV_VIEW_PAGE : M3_KV_VIEW_BLOCK, 0, M3_KV_BF16);
    /* S sequences' tables: consecutive runs of one shuffled pool (a decode batch: the tables
     * interleave over the pool) */
    const int S = g_seqs ? T : 1;
    const int nl = (C + s->Bs - 1) / s->Bs, pool = S * nl + 3;
    int32_t *ids = malloc((size_t)pool * sizeof *ids);
    for (int i = 0; i < pool; i++) ids[i] = i;
    for (int i = pool - 1; i > 0; i--) {
        int j = (int)(m3_rng_u32(&r) % (uint32_t)(i + 1));
        int32_t x = ids[i];
        ids[i] = ids[j], ids[j] = x;
    }
    m3_block_table *bts = calloc((size_t)S, sizeof *bts);
    for (int b = 0; b < S; b++) GPU_OK(m3_block_table_set(&bts[b], ids + (size_t)b * nl, nl, pool));
    GPU_OK(m3_kv_layer_reserve(&kl, pool));
    float *kr = malloc((size_t)KW * sizeof *kr), *vr = malloc((size_t)KW * sizeof *vr);
    float *kw = g_chain ? malloc((size_t)KW * 2 * sizeof *kw) : NULL; /* the token's own K, V */
    m3_kv_writer wr = {.fp8_max = st->fmax, .ovf = M3_FP8_SATURATE};
    for (int jj = 0; jj < S * C; jj++) {
        const int j = jj % C, sq = jj / C;
        m3_fill_normal(&r, kr, KW, 1.0f);
        m3_fill_normal(&r, vr, KW, 1.0f);
        /* per-(token, head) magnitudes that differ, so the scales (and the §4.9 tile max)
         * vary */
        for (int h = 0; h < s->Hkv; h++) {
            float a = 0.25f + (float)(m3_rng_u32(&r) % 8u), b = 0.25f + (float)(m3_rng_u32(&r) % 8u);
            for (int d = 0; d < s->Dh; d++) kr[h * s->Dh + d] *= a, vr[h * s->Dh + d] *= b;
        }
        if (p.act_bf16)
            for (int i = 0; i < KW; i++) kr[i] = m3_round_bf16(kr[i]), vr[i] = m3_round_bf16(vr[i]);
        m3_kv_write(&kl, m3_block_table_slot(&bts[sq], s->Bs, j), kr, kr, vr, &wr);
        if (kw && j == C - 1) memcpy(kw, kr, (size_t)KW * sizeof *kw), memcpy(kw + KW, vr, (size_t)KW * sizeof *kw);
    }
    /* g_after: the block of position C - 1 (T = 1) as written (real) and with other values at
     * that position (stale): K, V, and fp8 K / V scales */
    const size_t ebh = (size_t)geo.elem_bytes, blk[4] = {(size_t)geo.k_block * ebh,
                                                         (size_t)geo.v_stride * ebh,
                                                         (size_t)s->Hkv * s->Bs * sizeof(float),
                                                         (size_t)s->Hkv * s->Bs * sizeof(float)};
    const int nparts = st->elem == M3_KV_FP8 ? 4 : 2;
    unsigned char *blk_real[4] = {NULL, NULL, NULL, NULL}, *blk_stale[4] = {NULL, NULL, NULL, NULL};
    const int32_t ph_after = g_after ? bts[0].phys[(C - 1) / s->Bs] : 0;
    if (g_after) {
        M3_ASSERT(T == 1 && S == 1);
        const size_t so = (size_t)ph_after * s->Hkv * s->Bs;
        unsigned char *part[4] = {kl.k + ph_after * blk[0], kl.v + ph_after * blk[1],
                                  nparts > 2 ? (unsigned char *)(kl.k_scale + so) : NULL,
                                  nparts > 2 ? (unsigned char *)(kl.v_scale + so) : NULL};
        for (int i = 0; i < nparts; i++) blk_real[i] = malloc(blk[i]), memcpy(blk_real[i], part[i], blk[i]);
        m3_fill_normal(&r, kr, KW, 3.0f);
        m3_fill_normal(&r, vr, KW, 3.0f);
        if (p.act_bf16)
            for (int i = 0; i < KW; i++) kr[i] = m3_round_bf16(kr[i]), vr[i] = m3_round_bf16(vr[i]);
        m3_kv_write(&kl, m3_block_table_slot(&bts[0], s->Bs, C - 1), kr, kr, vr, &wr);
        for (int i = 0; i < nparts; i++) {
            blk_stale[i] = malloc(blk[i]);
            memcpy(blk_stale[i], part[i], blk[i]);
            memcpy(part[i], blk_real[i], blk[i]); /* the cache as written again */
        }
    }
    const int64_t nq = (int64_t)T * ldq, no = (int64_t)T * s->H * s->Dh;
    float *q = malloc(nq * sizeof *q), *ref = malloc(no * sizeof *ref), *got = malloc(no * sizeof *got);
    int32_t *pos = malloc(T * sizeof *pos);
    m3_fill_normal(&r, q, nq, 1.0f);
    if (p.attn_out_bf16)
        for (int64_t i = 0; i < nq; i++) q[i] = m3_round_bf16(q[i]);
    for (int t = 0; t < T; t++) pos[t] = C - T + t;
    if (S > 1) /* sequences of different lengths, from C (the first) down to ~C / 2 */
        for (int t = 0; t < T; t++) pos[t] = C - 1 - (int)((int64_t)t * (C / 2) / T);
    int32_t *topk = NULL;
    if (sparse) {
        topk = malloc((size_t)s->Hkv * T * s->width * sizeof *topk);
        for (int gq = 0; gq < s->Hkv; gq++)
            for (int t = 0; t < T; t++) {
                int32_t *row = topk + ((size_t)gq * T + t) * s->width;
                const int bp = pos[t] / s->Bs;
                for (int i = 0; i < s->width; i++) row[i] = (int32_t)(m3_rng_u32(&r) % (uint32_t)(bp + 1));
                row[s->width - 1] = -1;                        /* padding */
                if (s->width > 3) row[s->width - 2] = row[0];  /* a duplicate (kept, as ref) */
                if (s->width > 4) row[s->width - 3] = bp + 1;  /* a future block: dropped */
                if (s->width > 5 && (t + gq) % 2) /* own block absent: ctx truncation rule */
                    for (int i = 0; i < s->width; i++)
                        if (row[i] == bp) row[i] = bp > 0 ? bp - 1 : -1;
                if (row[0] < 0) row[0] = bp;
            }
    }
    /* §4.9's fp8(q): SATURATE, and at FP8_MAX 240 the NaN-on-overflow cast (ref's rounding in
     * pd8_part_k, whose SATURATE cast is the hardware's; q never overflows here) */
    const m3_fp8_overflow qovf = st->pa && st->fmax < 300.0f ? M3_FP8_OVF_NAN : M3_FP8_SATURATE;
    m3_attn_paged_src src = {.kl = &kl, .bt = &bts[0], .fp8_pa = st->pa, .ovf = qovf};
    size_t sb = m3_attn_paged_scratch_bytes(C, s->width, &ap, &geo);
    void *scratch = malloc(sb);
    if (S == 1) {
        m3_attn_paged(ref, q, ldq, &src, pos, T, C, topk, s->width, &ap, &p, scratch, sb);
    } else { /* ref: one call per sequence, its token's selection rows [Hkv, 1, width] */
        int32_t *tk1 = topk ? malloc((size_t)s->Hkv * s->width * sizeof *tk1) : NULL;
        for (int t = 0; t < T; t++) {
            for (int gq = 0; tk1 && gq < s->Hkv; gq++)
                memcpy(tk1 + (size_t)gq * s->width, topk + ((size_t)gq * T + t) * s->width,
                       (size_t)s->width * sizeof *tk1);
            src.bt = &bts[t];
            m3_attn_paged(ref + (size_t)t * s->H * s->Dh, q + (size_t)t * ldq, ldq, &src,
                          pos + t, 1, C, tk1, s->width, &ap, &p, scratch, sb);
        }
        free(tk1);
    }
    free(scratch);
    if (kw) { /* the device cache gets other K/V at the token's position (T = 1: C - 1) */
        for (int i = 0; i < KW; i++) kr[i] = m3_round_bf16(-2.0f * kw[i] + 0.5f), vr[i] = m3_round_bf16(3.0f * kw[KW + i] - 1.0f);
        m3_kv_write(&kl, m3_block_table_slot(&bts[0], s->Bs, C - 1), kr, kr, vr, &wr);
    }

    /* the device copy of the layer and the block table */
    const size_t eb = (size_t)geo.elem_bytes, kb = (size_t)pool * geo.k_block * eb,
                 vb = (size_t)pool * geo.v_stride * eb, sc = (size_t)pool * s->Hkv * s->Bs;
    m3_gpu_attn_paged_src ds;
    memset(&ds, 0, sizeof ds);
    ds.g = geo;
    ds.view = kl.view;
    void *dk, *dv, *dbt, *dpos, *dtopk = NULL;
    GPU_OK(m3_gpu_alloc(g, &dk, kb));
    GPU_OK(m3_gpu_upload(g, dk, kl.k, kb));
    GPU_OK(m3_gpu_alloc(g, &dv, vb));
    GPU_OK(m3_gpu_upload(g, dv, kl.v, vb));
    ds.k = dk, ds.v = dv;
    if (st->elem == M3_KV_FP8) {
        ds.k_scale = gpu_upload_f32(g, kl.k_scale, (int64_t)sc);
        ds.v_scale = gpu_upload_f32(g, kl.v_scale, (int64_t)sc);
    }
    GPU_OK(m3_gpu_alloc(g, &dbt, (size_t)S * nl * sizeof(int32_t)));
    for (int b = 0; b < S; b++)
        GPU_OK(m3_gpu_upload(g, (int32_t *)dbt + (size_t)b * nl, bts[b].phys,
                             (size_t)nl * sizeof(int32_t)));
    ds.bt = dbt;
    ds.n_logical = nl;
    ds.bt_ld = S > 1 ? nl : 0;
    ds.fp8_pa = st->pa;
    ds.ovf = qovf;
    GPU_OK(m3_gpu_alloc(g, &dpos, T * sizeof *pos));
    GPU_OK(m3_gpu_upload(g, dpos, pos, T * sizeof *pos));
    if (topk) {
        size_t tb = (size_t)s->Hkv * T * s->width * sizeof *topk;
        GPU_OK(m3_gpu_alloc(g, &dtopk, tb));
        GPU_OK(m3_gpu_upload(g, dtopk, topk, tb));
    }
    static const char *en[] = {"f32", "bf16", "fp8"};
    char what[200], name[240];
    snprintf(what, sizeof what,
             "paged_%s %s%s%s/%g %s T=%d%s C=%d H=%d Hkv=%d Dh=%d Bs=%d P=%d W=%d",
             sparse ? "sparse" : "dense", en[st->elem], st->pa ? "+pa" : "",
             qovf == M3_FP8_OVF_NAN ? " ovf-nan" : "",
             st->elem == M3_KV_FP8 ? (double)st->fmax : 0.0, p.name, T, S > 1 ? " seqs" : "", C,
             s->H, s->Hkv, s->Dh, s->Bs, geo.page, s->width);
    if (flash && kw) { /* the token's K/V written by the launch just before each flash call */
        m3_bf16 *dq = gpu_upload_bf16(g, q, nq, NULL);
        m3_bf16 *dkr = gpu_upload_bf16(g, kw, KW, NULL), *dvr = gpu_upload_bf16(g, kw + KW, KW, NULL);
        m3_gpu_qkv x;
        memset(&x, 0, sizeof x);
        x.k = dkr, x.v = dvr, x.ld_k = KW, x.ld_v = KW;
        x.n_head = s->H, x.n_kv_head = s->Hkv, x.head_dim = s->Dh;
        m3_gpu_kv_cache kc;
        memset(&kc, 0, sizeof kc);
        kc.fp8_max = st->fmax, kc.ovf = M3_FP8_SATURATE, kc.paged = &ds;
        float *got2 = malloc(no * sizeof *got2);
        for (int ik = 0; ik < 2; ik++) { /* the launcher's choice, then pc_k forced */
            ds.flash_kernel = ik ? 3 : 0;
            for (int run = 0; run < 2; run++) {
                m3_bf16 *dout = gpu_guard_alloc(g, no * sizeof(m3_bf16));
                GPU_OK(m3_gpu_qk_norm_rope_cache(g, &x, &kc, NULL, (const int32_t *)dpos, T, 1e-6f, s->Dh,
                                                 10000.0f, &p));
                GPU_OK(m3_gpu_attn_paged_flash(g, dout, dq, ldq, &ds, dpos, T, C, dtopk, s->width, &ap, &p));
                gpu_download_bf16(g, run ? got2 : got, dout, no);
                gpu_guard_check(g, dout, no * sizeof(m3_bf16), "paged flash attention out (after a cache write)");
                /* the next run's write must land on other K/V again */
                if (!run) {
                    GPU_OK(m3_gpu_upload(g, dk, kl.k, kb));
                    GPU_OK(m3_gpu_upload(g, dv, kl.v, vb));
                    if (st->elem == M3_KV_FP8) {
                        GPU_OK(m3_gpu_upload(g, (void *)ds.k_scale, kl.k_scale, sc * sizeof(float)));
                        GPU_OK(m3_gpu_upload(g, (void *)ds.v_scale, kl.v_scale, sc * sizeof(float)));
                    }
                }
            }
            snprintf(name, sizeof name, "%s flash after a cache write k%d", what, ds.flash_kernel);
            gpu_expect_nmse(ref, got, no, !st->pa ? PF_NMSE : PF_NMSE_PA, name);
            if (memcmp(got, got2, no * sizeof *got)) m3_test_failf("%s: two runs differ (race?)", name);
            GPU_OK(m3_gpu_upload(g, dk, kl.k, kb));
            GPU_OK(m3_gpu_upload(g, dv, kl.v, vb));
            if (st->elem == M3_KV_FP8) {
                GPU_OK(m3_gpu_upload(g, (void *)ds.k_scale, kl.k_scale, sc * sizeof(float)));
                GPU_OK(m3_gpu_upload(g, (void *)ds.v_scale, kl.v_scale, sc * sizeof(float)));
            }
        }
        ds.flash_kernel = 0;
        free(got2);
    } else
    if (flash) { /* the fast kernel */
        m3_bf16 *dq = gpu_upload_bf16(g, q, nq, NULL);
        const double bound = !st->pa ? PF_NMSE : p.attn_partition > 0 ? PF_NMSE_PA : PF_NMSE_PA_FREE;
        float *got2 = malloc(no * sizeof *got2);
        /* chunks per block: chosen by the launcher (1 for these small grids), 2 (blocks merge
         * consecutive chunks in registers, then a partial each), 1 << 20 (a block per row:
         * its output straight from registers) */
        static const int cpbs[] = {0, 2, 1 << 20};
        /* the general kernel, then the decode kernel (flash_kernel 2: pd_part_k, §4.9
         * pd8_part_k; geometries they do not take fall back to the general one), then the
         * cluster kernel (flash_kernel 3: pc_k for any row count; it has no cpb setting) */
        for (int ik = 0; ik < 7; ik++) {
            const int ic = ik < 6 ? ik % 3 : 0;
            if (g_after && ik / 3 != 1) continue; /* the decode kernels only */
            ds.flash_kernel = 1 + ik / 3;
            ds.flash_cpb = cpbs[ic];
            for (int run = 0; run < 2; run++) {
                m3_bf16 *dout = gpu_guard_alloc(g, no * sizeof(m3_bf16));
                GPU_OK(m3_gpu_attn_paged_flash(g, dout, dq, ldq, &ds, dpos, T, C, dtopk, s->width,
                                               &ap, &p));
                gpu_download_bf16(g, run ? got2 : got, dout, no);
                gpu_guard_check(g, dout, no * sizeof(m3_bf16), "paged flash attention out");
            }
            snprintf(name, sizeof name, "%s flash k%d cpb %d", what, ds.flash_kernel, cpbs[ic]);
            gpu_expect_nmse(ref, got, no, bound, name);
            if (memcmp(got, got2, no * sizeof *got))
                m3_test_failf("%s: two runs differ (race?)", name);
            if (ds.flash_kernel == 2) { /* flash_kernel 4: the decode kernel with pf_merge_k for
                                         * rows of many partials (the launcher merges them in
                                         * the kernel, pd_split_merge): the same bits */
                ds.flash_kernel = 4;
                m3_bf16 *dout = gpu_guard_alloc(g, no * sizeof(m3_bf16));
                GPU_OK(m3_gpu_attn_paged_flash(g, dout, dq, ldq, &ds, dpos, T, C, dtopk, s->width,
                                               &ap, &p));
                gpu_download_bf16(g, got2, dout, no);
                gpu_guard_check(g, dout, no * sizeof(m3_bf16), "paged flash attention out (k4)");
                if (memcmp(got, got2, no * sizeof *got))
                    m3_test_failf("%s: pf_merge_k's merge (k4) differs", name);
                ds.flash_kernel = 2;
            }
            if (g_after) { /* the write of the position's slot right before the call */
                void *dpart[4] = {(unsigned char *)dk + ph_after * blk[0], (unsigned char *)dv + ph_after * blk[1],
                                  nparts > 2 ? (void *)(ds.k_scale + (size_t)ph_after * s->Hkv * s->Bs) : NULL,
                                  nparts > 2 ? (void *)(ds.v_scale + (size_t)ph_after * s->Hkv * s->Bs) : NULL};
                void *dreal[4], *dstale[4];
                for (int i = 0; i < nparts; i++) {
                    GPU_OK(m3_gpu_alloc(g, &dreal[i], blk[i]));
                    GPU_OK(m3_gpu_upload(g, dreal[i], blk_real[i], blk[i]));
                    GPU_OK(m3_gpu_alloc(g, &dstale[i], blk[i]));
                    GPU_OK(m3_gpu_upload(g, dstale[i], blk_stale[i], blk[i]));
                }
                /* a 128 MB copy ahead keeps the device busy while the host queues the earlier
                 * call, the write and the call, so that they meet on the device */
                const size_t big = (size_t)128 << 20;
                void *ba, *bb;
                GPU_OK(m3_gpu_alloc(g, &ba, big));
                GPU_OK(m3_gpu_alloc(g, &bb, big));
                for (int it = 0; it < 2 * nparts; it++) {
                    for (int i = 0; i < nparts; i++) GPU_OK(m3_gpu_copy(g, dpart[i], dstale[i], blk[i]));
                    GPU_OK(m3_gpu_copy_kernel(g, bb, ba, big, 0));
                    m3_bf16 *d0 = gpu_guard_alloc(g, no * sizeof(m3_bf16));
                    m3_bf16 *d1 = gpu_guard_alloc(g, no * sizeof(m3_bf16));
                    GPU_OK(m3_gpu_attn_paged_flash(g, d0, dq, ldq, &ds, dpos, T, C, dtopk, s->width,
                                                   &ap, &p)); /* reads the stale slot */
                    /* the parts written, part it % nparts last (the launch just before) */
                    for (int j = 1; j <= nparts; j++) {
                        const int i = (it + j) % nparts;
                        GPU_OK(m3_gpu_copy_kernel(g, dpart[i], dreal[i], blk[i], 0));
                    }
                    GPU_OK(m3_gpu_attn_paged_flash(g, d1, dq, ldq, &ds, dpos, T, C, dtopk, s->width,
                                                   &ap, &p));
                    gpu_download_bf16(g, got2, d1, no);
                    gpu_guard_check(g, d1, no * sizeof(m3_bf16), "paged flash out (after a write)");
                    if (memcmp(got, got2, no * sizeof *got))
                        m3_test_failf("%s: the call right after the slot's write (part %d last) "
                                      "differs from the plain run", name, it % nparts);
                }
            }
            if (g_two && ic == 0) { /* the same launch on two contexts at once */
                m3_bf16 *da = gpu_guard_alloc(g, no * sizeof(m3_bf16));
                void *db;
                GPU_OK(m3_gpu_alloc(g_two, &db, no * sizeof(m3_bf16)));
                for (int rep = 0; rep < 3; rep++) {
                    GPU_OK(m3_gpu_attn_paged_flash(g, da, dq, ldq, &ds, dpos, T, C, dtopk,
                                                   s->width, &ap, &p));
                    GPU_OK(m3_gpu_attn_paged_flash(g_two, (m3_bf16 *)db, dq, ldq, &ds, dpos, T, C,
                                                   dtopk, s->width, &ap, &p));
                }
                gpu_download_bf16(g, got2, da, no);
                if (memcmp(got, got2, no * sizeof *got))
                    m3_test_failf("%s: context A's run beside context B's differs", name);
                GPU_OK(m3_gpu_sync(g_two));
                gpu_download_bf16(g_two, got2, (m3_bf16 *)db, no);
                if (memcmp(got, got2, no * sizeof *got))
                    m3_test_failf("%s: context B's run beside context A's differs", name);
                gpu_guard_check(g, da, no * sizeof(m3_bf16), "paged flash out (two contexts)");
                m3_gpu_release(g_two, 0);
            }
        }
        ds.flash_cpb = 0, ds.flash_kernel = 0;
        free(got2);
    } else {
        if (p.attn_out_bf16) {
            m3_bf16 *dq = gpu_upload_bf16(g, q, nq, NULL);
            m3_bf16 *dout = gpu_guard_alloc(g, no * sizeof(m3_bf16));
            GPU_OK(m3_gpu_attn_paged(g, dout, dq, ldq, &ds, dpos, T, C, dtopk, s->width, &ap, &p));
            gpu_download_bf16(g, got, dout, no);
            gpu_guard_check(g, dout, no * sizeof(m3_bf16), "paged attention bf16 out");
            const int ex = count_exact(ref, got, no);
            snprintf(name, sizeof name, "%s bf16 (%d/%lld exact)", what, ex, (long long)no);
            gpu_expect_nmse(ref, got, no, GPU_NMSE_BF16, name);
            if (ex < PG_MIN_EXACT * (double)no)
                m3_test_failf("%s: fewer than %.0f %% bit-identical", name, 100 * PG_MIN_EXACT);
        }
        float *dq = gpu_upload_f32(g, q, nq);
        float *dout = gpu_guard_alloc(g, no * sizeof(float));
        GPU_OK(m3_gpu_attn_paged_f32(g, dout, dq, ldq, &ds, dpos, T, C, dtopk, s->width, &ap, &p));
        gpu_download_f32(g, got, dout, no);
        gpu_guard_check(g, dout, no * sizeof(float), "paged attention f32 out");
        const int ex = count_exact(ref, got, no);
        snprintf(name, sizeof name, "%s f32 (%d/%lld exact)", what, ex, (long long)no);
        gpu_expect_nmse(ref, got, no, p.attn_out_bf16 ? GPU_NMSE_BF16 : GPU_NMSE_F32, name);
        if (ex < PG_MIN_EXACT * (double)no)
            m3_test_failf("%s: fewer than %.0f %% bit-identical", name, 100 * PG_MIN_EXACT);
    }
    m3_gpu_release(g, 0);
    m3_kv_layer_free(&kl);
    for (int b = 0; b < S; b++) m3_block_table_free(&bts[b]);
    free(bts);
    free(ids); free(kr); free(vr); free(q); free(ref); free(got); free(pos); free(topk); free(kw);
    for (int i = 0; i < 4; i++) free(blk_real[i]), free(blk_stale[i]);
}

static const pg_store stores[] = {
    {M3_KV_F32, false, 0.0f},   {M3_KV_BF16, false, 0.0f}, {M3_KV_FP8, false, 448.0f},
    {M3_KV_FP8, true, 240.0f},  {M3_KV_FP8, true, 448.0f},
};
#define N_STORES (sizeof stores / sizeof stores[0])

static void run_shapes(m3_gpu *g, const pg_shape *sh, size_t n) {
    for (int prof = 0; prof < 3; prof++)
        for (size_t k = 0; k < N_STORES; k++)
            for (size_t i = 0; i < n; i++) pg_case(g, &sh[i], &stores[k], prof, false);
}

/* the flash kernel: bf16-output profiles (hf, atom), bf16 and fp8 elements */
static void run_flash(m3_gpu *g, const pg_shape *sh, size_t n) {
    for (int prof = 1; prof < 3; prof++)
        for (size_t k = 1; k < N_STORES; k++)
            for (size_t i = 0; i < n; i++) pg_case(g, &sh[i], &stores[k], prof, true);
}

static void paged_flash_dense_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const pg_shape shapes[] = {
        {1, 2000, 64, 4, 128, 128, 16, 0}, /* decode: 8 chunks, merged by the last block */
        {1, 4200, 64, 4, 128, 128, 16, 0}, /* 17 chunks */
        {1, 16700, 16, 2, 128, 128, 16, 0}, /* 66 chunks: at cpb 2, 33 partials a row > the
                                             * fused merge's 32: pf_merge_k */
        {5, 300, 64, 4, 128, 128, 16, 0},  /* a chunk of 5 after 295 */
        {2, 600, 16, 2, 128, 64, 16, 0},   /* Dh 128, Bs 64: pd8_part_k's run-time page */
        {7, 61, 6, 3, 12, 8, 1, 0},        /* the fixtures' geometry: element gather */
        {3, 530, 8, 2, 80, 64, 16, 0},     /* odd */
    };
    run_flash(g, shapes, sizeof shapes / sizeof shapes[0]);
}

static void paged_flash_sparse_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const pg_shape shapes[] = {
        {3, 2100, 64, 4, 128, 128, 16, 16}, /* rows near the end of 17 blocks */
        {2, 4100, 64, 4, 128, 128, 16, 16}, /* decode rows over 33 blocks, 16 selected */
        {2, 600, 16, 2, 128, 64, 32, 6},    /* Dh 128, page 32: pd8_part_k's run-time page */
        {7, 61, 6, 3, 12, 8, 1, 3},         /* the fixtures' geometry (top-k 3) */
        {4, 700, 8, 2, 80, 64, 16, 7},      /* odd, with the own block absent in half the rows */
        {5, 333, 10, 2, 48, 32, 8, 5},      /* odd heads (5 per group), Dh 48, Bs 32, P 8 */
    };
    run_flash(g, shapes, sizeof shapes / sizeof shapes[0]);
}

/* batch-1 decode (T = 1), the launcher's own choice included (pc_k: a cluster per row):
 * M3 rows of 16 selected blocks (a full own block, and one ending mid-tile), positions < 128
 * (the own block only: every id is 0, duplicates kept), odd geometries (4 heads a group, Dh
 * 80, Bs 64: partitions cut over 8 CTAs; 5 heads, Dh 48, Bs 32, P 16) */
static void paged_flash_decode1_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const pg_shape shapes[] = {
        {1, 4096, 64, 4, 128, 128, 16, 16}, /* the own block full (pos % 128 = 127) */
        {1, 2100, 64, 4, 128, 128, 16, 16}, /* the own block ends inside a 16-key tile */
        {1, 100, 64, 4, 128, 128, 16, 16},  /* pos < 128: the own block only */
        {1, 7, 64, 4, 128, 128, 16, 3},     /* 7 keys */
        {1, 700, 8, 2, 80, 64, 16, 7},      /* odd, the own block absent in one row */
        {1, 333, 10, 2, 48, 32, 16, 5},     /* odd heads, Dh 48 */
        {1, 1000, 64, 4, 128, 128, 16, 0},  /* dense decode over 4 chunks */
        {1, 130, 8, 2, 80, 64, 16, 0},      /* dense, odd */
    };
    run_flash(g, shapes, sizeof shapes / sizeof shapes[0]);
}

/* Two contexts on one device, launching at once (g_two above): M3 decode rows whose blocks
 * merge through the arrival counters (dense 8 chunks, sparse 17 ranges), bf16 and fp8 (§4.9). */
static void paged_flash_two_contexts(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    GPU_OK(m3_gpu_open(&g_two, 0));
    static const pg_shape shapes[] = {
        {1, 2000, 64, 4, 128, 128, 16, 0},
        {2, 4100, 64, 4, 128, 128, 16, 16},
    };
    for (size_t k = 1; k < N_STORES; k++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            pg_case(g, &shapes[i], &stores[k], 2, true);
    m3_gpu_close(g_two);
    g_two = NULL;
}

/* The model's order (g_after above): a kernel writes the token's K / V slot (and fp8 scales)
 * right before each call; dense rows whose last chunk holds the position in its first groups
 * (16700: chunk 65, group 3; 16641: group 0), which is a warp's first chunk at cpb 8 and 2
 * (pd_part_k prefetches those groups into L2 before its wait), a full last chunk (4096), and
 * a sparse row. bf16 (pd_part_k) and §4.9 fp8 (pd8_part_k). */
static void paged_flash_after_write(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const pg_shape shapes[] = {
        {1, 16700, 16, 2, 128, 128, 16, 0},
        {1, 16641, 16, 2, 128, 128, 16, 0},
        {1, 4096, 16, 2, 128, 128, 16, 0},
        {1, 4100, 64, 4, 128, 128, 16, 16},
    };
    g_after = true;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        pg_case(g, &shapes[i], &stores[1], 2, true);
        pg_case(g, &shapes[i], &stores[4], 2, true);
    }
    g_after = false;
}

/* Sparse decode rows (T = 1, M3 geometry, atom: pc_k's instances with M3's geometry compiled
 * in) where the launch just before the flash call writes the token's K/V into the paged cache
 * (g_chain above): bf16, §4.9 at FP8_MAX 448 and 240 */
static void paged_flash_after_cache_write(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const pg_shape shapes[] = {
        {1, 4096, 64, 4, 128, 128, 16, 16}, /* the own block full */
        {1, 2100, 64, 4, 128, 128, 16, 16}, /* the own block ends inside a 16-key tile */
        {1, 100, 64, 4, 128, 128, 16, 16},  /* the own block only */
    };
    g_chain = true;
    for (size_t k = 1; k < N_STORES; k++)
        if (k != 2) /* fp8 dequantized on read: not an M3 store */
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) pg_case(g, &shapes[i], &stores[k], 2, true);
    g_chain = false;
}

static void paged_dense_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const pg_shape shapes[] = {
        {1, 2000, 64, 4, 128, 128, 16, 0}, /* decode: 8 partitions, 16 blocks */
        {5, 300, 64, 4, 128, 128, 16, 0},  /* a chunk of 5 after 295 */
        {7, 61, 6, 3, 12, 8, 1, 0},        /* the fixtures' geometry: padded rows */
        {3, 530, 8, 2, 80, 64, 16, 0},     /* odd */
    };
    run_shapes(g, shapes, sizeof shapes / sizeof shapes[0]);
}

static void paged_sparse_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const pg_shape shapes[] = {
        {3, 2100, 64, 4, 128, 128, 16, 16}, /* rows near the end of 17 blocks */
        {7, 61, 6, 3, 12, 8, 1, 3},         /* the fixtures' geometry (top-k 3) */
        {4, 700, 8, 2, 80, 64, 16, 7},      /* odd, with the own block absent in half the rows */
    };
    run_shapes(g, shapes, sizeof shapes / sizeof shapes[0]);
}

/* A decode batch (src.bt_ld): T sequences of different lengths in one shuffled pool, one
 * token each, against ref run per sequence; the faithful kernel (§4.9 fp8) and the flash
 * kernels (every kernel choice of pg_case: the decode kernels at M3 geometry, the element
 * gather at the odd one), atom, bf16 and fp8 (dequantized; §4.9 at FP8_MAX 448). Fewer
 * stores and profiles than the one-sequence tests: ref writes every sequence's keys, and
 * the device batches have ~40 s. */
static void paged_batch_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const pg_shape shapes[] = {
        {4, 2100, 64, 4, 128, 128, 16, 16}, /* sparse decode rows, 4 sequences */
        {4, 1000, 64, 4, 128, 128, 16, 0},  /* dense decode rows */
        {2, 4100, 64, 4, 128, 128, 16, 16}, /* 2 rows (pc_k's row count: not taken) */
        {5, 700, 8, 2, 80, 64, 16, 7},      /* odd: the element gather */
    };
    g_seqs = true;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        pg_case(g, &shapes[i], &stores[4], 2, false);
        for (size_t k = 1; k < N_STORES; k += (k == 2 ? 2 : 1))
            pg_case(g, &shapes[i], &stores[k], 2, true);
    }
    /* rows of 66, 55 and 44 chunks: at cpb 2 (33, 28, 22 partials) the merge kernel
     * pf_merge_k, each row's own key count */
    static const pg_shape two = {3, 16700, 16, 2, 128, 128, 16, 0};
    pg_case(g, &two, &stores[4], 2, true);
    g_seqs = false;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(paged_dense_matches_ref),
        cmocka_unit_test(paged_sparse_matches_ref),
        cmocka_unit_test(paged_flash_dense_matches_ref),
        cmocka_unit_test(paged_flash_sparse_matches_ref),
        cmocka_unit_test(paged_flash_decode1_matches_ref),
        cmocka_unit_test(paged_flash_two_contexts),
        cmocka_unit_test(paged_flash_after_cache_write),
        cmocka_unit_test(paged_batch_matches_ref),
        cmocka_unit_test(paged_flash_after_write),
    };
    return M3_RUN_GPU_TESTS(tests);
}
