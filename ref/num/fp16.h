/* ref/num/fp16.h: IEEE binary16 <-> binary32, bit-identical on host and device.
 * binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; max finite 65504 (0x7BFF),
 * min normal 2^-14, min subnormal 2^-24, inf 0x7C00, NaN exp 31 with mantissa != 0.
 * fp32 -> fp16: round to nearest, ties to even, with subnormals (never flushed); values
 * that round above 65504 (i.e. |f| >= 65520, the tie going to the even "next" code) become
 * +-inf; +-inf stay inf; NaN stays NaN: sign kept, quiet bit (0x0200) set, the top 9
 * payload bits kept (like bf16, §5.1). fp16 -> fp32 is exact (every binary16 value is a
 * binary32 value). */
#ifndef M3_NUM_FP16_H
#define M3_NUM_FP16_H

#include "ref/num/num.h"
#include "ref/num/round.h"

M3_HD M3_INLINE float m3_fp16_to_f32(m3_fp16 h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, mag = h & 0x7FFFu;
    if (mag >= 0x7C00u) /* inf or NaN: widen the mantissa, keep the payload */
        return m3_bits_f32(s | 0x7F800000u | ((mag & 0x03FFu) << 13));
    return m3_bits_f32(s | m3_f32_bits(m3_mag_code_value(mag, 10, -14)));
}

M3_HD M3_INLINE m3_fp16 m3_f32_to_fp16(float f) {
    uint32_t u = m3_f32_bits(f), s = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (m3_fp16)(s | 0x7E00u | ((a & 0x007FFFFFu) >> 13)); /* NaN */
    if (a == 0x7F800000u) return (m3_fp16)(s | 0x7C00u);
    uint32_t c = m3_round_mag_code(f, 10, -14, M3_ROUND_RNE);
    return (m3_fp16)(s | (c >= 0x7C00u ? 0x7C00u : c)); /* past 65504 -> inf */
}

/* The value of f after a round trip through binary16. */
M3_HD M3_INLINE float m3_round_fp16(float f) { return m3_fp16_to_f32(m3_f32_to_fp16(f)); }

#endif
