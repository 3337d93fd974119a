/* gpu/norm.hip: Gemma RMSNorm with the residual add fused in front, device twin of
 * ref/norm.c (m3_rmsnorm, m3_rmsnorm_add). Tolerance: GPU_NMSE_F32 / GPU_NMSE_BF16
 * (tests/gpu_test.h until compare/tol.c has a "norm" row). Tests: tests/gpu_norm_rope.c.
 *
 * rmsnorm_row_k (bf16 storage, the vector shapes below; what m3_gpu_rmsnorm[_add] run): the
 *   fast path, rmsnorm_vec_k's function and operation order with a better memory schedule and
 *   fewer instructions (see the kernel).
 * rmsnorm_vec_k (fp32 storage, or the test hook m3_gpu_set_elem_variant(0); dim a multiple
 *   of 16 bytes' worth of elements, aligned rows, dim <= 256 threads x NORM_MAXC chunks): one block per row, each
 *   thread keeps its chunks of the row in registers between the two passes and moves 16 bytes
 *   per access.
 * rmsnorm_k (any other shape): one block per token row (256 threads: a multiple of M3_WARP on
 *   both vendors), the row kept in dynamic shared memory.
 * All compute the same function with the same per-element operations; only the order of
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
 * butterfly), so the bytes are identical. What differs is the memory schedule and the
 * instruction count (measured on the H200: docs/gpu.md "Memory-bound kernels"):
 *   every load of the thread's chunks (resid, h) is issued before its first store, kept as
 *   raw 16-byte words (4 registers a chunk, not 8 floats), h and w through the read-only path;
 *   one barrier (the reduction array is written once); streaming stores (CS) for resid and y;
 *   one bf16 rounding per stored value, the pack's (rounding a bf16 value again changes
 *   nothing, NaN included, so dropping the extra m3_round_bf16 keeps the bytes; it was a large
 *   part of the time); HW: the pack through the hardware conversion (m3_pack16_bf16_hw).
 * MODE: ROW_PLAIN (y = norm(x)), ROW_ADD (resid += h), ROW_ADD_NOH (h NULL: s = r).
 * F32SUM: p->norm_reads_f32_sum. WFIRST: w loaded with the first loads, not after the barrier
 * (L2-resident, 12 KiB at D = 6144). CPT chunks per thread (compile time). */
enum { ROW_PLAIN, ROW_ADD, ROW_ADD_NOH };

template <bool HW> static __device__ __forceinline__ uint4 pack_bf16(const float *v) {
    return HW ? m3_pack16_bf16_hw(v) : m3_pack16<m3_bf16>(v);
}

template <int CPT, int MODE, bool F32SUM, bool CS, bool WFIRST, bool HW>
static __global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_row_k(m3_bf16 *M3_RESTRICT y, m3_bf16 *resid, const m3_bf16 *h, const m3_bf16 *x,
                  const m3_bf16 *M3_RESTRICT w, int dim, float eps) {
    enum { N = 8 };
    __shared__ float red[M3_MAX_WARPS];
    const int t = (int)threadIdx.x;
    const int64_t row = (int64_t)blockIdx.x * dim;
    const int n_chunk = dim / N;
    uint4 ra[CPT], ha[CPT], wa[CPT];
#pragma unroll
    for (int c = 0; c < CPT; c++) {
        const int ch = t + c * NORM_THREADS;
        if (c == CPT - 1 && ch >= n_chunk) continue; /* CPT is the fewest that cover the row */
        const int64_t i = row + (int64_t)ch * N;
        if (MODE != ROW_PLAIN) {
            ra[c] = m3_ld16(resid + i); /* written back below: not the read-only path */
            if (MODE == ROW_ADD) ha[c] = m3_ld16_ro(h + i);
        } else {
            ra[c] = m3_ld16(x + i); /* y may alias x */
        }
        if (WFIRST) wa[c] = m3_ld16_ro(w + (int64_t)ch * N);
    }
    float s[CPT][N];
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < CPT; c++) {
        const int ch = t + c * NORM_THREADS;
        if (c == CPT - 1 && ch >= n_chunk) continue;
        if (MODE != ROW_PLAIN) {
            float r[N], hv[N];
            m3_unpack16<m3_bf16>(ra[c], r);
            if (MODE == ROW_ADD) m3_unpack16<m3_bf16>(ha[c], hv);
#pragma unroll
            for (int k = 0; k < N; k++) {
                r[k] = MODE == ROW_ADD ? r[k] + hv[k] : r[k]; /* the fp32 sum; stored rounded */
                s[c][k] = F32SUM ? r[k] : m3_round_bf16(r[k]); /* see rmsnorm_k */
            }
            const uint4 o = pack_bf16<HW>(r);
            if (CS) m3_st16_cs(resid + row + (int64_t)ch * N, o);
            else m3_st16(resid + row + (int64_t)ch * N, o);
        } else {
            m3_unpack16<m3_bf16>(ra[c], s[c]);
        }
#pragma unroll
        for (int k = 0; k < N; k++) ss += s[c][k] * s[c][k];
    }
    /* m3_block_sum's order, with its one needed barrier */
    const int lane = t % M3_WARP, wid = t / M3_WARP;
    const float v = m3_warp_sum(ss);
    if (lane == 0) red[wid] = v;
    __syncthreads();
    const float tot = m3_warp_sum(lane < NORM_THREADS / M3_WARP ? red[lane] : 0.0f);
    const float mu = tot / (float)dim;
    const float rho = 1.0f / sqrtf(mu + eps);
#pragma unroll
    for (int c = 0; c < CPT; c++) {
        const int ch = t + c * NORM_THREADS;
        if (c == CPT - 1 && ch >= n_chunk) continue;
        float wv[N], out[N];
        m3_unpack16<m3_bf16>(WFIRST ? wa[c] : m3_ld16_ro(w + (int64_t)ch * N), wv);
#pragma unroll
        for (int k = 0; k < N; k++) out[k] = (s[c][k] * rho) * (1.0f + wv[k]); /* pack rounds */
        const uint4 o = pack_bf16<HW>(out);
        if (CS) m3_st16_cs(y + row + (int64_t)ch * N, o);
        else m3_st16(y + row + (int64_t)ch * N, o);
    }
}

/* rmsnorm_row_k's memory schedule: streaming stores and the hardware bf16 conversion, the
 * fastest of the variants measured in session 3 (docs/gpu.md "Memory-bound kernels"; plain
 * stores and loading w first wrote the same bytes, slower; they were removed). */
template <int CPT, int MODE, bool F32SUM>
static m3_status launch_row(m3_gpu *g, m3_bf16 *d_y, m3_bf16 *d_resid, const m3_bf16 *d_h,
                            const m3_bf16 *d_x, const m3_bf16 *d_w, int n_tok, int dim, float eps) {
rmsnorm_row_k<CPT, MODE, F32SUM, true, false, true><<<(unsigned)n_tok, NORM_THREADS, 0,
                                                          g->stream>>>(d_y, d_resid, d_h, d_x,
                                                                       d_w, dim, eps);
    M3_LAUNCHED(g, "rmsnorm_row_k");
    return M3_OK;
}

template <int CPT>
static m3_status launch_row_cpt(m3_gpu *g, m3_bf16 *d_y, m3_bf16 *d_resid,
                                const m3_bf16 *d_h, const m3_bf16 *d_x, const m3_bf16 *d_w,
                                int n_tok, int dim, float eps, bool f32_sum) {
    if (!d_resid) return launch_row<CPT, ROW_PLAIN, false>(g, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps);
    if (!d_h)
        return f32_sum ? launch_row<CPT, ROW_ADD_NOH, true>(g, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps)
                       : launch_row<CPT, ROW_ADD_NOH, false>(g, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps);
    return f32_sum ? launch_row<CPT, ROW_ADD, true>(g, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps)
                   : launch_row<CPT, ROW_ADD, false>(g, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps);
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
        if (vec && m3_elem_variant() != 0) {
            M3_ASSERT(!d_resid || residual_bf16);
            const int cpt = (dim / vn + NORM_THREADS - 1) / NORM_THREADS;
            m3_status (*fn)(m3_gpu *, m3_bf16 *, m3_bf16 *, const m3_bf16 *, const m3_bf16 *,
                            const m3_bf16 *, int, int, float, bool) =
                cpt == 1 ? launch_row_cpt<1> : cpt == 2 ? launch_row_cpt<2>
                         : cpt == 3 ? launch_row_cpt<3> : launch_row_cpt<4>;
            return fn(g, d_y, d_resid, d_h, d_x, d_w, n_tok, dim, eps, norm_reads_f32_sum);
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
