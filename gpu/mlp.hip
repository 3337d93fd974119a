/* gpu/mlp.hip: swiglu_oai, device twin of ref/mlp.c m3_swiglu (spec §3.13). Tolerance:
 * GPU_NMSE_F32 / GPU_NMSE_BF16 (tests/gpu_test.h until compare/tol.c has a "swiglu" row).
 * Tests: tests/gpu_moe.c.
 *
 * swiglu_vec_k (bf16 storage, aligned, n % 8 == 0): the fast path, see the kernel.
 * swiglu_k (fp32 storage, other shapes, or the test hook m3_gpu_set_elem_variant(0)): element-wise, grid-stride,
 *   16-byte accesses when aligned.
 * The scalar math of both is ref/num/act.h itself (m3_swiglu_oai, m3_swiglu_oai_bf16ops)
 * compiled as device code, so the clamps and rounding points are the reference's; the one
 * difference is expf, whose device and host results may differ by an ulp or two (noted in
 * docs/gpu.md). */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "gpu/mem16.h"
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

/* swiglu_vec_k (bf16 storage, 16-byte aligned, n a multiple of 8; what m3_gpu_swiglu runs): the
 * same per-element operations as swiglu_k with the rounding mode a compile-time constant; each
 * thread loads CPT chunks (chunk base + c*256 of its block's span: coalesced) before computing
 * and storing any of them. NC: g and u through the read-only path (only when a aliases
 * neither). CS: streaming stores. ONCE: the pack's rounding is the one rounding (the extra
 * m3_round_bf16 of act() changes no bit: RNE rounding is idempotent). HW: the pack through
 * the hardware conversion (m3_pack16_bf16_hw). The precise expf and reciprocal make this kernel
 * nearly issue-bound on the H200: each removed instruction per element shows in the time
 * (docs/gpu.md "Memory-bound kernels"). */
template <int MODE, int CPT, bool NC, bool CS, bool HW>
static __global__ void __launch_bounds__(256)
    swiglu_vec_k(m3_bf16 *a, const m3_bf16 *gt, const m3_bf16 *up, int64_t n_chunk, float alpha,
                 float limit) {
    enum { N = 8 };
    const int64_t base = (int64_t)blockIdx.x * (256 * CPT) + threadIdx.x;
    uint4 gr[CPT], ur[CPT];
#pragma unroll
    for (int c = 0; c < CPT; c++) {
        const int64_t ci = base + c * 256;
        if (ci >= n_chunk) continue;
        gr[c] = NC ? m3_ld16_ro(gt + ci * N) : m3_ld16(gt + ci * N);
        ur[c] = NC ? m3_ld16_ro(up + ci * N) : m3_ld16(up + ci * N);
    }
#pragma unroll
    for (int c = 0; c < CPT; c++) {
        const int64_t ci = base + c * 256;
        if (ci >= n_chunk) continue;
        float gv[N], uv[N], av[N];
        m3_unpack16<m3_bf16>(gr[c], gv);
        m3_unpack16<m3_bf16>(ur[c], uv);
#pragma unroll
        for (int k = 0; k < N; k++)
            av[k] = MODE == M3_SWIGLU_BF16_ONCE ? m3_swiglu_oai(gv[k], uv[k], alpha, limit)
                                                : act(gv[k], uv[k], alpha, limit, MODE);
        const uint4 o = HW ? m3_pack16_bf16_hw(av) : m3_pack16<m3_bf16>(av);
        if (CS) m3_st16_cs(a + ci * N, o);
        else m3_st16(a + ci * N, o);
    }
}

static bool overlaps(const void *a, const void *b, size_t bytes) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bytes && y < x + bytes;
}

/* two 16-byte chunks a thread, streaming stores, the hardware bf16 conversion: the fastest of
 * the schedules measured in session 3 (docs/gpu.md "Memory-bound kernels"; one chunk a thread
 * and plain stores wrote the same bytes, slower; they were removed) */
template <int MODE, bool NC>
static m3_status launch_vec(m3_gpu *g, m3_bf16 *d_a, const m3_bf16 *d_g, const m3_bf16 *d_u,
                            int64_t n_chunk, float alpha, float limit) {
    const unsigned blocks = m3_grid_1d(n_chunk, 256 * 2);
    swiglu_vec_k<MODE, 2, NC, true, true><<<blocks, 256, 0, g->stream>>>(d_a, d_g, d_u, n_chunk,
                                                                         alpha, limit);
    M3_LAUNCHED(g, "swiglu_vec_k");
    return M3_OK;
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
    M3_ASSERT(n >= 0 && d_a && d_g && d_u);
    if (n > 0 && m3_elem_variant() != 0 && n % 8 == 0 && m3_aligned16(d_a) && m3_aligned16(d_g) &&
        m3_aligned16(d_u)) {
        const size_t bytes = (size_t)n * sizeof(m3_bf16);
        const bool nc = !overlaps(d_a, d_g, bytes) && !overlaps(d_a, d_u, bytes);
        const bool per_op = p->swiglu == M3_SWIGLU_BF16_PER_OP;
        m3_status (*fn)(m3_gpu *, m3_bf16 *, const m3_bf16 *, const m3_bf16 *, int64_t, float,
                        float) = per_op ? (nc ? launch_vec<M3_SWIGLU_BF16_PER_OP, true>
                                              : launch_vec<M3_SWIGLU_BF16_PER_OP, false>)
                                        : (nc ? launch_vec<M3_SWIGLU_BF16_ONCE, true>
                                              : launch_vec<M3_SWIGLU_BF16_ONCE, false>);
        return fn(g, d_a, d_g, d_u, n / 8, alpha, limit);
    }
    return launch<m3_bf16>(g, d_a, d_g, d_u, n, alpha, limit, p);
}

extern "C" m3_status m3_gpu_swiglu_f32(m3_gpu *g, float *d_a, const float *d_g, const float *d_u,
                                       int64_t n, float alpha, float limit, const m3_profile *p) {
    return launch<float>(g, d_a, d_g, d_u, n, alpha, limit, p);
}
