/* ref/num/round.h: the one rounding routine behind every narrow float format (fp16, the
 * fp8 kinds, e2m1), plus exact powers of two. Integer-only, so host and device agree bit for
 * bit and no FTZ/DAZ mode can change a result (spec m3-numerics.md §5.2, §5.4).
 *
 * A "minifloat grid" is described by two numbers:
 *   mbits  stored mantissa bits (fp16 10, e4m3 3, e5m2 2, e2m1 1);
 *   emin   exponent of the smallest normal (1 - bias: fp16 -14, e4m3fn -6, e4m3fnuz -7,
 *          e5m2 -14, e2m1 0).
 * Its non-negative values, in increasing order, are numbered by the *magnitude code*
 *   c = (F << mbits) | m,   F = exponent field (0 = subnormal), m = mantissa field,
 *   value(c) = m * 2^(emin - mbits)                      if F == 0,
 *            = (2^mbits + m) * 2^(emin + F - 1 - mbits)  otherwise.
 * Consecutive codes are consecutive values, so rounding is "find the integer code", and a
 * carry out of the mantissa moves to the next binade by itself. The grid here has no top:
 * the caller compares c with its format's largest finite code and applies its own overflow
 * policy (saturate / NaN / inf). The code of the value just above the max therefore tells
 * which way the tie at the overflow boundary goes (e4m3fn: 464 -> 448, §5.2). */
#ifndef M3_NUM_ROUND_H
#define M3_NUM_ROUND_H

#include "ref/num/num.h"

/* Rounding of a value to the nearest grid point: only the tie rule differs. */
typedef enum m3_round {
    M3_ROUND_RNE = 0, /* ties to the even code (IEEE default, hardware cvt) */
    M3_ROUND_RNA = 1  /* ties away from zero (Quark / microxcaling MX elements, §5.4) */
} m3_round;

/* 2^k as binary32, built from bits (no ldexpf): k in [-149, 127]; 2^-149..2^-127 are
 * subnormals and are returned as such, never flushed. */
M3_HD M3_INLINE float m3_pow2f(int k) {
    if (k >= -126) return m3_bits_f32((uint32_t)(k + 127) << 23);
    return m3_bits_f32(1u << (k + 149));
}

/* Magnitude code of |f| rounded to the grid (mbits, emin) with rule r. f must be finite
 * (callers handle NaN/inf first). Preconditions: 0 <= mbits <= 22, emin >= -126.
 * Exact: |f| = sig * 2^x with a 24-bit integer sig, the grid quantum at |f| is
 * 2^(max(floor(log2|f|), emin) - mbits), and the quotient is rounded with an integer
 * remainder compare. The shift is always >= 23 - mbits > 0 under the preconditions. */
M3_HD M3_INLINE uint32_t m3_round_mag_code(float f, int mbits, int emin, m3_round r) {
    uint32_t u = m3_f32_bits(f) & 0x7FFFFFFFu;
    uint32_t e32 = u >> 23;
    uint32_t sig = e32 ? ((u & 0x007FFFFFu) | 0x00800000u) : u;
    int x = e32 ? (int)e32 - 150 : -149;       /* |f| = sig * 2^x */
    int e = e32 ? (int)e32 - 127 : -127;       /* floor(log2|f|), or below every emin */
    if (e < emin) e = emin;                    /* subnormal range of the target grid */
    int shift = (e - mbits) - x;               /* quantum 2^(e-mbits) over 2^x */
    uint32_t n;
    if (shift >= 25) {
        n = 0; /* sig < 2^24 <= half a quantum: rounds to 0 under either tie rule */
    } else {
        uint32_t rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
        n = sig >> shift;
        if (rem > half || (rem == half && (r == M3_ROUND_RNA || (n & 1u)))) n++;
    }
    return n + ((uint32_t)(e - emin) << mbits);
}

/* Value of magnitude code c on the grid (mbits, emin); exact (a small integer times an
 * exact power of two). Valid while the value is below 2^128. */
M3_HD M3_INLINE float m3_mag_code_value(uint32_t c, int mbits, int emin) {
    uint32_t F = c >> mbits, m = c & ((1u << mbits) - 1u);
    if (F == 0) return (float)m * m3_pow2f(emin - mbits);
    return (float)(m | (1u << mbits)) * m3_pow2f(emin + (int)F - 1 - mbits);
}

#endif
