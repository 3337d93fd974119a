/* gpu/moe.hip: the MoE router, device twin of ref/moe.c (m3_moe_router_logits,
 * m3_moe_route; spec §3.12). Tolerance: expert ids identical as sets per token except rows
 * whose reference margin is a near-tie (documented in tests/gpu_moe.c); weights
 * GPU_NMSE_F32. Tests: tests/gpu_moe.c.
 *
 * route_sel_k (K <= M3_WARP; session 8) and route_k (any K): one warp per token. Lane l
 *   holds experts e = l + k*M3_WARP (k < ROUTE_MAXK): sigma_e = m3_sigmoidf(l_e)
 *   (ref/num/act.h), sel_e = sigma_e + b_e (b rounded to bf16 when the router is held in
 *   bf16, as the reference does). K+1 rounds of a warp arg-max over (sel desc, NaN highest,
 *   id asc) pick the experts in the reference's order; the extra round gives the margin
 *   sel_(K) - sel_(K+1). The weights w_k = sigma_k / sum over the chosen K summed in
 *   selection order (before routed_scaling_factor), the reference's exact operation order;
 *   only expf may differ by an ulp (device libm). route_sel_k's rounds are two redux
 *   instructions on sorted selection keys (details at the kernel).
 * route_fst_k (session 12; passes of >= 16384 tokens, E <= 128; session 9's route_grp_k
 *   before it): 8 lanes a token, per-lane top lists of packed keys on a cheap proxy of sel,
 *   then the exact sel of the list's K + 2 candidates ranked exactly (the bound that makes
 *   them the reference's ranks, and the exact fallback, at the kernel). */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "ref/linear.h" /* m3_actq, m3_actq_applies (host) */
#include "ref/moe.h"
#include "ref/num/act.h"
#include "ref/num/bf16.h"
#include "ref/num/fp8.h"
#include "ref/num/mx.h"

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

/* Selection key of a value: unsigned order = ref's rank order of the values (larger first;
 * every NaN above +inf and equal to each other; -0 equal to +0); 0 ranks below any value. */
static __device__ __forceinline__ uint32_t route_key(float v) {
    const uint32_t b = m3_f32_bits(v == 0.0f ? 0.0f : v);
    const uint32_t k = (b & 0x80000000u) ? ~b : b | 0x80000000u;
    return v != v ? 0xFFFFFFFFu : k;
}
/* warp maximum of an unsigned word: one redux instruction on sm_80+, else xor shuffles */
static __device__ __forceinline__ uint32_t route_wmax(uint32_t v) {
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_max_sync(0xffffffffu, v);
#else
    for (int m = M3_WARP / 2; m > 0; m >>= 1) v = max(v, (uint32_t)M3_SHFL_XOR((int)v, m));
    return v;
#endif
}

/* the value of a selection key (sel is never -0: sigma >= +0, and x + b = -0 needs x = -0) */
static __device__ __forceinline__ float route_val(uint32_t k) {
    return m3_bits_f32((k & 0x80000000u) ? k & 0x7FFFFFFFu : ~k);
}

/* route_sel_k (session 8): one warp per token, lane l holding experts e = l + k M3_WARP
 * (k < NK; coalesced loads, all issued before any use: clamped indices, no branches between
 * them), the block's biases (rounded to bf16 when the router is held in bf16) once in shared
 * memory for its ROUTE_SEL_THREADS / M3_WARP tokens. Each lane sorts its selection keys
 * (route_key) once, an insertion sort by adjacent swaps on the strict key order: stable, so
 * equal keys keep the lower id first. A round takes the warp maximum of the lanes' head keys
 * and, among the lanes holding it, the lowest id (two redux instructions on sm_80+: ref's
 * `before` order); the owner lane's next key comes up. Lanes r < K recompute the sigmoid of
 * their winner (the same deterministic value) and sum the K in selection order through
 * shuffles (ref's order), then write id r and sigma_r / sum (one store each); lane 0 the
 * margin from the keys of rounds K-1 and K. H200: T = 16384 0.0314 -> 0.0136 ms (route_k:
 * 5 shuffle levels of (value, id) pairs with ref's comparison per level and round, bias
 * loads serialised behind the sigmoids, lane 0 writing serially; docs/gpu-log/moe.md).
 * KC > 0: K = KC compiled in (route_sel_pick), the K + 1 rounds and the K-term sum a straight
 * run of code. The kernel is close to issue-bound at 4096-8192 tokens (ncu, session 14: 550
 * warp instructions a token, 0.68 issued a cycle a scheduler), so its cost is instructions:
 * with K compiled in and the bias fill at a constant stride, H200 T = 4096 / 8192 0.0055 /
 * 0.0070 -> 0.0044 / 0.0056 ms (docs/gpu-log/moe.md). */
#define ROUTE_SEL_THREADS 256
template <int NK, int KC>
static __global__ void __launch_bounds__(ROUTE_SEL_THREADS)
    route_sel_k(int32_t *M3_RESTRICT ids, float *M3_RESTRICT wts, float *M3_RESTRICT margin,
                const float *M3_RESTRICT logits, const float *M3_RESTRICT bias, int n_tok, int E,
                int K, bool bias_bf16) {
    __shared__ float sb[ROUTE_MAXK * M3_WARP];
    /* the block's biases, before the wait: a weight, which no launch that may still run writes
     * (m3_gpu_moe_route's ordering contract), so a block placed while the previous grid ends
     * has them in shared memory when the wait releases (session 15: T = 8192 0.0055-0.0056 ->
     * 0.0051-0.0053 ms). A constant stride: a loop over blockDim.x divided its trip count at
     * run time (a division sequence and a remainder loop on every thread's path). */
#pragma unroll
    for (int i0 = 0; i0 < ROUTE_MAXK * M3_WARP; i0 += ROUTE_SEL_THREADS) {
        const int i = i0 + (int)threadIdx.x;
        if (i < E) {
            const float b = bias ? bias[i] : 0.0f;
            sb[i] = bias_bf16 ? m3_round_bf16(b) : b;
        }
    }
    /* launched as a programmatic dependent of the launch before it (m3_gpu_moe_route): wait for
     * that grid before any load of the logits or any store, then let the next launch start */
    m3_pdl_wait();
    m3_pdl_trigger();
    /* the token's logits are loaded before the barrier (a warp past the pass reads the last
     * token's row) (session 10: T = 4096 / 8192 0.0057 / 0.0081 -> 0.0055 / 0.0079-0.0080 ms
     * against the loads after it) */
    const int lane = (int)threadIdx.x % M3_WARP;
    const int t = (int)((blockIdx.x * blockDim.x + threadIdx.x) / M3_WARP);
    const float *l = logits + (size_t)(t < n_tok ? t : n_tok - 1) * E;
    float lv[NK], bv[NK];
#pragma unroll
    for (int k = 0; k < NK; k++) lv[k] = l[min(lane + k * M3_WARP, E - 1)];
    __syncthreads();
    if (t >= n_tok) return; /* whole warps leave together */
    uint32_t key[NK];
    int id[NK];
#pragma unroll
    for (int k = 0; k < NK; k++) bv[k] = sb[min(lane + k * M3_WARP, E - 1)];
#pragma unroll
    for (int k = 0; k < NK; k++) {
        const int e = lane + k * M3_WARP;
        key[k] = e < E ? route_key(m3_sigmoidf(lv[k]) + bv[k]) : 0u; /* 0: never chosen */
        id[k] = e;
    }
#pragma unroll
    for (int i = 1; i < NK; i++)
#pragma unroll
        for (int k = i; k > 0; k--)
            if (key[k] > key[k - 1]) {
                const uint32_t tk = key[k];
                key[k] = key[k - 1], key[k - 1] = tk;
                const int ti = id[k];
                id[k] = id[k - 1], id[k - 1] = ti;
            }
    if (KC > 0) K = KC; /* the launcher picked this instance for K == KC */
    const int need = K + 1 < E ? K + 1 : E;
    uint32_t kth = 0;
    int my_id = 0;
    auto round = [&](int r) {
        /* the taken experts left the heads, and a round always has an untaken expert of key
         * > 0 (need <= E) */
        const uint32_t wk = route_wmax(key[0]);
        const bool mine = key[0] == wk;
        const int wi = (int)~route_wmax(mine ? ~(uint32_t)id[0] : 0u);
        if (mine && wi == id[0]) { /* the owner: its next key comes up */
#pragma unroll
            for (int k = 0; k + 1 < NK; k++) key[k] = key[k + 1], id[k] = id[k + 1];
            key[NK - 1] = 0u;
        }
        if (r < K) {
            if (lane == r) my_id = wi;
            if (r == K - 1) kth = wk;
        } else if (lane == 0 && margin) {
            margin[t] = route_val(kth) - route_val(wk);
        }
    };
    /* K compiled in: rounds 0..K-1 always run (need >= K), round K (the margin's) where E > K;
     * written without a loop exit (hipcc does not unroll a loop with a break) */
    if (KC > 0) {
#pragma unroll
        for (int r = 0; r < KC; r++) round(r);
        if (need > KC) round(KC);
    } else {
        for (int r = 0; r < need; r++) round(r);
    }
    const float my_s = lane < K ? m3_sigmoidf(l[my_id]) : 0.0f;
    float sum = 0.0f; /* selection order, as the reference */
    if (KC > 0) {
#pragma unroll
        for (int r = 0; r < KC; r++) sum += m3_shfl(my_s, r);
    } else {
        for (int r = 0; r < K; r++) sum += m3_shfl(my_s, r);
    }
    if (lane < K) {
        ids[(size_t)t * K + lane] = my_id;
        wts[(size_t)t * K + lane] = my_s / sum;
    }
    if (lane == 0 && margin && K >= E) margin[t] = INFINITY;
}

#define RG_E 128 /* experts at most (the packed key holds a 7-bit id) */
#define RG_L 8   /* lanes a token */
#define RG_THREADS 256
/* a >= b afterwards */
static __device__ __forceinline__ void rg_cx(uint32_t &a, uint32_t &b) {
    const uint32_t x = a, y = b;
    a = max(x, y), b = min(x, y);
}
/* v[0..P) bitonic -> descending (P a power of two): the half-cleaner stages, max / min only (no
 * data-dependent branches or indexing) */
template <int P>
static __device__ __forceinline__ void rg_bitonic(uint32_t *v) {
#pragma unroll
    for (int s = P / 2; s > 0; s >>= 1)
#pragma unroll
        for (int i = 0; i < P; i++)
            if ((i & s) == 0) rg_cx(v[i], v[i + s]);
}
/* A = the top KK of the descending lists A and B (KK each): c_i = max(A_i, B_{KK-1-i}) is that
 * set as a V-shaped (bitonic) sequence, sorted by a bitonic merge with 0xFFFFFFFF at both ends
 * (still V-shaped; the compiler folds every comparison with a pad) */
template <int KK>
static __device__ __forceinline__ void rg_merge(uint32_t *A, const uint32_t *B) {
    constexpr int P = KK <= 2 ? 2 : KK <= 4 ? 4 : KK <= 8 ? 8 : 16, pf = (P - KK) / 2;
    uint32_t v[P];
#pragma unroll
    for (int i = 0; i < P; i++) v[i] = 0xFFFFFFFFu;
#pragma unroll
    for (int i = 0; i < KK; i++) v[pf + i] = max(A[i], B[KK - 1 - i]);
    rg_bitonic<P>(v);
#pragma unroll
    for (int i = 0; i < KK; i++) A[i] = v[P - KK + i];
}
/* v's blocks of W (two descending halves each) -> descending blocks: a half and the other
 * reversed make a bitonic sequence */
template <int W>
static __device__ __forceinline__ void rg_pass(uint32_t *v) {
#pragma unroll
    for (int b = 0; b < 16; b += W) {
        uint32_t t[W];
#pragma unroll
        for (int i = 0; i < W / 2; i++) t[i] = v[b + i], t[W - 1 - i] = v[b + W / 2 + i];
        rg_bitonic<W>(t);
#pragma unroll
        for (int i = 0; i < W; i++) v[b + i] = t[i];
    }
}
/* v[0..8) descending: Batcher's odd-even merge network, 19 comparators (the bitonic passes of
 * pairs, fours and eights took 24) */
static __device__ __forceinline__ void rg_sort8(uint32_t *v) {
    rg_cx(v[0], v[1]), rg_cx(v[2], v[3]), rg_cx(v[4], v[5]), rg_cx(v[6], v[7]);
    rg_cx(v[0], v[2]), rg_cx(v[1], v[3]), rg_cx(v[4], v[6]), rg_cx(v[5], v[7]);
    rg_cx(v[1], v[2]), rg_cx(v[5], v[6]), rg_cx(v[0], v[4]), rg_cx(v[3], v[7]);
    rg_cx(v[1], v[5]), rg_cx(v[2], v[6]);
    rg_cx(v[1], v[4]), rg_cx(v[3], v[6]);
    rg_cx(v[2], v[4]), rg_cx(v[3], v[5]);
    rg_cx(v[3], v[4]);
}
/* G = the top KK of the 16 keys v (v is overwritten), descending: two sorted eights, then their
 * top KK (KK >= 8: their full merge) */
template <int KK>
static __device__ __forceinline__ void rg_top16(uint32_t *G, uint32_t *v) {
    rg_sort8(v);
    rg_sort8(v + 8);
    if constexpr (KK >= 8) rg_pass<16>(v);
#pragma unroll
    for (int i = 0; i < KK; i++) G[i] = v[i];
    if constexpr (KK < 8) rg_merge<KK>(G, v + 8);
}
/* route_fst_k (session 12): passes of >= 16384 tokens, E <= 128 (E % 4 == 0), K <= 8,
 * KK <= E. RG_L = 8 lanes a token, lane q holding experts e = 16 q + i (4 coalesced 16-byte
 * loads); each lane sorts the top KK (>= K + 3 for K <= 4, else K + 2) keys of its 16 by
 * sorting networks (rg_top16), the id packed into the key's low 7 bits (ck = (key | 127) ^ e:
 * unique, ordered by the key's top 25 bits, then the lower id), and the 8 lanes merge their lists
 * (3 butterfly levels, rg_merge) (session 9's route_grp_k; session 13: the network instead of
 * one insertion a key, two min / max a level, and KK = K + 3: fewer fallbacks). The lists rank
 * a cheap proxy of sel: p_e = f(l_e) + b_e with f = __fdividef(1, 1 + __expf(-l)) (MUFU: ~5 instructions against ~20 for m3_sigmoidf's expf and IEEE division;
 * route_grp_k ranked the exact sel), |sel_e - p_e| <= RG_D0 + |p| 2^-20 (f within ~5e-7 of the
 * device sigmoid, two roundings of the sum). Every expert outside the KK candidates has a proxy
 * key <= the last candidate's, so its exact sel <= thr = ub + D (ub: that key's value with its
 * low 7 bits set, an upper bound). The candidates' exact sel (m3_sigmoidf + b, route_key) are
 * ranked exactly by (key desc, id asc); when at least K + 1 of them have sel > thr and none is
 * NaN, the first K + 1 are the reference's ranks 0..K in order. Otherwise (near-equal values at
 * the boundary, exact ties across it, NaN) the warp runs the exact fallback: every key exact
 * from the logits in registers, K + 1 rounds, the winners' sigmoids loaded together (not one
 * dependent load a round). Weights and margin as route_sel_k: sigma / sum in selection order,
 * sel_(K) - sel_(K+1); lane q < K writes rank q (K <= RG_L), one division a lane. FULL: E ==
 * RG_E compiled in (every lane's 16 experts valid: no clamps or selects on the lane's count).
 * H200 (docs/gpu-log/moe.md): T = 16384 0.0104-0.0118 (route_grp_k) -> 0.0095-0.0096 ms (session 12) ->
 * 0.0093 (session 13, network and KK = K + 3); session 15 (same process, PDL back to back):
 * 0.0081-0.0082 -> 0.0065-0.0066 (biases before the wait, odd-even eights, FULL, one division
 * a lane; the biases and FULL alone 0.0070); at 4096 / 8192 tokens route_sel_k stays (0.0057 /
 * 0.0080 against 0.0088 / 0.0091). */
#define RG_D0 1e-6f
static __device__ __forceinline__ uint32_t rg_pkey(float v) { /* proxy key: route_key's order */
    const uint32_t b = m3_f32_bits(v);
    const uint32_t k = b ^ (uint32_t)(((int32_t)b >> 31) | (int32_t)0x80000000);
    return v != v ? 0xFFFFFFFFu : k;
}
template <int KK, bool FULL>
static __global__ void __launch_bounds__(RG_THREADS)
    route_fst_k(int32_t *M3_RESTRICT ids, float *M3_RESTRICT wts, float *M3_RESTRICT margin,
                const float *M3_RESTRICT logits, const float *M3_RESTRICT bias, int n_tok, int E,
                int K, bool bias_bf16) {
    constexpr int RG_NE = RG_E / RG_L;
    __shared__ __align__(16) float sb[RG_L][RG_NE + 4];
    const int q = (int)threadIdx.x % RG_L;
    const int gid = (int)((blockIdx.x * blockDim.x + threadIdx.x) / RG_L);
    const int w0 = (int)((blockIdx.x * blockDim.x + (threadIdx.x & ~(unsigned)(M3_WARP - 1))) / RG_L);
    /* biases rounded once a block, before the wait (as route_sel_k); rows padded by 4 floats:
     * the lanes' 16-byte reads of one step hit different bank quads (the logits loaded before
     * this barrier measured slower: T = 16384 0.0095 -> 0.0100 ms, session 12) */
    for (int i = (int)threadIdx.x; i < RG_L * RG_NE; i += (int)blockDim.x) {
        const float b = bias && i < E ? bias[i] : 0.0f;
        sb[i / RG_NE][i % RG_NE] = bias_bf16 ? m3_round_bf16(b) : b;
    }
    __syncthreads();
    m3_pdl_wait(); /* a programmatic dependent launch, as route_sel_k */
    m3_pdl_trigger();
    const bool live = gid < n_tok;
    const int t = live ? gid : n_tok - 1;
    const float *l = logits + (size_t)t * E;
    const int nv4 = FULL ? RG_NE / 4 : min(max((E - q * RG_NE) / 4, 0), RG_NE / 4);
    const float4 *l4 = reinterpret_cast<const float4 *>(l) + (nv4 > 0 ? q * (RG_NE / 4) : 0);
    float4 lv[RG_NE / 4];
    if (w0 >= n_tok) return; /* whole warps leave together (shuffles below) */
    /* a lane past E reads the row's first chunk (E >= 4): clamped, no branch between loads */
#pragma unroll
    for (int c = 0; c < RG_NE / 4; c++) lv[c] = l4[min(c, max(nv4 - 1, 0))];
    uint32_t G[KK], ck[RG_NE];
    const uint32_t e0 = (uint32_t)(q * RG_NE);
#pragma unroll
    for (int c = 0; c < RG_NE / 4; c++) {
        const float4 b4 = *reinterpret_cast<const float4 *>(&sb[q][4 * c]);
        const float lx[4] = {lv[c].x, lv[c].y, lv[c].z, lv[c].w}, bx[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const float f = __fdividef(1.0f, 1.0f + __expf(-lx[u]));
            ck[4 * c + u] = c < nv4 ? ((rg_pkey(f + bx[u]) | 0x7Fu) ^ (e0 + (uint32_t)(4 * c + u))) : 0u; /* 0: never */
        }
    }
    rg_top16<KK>(G, ck);
    /* the RG_L lanes' lists merged by a butterfly */
#pragma unroll
    for (int m = 1; m < RG_L; m <<= 1) {
        uint32_t P[KK];
#pragma unroll
        for (int j = 0; j < KK; j++) P[j] = (uint32_t)M3_SHFL_XOR((int)G[j], m);
        rg_merge<KK>(G, P);
    }
    /* candidates r < KK: ids from the packed keys; lane q takes candidates q + RG_L s */
    int cid[KK];
#pragma unroll
    for (int r = 0; r < KK; r++) cid[r] = (int)((G[r] & 0x7Fu) ^ 0x7Fu);
    constexpr int NS = (KK + RG_L - 1) / RG_L;
    uint32_t myk[NS];
    float mys[NS];
    int myi[NS];
#pragma unroll
    for (int s = 0; s < NS; s++) {
        const int r0 = RG_L * s;
        int tr_[RG_L];
#pragma unroll
        for (int u = 0; u < RG_L; u++) tr_[u] = cid[min(r0 + u, KK - 1)];
#pragma unroll
        for (int w = RG_L / 2, bit = 1; w >= 1; w >>= 1, bit <<= 1)
#pragma unroll
            for (int u = 0; u < w; u++) tr_[u] = (q & bit) ? tr_[2 * u + 1] : tr_[2 * u];
        const int id = tr_[0]; /* past KK: candidate KK - 1 again (unused) */
        const float sg = m3_sigmoidf(l[id]);
        myi[s] = id;
        mys[s] = sg;
        myk[s] = route_key(sg + sb[id / RG_NE][id % RG_NE]);
    }
    uint32_t ek[KK];
#pragma unroll
    for (int r = 0; r < KK; r++) ek[r] = m3_shfl(myk[r / RG_L], r % RG_L, RG_L);
    /* the check: K + 1 candidates above thr, none NaN */
    const uint32_t lk = G[KK - 1] | 0x7Fu;
    const float ub = route_val(lk);
    const float thr = ub + (RG_D0 + fabsf(ub) * 0x1p-20f);
    int cnt = 0;
    bool bad = false;
#pragma unroll
    for (int r = 0; r < KK; r++) {
        cnt += route_val(ek[r]) > thr ? 1 : 0;
        bad = bad || ek[r] == 0xFFFFFFFFu;
    }
    bad = bad || cnt < K + 1 || !(thr == thr);
    /* exact ranks of this lane's candidates: (key desc, id asc) */
    int myr[NS];
#pragma unroll
    for (int s = 0; s < NS; s++) {
        int rk = 0;
#pragma unroll
        for (int r = 0; r < KK; r++) rk += (ek[r] > myk[s] || (ek[r] == myk[s] && cid[r] < myi[s])) ? 1 : 0;
        myr[s] = RG_L * s + q < KK ? rk : KK; /* a repeated candidate takes no rank */
    }
    int rid[KK];
    uint32_t rfk[KK];
    float rsg[KK];
    const int gb = (int)threadIdx.x % M3_WARP & ~(RG_L - 1); /* the group's first lane */
#pragma unroll
    for (int r = 0; r < KK; r++) {
        rid[r] = 0, rfk[r] = 0u, rsg[r] = 0.0f;
        if (r > K) continue;
        int src = 0, ss = 0;
#pragma unroll
        for (int s = 0; s < NS; s++) {
            const uint32_t m = (uint32_t)(m3_ballot(myr[s] == r) >> gb) & ((1u << RG_L) - 1u);
            if (m) src = __ffs((int)m) - 1, ss = s;
        }
#pragma unroll
        for (int s = 0; s < NS; s++) {
            const uint32_t kk = m3_shfl(myk[s], src, RG_L);
            const float sv = m3_shfl(mys[s], src, RG_L);
            const uint32_t iv = m3_shfl((uint32_t)myi[s], src, RG_L);
            if (ss == s) rfk[r] = kk, rsg[r] = sv, rid[r] = (int)iv;
        }
    }
    if (m3_any(bad)) { /* exact fallback: every key exact, K + 1 rounds (rare) */
        uint32_t fk[RG_NE];
#pragma unroll
        for (int c = 0; c < RG_NE / 4; c++) {
            const float4 b4 = *reinterpret_cast<const float4 *>(&sb[q][4 * c]);
            const float lx[4] = {lv[c].x, lv[c].y, lv[c].z, lv[c].w}, bx[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
            for (int u = 0; u < 4; u++) fk[4 * c + u] = c < nv4 ? route_key(m3_sigmoidf(lx[u]) + bx[u]) : 0u;
        }
        uint32_t taken = 0u;
#pragma unroll
        for (int r = 0; r < KK; r++) {
            if (r > K) continue;
            uint32_t bk = 0u;
            int bi = 0;
#pragma unroll
            for (int i = 0; i < RG_NE; i++) {
                const uint32_t k = (taken >> i) & 1u ? 0u : fk[i];
                if (k > bk) bk = k, bi = i;
            }
            int be = bk ? q * RG_NE + bi : 0x7FFF;
#pragma unroll
            for (int m = 1; m < RG_L; m <<= 1) {
                const uint32_t pk = (uint32_t)M3_SHFL_XOR((int)bk, m);
                const int pe = M3_SHFL_XOR(be, m);
                if (pk > bk || (pk == bk && pe < be)) bk = pk, be = pe;
            }
            if (be / RG_NE == q) taken |= 1u << (be % RG_NE);
            if (bad) rid[r] = be, rfk[r] = bk;
        }
        if (bad) { /* the winners' sigmoids: independent loads (L1 hits) */
#pragma unroll
            for (int r = 0; r < KK; r++)
                if (r <= K) rsg[r] = m3_sigmoidf(l[rid[r]]);
        }
    }
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < KK; r++)
        if (r < K) sum += rsg[r]; /* selection order, as the reference */
    if (!live) return;
    /* rank q from the lane's registers by selects: a warp holds 4 tokens, so a store loop over
     * the ranks issued K divisions a lane */
    int mi = 0;
    float ms = 0.0f;
#pragma unroll
    for (int r = 0; r < KK; r++)
        if (r == q) mi = rid[r], ms = rsg[r];
    if (q < K) {
        ids[(size_t)t * K + q] = mi;
        wts[(size_t)t * K + q] = ms / sum;
    }
    if (q == 0 && margin) {
        uint32_t a = 0u, b = 0u;
#pragma unroll
        for (int r = 0; r < KK; r++) {
            a |= rfk[r] & (0u - (uint32_t)(r == K - 1));
            b |= rfk[r] & (0u - (uint32_t)(r == K));
        }
        margin[t] = route_val(a) - route_val(b);
    }
}

/* ---- launchers ------------------------------------------------------------------------- */
typedef void (*route_fn)(int32_t *, float *, float *, const float *, const float *, int, int, int,
                         bool);
/* route_sel_k<NK> with the common top-k counts compiled in (M3: K = 4), else K at run time */
template <int NK>
static route_fn route_sel_pick(int K) {
    return K == 2 ? route_sel_k<NK, 2> : K == 4 ? route_sel_k<NK, 4> : K == 8 ? route_sel_k<NK, 8>
                                                                           : route_sel_k<NK, 0>;
}
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
    if (K > M3_WARP) { /* more winners than lanes to hold them */
        route_k<<<m3_grid_1d(n_tok, tok_per_block), ROUTE_THREADS, 0, g->stream>>>(
            d_ids, d_wts, d_margin, d_logits, d_bias, n_tok, E, K, p->router_dtype == M3_DT_BF16);
        M3_LAUNCHED(g, "route_k");
        return M3_OK;
    }
    /* route_sel_k and route_fst_k are programmatic dependents of the launch before them (their
     * first statement waits for it; then they let the next launch start): the launch latency
     * overlaps the earlier grid's end where that grid lets dependents start early (H200,
     * back-to-back router calls, session 13: T = 1 / 4096 / 8192 / 16384 0.5-1 us less, docs/gpu-log/moe.md).
     * Passes of >= 16384 tokens: route_fst_k (H200: T = 16384 0.0095-0.0096 against route_sel_k's
     * 0.0136 and route_grp_k's 0.0104-0.0118 ms; at 8192 tokens 0.0091 against route_sel_k's
     * 0.0080, at 4096 0.0088 against 0.0057; session 14, K compiled in: T = 16384 route_sel_k
     * 0.0095 against route_fst_k's 0.0080) */
    route_fn k;
    /* route_fst_k's KK candidates must be experts (KK <= E: session 12's KK 6 / 10 with only
     * K + 2 <= E checked read past the row for E = 4 or 8, found in session 13) */
    const int kk = K + 3 <= 7 ? 7 : 10;
    const bool fst = n_tok >= 16384 && E <= RG_E && E % 4 == 0 && kk <= E && K <= 8 && m3_aligned16(d_logits);
    const int nk = (E + M3_WARP - 1) / M3_WARP;
    /* E == RG_E compiled in only for KK = 7 (M3: K = 4): the KK = 10 instance took 74
     * registers (3 blocks an SM, two waves at 16384 tokens; not measured) */
    if (fst) k = kk != 7 ? route_fst_k<10, false> : E == RG_E ? route_fst_k<7, true> : route_fst_k<7, false>;
    else k = nk <= 1 ? route_sel_pick<1>(K) : nk <= 2 ? route_sel_pick<2>(K)
           : nk <= 4 ? route_sel_pick<4>(K) : route_sel_pick<8>(K);
    M3_TRY(m3_gpu_launch_pdl(g, true, k, dim3(fst ? m3_grid_1d(n_tok, RG_THREADS / RG_L)
                                                  : m3_grid_1d(n_tok, ROUTE_SEL_THREADS / M3_WARP)),
                             dim3(fst ? RG_THREADS : ROUTE_SEL_THREADS), 0, d_ids, d_wts, d_margin, d_logits,
                             d_bias, n_tok, E, K, p->router_dtype == M3_DT_BF16));
    M3_LAUNCHED(g, fst ? "route_fst_k" : "route_sel_k");
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

/* ==== routed experts: m3_gpu_moe_experts (twin of ref's m3_moe_experts, spec §3.13) ========
 * Tolerance: GPU_NMSE_BF16 on y against ref run on the same (dequantized, for MX) weights;
 * the combine is bit-exact given equal expert outputs, so the only difference is the fp32
 * reduction order of the GEMMs (bf16 roundings of g, u, a, y_e can flip). With activation
 * quantization (w->act_in / act_mid, ref's m3_wq.act) the same bound against ref on the same
 * m3_wq weights + act: x is quantized bit-identically (gpu/quant.hip), a from each side's own
 * swiglu output, so a flipped bf16 of a can move one element by one MX step (rare; measured
 * worst 7.2e-9). Tests: tests/gpu_moe.c. Kernels, in launch order:
 *   group_k     one block: (token, slot) entries counted per expert, grouped rows assigned
 *               (atomics: the row order inside an expert is arbitrary, which is harmless:
 *               every row is computed independently and the combine orders by expert id),
 *               the active expert list and the row-tile prefix for the tile kernels.
 *   mx_qdq_k    (act_in applies) x rows quantize-dequantized once, before gate/up.
 *   sk_k        small batches: one block per (active expert, run of output rows); the
 *               expert's input rows (<= 4 bf16 / 2 MX at a time) staged in shared memory;
 *               each warp streams 4 weight rows together (gate+up of 2 rows, or 4 down rows),
 *               2 steps of 16-byte loads in flight per row, every staged 8 input values
 *               widened once for all 4 rows; the pass's row count is a template argument
 *               (sk_rows<NC>). Weight-bandwidth bound, which is what decode is. Used for
 *               bf16 weights at T > 1, and for everything on AMD (m3_gpu_experts.portable:
 *               on NVIDIA too).
 *   tc_k        small batches with MX weights (NVIDIA, T > 1): the same GEMV on tensor
 *               cores, the staged tokens as the mma N dimension, weights decoded exactly to
 *               bf16 A fragments in registers (see the comment at tc_k).
 * T = 1 on NVIDIA sm_80+ (t1_call) skips group_k and combine_k: two kernels that read the
 * token's slots from ids (slot k's grouped row is k) and a down kernel, launched as a
 * programmatic dependent of the gate/up kernel: sk1_k (sk_k's one-row GEMV; bf16, MXFP8 with
 * NaN codes possible) or dq1_k (tc_k's, persistent; MXFP4, MXFP8 with finite codes); then
 * t1c_k, the combine, a programmatic dependent of the down kernel.
 *   tile_k      larger batches: 64 rows x 128 columns per block, k-steps of 32 (one MX
 *               block), register double buffering; weights dequantized exactly into bf16
 *               in shared memory (a code times a power of two has at most 4 significant
 *               bits, so bf16 holds it exactly unless it is below 2^-126), mma.sync with
 *               ldmatrix fragments on NVIDIA, fp32 FMAs on the portable path.
 *   tile2_k     the larger batches on NVIDIA sm_80+ instead of tile_k: 160-row tiles through
 *               a 4-stage cp.async ring (its section below).
 *   wg_k        the larger batches on Hopper (sm_90a build, cc 9.0) instead of tile2_k: 192 x 192
 *               tiles on warpgroup MMA (wgmma) from swizzled shared memory (its section below).
 *   Gate/up kernels compute g and u of the same rows and apply swiglu_oai in the epilogue
 *   (g, u rounded to bf16 first: the act_bf16 GEMM outputs), storing a in bf16.
 *   mx_qdq_k    (act_mid applies) a quantize-dequantized in place, before down.
 *   combine_k   one block per token: its K expert rows in ascending expert id, the
 *               profile's combine (hf bf16 products and sum; atom fp32, unfused mul/add as
 *               the reference), bf16(rsf * R).
 * MX decode: MXFP8 through the sm_89+ e4m3 conversion; MXFP4 the same way after re-laying
 * each e2m1 code as an e4m3 byte (value x 2^-6, FP4_WMUL), table lookups elsewhere. */
#define EXP_THREADS 256
#define EXP_WARPS (EXP_THREADS / M3_WARP)
#define TILE_BM 64
#define TILE_BN 128
#define TILE_BK 32
#define TILE_LDS (TILE_BK + 8) /* padded bf16 row: conflict-free fragment loads */
#define TILE_CP (TILE_BN + 4)  /* fp32 epilogue row pitch */
#define SK_NT 4                /* input rows staged per pass in sk_k (sk_rows' NC <= 4) */
#define SK_RPW_GU 2            /* output rows per warp, gate/up (4 weight rows) */
#define SK_RPW_DN 4            /* output rows per warp, down */
#define SK_UNR 2 /* steps of loads issued ahead per lane: 2 x MR x 16 B */
#define EXP_MAX_E 1024
#define EXP_MAX_K 8

/* grouping metadata, one int buffer: off[E+1] | act[E] | n_act[1] | tile_off[E+1] |
 * ent[TK] (entry t*K+k of each grouped row) | row_of[TK] (grouped row of each entry, -1) */
struct exp_meta {
    const int32_t *off, *act, *n_act, *tile_off, *ent, *row_of;
};

/* format traits: bytes of 16 per lane hold EPL elements */
template <int WF> struct wtraits;
template <> struct wtraits<M3_GPU_W_BF16> { enum { EPL = 8 }; };
template <> struct wtraits<M3_GPU_W_MXFP8> { enum { EPL = 16 }; };
template <> struct wtraits<M3_GPU_W_MXFP4> { enum { EPL = 32 }; };

/* byte offset of element c of a row of kdim elements, and the row's bytes */
template <int WF> static __device__ __forceinline__ size_t wbytes(size_t n) {
    return WF == M3_GPU_W_BF16 ? n * 2 : (WF == M3_GPU_W_MXFP8 ? n : n / 2);
}

/* decoding table: the element codes' values from ref/num (fp8 e4m3fn: 256, e2m1: 16) */
template <int WF> static __device__ __forceinline__ void build_lut(float *lut) {
#if M3_HAVE_FP8_CVT
    return; /* both MX formats decode through the conversion instruction */
#endif
    if (WF == M3_GPU_W_MXFP8)
        for (int i = (int)threadIdx.x; i < 256; i += (int)blockDim.x)
            lut[i] = m3_fp8_to_f32((m3_fp8)i, M3_FP8_E4M3FN);
    else if (WF == M3_GPU_W_MXFP4)
        for (int i = (int)threadIdx.x; i < 16; i += (int)blockDim.x) lut[i] = m3_fp4_to_f32((uint8_t)i);
}

/* MXFP4 codes decoded without a table (NVIDIA sm_89+): an e2m1 code s|e1 e0|m re-laid as the
 * e4m3fn byte s|0 0 e1 e0|m 0 0 has the value 2^-6 x the e2m1 value, subnormals included
 * (e = 0: 2^-6 x m/2), and never a NaN code; the hardware converts 4 such bytes in two
 * instructions. Callers multiply by FP4_WMUL (64, exact) with the block scale. Elsewhere the
 * shared table of exact values (FP4_WMUL 1). */
#if M3_HAVE_FP8_CVT
#define FP4_WMUL 64.0f
#else
#define FP4_WMUL 1.0f
#endif

/* elements 8h .. 8h+7 of a 16-byte weight piece (EPL elements), unscaled (fp4: x 2^-6 on the
 * fast path, see FP4_WMUL) */
template <int WF>
static __device__ __forceinline__ void decode8(uint4 u, int h, const float *lut, float *w) {
    const uint32_t q[4] = {u.x, u.y, u.z, u.w};
    if (WF == M3_GPU_W_BF16) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[2 * k] = m3_bits_f32(q[k] << 16);
            w[2 * k + 1] = m3_bits_f32(q[k] & 0xFFFF0000u);
        }
    } else if (WF == M3_GPU_W_MXFP8) {
#if M3_HAVE_FP8_CVT
        m3_e4m3x4_to_f32(q[2 * h], w);
        m3_e4m3x4_to_f32(q[2 * h + 1], w + 4);
#else
#pragma unroll
        for (int k = 0; k < 8; k++) w[k] = lut[(q[2 * h + k / 4] >> (8 * (k % 4))) & 0xFFu];
#endif
    } else {
        const uint32_t v = q[h]; /* low_even: element 2j in the low nibble of byte j */
#if M3_HAVE_FP8_CVT
        float a[4], b[4];
        m3_e4m3x4_to_f32(((v << 2) & 0x1C1C1C1Cu) | ((v << 4) & 0x80808080u), a); /* even */
        m3_e4m3x4_to_f32(((v >> 2) & 0x1C1C1C1Cu) | (v & 0x80808080u), b);        /* odd */
#pragma unroll
        for (int k = 0; k < 4; k++) w[2 * k] = a[k], w[2 * k + 1] = b[k];
#else
#pragma unroll
        for (int k = 0; k < 8; k++) w[k] = lut[(v >> (4 * k)) & 0xFu];
#endif
    }
}

static __device__ __forceinline__ void bf16x8(uint4 u, float *v) {
    const uint32_t q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[2 * k] = m3_bits_f32(q[k] << 16);
        v[2 * k + 1] = m3_bits_f32(q[k] & 0xFFFF0000u);
    }
}

static __device__ __forceinline__ float swiglu_act(float g, float u, float alpha, float limit,
                                                   int mode) {
    if (mode == M3_SWIGLU_BF16_PER_OP) return m3_swiglu_oai_bf16ops(g, u, alpha, limit);
    float a = m3_swiglu_oai(g, u, alpha, limit);
    return mode == M3_SWIGLU_BF16_ONCE ? m3_round_bf16(a) : a;
}

/* ---- grouping -------------------------------------------------------------------------- */
static __global__ void __launch_bounds__(1024)
    group_k(int32_t *meta, const int32_t *M3_RESTRICT ids, int TK, int E) {
    __shared__ int cnt[EXP_MAX_E], cur[EXP_MAX_E];
    int32_t *off = meta, *act = off + E + 1, *n_act = act + E, *tile_off = n_act + 1;
    int32_t *ent = tile_off + E + 1, *row_of = ent + TK;
    for (int e = (int)threadIdx.x; e < E; e += (int)blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = (int)threadIdx.x; i < TK; i += (int)blockDim.x) {
        const int e = ids[i];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* E <= 1024: a serial scan is a few microseconds at most */
        int o = 0, na = 0, to = 0;
        for (int e = 0; e < E; e++) {
            off[e] = o;
            cur[e] = o;
            if (cnt[e] > 0) {
                act[na] = e;
                tile_off[na] = to;
                na++;
                to += (cnt[e] + TILE_BM - 1) / TILE_BM;
            }
            o += cnt[e];
        }
        off[E] = o;
        tile_off[na] = to;
        *n_act = na;
    }
    __syncthreads();
    for (int i = (int)threadIdx.x; i < TK; i += (int)blockDim.x) {
        const int e = ids[i];
        int r = -1;
        if (e >= 0 && e < E) {
            r = atomicAdd(&cur[e], 1);
            ent[r] = i;
        }
        row_of[i] = r;
    }
}

/* ---- small batches: weight-streaming GEMV ------------------------------------------------
 * MODE 0 (gate/up): input rows are x rows of the grouped entries' tokens, kdim = D, two
 *   weight matrices (gate, up) of nout = F rows; out = a [TK, F] (grouped rows).
 * MODE 1 (down): input rows are a's grouped rows, kdim = F, one matrix of nout = D rows;
 *   out = y_e [TK, D] (grouped rows), bf16(a Wd^T).
 * A warp owns RPW output rows, i.e. MR = 2 RPW (gate/up) or RPW (down) weight rows, and
 * streams them together: per step each lane issues SK_UNR x MR 16-byte loads before using
 * any, and every 8 staged input values (loaded and widened once) serve all MR rows. NC (the
 * staged input rows of this pass, 1..SK_NT) is a template argument, so a decode step with one
 * token does no work for absent ones. Partial sums run per 16-byte piece (one MX block or
 * half of one) and are scaled by its power of two (exact). */
template <int WF, int MODE, int RPW, int NC, int U1>
static __device__ __forceinline__ void sk_rows(m3_bf16 *M3_RESTRICT out, const m3_bf16 *xs, int e,
                                               int orow0, int obase, const void *w0, const void *w1,
                                               const m3_e8m0 *s0, const m3_e8m0 *s1, int kdim,
                                               int nout, const float *lut, float alpha, float limit,
                                               int smode, bool act_bf16, int lane) {
    const int EPL = wtraits<WF>::EPL, MR = MODE == 0 ? 2 * RPW : RPW;
    /* steps of loads in flight: U1 in the one-token kernel (T = 1: there the loads are all the
     * work), else what the sums of NC tokens leave of the registers */
    const int UNR = U1 > 0 ? U1 : (NC <= 2 ? SK_UNR : 1);
    const size_t rb = wbytes<WF>((size_t)kdim), nsb = (size_t)kdim / 32;
    const unsigned char *pw[MR];
    const m3_e8m0 *ps[MR];
#pragma unroll
    for (int i = 0; i < MR; i++) {
        int o = obase + (MODE == 0 ? i / 2 : i);
        o = o < nout ? o : nout - 1; /* past the end: a valid row, its result is dropped */
        const size_t row = (size_t)e * nout + o;
        const bool second = MODE == 0 && (i & 1);
        pw[i] = (const unsigned char *)(second ? w1 : w0) + row * rb;
        ps[i] = (second ? s1 : s0) + row * nsb;
    }
    float acc[MR][NC];
#pragma unroll
    for (int i = 0; i < MR; i++)
#pragma unroll
        for (int j = 0; j < NC; j++) acc[i][j] = 0.0f;
    const int step = M3_WARP * EPL;
    const float pre = WF == M3_GPU_W_MXFP4 ? FP4_WMUL : 1.0f;
    for (int cb = lane * EPL; cb < kdim; cb += UNR * step) {
        uint4 q[UNR][MR];
        m3_e8m0 sc[UNR][MR];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int c = cb + u * step;
            if (c >= kdim) continue;
#pragma unroll
            for (int i = 0; i < MR; i++) {
                q[u][i] = *reinterpret_cast<const uint4 *>(pw[i] + wbytes<WF>((size_t)c));
                if (WF != M3_GPU_W_BF16) sc[u][i] = ps[i][c / 32];
            }
        }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int c = cb + u * step;
            if (c >= kdim) continue;
            float part[MR][NC];
#pragma unroll
            for (int i = 0; i < MR; i++)
#pragma unroll
                for (int j = 0; j < NC; j++) part[i][j] = 0.0f;
#pragma unroll
            for (int h = 0; h < EPL / 8; h++) {
                float xv[NC][8];
#pragma unroll
                for (int j = 0; j < NC; j++)
                    bf16x8(reinterpret_cast<const uint4 *>(xs + (size_t)j * kdim + c)[h], xv[j]);
#pragma unroll
                for (int i = 0; i < MR; i++) {
                    float w[8];
                    decode8<WF>(q[u][i], h, lut, w);
#pragma unroll
                    for (int j = 0; j < NC; j++)
#pragma unroll
                        for (int k = 0; k < 8; k++) part[i][j] += w[k] * xv[j][k];
                }
            }
#pragma unroll
            for (int i = 0; i < MR; i++) {
                const float f = WF == M3_GPU_W_BF16 ? 1.0f : m3_e8m0_to_f32(sc[u][i]);
#pragma unroll
                for (int j = 0; j < NC; j++) acc[i][j] += WF == M3_GPU_W_BF16 ? part[i][j] : part[i][j] * pre * f;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int o = obase + r;
#pragma unroll
        for (int j = 0; j < NC; j++) {
            const size_t orow = (size_t)(orow0 + j) * nout + o;
            if (MODE == 0) {
                const float g = m3_warp_sum(acc[2 * r][j]), u = m3_warp_sum(acc[2 * r + 1][j]);
                if (lane == 0 && o < nout) {
                    const float gr = act_bf16 ? m3_round_bf16(g) : g;
                    const float ur = act_bf16 ? m3_round_bf16(u) : u;
                    out[orow] = m3_f32_to_bf16(swiglu_act(gr, ur, alpha, limit, smode));
                }
            } else {
                const float y = m3_warp_sum(acc[r][j]);
                if (lane == 0 && o < nout) out[orow] = m3_f32_to_bf16(y);
            }
        }
    }
}

/* input rows per pass: 4 for bf16; 2 for MX, whose decode leaves no registers for the
 * 3- and 4-row variants in the same kernel (ptxas spills) */
template <int WF> struct sk_nt { enum { N = WF == M3_GPU_W_BF16 ? SK_NT : 2 }; };

/* NTMAX: the most input rows of a pass (sk_nt, or 1 in the T = 1 kernel, whose loads then
 * run U1 steps ahead) */
template <int WF, int MODE, int RPW, int NTMAX, int U1>
static __global__ void __launch_bounds__(EXP_THREADS, 2) /* <= 128 registers: 2 blocks/SM */
    sk_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT ain, exp_meta m, int K,
         const void *M3_RESTRICT w0, const void *M3_RESTRICT w1, const m3_e8m0 *M3_RESTRICT s0,
         const m3_e8m0 *M3_RESTRICT s1, int kdim, int nout, int nt, float alpha, float limit,
         int smode, bool act_bf16) {
    extern __shared__ uint4 sk_dyn[];
    m3_bf16 *xs = reinterpret_cast<m3_bf16 *>(sk_dyn); /* [nt][kdim] */
    __shared__ float lut[256];
    const int s = (int)blockIdx.x;
    if (s >= *m.n_act) return; /* whole block */
    build_lut<WF>(lut);
    const int e = m.act[s], r0 = m.off[e], n = m.off[e + 1] - r0;
    const int lane = (int)threadIdx.x % M3_WARP, warp = (int)threadIdx.x / M3_WARP;
    const int obase = ((int)blockIdx.y * EXP_WARPS + warp) * RPW;
    const int nvec = kdim / 8;
    for (int c0 = 0; c0 < n; c0 += nt) {
        const int nc = n - c0 < nt ? n - c0 : nt;
        __syncthreads(); /* the previous pass's readers are done with xs (and lut built) */
        for (int v = (int)threadIdx.x; v < nc * nvec; v += (int)blockDim.x) {
            const int j = v / nvec, q = v % nvec;
            const int src = MODE == 0 ? m.ent[r0 + c0 + j] / K : r0 + c0 + j;
            reinterpret_cast<uint4 *>(xs)[(size_t)j * nvec + q] =
                reinterpret_cast<const uint4 *>(ain + (size_t)src * kdim)[q];
        }
        __syncthreads();
        if (obase >= nout) continue; /* (after the barriers: every warp takes part in them) */
#define SK_ROWS(NC_)                                                                               \
    sk_rows<WF, MODE, RPW, NC_, NTMAX == 1 ? U1 : 0>(out, xs, e, r0 + c0, obase, w0, w1, s0, s1, \
                                                      kdim, nout, lut, alpha, limit, smode,      \
                                                      act_bf16, lane)
        if (NTMAX == 1 || nc == 1) SK_ROWS(1);
        else if (NTMAX == 2 || nc == 2) SK_ROWS(NTMAX < 2 ? 1 : 2);
        else if (nc == 3) SK_ROWS(NTMAX < 4 ? 1 : 3); /* (NTMAX < 4: never reached) */
        else SK_ROWS(NTMAX < 4 ? 1 : 4);
#undef SK_ROWS
    }
}

/* ---- small batches, NVIDIA: weight-streaming GEMV on tensor cores -----------------------
 * The MX decode GEMV as mma.sync m16n8k16 (bf16 in, fp32 accumulate): the weight rows are the
 * M dimension, the expert's staged input rows (tokens) the N dimension (8 per n-tile, NT
 * tiles per pass), so one decoded weight serves every token of the pass for one mma issue.
 * A warp owns 16 weight rows: MODE 0 rows 0..7 = gate rows o..o+7 and rows 8..15 = up rows
 * o..o+7 (a lane's accumulators then hold g and u of the same (output, token) pairs for the
 * swiglu epilogue); MODE 1 rows = 16 down rows. Lane (g = lane/4, t = lane%4) streams rows g
 * and g+8: per step the quad's 4 lanes load the 16-byte pieces 4s+t of both rows (16 B per
 * lane per row: 16 fp8 / 32 fp4 codes); a warp's k range is split over WK warps of the
 * block (steps wk, wk+WK, ...; partial sums added in a fixed order through shared memory).
 * A fragments: a piece decodes to bf16 pairs w * 2^s exactly (w the code's value, 2^s its
 * block scale; exact: at most 4 significant bits, inexact only below 2^-126, as in tile_k):
 *   MXFP8: the e4m3 byte s|eeee|mmm placed as the bf16 bits s|0000 eeee|mmm 0000 is w *
 *          2^-120 (subnormal codes bf16 subnormals), two codes by one prmt (the byte and its
 *          sign replicated), a shift and a mask (tc_relay), times the bf16 power of two
 *          2^(s+120) (fma.rn.bf16x2 with -0: exact); the common scale (s <= 7) first, its
 *          multiplier one IMAD.
 *   MXFP4: an e2m1 code s|e1 e0|m re-laid as the bf16 bits s|0000000 e1 e0|m000000 is w *
 *          2^-126 (the 0.5 code a bf16 subnormal), times 2^(s+126) (the e4m3 re-lay and
 *          f16 conversion of MXFP8 measured slower here: docs/gpu-log/moe.md).
 *   A block scale whose multiplier would not be a bf16 normal (s > 7 fp8 / 1 fp4)
 *   multiplies by 2^127 and then by the rest (two exact steps; a branch, so only
 *   warps holding such a block pay for it); the NaN scale (0xFF) takes decode8's float path.
 *   A piece holding an e4m3 NaN code (0x7F / 0xFF, which the f16 shift would turn into a
 *   finite value) takes the float path too, so NaN codes decode to NaN as in ref (one test
 *   of the 16 bytes: 9 integer ops a piece; compiled out (NC) when m3_gpu_experts.finite_codes
 *   says the codes hold none, as gpu/layer.hip's upload scan establishes for real checkpoints).
 * The k order inside an mma is free as long as A and B agree: each lane's B registers hold
 * the x pairs of the same elements as its A registers. x is staged in shared memory already
 * in that order: per step, 16-byte units (8 elements) u*4 + t of piece t, the elements of a
 * unit permuted to the A pair order (fp4); the row pitch is 64 bytes past a multiple of 128,
 * so the quarter-warp phases of the 16-byte loads are conflict-free. */
#if defined(M3_HIP_NVIDIA)
#if defined(__CUDA_ARCH__) && !M3_HAVE_MMA
#error "gpu/moe.hip: the decode GEMV needs mma.sync (sm_80 or newer) on NVIDIA"
#endif
#define TC_THREADS 256
#define TC_WARPS (TC_THREADS / 32)
#if !M3_HAVE_MMA /* the host pass parses the kernels too (the device pass has mma: above) */
static __device__ __forceinline__ void m3_mma_bf16_16816(float *c, const uint32_t *a, const uint32_t *b) {
    (void)c, (void)a, (void)b;
}
#endif

template <int WF> struct tcf;
template <> struct tcf<M3_GPU_W_MXFP8> { enum { PE = 16, UP = 2, PPB = 2 }; }; /* elements per piece, */
template <> struct tcf<M3_GPU_W_MXFP4> { enum { PE = 32, UP = 4, PPB = 1 }; }; /* x units, pieces/block */

/* 16 weight bytes, read-only, streamed past L1, with an L2 prefetch hint of 256 bytes (the
 * rest of the row's segment is fetched with the first request; 128 bytes or none measured
 * slower) */
static __device__ __forceinline__ uint4 ld_stream(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* bf16x2 a * m (m a power of two pair): fma with -0 so that signed zeros survive */
static __device__ __forceinline__ uint32_t bf2_mul(uint32_t a, uint32_t m) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(m), "r"(0x80008000u));
    return d;
}

/* the x slot of element w (0..7) of a 16-byte unit: the A pair order of the format */
template <int WF> static __device__ __forceinline__ uint4 tc_perm(uint4 x) {
    if (WF == M3_GPU_W_MXFP8) return x;
    /* MXFP4: pairs (0,4) (1,5) (2,6) (3,7) */
    return make_uint4(__byte_perm(x.x, x.z, 0x5410), __byte_perm(x.x, x.z, 0x7632),
                      __byte_perm(x.y, x.w, 0x5410), __byte_perm(x.y, x.w, 0x7632));
}

/* whether any of the 16 e4m3fn codes is a NaN (s1111111): (b & 0x7F) + 1 sets bit 7 exactly
 * for those, and never carries into the next byte */
static __device__ __forceinline__ bool e4m3_nan16(uint4 q) {
    const uint32_t m = 0x7F7F7F7Fu, o = 0x01010101u;
    return ((((q.x & m) + o) | ((q.y & m) + o) | ((q.z & m) + o) | ((q.w & m) + o)) & 0x80808080u) != 0;
}

/* byte n of the result: byte (c >> 4n) & 7 of {b, a}, or its sign replicated when bit 4n+3
 * of c is set */
static __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* the bf16 pairs of one 32-bit word of codes (2 MXFP8, 4 MXFP4; tc_relay: the 4 words of a
 * piece), each times the bf16 power-of-two pair mul (see tc_decode).
 * MXFP8: an e4m3 byte s|eeee|mmm placed as the bf16 s|0000 eeee|mmm 0000 is its value x
 * 2^-120 (e = 0: a bf16 subnormal of the same value; a NaN code would give a finite value,
 * hence the NaN-code test): one prmt puts the bytes b and sign(b) of two codes in place
 * (b, sign-replicated b, b', sign-replicated b'), a shift by 4 and a mask finish; no
 * conversion instruction (the e4m3x2 -> f16x2 conversion it replaced measured slower).
 * MXFP4: s|e1 e0|m placed as the bf16 s|0000000 e1 e0|m000000 (the value x 2^-126, the 0.5
 * code a subnormal), nibbles k and k + 4 of a word into one pair (16 bits apart: every op
 * serves both halves). Per pair: its two nibbles masked out (of v for pairs (0, 4) and (1, 5),
 * of v >> 8 for (2, 6) and (3, 7)); one integer multiply by 2^6 + 2^12 (nibbles at bits 0 and
 * 16) or 2^2 + 2^8 (bits 4 and 20) adds two shifted copies of each nibble that do not overlap
 * (so no carries): one with the magnitude at bits 6-8 / 22-24, one with the sign at bit
 * 15 / 31; a mask keeps those bits. 13 ops a word instead of session 10's 14 (the even / odd
 * nibbles and the signs masked once a word, then a shift, a shift and a bit-select per pair):
 * dq1_k's gate/up group loop (16 words) 422 -> 406 instructions in the SASS, 0.5% faster at
 * T = 1 and ~1-2% at T = 64, the same bits for all 2^32 words (docs/gpu-log/moe.md, "Decode, session
 * 11"). In PTX: from C, nvcc folded shared masks into every pair (session 10). */
template <int WF>
static __device__ __forceinline__ void tc_relay1(uint32_t v, uint32_t mul, uint32_t *r) {
    if (WF == M3_GPU_W_MXFP8) {
        r[0] = bf2_mul((prmt(v, v, 0x9180u) << 4) & 0x87F087F0u, mul);
        r[1] = bf2_mul((prmt(v, v, 0xB3A2u) << 4) & 0x87F087F0u, mul);
    } else {
        uint32_t w0, w1, w2, w3;
        asm("{\n\t.reg .b32 t, u;\n\t"
            "and.b32 t, %4, 0x000F000F;\n\tmul.lo.u32 t, t, 0x1040;\n\tand.b32 %0, t, 0x81C081C0;\n\t"
            "and.b32 t, %4, 0x00F000F0;\n\tmul.lo.u32 t, t, 0x104;\n\tand.b32 %1, t, 0x81C081C0;\n\t"
            "shr.u32 u, %4, 8;\n\t"
            "and.b32 t, u, 0x000F000F;\n\tmul.lo.u32 t, t, 0x1040;\n\tand.b32 %2, t, 0x81C081C0;\n\t"
            "and.b32 t, u, 0x00F000F0;\n\tmul.lo.u32 t, t, 0x104;\n\tand.b32 %3, t, 0x81C081C0;\n\t}"
            : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
            : "r"(v));
        r[0] = bf2_mul(w0, mul), r[1] = bf2_mul(w1, mul);
        r[2] = bf2_mul(w2, mul), r[3] = bf2_mul(w3, mul);
    }
}
/* the 4 words of a piece (PE / 2 pairs) */
template <int WF>
static __device__ __forceinline__ void tc_relay(const uint32_t *qq, uint32_t mul, uint32_t *r) {
#pragma unroll
    for (int k = 0; k < 4; k++) tc_relay1<WF>(qq[k], mul, r + k * (tcf<WF>::PE / 8));
}
/* MXFP4: the multiplier pair 2^(s + 126 - xsh) of a piece (tc_relay: codes x 2^-126) */
static __device__ __forceinline__ uint32_t tc_mul4(uint32_t s, int xsh) {
    return s * 0x00800080u + (126u - (uint32_t)xsh) * 0x00800080u;
}

/* one 16-byte piece of a row -> PE/2 bf16 pairs (w * 2^s, the tc_perm order), scale byte sb.
 * NC (MXFP8): test the piece for e4m3 NaN codes (the caller's codes may hold some). */
template <int WF, bool NC>
static __device__ __forceinline__ void tc_decode(uint4 q, m3_e8m0 sb, const float *lut, uint32_t *r) {
    const int PE = tcf<WF>::PE;
    const uint32_t qq[4] = {q.x, q.y, q.z, q.w};
#if M3_HAVE_FP8_CVT
    const bool chk = WF == M3_GPU_W_MXFP8 && NC;
    /* the relayed values are w * 2^-F; 2^(s+F) is a bf16 normal up to s = 127 - F (lim); a
     * larger s multiplies by 2^127 first (w * 2^(127-F), exact) and then by the rest */
    const uint32_t F = WF == M3_GPU_W_MXFP8 ? 120u : 126u, lim = 254u - F;
    if (WF == M3_GPU_W_MXFP8) { /* the common case first: (s + F) << 7 in both halves, one IMAD
                                   (MXFP4 measured slower with this split: docs/gpu-log/moe.md) */
        if ((uint32_t)sb <= lim && !(chk && e4m3_nan16(q))) {
            tc_relay<WF>(qq, (uint32_t)sb * 0x00800080u + F * 0x00800080u, r);
            return;
        }
    }
    if (sb != 0xFFu && !(chk && e4m3_nan16(q))) {
        const uint32_t fld = (sb <= lim ? (uint32_t)sb : lim) + F;
        const uint32_t mul = (fld << 7) | (fld << 23);
        tc_relay<WF>(qq, mul, r);
        if (sb > lim) { /* (rare: scales above 2^(127-F)) */
            const uint32_t f2 = 127u + sb - lim, mul2 = (f2 << 7) | (f2 << 23);
#pragma unroll
            for (int k = 0; k < PE / 2; k++) r[k] = bf2_mul(r[k], mul2);
        }
        return;
    }
#endif
    /* float path: exact products, truncated to bf16 (exact values) */
    const float f = m3_e8m0_to_f32(sb) * (WF == M3_GPU_W_MXFP4 ? FP4_WMUL : 1.0f);
#pragma unroll
    for (int h = 0; h < PE / 8; h++) {
        float w[8];
        decode8<WF>(q, h, lut, w);
        uint32_t b[8];
#pragma unroll
        for (int k = 0; k < 8; k++) b[k] = m3_f32_bits(w[k] * f) >> 16;
        if (WF == M3_GPU_W_MXFP8) {
#pragma unroll
            for (int k = 0; k < 4; k++) r[4 * h + k] = b[2 * k] | (b[2 * k + 1] << 16);
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) r[4 * h + k] = b[k] | (b[k + 4] << 16);
        }
    }
}

/* The two pieces of one step (rows g and g + 8) of a lane. MXFP4 with x staged times 2^xsh
 * (xsh 0 or 8, see mx4_xsh): the common case needs one multiply per pair, 2^(s + 126 - xsh)
 * (one IMAD forms the pair), exact while s + 126 - xsh <= 254 and the products stay bf16
 * values: every s of the matrices when the caller's range allows it (mx4_xsh: within [0, 128]
 * with xsh 0, or [3, 136] with xsh 8); otherwise (xsh 0) when every lane's two scales are
 * <= 2^1 (one warp vote a step), else tc_decode per piece (its second multiply / float path;
 * the per-piece tests it needs cost ~20% at T = 64 when a tenth of the blocks take them:
 * docs/gpu-log/moe.md, session 7). FAST (the range allows it): the multiply alone; the kernels compile
 * their k loops for both (m3_bool_c), so that the loop of the known range holds no vote and no
 * per-piece path (keeping them there cost 9-10%: docs/gpu-log/moe.md, sessions 7 and 8). */
template <bool B> struct m3_bool_c { static constexpr bool value = B; };

template <int WF, bool NC, bool FAST>
static __device__ __forceinline__ void tc_decode2(uint4 q0, m3_e8m0 s0, uint4 q1, m3_e8m0 s1, const float *lut,
                                                  uint32_t *r0, uint32_t *r1, int xsh) {
#if M3_HAVE_FP8_CVT
    if (WF == M3_GPU_W_MXFP4 && (FAST || __all_sync(0xFFFFFFFFu, (uint32_t)s0 <= 128u && (uint32_t)s1 <= 128u))) {
        const uint32_t qa[4] = {q0.x, q0.y, q0.z, q0.w}, qb[4] = {q1.x, q1.y, q1.z, q1.w};
        tc_relay<WF>(qa, tc_mul4(s0, xsh), r0);
        tc_relay<WF>(qb, tc_mul4(s1, xsh), r1);
        return;
    }
#else
    (void)xsh;
#endif
    tc_decode<WF, NC>(q0, s0, lut, r0);
    tc_decode<WF, NC>(q1, s1, lut, r1);
}

/* 8 staged x values (bf16) times 2^xsh (xsh 0 or 8); *ovf set when a finite value became
 * infinite: |x| >= 2^120, i.e. an exponent field in [247, 254] (the block then stages x
 * unscaled, xsh 0). CHK false: no test (the caller knows |x| < 2^120: dq1_k's FK 2). The
 * test on both halves of a word at once: with a = the word's exponent fields, (a | 0x8000) -
 * 0x7B80 has bit 15 set when a >= 0x7B80 (247 << 7) and 0xFF00 - a when a <= 0x7F00 (254 <<
 * 7), neither borrowing into the other half; the same answer as a test of each product for
 * infinity (checked on the CPU for every pair of halves), 6 integer operations a word instead
 * of ~16 (docs/gpu-log/moe.md "Decode, session 13") */
template <bool CHK = true>
static __device__ __forceinline__ uint4 x_scaled(uint4 x, int xsh, bool *ovf) {
    if (xsh == 0) return x;
    const uint32_t m = 0x43804380u; /* the bf16 pair (256, 256) */
    if (CHK) {
        const uint32_t xv[4] = {x.x, x.y, x.z, x.w};
        uint32_t f = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t a = xv[i] & 0x7F807F80u;
            f |= ((a | 0x80008000u) - 0x7B807B80u) & (0xFF00FF00u - a);
        }
        if (f & 0x80008000u) *ovf = true;
    }
    return make_uint4(bf2_mul(x.x, m), bf2_mul(x.y, m), bf2_mul(x.z, m), bf2_mul(x.w, m));
}


/* the j-th set bit of m (j < popc(m)) */
static __device__ __forceinline__ int nth_bit(unsigned m, int j) {
    for (; j > 0; j--) m &= m - 1u;
    return __ffs((int)m) - 1;
}

/* WK: warps splitting k (8 / WK row groups of 16 weight rows per block); NT: n-tiles of 8
 * tokens per pass; U: steps of loads issued together, then used; RL: row chunks per block (x
 * staged once for all of them) */
template <int WF, int MODE, int WK, int NT, int U, int RL, bool NC>
static __global__ void __launch_bounds__(TC_THREADS, 2)
    tc_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT ain, exp_meta m, int K,
         const void *M3_RESTRICT w0, const void *M3_RESTRICT w1, const m3_e8m0 *M3_RESTRICT s0,
         const m3_e8m0 *M3_RESTRICT s1, int kdim, int nout, int nt, float alpha, float limit,
         int smode, bool act_bf16, int xsh, bool xfast) {
    extern __shared__ uint4 tc_dyn[]; /* x: [nt][pitch] 16-byte units, times 2^xs */
    __shared__ float red[WK > 1 ? TC_WARPS * NT * 4 * 32 : 1];
    __shared__ float lut[256];
    const int s = (int)blockIdx.x;
    if (s >= *m.n_act) return; /* whole block */
    build_lut<WF>(lut);
    const int PE = tcf<WF>::PE, UP = tcf<WF>::UP, PPB = tcf<WF>::PPB, SE = 4 * PE;
    const int WR = TC_WARPS / WK, OPW = MODE == 0 ? 8 : 16; /* outputs per warp */
    const int e = m.act[s], r0 = m.off[e], n = m.off[e + 1] - r0;
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wk = warp % WK, wr = warp / WK, g = lane / 4, t = lane % 4;
    const int nsteps = (kdim + SE - 1) / SE, npieces = kdim / PE, pitch = nsteps * 4 * UP + 4;
    const size_t rb = wbytes<WF>((size_t)kdim), nsb = (size_t)kdim / 32;
    const unsigned char *pw[2];
    const m3_e8m0 *ps[2];
    /* this lane's two weight rows of row chunk rl; false past the matrix (block-uniform) */
    auto rows_of = [&](int rl, int *obase) -> bool {
        const int cbase = ((int)blockIdx.y * RL + rl) * WR * OPW;
        *obase = cbase + wr * OPW;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int o = MODE == 0 ? *obase + g : *obase + g + 8 * h;
            const size_t row = (size_t)e * nout + (o < nout ? o : nout - 1);
            pw[h] = (const unsigned char *)(MODE == 0 && h ? w1 : w0) + row * rb;
            ps[h] = (MODE == 0 && h ? s1 : s0) + row * nsb;
        }
        return cbase < nout;
    };
    /* step st of this lane's rows; a piece past the row (kdim % SE != 0, or past nsteps) loads
     * the row's last piece: finite codes (or the row's own NaN) times the zero x staged there.
     * Without a zero fill for those pieces the loop has no CS2R / predicated loads in every
     * step (measured 2-3% faster at T = 1: docs/gpu-log/moe.md, "Decode, session 10"). */
    auto load1 = [&](int st, uint4(&q)[2], m3_e8m0(&sc)[2]) {
        const int p = st * 4 + t, pc = p < npieces ? p : npieces - 1;
#pragma unroll
        for (int h = 0; h < 2; h++) q[h] = ld_stream(pw[h] + (size_t)pc * 16), sc[h] = ps[h][pc / PPB];
    };
    float acc[NT][4];
    int xrow[NT];
    int xs = xsh; /* this pass's x scaling (0 after an overflow) */
    auto compute1 = [&](auto fast, int st, const uint4(&q)[2], const m3_e8m0(&sc)[2]) {
        uint32_t a0[PE / 2], a1[PE / 2];
        tc_decode2<WF, NC, decltype(fast)::value>(q[0], sc[0], q[1], sc[1], lut, a0, a1, xs);
#pragma unroll
        for (int j = 0; j < NT; j++) {
            uint32_t xb[PE / 2];
#pragma unroll
            for (int uu = 0; uu < UP; uu++) {
                const uint4 xv = tc_dyn[xrow[j] + st * 4 * UP + uu * 4 + t]; /* (zeros past the row) */
                xb[4 * uu] = xv.x, xb[4 * uu + 1] = xv.y, xb[4 * uu + 2] = xv.z, xb[4 * uu + 3] = xv.w;
            }
#pragma unroll
            for (int i = 0; i < PE / 4; i++) {
                const uint32_t af[4] = {a0[2 * i], a1[2 * i], a0[2 * i + 1], a1[2 * i + 1]};
                const uint32_t bf[2] = {xb[2 * i], xb[2 * i + 1]};
                m3_mma_bf16_16816(acc[j], af, bf);
            }
        }
    };
    uint4 qa[U][2];
    m3_e8m0 sa[U][2];
    for (int c0 = 0; c0 < n; c0 += nt) {
        const int nc = n - c0 < nt ? n - c0 : nt;
        int obase;
        __syncthreads(); /* the previous pass's readers are done with the x rows (lut built) */
        /* (MXFP4: a second time unscaled when x * 2^xsh overflowed; MXFP8: xsh is 0) */
        for (xs = WF == M3_GPU_W_MXFP4 ? xsh : 0;;) {
            bool ovf = false;
            for (int v = tid; v < nc * (kdim / 8); v += TC_THREADS) {
                const int j = v / (kdim / 8), k = (v % (kdim / 8)) * 8;
                const int src = MODE == 0 ? m.ent[r0 + c0 + j] / K : r0 + c0 + j;
                const uint4 x = reinterpret_cast<const uint4 *>(ain + (size_t)src * kdim + k)[0];
                const int st = k / SE, rr = k % SE, pc = rr / PE, u = (rr % PE) / 8;
                tc_dyn[(size_t)j * pitch + st * 4 * UP + u * 4 + pc] =
                    WF == M3_GPU_W_MXFP4 ? x_scaled(tc_perm<WF>(x), xs, &ovf) : tc_perm<WF>(x);
            }
            { /* the pieces past the row (kdim % SE != 0) read as zeros */
                const int pad = (nsteps * 4 - npieces) * UP;
                for (int v = tid; v < nc * pad; v += TC_THREADS) {
                    const int j = v / pad, pp = npieces + (v % pad) / UP, uu = (v % pad) % UP;
                    tc_dyn[(size_t)j * pitch + (pp / 4) * 4 * UP + uu * 4 + pp % 4] = make_uint4(0, 0, 0, 0);
                }
            }
            if (WF != M3_GPU_W_MXFP4) {
                __syncthreads();
                break;
            }
            if (!__syncthreads_or(xs != 0 && ovf)) break;
            xs = 0;
        }
#pragma unroll
        for (int j = 0; j < NT; j++) xrow[j] = (8 * j + g < nc ? 8 * j + g : nc - 1) * pitch;
        for (int rl = 0; rl < RL; rl++) {
            if (!rows_of(rl, &obase)) break; /* block-uniform */
#pragma unroll
            for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
            auto kloop = [&](auto fast) {
                for (int st0 = wk; st0 < nsteps; st0 += WK * U) { /* U steps loaded, then used */
#pragma unroll
                    for (int u = 0; u < U; u++) load1(st0 + u * WK, qa[u], sa[u]);
#pragma unroll
                    for (int u = 0; u < U; u++)
                        if (st0 + u * WK < nsteps) compute1(fast, st0 + u * WK, qa[u], sa[u]);
                }
            };
            if constexpr (WF == M3_GPU_W_MXFP4) {
                if (xfast && xs == xsh) kloop(m3_bool_c<true>());
                else kloop(m3_bool_c<false>());
            } else {
                kloop(m3_bool_c<false>());
            }
            if (WK > 1) { /* partial sums of the k slices, added in slice order by slice 0 */
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++) red[((warp * NT + j) * 4 + i) * 32 + lane] = acc[j][i];
                __syncthreads();
                if (wk == 0) {
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            float v = acc[j][i];
                            for (int w2 = 1; w2 < WK; w2++) v += red[(((warp + w2) * NT + j) * 4 + i) * 32 + lane];
                            acc[j][i] = v;
                        }
                }
            }
            if (wk == 0) {
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int tok = 8 * j + 2 * t + h;
                        if (tok >= nc) continue;
                        m3_bf16 *orow = out + (size_t)(r0 + c0 + tok) * nout;
                        if (MODE == 0) {
                            float gv = acc[j][h], uv = acc[j][2 + h];
                            if (act_bf16) gv = m3_round_bf16(gv), uv = m3_round_bf16(uv);
                            orow[obase + g] = m3_f32_to_bf16(swiglu_act(gv, uv, alpha, limit, smode));
                        } else {
                            orow[obase + g] = m3_f32_to_bf16(acc[j][h]);
                            orow[obase + g + 8] = m3_f32_to_bf16(acc[j][2 + h]);
                        }
                    }
            }
            if (WK > 1) __syncthreads(); /* red is free for the next chunk */
        }
    }
}

/* the order of the one token's combine: ck[r] the r-th valid slot (vm) in ascending (expert id,
 * slot), combine_k's order; cw[r] its weight (the down kernels' thread 0, into shared memory
 * at the kernel's start) */
static __device__ __forceinline__ void t1_order(int *ck, float *cw, const int32_t *ids, const float *wts,
                                                unsigned vm, int K, int nv) {
    int pid = -1, pk = -1;
    for (int r = 0; r < nv; r++) {
        int bk = -1, bid = 0;
        for (int k = 0; k < K; k++) {
            if (!(vm >> k & 1u)) continue;
            const int id = ids[k];
            if ((id > pid || (id == pid && k > pk)) && (bk < 0 || id < bid)) bk = k, bid = id;
        }
        pid = bid, pk = bk, ck[r] = bk, cw[r] = wts[bk];
    }
}

/* y[d] of the one token from the y_e rows of t1_order's list: combine_k's order and
 * arithmetic. ye was written by other blocks of this grid: read through L2. The y_e loads of
 * 4 slots go out together (finding each slot from ids and then waiting for its load was a
 * chain of L2 round trips in the down kernel's last tiles, ~1.6 us of the MXFP4 T = 1 call,
 * docs/gpu-log/moe.md "Decode, session 12") */
static __device__ __forceinline__ void t1_combine_ord(m3_bf16 *y, const m3_bf16 *ye, const int *ck,
                                                      const float *cw, int nv, int d, int D, float rsf,
                                                      bool bf16_combine) {
    float acc = 0.0f;
    for (int r0 = 0; r0 < nv; r0 += 4) {
        float ev[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (r0 + i < nv)
                ev[i] = m3_bits_f32((uint32_t)__ldcg(reinterpret_cast<const unsigned short *>(ye) +
                                                     (size_t)ck[r0 + i] * D + d) << 16);
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (r0 + i < nv) {
                const float wv = cw[r0 + i];
                if (bf16_combine) acc = m3_round_bf16(acc + m3_round_bf16(__fmul_rn(ev[i], wv)));
                else acc = __fadd_rn(acc, __fmul_rn(ev[i], wv)); /* unfused, as ref */
            }
    }
    y[d] = m3_f32_to_bf16(m3_round_bf16(__fmul_rn(rsf, acc)));
}

/* the valid slots of the one token: bit k set when 0 <= ids[k] < E (group_k's rule) */
static __device__ __forceinline__ unsigned t1_slots(const int32_t *ids, int K, int E) {
    unsigned vm = 0;
    for (int k = 0; k < K; k++) {
        const int e = ids[k];
        if (e >= 0 && e < E) vm |= 1u << k;
    }
    return vm;
}

/* T = 1 combine after the down kernel (dq1_k, sk1_k): y[d] from the y_e rows (t1_combine_ord, from
 * t1_order's list), one thread an output. A programmatic dependent of the down kernel: the
 * order is found while the down kernel runs, and that grid's completion (m3_pdl_wait)
 * publishes its y_e stores, so the down kernel needs no per-tile count, fence or combine (its
 * last block per chunk of outputs combined that chunk after an acquire-release count: ~0.9 us
 * more of the MXFP4 call, 5.5% of the bf16 one, docs/gpu-log/moe.md "Decode, session 14"). With no valid
 * slot y = bf16(rsf * 0), as combine_k. */
static __global__ void __launch_bounds__(256)
    t1c_k(m3_bf16 *M3_RESTRICT y, const m3_bf16 *M3_RESTRICT ye, const int32_t *M3_RESTRICT ids,
          const float *M3_RESTRICT wts, int E, int K, int D, float rsf, bool bf16_combine) {
    __shared__ int cks[32]; /* (K <= 32: t1_slots) */
    __shared__ float cws[32];
    const unsigned vm = t1_slots(ids, K, E); /* (ids and wts are inputs of the call) */
    const int nv = __popc(vm), d = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (threadIdx.x == 0) t1_order(cks, cws, ids, wts, vm, K, nv);
    __syncthreads();
    m3_pdl_wait(); /* y_e is the down kernel's */
    if (d >= D) return;
    if (nv == 0)
        y[d] = m3_f32_to_bf16(m3_round_bf16(rsf * 0.0f));
    else
        t1_combine_ord(y, ye, cks, cws, nv, d, D, rsf, bf16_combine);
}

/* T = 1 with the FMA GEMV (sk_rows' one-row form, U1 steps of loads ahead): sk_k's blocks
 * (valid slot, run of EXP_WARPS * RPW outputs), the slot's expert and rows read from ids as in
 * dq1_k (no grouping kernel); MODE 1 is a dependent launch, combined by t1c_k (its dependent:
 * 5.5% less time for bf16 than the combine by each run's last block after a fence and a count,
 * docs/gpu-log/moe.md "Decode, session 14"). */
template <int WF, int MODE, int RPW, int U1>
static __global__ void __launch_bounds__(EXP_THREADS, 2)
    sk1_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT ain, const int32_t *M3_RESTRICT ids,
          int E, int K, const void *M3_RESTRICT w0, const void *M3_RESTRICT w1,
          const m3_e8m0 *M3_RESTRICT s0, const m3_e8m0 *M3_RESTRICT s1, int kdim, int nout,
          float alpha, float limit, int smode, bool act_bf16) {
    extern __shared__ uint4 sk_dyn[];
    m3_bf16 *xs = reinterpret_cast<m3_bf16 *>(sk_dyn); /* [kdim] */
    __shared__ float lut[256];
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32;
    const unsigned vm = t1_slots(ids, K, E);
    const int nv = __popc(vm);
    if (MODE == 1) m3_pdl_wait();      /* a is the gate/up kernel's */
    m3_pdl_trigger();                  /* the next kernel (down; t1c_k) may start */
    if ((int)blockIdx.x >= nv) return; /* whole block (no valid slot: t1c_k writes y) */
    build_lut<WF>(lut);
    const int k = nth_bit(vm, (int)blockIdx.x), e = ids[k];
    const int obase = ((int)blockIdx.y * EXP_WARPS + warp) * RPW;
    const m3_bf16 *src = ain + (size_t)(MODE == 0 ? 0 : k) * kdim;
    for (int v = tid; v < kdim / 8; v += EXP_THREADS)
        reinterpret_cast<uint4 *>(xs)[v] = reinterpret_cast<const uint4 *>(src)[v];
    __syncthreads();
    if (obase < nout)
        sk_rows<WF, MODE, RPW, 1, U1>(out, xs, e, k, obase, w0, w1, s0, s1, kdim, nout, lut, alpha,
                                      limit, smode, act_bf16, lane);
}

/* launch of a T = 1 kernel; pdl: as a programmatic dependent of the previous kernel */
template <typename... P, typename... A>
static m3_status t1_launch(m3_gpu *g, void (*k)(P...), dim3 grid, unsigned threads, size_t sh, bool pdl,
                           const char *name, A... args) {
    M3_TRY(m3_gpu_launch_pdl(g, pdl, k, grid, dim3(threads), sh, args...));
    return m3_gpu_launched_(g, name, __FILE__, __LINE__);
}

/* t1c_k after a T = 1 down kernel (a programmatic dependent of it): y from ye [K, D] */
static m3_status t1c_launch(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *ye, const int32_t *d_ids,
                            const float *d_wts, const m3_moe_params *mp, const m3_profile *p) {
    return t1_launch(g, t1c_k, dim3((unsigned)((mp->dim + 255) / 256)), 256, 0, true,
                     "t1c_k combine", d_y, ye, d_ids, d_wts, mp->n_expert, mp->top_k, mp->dim,
                     mp->routed_scale, (bool)p->moe_bf16_combine);
}

/* T = 1 on sk1_k: gate/up (+ swiglu) into ab [K, F], [act_mid], down into ye [K, D], t1c_k's
 * combine into y */
template <int WF, int U1>
static m3_status sk1_run(m3_gpu *g, m3_bf16 *d_y, m3_bf16 *ab, m3_bf16 *ye, const m3_bf16 *d_x,
                         const int32_t *d_ids, const float *d_wts, const m3_gpu_experts *w,
                         const m3_moe_params *mp, const m3_profile *p, const m3_mx_params *mid) {
    const int E = mp->n_expert, K = mp->top_k, D = mp->dim, F = mp->ffn;
    const int sm = (int)p->swiglu;
    const bool ab16 = p->act_bf16;
    const size_t sh1 = (size_t)D * 2, sh2 = (size_t)F * 2;
    if (sh1 + 1024 > 48 * 1024)
        M3_HIP_TRY(hipFuncSetAttribute((const void *)sk1_k<WF, 0, SK_RPW_GU, U1>,
                                       hipFuncAttributeMaxDynamicSharedMemorySize, (int)sh1));
    if (sh2 + 1024 > 48 * 1024)
        M3_HIP_TRY(hipFuncSetAttribute((const void *)sk1_k<WF, 1, SK_RPW_DN, U1>,
                                       hipFuncAttributeMaxDynamicSharedMemorySize, (int)sh2));
    const int run1 = EXP_WARPS * SK_RPW_GU, run2 = EXP_WARPS * SK_RPW_DN;
    const dim3 g1((unsigned)K, (unsigned)((F + run1 - 1) / run1)), g2((unsigned)K, (unsigned)((D + run2 - 1) / run2));
    M3_TRY(t1_launch(g, sk1_k<WF, 0, SK_RPW_GU, U1>, g1, EXP_THREADS, sh1, false, "sk1_k gate/up",
                     ab, d_x, d_ids, E, K, (const void *)w->gate, (const void *)w->up,
                     (const m3_e8m0 *)w->gate_s, (const m3_e8m0 *)w->up_s, D, F, mp->alpha,
                     mp->limit, sm, ab16));
    if (mid) M3_TRY(m3_gpu_mx_qdq_bf16(g, ab, ab, K, F, mid));
    M3_TRY(t1_launch(g, sk1_k<WF, 1, SK_RPW_DN, U1>, g2, EXP_THREADS, sh2, true, "sk1_k down", ye,
                     (const m3_bf16 *)ab, d_ids, E, K, (const void *)w->down, (const void *)NULL,
                     (const m3_e8m0 *)w->down_s, (const m3_e8m0 *)NULL, F, D, mp->alpha, mp->limit,
                     sm, ab16));
    return t1c_launch(g, d_y, ye, d_ids, d_wts, mp, p);
}

/* One step of MXFP4 codes of a lane (its pieces of rows g and g + 8, scale bytes s0 / s1)
 * against its x units xu[0], xu[4], xu[8], xu[12] (dq1_k's staging), into acc, word by word:
 * the 4 pairs of code word k of each row (tc_relay1), then x unit k and its 2 mma, so that a
 * word's 8 pairs and one x unit are live at a time, not a step's 32 pairs and 4 units
 * (tc_decode2): the k loop of dq1_k's 3-blocks-a-multiprocessor form fits 80 registers. The
 * same A and B values through the same mma in the same order as tc_decode2 and its loop: the
 * same bits. DM 1 (FAST): one multiply a pair, 2^(s + 126 - xsh) (mx4_xsh's range). DM 2
 * (WIDE: that range with x staged unscaled after an overflow, scale bytes in [3, 136]):
 * 2^(min(s, 128) - 1) and then 2^(max(s, 128) - 128), tc_decode's two multiplies for a scale
 * above 2^1 (each exact: the products stay bf16 values between 2^-125 and 6 x 2^9). */
template <int DM>
static __device__ __forceinline__ void dq1_step4(float *acc, uint4 q0, m3_e8m0 s0, uint4 q1,
                                                 m3_e8m0 s1, const uint4 *xu, int xsh) {
    const uint32_t w0[4] = {q0.x, q0.y, q0.z, q0.w}, w1[4] = {q1.x, q1.y, q1.z, q1.w};
    const uint32_t a = s0, b = s1;
    const uint32_t m0 = tc_mul4(DM == 2 && a > 128u ? 128u : a, xsh),
                   m1 = tc_mul4(DM == 2 && b > 128u ? 128u : b, xsh);
    const uint32_t n0 = tc_mul4(a > 128u ? a : 128u, 127), n1 = tc_mul4(b > 128u ? b : 128u, 127);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t r0[4], r1[4];
        tc_relay1<M3_GPU_W_MXFP4>(w0[k], m0, r0);
        tc_relay1<M3_GPU_W_MXFP4>(w1[k], m1, r1);
        if (DM == 2)
#pragma unroll
            for (int i = 0; i < 4; i++) r0[i] = bf2_mul(r0[i], n0), r1[i] = bf2_mul(r1[i], n1);
        const uint4 x = xu[4 * k];
        const uint32_t af0[4] = {r0[0], r1[0], r0[1], r1[1]}, bf0[2] = {x.x, x.y};
        const uint32_t af1[4] = {r0[2], r1[2], r0[3], r1[3]}, bf1[2] = {x.z, x.w};
        m3_mma_bf16_16816(acc, af0, bf0);
        m3_mma_bf16_16816(acc, af1, bf1);
    }
}

/* T = 1, MX weights (MXFP4; MXFP8 whose codes hold no NaN code, NC false): tc_k's tensor-core
 * GEMV for one token, without a grouping kernel or a combine launch. The grouped row of slot k is k
 * itself; the valid slots (t1_slots) are read by every block. Persistent (at most MB blocks per
 * multiprocessor; block b takes the tiles b, b + gridDim.x, ...), a tile: one valid slot's CH
 * outputs (8 (gate/up) or 16 (down) per row group of 8 / WK warps), its k range split over WK warps
 * (partial sums added in warp order through shared memory). Each lane keeps two register sets of U
 * steps of loads (16 bytes of rows g and g + 8, 256-byte L2 prefetch hint): one in flight while the
 * other is decoded, and the next tile's first set in flight during the current tile's reduction.
 * MODE 0: out = a rows [K][F]; launched as a programmatic dependent of the kernel before it
 * (m3_pdl_wait first: 2-3% less time at T = 1, docs/gpu-log/moe.md "Decode, session 11"). MODE 1 (a
 * dependent launch: its first loads go out while gate/up finishes, m3_pdl_wait before it reads a):
 * out = y_e rows [K][D], combined by t1c_k (launched as its dependent), so combine_k's launch and
 * its pass over y_e go away. FK (MXFP4 with a scale range that allows tc_decode2's FAST, mx4_xsh):
 * only that range's k loops (dq1_step4: FAST, and WIDE for a block whose x overflowed when staged
 * times 2^8), no vote and no per-piece float path, so the kernel fits 80 registers and runs 3
 * blocks (24 warps) a multiprocessor with one step a register set (U 1). MXFP4 T = 1, one
 * process: U 1 at 2 blocks 0.0518 ms against U 2's 0.0454, at 3 blocks 0.0455 (with the vote /
 * per-piece loop, 60-80 bytes spilled), without that loop 0.0450 against 0.0462 (timing only:
 * no WIDE), this form 0.0460 against 0.0464-0.0465 (its down kernel spills 40 bytes with WIDE):
 * docs/gpu-log/moe.md "Session 15". The third block's warps hide the k loop's dependency stalls.
 * FK 1: FAST and WIDE; FK 2: FAST only, for a call whose staged x cannot overflow (xsh 0, or the
 * down kernel's a bounded by swiglu's clamps: t1_fk), so neither the overflow test nor the
 * WIDE loop is compiled in (the down kernel's 40 spilled bytes go; -0.1 to -0.2 us in one
 * process, within the spread: docs/gpu-log/moe.md "Session 16"). */
template <int V> struct dq1_dm { static constexpr int value = V; }; /* dq1_k's k loop: below */
template <int WF, int MODE, int WK, int U, bool NC, int MB, int FK>
static __global__ void __launch_bounds__(TC_THREADS, MB)
    dq1_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT ain, const int32_t *M3_RESTRICT ids,
          int E, int K, const void *M3_RESTRICT w0, const void *M3_RESTRICT w1,
          const m3_e8m0 *M3_RESTRICT s0, const m3_e8m0 *M3_RESTRICT s1, int kdim, int nout,
          float alpha, float limit, int smode, bool act_bf16, int xsh, bool xfast) {
    extern __shared__ uint4 tc_dyn[]; /* x: [rows][pitch] 16-byte units, times 2^xs */
    /* the k-warps' partial sums, two buffers by tile parity: a warp writes tile i + 2's sums
     * into tile i's buffer only after tile i + 1's barrier, which the warps reading tile i's
     * sums reach after reading them, so a tile ends without a barrier (~1% of the T = 1 call,
     * docs/gpu-log/moe.md "Decode, session 14") */
    __shared__ float red[WK > 1 ? 2 * TC_WARPS * 2 * 32 : 1];
    __shared__ float lut[256];
    const int PE = tcf<WF>::PE, UP = tcf<WF>::UP, PPB = tcf<WF>::PPB, SE = 4 * PE;
    const int WR = TC_WARPS / WK, OPW = MODE == 0 ? 8 : 16, CH = WR * OPW;
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wk = warp % WK, wr = warp / WK, g = lane / 4, t = lane % 4;
    /* MODE 0 is launched as a programmatic dependent of the kernel before it (its launch
     * overlaps that kernel's end): ids, x and the counters it zeroes wait for that kernel */
    if (MODE == 0) m3_pdl_wait();
    /* MODE 0: the thread's first XP units of x (the staging's, below) loaded before the ids are
     * read: x does not depend on them, so its L2 round trip overlaps theirs (MXFP4 T = 1 -0.1
     * to -0.6 us, MXFP8 -0.4 to -0.8 us in one process; a prefetch into L1 instead was 0.7 us
     * slower: docs/gpu-log/moe.md "Session 16") */
    constexpr int XP = 3;
    uint4 xp[XP];
    if (MODE == 0)
#pragma unroll
        for (int i = 0; i < XP; i++)
            if (tid + i * TC_THREADS < kdim / 8)
                xp[i] = reinterpret_cast<const uint4 *>(ain)[tid + i * TC_THREADS];
    const unsigned vm = t1_slots(ids, K, E);
    const int nv = __popc(vm), nch = nout / CH, ntiles = nv * nch;
    m3_pdl_trigger();                      /* the next kernel (down; t1c_k) may start */
    if ((int)blockIdx.x >= ntiles) return; /* whole block (no valid slot: t1c_k writes y) */
    build_lut<WF>(lut);
    const int nsteps = (kdim + SE - 1) / SE, npieces = kdim / PE, pitch = nsteps * 4 * UP + 4;
    const size_t rb = wbytes<WF>((size_t)kdim), nsb = (size_t)kdim / 32;
    uint4 *xs = tc_dyn;
    /* a tile's slot, first output of this warp, weight rows and scale rows of this lane */
    auto rows_of = [&](int tile, int *slot, int *obase, const unsigned char **pw, const m3_e8m0 **ps) {
        *slot = nth_bit(vm, tile / nch);
        *obase = (tile % nch) * CH + wr * OPW;
        const int e = ids[*slot];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int o = MODE == 0 ? *obase + g : *obase + g + 8 * h;
            const size_t row = (size_t)e * nout + o;
            pw[h] = (const unsigned char *)(MODE == 0 && h ? w1 : w0) + row * rb;
            ps[h] = (MODE == 0 && h ? s1 : s0) + row * nsb;
        }
    };
    /* U steps of this lane's rows from st0 (steps st0, st0 + WK, ...); a piece past the row
     * loads the row's last piece (x is zero there: tc_k's load1) */
    auto load = [&](const unsigned char *const *pw, const m3_e8m0 *const *ps, int st0, uint4(&q)[U][2],
                    m3_e8m0(&sc)[U][2]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int p = (st0 + u * WK) * 4 + t, pc = p < npieces ? p : npieces - 1;
#pragma unroll
            for (int h = 0; h < 2; h++) q[u][h] = ld_stream(pw[h] + (size_t)pc * 16), sc[u][h] = ps[h][pc / PPB];
        }
    };
    /* two register sets of U steps: one loading while the other is used, across tiles */
    const int G = (nsteps - wk + WK * U - 1) / (WK * U); /* this warp's groups a tile (may be 0) */
    int tile = (int)blockIdx.x, slot, obase, nslot, nobase;
    const unsigned char *cpw[2], *npw[2];
    const m3_e8m0 *cps[2], *nps[2];
    rows_of(tile, &slot, &obase, cpw, cps);
    uint4 qa[U][2], qb[U][2];
    m3_e8m0 sa[U][2], sb[U][2];
    load(cpw, cps, wk, qa, sa); /* in flight while the rows are staged */
    /* (MODE 1 launched as a dependent of MODE 0: the weights and ids above are inputs of the
     * call; a and the counters are MODE 0's) */
    if (MODE == 1) m3_pdl_wait();
    /* x rows in the A pair order: MODE 0 the token's row (every slot's), MODE 1 a's row k of
     * the valid slots of this block's tiles (row j of xs: the j-th valid slot; a block's ~3
     * tiles need 2-3 of the 4 rows at M3's sizes: every block reads the same rows from L2 at
     * once, and fewer rows shorten that step, 1% of the call, docs/gpu-log/moe.md "Decode, session 12") */
    unsigned need = 0; /* MODE 1: bit j, row j is read */
    if (MODE == 1)
        for (int tl = (int)blockIdx.x; tl < ntiles; tl += (int)gridDim.x) need |= 1u << (tl / nch);
    const int nx = MODE == 0 ? 1 : __popc(need);
    /* x staged times 2^xsc (MXFP4; 0 after an overflow: a second pass unscaled; MXFP8: 0) */
    int xsc = WF == M3_GPU_W_MXFP4 ? xsh : 0;
    for (;;) {
        bool ovf = false;
        /* unit v of a row (elements 8v .. 8v + 7): step v / (SE / 8), piece (v / (PE / 8)) % 4 of
         * the step, unit v % (PE / 8) of the piece */
        auto put = [&](uint4 *xr, int v, uint4 x) {
            const int st = v / (SE / 8), pc = (v / (PE / 8)) % 4, u = v % (PE / 8);
            xr[st * 4 * UP + u * 4 + pc] = WF == M3_GPU_W_MXFP4
                                               ? x_scaled<FK != 2>(tc_perm<WF>(x), xsc, &ovf)
                                               : tc_perm<WF>(x);
        };
        /* row by row, so that a unit's place is shifts and masks of its index (one index over
         * all rows cost a runtime division and nth_bit per unit: docs/gpu-log/moe.md "Decode, session
         * 13"); MODE 0 starts with the units in xp */
        for (int jj = 0; jj < nx; jj++) {
            const int j = MODE == 0 ? 0 : nth_bit(need, jj), src = MODE == 0 ? 0 : nth_bit(vm, j);
            const uint4 *xg = reinterpret_cast<const uint4 *>(ain + (size_t)src * kdim);
            uint4 *xr = xs + (size_t)j * pitch;
            if (MODE == 0)
#pragma unroll
                for (int i = 0; i < XP; i++)
                    if (tid + i * TC_THREADS < kdim / 8) put(xr, tid + i * TC_THREADS, xp[i]);
            for (int v = MODE == 0 ? tid + XP * TC_THREADS : tid; v < kdim / 8; v += TC_THREADS)
                put(xr, v, xg[v]);
        }
        { /* the pieces past the row (kdim % SE != 0) read as zeros */
            const int pad = (nsteps * 4 - npieces) * UP;
            for (int v = tid; v < nx * pad; v += TC_THREADS) {
                const int j = MODE == 0 ? 0 : nth_bit(need, v / pad), pp = npieces + (v % pad) / UP,
                          uu = (v % pad) % UP;
                xs[(size_t)j * pitch + (pp / 4) * 4 * UP + uu * 4 + pp % 4] = make_uint4(0, 0, 0, 0);
            }
        }
        if (WF != M3_GPU_W_MXFP4 || FK == 2) {
            __syncthreads();
            break;
        }
        if (!__syncthreads_or(xsc != 0 && ovf)) break;
        xsc = 0;
    }
    /* the tiles; DM: the k loop: 0 tc_decode2's vote / per-piece path, 1 a known scale range
     * (tc_decode2's FAST; FK: dq1_step4), 2 (FK) that range with x unscaled after an overflow */
    int pty = 0; /* the tile's parity (red's buffer) */
    auto tiles = [&](auto dm) {
        constexpr int DM = decltype(dm)::value;
        for (;;) {
            const int xr = (MODE == 0 ? 0 : tile / nch) * pitch, next = tile + (int)gridDim.x;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (next < ntiles) rows_of(next, &nslot, &nobase, npw, nps);
            for (int gi = 0; gi < G; gi++) {
                const int st0 = wk + gi * WK * U;
                if (gi + 1 < G) load(cpw, cps, st0 + WK * U, qb, sb);
                else if (next < ntiles) load(npw, nps, wk, qb, sb);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int st = st0 + u * WK;
                    if (st >= nsteps) continue;
                    if constexpr (WF == M3_GPU_W_MXFP4 && FK && DM != 0) {
                        dq1_step4<DM>(acc, qa[u][0], sa[u][0], qa[u][1], sa[u][1],
                                      xs + xr + st * 4 * UP + t, xsc);
                        continue;
                    }
                    uint32_t a0[PE / 2], a1[PE / 2], xb[PE / 2];
                    tc_decode2<WF, NC, DM == 1>(qa[u][0], sa[u][0], qa[u][1], sa[u][1], lut, a0, a1, xsc);
#pragma unroll
                    for (int uu = 0; uu < UP; uu++) {
                        const uint4 xv = xs[xr + st * 4 * UP + uu * 4 + t]; /* (zeros past the row) */
                        xb[4 * uu] = xv.x, xb[4 * uu + 1] = xv.y, xb[4 * uu + 2] = xv.z, xb[4 * uu + 3] = xv.w;
                    }
#pragma unroll
                    for (int i = 0; i < PE / 4; i++) {
                        const uint32_t af[4] = {a0[2 * i], a1[2 * i], a0[2 * i + 1], a1[2 * i + 1]};
                        const uint32_t bf[2] = {xb[2 * i], xb[2 * i + 1]};
                        m3_mma_bf16_16816(acc, af, bf);
                    }
                }
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int h = 0; h < 2; h++) qa[u][h] = qb[u][h], sa[u][h] = sb[u][h];
            }
            /* column 0 (the token): lanes t == 0, c[0] row g, c[2] row g + 8 */
            if (WK > 1) {
                float *rd = red + (pty & 1) * TC_WARPS * 2 * 32;
                if (t == 0) rd[(warp * 2) * 32 + g] = acc[0], rd[(warp * 2 + 1) * 32 + g] = acc[2];
                __syncthreads();
                if (wk == 0 && t == 0)
                    for (int w2 = 1; w2 < WK; w2++) {
                        acc[0] += rd[((warp + w2) * 2) * 32 + g];
                        acc[2] += rd[((warp + w2) * 2 + 1) * 32 + g];
                    }
            }
            if (wk == 0 && t == 0) {
                m3_bf16 *orow = out + (size_t)slot * nout;
                if (MODE == 0) {
                    float gv = acc[0], uv = acc[2];
                    if (act_bf16) gv = m3_round_bf16(gv), uv = m3_round_bf16(uv);
                    orow[obase + g] = m3_f32_to_bf16(swiglu_act(gv, uv, alpha, limit, smode));
                } else {
                    orow[obase + g] = m3_f32_to_bf16(acc[0]);
                    orow[obase + g + 8] = m3_f32_to_bf16(acc[2]);
                }
            }
            pty++;
            if (next >= ntiles) break; /* block-uniform */
            tile = next, slot = nslot, obase = nobase;
            cpw[0] = npw[0], cpw[1] = npw[1], cps[0] = nps[0], cps[1] = nps[1];
        }
    };
    if constexpr (WF == M3_GPU_W_MXFP4 && FK == 2) { /* (no overflow: x staged times 2^xsh) */
        tiles(dq1_dm<1>());
    } else if constexpr (WF == M3_GPU_W_MXFP4 && FK) { /* (the caller's range allows FAST) */
        if (xsc == xsh) tiles(dq1_dm<1>());
        else tiles(dq1_dm<2>());
    } else if constexpr (WF == M3_GPU_W_MXFP4) {
        if (xfast && xsc == xsh) tiles(dq1_dm<1>());
        else tiles(dq1_dm<0>());
    } else {
        tiles(dq1_dm<0>());
    }
}

/* MXFP4 decode from the caller's scale range (m3_gpu_experts.mx_scale_lo / hi, gpu/layer.hip's
 * upload scan): *fast when one bf16 multiply a code pair is exact for every block, i.e. the k
 * loops compiled without the per-step vote and the per-piece path (tc_decode2's FAST). Every
 * byte <= 128 (2^1; real checkpoints: ~2^-7): 2^(s + 126) is a bf16 normal and codes x
 * 2^(s-127) are bf16 values, x unscaled (xsh 0). Every byte in [3, 136] with some above 128:
 * x staged times 2^8 (xsh 8) and the multiplier 2^(s + 118) (codes x 2^(s-135) stay bf16 values
 * from s = 3 on; x * 2^8 is exact below 2^120, the kernels check that and stage unscaled,
 * without FAST, otherwise). Any other range, or none given: xsh 0, the vote per step (scales
 * <= 128 on every lane) and tc_decode's per-piece path; exact either way. */
static int mx4_xsh(const m3_gpu_experts *w, bool *fast) {
    const int lo = w->mx_scale_lo, hi = w->mx_scale_hi;
    *fast = w->fmt == M3_GPU_W_MXFP4 && hi > 0 && lo >= 0 && lo <= hi && (hi <= 128 || (hi <= 136 && lo >= 3));
    return *fast && hi > 128 ? 8 : 0;
}

/* dq1_k's FK for MXFP4 T = 1 whose scale range allows FAST (mx4_xsh): 2 (no overflow test, no
 * WIDE loop: the down kernel's 40 spilled bytes go, docs/gpu-log/moe.md "Session 15") where
 * its staged x cannot overflow, else 1. mode 0 (gate/up): x is the layer input, unbounded: 2
 * only with xsh 0 (x staged unscaled). mode 1 (down): also where a = swiglu_oai(g, u) is
 * known below 2^120 (a staged times 2^8 stays finite). With L = limit, u' = clamp(u, -L, L)
 * lies in [-|L|, |L|] (L < 0 clamps every u to -L), so |u' + 1| <= |L| + 1; g' = min(g, L)
 * <= L: for g' >= 0, g' sigmoid(alpha g') <= g' <= |L|; for g' < 0 and alpha > 0, |g'| / (1 +
 * e^(alpha |g'|)) < |g'| e^(-alpha |g'|) <= 1 / (e alpha) < 1 / alpha. So |a| <= B = (|L| + 1)
 * max(|L|, 1 / alpha) for finite L and finite alpha > 0 (NaN g / u give NaN: staged as NaN,
 * no overflow; g = -inf gives NaN). The roundings on the way (hf's five bf16 roundings, expf,
 * act_bf16's bf16 g and u before the clamps, a's bf16 store) move that by a factor far below
 * 2^50, so B <= 2^64 leaves |a| < 2^120 with room (M3: L 7, alpha 1.702, B 56). A mid
 * activation quantization (act_mid) rewrites a between the kernels: not covered, FK 1. */
static int t1_fk(const m3_gpu_experts *w, const m3_moe_params *mp, const m3_mx_params *mid,
                 int mode) {
    bool fast;
    const int xsh = mx4_xsh(w, &fast);
    if (!fast) return 0;
    if (xsh == 0) return 2;
    if (mode == 0 || mid) return 1;
    const double L = fabs((double)mp->limit), al = (double)mp->alpha;
    if (!isfinite(L) || !isfinite(al) || !(al > 0.0)) return 1;
    return (L + 1.0) * (L > 1.0 / al ? L : 1.0 / al) <= 0x1p64 ? 2 : 1;
}

/* T = 1, MX weights: the two dq1_k launches and t1c_k (y written by the third); ab [K, F] and
 * ye [K, D] scratch; FK0 / FK1: dq1_k's FK of the gate/up / down kernel */
template <int WF, int WK, int U, bool NC, int MB, int FK0, int FK1>
static m3_status dq1_run(m3_gpu *g, m3_bf16 *d_y, m3_bf16 *ab, m3_bf16 *ye, const m3_bf16 *d_x,
                         const int32_t *d_ids, const float *d_wts, const m3_gpu_experts *w,
                         const m3_moe_params *mp, const m3_profile *p, const m3_mx_params *mid) {
    const int E = mp->n_expert, K = mp->top_k, D = mp->dim, F = mp->ffn;
    bool xf;
    const int sm = (int)p->swiglu, xsh = mx4_xsh(w, &xf);
    const bool ab16 = p->act_bf16;
    const int SE = 4 * tcf<WF>::PE, UP = tcf<WF>::UP, WR = TC_WARPS / WK;
    const size_t sh1 = (size_t)(((D + SE - 1) / SE) * 4 * UP + 4) * 16;
    const size_t sh2 = (size_t)K * (((F + SE - 1) / SE) * 4 * UP + 4) * 16;
    M3_HIP_TRY(hipFuncSetAttribute((const void *)dq1_k<WF, 0, WK, U, NC, MB, FK0>,
                                   hipFuncAttributeMaxDynamicSharedMemorySize, (int)sh1));
    M3_HIP_TRY(hipFuncSetAttribute((const void *)dq1_k<WF, 1, WK, U, NC, MB, FK1>,
                                   hipFuncAttributeMaxDynamicSharedMemorySize, (int)sh2));
    const int cap = MB * g->n_sm, t1 = K * (F / (WR * 8)), t2 = K * (D / (WR * 16));
    M3_TRY(t1_launch(g, dq1_k<WF, 0, WK, U, NC, MB, FK0>, dim3((unsigned)(t1 < cap ? t1 : cap)),
                     TC_THREADS, sh1, true, "dq1_k gate/up", ab, d_x, d_ids, E, K,
                     (const void *)w->gate, (const void *)w->up, (const m3_e8m0 *)w->gate_s,
                     (const m3_e8m0 *)w->up_s, D, F, mp->alpha, mp->limit, sm, ab16, xsh, xf));
    if (mid) M3_TRY(m3_gpu_mx_qdq_bf16(g, ab, ab, K, F, mid));
    M3_TRY(t1_launch(g, dq1_k<WF, 1, WK, U, NC, MB, FK1>, dim3((unsigned)(t2 < cap ? t2 : cap)),
                     TC_THREADS, sh2, true, "dq1_k down", ye, (const m3_bf16 *)ab, d_ids, E, K,
                     (const void *)w->down, (const void *)NULL, (const m3_e8m0 *)w->down_s,
                     (const m3_e8m0 *)NULL, F, D, mp->alpha, mp->limit, sm, ab16, xsh, xf));
    return t1c_launch(g, d_y, ye, d_ids, d_wts, mp, p);
}

/* tc_k launches: gate/up (+ swiglu), [act_mid], down */
template <int WF, int WK, int NT, int U, int RL, bool NC>
static m3_status tc_run(m3_gpu *g, m3_bf16 *ab, m3_bf16 *ye, const m3_bf16 *d_x, const exp_meta &m,
                        int T, const m3_gpu_experts *w, const m3_moe_params *mp, const m3_profile *p,
                        const m3_mx_params *mid) {
    const int E = mp->n_expert, K = mp->top_k, D = mp->dim, F = mp->ffn, TK = T * K;
    bool xf;
    const int sm = (int)p->swiglu, slots = TK < E ? TK : E, xsh = mx4_xsh(w, &xf);
    const bool ab16 = p->act_bf16;
    const int nt = T < 8 * NT ? T : 8 * NT;
    const int SE = 4 * tcf<WF>::PE, UP = tcf<WF>::UP, WR = TC_WARPS / WK;
    const size_t sh1 = (size_t)nt * (((D + SE - 1) / SE) * 4 * UP + 4) * 16;
    const size_t sh2 = (size_t)nt * (((F + SE - 1) / SE) * 4 * UP + 4) * 16;
    if (sh1 > 48 * 1024 - 9 * 1024)
        M3_HIP_TRY(hipFuncSetAttribute((const void *)tc_k<WF, 0, WK, NT, U, RL, NC>,
                                       hipFuncAttributeMaxDynamicSharedMemorySize, (int)sh1));
    if (sh2 > 48 * 1024 - 9 * 1024)
        M3_HIP_TRY(hipFuncSetAttribute((const void *)tc_k<WF, 1, WK, NT, U, RL, NC>,
                                       hipFuncAttributeMaxDynamicSharedMemorySize, (int)sh2));
    const int ch1 = WR * 8 * RL, ch2 = WR * 16 * RL; /* outputs per block */
    dim3 g1((unsigned)slots, (unsigned)((F + ch1 - 1) / ch1));
    tc_k<WF, 0, WK, NT, U, RL, NC><<<g1, TC_THREADS, sh1, g->stream>>>(
        ab, d_x, m, K, w->gate, w->up, w->gate_s, w->up_s, D, F, nt, mp->alpha, mp->limit, sm, ab16, xsh, xf);
    M3_LAUNCHED(g, "tc_k gate/up");
    if (mid) M3_TRY(m3_gpu_mx_qdq_bf16(g, ab, ab, TK, F, mid));
    dim3 g2((unsigned)slots, (unsigned)((D + ch2 - 1) / ch2));
    tc_k<WF, 1, WK, NT, U, RL, NC><<<g2, TC_THREADS, sh2, g->stream>>>(
        ye, ab, m, K, w->down, NULL, w->down_s, NULL, F, D, nt, mp->alpha, mp->limit, sm, ab16, xsh, xf);
    M3_LAUNCHED(g, "tc_k down");
    return M3_OK;
}
#endif /* M3_HIP_NVIDIA */

extern "C" int m3_gpu_moe_mx4_fast(const m3_gpu_experts *w) {
#if defined(M3_HIP_NVIDIA)
    bool fast;
    (void)mx4_xsh(w, &fast);
    return fast ? 1 : 0;
#else
    (void)w; /* AMD: the FMA GEMV sk_k, exact tables, no such decode */
    return 0;
#endif
}

/* ---- larger batches: tensor-core tiles ----------------------------------------------------
 * Block (row tile, column tile): rows row0..row0+63 of one active expert's grouped rows;
 * MODE 0: columns f0..f0+63 of gate (tile columns 0..63) and of up (64..127), out = a;
 * MODE 1: columns d0..d0+127 of down, out = y_e. Warps 2 x 4, each 32 x 32. */
struct alignas(16) tile_smem { /* 16-byte rows: uint4 stores, ldmatrix */
    union {
        struct {
            m3_bf16 a[2][TILE_BM * TILE_LDS];
            m3_bf16 b[2][TILE_BN * TILE_LDS];
        } s;
        float c[TILE_BM * TILE_CP];
    } u;
    float lut[256];
    int src[TILE_BM];
};

template <int WF> struct bregs; /* the global loads of one k-step of the B tile */
template <> struct bregs<M3_GPU_W_BF16> { uint4 v[2]; m3_e8m0 s; /* unused */ };
template <> struct bregs<M3_GPU_W_MXFP8> { uint4 v[1]; m3_e8m0 s; };
template <> struct bregs<M3_GPU_W_MXFP4> { uint4 v[1]; m3_e8m0 s; };

/* weight row of tile column n */
template <int MODE>
static __device__ __forceinline__ size_t tile_wrow(int n, int e, int col0, int nout,
                                                   const void *w0, const void *w1, const void **w) {
    if (MODE == 0) {
        *w = n < TILE_BN / 2 ? w0 : w1;
        return (size_t)e * nout + col0 + (n % (TILE_BN / 2));
    }
    *w = w0;
    return (size_t)e * nout + col0 + n;
}

template <int WF, int MODE>
static __device__ __forceinline__ void tile_load_b(bregs<WF> &r, int k0, int e, int col0, int kdim,
                                                   int nout, const void *w0, const void *w1,
                                                   const m3_e8m0 *s0, const m3_e8m0 *s1) {
    const int tid = (int)threadIdx.x;
    const size_t rb = wbytes<WF>((size_t)kdim);
    if (WF == M3_GPU_W_BF16) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int idx = tid + h * EXP_THREADS, n = idx / 4, part = idx % 4;
            const void *w;
            const size_t row = tile_wrow<MODE>(n, e, col0, nout, w0, w1, &w);
            r.v[h] = *reinterpret_cast<const uint4 *>((const unsigned char *)w + row * rb +
                                                      wbytes<WF>((size_t)k0 + part * 8));
        }
    } else {
        const int per = WF == M3_GPU_W_MXFP8 ? 2 : 1; /* 16-byte pieces per row and k-step */
        const int n = tid / per, part = tid % per;
        if (n < TILE_BN) {
            const void *w;
            const size_t row = tile_wrow<MODE>(n, e, col0, nout, w0, w1, &w);
            r.v[0] = *reinterpret_cast<const uint4 *>((const unsigned char *)w + row * rb +
                                                      wbytes<WF>((size_t)k0) + (size_t)part * 16);
            const m3_e8m0 *s = (MODE == 0 && n >= TILE_BN / 2) ? s1 : s0;
            r.s = s[row * ((size_t)kdim / 32) + (size_t)k0 / 32];
        }
    }
}

template <int WF>
static __device__ __forceinline__ void tile_store_b(const bregs<WF> &r, m3_bf16 *b, const float *lut) {
    const int tid = (int)threadIdx.x;
    if (WF == M3_GPU_W_BF16) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int idx = tid + h * EXP_THREADS, n = idx / 4, part = idx % 4;
            *reinterpret_cast<uint4 *>(b + n * TILE_LDS + part * 8) = r.v[h];
        }
    } else {
        const int per = WF == M3_GPU_W_MXFP8 ? 2 : 1;
        const int n = tid / per, part = tid % per;
        if (n >= TILE_BN) return;
        const int EPL = wtraits<WF>::EPL;
        float v[EPL];
#pragma unroll
        for (int h = 0; h < EPL / 8; h++) decode8<WF>(r.v[0], h, lut, v + 8 * h);
        const float sc = m3_e8m0_to_f32(r.s);
        const float pre = WF == M3_GPU_W_MXFP4 ? FP4_WMUL : 1.0f; /* exact, before the scale */
        uint32_t q[EPL / 2];
#pragma unroll
        for (int i = 0; i < EPL / 2; i++) /* exact values: the top 16 bits are the bf16 */
            q[i] = (m3_f32_bits(v[2 * i] * pre * sc) >> 16) |
                   (m3_f32_bits(v[2 * i + 1] * pre * sc) & 0xFFFF0000u);
        uint4 *dst = reinterpret_cast<uint4 *>(b + n * TILE_LDS + part * EPL);
#pragma unroll
        for (int i = 0; i < EPL / 8; i++) dst[i] = make_uint4(q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]);
    }
}

#if M3_HAVE_MMA
/* ldmatrix .x4: lanes 8m..8m+7 give the row addresses of 8x8 matrix m (16-byte rows); lane l
 * receives r[m] = matrix m's row l/4, elements 2(l%4), 2(l%4)+1: the mma fragment layout. */
static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const m3_bf16 *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
#endif

/* acc: NVIDIA [mi 2][ni 4][4] mma layout; portable: element i*M3_WARP+lane of the 32x32 warp tile.
 * NVIDIA fragments come from ldmatrix (4 instructions per 8 mma instead of 16 32-bit loads):
 * A matrices (rows +0/+8) x (k +0/+8), B matrices (n +0..7 | +8..15) x (k +0/+8); the padded
 * 80-byte rows put the 8 row addresses of a matrix in 8 distinct 16-byte bank groups. */
static __device__ __forceinline__ void tile_mma(float *acc, const m3_bf16 *A, const m3_bf16 *B, int wm,
                                                int wn, int lane) {
#if M3_HAVE_MMA
    const int mx = lane / 8, rr = lane % 8;
#pragma unroll
    for (int kk = 0; kk < TILE_BK; kk += 16) {
        uint32_t af[2][4], bfr[4][2];
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
            ldsm_x4(af[mi], A + (wm * 32 + mi * 16 + (mx & 1) * 8 + rr) * TILE_LDS + kk + (mx >> 1) * 8);
#pragma unroll
        for (int np = 0; np < 2; np++) {
            uint32_t t[4];
            ldsm_x4(t, B + (wn * 32 + np * 16 + (mx >> 1) * 8 + rr) * TILE_LDS + kk + (mx & 1) * 8);
            bfr[2 * np][0] = t[0], bfr[2 * np][1] = t[1];
            bfr[2 * np + 1][0] = t[2], bfr[2 * np + 1][1] = t[3];
        }
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < 4; ni++) m3_mma_bf16_16816(acc + (mi * 4 + ni) * 4, af[mi], bfr[ni]);
    }
#else
#pragma unroll
    for (int i = 0; i < 1024 / M3_WARP; i++) {
        const int el = i * M3_WARP + lane, r = wm * 32 + el / 32, c = wn * 32 + el % 32;
        float s = acc[i];
        for (int k = 0; k < TILE_BK; k++)
            s += m3_bf16_to_f32(A[r * TILE_LDS + k]) * m3_bf16_to_f32(B[c * TILE_LDS + k]);
        acc[i] = s;
    }
#endif
}

static __device__ __forceinline__ void tile_acc_store(float *C, const float *acc, int wm, int wn,
                                                      int lane) {
#if M3_HAVE_MMA
    const int gq = lane / 4, tq = lane % 4;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            const float *a = acc + (mi * 4 + ni) * 4;
            const int r = wm * 32 + mi * 16 + gq, c = wn * 32 + ni * 8 + 2 * tq;
            C[r * TILE_CP + c] = a[0];
            C[r * TILE_CP + c + 1] = a[1];
            C[(r + 8) * TILE_CP + c] = a[2];
            C[(r + 8) * TILE_CP + c + 1] = a[3];
        }
#else
#pragma unroll
    for (int i = 0; i < 1024 / M3_WARP; i++) {
        const int el = i * M3_WARP + lane;
        C[(wm * 32 + el / 32) * TILE_CP + wn * 32 + el % 32] = acc[i];
    }
#endif
}

template <int WF, int MODE>
static __global__ void __launch_bounds__(EXP_THREADS)
    tile_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT ain, exp_meta m, int K,
           const void *M3_RESTRICT w0, const void *M3_RESTRICT w1, const m3_e8m0 *M3_RESTRICT s0,
           const m3_e8m0 *M3_RESTRICT s1, int kdim, int nout, float alpha, float limit, int smode,
           bool act_bf16) {
    __shared__ tile_smem sm;
    const int na = *m.n_act, bx = (int)blockIdx.x;
    if (bx >= m.tile_off[na]) return; /* whole block */
    int lo = 0, hi = na - 1; /* the slot s with tile_off[s] <= bx < tile_off[s+1] */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (m.tile_off[mid] <= bx) lo = mid;
        else hi = mid - 1;
    }
    const int e = m.act[lo], r0 = m.off[e], n = m.off[e + 1] - r0;
    const int row0 = (bx - m.tile_off[lo]) * TILE_BM;
    const int col0 = (int)blockIdx.y * (MODE == 0 ? TILE_BN / 2 : TILE_BN);
    const int tid = (int)threadIdx.x, lane = tid % M3_WARP, warp = tid / M3_WARP;
    build_lut<WF>(sm.lut);
    if (tid < TILE_BM) {
        const int gr = row0 + tid;
        sm.src[tid] = gr < n ? (MODE == 0 ? m.ent[r0 + gr] / K : r0 + gr) : -1;
    }
    __syncthreads();
    const int wm = M3_WARP == 32 ? warp / 4 : 0, wn = M3_WARP == 32 ? warp % 4 : 0;
    /* 4 warps of 64 (AMD) cover the 64 x 128 tile as 2 x 4 32x32 tiles, two each */
    const int ar = tid / 4, apart = tid % 4;
    const int asrc = sm.src[ar];
    float acc[32], acc2[32];
#pragma unroll
    for (int i = 0; i < 32; i++) acc[i] = acc2[i] = 0.0f;
    uint4 ra;
    bregs<WF> rb;
    const int nk = kdim / TILE_BK;
    ra = asrc >= 0 ? *reinterpret_cast<const uint4 *>(ain + (size_t)asrc * kdim + apart * 8)
                   : make_uint4(0, 0, 0, 0);
    tile_load_b<WF, MODE>(rb, 0, e, col0, kdim, nout, w0, w1, s0, s1);
    *reinterpret_cast<uint4 *>(sm.u.s.a[0] + ar * TILE_LDS + apart * 8) = ra;
    tile_store_b<WF>(rb, sm.u.s.b[0], sm.lut);
    __syncthreads();
    for (int ks = 0; ks < nk; ks++) {
        const int cur = ks & 1;
        if (ks + 1 < nk) {
            const int k0 = (ks + 1) * TILE_BK;
            ra = asrc >= 0 ? *reinterpret_cast<const uint4 *>(ain + (size_t)asrc * kdim + k0 + apart * 8)
                           : make_uint4(0, 0, 0, 0);
            tile_load_b<WF, MODE>(rb, k0, e, col0, kdim, nout, w0, w1, s0, s1);
        }
        if (M3_WARP == 32) {
            tile_mma(acc, sm.u.s.a[cur], sm.u.s.b[cur], wm, wn, lane);
        } else { /* 4 wavefronts: each takes two of the eight 32x32 warp tiles */
            tile_mma(acc, sm.u.s.a[cur], sm.u.s.b[cur], warp / 2, (warp % 2) * 2, lane);
            tile_mma(acc2, sm.u.s.a[cur], sm.u.s.b[cur], warp / 2, (warp % 2) * 2 + 1, lane);
        }
        if (ks + 1 < nk) {
            *reinterpret_cast<uint4 *>(sm.u.s.a[cur ^ 1] + ar * TILE_LDS + apart * 8) = ra;
            tile_store_b<WF>(rb, sm.u.s.b[cur ^ 1], sm.lut);
        }
        __syncthreads();
    }
    /* the operand buffers are dead: the fp32 tile reuses their space */
    if (M3_WARP == 32) {
        tile_acc_store(sm.u.c, acc, wm, wn, lane);
    } else {
        tile_acc_store(sm.u.c, acc, warp / 2, (warp % 2) * 2, lane);
        tile_acc_store(sm.u.c, acc2, warp / 2, (warp % 2) * 2 + 1, lane);
    }
    __syncthreads();
    if (MODE == 0) {
        for (int idx = tid; idx < TILE_BM * (TILE_BN / 2); idx += EXP_THREADS) {
            const int r = idx / (TILE_BN / 2), j = idx % (TILE_BN / 2);
            if (row0 + r >= n) break;
            float gv = sm.u.c[r * TILE_CP + j], uv = sm.u.c[r * TILE_CP + TILE_BN / 2 + j];
            if (act_bf16) gv = m3_round_bf16(gv), uv = m3_round_bf16(uv);
            out[(size_t)(r0 + row0 + r) * nout + col0 + j] =
                m3_f32_to_bf16(swiglu_act(gv, uv, alpha, limit, smode));
        }
    } else {
        for (int idx = tid; idx < TILE_BM * TILE_BN; idx += EXP_THREADS) {
            const int r = idx / TILE_BN, j = idx % TILE_BN;
            if (row0 + r >= n) break;
            out[(size_t)(r0 + row0 + r) * nout + col0 + j] = m3_f32_to_bf16(sm.u.c[r * TILE_CP + j]);
        }
    }
}

/* ---- larger batches, NVIDIA sm_80+: tile2_k, a cp.async pipeline -----------------------------
 * Block (column tile, row tile): BM grouped rows of one active expert (160 by default: with
 * random routing at T = 4096 an expert has 128 +- 11 rows, so one tile holds nearly every
 * expert and no nearly empty second tile streams the weights again) x BN tile columns, k-steps
 * of 32 (one MX block), an S-stage ring in dynamic shared memory filled with cp.async (16 bytes
 * a copy; padding rows of a partial tile zero-filled), one barrier per k-step. Warps 2 (rows) x
 * BN / WN (columns), each BM/2 x WN: MI = BM/32 16-row fragments x WN/8 8-column fragments,
 * ldmatrix + mma.sync. A warp skips its 16-row fragments that hold none of the expert's rows,
 * so a partial tile costs loads but little tensor work.
 * MODE 0 columns interleave gate and up in blocks of 8 (tile columns 16j..16j+7: gate rows
 * f0+8j.., 16j+8..16j+15: up rows of the same f), so each lane holds g and u of the same
 * elements and the epilogue (bf16(g), bf16(u), swiglu, bf16 a) runs in registers; MODE 1
 * stores bf16(y_e) from registers.
 * bf16 weights go global -> shared by cp.async like the activations. MX weights: their codes
 * by cp.async into a raw ring, then one k-step ahead dequantized (code x power-of-two scale:
 * exact in bf16 unless below 2^-126, as in tile_k) into a 2-deep bf16 buffer; the scale byte
 * is loaded into a register one k-step before its use.
 * The row tile of a block comes from a warp scan of ceil(n_e / BM) over the active experts
 * (group_k's tile_off counts 64-row tiles). blockIdx.x is the column tile (see below). One
 * configuration is built: BM 160, BN 128, WN 32, S 4 (the others measured slower: docs/gpu-log/moe.md
 * "Prefill tiles"). AMD and pre-sm_80 NVIDIA use tile_k. */
#define T2_BK 32
#define T2_LDS (T2_BK + 8) /* padded rows (80 bytes): conflict-free ldmatrix and cp.async */

/* raw MX bytes of one weight row and k-step (bf16: unused) */
template <int WF> struct t2_raw { enum { RB = WF == M3_GPU_W_MXFP8 ? 32 : 16 }; };

/* dynamic shared memory layout (bytes): src rows | A ring | B ring (bf16: S stages; MX: 2
 * dequantized buffers) | MX raw ring */
template <int WF, int BM, int BN, int S> struct t2_lay {
    enum {
        SRC = 0,
        A = 1024, /* src: BM <= 256 ints */
        ASTAGE = BM * T2_LDS * 2,
        B = A + S * ASTAGE,
        BSTAGE = BN * T2_LDS * 2,
        NB = WF == M3_GPU_W_BF16 ? S : 2,
        RAW = B + NB * BSTAGE,
        RSTAGE = WF == M3_GPU_W_BF16 ? 0 : BN * t2_raw<WF>::RB,
        BYTES = RAW + S * RSTAGE
    };
};

#if M3_HAVE_MMA
/* 16 bytes global -> shared, asynchronous; src_bytes 0 writes zeros (g must stay a valid address) */
static __device__ __forceinline__ void t2_cp16(void *sdst, const void *g, int src_bytes) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(sdst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(g), "r"(src_bytes));
}
static __device__ __forceinline__ void t2_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* at most N of this thread's committed groups still in flight */
template <int N> static __device__ __forceinline__ void t2_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* 16 MX elements (fp8: 16 bytes, fp4: 8 bytes at q) times sc -> bf16 at dst (exact values,
 * see tile_store_b) */
template <int WF>
static __device__ __forceinline__ void t2_dequant16(m3_bf16 *dst, const unsigned char *q, float sc) {
    float v[16];
    if (WF == M3_GPU_W_MXFP8) {
        const uint4 u = *reinterpret_cast<const uint4 *>(q);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#if M3_HAVE_FP8_CVT
#pragma unroll
        for (int i = 0; i < 4; i++) m3_e4m3x4_to_f32(w[i], v + 4 * i);
#else
#pragma unroll
        for (int i = 0; i < 16; i++) v[i] = m3_fp8_to_f32((m3_fp8)((w[i / 4] >> (8 * (i % 4))) & 0xFFu), M3_FP8_E4M3FN);
#endif
    } else {
        const uint2 u = *reinterpret_cast<const uint2 *>(q);
        const uint32_t w[2] = {u.x, u.y}; /* low_even: element 2j in the low nibble of byte j */
#pragma unroll
        for (int h = 0; h < 2; h++) {
#if M3_HAVE_FP8_CVT /* e2m1 re-laid as e4m3 (x 2^-6, undone by FP4_WMUL): see decode8 */
            float a[4], b[4];
            m3_e4m3x4_to_f32(((w[h] << 2) & 0x1C1C1C1Cu) | ((w[h] << 4) & 0x80808080u), a);
            m3_e4m3x4_to_f32(((w[h] >> 2) & 0x1C1C1C1Cu) | (w[h] & 0x80808080u), b);
#pragma unroll
            for (int k = 0; k < 4; k++) v[8 * h + 2 * k] = a[k], v[8 * h + 2 * k + 1] = b[k];
#else
#pragma unroll
            for (int k = 0; k < 8; k++) v[8 * h + k] = m3_fp4_to_f32((uint8_t)((w[h] >> (4 * k)) & 0xFu));
#endif
        }
        if (sc <= 0x1p120f) sc *= FP4_WMUL; /* exact */
        else /* (the product would pass the fp32 range: scale the codes first, as ref) */
#pragma unroll
            for (int i = 0; i < 16; i++) v[i] *= FP4_WMUL;
    }
    uint32_t p[8];
#pragma unroll
    for (int i = 0; i < 8; i++) /* exact values: the top 16 bits are the bf16 */
        p[i] = (m3_f32_bits(v[2 * i] * sc) >> 16) | (m3_f32_bits(v[2 * i + 1] * sc) & 0xFFFF0000u);
    uint4 *d = reinterpret_cast<uint4 *>(dst);
    d[0] = make_uint4(p[0], p[1], p[2], p[3]);
    d[1] = make_uint4(p[4], p[5], p[6], p[7]);
}
#endif

/* weight row of tile column n (MODE 0: gate/up interleaved in blocks of 8, see above) */
template <int MODE>
static __device__ __forceinline__ size_t t2_wrow(int n, int e, int col0, int nout, bool *up) {
    if (MODE == 0) {
        *up = (n >> 3) & 1;
        return (size_t)e * nout + col0 + (n >> 4) * 8 + (n & 7);
    }
    *up = false;
    return (size_t)e * nout + col0 + n;
}

#if M3_HAVE_MMA
/* warp-collective (one warp, all 32 lanes): the active-expert slot whose row tiles hold row
 * tile bx of BM rows, and that tile's first row: a warp scan of ceil(n_e / BM) over the
 * active experts (tile2_k and wg_k). out[0] = slot (-1: past the last row tile), out[1] = row0 */
static __device__ __forceinline__ void t2_row_tile(const exp_meta &m, int BM, int bx, int lane, int *out) {
    const int na = *m.n_act;
    if (lane == 0) out[0] = -1;
    __syncwarp();
    int base = 0;
    for (int s0_ = 0; s0_ < na; s0_ += 32) {
        const int s = s0_ + lane;
        int t = 0;
        if (s < na) {
            const int e = m.act[s];
            t = (m.off[e + 1] - m.off[e] + BM - 1) / BM;
        }
        int inc = t;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int o = __shfl_up_sync(0xffffffffu, inc, d);
            if (lane >= d) inc += o;
        }
        const int ex = base + inc - t;
        const bool hit = bx >= ex && bx < ex + t;
        if (hit) out[0] = s, out[1] = (bx - ex) * BM;
        base += __shfl_sync(0xffffffffu, inc, 31);
        if (__any_sync(0xffffffffu, hit) || base > bx) break;
    }
}
#endif

template <int WF, int MODE, int BM, int BN, int WN, int S>
static __global__ void __launch_bounds__(BN / WN * 64, BN / WN * 64 > 256 || WN > 32 || BM > 160 ? 1 : 2)
    tile2_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT ain, exp_meta m, int K,
            const void *M3_RESTRICT w0, const void *M3_RESTRICT w1, const m3_e8m0 *M3_RESTRICT s0,
            const m3_e8m0 *M3_RESTRICT s1, int kdim, int nout, float alpha, float limit, int smode,
            bool act_bf16) {
#if M3_HAVE_MMA
    typedef t2_lay<WF, BM, BN, S> L;
    const int NT = BN / WN * 64; /* threads: warps 2 (rows) x BN / WN (columns) */
    extern __shared__ uint4 t2_dyn[];
    unsigned char *smb = reinterpret_cast<unsigned char *>(t2_dyn);
    int *src = reinterpret_cast<int *>(smb + L::SRC); /* [BM]; [BM], [BM+1]: slot, row0 */
    __shared__ int blk[2];
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32;
    /* blockIdx.x is the column tile: the column tiles of one row tile run together (its
     * activation rows are read once from memory), and the row tiles of an expert follow
     * each other (its weight columns are still in L2); measured faster than row tiles first */
    const int bx = (int)blockIdx.y, by = (int)blockIdx.x;
    if (warp == 0) t2_row_tile(m, BM, bx, lane, blk); /* the expert slot and first row */
    __syncthreads();
    const int slot = blk[0];
    if (slot < 0) return; /* whole block: past the last row tile */
    const int e = m.act[slot], r0 = m.off[e], n = m.off[e + 1] - r0, row0 = blk[1];
    const int col0 = by * (MODE == 0 ? BN / 2 : BN);
    for (int i = tid; i < BM; i += NT) {
        const int gr = row0 + i;
        src[i] = gr < n ? (MODE == 0 ? m.ent[r0 + gr] / K : r0 + gr) : -1;
    }
    __syncthreads();
    /* this thread's copies per k-step: A pieces (BM x 4 of 16 bytes), B pieces (bf16: BN x 4;
     * MX raw: BN x RB/16) */
    const int APT = (BM * 4 + NT - 1) / NT; /* 1 .. 3 */
    const m3_bf16 *pa[APT];
    int aoff[APT], abytes[APT];
#pragma unroll
    for (int h = 0; h < APT; h++) {
        /* (a thread past BM x 4 pieces copies nothing: see issue) */
        const int idx = (tid + h * NT) % (BM * 4), r = idx / 4, part = idx % 4, sr = src[r];
        pa[h] = ain + (size_t)(sr >= 0 ? sr : 0) * kdim + part * 8;
        aoff[h] = L::A + (r * T2_LDS + part * 8) * 2;
        abytes[h] = sr >= 0 ? 16 : 0;
    }
    const int PPR = WF == M3_GPU_W_BF16 ? 4 : t2_raw<WF>::RB / 16; /* pieces a row */
    const int BPT = (BN * PPR + NT - 1) / NT;   /* 1, 2 or 4 */
    const unsigned char *pb[BPT];
    int boff[BPT];
    const bool bcopy = BN * PPR >= NT || tid < BN * PPR;
    const size_t rbytes = wbytes<WF>((size_t)kdim);
#pragma unroll
    for (int h = 0; h < BPT; h++) {
        const int idx = (tid + h * NT) % (BN * PPR), nn = idx / PPR, part = idx % PPR;
        bool up;
        const size_t row = t2_wrow<MODE>(nn, e, col0, nout, &up);
        pb[h] = (const unsigned char *)(up ? w1 : w0) + row * rbytes + part * 16;
        boff[h] = WF == M3_GPU_W_BF16 ? L::B + (nn * T2_LDS + part * 8) * 2
                                      : L::RAW + nn * t2_raw<WF>::RB + part * 16;
    }
    /* MX dequantization: thread -> tile columns (tid + 256 h) / 2, elements (tid % 2) * 16 ..
     * + 15 of the k-step */
    const int DPT = 2 * BN / NT; /* 1 or 2 */
    const m3_e8m0 *psc[DPT];
#pragma unroll
    for (int h = 0; h < DPT; h++) {
        psc[h] = NULL;
        if (WF != M3_GPU_W_BF16) {
            bool up;
            const size_t row = t2_wrow<MODE>((tid + h * NT) / 2, e, col0, nout, &up);
            psc[h] = (up ? s1 : s0) + row * ((size_t)kdim / 32);
        }
    }
    const int nk = kdim / T2_BK;
    auto issue = [&](int ks) {
        const int st = ks % S;
#pragma unroll
        for (int h = 0; h < APT; h++)
            if (APT * NT == BM * 4 || tid + h * NT < BM * 4)
                t2_cp16(smb + aoff[h] + st * L::ASTAGE, pa[h] + (size_t)ks * T2_BK, abytes[h]);
        if (WF == M3_GPU_W_BF16) {
#pragma unroll
            for (int h = 0; h < BPT; h++)
                t2_cp16(smb + boff[h] + st * L::BSTAGE, pb[h] + (size_t)ks * T2_BK * 2, 16);
        } else if (bcopy) {
#pragma unroll
            for (int h = 0; h < BPT; h++)
                t2_cp16(smb + boff[h] + st * L::RSTAGE, pb[h] + (size_t)ks * t2_raw<WF>::RB, 16);
        }
    };
    /* raw stage of k-step ks -> bf16 buffer ks % 2 */
    auto dequant = [&](int ks, const m3_e8m0 *scb) {
#pragma unroll
        for (int h = 0; h < (WF == M3_GPU_W_BF16 ? 0 : DPT); h++) {
            const int c = (tid + h * NT) / 2, half = tid % 2;
            const unsigned char *q = smb + L::RAW + (ks % S) * L::RSTAGE + c * t2_raw<WF>::RB +
                                     half * (t2_raw<WF>::RB / 2);
            m3_bf16 *d = reinterpret_cast<m3_bf16 *>(smb + L::B + (ks % 2) * L::BSTAGE) +
                         c * T2_LDS + half * 16;
            t2_dequant16<WF>(d, q, m3_e8m0_to_f32(scb[h]));
        }
    };
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < nk) issue(s);
        t2_commit();
    }
    /* the scale bytes of the next k-step to dequantize (converted late: the load's latency
     * hides behind a k-step of mma) */
    m3_e8m0 sc[DPT];
    if (WF != M3_GPU_W_BF16) {
#pragma unroll
        for (int h = 0; h < DPT; h++) sc[h] = psc[h][0];
        t2_wait<S - 2>(); /* k-step 0 landed (this thread's copies) */
        __syncthreads(); /* everyone's */
        dequant(0, sc);
#pragma unroll
        for (int h = 0; h < DPT; h++) sc[h] = nk > 1 ? psc[h][1] : 0;
    }
    const int WM = BM / 2, MI = BM / 32, NI = WN / 8;
    const int wm = warp / (BN / WN), wn = warp % (BN / WN), mx = lane / 8, rr = lane % 8;
    /* 16-row fragments of this warp holding rows of the expert (the rest are padding) */
    const int nfr = (min(n - row0, BM) + 15) / 16; /* the tile's fragments holding rows */
    int mlim = nfr - wm * MI;
    mlim = mlim < 0 ? 0 : (mlim > MI ? MI : mlim);
    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][j][k] = 0.0f;
    for (int ks = 0; ks < nk; ks++) {
        if (WF == M3_GPU_W_BF16) t2_wait<S - 2>(); /* k-step ks landed */
        else t2_wait<S - 3>();                    /* k-steps ks and ks + 1 landed */
        __syncthreads(); /* everyone's; and stage (ks - 1) % S is no longer read */
        if (ks + S - 1 < nk) issue(ks + S - 1);
        t2_commit(); /* (an empty group near the end keeps the count uniform) */
        if (WF != M3_GPU_W_BF16 && ks + 1 < nk) {
            dequant(ks + 1, sc);
#pragma unroll
            for (int h = 0; h < DPT; h++)
                if (ks + 2 < nk) sc[h] = psc[h][ks + 2];
        }
        const m3_bf16 *As = reinterpret_cast<const m3_bf16 *>(smb + L::A + (ks % S) * L::ASTAGE);
        const m3_bf16 *Bs = reinterpret_cast<const m3_bf16 *>(
            smb + L::B + (WF == M3_GPU_W_BF16 ? ks % S : ks % 2) * L::BSTAGE);
#pragma unroll
        for (int kk = 0; kk < T2_BK; kk += 16) {
            uint32_t bfr[NI][2];
#pragma unroll
            for (int np = 0; np < NI / 2; np++) {
                uint32_t t[4];
                ldsm_x4(t, Bs + (wn * WN + np * 16 + (mx >> 1) * 8 + rr) * T2_LDS + kk + (mx & 1) * 8);
                bfr[2 * np][0] = t[0], bfr[2 * np][1] = t[1];
                bfr[2 * np + 1][0] = t[2], bfr[2 * np + 1][1] = t[3];
            }
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                if (mi >= mlim) break; /* warp-uniform */
                uint32_t af[4];
                ldsm_x4(af, As + (wm * WM + mi * 16 + (mx & 1) * 8 + rr) * T2_LDS + kk + (mx >> 1) * 8);
#pragma unroll
                for (int ni = 0; ni < NI; ni++) m3_mma_bf16_16816(acc[mi][ni], af, bfr[ni]);
            }
        }
    }
    t2_wait<0>();
    /* epilogue from registers: lane holds rows gq, gq + 8 and columns 2tq, 2tq + 1 of each
     * 16 x 8 fragment */
    const int gq = lane / 4, tq = lane % 4;
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int r = wm * WM + mi * 16 + gq + 8 * hh;
            if (row0 + r >= n) continue;
            m3_bf16 *orow = out + (size_t)(r0 + row0 + r) * nout;
            if (MODE == 0) {
#pragma unroll
                for (int j = 0; j < NI / 2; j++) { /* fragments 2j (gate) and 2j + 1 (up) */
                    float a2[2];
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        float gv = acc[mi][2 * j][2 * hh + c], uv = acc[mi][2 * j + 1][2 * hh + c];
                        if (act_bf16) gv = m3_round_bf16(gv), uv = m3_round_bf16(uv);
                        a2[c] = swiglu_act(gv, uv, alpha, limit, smode);
                    }
                    const int f = col0 + (wn * (NI / 2) + j) * 8 + 2 * tq;
                    *reinterpret_cast<uint32_t *>(orow + f) =
                        (uint32_t)m3_f32_to_bf16(a2[0]) | ((uint32_t)m3_f32_to_bf16(a2[1]) << 16);
                }
            } else {
#pragma unroll
                for (int ni = 0; ni < NI; ni++) {
                    const int c = col0 + wn * WN + ni * 8 + 2 * tq;
                    *reinterpret_cast<uint32_t *>(orow + c) =
                        (uint32_t)m3_f32_to_bf16(acc[mi][ni][2 * hh]) |
                        ((uint32_t)m3_f32_to_bf16(acc[mi][ni][2 * hh + 1]) << 16);
                }
            }
        }
    }
#endif
}

/* ---- larger batches, Hopper sm_90a: wg_k, warpgroup MMA (helper wg, session 7) ------------------
 * The same work as tile2_k (block = one row tile of one active expert x one column tile; MODE 0
 * gate/up interleaved in blocks of 8 columns with the swiglu epilogue in registers, MODE 1 down
 * storing bf16 y_e; the same numerics: bf16 operands, fp32 accumulation, only the order of the
 * k reduction differs), but the products run as wgmma (gpu/hip_compat.h): NWG warpgroups, each
 * 64 rows x BN columns (BN / 2 fp32 accumulators a thread), A (activations) and B (weights) read by
 * the tensor cores straight from shared memory through descriptors, so no ldmatrix and no
 * per-fragment mma issue. k-steps of 64 (one 128-byte swizzled row per operand row, two MX
 * blocks). Every thread also copies: an S-stage ring filled by cp.async (16 bytes a copy,
 * written at their swizzled place; rows past the expert's end zero-filled), one barrier per
 * k-step; each warpgroup keeps W wgmma groups in flight after issuing a k-step, so the ring
 * slot refilled at k-step ks is the one of ks - 1 - W and loads run LA = S - 1 - W steps ahead.
 * MX weights: codes by cp.async into a raw ring, dequantized exactly one k-step ahead into one of
 * 2 + W bf16 buffers (t2_dequant16: code x power of two), scale bytes loaded a k-step early.
 * A warpgroup whose 64 rows hold none of the expert's rows skips its wgmma. The row tile comes
 * from the same warp scan as tile2_k's, with BM = 64 NWG. Built: 3 warpgroups (192 rows: at
 * T = 4096 every expert's rows fit one tile, so each weight is streamed from memory once), BN
 * 192 (each activation tile read 2 F / 192 + D / 192 times from the L2; BN 128 where 192 does
 * not divide D or F / 2), S 4, W 1 (WG_CFG).
 * Measured slower (docs/gpu-log/moe.md "Prefill tiles, session 7"): 128 columns, 5 stages, 2 warpgroups
 * x 256 columns, 2 blocks an SM, the wgmma issued before the copies, L2 prefetch of weights. */
#define WG_BK 64

template <int WF, int NWG, int S, int W, int BN_> struct wg_lay {
    enum {
        BM = 64 * NWG,
        BN = BN_,          /* 128 or 192 columns: one wgmma m64nBNk16 a warpgroup */
        ASTAGE = BM * 128, /* bytes: BM rows of 64 bf16 */
        BSTAGE = BN * 128,
        NB = WF == M3_GPU_W_BF16 ? S : 2 + W,              /* bf16 B buffers */
        RB = WF == M3_GPU_W_MXFP8 ? 64 : 32,                /* MX raw bytes a row and k-step */
        RSTAGE = WF == M3_GPU_W_BF16 ? 0 : BN * RB,
        A = 0,
        B = A + S * ASTAGE,
        RAW = B + NB * BSTAGE,
        SRC = RAW + S * RSTAGE,                           /* src[BM] | slot | row0 */
        BYTES = SRC + (BM + 2) * 4 + 1024                 /* + the 1024-byte alignment slack */
    };
};

#if M3_HAVE_WGMMA
static __device__ __forceinline__ uint32_t wg_swz(int r, int chunk) {
    return (uint32_t)(r * 128 + ((chunk ^ (r & 7)) << 4));
}
#endif

#if M3_HAVE_WGMMA
/* one k-step (64 deep) of a warpgroup: A at a (64 rows), B at b (BN rows), issued and
 * committed as one wgmma group */
template <int BN>
static __device__ __forceinline__ void wg_mma(float (&acc)[BN / 2], uint32_t a, uint32_t b) {
#pragma unroll
    for (int i = 0; i < BN / 2; i++) m3_wgmma_pin(acc[i]);
    m3_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint64_t da = m3_wgmma_desc_sw128(a + 32 * kk), db = m3_wgmma_desc_sw128(b + 32 * kk);
        if (BN == 128) m3_wgmma_m64n128k16_bf16(acc, da, db, 1);
        else m3_wgmma_m64n192k16_bf16(acc, da, db, 1);
    }
    m3_wgmma_commit();
}
#endif

template <int WF, int MODE, int NWG, int S, int W, int BN_>
static __global__ void __launch_bounds__(NWG * 128, 1)
    wg_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT ain, exp_meta m, int K,
         const void *M3_RESTRICT w0, const void *M3_RESTRICT w1, const m3_e8m0 *M3_RESTRICT s0,
         const m3_e8m0 *M3_RESTRICT s1, int kdim, int nout, float alpha, float limit, int smode,
         bool act_bf16) {
#if M3_HAVE_WGMMA
    typedef wg_lay<WF, NWG, S, W, BN_> L;
    const int NT = NWG * 128, BM = L::BM, BN = BN_, LA = S - 1 - W;
    static_assert(LA >= 2 || WF == M3_GPU_W_BF16, "MX dequantizes a k-step ahead");
    extern __shared__ uint4 wg_dyn[];
    const uint32_t base0 = (uint32_t)__cvta_generic_to_shared(wg_dyn);
    const uint32_t pad = (1024u - (base0 & 1023u)) & 1023u; /* swizzled tiles: 1024-aligned */
    unsigned char *smb = reinterpret_cast<unsigned char *>(wg_dyn) + pad;
    const uint32_t sb = base0 + pad;
    int *src = reinterpret_cast<int *>(smb + L::SRC);
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, wg = warp / 4;
    const int bx = (int)blockIdx.y, by = (int)blockIdx.x; /* column tiles fast, as tile2_k */
    if (warp == 0) t2_row_tile(m, BM, bx, lane, src + BM); /* slot, first row */
    __syncthreads();
    const int slot = src[BM];
    if (slot < 0) return; /* whole block: past the last row tile */
    const int e = m.act[slot], r0 = m.off[e], n = m.off[e + 1] - r0, row0 = src[BM + 1];
    const int col0 = by * (MODE == 0 ? BN / 2 : BN);
    /* this thread's A copies: rows (tid + h NT) / 8, 16-byte chunk tid % 8 (BM x 8 = 4 NT) */
    const m3_bf16 *pa[4];
    uint32_t aoff[4];
    int abytes[4];
#pragma unroll
    for (int h = 0; h < 4; h++) {
        const int idx = tid + h * NT, r = idx >> 3, p = idx & 7, gr = row0 + r;
        const int sr = gr < n ? (MODE == 0 ? m.ent[r0 + gr] / K : r0 + gr) : -1;
        pa[h] = ain + (size_t)(sr >= 0 ? sr : 0) * kdim + p * 8;
        aoff[h] = L::A + wg_swz(r, p);
        abytes[h] = sr >= 0 ? 16 : 0;
    }
    /* B copies: bf16 BN x 8 chunks (swizzled), MX raw BN x RB / 16 pieces (plain) */
    const int PPR = WF == M3_GPU_W_BF16 ? 8 : L::RB / 16, NP = BN * PPR;
    const int BPT = (NP + NT - 1) / NT;
    const unsigned char *pb[BPT];
    uint32_t boff[BPT];
    const size_t rbytes = wbytes<WF>((size_t)kdim);
#pragma unroll
    for (int h = 0; h < BPT; h++) {
        const int idx = (tid + h * NT) % NP, nn = idx / PPR, p = idx % PPR;
        bool up;
        const size_t row = t2_wrow<MODE>(nn, e, col0, nout, &up);
        pb[h] = (const unsigned char *)(up ? w1 : w0) + row * rbytes + p * 16;
        boff[h] = WF == M3_GPU_W_BF16 ? L::B + wg_swz(nn, p) : L::RAW + nn * L::RB + p * 16;
    }
    /* MX dequantization: task i = tid + h NT < 2 BN -> tile row i / 2, MX block i % 2 */
    const int DPT = (2 * BN + NT - 1) / NT;
    const m3_e8m0 *psc[DPT];
#pragma unroll
    for (int h = 0; h < DPT; h++) {
        const int i = tid + h * NT;
        psc[h] = NULL;
        if (WF != M3_GPU_W_BF16 && i < 2 * BN) {
            bool up;
            const size_t row = t2_wrow<MODE>(i >> 1, e, col0, nout, &up);
            psc[h] = (up ? s1 : s0) + row * ((size_t)kdim / 32) + (i & 1);
        }
    }
    const int nk = kdim / WG_BK;
    auto issue = [&](int ks) {
        const int st = ks % S;
#pragma unroll
        for (int h = 0; h < 4; h++)
            t2_cp16(smb + aoff[h] + st * L::ASTAGE, pa[h] + (size_t)ks * WG_BK, abytes[h]);
#pragma unroll
        for (int h = 0; h < BPT; h++) {
            if (BPT * NT != NP && tid + h * NT >= NP) break;
            if (WF == M3_GPU_W_BF16) t2_cp16(smb + boff[h] + st * L::BSTAGE, pb[h] + (size_t)ks * 128, 16);
            else t2_cp16(smb + boff[h] + st * L::RSTAGE, pb[h] + (size_t)ks * L::RB, 16);
        }
    };
    /* raw stage of k-step ks -> bf16 buffer ks % NB, swizzled (32 elements: 4 chunks) */
    auto dequant = [&](int ks, const m3_e8m0 *scb) {
#pragma unroll
        for (int h = 0; h < DPT; h++) {
            if (WF == M3_GPU_W_BF16 || tid + h * NT >= 2 * BN) break;
            const int c = (tid + h * NT) >> 1, half = tid & 1; /* (NT is even) */
            const unsigned char *q = smb + L::RAW + (ks % S) * L::RSTAGE + c * L::RB + half * (L::RB / 2);
            unsigned char *d = smb + L::B + (ks % L::NB) * L::BSTAGE;
            const float sc = m3_e8m0_to_f32(scb[h]);
#pragma unroll
            for (int i = 0; i < 2; i++) {
                uint4 v[2];
                t2_dequant16<WF>(reinterpret_cast<m3_bf16 *>(v), q + i * (L::RB / 4), sc);
                *reinterpret_cast<uint4 *>(d + wg_swz(c, 4 * half + 2 * i)) = v[0];
                *reinterpret_cast<uint4 *>(d + wg_swz(c, 4 * half + 2 * i + 1)) = v[1];
            }
        }
        m3_fence_proxy_async(); /* the wgmma of a later k-step reads these stores */
    };
#pragma unroll
    for (int s = 0; s < LA; s++) {
        if (s < nk) issue(s);
        t2_commit();
    }
    m3_e8m0 sc[DPT];
#pragma unroll
    for (int h = 0; h < DPT; h++) sc[h] = 0;
    if (WF != M3_GPU_W_BF16) {
#pragma unroll
        for (int h = 0; h < DPT; h++)
            if (psc[h]) sc[h] = psc[h][0];
        t2_wait<LA - 1>(); /* k-step 0 landed (this thread's copies) */
        __syncthreads();   /* everyone's */
        dequant(0, sc);
#pragma unroll
        for (int h = 0; h < DPT; h++)
            if (psc[h] && nk > 1) sc[h] = psc[h][2];
    }
    /* warpgroup-uniform, and visibly so to the compiler (a value broadcast from lane 0): ptxas
     * serializes wgmma that it sees in a possibly divergent branch */
    const bool active = __shfl_sync(0xffffffffu, (int)(wg * 64 < n - row0), 0) != 0;
    float acc[BN_ / 2];
#pragma unroll
    for (int i = 0; i < BN_ / 2; i++) acc[i] = 0.0f;
    for (int ks = 0; ks < nk; ks++) {
        if (WF == M3_GPU_W_BF16) t2_wait<LA - 1>(); /* k-step ks landed */
        else t2_wait<(LA >= 2 ? LA - 2 : 0)>();     /* k-steps ks and ks + 1 landed */
        m3_fence_proxy_async(); /* the cp.async writes, for the tensor cores' reads */
        __syncthreads(); /* everyone's; every warpgroup finished the wgmma of k-step ks - 1 - W */
        if (ks + LA < nk) issue(ks + LA);
        t2_commit(); /* (an empty group near the end keeps the count uniform) */
        if (WF != M3_GPU_W_BF16 && ks + 1 < nk) {
            dequant(ks + 1, sc);
#pragma unroll
            for (int h = 0; h < DPT; h++)
                if (psc[h] && ks + 2 < nk) sc[h] = psc[h][2 * (ks + 2)];
        }
        if (active) { /* (issued after the copies and the dequantization: measured faster) */
            wg_mma<BN_>(acc, sb + L::A + (ks % S) * L::ASTAGE + wg * 64 * 128,
                        sb + L::B + (ks % L::NB) * L::BSTAGE);
            m3_wgmma_wait<W>();
#pragma unroll
            for (int i = 0; i < BN_ / 2; i++) m3_wgmma_pin(acc[i]);
        }
    }
    m3_wgmma_wait<0>(); /* (nothing pending in an inactive warpgroup) */
#pragma unroll
    for (int i = 0; i < BN_ / 2; i++) m3_wgmma_pin(acc[i]);
    t2_wait<0>();
    if (!active) return;
    /* epilogue from registers: lane holds rows gq, gq + 8 of its warp's 16 and columns 2tq,
     * 2tq + 1 of each 8-column block j (acc[4j ..]) */
    const int gq = lane / 4, tq = lane % 4;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int r = wg * 64 + (warp % 4) * 16 + gq + 8 * hh;
        if (row0 + r >= n) continue;
        m3_bf16 *orow = out + (size_t)(r0 + row0 + r) * nout;
        if (MODE == 0) {
#pragma unroll
            for (int j = 0; j < BN_ / 16; j++) { /* 8-column blocks 2j (gate) and 2j + 1 (up) */
                float a2[2];
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    float gv = acc[8 * j + 2 * hh + c], uv = acc[8 * j + 4 + 2 * hh + c];
                    if (act_bf16) gv = m3_round_bf16(gv), uv = m3_round_bf16(uv);
                    a2[c] = swiglu_act(gv, uv, alpha, limit, smode);
                }
                const int f = col0 + j * 8 + 2 * tq;
                *reinterpret_cast<uint32_t *>(orow + f) =
                    (uint32_t)m3_f32_to_bf16(a2[0]) | ((uint32_t)m3_f32_to_bf16(a2[1]) << 16);
            }
        } else {
#pragma unroll
            for (int j = 0; j < BN_ / 8; j++) {
                const int c = col0 + j * 8 + 2 * tq;
                *reinterpret_cast<uint32_t *>(orow + c) =
                    (uint32_t)m3_f32_to_bf16(acc[4 * j + 2 * hh]) |
                    ((uint32_t)m3_f32_to_bf16(acc[4 * j + 2 * hh + 1]) << 16);
            }
        }
    }
#endif
}

/* ---- combine --------------------------------------------------------------------------- */
static __global__ void __launch_bounds__(256)
    combine_k(m3_bf16 *M3_RESTRICT y, const m3_bf16 *M3_RESTRICT ye, const int32_t *M3_RESTRICT ids,
              const float *M3_RESTRICT wts, const int32_t *M3_RESTRICT row_of, int K, int D,
              float rsf, bool bf16_combine, bool rnd) {
    const int t = (int)blockIdx.x;
    int oid[EXP_MAX_K], orow[EXP_MAX_K];
    float ow[EXP_MAX_K];
    int nk = 0;
    for (int k = 0; k < K; k++) { /* insertion by ascending expert id (K <= 8) */
        const int i = t * K + k, r = row_of[i], id = ids[i];
        if (r < 0) continue;
        int j = nk++;
        while (j > 0 && oid[j - 1] > id) {
            oid[j] = oid[j - 1], orow[j] = orow[j - 1], ow[j] = ow[j - 1];
            j--;
        }
        oid[j] = id, orow[j] = r, ow[j] = wts[i];
    }
    for (int v = (int)threadIdx.x; v < D / 8; v += (int)blockDim.x) {
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = 0.0f;
        for (int j = 0; j < nk; j++) {
            float ev[8];
            bf16x8(reinterpret_cast<const uint4 *>(ye + (size_t)orow[j] * D)[v], ev);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (bf16_combine) acc[i] = m3_round_bf16(acc[i] + m3_round_bf16(ev[i] * ow[j]));
                else acc[i] = __fadd_rn(acc[i], __fmul_rn(ev[i], ow[j])); /* unfused, as ref */
            }
        }
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = rnd ? m3_round_bf16(rsf * acc[i]) : rsf * acc[i];
        m3_vec<m3_bf16>::store(y + (size_t)t * D, (int64_t)v * 8, acc);
    }
}

/* ---- launcher -------------------------------------------------------------------------- */
#ifdef M3_HIP_NVIDIA
/* tile2_k needs sm_80+ (cp.async, mma.sync); the device's answer is kept per device id */
static bool t2_ok(m3_gpu *g) {
    static int cc[16];
    if (g->device < 0 || g->device >= 16) return false;
    if (!cc[g->device]) {
        hipDeviceProp_t pr;
        cc[g->device] = hipGetDeviceProperties(&pr, g->device) == hipSuccess ? pr.major : -1;
    }
    return cc[g->device] >= 8;
}

template <int WF, int BM, int BN, int WN, int S>
static m3_status t2_run(m3_gpu *g, m3_bf16 *ab, m3_bf16 *ye, const m3_bf16 *d_x, const exp_meta &m,
                        int TK, int slots, const m3_gpu_experts *w, const m3_moe_params *mp,
                        const m3_profile *p, const m3_mx_params *mid) {
    const int D = mp->dim, F = mp->ffn, sm = (int)p->swiglu;
    const bool ab16 = p->act_bf16;
    const int sh = t2_lay<WF, BM, BN, S>::BYTES;
    M3_HIP_TRY(hipFuncSetAttribute((const void *)tile2_k<WF, 0, BM, BN, WN, S>,
                                   hipFuncAttributeMaxDynamicSharedMemorySize, sh));
    M3_HIP_TRY(hipFuncSetAttribute((const void *)tile2_k<WF, 1, BM, BN, WN, S>,
                                   hipFuncAttributeMaxDynamicSharedMemorySize, sh));
    const unsigned tiles = (unsigned)(TK / BM + slots + 1); /* >= sum ceil(n_e / BM) */
    const unsigned c1 = (unsigned)(F / (BN / 2)), c2 = (unsigned)(D / BN);
    const dim3 g1(c1, tiles), g2(c2, tiles);
    const int nt = BN / WN * 64;
    tile2_k<WF, 0, BM, BN, WN, S><<<g1, nt, sh, g->stream>>>(
        ab, d_x, m, mp->top_k, w->gate, w->up, w->gate_s, w->up_s, D, F, mp->alpha, mp->limit, sm, ab16);
    M3_LAUNCHED(g, "tile2_k gate/up");
    if (mid) M3_TRY(m3_gpu_mx_qdq_bf16(g, ab, ab, TK, F, mid));
    tile2_k<WF, 1, BM, BN, WN, S><<<g2, nt, sh, g->stream>>>(
        ye, ab, m, mp->top_k, w->down, NULL, w->down_s, NULL, F, D, mp->alpha, mp->limit, sm, ab16);
    M3_LAUNCHED(g, "tile2_k down");
    return M3_OK;
}

/* wg_k needs the sm_90a device pass (M3_HAVE_WGMMA) and a compute-capability 9.0 device; the
 * device pass records whether it had wgmma, read once per device id */
static __device__ int wg_built_d = M3_HAVE_WGMMA;
static bool wg_ok(m3_gpu *g) {
    static int ok[16]; /* 0 unknown, 1 yes, -1 no */
    if (g->device < 0 || g->device >= 16) return false;
    if (!ok[g->device]) {
        hipDeviceProp_t pr;
        int b = 0;
        ok[g->device] = hipGetDeviceProperties(&pr, g->device) == hipSuccess && pr.major == 9 &&
                                pr.minor == 0 &&
                                hipMemcpyFromSymbol(&b, wg_built_d, sizeof b) == hipSuccess && b
                            ? 1
                            : -1;
    }
    return ok[g->device] > 0;
}

template <int WF, int NWG, int S, int W, int BN>
static m3_status wg_run(m3_gpu *g, m3_bf16 *ab, m3_bf16 *ye, const m3_bf16 *d_x, const exp_meta &m,
                        int TK, int slots, const m3_gpu_experts *w, const m3_moe_params *mp,
                        const m3_profile *p, const m3_mx_params *mid) {
    typedef wg_lay<WF, NWG, S, W, BN> L;
    const int D = mp->dim, F = mp->ffn, sm = (int)p->swiglu;
    const bool ab16 = p->act_bf16;
    const int sh = L::BYTES;
    static_assert(L::BYTES <= 227 * 1024, "shared memory of one block (sm_90: 227 KiB)");
    M3_ASSERT(F % (BN / 2) == 0 && D % BN == 0); /* (wg_wide for 192) */
    M3_HIP_TRY(hipFuncSetAttribute((const void *)wg_k<WF, 0, NWG, S, W, BN>,
                                   hipFuncAttributeMaxDynamicSharedMemorySize, sh));
    M3_HIP_TRY(hipFuncSetAttribute((const void *)wg_k<WF, 1, NWG, S, W, BN>,
                                   hipFuncAttributeMaxDynamicSharedMemorySize, sh));
    const unsigned tiles = (unsigned)(TK / L::BM + slots + 1); /* >= sum ceil(n_e / BM) */
    const dim3 g1((unsigned)(F / (L::BN / 2)), tiles), g2((unsigned)(D / L::BN), tiles);
    wg_k<WF, 0, NWG, S, W, BN><<<g1, NWG * 128, sh, g->stream>>>(
        ab, d_x, m, mp->top_k, w->gate, w->up, w->gate_s, w->up_s, D, F, mp->alpha, mp->limit, sm, ab16);
    M3_LAUNCHED(g, "wg_k gate/up");
    if (mid) M3_TRY(m3_gpu_mx_qdq_bf16(g, ab, ab, TK, F, mid));
    wg_k<WF, 1, NWG, S, W, BN><<<g2, NWG * 128, sh, g->stream>>>(
        ye, ab, m, mp->top_k, w->down, NULL, w->down_s, NULL, F, D, mp->alpha, mp->limit, sm, ab16);
    M3_LAUNCHED(g, "wg_k down");
    return M3_OK;
}

/* the production configuration (docs/gpu-log/moe.md "Prefill tiles, session 7"): 3 warpgroups (192
 * rows: one tile holds an expert's rows at T = 4096), 4 stages, one wgmma group in flight,
 * 192 columns when D % 192 == 0 and F % 96 == 0 (M3: 6144, 3072), else 128 (any D % 128,
 * F % 64 that the API accepts; measured 1.35-1.45x tile2_k at M3 dims, 192 1.4-1.85x) */
#define WG_CFG 3, 4, 1
static bool wg_wide(int D, int F) { return D % 192 == 0 && F % 96 == 0; }
#endif

/* the decode GEMVs: gate/up (+ swiglu), [act_mid], down */
template <int WF, int NTMAX, int U1>
static m3_status sk_run(m3_gpu *g, m3_bf16 *ab, m3_bf16 *ye, const m3_bf16 *d_x, const exp_meta &m,
                        int T, const m3_gpu_experts *w, const m3_moe_params *mp, const m3_profile *p,
                        const m3_mx_params *mid) {
    const int E = mp->n_expert, K = mp->top_k, D = mp->dim, F = mp->ffn, TK = T * K;
    const int sm = (int)p->swiglu, slots = TK < E ? TK : E;
    const bool ab16 = p->act_bf16;
    const int nt = T < NTMAX ? T : NTMAX;
    const size_t sh1 = (size_t)nt * D * 2, sh2 = (size_t)nt * F * 2;
    /* past 48 KiB of shared memory (with the static 1 KiB table) a kernel must opt in */
    if (sh1 + 1024 > 48 * 1024)
        M3_HIP_TRY(hipFuncSetAttribute((const void *)sk_k<WF, 0, SK_RPW_GU, NTMAX, U1>,
                                       hipFuncAttributeMaxDynamicSharedMemorySize, (int)sh1));
    if (sh2 + 1024 > 48 * 1024)
        M3_HIP_TRY(hipFuncSetAttribute((const void *)sk_k<WF, 1, SK_RPW_DN, NTMAX, U1>,
                                       hipFuncAttributeMaxDynamicSharedMemorySize, (int)sh2));
    dim3 g1((unsigned)slots, (unsigned)((F + EXP_WARPS * SK_RPW_GU - 1) / (EXP_WARPS * SK_RPW_GU)));
    sk_k<WF, 0, SK_RPW_GU, NTMAX, U1><<<g1, EXP_THREADS, sh1, g->stream>>>(
        ab, d_x, m, K, w->gate, w->up, w->gate_s, w->up_s, D, F, nt, mp->alpha, mp->limit, sm, ab16);
    M3_LAUNCHED(g, "sk_k gate/up");
    if (mid) M3_TRY(m3_gpu_mx_qdq_bf16(g, ab, ab, TK, F, mid));
    dim3 g2((unsigned)slots, (unsigned)((D + EXP_WARPS * SK_RPW_DN - 1) / (EXP_WARPS * SK_RPW_DN)));
    sk_k<WF, 1, SK_RPW_DN, NTMAX, U1><<<g2, EXP_THREADS, sh2, g->stream>>>(
        ye, ab, m, K, w->down, NULL, w->down_s, NULL, F, D, nt, mp->alpha, mp->limit, sm, ab16);
    M3_LAUNCHED(g, "sk_k down");
    return M3_OK;
}

template <int WF>
static m3_status experts_run(m3_gpu *g, m3_bf16 *ab, m3_bf16 *ye, const m3_bf16 *d_x,
                             const exp_meta &m, int T, const m3_gpu_experts *w,
                             const m3_moe_params *mp, const m3_profile *p, const m3_mx_params *mid) {
    const int E = mp->n_expert, K = mp->top_k, D = mp->dim, F = mp->ffn, TK = T * K;
    const int sm = (int)p->swiglu;
    const bool ab16 = p->act_bf16;
    const int slots = TK < E ? TK : E;
    if (TK <= 4 * E) {
#if defined(M3_HIP_NVIDIA)
        /* MX on tensor cores (docs/gpu-log/moe.md): tc_k, 8 warps of 16 rows, 4 chunks a block, 4 steps of
         * loads with a 256-byte L2 prefetch (T = 1 never comes here on NVIDIA: t1_call) */
        if (WF != M3_GPU_W_BF16 && !w->portable) {
            const int WFX = WF == M3_GPU_W_BF16 ? M3_GPU_W_MXFP8 : WF; /* (bf16: never here) */
            /* MXFP8: the per-piece NaN-code test compiled in unless the caller knows the codes
             * are all finite (finite_codes; the test cost 6-10% at T = 64: docs/gpu-log/moe.md) */
            if (WF == M3_GPU_W_MXFP8 && !w->finite_codes)
                return tc_run<WFX, 1, 1, 4, 4, true>(g, ab, ye, d_x, m, T, w, mp, p, mid);
            return tc_run<WFX, 1, 1, 4, 4, false>(g, ab, ye, d_x, m, T, w, mp, p, mid);
        }
#endif
        /* the FMA GEMV; T = 1 in its one-row form: bf16 2 steps, MX 3 steps of loads ahead */
        if (T == 1) return sk_run<WF, 1, WF == M3_GPU_W_BF16 ? 2 : 3>(g, ab, ye, d_x, m, T, w, mp, p, mid);
        return sk_run<WF, sk_nt<WF>::N, 0>(g, ab, ye, d_x, m, T, w, mp, p, mid);
    } else {
#ifdef M3_HIP_NVIDIA
        /* 160 x 128 tiles, 4 stages: measured fastest (docs/gpu-log/moe.md "Prefill tiles") */
        /* Hopper (sm_90a build): wgmma tiles, 1.4-1.85x tile2_k (docs/gpu-log/moe.md) */
        if (!w->portable && !w->tile_sm80 && wg_ok(g))
            return wg_wide(D, F) ? wg_run<WF, WG_CFG, 192>(g, ab, ye, d_x, m, TK, slots, w, mp, p, mid)
                                 : wg_run<WF, WG_CFG, 128>(g, ab, ye, d_x, m, TK, slots, w, mp, p, mid);
        if (t2_ok(g) && !w->portable) return t2_run<WF, 160, 128, 32, 4>(g, ab, ye, d_x, m, TK, slots, w, mp, p, mid);
#endif
        const unsigned tiles = (unsigned)(TK / TILE_BM + slots + 1); /* >= sum ceil(n_e/64) */
        tile_k<WF, 0><<<dim3(tiles, (unsigned)(F / (TILE_BN / 2))), EXP_THREADS, 0, g->stream>>>(
            ab, d_x, m, K, w->gate, w->up, w->gate_s, w->up_s, D, F, mp->alpha, mp->limit, sm, ab16);
        M3_LAUNCHED(g, "tile_k gate/up");
        if (mid) M3_TRY(m3_gpu_mx_qdq_bf16(g, ab, ab, TK, F, mid));
        tile_k<WF, 1><<<dim3(tiles, (unsigned)(D / TILE_BN)), EXP_THREADS, 0, g->stream>>>(
            ye, ab, m, K, w->down, NULL, w->down_s, NULL, F, D, mp->alpha, mp->limit, sm, ab16);
        M3_LAUNCHED(g, "tile_k down");
    }
    return M3_OK;
}

#if defined(M3_HIP_NVIDIA)
/* T = 1 on NVIDIA sm_80+ (no grouping or combine launch): scratch, act_in, and the two kernels
 * (MXFP4 dq1_k; bf16 sk1_k; MXFP8 dq1_k when its codes are known finite, else sk1_k: measured
 * faster each, docs/gpu-log/moe.md "Decode, session 4" and "session 6") */
static m3_status t1_call(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x, const int32_t *d_ids,
                         const float *d_wts, const m3_gpu_experts *w, const m3_moe_params *mp,
                         const m3_profile *p, const m3_actq *const *aq) {
    const int K = mp->top_k, D = mp->dim, F = mp->ffn;
    const size_t mark = m3_gpu_mark(g);
    m3_bf16 *ab, *ye, *xq = NULL;
    m3_status s = m3_gpu_alloc(g, (void **)&ab, sizeof(m3_bf16) * (size_t)K * F);
    if (s == M3_OK) s = m3_gpu_alloc(g, (void **)&ye, sizeof(m3_bf16) * (size_t)K * D);
    if (s == M3_OK && aq[0]) s = m3_gpu_alloc(g, (void **)&xq, sizeof(m3_bf16) * (size_t)D);
    if (s == M3_OK && aq[0]) s = m3_gpu_mx_qdq_bf16(g, xq, d_x, 1, D, &aq[0]->mx);
    if (xq) d_x = xq;
    const m3_mx_params *mid = aq[1] ? &aq[1]->mx : NULL;
    if (s == M3_OK) {
        if (w->fmt == M3_GPU_W_BF16)
            s = sk1_run<M3_GPU_W_BF16, 2>(g, d_y, ab, ye, d_x, d_ids, d_wts, w, mp, p, mid);
        else if (w->fmt == M3_GPU_W_MXFP8)
            /* codes known finite: dq1_k with 3 steps a set (session 6, 5% faster than sk1_k);
             * else sk1_k, whose e4m3 conversion gives NaN codes NaN by construction */
            s = w->finite_codes
                    ? dq1_run<M3_GPU_W_MXFP8, 4, 3, false, 2, 0, 0>(g, d_y, ab, ye, d_x, d_ids,
                                                                     d_wts, w, mp, p, mid)
                    : sk1_run<M3_GPU_W_MXFP8, 3>(g, d_y, ab, ye, d_x, d_ids, d_wts, w, mp, p, mid);
        else if (m3_gpu_moe_mx4_fast(w)) {
            /* the scale range's k loops only (FK: dq1_step4), 3 blocks a multiprocessor, one
             * step a register set: -1% against the 2-block form in one process (dq1_k); the
             * form with the vote / per-piece loop keeps 2 blocks. FK 2 (no overflow test, no
             * WIDE) where the staged x cannot overflow (t1_fk) */
            const int f0 = t1_fk(w, mp, mid, 0), f1 = t1_fk(w, mp, mid, 1);
            if (f0 == 2) /* (then f1 is 2 too) */
                s = dq1_run<M3_GPU_W_MXFP4, 4, 1, false, 3, 2, 2>(g, d_y, ab, ye, d_x, d_ids, d_wts,
                                                                  w, mp, p, mid);
            else if (f1 == 2)
                s = dq1_run<M3_GPU_W_MXFP4, 4, 1, false, 3, 1, 2>(g, d_y, ab, ye, d_x, d_ids, d_wts,
                                                                  w, mp, p, mid);
            else
                s = dq1_run<M3_GPU_W_MXFP4, 4, 1, false, 3, 1, 1>(g, d_y, ab, ye, d_x, d_ids, d_wts,
                                                                  w, mp, p, mid);
        } else
            s = dq1_run<M3_GPU_W_MXFP4, 4, 2, false, 2, 0, 0>(g, d_y, ab, ye, d_x, d_ids, d_wts, w,
                                                               mp, p, mid);
    }
    m3_gpu_release(g, mark);
    return s;
}
#endif

extern "C" m3_status m3_gpu_moe_experts(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x,
                                        const int32_t *d_ids, const float *d_wts, int n_tok,
                                        const m3_gpu_experts *w, const m3_moe_params *mp,
                                        const m3_profile *p) {
    M3_ASSERT(g && mp && p && w && n_tok >= 0 && d_y != d_x);
    const int E = mp->n_expert, K = mp->top_k, D = mp->dim, F = mp->ffn;
    M3_ASSERTF(E > 0 && K >= 1 && K <= E && D > 0 && F > 0, "E=%d K=%d D=%d F=%d", E, K, D, F);
    if (!p->act_bf16 || p->swiglu == M3_SWIGLU_F32)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu moe_experts: profile %s keeps fp32 activations "
                         "(bf16 storage needs act_bf16)", p->name);
    if (E > EXP_MAX_E || K > EXP_MAX_K || D % TILE_BN || F % (TILE_BN / 2))
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu moe_experts: E=%d K=%d D=%d F=%d (needs E <= %d, "
                         "K <= %d, D %% %d == 0, F %% %d == 0)", E, K, D, F, EXP_MAX_E, EXP_MAX_K,
                         TILE_BN, TILE_BN / 2);
    if (w->fmt != M3_GPU_W_BF16 && (!w->gate_s || !w->up_s || !w->down_s))
        return m3_errorf(M3_ERR_ARG, "gpu moe_experts: MX weights without scales");
    /* activation quantization, as ref's m3_linear_q decides it: per GEMM, on the whole pass */
    const int n_pass = w->n_pass > 0 ? w->n_pass : n_tok;
    const m3_actq *aq[2] = {m3_actq_applies(w->act_in, n_pass) ? w->act_in : NULL,
                            m3_actq_applies(w->act_mid, n_pass) ? w->act_mid : NULL};
    for (int i = 0; i < 2; i++) {
        if (!aq[i]) continue;
        if (aq[i]->kind != M3_ACTQ_MX)
            return m3_errorf(M3_ERR_UNSUPPORTED, "gpu moe_experts: per-token fp8 (ptpc) activation "
                             "quantization of routed experts is not built (MX only)");
        if (aq[i]->mx.block != 32)
            return m3_errorf(M3_ERR_UNSUPPORTED, "gpu moe_experts: MX activation block %d (needs 32)",
                             aq[i]->mx.block);
    }
    M3_ASSERT(m3_aligned16(d_x) && m3_aligned16(d_y) && w->gate && w->up && w->down);
    if (n_tok == 0) return M3_OK;
#if defined(M3_HIP_NVIDIA)
    if (n_tok == 1 && t2_ok(g) && !w->portable) return t1_call(g, d_y, d_x, d_ids, d_wts, w, mp, p, aq);
#endif
    const int TK = n_tok * K;
    const size_t mark = m3_gpu_mark(g);
    int32_t *meta;
    m3_bf16 *ab, *ye, *xq = NULL;
    m3_status s = m3_gpu_alloc(g, (void **)&meta, sizeof(int32_t) * (3 * (size_t)E + 3 + 2 * (size_t)TK));
    if (s == M3_OK) s = m3_gpu_alloc(g, (void **)&ab, sizeof(m3_bf16) * (size_t)TK * F);
    if (s == M3_OK) s = m3_gpu_alloc(g, (void **)&ye, sizeof(m3_bf16) * (size_t)TK * D);
    if (s == M3_OK && aq[0]) s = m3_gpu_alloc(g, (void **)&xq, sizeof(m3_bf16) * (size_t)n_tok * D);
    /* x rows quantized once for all their experts (ref quantizes each expert's gathered copy
     * of the same rows: the same values) */
    if (s == M3_OK && aq[0]) s = m3_gpu_mx_qdq_bf16(g, xq, d_x, n_tok, D, &aq[0]->mx);
    if (xq) d_x = xq;
    if (s != M3_OK) {
        m3_gpu_release(g, mark);
        return s;
    }
    exp_meta m;
    m.off = meta, m.act = m.off + E + 1, m.n_act = m.act + E, m.tile_off = m.n_act + 1;
    m.ent = m.tile_off + E + 1, m.row_of = m.ent + TK;
    group_k<<<1, 1024, 0, g->stream>>>(meta, d_ids, TK, E);
    s = m3_gpu_launched_(g, "group_k", __FILE__, __LINE__);
    if (s == M3_OK) {
        const m3_mx_params *mid = aq[1] ? &aq[1]->mx : NULL;
        if (w->fmt == M3_GPU_W_BF16) s = experts_run<M3_GPU_W_BF16>(g, ab, ye, d_x, m, n_tok, w, mp, p, mid);
        else if (w->fmt == M3_GPU_W_MXFP8) s = experts_run<M3_GPU_W_MXFP8>(g, ab, ye, d_x, m, n_tok, w, mp, p, mid);
        else s = experts_run<M3_GPU_W_MXFP4>(g, ab, ye, d_x, m, n_tok, w, mp, p, mid);
    }
    if (s == M3_OK) {
        const bool rnd = p->moe_bf16_combine || p->act_bf16;
        combine_k<<<(unsigned)n_tok, 256, 0, g->stream>>>(d_y, ye, d_ids, d_wts, m.row_of, K, D,
                                                         mp->routed_scale, p->moe_bf16_combine, rnd);
        s = m3_gpu_launched_(g, "combine_k", __FILE__, __LINE__);
    }
    /* later work on the stream is ordered after these kernels: the space can be reused */
    m3_gpu_release(g, mark);
    return s;
}
