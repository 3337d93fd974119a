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

#include <string.h>


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

/* ==== fast paths: online softmax, K/V shared by the query heads of a KV group ==============
 * m3_gpu_attn_sparse_flash / m3_gpu_attn_dense_flash: production kernels (bf16 storage),
 * checked against the CPU reference with GPU_NMSE_FLASH (tests/gpu_test.h) because their
 * rounding points differ from the reference's in the way the spec §3.7 atom column allows:
 * P is rounded to bf16 UNNORMALISED (exp(z - m) against the running or per-range max m)
 * for the P.V product, the denominator sums the unrounded exponentials, partial outputs are
 * fp32 and merged with fp32 log-sum-exp weights (no bf16 partitions), key order is free.
 * Scores are fp32 (q.k)*s, or hf eager bf16(bf16(q.k)*s). The faithful kernels above stay
 * as the device reference (bit-faithful rounding points, style B6).
 *
 * Sparse: the key list of a (token t, kv head g) row is the selected blocks topk[g][t][j],
 *   j < width (skipped when -1, >= the own block, or a repeat of an earlier slot: duplicates
 *   count once), then the own block up to pos[t]; all hq = H/Hkv query heads of the group use
 *   each K and V row once. NVIDIA: sdec_k (below, before its launcher: warps own 16-key
 *   tiles, one launch with a fused merge). Elsewhere, flash-decoding in two kernels:
 * sparse_part_k: one block per (range j, g, t); scores a key per thread, P.V a dim per
 *   thread, all heads; writes (m, l, O) per head.
 * sparse_merge_k: per (token, head), o = sum_j w_j O_j / sum_j w_j l_j, w_j = exp(m_j - M).
 * dense_flash_k (NVIDIA mma.sync, FlashAttention-2 style; elsewhere the launcher uses the
 *   faithful kernel): one block per (FA_TOK = 8 consecutive tokens, kv head g), a warp per
 *   token whose 16 mma rows are the group's query heads (GQA: a K/V tile feeds 8 x 16 query
 *   rows). Q (block's 128 rows) and K/V tiles of FA_KT = 64 keys sit in shared memory,
 *   K/V double-buffered by cp.async (tile i+1 loads while tile i is computed); fragments by
 *   ldmatrix (V transposed by ldmatrix.trans). Per tile: S = Q K^T (fp32), scores in the
 *   log2 domain (z log2(e)), running max / sum per row (online softmax, fp32), P = bf16 of
 *   exp2(z - m) packed straight from the S registers into A fragments, O = O alpha + P V
 *   (fp32). Causal: tiles past the block's last position are not loaded, a warp skips
 *   tiles past its own position and masks only its diagonal tile. Blocks are launched
 *   heaviest (last tokens) first so the causal tail does not straggle. */
#define FD_THREADS 128
#define FD_MAX_HQ 16
#define FA_TOK 8
#define FA_KT 64
#define FA_MAX_DH 128
#define FA_P (FA_MAX_DH + 8) /* row pitch (bf16): 272 bytes, conflict-free ldmatrix rows */

#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && !M3_HAVE_MMA
#error "gpu/attn.hip: the flash kernels need mma.sync (sm_80 or newer) on NVIDIA"
#endif

#if M3_HAVE_MMA
/* cp.async / ldmatrix / cvt (sm_80+), local to this file. */
static __device__ __forceinline__ uint32_t sh_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* 16 bytes global -> shared, asynchronously; `full` false writes 16 zero bytes instead. */
static __device__ __forceinline__ void cp16(void *dst, const void *src, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sh_u32(dst)), "l"(src),
                 "r"(full ? 16 : 0));
}
static __device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
/* four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i; register i of a
 * lane holds matrix i's (row lane/4, cols 2(lane%4)..+1), or with .trans (rows 2(lane%4)..+1,
 * col lane/4): exactly the mma A/B fragment layouts of gpu/hip_compat.h. */
static __device__ __forceinline__ void ldsm4(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sh_u32(p)));
}
static __device__ __forceinline__ void ldsm4t(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sh_u32(p)));
}
/* two floats -> two bf16 (round to nearest even, = m3_f32_to_bf16 for finite values), lo
 * in the low half */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
/* a = bf16(a), b = bf16(b) as floats (one cvt for both) */
static __device__ __forceinline__ void round_bf16x2(float &a, float &b) {
    const uint32_t d = pack_bf16(a, b);
    a = __uint_as_float(d << 16), b = __uint_as_float(d & 0xFFFF0000u);
}
#endif

#if !defined(M3_HIP_NVIDIA) /* NVIDIA: sdec_k below */
/* sparse_part_k's shared memory: qs [hq][Dh] fp32 | ps [hq][block] fp32 | ks [block][Dh+2]
 * (odd word pitch: a key per thread) | vs [block][Dh]. */
static size_t fd_smem_bytes(int hq, int Dh, int block) {
    return sizeof(float) * ((size_t)hq * Dh + (size_t)hq * block) +
           (size_t)block * (Dh + 2) * sizeof(m3_bf16) + (size_t)block * Dh * sizeof(m3_bf16);
}

static __global__ void __launch_bounds__(FD_THREADS)
    sparse_part_k(float *M3_RESTRICT po, float *M3_RESTRICT pml, const m3_bf16 *M3_RESTRICT q,
                  int ld_q, const m3_bf16 *M3_RESTRICT k, const m3_bf16 *M3_RESTRICT v,
                  const int32_t *M3_RESTRICT pos, const int32_t *M3_RESTRICT topk, int T, int width,
                  int block, int H, int Hkv, int Dh, float scale, bool eager, bool p_bf16) {
    extern __shared__ __align__(16) unsigned char fd_raw[];
    const int j = (int)blockIdx.x, g = (int)blockIdx.y, t = (int)blockIdx.z;
    const int hq = H / Hkv, tid = (int)threadIdx.x;
    const int VP = Dh, KP = Dh + 2;
    float *qs = reinterpret_cast<float *>(fd_raw);                      /* [hq][Dh] */
    float *ps = qs + hq * Dh;                                           /* [hq][block] scores */
    m3_bf16 *ks = reinterpret_cast<m3_bf16 *>(ps + hq * block);         /* [block][KP] */
    m3_bf16 *vs = ks + (size_t)block * KP;                              /* [block][VP] */
    const int p = pos[t], bp = p / block;
    const size_t slot = ((size_t)t * Hkv + g) * (width + 1) + j;
    int b = bp, nk = p - bp * block + 1;
    bool valid = true;
    if (j < width) {
        const int32_t *row = topk + ((size_t)g * T + t) * width;
        b = row[j];
        nk = block;
        valid = b >= 0 && b < bp;
        for (int i = 0; i < j && valid; i++)
            if (row[i] == b) valid = false;
    }
    if (!valid) {
        if (tid < hq) pml[(slot * hq + tid) * 2] = -INFINITY, pml[(slot * hq + tid) * 2 + 1] = 0.0f;
        return; /* whole block */
    }
    const int key0 = b * block, dv8 = Dh / 8;
    const int lane = tid % M3_WARP, warp = tid / M3_WARP;
    for (int i = tid; i < hq * Dh; i += FD_THREADS)
        qs[i] = m3_bf16_to_f32(q[(size_t)t * ld_q + (size_t)(g * hq) * Dh + i]);
    for (int i = tid; i < block * dv8; i += FD_THREADS) { /* rows past nk: zeros */
        const int r = i / dv8, c = i % dv8;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
        if (r < nk) {
            const size_t src = ((size_t)(key0 + r) * Hkv + g) * Dh + (size_t)c * 8;
            kv = *reinterpret_cast<const uint4 *>(k + src);
            vv = *reinterpret_cast<const uint4 *>(v + src);
        }
        uint32_t *kd = reinterpret_cast<uint32_t *>(ks + (size_t)r * KP + c * 8); /* 4-byte aligned */
        kd[0] = kv.x, kd[1] = kv.y, kd[2] = kv.z, kd[3] = kv.w;
        *reinterpret_cast<uint4 *>(vs + (size_t)r * VP + c * 8) = vv;
    }
    __syncthreads();
    for (int kk = tid; kk < nk; kk += FD_THREADS) { /* scores: a key per thread, every head */
        float acc[FD_MAX_HQ];
#pragma unroll
        for (int h = 0; h < FD_MAX_HQ; h++) acc[h] = 0.0f;
        const uint32_t *kr = reinterpret_cast<const uint32_t *>(ks + (size_t)kk * KP);
        for (int d2 = 0; d2 < Dh / 2; d2++) {
            const uint32_t w = kr[d2];
            const float k0 = m3_bits_f32(w << 16), k1 = m3_bits_f32(w & 0xFFFF0000u);
#pragma unroll
            for (int h = 0; h < FD_MAX_HQ; h++)
                if (h < hq) {
                    const float2 qv = *reinterpret_cast<const float2 *>(qs + h * Dh + 2 * d2);
                    acc[h] += qv.x * k0 + qv.y * k1;
                }
        }
#pragma unroll
        for (int h = 0; h < FD_MAX_HQ; h++)
            if (h < hq) ps[h * block + kk] = eager ? m3_round_bf16(m3_round_bf16(acc[h]) * scale) : acc[h] * scale;
    }
    __syncthreads();
    for (int h = warp; h < hq; h += FD_THREADS / M3_WARP) { /* softmax per head */
        float m = -INFINITY;
        for (int kk = lane; kk < nk; kk += M3_WARP) m = fmaxf(m, ps[h * block + kk]);
        m = m3_warp_max(m);
        float l = 0.0f;
        for (int kk = lane; kk < block; kk += M3_WARP) {
            float e = 0.0f;
            if (kk < nk) {
                e = expf(ps[h * block + kk] - m);
                l += e;
            }
            ps[h * block + kk] = p_bf16 ? m3_round_bf16(e) : e;
        }
        l = m3_warp_sum(l);
        if (lane == 0) pml[(slot * hq + h) * 2] = m, pml[(slot * hq + h) * 2 + 1] = l;
    }
    __syncthreads();
    for (int d = tid; d < Dh; d += FD_THREADS) { /* P.V: a dim per thread, every head */
        float o[FD_MAX_HQ];
#pragma unroll
        for (int h = 0; h < FD_MAX_HQ; h++) o[h] = 0.0f;
        int kk = 0;
        for (; kk + 4 <= nk; kk += 4) {
            float vv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) vv[i] = m3_bf16_to_f32(vs[(size_t)(kk + i) * VP + d]);
#pragma unroll
            for (int h = 0; h < FD_MAX_HQ; h++)
                if (h < hq) {
                    const float4 pv = *reinterpret_cast<const float4 *>(ps + h * block + kk);
                    o[h] += pv.x * vv[0] + pv.y * vv[1] + pv.z * vv[2] + pv.w * vv[3];
                }
        }
        for (; kk < nk; kk++) {
            const float vv = m3_bf16_to_f32(vs[(size_t)kk * VP + d]);
#pragma unroll
            for (int h = 0; h < FD_MAX_HQ; h++)
                if (h < hq) o[h] += ps[h * block + kk] * vv;
        }
#pragma unroll
        for (int h = 0; h < FD_MAX_HQ; h++)
            if (h < hq) po[(slot * hq + h) * Dh + d] = o[h];
    }
}

static __global__ void __launch_bounds__(FD_THREADS)
    sparse_merge_k(m3_bf16 *M3_RESTRICT out, const float *M3_RESTRICT po, const float *M3_RESTRICT pml,
                   int Hkv, int hq, int Dh, int nr) {
    const int t = (int)blockIdx.x, hh = (int)blockIdx.y, g = hh / hq, h = hh % hq;
    const size_t s0 = ((size_t)t * Hkv + g) * nr;
    float M = -INFINITY;
    for (int j = 0; j < nr; j++) {
        const float l = pml[((s0 + j) * hq + h) * 2 + 1];
        if (l > 0.0f) M = fmaxf(M, pml[((s0 + j) * hq + h) * 2]);
    }
    for (int d = (int)threadIdx.x; d < Dh; d += (int)blockDim.x) {
        float num = 0.0f, den = 0.0f;
        for (int j = 0; j < nr; j++) {
            const size_t sl = (s0 + j) * hq + h;
            const float l = pml[sl * 2 + 1];
            if (!(l > 0.0f)) continue; /* a skipped range: its O was never written */
            const float w = expf(pml[sl * 2] - M);
            num += w * po[sl * Dh + d];
            den += w * l;
        }
        out[(size_t)t * Hkv * hq * Dh + (size_t)hh * Dh + d] = m3_f32_to_bf16(num / den);
    }
}
#endif

#if defined(M3_HIP_NVIDIA) /* elsewhere m3_gpu_attn_dense_flash runs the faithful kernel */
/* dense_flash_k's shared memory: Q [FA_TOK*16][FA_P] | K [2][FA_KT][FA_P] | V [2][FA_KT][FA_P] */
#define FA_SMEM ((size_t)(FA_TOK * 16 + 4 * FA_KT) * FA_P * sizeof(m3_bf16))

static __global__ void __launch_bounds__(FA_TOK * 32, 2)
    dense_flash_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT q, int ld_q,
                  const m3_bf16 *M3_RESTRICT k, const m3_bf16 *M3_RESTRICT v,
                  const int32_t *M3_RESTRICT pos, int T, int n_ctx, int H, int Hkv, int Dh,
                  float scale, bool eager) {
#if M3_HAVE_MMA
    extern __shared__ __align__(16) unsigned char fa_raw[];
    m3_bf16 *qs = reinterpret_cast<m3_bf16 *>(fa_raw); /* [FA_TOK*16][FA_P] */
    m3_bf16 *ks = qs + FA_TOK * 16 * FA_P;              /* [2][FA_KT][FA_P] */
    m3_bf16 *vs = ks + 2 * FA_KT * FA_P;                /* [2][FA_KT][FA_P] */
    __shared__ int kmax_sh;
    const float L2E = 1.4426950408889634f; /* log2(e): exp(x) = exp2(x log2 e) */
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, gq = lane / 4, tq = lane % 4;
    const int g = (int)blockIdx.y, hq = H / Hkv;
    const int t0 = ((int)gridDim.x - 1 - (int)blockIdx.x) * FA_TOK; /* heaviest tiles first */
    const int t = t0 + warp, dv8 = Dh / 8, nks = Dh / 16;
    const bool active = t < T;
    const int lim = active ? min(pos[t], n_ctx - 1) : -1; /* last key this token sees */
    if (tid == 0) kmax_sh = -1;
    __syncthreads();
    if (lane == 0 && active) atomicMax(&kmax_sh, lim);
    /* Q rows of the block: row w*16 + h = token t0 + w, head g*hq + h (zeros past hq / T) */
    for (int i = tid; i < FA_TOK * 16 * dv8; i += FA_TOK * 32) {
        const int r = i / dv8, c = i % dv8, tok = t0 + r / 16, h = r % 16;
        const bool in = tok < T && h < hq;
        const size_t src = (size_t)tok * ld_q + (size_t)(g * hq + h) * Dh + (size_t)c * 8;
        cp16(qs + r * FA_P + c * 8, in ? q + src : q, in);
    }
    __syncthreads();
    const int kmax = kmax_sh, ntile = kmax / FA_KT + 1;
    /* K/V tile `it` into stage st (keys past n_ctx: zeros, and masked) */
    auto load_kv = [&](int it, int st) {
        for (int i = tid; i < FA_KT * dv8; i += FA_TOK * 32) {
            const int r = i / dv8, c = i % dv8, key = it * FA_KT + r;
            const bool in = key < n_ctx;
            const size_t src = ((size_t)key * Hkv + g) * Dh + (size_t)c * 8;
            cp16(ks + (st * FA_KT + r) * FA_P + c * 8, in ? k + src : k, in);
            cp16(vs + (st * FA_KT + r) * FA_P + c * 8, in ? v + src : v, in);
        }
    };
    load_kv(0, 0);
    cp_commit(); /* group 0: Q and tile 0 */

    float o[FA_MAX_DH / 8][4];
#pragma unroll
    for (int i = 0; i < FA_MAX_DH / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f}; /* lrow: this lane's columns */
    /* ldmatrix row/column offsets of this lane (matrix i = lane/8): A from Q (rows +8(i&1),
     * cols +8(i>>1)); B of two n-tiles from K (keys +8(i>>1), dims +8(i&1)); from V with
     * .trans (keys +8(i&1), dims +8(i>>1)) */
    const int l7 = lane & 7, b3 = (lane >> 3) & 1, b4 = lane >> 4;
    const m3_bf16 *qw = qs + (warp * 16 + l7 + b3 * 8) * FA_P + b4 * 8;
    const int koff = (l7 + b4 * 8) * FA_P + b3 * 8, voff = (l7 + b3 * 8) * FA_P + b4 * 8;
    const float zs = eager ? L2E : scale * L2E;

    for (int it = 0; it < ntile; it++) {
        if (it + 1 < ntile) load_kv(it + 1, (it + 1) & 1);
        cp_commit(); /* possibly empty: keeps the wait count uniform */
        cp_wait<1>(); /* tile it (and Q) landed for this thread */
        __syncthreads();
        const int key0 = it * FA_KT;
        if (active && key0 <= lim) {
            const m3_bf16 *kst = ks + (it & 1) * FA_KT * FA_P, *vst = vs + (it & 1) * FA_KT * FA_P;
            float s[FA_KT / 8][4];
#pragma unroll
            for (int ni = 0; ni < FA_KT / 8; ni++) s[ni][0] = s[ni][1] = s[ni][2] = s[ni][3] = 0.0f;
#pragma unroll
            for (int ksi = 0; ksi < FA_MAX_DH / 16; ksi++) {
                if (ksi >= nks) break;
                uint32_t qa[4];
                ldsm4(qa, qw + ksi * 16);
#pragma unroll
                for (int np = 0; np < FA_KT / 16; np++) {
                    uint32_t kb[4];
                    ldsm4(kb, kst + np * 16 * FA_P + koff + ksi * 16);
                    m3_mma_bf16_16816(s[2 * np], qa, kb);
                    m3_mma_bf16_16816(s[2 * np + 1], qa, kb + 2);
                }
            }
            /* scores in the log2 domain; mask keys past lim (only the diagonal tile) */
            const bool diag = key0 + FA_KT - 1 > lim;
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int ni = 0; ni < FA_KT / 8; ni++) {
                if (eager) { /* bf16(bf16(q.k) * s), two at a time (cvt.rn = m3_round_bf16) */
#pragma unroll
                    for (int i = 0; i < 4; i += 2) {
                        round_bf16x2(s[ni][i], s[ni][i + 1]);
                        s[ni][i] *= scale, s[ni][i + 1] *= scale;
                        round_bf16x2(s[ni][i], s[ni][i + 1]);
                    }
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float z = s[ni][i] * zs;
                    if (diag && key0 + ni * 8 + 2 * tq + (i & 1) > lim) z = -INFINITY;
                    s[ni][i] = z;
                    mx[i >> 1] = fmaxf(mx[i >> 1], z);
                }
            }
            float alpha[2];
#pragma unroll
            for (int r = 0; r < 2; r++) { /* the 4 lanes of a quad hold one row */
                mx[r] = fmaxf(mx[r], M3_SHFL_XOR(mx[r], 1));
                mx[r] = fmaxf(mx[r], M3_SHFL_XOR(mx[r], 2));
                const float mn = fmaxf(mrow[r], mx[r]); /* finite: key0 <= lim is unmasked */
                alpha[r] = exp2f(mrow[r] - mn);         /* 0 on the first tile (-inf) */
                mrow[r] = mn;
                lrow[r] *= alpha[r];
            }
            uint32_t pa[FA_KT / 16][4];
#pragma unroll
            for (int ni = 0; ni < FA_KT / 8; ni++) {
                const float e0 = exp2f(s[ni][0] - mrow[0]), e1 = exp2f(s[ni][1] - mrow[0]);
                const float e2 = exp2f(s[ni][2] - mrow[1]), e3 = exp2f(s[ni][3] - mrow[1]);
                lrow[0] += e0 + e1;
                lrow[1] += e2 + e3;
                /* A fragment of P for k-step ni/2: n-tile 2kk -> a0 (row g), a1 (row g+8);
                 * n-tile 2kk+1 -> a2, a3 */
                pa[ni / 2][(ni % 2) * 2] = pack_bf16(e0, e1);
                pa[ni / 2][(ni % 2) * 2 + 1] = pack_bf16(e2, e3);
            }
#pragma unroll
            for (int ni = 0; ni < FA_MAX_DH / 8; ni++) {
                o[ni][0] *= alpha[0], o[ni][1] *= alpha[0];
                o[ni][2] *= alpha[1], o[ni][3] *= alpha[1];
            }
#pragma unroll
            for (int kk = 0; kk < FA_KT / 16; kk++)
#pragma unroll
                for (int np = 0; np < FA_MAX_DH / 16; np++) {
                    if (np >= nks) break;
                    uint32_t vb[4];
                    ldsm4t(vb, vst + kk * 16 * FA_P + voff + np * 16);
                    m3_mma_bf16_16816(o[2 * np], pa[kk], vb);
                    m3_mma_bf16_16816(o[2 * np + 1], pa[kk], vb + 2);
                }
        }
        __syncthreads(); /* stage it&1 is refilled by the next iteration */
    }
    cp_wait<0>();
    if (!active) return;
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lrow[r] += M3_SHFL_XOR(lrow[r], 1);
        lrow[r] += M3_SHFL_XOR(lrow[r], 2);
        inv[r] = 1.0f / lrow[r];
    }
#pragma unroll
    for (int ni = 0; ni < FA_MAX_DH / 8; ni++) {
        if (ni >= 2 * nks) break;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = gq + r * 8;
            if (row < hq)
                *reinterpret_cast<uint32_t *>(out + (size_t)t * H * Dh + (size_t)(g * hq + row) * Dh +
                                              ni * 8 + 2 * tq) =
                    pack_bf16(o[ni][2 * r] * inv[r], o[ni][2 * r + 1] * inv[r]);
        }
    }
#else
    (void)out; (void)q; (void)ld_q; (void)k; (void)v; (void)pos; (void)T; (void)n_ctx; (void)H;
    (void)Hkv; (void)Dh; (void)scale; (void)eager;
#endif
}
#endif

static m3_status flash_check(const m3_attn_params *ap, const m3_profile *p, int ld_q, int n_tok,
                             int n_ctx, const void *q, const void *k, const void *v) {
    M3_ASSERT(ap && p && n_tok >= 0 && n_ctx > 0);
    M3_ASSERTF(ap->n_head % ap->n_kv_head == 0 && ld_q >= ap->n_head * ap->head_dim,
               "H=%d Hkv=%d ld_q=%d", ap->n_head, ap->n_kv_head, ld_q);
    if (!p->attn_out_bf16)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu attention flash: profile %s keeps fp32 outputs "
                         "(use the _f32 faithful kernels)", p->name);
    const int hq = ap->n_head / ap->n_kv_head;
    if (hq > FD_MAX_HQ || ap->head_dim % 16 || ap->head_dim > FA_MAX_DH || ld_q % 8)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu attention flash: H/Hkv=%d Dh=%d ld_q=%d (needs "
                         "H/Hkv <= %d, Dh %% 16 == 0, Dh <= %d, ld_q %% 8 == 0)", hq, ap->head_dim,
                         ld_q, FD_MAX_HQ, FA_MAX_DH);
    if (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) % 16) /* 16-byte copies */
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu attention flash: q/k/v not 16-byte aligned");
    return M3_OK;
}

/* Raise a kernel's dynamic shared-memory limit past the default 48 KB. */
static m3_status smem_limit(const void *fn, size_t bytes, const char *name) {
    if (bytes <= 48 * 1024) return M3_OK;
    hipError_t e = hipFuncSetAttribute(fn, hipFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != hipSuccess) return m3_gpu_fail_(e, __FILE__, __LINE__, name);
    return M3_OK;
}

/* ==== sparse flash decode (sdec_k): warps own keys, one launch =============================
 * The NVIDIA path of m3_gpu_attn_sparse_flash (elsewhere sparse_part_k + sparse_merge_k).
 * A row is one (token t, kv head g); its key list is the `width` selected ranges (skipped when
 * -1, >= the own block or a repeat of an earlier slot) and the own block up to pos[t], cut
 * into tiles of SD_KT = 16 keys (a range's last tile may be partial: zero-filled, masked).
 * Block (chunk c, g, t) takes tiles [c tpb, (c + 1) tpb) of that list; its W warps take
 * them round-robin, each warp streaming its own tiles through its own S = 2 shared-memory
 * stages by cp.async (K and V rows of 16 keys, 272-byte pitch at Dh = 128: conflict-free
 * ldmatrix; 8.5 KB a stage), so no block barrier runs per tile. The launcher takes W = 4
 * (68 KB, three blocks per SM) and cuts rows into chunks only to fill the SMs (T = 64
 * decode at M3 shapes: one block per row), or W = 8 (one block per SM) when there are fewer
 * rows than SMs (T = 1: 9 chunks a row). Batch 1 also measured W 4 / S 3 (two blocks per
 * SM: prefill 7.3 ms against 5.66) and W 8 / S 2 for every shape (T = 64 0.079 ms against
 * 0.070). Per tile a warp computes S = Q K^T for the
 * group's hq <= 16 heads as the 16 mma rows (Q fragments in registers), the running max and
 * the per-lane partial denominators (fp32, log2 domain), P = bf16(exp2(z - m)) unnormalised
 * straight from the S registers, and O = O alpha + P V (V by ldmatrix.trans); the rescale is
 * skipped when no row's max moved (alpha == 1 exactly: the same bits either way). At the end
 * the block's warps merge once through shared memory in warp order (log-sum-exp weights),
 * and the block writes the output when it holds the whole row, else its partial (M, L, A);
 * the last block of the row to arrive (a per-row counter, m3_gpu.counters + M3_GPU_CNT_SD)
 * merges the row's partials in chunk order: out = bf16(sum_c w_c A_c / sum_c w_c L_c),
 * w_c = exp2(M_c - max M). Every sum has a fixed order: reruns are bit-identical. */
/* ---- thread-block clusters (sm_90; pc_k and sdec_k's T = 1 launch, session 8) ------------
 * barrier.cluster halves (every thread of every CTA of the cluster runs each, in the same
 * order: a relaxed arrive at the start, its wait before the first remote store, then
 * release / acquire pairs) and stores into another CTA's shared memory (mapa + st.shared::
 * cluster). */
#define PC_MAX_CS 16 /* CTAs per cluster (above 8: the non-portable sizes) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && M3_HAVE_MMA
#define M3_HAVE_CLUSTER 1
/* cluster barrier halves (every thread of every CTA runs each, in the same order) and
 * stores into another CTA's shared memory */
static __device__ __forceinline__ void pc_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void pc_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void pc_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
/* the address of this CTA's shared variable p in CTA `rank`'s shared memory */
static __device__ __forceinline__ uint32_t pc_mapa(const void *p, int rank) {
    uint32_t a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(a) : "r"(sh_u32(p)), "r"(rank));
    return a;
}
static __device__ __forceinline__ void pc_st(uint32_t a, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(a), "f"(v) : "memory");
}
static __device__ __forceinline__ void pc_st2(uint32_t a, float x, float y) {
    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(x), "f"(y) : "memory");
}
/* bulk copies (the tensor memory accelerator: one instruction per contiguous run, no per-thread
 * 16-byte requests) completing on an mbarrier: init (one arrival), the arrival that announces
 * the bytes, the copy, the wait for phase `par` */
static __device__ __forceinline__ void pc_bar_init(uint64_t *b) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(sh_u32(b)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}
static __device__ __forceinline__ void pc_bar_expect(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sh_u32(b)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void pc_bulk(void *dst, const void *src, uint32_t bytes, uint64_t *b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(sh_u32(dst)), "l"(src), "r"(bytes), "r"(sh_u32(b)) : "memory");
}
/* stores into another CTA's shared memory that complete on that CTA's mbarrier (mb: its
 * address there, from pc_mapa; the target waits for the bytes instead of a cluster barrier) */
static __device__ __forceinline__ void pc_sta(uint32_t a, float v, uint32_t mb) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n"
                 ::"r"(a), "r"(__float_as_uint(v)), "r"(mb) : "memory");
}
static __device__ __forceinline__ void pc_sta2(uint32_t a, float x, float y, uint32_t mb) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n"
                 ::"r"(a), "f"(x), "f"(y), "r"(mb) : "memory");
}
static __device__ __forceinline__ void pc_bar_wait_cl(uint64_t *b, int par) {
    asm volatile("{\n.reg .pred p;\nPC_WAITC:\n"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra PC_WAITC;\n}\n" ::"r"(sh_u32(b)), "r"(par) : "memory");
}
static __device__ __forceinline__ void pc_bar_wait(uint64_t *b, int par) {
    asm volatile("{\n.reg .pred p;\nPC_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra PC_WAIT;\n}\n" ::"r"(sh_u32(b)), "r"(par) : "memory");
}
#else
#define M3_HAVE_CLUSTER 0
#endif

#if defined(M3_HIP_NVIDIA)
/* Whether a cluster launch of fn with cfg (grid, block, shared memory, cluster attribute) can
 * run here. Once per (device, kernel): the attributes (non-portable cluster sizes above 8,
 * the shared-memory limit raised to the device's opt-in maximum: the attribute is the
 * kernel's, whatever the cluster size); once per (device, kernel, cluster size) and
 * shared-memory size (ok: the largest size found runnable, no: the smallest refused): at
 * least one resident cluster. A refusal is not an error: the caller takes its other kernel. */
static bool cl_ready(const m3_gpu *g, const void *fn, const cudaLaunchConfig_t *cfg, int &attr,
                     size_t &ok, size_t &no) {
    const size_t sh = cfg->dynamicSmemBytes;
    if (sh <= ok) return true;
    if ((no && sh >= no) || attr < 0) return false;
    int cl = 0, mx = 0, nc = 0;
    bool good = true;
    if (attr == 0) { /* the dynamic limit: the opt-in maximum less the kernel's static shared memory */
        cudaFuncAttributes fa;
        good = cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, g->device) == cudaSuccess && cl &&
               cudaDeviceGetAttribute(&mx, cudaDevAttrMaxSharedMemoryPerBlockOptin, g->device) == cudaSuccess &&
               cudaFuncGetAttributes(&fa, fn) == cudaSuccess && (mx -= (int)fa.sharedSizeBytes) > 0 &&
               cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess &&
               cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, mx) == cudaSuccess;
        attr = good ? mx : -1;
    }
    good = good && sh <= (size_t)attr && cudaOccupancyMaxActiveClusters(&nc, fn, cfg) == cudaSuccess && nc > 0;
    if (!good) {
        (void)cudaGetLastError(); /* a refused attribute or query is not this call's error */
        no = sh;
        return false;
    }
    ok = sh;
    return true;
}
#endif

#define SD_KT 16
#define SD_MAX_ROWS 65536 /* (token, kv head) rows per launch: the counter range */
#define SD_MAX_CH 64      /* chunks per row */
#define SD_FEW_TPW 2      /* tiles a warp per chunk when rows < SMs (T = 1: 1, 2, 4 measured
                           * 0.0166 / 0.0168 / 0.0193 ms; 2: half the partials of 1) */
static_assert(SD_MAX_ROWS <= M3_GPU_N_COUNTERS - M3_GPU_CNT_SD, "the counter range of m3_gpu");

#if defined(M3_HIP_NVIDIA)
/* threadFenceReduction's arrival, shared by the fused merges (sdec_k, pf_part_k, pd_part_k):
 * every block of a row writes its partial, then counts itself at *cnt; true (in every thread)
 * in the block that arrives n-th, which resets the counter for the next launch and may then
 * read the other blocks' partials (the fences order them). Call from all threads. */
static __device__ __forceinline__ bool attn_last_block(unsigned int *cnt, unsigned int n) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(cnt, 1u) == n - 1;
        if (last) *cnt = 0;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    return true;
}

template <bool LOG2>
static __device__ void cl_merge(m3_bf16 *orow, const float *ro, int epo, const float *rl,
                                const float *rm, int ls, int nch, int spc, bool part, int e0,
                                int ne, int Dh, float4 *mwl, int tid, int nt);

/* bytes of one warp's stage: K and V of SD_KT keys, pitch Dh + 8 bf16 */
static __host__ __device__ inline size_t sd_stage_bytes(int Dh) {
    return (size_t)2 * SD_KT * (Dh + 8) * sizeof(m3_bf16);
}

template <int W, int S, bool CL>
static __global__ void __launch_bounds__(W * 32)
    sdec_k(m3_bf16 *M3_RESTRICT out, float *M3_RESTRICT po, float *M3_RESTRICT pml,
           unsigned int *M3_RESTRICT cnt, const m3_bf16 *M3_RESTRICT q, int ld_q,
           const m3_bf16 *M3_RESTRICT k, const m3_bf16 *M3_RESTRICT v,
           const int32_t *M3_RESTRICT pos, const int32_t *M3_RESTRICT topk, int T, int t0,
           int width, int block, int H, int Hkv, int Dh, float scale, bool eager, int tpb) {
    static_assert(2 * SD_MAX_CH * 16 * sizeof(float) <= W * S * 2 * SD_KT * 24 * sizeof(m3_bf16),
                  "the merge weights fit the stages at the smallest Dh (16)");
#if M3_HAVE_MMA
    extern __shared__ __align__(16) unsigned char sd_raw[];
    __shared__ int rb[ATTN_MAX_RANGES], rpre[3 * 32 + 1];
    __shared__ float wm[W][16], wl[W][16], mden[16];
    const float L2E = 1.4426950408889634f;
#if M3_HAVE_CLUSTER
    if (CL) pc_arrive_relaxed(); /* (a): this CTA runs */
#endif
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, gq = lane / 4, tq = lane % 4;
    const int c = (int)blockIdx.x, g = (int)blockIdx.y, t = t0 + (int)blockIdx.z;
    const int nch = (int)gridDim.x, hq = H / Hkv, nr = width + 1, tpr = block / SD_KT;
    const int KP = Dh + 8, nks = Dh / 16, dv8 = Dh / 8;
    const int p = pos[t], bp = p / block, nko = p - bp * block + 1; /* own block's keys */
    const size_t rl = (size_t)blockIdx.z * Hkv + g;                  /* row in this launch */
    /* the selection row, all loads at once (rb, then each range's block id) */
    if (tid < width) rb[tid] = topk[((size_t)g * T + t) * width + tid];
    /* Q A fragments (rows = the group's heads, zero past hq), loaded while the ranges settle */
    uint32_t qa[FA_MAX_DH / 16][4];
    const m3_bf16 *qg = q + (size_t)t * ld_q + (size_t)(g * hq) * Dh;
#pragma unroll
    for (int s2 = 0; s2 < FA_MAX_DH / 16; s2++) {
        if (s2 >= nks) break;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = gq + (i & 1) * 8, col = s2 * 16 + 2 * tq + (i >> 1) * 8;
            qa[s2][i] = r < hq ? *reinterpret_cast<const uint32_t *>(qg + (size_t)r * Dh + col) : 0u;
        }
    }
    __syncthreads();
    /* ranges: tile counts (0: skipped) and their prefix sums rpre, one warp (nr <= 96: three
     * ranges a lane) */
    if (warp == 0) {
        int n3[3], sum = 0;
#pragma unroll
        for (int u = 0; u < 3; u++) {
            const int j = lane * 3 + u;
            int n = 0;
            if (j < width) {
                const int b = rb[j];
                bool ok = b >= 0 && b < bp;
                for (int i = 0; i < j && ok; i++)
                    if (rb[i] == b) ok = false;
                n = ok ? tpr : 0;
            } else if (j == width) {
                n = (nko + SD_KT - 1) / SD_KT;
            }
            n3[u] = n, sum += n;
        }
        int inc = sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += y;
        }
        int ex = inc - sum;
        if (lane == 0) rpre[0] = 0;
#pragma unroll
        for (int u = 0; u < 3; u++) ex += n3[u], rpre[lane * 3 + u + 1] = ex;
    }
    if (tid == width) rb[width] = bp; /* the own block */
    __syncthreads();
    const int ntot = rpre[nr], i0 = c * tpb, i1 = min(i0 + tpb, ntot);
    const int nw = i0 + warp < i1 ? (i1 - i0 - warp + W - 1) / W : 0; /* this warp's tiles */
    m3_bf16 *st0 = reinterpret_cast<m3_bf16 *>(sd_raw + (size_t)warp * S * sd_stage_bytes(Dh));
    const int sel = (int)(sd_stage_bytes(Dh) / sizeof(m3_bf16)); /* elements per stage */
    /* tile i of the row -> key0, valid keys; jp walks forward (tiles come in order) */
    auto tile_at = [&](int i, int &jp, int &key0, int &nk) {
        while (rpre[jp + 1] <= i) jp++;
        const int u = i - rpre[jp];
        key0 = rb[jp] * block + u * SD_KT;
        nk = min(SD_KT, (jp < width ? block : nko) - u * SD_KT);
    };
    int jl = 0, jc = 0;
    auto load = [&](int n) { /* the warp's n-th tile into stage n % S */
        int key0, nk;
        tile_at(i0 + warp + n * W, jl, key0, nk);
        m3_bf16 *ks = st0 + (n % S) * sel, *vs = ks + SD_KT * KP;
        for (int e = lane; e < SD_KT * dv8; e += 32) {
            const int r = e / dv8, cc = e % dv8;
            const bool in = r < nk;
            const size_t src = ((size_t)(key0 + r) * Hkv + g) * Dh + (size_t)cc * 8;
            cp16(ks + r * KP + cc * 8, in ? k + src : k, in);
            cp16(vs + r * KP + cc * 8, in ? v + src : v, in);
        }
    };
#pragma unroll
    for (int n = 0; n < S - 1; n++) {
        if (n < nw) load(n);
        cp_commit();
    }
    float o[FA_MAX_DH / 8][4];
#pragma unroll
    for (int i = 0; i < FA_MAX_DH / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    const int l7 = lane & 7, b3 = (lane >> 3) & 1, b4 = lane >> 4;
    const int koff = (l7 + b4 * 8) * KP + b3 * 8, voff = (l7 + b3 * 8) * KP + b4 * 8;
    const float zs = eager ? L2E : scale * L2E;
    for (int n = 0; n < nw; n++) {
        __syncwarp(); /* every lane is done with the stage refilled next */
        if (n + S - 1 < nw) load(n + S - 1);
        cp_commit();
        cp_wait<S - 1>();
        __syncwarp(); /* the warp's copies of tile n are visible to all its lanes */
        int key0, nk;
        tile_at(i0 + warp + n * W, jc, key0, nk);
        (void)key0;
        const m3_bf16 *ks = st0 + (n % S) * sel, *vs = ks + SD_KT * KP;
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int ksi = 0; ksi < FA_MAX_DH / 16; ksi++) {
            if (ksi >= nks) break;
            uint32_t kb[4];
            ldsm4(kb, ks + koff + ksi * 16);
            m3_mma_bf16_16816(s[0], qa[ksi], kb);
            m3_mma_bf16_16816(s[1], qa[ksi], kb + 2);
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int ni = 0; ni < 2; ni++) {
            if (eager) {
#pragma unroll
                for (int i = 0; i < 4; i += 2) {
                    round_bf16x2(s[ni][i], s[ni][i + 1]);
                    s[ni][i] *= scale, s[ni][i + 1] *= scale;
                    round_bf16x2(s[ni][i], s[ni][i + 1]);
                }
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float z = s[ni][i] * zs;
                if (ni * 8 + 2 * tq + (i & 1) >= nk) z = -INFINITY;
                s[ni][i] = z;
                mx[i >> 1] = fmaxf(mx[i >> 1], z);
            }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], M3_SHFL_XOR(mx[r], 1));
            mx[r] = fmaxf(mx[r], M3_SHFL_XOR(mx[r], 2));
            const float mn = fmaxf(mrow[r], mx[r]); /* finite: a tile's first key is valid */
            alpha[r] = exp2f(mrow[r] - mn);
            mrow[r] = mn;
            lrow[r] *= alpha[r];
        }
        uint32_t pa[4];
#pragma unroll
        for (int ni = 0; ni < 2; ni++) {
            const float e0 = exp2f(s[ni][0] - mrow[0]), e1 = exp2f(s[ni][1] - mrow[0]);
            const float e2 = exp2f(s[ni][2] - mrow[1]), e3 = exp2f(s[ni][3] - mrow[1]);
            lrow[0] += e0 + e1;
            lrow[1] += e2 + e3;
            pa[ni * 2] = pack_bf16(e0, e1);
            pa[ni * 2 + 1] = pack_bf16(e2, e3);
        }
        if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
            for (int ni = 0; ni < FA_MAX_DH / 8; ni++) {
                o[ni][0] *= alpha[0], o[ni][1] *= alpha[0];
                o[ni][2] *= alpha[1], o[ni][3] *= alpha[1];
            }
        }
#pragma unroll
        for (int np = 0; np < FA_MAX_DH / 16; np++) {
            if (np >= nks) break;
            uint32_t vb[4];
            ldsm4t(vb, vs + voff + np * 16);
            m3_mma_bf16_16816(o[2 * np], pa, vb);
            m3_mma_bf16_16816(o[2 * np + 1], pa, vb + 2);
        }
    }
    cp_wait<0>();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lrow[r] += M3_SHFL_XOR(lrow[r], 1);
        lrow[r] += M3_SHFL_XOR(lrow[r], 2);
    }
    if (tq == 0) wm[warp][gq] = mrow[0], wm[warp][gq + 8] = mrow[1], wl[warp][gq] = lrow[0],
                 wl[warp][gq + 8] = lrow[1];
    __syncthreads();
    /* the block's warps: O_w exp2(m_w - M) into the warp's own stages (fp32 [16][Dh + 8]) */
    float *ow = reinterpret_cast<float *>(st0);
    const int OP = Dh + 8;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = gq + r * 8;
        float M = -INFINITY;
        for (int w = 0; w < W; w++) M = fmaxf(M, wm[w][row]);
        const float f = mrow[r] == -INFINITY ? 0.0f : exp2f(mrow[r] - M);
#pragma unroll
        for (int ni = 0; ni < FA_MAX_DH / 8; ni++) {
            if (ni >= 2 * nks) break;
            *reinterpret_cast<float2 *>(ow + row * OP + ni * 8 + 2 * tq) =
                make_float2(o[ni][2 * r] * f, o[ni][2 * r + 1] * f);
        }
    }
    __syncthreads();
    const size_t wsz = (size_t)S * sd_stage_bytes(Dh) / sizeof(float); /* floats per warp */
    const float *ob = reinterpret_cast<const float *>(sd_raw);
    const size_t part = rl * nch + c;
#if M3_HAVE_CLUSTER
    if (CL && nch > 1) { /* the row's nch blocks are one cluster: the merge through distributed shared
               * memory (no partials, counter or second read chain). Block c pushes its A
               * (owner o: elements [o epo, (o + 1) epo) of hq x Dh) and per head (M, L) to
               * the owners, a cluster barrier, each owner merges its elements (cl_merge, in
               * the log2 domain, chunks without keys weighted 0). */
        const int E = hq * Dh, epo = ((E + nch - 1) / nch + 3) / 4 * 4;
        float *ro = reinterpret_cast<float *>(sd_raw + (size_t)W * S * sd_stage_bytes(Dh));
        float *rlv = ro + (size_t)nch * epo, *rmv = rlv + nch * 16;
        __shared__ float hm[16], hl[16];
        if (tid < hq) {
            float M = -INFINITY, L = 0.0f;
            for (int w = 0; w < W; w++) M = fmaxf(M, wm[w][tid]);
            for (int w = 0; w < W; w++) L += (wm[w][tid] == -INFINITY ? 0.0f : exp2f(wm[w][tid] - M)) * wl[w][tid];
            hm[tid] = M, hl[tid] = L;
        }
        pc_wait(); /* (a) */
        for (int e = 4 * tid; e < E; e += 4 * W * 32) { /* 4 elements a thread (Dh % 16 == 0) */
            const int h = e / Dh, d = e % Dh, ow = e / epo;
            float4 A = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int w = 0; w < W; w++) {
                const float4 b = *reinterpret_cast<const float4 *>(ob + w * wsz + h * OP + d);
                A.x += b.x, A.y += b.y, A.z += b.z, A.w += b.w;
            }
            const uint32_t a = pc_mapa(ro + (size_t)c * epo + (e - ow * epo), ow);
            pc_st2(a, A.x, A.y), pc_st2(a + 8, A.z, A.w);
        }
        __syncthreads(); /* hm, hl */
        for (int i = tid; i < nch * hq; i += W * 32) {
            const int ow = i / hq, h = i % hq;
            pc_st(pc_mapa(rlv + c * 16 + h, ow), hl[h]);
            pc_st(pc_mapa(rmv + c * 16 + h, ow), hm[h]);
        }
        pc_arrive();
        pc_wait();
        const int e0 = c * epo, ne = max(0, min(E, e0 + epo) - e0); /* the stages are free */
        cl_merge<true>(out + (size_t)t * H * Dh + (size_t)(g * hq) * Dh + e0, ro, epo, rlv, rmv, 16, nch,
                       1, false, e0, ne, Dh, reinterpret_cast<float4 *>(sd_raw), tid, W * 32);
        return;
    }
#endif
    for (int e = tid; e < hq * Dh; e += W * 32) {
        const int h = e / Dh, d = e % Dh;
        float M = -INFINITY;
        for (int w = 0; w < W; w++) M = fmaxf(M, wm[w][h]);
        float L = 0.0f, A = 0.0f;
        for (int w = 0; w < W; w++) {
            const float f = wm[w][h] == -INFINITY ? 0.0f : exp2f(wm[w][h] - M);
            L += f * wl[w][h];
            A += ob[w * wsz + h * OP + d];
        }
        if (nch == 1) {
            out[(size_t)t * H * Dh + (size_t)(g * hq + h) * Dh + d] = m3_f32_to_bf16(A / L);
        } else {
            po[(part * hq + h) * Dh + d] = A;
            if (d == 0) pml[(part * hq + h) * 2] = M, pml[(part * hq + h) * 2 + 1] = L;
        }
    }
    if (nch == 1) return;
    if (!attn_last_block(&cnt[rl], (unsigned)nch)) return; /* the last block of the row merges */
    const size_t p0 = rl * nch;
    float(*mw)[16] = reinterpret_cast<float(*)[16]>(sd_raw); /* [SD_MAX_CH][16]: stages are dead */
    float(*ml)[16] = mw + SD_MAX_CH;
    for (int e = tid; e < nch * hq; e += W * 32) { /* partials are read through L2 (__ldcg) */
        const int cc = e / hq, h = e % hq;
        const float2 a = __ldcg(reinterpret_cast<const float2 *>(pml + ((p0 + cc) * hq + h) * 2));
        mw[cc][h] = a.x, ml[cc][h] = a.y;
    }
    __syncthreads();
    if (tid < hq) { /* weights w_c (0: an empty chunk) and the denominator, in chunk order */
        float M = -INFINITY;
        for (int cc = 0; cc < nch; cc++)
            if (ml[cc][tid] > 0.0f) M = fmaxf(M, mw[cc][tid]);
        float den = 0.0f;
        for (int cc = 0; cc < nch; cc++) {
            const float L = ml[cc][tid], w = L > 0.0f ? exp2f(mw[cc][tid] - M) : 0.0f;
            mw[cc][tid] = w;
            den += w * L;
        }
        mden[tid] = den;
    }
    __syncthreads();
    /* 4 dims of two (head, dims) items a thread, 8 partials each in flight (every block of
     * the row wrote its partial, an empty one zeros with w = 0) */
    const int dq4 = Dh / 4, ne = hq * dq4, nth = W * 32;
    for (int e0 = tid; e0 < ne; e0 += 2 * nth) {
        const int e1 = e0 + nth < ne ? e0 + nth : e0; /* a repeat of e0 when out of range */
        const int h0 = e0 / dq4, d0 = (e0 % dq4) * 4, h1 = e1 / dq4, d1 = (e1 % dq4) * 4;
        float4 n0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), n1 = n0;
        for (int c0 = 0; c0 < nch; c0 += 8) {
            float4 a[8], b[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const size_t sl = (p0 + (c0 + u < nch ? c0 + u : c0)) * hq;
                a[u] = __ldcg(reinterpret_cast<const float4 *>(po + (sl + h0) * Dh + d0));
                b[u] = __ldcg(reinterpret_cast<const float4 *>(po + (sl + h1) * Dh + d1));
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const float w0 = c0 + u < nch ? mw[c0 + u][h0] : 0.0f,
                            w1 = c0 + u < nch ? mw[c0 + u][h1] : 0.0f;
                n0.x += w0 * a[u].x, n0.y += w0 * a[u].y, n0.z += w0 * a[u].z, n0.w += w0 * a[u].w;
                n1.x += w1 * b[u].x, n1.y += w1 * b[u].y, n1.z += w1 * b[u].z, n1.w += w1 * b[u].w;
            }
        }
        const float den0 = mden[h0], den1 = mden[h1];
        *reinterpret_cast<uint2 *>(out + (size_t)t * H * Dh + (size_t)(g * hq + h0) * Dh + d0) =
            make_uint2(pack_bf16(n0.x / den0, n0.y / den0), pack_bf16(n0.z / den0, n0.w / den0));
        if (e1 != e0)
            *reinterpret_cast<uint2 *>(out + (size_t)t * H * Dh + (size_t)(g * hq + h1) * Dh + d1) =
                make_uint2(pack_bf16(n1.x / den1, n1.y / den1), pack_bf16(n1.z / den1, n1.w / den1));
    }
#else
    (void)out; (void)po; (void)pml; (void)cnt; (void)q; (void)ld_q; (void)k; (void)v; (void)pos;
    (void)topk; (void)T; (void)t0; (void)width; (void)block; (void)H; (void)Hkv; (void)Dh;
    (void)scale; (void)eager; (void)tpb;
#endif
}

typedef void (*sd_fn)(m3_bf16 *, float *, float *, unsigned int *, const m3_bf16 *, int,
                      const m3_bf16 *, const m3_bf16 *, const int32_t *, const int32_t *, int, int,
                      int, int, int, int, int, float, bool, int);

/* launcher of sdec_k<W, S>: chunks per row so that the grid fills the SMs' resident blocks,
 * at least 2 tiles per warp per chunk; token batches of <= SD_MAX_ROWS rows */
template <int W, int S>
static m3_status sdec_launch(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                             const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                             int n_tok, const int32_t *d_topk, int width, int block,
                             const m3_attn_params *ap, const m3_profile *p, int tpw) {
    const int H = ap->n_head, Hkv = ap->n_kv_head, Dh = ap->head_dim, hq = H / Hkv;
    const sd_fn fn = sdec_k<W, S, false>;
    const size_t sh = (size_t)W * S * sd_stage_bytes(Dh);
    static size_t set_dev[64]; /* per device: the attribute is the device's */
    if (sh > set_dev[g->device & 63]) {
        M3_TRY(smem_limit((const void *)fn, sh, "hipFuncSetAttribute(sdec_k)"));
        set_dev[g->device & 63] = sh;
    }
    const int ntile = (width + 1) * (block / SD_KT); /* tiles of a row, at most */
    int bps = (int)((size_t)228 * 1024 / (sh + 7 * 1024)); /* + static shared, reserved */
    if (bps > 2048 / (W * 32)) bps = 2048 / (W * 32);
    if (bps < 1) bps = 1;
    const int tb = n_tok < SD_MAX_ROWS / Hkv ? n_tok : SD_MAX_ROWS / Hkv;
    const int64_t rows = (int64_t)tb * Hkv, want = (int64_t)bps * (g->n_sm > 0 ? g->n_sm : 132);
    int nch = (int)(want / rows);
    const int maxch = (ntile + tpw * W - 1) / (tpw * W);
    if (nch > maxch) nch = maxch;
    if (nch > SD_MAX_CH) nch = SD_MAX_CH;
    if (nch < 1) nch = 1;
    const int tpb = (ntile + nch - 1) / nch;
    nch = (ntile + tpb - 1) / tpb;
    const size_t mark = m3_gpu_mark(g);
    float *po = NULL, *pml = NULL;
    m3_status s = M3_OK;
    if (nch > 1) {
        const size_t ns = (size_t)rows * nch * hq;
        s = m3_gpu_alloc(g, (void **)&po, ns * Dh * sizeof(float));
        if (s == M3_OK) s = m3_gpu_alloc(g, (void **)&pml, ns * 2 * sizeof(float));
    }
    for (int t0 = 0; s == M3_OK && t0 < n_tok; t0 += tb) {
        const int nt = n_tok - t0 < tb ? n_tok - t0 : tb;
        fn<<<dim3((unsigned)nch, (unsigned)Hkv, (unsigned)nt), W * 32, sh, g->stream>>>(
            d_out, po, pml, g->counters + M3_GPU_CNT_SD, d_q, ld_q, d_k, d_v, d_pos, d_topk, n_tok,
            t0, width, block, H, Hkv, Dh, ap->scale, p->attn_scores == M3_SCORES_BF16_EAGER, tpb);
        s = m3_gpu_launched_(g, "sdec_k", __FILE__, __LINE__);
    }
    m3_gpu_release(g, mark); /* later work on the stream runs after these kernels */
    return s;
}

/* sdec_k<W, S, true> for few rows (T = 1 decode): a cluster of nch <= PC_MAX_CS blocks per
 * row, the row's tiles cut into nch chunks (each block's warps at least one tile), merged
 * through distributed shared memory; *done false when the grid does not fit this path */
template <int W, int S>
static m3_status sdec_launch_cl(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                                int n_tok, const int32_t *d_topk, int width, int block,
                                const m3_attn_params *ap, const m3_profile *p, bool *done) {
    *done = false;
    const int H = ap->n_head, Hkv = ap->n_kv_head, Dh = ap->head_dim, hq = H / Hkv;
    const int ntile = (width + 1) * (block / SD_KT);
    int nch = (ntile + W - 1) / W;
    if (nch > PC_MAX_CS) nch = PC_MAX_CS;
    const int tpb = (ntile + nch - 1) / nch;
    nch = (ntile + tpb - 1) / tpb;
    if (nch < 2 || n_tok > 65535 || (int64_t)n_tok * Hkv * nch > (g->n_sm > 0 ? g->n_sm : 132))
        return M3_OK;
    const int epo = ((hq * Dh + nch - 1) / nch + 3) / 4 * 4;
    const size_t sh = (size_t)W * S * sd_stage_bytes(Dh) + (size_t)nch * epo * 4 + (size_t)2 * nch * 16 * 4;
    const sd_fn fn = sdec_k<W, S, true>;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)nch, (unsigned)Hkv, (unsigned)n_tok);
    cfg.blockDim = dim3(W * 32);
    cfg.dynamicSmemBytes = sh;
    cfg.stream = g->stream;
    cudaLaunchAttribute at[1] = {};
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)nch, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    static int attr[64];
    static size_t ok[64][PC_MAX_CS + 1], no[64][PC_MAX_CS + 1];
    if (!cl_ready(g, (const void *)fn, &cfg, attr[g->device & 63], ok[g->device & 63][nch],
                  no[g->device & 63][nch]))
        return M3_OK;
    M3_HIP_TRY(cudaLaunchKernelEx(&cfg, fn, d_out, (float *)NULL, (float *)NULL, (unsigned int *)NULL,
                                  d_q, ld_q, d_k, d_v, d_pos, d_topk, n_tok, 0, width, block, H, Hkv,
                                  Dh, ap->scale, p->attn_scores == M3_SCORES_BF16_EAGER, tpb));
    *done = true;
    return m3_gpu_launched_(g, "sdec_k", __FILE__, __LINE__);
}
#endif

#if defined(M3_HIP_NVIDIA)
static m3_status pc_sparse_launch(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                  const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                                  int n_tok, const int32_t *d_topk, int width, int block,
                                  const m3_attn_params *ap, const m3_profile *p, bool *done);
#endif

extern "C" m3_status m3_gpu_attn_sparse_flash(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q,
                                              int ld_q, const m3_bf16 *d_k, const m3_bf16 *d_v,
                                              const int32_t *d_pos, int n_tok, int n_ctx,
                                              const int32_t *d_topk, int width, int block,
                                              const m3_attn_params *ap, const m3_profile *p) {
    M3_TRY(flash_check(ap, p, ld_q, n_tok, n_ctx, d_q, d_k, d_v));
    M3_ASSERTF(width >= 0 && width < ATTN_MAX_RANGES, "width=%d", width);
    if (block <= 0 || block % 16 || block > 256)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu attn_sparse_flash: block %d (needs a multiple "
                         "of 16, <= 256)", block);
    if (n_tok == 0) return M3_OK;
#if defined(M3_HIP_NVIDIA)
    /* fewer rows than multiprocessors (decode of a few tokens): 8 warps a block, chunks of
     * SD_FEW_TPW tiles a warp; else 4 warps (three blocks per SM), 2 tiles a warp at least */
    if ((int64_t)n_tok * ap->n_kv_head < (g->n_sm > 0 ? g->n_sm : 132)) {
        /* a cluster per row when the grid fits the SMs once (T = 1): pc_k, else sdec_k's */
        bool done = false;
        M3_TRY(pc_sparse_launch(g, d_out, d_q, ld_q, d_k, d_v, d_pos, n_tok, d_topk, width, block,
                                ap, p, &done));
        if (done) return M3_OK;
        M3_TRY((sdec_launch_cl<8, 2>(g, d_out, d_q, ld_q, d_k, d_v, d_pos, n_tok, d_topk, width,
                                     block, ap, p, &done)));
        if (done) return M3_OK;
        return sdec_launch<8, 2>(g, d_out, d_q, ld_q, d_k, d_v, d_pos, n_tok, d_topk, width, block,
                                 ap, p, SD_FEW_TPW);
    }
    return sdec_launch<4, 2>(g, d_out, d_q, ld_q, d_k, d_v, d_pos, n_tok, d_topk, width, block, ap,
                             p, 2);
#else
    const int H = ap->n_head, Hkv = ap->n_kv_head, Dh = ap->head_dim, hq = H / Hkv, nr = width + 1;
    const size_t sh = fd_smem_bytes(hq, Dh, block);
    M3_TRY(smem_limit((const void *)sparse_part_k, sh, "hipFuncSetAttribute(sparse_part_k)"));
    const size_t mark = m3_gpu_mark(g);
    const size_t nslot = (size_t)n_tok * Hkv * nr * hq;
    float *po, *pml;
    m3_status s = m3_gpu_alloc(g, (void **)&po, nslot * Dh * sizeof(float));
    if (s == M3_OK) s = m3_gpu_alloc(g, (void **)&pml, nslot * 2 * sizeof(float));
    if (s != M3_OK) {
        m3_gpu_release(g, mark);
        return s;
    }
    sparse_part_k<<<dim3((unsigned)nr, (unsigned)Hkv, (unsigned)n_tok), FD_THREADS, sh, g->stream>>>(
        po, pml, d_q, ld_q, d_k, d_v, d_pos, d_topk, n_tok, width, block, H, Hkv, Dh, ap->scale,
        p->attn_scores == M3_SCORES_BF16_EAGER, p->attn_p_bf16);
    s = m3_gpu_launched_(g, "sparse_part_k", __FILE__, __LINE__);
    if (s == M3_OK) {
        sparse_merge_k<<<dim3((unsigned)n_tok, (unsigned)H), FD_THREADS, 0, g->stream>>>(
            d_out, po, pml, Hkv, hq, Dh, nr);
        s = m3_gpu_launched_(g, "sparse_merge_k", __FILE__, __LINE__);
    }
    m3_gpu_release(g, mark); /* later work on the stream runs after these kernels */
    return s;
#endif
}

extern "C" m3_status m3_gpu_attn_dense_flash(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q,
                                             int ld_q, const m3_bf16 *d_k, const m3_bf16 *d_v,
                                             const int32_t *d_pos, int n_tok, int n_ctx,
                                             const m3_attn_params *ap, const m3_profile *p) {
    M3_TRY(flash_check(ap, p, ld_q, n_tok, n_ctx, d_q, d_k, d_v));
    if (n_tok == 0) return M3_OK;
#if defined(M3_HIP_NVIDIA)
    M3_TRY(smem_limit((const void *)dense_flash_k, FA_SMEM, "hipFuncSetAttribute(dense_flash_k)"));
    dense_flash_k<<<dim3((unsigned)((n_tok + FA_TOK - 1) / FA_TOK), (unsigned)ap->n_kv_head),
                    FA_TOK * 32, FA_SMEM, g->stream>>>(d_out, d_q, ld_q, d_k, d_v, d_pos, n_tok, n_ctx,
                                                       ap->n_head, ap->n_kv_head, ap->head_dim,
                                                       ap->scale,
                                                       p->attn_scores == M3_SCORES_BF16_EAGER);
    M3_LAUNCHED(g, "dense_flash_k");
    return M3_OK;
#else
    /* no tensor-core kernel for this vendor yet: the portable faithful kernel */
    return m3_gpu_attn_dense(g, d_out, d_q, ld_q, d_k, d_v, d_pos, n_tok, n_ctx, ap, p);
#endif
}

/* ==== paged attention: m3_gpu_attn_paged, twin of ref's m3_attn_paged ======================
 * K/V are read through one layer's paged cache (gpu/kv_paged.h: ref's addressing of the
 * page-Bs SHUFFLE view and the page-P re-view, padding included) and a device block table.
 * attn_paged_k: one block per (token, query head), PG_THREADS threads, the faithful
 *   formulation of ref's attn_row with its accumulation order everywhere it matters:
 *   - key list (thread 0): dense keys 0..p, key k at slot(k); sparse: ref's
 *     m3_kv_sparse_table (valid ids b <= p/Bs, full blocks in selection order or sorted by
 *     id under position order, the own block last when selected, duplicates kept, ctx
 *     truncation), key k at bt[blist[k / Bs]] * Bs + k % Bs (= m3_kv_table_slot);
 *   - scores: one thread per key, m3_dot_f32's 8-lane order with unfused fp32 multiplies
 *     and adds (ref is built with -ffp-contract=off); fp8 elements are dequantized
 *     (fp32(byte) * scale) unless fp8_pa, which casts Q to fp8 (no scale) and folds the K
 *     scale into the score: z = (q8 . k8) * s * k_scale (§4.9);
 *   - per partition (attn_partition keys, or all keys): max, then the denominator summed by
 *     one thread in key order, then P.V with each thread owning dims and adding keys in
 *     order; fp8_pa: per tile of keys (the view's page) M = max v_scale, P' = fp8(P *
 *     v_scale * FP8_MAX / (M + 1e-8)), acc = sum P' v8, o += acc * (M / FP8_MAX);
 *     partitions stored rnd(o / l) and merged in partition order with w = l exp(m - M);
 *   - exp in double rounded to fp32 (ref calls glibc's expf, within 0.502 ulp of exact).
 *   Keys live in shared-memory chunks of ch keys (ch = attn_partition when partitioned, so a
 *   partition is scored once; otherwise 256, a multiple of the fp8 tile), rescored per pass
 *   only when one partition spans several chunks. */
#include "gpu/kv_paged.h"

#define PG_THREADS 128
#define PG_MAX_SEL 256 /* ref's m3_kv_sparse_table bound on the top-k width */
#define PG_CHUNK 256

typedef struct {
    int n_head, n_kv_head, head_dim;
    int part; /* attn_partition; 0: one partition of all keys */
    int ch;   /* keys per shared-memory chunk */
    int tile; /* fp8 P.V rescale tile (keys) */
    float scale, fmax;
    bool eager, p_bf16, out_bf16, sel_order, pa, fp8;
} pg_cfg;

static __device__ __forceinline__ float pg_exp(float x) { return (float)exp((double)x); }

/* slot of the i-th key in accumulation order */
static __device__ __forceinline__ int64_t pg_slot(const m3_gpu_attn_paged_src &s, const int *blist,
                                                  bool sparse, int i) {
    const int Bs = s.g.block;
    if (!sparse) return m3_dkv_slot(s.bt, Bs, i);
    return (int64_t)s.bt[blist[i / Bs]] * Bs + i % Bs;
}

/* Scores z, slots sl and V scales vsc of keys a..b-1 (chunk-relative), then a barrier. */
static __device__ void pg_load(const m3_gpu_attn_paged_src &s, const pg_cfg &c, const int *blist,
                               bool sparse, int gq, const float *q_sh, int64_t *sl, float *z,
                               float *vsc, int a, int b) {
    __syncthreads(); /* earlier readers of the chunk arrays are done */
    const int Dh = c.head_dim;
    for (int i = a + (int)threadIdx.x; i < b; i += (int)blockDim.x) {
        const int64_t slot = pg_slot(s, blist, sparse, i);
        float ks = 1.0f, vs = 1.0f;
        if (c.fp8) {
            const int64_t so = m3_dkv_off_scale(s.g, s.view, slot, gq);
            ks = s.k_scale[so];
            vs = s.v_scale[so];
        }
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int e = 0; e < Dh; e++) { /* m3_dot_f32: lane e & 7, tail included */
            float kv = m3_dkv_get(s.k, s.g, m3_dkv_off_k(s.g, s.view, slot, gq, e));
            if (c.fp8 && !c.pa) kv = __fmul_rn(kv, ks);
            acc[e & 7] = __fadd_rn(acc[e & 7], __fmul_rn(q_sh[e], kv));
        }
        const float d = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
        float zz;
        if (c.pa) zz = __fmul_rn(__fmul_rn(d, c.scale), ks); /* §4.9 step 2 */
        else if (c.eager) zz = m3_round_bf16(__fmul_rn(m3_round_bf16(d), c.scale));
        else zz = __fmul_rn(d, c.scale);
        sl[i - a] = slot;
        z[i - a] = zz;
        vsc[i - a] = vs;
    }
    __syncthreads();
}

template <typename TS>
static __global__ void __launch_bounds__(PG_THREADS)
    attn_paged_k(TS *M3_RESTRICT out, const TS *M3_RESTRICT q, int ld_q, m3_gpu_attn_paged_src s,
                 const int32_t *M3_RESTRICT pos, int n_tok, const int32_t *M3_RESTRICT topk,
                 int width, pg_cfg c) {
    extern __shared__ int64_t pg_sh[];
    int64_t *sl = pg_sh;                  /* [ch] slots of the chunk's keys */
    float *z = (float *)(sl + c.ch);      /* [ch] scores */
    float *pb = z + c.ch;                 /* [ch] P (or P') */
    float *vsc = pb + c.ch;               /* [ch] V scales */
    float *mt = vsc + c.ch;               /* [ch] per-tile max V scale */
    float *q_sh = mt + c.ch;              /* [Dh] */
    float *o_p = q_sh + c.head_dim;       /* [Dh] partition accumulator */
    float *o_f = o_p + c.head_dim;        /* [Dh] merged output */
    __shared__ int blist[PG_MAX_SEL];
    __shared__ int n_sh;
    __shared__ float den_sh;
    __shared__ float red[M3_MAX_WARPS];

    const int t = (int)blockIdx.x / c.n_head, h = (int)blockIdx.x % c.n_head;
    const int gq = h / (c.n_head / c.n_kv_head);
    const int p = pos[t], Bs = s.g.block, Dh = c.head_dim;
    s.bt += (int64_t)t * s.bt_ld; /* a decode batch: the token's own sequence's table */
    const int tid = (int)threadIdx.x, nth = (int)blockDim.x;
    const bool sparse = topk != NULL;
    if (tid == 0) {
        int n;
        if (!sparse) {
            n = p + 1;
        } else { /* ref m3_kv_sparse_table */
            const int bp = p / Bs;
            const int32_t *sel = topk + ((int64_t)gq * n_tok + t) * width;
            int nf = 0;
            bool tail = false;
            for (int i = 0; i < width; i++) {
                const int b = sel[i];
                if (b < 0 || b > bp) continue; /* -1 padding and future blocks */
                if (b == bp) tail = true;
                else blist[nf++] = b;
            }
            if (!c.sel_order) /* position order: insertion sort of the ids */
                for (int a = 1; a < nf; a++)
                    for (int j = a; j > 0 && blist[j - 1] > blist[j]; j--) {
                        const int x = blist[j];
                        blist[j] = blist[j - 1], blist[j - 1] = x;
                    }
            if (tail) {
                blist[nf] = bp;
                n = nf * Bs + (p - Bs * bp + 1);
            } else {
                n = nf * Bs < p + 1 ? nf * Bs : p + 1;
            }
        }
        n_sh = n;
    }
    const TS *qr = q + (int64_t)t * ld_q + (int64_t)h * Dh;
    for (int d = tid; d < Dh; d += nth) {
        const float v = ld(qr, d);
        /* §4.9 step 1: the fp8 kernel casts Q to fp8 with no scale */
        q_sh[d] = c.pa ? m3_round_fp8(v, s.g.fp8_kind, s.ovf) : v;
        o_p[d] = 0.0f;
        o_f[d] = 0.0f;
    }
    __syncthreads();
    const int n = n_sh;
    TS *orow = out + ((int64_t)t * c.n_head + h) * Dh;
    if (n <= 0) { /* no key (ref asserts): a visible NaN row */
        for (int d = tid; d < Dh; d += nth) st(orow, d, NAN);
        return;
    }
    const int part = c.part > 0 ? c.part : n, n_part = (n + part - 1) / part;
    int ca = -1, cb = -1; /* the chunk in shared memory (uniform over the block) */
#define PG_ENSURE(a_, b_)                                                                          \
    do {                                                                                          \
        if ((a_) != ca || (b_) != cb) {                                                           \
            pg_load(s, c, blist, sparse, gq, q_sh, sl, z, vsc, (a_), (b_));                       \
            ca = (a_), cb = (b_);                                                                 \
        }                                                                                         \
    } while (0)

    /* the global max (the merge's M = max of the partition maxima) */
    float Mg = -INFINITY;
    if (n_part > 1)
        for (int a = 0; a < n; a += c.ch) {
            const int b = min(a + c.ch, n);
            PG_ENSURE(a, b);
            float m = -INFINITY;
            for (int i = tid; i < b - a; i += nth) m = fmaxf(m, z[i]);
            Mg = fmaxf(Mg, m3_block_max(m, red));
        }
    float wsum = 0.0f;
    for (int pi = 0; pi < n_part; pi++) {
        const int i0 = pi * part, i1 = min(i0 + part, n);
        float m = -INFINITY;
        for (int a = i0; a < i1; a += c.ch) {
            const int b = min(a + c.ch, i1);
            PG_ENSURE(a, b);
            float lm = -INFINITY;
            for (int i = tid; i < b - a; i += nth) lm = fmaxf(lm, z[i]);
            m = fmaxf(m, m3_block_max(lm, red));
        }
        /* the denominator: exponentials in parallel, summed by one thread in key order */
        float den = 0.0f;
        for (int a = i0; a < i1; a += c.ch) {
            const int b = min(a + c.ch, i1);
            PG_ENSURE(a, b);
            for (int i = tid; i < b - a; i += nth) pb[i] = pg_exp(z[i] - m);
            __syncthreads();
            if (tid == 0)
                for (int i = 0; i < b - a; i++) den += pb[i];
            __syncthreads();
        }
        if (tid == 0) den_sh = den;
        __syncthreads();
        den = den_sh;
        /* P.V, keys in order for every dim a thread owns */
        for (int d = tid; d < Dh; d += nth) o_p[d] = 0.0f;
        for (int a = i0; a < i1; a += c.ch) {
            const int b = min(a + c.ch, i1), nk = b - a;
            PG_ENSURE(a, b);
            if (!c.pa) {
                for (int i = tid; i < nk; i += nth) {
                    const float e = pg_exp(z[i] - m);
                    /* partitioned: unnormalised P, normalised per partition below */
                    pb[i] = rnd(c.p_bf16, n_part > 1 ? e : __fdiv_rn(e, den));
                }
                __syncthreads();
                for (int d = tid; d < Dh; d += nth) {
                    float acc = o_p[d];
                    for (int i = 0; i < nk; i++) {
                        float vv = m3_dkv_get(s.v, s.g, m3_dkv_off_v(s.g, s.view, sl[i], gq, d));
                        if (c.fp8) vv = __fmul_rn(vv, vsc[i]); /* plain dequantization */
                        acc = __fadd_rn(acc, __fmul_rn(pb[i], vv));
                    }
                    o_p[d] = acc;
                }
                __syncthreads();
            } else {
                /* §4.9 step 4 per tile of keys (relative to the partition start: chunks
                 * start on tile boundaries, see the launcher) */
                const int nt = (nk + c.tile - 1) / c.tile;
                for (int j = tid; j < nt; j += nth) {
                    float M = 0.0f;
                    for (int i = j * c.tile; i < min((j + 1) * c.tile, nk); i++)
                        if (vsc[i] > M) M = vsc[i];
                    mt[j] = M;
                }
                __syncthreads();
                for (int i = tid; i < nk; i += nth) {
                    const float e = pg_exp(z[i] - m), M = mt[i / c.tile];
                    const float x = __fdiv_rn(__fmul_rn(__fmul_rn(e, vsc[i]), c.fmax), __fadd_rn(M, 1e-8f));
                    pb[i] = m3_round_fp8(x, s.g.fp8_kind, s.ovf);
                }
                __syncthreads();
                for (int d = tid; d < Dh; d += nth) {
                    float o = o_p[d];
                    for (int j = 0; j < nt; j++) {
                        float acc = 0.0f;
                        for (int i = j * c.tile; i < min((j + 1) * c.tile, nk); i++) {
                            const float vv = m3_dkv_get(s.v, s.g, m3_dkv_off_v(s.g, s.view, sl[i], gq, d));
                            acc = __fadd_rn(acc, __fmul_rn(pb[i], vv));
                        }
                        o = __fadd_rn(o, __fmul_rn(acc, __fdiv_rn(mt[j], c.fmax)));
                    }
                    o_p[d] = o;
                }
                __syncthreads();
            }
        }
        if (n_part == 1) {
            for (int d = tid; d < Dh; d += nth)
                st(orow, d, rnd(c.out_bf16, c.pa ? __fdiv_rn(o_p[d], den) : o_p[d]));
            return;
        }
        /* partition output stored rnd(o / l), merged in partition order with fp32 weights */
        const float w = __fmul_rn(den, pg_exp(m - Mg));
        wsum = __fadd_rn(wsum, w);
        for (int d = tid; d < Dh; d += nth)
            o_f[d] = __fadd_rn(o_f[d], __fmul_rn(w, rnd(c.out_bf16, __fdiv_rn(o_p[d], den))));
    }
#undef PG_ENSURE
    for (int d = tid; d < Dh; d += nth) st(orow, d, rnd(c.out_bf16, __fdiv_rn(o_f[d], wsum)));
}

template <typename TS>
static m3_status launch_paged(m3_gpu *g, TS *d_out, const TS *d_q, int ld_q,
                              const m3_gpu_attn_paged_src *src, const int32_t *d_pos, int n_tok,
                              int n_ctx, const int32_t *d_topk, int width,
                              const m3_attn_params *ap, const m3_profile *p) {
    M3_ASSERT(g && src && ap && p && n_tok >= 0 && n_ctx > 0);
    M3_ASSERTF(ap->n_head % ap->n_kv_head == 0 && ld_q >= ap->n_head * ap->head_dim,
               "H=%d Hkv=%d Dh=%d ld_q=%d", ap->n_head, ap->n_kv_head, ap->head_dim, ld_q);
    M3_ASSERTF(src->g.head_dim == ap->head_dim && src->g.n_kv == ap->n_kv_head,
               "paged cache geometry Hkv=%d Dh=%d, attention Hkv=%d Dh=%d", src->g.n_kv,
               src->g.head_dim, ap->n_kv_head, ap->head_dim);
    M3_ASSERTF(p->attn_partition == 0 || p->attn_partition >= M3_ATTN_MIN_PART,
               "attn_partition %d < %d", p->attn_partition, M3_ATTN_MIN_PART);
    M3_ASSERT(!d_topk || width > 0);
    M3_ASSERTF(src->bt_ld == 0 || src->bt_ld >= src->n_logical, "bt_ld %d, n_logical %d",
               src->bt_ld, src->n_logical);
    if (ap->head_dim > ATTN_MAX_DH)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu paged attention: head_dim %d > %d", ap->head_dim,
                         ATTN_MAX_DH);
    if (d_topk && width > PG_MAX_SEL)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu paged attention: top-k width %d > %d", width,
                         PG_MAX_SEL);
    const bool fp8 = src->g.elem == M3_KV_FP8;
    if (fp8 && (!src->k_scale || !src->v_scale))
        return m3_errorf(M3_ERR_ARG, "gpu paged attention: fp8 cache without scales");
    M3_ASSERT(src->k && src->v && src->bt && d_pos && d_q && d_out);
    if (n_tok == 0) return M3_OK;
    pg_cfg c;
    c.n_head = ap->n_head, c.n_kv_head = ap->n_kv_head, c.head_dim = ap->head_dim;
    c.scale = ap->scale;
    c.eager = p->attn_scores == M3_SCORES_BF16_EAGER;
    c.p_bf16 = p->attn_p_bf16, c.out_bf16 = p->attn_out_bf16;
    c.sel_order = p->attn_order == M3_ATTN_ORDER_SELECTION;
    c.fp8 = fp8;
    c.pa = fp8 && src->fp8_pa;
    c.fmax = fp8 ? m3_fp8_max(src->g.fp8_kind) : 0.0f;
    c.tile = d_topk ? src->g.page : src->g.block; /* ref: the view's page */
    c.part = p->attn_partition;
    /* a partition is one chunk; unpartitioned chunks start on fp8 tile boundaries */
    c.ch = c.part > 0 ? c.part
           : c.pa     ? c.tile * ((PG_CHUNK + c.tile - 1) / c.tile)
                      : PG_CHUNK;
    const size_t shmem = (size_t)c.ch * (sizeof(int64_t) + 4 * sizeof(float)) +
                         3 * (size_t)c.head_dim * sizeof(float);
    if (shmem > 48 * 1024)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu paged attention: chunk of %d keys too large", c.ch);
    const int64_t rows = (int64_t)n_tok * ap->n_head;
    if (rows > 0x7FFFFFFF)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu paged attention: %lld rows", (long long)rows);
    attn_paged_k<TS><<<(unsigned)rows, PG_THREADS, shmem, g->stream>>>(
        d_out, d_q, ld_q, *src, d_pos, n_tok, d_topk, width, c);
    M3_LAUNCHED(g, "attn_paged_k");
    return M3_OK;
}

extern "C" m3_status m3_gpu_attn_paged(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                       const m3_gpu_attn_paged_src *src, const int32_t *d_pos,
                                       int n_tok, int n_ctx, const int32_t *d_topk, int width,
                                       const m3_attn_params *ap, const m3_profile *p) {
    if (!p->attn_out_bf16)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu attention: profile %s keeps fp32: use _f32", p->name);
    return launch_paged<m3_bf16>(g, d_out, d_q, ld_q, src, d_pos, n_tok, n_ctx, d_topk, width, ap, p);
}

extern "C" m3_status m3_gpu_attn_paged_f32(m3_gpu *g, float *d_out, const float *d_q, int ld_q,
                                           const m3_gpu_attn_paged_src *src,
                                           const int32_t *d_pos, int n_tok, int n_ctx,
                                           const int32_t *d_topk, int width,
                                           const m3_attn_params *ap, const m3_profile *p) {
    return launch_paged<float>(g, d_out, d_q, ld_q, src, d_pos, n_tok, n_ctx, d_topk, width, ap, p);
}

/* ==== fast paged attention: m3_gpu_attn_paged_flash =========================================
 * Flash-decoding over the paged cache (production path of the paged reads; the faithful
 * attn_paged_k above stays the device reference). Key list per (token t, kv head g) exactly
 * as attn_paged_k / ref's m3_kv_sparse_table builds it (dense: keys 0..p at slot(k); sparse:
 * full blocks in selection order, or ascending ids under position order, the own block last
 * when selected, duplicates kept, ctx truncation; ranked by all threads in parallel). The
 * list is cut into chunks of `ch` keys:
 * ch = attn_partition when the profile partitions (atom: a chunk IS one of ref's partitions,
 * so its max, denominator, fp8 P' and bf16-stored partition output are ref's), else 128
 * (sparse) / 256 (dense) keys.
 * pf_part_k: one block of 8 warps per (cpb consecutive chunks of one row, kv head g, token),
 *   serving the group's hq <= 16 query heads as the 16 rows of mma.sync m16n8k16 tiles; the
 *   launcher picks cpb for about PF_BPS blocks per SM (long rows: several chunks per block,
 *   one prologue and one pipeline; short grids: a chunk per block). Tiles of PF_TK keys
 *   stream through PF_NST shared-memory stages by cp.async, per chunk its K tiles, then its
 *   V tiles, across chunk boundaries (a chunk's key offsets are computed when the chunk
 *   before it starts, its fp8 scales copied by cp.async); a tile's copies are issued at the
 *   top of the iteration that frees its stage. Shared tiles keep the cache's own 16-byte
 *   units (SHUFFLE: K [dim/x][key][x], V [key/x][dim][x], x = 16 / element bytes), which
 *   are exactly mma B fragments (K: a key's consecutive dims; V: a dim's consecutive keys):
 *   the fast path copies page units verbatim (page-128 SHUFFLE of dense layers, page-16
 *   re-view of sparse ones, any geometry where x divides Dh and the view's page); other
 *   geometries (ref's padded tiny ones) gather element by element into the same layout.
 *   fp8: a lane reads 4 consecutive codes of a unit as one word (Q and P permuted alike in
 *   the k index); e4m3fn codes become fp16 by cvt.rn.f16x2.e4m3x2 (exact), other kinds by
 *   256-entry tables. Per chunk: S = Q K^T (fp32) -> scores in shared memory (fp8: K scale
 *   folded into the score; §4.9 emulation: Q cast to fp8 without scale, fp16 mma on exact
 *   codes); per head max m and denominator l (unrounded exponentials); P = bf16(exp(z - m)
 *   [* v_scale]) or, emulating §4.9, P' = fp8(exp(z - m) v_scale FP8_MAX / (M + 1e-8)) with
 *   M the max v_scale of the view-page tile: P'.V as exact fp16 products summed per 16 keys,
 *   times M / FP8_MAX (ref's tile structure) when the tile is a multiple of 16 keys, else
 *   bf16(P' M / FP8_MAX) on bf16 mma (one extra bf16 rounding of a factor, <= 2^-9
 *   relative); O = P V in fp32. Each chunk's (m, l, A) is folded into the block's running
 *   (M, L, A) in registers; a block holding its whole row writes bf16(A / L), else its
 *   partial.
 * pf_merge: per (token, head): out = bf16(sum_j e^(m_j - M) A_j / sum_j e^(m_j - M) l_j) with
 *   A_j = O_j unpartitioned, l_j bf16(O_j / l_j) partitioned (ref's rule: one chunk: O / l;
 *   else sum_j w_j bf16(O_j / l_j) / sum_j w_j, w_j = l_j e^(m_j - M), chunks in order). Run
 *   by the last block of each (token, kv head) to finish (a counter per (token, kv head); no
 *   second launch) when a row has <= PF_FUSE_MAX blocks, else (long dense rows) by the decode
 *   kernels' first hq blocks of the row to arrive, a head each in pf_merge_k's order, once
 *   all arrived (pd_split_merge, session 12: one launch when the grid fits one wave; the
 *   first arrivals since session 17, the last before), or by pf_merge_k.
 * Elsewhere (no mma.sync) m3_gpu_attn_paged_flash runs the faithful kernel. */
#define PF_THREADS 256 /* 8 warps: a warp per 8-key n-tile of S, per 16-dim pair of O */
#define PF_NW (PF_THREADS / 32)
#define PF_TK 64      /* keys per shared-memory tile */
#define PF_NST 4      /* tile stages (8 for grids of one wave measured no faster, removed) */
#define PF_BPS 2      /* blocks per SM the launcher aims at (1: 1.5x slower at 128K dense) */
#define PF_MAX_CH 256 /* keys per chunk */
#define PF_FUSE_MAX 32
#define PF_MAX_CNT 65536                  /* (token, kv head) counters */
#define PF_PART_CAP ((size_t)256 << 20)   /* partial outputs per launch (bytes) */
#define PF_PHYS 64                        /* physical block ids cached per block */
#define PF_VU ((PF_TK / 8) * FA_MAX_DH / PF_THREADS) /* V units of a tile per thread, at most */
static_assert(FD_MAX_HQ * FA_MAX_DH / 8 <= PF_THREADS, "a thread's 16-byte q load covers the group");

typedef struct {
    int H, Hkv, hq, Dh, Dhp, ch, nchx, part, tile;
    int cpb; /* chunks per block (consecutive chunks of one (token, kv head) row) */
    int nsp; /* blocks (partial slots) per row: ceil(nchx / cpb) */
    float scale, fmax;
    bool eager, pa, fp8, fast, sel_order, fused, qvec;
    bool pvf16; /* §4.9 P'.V as exact fp16 products, scaled per 16 keys (tile % 16 == 0) */
    bool hw;    /* e4m3fn: hardware fp8 <-> fp16 conversions (sm_89+) */
    bool dec;   /* the geometry suits pd_part_k (the launcher picks it for decode shapes) */
    bool spec;  /* pd_part_k, one token of a dense row (a programmatic dependent launch): its
                 * warps' first K groups prefetched into L2 before m3_pdl_wait */
    bool l2ef;  /* pd8_part_k: the ring's copies with an L2 evict-first policy (each row reads its
                 * own keys once: one token, or a table per token) */
    int split;  /* > 0: rows of more than PF_FUSE_MAX partials merged by their first `split`
                 * blocks to arrive, a head slice each (pd_split_merge); 0: pf_merge_k */
    unsigned int *cnt; /* the fused merge's arrival counters, [PF_MAX_CNT]: the context's
                          (m3_gpu.counters + M3_GPU_CNT_PF) */
} pf_cfg;

#if defined(M3_HIP_NVIDIA)
/* floats of the score array: scores [hq][ch + 8], also the Q staging and the fused merge's
 * weights (3 x PF_FUSE_MAX + 1 per head) */
static __host__ __device__ inline size_t pf_sc_floats(const pf_cfg &c) {
    size_t a = (size_t)c.hq * (c.ch + 8), b = (size_t)c.hq * (3 * PF_FUSE_MAX + 1),
           q = ((size_t)c.hq * c.Dhp + 1) / 2;
    a = a > b ? a : b;
    return ((a > q ? a : q) + 3) / 4 * 4;
}
static __host__ __device__ inline size_t pf_tile_bytes(const pf_cfg &c) {
    return (size_t)PF_TK * c.Dhp * (c.fp8 ? 1 : 2);
}
static size_t pf_smem_bytes(const pf_cfg &c) {
    const size_t tb = pf_tile_bytes(c);
    return (size_t)PF_NST * tb + (size_t)c.ch * 4 * sizeof(int64_t) + pf_sc_floats(c) * sizeof(float) +
           (size_t)c.ch * 6 * sizeof(float) + (size_t)16 * (PF_TK + 8) * sizeof(m3_bf16) +
           512 * sizeof(uint16_t);
}

/* The fused merge's arrival counters (pf_cfg.cnt) are the context's, zero at open; the block
 * that merges a (token, kv head) resets its entry, so they are zero again between launches
 * (launches on one stream run one after another; another context has its own). */
static_assert(PF_MAX_CNT <= M3_GPU_CNT_IDX - M3_GPU_CNT_PF, "the counter range of m3_gpu");

/* Partials: per chunk j and head, m_j, l_j and A_j, where A_j = O_j (sum of P V,
 * unnormalised) when unpartitioned, or l_j bf16(O_j / l_j) (ref's bf16-stored partition
 * output, weighted back) when partitioned; both merge as
 *   out = bf16(sum_j e^(m_j - M) A_j / sum_j e^(m_j - M) l_j),
 * which for partitions is ref's sum_j w_j bf16(O_j / l_j) / sum_j w_j, w_j = l_j e^(m_j - M).
 * pf_merge_w: the weights e^(m_j - M) of heads 0..nh-1 into w [nh][nj] and the denominators
 * into den [nh] (shared memory; threads tid.., nth of them; ends with a barrier). Partials are
 * read through L2 (__ldcg): other blocks wrote them in this launch. */
static __device__ void pf_merge_w(const float *pml, size_t s0, int nj, int hq, int h0, int nh,
                                  float *w, float *den, int tid, int nth) {
    float *ms = w + nh * nj, *ls = ms + nh * nj; /* staging */
    for (int e = tid; e < nh * nj; e += nth) {
        const int h = e / nj, j = e % nj;
        const size_t sl = (s0 + j) * hq + h0 + h;
        ms[e] = __ldcg(pml + sl * 2), ls[e] = __ldcg(pml + sl * 2 + 1);
    }
    __syncthreads();
    const int lane = tid % 32, warp = tid / 32;
    for (int h = warp; h < nh; h += nth / 32) { /* a warp per head, lanes over the chunks */
        float M = -INFINITY, d = 0.0f;
        for (int j = lane; j < nj; j += 32) M = fmaxf(M, ms[h * nj + j]);
        M = m3_warp_max(M);
        for (int j = lane; j < nj; j += 32) {
            const float x = expf(ms[h * nj + j] - M);
            w[h * nj + j] = x;
            d += x * ls[h * nj + j];
        }
        d = m3_warp_sum(d);
        if (lane == 0) den[h] = nj > 0 ? d : NAN; /* no key (ref asserts): a visible NaN */
    }
    __syncthreads();
}

/* out of heads h0..h0+nh-1, dims in 4-wide items (Dh % 4 == 0) or singly: sum over chunks
 * j0, j0 + js, ... of w A_j into acc (partial sums when js > 1) */
static __device__ __forceinline__ void pf_acc(const float *po, size_t s0, int hq, int Dh, int h,
                                              int d, int vw, const float *w, int j0, int nj,
                                              int js, float *acc) {
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    if (vw == 4) {
#pragma unroll 8
        for (int j = j0; j < nj; j += js) {
            const float4 a = __ldcg(reinterpret_cast<const float4 *>(po + ((s0 + j) * hq + h) * Dh + d));
            const float x = w[j];
            acc[0] += x * a.x, acc[1] += x * a.y, acc[2] += x * a.z, acc[3] += x * a.w;
        }
    } else {
#pragma unroll 8
        for (int j = j0; j < nj; j += js) acc[0] += w[j] * __ldcg(po + ((s0 + j) * hq + h) * Dh + d);
    }
}

/* the fused merge of one (token, KV head) row by its last block (pf_part_k, pd_part_k): the
 * row's nj block partials at slots s0.. into bf16 orow [hq][Dh], ref's partition merge
 * (pf_merge_w's weights, pf_acc's sums); w: 3 hq nj + hq floats of free shared memory */
static __device__ void pf_row_merge(m3_bf16 *orow, const float *po, const float *pml, size_t s0,
                                    int nj, int hq, int Dh, float *w, int tid, int nth) {
    const int vw = Dh % 4 == 0 ? 4 : 1;
    float *den = w + 3 * hq * nj;
    pf_merge_w(pml, s0, nj, hq, 0, hq, w, den, tid, nth);
    for (int e = tid; e < hq * (Dh / vw); e += nth) {
        const int h = e / (Dh / vw), d = (e % (Dh / vw)) * vw;
        float acc4[4];
        pf_acc(po, s0, hq, Dh, h, d, vw, w + h * nj, 0, nj, 1, acc4);
        for (int i = 0; i < vw; i++) orow[(size_t)h * Dh + d + i] = m3_f32_to_bf16(acc4[i] / den[h]);
    }
}

/* fast path: element offsets of (slot, head g, dim 0) in K and V and of the scale; ref's
 * formulas (gpu/kv_paged.h) with 32-bit divisions, x = XC dividing Dh and the view's page */
template <int XC>
static __device__ __forceinline__ void pf_offs(const m3_gpu_attn_paged_src &s, int slot, int g,
                                               int64_t &ko, int64_t &vo, int64_t &so) {
    const m3_kv_geom &G = s.g;
    if (s.view == M3_KV_VIEW_BLOCK) {
        const int b = slot / G.block, t = slot - b * G.block;
        ko = (int64_t)(b * G.n_kv + g) * G.dx * ((int64_t)G.block * XC) + t * XC;
        vo = (int64_t)b * G.v_stride + ((int64_t)g * (G.block / XC) + t / XC) * ((int64_t)G.head_dim * XC) + t % XC;
        so = (int64_t)(b * G.n_kv + g) * G.block + t;
    } else {
        const int P = G.page, ppb = G.block / P, qq = slot / P, t = slot - qq * P;
        const int qb = qq / ppb, qr = qq - qb * ppb;
        ko = (int64_t)qb * G.k_block + (int64_t)qr * ((int64_t)G.n_kv * G.dx * P * XC) +
             (int64_t)g * G.dx * ((int64_t)P * XC) + t * XC;
        vo = (int64_t)qb * G.v_stride + (int64_t)qr * G.v_page +
             ((int64_t)g * (P / XC) + t / XC) * ((int64_t)G.head_dim * XC) + t % XC;
        so = ((int64_t)qq * G.n_kv + g) * P + t;
    }
}

#if M3_HAVE_MMA
/* 4 bytes global -> shared, asynchronously (an fp32 scale) */
static __device__ __forceinline__ void cp4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sh_u32(dst)), "l"(src));
}
/* two fp8 codes (low byte first) -> their values as fp16x2 bits (exact: every e4m3 value is an
 * fp16 normal or zero). hw: cvt.rn.f16x2.e4m3x2 (e4m3fn, sm_89+); else the table lut16. */
static __device__ __forceinline__ uint32_t pf_h2(uint32_t c2, const uint16_t *lut16, bool hw) {
#if M3_HAVE_FP8_CVT
    if (hw) {
        uint32_t d;
        asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.rn.f16x2.e4m3x2 %0, t; }" : "=r"(d) : "r"(c2));
        return d;
    }
#endif
    return (uint32_t)lut16[c2 & 0xFFu] | ((uint32_t)lut16[(c2 >> 8) & 0xFFu] << 16);
}
/* the same values as bf16x2 bits (exact); lutb the bf16 table */
static __device__ __forceinline__ uint32_t pf_b2(uint32_t c2, const uint16_t *lutb, bool hw) {
#if M3_HAVE_FP8_CVT
    if (hw) {
        const uint32_t h = pf_h2(c2, lutb, true);
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
        return pack_bf16(f.x, f.y);
    }
#endif
    return (uint32_t)lutb[c2 & 0xFFu] | ((uint32_t)lutb[(c2 >> 8) & 0xFFu] << 16);
}
/* fp16x2 bits of the fp8-rounded values of (v0, v1) (§4.9's P' codes, exact in fp16) */
static __device__ __forceinline__ uint32_t pf_q2(float v0, float v1, m3_fp8_kind kind,
                                                 m3_fp8_overflow ovf, bool hw) {
#if M3_HAVE_FP8_CVT
    if (hw) {
        uint32_t d;
        asm("{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, %1, %2; cvt.rn.f16x2.e4m3x2 %0, t; }"
            : "=r"(d) : "f"(v1), "f"(v0));
        return d;
    }
#endif
    const __half a = __float2half_rn(m3_round_fp8(v0, kind, ovf)),
                 b = __float2half_rn(m3_round_fp8(v1, kind, ovf));
    return (uint32_t)__half_as_ushort(a) | ((uint32_t)__half_as_ushort(b) << 16);
}
#endif

template <bool FP8>
static __global__ void __launch_bounds__(PF_THREADS, 2)
    pf_part_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT q, int ld_q,
              m3_gpu_attn_paged_src s, const int32_t *M3_RESTRICT pos, int t0, int n_tok,
              const int32_t *M3_RESTRICT topk, int width, float *M3_RESTRICT po,
              float *M3_RESTRICT pml, int *M3_RESTRICT nkeys, pf_cfg c) {
#if M3_HAVE_MMA
    extern __shared__ __align__(16) unsigned char pf_raw[];
    constexpr int EB = FP8 ? 1 : 2, XC = 16 / EB, PBP = PF_TK + 8, NST = PF_NST;
    const int hq = c.hq, Dh = c.Dh, Dhp = c.Dhp, ch = c.ch, Bs = s.g.block;
    const size_t TB = pf_tile_bytes(c);
    unsigned char *tiles = pf_raw;
    int64_t *kofs = reinterpret_cast<int64_t *>(tiles + NST * TB); /* [2][ch] fast: K offset; else slot */
    int64_t *vofs = kofs + 2 * ch;                                     /* [2][ch] */
    const int SCP = ch + 8; /* score row pitch: the S fragments' stores spread over banks */
    float *sc = reinterpret_cast<float *>(vofs + 2 * ch); /* [hq][SCP] scores */
    float *ksc = sc + pf_sc_floats(c), *vsc = ksc + 2 * ch; /* [2][ch] scales */
    float *mt = vsc + 2 * ch, *mf = mt + ch; /* §4.9 tile max M, M / FP8_MAX */
    m3_bf16 *pb = reinterpret_cast<m3_bf16 *>(mf + ch); /* [16][PBP] P of a tile */
    uint16_t *lut16 = reinterpret_cast<uint16_t *>(pb + 16 * PBP), *lutb = lut16 + 256;
    __shared__ int blist[PG_MAX_SEL], selsh[PG_MAX_SEL], vfl[PG_MAX_SEL], physh[PF_PHYS];
    __shared__ int n_sh, last_sh;
    __shared__ float m_sh[FD_MAX_HQ], l_sh[FD_MAX_HQ];

    const int ci = (int)blockIdx.x, g = (int)blockIdx.y, tl = (int)blockIdx.z, t = t0 + tl;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int p = pos[t];
    s.bt += (int64_t)t * s.bt_ld; /* a decode batch: the token's own sequence's table */
    const bool sparse = topk != NULL, hw = c.hw && M3_HAVE_FP8_CVT;
    /* the group's q (hq Dh <= 16 x 128 = PF_THREADS x 8 values): in flight with pos and the
     * selection */
    const m3_bf16 *qg = q + (size_t)t * ld_q + (size_t)g * hq * Dh;
    const int nq = hq * Dh;
    uint4 qv = make_uint4(0, 0, 0, 0);
    if (c.qvec && tid < nq / 8) qv = *reinterpret_cast<const uint4 *>(qg + (size_t)tid * 8);
    if (sparse) /* the selection row into shared memory, all loads in flight at once */
        for (int i = tid; i < width; i += PF_THREADS) selsh[i] = topk[((int64_t)g * n_tok + t) * width + i];
    __syncthreads();
    if (!sparse) {
        if (tid == 0) {
            n_sh = p + 1;
            if (ci == 0 && !c.fused) nkeys[(size_t)tl * c.Hkv + g] = n_sh;
        }
    } else { /* the key list, as attn_paged_k (ref m3_kv_sparse_table): full blocks b < bp
              * in selection order or by id (a stable rank, duplicates kept), the own block
              * bp last when selected; every thread ranks its entries */
        const int bp = p / Bs;
        if (tid == 0) last_sh = 0;
        __syncthreads();
        for (int i = tid; i < width; i += PF_THREADS) {
            const int b = selsh[i];
            vfl[i] = b >= 0 && b < bp;
            if (b == bp) last_sh = 1; /* the tail (any thread, the same value) */
        }
        __syncthreads();
        for (int i = tid; i < width; i += PF_THREADS)
            if (vfl[i]) {
                const int b = selsh[i];
                int at = 0;
                if (c.sel_order)
                    for (int j = 0; j < i; j++) at += vfl[j];
                else
                    for (int j = 0; j < width; j++)
                        at += vfl[j] && (selsh[j] < b || (selsh[j] == b && j < i));
                blist[at] = b;
            }
        if (tid == 0) {
            int nf = 0;
            for (int j = 0; j < width; j++) nf += vfl[j];
            int n;
            if (last_sh) {
                blist[nf] = bp;
                n = nf * Bs + (p - Bs * bp + 1);
            } else {
                n = nf * Bs < p + 1 ? nf * Bs : p + 1;
            }
            n_sh = n;
            if (ci == 0 && !c.fused) nkeys[(size_t)tl * c.Hkv + g] = n;
        }
    }
    if (FP8 && !hw)
        for (int i = tid; i < 256; i += PF_THREADS) {
            const float v = m3_fp8_to_f32((m3_fp8)i, s.g.fp8_kind);
            lut16[i] = __half_as_ushort(__float2half_rn(v)), lutb[i] = m3_f32_to_bf16(v);
        }
    for (int i = tid; i < (16 - hq) * PBP; i += PF_THREADS) pb[hq * PBP + i] = 0; /* unused rows */
    __syncthreads();
    const int n = n_sh, nch = (n + ch - 1) / ch, cb = ci * c.cpb, ce = min(nch, cb + c.cpb);
    const size_t tg = (size_t)tl * c.Hkv + g, slot0 = tg * c.nsp;
    /* running merge of this block's chunks (rows gq, gq + 8): max, denominator, sum of A_j */
    float Mr[2] = {-INFINITY, -INFINITY}, Lr[2] = {0.0f, 0.0f};
    float acc[FA_MAX_DH / 16 / PF_NW][2][4];
#pragma unroll
    for (int u = 0; u < FA_MAX_DH / 16 / PF_NW; u++)
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++) acc[u][h2][0] = acc[u][h2][1] = acc[u][h2][2] = acc[u][h2][3] = 0.0f;
    /* the physical blocks of the block's key range (up to PF_PHYS): the chunks' offsets
     * then need no dependent global load */
    const int kb0 = cb * ch / Bs, nph = cb < ce ? min((min(ce * ch, n) - 1) / Bs - kb0 + 1, PF_PHYS) : 0;
    for (int i = tid; i < nph; i += PF_THREADS) physh[i] = sparse ? s.bt[blist[kb0 + i]] : s.bt[kb0 + i];
    __syncthreads();
    if (cb < ce) {
        const int Pv = s.view == M3_KV_VIEW_BLOCK ? Bs : s.g.page;
        /* chunk cc's key offsets into buffer (cc - cb) & 1, its scales by cp.async (they land
         * with the next commit group) */
        auto offs = [&](int cc) {
            const int bf = (cc - cb) & 1, k0 = cc * ch, nk = min(ch, n - k0);
#pragma unroll
            for (int r = 0; r < (PF_MAX_CH + PF_THREADS - 1) / PF_THREADS; r++) {
                const int i = tid + r * PF_THREADS;
                if (i >= nk) continue;
                const int k = k0 + i, kb = k / Bs;
                const int ph = kb - kb0 < nph ? physh[kb - kb0] : sparse ? s.bt[blist[kb]] : s.bt[kb];
                const int sl = ph * Bs + (k - kb * Bs);
                int64_t so;
                if (c.fast) {
                    pf_offs<XC>(s, sl, g, kofs[bf * ch + i], vofs[bf * ch + i], so);
                } else {
                    kofs[bf * ch + i] = sl;
                    so = m3_dkv_off_scale(s.g, s.view, sl, g);
                }
                if (FP8) cp4(ksc + bf * ch + i, s.k_scale + so), cp4(vsc + bf * ch + i, s.v_scale + so);
            }
        };
        offs(cb);
        /* Q A fragments (rows = the group's heads, zero past hq / Dh; §4.9: fp8(q) as fp16),
         * staged through the score array: the group's hq*Dh values are contiguous in the row,
         * read by 16-byte loads all in flight at once (one round trip). fp8 K tiles give a
         * lane the 4 consecutive dims 4tq..4tq+3 of each 16 (one 32-bit read): Q takes the
         * same permutation of the k index. */
        uint32_t qa[FA_MAX_DH / 16][4];
        {
            uint16_t *qs = reinterpret_cast<uint16_t *>(sc); /* [hq][Dhp] */
            if (c.qvec) {
                if (tid < nq / 8) *reinterpret_cast<uint4 *>(qs + (size_t)tid * 8) = qv;
            } else {
#pragma unroll 8
                for (int e = tid; e < nq; e += PF_THREADS) qs[(e / Dh) * Dhp + e % Dh] = qg[e];
            }
            for (int e = tid; e < hq * Dhp; e += PF_THREADS) /* padding dims */
                if (e % Dhp >= Dh) qs[e] = 0;
            __syncthreads();
            if (c.pa) /* §4.9: fp8(q) without scale, held as fp16 (exact) */
                for (int e = tid; e < hq * Dhp; e += PF_THREADS)
                    qs[e] = __half_as_ushort(__float2half_rn(
                        m3_round_fp8(m3_bf16_to_f32(qs[e]), s.g.fp8_kind, s.ovf)));
            __syncthreads();
#pragma unroll
            for (int s2 = 0; s2 < FA_MAX_DH / 16; s2++) {
                if (s2 * 16 >= Dhp) break;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int r = gq + (i & 1) * 8;
                    const int d = FP8 ? s2 * 16 + 4 * tq + (i >> 1) * 2 : s2 * 16 + 2 * tq + (i >> 1) * 8;
                    qa[s2][i] = r < hq ? *reinterpret_cast<const uint32_t *>(qs + r * Dhp + d) : 0u;
                }
            }
            __syncthreads(); /* the score array is written from the first K tile on */
        }
        const int nktf = (ch + PF_TK - 1) / PF_TK; /* K tiles of a full chunk */
        const int nkl = min(ch, n - (ce - 1) * ch), ntl = (ce - 1 - cb) * 2 * nktf + 2 * ((nkl + PF_TK - 1) / PF_TK);
        const unsigned char *kbase = reinterpret_cast<const unsigned char *>(s.k);
        const unsigned char *vbase = reinterpret_cast<const unsigned char *>(s.v);
        /* tile G of the block (per chunk: its K tiles, then its V tiles) into stage G % NST */
        /* this thread's V units (key group, dim) of a tile, the same for every tile */
        int vgi[PF_VU], vdd[PF_VU];
#pragma unroll
        for (int r = 0; r < PF_VU; r++) {
            const int u = tid + r * PF_THREADS;
            vgi[r] = u < (PF_TK / XC) * Dh ? u / Dh : -1, vdd[r] = u % Dh;
        }
        auto load = [&](int G) {
            if (G >= ntl) return;
            const int cc = cb + G / (2 * nktf), j = G % (2 * nktf), bf = (cc - cb) & 1;
            const int nk = min(ch, n - cc * ch), nkt = (nk + PF_TK - 1) / PF_TK;
            const int64_t *ko = kofs + bf * ch, *vo = vofs + bf * ch;
            unsigned char *st = tiles + (size_t)(G % NST) * TB;
            if (j < nkt) {
                const int i0 = j * PF_TK;
                if (c.fast) { /* unit (key, dim group): 16 bytes of one key */
                    for (int u = tid; u < PF_TK * (Dh / XC); u += PF_THREADS) {
                        const int il = u % PF_TK, dg = u / PF_TK, i = i0 + il;
                        const bool in = i < nk;
                        const unsigned char *src =
                            in ? kbase + (ko[i] + (int64_t)dg * Pv * XC) * EB : kbase;
                        cp16(st + ((size_t)dg * PF_TK + il) * 16, src, in);
                    }
                } else {
                    for (int u = tid; u < PF_TK * Dhp; u += PF_THREADS) {
                        const int il = u % PF_TK, d = u / PF_TK, i = i0 + il;
                        uint32_t b = 0;
                        if (i < nk && d < Dh) {
                            const int64_t o = m3_dkv_off_k(s.g, s.view, ko[i], g, d);
                            b = FP8 ? kbase[o] : reinterpret_cast<const uint16_t *>(kbase)[o];
                        }
                        const size_t e = ((size_t)(d / XC) * PF_TK + il) * XC + d % XC;
                        if (FP8) st[e] = (unsigned char)b;
                        else reinterpret_cast<uint16_t *>(st)[e] = (uint16_t)b;
                    }
                }
            } else {
                const int i0 = (j - nkt) * PF_TK;
                if (c.fast) { /* unit (key group, dim): XC consecutive keys of one dim */
#pragma unroll
                    for (int r = 0; r < PF_VU; r++) {
                        if (vgi[r] < 0) continue;
                        const int gi = vgi[r], d = vdd[r], kk = i0 + gi * XC, nv = nk - kk;
                        unsigned char *dst = st + ((size_t)gi * Dhp + d) * 16;
                        if (nv >= XC || nv <= 0) {
                            cp16(dst, nv > 0 ? vbase + (vo[kk] + (int64_t)d * XC) * EB : vbase, nv > 0);
                        } else { /* the list ends inside the group: zero the keys past it */
                            uint4 w = *reinterpret_cast<const uint4 *>(vbase + (vo[kk] + (int64_t)d * XC) * EB);
                            uint32_t ww[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                            for (int b = 0; b < 16; b++)
                                if (b >= nv * EB) ww[b / 4] &= ~(0xFFu << (8 * (b % 4)));
                            *reinterpret_cast<uint4 *>(dst) = make_uint4(ww[0], ww[1], ww[2], ww[3]);
                        }
                    }
                } else {
                    for (int u = tid; u < PF_TK * Dhp; u += PF_THREADS) {
                        const int il = u % PF_TK, d = u / PF_TK, i = i0 + il;
                        uint32_t b = 0;
                        if (i < nk && d < Dh) {
                            const int64_t o = m3_dkv_off_v(s.g, s.view, ko[i], g, d);
                            b = FP8 ? vbase[o] : reinterpret_cast<const uint16_t *>(vbase)[o];
                        }
                        const size_t e = ((size_t)(il / XC) * Dhp + d) * XC + il % XC;
                        if (FP8) st[e] = (unsigned char)b;
                        else reinterpret_cast<uint16_t *>(st)[e] = (uint16_t)b;
                    }
                }
            }
        };
#pragma unroll
        for (int i = 0; i < NST - 1; i++) {
            load(i);
            cp_commit();
        }
        float o[FA_MAX_DH / 16 / PF_NW][2][4];
#pragma unroll
        for (int u = 0; u < FA_MAX_DH / 16 / PF_NW; u++)
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++) o[u][h2][0] = o[u][h2][1] = o[u][h2][2] = o[u][h2][3] = 0.0f;
        for (int G = 0; G < ntl; G++) {
            cp_wait<NST - 2>(); /* this thread's copies of tile G (and older scales) landed */
            __syncthreads(); /* every thread's too, and stage (G - 1) % NST is free */
            load(G + NST - 1);
            cp_commit();
            const int cc = cb + G / (2 * nktf), j = G % (2 * nktf), bf = (cc - cb) & 1;
            const int nk = min(ch, n - cc * ch), nkt = (nk + PF_TK - 1) / PF_TK;
            const float *ks_ = ksc + bf * ch, *vs_ = vsc + bf * ch;
            const unsigned char *st = tiles + (size_t)(G % NST) * TB;
            if (j == 0) {
                /* the next chunk's offsets (its first tile loads NST - 1 iterations ahead, from
                 * the next iteration on: a full chunk has >= NST tiles, the host ensures; the
                 * scales' copies land with the next commit group) */
                if (cc + 1 < ce) offs(cc + 1);
                if (c.pa) /* §4.9: the max V scale of each tile of keys (tiles from the chunk start) */
                    for (int jt = warp; jt * c.tile < nk; jt += PF_NW) {
                        float M = 0.0f;
                        for (int i = jt * c.tile + lane; i < min((jt + 1) * c.tile, nk); i += 32)
                            M = fmaxf(M, vs_[i]);
                        M = m3_warp_max(M);
                        if (lane == 0) mt[jt] = M, mf[jt] = M / c.fmax;
                    }
            }
            if (j < nkt) { /* S = Q K^T: a warp per 8-key n-tile */
                const int i0 = j * PF_TK, nkv = min(PF_TK, nk - i0);
#pragma unroll
                for (int u = 0; u < PF_TK / 8 / PF_NW; u++) {
                    const int nt = warp + u * PF_NW;
                    if (nt * 8 >= nkv) continue;
                    float c8[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}}; /* even / odd k-steps: two chains */
                    const int key = nt * 8 + gq;
#pragma unroll
                    for (int s2 = 0; s2 < FA_MAX_DH / 16; s2++) {
                        if (s2 * 16 >= Dhp) break;
                        uint32_t bfr[2];
                        if (FP8) { /* dims 4tq..4tq+3 of the 16 (Q permuted alike) */
                            const uint32_t w = *reinterpret_cast<const uint32_t *>(
                                st + ((size_t)s2 * PF_TK + key) * 16 + 4 * tq);
                            if (c.pa) {
                                bfr[0] = pf_h2(w, lut16, hw), bfr[1] = pf_h2(w >> 16, lut16, hw);
                                m3_mma_f16_16816(c8[s2 & 1], qa[s2], bfr);
                            } else {
                                bfr[0] = pf_b2(w, lutb, hw), bfr[1] = pf_b2(w >> 16, lutb, hw);
                                m3_mma_bf16_16816(c8[s2 & 1], qa[s2], bfr);
                            }
                        } else {
                            const uint16_t *kb = reinterpret_cast<const uint16_t *>(st) +
                                                 ((size_t)(2 * s2) * PF_TK + key) * 8 + 2 * tq;
                            bfr[0] = *reinterpret_cast<const uint32_t *>(kb);
                            bfr[1] = *reinterpret_cast<const uint32_t *>(kb + PF_TK * 8);
                            m3_mma_bf16_16816(c8[s2 & 1], qa[s2], bfr);
                        }
                    }
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int r = gq + (i >> 1) * 8, ki = i0 + nt * 8 + 2 * tq + (i & 1);
                        if (r >= hq || ki >= nk) continue; /* keys past nk are never read */
                        float d = c8[0][i] + c8[1][i], z;
                        if (c.pa) z = d * c.scale * ks_[ki]; /* §4.9 step 2 */
                        else {
                            if (FP8) d *= ks_[ki]; /* dequantized K */
                            z = c.eager ? m3_round_bf16(m3_round_bf16(d) * c.scale) : d * c.scale;
                        }
                        sc[(size_t)r * SCP + ki] = z;
                    }
                }
            } else {
                const int i0 = (j - nkt) * PF_TK, nkv = min(PF_TK, nk - i0);
                if (j == nkt) { /* all scores are in: max and denominator per head */
                    for (int h = warp; h < hq; h += PF_THREADS / 32) {
                        float m = -INFINITY;
                        for (int i = lane; i < nk; i += 32) m = fmaxf(m, sc[(size_t)h * SCP + i]);
                        m = m3_warp_max(m);
                        float l = 0.0f;
                        for (int i = lane; i < nk; i += 32) l += expf(sc[(size_t)h * SCP + i] - m);
                        l = m3_warp_sum(l);
                        if (lane == 0) m_sh[h] = m, l_sh[h] = l;
                    }
                    __syncthreads();
                }
                /* P of this tile, two keys per item: bf16 (P, or fp8 P dequantized, or §4.9 P'
                 * M / FP8_MAX), or under pvf16 the §4.9 P' codes as fp16 */
                for (int e = tid; e < hq * (PF_TK / 2); e += PF_THREADS) {
                    const int h = e / (PF_TK / 2), il = 2 * (e % (PF_TK / 2)), i = i0 + il;
                    float pv[2] = {0.0f, 0.0f};
#pragma unroll
                    for (int k2 = 0; k2 < 2; k2++)
                        if (il + k2 < nkv) {
                            const float ex = expf(sc[(size_t)h * SCP + i + k2] - m_sh[h]);
                            if (c.pa) { /* §4.9 step 4 */
                                const float M = mt[(i + k2) / c.tile];
                                pv[k2] = ex * vs_[i + k2] * c.fmax / (M + 1e-8f);
                                if (!c.pvf16)
                                    pv[k2] = m3_round_fp8(pv[k2], s.g.fp8_kind, s.ovf) * (M / c.fmax);
                            } else {
                                pv[k2] = FP8 ? ex * vs_[i + k2] : ex;
                            }
                        }
                    *reinterpret_cast<uint32_t *>(pb + h * PBP + il) =
                        c.pvf16 ? pf_q2(pv[0], pv[1], s.g.fp8_kind, s.ovf, hw) : pack_bf16(pv[0], pv[1]);
                }
                __syncthreads();
                /* O += P V: a warp per 16-dim pair of n-tiles. fp8 V tiles give a lane the 4
                 * consecutive keys 4tq..4tq+3 of each 16 (one 32-bit read): P is read alike. */
#pragma unroll
                for (int u = 0; u < FA_MAX_DH / 16 / PF_NW; u++) {
                    const int np = warp + u * PF_NW;
                    if (np * 16 >= Dhp) continue;
                    for (int ks = 0; ks * 16 < nkv; ks++) {
                        uint32_t a[4];
                        if (FP8) {
                            const m3_bf16 *pr = pb + gq * PBP + ks * 16 + 4 * tq;
                            a[0] = *reinterpret_cast<const uint32_t *>(pr);
                            a[1] = *reinterpret_cast<const uint32_t *>(pr + 8 * PBP);
                            a[2] = *reinterpret_cast<const uint32_t *>(pr + 2);
                            a[3] = *reinterpret_cast<const uint32_t *>(pr + 8 * PBP + 2);
                        } else {
                            const m3_bf16 *pr = pb + gq * PBP + ks * 16 + 2 * tq;
                            a[0] = *reinterpret_cast<const uint32_t *>(pr);
                            a[1] = *reinterpret_cast<const uint32_t *>(pr + 8 * PBP);
                            a[2] = *reinterpret_cast<const uint32_t *>(pr + 8);
                            a[3] = *reinterpret_cast<const uint32_t *>(pr + 8 * PBP + 8);
                        }
                        float f = 0.0f;
                        if (FP8 && c.pvf16) f = mf[(i0 + ks * 16) / c.tile];
#pragma unroll
                        for (int h2 = 0; h2 < 2; h2++) {
                            const int d = np * 16 + h2 * 8 + gq;
                            uint32_t bfr[2];
                            if (FP8) {
                                const uint32_t w = *reinterpret_cast<const uint32_t *>(
                                    st + ((size_t)ks * Dhp + d) * 16 + 4 * tq);
                                if (c.pvf16) { /* exact P' v8 sums of one §4.9 tile, times M / FP8_MAX */
                                    bfr[0] = pf_h2(w, lut16, hw), bfr[1] = pf_h2(w >> 16, lut16, hw);
                                    float t4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                    m3_mma_f16_16816(t4, a, bfr);
#pragma unroll
                                    for (int i = 0; i < 4; i++) o[u][h2][i] += t4[i] * f;
                                } else {
                                    bfr[0] = pf_b2(w, lutb, hw), bfr[1] = pf_b2(w >> 16, lutb, hw);
                                    m3_mma_bf16_16816(o[u][h2], a, bfr);
                                }
                            } else {
                                const uint16_t *vb = reinterpret_cast<const uint16_t *>(st) +
                                                     ((size_t)(2 * ks) * Dhp + d) * 8 + 2 * tq;
                                bfr[0] = *reinterpret_cast<const uint32_t *>(vb);
                                bfr[1] = *reinterpret_cast<const uint32_t *>(vb + (size_t)Dhp * 8);
                                m3_mma_bf16_16816(o[u][h2], a, bfr);
                            }
                        }
                    }
                }
                if (j == 2 * nkt - 1) { /* chunk done: A_j into the running merge, O reset */
#pragma unroll
                    for (int r2 = 0; r2 < 2; r2++) {
                        const int r = gq + r2 * 8;
                        if (r >= hq) continue;
                        const float m = m_sh[r], l = l_sh[r], Mn = fmaxf(Mr[r2], m);
                        const float wa = Mr[r2] == -INFINITY ? 0.0f : expf(Mr[r2] - Mn),
                                    wb = expf(m - Mn);
#pragma unroll
                        for (int u = 0; u < FA_MAX_DH / 16 / PF_NW; u++)
#pragma unroll
                            for (int h2 = 0; h2 < 2; h2++)
#pragma unroll
                                for (int i = 2 * r2; i < 2 * r2 + 2; i++) {
                                    const float A = c.part > 0 ? l * m3_round_bf16(o[u][h2][i] / l) : o[u][h2][i];
                                    acc[u][h2][i] = acc[u][h2][i] * wa + A * wb;
                                }
                        Lr[r2] = Lr[r2] * wa + l * wb, Mr[r2] = Mn;
                    }
#pragma unroll
                    for (int u = 0; u < FA_MAX_DH / 16 / PF_NW; u++)
#pragma unroll
                        for (int h2 = 0; h2 < 2; h2++) o[u][h2][0] = o[u][h2][1] = o[u][h2][2] = o[u][h2][3] = 0.0f;
                }
            }
        }
        cp_wait<0>();
    }
    if (c.nsp == 1) { /* the whole row in this block: the output (no key: 0 / 0, a visible NaN) */
        m3_bf16 *orow = out + (size_t)t * c.H * Dh + (size_t)g * hq * Dh;
#pragma unroll
        for (int u = 0; u < FA_MAX_DH / 16 / PF_NW; u++)
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int r = gq + (i >> 1) * 8, d = (warp + u * PF_NW) * 16 + h2 * 8 + 2 * tq + (i & 1);
                    if (r < hq && d < Dh) orow[(size_t)r * Dh + d] = m3_f32_to_bf16(acc[u][h2][i] / Lr[i >> 1]);
                }
        return;
    }
    if (cb < ce) { /* this block's partial (M, L, A) per head */
        const size_t sl0 = (slot0 + ci) * hq;
#pragma unroll
        for (int u = 0; u < FA_MAX_DH / 16 / PF_NW; u++)
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int r = gq + (i >> 1) * 8, d = (warp + u * PF_NW) * 16 + h2 * 8 + 2 * tq + (i & 1);
                    if (r < hq && d < Dh) po[(sl0 + r) * Dh + d] = acc[u][h2][i];
                }
        if (warp == 0 && tq == 0)
#pragma unroll
            for (int r2 = 0; r2 < 2; r2++)
                if (gq + r2 * 8 < hq) pml[(sl0 + gq + r2 * 8) * 2] = Mr[r2], pml[(sl0 + gq + r2 * 8) * 2 + 1] = Lr[r2];
    }
    if (!c.fused) return;
    /* the last block of this (token, kv head) to finish merges; the score array is free now */
    if (!attn_last_block(&c.cnt[tg], gridDim.x)) return;
    pf_row_merge(out + (size_t)t * c.H * Dh + (size_t)g * hq * Dh, po, pml, slot0,
                 (nch + c.cpb - 1) / c.cpb, hq, Dh, sc, tid, PF_THREADS);
#else
    (void)out; (void)q; (void)ld_q; (void)s; (void)pos; (void)t0; (void)n_tok; (void)topk;
    (void)width; (void)po; (void)pml; (void)nkeys; (void)c;
#endif
}

/* the merge when rows have more than PF_FUSE_MAX chunks: one block per (token, query head),
 * PF_MT threads: the warps split the partials, lanes the dims; dynamic shared memory: 3 nsp + 1
 * floats of weights and staging, then [warps][Dh] partial sums */
#define PF_MT 256
static __global__ void __launch_bounds__(PF_MT)
    pf_merge_k(m3_bf16 *M3_RESTRICT out, const float *M3_RESTRICT po, const float *M3_RESTRICT pml,
               const int *M3_RESTRICT nkeys, int t0, pf_cfg c) {
    extern __shared__ float pm_sh[];
    const int tl = (int)blockIdx.x, hh = (int)blockIdx.y, g = hh / c.hq, h = hh % c.hq;
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, nw = PF_MT / 32;
    const size_t tg = (size_t)tl * c.Hkv + g, s0 = tg * c.nsp;
    const int n = nkeys[tg], nj = ((n + c.ch - 1) / c.ch + c.cpb - 1) / c.cpb, Dh = c.Dh;
    const int vw = Dh % 4 == 0 ? 4 : 1;
    float *w = pm_sh, *den = w + 3 * c.nsp, *ps = den + 1;
    pf_merge_w(pml, s0, nj, c.hq, h, 1, w, den, tid, PF_MT);
    for (int d = lane * vw; d < Dh; d += 32 * vw) {
        float acc[4];
        pf_acc(po, s0, c.hq, Dh, h, d, vw, w, warp, nj, nw, acc);
        for (int i = 0; i < vw; i++) ps[warp * Dh + d + i] = acc[i];
    }
    __syncthreads();
    for (int d = tid; d < Dh; d += PF_MT) {
        float a = 0.0f;
        for (int i = 0; i < nw; i++) a += ps[i * Dh + d];
        out[(size_t)(t0 + tl) * c.H * Dh + (size_t)hh * Dh + d] = m3_f32_to_bf16(a / den[0]);
    }
}
/* ---- decode kernel pd_part_k (session 6) ------------------------------------------------
 * The same key lists, chunks, partials, merges and numerics as pf_part_k, with warps that own
 * their keys: a block of PD_W warps takes cpb consecutive chunks of one (token, kv head) row,
 * warp w the chunks cb + w, cb + w + PD_W, ... A warp runs a chunk alone, with no block
 * barrier: pass 1 reads K of 16 keys at a time straight from the cache into mma B fragments
 * (16-byte loads; the next group's K and fp8 scales in flight while this one is scored),
 * scores them on mma.sync with the chunk's Q A fragments in registers and parks S in its own
 * shared-memory area (fp32, lane-private); pass 2 takes the chunk's max, reads S back, forms
 * P in registers (the S accumulator layout is the P A-fragment layout) and
 * multiplies it with V read straight into B fragments (the first V group loads during pass
 * 1's last group). Keys are permuted inside each 16-key group (S column n of the lo / hi
 * n-tile is key 4(n/2) + n%2 / + 2), so a lane's P A fragment holds keys 4tq..4tq+3, which one
 * V unit word (fp8) or half unit (bf16) holds for a dim; Q takes the permutation of the K
 * units' dims (a dot product's terms, reordered). A 16-key group lies in one page (needs Bs,
 * the view's page and the chunk % 16 == 0). Each warp folds its chunks into (M, L, A) (A in
 * its shared area); the block folds its warps' once at the end, then writes the output or
 * its partial and runs the fused merge as pf_part_k. Launched for Dh 128, bf16 or dequantized
 * e4m3fn elements (§4.9: pd8_part_k below), the fast layouts, when the grid gives each of
 * PD_WPS warps per SM a chunk (decode and prefill over long rows); short grids (sparse T = 1)
 * keep pf_part_k, whose 8 warps share a chunk. bf16 (session 8): L2 bulk prefetches of a
 * chunk's first V groups at its start and of the next chunk's first K groups at pass 2.
 * Session 9: the block's fold (pd_fold) forms the per-(warp, head) weights once instead of
 * per output element (it was ~8% of pd8_part_k's executed instructions), and the chunk ends
 * form l bf16(O / l) by pd8_div (one reciprocal per row) and hardware bf16x2 roundings
 * instead of IEEE divisions and software roundings (bf16 dense decode 6%, prefill 9%
 * faster); deeper L2 prefetches (4 or 8 groups) measured slower. */
#define PD_W 4   /* warps per block (8, one block per SM: slower) */
#define PD_WPS 8 /* warps per SM the launcher aims at: 2 blocks (~100 KB of shared memory, <= 255
                  * registers each) */
#define PD_PF 1  /* bf16: K / V groups in flight while one is computed (2: spills, slower) */
#define PD_PF8 1 /* fp8: K groups in flight (2: slower, session 6 batch 6) */
#define PD_PV8 1 /* fp8: V groups in flight (2: slower) */
#define PD_NT (FA_MAX_DH / 8)  /* O n-tiles of 8 dims */
#define PD_KS (FA_MAX_DH / 16) /* k-steps of 16 dims */

/* bytes of one warp's shared area: S [ch/16 groups][lo, hi][32 lanes] float4, then its
 * running A [Dh/8 n-tiles][32 lanes] float4 (mma accumulator layout); the fused merge uses
 * all warps' areas */
static __host__ __device__ inline size_t pd_s_bytes(const pf_cfg &c) {
    return (size_t)(c.ch / 16) * 2 * 32 * 16;
}
static __host__ __device__ inline size_t pd_warp_bytes(const pf_cfg &c) {
    return pd_s_bytes(c) + (size_t)(c.Dh / 8) * 32 * 16;
}
static size_t pd_smem_bytes(const pf_cfg &c) {
    size_t a = (size_t)PD_W * pd_warp_bytes(c);
    const size_t fm = ((size_t)3 * 16 * PF_FUSE_MAX + 16) * 4;
    if (a < fm) a = fm;
    return (size_t)16 * c.Dh * 2 + a;
}

/* a lane's V elements of one dim in a 16-key group: 4 fp8 codes or 4 bf16 */
template <bool FP8> struct pd_vunit { typedef uint2 t; };
template <> struct pd_vunit<true> { typedef uint32_t t; };

/* an L2 prefetch of bytes (a multiple of 16) at p (16-byte aligned) */
static __device__ __forceinline__ void pd_l2(const void *p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

/* x / y correctly rounded for a normal quotient, from ry = y's correctly rounded reciprocal */
static __device__ __forceinline__ float pd8_div(float x, float y, float ry) {
    const float q0 = x * ry;
    return fmaf(fmaf(-q0, y, x), ry, q0);
}

/* The block's fold of its PD_W warps' (M, L, A) (A of warp w at wraw + w WB + aoff in the
 * accumulator layout), in warp order, into the row's output (nsp == 1) or this block's
 * partial: the weights e^(M_w - M) and L once per (warp, head) by the first hq threads, then
 * four output elements (one float4 of each warp's A) per step. wx: PD_W x 16 + 32 floats of
 * shared memory. Warps without a chunk (M_w = -inf) are skipped. */
static __device__ void pd_fold(const unsigned char *wraw, size_t WB, size_t aoff,
                               const float (*wml)[2][16], float *wx, m3_bf16 *orow, float *po,
                               float *pml, size_t sl0, int hq, int nsp, int tid, int nt) {
    constexpr int Dh = FA_MAX_DH;
    float *wM = wx + PD_W * 16, *wL = wM + 16;
    if (tid < hq) {
        const int h = tid;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < PD_W; w++) M = fmaxf(M, wml[w][0][h]);
        float L = 0.0f;
#pragma unroll
        for (int w = 0; w < PD_W; w++) {
            const float mw = wml[w][0][h];
            const float x = mw == -INFINITY ? 0.0f : expf(mw - M);
            wx[w * 16 + h] = x;
            if (mw != -INFINITY) L += x * wml[w][1][h];
        }
        wM[h] = M, wL[h] = L;
    }
    __syncthreads();
    /* a lane's 16 bytes of A hold heads h, h + 8 (h < 8) at dims d, d + 1: one float4 of each
     * warp per (h, d pair), four output elements */
    for (int e = tid; e < 8 * Dh / 2; e += nt) {
        const int h = e / (Dh / 2), d = 2 * (e - h * (Dh / 2));
        if (h >= hq) break; /* e grows with h */
        const size_t ai = aoff + ((size_t)(d / 8) * 32 + 4 * h + (d % 8) / 2) * 16;
        float A[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < PD_W; w++) {
            const float4 a = *reinterpret_cast<const float4 *>(wraw + (size_t)w * WB + ai);
            if (wml[w][0][h] != -INFINITY) { /* else a warp without a chunk */
                const float x = wx[w * 16 + h];
                A[0] += x * a.x, A[1] += x * a.y;
            }
            if (wml[w][0][h + 8] != -INFINITY) {
                const float x = wx[w * 16 + h + 8];
                A[2] += x * a.z, A[3] += x * a.w;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int hh = h + 8 * r;
            if (hh >= hq) break;
            const float L = wL[hh];
            if (nsp == 1) { /* the whole row in this block (no key: 0 / 0, a visible NaN) */
                *reinterpret_cast<uint32_t *>(orow + (size_t)hh * Dh + d) =
                    (uint32_t)m3_f32_to_bf16(A[2 * r] / L) | ((uint32_t)m3_f32_to_bf16(A[2 * r + 1] / L) << 16);
            } else {
                *reinterpret_cast<float2 *>(po + (sl0 + hh) * Dh + d) = make_float2(A[2 * r], A[2 * r + 1]);
                if (d == 0) pml[(sl0 + hh) * 2] = wM[hh], pml[(sl0 + hh) * 2 + 1] = L;
            }
        }
    }
}

/* an acquiring load of a counter other blocks count at */
static __device__ __forceinline__ unsigned int pd_ld_acq(const unsigned int *p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* pd_split_merge's merge of heads h0..h1-1 of a row: pf_merge_k's order (its weights by
 * pf_merge_w's arithmetic, per head its PF_MT / 32 strided partial sums as pf_acc's, added in
 * warp order, then the one division), so the same output bits as pf_merge_k. One out-of-line
 * copy with rolled loops (session 17: the inlined merge was ~33 KB of SASS, executed once a
 * launch with a cold instruction cache); write false: the same instructions without the
 * output stores (a merging block's warm-up pass while it waits). sh: 3 nj + 4 + (PF_MT / 32)
 * Dh floats of free shared memory (16-byte aligned). */
static __device__ __noinline__ void pd_merge_slice(m3_bf16 *orow, const float *po, const float *pml,
                                                   size_t s0, int nj, int hq, int h0, int h1, float *sh,
                                                   int tid, int nt, bool write) {
    constexpr int Dh = FA_MAX_DH, NW = PF_MT / 32;
    float *w = sh, *den = w + 3 * nj, *ps = sh + (3 * nj + 4) / 4 * 4;
    constexpr int NI = 2, NP = 8; /* items (warp i, dims d..d+3) a thread, partials read early */
    static_assert(NW * (Dh / 4) <= NI * PD_W * 32, "pd_merge_slice's items per thread");
    const int lane = tid % 32, warp = tid / 32;
#pragma unroll 1
    for (int h = h0; h < h1; h++) {
        /* the first NP partials of each item in flight while the weights are formed (the
         * same sums as pf_acc's, in its order: 0, then w_j A_j for j = i, i + NW, ...) */
        float4 pa[NI][NP];
#pragma unroll
        for (int it = 0; it < NI; it++) {
            const int e = tid + it * nt, i = e / (Dh / 4), d = 4 * (e % (Dh / 4));
#pragma unroll
            for (int u = 0; u < NP; u++) {
                const int j = i + u * NW;
                pa[it][u] = e < NW * (Dh / 4) && j < nj
                                ? __ldcg(reinterpret_cast<const float4 *>(po + ((s0 + j) * hq + h) * Dh + d))
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
        { /* pf_merge_w's weights and denominator of head h (its operations in its order;
           * rolled loops: its inlined lane loops were unrolled with an expf copy each) */
            float *ms = w + nj, *ls = ms + nj;
#pragma unroll 1
            for (int j = tid; j < nj; j += nt) {
                const size_t sl = (s0 + j) * hq + h;
                ms[j] = __ldcg(pml + sl * 2), ls[j] = __ldcg(pml + sl * 2 + 1);
            }
            __syncthreads();
            if (warp == 0) {
                float M = -INFINITY, dd = 0.0f;
#pragma unroll 1
                for (int j = lane; j < nj; j += 32) M = fmaxf(M, ms[j]);
                M = m3_warp_max(M);
#pragma unroll 1
                for (int j = lane; j < nj; j += 32) {
                    const float x = expf(ms[j] - M);
                    w[j] = x;
                    dd += x * ls[j];
                }
                dd = m3_warp_sum(dd);
                if (lane == 0) den[0] = nj > 0 ? dd : NAN;
            }
            __syncthreads();
        }
#pragma unroll
        for (int it = 0; it < NI; it++) { /* pf_merge_k's warp i, lane d / 4 */
            const int e = tid + it * nt, i = e / (Dh / 4), d = 4 * (e % (Dh / 4));
            if (e >= NW * (Dh / 4)) break;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int u = 0; u < NP; u++) {
                const int j = i + u * NW;
                if (j >= nj) break;
                const float4 a = pa[it][u];
                const float x = w[j];
                acc[0] += x * a.x, acc[1] += x * a.y, acc[2] += x * a.z, acc[3] += x * a.w;
            }
#pragma unroll 1
            for (int j = i + NP * NW; j < nj; j += NW) {
                const float4 a = __ldcg(reinterpret_cast<const float4 *>(po + ((s0 + j) * hq + h) * Dh + d));
                const float x = w[j];
                acc[0] += x * a.x, acc[1] += x * a.y, acc[2] += x * a.z, acc[3] += x * a.w;
            }
            *reinterpret_cast<float4 *>(ps + i * Dh + d) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        }
        __syncthreads();
#pragma unroll 1
        for (int d = tid; d < Dh; d += nt) {
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < NW; i++) a += ps[i * Dh + d];
            const m3_bf16 o = m3_f32_to_bf16(a / den[0]);
            if (write) orow[(size_t)h * Dh + d] = o;
        }
        __syncthreads();
    }
}

/* The merge of a row of nsp > PF_FUSE_MAX partials inside the decode kernels (session 12; it
 * was the pf_merge_k launch, and a two-level merge by last arrivals measured slower in session
 * 11: two serial merges on the critical path). Every block of the row, its partial written,
 * takes a ticket at *cnt; the first K to arrive (tickets 0 .. K - 1) merge a slice of the
 * row's heads each (pd_merge_slice): each runs the merge once without storing (its code then
 * in the SM's instruction cache, which the decode kernels' large loops leave cold), waits until
 * all nsp arrived, then merges. Session 17: before, the last K to arrive merged at once, cold
 * (the dense fp8 T = 1 decode ~1.5% slower; docs/gpu-log/attn.md). The waiting is safe because
 * the launcher takes this path only when the grid fits the SMs' block slots in one wave (every
 * block is resident or will be: at most K per row wait). The last to arrive resets the counter
 * for the next launch (session 16: no second count on the way out); a waiting block leaves
 * its poll when it reads the full count or the reset (its own count made it >= 1, and a later
 * launch cannot count before this grid ended). nj: the row's blocks holding chunks; sh: as
 * pd_merge_slice's. */
static __device__ void pd_split_merge(m3_bf16 *orow, const float *po, const float *pml, size_t s0,
                                      int nj, int hq, unsigned int nsp, unsigned int *cnt, int K,
                                      float *sh, int tid, int nt) {
    __shared__ unsigned int tk_sh;
    __threadfence();
    __syncthreads();
    if (tid == 0) tk_sh = atomicAdd(cnt, 1u);
    __syncthreads();
    const unsigned int tk = tk_sh;
    const bool last = tk == nsp - 1;
    if (last && tid == 0) {
        __threadfence();
        *reinterpret_cast<volatile unsigned int *>(cnt) = 0u;
    }
    if (tk >= (unsigned int)K) return;
    const int r = (int)tk, h0 = r * hq / K, h1 = (r + 1) * hq / K;
    if (!last) { /* (nsp > K on the launcher's path: the last to arrive never merges) */
        pd_merge_slice(orow, po, pml, s0, nj, hq, h0, h1, sh, tid, nt, false);
        if (tid == 0)
            for (;;) {
                const unsigned int v = pd_ld_acq(cnt);
                if (v == 0u || v >= nsp) break;
                __nanosleep(32);
            }
    }
    __syncthreads();
    __threadfence();
    pd_merge_slice(orow, po, pml, s0, nj, hq, h0, h1, sh, tid, nt, true);
}

/* The decode kernels' key list (pd_part_k, pd8_part_k; one copy since session 13), once
 * selsh holds the row's selection (sparse) and a barrier passed: the row's key count into
 * *n_sh and, sparse, the physical order of ref's m3_kv_sparse_table expansion into blist (as
 * pf_part_k: the selected full blocks before the own one in selection or id order, duplicates
 * kept, the own block last when selected, truncated at the context) as physical ids (the
 * table bt's entries, loaded before the ranking's barrier: since session 15 the kernels read
 * blist's ids, one dependent table load less in their prologue); nkw (non-NULL): the count for
 * pf_merge_k too. PD_W x 32 threads; ends with a barrier. */
static __device__ void pd_keys(bool sparse, const int *selsh, int width, int p, int Bs,
                               bool sel_order, const int32_t *bt, int *blist, int *vfl, int *n_sh,
                               int *nkw, int tid) {
    constexpr int nt = PD_W * 32;
    static_assert(PG_MAX_SEL <= 2 * nt, "pd_keys: two selection entries a thread");
    if (!sparse) {
        if (tid == 0) {
            *n_sh = p + 1;
            if (nkw) *nkw = p + 1;
        }
    } else {
        const int bp = p / Bs;
        int ph[2] = {0, 0}, has = 0;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = tid + r * nt;
            if (i >= width) break;
            const int b = selsh[i];
            const bool v = b >= 0 && b < bp;
            vfl[i] = v;
            has |= b == bp;
            if (v) ph[r] = bt[b];
        }
        const int own = tid == 0 ? bt[bp] : 0; /* (the position's block is in the table) */
        const int last = __syncthreads_or(has);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = tid + r * nt;
            if (i >= width) break;
            if (vfl[i]) {
                const int b = selsh[i];
                int at = 0;
                if (sel_order)
                    for (int j = 0; j < i; j++) at += vfl[j];
                else
                    for (int j = 0; j < width; j++)
                        at += vfl[j] && (selsh[j] < b || (selsh[j] == b && j < i));
                blist[at] = ph[r];
            }
        }
        if (tid == 0) {
            int nf = 0;
            for (int j = 0; j < width; j++) nf += vfl[j];
            int n;
            if (last) {
                blist[nf] = own;
                n = nf * Bs + (p - Bs * bp + 1);
            } else {
                n = nf * Bs < p + 1 ? nf * Bs : p + 1;
            }
            *n_sh = n;
            if (nkw) *nkw = n;
        }
    }
    __syncthreads();
}

template <bool FP8>
static __global__ void __launch_bounds__(PD_W * 32, PD_WPS / PD_W)
    pd_part_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT q, int ld_q,
              m3_gpu_attn_paged_src s, const int32_t *M3_RESTRICT pos, int t0, int n_tok,
              const int32_t *M3_RESTRICT topk, int width, float *M3_RESTRICT po,
              float *M3_RESTRICT pml, int *M3_RESTRICT nkeys, pf_cfg c) {
#if M3_HAVE_MMA
    if (FP8 && !M3_HAVE_FP8_CVT) __trap(); /* the launcher takes this kernel for e4m3fn only */
    extern __shared__ __align__(16) unsigned char pf_raw[];
    constexpr int EB = FP8 ? 1 : 2, XC = 16 / EB;
    constexpr int UK = FP8 ? FA_MAX_DH / 64 : FA_MAX_DH / 32; /* 16-byte K units per lane and key */
    constexpr int PF = FP8 ? PD_PF8 : PD_PF, PV = FP8 ? PD_PV8 : PD_PF; /* ring depths */
    const int hq = c.hq, ch = c.ch, Bs = s.g.block;
    constexpr int Dh = FA_MAX_DH; /* the launcher ensures c.Dh == 128 */
    /* Q A fragments [k-step][lane] (permuted as the K units' dims), built from the rows staged
     * in the warps' areas */
    uint4 *qf = reinterpret_cast<uint4 *>(pf_raw);
    unsigned char *wraw = pf_raw + (size_t)16 * Dh * 2;
    uint16_t *qs = reinterpret_cast<uint16_t *>(wraw); /* [16][Dh] Q */
    const size_t WB = pd_warp_bytes(c);
    __shared__ int blist[PG_MAX_SEL], selsh[PG_MAX_SEL], vfl[PG_MAX_SEL];
    __shared__ int n_sh;
    __shared__ float wml[PD_W][2][16]; /* the warps' running M and L per head */

    const int ci = (int)blockIdx.x, g = (int)blockIdx.y, tl = (int)blockIdx.z, t = t0 + tl;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    m3_pdl_trigger(); /* a programmatic dependent launch, as pd8_part_k */
    s.bt += (int64_t)t * s.bt_ld; /* a decode batch: the token's own sequence's table */
    if (c.spec) {
        /* one token of a dense row: the warp's first chunk assumed full and in the table, its
         * first K groups (a page's dim-unit runs) into L2 before the wait (a prefetch: the
         * reads after the wait see any write of the launch before) */
        const int cc = ci * c.cpb + warp, k = cc * ch;
        if (cc < c.nchx && cc < (ci + 1) * c.cpb && k < s.n_logical * Bs) {
            const int kb = k / Bs, Pv = s.view == M3_KV_VIEW_BLOCK ? Bs : s.g.page;
            int64_t ko, vo, so;
            pf_offs<XC>(s, s.bt[kb] * Bs + (k - kb * Bs), g, ko, vo, so);
            if (lane < Dh / XC)
                pd_l2(reinterpret_cast<const unsigned char *>(s.k) + (ko + (int64_t)lane * Pv * XC) * EB,
                      (uint32_t)((Pv < 32 ? 16 : 32) * XC * EB));
        }
    }
    m3_pdl_wait();
    const int p = pos[t];
    const bool sparse = topk != NULL;
    const m3_bf16 *qg = q + (size_t)t * ld_q + (size_t)g * hq * Dh;
    const int nq = hq * Dh; /* the launcher ensures c.qvec */
    for (int e = tid; e < 16 * Dh / 8; e += (PD_W * 32)) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (e < nq / 8) v = *reinterpret_cast<const uint4 *>(qg + (size_t)e * 8);
        *reinterpret_cast<uint4 *>(qs + (size_t)e * 8) = v;
    }
    if (sparse)
        for (int i = tid; i < width; i += (PD_W * 32)) selsh[i] = topk[((int64_t)g * n_tok + t) * width + i];
    __syncthreads();
    pd_keys(sparse, selsh, width, p, Bs, c.sel_order, s.bt, blist, vfl, &n_sh,
            ci == 0 && !c.fused ? nkeys + (size_t)tl * c.Hkv + g : NULL, tid);
    for (int e = tid; e < PD_KS * 32; e += (PD_W * 32)) {
        const int s2 = e / 32, ln = e % 32, r = ln >> 2, tr = ln & 3;
        const int D = FP8 ? 64 * (s2 / 4) + 16 * tr + 4 * (s2 % 4) : 32 * (s2 / 2) + 8 * tr + 4 * (s2 % 2);
        qf[e] = make_uint4(*reinterpret_cast<const uint32_t *>(qs + r * Dh + D),
                           *reinterpret_cast<const uint32_t *>(qs + (r + 8) * Dh + D),
                           *reinterpret_cast<const uint32_t *>(qs + r * Dh + D + 2),
                           *reinterpret_cast<const uint32_t *>(qs + (r + 8) * Dh + D + 2));
    }
    __syncthreads();
    const int n = n_sh, nch = (n + ch - 1) / ch, cb = ci * c.cpb, ce = min(nch, cb + c.cpb);
    const size_t tg = (size_t)tl * c.Hkv + g, slot0 = tg * c.nsp;
    const unsigned char *kbase = reinterpret_cast<const unsigned char *>(s.k);
    const unsigned char *vbase = reinterpret_cast<const unsigned char *>(s.v);
    const int Pv = s.view == M3_KV_VIEW_BLOCK ? Bs : s.g.page;
    const int kl = 4 * (gq >> 1) + (gq & 1); /* the lo n-tile's key of this lane's K loads */
    float4 *sw = reinterpret_cast<float4 *>(wraw + (size_t)warp * WB);
    float4 *aw = reinterpret_cast<float4 *>(wraw + (size_t)warp * WB + pd_s_bytes(c));
    float Mr[2] = {-INFINITY, -INFINITY}, Lr[2] = {0.0f, 0.0f};
    /* lane l: the physical block of group l of chunk cc (loaded a chunk ahead) */
    auto phys = [&](int cc) {
        const int k = cc * ch + 16 * lane;
        if (cc >= ce || k >= n) return 0;
        const int kb = k / Bs;
        return sparse ? blist[kb] : s.bt[kb];
    };
    int phn = phys(cb + warp);
    for (int cc = cb + warp; cc < ce; cc += PD_W) {
        const int k0 = cc * ch, nk = min(ch, n - k0), ng = (nk + 15) / 16;
        /* lane l: the element offsets of group l's first key (K, V, scale) */
        int64_t gko = 0, gvo = 0, gso = 0;
        if (lane < ng) {
            const int k = k0 + 16 * lane, kb = k / Bs;
            pf_offs<XC>(s, phn * Bs + (k - kb * Bs), g, gko, gvo, gso);
        }
        /* the next chunk's first physical block (bf16: its first K groups are prefetched) */
        const int phx = FP8 ? 0 : __shfl_sync(0xffffffffu, phn, 0);
        phn = phys(cc + PD_W);
        /* bf16: this chunk's first V groups (loaded from pass 1's last group on) into L2 now;
         * the next chunk's first K groups at pass 2 (below): a warp's register ring has one
         * group in flight, so each chunk started with two waits on DRAM */
        if (!FP8) {
            const int64_t vo = __shfl_sync(0xffffffffu, gvo, 0);
            const int nv = Pv >= 32 ? min(ng, 2) : 1; /* groups in this page */
            if (lane == 0) pd_l2(vbase + vo * EB, (uint32_t)(nv * 16 * Dh * EB));
        }
        /* pass 1: S of each 16-key group into the warp's area; the row maxima */
        float mx0 = -INFINITY, mx1 = -INFINITY;
        constexpr int KD = PF + 1; /* ring of K groups: PF in flight while one is scored */
        uint4 kr[KD][2][UK];
        float4 ksr[KD]; /* fp8: the group's K scales, with its K */
        typedef typename pd_vunit<FP8>::t vunit;
        constexpr int VD = PV + 1; /* ring of V groups: PV in flight (the first PV loaded during
                                    * pass 1's tail) */
        vunit vr[VD][PD_NT];
        float4 vsr[VD]; /* fp8: the group's V scales, with its V */
        auto kload = [&](uint4 (&w)[2][UK], float4 &ks, int gr) {
            const int64_t ko = __shfl_sync(0xffffffffu, gko, gr);
            if (FP8) ks = *reinterpret_cast<const float4 *>(s.k_scale + __shfl_sync(0xffffffffu, gso, gr) + 4 * tq);
            const unsigned char *kp = kbase + (ko + (int64_t)kl * XC) * EB;
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int u = 0; u < UK; u++) {
                    if ((4 * u + tq) * XC >= Dh) continue;
                    w[h][u] = *reinterpret_cast<const uint4 *>(kp + ((int64_t)h * 2 * XC + (int64_t)(4 * u + tq) * Pv * XC) * EB);
                }
        };
        auto vload = [&](vunit (&w)[PD_NT], float4 &vs, int gr) {
            const int64_t vo = __shfl_sync(0xffffffffu, gvo, gr);
            if (FP8) vs = *reinterpret_cast<const float4 *>(s.v_scale + __shfl_sync(0xffffffffu, gso, gr) + 4 * tq);
#pragma unroll
            for (int u = 0; u < PD_NT; u++) {
                const int d = 8 * u + gq;
                if (8 * u >= Dh) continue;
                if (FP8)
                    w[u] = *reinterpret_cast<const vunit *>(vbase + vo + (int64_t)d * 16 + 4 * tq);
                else
                    w[u] = *reinterpret_cast<const vunit *>(
                        vbase + (vo + (int64_t)(tq >> 1) * Dh * 8 + (int64_t)d * 8 + (tq & 1) * 4) * 2);
            }
        };
        uint4 qreg[PD_KS]; /* Q A fragments of the chunk (from shared memory per k-step: slower) */
#pragma unroll
        for (int s2 = 0; s2 < PD_KS; s2++) qreg[s2] = qf[s2 * 32 + lane];
        auto kstep = [&](const uint4 (&kw)[2][UK], const float4 &ksg, int gr) {
            float c8[2][2][4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int a = 0; a < 2; a++) c8[h][a][0] = c8[h][a][1] = c8[h][a][2] = c8[h][a][3] = 0.0f;
#pragma unroll
            for (int s2 = 0; s2 < PD_KS; s2++) {
                if (s2 * 16 >= Dh) break;
                const uint32_t qa[4] = {qreg[s2].x, qreg[s2].y, qreg[s2].z, qreg[s2].w};
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint4 w = kw[h][FP8 ? s2 / 4 : s2 / 2];
                    uint32_t b[2];
                    if (FP8) {
                        const int r = s2 % 4;
                        const uint32_t x = r == 0 ? w.x : r == 1 ? w.y : r == 2 ? w.z : w.w;
                        b[0] = pf_b2(x, NULL, true), b[1] = pf_b2(x >> 16, NULL, true);
                        m3_mma_bf16_16816(c8[h][s2 & 1], qa, b);
                    } else {
                        if (s2 % 2 == 0) b[0] = w.x, b[1] = w.y;
                        else b[0] = w.z, b[1] = w.w;
                        m3_mma_bf16_16816(c8[h][s2 & 1], qa, b);
                    }
                }
            }
            float ks4[4] = {1.0f, 1.0f, 1.0f, 1.0f};
            const int kq = 16 * gr + 4 * tq; /* this lane's first key of the group */
            if (FP8) {
                const float4 a = ksg;
                ks4[0] = a.x, ks4[1] = a.y, ks4[2] = a.z, ks4[3] = a.w;
            }
            float z[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int e = 2 * h + (i & 1);
                    float d = c8[h][0][i] + c8[h][1][i];
                    if (FP8) d *= ks4[e];
                    const float zz = c.eager ? m3_round_bf16(m3_round_bf16(d) * c.scale) : d * c.scale;
                    z[h][i] = kq + e < nk ? zz : -INFINITY;
                }
            mx0 = fmaxf(mx0, fmaxf(fmaxf(z[0][0], z[0][1]), fmaxf(z[1][0], z[1][1])));
            mx1 = fmaxf(mx1, fmaxf(fmaxf(z[0][2], z[0][3]), fmaxf(z[1][2], z[1][3])));
            sw[(gr * 2) * 32 + lane] = make_float4(z[0][0], z[0][1], z[0][2], z[0][3]);
            sw[(gr * 2 + 1) * 32 + lane] = make_float4(z[1][0], z[1][1], z[1][2], z[1][3]);
        };
#pragma unroll
        for (int j = 0; j < PF; j++)
            if (j < ng) kload(kr[j], ksr[j], j);
        for (int g0 = 0; g0 < ng; g0 += KD)
#pragma unroll
            for (int j = 0; j < KD; j++)
                if (g0 + j < ng) {
                    const int nx = g0 + j + PF;
                    if (nx < ng) {
                        kload(kr[(j + PF) % KD], ksr[(j + PF) % KD], nx);
                    }
                    /* pass 2's first groups: V group v in pass 1's iteration ng - PV + v (the
                     * first iteration for those before it) */
#pragma unroll
                    for (int v = 0; v < PV; v++)
                        if (v < ng && (v + ng - PV == g0 + j || (g0 + j == 0 && v + ng - PV < 0)))
                            vload(vr[v], vsr[v], v);
                    kstep(kr[j], ksr[j], g0 + j);
                }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        __syncwarp();
        if (!FP8 && cc + PD_W < ce) { /* the next chunk's first K groups (a page's dim-unit runs) */
            const int k = (cc + PD_W) * ch, kb = k / Bs;
            const int nkn = min(ch, n - k) < 32 || Pv < 32 ? 16 : 32;
            int64_t ko, vo, so;
            pf_offs<XC>(s, phx * Bs + (k - kb * Bs), g, ko, vo, so);
            if (lane < Dh / XC)
                pd_l2(kbase + (ko + (int64_t)lane * Pv * XC) * EB, (uint32_t)(nkn * XC * EB));
        }
        /* pass 2: O = P V, the next group's V in flight */
        float o[PD_NT][4];
#pragma unroll
        for (int u = 0; u < PD_NT; u++) o[u][0] = o[u][1] = o[u][2] = o[u][3] = 0.0f;
        float l0 = 0.0f, l1 = 0.0f;
        auto vstep = [&](const vunit (&vw)[PD_NT], const float4 &vsg, int gr) {
            const int kq = 16 * gr + 4 * tq;
            const float4 zl = sw[(gr * 2) * 32 + lane], zh = sw[(gr * 2 + 1) * 32 + lane];
            float ex[2][4] = {{expf(zl.x - mx0), expf(zl.y - mx0), expf(zl.z - mx1), expf(zl.w - mx1)},
                              {expf(zh.x - mx0), expf(zh.y - mx0), expf(zh.z - mx1), expf(zh.w - mx1)}};
            l0 += (ex[0][0] + ex[0][1]) + (ex[1][0] + ex[1][1]);
            l1 += (ex[0][2] + ex[0][3]) + (ex[1][2] + ex[1][3]);
            float vs4[4] = {1.0f, 1.0f, 1.0f, 1.0f};
            if (FP8) {
                const float4 v = vsg;
                vs4[0] = kq < nk ? v.x : 0.0f, vs4[1] = kq + 1 < nk ? v.y : 0.0f;
                vs4[2] = kq + 2 < nk ? v.z : 0.0f, vs4[3] = kq + 3 < nk ? v.w : 0.0f;
            }
            uint32_t a[4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int i = 0; i < 4; i++) ex[h][i] *= FP8 ? vs4[2 * h + (i & 1)] : 1.0f;
            a[0] = pack_bf16(ex[0][0], ex[0][1]), a[1] = pack_bf16(ex[0][2], ex[0][3]);
            a[2] = pack_bf16(ex[1][0], ex[1][1]), a[3] = pack_bf16(ex[1][2], ex[1][3]);
            const bool tail = 16 * gr + 16 > nk; /* keys past the list: their V elements zeroed */
#pragma unroll
            for (int u = 0; u < PD_NT; u++) {
                if (8 * u >= Dh) continue;
                uint32_t b[2];
                if constexpr (FP8) {
                    uint32_t x = vw[u];
                    if (tail)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            if (kq + e >= nk) x &= ~(0xFFu << (8 * e));
                    b[0] = pf_b2(x, NULL, true), b[1] = pf_b2(x >> 16, NULL, true);
                    m3_mma_bf16_16816(o[u], a, b);
                } else {
                    uint2 x = vw[u];
                    if (tail) {
                        if (kq >= nk) x.x &= 0xFFFF0000u;
                        if (kq + 1 >= nk) x.x &= 0x0000FFFFu;
                        if (kq + 2 >= nk) x.y &= 0xFFFF0000u;
                        if (kq + 3 >= nk) x.y &= 0x0000FFFFu;
                    }
                    b[0] = x.x, b[1] = x.y;
                    m3_mma_bf16_16816(o[u], a, b);
                }
            }
        };
        for (int g0 = 0; g0 < ng; g0 += VD)
#pragma unroll
            for (int j = 0; j < VD; j++)
                if (g0 + j < ng) {
                    if (g0 + j + PV < ng) vload(vr[(j + PV) % VD], vsr[(j + PV) % VD], g0 + j + PV);
                    vstep(vr[j], vsr[j], g0 + j);
                }
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        /* chunk done: A_j into the warp's running merge (pf_part_k's rule), A in shared memory */
        const bool first = Mr[0] == -INFINITY;
        float wa[2], wb[2], ll[2] = {l0, l1}, rl[2] = {__frcp_rn(l0), __frcp_rn(l1)};
#pragma unroll
        for (int r2 = 0; r2 < 2; r2++) {
            const float m = r2 ? mx1 : mx0, Mn = fmaxf(Mr[r2], m);
            wa[r2] = Mr[r2] == -INFINITY ? 0.0f : expf(Mr[r2] - Mn), wb[r2] = expf(m - Mn);
            Lr[r2] = Lr[r2] * wa[r2] + ll[r2] * wb[r2], Mr[r2] = Mn;
        }
#pragma unroll
        for (int u = 0; u < PD_NT; u++) {
            if (8 * u >= Dh) continue;
            float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (!first) {
                const float4 v = aw[u * 32 + lane];
                x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < 4; i += 2) {
                const int r2 = i >> 1;
                float A0 = o[u][i], A1 = o[u][i + 1];
                if (c.part > 0) { /* l bf16(O / l) (l >= 1): the quotients as pd8_part_k's */
                    float q0 = pd8_div(A0, ll[r2], rl[r2]), q1 = pd8_div(A1, ll[r2], rl[r2]);
                    round_bf16x2(q0, q1);
                    A0 = ll[r2] * q0, A1 = ll[r2] * q1;
                }
                x[i] = first ? A0 * wb[r2] : x[i] * wa[r2] + A0 * wb[r2];
                x[i + 1] = first ? A1 * wb[r2] : x[i + 1] * wa[r2] + A1 * wb[r2];
            }
            aw[u * 32 + lane] = make_float4(x[0], x[1], x[2], x[3]);
        }
    }
    /* the block's warps' (M, L, A) folded in warp order */
    if (tq == 0) {
        wml[warp][0][gq] = Mr[0], wml[warp][0][gq + 8] = Mr[1];
        wml[warp][1][gq] = Lr[0], wml[warp][1][gq + 8] = Lr[1];
    }
    __syncthreads();
    m3_bf16 *orow = out + (size_t)t * c.H * Dh + (size_t)g * hq * Dh;
    const size_t sl0 = (slot0 + ci) * hq;
    __shared__ float wx[PD_W * 16 + 32];
    if (cb < ce || c.nsp == 1)
        pd_fold(wraw, WB, pd_s_bytes(c), wml, wx, orow, po, pml, sl0, hq, c.nsp, tid, PD_W * 32);
    if (c.nsp == 1) return;
    if (c.split > 0) {
        pd_split_merge(orow, po, pml, slot0, (nch + c.cpb - 1) / c.cpb, hq, (unsigned int)c.nsp,
                       &c.cnt[tg], c.split, reinterpret_cast<float *>(wraw), tid, PD_W * 32);
        return;
    }
    if (!c.fused) return;
    /* the last block of this (token, kv head) to finish merges (pf_part_k's merge) */
    if (!attn_last_block(&c.cnt[tg], gridDim.x)) return;
    pf_row_merge(orow, po, pml, slot0, (nch + c.cpb - 1) / c.cpb, hq, Dh,
                 reinterpret_cast<float *>(wraw), tid, PD_W * 32);
#else
    (void)out; (void)q; (void)ld_q; (void)s; (void)pos; (void)t0; (void)n_tok; (void)topk;
    (void)width; (void)po; (void)pml; (void)nkeys; (void)c;
#endif
}


/* ---- §4.9 fp8 decode kernel pd8_part_k (session 7; fp16 mma since session 8) ------------
 * pd_part_k's chunks, key permutation, passes, P' codes, rounding points and merges for fp8
 * e4m3fn elements under the §4.9 emulation, with K and V staged through a per-warp ring of
 * PD8_NS shared-memory slots by cp.async instead of register rings. A slot holds one 16-key
 * group's K codes with its 16 K and V scales, or its V codes with its V scales (2 KB + 128
 * bytes); a warp's loads are one stream (per chunk its K groups, then its V groups, then the
 * next chunk's), PD8_NS items in flight: a slot is refilled as soon as its fragments are in
 * registers, with only warp barriers (cp.async.wait_group + __syncwarp). K slots are
 * swizzled so the fragment reads are conflict-free: unit (dim unit d, key k) at
 * d * 16 + (k ^ 2 (d % 4)). S parks in the warp's area as in pd_part_k; the running A is in
 * registers and goes to the same area for the block's fold. Pass 2 takes two groups per
 * step: both groups' P' codes, and when the two lie in one §4.9 tile (the tile >= 32 keys:
 * same M) one fp32 sum of both groups' exact products before the scaling by M / FP8_MAX
 * (ref's structure: the tile's sum, then the scale), else each group scaled on its own.
 * Quotients (P' and M / FP8_MAX, the partition output O / l) come from the correctly rounded
 * reciprocal and one FMA residual step (Markstein: the correctly rounded quotient for
 * normal ones; P' below the normal range is an fp8 zero either way), i.e. ref's divisions.
 * Products on fp16 mma.sync m16n8k16 (exact: every e4m3 value is an fp16 normal or zero;
 * fp32 sums): K, V and P' codes unpacked once each by cvt.rn.f16x2.e4m3x2, Q's fp16
 * fragments read from shared memory per k-step (session 8: the e4m3 m16n8k32 mma.sync of
 * session 7 is code unpacks plus fp16 mma on sm_90, unpacking Q's codes for every K group
 * and P's for every n-tile; 1.2-1.3x slower at T = 64 and prefill). Session 9 (ncu source
 * counters: 815 executed instructions per 16-key group, ~15% of them the block's prologue
 * and fold): fp8(q) by the saturating hardware cast inside the fragment build, issued after
 * the rings' first copies (the software rounding was ~7%), pd_fold, paired code unpacks
 * (m3_e4m3x4_to_f16x2: no shift per upper half), V words by ldmatrix, one M / factor / reciprocal per
 * tile pair, and the second group of a pass-2 step always multiplied (a lone last group
 * adds zero products: no predicated mma.sync, whose warp syncs cost 16 instructions a
 * group): 646 instructions a group. Bulk-copy rings (cp.async.bulk + mbarriers, one lane
 * issuing, 288-byte padded K units) measured 15-25% slower. Session 10 (ncu source counters
 * of the sparse T = 64 launch: ~690 instructions a group, the ring issue inlined three times
 * with 64-bit address arithmetic per copy): the view's page a template parameter (16, 128;
 * 0: run-time), so a lane's K copies are one base plus immediates into two lane-constant
 * swizzled offsets; pass 1 reads group gr + 1's fragments before group gr's products; each
 * chunk's tile constants (M + 1e-8, its reciprocal, M / FP8_MAX) once per group lane after
 * pass 1, shuffled in pass 2, whose two groups a step run straight through (a missing second
 * group as z = -inf with zero scales and codes). Both pass-2 slots acquired at once with the
 * two refills after them measured ~1% slower. Session 12 (one process each, B=64 sparse /
 * dense T = 1): Q's fragments in registers per chunk 2-4% slower (spills); K or V code
 * unpacks by integer ops ((c & 0x7F) << 7 | (c & 0x80) << 8: 2^-8 times the value as fp16,
 * the 2^8 folded into the scales; the same bits) 5-16% slower; pass 2's V a step or a group
 * ahead 5-27% slower: the kernel is latency-bound and each added instruction or register
 * costs. Rows of many partials merge in the kernel (pd_split_merge). Session 13: P by
 * pd8_ex2e (expf's 8 instructions were ~7% of a group's; B=64 sparse 3%, dense T = 1 1%
 * faster); the same chunks as warpgroup MMA (wgmma, e4m3 operands from shared memory, a
 * 64-key tile a step) measured 31-48% slower, and fp8 wgmma's accumulation moved scores enough
 * to put §4.9 cases above the NMSE bound (docs/gpu-log/attn.md). Session 14 (ncu source counters of the
 * B=64 sparse decode: ~620 instructions a group; 13% of the warps' time in the prologue, 12% in
 * the chunk ends' straight-line fold, mostly instruction-cache misses, ~10% waiting for ring
 * data): without tile pairs (16-key tiles: the sparse layers), pass 1.5 forms every group's P'
 * codes and the row sums between pass 1 and pass 2, from S and the V scales that pass 1 parks
 * (vsw; V items then carry no scales), writing the codes in place of S; pass 2 then multiplies
 * only (B=64 sparse 2% faster; with tile pairs 2% slower, so dense layers keep P' in pass 2).
 * Measured slower: L2 prefetches of a chunk's K or V at its entry (8-20%), the chunk-end fold as
 * a rolled loop through the warp's area (spills), pass 1 unrolled by 2 (spills). */
#define PD8_NS 4             /* ring slots per warp (4 groups of K or V in flight; 5: no faster) */
#define PD8_SB (2048 + 128) /* slot bytes: 16 keys x 128 codes, then 2 x 16 fp32 scales */

/* the warp's S / A area: S [ch/16 groups][lo, hi][32 lanes] float4, or A [Dh/8][32] float4 */
static __host__ __device__ inline size_t pd8_sa_bytes(const pf_cfg &c) {
    const size_t s = (size_t)(c.ch / 16) * 2 * 32 * 16, a = (size_t)(FA_MAX_DH / 8) * 32 * 16;
    return s > a ? s : a;
}
/* the warp's V scales of a chunk, parked by pass 1 for pass 1.5's P' codes: [ch/16 groups][4]
 * float4 (tiles of 16 keys only: the instances without tile pairs) */
static __host__ __device__ inline size_t pd8_vs_bytes(const pf_cfg &c) {
    return c.tile >= 32 ? 0 : (size_t)(c.ch / 16) * 64;
}
/* Q's fp16 fragments (4 KB), then the warps' S / A areas, V scales and rings */
static size_t pd8_smem_bytes(const pf_cfg &c) {
    size_t a = (size_t)PD_W * (pd8_sa_bytes(c) + pd8_vs_bytes(c) + (size_t)PD8_NS * PD8_SB);
    const size_t fm = ((size_t)3 * 16 * PF_FUSE_MAX + 16) * 4;
    if (a < fm) a = fm;
    return (size_t)16 * FA_MAX_DH * 2 + a;
}

#if M3_HAVE_FP8_CVT
/* e4m3fn codes of (lo, hi), lo in the low byte (rn, satfinite: the emulation's SATURATE;
 * §4.9's values never exceed FP8_MAX) */
static __device__ __forceinline__ uint32_t pd8_e4m3x2(float lo, float hi) {
    uint32_t d;
    asm("{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, %1, %2; cvt.u32.u16 %0, t; }"
        : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
#endif

/* 16 bytes global -> shared (a 32-bit shared address), asynchronously, L2 only; hint: with
 * the L2 cache policy pol */
static __device__ __forceinline__ void pd8_cp16(uint32_t dst, const void *src, uint64_t pol, bool hint) {
    if (hint)
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(pol));
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
/* an L2 evict-first policy for the ring's copies where every key is read once a launch
 * (c.l2ef; session 17: the 138 MB a dense fp8 T = 1 decode streams through the 50 MB L2 no
 * longer evict the lines read again every launch: q, the positions, the table, the partials,
 * the code; ~1-1.5% faster. An evict_normal policy measured ~8% slower than no hint) */
static __device__ __forceinline__ uint64_t pd8_policy() {
    uint64_t a;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(a));
    return a;
}

/* TPAIR: c.tile >= 32 (pairs of 16-key groups lie in one §4.9 tile); PVC: the view's page when
 * it is 16 or 128 (the M3 layers' views; the launcher checks it), else 0 (a run-time page);
 * SP: one token of a dense row (session 17): before the grid wait each lane loads its group's
 * table entries of the warp's first two chunks (m3_gpu.h's ordering allows the table) and
 * lanes 0-7 prefetch the first chunk's first 4 K groups (a dim unit's 64 keys each) into L2 (a
 * prefetch: reads after the wait see any write of the launch before; the previous launch's
 * merge leaves DRAM idle); the dense fp8 T = 1 decode ~2.5% faster with the prefetch (the
 * table entries alone measured no clear gain; the prefetch needs the first). A separate
 * instance: with this code in the instance the B = 64 batch shares, that batch ran 3-5%
 * slower (session 17, batches 4-5) */
/* P = e^x as §4.9 step 3 forms it (aiter's exp2((s - m) log2e)): the product rounded to fp32,
 * then the hardware's ex2.approx (flushing results below 2^-126, whose P' codes are 0 anyway).
 * 2 instructions where expf takes 8 (session 13: pd8_part_k's B=64 sparse decode 3% faster);
 * within a few fp32 ulp of ref's expf for the |x| < ~12 where P' codes are nonzero */
static __device__ __forceinline__ float pd8_ex2e(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}
template <bool TPAIR, int PVC, bool SP = false>
static __global__ void __launch_bounds__(PD_W * 32, PD_WPS / PD_W)
    pd8_part_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT q, int ld_q,
               m3_gpu_attn_paged_src s, const int32_t *M3_RESTRICT pos, int t0, int n_tok,
               const int32_t *M3_RESTRICT topk, int width, float *M3_RESTRICT po,
               float *M3_RESTRICT pml, int *M3_RESTRICT nkeys, pf_cfg c) {
#if M3_HAVE_MMA && M3_HAVE_FP8_CVT
    extern __shared__ __align__(16) unsigned char pf_raw[];
    constexpr int Dh = FA_MAX_DH; /* the launcher ensures c.Dh == 128 */
    constexpr int NT = PD_W * 32, NS = PD8_NS, SB = PD8_SB, SCO = 2048;
    /* pass 1.5 (session 14): the P' codes of a chunk formed between pass 1 and pass 2, for
     * 16-key tiles (the sparse layers' pages); tile pairs keep them in pass 2 */
    constexpr bool PP = !TPAIR;
    const int hq = c.hq, ch = c.ch, Bs = s.g.block;
    unsigned char *wraw = pf_raw + (size_t)16 * Dh * 2;
    uint16_t *qs = reinterpret_cast<uint16_t *>(wraw); /* [16][Dh] fp8(q) as fp16 */
    const size_t SA = pd8_sa_bytes(c), VSB = pd8_vs_bytes(c), WB = SA + VSB + (size_t)NS * SB;
    __shared__ int blist[PG_MAX_SEL], selsh[PG_MAX_SEL], vfl[PG_MAX_SEL];
    __shared__ int n_sh;
    __shared__ float wml[PD_W][2][16]; /* the warps' running M and L per head */

    const int ci = (int)blockIdx.x, g = (int)blockIdx.y, tl = (int)blockIdx.z, t = t0 + tl;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    /* a programmatic dependent launch (pf_launch): the next launch may start now (it waits for
     * this grid's end before it reads or writes what this grid writes); q, the position and
     * the selection may be the launch before's */
    m3_pdl_trigger();
    s.bt += (int64_t)t * s.bt_ld; /* a decode batch: the token's own sequence's table */
    const bool sparse = topk != NULL;
    /* SP: lane l's table entries of group l of the warp's first two chunks (pok: inside the
     * table; entries past it are loaded after the wait as before) */
    const int pc0 = ci * c.cpb + warp, pk0 = (pc0 * c.ch + 16 * lane) / Bs,
              pk1 = ((pc0 + PD_W) * c.ch + 16 * lane) / Bs;
    const bool pre = SP && !sparse, pok0 = pre && pk0 < s.n_logical, pok1 = pre && pk1 < s.n_logical;
    const int pb0 = pok0 ? s.bt[pk0] : 0, pb1 = pok1 ? s.bt[pk1] : 0;
    if (pre) { /* the first chunk's first 4 K groups into L2 (the chunk assumed in the row) */
        const int b0 = __shfl_sync(0xffffffffu, pb0, 0);
        const bool ok0 = __shfl_sync(0xffffffffu, (int)pok0, 0) != 0;
        if (ok0 && b0 >= 0 && pc0 < c.nchx && pc0 < (ci + 1) * c.cpb && lane < Dh / 16) {
            const int k = pc0 * c.ch, kb = k / Bs, Pq = s.view == M3_KV_VIEW_BLOCK ? Bs : s.g.page;
            int64_t ko, vo, so;
            pf_offs<16>(s, b0 * Bs + (k - kb * Bs), g, ko, vo, so);
            pd_l2(reinterpret_cast<const unsigned char *>(s.k) + ko + (int64_t)lane * Pq * 16, 1024u);
        }
    }
    m3_pdl_wait();
    const int p = pos[t];
    const m3_bf16 *qg = q + (size_t)t * ld_q + (size_t)g * hq * Dh;
    const int nq = hq * Dh; /* the launcher ensures c.qvec */
    for (int e = tid; e < 16 * Dh / 8; e += NT) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (e < nq / 8) v = *reinterpret_cast<const uint4 *>(qg + (size_t)e * 8);
        *reinterpret_cast<uint4 *>(qs + (size_t)e * 8) = v;
    }
    if (sparse)
        for (int i = tid; i < width; i += NT) selsh[i] = topk[((int64_t)g * n_tok + t) * width + i];
    __syncthreads();
    /* §4.9: fp8(q) without scale, held as fp16 (exact). Under SATURATE the hardware's
     * saturating cast (cvt.rn.satfinite, e4m3fn) in the fragment build below; else ref's
     * rounding here (the NaN-on-overflow mode), in place */
    const bool hwq = s.ovf == M3_FP8_SATURATE;
    if (!hwq)
        for (int e = tid; e < 16 * Dh; e += NT)
        qs[e] = __half_as_ushort(__float2half_rn(m3_round_fp8(m3_bf16_to_f32(qs[e]), s.g.fp8_kind, s.ovf)));
    pd_keys(sparse, selsh, width, p, Bs, c.sel_order, s.bt, blist, vfl, &n_sh,
            ci == 0 && !c.fused ? nkeys + (size_t)tl * c.Hkv + g : NULL, tid);
    /* Q A fragments of m16n8k16 (fp16 values of the e4m3 codes) in the block's front area,
     * [k-step 2m + hf][lane], k permuted as the K units' dims: k-step (m, hf) takes dims
     * D..D+3, D = 16 (4 (m / 2) + tq) + 8 (m % 2) + 4 hf, as virtual k 2tq, 2tq + 1 (a0 rows
     * gq, a1 rows gq + 8) and 2tq + 8, 2tq + 9 (a2, a3), which is word 2 (m % 2) + hf of the
     * lane's K unit 4 (m / 2) + tq unpacked. Read per k-step (in registers they spill). */
    uint4 *qh = reinterpret_cast<uint4 *>(pf_raw);
    /* a word of 2 fp16 values of fp8(q) at qs + off (hwq: cast from the 2 bf16 there) */
    auto qword = [&](int off) -> uint32_t {
        const uint32_t w = *reinterpret_cast<const uint32_t *>(qs + off);
        if (!hwq) return w;
        return pf_q2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u), s.g.fp8_kind, s.ovf, true);
    };
    auto qfrag = [&]() {
        for (int e = tid; e < 8 * 32; e += NT) {
            const int m = e / 64, hf = (e / 32) % 2, ln = e % 32, r = ln >> 2, tr = ln & 3;
            const int D = 16 * (4 * (m >> 1) + tr) + 8 * (m & 1) + 4 * hf;
            qh[e] = make_uint4(qword(r * Dh + D), qword((r + 8) * Dh + D), qword(r * Dh + D + 2),
                               qword((r + 8) * Dh + D + 2));
        }
        __syncthreads(); /* qh written; qs (warp 0's S area) read before pass 1 parks S there */
    };
    const int n = n_sh, nch = (n + ch - 1) / ch, cb = ci * c.cpb, ce = min(nch, cb + c.cpb);
    const size_t tg = (size_t)tl * c.Hkv + g, slot0 = tg * c.nsp;
    const unsigned char *kbase = reinterpret_cast<const unsigned char *>(s.k);
    const unsigned char *vbase = reinterpret_cast<const unsigned char *>(s.v);
    const int Pv = s.view == M3_KV_VIEW_BLOCK ? Bs : s.g.page;
    const int kl = 4 * (gq >> 1) + (gq & 1); /* the lo n-tile's key of this lane's K fragments */
    const float rfmax = __frcp_rn(c.fmax);
    unsigned char *sa = wraw + (size_t)warp * WB, *ring = sa + SA + VSB;
    float4 *sw = reinterpret_cast<float4 *>(sa), *vsw = reinterpret_cast<float4 *>(sa + SA);
    /* lane l: the physical block of group l of chunk cc (loaded a chunk ahead; sparse: blist
     * holds the physical ids) */
    auto phys = [&](int cc) {
        const int k = cc * ch + 16 * lane;
        if (cc >= ce || k >= n) return 0;
        const int kb = k / Bs;
        return sparse ? blist[kb] : s.bt[kb];
    };
    /* phys of the warp's first two chunks from the entries loaded before the wait */
    auto physp = [&](int cc, bool ok, int pb) {
        if (!ok) return phys(cc);
        return cc >= ce || cc * ch + 16 * lane >= n ? 0 : pb;
    };
    /* the issue cursor: chunk ic, item ij (K groups 0..ing-1, then V groups), lane l holding
     * group l's element offsets (K, V, scale) of chunk ic */
    int ic = cb + warp, ij = 0, ing = 0, phn = physp(ic, pok0, pb0);
    int64_t gko = 0, gvo = 0, gso = 0;
    auto enter = [&](bool first) {
        if (ic >= ce) return;
        const int k0 = ic * ch, nk = min(ch, n - k0);
        ing = (nk + 15) / 16;
        if (lane < ing) {
            const int k = k0 + 16 * lane, kb = k / Bs;
            pf_offs<16>(s, phn * Bs + (k - kb * Bs), g, gko, gvo, gso);
        }
        phn = first ? physp(ic + PD_W, pok1, pb1) : phys(ic + PD_W);
    };
    enter(true);
    unsigned isq = 0, csq = 0; /* items issued / consumed */
    /* the ring's 32-bit shared addresses. A lane's 4 K copies of an item are units (d, k), d =
     * 2 i + lane / 16, k = lane % 16, at 16 d + (k ^ 2 (d % 4)) in the slot: d % 4 is lane / 16
     * for even i and 2 + lane / 16 for odd i, so the destinations are two lane constants plus
     * 512 i, and the sources one base plus i times 32 pages of 16 bytes (immediates when the
     * page is the compile-time PVC; session 9's K item issue was ~55 instructions, mostly
     * 64-bit address arithmetic per copy) */
    const uint32_t ring_s = sh_u32(ring);
    const bool hint = c.l2ef;
    const uint64_t pol = pd8_policy();
    const int khi = lane >> 4, kk16 = lane & 15, pvk = PVC > 0 ? PVC : Pv;
    const uint32_t kde = (uint32_t)(khi * 256 + (kk16 ^ (2 * khi)) * 16),
                   kdo = (uint32_t)(khi * 256 + (kk16 ^ (4 + 2 * khi)) * 16);
    const int ksrc = (khi * pvk + kk16) * 16, kst = 32 * pvk;
    auto issue = [&]() {
        if (ic < ce) {
            const uint32_t dst = ring_s + (isq % NS) * SB;
            const bool kk = ij < ing;
            const int gr = kk ? ij : ij - ing;
            const int64_t so = __shfl_sync(0xffffffffu, gso, gr);
            if (kk) { /* 8 dim units x 16 keys, 16 bytes each */
                const unsigned char *src = kbase + __shfl_sync(0xffffffffu, gko, gr) + ksrc;
                pd8_cp16(dst + kde, src, pol, hint);
                pd8_cp16(dst + kdo + 512, src + kst, pol, hint);
                pd8_cp16(dst + kde + 1024, src + 2 * kst, pol, hint);
                pd8_cp16(dst + kdo + 1536, src + 3 * kst, pol, hint);
                /* lanes 0-3 the K scales, 4-7 the V scales (one branch) */
                const float *sp = (lane < 4 ? s.k_scale : s.v_scale) + so + 4 * (lane & 3);
                if (lane < 8) pd8_cp16(dst + 2048 + 16 * lane, sp, pol, hint);
            } else { /* 128 dims x 16 keys: 2 KB contiguous */
                const unsigned char *vp = vbase + __shfl_sync(0xffffffffu, gvo, gr) + 16 * lane;
#pragma unroll
                for (int i = 0; i < 4; i++) pd8_cp16(dst + 16 * lane + 512 * i, vp + 512 * i, pol, hint);
                if (!PP && lane < 4) pd8_cp16(dst + 2048 + 16 * lane, s.v_scale + so + 4 * lane, pol, hint);
            }
            if (++ij == 2 * ing) {
                ic += PD_W, ij = 0;
                enter(false);
            }
        }
        cp_commit(); /* possibly empty: keeps the wait count uniform */
        isq++;
    };
    /* acquire: the next item's slot, once this lane's and (after the warp barrier) every
     * lane's copies of it landed; release: the slot refilled (every lane read it: the barrier) */
    auto acquire = [&]() -> const unsigned char * {
        cp_wait<NS - 1>();
        __syncwarp();
        asm volatile("" ::: "memory");
        return ring + (size_t)(csq % NS) * SB;
    };
    auto release = [&]() {
        csq++;
        asm volatile("" ::: "memory");
        __syncwarp();
        issue();
    };
#pragma unroll 1
    for (int j = 0; j < NS; j++) issue();
    qfrag(); /* Q's fragments while the rings' first copies are in flight */
    float Mr[2] = {-INFINITY, -INFINITY}, Lr[2] = {0.0f, 0.0f};
    float ar[PD_NT][4];
#pragma unroll
    for (int u = 0; u < PD_NT; u++) ar[u][0] = ar[u][1] = ar[u][2] = ar[u][3] = 0.0f;
    for (int cc = cb + warp; cc < ce; cc += PD_W) {
        const int k0 = cc * ch, nk = min(ch, n - k0), ng = (nk + 15) / 16;
        /* pass 1: S of each 16-key group into the warp's area; the row maxima; lane gr: the
         * max V scale of group gr */
        float mx0 = -INFINITY, mx1 = -INFINITY, vm = 0.0f;
        /* a K group's fragments and scales from the ring into registers (the slot released) */
        auto kload = [&](uint4 (&kw)[2][2], float4 &ks, float4 &kv) {
            const unsigned char *sl = acquire();
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int d = 4 * u + tq, k = kl + 2 * h;
                    kw[h][u] = *reinterpret_cast<const uint4 *>(sl + (d * 16 + (k ^ (2 * tq))) * 16);
                }
            ks = *reinterpret_cast<const float4 *>(sl + SCO + 16 * tq);
            kv = *reinterpret_cast<const float4 *>(sl + SCO + 64 + 16 * tq);
            release();
        };
        /* one group ahead: group gr + 1's fragments are read (and its slot refilled) before
         * group gr's products */
        uint4 kwn[2][2];
        float4 ksn, kvn;
        kload(kwn, ksn, kvn);
#pragma unroll 1
        for (int gr = 0; gr < ng; gr++) {
            uint4 kw[2][2];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int u = 0; u < 2; u++) kw[h][u] = kwn[h][u];
            const float4 ks = ksn, kv = kvn;
            if (gr + 1 < ng) kload(kwn, ksn, kvn);
            float c8[2][2][4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int a = 0; a < 2; a++) c8[h][a][0] = c8[h][a][1] = c8[h][a][2] = c8[h][a][3] = 0.0f;
            /* K codes unpacked once (an e4m3 mma.sync unpacks both operands on sm_90, so Q's
             * codes were unpacked again for every group), fp16 mma: exact products */
#pragma unroll
            for (int m = 0; m < 4; m++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const uint4 qa4 = qh[(2 * m + hf) * 32 + lane];
                    const uint32_t qa[4] = {qa4.x, qa4.y, qa4.z, qa4.w};
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint4 w = kw[h][m >> 1];
                        const uint32_t x = (m & 1) ? (hf ? w.w : w.z) : (hf ? w.y : w.x);
                        uint32_t b[2];
                        m3_e4m3x4_to_f16x2(x, b[0], b[1]);
                        m3_mma_f16_16816(c8[h][m & 1], qa, b);
                    }
                }
            const int kq = 16 * gr + 4 * tq; /* this lane's first key of the group */
            const bool tail = 16 * gr + 16 > nk; /* the list's last group: keys past it masked */
            const float ks4[4] = {ks.x, ks.y, ks.z, ks.w};
            float m;
            if (!tail) {
                m = fmaxf(fmaxf(kv.x, kv.y), fmaxf(kv.z, kv.w));
            } else {
                m = 0.0f;
                if (kq < nk) m = fmaxf(m, kv.x);
                if (kq + 1 < nk) m = fmaxf(m, kv.y);
                if (kq + 2 < nk) m = fmaxf(m, kv.z);
                if (kq + 3 < nk) m = fmaxf(m, kv.w);
            }
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            if (lane == gr) vm = m;
            if (PP && gq == 0) vsw[gr * 4 + tq] = kv; /* the P' codes' V scales */
            float z[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int i = 0; i < 4; i++) /* §4.9 step 2 */
                    z[h][i] = (c8[h][0][i] + c8[h][1][i]) * c.scale * ks4[2 * h + (i & 1)];
            if (tail)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        if (kq + 2 * h + (i & 1) >= nk) z[h][i] = -INFINITY;
            mx0 = fmaxf(mx0, fmaxf(fmaxf(z[0][0], z[0][1]), fmaxf(z[1][0], z[1][1])));
            mx1 = fmaxf(mx1, fmaxf(fmaxf(z[0][2], z[0][3]), fmaxf(z[1][2], z[1][3])));
            sw[(gr * 2) * 32 + lane] = make_float4(z[0][0], z[0][1], z[0][2], z[0][3]);
            sw[(gr * 2 + 1) * 32 + lane] = make_float4(z[1][0], z[1][1], z[1][2], z[1][3]);
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        /* the max V scale of each tile (tiles of tile / 16 groups from the chunk start) */
        for (int off = 1; off < c.tile / 16; off <<= 1) vm = fmaxf(vm, __shfl_xor_sync(0xffffffffu, vm, off));
        /* lane gr's tile constants of group gr, once per chunk (all lanes at once): M + 1e-8,
         * its correctly rounded reciprocal and M / FP8_MAX (pass 2 shuffles them) */
        const float ty = vm + 1e-8f, tr = __frcp_rn(ty), tf = pd8_div(vm, c.fmax, rfmax);
        /* §4.9 steps 3-4 of one group (the lane's z of heads gq (zl) and gq + 8 (zh) at its keys,
         * their V scales vs4): P = exp(z - m) into the row sums, then P' = fp8(P v_scale FP8_MAX
         * / (M + 1e-8)), M the tile's max V scale (y: M + 1e-8, ry its reciprocal, shuffled from
         * group lane g2 when shuf), as two words of e4m3 codes; pass 1.5, or pass 2 with tile
         * pairs (the output then scaled by M / FP8_MAX) */
        auto pcodes = [&](float4 zl, float4 zh, const float (&vs4)[4], bool shuf, int g2, float &y, float &ry,
                          float *f, float &l0, float &l1) -> uint2 {
            const float ex[2][4] = {{pd8_ex2e(zl.x - mx0), pd8_ex2e(zl.y - mx0), pd8_ex2e(zl.z - mx1),
                                     pd8_ex2e(zl.w - mx1)},
                                    {pd8_ex2e(zh.x - mx0), pd8_ex2e(zh.y - mx0), pd8_ex2e(zh.z - mx1),
                                     pd8_ex2e(zh.w - mx1)}};
            l0 += (ex[0][0] + ex[0][1]) + (ex[1][0] + ex[1][1]);
            l1 += (ex[0][2] + ex[0][3]) + (ex[1][2] + ex[1][3]);
            if (shuf) { /* (and M / FP8_MAX into *f) */
                y = __shfl_sync(0xffffffffu, ty, g2), ry = __shfl_sync(0xffffffffu, tr, g2);
                if (f) *f = __shfl_sync(0xffffffffu, tf, g2);
            }
            float pv[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int i = 0; i < 4; i++) pv[h][i] = pd8_div(ex[h][i] * vs4[2 * h + (i & 1)] * c.fmax, y, ry);
            return make_uint2(pd8_e4m3x2(pv[0][0], pv[0][1]) | (pd8_e4m3x2(pv[1][0], pv[1][1]) << 16),
                              pd8_e4m3x2(pv[0][2], pv[0][3]) | (pd8_e4m3x2(pv[1][2], pv[1][3]) << 16));
        };
        /* pass 2: O = P' V, two groups a step */
        float o[PD_NT][4];
#pragma unroll
        for (int u = 0; u < PD_NT; u++) o[u][0] = o[u][1] = o[u][2] = o[u][3] = 0.0f;
        float l0 = 0.0f, l1 = 0.0f;
        constexpr bool tpair = TPAIR; /* pairs (2i, 2i + 1) of groups lie in one tile */
        if (PP) {
            /* pass 1.5: every group's P' codes (in place of its S) and the row sums, before
             * pass 2 and away from its ring waits */
#pragma unroll 2
            for (int gr = 0; gr < ng; gr++) {
                float4 *zp = sw + (gr * 2) * 32 + lane;
                const float4 zl = zp[0], zh = zp[32], v = vsw[gr * 4 + tq];
                float vs4[4] = {v.x, v.y, v.z, v.w};
                if (16 * gr + 16 > nk) /* keys past the list: no weight */
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (16 * gr + 4 * tq + e >= nk) vs4[e] = 0.0f;
                float y, ry;
                *reinterpret_cast<uint2 *>(zp) = pcodes(zl, zh, vs4, true, gr, y, ry, NULL, l0, l1);
            }
        }
#pragma unroll 1
        for (int gr = 0; gr < ng; gr += 2) {
            const bool two = gr + 1 < ng;
            uint32_t vc[2][PD_NT];
            float4 vsg[2];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if (j == 1 && !two) { /* a zero group: it enters the products below (adds 0) */
#pragma unroll
                    for (int u = 0; u < PD_NT; u++) vc[1][u] = 0u;
                    vsg[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    continue;
                }
                const unsigned char *sl = acquire();
                /* a lane's V words (dim 8u + gq, keys 4tq..4tq+3) by ldmatrix: matrix m of
                 * load j4 is n-tile 4 j4 + m, its row r dim 8 (4 j4 + m) + r */
#pragma unroll
                for (int j4 = 0; j4 < PD_NT / 4; j4++) ldsm4(&vc[j][4 * j4], sl + (32 * j4 + lane) * 16);
                vsg[j] = PP ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                            : *reinterpret_cast<const float4 *>(sl + SCO + 16 * tq);
                release();
            }
            /* P' codes of keys 4tq..4tq+3 of heads gq, gq + 8 (four e4m3 codes a register) */
            uint32_t pc[2][2];
            float fj[2], yt = 0.0f, ryt = 0.0f;
            /* both groups straight through (a missing second group: z = -inf, zero scales and
             * codes, so zero P' and products), the tile constants shuffled from their lanes */
            if (16 * gr + 32 > nk) /* a tail in this step: keys past the list get no weight,
                                    * their V codes zeroed */
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    float vs4[4] = {vsg[j].x, vsg[j].y, vsg[j].z, vsg[j].w};
                    uint32_t keep = 0u; /* the code bytes of keys in the list (one mask a word) */
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        if (16 * (gr + j) + 4 * tq + e < nk) keep |= 0xFFu << (8 * e);
                        else vs4[e] = 0.0f;
                    }
#pragma unroll
                    for (int u = 0; u < PD_NT; u++) vc[j][u] &= keep;
                    vsg[j] = make_float4(vs4[0], vs4[1], vs4[2], vs4[3]);
                }
            if (PP) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const uint2 w = j == 0 || two ? *reinterpret_cast<const uint2 *>(sw + ((gr + j) * 2) * 32 + lane)
                                                  : make_uint2(0u, 0u);
                    pc[j][0] = w.x, pc[j][1] = w.y;
                }
                fj[0] = __shfl_sync(0xffffffffu, tf, gr), fj[1] = __shfl_sync(0xffffffffu, tf, gr + 1);
            } else
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int g2 = gr + j;
                float4 zl = sw[(g2 * 2) * 32 + lane], zh = sw[(g2 * 2 + 1) * 32 + lane];
                if (j == 1) {
                    const float ni = -INFINITY;
                    zl = make_float4(two ? zl.x : ni, two ? zl.y : ni, two ? zl.z : ni, two ? zl.w : ni);
                    zh = make_float4(two ? zh.x : ni, two ? zh.y : ni, two ? zh.z : ni, two ? zh.w : ni);
                }
                const float vs4[4] = {vsg[j].x, vsg[j].y, vsg[j].z, vsg[j].w};
                /* with tile pairs group 2i + 1 takes group 2i's M, factor and reciprocal */
                const bool sh = !(TPAIR && j == 1);
                if (!sh) fj[1] = fj[0];
                const uint2 w = pcodes(zl, zh, vs4, sh, g2, yt, ryt, &fj[j], l0, l1);
                pc[j][0] = w.x, pc[j][1] = w.y;
            }
            /* P' codes unpacked once per step into m16n8k16 A fragments (keys 4tq, 4tq + 1 as
             * virtual k 2tq, 2tq + 1; 4tq + 2, 4tq + 3 as 2tq + 8, 2tq + 9), V codes per n-tile,
             * fp16 mma: exact products, fp32 sums (an e4m3 mma.sync unpacks both operands per
             * n-tile on sm_90, and a lone group's k32 mma ran a half of zeros) */
            uint32_t ah[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                m3_e4m3x4_to_f16x2(pc[j][0], ah[j][0], ah[j][2]);
                m3_e4m3x4_to_f16x2(pc[j][1], ah[j][1], ah[j][3]);
            }
            if (tpair) { /* one tile: both groups' products in one sum before the scaling */
#pragma unroll
                for (int u = 0; u < PD_NT; u++) {
                    float t4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int j = 0; j < 2; j++) { /* (a lone last group: j = 1 adds 0) */
                        uint32_t b[2];
                        m3_e4m3x4_to_f16x2(vc[j][u], b[0], b[1]);
                        m3_mma_f16_16816(t4, ah[j], b);
                    }
#pragma unroll
                    for (int i = 0; i < 4; i++) o[u][i] += t4[i] * fj[0];
                }
            } else {
#pragma unroll
                for (int j = 0; j < 2; j++) { /* (a lone last group: j = 1 adds 0 x 0) */
#pragma unroll
                    for (int u = 0; u < PD_NT; u++) {
                        uint32_t b[2];
                        m3_e4m3x4_to_f16x2(vc[j][u], b[0], b[1]);
                        float t4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        m3_mma_f16_16816(t4, ah[j], b);
#pragma unroll
                        for (int i = 0; i < 4; i++) o[u][i] += t4[i] * fj[j];
                    }
                }
            }
        }
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        /* chunk done: A_j into the warp's running merge (pf_part_k's rule), in registers */
        const bool first = Mr[0] == -INFINITY;
        float wa[2], wb[2], ll[2] = {l0, l1}, rl[2] = {__frcp_rn(l0), __frcp_rn(l1)};
#pragma unroll
        for (int r2 = 0; r2 < 2; r2++) {
            const float m = r2 ? mx1 : mx0, Mn = fmaxf(Mr[r2], m);
            wa[r2] = Mr[r2] == -INFINITY ? 0.0f : expf(Mr[r2] - Mn), wb[r2] = expf(m - Mn);
            Lr[r2] = Lr[r2] * wa[r2] + ll[r2] * wb[r2], Mr[r2] = Mn;
        }
#pragma unroll
        for (int u = 0; u < PD_NT; u++)
#pragma unroll
            for (int i = 0; i < 4; i += 2) {
                const int r2 = i >> 1;
                float A0 = o[u][i], A1 = o[u][i + 1];
                if (c.part > 0) { /* l bf16(O / l): l >= 1, so the quotient is normal (or 0) */
                    float q0 = pd8_div(A0, ll[r2], rl[r2]), q1 = pd8_div(A1, ll[r2], rl[r2]);
                    round_bf16x2(q0, q1);
                    A0 = ll[r2] * q0, A1 = ll[r2] * q1;
                }
                ar[u][i] = first ? A0 * wb[r2] : ar[u][i] * wa[r2] + A0 * wb[r2];
                ar[u][i + 1] = first ? A1 * wb[r2] : ar[u][i + 1] * wa[r2] + A1 * wb[r2];
            }
    }
    cp_wait<0>();
    /* the warp's A into its area (S is no longer read), the block's warps folded in order */
    __syncwarp();
    float4 *aw = reinterpret_cast<float4 *>(sa);
#pragma unroll
    for (int u = 0; u < PD_NT; u++) aw[u * 32 + lane] = make_float4(ar[u][0], ar[u][1], ar[u][2], ar[u][3]);
    if (tq == 0) {
        wml[warp][0][gq] = Mr[0], wml[warp][0][gq + 8] = Mr[1];
        wml[warp][1][gq] = Lr[0], wml[warp][1][gq + 8] = Lr[1];
    }
    __syncthreads();
    m3_bf16 *orow = out + (size_t)t * c.H * Dh + (size_t)g * hq * Dh;
    const size_t sl0 = (slot0 + ci) * hq;
    __shared__ float wx[PD_W * 16 + 32];
    if (cb < ce || c.nsp == 1) pd_fold(wraw, WB, 0, wml, wx, orow, po, pml, sl0, hq, c.nsp, tid, NT);
    if (c.nsp == 1) return;
    if (c.split > 0) { /* pd_part_k's */
        pd_split_merge(orow, po, pml, slot0, (nch + c.cpb - 1) / c.cpb, hq, (unsigned int)c.nsp,
                       &c.cnt[tg], c.split, reinterpret_cast<float *>(wraw), tid, NT);
        return;
    }
    if (!c.fused) return;
    /* the last block of this (token, kv head) to finish merges (pf_part_k's merge) */
    if (!attn_last_block(&c.cnt[tg], gridDim.x)) return;
    pf_row_merge(orow, po, pml, slot0, (nch + c.cpb - 1) / c.cpb, hq, Dh,
                 reinterpret_cast<float *>(wraw), tid, NT);
#else
    (void)out; (void)q; (void)ld_q; (void)s; (void)pos; (void)t0; (void)n_tok; (void)topk;
    (void)width; (void)po; (void)pml; (void)nkeys; (void)c;
#endif
}

#endif /* M3_HIP_NVIDIA */

#if defined(M3_HIP_NVIDIA)
static m3_status pf_launch(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                           const m3_gpu_attn_paged_src *src, const int32_t *d_pos, int n_tok,
                           const int32_t *d_topk, int width, pf_cfg c);
#endif

extern "C" m3_status m3_gpu_attn_paged_flash(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q,
                                             int ld_q, const m3_gpu_attn_paged_src *src,
                                             const int32_t *d_pos, int n_tok, int n_ctx,
                                             const int32_t *d_topk, int width,
                                             const m3_attn_params *ap, const m3_profile *p) {
    M3_ASSERT(g && src && ap && p && n_tok >= 0 && n_ctx > 0);
    M3_ASSERTF(ap->n_head % ap->n_kv_head == 0 && ld_q >= ap->n_head * ap->head_dim,
               "H=%d Hkv=%d Dh=%d ld_q=%d", ap->n_head, ap->n_kv_head, ap->head_dim, ld_q);
    M3_ASSERTF(src->g.head_dim == ap->head_dim && src->g.n_kv == ap->n_kv_head,
               "paged cache geometry Hkv=%d Dh=%d, attention Hkv=%d Dh=%d", src->g.n_kv,
               src->g.head_dim, ap->n_kv_head, ap->head_dim);
    M3_ASSERT(!d_topk || width > 0);
    M3_ASSERTF(src->bt_ld == 0 || src->bt_ld >= src->n_logical, "bt_ld %d, n_logical %d",
               src->bt_ld, src->n_logical);
    M3_TRY(m3_gpu_attn_paged_flash_ok(src, ap, p, width));
    const bool fp8 = src->g.elem == M3_KV_FP8;
    if (fp8 && (!src->k_scale || !src->v_scale))
        return m3_errorf(M3_ERR_ARG, "gpu paged attention: fp8 cache without scales");
    M3_ASSERT(src->k && src->v && src->bt && d_pos && d_q && d_out);
    if (n_tok == 0) return M3_OK;
#if !defined(M3_HIP_NVIDIA)
    /* no tensor-core kernel for this vendor yet: the portable faithful kernel */
    return m3_gpu_attn_paged(g, d_out, d_q, ld_q, src, d_pos, n_tok, n_ctx, d_topk, width, ap, p);
#else
    pf_cfg c;
    memset(&c, 0, sizeof c);
    c.H = ap->n_head, c.Hkv = ap->n_kv_head, c.hq = c.H / c.Hkv, c.Dh = ap->head_dim;
    c.Dhp = (c.Dh + 15) / 16 * 16;
    c.scale = ap->scale;
    c.eager = p->attn_scores == M3_SCORES_BF16_EAGER;
    c.sel_order = p->attn_order == M3_ATTN_ORDER_SELECTION;
    c.fp8 = fp8;
    c.pa = fp8 && src->fp8_pa;
    c.fmax = fp8 ? m3_fp8_max(src->g.fp8_kind) : 0.0f;
    c.tile = d_topk ? src->g.page : src->g.block;
    c.part = p->attn_partition;
    const int Pv = src->view == M3_KV_VIEW_BLOCK ? src->g.block : src->g.page;
    c.fast = src->g.dx * src->g.x == c.Dh && Pv % src->g.x == 0 && c.Dh % 16 == 0 &&
             m3_aligned16(src->k) && m3_aligned16(src->v);
    if (c.part > 0) {
        c.ch = c.part;
    } else {
        c.ch = d_topk ? 128 : 256;
        if (c.pa) c.ch = c.ch / c.tile * c.tile > 0 ? c.ch / c.tile * c.tile : c.tile;
    }
    c.fast = c.fast && c.ch % 16 == 0; /* key groups of a chunk start on 16-key boundaries */
    c.qvec = c.Dh % 16 == 0 && ld_q % 8 == 0 && m3_aligned16(d_q);
    const int64_t maxk = d_topk ? (int64_t)width * src->g.block : n_ctx;
    c.nchx = (int)((maxk + c.ch - 1) / c.ch);
    c.hw = fp8 && src->g.fp8_kind == M3_FP8_E4M3FN;
    c.pvf16 = c.pa && c.tile % 16 == 0;
    /* pd_part_k / pd8_part_k (§4.9): 16-key groups inside one page and one §4.9 tile, K
     * units of 32 (bf16) / 64 (fp8) dims per lane pair, hardware fp8 conversions, 16-byte
     * aligned scales */
    c.dec = c.fast && c.qvec && c.Dh == FA_MAX_DH && src->g.block % 16 == 0 &&
            Pv % 16 == 0 && c.ch % 16 == 0 &&
            (!fp8 || (c.hw && m3_aligned16(src->k_scale) && m3_aligned16(src->v_scale))) &&
            (!c.pa || (c.pvf16 && (c.tile & (c.tile - 1)) == 0));
    return pf_launch(g, d_out, d_q, ld_q, src, d_pos, n_tok, d_topk, width, c);
#endif
}

#if defined(M3_HIP_NVIDIA)
/* The owner's step of a cluster merge (pc_k, sdec_k's T = 1 launch): this CTA owns elements
 * [e0, e0 + ne) of the row's hq x Dh outputs (orow = their first); CTA u of the cluster left
 * its fp32 partial of them in ro[u epo + x], its denominator and max per head in rl[u ls + h],
 * rm[u ls + h]; chunk j is CTAs [j spc, (j + 1) spc) (whose maxes are the chunk's). First, by
 * a warp per head of the owner's elements (lanes: CTAs, then chunks; nch spc <= 32), per
 * (chunk, head): l_j (its CTAs' in rank order), M over the chunks with l_j > 0 and w_j =
 * e^(m_j - M) (2^ when LOG2; 0 for an empty chunk), into mwl [nch][nh]; then two threads an
 * element (lanes x and x + 16), chunks [0, (nch + 1) / 2) and the rest: sum_j w_j A_j and
 * sum_j w_j l_j, A_j = l_j bf16(O_j / l_j) when part (pd8_div: the correctly rounded quotient
 * wherever it is normal; l_j >= 1), else O_j (O_j: the chunk's CTAs' partials in rank order),
 * summed in chunk order per half, the halves added; out = bf16(num / den). Short chains per
 * thread: a thread-serial merge of 8-16 chunks measured ~2.5 us (session 9). Call with all nt
 * threads (a multiple of 32). The two steps are cl_weights (needs rl, rm only) and cl_sums
 * (needs ro, after a barrier that makes mwl visible): pc_k forms the weights while the O
 * partials are still arriving (session 10). Where the launch knows the shape (pc_k's FX
 * instances, session 13) it is compiled in: SPC CTAs a chunk, at most NCH chunks (a power of
 * two <= 32: the max butterfly spans NCH lanes, and each half of the sums takes NCH / 2 guarded
 * chunks, straight code with no loop remainder), and EH: the owner's elements are one head of
 * EH = Dh dims (nh 1, ne EH: one warp forms the weights, one pass of the element loop); 0: from
 * the arguments. The partition quotient is rounded by the hardware cvt (round_bf16x2: the value
 * of m3_round_bf16 for every non-NaN input; a NaN becomes the canonical NaN in the product that
 * follows either way). */
#if M3_HAVE_CLUSTER /* device code of the sm_90 pass (round_bf16x2 is cvt.rn.bf16x2) */
template <bool LOG2, int SPC = 0, int NCH = 0, int EH = 0>
static __device__ void cl_weights(const float *rl, const float *rm, int ls, int nch, int spc, int e0,
                                  int ne, int Dh, float4 *mwl, int tid, int nt) {
    static_assert(NCH >= 0 && NCH <= 32 && (NCH & (NCH - 1)) == 0, "a butterfly over NCH lanes");
    if (SPC) spc = SPC;
    if (EH) ne = EH, Dh = EH;
    const int h0 = e0 / Dh, nh = EH ? 1 : ne > 0 ? (e0 + ne - 1) / Dh - h0 + 1 : 0, lane = tid & 31;
    /* a warp per head: lane u < cs = nch spc reads CTA u's (l, m); lane j < nch forms chunk j's */
    auto head = [&](int hl) {
        const int h = h0 + hl;
        const float lv = lane < nch * spc ? rl[lane * ls + h] : 0.0f;
        const float mv = lane < nch * spc ? rm[lane * ls + h] : -INFINITY;
        float l = 0.0f;
        for (int u = 0; u < spc; u++) l += __shfl_sync(0xffffffffu, lv, (lane * spc + u) & 31);
        const float m = __shfl_sync(0xffffffffu, mv, (lane * spc) & 31);
        const bool on = lane < nch && l > 0.0f;
        float M = on ? m : -INFINITY;
#pragma unroll
        for (int o = NCH ? NCH / 2 : 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        if (lane < nch) {
            const float x = m - M, w = on ? (LOG2 ? exp2f(x) : expf(x)) : 0.0f;
            mwl[lane * nh + hl] = make_float4(w, l, on ? __frcp_rn(l) : 0.0f, w * l);
        }
    };
    if (EH) {
        if (tid < 32) head(0);
    } else
        for (int hl = tid >> 5; hl < nh; hl += nt >> 5) head(hl);
}

template <int SPC = 0, int NCH = 0, int EH = 0>
static __device__ void cl_sums(m3_bf16 *orow, const float *ro, int epo, int nch, int spc, bool part,
                               int e0, int ne, int Dh, const float4 *mwl, int tid, int nt) {
    if (SPC) spc = SPC;
    if (EH) ne = EH, Dh = EH;
    const int h0 = e0 / Dh, nh = EH ? 1 : ne > 0 ? (e0 + ne - 1) / Dh - h0 + 1 : 0;
    const int half = (tid >> 4) & 1, jh = (nch + 1) / 2, ja = half ? jh : 0, jb = half ? nch : jh;
#pragma unroll 1
    for (int xb = 0; xb < ne; xb += nt / 2) {
        const int x = xb + (tid >> 5) * 16 + (tid & 15);
        float num = 0.0f, den = 0.0f;
        if (x < ne) {
            const int hl = EH ? 0 : (e0 + x) / Dh - h0;
            auto chunk = [&](int j) {
                const float4 f = mwl[j * nh + hl];
                float oo = 0.0f;
#pragma unroll 2
                for (int u = 0; u < spc; u++) oo += ro[(size_t)(j * spc + u) * epo + x];
                float a = oo;
                if (part && f.y > 0.0f) {
                    float qq = pd8_div(oo, f.y, f.z), q2 = 0.0f;
                    round_bf16x2(qq, q2);
                    a = f.y * qq;
                }
                num += __fmul_rn(f.x, a);
                den += f.w;
            };
            if (NCH) {
#pragma unroll
                for (int i = 0; i < NCH / 2; i++)
                    if (ja + i < jb) chunk(ja + i);
            } else {
#pragma unroll 4
                for (int j = ja; j < jb; j++) chunk(j);
            }
        }
        num += __shfl_xor_sync(0xffffffffu, num, 16);
        den += __shfl_xor_sync(0xffffffffu, den, 16);
        if (x < ne && !half) orow[x] = m3_f32_to_bf16(num / den);
    }
}

template <bool LOG2>
static __device__ void cl_merge(m3_bf16 *orow, const float *ro, int epo, const float *rl,
                                const float *rm, int ls, int nch, int spc, bool part, int e0,
                                int ne, int Dh, float4 *mwl, int tid, int nt) {
    cl_weights<LOG2>(rl, rm, ls, nch, spc, e0, ne, Dh, mwl, tid, nt);
    __syncthreads();
    cl_sums(orow, ro, epo, nch, spc, part, e0, ne, Dh, mwl, tid, nt);
}
#endif

/* ---- batch-1 decode over thread-block clusters: pc_k (sessions 8, 9) ----------------------
 * For grids of few (token, kv head) rows (decode of one token: 4 rows at M3 shapes), where
 * pf_part_k runs 8 blocks a row on a quarter of the SMs and its merge is a chain (partial
 * write, fence, arrival counter, the last block's dependent reads). One cluster of cs <= 16
 * CTAs per row (above 8 a non-portable cluster size), 8 warps each; CTA r takes the keys
 * [r kpc, (r + 1) kpc) of the row's key list (pf_part_k's list), kpc = ch / spc: spc CTAs
 * per chunk (under atom a chunk is one of ref's partitions), so a CTA lies in one chunk, and
 * cs = spc * chunks <= 16 (M3 atom: 8 partitions of 256 keys, 2 CTAs of 128 keys each, 64 KB
 * of bf16 K and V a CTA). All of a CTA's K (with the fp8 scales) and V are in flight at once,
 * as bulk copies (cp.async.bulk: one instruction per 16-key page of K, of V, of each scale
 * run; completion on two mbarriers, K and V), after two dependent
 * global loads: pos and the selection (with q, staged before the copies start), then each
 * selected block's table entry (issued per selection entry before the ranking). Launched as
 * a programmatic dependent (barrier setup before the wait for the grid before it). Numerics
 * are pf_part_k's (the chunk's max, denominator, P rounding against the chunk max, §4.9 P'
 * codes per 16-key tile, the bf16 partition output, the merge) with these fp32 reorderings:
 * a chunk's denominator and P V are summed per CTA, then over the chunk's CTAs in rank
 * order, the owner's sums over chunks in two halves (cl_merge); the scores' k-steps in two
 * chains as pf_part_k.
 * Distributed shared memory carries the merges (no global partials, counters or arena), by
 * st.async stores that complete on the receiver's mbarrier (a receiver waits for the bytes
 * it expects; no cluster-wide barrier after (a)):
 *  1. each CTA sends its per-head max (from the score registers) to the other CTAs of its
 *     chunk, each takes the max of the spc values (exact; skipped when spc = 1);
 *  2. P and the CTA's denominators l (one pass), l and the chunk's max sent to every owner;
 *     O = P V, sent split by output element to the CTA owning the elements (owner o:
 *     elements [o epo, (o + 1) epo) of the row's hq x Dh);
 *  3. each owner merges its elements (cl_merge): O_j and l_j summed over chunk j's CTAs in
 *     rank order, A_j = l_j bf16(O_j / l_j) (partitioned) or O_j, out = bf16(sum_j e^(m_j -
 *     M) A_j / sum_j e^(m_j - M) l_j) (pf_row_merge's rule).
 * A remote store needs the target CTA running with its barriers initialized: they are set
 * up before a relaxed cluster arrive at the start, whose wait precedes the first store. A
 * CTA exits only after every store into it landed, and reads no other CTA's memory, so no
 * final barrier. Taken for the pd_part_k geometries (fast layouts, Dh % 16 == 0, bf16 or
 * e4m3fn elements; §4.9 with 16-key tiles) when the row has at most 16 chunks and the grid
 * (rows x cs CTAs) fits the SMs once; sm_90 only.
 * Session 10: l and m travel on their own mbarrier (bars[4]) so the owner forms the merge
 * weights while the O partials arrive (bars[3]; paged instances only). CONT (pc_k<false, true>, m3_gpu_attn_sparse_flash's T =
 * 1-2 rows, the contiguous [n_ctx][Hkv][Dh] cache): sdec_k's key list (selected blocks in
 * slot order, repeats once, the own block up to pos; no block table), the row's keys split
 * evenly over the cs CTAs, a chunk a CTA (no partitions there: no max exchange, P against the
 * CTA's own max, the fp32 merge), K and V rows [key][Dh + 8] by a bulk copy each (K by warps
 * 0-3, V by 4-7), K fragments by 32-bit loads, V by ldmatrix.trans.
 * Session 11: a launch is mostly instruction fetch of code that runs once (removing code that
 * never ran, the dequantized-fp8 paths of the §4.9 launch, saved 1.2 us of 11.3), so the
 * instances are per case and, where the row is M3's, with the geometry compiled in: PA (§4.9,
 * the P' path without the dequantized one) and FX (hq 16, Dh 128, Bs 128; paged: the page-16
 * view, partitions of 256 keys, 2 CTAs of 128 keys each; atom's flags; Q fragments by ldmatrix
 * from rows of Dh + 8, the §4.9 q rounded to e4m3 once at staging in the permuted dim order):
 * shifts instead of divisions, constant trip counts, about half the SASS of the general
 * instance (bf16 68 -> 34 KB, §4.9 94 -> 46 KB). Numerics unchanged (the same operations). */
#define PC_NT 256       /* threads per CTA: 8 warps */
#define PC_MAX_PHYS 17  /* physical block ids of a CTA's key range (kpc <= 256, Bs >= 16) */
#define PC_MAX_KPC 256  /* keys per CTA (a chunk's, at most) */
#define PC_BT_SH 1024   /* block-table entries staged in shared memory before the grid wait */

typedef struct {
    pf_cfg c;
    int cs;  /* CTAs per cluster (= per row) */
    int spc; /* CTAs per chunk */
    int kpc; /* keys per CTA (a multiple of 16) */
    int epo; /* output elements per owner (a multiple of 4) */
    int cont; /* the contiguous cache of m3_gpu_attn_sparse_flash (pc_k<false, true>) */
    float rfmax; /* 1 / FP8_MAX correctly rounded (host; the §4.9 tile factors by pd8_div) */
} pc_cfg;

/* dynamic shared memory (byte offsets, 16-byte aligned): K [Dh/x][kpc][16 B], V
 * [kpc/x][Dh][16 B], scores [hq][kpc + 8] fp32 (also the Q staging), P [16][kpc + 8] bf16,
 * K and V scales [kpc], §4.9 tile M and M / FP8_MAX [kpc / 16], received O [cs][epo],
 * l and m [cs][hq], chunk maxes [spc][hq], the merge scratch */
typedef struct { size_t k, v, sc, pb, ksc, vsc, mt, mf, ro, rl, rm, mi, wa, total; } pc_lay;
static __host__ __device__ inline size_t pc_up(size_t x) { return (x + 15) / 16 * 16; }
static __host__ __device__ inline pc_lay pc_layout(const pc_cfg &pc, int eb) {
    const pf_cfg &c = pc.c;
    pc_lay L;
    size_t o = 0;
    const int kp = pc.cont ? c.Dh + 8 : c.Dh; /* contiguous: key rows of 272 bytes at Dh 128 */
    L.k = o, o += pc_up((size_t)pc.kpc * kp * eb);
    L.v = o, o += pc_up((size_t)pc.kpc * kp * eb);
    size_t scb = (size_t)c.hq * (pc.kpc + 8) * 4, qb = (size_t)c.hq * c.Dh * 2;
    L.sc = o, o += pc_up(scb > qb ? scb : qb);
    L.pb = o, o += pc_up((size_t)16 * (pc.kpc + 8) * 2);
    L.ksc = o, o += pc_up((size_t)pc.kpc * 4);
    L.vsc = o, o += pc_up((size_t)pc.kpc * 4);
    L.mt = o, o += pc_up((size_t)(pc.kpc / 16) * 4);
    L.mf = o, o += pc_up((size_t)(pc.kpc / 16) * 4);
    L.ro = o, o += pc_up((size_t)pc.cs * pc.epo * 4);
    L.rl = o, o += pc_up((size_t)pc.cs * c.hq * 4);
    L.rm = o, o += pc_up((size_t)pc.cs * c.hq * 4);
    L.mi = o, o += pc_up((size_t)pc.spc * c.hq * 4);
    /* the owner's merge input; cl_merge's [nch][nh] float4 (nh <= 17) */
    L.wa = o, o += pc_up((size_t)pc.cs * (pc.epo * 4 > 17 * 16 ? pc.epo * 4 : 17 * 16));
    L.total = o;
    return L;
}

template <bool FP8, bool CONT, bool PA, bool FX>
static __global__ void __launch_bounds__(PC_NT, 2)
    pc_k(m3_bf16 *M3_RESTRICT out, const m3_bf16 *M3_RESTRICT q, int ld_q, m3_gpu_attn_paged_src s,
         const int32_t *M3_RESTRICT pos, int n_tok, const int32_t *M3_RESTRICT topk, int width,
         pc_cfg pc) {
#if M3_HAVE_CLUSTER && M3_HAVE_FP8_CVT
    extern __shared__ __align__(16) unsigned char pc_raw[];
    constexpr int EB = FP8 ? 1 : 2, XC = 16 / EB, NW = PC_NT / 32;
    /* the owner's weights before O lands (paged instances; measured there, session 10) */
    /* FS (FX, session 12): the owner's merge with its shape compiled in (cl_weights / cl_sums
     * with SPC, NCH, EH: one head an owner, warp 0 forms the weights, then NCH / 2 guarded
     * chunks per half: no loop remainders); the contiguous FX instance too, with the weights
     * formed while O arrives (l, m on bars[4]) */
    constexpr bool FS = FX && (!FP8 || PA); /* measured on bf16, §4.9 and contiguous */
    constexpr bool EARLY = !CONT || FS;
    constexpr int MSP = FS ? (CONT ? 1 : 2) : 0, MNJ = FS ? (CONT ? 16 : 8) : 0, MEH = FS ? 128 : 0;
    const pf_cfg &c = pc.c;
    const bool pa = PA || (FP8 && c.pa); /* §4.9 (known false in the bf16 instance: no P' code there) */
    /* FX: M3's sparse decode geometry compiled in (hq 16, Dh 128, partitions of 256 keys, Bs 128,
     * the page-16 view, 2 CTAs of 128 keys a partition, 16 a cluster, 128 outputs an owner):
     * shifts for the index math, constant trip counts (pc_launch says when) */
    constexpr bool FXP = FX && !CONT; /* the paged one: also the partitions and keys per CTA */
    constexpr bool QLD = true && FX && (!FP8 || PA); /* Q fragments by ldmatrix (hq 16) */
    const int hq = FX ? 16 : c.hq, Dh = FX ? 128 : c.Dh, ch = FXP ? 256 : c.ch, Bs = FX ? 128 : s.g.block,
              kpc = FXP ? 128 : pc.kpc, cs = FX ? 16 : pc.cs, spc = FXP ? 2 : FX ? 1 : pc.spc, SCP = kpc + 8,
              PBP = kpc + 8;
    pc_cfg pcx = pc;
    if (FX) pcx.c.hq = 16, pcx.c.Dh = 128, pcx.cs = 16, pcx.spc = spc, pcx.epo = 128;
    if (FXP) pcx.kpc = 128;
    const pc_lay L = pc_layout(pcx, EB);
    unsigned char *ksm = pc_raw + L.k, *vsm = pc_raw + L.v;
    float *sc = reinterpret_cast<float *>(pc_raw + L.sc);
    m3_bf16 *pb = reinterpret_cast<m3_bf16 *>(pc_raw + L.pb);
    float *ksc = reinterpret_cast<float *>(pc_raw + L.ksc), *vsc = reinterpret_cast<float *>(pc_raw + L.vsc);
    float *mt = reinterpret_cast<float *>(pc_raw + L.mt), *mf = reinterpret_cast<float *>(pc_raw + L.mf);
    float *ro = reinterpret_cast<float *>(pc_raw + L.ro), *rl = reinterpret_cast<float *>(pc_raw + L.rl);
    float *rm = reinterpret_cast<float *>(pc_raw + L.rm), *mi = reinterpret_cast<float *>(pc_raw + L.mi);
    float *wa = reinterpret_cast<float *>(pc_raw + L.wa);
    __shared__ int selsh[PG_MAX_SEL], vfl[PG_MAX_SEL], physl[PG_MAX_SEL + 1];
    /* K (+ fp8 scales), V; the chunk maxes from the chunk's other CTAs; the owner's O partials;
     * its l and m (bars[4]: the merge weights are formed before O lands); F8X: the scales */
    __shared__ uint64_t bars[6];
    __shared__ float mloc[FD_MAX_HQ], wmx[NW][16], mr[PC_MAX_KPC / 16];
    __shared__ int wcnt[NW];
    /* Session 12, FX paged: EC, every warp ranks the selection itself (width <= 32: one
     * ballot), takes the entry of rank r (a CTA's 128 keys are the list's block r), loads its
     * table entry and issues its copies, with no block barrier before them; PREG, P and l from
     * the score registers (a warp's two n-tiles, every head; l per warp, then over the warps
     * in order), not through the score array; BRK (bf16), the S n-tile loop that runs once
     * ends after one pass (one body, not an unrolled one with a remainder; with §4.9 it
     * measured slower: 0.0072 against 0.0069-0.0070 ms). Session 13: PREG on the contiguous FX
     * instance too (PRC: up to 4 n-tiles a warp, kpd <= 256: a second S pass only when the CTA
     * has more than 128 keys; 6.82-6.86 against 7.15-7.34 us through the score array, batch 2) */
    constexpr bool PRC = FX && CONT;
    constexpr bool EC = FXP && (!FP8 || PA), BRK = FXP, PREG = (FXP && (!FP8 || PA)) || PRC;
    /* Session 14, F8X (the §4.9 FX instance): the K and V scales by their own bulk copies on
     * bars[5], issued first, so the tile maxima are formed while K is in flight (a warp a tile);
     * K fragments by two ldmatrix.x4 per n-tile; BRK on §4.9 too. Together (with PREG's
     * branch-free scores and P) 6.17-6.20 us against 6.44-6.49 (batch 3); each alone measured
     * slower (batch 1: the scale barrier 7.0, the P form 6.7, the score form 6.9 against 6.5) */
    constexpr bool F8X = FXP && PA;
    constexpr int NSL = PRC ? 4 : 2; /* score-register n-tiles a warp */
    __shared__ float lw[PREG ? NW : 1][16];
    /* session 15: EC, the block table (n_logical <= PC_BT_SH); PRC, each warp's key list (block
     * ids by rank, the own block last) */
    __shared__ int btsh[EC ? PC_BT_SH : 1], physw[PRC ? NW : 1][33];

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    /* before the earlier grid ends (programmatic dependent launch): the barriers (initialized
     * before (a): other CTAs' stores complete on bars[2], [3]) and the unused P rows */
    if (tid == 0)
        pc_bar_init(bars), pc_bar_init(bars + 1), pc_bar_init(bars + 2), pc_bar_init(bars + 3), pc_bar_init(bars + 4);
    if (F8X && tid == 0) pc_bar_init(bars + 5);
    for (int i = tid; i < (16 - hq) * PBP; i += PC_NT) pb[hq * PBP + i] = 0;
    const int r = (int)blockIdx.x, g = (int)blockIdx.y, t = (int)blockIdx.z;
    /* EC (session 15): the whole block table into shared memory before the grid wait, so the
     * entry of this CTA's block is a shared load after the ranking, not a second dependent
     * round trip (bf16 5.81-5.84 against 5.93-5.98 us, §4.9 6.27-6.32 against 6.42-6.45, batch
     * 1). The ordering contract this needs (pc_launch): the launch just before does not write
     * the table; longer tables load their entry after the ranking as before. */
    const bool tbs = EC && s.n_logical <= PC_BT_SH;
    if (tbs) {
        for (int i = tid; i < s.n_logical; i += PC_NT) btsh[i] = s.bt[i];
        __syncthreads();
    }
    pc_arrive_relaxed(); /* (a): this CTA runs; waited for before the first remote store */
    m3_pdl_wait();       /* launched as a programmatic dependent: the earlier grid's writes */
    m3_pdl_trigger();
    const bool sparse = FX || topk != NULL;
    /* round trip 1: pos, the selection entry of this thread (width <= PC_NT), the group's q */
    const int p = pos[t], bp = p / Bs;
    const m3_bf16 *qg = q + (size_t)t * ld_q + (size_t)g * hq * Dh;
    const int nq = hq * Dh; /* <= 16 x 128 = 8 x PC_NT */
    uint4 qv = make_uint4(0, 0, 0, 0);
    if (tid < nq / 8) qv = *reinterpret_cast<const uint4 *>(qg + (size_t)tid * 8);
    int b = -1, ph = 0;
    if (EC || PRC) { /* every warp its own copy of the selection (lanes: slots; width <= 32) */
        if (lane < width) b = topk[((int64_t)g * n_tok + t) * width + lane];
    } else
    if (sparse && tid < width) b = topk[((int64_t)g * n_tok + t) * width + tid];
    int n;
    /* CONT: rows [key][Dh + 8] of K and V of the n keys whose blocks ph lists in rank order, a
     * bulk copy per row (K by warps 0-3, V by 4-7: the same number of copies from each warp,
     * issued at once), this CTA's share of the row's keys split evenly; V rows past its keys up
     * to the 16-key tile zeroed (P is 0 there); K on bars[0], V on bars[1] */
    auto crows = [&](const int *ph, int nn) {
        const int kpr = ((nn + 15) / 16 + cs - 1) / cs * 16, k0r = r * kpr, nkr = max(0, min(kpr, nn - k0r));
        const m3_bf16 *kc = reinterpret_cast<const m3_bf16 *>(s.k), *vc = reinterpret_cast<const m3_bf16 *>(s.v);
        const int KP = Dh + 8, hn = PC_NT / 2, isv = tid >= hn;
        if (tid == 0) {
            pc_bar_expect(bars, (uint32_t)(nkr * Dh * 2));
            pc_bar_expect(bars + 1, (uint32_t)(nkr * Dh * 2));
        }
        for (int kk = tid - isv * hn; kk < nkr; kk += hn) {
            const int li = k0r + kk, ri = li / Bs, of = li - ri * Bs;
            const size_t so = ((size_t)(ph[ri] * Bs + of) * c.Hkv + g) * Dh;
            pc_bulk(reinterpret_cast<m3_bf16 *>(isv ? vsm : ksm) + (size_t)kk * KP, (isv ? vc : kc) + so,
                    (uint32_t)(Dh * 2), bars + isv);
        }
        for (int e = tid; e < ((nkr + 15) / 16 * 16 - nkr) * (Dh / 8); e += PC_NT)
            *reinterpret_cast<uint4 *>(reinterpret_cast<m3_bf16 *>(vsm) + (size_t)(nkr + e / (Dh / 8)) * KP +
                                       (e % (Dh / 8)) * 8) = make_uint4(0, 0, 0, 0);
    };
    if (EC) { /* ref m3_kv_sparse_table in selection order (FXP: sel_order), per warp: the usable
               * entries' ranks by one ballot, the own block last when selected; this CTA's keys
               * [128 r, 128 r + 128) are the list's block r: the entry of rank r (or the own
               * block when r = nf), its table entry (round trip 2, one address), the copies */
        const unsigned lt = (1u << lane) - 1u;
        const bool ok = lane < width && b >= 0 && b < bp, own = lane < width && b == bp;
        const unsigned bal = __ballot_sync(0xffffffffu, ok);
        const int nf = __popc(bal);
        const bool tail = __any_sync(0xffffffffu, own);
        n = tail ? nf * Bs + (p - Bs * bp + 1) : min(nf * Bs, p + 1);
        const unsigned hit = __ballot_sync(0xffffffffu, (ok && __popc(bal & lt) == r) || (own && r == nf));
        const int bsel = hit ? __shfl_sync(0xffffffffu, b, __ffs(hit) - 1) : -1;
        const int k0e = r * 128, nke = max(0, min(128, n - k0e)), nge = (nke + 15) / 16;
        const int kue = 16 * (128 / XC), vue = (16 / XC) * 128;
        if (tid == 0) {
            pc_bar_expect(bars, (uint32_t)nge * (kue * 16 + (FP8 && !F8X ? 128 : 0)));
            pc_bar_expect(bars + 1, (uint32_t)nge * vue * 16);
            if (F8X) pc_bar_expect(bars + 5, (uint32_t)nge * 128);
        }
        if (nge > 0) {
            const int pblk = tbs ? btsh[bsel] : s.bt[bsel];
            m3_gpu_attn_paged_src sx = s;
            sx.view = M3_KV_VIEW_PAGE, sx.g.block = 128, sx.g.page = 16, sx.g.dx = 128 / XC;
            const int gi = FP8 ? warp + NW * lane : tid;
            if (gi < nge) {
                int64_t ko, vo, so;
                pf_offs<XC>(sx, pblk * 128 + gi * 16, g, ko, vo, so);
                pc_bulk(ksm + (size_t)gi * kue * 16, reinterpret_cast<const unsigned char *>(s.k) + ko * EB,
                        (uint32_t)kue * 16, bars);
                if (F8X) { /* the scales after K (session 15: K lands first; 6.15-6.19 against
                            * 6.27-6.32 us with the scales first, batches 1-2), on their own
                            * barrier (the tile maxima) */
                    pc_bulk(vsc + gi * 16, s.v_scale + so, 64, bars + 5);
                    pc_bulk(ksc + gi * 16, s.k_scale + so, 64, bars + 5);
                }
                if (FP8 && !F8X) {
                    pc_bulk(ksc + gi * 16, s.k_scale + so, 64, bars);
                    pc_bulk(vsc + gi * 16, s.v_scale + so, 64, bars);
                }
                pc_bulk(vsm + (size_t)gi * vue * 16, reinterpret_cast<const unsigned char *>(s.v) + vo * EB,
                        (uint32_t)vue * 16, bars + 1);
            }
        }
    } else
    if (PRC) { /* session 15, the contiguous FX instance: sdec_k's list per warp (width <= 32:
                * one match, one ballot; block ids by rank, the own block last), its rows' copies
                * issued at once, no block barrier before them (6.21-6.33 against 6.33-6.47 us
                * after the barriers, batches 1-2) */
        const unsigned lt = (1u << lane) - 1u;
        const bool dup = (__match_any_sync(0xffffffffu, b) & lt) != 0u;
        const bool ok = lane < width && b >= 0 && b < bp && !dup;
        const unsigned bal = __ballot_sync(0xffffffffu, ok);
        const int nf = __popc(bal);
        if (ok) physw[warp][__popc(bal & lt)] = b;
        if (lane == 0) physw[warp][nf] = bp;
        __syncwarp();
        n = nf * Bs + (p - Bs * bp + 1);
        crows(physw[warp], n);
    } else
    if (CONT) { /* sdec_k's list (m3_gpu_attn_sparse_flash): the selected blocks b < bp in slot
                 * order, a repeat of an earlier slot counted once, then the own block up to p;
                 * physl holds block ids. Repeats within a warp by one match, earlier warps'
                 * slots (width > 32) by a loop; ranks by ballots. */
        if (tid < width) selsh[tid] = b;
        __syncthreads();
        const unsigned lt = (1u << lane) - 1u;
        bool dup = (__match_any_sync(0xffffffffu, b) & lt) != 0u;
        if (tid < width)
            for (int j = 0; j < (tid & ~31); j++) dup |= selsh[j] == b;
        const bool ok = tid < width && b >= 0 && b < bp && !dup;
        const unsigned bal = __ballot_sync(0xffffffffu, ok);
        if (lane == 0) wcnt[warp] = __popc(bal);
        const int nf = __syncthreads_count(ok); /* also: wcnt visible */
        if (ok) {
            int at = __popc(bal & lt);
            for (int w = 0; w < warp; w++) at += wcnt[w];
            physl[at] = b;
        }
        if (tid == 0) physl[nf] = bp;
        n = nf * Bs + (p - Bs * bp + 1);
    } else {
    /* round trip 2, before the ranking: the table entry of every usable selected block */
    if (sparse && b >= 0 && b <= bp) ph = s.bt[b];
    const bool ok = sparse && tid < width && b >= 0 && b < bp, own = sparse && tid < width && b == bp;
    if (tid < width) selsh[tid] = b, vfl[tid] = ok;
    const unsigned bal = __ballot_sync(0xffffffffu, ok);
    if (lane == 0) wcnt[warp] = __popc(bal);
    const int nf = __syncthreads_count(ok); /* also: selsh, vfl, wcnt visible */
    const int tail = __syncthreads_or(own);
    if (!sparse) {
        n = p + 1;
    } else { /* ref m3_kv_sparse_table, as pf_part_k: full blocks b < bp in selection order
              * or by id (a stable rank, duplicates kept), the own block last when selected */
        if (ok) {
            int at = 0;
            if (FXP || c.sel_order) { /* the usable entries before this one: ballots */
                at = __popc(bal & ((1u << lane) - 1u));
                for (int w = 0; w < warp; w++) at += wcnt[w];
            } else
                for (int j = 0; j < width; j++) at += vfl[j] && (selsh[j] < b || (selsh[j] == b && j < tid));
            physl[at] = ph;
        }
        if (own) physl[nf] = ph; /* every copy of the own block writes the same entry */
        n = tail ? nf * Bs + (p - Bs * bp + 1) : min(nf * Bs, p + 1);
    }
    }
    { /* the group's q into the staging array now: its load is then complete before the K / V
       * copies share the SM's memory path */
        uint16_t *qs = reinterpret_cast<uint16_t *>(sc);
        if (QLD) { /* rows of Dh + 8 (ldmatrix without bank conflicts); fp8 §4.9: the e4m3 values
                    * as fp16, each 16 dims in the order 0 1 4 5 8 9 12 13 2 3 6 7 10 11 14 15 (the
                    * A fragment of the permuted K units) */
            const int rr = tid / (Dh / 8), d0 = tid % (Dh / 8) * 8;
            uint32_t w[4] = {qv.x, qv.y, qv.z, qv.w};
            if (FP8) {
#pragma unroll
                for (int i = 0; i < 4; i++)
                    w[i] = pf_q2(m3_bf16_to_f32((uint16_t)(w[i] & 0xFFFFu)), m3_bf16_to_f32((uint16_t)(w[i] >> 16)),
                                 s.g.fp8_kind, s.ovf, true);
                /* dims d0.. = pairs p0..p3 (d0 % 16 == 0: words 0, 4, 1, 5 of the block; else 2, 6, 3, 7) */
                uint32_t *qb = reinterpret_cast<uint32_t *>(qs + (size_t)rr * (Dh + 8) + (d0 & ~15)) + ((d0 & 8) ? 2 : 0);
                *reinterpret_cast<uint2 *>(qb) = make_uint2(w[0], w[2]);
                *reinterpret_cast<uint2 *>(qb + 4) = make_uint2(w[1], w[3]);
            } else {
                *reinterpret_cast<uint4 *>(qs + (size_t)rr * (Dh + 8) + d0) = make_uint4(w[0], w[1], w[2], w[3]);
            }
        } else
        if (tid < nq / 8) *reinterpret_cast<uint4 *>(qs + (size_t)tid * 8) = qv;
    }
    if (!sparse) { /* dense: key k in logical block k / Bs */
        const int kb0 = r * kpc / Bs, kb1 = min(n, (r + 1) * kpc) - 1;
        for (int i = tid; kb0 + i <= kb1 / Bs && i < PC_MAX_PHYS; i += PC_NT) physl[i] = s.bt[kb0 + i];
    }
    __syncthreads();
    /* contiguous: the row's keys split evenly (kpc is the most a CTA takes), a chunk a CTA
     * (no partitions: each CTA's own max, no max exchange; empty CTAs weigh 0 in the merge) */
    const int kpd = CONT ? ((n + 15) / 16 + cs - 1) / cs * 16 : kpc;
    const int k0 = r * kpd, nk = max(0, min(kpd, n - k0)), ng = (nk + 15) / 16;
    const int chj = CONT ? r : k0 / ch, nch = CONT ? cs : (n + ch - 1) / ch; /* this CTA's chunk; the row's chunks */
    const int kbb = sparse ? 0 : k0 / Bs; /* physl index base */
    const int Pv = FX ? 16 : s.view == M3_KV_VIEW_BLOCK ? Bs : s.g.page;
    m3_gpu_attn_paged_src sx = s; /* FX: pf_offs on the compiled-in view */
    if (FX) sx.view = M3_KV_VIEW_PAGE, sx.g.block = 128, sx.g.page = 16, sx.g.dx = 128 / XC;
    const unsigned char *kbase = reinterpret_cast<const unsigned char *>(s.k);
    const unsigned char *vbase = reinterpret_cast<const unsigned char *>(s.v);
    /* K and V by bulk copies, group gi (16 keys, one page) by thread gi (bf16: warp 0 issues
     * every group's K copy, then every V copy, so K lands first) or, fp8 (4 copies a group), by
     * lane gi / NW of warp gi % NW (a bulk copy takes the uniform datapath: the lanes of a warp
     * issue one after another, the warps at once; session 9: bf16 0.0105 ms from warp 0
     * against 0.0108 spread, fp8 0.0120 spread against 0.0127 from warp 0): K [gi][Dh/x][16
     * keys][16 B] (the page's units: one copy when the view's page is 16 keys, else a 256-byte
     * run per dim unit), V [gi][16/x key units][Dh][16 B] (one copy), fp8 scales 64 bytes
     * each; K and its scales complete on bars[0], V on bars[1] */
    const int ku = 16 * (Dh / XC), vu = (16 / XC) * Dh, vg = tid / Dh, vd = tid % Dh;
    if (EC) {
        /* issued with the key list (above) */
    } else if (PRC) {
        /* issued with the key list (above) */
    } else if (CONT) {
        crows(physl, n);
    } else {
    if (tid == 0) {
        pc_bar_expect(bars, (uint32_t)ng * (ku * 16 + (FP8 ? 128 : 0)));
        pc_bar_expect(bars + 1, (uint32_t)ng * vu * 16);
    }
    const int gi = FP8 ? warp + NW * lane : tid;
    if (gi < ng) {
        const int k = k0 + gi * 16, kb = k / Bs;
        int64_t ko, vo, so;
        pf_offs<XC>(sx, physl[kb - kbb] * Bs + (k - kb * Bs), g, ko, vo, so);
        unsigned char *kd = ksm + (size_t)gi * ku * 16;
        if (Pv == 16) {
            pc_bulk(kd, kbase + ko * EB, (uint32_t)ku * 16, bars);
        } else {
            for (int dg = 0; dg < Dh / XC; dg++)
                pc_bulk(kd + dg * 256, kbase + (ko + (int64_t)dg * Pv * XC) * EB, 256, bars);
        }
        if (FP8) {
            pc_bulk(ksc + gi * 16, s.k_scale + so, 64, bars);
            pc_bulk(vsc + gi * 16, s.v_scale + so, 64, bars);
        }
        pc_bulk(vsm + (size_t)gi * vu * 16, vbase + vo * EB, (uint32_t)vu * 16, bars + 1);
    }
    }
    /* Q A fragments (rows = the group's heads, zero past hq; §4.9: fp8(q) as fp16), staged
     * through the score array; fp8 K units give a lane dims 4tq..4tq+3 of each 16 (Q permuted
     * alike) */
    uint32_t qa[FA_MAX_DH / 16][4];
    {
        uint16_t *qs = reinterpret_cast<uint16_t *>(sc); /* [hq][Dh], stored before the key list's barrier */
        /* SATURATE: each fragment word's two q values to e4m3 by the hardware (satfinite is
         * exactly it) as the word is read; else the software rounding, in place, first */
        const bool qhw = pa && (FX || s.ovf == M3_FP8_SATURATE);
        if (QLD) { /* 16 rows (FX: hq 16) by ldmatrix: matrices (rows 0-7, 8-15) x (dims 0-7, 8-15) */
            const int l7 = lane & 7, b3 = (lane >> 3) & 1, b4 = lane >> 4;
#pragma unroll
            for (int s2 = 0; s2 < 128 / 16; s2++) ldsm4(qa[s2], qs + (size_t)(l7 + b3 * 8) * (128 + 8) + s2 * 16 + b4 * 8);
        } else {
        if (pa && !qhw) { /* uniform */
            for (int e = tid; e < nq; e += PC_NT)
                qs[e] = __half_as_ushort(__float2half_rn(m3_round_fp8(m3_bf16_to_f32(qs[e]), s.g.fp8_kind, s.ovf)));
            __syncthreads();
        }
#pragma unroll
        for (int s2 = 0; s2 < FA_MAX_DH / 16; s2++) {
            if (s2 * 16 >= Dh) break;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int rr = gq + (i & 1) * 8;
                const int d = FP8 ? s2 * 16 + 4 * tq + (i >> 1) * 2 : s2 * 16 + 2 * tq + (i >> 1) * 8;
                const uint32_t w = rr < hq ? *reinterpret_cast<const uint32_t *>(qs + rr * Dh + d) : 0u;
                qa[s2][i] = qhw && rr < hq ? pf_q2(m3_bf16_to_f32((uint16_t)(w & 0xFFFFu)),
                                                   m3_bf16_to_f32((uint16_t)(w >> 16)), s.g.fp8_kind, s.ovf, true)
                                           : w;
            }
        }
        }
    }
    /* §4.9: the max V scale M of 16-key tile gt (tiles from the chunk start; lanes 0-15 its keys),
     * M / FP8_MAX (pd8_div, as pd8_part_k: the correctly rounded quotient wherever it is normal)
     * and 1 / (M + 1e-8), the P' quotient's reciprocal */
    auto tmax = [&](int gt) {
        float M = lane < 16 && gt * 16 + lane < nk ? vsc[gt * 16 + lane] : 0.0f;
#pragma unroll
        for (int o2 = 8; o2 > 0; o2 >>= 1) M = fmaxf(M, M3_SHFL_XOR(M, o2));
        if (lane == 0) mt[gt] = M, mf[gt] = pd8_div(M, c.fmax, pc.rfmax), mr[gt] = __frcp_rn(M + 1e-8f);
    };
    if (F8X) { /* the scales landed: the tile maxima (a warp a tile, ng <= 8) while K is in flight */
        pc_bar_wait(bars + 5, 0);
        if (warp < ng) tmax(warp);
    }
    pc_bar_wait(bars, 0); /* K and the scales landed */
    /* the Q staging is read before S goes into the same array (PREG: S stays in registers, no
     * barrier; session 15: §4.9 6.12-6.13 against 6.15-6.19 us, contiguous 6.23-6.29 against
     * 6.29-6.33, bf16 unchanged, batch 2) */
    if (!PREG) __syncthreads();
    /* S = Q K^T: a warp per 8-key n-tile, two n-tiles (nt, nt + NW) a step; each lane keeps
     * the max of its scores per head row (gq, gq + 8) */
    /* F8X: a key's 8 fp8 units (dims 16 u..) by two ldmatrix.x4 per n-tile (matrix j: unit 4 m + j
     * of the n-tile's 8 keys; lane gq, tq gets word tq of key gq's unit: the B fragment word) */
    constexpr int NKW = F8X ? 8 : 1;
    auto kld = [&](int nt, uint32_t (&w)[NKW]) {
        const int key = nt * 8 + (lane & 7);
        const unsigned char *rb = ksm + ((size_t)(key >> 4) * 8 * 16 + (key & 15)) * 16;
#pragma unroll
        for (int m = 0; m < NKW / 4; m++) ldsm4(w + 4 * m, rb + (size_t)(4 * m + (lane >> 3)) * 256);
    };
    auto kstep = [&](int key, int s2, float (&acc)[4], const uint32_t (&kw)[NKW]) {
        uint32_t bfr[2];
        if (FP8) {
            const uint32_t w =
                F8X ? kw[s2 % NKW]
                    : *reinterpret_cast<const uint32_t *>(ksm + (((size_t)(key >> 4) * (Dh / 16) + s2) * 16 + (key & 15)) * 16 +
                                                          4 * tq);
            if (pa) {
                bfr[0] = pf_h2(w, nullptr, true), bfr[1] = pf_h2(w >> 16, nullptr, true);
                m3_mma_f16_16816(acc, qa[s2], bfr);
            } else {
                bfr[0] = pf_b2(w, nullptr, true), bfr[1] = pf_b2(w >> 16, nullptr, true);
                m3_mma_bf16_16816(acc, qa[s2], bfr);
            }
        } else if (CONT) {
            const m3_bf16 *kr = reinterpret_cast<const m3_bf16 *>(ksm) + (size_t)key * (Dh + 8) + s2 * 16 + 2 * tq;
            bfr[0] = *reinterpret_cast<const uint32_t *>(kr);
            bfr[1] = *reinterpret_cast<const uint32_t *>(kr + 8);
            m3_mma_bf16_16816(acc, qa[s2], bfr);
        } else {
            const uint16_t *kb = reinterpret_cast<const uint16_t *>(ksm) +
                                 (((size_t)(key >> 4) * (Dh / 8) + 2 * s2) * 16 + (key & 15)) * 8 + 2 * tq;
            bfr[0] = *reinterpret_cast<const uint32_t *>(kb);
            bfr[1] = *reinterpret_cast<const uint32_t *>(kb + 16 * 8);
            m3_mma_bf16_16816(acc, qa[s2], bfr);
        }
    };
    float mx[2] = {-INFINITY, -INFINITY};
    float zr[NSL][4]; /* PREG: the scores of n-tiles warp + j NW (-inf past nk) */
#pragma unroll
    for (int i = 0; i < 4 * NSL; i++) zr[i >> 2][i & 3] = -INFINITY;
    auto kout = [&](int nt, const float (&c8)[2][4], int sl) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int rr = gq + (i >> 1) * 8, ki = nt * 8 + 2 * tq + (i & 1);
            if (PREG) { /* FX (hq 16): no branch per key; keys past nk score -inf (their K and
                         * scales, never written, are selected away) */
                const float d = c8[0][i] + c8[1][i];
                const float z = pa ? d * c.scale * ksc[ki] : d * c.scale;
                zr[sl][i] = ki < nk ? z : -INFINITY;
                mx[i >> 1] = fmaxf(mx[i >> 1], zr[sl][i]);
                continue;
            }
            if (rr >= hq || ki >= nk) continue; /* keys past nk are never read */
            float d = c8[0][i] + c8[1][i], z;
            if (pa) z = d * c.scale * ksc[ki]; /* §4.9 step 2 */
            else {
                if (FP8) d *= ksc[ki]; /* dequantized K */
                z = (!FX && c.eager) ? m3_round_bf16(m3_round_bf16(d) * c.scale) : d * c.scale;
            }
            sc[(size_t)rr * SCP + ki] = z;
            mx[i >> 1] = fmaxf(mx[i >> 1], z);
        }
    };
    auto spass = [&](int nt, int sl) { /* n-tiles nt, nt + NW into score slots sl, sl + 1 */
        float ca[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}}; /* even / odd k-steps */
        float cb[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        const bool two = (nt + NW) * 8 < nk; /* warp-uniform */
        uint32_t kwa[NKW], kwb[NKW];
        if (F8X) {
            kld(nt, kwa);
            if (two) kld(nt + NW, kwb);
        }
#pragma unroll
        for (int s2 = 0; s2 < FA_MAX_DH / 16; s2++) {
            if (s2 * 16 >= Dh) break;
            kstep(nt * 8 + gq, s2, ca[s2 & 1], kwa);
            if (two) kstep((nt + NW) * 8 + gq, s2, cb[s2 & 1], kwb);
        }
        kout(nt, ca, sl);
        if (two) kout(nt + NW, cb, sl + 1);
    };
    if (PRC) { /* the slots of both passes in registers (nk <= 256) */
        if (warp * 8 < nk) spass(warp, 0);
        if ((warp + 2 * NW) * 8 < nk) spass(warp + 2 * NW, 2);
    } else
    for (int nt = warp; nt * 8 < nk; nt += 2 * NW) {
        spass(nt, 0);
        if (BRK) break; /* FXP: nk <= 8 NW */
    }
#pragma unroll
    for (int r2 = 0; r2 < 2; r2++) {
        mx[r2] = fmaxf(mx[r2], M3_SHFL_XOR(mx[r2], 1));
        mx[r2] = fmaxf(mx[r2], M3_SHFL_XOR(mx[r2], 2));
    }
    if (tq == 0) wmx[warp][gq] = mx[0], wmx[warp][gq + 8] = mx[1];
    if (pa && !F8X)
        for (int gt = warp; gt < ng; gt += NW) tmax(gt);
    __syncthreads();
    /* the CTA's max per head (-inf without keys): over the warps' maxes */
    if (tid < hq) {
        float m = -INFINITY;
        for (int w = 0; w < NW; w++) m = fmaxf(m, wmx[w][tid]);
        mloc[tid] = m;
    }
    __syncthreads();
    pc_wait(); /* (a): every CTA of the cluster runs */
    if (spc > 1) { /* 1: the chunk's max: each CTA's to the chunk's other CTAs (st.async, completing
                    * on their bars[2]: no cluster-wide barrier), the max of the spc values */
        const int c0 = chj * spc, me = r - c0;
        if (tid < spc * hq) {
            const int to = tid / hq, h = tid % hq;
            if (c0 + to == r) mi[me * hq + h] = mloc[h];
            else pc_sta(pc_mapa(mi + me * hq + h, c0 + to), mloc[h], pc_mapa(bars + 2, c0 + to));
        }
        if (tid == 0) pc_bar_expect(bars + 2, (uint32_t)((spc - 1) * hq * 4));
        pc_bar_wait_cl(bars + 2, 0);
        __syncthreads(); /* the own slot */
        if (tid < hq) {
            float m = -INFINITY;
            for (int j = 0; j < spc; j++) m = fmaxf(m, mi[j * hq + tid]);
            mloc[tid] = m;
        }
        __syncthreads();
    }
    /* P of the CTA's keys and the denominators l (unrounded exponentials), a warp per head,
     * two keys a lane (zero past nk): bf16 P (fp8: times the V scale), or the §4.9 P' codes as
     * fp16 (P' = e v_scale FP8_MAX / (M + 1e-8): the correctly rounded quotient, pd8_div; a
     * quotient below the normal range is an fp8 zero either way) */
    /* two heads a warp at once (h, h + NW: independent chains; each head's sums in its
     * own fixed order, as one at a time) */
    auto prow = [&](int h, float m, int ip, float &l) {
        const int il = 2 * ip;
        float pv[2] = {0.0f, 0.0f};
#pragma unroll
        for (int k2 = 0; k2 < 2; k2++)
            if (il + k2 < nk) {
                const float ex = expf(sc[(size_t)h * SCP + il + k2] - m);
                l += ex;
                if (pa) { /* §4.9 step 4 */
                    const int ti = (il + k2) / 16;
                    pv[k2] = pd8_div(ex * vsc[il + k2] * c.fmax, mt[ti] + 1e-8f, mr[ti]);
                } else {
                    pv[k2] = FP8 ? ex * vsc[il + k2] : ex;
                }
            }
        *reinterpret_cast<uint32_t *>(pb + h * PBP + il) =
            pa ? pf_q2(pv[0], pv[1], s.g.fp8_kind, s.ovf, true) : pack_bf16(pv[0], pv[1]);
    };
    auto psend = [&](int h, float m, float l) {
        l = m3_warp_sum(l);
        if (lane < cs) { /* step 2's (l, the chunk's max) for head h, to owner `lane` already */
            const uint32_t mb = pc_mapa(bars + (EARLY ? 4 : 3), lane);
            pc_sta(pc_mapa(rl + r * hq + h, lane), l, mb);
            pc_sta(pc_mapa(rm + r * hq + h, lane), m, mb);
        }
    };
    if (PREG) { /* FX: keys nt 8 + 2 tq (+ 1) of n-tiles nt = warp + sl NW, rows gq, gq + 8 */
        float lp[2] = {0.0f, 0.0f};
        const float mrow[2] = {mloc[gq], mloc[gq + 8]};
#pragma unroll
        for (int sl = 0; sl < NSL; sl++) {
            const int nt = warp + sl * NW;
            if (PRC && nt * 8 >= ng * 16) continue; /* P's columns end at the CTA's last 16-key tile */
            /* no branch per key (session 14: bf16 5.80-5.85 against 6.05-6.13 us, contiguous 6.44-6.54
             * against 6.71-6.83, batch 2): the tile's M + 1e-8, 1 / (M + 1e-8) and the keys' V
             * scales loaded once for both rows; keys past nk give P 0 and add 0 to l (their
             * scores are -inf, their scales never written: selected away) */
            const int k0s = nt * 8 + 2 * tq, ti = k0s >> 4;
            float2 vs2 = make_float2(0.0f, 0.0f);
            float my = 0.0f, mry = 0.0f;
            if (pa) vs2 = *reinterpret_cast<const float2 *>(vsc + k0s), my = mt[ti] + 1e-8f, mry = mr[ti];
#pragma unroll
            for (int r2 = 0; r2 < 2; r2++) {
                float pv[2];
#pragma unroll
                for (int k2 = 0; k2 < 2; k2++) {
                    const bool on = k0s + k2 < nk;
                    const float e0 = expf(zr[sl][2 * r2 + k2] - mrow[r2]), ex = on ? e0 : 0.0f;
                    lp[r2] += ex;
                    /* §4.9 step 4 */
                    const float pp = pa ? pd8_div(ex * (k2 ? vs2.y : vs2.x) * c.fmax, my, mry) : ex;
                    pv[k2] = on ? pp : 0.0f;
                }
                *reinterpret_cast<uint32_t *>(pb + (gq + 8 * r2) * PBP + nt * 8 + 2 * tq) =
                    pa ? pf_q2(pv[0], pv[1], s.g.fp8_kind, s.ovf, true) : pack_bf16(pv[0], pv[1]);
            }
        }
#pragma unroll
        for (int r2 = 0; r2 < 2; r2++) {
            lp[r2] += M3_SHFL_XOR(lp[r2], 1);
            lp[r2] += M3_SHFL_XOR(lp[r2], 2);
        }
        if (tq == 0) lw[warp][gq] = lp[0], lw[warp][gq + 8] = lp[1];
    } else
    for (int h = warp; h < hq; h += 2 * NW) {
        const bool two = h + NW < hq; /* warp-uniform */
        const float m0 = mloc[h], m1 = two ? mloc[h + NW] : 0.0f;
        float l0 = 0.0f, l1 = 0.0f;
        for (int ip = lane; ip < ng * 8; ip += 32) {
            prow(h, m0, ip, l0);
            if (two) prow(h + NW, m1, ip, l1);
        }
        psend(h, m0, l0);
        if (two) psend(h + NW, m1, l1);
    }
    pc_bar_wait(bars + 1, 0); /* V landed; the keys past the list are zeroed */
    if (!CONT && nk % 16 && tid < vu) {
        const int nv = nk - ((ng - 1) * 16 + vg * XC); /* valid keys of the last group's unit */
        unsigned char *dst = vsm + ((size_t)((ng - 1) * (16 / XC) + vg) * Dh + vd) * 16;
        for (int bb = (nv > 0 ? nv : 0) * EB; bb < 16; bb++) dst[bb] = 0;
    }
    __syncthreads();
    if (PREG) { /* (l, the chunk's max) of head tid / 16 to owner tid % 16 (the warps' l in order) */
        const int h = tid >> 4, ow = tid & 15;
        float l = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) l += lw[w][h];
        const uint32_t mb = pc_mapa(bars + 4, ow);
        pc_sta(pc_mapa(rl + r * hq + h, ow), l, mb);
        pc_sta(pc_mapa(rm + r * hq + h, ow), mloc[h], mb);
    }
    /* O = P V: a warp per 16-dim pair of n-tiles, one mma chain each (two chains, even and odd
     * k-steps, measured the same in session 9) */
    float o[2][4] = {};
    const int np = warp;
    auto pvstep = [&](int ks, float (&oo)[2][4]) {
        uint32_t a[4];
        if (FP8) {
            const m3_bf16 *pr = pb + gq * PBP + ks * 16 + 4 * tq;
            a[0] = *reinterpret_cast<const uint32_t *>(pr);
            a[1] = *reinterpret_cast<const uint32_t *>(pr + 8 * PBP);
            a[2] = *reinterpret_cast<const uint32_t *>(pr + 2);
            a[3] = *reinterpret_cast<const uint32_t *>(pr + 8 * PBP + 2);
        } else {
            const m3_bf16 *pr = pb + gq * PBP + ks * 16 + 2 * tq;
            a[0] = *reinterpret_cast<const uint32_t *>(pr);
            a[1] = *reinterpret_cast<const uint32_t *>(pr + 8 * PBP);
            a[2] = *reinterpret_cast<const uint32_t *>(pr + 8);
            a[3] = *reinterpret_cast<const uint32_t *>(pr + 8 * PBP + 8);
        }
        if (CONT) { /* V rows by ldmatrix.trans: dims np 16.. + 7 in vb[0..1], the next 8 in vb[2..3] */
            uint32_t vb[4];
            const int l7 = lane & 7, b3 = (lane >> 3) & 1, b4 = lane >> 4;
            ldsm4t(vb, reinterpret_cast<const m3_bf16 *>(vsm) + (size_t)(ks * 16 + l7 + b3 * 8) * (Dh + 8) +
                           np * 16 + b4 * 8);
            m3_mma_bf16_16816(oo[0], a, vb);
            m3_mma_bf16_16816(oo[1], a, vb + 2);
        } else
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++) {
            const int d = np * 16 + h2 * 8 + gq;
            uint32_t bfr[2];
            if (FP8) {
                const uint32_t w = *reinterpret_cast<const uint32_t *>(vsm + ((size_t)ks * Dh + d) * 16 + 4 * tq);
                if (pa) { /* exact P' v8 sums of one §4.9 tile, times M / FP8_MAX */
                    bfr[0] = pf_h2(w, nullptr, true), bfr[1] = pf_h2(w >> 16, nullptr, true);
                    float t4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    m3_mma_f16_16816(t4, a, bfr);
                    const float f = mf[ks];
#pragma unroll
                    for (int i = 0; i < 4; i++) oo[h2][i] += t4[i] * f;
                } else {
                    bfr[0] = pf_b2(w, nullptr, true), bfr[1] = pf_b2(w >> 16, nullptr, true);
                    m3_mma_bf16_16816(oo[h2], a, bfr);
                }
            } else {
                const uint16_t *vb = reinterpret_cast<const uint16_t *>(vsm) + ((size_t)(2 * ks) * Dh + d) * 8 + 2 * tq;
                bfr[0] = *reinterpret_cast<const uint32_t *>(vb);
                bfr[1] = *reinterpret_cast<const uint32_t *>(vb + (size_t)Dh * 8);
                m3_mma_bf16_16816(oo[h2], a, bfr);
            }
        }
    };
    if (np * 16 < Dh) {
        if (FXP && PA) { /* §4.9 FX (ng <= 8): straight guarded steps, so the tiles' mma (each summed
                          * apart, then scaled) issue back to back: 6.50-6.54 against 7.07-7.13 us
                          * with the loop unrolled 4 (session 13, batch 1; no change on bf16) */
#pragma unroll
            for (int ks = 0; ks < 8; ks++)
                if (ks < ng) pvstep(ks, o);
        } else
#pragma unroll 4
        for (int ks = 0; ks < ng; ks++) pvstep(ks, o);
    }
    /* 2: push O to the owners (st.async, completing on the owner's bars[3]; l and the chunk's
     * max went with P); O's elements e = head Dh + dim */
    const int epo = FX ? 128 : pc.epo;
    const float repo = 1.0f / (float)epo;
    if (np * 16 < Dh)
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++)
#pragma unroll
            for (int r2 = 0; r2 < 2; r2++) {
                const int rr = gq + r2 * 8, e = rr * Dh + np * 16 + h2 * 8 + 2 * tq;
                if (rr >= hq) continue;
                /* e / epo: (e + 0.5) / epo is >= 1 / (2 epo) from an integer, far above the
                 * float error (e < 2^11, epo <= 256) */
                const int ow = (int)(((float)e + 0.5f) * repo);
                pc_sta2(pc_mapa(ro + (size_t)r * epo + (e - ow * epo), ow), o[h2][2 * r2], o[h2][2 * r2 + 1],
                        pc_mapa(bars + 3, ow));
            }
    /* 3: this owner's elements [e0, e1) once every CTA's bytes landed (no cluster barrier: a
     * CTA only exits after the stores into it completed, and none reads another's memory) */
    const int E = hq * Dh, e0 = r * epo, e1 = min(E, e0 + epo), ne = max(0, e1 - e0);
    if (EARLY) { /* the weights once every CTA's l and m landed (bars[4], sent from the P loops:
                  * formed while the O pushes are still arriving), then the sums once O landed */
        if (tid == 0) pc_bar_expect(bars + 4, (uint32_t)(cs * 2 * hq * 4));
        pc_bar_wait_cl(bars + 4, 0);
        cl_weights<false, MSP, MNJ, MEH>(rl, rm, hq, nch, spc, e0, ne, Dh, reinterpret_cast<float4 *>(wa), tid, PC_NT);
        if (tid == 0) pc_bar_expect(bars + 3, (uint32_t)(cs * ne * 4));
        pc_bar_wait_cl(bars + 3, 0);
        __syncthreads(); /* the weights */
        cl_sums<MSP, MNJ, MEH>(out + (size_t)t * c.H * Dh + (size_t)g * hq * Dh + e0, ro, epo, nch, spc,
                               FXP || (!CONT && c.part > 0), e0, ne, Dh, reinterpret_cast<const float4 *>(wa), tid,
                               PC_NT);
    } else { /* contiguous: l, m and O on bars[3], then the whole merge */
        if (tid == 0) pc_bar_expect(bars + 3, (uint32_t)(cs * (ne + 2 * hq) * 4));
        pc_bar_wait_cl(bars + 3, 0);
        cl_merge<false>(out + (size_t)t * c.H * Dh + (size_t)g * hq * Dh + e0, ro, epo, rl, rm, hq, nch, spc,
                        (FXP || c.part > 0), e0, ne, Dh, reinterpret_cast<float4 *>(wa), tid, PC_NT);
    }
#else
    (void)out; (void)q; (void)ld_q; (void)s; (void)pos; (void)n_tok; (void)topk; (void)width; (void)pc;
#endif
}

/* pc_k's launch parameters for this grid, or false when it does not apply: the geometry
 * (c.dec's fast layouts, with Dh % 16 == 0 in place of Dh == 128; §4.9 only with 16-key
 * tiles), rows of at most PC_MAX_CS CTAs, and (unless forced) a grid that fits the SMs once */
static bool pc_plan(const m3_gpu *g, const m3_gpu_attn_paged_src *src, int n_tok, const pf_cfg &c,
                    bool force, pc_cfg *pc) {
    const int Pv = src->view == M3_KV_VIEW_BLOCK ? src->g.block : src->g.page;
    const bool fp8 = c.fp8;
    if (!c.fast || !c.qvec || c.Dh % 16 || src->g.block % 16 || Pv % 16 || c.ch % 16) return false;
    if (fp8 && !(c.hw && m3_aligned16(src->k_scale) && m3_aligned16(src->v_scale))) return false;
    if (c.pa && !(c.pvf16 && c.tile == 16)) return false;
    if (c.nchx > PC_MAX_CS || n_tok > 65535) return false;
    memset(pc, 0, sizeof *pc);
    pc->c = c;
    const int gpc = c.ch / 16; /* 16-key groups of a chunk */
    for (int d = 1; d <= gpc; d++)
        if (gpc % d == 0 && c.nchx * d <= PC_MAX_CS) pc->spc = d;
    pc->kpc = c.ch / pc->spc;
    pc->cs = c.nchx * pc->spc;
    const int E = c.hq * c.Dh;
    pc->epo = ((E + pc->cs - 1) / pc->cs + 3) / 4 * 4;
    if (pc->epo > PC_NT) return false;
    pc->rfmax = c.fmax > 0.0f ? 1.0f / c.fmax : 0.0f;
    const int n_sm = g->n_sm > 0 ? g->n_sm : 132;
    return force || (int64_t)c.Hkv * n_tok * pc->cs <= n_sm;
}

typedef void (*pc_fn)(m3_bf16 *, const m3_bf16 *, int, m3_gpu_attn_paged_src, const int32_t *,
                      int, const int32_t *, int, pc_cfg);
static m3_status pc_launch(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                           const m3_gpu_attn_paged_src *src, const int32_t *d_pos, int n_tok,
                           const int32_t *d_topk, int width, const pc_cfg &pc, bool *done) {
    *done = false;
    /* the instance: bf16, fp8 dequantized, §4.9 (its own: the P' path compiled in), contiguous;
     * each also with M3's geometry and atom's flags compiled in (FX) where they match */
    const bool fx = !pc.cont && d_topk && pc.c.hq == 16 && pc.c.Dh == 128 && pc.c.ch == 256 &&
                    src->g.block == 128 && src->view == M3_KV_VIEW_PAGE && src->g.page == 16 && pc.kpc == 128 &&
                    pc.cs == 16 && pc.spc == 2 && pc.epo == 128 && src->g.dx * (pc.c.fp8 ? 16 : 8) == 128 &&
                    !pc.c.eager && pc.c.sel_order && pc.c.part > 0 && width <= 32 /* EC: one ballot */ &&
                    (!pc.c.fp8 || (src->ovf == M3_FP8_SATURATE && src->g.fp8_kind == M3_FP8_E4M3FN));
    const bool fxc = pc.cont && pc.c.hq == 16 && pc.c.Dh == 128 && src->g.block == 128 && pc.cs == 16 &&
                     pc.spc == 1 && pc.epo == 128 && !pc.c.eager && width <= 32 /* PRC: one ballot */;
    const int base = pc.cont ? 2 : pc.c.fp8 ? (pc.c.pa ? 3 : 1) : 0;
    const int fi = base + (fx || fxc ? 4 : 0);
    static const pc_fn fns[8] = {pc_k<false, false, false, false>, pc_k<true, false, false, false>,
                                 pc_k<false, true, false, false>, pc_k<true, false, true, false>,
                                 pc_k<false, false, false, true>, pc_k<true, false, false, true>,
                                 pc_k<false, true, false, true>, pc_k<true, false, true, true>};
    const pc_fn fn = fns[fi];
    const size_t sh = pc_layout(pc, pc.c.fp8 ? 1 : 2).total;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)pc.cs, (unsigned)pc.c.Hkv, (unsigned)n_tok);
    cfg.blockDim = dim3(PC_NT);
    cfg.dynamicSmemBytes = sh;
    cfg.stream = g->stream;
    /* a cluster per row; a programmatic dependent of the launch before it (pc_k waits for that
     * grid before it reads q, pos, the selection or K / V, and lets the next launch start at
     * once). Ordering contract (session 15): the paged FX instances read the block table
     * (src->bt, n_logical <= PC_BT_SH entries) BEFORE m3_pdl_wait, while the launch just before
     * may still run; that launch may write q, pos, the selection and the cache (the model's
     * q/k norm + RoPE + cache write writes the token's K / V, the indexer the selection:
     * tests/gpu_attn_paged.c paged_flash_after_cache_write), but not the block table, which
     * the model uploads once (gpu/model.hip); a kernel that rewrites the table must have
     * completed before this call is launched. Everything else is read after the wait. */
    cudaLaunchAttribute at[2] = {};
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)pc.cs, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = 2;
    static int pc_attr[64][8];
    static size_t pc_ok[64][8][PC_MAX_CS + 1], pc_no[64][8][PC_MAX_CS + 1];
    const int dv = g->device & 63;
    if (!cl_ready(g, (const void *)fn, &cfg, pc_attr[dv][fi], pc_ok[dv][fi][pc.cs], pc_no[dv][fi][pc.cs]))
        return M3_OK;
    M3_HIP_TRY(cudaLaunchKernelEx(&cfg, fn, d_out, d_q, ld_q, *src, d_pos, n_tok, d_topk, width, pc));
    *done = true;
    return m3_gpu_launched_(g, "pc_k", __FILE__, __LINE__);
}

/* m3_gpu_attn_sparse_flash's few rows (T = 1 decode) through pc_k<false, true>: a cluster of
 * cs <= 16 CTAs per row, each up to kpc keys of sdec_k's list (the row's keys split evenly in
 * the kernel), each CTA its own chunk (numerics free: P against the CTA's max, fp32 LSE
 * merge by cl_merge); *done false when the grid does not fit (rows x cs <= SMs, kpc <= 256) */
static m3_status pc_sparse_launch(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                                  const m3_bf16 *d_k, const m3_bf16 *d_v, const int32_t *d_pos,
                                  int n_tok, const int32_t *d_topk, int width, int block,
                                  const m3_attn_params *ap, const m3_profile *p, bool *done) {
    *done = false;
    const int Hkv = ap->n_kv_head, Dh = ap->head_dim, hq = ap->n_head / Hkv;
    const int ntile = (width + 1) * (block / 16); /* 16-key tiles of a row, at most */
    const int cs = ntile < PC_MAX_CS ? ntile : PC_MAX_CS, tpc = (ntile + cs - 1) / cs;
    if (tpc * 16 > PC_MAX_KPC || Dh % 16 || n_tok > 65535 ||
        (int64_t)n_tok * Hkv * cs > (g->n_sm > 0 ? g->n_sm : 132))
        return M3_OK;
    pc_cfg pc;
    memset(&pc, 0, sizeof pc);
    pc.cont = 1, pc.cs = cs, pc.spc = 1, pc.kpc = tpc * 16;
    pc.epo = ((hq * Dh + cs - 1) / cs + 3) / 4 * 4;
    if (pc.epo > PC_NT) return M3_OK;
    pf_cfg &c = pc.c;
    c.H = ap->n_head, c.Hkv = Hkv, c.hq = hq, c.Dh = Dh, c.Dhp = Dh, c.ch = pc.kpc, c.nchx = cs;
    c.scale = ap->scale, c.eager = p->attn_scores == M3_SCORES_BF16_EAGER;
    m3_gpu_attn_paged_src src;
    memset(&src, 0, sizeof src);
    src.k = d_k, src.v = d_v, src.g.block = block; /* pc_k<false, true> reads these only */
    return pc_launch(g, d_out, d_q, ld_q, &src, d_pos, n_tok, d_topk, width, pc, done);
}
#endif

#if defined(M3_HIP_NVIDIA)
/* pf_part_k (+ pf_merge_k) for n_tok tokens, c filled but for cpb / nsp / fused */
static m3_status pf_launch(m3_gpu *g, m3_bf16 *d_out, const m3_bf16 *d_q, int ld_q,
                           const m3_gpu_attn_paged_src *src, const int32_t *d_pos, int n_tok,
                           const int32_t *d_topk, int width, pf_cfg c) {
    {   /* few rows (batch-1 decode): pc_k, one cluster per row (test hook flash_kernel 3:
         * pc_k wherever the geometry allows) */
        pc_cfg pc;
        const bool force = src->flash_kernel == 3;
        /* pc_k reads one block table: a decode batch of several sequences (bt_ld) skips it */
        if ((src->bt_ld == 0 || n_tok == 1) && (src->flash_kernel == 0 || force) &&
            pc_plan(g, src, n_tok, c, force, &pc)) {
            bool done;
            M3_TRY(pc_launch(g, d_out, d_q, ld_q, src, d_pos, n_tok, d_topk, width, pc, &done));
            if (done) return M3_OK;
        }
    }
    const bool fp8 = c.fp8;
    const int n_sm = g->n_sm > 0 ? g->n_sm : 132;
    /* the decode kernels (pd_part_k; pd8_part_k under §4.9) when each of PD_WPS warps per SM
     * gets a chunk (decode over long rows); else pf_part_k. Test hook: flash_kernel (1:
     * pf_part_k, 2: the decode kernel where it fits). */
    bool dec = c.dec && (int64_t)c.Hkv * n_tok * c.nchx >= (int64_t)PD_WPS * n_sm;
    if (src->flash_kernel == 1) dec = false;
    if (src->flash_kernel == 2 || src->flash_kernel == 4) dec = c.dec;
    const bool p8 = dec && c.pa; /* §4.9 (e4m3fn: c.dec): pd8_part_k */
    if (dec) {
        /* chunks per block: the estimated makespan (rounds of blocks over the SMs' slots
         * times the chunks of the busiest warp) within 3% of the smallest, with the most
         * chunks per block (fewer blocks, prologues and partials). pd_part_k too since
         * session 11 (it took the fewest blocks that give each SM PD_WPS warps: the same cpb
         * for T = 1 and prefill rows, but cpb 4 for the B=64 sparse decode batch, 0.0999 ms
         * against cpb 8's 0.0838 ms, batch 1). 3% (2% before session 11): the B=64 dense
         * batch (256 rows of 512 chunks) then takes cpb 512, a row a block (128 chunk
         * rounds), not cpb 12 (126 rounds, 43 partials a row through pf_merge_k): bf16 cpb
         * 256 4.74 ms, 16 4.86, 8 4.91 (batch 1); T = 1 and prefill rows keep their cpb */
        const int slots = PD_WPS / PD_W * n_sm;
        const int64_t rows = (int64_t)c.Hkv * n_tok;
        auto mks = [&](int cpb) {
            const int64_t blocks = rows * ((c.nchx + cpb - 1) / cpb);
            return (double)((blocks + slots - 1) / slots * ((cpb + PD_W - 1) / PD_W));
        };
        double best = mks(1);
        for (int cpb = 2; cpb <= c.nchx; cpb++) best = fmin(best, mks(cpb));
        for (int cpb = 1; cpb <= c.nchx; cpb++)
            if (mks(cpb) <= 1.03 * best) c.cpb = cpb;
        if (src->flash_cpb > 0) c.cpb = src->flash_cpb < c.nchx ? src->flash_cpb : c.nchx;
        c.nsp = (c.nchx + c.cpb - 1) / c.cpb;
    } else
    /* chunks per block: enough blocks for PF_BPS per multiprocessor, the rest as consecutive
     * chunks of one block (one prologue, one pipeline, merged in registers). A block's next
     * chunk loads from PF_NST tiles ahead: a full chunk needs >= PF_NST tiles. */
    {
        c.cpb = 1;
        if (2 * ((c.ch + PF_TK - 1) / PF_TK) >= PF_NST) {
            const int64_t rows = (int64_t)c.Hkv * n_tok, want = (int64_t)PF_BPS * (g->n_sm > 0 ? g->n_sm : 132);
            int64_t nsp = (want + rows - 1) / rows;
            if (nsp > c.nchx) nsp = c.nchx;
            if (nsp < 1) nsp = 1;
            c.cpb = (int)((c.nchx + nsp - 1) / nsp);
        }
        const int fc = src->flash_cpb; /* test hook */
        if (fc > 0 && 2 * ((c.ch + PF_TK - 1) / PF_TK) >= PF_NST) c.cpb = fc < c.nchx ? fc : c.nchx;
        c.nsp = (c.nchx + c.cpb - 1) / c.cpb;
    }
    c.fused = c.nsp <= PF_FUSE_MAX;
    c.cnt = g->counters + M3_GPU_CNT_PF;
    const size_t per_tok = (size_t)c.Hkv * c.nsp * c.hq * (c.Dh + 2) * sizeof(float) + 64;
    int tb = (int)(PF_PART_CAP / per_tok);
    if (tb < 1) tb = 1;
    if (tb > n_tok) tb = n_tok;
    if (tb > PF_MAX_CNT / c.Hkv) tb = PF_MAX_CNT / c.Hkv;
    if (tb > 65535) tb = 65535;
    /* rows of more than PF_FUSE_MAX partials (dense decode at 128K: 64 a row): merged inside
     * the decode kernels by their first hq blocks to arrive (pd_split_merge) when the grid fits
     * one wave of block slots (its waiting blocks need the others resident); else pf_merge_k.
     * Test hook flash_kernel 4: the decode kernel with pf_merge_k */
    c.split = 0;
    if (dec && !c.fused && src->flash_kernel != 4 && c.Dh == FA_MAX_DH) {
        const int64_t slots = (int64_t)(PD_WPS / PD_W) * n_sm, rows = (int64_t)c.Hkv * tb;
        const int k = c.hq < c.nsp ? c.hq : c.nsp;
        /* one wave, and at most a quarter of the slots waiting (another launch beside it,
         * e.g. a second context's, keeps slots for the blocks both wait for) */
        if (c.nsp * rows <= slots && 4 * k * rows <= slots) c.split = k;
    }
    const size_t sh = p8 ? pd8_smem_bytes(c) : dec ? pd_smem_bytes(c) : pf_smem_bytes(c),
                 msh = ((size_t)3 * c.nsp + 1 + (size_t)(PF_MT / 32) * c.Dh) * sizeof(float);
    /* raise the shared-memory limits once per size (a host call per launch costs more than a
     * T = 1 decode kernel); a device runtime keeps the attribute for the process */
    static size_t pf_set_dev[64][10]; /* per device: the attribute is the device's */
    size_t *pf_set = pf_set_dev[g->device & 63];
    typedef void (*pf_fn)(m3_bf16 *, const m3_bf16 *, int, m3_gpu_attn_paged_src, const int32_t *,
                          int, int, const int32_t *, int, float *, float *, int *, pf_cfg);
    /* pd8_part_k with the §4.9 tile test and the M3 views' pages (16, 128) compiled in: each
     * instance allocates its registers for its own pass-2 path, and a compile-time page makes
     * the ring's K copies one base plus immediates; the dense layers' one-token instance
     * (SP) reads its first table entries and prefetches its first K groups before the wait */
    const pf_fn kf[9] = {pf_part_k<false>, pf_part_k<true>, pd_part_k<false>, pd_part_k<true>,
                         pd8_part_k<false, 0>, pd8_part_k<true, 0>, pd8_part_k<false, 16>,
                         pd8_part_k<true, 128>, pd8_part_k<true, 128, true>};
    int fi = (fp8 ? 1 : 0) + (dec ? 2 : 0);
    if (p8) {
        const bool tp = c.tile >= 32;
        const int pv = src->view == M3_KV_VIEW_BLOCK ? src->g.block : src->g.page;
        fi = !tp && pv == 16 ? 6 : tp && pv == 128 ? (!d_topk && n_tok == 1 ? 8 : 7) : 4 + tp;
    }
    const int nth = dec ? PD_W * 32 : PF_THREADS;
    /* the decode kernels as programmatic dependents of the launch before them (their loads of
     * q, the positions and the selection wait for it: m3_pdl_wait), and they let the next
     * launch start at their entry; pd_part_k at one token of a dense row (c.spec) prefetches
     * its warps' first K groups into L2 before the wait (m3_gpu.h's ordering) */
    c.spec = dec && !p8 && !d_topk && n_tok == 1;
    /* pd8_part_k's ring with an L2 evict-first policy where each row's keys are its own (one
     * token, or a table per token): read once a launch */
    c.l2ef = p8 && (n_tok == 1 || src->bt_ld != 0);
    if (sh > pf_set[fi]) {
        M3_TRY(smem_limit((const void *)kf[fi], sh, "hipFuncSetAttribute(pf_part_k)"));
        pf_set[fi] = sh;
    }
    if (!c.fused && !c.split && msh > pf_set[9]) {
        M3_TRY(smem_limit((const void *)pf_merge_k, msh, "hipFuncSetAttribute(pf_merge_k)"));
        pf_set[9] = msh;
    }
    const size_t mark = m3_gpu_mark(g);
    const size_t ns = (size_t)tb * c.Hkv * c.nsp * c.hq;
    float *po, *pml;
    int *nk;
    m3_status s = m3_gpu_alloc(g, (void **)&po, ns * c.Dh * sizeof(float));
    if (s == M3_OK) s = m3_gpu_alloc(g, (void **)&pml, ns * 2 * sizeof(float));
    if (s == M3_OK) s = m3_gpu_alloc(g, (void **)&nk, (size_t)tb * c.Hkv * sizeof(int));
    for (int t0 = 0; s == M3_OK && t0 < n_tok; t0 += tb) {
        const int nt = n_tok - t0 < tb ? n_tok - t0 : tb;
        const dim3 grid((unsigned)c.nsp, (unsigned)c.Hkv, (unsigned)nt);
        s = m3_gpu_launch_pdl(g, dec, kf[fi], grid, dim3(nth), sh, d_out, d_q, ld_q, *src, d_pos, t0,
                              n_tok, d_topk, width, po, pml, nk, c);
        if (s == M3_OK) s = m3_gpu_launched_(g, "pf_part_k", __FILE__, __LINE__);
        if (s == M3_OK && !c.fused && !c.split) {
            pf_merge_k<<<dim3((unsigned)nt, (unsigned)c.H), PF_MT, msh, g->stream>>>(
                d_out, po, pml, nk, t0, c);
            s = m3_gpu_launched_(g, "pf_merge_k", __FILE__, __LINE__);
        }
    }
    m3_gpu_release(g, mark); /* later work on the stream runs after these kernels */
    return s;
}

#endif

extern "C" m3_status m3_gpu_attn_paged_flash_ok(const m3_gpu_attn_paged_src *src,
                                                const m3_attn_params *ap, const m3_profile *p,
                                                int width) {
    const int hq = ap->n_head / ap->n_kv_head;
    if (!p->attn_out_bf16)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu paged attention flash: profile %s keeps fp32 "
                         "outputs (use m3_gpu_attn_paged_f32)", p->name);
    if (hq > FD_MAX_HQ || ap->head_dim > FA_MAX_DH)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu paged attention flash: H/Hkv=%d Dh=%d (needs "
                         "H/Hkv <= %d, Dh <= %d)", hq, ap->head_dim, FD_MAX_HQ, FA_MAX_DH);
    if (src->g.elem == M3_KV_F32)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu paged attention flash: fp32 cache elements");
    if (width > PG_MAX_SEL)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu paged attention flash: top-k width %d > %d",
                         width, PG_MAX_SEL);
    if (p->attn_partition > PF_MAX_CH)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu paged attention flash: attn_partition %d > %d",
                         p->attn_partition, PF_MAX_CH);
    const int tile = width > 0 ? src->g.page : src->g.block;
    if (src->g.elem == M3_KV_FP8 && src->fp8_pa && tile > PF_MAX_CH)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu paged attention flash: fp8 tile of %d keys > %d",
                         tile, PF_MAX_CH);
    return M3_OK;
}
