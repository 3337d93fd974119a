/* gpu/gpu.hip: the m3_gpu context (device, stream, BLAS handle, device arena, timer events),
 * error mapping to M3_ERR_DEVICE, copies, and the bf16 GEMM helper through the vendor BLAS.
 * Tests: tests/gpu_base.c. */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_ALIGN 256

m3_status m3_gpu_fail_(hipError_t e, const char *file, int line, const char *what) {
    /* clear the sticky non-fatal error so a later check does not report it again */
    (void)hipGetLastError();
    return m3_errorf(M3_ERR_DEVICE, "gpu: %s:%d: %s: %s (%s)", file, line, what,
                     hipGetErrorString(e), hipGetErrorName(e));
}

m3_status m3_gpu_launched_(m3_gpu *g, const char *kname, const char *file, int line) {
    hipError_t e = hipGetLastError();
    if (e != hipSuccess)
        return m3_errorf(M3_ERR_DEVICE, "gpu: %s:%d: launch of %s: %s", file, line, kname,
                         hipGetErrorString(e));
    if (g->sync) {
        e = hipStreamSynchronize(g->stream);
        if (e == hipSuccess) e = hipGetLastError();
        if (e != hipSuccess)
            return m3_errorf(M3_ERR_DEVICE, "gpu: %s:%d: %s failed on the device: %s", file, line,
                             kname, hipGetErrorString(e));
    }
    return M3_OK;
}

extern "C" bool m3_gpu_compiled(void) { return true; }

extern "C" void m3_gpu_close(m3_gpu *g) {
    if (!g) return;
    /* best effort: a context that failed half-way through open is closed here too */
    if (g->stream) (void)hipStreamSynchronize(g->stream);
#if M3_HAVE_BLAS
    if (g->blas_ok) (void)hipblasDestroy(g->blas);
#endif
    if (g->events_ok) {
        (void)hipEventDestroy(g->t0);
        (void)hipEventDestroy(g->t1);
    }
    if (g->arena) (void)hipFree(g->arena);
    if (g->counters) (void)hipFree(g->counters);
    if (g->stream) (void)hipStreamDestroy(g->stream);
    (void)hipGetLastError();
    free(g);
}

static m3_status open_inner(m3_gpu *g, int device) {
    int n = 0;
    hipError_t e = hipGetDeviceCount(&n);
    if (e != hipSuccess || n == 0)
        return m3_errorf(M3_ERR_DEVICE, "gpu: no device found (%s)",
                         e != hipSuccess ? hipGetErrorString(e) : "device count is 0");
    if (device < 0 || device >= n)
        return m3_errorf(M3_ERR_DEVICE, "gpu: device %d requested, %d present", device, n);
    M3_HIP_TRY(hipSetDevice(device));
    hipDeviceProp_t p;
    M3_HIP_TRY(hipGetDeviceProperties(&p, device));
    g->device = device;
    g->warp = p.warpSize;
    g->n_sm = p.multiProcessorCount;
    if (g->warp != M3_WARP)
        return m3_errorf(M3_ERR_UNSUPPORTED,
                         "gpu: device %s has warp width %d but the kernels were built for %d",
                         p.name, g->warp, M3_WARP);
    const char *s = getenv("M3_GPU_SYNC");
    g->sync = s && atoi(s) != 0;

    M3_HIP_TRY(hipStreamCreateWithFlags(&g->stream, hipStreamNonBlocking));
#if M3_HAVE_BLAS
    hipblasStatus_t bs = hipblasCreate(&g->blas);
    if (bs != HIPBLAS_STATUS_SUCCESS)
        return m3_errorf(M3_ERR_DEVICE, "gpu: BLAS handle: %s", m3_blas_status_str(bs));
    g->blas_ok = 1;
    bs = hipblasSetStream(g->blas, g->stream);
    if (bs != HIPBLAS_STATUS_SUCCESS)
        return m3_errorf(M3_ERR_DEVICE, "gpu: BLAS set stream: %s", m3_blas_status_str(bs));
#endif
    M3_HIP_TRY(hipEventCreate(&g->t0));
    e = hipEventCreate(&g->t1);
    if (e != hipSuccess) {
        (void)hipEventDestroy(g->t0);
        return m3_gpu_fail_(e, __FILE__, __LINE__, "hipEventCreate");
    }
    g->events_ok = 1;

    size_t free_b = 0, total_b = 0;
    M3_HIP_TRY(hipMemGetInfo(&free_b, &total_b));
    size_t want;
    const char *am = getenv("M3_GPU_ARENA_MB");
    if (am && *am) {
        char *end;
        unsigned long long mb = strtoull(am, &end, 10);
        if (*end || mb == 0)
            return m3_errorf(M3_ERR_ARG, "gpu: M3_GPU_ARENA_MB=%s is not a positive integer", am);
        want = (size_t)mb << 20;
    } else {
        want = free_b / 2;
        if (want > ((size_t)64 << 30)) want = (size_t)64 << 30;
    }
    want &= ~(size_t)(ARENA_ALIGN - 1);
    e = hipMalloc((void **)&g->arena, want);
    if (e != hipSuccess) {
        g->arena = NULL;
        (void)hipGetLastError();
        return m3_errorf(M3_ERR_NOMEM, "gpu: arena of %zu MiB: %s (free %zu MiB)", want >> 20,
                         hipGetErrorString(e), free_b >> 20);
    }
    g->arena_cap = want;
    g->arena_top = 0;
    e = hipMalloc((void **)&g->counters, M3_GPU_N_COUNTERS * sizeof(unsigned int));
    if (e != hipSuccess) {
        g->counters = NULL;
        return m3_gpu_fail_(e, __FILE__, __LINE__, "hipMalloc (counters)");
    }
    M3_HIP_TRY(hipMemsetAsync(g->counters, 0, M3_GPU_N_COUNTERS * sizeof(unsigned int), g->stream));
    M3_HIP_TRY(hipStreamSynchronize(g->stream));
    snprintf(g->desc, sizeof g->desc, "%.200s, cc %d.%d, %d SMs, warp %d, %.1f GiB, arena %.1f GiB%s",
             p.name, p.major, p.minor, p.multiProcessorCount, p.warpSize,
             (double)total_b / (1u << 30), (double)want / (1u << 30),
             g->sync ? ", M3_GPU_SYNC=1" : "");
    return M3_OK;
}

extern "C" m3_status m3_gpu_open(m3_gpu **out, int device) {
    *out = NULL;
    m3_gpu *g = (m3_gpu *)calloc(1, sizeof *g);
    if (!g) return m3_errorf(M3_ERR_NOMEM, "gpu: context allocation");
    m3_status s = open_inner(g, device);
    if (s != M3_OK) {
        m3_gpu_close(g);
        return s;
    }
    *out = g;
    return M3_OK;
}

extern "C" const char *m3_gpu_describe(const m3_gpu *g) { return g->desc; }
extern "C" int m3_gpu_warp_size(const m3_gpu *g) { return g->warp; }

/* ---- arena ----------------------------------------------------------------------------- */
extern "C" m3_status m3_gpu_alloc(m3_gpu *g, void **d_p, size_t bytes) {
    *d_p = NULL;
    size_t top = (g->arena_top + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (bytes > g->arena_cap || top > g->arena_cap - bytes)
        return m3_errorf(M3_ERR_NOMEM,
                         "gpu: arena exhausted: %zu bytes requested, %zu of %zu in use "
                         "(raise M3_GPU_ARENA_MB)",
                         bytes, g->arena_top, g->arena_cap);
    *d_p = g->arena + top;
    g->arena_top = top + bytes;
    return M3_OK;
}

extern "C" size_t m3_gpu_mark(const m3_gpu *g) { return g->arena_top; }
extern "C" void m3_gpu_release(m3_gpu *g, size_t mark) {
    M3_ASSERTF(mark <= g->arena_top, "release to %zu above the top %zu", mark, g->arena_top);
    g->arena_top = mark;
}
extern "C" size_t m3_gpu_arena_bytes(const m3_gpu *g) { return g->arena_cap; }

/* ---- copies ---------------------------------------------------------------------------- */
extern "C" m3_status m3_gpu_upload(m3_gpu *g, void *d_dst, const void *h_src, size_t bytes) {
    if (!bytes) return M3_OK;
    M3_HIP_TRY(hipMemcpyAsync(d_dst, h_src, bytes, hipMemcpyHostToDevice, g->stream));
    /* pageable host memory: wait, so the caller may reuse or free h_src at once */
    M3_HIP_TRY(hipStreamSynchronize(g->stream));
    return M3_OK;
}

extern "C" m3_status m3_gpu_download(m3_gpu *g, void *h_dst, const void *d_src, size_t bytes) {
    if (!bytes) return M3_OK;
    M3_HIP_TRY(hipMemcpyAsync(h_dst, d_src, bytes, hipMemcpyDeviceToHost, g->stream));
    M3_HIP_TRY(hipStreamSynchronize(g->stream));
    return M3_OK;
}

extern "C" m3_status m3_gpu_copy(m3_gpu *g, void *d_dst, const void *d_src, size_t bytes) {
    if (!bytes) return M3_OK;
    M3_HIP_TRY(hipMemcpyAsync(d_dst, d_src, bytes, hipMemcpyDeviceToDevice, g->stream));
    return M3_OK;
}

extern "C" m3_status m3_gpu_memset(m3_gpu *g, void *d_dst, int byte, size_t bytes) {
    if (!bytes) return M3_OK;
    M3_HIP_TRY(hipMemsetAsync(d_dst, byte, bytes, g->stream));
    return M3_OK;
}

extern "C" m3_status m3_gpu_sync(m3_gpu *g) {
    M3_HIP_TRY(hipStreamSynchronize(g->stream));
    M3_HIP_TRY(hipGetLastError());
    return M3_OK;
}

/* ---- timing ---------------------------------------------------------------------------- */
extern "C" m3_status m3_gpu_timer_start(m3_gpu *g) {
    M3_HIP_TRY(hipEventRecord(g->t0, g->stream));
    return M3_OK;
}

extern "C" m3_status m3_gpu_timer_stop(m3_gpu *g, float *ms) {
    M3_HIP_TRY(hipEventRecord(g->t1, g->stream));
    M3_HIP_TRY(hipEventSynchronize(g->t1));
    M3_HIP_TRY(hipEventElapsedTime(ms, g->t0, g->t1));
    return M3_OK;
}

/* ---- GEMM through the vendor BLAS -------------------------------------------------------
 * Row-major y[T,N] = x[T,K]·W[N,K]^T is, in the BLAS's column-major view, y^T = W^T·x^T with
 * W seen as a K×N matrix (ld K) and x as K×T (ld K): op(A)=T on W, op(B)=N on x. */
static m3_status gemm(m3_gpu *g, void *d_y, int y_type, const void *d_x, const void *d_w,
                      int in_type, int n_tok, int n_out, int n_in) {
    M3_ASSERTF(n_tok >= 0 && n_out > 0 && n_in > 0, "T=%d N=%d K=%d", n_tok, n_out, n_in);
    if (n_tok == 0) return M3_OK;
#if M3_HAVE_BLAS
    const float one = 1.0f, zero = 0.0f;
    hipblasStatus_t s = hipblasGemmEx(g->blas, HIPBLAS_OP_T, HIPBLAS_OP_N, n_out, n_tok, n_in,
                                      &one, d_w, (decltype(M3_BLAS_R_32F))in_type, n_in, d_x,
                                      (decltype(M3_BLAS_R_32F))in_type, n_in,
                                      &zero, d_y, (decltype(M3_BLAS_R_32F))y_type, n_out,
                                      M3_BLAS_COMPUTE_32F, M3_BLAS_GEMM_DEFAULT);
    if (s != HIPBLAS_STATUS_SUCCESS)
        return m3_errorf(M3_ERR_DEVICE, "gpu: GEMM T=%d N=%d K=%d: %s", n_tok, n_out, n_in,
                         m3_blas_status_str(s));
    M3_LAUNCHED(g, "blas gemm");
    return M3_OK;
#else
    (void)g; (void)d_y; (void)y_type; (void)d_x; (void)d_w; (void)in_type;
    return m3_errorf(M3_ERR_UNSUPPORTED, "gpu: built without a vendor BLAS (GEMM T=%d N=%d K=%d)",
                     n_tok, n_out, n_in);
#endif
}

extern "C" m3_status m3_gpu_gemm_bf16(m3_gpu *g, m3_bf16 *d_y, const m3_bf16 *d_x,
                                      const m3_bf16 *d_w, int n_tok, int n_out, int n_in) {
#if M3_HAVE_BLAS
    return gemm(g, d_y, (int)M3_BLAS_R_16BF, d_x, d_w, (int)M3_BLAS_R_16BF, n_tok, n_out, n_in);
#else
    return gemm(g, d_y, 0, d_x, d_w, 0, n_tok, n_out, n_in);
#endif
}

extern "C" m3_status m3_gpu_gemm_bf16_f32(m3_gpu *g, float *d_y, const m3_bf16 *d_x,
                                          const m3_bf16 *d_w, int n_tok, int n_out, int n_in) {
#if M3_HAVE_BLAS
    return gemm(g, d_y, (int)M3_BLAS_R_32F, d_x, d_w, (int)M3_BLAS_R_16BF, n_tok, n_out, n_in);
#else
    return gemm(g, d_y, 1, d_x, d_w, 0, n_tok, n_out, n_in);
#endif
}

/* fp32 x fp32 -> fp32 with CUBLAS_COMPUTE_32F: true fp32 products and sums (no TF32: the
 * handle keeps the default math mode), the fp32 profile's GEMM. */
extern "C" m3_status m3_gpu_gemm_f32(m3_gpu *g, float *d_y, const float *d_x, const float *d_w,
                                     int n_tok, int n_out, int n_in) {
#if M3_HAVE_BLAS
    return gemm(g, d_y, (int)M3_BLAS_R_32F, d_x, d_w, (int)M3_BLAS_R_32F, n_tok, n_out, n_in);
#else
    return gemm(g, d_y, 1, d_x, d_w, 1, n_tok, n_out, n_in);
#endif
}
