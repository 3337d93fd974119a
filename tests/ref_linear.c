/* tests/ref_linear.c: ref/linear.[ch]. Exact sums on integer-valued inputs (cblas path,
 * naive path and an in-test double loop agree bit for bit), thread-count independence,
 * row pitches, fp32/bf16-rounded weights, the profile's output rounding, m3_dot_f32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/linear.h"
#include "tests/util.h"

typedef struct { int T, K, N; } shape;
/* awkward shapes: T = 1, 3, 33; K across the 1024 K-tile, odd; N not a multiple of 64 */
static const shape shapes[] = {{1, 7, 5}, {3, 1100, 130}, {33, 2049, 67}, {4, 64, 64}, {2, 1, 1}};

static void fill_bf16_int(m3_rng *r, m3_bf16 *w, size_t n, int bits) {
    for (size_t i = 0; i < n; i++) {
        float v;
        m3_fill_int(r, &v, 1, bits);
        w[i] = m3_f32_to_bf16(v);
    }
}

static void linear_exact_on_integers(void **state) {
    (void)state;
    m3_rng r;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        shape sh = shapes[s];
        m3_rng_init(&r, m3_test_seed(), s);
        size_t nx = (size_t)sh.T * sh.K, nw = (size_t)sh.N * sh.K, ny = (size_t)sh.T * sh.N;
        float *x = m3_guard_alloc(nx * 4), *y = m3_guard_alloc(ny * 4),
              *yn = m3_guard_alloc(ny * 4);
        m3_bf16 *w = m3_guard_alloc(nw * 2);
        /* |x|,|w| <= 8: |sum| <= 64 K < 2^24 for K < 2^18: every partial sum exact */
        m3_fill_int(&r, x, (int64_t)nx, 3);
        fill_bf16_int(&r, w, nw, 3);
        unsetenv("M3_NAIVE_GEMM");
        m3_linear(y, x, w, sh.T, sh.K, sh.N);
        setenv("M3_NAIVE_GEMM", "1", 1);
        m3_linear(yn, x, w, sh.T, sh.K, sh.N);
        unsetenv("M3_NAIVE_GEMM");
        double nrm = 0;
        for (int t = 0; t < sh.T; t++)
            for (int n = 0; n < sh.N; n++) {
                double acc = 0;
                for (int k = 0; k < sh.K; k++)
                    acc += (double)x[(size_t)t * sh.K + k] *
                           (double)m3_bf16_to_f32(w[(size_t)n * sh.K + k]);
                float got = y[(size_t)t * sh.N + n], gotn = yn[(size_t)t * sh.N + n];
                if (got != (float)acc || gotn != (float)acc)
                    m3_test_failf("linear(T=%d,K=%d,N=%d) [%d,%d]: blas %g naive %g exact %g",
                                  sh.T, sh.K, sh.N, t, n, (double)got, (double)gotn, acc);
                nrm += acc * acc;
            }
        if (nrm == 0) m3_test_failf("vacuous case T=%d K=%d N=%d", sh.T, sh.K, sh.N);
        m3_guard_free(x);
        m3_guard_free(y);
        m3_guard_free(yn);
        m3_guard_free(w);
    }
}

static void linear_same_for_any_thread_count(void **state) {
    (void)state;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 100);
    for (int T = 3; T <= 33; T += 30) { /* streamed-dot path (T <= 4) and sgemm path */
    int K = 1500, N = 300;
    float *x = malloc(sizeof(float) * T * K), *wf = malloc(sizeof(float) * N * K);
    float *y1 = malloc(sizeof(float) * T * N), *y3 = malloc(sizeof(float) * T * N);
    m3_bf16 *w = malloc(2 * (size_t)N * K);
    m3_fill_normal(&r, x, (int64_t)T * K, 1.0f);
    m3_fill_normal(&r, wf, (int64_t)N * K, 0.05f);
    for (int i = 0; i < N * K; i++) w[i] = m3_f32_to_bf16(wf[i]);
    for (int naive = 0; naive < 2; naive++) {
        if (naive) setenv("M3_NAIVE_GEMM", "1", 1);
        m3_set_threads(1);
        m3_linear(y1, x, w, T, K, N);
        m3_set_threads(3);
        m3_linear(y3, x, w, T, K, N);
        assert_memory_equal(y1, y3, sizeof(float) * T * N);
        m3_set_threads(1);
        m3_linear_f32(y1, N, x, K, wf, true, T, K, N);
        m3_set_threads(3);
        m3_linear_f32(y3, N, x, K, wf, true, T, K, N);
        assert_memory_equal(y1, y3, sizeof(float) * T * N);
        unsetenv("M3_NAIVE_GEMM");
    }
    m3_set_threads(0);
    free(x), free(wf), free(y1), free(y3), free(w);
    }
}

/* fp32 weights rounded on the fly == the same weights stored as bf16 (same tiling, same
 * order: bit-identical); unrounded fp32 weights stay within the fp32 bound. */
static void linear_f32_weights(void **state) {
    (void)state;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 101);
    int T = 3, K = 257, N = 129;
    float *x = malloc(sizeof(float) * T * K), *wf = malloc(sizeof(float) * N * K);
    float *ya = malloc(sizeof(float) * T * N), *yb = malloc(sizeof(float) * T * N);
    m3_bf16 *w = malloc(2 * (size_t)N * K);
    m3_fill_normal(&r, x, (int64_t)T * K, 1.0f);
    m3_fill_normal(&r, wf, (int64_t)N * K, 1.0f);
    for (int i = 0; i < N * K; i++) w[i] = m3_f32_to_bf16(wf[i]);
    m3_linear(ya, x, w, T, K, N);
    m3_linear_f32(yb, N, x, K, wf, true, T, K, N);
    assert_memory_equal(ya, yb, sizeof(float) * T * N);
    m3_linear_f32(yb, N, x, K, wf, false, T, K, N);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double acc = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                acc += (double)x[t * K + k] * (double)wf[n * K + k];
                mag += fabs((double)x[t * K + k] * (double)wf[n * K + k]);
            }
            /* fp32 accumulation bound: K * 2^-24 * sum|x w| (any summation order) */
            double bound = K * ldexp(1.0, -24) * mag;
            if (fabs((double)yb[t * N + n] - acc) > bound)
                m3_test_failf("f32 linear [%d,%d]: %g vs %g", t, n, (double)yb[t * N + n], acc);
        }
    free(x), free(wf), free(ya), free(yb), free(w);
}

/* m3_linear_ld writes only its column slice of a packed row; m3_linear_p rounds per profile */
static void linear_pitch_and_profile_rounding(void **state) {
    (void)state;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 102);
    int T = 3, K = 70, N = 20, LD = 50, OFF = 13;
    float *x = malloc(sizeof(float) * T * 80), *packed = malloc(sizeof(float) * T * LD);
    float *ref = malloc(sizeof(float) * T * N);
    m3_bf16 *w = malloc(2 * (size_t)N * K);
    m3_fill_normal(&r, x, (int64_t)T * 80, 1.0f);
    for (int i = 0; i < N * K; i++) w[i] = m3_f32_to_bf16(m3_rng_normal(&r));
    for (int i = 0; i < T * LD; i++) packed[i] = -12345.0f;
    /* x rows have pitch 80 (a slice of a wider row) */
    float *xc = malloc(sizeof(float) * T * K);
    for (int t = 0; t < T; t++) memcpy(xc + t * K, x + t * 80, sizeof(float) * K);
    m3_linear(ref, xc, w, T, K, N);
    m3_linear_ld(packed + OFF, LD, x, 80, w, T, K, N);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < LD; c++) {
            float v = packed[t * LD + c];
            if (c < OFF || c >= OFF + N) assert_true(v == -12345.0f);
            else assert_true(v == ref[t * N + c - OFF]);
        }
    m3_profile hf, f32;
    m3_profile_hf(&hf);
    m3_profile_fp32(&f32);
    m3_wmat wm = {M3_WFMT_BF16, w, N, K};
    float *y = malloc(sizeof(float) * T * N);
    m3_linear_p(y, N, xc, K, &wm, T, &f32);
    assert_memory_equal(y, ref, sizeof(float) * T * N);
    m3_linear_p(y, N, xc, K, &wm, T, &hf);
    int changed = 0;
    for (int i = 0; i < T * N; i++) {
        assert_true(y[i] == m3_round_bf16(ref[i])); /* one rounding of the fp32 GEMM output */
        changed += y[i] != ref[i];
    }
    assert_true(changed > 0); /* the rounding really happened */
    free(x), free(packed), free(ref), free(w), free(xc), free(y);
}

static void dot_order_and_exactness(void **state) {
    (void)state;
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 103);
    float a[131], b[131];
    for (int n = 0; n <= 131; n += 1) {
        m3_fill_int(&r, a, 131, 6);
        m3_fill_int(&r, b, 131, 6);
        double e = 0;
        for (int i = 0; i < n; i++) e += (double)a[i] * (double)b[i];
        assert_true(m3_dot_f32(a, b, n) == (float)e);
    }
    /* the documented lane order: lane sums then ((0+4)+(2+6))+((1+5)+(3+7)) */
    float x[9] = {1e8f, 1, 1, 1, -1e8f, 1, 1, 1, 1}, one[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    /* lane 0: 1e8 + 1 (the 9th element) = 1e8 (fp32); s0+s4 = 0; total 6 */
    assert_true(m3_dot_f32(x, one, 9) == 6.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(linear_exact_on_integers),
        cmocka_unit_test(linear_same_for_any_thread_count),
        cmocka_unit_test(linear_f32_weights),
        cmocka_unit_test(linear_pitch_and_profile_rounding),
        cmocka_unit_test(dot_order_and_exactness),
    };
    return M3_RUN_TESTS(tests);
}
