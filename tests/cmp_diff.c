/* tests/cmp_diff.c: compare/diff metrics on hand-computable data: exact NMSE/SQNR/cosine,
 * max |Δ| location, relative error floor, non-finite rules (NaN in B fails, matching NaN
 * and same-sign infinities agree), histogram bins, block merging, set metrics (order,
 * padding, widths, Jaccard, recall, near-tie classification), routing weights by id, and
 * logits KL / top-1 / Δp against closed forms. Also the tolerance table and its JSON. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/diff.h"
#include "compare/tol.h"
#include "ref/variant.h"
#include "tests/util.h"

static void nmse_exact(void **state) {
    (void)state;
    /* Σa² = 4, Σ(b-a)² = 0.25: NMSE = 1/16 exactly, SQNR = 10·log10(16) */
    float a[4] = {1, 1, 1, 1}, b[4] = {1, 1, 1, 1.5f};
    m3_diff d = m3_diff_f32(a, b, 4, 4, 0.01);
    assert_true(m3_diff_nmse(&d) == 0.0625);
    assert_true(fabs(m3_diff_sqnr_db(&d) - 10.0 * log10(16.0)) < 1e-12);
    assert_int_equal(d.max_abs_idx, 3);
    assert_true(d.max_abs == 0.5 && d.max_abs_a == 1.0f && d.max_abs_b == 1.5f);
    /* cosine = Σab / sqrt(Σa²Σb²) = 4.5 / sqrt(4 · 5.25) */
    assert_true(fabs(m3_diff_cosine(&d) - 4.5 / sqrt(21.0)) < 1e-15);
    assert_true(d.max_rel == 0.5);
    assert_true(m3_diff_mean_rel(&d) == 0.125);
    assert_int_equal(d.n_cmp, 4);
    /* identical data: NMSE 0, SQNR +inf, cosine 1 */
    d = m3_diff_f32(a, a, 4, 4, 0.01);
    assert_true(m3_diff_nmse(&d) == 0 && isinf(m3_diff_sqnr_db(&d)) && m3_diff_cosine(&d) == 1.0);
    /* zero reference with a non-zero candidate: NMSE +inf (not NaN) */
    float z[4] = {0};
    d = m3_diff_f32(z, b, 4, 4, 0.01);
    assert_true(isinf(m3_diff_nmse(&d)));
}

static void relative_error_floor(void **state) {
    (void)state;
    /* row RMS of a = 1 (values ±1 and one 0): the 0 uses the floor 0.01·1, not 0 */
    float a[4] = {1, -1, 0, 1}, b[4] = {1, -1, 0.001f, 1};
    m3_diff d = m3_diff_f32(a, b, 4, 4, 0.01);
    double rms = sqrt(3.0 / 4.0);
    assert_true(fabs(d.max_rel - (double)0.001f / (0.01 * rms)) < 1e-12);
    assert_int_equal(d.max_rel_idx, 2);
}

static void nonfinite_rules(void **state) {
    (void)state;
    float a[6] = {1, NAN, INFINITY, -INFINITY, 2, INFINITY};
    float b[6] = {NAN, NAN, INFINITY, -INFINITY, 2, -INFINITY};
    m3_diff d = m3_diff_f32(a, b, 6, 6, 0.01);
    /* [0] NaN in B where A finite: mismatch; [1] both NaN, [2],[3] same-sign inf: agree;
     * [5] +inf vs -inf: mismatch */
    assert_int_equal(d.nonfinite_mismatch, 2);
    assert_int_equal(d.first_mismatch, 0);
    assert_int_equal(d.nan_a, 1);
    assert_int_equal(d.nan_b, 2);
    assert_int_equal(d.inf_a, 3);
    assert_int_equal(d.inf_b, 3);
    assert_int_equal(d.n_cmp, 1); /* only [4] enters the metrics */
    assert_true(m3_diff_nmse(&d) == 0);
    /* same data, all agreeing */
    d = m3_diff_f32(a, a, 6, 6, 0.01);
    assert_int_equal(d.nonfinite_mismatch, 0);
    assert_int_equal(d.first_mismatch, -1);
}

static void hist_and_merge(void **state) {
    (void)state;
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0.5f, 0.75f, 1, 1e-20f, 1e10f, 0, 0.25f};
    m3_diff d = m3_diff_f32(a, b, 8, 8, 0.01);
    assert_int_equal(d.hist[0], 2);       /* exact zeros */
    assert_int_equal(d.hist[40], 2);      /* [2^-1, 2^0): 0.5, 0.75 */
    assert_int_equal(d.hist[41], 1);      /* [1, 2) */
    assert_int_equal(d.hist[39], 1);      /* 0.25 */
    assert_int_equal(d.hist[1], 1);       /* 1e-20 clamps into the lowest bin */
    assert_int_equal(d.hist[63], 1);      /* 1e10 clamps into the highest */
    assert_true(m3_diff_hist_lo(41) == 1.0);
    /* merging two halves equals one pass when blocks are whole rows */
    m3_diff p1, p2, all;
    m3_diff_init(&p1);
    m3_diff_init(&p2);
    m3_diff_init(&all);
    m3_diff_f32_accum(&p1, a, b, 4, 4, 0, 0.01);
    m3_diff_f32_accum(&p2, a + 4, b + 4, 4, 4, 4, 0.01);
    m3_diff_merge(&all, &p1);
    m3_diff_merge(&all, &p2);
    m3_diff one;
    m3_diff_init(&one);
    m3_diff_f32_accum(&one, a, b, 8, 4, 0, 0.01);
    assert_true(all.sse == one.sse && all.max_abs_idx == one.max_abs_idx && all.max_abs_idx == 5);
    assert_memory_equal(all.hist, one.hist, sizeof all.hist);
}

static void sets(void **state) {
    (void)state;
    /* row 0: reordered, must agree; row 1: -1 padding and a narrower B (HF top-k width 2);
     * row 2: one flipped id; row 3: both empty */
    int32_t a[4 * 3] = {1, 2, 3, 5, 4, -1, 0, 1, 2, -1, -1, -1};
    int32_t b3[4 * 3] = {3, 1, 2, 4, 5, -1, 0, 7, 2, -1, -1, -1};
    m3_setdiff s;
    m3_setdiff_init(&s);
    m3_setdiff_rows(&s, a, 3, b3, 3, 4, NULL, 0, 0, 0, 0);
    assert_int_equal(s.rows, 4);
    assert_int_equal(s.rows_equal, 3);
    assert_int_equal(s.flips_real, 1);
    assert_int_equal(s.flips_unscored, 1);
    assert_int_equal(s.first_flip_row, 2);
    /* Jaccard: 1, 1, 2/4, 1 */
    assert_true(fabs(m3_setdiff_jaccard(&s) - 3.5 / 4.0) < 1e-15);
    /* recall: |A∩B| = 3+2+2 = 7 of |A| = 3+2+3 = 8 */
    assert_true(fabs(m3_setdiff_recall(&s) - 7.0 / 8.0) < 1e-15);
    assert_true(fabs(m3_setdiff_agree(&s) - 0.75) < 1e-15);
    /* different widths: HF's narrower output padded logically */
    m3_setdiff w;
    m3_setdiff_init(&w);
    int32_t a2[2 * 3] = {5, 4, -1, 7, -1, -1};
    int32_t b2[2 * 2] = {4, 5, -1, 7};
    m3_setdiff_rows(&w, a2, 3, b2, 2, 2, NULL, 0, 0, 0, 0);
    assert_int_equal(w.rows_equal, 2);
    /* near-tie classification with reference scores: row flips 2 -> 7 */
    float score[8] = {0.9f, 0.8f, 0.5f, 0.1f, 0.1f, 0.1f, 0.1f, 0.499f};
    int32_t ra[3] = {0, 1, 2}, rb[3] = {0, 1, 7};
    m3_setdiff t;
    m3_setdiff_init(&t);
    m3_setdiff_rows(&t, ra, 3, rb, 3, 1, score, 8, 0.002, 0, 0);
    assert_int_equal(t.flips_tie, 1);
    assert_int_equal(t.flips_real, 0);
    assert_true(fabs(t.min_flip_margin - (0.5 - (double)0.499f)) < 1e-6);
    m3_setdiff_init(&t);
    m3_setdiff_rows(&t, ra, 3, rb, 3, 1, score, 8, 0.0005, 0, 0); /* margin 0.001 > 0.0005 */
    assert_int_equal(t.flips_real, 1);
    /* a flipped id outside the score row cannot be classified */
    int32_t rc[3] = {0, 1, 9};
    m3_setdiff_init(&t);
    m3_setdiff_rows(&t, ra, 3, rc, 3, 1, score, 8, 1.0, 0, 0);
    assert_int_equal(t.flips_unscored, 1);
}

static void weights_by_id(void **state) {
    (void)state;
    int32_t ids[4] = {7, 2, -1, 5};
    float w[4] = {0.7f, 0.2f, 9.0f, 0.5f};
    m3_sort_by_id(ids, w, 4);
    int32_t want_ids[4] = {2, 5, 7, -1};
    float want_w[4] = {0.2f, 0.5f, 0.7f, 9.0f};
    assert_memory_equal(ids, want_ids, sizeof ids);
    assert_memory_equal(w, want_w, sizeof w);
    int32_t x[3] = {1, 2, -1}, y[4] = {2, -1, 1, -1}, z[3] = {1, 3, -1};
    assert_true(m3_same_id_set(x, 3, y, 4));
    assert_false(m3_same_id_set(x, 3, z, 3));
}

static void logits_closed_form(void **state) {
    (void)state;
    /* p_A = (1/2, 1/2), p_B = (3/4, 1/4): KL = ½ln(2/3) + ½ln 2 = ½ln(4/3); argmax A = 0
     * (lowest index on a tie), Δp = 3/4 - 1/2 */
    float a[2] = {0, 0}, b[2] = {(float)log(3.0), 0};
    int64_t ta, tb;
    double dp;
    double kl = m3_logits_row(a, b, 2, &ta, &tb, &dp);
    assert_true(fabs(kl - 0.5 * log(4.0 / 3.0)) < 1e-7);
    assert_int_equal(ta, 0);
    assert_int_equal(tb, 0);
    assert_true(fabs(dp - 0.25) < 1e-7);
    /* identical rows: KL 0; -inf logits (masked vocab) on both sides are fine */
    float c[3] = {1, -INFINITY, 2};
    kl = m3_logits_row(c, c, 3, &ta, &tb, &dp);
    assert_true(kl == 0 && ta == 2 && dp == 0);
    /* B masks a token A gives mass to: KL = +inf */
    float d[3] = {1, -INFINITY, -INFINITY};
    kl = m3_logits_row(c, d, 3, &ta, &tb, &dp);
    assert_true(isinf(kl) && tb == 0);
}

static void tolerance_table(void **state) {
    (void)state;
    m3_tol t;
    m3_tol_builtin(&t);
    for (int i = 0; i < t.n; i++) assert_true(strlen(t.row[i].reason) > 20); /* every row says why */
    assert_string_equal(m3_tol_find(&t, "attn_out")->stage, "attn_out");
    assert_string_equal(m3_tol_find(&t, "kv_cache_k_fp8")->stage, "*");
    assert_int_equal(m3_tol_class(&t, "fp32", "fp32", NULL, NULL), M3_TOL_FP32);
    assert_int_equal(m3_tol_class(&t, "fp32", "bf16", NULL, NULL), M3_TOL_LOWP);
    assert_int_equal(m3_tol_class(&t, NULL, "fp32", NULL, NULL), M3_TOL_LOWP);
    /* online quantization in either fp32 run: the fp32q class (variants as m3_variant_json
     * writes them); plain variants and MXFP4 weights without activations stay fp32 */
    m3_variant v;
    char plain[2048], q[2048];
    m3_variant_default(&v);
    m3_variant_json(&v, plain, sizeof plain);
    assert_false(m3_tol_variant_quantizes(plain));
    assert_int_equal(m3_tol_class(&t, "fp32", "fp32", plain, plain), M3_TOL_FP32);
    static const char *const kv[][2] = {{"experts", "mxfp8"}, {"ptpc", "fp8"},
                                        {"kv_cache", "fp8"}, {"index_cache", "fp8"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        m3_variant_default(&v);
        assert_int_equal(m3_variant_set(&v, kv[i][0], kv[i][1]), M3_OK);
        m3_variant_json(&v, q, sizeof q);
        assert_true(m3_tol_variant_quantizes(q));
        assert_int_equal(m3_tol_class(&t, "fp32", "fp32", plain, q), M3_TOL_FP32Q);
        assert_int_equal(m3_tol_class(&t, "fp32", "fp32", q, NULL), M3_TOL_FP32Q);
        assert_int_equal(m3_tol_class(&t, "hf", "fp32", q, q), M3_TOL_LOWP);
    }
    m3_variant_default(&v);
    assert_int_equal(m3_variant_set(&v, "experts", "mxfp4"), M3_OK);
    assert_int_equal(m3_variant_set(&v, "moe_act_bound", "0"), M3_OK);
    m3_variant_json(&v, q, sizeof q);
    assert_false(m3_tol_variant_quantizes(q)); /* weights only */
    assert_int_equal(m3_variant_set(&v, "moe_act_bound", "1"), M3_OK);
    m3_variant_json(&v, q, sizeof q);
    assert_true(m3_tol_variant_quantizes(q));
    assert_string_equal(m3_tol_class_name(M3_TOL_FP32Q), "fp32q");
    /* fp32q bounds: the fp32 row with a 1e-4 floor on NMSE / KL; sets, top-1, embed and the
     * exact stages as fp32 */
    const m3_tol_row *mo = m3_tol_find(&t, "mlp_out"), *lg = m3_tol_find(&t, "logits");
    assert_true(mo->nmse[M3_TOL_FP32Q] == 1e-4 && mo->nmse[M3_TOL_FP32] == 1e-9);
    assert_true(lg->kl_mean[M3_TOL_FP32Q] == 1e-4 && lg->top1_min[M3_TOL_FP32Q] == 0.99);
    assert_true(m3_tol_find(&t, "embed")->nmse[M3_TOL_FP32Q] == 1e-12);
    assert_true(m3_tol_find(&t, "tokens")->nmse[M3_TOL_FP32Q] == 0);
    assert_true(m3_tol_find(&t, "expert_ids")->flip[M3_TOL_FP32Q] == 0);
    assert_int_equal(m3_tol_parse(&t, "{\"class\": \"lowp\", \"rel_floor\": 0.5, \"stages\": {"
                                      "\"attn_out\": {\"nmse\": 0.25}, \"mlp_out\": {\"nmse\": "
                                      "{\"fp32\": 1e-12, \"lowp\": 0.125}}, \"my_tap\": {\"flip\": 0.5}}}",
                                  "t.json"),
                     M3_OK);
    assert_true(m3_tol_find(&t, "attn_out")->nmse[0] == 0.25 && m3_tol_find(&t, "attn_out")->nmse[1] == 0.25);
    assert_true(m3_tol_find(&t, "mlp_out")->nmse[1] == 0.125);
    assert_true(m3_tol_find(&t, "my_tap")->flip[1] == 0.5);
    assert_true(t.rel_floor == 0.5);
    assert_int_equal(m3_tol_class(&t, "fp32", "fp32", NULL, NULL), M3_TOL_LOWP);
    /* an fp32 value carries to fp32q through its floor unless fp32q is given */
    assert_true(m3_tol_find(&t, "mlp_out")->nmse[M3_TOL_FP32Q] == 1e-4);
    assert_int_equal(m3_tol_parse(&t, "{\"class\": \"fp32q\", \"stages\": {\"mlp_out\": {\"nmse\": "
                                      "{\"fp32\": 1e-3, \"fp32q\": 2e-3}}, \"q\": {\"nmse\": {\"fp32\": 1e-3}}}}",
                                  "t.json"),
                     M3_OK);
    assert_int_equal(m3_tol_class(&t, "fp32", "fp32", NULL, NULL), M3_TOL_FP32Q);
    assert_true(m3_tol_find(&t, "mlp_out")->nmse[M3_TOL_FP32Q] == 2e-3);
    assert_true(m3_tol_find(&t, "q")->nmse[M3_TOL_FP32Q] == 1e-3);
    assert_int_equal(m3_tol_parse(&t, "{\"stages\": {\"q\": {\"nmse\": {\"fp33\": 1}}}}", "t.json"),
                     M3_ERR_FORMAT);
    /* typos are errors, never silently ignored */
    assert_int_equal(m3_tol_parse(&t, "{\"stages\": {\"attn_out\": {\"nmsee\": 1}}}", "t.json"), M3_ERR_FORMAT);
    assert_non_null(strstr(m3_last_error(), "nmsee"));
    assert_int_equal(m3_tol_parse(&t, "{\"stage\": {}}", "t.json"), M3_ERR_FORMAT);
    assert_int_equal(m3_tol_parse(&t, "{not json", "t.json"), M3_ERR_FORMAT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nmse_exact),         cmocka_unit_test(relative_error_floor),
        cmocka_unit_test(nonfinite_rules),    cmocka_unit_test(hist_and_merge),
        cmocka_unit_test(sets),               cmocka_unit_test(weights_by_id),
        cmocka_unit_test(logits_closed_form), cmocka_unit_test(tolerance_table),
    };
    return M3_RUN_TESTS(tests);
}
