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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(swiglu_matches_ref),
        cmocka_unit_test(moe_route_matches_ref),
        cmocka_unit_test(moe_route_ties_go_to_lower_id),
        cmocka_unit_test(router_logits_match_ref),
    };
    return M3_RUN_GPU_TESTS(tests);
}
