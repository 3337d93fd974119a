/* gpu/rope.hip: fused per-head Gemma q/k norm + partial NeoX RoPE, device twin of
 * ref/rope.c m3_qk_norm_rope (spec §3.5, §3.6). Tolerance: GPU_NMSE_F32 / GPU_NMSE_BF16
 * (tests/gpu_test.h until compare/tol.c has a "rope" row). Tests: tests/gpu_norm_rope.c.
 *
 * qk_norm_rope_k: one block per token. The block first builds that position's cos/sin
 *   table in shared memory: a = f32(f32(p)*inv[i]) (or the f64 angle), cos/sin evaluated in
 *   double and rounded to fp32 (as the reference does), bf16 when the profile says, and
 *   stages the token's n_head*head_dim slice in shared memory with 16-byte loads (all loads
 *   in flight at once). Then each warp takes whole heads: it reduces sum(e^2) with a warp
 *   butterfly, normalises ((e*rho)*(1+w)), and rotates pairs (i, i+R/2) through registers.
 *   Finally the block writes the slice back with 16-byte stores.
 *   Products and sums in the rotation use __fmul_rn/__fadd_rn: no FMA contraction, so the
 *   rotation itself rounds exactly like the reference (only the norm's sum order differs).
 * inv[i] is computed on the host exactly as ref's m3_rope_inv_freq does (p->rope_inv: torch's
 *   fp32 steps, or f64) and passed by value (<= 128 entries), so both sides rotate with the
 *   same fp32 frequencies (the test compares the full outputs, which would catch a drift).
 * Rounding (p->qk_round): NONE fp32; PER_OP bf16 after the norm, after every product and
 *   after each sum (hf); ONCE one rounding of every dim at the end (atom). A bf16 store
 *   rounds anyway: ONCE is then exactly the store. Columns outside the n_head*head_dim
 *   slice of a row are not touched (the row pitch ld lets q/k/index slices of a packed qkv
 *   row be processed in place). */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "ref/num/bf16.h"

#include <math.h>
#include <string.h>

#define ROPE_THREADS 256
#define ROPE_MAX_HALF 128 /* rot_dim <= 256 */
#define ROPE_MAX_SHMEM (64 * 1024) /* the slice of one row: 64 x 128 fp32 = 32 KiB for q */

typedef struct {
    float inv[ROPE_MAX_HALF];
} rope_inv_table;

/* Host: inv[i] = 1/theta^(2i/R) held in fp32, per m3_rope_inv (ref/profile.h). */
static void rope_inv_freq(float *inv, int rot_dim, float theta, m3_rope_inv mode) {
    for (int i = 0; i < rot_dim / 2; i++) {
        if (mode == M3_ROPE_INV_F64) {
            inv[i] = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)rot_dim));
        } else { /* torch: fp32 exponent, fp32 power (pow in double, one rounding), fp32 1/x */
            float e = (float)(2 * i) / (float)rot_dim;
            float pw = (float)pow((double)theta, (double)e);
            inv[i] = 1.0f / pw;
        }
    }
}

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

/* ---- kernel ----------------------------------------------------------------------------
 * Shared memory: c[half], s[half], then the token's n_head*head_dim slice as floats. */
#define ROPE_MAXK 8 /* dims per lane: head_dim <= 8 * M3_WARP */

template <typename TS>
static __global__ void __launch_bounds__(ROPE_THREADS)
    qk_norm_rope_k(TS *x, int ld_x, const int32_t *M3_RESTRICT pos, int n_head, int head_dim,
                   const m3_bf16 *M3_RESTRICT w, float eps, int rot_dim, rope_inv_table inv,
                   bool angle_f64, bool cs_bf16, int qk_round, bool vec) {
    extern __shared__ float sh[];
    const int half = rot_dim / 2;
    float *c = sh, *s = sh + half, *row_sh = sh + 2 * half;
    const int lane = (int)threadIdx.x % M3_WARP, warp = (int)threadIdx.x / M3_WARP;
    const int n_warp = (int)blockDim.x / M3_WARP;
    const int n = n_head * head_dim;
    const int64_t row = (int64_t)blockIdx.x * ld_x;
    const int32_t p = pos[blockIdx.x];
    const bool per_op = qk_round == M3_QK_ROUND_PER_OP, once = qk_round == M3_QK_ROUND_ONCE;
    typedef m3_vec<TS> V;

    /* 1. cos/sin of this position; the whole slice into shared memory (16-byte loads) */
    /* cos on threads [0, half), sin on [half, 2 half): the double-precision evaluations are
     * the slowest step of a token, so they are spread over twice the threads */
    for (int j = threadIdx.x; j < 2 * half; j += blockDim.x) {
        const int i = j < half ? j : j - half;
        double a = angle_f64 ? (double)p * (double)inv.inv[i]
                             : (double)__fmul_rn((float)p, inv.inv[i]);
        if (j < half) c[i] = rnd(cs_bf16, (float)cos(a));
        else s[i] = rnd(cs_bf16, (float)sin(a));
    }
    if (vec)
        for (int i = threadIdx.x * V::N; i < n; i += blockDim.x * V::N) V::load(x, row + i, row_sh + i);
    else
        for (int i = threadIdx.x; i < n; i += blockDim.x) row_sh[i] = ld(x, row + i);
    __syncthreads();

    /* 2. one warp per head (warp-uniform loop, no block barriers inside) */
    for (int h = warp; h < n_head; h += n_warp) {
        float *e = row_sh + h * head_dim;
        float ss = 0.0f;
        for (int d = lane; d < head_dim; d += M3_WARP) ss += e[d] * e[d];
        const float mu = m3_warp_sum(ss) / (float)head_dim;
        const float rho = 1.0f / sqrtf(mu + eps);
        for (int d = lane; d < head_dim; d += M3_WARP) /* each lane rewrites its own dims */
            e[d] = rnd(per_op, (e[d] * rho) * (1.0f + m3_bf16_to_f32(w[d])));
        M3_SYNCWARP(); /* the rotation reads the partner dim written by another lane */
        float out[ROPE_MAXK];
#pragma unroll
        for (int k = 0; k < ROPE_MAXK; k++) {
            const int d = lane + k * M3_WARP;
            if (d >= head_dim) break;
            if (d < half) { /* e'[i] = e[i] c + (-e[i+h]) s */
                float a1 = rnd(per_op, __fmul_rn(e[d], c[d]));
                float b1 = rnd(per_op, __fmul_rn(-e[d + half], s[d]));
                out[k] = rnd(per_op, __fadd_rn(a1, b1));
            } else if (d < rot_dim) { /* e'[i+h] = e[i+h] c + e[i] s */
                const int i = d - half;
                float a2 = rnd(per_op, __fmul_rn(e[d], c[i]));
                float b2 = rnd(per_op, __fmul_rn(e[i], s[i]));
                out[k] = rnd(per_op, __fadd_rn(a2, b2));
            } else {
                out[k] = e[d]; /* pass-through dims: normed (rounded under PER_OP) */
            }
        }
        M3_SYNCWARP(); /* every partner read is done before any lane overwrites */
#pragma unroll
        for (int k = 0; k < ROPE_MAXK; k++) {
            const int d = lane + k * M3_WARP;
            if (d >= head_dim) break;
            e[d] = rnd(once, out[k]);
        }
    }
    __syncthreads();

    /* 3. the slice back (16-byte stores; a bf16 store rounds) */
    if (vec)
        for (int i = threadIdx.x * V::N; i < n; i += blockDim.x * V::N) V::store(x, row + i, row_sh + i);
    else
        for (int i = threadIdx.x; i < n; i += blockDim.x) st(x, row + i, row_sh[i]);
}

/* ---- launchers ------------------------------------------------------------------------- */
template <typename TS>
static m3_status launch(m3_gpu *g, TS *d_x, int ld, const int32_t *d_pos, int n_tok, int n_head,
                        int head_dim, const m3_bf16 *d_w, float eps, int rot_dim, float theta,
                        const m3_profile *p) {
    M3_ASSERTF(n_tok >= 0 && n_head > 0 && head_dim > 0 && ld >= n_head * head_dim,
               "T=%d heads=%d Dh=%d ld=%d", n_tok, n_head, head_dim, ld);
    M3_ASSERTF(rot_dim >= 0 && rot_dim % 2 == 0 && rot_dim <= head_dim, "R=%d Dh=%d", rot_dim,
               head_dim);
    M3_ASSERT(p && d_x && d_w && (d_pos || n_tok == 0));
    if (rot_dim / 2 > ROPE_MAX_HALF)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu qk_norm_rope: rot_dim %d > %d", rot_dim,
                         2 * ROPE_MAX_HALF);
    if (n_tok == 0) return M3_OK;
    rope_inv_table inv;
    memset(&inv, 0, sizeof inv);
    if (rot_dim > 0) rope_inv_freq(inv.inv, rot_dim, theta, p->rope_inv);
    if (head_dim > ROPE_MAXK * M3_WARP)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu qk_norm_rope: head_dim %d > %d", head_dim,
                         ROPE_MAXK * M3_WARP);
    size_t shmem = ((size_t)rot_dim + (size_t)n_head * head_dim) * sizeof(float);
    if (shmem > ROPE_MAX_SHMEM)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu qk_norm_rope: %d heads x %d do not fit one block",
                         n_head, head_dim);
    if (shmem > 48 * 1024) /* above 48 KiB a kernel must opt in */
        M3_HIP_TRY(hipFuncSetAttribute((const void *)qk_norm_rope_k<TS>,
                                       hipFuncAttributeMaxDynamicSharedMemorySize, (int)shmem));
    const int vn = m3_vec<TS>::N;
    const bool vec = (n_head * head_dim) % vn == 0 && ld % vn == 0 && m3_aligned16(d_x);
    qk_norm_rope_k<TS><<<(unsigned)n_tok, ROPE_THREADS, shmem, g->stream>>>(
        d_x, ld, d_pos, n_head, head_dim, d_w, eps, rot_dim, inv,
        p->rope_angle == M3_ROPE_ANGLE_F64, p->rope_cs_bf16, (int)p->qk_round, vec);
    M3_LAUNCHED(g, "qk_norm_rope_k");
    return M3_OK;
}

extern "C" m3_status m3_gpu_qk_norm_rope(m3_gpu *g, m3_bf16 *d_x, int ld, const int32_t *d_pos,
                                         int n_tok, int n_head, int head_dim, const m3_bf16 *d_w,
                                         float eps, int rot_dim, float theta,
                                         const m3_profile *p) {
    if (p->qk_round == M3_QK_ROUND_NONE)
        return m3_errorf(M3_ERR_UNSUPPORTED,
                         "gpu qk_norm_rope: profile %s keeps fp32 q/k: use the _f32 path",
                         p->name);
    return launch<m3_bf16>(g, d_x, ld, d_pos, n_tok, n_head, head_dim, d_w, eps, rot_dim, theta,
                           p);
}

extern "C" m3_status m3_gpu_qk_norm_rope_f32(m3_gpu *g, float *d_x, int ld, const int32_t *d_pos,
                                             int n_tok, int n_head, int head_dim,
                                             const m3_bf16 *d_w, float eps, int rot_dim,
                                             float theta, const m3_profile *p) {
    return launch<float>(g, d_x, ld, d_pos, n_tok, n_head, head_dim, d_w, eps, rot_dim, theta, p);
}
