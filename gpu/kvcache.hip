/* gpu/kvcache.hip: writing K/V rows into ATOM's paged KV cache (spec §4.1-4.3, §4.7): bf16,
 * or fp8 e4m3fn with one fp32 scale per (token, KV head), in the page-128 SHUFFLE view
 * (dense layers) or the page-16 re-view (sparse layers). There is no ref/ twin (the
 * reference keeps plain [S, Hkv, Dh] tensors); the contract is the spec's offset formulas
 * and ref/quant.c's m3_fp8_quantize_rows (DIV, saturate, zero row -> scale 1), which
 * tests/gpu_kvcache.c applies on the host: cache bytes and scales must be identical.
 *
 * For a slot s, page P (128 or 16), b = s / P, t = s % P, head h, dim i, x = 16/elem bytes:
 *   K [.., Hkv, Dh/x, P, x]: ((b*Hkv + h)*(Dh/x) + i/x)*(P*x) + t*x + i%x
 *   V [.., Hkv, P/x, Dh, x]: ((b*Hkv + h)*(P/x) + t/x)*(Dh*x) + i*x + t%x
 *   scale [.., Hkv, P]:      (b*Hkv + h)*P + t
 * fp8: amax over the row's (bf16) values, s = amax / fp8_max (fp32 division) or 1 when
 *   amax == 0, a NaN anywhere makes s NaN; byte = m3_f32_to_fp8(v / s) (ref/num/fp8.h).
 *   This is §4.7's rule for V, and for K when K is quantized from its stored bf16 values;
 *   the K writers that quantize the unrounded fp32 k (Triton dense/reuse writers) need the
 *   fused norm+rope+write, which is not built yet.
 * kv_write_k: one warp per (token, head, K or V) row; lanes over dims. */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "ref/num/bf16.h"
#include "ref/num/fp8.h"

#define KV_THREADS 256

static __global__ void __launch_bounds__(KV_THREADS)
    kv_write_k(void *M3_RESTRICT kc, void *M3_RESTRICT vc, float *M3_RESTRICT ks,
               float *M3_RESTRICT vs, const m3_bf16 *M3_RESTRICT k, int ld_k,
               const m3_bf16 *M3_RESTRICT v, int ld_v, const int64_t *M3_RESTRICT slots, int n_tok,
               int Hkv, int Dh, int page, bool fp8, float fp8_max) {
    const int lane = (int)threadIdx.x % M3_WARP, warp = (int)threadIdx.x / M3_WARP;
    const int64_t row = (int64_t)blockIdx.x * (KV_THREADS / M3_WARP) + warp;
    if (row >= (int64_t)n_tok * Hkv * 2) return; /* whole warp */
    const bool is_v = row % 2 != 0;
    const int64_t th = row / 2;
    const int t = (int)(th / Hkv), h = (int)(th % Hkv);
    const int64_t slot = slots[t];
    if (slot < 0) return; /* padding token: nothing to write */
    const int64_t b = slot / page, tt = slot % page;
    const m3_bf16 *src = (is_v ? v + (int64_t)t * ld_v : k + (int64_t)t * ld_k) + (int64_t)h * Dh;
    const int x = fp8 ? 16 : 8;
    float s = 1.0f;
    if (fp8) { /* amax with NaN sticky, as m3_fp8_quantize_rows */
        float amax = 0.0f, nan = 0.0f;
        for (int i = lane; i < Dh; i += M3_WARP) {
            const float a = fabsf(m3_bf16_to_f32(src[i]));
            if (a != a) nan = 1.0f;
            else amax = fmaxf(amax, a);
        }
        amax = m3_warp_max(amax);
        if (m3_warp_max(nan) > 0.0f) amax = NAN;
        s = amax == 0.0f ? 1.0f : amax / fp8_max;
        if (lane == 0) (is_v ? vs : ks)[(b * Hkv + h) * page + tt] = s;
    }
    for (int i = lane; i < Dh; i += M3_WARP) {
        const int64_t off = is_v ? ((b * Hkv + h) * (page / x) + tt / x) * ((int64_t)Dh * x) + (int64_t)i * x + tt % x
                                 : ((b * Hkv + h) * (Dh / x) + i / x) * ((int64_t)page * x) + tt * x + i % x;
        if (fp8) {
            const float val = m3_bf16_to_f32(src[i]);
            ((m3_fp8 *)(is_v ? vc : kc))[off] = m3_f32_to_fp8(val / s, M3_FP8_E4M3FN, M3_FP8_SATURATE);
        } else {
            ((m3_bf16 *)(is_v ? vc : kc))[off] = src[i];
        }
    }
}

extern "C" m3_status m3_gpu_kv_cache_write(m3_gpu *g, const m3_gpu_kv_cache *c, const m3_bf16 *d_k,
                                           int ld_k, const m3_bf16 *d_v, int ld_v,
                                           const int64_t *d_slots, int n_tok, int n_kv_head,
                                           int head_dim) {
    M3_ASSERT(g && c && n_tok >= 0 && n_kv_head > 0 && head_dim > 0);
    M3_ASSERTF(ld_k >= n_kv_head * head_dim && ld_v >= n_kv_head * head_dim, "ld_k=%d ld_v=%d",
               ld_k, ld_v);
    const int x = c->fp8 ? 16 : 8;
    if ((c->page != 128 && c->page != 16) || head_dim % x)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu kv_cache_write: page %d, head_dim %d (needs page "
                         "128 or 16, head_dim %% %d == 0)", c->page, head_dim, x);
    if (c->fp8 && (!c->k_scale || !c->v_scale || !(c->fp8_max > 0.0f)))
        return m3_errorf(M3_ERR_ARG, "gpu kv_cache_write: fp8 cache without scales or fp8_max");
    M3_ASSERT(c->k && c->v && d_k && d_v && d_slots);
    if (n_tok == 0) return M3_OK;
    const int64_t rows = (int64_t)n_tok * n_kv_head * 2, rpb = KV_THREADS / M3_WARP;
    kv_write_k<<<(unsigned)((rows + rpb - 1) / rpb), KV_THREADS, 0, g->stream>>>(
        c->k, c->v, c->k_scale, c->v_scale, d_k, ld_k, d_v, ld_v, d_slots, n_tok, n_kv_head,
        head_dim, c->page, c->fp8, c->fp8_max);
    M3_LAUNCHED(g, "kv_write_k");
    return M3_OK;
}
