/* gpu/layer.hip: one decoder layer on the device, twin of ref/layer.c (spec §3): weight
 * upload, the device KV / index cache, and the wiring of the component kernels in ref's
 * order, with ref's dump taps and teacher-forcing points. Wiring only, as ref/layer.c: every
 * number comes from a component kernel (gpu/norm, rope, attn, indexer, moe, mlp) or the
 * vendor GEMM; the few kernels here are the glue ref does in plain loops (a GEMM output
 * rounding, the routed + shared add) and the generic routed-expert path for shapes the
 * tiled m3_gpu_moe_experts does not take (D % 128, F % 64: the tiny fixtures).
 *
 * Storage (m3_gpu.h): TS = m3_bf16 (bf16 kernels, production) or float (the _f32 twins,
 * every profile's rounding points applied in registers). Both are instantiated from one
 * template, so the two paths cannot drift apart in wiring.
 * Numerics against ref: GEMM reduction order is cuBLAS's (NMSE, never bit for bit), the
 * generic expert dots are sequential fp32 sums (ref: OpenBLAS / m3_dot_f32 order); every
 * rounding point is the component's. Taps download the stage, widen it to fp32 and call
 * hooks->tap with ref's key, shape and produced dtype (m3_stage_dtype).
 * Tests: tests/gpu_model.c (whole model against ref through the comparison engine). */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "gpu/kv_paged.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/attn.h"
#include "ref/config.h"
#include "ref/indexer.h"
#include "ref/layer.h"
#include "ref/moe.h"
#include "ref/norm.h"
#include "ref/num/act.h"
#include "ref/num/bf16.h"
#include "ref/num/fp8.h"
#include "ref/num/mx.h"
#include "ref/qload.h"
#include "ref/quant.h"

#define GLUE_THREADS 128
#define GEN_MAX_K 64 /* generic expert combine: experts per token */

struct m3_gpu_layer_weights {
    int layer;
    bool sparse, moe, bf16, has_shared;
    const m3_bf16 *in_norm, *post_norm, *q_norm, *k_norm, *iq_norm, *ik_norm; /* bf16 [n] */
    const void *q, *k, *v, *o, *iq, *ik;   /* TS [out, in] */
    const void *mg, *mu, *md;              /* dense MLP, TS */
    /* ptpc (ref m3_qload_ptpc): the matrices above hold fp8 code values (exact in the storage
     * type), these their per-output-channel scales [out]; NULL = a plain projection */
    const float *q_s, *k_s, *v_s, *o_s, *iq_s, *ik_s, *mg_s, *mu_s, *md_s;
    m3_actq ptpc;                          /* per-token fp8 activations (ref's q->ptpc) */
    /* Experts stacked, [E(+1), F, D] x2 and [E(+1), D, F]: TS (BF16), or MX codes [rows,
     * row_bytes] with e8m0 scales [rows, ceil(in/32)] (ref's quantize-on-load codes, as
     * m3_layer_weights_load_v made them). Slot E holds the shared expert when it runs fused
     * and has the routed width (shared_slot); the tiled kernels then take it as expert E. */
    m3_gpu_wfmt efmt;
    const void *eg, *eu, *ed;
    const m3_e8m0 *egs, *eus, *eds;
    const void *sg, *su, *sd;              /* shared expert (own arrays): TS or MX codes */
    const m3_e8m0 *sgs, *sus, *sds;
    m3_gpu_wfmt sfmt;
    bool shared_fused;                     /* ref's lw->shared_fused (spec §3.14) */
    bool shared_slot;                      /* the shared expert is slot E of the expert arrays */
    bool e_nan, s_nan;                     /* MXFP8 routed / shared codes hold an e4m3 NaN code */
    /* the smallest / largest e8m0 block scale byte of the routed / shared MX matrices (the
     * upload's scan; m3_gpu_experts.mx_scale_lo / hi) */
    int e_sc_lo, e_sc_hi, s_sc_lo, s_sc_hi;
    int n_expert;                          /* E */
    /* activation quantization of the MX experts (copies of ref's m3_wq.act; kind NONE = none) */
    m3_actq act_in, act_mid;
    const float *gate_f32;                 /* router gate [E, D] (router_dtype F32) */
    const m3_bf16 *gate_bf16;              /* router gate held in bf16 (router_dtype BF16) */
    const float *bias;                     /* [E] fp32 or NULL */
};

/* ---- glue kernels ------------------------------------------------------------------------ */
static __device__ __forceinline__ float ldv(const float *p, size_t i) { return p[i]; }
static __device__ __forceinline__ float ldv(const m3_bf16 *p, size_t i) { return m3_bf16_to_f32(p[i]); }
static __device__ __forceinline__ void stv(float *p, size_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void stv(m3_bf16 *p, size_t i, float v) { p[i] = m3_f32_to_bf16(v); }

static __device__ __forceinline__ float swiglu_mode(float g, float u, float alpha, float limit,
                                                    int mode) {
    if (mode == M3_SWIGLU_BF16_PER_OP) return m3_swiglu_oai_bf16ops(g, u, alpha, limit);
    const float a = m3_swiglu_oai(g, u, alpha, limit);
    return mode == M3_SWIGLU_BF16_ONCE ? m3_round_bf16(a) : a;
}

/* x = bf16(x): the act_bf16 rounding of an fp32-storage GEMM output */
static __global__ void __launch_bounds__(GLUE_THREADS) round_k(float *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = m3_round_bf16(x[i]);
}

/* y = y + s, rounded to bf16 when rnd (ref m3_moe_add_shared) */
template <typename TS>
static __global__ void __launch_bounds__(GLUE_THREADS) add_k(TS *y, const TS *s, int64_t n, bool rnd) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = __fadd_rn(ldv(y, i), ldv(s, i));
        stv(y, i, rnd ? m3_round_bf16(v) : v);
    }
}

/* One weight matrix of the generic expert path, [rows, K] with expert e's row r at row
 * e*N + r: TS elements (BF16 = the storage type), or MX codes (rb bytes per row; e2m1 pairs
 * low nibble first, or e4m3fn bytes) with e8m0 scales [rows, nb] of 32-element blocks along
 * K, decoded exactly as ref's GEMM decodes them (ref/num/mx.h: code value * 2^(s-127)). */
struct gen_w {
    int fmt; /* m3_gpu_wfmt */
    const void *p;
    const m3_e8m0 *s;
    int64_t rb;
    int nb;
};

template <typename TS>
static __device__ __forceinline__ float wat(const gen_w &w, size_t row, int K, int k) {
    if (w.fmt == M3_GPU_W_BF16) return ldv((const TS *)w.p, row * (size_t)K + (size_t)k);
    const uint8_t *cr = (const uint8_t *)w.p + row * (size_t)w.rb;
    const m3_e8m0 b = w.s[row * (size_t)w.nb + (size_t)(k / 32)];
    if (w.fmt == M3_GPU_W_MXFP4) return m3_mx_decode(m3_fp4_get(cr, k, false), b, M3_MX_E2M1);
    return m3_mx_decode(cr[k], b, M3_MX_E4M3FN);
}

static const m3_actq *act_or_null(const m3_actq *a) { return a->kind == M3_ACTQ_NONE ? NULL : a; }

/* MX activation quantization (ref linear.c actq_row): each row of x [rows, n] quantized and
 * dequantized block by block along n with ref's own block code (m3_mx_quantize_block), into
 * fp32 xq. One thread per block. */
#define ACTQ_MAX_BLOCK 32
template <typename TX>
static __global__ void __launch_bounds__(GLUE_THREADS)
    actq_mx_k(float *xq, const TX *x, int64_t rows, int n, m3_mx_params mp) {
    const int nbk = (n + mp.block - 1) / mp.block;
    const int64_t total = rows * nbk;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / nbk;
        const int k0 = (int)(i % nbk) * mp.block;
        const int m = n - k0 < mp.block ? n - k0 : mp.block;
        float v[ACTQ_MAX_BLOCK];
        uint8_t c[ACTQ_MAX_BLOCK];
        for (int j = 0; j < m; j++) v[j] = ldv(x, (size_t)r * n + k0 + j);
        const m3_e8m0 b = m3_mx_quantize_block(c, v, m, &mp);
        for (int j = 0; j < m; j++) xq[(size_t)r * n + k0 + j] = m3_mx_decode(c[j], b, mp.elem);
    }
}

/* Generic routed experts, entry i = t*K + k (the tiled kernels' shape contract aside, this
 * is ref's m3_mlp_pass per (token, expert) pair): a[i, f] = swiglu(g, u) with g, u the fp32
 * dots of x[t] (TX: the storage type, or fp32 after activation quantization) with row f of
 * the expert's gate / up (rounded to bf16 under act_bf16, as m3_linear_q), sequential order
 * over D. An id outside [0, E) gives a = 0 (ref rejects such ids before any math; the wiring
 * checks teacher-forced ids on the host). */
template <typename TS, typename TX>
static __global__ void __launch_bounds__(GLUE_THREADS)
    gen_gu_k(TS *a, const TX *x, const int32_t *ids, gen_w wg, gen_w wu, int K, int E, int D,
             int F, float alpha, float limit, int mode, bool act_bf16) {
    const int i = (int)blockIdx.x, f = (int)(blockIdx.y * blockDim.x + threadIdx.x);
    if (f >= F) return;
    const int e = ids[i], t = i / K;
    float out = 0.0f;
    if (e >= 0 && e < E) {
        const TX *xr = x + (size_t)t * D;
        const size_t row = (size_t)e * F + f;
        float gv = 0.0f, uv = 0.0f;
        for (int d = 0; d < D; d++) {
            const float xv = ldv(xr, d);
            gv = __fadd_rn(gv, __fmul_rn(xv, wat<TS>(wg, row, D, d)));
            uv = __fadd_rn(uv, __fmul_rn(xv, wat<TS>(wu, row, D, d)));
        }
        if (act_bf16) gv = m3_round_bf16(gv), uv = m3_round_bf16(uv);
        out = swiglu_mode(gv, uv, alpha, limit, mode);
    }
    stv(a, (size_t)i * F + f, out);
}

/* ye[i, d] = a[i] . down_e[d] (fp32, sequential over F), bf16 under act_bf16 */
template <typename TS, typename TX>
static __global__ void __launch_bounds__(GLUE_THREADS)
    gen_down_k(TS *ye, const TX *a, const int32_t *ids, gen_w wd, int E, int D, int F,
               bool act_bf16) {
    const int i = (int)blockIdx.x, d = (int)(blockIdx.y * blockDim.x + threadIdx.x);
    if (d >= D) return;
    const int e = ids[i];
    float acc = 0.0f;
    if (e >= 0 && e < E) {
        const TX *ar = a + (size_t)i * F;
        const size_t row = (size_t)e * D + d;
        for (int f = 0; f < F; f++) acc = __fadd_rn(acc, __fmul_rn(ldv(ar, f), wat<TS>(wd, row, F, f)));
        if (act_bf16) acc = m3_round_bf16(acc);
    }
    stv(ye, (size_t)i * D + d, acc);
}

/* y[t] = rnd(rsf * R), R = sum_k w_k ye_k in ascending expert id (ref m3_moe_experts):
 * hf: bf16(R + bf16(ye * w)) per step; otherwise unfused fp32 mul and add. fused (ref
 * m3_moe_experts_fused, spec §3.14): the weights are w_k * rsf (one fp32 product), the
 * shared expert's output sh [T, D] is added last with weight 1 (as expert E), no final rsf. */
template <typename TS>
static __global__ void __launch_bounds__(GLUE_THREADS)
    gen_combine_k(TS *y, const TS *ye, const int32_t *ids, const float *wts, int K, int E, int D,
                  float rsf, bool bf16_combine, bool rnd, bool fused, const TS *sh) {
    const int t = (int)blockIdx.x;
    int ord[GEN_MAX_K];
    int n = 0;
    for (int k = 0; k < K; k++) { /* insertion by ascending id (stable for equal ids) */
        const int id = ids[t * K + k];
        if (id < 0 || id >= E) continue;
        int j = n++;
        while (j > 0 && ids[t * K + ord[j - 1]] > id) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = k;
    }
    for (int d = (int)threadIdx.x; d < D; d += (int)blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) {
            const int i = t * K + ord[j];
            const float wk = fused ? __fmul_rn(wts[i], rsf) : wts[i];
            const float prod = __fmul_rn(ldv(ye, (size_t)i * D + d), wk);
            acc = bf16_combine ? m3_round_bf16(acc + m3_round_bf16(prod)) : __fadd_rn(acc, prod);
        }
        if (sh) {
            const float sv = ldv(sh, (size_t)t * D + d);
            acc = bf16_combine ? m3_round_bf16(acc + sv) : __fadd_rn(acc, sv);
        }
        const float v = fused ? acc : __fmul_rn(rsf, acc);
        stv(y, (size_t)t * D + d, rnd ? m3_round_bf16(v) : v);
    }
}

/* fused shared expert on the tiled kernels: ids/wts [T, K+1], entry K the shared expert (id
 * E, weight 1), the routed weights w * rsf (ref m3_moe_experts_fused) */
static __global__ void __launch_bounds__(GLUE_THREADS)
    fuse_sel_k(int32_t *ids2, float *wts2, const int32_t *ids, const float *wts, int T, int K,
               int E, float rsf) {
    const int64_t n = (int64_t)T * (K + 1);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / (K + 1);
        const int k = (int)(i % (K + 1));
        ids2[i] = k < K ? ids[t * K + k] : E;
        wts2[i] = k < K ? __fmul_rn(wts[t * K + k], rsf) : 1.0f;
    }
}

/* ---- paged caches (ref/kvcache.c writers, spec §4.1-4.3, §4.7-4.8) ------------------------ */
/* This pass's K / V rows into the paged storage (ref m3_kv_write at slot(pos[t]) through the
 * block table; gpu/kv_paged.h addressing, any geometry): one thread per (token, head, K or
 * V) row. K stores kf (the unrounded fp32 k: atom's dense / reusing writers) when kval_f32,
 * else k; its fp8 amax comes from kf when kamax_f32 (atom's computing sparse writer), else
 * from the stored values; V from v. fp8: amax NaN-sticky (ref amax_of), scale = amax /
 * fp8_max (1 when amax is 0), byte = cvt(value / scale) with a true fp32 division, RNE, the
 * overflow rule; bf16 elements RNE, fp32 as is. gpu/kvcache.hip's m3_gpu_kv_cache_write covers
 * none of atom's K writers (it quantizes the bf16 k with its own amax, e4m3fn, page 128 / 16
 * and Dh % x == 0 only, where the tiny fixtures have Bs = 8, P = 1, Dh = 12 / 16), hence
 * this kernel. */
template <typename TS>
static __global__ void __launch_bounds__(GLUE_THREADS)
    kvp_write_k(m3_gpu_attn_paged_src c, const TS *k, const float *kf, const TS *v,
                const int32_t *pos, int T, float fp8_max, bool kval_f32, bool kamax_f32) {
    void *kd = (void *)c.k, *vd = (void *)c.v; /* the layer's own storage */
    float *ksc = (float *)c.k_scale, *vsc = (float *)c.v_scale;
    const int Hkv = c.g.n_kv, Dh = c.g.head_dim;
    const int64_t n = (int64_t)T * Hkv * 2;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const bool is_v = (i & 1) != 0;
        const int64_t row = i >> 1; /* t * Hkv + h */
        const int t = (int)(row / Hkv), h = (int)(row % Hkv);
        const int64_t slot = m3_dkv_slot(c.bt, c.g.block, pos[t]);
        const size_t o = (size_t)row * Dh;
        const bool vf = !is_v && kval_f32, af = !is_v && kamax_f32;
        const TS *src = is_v ? v : k;
        float sc = 1.0f;
        if (c.g.elem == M3_KV_FP8) {
            float a = 0.0f;
            for (int d = 0; d < Dh; d++) {
                const float x = fabsf(af ? kf[o + d] : ldv(src, o + d));
                if (x > a || x != x) a = x; /* NaN poisons the scale, as max() would */
            }
            sc = a == 0.0f ? 1.0f : __fdiv_rn(a, fp8_max);
            (is_v ? vsc : ksc)[m3_dkv_off_scale(c.g, c.view, slot, h)] = sc;
        }
        for (int d = 0; d < Dh; d++) {
            float x = vf ? kf[o + d] : ldv(src, o + d);
            if (c.g.elem == M3_KV_FP8) x = __fdiv_rn(x, sc);
            const int64_t off = is_v ? m3_dkv_off_v(c.g, c.view, slot, h, d)
                                     : m3_dkv_off_k(c.g, c.view, slot, h, d);
            m3_dkv_put(is_v ? vd : kd, c.g, off, x, c.ovf);
        }
    }
}

/* fp32 rows rounded to bf16 values in the storage type (atom: k after its one rounding) */
template <typename TS>
static __global__ void __launch_bounds__(GLUE_THREADS)
    round_bf16_k(TS *y, const float *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        stv(y, (size_t)i, m3_round_bf16(x[i]));
}

/* index keys [T, Di] into the paged index cache at row slot(pos[t]) (ref m3_kv_index_write,
 * §4.5, §4.8): fp32 elements as is, bf16 RNE, fp8 cvt(bf16(key)) at unit scale */
template <typename TS>
static __global__ void __launch_bounds__(GLUE_THREADS)
    ixp_write_k(m3_gpu_index_keys c, const TS *ik, const int32_t *pos, int T, int Di, int ovf) {
    const int64_t n = (int64_t)T * Di;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int t = (int)(i / Di), d = (int)(i % Di);
        const int64_t off = m3_dkv_slot(c.bt, c.block, pos[t]) * Di + d;
        const float v = ldv(ik, i);
        if (c.elem == M3_KV_F32) ((float *)c.k)[off] = v;
        else if (c.elem == M3_KV_BF16) ((m3_bf16 *)c.k)[off] = m3_f32_to_bf16(v);
        else ((uint8_t *)c.k)[off] = m3_f32_to_fp8(m3_round_bf16(v), c.kind, (m3_fp8_overflow)ovf);
    }
}

/* y = fp8 rounding of x as fp32 (round_fp8 = 0: a plain widening) */
template <typename TS>
static __global__ void __launch_bounds__(GLUE_THREADS)
    widen_k(float *y, const TS *x, int64_t n, bool round_fp8, int kind, int ovf) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = ldv(x, i);
        y[i] = round_fp8 ? m3_round_fp8(v, (m3_fp8_kind)kind, (m3_fp8_overflow)ovf) : v;
    }
}

static unsigned glue_grid(int64_t n) {
    return m3_grid_1d(n < 65536 * 4 ? n : 65536 * 4, GLUE_THREADS);
}

/* ---- ptpc (ref linear.c m3_linear_q with an FP8_ROW weight, ref/quant.c rows) ---------- */
/* Per-token fp8 of x [T, K], one block per row: amax (NaN sticky, exact in any order), s =
 * amax * (1/FP8_MAX) (RCP) or amax / FP8_MAX (DIV), 1 for a zero row under zero_row one;
 * q = cvt(x * (1/s)) (RCP) or cvt(x / s); xq gets the code values (exact in bf16), sx[t] = s. */
template <typename TS>
static __global__ void __launch_bounds__(GLUE_THREADS)
    ptpc_act_k(TS *xq, float *sx, const TS *x, int K, int kind, int ovf, bool zero_one, bool rcp,
               float fp8_max) {
    __shared__ float sm[GLUE_THREADS];
    __shared__ int sn[GLUE_THREADS];
    const int t = (int)blockIdx.x, tid = (int)threadIdx.x;
    const TS *xr = x + (size_t)t * K;
    float a = 0.0f;
    int nan = 0;
    for (int j = tid; j < K; j += GLUE_THREADS) {
        const float v = fabsf(ldv(xr, j));
        if (v != v) nan = 1;
        else a = fmaxf(a, v);
    }
    sm[tid] = a;
    sn[tid] = nan;
    __syncthreads();
    for (int h = GLUE_THREADS / 2; h > 0; h >>= 1) {
        if (tid < h) {
            sm[tid] = fmaxf(sm[tid], sm[tid + h]);
            sn[tid] |= sn[tid + h];
        }
        __syncthreads();
    }
    const float amax = sn[0] ? __int_as_float(0x7FC00000) : sm[0];
    float s;
    if (amax == 0.0f && zero_one) s = 1.0f;
    else if (rcp) s = __fmul_rn(amax, __fdiv_rn(1.0f, fp8_max));
    else s = __fdiv_rn(amax, fp8_max);
    if (tid == 0) sx[t] = s;
    const float rs = __fdiv_rn(1.0f, s);
    for (int j = tid; j < K; j += GLUE_THREADS) {
        const float v = ldv(xr, j);
        const m3_fp8 c = m3_f32_to_fp8(rcp ? __fmul_rn(v, rs) : __fdiv_rn(v, s), (m3_fp8_kind)kind,
                                       (m3_fp8_overflow)ovf);
        stv(xq, (size_t)t * K + j, m3_fp8_to_f32(c, (m3_fp8_kind)kind));
    }
}

/* y = rnd((acc * s_x[t]) * s_w[n]) (ref's epilogue order), bf16 under act_bf16 */
template <typename TS>
static __global__ void __launch_bounds__(GLUE_THREADS)
    ptpc_epi_k(TS *y, const float *acc, const float *sx, const float *sw, int T, int N, bool rnd) {
    const int64_t n = (int64_t)T * N;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = __fmul_rn(__fmul_rn(acc[i], sx[i / N]), sw[i % N]);
        stv(y, (size_t)i, rnd ? m3_round_bf16(v) : v);
    }
}

/* ---- host wiring helpers (declared in gpu_internal.h, used by gpu/model.hip) ---------- */
m3_status m3_gpu_dl_(m3_gpu *g, float *h, const float *d, size_t n) {
    return m3_gpu_download(g, h, d, n * sizeof(float));
}
m3_status m3_gpu_dl_(m3_gpu *g, float *h, const m3_bf16 *d, size_t n) {
    m3_bf16 *tmp = (m3_bf16 *)malloc(n * sizeof *tmp + 1);
    if (!tmp) return m3_errorf(M3_ERR_NOMEM, "gpu: download of %zu values: out of memory", n);
    m3_status s = m3_gpu_download(g, tmp, d, n * sizeof *tmp);
    for (size_t i = 0; s == M3_OK && i < n; i++) h[i] = m3_bf16_to_f32(tmp[i]);
    free(tmp);
    return s;
}
m3_status m3_gpu_ul_(m3_gpu *g, float *d, const float *h, size_t n) {
    return m3_gpu_upload(g, d, h, n * sizeof(float));
}
m3_status m3_gpu_ul_(m3_gpu *g, m3_bf16 *d, const float *h, size_t n) {
    m3_bf16 *tmp = (m3_bf16 *)malloc(n * sizeof *tmp + 1);
    if (!tmp) return m3_errorf(M3_ERR_NOMEM, "gpu: upload of %zu values: out of memory", n);
    for (size_t i = 0; i < n; i++) tmp[i] = m3_f32_to_bf16(h[i]);
    m3_status s = m3_gpu_upload(g, d, tmp, n * sizeof *tmp);
    free(tmp);
    return s;
}

m3_status m3_gpu_linear_(m3_gpu *g, m3_bf16 *y, const m3_bf16 *x, const void *w, int T, int N,
                         int K, const m3_profile *p) {
    (void)p; /* bf16 storage implies act_bf16: the GEMM's one rounding is the profile's */
    return m3_gpu_gemm_bf16(g, y, x, (const m3_bf16 *)w, T, N, K);
}
m3_status m3_gpu_linear_(m3_gpu *g, float *y, const float *x, const void *w, int T, int N, int K,
                         const m3_profile *p) {
    M3_TRY(m3_gpu_gemm_f32(g, y, x, (const float *)w, T, N, K));
    if (p->act_bf16 && T > 0) {
        const int64_t n = (int64_t)T * N;
        round_k<<<m3_grid_1d(n < 65536 * 4 ? n : 65536 * 4, GLUE_THREADS), GLUE_THREADS, 0,
                  g->stream>>>(y, n);
        M3_LAUNCHED(g, "round_k");
    }
    return M3_OK;
}

m3_status m3_gpu_norm_add_(m3_gpu *g, m3_bf16 *y, m3_bf16 *r, const m3_bf16 *h, const m3_bf16 *w,
                           int T, int D, float eps, const m3_profile *p) {
    return m3_gpu_rmsnorm_add(g, y, r, h, w, T, D, eps, p);
}
m3_status m3_gpu_norm_add_(m3_gpu *g, float *y, float *r, const float *h, const m3_bf16 *w, int T,
                           int D, float eps, const m3_profile *p) {
    return m3_gpu_rmsnorm_add_f32(g, y, r, h, w, T, D, eps, p);
}

/* n elements of a checkpoint matrix (fmt M3_WFMT_BF16 / F32) into dst in the storage type.
 * bf16 storage takes bf16 only (rounding fp32 weights would change the math); fp32 storage
 * widens bf16 exactly on the device through an arena temporary. */
m3_status m3_gpu_upload_mat_(m3_gpu *g, void *dst, bool bf16, int fmt, const void *src, size_t n,
                             const char *what) {
    if (bf16) {
        if (fmt != M3_WFMT_BF16)
            return m3_errorf(M3_ERR_UNSUPPORTED,
                             "gpu: %s is not stored in bf16; the bf16-storage path takes bf16 "
                             "weights only (use M3_GPU_STORAGE=f32)",
                             what);
        return m3_gpu_upload(g, dst, src, n * sizeof(m3_bf16));
    }
    if (fmt == M3_WFMT_F32) return m3_gpu_upload(g, dst, src, n * sizeof(float));
    const size_t mark = m3_gpu_mark(g);
    void *tmp;
    M3_TRY(m3_gpu_alloc(g, &tmp, n * sizeof(m3_bf16)));
    m3_status s = m3_gpu_upload(g, tmp, src, n * sizeof(m3_bf16));
    if (s == M3_OK) s = m3_gpu_bf16_to_f32(g, (float *)dst, (const m3_bf16 *)tmp, (int64_t)n);
    if (s == M3_OK) s = m3_gpu_sync(g); /* the temporary is reused by the next allocation */
    m3_gpu_release(g, mark);
    return s;
}

/* ---- weights ----------------------------------------------------------------------------- */
static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

extern "C" size_t m3_gpu_layer_weights_bytes(const m3_config *c, int L, bool bf16) {
    const size_t es = bf16 ? 2 : 4, D = (size_t)c->hidden, Dh = (size_t)c->head_dim;
    const size_t QW = (size_t)c->n_head * Dh, KW = (size_t)c->n_kv_head * Dh;
    size_t n = 2 * al256(D * 2) + 2 * al256(Dh * 2);
    n += al256(QW * D * es) + 2 * al256(KW * D * es) + al256(D * QW * es);
    if (c->layer_sparse[L]) {
        const size_t G = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
        n += al256(G * Di * D * es) + al256(Di * D * es) + 2 * al256(Di * 2);
    }
    if (!c->layer_moe[L]) {
        n += 3 * al256((size_t)c->dense_inter * D * es);
    } else {
        const size_t E = (size_t)c->n_expert, F = (size_t)c->expert_inter;
        n += 2 * al256(E * D * 4) + al256(E * 4);
        n += 3 * al256(E * F * D * es);
        if (c->n_shared_experts > 0 && c->shared_inter > 0)
            n += 3 * al256((size_t)c->shared_inter * D * es);
    }
    /* + one widening temporary (fp32 storage) of the largest matrix */
    return n + (bf16 ? 0 : al256((size_t)c->n_expert * c->expert_inter * D * 2 + QW * D * 2)) + 4096;
}

static m3_status up_norm(m3_gpu *g, const m3_bf16 **d, const m3_bf16 *h, int n) {
    void *p;
    M3_TRY(m3_gpu_alloc(g, &p, (size_t)n * sizeof(m3_bf16)));
    M3_TRY(m3_gpu_upload(g, p, h, (size_t)n * sizeof(m3_bf16)));
    *d = (const m3_bf16 *)p;
    return M3_OK;
}

/* a ptpc projection (ref m3_qload_ptpc: an m3_wq of fp8 codes [N, K] and scales [N], with
 * per-token fp8 activations): the code values, exact in bf16 and fp32, as a storage-type
 * matrix the vendor GEMM reads, the scales apart (the epilogue applies them) */
static m3_status up_ptpc(m3_gpu *g, const void **d, const float **ds, m3_actq *act, bool bf16,
                         const m3_wmat *wm) {
    const m3_wq *q = (const m3_wq *)wm->data;
    if (!q->act || q->act->kind != M3_ACTQ_PTPC)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu: an fp8 per-channel weight without ptpc "
                         "activations");
    const size_t N = (size_t)wm->n_out, n = N * (size_t)wm->n_in, es = bf16 ? 2 : 4;
    const m3_fp8 *codes = (const m3_fp8 *)q->codes;
    const m3_fp8_kind kind = q->act->fp8.kind;
    void *h = malloc(n * es + 1), *p, *sp;
    if (!h) return m3_errorf(M3_ERR_NOMEM, "ptpc weights: out of memory");
    for (size_t i = 0; i < n; i++) {
        const float v = m3_fp8_to_f32(codes[i], kind);
        if (bf16) ((m3_bf16 *)h)[i] = m3_f32_to_bf16(v); /* exact: 3 mantissa bits */
        else ((float *)h)[i] = v;
    }
    m3_status s = m3_gpu_alloc(g, &p, n * es);
    if (s == M3_OK) s = m3_gpu_upload(g, p, h, n * es);
    free(h);
    M3_TRY(s);
    M3_TRY(m3_gpu_alloc(g, &sp, N * sizeof(float)));
    M3_TRY(m3_gpu_upload(g, sp, q->scale, N * sizeof(float)));
    *d = p;
    *ds = (const float *)sp;
    *act = *q->act;
    return M3_OK;
}

/* a dense matrix into the storage type; ds / act (may be NULL) take a ptpc matrix */
static m3_status up_mat(m3_gpu *g, const void **d, bool bf16, const m3_wmat *wm, int L,
                        const char *name, const float **ds = NULL, m3_actq *act = NULL) {
    if (ds) *ds = NULL;
    if (wm->fmt == M3_WFMT_FP8_ROW) {
        if (!ds || !act)
            return m3_errorf(M3_ERR_UNSUPPORTED, "gpu: layer %d %s: fp8 per-channel weights "
                             "here", L, name);
        return up_ptpc(g, d, ds, act, bf16, wm);
    }
    const size_t n = (size_t)wm->n_out * (size_t)wm->n_in;
    void *p;
    M3_TRY(m3_gpu_alloc(g, &p, n * (bf16 ? 2 : 4)));
    char what[96];
    snprintf(what, sizeof what, "layer %d %s", L, name);
    M3_TRY(m3_gpu_upload_mat_(g, p, bf16, (int)wm->fmt, wm->data, n, what));
    *d = p;
    return M3_OK;
}

static m3_status up_mlp(m3_gpu *g, const void **dg, const void **du, const void **dd, bool bf16,
                        const m3_mlp_weights *mw, int D, int F, int L, const char *name,
                        const float **sg = NULL, const float **su = NULL,
                        const float **sd = NULL, m3_actq *act = NULL) {
    m3_wmat wg = {mw->fmt, mw->gate, F, D}, wu = {mw->fmt, mw->up, F, D},
            wd = {mw->fmt, mw->down, D, F};
    char nm[64];
    snprintf(nm, sizeof nm, "%s gate_proj", name);
    M3_TRY(up_mat(g, dg, bf16, &wg, L, nm, sg, act));
    snprintf(nm, sizeof nm, "%s up_proj", name);
    M3_TRY(up_mat(g, du, bf16, &wu, L, nm, su, act));
    snprintf(nm, sizeof nm, "%s down_proj", name);
    return up_mat(g, dd, bf16, &wd, L, nm, sd, act);
}

/* MX shapes: bytes per row of `in` elements, scale blocks per row (32-element blocks) */
static int64_t mx_rb(m3_gpu_wfmt f, int in) { return f == M3_GPU_W_MXFP4 ? (in + 1) / 2 : in; }
static int mx_nb(int in) { return (in + 31) / 32; }

/* *nan |= the n MXFP8 codes just uploaded to d hold an e4m3fn NaN code (s1111111): the
 * tensor-core decode skips its per-piece NaN test when none does (m3_gpu_experts.finite_codes).
 * Counted on the device, which reads the codes at device bandwidth; the host scan it replaced
 * read a real layer's 7.25 GB of expert codes on the CPU at every upload (every pass when
 * weights stream). */
static m3_status mx_nan_scan(m3_gpu *g, const void *d, size_t n, m3_gpu_wfmt f, bool *nan) {
    if (f != M3_GPU_W_MXFP8 || *nan) return M3_OK;
    int64_t k = 0;
    M3_TRY(m3_gpu_fp8_count_nan(g, (const uint8_t *)d, (int64_t)n, M3_FP8_E4M3FN, &k));
    *nan = k > 0;
    return M3_OK;
}

/* The smallest and largest of the n bytes at s into r[0] / r[1] (unsigned ints the caller
 * set to 255 / 0): 4 bytes a thread and step (s 4-byte aligned: arena memory), the last n % 4
 * bytes by thread 0, one atomicMin / atomicMax a warp. */
static __global__ void byte_range_k(unsigned *M3_RESTRICT r, const uint8_t *M3_RESTRICT s, int64_t n) {
    unsigned lo = 255u, hi = 0u;
    const int64_t nw = n / 4;
    const uint32_t *w = reinterpret_cast<const uint32_t *>(s);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nw;
         i += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t v = w[i];
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const unsigned x = (v >> (8 * b)) & 0xFFu;
            lo = x < lo ? x : lo, hi = x > hi ? x : hi;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (int64_t i = nw * 4; i < n; i++) lo = s[i] < lo ? s[i] : lo, hi = s[i] > hi ? s[i] : hi;
    for (int o = M3_WARP / 2; o > 0; o /= 2) {
        const unsigned l2 = M3_SHFL_XOR(lo, o), h2 = M3_SHFL_XOR(hi, o);
        lo = l2 < lo ? l2 : lo, hi = h2 > hi ? h2 : hi;
    }
    if ((threadIdx.x & (M3_WARP - 1)) == 0) atomicMin(&r[0], lo), atomicMax(&r[1], hi);
}

/* *lo / *hi widened to the scale bytes of the nm MX scale arrays sc[i] of bytes[i] each (the
 * routed experts' m3_gpu_experts.mx_scale_lo / hi: MXFP4 decode takes one exact multiply a
 * code pair when the range allows it, gpu/moe.hip mx4_path). On the device, as the NaN-code
 * scan: a real layer's expert scales are ~230 MB. */
static m3_status mx_scale_scan(m3_gpu *g, void *const *sc, const size_t *bytes, int nm,
                               size_t mul, int *lo, int *hi) {
    const size_t mark = m3_gpu_mark(g);
    unsigned *d = NULL, h[2] = {255u, 0u};
    m3_status s = m3_gpu_alloc(g, (void **)&d, sizeof h);
    if (s == M3_OK) s = m3_gpu_upload(g, d, h, sizeof h);
    for (int i = 0; i < nm && s == M3_OK; i++) {
        const int64_t n = (int64_t)(bytes[i] * mul);
        if (n == 0) continue;
        const int64_t blocks = (n / 4 + 255) / 256;
        const unsigned grid = (unsigned)(blocks < 8 * g->n_sm ? (blocks > 0 ? blocks : 1) : 8 * g->n_sm);
        byte_range_k<<<grid, 256, 0, g->stream>>>(d, (const uint8_t *)sc[i], n);
        s = m3_gpu_launched_(g, "byte_range_k", __FILE__, __LINE__);
    }
    if (s == M3_OK) s = m3_gpu_download(g, h, d, sizeof h);
    m3_gpu_release(g, mark);
    if (s == M3_OK && h[0] <= h[1]) {
        *lo = (int)h[0] < *lo ? (int)h[0] : *lo;
        *hi = (int)h[1] > *hi ? (int)h[1] : *hi;
    }
    return s;
}

/* one MX matrix (ref's m3_wq: codes + e8m0 scales, [n_out, n_in]) into dst + slot offsets */
static m3_status up_mx_mat(m3_gpu *g, void *codes, m3_e8m0 *scales, const void *wq_p,
                           m3_gpu_wfmt f, int n_out, int n_in) {
    const m3_wq *q = (const m3_wq *)wq_p;
    const size_t nc = (size_t)n_out * (size_t)mx_rb(f, n_in);
    M3_TRY(m3_gpu_upload(g, codes, q->codes, nc));
    return m3_gpu_upload(g, scales, q->scale, (size_t)n_out * (size_t)mx_nb(n_in));
}

/* the three MX matrices of a swiglu MLP (D = dim, F = ffn) into their own arrays */
static m3_status up_mx_mlp(m3_gpu *g, const void **dg, const void **du, const void **dd,
                           const m3_e8m0 **sg, const m3_e8m0 **su, const m3_e8m0 **sd,
                           const m3_mlp_weights *mw, m3_gpu_wfmt f, int D, int F, bool *nan,
                           int *sc_lo, int *sc_hi) {
    void *c[3], *sc[3];
    const int64_t cb[3] = {F * mx_rb(f, D), F * mx_rb(f, D), D * mx_rb(f, F)};
    const int64_t sb[3] = {(int64_t)F * mx_nb(D), (int64_t)F * mx_nb(D), (int64_t)D * mx_nb(F)};
    const void *src[3] = {mw->gate, mw->up, mw->down};
    for (int i = 0; i < 3; i++) {
        M3_TRY(m3_gpu_alloc(g, &c[i], (size_t)cb[i]));
        M3_TRY(m3_gpu_alloc(g, &sc[i], (size_t)sb[i]));
        M3_TRY(up_mx_mat(g, c[i], (m3_e8m0 *)sc[i], src[i], f, i < 2 ? F : D, i < 2 ? D : F));
        M3_TRY(mx_nan_scan(g, c[i], (size_t)cb[i], f, nan));
    }
    const size_t sbz[3] = {(size_t)sb[0], (size_t)sb[1], (size_t)sb[2]};
    *sc_lo = 255, *sc_hi = 0;
    M3_TRY(mx_scale_scan(g, sc, sbz, 3, 1, sc_lo, sc_hi));
    *dg = c[0], *du = c[1], *dd = c[2];
    *sg = (const m3_e8m0 *)sc[0], *su = (const m3_e8m0 *)sc[1], *sd = (const m3_e8m0 *)sc[2];
    return M3_OK;
}

/* the routed MX experts stacked (slot E: the fused shared expert when shared_slot) */
static m3_status up_mx_stack(m3_gpu *g, m3_gpu_layer_weights *w, const m3_layer_weights *hw,
                             const m3_config *c, int nslot) {
    const int E = c->n_expert, D = c->hidden, F = c->expert_inter;
    const m3_gpu_wfmt f = w->efmt;
    const size_t cgu = (size_t)F * mx_rb(f, D), cd = (size_t)D * mx_rb(f, F);
    const size_t sgu = (size_t)F * mx_nb(D), sd = (size_t)D * mx_nb(F);
    void *p[6];
    const size_t per[6] = {cgu, cgu, cd, sgu, sgu, sd};
    for (int i = 0; i < 6; i++) M3_TRY(m3_gpu_alloc(g, &p[i], per[i] * (size_t)nslot));
    for (int e = 0; e < nslot; e++) {
        const m3_mlp_weights *x = e < E ? &hw->moe.experts[e] : &hw->moe.shared;
        const void *src[3] = {x->gate, x->up, x->down};
        for (int i = 0; i < 3; i++)
            M3_TRY(up_mx_mat(g, (char *)p[i] + (size_t)e * per[i],
                             (m3_e8m0 *)p[3 + i] + (size_t)e * per[3 + i], src[i], f,
                             i < 2 ? F : D, i < 2 ? D : F));
    }
    for (int i = 0; i < 3; i++) M3_TRY(mx_nan_scan(g, p[i], per[i] * (size_t)nslot, f, &w->e_nan));
    w->e_sc_lo = 255, w->e_sc_hi = 0;
    M3_TRY(mx_scale_scan(g, p + 3, per + 3, 3, (size_t)nslot, &w->e_sc_lo, &w->e_sc_hi));
    w->eg = p[0], w->eu = p[1], w->ed = p[2];
    w->egs = (const m3_e8m0 *)p[3], w->eus = (const m3_e8m0 *)p[4], w->eds = (const m3_e8m0 *)p[5];
    return M3_OK;
}

static m3_status upload_weights(m3_gpu *g, m3_gpu_layer_weights *w, const m3_layer_weights *hw,
                                const m3_config *c, const m3_profile *p) {
    const int L = hw->layer, D = c->hidden, Dh = c->head_dim;
    const bool b = w->bf16;
    M3_TRY(up_norm(g, &w->in_norm, hw->in_norm, D));
    M3_TRY(up_norm(g, &w->post_norm, hw->post_norm, D));
    M3_TRY(up_norm(g, &w->q_norm, hw->q_norm, Dh));
    M3_TRY(up_norm(g, &w->k_norm, hw->k_norm, Dh));
    M3_TRY(up_mat(g, &w->q, b, &hw->q, L, "q_proj", &w->q_s, &w->ptpc));
    M3_TRY(up_mat(g, &w->k, b, &hw->k, L, "k_proj", &w->k_s, &w->ptpc));
    M3_TRY(up_mat(g, &w->v, b, &hw->v, L, "v_proj", &w->v_s, &w->ptpc));
    M3_TRY(up_mat(g, &w->o, b, &hw->o, L, "o_proj", &w->o_s, &w->ptpc));
    if (w->sparse) {
        const int Di = c->index_head_dim;
        M3_TRY(up_mat(g, &w->iq, b, &hw->index_q, L, "index q_proj", &w->iq_s, &w->ptpc));
        M3_TRY(up_mat(g, &w->ik, b, &hw->index_k, L, "index k_proj", &w->ik_s, &w->ptpc));
        M3_TRY(up_norm(g, &w->iq_norm, hw->index_q_norm, Di));
        M3_TRY(up_norm(g, &w->ik_norm, hw->index_k_norm, Di));
    }
    if (!w->moe)
        return up_mlp(g, &w->mg, &w->mu, &w->md, b, &hw->mlp, D, c->dense_inter, L, "mlp",
                      &w->mg_s, &w->mu_s, &w->md_s, &w->ptpc);
    const int E = c->n_expert, F = c->expert_inter;
    const size_t es = b ? 2 : 4, nm = (size_t)F * D;
    void *gate, *bias = NULL;
    if (p->router_dtype == M3_DT_BF16) {
        /* the gate held in bf16 (ref: m3_linear_f32 with w_as_bf16) */
        m3_bf16 *hb = (m3_bf16 *)malloc((size_t)E * D * sizeof *hb);
        if (!hb) return m3_errorf(M3_ERR_NOMEM, "layer %d router: out of memory", L);
        for (size_t i = 0; i < (size_t)E * D; i++) hb[i] = m3_f32_to_bf16(hw->moe.gate[i]);
        m3_status s = m3_gpu_alloc(g, &gate, (size_t)E * D * sizeof *hb);
        if (s == M3_OK) s = m3_gpu_upload(g, gate, hb, (size_t)E * D * sizeof *hb);
        free(hb);
        M3_TRY(s);
        w->gate_bf16 = (const m3_bf16 *)gate;
    } else {
        M3_TRY(m3_gpu_alloc(g, &gate, (size_t)E * D * sizeof(float)));
        M3_TRY(m3_gpu_upload(g, gate, hw->moe.gate, (size_t)E * D * sizeof(float)));
        w->gate_f32 = (const float *)gate;
    }
    if (hw->moe.bias) {
        M3_TRY(m3_gpu_alloc(g, &bias, (size_t)E * sizeof(float)));
        M3_TRY(m3_gpu_upload(g, bias, hw->moe.bias, (size_t)E * sizeof(float)));
        w->bias = (const float *)bias;
    }
    const m3_mlp_weights *x0 = &hw->moe.experts[0];
    const bool mx = x0->fmt == M3_WFMT_MXFP4 || x0->fmt == M3_WFMT_MXFP8;
    for (int e = 1; e < E; e++)
        if (hw->moe.experts[e].fmt != x0->fmt)
            return m3_errorf(M3_ERR_UNSUPPORTED, "gpu: layer %d: experts 0 and %d are held in "
                             "different formats", L, e);
    w->has_shared = c->n_shared_experts > 0 && c->shared_inter > 0;
    w->shared_fused = w->has_shared && hw->shared_fused;
    w->shared_slot = w->shared_fused && c->shared_inter == F && hw->moe.shared.fmt == x0->fmt;
    const int nslot = E + (w->shared_slot ? 1 : 0);
    w->n_expert = E;
    if (mx) {
        w->efmt = x0->fmt == M3_WFMT_MXFP4 ? M3_GPU_W_MXFP4 : M3_GPU_W_MXFP8;
        const m3_wq *qg = (const m3_wq *)x0->gate, *qd = (const m3_wq *)x0->down;
        for (int i = 0; i < 2; i++) {
            const m3_actq *a = i ? qd->act : qg->act;
            m3_actq *dst = i ? &w->act_mid : &w->act_in;
            memset(dst, 0, sizeof *dst);
            if (!a || a->kind == M3_ACTQ_NONE) continue;
            if (a->kind != M3_ACTQ_MX || a->mx.block < 1 || a->mx.block > ACTQ_MAX_BLOCK)
                return m3_errorf(M3_ERR_UNSUPPORTED, "gpu: layer %d: expert activation "
                                 "quantization other than MX blocks of <= %d", L, ACTQ_MAX_BLOCK);
            *dst = *a;
        }
        M3_TRY(up_mx_stack(g, w, hw, c, nslot));
    } else {
        w->efmt = M3_GPU_W_BF16;
        void *eg, *eu, *ed;
        M3_TRY(m3_gpu_alloc(g, &eg, (size_t)nslot * nm * es));
        M3_TRY(m3_gpu_alloc(g, &eu, (size_t)nslot * nm * es));
        M3_TRY(m3_gpu_alloc(g, &ed, (size_t)nslot * nm * es));
        for (int e = 0; e < nslot; e++) {
            const m3_mlp_weights *x = e < E ? &hw->moe.experts[e] : &hw->moe.shared;
            char what[96];
            snprintf(what, sizeof what, "layer %d expert %d", L, e);
            M3_TRY(m3_gpu_upload_mat_(g, (char *)eg + (size_t)e * nm * es, b, (int)x->fmt, x->gate, nm, what));
            M3_TRY(m3_gpu_upload_mat_(g, (char *)eu + (size_t)e * nm * es, b, (int)x->fmt, x->up, nm, what));
            M3_TRY(m3_gpu_upload_mat_(g, (char *)ed + (size_t)e * nm * es, b, (int)x->fmt, x->down, nm, what));
        }
        w->eg = eg, w->eu = eu, w->ed = ed;
    }
    w->sfmt = w->efmt;
    if (!w->has_shared || w->shared_slot) return M3_OK;
    const m3_mlp_weights *sw = &hw->moe.shared;
    if (sw->fmt == M3_WFMT_MXFP4 || sw->fmt == M3_WFMT_MXFP8) {
        w->sfmt = sw->fmt == M3_WFMT_MXFP4 ? M3_GPU_W_MXFP4 : M3_GPU_W_MXFP8;
        if (w->sfmt != w->efmt)
            return m3_errorf(M3_ERR_UNSUPPORTED, "gpu: layer %d: shared and routed experts in "
                             "different MX formats", L);
        return up_mx_mlp(g, &w->sg, &w->su, &w->sd, &w->sgs, &w->sus, &w->sds, sw, w->sfmt, D,
                         c->shared_inter, &w->s_nan, &w->s_sc_lo, &w->s_sc_hi);
    }
    w->sfmt = M3_GPU_W_BF16;
    return up_mlp(g, &w->sg, &w->su, &w->sd, b, sw, D, c->shared_inter, L, "shared expert");
}

extern "C" m3_status m3_gpu_layer_weights_upload(m3_gpu *g, m3_gpu_layer_weights **out,
                                                 const m3_layer_weights *hw, const m3_config *c,
                                                 const m3_profile *p, bool bf16) {
    *out = NULL;
    m3_gpu_layer_weights *w = (m3_gpu_layer_weights *)calloc(1, sizeof *w);
    if (!w) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    w->layer = hw->layer;
    w->sparse = hw->is_sparse;
    w->moe = hw->is_moe;
    w->bf16 = bf16;
    m3_status s = upload_weights(g, w, hw, c, p);
    if (s != M3_OK) {
        free(w);
        return m3_error_context(s, "uploading layer %d", hw->layer);
    }
    *out = w;
    return M3_OK;
}

extern "C" void m3_gpu_layer_weights_free(m3_gpu_layer_weights *w) { free(w); }

extern "C" m3_status m3_gpu_layer_weights_experts(const m3_gpu_layer_weights *w,
                                                  m3_gpu_experts *out, int *n_slot,
                                                  m3_gpu_experts *shared) {
    memset(out, 0, sizeof *out);
    if (shared) memset(shared, 0, sizeof *shared);
    if (!w->moe) return m3_errorf(M3_ERR_ARG, "gpu: layer %d has a dense MLP, no experts", w->layer);
    out->fmt = w->efmt;
    out->gate = w->eg, out->up = w->eu, out->down = w->ed;
    out->gate_s = w->egs, out->up_s = w->eus, out->down_s = w->eds;
    out->finite_codes = !w->e_nan;
    if (w->efmt != M3_GPU_W_BF16) out->mx_scale_lo = w->e_sc_lo, out->mx_scale_hi = w->e_sc_hi;
    out->act_in = act_or_null(&w->act_in);
    out->act_mid = act_or_null(&w->act_mid);
    if (n_slot) *n_slot = w->n_expert + (w->shared_slot ? 1 : 0);
    if (shared && w->has_shared && !w->shared_slot) {
        shared->fmt = w->sfmt;
        shared->gate = w->sg, shared->up = w->su, shared->down = w->sd;
        shared->gate_s = w->sgs, shared->up_s = w->sus, shared->down_s = w->sds;
        shared->finite_codes = !w->s_nan;
        if (w->sfmt != M3_GPU_W_BF16) shared->mx_scale_lo = w->s_sc_lo, shared->mx_scale_hi = w->s_sc_hi;
        shared->act_in = out->act_in;
        shared->act_mid = out->act_mid;
    }
    return M3_OK;
}

extern "C" m3_status m3_gpu_layer_cache_alloc(m3_gpu *g, m3_gpu_layer_cache *c,
                                              const m3_config *cfg, bool sparse, int cap,
                                              bool bf16) {
    memset(c, 0, sizeof *c);
    const size_t es = bf16 ? 2 : 4, kv = (size_t)cfg->n_kv_head * cfg->head_dim;
    M3_TRY(m3_gpu_alloc(g, &c->k, (size_t)cap * kv * es));
    M3_TRY(m3_gpu_alloc(g, &c->v, (size_t)cap * kv * es));
    if (sparse) M3_TRY(m3_gpu_alloc(g, &c->index_k, (size_t)cap * cfg->index_head_dim * es));
    c->cap = cap;
    c->bf16 = bf16;
    return M3_OK;
}

/* ---- component overloads by storage type ------------------------------------------------ */
static m3_status rope(m3_gpu *g, m3_bf16 *x, int ld, const int32_t *pos, int T, int nh, int hd,
                      const m3_bf16 *w, float eps, int rot, float theta, const m3_profile *p) {
    return m3_gpu_qk_norm_rope(g, x, ld, pos, T, nh, hd, w, eps, rot, theta, p);
}
static m3_status rope(m3_gpu *g, float *x, int ld, const int32_t *pos, int T, int nh, int hd,
                      const m3_bf16 *w, float eps, int rot, float theta, const m3_profile *p) {
    return m3_gpu_qk_norm_rope_f32(g, x, ld, pos, T, nh, hd, w, eps, rot, theta, p);
}
static m3_status swiglu(m3_gpu *g, m3_bf16 *a, const m3_bf16 *gt, const m3_bf16 *u, int64_t n,
                        float al, float li, const m3_profile *p) {
    return m3_gpu_swiglu(g, a, gt, u, n, al, li, p);
}
static m3_status swiglu(m3_gpu *g, float *a, const float *gt, const float *u, int64_t n, float al,
                        float li, const m3_profile *p) {
    return m3_gpu_swiglu_f32(g, a, gt, u, n, al, li, p);
}

/* flash kernels' shape contract (gpu/m3_gpu.h); outside it the faithful kernel runs */
static bool flash_ok(const m3_attn_params *ap, int ld_q) {
    const int hq = ap->n_head / ap->n_kv_head;
    return hq <= 16 && ap->head_dim % 16 == 0 && ap->head_dim <= 128 && ld_q % 8 == 0;
}
static m3_status attn_dense(m3_gpu *g, m3_bf16 *out, const m3_bf16 *q, int ld, const m3_bf16 *k,
                            const m3_bf16 *v, const int32_t *pos, int T, int n_ctx,
                            const m3_attn_params *ap, const m3_profile *p, bool flash) {
    if (flash && flash_ok(ap, ld))
        return m3_gpu_attn_dense_flash(g, out, q, ld, k, v, pos, T, n_ctx, ap, p);
    return m3_gpu_attn_dense(g, out, q, ld, k, v, pos, T, n_ctx, ap, p);
}
static m3_status attn_dense(m3_gpu *g, float *out, const float *q, int ld, const float *k,
                            const float *v, const int32_t *pos, int T, int n_ctx,
                            const m3_attn_params *ap, const m3_profile *p, bool flash) {
    (void)flash;
    return m3_gpu_attn_dense_f32(g, out, q, ld, k, v, pos, T, n_ctx, ap, p);
}
static m3_status attn_sparse(m3_gpu *g, m3_bf16 *out, const m3_bf16 *q, int ld, const m3_bf16 *k,
                             const m3_bf16 *v, const int32_t *pos, int T, int n_ctx,
                             const int32_t *sel, int width, int block, const m3_attn_params *ap,
                             const m3_profile *p, bool flash) {
    if (flash && flash_ok(ap, ld) && block % 16 == 0 && block <= 256)
        return m3_gpu_attn_sparse_flash(g, out, q, ld, k, v, pos, T, n_ctx, sel, width, block, ap,
                                        p);
    return m3_gpu_attn_sparse(g, out, q, ld, k, v, pos, T, n_ctx, sel, width, block, ap, p);
}
static m3_status attn_sparse(m3_gpu *g, float *out, const float *q, int ld, const float *k,
                             const float *v, const int32_t *pos, int T, int n_ctx,
                             const int32_t *sel, int width, int block, const m3_attn_params *ap,
                             const m3_profile *p, bool flash) {
    (void)flash;
    return m3_gpu_attn_sparse_f32(g, out, q, ld, k, v, pos, T, n_ctx, sel, width, block, ap, p);
}
static m3_status indexer(m3_gpu *g, int32_t *topk, float *scores, int *ties, const m3_bf16 *iq,
                         int ld, const m3_bf16 *ik, const int32_t *pos, int T, int n_ctx,
                         const m3_indexer_params *ip, const m3_profile *p) {
    return m3_gpu_indexer_topk(g, topk, scores, NULL, ties, iq, ld, ik, pos, T, n_ctx, ip, p);
}
static m3_status indexer(m3_gpu *g, int32_t *topk, float *scores, int *ties, const float *iq,
                         int ld, const float *ik, const int32_t *pos, int T, int n_ctx,
                         const m3_indexer_params *ip, const m3_profile *p) {
    return m3_gpu_indexer_topk_f32(g, topk, scores, NULL, ties, iq, ld, ik, pos, T, n_ctx, ip, p);
}

/* ---- fp8 caches and paged reads (docs/caches.md; ref/layer.c under a paged cache) ------ */
static m3_fp8_kind cache_kind(const m3_gpu_layer_cache *c) {
    return c->variant ? c->variant->fp8_kind : M3_FP8_E4M3FN;
}
static m3_fp8_overflow cache_ovf(const m3_gpu_layer_cache *c) {
    return c->variant ? c->variant->fp8_overflow : M3_FP8_SATURATE;
}

/* this pass's K / V rows [T, Hkv, Dh] into the paged storage at slot(pos[t]): ref's writer
 * of this layer type (§4.7, docs/caches.md): kf != NULL (atom with an fp8 cache): dense and
 * reusing layers quantize kf with FP8_MAX 240, computing sparse layers the bf16 k with the
 * kind's maximum and kf's amax; otherwise the kind's maximum from the k the profile holds;
 * kv_fp8max forces the maximum of every writer. */
template <typename TS>
static m3_status kvp_write(m3_gpu *g, m3_gpu_layer_cache *c, const int32_t *d_pos, int T,
                           const TS *k, const float *kf, const TS *v, bool dense_or_reuse) {
    const m3_variant *var = c->variant;
    float fmax = c->kv.g.elem == M3_KV_FP8 ? m3_fp8_max(c->kv.g.fp8_kind) : 1.0f;
    bool kval_f32 = false;
    if (kf && dense_or_reuse) {
        fmax = 240.0f;
        kval_f32 = true;
    }
    if (var && var->kv_fp8max > 0) fmax = (float)var->kv_fp8max;
    m3_gpu_attn_paged_src src = c->kv;
    src.ovf = cache_ovf(c);
    kvp_write_k<TS><<<glue_grid((int64_t)T * c->kv.g.n_kv * 2), GLUE_THREADS, 0, g->stream>>>(
        src, k, kf, v, d_pos, T, fmax, kval_f32, kf != NULL);
    M3_LAUNCHED(g, "kvp_write_k");
    return M3_OK;
}

/* this pass's index keys [T, Di] into the paged index cache at slot(pos[t]) */
template <typename TS>
static m3_status ixp_write(m3_gpu *g, m3_gpu_layer_cache *c, const int32_t *d_pos, int T,
                           const TS *ik, int Di) {
    ixp_write_k<TS><<<glue_grid((int64_t)T * Di), GLUE_THREADS, 0, g->stream>>>(
        c->ix, ik, d_pos, T, Di, (int)cache_ovf(c));
    M3_LAUNCHED(g, "ixp_write_k");
    return M3_OK;
}

/* The attention-input step of ref/layer.c (§3.5, §3.6, §4.7, §4.8): q (q_norm) and k (k_norm,
 * its rows of the contiguous cache) normed + roped in place, this pass's K / V rows into the
 * paged storage at slot(pos[t]) with ref's writer of this layer type (kvp_write's rule), and,
 * when iq / ik are given, the indexer's parts (normed + roped in place) and, under the paged
 * layout, the index keys into the paged index cache at slot(pos[t]). q == NULL: the
 * indexer's parts alone (a second call, where the q/k/v taps must come before the indexer's
 * projections). This one is the glue path: separate launches
 * (fp32 storage, and geometries outside the fused kernel's contract). */
template <typename TS>
static m3_status attn_input_glue(m3_gpu *g, m3_gpu_layer_cache *cache, const m3_gpu_layer_weights *w,
                                 const m3_config *c, TS *q, TS *k, const TS *v, TS *iq, TS *ik,
                                 int n0, const int32_t *d_pos, int T, const m3_profile *p,
                                 bool dense_or_reuse) {
    const int H = c->n_head, Hkv = c->n_kv_head, Dh = c->head_dim, KW = Hkv * Dh, R = c->rot_dim;
    const int G = c->index_n_heads, Di = c->index_head_dim;
    const float eps = c->rms_eps, theta = (float)c->rope_theta;
    if (q) {
        M3_TRY(rope(g, q, H * Dh, d_pos, T, H, Dh, w->q_norm, eps, R, theta, p));
        /* paged caches: atom's fp8 writers quantize from the fp32 k of the fused norm + rope
         * (spec §4.7); with qk_round ONCE that is the same computation before its one
         * rounding, so run it unrounded (fp32 twin), keep it, then round exactly as ONCE does
         * (ref) */
        const bool pkv = cache->kv.k != NULL;
        float *kf = NULL;
        if (pkv && cache->kv.g.elem == M3_KV_FP8 && p->qk_round == M3_QK_ROUND_ONCE) {
            const int64_t nk = (int64_t)T * KW;
            M3_TRY(m3_gpu_alloc(g, (void **)&kf, (size_t)nk * sizeof(float)));
            widen_k<TS><<<glue_grid(nk), GLUE_THREADS, 0, g->stream>>>(kf, k, nk, false, 0, 0);
            M3_LAUNCHED(g, "widen_k");
            m3_profile pn = *p;
            pn.qk_round = M3_QK_ROUND_NONE;
            M3_TRY(m3_gpu_qk_norm_rope_f32(g, kf, KW, d_pos, T, Hkv, Dh, w->k_norm, eps, R, theta, &pn));
            round_bf16_k<TS><<<glue_grid(nk), GLUE_THREADS, 0, g->stream>>>(k, kf, nk);
            M3_LAUNCHED(g, "round_bf16_k");
        } else {
            M3_TRY(rope(g, k, KW, d_pos, T, Hkv, Dh, w->k_norm, eps, R, theta, p));
        }
        if (pkv) M3_TRY(kvp_write(g, cache, d_pos, T, (const TS *)k, kf, v, dense_or_reuse));
    }
    if (iq) {
        M3_TRY(rope(g, iq, G * Di, d_pos, T, G, Di, w->iq_norm, eps, R, theta, p));
        M3_TRY(rope(g, ik, Di, d_pos, T, 1, Di, w->ik_norm, eps, R, theta, p));
        if (cache->ix.k) M3_TRY(ixp_write(g, cache, d_pos, T, (const TS *)ik, Di));
    }
    return M3_OK;
}
static m3_status attn_input(m3_gpu *g, m3_gpu_layer_cache *cache, const m3_gpu_layer_weights *w,
                            const m3_config *c, float *q, float *k, const float *v, float *iq,
                            float *ik, int n0, const int32_t *d_pos, int T, const m3_profile *p,
                            bool dense_or_reuse) {
    return attn_input_glue<float>(g, cache, w, c, q, k, v, iq, ik, n0, d_pos, T, p, dense_or_reuse);
}
/* bf16 storage: ONE m3_gpu_qk_norm_rope_cache launch (gpu/rope.hip) for all of it, writing
 * the paged storage through its geometry and block table (any ref geometry) with §4.7's
 * writer as m3_gpu_kv_cache.k_src: atom (qk_round ONCE) fp8 dense / reusing layers the
 * fp32 k with FP8_MAX 240 (KQ_F32), computing sparse layers bf16(k) with the kind's maximum
 * and the fp32 amax (KQ_BF16_AMAX_F32), every other writer the stored k (KQ_STORED) with the
 * kind's maximum; kv_fp8max forces the maximum. */
static m3_status attn_input(m3_gpu *g, m3_gpu_layer_cache *cache, const m3_gpu_layer_weights *w,
                            const m3_config *c, m3_bf16 *q, m3_bf16 *k, const m3_bf16 *v,
                            m3_bf16 *iq, m3_bf16 *ik, int n0, const int32_t *d_pos, int T,
                            const m3_profile *p, bool dense_or_reuse) {
    const bool pkv = cache->kv.k != NULL;
    if (p->qk_round == M3_QK_ROUND_NONE || (pkv && cache->kv.g.elem == M3_KV_F32) ||
        (iq && cache->ix.k && cache->ix.elem == M3_KV_F32))
        return attn_input_glue<m3_bf16>(g, cache, w, c, q, k, v, iq, ik, n0, d_pos, T, p,
                                        dense_or_reuse);
    const int Dh = c->head_dim, G = c->index_n_heads, Di = c->index_head_dim;
    m3_gpu_qkv x;
    memset(&x, 0, sizeof x);
    x.q = q, x.k = k, x.ld_q = c->n_head * Dh, x.ld_k = x.ld_v = c->n_kv_head * Dh;
    x.n_head = c->n_head, x.n_kv_head = c->n_kv_head, x.head_dim = Dh;
    x.q_norm = q ? w->q_norm : NULL, x.k_norm = q ? w->k_norm : NULL;
    if (iq) {
        x.index_q = iq, x.index_k = ik, x.ld_iq = G * Di, x.ld_ik = Di;
        x.n_index_head = G, x.index_dim = Di;
        x.index_q_norm = w->iq_norm, x.index_k_norm = w->ik_norm;
    }
    m3_gpu_kv_cache kc;
    memset(&kc, 0, sizeof kc);
    m3_gpu_attn_paged_src src = cache->kv;
    src.ovf = cache_ovf(cache);
    kc.ovf = src.ovf, kc.kind = cache_kind(cache);
    bool write = false;
    if (q && pkv) {
        x.v = v;
        kc.paged = &src;
        const bool fp8 = src.g.elem == M3_KV_FP8;
        float fmax = fp8 ? m3_fp8_max(src.g.fp8_kind) : 1.0f;
        kc.k_src = M3_GPU_KQ_STORED;
        if (fp8 && p->qk_round == M3_QK_ROUND_ONCE) {
            if (dense_or_reuse) fmax = 240.0f, kc.k_src = M3_GPU_KQ_F32;
            else kc.k_src = M3_GPU_KQ_BF16_AMAX_F32;
        }
        if (cache->variant && cache->variant->kv_fp8max > 0) fmax = (float)cache->variant->kv_fp8max;
        kc.fp8_max = fmax;
        write = true;
    }
    if (iq && cache->ix.k) { /* the paged index cache, rows slot(pos[t]) */
        kc.index_k = (void *)cache->ix.k, kc.index_fp8 = cache->ix.elem == M3_KV_FP8;
        kc.index_bt = cache->ix.bt, kc.index_block = cache->ix.block;
        write = true;
    }
    return m3_gpu_qk_norm_rope_cache(g, &x, write ? &kc : NULL, NULL, d_pos, T, c->rms_eps,
                                     c->rot_dim, (float)c->rope_theta, p);
}

/* Attention through the paged storage (ref m3_attn_paged): fp8_pa under a partitioned
 * profile (atom), as ref's layer sets it. sel NULL: dense. flash (M3_GPU_ATTN=flash): the
 * fast kernel where its contract holds (m3_gpu_attn_paged_flash_ok), else the faithful one. */
static m3_status attn_paged(m3_gpu *g, m3_bf16 *out, const m3_bf16 *q, const m3_gpu_layer_cache *c,
                            const int32_t *pos, int T, int n_ctx, const int32_t *sel, int width,
                            const m3_attn_params *ap, const m3_profile *p, bool flash) {
    m3_gpu_attn_paged_src src = c->kv;
    src.fp8_pa = p->attn_partition > 0;
    src.ovf = cache_ovf(c);
    if (flash && m3_gpu_attn_paged_flash_ok(&src, ap, p, sel ? width : 0) == M3_OK)
        return m3_gpu_attn_paged_flash(g, out, q, ap->n_head * ap->head_dim, &src, pos, T, n_ctx,
                                       sel, width, ap, p);
    return m3_gpu_attn_paged(g, out, q, ap->n_head * ap->head_dim, &src, pos, T, n_ctx, sel, width,
                             ap, p);
}
static m3_status attn_paged(m3_gpu *g, float *out, const float *q, const m3_gpu_layer_cache *c,
                            const int32_t *pos, int T, int n_ctx, const int32_t *sel, int width,
                            const m3_attn_params *ap, const m3_profile *p, bool flash) {
    (void)flash; /* fp32 storage: the faithful kernel */
    m3_gpu_attn_paged_src src = c->kv;
    src.fp8_pa = p->attn_partition > 0;
    src.ovf = cache_ovf(c);
    return m3_gpu_attn_paged_f32(g, out, q, ap->n_head * ap->head_dim, &src, pos, T, n_ctx, sel,
                                 width, ap, p);
}

/* The indexer over the paged index cache (ref under a paged cache reads every key back
 * through it: the same values): bf16 queries take the fast paths where the keys are bf16;
 * q8 (prefill with index_q_fp8_prefill): the query cast to fp8 without a scale into an fp32
 * temporary, as ref does (§3.8). */
static m3_status indexer_keys(m3_gpu *g, int32_t *topk, float *scores, int *ties, const m3_bf16 *iq,
                              int ld, const m3_gpu_index_keys *k, const int32_t *pos, int T,
                              int n_ctx, const m3_indexer_params *ip, const m3_profile *p) {
    return m3_gpu_indexer_topk_keys(g, M3_GPU_IDX_AUTO, topk, scores, NULL, ties, iq, ld, k, pos, T,
                                    n_ctx, ip, p);
}
static m3_status indexer_keys(m3_gpu *g, int32_t *topk, float *scores, int *ties, const float *iq,
                              int ld, const m3_gpu_index_keys *k, const int32_t *pos, int T,
                              int n_ctx, const m3_indexer_params *ip, const m3_profile *p) {
    return m3_gpu_indexer_topk_keys_f32(g, M3_GPU_IDX_AUTO, topk, scores, NULL, ties, iq, ld, k,
                                        pos, T, n_ctx, ip, p);
}
template <typename TS>
static m3_status indexer_paged(m3_gpu *g, int32_t *topk, float *scores, int *ties, const TS *iq,
                               const m3_gpu_layer_cache *c, const int32_t *pos, int T, int n_ctx,
                               const m3_indexer_params *ip, const m3_profile *p, bool q8) {
    const int QI = ip->n_index_head * ip->index_head_dim;
    if (!q8) return indexer_keys(g, topk, scores, ties, iq, QI, &c->ix, pos, T, n_ctx, ip, p);
    const int64_t nq = (int64_t)T * QI;
    const size_t mark = m3_gpu_mark(g);
    float *iqf = NULL;
    m3_status s = m3_gpu_alloc(g, (void **)&iqf, (size_t)nq * sizeof(float));
    if (s == M3_OK) {
        widen_k<TS><<<glue_grid(nq), GLUE_THREADS, 0, g->stream>>>(
            iqf, iq, nq, true, (int)cache_kind(c), (int)cache_ovf(c));
        s = m3_gpu_launched_(g, "widen_k", __FILE__, __LINE__);
    }
    if (s == M3_OK) s = indexer_keys(g, topk, scores, ties, iqf, QI, &c->ix, pos, T, n_ctx, ip, p);
    m3_gpu_release(g, mark);
    return s;
}

/* A dense projection y [T, N] = x [T, K] W^T: the plain GEMM, or ptpc (sw != NULL): x
 * quantized per token to fp8 code values, the vendor GEMM of code values (exact products, fp32
 * accumulation), then (acc * s_x) * s_w and the profile's rounding (ref m3_linear_q). */
template <typename TS>
static m3_status proj(m3_gpu *g, TS *y, const TS *x, const void *w, const float *sw,
                      const m3_actq *act, int T, int N, int K, const m3_profile *p) {
    if (!sw) return m3_gpu_linear_(g, y, x, w, T, N, K, p);
    if (T == 0) return M3_OK;
    const size_t mark = m3_gpu_mark(g);
    TS *xq;
    float *sx, *acc;
    m3_status s = m3_gpu_alloc(g, (void **)&xq, (size_t)T * K * sizeof(TS));
    if (s == M3_OK) s = m3_gpu_alloc(g, (void **)&sx, (size_t)T * sizeof(float));
    if (s == M3_OK) s = m3_gpu_alloc(g, (void **)&acc, (size_t)T * N * sizeof(float));
    if (s == M3_OK) {
        const m3_fp8q_params *f = &act->fp8;
        ptpc_act_k<TS><<<(unsigned)T, GLUE_THREADS, 0, g->stream>>>(
            xq, sx, x, K, (int)f->kind, (int)f->ovf, f->zero_row == M3_PTPC_ZERO_ONE,
            f->arith == M3_FP8Q_RCP, f->fp8_max);
        s = m3_gpu_launched_(g, "ptpc_act_k", __FILE__, __LINE__);
    }
    if (s == M3_OK) {
        if (sizeof(TS) == 2)
            s = m3_gpu_gemm_bf16_f32(g, acc, (const m3_bf16 *)(const void *)xq,
                                     (const m3_bf16 *)w, T, N, K);
        else
            s = m3_gpu_gemm_f32(g, acc, (const float *)(const void *)xq, (const float *)w, T, N, K);
    }
    if (s == M3_OK) {
        ptpc_epi_k<TS><<<glue_grid((int64_t)T * N), GLUE_THREADS, 0, g->stream>>>(
            y, acc, sx, sw, T, N, p->act_bf16);
        s = m3_gpu_launched_(g, "ptpc_epi_k", __FILE__, __LINE__);
    }
    m3_gpu_release(g, mark); /* later work is stream-ordered after these kernels */
    return s;
}

/* The tiled expert kernels where their contract holds (bf16 storage); false: not taken. A
 * fused shared expert rides along as expert E (ids / wts [T, K+1], weight 1, the routed
 * weights times rsf, routed_scale 1: ref m3_moe_experts_fused's sum, same order) when it is
 * slot E of the expert arrays; otherwise the generic path runs. */
static bool tiled_experts(m3_gpu *g, m3_status *s, m3_bf16 *y, const m3_bf16 *x,
                          const int32_t *ids, const float *wts, int T,
                          const m3_gpu_layer_weights *w, const m3_moe_params *mp,
                          const m3_profile *p) {
    const bool fused = w->shared_fused;
    if (fused && !w->shared_slot) return false;
    const int E = mp->n_expert + (fused ? 1 : 0), K = mp->top_k + (fused ? 1 : 0);
    if (mp->dim % 128 || mp->ffn % 64 || E > 1024 || K > 8 || !p->act_bf16 ||
        p->swiglu == M3_SWIGLU_F32)
        return false;
    m3_gpu_experts ew;
    memset(&ew, 0, sizeof ew);
    ew.fmt = w->efmt;
    ew.gate = w->eg, ew.up = w->eu, ew.down = w->ed;
    ew.gate_s = w->egs, ew.up_s = w->eus, ew.down_s = w->eds;
    ew.finite_codes = !w->e_nan; /* the upload's scan (real checkpoints: no NaN codes) */
    if (w->efmt != M3_GPU_W_BF16) /* the upload's scale scan: MXFP4's one-multiply decode */
        ew.mx_scale_lo = w->e_sc_lo, ew.mx_scale_hi = w->e_sc_hi;
    ew.act_in = act_or_null(&w->act_in);
    ew.act_mid = act_or_null(&w->act_mid);
    ew.n_pass = T;
    if (!fused) {
        *s = m3_gpu_moe_experts(g, y, x, ids, wts, T, &ew, mp, p);
        return true;
    }
    const size_t mark = m3_gpu_mark(g);
    int32_t *ids2;
    float *wts2;
    *s = m3_gpu_alloc(g, (void **)&ids2, (size_t)T * K * sizeof(int32_t));
    if (*s == M3_OK) *s = m3_gpu_alloc(g, (void **)&wts2, (size_t)T * K * sizeof(float));
    if (*s == M3_OK) {
        const int64_t n = (int64_t)T * K;
        fuse_sel_k<<<m3_grid_1d(n, GLUE_THREADS), GLUE_THREADS, 0, g->stream>>>(
            ids2, wts2, ids, wts, T, mp->top_k, mp->n_expert, mp->routed_scale);
        *s = m3_gpu_launched_(g, "fuse_sel_k", __FILE__, __LINE__);
    }
    if (*s == M3_OK) {
        m3_moe_params m2 = *mp;
        m2.n_expert = E;
        m2.top_k = K;
        m2.routed_scale = 1.0f; /* folded into wts2; bf16(1 * S) = bf16(S) */
        m2.shared_ffn = 0;
        *s = m3_gpu_moe_experts(g, y, x, ids2, wts2, T, &ew, &m2, p);
    }
    m3_gpu_release(g, mark); /* later work is stream-ordered after these kernels */
    return true;
}
static bool tiled_experts(m3_gpu *, m3_status *, float *, const float *, const int32_t *,
                          const float *, int, const m3_gpu_layer_weights *, const m3_moe_params *,
                          const m3_profile *) {
    return false;
}

/* the weight matrices of the expert arrays (BF16: TS elements) */
static void expert_w(const m3_gpu_layer_weights *w, int D, int F, gen_w *wg, gen_w *wu,
                     gen_w *wd) {
    *wg = {(int)w->efmt, w->eg, w->egs, mx_rb(w->efmt, D), mx_nb(D)};
    *wu = {(int)w->efmt, w->eu, w->eus, mx_rb(w->efmt, D), mx_nb(D)};
    *wd = {(int)w->efmt, w->ed, w->eds, mx_rb(w->efmt, F), mx_nb(F)};
}

/* Generic expert MLPs: ye[i] = MLP_{ids[i]}(x[i / K]) for the T*K entries i, weights ids[i]
 * of the arrays (E experts), with the MX activation quantization of ref's m3_linear_q (x
 * before gate/up, the swiglu output before down) when it applies to a pass of n_pass tokens. */
template <typename TS>
static m3_status gen_mlp(m3_gpu *g, TS *ye, const TS *x, const int32_t *ids, int T, int K, int E,
                         int D, int F, const gen_w &wg, const gen_w &wu, const gen_w &wd,
                         const m3_actq *ain, const m3_actq *amid, int n_pass, float alpha,
                         float limit, const m3_profile *p) {
    const int TK = T * K;
    if (TK == 0) return M3_OK;
    const bool qin = m3_actq_applies(ain, n_pass), qmid = m3_actq_applies(amid, n_pass);
    const size_t mark = m3_gpu_mark(g);
    TS *a;
    float *xq = NULL, *aq = NULL;
    m3_status s = m3_gpu_alloc(g, (void **)&a, (size_t)TK * F * sizeof(TS));
    if (s == M3_OK && qin) s = m3_gpu_alloc(g, (void **)&xq, (size_t)T * D * sizeof(float));
    if (s == M3_OK && qmid) s = m3_gpu_alloc(g, (void **)&aq, (size_t)TK * F * sizeof(float));
    if (s == M3_OK && qin) {
        const int64_t nb = (int64_t)T * ((D + ain->mx.block - 1) / ain->mx.block);
        actq_mx_k<TS><<<m3_grid_1d(nb, GLUE_THREADS), GLUE_THREADS, 0, g->stream>>>(xq, x, T, D,
                                                                                     ain->mx);
        s = m3_gpu_launched_(g, "actq_mx_k", __FILE__, __LINE__);
    }
    if (s == M3_OK) {
        dim3 g1((unsigned)TK, (unsigned)((F + GLUE_THREADS - 1) / GLUE_THREADS));
        if (qin)
            gen_gu_k<TS, float><<<g1, GLUE_THREADS, 0, g->stream>>>(
                a, xq, ids, wg, wu, K, E, D, F, alpha, limit, (int)p->swiglu, p->act_bf16);
        else
            gen_gu_k<TS, TS><<<g1, GLUE_THREADS, 0, g->stream>>>(
                a, x, ids, wg, wu, K, E, D, F, alpha, limit, (int)p->swiglu, p->act_bf16);
        s = m3_gpu_launched_(g, "gen_gu_k", __FILE__, __LINE__);
    }
    if (s == M3_OK && qmid) {
        const int64_t nb = (int64_t)TK * ((F + amid->mx.block - 1) / amid->mx.block);
        actq_mx_k<TS><<<m3_grid_1d(nb, GLUE_THREADS), GLUE_THREADS, 0, g->stream>>>(aq, a, TK, F,
                                                                                     amid->mx);
        s = m3_gpu_launched_(g, "actq_mx_k", __FILE__, __LINE__);
    }
    if (s == M3_OK) {
        dim3 g2((unsigned)TK, (unsigned)((D + GLUE_THREADS - 1) / GLUE_THREADS));
        if (qmid)
            gen_down_k<TS, float><<<g2, GLUE_THREADS, 0, g->stream>>>(ye, aq, ids, wd, E, D, F,
                                                                      p->act_bf16);
        else
            gen_down_k<TS, TS><<<g2, GLUE_THREADS, 0, g->stream>>>(ye, a, ids, wd, E, D, F,
                                                                   p->act_bf16);
        s = m3_gpu_launched_(g, "gen_down_k", __FILE__, __LINE__);
    }
    m3_gpu_release(g, mark); /* later work is stream-ordered after these kernels */
    return s;
}

template <typename TS>
static m3_status mlp(m3_gpu *g, TS *y, const TS *x, int T, const void *wg, const void *wu,
                     const void *wd, int D, int F, float alpha, float limit, const m3_profile *p,
                     const float *sg = NULL, const float *su = NULL, const float *sd = NULL,
                     const m3_actq *act = NULL);

/* The shared expert's output sh [T, D]: the dense GEMM path for plain weights in their own
 * arrays (ref m3_mlp), else the generic MLP (MX weights, or the shared expert as slot E). */
template <typename TS>
static m3_status shared_mlp(m3_gpu *g, TS *sh, const TS *x, int T, const m3_gpu_layer_weights *w,
                            const m3_config *c, const m3_profile *p) {
    const int D = c->hidden, FS = c->shared_inter;
    if (w->sfmt == M3_GPU_W_BF16 && !w->shared_slot)
        return mlp(g, sh, x, T, w->sg, w->su, w->sd, D, FS, c->swiglu_alpha, c->swiglu_limit, p);
    gen_w wg, wu, wd;
    int id = 0, E = 1;
    if (w->shared_slot) {
        expert_w(w, D, FS, &wg, &wu, &wd);
        id = c->n_expert;
        E = c->n_expert + 1;
    } else {
        wg = {(int)w->sfmt, w->sg, w->sgs, mx_rb(w->sfmt, D), mx_nb(D)};
        wu = {(int)w->sfmt, w->su, w->sus, mx_rb(w->sfmt, D), mx_nb(D)};
        wd = {(int)w->sfmt, w->sd, w->sds, mx_rb(w->sfmt, FS), mx_nb(FS)};
    }
    const size_t mark = m3_gpu_mark(g);
    int32_t *ids;
    int32_t *h = (int32_t *)malloc((size_t)T * sizeof *h + 1);
    if (!h) return m3_errorf(M3_ERR_NOMEM, "shared expert: out of memory");
    for (int t = 0; t < T; t++) h[t] = id;
    m3_status s = m3_gpu_alloc(g, (void **)&ids, (size_t)T * sizeof *ids);
    if (s == M3_OK) s = m3_gpu_upload(g, ids, h, (size_t)T * sizeof *ids);
    free(h);
    if (s == M3_OK)
        s = gen_mlp(g, sh, x, ids, T, 1, E, D, FS, wg, wu, wd, act_or_null(&w->act_in),
                    act_or_null(&w->act_mid), T, c->swiglu_alpha, c->swiglu_limit, p);
    m3_gpu_release(g, mark);
    return s;
}

/* Routed experts (+ the fused shared expert): y [T, D], ref m3_moe_experts(_fused). */
template <typename TS>
static m3_status experts(m3_gpu *g, TS *y, const TS *x, const int32_t *ids, const float *wts,
                         int T, const m3_gpu_layer_weights *w, const m3_moe_params *mp,
                         const m3_config *c, const m3_profile *p) {
    m3_status s = M3_OK;
    if (tiled_experts(g, &s, y, x, ids, wts, T, w, mp, p)) return s;
    const int E = mp->n_expert, K = mp->top_k, D = mp->dim, F = mp->ffn, TK = T * K;
    if (K > GEN_MAX_K)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu experts: top_k %d > %d", K, GEN_MAX_K);
    if (T == 0) return M3_OK;
    const size_t mark = m3_gpu_mark(g);
    TS *ye, *sh = NULL;
    gen_w wg, wu, wd;
    expert_w(w, D, F, &wg, &wu, &wd);
    s = m3_gpu_alloc(g, (void **)&ye, (size_t)TK * D * sizeof(TS));
    if (s == M3_OK)
        s = gen_mlp(g, ye, x, ids, T, K, E, D, F, wg, wu, wd, act_or_null(&w->act_in),
                    act_or_null(&w->act_mid), T, mp->alpha, mp->limit, p);
    if (s == M3_OK && w->shared_fused) {
        s = m3_gpu_alloc(g, (void **)&sh, (size_t)T * D * sizeof(TS));
        if (s == M3_OK) s = shared_mlp(g, sh, x, T, w, c, p);
    }
    if (s == M3_OK) {
        gen_combine_k<TS><<<(unsigned)T, GLUE_THREADS, 0, g->stream>>>(
            y, ye, ids, wts, K, E, D, mp->routed_scale, p->moe_bf16_combine,
            p->moe_bf16_combine || p->act_bf16, w->shared_fused, sh);
        s = m3_gpu_launched_(g, "gen_combine_k", __FILE__, __LINE__);
    }
    m3_gpu_release(g, mark); /* later work is stream-ordered after these kernels */
    return s;
}

/* y = MLP(x): ref m3_mlp (gate, up GEMMs rounded per profile, swiglu, down GEMM); sg, su,
 * sd: ptpc scales of the three matrices (NULL: plain) */
template <typename TS>
static m3_status mlp(m3_gpu *g, TS *y, const TS *x, int T, const void *wg, const void *wu,
                     const void *wd, int D, int F, float alpha, float limit, const m3_profile *p,
                     const float *sg, const float *su, const float *sd, const m3_actq *act) {
    if (T == 0) return M3_OK;
    const size_t mark = m3_gpu_mark(g);
    TS *gb, *ub;
    m3_status s = m3_gpu_alloc(g, (void **)&gb, (size_t)T * F * sizeof(TS));
    if (s == M3_OK) s = m3_gpu_alloc(g, (void **)&ub, (size_t)T * F * sizeof(TS));
    if (s == M3_OK) s = proj(g, gb, x, wg, sg, act, T, F, D, p);
    if (s == M3_OK) s = proj(g, ub, x, wu, su, act, T, F, D, p);
    if (s == M3_OK) s = swiglu(g, gb, gb, ub, (int64_t)T * F, alpha, limit, p);
    if (s == M3_OK) s = proj(g, y, gb, wd, sd, act, T, D, F, p);
    m3_gpu_release(g, mark);
    return s;
}

/* ---- taps and teacher forcing ----------------------------------------------------------- */
typedef struct {
    m3_gpu *g;
    const m3_hooks *h;
    const char *prefix;
    int n_layer, layer;
    const m3_profile *p;
} tapper;

static m3_status tap_host(const tapper *tp, const char *stage, m3_dtype dt, const void *data,
                          int rank, int64_t d0, int64_t d1, int64_t d2) {
    if (!tp->h || !tp->h->tap) return M3_OK;
    char key[M3_KEY_MAX];
    m3_layer_key(key, tp->prefix, tp->n_layer, tp->layer, stage);
    m3_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.rank = rank;
    t.data = (void *)data;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.shape[2] = d2;
    const char *pd = dt == M3_DT_I32 ? "int32" : m3_stage_dtype(tp->p, stage);
    m3_status s = tp->h->tap(tp->h->tap_ctx, key, &t, pd);
    return s ? m3_error_context(s, "stage %s", key) : M3_OK;
}

static int64_t numel3(int rank, int64_t d0, int64_t d1, int64_t d2) {
    return d0 * (rank >= 2 ? d1 : 1) * (rank >= 3 ? d2 : 1);
}

/* download a device stage (storage type, fp32 or int32) and tap it */
template <typename TD>
static m3_status tap_dev(const tapper *tp, const char *stage, const TD *d, int rank, int64_t d0,
                         int64_t d1, int64_t d2) {
    if (!tp->h || !tp->h->tap) return M3_OK;
    const size_t n = (size_t)numel3(rank, d0, d1, d2);
    float *hbuf = (float *)malloc(n * sizeof(float) + 1);
    if (!hbuf) return m3_errorf(M3_ERR_NOMEM, "stage %s: out of memory", stage);
    m3_status s = m3_gpu_dl_(tp->g, hbuf, d, n);
    if (s == M3_OK) s = tap_host(tp, stage, M3_DT_F32, hbuf, rank, d0, d1, d2);
    free(hbuf);
    return s;
}
static m3_status tap_dev_i32(const tapper *tp, const char *stage, const int32_t *d, int rank,
                             int64_t d0, int64_t d1, int64_t d2) {
    if (!tp->h || !tp->h->tap) return M3_OK;
    const size_t n = (size_t)numel3(rank, d0, d1, d2);
    int32_t *hbuf = (int32_t *)malloc(n * sizeof(int32_t) + 1);
    if (!hbuf) return m3_errorf(M3_ERR_NOMEM, "stage %s: out of memory", stage);
    m3_status s = m3_gpu_download(tp->g, hbuf, d, n * sizeof(int32_t));
    if (s == M3_OK) s = tap_host(tp, stage, M3_DT_I32, hbuf, rank, d0, d1, d2);
    free(hbuf);
    return s;
}

/* a teacher-forced selection int32 [d0, d1(, w)] (ref layer.c fetch_sel) */
static m3_status fetch_sel(const tapper *tp, const char *stage, int rank, int64_t d0, int64_t d1,
                           m3_tensor *t) {
    char key[M3_KEY_MAX];
    m3_layer_key(key, tp->prefix, tp->n_layer, tp->layer, stage);
    memset(t, 0, sizeof *t);
    m3_status s = tp->h->fetch(tp->h->fetch_ctx, key, t);
    if (s) return m3_error_context(s, "teacher-forced %s", key);
    if (t->dtype != M3_DT_I32 || t->rank != rank || t->shape[0] != d0 || t->shape[1] != d1 ||
        (rank == 3 && t->shape[2] < 1)) {
        free(t->data);
        t->data = NULL;
        return m3_errorf(M3_ERR_SHAPE,
                         "teacher-forced %s: expected int32 [%lld, %lld%s], got rank %d "
                         "[%lld, %lld, ...]",
                         key, (long long)d0, (long long)d1, rank == 3 ? ", K" : "", t->rank,
                         (long long)t->shape[0], (long long)(t->rank > 1 ? t->shape[1] : 0));
    }
    return M3_OK;
}

static m3_status upload_i32(m3_gpu *g, int32_t **d, const int32_t *h, size_t n) {
    M3_TRY(m3_gpu_alloc(g, (void **)d, n * sizeof(int32_t)));
    return m3_gpu_upload(g, *d, h, n * sizeof(int32_t));
}

/* ---- forward ----------------------------------------------------------------------------- */
template <typename TS>
static m3_status layer_forward(m3_gpu *g, TS *x, TS *h, bool *h_pending, int T, const int32_t *d_pos,
                               const int32_t *h_pos, const m3_gpu_layer_weights *w,
                               const m3_config *c, const m3_profile *p, m3_gpu_layer_cache *cache,
                               const m3_hooks *hooks, const char *prefix,
                               const m3_gpu_model_opts *o) {
    const int L = w->layer, D = c->hidden, H = c->n_head, Hkv = c->n_kv_head, Dh = c->head_dim;
    const int QW = H * Dh, KW = Hkv * Dh, n0 = cache->n_past, n_ctx = n0 + T;
    const size_t t_ = (size_t)T;
    m3_attn_params ap;
    m3_attn_params_init(&ap, H, Hkv, Dh);
    m3_indexer_params ip;
    ip.n_index_head = c->index_n_heads;
    ip.index_head_dim = c->index_head_dim;
    ip.block = c->index_block;
    ip.topk = c->index_topk;
    ip.local_blocks = c->index_local;
    ip.init_blocks = c->index_init;
    m3_moe_params mp;
    mp.n_expert = c->n_expert;
    mp.top_k = c->top_k;
    mp.dim = D;
    mp.ffn = c->expert_inter;
    mp.shared_ffn = c->n_shared_experts > 0 ? c->shared_inter : 0;
    mp.routed_scale = c->routed_scale;
    mp.alpha = c->swiglu_alpha;
    mp.limit = c->swiglu_limit;
    const tapper tpv = {g, hooks, prefix, c->n_layer, L, p};
    const tapper *tp = &tpv;
    const bool dump = hooks && hooks->tap;
    const bool force_sel = hooks && hooks->force_selection && hooks->fetch;
    const float eps = c->rms_eps;
    TS *kc = (TS *)cache->k + (size_t)n0 * KW, *vc = (TS *)cache->v + (size_t)n0 * KW;

    /* ---- attention block ---- */
    TS *xn, *q, *ao, *apo;
    M3_TRY(m3_gpu_alloc(g, (void **)&xn, t_ * D * sizeof(TS)));
    M3_TRY(m3_gpu_alloc(g, (void **)&q, t_ * QW * sizeof(TS)));
    M3_TRY(m3_gpu_alloc(g, (void **)&ao, t_ * QW * sizeof(TS)));
    M3_TRY(m3_gpu_alloc(g, (void **)&apo, t_ * D * sizeof(TS)));
    M3_TRY(m3_gpu_norm_add_(g, xn, x, *h_pending ? h : NULL, w->in_norm, T, D, eps, p));
    *h_pending = false;
    M3_TRY(tap_dev(tp, "input", x, 2, T, D, 0));
    M3_TRY(tap_dev(tp, "attn_norm", xn, 2, T, D, 0));

    const m3_actq *pq = &w->ptpc;
    M3_TRY(proj(g, q, xn, w->q, w->q_s, pq, T, QW, D, p));
    M3_TRY(proj(g, kc, xn, w->k, w->k_s, pq, T, KW, D, p));
    M3_TRY(proj(g, vc, xn, w->v, w->v_s, pq, T, KW, D, p));
    M3_TRY(tap_dev(tp, "q_proj", q, 2, T, QW, 0));
    M3_TRY(tap_dev(tp, "k_proj", kc, 2, T, KW, 0));
    M3_TRY(tap_dev(tp, "v_proj", vc, 2, T, KW, 0));
    const bool pkv = cache->kv.k != NULL;
    const bool reuse_l = w->sparse && cache->reuse_topk;
    /* sparse computing layers without taps: the indexer's projections first, so that ONE
     * attention-input launch does q, k, v and the indexer's parts (with taps, ref's stage
     * order puts the q/k/v taps before the indexer's projections: two launches) */
    const int Gi = c->index_n_heads, Dii = c->index_head_dim;
    const bool idx_first = w->sparse && !reuse_l && !dump;
    TS *iq = NULL, *ikc = NULL;
    if (w->sparse) {
        M3_TRY(m3_gpu_alloc(g, (void **)&iq, t_ * Gi * Dii * sizeof(TS)));
        /* a reusing layer computes the projections (as ref: the packed GEMM runs) but never
         * inserts into its index cache: its key projection goes to a temporary; so does every
         * layer's under the paged layout (the keys then go to the paged index cache at
         * slot(pos[t])) */
        if (reuse_l || cache->ix.k) M3_TRY(m3_gpu_alloc(g, (void **)&ikc, t_ * Dii * sizeof(TS)));
        else ikc = (TS *)cache->index_k + (size_t)n0 * Dii;
    }
    if (idx_first) {
        M3_TRY(proj(g, iq, xn, w->iq, w->iq_s, pq, T, Gi * Dii, D, p));
        M3_TRY(proj(g, ikc, xn, w->ik, w->ik_s, pq, T, Dii, D, p));
    }
    M3_TRY(attn_input(g, cache, w, c, q, kc, vc, idx_first ? iq : NULL, idx_first ? ikc : NULL,
                      n0, d_pos, T, p, !w->sparse || reuse_l));
    M3_TRY(tap_dev(tp, "q", q, 3, T, H, Dh));
    M3_TRY(tap_dev(tp, "k", kc, 3, T, Hkv, Dh));
    M3_TRY(tap_dev(tp, "v", vc, 3, T, Hkv, Dh));

    if (w->sparse) {
        const int G = c->index_n_heads, Di = c->index_head_dim;
        const int NB = (n_ctx + ip.block - 1) / ip.block;
        const bool reuse = cache->reuse_topk;
        if (!idx_first) {
            M3_TRY(proj(g, iq, xn, w->iq, w->iq_s, pq, T, G * Di, D, p));
            M3_TRY(proj(g, ikc, xn, w->ik, w->ik_s, pq, T, Di, D, p));
        }
        M3_TRY(tap_dev(tp, "index_q_proj", iq, 2, T, G * Di, 0)); /* no-ops when idx_first */
        M3_TRY(tap_dev(tp, "index_k_proj", ikc, 2, T, Di, 0));
        int W = m3_indexer_width(n_ctx, &ip, p);
        int32_t *topk = NULL;
        float *scores = NULL;
        if (!reuse) {
            if (!idx_first) /* the indexer's parts alone (and the paged index cache) */
                M3_TRY(attn_input(g, cache, w, c, (TS *)NULL, (TS *)NULL, (const TS *)NULL, iq,
                                  ikc, n0, d_pos, T, p, false));
            M3_TRY(tap_dev(tp, "index_q", iq, 3, T, G, Di));
            M3_TRY(tap_dev(tp, "index_k", ikc, 2, T, Di, 0));
            int *ties;
            M3_TRY(m3_gpu_alloc(g, (void **)&topk, (size_t)G * t_ * (W > 0 ? W : 1) * sizeof(int32_t)));
            M3_TRY(m3_gpu_alloc(g, (void **)&scores, (size_t)G * t_ * NB * sizeof(float)));
            M3_TRY(m3_gpu_alloc(g, (void **)&ties, sizeof(int)));
            M3_TRY(m3_gpu_memset(g, ties, 0, sizeof(int)));
            /* paged caches: keys read through the paged index cache; the prefill's query cast
             * to fp8 when the variant says so (ref §3.8, §9.9) */
            const bool q8 = cache->paged && T > 1 && cache->variant &&
                            m3_variant_index_q_fp8(cache->variant);
            M3_ASSERT(!q8 || cache->ix.k);
            if (cache->ix.k)
                M3_TRY(indexer_paged(g, topk, scores, ties, iq, cache, d_pos, T, n_ctx, &ip, p, q8));
            else
                M3_TRY(indexer(g, topk, scores, ties, iq, G * Di, (const TS *)cache->index_k, d_pos,
                               T, n_ctx, &ip, p));
            int n_ties = 0;
            M3_TRY(m3_gpu_download(g, &n_ties, ties, sizeof n_ties));
            if (n_ties)
                m3_info("layer %d: %d (head, token) rows with a tie straddling rank %d", L, n_ties,
                        ip.topk);
        } else {
            /* spec §3.9: the top-k of the most recent computing sparse layer of this pass */
            const m3_gpu_topk_share *sh = cache->share;
            M3_ASSERT(sh);
            if (sh->layer < 0 || sh->n_tok != T)
                return m3_errorf(M3_ERR_ARG,
                                 "layer %d reuses the top-k of an earlier sparse layer, but no "
                                 "sparse layer computed one in this pass",
                                 L);
            if (sh->width > ip.topk)
                return m3_errorf(M3_ERR_SHAPE, "layer %d: reused top-k width %d > %d", L, sh->width,
                                 ip.topk);
            W = sh->width;
            topk = sh->topk;
        }
        const int32_t *sel = topk;
        int sel_w = W;
        m3_tensor forced;
        memset(&forced, 0, sizeof forced);
        if (force_sel) {
            M3_TRY(fetch_sel(tp, "index_topk", 3, G, T, &forced));
            sel_w = (int)forced.shape[2];
            const int32_t *fs = (const int32_t *)forced.data;
            for (int64_t i = 0; i < (int64_t)G * T * sel_w; i++)
                if (fs[i] < -1 || fs[i] >= NB) {
                    const int bad = fs[i];
                    free(forced.data);
                    return m3_errorf(M3_ERR_ARG,
                                     "teacher-forced layer %d index_topk: block id %d outside "
                                     "[-1, %d)",
                                     L, bad, NB);
                }
            int32_t *dsel = NULL;
            m3_status s = upload_i32(g, &dsel, fs, (size_t)G * T * sel_w);
            if (s) {
                free(forced.data);
                return s;
            }
            sel = dsel;
        }
        /* the stage is what attention used: the forced selection when teacher-forced; a
         * reusing layer has no scores of its own */
        m3_status s = M3_OK;
        if (dump && !reuse) s = tap_dev(tp, "index_scores", scores, 3, G, T, NB);
        if (!s && force_sel)
            s = tap_host(tp, "index_topk", M3_DT_I32, forced.data, 3, G, T, sel_w);
        else if (!s)
            s = tap_dev_i32(tp, "index_topk", sel, 3, G, T, sel_w);
        free(forced.data);
        M3_TRY(s);
        if (cache->paged && sel_w > ip.topk)
            return m3_errorf(M3_ERR_SHAPE, "layer %d: index_topk width %d > top-k %d", L, sel_w,
                             ip.topk);
        if (!reuse && cache->share) { /* record what attention uses, for the reusing layers */
            m3_gpu_topk_share *sh = cache->share;
            const size_t n = (size_t)G * t_ * (size_t)sel_w;
            /* a selection wider than top-k (forced) is refused by the reusing layer, as ref */
            if (n <= sh->cap) M3_TRY(m3_gpu_copy(g, sh->topk, sel, n * sizeof(int32_t)));
            sh->layer = L;
            sh->n_tok = T;
            sh->width = sel_w;
        }
        if (pkv) /* sparse layers read the paged cache in prefill and decode (§3.10) */
            M3_TRY(attn_paged(g, ao, q, cache, d_pos, T, n_ctx, sel, sel_w, &ap, p, o->flash));
        else
            M3_TRY(attn_sparse(g, ao, q, QW, (const TS *)cache->k, (const TS *)cache->v, d_pos, T,
                               n_ctx, sel, sel_w, ip.block, &ap, p, o->flash));
    } else if (pkv && T == 1) {
        /* dense decode reads the paged cache; dense prefill the chunk's own unquantized K/V, as
         * ATOM's flash-attention prefill (§3.7, §9.12) */
        M3_TRY(attn_paged(g, ao, q, cache, d_pos, T, n_ctx, (const int32_t *)NULL, 0, &ap, p,
                          o->flash));
    } else {
        M3_TRY(attn_dense(g, ao, q, QW, (const TS *)cache->k, (const TS *)cache->v, d_pos, T,
                          n_ctx, &ap, p, o->flash));
    }
    cache->n_past = n_ctx;
    M3_TRY(tap_dev(tp, "attn_out", ao, 2, T, QW, 0));
    M3_TRY(proj(g, apo, ao, w->o, w->o_s, pq, T, D, QW, p));
    M3_TRY(tap_dev(tp, "attn_proj", apo, 2, T, D, 0));

    /* ---- MLP block ---- */
    M3_TRY(m3_gpu_norm_add_(g, xn, x, apo, w->post_norm, T, D, eps, p));
    M3_TRY(tap_dev(tp, "mlp_norm", xn, 2, T, D, 0));
    if (!w->moe) {
        M3_TRY(mlp(g, h, xn, T, w->mg, w->mu, w->md, D, c->dense_inter, c->swiglu_alpha,
                   c->swiglu_limit, p, w->mg_s, w->mu_s, w->md_s, pq));
    } else {
        const int E = c->n_expert, K = c->top_k;
        float *logits, *wts;
        int32_t *ids;
        M3_TRY(m3_gpu_alloc(g, (void **)&logits, t_ * E * sizeof(float)));
        M3_TRY(m3_gpu_alloc(g, (void **)&ids, t_ * K * sizeof(int32_t)));
        M3_TRY(m3_gpu_alloc(g, (void **)&wts, t_ * K * sizeof(float)));
        if (p->router_dtype == M3_DT_BF16) {
            const m3_bf16 *xb = (const m3_bf16 *)xn;
            if (sizeof(TS) == 4) { /* ref casts x to bf16 (RNE) */
                m3_bf16 *tmp;
                M3_TRY(m3_gpu_alloc(g, (void **)&tmp, t_ * D * sizeof(m3_bf16)));
                M3_TRY(m3_gpu_f32_to_bf16(g, tmp, (const float *)xn, (int64_t)T * D));
                xb = tmp;
            }
            M3_TRY(m3_gpu_moe_router_logits(g, logits, xb, T, w->gate_bf16, &mp, p));
        } else {
            const float *xf = (const float *)xn;
            if (sizeof(TS) == 2) { /* fp32 router over bf16 activations: widen exactly */
                float *tmp;
                M3_TRY(m3_gpu_alloc(g, (void **)&tmp, t_ * D * sizeof(float)));
                M3_TRY(m3_gpu_bf16_to_f32(g, tmp, (const m3_bf16 *)xn, (int64_t)T * D));
                xf = tmp;
            }
            M3_TRY(m3_gpu_gemm_f32(g, logits, xf, w->gate_f32, T, E, D));
        }
        M3_TRY(tap_dev(tp, "router_logits", logits, 2, T, E, 0));
        if (w->bias) M3_TRY(tap_dev(tp, "router_bias", w->bias, 1, E, 0, 0)); /* as ref: extra stage */
        M3_TRY(m3_gpu_moe_route(g, ids, wts, NULL, logits, w->bias, T, &mp, p));
        if (force_sel) {
            m3_tensor forced;
            M3_TRY(fetch_sel(tp, "expert_ids", 2, T, K, &forced));
            const int32_t *fi = (const int32_t *)forced.data;
            m3_status s = M3_OK;
            for (int t = 0; !s && t < T; t++)
                for (int k = 0; !s && k < K; k++) {
                    const int e = fi[(size_t)t * K + k];
                    if (e < 0 || e >= E)
                        s = m3_errorf(M3_ERR_ARG, "layer %d: expert_ids[%d][%d] = %d outside [0, %d)",
                                      L, t, k, e, E);
                    for (int k2 = 0; !s && k2 < k; k2++)
                        if (fi[(size_t)t * K + k2] == e)
                            s = m3_errorf(M3_ERR_ARG, "layer %d: expert_ids[%d]: expert %d selected twice",
                                          L, t, e);
                }
            /* our router's weights of the forced experts, renormalised (ref forced_weights) */
            float *hl = NULL, *hw = NULL;
            if (!s) {
                hl = (float *)malloc(t_ * E * sizeof(float));
                hw = (float *)malloc(t_ * K * sizeof(float));
                if (!hl || !hw) s = m3_errorf(M3_ERR_NOMEM, "layer %d: out of memory", L);
            }
            if (!s) s = m3_gpu_download(g, hl, logits, t_ * E * sizeof(float));
            for (int t = 0; !s && t < T; t++) {
                float sig[GEN_MAX_K], sum = 0.0f;
                for (int k = 0; k < K && k < GEN_MAX_K; k++) {
                    sig[k] = 1.0f / (1.0f + expf(-hl[(size_t)t * E + fi[(size_t)t * K + k]]));
                    sum += sig[k];
                }
                for (int k = 0; k < K && k < GEN_MAX_K; k++) hw[(size_t)t * K + k] = sig[k] / sum;
            }
            if (!s) s = m3_gpu_upload(g, ids, fi, t_ * K * sizeof(int32_t));
            if (!s) s = m3_gpu_upload(g, wts, hw, t_ * K * sizeof(float));
            free(hl);
            free(hw);
            free(forced.data);
            M3_TRY(s);
        }
        M3_TRY(tap_dev_i32(tp, "expert_ids", ids, 2, T, K, 0));
        M3_TRY(tap_dev(tp, "expert_weights", wts, 2, T, K, 0));
        M3_TRY(experts(g, h, xn, ids, wts, T, w, &mp, c, p));
        if (w->has_shared && !w->shared_fused) { /* fused: inside experts() */
            TS *sh;
            M3_TRY(m3_gpu_alloc(g, (void **)&sh, t_ * D * sizeof(TS)));
            M3_TRY(shared_mlp(g, sh, xn, T, w, c, p));
            M3_TRY(tap_dev(tp, "shared_out", sh, 2, T, D, 0));
            const int64_t n = (int64_t)T * D;
            add_k<TS><<<m3_grid_1d(n < 65536 * 4 ? n : 65536 * 4, GLUE_THREADS), GLUE_THREADS, 0,
                        g->stream>>>(h, sh, n, p->act_bf16);
            M3_LAUNCHED(g, "add_k");
        }
    }
    *h_pending = true;
    M3_TRY(tap_dev(tp, "mlp_out", h, 2, T, D, 0));
    if (dump) {
        /* the stored x_{L+1} = r + f with ref's residual rounding, computed on the host from
         * the device's x and h (the next input norm forms the same sum on the device) */
        const size_t n = t_ * D;
        float *hx = (float *)malloc(n * sizeof(float)), *hh = (float *)malloc(n * sizeof(float));
        m3_status s = hx && hh ? M3_OK : m3_errorf(M3_ERR_NOMEM, "layer %d: out of memory", L);
        if (!s) s = m3_gpu_dl_(g, hx, x, n);
        if (!s) s = m3_gpu_dl_(g, hh, h, n);
        if (!s) {
            m3_residual_add(hx, hx, hh, (int64_t)n, p);
            s = tap_host(tp, "output", M3_DT_F32, hx, 2, T, D, 0);
        }
        free(hx);
        free(hh);
        M3_TRY(s);
    }
    return M3_OK;
}

extern "C" m3_status m3_gpu_layer_forward(m3_gpu *g, void *d_x, void *d_h, bool *h_pending,
                                          int n_tok, const int32_t *d_pos, const int32_t *h_pos,
                                          const m3_gpu_layer_weights *w, const m3_config *c,
                                          const m3_profile *p, m3_gpu_layer_cache *cache,
                                          const m3_hooks *hooks, const char *prefix,
                                          const m3_gpu_model_opts *o) {
    M3_ASSERT(g && d_x && d_h && h_pending && d_pos && h_pos && w && c && p && cache && o);
    M3_ASSERT(n_tok > 0 && w->bf16 == cache->bf16);
    const int L = w->layer, n0 = cache->n_past, n_ctx = n0 + n_tok;
    for (int t = 0; t < n_tok; t++)
        if (h_pos[t] != n0 + t)
            return m3_errorf(M3_ERR_ARG,
                             "layer %d: position %d of token %d; the contiguous cache needs "
                             "positions %d..%d in order",
                             L, h_pos[t], t, n0, n_ctx - 1);
    if (n_ctx > cache->cap)
        return m3_errorf(M3_ERR_ARG, "layer %d: %d tokens exceed the device cache of %d rows", L,
                         n_ctx, cache->cap);
    const size_t mark = m3_gpu_mark(g);
    m3_status s =
        w->bf16 ? layer_forward(g, (m3_bf16 *)d_x, (m3_bf16 *)d_h, h_pending, n_tok, d_pos, h_pos,
                                w, c, p, cache, hooks, prefix, o)
                : layer_forward(g, (float *)d_x, (float *)d_h, h_pending, n_tok, d_pos, h_pos, w,
                                c, p, cache, hooks, prefix, o);
    /* temporaries: later work on the stream is ordered after their readers */
    m3_gpu_release(g, mark);
    return s ? m3_error_context(s, "layer %d", L) : M3_OK;
}
