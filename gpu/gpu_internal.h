/* gpu/gpu_internal.h: what every .hip file under gpu/ shares and nothing outside gpu/ sees: the
 * m3_gpu struct, the runtime-call check (M3_HIP_TRY) and the launch check (M3_LAUNCHED).
 * Include after gpu/hip_compat.h. */
#ifndef M3_GPU_INTERNAL_H
#define M3_GPU_INTERNAL_H

#include "gpu/hip_compat.h"
#include "gpu/m3_gpu.h"

struct m3_gpu {
    int device;
    int warp;        /* device warp width */
    int n_sm;        /* multiprocessors / compute units */
    int sync;        /* M3_GPU_SYNC=1: synchronize and check after every launch */
    hipStream_t stream;
#if M3_HAVE_BLAS
    hipblasHandle_t blas;
    int blas_ok;
#endif
    hipEvent_t t0, t1;
    int events_ok;
    unsigned char *arena; /* device */
    size_t arena_cap, arena_top;
    /* Arrival counters of the one-launch reductions (each block counts itself done; the last
     * to arrive finishes the row), owned by the context so that two contexts (two streams,
     * or two threads each with its own context) never share one. Zero at open; each user
     * leaves its range zero again by the end of its launch (or of its next launch, in stream
     * order). Outside the arena: m3_gpu_release can never hand them out. */
    unsigned int *counters; /* device, M3_GPU_N_COUNTERS words */
    unsigned int idx_calls; /* gpu/indexer.hip fused selections so far: the counter parity */
    char desc[512];
};
#define M3_GPU_CNT_PF 0      /* gpu/attn.hip paged-flash merge: 65536 (token, kv head) rows */
#define M3_GPU_CNT_IDX 65536 /* gpu/indexer.hip fused decode selection: 2, by call parity;
                                * its direct selection's 8 row flags at + 8 */
#define M3_GPU_CNT_SD (65536 + 64) /* gpu/attn.hip sparse flash decode merge: 65536 rows */
/* gpu/indexer.hip direct decode selection: 8 rows x 1024 key blocks of 64-bit rank keys */
#define M3_GPU_CNT_IDXS (2 * 65536 + 64)
#define M3_GPU_N_COUNTERS (2 * 65536 + 64 + 2 * 8 * 1024)

/* Check a runtime call; on failure record "gpu: <file>:<line>: <call>: <reason>" and return
 * M3_ERR_DEVICE from the calling function. */
#define M3_HIP_TRY(call)                                                                          \
    do {                                                                                          \
        hipError_t m3_hip_e_ = (call);                                                            \
        if (m3_hip_e_ != hipSuccess)                                                              \
            return m3_gpu_fail_(m3_hip_e_, __FILE__, __LINE__, #call);                            \
    } while (0)

/* After a <<<>>> launch: pick up a launch error, and with M3_GPU_SYNC=1 also wait for the
 * kernel and report a fault it raised, naming the kernel. Returns from the caller on error. */
#define M3_LAUNCHED(g, kname) M3_TRY(m3_gpu_launched_((g), (kname), __FILE__, __LINE__))

#ifdef __cplusplus
extern "C" {
#endif
m3_status m3_gpu_fail_(hipError_t e, const char *file, int line, const char *what);
m3_status m3_gpu_launched_(m3_gpu *g, const char *kname, const char *file, int line);
#ifdef __cplusplus
}
#endif

/* ---- host wiring helpers of the whole model (defined in gpu/layer.hip, used by
 * gpu/model.hip), overloaded on the activation storage type ------------------------------
 * dl_/ul_: device <-> host fp32 (bf16 widened exactly / rounded RNE); linear_: y = x W^T in
 * the storage type (bf16 GEMM, or fp32 GEMM + the act_bf16 rounding); norm_add_: the
 * rmsnorm_add twin; upload_mat_: n checkpoint elements (fmt an m3_wfmt) into dst. */
#ifdef __cplusplus
m3_status m3_gpu_dl_(m3_gpu *g, float *h, const float *d, size_t n);
m3_status m3_gpu_dl_(m3_gpu *g, float *h, const m3_bf16 *d, size_t n);
m3_status m3_gpu_ul_(m3_gpu *g, float *d, const float *h, size_t n);
m3_status m3_gpu_ul_(m3_gpu *g, m3_bf16 *d, const float *h, size_t n);
m3_status m3_gpu_linear_(m3_gpu *g, m3_bf16 *y, const m3_bf16 *x, const void *w, int T, int N,
                         int K, const m3_profile *p);
m3_status m3_gpu_linear_(m3_gpu *g, float *y, const float *x, const void *w, int T, int N, int K,
                         const m3_profile *p);
m3_status m3_gpu_norm_add_(m3_gpu *g, m3_bf16 *y, m3_bf16 *r, const m3_bf16 *h, const m3_bf16 *w,
                           int T, int D, float eps, const m3_profile *p);
m3_status m3_gpu_norm_add_(m3_gpu *g, float *y, float *r, const float *h, const m3_bf16 *w, int T,
                           int D, float eps, const m3_profile *p);
m3_status m3_gpu_upload_mat_(m3_gpu *g, void *dst, bool bf16, int fmt, const void *src, size_t n,
                             const char *what);
#endif

/* ---- 16-byte vector access of bf16 / f32 rows (device) ----------------------------------
 * m3_vec<TS>::N elements per 16-byte access; load converts to float, store rounds (bf16 RNE
 * through ref/num/bf16.h). The caller guarantees 16-byte alignment of p + i. */
#if defined(__CUDACC__) || defined(__HIPCC__)
#include "ref/num/bf16.h"
template <typename TS> struct m3_vec;
template <> struct m3_vec<float> {
    enum { N = 4 };
    static __device__ __forceinline__ void load(const float *p, int64_t i, float *v) {
        float4 u = *reinterpret_cast<const float4 *>(p + i);
        v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
    }
    static __device__ __forceinline__ void store(float *p, int64_t i, const float *v) {
        *reinterpret_cast<float4 *>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    }
};
template <> struct m3_vec<m3_bf16> {
    enum { N = 8 };
    static __device__ __forceinline__ void load(const m3_bf16 *p, int64_t i, float *v) {
        uint4 u = *reinterpret_cast<const uint4 *>(p + i);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) { /* little-endian: element 2k in the low half */
            v[2 * k] = m3_bits_f32(w[k] << 16);
            v[2 * k + 1] = m3_bits_f32(w[k] & 0xFFFF0000u);
        }
    }
    static __device__ __forceinline__ void store(m3_bf16 *p, int64_t i, const float *v) {
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            w[k] = (uint32_t)m3_f32_to_bf16(v[2 * k]) | ((uint32_t)m3_f32_to_bf16(v[2 * k + 1]) << 16);
        *reinterpret_cast<uint4 *>(p + i) = make_uint4(w[0], w[1], w[2], w[3]);
    }
};
#endif

/* ---- programmatic dependent launch (Hopper; gpu/moe.hip's T = 1 kernels, gpu/rope.hip's
 * fused pass) -----------------------------------------------------------------------------
 * A kernel launched with programmatic stream serialization may start while the launch before
 * it in the stream still runs. m3_pdl_trigger (in the earlier kernel) lets the next launch
 * start; m3_pdl_wait (in the later one) waits until the earlier grid has finished and its
 * stores are visible, so it goes before anything that reads what that grid wrote. Both are
 * no-ops without the attribute, before sm_90 and on AMD. */
#if defined(__CUDACC__) || defined(__HIPCC__)
static __device__ __forceinline__ void m3_pdl_trigger() {
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
static __device__ __forceinline__ void m3_pdl_wait() {
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* k<<<grid, block, smem>>>(args) on g's stream; pdl (NVIDIA): as a programmatic dependent of
 * the launch before it (the caller checks the launch with m3_gpu_launched_ / M3_LAUNCHED) */
template <typename... P, typename... A>
static m3_status m3_gpu_launch_pdl(m3_gpu *g, bool pdl, void (*k)(P...), dim3 grid, dim3 block,
                                   size_t smem, A... args) {
#if defined(M3_HIP_NVIDIA)
    if (pdl) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem;
        cfg.stream = g->stream;
        cudaLaunchAttribute at[1] = {};
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
        M3_HIP_TRY(cudaLaunchKernelEx(&cfg, k, args...));
        return M3_OK;
    }
#else
    (void)pdl;
#endif
    k<<<grid, block, smem, g->stream>>>(args...);
    return M3_OK;
}
#endif

static inline bool m3_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Grid size for n items of `per_block` each, capped so it fits a 1-D grid. */
static inline unsigned m3_grid_1d(int64_t n, int per_block) {
    int64_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : b);
}

#endif
