/* tests/gpu_num.c: host-vs-device bit equality of the number formats. The scalar conversions
 * of ref/num/{bf16,fp16,fp8,mx}.h (gpu/num_ops.h's m3_num_apply: the same source compiled by
 * the host C compiler and as device code in gpu/num.hip) must give identical bits for:
 *   - a strided sweep over all 2^32 input words (stride 997 for the element conversions,
 *     16411 for the MX scale rules and element encoders; the start is seed-dependent);
 *   - every input of the 8- and 16-bit decodes (exhaustive);
 *   - special values: signed zeros, infinities, NaN payloads, the extremes, and for every
 *     code of bf16 (sampled), fp16, the three fp8 kinds and e2m1 the exact midpoints to the
 *     next code and their fp32 neighbours (the ties of RNE vs RNA and the overflow edges,
 *     e.g. 464 for e4m3fn), powers of two over the whole fp32 range (MX scale rules);
 * for every fp8 kind x overflow policy x tie rule, e2m1 RNE and RNA, e8m0 decode and
 * clamping, fp16 and bf16 both ways, the MX scale byte under each rule / element / zero-block
 * choice, and MX element encode / decode. Then m3_gpu_mx_quantize_blocks against
 * m3_mx_quantize_block + m3_mx_dequantize_block for each element format x scale rule x
 * rounding (x zero-block, x overflow policy), blocks of 32 and of 9, with zero, subnormal,
 * huge and NaN/inf-poisoned blocks. No tolerance anywhere: these are integer algorithms, and
 * only the NaN payload of a product (MX decode with the NaN scale) is compared as "NaN". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/num_ops.h"
#include "tests/gpu_test.h"

/* ---- host evaluation and comparison ---------------------------------------------------- */
typedef struct {
    int op, param;
    const uint32_t *in; /* NULL: start + i*stride */
    uint32_t start, stride;
    uint32_t *out;
} host_ctx;

#define HOST_CHUNK 65536

static void host_chunk(void *vc, int64_t c) {
    const host_ctx *h = vc;
    for (int64_t i = c * HOST_CHUNK; i < (c + 1) * HOST_CHUNK; i++) {
        const uint32_t u = h->in ? h->in[i] : h->start + (uint32_t)i * h->stride;
        h->out[i] = m3_num_apply(h->op, h->param, u);
    }
}

static const char *op_name(int op) {
    static const char *n[] = {"f32->bf16", "bf16->f32", "f32->fp16", "fp16->f32",  "f32->fp8",
                              "fp8->f32",  "f32->e2m1", "e2m1->f32", "e8m0->f32",  "exp->e8m0",
                              "mx_scale",  "mx_encode", "mx_decode"};
    return op >= 0 && op < M3_NUM_N_OPS ? n[op] : "?";
}

/* Run op/param over n inputs (d_in/h_in or the stride) on both sides; returns mismatches. */
static int64_t run_op(m3_gpu *g, int op, int param, const uint32_t *h_in, const uint32_t *d_in,
                      uint32_t start, uint32_t stride, int64_t n, uint32_t *d_out, uint32_t *h_dev,
                      uint32_t *h_host, const char *set) {
    GPU_OK(m3_gpu_num_sweep(g, d_out, d_in, op, param, start, stride, n));
    GPU_OK(m3_gpu_download(g, h_dev, d_out, (size_t)n * sizeof *h_dev));
    host_ctx hc = {op, param, h_in, start, stride, h_host};
    /* whole chunks on the worker threads, the tail here */
    const int64_t full = n / HOST_CHUNK;
    m3_parallel_for(full, host_chunk, &hc);
    for (int64_t i = full * HOST_CHUNK; i < n; i++)
        h_host[i] = m3_num_apply(op, param, h_in ? h_in[i] : start + (uint32_t)i * stride);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (h_dev[i] != h_host[i]) {
            const uint32_t u = h_in ? h_in[i] : start + (uint32_t)i * stride;
            if (bad < 3)
                printf("    %s param 0x%x %s: input 0x%08x host 0x%08x device 0x%08x\n",
                       op_name(op), param, set, u, h_host[i], h_dev[i]);
            bad++;
        }
    printf("  %-12s param 0x%02x %-9s %9lld inputs, %lld differ\n", op_name(op), param, set,
           (long long)n, (long long)bad);
    return bad;
}

/* ---- special inputs -------------------------------------------------------------------- */
static int64_t push(uint32_t *v, int64_t n, uint32_t u) {
    v[n++] = u;
    v[n++] = u ^ 0x80000000u; /* and its negative */
    return n;
}

/* fp32 value x, its neighbours, each with both signs */
static int64_t push3(uint32_t *v, int64_t n, float x) {
    const uint32_t u = m3_f32_bits(x) & 0x7FFFFFFFu;
    n = push(v, n, u);
    if (u > 0) n = push(v, n, u - 1);
    if (u < 0x7F800000u) n = push(v, n, u + 1);
    return n;
}

/* Every positive code c of a decode with its successor: c's value, the midpoint (exact in
 * fp32: these grids have few bits) and the neighbours of both. */
static int64_t push_grid(uint32_t *v, int64_t n, int op, int param, uint32_t n_codes, uint32_t max_code) {
    for (uint32_t c = 0; c < n_codes && c <= max_code; c++) {
        const float a = m3_bits_f32(m3_num_apply(op, param, c));
        if (a != a || isinf(a)) continue;
        n = push3(v, n, a);
        if (c < max_code) {
            const float b = m3_bits_f32(m3_num_apply(op, param, c + 1));
            if (b == b && !isinf(b)) n = push3(v, n, (float)(((double)a + (double)b) / 2));
        } else { /* past the largest code: the overflow edge (max + half a step) and beyond */
            const float step = a - m3_bits_f32(m3_num_apply(op, param, c - 1));
            n = push3(v, n, a + step / 2);
            n = push3(v, n, a + step);
            n = push3(v, n, 2 * a);
        }
    }
    return n;
}

static int64_t make_specials(uint32_t *v, m3_rng *r) {
    int64_t n = 0;
    static const uint32_t fixed[] = {0x00000000u, 0x7F800000u, 0x7FC00000u, 0x7F800001u,
                                     0x7FBFFFFFu, 0x7FFFFFFFu, 0x7F7FFFFFu, 0x00800000u,
                                     0x00000001u, 0x007FFFFFu, 0x3F800000u, 0x3FC00000u};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) n = push(v, n, fixed[i]);
    /* fp8 kinds (max codes 0x7E / 0x7F / 0x7B), e2m1 (7), fp16 (0x7BFF) */
    n = push_grid(v, n, M3_NUM_FP8_TO_F32, M3_FP8_E4M3FN, 128, 0x7E);
    n = push_grid(v, n, M3_NUM_FP8_TO_F32, M3_FP8_E4M3FNUZ, 128, 0x7F);
    n = push_grid(v, n, M3_NUM_FP8_TO_F32, M3_FP8_E5M2, 128, 0x7B);
    n = push_grid(v, n, M3_NUM_FP4_TO_F32, 0, 8, 7);
    n = push_grid(v, n, M3_NUM_FP16_TO_F32, 0, 0x7C00, 0x7BFF);
    /* bf16: sampled codes, the exact tie to the next code (the low half 0x8000) +- 1 */
    for (int i = 0; i < 4096; i++) {
        const uint32_t hi = (m3_rng_u32(r) & 0x7FFFu) << 16;
        n = push(v, n, hi | 0x8000u), n = push(v, n, hi | 0x7FFFu), n = push(v, n, hi | 0x8001u);
    }
    /* powers of two over the whole range, and x1.5, x1.75 (the EVEN rule's threshold) */
    for (int k = -149; k <= 127; k++) {
        const float p2 = m3_pow2f(k);
        n = push3(v, n, p2);
        if (k < 127) n = push3(v, n, p2 * 1.5f), n = push3(v, n, p2 * 1.75f);
    }
    return n;
}
#define MAX_SPECIALS (1 << 20)

/* ---- the scalar sweep ------------------------------------------------------------------- */
typedef struct {
    int op, param;
    uint32_t stride; /* 0: an exhaustive decode of n_in inputs */
    uint32_t n_in;
} sweep_cfg;

static void scalar_conversions_match_host(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 41);
    const uint32_t start = m3_rng_u32(&r);
    printf("  strided sweeps start at 0x%08x (seed %llu)\n", start,
           (unsigned long long)m3_test_seed());
    sweep_cfg cfg[128];
    int nc = 0;
    cfg[nc++] = (sweep_cfg){M3_NUM_F32_TO_BF16, 0, 997, 0};
    cfg[nc++] = (sweep_cfg){M3_NUM_F32_TO_FP16, 0, 997, 0};
    for (int kind = 0; kind < 3; kind++)
        for (int ovf = 0; ovf < 2; ovf++)
            for (int rd = 0; rd < 2; rd++)
                cfg[nc++] = (sweep_cfg){M3_NUM_F32_TO_FP8, kind | ovf << 2 | rd << 3, 997, 0};
    for (int rd = 0; rd < 2; rd++) cfg[nc++] = (sweep_cfg){M3_NUM_F32_TO_FP4, rd, 997, 0};
    for (int e = 0; e < 4; e++)
        for (int rule = 0; rule < 3; rule++)
            for (int z = 0; z < 2; z++)
                cfg[nc++] = (sweep_cfg){M3_NUM_MX_SCALE_BYTE, e | rule << 2 | z << 4, 16411, 0};
    for (int e = 0; e < 4; e++)
        for (int rd = 0; rd < 2; rd++)
            for (int ovf = 0; ovf < 2; ovf++)
                cfg[nc++] = (sweep_cfg){M3_NUM_MX_ENCODE, e | rd << 2 | ovf << 3, 16411, 0};
    cfg[nc++] = (sweep_cfg){M3_NUM_BF16_TO_F32, 0, 0, 1u << 16};
    cfg[nc++] = (sweep_cfg){M3_NUM_FP16_TO_F32, 0, 0, 1u << 16};
    for (int kind = 0; kind < 3; kind++) cfg[nc++] = (sweep_cfg){M3_NUM_FP8_TO_F32, kind, 0, 256};
    cfg[nc++] = (sweep_cfg){M3_NUM_FP4_TO_F32, 0, 0, 16};
    cfg[nc++] = (sweep_cfg){M3_NUM_E8M0_TO_F32, 0, 0, 256};
    cfg[nc++] = (sweep_cfg){M3_NUM_E8M0_FROM_EXP, 0, 0, 1024};
    for (int e = 0; e < 4; e++) /* every (code, scale byte) pair: 0xBB0000CC */
        cfg[nc++] = (sweep_cfg){M3_NUM_MX_DECODE, e, 0, 0};

    const int64_t n_max = ((int64_t)1 << 32) / 997 + 1;
    uint32_t *h_dev = malloc((size_t)n_max * 4), *h_host = malloc((size_t)n_max * 4);
    uint32_t *spec = malloc((size_t)MAX_SPECIALS * 4), *pairs = malloc((size_t)65536 * 4);
    assert_non_null(h_dev), assert_non_null(h_host), assert_non_null(spec), assert_non_null(pairs);
    const int64_t n_spec = make_specials(spec, &r);
    assert_true(n_spec <= MAX_SPECIALS);
    for (uint32_t i = 0; i < 65536; i++) pairs[i] = (i & 0xFFu) | ((i >> 8) << 24);
    void *d_out, *d_spec, *d_pairs;
    GPU_OK(m3_gpu_alloc(g, &d_out, (size_t)n_max * 4));
    GPU_OK(m3_gpu_alloc(g, &d_spec, (size_t)n_spec * 4));
    GPU_OK(m3_gpu_upload(g, d_spec, spec, (size_t)n_spec * 4));
    GPU_OK(m3_gpu_alloc(g, &d_pairs, (size_t)65536 * 4));
    GPU_OK(m3_gpu_upload(g, d_pairs, pairs, (size_t)65536 * 4));
    int64_t bad = 0, total = 0;
    for (int c = 0; c < nc; c++) {
        const sweep_cfg *s = &cfg[c];
        if (s->op == M3_NUM_MX_DECODE) {
            bad += run_op(g, s->op, s->param, pairs, d_pairs, 0, 0, 65536, d_out, h_dev, h_host,
                          "all");
            total += 65536;
        } else if (s->stride == 0) {
            bad += run_op(g, s->op, s->param, NULL, NULL, 0, 1, s->n_in, d_out, h_dev, h_host,
                          "all");
            total += s->n_in;
        } else {
            const int64_t n = (((int64_t)1 << 32) - 1 - 0) / s->stride + 1;
            bad += run_op(g, s->op, s->param, NULL, NULL, start, s->stride, n, d_out, h_dev,
                          h_host, "strided");
            bad += run_op(g, s->op, s->param, spec, d_spec, 0, 0, n_spec, d_out, h_dev, h_host,
                          "specials");
            total += n + n_spec;
        }
    }
    printf("  scalar conversions: %d configurations, %lld evaluations, %lld differ\n", nc,
           (long long)total, (long long)bad);
    free(h_dev), free(h_host), free(spec), free(pairs);
    if (bad) m3_test_failf("%lld host/device mismatches (see above)", (long long)bad);
}

/* ---- MX blocks -------------------------------------------------------------------------- */
static void fill_blocks(m3_rng *r, float *x, int nblk, int bs) {
    for (int b = 0; b < nblk; b++) {
        /* per-block magnitude 2^e, e in [-150, 110]: subnormal-scale blocks, huge blocks */
        int e = (int)(m3_rng_u32(r) % 261u) - 150;
        for (int j = 0; j < bs; j++) {
            const float v = m3_rng_uniform(r, -1.0f, 1.0f);
            x[(size_t)b * bs + j] = v * m3_pow2f(e < -149 ? -149 : e > 100 ? 100 : e);
        }
        if (b % 97 == 5) x[(size_t)b * bs + (bs > 5 ? 5 : 0)] = NAN;
        if (b % 89 == 7) x[(size_t)b * bs + bs - 1] = -INFINITY;
        if (b % 83 == 3)
            for (int j = 0; j < bs; j++) x[(size_t)b * bs + j] = 0.0f;
        if (b % 79 == 11) x[(size_t)b * bs] = 464.0f; /* e4m3fn's overflow tie */
    }
}

static void mx_blocks_match_host(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 42);
    const int nblk = 8192;
    int64_t bad = 0, configs = 0;
    for (int bs = 32; bs >= 9; bs -= 23) {
        const int64_t n = (int64_t)nblk * bs;
        float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4), *gy = malloc((size_t)n * 4);
        uint8_t *c = malloc((size_t)n), *gc = malloc((size_t)n), *s = malloc(nblk), *gs = malloc(nblk);
        fill_blocks(&r, x, nblk, bs);
        float *dx = gpu_upload_f32(g, x, n);
        void *dc, *ds, *dy;
        GPU_OK(m3_gpu_alloc(g, &dc, (size_t)n));
        GPU_OK(m3_gpu_alloc(g, &ds, (size_t)nblk));
        GPU_OK(m3_gpu_alloc(g, &dy, (size_t)n * 4));
        for (int e = 0; e < 4; e++)
            for (int rule = 0; rule < 3; rule++)
                for (int rd = 0; rd < 2; rd++)
                    for (int z = 0; z < 2; z++) {
                        m3_mx_params p = m3_mx_params_default((m3_mx_elem)e);
                        p.scale = (m3_mx_scale_rule)rule, p.round = (m3_mx_round)rd;
                        p.zero = (m3_mx_zero_block)z, p.block = bs;
                        p.ovf = (m3_fp8_overflow)(rd ^ z);
                        GPU_OK(m3_gpu_mx_quantize_blocks(g, dc, ds, dy, dx, nblk, &p));
                        GPU_OK(m3_gpu_download(g, gc, dc, (size_t)n));
                        GPU_OK(m3_gpu_download(g, gs, ds, (size_t)nblk));
                        GPU_OK(m3_gpu_download(g, gy, dy, (size_t)n * 4));
                        int64_t b_bad = 0;
                        for (int b = 0; b < nblk; b++) {
                            const size_t o = (size_t)b * bs;
                            s[b] = m3_mx_quantize_block(c + o, x + o, bs, &p);
                            m3_mx_dequantize_block(y + o, c + o, s[b], bs, &p);
                            bool ok = s[b] == gs[b] && !memcmp(c + o, gc + o, (size_t)bs);
                            for (int j = 0; j < bs; j++) {
                                const float a = y[o + j], d = gy[o + j];
                                ok = ok && ((a != a && d != d) || m3_f32_bits(a) == m3_f32_bits(d));
                            }
                            if (!ok && b_bad++ < 3)
                                printf("    mx elem %d rule %d round %d zero %d block %d (size %d): "
                                       "scale host 0x%02x device 0x%02x\n",
                                       e, rule, rd, z, b, bs, s[b], gs[b]);
                        }
                        bad += b_bad, configs++;
                    }
        printf("  mx blocks of %d: %d blocks x 48 configurations, %lld differ so far\n", bs, nblk,
               (long long)bad);
        free(x), free(y), free(gy), free(c), free(gc), free(s), free(gs);
    }
    printf("  mx block quantization: %lld configurations, %lld blocks differ\n", (long long)configs,
           (long long)bad);
    if (bad) m3_test_failf("%lld MX blocks differ between host and device", (long long)bad);
}

/* m3_gpu_fp8_count_nan against ref/num/fp8.h m3_fp8_is_nan counted on the host: every kind,
 * all 256 codes, random bytes with NaN codes planted densely and sparsely, start offsets 0..15
 * (the head / tail bytes the wide kernel leaves to the edge kernel) and lengths around 16. */
static void fp8_nan_count_matches_host(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 43);
    const int64_t cap = (1 << 20) + 64;
    uint8_t *h = malloc((size_t)cap);
    void *d;
    GPU_OK(m3_gpu_alloc(g, &d, (size_t)cap));
    const m3_fp8_kind kinds[3] = {M3_FP8_E4M3FN, M3_FP8_E4M3FNUZ, M3_FP8_E5M2};
    const int64_t lens[] = {0, 1, 15, 16, 17, 31, 33, 256, 4099, (1 << 20) + 7};
    int cases = 0;
    for (int fill = 0; fill < 3; fill++) {
        /* 0: all 256 codes in turn; 1: random bytes; 2: random non-NaN bytes, few NaN planted */
        for (int64_t i = 0; i < cap; i++) h[i] = fill == 0 ? (uint8_t)i : (uint8_t)m3_rng_u32(&r);
        if (fill == 2)
            for (int64_t i = 0; i < cap; i++) {
                h[i] &= 0x3F; /* no NaN code of any kind */
                if (m3_rng_u32(&r) % 50000 == 0) h[i] = 0x7F;  /* e4m3fn NaN */
                if (m3_rng_u32(&r) % 70000 == 0) h[i] = 0x80;  /* fnuz NaN (e4m3fn: -0) */
                if (m3_rng_u32(&r) % 90000 == 0) h[i] = 0xFE;  /* e5m2 and e4m3fn NaN */
            }
        GPU_OK(m3_gpu_upload(g, d, h, (size_t)cap));
        for (int k = 0; k < 3; k++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (int off = 0; off < 16; off += (lens[li] > 4096 ? 5 : 1)) {
                    const int64_t n = lens[li];
                    int64_t want = 0, got = -1;
                    for (int64_t i = 0; i < n; i++) want += m3_fp8_is_nan(h[off + i], kinds[k]);
                    GPU_OK(m3_gpu_fp8_count_nan(g, (const uint8_t *)d + off, n, kinds[k], &got));
                    if (got != want)
                        m3_test_failf("fp8 NaN count: fill %d kind %d offset %d length %lld: "
                                      "device %lld, host %lld", fill, k, off, (long long)n,
                                      (long long)got, (long long)want);
                    if (n == lens[9] && off == 0)
                        printf("  fill %d kind %d: %lld of %lld codes NaN on both sides\n", fill,
                               k, (long long)want, (long long)n);
                    cases++;
                }
    }
    printf("  fp8 NaN count: %d cases, all equal to the host's\n", cases);
    free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scalar_conversions_match_host),
        cmocka_unit_test(mx_blocks_match_host),
        cmocka_unit_test(fp8_nan_count_matches_host),
    };
    return M3_RUN_GPU_TESTS(tests);
}
