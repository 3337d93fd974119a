/* tests/gpu_indexer.c: gpu/indexer.hip against ref/indexer.c m3_indexer_topk on fresh
 * random index queries/keys: M3 shapes (G = 4, Di = 128, Bs = 128, K = 16, local 1) with
 * decode rows deep in a history (nb > K) and prefill rows (nb <= K), and odd ones (G = 3,
 * Di = 80, Bs = 64, K = 5, local 2, init 1), under every profile (atom: scale s*log2e,
 * boosts 1e29/1e30 with init blocks). Both storage paths see the same (bf16-valued) inputs
 * and do fp32 math, so block scores must agree to GPU_NMSE_F32 (the bf16 path scores on
 * tensor cores where the shape allows: GPU_NMSE_TC), forced and NaN positions exactly, and
 * the selected ids exactly, except rows whose reference margin is below IDX_TIE_REL of the
 * score (a summation-order flip of a near-tie), which are counted.
 * Every case runs through each device path (m3_gpu_indexer_topk_path): the auto choice (for
 * decode: idx_dec_k with the selection fused into it; idx_km_k at T * G <= 8, with the direct
 * selection up to 1024 key blocks: a slot left nonzero by one call would feed the previous
 * case's scores to the next direct call, whose ids are then checked), idx_dec_k (idx_km_k) with the selection kernel
 * after it (the path past the fused limit), the wide (256-row) scorer, the key-tile scorer
 * with the arg-max rounds, the CUDA-core scorer. Data patterns that stress the selection:
 * all keys equal (every score ties: the ids must be the lowest ones, exactly, no flip
 * allowed), hot blocks that all sit in the same threads of the one-pass selection (block ids
 * equal mod 256), a NaN key row (NaN ranks highest, or -1e30 under atom) and the longest
 * history of the decode bench (nb = 8192).
 * Paged storage (indexer_paged_matches_ref): the keys written by ref's m3_kv_index_write into
 * a ref m3_kv_layer's index cache ([n_blocks, Bs, Di], rows by slot) through a SHUFFLED block
 * table (pool larger than the sequence), those bytes and the table uploaded as they are, and
 * the device indexer (m3_gpu_indexer_topk_keys / _f32) reading through the table; the
 * reference is m3_indexer_topk over the keys read back by m3_kv_index_read (as ref/layer.c
 * does). bf16 elements through every device path, fp8 (e4m3fn / e4m3fnuz, unit scale) through
 * the decode kernel (e4m3fn, bf16 queries: codes decoded to bf16 in registers) and
 * idx_score_k, fp32 elements through idx_score_k; M3 geometry (Bs = B = 128: one row base per
 * scoring block) and odd ones (Bs 8 < B, Bs 48 with B 32: neither divides the other, Bs 256 = 4 B):
 * the per-row mapping; decode with more key blocks than the decode kernel's grid (several key
 * blocks per scoring block) and the 262K-key history, bf16 and fp8 elements. Same tolerances
 * as the contiguous cases. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/indexer.h"
#include "ref/kvcache.h"
#include "tests/gpu_test.h"

/* fp32 dots of 128 products differ by summation order at ~1e-6 relative at most (CUDA
 * cores); the bf16 path's tensor-core accumulation up to ~1e-5 (GPU_NMSE_TC) */
#define IDX_TIE_REL 1e-5f
#define IDX_TIE_REL_TC 1e-4f

static void profile_of(m3_profile *p, int which) {
    if (which == 0) m3_profile_fp32(p);
    else if (which == 1) m3_profile_hf(p);
    else m3_profile_atom(p);
}

/* pattern: 0 random, IDX_EQUAL every key row the same, IDX_HOT blocks b % 256 < 3 scaled x3,
 * IDX_NAN two NaN key rows; IDX_BIG: atom with bf16 storage only (the reference and the
 * uploads take a while); IDX_WIDEQ (paged cases): one query element 1e20, so that its row
 * does not fit fp16 at any scale (the fp8 decode's fp16 route falls back to bf16); IDX_QOFF:
 * the bf16 queries start 4 bytes past a 16-byte boundary (idx_km_k's 4-byte Q loads) */
enum { IDX_EQUAL = 1, IDX_HOT = 2, IDX_NAN = 4, IDX_BIG = 8, IDX_WIDEQ = 16, IDX_QOFF = 32 };
typedef struct { int T, n_ctx, G, Di, B, K, local, init; bool prefill; int pat; } idx_shape;

/* device paths (m3_gpu_indexer_topk_path, gpu/m3_gpu.h) */
static const struct { int path; const char *name; } idx_paths[] = {
    {M3_GPU_IDX_AUTO, "auto"},
    {M3_GPU_IDX_DECODE | M3_GPU_IDX_SEL_KERNEL, "decode,sel-kernel"},
    {M3_GPU_IDX_WIDE, "wide"},
    {M3_GPU_IDX_TILE | M3_GPU_IDX_SEL_ROUNDS, "tile,rounds"},
    {M3_GPU_IDX_CUDA, "cuda"},
};

/* A second context on the same device (indexer_two_contexts): when set, contiguous bf16
 * cases also launch on both contexts' streams back to back with no wait between, and both
 * must give the first run's ids and score bits. The fused decode selection counts block
 * arrivals in counters that are the context's own (m3_gpu.counters). */
static m3_gpu *g_two;

/* the bf16 queries on the device; IDX_QOFF: 2 elements past the allocation's start */
static m3_bf16 *upload_q(m3_gpu *g, const float *iq, int64_t n, int pat) {
    if (!(pat & IDX_QOFF)) return gpu_upload_bf16(g, iq, n, NULL);
    float *h = calloc((size_t)n + 2, sizeof *h);
    memcpy(h + 2, iq, (size_t)n * sizeof *h);
    m3_bf16 *d = gpu_upload_bf16(g, h, n + 2, NULL);
    free(h);
    return d + 2;
}

/* One call's outputs against ref's: the ids of each of the nmg rows (W wide) identical, except
 * rows whose reference margin is below IDX_TIE_REL(_TC) of the score (a summation-order flip
 * of a near-tie: counted, the return value; none allowed when every score ties: equal); the
 * forced scores (1e29/1e30 under atom, +inf otherwise) and NaN ones exactly, the others within
 * the NMSE bound (tc: the tensor-core paths), sc and sc_ref compacted to them in place. */
static int idx_check(const char *what, const int32_t *tk, const int32_t *tk_ref, float *sc,
                     float *sc_ref, const float *mg_ref, size_t nmg, size_t nsc, int W, int nbk,
                     bool tc, bool equal) {
    int flips = 0;
    for (size_t row = 0; row < nmg; row++) {
        if (memcmp(tk + row * W, tk_ref + row * W, W * sizeof *tk) == 0) continue;
        float scale = fabsf(sc_ref[row * nbk]) + 1.0f;
        if (!equal && mg_ref[row] <= (tc ? IDX_TIE_REL_TC : IDX_TIE_REL) * scale) {
            flips++;
            continue;
        }
        m3_test_failf("%s row %zu: gpu ids %d %d %d .. ref %d %d %d .. (ref margin %g)", what, row,
                      tk[row * W], tk[row * W + 1], tk[row * W + 2], tk_ref[row * W],
                      tk_ref[row * W + 1], tk_ref[row * W + 2], (double)mg_ref[row]);
    }
    /* forced scores must match exactly and are left out of the NMSE, where they would swamp
     * every real score */
    int64_t nf = 0;
    for (size_t i = 0; i < nsc; i++) {
        if (isfinite(sc_ref[i]) && fabsf(sc_ref[i]) < 1e28f) {
            sc_ref[nf] = sc_ref[i], sc[nf] = sc[i], nf++;
        } else if (isnan(sc_ref[i]) ? !isnan(sc[i]) : m3_f32_bits(sc_ref[i]) != m3_f32_bits(sc[i])) {
            m3_test_failf("%s score %zu: gpu %g ref %g", what, i, (double)sc[i], (double)sc_ref[i]);
        }
    }
    if (nf > 0)
        gpu_expect_nmse(sc_ref, sc, nf, tc ? GPU_NMSE_TC : GPU_NMSE_F32, what);
    else /* every candidate forced (nb == local blocks): the ids and forced values above are
            the whole check */
        printf("  %-58s all scores forced; ids and forced values identical\n", what);
    return flips;
}

/* The device side of one case under one device path. */
/* paged index keys: ref's storage bytes and its block table (NULL: contiguous ik rows) */
typedef struct {
    const m3_kv_layer *kl;
    const m3_block_table *bt;
} idx_store;

static void idx_run(m3_gpu *g, const idx_shape *s, const m3_profile *p, const m3_indexer_params *ip,
                    bool bf16, const float *iq, const float *ik, const int32_t *pos,
                    const int32_t *tk_ref, const float *sc_ref0, const float *mg_ref, int ties_ref,
                    int path, const char *path_name, const idx_store *st) {
    const int T = s->T, C = s->n_ctx, ldq = s->G * s->Di;
    const int nbk = (C + s->B - 1) / s->B, W = m3_indexer_width(C, ip, p);
    const size_t ntk = (size_t)s->G * T * W, nsc = (size_t)s->G * T * nbk, nmg = (size_t)s->G * T;
    int32_t *tk = malloc(ntk * sizeof *tk);
    float *sc = malloc(nsc * sizeof *sc), *sc_ref = malloc(nsc * sizeof *sc_ref);
    memcpy(sc_ref, sc_ref0, nsc * sizeof *sc_ref);
    void *dpos;
    GPU_OK(m3_gpu_alloc(g, &dpos, T * sizeof *pos));
    GPU_OK(m3_gpu_upload(g, dpos, pos, T * sizeof *pos));
    int32_t *dtk = gpu_guard_alloc(g, ntk * sizeof(int32_t));
    float *dsc = gpu_guard_alloc(g, nsc * sizeof(float));
    float *dmg = gpu_guard_alloc(g, nmg * sizeof(float));
    int *dties = gpu_guard_alloc(g, sizeof(int));
    m3_gpu_index_keys keys;
    memset(&keys, 0, sizeof keys);
    if (st) {
        const m3_kv_layer *kl = st->kl;
        const size_t kb = (size_t)kl->n_blocks * kl->g.block * kl->index_dim *
                          (size_t)m3_kv_elem_bytes(kl->index_elem);
        void *dk, *dbt;
        GPU_OK(m3_gpu_alloc(g, &dk, kb));
        GPU_OK(m3_gpu_upload(g, dk, kl->index_k, kb));
        GPU_OK(m3_gpu_alloc(g, &dbt, (size_t)st->bt->n_logical * sizeof(int32_t)));
        GPU_OK(m3_gpu_upload(g, dbt, st->bt->phys, (size_t)st->bt->n_logical * sizeof(int32_t)));
        keys.k = dk, keys.elem = kl->index_elem, keys.kind = kl->g.fp8_kind;
        keys.bt = dbt, keys.block = kl->g.block;
        if (bf16) {
            m3_bf16 *diq = upload_q(g, iq, (int64_t)T * ldq, s->pat);
            GPU_OK(m3_gpu_indexer_topk_keys(g, path, dtk, dsc, dmg, dties, diq, ldq, &keys, dpos, T,
                                            C, ip, p));
        } else {
            float *diq = gpu_upload_f32(g, iq, (int64_t)T * ldq);
            GPU_OK(m3_gpu_indexer_topk_keys_f32(g, path, dtk, dsc, dmg, dties, diq, ldq, &keys,
                                                dpos, T, C, ip, p));
        }
    } else if (bf16) {
        m3_bf16 *diq = upload_q(g, iq, (int64_t)T * ldq, s->pat);
        m3_bf16 *dik = gpu_upload_bf16(g, ik, (int64_t)C * s->Di, NULL);
        GPU_OK(m3_gpu_indexer_topk_path(g, path, dtk, dsc, dmg, dties, diq, ldq, dik, dpos, T, C, ip, p));
    } else {
        float *diq = gpu_upload_f32(g, iq, (int64_t)T * ldq), *dik = gpu_upload_f32(g, ik, (int64_t)C * s->Di);
        GPU_OK(m3_gpu_indexer_topk_f32_path(g, path, dtk, dsc, dmg, dties, diq, ldq, dik, dpos, T, C, ip, p));
    }
    int ties = 0;
    GPU_OK(m3_gpu_download(g, tk, dtk, ntk * sizeof(int32_t)));
    gpu_download_f32(g, sc, dsc, (int64_t)nsc);
    if (g_two && !st && bf16) { /* the same call on two contexts at once, three times */
        m3_bf16 *diq = upload_q(g, iq, (int64_t)T * ldq, s->pat);
        m3_bf16 *dik = gpu_upload_bf16(g, ik, (int64_t)C * s->Di, NULL);
        void *t2, *s2, *m2, *n2;
        GPU_OK(m3_gpu_alloc(g_two, &t2, ntk * sizeof(int32_t)));
        GPU_OK(m3_gpu_alloc(g_two, &s2, nsc * sizeof(float)));
        GPU_OK(m3_gpu_alloc(g_two, &m2, nmg * sizeof(float)));
        GPU_OK(m3_gpu_alloc(g_two, &n2, sizeof(int)));
        for (int rep = 0; rep < 3; rep++) {
            GPU_OK(m3_gpu_indexer_topk_path(g, path, dtk, dsc, dmg, dties, diq, ldq, dik, dpos, T,
                                            C, ip, p));
            GPU_OK(m3_gpu_indexer_topk_path(g_two, path, (int32_t *)t2, (float *)s2, (float *)m2,
                                            (int *)n2, diq, ldq, dik, dpos, T, C, ip, p));
        }
        int32_t *tk2 = malloc(ntk * sizeof *tk2);
        float *sc2 = malloc(nsc * sizeof *sc2);
        for (int side = 0; side < 2; side++) {
            m3_gpu *gs = side ? g_two : g;
            GPU_OK(m3_gpu_sync(gs));
            GPU_OK(m3_gpu_download(gs, tk2, side ? t2 : (void *)dtk, ntk * sizeof(int32_t)));
            GPU_OK(m3_gpu_download(gs, sc2, side ? s2 : (void *)dsc, nsc * sizeof(float)));
            if (memcmp(tk, tk2, ntk * sizeof *tk) || memcmp(sc, sc2, nsc * sizeof *sc))
                m3_test_failf("indexer T=%d C=%d path %s: context %c's run beside the other's "
                              "differs", T, C, path_name, side ? 'B' : 'A');
        }
        free(tk2); free(sc2);
        m3_gpu_release(g_two, 0);
    }
    GPU_OK(m3_gpu_download(g, &ties, dties, sizeof ties));
    gpu_guard_check(g, dtk, ntk * sizeof(int32_t), "indexer topk");
    gpu_guard_check(g, dsc, nsc * sizeof(float), "indexer scores");
    gpu_guard_check(g, dmg, nmg * sizeof(float), "indexer margin");
    gpu_guard_check(g, dties, sizeof(int), "indexer ties");
    char what[240], stn[64] = "";
    if (st)
        snprintf(stn, sizeof stn, ",paged %s Bs=%d",
                 st->kl->index_elem == M3_KV_FP8    ? (st->kl->g.fp8_kind ? "fp8fnuz" : "fp8")
                 : st->kl->index_elem == M3_KV_BF16 ? "bf16"
                                                    : "f32",
                 st->kl->g.block);
    snprintf(what, sizeof what, "indexer_topk%s(%s,T=%d,C=%d,G=%d,Di=%d,B=%d,K=%d,pat=%d,%s%s)",
             bf16 ? "" : "_f32", p->name, T, C, s->G, s->Di, s->B, s->K, s->pat, path_name, stn);
    const int flips = idx_check(what, tk, tk_ref, sc, sc_ref, mg_ref, nmg, nsc, W, nbk, bf16,
                                (s->pat & IDX_EQUAL) != 0);
    printf("  %s: %d near-tie flips, ties gpu %d ref %d\n", what, flips, ties, ties_ref);
    if ((s->pat & IDX_EQUAL) && ties != ties_ref) /* exact ties on both sides */
        m3_test_failf("%s: %d tied rows, ref %d", what, ties, ties_ref);
    free(tk); free(sc); free(sc_ref);
}

static void idx_case(m3_gpu *g, const idx_shape *s, int prof, bool bf16) {
    m3_profile p;
    profile_of(&p, prof);
    m3_indexer_params ip = {s->G, s->Di, s->B, s->K, s->local, s->init};
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 1000 + (uint64_t)s->T * 7 + (uint64_t)s->n_ctx + prof);
    const int T = s->T, C = s->n_ctx, ldq = s->G * s->Di;
    const int nbk = (C + s->B - 1) / s->B, W = m3_indexer_width(C, &ip, &p);
    float *iq = malloc((size_t)T * ldq * sizeof *iq), *ik = malloc((size_t)C * s->Di * sizeof *ik);
    m3_fill_normal(&r, iq, (int64_t)T * ldq, 1.0f);
    m3_fill_normal(&r, ik, (int64_t)C * s->Di, 1.0f);
    for (int j = 1; (s->pat & IDX_EQUAL) && j < C; j++) memcpy(ik + (size_t)j * s->Di, ik, s->Di * sizeof *ik);
    for (int j = 0; (s->pat & IDX_HOT) && j < C; j++)
        if ((j / s->B) % 256 < 3)
            for (int d = 0; d < s->Di; d++) ik[(size_t)j * s->Di + d] *= 3.0f;
    if (s->pat & IDX_NAN) { /* two rows: other lanes, tiles and pieces of the fp8 decode */
        ik[(size_t)(3 * s->B + 5) * s->Di + 7] = NAN;
        ik[(size_t)(5 * s->B + 98 % s->B) * s->Di + 100 % s->Di] = NAN;
    }
    for (int64_t i = 0; i < (int64_t)T * ldq; i++) iq[i] = m3_round_bf16(iq[i]);
    for (int64_t i = 0; i < (int64_t)C * s->Di; i++) ik[i] = m3_round_bf16(ik[i]);
    int32_t *pos = malloc(T * sizeof *pos);
    for (int t = 0; t < T; t++) pos[t] = s->prefill ? t : C - T + t;
    const size_t ntk = (size_t)s->G * T * W, nsc = (size_t)s->G * T * nbk, nmg = (size_t)s->G * T;
    int32_t *tk_ref = malloc(ntk * sizeof *tk_ref);
    float *sc_ref = malloc(nsc * sizeof *sc_ref);
    float *mg_ref = malloc(nmg * sizeof *mg_ref);
    int ties_ref = 0;
    size_t sb = m3_indexer_scratch_bytes(C, &ip);
    void *scratch = malloc(sb);
    m3_indexer_topk(tk_ref, sc_ref, mg_ref, &ties_ref, iq, ldq, ik, pos, T, C, &ip, &p, scratch, sb);
    free(scratch);

    for (size_t pi = 0; pi < sizeof idx_paths / sizeof idx_paths[0]; pi++) {
        const size_t mark = m3_gpu_mark(g);
        idx_run(g, s, &p, &ip, bf16, iq, ik, pos, tk_ref, sc_ref, mg_ref, ties_ref,
                idx_paths[pi].path, idx_paths[pi].name, NULL);
        m3_gpu_release(g, mark);
    }
    free(iq); free(ik); free(pos); free(tk_ref); free(sc_ref); free(mg_ref);
}

static void indexer_topk_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const idx_shape shapes[] = {
        {3, 4096, 4, 128, 128, 16, 1, 0, false, 0},  /* decode rows: nb = 32 > K */
        {1, 9000, 4, 128, 128, 16, 1, 0, false, 0},  /* partial last block */
        {33, 33, 4, 128, 128, 16, 1, 0, true, 0},    /* prefill, one block: all forced */
        {300, 300, 4, 128, 128, 16, 1, 0, true, 0},  /* prefill over 3 blocks (nb <= K) */
        {40, 2200, 4, 128, 128, 16, 1, 0, false, 0}, /* rows crossing nb = K + 1 */
        {5, 1000, 3, 80, 64, 5, 2, 1, false, 0},     /* odd, init block */
        {70, 5000, 4, 128, 128, 16, 1, 0, false, 0}, /* 5 token groups, last one partial */
        {2, 40000, 4, 128, 128, 16, 1, 0, false, 0}, /* nb > 256: two-stage selection */
        {3, 20000, 3, 80, 64, 5, 2, 1, false, 0},    /* two-stage, odd, init block */
        {16, 3000, 4, 128, 128, 16, 1, 0, false, 0}, /* 64 rows: the most the fused path takes */
        {17, 3000, 4, 128, 128, 16, 1, 0, false, 0}, /* 68 rows */
        {2, 5000, 4, 128, 128, 16, 1, 0, false, IDX_EQUAL},      /* every score ties */
        {2, 100000, 4, 128, 128, 16, 1, 0, false, IDX_EQUAL},    /* ties, 2 key blocks per
                                                                    scoring block (decode) */
        {3, 2000, 3, 80, 64, 5, 2, 1, false, IDX_EQUAL},         /* ties, odd, init block */
        {1, 262044, 4, 128, 128, 16, 1, 0, false, IDX_HOT},      /* 24 hot blocks in 3 threads */
        {2, 3000, 4, 128, 128, 16, 1, 0, false, IDX_NAN},        /* NaN block */
        {1, 8192 * 128 - 5, 4, 128, 128, 16, 1, 0, false, IDX_BIG}, /* nb = 8192 */
        {1, 200, 4, 128, 128, 16, 1, 0, false, 0},    /* fewer key blocks than rows */
        {5, 7000, 4, 128, 128, 16, 1, 0, false, 0},   /* 20 rows: four m-tiles, partial */
        {2, 6000, 2, 64, 64, 8, 1, 1, false, 0},      /* Di = 64 (swizzled ring rows), init */
        {3, 5000, 8, 96, 32, 16, 2, 0, false, 0},     /* Di = 96, B = 32, G = 8 */
        /* idx_km_k (T * G <= 8): B = 32 (two m-tiles: warps 2, 3 idle), Di = 96, G = 8 */
        {1, 5000, 8, 96, 32, 16, 2, 0, false, 0},
        {4, 3000, 2, 64, 64, 8, 1, 1, false, IDX_NAN}, /* G = 2: 8 rows of 4 tokens */
        /* idx_km_k's direct selection: nb = 128 (one key block per picking thread, the rank
         * count), nb = 129 (the threshold pass), and past 1024 key blocks with every score
         * tied (the row read after the arrival: the lowest ids, exactly) */
        {1, 16384, 4, 128, 128, 16, 1, 0, false, 0},
        {1, 16385, 4, 128, 128, 16, 1, 0, false, IDX_NAN},
        {1, 140000, 4, 128, 128, 16, 1, 0, false, IDX_EQUAL | IDX_BIG},
        /* idx_km_k's Q rows through 4-byte loads (not 16-byte aligned), G = 4 and G = 2 */
        {1, 9000, 4, 128, 128, 16, 1, 0, false, IDX_QOFF},
        {4, 3000, 2, 64, 64, 8, 1, 1, false, IDX_QOFF},
    };
    for (int prof = 0; prof < 3; prof++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            if (shapes[i].pat & IDX_BIG) { /* atom, bf16 storage: the decode bench's case */
                if (prof == 2) idx_case(g, &shapes[i], prof, true);
                continue;
            }
            idx_case(g, &shapes[i], prof, false);
            idx_case(g, &shapes[i], prof, true);
        }
}

/* M3's decode step alone, quick to run (T = 1, G = 4, Di = 128, B = 128: idx_km_k with the
 * geometry compiled in, the one-slot direct pick and the zeroing block's flags), every
 * profile, bf16 storage: the bench's 8192 keys (64 key blocks), a last key block seen up to
 * key 127 or key 27 only (NaN rows in both halves of the key blocks), every score tied (the
 * tie count: added after the flag), 66 key blocks with the queries' 4-byte loads */
static void indexer_decode_t1(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const idx_shape shapes[] = {
        {1, 8192, 4, 128, 128, 16, 1, 0, false, 0},
        {1, 8191, 4, 128, 128, 16, 1, 0, false, IDX_NAN},
        {1, 8092, 4, 128, 128, 16, 1, 0, false, IDX_NAN},
        {1, 5000, 4, 128, 128, 16, 1, 0, false, IDX_EQUAL},
        {1, 8448, 4, 128, 128, 16, 1, 0, false, IDX_QOFF},
    };
    for (int prof = 0; prof < 3; prof++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            idx_case(g, &shapes[i], prof, true);
}

/* The keys of the call's own positions written by the kernel just before the indexer (as
 * the model's q/k norm + RoPE + cache write does; idx_km_k is a programmatic dependent launch
 * that loads its first key block before it waits for that kernel): the copy kernel or the
 * fused cache write (index rows only) writes the rows at the positions, alternately a hot
 * row (its block then ranks first where it is not forced) and the old row, right before
 * each call; every call's ids and scores against
 * ref over the keys of that moment. local 0: the position's own block is scored; T = 2
 * across a block boundary: the first token's block is unforced for the second; 128K keys:
 * the position's block in a scoring block's second round. */
static void indexer_after_write(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const struct { int T, C, local; } cs[] = {
        {1, 8192, 0}, {1, 8192, 1}, {2, 8193, 1}, {1, 8000, 0}, {1, 131072, 0}};
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const int T = cs[ci].T, C = cs[ci].C, G = 4, Di = 128, B = 128, ldq = G * Di;
        m3_profile p;
        m3_profile_atom(&p);
        m3_indexer_params ip = {G, Di, B, 16, cs[ci].local, 0};
        const int nbk = (C + B - 1) / B, W = m3_indexer_width(C, &ip, &p);
        const size_t mark = m3_gpu_mark(g);
        m3_rng r;
        m3_rng_init(&r, m3_test_seed(), 1700 + ci);
        float *iq = malloc((size_t)T * ldq * sizeof *iq), *ik = malloc((size_t)C * Di * sizeof *ik);
        m3_fill_normal(&r, iq, (int64_t)T * ldq, 1.0f);
        m3_fill_normal(&r, ik, (int64_t)C * Di, 1.0f);
        for (int64_t i = 0; i < (int64_t)T * ldq; i++) iq[i] = m3_round_bf16(iq[i]);
        for (int64_t i = 0; i < (int64_t)C * Di; i++) ik[i] = m3_round_bf16(ik[i]);
        int32_t pos[2];
        for (int t = 0; t < T; t++) pos[t] = C - T + t;
        /* the rows at the positions: old (as uploaded) and hot (4 x head 0's query) */
        const size_t rb = (size_t)T * Di;
        float *old = malloc(rb * sizeof *old), *hot = malloc(rb * sizeof *hot);
        memcpy(old, ik + (size_t)pos[0] * Di, rb * sizeof *old);
        for (int t = 0; t < T; t++)
            for (int d = 0; d < Di; d++) hot[(size_t)t * Di + d] = m3_round_bf16(4.0f * iq[d]);
        m3_bf16 *dik = gpu_upload_bf16(g, ik, (int64_t)C * Di, NULL);
        m3_bf16 *diq = gpu_upload_bf16(g, iq, (int64_t)T * ldq, NULL);
        m3_bf16 *dold = gpu_upload_bf16(g, old, (int64_t)rb, NULL);
        m3_bf16 *dhot = gpu_upload_bf16(g, hot, (int64_t)rb, NULL);
        void *dpos;
        int32_t *dtk;
        float *dsc;
        GPU_OK(m3_gpu_alloc(g, &dpos, sizeof pos));
        GPU_OK(m3_gpu_upload(g, dpos, pos, sizeof pos));
        const size_t ntk = (size_t)G * T * W, nsc = (size_t)G * T * nbk;
        GPU_OK(m3_gpu_alloc(g, (void **)&dtk, ntk * sizeof *dtk));
        GPU_OK(m3_gpu_alloc(g, (void **)&dsc, nsc * sizeof *dsc));
        int32_t *tk = malloc(ntk * sizeof *tk), *tk_ref = malloc(ntk * sizeof *tk_ref);
        float *sc = malloc(nsc * sizeof *sc), *sc_ref = malloc(nsc * sizeof *sc_ref);
        float *mg_ref = malloc((size_t)G * T * sizeof *mg_ref);
        const size_t sb = m3_indexer_scratch_bytes(C, &ip);
        void *scratch = malloc(sb);
        /* a 128 MB copy ahead of each sequence keeps the device busy while the host queues the
         * three launches, so that they meet on the device (launched apart, the write is done
         * before the next launch arrives) */
        const size_t big = (size_t)128 << 20;
        void *ba, *bb;
        GPU_OK(m3_gpu_alloc(g, &ba, big));
        GPU_OK(m3_gpu_alloc(g, &bb, big));
        int flips = 0;
        for (int it = 0; it < 8; it++) {
            const bool h = (it & 1) == 0;
            memcpy(ik + (size_t)pos[0] * Di, h ? hot : old, rb * sizeof *ik);
            int ties_ref = 0;
            m3_indexer_topk(tk_ref, sc_ref, mg_ref, &ties_ref, iq, ldq, ik, pos, T, C, &ip, &p,
                            scratch, sb);
            /* an earlier call, then the write and the call under test back to back; the
             * writer: the copy kernel, or (it & 2) the model's, the fused cache write (its
             * launch lets the next one start at its entry), index rows only, no norm */
            GPU_OK(m3_gpu_copy_kernel(g, bb, ba, big, 0));
            GPU_OK(m3_gpu_indexer_topk(g, dtk, dsc, NULL, NULL, diq, ldq, dik, dpos, T, C, &ip, &p));
            if (it & 2) {
                m3_gpu_qkv x;
                memset(&x, 0, sizeof x);
                x.index_k = h ? dhot : dold, x.ld_ik = Di, x.n_index_head = G, x.index_dim = Di;
                m3_gpu_kv_cache kc;
                memset(&kc, 0, sizeof kc);
                kc.index_k = dik, kc.index_row0 = pos[0];
                GPU_OK(m3_gpu_qk_norm_rope_cache(g, &x, &kc, NULL, dpos, T, 1e-6f, Di, 1e4f, &p));
            } else {
                GPU_OK(m3_gpu_copy_kernel(g, dik + (size_t)pos[0] * Di, h ? dhot : dold,
                                          rb * sizeof(m3_bf16), 0));
            }
            GPU_OK(m3_gpu_indexer_topk(g, dtk, dsc, NULL, NULL, diq, ldq, dik, dpos, T, C, &ip, &p));
            GPU_OK(m3_gpu_download(g, tk, dtk, ntk * sizeof *tk));
            gpu_download_f32(g, sc, dsc, (int64_t)nsc);
            char what[120];
            snprintf(what, sizeof what, "indexer after a key write (T=%d C=%d local %d, %s row, %s)",
                     T, C, cs[ci].local, h ? "hot" : "old", (it & 2) ? "cache write" : "copy");
            flips += idx_check(what, tk, tk_ref, sc, sc_ref, mg_ref, (size_t)G * T, nsc, W, nbk,
                               true, false);
        }
        printf("  indexer after a key write T=%d C=%d local %d: 8 calls, %d near-tie flips\n", T, C,
               cs[ci].local, flips);
        free(scratch); free(iq); free(ik); free(old); free(hot); free(tk); free(tk_ref); free(sc);
        free(sc_ref); free(mg_ref);
        m3_gpu_release(g, mark);
    }
}

/* Two contexts on one device launching at once (g_two above): decode rows through the fused
 * selection (auto) and the selection kernel, at 4K and 40K keys, bf16. */
static void indexer_two_contexts(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    GPU_OK(m3_gpu_open(&g_two, 0));
    static const idx_shape shapes[] = {
        {3, 4096, 4, 128, 128, 16, 1, 0, false, 0},
        {2, 40000, 4, 128, 128, 16, 1, 0, false, 0},
        {16, 3000, 4, 128, 128, 16, 1, 0, false, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) idx_case(g, &shapes[i], 2, true);
    m3_gpu_close(g_two);
    g_two = NULL;
}

/* One case over ref's paged index cache: elem (BF16 / FP8 / F32) with fp8 kind `kind`, block Bs.
 * bf16 elements run every device path with bf16 queries; fp8 elements bf16 and fp32 queries
 * (auto); fp32 elements fp32 queries (auto). */
static void idx_case_paged(m3_gpu *g, const idx_shape *s, int prof, m3_kv_elem elem,
                           m3_fp8_kind kind, int Bs) {
    m3_profile p;
    profile_of(&p, prof);
    m3_indexer_params ip = {s->G, s->Di, s->B, s->K, s->local, s->init};
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 5000 + (uint64_t)s->T * 7 + (uint64_t)s->n_ctx + prof + Bs);
    const int T = s->T, C = s->n_ctx, ldq = s->G * s->Di, Di = s->Di;
    const int nbk = (C + s->B - 1) / s->B, W = m3_indexer_width(C, &ip, &p);
    float *iq = malloc((size_t)T * ldq * sizeof *iq), *ik = malloc((size_t)C * Di * sizeof *ik);
    m3_fill_normal(&r, iq, (int64_t)T * ldq, 1.0f);
    m3_fill_normal(&r, ik, (int64_t)C * Di, 1.0f);
    for (int j = 0; (s->pat & IDX_HOT) && j < C; j++)
        if ((j / s->B) % 256 < 3)
            for (int d = 0; d < Di; d++)
                ik[(size_t)j * Di + d] *= 3.0f;
    if (s->pat & IDX_NAN) { /* two rows: other lanes, tiles and pieces of the fp8 decode */
        ik[(size_t)(3 * s->B + 5) * Di + 7] = NAN;
        ik[(size_t)(5 * s->B + 98 % s->B) * Di + 100 % Di] = NAN;
    }
    if (s->pat & IDX_WIDEQ) iq[(size_t)(T - 1) * ldq + (s->G - 1) * Di + 3] = 1e20f;
    for (int64_t i = 0; i < (int64_t)T * ldq; i++)
        iq[i] = m3_round_bf16(iq[i]);
    if (elem != M3_KV_F32)
        for (int64_t i = 0; i < (int64_t)C * Di; i++)
            ik[i] = m3_round_bf16(ik[i]);
    /* a shuffled block table over a pool 3 blocks larger than the sequence */
    const int nl = (C + Bs - 1) / Bs, n_pool = nl + 3;
    int32_t *perm = malloc((size_t)n_pool * sizeof *perm);
    for (int i = 0; i < n_pool; i++)
        perm[i] = i;
    for (int i = n_pool - 1; i > 0; i--) {
        const int j = (int)(m3_rng_u32(&r) % (uint32_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    m3_block_table bt;
    memset(&bt, 0, sizeof bt);
    GPU_OK(m3_block_table_set(&bt, perm, nl, n_pool));
    m3_kv_geom kg;
    m3_kv_geom_init(&kg, 1, 16, Bs, Bs, M3_KV_FP8, kind);
    m3_kv_layer kl;
    m3_kv_layer_init(&kl, &kg, M3_KV_VIEW_BLOCK, Di, elem);
    GPU_OK(m3_kv_layer_reserve(&kl, n_pool));
    for (int j = 0; j < C; j++)
        m3_kv_index_write(&kl, m3_block_table_slot(&bt, Bs, j), ik + (size_t)j * Di,
                          M3_FP8_SATURATE);
    for (int j = 0; j < C; j++) /* the keys as the cache holds them (ref/layer.c reads them so) */
        m3_kv_index_read(&kl, m3_block_table_slot(&bt, Bs, j), ik + (size_t)j * Di);
    int32_t *pos = malloc(T * sizeof *pos);
    for (int t = 0; t < T; t++)
        pos[t] = s->prefill ? t : C - T + t;
    const size_t ntk = (size_t)s->G * T * W, nsc = (size_t)s->G * T * nbk, nmg = (size_t)s->G * T;
    int32_t *tk_ref = malloc(ntk * sizeof *tk_ref);
    float *sc_ref = malloc(nsc * sizeof *sc_ref), *mg_ref = malloc(nmg * sizeof *mg_ref);
    int ties_ref = 0;
    size_t sb = m3_indexer_scratch_bytes(C, &ip);
    void *scratch = malloc(sb);
    m3_indexer_topk(tk_ref, sc_ref, mg_ref, &ties_ref, iq, ldq, ik, pos, T, C, &ip, &p, scratch,
                    sb);
    free(scratch);
    const idx_store st = {&kl, &bt};
    for (int q = 0; q < 2; q++) { /* q 0: bf16 queries, 1: fp32 queries */
        const bool bf16q = q == 0;
        if ((elem == M3_KV_BF16 && !bf16q) || (elem == M3_KV_F32 && bf16q)) continue;
        const size_t n_path = sizeof idx_paths / sizeof idx_paths[0];
        for (size_t pi = 0; pi < n_path; pi++) {
            /* fp8 keys: the decode kernel (e4m3fn, bf16 queries) and the CUDA-core scorer; the
             * other scorers take bf16 keys only (they fall back to the CUDA-core one) */
            const int sc = idx_paths[pi].path & M3_GPU_IDX_SCORE;
            if (elem == M3_KV_FP8 && bf16q && sc != M3_GPU_IDX_AUTO && sc != M3_GPU_IDX_DECODE &&
                sc != M3_GPU_IDX_CUDA)
                continue;
            if (elem != M3_KV_BF16 && !bf16q && pi > 0) continue;
            const size_t mark = m3_gpu_mark(g);
            idx_run(g, s, &p, &ip, bf16q, iq, ik, pos, tk_ref, sc_ref, mg_ref, ties_ref,
                    idx_paths[pi].path, idx_paths[pi].name, &st);
            m3_gpu_release(g, mark);
        }
    }
    m3_kv_layer_free(&kl);
    m3_block_table_free(&bt);
    free(perm);
    free(iq);
    free(ik);
    free(pos);
    free(tk_ref);
    free(sc_ref);
    free(mg_ref);
}

static void indexer_paged_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const struct {
        idx_shape s;
        int Bs;
    } cases[] = {
        {{3, 4096, 4, 128, 128, 16, 1, 0, false, 0}, 128},       /* decode, M3 geometry */
        {{1, 9000, 4, 128, 128, 16, 1, 0, false, 0}, 128},       /* partial last block */
        {{300, 300, 4, 128, 128, 16, 1, 0, true, 0}, 128},       /* prefill */
        {{70, 5000, 4, 128, 128, 16, 1, 0, false, 0}, 128},      /* 5 token groups */
        {{2, 40000, 4, 128, 128, 16, 1, 0, false, 0}, 128},      /* two-stage selection */
        {{2, 3000, 4, 128, 128, 16, 1, 0, false, IDX_NAN}, 128}, /* NaN key row */
        {{5, 1000, 3, 80, 64, 5, 2, 1, false, 0}, 8},            /* Bs 8 < B (fixtures' Bs) */
        {{3, 5000, 8, 96, 32, 16, 2, 0, false, 0}, 48},          /* Bs 48, B 32: per-row mapping */
        {{2, 6000, 2, 64, 64, 8, 1, 1, false, 0}, 256},   /* Bs = 4 B: a row base per block */
        {{17, 3000, 4, 128, 128, 16, 1, 0, false, 0}, 8}, /* M3 scoring blocks over Bs 8 */
        /* more key blocks than the decode grid (547 > 4 per SM on 132 SMs): some scoring
         * blocks hold two key blocks, bf16 and fp8 elements */
        {{2, 70000, 4, 128, 128, 16, 1, 0, false, 0}, 128},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int prof = 0; prof < 3; prof++) {
            const int Bs = cases[i].Bs;
            idx_case_paged(g, &cases[i].s, prof, M3_KV_BF16, M3_FP8_E4M3FN, Bs);
            idx_case_paged(g, &cases[i].s, prof, M3_KV_FP8, prof ? M3_FP8_E4M3FN : M3_FP8_E4M3FNUZ,
                           Bs);
            if (prof != 1) idx_case_paged(g, &cases[i].s, prof, M3_KV_F32, M3_FP8_E4M3FN, Bs);
        }
    /* the long decode history (bench geometry, hot blocks), bf16 and fp8 elements, atom */
    static const idx_shape big = {1, 262044, 4, 128, 128, 16, 1, 0, false, IDX_HOT};
    idx_case_paged(g, &big, 2, M3_KV_BF16, M3_FP8_E4M3FN, 128);
    idx_case_paged(g, &big, 2, M3_KV_FP8, M3_FP8_E4M3FN, 128);
}

/* The fp8 (e4m3fn) decode cases alone, small enough for compute-sanitizer: the NaN key rows
 * (the decode's per-key NaN flags) and more key blocks than the decode grid, hf and atom. */
static void indexer_paged_fp8_decode(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const idx_shape cases[] = {
        {2, 3000, 4, 128, 128, 16, 1, 0, false, IDX_NAN},
        {2, 70000, 4, 128, 128, 16, 1, 0, false, 0},
        {3, 5000, 8, 64, 64, 16, 2, 0, false, IDX_NAN}, /* Di 64: one piece per lane */
        /* idx_km_k (T * G <= 8): Di 64, B 64 (one m-tile per warp); past 1024 key blocks
         * (the selection by scoring block) */
        {1, 5000, 8, 64, 64, 16, 2, 0, false, IDX_NAN},
        {1, 140000, 4, 128, 128, 16, 1, 0, false, IDX_NAN},
        /* a query row past fp16's range: idx_km_k's bf16 decode instead of the fp16 route */
        {1, 5000, 4, 128, 128, 16, 1, 0, false, IDX_WIDEQ},
        {2, 3000, 4, 128, 128, 16, 1, 0, false, IDX_NAN | IDX_WIDEQ},
        /* the bench's fp8 row (1024 key blocks, two per most scoring blocks, hot blocks in both
         * rounds) and unaligned queries */
        {1, 131072, 4, 128, 128, 16, 1, 0, false, IDX_HOT},
        {1, 5000, 4, 128, 128, 16, 1, 0, false, IDX_QOFF},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int prof = 1; prof < 3; prof++)
            idx_case_paged(g, &cases[i], prof, M3_KV_FP8, M3_FP8_E4M3FN, 128);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(indexer_topk_matches_ref),
        cmocka_unit_test(indexer_decode_t1),
        cmocka_unit_test(indexer_after_write),
        cmocka_unit_test(indexer_paged_matches_ref),
        cmocka_unit_test(indexer_paged_fp8_decode),
        cmocka_unit_test(indexer_two_contexts),
    };
    return M3_RUN_GPU_TESTS(tests);
}
