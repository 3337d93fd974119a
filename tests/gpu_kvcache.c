/* tests/gpu_kvcache.c: gpu/kvcache.hip (m3_gpu_kv_cache_write) against the spec's layout
 * formulas (§4.2 page-128 SHUFFLE, §4.3 page-16 re-view) applied here on the host, and the
 * fp8 rows quantized by ref/quant.c (m3_fp8_quantize_rows: DIV, saturate, zero row -> 1).
 * The whole cache (untouched bytes included: they keep a fill pattern) and every scale must
 * be identical byte for byte. Cases: bf16 and fp8 (fp8_max 240 and 448), both pages, Hkv 4,
 * Dh 128 (M3) and Hkv 3, Dh 64 (odd), scattered slots over several blocks, a padding slot
 * (-1), a zero row (scale 1) and a row of large values; plain rows (page 0, bf16); runs of
 * consecutive slots (T 1, 64, 300, 4500) from aligned and misaligned starts (the fp8 writer's
 * 8- and 16-token steps); passes of >= 10 tokens
 * also hold rows of tiny values, and one has scattered slots; signed zeros
 * and tiny values of either sign inside rows of normal scale (codes +0 and -0). The same
 * cases right after launches that write the rows or the slots (kv_cache_write_after_write:
 * the writer is a programmatic dependent launch). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/quant.h"
#include "tests/gpu_test.h"

#define KV_FILL 0xEE

/* kv_cache_write_after_write: each case also runs right after a kernel writing its rows or
 * slots (below) */
static bool g_after;

/* run0 >= 0: slots run0 + t (one sequence filling its blocks: whole x-token groups of the V
 * layout, cut at both ends when run0 is not x-aligned); else distinct random slots */
/* The fp8 code sweep (sweep != 0, Hkv 4, Dh 128): the rows enumerate every bf16 magnitude up to
 * each of the row maxima in kv_sweep_amax (one per row group, element 0 of every row of the group
 * = +-amax, the others 0, 1, 2, ... as bf16 bits with alternating signs), so every (value, scale)
 * pair the fp8 writer meets at those scales is compared with ref's division; amax = fp8_max 2^k
 * gives scales 2^k: quotients exactly on e4m3 rounding midpoints (ties to even). */
static const uint16_t kv_sweep_amax[] = {
    0x4370 /* 240 */, 0x43E0 /* 448 */, 0x3F70 /* 0.9375 = 240 / 256 */, 0x3FE0 /* 1.75 */,
    0x4670 /* 240 * 2^6 */, 0x4AE0 /* 448 * 2^14 */, 0x3770 /* 240 * 2^-16 */, 0x2BE0 /* 448 2^-40 */,
    0x7F7F /* bf16 max */, 0x3F80, 0x4000, 0x3FFF, 0x4001, 0x40A3, 0x4123, 0x41C9, 0x42F7,
    0x3E9A, 0x3D4D, 0x3C11, 0x3AB5, 0x38E9, 0x3581, 0x3277, 0x2F3D, 0x2A17, 0x2507, 0x1F55,
    0x4B1D, 0x4E6F, 0x5233, 0x55C1, 0x5A0B, 0x5F99, 0x6455, 0x69E3, 0x6F2D, 0x7405, 0x7A4B,
    0x0F35 /* tiny: scale below div_y's range */, 0x4455, 0x4555, 0x3355, 0x3155,
};
#define KV_SWEEP_N ((int)(sizeof kv_sweep_amax / sizeof kv_sweep_amax[0]))
static int kv_sweep_rows(void) {
    int n = 0;
    for (int a = 0; a < KV_SWEEP_N; a++) n += (kv_sweep_amax[a] + 127) / 127;
    return n;
}
/* row R of the sweep into x[128] */
static void kv_sweep_row(float *x, int R) {
    int a = 0;
    while (a < KV_SWEEP_N - 1 && R >= (kv_sweep_amax[a] + 127) / 127) R -= (kv_sweep_amax[a] + 127) / 127, a++;
    const uint32_t am = kv_sweep_amax[a];
    x[0] = m3_bits_f32((R & 1 ? 0x80000000u : 0u) | am << 16);
    for (int i = 1; i < 128; i++) {
        uint32_t m = (uint32_t)(R * 127 + i - 1);
        if (m > am) m = am;
        x[i] = m3_bits_f32(((uint32_t)(i + R) & 1u) << 31 | m << 16);
    }
}

static void kv_case_x(m3_gpu *g, int T, int Hkv, int Dh, int page, bool fp8, float fp8_max, int run0, int sweep) {
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 1100 + (uint64_t)T * 5 + (uint64_t)page + (fp8 ? 7 : 0) +
                                        (uint64_t)fp8_max);
    const int n_blk128 = run0 >= 0 && run0 + T > 6 * 128 ? (run0 + T) / 128 + 1 : 6;
    const int ld = Hkv * Dh + 24; /* padded pitch: slices of a packed row */
    const int64_t n_slots = (int64_t)n_blk128 * 128;
    const int es = fp8 ? 1 : 2, x = 16 / es;
    const size_t cache_bytes = (size_t)n_slots * Hkv * Dh * es, scale_n = (size_t)n_slots * Hkv;
    float *k = malloc((size_t)T * ld * sizeof *k), *v = malloc((size_t)T * ld * sizeof *v);
    m3_fill_normal(&r, k, (int64_t)T * ld, 2.0f);
    m3_fill_normal(&r, v, (int64_t)T * ld, 2.0f);
    for (int t = 0; t < T && sweep; t++) /* V: the same rows in another order */
        for (int h = 0; h < Hkv; h++) {
            const int R = t * Hkv + h, nr = kv_sweep_rows();
            kv_sweep_row(k + (size_t)t * ld + (size_t)h * Dh, R % nr);
            kv_sweep_row(v + (size_t)t * ld + (size_t)h * Dh, (R * 7 + 3) % nr);
        }
    if (!sweep) {
    for (int d = 0; d < Dh && T > 1; d++) k[(size_t)1 * ld + d] = 0.0f;        /* token 1 head 0: zeros */
    for (int d = 0; d < Dh && T > 2; d++) v[(size_t)2 * ld + Dh + d] *= 300.0f; /* token 2 head 1: large */
    /* signed zeros and tiny values (codes +-0) in rows of normal scale: the code's sign comes
     * from the value, also where the quotient is zero (T > 6: token 5's K, token 6's V) */
    for (int d = 0; d < Dh && T > 6; d += 3) {
        k[(size_t)5 * ld + d] = d % 2 ? -0.0f : (d % 4 ? 1e-9f : -1e-9f);
        v[(size_t)6 * ld + Dh + d] = d % 2 ? -0.0f : (d % 4 ? -1e-9f : 1e-9f);
    }
    if (T >= 10) { /* the warp kernels' other quotient path: tiny rows (scales below div_y's
                    * range: the division). (No infinities: inf / inf is the host's default
                    * NaN, negative on x86, so ref's code for it is the platform's.) */
        for (int d = 0; d < Dh; d++) k[(size_t)7 * ld + 2 * Dh + d] *= 1e-30f;
        for (int d = 0; d < Dh; d++) v[(size_t)9 * ld + 2 * Dh + d] *= 1e-30f;
    }
    }
    /* distinct random slots (or a run); token 3 is padding */
    int64_t *slots = malloc(T * sizeof *slots);
    for (int t = 0; t < T && run0 >= 0; t++) slots[t] = run0 + t;
    for (int t = 0; t < T && run0 < 0; t++) {
        bool again;
        do {
            slots[t] = (int64_t)(m3_rng_u32(&r) % (uint32_t)n_slots);
            again = false;
            for (int u = 0; u < t; u++) again |= slots[u] == slots[t];
        } while (again);
    }
    if (T > 3 && !sweep) slots[3] = -1;
    m3_bf16 *dk = gpu_upload_bf16(g, k, (int64_t)T * ld, k); /* k, v now hold the bf16 values */
    m3_bf16 *dv = gpu_upload_bf16(g, v, (int64_t)T * ld, v);
    void *dslots;
    GPU_OK(m3_gpu_alloc(g, &dslots, ((size_t)T * sizeof *slots + 15) & ~(size_t)15)); /* 16-byte units: g_after's copy */
    GPU_OK(m3_gpu_upload(g, dslots, slots, T * sizeof *slots));
    m3_gpu_kv_cache c;
    memset(&c, 0, sizeof c);
    c.page = page, c.fp8 = fp8, c.fp8_max = fp8_max;
    c.k = gpu_guard_alloc(g, cache_bytes);
    c.v = gpu_guard_alloc(g, cache_bytes);
    GPU_OK(m3_gpu_memset(g, c.k, KV_FILL, cache_bytes));
    GPU_OK(m3_gpu_memset(g, c.v, KV_FILL, cache_bytes));
    if (fp8) {
        c.k_scale = gpu_guard_alloc(g, scale_n * sizeof(float));
        c.v_scale = gpu_guard_alloc(g, scale_n * sizeof(float));
        GPU_OK(m3_gpu_memset(g, c.k_scale, KV_FILL, scale_n * sizeof(float)));
        GPU_OK(m3_gpu_memset(g, c.v_scale, KV_FILL, scale_n * sizeof(float)));
    }
    /* expected bytes */
    unsigned char *ek = malloc(cache_bytes), *ev = malloc(cache_bytes);
    unsigned char *gk = malloc(cache_bytes), *gv = malloc(cache_bytes);
    float *eks = malloc(scale_n * sizeof(float)), *evs = malloc(scale_n * sizeof(float));
    float *gks = malloc(scale_n * sizeof(float)), *gvs = malloc(scale_n * sizeof(float));
    memset(ek, KV_FILL, cache_bytes);
    memset(ev, KV_FILL, cache_bytes);
    memset(eks, KV_FILL, scale_n * sizeof(float));
    memset(evs, KV_FILL, scale_n * sizeof(float));
    m3_fp8q_params qp = m3_fp8q_params_default(M3_FP8_E4M3FN);
    qp.zero_row = M3_PTPC_ZERO_ONE, qp.fp8_max = fp8_max;
    m3_fp8 codes[2][512];
    for (int t = 0; t < T; t++) {
        if (slots[t] < 0) continue;
        const int64_t b = page ? slots[t] / page : 0, tt = page ? slots[t] % page : 0;
        for (int h = 0; h < Hkv; h++) {
            const float *row[2] = {k + (size_t)t * ld + (size_t)h * Dh, v + (size_t)t * ld + (size_t)h * Dh};
            float sc[2] = {1.0f, 1.0f};
            if (fp8)
                for (int w = 0; w < 2; w++) m3_fp8_quantize_rows(codes[w], &sc[w], row[w], 1, Dh, &qp);
            const int64_t so = (b * Hkv + h) * (page ? page : 1) + tt;
            if (fp8) memcpy(eks + so, &sc[0], 4), memcpy(evs + so, &sc[1], 4);
            for (int i = 0; i < Dh; i++) {
                int64_t ok = ((b * Hkv + h) * (Dh / x) + i / x) * ((int64_t)page * x) + tt * x + i % x;
                int64_t ov = ((b * Hkv + h) * (page / x) + tt / x) * ((int64_t)Dh * x) + (int64_t)i * x + tt % x;
                if (page == 0) ok = ov = (slots[t] * Hkv + h) * Dh + i; /* plain rows */
                if (fp8) {
                    ek[ok] = codes[0][i];
                    ev[ov] = codes[1][i];
                } else {
                    const m3_bf16 bk = m3_f32_to_bf16(row[0][i]), bv = m3_f32_to_bf16(row[1][i]);
                    memcpy(ek + ok * 2, &bk, 2);
                    memcpy(ev + ov * 2, &bv, 2);
                }
            }
        }
    }
    /* run 0: the plain call. g_after: runs 1-6 as the model's step has it, the launch right
     * before the call writes the rows or the slots (the writer is a programmatic dependent of
     * it: m3_gpu.h). The device rows and slots hold other values first (rows of another scale,
     * every slot padding); then a 128 MB copy keeps the device busy while the host queues the
     * copies of the real rows and slots and the call, so that they meet on the device; part
     * (run - 1) % 3 (K rows, V rows, slots) is copied last. Runs 1-3: by the plain copy kernel
     * (its blocks end before the call may start). Runs 4-6: the 128 MB copy and the three
     * copies are the kernel's dependent form, each letting the next launch start at its
     * entry, so the call's blocks are resident while the 128 MB copy still runs (session 16:
     * with only the last copy dependent, loads before the wait were caught at 4500 tokens
     * only). Every byte must be the plain run's. */
    const size_t rb = (size_t)T * ld * sizeof(m3_bf16), sb = ((size_t)T * sizeof *slots + 15) & ~(size_t)15;
    void *src[3] = {NULL, NULL, NULL}, *stale[3] = {NULL, NULL, NULL}, *ba = NULL, *bb = NULL;
    void *const dst[3] = {dk, dv, dslots};
    const size_t pb[3] = {rb, rb, sb};
    const size_t big = (size_t)128 << 20;
    if (g_after) {
        float *o = malloc((size_t)T * ld * sizeof *o);
        int64_t *os = malloc(sb);
        for (size_t i = 0; i < sb / sizeof *os; i++) os[i] = -1;
        for (int i = 0; i < 3; i++) {
            GPU_OK(m3_gpu_alloc(g, &src[i], pb[i]));
            GPU_OK(m3_gpu_copy(g, src[i], dst[i], i < 2 ? pb[i] : (size_t)T * sizeof *slots));
            if (i < 2) {
                m3_fill_normal(&r, o, (int64_t)T * ld, 5.0f);
                stale[i] = gpu_upload_bf16(g, o, (int64_t)T * ld, NULL);
            } else {
                GPU_OK(m3_gpu_alloc(g, &stale[i], sb));
                GPU_OK(m3_gpu_upload(g, stale[i], os, sb));
            }
        }
        free(o);
        free(os);
        GPU_OK(m3_gpu_alloc(g, &ba, big));
        GPU_OK(m3_gpu_alloc(g, &bb, big));
    }
    for (int run = 0; run < (g_after ? 7 : 1); run++) {
        if (run > 0) {
            GPU_OK(m3_gpu_memset(g, c.k, KV_FILL, cache_bytes));
            GPU_OK(m3_gpu_memset(g, c.v, KV_FILL, cache_bytes));
            if (fp8) {
                GPU_OK(m3_gpu_memset(g, c.k_scale, KV_FILL, scale_n * sizeof(float)));
                GPU_OK(m3_gpu_memset(g, c.v_scale, KV_FILL, scale_n * sizeof(float)));
            }
            for (int i = 0; i < 3; i++) GPU_OK(m3_gpu_copy(g, dst[i], stale[i], pb[i]));
            GPU_OK(m3_gpu_copy_kernel(g, bb, ba, big, run > 3 ? 3 : 0));
            for (int j = 1; j <= 3; j++) {
                const int i = (run - 1 + j) % 3; /* (run - 1) % 3 last */
                GPU_OK(m3_gpu_copy_kernel(g, dst[i], src[i], pb[i], run > 3 ? 3 : 0));
            }
        }
        GPU_OK(m3_gpu_kv_cache_write(g, &c, dk, ld, dv, ld, dslots, T, Hkv, Dh));
        GPU_OK(m3_gpu_download(g, gk, c.k, cache_bytes));
        GPU_OK(m3_gpu_download(g, gv, c.v, cache_bytes));
        gpu_guard_check(g, c.k, cache_bytes, "k cache");
        gpu_guard_check(g, c.v, cache_bytes, "v cache");
        char what[128];
        snprintf(what, sizeof what, "kv_cache_write(%s,page=%d,max=%g,T=%d,Hkv=%d,Dh=%d,run=%d%s)%s",
                 fp8 ? "fp8" : "bf16", page, (double)fp8_max, T, Hkv, Dh, run0, sweep ? ",sweep" : "",
                 run == 0 ? "" : run == 1 ? " after K" : run == 2 ? " after V" : run == 3 ? " after slots"
                 : run == 4 ? " after K (dep)" : run == 5 ? " after V (dep)" : " after slots (dep)");
        size_t bad = 0;
        for (size_t i = 0; i < cache_bytes; i++) bad += (gk[i] != ek[i]) + (gv[i] != ev[i]);
        if (fp8) {
            GPU_OK(m3_gpu_download(g, gks, c.k_scale, scale_n * sizeof(float)));
            GPU_OK(m3_gpu_download(g, gvs, c.v_scale, scale_n * sizeof(float)));
            gpu_guard_check(g, c.k_scale, scale_n * sizeof(float), "k scales");
            gpu_guard_check(g, c.v_scale, scale_n * sizeof(float), "v scales");
            bad += memcmp(gks, eks, scale_n * sizeof(float)) != 0;
            bad += memcmp(gvs, evs, scale_n * sizeof(float)) != 0;
        }
        if (run == 0 || bad) printf("  %-72s %zu differing bytes / scale arrays\n", what, bad);
        if (bad) m3_test_failf("%s: %zu bytes (or scale arrays) differ from the spec layout", what, bad);
    }
    if (g_after) printf("  %-72s 6 runs after a write, 0 differing\n", "");
    free(k); free(v); free(slots); free(ek); free(ev); free(gk); free(gv);
    free(eks); free(evs); free(gks); free(gvs);
}
static void kv_case(m3_gpu *g, int T, int Hkv, int Dh, int page, bool fp8, float fp8_max, int run0) {
    kv_case_x(g, T, Hkv, Dh, page, fp8, fp8_max, run0, 0);
}

static void kv_cache_write_matches_layout(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    for (int page = 128; page >= 16; page /= 8) {
        kv_case(g, 37, 4, 128, page, false, 0.0f, -1);
        kv_case(g, 37, 4, 128, page, true, 240.0f, -1);
        kv_case(g, 37, 4, 128, page, true, 448.0f, -1);
        kv_case(g, 5, 3, 64, page, true, 240.0f, -1);
        kv_case(g, 5, 3, 64, page, false, 0.0f, -1);
        /* decode passes (since session 8 the warp kernels at any T): one token, and runs of
         * 64 from a 16-aligned, an 8-aligned and an unaligned slot */
        kv_case(g, 1, 4, 128, page, false, 0.0f, 77);
        kv_case(g, 1, 4, 128, page, true, 448.0f, 77);
        kv_case(g, 64, 4, 128, page, false, 0.0f, 256);
        kv_case(g, 64, 4, 128, page, true, 240.0f, 256);
        kv_case(g, 64, 4, 128, page, true, 448.0f, 200);
        kv_case(g, 64, 4, 128, page, true, 448.0f, 203);
        /* runs of slots: 200 is 8- but not 16-aligned, 203 neither */
        kv_case(g, 300, 4, 128, page, false, 0.0f, 200);
        kv_case(g, 300, 4, 128, page, false, 0.0f, 203);
        kv_case(g, 300, 4, 128, page, true, 448.0f, 200);
        kv_case(g, 300, 4, 128, page, true, 240.0f, 256);
        kv_case(g, 300, 4, 128, page, true, 448.0f, -1); /* scattered slots, a padding token */
        /* 2M fp8 quotients: the fast quotient path must give every division's bits */
        kv_case(g, 2048, 4, 128, page, true, page == 128 ? 448.0f : 240.0f, 8);
        /* kvw8_k's 16-token steps: passes whose 8-token grid would pass one wave (session 12:
         * the smaller passes above take 8-token steps), from a misaligned start */
        kv_case(g, 4500, 4, 128, page, true, 448.0f, 203);
    }
    /* every bf16 magnitude at each sweep scale, as K rows and as V rows, both maxima: all
     * (value, scale) pairs of those scales against ref's division (a large pass and T = 64) */
    const int nsw = (kv_sweep_rows() + 3) / 4;
    for (int page = 128; page >= 16; page /= 8) {
        kv_case_x(g, nsw, 4, 128, page, true, 448.0f, 0, 1);
        kv_case_x(g, nsw, 4, 128, page, true, 240.0f, 8, 1);
    }
    kv_case_x(g, 64, 4, 128, 128, true, 240.0f, 1000, 1);
    kv_case(g, 37, 4, 128, 0, false, 0.0f, -1); /* plain rows (the GPU layer's own cache) */
    kv_case(g, 5, 3, 64, 0, false, 0.0f, -1);
    kv_case(g, 300, 4, 128, 0, false, 0.0f, 203);
    /* plain-row fp8 has no scale layout: refused with a message */
    m3_gpu_kv_cache c;
    memset(&c, 0, sizeof c);
    c.page = 0, c.fp8 = true, c.fp8_max = 448.0f, c.k = c.v = (void *)16;
    c.k_scale = c.v_scale = (float *)16;
    assert_int_equal(m3_gpu_kv_cache_write(g, &c, (const m3_bf16 *)16, 512, (const m3_bf16 *)16,
                                           512, (const int64_t *)16, 1, 4, 128),
                     M3_ERR_ARG);
}

/* The launch right before the call writes the K / V rows or the slots (the model's K / V
 * projection): the writer, a programmatic dependent launch, must wait for it before its first
 * load. Decode passes (kvw8s_k, kvw_k), the 8- and 16-token kvw8_k passes, plain rows. */
static void kv_cache_write_after_write(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    g_after = true;
    for (int page = 128; page >= 16; page /= 8) {
        kv_case(g, 1, 4, 128, page, true, 448.0f, 77);
        kv_case(g, 1, 4, 128, page, false, 0.0f, 77);
        kv_case(g, 64, 4, 128, page, true, 240.0f, 256);
        kv_case(g, 64, 4, 128, page, false, 0.0f, 203);
        kv_case(g, 37, 4, 128, page, true, 448.0f, -1);
        kv_case(g, 300, 4, 128, page, true, 448.0f, 203);
        kv_case(g, 300, 4, 128, page, false, 0.0f, 200);
        kv_case(g, 4500, 4, 128, page, true, 448.0f, 203);
    }
    kv_case(g, 300, 4, 128, 0, false, 0.0f, 203);
    g_after = false;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kv_cache_write_matches_layout),
        cmocka_unit_test(kv_cache_write_after_write),
    };
    return M3_RUN_GPU_TESTS(tests);
}
