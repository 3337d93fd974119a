/* ref/num/bf16.h: bfloat16 <-> binary32, bit-identical on host and device.
 * fp32 -> bf16 rounds to nearest, ties to even, on bit 16 (add 0x7FFF + bit16, truncate);
 * overflow goes to +-inf through that same carry; NaN stays NaN with the quiet bit set
 * (spec m3-numerics.md §5.1). bf16 -> fp32 is exact (shift left 16). */
#ifndef M3_NUM_BF16_H
#define M3_NUM_BF16_H

#include "ref/num/num.h"

M3_HD M3_INLINE float m3_bf16_to_f32(m3_bf16 h) { return m3_bits_f32((uint32_t)h << 16); }

M3_HD M3_INLINE m3_bf16 m3_f32_to_bf16(float f) {
    uint32_t u = m3_f32_bits(f);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) /* NaN: keep sign, force quiet */
        return (m3_bf16)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (m3_bf16)(u >> 16);
}

/* The value of f after a round trip through bf16: how a profile "rounds to bf16". */
M3_HD M3_INLINE float m3_round_bf16(float f) { return m3_bf16_to_f32(m3_f32_to_bf16(f)); }

#endif
