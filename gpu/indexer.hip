/* gpu/indexer.hip: the lightning indexer: block scores with the causal block max, forced
 * local/init blocks and the top-k block selection, device twin of ref/indexer.c
 * m3_indexer_topk (spec §3.8). Tolerance: block ids identical as sets except rows whose
 * reference margin is a near-tie; scores GPU_NMSE_F32 (tests/gpu_indexer.c).
 *
 * idx_score_k: one block per (token, key block b <= b_p). The G index-query heads of the
 *   token sit in shared memory; each warp takes keys j of the block (j <= p), lanes over
 *   Di (coalesced key rows), so every key row is read once for all G heads; a warp
 *   butterfly per head gives z = dot (times index_scale when it is not 1), then a block
 *   max per head (NaN tracked apart: -1e30 or NaN per p->index_nan). Blocks past b_p are
 *   -inf. Scores [G, T, NB] go to d_scores (the dump's index_scores).
 * idx_select_k: one block per (g, t): forced init then local blocks (local wins), then K+1
 *   rounds of a block arg-max over (score desc, NaN highest, id asc): the reference's
 *   order; the extra round gives the margin S_(K) - S_(K+1) and the tie flag.
 * The fast paths, below: idx_dec_k (decode: keys streamed into registers by a persistent
 * grid, the selection fused into the same launch), idx_km_k (its form for T * G <= 8, M3's
 * decode step: the keys as the mma's 16-row operand; the selection direct up to 1024 key
 * blocks), idx_wide_k (64+ tokens, 256 rows per pass
 * over the keys), idx_score_mma_k (tensor-core key tiles), idx_topk_k (one-pass exact
 * selection); the launcher's comment says which runs when, docs/gpu.md "Lightning indexer"
 * what each costs on the H200.
 * Keys (idx_keys): contiguous rows or ATOM's paged index cache (rows slot(j) through the
 * block table, spec §4.5), bf16 / fp32 / fp8 elements; docs/gpu.md "Paged index cache".
 * The dot's summation order differs from ref's m3_dot_f32 by fp32 rounding only. */

#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "ref/indexer.h"
#include "ref/num/bf16.h"
#include "ref/num/fp8.h"

#define IDX_THREADS 256
#define IDX_MAX_G 8
#define IDX_MAX_K 64

/* ---- static device helpers ------------------------------------------------------------- */
static __device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld(const m3_bf16 *p, int64_t i) {
    return m3_bf16_to_f32(p[i]);
}
/* a load from L2 (skipping L1): the fused selection reads scores other blocks wrote */
static __device__ __forceinline__ float ld_l2(const float *p) {
#if defined(M3_HIP_NVIDIA)
    return __ldcg(p);
#else
    return *p;
#endif
}
/* The index keys as the kernels see them (m3_gpu_index_keys): row of key j = j (contiguous,
 * bt NULL) or slot(j) = bt[j / bs] * bs + j % bs (ATOM's paged index cache, spec §4.5);
 * elem: M3_KV_F32 / BF16 / FP8 (unit scale, kind). The bf16 fast kernels take BF16 keys
 * (idx_dec_k also e4m3fn). Rows are int: a cache of 2^31 rows would be 256 GiB at Di 128. */
typedef struct {
    const void *k;
    const int32_t *bt;
    int bs, elem, kind;
} idx_keys;
static __device__ __forceinline__ int key_row(const idx_keys &K, int j) {
    return K.bt ? K.bt[j / K.bs] * K.bs + j % K.bs : j;
}
/* the row of the first key of key block b (B keys) when the block's rows are contiguous
 * (no table, or bs % B == 0: one physical block holds it; M3: bs == B), else -1 (per-row
 * mapping). Call only for a block with keys below n_ctx (the table is read). */
/* (unused where the mma kernels compile out: no tensor cores) */
__attribute__((unused)) static __device__ __forceinline__ int key_base(const idx_keys &K, int b,
                                                                       int B) {
    if (!K.bt) return b * B;
    if (K.bs % B) return -1;
    const int j = b * B;
    return K.bt[j / K.bs] * K.bs + j % K.bs;
}
/* the row of key j of key block b, given key_base's r0 */
__attribute__((unused)) static __device__ __forceinline__ int key_row_in(const idx_keys &K, int r0,
                                                                         int b, int B, int j) {
    return r0 >= 0 ? r0 + (j - b * B) : key_row(K, j);
}
static __device__ __forceinline__ float key_get(const idx_keys &K, int64_t off) {
    if (K.elem == M3_KV_BF16) return m3_bf16_to_f32(((const m3_bf16 *)K.k)[off]);
    if (K.elem == M3_KV_F32) return ((const float *)K.k)[off];
    return m3_fp8_to_f32(((const uint8_t *)K.k)[off], (m3_fp8_kind)K.kind);
}

/* a ranks before b: score desc, NaN highest, id asc */
static __device__ __forceinline__ bool before(float sa, int a, float sb, int b) {
    bool na = isnan(sa), nb = isnan(sb);
    if (na != nb) return na;
    if (!na && sa != sb) return sa > sb;
    return a < b;
}

/* ---- kernels --------------------------------------------------------------------------- */
template <typename TS>
static __global__ void __launch_bounds__(IDX_THREADS)
    idx_score_k(float *M3_RESTRICT scores, const TS *M3_RESTRICT iq, int ld_q,
                idx_keys ik, const int32_t *M3_RESTRICT pos, int n_tok, int nbk,
                int G, int Di, int B, float scale, bool nan_neg) {
    extern __shared__ float q_sh[]; /* [G][Di] */
    __shared__ float red[M3_MAX_WARPS];
    const int t = (int)blockIdx.y, b = (int)blockIdx.x;
    const int p = pos[t], nb = p / B + 1;
    if (b >= nb) { /* past the causal end: -inf, as ref writes into the dump */
        for (int g = threadIdx.x; g < G; g += blockDim.x)
            scores[((int64_t)g * n_tok + t) * nbk + b] = -INFINITY;
        return;
    }
    for (int i = threadIdx.x; i < G * Di; i += blockDim.x)
        q_sh[i] = ld(iq, (int64_t)t * ld_q + i); /* heads are contiguous: g*Di + d */
    __syncthreads();
    const int lane = (int)threadIdx.x % M3_WARP, warp = (int)threadIdx.x / M3_WARP;
    const int n_warp = (int)blockDim.x / M3_WARP;
    float m[IDX_MAX_G], nan_seen = 0.0f;
#pragma unroll
    for (int g = 0; g < IDX_MAX_G; g++) m[g] = -INFINITY;
    const int hi = min((b + 1) * B, p + 1);
    for (int j = b * B + warp; j < hi; j += n_warp) {
        float d[IDX_MAX_G];
#pragma unroll
        for (int g = 0; g < IDX_MAX_G; g++) d[g] = 0.0f;
        const int64_t row = key_row(ik, j);
        for (int e = lane; e < Di; e += M3_WARP) {
            const float kv = key_get(ik, row * Di + e);
#pragma unroll
            for (int g = 0; g < IDX_MAX_G; g++)
                if (g < G) d[g] += q_sh[g * Di + e] * kv;
        }
        /* a guard, not a break: clang (hipcc) does not unroll a loop that leaves early
         * around a convergent shuffle ("loop not unrolled"), and d[] would go to memory */
#pragma unroll
        for (int g = 0; g < IDX_MAX_G; g++) {
            if (g < G) { /* warp-uniform */
                float z = m3_warp_sum(d[g]);
                if (scale != 1.0f) z *= scale;
                if (isnan(z)) nan_seen = 1.0f;
                else m[g] = fmaxf(m[g], z);
            }
        }
    }
    /* per-head block max (all threads take part in every reduction) */
    const bool any_nan = m3_block_max(nan_seen, red) > 0.0f;
#pragma unroll
    for (int g = 0; g < IDX_MAX_G; g++) {
        if (g >= G) continue; /* uniform across the block: the reductions stay matched */
        float mg = m3_block_max(m[g], red);
        if (threadIdx.x == 0) {
            /* NaN: torch.max propagates it (NaN ranks highest); atom maps it to -1e30. The
             * reference tracks it per head; a NaN key row is NaN for every head in practice. */
            if (any_nan) mg = nan_neg ? -1e30f : NAN;
            scores[((int64_t)g * n_tok + t) * nbk + b] = mg;
        }
    }
}

/* idx_score_mma_k (NVIDIA mma.sync, bf16 path): one block per (group of 4*16/G tokens, key
 * block b). The block's key rows are staged in shared memory ONCE and shared by every token
 * of the group: each warp's 16 mma rows are (token, head) pairs of 16/G tokens, S = Q K^T on
 * tensor cores (fp32 accumulate), then a masked max per row (keys j <= pos of the row's
 * token), NaN tracked per row. scale > 0 is applied to the max: fl(d*s) is monotonic in d,
 * so max_j fl(d_j*s) == fl(max_j d_j * s) exactly. Launched when G divides 16, Di % 16 == 0,
 * Di <= 128, B % 8 == 0, B <= 128; otherwise idx_score_k. Tolerance GPU_NMSE_TC (tensor-core
 * accumulation order). */
#define ISM_THREADS 128
#define ISM_MAX_DI 128
#define ISM_MAX_B 128
static __global__ void __launch_bounds__(ISM_THREADS)
    idx_score_mma_k(float *M3_RESTRICT scores, const m3_bf16 *M3_RESTRICT iq, int ld_q,
                    idx_keys K, const int32_t *M3_RESTRICT pos, int n_tok,
                    int nbk, int n_ctx, int G, int Di, int B, float scale, bool nan_neg) {
#if M3_HAVE_MMA
    __shared__ __align__(16) m3_bf16 ks[ISM_MAX_B * (ISM_MAX_DI + 8)];
    const m3_bf16 *ik = (const m3_bf16 *)K.k;
    const int KP = Di + 8; /* 4-mod-32 word pitch for Di % 16 == 0: conflict-free fragments */
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, gq = lane / 4, tq = lane % 4;
    const int tpw = 16 / G, tpc = 4 * tpw, t0 = (int)blockIdx.x * tpc, b = (int)blockIdx.y;
    int pmax = -1;
    for (int i = 0; i < tpc; i++)
        if (t0 + i < n_tok) pmax = max(pmax, pos[t0 + i]);
    if (b > pmax / B) { /* past the causal end of every token here: -inf, as ref */
        for (int i = tid; i < tpc * G; i += ISM_THREADS) {
            const int tt = t0 + i / G, hh = i % G;
            if (tt < n_tok) scores[((int64_t)hh * n_tok + tt) * nbk + b] = -INFINITY;
        }
        return; /* whole block */
    }
    const int dv8 = Di / 8;
    const int r0 = key_base(K, b, B); /* b <= pmax / B: its first key is below n_ctx */
    for (int i = tid; i < B * dv8; i += ISM_THREADS) {
        const int r = i / dv8, c = i % dv8, key = b * B + r;
        uint4 kv = make_uint4(0, 0, 0, 0);
        if (key < n_ctx && key <= pmax)
            kv = *reinterpret_cast<const uint4 *>(ik + (size_t)key_row_in(K, r0, b, B, key) * Di +
                                                  c * 8);
        *reinterpret_cast<uint4 *>(ks + r * KP + c * 8) = kv;
    }
    __syncthreads();
    /* rows gq and gq+8 of this warp: token t0 + warp*tpw + row/G, head row%G */
    int rt[2], rp[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = gq + 8 * h;
        rt[h] = t0 + warp * tpw + row / G;
        rp[h] = rt[h] < n_tok ? pos[rt[h]] : -1;
    }
    uint32_t qa[ISM_MAX_DI / 16][4];
#pragma unroll
    for (int s2 = 0; s2 < ISM_MAX_DI / 16; s2++) {
        if (s2 >= Di / 16) break;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i & 1, row = gq + 8 * h, c = s2 * 16 + 2 * tq + (i >> 1) * 8;
            qa[s2][i] = rt[h] < n_tok ? *reinterpret_cast<const uint32_t *>(
                                            iq + (size_t)rt[h] * ld_q + (size_t)(row % G) * Di + c)
                                      : 0u;
        }
    }
    float mx[2] = {-INFINITY, -INFINITY}, nan_seen[2] = {0.0f, 0.0f};
    int wpmax = max(rp[0], rp[1]); /* warp-uniform bound: mma.sync needs converged lanes */
    for (int m = 16; m > 0; m >>= 1) wpmax = max(wpmax, M3_SHFL_XOR(wpmax, m));
    for (int nt = 0; nt < B / 8; nt++) {
        if (b * B + nt * 8 > wpmax) break; /* keys past every row's position in the warp */
        float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s2 = 0; s2 < ISM_MAX_DI / 16; s2++) {
            if (s2 >= Di / 16) break;
            const m3_bf16 *kr = ks + (nt * 8 + gq) * KP + s2 * 16 + 2 * tq;
            const uint32_t bfr[2] = {*reinterpret_cast<const uint32_t *>(kr),
                                     *reinterpret_cast<const uint32_t *>(kr + 8)};
            m3_mma_bf16_16816(c4, qa[s2], bfr);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i >> 1, key = b * B + nt * 8 + 2 * tq + (i & 1);
            if (key <= rp[h]) {
                if (isnan(c4[i])) nan_seen[h] = 1.0f;
                else mx[h] = fmaxf(mx[h], c4[i]);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], M3_SHFL_XOR(mx[h], 1));
        mx[h] = fmaxf(mx[h], M3_SHFL_XOR(mx[h], 2));
        nan_seen[h] = fmaxf(nan_seen[h], M3_SHFL_XOR(nan_seen[h], 1));
        nan_seen[h] = fmaxf(nan_seen[h], M3_SHFL_XOR(nan_seen[h], 2));
        const int row = gq + 8 * h;
        if (tq == 0 && rt[h] < n_tok) {
            float z;
            if (b > rp[h] / B) z = -INFINITY;
            else if (nan_seen[h] > 0.0f) z = nan_neg ? -1e30f : NAN;
            else z = scale != 1.0f ? mx[h] * scale : mx[h];
            scores[((int64_t)(row % G) * n_tok + rt[h]) * nbk + b] = z;
        }
    }
#else
    (void)scores; (void)iq; (void)ld_q; (void)K; (void)pos; (void)n_tok; (void)nbk; (void)n_ctx;
    (void)G; (void)Di; (void)B; (void)scale; (void)nan_neg;
#endif
}

static __global__ void __launch_bounds__(IDX_THREADS)
    idx_select_k(int32_t *M3_RESTRICT topk, float *M3_RESTRICT scores, float *M3_RESTRICT margin,
                 int *M3_RESTRICT n_ties, const int32_t *M3_RESTRICT pos, int n_tok, int nbk,
                 int width, int B, int K, int local_blocks, int init_blocks, bool use_init,
                 float init_boost, float local_boost, float tie_margin) {
    __shared__ float red_v[M3_MAX_WARPS];
    __shared__ int red_i[M3_MAX_WARPS];
    __shared__ int chosen[IDX_MAX_K + 1];
    __shared__ float chosen_v[IDX_MAX_K + 1];
    const int g = (int)blockIdx.y, t = (int)blockIdx.x;
    const int nb = pos[t] / B + 1;
    float *S = scores + ((int64_t)g * n_tok + t) * nbk;
    /* forced blocks: init first, then local (local wins on overlap) */
    const int lo = nb - local_blocks > 0 ? nb - local_blocks : 0;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        if (use_init && b < init_blocks) S[b] = init_boost;
        if (b >= lo) S[b] = local_boost;
    }
    __syncthreads();
    const int lane = (int)threadIdx.x % M3_WARP, warp = (int)threadIdx.x / M3_WARP;
    const int n_warp = (int)blockDim.x / M3_WARP;
    const int need = K + 1 < nb ? K + 1 : nb;
    for (int r = 0; r < need; r++) {
        float bv = 0.0f;
        int bi = -1;
        for (int b = threadIdx.x; b < nb; b += blockDim.x) {
            bool taken = false;
            for (int c = 0; c < r; c++) taken |= chosen[c] == b;
            if (!taken && (bi < 0 || before(S[b], b, bv, bi))) bv = S[b], bi = b;
        }
        for (int m = M3_WARP / 2; m > 0; m >>= 1) {
            float ov = M3_SHFL_XOR(bv, m);
            int oi = M3_SHFL_XOR(bi, m);
            if (oi >= 0 && (bi < 0 || before(ov, oi, bv, bi))) bv = ov, bi = oi;
        }
        if (lane == 0) red_v[warp] = bv, red_i[warp] = bi;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < n_warp; w++)
                if (red_i[w] >= 0 && (bi < 0 || before(red_v[w], red_i[w], bv, bi)))
                    bv = red_v[w], bi = red_i[w];
            chosen[r] = bi, chosen_v[r] = bv;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const int keep = K < nb ? K : nb;
        int32_t *out = topk + ((int64_t)g * n_tok + t) * width;
        for (int r = 0; r < width; r++) out[r] = r < keep ? chosen[r] : -1;
        float mg = INFINITY;
        if (nb > K) {
            const float a = chosen_v[K - 1], b2 = chosen_v[K];
            mg = a - b2;
            if (n_ties && ((a == b2) || (mg <= tie_margin))) atomicAdd(n_ties, 1);
        }
        if (margin) margin[(int64_t)g * n_tok + t] = mg;
    }
}

/* ---- two-stage selection for long histories ---------------------------------------------
 * idx_select_k runs one block per (t, g) with K+1 arg-max rounds over all nb blocks: at 1M
 * keys (nb = 8192) with T = 1 that is 4 blocks on a 132-SM device. idx_cand_k splits nb into
 * chunks of IDX_CHUNK blocks (one per thread): forced values, then the chunk's top K+1 by the
 * same rule (score desc, NaN highest, id asc). The global top K+1 is among the chunks' top
 * K+1, and the rule is a total order, so idx_pick_k's K+1 rounds over the candidates give
 * exactly the single-stage result. */
#define IDX_CHUNK 256
#define IDX_MAX_CAND 1024 /* candidates per (t, g): 4 per thread of idx_pick_k */

static __device__ __forceinline__ void block_argmax(float &bv, int &bi, float *red_v, int *red_i) {
    const int lane = (int)threadIdx.x % M3_WARP, warp = (int)threadIdx.x / M3_WARP;
    const int n_warp = (int)blockDim.x / M3_WARP;
    for (int m = M3_WARP / 2; m > 0; m >>= 1) {
        const float ov = M3_SHFL_XOR(bv, m);
        const int oi = M3_SHFL_XOR(bi, m);
        if (oi >= 0 && (bi < 0 || before(ov, oi, bv, bi))) bv = ov, bi = oi;
    }
    if (lane == 0) red_v[warp] = bv, red_i[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < n_warp; w++)
            if (red_i[w] >= 0 && (bi < 0 || before(red_v[w], red_i[w], bv, bi))) bv = red_v[w], bi = red_i[w];
        red_v[M3_MAX_WARPS] = bv, red_i[M3_MAX_WARPS] = bi;
    }
    __syncthreads();
    bv = red_v[M3_MAX_WARPS], bi = red_i[M3_MAX_WARPS];
    __syncthreads(); /* red is reused by the next round */
}

static __global__ void __launch_bounds__(IDX_CHUNK)
    idx_cand_k(float *M3_RESTRICT cand_v, int *M3_RESTRICT cand_i, float *M3_RESTRICT scores,
               const int32_t *M3_RESTRICT pos, int n_tok, int nbk, int n_chunk, int B, int K,
               int local_blocks, int init_blocks, bool use_init, float init_boost, float local_boost) {
    __shared__ float red_v[M3_MAX_WARPS + 1];
    __shared__ int red_i[M3_MAX_WARPS + 1];
    const int c = (int)blockIdx.x, t = (int)blockIdx.y, g = (int)blockIdx.z;
    const int nb = pos[t] / B + 1, b = c * IDX_CHUNK + (int)threadIdx.x;
    float *S = scores + ((int64_t)g * n_tok + t) * nbk;
    const int lo = nb - local_blocks > 0 ? nb - local_blocks : 0;
    bool taken = b >= nb;
    float v = 0.0f;
    if (!taken) { /* forced blocks: init first, then local (local wins on overlap) */
        if (use_init && b < init_blocks) S[b] = init_boost;
        if (b >= lo) S[b] = local_boost;
        v = S[b];
    }
    const size_t base = (((size_t)g * n_tok + t) * n_chunk + c) * (size_t)(K + 1);
    for (int r = 0; r < K + 1; r++) {
        float bv = v;
        int bi = taken ? -1 : b;
        block_argmax(bv, bi, red_v, red_i);
        if (bi == b) taken = true;
        if (threadIdx.x == 0) cand_v[base + r] = bv, cand_i[base + r] = bi; /* -1: chunk exhausted */
    }
}

static __global__ void __launch_bounds__(IDX_THREADS)
    idx_pick_k(int32_t *M3_RESTRICT topk, float *M3_RESTRICT margin, int *M3_RESTRICT n_ties,
               const float *M3_RESTRICT cand_v, const int *M3_RESTRICT cand_i,
               const int32_t *M3_RESTRICT pos, int n_tok, int n_cand, int width, int B, int K,
               float tie_margin) {
    __shared__ float red_v[M3_MAX_WARPS + 1];
    __shared__ int red_i[M3_MAX_WARPS + 1];
    __shared__ int chosen[IDX_MAX_K + 1];
    __shared__ float chosen_v[IDX_MAX_K + 1];
    const int t = (int)blockIdx.x, g = (int)blockIdx.y;
    const int nb = pos[t] / B + 1;
    const size_t base = ((size_t)g * n_tok + t) * (size_t)n_cand;
    float v[IDX_MAX_CAND / IDX_THREADS];
    int id[IDX_MAX_CAND / IDX_THREADS];
#pragma unroll
    for (int i = 0; i < IDX_MAX_CAND / IDX_THREADS; i++) {
        const int j = (int)threadIdx.x + i * IDX_THREADS;
        id[i] = j < n_cand ? cand_i[base + j] : -1;
        v[i] = j < n_cand ? cand_v[base + j] : 0.0f;
    }
    const int need = K + 1 < nb ? K + 1 : nb;
    for (int r = 0; r < need; r++) {
        float bv = 0.0f;
        int bi = -1;
#pragma unroll
        for (int i = 0; i < IDX_MAX_CAND / IDX_THREADS; i++)
            if (id[i] >= 0 && (bi < 0 || before(v[i], id[i], bv, bi))) bv = v[i], bi = id[i];
        block_argmax(bv, bi, red_v, red_i);
#pragma unroll
        for (int i = 0; i < IDX_MAX_CAND / IDX_THREADS; i++)
            if (id[i] == bi) id[i] = -1; /* taken */
        if (threadIdx.x == 0) chosen[r] = bi, chosen_v[r] = bv;
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* as idx_select_k */
        const int keep = K < nb ? K : nb;
        int32_t *out = topk + ((int64_t)g * n_tok + t) * width;
        for (int r = 0; r < width; r++) out[r] = r < keep ? chosen[r] : -1;
        float mg = INFINITY;
        if (nb > K) {
            const float a = chosen_v[K - 1], b2 = chosen_v[K];
            mg = a - b2;
            if (n_ties && ((a == b2) || (mg <= tie_margin))) atomicAdd(n_ties, 1);
        }
        if (margin) margin[(int64_t)g * n_tok + t] = mg;
    }
}

/* ---- many tokens: keys staged once per block for 256/G tokens ----------------------------
 * idx_wide_k (NVIDIA mma.sync, bf16): a persistent block of 8 warps holds the Q fragments of
 * 256 (token, head) rows in registers (warp w: rows 32w .. 32w+31, two m-tiles, loaded once)
 * and walks the key blocks b = blockIdx.x, + gridDim.x, ...: the block's keys are staged in
 * shared memory (row pitch Di*2 + 64 bytes: the eight lanes of a quarter-warp LDS.128 hit 32
 * distinct banks), then every warp scores all of them: per n-tile and 16 bytes of key dims
 * (one LDS.128 = two k-steps, the permuted dims of idx_dec_k) four mma, two per m-tile.
 * Blocks wholly visible to every row of a warp skip the causal mask. Two blocks per SM
 * overlap one's key loads with the other's mma. Same contract as idx_dec_k. */
#define IWD_THREADS 256
#define IWD_WARPS 8
#define IWD_PITCH (ISM_MAX_DI * 2 + 64)
#define IWD_LOADS (ISM_MAX_B * ISM_MAX_DI / 8 / IWD_THREADS) /* uint4 per thread per key block */
#if M3_HAVE_MMA
/* the key block bb (rows past pmax or n_ctx as zeros) into registers, then shared memory */
static __device__ __forceinline__ void wide_load(uint4 *kv, int n, int i0, const idx_keys &K,
                                                 int r0, int bb, int B, int Di, int n_ctx,
                                                 int pmax) {
    const int tid = (int)threadIdx.x, dv8 = Di / 8;
    const m3_bf16 *ik = (const m3_bf16 *)K.k;
#pragma unroll
    for (int i = 0; i < n; i++) {
        const int e = tid + (i0 + i) * IWD_THREADS, r = e / dv8, key = bb * B + r;
        kv[i] = r < B && key < n_ctx && key <= pmax
                    ? *reinterpret_cast<const uint4 *>(
                          ik + (size_t)key_row_in(K, r0, bb, B, key) * Di + (e % dv8) * 8)
                    : make_uint4(0, 0, 0, 0);
    }
}
static __device__ __forceinline__ void wide_store(unsigned char *ks, const uint4 *kv, int n, int i0,
                                                  int B, int Di) {
    const int tid = (int)threadIdx.x, dv8 = Di / 8;
#pragma unroll
    for (int i = 0; i < n; i++) {
        const int e = tid + (i0 + i) * IWD_THREADS, r = e / dv8;
        if (r < B) *reinterpret_cast<uint4 *>(ks + r * IWD_PITCH + (e % dv8) * 16) = kv[i];
    }
}

#endif

static __global__ void __launch_bounds__(IWD_THREADS, 2)
    idx_wide_k(float *M3_RESTRICT scores, int *M3_RESTRICT n_ties, const m3_bf16 *M3_RESTRICT iq,
               int ld_q, idx_keys ik, const int32_t *M3_RESTRICT pos, int n_tok,
               int nbk, int n_ctx, int G, int Di, int B, float scale, bool nan_neg) {
#if M3_HAVE_MMA
    __shared__ __align__(16) unsigned char ks[ISM_MAX_B * IWD_PITCH];
    __shared__ int s_pmax;
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, gq = lane / 4, tq = lane % 4;
    const int rows = IWD_WARPS * 32, tpc = rows / G, t0 = (int)blockIdx.y * tpc;
    if (n_ties && blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) *n_ties = 0;
    if (tid == 0) s_pmax = -1;
    __syncthreads();
    if (tid < tpc && t0 + tid < n_tok) atomicMax(&s_pmax, pos[t0 + tid]);
    /* this lane's rows: m-tile mt, half h: row 32*warp + 16*mt + gq + 8*h */
    int rt[2][2], rp[2][2], wpmin = 0x7FFFFFFF, wpmax = -1;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = 32 * warp + 16 * mt + gq + 8 * h;
            rt[mt][h] = t0 + row / G;
            rp[mt][h] = rt[mt][h] < n_tok ? pos[rt[mt][h]] : -1;
            if (rp[mt][h] >= 0) wpmin = min(wpmin, rp[mt][h]), wpmax = max(wpmax, rp[mt][h]);
        }
    for (int m = 16; m > 0; m >>= 1) {
        wpmin = min(wpmin, M3_SHFL_XOR(wpmin, m));
        wpmax = max(wpmax, M3_SHFL_XOR(wpmax, m));
    }
    uint32_t qa[2][ISM_MAX_DI / 16][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int s2 = 0; s2 < ISM_MAX_DI / 16; s2++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int h = i & 1, row = 32 * warp + 16 * mt + gq + 8 * h;
                const int d = 8 * (tq + 4 * (s2 >> 1)) + 4 * (s2 & 1) + 2 * (i >> 1);
                qa[mt][s2][i] = s2 < Di / 16 && rt[mt][h] < n_tok
                                    ? *reinterpret_cast<const uint32_t *>(
                                          iq + (size_t)rt[mt][h] * ld_q + (size_t)(row % G) * Di + d)
                                    : 0u;
            }
    __syncthreads();
    const int pmax = s_pmax;
    for (int b = (int)blockIdx.x; b < nbk; b += (int)gridDim.x) {
        if (b > pmax / B) { /* past the causal end of every token here: -inf, as ref */
            const int tt = t0 + tid / G;
            if (tt < n_tok) scores[((int64_t)(tid % G) * n_tok + tt) * nbk + b] = -INFINITY;
            continue; /* block-uniform */
        }
        /* b <= pmax / B: its first key is below n_ctx (reading the table entry one block
         * ahead measured slower: session 5) */
        const int r0 = key_base(ik, b, B);
#pragma unroll
        for (int i0 = 0; i0 < IWD_LOADS; i0 += 4) { /* 4 loads in flight: registers are tight */
            uint4 kv[4];
            wide_load(kv, 4, i0, ik, r0, b, B, Di, n_ctx, pmax);
            wide_store(ks, kv, 4, i0, B, Di);
        }
        __syncthreads();
        const bool full = b * B + B - 1 <= wpmin; /* every key visible to every row of the warp */
        float mx[2][2], bad[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) mx[mt][0] = mx[mt][1] = -INFINITY, bad[mt][0] = bad[mt][1] = 0.0f;
        for (int nt = 0; nt < B / 8; nt++) {
            const int k0 = b * B + nt * 8;
            if (k0 > wpmax) break; /* warp-uniform: also skips warps without rows */
            float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
            const unsigned char *kr = ks + (nt * 8 + gq) * IWD_PITCH + tq * 16;
#pragma unroll
            for (int j = 0; j < ISM_MAX_DI / 32; j++) {
                if (j >= Di / 32) break;
                const uint4 v = *reinterpret_cast<const uint4 *>(kr + j * 64);
                const uint32_t b0[2] = {v.x, v.y}, b1[2] = {v.z, v.w};
                m3_mma_bf16_16816(c[0], qa[0][2 * j], b0);
                m3_mma_bf16_16816(c[1], qa[1][2 * j], b0);
                m3_mma_bf16_16816(c[0], qa[0][2 * j + 1], b1);
                m3_mma_bf16_16816(c[1], qa[1][2 * j + 1], b1);
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e >> 1;
                    if (full || k0 + 2 * tq + (e & 1) <= rp[mt][h]) {
                        if (isnan(c[mt][e])) bad[mt][h] = 1.0f;
                        else mx[mt][h] = fmaxf(mx[mt][h], c[mt][e]);
                    }
                }
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float m = mx[mt][h], n = bad[mt][h];
                m = fmaxf(m, M3_SHFL_XOR(m, 1));
                m = fmaxf(m, M3_SHFL_XOR(m, 2));
                n = fmaxf(n, M3_SHFL_XOR(n, 1));
                n = fmaxf(n, M3_SHFL_XOR(n, 2));
                const int row = 32 * warp + 16 * mt + gq + 8 * h;
                if (tq == 0 && rt[mt][h] < n_tok) {
                    float z;
                    if (b > rp[mt][h] / B) z = -INFINITY;
                    else if (n > 0.0f) z = nan_neg ? -1e30f : NAN;
                    else z = scale != 1.0f ? m * scale : m;
                    scores[((int64_t)(row % G) * n_tok + rt[mt][h]) * nbk + b] = z;
                }
            }
        __syncthreads(); /* ks is overwritten by the next key block */
    }
#else
    (void)scores; (void)n_ties; (void)iq; (void)ld_q; (void)ik; (void)pos; (void)n_tok; (void)nbk;
    (void)n_ctx; (void)G; (void)Di; (void)B; (void)scale; (void)nan_neg;
#endif
}

/* ---- one-pass selection ------------------------------------------------------------------
 * select_row<NT, PER>: NT threads select one (t, g) row, nb <= NT * PER. The order (score desc, NaN highest, id
 * asc) is a total order on rank keys u = (sortable score bits << 32) | ~id (rank_key; -0
 * counts as +0 and every NaN alike, as `before`), all distinct. Thread i takes the blocks
 * i, i + NT, ... (at most PER of them, in registers; forced values applied and written back
 * to S, init then local as ref). With need = min(K+1, nb):
 *   1. tau = the need-th largest of the per-thread maxima. Each warp publishes the lanes
 *      whose maximum ranks < need within the warp (the global top-need maxima are among
 *      them); a rank count over the published ones finds tau.
 *   2. Candidates: the scores with u >= tau. They come from the need threads whose max is
 *      >= tau, so there are at most need * PER of them (all nb when fewer than need threads
 *      hold a score), and every score ranking above a candidate is a candidate.
 *   3. A rank count over the candidates gives ranks 0 .. need-1: the reference's order.
 * Four barriers, no rounds; exact for any data (ties included). The rank counts are
 * unrolled so that their shared-memory loads overlap. */
typedef struct {
    int32_t *topk;
    float *scores, *margin;
    int *n_ties;
    const int32_t *pos;
    int n_tok, nbk, width, B, K, local_blocks, init_blocks;
    bool use_init;
    float init_boost, local_boost, tie_margin;
} idx_sel;

template <int NT> struct idx_sel_smem {
    unsigned long long tmax[NT], pub[(NT / M3_WARP) * (IDX_MAX_K + 1)], tau;
    int n_cand, chosen[IDX_MAX_K + 1];
    float chosen_v[IDX_MAX_K + 1];
};

static __device__ __forceinline__ unsigned long long rank_key(float v, int id) {
    uint32_t u;
    if (isnan(v)) {
        u = 0xFFFFFFFFu;
    } else {
        const uint32_t bits = v == 0.0f ? 0u : __float_as_uint(v);
        u = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    }
    return ((unsigned long long)u << 32) | (unsigned long long)(0xFFFFFFFFu - (uint32_t)id);
}
static __device__ __forceinline__ float rank_val(unsigned long long k) {
    const uint32_t u = (uint32_t)(k >> 32);
    if (u == 0xFFFFFFFFu) return NAN;
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u);
}
/* x ranks strictly above y by value: NaN highest, -0 == +0 (the high half of rank_key) */
static __device__ __forceinline__ bool val_above(float x, float y) {
    return isnan(x) ? !isnan(y) : (!isnan(y) && x > y);
}
static __device__ __forceinline__ int rank_id(unsigned long long k) {
    return (int)(0xFFFFFFFFu - (uint32_t)(k & 0xFFFFFFFFull));
}

/* cand: need * PER entries of shared memory (at most (K+1) * PER). nb <= NT * PER. The
 * scores stay in registers between the passes, and the loads of a thread are all issued
 * before the first use. */
template <int NT, int PER>
static __device__ void select_row(const idx_sel &a, int t, int g, idx_sel_smem<NT> &sm,
                                  unsigned long long *cand) {
    constexpr int NW = NT / M3_WARP;
    const int tid = (int)threadIdx.x;
    const int nb = a.pos[t] / a.B + 1, lo = nb - a.local_blocks > 0 ? nb - a.local_blocks : 0;
    const int K = a.K, need = K + 1 < nb ? K + 1 : nb, n_pub = NW * need;
    float *S = a.scores + ((int64_t)g * a.n_tok + t) * a.nbk;
    float v[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int b = tid + i * NT;
        v[i] = b < nb ? ld_l2(S + b) : 0.0f;
    }
    /* the thread's best score by value (NaN highest); its blocks come in increasing id, so
     * keeping the first of equal values keeps the lowest id, as the rank key would */
    float best = 0.0f;
    int best_b = -1;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int b = tid + i * NT;
        if (b < nb) { /* forced values as ref: init, then local wins; written for the dump */
            if (b >= lo) v[i] = a.local_boost, S[b] = a.local_boost;
            else if (a.use_init && b < a.init_blocks) v[i] = a.init_boost, S[b] = a.init_boost;
            if (best_b < 0 || val_above(v[i], best)) best = v[i], best_b = b;
        }
    }
    const unsigned long long mx = best_b >= 0 ? rank_key(best, best_b) : 0; /* 0: no score */
    sm.tmax[tid] = mx;
    for (int j = tid; j < n_pub; j += NT) sm.pub[j] = 0;
    if (tid == 0) sm.tau = 1, sm.n_cand = 0; /* tau 1: every score (< need threads hold one) */
    __syncthreads();
    const int w = tid / M3_WARP;
    if (mx) {
        int r = 0;
#pragma unroll
        for (int j = 0; j < M3_WARP; j++) r += sm.tmax[w * M3_WARP + j] > mx;
        if (r < need) sm.pub[w * need + r] = mx;
    }
    __syncthreads();
    for (int j = tid; j < n_pub; j += NT) {
        const unsigned long long u = sm.pub[j];
        if (!u) continue;
        int r = 0;
#pragma unroll 8
        for (int k = 0; k < n_pub; k++) r += sm.pub[k] > u;
        if (r == need - 1) sm.tau = u;
    }
    __syncthreads();
    const unsigned long long th = sm.tau;
    const float th_v = th == 1 ? -INFINITY : rank_val(th); /* tau 1: take every score */
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int b = tid + i * NT;
        if (b < nb && (th == 1 || !val_above(th_v, v[i]))) { /* the rank key only near tau */
            const unsigned long long u = rank_key(v[i], b);
            if (u >= th) cand[atomicAdd(&sm.n_cand, 1)] = u;
        }
    }
    __syncthreads();
    const int nc = sm.n_cand;
    for (int j = tid; j < nc; j += NT) {
        const unsigned long long u = cand[j];
        int r = 0;
#pragma unroll 8
        for (int k = 0; k < nc; k++) r += cand[k] > u;
        if (r < need) sm.chosen[r] = rank_id(u), sm.chosen_v[r] = rank_val(u);
    }
    __syncthreads();
    const int keep = K < nb ? K : nb;
    int32_t *out = a.topk + ((int64_t)g * a.n_tok + t) * a.width;
    for (int r = tid; r < a.width; r += NT) out[r] = r < keep ? sm.chosen[r] : -1;
    if (tid == 0) { /* as idx_select_k */
        float mg = INFINITY;
        if (nb > K) {
            const float x = sm.chosen_v[K - 1], y = sm.chosen_v[K];
            mg = x - y;
            if (a.n_ties && ((x == y) || (mg <= a.tie_margin))) atomicAdd(a.n_ties, 1);
        }
        if (a.margin) a.margin[(int64_t)g * a.n_tok + t] = mg;
    }
}

/* idx_topk_k: one block per (t, g) row; dynamic shared memory: the candidates,
 * (K+1) * PER rank keys. */
template <int NT, int PER>
static __global__ void __launch_bounds__(NT) idx_topk_k(idx_sel a) {
    __shared__ idx_sel_smem<NT> sm;
    extern __shared__ __align__(16) unsigned char idx_dyn[];
    select_row<NT, PER>(a, (int)blockIdx.x, (int)blockIdx.y, sm,
                        reinterpret_cast<unsigned long long *>(idx_dyn));
}

/* ---- decode: one launch that scores and selects ------------------------------------------
 * idx_dec_k (NVIDIA mma.sync, bf16 queries; K16: e4m3fn keys, below): groups of 16/G tokens
 * (blockIdx.y), 16 (token, head) rows per group, at most IDX_DEC_GROUPS groups (decode). A
 * persistent grid of 4 blocks of 4 warps per SM (over the groups) walks the key blocks b =
 * blockIdx.x, + gridDim.x, ..; warp w scores the keys [w*B/4, (w+1)*B/4) of a block from
 * registers. Each lane loads its key
 * fragments straight from global memory with 16-byte loads (8 keys x 64 contiguous bytes per
 * warp load: full sectors), all of them before the first mma (32 KB in flight per block of
 * warps), and the next key block's loads are issued as soon as the mma have read the
 * registers, so they are in flight during the cross-warp max (shared memory, double-buffered:
 * one barrier per key block). A dot product does not depend on the order of its dims, so the
 * dims are permuted consistently in Q and K: lane (g, t) holds the dims 8*(t + 4j) .. +7
 * (j < Di/32) of key g of the n-tile, uint4 j serves k-steps 2j and 2j+1, and the Q fragments
 * (registers, loaded once) take the same physical dims. Masked max per row, NaN per row;
 * one thread per row writes the block score (forced values applied: local wins over init,
 * as ref) and keeps the block's best rank key of the row (its "block maximum").
 * K16 (the fp8 index cache, Di % 64 == 0): 16-byte loads of 16 codes, lane (g, t) holding
 * dims 16*(t + 4j) .. +15 (j < Di/64), decoded to bf16 at use (e4m3x8_bf16, two pieces of
 * 8: k-steps 4j .. 4j+3; branch-free: NaN codes are flagged per key by a warp ballot of the
 * lanes' e4m3_nan16 and make the row's block NaN as a NaN product would), the Q fragments
 * permuted to match (8-byte loads of the bf16 dim order measured slower: half the bytes per
 * load, the same number of loads).
 * With fuse: the selection in the same launch. Every block writes its per-row maxima
 * (cmax [R, gridDim.x]), then a barrier, and thread 0 alone arrives: an acq_rel fence, then
 * a relaxed atomic add without a return value (bar.sync orders the block's stores before
 * thread 0's gpu-scope fence, which is cumulative). The blocks of the last R = n_tok * G
 * linear ids pick one row each (dec_pick) once all gridDim.x * gridDim.y have arrived
 * (thread 0 spins on the counter; fence; bar.sync; L2 loads). They wait for blocks that are
 * resident or start in the slots the others free (R is far below the resident blocks), so
 * no co-residency is assumed. The counters are device globals, one per parity of the
 * call (the launcher counts the fused calls per device; each call zeroes the other parity's
 * counter for the next call): calls into one device must not run concurrently from
 * several streams (m3_gpu has one stream). Block (0, 0) zeroes n_ties first (the separate
 * selection kernels of the non-fused paths run after this kernel in stream order).
 * dec_pick (exact, ref's order): rank keys u = (sortable score << 32) | ~id are distinct.
 * tau = the need-th largest THREAD maximum (each thread holds up to cpt = ceil(gridDim.x /
 * IST_THREADS) block maxima; need = min(K+1, nb)). At least `need` distinct scores are >= tau,
 * so the top `need` scores are >= tau, and a score >= tau lies in a block whose maximum is
 * >= tau. Only the `need` threads whose maxima are >= tau hold such blocks, each up to cpt of
 * them: at most need * cpt blocks hold every candidate (the shared arrays and the launcher's
 * candidate space are sized for that; sizing them for `need` blocks overflowed shared memory
 * whenever gridDim.x > IST_THREADS, found by compute-sanitizer memcheck in session 4). Their
 * key blocks' scores (b = x, x + gridDim.x, ..) that are >= tau are the candidates, and a rank
 * count over them gives ranks 0 .. need-1 (a superset of the top `need` ranks the same). Two
 * rounds of L2 loads (the maxima, then at most need * cpt * nb / gridDim.x scores, 4 per
 * thread in flight; one round when a scoring block holds at most one key block of the row:
 * then its maximum is the score), four barriers. tau and the ranks are counted with 16-byte
 * shared-memory loads, one pass each (n_above; session 9: the tree's tau stage took ~1.4 us
 * at nb = 64 and 1024, its two passes of 8-byte loads bound by the load latency). The direct
 * selection of idx_km_k with nb <= IST_THREADS (one key block per thread) ranks the nb keys
 * directly (two barriers). Launched when G divides 16, Di % 32 == 0,
 * Di <= 128, B % 32 == 0, B <= 128; gridDim.x <= IDX_PICK_CPT * IST_THREADS (the launcher
 * caps it); fused while the candidates fit in 96 KB of shared memory. */
#define IST_THREADS 128
#define IST_WARPS 4
#define IST_TILES 4 /* n-tiles of 8 keys per warp: B <= 8 * IST_TILES * IST_WARPS */
#define IDX_DEC_GROUPS 4
#define IDX_PICK_CPT 8 /* block maxima per thread in dec_pick: gridDim.x <= 1024 */
#define IDX_SLOT_W 1024 /* direct selection: key blocks per row (IDX_PICK_CPT * IST_THREADS) */
/* The fused selection's arrival counters are the context's two words at
 * m3_gpu.counters + M3_GPU_CNT_IDX (by the parity of the call; zero at open); the direct
 * selection's per-row flags (n_ties zeroed) the 8 words from IDX_ZF on. */
#define IDX_ZF 8
static_assert(IDX_ZF + 8 <= M3_GPU_CNT_SD - M3_GPU_CNT_IDX, "the counter range of m3_gpu");

#if M3_HAVE_MMA
static __device__ __forceinline__ void fence_acq_rel_gpu() {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
static __device__ __forceinline__ unsigned int ld_relaxed_gpu(const unsigned int *p) {
    unsigned int v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ unsigned long long ld_relaxed_gpu(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void st_relaxed_gpu(unsigned long long *p, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ void st_relaxed_gpu(unsigned int *p, unsigned int v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* 8 e4m3fn codes (w0: dims 0-3, w1: 4-7, byte i = dim i) as 8 bf16 (uint4, dims in order),
 * exactly: every e4m3fn value is a bf16 value. Branch-free, 4 instructions per pair: prmt
 * puts code a in the low byte of a half and its sign replicated in the high byte; << 4 and
 * the mask keep s|0000eeee|mmm0000, the bf16 bits of the value x 2^-120 (a bf16 subnormal
 * for e = 0); times 2^120 (fma.rn.bf16x2 takes subnormal inputs: exact; -0 addend: signed
 * zeros kept). A NaN code (0x7F / 0xFF) decodes to +-480, a value no code has: the caller
 * flags its key apart (e4m3_nan16), so no branch sits in the decode (session 7: session
 * 5's decoder, 5 instructions per pair plus a NaN test and branch per piece, made the fp8
 * row at 1M keys 16-20% slower). The hardware cvt e4m3x2 -> f16x2 route measured slower
 * (session 5). */
static __device__ __forceinline__ uint4 e4m3x8_bf16(uint32_t w0, uint32_t w1) {
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t p;
        const uint32_t w = k < 2 ? w0 : w1;
        if (k & 1) asm("prmt.b32 %0, %1, 0, 0xB3A2;" : "=r"(p) : "r"(w)); /* b3 b3s b2 b2s */
        else asm("prmt.b32 %0, %1, 0, 0x9180;" : "=r"(p) : "r"(w));      /* b1 b1s b0 b0s */
        const uint32_t bs = (p << 4) & 0x87F087F0u;
        asm("fma.rn.bf16x2 %0, %1, %2, %3;\n"
            : "=r"(o[k])
            : "r"(bs), "r"(0x7B807B80u), "r"(0x80008000u));
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}
/* nonzero when one of the 16 codes is NaN (0x7F / 0xFF): the low 7 bits + 1 carry into bit
 * 7 of that byte only (no carry leaves a byte) */
static __device__ __forceinline__ uint32_t e4m3_nan16(uint4 v) {
    return (((v.x & 0x7F7F7F7Fu) + 0x01010101u) | ((v.y & 0x7F7F7F7Fu) + 0x01010101u) |
            ((v.z & 0x7F7F7F7Fu) + 0x01010101u) | ((v.w & 0x7F7F7F7Fu) + 0x01010101u)) &
           0x80808080u;
}

#if M3_HAVE_FP8_CVT
/* The fp16 route's conversion of one lane's part of a query row (N bf16 pairs w; the row's
 * other parts are in the lanes xor 1 .. L - 1, L lanes a row): every value times 2^s (the
 * row's largest |q| into [2^14, 2^15)) as fp16 pairs h, dn = 2^-s. True when every value of
 * this lane is finite and exact so (a row with a range past fp16's, ~2^31 between its
 * largest and smallest nonzero |q|, is not); the callers vote over the lanes. */
template <int N, int L>
static __device__ __forceinline__ bool q_f16_part(const uint32_t (&w)[N], uint32_t (&h)[N],
                                                  float &dn) {
    float amax = 0.0f;
    bool ok = true;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const float x = __uint_as_float(w[i] << 16), y = __uint_as_float(w[i] & 0xFFFF0000u);
        ok = ok && isfinite(x) && isfinite(y);
        amax = fmaxf(amax, fmaxf(fabsf(x), fabsf(y)));
    }
#pragma unroll
    for (int o = 1; o < L; o <<= 1) amax = fmaxf(amax, M3_SHFL_XOR(amax, o));
    const int sh = amax > 0.0f ? 14 - ((int)((__float_as_uint(amax) >> 23) & 0xFF) - 127) : 0;
    ok = ok && sh > -100 && sh < 100; /* 2^sh and 2^-sh normal floats */
    const float up = ok ? __uint_as_float((uint32_t)(127 + sh) << 23) : 1.0f;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const float x = __uint_as_float(w[i] << 16) * up;
        const float y = __uint_as_float(w[i] & 0xFFFF0000u) * up;
        const __half2 v = __floats2half2_rn(x, y);
        const float2 back = __half22float2(v);
        ok = ok && back.x == x && back.y == y;
        h[i] = *reinterpret_cast<const uint32_t *>(&v);
    }
    dn = __uint_as_float((uint32_t)(127 - sh) << 23);
    return ok;
}

/* The query rows of idx_km_k's B fragments (qb: bf16 pairs; lane (g, t) holds dims of row g,
 * the row's 4 lanes) as q_f16_part's fp16 pairs, when every value of every row of the warp
 * is exact so; then qb holds the scaled pairs, inv[e] = 2^-s of query row 2t + e (this lane's
 * C columns) and the result is true; else false, qb unchanged (the bf16 route). Every warp of
 * every block decides alike (same Q). */
static __device__ __forceinline__ bool q_f16(uint32_t (&qb)[ISM_MAX_DI / 16][2], int tq,
                                             float (&inv)[2]) {
    constexpr int N = ISM_MAX_DI / 8;
    uint32_t w[N], h[N];
#pragma unroll
    for (int i = 0; i < N; i++) w[i] = qb[i / 2][i % 2];
    float dn;
    const bool ok = q_f16_part<N, 4>(w, h, dn);
    if (!__all_sync(0xFFFFFFFFu, ok)) return false;
#pragma unroll
    for (int i = 0; i < N; i++) qb[i / 2][i % 2] = h[i];
    inv[0] = __shfl_sync(0xFFFFFFFFu, dn, 4 * (2 * tq));
    inv[1] = __shfl_sync(0xFFFFFFFFu, dn, 4 * (2 * tq + 1));
    return true;
}
#endif

struct dec_smem {
    __align__(16) unsigned long long tmax[IST_THREADS]; /* read in 16-byte pairs */
    unsigned long long tau;
    int n_cand, n_cta, cta[IDX_PICK_CPT * (IDX_MAX_K + 1)], chosen[IDX_MAX_K + 1];
    float chosen_v[IDX_MAX_K + 1];
};

/* how many of the n keys at p (16-byte aligned) rank above u: 16-byte loads, independent of
 * each other (a loop of 8-byte loads ran at about one shared-memory latency per key) */
static __device__ __forceinline__ int n_above(const unsigned long long *p, int n,
                                              unsigned long long u) {
    const ulonglong2 *p2 = reinterpret_cast<const ulonglong2 *>(p);
    int r = 0;
#pragma unroll 8
    for (int k = 0; k < n / 2; k++) {
        const ulonglong2 w = p2[k];
        r += (w.x > u) + (w.y > u);
    }
    if (n & 1) r += p[n - 1] > u;
    return r;
}

/* the row's ids (sm.chosen[0 .. need-1]), margin and tie count, as idx_select_k; after a
 * barrier that follows the writes of sm.chosen / chosen_v */
static __device__ void pick_out(const idx_sel &a, int t, int g, int nb, const dec_smem &sm) {
    const int tid = (int)threadIdx.x, K = a.K, keep = K < nb ? K : nb;
    int32_t *out = a.topk + ((int64_t)g * a.n_tok + t) * a.width;
    for (int r = tid; r < a.width; r += IST_THREADS) out[r] = r < keep ? sm.chosen[r] : -1;
    if (tid == 0) {
        float mg = INFINITY;
        if (nb > K) {
            const float x = sm.chosen_v[K - 1], y = sm.chosen_v[K];
            mg = x - y;
            if (a.n_ties && ((x == y) || (mg <= a.tie_margin))) {
                fence_acq_rel_gpu(); /* ordered after the zero of n_ties (direct: zf) */
                atomicAdd(a.n_ties, 1);
            }
        }
        if (a.margin) a.margin[(int64_t)g * a.n_tok + t] = mg;
    }
}

/* rank u (one of the n distinct keys at p) among them; ranks < need are the row's */
static __device__ __forceinline__ void pick_rank(dec_smem &sm, const unsigned long long *p, int n,
                                                 unsigned long long u, int need) {
    const int r = n_above(p, n, u);
    if (r < need) sm.chosen[r] = rank_id(u), sm.chosen_v[r] = rank_val(u);
}

/* tau = the need-th largest thread maximum (sm.tmax, 0 where a thread holds no score; tau 1
 * when fewer than `need` threads hold one: every score is a candidate). One rank pass of
 * every thread over the IST_THREADS maxima; session 8's two stages (a warp rank, then a rank
 * over the warps' published maxima) took ~1.4 us, mostly waiting on shared-memory loads. */
static __device__ __forceinline__ unsigned long long pick_tau(dec_smem &sm, unsigned long long mx,
                                                              int need) {
    if (mx && n_above(sm.tmax, IST_THREADS, mx) == need - 1) sm.tau = mx;
    __syncthreads();
    return sm.tau;
}

/* c entries of a shared list whose count is *ctr, reserved with one shared atomic per warp
 * (all lanes call; an atomic per entry serialized up to IDX_PICK_CPT dependent atomics per
 * thread): the index of this thread's first entry */
static __device__ __forceinline__ int warp_reserve(int *ctr, int c) {
    const int lane = (int)threadIdx.x % 32;
    int incl = c; /* inclusive prefix sum over the lanes */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xFFFFFFFFu, incl, o);
        if (lane >= o) incl += y;
    }
    int base = 0;
    if (lane == 31 && incl) base = atomicAdd(ctr, incl);
    return __shfl_sync(0xFFFFFFFFu, base, 31) + incl - c;
}

/* A direct pick's wait for its row's flag of idx_km_k's zeroing block (n_ties zeroed): true
 * while it is not set; once set, it is cleared again for the next call (stream order) */
static __device__ __forceinline__ bool zf_wait(unsigned int *f) {
    if (!ld_relaxed_gpu(f)) return true;
    st_relaxed_gpu(f, 0u);
    return false;
}

/* Row q (token q / G, head q % G) of the fused selection; gx blocks per group; cmax the
 * per-block maxima (0: no score); cand: (K+1) * ceil(gx / IST_THREADS) * ceil(nbk / gx) rank
 * keys (dec_launch); slot (direct): the row's key block rank keys, polled, and zf the flags
 * of idx_km_k's zeroing block (zf[q] set once n_ties is zero: polled with the slots by
 * thread 0, the one that adds to n_ties, zf_wait). */
template <bool WR, int BF = 0> /* WR: warp_reserve for the candidate lists (idx_km_k; idx_dec_k's
                                * bf16 form spilled with it), else an atomic per entry; BF: the
                                * key block size when compiled in (idx_km_k FIX 2), else 0 */
static __device__ void dec_pick(const idx_sel &a, int q, int G, int gx,
                                const unsigned long long *cmax, dec_smem &sm,
                                unsigned long long *cand, unsigned long long *slot,
                                unsigned int *zf = NULL) {
    const int tid = (int)threadIdx.x, t = q / G, g = q % G;
    bool zw = zf && tid == 0; /* waiting for zf[q] */
    const int nb = a.pos[t] / (BF ? BF : a.B) + 1, K = a.K, need = K + 1 < nb ? K + 1 : nb;
    unsigned long long m[IDX_PICK_CPT];
    if (BF && slot && nb <= IST_THREADS) { /* direct, one slot a thread: poll it, rank it */
        unsigned long long m0 = 0;
        bool wait = tid < nb;
        while (__syncthreads_or(wait || zw)) {
            if (wait) m0 = ld_relaxed_gpu(slot + tid), wait = !m0;
            if (zw) zw = zf_wait(zf + q);
        }
        sm.tmax[tid] = m0;
        __syncthreads();
        if (tid < nb) pick_rank(sm, sm.tmax, nb, m0, need);
        __syncthreads();
        pick_out(a, t, g, nb, sm);
        if (tid < nb) st_relaxed_gpu(slot + tid, 0ull); /* zero again for the next call */
        return;
    }
    if (slot) { /* direct: the row's key block scores, polled until all have landed */
        gx = nb;
        bool wait = true;
        for (int i = 0; i < IDX_PICK_CPT; i++) m[i] = 0;
        while (__syncthreads_or(wait || zw)) {
            wait = false;
#pragma unroll
            for (int i = 0; i < IDX_PICK_CPT; i++) {
                const int x = tid + i * IST_THREADS;
                if (x < nb && !m[i]) m[i] = ld_relaxed_gpu(slot + x), wait |= !m[i];
            }
            if (zw) zw = zf_wait(zf + q);
        }
        if (nb <= IST_THREADS) { /* one key block per thread: its rank among all nb directly */
            sm.tmax[tid] = m[0];
            __syncthreads();
            if (tid < nb) pick_rank(sm, sm.tmax, nb, m[0], need);
            __syncthreads();
            pick_out(a, t, g, nb, sm);
            if (tid < nb) st_relaxed_gpu(slot + tid, 0ull); /* zero again for the next call */
            return;
        }
    } else {
#pragma unroll
        for (int i = 0; i < IDX_PICK_CPT; i++) {
            const int x = tid + i * IST_THREADS;
            m[i] = x < gx ? __ldcg(cmax + (size_t)q * gx + x) : 0ull;
        }
    }
    unsigned long long mx = 0;
#pragma unroll
    for (int i = 0; i < IDX_PICK_CPT; i++) mx = m[i] > mx ? m[i] : mx;
    sm.tmax[tid] = mx;
    if (tid == 0) sm.tau = 1, sm.n_cand = 0, sm.n_cta = 0; /* tau 1: every score */
    __syncthreads();
    const unsigned long long th = pick_tau(sm, mx, need);
    const int per = slot ? 1 : (nb + gx - 1) / gx; /* key blocks of the row per scoring block */
    if (!WR) {
#pragma unroll
        for (int i = 0; i < IDX_PICK_CPT; i++) /* blocks whose maximum is >= tau */
            if (m[i] && m[i] >= th) {
                if (per == 1) cand[atomicAdd(&sm.n_cand, 1)] = m[i];
                else sm.cta[atomicAdd(&sm.n_cta, 1)] = tid + i * IST_THREADS;
            }
    } else { /* blocks whose maximum is >= tau: <= need * cpt */
        int c = 0;
#pragma unroll
        for (int i = 0; i < IDX_PICK_CPT; i++) c += m[i] && m[i] >= th;
        int o = warp_reserve(per == 1 ? &sm.n_cand : &sm.n_cta, c);
#pragma unroll
        for (int i = 0; i < IDX_PICK_CPT; i++)
            if (m[i] && m[i] >= th) {
                if (per == 1) cand[o++] = m[i]; /* the maximum is the score */
                else sm.cta[o++] = tid + i * IST_THREADS;
            }
    }
    __syncthreads();
    if (per > 1) { /* block-uniform: their scores, 4 loads per thread in flight at a time */
        const int n_item = sm.n_cta * per;
        const float *S = a.scores + ((int64_t)g * a.n_tok + t) * a.nbk;
        for (int j0 = 0; j0 < n_item; j0 += 4 * IST_THREADS) {
            float v[4];
            int bb[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int j = j0 + tid + u * IST_THREADS;
                const int b = j < n_item ? sm.cta[j / per] + (j % per) * gx : nb;
                bb[u] = b < nb ? b : -1;
                v[u] = b < nb ? ld_l2(S + b) : 0.0f;
            }
            if (!WR) {
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (bb[u] >= 0) {
                        const unsigned long long uk = rank_key(v[u], bb[u]);
                        if (uk >= th) cand[atomicAdd(&sm.n_cand, 1)] = uk;
                    }
                continue;
            }
            unsigned long long uk[4];
            int c = 0;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                uk[u] = bb[u] >= 0 ? rank_key(v[u], bb[u]) : 0ull;
                c += bb[u] >= 0 && uk[u] >= th;
            }
            int o = warp_reserve(&sm.n_cand, c);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (bb[u] >= 0 && uk[u] >= th) cand[o++] = uk[u];
        }
        __syncthreads();
    }
    const int nc = sm.n_cand;
    for (int j = tid; j < nc; j += IST_THREADS) pick_rank(sm, cand, nc, cand[j], need);
    __syncthreads();
    pick_out(a, t, g, nb, sm);
#pragma unroll
    for (int i = 0; i < IDX_PICK_CPT && slot; i++) /* direct: zero again for the next call */
        if (tid + i * IST_THREADS < nb) st_relaxed_gpu(slot + tid + i * IST_THREADS, 0ull);
}

#endif

template <bool K16> /* bf16 keys, or (K16) e4m3fn keys, 16 codes a load (Di % 64 == 0) */
static __global__ void __launch_bounds__(IST_THREADS, 4)
    idx_dec_k(float *M3_RESTRICT scores, const m3_bf16 *M3_RESTRICT iq, int ld_q,
              idx_keys ik, const int32_t *M3_RESTRICT pos, int n_tok, int nbk,
              int n_ctx, int G, int Di, int B, float scale, bool nan_neg, idx_sel sel,
              unsigned long long *M3_RESTRICT cmax, unsigned int *M3_RESTRICT arrive,
              unsigned int epoch) {
#if M3_HAVE_MMA
    extern __shared__ __align__(16) unsigned char idx_dyn[];
    __shared__ float red_m[2][IST_WARPS][16], red_n[2][IST_WARPS][16];
    __shared__ dec_smem sm;
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, gq = lane / 4;
    const int tq = lane % 4, tpw = 16 / G, t0 = (int)blockIdx.y * tpw, grid = (int)gridDim.x;
    /* the first key block's loads before anything else (they need no position: keys past a
     * row's position are masked below) */
    const int tiles = B / 8 / IST_WARPS, nj = Di / 32;
    /* bf16: dims 8*(tq + 4j) .. +7, j < Di/32; K16: 16 codes, dims 16*(tq + 4j) .. +15, j <
     * Di/64, decoded at use */
    uint4 kb[IST_TILES][4];
    /* this warp's key fragments of key block b (zeros past n_ctx); r0: key_base of b (the
     * paged cache's row of its first key, read one key block ahead) */
    auto load = [&](int b, int r0) {
#pragma unroll
        for (int i = 0; i < IST_TILES; i++) {
            const int key = b * B + (warp * tiles + i) * 8 + gq;
            const bool ok = i < tiles && key < n_ctx;
            const size_t row = ok ? (size_t)key_row_in(ik, r0, b, B, key) : 0;
            if (K16) {
                const uint4 *kr =
                    reinterpret_cast<const uint4 *>((const uint8_t *)ik.k + row * Di) + tq;
#pragma unroll
                for (int j = 0; j < 2; j++)
                    kb[i][j] = ok && j < Di / 64 ? kr[4 * j] : make_uint4(0, 0, 0, 0);
            } else {
                const uint4 *kr =
                    reinterpret_cast<const uint4 *>((const m3_bf16 *)ik.k + row * Di) + tq;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    kb[i][j] = ok && j < nj ? kr[4 * j] : make_uint4(0, 0, 0, 0);
            }
        }
    };
    if ((int)blockIdx.x < nbk) load((int)blockIdx.x, key_base(ik, (int)blockIdx.x, B));
    if (cmax && blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) {
        if (sel.n_ties) *sel.n_ties = 0;
        arrive[(epoch & 1) ^ 1] = 0u; /* the next call's counter (stream order) */
    }
    if (!cmax && sel.n_ties && blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) *sel.n_ties = 0;
    int pmax = -1;
    for (int i = 0; i < tpw; i++)
        if (t0 + i < n_tok) pmax = max(pmax, pos[t0 + i]);
    const int n_lim = min(nbk, pmax / B + 1); /* key blocks some row of the group sees */
    for (int i = (int)blockIdx.x * IST_THREADS + tid; i < (nbk - n_lim) * 16;
         i += grid * IST_THREADS) { /* past every row's end: -inf */
        const int b = n_lim + i / 16, r = i % 16, tt = t0 + r / G;
        if (tt < n_tok) scores[((int64_t)(r % G) * n_tok + tt) * nbk + b] = -INFINITY;
    }
    int rt[2], rp[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = gq + 8 * h;
        rt[h] = t0 + row / G;
        rp[h] = rt[h] < n_tok ? pos[rt[h]] : -1;
    }
    uint32_t qa[ISM_MAX_DI / 16][4];
#pragma unroll
    for (int s2 = 0; s2 < ISM_MAX_DI / 16; s2++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i & 1, row = gq + 8 * h;
            /* the dims of k-step s2 (K16: piece s2 / 2 of the 16-code loads) */
            const int d = K16 ? 16 * (tq + 4 * (s2 >> 2)) + 8 * ((s2 >> 1) & 1) + 4 * (s2 & 1) +
                                    2 * (i >> 1)
                              : 8 * (tq + 4 * (s2 >> 1)) + 4 * (s2 & 1) + 2 * (i >> 1);
            qa[s2][i] = s2 < Di / 16 && rt[h] < n_tok
                            ? *reinterpret_cast<const uint32_t *>(iq + (size_t)rt[h] * ld_q +
                                                                  (size_t)(row % G) * Di + d)
                            : 0u;
        }
    /* the combining thread of row tid < 16: its token's block count and forced range */
    const int ct = t0 + tid / G, cnb = tid < 16 && ct < n_tok ? pos[ct] / B + 1 : 0;
    const int clo = cnb - sel.local_blocks > 0 ? cnb - sel.local_blocks : 0;
    unsigned long long cbest = 0; /* the row's best rank key over this block's key blocks */
    int par = 0;
    int rn = (int)blockIdx.x + grid < n_lim ? key_base(ik, (int)blockIdx.x + grid, B) : 0;
    for (int b = (int)blockIdx.x; b < n_lim; b += grid, par ^= 1) {
        float mx[2] = {-INFINITY, -INFINITY}, bad[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < IST_TILES; i++) {
            const int k0 = b * B + (warp * tiles + i) * 8;
            if (i >= tiles || k0 > pmax) break; /* block-uniform */
            float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            uint32_t kf = 0; /* K16: NaN codes in this lane's pieces, then per key (below) */
#pragma unroll
            for (int j = 0; j < 4; j++) { /* k-steps 2j, 2j+1 from piece j */
                if (j >= nj) break;
                if (K16 && (j >= 2 || j >= Di / 64)) break;
                if (K16) { /* k-steps 4j .. 4j+3 from the two 8-code halves */
                    kf |= e4m3_nan16(kb[i][j]);
                    const uint4 v0 = e4m3x8_bf16(kb[i][j].x, kb[i][j].y);
                    const uint4 v1 = e4m3x8_bf16(kb[i][j].z, kb[i][j].w);
                    const uint32_t a0[2] = {v0.x, v0.y}, a1[2] = {v0.z, v0.w};
                    const uint32_t a2[2] = {v1.x, v1.y}, a3[2] = {v1.z, v1.w};
                    m3_mma_bf16_16816(c4, qa[4 * j], a0);
                    m3_mma_bf16_16816(c4, qa[4 * j + 1], a1);
                    m3_mma_bf16_16816(c4, qa[4 * j + 2], a2);
                    m3_mma_bf16_16816(c4, qa[4 * j + 3], a3);
                    continue;
                }
                const uint4 v = kb[i][j];
                const uint32_t b0[2] = {v.x, v.y}, b1[2] = {v.z, v.w};
                m3_mma_bf16_16816(c4, qa[2 * j], b0);
                m3_mma_bf16_16816(c4, qa[2 * j + 1], b1);
            }
            /* K16: key g of the tile holds a NaN code when lane 4g..4g+3 saw one (the decode
             * made it finite); kf >> 4 * (e & 1) & 15: key 2 tq + (e & 1) */
            if (K16) kf = __ballot_sync(0xFFFFFFFFu, kf != 0) >> (8 * tq);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = e >> 1, key = k0 + 2 * tq + (e & 1);
                if (K16) { /* branch-free (session 7: 2% at 1M keys; bf16 kept its branches:
                            * the select form spilled there and measured 4% slower) */
                    const bool vis = key <= rp[h];
                    const bool nn = isnan(c4[e]) || ((kf >> (4 * (e & 1))) & 0xFu);
                    mx[h] = fmaxf(mx[h], vis ? c4[e] : -INFINITY); /* skips a NaN; a flagged */
                    bad[h] = vis && nn ? 1.0f : bad[h];             /* row's max is unused */
                } else if (key <= rp[h]) {
                    if (isnan(c4[e])) bad[h] = 1.0f;
                    else mx[h] = fmaxf(mx[h], c4[e]);
                }
            }
        }
        if (b + grid < n_lim) load(b + grid, rn); /* in flight during the reduction below */
        if (b + 2 * grid < n_lim) rn = key_base(ik, b + 2 * grid, B); /* the next one's row */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], M3_SHFL_XOR(mx[h], 1));
            mx[h] = fmaxf(mx[h], M3_SHFL_XOR(mx[h], 2));
            bad[h] = fmaxf(bad[h], M3_SHFL_XOR(bad[h], 1));
            bad[h] = fmaxf(bad[h], M3_SHFL_XOR(bad[h], 2));
            if (tq == 0)
                red_m[par][warp][gq + 8 * h] = mx[h], red_n[par][warp][gq + 8 * h] = bad[h];
        }
        __syncthreads(); /* red[par] is rewritten two key blocks later, after the next barrier */
        if (tid < 16 && ct < n_tok) {
            float m = red_m[par][0][tid], nn = red_n[par][0][tid];
#pragma unroll
            for (int w = 1; w < IST_WARPS; w++)
                m = fmaxf(m, red_m[par][w][tid]), nn = fmaxf(nn, red_n[par][w][tid]);
            float z;
            if (b >= cnb) z = -INFINITY;
            else if (b >= clo) z = sel.local_boost; /* forced, as ref: init, then local wins */
            else if (sel.use_init && b < sel.init_blocks) z = sel.init_boost;
            else if (nn > 0.0f) z = nan_neg ? -1e30f : NAN;
            else z = scale != 1.0f ? m * scale : m;
            scores[((int64_t)(tid % G) * n_tok + ct) * nbk + b] = z;
            if (b < cnb) {
                const unsigned long long u = rank_key(z, b);
                cbest = u > cbest ? u : cbest;
            }
        }
    }
    if (!cmax) return;
    /* the fused selection: this block's maxima, then its arrival */
    const unsigned int n = gridDim.x * gridDim.y, R = (unsigned int)(n_tok * G);
    const int gx = grid, row = (int)(blockIdx.y * gridDim.x + blockIdx.x) - (int)(n - R);
    unsigned int *cnt = &arrive[epoch & 1];
    if (tid < 16 && ct < n_tok)
        cmax[(size_t)((int)blockIdx.y * 16 + tid) * gx + blockIdx.x] = cbest;
    __syncthreads(); /* every store of this block precedes thread 0's fence */
    if (tid == 0) {
        fence_acq_rel_gpu();
        atomicAdd(cnt, 1u); /* no return value: a fire-and-forget reduction */
        if (row >= 0) { /* a picking block: wait for every arrival */
            while (ld_relaxed_gpu(cnt) != n) {
            }
            fence_acq_rel_gpu();
        }
    }
    if (row < 0) return; /* block-uniform */
    __syncthreads();
    dec_pick<false>(sel, row, G, gx, cmax, sm, reinterpret_cast<unsigned long long *>(idx_dyn),
                    NULL);
#else
    (void)scores; (void)iq; (void)ld_q; (void)ik; (void)pos; (void)n_tok; (void)nbk; (void)n_ctx;
    (void)G; (void)Di; (void)B; (void)scale; (void)nan_neg; (void)sel; (void)cmax; (void)epoch;
    (void)arrive;
#endif
}

#if M3_HAVE_MMA
/* idx_km_k's once-per-call zeroing, by one thread: n_ties; with cmax the next call's arrival
 * counter (stream order); direct: a fence, then each of the R rows' flags (a picker adds to
 * n_ties only after it has read its flag: dec_pick's zf) */
static __device__ void km_zero(const idx_sel &sel, unsigned int *arrive, unsigned int epoch,
                               bool cmax, bool direct, int R) {
    if (sel.n_ties) *sel.n_ties = 0;
    if (cmax) arrive[(epoch & 1) ^ 1] = 0u;
    if (!direct) return;
    fence_acq_rel_gpu();
    for (int r = 0; r < R; r++) st_relaxed_gpu(arrive + IDX_ZF + r, 1u);
}
#endif

/* idx_km_k (decode at T * G <= 8, the case of M3's decode step: T = 1, G = 4): idx_dec_k
 * with the keys as the mma's 16-row operand (A, M) and the query rows as its 8 columns (B,
 * N). At T = 1 only G = 4 of idx_dec_k's 16 query rows are real; here the key block takes
 * half the HMMAs and the Q fragments 16 registers instead of 32 (session 8: e4m3fn keys at
 * 1M keys 60.5 -> 52 us). Warp w takes the m-tiles m = w, w + 4 (16 keys each, 16 m < B) of
 * a key block; lane (g, t) loads keys g and g + 8 of an m-tile (16-byte loads, idx_dec_k's
 * dim permutation: a piece of key g feeds a0 / a2, the same piece of key g + 8 a1 / a3, and
 * the Q fragment b0 / b1 takes the same physical dims; the group's Q rows pass through shared
 * memory, one 16-byte global load a thread, session 11). Each m-tile has its own accumulator
 * (two independent HMMA chains per warp). C rows are keys, columns query rows: lane (g, t)
 * holds rows 2t and 2t + 1 for keys g and g + 8; the masked max reduces over g (3 shuffles),
 * a ballot gives the NaN flags (K16: a ballot per key half of the tile, lanes 4g .. 4g+3
 * hold key g's pieces). The next key block's loads are issued right after the mma, as in
 * idx_dec_k (two key buffers measured slower: 53.5 against 51.7 us at 1M fp8 keys).
 * K16, fp16 route (sm_89+, when q_f16 finds every query row exact in fp16 at a power-of-two
 * scale: always, but for rows of extreme range): the codes go through the hardware cvt to
 * fp16 (one instruction per pair of codes, NaN codes become NaN products) and fp16 mma,
 * instead of the bf16 decode (4 instructions per pair) and its NaN flags (ballots); the
 * row maxima are scaled back by 2^-s (exact); docs/gpu-log/indexer.md "Session 10" has the times.
 * Selection (fused): with slots (nbk <= IDX_SLOT_W, the launcher's choice) "direct": the
 * combining thread of row q stores the rank key of each key block b (never 0) into slot
 * [q][b] of the context's zeroed range (m3_gpu.counters + M3_GPU_CNT_IDXS) with a relaxed
 * 64-bit store; the picking block of row q (as idx_dec_k: the last R linear ids) polls the
 * row's nb slots until none is 0 (a 64-bit word is written and read whole: no fence, no
 * counter, no second round of loads), selects as dec_pick with one key block per scoring
 * block, and zeroes the slots again for the next call (stream order; after its output, off
 * the pick's path, session 10; the candidate lists of idx_km_k's picks are reserved with one
 * shared atomic per warp: warp_reserve). One block past the scoring ones (zx: while the
 * grid fits one wave; else block (0, 0) before its first slot, its fence hidden behind its
 * second key block) zeroes n_ties, fences and sets a flag per row (m3_gpu.counters +
 * M3_GPU_CNT_IDX + IDX_ZF: km_zero); a picker adds to n_ties only after it has read its row's
 * flag (polled with the slots; a fence before the add). With block (0, 0) doing it at 8K keys
 * its fence waited for its key loads and its slot was the last of every call (0.4 us;
 * docs/gpu-log/indexer.md "Session 13"). Past IDX_SLOT_W key blocks: idx_dec_k's arrival counter
 * and its two rounds (the block maxima in slots after a fence measured no faster, session 8;
 * the whole row's scores copied to shared memory in one round, 41 KB of shared memory per
 * block, measured slower: 1M keys 87.6 against 74.1 us, session 9).
 * Launched as a programmatic dependent (session 14): the first key block's loads go out
 * before m3_pdl_wait, and the next launch may start once every block has scored
 * (m3_pdl_trigger): the 1.9-2.1 us from one call's end to the next call's first block left
 * the path (8K keys 7.0 -> 6.1 us, fp8 128K paged 10.7 -> 9.2 us in one process,
 * docs/gpu-log/indexer.md "Session 14").
 * FIX (session 12): M3's geometry compiled in (G 4, Di 128, B 128, key blocks = physical
 * blocks), and at FIX 2 also T = 1 with a one-slot-a-thread direct pick: the launches that run
 * once per call were bound by their instruction count (8K keys 7.5 -> 7.0 us, fp8 128K paged
 * 12.7 -> 10.9 us, docs/gpu-log/indexer.md "Session 12"); at K16 the fp16 route's Q rows are converted
 * one piece a thread in the prologue, while the keys are in flight. */
template <bool K16, int FIX> /* K16: e4m3fn keys, 16 codes a load (Di % 64 == 0), else bf16;
                              * FIX 1: M3's geometry compiled in (G 4, Di 128, B 128, no
                              * table or bs 128); 2: also T = 1 */
static __global__ void __launch_bounds__(IST_THREADS, 4)
    idx_km_k(float *M3_RESTRICT scores, const m3_bf16 *M3_RESTRICT iq, int ld_q, idx_keys ik,
             const int32_t *M3_RESTRICT pos, int n_tok_, int nbk, int n_ctx, int G_, int Di_,
             int B_, float scale, bool nan_neg, idx_sel sel, unsigned long long *M3_RESTRICT cmax,
             unsigned int *M3_RESTRICT arrive, unsigned int epoch,
             unsigned long long *M3_RESTRICT slots, bool q16, bool zx) {
#if M3_HAVE_MMA
    const int G = FIX ? 4 : G_, Di = FIX ? 128 : Di_, B = FIX ? 128 : B_;
    const int n_tok = FIX == 2 ? 1 : n_tok_;
    /* key_base / key_row_in; FIX: a key block is one physical block (bs == B == 128) */
    auto kbase = [&](int b) {
        return FIX ? (ik.bt ? ik.bt[b] * 128 : b * 128) : key_base(ik, b, B);
    };
    /* 8 query rows (n8), m-tiles per warp, 16-byte pieces per key and lane (Di <= 128) */
    constexpr int RPG = 8, MT = 2, NU = K16 ? 2 : 4, NW = IST_WARPS, NT = IST_THREADS;
    extern __shared__ __align__(16) unsigned char idx_dyn[];
    __shared__ float red_m[2][NW][RPG], red_n[2][NW][RPG];
    __shared__ dec_smem sm;
    __shared__ __align__(16) m3_bf16 qs[RPG][ISM_MAX_DI + 8]; /* the group's Q rows (+16 B a row:
                                                                 * the fragment reads below
                                                                 * conflict-free) */
    __shared__ __align__(16) m3_bf16 qh[RPG][ISM_MAX_DI + 8]; /* K16, FIX: the rows, fp16 x 2^s */
    __shared__ float qinv[RPG];                                /* K16, FIX: 2^-s of each row */
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, gq = lane / 4;
    const int tq = lane % 4, tpw = RPG / G, t0 = (int)blockIdx.y * tpw;
    /* zx (direct, the grid in one wave): the last block only zeroes n_ties and sets the rows'
     * flags (km_zero); block (0, 0) doing it made its slot the last of every call at 8K keys
     * (its fence waited for its key loads, session 13); else block (0, 0) does it, below */
    const int grid = (int)gridDim.x - (zx ? 1 : 0);
    if (zx && (int)blockIdx.x == grid) { /* gridDim.y == 1: one group of RPG rows */
        m3_pdl_trigger();
        m3_pdl_wait(); /* the previous call's pickers clear the flags this block sets */
        if (tid == 0) km_zero(sel, arrive, epoch, false, true, n_tok * G);
        return;
    }
    const int nu = K16 ? Di / 64 : Di / 32; /* pieces of a key per lane */
    uint4 kb[MT][2][NU];
    /* this warp's key fragments of key block b (zeros past n_ctx); r0: key_base of b (the
     * paged cache's row of its first key, read one key block ahead) */
    auto load = [&](int b, int r0) {
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = warp + NW * i, key = b * B + 16 * m + gq + 8 * h;
                const bool ok = 16 * m < B && key < n_ctx;
                const size_t row = !ok  ? 0
                                   : FIX ? (size_t)(r0 + (key - b * B))
                                         : (size_t)key_row_in(ik, r0, b, B, key);
                const uint4 *kr =
                    K16 ? reinterpret_cast<const uint4 *>((const uint8_t *)ik.k + row * Di) + tq
                        : reinterpret_cast<const uint4 *>((const m3_bf16 *)ik.k + row * Di) + tq;
#pragma unroll
                for (int j = 0; j < NU; j++)
                    kb[i][h][j] = ok && j < nu ? kr[4 * j] : make_uint4(0, 0, 0, 0);
            }
    };
    const int x0 = (int)blockIdx.x;
    /* A programmatic dependent launch (dec_launch): the first key block (and its block table
     * entry) is loaded before m3_pdl_wait, while the launch before this one may still run.
     * The keys do not change between calls but at the call's own positions (the model's q/k
     * norm + RoPE + cache write, the launch before this one, writes the new tokens' index
     * keys): a key block that holds one of them is loaded again after the wait where a row of
     * the group sees it unforced (below; at M3's decode step it is the local block: never).
     * Everything else (the positions, Q, later key blocks, every store) comes after it. */
    if (x0 < nbk) load(x0, kbase(x0));
    m3_pdl_wait();
    /* The positions and the group's Q rows, before either is waited for. Q: one 16-byte
     * piece a thread (RPG * Di / 8 <= IST_THREADS), every piece a distinct address, into
     * shared memory; each lane then reads its fragments there. Session 11's timelines: each
     * lane loading its own 16 u32 pairs of Q (lanes of a quad row share them) took 1.5 us (8K
     * bf16) to 2.1 us (128K fp8) just to issue, and the positions waited behind them; this
     * prologue reached the first mma ~1 us earlier. q16: the pieces are 16-byte aligned (else
     * four 4-byte loads each). */
    int pmax = pos[t0]; /* t0 < n_tok: the group's first token */
    const int q_cpr = Di / 8, q_row = tid / q_cpr, q_ch = tid - q_row * q_cpr;
    const int q_t = t0 + q_row / G;
    const bool q_in = q_row < RPG && q_t < n_tok;
    uint4 qv = make_uint4(0, 0, 0, 0);
    if (q_in) {
        const m3_bf16 *src = iq + (size_t)q_t * ld_q + (size_t)(q_row % G) * Di + 8 * q_ch;
        if (q16) {
            qv = *reinterpret_cast<const uint4 *>(src);
        } else {
            const uint32_t *w = reinterpret_cast<const uint32_t *>(src);
            qv = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
    if (q_row < RPG) *reinterpret_cast<uint4 *>(&qs[q_row][8 * q_ch]) = qv; /* 0: no row */
    /* K16, FIX: the fp16 route decided and converted here (q_f16_part), one piece a thread,
     * while the keys are in flight (not after them, each warp for all its rows: session 12): a row's 16
     * pieces are 16 consecutive threads (shuffles for its largest |q|); the block votes at the
     * barrier below */
    bool qok = true;
#if M3_HAVE_FP8_CVT
    if (K16 && FIX) {
        const uint32_t w[4] = {qv.x, qv.y, qv.z, qv.w};
        uint32_t hv[4];
        float dn;
        qok = q_f16_part<4, 16>(w, hv, dn);
        *reinterpret_cast<uint4 *>(&qh[q_row][8 * q_ch]) = make_uint4(hv[0], hv[1], hv[2], hv[3]);
        if (q_ch == 0) qinv[q_row] = dn;
    }
#endif
    if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0 && !zx)
        km_zero(sel, arrive, epoch, cmax != NULL, slots != NULL, n_tok * G);
    const bool qh16 = __syncthreads_and(qok) && K16 && FIX && M3_HAVE_FP8_CVT; /* the fp16 route */
    const m3_bf16(*qsrc)[ISM_MAX_DI + 8] = qh16 ? qh : qs;
    /* this lane's B fragments: row gq of Q, the dims of k-step s (K16: piece s / 4 of the
     * 16-code loads). uint4 j holds k-steps 2j and 2j + 1: bf16 dims 8 (tq + 4j) .. +7;
     * K16 dims 16 (tq + 4 (j / 2)) + 8 (j % 2) .. +7 */
    uint32_t qb[ISM_MAX_DI / 16][2];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int off = K16 ? 16 * (tq + 4 * (j >> 1)) + 8 * (j & 1) : 8 * (tq + 4 * j);
        const bool ok = K16 ? (j >> 1) < Di / 64 : j < Di / 32;
        const uint4 v =
            ok ? *reinterpret_cast<const uint4 *>(&qsrc[gq][off]) : make_uint4(0, 0, 0, 0);
        qb[2 * j][0] = v.x, qb[2 * j][1] = v.y, qb[2 * j + 1][0] = v.z, qb[2 * j + 1][1] = v.w;
    }
    for (int i = 1; i < tpw; i++)
        if (t0 + i < n_tok) pmax = max(pmax, pos[t0 + i]);
    if (x0 < nbk) { /* the first key block again if it holds a position of the call (its key
                     * may be newer than the loads before the wait) and a row sees it unforced */
        bool hot = false, seen = false;
        for (int i = 0; i < tpw; i++)
            if (t0 + i < n_tok) {
                const int nb_i = pos[t0 + i] / B + 1;
                hot |= nb_i - 1 == x0, seen |= x0 < nb_i - sel.local_blocks;
            }
        if (hot && seen) load(x0, kbase(x0));
    }
    const int n_lim = min(nbk, pmax / B + 1); /* key blocks some row of the group sees */
    for (int i = x0 * NT + tid; i < (nbk - n_lim) * RPG; i += grid * NT) {
        const int b = n_lim + i / RPG, r = i % RPG, tt = t0 + r / G; /* past every end: -inf */
        if (tt < n_tok) scores[((int64_t)(r % G) * n_tok + tt) * nbk + b] = -INFINITY;
    }
    /* this lane's C columns: query rows 2tq + e and their positions */
    int rp[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int tt = t0 + (2 * tq + e) / G;
        rp[e] = tt < n_tok ? pos[tt] : -1;
    }
    /* the combining thread of row tid < RPG: its token's block count and forced range */
    const int ct = t0 + tid / G, cnb = tid < RPG && ct < n_tok ? pos[ct] / B + 1 : 0;
    const int clo = cnb - sel.local_blocks > 0 ? cnb - sel.local_blocks : 0;
    unsigned long long cbest = 0; /* the row's best rank key over this block's key blocks */
    /* K16: the fp16 route when the query rows allow it; inv: 2^-s of this lane's columns */
    bool h16 = false;
    float inv[2] = {1.0f, 1.0f};
#if M3_HAVE_FP8_CVT
    if (K16 && qh16) h16 = true, inv[0] = qinv[2 * tq], inv[1] = qinv[2 * tq + 1];
    else if (K16) h16 = q_f16(qb, tq, inv);
#endif
    int par = 0;
    int rn = x0 + grid < n_lim ? kbase(x0 + grid) : 0;
    for (int b = x0; b < n_lim; b += grid, par ^= 1) {
        float mx[2] = {-INFINITY, -INFINITY}, bad[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const int m = warp + NW * i, k0 = b * B + 16 * m;
            if (16 * m >= B || k0 > pmax) break; /* warp-uniform */
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            uint32_t fa = 0, fb = 0; /* K16: NaN codes in this lane's pieces of key g, g + 8 */
#pragma unroll
            for (int j = 0; j < NU; j++) {
                if (j >= nu) break;
                const uint4 ka = kb[i][0][j], kc = kb[i][1][j];
#if M3_HAVE_FP8_CVT
                if (K16 && h16) { /* 16 codes: k-steps 4j .. 4j+3, fp16 */
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        uint32_t pa[4], pc[4];
                        m3_e4m3x4_to_f16x2(hh ? ka.z : ka.x, pa[0], pa[1]);
                        m3_e4m3x4_to_f16x2(hh ? ka.w : ka.y, pa[2], pa[3]);
                        m3_e4m3x4_to_f16x2(hh ? kc.z : kc.x, pc[0], pc[1]);
                        m3_e4m3x4_to_f16x2(hh ? kc.w : kc.y, pc[2], pc[3]);
                        const uint32_t a0[4] = {pa[0], pc[0], pa[1], pc[1]};
                        const uint32_t a1[4] = {pa[2], pc[2], pa[3], pc[3]};
                        m3_mma_f16_16816(c, a0, qb[4 * j + 2 * hh]);
                        m3_mma_f16_16816(c, a1, qb[4 * j + 2 * hh + 1]);
                    }
                    continue;
                }
#endif
                if (K16) { /* 16 codes: k-steps 4j .. 4j+3, bf16 */
                    fa |= e4m3_nan16(ka), fb |= e4m3_nan16(kc);
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const uint4 va = hh ? e4m3x8_bf16(ka.z, ka.w) : e4m3x8_bf16(ka.x, ka.y);
                        const uint4 vc = hh ? e4m3x8_bf16(kc.z, kc.w) : e4m3x8_bf16(kc.x, kc.y);
                        const uint32_t a0[4] = {va.x, vc.x, va.y, vc.y};
                        const uint32_t a1[4] = {va.z, vc.z, va.w, vc.w};
                        m3_mma_bf16_16816(c, a0, qb[4 * j + 2 * hh]);
                        m3_mma_bf16_16816(c, a1, qb[4 * j + 2 * hh + 1]);
                    }
                } else { /* 8 dims: k-steps 2j, 2j+1 */
                    const uint32_t a0[4] = {ka.x, kc.x, ka.y, kc.y};
                    const uint32_t a1[4] = {ka.z, kc.z, ka.w, kc.w};
                    m3_mma_bf16_16816(c, a0, qb[2 * j]);
                    m3_mma_bf16_16816(c, a1, qb[2 * j + 1]);
                }
            }
            /* K16: key g (g + 8) holds a NaN code when one of lanes 4g .. 4g+3 saw one */
            bool nk[2] = {false, false};
            if (K16 && !h16) {
                nk[0] = (__ballot_sync(0xFFFFFFFFu, fa != 0) >> (4 * gq)) & 0xFu;
                nk[1] = (__ballot_sync(0xFFFFFFFFu, fb != 0) >> (4 * gq)) & 0xFu;
            }
#pragma unroll
            for (int e = 0; e < 4; e++) { /* key g + 8 (e >> 1), query row 2tq + (e & 1) */
                const int key = k0 + gq + 8 * (e >> 1), r = e & 1;
                const bool vis = key <= rp[r];
                const bool nn = isnan(c[e]) || nk[e >> 1];
                mx[r] = fmaxf(mx[r], vis ? c[e] : -INFINITY); /* skips a NaN; a flagged */
                bad[r] = vis && nn ? 1.0f : bad[r];            /* row's max is unused */
            }
        }
        if (b + grid < n_lim) load(b + grid, rn); /* in flight during the reduction below */
        if (b + 2 * grid < n_lim) rn = kbase(b + 2 * grid); /* the next one's row */
#pragma unroll
        for (int r = 0; r < 2; r++) { /* over the 8 lanes of column 2tq + r */
            float m = mx[r];
            m = fmaxf(m, M3_SHFL_XOR(m, 4));
            m = fmaxf(m, M3_SHFL_XOR(m, 8));
            m = fmaxf(m, M3_SHFL_XOR(m, 16));
            if (K16 && h16) m *= inv[r]; /* the fp16 route's 2^s off (exact) */
            const unsigned int bb = __ballot_sync(0xFFFFFFFFu, bad[r] != 0.0f);
            if (gq == 0) {
                red_m[par][warp][2 * tq + r] = m;
                red_n[par][warp][2 * tq + r] = (bb & (0x11111111u << tq)) ? 1.0f : 0.0f;
            }
        }
        __syncthreads(); /* red[par] is rewritten two key blocks later, after the next barrier */
        if (tid < RPG && ct < n_tok) {
            float m = red_m[par][0][tid], nn = red_n[par][0][tid];
#pragma unroll
            for (int w = 1; w < NW; w++)
                m = fmaxf(m, red_m[par][w][tid]), nn = fmaxf(nn, red_n[par][w][tid]);
            float z;
            if (b >= cnb) z = -INFINITY;
            else if (b >= clo) z = sel.local_boost; /* forced, as ref: init, then local wins */
            else if (sel.use_init && b < sel.init_blocks) z = sel.init_boost;
            else if (nn > 0.0f) z = nan_neg ? -1e30f : NAN;
            else z = scale != 1.0f ? m * scale : m;
            scores[((int64_t)(tid % G) * n_tok + ct) * nbk + b] = z;
            if (b < cnb) {
                const unsigned long long uk = rank_key(z, b);
                cbest = uk > cbest ? uk : cbest;
                if (slots) /* direct: the score for the picker (nonzero: it polls for it) */
                    st_relaxed_gpu(
                        slots + (size_t)((int)blockIdx.y * RPG + tid) * IDX_SLOT_W + b, uk);
            }
        }
    }
    /* the next launch may start (its first key loads) once every block has scored: at the
     * block's entry its loads met this call's first key round (8K keys 6.5 against 6.1 us,
     * docs/gpu-log/indexer.md "Session 14") */
    m3_pdl_trigger();
    if (!cmax && !slots) return;
    /* the fused selection: as idx_dec_k, or direct: the slots of the row's key blocks */
    const unsigned int n = (unsigned int)grid * gridDim.y, R = (unsigned int)(n_tok * G);
    const int row = (int)(blockIdx.y * grid + blockIdx.x) - (int)(n - R);
    if (slots) {
        if (row >= 0) /* block-uniform */
            dec_pick<true, FIX == 2 ? 128 : 0>(sel, row, G, grid, NULL, sm,
                                               reinterpret_cast<unsigned long long *>(idx_dyn),
                                               slots + (size_t)row * IDX_SLOT_W, arrive + IDX_ZF);
        return;
    }
    unsigned int *cnt = &arrive[epoch & 1];
    if (tid < RPG && ct < n_tok) cmax[(size_t)((int)blockIdx.y * RPG + tid) * grid + x0] = cbest;
    __syncthreads(); /* every store of this block precedes thread 0's fence */
    if (tid == 0) {
        fence_acq_rel_gpu();
        atomicAdd(cnt, 1u); /* no return value: a fire-and-forget reduction */
        if (row >= 0) { /* a picking block: wait for every arrival */
            while (ld_relaxed_gpu(cnt) != n) {
            }
            fence_acq_rel_gpu();
        }
    }
    if (row < 0) return; /* block-uniform */
    __syncthreads();
    dec_pick<true, FIX == 2 ? 128 : 0>(sel, row, G, grid, cmax, sm,
                                       reinterpret_cast<unsigned long long *>(idx_dyn), NULL);
#else
    (void)scores; (void)iq; (void)ld_q; (void)ik; (void)pos; (void)n_tok_; (void)nbk; (void)n_ctx;
    (void)G_; (void)Di_; (void)B_; (void)scale; (void)nan_neg; (void)sel; (void)cmax; (void)epoch;
    (void)arrive; (void)slots; (void)q16; (void)zx;
#endif
}

/* Launch idx_dec_k, or idx_km_k at T * G <= 8: 4 blocks per SM over the groups (at most one
 * per key block), at least R blocks (the fused selection's rows). fuse is cleared when the
 * candidates would not fit in shared memory (then the caller runs a selection kernel). */
static m3_status dec_launch(m3_gpu *g, float *S, const m3_bf16 *iq, int ld_q, const idx_keys &ik,
                            const int32_t *pos, int n_tok, int nbk, int n_ctx, int G, int Di, int B,
                            const m3_profile *p, const idx_sel &sa, bool &fuse) {
    const bool k8 = ik.elem == M3_KV_FP8; /* e4m3fn codes (the launcher's contract) */
    const int R = n_tok * G;
    const bool km = R <= 8; /* one group of 8 query rows: idx_km_k */
    /* M3's geometry (and T = 1): idx_km_k with it compiled in (session 12: 8K keys 7.5 -> 7.0
     * us; fewer instructions on a path that runs once per launch) */
    const bool fix = km && G == 4 && Di == 128 && B == 128 && (!ik.bt || ik.bs == 128);
    typedef void (*km_fn)(float *, const m3_bf16 *, int, idx_keys, const int32_t *, int, int,
                          int, int, int, int, float, bool, idx_sel, unsigned long long *,
                          unsigned int *, unsigned int, unsigned long long *, bool, bool);
    static const km_fn km_tab[2][3] = {{idx_km_k<false, 0>, idx_km_k<false, 1>, idx_km_k<false, 2>},
                                       {idx_km_k<true, 0>, idx_km_k<true, 1>, idx_km_k<true, 2>}};
    const km_fn kmf = km_tab[k8][fix ? (n_tok == 1 ? 2 : 1) : 0];
    const void *kern = km ? (const void *)kmf
                          : (k8 ? (const void *)idx_dec_k<true> : (const void *)idx_dec_k<false>);
    const int rpg = km ? 8 : 16, n_group = (n_tok + rpg / G - 1) / (rpg / G);
    int gx = (4 * g->n_sm + n_group - 1) / n_group;
    gx = gx < nbk ? gx : nbk;
    if (gx * n_group < R) gx = (R + n_group - 1) / n_group;
    if (gx > IDX_PICK_CPT * IST_THREADS) gx = IDX_PICK_CPT * IST_THREADS;
    const bool direct = fuse && km && nbk <= IDX_SLOT_W;
    unsigned long long *cmax = NULL, *slots = NULL;
    /* the fused selection's candidates: (K+1) * cpt rank keys per key block of a scoring
     * block (cpt: block maxima per dec_pick thread; see dec_pick); direct: (K+1) * ceil(nbk /
     * IST_THREADS) (one key block per slot) */
    const size_t cpt = (size_t)((gx + IST_THREADS - 1) / IST_THREADS);
    /* + 2 keys: dec_pick's rank loop reads the keys in 16-byte pairs, the last pair may reach
     * one key past the count (compute-sanitizer memcheck flagged it, session 4) */
    size_t dyn = ((size_t)(sa.K + 1) * cpt * ((nbk + gx - 1) / gx) + 2) * sizeof *cmax;
    if (direct)
        dyn = ((size_t)(sa.K + 1) * ((nbk + IST_THREADS - 1) / IST_THREADS) + 2) * sizeof *cmax;
    if (dyn > 96 * 1024) fuse = false; /* K = 16, 132 SMs, T = 1: past ~127K key blocks */
    if (!fuse) dyn = 0;
    if (direct)
        slots = reinterpret_cast<unsigned long long *>(g->counters + M3_GPU_CNT_IDXS);
    else if (fuse)
        M3_TRY(m3_gpu_alloc(g, (void **)&cmax, (size_t)n_group * 16 * gx * sizeof *cmax));
    if (fuse && dyn > 48 * 1024)
        M3_HIP_TRY(hipFuncSetAttribute(kern, hipFuncAttributeMaxDynamicSharedMemorySize, (int)dyn));
    /* calls with the arrival counter so far, per context: the parity picks the counter, and
     * each such call zeroes the other one for the next (stream order; direct calls use none) */
    unsigned int &ep = g->idx_calls;
    unsigned int *arrive = g->counters + M3_GPU_CNT_IDX;
    /* direct: a zeroing block past the scoring ones while the grid fits one wave (at 128K keys
     * it would wait for a slot, and block (0, 0)'s fence is hidden by its second key block) */
    const bool zx = direct && gx < 4 * g->n_sm;
    const dim3 grid((unsigned)(gx + zx), (unsigned)n_group);
    const bool nn = p->index_nan == M3_INDEX_NAN_NEG;
    const float sc = p->index_scale;
    /* idx_km_k's Q pieces: 16-byte loads when every piece is 16-byte aligned */
    const bool q16 = (uintptr_t)iq % 16 == 0 && ld_q % 8 == 0 && Di % 8 == 0;
    if (km) /* a programmatic dependent of the launch before it (idx_km_k's entry) */
        M3_TRY(m3_gpu_launch_pdl(g, true, kmf, grid, dim3(IST_THREADS), dyn, S, iq, ld_q, ik, pos,
                                 n_tok, nbk, n_ctx, G, Di, B, sc, nn, sa, cmax, arrive, ep, slots,
                                 q16, zx));
    else if (k8)
        idx_dec_k<true><<<grid, IST_THREADS, dyn, g->stream>>>(
            S, iq, ld_q, ik, pos, n_tok, nbk, n_ctx, G, Di, B, sc, nn, sa, cmax, arrive, ep);
    else
        idx_dec_k<false><<<grid, IST_THREADS, dyn, g->stream>>>(
            S, iq, ld_q, ik, pos, n_tok, nbk, n_ctx, G, Di, B, sc, nn, sa, cmax, arrive, ep);
    const m3_status s = m3_gpu_launched_(g, km ? "idx_km_k" : "idx_dec_k", __FILE__, __LINE__);
    if (s == M3_OK && fuse && !direct) ep++;
    return s;
}

/* ---- launchers -------------------------------------------------------------------------
 * Scoring: idx_dec_k (bf16 queries, bf16 or e4m3fn keys, at most IDX_DEC_GROUPS groups of
 * 16/G tokens: decode; the selection fused; idx_km_k when T * G <= 8), idx_wide_k (bf16,
 * more tokens, enough key blocks to fill the device: 256/G tokens per pass over the keys),
 * idx_score_mma_k (bf16, the rest: keys staged per block for 4 * 16/G tokens) or idx_score_k
 * (fp32 queries or keys, other fp8 keys, odd shapes). Selection (when not fused):
 * idx_topk_k (one pass, nb <= 8192), else the arg-max rounds of idx_select_k or idx_cand_k +
 * idx_pick_k. `path` (m3_gpu_indexer_topk_path: tests and benches) forces a path where its
 * shape contract holds. idx_km_k reads its first key block before the kernel launched just
 * before it has finished (a programmatic dependent launch): that kernel may write index keys
 * at the call's own positions (the cache write of the tokens being scored), no others. */

template <typename TS>
static m3_status launch(m3_gpu *g, int path, int32_t *d_topk, float *d_scores, float *d_margin,
                        int *d_n_ties, const TS *d_iq, int ld_q, const m3_gpu_index_keys *keys,
                        const int32_t *d_pos, int n_tok, int n_ctx, const m3_indexer_params *ip,
                        const m3_profile *p) {
    M3_ASSERT(ip && p && n_tok >= 0 && n_ctx > 0 && ip->n_index_head > 0 && d_topk);
    M3_ASSERT(keys && keys->k && (!keys->bt || keys->block > 0));
    M3_ASSERT(keys->elem == M3_KV_F32 || keys->elem == M3_KV_BF16 || keys->elem == M3_KV_FP8);
    const idx_keys d_ik = {keys->k, keys->bt, keys->bt ? keys->block : 1, (int)keys->elem,
                           (int)keys->kind};
    M3_ASSERT(ip->block > 0 && ip->topk > 0 && ip->local_blocks >= 0 && ip->init_blocks >= 0);
    M3_ASSERT(ld_q >= ip->n_index_head * ip->index_head_dim && p->index_scale > 0.0f);
    if (ip->n_index_head > IDX_MAX_G || ip->topk > IDX_MAX_K)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu indexer: G=%d > %d or K=%d > %d",
                         ip->n_index_head, IDX_MAX_G, ip->topk, IDX_MAX_K);
    const size_t shmem = (size_t)ip->n_index_head * ip->index_head_dim * sizeof(float);
    if (shmem > 48 * 1024 || n_tok > 65535)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu indexer: %d tokens or %zu bytes of queries",
                         n_tok, shmem);
    if (n_tok == 0) return d_n_ties ? m3_gpu_memset(g, d_n_ties, 0, sizeof(int)) : M3_OK;
    const int nbk = (n_ctx + ip->block - 1) / ip->block;
    const int width = m3_indexer_width(n_ctx, ip, p);
    const int G = ip->n_index_head, Di = ip->index_head_dim, B = ip->block, K = ip->topk;
#if defined(M3_HIP_NVIDIA)
    const bool shape_ok = sizeof(TS) == 2 && 16 % G == 0 && Di % 16 == 0 && Di <= ISM_MAX_DI &&
                          B % 8 == 0 && B <= ISM_MAX_B && ld_q % 2 == 0;
#else
    const bool shape_ok = false;
#endif
    /* bf16 keys: every tensor-core path; e4m3fn keys (the fp8 index cache): idx_dec_k */
    const bool k16 = keys->elem == M3_KV_BF16;
    const bool k8 = keys->elem == M3_KV_FP8 && keys->kind == M3_FP8_E4M3FN && Di % 64 == 0;
    const bool tile_ok = shape_ok && k16;
    const bool stream_ok = tile_ok && Di % 32 == 0 && B % 32 == 0;
    const int n_group = shape_ok ? (n_tok + 16 / G - 1) / (16 / G) : 0;
    const bool dec_ok = shape_ok && (k16 || k8) && Di % 32 == 0 && B % 32 == 0 &&
                        n_group <= IDX_DEC_GROUPS;
    const int n_wg = (n_tok + IWD_WARPS * 32 / G - 1) / (IWD_WARPS * 32 / G);
    const int want = path & M3_GPU_IDX_SCORE;
    const bool nosel = (path & M3_GPU_IDX_NOSEL) != 0, rounds = (path & M3_GPU_IDX_SEL_ROUNDS) != 0;
    /* score 1 decode, 2 tile, 3 cuda, 4 wide */
    int score = want == M3_GPU_IDX_DECODE ? 1
                : want == M3_GPU_IDX_TILE ? 2
                : want == M3_GPU_IDX_CUDA ? 3
                : want == M3_GPU_IDX_WIDE ? 4
                                          : 0;
    if (score == 1 && !dec_ok) score = 0;
    if (score == 0)
        score = dec_ok                                   ? 1
                : stream_ok && nbk * n_wg >= 2 * g->n_sm ? 4
                : tile_ok                                ? 2
                                                         : 3;
    if (score == 4 && !stream_ok) score = tile_ok ? 2 : 3;
    if (score == 2 && !tile_ok) score = 3;
    bool fuse = score == 1 && !nosel && !rounds && !(path & M3_GPU_IDX_SEL_KERNEL);
    if (d_n_ties && score != 1 && score != 4) M3_TRY(m3_gpu_memset(g, d_n_ties, 0, sizeof(int)));
    const size_t mark = m3_gpu_mark(g);
    float *S = d_scores;
    if (!S) M3_TRY(m3_gpu_alloc(g, (void **)&S, (size_t)G * n_tok * nbk * sizeof(float)));
    idx_sel sa = {d_topk, S, d_margin, d_n_ties, d_pos, n_tok, nbk, width, B, K, ip->local_blocks,
                  ip->init_blocks, p->index_init_blocks, p->init_boost, p->local_boost,
                  p->topk_tie_margin};
    m3_status s;
    if (score == 1) {
        s = dec_launch(g, S, (const m3_bf16 *)d_iq, ld_q, d_ik, d_pos, n_tok, nbk,
                       n_ctx, G, Di, B, p, sa, fuse);
    } else if (score == 4) {
        int gx = (2 * g->n_sm + n_wg - 1) / n_wg;
        gx = gx < nbk ? gx : nbk;
        idx_wide_k<<<dim3((unsigned)gx, (unsigned)n_wg), IWD_THREADS, 0, g->stream>>>(
            S, d_n_ties, (const m3_bf16 *)d_iq, ld_q, d_ik, d_pos, n_tok, nbk,
            n_ctx, G, Di, B, p->index_scale, p->index_nan == M3_INDEX_NAN_NEG);
        s = m3_gpu_launched_(g, "idx_wide_k", __FILE__, __LINE__);
    } else if (score == 2) {
        const int tpc = 4 * (16 / G);
        dim3 gs((unsigned)((n_tok + tpc - 1) / tpc), (unsigned)nbk);
        idx_score_mma_k<<<gs, ISM_THREADS, 0, g->stream>>>(
            S, (const m3_bf16 *)d_iq, ld_q, d_ik, d_pos, n_tok, nbk, n_ctx, G, Di,
            B, p->index_scale, p->index_nan == M3_INDEX_NAN_NEG);
        s = m3_gpu_launched_(g, "idx_score_mma_k", __FILE__, __LINE__);
    } else {
        dim3 gs((unsigned)nbk, (unsigned)n_tok);
        idx_score_k<TS><<<gs, IDX_THREADS, shmem, g->stream>>>(
            S, d_iq, ld_q, d_ik, d_pos, n_tok, nbk, G, Di, B, p->index_scale,
            p->index_nan == M3_INDEX_NAN_NEG);
        s = m3_gpu_launched_(g, "idx_score_k", __FILE__, __LINE__);
    }
    if (fuse || nosel || s != M3_OK) {
        m3_gpu_release(g, mark);
        return s;
    }
    const dim3 rows((unsigned)n_tok, (unsigned)G);
    const int n_chunk = (nbk + IDX_CHUNK - 1) / IDX_CHUNK, n_cand = n_chunk * (K + 1);
    if (!rounds && nbk <= 64 * 4) {
        idx_topk_k<64, 4><<<rows, 64, (size_t)(K + 1) * 4 * 8, g->stream>>>(sa);
        s = m3_gpu_launched_(g, "idx_topk_k<64>", __FILE__, __LINE__);
    } else if (!rounds && nbk <= 256 * 32) { /* the fewest registers that hold nb */
        const int per = nbk <= 256 * 4 ? 4 : nbk <= 256 * 8 ? 8 : nbk <= 256 * 16 ? 16 : 32;
        const size_t cb = (size_t)(K + 1) * per * 8;
        if (per == 4) idx_topk_k<256, 4><<<rows, 256, cb, g->stream>>>(sa);
        else if (per == 8) idx_topk_k<256, 8><<<rows, 256, cb, g->stream>>>(sa);
        else if (per == 16) idx_topk_k<256, 16><<<rows, 256, cb, g->stream>>>(sa);
        else idx_topk_k<256, 32><<<rows, 256, cb, g->stream>>>(sa);
        s = m3_gpu_launched_(g, "idx_topk_k<256>", __FILE__, __LINE__);
    } else if (n_chunk > 1 && n_cand <= IDX_MAX_CAND) {
        float *cv = NULL;
        int *ci = NULL;
        const size_t nc = (size_t)G * n_tok * n_cand;
        s = m3_gpu_alloc(g, (void **)&cv, nc * sizeof(float));
        if (s == M3_OK) s = m3_gpu_alloc(g, (void **)&ci, nc * sizeof(int));
        if (s == M3_OK) {
            idx_cand_k<<<dim3((unsigned)n_chunk, (unsigned)n_tok, (unsigned)G), IDX_CHUNK, 0, g->stream>>>(
                cv, ci, S, d_pos, n_tok, nbk, n_chunk, B, ip->topk, ip->local_blocks,
                ip->init_blocks, p->index_init_blocks, p->init_boost, p->local_boost);
            s = m3_gpu_launched_(g, "idx_cand_k", __FILE__, __LINE__);
        }
        if (s == M3_OK) {
            idx_pick_k<<<rows, IDX_THREADS, 0, g->stream>>>(
                d_topk, d_margin, d_n_ties, cv, ci, d_pos, n_tok, n_cand, width, B, ip->topk,
                p->topk_tie_margin);
            s = m3_gpu_launched_(g, "idx_pick_k", __FILE__, __LINE__);
        }
    } else {
        idx_select_k<<<rows, IDX_THREADS, 0, g->stream>>>(
            d_topk, S, d_margin, d_n_ties, d_pos, n_tok, nbk, width, ip->block, ip->topk,
            ip->local_blocks, ip->init_blocks, p->index_init_blocks, p->init_boost, p->local_boost,
            p->topk_tie_margin);
        s = m3_gpu_launched_(g, "idx_select_k", __FILE__, __LINE__);
    }
    m3_gpu_release(g, mark); /* stream order keeps the temporary valid for its readers */
    return s;
}

static m3_gpu_index_keys plain_keys(const void *ik, m3_kv_elem elem) {
    m3_gpu_index_keys k;
    memset(&k, 0, sizeof k);
    k.k = ik, k.elem = elem;
    return k;
}

extern "C" m3_status m3_gpu_indexer_topk_path(m3_gpu *g, int path, int32_t *d_topk, float *d_scores,
                                              float *d_margin, int *d_n_ties, const m3_bf16 *d_iq,
                                              int ld_q, const m3_bf16 *d_ik, const int32_t *d_pos,
                                              int n_tok, int n_ctx, const m3_indexer_params *ip,
                                              const m3_profile *p) {
    const m3_gpu_index_keys k = plain_keys(d_ik, M3_KV_BF16);
    return launch<m3_bf16>(g, path, d_topk, d_scores, d_margin, d_n_ties, d_iq, ld_q, &k, d_pos,
                           n_tok, n_ctx, ip, p);
}

extern "C" m3_status m3_gpu_indexer_topk_f32_path(m3_gpu *g, int path, int32_t *d_topk,
                                                  float *d_scores, float *d_margin, int *d_n_ties,
                                                  const float *d_iq, int ld_q, const float *d_ik,
                                                  const int32_t *d_pos, int n_tok, int n_ctx,
                                                  const m3_indexer_params *ip,
                                                  const m3_profile *p) {
    const m3_gpu_index_keys k = plain_keys(d_ik, M3_KV_F32);
    return launch<float>(g, path, d_topk, d_scores, d_margin, d_n_ties, d_iq, ld_q, &k, d_pos,
                         n_tok, n_ctx, ip, p);
}

extern "C" m3_status m3_gpu_indexer_topk(m3_gpu *g, int32_t *d_topk, float *d_scores,
                                         float *d_margin, int *d_n_ties, const m3_bf16 *d_iq,
                                         int ld_q, const m3_bf16 *d_ik, const int32_t *d_pos,
                                         int n_tok, int n_ctx, const m3_indexer_params *ip,
                                         const m3_profile *p) {
    return m3_gpu_indexer_topk_path(g, M3_GPU_IDX_AUTO, d_topk, d_scores, d_margin, d_n_ties, d_iq,
                                    ld_q, d_ik, d_pos, n_tok, n_ctx, ip, p);
}

extern "C" m3_status m3_gpu_indexer_topk_f32(m3_gpu *g, int32_t *d_topk, float *d_scores,
                                             float *d_margin, int *d_n_ties, const float *d_iq,
                                             int ld_q, const float *d_ik, const int32_t *d_pos,
                                             int n_tok, int n_ctx, const m3_indexer_params *ip,
                                             const m3_profile *p) {
    return m3_gpu_indexer_topk_f32_path(g, M3_GPU_IDX_AUTO, d_topk, d_scores, d_margin, d_n_ties,
                                        d_iq, ld_q, d_ik, d_pos, n_tok, n_ctx, ip, p);
}

extern "C" m3_status m3_gpu_indexer_topk_keys(m3_gpu *g, int path, int32_t *d_topk,
                                              float *d_scores, float *d_margin, int *d_n_ties,
                                              const m3_bf16 *d_iq, int ld_q,
                                              const m3_gpu_index_keys *keys, const int32_t *d_pos,
                                              int n_tok, int n_ctx, const m3_indexer_params *ip,
                                              const m3_profile *p) {
    return launch<m3_bf16>(g, path, d_topk, d_scores, d_margin, d_n_ties, d_iq, ld_q, keys, d_pos,
                           n_tok, n_ctx, ip, p);
}

extern "C" m3_status m3_gpu_indexer_topk_keys_f32(m3_gpu *g, int path, int32_t *d_topk,
                                                  float *d_scores, float *d_margin, int *d_n_ties,
                                                  const float *d_iq, int ld_q,
                                                  const m3_gpu_index_keys *keys,
                                                  const int32_t *d_pos, int n_tok, int n_ctx,
                                                  const m3_indexer_params *ip,
                                                  const m3_profile *p) {
    return launch<float>(g, path, d_topk, d_scores, d_margin, d_n_ties, d_iq, ld_q, keys, d_pos,
                         n_tok, n_ctx, ip, p);
}
