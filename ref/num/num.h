/* ref/num/num.h: portability macros for the scalar numerics headers, which compile as C11
 * on the host and as HIP/CUDA device code. This is the only compiler test in ref/.
 * Rules for every header under ref/num/: no VLAs, no designated initializers, static inline
 * only, M3_RESTRICT instead of restrict, bit manipulation through memcpy-free unions-free
 * helpers below (m3_f32_bits / m3_bits_f32), libm only where noted. */
#ifndef M3_NUM_H
#define M3_NUM_H

#include <stdint.h>

#if defined(__HIPCC__) || defined(__CUDACC__)
#define M3_HD __host__ __device__
#define M3_DEVICE_CODE 1
#else
#define M3_HD
#endif

#define M3_INLINE static inline
#if defined(__cplusplus)
#define M3_RESTRICT __restrict__
#else
#define M3_RESTRICT restrict
#endif

/* Stored scalar types: plain bit containers, never arithmetic types. */
typedef uint16_t m3_bf16;
typedef uint16_t m3_fp16;
typedef uint8_t m3_fp8;  /* e4m3fn, e4m3fnuz or e5m2: the kind is a parameter */
typedef uint8_t m3_e8m0; /* MX scale */

M3_HD M3_INLINE uint32_t m3_f32_bits(float f) {
#if defined(M3_DEVICE_CODE) && defined(__CUDA_ARCH__)
    return (uint32_t)__float_as_uint(f);
#else
    union { float f; uint32_t u; } c;
    c.f = f;
    return c.u;
#endif
}

M3_HD M3_INLINE float m3_bits_f32(uint32_t u) {
#if defined(M3_DEVICE_CODE) && defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    union { float f; uint32_t u; } c;
    c.u = u;
    return c.f;
#endif
}

#endif
