/* gpu/norm.hip: Gemma RMSNorm with the residual add fused in front, device twin of
 * ref/norm.c (m3_rmsnorm, m3_rmsnorm_add). Tolerance: GPU_NMSE_F32 / GPU_NMSE_BF16
 * (tests/gpu_test.h until compare/tol.c has a "norm" row). Tests: tests/gpu_norm_rope.c.
 *
 * rmsnorm_k: one block per token row (256 threads: a multiple of M3_WARP on both vendors).
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

#define NORM_THREADS 256

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

/* ---- launchers ------------------------------------------------------------------------- */
template <typename TS>
static m3_status launch(m3_gpu *g, TS *d_y, TS *d_resid, const TS *d_h, const TS *d_x,
                        const m3_bf16 *d_w, int n_tok, int dim, float eps, bool residual_bf16,
                        bool norm_reads_f32_sum, bool y_bf16) {
    M3_ASSERTF(n_tok >= 0 && dim > 0, "T=%d D=%d", n_tok, dim);
    M3_ASSERT(d_y && d_w && (d_resid || d_x));
    if (n_tok == 0) return M3_OK;
    size_t shmem = ((size_t)dim + M3_MAX_WARPS) * sizeof(float);
    /* 48 KiB without opting in: dim <= 12256, which covers every M3 norm (6144, 128) */
    if (shmem > 48 * 1024)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu rmsnorm: dim %d exceeds the one-block row", dim);
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
