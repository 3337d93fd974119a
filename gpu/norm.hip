/* gpu/norm.hip: Gemma RMSNorm with the residual add fused in front, device twin of
 * ref/norm.c (m3_rmsnorm, m3_rmsnorm_add). Tolerance: GPU_NMSE_F32 / GPU_NMSE_BF16
 * (tests/gpu_test.h until compare/tol.c has a "norm" row). Tests: tests/gpu_norm_rope.c.
 *
 * rmsnorm_vec_k (the fast path: dim a multiple of 16 bytes' worth of elements, aligned rows,
 *   dim <= 256 threads x NORM_MAXC chunks): one block per row, each thread keeps its chunks of
 *   the row in registers between the two passes and moves 16 bytes per access.
 * rmsnorm_k (any other shape): one block per token row (256 threads: a multiple of M3_WARP on
 *   both vendors), the row kept in dynamic shared memory.
 * Both compute the same function with the same per-element operations; only the order of
 * the sum of squares differs (thread partials, then the block reduction).
 *   Pass 1 forms s = r + h (the profile's rounding), writes the new residual and keeps the
 *   value the norm reads in dynamic shared memory, summing s^2 per thread in fp32.
 *   A block reduction (warp butterflies, then warp partials) gives mu; rho = 1/sqrtf(mu+eps)
 *   with IEEE sqrt and division (no fast-math; nvcc's defaults -prec-sqrt/-prec-div=true).
 *   Pass 2: y = (s*rho)*(1+w), rounded to bf16 by the store when the storage is bf16.
 * Storage: TS = float (fp32 path: every profile, roundings applied in registers, for tight
 *   verification) or m3_bf16 (what production stores under hf/atom). Differences from the
 *   reference: the sum of squares order (and FMA contraction in it), i.e. fp32 rounding only. */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "gpu/mem16.h"
#include "ref/num/bf16.h"

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

/* N consecutive bf16 weights (N = 8: 16 bytes, N = 4: 8 bytes) as floats, aligned access */
template <int N> static __device__ __forceinline__ void load_w(const m3_bf16 *w, int64_t i, float *v);
template <> __device__ __forceinline__ void load_w<8>(const m3_bf16 *w, int64_t i, float *v) {
    m3_vec<m3_bf16>::load(w, i, v);
}
template <> __device__ __forceinline__ void load_w<4>(const m3_bf16 *w, int64_t i, float *v) {
    uint2 u = *reinterpret_cast<const uint2 *>(w + i);
    v[0] = m3_bits_f32(u.x << 16), v[1] = m3_bits_f32(u.x & 0xFFFF0000u);
    v[2] = m3_bits_f32(u.y << 16), v[3] = m3_bits_f32(u.y & 0xFFFF0000u);
}

#define NORM_THREADS 256
#define NORM_MAX_SHMEM (64 * 1024) /* generic path: D <= 16352 (CDNA's LDS is 64 KiB a block) */
#define NORM_MAXC 4 /* 16-byte chunks per thread in the vector path: D <= 8192 bf16 */

/* ---- kernels ---------------------------------------------------------------------------
 * resid: in/out residual (NULL for plain m3_rmsnorm, then x is read from `x`).
 * h: branch output, may be NULL (s = r). */
template <typename TS>
static __global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_k(TS *M3_RESTRICT y, TS *resid, const TS *h, const TS *x, const m3_bf16 *M3_RESTRICT w,
              int dim, float eps, bool residual_bf16, bool norm_reads_f32_sum, bool y_bf16) {
    extern __shared__ float sh_row[]; /* dim floats, then M3_MAX_WARPS for the reduction */
    float *red = sh_row + dim;
    const int64_t row = (int64_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float s;
        if (resid) {
            float r = ld(resid, row + i);
            float sum = h ? r + ld(h, row + i) : r;
            float stored = rnd(residual_bf16, sum);
            st(resid, row + i, stored);
            /* hf normalises the rounded sum; atom the fp32 sum (spec §3.2, §9.2) */
            s = norm_reads_f32_sum ? sum : stored;
        } else {
            s = ld(x, row + i);
        }
        sh_row[i] = s;
        ss += s * s;
    }
    const float mu = m3_block_sum(ss, red) / (float)dim;
    const float rho = 1.0f / sqrtf(mu + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        /* Gemma: (1 + w) in fp32 from the stored bf16 w; product order (s*rho)*(1+w) */
        float v = (sh_row[i] * rho) * (1.0f + m3_bf16_to_f32(w[i]));
        st(y, row + i, rnd(y_bf16, v));
    }
}

template <typename TS>
static __global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_vec_k(TS *M3_RESTRICT y, TS *resid, const TS *h, const TS *x,
                  const m3_bf16 *M3_RESTRICT w, int dim, float eps, bool residual_bf16,
                  bool norm_reads_f32_sum, bool y_bf16) {
    typedef m3_vec<TS> V;
    __shared__ float red[M3_MAX_WARPS];
    const int64_t row = (int64_t)blockIdx.x * dim;
    const int n_chunk = dim / V::N;
    float s[NORM_MAXC][V::N];
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < NORM_MAXC; c++) {
        const int ch = (int)threadIdx.x + c * NORM_THREADS;
        if (ch >= n_chunk) break;
        const int64_t i = row + (int64_t)ch * V::N;
        if (resid) {
            float r[V::N], hv[V::N], stored[V::N];
            V::load(resid, i, r);
            if (h) V::load(h, i, hv);
#pragma unroll
            for (int k = 0; k < V::N; k++) {
                float sum = h ? r[k] + hv[k] : r[k];
                stored[k] = rnd(residual_bf16, sum);
                s[c][k] = norm_reads_f32_sum ? sum : stored[k]; /* see rmsnorm_k */
            }
            V::store(resid, i, stored);
        } else {
            V::load(x, i, s[c]);
        }
#pragma unroll
        for (int k = 0; k < V::N; k++) ss += s[c][k] * s[c][k];
    }
    const float mu = m3_block_sum(ss, red) / (float)dim;
    const float rho = 1.0f / sqrtf(mu + eps);
#pragma unroll
    for (int c = 0; c < NORM_MAXC; c++) {
        const int ch = (int)threadIdx.x + c * NORM_THREADS;
        if (ch >= n_chunk) break;
        float wv[V::N], out[V::N];
        load_w<V::N>(w, (int64_t)ch * V::N, wv);
#pragma unroll
        for (int k = 0; k < V::N; k++)
            out[k] = rnd(y_bf16, (s[c][k] * rho) * (1.0f + wv[k]));
        V::store(y, row + (int64_t)ch * V::N, out);
    }
}

/* rmsnorm_row_k (bf16 storage, the production path; dim/8 chunks <= 256 x CPT): the same
 * thread layout and operation order as rmsnorm_vec_k (thread t of a row owns chunks t, t+256,
 * ..., sums its squares chunk by chunk, then the same warp butterflies and warp-partials
 * butterfly), so the bytes are identical; only the memory schedule differs:
 *   every load of the thread's chunks (resid, h) is issued before its first store, kept as
 *   raw 16-byte words (4 registers a chunk, not 8 floats), h through the read-only path;
 *   one barrier (the reduction array is written once); w read after the barrier (L2-resident,
 *   12 KiB) or with the first loads (C::WFIRST); C::CS: streaming stores for resid and y;
 *   the bf16 rounding of the stored values is the pack's (one rounding: the result is the
 *   same, RNE rounding being idempotent). F32SUM: p->norm_reads_f32_sum.
 * MODE: ROW_PLAIN (y = norm(x)), ROW_ADD (resid += h), ROW_ADD_NOH (h NULL: s = r).
 * C::ROWS rows per block (NORM_THREADS threads each); CPT chunks per thread; C::MINB resident
 * blocks a multiprocessor must fit (caps the registers); C::SMEM: the row's fp32 values parked
 * in shared memory between the passes instead of registers. */
enum { ROW_PLAIN, ROW_ADD, ROW_ADD_NOH };
template <int ROWS_, bool CS_, bool WFIRST_, int MINB_, bool SMEM_> struct row_cfg {
    static constexpr int ROWS = ROWS_, MINB = MINB_;
    static constexpr bool CS = CS_, WFIRST = WFIRST_, SMEM = SMEM_;
};

template <int CPT, int MODE, bool F32SUM, class C>
static __global__ void __launch_bounds__(NORM_THREADS *C::ROWS, C::MINB)
    rmsnorm_row_k(m3_bf16 *M3_RESTRICT y, m3_bf16 *resid, const m3_bf16 *h, const m3_bf16 *x,
                  const m3_bf16 *M3_RESTRICT w, int n_tok, int dim, float eps) {
    enum { N = 8 };
    __shared__ float red[C::ROWS][M3_MAX_WARPS];
    /* float4 [ROWS][CPT][2][NORM_THREADS]: each thread reads back only what it wrote */
    __shared__ float4 srow[C::SMEM ? C::ROWS * CPT * 2 * NORM_THREADS : 1];
    const int t = (int)threadIdx.x % NORM_THREADS, grp = (int)threadIdx.x / NORM_THREADS;
    const int64_t tok = (int64_t)blockIdx.x * C::ROWS + grp;
    const bool live = tok < n_tok; /* a dead group still takes part in the barrier */
    const int64_t row = tok * dim;
    const int n_chunk = dim / N;
    uint4 ra[CPT], ha[CPT], wa[CPT];
#pragma unroll
    for (int c = 0; c < CPT; c++) {
        const int ch = t + c * NORM_THREADS;
        if (!live || (c == CPT - 1 && ch >= n_chunk)) continue;
        const int64_t i = row + (int64_t)ch * N;
        if (MODE != ROW_PLAIN) {
            ra[c] = m3_ld16(resid + i); /* written back below: not the read-only path */
            if (MODE == ROW_ADD) ha[c] = m3_ld16_ro(h + i);
        } else {
            ra[c] = m3_ld16(x + i); /* y may alias x */
        }
        if (C::WFIRST) wa[c] = m3_ld16_ro(w + (int64_t)ch * N);
    }
    float s[CPT][N];
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < CPT; c++) {
        const int ch = t + c * NORM_THREADS;
        if (!live || (c == CPT - 1 && ch >= n_chunk)) continue;
        if (MODE != ROW_PLAIN) {
            float r[N], hv[N], stored[N];
            m3_unpack16<m3_bf16>(ra[c], r);
            if (MODE == ROW_ADD) m3_unpack16<m3_bf16>(ha[c], hv);
#pragma unroll
            for (int k = 0; k < N; k++) {
                float sum = MODE == ROW_ADD ? r[k] + hv[k] : r[k];
                stored[k] = sum; /* the pack rounds it to bf16 */
                s[c][k] = F32SUM ? sum : m3_round_bf16(sum); /* see rmsnorm_k */
            }
            const uint4 o = m3_pack16<m3_bf16>(stored);
            if (C::CS) m3_st16_cs(resid + row + (int64_t)ch * N, o);
            else m3_st16(resid + row + (int64_t)ch * N, o);
        } else {
            m3_unpack16<m3_bf16>(ra[c], s[c]);
        }
#pragma unroll
        for (int k = 0; k < N; k++) ss += s[c][k] * s[c][k];
        if (C::SMEM) {
            float4 *q = srow + ((grp * CPT + c) * 2) * NORM_THREADS + t;
            q[0] = make_float4(s[c][0], s[c][1], s[c][2], s[c][3]);
            q[NORM_THREADS] = make_float4(s[c][4], s[c][5], s[c][6], s[c][7]);
        }
    }
    /* m3_block_sum's order over this row's NORM_THREADS threads, with its one needed barrier */
    const int lane = t % M3_WARP, wid = t / M3_WARP;
    const float v = m3_warp_sum(ss);
    if (lane == 0) red[grp][wid] = v;
    __syncthreads();
    const float tot = m3_warp_sum(lane < NORM_THREADS / M3_WARP ? red[grp][lane] : 0.0f);
    const float mu = tot / (float)dim;
    const float rho = 1.0f / sqrtf(mu + eps);
#pragma unroll
    for (int c = 0; c < CPT; c++) {
        const int ch = t + c * NORM_THREADS;
        if (!live || (c == CPT - 1 && ch >= n_chunk)) continue;
        float wv[N], out[N];
        m3_unpack16<m3_bf16>(C::WFIRST ? wa[c] : m3_ld16_ro(w + (int64_t)ch * N), wv);
        if (C::SMEM) {
            const float4 *q = srow + ((grp * CPT + c) * 2) * NORM_THREADS + t;
            const float4 lo = q[0], hi = q[NORM_THREADS];
            s[c][0] = lo.x, s[c][1] = lo.y, s[c][2] = lo.z, s[c][3] = lo.w;
            s[c][4] = hi.x, s[c][5] = hi.y, s[c][6] = hi.z, s[c][7] = hi.w;
        }
#pragma unroll
        for (int k = 0; k < N; k++) out[k] = (s[c][k] * rho) * (1.0f + wv[k]); /* pack rounds */
        const uint4 o = m3_pack16<m3_bf16>(out);
        if (C::CS) m3_st16_cs(y + row + (int64_t)ch * N, o);
        else m3_st16(y + row + (int64_t)ch * N, o);
    }
}

/* rmsnorm_pers_k: rmsnorm_row_k's per-row work (one row per NORM_THREADS threads, streaming
 * stores) in a persistent grid: block b takes rows b, b + gridDim.x, ... and issues the next
 * row's loads right after its first pass over the current row, so they are in flight during
 * the reduction barrier and the second pass. The reduction array is double-buffered by row
 * parity (a thread may write row i+1's partial while a slower one still reads row i's; it
 * cannot get two rows ahead past the barrier), so one barrier a row. SMEM as in row_cfg. */
template <int CPT, int MODE, bool F32SUM, int MINB, bool SMEM>
static __global__ void __launch_bounds__(NORM_THREADS, MINB)
    rmsnorm_pers_k(m3_bf16 *M3_RESTRICT y, m3_bf16 *resid, const m3_bf16 *h, const m3_bf16 *x,
                   const m3_bf16 *M3_RESTRICT w, int n_tok, int dim, float eps) {
    enum { N = 8 };
    __shared__ float red[2][M3_MAX_WARPS];
    __shared__ float4 srow[SMEM ? CPT * 2 * NORM_THREADS : 1];
    const int t = (int)threadIdx.x;
    const int n_chunk = dim / N;
    uint4 ra[CPT], ha[CPT];
    int64_t tok = blockIdx.x;
#define PERS_LOAD(tk)                                                                             \
    _Pragma("unroll") for (int c = 0; c < CPT; c++) {                                           \
        const int ch = t + c * NORM_THREADS;                                                      \
        if (c == CPT - 1 && ch >= n_chunk) continue;                                              \
        const int64_t i = (tk) * dim + (int64_t)ch * N;                                           \
        if (MODE != ROW_PLAIN) {                                                                  \
            ra[c] = m3_ld16(resid + i);                                                           \
            if (MODE == ROW_ADD) ha[c] = m3_ld16_ro(h + i);                                       \
        } else {                                                                                  \
            ra[c] = m3_ld16(x + i);                                                               \
        }                                                                                         \
    }
    if (tok < n_tok) PERS_LOAD(tok)
    for (int it = 0; tok < n_tok; it++, tok += gridDim.x) {
        const int64_t row = tok * dim;
        float s[CPT][N];
        float ss = 0.0f;
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            const int ch = t + c * NORM_THREADS;
            if (c == CPT - 1 && ch >= n_chunk) continue;
            if (MODE != ROW_PLAIN) {
                float r[N], hv[N], stored[N];
                m3_unpack16<m3_bf16>(ra[c], r);
                if (MODE == ROW_ADD) m3_unpack16<m3_bf16>(ha[c], hv);
#pragma unroll
                for (int k = 0; k < N; k++) {
                    float sum = MODE == ROW_ADD ? r[k] + hv[k] : r[k];
                    stored[k] = sum; /* the pack rounds it to bf16 */
                    s[c][k] = F32SUM ? sum : m3_round_bf16(sum); /* see rmsnorm_k */
                }
                m3_st16_cs(resid + row + (int64_t)ch * N, m3_pack16<m3_bf16>(stored));
            } else {
                m3_unpack16<m3_bf16>(ra[c], s[c]);
            }
#pragma unroll
            for (int k = 0; k < N; k++) ss += s[c][k] * s[c][k];
            if (SMEM) {
                float4 *q = srow + c * 2 * NORM_THREADS + t;
                q[0] = make_float4(s[c][0], s[c][1], s[c][2], s[c][3]);
                q[NORM_THREADS] = make_float4(s[c][4], s[c][5], s[c][6], s[c][7]);
            }
        }
        const int64_t next = tok + gridDim.x;
        if (next < n_tok) PERS_LOAD(next)
        const int lane = t % M3_WARP, wid = t / M3_WARP;
        const float v = m3_warp_sum(ss);
        if (lane == 0) red[it & 1][wid] = v;
        __syncthreads();
        const float tot = m3_warp_sum(lane < NORM_THREADS / M3_WARP ? red[it & 1][lane] : 0.0f);
        const float mu = tot / (float)dim;
        const float rho = 1.0f / sqrtf(mu + eps);
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            const int ch = t + c * NORM_THREADS;
            if (c == CPT - 1 && ch >= n_chunk) continue;
            float wv[N], out[N];
            m3_unpack16<m3_bf16>(m3_ld16_ro(w + (int64_t)ch * N), wv);
            if (SMEM) {
                const float4 *q = srow + c * 2 * NORM_THREADS + t;
                const float4 lo = q[0], hi = q[NORM_THREADS];
                s[c][0] = lo.x, s[c][1] = lo.y, s[c][2] = lo.z, s[c][3] = lo.w;
                s[c][4] = hi.x, s[c][5] = hi.y, s[c][6] = hi.z, s[c][7] = hi.w;
            }
#pragma unroll
            for (int k = 0; k < N; k++) out[k] = (s[c][k] * rho) * (1.0f + wv[k]); /* pack rounds */
            m3_st16_cs(y + row + (int64_t)ch * N, m3_pack16<m3_bf16>(out));
        }
    }
#undef PERS_LOAD
}

template <int CPT, int MODE, bool F32SUM, int MINB, bool SMEM>
static m3_status launch_pers(m3_gpu *g, int per_sm, m3_bf16 *d_y, m3_bf16 *d_resid,
                             const m3_bf16 *d_h, const m3_bf16 *d_x, const m3_bf16 *d_w,
                             int n_tok, int dim, float eps) {
    const unsigned cap = (unsigned)g->n_sm * (unsigned)per_sm;
    const unsigned blocks = (unsigned)n_tok < cap ? (unsigned)n_tok : cap;
    rmsnorm_pers_k<CPT, MODE, F32SUM, MINB, SMEM><<<blocks, NORM_THREADS, 0, g->stream>>>(
        d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps);
    M3_LAUNCHED(g, "rmsnorm_pers_k");
    return M3_OK;
}

/* Variants (m3_elem_variant(), gpu/mem16.h; for measuring the memory schedule in one run; every
 * variant computes the same bytes): 0 rmsnorm_vec_k; rmsnorm_row_k: 1 plain stores; 2
 * streaming stores; 4 = 2 with w loaded first (the default, up to 3 chunks a thread); 7 = 2 with the row's values in shared
 * memory; 14 = 4 and 7; rmsnorm_pers_k (a grid of k blocks a multiprocessor, k what the
 * registers let stay resident): 10 shared memory, k = 3; 11 shared memory, registers capped for
 * 6, k = 6; 12 registers, k = 2; 13 shared memory, registers capped for 4, k = 4. Variants other
 * than 0 and 2 apply to 3 chunks a thread (D = 6144); elsewhere, and for numbers not listed
 * (3, 5, 6, 8, 9 were measured and dropped, docs/gpu.md), they take 2. */

template <int CPT, int MODE, bool F32SUM, class C>
static m3_status launch_cfg(m3_gpu *g, m3_bf16 *d_y, m3_bf16 *d_resid, const m3_bf16 *d_h,
                            const m3_bf16 *d_x, const m3_bf16 *d_w, int n_tok, int dim, float eps) {
    const unsigned blocks = ((unsigned)n_tok + C::ROWS - 1) / C::ROWS;
    rmsnorm_row_k<CPT, MODE, F32SUM, C><<<blocks, NORM_THREADS * C::ROWS, 0, g->stream>>>(
        d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps);
    M3_LAUNCHED(g, "rmsnorm_row_k");
    return M3_OK;
}

template <int CPT, int MODE, bool F32SUM>
static m3_status launch_row(m3_gpu *g, int var, m3_bf16 *d_y, m3_bf16 *d_resid, const m3_bf16 *d_h,
                            const m3_bf16 *d_x, const m3_bf16 *d_w, int n_tok, int dim, float eps) {
#define ROW_CFG(rows, cs, wfirst, minb, smem)                                                     \
    launch_cfg<CPT, MODE, F32SUM, row_cfg<rows, cs, wfirst, minb, smem>>(g, d_y, d_resid, d_h, d_x, \
                                                                         d_w, n_tok, dim, eps)
#define PERS(minb, smem, per_sm)                                                                  \
    launch_pers<CPT, MODE, F32SUM, minb, smem>(g, per_sm, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps)
    if (CPT == 3) switch (var) {
        case 1: return ROW_CFG(1, false, false, 1, false);
        case 4: return ROW_CFG(1, true, true, 1, false);
        case 7: return ROW_CFG(1, true, false, 1, true);
        case 10: return PERS(1, true, 3);
        case 11: return PERS(6, true, 6);
        case 12: return PERS(1, false, 2);
        case 13: return PERS(4, true, 4);
        case 14: return ROW_CFG(1, true, true, 1, true);
        default: break;
        }
    /* the default (and variant 2 where CPT != 3): w with the first loads up to 3 chunks a thread
     * (measured best at D = 6144), after the barrier at 4 (its registers would cost occupancy) */
    if (var < 0 && CPT <= 3) return ROW_CFG(1, true, true, 1, false);
    return ROW_CFG(1, true, false, 1, false);
#undef ROW_CFG
#undef PERS
}

template <int CPT>
static m3_status launch_row_cpt(m3_gpu *g, int var, m3_bf16 *d_y, m3_bf16 *d_resid,
                                const m3_bf16 *d_h, const m3_bf16 *d_x, const m3_bf16 *d_w,
                                int n_tok, int dim, float eps, bool f32_sum) {
    if (!d_resid) return launch_row<CPT, ROW_PLAIN, false>(g, var, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps);
    if (!d_h)
        return f32_sum ? launch_row<CPT, ROW_ADD_NOH, true>(g, var, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps)
                       : launch_row<CPT, ROW_ADD_NOH, false>(g, var, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps);
    return f32_sum ? launch_row<CPT, ROW_ADD, true>(g, var, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps)
                   : launch_row<CPT, ROW_ADD, false>(g, var, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps);
}

/* ---- launchers ------------------------------------------------------------------------- */
template <typename TS>
static m3_status launch(m3_gpu *g, TS *d_y, TS *d_resid, const TS *d_h, const TS *d_x,
                        const m3_bf16 *d_w, int n_tok, int dim, float eps, bool residual_bf16,
                        bool norm_reads_f32_sum, bool y_bf16) {
    M3_ASSERTF(n_tok >= 0 && dim > 0, "T=%d D=%d", n_tok, dim);
    M3_ASSERT(d_y && d_w && (d_resid || d_x));
    if (n_tok == 0) return M3_OK;
    const int vn = m3_vec<TS>::N;
    /* w is read as 16-byte bf16 chunks: aligned, and dim a multiple of 8 covers both paths */
    const bool vec = dim % 8 == 0 && dim / vn <= NORM_THREADS * NORM_MAXC && m3_aligned16(d_y) &&
                     m3_aligned16(d_w) && (!d_resid || m3_aligned16(d_resid)) &&
                     (!d_h || m3_aligned16(d_h)) && (!d_x || m3_aligned16(d_x));
    if constexpr (sizeof(TS) == 2) { /* bf16 storage: every rounding is the store's */
        const int var = m3_elem_variant();
        if (vec && var != 0) {
            M3_ASSERT(!d_resid || residual_bf16);
            const int cpt = (dim / vn + NORM_THREADS - 1) / NORM_THREADS;
            m3_status (*fn)(m3_gpu *, int, m3_bf16 *, m3_bf16 *, const m3_bf16 *, const m3_bf16 *,
                            const m3_bf16 *, int, int, float, bool) =
                cpt == 1 ? launch_row_cpt<1> : cpt == 2 ? launch_row_cpt<2>
                         : cpt == 3 ? launch_row_cpt<3> : launch_row_cpt<4>;
            return fn(g, var, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps, norm_reads_f32_sum);
        }
    }
    if (vec) {
        rmsnorm_vec_k<TS><<<(unsigned)n_tok, NORM_THREADS, 0, g->stream>>>(
            d_y, d_resid, d_h, d_x, d_w, dim, eps, residual_bf16, norm_reads_f32_sum, y_bf16);
        M3_LAUNCHED(g, "rmsnorm_vec_k");
        return M3_OK;
    }
    size_t shmem = ((size_t)dim + M3_MAX_WARPS) * sizeof(float);
    if (shmem > NORM_MAX_SHMEM)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu rmsnorm: dim %d exceeds the one-block row", dim);
    if (shmem > 48 * 1024) /* above 48 KiB a kernel must opt in */
        M3_HIP_TRY(hipFuncSetAttribute((const void *)rmsnorm_k<TS>,
                                       hipFuncAttributeMaxDynamicSharedMemorySize, (int)shmem));
    rmsnorm_k<TS><<<(unsigned)n_tok, NORM_THREADS, shmem, g->stream>>>(
        d_y, d_resid, d_h, d_x, d_w, dim, eps, residual_bf16, norm_reads_f32_sum, y_bf16);
    M3_LAUNCHED(g, "rmsnorm_k");
    return M3_OK;
}

extern "C" m3_status m3_gpu_rmsnorm(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x,
                                    const m3_bf16 *d_w, int n_tok, int dim, float eps) {
    return launch<m3_bf16>(g, d_y, NULL, NULL, d_x, d_w, n_tok, dim, eps, false, false, false);
}

extern "C" m3_status m3_gpu_rmsnorm_f32(m3_gpu *g, float *d_y, const float *d_x,
                                        const m3_bf16 *d_w, int n_tok, int dim, float eps) {
    return launch<float>(g, d_y, NULL, NULL, d_x, d_w, n_tok, dim, eps, false, false, false);
}

extern "C" m3_status m3_gpu_rmsnorm_add(m3_gpu *g, m3_bf16 *d_y, m3_bf16 *d_resid,
                                        const m3_bf16 *d_h, const m3_bf16 *d_w, int n_tok,
                                        int dim, float eps, const m3_profile *p) {
    /* bf16 storage is what hf/atom store; a profile without bf16 residuals needs _f32 */
    if (!p->residual_bf16 || !p->act_bf16)
        return m3_errorf(M3_ERR_UNSUPPORTED,
                         "gpu rmsnorm_add: profile %s keeps fp32 activations: use the _f32 path",
                         p->name);
    return launch<m3_bf16>(g, d_y, d_resid, d_h, NULL, d_w, n_tok, dim, eps, true,
                           p->norm_reads_f32_sum, true);
}

extern "C" m3_status m3_gpu_rmsnorm_add_f32(m3_gpu *g, float *d_y, float *d_resid,
                                            const float *d_h, const m3_bf16 *d_w, int n_tok,
                                            int dim, float eps, const m3_profile *p) {
    return launch<float>(g, d_y, d_resid, d_h, NULL, d_w, n_tok, dim, eps, p->residual_bf16,
                         p->norm_reads_f32_sum, p->act_bf16);
}
