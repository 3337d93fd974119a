/* gpu/m3_gpu.h: the C ABI of the GPU backend (plain C, no HIP types). Every entry point
 * m3_gpu_<component> has a reference twin m3_<component> in ref/ with the same argument
 * order; pointers named d_* are device pointers, h_* host pointers.
 *
 * Ownership: device memory comes only from the context's arena (m3_gpu_alloc); launchers
 * never allocate. Ops are enqueued on the context's one stream and return once launched;
 * m3_gpu_download/m3_gpu_sync wait for them. With M3_GPU_SYNC=1 in the environment every
 * launcher synchronizes and checks, so an asynchronous fault is reported by the launcher
 * that caused it.
 *
 * Errors: every runtime call and every launch is checked; a failure records one line
 * ("gpu: rmsnorm_k launch: invalid configuration argument") and returns M3_ERR_DEVICE
 * (M3_ERR_NOMEM when the arena is exhausted). Shape contract violations abort (M3_ASSERT). */
#ifndef M3_GPU_H
#define M3_GPU_H

#include "ref/base.h"
#include "ref/kvcache.h" /* m3_kv_geom / m3_kv_view: the paged-cache geometry (plain C) */
#include "ref/num/fp8.h" /* m3_fp8_kind, m3_fp8_overflow of the KV cache */
#include "ref/num/num.h"
#include "ref/profile.h" /* the profile switches the twins take (a plain struct) */
#include "ref/tap.h"     /* m3_hooks: stage taps and teacher forcing of the whole model */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct m3_gpu m3_gpu; /* context: device, stream, BLAS handle, arena, timer events */

/* true when this binary has the GPU backend compiled in */
bool m3_gpu_compiled(void);

/* Open device `device` (0-based): a non-blocking stream, a BLAS handle on it, and one device
 * arena of M3_GPU_ARENA_MB MiB (environment; default: half the free device memory, at most
 * 64 GiB). M3_ERR_DEVICE when there is no device. m3_gpu_close frees all of it; NULL ok. */
m3_status m3_gpu_open(m3_gpu **g, int device);
void m3_gpu_close(m3_gpu *g);

/* One line describing the device ("NVIDIA H200, sm_90, 132 CUs, warp 32, 139.8 GiB"). */
const char *m3_gpu_describe(const m3_gpu *g);
int m3_gpu_warp_size(const m3_gpu *g); /* the device's warp width (32 or 64) */

/* ---- device arena: a bump allocator, released in stack order --------------------------
 * m3_gpu_alloc returns `bytes` of device memory aligned to 256 bytes, valid until the arena
 * is released below it. Contents are undefined (tests poison them). */
m3_status m3_gpu_alloc(m3_gpu *g, void **d_p, size_t bytes);
size_t m3_gpu_mark(const m3_gpu *g);           /* current top of the arena */
void m3_gpu_release(m3_gpu *g, size_t mark);   /* free everything allocated after `mark` */
size_t m3_gpu_arena_bytes(const m3_gpu *g);    /* capacity */

/* ---- copies (ordered on the context stream) ---------------------------------------------
 * upload returns once the copy is enqueued and h_src may be reused (staged synchronously);
 * download waits for all earlier work on the stream, then for the copy. */
m3_status m3_gpu_upload(m3_gpu *g, void *d_dst, const void *h_src, size_t bytes);
m3_status m3_gpu_download(m3_gpu *g, void *h_dst, const void *d_src, size_t bytes);
m3_status m3_gpu_copy(m3_gpu *g, void *d_dst, const void *d_src, size_t bytes);
m3_status m3_gpu_memset(m3_gpu *g, void *d_dst, int byte, size_t bytes);
m3_status m3_gpu_sync(m3_gpu *g); /* wait for the stream, report any pending fault */

/* ---- timing: device events around enqueued work ---------------------------------------- */
m3_status m3_gpu_timer_start(m3_gpu *g);
m3_status m3_gpu_timer_stop(m3_gpu *g, float *ms); /* waits; ms since timer_start */

/* ---- dense projection through the vendor BLAS -------------------------------------------
 * y[T,N] = x[T,K] · W[N,K]^T (W row-major [out, in], as checkpoints store it), bf16 inputs,
 * fp32 accumulation, one rounding of y to bf16 (or fp32 out for the _f32 variant). The
 * reduction order is the library's; compare with NMSE, never bit for bit. Without a vendor
 * BLAS (Debian hipcc) this returns M3_ERR_UNSUPPORTED. */
m3_status m3_gpu_gemm_bf16(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x, const m3_bf16 *d_w,
                           int n_tok, int n_out, int n_in);
m3_status m3_gpu_gemm_bf16_f32(m3_gpu *g, float *d_y, const m3_bf16 *d_x, const m3_bf16 *d_w,
                               int n_tok, int n_out, int n_in);
/* fp32 x and W, fp32 y, true fp32 math (no TF32): the fp32 profile's projections. */
m3_status m3_gpu_gemm_f32(m3_gpu *g, float *d_y, const float *d_x, const float *d_w, int n_tok,
                          int n_out, int n_in);

/* ---- element-wise conversions (gpu/num.hip), bit-identical to ref/num/bf16.h ---------- */
m3_status m3_gpu_f32_to_bf16(m3_gpu *g, m3_bf16 *d_y, const float *d_x, int64_t n); /* RNE */
m3_status m3_gpu_bf16_to_f32(m3_gpu *g, float *d_y, const m3_bf16 *d_x, int64_t n); /* exact */
/* Every scalar conversion of ref/num on the device (gpu/num_ops.h, op an m3_num_op, param its
 * options): out[i] = m3_num_apply(op, param, u_i), u_i = d_in[i] when d_in is given, else
 * start + i*stride (mod 2^32). For host-vs-device bit equality (tests/gpu_num.c). */
m3_status m3_gpu_num_sweep(m3_gpu *g, uint32_t *d_out, const uint32_t *d_in, int op, int param,
                           uint32_t start, uint32_t stride, int64_t n);
/* MX block quantization on the device, twin of ref/num/mx.h m3_mx_quantize_block +
 * m3_mx_dequantize_block: x [n_blocks * p->block] fp32, codes one per element, scales
 * [n_blocks], y the dequantized values. */
struct m3_mx_params;
m3_status m3_gpu_mx_quantize_blocks(m3_gpu *g, uint8_t *d_codes, m3_e8m0 *d_scales, float *d_y,
                                    const float *d_x, int64_t n_blocks,
                                    const struct m3_mx_params *p);

/* How many of the n fp8 codes at d_codes (any alignment) are NaN under kind (ref/num/fp8.h
 * m3_fp8_is_nan, counted on the device; waits for the count). gpu/layer.hip asks it of every
 * MXFP8 expert upload to set m3_gpu_experts.finite_codes. */
m3_status m3_gpu_fp8_count_nan(m3_gpu *g, const uint8_t *d_codes, int64_t n, m3_fp8_kind kind,
                               int64_t *count);

/* ---- component twins -------------------------------------------------------------------
 * Each m3_gpu_<x> takes the arguments of ref's m3_<x> in the same order, with device
 * pointers and the context first. The plain name stores bf16 activations (what hf/atom
 * production stores; it returns M3_ERR_UNSUPPORTED for a profile that keeps fp32); the _f32
 * name stores fp32 and applies the profile's roundings in registers, for tight checks
 * against the reference under any profile. */

/* gpu/norm.hip, twin of ref/norm.h. y = (s*rho)*(1+w); rho = 1/sqrtf(mean(s^2)+eps).
 * m3_gpu_rmsnorm: bf16 x -> bf16 y (one rounding). _f32: fp32 in and out, no rounding. */
m3_status m3_gpu_rmsnorm(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x, const m3_bf16 *d_w,
                         int n_tok, int dim, float eps);
m3_status m3_gpu_rmsnorm_f32(m3_gpu *g, float *d_y, const float *d_x, const m3_bf16 *d_w,
                             int n_tok, int dim, float eps);
/* resid [T,D] in/out (r on entry, s = r + h on exit), h may be NULL, y [T,D]; the profile's
 * residual_bf16 / norm_reads_f32_sum / act_bf16 apply as in ref. y must not alias resid/h. */
m3_status m3_gpu_rmsnorm_add(m3_gpu *g, m3_bf16 *d_y, m3_bf16 *d_resid, const m3_bf16 *d_h,
                             const m3_bf16 *d_w, int n_tok, int dim, float eps,
                             const m3_profile *p);
m3_status m3_gpu_rmsnorm_add_f32(m3_gpu *g, float *d_y, float *d_resid, const float *d_h,
                                 const m3_bf16 *d_w, int n_tok, int dim, float eps,
                                 const m3_profile *p);

/* gpu/rope.hip, twin of ref/rope.h m3_qk_norm_rope: per-head norm (shared w [Dh]) then
 * partial NeoX rope of the first rot_dim dims, in place, rows of pitch ld; pos [T] device.
 * rot_dim <= 256. The bf16 variant needs qk_round PER_OP or ONCE. */
m3_status m3_gpu_qk_norm_rope(m3_gpu *g, m3_bf16 *d_x, int ld, const int32_t *d_pos, int n_tok,
                              int n_head, int head_dim, const m3_bf16 *d_w, float eps,
                              int rot_dim, float theta, const m3_profile *p);
m3_status m3_gpu_qk_norm_rope_f32(m3_gpu *g, float *d_x, int ld, const int32_t *d_pos,
                                  int n_tok, int n_head, int head_dim, const m3_bf16 *d_w,
                                  float eps, int rot_dim, float theta, const m3_profile *p);

/* gpu/mlp.hip, twin of ref/mlp.h m3_swiglu: a = swiglu_oai(g, u) with p->swiglu's rounding
 * (ref/num/act.h as device code). The bf16 variant needs swiglu PER_OP or ONCE. a may alias
 * g or u. */
m3_status m3_gpu_swiglu(m3_gpu *g, m3_bf16 *d_a, const m3_bf16 *d_g, const m3_bf16 *d_u,
                        int64_t n, float alpha, float limit, const m3_profile *p);
m3_status m3_gpu_swiglu_f32(m3_gpu *g, float *d_a, const float *d_g, const float *d_u, int64_t n,
                            float alpha, float limit, const m3_profile *p);

/* gpu/copy.hip: a plain 16-byte copy kernel (bench reference next to m3_gpu_copy; the model
 * never calls it). bytes and both pointers in 16-byte units. flavor 0: one chunk a thread,
 * plain loads/stores; 1: read-only loads, streaming stores; 2: as 1, four chunks a thread;
 * 3: as 0, launched as a programmatic dependent of the launch before it (the bench's PDL
 * floor). */
m3_status m3_gpu_copy_kernel(m3_gpu *g, void *d_dst, const void *d_src, size_t bytes, int flavor);
/* Test hook: v = 0 runs rmsnorm / rmsnorm_add / swiglu (bf16 storage) through the plain
 * kernels (rmsnorm_vec_k, swiglu_k), any other value the fast path (the default); both write
 * the same bytes (tests/gpu_norm_rope.c, tests/gpu_moe.c check it). Process-wide. */
void m3_gpu_set_elem_variant(int v);

/* gpu/moe.hip, twins of ref/moe.h. The MoE params struct is ref's m3_moe_params. */
struct m3_moe_params;
/* ids/wts [T,K] in selection order (value desc, NaN highest, id asc), wts before
 * routed_scaling_factor; margin [T] may be NULL; bias [E] fp32 may be NULL. E <= 256.
 * Ordering: the kernel is a programmatic dependent launch that reads bias before the kernel
 * launched just before it on the stream has finished (the logits after it); no kernel that may
 * still run when the call is launched may write bias (the model's bias is a weight). */
m3_status m3_gpu_moe_route(m3_gpu *g, int32_t *d_ids, float *d_wts, float *d_margin,
                           const float *d_logits, const float *d_bias, int n_tok,
                           const struct m3_moe_params *mp, const m3_profile *p);
/* logits [T,E] (bf16 values in fp32 storage) = bf16(x Wg^T), x bf16 [T,D], the gate held in
 * bf16 (d_gate_bf16 [E,D], the caller's converted copy). router_dtype must be BF16. */
m3_status m3_gpu_moe_router_logits(m3_gpu *g, float *d_logits, const m3_bf16 *d_x, int n_tok,
                                   const m3_bf16 *d_gate_bf16, const struct m3_moe_params *mp,
                                   const m3_profile *p);

/* Routed experts of one layer on the device: all E experts in one array per matrix, each
 * expert in checkpoint layout [out, in], so expert e's gate is gate + e*F*D elements.
 *   BF16:  gate/up [E, F, D] bf16, down [E, D, F] bf16; scales unused (NULL).
 *   MXFP8: codes e4m3fn, one byte per element, same shapes; scales e8m0 [E, F, D/32] for
 *          gate/up and [E, D, F/32] for down (one per 32 consecutive elements along in).
 *   MXFP4: codes e2m1 packed two per byte (element 2j in the low nibble of byte j, the
 *          checkpoint's low_even order): gate/up [E, F, D/2] bytes, down [E, D, F/2]; scales
 *          as MXFP8. Dequantization (ref/num/mx.h: code value * 2^(s-127)) is fused into the
 *          GEMMs; no bf16 copy of the weights is ever made. */
typedef enum m3_gpu_wfmt { M3_GPU_W_BF16 = 0, M3_GPU_W_MXFP8 = 1, M3_GPU_W_MXFP4 = 2 } m3_gpu_wfmt;
typedef struct m3_gpu_experts {
    m3_gpu_wfmt fmt;
    const void *gate, *up, *down;           /* device, borrowed */
    const m3_e8m0 *gate_s, *up_s, *down_s;  /* device, borrowed (MX only) */
    /* Activation quantization (ref/linear.h m3_actq, host structs, borrowed): act_in before
     * the gate/up GEMMs (rows of x along D), act_mid before the down GEMM (rows of the swiglu
     * output along F), as ref's m3_wq.act of the experts' gate/up and down matrices. NULL =
     * none. Each applies when n_pass >= its min_pass (m3_actq_applies). Zero-initialise the
     * struct: NULL / 0 keep the plain behaviour. */
    const struct m3_actq *act_in, *act_mid;
    int n_pass; /* tokens of the whole forward pass (MXFP4's moe_act_bound); 0 = n_tok */
    /* nonzero: the portable kernels that AMD runs (the FMA decode GEMV sk_k, the tile_k
     * prefill tiles) also on NVIDIA, where the default is the tensor-core paths (tests) */
    int portable;
    /* nonzero: the caller knows the MXFP8 codes hold no e4m3 NaN code (0x7F / 0xFF; real
     * checkpoints have none, gpu/layer.hip scans them at upload), so the tensor-core decode
     * skips its per-piece NaN test; 0 (default): NaN codes decode to NaN as in ref */
    int finite_codes;
    /* test hook, nonzero: the prefill tiles (T*K > 4E) through tile2_k (mma.sync, sm_80+) also
     * where the Hopper wgmma kernel wg_k would run (gpu/moe.hip), so tests check both */
    int tile_sm80;
    /* nonzero mx_scale_hi: the caller knows every MX block scale byte of gate, up and down lies
     * in [mx_scale_lo, mx_scale_hi] (gpu/layer.hip: its upload scan). MXFP4 decode then takes
     * one exact bf16 multiply per code pair with no per-step test when the range lies within
     * [0, 128] (2^1), or within [3, 136] (x staged times 2^8); 0 (default): unknown (scales
     * <= 2^1 are found per step, others take the per-piece path; exact either way) */
    int mx_scale_lo, mx_scale_hi;
} m3_gpu_experts;

/* 1: the MXFP4 decode GEMVs (T*K <= 4E, NVIDIA) run w with one multiply a code pair and no
 * per-step scale test, because w's mx_scale_lo / hi allow it (every scale byte <= 128, or in
 * [3, 136]; gpu/layer.hip sets them from its upload scan); 0: the per-step vote (results are
 * bit-identical either way). For tests. */
int m3_gpu_moe_mx4_fast(const m3_gpu_experts *w);

/* Twin of ref's m3_moe_experts: y [T,D] bf16 = bf16(rsf * sum_k w_k MLP_{e_k}(x)) with the
 * profile's rounding points (hf: bf16 products and running sum in ascending expert id;
 * atom: fp32 sum in ascending id), x [T,D] bf16, ids/wts [T,K] device. Gate/up GEMMs with
 * swiglu_oai fused in their epilogue (g, u rounded to bf16 first, as act_bf16 does), down
 * GEMM, then the combine. Small batches (T*K <= 4E) run weight-streaming GEMV kernels;
 * larger ones tensor-core tiles (wgmma on Hopper with an sm_90a
 * build, mma.sync on other NVIDIA, fp32 FMAs elsewhere), weights
 * dequantized exactly to bf16 in shared memory. Needs a bf16-activation profile (hf, atom),
 * D % 128 == 0, F % 64 == 0, E <= 1024, K <= 8. ids must be valid (ref validates them): an
 * id outside [0, E) contributes nothing. Temporaries come from the arena.
 * Activation quantization (w->act_in / act_mid when they apply for n_pass): M3_ACTQ_MX with
 * block 32 only, bit-identical to ref's (m3_gpu_mx_qdq_bf16 on x rows along D, and on the
 * swiglu output rows along F); M3_ACTQ_PTPC returns M3_ERR_UNSUPPORTED. */
m3_status m3_gpu_moe_experts(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x, const int32_t *d_ids,
                             const float *d_wts, int n_tok, const m3_gpu_experts *w,
                             const struct m3_moe_params *mp, const m3_profile *p);

/* gpu/quant.hip, twin of ref/quant.c m3_mx_quantize + m3_mx_dequantize on bf16 rows:
 * y [rows, cols] = the MX quantize-dequantize of x along cols with mx (ref/num/mx.h: any
 * element type, scale rule, rounding, overflow and zero-block rule), stored as bf16 (exact for
 * bf16 inputs; NaN blocks stay NaN). Bit-identical to ref. Needs mx->block == 32 and
 * cols % 32 == 0 (else M3_ERR_UNSUPPORTED); x, y 16-byte aligned; y may alias x. */
struct m3_mx_params;
m3_status m3_gpu_mx_qdq_bf16(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x, int64_t rows, int cols,
                             const struct m3_mx_params *mx);

/* gpu/attn.hip, twins of ref/attn.h (without ref's host scratch arguments). q [T, H*Dh]
 * (row pitch ld_q), k, v [S_k, Hkv, Dh], pos [T] (< n_ctx), out [T, H*Dh]; sparse: topk
 * [Hkv, T, width] (width <= 64), block Bs. Every rounding point of the profile (eager
 * scores, bf16 P, bf16 output, atom partitions and selection order) as in ref. The bf16
 * variants need attn_out_bf16. */
struct m3_attn_params;
m3_status m3_gpu_attn_dense(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                            const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                            int n_tok, int n_ctx, const struct m3_attn_params *ap,
                            const m3_profile *p);
m3_status m3_gpu_attn_dense_f32(m3_gpu *g, float *d_out, const float *d_q, int ld_q,
                                const float *d_k, const float *d_v, const int32_t *d_pos,
                                int n_tok, int n_ctx, const struct m3_attn_params *ap,
                                const m3_profile *p);
m3_status m3_gpu_attn_sparse(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                             const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                             int n_tok, int n_ctx, const int32_t *d_topk, int width, int block,
                             const struct m3_attn_params *ap, const m3_profile *p);
m3_status m3_gpu_attn_sparse_f32(m3_gpu *g, float *d_out, const float *d_q, int ld_q,
                                 const float *d_k, const float *d_v, const int32_t *d_pos,
                                 int n_tok, int n_ctx, const int32_t *d_topk, int width,
                                 int block, const struct m3_attn_params *ap,
                                 const m3_profile *p);

/* Fast attention (bf16 storage; the production path), same arguments as the faithful
 * twins above. Online softmax with K/V staged once per KV group and shared by its H/Hkv
 * query heads; P rounded to bf16 unnormalised for P.V, fp32 partials merged by log-sum-exp
 * (spec §3.7's atom column): checked against the reference with the bf16 bound, not bit
 * for bit (the faithful kernels are the device reference). sparse: flash-decoding; NVIDIA:
 * one launch, blocks of warps that own 16-key tiles of a (token, kv head) row on mma.sync,
 * the row's partials merged by its last block; elsewhere one block per (selected block, kv
 * head, token) + a merge kernel. dense: tensor cores (mma.sync) on
 * NVIDIA (FA2 style: 8 tokens x 16 heads per block, cp.async double-buffered K/V tiles);
 * elsewhere it runs the faithful kernel. Needs attn_out_bf16, H/Hkv <= 16, Dh % 16 == 0,
 * Dh <= 128, ld_q % 8 == 0, d_q/d_k/d_v 16-byte aligned; sparse: block % 16 == 0, <= 256. */
m3_status m3_gpu_attn_dense_flash(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                  const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                                  int n_tok, int n_ctx, const struct m3_attn_params *ap,
                                  const m3_profile *p);
m3_status m3_gpu_attn_sparse_flash(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                   const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                                   int n_tok, int n_ctx, const int32_t *d_topk, int width,
                                   int block, const struct m3_attn_params *ap,
                                   const m3_profile *p);

/* Paged attention, twin of ref/attn.h m3_attn_paged: causal GQA attention reading K/V
 * through one layer's paged cache (spec §4.1-§4.4, §4.9; docs/caches.md) on the device. The
 * source is ref's m3_attn_paged_src made of device arrays: the storage of ref's m3_kv_layer
 * (same geometry, same bytes: page-Bs SHUFFLE view of dense layers, page-P re-view of sparse
 * ones, tiny-geometry padding included) and the sequence's block table. */
typedef struct m3_gpu_attn_paged_src {
    m3_kv_geom g;             /* ref's geometry (m3_kv_geom_init) */
    m3_kv_view view;          /* the layer's view: decides the addressing */
    const void *k, *v;        /* device: [n_blocks * k_block], [n_blocks * v_stride] elements */
    const float *k_scale, *v_scale; /* device: [n_blocks, Hkv, Bs] (fp8 elements only) */
    const int32_t *bt;        /* device: logical block -> physical block, [n_logical] */
    int n_logical;
    int bt_ld;                /* 0: every token reads bt (one sequence); > 0: token t reads
                                 the table bt + t * bt_ld (>= n_logical): a decode batch, one
                                 sequence per token (m3_gpu_attn_paged_flash and
                                 m3_gpu_attn_paged only) */
    bool fp8_pa;              /* fp8 elements: the §4.9 paged-attention emulation */
    m3_fp8_overflow ovf;      /* of the emulation's fp8 casts (Q, P') */
    int flash_cpb;            /* m3_gpu_attn_paged_flash test hook: consecutive chunks per
                                 block (0: chosen from the grid size) */
    int flash_kernel;         /* m3_gpu_attn_paged_flash test hook: 0 the launcher's choice,
                                 1 the general kernel, 2 the decode kernel where it fits,
                                 3 the cluster kernel pc_k where it fits, 4 the decode
                                 kernel with pf_merge_k's launch for rows of many partials */
} m3_gpu_attn_paged_src;
/* q [T, H*Dh] (pitch ld_q), pos [T] device (< n_ctx), topk [Hkv, T, width] device or NULL
 * (dense: keys 0..pos[t]; sparse: m3_kv_sparse_table's expansion, keys k < ctx through the
 * page-P view; width <= 256). One block per (token, query head), every rounding point of
 * ref's (Q cast to fp8 without scale, K scale folded into the score, P' = fp8(P * v_scale *
 * FP8_MAX / (M + 1e-8)) per tile of keys (tile = the view's page), partitions of
 * attn_partition keys stored bf16 and merged with fp32 log-sum-exp weights). Scores use
 * m3_dot_f32's 8-lane order with unfused fp32 operations and exp runs in double, rounded to
 * fp32: results are ref's bit for bit except where an exp differs from glibc's expf in its
 * last bit. The bf16 variant needs attn_out_bf16; head_dim <= 256. */
m3_status m3_gpu_attn_paged(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                            const m3_gpu_attn_paged_src *src, const int32_t *d_pos, int n_tok,
                            int n_ctx, const int32_t *d_topk, int width,
                            const struct m3_attn_params *ap, const m3_profile *p);
m3_status m3_gpu_attn_paged_f32(m3_gpu *g, float *d_out, const float *d_q, int ld_q,
                                const m3_gpu_attn_paged_src *src, const int32_t *d_pos,
                                int n_tok, int n_ctx, const int32_t *d_topk, int width,
                                const struct m3_attn_params *ap, const m3_profile *p);
/* Fast paged attention (the production path of paged reads), same arguments and key lists
 * as m3_gpu_attn_paged, bf16 output: flash-decoding, one block per (run of consecutive
 * chunks of keys, kv head, token) serving the group's query heads on tensor cores (NVIDIA
 * mma.sync; elsewhere the faithful kernel runs), chunks merged by log-sum-exp in registers,
 * blocks' partials in the same launch (long rows: a merge kernel). A chunk is one
 * attn_partition under a partitioned profile (atom), so partition maxima, denominators, the
 * §4.9 fp8 P' codes and the bf16 partition outputs are ref's; P enters P.V as bf16
 * (unnormalised; §4.9: the fp8 P' codes on fp16 mma, exact products summed per 16 keys, then
 * times M / FP8_MAX). Checked against ref with a documented NMSE
 * bound, not bit for bit (docs/gpu.md "Paged flash"). Fast for any geometry where
 * x = 16 / element bytes divides Dh and the view's page (M3: page-128 dense, page-16 sparse);
 * any other ref geometry runs correctly, gathering element by element. Contract
 * (m3_gpu_attn_paged_flash_ok, M3_ERR_UNSUPPORTED otherwise): attn_out_bf16, bf16 or fp8
 * elements, H/Hkv <= 16, Dh <= 128, width <= 256, attn_partition <= 256, fp8_pa tile (the
 * view's page) <= 256. Ordering: the decode kernels are programmatic dependent launches
 * that read the block table (src->bt) before the kernel launched just before the call on the
 * stream has finished (pc_k, the T = 1-2 cluster kernel: all of it into shared memory; the
 * bf16 dense T = 1 kernel: its first chunks' entries, and it prefetches those keys into L2;
 * the fp8 dense T = 1 kernel: its warps' first two chunks' entries, and it prefetches the
 * first chunk's first keys into L2).
 * That kernel may write q, pos, the selection and the cache (K / V at the call's positions),
 * not the block table (a kernel writing the table must have completed before the call).
 * Everything else is read after it finished. */
m3_status m3_gpu_attn_paged_flash(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                  const m3_gpu_attn_paged_src *src, const int32_t *d_pos,
                                  int n_tok, int n_ctx, const int32_t *d_topk, int width,
                                  const struct m3_attn_params *ap, const m3_profile *p);
/* M3_OK when m3_gpu_attn_paged_flash takes these arguments (width 0: dense), else
 * M3_ERR_UNSUPPORTED with the reason (m3_errorf). No device call. */
m3_status m3_gpu_attn_paged_flash_ok(const m3_gpu_attn_paged_src *src,
                                     const struct m3_attn_params *ap, const m3_profile *p,
                                     int width);

/* gpu/kvcache.hip: K/V rows into ATOM's paged KV cache of one layer (spec §4.1-4.3, §4.7).
 * Twin: ref/kvcache.c m3_kv_write (page 128 = its M3_KV_VIEW_BLOCK view of Bs 128, page 16 =
 * M3_KV_VIEW_PAGE of P 16); tests/gpu_kvcache.c. k, v [T, Hkv*Dh] bf16 rows (pitches ld_k,
 * ld_v: slices of the packed qkv row), slots [T] int64 (slot(p) of §4.1; negative = padding,
 * skipped). page 128: the SHUFFLE view of dense layers; 16: the re-view of sparse layers;
 * 0: plain rows [slots, Hkv, Dh] (bf16 only; a contiguous cache). fp8: bytes of `kind`,
 * scale[(b*Hkv + h)*page + t] = amax/fp8_max over the row (1 when amax is 0, NaN when the
 * row has one), byte = m3_f32_to_fp8(v / scale, kind, ovf) with an fp32 division.
 * Zero-initialise the struct: the fields after k_scale/v_scale default to e4m3fn,
 * saturating, K quantized from the values written, no index cache.
 * Ordering (m3_gpu_kv_cache_write): the kernel is a programmatic dependent launch that lets
 * the next launch start at its entry and waits for the launch before it before its first load
 * (that launch may write the rows and the slots); a dependent launch after it must read the
 * cache after its own wait (the decode kernels of m3_gpu_attn_paged_flash do). */
typedef enum m3_gpu_kq_src {
    M3_GPU_KQ_STORED = 0,   /* K value and amax: the stored bf16 k (every non-atom writer) */
    M3_GPU_KQ_F32 = 1,      /* value and amax: the fp32 k of norm+rope before its bf16
                               rounding (Triton writer: atom dense and reuse layers, §4.7) */
    M3_GPU_KQ_BF16_AMAX_F32 = 2 /* value bf16(k), amax over the fp32 k (aiter writer: atom
                                   computing sparse layers) */
} m3_gpu_kq_src;
typedef struct m3_gpu_kv_cache {
    int page;             /* 128, 16, or 0 (plain rows) */
    bool fp8;             /* fp8 + per (token, head) fp32 scales; else bf16 */
    float fp8_max;        /* 240 (Triton writers) or 448 (aiter on gfx950) */
    void *k, *v;          /* device: [blocks, Hkv, Dh/x, page, x] and [blocks, Hkv, page/x, Dh, x] */
    float *k_scale, *v_scale; /* device: [blocks, Hkv, page] (fp8 only) */
    m3_fp8_kind kind;     /* fp8 element (0 = e4m3fn) */
    m3_fp8_overflow ovf;  /* fp8 overflow policy (0 = saturate) */
    m3_gpu_kq_src k_src;  /* fp8 K: which k is quantized (only m3_gpu_qk_norm_rope_cache has
                             the fp32 k; m3_gpu_kv_cache_write needs STORED) */
    void *index_k;        /* device, NULL = none: the index cache [slots, Di] (§4.5), bf16 or
                             fp8 at unit scale: byte = cvt(f32(bf16(k))) (§4.8) */
    bool index_fp8;
    /* ref's paged storage of one layer (any m3_kv_geom, either view; gpu/kv_paged.h), used
     * instead of page / k / v / k_scale / v_scale / kind / fp8: K and V go to paged->k / v
     * (bf16 or fp8 elements of paged->g) at slot(pos[t]) through paged->bt. Only
     * m3_gpu_qk_norm_rope_cache (it has the positions). NULL: the fields above.
     * With paged set or d_slots NULL, the index cache (index_k) takes rows index_row0 + t. */
    const m3_gpu_attn_paged_src *paged;
    int64_t index_row0;
    /* ATOM's paged index cache (§4.5, m3_gpu_index_keys): index_bt set, index_k is [n_blocks,
     * index_block, Di] and token t's key goes to row slot(pos[t]) = index_bt[pos / index_block]
     * * index_block + pos % index_block (only m3_gpu_qk_norm_rope_cache: it has the positions;
     * index_row0 and d_slots are then not used for it) */
    const int32_t *index_bt;
    int index_block;
} m3_gpu_kv_cache;
m3_status m3_gpu_kv_cache_write(m3_gpu *g, const m3_gpu_kv_cache *c, const m3_bf16 *d_k,
                                int ld_k, const m3_bf16 *d_v, int ld_v, const int64_t *d_slots,
                                int n_tok, int n_kv_head, int head_dim);

/* gpu/rope.hip: the fused attention-input step of one layer in ONE launch (spec §3.5, §3.6,
 * §4.7, §4.8): per-head norm + partial rope of q, k (and index_q, index_k) in place with the
 * profile's rounding points, and the writes of k, v (and the index key) into the cache c.
 * Twin: the composition ref/rope.c m3_qk_norm_rope (q with q_norm, k with k_norm, index_q,
 * index_k) + ref/kvcache.c m3_kv_write / m3_kv_index_write, the way ref/layer.c runs it;
 * tests/gpu_norm_rope.c checks every byte (q, k, caches, scales) against it.
 * Rows [T, heads*dim] with pitches; any pointer may be NULL to leave that part out (index_q,
 * index_k on dense layers; q and the norms for a cache-only write). A NULL norm weight means
 * "no norm, no rope" for that part (k is then copied into the cache as it is). bf16 storage:
 * needs p->qk_round PER_OP or ONCE. Numerics are the reference's op for op: the sum of
 * squares in index order, IEEE sqrt and divisions, no FMA contraction, cos/sin in double
 * rounded to fp32, so results are bit-identical to ref (docs/gpu.md). */
typedef struct m3_gpu_qkv {
    m3_bf16 *q, *k, *index_q, *index_k; /* device, normed + roped in place */
    const m3_bf16 *v;                   /* device, read only (written to the cache) */
    int ld_q, ld_k, ld_v, ld_iq, ld_ik; /* row pitches, elements */
    int n_head, n_kv_head, head_dim;    /* H, Hkv, Dh (q, k, v) */
    int n_index_head, index_dim;        /* G, Di (index_q [T, G*Di], index_k [T, Di]) */
    const m3_bf16 *q_norm, *k_norm, *index_q_norm, *index_k_norm; /* device [Dh], [Dh], [Di], [Di] */
} m3_gpu_qkv;
/* c NULL: no cache write (only the in-place norm + rope). slots [T] int64 (negative:
 * padding, no cache write for that token); needed for K/V writes unless c->paged (slots
 * through its block table) and read for the index cache unless NULL (then rows
 * c->index_row0 + t). pos [T] (rope positions); may be NULL when no part is roped and c is
 * not paged. c->page 128 / 16 / 0 need Dh % x == 0 (x = 8 bf16, 16 fp8); c->paged takes any
 * geometry of bf16 / fp8 elements; c->index_k needs x->index_k (any Di). K and V are written
 * when c has K/V storage (paged, or c->k) and the call has k and v (both needed); a call
 * with only the indexer's parts, or a cache with only index_k, writes the index cache alone,
 * so a layer can keep ref's stage order (q, k, v taps before the indexer's projections) with
 * two launches. gpu/layer.hip's attn_input makes the layer's call (docs/gpu.md). */
m3_status m3_gpu_qk_norm_rope_cache(m3_gpu *g, const m3_gpu_qkv *x, const m3_gpu_kv_cache *c,
                                    const int64_t *d_slots, const int32_t *d_pos, int n_tok,
                                    float eps, int rot_dim, float theta, const m3_profile *p);

/* gpu/indexer.hip, twin of ref/indexer.h m3_indexer_topk: iq [T, G*Di] (pitch ld_q), ik
 * [S_k, Di], pos [T]; topk [G, T, W] (W = m3_indexer_width), scores [G, T, NB] (may be NULL:
 * then an arena temporary), margin [G, T] (may be NULL), n_ties: a device int (may be NULL)
 * counting rows with a tie straddling rank K. G <= 8, K <= 64. Ordering: the decode-step
 * kernel (idx_km_k) is a programmatic dependent launch that reads its first key block before
 * the kernel launched just before it on the stream has finished; that kernel may write index
 * keys only at this call's own positions (the model's cache write of the tokens being scored)
 * (same for the variants below: _f32, _path, _keys). A kernel writing other keys must have
 * completed before the call is launched (e.g. synchronize the stream after it). */
struct m3_indexer_params;
m3_status m3_gpu_indexer_topk(m3_gpu *g, int32_t *d_topk, float *d_scores, float *d_margin,
                              int *d_n_ties, const m3_bf16 *d_iq, int ld_q, const m3_bf16 *d_ik,
                              const int32_t *d_pos, int n_tok, int n_ctx,
                              const struct m3_indexer_params *ip, const m3_profile *p);
m3_status m3_gpu_indexer_topk_f32(m3_gpu *g, int32_t *d_topk, float *d_scores, float *d_margin,
                                  int *d_n_ties, const float *d_iq, int ld_q, const float *d_ik,
                                  const int32_t *d_pos, int n_tok, int n_ctx,
                                  const struct m3_indexer_params *ip, const m3_profile *p);
/* Tests and benches: the same with one device path forced (docs/gpu.md "Lightning indexer").
 * path = a scorer (M3_GPU_IDX_AUTO: the choice above) | selection flags; a path whose shape
 * contract does not hold falls back as the automatic choice would. NOSEL: scores only (topk,
 * margin and n_ties not written): timing. */
enum {
    M3_GPU_IDX_AUTO = 0,
    M3_GPU_IDX_DECODE = 1,     /* idx_dec_k: up to 4 groups of 16/G tokens, selection fused */
    M3_GPU_IDX_WIDE = 2,       /* idx_wide_k */
    M3_GPU_IDX_TILE = 3,       /* idx_score_mma_k */
    M3_GPU_IDX_CUDA = 4,       /* idx_score_k */
    M3_GPU_IDX_SCORE = 0xF,    /* the scorer bits */
    M3_GPU_IDX_SEL_KERNEL = 0x10, /* decode: the selection kernel after idx_dec_k (as past
                                     its fused limit) */
    M3_GPU_IDX_SEL_ROUNDS = 0x20, /* the arg-max rounds (idx_select_k / idx_cand_k + idx_pick_k) */
    M3_GPU_IDX_NOSEL = 0x40
};
m3_status m3_gpu_indexer_topk_path(m3_gpu *g, int path, int32_t *d_topk, float *d_scores,
                                   float *d_margin, int *d_n_ties, const m3_bf16 *d_iq, int ld_q,
                                   const m3_bf16 *d_ik, const int32_t *d_pos, int n_tok, int n_ctx,
                                   const struct m3_indexer_params *ip, const m3_profile *p);
m3_status m3_gpu_indexer_topk_f32_path(m3_gpu *g, int path, int32_t *d_topk, float *d_scores,
                                       float *d_margin, int *d_n_ties, const float *d_iq,
                                       int ld_q, const float *d_ik, const int32_t *d_pos,
                                       int n_tok, int n_ctx, const struct m3_indexer_params *ip,
                                       const m3_profile *p);
/* The index cache as the indexer reads it: contiguous rows [S_k, Di] (bt NULL: key j at row
 * j), or ATOM's paged index cache (spec §4.5, §4.8; ref's m3_kv_layer.index_k under
 * cache_layout paged): [n_blocks, block, Di], one head, key j at row slot(j) = bt[j / block]
 * * block + j % block through the sequence's block table (the KV cache's), element (row, d)
 * at row * Di + d. Elements: M3_KV_BF16, M3_KV_F32, or M3_KV_FP8 (unit scale: the key is
 * fp32(byte) of `kind`). */
typedef struct m3_gpu_index_keys {
    const void *k; /* device */
    m3_kv_elem elem;
    m3_fp8_kind kind;  /* M3_KV_FP8 */
    const int32_t *bt; /* device [>= ceil(n_ctx / block)], NULL: contiguous rows */
    int block;         /* rows per physical block (bt set) */
} m3_gpu_index_keys;
/* m3_gpu_indexer_topk(_path) over such keys, bf16 queries (_f32: fp32 queries). Same
 * results as over the keys gathered into contiguous rows. The fast paths take bf16 queries:
 * decode, wide and tile BF16 keys, decode also FP8 e4m3fn keys (codes decoded to bf16 in
 * registers, exact); per key block one row base when block % B == 0 (M3: block == B == 128,
 * a scoring block is one physical block), the per-row mapping otherwise. Every other
 * combination runs idx_score_k (CUDA cores, any element). */
m3_status m3_gpu_indexer_topk_keys(m3_gpu *g, int path, int32_t *d_topk, float *d_scores,
                                   float *d_margin, int *d_n_ties, const m3_bf16 *d_iq, int ld_q,
                                   const m3_gpu_index_keys *keys, const int32_t *d_pos, int n_tok,
                                   int n_ctx, const struct m3_indexer_params *ip,
                                   const m3_profile *p);
m3_status m3_gpu_indexer_topk_keys_f32(m3_gpu *g, int path, int32_t *d_topk, float *d_scores,
                                       float *d_margin, int *d_n_ties, const float *d_iq, int ld_q,
                                       const m3_gpu_index_keys *keys, const int32_t *d_pos,
                                       int n_tok, int n_ctx, const struct m3_indexer_params *ip,
                                       const m3_profile *p);

/* ---- whole model: gpu/layer.hip, gpu/model.hip, twins of ref/layer.h and ref/model.h ----
 * Activation storage: bf16 when the profile stores bf16 everywhere the bf16 kernels need it
 * (act_bf16, residual_bf16, qk_round != NONE, attn_out_bf16, swiglu != F32: hf, atom), fp32
 * otherwise (fp32 profile). The fp32-storage path calls the _f32 twins, which apply every
 * rounding point of any profile in registers, and rounds GEMM outputs when act_bf16: it is
 * the faithful path for every profile (M3_GPU_STORAGE=f32 forces it). Caches hold the
 * storage type. Stages are downloaded, widened to fp32 and handed to hooks->tap exactly as
 * ref reports them (same keys, shapes, produced dtypes, order). */
struct m3_config;
struct m3_layer_weights;

/* One layer's weights on the device (host struct of device pointers into the arena). */
typedef struct m3_gpu_layer_weights m3_gpu_layer_weights;
/* One layer's KV / index cache on the device: [cap, Hkv, Dh] k and v, [cap, Di] index_k
 * (sparse layers), in the storage type. Owned by the caller (arena memory). */
typedef struct m3_gpu_topk_share m3_gpu_topk_share;
typedef struct m3_gpu_layer_cache {
    int cap, n_past;
    bool bf16;
    void *k, *v, *index_k;
    /* top-k reuse (spec §3.9, twin of ref's m3_layer_cache share / reuse_topk), set per pass
     * by the model: a sparse layer with reuse_topk skips index norm / RoPE / cache insert /
     * scoring and takes share's selection; a computing one records its selection in share
     * (when not NULL). Zero = every sparse layer computes. */
    m3_gpu_topk_share *share;
    bool reuse_topk;
    /* paged-cache reads and fp8 caches (ref/variant.h, docs/caches.md), set by the model from
     * its variant (all NULL / false = the plain contiguous caches):
     *   kv: cache_layout paged: this layer's paged KV storage (ref's m3_kv_layer on the
     *     device: page-Bs SHUFFLE view for dense layers, page-P re-view for sparse ones; bf16,
     *     fp32 or fp8 elements with per (token, head) scales; kv.bt the sequence's block
     *     table, shared by the layers). Every pass writes its K/V rows into it by ref's writer
     *     rule (§4.7: atom dense / reusing layers quantize the unrounded fp32 k with FP8_MAX
     *     240, atom computing sparse layers bf16(k) with the kind's maximum and the fp32 amax,
     *     other profiles the k they hold); sparse layers (prefill and decode) and dense decode
     *     passes attend through it (m3_gpu_attn_paged), dense prefill over the unquantized
     *     contiguous k / v, as ref. kv.k == NULL: none;
     *   ix (sparse layers under cache_layout paged): the index cache as ref's m3_kv_layer
     *     index_k stores it (§4.5, §4.8): [n_blocks, Bs, Di] elements (bf16, fp32 under the
     *     fp32 profile, or fp8 at unit scale: cvt(bf16(key))), key of position p at row
     *     slot(p) through ix.bt (= kv.bt); every pass writes its keys there and the indexer
     *     reads them through the table (index_k, the contiguous cache, is then not allocated
     *     by the model). ix.k == NULL: the contiguous index_k;
     *   paged: cache_layout paged (the prefill's index query is cast to fp8 when the variant
     *     says so, as ref does on paged caches only). */
    m3_gpu_attn_paged_src kv;
    m3_gpu_index_keys ix;
    const struct m3_variant *variant; /* fp8 kind, overflow, kv_fp8max, index q rule */
    bool paged;
} m3_gpu_layer_cache;
/* The selection of the most recent computing sparse layer of the current pass. */
struct m3_gpu_topk_share {
    int layer;      /* -1: no sparse layer computed one in this pass yet */
    int n_tok, width;
    int32_t *topk;  /* device [G, T, width] (arena memory of the pass) */
    size_t cap;     /* int32 entries topk holds */
};

/* Options of the whole-model forward. */
typedef struct m3_gpu_model_opts {
    bool flash;        /* attention through the *_flash kernels where their shape contract
                          holds (bf16 storage); elsewhere the faithful kernels */
    bool f32_storage;  /* fp32 activations and caches whatever the profile */
    int resident;      /* 1 keep every layer's weights on the device, 0 upload each layer
                          per pass (streaming, as ref), -1 auto (resident when they fit in
                          half the arena) */
} m3_gpu_model_opts;
/* Defaults, then the environment: M3_GPU_ATTN=flash|faithful, M3_GPU_STORAGE=f32|auto,
 * M3_GPU_RESIDENT=0|1. */
void m3_gpu_model_opts_default(m3_gpu_model_opts *o);

/* Device bytes m3_gpu_layer_weights_upload takes for layer `layer` (an upper bound). */
size_t m3_gpu_layer_weights_bytes(const struct m3_config *c, int layer, bool bf16);
/* Upload ref's host views of one layer (ref/layer.h m3_layer_weights_load) into the arena.
 * bf16 storage needs bf16 linears (M3_ERR_UNSUPPORTED names the tensor otherwise); fp32
 * storage widens them exactly. The router gate is held per p->router_dtype. Free the host
 * struct with m3_gpu_layer_weights_free; the device memory goes with the arena release. */
m3_status m3_gpu_layer_weights_upload(m3_gpu *g, m3_gpu_layer_weights **out,
                                      const struct m3_layer_weights *hw,
                                      const struct m3_config *c, const m3_profile *p, bool bf16);
void m3_gpu_layer_weights_free(m3_gpu_layer_weights *w); /* NULL ok */
/* The routed experts of an uploaded MoE layer as m3_gpu_moe_experts takes them (device
 * pointers: codes / scales of MX formats, in ref's layout and bytes; act_in / act_mid the
 * layer's activation quantization, n_pass 0), E experts (+ the fused shared expert as slot E
 * when it has the routed width: *n_slot = E + 1). shared (may be NULL): the shared expert's
 * own arrays in the same form ([Fs, D] x2, [D, Fs]); all NULL when there is none or it is
 * slot E. M3_ERR_ARG for a dense-MLP layer. */
m3_status m3_gpu_layer_weights_experts(const m3_gpu_layer_weights *w, m3_gpu_experts *routed,
                                       int *n_slot, m3_gpu_experts *shared);
/* Allocate a layer's cache of `cap` rows from the arena (n_past = 0). */
m3_status m3_gpu_layer_cache_alloc(m3_gpu *g, m3_gpu_layer_cache *c, const struct m3_config *cfg,
                                   bool sparse, int cap, bool bf16);

/* Twin of ref's m3_layer_forward: x, h [T, D] device in the storage type (same in/out
 * contract as ref: x the stored residual, h the pending FFN output), d_pos [T] device and
 * h_pos [T] host (both n_past + t). Temporaries come from the arena and are released before
 * return. Teacher-forced selections (hooks->force_selection) are fetched on the host,
 * checked as ref checks them and uploaded. */
m3_status m3_gpu_layer_forward(m3_gpu *g, void *d_x, void *d_h, bool *h_pending, int n_tok,
                               const int32_t *d_pos, const int32_t *h_pos,
                               const m3_gpu_layer_weights *w, const struct m3_config *c,
                               const m3_profile *p, m3_gpu_layer_cache *cache,
                               const m3_hooks *hooks, const char *prefix,
                               const m3_gpu_model_opts *o);

/* The whole model on one device, twin of ref/model.h. It owns the context's arena above the
 * mark at open: resident weights, then the caches, then each pass's temporaries. */
typedef struct m3_gpu_model m3_gpu_model;
m3_status m3_gpu_model_open(m3_gpu_model **m, m3_gpu *g, const char *model_dir,
                            const char *override_json, const m3_profile *p,
                            const m3_gpu_model_opts *o);
void m3_gpu_model_close(m3_gpu_model *m); /* NULL ok; releases the arena to its open mark */
const struct m3_config *m3_gpu_model_config(const m3_gpu_model *m);
int m3_gpu_model_n_past(const m3_gpu_model *m);
void m3_gpu_model_reset(m3_gpu_model *m);
/* Twin of m3_model_set_variant: the numerics variant (ref/variant.h) of later passes; call it
 * before the first forward (the caches are emptied). Keys the GPU forward does not implement
 * fail with M3_ERR_UNSUPPORTED naming them; the model keeps its previous variant then. */
struct m3_variant;
m3_status m3_gpu_model_set_variant(m3_gpu_model *m, const struct m3_variant *v);
/* "bfloat16" or "float32": the activation storage chosen at open. */
const char *m3_gpu_model_storage(const m3_gpu_model *m);
/* Layer `layer`'s device cache (tests: the paged index cache's bytes), NULL when out of range
 * or before the first reserve. */
const m3_gpu_layer_cache *m3_gpu_model_layer_cache(const m3_gpu_model *m, int layer);
/* Size the caches for n_ctx tokens. Allowed while the caches are empty (a forward at
 * n_past 0 reserves what it needs); a pass that would outgrow filled caches fails with
 * M3_ERR_ARG, so a decode loop reserves prompt + steps first. */
m3_status m3_gpu_model_reserve(m3_gpu_model *m, int n_ctx);
/* Twin of m3_model_forward (same arguments, same stages, same cache semantics). */
m3_status m3_gpu_model_forward(m3_gpu_model *m, const int32_t *tokens, const int32_t *pos,
                               int n_tok, const m3_hooks *hooks, const char *prefix,
                               float *logits_last, int32_t *next);

#ifdef __cplusplus
}
#endif
#endif
