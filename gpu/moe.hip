/* gpu/moe.hip: the MoE router, device twin of ref/moe.c (m3_moe_router_logits,
 * m3_moe_route; spec §3.12). Tolerance: expert ids identical as sets per token except rows
 * whose reference margin is a near-tie (documented in tests/gpu_moe.c); weights
 * GPU_NMSE_F32. Tests: tests/gpu_moe.c.
 *
 * route_k: one warp per token. Lane l holds experts e = l + k*M3_WARP (k < ROUTE_MAXK):
 *   sigma_e = m3_sigmoidf(l_e) (ref/num/act.h), sel_e = sigma_e + b_e (b rounded to bf16
 *   when the router is held in bf16, as the reference does). K+1 rounds of a warp arg-max
 *   over (sel desc, NaN highest, id asc) pick the experts in the reference's order; the
 *   extra round gives the margin sel_(K) - sel_(K+1). Lane 0 sums sigma over the chosen K in
 *   selection order and writes w_k = sigma_k / sum (before routed_scaling_factor), the
 *   reference's exact operation order; only expf may differ by an ulp (device libm). */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "ref/moe.h"
#include "ref/num/act.h"
#include "ref/num/bf16.h"

#define ROUTE_THREADS 128
#define ROUTE_MAXK 8 /* experts per lane: E <= 8 * M3_WARP */

/* ---- static device helpers ------------------------------------------------------------- */
/* a ranks before b: value desc, NaN highest, then the lower expert id (ref's rule) */
static __device__ __forceinline__ bool before(float va, int a, float vb, int b) {
    bool na = isnan(va), nb = isnan(vb);
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return a < b;
}

/* ---- kernels --------------------------------------------------------------------------- */
static __global__ void __launch_bounds__(ROUTE_THREADS)
    route_k(int32_t *M3_RESTRICT ids, float *M3_RESTRICT wts, float *M3_RESTRICT margin,
            const float *M3_RESTRICT logits, const float *M3_RESTRICT bias, int n_tok, int E, int K,
            bool bias_bf16) {
    const int lane = (int)threadIdx.x % M3_WARP;
    const int t = (int)((blockIdx.x * blockDim.x + threadIdx.x) / M3_WARP);
    if (t >= n_tok) return; /* whole warps leave together */
    const float *l = logits + (size_t)t * E;
    float sel[ROUTE_MAXK];
    unsigned taken = 0;
#pragma unroll
    for (int k = 0; k < ROUTE_MAXK; k++) {
        const int e = lane + k * M3_WARP;
        sel[k] = -INFINITY;
        if (e < E) {
            float b = bias ? bias[e] : 0.0f;
            if (bias_bf16) b = m3_round_bf16(b);
            sel[k] = m3_sigmoidf(l[e]) + b;
        } else {
            taken |= 1u << k; /* not an expert: never a candidate */
        }
    }
    const int need = K + 1 < E ? K + 1 : E;
    float sum = 0.0f, kth = 0.0f;
    for (int r = 0; r < need; r++) {
        float bv = 0.0f;
        int bi = -1;
#pragma unroll
        for (int k = 0; k < ROUTE_MAXK; k++) {
            const int e = lane + k * M3_WARP;
            if (!(taken >> k & 1u) && (bi < 0 || before(sel[k], e, bv, bi))) bv = sel[k], bi = e;
        }
        for (int m = M3_WARP / 2; m > 0; m >>= 1) {
            float ov = M3_SHFL_XOR(bv, m);
            int oi = M3_SHFL_XOR(bi, m);
            if (oi >= 0 && (bi < 0 || before(ov, oi, bv, bi))) bv = ov, bi = oi;
        }
        /* every lane holds the same winner (bv, bi) */
        if (bi % M3_WARP == lane) taken |= 1u << (bi / M3_WARP);
        if (r < K) {
            if (lane == 0) {
                const float sig = m3_sigmoidf(l[bi]); /* the same value the owner lane had */
                ids[(size_t)t * K + r] = bi;
                wts[(size_t)t * K + r] = sig; /* normalised below */
                sum += sig;                   /* selection order, as the reference */
            }
            if (r == K - 1) kth = bv;
        } else if (lane == 0 && margin) {
            margin[t] = kth - bv;
        }
    }
    if (lane == 0) {
        for (int r = 0; r < K; r++) wts[(size_t)t * K + r] = wts[(size_t)t * K + r] / sum;
        if (margin && K >= E) margin[t] = INFINITY;
    }
}

/* ---- launchers ------------------------------------------------------------------------- */
extern "C" m3_status m3_gpu_moe_route(m3_gpu *g, int32_t *d_ids, float *d_wts, float *d_margin,
                                      const float *d_logits, const float *d_bias, int n_tok,
                                      const m3_moe_params *mp, const m3_profile *p) {
    M3_ASSERT(mp && p && n_tok >= 0 && d_ids && d_wts && d_logits);
    const int E = mp->n_expert, K = mp->top_k;
    M3_ASSERTF(E > 0 && K >= 1 && K <= E, "E=%d K=%d", E, K);
    if (E > ROUTE_MAXK * M3_WARP)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu moe_route: %d experts > %d", E,
                         ROUTE_MAXK * M3_WARP);
    if (n_tok == 0) return M3_OK;
    const int tok_per_block = ROUTE_THREADS / M3_WARP;
    route_k<<<m3_grid_1d(n_tok, tok_per_block), ROUTE_THREADS, 0, g->stream>>>(
        d_ids, d_wts, d_margin, d_logits, d_bias, n_tok, E, K, p->router_dtype == M3_DT_BF16);
    M3_LAUNCHED(g, "route_k");
    return M3_OK;
}

/* Router logits [T, E] through the GEMM helper. bf16 activations; the gate is held in bf16
 * (router_dtype BF16, as hf and atom hold it): d_gate_bf16 [E, D] is the caller's bf16 copy
 * of the fp32 checkpoint gate (made once at load, e.g. with m3_gpu_f32_to_bf16). The GEMM
 * rounds the fp32 accumulation once to bf16 (bf16 logits), widened into fp32 storage. */
extern "C" m3_status m3_gpu_moe_router_logits(m3_gpu *g, float *d_logits, const m3_bf16 *d_x,
                                              int n_tok, const m3_bf16 *d_gate_bf16,
                                              const m3_moe_params *mp, const m3_profile *p) {
    M3_ASSERT(mp && p && n_tok >= 0);
    if (p->router_dtype != M3_DT_BF16)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu router_logits: router_dtype fp32 needs the "
                                             "fp32 GEMM path (not built yet)");
    if (n_tok == 0) return M3_OK;
    const size_t mark = m3_gpu_mark(g);
    void *tmp;
    M3_TRY(m3_gpu_alloc(g, &tmp, (size_t)n_tok * mp->n_expert * sizeof(m3_bf16)));
    m3_status s = m3_gpu_gemm_bf16(g, (m3_bf16 *)tmp, d_x, d_gate_bf16, n_tok, mp->n_expert, mp->dim);
    if (s == M3_OK) s = m3_gpu_bf16_to_f32(g, d_logits, (const m3_bf16 *)tmp, (int64_t)n_tok * mp->n_expert);
    /* the temporary is released now: later work on the stream is ordered after its readers */
    m3_gpu_release(g, mark);
    return s;
}
