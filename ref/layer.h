/* ref/layer.h: one MiniMax-M3 decoder layer: the wiring of the components (spec §3),
 * its KV / index cache, its dump taps and its teacher-forcing points.
 *
 * Math (spec §3, HF MiniMaxM3VLDecoderLayer):
 *     s  = x_L (+ h, the previous layer's pending MLP output)     stage input   = x_L
 *     a  = o_proj(Attn(Norm_in(s)))                               attn_norm .. attn_proj
 *     m  = s + a;  f = FFN(Norm_post(m))                          mlp_norm .. mlp_out
 *     x_{L+1} = m + f                                             stage output
 *   Attn: q/k/v projections; per-head Gemma norm + partial NeoX RoPE on q and k; v as is;
 *   sparse layers add the indexer (index_q/index_k norm + RoPE, block-max scores, top-k
 *   blocks) and attend over the selected blocks only; dense layers attend causally.
 *   FFN: dense swiglu_oai MLP, or MoE (sigmoid router with selection bias, top-k experts,
 *   renormalised weights, x routed_scaling_factor) plus the shared expert.
 * Why the residual is handed over as (x, h): the sum m + f is what the NEXT norm reads. In
 *   the fp32 and hf profiles the norm reads the stored sum (fp32 / bf16); in atom it reads
 *   the unrounded fp32 sum while storing bf16 (spec §3.2, §9.2). Keeping f pending until
 *   the next m3_rmsnorm_add serves all three with one code path. The dump stage `output`
 *   is the stored sum (m3_residual_add), identical to the next layer's `input`.
 * Shapes (legend): T tokens of this pass, D hidden, H q heads, Hkv kv heads, Dh head dim,
 *   G index heads (= Hkv), Di index head dim, E experts, K experts per token, C cache
 *   capacity. Cache rows are absolute positions: a pass at positions n_past..n_past+T-1
 *   writes rows n_past.. and attends to rows 0..pos.
 * Numerics: every rounding point belongs to the components and the profile (ref/profile.h);
 *   this file adds none. Threads: inside the components only (rows), so a layer's result is
 *   bit-identical for any thread count.
 * docs/numerics.md §3, docs/dumps.md (stages). */
#ifndef M3_LAYER_H
#define M3_LAYER_H

#include <stddef.h>
#include <stdint.h>

#include "ref/attn.h"
#include "ref/base.h"
#include "ref/config.h"
#include "ref/indexer.h"
#include "ref/kvcache.h"
#include "ref/linear.h"
#include "ref/mlp.h"
#include "ref/moe.h"
#include "ref/profile.h"
#include "ref/tap.h"
#include "ref/variant.h"
#include "ref/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Borrowed weights of one layer (views into the checkpoint mapping), plus the few buffers
 * this struct owns when a stored dtype had to be converted (F16 / F32 norm weights to bf16,
 * F16 linears and bf16 routers to fp32). Filled by m3_layer_weights_load, released by
 * m3_layer_weights_free. */
typedef struct m3_layer_weights {
    int layer;
    bool is_sparse, is_moe;
    const m3_bf16 *in_norm, *post_norm;         /* [D] */
    m3_wmat q, k, v, o;                         /* [H*Dh, D], [Hkv*Dh, D] x2, [D, H*Dh] */
    const m3_bf16 *q_norm, *k_norm;             /* [Dh] */
    m3_wmat index_q, index_k;                   /* sparse: [G*Di, D], [Di, D] */
    const m3_bf16 *index_q_norm, *index_k_norm; /* sparse: [Di] */
    m3_mlp_weights mlp;                         /* dense MLP layers */
    m3_moe_weights moe;                         /* MoE layers; moe.experts -> an owned [E] array */
    /* owned */
    int n_owned;
    void *owned[32];
    m3_mlp_weights *experts_owned;
    bool shared_fused;   /* the shared expert runs fused into the routed combine (§3.14) */
    struct m3_qstore *qs; /* owned: quantized forms made for a variant (ref/qload.h); NULL when
                            the variant changes nothing in this layer */
} m3_layer_weights;

/* Views of layer `layer`'s tensors. Nothing is read yet except where a conversion is needed
 * (rare: non-bf16 norms, F16 linears, a bf16-stored router). Missing tensor: M3_ERR_MISSING;
 * an MX-quantized linear: M3_ERR_UNSUPPORTED (quantized experts come with the quant issue). */
m3_status m3_layer_weights_load(m3_layer_weights *lw, m3_weights *w, const m3_config *cfg,
                                int layer);
void m3_layer_weights_free(m3_layer_weights *lw); /* NULL ok; frees owned buffers only */

/* The same under a numerics variant (ref/variant.h, docs/quantization.md): experts
 * (routed + shared) as MXFP4 / MXFP8 (stored or quantized on load) with their activation
 * quantization, the shared-expert fusion (resolved here: shared_fused auto = on under the
 * atom profile when the routed experts are MX), ptpc fp8 of the dense projections. Every
 * decision lands in the weight structs, so m3_layer_forward needs no variant. v NULL =
 * defaults (then equal to m3_layer_weights_load). */
m3_status m3_layer_weights_load_v(m3_layer_weights *lw, m3_weights *w, const m3_config *cfg,
                                  int layer, const m3_variant *v, const m3_profile *p);

/* The top-k of the most recent computing sparse layer of the current pass (spec §3.9: a
 * reusing layer takes it, with the block table and ctx that follow from it). Owned by the
 * model, reset (layer = -1) at the start of every pass; topk is malloc'ed and grown by the
 * computing layer. */
typedef struct m3_topk_share {
    int layer;     /* -1: no sparse layer has computed in this pass yet */
    int n_tok, width;
    int32_t *topk; /* [G, T, width] */
    size_t cap;    /* int32 entries allocated */
} m3_topk_share;

/* A layer's caches. The contiguous arrays always exist; they hold values exactly as
 * attention reads them in the contiguous layout: k after norm + RoPE, v raw, both already
 * rounded by the profile; index_k after its norm + RoPE. With cache_layout paged (spec §4,
 * docs/caches.md) the model also attaches the paged storage, which the layer writes with
 * the writer rules of §4.7 and through which attention reads in decode (dense layers) and in
 * every pass (sparse layers), and the indexer reads its keys. Owned by the model. */
typedef struct m3_layer_cache {
    int cap;        /* C: rows allocated */
    int n_past;     /* rows filled (= next absolute position) */
    float *k, *v;   /* [C, Hkv, Dh] */
    float *index_k; /* [C, Di]; NULL on full-attention layers */
    /* paged caches and top-k reuse (set by the model; all NULL / false = contiguous only) */
    m3_kv_layer *paged;          /* this layer's paged K/V (+ index keys); NULL: contiguous */
    const m3_block_table *bt;    /* the sequence's block table (all layers share it) */
    const m3_variant *variant;   /* fp8 kind, overflow, kv_fp8max, index q rule; NULL: defaults */
    m3_topk_share *share;        /* required on sparse layers when reuse_topk */
    bool reuse_topk;             /* sparse layer that reuses share's top-k (spec §3.9) */
} m3_layer_cache;

/* Grow the cache to hold at least `need` rows (contents kept). M3_ERR_NOMEM on failure. */
m3_status m3_layer_cache_reserve(m3_layer_cache *c, const m3_config *cfg, bool sparse, int need);
void m3_layer_cache_free(m3_layer_cache *c); /* NULL ok */

/* Scratch bytes for m3_layer_forward of layer `layer` over n_tok tokens with a cache of
 * n_ctx = n_past + n_tok rows. */
size_t m3_layer_scratch_bytes(const m3_config *cfg, int layer, int n_tok, int n_ctx);
/* Extra scratch bytes when the layer's cache is paged (add to m3_layer_scratch_bytes). */
size_t m3_layer_paged_scratch_bytes(const m3_config *cfg, int layer, int n_tok, int n_ctx);

/* One layer over a pass of n_tok tokens at positions pos[t] = cache->n_past + t.
 *   x [T, D]  in: the stored residual r entering the layer; out: m = r' + a (see above).
 *   h [T, D]  in: the previous layer's pending FFN output when *h_pending (added to x by the
 *             input norm, which also yields the stage `input`), ignored otherwise;
 *             out: this layer's FFN output f, and *h_pending = true.
 *   Stages are reported through hooks->tap under "<prefix>layers/NN/<stage>" in execution
 *   order (see docs/dumps.md). With hooks->force_selection, index_topk (sparse layers) and
 *   expert_ids (MoE layers) are fetched from hooks->fetch under the same keys; the expert
 *   weights are then our router's weights of the forced experts, renormalised.
 * Caches (docs/caches.md): with cache->paged the layer also writes its K/V (fp8 writer rules
 *   of spec §4.7) and index keys into the paged storage, and reads through it (sparse layers
 *   always, dense layers in decode, T == 1). A sparse layer with cache->reuse_topk skips index
 *   norm / RoPE / insert / scoring and uses cache->share (the last computing sparse layer of
 *   this pass; M3_ERR_ARG when there is none); a computing one records its selection there.
 * On return the cache holds n_past + T rows. Errors: tap/fetch failures, a forced selection
 * of the wrong shape or with ids out of range (M3_ERR_SHAPE / M3_ERR_ARG), a position that
 * is not n_past + t (M3_ERR_ARG). scratch: m3_layer_scratch_bytes(...) bytes, caller-owned. */
m3_status m3_layer_forward(float *x, float *h, bool *h_pending, int n_tok, const int32_t *pos,
                           const m3_layer_weights *w, const m3_config *cfg, const m3_profile *p,
                           m3_layer_cache *cache, const m3_hooks *hooks, const char *prefix,
                           void *scratch, size_t scratch_bytes);

/* What the profile holds a stage in: "bfloat16" or "float32" (the dump's produced_dtype).
 * Stage names as in docs/dumps.md. */
const char *m3_stage_dtype(const m3_profile *p, const char *stage);

#ifdef __cplusplus
}
#endif
#endif
