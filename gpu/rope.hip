/* gpu/rope.hip: fused per-head Gemma q/k norm + partial NeoX RoPE, device twin of
 * ref/rope.c m3_qk_norm_rope (spec §3.5, §3.6). Two paths: rope_row_k (below, a warp per
 * row, for head_dim == 4 * M3_WARP and R/8 a power of two: the M3 shapes) and this one
 * (a block per token, any shape). Tolerance: GPU_NMSE_F32 / GPU_NMSE_BF16
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

/* ---- row-parallel path (head_dim == 4 * M3_WARP, the M3 shape) --------------------------
 * rope_cs_k: the cos/sin table [T][R] (c then s) of every token, evaluated exactly as in
 *   qk_norm_rope_k (double from the fp32 angle, fp32, bf16 per profile).
 * rope_row_k: one warp per ROPE_RPW (token, head) rows, 4 consecutive dims per lane (one 8-
 *   or 16-byte access per row, all rows' loads issued first): the rows stream in and out with no block barrier, so the kernel runs at memory
 *   speed instead of at the latency of one block per token. The rotation partner of dim d
 *   (d +- R/2) sits in lane l ^ (R/8) at the same slot (R/8 a power of two), fetched with a
 *   shuffle. Same operations and rounding points as qk_norm_rope_k (only the warp's sum of
 *   squares order differs, as there). */
static __global__ void __launch_bounds__(128)
    rope_cs_k(float *M3_RESTRICT cs, const int32_t *M3_RESTRICT pos, int rot_dim, rope_inv_table inv,
              bool angle_f64, bool cs_bf16) {
    const int t = (int)blockIdx.x, half = rot_dim / 2, p = pos[t];
    for (int j = (int)threadIdx.x; j < 2 * half; j += (int)blockDim.x) {
        const int i = j < half ? j : j - half;
        const double a = angle_f64 ? (double)p * (double)inv.inv[i] : (double)__fmul_rn((float)p, inv.inv[i]);
        cs[(size_t)t * rot_dim + j] = rnd(cs_bf16, j < half ? (float)cos(a) : (float)sin(a));
    }
}

static __device__ __forceinline__ void ld4(const float *p, float *v) {
    const float4 u = *reinterpret_cast<const float4 *>(p);
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
}
static __device__ __forceinline__ void ld4(const m3_bf16 *p, float *v) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    v[0] = m3_bits_f32(u.x << 16), v[1] = m3_bits_f32(u.x & 0xFFFF0000u);
    v[2] = m3_bits_f32(u.y << 16), v[3] = m3_bits_f32(u.y & 0xFFFF0000u);
}
static __device__ __forceinline__ void st4(float *p, const float *v) {
    *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
static __device__ __forceinline__ void st4(m3_bf16 *p, const float *v) {
    *reinterpret_cast<uint2 *>(p) =
        make_uint2((uint32_t)m3_f32_to_bf16(v[0]) | ((uint32_t)m3_f32_to_bf16(v[1]) << 16),
                   (uint32_t)m3_f32_to_bf16(v[2]) | ((uint32_t)m3_f32_to_bf16(v[3]) << 16));
}

#define ROPE_RPW 4 /* rows per warp: their loads are all issued before any math */
template <typename TS>
static __global__ void __launch_bounds__(256)
    rope_row_k(TS *x, int ld_x, const float *M3_RESTRICT cs, int n_tok, int n_head,
               const m3_bf16 *M3_RESTRICT w, float eps, int rot_dim, int qk_round) {
    const int lane = (int)threadIdx.x % M3_WARP, warp = (int)threadIdx.x / M3_WARP;
    const int64_t row0 = ((int64_t)blockIdx.x * (blockDim.x / M3_WARP) + warp) * ROPE_RPW;
    const int64_t n_rows = (int64_t)n_tok * n_head;
    if (row0 >= n_rows) return; /* whole warp */
    const int hd = 4 * M3_WARP;
    const bool per_op = qk_round == M3_QK_ROUND_PER_OP, once = qk_round == M3_QK_ROUND_ONCE;
    float e[ROPE_RPW][4], wv[4];
    TS *px[ROPE_RPW];
#pragma unroll
    for (int r = 0; r < ROPE_RPW; r++) {
        const int64_t ri = row0 + r < n_rows ? row0 + r : row0; /* tail: redo a valid row, no store */
        px[r] = x + (ri / n_head) * ld_x + (ri % n_head) * hd + lane * 4;
        ld4(px[r], e[r]);
    }
    ld4(w + lane * 4, wv);
#pragma unroll
    for (int r = 0; r < ROPE_RPW; r++) {
        const int64_t ri = row0 + r < n_rows ? row0 + r : row0;
        const int t = (int)(ri / n_head);
        float *ev = e[r];
        const float ss = ev[0] * ev[0] + ev[1] * ev[1] + ev[2] * ev[2] + ev[3] * ev[3];
        const float mu = m3_warp_sum(ss) / (float)hd;
        const float rho = 1.0f / sqrtf(mu + eps);
#pragma unroll
        for (int k = 0; k < 4; k++) ev[k] = rnd(per_op, (ev[k] * rho) * (1.0f + wv[k]));
        if (rot_dim > 0) { /* warp-uniform */
            const int half = rot_dim / 2, pl = half / 4;
            const float *c = cs + (size_t)t * rot_dim, *s = c + half;
            float out[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float pe = M3_SHFL_XOR(ev[k], pl); /* the partner dim, same slot */
                const int d = lane * 4 + k;
                if (d < half) {
                    const float a1 = rnd(per_op, __fmul_rn(ev[k], c[d]));
                    const float b1 = rnd(per_op, __fmul_rn(-pe, s[d]));
                    out[k] = rnd(per_op, __fadd_rn(a1, b1));
                } else if (d < rot_dim) {
                    const int i = d - half;
                    const float a2 = rnd(per_op, __fmul_rn(ev[k], c[i]));
                    const float b2 = rnd(per_op, __fmul_rn(pe, s[i]));
                    out[k] = rnd(per_op, __fadd_rn(a2, b2));
                } else {
                    out[k] = ev[k];
                }
            }
#pragma unroll
            for (int k = 0; k < 4; k++) ev[k] = out[k];
        }
#pragma unroll
        for (int k = 0; k < 4; k++) ev[k] = rnd(once, ev[k]);
        if (row0 + r < n_rows) st4(px[r], ev);
    }
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
    const int half = rot_dim / 2;
    if (head_dim == 4 * M3_WARP && half % 4 == 0 && (half == 0 || ((half / 4) & (half / 4 - 1)) == 0) &&
        ld % 4 == 0 && m3_aligned16(d_x) && m3_aligned16(d_w)) {
        const size_t mark = m3_gpu_mark(g);
        float *cs = NULL;
        if (rot_dim > 0) {
            M3_TRY(m3_gpu_alloc(g, (void **)&cs, (size_t)n_tok * rot_dim * sizeof(float)));
            rope_cs_k<<<(unsigned)n_tok, 128, 0, g->stream>>>(cs, d_pos, rot_dim, inv,
                                                           p->rope_angle == M3_ROPE_ANGLE_F64,
                                                           p->rope_cs_bf16);
            m3_status st0 = m3_gpu_launched_(g, "rope_cs_k", __FILE__, __LINE__);
            if (st0 != M3_OK) {
                m3_gpu_release(g, mark);
                return st0;
            }
        }
        const int64_t rows = (int64_t)n_tok * n_head, rpb = 256 / M3_WARP * ROPE_RPW;
        rope_row_k<TS><<<(unsigned)((rows + rpb - 1) / rpb), 256, 0, g->stream>>>(
            d_x, ld, cs, n_tok, n_head, d_w, eps, rot_dim, (int)p->qk_round);
        m3_status st1 = m3_gpu_launched_(g, "rope_row_k", __FILE__, __LINE__);
        m3_gpu_release(g, mark); /* the table's readers are ordered before later work */
        return st1;
    }
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
