/* gpu/mem16.h: 16-byte global loads and stores with cache hints, and raw <-> float conversion
 * of one 16-byte chunk, for the memory-bound element-wise kernels (gpu/norm.hip, gpu/mlp.hip,
 * gpu/copy.hip). Include after gpu/hip_compat.h and gpu/gpu_internal.h.
 *
 * m3_ld16_ro(p): a chunk that nothing writes while the kernel runs (never an output's bytes):
 *   NVIDIA ld.global.nc.L1::no_allocate (read-only path, no L1 line kept: each byte is read
 *   once). m3_ld16(p): plain load, for data the kernel itself writes back (in-place rows).
 * m3_st16_cs(p, v): streaming store (st.global.cs: evict-first, the output is not re-read by
 *   this kernel). m3_st16(p, v): plain store.
 * AMD (and any host pass): plain loads and stores; the hints only change caching, never
 * values, so both vendors compute the same bytes.
 * m3_unpack16<TS>(u, v) / m3_pack16<TS>(v): the conversions of m3_vec<TS>::load/store (bf16
 * widened exactly; stored RNE through ref/num/bf16.h) on a chunk already in registers. */
#ifndef M3_GPU_MEM16_H
#define M3_GPU_MEM16_H

/* The element-wise kernels' variant (gpu/copy.hip): 0 = the plain kernels (a test hook),
 * -1 = the fast path (the default). */
int m3_elem_variant(void);

#if defined(__CUDACC__) || defined(__HIPCC__)
#include "ref/num/bf16.h"

static __device__ __forceinline__ uint4 m3_ld16(const void *p) {
    return *reinterpret_cast<const uint4 *>(p);
}
static __device__ __forceinline__ void m3_st16(void *p, uint4 v) {
    *reinterpret_cast<uint4 *>(p) = v;
}

#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__)
/* not volatile: a pure read of memory nothing writes during the kernel, so the compiler may
 * schedule it freely (e.g. ahead of an unrelated store) */
static __device__ __forceinline__ uint4 m3_ld16_ro(const void *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
static __device__ __forceinline__ void m3_st16_cs(void *p, uint4 v) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}
#else
static __device__ __forceinline__ uint4 m3_ld16_ro(const void *p) { return m3_ld16(p); }
static __device__ __forceinline__ void m3_st16_cs(void *p, uint4 v) { m3_st16(p, v); }
#endif

/* m3_pack16_bf16_hw(v): m3_pack16<m3_bf16>(v) through the hardware's round-to-nearest-even
 * conversion (NVIDIA sm_80+ cvt.rn.bf16x2.f32, two values an instruction), the same bits for
 * every non-NaN value (finite, subnormal, overflow to inf); the hardware writes a canonical
 * NaN where ref/num/bf16.h keeps the sign and payload, so a chunk holding a NaN takes the
 * exact software pack. Elsewhere: the software pack. */
static __device__ __forceinline__ uint4 m3_pack16_bf16_hw(const float *v);

template <typename TS> struct m3_chunk;
template <> struct m3_chunk<float> {
    enum { N = 4 };
};
template <> struct m3_chunk<m3_bf16> {
    enum { N = 8 };
};

template <typename TS> static __device__ __forceinline__ void m3_unpack16(uint4 u, float *v);
template <> __device__ __forceinline__ void m3_unpack16<float>(uint4 u, float *v) {
    v[0] = m3_bits_f32(u.x), v[1] = m3_bits_f32(u.y), v[2] = m3_bits_f32(u.z),
    v[3] = m3_bits_f32(u.w);
}
template <> __device__ __forceinline__ void m3_unpack16<m3_bf16>(uint4 u, float *v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) { /* little-endian: element 2k in the low half */
        v[2 * k] = m3_bits_f32(w[k] << 16);
        v[2 * k + 1] = m3_bits_f32(w[k] & 0xFFFF0000u);
    }
}

template <typename TS> static __device__ __forceinline__ uint4 m3_pack16(const float *v);
template <> __device__ __forceinline__ uint4 m3_pack16<float>(const float *v) {
    return make_uint4(m3_f32_bits(v[0]), m3_f32_bits(v[1]), m3_f32_bits(v[2]), m3_f32_bits(v[3]));
}
template <> __device__ __forceinline__ uint4 m3_pack16<m3_bf16>(const float *v) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        w[k] = (uint32_t)m3_f32_to_bf16(v[2 * k]) | ((uint32_t)m3_f32_to_bf16(v[2 * k + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

static __device__ __forceinline__ uint4 m3_pack16_bf16_hw(const float *v) {
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    bool nan = false;
#pragma unroll
    for (int k = 0; k < 8; k++) nan |= v[k] != v[k];
    if (__builtin_expect(nan, 0)) return m3_pack16<m3_bf16>(v);
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) /* first operand -> high half */
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[k]) : "f"(v[2 * k + 1]), "f"(v[2 * k]));
    return make_uint4(w[0], w[1], w[2], w[3]);
#else
    return m3_pack16<m3_bf16>(v);
#endif
}
#endif

#endif
