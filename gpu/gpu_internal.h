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
    char desc[512];
};

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

/* Grid size for n items of `per_block` each, capped so it fits a 1-D grid. */
static inline unsigned m3_grid_1d(int64_t n, int per_block) {
    int64_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : b);
}

#endif
