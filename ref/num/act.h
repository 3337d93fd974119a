/* ref/num/act.h: scalar activations shared by the reference and device code (C11 and
 * HIP/CUDA device code alike: static inline, no VLAs, no designated initializers).
 *
 * sigmoid(x) = 1 / (1 + exp(-x)) in fp32 (the formula torch uses; libm expf: host and
 * device differ by <= 1-2 ulp, accepted and noted in docs/numerics.md §3.13).
 *
 * swiglu_oai (spec m3-numerics.md §3.13), with alpha = 1.702, limit = 7.0, beta = 1.0:
 *   g' = min(g, limit)            gate clamped ABOVE only
 *   u' = clamp(u, -limit, limit)  up clamped both sides
 *   a  = (u' + 1) * (g' * sigmoid(alpha * g'))
 * Clamps keep NaN (comparisons, not fminf, which would turn NaN into the limit).
 * Three rounding variants: m3_swiglu_oai (fp32 op by op), m3_swiglu_oai_bf16ops (hf: every
 * torch op rounded to bf16: t1 = bf16(g'a), t2 = bf16(sig(t1)), t3 = bf16(g' t2),
 * t4 = bf16(u'+1), a = bf16(t4 t3)); the atom variant is bf16(m3_swiglu_oai(...)).
 * In the hf variant g and u are already bf16 (GEMM outputs); the clamps are exact. */
#ifndef M3_NUM_ACT_H
#define M3_NUM_ACT_H

#include <math.h>

#include "ref/num/bf16.h"
#include "ref/num/num.h"

M3_HD M3_INLINE float m3_sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

M3_HD M3_INLINE float m3_clamp_hi(float x, float hi) { return x > hi ? hi : x; }
M3_HD M3_INLINE float m3_clamp_lo(float x, float lo) { return x < lo ? lo : x; }

M3_HD M3_INLINE float m3_swiglu_oai(float g, float u, float alpha, float limit) {
    float gc = m3_clamp_hi(g, limit);
    float uc = m3_clamp_lo(m3_clamp_hi(u, limit), -limit);
    float glu = gc * m3_sigmoidf(gc * alpha);
    return (uc + 1.0f) * glu;
}

M3_HD M3_INLINE float m3_swiglu_oai_bf16ops(float g, float u, float alpha, float limit) {
    float gc = m3_clamp_hi(g, limit);
    float uc = m3_clamp_lo(m3_clamp_hi(u, limit), -limit);
    float t1 = m3_round_bf16(gc * alpha);
    float t2 = m3_round_bf16(m3_sigmoidf(t1));
    float t3 = m3_round_bf16(gc * t2);
    float t4 = m3_round_bf16(uc + 1.0f);
    return m3_round_bf16(t4 * t3);
}

#endif
