/* tests/ref_quant.c: array-level quantization (ref/quant.h) and the MX block rules of
 * ref/num/mx.h (spec m3-numerics.md §5.4-5.7). Expected scale bytes and codes below were
 * computed by hand from the spec's formulas; the arithmetic is in the comments. All checks
 * are exact: quantized outputs are discrete and dequantization is exact in fp32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/quant.h"
#include "tests/util.h"

static const char *rule_name(m3_mx_scale_rule r) {
    return r == M3_MX_SCALE_FLOOR ? "floor" : r == M3_MX_SCALE_EVEN ? "even" : "rceil";
}

/* Quantize one row of n values (zero padded to the block) through the array API; return the
 * first block's scale byte and its unpacked codes. */
static m3_e8m0 quant_row(uint8_t *codes, const float *x, int n, const m3_mx_params *p) {
    uint8_t packed[64];
    m3_e8m0 sc[4];
    assert_true(n <= 64 && m3_mx_n_blocks(n, p) <= 4);
    m3_mx_quantize(packed, sc, x, 1, n, p);
    for (int j = 0; j < n; j++)
        codes[j] = m3_mx_elem_is_fp4(p->elem) ? m3_fp4_get(packed, j, p->high_even_nibble) : packed[j];
    return sc[0];
}

typedef struct {
    const char *what;
    m3_mx_elem elem;
    m3_mx_scale_rule rule;
    m3_mx_round round;
    float x[8];      /* the block: these, then zeros up to 32 */
    int want_byte;
    uint8_t want[8]; /* codes of x[0..8) */
} mx_case;

/* e2m1 emax 2, max 6; e4m3fn emax 8, max 448; e4m3fnuz emax 7, max 240; e5m2 emax 15. */
static const mx_case CASES[] = {
    /* amax 3.5 = 1.75*2^1, the `even` boundary exactly. floor: k = 1-2 = -1 (126), x/X = 2x =
     * {7,-2.5,.5,1.5,5,-.4,2,0}: 7 saturates to 6; -2.5 ties 2|3 -> 2 (even code 4); 5 ties
     * 4|6 -> 4 (code 6); -.4 -> -.5 */
    {"fp4 amax=3.5 floor rne", M3_MX_E2M1, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE,
     {3.5f, -1.25f, 0.25f, 0.75f, 2.5f, -0.2f, 1.0f, 0.0f}, 126, {0x7, 0xC, 0x1, 0x3, 0x6, 0x9, 0x4, 0x0}},
    {"fp4 amax=3.5 floor rna", M3_MX_E2M1, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNA,
     {3.5f, -1.25f, 0.25f, 0.75f, 2.5f, -0.2f, 1.0f, 0.0f}, 126, {0x7, 0xD, 0x1, 0x3, 0x7, 0x9, 0x4, 0x0}},
    /* even: 3.5/2^1 = 1.75 >= 1.75 -> e = 2, k = 0 (127), X = 1: 3.5 -> 4; -1.25 ties 1|1.5
     * -> 1 (code 2); .25 ties 0|.5 -> 0; .75 -> 1; 2.5 -> 2; -.2 -> -0 (0x8) */
    {"fp4 amax=3.5 even rne", M3_MX_E2M1, M3_MX_SCALE_EVEN, M3_MX_ROUND_RNE,
     {3.5f, -1.25f, 0.25f, 0.75f, 2.5f, -0.2f, 1.0f, 0.0f}, 127, {0x6, 0xA, 0x0, 0x2, 0x4, 0x8, 0x2, 0x0}},
    {"fp4 amax=3.5 even rna", M3_MX_E2M1, M3_MX_SCALE_EVEN, M3_MX_ROUND_RNA,
     {3.5f, -1.25f, 0.25f, 0.75f, 2.5f, -0.2f, 1.0f, 0.0f}, 127, {0x6, 0xB, 0x1, 0x2, 0x5, 0x8, 0x2, 0x0}},
    /* rceil: ceil(log2(3.5/6)) = 0 (127) */
    {"fp4 amax=3.5 rceil rne", M3_MX_E2M1, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE,
     {3.5f, -1.25f, 0.25f, 0.75f, 2.5f, -0.2f, 1.0f, 0.0f}, 127, {0x6, 0xA, 0x0, 0x2, 0x4, 0x8, 0x2, 0x0}},
    /* just below the boundary: amax = 3.5 - 2^-22 (0x405FFFFF). even: +2^21 does not carry,
     * e = 1, k = -1 (126); x/X = 6.9999995 saturates to 6. rceil still 127: 3.4999998 -> 3 */
    {"fp4 amax=3.5- even", M3_MX_E2M1, M3_MX_SCALE_EVEN, M3_MX_ROUND_RNE,
     {0x1.bffffep+1f, -1.0f}, 126, {0x7, 0xC}},
    {"fp4 amax=3.5- floor", M3_MX_E2M1, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE,
     {0x1.bffffep+1f, -1.0f}, 126, {0x7, 0xC}},
    {"fp4 amax=3.5- rceil", M3_MX_E2M1, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE,
     {0x1.bffffep+1f, -1.0f}, 127, {0x5, 0xA}},
    /* powers of two: amax = 4 -> k = 0 under every rule; 8 -> k = 1; 0.5 -> k = -3
     * (floor/even: -1-2; rceil: ceil(log2(1/12)) = ceil(-3.58) = -3) */
    {"fp4 amax=4 floor", M3_MX_E2M1, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {4, -4, 1}, 127, {0x6, 0xE, 0x2}},
    {"fp4 amax=4 even", M3_MX_E2M1, M3_MX_SCALE_EVEN, M3_MX_ROUND_RNE, {4, -4, 1}, 127, {0x6, 0xE, 0x2}},
    {"fp4 amax=4 rceil", M3_MX_E2M1, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE, {4, -4, 1}, 127, {0x6, 0xE, 0x2}},
    {"fp4 amax=8 floor", M3_MX_E2M1, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {-8, 1}, 128, {0xE, 0x1}},
    {"fp4 amax=8 even", M3_MX_E2M1, M3_MX_SCALE_EVEN, M3_MX_ROUND_RNE, {-8, 1}, 128, {0xE, 0x1}},
    {"fp4 amax=8 rceil", M3_MX_E2M1, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE, {-8, 1}, 128, {0xE, 0x1}},
    {"fp4 amax=.5 floor", M3_MX_E2M1, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {0.5f, 0.125f}, 124, {0x6, 0x2}},
    {"fp4 amax=.5 rceil", M3_MX_E2M1, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE, {0.5f, 0.125f}, 124, {0x6, 0x2}},
    /* a block whose max saturates under floor: amax = 7, floor k = 0: 7 -> 6, 5.5 -> 6 (nearer),
     * -6.9 -> -6. even: 7/4 = 1.75 -> k = 1 (128): 3.5 -> 4, 2.75 -> 3, -3.45 -> -3.
     * rceil: ceil(log2(7/6)) = 1 (128), same codes */
    {"fp4 amax=7 floor", M3_MX_E2M1, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {7, 5.5f, -6.9f}, 127, {0x7, 0x7, 0xF}},
    {"fp4 amax=7 even", M3_MX_E2M1, M3_MX_SCALE_EVEN, M3_MX_ROUND_RNE, {7, 5.5f, -6.9f}, 128, {0x6, 0x5, 0xD}},
    {"fp4 amax=7 rceil", M3_MX_E2M1, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE, {7, 5.5f, -6.9f}, 128, {0x6, 0x5, 0xD}},
    /* rceil boundary: amax = 6 -> 127; next float above 6 -> 128 (then 6.0000005/2 -> 3) */
    {"fp4 amax=6 rceil", M3_MX_E2M1, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE, {6}, 127, {0x7}},
    {"fp4 amax=6+ rceil", M3_MX_E2M1, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE, {0x1.800002p+2f}, 128, {0x5}},
    /* clamp: subnormal amax -> k <= -128 -> byte 0 under every rule; x/2^-127 = 2^127 * x */
    {"fp4 amax=2^-130 floor", M3_MX_E2M1, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {0x1p-130f}, 0, {0x0}},
    {"fp4 amax=2^-125 floor", M3_MX_E2M1, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {0x1p-125f}, 0, {0x6}},
    {"fp4 amax=2^-124 floor", M3_MX_E2M1, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {0x1p-124f}, 1, {0x6}},
    {"fp4 amax=3e38 floor", M3_MX_E2M1, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {3e38f}, 252, {0x7}},
    /* MXFP8 e4m3fn, amax 480 = 1.875*2^8. floor k = 0: 480 saturates to 448 (0x7E); -1 = 0xB8;
     * 0.01 = 5.12 quanta of 2^-9 -> 0x05. even (M = 3): 1.875 < 1.9375 -> also 127.
     * rceil: ceil(log2(480/448)) = 1 (128): 240 = 0x77, -0.5 = 0xB0, 0.005 = 2.56 quanta -> 0x03 */
    {"e4m3fn amax=480 floor", M3_MX_E4M3FN, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {480, -1, 0.01f}, 127, {0x7E, 0xB8, 0x05}},
    {"e4m3fn amax=480 even", M3_MX_E4M3FN, M3_MX_SCALE_EVEN, M3_MX_ROUND_RNE, {480, -1, 0.01f}, 127, {0x7E, 0xB8, 0x05}},
    {"e4m3fn amax=480 rceil", M3_MX_E4M3FN, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE, {480, -1, 0.01f}, 128, {0x77, 0xB0, 0x03}},
    /* amax 496 = 1.9375*2^8, the e4m3 `even` boundary: k = 1 (128); 248 ties 240|256 -> 256
     * (0x78). Just below (0x43F7FFFF): even k = 0, saturates to 448; rceil 128: 247.99998 -> 240 */
    {"e4m3fn amax=496 even", M3_MX_E4M3FN, M3_MX_SCALE_EVEN, M3_MX_ROUND_RNE, {496}, 128, {0x78}},
    {"e4m3fn amax=496 floor", M3_MX_E4M3FN, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {496}, 127, {0x7E}},
    {"e4m3fn amax=496- even", M3_MX_E4M3FN, M3_MX_SCALE_EVEN, M3_MX_ROUND_RNE, {0x1.effffep+8f}, 127, {0x7E}},
    {"e4m3fn amax=496- rceil", M3_MX_E4M3FN, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE, {0x1.effffep+8f}, 128, {0x77}},
    /* RNA on fp8 elements: 1.0625 = 1 + half a quantum (2^-3) ties away -> 1.125 (0x39) */
    {"e4m3fn rna tie", M3_MX_E4M3FN, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNA, {256, 1.0625f}, 127, {0x78, 0x39}},
    {"e4m3fn rne tie", M3_MX_E4M3FN, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {256, 1.0625f}, 127, {0x78, 0x38}},
    /* e4m3fnuz: amax 240 -> 127 under every rule (even: 1.875 < 1.9375; rceil: 240/240 = 1) */
    {"e4m3fnuz amax=240 floor", M3_MX_E4M3FNUZ, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {240, -0.0f, -1e-9f}, 127, {0x7F, 0x00, 0x00}},
    {"e4m3fnuz amax=240 even", M3_MX_E4M3FNUZ, M3_MX_SCALE_EVEN, M3_MX_ROUND_RNE, {240, -1}, 127, {0x7F, 0xC0}},
    {"e4m3fnuz amax=240 rceil", M3_MX_E4M3FNUZ, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE, {240, -1}, 127, {0x7F, 0xC0}},
    /* e5m2: amax 1 -> k = -15 (112) under every rule: 2^15 = 0x78 */
    {"e5m2 amax=1 floor", M3_MX_E5M2, M3_MX_SCALE_FLOOR, M3_MX_ROUND_RNE, {1, -0.5f}, 112, {0x78, 0xF4}},
    {"e5m2 amax=1 even", M3_MX_E5M2, M3_MX_SCALE_EVEN, M3_MX_ROUND_RNE, {1, -0.5f}, 112, {0x78, 0xF4}},
    {"e5m2 amax=1 rceil", M3_MX_E5M2, M3_MX_SCALE_RCEIL, M3_MX_ROUND_RNE, {1, -0.5f}, 112, {0x78, 0xF4}},
};

static void mx_known_answers(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const mx_case *c = &CASES[i];
        m3_mx_params p = m3_mx_params_default(c->elem);
        p.scale = c->rule;
        p.round = c->round;
        float x[32] = {0};
        memcpy(x, c->x, sizeof c->x);
        uint8_t codes[32];
        m3_e8m0 b = quant_row(codes, x, 32, &p);
        if (b != c->want_byte) m3_test_failf("%s (%s): scale byte %d, want %d", c->what, rule_name(c->rule), b, c->want_byte);
        for (int j = 0; j < 32; j++) {
            uint8_t want = j < 8 ? c->want[j] : 0;
            if (codes[j] != want) m3_test_failf("%s: code[%d] = 0x%02x, want 0x%02x", c->what, j, codes[j], want);
        }
        /* the scalar block API agrees with the array API */
        uint8_t codes2[32];
        assert_int_equal(m3_mx_quantize_block(codes2, x, 32, &p), b);
        assert_memory_equal(codes, codes2, 32);
    }
}

static void mx_zero_nan_inf_blocks(void **state) {
    (void)state;
    static const m3_mx_elem elems[] = {M3_MX_E2M1, M3_MX_E4M3FN, M3_MX_E4M3FNUZ, M3_MX_E5M2};
    for (int e = 0; e < 4; e++)
        for (int rule = 0; rule < 3; rule++) {
            m3_mx_params p = m3_mx_params_default(elems[e]);
            p.scale = (m3_mx_scale_rule)rule;
            /* row of 96: block 0 all +0, block 1 NaN at 17, block 2 -inf at 31 plus finite */
            float x[96], y[96];
            uint8_t q[96];
            m3_e8m0 s[3];
            for (int j = 0; j < 96; j++) x[j] = j < 32 ? 0.0f : (float)(j % 7) - 3.0f;
            x[32 + 17] = NAN;
            x[64 + 31] = -INFINITY;
            for (int zero = 0; zero < 2; zero++) {
                p.zero = zero ? M3_MX_ZERO_MIN_NORMAL : M3_MX_ZERO_BYTE0;
                m3_mx_quantize(q, s, x, 1, 96, &p);
                assert_int_equal(s[0], zero ? 1 : 0);
                assert_int_equal(s[1], 0xFF);
                assert_int_equal(s[2], 0xFF);
                for (int j = 0; j < (int)m3_mx_row_bytes(96, &p); j++) assert_int_equal(q[j], 0);
                m3_mx_dequantize(y, q, s, 1, 96, &p);
                for (int j = 0; j < 32; j++) assert_true(y[j] == 0.0f && !signbit(y[j]));
                for (int j = 32; j < 96; j++) assert_true(isnan(y[j]));
            }
            /* -0 keeps its sign where the element has -0 */
            float z[32] = {0};
            z[3] = -0.0f;
            uint8_t c[32];
            p.zero = M3_MX_ZERO_BYTE0;
            assert_int_equal(m3_mx_quantize_block(c, z, 32, &p), 0);
            uint8_t negz = elems[e] == M3_MX_E2M1 ? 0x8 : elems[e] == M3_MX_E4M3FNUZ ? 0x00 : 0x80;
            assert_int_equal(c[3], negz);
            assert_int_equal(c[2], 0);
        }
}

/* cols not a multiple of the block: cols 40 with block 32 (blocks 32 + 8) and block 9
 * (microxcaling's odd size: 9 + 9 + 9 + 9 + 4); odd cols pack a 0 nibble at the end. */
static void mx_partial_blocks_and_packing(void **state) {
    (void)state;
    m3_mx_params p = m3_mx_params_default(M3_MX_E2M1); /* even */
    float x[2 * 41];
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 41; j++) x[r * 41 + j] = j < 32 ? 0.5f * (float)(j % 3) : 12.0f * (r ? -1.0f : 1.0f);
    /* cols 41: block 0 amax 1 -> e 0, k -2 (125), codes .5/.25=2 -> code 4 (2.0), 1/.25 = 4 ->
     * code 6; block 1 (9 elements) amax 12 = 1.5*2^3 -> k 1 (128), 12/2 = 6 -> code 7 */
    uint8_t q[2 * 21];
    m3_e8m0 s[2 * 2];
    assert_int_equal(m3_mx_n_blocks(41, &p), 2);
    assert_int_equal(m3_mx_row_bytes(41, &p), 21);
    m3_mx_quantize(q, s, x, 2, 41, &p);
    assert_int_equal(s[0], 125);
    assert_int_equal(s[1], 128);
    assert_int_equal(s[2], 125);
    assert_int_equal(s[3], 128);
    assert_int_equal(q[0], 0x40); /* elements 0 (code 0) low, 1 (code 4) high */
    assert_int_equal(q[1], 0x06); /* element 2 (1.0 -> code 6), element 3 (0) */
    assert_int_equal(q[20], 0x07);      /* element 40 alone in the low nibble, high nibble 0 */
    assert_int_equal(q[21 + 20], 0x0F); /* row 1: -12 */
    assert_int_equal(q[16], 0x77);      /* row 0: elements 32, 33 = 12 -> code 7 */
    assert_int_equal(q[21 + 16], 0xFF); /* row 1: -12 -> code 0xF */
    float y[2 * 41];
    m3_mx_dequantize(y, q, s, 2, 41, &p);
    for (int i = 0; i < 2 * 41; i++) assert_true(y[i] == x[i]);
    /* high_even: same codes, nibbles swapped */
    uint8_t q2[2 * 21];
    p.high_even_nibble = true;
    m3_mx_quantize(q2, s, x, 2, 41, &p);
    for (int i = 0; i < 2 * 21; i++) {
        uint8_t want = (uint8_t)((q[i] << 4) | (q[i] >> 4));
        assert_int_equal(q2[i], want);
    }
    m3_mx_dequantize(y, q2, s, 2, 41, &p);
    for (int i = 0; i < 2 * 41; i++) assert_true(y[i] == x[i]);
    /* block 9, MXFP8 */
    m3_mx_params p8 = m3_mx_params_default(M3_MX_E4M3FN);
    p8.block = 9;
    p8.scale = M3_MX_SCALE_FLOOR;
    float v[40];
    for (int j = 0; j < 40; j++) v[j] = (float)(1 << (j / 9)) * (1.0f + 0.125f * (float)(j % 9 % 7)) /* <= 1.75: 448 fits */;
    uint8_t q8[40];
    m3_e8m0 s8[5];
    assert_int_equal(m3_mx_n_blocks(40, &p8), 5);
    m3_mx_quantize(q8, s8, v, 1, 40, &p8);
    /* block b has amax in [2^b, 2^(b+1)): floor k = b - 8 */
    for (int b = 0; b < 5; b++) assert_int_equal(s8[b], 127 + b - 8);
    float w[40];
    m3_mx_dequantize(w, q8, s8, 1, 40, &p8);
    for (int j = 0; j < 40; j++) assert_true(w[j] == v[j]); /* 3-bit mantissas: exact */
}

/* quantize -> dequantize -> quantize: the dequantized values are a fixed point for every
 * rule; codes and scale bytes are identical for floor and even. (rceil may pick a scale half
 * as large when the block max rounds down to exactly max/2, e.g. e2m1 3.2X -> 3X; the
 * values are unchanged, only their spelling.) */
static void mx_requantize_is_idempotent(void **state) {
    (void)state;
    static const m3_mx_elem elems[] = {M3_MX_E2M1, M3_MX_E4M3FN, M3_MX_E4M3FNUZ, M3_MX_E5M2};
    enum { R = 33, C = 70 };
    float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * R * C),
          *y2 = malloc(sizeof(float) * R * C);
    uint8_t *q = malloc(R * C), *q2 = malloc(R * C);
    m3_e8m0 *s = malloc(R * 8), *s2 = malloc(R * 8);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 11);
    long n_same_codes = 0;
    for (int it = 0; it < 4; it++) {
        for (int i = 0; i < R; i++) {
            /* per-row magnitudes from 2^-140 to 2^100 */
            float sc = m3_pow2f((int)(m3_rng_u32(&r) % 241u) - 140);
            for (int j = 0; j < C; j++) x[i * C + j] = m3_rng_normal(&r) * sc;
        }
        for (int e = 0; e < 4; e++)
            for (int rule = 0; rule < 3; rule++)
                for (int rnd = 0; rnd < 2; rnd++)
                    for (int blk = 0; blk < 2; blk++) {
                        m3_mx_params p = m3_mx_params_default(elems[e]);
                        p.scale = (m3_mx_scale_rule)rule;
                        p.round = rnd ? M3_MX_ROUND_RNA : M3_MX_ROUND_RNE;
                        p.block = blk ? 9 : 32;
                        int64_t nb = (int64_t)R * m3_mx_n_blocks(C, &p), nq = R * m3_mx_row_bytes(C, &p);
                        m3_mx_quantize(q, s, x, R, C, &p);
                        m3_mx_dequantize(y, q, s, R, C, &p);
                        m3_mx_quantize(q2, s2, y, R, C, &p);
                        m3_mx_dequantize(y2, q2, s2, R, C, &p);
                        if (memcmp(y, y2, sizeof(float) * R * C))
                            m3_test_failf("requantize changed values: elem=%d rule=%s round=%d block=%d",
                                          e, rule_name(p.scale), rnd, p.block);
                        if (p.scale != M3_MX_SCALE_RCEIL) {
                            if (memcmp(q, q2, (size_t)nq) || memcmp(s, s2, (size_t)nb))
                                m3_test_failf("requantize changed codes: elem=%d rule=%s round=%d block=%d",
                                              e, rule_name(p.scale), rnd, p.block);
                            n_same_codes++;
                        }
                    }
    }
    assert_true(n_same_codes == 4 * 4 * 2 * 2 * 2);
    free(x); free(y); free(y2); free(q); free(q2); free(s); free(s2);
}

/* rceil computed exactly (significand compare) equals the fp32 bit form amax * f32(1/max),
 * exponent + (mantissa != 0), for normal amax: the reciprocal's rounding never crosses a power
 * of two there (see docs/formats.md). Random amax over the whole normal range plus the
 * neighbours of every max_elem * 2^k. */
static void mx_rceil_matches_reciprocal_bit_form(void **state) {
    (void)state;
    static const m3_mx_elem elems[] = {M3_MX_E2M1, M3_MX_E4M3FN, M3_MX_E4M3FNUZ, M3_MX_E5M2};
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 12);
    long n = 0;
    for (int e = 0; e < 4; e++) {
        m3_mx_params p = m3_mx_params_default(elems[e]);
        p.scale = M3_MX_SCALE_RCEIL;
        float inv = 1.0f / m3_mx_elem_max(p.elem);
        for (int i = 0; i < 300000 + 3 * 250; i++) {
            float amax;
            if (i < 300000) {
                amax = m3_bits_f32((m3_rng_u32(&r) % 0x7F000000u) + 0x00800000u);
            } else {
                int k = (i - 300000) / 3 - 125;
                amax = m3_mx_elem_max(p.elem) * m3_pow2f(k);
                if (isinf(amax) || amax < 0x1p-126f) continue;
                uint32_t b = m3_f32_bits(amax) + (uint32_t)((i - 300000) % 3) - 1u;
                amax = m3_bits_f32(b);
            }
            uint32_t u = m3_f32_bits(amax * inv), ex = (u >> 23) & 0xFFu;
            if (ex == 0) continue; /* quotient subnormal: both clamp to byte 0 or 1 */
            if (u & 0x7FFFFFu) ex++;
            int k = (int)ex - 127;
            m3_e8m0 want = m3_e8m0_from_exp(k), got = m3_mx_scale_byte(amax, &p);
            if (got != want) m3_test_failf("rceil elem=%d amax=%a: %d vs bit form %d", e, (double)amax, got, want);
            n++;
        }
    }
    assert_true(n > 1000000);
}

/* ---- ptpc fp8 -------------------------------------------------------------------------- */

static void ptpc_rows(void **state) {
    (void)state;
    enum { R = 5, C = 37 };
    float x[R * C], sc[R], y[R * C];
    m3_fp8 q[R * C];
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 21);
    m3_fill_normal(&r, x, R * C, 3.0f);
    for (int j = 0; j < C; j++) x[1 * C + j] = 0.0f;           /* zero row */
    for (int j = 0; j < C; j++) x[2 * C + j] = j == 5 ? -0.0f : 0.0f; /* zero row with a -0 */
    x[3 * C + 7] = NAN;                                          /* NaN poisons its row */
    for (int j = 0; j < C; j++) x[4 * C + j] *= 1e-30f;          /* tiny, scale still exact */
    static const m3_fp8_kind kinds[] = {M3_FP8_E4M3FN, M3_FP8_E4M3FNUZ, M3_FP8_E5M2};
    for (int k = 0; k < 3; k++)
        for (int zr = 0; zr < 2; zr++)
            for (int ar = 0; ar < 2; ar++) {
                m3_fp8q_params p = m3_fp8q_params_default(kinds[k]);
                assert_true(p.fp8_max == m3_fp8_max(kinds[k]));
                p.zero_row = zr ? M3_PTPC_ZERO_ONE : M3_PTPC_ZERO_NAN;
                p.arith = ar ? M3_FP8Q_RCP : M3_FP8Q_DIV;
                m3_fp8_quantize_rows(q, sc, x, R, C, &p);
                for (int i = 0; i < R; i++) {
                    float amax = 0;
                    bool nan = false;
                    for (int j = 0; j < C; j++) {
                        nan |= isnan(x[i * C + j]);
                        amax = fmaxf(amax, fabsf(x[i * C + j]));
                    }
                    if (nan) {
                        assert_true(isnan(sc[i]));
                        for (int j = 0; j < C; j++) assert_true(m3_fp8_is_nan(q[i * C + j], p.kind));
                        continue;
                    }
                    if (amax == 0) {
                        if (zr) {
                            assert_true(sc[i] == 1.0f);
                            for (int j = 0; j < C; j++) {
                                bool neg = signbit(x[i * C + j]) && p.kind != M3_FP8_E4M3FNUZ;
                                assert_int_equal(q[i * C + j], neg ? 0x80 : 0x00);
                            }
                        } else {
                            assert_true(sc[i] == 0.0f); /* 0/0 below: every code NaN */
                            for (int j = 0; j < C; j++) assert_true(m3_fp8_is_nan(q[i * C + j], p.kind));
                        }
                        continue;
                    }
                    float want_s = ar ? amax * (1.0f / p.fp8_max) : amax / p.fp8_max;
                    assert_true(m3_f32_bits(sc[i]) == m3_f32_bits(want_s));
                    bool hit_max = false;
                    for (int j = 0; j < C; j++) {
                        float v = ar ? x[i * C + j] * (1.0f / want_s) : x[i * C + j] / want_s;
                        assert_int_equal(q[i * C + j], m3_f32_to_fp8(v, p.kind, p.ovf));
                        hit_max |= (q[i * C + j] & 0x7F) == m3_fp8_max_code(p.kind);
                    }
                    assert_true(hit_max); /* the amax element lands on (or saturates to) FP8_MAX */
                }
                m3_fp8_dequantize_rows(y, q, sc, R, C, p.kind);
                for (int i = 0; i < R * C; i++) {
                    float want = m3_fp8_to_f32(q[i], p.kind) * sc[i / C];
                    /* NaN payloads are the FPU's business: compare NaN-ness only */
                    if (isnan(want)) assert_true(isnan(y[i]));
                    else assert_true(m3_f32_bits(y[i]) == m3_f32_bits(want));
                }
            }
    /* a writer constant that is not the kind's max: §4.7 Triton writers, 240 with e4m3fn */
    m3_fp8q_params p = m3_fp8q_params_default(M3_FP8_E4M3FN);
    p.fp8_max = 240.0f;
    float row[3] = {-3.0f, 1.5f, 0.0f}, s1;
    m3_fp8 q1[3];
    m3_fp8_quantize_rows(q1, &s1, row, 1, 3, &p);
    assert_true(s1 == 3.0f / 240.0f);
    assert_int_equal(q1[0], 0xF7); /* -240 */
    assert_int_equal(q1[1], 0x6F); /* 120 */
    assert_int_equal(q1[2], 0x00);
}

/* ---- e4m3fn -> e4m3fnuz ---------------------------------------------------------------- */

static void fn_to_fnuz_conversion(void **state) {
    (void)state;
    m3_fp8 src[256], dst[256];
    for (int c = 0; c < 256; c++) src[c] = (m3_fp8)c;
    m3_fp8_fn_to_fnuz(dst, src, 256);
    int n_preserved = 0;
    for (int c = 0; c < 256; c++) {
        /* §5.7: only 0x80 moves (to 0x00); 0x7F / 0xFF stay and read as +-240 */
        assert_int_equal(dst[c], c == 0x80 ? 0x00 : c);
        assert_int_equal(m3_fp8_fn_to_fnuz_code((m3_fp8)c), dst[c]);
        float vf = m3_fp8_to_f32((m3_fp8)c, M3_FP8_E4M3FN);
        float vz = m3_fp8_to_f32(dst[c], M3_FP8_E4M3FNUZ) * 2.0f; /* scale x2 */
        if (m3_fp8_is_nan((m3_fp8)c, M3_FP8_E4M3FN)) {
            assert_true(vz == (c == 0x7F ? 480.0f : -480.0f)); /* documented exception */
            continue;
        }
        assert_false(isnan(vz));
        assert_true(vf == vz); /* value preserved; -0 -> +0 is the only sign change */
        if (c != 0x80) assert_true(!signbit(vf) == !signbit(vz));
        n_preserved++;
    }
    assert_int_equal(n_preserved, 254);
    /* in place */
    m3_fp8_fn_to_fnuz(src, src, 256);
    assert_memory_equal(src, dst, 256);
    /* scales */
    float fs[3] = {1.0f, 0.0078125f, 3e-3f};
    m3_fp8_fn_to_fnuz_scales_f32(fs, 3);
    assert_true(fs[0] == 2.0f && fs[1] == 0.015625f && fs[2] == 6e-3f);
    m3_e8m0 es[4] = {0, 127, 253, 0xFF};
    assert_int_equal(m3_fp8_fn_to_fnuz_scales_e8m0(es, 4), M3_OK);
    assert_int_equal(es[0], 1);
    assert_int_equal(es[1], 128);
    assert_int_equal(es[2], 254);
    assert_int_equal(es[3], 0xFF);
    m3_e8m0 bad[3] = {3, 254, 5};
    assert_int_equal(m3_fp8_fn_to_fnuz_scales_e8m0(bad, 3), M3_ERR_NUMERIC);
    assert_int_equal(bad[0], 3); /* untouched on error */
    assert_non_null(strstr(m3_last_error(), "scale 1"));
    m3_clear_error();
    /* MXFP8 end to end: a fn-quantized matrix converted to fnuz dequantizes identically */
    enum { R = 3, C = 64 };
    float x[R * C], y1[R * C], y2[R * C];
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 31);
    m3_fill_normal(&r, x, R * C, 10.0f);
    m3_mx_params pf = m3_mx_params_default(M3_MX_E4M3FN), pz = m3_mx_params_default(M3_MX_E4M3FNUZ);
    uint8_t q[R * C];
    m3_e8m0 s[R * 2];
    m3_mx_quantize(q, s, x, R, C, &pf);
    m3_mx_dequantize(y1, q, s, R, C, &pf);
    m3_fp8_fn_to_fnuz(q, q, R * C);
    assert_int_equal(m3_fp8_fn_to_fnuz_scales_e8m0(s, R * 2), M3_OK);
    m3_mx_dequantize(y2, q, s, R, C, &pz);
    for (int i = 0; i < R * C; i++) assert_true(y1[i] == y2[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mx_known_answers),
        cmocka_unit_test(mx_zero_nan_inf_blocks),
        cmocka_unit_test(mx_partial_blocks_and_packing),
        cmocka_unit_test(mx_requantize_is_idempotent),
        cmocka_unit_test(mx_rceil_matches_reciprocal_bit_form),
        cmocka_unit_test(ptpc_rows),
        cmocka_unit_test(fn_to_fnuz_conversion),
    };
    return M3_RUN_TESTS(tests);
}
