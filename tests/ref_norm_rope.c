/* tests/ref_norm_rope.c: embedding, Gemma RMSNorm (+ residual add, per profile), partial
 * NeoX RoPE (inverse frequencies, norm preservation, hf per-op roundings) and the q/k
 * norm + rope rounding points. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/embed.h"
#include "ref/norm.h"
#include "ref/rope.h"
#include "tests/util.h"

static const float EPS = 9.99999997e-07f; /* f32(1e-6) */

static void embed_lookup_and_bad_id(void **state) {
    (void)state;
    enum { V = 11, D = 5 };
    m3_bf16 tab[V * D];
    for (int i = 0; i < V * D; i++) tab[i] = m3_f32_to_bf16((float)i * 0.5f - 3.0f);
    int32_t ids[3] = {10, 0, 4};
    float y[3 * D];
    assert_int_equal(m3_embed(y, ids, 3, tab, V, D), M3_OK);
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < D; i++) assert_true(y[t * D + i] == m3_bf16_to_f32(tab[ids[t] * D + i]));
    int32_t bad[2] = {1, V};
    float keep[2 * D];
    for (int i = 0; i < 2 * D; i++) keep[i] = 42.0f;
    assert_int_equal(m3_embed(keep, bad, 2, tab, V, D), M3_ERR_ARG);
    assert_non_null(strstr(m3_last_error(), "token 1"));
    for (int i = 0; i < 2 * D; i++) assert_true(keep[i] == 42.0f); /* nothing half-written */
}

/* Against a double-precision evaluation of the same formula: fp32 error of a few ulp. */
static void rmsnorm_matches_formula(void **state) {
    (void)state;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 1);
    int dims[] = {1, 9, 128, 6144};
    for (size_t di = 0; di < 4; di++) {
        int D = dims[di], T = 3;
        float *x = malloc(sizeof(float) * T * D), *y = malloc(sizeof(float) * T * D);
        m3_bf16 *w = malloc(2 * (size_t)D);
        m3_fill_normal(&r, x, (int64_t)T * D, 2.0f);
        for (int i = 0; i < D; i++) w[i] = m3_f32_to_bf16(m3_rng_normal(&r) * 0.3f);
        m3_rmsnorm(y, x, w, T, D, EPS);
        for (int t = 0; t < T; t++) {
            double ss = 0;
            for (int i = 0; i < D; i++) ss += (double)x[t * D + i] * (double)x[t * D + i];
            double rho = 1.0 / sqrt(ss / D + (double)EPS);
            for (int i = 0; i < D; i++) {
                double e = (double)x[t * D + i] * rho * (1.0 + (double)m3_bf16_to_f32(w[i]));
                /* fp32 sum of D squares: relative error <= D*2^-24 on mu, halved by the
                 * square root, plus a few roundings in the products */
                double tol = (D * 0.5 + 4) * ldexp(1.0, -24) * fabs(e) + 1e-30;
                if (fabs((double)y[t * D + i] - e) > tol)
                    m3_test_failf("rmsnorm(T=%d,D=%d)[%d,%d]: %g vs %g", T, D, t, i,
                                  (double)y[t * D + i], e);
            }
        }
        /* y may alias x */
        float *x2 = malloc(sizeof(float) * T * D);
        memcpy(x2, x, sizeof(float) * T * D);
        m3_rmsnorm(x2, x2, w, T, D, EPS);
        assert_memory_equal(x2, y, sizeof(float) * T * D);
        free(x), free(y), free(w), free(x2);
    }
}

/* The residual roundings of each profile on a crafted value: r = 1, h = 2^-9 + 2^-12.
 * fp32: s exact; hf: s = bf16(s) = 1 + 2^-7 (rounds up) and the norm reads it; atom: the
 * norm reads the fp32 s but the stored residual is bf16(s). */
static void rmsnorm_add_profiles(void **state) {
    (void)state;
    enum { D = 8 };
    m3_bf16 w[D];
    for (int i = 0; i < D; i++) w[i] = m3_f32_to_bf16(0.25f * (float)i - 0.5f);
    float h[D], r0[D], r[D], y[D], s[D], yn[D];
    for (int i = 0; i < D; i++) {
        r0[i] = 1.0f + (float)i;
        h[i] = ldexpf(1.0f, -9) * (1.0f + (float)i) + ldexpf(1.0f, -12);
        s[i] = r0[i] + h[i];
    }
    m3_profile f, hf, at;
    m3_profile_fp32(&f);
    m3_profile_hf(&hf);
    m3_profile_atom(&at);
    /* fp32 */
    memcpy(r, r0, sizeof r);
    m3_rmsnorm_add(y, r, h, w, 1, D, EPS, &f);
    m3_rmsnorm(yn, s, w, 1, D, EPS);
    assert_memory_equal(r, s, sizeof r);
    assert_memory_equal(y, yn, sizeof y);
    /* hf */
    float sb[D];
    for (int i = 0; i < D; i++) sb[i] = m3_round_bf16(s[i]);
    assert_true(memcmp(sb, s, sizeof s) != 0); /* the crafted sum is not bf16 */
    memcpy(r, r0, sizeof r);
    m3_rmsnorm_add(y, r, h, w, 1, D, EPS, &hf);
    m3_rmsnorm(yn, sb, w, 1, D, EPS);
    assert_memory_equal(r, sb, sizeof r);
    for (int i = 0; i < D; i++) assert_true(y[i] == m3_round_bf16(yn[i]));
    /* atom */
    memcpy(r, r0, sizeof r);
    m3_rmsnorm_add(y, r, h, w, 1, D, EPS, &at);
    m3_rmsnorm(yn, s, w, 1, D, EPS);
    assert_memory_equal(r, sb, sizeof r);
    for (int i = 0; i < D; i++) assert_true(y[i] == m3_round_bf16(yn[i]));
    /* h = NULL: the norm of r itself */
    memcpy(r, r0, sizeof r);
    m3_rmsnorm_add(y, r, NULL, w, 1, D, EPS, &f);
    m3_rmsnorm(yn, r0, w, 1, D, EPS);
    assert_memory_equal(y, yn, sizeof y);
    m3_residual_add(y, r0, h, D, &hf);
    assert_memory_equal(y, sb, sizeof y);
}

/* inv[i] for theta = 5e6, R = 64: spec values, both evaluations within 1 ulp of each other */
static void rope_inverse_frequencies(void **state) {
    (void)state;
    float a[32], b[32];
    m3_rope_inv_freq(a, 64, 5e6f, M3_ROPE_INV_TORCH);
    m3_rope_inv_freq(b, 64, 5e6f, M3_ROPE_INV_F64);
    assert_true(a[0] == 1.0f && b[0] == 1.0f);
    assert_true(fabsf(a[1] - 0.61752876f) <= 1e-7f);
    assert_true(fabsf(a[31] - 3.2387e-7f) <= 1e-10f);
    int differ = 0;
    for (int i = 0; i < 32; i++) {
        uint32_t ua = m3_f32_bits(a[i]), ub = m3_f32_bits(b[i]);
        assert_true(ua - ub + 1u <= 2u); /* |ulp difference| <= 1 */
        differ += ua != ub;
    }
    printf("rope inv: torch-style vs f64 differ in %d of 32 entries (<= 1 ulp)\n", differ);
}

/* fp32 rope: norms preserved (rotation), pass-through dims untouched, position 0 = identity */
static void rope_preserves_norms(void **state) {
    (void)state;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 2);
    int T = 33, H = 3, Dh = 20, R = 12, LD = 70;
    float *x = malloc(sizeof(float) * T * LD), *x0 = malloc(sizeof(float) * T * LD);
    int32_t *pos = malloc(sizeof(int32_t) * T);
    m3_fill_normal(&r, x0, (int64_t)T * LD, 1.0f);
    for (int t = 0; t < T; t++) pos[t] = t == 0 ? 0 : (int32_t)(m3_rng_u32(&r) % 1048576u);
    memcpy(x, x0, sizeof(float) * T * LD);
    m3_profile f;
    m3_profile_fp32(&f);
    m3_rope_neox(x, LD, pos, T, H, Dh, R, 5e6f, &f);
    for (int t = 0; t < T; t++) {
        for (int c = H * Dh; c < LD; c++) assert_true(x[t * LD + c] == x0[t * LD + c]);
        for (int h = 0; h < H; h++) {
            const float *a = x + t * LD + h * Dh, *b = x0 + t * LD + h * Dh;
            for (int i = R; i < Dh; i++) assert_true(a[i] == b[i]);
            for (int i = 0; i < R / 2; i++) {
                double a1 = a[i], a2 = a[i + R / 2], b1 = b[i], b2 = b[i + R / 2];
                double na = a1 * a1 + a2 * a2;
                double nb = b1 * b1 + b2 * b2;
                /* cos^2+sin^2 = 1 up to fp32 rounding of c, s and the products */
                if (fabs(na - nb) > 1e-6 * nb + 1e-30)
                    m3_test_failf("rope norm pos=%d h=%d pair %d: %g vs %g", (int)pos[t], h, i, na,
                                  nb);
            }
            if (pos[t] == 0)
                for (int i = 0; i < Dh; i++) assert_true(a[i] == b[i]);
        }
    }
    free(x), free(x0), free(pos);
}

/* hf: bf16 cos/sin and a bf16 rounding after each product and after the sum, exactly */
static void rope_hf_per_op_rounding(void **state) {
    (void)state;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 3);
    int Dh = 16, R = 8;
    float x[16], e[16];
    for (int i = 0; i < Dh; i++) x[i] = m3_round_bf16(m3_rng_normal(&r));
    memcpy(e, x, sizeof x);
    int32_t pos = 1234567;
    m3_profile hf;
    m3_profile_hf(&hf);
    m3_rope_neox(e, Dh, &pos, 1, 1, Dh, R, 5e6f, &hf);
    float inv[4], c[4], s[4];
    m3_rope_inv_freq(inv, R, 5e6f, M3_ROPE_INV_TORCH);
    int rounded = 0;
    for (int i = 0; i < 4; i++) {
        float a = (float)pos * inv[i];
        c[i] = m3_round_bf16((float)cos((double)a));
        s[i] = m3_round_bf16((float)sin((double)a));
        rounded += c[i] != (float)cos((double)a);
        float lo = m3_round_bf16(m3_round_bf16(x[i] * c[i]) + m3_round_bf16(-x[i + 4] * s[i]));
        float hi = m3_round_bf16(m3_round_bf16(x[i + 4] * c[i]) + m3_round_bf16(x[i] * s[i]));
        assert_true(e[i] == lo);
        assert_true(e[i + 4] == hi);
    }
    assert_true(rounded > 0);
    for (int i = R; i < Dh; i++) assert_true(e[i] == x[i]);
}

/* q/k norm + rope: NONE = fp32 norm then fp32 rope; PER_OP = bf16 norm then per-op rope;
 * ONCE = fp32 both then one rounding (every output, pass-through dims too) */
static void qk_norm_rope_rounding_points(void **state) {
    (void)state;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 4);
    int T = 3, H = 2, Dh = 32, R = 16;
    int n = T * H * Dh;
    float *x = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * n),
          *b = malloc(sizeof(float) * n);
    m3_bf16 w[32];
    for (int i = 0; i < Dh; i++) w[i] = m3_f32_to_bf16(m3_rng_normal(&r) * 0.2f);
    m3_fill_normal(&r, x, n, 3.0f);
    int32_t pos[3] = {0, 5, 4095};
    m3_profile f, hf, at;
    m3_profile_fp32(&f);
    m3_profile_hf(&hf);
    m3_profile_atom(&at);
    /* fp32 */
    memcpy(a, x, sizeof(float) * n);
    m3_qk_norm_rope(a, H * Dh, pos, T, H, Dh, w, EPS, R, 5e6f, &f);
    memcpy(b, x, sizeof(float) * n);
    m3_rmsnorm_heads(b, H * Dh, T, H, Dh, w, EPS);
    m3_rope_neox(b, H * Dh, pos, T, H, Dh, R, 5e6f, &f);
    assert_memory_equal(a, b, sizeof(float) * n);
    /* hf */
    memcpy(a, x, sizeof(float) * n);
    m3_qk_norm_rope(a, H * Dh, pos, T, H, Dh, w, EPS, R, 5e6f, &hf);
    memcpy(b, x, sizeof(float) * n);
    m3_rmsnorm_heads(b, H * Dh, T, H, Dh, w, EPS);
    m3_round_bf16_n(b, n);
    m3_rope_neox(b, H * Dh, pos, T, H, Dh, R, 5e6f, &hf);
    assert_memory_equal(a, b, sizeof(float) * n);
    for (int i = 0; i < n; i++) assert_true(a[i] == m3_round_bf16(a[i]));
    /* atom: rope in fp32 arithmetic with bf16 cos/sin, one rounding at the end */
    memcpy(a, x, sizeof(float) * n);
    m3_qk_norm_rope(a, H * Dh, pos, T, H, Dh, w, EPS, R, 5e6f, &at);
    memcpy(b, x, sizeof(float) * n);
    m3_rmsnorm_heads(b, H * Dh, T, H, Dh, w, EPS);
    m3_rope_neox(b, H * Dh, pos, T, H, Dh, R, 5e6f, &at); /* qk_round ONCE: no inner rounding */
    m3_round_bf16_n(b, n);
    assert_memory_equal(a, b, sizeof(float) * n);
    free(x), free(a), free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(embed_lookup_and_bad_id),
        cmocka_unit_test(rmsnorm_matches_formula),
        cmocka_unit_test(rmsnorm_add_profiles),
        cmocka_unit_test(rope_inverse_frequencies),
        cmocka_unit_test(rope_preserves_norms),
        cmocka_unit_test(rope_hf_per_op_rounding),
        cmocka_unit_test(qk_norm_rope_rounding_points),
    };
    return M3_RUN_TESTS(tests);
}
