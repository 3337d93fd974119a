/* tests/ref_moe.c: router (sigmoid, bias for selection only, renormalised weights, tie rule,
 * margins, router dtype), swiglu_oai and its hf per-op roundings, the MLP, the routed
 * experts with teacher-forced ids (bit-exact against an in-test naive version with
 * M3_NAIVE_GEMM=1), routed_scaling_factor, shared-expert add and thread independence. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/moe.h"
#include "ref/num/act.h"
#include "tests/util.h"

static void route_properties(void **state) {
    (void)state;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 1);
    enum { T = 33, E = 16, K = 4 };
    m3_moe_params mp = {E, K, 8, 4, 4, 2.0f, 1.702f, 7.0f};
    float logits[T * E], bias[E], wts[T * K], mg[T];
    int32_t ids[T * K];
    m3_fill_normal(&r, logits, T * E, 2.0f);
    m3_fill_normal(&r, bias, E, 0.3f);
    m3_profile f;
    m3_profile_fp32(&f);
    m3_moe_route(ids, wts, mg, logits, bias, T, &mp, &f);
    for (int t = 0; t < T; t++) {
        float sel[E], sig[E], sum = 0;
        for (int e = 0; e < E; e++) {
            sig[e] = m3_sigmoidf(logits[t * E + e]);
            sel[e] = sig[e] + bias[e];
        }
        bool chosen[E] = {false};
        float wsum = 0;
        for (int k = 0; k < K; k++) {
            int e = ids[t * K + k];
            assert_false(chosen[e]);
            chosen[e] = true;
            sum += sig[e];
            wsum += wts[t * K + k];
            if (k > 0) assert_true(sel[e] <= sel[ids[t * K + k - 1]]); /* selection order */
        }
        /* renormalised weights sum to 1 (routed_scaling_factor comes later) */
        assert_true(fabsf(wsum - 1.0f) <= 4 * 1.2e-7f);
        float kth = sel[ids[t * K + K - 1]], best_out = -INFINITY;
        for (int e = 0; e < E; e++)
            if (!chosen[e]) {
                assert_true(sel[e] <= kth); /* chosen by sigma + bias */
                best_out = sel[e] > best_out ? sel[e] : best_out;
            }
        assert_true(mg[t] == kth - best_out);
        for (int k = 0; k < K; k++) /* weights from sigma, not sigma + bias */
            assert_true(wts[t * K + k] == sig[ids[t * K + k]] / sum);
    }
}

static void route_ties_go_to_lower_id(void **state) {
    (void)state;
    enum { E = 8, K = 3 };
    m3_moe_params mp = {E, K, 8, 4, 0, 2.0f, 1.702f, 7.0f};
    float logits[E], bias[E] = {0}, w[K], mg;
    int32_t ids[K];
    for (int e = 0; e < E; e++) logits[e] = 0.5f;
    m3_profile f;
    m3_profile_fp32(&f);
    m3_moe_route(ids, w, &mg, logits, bias, 1, &mp, &f);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 1);
    assert_int_equal(ids[2], 2);
    assert_true(mg == 0.0f);
    bias[6] = 0.25f; /* the bias alone moves expert 6 in; its weight stays sigma-based */
    m3_moe_route(ids, w, &mg, logits, bias, 1, &mp, &f);
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[1], 0);
    assert_true(w[0] == w[1] && w[1] == w[2]);
    /* bf16 router: a bias that differs only below bf16 precision cannot break a tie */
    m3_profile hf;
    m3_profile_hf(&hf);
    for (int e = 0; e < E; e++) bias[e] = 0.0f;
    bias[7] = ldexpf(1.0f, -20);
    m3_moe_route(ids, w, &mg, logits, bias, 1, &mp, &f);
    assert_int_equal(ids[0], 7);
    bias[7] = 0.25f + ldexpf(1.0f, -12); /* rounds to 0.25 in bf16: ties bias[6] = 0.25 */
    bias[6] = 0.25f;
    m3_moe_route(ids, w, &mg, logits, bias, 1, &mp, &hf);
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[1], 7);
}

/* router_dtype bf16: x cast to bf16, gate rounded to bf16, GEMM, bf16 logits */
static void router_logits_dtype(void **state) {
    (void)state;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 2);
    enum { T = 3, E = 6, D = 37 };
    m3_moe_params mp = {E, 2, D, 4, 0, 2.0f, 1.702f, 7.0f};
    float x[T * D], g[E * D], l[T * E];
    m3_fill_normal(&r, x, T * D, 1.0f);
    m3_fill_normal(&r, g, E * D, 0.2f);
    void *s = malloc(m3_moe_scratch_bytes(T, &mp));
    setenv("M3_NAIVE_GEMM", "1", 1);
    m3_profile f, hf;
    m3_profile_fp32(&f);
    m3_profile_hf(&hf);
    for (int pi = 0; pi < 2; pi++) {
        const m3_profile *p = pi ? &hf : &f;
        m3_moe_router_logits(l, x, T, g, &mp, p, s);
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++) {
                float acc = 0;
                for (int d = 0; d < D; d++)
                    acc += pi ? m3_round_bf16(x[t * D + d]) * m3_round_bf16(g[e * D + d])
                              : x[t * D + d] * g[e * D + d];
                assert_true(l[t * E + e] == (pi ? m3_round_bf16(acc) : acc));
            }
    }
    unsetenv("M3_NAIVE_GEMM");
    free(s);
}

static void swiglu_clamps_and_roundings(void **state) {
    (void)state;
    const float a = 1.702f, lim = 7.0f;
    /* gate clamped above only, up clamped both sides, (u' + 1) */
    float big = m3_swiglu_oai(10.0f, 0.0f, a, lim), at7 = m3_swiglu_oai(7.0f, 0.0f, a, lim);
    assert_true(big == at7);
    assert_true(m3_swiglu_oai(-10.0f, 0.0f, a, lim) != m3_swiglu_oai(-7.0f, 0.0f, a, lim));
    float lo = m3_swiglu_oai(2.0f, -10.0f, a, lim);
    float glu = 2.0f * m3_sigmoidf(2.0f * a);
    assert_true(lo == -6.0f * glu);
    assert_true(m3_swiglu_oai(2.0f, 100.0f, a, lim) == 8.0f * glu);
    assert_true(m3_swiglu_oai(0.0f, 3.0f, a, lim) == 0.0f); /* zero padding is exact */
    assert_true(isnan(m3_swiglu_oai(NAN, 1.0f, a, lim)));   /* clamps keep NaN */
    assert_true(isnan(m3_swiglu_oai(1.0f, NAN, a, lim)));
    /* hf: five bf16 roundings, checked op by op on bf16 inputs */
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 3);
    int differs = 0;
    for (int i = 0; i < 1000; i++) {
        float g = m3_round_bf16(m3_rng_normal(&r) * 4), u = m3_round_bf16(m3_rng_normal(&r) * 4);
        float gc = g > lim ? lim : g, uc = u > lim ? lim : (u < -lim ? -lim : u);
        float t1 = m3_round_bf16(gc * a), t2 = m3_round_bf16(1.0f / (1.0f + expf(-t1)));
        float t3 = m3_round_bf16(gc * t2), t4 = m3_round_bf16(uc + 1.0f);
        float want = m3_round_bf16(t4 * t3);
        float got = m3_swiglu_oai_bf16ops(g, u, a, lim);
        assert_true(got == want);
        differs += got != m3_round_bf16(m3_swiglu_oai(g, u, a, lim));
    }
    assert_true(differs > 0); /* per-op and one-rounding variants really differ somewhere */
    float gv[3] = {1, 2, 3}, uv[3] = {0.5f, -1, 9}, out[3];
    m3_profile at;
    m3_profile_atom(&at);
    m3_swiglu(out, gv, uv, 3, a, lim, &at);
    for (int i = 0; i < 3; i++) assert_true(out[i] == m3_round_bf16(m3_swiglu_oai(gv[i], uv[i], a, lim)));
}

/* ---- experts against an in-test naive version (M3_NAIVE_GEMM=1: sequential k sums) ---- */
enum { E = 6, K = 2, D = 12, F = 7 };

typedef struct {
    m3_bf16 w1[E][F * D], w3[E][F * D], w2[E][D * F];
    m3_mlp_weights ex[E];
    m3_moe_weights mw;
} wset;

static void wset_make(wset *w, uint64_t stream) {
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), stream);
    for (int e = 0; e < E; e++) {
        for (int i = 0; i < F * D; i++) {
            w->w1[e][i] = m3_f32_to_bf16(m3_rng_normal(&r) * 0.5f);
            w->w3[e][i] = m3_f32_to_bf16(m3_rng_normal(&r) * 0.5f);
            w->w2[e][i] = m3_f32_to_bf16(m3_rng_normal(&r) * 0.5f);
        }
        w->ex[e] = (m3_mlp_weights){M3_WFMT_BF16, w->w1[e], w->w3[e], w->w2[e]};
    }
    w->mw = (m3_moe_weights){NULL, NULL, w->ex, {M3_WFMT_BF16, NULL, NULL, NULL}};
}

static void naive_expert(float *y, const float *x, const wset *w, int e, const m3_profile *p) {
    float g[F], u[F];
    for (int f = 0; f < F; f++) {
        float a = 0, b = 0;
        for (int d = 0; d < D; d++) {
            a += x[d] * m3_bf16_to_f32(w->w1[e][f * D + d]);
            b += x[d] * m3_bf16_to_f32(w->w3[e][f * D + d]);
        }
        g[f] = m3_prof_rnd(p->act_bf16, a);
        u[f] = m3_prof_rnd(p->act_bf16, b);
    }
    m3_swiglu(g, g, u, F, 1.702f, 7.0f, p);
    for (int d = 0; d < D; d++) {
        float a = 0;
        for (int f = 0; f < F; f++) a += g[f] * m3_bf16_to_f32(w->w2[e][d * F + f]);
        y[d] = m3_prof_rnd(p->act_bf16, a);
    }
}

static void experts_match_naive(void **state) {
    (void)state;
    static wset w;
    wset_make(&w, 10);
    m3_moe_params mp = {E, K, D, F, 0, 2.0f, 1.702f, 7.0f};
    m3_profile ps[3];
    m3_profile_fp32(&ps[0]);
    m3_profile_hf(&ps[1]);
    m3_profile_atom(&ps[2]);
    int Ts[] = {1, 3, 33};
    setenv("M3_NAIVE_GEMM", "1", 1);
    for (int ti = 0; ti < 3; ti++)
        for (int pi = 0; pi < 3; pi++) {
            int T = Ts[ti];
            m3_rng r;
            m3_rng_init(&r, m3_test_seed(), 20 + (uint64_t)ti);
            float *x = malloc(sizeof(float) * T * D), *y = m3_guard_alloc(sizeof(float) * T * D);
            float *wts = malloc(sizeof(float) * T * K), *ref = calloc((size_t)T * D, 4);
            int32_t *ids = malloc(sizeof(int32_t) * T * K);
            m3_fill_normal(&r, x, (int64_t)T * D, 1.0f);
            if (pi) m3_round_bf16_n(x, (int64_t)T * D);
            for (int t = 0; t < T; t++) { /* teacher-forced: any distinct ids, any order */
                ids[t * K] = (int32_t)(m3_rng_u32(&r) % E);
                ids[t * K + 1] = (ids[t * K] + 1 + (int32_t)(m3_rng_u32(&r) % (E - 1))) % E;
                wts[t * K] = m3_rng_uniform(&r, 0.1f, 0.9f);
                wts[t * K + 1] = 1.0f - wts[t * K];
            }
            void *s = m3_guard_alloc(m3_moe_scratch_bytes(T, &mp));
            assert_int_equal(m3_moe_experts(y, x, ids, wts, T, &w.mw, &mp, &ps[pi], s), M3_OK);
            for (int t = 0; t < T; t++) {
                float ye[D];
                for (int e = 0; e < E; e++) /* ascending expert id */
                    for (int k = 0; k < K; k++)
                        if (ids[t * K + k] == e) {
                            naive_expert(ye, x + t * D, &w, e, &ps[pi]);
                            for (int d = 0; d < D; d++) {
                                float *o = ref + t * D + d;
                                if (ps[pi].moe_bf16_combine)
                                    *o = m3_round_bf16(*o + m3_round_bf16(ye[d] * wts[t * K + k]));
                                else
                                    *o += ye[d] * wts[t * K + k];
                            }
                        }
                for (int d = 0; d < D; d++)
                    ref[t * D + d] = m3_prof_rnd(ps[pi].act_bf16, 2.0f * ref[t * D + d]);
            }
            double nrm = 0;
            for (int i = 0; i < T * D; i++) {
                nrm += (double)ref[i] * (double)ref[i];
                if (memcmp(&y[i], &ref[i], 4) != 0)
                    m3_test_failf("moe_experts(T=%d,%s) %d: %.9g vs naive %.9g", T, ps[pi].name,
                                  i, (double)y[i], (double)ref[i]);
            }
            assert_true(nrm > 0);
            m3_guard_free(s);
            m3_guard_free(y);
            free(x), free(wts), free(ref), free(ids);
        }
    unsetenv("M3_NAIVE_GEMM");
}

static void experts_reject_bad_ids_and_thread_independence(void **state) {
    (void)state;
    static wset w;
    wset_make(&w, 11);
    m3_moe_params mp = {E, K, D, F, 0, 2.0f, 1.702f, 7.0f};
    enum { T = 33 };
    float x[T * D], wts[T * K], ya[T * D], yb[T * D];
    int32_t ids[T * K];
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 30);
    m3_fill_normal(&r, x, T * D, 1.0f);
    for (int t = 0; t < T; t++) {
        ids[t * K] = t % E;
        ids[t * K + 1] = (t + 3) % E;
        wts[t * K] = 0.7f;
        wts[t * K + 1] = 0.3f;
    }
    void *s = malloc(m3_moe_scratch_bytes(T, &mp));
    m3_profile hf;
    m3_profile_hf(&hf);
    m3_set_threads(1);
    assert_int_equal(m3_moe_experts(ya, x, ids, wts, T, &w.mw, &mp, &hf, s), M3_OK);
    m3_set_threads(3);
    assert_int_equal(m3_moe_experts(yb, x, ids, wts, T, &w.mw, &mp, &hf, s), M3_OK);
    m3_set_threads(0);
    assert_memory_equal(ya, yb, sizeof ya);
    ids[5] = E;
    assert_int_equal(m3_moe_experts(ya, x, ids, wts, T, &w.mw, &mp, &hf, s), M3_ERR_ARG);
    ids[5] = ids[4];
    assert_int_equal(m3_moe_experts(ya, x, ids, wts, T, &w.mw, &mp, &hf, s), M3_ERR_ARG);
    assert_non_null(strstr(m3_last_error(), "twice"));
    free(s);
}

/* the MLP (dense / shared expert) == one expert with weight 1 / rsf; shared add rounding */
static void mlp_and_shared_add(void **state) {
    (void)state;
    static wset w;
    wset_make(&w, 12);
    enum { T = 3 };
    m3_mlp_params mlp = {D, F, 1.702f, 7.0f};
    float x[T * D], y[T * D], ref[D];
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 40);
    m3_fill_normal(&r, x, T * D, 1.0f);
    m3_round_bf16_n(x, T * D);
    void *s = malloc(m3_mlp_scratch_bytes(T, &mlp));
    m3_profile hf;
    m3_profile_hf(&hf);
    setenv("M3_NAIVE_GEMM", "1", 1);
    m3_mlp(y, x, T, &w.ex[3], &mlp, &hf, s);
    unsetenv("M3_NAIVE_GEMM");
    for (int t = 0; t < T; t++) {
        naive_expert(ref, x + t * D, &w, 3, &hf);
        assert_memory_equal(y + t * D, ref, sizeof ref);
    }
    float a[2] = {1.0f, 256.0f}, b[2] = {ldexpf(1.0f, -9), 1.0f};
    m3_moe_add_shared(a, b, 2, &hf);
    assert_true(a[0] == 1.0f && a[1] == 256.0f); /* bf16(2R + S): both round back */
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(route_properties),
        cmocka_unit_test(route_ties_go_to_lower_id),
        cmocka_unit_test(router_logits_dtype),
        cmocka_unit_test(swiglu_clamps_and_roundings),
        cmocka_unit_test(experts_match_naive),
        cmocka_unit_test(experts_reject_bad_ids_and_thread_independence),
        cmocka_unit_test(mlp_and_shared_add),
    };
    return M3_RUN_TESTS(tests);
}
