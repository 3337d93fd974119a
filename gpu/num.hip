/* gpu/num.hip: element-wise format conversions on the device, twins of ref/num/bf16.h's
 * scalar functions (the same header code runs here as device code, so results are bit for
 * bit those of the host). Tests: tests/gpu_base.c (exhaustive over bf16, random + special
 * fp32 inputs). */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "ref/num/bf16.h"

static __global__ void f32_to_bf16_k(m3_bf16 *M3_RESTRICT y, const float *M3_RESTRICT x,
                                     int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = m3_f32_to_bf16(x[i]);
}

static __global__ void bf16_to_f32_k(float *M3_RESTRICT y, const m3_bf16 *M3_RESTRICT x,
                                     int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = m3_bf16_to_f32(x[i]);
}

/* grid-stride: enough blocks to fill the device a few times over, never more than needed */
static unsigned stride_grid(const m3_gpu *g, int64_t n, int threads) {
    unsigned want = m3_grid_1d(n, threads), cap = (unsigned)g->n_sm * 8u;
    return want < cap ? want : cap;
}

extern "C" m3_status m3_gpu_f32_to_bf16(m3_gpu *g, m3_bf16 *d_y, const float *d_x, int64_t n) {
    M3_ASSERT(n >= 0);
    if (n == 0) return M3_OK;
    f32_to_bf16_k<<<stride_grid(g, n, 256), 256, 0, g->stream>>>(d_y, d_x, n);
    M3_LAUNCHED(g, "f32_to_bf16_k");
    return M3_OK;
}

extern "C" m3_status m3_gpu_bf16_to_f32(m3_gpu *g, float *d_y, const m3_bf16 *d_x, int64_t n) {
    M3_ASSERT(n >= 0);
    if (n == 0) return M3_OK;
    bf16_to_f32_k<<<stride_grid(g, n, 256), 256, 0, g->stream>>>(d_y, d_x, n);
    M3_LAUNCHED(g, "bf16_to_f32_k");
    return M3_OK;
}
