/* gpu/mlp.hip: swiglu_oai, device twin of ref/mlp.c m3_swiglu (spec §3.13). Tolerance:
 * GPU_NMSE_F32 / GPU_NMSE_BF16 (tests/gpu_test.h until compare/tol.c has a "swiglu" row).
 * Tests: tests/gpu_moe.c.
 *
 * swiglu_k: element-wise, grid-stride, 16-byte accesses when aligned. The scalar math is
 *   ref/num/act.h itself (m3_swiglu_oai, m3_swiglu_oai_bf16ops) compiled as device code, so
 *   the clamps and rounding points are the reference's; the one difference is expf, whose
 *   device and host results may differ by an ulp or two (noted in docs/gpu.md). */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "ref/num/act.h"
#include "ref/num/bf16.h"

/* ---- static device helpers ------------------------------------------------------------- */
static __device__ __forceinline__ float act(float g, float u, float alpha, float limit, int mode) {
    if (mode == M3_SWIGLU_BF16_PER_OP) return m3_swiglu_oai_bf16ops(g, u, alpha, limit);
    float a = m3_swiglu_oai(g, u, alpha, limit);
    return mode == M3_SWIGLU_BF16_ONCE ? m3_round_bf16(a) : a;
}
static __device__ __forceinline__ float ld1(const float *p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld1(const m3_bf16 *p, int64_t i) { return m3_bf16_to_f32(p[i]); }
static __device__ __forceinline__ void st1(float *p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void st1(m3_bf16 *p, int64_t i, float v) { p[i] = m3_f32_to_bf16(v); }

/* ---- kernels --------------------------------------------------------------------------- */
template <typename TS>
static __global__ void swiglu_k(TS *a, const TS *gt, const TS *up, int64_t n, float alpha,
                                float limit, int mode, bool vec) {
    typedef m3_vec<TS> V;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        for (int64_t c = t0; c < n / V::N; c += stride) {
            float gv[V::N], uv[V::N], av[V::N];
            V::load(gt, c * V::N, gv);
            V::load(up, c * V::N, uv);
#pragma unroll
            for (int k = 0; k < V::N; k++) av[k] = act(gv[k], uv[k], alpha, limit, mode);
            V::store(a, c * V::N, av);
        }
    } else {
        for (int64_t i = t0; i < n; i += stride)
            st1(a, i, act(ld1(gt, i), ld1(up, i), alpha, limit, mode));
    }
}

/* ---- launchers ------------------------------------------------------------------------- */
template <typename TS>
static m3_status launch(m3_gpu *g, TS *d_a, const TS *d_g, const TS *d_u, int64_t n, float alpha,
                        float limit, const m3_profile *p) {
    M3_ASSERT(n >= 0 && p && d_a && d_g && d_u);
    if (n == 0) return M3_OK;
    const int vn = m3_vec<TS>::N;
    const bool vec = n % vn == 0 && m3_aligned16(d_a) && m3_aligned16(d_g) && m3_aligned16(d_u);
    unsigned blocks = m3_grid_1d(vec ? n / vn : n, 256), cap = (unsigned)g->n_sm * 16u;
    swiglu_k<TS><<<blocks < cap ? blocks : cap, 256, 0, g->stream>>>(d_a, d_g, d_u, n, alpha, limit,
                                                                   (int)p->swiglu, vec);
    M3_LAUNCHED(g, "swiglu_k");
    return M3_OK;
}

extern "C" m3_status m3_gpu_swiglu(m3_gpu *g, m3_bf16 *d_a, const m3_bf16 *d_g, const m3_bf16 *d_u,
                                   int64_t n, float alpha, float limit, const m3_profile *p) {
    if (p->swiglu == M3_SWIGLU_F32)
        return m3_errorf(M3_ERR_UNSUPPORTED,
                         "gpu swiglu: profile %s keeps fp32 activations: use the _f32 path", p->name);
    return launch<m3_bf16>(g, d_a, d_g, d_u, n, alpha, limit, p);
}

extern "C" m3_status m3_gpu_swiglu_f32(m3_gpu *g, float *d_a, const float *d_g, const float *d_u,
                                       int64_t n, float alpha, float limit, const m3_profile *p) {
    return launch<float>(g, d_a, d_g, d_u, n, alpha, limit, p);
}
