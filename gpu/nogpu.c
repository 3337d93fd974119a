/* gpu/nogpu.c: linked into build/m3 and the CPU tests when they are built without a GPU
 * backend (plain `make`); `make gpu` links the objects of gpu/ (.hip) instead. Every entry
 * point of gpu/m3_gpu.h exists here so callers link either way; m3_gpu_open fails with one
 * clear line, so nothing past it is ever reached with a context. */
#include "gpu/m3_gpu.h"

#define NO_GPU(what) m3_errorf(M3_ERR_UNSUPPORTED, "%s: this m3 was built without a GPU backend (use make gpu)", what)

bool m3_gpu_compiled(void) { return false; }

m3_status m3_gpu_open(m3_gpu **g, int device) {
    (void)device;
    *g = NULL;
    return NO_GPU("--backend gpu");
}

void m3_gpu_close(m3_gpu *g) { (void)g; }
const char *m3_gpu_describe(const m3_gpu *g) { (void)g; return "no GPU backend"; }
int m3_gpu_warp_size(const m3_gpu *g) { (void)g; return 0; }

m3_status m3_gpu_alloc(m3_gpu *g, void **d_p, size_t bytes) {
    (void)g; (void)bytes;
    *d_p = NULL;
    return NO_GPU("gpu alloc");
}
size_t m3_gpu_mark(const m3_gpu *g) { (void)g; return 0; }
void m3_gpu_release(m3_gpu *g, size_t mark) { (void)g; (void)mark; }
size_t m3_gpu_arena_bytes(const m3_gpu *g) { (void)g; return 0; }

m3_status m3_gpu_upload(m3_gpu *g, void *d, const void *h, size_t n) {
    (void)g; (void)d; (void)h; (void)n;
    return NO_GPU("gpu upload");
}
m3_status m3_gpu_download(m3_gpu *g, void *h, const void *d, size_t n) {
    (void)g; (void)d; (void)h; (void)n;
    return NO_GPU("gpu download");
}
m3_status m3_gpu_copy(m3_gpu *g, void *d, const void *s, size_t n) {
    (void)g; (void)d; (void)s; (void)n;
    return NO_GPU("gpu copy");
}
m3_status m3_gpu_memset(m3_gpu *g, void *d, int b, size_t n) {
    (void)g; (void)d; (void)b; (void)n;
    return NO_GPU("gpu memset");
}
m3_status m3_gpu_sync(m3_gpu *g) { (void)g; return NO_GPU("gpu sync"); }
m3_status m3_gpu_timer_start(m3_gpu *g) { (void)g; return NO_GPU("gpu timer"); }
m3_status m3_gpu_timer_stop(m3_gpu *g, float *ms) { (void)g; *ms = 0; return NO_GPU("gpu timer"); }

m3_status m3_gpu_gemm_bf16(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x, const m3_bf16 *d_w,
                           int n_tok, int n_out, int n_in) {
    (void)g; (void)d_y; (void)d_x; (void)d_w; (void)n_tok; (void)n_out; (void)n_in;
    return NO_GPU("gpu gemm");
}
m3_status m3_gpu_gemm_bf16_f32(m3_gpu *g, float *d_y, const m3_bf16 *d_x, const m3_bf16 *d_w,
                               int n_tok, int n_out, int n_in) {
    (void)g; (void)d_y; (void)d_x; (void)d_w; (void)n_tok; (void)n_out; (void)n_in;
    return NO_GPU("gpu gemm");
}

m3_status m3_gpu_f32_to_bf16(m3_gpu *g, m3_bf16 *d_y, const float *d_x, int64_t n) {
    (void)g; (void)d_y; (void)d_x; (void)n;
    return NO_GPU("gpu convert");
}
m3_status m3_gpu_num_sweep(m3_gpu *g, uint32_t *d_out, const uint32_t *d_in, int op, int param,
                           uint32_t start, uint32_t stride, int64_t n) {
    (void)g; (void)d_out; (void)d_in; (void)op; (void)param; (void)start; (void)stride; (void)n;
    return NO_GPU("gpu num sweep");
}
m3_status m3_gpu_fp8_count_nan(m3_gpu *g, const uint8_t *d_codes, int64_t n, m3_fp8_kind kind,
                               int64_t *count) {
    (void)g; (void)d_codes; (void)n; (void)kind;
    if (count) *count = 0;
    return NO_GPU("gpu fp8 NaN count");
}
m3_status m3_gpu_mx_quantize_blocks(m3_gpu *g, uint8_t *d_codes, m3_e8m0 *d_scales, float *d_y,
                                    const float *d_x, int64_t n_blocks,
                                    const struct m3_mx_params *p) {
    (void)g; (void)d_codes; (void)d_scales; (void)d_y; (void)d_x; (void)n_blocks; (void)p;
    return NO_GPU("gpu mx quantize");
}
m3_status m3_gpu_bf16_to_f32(m3_gpu *g, float *d_y, const m3_bf16 *d_x, int64_t n) {
    (void)g; (void)d_y; (void)d_x; (void)n;
    return NO_GPU("gpu convert");
}

m3_status m3_gpu_rmsnorm(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x, const m3_bf16 *d_w,
                         int n_tok, int dim, float eps) {
    (void)g; (void)d_y; (void)d_x; (void)d_w; (void)n_tok; (void)dim; (void)eps;
    return NO_GPU("gpu rmsnorm");
}
m3_status m3_gpu_rmsnorm_f32(m3_gpu *g, float *d_y, const float *d_x, const m3_bf16 *d_w,
                             int n_tok, int dim, float eps) {
    (void)g; (void)d_y; (void)d_x; (void)d_w; (void)n_tok; (void)dim; (void)eps;
    return NO_GPU("gpu rmsnorm");
}
m3_status m3_gpu_rmsnorm_add(m3_gpu *g, m3_bf16 *d_y, m3_bf16 *d_resid, const m3_bf16 *d_h,
                             const m3_bf16 *d_w, int n_tok, int dim, float eps,
                             const m3_profile *p) {
    (void)g; (void)d_y; (void)d_resid; (void)d_h; (void)d_w; (void)n_tok; (void)dim; (void)eps;
    (void)p;
    return NO_GPU("gpu rmsnorm_add");
}
m3_status m3_gpu_rmsnorm_add_f32(m3_gpu *g, float *d_y, float *d_resid, const float *d_h,
                                 const m3_bf16 *d_w, int n_tok, int dim, float eps,
                                 const m3_profile *p) {
    (void)g; (void)d_y; (void)d_resid; (void)d_h; (void)d_w; (void)n_tok; (void)dim; (void)eps;
    (void)p;
    return NO_GPU("gpu rmsnorm_add");
}
m3_status m3_gpu_qk_norm_rope(m3_gpu *g, m3_bf16 *d_x, int ld, const int32_t *d_pos, int n_tok,
                              int n_head, int head_dim, const m3_bf16 *d_w, float eps,
                              int rot_dim, float theta, const m3_profile *p) {
    (void)g; (void)d_x; (void)ld; (void)d_pos; (void)n_tok; (void)n_head; (void)head_dim;
    (void)d_w; (void)eps; (void)rot_dim; (void)theta; (void)p;
    return NO_GPU("gpu qk_norm_rope");
}
m3_status m3_gpu_qk_norm_rope_f32(m3_gpu *g, float *d_x, int ld, const int32_t *d_pos,
                                  int n_tok, int n_head, int head_dim, const m3_bf16 *d_w,
                                  float eps, int rot_dim, float theta, const m3_profile *p) {
    (void)g; (void)d_x; (void)ld; (void)d_pos; (void)n_tok; (void)n_head; (void)head_dim;
    (void)d_w; (void)eps; (void)rot_dim; (void)theta; (void)p;
    return NO_GPU("gpu qk_norm_rope");
}

m3_status m3_gpu_swiglu(m3_gpu *g, m3_bf16 *d_a, const m3_bf16 *d_g, const m3_bf16 *d_u,
                        int64_t n, float alpha, float limit, const m3_profile *p) {
    (void)g; (void)d_a; (void)d_g; (void)d_u; (void)n; (void)alpha; (void)limit; (void)p;
    return NO_GPU("gpu swiglu");
}
m3_status m3_gpu_swiglu_f32(m3_gpu *g, float *d_a, const float *d_g, const float *d_u, int64_t n,
                            float alpha, float limit, const m3_profile *p) {
    (void)g; (void)d_a; (void)d_g; (void)d_u; (void)n; (void)alpha; (void)limit; (void)p;
    return NO_GPU("gpu swiglu");
}
m3_status m3_gpu_copy_kernel(m3_gpu *g, void *d_dst, const void *d_src, size_t bytes, int flavor) {
    (void)g; (void)d_dst; (void)d_src; (void)bytes; (void)flavor;
    return NO_GPU("gpu copy kernel");
}
void m3_gpu_set_elem_variant(int v) { (void)v; }
m3_status m3_gpu_moe_route(m3_gpu *g, int32_t *d_ids, float *d_wts, float *d_margin,
                           const float *d_logits, const float *d_bias, int n_tok,
                           const struct m3_moe_params *mp, const m3_profile *p) {
    (void)g; (void)d_ids; (void)d_wts; (void)d_margin; (void)d_logits; (void)d_bias; (void)n_tok;
    (void)mp; (void)p;
    return NO_GPU("gpu moe_route");
}
m3_status m3_gpu_moe_router_logits(m3_gpu *g, float *d_logits, const m3_bf16 *d_x, int n_tok,
                                   const m3_bf16 *d_gate_bf16, const struct m3_moe_params *mp,
                                   const m3_profile *p) {
    (void)g; (void)d_logits; (void)d_x; (void)n_tok; (void)d_gate_bf16; (void)mp; (void)p;
    return NO_GPU("gpu router_logits");
}

m3_status m3_gpu_moe_experts(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x, const int32_t *d_ids,
                             const float *d_wts, int n_tok, const m3_gpu_experts *w,
                             const struct m3_moe_params *mp, const m3_profile *p) {
    (void)g; (void)d_y; (void)d_x; (void)d_ids; (void)d_wts; (void)n_tok; (void)w; (void)mp;
    (void)p;
    return NO_GPU("gpu moe_experts");
}

int m3_gpu_moe_mx4_fast(const m3_gpu_experts *w) {
    (void)w;
    return 0;
}

m3_status m3_gpu_attn_dense_flash(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                  const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                                  int n_tok, int n_ctx, const struct m3_attn_params *ap,
                                  const m3_profile *p) {
    (void)g; (void)d_out; (void)d_q; (void)ld_q; (void)d_k; (void)d_v; (void)d_pos; (void)n_tok;
    (void)n_ctx; (void)ap; (void)p;
    return NO_GPU("gpu attention");
}
m3_status m3_gpu_attn_sparse_flash(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                   const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                                   int n_tok, int n_ctx, const int32_t *d_topk, int width,
                                   int block, const struct m3_attn_params *ap,
                                   const m3_profile *p) {
    (void)g; (void)d_out; (void)d_q; (void)ld_q; (void)d_k; (void)d_v; (void)d_pos; (void)n_tok;
    (void)n_ctx; (void)d_topk; (void)width; (void)block; (void)ap; (void)p;
    return NO_GPU("gpu attention");
}
m3_status m3_gpu_kv_cache_write(m3_gpu *g, const m3_gpu_kv_cache *c, const m3_bf16 *d_k,
                                int ld_k, const m3_bf16 *d_v, int ld_v, const int64_t *d_slots,
                                int n_tok, int n_kv_head, int head_dim) {
    (void)g; (void)c; (void)d_k; (void)ld_k; (void)d_v; (void)ld_v; (void)d_slots; (void)n_tok;
    (void)n_kv_head; (void)head_dim;
    return NO_GPU("gpu kv_cache_write");
}
m3_status m3_gpu_attn_paged(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                            const m3_gpu_attn_paged_src *src, const int32_t *d_pos, int n_tok,
                            int n_ctx, const int32_t *d_topk, int width,
                            const struct m3_attn_params *ap, const m3_profile *p) {
    (void)g; (void)d_out; (void)d_q; (void)ld_q; (void)src; (void)d_pos; (void)n_tok;
    (void)n_ctx; (void)d_topk; (void)width; (void)ap; (void)p;
    return NO_GPU("gpu paged attention");
}
m3_status m3_gpu_attn_paged_f32(m3_gpu *g, float *d_out, const float *d_q, int ld_q,
                                const m3_gpu_attn_paged_src *src, const int32_t *d_pos,
                                int n_tok, int n_ctx, const int32_t *d_topk, int width,
                                const struct m3_attn_params *ap, const m3_profile *p) {
    (void)g; (void)d_out; (void)d_q; (void)ld_q; (void)src; (void)d_pos; (void)n_tok;
    (void)n_ctx; (void)d_topk; (void)width; (void)ap; (void)p;
    return NO_GPU("gpu paged attention");
}
m3_status m3_gpu_attn_paged_flash(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                  const m3_gpu_attn_paged_src *src, const int32_t *d_pos,
                                  int n_tok, int n_ctx, const int32_t *d_topk, int width,
                                  const struct m3_attn_params *ap, const m3_profile *p) {
    (void)g; (void)d_out; (void)d_q; (void)ld_q; (void)src; (void)d_pos; (void)n_tok;
    (void)n_ctx; (void)d_topk; (void)width; (void)ap; (void)p;
    return NO_GPU("gpu paged attention");
}
m3_status m3_gpu_attn_paged_flash_ok(const m3_gpu_attn_paged_src *src,
                                     const struct m3_attn_params *ap, const m3_profile *p,
                                     int width) {
    (void)src; (void)ap; (void)p; (void)width;
    return NO_GPU("gpu paged attention");
}
m3_status m3_gpu_qk_norm_rope_cache(m3_gpu *g, const m3_gpu_qkv *x, const m3_gpu_kv_cache *c,
                                    const int64_t *d_slots, const int32_t *d_pos, int n_tok,
                                    float eps, int rot_dim, float theta, const m3_profile *p) {
    (void)g; (void)x; (void)c; (void)d_slots; (void)d_pos; (void)n_tok; (void)eps; (void)rot_dim;
    (void)theta; (void)p;
    return NO_GPU("gpu qk_norm_rope_cache");
}
m3_status m3_gpu_attn_dense(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                            const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                            int n_tok, int n_ctx, const struct m3_attn_params *ap,
                            const m3_profile *p) {
    (void)g; (void)d_out; (void)d_q; (void)ld_q; (void)d_k; (void)d_v; (void)d_pos; (void)n_tok;
    (void)n_ctx; (void)ap; (void)p;
    return NO_GPU("gpu attention");
}
m3_status m3_gpu_attn_dense_f32(m3_gpu *g, float *d_out, const float *d_q, int ld_q,
                                const float *d_k, const float *d_v, const int32_t *d_pos,
                                int n_tok, int n_ctx, const struct m3_attn_params *ap,
                                const m3_profile *p) {
    (void)g; (void)d_out; (void)d_q; (void)ld_q; (void)d_k; (void)d_v; (void)d_pos; (void)n_tok;
    (void)n_ctx; (void)ap; (void)p;
    return NO_GPU("gpu attention");
}
m3_status m3_gpu_attn_sparse(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                             const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                             int n_tok, int n_ctx, const int32_t *d_topk, int width, int block,
                             const struct m3_attn_params *ap, const m3_profile *p) {
    (void)g; (void)d_out; (void)d_q; (void)ld_q; (void)d_k; (void)d_v; (void)d_pos; (void)n_tok;
    (void)n_ctx; (void)d_topk; (void)width; (void)block; (void)ap; (void)p;
    return NO_GPU("gpu attention");
}
m3_status m3_gpu_attn_sparse_f32(m3_gpu *g, float *d_out, const float *d_q, int ld_q,
                                 const float *d_k, const float *d_v, const int32_t *d_pos,
                                 int n_tok, int n_ctx, const int32_t *d_topk, int width,
                                 int block, const struct m3_attn_params *ap,
                                 const m3_profile *p) {
    (void)g; (void)d_out; (void)d_q; (void)ld_q; (void)d_k; (void)d_v; (void)d_pos; (void)n_tok;
    (void)n_ctx; (void)d_topk; (void)width; (void)block; (void)ap; (void)p;
    return NO_GPU("gpu attention");
}

m3_status m3_gpu_indexer_topk(m3_gpu *g, int32_t *d_topk, float *d_scores, float *d_margin,
                              int *d_n_ties, const m3_bf16 *d_iq, int ld_q, const m3_bf16 *d_ik,
                              const int32_t *d_pos, int n_tok, int n_ctx,
                              const struct m3_indexer_params *ip, const m3_profile *p) {
    (void)g; (void)d_topk; (void)d_scores; (void)d_margin; (void)d_n_ties; (void)d_iq; (void)ld_q;
    (void)d_ik; (void)d_pos; (void)n_tok; (void)n_ctx; (void)ip; (void)p;
    return NO_GPU("gpu indexer");
}
m3_status m3_gpu_indexer_topk_f32(m3_gpu *g, int32_t *d_topk, float *d_scores, float *d_margin,
                                  int *d_n_ties, const float *d_iq, int ld_q, const float *d_ik,
                                  const int32_t *d_pos, int n_tok, int n_ctx,
                                  const struct m3_indexer_params *ip, const m3_profile *p) {
    (void)g; (void)d_topk; (void)d_scores; (void)d_margin; (void)d_n_ties; (void)d_iq; (void)ld_q;
    (void)d_ik; (void)d_pos; (void)n_tok; (void)n_ctx; (void)ip; (void)p;
    return NO_GPU("gpu indexer");
}
m3_status m3_gpu_indexer_topk_path(m3_gpu *g, int path, int32_t *d_topk, float *d_scores,
                                   float *d_margin, int *d_n_ties, const m3_bf16 *d_iq, int ld_q,
                                   const m3_bf16 *d_ik, const int32_t *d_pos, int n_tok, int n_ctx,
                                   const struct m3_indexer_params *ip, const m3_profile *p) {
    (void)path;
    return m3_gpu_indexer_topk(g, d_topk, d_scores, d_margin, d_n_ties, d_iq, ld_q, d_ik, d_pos,
                               n_tok, n_ctx, ip, p);
}
m3_status m3_gpu_indexer_topk_f32_path(m3_gpu *g, int path, int32_t *d_topk, float *d_scores,
                                       float *d_margin, int *d_n_ties, const float *d_iq,
                                       int ld_q, const float *d_ik, const int32_t *d_pos,
                                       int n_tok, int n_ctx, const struct m3_indexer_params *ip,
                                       const m3_profile *p) {
    (void)path;
    return m3_gpu_indexer_topk_f32(g, d_topk, d_scores, d_margin, d_n_ties, d_iq, ld_q, d_ik,
                                   d_pos, n_tok, n_ctx, ip, p);
}
m3_status m3_gpu_indexer_topk_keys(m3_gpu *g, int path, int32_t *d_topk, float *d_scores,
                                   float *d_margin, int *d_n_ties, const m3_bf16 *d_iq, int ld_q,
                                   const m3_gpu_index_keys *keys, const int32_t *d_pos, int n_tok,
                                   int n_ctx, const struct m3_indexer_params *ip,
                                   const m3_profile *p) {
    (void)g; (void)path; (void)d_topk; (void)d_scores; (void)d_margin; (void)d_n_ties; (void)d_iq;
    (void)ld_q; (void)keys; (void)d_pos; (void)n_tok; (void)n_ctx; (void)ip; (void)p;
    return NO_GPU("gpu indexer");
}
m3_status m3_gpu_indexer_topk_keys_f32(m3_gpu *g, int path, int32_t *d_topk, float *d_scores,
                                       float *d_margin, int *d_n_ties, const float *d_iq, int ld_q,
                                       const m3_gpu_index_keys *keys, const int32_t *d_pos,
                                       int n_tok, int n_ctx, const struct m3_indexer_params *ip,
                                       const m3_profile *p) {
    (void)g; (void)path; (void)d_topk; (void)d_scores; (void)d_margin; (void)d_n_ties; (void)d_iq;
    (void)ld_q; (void)keys; (void)d_pos; (void)n_tok; (void)n_ctx; (void)ip; (void)p;
    return NO_GPU("gpu indexer");
}

m3_status m3_gpu_gemm_f32(m3_gpu *g, float *d_y, const float *d_x, const float *d_w, int n_tok,
                          int n_out, int n_in) {
    (void)g; (void)d_y; (void)d_x; (void)d_w; (void)n_tok; (void)n_out; (void)n_in;
    return NO_GPU("gpu gemm");
}

/* ---- whole model ---- */
void m3_gpu_model_opts_default(m3_gpu_model_opts *o) {
    o->flash = false;
    o->f32_storage = false;
    o->resident = -1;
}
size_t m3_gpu_layer_weights_bytes(const struct m3_config *c, int layer, bool bf16) {
    (void)c; (void)layer; (void)bf16;
    return 0;
}
m3_status m3_gpu_layer_weights_upload(m3_gpu *g, m3_gpu_layer_weights **out,
                                      const struct m3_layer_weights *hw,
                                      const struct m3_config *c, const m3_profile *p, bool bf16) {
    (void)g; (void)hw; (void)c; (void)p; (void)bf16;
    *out = NULL;
    return NO_GPU("gpu layer weights");
}
void m3_gpu_layer_weights_free(m3_gpu_layer_weights *w) { (void)w; }
m3_status m3_gpu_layer_weights_experts(const m3_gpu_layer_weights *w, m3_gpu_experts *routed,
                                       int *n_slot, m3_gpu_experts *shared) {
    (void)w; (void)routed; (void)n_slot; (void)shared;
    return NO_GPU("gpu layer weights");
}
m3_status m3_gpu_layer_cache_alloc(m3_gpu *g, m3_gpu_layer_cache *c, const struct m3_config *cfg,
                                   bool sparse, int cap, bool bf16) {
    (void)g; (void)c; (void)cfg; (void)sparse; (void)cap; (void)bf16;
    return NO_GPU("gpu layer cache");
}
m3_status m3_gpu_layer_forward(m3_gpu *g, void *d_x, void *d_h, bool *h_pending, int n_tok,
                               const int32_t *d_pos, const int32_t *h_pos,
                               const m3_gpu_layer_weights *w, const struct m3_config *c,
                               const m3_profile *p, m3_gpu_layer_cache *cache,
                               const m3_hooks *hooks, const char *prefix,
                               const m3_gpu_model_opts *o) {
    (void)g; (void)d_x; (void)d_h; (void)h_pending; (void)n_tok; (void)d_pos; (void)h_pos;
    (void)w; (void)c; (void)p; (void)cache; (void)hooks; (void)prefix; (void)o;
    return NO_GPU("gpu layer");
}
m3_status m3_gpu_model_open(m3_gpu_model **m, m3_gpu *g, const char *model_dir,
                            const char *override_json, const m3_profile *p,
                            const m3_gpu_model_opts *o) {
    (void)g; (void)model_dir; (void)override_json; (void)p; (void)o;
    *m = NULL;
    return NO_GPU("--backend gpu");
}
void m3_gpu_model_close(m3_gpu_model *m) { (void)m; }
const struct m3_config *m3_gpu_model_config(const m3_gpu_model *m) { (void)m; return NULL; }
int m3_gpu_model_n_past(const m3_gpu_model *m) { (void)m; return 0; }
void m3_gpu_model_reset(m3_gpu_model *m) { (void)m; }
const char *m3_gpu_model_storage(const m3_gpu_model *m) { (void)m; return "none"; }
const m3_gpu_layer_cache *m3_gpu_model_layer_cache(const m3_gpu_model *m, int layer) {
    (void)m; (void)layer;
    return NULL;
}
m3_status m3_gpu_model_reserve(m3_gpu_model *m, int n_ctx) {
    (void)m; (void)n_ctx;
    return NO_GPU("--backend gpu");
}
m3_status m3_gpu_model_forward(m3_gpu_model *m, const int32_t *tokens, const int32_t *pos,
                               int n_tok, const m3_hooks *hooks, const char *prefix,
                               float *logits_last, int32_t *next) {
    (void)m; (void)tokens; (void)pos; (void)n_tok; (void)hooks; (void)prefix; (void)logits_last;
    (void)next;
    return NO_GPU("--backend gpu");
}

m3_status m3_gpu_model_set_variant(m3_gpu_model *m, const struct m3_variant *v) {
    (void)m; (void)v;
    return NO_GPU("gpu model");
}
