/* ref/attn.h: causal GQA attention over a K/V history, dense (spec §3.7) and block-sparse
 * given selected key blocks (§3.10). Prefill and decode share the code: queries at absolute
 * positions pos[t] attend to the keys 0..pos[t] of the history.
 *
 * Math: for query head j (kv head g = j / (H/Hkv)) of token t at position p, over the key
 *   set K_t (dense: all k <= p; sparse: the keys of the selected blocks b < b_p plus the keys
 *   of the own block b_p = p/Bs at positions <= p):
 *     z_k = (q . K_k) * s;  P = softmax(z) (max subtracted, fp32);  o = sum_k P_k V_k.
 * Shapes: q [T, H*Dh] (row pitch ld_q: a slice of the packed qkv row works),
 *   k, v [S_k, Hkv, Dh] contiguous (S_k = n_ctx, cache plus current; pos[t] < n_ctx),
 *   out [T, H*Dh] (heads concatenated in head order), topk [Hkv, T, width] int32.
 * Numerics (fp32 unless the profile says): q.k with m3_dot_f32 (fixed 8-lane order);
 *   scores: fp32 z = f32(dot)*s, or hf eager bf16(bf16(dot)*s); max and denominator over
 *   the key set in accumulation order, e_k = expf(z_k - max), den = sum e_k (fp32, in order),
 *   P_k = e_k/den (bf16(P_k) when attn_p_bf16); o[d] = sum_k P_k V_k[d] in fp32 in key order,
 *   bf16(o) when attn_out_bf16. Key order: position order; sparse with
 *   M3_ATTN_ORDER_SELECTION: full blocks in selection order, own block last (atom).
 *   attn_partition > 0 (atom): per partition of that many keys (in accumulation order)
 *   m_j, l_j = sum exp(z - m_j), o_j = bf16(sum P V / l_j); merged with fp32 weights
 *   w_j = l_j exp(m_j - M): o = bf16(sum_j w_j o_j / sum_j w_j).
 *   Masked keys contribute nothing (HF's additive finfo.min mask gives P = 0 exactly).
 * Threads: over (token, head) rows only; every reduction stays in one thread, so results
 *   are bit-identical for any thread count.
 * docs/numerics.md §3.7, §3.10. */
#ifndef M3_ATTN_H
#define M3_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"
#include "ref/kvcache.h"
#include "ref/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct m3_attn_params {
    int n_head;    /* H   (64) */
    int n_kv_head; /* Hkv (4); H % Hkv == 0 */
    int head_dim;  /* Dh  (128) */
    float scale;   /* s = Dh^-1/2 as fp32 (0.0883883476f) */
} m3_attn_params;

/* Fill params with scale = f32(1/sqrt(head_dim)). */
void m3_attn_params_init(m3_attn_params *ap, int n_head, int n_kv_head, int head_dim);

#define M3_ATTN_MIN_PART 64 /* smallest profile attn_partition accepted (asserted) */

/* Scratch for one call: m3_threads() row slots of O(n_ctx + head_dim) floats each. A call
 * given fewer bytes uses as many slots as fit (at least one slot must fit: asserted). */
size_t m3_attn_scratch_bytes(int n_ctx, const m3_attn_params *ap);

/* Dense causal GQA attention: key set = 0..pos[t]. */
void m3_attn_dense(float *out, const float *q, int ld_q, const float *k, const float *v,
                   const int32_t *pos, int n_tok, int n_ctx, const m3_attn_params *ap,
                   const m3_profile *p, void *scratch, size_t scratch_bytes);

/* Block-sparse causal GQA attention. topk [Hkv, T, width]: block ids selected by index
 * head g = kv head g for token t (m3_indexer_topk's output); -1 and ids > b_p are ignored,
 * duplicates are counted once, the own block b_p is always included (even if absent).
 * block = Bs (128). */
void m3_attn_sparse(float *out, const float *q, int ld_q, const float *k, const float *v,
                    const int32_t *pos, int n_tok, int n_ctx, const int32_t *topk, int width,
                    int block, const m3_attn_params *ap, const m3_profile *p, void *scratch,
                    size_t scratch_bytes);

/* ---- paged reads (spec §4, docs/caches.md) ------------------------------------------------- */

/* Where a paged attention reads its keys: one layer's paged storage (its view decides the
 * addressing: page-Bs for dense layers, page-P for sparse ones) and the sequence's block
 * table. fp8_pa: with fp8 elements, emulate the fp8 paged-attention kernel (§4.9: Q cast to
 * fp8 without a scale, the K scale folded into the score, the P.V rescale per tile of keys,
 * tile = the view's page); otherwise fp8 elements are dequantized on read (fp32(byte)*scale)
 * and the usual math runs. ovf: the fp8 overflow policy of those casts. */
typedef struct m3_attn_paged_src {
    const m3_kv_layer *kl;
    const m3_block_table *bt;
    bool fp8_pa;
    m3_fp8_overflow ovf;
} m3_attn_paged_src;

/* Scratch for m3_attn_paged: as m3_attn_scratch_bytes plus the gathered rows of a slot. */
size_t m3_attn_paged_scratch_bytes(int n_ctx, int width, const m3_attn_params *ap,
                                   const m3_kv_geom *g);

/* Causal GQA attention reading K/V through the paged cache. topk == NULL: dense, keys
 * 0..pos[t] at slot(k) (page-Bs view). Otherwise sparse: per (token, kv head) the selected
 * blocks are expanded by m3_kv_sparse_table (full blocks in selection order, or ascending
 * ids under M3_ATTN_ORDER_POSITION; own block last; ctx truncation) and the keys k < ctx
 * are read through the page-P view. With bf16 / fp32 elements the result is bit-identical
 * to m3_attn_dense / m3_attn_sparse over the same values (same key order, same math). */
void m3_attn_paged(float *out, const float *q, int ld_q, const m3_attn_paged_src *src,
                   const int32_t *pos, int n_tok, int n_ctx, const int32_t *topk, int width,
                   const m3_attn_params *ap, const m3_profile *p, void *scratch,
                   size_t scratch_bytes);

#ifdef __cplusplus
}
#endif
#endif
