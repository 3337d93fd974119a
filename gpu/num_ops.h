/* gpu/num_ops.h: the scalar conversions of ref/num/{bf16,fp16,fp8,mx}.h behind one switch,
 * M3_HD so that the SAME source runs on the host (C11) and as device code (gpu/num.hip's
 * m3_gpu_num_sweep). tests/gpu_num.c evaluates it on both sides over a strided sweep of all
 * 2^32 input words plus special values and demands identical bits: that is the check that
 * the shared header code means the same thing under both compilers (integer promotions,
 * shifts, subnormals without flush-to-zero, int <-> float conversions).
 *
 * Input: one 32-bit word u, read as fp32 bits for conversions from fp32, as a code in its
 * low bits for decodes. Output: the result's bits (fp32 bits, or the code zero-extended).
 * param packs the op's options (see each op). Plain C11, no allocation. */
#ifndef M3_GPU_NUM_OPS_H
#define M3_GPU_NUM_OPS_H

#include "ref/num/bf16.h"
#include "ref/num/fp16.h"
#include "ref/num/fp8.h"
#include "ref/num/mx.h"
#include "ref/num/num.h"
#include "ref/num/round.h"

typedef enum m3_num_op {
    M3_NUM_F32_TO_BF16 = 0, /* m3_f32_to_bf16(f) */
    M3_NUM_BF16_TO_F32,     /* m3_bf16_to_f32(u & 0xFFFF) */
    M3_NUM_F32_TO_FP16,     /* m3_f32_to_fp16(f) */
    M3_NUM_FP16_TO_F32,     /* m3_fp16_to_f32(u & 0xFFFF) */
    M3_NUM_F32_TO_FP8,      /* m3_f32_to_fp8_r(f, kind = param & 3, ovf = (param >> 2) & 1,
                               round = (param >> 3) & 1) */
    M3_NUM_FP8_TO_F32,      /* m3_fp8_to_f32(u & 0xFF, kind = param & 3) */
    M3_NUM_F32_TO_FP4,      /* m3_f32_to_fp4(f, round = param & 1) (e2m1) */
    M3_NUM_FP4_TO_F32,      /* m3_fp4_to_f32(u & 0xF) */
    M3_NUM_E8M0_TO_F32,     /* m3_e8m0_to_f32(u & 0xFF) */
    M3_NUM_E8M0_FROM_EXP,   /* m3_e8m0_from_exp((int)(u & 0x3FF) - 512) */
    M3_NUM_MX_SCALE_BYTE,   /* m3_mx_scale_byte(|f|, elem = param & 3, rule = (param >> 2) & 3,
                               zero = (param >> 4) & 1) */
    M3_NUM_MX_ENCODE,       /* m3_mx_encode(f, b = the byte m3_num_mix(u), elem = param & 3,
                               round = (param >> 2) & 1, ovf = (param >> 3) & 1); a NaN f is
                               reported as 0xFFFFFFFF: measured on the H200 (2026-11-29), the
                               NaN's sign does not survive the fp32 multiply by the scale on
                               the device (x86 keeps it), so e2m1/fp8 code s|max differs in s.
                               m3_mx_quantize_block never gets there (a NaN block has scale
                               0xFF and codes 0), so the sweep leaves it out, by name. */
    M3_NUM_MX_DECODE,       /* m3_mx_decode(code = u & 0xFF (e2m1: & 0xF), b = u >> 24,
                               elem = param & 3); a NaN result is reported as 0x7FC00000 (NaN
                               payloads of fp32 arithmetic differ between CPUs and GPUs) */
    M3_NUM_N_OPS
} m3_num_op;

/* A scale byte derived from u that is not simply one of its bytes (so the sweep pairs
 * values with every scale). */
M3_HD M3_INLINE uint32_t m3_num_mix(uint32_t u) {
    return ((u * 2654435761u) >> 24) & 0xFFu;
}

M3_HD M3_INLINE m3_mx_params m3_num_mx_params(int elem) {
    return m3_mx_params_default((m3_mx_elem)(elem & 3));
}

M3_HD M3_INLINE uint32_t m3_num_apply(int op, int param, uint32_t u) {
    const float f = m3_bits_f32(u);
    switch (op) {
    case M3_NUM_F32_TO_BF16: return m3_f32_to_bf16(f);
    case M3_NUM_BF16_TO_F32: return m3_f32_bits(m3_bf16_to_f32((m3_bf16)(u & 0xFFFFu)));
    case M3_NUM_F32_TO_FP16: return m3_f32_to_fp16(f);
    case M3_NUM_FP16_TO_F32: return m3_f32_bits(m3_fp16_to_f32((m3_fp16)(u & 0xFFFFu)));
    case M3_NUM_F32_TO_FP8:
        return m3_f32_to_fp8_r(f, (m3_fp8_kind)(param & 3), (m3_fp8_overflow)((param >> 2) & 1),
                               (m3_round)((param >> 3) & 1));
    case M3_NUM_FP8_TO_F32:
        return m3_f32_bits(m3_fp8_to_f32((m3_fp8)(u & 0xFFu), (m3_fp8_kind)(param & 3)));
    case M3_NUM_F32_TO_FP4: return m3_f32_to_fp4(f, (m3_round)(param & 1));
    case M3_NUM_FP4_TO_F32: return m3_f32_bits(m3_fp4_to_f32((uint8_t)(u & 0xFu)));
    case M3_NUM_E8M0_TO_F32: return m3_f32_bits(m3_e8m0_to_f32((m3_e8m0)(u & 0xFFu)));
    case M3_NUM_E8M0_FROM_EXP: return m3_e8m0_from_exp((int)(u & 0x3FFu) - 512);
    case M3_NUM_MX_SCALE_BYTE: {
        m3_mx_params p = m3_num_mx_params(param);
        p.scale = (m3_mx_scale_rule)((param >> 2) & 3);
        p.zero = (m3_mx_zero_block)((param >> 4) & 1);
        return m3_mx_scale_byte(m3_bits_f32(u & 0x7FFFFFFFu), &p);
    }
    case M3_NUM_MX_ENCODE: {
        m3_mx_params p = m3_num_mx_params(param);
        p.round = (m3_mx_round)((param >> 2) & 1);
        p.ovf = (m3_fp8_overflow)((param >> 3) & 1);
        if (f != f) return 0xFFFFFFFFu; /* see M3_NUM_MX_ENCODE */
        return m3_mx_encode(f, (m3_e8m0)m3_num_mix(u), &p);
    }
    case M3_NUM_MX_DECODE: {
        const m3_mx_elem e = (m3_mx_elem)(param & 3);
        const uint8_t code = (uint8_t)(u & (e == M3_MX_E2M1 ? 0xFu : 0xFFu));
        const float v = m3_mx_decode(code, (m3_e8m0)(u >> 24), e);
        return v != v ? 0x7FC00000u : m3_f32_bits(v);
    }
    default: return 0xDEADBEEFu;
    }
}

#endif
