/* ref/num/mx.h: OCP MX scalar pieces (spec m3-numerics.md §5.3-5.5, §5.9):
 * e8m0 scales, fp4 e2m1 elements and their nibble packing, the three block-scale rules and
 * quantize / dequantize of ONE block. Array-level (row-major matrices) is ref/quant.h.
 *
 * e8m0: value 2^(b-127) for b = 0..254, 0xFF = NaN; no zero, no sign, no inf. b = 0 is
 *   2^-127, a binary32 subnormal: built from bits and never flushed (e8m0_subnormal=keep).
 * e2m1: bit 3 sign, bits 2-0 magnitude code 0..7 -> {0, .5, 1, 1.5, 2, 3, 4, 6}; 8..15 are
 *   the negatives (0x8 = -0); no NaN, no inf. Encode rounds on that grid (RNE or RNA) and
 *   saturates at +-6; NaN and inf inputs also give +-6 (the format cannot say NaN: in the MX
 *   path a NaN/inf never reaches an element, the block's scale says NaN instead).
 *
 * MX block of n elements (n = p->block, default 32, fewer for the last block of a row),
 * along the contracted dim:
 *   amax = max |x_i| (exact: compared as fp32 bit patterns).
 *   If any x_i is NaN or +-inf: scale byte 0xFF (NaN), every code 0; dequantization gives
 *     NaN for all n elements (OCP: a NaN scale makes the whole block NaN).
 *   If amax == 0: scale byte per p->zero (BYTE0: 0 i.e. 2^-127, what aiter's bit formulas
 *     give; MIN_NORMAL: 1 i.e. 2^-126, Quark's clamp, UNVERIFIED); codes are the elementwise
 *     encodings, so +0 -> code 0 and -0 -> the element's -0 code (e2m1 0x8, e4m3fn/e5m2 0x80).
 *   Otherwise X = 2^k with k by p->scale (emax_elem = 2 / 8 / 7 / 15 for e2m1 / e4m3fn /
 *     e4m3fnuz / e5m2; max_elem = 6 / 448 / 240 / 57344; M = element mantissa bits 1/3/3/2):
 *     FLOOR  k = floor(log2 amax) - emax_elem                         (OCP MX v1.0)
 *     EVEN   k = floor(log2(amax rounded half-up to M mantissa bits)) - emax_elem.
 *            Bit form: add 2^(22-M) to amax's fp32 bits (e2m1 0x200000 = 2^21, e4m3 0x80000
 *            = 2^19, e5m2 0x100000 = 2^20), clear the mantissa, read the biased exponent.
 *            e2m1: k+1 when amax/2^floor(log2 amax) >= 1.75; e4m3: >= 1.9375; e5m2: >= 1.875.
 *     RCEIL  k = ceil(log2(amax / max_elem)), computed exactly from the significands (no
 *            fp32 division). Wherever fp32(amax * fp32(1/max)) is normal this equals aiter's
 *            bit form of it (exponent + (mantissa != 0)); tests/ref_quant.c checks that.
 *     k is clamped to [-127, 127]; a subnormal amax always lands on the clamp (-127).
 *   Element i: code = encode(x_i / X) on the element grid with p->round (RNE or RNA), values
 *     past the element max per p->ovf (default and OCP: saturate; e2m1 always saturates).
 *     x_i / X is computed as x_i * 2^-k in fp32, exact unless the quotient is below 2^-126,
 *     where every element format rounds it to +-0 anyway (so no double rounding).
 *   Dequantize: y_i = decode(code_i) * 2^(b-127), exact in fp32 (products of at most 4
 *     significant bits with a power of two; results past 2^128 are +-inf).
 * Nibble order for e2m1 (fp4_nibble): low_even (default: element 2j in the low nibble of
 * byte j, 2j+1 in the high nibble; the Quark/ATOM checkpoint layout) or high_even. */
#ifndef M3_NUM_MX_H
#define M3_NUM_MX_H

#include <stdbool.h>

#include "ref/num/fp8.h"
#include "ref/num/num.h"
#include "ref/num/round.h"

/* ---- e8m0 ------------------------------------------------------------------------------ */

M3_HD M3_INLINE float m3_e8m0_to_f32(m3_e8m0 b) {
    if (b == 0xFFu) return m3_bits_f32(0x7FC00000u);
    return m3_pow2f((int)b - 127);
}

/* The e8m0 byte of 2^k, k clamped to [-127, 127]. */
M3_HD M3_INLINE m3_e8m0 m3_e8m0_from_exp(int k) {
    if (k < -127) k = -127;
    if (k > 127) k = 127;
    return (m3_e8m0)(k + 127);
}

/* ---- e2m1 (fp4) ------------------------------------------------------------------------ */

M3_HD M3_INLINE float m3_fp4_to_f32(uint8_t c) {
    float v = m3_mag_code_value(c & 0x7u, 1, 0);
    return (c & 0x8u) ? -v : v;
}

M3_HD M3_INLINE uint8_t m3_f32_to_fp4(float f, m3_round r) {
    uint32_t u = m3_f32_bits(f), s = (u >> 28) & 0x8u;
    if ((u & 0x7FFFFFFFu) >= 0x7F800000u) return (uint8_t)(s | 0x7u); /* inf, NaN: saturate */
    uint32_t c = m3_round_mag_code(f, 1, 0, r);
    return (uint8_t)(s | (c > 7u ? 7u : c));
}

/* Packed fp4: element i of a row lives in byte i/2. */
M3_HD M3_INLINE uint8_t m3_fp4_get(const uint8_t *packed, int64_t i, bool high_even) {
    bool high = ((i & 1) != 0) != high_even;
    uint8_t b = packed[i >> 1];
    return (uint8_t)(high ? (b >> 4) : (b & 0xFu));
}

M3_HD M3_INLINE void m3_fp4_set(uint8_t *packed, int64_t i, uint8_t code, bool high_even) {
    bool high = ((i & 1) != 0) != high_even;
    uint8_t b = packed[i >> 1];
    if (high) b = (uint8_t)((b & 0x0Fu) | ((code & 0xFu) << 4));
    else b = (uint8_t)((b & 0xF0u) | (code & 0xFu));
    packed[i >> 1] = b;
}

/* ---- MX parameters --------------------------------------------------------------------- */

typedef enum m3_mx_elem { M3_MX_E2M1 = 0, M3_MX_E4M3FN = 1, M3_MX_E4M3FNUZ = 2, M3_MX_E5M2 = 3 } m3_mx_elem;
/* mx_scale */
typedef enum m3_mx_scale_rule { M3_MX_SCALE_FLOOR = 0, M3_MX_SCALE_EVEN = 1, M3_MX_SCALE_RCEIL = 2 } m3_mx_scale_rule;
/* mx_round: values equal to m3_round's */
typedef enum m3_mx_round { M3_MX_ROUND_RNE = 0, M3_MX_ROUND_RNA = 1 } m3_mx_round;
/* mx_zero_block: scale byte of an amax == 0 block. §5.9's "min_scale" is byte 0 (2^-127,
 * the smallest e8m0, also what every rule gives once clamped), so it is M3_MX_ZERO_BYTE0. */
typedef enum m3_mx_zero_block { M3_MX_ZERO_BYTE0 = 0, M3_MX_ZERO_MIN_NORMAL = 1 } m3_mx_zero_block;

typedef struct m3_mx_params {
    m3_mx_elem elem;          /* element type */
    m3_mx_scale_rule scale;   /* mx_scale */
    m3_mx_round round;        /* mx_round (element rounding) */
    m3_mx_zero_block zero;    /* mx_zero_block */
    int block;                /* elements per scale along the contracted dim (32) */
    m3_fp8_overflow ovf;      /* fp8 elements past their max (e2m1 always saturates) */
    bool high_even_nibble;    /* fp4_nibble: false = low_even (checkpoint layout) */
} m3_mx_params;

/* Defaults: scale EVEN (the §5.9 atom default for weights; activations must ask for RCEIL),
 * round RNE, zero block byte 0, block 32, saturating elements, low_even nibbles. */
M3_HD M3_INLINE m3_mx_params m3_mx_params_default(m3_mx_elem elem) {
    m3_mx_params p;
    p.elem = elem;
    p.scale = M3_MX_SCALE_EVEN;
    p.round = M3_MX_ROUND_RNE;
    p.zero = M3_MX_ZERO_BYTE0;
    p.block = 32;
    p.ovf = M3_FP8_SATURATE;
    p.high_even_nibble = false;
    return p;
}

M3_HD M3_INLINE bool m3_mx_elem_is_fp4(m3_mx_elem e) { return e == M3_MX_E2M1; }
/* the fp8 kind of an fp8 element type (undefined for e2m1) */
M3_HD M3_INLINE m3_fp8_kind m3_mx_elem_fp8_kind(m3_mx_elem e) {
    return e == M3_MX_E4M3FN ? M3_FP8_E4M3FN : (e == M3_MX_E4M3FNUZ ? M3_FP8_E4M3FNUZ : M3_FP8_E5M2);
}
/* emax_elem: exponent of the largest power of two <= the element max */
M3_HD M3_INLINE int m3_mx_elem_emax(m3_mx_elem e) {
    return e == M3_MX_E2M1 ? 2 : (e == M3_MX_E4M3FN ? 8 : (e == M3_MX_E4M3FNUZ ? 7 : 15));
}
M3_HD M3_INLINE float m3_mx_elem_max(m3_mx_elem e) {
    return e == M3_MX_E2M1 ? 6.0f : m3_fp8_max(m3_mx_elem_fp8_kind(e));
}
M3_HD M3_INLINE int m3_mx_elem_mbits(m3_mx_elem e) {
    return e == M3_MX_E2M1 ? 1 : m3_fp8_mbits(m3_mx_elem_fp8_kind(e));
}

/* ---- scale rules ----------------------------------------------------------------------- */

/* Scale byte for a block whose max |x| is amax (amax >= 0, or NaN/inf for a poisoned block). */
M3_HD M3_INLINE m3_e8m0 m3_mx_scale_byte(float amax, const m3_mx_params *p) {
    uint32_t a = m3_f32_bits(amax) & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) return 0xFFu;
    if (a == 0) return p->zero == M3_MX_ZERO_MIN_NORMAL ? (m3_e8m0)1u : (m3_e8m0)0u;
    int emax = m3_mx_elem_emax(p->elem), k;
    if (p->scale == M3_MX_SCALE_FLOOR) {
        k = (int)(a >> 23) - 127 - emax; /* subnormal amax: -127 - emax, clamped below */
    } else if (p->scale == M3_MX_SCALE_EVEN) {
        uint32_t add = 1u << (22 - m3_mx_elem_mbits(p->elem));
        k = (int)(((a + add) & 0xFF800000u) >> 23) - 127 - emax;
    } else { /* RCEIL: amax = sa * 2^ea, max = sm * 2^em, sa and sm 24-bit significands */
        uint32_t mb = m3_f32_bits(m3_mx_elem_max(p->elem));
        uint32_t sa = (a & 0x007FFFFFu) | 0x00800000u, sm = (mb & 0x007FFFFFu) | 0x00800000u;
        if ((a >> 23) == 0) return 0; /* subnormal amax: k <= -128, clamps to -127 */
        /* amax/max = (sa/sm) * 2^(ea-em), sa/sm in (1/2, 2): ceil(log2) gains 1 iff sa > sm */
        k = ((int)(a >> 23) - (int)(mb >> 23)) + (sa > sm ? 1 : 0);
    }
    return m3_e8m0_from_exp(k);
}

/* Scale byte of the block x[0..n): NaN/inf anywhere -> 0xFF; otherwise m3_mx_scale_byte(amax). */
M3_HD M3_INLINE m3_e8m0 m3_mx_block_scale(const float *x, int n, const m3_mx_params *p) {
    uint32_t amax = 0;
    for (int i = 0; i < n; i++) {
        uint32_t a = m3_f32_bits(x[i]) & 0x7FFFFFFFu;
        if (a >= 0x7F800000u) return 0xFFu;
        if (a > amax) amax = a; /* non-negative floats order like their bit patterns */
    }
    return m3_mx_scale_byte(m3_bits_f32(amax), p);
}

/* ---- elements -------------------------------------------------------------------------- */

/* Element code of v (already divided by the scale). e2m1: 4-bit code; fp8: the byte. */
M3_HD M3_INLINE uint8_t m3_mx_elem_encode(float v, const m3_mx_params *p) {
    m3_round r = p->round == M3_MX_ROUND_RNA ? M3_ROUND_RNA : M3_ROUND_RNE;
    if (m3_mx_elem_is_fp4(p->elem)) return m3_f32_to_fp4(v, r);
    return m3_f32_to_fp8_r(v, m3_mx_elem_fp8_kind(p->elem), p->ovf, r);
}

M3_HD M3_INLINE float m3_mx_elem_decode(uint8_t code, m3_mx_elem e) {
    if (m3_mx_elem_is_fp4(e)) return m3_fp4_to_f32(code);
    return m3_fp8_to_f32(code, m3_mx_elem_fp8_kind(e));
}

/* Element code of x under scale byte b (the quantize step once the scale is known).
 * b == 0xFF (poisoned block) gives code 0. */
M3_HD M3_INLINE uint8_t m3_mx_encode(float x, m3_e8m0 b, const m3_mx_params *p) {
    if (b == 0xFFu) return 0;
    return m3_mx_elem_encode(x * m3_pow2f(127 - (int)b), p); /* x / 2^(b-127), 2^-k normal */
}

/* Dequantized value of one element: exact. */
M3_HD M3_INLINE float m3_mx_decode(uint8_t code, m3_e8m0 b, m3_mx_elem e) {
    return m3_mx_elem_decode(code, e) * m3_e8m0_to_f32(b);
}

/* ---- one block ------------------------------------------------------------------------- */

/* Quantize x[0..n) (1 <= n; n = p->block except for a row's last block): codes[i] gets one
 * unpacked code per element (e2m1 in the low 4 bits). Returns the scale byte. */
M3_HD M3_INLINE m3_e8m0 m3_mx_quantize_block(uint8_t *M3_RESTRICT codes, const float *M3_RESTRICT x,
                                             int n, const m3_mx_params *p) {
    m3_e8m0 b = m3_mx_block_scale(x, n, p);
    for (int i = 0; i < n; i++) codes[i] = m3_mx_encode(x[i], b, p);
    return b;
}

M3_HD M3_INLINE void m3_mx_dequantize_block(float *M3_RESTRICT y, const uint8_t *M3_RESTRICT codes,
                                            m3_e8m0 b, int n, const m3_mx_params *p) {
    for (int i = 0; i < n; i++) y[i] = m3_mx_decode(codes[i], b, p->elem);
}

#endif
