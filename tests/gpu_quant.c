/* tests/gpu_quant.c: gpu/quant.hip (m3_gpu_mx_qdq_bf16) against ref/quant.c's
 * m3_mx_quantize + m3_mx_dequantize on the same bf16-valued rows. Bound: bit-identical (the
 * device runs ref/num/mx.h's own scalar functions, and the dequantized values of bf16 inputs
 * are exact in bf16; gpu/quant.hip says why). NaN results must be NaN on both sides (payloads
 * are not compared). Inputs: per-block magnitudes 2^-133 .. 2^122 (bf16 subnormals through
 * near the bf16 max), all-zero blocks of +0 and -0, blocks with one dominant element, values
 * on the element grid's rounding midpoints, and (one case) NaN / inf blocks. Every element
 * type x scale rule x rounding, both zero-block rules and both fp8 overflow modes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/quant.h"
#include "tests/gpu_test.h"

/* bf16-valued rows, block by block of 32: a mix of the shapes listed above */
static void make_rows(m3_rng *r, float *x, int rows, int cols, bool nonfinite) {
    for (int64_t b = 0; b < (int64_t)rows * cols / 32; b++) {
        float *v = x + b * 32;
        const int kind = (int)(m3_rng_u32(r) % 10);
        const int e = (int)(m3_rng_u32(r) % 244) - 133; /* block magnitude 2^e, e in [-133, 110] */
        for (int i = 0; i < 32; i++) v[i] = ldexpf(m3_rng_normal(r), e);
        if (kind == 0) { /* zero block: +0 and -0 */
            for (int i = 0; i < 32; i++) v[i] = (m3_rng_u32(r) & 1) ? -0.0f : 0.0f;
        } else if (kind == 1) { /* one dominant element: the others mostly round to 0 */
            v[m3_rng_u32(r) % 32] = ldexpf(1.5f, e + 12);
        } else if (kind == 2) { /* small integers times a power of two: exact midpoints of the
                                   e2m1 / fp8 grids, where RNE and RNA differ */
            for (int i = 0; i < 32; i++)
                v[i] = ldexpf((float)((int)(m3_rng_u32(r) % 61) - 30) * 0.25f, e > 100 ? 100 : e);
        } else if (kind == 3) { /* a block in the bf16 subnormal range */
            for (int i = 0; i < 32; i++) v[i] = ldexpf((float)((int)(m3_rng_u32(r) % 255) - 127), -133);
        } else if (kind == 4 && nonfinite) { /* poisoned: one NaN or inf */
            v[m3_rng_u32(r) % 32] = (m3_rng_u32(r) & 1) ? NAN : -INFINITY;
        }
        for (int i = 0; i < 32; i++) v[i] = m3_round_bf16(v[i]);
    }
}

static const char *elem_name[] = {"e2m1", "e4m3fn", "e4m3fnuz", "e5m2"};
static const char *scale_name[] = {"floor", "even", "rceil"};

/* one comparison: every element bit-identical (NaN: NaN on both sides) */
static void qdq_case(m3_gpu *g, const float *x, int rows, int cols, const m3_mx_params *p,
                     bool in_place, const char *tag) {
    const int64_t n = (int64_t)rows * cols;
    uint8_t *codes = malloc((size_t)(rows * m3_mx_row_bytes(cols, p)) + 1);
    m3_e8m0 *sc = malloc((size_t)rows * (size_t)m3_mx_n_blocks(cols, p) + 1);
    float *ref = malloc((size_t)n * sizeof *ref), *got = malloc((size_t)n * sizeof *got);
    assert_true(codes && sc && ref && got);
    m3_mx_quantize(codes, sc, x, rows, cols, p);
    m3_mx_dequantize(ref, codes, sc, rows, cols, p);
    const size_t mark = m3_gpu_mark(g);
    m3_bf16 *dy = gpu_guard_alloc(g, (size_t)n * sizeof(m3_bf16));
    float *chk = malloc((size_t)n * sizeof *chk);
    assert_non_null(chk);
    if (in_place) {
        m3_bf16 *tmp = malloc((size_t)n * sizeof *tmp);
        assert_non_null(tmp);
        for (int64_t i = 0; i < n; i++) tmp[i] = m3_f32_to_bf16(x[i]);
        GPU_OK(m3_gpu_upload(g, dy, tmp, (size_t)n * sizeof *tmp));
        free(tmp);
        GPU_OK(m3_gpu_mx_qdq_bf16(g, dy, dy, rows, cols, p));
    } else {
        m3_bf16 *dx = gpu_upload_bf16(g, x, n, chk);
        for (int64_t i = 0; i < n; i++) /* the inputs are bf16 values already */
            if (memcmp(&chk[i], &x[i], sizeof(float))) m3_test_failf("%s: input %lld not bf16", tag, (long long)i);
        GPU_OK(m3_gpu_mx_qdq_bf16(g, dy, dx, rows, cols, p));
    }
    gpu_download_bf16(g, got, dy, n);
    gpu_guard_check(g, dy, (size_t)n * sizeof(m3_bf16), tag);
    int64_t bad = 0, nan = 0, nonzero = 0;
    for (int64_t i = 0; i < n; i++) {
        const bool rn = isnan(ref[i]), gn = isnan(got[i]);
        if (rn || gn) {
            nan += rn;
            if (rn != gn) bad++;
        } else if (memcmp(&ref[i], &got[i], sizeof(float))) {
            if (bad < 3)
                printf("    %s: element %lld (x %a): ref %a gpu %a\n", tag, (long long)i,
                       (double)x[i], (double)ref[i], (double)got[i]);
            bad++;
        }
        nonzero += ref[i] != 0.0f;
    }
    printf("  %-62s %lld differing of %lld (%lld NaN, %lld nonzero)\n", tag, (long long)bad,
           (long long)n, (long long)nan, (long long)nonzero);
    if (bad) m3_test_failf("%s: %lld elements differ from ref/quant.c", tag, (long long)bad);
    if (nonzero < n / 4) m3_test_failf("%s: only %lld nonzero results (vacuous)", tag, (long long)nonzero);
    m3_gpu_release(g, mark);
    free(codes); free(sc); free(ref); free(got); free(chk);
}

static void mx_qdq_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    const int rows = 24, cols = 6144;
    float *x = malloc((size_t)rows * cols * sizeof *x);
    assert_non_null(x);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 1300);
    make_rows(&r, x, rows, cols, false);
    char tag[128];
    for (int el = 0; el < 4; el++)
        for (int sr = 0; sr < 3; sr++)
            for (int rd = 0; rd < 2; rd++) {
                m3_mx_params p = m3_mx_params_default((m3_mx_elem)el);
                p.scale = (m3_mx_scale_rule)sr;
                p.round = (m3_mx_round)rd;
                p.zero = (el + sr + rd) % 2 ? M3_MX_ZERO_MIN_NORMAL : M3_MX_ZERO_BYTE0;
                p.ovf = sr == M3_MX_SCALE_FLOOR && rd ? M3_FP8_OVF_NAN : M3_FP8_SATURATE;
                snprintf(tag, sizeof tag, "mx_qdq %s %s %s zero=%d ovf=%d (%dx%d)", elem_name[el],
                         scale_name[sr], rd ? "rna" : "rne", (int)p.zero, (int)p.ovf, rows, cols);
                qdq_case(g, x, rows, cols, &p, false, tag);
            }
    free(x);
}

/* the serving paths' activation rules (rceil, RNE, saturate) on the expert shapes, in place
 * (how m3_gpu_moe_experts uses it on the swiglu output), plus NaN / inf blocks */
static void mx_qdq_in_place_and_nonfinite(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    const int rows = 37, cols = 3072;
    float *x = malloc((size_t)rows * cols * sizeof *x);
    assert_non_null(x);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 1301);
    make_rows(&r, x, rows, cols, true);
    static const m3_mx_elem els[] = {M3_MX_E2M1, M3_MX_E4M3FN, M3_MX_E4M3FNUZ};
    char tag[128];
    for (int i = 0; i < 3; i++) {
        m3_mx_params p = m3_mx_params_default(els[i]);
        p.scale = M3_MX_SCALE_RCEIL;
        snprintf(tag, sizeof tag, "mx_qdq %s rceil in place, NaN/inf blocks (%dx%d)",
                 elem_name[els[i]], rows, cols);
        qdq_case(g, x, rows, cols, &p, true, tag);
    }
    free(x);
}

/* block sizes other than 32 (and cols not a multiple of 32) are refused, nothing written */
static void mx_qdq_unsupported(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    m3_mx_params p = m3_mx_params_default(M3_MX_E4M3FN);
    void *buf;
    GPU_OK(m3_gpu_alloc(g, &buf, 4096));
    p.block = 16;
    assert_int_equal(m3_gpu_mx_qdq_bf16(g, buf, buf, 2, 64, &p), M3_ERR_UNSUPPORTED);
    p.block = 32;
    assert_int_equal(m3_gpu_mx_qdq_bf16(g, buf, buf, 2, 48, &p), M3_ERR_UNSUPPORTED);
    assert_int_equal(m3_gpu_mx_qdq_bf16(g, buf, buf, 0, 64, &p), M3_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mx_qdq_matches_ref),
        cmocka_unit_test(mx_qdq_in_place_and_nonfinite),
        cmocka_unit_test(mx_qdq_unsupported),
    };
    return M3_RUN_GPU_TESTS(tests);
}
