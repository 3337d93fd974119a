/* gpu/kvcache.hip: writing K/V rows into ATOM's paged KV cache (spec §4.1-4.3, §4.7): bf16,
 * or fp8 with one fp32 scale per (token, KV head), in the page-128 SHUFFLE view (dense
 * layers), the page-16 re-view (sparse layers) or plain rows (page 0). Twin: ref/kvcache.c
 * m3_kv_write (K quantized from the values written). Tests: tests/gpu_kvcache.c (every byte
 * of the cache and the scales against the spec's formulas and ref/quant.c's row
 * quantization), tests/gpu_norm_rope.c (through the fused m3_gpu_qk_norm_rope_cache).
 *
 * For a slot s, page P (128 or 16), b = s / P, t = s % P, head h, dim i, x = 16/elem bytes:
 *   K [.., Hkv, Dh/x, P, x]: ((b*Hkv + h)*(Dh/x) + i/x)*(P*x) + t*x + i%x
 *   V [.., Hkv, P/x, Dh, x]: ((b*Hkv + h)*(P/x) + t/x)*(Dh*x) + i*x + t%x
 *   scale [.., Hkv, P]:      (b*Hkv + h)*P + t
 * fp8: amax over the row's (bf16) values, s = amax / fp8_max (fp32 division) or 1 when
 *   amax == 0, a NaN anywhere makes s NaN; byte = m3_f32_to_fp8(v / s) (ref/num/fp8.h).
 *   This is §4.7's rule for V, and for K when K is quantized from its stored bf16 values;
 *   the K writers that quantize the unrounded fp32 k (atom's Triton and aiter writers) are
 *   m3_gpu_qk_norm_rope_cache (gpu/rope.hip), where that k exists.
 * The kernels are gpu/rope.hip's with two un-normed parts (K, V): rows of Dh 128 run kvw_k
 * (bf16; one warp a step: 4 tokens of K, or one 8-token window of V staged in the warp's
 * shared memory) or kvw8_k (fp8; one warp a step of 16 tokens of K, or one 16-token window of
 * V held in registers; passes under 256 tokens kvw8s_k: a step of M3_WARP / 8 tokens of one
 * head, K or V, the V codes stored byte by byte), others the tile kernel qkv_k (rows staged
 * in shared memory);
 * both write 16-byte K chunks and V in 16-byte groups of x slot-consecutive tokens of one dim
 * (its SHUFFLE layout), element by element where a pass's tokens cut a group. ref's paged storage (m3_gpu_kv_cache.paged) needs the positions: refused here, it
 * is m3_gpu_qk_norm_rope_cache's. */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"

/* gpu/rope.hip (internal to gpu/) */
m3_status m3_gpu_kv_write_rows_(m3_gpu *g, const m3_gpu_kv_cache *c, const m3_bf16 *d_k, int ld_k,
                                const m3_bf16 *d_v, int ld_v, const int64_t *d_slots, int n_tok,
                                int n_kv_head, int head_dim);

extern "C" m3_status m3_gpu_kv_cache_write(m3_gpu *g, const m3_gpu_kv_cache *c, const m3_bf16 *d_k,
                                           int ld_k, const m3_bf16 *d_v, int ld_v,
                                           const int64_t *d_slots, int n_tok, int n_kv_head,
                                           int head_dim) {
    M3_ASSERT(g && c && n_tok >= 0 && n_kv_head > 0 && head_dim > 0);
    M3_ASSERTF(ld_k >= n_kv_head * head_dim && ld_v >= n_kv_head * head_dim, "ld_k=%d ld_v=%d",
               ld_k, ld_v);
    M3_ASSERT(d_k && d_v && (d_slots || n_tok == 0));
    return m3_gpu_kv_write_rows_(g, c, d_k, ld_k, d_v, ld_v, d_slots, n_tok, n_kv_head, head_dim);
}
