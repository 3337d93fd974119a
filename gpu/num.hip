/* gpu/num.hip: element-wise format conversions on the device, twins of ref/num/bf16.h's
 * scalar functions (the same header code runs here as device code, so results are bit for
 * bit those of the host). Tests: tests/gpu_base.c (exhaustive over bf16, random + special
 * fp32 inputs).
 * m3_gpu_num_sweep / m3_gpu_mx_quantize_blocks: every scalar conversion of ref/num
 * (gpu/num_ops.h's switch) and MX block quantization run as device code, for the host-vs-
 * device bit-equality test tests/gpu_num.c. Grid-stride, one input word (or block) per
 * thread; compiled without fast-math or flush-to-zero (e8m0 byte 0 is an fp32 subnormal). */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "gpu/num_ops.h"
#include "ref/num/bf16.h"
#include "ref/num/fp8.h"

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

static __global__ void num_sweep_k(uint32_t *M3_RESTRICT out, const uint32_t *M3_RESTRICT in,
                                   int op, int param, uint32_t start, uint32_t stride, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t u = in ? in[i] : start + (uint32_t)i * stride; /* mod 2^32 */
        out[i] = m3_num_apply(op, param, u);
    }
}

static __global__ void mx_blocks_k(uint8_t *M3_RESTRICT codes, m3_e8m0 *M3_RESTRICT scales,
                                   float *M3_RESTRICT y, const float *M3_RESTRICT x,
                                   int64_t n_blocks, m3_mx_params p) {
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < n_blocks;
         b += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = b * p.block;
        scales[b] = m3_mx_quantize_block(codes + o, x + o, p.block, &p);
        m3_mx_dequantize_block(y + o, codes + o, scales[b], p.block, &p);
    }
}

extern "C" m3_status m3_gpu_num_sweep(m3_gpu *g, uint32_t *d_out, const uint32_t *d_in, int op,
                                      int param, uint32_t start, uint32_t stride, int64_t n) {
    M3_ASSERT(g && d_out && n >= 0 && op >= 0 && op < M3_NUM_N_OPS);
    if (n == 0) return M3_OK;
    num_sweep_k<<<stride_grid(g, n, 256), 256, 0, g->stream>>>(d_out, d_in, op, param, start,
                                                              stride, n);
    M3_LAUNCHED(g, "num_sweep_k");
    return M3_OK;
}

extern "C" m3_status m3_gpu_mx_quantize_blocks(m3_gpu *g, uint8_t *d_codes, m3_e8m0 *d_scales,
                                               float *d_y, const float *d_x, int64_t n_blocks,
                                               const struct m3_mx_params *p) {
    M3_ASSERT(g && p && p->block > 0 && n_blocks >= 0 && d_codes && d_scales && d_y && d_x);
    if (n_blocks == 0) return M3_OK;
    mx_blocks_k<<<stride_grid(g, n_blocks, 128), 128, 0, g->stream>>>(d_codes, d_scales, d_y, d_x,
                                                                     n_blocks, *p);
    M3_LAUNCHED(g, "mx_blocks_k");
    return M3_OK;
}

/* ---- NaN codes among fp8 bytes (m3_gpu_fp8_count_nan) -----------------------------------
 * Eight codes a 64-bit word, each byte's NaN test as SWAR with no carry between bytes (every
 * sum stays below 0x100 in its byte), then a popcount of the flag bits. The same predicate
 * as ref/num/fp8.h m3_fp8_is_nan for each kind (tests/gpu_num.c checks it against it). */
static __device__ __forceinline__ uint64_t fp8_nan_flags(uint64_t v, int kind) {
    const uint64_t lo7 = 0x7F7F7F7F7F7F7F7Full, hi = 0x8080808080808080ull;
    const uint64_t m = v & lo7;
    if (kind == M3_FP8_E4M3FN) return (m + 0x0101010101010101ull) & hi; /* m == 0x7F */
    if (kind == M3_FP8_E5M2) return (m + 0x0303030303030303ull) & hi;   /* m > 0x7C */
    /* fnuz: the byte is 0x80, i.e. m == 0 with the sign bit set */
    return ~(m + lo7) & v & hi;
}

static __global__ void fp8_nan_k(unsigned long long *M3_RESTRICT count,
                                 const uint8_t *M3_RESTRICT c, int64_t n_words, int kind) {
    const uint4 *w = reinterpret_cast<const uint4 *>(c); /* 16-byte aligned by the caller */
    unsigned long long k = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_words;
         i += (int64_t)gridDim.x * blockDim.x) {
        const uint4 u = w[i];
        k += (unsigned long long)__popcll(fp8_nan_flags(((uint64_t)u.y << 32) | u.x, kind));
        k += (unsigned long long)__popcll(fp8_nan_flags(((uint64_t)u.w << 32) | u.z, kind));
    }
    /* one atomic per warp: the count is exact in any order */
    for (int o = M3_WARP / 2; o > 0; o /= 2) k += M3_SHFL_XOR(k, o);
    if ((threadIdx.x & (M3_WARP - 1)) == 0 && k) atomicAdd(count, k);
}

static __global__ void fp8_nan_edge_k(unsigned long long *M3_RESTRICT count,
                                      const uint8_t *M3_RESTRICT c, int64_t n, int kind) {
    unsigned long long k = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        k += m3_fp8_is_nan(c[i], (m3_fp8_kind)kind) ? 1u : 0u;
    if (k) atomicAdd(count, k);
}

extern "C" m3_status m3_gpu_fp8_count_nan(m3_gpu *g, const uint8_t *d_codes, int64_t n,
                                          m3_fp8_kind kind, int64_t *count) {
    M3_ASSERT(g && count && n >= 0 && (n == 0 || d_codes));
    *count = 0;
    if (n == 0) return M3_OK;
    const size_t mark = m3_gpu_mark(g);
    void *d_cnt = NULL;
    M3_TRY(m3_gpu_alloc(g, &d_cnt, sizeof(unsigned long long)));
    unsigned long long *cnt = (unsigned long long *)d_cnt;
    m3_status st = m3_gpu_memset(g, cnt, 0, sizeof *cnt);
    /* the 16-byte-aligned middle by the wide kernel, the head and tail bytes (< 16 each) by
     * the edge kernel */
    const int64_t head = (int64_t)((16u - ((uintptr_t)d_codes & 15u)) & 15u);
    const int64_t h = head < n ? head : n, words = (n - h) / 16, tail = n - h - words * 16;
    if (st == M3_OK && words > 0) {
        fp8_nan_k<<<stride_grid(g, words, 256), 256, 0, g->stream>>>(cnt, d_codes + h, words,
                                                                    (int)kind);
        st = m3_gpu_launched_(g, "fp8_nan_k", __FILE__, __LINE__);
    }
    if (st == M3_OK && h > 0) {
        fp8_nan_edge_k<<<1, 64, 0, g->stream>>>(cnt, d_codes, h, (int)kind);
        st = m3_gpu_launched_(g, "fp8_nan_edge_k", __FILE__, __LINE__);
    }
    if (st == M3_OK && tail > 0) {
        fp8_nan_edge_k<<<1, 64, 0, g->stream>>>(cnt, d_codes + h + words * 16, tail, (int)kind);
        st = m3_gpu_launched_(g, "fp8_nan_edge_k", __FILE__, __LINE__);
    }
    unsigned long long v = 0;
    if (st == M3_OK) st = m3_gpu_download(g, &v, cnt, sizeof v);
    m3_gpu_release(g, mark);
    if (st == M3_OK) *count = (int64_t)v;
    return st;
}
