/* gpu/attn.hip: causal GQA attention, dense (spec §3.7) and block-sparse given selected
 * key blocks (§3.10), device twin of ref/attn.c (m3_attn_dense, m3_attn_sparse). Prefill and
 * decode share the code: the query at absolute position pos[t] attends to keys 0..pos[t].
 * Tolerance: GPU_NMSE_F32 (fp32 profile) / GPU_NMSE_BF16 (tests/gpu_test.h until
 * compare/tol.c has an "attn" row). Tests: tests/gpu_attn.c.
 *
 * attn_row_k: one block per (token, query head) row, ATTN_THREADS threads. This is the
 *   faithful (not the fastest) formulation: it reproduces the reference's rounding points
 *   exactly, including those that an online softmax cannot (P normalised before its bf16
 *   rounding; atom's partitions of attn_partition keys stored bf16 and merged with fp32
 *   log-sum-exp weights). Keys are visited in the reference's accumulation order (key
 *   ranges: dense [0, p]; sparse: selected full blocks in position or selection order, then
 *   the own block up to p) in tiles of TILE keys whose scores live in shared memory:
 *     pass 1  scores -> global max M (order-free, exact);
 *     unpartitioned: pass 2 den = sum exp(z - M); pass 3 P = bf16?(exp(z - M)/den),
 *       o[d] += P V[d] key by key in order (each thread owns dims d: sequential, the
 *       reference's order);
 *     partitioned (TILE = attn_partition): per partition m_j, l_j, o_j = bf16(sum P V / l_j)
 *       with unnormalised bf16?(exp(z - m_j)), merged in partition order with
 *       w_j = l_j exp(m_j - M).
 *   Scores are recomputed in each pass (2-3x the q.k work of a single pass). Scores: one
 *   warp per key, lanes over Dh, warp butterfly (the order differs from ref's 8-lane dot
 *   by fp32 rounding only); hf eager rounds bf16(bf16(dot)*s). */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "ref/attn.h"
#include "ref/num/bf16.h"

#define ATTN_THREADS 128
#define ATTN_TILE 256     /* keys per tile when not partitioned */
#define ATTN_MAX_RANGES 65 /* width <= 64 selected blocks + the own block */
#define ATTN_MAX_DH 256

/* ---- static device helpers ------------------------------------------------------------- */
static __device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld(const m3_bf16 *p, int64_t i) {
    return m3_bf16_to_f32(p[i]);
}
static __device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void st(m3_bf16 *p, int64_t i, float v) {
    p[i] = m3_f32_to_bf16(v);
}
static __device__ __forceinline__ float rnd(bool on, float x) {
    return on ? m3_round_bf16(x) : x;
}

typedef struct {
    int n_head, n_kv_head, head_dim, tile;
    float scale;
    bool eager, p_bf16, out_bf16, partitioned, sel_order;
} attn_cfg;

/* Key position of the i-th key in accumulation order (ranges rng[2r], rng[2r+1]). */
static __device__ __forceinline__ int key_at(const int *rng, int nr, int i) {
    for (int r = 0; r < nr; r++) {
        int len = rng[2 * r + 1] - rng[2 * r];
        if (i < len) return rng[2 * r] + i;
        i -= len;
    }
    return -1; /* not reached: i < total */
}

/* Scores z[i - i0] for keys i0..i1-1 into shared z (and their positions into kk). */
template <typename TS>
static __device__ void tile_scores(float *z, int *kk, const float *q_sh, const TS *k, int64_t kv_off,
                                   int64_t kv_pitch, const int *rng, int nr, int i0, int i1,
                                   const attn_cfg &c) {
    const int lane = (int)threadIdx.x % M3_WARP, warp = (int)threadIdx.x / M3_WARP;
    const int n_warp = (int)blockDim.x / M3_WARP;
    for (int i = i0 + warp; i < i1; i += n_warp) {
        const int key = key_at(rng, nr, i);
        const TS *kr = k + (int64_t)key * kv_pitch + kv_off;
        float d = 0.0f;
        for (int e = lane; e < c.head_dim; e += M3_WARP) d += q_sh[e] * ld(kr, e);
        d = m3_warp_sum(d);
        if (lane == 0) {
            z[i - i0] = c.eager ? m3_round_bf16(m3_round_bf16(d) * c.scale) : d * c.scale;
            kk[i - i0] = key;
        }
    }
}

/* ---- kernel ---------------------------------------------------------------------------- */
template <typename TS>
static __global__ void __launch_bounds__(ATTN_THREADS)
    attn_row_k(TS *M3_RESTRICT out, const TS *M3_RESTRICT q, int ld_q, const TS *M3_RESTRICT k,
               const TS *M3_RESTRICT v, const int32_t *M3_RESTRICT pos, int n_tok,
               const int32_t *M3_RESTRICT topk, int width, int block, attn_cfg c) {
    extern __shared__ float sh[];
    float *z = sh;                          /* [tile] */
    int *kk = (int *)(z + c.tile);          /* [tile] */
    float *q_sh = (float *)(kk + c.tile);   /* [Dh] */
    float *o = q_sh + c.head_dim;           /* [Dh] running output (merged) */
    __shared__ int rng[2 * ATTN_MAX_RANGES];
    __shared__ int nr_sh;
    __shared__ float red[M3_MAX_WARPS];

    const int t = (int)blockIdx.x / c.n_head, h = (int)blockIdx.x % c.n_head;
    const int gq = h / (c.n_head / c.n_kv_head);
    const int p = pos[t];
    const int64_t kv_pitch = (int64_t)c.n_kv_head * c.head_dim, kv_off = (int64_t)gq * c.head_dim;

    /* key ranges (thread 0), exactly as the reference builds them */
    if (threadIdx.x == 0) {
        int n = 0;
        if (!topk) {
            rng[0] = 0, rng[1] = p + 1, n = 1;
        } else {
            const int bp = p / block;
            const int32_t *sel = topk + ((int64_t)gq * n_tok + t) * width;
            for (int i = 0; i < width; i++) {
                const int b = sel[i];
                if (b < 0 || b >= bp) continue; /* -1 padding, own block (added last), invalid */
                bool dup = false;
                for (int r = 0; r < n && !dup; r++) dup = rng[2 * r] == b * block;
                if (dup) continue;
                rng[2 * n] = b * block, rng[2 * n + 1] = (b + 1) * block, n++;
            }
            if (!c.sel_order) /* position order: insertion sort by block start */
                for (int a = 1; a < n; a++)
                    for (int j = a; j > 0 && rng[2 * j - 2] > rng[2 * j]; j--) {
                        int lo = rng[2 * j - 2], hi = rng[2 * j - 1];
                        rng[2 * j - 2] = rng[2 * j], rng[2 * j - 1] = rng[2 * j + 1];
                        rng[2 * j] = lo, rng[2 * j + 1] = hi;
                    }
            rng[2 * n] = bp * block, rng[2 * n + 1] = p + 1, n++; /* own block, always, last */
        }
        nr_sh = n;
    }
    const TS *qr = q + (int64_t)t * ld_q + (int64_t)h * c.head_dim;
    for (int d = threadIdx.x; d < c.head_dim; d += blockDim.x) {
        q_sh[d] = ld(qr, d);
        o[d] = 0.0f;
    }
    __syncthreads();
    const int nr = nr_sh;
    int n = 0;
    for (int r = 0; r < nr; r++) n += rng[2 * r + 1] - rng[2 * r];

    /* pass 1: the global max of the scores */
    float M = -INFINITY;
    for (int i0 = 0; i0 < n; i0 += c.tile) {
        const int i1 = min(i0 + c.tile, n);
        tile_scores(z, kk, q_sh, k, kv_off, kv_pitch, rng, nr, i0, i1, c);
        __syncthreads();
        float m = -INFINITY;
        for (int i = threadIdx.x; i < i1 - i0; i += blockDim.x) m = fmaxf(m, z[i]);
        M = fmaxf(M, m3_block_max(m, red));
    }

    TS *orow = out + ((int64_t)t * c.n_head + h) * c.head_dim;
    if (!c.partitioned || n <= c.tile) {
        /* pass 2: the denominator; pass 3: P (normalised, then rounded) times V in key order */
        float den = 0.0f;
        for (int i0 = 0; i0 < n; i0 += c.tile) {
            const int i1 = min(i0 + c.tile, n);
            tile_scores(z, kk, q_sh, k, kv_off, kv_pitch, rng, nr, i0, i1, c);
            __syncthreads();
            float s = 0.0f;
            for (int i = threadIdx.x; i < i1 - i0; i += blockDim.x) s += expf(z[i] - M);
            den += m3_block_sum(s, red);
        }
        for (int i0 = 0; i0 < n; i0 += c.tile) {
            const int i1 = min(i0 + c.tile, n);
            tile_scores(z, kk, q_sh, k, kv_off, kv_pitch, rng, nr, i0, i1, c);
            __syncthreads();
            for (int i = threadIdx.x; i < i1 - i0; i += blockDim.x)
                z[i] = rnd(c.p_bf16, expf(z[i] - M) / den);
            __syncthreads();
            for (int d = threadIdx.x; d < c.head_dim; d += blockDim.x) {
                float acc = o[d];
                for (int i = 0; i < i1 - i0; i++) acc += z[i] * ld(v, (int64_t)kk[i] * kv_pitch + kv_off + d);
                o[d] = acc;
            }
            __syncthreads(); /* z and kk are overwritten by the next tile */
        }
        for (int d = threadIdx.x; d < c.head_dim; d += blockDim.x) st(orow, d, rnd(c.out_bf16, o[d]));
        return;
    }

    /* partitioned (atom): tile == partition */
    float wsum = 0.0f;
    for (int i0 = 0; i0 < n; i0 += c.tile) {
        const int i1 = min(i0 + c.tile, n);
        tile_scores(z, kk, q_sh, k, kv_off, kv_pitch, rng, nr, i0, i1, c);
        __syncthreads();
        float m = -INFINITY;
        for (int i = threadIdx.x; i < i1 - i0; i += blockDim.x) m = fmaxf(m, z[i]);
        m = m3_block_max(m, red);
        float s = 0.0f;
        for (int i = threadIdx.x; i < i1 - i0; i += blockDim.x) {
            const float e = expf(z[i] - m);
            s += e;
            z[i] = rnd(c.p_bf16, e); /* unnormalised P, normalised per partition below */
        }
        const float l = m3_block_sum(s, red); /* contains barriers: z is complete after it */
        const float w = l * expf(m - M);
        wsum += w;
        for (int d = threadIdx.x; d < c.head_dim; d += blockDim.x) {
            float acc = 0.0f;
            for (int i = 0; i < i1 - i0; i++) acc += z[i] * ld(v, (int64_t)kk[i] * kv_pitch + kv_off + d);
            o[d] += w * rnd(c.out_bf16, acc / l); /* partition output stored bf16, merged fp32 */
        }
        __syncthreads();
    }
    for (int d = threadIdx.x; d < c.head_dim; d += blockDim.x) st(orow, d, rnd(c.out_bf16, o[d] / wsum));
}

/* ---- launchers ------------------------------------------------------------------------- */
template <typename TS>
static m3_status launch(m3_gpu *g, TS *d_out, const TS *d_q, int ld_q, const TS *d_k,
                        const TS *d_v, const int32_t *d_pos, int n_tok, int n_ctx,
                        const int32_t *d_topk, int width, int block, const m3_attn_params *ap,
                        const m3_profile *p) {
    M3_ASSERT(ap && p && n_tok >= 0 && n_ctx > 0);
    M3_ASSERTF(ap->n_head % ap->n_kv_head == 0 && ld_q >= ap->n_head * ap->head_dim,
               "H=%d Hkv=%d Dh=%d ld_q=%d", ap->n_head, ap->n_kv_head, ap->head_dim, ld_q);
    if (ap->head_dim > ATTN_MAX_DH)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu attention: head_dim %d > %d", ap->head_dim,
                         ATTN_MAX_DH);
    if (d_topk && (width + 1 > ATTN_MAX_RANGES || block <= 0))
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu sparse attention: width %d > %d", width,
                         ATTN_MAX_RANGES - 1);
    if (n_tok == 0) return M3_OK;
    attn_cfg c;
    c.n_head = ap->n_head, c.n_kv_head = ap->n_kv_head, c.head_dim = ap->head_dim;
    c.scale = ap->scale;
    c.eager = p->attn_scores == M3_SCORES_BF16_EAGER;
    c.p_bf16 = p->attn_p_bf16, c.out_bf16 = p->attn_out_bf16;
    c.partitioned = p->attn_partition > 0;
    c.tile = c.partitioned ? p->attn_partition : ATTN_TILE;
    c.sel_order = p->attn_order == M3_ATTN_ORDER_SELECTION;
    size_t shmem = (size_t)c.tile * (sizeof(float) + sizeof(int)) + 2 * (size_t)c.head_dim * sizeof(float);
    if (shmem > 48 * 1024)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu attention: partition of %d keys too large", c.tile);
    const int64_t rows = (int64_t)n_tok * ap->n_head;
    if (rows > 0x7FFFFFFF) return m3_errorf(M3_ERR_UNSUPPORTED, "gpu attention: %lld rows", (long long)rows);
    attn_row_k<TS><<<(unsigned)rows, ATTN_THREADS, shmem, g->stream>>>(
        d_out, d_q, ld_q, d_k, d_v, d_pos, n_tok, d_topk, width, block, c);
    M3_LAUNCHED(g, "attn_row_k");
    return M3_OK;
}

extern "C" m3_status m3_gpu_attn_dense(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                       const m3_bf16 *d_k, const m3_bf16 *d_v,
                                       const int32_t *d_pos, int n_tok, int n_ctx,
                                       const m3_attn_params *ap, const m3_profile *p) {
    if (!p->attn_out_bf16)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu attention: profile %s keeps fp32: use _f32", p->name);
    return launch<m3_bf16>(g, d_out, d_q, ld_q, d_k, d_v, d_pos, n_tok, n_ctx, NULL, 0, 0, ap, p);
}

extern "C" m3_status m3_gpu_attn_dense_f32(m3_gpu *g, float *d_out, const float *d_q, int ld_q,
                                           const float *d_k, const float *d_v,
                                           const int32_t *d_pos, int n_tok, int n_ctx,
                                           const m3_attn_params *ap, const m3_profile *p) {
    return launch<float>(g, d_out, d_q, ld_q, d_k, d_v, d_pos, n_tok, n_ctx, NULL, 0, 0, ap, p);
}

extern "C" m3_status m3_gpu_attn_sparse(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                        const m3_bf16 *d_k, const m3_bf16 *d_v,
                                        const int32_t *d_pos, int n_tok, int n_ctx,
                                        const int32_t *d_topk, int width, int block,
                                        const m3_attn_params *ap, const m3_profile *p) {
    if (!p->attn_out_bf16)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu attention: profile %s keeps fp32: use _f32", p->name);
    return launch<m3_bf16>(g, d_out, d_q, ld_q, d_k, d_v, d_pos, n_tok, n_ctx, d_topk, width, block,
                           ap, p);
}

extern "C" m3_status m3_gpu_attn_sparse_f32(m3_gpu *g, float *d_out, const float *d_q, int ld_q,
                                            const float *d_k, const float *d_v,
                                            const int32_t *d_pos, int n_tok, int n_ctx,
                                            const int32_t *d_topk, int width, int block,
                                            const m3_attn_params *ap, const m3_profile *p) {
    return launch<float>(g, d_out, d_q, ld_q, d_k, d_v, d_pos, n_tok, n_ctx, d_topk, width, block,
                         ap, p);
}
