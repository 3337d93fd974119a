/* tests/gpu_base.c: the GPU foundation: context, arena, copies, error mapping, device
 * conversions bit-identical to ref/num (exhaustive over bf16), and the BLAS GEMM helper
 * against a double-precision host product. Skips every test without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu_test.h"

static void context_describes_device(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    const char *d = m3_gpu_describe(g);
    assert_true(strlen(d) > 0);
    int w = m3_gpu_warp_size(g);
    assert_true(w == 32 || w == 64);
    assert_true(m3_gpu_compiled());
    printf("  %s\n", d);
}

static void arena_aligns_marks_and_refuses(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    size_t m0 = m3_gpu_mark(g);
    void *a, *b, *c;
    GPU_OK(m3_gpu_alloc(g, &a, 3));
    GPU_OK(m3_gpu_alloc(g, &b, 1000));
    assert_int_equal((uintptr_t)a % 256, 0);
    assert_int_equal((uintptr_t)b % 256, 0);
    assert_true((char *)b >= (char *)a + 3);
    size_t m1 = m3_gpu_mark(g);
    GPU_OK(m3_gpu_alloc(g, &c, 5000));
    m3_gpu_release(g, m1);
    void *c2;
    GPU_OK(m3_gpu_alloc(g, &c2, 5000));
    assert_ptr_equal(c, c2); /* released space is reused */
    m3_gpu_release(g, m0);
    /* more than the arena holds: NOMEM with a message, nothing allocated */
    void *big = (void *)1;
    m3_status s = m3_gpu_alloc(g, &big, m3_gpu_arena_bytes(g) + 1);
    assert_int_equal(s, M3_ERR_NOMEM);
    assert_null(big);
    assert_non_null(strstr(m3_last_error(), "arena"));
    assert_int_equal(m3_gpu_mark(g), m0);
}

static void copies_round_trip(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 1);
    const size_t n = (1u << 20) + 13; /* odd byte count */
    unsigned char *h = malloc(n), *back = malloc(n);
    assert_non_null(h);
    assert_non_null(back);
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)m3_rng_u32(&r);
    unsigned char *d1 = gpu_guard_alloc(g, n), *d2 = gpu_guard_alloc(g, n);
    GPU_OK(m3_gpu_upload(g, d1, h, n));
    GPU_OK(m3_gpu_copy(g, d2, d1, n));
    GPU_OK(m3_gpu_download(g, back, d2, n));
    assert_memory_equal(h, back, n);
    GPU_OK(m3_gpu_memset(g, d2, 0x3C, n));
    GPU_OK(m3_gpu_download(g, back, d2, n));
    for (size_t i = 0; i < n; i++) assert_int_equal(back[i], 0x3C);
    gpu_guard_check(g, d1, n, "copy source");
    gpu_guard_check(g, d2, n, "copy destination");
    free(h);
    free(back);
}

static void runtime_errors_map_to_device_status(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    float h[4];
    /* a host stack address is no device pointer: the runtime refuses the copy */
    m3_clear_error();
    m3_status s = m3_gpu_download(g, h, (const void *)(uintptr_t)0x10, sizeof h);
    assert_int_equal(s, M3_ERR_DEVICE);
    const char *e = m3_last_error();
    printf("  error line: %s\n", e);
    assert_non_null(strstr(e, "gpu: "));
    assert_null(strchr(e, '\n'));
    /* the context still works afterwards (the error was not sticky) */
    GPU_OK(m3_gpu_sync(g));
    void *d;
    GPU_OK(m3_gpu_alloc(g, &d, 16));
    GPU_OK(m3_gpu_upload(g, d, h, 0));
}

static void bf16_conversions_match_ref_bit_for_bit(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    /* every bf16 code -> f32 -> bf16 */
    const int64_t nb = 65536;
    m3_bf16 *hb = malloc(nb * sizeof *hb), *hb2 = malloc(nb * sizeof *hb2);
    float *hf = malloc(nb * sizeof *hf);
    for (int64_t i = 0; i < nb; i++) hb[i] = (m3_bf16)i;
    m3_bf16 *db = gpu_guard_alloc(g, nb * sizeof *db), *db2 = gpu_guard_alloc(g, nb * sizeof *db2);
    float *df = gpu_guard_alloc(g, nb * sizeof *df);
    GPU_OK(m3_gpu_upload(g, db, hb, nb * sizeof *hb));
    GPU_OK(m3_gpu_bf16_to_f32(g, df, db, nb));
    GPU_OK(m3_gpu_f32_to_bf16(g, db2, df, nb));
    GPU_OK(m3_gpu_download(g, hf, df, nb * sizeof *hf));
    GPU_OK(m3_gpu_download(g, hb2, db2, nb * sizeof *hb2));
    for (int64_t i = 0; i < nb; i++) {
        uint32_t want = m3_f32_bits(m3_bf16_to_f32(hb[i]));
        if (m3_f32_bits(hf[i]) != want) m3_test_failf("bf16 0x%04x -> f32 differs", (unsigned)i);
        if (hb2[i] != m3_f32_to_bf16(hf[i]))
            m3_test_failf("bf16 0x%04x round trip gives 0x%04x", (unsigned)i, hb2[i]);
    }
    gpu_guard_check(g, df, nb * sizeof *df, "bf16_to_f32");
    gpu_guard_check(g, db2, nb * sizeof *db2, "f32_to_bf16");
    free(hb); free(hb2); free(hf);

    /* fp32 -> bf16 on random bit patterns plus every rounding-midpoint neighbourhood */
    const int64_t n = 1 << 22;
    uint32_t *bits = malloc(n * sizeof *bits);
    m3_bf16 *got = malloc(n * sizeof *got);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 2);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = m3_rng_u32(&r);
        if (i % 4 == 1) u = (u & 0xFFFF0000u) | 0x8000u; /* exact ties */
        if (i % 4 == 2) u = (u & 0xFFFF0000u) | 0x7FFFu; /* just below a tie */
        bits[i] = u;
    }
    bits[0] = 0x7F7FFFFFu; /* FLT_MAX rounds to inf */
    bits[1] = 0x7F800001u; /* signalling NaN stays NaN */
    bits[2] = 0x80000000u;
    float *dx = gpu_upload_f32(g, (const float *)bits, n);
    m3_bf16 *dy = gpu_guard_alloc(g, n * sizeof *dy);
    GPU_OK(m3_gpu_f32_to_bf16(g, dy, dx, n));
    GPU_OK(m3_gpu_download(g, got, dy, n * sizeof *got));
    for (int64_t i = 0; i < n; i++) {
        m3_bf16 want = m3_f32_to_bf16(m3_bits_f32(bits[i]));
        if (got[i] != want)
            m3_test_failf("f32 0x%08x -> bf16: gpu 0x%04x, ref 0x%04x", bits[i], got[i], want);
    }
    gpu_guard_check(g, dy, n * sizeof *dy, "f32_to_bf16 random");
    free(bits);
    free(got);
}

/* GEMM helper: y = x W^T, bf16 inputs, against a double host product of the same bf16
 * values. fp32 out: fp32 accumulation error only (GPU_NMSE_F32); bf16 out: GPU_NMSE_BF16. */
static void gemm_case(m3_gpu *g, int T, int N, int K) {
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 3 + (uint64_t)T * 7 + (uint64_t)N);
    float *x = malloc((size_t)T * K * sizeof *x), *w = malloc((size_t)N * K * sizeof *w);
    float *ref = malloc((size_t)T * N * sizeof *ref), *got = malloc((size_t)T * N * sizeof *got);
    m3_fill_uniform(&r, x, (int64_t)T * K, -1, 1);
    m3_fill_uniform(&r, w, (int64_t)N * K, -0.05f, 0.05f);
    m3_bf16 *dx = gpu_upload_bf16(g, x, (int64_t)T * K, x);
    m3_bf16 *dw = gpu_upload_bf16(g, w, (int64_t)N * K, w);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)x[(size_t)t * K + k] * (double)w[(size_t)n * K + k];
            ref[(size_t)t * N + n] = (float)s;
        }
    char what[128];
    float *dy = gpu_guard_alloc(g, (size_t)T * N * sizeof(float));
    GPU_OK(m3_gpu_gemm_bf16_f32(g, dy, dx, dw, T, N, K));
    gpu_download_f32(g, got, dy, (int64_t)T * N);
    gpu_guard_check(g, dy, (size_t)T * N * sizeof(float), "gemm f32 out");
    snprintf(what, sizeof what, "gemm_bf16_f32(T=%d,N=%d,K=%d,seed=%llu)", T, N, K,
             (unsigned long long)m3_test_seed());
    gpu_expect_nmse(ref, got, (int64_t)T * N, GPU_NMSE_F32, what);

    m3_bf16 *dyb = gpu_guard_alloc(g, (size_t)T * N * sizeof(m3_bf16));
    GPU_OK(m3_gpu_gemm_bf16(g, dyb, dx, dw, T, N, K));
    gpu_download_bf16(g, got, dyb, (int64_t)T * N);
    gpu_guard_check(g, dyb, (size_t)T * N * sizeof(m3_bf16), "gemm bf16 out");
    for (int64_t i = 0; i < (int64_t)T * N; i++) ref[i] = m3_round_bf16(ref[i]);
    snprintf(what, sizeof what, "gemm_bf16(T=%d,N=%d,K=%d,seed=%llu)", T, N, K,
             (unsigned long long)m3_test_seed());
    gpu_expect_nmse(ref, got, (int64_t)T * N, GPU_NMSE_BF16, what);
    free(x); free(w); free(ref); free(got);
}

static void gemm_bf16_matches_double_product(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    gemm_case(g, 1, 512, 6144);
    gemm_case(g, 33, 200, 6144);
    gemm_case(g, 3, 129, 9);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(context_describes_device),
        cmocka_unit_test(arena_aligns_marks_and_refuses),
        cmocka_unit_test(copies_round_trip),
        cmocka_unit_test(runtime_errors_map_to_device_status),
        cmocka_unit_test(bf16_conversions_match_ref_bit_for_bit),
        cmocka_unit_test(gemm_bf16_matches_double_product),
    };
    return M3_RUN_GPU_TESTS(tests);
}
