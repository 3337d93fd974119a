/* tests/gpu_moe.c: gpu/mlp.hip (swiglu_oai) and gpu/moe.hip (router logits, routing) against
 * their ref twins on fresh random inputs: M3 shapes (E = 128, K = 4, D = 6144, F = 3072)
 * and odd ones (T = 1, 3, 33; E = 9, K = 3; n not a multiple of the vector width).
 * Bounds: swiglu GPU_NMSE_F32 (fp32 profile) / GPU_NMSE_BF16; routing: expert ids equal
 * per token except rows whose reference margin is a near-tie (below ROUTE_TIE_MARGIN: a
 * device expf may differ from the host's by 1-2 ulp, which can only reorder candidates
 * that close), counted and printed; weights of agreeing rows GPU_NMSE_F32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/mlp.h"
#include "ref/moe.h"
#include "ref/quant.h"
#include "tests/gpu_test.h"

/* |sel_K - sel_K+1| below which a different K-th expert is a tie, not an error: sel is
 * O(1) and two device-vs-host expf ulps are ~2.4e-7 relative; 1e-6 leaves a margin. */
#define ROUTE_TIE_MARGIN 1e-6f

static void profile_of(m3_profile *p, int which) {
    if (which == 0) m3_profile_fp32(p);
    else if (which == 1) m3_profile_hf(p);
    else m3_profile_atom(p);
}

/* ---- swiglu ---------------------------------------------------------------------------- */
static void swiglu_case(m3_gpu *g, int64_t n, int prof) {
    m3_profile p;
    profile_of(&p, prof);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 500 + (uint64_t)n + (uint64_t)prof);
    float *gt = malloc(n * sizeof *gt), *up = malloc(n * sizeof *up);
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    m3_fill_normal(&r, gt, n, 4.0f); /* wide enough to hit both clamps at +-7 */
    m3_fill_normal(&r, up, n, 4.0f);
    const float alpha = 1.702f, limit = 7.0f;
    char what[128];
    if (p.swiglu != M3_SWIGLU_F32) { /* bf16 storage: bf16-valued inputs on both sides */
        m3_bf16 *dg = gpu_upload_bf16(g, gt, n, gt), *du = gpu_upload_bf16(g, up, n, up);
        m3_bf16 *da = gpu_guard_alloc(g, n * sizeof(m3_bf16));
        m3_swiglu(ref, gt, up, n, alpha, limit, &p);
        GPU_OK(m3_gpu_swiglu(g, da, dg, du, n, alpha, limit, &p));
        gpu_download_bf16(g, got, da, n);
        gpu_guard_check(g, da, n * sizeof(m3_bf16), "swiglu");
        snprintf(what, sizeof what, "swiglu bf16(%s,n=%lld)", p.name, (long long)n);
        gpu_expect_nmse(ref, got, n, GPU_NMSE_BF16, what);
    }
    float *dg = gpu_upload_f32(g, gt, n), *du = gpu_upload_f32(g, up, n);
    float *da = gpu_guard_alloc(g, n * sizeof(float));
    m3_swiglu(ref, gt, up, n, alpha, limit, &p);
    GPU_OK(m3_gpu_swiglu_f32(g, da, dg, du, n, alpha, limit, &p));
    gpu_download_f32(g, got, da, n);
    gpu_guard_check(g, da, n * sizeof(float), "swiglu_f32");
    snprintf(what, sizeof what, "swiglu_f32(%s,n=%lld)", p.name, (long long)n);
    gpu_expect_nmse(ref, got, n, p.swiglu == M3_SWIGLU_F32 ? GPU_NMSE_F32 : GPU_NMSE_BF16, what);
    free(gt); free(up); free(ref); free(got);
}

static void swiglu_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const int64_t ns[] = {3072, 33 * 3072, 4 * 12288, 9, 1001};
    for (int prof = 0; prof < 3; prof++)
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) swiglu_case(g, ns[i], prof);
}

/* Every m3_gpu_set_elem_variant variant (gpu/mlp.hip) writes exactly the bytes of variant 0
 * (the original kernel), under both bf16 rounding modes, for sizes that leave partial spans,
 * and in place (a = g: the read-only-path loads must be off then); inputs include NaN, +-inf
 * and values whose output is subnormal. */
#define ELEM_VARIANTS 12
static void swiglu_variants_same_bytes(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const int64_t ns[] = {8, 3 * 12288 + 8 * 77, 4 * 12288};
    for (int prof = 1; prof < 3; prof++)
        for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++)
            for (int inplace = 0; inplace < 2; inplace++) {
                const int64_t n = ns[s];
                m3_profile p;
                profile_of(&p, prof);
                m3_rng r;
                m3_rng_init(&r, m3_test_seed(), 560 + (uint64_t)n + (uint64_t)prof * 2 + inplace);
                float *gt = malloc(n * sizeof *gt), *up = malloc(n * sizeof *up);
                m3_bf16 *a0 = malloc(n * 2), *av = malloc(n * 2);
                m3_fill_normal(&r, gt, n, 4.0f);
                m3_fill_normal(&r, up, n, 4.0f);
                /* specials: NaN and infinities in either input (the hardware-conversion variants
                 * must fall back to the exact NaN bits), and subnormal outputs (g' far negative,
                 * u' + 1 = 2^-7) */
                static const float sg[] = {NAN, INFINITY, -INFINITY, 0.0f, 0.0f, -0.0f};
                static const float su[] = {0.5f, 0.5f, 0.5f, NAN, -INFINITY, INFINITY};
                for (int64_t i = 0; i < n; i++) {
                    if (i % 97 == 5) gt[i] = -45.0f - (float)(i % 8), up[i] = -0.9921875f;
                    if (i % 1009 < 6 && n > 8) gt[i] = sg[i % 1009], up[i] = su[i % 1009];
                }
                m3_bf16 *dg = gpu_upload_bf16(g, gt, n, NULL), *du = gpu_upload_bf16(g, up, n, NULL);
                m3_bf16 *dga = gpu_guard_alloc(g, n * 2), *da = gpu_guard_alloc(g, n * 2);
                for (int k = 0; k <= ELEM_VARIANTS; k++) { /* 0 first (the reference), then the default */
                    const int v = k == 0 ? 0 : k == 1 ? -1 : k - 1;
                    m3_gpu_set_elem_variant(v);
                    GPU_OK(m3_gpu_memset(g, da, 0xFF, n * 2));
                    GPU_OK(m3_gpu_copy(g, dga, dg, n * 2));
                    m3_bf16 *out = inplace ? dga : da;
                    GPU_OK(m3_gpu_swiglu(g, out, dga, du, n, 1.702f, 7.0f, &p));
                    GPU_OK(m3_gpu_download(g, k ? av : a0, out, n * 2));
                    gpu_guard_check(g, out, n * 2, "swiglu variant");
                    for (int64_t i = 0; k && i < n; i++)
                        if (av[i] != a0[i])
                            m3_test_failf("swiglu(%s,n=%lld,inplace=%d) variant %d [%lld]: %04x vs "
                                          "%04x", p.name, (long long)n, inplace, v, (long long)i,
                                          av[i], a0[i]);
                }
                m3_gpu_set_elem_variant(-1);
                free(gt); free(up); free(a0); free(av);
            }
}

/* ---- routing --------------------------------------------------------------------------- */
static void route_case(m3_gpu *g, int T, int E, int K, int prof, bool with_bias) {
    m3_profile p;
    profile_of(&p, prof);
    m3_moe_params mp;
    memset(&mp, 0, sizeof mp);
    mp.n_expert = E, mp.top_k = K, mp.dim = 6144, mp.ffn = 3072, mp.routed_scale = 2.0f;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 600 + (uint64_t)T * 3 + (uint64_t)E + (uint64_t)prof);
    float *logits = malloc((size_t)T * E * sizeof *logits), *bias = malloc(E * sizeof *bias);
    m3_fill_normal(&r, logits, (int64_t)T * E, 2.0f);
    m3_fill_uniform(&r, bias, E, -0.1f, 0.1f);
    if (p.router_dtype == M3_DT_BF16) /* bf16 logits are what such a router produces */
        for (int64_t i = 0; i < (int64_t)T * E; i++) logits[i] = m3_round_bf16(logits[i]);
    int32_t *ids_ref = malloc((size_t)T * K * sizeof *ids_ref), *ids = malloc((size_t)T * K * sizeof *ids);
    float *w_ref = malloc((size_t)T * K * sizeof *w_ref), *w = malloc((size_t)T * K * sizeof *w);
    float *m_ref = malloc(T * sizeof *m_ref), *m = malloc(T * sizeof *m);
    m3_moe_route(ids_ref, w_ref, m_ref, logits, with_bias ? bias : NULL, T, &mp, &p);

    float *dl = gpu_upload_f32(g, logits, (int64_t)T * E), *db = gpu_upload_f32(g, bias, E);
    int32_t *d_ids = gpu_guard_alloc(g, (size_t)T * K * sizeof(int32_t));
    float *d_w = gpu_guard_alloc(g, (size_t)T * K * sizeof(float));
    float *d_m = gpu_guard_alloc(g, (size_t)T * sizeof(float));
    GPU_OK(m3_gpu_moe_route(g, d_ids, d_w, d_m, dl, with_bias ? db : NULL, T, &mp, &p));
    GPU_OK(m3_gpu_download(g, ids, d_ids, (size_t)T * K * sizeof(int32_t)));
    gpu_download_f32(g, w, d_w, (int64_t)T * K);
    gpu_download_f32(g, m, d_m, T);
    gpu_guard_check(g, d_ids, (size_t)T * K * sizeof(int32_t), "route ids");
    gpu_guard_check(g, d_w, (size_t)T * K * sizeof(float), "route wts");
    gpu_guard_check(g, d_m, (size_t)T * sizeof(float), "route margin");
    int ties = 0;
    for (int t = 0; t < T; t++) {
        bool same = memcmp(ids + (size_t)t * K, ids_ref + (size_t)t * K, K * sizeof *ids) == 0;
        if (!same) {
            if (fabsf(m_ref[t]) <= ROUTE_TIE_MARGIN) {
                ties++;
                /* a tie flip: teacher-force the reference weights for this row */
                memcpy(w + (size_t)t * K, w_ref + (size_t)t * K, K * sizeof *w);
                continue;
            }
            m3_test_failf("route(%s,T=%d,E=%d,K=%d) token %d: gpu ids %d,%d,.. ref %d,%d,.. "
                          "(ref margin %g)", p.name, T, E, K, t, ids[(size_t)t * K],
                          ids[(size_t)t * K + 1], ids_ref[(size_t)t * K], ids_ref[(size_t)t * K + 1],
                          (double)m_ref[t]);
        }
    }
    char what[128];
    snprintf(what, sizeof what, "moe_route(%s,T=%d,E=%d,K=%d,bias=%d) wts [%d tie rows]", p.name,
             T, E, K, with_bias, ties);
    gpu_expect_nmse(w_ref, w, (int64_t)T * K, GPU_NMSE_F32, what);
    snprintf(what, sizeof what, "moe_route(%s,T=%d,E=%d,K=%d,bias=%d) margin", p.name, T, E, K,
             with_bias);
    /* the margin is a difference of nearby values: compare it absolutely per element */
    for (int t = 0; t < T; t++)
        if (!(fabsf(m[t] - m_ref[t]) <= 1e-6f) && !(isinf(m[t]) && isinf(m_ref[t])))
            m3_test_failf("%s token %d: gpu %g ref %g", what, t, (double)m[t], (double)m_ref[t]);
    free(logits); free(bias); free(ids_ref); free(ids); free(w_ref); free(w); free(m_ref); free(m);
}

static void moe_route_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    for (int prof = 0; prof < 3; prof++) {
        route_case(g, 1, 128, 4, prof, true);
        route_case(g, 33, 128, 4, prof, true);
        route_case(g, 4096, 128, 4, prof, true);
        route_case(g, 3, 128, 4, prof, false);
        route_case(g, 3, 9, 3, prof, true);
        route_case(g, 5, 4, 4, prof, true); /* K == E: margin +inf */
        route_case(g, 7, 256, 8, prof, true);  /* 8 experts a lane (M3_WARP 32) */
        route_case(g, 5, 64, 6, prof, false);
        route_case(g, 3, 200, 40, prof, true); /* K > M3_WARP */
        /* passes of >= 16384 tokens: route_fst_k (session 12; E <= 128, E % 4 == 0, K <= 8, and
         * since session 13 its 7 or 10 candidates <= E) */
        route_case(g, 16384, 128, 4, prof, true);
        route_case(g, 16400, 64, 6, prof, false);
        route_case(g, 16385, 100, 8, prof, true); /* the 7th lane's experts 96..99 only */
        route_case(g, 16384, 12, 2, prof, true);  /* lanes past E */
        /* fewer experts than route_fst_k's candidates: route_sel_k (session 13) */
        route_case(g, 16384, 4, 2, prof, true);
        route_case(g, 16384, 8, 6, prof, false);
    }
}

/* route_fst_k's proxy lists and exact candidate ranks (session 12; route_grp_k's packed keys
 * before) against exact ties and near-equal values in a pass of >= 16384 tokens: equal values
 * ranked by the lower id, every NaN above every value, runs of values a few ulps apart (ranked
 * exactly among the candidates, or the exact fallback at the boundary), all 128 equal; every
 * id and weight as the reference's. The first 4100 tokens again as a pass of their own:
 * route_sel_k with K = 4 / 8 compiled in (session 14). */
static void moe_route_ties_many_tokens(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    m3_profile p;
    m3_profile_fp32(&p);
    m3_moe_params mp;
    memset(&mp, 0, sizeof mp);
    const int T0 = 16400, E = 128;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 611);
    float *logits = malloc((size_t)T0 * E * sizeof *logits), *bias = malloc(E * sizeof *bias);
    m3_fill_normal(&r, logits, (int64_t)T0 * E, 2.0f);
    m3_fill_uniform(&r, bias, E, -0.1f, 0.1f);
    for (int t = 0; t < T0; t++) {
        float *l = logits + (size_t)t * E;
        const int kind = t % 7, o = (t * 37) % E;
        if (kind == 0) { /* five equal at the top, scattered ids */
            for (int e = 0; e < E; e++) l[e] = -1.0f;
            for (int i = 0; i < 5; i++) l[(o + 29 * i) % E] = 3.0f;
        } else if (kind == 1) { /* all equal */
            for (int e = 0; e < E; e++) l[e] = 0.25f;
        } else if (kind == 2) { /* two NaNs */
            l[o] = l[(o + 50) % E] = NAN;
        } else if (kind == 3) { /* six NaNs: ties across the K / K+1 boundary */
            for (int i = 0; i < 6; i++) l[(o + 21 * i) % E] = NAN;
        } else if (kind == 4) { /* six values ~40 ulps apart near sigma = 0.5, above the rest */
            for (int e = 0; e < E; e++) l[e] = -3.0f - 0.01f * (float)(e % 5);
            for (int i = 0; i < 6; i++) l[(o + 13 * i) % E] = 1e-5f * (float)((i * 5) % 6);
        } else if (kind == 5) { /* equal pairs straddling ranks K-1 and K */
            for (int e = 0; e < E; e++) l[e] = -2.0f;
            l[o] = 4.0f, l[(o + 1) % E] = 3.0f, l[(o + 7) % E] = 3.0f, l[(o + 60) % E] = 2.5f;
            l[(o + 61) % E] = 2.5f, l[(o + 90) % E] = 2.5f;
        }
    }
    float *dl = gpu_upload_f32(g, logits, (int64_t)T0 * E), *db = gpu_upload_f32(g, bias, E);
    for (int pass = 0; pass < 2; pass++)
        for (int K = 4; K <= 8; K += 4)
            for (int wb = 0; wb < 2; wb++) {
                const int T = pass ? 4100 : T0;
                mp.n_expert = E, mp.top_k = K;
                const float *b = wb ? bias : NULL;
                int32_t *ids = malloc((size_t)T * K * sizeof *ids);
                int32_t *want = malloc((size_t)T * K * sizeof *want);
                float *w = malloc((size_t)T * K * sizeof *w);
                float *wr = malloc((size_t)T * K * sizeof *wr);
                m3_moe_route(want, wr, NULL, logits, b, T, &mp, &p);
                int32_t *d_ids = gpu_guard_alloc(g, (size_t)T * K * sizeof(int32_t));
                float *d_w = gpu_guard_alloc(g, (size_t)T * K * sizeof(float));
                GPU_OK(m3_gpu_moe_route(g, d_ids, d_w, NULL, dl, b ? db : NULL, T, &mp, &p));
                GPU_OK(m3_gpu_download(g, ids, d_ids, (size_t)T * K * sizeof(int32_t)));
                gpu_download_f32(g, w, d_w, (int64_t)T * K);
                gpu_guard_check(g, d_ids, (size_t)T * K * sizeof(int32_t), "tie ids");
                gpu_guard_check(g, d_w, (size_t)T * K * sizeof(float), "tie wts");
                for (int t = 0; t < T; t++)
                    for (int k = 0; k < K; k++)
                        if (ids[(size_t)t * K + k] != want[(size_t)t * K + k])
                            m3_test_failf(
                                "route ties T=%d K=%d bias=%d token %d (kind %d) rank %d: "
                                "gpu %d ref %d",
                                T, K, wb, t, t % 7, k, ids[(size_t)t * K + k], want[(size_t)t * K + k]);
                char what[96];
                snprintf(what, sizeof what, "route ties T=%d K=%d bias=%d wts", T, K, wb);
                gpu_expect_nmse(wr, w, (int64_t)T * K, GPU_NMSE_F32, what);
                free(ids); free(want); free(w); free(wr);
            }
    free(logits); free(bias);
}

/* The router is a programmatic dependent launch (session 13): its first statement waits for the
 * launch before it. Two calls back to back, the second reading the first's weights [T, 8] as its
 * logits (E = 8, K = 2), with no synchronisation between them and the weights' buffer poisoned
 * (NaN) before the first: the second call's ids must be the reference's on the first call's
 * weights (route_sel_k at 4096 tokens, route_fst_k at 16384; the first call lets the second
 * start at once). The second call has biases, which it reads before its wait (session 15). */
static void moe_route_chained(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    m3_profile p;
    m3_profile_fp32(&p);
    for (int T = 4096; T <= 16384; T *= 4) {
        m3_moe_params m1, m2;
        memset(&m1, 0, sizeof m1);
        m1.n_expert = 128, m1.top_k = 8;
        m2 = m1;
        m2.n_expert = 8, m2.top_k = 2;
        m3_rng r;
        m3_rng_init(&r, m3_test_seed(), 620 + (uint64_t)T);
        float *logits = malloc((size_t)T * 128 * sizeof *logits), *w1 = malloc((size_t)T * 8 * sizeof *w1);
        int32_t *ids = malloc((size_t)T * 2 * sizeof *ids), *want = malloc((size_t)T * 2 * sizeof *want);
        float *wr = malloc((size_t)T * 2 * sizeof *wr), *mr = malloc((size_t)T * sizeof *mr);
        m3_fill_normal(&r, logits, (int64_t)T * 128, 2.0f);
        float *dl = gpu_upload_f32(g, logits, (int64_t)T * 128);
        /* the second call's biases: read before that call waits for the first (m3_gpu_moe_route's
         * ordering contract), so while the first call still runs */
        float b2[8];
        m3_fill_normal(&r, b2, 8, 0.3f);
        float *db2 = gpu_upload_f32(g, b2, 8);
        int32_t *d_ids1 = gpu_guard_alloc(g, (size_t)T * 8 * sizeof(int32_t));
        int32_t *d_ids2 = gpu_guard_alloc(g, (size_t)T * 2 * sizeof(int32_t));
        float *d_w1 = gpu_guard_alloc(g, (size_t)T * 8 * sizeof(float));
        float *d_w2 = gpu_guard_alloc(g, (size_t)T * 2 * sizeof(float));
        GPU_OK(m3_gpu_memset(g, d_w1, 0xFF, (size_t)T * 8 * sizeof(float))); /* NaN */
        GPU_OK(m3_gpu_moe_route(g, d_ids1, d_w1, NULL, dl, NULL, T, &m1, &p));
        GPU_OK(m3_gpu_moe_route(g, d_ids2, d_w2, NULL, d_w1, db2, T, &m2, &p));
        gpu_download_f32(g, w1, d_w1, (int64_t)T * 8);
        GPU_OK(m3_gpu_download(g, ids, d_ids2, (size_t)T * 2 * sizeof(int32_t)));
        m3_moe_route(want, wr, mr, w1, b2, T, &m2, &p);
        for (int t = 0; t < T; t++)
            if ((ids[2 * t] != want[2 * t] || ids[2 * t + 1] != want[2 * t + 1]) && !(fabsf(mr[t]) <= ROUTE_TIE_MARGIN))
                m3_test_failf("route chained T=%d token %d: gpu %d,%d ref %d,%d (first weights %g %g ..)", T, t,
                              ids[2 * t], ids[2 * t + 1], want[2 * t], want[2 * t + 1], (double)w1[8 * t],
                              (double)w1[8 * t + 1]);
        gpu_guard_check(g, d_ids2, (size_t)T * 2 * sizeof(int32_t), "chained ids");
        free(logits); free(w1); free(ids); free(want); free(wr); free(mr);
    }
}

/* Discrete tie rule: equal selection values go to the lower expert id. */
static void moe_route_ties_go_to_lower_id(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    m3_profile p;
    m3_profile_fp32(&p);
    m3_moe_params mp;
    memset(&mp, 0, sizeof mp);
    mp.n_expert = 128, mp.top_k = 4;
    float logits[128];
    for (int e = 0; e < 128; e++) logits[e] = -1.0f;
    logits[77] = logits[5] = logits[100] = logits[64] = logits[33] = 3.0f; /* five equal */
    float *dl = gpu_upload_f32(g, logits, 128);
    int32_t *d_ids = gpu_guard_alloc(g, 4 * sizeof(int32_t));
    float *d_w = gpu_guard_alloc(g, 4 * sizeof(float));
    GPU_OK(m3_gpu_moe_route(g, d_ids, d_w, NULL, dl, NULL, 1, &mp, &p));
    int32_t ids[4];
    GPU_OK(m3_gpu_download(g, ids, d_ids, sizeof ids));
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 33);
    assert_int_equal(ids[2], 64);
    assert_int_equal(ids[3], 77);
    gpu_guard_check(g, d_ids, 4 * sizeof(int32_t), "tie ids");
    /* NaN logits rank above every value, among themselves by the lower id (ref's rule) */
    logits[90] = logits[12] = NAN;
    GPU_OK(m3_gpu_upload(g, dl, logits, sizeof logits));
    GPU_OK(m3_gpu_moe_route(g, d_ids, d_w, NULL, dl, NULL, 1, &mp, &p));
    GPU_OK(m3_gpu_download(g, ids, d_ids, sizeof ids));
    int32_t want[4];
    float wr[4];
    m3_moe_route(want, wr, NULL, logits, NULL, 1, &mp, &p);
    assert_int_equal(want[0], 12);
    assert_int_equal(want[1], 90);
    for (int i = 0; i < 4; i++) assert_int_equal(ids[i], want[i]);
}

/* Router logits: bf16 x, gate held in bf16, bf16 logits (hf/atom), against ref. */
static void router_logits_match_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const int Ts[] = {1, 33};
    for (size_t i = 0; i < 2; i++) {
        const int T = Ts[i], E = 128, D = 6144;
        m3_profile p;
        m3_profile_hf(&p);
        m3_moe_params mp;
        memset(&mp, 0, sizeof mp);
        mp.n_expert = E, mp.top_k = 4, mp.dim = D, mp.ffn = 3072;
        m3_rng r;
        m3_rng_init(&r, m3_test_seed(), 700 + T);
        float *x = malloc((size_t)T * D * sizeof *x), *gate = malloc((size_t)E * D * sizeof *gate);
        float *ref = malloc((size_t)T * E * sizeof *ref), *got = malloc((size_t)T * E * sizeof *got);
        m3_fill_normal(&r, x, (int64_t)T * D, 1.0f);
        m3_fill_normal(&r, gate, (int64_t)E * D, 0.02f);
        m3_bf16 *dx = gpu_upload_bf16(g, x, (int64_t)T * D, x);
        m3_bf16 *dgate = gpu_upload_bf16(g, gate, (int64_t)E * D, NULL);
        void *scratch = malloc(m3_moe_scratch_bytes(T, &mp));
        m3_moe_router_logits(ref, x, T, gate, &mp, &p, scratch);
        float *dl = gpu_guard_alloc(g, (size_t)T * E * sizeof(float));
        GPU_OK(m3_gpu_moe_router_logits(g, dl, dx, T, dgate, &mp, &p));
        gpu_download_f32(g, got, dl, (int64_t)T * E);
        gpu_guard_check(g, dl, (size_t)T * E * sizeof(float), "router_logits");
        char what[96];
        snprintf(what, sizeof what, "moe_router_logits(hf,T=%d,E=%d,D=%d)", T, E, D);
        gpu_expect_nmse(ref, got, (int64_t)T * E, GPU_NMSE_BF16, what);
        free(x); free(gate); free(ref); free(got); free(scratch);
    }
}

/* ---- routed experts ------------------------------------------------------------------------
 * m3_gpu_moe_experts against ref's m3_moe_experts. bf16 weights: the same bf16 arrays on both
 * sides. MX weights: random f32 weights (rows scaled by 2^-3..2^3 so block scales vary)
 * quantized with ref/quant.c (scale rule EVEN, the checkpoint rule), uploaded as codes +
 * scales; the reference runs on m3_mx_dequantize's f32 values (exact, ref/num/mx.h), so the
 * two sides compute the same math and only the fp32 reduction order differs. Bound:
 * GPU_NMSE_BF16 (one bf16 rounding of g/u/a/y_e per side, occasionally flipped). */
typedef struct {
    int E, D, F;
    float *gate, *up, *down; /* f32 masters [E,F,D], [E,F,D], [E,D,F] */
} exp_master;

/* per-row magnitudes 2^-spread .. 2^spread (spread 3: the usual; wider spreads reach block
 * scales whose bf16 multiplier in the decode GEMV is not a normal bf16: its float path) */
static void master_make_spread(exp_master *w, int E, int D, int F, uint64_t stream, int spread) {
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), stream);
    w->E = E, w->D = D, w->F = F;
    const int64_t n = (int64_t)E * F * D;
    w->gate = malloc(n * sizeof(float));
    w->up = malloc(n * sizeof(float));
    w->down = malloc(n * sizeof(float));
    assert_true(w->gate && w->up && w->down);
    float *mats[3] = {w->gate, w->up, w->down};
    const int cols[3] = {D, D, F};
    const float amp = 2.0f / sqrtf((float)D);
    for (int m = 0; m < 3; m++) {
        m3_fill_uniform(&r, mats[m], n, -amp, amp);
        const int64_t rows = n / cols[m];
        for (int64_t i = 0; i < rows; i++) { /* per-row magnitude: varied block scales */
            const float f = ldexpf(1.0f, (int)(m3_rng_u32(&r) % (uint32_t)(2 * spread + 1)) - spread);
            for (int c = 0; c < cols[m]; c++) mats[m][i * cols[m] + c] *= f;
        }
    }
}

static void master_make(exp_master *w, int E, int D, int F, uint64_t stream) {
    master_make_spread(w, E, D, F, stream, 3);
}

static void master_free(exp_master *w) {
    free(w->gate); free(w->up); free(w->down);
}

static const char *fmt_name(m3_gpu_wfmt f) {
    return f == M3_GPU_W_BF16 ? "bf16" : (f == M3_GPU_W_MXFP8 ? "mxfp8" : "mxfp4");
}

/* While nonzero (moe_experts_mxfp8_nan), weights_to plants e4m3fn NaN codes into MXFP8
 * matrices of a case with D = g_nan_D: gate and up [E*F, D] get code 0x7F at row 5, column 9
 * (expert 0's output 5: its tokens' whole y rows become NaN); down [E*D, F] gets 0xFF in
 * row 7 + 13e, column 3e of every expert e (one NaN output of each expert's tokens). */
static int g_nan_D, g_nan_partial; /* g_nan_partial: cases with NaN and finite outputs */

/* While nonzero (moe_experts_mx_extremes), weights_to plants the NaN block scale 0xFF into
 * MX matrices of a case with D = g_mx_D: gate and up on row 5, block 1 (expert 0's output 5:
 * its tokens' y rows NaN); down on row 7 + 13e, block e % nb of every expert e (one NaN
 * output of each expert's tokens). experts_case then also spreads x: token t's row by
 * 2^(+-60), elements by 2^(-30 .. 30). (Block scales whose weights or products pass the fp32
 * range are not planted: where sums overflow depends on the summation order, docs/gpu-log/moe.md.) */
static int g_mx_D;
static int64_t g_mx_nonfinite, g_mx_finite; /* reference outputs over the cases */

static void plant_mx_scales(m3_e8m0 *sc, int64_t rows, int cols, int64_t nb) {
    if (cols == g_mx_D) {
        sc[5 * nb + 1] = 0xFF;
        return;
    }
    const int64_t E = rows / g_mx_D;
    for (int64_t e = 0; e < E; e++) sc[(e * g_mx_D + 7 + 13 * e) * nb + e % nb] = 0xFF;
}

static void plant_nan(uint8_t *codes, int64_t rows, int cols, int64_t rb) {
    if (cols == g_nan_D) {
        codes[5 * rb + 9] = 0x7F;
        return;
    }
    const int64_t E = rows / g_nan_D;
    for (int64_t e = 0; e < E; e++) codes[(e * g_nan_D + 7 + 13 * e) * rb + (3 * e) % cols] = 0xFF;
}

/* the least and largest MX block scale byte weights_to has produced since the last reset
 * (experts_case passes them as m3_gpu_experts.mx_scale_lo / hi, as an upload scan would) */
static int g_sc_lo = 255, g_sc_hi = 0;

/* experts_case sets one element of every x row (column 7 + t % 5) to 2^g_x_huge while it is
 * nonzero (120: x * 2^8 overflows bf16, the MXFP4 decode's fallback to unscaled x) */
static int g_x_huge;

/* swiglu's limit of the cases (case_params; moe_experts_mx4_a_bound sets +inf) */
static float g_limit = 7.0f;

/* MXFP4 decode cases that ran with the scale-range hint's one-multiply decode
 * (m3_gpu_moe_mx4_fast) and again without the hint, bit-identical (experts_case) */
static int g_mx4_twins;

/* Device copy of one matrix in format f, and the host values the reference must use
 * (written into ref_vals: bf16-rounded or MX-dequantized f32). */
static void weights_to(m3_gpu *g, m3_gpu_wfmt f, const float *src, int64_t rows, int cols,
                       const void **d_codes, const m3_e8m0 **d_scales, float *ref_vals,
                       uint8_t **h_codes, m3_e8m0 **h_scales) {
    const int64_t n = rows * cols;
    if (f == M3_GPU_W_BF16) {
        *d_codes = gpu_upload_bf16(g, src, n, ref_vals);
        *d_scales = NULL;
        return;
    }
    m3_mx_params mx = m3_mx_params_default(f == M3_GPU_W_MXFP8 ? M3_MX_E4M3FN : M3_MX_E2M1);
    const int64_t rb = m3_mx_row_bytes(cols, &mx), nb = m3_mx_n_blocks(cols, &mx);
    uint8_t *codes = malloc((size_t)(rows * rb));
    m3_e8m0 *sc = malloc((size_t)(rows * nb));
    assert_true(codes && sc);
    assert_true(rows <= INT32_MAX);
    m3_mx_quantize(codes, sc, src, (int)rows, cols, &mx);
    if (g_nan_D && f == M3_GPU_W_MXFP8) plant_nan(codes, rows, cols, rb);
    if (g_mx_D) plant_mx_scales(sc, rows, cols, nb);
    for (int64_t i = 0; i < rows * nb; i++) {
        g_sc_lo = sc[i] < g_sc_lo ? sc[i] : g_sc_lo;
        g_sc_hi = sc[i] > g_sc_hi ? sc[i] : g_sc_hi;
    }
    m3_mx_dequantize(ref_vals, codes, sc, (int)rows, cols, &mx);
    void *dc, *ds;
    GPU_OK(m3_gpu_alloc(g, &dc, (size_t)(rows * rb)));
    GPU_OK(m3_gpu_upload(g, dc, codes, (size_t)(rows * rb)));
    GPU_OK(m3_gpu_alloc(g, &ds, (size_t)(rows * nb)));
    GPU_OK(m3_gpu_upload(g, ds, sc, (size_t)(rows * nb)));
    *d_codes = dc;
    *d_scales = ds;
    if (h_codes) { /* the caller keeps the host copies (ref on m3_wq weights) */
        *h_codes = codes;
        *h_scales = sc;
    } else {
        free(codes);
        free(sc);
    }
}

/* ids [T,K]: K distinct experts per token (a partial Fisher-Yates draw); wts [T,K] positive,
 * summing to 1 per token. E <= 1024. */
static void random_routing(m3_rng *r, int32_t *ids, float *wts, int T, int E, int K) {
    for (int t = 0; t < T; t++) {
        int perm[1024];
        for (int e = 0; e < E; e++) perm[e] = e;
        float sum = 0;
        for (int k = 0; k < K; k++) {
            int j = k + (int)(m3_rng_u32(r) % (uint32_t)(E - k)), tmp = perm[k];
            perm[k] = perm[j], perm[j] = tmp;
            ids[(size_t)t * K + k] = perm[k];
            wts[(size_t)t * K + k] = m3_rng_uniform(r, 0.05f, 1.0f);
            sum += wts[(size_t)t * K + k];
        }
        for (int k = 0; k < K; k++) wts[(size_t)t * K + k] /= sum;
    }
}

/* experts_case routes every token's first slot to expert 0 while this is set (one expert
 * with all T rows: the decode GEMV's passes over more staged rows than one pass holds) */
static bool g_skew_expert0;

/* experts_case sets m3_gpu_experts.portable from this (moe_experts_portable_paths) */
static int g_portable;

/* While set (moe_experts_tile_rows, K = 2, T = 449), experts_case routes slot 0 of the tokens
 * to experts 0..4 in runs of 1, 63, 65, 159 and 161 tokens and slot 1 to experts 5, 6, 7 in
 * turn: expert row counts 1, 63, 65, 159, 161, 150, 150, 149 (around the 64-row warpgroup
 * and the 128 / 160 / 192-row tile edges of the prefill kernels) */
static bool g_fixed_rows;

/* experts_case sets m3_gpu_experts.tile_sm80 from this (moe_experts_tile_rows: tile2_k where
 * the Hopper wgmma kernel would run) */
static int g_sm80;
static const int g_rows_of[5] = {1, 63, 65, 159, 161};

/* the expert-call parameters of a case: the master's shapes, swiglu_oai's M3 constants */
static m3_moe_params case_params(const exp_master *wm, int K) {
    m3_moe_params mp;
    memset(&mp, 0, sizeof mp);
    mp.n_expert = wm->E, mp.top_k = K, mp.dim = wm->D, mp.ffn = wm->F, mp.routed_scale = 2.0f;
    mp.alpha = 1.702f, mp.limit = g_limit;
    return mp;
}

/* the case globals' routing patterns over random_routing's ids: expert 0 in every token's
 * slot 0 (g_skew_expert0), or g_fixed_rows' per-expert row counts in slot 0 */
static void shape_routing(int32_t *ids, int T, int E, int K) {
    for (int t = 0; g_skew_expert0 && t < T; t++) /* swap expert 0 into slot 0 */
        for (int k = 1; k < K; k++)
            if (ids[(size_t)t * K + k] == 0) ids[(size_t)t * K + k] = ids[(size_t)t * K];
    for (int t = 0; g_skew_expert0 && t < T; t++) ids[(size_t)t * K] = 0;
    if (g_fixed_rows) {
        assert_true(K == 2 && E == 8 && T == 449);
        for (int t = 0, e = 0, left = g_rows_of[0]; t < T; t++) {
            while (left == 0) left = g_rows_of[++e];
            ids[(size_t)t * K] = e, left--;
            ids[(size_t)t * K + 1] = 5 + t % 3;
        }
    }
}

static void experts_case(m3_gpu *g, const exp_master *wm, int T, int K, m3_gpu_wfmt fmt, int prof) {
    const int E = wm->E, D = wm->D, F = wm->F;
    m3_profile p;
    profile_of(&p, prof);
    const m3_moe_params mp = case_params(wm, K);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 800 + (uint64_t)T * 7 + (uint64_t)fmt * 3 + (uint64_t)prof);
    const size_t mark = m3_gpu_mark(g);
    /* weights in the case's format; the reference's values */
    const int64_t ngu = (int64_t)E * F * D;
    float *rg = malloc(ngu * sizeof(float)), *ru = malloc(ngu * sizeof(float)), *rd = malloc(ngu * sizeof(float));
    assert_true(rg && ru && rd);
    m3_gpu_experts dw;
    memset(&dw, 0, sizeof dw);
    dw.fmt = fmt;
    dw.portable = g_portable;
    dw.tile_sm80 = g_sm80;
    /* the codes quantized from finite values hold no NaN code: say so, as gpu/layer.hip's upload
     * scan does, so the MXFP8 cases run the production decode without the per-piece NaN test;
     * the NaN-planting cases keep the test (finite_codes 0) */
    dw.finite_codes = g_nan_D == 0;
    g_sc_lo = 255, g_sc_hi = 0;
    weights_to(g, fmt, wm->gate, (int64_t)E * F, D, &dw.gate, &dw.gate_s, rg, NULL, NULL);
    weights_to(g, fmt, wm->up, (int64_t)E * F, D, &dw.up, &dw.up_s, ru, NULL, NULL);
    weights_to(g, fmt, wm->down, (int64_t)E * D, F, &dw.down, &dw.down_s, rd, NULL, NULL);
    if (fmt != M3_GPU_W_BF16) /* the scale range, as an upload scan would give it */
        dw.mx_scale_lo = g_sc_lo, dw.mx_scale_hi = g_sc_hi;
    m3_mlp_weights *ex = calloc((size_t)E, sizeof *ex);
    for (int e = 0; e < E; e++) {
        ex[e].fmt = M3_WFMT_F32;
        ex[e].gate = rg + (size_t)e * F * D;
        ex[e].up = ru + (size_t)e * F * D;
        ex[e].down = rd + (size_t)e * D * F;
    }
    m3_moe_weights w;
    memset(&w, 0, sizeof w);
    w.experts = ex;
    /* inputs: bf16-valued x, K distinct experts per token, positive weights summing to 1 */
    float *x = malloc((size_t)T * D * sizeof *x), *ref = malloc((size_t)T * D * sizeof *ref);
    float *got = malloc((size_t)T * D * sizeof *got), *wts = malloc((size_t)T * K * sizeof *wts);
    int32_t *ids = malloc((size_t)T * K * sizeof *ids);
    m3_fill_normal(&r, x, (int64_t)T * D, 1.0f);
    for (int t = 0; g_mx_D && t < T; t++) { /* x over a wide range of magnitudes */
        const int row_e = t % 3 == 0 ? 60 : (t % 3 == 1 ? -60 : 0);
        for (int k = 0; k < D; k++)
            x[(size_t)t * D + k] = ldexpf(x[(size_t)t * D + k], row_e + (int)(m3_rng_u32(&r) % 61u) - 30);
    }
    for (int t = 0; g_x_huge && t < T; t++) x[(size_t)t * D + 7 + t % 5] = ldexpf(1.0f, g_x_huge);
    random_routing(&r, ids, wts, T, E, K);
    shape_routing(ids, T, E, K);
    m3_bf16 *dx = gpu_upload_bf16(g, x, (int64_t)T * D, x);
    int32_t *dids;
    GPU_OK(m3_gpu_alloc(g, (void **)&dids, (size_t)T * K * sizeof *ids));
    GPU_OK(m3_gpu_upload(g, dids, ids, (size_t)T * K * sizeof *ids));
    float *dwts = gpu_upload_f32(g, wts, (int64_t)T * K);
    m3_bf16 *dy = gpu_guard_alloc(g, (size_t)T * D * sizeof(m3_bf16));
    void *scratch = malloc(m3_moe_scratch_bytes(T, &mp));
    assert_int_equal(m3_moe_experts(ref, x, ids, wts, T, &w, &mp, &p, scratch), M3_OK);
    GPU_OK(m3_gpu_moe_experts(g, dy, dx, dids, dwts, T, &dw, &mp, &p));
    gpu_download_bf16(g, got, dy, (int64_t)T * D);
    gpu_guard_check(g, dy, (size_t)T * D * sizeof(m3_bf16), "moe_experts y");
    if (m3_gpu_moe_mx4_fast(&dw) && T * K <= 4 * E && !dw.portable) {
        /* the decode the scale range allows (one multiply a code pair, no per-step test)
         * against the unhinted one (the per-step vote): the same bits */
        m3_gpu_experts d2 = dw;
        d2.mx_scale_lo = d2.mx_scale_hi = 0;
        assert_int_equal(m3_gpu_moe_mx4_fast(&d2), 0);
        const size_t yb = (size_t)T * D * sizeof(m3_bf16);
        m3_bf16 *dy2 = gpu_guard_alloc(g, yb);
        GPU_OK(m3_gpu_moe_experts(g, dy2, dx, dids, dwts, T, &d2, &mp, &p));
        gpu_guard_check(g, dy2, yb, "moe_experts y (no scale range)");
        m3_bf16 *h1 = malloc(yb), *h2 = malloc(yb);
        assert_true(h1 && h2);
        GPU_OK(m3_gpu_download(g, h1, dy, yb));
        GPU_OK(m3_gpu_download(g, h2, dy2, yb));
        for (int64_t i = 0; i < (int64_t)T * D; i++)
            if (memcmp(&h1[i], &h2[i], sizeof h1[i]))
                m3_test_failf("moe_experts mxfp4 T=%d: element %lld: 0x%04x with the scale range, "
                              "0x%04x without", T, (long long)i, (unsigned)h1[i], (unsigned)h2[i]);
        free(h1);
        free(h2);
        g_mx4_twins++;
    }
    char what[128];
    snprintf(what, sizeof what, "moe_experts %s(%s,T=%d,E=%d,K=%d,D=%d,F=%d,%s)", fmt_name(fmt),
             p.name, T, E, K, D, F, T * K <= 4 * E ? "gemv" : "tiles");
    if (g_nan_D) { /* not vacuous: some outputs NaN, some finite (gpu_nmse: NaN where ref is) */
        int64_t nn = 0;
        for (int64_t i = 0; i < (int64_t)T * D; i++) nn += isnan(ref[i]) != 0;
        printf("  %lld of %lld reference outputs NaN\n", (long long)nn, (long long)T * D);
        assert_true(nn > 0);
        g_nan_partial += nn < (int64_t)T * D;
    }
    if (g_mx_D) {
        int64_t nf = 0;
        for (int64_t i = 0; i < (int64_t)T * D; i++) nf += !isfinite(ref[i]);
        printf("  %lld of %lld reference outputs not finite\n", (long long)nf, (long long)T * D);
        g_mx_nonfinite += nf, g_mx_finite += (int64_t)T * D - nf;
    }
    bool all_nan = g_nan_D != 0 || g_mx_D != 0; /* (gpu_nmse needs a finite reference output) */
    for (int64_t i = 0; all_nan && i < (int64_t)T * D; i++) all_nan = !isfinite(ref[i]);
    if (all_nan) {
        for (int64_t i = 0; i < (int64_t)T * D; i++)
            if (!(isnan(got[i]) ? isnan(ref[i]) : got[i] == ref[i]))
                m3_test_failf("%s: element %lld: ref %g, gpu %g", what, (long long)i, (double)ref[i], (double)got[i]);
        printf("  %-58s none finite, as ref\n", what);
    } else {
        gpu_expect_nmse(ref, got, (int64_t)T * D, GPU_NMSE_BF16, what);
    }
    m3_gpu_release(g, mark);
    free(rg); free(ru); free(rd); free(ex); free(x); free(ref); free(got); free(wts); free(ids);
    free(scratch);
}

static void moe_experts_small(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master wm;
    master_make(&wm, 8, 256, 192, 810);
    static const int Ts[] = {1, 5, 13, 37, 300}; /* gemv (1, 5, 13: >4 rows an expert) and tiles */
    g_mx4_twins = 0;
    for (int f = 0; f < 3; f++)
        for (int prof = 1; prof < 3; prof++)
            for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
                experts_case(g, &wm, Ts[i], 2, (m3_gpu_wfmt)f, prof);
    master_free(&wm);
    /* the MXFP4 decode cases (scale bytes <= 128) ran the hinted decode and matched the
     * unhinted one bit for bit (none on a device without the NVIDIA decode GEMVs) */
    printf("  %d MXFP4 decode cases: the scale-range decode bit-identical to the vote\n", g_mx4_twins);
    if (!g_portable && m3_gpu_moe_mx4_fast(&(m3_gpu_experts){.fmt = M3_GPU_W_MXFP4, .mx_scale_hi = 128}))
        assert_int_equal(g_mx4_twins, 6);
    /* one token with K = 6 slots (the cases above have K = 2): the T = 1 MX kernels (dq1_k) with
     * 6 slots' tiles counted per chunk of outputs before the combine */
    master_make(&wm, 8, 256, 192, 811);
    for (int f = 1; f < 3; f++)
        for (int prof = 1; prof < 3; prof++) experts_case(g, &wm, 1, 6, (m3_gpu_wfmt)f, prof);
    master_free(&wm);
}

/* MX block scales across 2^-30 .. 2^30: the decode GEMV's exact bf16 multiply covers block
 * scales up to 2^15 (MXFP8) / 2^1 (MXFP4); larger ones (and the reference values they give)
 * go through its float path. Rows of one matrix differ by up to 2^60, so the NMSE is set by
 * the large rows: this case checks the path is taken correctly, the others check precision. */
static void moe_experts_wide_scales(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master wm;
    master_make_spread(&wm, 8, 256, 192, 815, 30);
    static const int Ts[] = {1, 5, 13};
    for (int f = 1; f < 3; f++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
            experts_case(g, &wm, Ts[i], 2, (m3_gpu_wfmt)f, 2);
    master_free(&wm);
}

/* E 8, D 256, F 192 masters with gate and up times gu, down times dn */
static void master_make_scaled(exp_master *wm, uint64_t stream, float gu, float dn) {
    master_make(wm, 8, 256, 192, stream);
    const int64_t n = (int64_t)wm->E * wm->F * wm->D;
    for (int64_t i = 0; i < n; i++) wm->gate[i] *= gu, wm->up[i] *= gu, wm->down[i] *= dn;
}

/* the MXFP4 cases of the staged-x range: T = 1, 5, 13, both profiles, x as g_x_huge says */
static void staged_x_cases(m3_gpu *g, const exp_master *wm) {
    static const int Ts[] = {1, 5, 13};
    for (int prof = 1; prof < 3; prof++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            const int tw = g_mx4_twins;
            experts_case(g, wm, Ts[i], 2, M3_GPU_W_MXFP4, prof);
            /* the staged-x decode ran and matched the unhinted one (NVIDIA) */
            if (m3_gpu_moe_mx4_fast(&(m3_gpu_experts){.fmt = M3_GPU_W_MXFP4, .mx_scale_hi = 128}))
                assert_int_equal(g_mx4_twins, tw + 1);
            /* not vacuous: the range takes the staged-x path */
            printf("  x at 2^%d, limit %g: scale bytes %d .. %d\n", g_x_huge, (double)g_limit,
                   g_sc_lo, g_sc_hi);
            assert_true(g_sc_hi > 128 && g_sc_hi <= 136 && g_sc_lo >= 3);
        }
}

/* staged_x_cases with one x element of every row at 2^e, then at 2^120 (gate/up's x * 2^8
 * overflows: the unscaled fallback / WIDE loop); e 0: no planted element */
static void staged_x_cases_at(m3_gpu *g, const exp_master *wm, int e) {
    for (int i = 0; i < 2; i++) {
        g_x_huge = i ? 120 : e;
        staged_x_cases(g, wm);
    }
    g_x_huge = 0;
}

/* MXFP4 block scales in (2^1, 2^9] (the weights times 2^5: scale bytes above 128 and at most
 * 136), given as m3_gpu_experts.mx_scale_lo / hi: the decode stages x times 2^8 and multiplies
 * each code pair once (mx4_xsh in gpu/moe.hip); then the same with one x element of every
 * row at 2^120, where x * 2^8 overflows and the kernels stage x unscaled (the per-piece path
 * for the scales above 2^1). Decode T = 1, 5, 13, both profiles; bound of moe_experts_small. */
static void moe_experts_mx4_staged_x(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master wm;
    master_make_scaled(&wm, 821, 32.0f, 32.0f);
    staged_x_cases_at(g, &wm, 0);
    master_free(&wm);
}

/* The MXFP4 decode (T = 1, 5, 13) with the staged-x range (xsh 8) where the down kernel's x,
 * swiglu's a, is bounded by the clamps (limit 7: dq1_k's down kernel without its overflow test
 * and WIDE loop, t1_fk in gpu/moe.hip) and where it is not (limit +inf: the down kernel keeps
 * them), each against the unhinted decode bit for bit and against ref. Limit 7: one x element
 * of every row at 2^20 (g and u far past the limit: a at the clamps, (L + 1) L sigmoid(alpha L)
 * and the like) and at 2^120 (gate/up's x * 2^8 overflows: its WIDE loop), the down weights
 * below 2^11 (block scales up to 2^9, byte 136 under the EVEN rule: the largest the range
 * allows). Limit +inf: one x element at 2^58 and gate / up weights of 24 on its column, so
 * a = g sigmoid(alpha g) (u + 1) reaches 2^125 (a * 2^8 overflows: the down kernel stages a
 * unscaled), down weights below 2^-13 (y finite). */
static void moe_experts_mx4_a_bound(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master wm;
    master_make_scaled(&wm, 822, 32.0f, 2048.0f);
    staged_x_cases_at(g, &wm, 20);
    assert_int_equal(g_sc_hi, 136); /* the staged-x range at its top (the down weights': the
                                     * same masters in every case) */
    /* limit +inf: not vacuous: gate and up weight 24 (6 x 2^2, exact in MXFP4: its block's
     * amax) in x columns 7 .. 11 (the huge element's) of outputs 0 .. 3 of every expert, so with
     * x at 2^58, g = u ~ 2^58 x 24 and a ~ 2^125 in every case's rows; at most 2^126 (weights
     * up to 2^5), y below 2^122 (down weights below 2^-13) */
    const int64_t n = (int64_t)wm.E * wm.F * wm.D;
    for (int64_t i = 0; i < n; i++) wm.down[i] *= 0x1p-24f;
    for (int e = 0; e < wm.E; e++)
        for (int f = 0; f < 4; f++)
            for (int c = 7; c < 12; c++) {
                const int64_t i = ((int64_t)e * wm.F + f) * wm.D + c;
                wm.gate[i] = wm.up[i] = 24.0f;
            }
    g_limit = INFINITY;
    g_x_huge = 58;
    staged_x_cases(g, &wm);
    g_limit = 7.0f;
    g_x_huge = 0;
    master_free(&wm);
}

/* one expert holding every token of the step (T = 16, 2 slots: 32 entries = 4E, still the
 * decode GEMV): 16 rows of one expert, more than one pass of staged rows for some kernels */
static void moe_experts_one_busy_expert(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master wm;
    master_make(&wm, 8, 512, 256, 816);
    g_skew_expert0 = true;
    for (int f = 0; f < 3; f++) experts_case(g, &wm, 16, 2, (m3_gpu_wfmt)f, 2);
    g_skew_expert0 = false;
    master_free(&wm);
}

/* cmocka teardown of the tests that set the case globals: a failed case leaves by longjmp */
static int reset_case_globals(void **state) {
    (void)state;
    g_nan_D = 0;
    g_mx_D = 0;
    g_portable = 0;
    g_skew_expert0 = false;
    g_fixed_rows = false;
    g_sm80 = 0;
    g_x_huge = 0;
    g_limit = 7.0f;
    return 0;
}

/* e4m3fn NaN codes in MXFP8 experts (g_nan_D): decode (T = 1, 5, 13) and tiles (T = 40) give
 * NaN exactly where ref does (a NaN code is NaN, never a finite value); the finite outputs
 * under GPU_NMSE_BF16 as in moe_experts_small. Both profiles. */
static void moe_experts_mxfp8_nan(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master wm;
    master_make(&wm, 8, 256, 192, 817);
    g_nan_D = 256;
    g_nan_partial = 0;
    static const int Ts[] = {1, 5, 13, 40};
    for (int prof = 1; prof < 3; prof++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
            experts_case(g, &wm, Ts[i], 2, M3_GPU_W_MXFP8, prof);
    g_nan_D = 0;
    master_free(&wm);
    assert_true(g_nan_partial > 0); /* some cases mix NaN and finite outputs */
}

/* MX extremes (g_mx_D), MXFP4 and MXFP8: NaN block scales in gate / up and down, x spread
 * over 2^-90 .. 2^90; decode (T = 1, 5, 13) and tiles (40), both profiles, production and
 * portable kernels: non-finite outputs exactly where ref has them, the finite rest under
 * GPU_NMSE_BF16; not vacuous: the cases together hold finite and non-finite outputs. */
static void moe_experts_mx_extremes(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master wm;
    master_make(&wm, 8, 256, 192, 818);
    g_mx_D = 256;
    g_mx_nonfinite = g_mx_finite = 0;
    static const int Ts[] = {1, 5, 13, 40};
    for (int f = 1; f < 3; f++)
        for (int port = 0; port < 2; port++)
            for (int prof = 1; prof < 3; prof++)
                for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
                    g_portable = port;
                    experts_case(g, &wm, Ts[i], 2, (m3_gpu_wfmt)f, prof);
                }
    g_mx_D = 0, g_portable = 0;
    master_free(&wm);
    printf("  %lld non-finite, %lld finite reference outputs\n", (long long)g_mx_nonfinite,
           (long long)g_mx_finite);
    assert_true(g_mx_nonfinite > 0 && g_mx_finite > 0);
}

/* M3 dims D = 6144, F = 3072 (E = 4 keeps the host reference small): decode (gemv) and a
 * 40-token batch (tiles: 160 entries > 4E). */
static void moe_experts_m3_dims(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master wm;
    master_make(&wm, 4, 6144, 3072, 820);
    for (int f = 0; f < 3; f++) {
        experts_case(g, &wm, 1, 4, (m3_gpu_wfmt)f, 2);
        experts_case(g, &wm, 40, 4, (m3_gpu_wfmt)f, 2);
    }
    experts_case(g, &wm, 3, 2, M3_GPU_W_BF16, 1);
    master_free(&wm);
}

/* The prefill tiles at expert row counts around their tile edges (g_fixed_rows: 1, 63, 65,
 * 159, 161, 149, 150 rows), all formats, both profiles; each prefill kernel: the production
 * one (wg_k on an sm_90a build on Hopper), tile2_k (tile_sm80) and tile_k (portable). Same
 * bound as moe_experts_small (the same math, another fp32 reduction order). */
static void moe_experts_tile_rows(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master wm;
    master_make(&wm, 8, 384, 192, 850); /* D 384, F 192: divisible by every tile width */
    g_fixed_rows = true;
    for (int path = 0; path < 3; path++) {
        g_sm80 = path == 1, g_portable = path == 2;
        print_message("%s\n", path == 0 ? "production" : (path == 1 ? "tile_sm80" : "portable"));
        for (int f = 0; f < 3; f++)
            for (int prof = 1; prof < 3; prof++) experts_case(g, &wm, 449, 2, (m3_gpu_wfmt)f, prof);
    }
    g_fixed_rows = false, g_portable = 0, g_sm80 = 0;
    master_free(&wm);
}

/* The portable kernels (m3_gpu_experts.portable: the FMA decode GEMV sk_k and the tile_k
 * tiles that AMD runs, here with their NVIDIA mma) and the production ones at odd shapes, all
 * three weight formats: E = 9, K = 3, D 256, F 192 (T = 1, 5: decode; T = 13: ~4 rows an
 * expert, tiles mostly padding; T = 300: ~100 rows, one partial tile) and E = 3, K = 2,
 * T = 300, D 512, F 256 (~200 rows: several tiles, the last partial). Same bound as
 * moe_experts_small (the same math, another fp32 reduction order). */
static void moe_experts_portable_paths(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master w9, w3;
    master_make(&w9, 9, 256, 192, 830);
    master_make(&w3, 3, 512, 256, 840);
    for (int port = 1; port >= 0; port--) {
        g_portable = port;
        print_message("portable=%d\n", port);
        for (int f = 0; f < 3; f++) {
            experts_case(g, &w9, 1, 3, (m3_gpu_wfmt)f, 2);
            experts_case(g, &w9, 5, 3, (m3_gpu_wfmt)f, 1);
            experts_case(g, &w9, 13, 3, (m3_gpu_wfmt)f, 2);
            experts_case(g, &w9, 300, 3, (m3_gpu_wfmt)f, 2);
            experts_case(g, &w3, 300, 2, (m3_gpu_wfmt)f, 1);
        }
    }
    g_portable = 0;
    master_free(&w9);
    master_free(&w3);
}

/* ---- routed experts with activation quantization ------------------------------------------
 * ref's quantized-expert path: m3_mlp_weights of format MXFP8 / MXFP4 whose m3_wq carry the
 * codes, the e8m0 scales and the act (what ref/qload.c builds: MX rceil activations, e4m3fn
 * for MXFP8 experts, e2m1 for MXFP4 experts from moe_act_bound tokens on; act_mid NULL for
 * moe_stage2_act=none); the device gets the same codes, scales and m3_actq structs. Both sides
 * quantize bit-identically (tests/gpu_quant.c) and x is identical, so the gate/up inputs agree
 * exactly; the down inputs are quantized from each side's own swiglu output, which can differ
 * by a bf16 flip (GEMM reduction order) and then, rarely, by one MX grid step. Bound:
 * GPU_NMSE_BF16, the same as without activation quantization. Not vacuous: ref with the act
 * against ref on the same weights without it must differ by > 10x the bound where the act
 * applies, and be bit-identical where the pass is below the bound. */
static m3_actq act_mx(m3_mx_elem el, int min_pass) {
    m3_actq a;
    memset(&a, 0, sizeof a);
    a.kind = M3_ACTQ_MX;
    a.min_pass = min_pass;
    a.mx = m3_mx_params_default(el);
    a.mx.scale = M3_MX_SCALE_RCEIL; /* the serving paths' runtime rule (spec §5.4) */
    return a;
}

static void experts_act_case(m3_gpu *g, const exp_master *wm, int T, int K, m3_gpu_wfmt fmt,
                             int prof, const m3_actq *ain, const m3_actq *amid) {
    const int E = wm->E, D = wm->D, F = wm->F;
    m3_profile p;
    profile_of(&p, prof);
    const m3_moe_params mp = case_params(wm, K);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 900 + (uint64_t)T * 7 + (uint64_t)fmt * 3 + (uint64_t)prof);
    const size_t mark = m3_gpu_mark(g);
    const int64_t ngu = (int64_t)E * F * D;
    float *deq = malloc(ngu * sizeof(float)); /* dequantized values: unused here */
    assert_non_null(deq);
    m3_gpu_experts dw;
    memset(&dw, 0, sizeof dw);
    dw.fmt = fmt;
    uint8_t *hc[3];
    m3_e8m0 *hs[3];
    weights_to(g, fmt, wm->gate, (int64_t)E * F, D, &dw.gate, &dw.gate_s, deq, &hc[0], &hs[0]);
    weights_to(g, fmt, wm->up, (int64_t)E * F, D, &dw.up, &dw.up_s, deq, &hc[1], &hs[1]);
    weights_to(g, fmt, wm->down, (int64_t)E * D, F, &dw.down, &dw.down_s, deq, &hc[2], &hs[2]);
    free(deq);
    const int64_t rbD = fmt == M3_GPU_W_MXFP8 ? D : D / 2, rbF = fmt == M3_GPU_W_MXFP8 ? F : F / 2;
    m3_wq *wq = calloc((size_t)E * 6, sizeof *wq); /* [act | no act][gate, up, down][E] */
    m3_mlp_weights *ex = calloc((size_t)E * 2, sizeof *ex);
    assert_true(wq && ex);
    for (int v = 0; v < 2; v++)
        for (int e = 0; e < E; e++) {
            m3_wq *q = wq + (size_t)v * 3 * E;
            q[e] = (m3_wq){hc[0] + (size_t)e * F * rbD, hs[0] + (size_t)e * F * (D / 32), v ? NULL : ain};
            q[E + e] = (m3_wq){hc[1] + (size_t)e * F * rbD, hs[1] + (size_t)e * F * (D / 32), v ? NULL : ain};
            q[2 * E + e] = (m3_wq){hc[2] + (size_t)e * D * rbF, hs[2] + (size_t)e * D * (F / 32), v ? NULL : amid};
            m3_mlp_weights *x = &ex[(size_t)v * E + e];
            x->fmt = fmt == M3_GPU_W_MXFP8 ? M3_WFMT_MXFP8 : M3_WFMT_MXFP4;
            x->gate = &q[e], x->up = &q[E + e], x->down = &q[2 * E + e];
        }
    m3_moe_weights w_act, w_plain;
    memset(&w_act, 0, sizeof w_act);
    memset(&w_plain, 0, sizeof w_plain);
    w_act.experts = ex;
    w_plain.experts = ex + E;
    float *x = malloc((size_t)T * D * sizeof *x), *ref = malloc((size_t)T * D * sizeof *ref);
    float *plain = malloc((size_t)T * D * sizeof *plain), *wts = malloc((size_t)T * K * sizeof *wts);
    int32_t *ids = malloc((size_t)T * K * sizeof *ids);
    assert_true(x && ref && plain && wts && ids);
    m3_fill_normal(&r, x, (int64_t)T * D, 1.0f);
    random_routing(&r, ids, wts, T, E, K);
    shape_routing(ids, T, E, K);
    m3_bf16 *dx = gpu_upload_bf16(g, x, (int64_t)T * D, x);
    int32_t *dids;
    GPU_OK(m3_gpu_alloc(g, (void **)&dids, (size_t)T * K * sizeof *ids));
    GPU_OK(m3_gpu_upload(g, dids, ids, (size_t)T * K * sizeof *ids));
    float *dwts = gpu_upload_f32(g, wts, (int64_t)T * K);
    void *scratch = malloc(m3_moe_scratch_bytes(T, &mp));
    assert_non_null(scratch);
    assert_int_equal(m3_moe_experts(ref, x, ids, wts, T, &w_act, &mp, &p, scratch), M3_OK);
    assert_int_equal(m3_moe_experts(plain, x, ids, wts, T, &w_plain, &mp, &p, scratch), M3_OK);
    const bool applies = m3_actq_applies(ain, T) || m3_actq_applies(amid, T);
    char what[160];
    snprintf(what, sizeof what, "moe_experts %s+act(in %s%s, mid %s)(%s,T=%d,E=%d,D=%d,F=%d,%s)",
             fmt_name(fmt), ain ? (ain->mx.elem == M3_MX_E2M1 ? "e2m1" : "e4m3") : "-",
             ain && ain->min_pass ? (m3_actq_applies(ain, T) ? ">=bound" : "<bound") : "",
             amid ? (amid->mx.elem == M3_MX_E2M1 ? "e2m1" : "e4m3") : "-", p.name, T, E, D, F,
             T * K <= 4 * E ? "gemv" : "tiles");
    if (applies) {
        const double eff = gpu_nmse(ref, plain, (int64_t)T * D, what);
        printf("  %-58s act effect on ref %.2e\n", what, eff);
        if (!(eff > 10 * GPU_NMSE_BF16)) m3_test_failf("%s: the act changed ref by only %.2e (vacuous)", what, eff);
    } else if (memcmp(ref, plain, (size_t)T * D * sizeof *ref)) {
        m3_test_failf("%s: below the pass bound ref must equal the unquantized run", what);
    }
    dw.act_in = ain, dw.act_mid = amid;
    m3_bf16 *dy = gpu_guard_alloc(g, (size_t)T * D * sizeof(m3_bf16));
    float *got = malloc((size_t)T * D * sizeof *got);
    assert_non_null(got);
    GPU_OK(m3_gpu_moe_experts(g, dy, dx, dids, dwts, T, &dw, &mp, &p));
    gpu_download_bf16(g, got, dy, (int64_t)T * D);
    gpu_guard_check(g, dy, (size_t)T * D * sizeof(m3_bf16), "moe_experts act y");
    gpu_expect_nmse(ref, got, (int64_t)T * D, GPU_NMSE_BF16, what);
    if (ain && ain->min_pass > T) {
        /* n_pass decides, not n_tok: a share of a pass at the bound is quantized exactly as
         * with the bound at 0 */
        m3_actq in0 = *ain, mid0;
        in0.min_pass = 0;
        if (amid) mid0 = *amid, mid0.min_pass = 0;
        float *got2 = malloc((size_t)T * D * sizeof *got2), *got3 = malloc((size_t)T * D * sizeof *got3);
        assert_true(got2 && got3);
        dw.n_pass = ain->min_pass;
        GPU_OK(m3_gpu_moe_experts(g, dy, dx, dids, dwts, T, &dw, &mp, &p));
        gpu_download_bf16(g, got2, dy, (int64_t)T * D);
        dw.n_pass = 0, dw.act_in = &in0, dw.act_mid = amid ? &mid0 : NULL;
        GPU_OK(m3_gpu_moe_experts(g, dy, dx, dids, dwts, T, &dw, &mp, &p));
        gpu_download_bf16(g, got3, dy, (int64_t)T * D);
        if (memcmp(got2, got3, (size_t)T * D * sizeof *got2))
            m3_test_failf("%s: n_pass = bound differs from bound 0", what);
        if (!memcmp(got2, got, (size_t)T * D * sizeof *got2))
            m3_test_failf("%s: n_pass = bound changed nothing", what);
        printf("  %-58s n_pass=%d: quantized, equal to bound 0\n", what, ain->min_pass);
        free(got2); free(got3);
    }
    m3_gpu_release(g, mark);
    for (int i = 0; i < 3; i++) free(hc[i]), free(hs[i]);
    free(wq); free(ex); free(x); free(ref); free(plain); free(wts); free(ids); free(scratch); free(got);
}

static void moe_experts_act_small(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master wm;
    master_make(&wm, 8, 256, 192, 830);
    const m3_actq a8 = act_mx(M3_MX_E4M3FN, 0), a4 = act_mx(M3_MX_E2M1, 16);
    static const int Ts[] = {1, 5, 37, 300}; /* gemv (1, 5) and tiles (37, 300) */
    for (int prof = 1; prof < 3; prof++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            experts_act_case(g, &wm, Ts[i], 2, M3_GPU_W_MXFP8, prof, &a8, &a8);
            experts_act_case(g, &wm, Ts[i], 2, M3_GPU_W_MXFP4, prof, &a4, &a4); /* bound 16 */
        }
    /* moe_stage2_act=none: only the gate/up input is quantized */
    experts_act_case(g, &wm, 37, 2, M3_GPU_W_MXFP8, 2, &a8, NULL);
    experts_act_case(g, &wm, 5, 2, M3_GPU_W_MXFP4, 2, &a4, NULL);
    master_free(&wm);
}

/* M3 dims (E = 4 keeps the host reference small): MXFP8 + e4m3 act decode and batch,
 * MXFP4 + e2m1 act at a bound of 16 on both sides of it */
static void moe_experts_act_m3_dims(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    exp_master wm;
    master_make(&wm, 4, 6144, 3072, 840);
    const m3_actq a8 = act_mx(M3_MX_E4M3FN, 0), a4 = act_mx(M3_MX_E2M1, 16);
    experts_act_case(g, &wm, 1, 4, M3_GPU_W_MXFP8, 2, &a8, &a8);
    experts_act_case(g, &wm, 40, 4, M3_GPU_W_MXFP8, 2, &a8, &a8);
    experts_act_case(g, &wm, 3, 4, M3_GPU_W_MXFP4, 2, &a4, &a4);
    experts_act_case(g, &wm, 40, 4, M3_GPU_W_MXFP4, 1, &a4, &a4);
    master_free(&wm);
}

/* ptpc (per-token fp8) activations for routed experts are not built: M3_ERR_UNSUPPORTED */
static void moe_experts_ptpc_unsupported(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    m3_profile p;
    m3_profile_atom(&p);
    m3_moe_params mp;
    memset(&mp, 0, sizeof mp);
    mp.n_expert = 8, mp.top_k = 2, mp.dim = 256, mp.ffn = 192, mp.routed_scale = 2.0f;
    m3_actq a;
    memset(&a, 0, sizeof a);
    a.kind = M3_ACTQ_PTPC;
    a.fp8 = m3_fp8q_params_default(M3_FP8_E4M3FN);
    m3_gpu_experts dw;
    memset(&dw, 0, sizeof dw);
    void *buf;
    GPU_OK(m3_gpu_alloc(g, &buf, 4096));
    dw.gate = dw.up = dw.down = buf;
    dw.act_in = &a;
    assert_int_equal(m3_gpu_moe_experts(g, buf, (const m3_bf16 *)buf + 1024, buf, buf, 1, &dw, &mp, &p),
                     M3_ERR_UNSUPPORTED);
    dw.act_in = NULL, dw.act_mid = &a;
    assert_int_equal(m3_gpu_moe_experts(g, buf, (const m3_bf16 *)buf + 1024, buf, buf, 1, &dw, &mp, &p),
                     M3_ERR_UNSUPPORTED);
    a.min_pass = 2; /* a ptpc act that does not apply to this pass is no obstacle */
    assert_int_equal(m3_gpu_moe_experts(g, buf, (const m3_bf16 *)buf + 1024, buf, buf, 0, &dw, &mp, &p),
                     M3_OK);
}

/* fp32 activations have no bf16 kernel: a clear M3_ERR_UNSUPPORTED, nothing written. */
static void moe_experts_fp32_unsupported(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    m3_profile p;
    m3_profile_fp32(&p);
    m3_moe_params mp;
    memset(&mp, 0, sizeof mp);
    mp.n_expert = 8, mp.top_k = 2, mp.dim = 256, mp.ffn = 192, mp.routed_scale = 2.0f;
    m3_gpu_experts dw;
    memset(&dw, 0, sizeof dw);
    void *buf;
    GPU_OK(m3_gpu_alloc(g, &buf, 4096));
    dw.gate = dw.up = dw.down = buf;
    assert_int_equal(m3_gpu_moe_experts(g, buf, (const m3_bf16 *)buf + 1024, buf, buf, 1, &dw, &mp, &p),
                     M3_ERR_UNSUPPORTED);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(swiglu_matches_ref),
        cmocka_unit_test(swiglu_variants_same_bytes),
        cmocka_unit_test(moe_route_matches_ref),
        cmocka_unit_test(moe_route_ties_go_to_lower_id),
        cmocka_unit_test(moe_route_ties_many_tokens),
        cmocka_unit_test(moe_route_chained),
        cmocka_unit_test(router_logits_match_ref),
        cmocka_unit_test(moe_experts_small),
        cmocka_unit_test(moe_experts_wide_scales),
        cmocka_unit_test_teardown(moe_experts_mx4_staged_x, reset_case_globals),
        cmocka_unit_test_teardown(moe_experts_mx4_a_bound, reset_case_globals),
        cmocka_unit_test_teardown(moe_experts_one_busy_expert, reset_case_globals),
        cmocka_unit_test_teardown(moe_experts_mxfp8_nan, reset_case_globals),
        cmocka_unit_test_teardown(moe_experts_mx_extremes, reset_case_globals),
        cmocka_unit_test(moe_experts_m3_dims),
        cmocka_unit_test_teardown(moe_experts_portable_paths, reset_case_globals),
        cmocka_unit_test_teardown(moe_experts_tile_rows, reset_case_globals),
        cmocka_unit_test(moe_experts_fp32_unsupported),
        cmocka_unit_test(moe_experts_act_small),
        cmocka_unit_test(moe_experts_act_m3_dims),
        cmocka_unit_test(moe_experts_ptpc_unsupported),
    };
    return M3_RUN_GPU_TESTS(tests);
}
