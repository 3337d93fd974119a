/* ref/num/fp8.h: the three fp8 element types <-> binary32 (spec m3-numerics.md §5.2, §5.8).
 *
 *   kind        exp/man  bias  max finite    min normal  min subnormal  NaN           inf        -0
 *   e4m3fn      4/3      7     448   (0x7E)  2^-6        2^-9           0x7F, 0xFF    none       0x80
 *   e4m3fnuz    4/3      8     240   (0x7F)  2^-7        2^-10          0x80 only     none       none
 *   e5m2        5/2      15    57344 (0x7B)  2^-14       2^-16          exp 31, m!=0  0x7C/0xFC  0x80
 *
 * Decode is exact for every code. Encode rounds |f| on the format's grid (ref/num/round.h)
 * with the tie rule given (RNE unless asked), including subnormals; results below half the
 * smallest subnormal become zero with the input's sign where the format has -0 (e4m3fn,
 * e5m2); e4m3fnuz has no -0, so -0 and every negative that rounds to 0 give 0x00.
 * Overflow: a value whose rounded code lies past the max finite code (the tie at the
 * boundary is decided by the rounding rule on the unbounded grid: RNE sends e4m3fn's 464 to
 * 448 because 448's mantissa is even, but sends e4m3fnuz's 248 and e5m2's 61440 upward
 * because 240 and 57344 have odd mantissas) follows the policy m3_fp8_overflow:
 *   M3_FP8_SATURATE  -> +-max finite (PyTorch CUDA, OCP MX elements);
 *   M3_FP8_OVF_NAN   -> the NaN code for e4m3fn (s|0x7F) and e4m3fnuz (0x80), and +-inf
 *                       (s|0x7C) for e5m2, which has inf (ml_dtypes' non-saturating cast).
 * Inf inputs follow the same policy as overflow. NaN inputs give the canonical NaN code:
 * s|0x7F (e4m3fn), 0x80 (e4m3fnuz), s|0x7E (e5m2, the top byte of fp16's quiet NaN).
 * Decoded NaNs are quiet binary32 NaNs carrying the code's sign. */
#ifndef M3_NUM_FP8_H
#define M3_NUM_FP8_H

#include <stdbool.h>

#include "ref/num/num.h"
#include "ref/num/round.h"

typedef enum m3_fp8_kind { M3_FP8_E4M3FN = 0, M3_FP8_E4M3FNUZ = 1, M3_FP8_E5M2 = 2 } m3_fp8_kind;

/* §5.8, parameter fp8_overflow = saturate | nan. */
typedef enum m3_fp8_overflow { M3_FP8_SATURATE = 0, M3_FP8_OVF_NAN = 1 } m3_fp8_overflow;

M3_HD M3_INLINE int m3_fp8_mbits(m3_fp8_kind k) { return k == M3_FP8_E5M2 ? 2 : 3; }
/* exponent of the smallest normal, 1 - bias */
M3_HD M3_INLINE int m3_fp8_emin(m3_fp8_kind k) {
    return k == M3_FP8_E4M3FN ? -6 : (k == M3_FP8_E4M3FNUZ ? -7 : -14);
}
/* largest finite magnitude code (sign bit clear) */
M3_HD M3_INLINE uint32_t m3_fp8_max_code(m3_fp8_kind k) {
    return k == M3_FP8_E4M3FN ? 0x7Eu : (k == M3_FP8_E4M3FNUZ ? 0x7Fu : 0x7Bu);
}
/* FP8_MAX: 448 / 240 / 57344 */
M3_HD M3_INLINE float m3_fp8_max(m3_fp8_kind k) {
    return k == M3_FP8_E4M3FN ? 448.0f : (k == M3_FP8_E4M3FNUZ ? 240.0f : 57344.0f);
}

M3_HD M3_INLINE bool m3_fp8_is_nan(m3_fp8 c, m3_fp8_kind k) {
    if (k == M3_FP8_E4M3FN) return (c & 0x7Fu) == 0x7Fu;
    if (k == M3_FP8_E4M3FNUZ) return c == 0x80u;
    return (c & 0x7Fu) > 0x7Cu;
}

/* The canonical NaN code of kind k with sign bit s (0 or 0x80; fnuz has one NaN). */
M3_HD M3_INLINE m3_fp8 m3_fp8_nan(m3_fp8_kind k, uint32_t s) {
    if (k == M3_FP8_E4M3FNUZ) return 0x80u;
    return (m3_fp8)(s | (k == M3_FP8_E4M3FN ? 0x7Fu : 0x7Eu));
}

M3_HD M3_INLINE float m3_fp8_to_f32(m3_fp8 c, m3_fp8_kind k) {
    uint32_t s = (uint32_t)(c & 0x80u) << 24, mag = c & 0x7Fu;
    if (m3_fp8_is_nan(c, k)) return m3_bits_f32(s | 0x7FC00000u);
    if (k == M3_FP8_E5M2 && mag == 0x7Cu) return m3_bits_f32(s | 0x7F800000u);
    return m3_bits_f32(s | m3_f32_bits(m3_mag_code_value(mag, m3_fp8_mbits(k), m3_fp8_emin(k))));
}

/* fp32 -> fp8 with an explicit tie rule (the MX path needs RNA too). */
M3_HD M3_INLINE m3_fp8 m3_f32_to_fp8_r(float f, m3_fp8_kind k, m3_fp8_overflow ovf, m3_round r) {
    uint32_t u = m3_f32_bits(f), s = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return m3_fp8_nan(k, s);
    uint32_t c = a == 0x7F800000u ? 0xFFFFFFFFu /* inf: past every max */
                                  : m3_round_mag_code(f, m3_fp8_mbits(k), m3_fp8_emin(k), r);
    if (c > m3_fp8_max_code(k)) {
        if (ovf == M3_FP8_SATURATE) return (m3_fp8)(s | m3_fp8_max_code(k));
        return k == M3_FP8_E5M2 ? (m3_fp8)(s | 0x7Cu) : m3_fp8_nan(k, s);
    }
    if (k == M3_FP8_E4M3FNUZ && c == 0) return 0x00u; /* no -0 in fnuz */
    return (m3_fp8)(s | c);
}

/* fp32 -> fp8, round to nearest even: what every fp8 cast in the spec means (cvt_fp8). */
M3_HD M3_INLINE m3_fp8 m3_f32_to_fp8(float f, m3_fp8_kind k, m3_fp8_overflow ovf) {
    return m3_f32_to_fp8_r(f, k, ovf, M3_ROUND_RNE);
}

/* The value of f after a round trip through fp8 kind k. */
M3_HD M3_INLINE float m3_round_fp8(float f, m3_fp8_kind k, m3_fp8_overflow ovf) {
    return m3_fp8_to_f32(m3_f32_to_fp8(f, k, ovf), k);
}

#endif
