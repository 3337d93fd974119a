/* tests/ref_num.c: scalar number formats of ref/num/ (spec m3-numerics.md §5.1-5.4, §5.8).
 * Every check is exact (bit patterns or exactly representable values): no tolerances.
 * References written here, independent of ref/num/round.h's integer shift-and-compare:
 *  - decode: a field-by-field decoder in double (ldexp) per format;
 *  - encode: nearest neighbour by binary search in a sorted table of every finite value
 *    (from that decoder), ties decided by code parity (RNE) or away (RNA), overflow by the
 *    table's extra entry "max + one quantum";
 *  - bf16: integer compare of the low 16 bits; fp16: the table encoder.
 * Sweeps: >= 10^6 random inputs per converter plus a strided 2^32 sweep. M3_FULL_SWEEP=1 runs
 * bf16 over all 2^32 inputs instead (seconds; too slow under SANITIZE=1, hence opt-in). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/num/bf16.h"
#include "ref/num/fp16.h"
#include "ref/num/fp8.h"
#include "ref/num/mx.h"
#include "tests/util.h"

/* double-typed specials (NAN and INFINITY are float constants) */
#define DNAN ((double)NAN)
#define DINF ((double)INFINITY)

/* ---- independent reference formats ----------------------------------------------------- */

enum { TF_FN, TF_FNUZ, TF_E5M2, TF_E2M1, TF_FP16, TF_COUNT };

typedef struct {
    const char *name;
    int ebits, mbits, bias, nbits;
    unsigned maxc;    /* largest finite magnitude code */
    bool has_negzero; /* format has -0 */
    double *v;        /* v[0..maxc+1]: positive finite values, then max + one quantum */
} tfmt;

static tfmt TF[TF_COUNT] = {
    {"e4m3fn", 4, 3, 7, 8, 0x7E, true, NULL},
    {"e4m3fnuz", 4, 3, 8, 8, 0x7F, false, NULL},
    {"e5m2", 5, 2, 15, 8, 0x7B, true, NULL},
    {"e2m1", 2, 1, 1, 4, 0x7, true, NULL},
    {"fp16", 5, 10, 15, 16, 0x7BFF, true, NULL},
};

static bool tf_is_nan(int f, unsigned c) {
    const tfmt *t = &TF[f];
    unsigned E = (c >> t->mbits) & ((1u << t->ebits) - 1), m = c & ((1u << t->mbits) - 1);
    switch (f) {
    case TF_FN: return E == 15 && m == 7;
    case TF_FNUZ: return c == 0x80;
    case TF_E5M2: case TF_FP16: return E == 31 && m != 0;
    default: return false;
    }
}

/* Decoder from the bit fields, in double. */
static double tf_decode(int f, unsigned c) {
    const tfmt *t = &TF[f];
    unsigned s = (c >> (t->nbits - 1)) & 1u;
    unsigned E = (c >> t->mbits) & ((1u << t->ebits) - 1), m = c & ((1u << t->mbits) - 1);
    if (tf_is_nan(f, c)) return DNAN;
    if ((f == TF_E5M2 || f == TF_FP16) && E == 31) return s ? -DINF : DINF;
    double v = E == 0 ? ldexp((double)m, 1 - t->bias - t->mbits)
                      : ldexp(1.0 + ldexp((double)m, -t->mbits), (int)E - t->bias);
    return s ? -v : v;
}

static void tf_init(void) {
    for (int f = 0; f < TF_COUNT; f++) {
        tfmt *t = &TF[f];
        if (t->v) continue;
        t->v = malloc(sizeof(double) * (t->maxc + 2));
        for (unsigned c = 0; c <= t->maxc; c++) t->v[c] = tf_decode(f, c);
        t->v[t->maxc + 1] = 2 * t->v[t->maxc] - t->v[t->maxc - 1];
    }
}

/* Reference encoder. ovf_nan: non-saturating policy (NaN, or inf where the format has it). */
static unsigned tf_encode(int f, double x, bool ovf_nan, bool rna) {
    const tfmt *t = &TF[f];
    unsigned sb = 1u << (t->nbits - 1);
    unsigned s = signbit(x) ? sb : 0;
    unsigned nan = f == TF_FN ? s | 0x7F : f == TF_FNUZ ? 0x80 : f == TF_E5M2 ? s | 0x7E : s | 0x7;
    unsigned inf = f == TF_E5M2 ? s | 0x7C : f == TF_FP16 ? s | 0x7C00 : nan;
    if (isnan(x)) return f == TF_FP16 ? s | 0x7E00 : nan;
    double a = fabs(x);
    unsigned idx;
    if (isinf(a) || a >= t->v[t->maxc + 1]) {
        idx = t->maxc + 1;
    } else {
        unsigned lo = 0, hi = t->maxc + 1; /* v[lo] <= a < v[hi] */
        while (hi - lo > 1) {
            unsigned mid = (lo + hi) / 2;
            if (t->v[mid] <= a) lo = mid; else hi = mid;
        }
        double mid = 0.5 * (t->v[lo] + t->v[hi]);
        if (a == t->v[lo] || a < mid) idx = lo;
        else if (a > mid) idx = hi;
        else idx = rna ? hi : ((lo & 1u) ? hi : lo);
    }
    if (idx > t->maxc) {
        if (f == TF_E2M1) return s | t->maxc; /* e2m1 always saturates */
        if (f == TF_FP16) return inf;         /* IEEE: overflow to inf */
        return ovf_nan ? inf : s | t->maxc;
    }
    if (!t->has_negzero && idx == 0) return 0;
    return s | idx;
}

static m3_fp8_kind tf_kind(int f) {
    return f == TF_FN ? M3_FP8_E4M3FN : f == TF_FNUZ ? M3_FP8_E4M3FNUZ : M3_FP8_E5M2;
}

/* The implementation under test, addressed like the reference. */
static unsigned impl_encode(int f, float x, bool ovf_nan, bool rna) {
    m3_round r = rna ? M3_ROUND_RNA : M3_ROUND_RNE;
    if (f == TF_E2M1) return m3_f32_to_fp4(x, r);
    if (f == TF_FP16) return m3_f32_to_fp16(x);
    return m3_f32_to_fp8_r(x, tf_kind(f), ovf_nan ? M3_FP8_OVF_NAN : M3_FP8_SATURATE, r);
}

static float impl_decode(int f, unsigned c) {
    if (f == TF_E2M1) return m3_fp4_to_f32((uint8_t)c);
    if (f == TF_FP16) return m3_fp16_to_f32((m3_fp16)c);
    return m3_fp8_to_f32((m3_fp8)c, tf_kind(f));
}

static bool same_value(double want, float got) {
    if (isnan(want)) return isnan(got);
    return want == (double)got && !signbit(want) == !signbit(got);
}

static bool sanitized(void) {
#if defined(__SANITIZE_ADDRESS__)
    return true;
#else
    return false;
#endif
}

/* ---- bf16 ------------------------------------------------------------------------------- */

static uint16_t ref_bf16(uint32_t u) {
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return 0; /* NaN: checked apart */
    uint32_t hi = u >> 16, lo = u & 0xFFFFu;
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) hi++;
    return (uint16_t)hi;
}

static void check_bf16(uint32_t u) {
    uint16_t got = m3_f32_to_bf16(m3_bits_f32(u));
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) {
        /* NaN: stays NaN, same sign, quiet bit set */
        if ((got & 0x7F80u) != 0x7F80u || !(got & 0x0040u) || (got & 0x8000u) != ((u >> 16) & 0x8000u))
            m3_test_failf("bf16(NaN 0x%08x) = 0x%04x", u, got);
        return;
    }
    if (got != ref_bf16(u)) m3_test_failf("bf16(0x%08x) = 0x%04x, want 0x%04x", u, got, ref_bf16(u));
}

static void bf16_specials_and_random(void **state) {
    (void)state;
    static const uint32_t sp[] = {
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
        0xFF800001, 0x7FBFFFFF, 0x7F80FFFF, 0x7FFFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000,
        0x7F7F7FFF, 0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x00007FFF, 0x00010000,
        0x007FFFFF, 0x00800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0xBF808000,
        0xBF818000, 0x3F800000, 0x7F7F0000, 0x7F7EFFFF,
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) check_bf16(sp[i]);
    /* named expectations: max finite rounds to inf through the carry, ties to even */
    assert_int_equal(m3_f32_to_bf16(m3_bits_f32(0x7F7FFFFF)), 0x7F80);
    assert_int_equal(m3_f32_to_bf16(m3_bits_f32(0x7F7F7FFF)), 0x7F7F);
    assert_int_equal(m3_f32_to_bf16(m3_bits_f32(0x3F808000)), 0x3F80);
    assert_int_equal(m3_f32_to_bf16(m3_bits_f32(0x3F818000)), 0x3F82);
    assert_int_equal(m3_f32_to_bf16(m3_bits_f32(0x7F800001)), 0x7FC0);
    assert_int_equal(m3_f32_to_bf16(m3_bits_f32(0xFF80FFFF)), 0xFFC0);
    assert_int_equal(m3_f32_to_bf16(m3_bits_f32(0x00008000)), 0x0000);
    assert_int_equal(m3_f32_to_bf16(m3_bits_f32(0x00018000)), 0x0002);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 1);
    for (int i = 0; i < 1000000; i++) check_bf16(m3_rng_u32(&r));
    if (getenv("M3_FULL_SWEEP") && atoi(getenv("M3_FULL_SWEEP"))) {
        uint32_t u = 0;
        do check_bf16(u); while (++u != 0);
    } else {
        for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += sanitized() ? 40009u : 4099u)
            check_bf16((uint32_t)u);
    }
}

static void bf16_all_codes_round_trip(void **state) {
    (void)state;
    for (uint32_t c = 0; c < 65536; c++) {
        float v = m3_bf16_to_f32((m3_bf16)c);
        assert_true(m3_f32_bits(v) == c << 16);
        uint16_t back = m3_f32_to_bf16(v);
        bool nan = (c & 0x7F80u) == 0x7F80u && (c & 0x7Fu);
        if (nan) assert_int_equal(back, c | 0x40u); /* quieted, payload and sign kept */
        else assert_int_equal(back, c);
    }
    /* every midpoint between neighbouring finite bf16 values (exact in fp32) goes to even */
    for (uint32_t c = 0; c < 0x7F80u; c++) {
        uint32_t mid = (c << 16) | 0x8000u;
        for (int neg = 0; neg < 2; neg++) {
            uint32_t s = neg ? 0x80000000u : 0u;
            uint16_t got = m3_f32_to_bf16(m3_bits_f32(mid | s));
            uint16_t want = (uint16_t)(((c & 1u) ? c + 1 : c) | (s >> 16));
            if (got != want) m3_test_failf("bf16 midpoint 0x%08x -> 0x%04x want 0x%04x", mid | s, got, want);
        }
    }
    assert_true(m3_round_bf16(1.00390625f) == 1.0f); /* 1 + 2^-8: tie, to even */
}

/* ---- fp16 ------------------------------------------------------------------------------- */

static void check_enc(int f, float x, bool ovf_nan, bool rna) {
    unsigned want = tf_encode(f, (double)x, ovf_nan, rna), got = impl_encode(f, x, ovf_nan, rna);
    if (f == TF_FP16 && isnan(x)) {
        unsigned s = (m3_f32_bits(x) >> 16) & 0x8000u;
        if ((got & 0x7C00u) != 0x7C00u || !(got & 0x0200u) || (got & 0x8000u) != s)
            m3_test_failf("fp16(NaN 0x%08x) = 0x%04x", m3_f32_bits(x), got);
        return;
    }
    if (got != want)
        m3_test_failf("%s(%a [0x%08x], ovf=%s, %s) = 0x%x, want 0x%x", TF[f].name, (double)x,
                      m3_f32_bits(x), ovf_nan ? "nan" : "sat", rna ? "rna" : "rne", got, want);
}

/* random floats whose exponents straddle the format's range (subnormals, overflow) */
static float rand_near(m3_rng *r, int f) {
    const tfmt *t = &TF[f];
    int emin = 1 - t->bias - t->mbits - 3, emax = (1 << t->ebits) - t->bias + 2;
    int e = emin + (int)(m3_rng_u32(r) % (unsigned)(emax - emin + 1));
    uint32_t u = ((uint32_t)(e + 127) << 23) | (m3_rng_u32(r) & 0x807FFFFFu);
    /* 1 in 8: few mantissa bits, so exact ties and grid points are frequent */
    if ((m3_rng_u32(r) & 7u) == 0) u &= ~((1u << (23 - (t->mbits + 2))) - 1u);
    return m3_bits_f32(u);
}

static void fp16_vs_reference(void **state) {
    (void)state;
    tf_init();
    for (unsigned c = 0; c < 65536; c++) {
        float v = m3_fp16_to_f32((m3_fp16)c);
        double want = tf_decode(TF_FP16, c);
        if (!same_value(want, v)) m3_test_failf("fp16 decode 0x%04x = %a want %a", c, (double)v, want);
        if (isnan(v)) {
            assert_int_equal(m3_f32_to_fp16(v), c | 0x0200u); /* payload kept, quieted */
            assert_true((m3_f32_bits(v) & 0x7FFFFFu) == (c & 0x3FFu) << 13);
        } else {
            assert_int_equal(m3_f32_to_fp16(v), c);
        }
    }
    static const uint32_t sp[] = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                                  0xFFC00001, 0x7F800001, 0x7F7FFFFF, 0x477FE000, 0x477FEFFF,
                                  0x477FF000, 0x477FF001, 0x33800000, 0x33800001, 0x33000000,
                                  0x33000001, 0x00000001, 0x387FC000, 0x38800000, 0x387FE000};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) check_enc(TF_FP16, m3_bits_f32(sp[i]), false, false);
    assert_int_equal(m3_f32_to_fp16(65504.0f), 0x7BFF);
    assert_int_equal(m3_f32_to_fp16(65519.996f), 0x7BFF);
    assert_int_equal(m3_f32_to_fp16(65520.0f), 0x7C00);     /* tie with the odd max: to inf */
    assert_int_equal(m3_f32_to_fp16(0x1p-25f), 0x0000);     /* half the min subnormal: to even 0 */
    assert_int_equal(m3_f32_to_fp16(-0x1.000002p-25f), 0x8001);
    assert_int_equal(m3_f32_to_fp16(0x1.8p-24f), 0x0002);   /* 1.5 subnormal quanta: to even */
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 2);
    for (int i = 0; i < 1000000; i++) check_enc(TF_FP16, rand_near(&r, TF_FP16), false, false);
    for (int i = 0; i < 200000; i++) check_enc(TF_FP16, m3_bits_f32(m3_rng_u32(&r)), false, false);
}

/* ---- fp8, e2m1 -------------------------------------------------------------------------- */

typedef struct { unsigned code; double value; } kv;

static void check_table(int f, const kv *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float got = impl_decode(f, t[i].code);
        if (!same_value(t[i].value, got))
            m3_test_failf("%s decode 0x%02x = %a want %a", TF[f].name, t[i].code, (double)got, t[i].value);
        if (!same_value(t[i].value, (float)tf_decode(f, t[i].code)))
            m3_test_failf("reference decoder disagrees with the spec table at %s 0x%02x", TF[f].name, t[i].code);
    }
}

static void decode_every_code(void **state) {
    (void)state;
    tf_init();
    /* literal values from spec §5.2 / §5.4 */
    static const kv fn[] = {{0x00, 0.0}, {0x80, -0.0}, {0x01, 0x1p-9}, {0x07, 7 * 0x1p-9},
                            {0x08, 0x1p-6}, {0x38, 1.0}, {0x3F, 1.875}, {0x40, 2.0},
                            {0x7E, 448.0}, {0xFE, -448.0}, {0x7F, DNAN}, {0xFF, DNAN},
                            {0x77, 240.0}, {0x81, -0x1p-9}};
    static const kv fnuz[] = {{0x00, 0.0}, {0x80, DNAN}, {0x01, 0x1p-10}, {0x08, 0x1p-7},
                              {0x40, 1.0}, {0x7F, 240.0}, {0xFF, -240.0}, {0x7E, 224.0},
                              {0x81, -0x1p-10}};
    static const kv e5[] = {{0x00, 0.0}, {0x80, -0.0}, {0x01, 0x1p-16}, {0x04, 0x1p-14},
                            {0x3C, 1.0}, {0x7B, 57344.0}, {0xFB, -57344.0}, {0x7C, DINF},
                            {0xFC, -DINF}, {0x7D, DNAN}, {0x7E, DNAN}, {0x7F, DNAN},
                            {0xFD, DNAN}, {0xFE, DNAN}, {0xFF, DNAN}, {0x03, 3 * 0x1p-16}};
    static const kv fp4[] = {{0, 0.0}, {1, 0.5}, {2, 1.0}, {3, 1.5}, {4, 2.0}, {5, 3.0},
                             {6, 4.0}, {7, 6.0}, {8, -0.0}, {9, -0.5}, {10, -1.0}, {11, -1.5},
                             {12, -2.0}, {13, -3.0}, {14, -4.0}, {15, -6.0}};
    check_table(TF_FN, fn, sizeof fn / sizeof fn[0]);
    check_table(TF_FNUZ, fnuz, sizeof fnuz / sizeof fnuz[0]);
    check_table(TF_E5M2, e5, sizeof e5 / sizeof e5[0]);
    check_table(TF_E2M1, fp4, sizeof fp4 / sizeof fp4[0]);
    /* every code against the field decoder */
    for (int f = TF_FN; f <= TF_E2M1; f++) {
        unsigned ncode = 1u << TF[f].nbits;
        for (unsigned c = 0; c < ncode; c++) {
            float got = impl_decode(f, c);
            if (!same_value(tf_decode(f, c), got))
                m3_test_failf("%s decode 0x%02x = %a want %a", TF[f].name, c, (double)got, tf_decode(f, c));
            if (f != TF_E2M1) assert_true(m3_fp8_is_nan((m3_fp8)c, tf_kind(f)) == tf_is_nan(f, c));
        }
    }
    assert_true(m3_fp8_max(M3_FP8_E4M3FN) == 448.0f);
    assert_true(m3_fp8_max(M3_FP8_E4M3FNUZ) == 240.0f);
    assert_true(m3_fp8_max(M3_FP8_E5M2) == 57344.0f);
    for (int f = TF_FN; f <= TF_E5M2; f++)
        assert_true((double)m3_fp8_max(tf_kind(f)) == TF[f].v[TF[f].maxc]);
    /* e8m0: every byte; 0 is the fp32 subnormal 2^-127 (bits 0x00400000), never flushed */
    for (unsigned b = 0; b < 256; b++) {
        float v = m3_e8m0_to_f32((m3_e8m0)b);
        if (b == 255) assert_true(isnan(v));
        else if ((double)v != ldexp(1.0, (int)b - 127)) m3_test_failf("e8m0 0x%02x = %a", b, (double)v);
    }
    assert_true(m3_f32_bits(m3_e8m0_to_f32(0)) == 0x00400000u);
    assert_true(m3_f32_bits(m3_e8m0_to_f32(1)) == 0x00800000u);
    assert_true(m3_e8m0_to_f32(127) == 1.0f && m3_e8m0_to_f32(254) == 0x1p127f);
    assert_int_equal(m3_e8m0_from_exp(-200), 0);
    assert_int_equal(m3_e8m0_from_exp(300), 254);
    assert_int_equal(m3_e8m0_from_exp(0), 127);
}

static void encode_decode_round_trip(void **state) {
    (void)state;
    tf_init();
    for (int f = TF_FN; f <= TF_E2M1; f++) {
        unsigned ncode = 1u << TF[f].nbits;
        for (unsigned c = 0; c < ncode; c++) {
            float v = impl_decode(f, c);
            if (isnan(v) || isinf(v)) continue;
            for (int k = 0; k < 4; k++) {
                unsigned got = impl_encode(f, v, k & 1, k & 2);
                if (got != c) m3_test_failf("%s: encode(decode(0x%02x)) = 0x%02x", TF[f].name, c, got);
            }
        }
    }
}

/* Every midpoint between neighbouring representable values (and the one between max and
 * the overflow value), both signs, both tie rules; plus the floats just either side. */
static void midpoints_round_as_documented(void **state) {
    (void)state;
    tf_init();
    int n_checked = 0;
    for (int f = 0; f < TF_COUNT; f++) {
        const tfmt *t = &TF[f];
        for (unsigned i = 0; i <= t->maxc; i++) {
            double mid = 0.5 * (t->v[i] + t->v[i + 1]);
            float fm = (float)mid;
            assert_true((double)fm == mid); /* the midpoint is exactly a float */
            for (int neg = 0; neg < 2; neg++) {
                float x = neg ? -fm : fm;
                unsigned sb = neg ? 1u << (t->nbits - 1) : 0;
                for (int k = 0; k < 4; k++) {
                    bool ovf_nan = k & 1, rna = k & 2;
                    if (f == TF_FP16 && (ovf_nan || rna)) continue; /* fp16 is IEEE RNE only */
                    unsigned idx = rna ? i + 1 : ((i & 1u) ? i + 1 : i);
                    unsigned want;
                    if (idx > t->maxc) want = tf_encode(f, (double)x, ovf_nan, rna); /* overflow */
                    else if (idx == 0 && !t->has_negzero) want = 0;
                    else want = sb | idx;
                    unsigned got = impl_encode(f, x, ovf_nan, rna);
                    if (got != want)
                        m3_test_failf("%s midpoint %a (%s, %s) -> 0x%x want 0x%x", t->name, (double)x,
                                      rna ? "rna" : "rne", ovf_nan ? "nan" : "sat", got, want);
                    check_enc(f, nextafterf(x, 0.0f), ovf_nan, rna);
                    check_enc(f, nextafterf(x, neg ? -INFINITY : INFINITY), ovf_nan, rna);
                    n_checked++;
                }
            }
        }
    }
    assert_true(n_checked > 2 * 31744);
    /* the spec's own list for e2m1 (§5.4): 0.25 .75 1.25 1.75 2.5 3.5 5 -> 0 1 1 2 2 4 4 */
    static const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const float rne[] = {0, 1, 1, 2, 2, 4, 4}, rna[] = {0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int i = 0; i < 7; i++) {
        assert_true(m3_fp4_to_f32(m3_f32_to_fp4(mids[i], M3_ROUND_RNE)) == rne[i]);
        assert_true(m3_fp4_to_f32(m3_f32_to_fp4(mids[i], M3_ROUND_RNA)) == rna[i]);
        assert_true(m3_fp4_to_f32(m3_f32_to_fp4(-mids[i], M3_ROUND_RNA)) == -rna[i]);
    }
}

static void fp8_overflow_underflow_specials(void **state) {
    (void)state;
    const m3_fp8_overflow S = M3_FP8_SATURATE, N = M3_FP8_OVF_NAN;
    const m3_fp8_kind FN = M3_FP8_E4M3FN, UZ = M3_FP8_E4M3FNUZ, E5 = M3_FP8_E5M2;
    /* e4m3fn: 464 is the tie between 448 (even) and NaN: goes to 448 under both policies */
    assert_int_equal(m3_f32_to_fp8(448.0f, FN, N), 0x7E);
    assert_int_equal(m3_f32_to_fp8(464.0f, FN, N), 0x7E);
    assert_int_equal(m3_f32_to_fp8(-464.0f, FN, N), 0xFE);
    assert_int_equal(m3_f32_to_fp8(464.00003f, FN, N), 0x7F);
    assert_int_equal(m3_f32_to_fp8(-464.00003f, FN, N), 0xFF);
    assert_int_equal(m3_f32_to_fp8(464.00003f, FN, S), 0x7E);
    assert_int_equal(m3_f32_to_fp8(1e30f, FN, S), 0x7E);
    assert_int_equal(m3_f32_to_fp8(-1e30f, FN, S), 0xFE);
    assert_int_equal(m3_f32_to_fp8(INFINITY, FN, S), 0x7E);
    assert_int_equal(m3_f32_to_fp8(-INFINITY, FN, S), 0xFE);
    assert_int_equal(m3_f32_to_fp8(INFINITY, FN, N), 0x7F);
    assert_int_equal(m3_f32_to_fp8(-INFINITY, FN, N), 0xFF);
    assert_int_equal(m3_f32_to_fp8(NAN, FN, S), 0x7F);
    assert_int_equal(m3_f32_to_fp8(-NAN, FN, S), 0xFF);
    /* RNA: 464 ties away, past 448 */
    assert_int_equal(m3_f32_to_fp8_r(464.0f, FN, N, M3_ROUND_RNA), 0x7F);
    assert_int_equal(m3_f32_to_fp8_r(464.0f, FN, S, M3_ROUND_RNA), 0x7E);
    /* e4m3fnuz: max 240 (odd mantissa), so 248 ties upward into overflow */
    assert_int_equal(m3_f32_to_fp8(240.0f, UZ, N), 0x7F);
    assert_int_equal(m3_f32_to_fp8(247.99998f, UZ, N), 0x7F);
    assert_int_equal(m3_f32_to_fp8(248.0f, UZ, N), 0x80);
    assert_int_equal(m3_f32_to_fp8(-248.0f, UZ, N), 0x80);
    assert_int_equal(m3_f32_to_fp8(248.0f, UZ, S), 0x7F);
    assert_int_equal(m3_f32_to_fp8(-1e9f, UZ, S), 0xFF);
    assert_int_equal(m3_f32_to_fp8(-INFINITY, UZ, S), 0xFF);
    assert_int_equal(m3_f32_to_fp8(INFINITY, UZ, N), 0x80);
    assert_int_equal(m3_f32_to_fp8(NAN, UZ, S), 0x80);
    assert_int_equal(m3_f32_to_fp8(-0.0f, UZ, S), 0x00);
    assert_int_equal(m3_f32_to_fp8(-0x1p-12f, UZ, S), 0x00); /* tiny negative: +0, no -0 */
    assert_int_equal(m3_f32_to_fp8(-0x1p-11f, UZ, S), 0x00); /* half min subnormal: to even 0 */
    assert_int_equal(m3_f32_to_fp8(-0x1.000002p-11f, UZ, S), 0x81);
    /* e5m2: non-saturating policy gives inf */
    assert_int_equal(m3_f32_to_fp8(57344.0f, E5, N), 0x7B);
    assert_int_equal(m3_f32_to_fp8(61439.996f, E5, N), 0x7B);
    assert_int_equal(m3_f32_to_fp8(61440.0f, E5, N), 0x7C);
    assert_int_equal(m3_f32_to_fp8(-61440.0f, E5, N), 0xFC);
    assert_int_equal(m3_f32_to_fp8(61440.0f, E5, S), 0x7B);
    assert_int_equal(m3_f32_to_fp8(INFINITY, E5, N), 0x7C);
    assert_int_equal(m3_f32_to_fp8(-INFINITY, E5, S), 0xFB);
    assert_int_equal(m3_f32_to_fp8(NAN, E5, S), 0x7E);
    assert_int_equal(m3_f32_to_fp8(-NAN, E5, N), 0xFE);
    /* underflow: to subnormals, to zero with sign where -0 exists */
    assert_int_equal(m3_f32_to_fp8(0x1p-9f, FN, S), 0x01);
    assert_int_equal(m3_f32_to_fp8(0x1.8p-9f, FN, S), 0x02); /* 1.5 quanta: to even */
    assert_int_equal(m3_f32_to_fp8(0x1.4p-8f, FN, S), 0x02); /* 2.5 quanta: to even */
    assert_int_equal(m3_f32_to_fp8(0x1p-10f, FN, S), 0x00);  /* half min subnormal */
    assert_int_equal(m3_f32_to_fp8(-0x1p-10f, FN, S), 0x80);
    assert_int_equal(m3_f32_to_fp8(-0x1p-30f, FN, S), 0x80);
    assert_int_equal(m3_f32_to_fp8(0x1p-149f, FN, S), 0x00);
    assert_int_equal(m3_f32_to_fp8_r(0x1p-10f, FN, S, M3_ROUND_RNA), 0x01);
    assert_int_equal(m3_f32_to_fp8(0x1.fp-7f, FN, S), 0x08);   /* 7.75 quanta rounds up into min normal */
    assert_int_equal(m3_f32_to_fp8(-0x1p-17f, E5, S), 0x80);
    assert_int_equal(m3_f32_to_fp8(0x1.000002p-17f, E5, S), 0x01);
    assert_int_equal(m3_f32_to_fp8(-0.0f, FN, S), 0x80);
    assert_int_equal(m3_f32_to_fp8(-0.0f, E5, S), 0x80);
    /* e2m1: saturates at 6; inf and NaN saturate too (no NaN in the format) */
    assert_int_equal(m3_f32_to_fp4(6.5f, M3_ROUND_RNE), 0x7);
    assert_int_equal(m3_f32_to_fp4(7.0f, M3_ROUND_RNE), 0x7);
    assert_int_equal(m3_f32_to_fp4(-1e38f, M3_ROUND_RNA), 0xF);
    assert_int_equal(m3_f32_to_fp4(INFINITY, M3_ROUND_RNE), 0x7);
    assert_int_equal(m3_f32_to_fp4(-NAN, M3_ROUND_RNE), 0xF);
    assert_int_equal(m3_f32_to_fp4(-0.1f, M3_ROUND_RNE), 0x8);
    assert_int_equal(m3_f32_to_fp4(0.2500001f, M3_ROUND_RNE), 0x1);
}

static void fp8_random_vs_reference(void **state) {
    (void)state;
    tf_init();
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 3);
    int n = sanitized() ? 100000 : 250000;
    for (int f = TF_FN; f <= TF_E2M1; f++)
        for (int i = 0; i < n; i++) {
            float x = rand_near(&r, f);
            for (int k = 0; k < 4; k++) check_enc(f, x, k & 1, k & 2);
        }
}

/* ---- e8m0 x e2m1 through the MX element path ------------------------------------------- */

static void mx_path_all_scales_all_codes(void **state) {
    (void)state;
    static const m3_mx_elem elems[] = {M3_MX_E2M1, M3_MX_E4M3FN, M3_MX_E4M3FNUZ, M3_MX_E5M2};
    long n = 0;
    for (int ei = 0; ei < 4; ei++) {
        m3_mx_params p = m3_mx_params_default(elems[ei]);
        int ncode = m3_mx_elem_is_fp4(p.elem) ? 16 : 256;
        for (int rr = 0; rr < 2; rr++) {
            p.round = rr ? M3_MX_ROUND_RNA : M3_MX_ROUND_RNE;
            for (int b = 0; b < 256; b++)
                for (int c = 0; c < ncode; c++) {
                    float e = m3_mx_elem_decode((uint8_t)c, p.elem);
                    float y = m3_mx_decode((uint8_t)c, (m3_e8m0)b, p.elem);
                    if (b == 255) { assert_true(isnan(y)); continue; }
                    double want = ldexp((double)e, b - 127); /* exact in double */
                    if (isnan(e)) { assert_true(isnan(y)); continue; }
                    if (fabs(want) > 0x1.fffffep127) { assert_true(isinf(y)); continue; }
                    if ((double)y != want || !signbit(y) != !signbit(want))
                        m3_test_failf("mx decode elem=%d code=0x%02x b=%d: %a want %a", ei, c, b, (double)y, want);
                    if (isinf(e)) continue;
                    uint8_t back = m3_mx_encode(y, (m3_e8m0)b, &p);
                    bool fnuz_zero = p.elem == M3_MX_E4M3FNUZ && c == 0;
                    if (back != c && !fnuz_zero)
                        m3_test_failf("mx encode(decode) elem=%d code=0x%02x b=%d -> 0x%02x", ei, c, b, back);
                    n++;
                }
        }
    }
    assert_true(n > 2 * 255 * 16);
}

static void fp4_nibbles(void **state) {
    (void)state;
    uint8_t buf[3] = {0, 0, 0};
    for (int i = 0; i < 5; i++) m3_fp4_set(buf, i, (uint8_t)(i + 1), false);
    assert_int_equal(buf[0], 0x21);
    assert_int_equal(buf[1], 0x43);
    assert_int_equal(buf[2], 0x05);
    for (int i = 0; i < 5; i++) assert_int_equal(m3_fp4_get(buf, i, false), i + 1);
    memset(buf, 0, sizeof buf);
    for (int i = 0; i < 5; i++) m3_fp4_set(buf, i, (uint8_t)(i + 1), true);
    assert_int_equal(buf[0], 0x12);
    assert_int_equal(buf[1], 0x34);
    assert_int_equal(buf[2], 0x50);
    for (int i = 0; i < 5; i++) assert_int_equal(m3_fp4_get(buf, i, true), i + 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bf16_specials_and_random),
        cmocka_unit_test(bf16_all_codes_round_trip),
        cmocka_unit_test(fp16_vs_reference),
        cmocka_unit_test(decode_every_code),
        cmocka_unit_test(encode_decode_round_trip),
        cmocka_unit_test(midpoints_round_as_documented),
        cmocka_unit_test(fp8_overflow_underflow_specials),
        cmocka_unit_test(fp8_random_vs_reference),
        cmocka_unit_test(mx_path_all_scales_all_codes),
        cmocka_unit_test(fp4_nibbles),
    };
    return M3_RUN_TESTS(tests);
}
