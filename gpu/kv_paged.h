/* gpu/kv_paged.h: device addressing of ATOM's paged KV cache (spec §4.1-§4.3), the device
 * copy of ref/kvcache.c's m3_kv_off_k / m3_kv_off_v / m3_kv_off_scale (the same formulas,
 * the tiny-geometry padding of ref/kvcache.h included: Dh/x and P/x rounded up, page q of the
 * re-view at (q / (Bs/P)) * block region + (q % (Bs/P)) * page size) and of the element
 * accessors (F32 / BF16 RNE / FP8 of the geometry's kind with the caller's overflow rule).
 * Shared by gpu/attn.hip (m3_gpu_attn_paged reads) and gpu/layer.hip (the paged writer), so
 * reader and writer cannot disagree; tests/gpu_attn_paged.c reads caches that ref wrote.
 * Include after gpu/hip_compat.h. */
#ifndef M3_GPU_KV_PAGED_H
#define M3_GPU_KV_PAGED_H

#include "ref/kvcache.h"
#include "ref/num/bf16.h"
#include "ref/num/fp8.h"

static __device__ __forceinline__ int64_t m3_dkv_cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

static __device__ __forceinline__ int64_t m3_dkv_off_k(const m3_kv_geom &g, m3_kv_view view,
                                                       int64_t slot, int h, int dim) {
    const int x = g.x;
    if (view == M3_KV_VIEW_BLOCK) {
        const int64_t b = slot / g.block, t = slot % g.block;
        return ((b * g.n_kv + h) * g.dx + dim / x) * ((int64_t)g.block * x) + t * x + dim % x;
    }
    const int ppb = g.block / g.page;
    const int64_t q = slot / g.page, t = slot % g.page;
    const int64_t pk = (int64_t)g.n_kv * g.dx * g.page * x;
    return (q / ppb) * g.k_block + (q % ppb) * pk +
           ((int64_t)h * g.dx + dim / x) * ((int64_t)g.page * x) + t * x + dim % x;
}

static __device__ __forceinline__ int64_t m3_dkv_off_v(const m3_kv_geom &g, m3_kv_view view,
                                                       int64_t slot, int h, int dim) {
    const int x = g.x;
    if (view == M3_KV_VIEW_BLOCK) {
        const int64_t b = slot / g.block, t = slot % g.block;
        return b * g.v_stride + ((int64_t)h * m3_dkv_cdiv(g.block, x) + t / x) * ((int64_t)g.head_dim * x) +
               (int64_t)dim * x + t % x;
    }
    const int ppb = g.block / g.page;
    const int64_t q = slot / g.page, t = slot % g.page;
    return (q / ppb) * g.v_stride + (q % ppb) * g.v_page +
           ((int64_t)h * m3_dkv_cdiv(g.page, x) + t / x) * ((int64_t)g.head_dim * x) +
           (int64_t)dim * x + t % x;
}

static __device__ __forceinline__ int64_t m3_dkv_off_scale(const m3_kv_geom &g, m3_kv_view view,
                                                           int64_t slot, int h) {
    const int P = view == M3_KV_VIEW_BLOCK ? g.block : g.page;
    const int64_t q = slot / P, t = slot % P;
    return (q * g.n_kv + h) * P + t;
}

/* the stored element as fp32 (fp8: the code value, NOT scaled) */
static __device__ __forceinline__ float m3_dkv_get(const void *base, const m3_kv_geom &g,
                                                   int64_t off) {
    if (g.elem == M3_KV_F32) return ((const float *)base)[off];
    if (g.elem == M3_KV_BF16) return m3_bf16_to_f32(((const m3_bf16 *)base)[off]);
    return m3_fp8_to_f32(((const uint8_t *)base)[off], g.fp8_kind);
}

static __device__ __forceinline__ void m3_dkv_put(void *base, const m3_kv_geom &g, int64_t off,
                                                  float v, m3_fp8_overflow ovf) {
    if (g.elem == M3_KV_F32) ((float *)base)[off] = v;
    else if (g.elem == M3_KV_BF16) ((m3_bf16 *)base)[off] = m3_f32_to_bf16(v);
    else ((uint8_t *)base)[off] = m3_f32_to_fp8(v, g.fp8_kind, ovf);
}

/* slot(p) = bt[p / Bs] * Bs + p % Bs (§4.1) */
static __device__ __forceinline__ int64_t m3_dkv_slot(const int32_t *bt, int block, int p) {
    return (int64_t)bt[p / block] * block + p % block;
}

#endif
