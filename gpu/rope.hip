/* gpu/rope.hip: per-head Gemma q/k norm + partial NeoX RoPE, alone (m3_gpu_qk_norm_rope, twin
 * of ref/rope.c m3_qk_norm_rope, spec §3.5, §3.6) and fused with the K/V and index-cache
 * writes (m3_gpu_qk_norm_rope_cache; twin: ref's m3_qk_norm_rope + ref/kvcache.c m3_kv_write
 * and m3_kv_index_write as ref/layer.c composes them, spec §4.1-§4.8). gpu/kvcache.hip's
 * m3_gpu_kv_cache_write is the same code with two un-normed parts. Tests:
 * tests/gpu_norm_rope.c (bit for bit against the ref composition), tests/gpu_kvcache.c.
 *
 * Three kernel forms, one contract (every byte equal to ref's):
 * - passes of >= 256 tokens, bf16 rows of Dh 128 (16-byte aligned), rotary 64 or none, and
 *   a cache in page-128 / page-16 / plain-row layout: the WARP-STREAMING kernels (section
 *   "warp-streaming paths" below): a cos/sin table launch, qw_norm_k (every normed part;
 *   K rows with their K cache write, index_k rows with the index cache write) and kvw_k /
 *   kvw8_k (raw bf16 / fp8 K / V rows: m3_gpu_kv_cache_write's K and V, the fused call's V).
 *   On NVIDIA the table -> qw_norm_k -> K / V writer launches are programmatic dependent
 *   launches (session 7: each starts while the one before runs; see "launchers"), and so is
 *   the writer launched alone (m3_gpu_kv_cache_write, any pass size; session 16: kvw_args.pre).
 *   H200, session 5:
 *   qk_norm_rope 64% -> 77% of copy, the fused step 66% -> 73% (bf16 dense) and 48% -> 69%
 *   (fp8 sparse + index), the bf16 K/V writer 68% -> 80% (docs/gpu-log/rope.md);
 * - passes under 256 tokens (decode) of the same shapes (session 8): ONE launch, no table:
 *   qw_norm_k's small form (cos / sin evaluated in the step: one double sincos a lane per
 *   distinct token, shared by shuffles; no block prologue; fp8 V rows as one more part written
 *   through qw_kstore's code, bf16 V rows as kvw_k's window steps in the same grid), or for
 *   the K / V writer alone kvw8s_k (fp8; session 10) / kvw_k. H200: fused fp8 sparse + index
 *   T=1 18.3 -> 8.6 us, T=64 19.3 -> 10.6 us; the fp8 writer T=64 10.1 -> 7.7 us; session 9
 *   (sincos shared, no prologue): sparse T=1 9.8 -> 6.6 us, T=64 11.0 -> 7.9, dense T=1 8.0 ->
 *   5.2; session 10: the fp8 writer T=64 (kvw8s_k) 9.6 -> 4.6 us; session 11 (a step is one
 *   token's rows): sparse T=64 7.9 -> 6.5 us, dense T=64 6.3 -> 5.9 us (docs/gpu-log/rope.md);
 * - everything else (fp32 storage, odd head dims or pitches, ref's paged geometries other
 *   than M3's, index keys of Di != 128): the TILE kernel qkv_k described next, which also
 *   takes any part the warp kernels do not.
 *
 * Tile kernel: one launch (plus a cos/sin table launch for passes of >= 256 tokens), a grid of TILES in
 * SEGMENTS: each part (q, k, v, index_q, index_k) gets its own range of tiles, and a tile holds
 * `tt` consecutive tokens of one part (tt * heads <= 256 rows), so every tile has the access
 * pattern its part needs:
 *   1. rows into shared memory with coalesced 16-byte loads, row r = h * tokens + t
 *      (head-major); the tile's slots, positions and cos/sin rows (from the table, or
 *      evaluated here: angle f32(f32(p)*inv[i]) or f64, cos/sin in double rounded to fp32,
 *      bf16 when the profile says). NVIDIA: blocks are persistent and the NEXT tile's loads
 *      are in flight (cp.async into a second buffer) while this one is computed and stored;
 *   2. ONE THREAD PER ROW: the norm in the reference's own order (sum of squares in index
 *      order, (s*rho)*(1+w)), the rotation and the profile's roundings, in place in shared
 *      memory, read and written as 16-byte chunks (row pitch = 4 words mod 32: conflict-free);
 *      fp8 rows get their scale (amax over the row), fp8 K of the fp32 k stages its codes;
 *   3. coalesced write-back of normed rows; cache writes with 16-byte stores:
 *      K (token-major SHUFFLE [.., Dh/x, P, x]): lanes over consecutive tokens of one
 *        (head, x-dim chunk): a warp writes 32 consecutive 16-byte chunks;
 *      V ([.., P/x, Dh, x]: x tokens of one dim per 16 bytes): lanes over dims of one group
 *        of x slot-consecutive tokens (groups listed by warp 0 with a ballot; a group cut by
 *        the tile edge, a padding token or a jump in the slots is written element-wise);
 *      index keys ([slot, Di]): lanes over the row.
 *   bf16 stores and e4m3 codes use the sm_80+/sm_89+ conversion instructions where they give
 *   ref's bits (RNE; NaN inputs take the software path's code).
 * Why one thread per row: a warp reduction sums in a different order than ref and so differs
 *   in the last bit now and then; a serial sum per thread keeps every operation of the
 *   reference (__fmul_rn/__fadd_rn: no FMA contraction, __fdiv_rn/__fsqrt_rn: IEEE), so q, k,
 *   the cache bytes and the scales are bit-identical to ref.
 * inv[i] is computed on the host exactly as ref's m3_rope_inv_freq (p->rope_inv) and passed
 *   by value (<= 128 entries). Device cos/sin (double) may differ from glibc's in the last
 *   double ulp; after the rounding to fp32 that shows up about once in 2^28 values.
 * Rounding (p->qk_round): NONE fp32; PER_OP bf16 after the norm, after every product and
 *   after each sum (hf); ONCE one rounding of every dim at the end (atom; a bf16 store).
 *   Columns outside a part's heads are never touched (row pitches let the parts be slices
 *   of one packed qkv row).
 * Launch shape (the best of the variants measured on the H200, docs/gpu-log/rope.md): 256 threads
 *   (rows) per block, 128 for the bf16 K/V writer (no normed part, no fp8); the next tile
 *   prefetched except in passes with staged fp8 K; tiles sized for 110 KiB of shared memory
 *   per block with the prefetch (two buffers), 80 KiB without; passes too small for 4 blocks
 *   per SM get fewer tokens per tile; the cos/sin table from 256 tokens on. */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "gpu/kv_paged.h"
#include "gpu/mem16.h"
#include "ref/num/bf16.h"
#include "ref/num/fp8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(M3_HIP_AMD) && defined(__clang__)
#pragma clang fp contract(off) /* hipcc contracts by default; the rn intrinsics carry the rest */
#endif

#define ROPE_MAX_HALF 128 /* rot_dim <= 256 */
#define QKV_NSEG 5
#define QKV_LB 8                       /* 16-byte loads in flight per thread */
#define QKV_MAX_SHMEM (160 * 1024)     /* hard cap (fallback for large heads) */

typedef struct {
    float inv[ROPE_MAX_HALF];
} rope_inv_table;

/* Host: inv[i] = 1/theta^(2i/R) held in fp32, per m3_rope_inv (ref/profile.h); the same
 * evaluation as ref/rope.c m3_rope_inv_freq (gpu/ does not link ref/rope.c). The values of the
 * thread's last (rot_dim, theta, mode) are kept: a decode step's launch is bound by the host
 * (H200, session 14: its R / 2 pow() calls were ~1 us of a ~4.4 us call; docs/gpu-log/rope.md). */
static void rope_inv_freq(float *inv, int rot_dim, float theta, m3_rope_inv mode) {
    static thread_local struct {
        int rot, mode;
        uint32_t theta;
        float inv[ROPE_MAX_HALF];
    } c = {-1, -1, 0u, {0.0f}};
    if (c.rot != rot_dim || c.mode != (int)mode || c.theta != m3_f32_bits(theta)) {
        for (int i = 0; i < rot_dim / 2; i++) {
            if (mode == M3_ROPE_INV_F64) {
                c.inv[i] = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)rot_dim));
            } else { /* torch: fp32 exponent, fp32 power (pow in double, one rounding), fp32 1/x */
                float e = (float)(2 * i) / (float)rot_dim;
                float pw = (float)pow((double)theta, (double)e);
                c.inv[i] = 1.0f / pw;
            }
        }
        c.rot = rot_dim, c.mode = (int)mode, c.theta = m3_f32_bits(theta);
    }
    memcpy(inv, c.inv, (size_t)(rot_dim / 2) * sizeof(float));
}

/* What a segment's rows are and where they go. */
enum { SEG_NONE = 0, SEG_K = 1, SEG_V = 2, SEG_IDX = 3 };
typedef struct {
    void *x;     /* TS rows [T, nh*dim], pitch ld */
    const m3_bf16 *w; /* norm weight [dim]; NULL: no norm, no rope */
    int ld, nh, dim;
    int cache;   /* SEG_* */
    int tt;      /* tokens per block */
    int b0;      /* first block of the segment */
    bool stage;  /* fp8 K codes of the fp32 k staged in shared memory */
} qkv_seg;

typedef struct {
    qkv_seg seg[QKV_NSEG];
    int nseg, n_tok, nt;
    bool vec;    /* every segment's rows allow 16-byte global access */
    const int32_t *pos;
    const int64_t *slots;
    float eps;
    int half;    /* rot_dim / 2 (0: no rope) */
    bool angle_f64, cs_bf16;
    rope_inv_table inv;
    const float *cst; /* cos/sin table [T, 2 half] made by cs_table_k, or NULL: per tile */
    /* cache */
    int page, lpage; /* page (0 = plain rows), log2(page) */
    bool fp8, ifp8, hwcvt;
    float fp8_max;
    int kind, ovf, k_src;
    void *kc, *vc, *ic;
    float *ks, *vs;
    /* ref's paged storage outside the page-128 / 16 layouts (m3_gpu_kv_cache.paged): K / V
     * element by element through gpu/kv_paged.h; slots from the block table (bt) and pos, the
     * index cache at rows irow0 + t */
    bool geo;
    m3_kv_geom geom;
    m3_kv_view view;
    const int32_t *bt;
    int bt_block;
    int64_t irow0;
    const int32_t *ibt; /* the paged index cache: index rows slot(pos) through ibt */
    int ibt_block;
    /* grid */
    int nblk;    /* tiles */
    int buf;     /* bytes of one input buffer */
    int common;  /* offset of the common region */
    bool pipe;   /* prefetch the next tile (cp.async) */
} qkv_args;

/* Shared-memory layout of one tile (host and device agree through this function): a buffer
 * of inputs (slots, positions, rows; two of them when the next tile is prefetched), then a
 * common region (V groups, 1 + w, cos/sin, fp8 scales, staged fp8 K codes). */
typedef struct {
    int slot, pos, cs, rows, buf;          /* in the buffer; its size */
    int lead, w, scl, stage, com;          /* in the common region; its size */
    int pitch, cp, spitch;                 /* row / table / stage pitches */
} qkv_lay;
static __host__ __device__ __forceinline__ int r16(int b) { return (b + 15) & ~15; }
static __host__ __device__ __forceinline__ qkv_lay qkv_layout(int tt, int nh, int dim, int es,
                                                              int half, bool normed, bool stage,
                                                              bool fast) {
    qkv_lay l;
    const int rows = tt * nh;
    l.pitch = r16(dim * es) + 16;               /* = 4 words mod 32 when dim*es % 128 == 0 */
    l.cp = fast ? 2 * half + 4 : 2 * half + 1;  /* cos/sin table pitch, floats */
    l.spitch = dim + 16;                        /* staged fp8 codes, bytes */
    l.slot = 0;
    l.pos = l.slot + r16(8 * tt);
    l.cs = l.pos + r16(4 * tt);
    l.rows = l.cs + (normed && half > 0 ? r16(4 * tt * l.cp) : 0);
    l.buf = l.rows + rows * l.pitch;
    l.lead = 0;
    l.w = l.lead + r16(4 * tt);
    l.scl = l.w + (normed ? r16(4 * dim) : 0);
    l.stage = l.scl + r16(4 * rows);
    l.com = l.stage + (stage ? r16(rows * l.spitch) : 0);
    return l;
}

/* ---- static device helpers ------------------------------------------------------------- */
static __device__ __forceinline__ float ldf(const float *p, int i) { return p[i]; }
static __device__ __forceinline__ float ldf(const m3_bf16 *p, int i) {
    return m3_bf16_to_f32(p[i]);
}
static __device__ __forceinline__ float rnd(bool on, float x) {
    return on ? m3_round_bf16(x) : x;
}
/* ref/kvcache.c amax_of: |x| maximum, a NaN poisons it (and stays) */
static __device__ __forceinline__ float amax_step(float a, float x) {
    /* a >= 0: |x| is x's bits & 0x7FFFFFFF, and non-negative floats (NaN above inf) order as
     * their bits. A NaN's payload may differ from ref's last NaN, but the scale's division
     * returns the canonical NaN for any. */
    return m3_bits_f32(max(m3_f32_bits(a), m3_f32_bits(x) & 0x7FFFFFFFu));
}
static __device__ __forceinline__ float fp8_scale(float amax, float fp8_max) {
    return amax == 0.0f ? 1.0f : __fdiv_rn(amax, fp8_max);
}
/* the software conversion out of line: the kernel inlines cvt8x2 in many places, and the
 * inlined m3_f32_to_fp8 (never run when hw) would bloat the hot loops */
static __device__ __noinline__ uint32_t cvt8x2_sw(float v0, float v1, int kind, int ovf) {
    return (uint32_t)m3_f32_to_fp8(v0, (m3_fp8_kind)kind, (m3_fp8_overflow)ovf) |
           ((uint32_t)m3_f32_to_fp8(v1, (m3_fp8_kind)kind, (m3_fp8_overflow)ovf) << 8);
}
/* Two fp8 codes (lo = v0, hi = v1) of m3_f32_to_fp8(v, kind, ovf). hw: the sm_89+ instruction
 * (e4m3fn, satfinite = saturate, RNE); a NaN gets ref's code (sign | 0x7F). */
static __device__ __forceinline__ uint32_t cvt8x2(float v0, float v1, int kind, int ovf, bool hw) {
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if (hw) {
        unsigned short r;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(v1), "f"(v0));
        uint32_t c = r;
        if (v0 != v0) c = (c & 0xFF00u) | ((m3_f32_bits(v0) >> 24) & 0x80u) | 0x7Fu;
        if (v1 != v1) c = (c & 0x00FFu) | ((((m3_f32_bits(v1) >> 24) & 0x80u) | 0x7Fu) << 8);
        return c;
    }
#else
    (void)hw;
#endif
    return cvt8x2_sw(v0, v1, kind, ovf);
}

/* 16 fp8 codes of v[16] / s (an fp32 division each, as ref) */
static __device__ __forceinline__ uint4 q16(const float *v, float s, const qkv_args &a) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t lo = cvt8x2(__fdiv_rn(v[4 * k], s), __fdiv_rn(v[4 * k + 1], s), a.kind, a.ovf, a.hwcvt);
        const uint32_t hi = cvt8x2(__fdiv_rn(v[4 * k + 2], s), __fdiv_rn(v[4 * k + 3], s), a.kind, a.ovf, a.hwcvt);
        w[k] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* bf16 RNE of two floats packed (lo in the low half), bit-identical to m3_f32_to_bf16: the
 * sm_80+ instruction rounds finite values and infinities the same way; a NaN takes ref's
 * code (sign, payload, quiet bit) through the software path. */
static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    if (lo != lo || hi != hi)
        r = (uint32_t)m3_f32_to_bf16(lo) | ((uint32_t)m3_f32_to_bf16(hi) << 16);
    return r;
#else
    return (uint32_t)m3_f32_to_bf16(lo) | ((uint32_t)m3_f32_to_bf16(hi) << 16);
#endif
}
/* VN floats into a 16-byte chunk of TS (bf16: RNE, as m3_vec's store) */
static __device__ __forceinline__ void st_chunk(m3_bf16 *p, int i, const float *v) {
    *reinterpret_cast<uint4 *>(p + i) = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]),
                                                   pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
}
static __device__ __forceinline__ void st_chunk(float *p, int i, const float *v) {
    *reinterpret_cast<float4 *>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
}

/* floor(i / n) for 0 <= i < 2^18 from rn = 1.0f / n: the fp32 error of (i + 0.5) * rn is below
 * (i / n) * 2^-22 < 1 / (16 n), inside the 0.5 / n margin to the next integer (4 instructions
 * against ~20 of an integer division by a runtime divisor) */
static __device__ __forceinline__ int qdiv(int i, float rn) {
    return (int)(((float)i + 0.5f) * rn);
}


/* fp8 scale offset of slot s, head h (spec §4.2/§4.3: [.., Hkv, P]) */
static __device__ __forceinline__ int64_t s_off(const qkv_args &a, int64_t slot, int Hkv, int h) {
    if (a.geo) return m3_dkv_off_scale(a.geom, a.view, slot, h);
    const int64_t b = slot >> a.lpage, t = slot & (a.page - 1);
    return (b * Hkv + h) * a.page + t;
}

/* ---- one row: norm + rope, in place -------------------------------------------------------
 * mode 0: only the amax of the results (fp32 or stored, per amax_f32); mode 1: store the
 * results (and stage fp8 codes when stage != NULL, of the fp32 or stored value per val_f32).
 * FAST: dim 128, half 32 (compile-time), 16-byte chunk access; else element by element. */
template <typename TS, int QR, bool FAST>
static __device__ __forceinline__ float norm_rope_row(TS *e, int dim_rt, int half_rt, float rho,
                                                      const float *w1, const float *c,
                                                      const float *sn, int mode, float sc,
                                                      uint8_t *stage, bool amax_f32,
                                                      bool val_f32, const qkv_args &a) {
    constexpr bool per_op = QR == M3_QK_ROUND_PER_OP;
    /* the stored value: a bf16 store rounds; fp32 storage rounds only under ONCE */
    constexpr bool st_rnd = QR == M3_QK_ROUND_ONCE || sizeof(TS) == 2;
    float am = 0.0f;
    if (FAST) {
        typedef m3_vec<TS> V;
        constexpr int VN = V::N, DIM = 128, HALF = 32;
        /* pairs of chunks (j, j + HALF/VN) */
#pragma unroll 1
        for (int j = 0; j < HALF / VN; j++) {
            const int d1 = j * VN, d2 = d1 + HALF;
            float x1[VN], x2[VN], o1[VN], o2[VN];
            V::load(e, d1, x1);
            V::load(e, d2, x2);
#pragma unroll
            for (int k = 0; k < VN; k++) {
                const float n1 = rnd(per_op, __fmul_rn(__fmul_rn(x1[k], rho), w1[d1 + k]));
                const float n2 = rnd(per_op, __fmul_rn(__fmul_rn(x2[k], rho), w1[d2 + k]));
                /* torch: x*cos + rotate_half(x)*sin, rotate_half(x) = [-x2, x1] */
                const float a1 = rnd(per_op, __fmul_rn(n1, c[d1 + k]));
                const float b1 = rnd(per_op, __fmul_rn(-n2, sn[d1 + k]));
                const float a2 = rnd(per_op, __fmul_rn(n2, c[d1 + k]));
                const float b2 = rnd(per_op, __fmul_rn(n1, sn[d1 + k]));
                o1[k] = rnd(per_op, __fadd_rn(a1, b1));
                o2[k] = rnd(per_op, __fadd_rn(a2, b2));
            }
            if (mode == 0) {
#pragma unroll
                for (int k = 0; k < VN; k++) {
                    am = amax_step(am, amax_f32 ? o1[k] : rnd(st_rnd, o1[k]));
                    am = amax_step(am, amax_f32 ? o2[k] : rnd(st_rnd, o2[k]));
                }
            } else {
                if (stage) {
#pragma unroll
                    for (int k = 0; k < VN; k += 2) {
                        const uint32_t c1 = cvt8x2(__fdiv_rn(val_f32 ? o1[k] : rnd(true, o1[k]), sc),
                                                   __fdiv_rn(val_f32 ? o1[k + 1] : rnd(true, o1[k + 1]), sc),
                                                   a.kind, a.ovf, a.hwcvt);
                        const uint32_t c2 = cvt8x2(__fdiv_rn(val_f32 ? o2[k] : rnd(true, o2[k]), sc),
                                                   __fdiv_rn(val_f32 ? o2[k + 1] : rnd(true, o2[k + 1]), sc),
                                                   a.kind, a.ovf, a.hwcvt);
                        *reinterpret_cast<uint16_t *>(stage + d1 + k) = (uint16_t)c1;
                        *reinterpret_cast<uint16_t *>(stage + d2 + k) = (uint16_t)c2;
                    }
                }
                if (sizeof(TS) != 2) {
#pragma unroll
                    for (int k = 0; k < VN; k++) o1[k] = rnd(st_rnd, o1[k]), o2[k] = rnd(st_rnd, o2[k]);
                }
                st_chunk(e, d1, o1); /* a bf16 store rounds o itself: RNE(RNE(o)) = RNE(o) */
                st_chunk(e, d2, o2);
            }
        }
        /* pass-through dims [R, dim): normed only */
#pragma unroll 1
        for (int d0 = 2 * HALF; d0 < DIM; d0 += VN) {
            float x[VN];
            V::load(e, d0, x);
#pragma unroll
            for (int k = 0; k < VN; k++) x[k] = rnd(per_op, __fmul_rn(__fmul_rn(x[k], rho), w1[d0 + k]));
            if (mode == 0) {
#pragma unroll
                for (int k = 0; k < VN; k++) am = amax_step(am, amax_f32 ? x[k] : rnd(st_rnd, x[k]));
            } else {
                if (stage) {
#pragma unroll
                    for (int k = 0; k < VN; k += 2) {
                        const uint32_t c1 = cvt8x2(__fdiv_rn(val_f32 ? x[k] : rnd(true, x[k]), sc),
                                                   __fdiv_rn(val_f32 ? x[k + 1] : rnd(true, x[k + 1]), sc),
                                                   a.kind, a.ovf, a.hwcvt);
                        *reinterpret_cast<uint16_t *>(stage + d0 + k) = (uint16_t)c1;
                    }
                }
                if (sizeof(TS) != 2) {
#pragma unroll
                    for (int k = 0; k < VN; k++) x[k] = rnd(st_rnd, x[k]);
                }
                st_chunk(e, d0, x);
            }
        }
        return am;
    }
    /* generic: element by element (odd head dims, rotary widths, pitches) */
    const int dim = dim_rt, half = half_rt;
    auto emit = [&](int d, float o) {
        if (mode == 0) {
            am = amax_step(am, amax_f32 ? o : rnd(st_rnd, o));
        } else {
            if (stage)
                stage[d] = (uint8_t)cvt8x2(__fdiv_rn(val_f32 ? o : rnd(true, o), sc), 0.0f, a.kind,
                                           a.ovf, a.hwcvt);
            if (sizeof(TS) == 2) e[d] = (TS)m3_f32_to_bf16(o);
            else e[d] = (TS)rnd(st_rnd, o);
        }
    };
    for (int i = 0; i < half; i++) {
        const float n1 = rnd(per_op, __fmul_rn(__fmul_rn(ldf(e, i), rho), w1[i]));
        const float n2 = rnd(per_op, __fmul_rn(__fmul_rn(ldf(e, i + half), rho), w1[i + half]));
        const float a1 = rnd(per_op, __fmul_rn(n1, c[i]));
        const float b1 = rnd(per_op, __fmul_rn(-n2, sn[i]));
        const float a2 = rnd(per_op, __fmul_rn(n2, c[i]));
        const float b2 = rnd(per_op, __fmul_rn(n1, sn[i]));
        emit(i, rnd(per_op, __fadd_rn(a1, b1)));
        emit(i + half, rnd(per_op, __fadd_rn(a2, b2)));
    }
    for (int d = 2 * half; d < dim; d++)
        emit(d, rnd(per_op, __fmul_rn(__fmul_rn(ldf(e, d), rho), w1[d])));
    return am;
}

/* amax over a stored row of dim elements (16-byte chunks when FAST) */
template <typename TS, bool FAST>
static __device__ __forceinline__ float row_amax(const TS *e, int dim) {
    float am = 0.0f;
    if (FAST && sizeof(TS) == 2) {
        /* |x| of a bf16 is its bits & 0x7FFF, and for non-negative floats (inf and NaN
         * included: NaN bits are above inf's) the float order is the integer order: an
         * integer max over both halves of each word. A NaN gives a NaN amax (any payload:
         * the scale's division returns the canonical NaN either way, as amax_step's NaN). */
        uint32_t lo = 0, hi = 0;
#pragma unroll 4
        for (int d0 = 0; d0 < dim; d0 += 8) {
            const uint4 u = *reinterpret_cast<const uint4 *>(e + d0);
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                lo = max(lo, w[k] & 0x7FFFu);
                hi = max(hi, w[k] & 0x7FFF0000u);
            }
        }
        lo = max(lo << 16, hi);
        am = m3_bits_f32(lo);
    } else {
        for (int d = 0; d < dim; d++) am = amax_step(am, ldf(e, d));
    }
    return am;
}

/* ---- kernel ---------------------------------------------------------------------------- */
/* cp.async (NVIDIA sm_80+): the next tile's rows stream into the other buffer while this one
 * is computed. Elsewhere QKV_PIPE is 0 and every copy is a plain load + store. */
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define QKV_PIPE 1
#else
#define QKV_PIPE 0
#endif
template <int N>
static __device__ __forceinline__ void cp_async(void *dst, const void *src) {
#if QKV_PIPE
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(d), "l"(src), "n"(N) : "memory");
#else
    if (N == 16) *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
    else if (N == 8) *reinterpret_cast<uint2 *>(dst) = *reinterpret_cast<const uint2 *>(src);
    else *reinterpret_cast<uint32_t *>(dst) = *reinterpret_cast<const uint32_t *>(src);
#endif
}
static __device__ __forceinline__ void cp_commit() {
#if QKV_PIPE
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
static __device__ __forceinline__ void cp_wait1() {
#if QKV_PIPE
    asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}

template <typename TS, int QR, bool FAST>
static __global__ void __launch_bounds__(256) qkv_k(qkv_args a) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int s_nlead;
    constexpr int VN = 16 / (int)sizeof(TS);
    const int tid = (int)threadIdx.x, nth = (int)blockDim.x;
    const int x = a.fp8 ? 16 : 8, lx = a.fp8 ? 4 : 3; /* K/V elements per 16 bytes */
    const bool pipe = QKV_PIPE && a.pipe;

    /* tile k: its segment, tokens [t0, t0 + tbk) */
    auto seg_of = [&](int k) {
        int s = 0;
        while (s + 1 < a.nseg && k >= a.seg[s + 1].b0) s++;
        return s;
    };
    /* 1. tile k's slots, positions and rows into buffer buf (token-major reads, head-major
     * rows); pipe: cp.async, completed by the caller's wait */
    auto issue = [&](int k, unsigned char *buf) {
        const qkv_seg &g = a.seg[seg_of(k)];
        const int nh = g.nh, dim = FAST ? 128 : g.dim, tt = g.tt;
        const int t0 = (k - g.b0) * tt, tbk = a.n_tok - t0 < tt ? a.n_tok - t0 : tt;
        const qkv_lay L = qkv_layout(tt, nh, dim, (int)sizeof(TS), a.half, g.w != NULL, g.stage, FAST);
        int64_t *sslot = reinterpret_cast<int64_t *>(buf + L.slot);
        int32_t *spos = reinterpret_cast<int32_t *>(buf + L.pos);
        unsigned char *rows = buf + L.rows;
        const bool cache = g.cache != SEG_NONE, roped = g.w != NULL && a.half > 0;
        for (int i = tid; i < tbk; i += nth) {
            if (cache && g.cache == SEG_IDX && a.ibt) { /* paged index cache (§4.5) */
                sslot[i] = m3_dkv_slot(a.ibt, a.ibt_block, a.pos[t0 + i]);
            } else if (cache && (a.bt || !a.slots)) { /* slot(p) through the block table (§4.1);
                                                 * index rows irow0 + t */
                sslot[i] = g.cache == SEG_IDX ? a.irow0 + t0 + i : m3_dkv_slot(a.bt, a.bt_block, a.pos[t0 + i]);
            } else if (cache) {
                if (pipe) cp_async<8>(sslot + i, a.slots + t0 + i);
                else sslot[i] = a.slots[t0 + i];
            }
            if (roped && !a.cst) {
                if (pipe) cp_async<4>(spos + i, a.pos + t0 + i);
                else spos[i] = a.pos[t0 + i];
            }
        }
        if (roped && a.cst) { /* the tokens' cos/sin rows of the table */
            float *cs = reinterpret_cast<float *>(buf + L.cs);
            const int w = FAST ? 64 : 2 * a.half;
            if (FAST) {
                const int n = tbk * (w / 4);
                for (int i = tid; i < n; i += nth) {
                    const int tl = i / (w / 4), q = i - tl * (w / 4);
                    if (pipe) cp_async<16>(cs + tl * L.cp + 4 * q, a.cst + (int64_t)(t0 + tl) * w + 4 * q);
                    else *reinterpret_cast<float4 *>(cs + tl * L.cp + 4 * q) =
                        *reinterpret_cast<const float4 *>(a.cst + (int64_t)(t0 + tl) * w + 4 * q);
                }
            } else {
                for (int i = tid; i < tbk * w; i += nth) {
                    const int tl = i / w, q = i - tl * w;
                    cs[tl * L.cp + q] = a.cst[(int64_t)(t0 + tl) * w + q];
                }
            }
        }
        const TS *xg = (const TS *)g.x;
        if (a.vec) {
            const int nch = dim / VN, per_tok = nh * nch, n = tbk * per_tok;
            const float r_pt = 1.0f / (float)per_tok, r_nch = 1.0f / (float)nch;
            if (pipe) {
                for (int i = tid; i < n; i += nth) {
                    const int tl = qdiv(i, r_pt), rem = i - tl * per_tok, h = qdiv(rem, r_nch), c = rem - h * nch;
                    cp_async<16>(rows + (size_t)(h * tbk + tl) * L.pitch + c * 16,
                                 xg + (int64_t)(t0 + tl) * g.ld + (int64_t)rem * VN);
                }
                return;
            }
            for (int i0 = tid; i0 < n; i0 += nth * QKV_LB) {
                uint4 u[QKV_LB];
#pragma unroll
                for (int j = 0; j < QKV_LB; j++) {
                    const int i = i0 + j * nth;
                    if (i < n) {
                        const int tl = qdiv(i, r_pt), rem = i - tl * per_tok;
                        u[j] = *reinterpret_cast<const uint4 *>(xg + (int64_t)(t0 + tl) * g.ld + (int64_t)rem * VN);
                    }
                }
#pragma unroll
                for (int j = 0; j < QKV_LB; j++) {
                    const int i = i0 + j * nth;
                    if (i < n) {
                        const int tl = qdiv(i, r_pt), rem = i - tl * per_tok, h = qdiv(rem, r_nch), c = rem - h * nch;
                        *reinterpret_cast<uint4 *>(rows + (size_t)(h * tbk + tl) * L.pitch + c * 16) = u[j];
                    }
                }
            }
        } else {
            const int per_tok = nh * dim, n = tbk * per_tok;
            for (int i = tid; i < n; i += nth) {
                const int tl = i / per_tok, rem = i - tl * per_tok, h = rem / dim, d = rem - h * dim;
                reinterpret_cast<TS *>(rows + (size_t)(h * tbk + tl) * L.pitch)[d] =
                    xg[(int64_t)(t0 + tl) * g.ld + rem];
            }
        }
    };

    /* 2-3. tile k, whose inputs are in buf */
    auto process = [&](int k, unsigned char *buf) {
        const qkv_seg g = a.seg[seg_of(k)];
        const int nh = g.nh, dim = FAST ? 128 : g.dim, tt = g.tt;
        const int t0 = (k - g.b0) * tt, tbk = a.n_tok - t0 < tt ? a.n_tok - t0 : tt;
        const int nrow = tbk * nh;
        const bool normed = g.w != NULL;
        const int half = normed ? a.half : 0;
        const qkv_lay L = qkv_layout(tt, nh, dim, (int)sizeof(TS), a.half, normed, g.stage, FAST);
        const int64_t *sslot = reinterpret_cast<const int64_t *>(buf + L.slot);
        const int32_t *spos = reinterpret_cast<const int32_t *>(buf + L.pos);
        unsigned char *rows = buf + L.rows;
        unsigned char *com = smem + a.common;
        int32_t *slead = reinterpret_cast<int32_t *>(com + L.lead);
        float *onepw = reinterpret_cast<float *>(com + L.w);
        float *cs = reinterpret_cast<float *>(buf + L.cs);
        float *scl = reinterpret_cast<float *>(com + L.scl);
        uint8_t *stg = com + L.stage;
        const bool cache = g.cache != SEG_NONE;

        /* (1 + w); cos on [0, half), sin on [half, 2 half) of each token (the double
         * evaluations are spread over all threads) */
        if (normed)
            for (int d = tid; d < dim; d += nth) onepw[d] = __fadd_rn(1.0f, m3_bf16_to_f32(g.w[d]));
        const float r_2h = half > 0 ? 1.0f / (float)(2 * half) : 0.0f, r_tbk = 1.0f / (float)tbk;
        if (half > 0 && !a.cst)
            for (int j = tid; j < tbk * 2 * half; j += nth) {
                const int tl = qdiv(j, r_2h), kk = j - tl * 2 * half;
                const int i = kk < half ? kk : kk - half;
                const int32_t p = spos[tl];
                const double ang = a.angle_f64 ? (double)p * (double)a.inv.inv[i]
                                               : (double)__fmul_rn((float)p, a.inv.inv[i]);
                cs[tl * L.cp + kk] = rnd(a.cs_bf16, (float)(kk < half ? cos(ang) : sin(ang)));
            }
        __syncthreads();

        /* 2. one thread per row */
        for (int r = tid; r < nrow; r += nth) {
            const int h = qdiv(r, r_tbk), tl = r - h * tbk;
            TS *e = reinterpret_cast<TS *>(rows + (size_t)r * L.pitch);
            const int64_t slot = sslot[tl];
            const bool wr = cache && slot >= 0;
            if (!normed) { /* raw K or V: only the fp8 scale */
                if (a.fp8 && wr && a.page != 0 && (g.cache == SEG_K || g.cache == SEG_V)) {
                    const float sc = fp8_scale(row_amax<TS, FAST>(e, dim), a.fp8_max);
                    scl[r] = sc;
                    (g.cache == SEG_K ? a.ks : a.vs)[s_off(a, slot, nh, h)] = sc;
                }
                continue;
            }
            float ss = 0.0f;
            if (FAST) {
#pragma unroll 2
                for (int d0 = 0; d0 < dim; d0 += VN) {
                    float v[VN];
                    m3_vec<TS>::load(e, d0, v);
#pragma unroll
                    for (int kk = 0; kk < VN; kk++) ss = __fadd_rn(ss, __fmul_rn(v[kk], v[kk]));
                }
            } else {
                for (int d = 0; d < dim; d++) {
                    const float v = ldf(e, d);
                    ss = __fadd_rn(ss, __fmul_rn(v, v));
                }
            }
            const float mu = __fdiv_rn(ss, (float)dim);
            const float rho = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mu, a.eps)));
            const float *c = cs + tl * L.cp, *sn = c + half;
            const bool kq = g.cache == SEG_K && a.fp8 && wr;
            if (kq && g.stage) { /* fp8 K of the fp32 k: amax pass, then results + codes */
                const bool val_f32 = a.k_src == M3_GPU_KQ_F32;
                const float am = norm_rope_row<TS, QR, FAST>(e, dim, half, rho, onepw, c, sn, 0, 1.0f,
                                                             NULL, true, val_f32, a);
                const float sc = fp8_scale(am, a.fp8_max);
                scl[r] = sc;
                a.ks[s_off(a, slot, nh, h)] = sc;
                norm_rope_row<TS, QR, FAST>(e, dim, half, rho, onepw, c, sn, 1, sc,
                                            stg + (size_t)r * L.spitch, true, val_f32, a);
            } else {
                norm_rope_row<TS, QR, FAST>(e, dim, half, rho, onepw, c, sn, 1, 1.0f, NULL, false,
                                            false, a);
                if (kq) { /* fp8 K of the stored k */
                    const float sc = fp8_scale(row_amax<TS, FAST>(e, dim), a.fp8_max);
                    scl[r] = sc;
                    a.ks[s_off(a, slot, nh, h)] = sc;
                }
            }
        }
        /* warp 0: the V groups: runs of slot-consecutive tokens inside one x-aligned window */
        if (g.cache == SEG_V && a.page != 0 && !a.geo && tid < M3_WARP) {
            int run = 0;
            for (int base = 0; base < tbk; base += M3_WARP) {
                const int tl = base + tid;
                bool lead = false;
                int len = 0;
                if (tl < tbk) {
                    const int64_t sl = sslot[tl];
                    lead = sl >= 0 && (tl == 0 || (sl & (x - 1)) == 0 || sslot[tl - 1] != sl - 1);
                    if (lead) {
                        len = 1;
                        while (len < x && tl + len < tbk && ((sl + len) & (x - 1)) != 0 &&
                               sslot[tl + len] == sl + len)
                            len++;
                    }
                }
                const uint64_t m = m3_ballot(lead);
                const int idx = run + __popcll(m & ((1ull << tid) - 1ull));
                if (lead) slead[idx] = tl | (len << 16);
                run += __popcll(m);
            }
            if (tid == 0) s_nlead = run;
        }
        __syncthreads();

        /* 3a. normed rows back in place (token-major, coalesced) */
        if (normed) {
            TS *xg = (TS *)g.x;
            if (a.vec) {
                const int nch = dim / VN, per_tok = nh * nch, n = tbk * per_tok;
                const float r_pt = 1.0f / (float)per_tok, r_nch = 1.0f / (float)nch;
                for (int i = tid; i < n; i += nth) {
                    const int tl = qdiv(i, r_pt), rem = i - tl * per_tok, h = qdiv(rem, r_nch), c = rem - h * nch;
                    *reinterpret_cast<uint4 *>(xg + (int64_t)(t0 + tl) * g.ld + (int64_t)rem * VN) =
                        *reinterpret_cast<const uint4 *>(rows + (size_t)(h * tbk + tl) * L.pitch + c * 16);
                }
            } else {
                const int per_tok = nh * dim, n = tbk * per_tok;
                for (int i = tid; i < n; i += nth) {
                    const int tl = i / per_tok, rem = i - tl * per_tok, h = rem / dim, d = rem - h * dim;
                    xg[(int64_t)(t0 + tl) * g.ld + rem] =
                        reinterpret_cast<const TS *>(rows + (size_t)(h * tbk + tl) * L.pitch)[d];
                }
            }
        }
        if (!cache || sizeof(TS) != 2) return;

        /* 3b. cache writes (bf16 rows only) */
        if (g.cache == SEG_IDX && dim % 8 != 0) { /* [slot, Di] element by element */
            for (int i = tid; i < tbk * dim; i += nth) {
                const int tl = i / dim, d = i - tl * dim;
                const int64_t slot = sslot[tl];
                if (slot < 0) continue;
                const m3_bf16 bv = reinterpret_cast<const m3_bf16 *>(rows + (size_t)tl * L.pitch)[d];
                if (!a.ifp8) ((m3_bf16 *)a.ic)[slot * dim + d] = bv;
                else ((uint8_t *)a.ic)[slot * dim + d] =
                    (uint8_t)cvt8x2(m3_bf16_to_f32(bv), 0.0f, a.kind, a.ovf, a.hwcvt);
            }
            return;
        }
        if (g.cache == SEG_IDX) { /* [slot, Di]: 8 dims a chunk (16 bytes bf16, 8 fp8) */
            const int nch = dim / 8, n = tbk * nch;
            for (int i = tid; i < n; i += nth) {
                const int tl = i / nch, c = i - tl * nch;
                const int64_t slot = sslot[tl];
                if (slot < 0) continue;
                const uint4 u = *reinterpret_cast<const uint4 *>(rows + (size_t)tl * L.pitch + c * 16);
                const int64_t off = slot * dim + (int64_t)c * 8;
                if (!a.ifp8) {
                    *reinterpret_cast<uint4 *>((m3_bf16 *)a.ic + off) = u;
                } else { /* §4.8: cvt(f32(bf16 value)), unit scale */
                    const uint32_t w4[4] = {u.x, u.y, u.z, u.w};
                    uint32_t b[2];
#pragma unroll
                    for (int kk = 0; kk < 2; kk++) {
                        const uint32_t lo = cvt8x2(m3_bits_f32(w4[2 * kk] << 16), m3_bits_f32(w4[2 * kk] & 0xFFFF0000u),
                                                   a.kind, a.ovf, a.hwcvt);
                        const uint32_t hi = cvt8x2(m3_bits_f32(w4[2 * kk + 1] << 16),
                                                   m3_bits_f32(w4[2 * kk + 1] & 0xFFFF0000u), a.kind, a.ovf, a.hwcvt);
                        b[kk] = lo | (hi << 16);
                    }
                    *reinterpret_cast<uint2 *>((uint8_t *)a.ic + off) = make_uint2(b[0], b[1]);
                }
            }
            return;
        }
        const int Hkv = nh, Dh = dim;
        if (a.geo) { /* any geometry: element by element, lanes over a row's dims */
            void *dst = g.cache == SEG_K ? a.kc : a.vc;
            for (int i = tid; i < nrow * Dh; i += nth) {
                const int r = i / Dh, d = i - r * Dh, h = r / tbk, tl = r - h * tbk;
                const int64_t slot = sslot[tl];
                if (slot < 0) continue;
                const int64_t off = g.cache == SEG_K ? m3_dkv_off_k(a.geom, a.view, slot, h, d)
                                                     : m3_dkv_off_v(a.geom, a.view, slot, h, d);
                const m3_bf16 bv = reinterpret_cast<const m3_bf16 *>(rows + (size_t)r * L.pitch)[d];
                if (!a.fp8) ((m3_bf16 *)dst)[off] = bv;
                else if (g.stage) ((uint8_t *)dst)[off] = stg[(size_t)r * L.spitch + d];
                else ((uint8_t *)dst)[off] = (uint8_t)cvt8x2(__fdiv_rn(m3_bf16_to_f32(bv), scl[r]), 0.0f,
                                                             a.kind, a.ovf, a.hwcvt);
            }
            return;
        }
        if (g.cache == SEG_K || a.page == 0) {
            /* K (and plain-row V): x dims = one 16-byte chunk; lanes over consecutive tokens */
            void *dst = g.cache == SEG_K ? a.kc : a.vc;
            const int nch = Dh >> lx, n = tbk * nch * Hkv;
            const float r_nch = 1.0f / (float)nch;
            for (int i = tid; i < n; i += nth) {
                const int hc = qdiv(i, r_tbk), tl = i - hc * tbk, h = qdiv(hc, r_nch), c = hc - h * nch;
                const int64_t slot = sslot[tl];
                if (slot < 0) continue;
                const int r = h * tbk + tl;
                const unsigned char *row = rows + (size_t)r * L.pitch;
                uint4 u;
                if (!a.fp8) {
                    u = *reinterpret_cast<const uint4 *>(row + c * 16);
                } else if (g.stage) {
                    u = *reinterpret_cast<const uint4 *>(stg + (size_t)r * L.spitch + c * 16);
                } else {
                    float v[16];
                    m3_vec<m3_bf16>::load(reinterpret_cast<const m3_bf16 *>(row), c * 16, v);
                    m3_vec<m3_bf16>::load(reinterpret_cast<const m3_bf16 *>(row), c * 16 + 8, v + 8);
                    u = q16(v, scl[r], a);
                }
                int64_t off;
                if (a.page == 0) {
                    off = (slot * Hkv + h) * Dh + c * x;
                } else {
                    const int64_t b = slot >> a.lpage;
                    const int t = (int)(slot & (a.page - 1));
                    off = ((b * Hkv + h) * nch + c) * ((int64_t)a.page << lx) + (t << lx);
                }
                if (a.fp8) *reinterpret_cast<uint4 *>((uint8_t *)dst + off) = u;
                else *reinterpret_cast<uint4 *>((m3_bf16 *)dst + off) = u;
            }
            return;
        }
        /* V SHUFFLE: a group of x slot-consecutive tokens of one dim = 16 bytes; lanes over dims */
        const int nl = s_nlead, n = nl * Hkv * Dh;
        const float r_dh = 1.0f / (float)Dh, r_nl = 1.0f / (float)(nl > 0 ? nl : 1);
        for (int i = tid; i < n; i += nth) {
            const int gh = qdiv(i, r_dh), d = i - gh * Dh, h = qdiv(gh, r_nl), gi = gh - h * nl;
            const int ld = slead[gi], tl = ld & 0xFFFF, len = ld >> 16;
            const int64_t slot = sslot[tl];
            const int r0 = h * tbk + tl;
            const int64_t b = slot >> a.lpage;
            const int t = (int)(slot & (a.page - 1));
            const int64_t off = ((b * Hkv + h) * (a.page >> lx) + (t >> lx)) * ((int64_t)Dh << lx) +
                                ((int64_t)d << lx) + (t & (x - 1));
            const m3_bf16 *col = reinterpret_cast<const m3_bf16 *>(rows + (size_t)r0 * L.pitch) + d;
            const int cstep = L.pitch / 2; /* elements from one row to the next */
            if (len == x) {
                if (a.fp8) {
                    uint32_t w[4];
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) {
                        const int j = 4 * kk;
                        const uint32_t lo = cvt8x2(__fdiv_rn(m3_bf16_to_f32(col[j * cstep]), scl[r0 + j]),
                                                   __fdiv_rn(m3_bf16_to_f32(col[(j + 1) * cstep]), scl[r0 + j + 1]),
                                                   a.kind, a.ovf, a.hwcvt);
                        const uint32_t hi = cvt8x2(__fdiv_rn(m3_bf16_to_f32(col[(j + 2) * cstep]), scl[r0 + j + 2]),
                                                   __fdiv_rn(m3_bf16_to_f32(col[(j + 3) * cstep]), scl[r0 + j + 3]),
                                                   a.kind, a.ovf, a.hwcvt);
                        w[kk] = lo | (hi << 16);
                    }
                    *reinterpret_cast<uint4 *>((uint8_t *)a.vc + off) = make_uint4(w[0], w[1], w[2], w[3]);
                } else {
                    uint32_t w[4];
#pragma unroll
                    for (int kk = 0; kk < 4; kk++)
                        w[kk] = (uint32_t)col[2 * kk * cstep] | ((uint32_t)col[(2 * kk + 1) * cstep] << 16);
                    *reinterpret_cast<uint4 *>((m3_bf16 *)a.vc + off) = make_uint4(w[0], w[1], w[2], w[3]);
                }
            } else { /* a cut group: element by element (offsets t % x = slot % x + j) */
                for (int j = 0; j < len; j++) {
                    const m3_bf16 bv = col[j * cstep];
                    if (a.fp8)
                        ((uint8_t *)a.vc)[off + j] = (uint8_t)cvt8x2(
                            __fdiv_rn(m3_bf16_to_f32(bv), scl[r0 + j]), 0.0f, a.kind, a.ovf, a.hwcvt);
                    else
                        ((m3_bf16 *)a.vc)[off + j] = bv;
                }
            }
        }
    };

    /* persistent blocks over the tiles; pipe: tile k + grid prefetched during tile k */
    int k = (int)blockIdx.x;
    if (k >= a.nblk) return;
    if (pipe) issue(k, smem), cp_commit();
    for (int it = 0; k < a.nblk; k += (int)gridDim.x, it++) {
        unsigned char *buf = smem + (pipe ? (size_t)(it & 1) * a.buf : 0);
        if (pipe) {
            const int kn = k + (int)gridDim.x;
            if (kn < a.nblk) issue(kn, smem + (size_t)((it + 1) & 1) * a.buf);
            cp_commit();
            cp_wait1(); /* all but the newest group: tile k has landed */
        } else {
            issue(k, buf);
        }
        __syncthreads();
        process(k, buf);
        __syncthreads(); /* buf is refilled by the prefetch two tiles later */
    }
}

/* Programmatic dependent launch (Hopper, session 7): a pass's launches after the first may
 * start while the one before it runs (m3_pdl_trigger / m3_pdl_wait, gpu/gpu_internal.h). The
 * host sets the launch attribute between a pass's own kernels, and (session 13) on the small
 * passes' one qw_norm_k launch, whose first statements let the next launch start and wait for
 * the launch before it, and (session 16) on the K / V writer launched alone (kw_enter). */

/* cos/sin rows of every token, [T, cos(half) | sin(half)]: the same evaluation as the
 * kernel's own (angle in fp32 or f64, cos/sin in double rounded to fp32, bf16 when asked),
 * once per token instead of once per part (q, k, index_q, index_k). One thread a (token, i):
 * cos and sin from one sincos (one argument reduction for both; the same bits as cos() and
 * sin(): session 7, tests/gpu_norm_rope.c; the table launch took ~6 us of a 50 us pass at
 * T = 4096 with a thread per value). */
static __global__ void cs_table_k(float *tab, const int32_t *pos, int n_tok, int half,
                                  rope_inv_table inv, bool angle_f64, bool cs_bf16) {
    m3_pdl_trigger();
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= (int64_t)n_tok * half) return;
    const int t = (int)(j / half), i = (int)(j - (int64_t)t * half);
    const int32_t p = pos[t];
    const double ang = angle_f64 ? (double)p * (double)inv.inv[i] : (double)__fmul_rn((float)p, inv.inv[i]);
    double sn, cn;
    sincos(ang, &sn, &cn);
    tab[(int64_t)t * 2 * half + i] = rnd(cs_bf16, (float)cn);
    tab[(int64_t)t * 2 * half + half + i] = rnd(cs_bf16, (float)sn);
}

/* ---- warp-streaming paths (bf16 rows, Dh 128, rotary half 32 or none) -------------------
 * Every warp works alone (no block barriers) and holds its rows in registers.
 * qw_norm_k: normed rows (q, index_q; K rows with the K cache write, fp8 with the row's
 *   scale from the amax of the stored or fp32 values per k_src, reduced over the row's lanes
 *   by shuffles: one pass; index_k rows with the index cache write), persistent warps with
 *   the next step's rows in flight while this one is computed. 4 lanes per row, lane j of a
 *   row holds the 16-byte chunks j, j+4, j+8, j+12 (dims 8j.., 32+8j.., 64+8j.., 96+8j..):
 *   a load instruction covers 64 contiguous bytes of each of its rows, and the rotation's
 *   pairs (d, d+32) sit in one lane. The sum of squares keeps ref's serial index order: a
 *   chain over the 16 chunks in order, the running sum passed to the chunk's owner lane by a
 *   shuffle (each step adds 8 products in order).
 * kvw_k: raw bf16 K / V rows into the page-128 / 16 SHUFFLE cache (or plain rows). K: 8
 *   lanes a row (chunks j and j+8), 4 consecutive tokens of one head a step: each store
 *   covers 64 contiguous bytes of one (head, chunk). V: one 8-token window of slot-aligned,
 *   slot-consecutive tokens of one head a step, staged in the warp's shared memory and
 *   written as 16-byte (8 tokens of one dim) chunks, lanes over dims (512 contiguous bytes a
 *   store); a window that is cut or not slot-consecutive is written element by element. One
 *   step a warp, a grid of all steps (the hardware's block order): a persistent version with
 *   the next step's chunks in flight measured slower (H200, session 5: 77% against 81%).
 * kvw8_k: raw K / V rows into an fp8 cache (stored-value scale: amax over the row, an
 *   integer max of the bf16 bits; details at the kernel). Session 6 replaced kvw_k's fp8
 *   path (V rows staged in shared memory, 4 tokens a K step: 47.5% of copy at T = 32768)
 *   by it: 66%; session 7: packed row maxima, one scale division a lane, K codes without
 *   copysign: 70% (docs/gpu-log/rope.md). Passes under 256 tokens run kvw8s_k (session 10: 4-token
 *   steps, K and V alike; details at the kernel).
 * fp8 quotients v / s: div_y (Markstein's correction from 1 / s, the same bits as the
 *   division) where every scale of the warp's rows allows it, else __fdiv_rn. The fused
 *   step's fp8 rows (qw_kstore) take their codes from a bracket around the quotient
 *   (e4m3x2_br) where it decides them (session 10). */

#define KW_WPB 8 /* warps per block (kvw_k, kvw8_k, kvw8s_k) */
typedef struct {
    const m3_bf16 *x[2]; /* K rows, V rows (NULL: not written) */
    int ld[2];
    void *dst[2];        /* K cache, V cache */
    float *scl[2];       /* fp8 scales of K, V */
    int nh, n_tok;
    int64_t ks, vs0, nstep; /* K steps [0, ks); V steps [vs0, nstep) */
    int page, lpage;     /* 128, 16 or 0 (plain rows) */
    bool fp8, hwcvt;
    float fp8_max;
    int kind, ovf;
    const int64_t *slots; /* or slot(pos[t]) through the block table */
    const int32_t *bt, *pos;
    int bt_block;
    bool pre;            /* a launch of its own (m3_gpu_kv_cache_write): kw_enter / kw_wait */
} kvw_args;
/* The K / V writer is a programmatic dependent launch (NVIDIA). After qw_norm_k in the fused
 * pass (pre false) its rows are older than the launch before it: it loads them at once and waits
 * for that launch at its end (kw_leave), so the pass completes as a whole. Launched alone (pre
 * true; session 16) the launch before it may have written the rows or the slots (the K / V
 * projection): its blocks let the next launch start at entry (kw_enter) and wait before their
 * first load (kw_wait). kvw_k's and kvw8s_k's steps wait after their index arithmetic (H200,
 * kv_cache_write bf16 T=4096: 5.7 -> 5.4 us against the wait at entry; kvw8_k waits at entry:
 * the other placement was not measured for it; docs/gpu-log/rope.md). */
static __device__ __forceinline__ void kw_enter(const kvw_args &a) {
    if (a.pre) m3_pdl_trigger();
}
static __device__ __forceinline__ void kw_wait(const kvw_args &a) {
    if (a.pre) m3_pdl_wait();
}
static __device__ __forceinline__ void kw_leave(const kvw_args &a) {
    if (!a.pre) m3_pdl_wait();
}
/* a.ks / a.vs0 / a.nstep for a.n_tok tokens: K steps of tk tokens a head; V steps of tk tokens
 * a head for plain rows (page 0) or where vwin is 0, else windows of vwin slot-consecutive
 * tokens (the pass's first window may start inside one: (n_tok + 2 vwin - 2) / vwin of them) */
static void kv_steps(kvw_args &a, int64_t tk, int64_t vwin) {
    const int64_t tg = (a.n_tok + tk - 1) / tk;
    a.ks = a.x[0] ? (int64_t)a.nh * tg : 0;
    a.vs0 = a.ks;
    a.nstep = a.ks + (!a.x[1] ? 0 : (int64_t)a.nh * (a.page == 0 || vwin == 0 ? tg : (a.n_tok + 2 * vwin - 2) / vwin));
}

/* v / s rounded to nearest, the same bits as __fdiv_rn(v, s), for a scale s in [2^-90,
 * 2^126] (div_ok) and y = __frcp_rn(s): q0 = v y is within 1.5 ulp of v / s, one correction
 * q1 = q0 + (v - s q0) y brings it within an ulp, and by Markstein's theorem a second one
 * (y the correctly rounded 1/s, the remainder exact through the fma) gives the correctly
 * rounded quotient. The range keeps y normal and the remainders of quotients >= 2^-10 (the
 * smallest that reach a nonzero fp8 code) out of the subnormals; a smaller quotient may be
 * off in its last bit but its code is a signed zero either way, and copysign keeps the sign of
 * a zero v (-0 / s = -0; the fma sum would give +0). 5 instructions against ~12 and a branch. */
static __device__ __forceinline__ bool div_ok(float s) { return s >= 0x1p-90f && s <= 0x1p126f; }
static __device__ __forceinline__ float div_y(float v, float s, float y) {
    float q = __fmul_rn(v, y);
    float r = __fmaf_rn(-s, q, v);
    q = __fmaf_rn(r, y, q);
    r = __fmaf_rn(-s, q, v);
    q = __fmaf_rn(r, y, q);
    return copysignf(q, v);
}
/* v / s: div_y when the whole warp's scales allow it (MD, a warp-uniform choice: a
 * per-element choice between the two measured slower than the division alone), else the
 * division */
template <bool MD>
static __device__ __forceinline__ float div_md(float v, float s, float y) {
    return MD ? div_y(v, s, y) : __fdiv_rn(v, s);
}

static __device__ __forceinline__ int64_t kw_slot(const kvw_args &a, int t) {
    return a.bt ? m3_dkv_slot(a.bt, a.bt_block, a.pos[t]) : a.slots[t];
}
/* element offset of (slot, h, dim) in the K (or plain-row) layout, x elements per chunk */
static __device__ __forceinline__ int64_t kw_koff(const kvw_args &a, int64_t slot, int h, int d, int lx) {
    if (a.page == 0) return (slot * a.nh + h) * 128 + d;
    const int64_t b = slot >> a.lpage;
    const int t = (int)(slot & (a.page - 1));
    return ((b * a.nh + h) * (128 >> lx) + (d >> lx)) * ((int64_t)a.page << lx) + (t << lx) + (d & ((1 << lx) - 1));
}
static __device__ __forceinline__ int64_t kw_voff(const kvw_args &a, int64_t slot, int h, int d, int lx) {
    const int64_t b = slot >> a.lpage;
    const int t = (int)(slot & (a.page - 1));
    return ((b * a.nh + h) * (a.page >> lx) + (t >> lx)) * ((int64_t)128 << lx) + ((int64_t)d << lx) +
           (t & ((1 << lx) - 1));
}
static __device__ __forceinline__ int64_t kw_soff(const kvw_args &a, int64_t slot, int h) {
    const int64_t b = slot >> a.lpage, t = slot & (a.page - 1);
    return (b * a.nh + h) * a.page + t;
}
/* amax bits (|x| as integers, NaN above inf) of a chunk of 8 bf16 */
static __device__ __forceinline__ uint32_t kw_amax(uint4 u) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) lo = max(lo, w[k] & 0x7FFFu), hi = max(hi, (w[k] >> 16) & 0x7FFFu);
    return max(lo, hi);
}
#define KW_ROWB (8 * 272) /* kvw_k's shared bytes per warp (an 8-token V window) */
static __device__ __forceinline__ void kvw_step(const kvw_args &a, int64_t st, unsigned char *rows) {
    constexpr int KT = M3_WARP / 8; /* tokens per K step */
    constexpr int x = 8, lx = 3;    /* bf16: 8 tokens per V chunk */
    const int lane = (int)threadIdx.x % M3_WARP;
    if (st >= a.nstep) return;
    if (st < a.ks || a.page == 0) { /* K (and plain-row V): 8 lanes a row */
        const int w = st < a.ks ? 0 : 1;
        const int64_t s = st < a.ks ? st : st - a.vs0;
        const int tg = (int)(s / a.nh), h = (int)(s - (int64_t)tg * a.nh);
        const int t = tg * KT + lane / 8, jj = lane & 7;
        const bool ok = t < a.n_tok;
        const m3_bf16 *row = a.x[w] + (int64_t)(ok ? t : 0) * a.ld[w] + h * 128;
        kw_wait(a);
        const int64_t slot = ok ? kw_slot(a, t) : -1;
        const uint4 u0 = ok ? m3_ld16_ro(row + 8 * jj) : make_uint4(0, 0, 0, 0);
        const uint4 u1 = ok ? m3_ld16_ro(row + 64 + 8 * jj) : make_uint4(0, 0, 0, 0);
        if (slot >= 0) {
            m3_st16_cs((m3_bf16 *)a.dst[w] + kw_koff(a, slot, h, 8 * jj, 3), u0);
            m3_st16_cs((m3_bf16 *)a.dst[w] + kw_koff(a, slot, h, 64 + 8 * jj, 3), u1);
        }
        return;
    }
    /* V window: tokens [tb, te) of head h */
    const int64_t s = st - a.vs0;
    const int win = (int)(s / a.nh), h = (int)(s - (int64_t)win * a.nh);
    kw_wait(a);
    const int64_t slot0 = kw_slot(a, 0); /* windows follow token 0's slot alignment */
    const int off = slot0 >= 0 ? (int)(slot0 & (x - 1)) : 0;
    const int tb = win == 0 ? 0 : win * x - off;
    const int te = min(a.n_tok, (win + 1) * x - off);
    const int n = te - tb;
    if (n <= 0) return;
    int64_t s_lane = -1;
    if (lane < n) s_lane = kw_slot(a, tb + lane);
    const int64_t s_first = m3_shfl((uint32_t)(s_lane & 0xFFFFFFFF), 0, M3_WARP) |
                            ((int64_t)m3_shfl((uint32_t)((uint64_t)s_lane >> 32), 0, M3_WARP) << 32);
    const bool lane_ok = lane >= x || (lane < n && s_lane == s_first + lane);
    const bool fast = n == x && s_first >= 0 && (s_first & (x - 1)) == 0 && m3_ballot(!lane_ok) == 0;
    /* rows into the warp's shared memory: lane -> chunk lane % 16 of rows lane / 16 + RPI i */
    constexpr int RPI = M3_WARP / 16;
    const int c = lane & 15;
#pragma unroll
    for (int i = 0; i < x / RPI; i++) {
        const int r = lane / 16 + RPI * i;
        const uint4 u = r < n ? m3_ld16_ro(a.x[1] + (int64_t)(tb + r) * a.ld[1] + h * 128 + 8 * c) : make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4 *>(rows + r * 272 + 16 * c) = u;
    }
    M3_SYNCWARP();
    if (fast) {
        const int64_t base = kw_voff(a, s_first, h, 0, lx);
#pragma unroll
        for (int i = 0; i < 128 / M3_WARP; i++) {
            const int d = lane + M3_WARP * i;
            const m3_bf16 *col = reinterpret_cast<const m3_bf16 *>(rows) + d;
            uint32_t w4[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                w4[k] = (uint32_t)col[2 * k * 136] | ((uint32_t)col[(2 * k + 1) * 136] << 16);
            m3_st16_cs((m3_bf16 *)a.dst[1] + base + ((int64_t)d << 3), make_uint4(w4[0], w4[1], w4[2], w4[3]));
        }
        return;
    }
    for (int i = lane; i < n * 128; i += M3_WARP) { /* element by element */
        const int r = i >> 7, d = i & 127;
        const int64_t slot = kw_slot(a, tb + r);
        if (slot < 0) continue;
        ((m3_bf16 *)a.dst[1])[kw_voff(a, slot, h, d, lx)] = reinterpret_cast<const m3_bf16 *>(rows + r * 272)[d];
    }
}
/* the fused pass: the grid's end waits for the launch before it (kw_leave): a dependent launch
 * must not finish before the qw_norm_k it overlaps; alone: kw_enter / kw_wait */
static __global__ void __launch_bounds__(KW_WPB * M3_WARP) kvw_k(kvw_args a) {
    __shared__ __align__(16) unsigned char srow[KW_WPB][KW_ROWB];
    kw_enter(a);
    kvw_step(a, (int64_t)blockIdx.x * KW_WPB + threadIdx.x / M3_WARP, srow[threadIdx.x / M3_WARP]);
    kw_leave(a);
}

/* kvw8_k (session 6): the fp8 K / V writer without shared-memory staging. One warp a step,
 * 16 tokens of one head a step for K and V alike (4 KB of rows in flight per warp), a grid of
 * all steps, no static shared memory beyond 128 bytes a warp (occupancy by registers).
 * K (and plain-row V): 8 lanes a row, lane jj holding dims 16jj .. 16jj+15 (its output chunk:
 * no code shuffles), M3_WARP / 8 rows a load, 16 / (M3_WARP / 8) loads per chunk pair.
 * V window (page-128 / 16 SHUFFLE): lane l holds dims DPL l .. DPL l + DPL-1 (DPL = 128 /
 * M3_WARP) of all 16 tokens: each load instruction reads one whole row, and the lane then
 * owns its output chunks (dim d: the window's 16 codes), so the transpose is in the load
 * pattern. The 16 row maxima: a reduce-scatter over the lanes (8 + 4 + 2 + 1 shuffles, then
 * the last lanes of a token), scales through 128 bytes of the warp's shared memory.
 * NC: no NaN or infinity in the step's rows (warp-uniform), so no quotient is NaN and the
 * e4m3fn instruction's code needs no NaN fix-up. */
template <bool MD, bool NC>
static __device__ __forceinline__ uint32_t k8_cvt2(float v0, float s0, float y0, float v1,
                                                   float s1, float y1, const kvw_args &a) {
    const float q0 = div_md<MD>(v0, s0, y0), q1 = div_md<MD>(v1, s1, y1);
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if (NC) {
        unsigned short r;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(q1), "f"(q0));
        return r;
    }
#endif
    return cvt8x2(q0, q1, a.kind, a.ovf, a.hwcvt);
}
static __device__ __forceinline__ float bf_lo(uint32_t w) { return m3_bits_f32(w << 16); }
static __device__ __forceinline__ float bf_hi(uint32_t w) { return m3_bits_f32(w & 0xFFFF0000u); }

/* 16 codes of a K row chunk pair (u0: dims 0-7, u1: 8-15) at one scale */
template <bool MD, bool NC>
static __device__ __forceinline__ uint4 k8_row16(uint4 u0, uint4 u1, float s, float y,
                                                 const kvw_args &a) {
    const uint32_t w[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        o[k] = k8_cvt2<MD, NC>(bf_lo(w[2 * k]), s, y, bf_hi(w[2 * k]), s, y, a) |
               (k8_cvt2<MD, NC>(bf_lo(w[2 * k + 1]), s, y, bf_hi(w[2 * k + 1]), s, y, a) << 16);
    return make_uint4(o[0], o[1], o[2], o[3]);
}

#define K8_T 16                 /* tokens a step */
#define K8_DPL (128 / M3_WARP)  /* V dims a lane holds */
#define K8_WPL (K8_DPL / 2)     /* their bf16 words per token */
template <bool MD, bool NC, int KR>
static __device__ __forceinline__ void k8_kstep(const kvw_args &a, int w, int h, const uint4 (&u)[KR][2],
                                                const int64_t (&slot)[KR], const float (&sc)[KR],
                                                const float (&y)[KR], int jj) {
#pragma unroll
    for (int k = 0; k < KR; k++) {
        const uint4 o = k8_row16<MD, NC>(u[k][0], u[k][1], sc[k], y[k], a);
        if (slot[k] >= 0) {
            m3_st16_cs((uint8_t *)a.dst[w] + kw_koff(a, slot[k], h, 16 * jj, 4), o);
            if (jj == 0) a.scl[w][kw_soff(a, slot[k], h)] = sc[k];
        }
    }
}
/* the V window's codes: ow[j] = dim DPL lane + j's 16 codes (token r in byte r) */
template <bool MD, bool NC, int T8>
static __device__ __forceinline__ void k8_vcodes(const kvw_args &a, const uint32_t (&dv)[T8][K8_WPL],
                                                 const float *sy, uint32_t (&ow)[K8_DPL][T8 / 4]) {
#pragma unroll
    for (int r = 0; r < T8; r += 2) {
        const float4 p = *reinterpret_cast<const float4 *>(sy + 2 * r); /* s_r, y_r, s_r+1, y_r+1 */
#pragma unroll
        for (int j = 0; j < K8_DPL; j++) {
            const uint32_t w0 = dv[r][j / 2], w1 = dv[r + 1][j / 2];
            const float v0 = j & 1 ? bf_hi(w0) : bf_lo(w0), v1 = j & 1 ? bf_hi(w1) : bf_lo(w1);
            const uint32_t c = k8_cvt2<MD, NC>(v0, p.x, p.y, v1, p.z, p.w, a);
            if ((r & 2) == 0) ow[j][r / 4] = c;
            else ow[j][r / 4] |= c << 16;
        }
    }
}

/* K codes of finite rows (md && nc; session 7): the quotient without copysign (div_y's last
 * step), since the code's sign bit is ORed in from v's bf16 sign bit: the quotient has v's
 * sign except that a zero quotient may come out +0 (the fma sums), and a zero code then takes
 * v's sign as ref's -0 / s does. One byte permutation gathers the 4 signs of a code word. */
static __device__ __forceinline__ float div_ns(float v, float s, float y) {
    float q = __fmul_rn(v, y);
    float r = __fmaf_rn(-s, q, v);
    q = __fmaf_rn(r, y, q);
    r = __fmaf_rn(-s, q, v);
    return __fmaf_rn(r, y, q);
}
static __device__ __forceinline__ uint32_t e4m3x2(float q0, float q1) { /* q0: low byte */
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(q1), "f"(q0));
    return r;
#else
    return cvt8x2(q0, q1, (int)M3_FP8_E4M3FN, (int)M3_FP8_SATURATE, true);
#endif
}
/* 16 codes of a finite row's chunk pair (u0: dims 0-7, u1: 8-15) by div_ns + the sign OR */
static __device__ __forceinline__ uint4 k8_row16_fin(uint4 u0, uint4 u1, float s, float y) {
    const uint32_t wd[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t w0 = wd[2 * i], w1 = wd[2 * i + 1];
        const uint32_t c0 = e4m3x2(div_ns(bf_lo(w0), s, y), div_ns(bf_hi(w0), s, y));
        const uint32_t c1 = e4m3x2(div_ns(bf_lo(w1), s, y), div_ns(bf_hi(w1), s, y));
        o[i] = __byte_perm(c0, c1, 0x5410) | (__byte_perm(w0, w1, 0x7531) & 0x80808080u);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}
template <int KR>
static __device__ __forceinline__ void k8_kstep_fin(const kvw_args &a, int w, int h, const uint4 (&u)[KR][2],
                                                    const int64_t (&slot)[KR], const float (&sc)[KR],
                                                    const float (&y)[KR], int jj) {
#pragma unroll
    for (int k = 0; k < KR; k++) {
        const uint4 o = k8_row16_fin(u[k][0], u[k][1], sc[k], y[k]);
        if (slot[k] >= 0) {
            m3_st16_cs((uint8_t *)a.dst[w] + kw_koff(a, slot[k], h, 16 * jj, 4), o);
            if (jj == 0) a.scl[w][kw_soff(a, slot[k], h)] = sc[k];
        }
    }
}

/* The bracket (session 10): e4m3 codes without the exact quotient. With y = RN(1 / s) normal
 * (div_ok), yd / yu = y -/+ 1 ulp bracket 1 / s strictly (|y - 1/s| <= ulp / 2), so for v >= 0
 * v yd < v / s < v yu, and rounding to fp32, then to e4m3 (RNE, satfinite), is monotone:
 * e4m3(RN(v yd)) <= e4m3(RN(v / s)) <= e4m3(RN(v yu)) (reversed for v < 0; a product keeps
 * v's sign, -0 included). Where the two outer codes agree they are ref's code; they differ
 * only where an e4m3 rounding midpoint lies within ~2 fp32 ulps of v / s (~3e-6 of random
 * quotients), and the caller then takes the exact quotients. Two products and one
 * conversion a code against div_y's six operations: it pays where the code walked once is
 * the cost (qw_kstore at decode); kvw8_k measured slower with it (H200, session 10: T = 4096
 * 0.0099 -> 0.0133 ms). */
static __device__ __forceinline__ float y_adj(float y, int d) { return m3_bits_f32(m3_f32_bits(y) + d); }
/* codes of (v0, v1) at (yd0, yu0), (yd1, yu1): the upper bracket's codes; bad |= any difference */
static __device__ __forceinline__ uint32_t e4m3x2_br(float v0, float yd0, float yu0, float v1, float yd1,
                                                    float yu1, uint32_t &bad) {
    const uint32_t cu = e4m3x2(__fmul_rn(v0, yu0), __fmul_rn(v1, yu1));
    const uint32_t cd = e4m3x2(__fmul_rn(v0, yd0), __fmul_rn(v1, yd1));
    bad |= cu ^ cd;
    return cu;
}
/* max of the two 16-bit halves of a and b, each half unsigned (sm_90: one instruction) */
static __device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t r;
    asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return max(a & 0xFFFFu, b & 0xFFFFu) | (max(a >> 16, b >> 16) << 16);
#endif
}
#define K8_ABS2 0x7FFF7FFFu /* |x| bits of two bf16 */
/* amax bits of 16 bf16 (two chunks) through packed maxima: the same integer max as kw_amax */
static __device__ __forceinline__ uint32_t kw_amax16(uint4 u0, uint4 u1) {
    const uint32_t m0 = max_u16x2(max_u16x2(u0.x & K8_ABS2, u0.y & K8_ABS2), max_u16x2(u0.z & K8_ABS2, u0.w & K8_ABS2));
    const uint32_t m1 = max_u16x2(max_u16x2(u1.x & K8_ABS2, u1.y & K8_ABS2), max_u16x2(u1.z & K8_ABS2, u1.w & K8_ABS2));
    const uint32_t m = max_u16x2(m0, m1);
    return max(m & 0xFFFFu, m >> 16);
}

/* one step st of kvw8_k (sy: the warp's 2 T8 floats of shared memory): T8 tokens of one head,
 * K8_T, or 8 (session 12) where the writer runs alone and its 8-token grid fits one wave: then
 * twice the warps carry half a step's chain each (K: KR = 2 rows a lane; V: half windows, 8
 * codes of a dim per 8-byte store). H200, m3_gpu_kv_cache_write fp8 T = 4096: 0.0099 -> 0.0082
 * ms; at 8192 / 16384 / 32768 tokens (two waves and more) 8-token steps measured slower
 * (0.0127 / 0.0210 / 0.0378 against 0.0125 / 0.0199 / 0.0341 ms; docs/gpu-log/rope.md) */
template <int T8>
static __device__ __forceinline__ void k8_step(const kvw_args &a, int64_t st, float *sy) {
    constexpr int KR = T8 / (M3_WARP / 8); /* K rows a lane holds */
    const int lane = (int)threadIdx.x % M3_WARP;
    if (st < a.ks || a.page == 0) { /* K (and plain-row V): 8 lanes a row */
        const int w = st < a.ks ? 0 : 1;
        const int s = (int)(st < a.ks ? st : st - a.vs0); /* < 2^31: the launcher checks */
        const int tg = s / a.nh, h = s - tg * a.nh;
        const int jj = lane & 7;
        uint4 u[KR][2];
        int64_t slot[KR];
#pragma unroll
        for (int k = 0; k < KR; k++) {
            const int t = tg * T8 + k * (M3_WARP / 8) + lane / 8;
            const bool ok = t < a.n_tok;
            const m3_bf16 *row = a.x[w] + (int64_t)(ok ? t : 0) * a.ld[w] + h * 128 + 16 * jj;
            u[k][0] = ok ? m3_ld16_ro(row) : make_uint4(0, 0, 0, 0);
            u[k][1] = ok ? m3_ld16_ro(row + 8) : make_uint4(0, 0, 0, 0);
            slot[k] = ok ? kw_slot(a, t) : -1;
        }
        /* each lane holds KR rows; lane jj computes row jj % KR's scale and 1 / scale
         * (one division and one reciprocal a lane instead of KR), the row's 8 lanes get
         * them by shuffles */
        const int kk = jj & (KR - 1);
        uint32_t amk = 0;
#pragma unroll
        for (int k = 0; k < KR; k++) {
            uint32_t am = kw_amax16(u[k][0], u[k][1]);
#pragma unroll
            for (int m = 1; m < 8; m <<= 1) am = max(am, (uint32_t)M3_SHFL_XOR((int)am, m));
            amk = k == kk ? am : amk;
        }
        const float sk = fp8_scale(m3_bits_f32(amk << 16), a.fp8_max);
        const bool md = m3_ballot(!div_ok(sk)) == 0, nc = a.hwcvt && m3_ballot(amk >= 0x7F80u) == 0;
        const float yk = md ? __frcp_rn(sk) : 0.0f;
        float sc[KR], y[KR];
#pragma unroll
        for (int k = 0; k < KR; k++) sc[k] = m3_shfl(sk, k, 8), y[k] = m3_shfl(yk, k, 8);
        if (md && nc) k8_kstep_fin<KR>(a, w, h, u, slot, sc, y, jj);
        else if (md) k8_kstep<true, false, KR>(a, w, h, u, slot, sc, y, jj);
        else k8_kstep<false, false, KR>(a, w, h, u, slot, sc, y, jj);
        return;
    }
    /* V window: tokens [tb, te) of head h (windows follow token 0's slot alignment) */
    const int s = (int)(st - a.vs0);
    const int win = s / a.nh, h = s - win * a.nh;
    const int64_t slot0 = kw_slot(a, 0);
    const int off = slot0 >= 0 ? (int)(slot0 & (T8 - 1)) : 0;
    const int tb = win == 0 ? 0 : win * T8 - off;
    const int te = min(a.n_tok, (win + 1) * T8 - off);
    const int n = te - tb;
    if (n <= 0) return;
    uint32_t dv[T8][K8_WPL];
#pragma unroll
    for (int r = 0; r < T8; r++) {
        const m3_bf16 *row = a.x[1] + (int64_t)(tb + (r < n ? r : 0)) * a.ld[1] + h * 128 + K8_DPL * lane;
#if M3_WARP == 32
        const uint2 v = r < n ? *reinterpret_cast<const uint2 *>(row) : make_uint2(0, 0);
        dv[r][0] = v.x, dv[r][1] = v.y;
#else
        dv[r][0] = r < n ? *reinterpret_cast<const uint32_t *>(row) : 0u;
#endif
    }
    int64_t s_lane = -1;
    if (lane < n) s_lane = kw_slot(a, tb + lane);
    const int64_t s_first = m3_shfl((uint32_t)(s_lane & 0xFFFFFFFF), 0, M3_WARP) |
                            ((int64_t)m3_shfl((uint32_t)((uint64_t)s_lane >> 32), 0, M3_WARP) << 32);
    const bool lane_ok = lane >= T8 || (lane < n && s_lane == s_first + lane);
    const bool fast = n == T8 && s_first >= 0 && (s_first & (T8 - 1)) == 0 && m3_ballot(!lane_ok) == 0;
    /* row maxima, packed: word i holds tokens i (low half) and i + 8 (high half) of the
     * lane's dims; a reduce-scatter over the 8 words (4 + 2 + 1 shuffles, then the LP = M3_WARP
     * / 8 lanes of a pair) leaves lane l with the pair i = l / LP, the first half of those
     * lanes taking token i, the second token i + 8 */
    uint32_t pk[T8 / 2];
#pragma unroll
    for (int i = 0; i < T8 / 2; i++) {
        uint32_t m0 = dv[i][0] & K8_ABS2, m1 = dv[i + T8 / 2][0] & K8_ABS2;
#pragma unroll
        for (int q = 1; q < K8_WPL; q++)
            m0 = max_u16x2(m0, dv[i][q] & K8_ABS2), m1 = max_u16x2(m1, dv[i + T8 / 2][q] & K8_ABS2);
        pk[i] = max_u16x2(__byte_perm(m0, m1, 0x5410), __byte_perm(m0, m1, 0x7632));
    }
    constexpr int NL = T8 == 16 ? 3 : 2; /* levels: T8 / 2 words -> 1 */
#pragma unroll
    for (int rd = 0; rd < NL; rd++) { /* 8 -> 4 -> 2 -> 1 words a lane (T8 16) */
        const int wv = (T8 / 4) >> rd, b = (M3_WARP / 2) >> rd;
        const bool up = (lane & b) != 0;
#pragma unroll
        for (int i = 0; i < T8 / 4; i++) {
            if (i >= wv) break;
            const uint32_t snd = up ? pk[i] : pk[i + wv], kp = up ? pk[i + wv] : pk[i];
            pk[i] = max_u16x2(kp, (uint32_t)M3_SHFL_XOR((int)snd, b));
        }
    }
    constexpr int LP = 2 * M3_WARP / T8; /* lanes of a token pair */
#pragma unroll
    for (int m = 1; m < LP; m <<= 1) pk[0] = max_u16x2(pk[0], (uint32_t)M3_SHFL_XOR((int)pk[0], m));
    const bool hi = (lane % LP) >= LP / 2;
    const int rt = lane / LP + (hi ? T8 / 2 : 0); /* this lane's token */
    const uint32_t amr = hi ? pk[0] >> 16 : pk[0] & 0xFFFFu;
    const float sc = fp8_scale(m3_bits_f32(amr << 16), a.fp8_max);
    const bool md = m3_ballot(!div_ok(sc)) == 0, nc = a.hwcvt && m3_ballot(amr >= 0x7F80u) == 0;
    if (lane % (LP / 2) == 0) {
        sy[2 * rt] = sc, sy[2 * rt + 1] = md ? __frcp_rn(sc) : 0.0f;
        if (rt < n) {
            const int64_t sl = kw_slot(a, tb + rt);
            if (sl >= 0) a.scl[1][kw_soff(a, sl, h)] = sc;
        }
    }
    M3_SYNCWARP();
    uint32_t ow[K8_DPL][T8 / 4];
    if (md && nc) k8_vcodes<true, true, T8>(a, dv, sy, ow);
    else if (md) k8_vcodes<true, false, T8>(a, dv, sy, ow);
    else k8_vcodes<false, false, T8>(a, dv, sy, ow);
    if (fast) {
        uint8_t *base = (uint8_t *)a.dst[1] + kw_voff(a, s_first, h, 0, 4);
#pragma unroll
        for (int j = 0; j < K8_DPL; j++) {
            if (T8 == 16)
                m3_st16_cs(base + ((int64_t)(K8_DPL * lane + j) << 4), make_uint4(ow[j][0], ow[j][1], ow[j][T8 / 4 - 2], ow[j][T8 / 4 - 1]));
            else /* half a chunk: 8 tokens of the dim */
                *reinterpret_cast<uint2 *>(base + ((int64_t)(K8_DPL * lane + j) << 4)) = make_uint2(ow[j][0], ow[j][T8 / 4 - 1]);
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < T8; r++) { /* a cut or irregular window: byte by byte */
        if (r >= n) break;
        const int64_t sl = kw_slot(a, tb + r);
        if (sl < 0) continue;
#pragma unroll
        for (int j = 0; j < K8_DPL; j++)
            ((uint8_t *)a.dst[1])[kw_voff(a, sl, h, K8_DPL * lane + j, 4)] =
                (uint8_t)(ow[j][r / 4] >> (8 * (r % 4)));
    }
}

/* 8 warps a block, 4 blocks per SM (<= 64 registers: 32 warps per SM; H200, session 6: 78
 * registers at 3 blocks per SM measured 62%, 4-warp blocks at 8 per SM the same 66%, the K
 * and V steps interleaved in the grid 63%, a persistent grid with an L2 prefetch of each
 * warp's next step 59%; session 7: a persistent grid without the prefetch 59%). The fused
 * pass's end waits for the launch before it (kw_leave: its qw_norm_k); alone, the wait is at
 * entry (kw_wait). */
template <int T8>
static __global__ void __launch_bounds__(KW_WPB * M3_WARP, 4) kvw8_k(kvw_args a) {
    __shared__ __align__(16) float ssy[KW_WPB][2 * T8];
    const int wid = (int)threadIdx.x / M3_WARP;
    const int64_t st = (int64_t)blockIdx.x * KW_WPB + wid;
    kw_enter(a);
    kw_wait(a);
    if (st < a.nstep) k8_step<T8>(a, st, ssy[wid]);
    kw_leave(a);
}

/* kvw8s_k (session 10): the fp8 writer for passes under 256 tokens (decode). kvw8_k's steps are
 * 16 tokens (64 quotients a lane, a dependent slot load before the V window's row loads) walked
 * once by a few warps, which instruction fetch and latency bound; here a step is M3_WARP / 8
 * tokens of one head, K and V alike: 8 lanes a row, lane jj dims 16 jj .. 16 jj + 15 (two
 * 16-byte loads, the slot load beside them), the row maximum by 3 shuffles, 16 codes a lane; K
 * stores them as one 16-byte chunk, V (16 tokens of a dim per 16 bytes) byte by byte. */
static __device__ __forceinline__ void k8s_step(const kvw_args &a, int64_t st) {
    const int lane = (int)threadIdx.x % M3_WARP, jj = lane & 7;
    const int w = st < a.ks ? 0 : 1;
    const int s = (int)(st < a.ks ? st : st - a.vs0);
    const int tg = s / a.nh, h = s - tg * a.nh;
    const int t = tg * (M3_WARP / 8) + lane / 8;
    const bool ok = t < a.n_tok;
    const m3_bf16 *row = a.x[w] + (int64_t)(ok ? t : 0) * a.ld[w] + h * 128 + 16 * jj;
    kw_wait(a);
    const uint4 u0 = ok ? m3_ld16_ro(row) : make_uint4(0, 0, 0, 0);
    const uint4 u1 = ok ? m3_ld16_ro(row + 8) : make_uint4(0, 0, 0, 0);
    const int64_t slot = ok ? kw_slot(a, t) : -1;
    uint32_t am = kw_amax16(u0, u1);
#pragma unroll
    for (int m = 1; m < 8; m <<= 1) am = max(am, (uint32_t)M3_SHFL_XOR((int)am, m));
    const float sc = fp8_scale(m3_bits_f32(am << 16), a.fp8_max);
    const bool md = m3_ballot(!div_ok(sc)) == 0, nc = a.hwcvt && m3_ballot(am >= 0x7F80u) == 0;
    const float y = md ? __frcp_rn(sc) : 0.0f;
    uint4 o;
    if (md && nc) {
        o = k8_row16_fin(u0, u1, sc, y);
    } else if (md) {
        o = k8_row16<true, false>(u0, u1, sc, y, a);
    } else {
        o = k8_row16<false, false>(u0, u1, sc, y, a);
    }
    if (slot < 0) return;
    if (w == 0 || a.page == 0) {
        m3_st16_cs((uint8_t *)a.dst[w] + kw_koff(a, slot, h, 16 * jj, 4), o);
    } else {
        uint8_t *d = (uint8_t *)a.dst[1] + kw_voff(a, slot, h, 16 * jj, 4);
        const uint32_t w4[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
        for (int i = 0; i < 16; i++) d[i << 4] = (uint8_t)(w4[i / 4] >> (8 * (i % 4)));
    }
    if (jj == 0) a.scl[w][kw_soff(a, slot, h)] = sc;
}
static __global__ void __launch_bounds__(KW_WPB * M3_WARP) kvw8s_k(kvw_args a) {
    const int64_t st = (int64_t)blockIdx.x * KW_WPB + (int)threadIdx.x / M3_WARP;
    kw_enter(a);
    if (st < a.nstep) k8s_step(a, st);
    kw_leave(a);
}

#define QW_LPR 4                     /* lanes per row (qw_norm_k) */
#define QW_RPS (M3_WARP / QW_LPR)    /* rows per warp step */
#define QW_WPB 8                     /* warps per block */
typedef struct {
    m3_bf16 *x;
    const m3_bf16 *w;
    int ld, nh;
    bool kc;          /* K rows: also written to the K cache (kv's layout) */
    bool ic;          /* index_k rows: also written to the index cache */
    bool vc;          /* small passes: raw V rows (no norm) written to the V cache */
    int s0, rows;     /* first step; rows = n_tok * nh (< 2^31, checked by the launcher) */
    int rps;          /* small passes: rows a step (qw_rps: one token's; lanes of rows rq >= rps
                       * idle); streaming passes QW_RPS */
} qw_part;
typedef struct {
    qw_part p[5];
    int np;
    int nstep;
    float eps;
    const float *cst; /* [T, 64] cos | sin, or NULL: no rope */
    int k_src;        /* fp8 K: M3_GPU_KQ_* */
    kvw_args kv;      /* the cache (K part) */
    void *ic;         /* index cache [row, 128]: bf16, or fp8 codes at unit scale (ifp8) */
    bool ifp8;
    int64_t irow0;    /* index rows irow0 + t (paged cache, or no slots), else slots[t] */
    const int32_t *ibt; /* paged index cache (§4.5): rows slot(ipos[t]) through ibt, else ^ */
    int ibt_block;
    const int32_t *ipos;
    /* small passes (VS >= 0): cos / sin evaluated per row from the positions (no table);
     * with VS 1 the raw K / V rows' steps of kv after the parts' steps */
    bool rope, angle_f64, cs_bf16;
    const int32_t *pos;
    float inv[32];
} qw_args;

/* part pi of the parameters through selects (constant indices: an indexed parameter would go
 * through a local copy) */
static __device__ __forceinline__ qw_part qw_psel(const qw_args &a, int pi) {
    qw_part r = a.p[0];
    if (pi == 1) r = a.p[1];
    if (pi == 2) r = a.p[2];
    if (pi == 3) r = a.p[3];
    if (pi == 4) r = a.p[4];
    return r;
}

/* A K row of qw_norm_k (lane j's chunks j + 4k, values v): the stored row back in place and
 * into the K cache at slot (< 0: padding, row only). KC 1: bf16 cache; KC 2: fp8 cache with
 * the row's scale: amax of the stored values (STORED) or of the fp32 values (the two staged
 * writers), reduced over the row's 4 lanes; codes of the stored or fp32 values, staged in the
 * warp's shared memory (stg: this row's 128 bytes) and stored as 16-dim chunks j, j + 4. */
template <int KC>
static __device__ __forceinline__ void qw_kstore(const qw_args &a, float (&v)[4][8], m3_bf16 *p,
                                                 int64_t slot, int h, int j, unsigned char *stg,
                                                 bool vrow, const uint4 (&ro)[4]) {
    uint4 o[4]; /* the stored row: V rows' bits as read (a NaN's payload kept, as ref's copy) */
#pragma unroll
    for (int k = 0; k < 4; k++)
        o[k] = vrow ? ro[k]
                    : make_uint4(pack_bf16x2(v[k][0], v[k][1]), pack_bf16x2(v[k][2], v[k][3]),
                                 pack_bf16x2(v[k][4], v[k][5]), pack_bf16x2(v[k][6], v[k][7]));
    if (p) {
#pragma unroll
        for (int k = 0; k < 4; k++) m3_st16_cs(p + 32 * k, o[k]);
    }
    if (KC == 1) {
        if (slot >= 0 && (!vrow || a.kv.page == 0)) { /* chunk j + 4k: 4k chunks of page x 8
                                                       * elements (plain rows: 32k) on */
            m3_bf16 *d = (m3_bf16 *)a.kv.dst[vrow ? 1 : 0] + kw_koff(a.kv, slot, h, 8 * j, 3);
            const int64_t step = a.kv.page ? (int64_t)32 * a.kv.page : 32;
#pragma unroll
            for (int k = 0; k < 4; k++) m3_st16_cs(d + k * step, o[k]);
        } else if (slot >= 0) { /* V SHUFFLE: 8 tokens of a dim per 16 bytes, an element a dim */
            m3_bf16 *d = (m3_bf16 *)a.kv.dst[1] + kw_voff(a.kv, slot, h, 0, 3);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint32_t w4[4] = {o[k].x, o[k].y, o[k].z, o[k].w};
#pragma unroll
                for (int e = 0; e < 8; e++)
                    d[(int64_t)(8 * (j + 4 * k) + e) << 3] = (m3_bf16)(e & 1 ? w4[e / 2] >> 16 : w4[e / 2] & 0xFFFFu);
            }
        }
        return;
    }
    uint32_t am = 0;
    if (vrow || a.k_src == M3_GPU_KQ_STORED) { /* V: always the stored values' amax */
#pragma unroll
        for (int k = 0; k < 4; k++) am = max(am, kw_amax(o[k]) << 16);
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) am = max(am, m3_f32_bits(v[k][e]) & 0x7FFFFFFFu);
    }
    am = max(am, (uint32_t)M3_SHFL_XOR((int)am, 1));
    am = max(am, (uint32_t)M3_SHFL_XOR((int)am, 2));
    const float sc = fp8_scale(m3_bits_f32(am), a.kv.fp8_max);
    const bool md = m3_ballot(!div_ok(sc)) == 0;
    const float y = md ? __frcp_rn(sc) : 0.0f;
    const bool f32v = !vrow && a.k_src == M3_GPU_KQ_F32;
    /* the bracket (e4m3x2_br, session 10) where the whole warp's rows are finite and divide by
     * div_y: the codes of v yd and v yu; where a lane's two differ (a rounding midpoint near
     * v / s) the warp takes the exact quotients below. H200, the fused fp8 sparse step:
     * T = 4096 / 16384 69.6 -> 71.0% / 80.3 -> 81.5% of copy; T = 1 0.0069 -> 0.0061 ms in
     * one batch, unchanged (0.0067) in another (docs/gpu-log/rope.md) */
    const bool brk = md && a.kv.hwcvt && m3_ballot(am >= 0x7F800000u) == 0;
    bool exact = !brk;
    if (brk) {
        const float yd = y_adj(y, -1), yu = y_adj(y, 1);
        uint32_t bad = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float q[8];
            if (f32v) {
#pragma unroll
                for (int e = 0; e < 8; e++) q[e] = v[k][e];
            } else {
                m3_unpack16<m3_bf16>(o[k], q);
            }
            const uint32_t lo0 = e4m3x2_br(q[0], yd, yu, q[1], yd, yu, bad);
            const uint32_t hi0 = e4m3x2_br(q[2], yd, yu, q[3], yd, yu, bad);
            const uint32_t lo1 = e4m3x2_br(q[4], yd, yu, q[5], yd, yu, bad);
            const uint32_t hi1 = e4m3x2_br(q[6], yd, yu, q[7], yd, yu, bad);
            *reinterpret_cast<uint2 *>(stg + 8 * (j + 4 * k)) = make_uint2(lo0 | (hi0 << 16), lo1 | (hi1 << 16));
        }
        exact = m3_any(bad != 0);
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (!exact) break;
        float q[8];
        if (f32v) {
#pragma unroll
            for (int e = 0; e < 8; e++) q[e] = v[k][e];
        } else {
            m3_unpack16<m3_bf16>(o[k], q);
        }
        uint32_t w2[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            uint32_t lo, hi;
            if (md) {
                lo = cvt8x2(div_y(q[4 * e], sc, y), div_y(q[4 * e + 1], sc, y), a.kv.kind, a.kv.ovf, a.kv.hwcvt);
                hi = cvt8x2(div_y(q[4 * e + 2], sc, y), div_y(q[4 * e + 3], sc, y), a.kv.kind, a.kv.ovf, a.kv.hwcvt);
            } else {
                lo = cvt8x2(__fdiv_rn(q[4 * e], sc), __fdiv_rn(q[4 * e + 1], sc), a.kv.kind, a.kv.ovf, a.kv.hwcvt);
                hi = cvt8x2(__fdiv_rn(q[4 * e + 2], sc), __fdiv_rn(q[4 * e + 3], sc), a.kv.kind, a.kv.ovf, a.kv.hwcvt);
            }
            w2[e] = lo | (hi << 16);
        }
        *reinterpret_cast<uint2 *>(stg + 8 * (j + 4 * k)) = make_uint2(w2[0], w2[1]);
    }
    M3_SYNCWARP();
    if (slot >= 0 && !vrow) {
#pragma unroll
        for (int k = 0; k < 2; k++) { /* output chunks j, j + 4 (16 dims each) */
            const int c16 = j + 4 * k;
            m3_st16_cs((uint8_t *)a.kv.dst[0] + kw_koff(a.kv, slot, h, 16 * c16, 4),
                       *reinterpret_cast<const uint4 *>(stg + 16 * c16));
        }
    } else if (slot >= 0) { /* V SHUFFLE: 16 tokens of a dim per 16 bytes, a byte a dim; lane j
                             * dims 4 i + j (i < 32) from the staged row, so a store's 4 lanes of
                             * a row hit one 128-byte line (session 9: lane j's own dims 32 j ..
                             * 32 j + 31 put the 32 lanes of every store in 32 lines; the V rows'
                             * stores were the longest phase of the T = 64 sparse step, ~12000
                             * clocks a warp) */
        uint8_t *d = (uint8_t *)a.kv.dst[1] + kw_voff(a.kv, slot, h, 0, 4) + 16 * j;
#pragma unroll
        for (int m = 0; m < 8; m++) { /* dims 16 m .. 16 m + 15 */
            const uint4 c = *reinterpret_cast<const uint4 *>(stg + 16 * m);
            const uint32_t w4[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
            for (int i = 0; i < 4; i++) d[(int64_t)(16 * m + 4 * i) << 4] = (uint8_t)(w4[i] >> (8 * j));
        }
    }
    if (slot >= 0 && j == 0) a.kv.scl[vrow ? 1 : 0][kw_soff(a.kv, slot, h)] = sc;
    M3_SYNCWARP(); /* stg is rewritten by the next step */
}

/* An index_k row of qw_norm_k: the stored row back in place and into the index cache at
 * row (< 0: padding, row only): the bf16 chunks, or their fp8 codes at unit scale (§4.8:
 * cvt(f32(bf16 value))), 8 bytes a chunk. */
static __device__ __forceinline__ void qw_istore(const qw_args &a, float (&v)[4][8], m3_bf16 *p,
                                                 int64_t row, int j) {
    uint4 o[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        o[k] = make_uint4(pack_bf16x2(v[k][0], v[k][1]), pack_bf16x2(v[k][2], v[k][3]),
                          pack_bf16x2(v[k][4], v[k][5]), pack_bf16x2(v[k][6], v[k][7]));
    if (p) {
#pragma unroll
        for (int k = 0; k < 4; k++) m3_st16_cs(p + 32 * k, o[k]);
    }
    if (row < 0) return;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int64_t off = row * 128 + 8 * (j + 4 * k);
        if (!a.ifp8) {
            m3_st16_cs((m3_bf16 *)a.ic + off, o[k]);
        } else {
            const uint32_t w4[4] = {o[k].x, o[k].y, o[k].z, o[k].w};
            uint32_t b[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint32_t lo = cvt8x2(m3_bits_f32(w4[2 * e] << 16), m3_bits_f32(w4[2 * e] & 0xFFFF0000u),
                                           a.kv.kind, a.kv.ovf, a.kv.hwcvt);
                const uint32_t hi = cvt8x2(m3_bits_f32(w4[2 * e + 1] << 16), m3_bits_f32(w4[2 * e + 1] & 0xFFFF0000u),
                                           a.kv.kind, a.kv.ovf, a.kv.hwcvt);
                b[e] = lo | (hi << 16);
            }
            *reinterpret_cast<uint2 *>((uint8_t *)a.ic + off) = make_uint2(b[0], b[1]);
        }
    }
}

/* KC: no part writes a cache (0); cache parts with a bf16 (1) or fp8 (2) K cache.
 * VS (session 8): -1 the warp-streaming pass (cos / sin from the table a.cst); >= 0 a small
 * pass (decode, < 256 tokens) in ONE launch: cos / sin evaluated per step (a.rope), a grid of
 * one step a warp, fp8 V rows as a part (vc: no norm, qw_kstore's cache write into the V
 * layout), and with VS 1 the bf16 raw K / V rows' a.kv.nstep steps (kvw_k's) after the
 * parts' a.nstep steps */
/* The parameters (session 12): on NVIDIA the argument is __grid_constant__, so a small pass reads
 * its part a.p[pi] and its inverse frequency a.inv[L] by index (constant-bank loads) instead of
 * through chains of selects on every field (~90 instructions on every warp's path before its
 * first loads); HIP keeps the selects (an indexed argument goes through a local copy there).
 * H200, with the position loaded beside the rows (below): qkv_cache decode rows 0.2-0.5 us
 * faster (docs/gpu-log/rope.md, session 12). */
#if defined(M3_HIP_NVIDIA)
#define QW_GC __grid_constant__
#define QW_IDX 1
#else
#define QW_GC
#define QW_IDX 0
#endif
template <int QR, int KC, int VS>
static __global__ void __launch_bounds__(QW_WPB * M3_WARP, VS >= 0 ? 1 : KC == 2 ? 2 : 3) qw_norm_k(const QW_GC qw_args a) {
    constexpr bool per_op = QR == M3_QK_ROUND_PER_OP;
    m3_pdl_trigger();
    /* small passes are a dependent launch of whatever ran before them (H200, session 13: the
     * decode steps 0.7-0.9 us less, docs/gpu-log/rope.md): they wait for it before any global load or
     * store, but read their parameters first. The parameters are new to the constant cache at
     * every launch, so each 64-byte line is touched here (and the step located, inv[L] read,
     * below) while the launch waits (session 14: stamps showed ~1300 clocks from the wait to
     * the first loads, and a step's parameter reads spread over its phases; the standalone
     * q T = 1 0.0046 -> 0.0036-0.0038 ms, docs/gpu-log/rope.md) */
#if QW_IDX /* __grid_constant__: reading the parameter block by address makes no copy of it */
    if (VS >= 0) {
        const int *pa = reinterpret_cast<const int *>(&a);
        int acc = 0;
#pragma unroll
        for (int o = 0; o < (int)(sizeof(qw_args) / 4); o += 16) acc += pa[o];
        asm volatile("" ::"r"(acc)); /* the loads stay */
    }
#endif
    __shared__ __align__(16) float w1s[VS < 0 ? 5 : 1][128];
    __shared__ __align__(16) unsigned char kst[KC == 2 ? QW_WPB : 1][QW_RPS * 144]; /* fp8 K codes */
    __shared__ qw_part sp[5]; /* the parts, read per step from shared memory (kept out of registers) */
    __shared__ __align__(16) unsigned char vrow[VS == 1 ? QW_WPB : 1][VS == 1 ? KW_ROWB : 16];
    if (VS < 0) { /* streaming passes: parts and 1 + w once a block (small passes: no block
                   * prologue, see below) */
        if (threadIdx.x < 5)
            sp[threadIdx.x] = threadIdx.x == 0 ? a.p[0] : threadIdx.x == 1 ? a.p[1] : threadIdx.x == 2 ? a.p[2]
                            : threadIdx.x == 3 ? a.p[3] : a.p[4];
        __syncthreads();
        for (int i = (int)threadIdx.x; i < a.np * 128; i += (int)blockDim.x)
            if (sp[i >> 7].w) w1s[i >> 7][i & 127] = __fadd_rn(1.0f, m3_bf16_to_f32(sp[i >> 7].w[i & 127]));
        __syncthreads();
    }
    const int lane = (int)threadIdx.x % M3_WARP, j = lane & 3, rq = lane / QW_LPR;
    unsigned char *stg = kst[KC == 2 ? threadIdx.x / M3_WARP : 0] + rq * 144;
    const int nw = (int)gridDim.x * QW_WPB;
    int st = (int)blockIdx.x * QW_WPB + (int)threadIdx.x / M3_WARP;
    if (VS == 1 && st >= a.nstep) { /* a raw K / V step (no block barrier follows) */
        m3_pdl_wait();
        kvw_step(a.kv, st - a.nstep, vrow[VS == 1 ? threadIdx.x / M3_WARP : 0]);
        return;
    }
    /* step s: part, token, head, row address (NULL: no row for this lane). Small passes hold
     * the part in registers (ncp: read from the parameters by selects) and load the norm
     * weights with the rows (wn), so no block prologue and no barrier precede the rows' loads
     * (session 9) */
    qw_part ncp, cp;
    auto locate = [&](int s, int &pi, int &t, int &h, m3_bf16 *&p) {
        if (VS >= 0) { /* every part's first step read at once (no chain of dependent reads) */
            const int np = a.np;
            pi = (int)((np > 1) & (s >= a.p[1].s0)) + (int)((np > 2) & (s >= a.p[2].s0)) +
                 (int)((np > 3) & (s >= a.p[3].s0)) + (int)((np > 4) & (s >= a.p[4].s0));
            if (QW_IDX) ncp = a.p[pi];
            else ncp = qw_psel(a, pi);
        } else {
            pi = a.np > 4 && s >= sp[4].s0 ? 4 : a.np > 3 && s >= sp[3].s0 ? 3 : a.np > 2 && s >= sp[2].s0 ? 2
               : a.np > 1 && s >= sp[1].s0 ? 1 : 0;
        }
#define QW_F(f) (VS >= 0 ? ncp.f : sp[pi].f)
        const int rps = VS >= 0 ? QW_F(rps) : QW_RPS;
        const int r = (s - QW_F(s0)) * rps + rq;
        const int nh = QW_F(nh);
        p = NULL, t = 0, h = 0;
        if (rq < rps && r < QW_F(rows)) {
            t = r / nh;
            h = r - t * nh;
            p = QW_F(x) + (int64_t)t * QW_F(ld) + h * 128 + 8 * j;
        }
#undef QW_F
    };
#define QW_F(f) (VS >= 0 ? cp.f : sp[pi].f)
    uint4 nx[4], wn[4];
    int npi = 0, nt = 0, nh_ = 0;
    int32_t nps = 0; /* small passes: the located row's position, loaded with the rows */
    m3_bf16 *np_ = NULL;
    auto wload = [&]() { /* small passes: the located part's norm weights (lane j's dims) */
#pragma unroll
        for (int k = 0; k < 4; k++) wn[k] = ncp.w ? m3_ld16(ncp.w + 8 * (j + 4 * k)) : make_uint4(0, 0, 0, 0);
    };
    const float iv0 = VS >= 0 && QW_IDX ? a.inv[lane & 31] : 0.0f; /* small passes: inv[L] */
    if (st < a.nstep) {
        locate(st, npi, nt, nh_, np_);
        if (VS >= 0) m3_pdl_wait(); /* the rows, weights and positions follow */
#pragma unroll
        for (int k = 0; k < 4; k++) nx[k] = np_ ? m3_ld16(np_ + 32 * k) : make_uint4(0, 0, 0, 0);
        if (VS >= 0) nps = np_ && a.rope && !ncp.vc ? a.pos[nt] : 0;
        if (VS >= 0) wload();
    }
    m3_pdl_wait(); /* the cos/sin table (the rows are older than the table launch) */
    for (; st < a.nstep; st += nw) {
        const int pi = npi, t = nt, h = nh_;
        const int32_t cps = nps;
        m3_bf16 *const p = np_;
        if (VS >= 0) cp = ncp;
        /* small pass: cos / sin of pair i = 8 j + e of this row's token, as the tile kernel and
         * cs_table_k evaluate them (the same double sincos), ONE evaluation a lane per distinct
         * token of the step: lane L evaluates pair L % 32 of the step's first token, every lane
         * takes its 8 pairs by shuffles, then the next token of the step (rows are token-major;
         * since session 11 a step is one token's rows (qw_rps), so the loop runs once; it
         * stays for any step of several tokens). Session 9, H200: the 8 sincos a
         * lane before were ~2/3 of a decode step (their code walked once per warp); the
         * per-warp clocks in docs/gpu-log/rope.md */
        float c8[8], s8[8];
        const bool raw = VS >= 0 && QW_F(vc); /* V rows: no norm, no rope */
        if (VS >= 0 && a.rope && !raw) {
            const int32_t myps = cps;
            const int L = lane & 31;
            float iv = a.inv[0]; /* inv[L] through selects (constant indices) */
            if (QW_IDX) iv = iv0;
            else {
#pragma unroll
            for (int i = 1; i < 32; i++) iv = L == i ? a.inv[i] : iv;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) c8[e] = 1.0f, s8[e] = 0.0f; /* rows without a row */
            int tr = (int)m3_shfl((uint32_t)t, 0); /* row 0 exists in every step */
            int32_t ps = (int32_t)m3_shfl((uint32_t)myps, 0);
#pragma unroll 1
            for (;;) {
                const double ang = a.angle_f64 ? (double)ps * (double)iv : (double)__fmul_rn((float)ps, iv);
                double sn, cn;
                sincos(ang, &sn, &cn);
                const float cl = rnd(a.cs_bf16, (float)cn), sl = rnd(a.cs_bf16, (float)sn);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float cv = m3_shfl(cl, 8 * j + e), sv = m3_shfl(sl, 8 * j + e);
                    if (t == tr) c8[e] = cv, s8[e] = sv;
                }
                const uint64_t later = m3_ballot(p != NULL && t > tr); /* warp-uniform */
                if (later == 0) break;
                const int src = __ffsll((long long)later) - 1;
                tr = (int)m3_shfl((uint32_t)t, src);
                ps = (int32_t)m3_shfl((uint32_t)myps, src);
            }
        }
        float v[4][8];
        uint4 ro[4]; /* V rows' bits (small passes) */
#pragma unroll
        for (int k = 0; k < 4; k++) m3_unpack16<m3_bf16>(nx[k], v[k]), ro[k] = nx[k];
        const uint4 wc[4] = {wn[0], wn[1], wn[2], wn[3]}; /* this step's weights (small passes) */
        if (st + nw < a.nstep) { /* the next step's rows in flight */
            locate(st + nw, npi, nt, nh_, np_);
#pragma unroll
            for (int k = 0; k < 4; k++) nx[k] = np_ ? m3_ld16(np_ + 32 * k) : make_uint4(0, 0, 0, 0);
            if (VS >= 0) nps = np_ && a.rope && !ncp.vc ? a.pos[nt] : 0;
            if (VS >= 0) wload();
        }
        if (!raw) { /* normed rows: the norm, then the rotation */
            /* sum of squares in index order: chunk c = 4 * slot + owner lane */
            float s = 0.0f;
#pragma unroll
            for (int c = 0; c < 16; c++) {
                float tt = s;
#pragma unroll
                for (int e = 0; e < 8; e++) tt = __fadd_rn(tt, __fmul_rn(v[c >> 2][e], v[c >> 2][e]));
                s = m3_shfl(tt, c & 3, QW_LPR);
            }
            const float mu = __fdiv_rn(s, 128.0f);
            const float rho = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mu, a.eps)));
            const float *w1 = w1s[VS >= 0 ? 0 : pi];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float wk[8]; /* small passes: 1 + w of the registers (the prologue's sum) */
                if (VS >= 0) {
                    m3_unpack16<m3_bf16>(wc[k], wk);
#pragma unroll
                    for (int e = 0; e < 8; e++) wk[e] = __fadd_rn(1.0f, wk[e]);
                }
#pragma unroll
                for (int e = 0; e < 8; e++)
                    v[k][e] = rnd(per_op, __fmul_rn(__fmul_rn(v[k][e], rho), VS >= 0 ? wk[e] : w1[8 * (j + 4 * k) + e]));
            }
            if (VS >= 0 ? a.rope : a.cst != NULL) {
                if (VS < 0) { /* this token's cos / sin rows (the table: L1 / L2 hits) */
                    const float *cs = a.cst + (int64_t)t * 64 + 8 * j;
                    *reinterpret_cast<float4 *>(c8) = *reinterpret_cast<const float4 *>(cs);
                    *reinterpret_cast<float4 *>(c8 + 4) = *reinterpret_cast<const float4 *>(cs + 4);
                    *reinterpret_cast<float4 *>(s8) = *reinterpret_cast<const float4 *>(cs + 32);
                    *reinterpret_cast<float4 *>(s8 + 4) = *reinterpret_cast<const float4 *>(cs + 36);
                }
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float n1 = v[0][e], n2 = v[1][e];
                    const float a1 = rnd(per_op, __fmul_rn(n1, c8[e]));
                    const float b1 = rnd(per_op, __fmul_rn(-n2, s8[e]));
                    const float a2 = rnd(per_op, __fmul_rn(n2, c8[e]));
                    const float b2 = rnd(per_op, __fmul_rn(n1, s8[e]));
                    v[0][e] = rnd(per_op, __fadd_rn(a1, b1));
                    v[1][e] = rnd(per_op, __fadd_rn(a2, b2));
                }
            }
        }
        if (KC != 0 && (QW_F(kc) || raw)) {
            qw_kstore<KC>(a, v, raw ? NULL : p, p ? kw_slot(a.kv, t) : -1, h, j, stg, raw, ro);
        } else if (KC != 0 && QW_F(ic)) {
            qw_istore(a, v, p,
                      !p       ? -1
                      : a.ibt  ? m3_dkv_slot(a.ibt, a.ibt_block, a.ipos[t])
                      : a.kv.bt || !a.kv.slots ? a.irow0 + t
                                               : a.kv.slots[t],
                      j);
        } else if (p) {
#pragma unroll
            for (int k = 0; k < 4; k++)
                m3_st16_cs(p + 32 * k, make_uint4(pack_bf16x2(v[k][0], v[k][1]), pack_bf16x2(v[k][2], v[k][3]),
                                                  pack_bf16x2(v[k][4], v[k][5]), pack_bf16x2(v[k][6], v[k][7])));
        }
#undef QW_F
    }
}

/* ---- launchers ------------------------------------------------------------------------- */
/* rows a step of a small pass: the largest divisor of the part's heads up to QW_RPS, so a step
 * is one token's rows (session 11: 8-row steps held 2 tokens of a K / index_q step at M3's 4
 * heads and 8 of an index_k step, each token a double sincos in a row on the step's one warp;
 * one token a step puts them on more warps, the same total rows. H200, fused fp8 sparse +
 * index T = 64: 7.9 -> 6.5 us; docs/gpu-log/rope.md) */
static int qw_rps(int nh) {
    int r = nh < QW_RPS ? nh : QW_RPS;
    while (nh % r) r--;
    return r;
}
/* The parts of a pass, in row order; a part with x == NULL is left out. */
typedef struct {
    void *x;
    int ld, nh, dim;
    const m3_bf16 *w; /* norm weight [dim]; NULL: no norm, no rope */
    int cache;        /* SEG_* */
} part;

/* fp8 elements in the cache (paged: the geometry's) */
static bool cache_fp8(const m3_gpu_kv_cache *c) {
    return c->paged ? c->paged->g.elem == M3_KV_FP8 : c->fp8;
}

template <typename TS>
static m3_status launch_tiles(m3_gpu *g, const part *parts, int n_parts, const m3_gpu_kv_cache *c,
                              const int64_t *d_slots, const int32_t *d_pos, int n_tok, float eps,
                              int rot_dim, float theta, const m3_profile *p, const float *cst_in) {
    M3_ASSERT(g && p && n_tok >= 0);
    M3_ASSERTF(rot_dim >= 0 && rot_dim % 2 == 0, "R=%d", rot_dim);
    if (rot_dim / 2 > ROPE_MAX_HALF)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu qk_norm_rope: rot_dim %d > %d", rot_dim,
                         2 * ROPE_MAX_HALF);
    qkv_args a;
    memset(&a, 0, sizeof a);
    const int VN = 16 / (int)sizeof(TS), es = (int)sizeof(TS);
    /* 256 rows per block; 128 for the bf16 K/V writer (no normed part: 47% of copy against
     * 34% at T=4096, the same at 32K); normed passes lose 1-9 points with 128, the fp8 writer
     * ~15% */
    bool any_normed = false;
    for (int i = 0; i < n_parts; i++) any_normed = any_normed || (parts[i].x && parts[i].w);
    const int nt = any_normed || (c && cache_fp8(c)) ? 256 : 128;
    bool vec = true, roped = false, fast = true;
    for (int i = 0; i < n_parts; i++) {
        const part &q = parts[i];
        if (!q.x || (!q.w && q.cache == SEG_NONE)) continue;
        M3_ASSERTF(q.nh > 0 && q.dim > 0 && q.ld >= q.nh * q.dim, "part %d: heads=%d dim=%d ld=%d", i,
                   q.nh, q.dim, q.ld);
        if (q.nh > nt)
            return m3_errorf(M3_ERR_UNSUPPORTED, "gpu qk_norm_rope: %d heads > %d per block", q.nh, nt);
        qkv_seg &s = a.seg[a.nseg++];
        memset(&s, 0, sizeof s);
        s.x = q.x, s.ld = q.ld, s.nh = q.nh, s.dim = q.dim, s.cache = q.cache, s.w = q.w;
        if (q.w) {
            M3_ASSERTF(rot_dim <= q.dim, "R=%d > head dim %d", rot_dim, q.dim);
            roped = true;
            s.stage = q.cache == SEG_K && c && cache_fp8(c) && c->k_src != M3_GPU_KQ_STORED;
        }
        fast = fast && q.dim == 128;
        vec = vec && q.dim % VN == 0 && q.ld % VN == 0 && m3_aligned16(q.x);
    }
    if (n_tok == 0 || a.nseg == 0) return M3_OK;
    const int half = roped ? rot_dim / 2 : 0;
    M3_ASSERT(half == 0 || d_pos);
    fast = fast && (half == 32 || !roped);
    a.vec = vec;
    a.n_tok = n_tok, a.pos = d_pos, a.slots = d_slots, a.eps = eps, a.nt = nt;
    a.half = half;
    a.angle_f64 = p->rope_angle == M3_ROPE_ANGLE_F64;
    a.cs_bf16 = p->rope_cs_bf16;
    if (half > 0) rope_inv_freq(a.inv.inv, rot_dim, theta, p->rope_inv);
    if (c) {
        a.irow0 = c->index_row0;
        a.ibt = c->index_bt, a.ibt_block = c->index_block;
        a.page = c->page, a.fp8 = c->fp8, a.fp8_max = c->fp8_max, a.kind = (int)c->kind;
        a.ovf = (int)c->ovf, a.k_src = (int)c->k_src, a.kc = c->k, a.vc = c->v, a.ks = c->k_scale;
        a.vs = c->v_scale, a.ic = c->index_k, a.ifp8 = c->index_fp8;
        if (c->paged) { /* ref's storage: the page-128 / 16 paths where its layout is theirs */
            const m3_gpu_attn_paged_src *ps = c->paged;
            const m3_kv_geom &kg = ps->g;
            a.fp8 = kg.elem == M3_KV_FP8, a.kind = (int)kg.fp8_kind;
            a.kc = (void *)ps->k, a.vc = (void *)ps->v;
            a.ks = (float *)ps->k_scale, a.vs = (float *)ps->v_scale;
            a.bt = ps->bt, a.bt_block = kg.block;
            const int x = a.fp8 ? 16 : 8;
            const bool blk = ps->view == M3_KV_VIEW_BLOCK;
            const bool fit = kg.head_dim % x == 0 &&
                             ((blk && kg.block == 128 && kg.v_stride == kg.v_block_dense) ||
                              (!blk && kg.page == 16 && kg.block % 16 == 0 &&
                               kg.v_stride == (int64_t)(kg.block / 16) * kg.v_page));
            if (fit) {
                a.page = blk ? 128 : 16;
            } else {
                a.geo = true, a.geom = kg, a.view = ps->view;
                a.page = 1; /* not plain rows */
            }
        }
        a.lpage = a.page == 128 ? 7 : a.page == 16 ? 4 : 0;
        a.hwcvt = a.kind == (int)M3_FP8_E4M3FN && c->ovf == M3_FP8_SATURATE;
    }
#if defined(M3_HIP_NVIDIA)
    {   /* auto: prefetch, except passes with staged fp8 K (their tiles cost several times the
         * others: the hardware's dynamic block order balances them better than the fixed tile
         * order of persistent blocks; H200: fused fp8 sparse T=16384 48% of copy without,
         * 38% with the prefetch; docs/gpu-log/rope.md) */
        bool staged = false;
        for (int s = 0; s < a.nseg; s++) staged = staged || a.seg[s].stage;
        a.pipe = !staged;
    }
#endif
    const int nbuf = a.pipe ? 2 : 1;
    const int budget = (a.pipe ? 110 : 80) * 1024;
    /* tokens per tile: as many as the rows allow (V: a multiple of 16, whole x-groups),
     * fewer while the block's shared memory is over budget */
    for (int s = 0; s < a.nseg; s++) {
        qkv_seg &q = a.seg[s];
        int tt = nt / q.nh;
        if (q.cache == SEG_V && tt >= 16) tt -= tt % 16;
        if (tt > n_tok) tt = n_tok;
        for (;; tt = tt > 16 ? (tt - 1) / 16 * 16 : tt - 1) {
            const qkv_lay l = qkv_layout(tt, q.nh, q.dim, es, half, q.w != NULL, q.stage, fast);
            if (nbuf * l.buf + l.com <= budget || tt == 1) break;
        }
        q.tt = tt;
    }
    /* small passes: fewer tokens per block until the grid has min_blk blocks per SM (one
     * block per SM cannot keep enough bytes in flight); V keeps whole 16-token groups */
    const int min_blk = 4 * (g->n_sm > 0 ? g->n_sm : 132);
    for (;;) {
        int nblk = 0, big = -1;
        for (int s = 0; s < a.nseg; s++) {
            const qkv_seg &q = a.seg[s];
            nblk += (n_tok + q.tt - 1) / q.tt;
            const int lo = q.cache == SEG_V ? 16 : 1;
            if (q.tt / 2 >= lo && (big < 0 || q.tt * q.nh > a.seg[big].tt * a.seg[big].nh)) big = s;
        }
        if (nblk >= min_blk || big < 0) break;
        a.seg[big].tt /= 2;
    }
    int nblk = 0, bufb = 0, comb = 0;
    for (int s = 0; s < a.nseg; s++) {
        qkv_seg &q = a.seg[s];
        const qkv_lay l = qkv_layout(q.tt, q.nh, q.dim, es, half, q.w != NULL, q.stage, fast);
        q.b0 = nblk;
        nblk += (n_tok + q.tt - 1) / q.tt;
        bufb = l.buf > bufb ? l.buf : bufb;
        comb = l.com > comb ? l.com : comb;
    }
    a.nblk = nblk;
    a.buf = bufb;
    a.common = nbuf * bufb;
    const int shmem = a.common + comb;
    if (shmem > QKV_MAX_SHMEM)
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu qk_norm_rope: %d bytes of shared memory per block",
                         shmem);
    void (*k)(qkv_args);
#define QKV_PICK(QR) (fast ? qkv_k<TS, QR, true> : qkv_k<TS, QR, false>)
    if (p->qk_round == M3_QK_ROUND_PER_OP) k = QKV_PICK(M3_QK_ROUND_PER_OP);
    else if (p->qk_round == M3_QK_ROUND_ONCE) k = QKV_PICK(M3_QK_ROUND_ONCE);
    else k = QKV_PICK(M3_QK_ROUND_NONE);
#undef QKV_PICK
    if (shmem > 48 * 1024) /* above 48 KiB a kernel must opt in */
        M3_HIP_TRY(hipFuncSetAttribute((const void *)k, hipFuncAttributeMaxDynamicSharedMemorySize,
                                       shmem));
    int grid = nblk;
    if (a.pipe) { /* persistent: as many blocks as fit at once, each walks its tiles */
        int occ = 0;
#if defined(M3_HIP_NVIDIA)
        M3_HIP_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, nt, (size_t)shmem));
#endif
        const int fit = (occ > 0 ? occ : 1) * (g->n_sm > 0 ? g->n_sm : 132);
        grid = nblk < fit ? nblk : fit;
    }
    /* cos/sin once per token (a table launch) when the pass has enough tokens; small passes
     * (decode) evaluate them per tile and save the launch */
    const size_t mark = m3_gpu_mark(g);
    const size_t tab_bytes = (size_t)n_tok * 2 * half * sizeof(float);
    if (half > 0 && cst_in) {
        a.cst = cst_in;
    } else if (half > 0 && n_tok >= 256 &&
        g->arena_top + tab_bytes + 256 <= g->arena_cap) { /* else: per tile, as small passes */
        float *tab;
        M3_TRY(m3_gpu_alloc(g, (void **)&tab, tab_bytes));
        cs_table_k<<<m3_grid_1d((int64_t)n_tok * half, 256), 256, 0, g->stream>>>(tab, d_pos, n_tok, half, a.inv,
                                                                 a.angle_f64, a.cs_bf16);
        M3_LAUNCHED(g, "cs_table_k");
        a.cst = tab;
    }
    k<<<(unsigned)grid, (unsigned)nt, (size_t)shmem, g->stream>>>(a);
    /* the table is read by this launch only: later arena users are on the same stream */
    m3_gpu_release(g, mark);
    M3_LAUNCHED(g, "qkv_k");
    return M3_OK;
}

/* The pass: parts the warp-streaming kernels take (bf16 rows of Dh 128, 16-byte aligned;
 * normed parts without a cache write; raw K / V rows into a page-128 / 16 / plain cache)
 * go there, the rest to the tile kernel, all with one cos/sin table. */
template <typename TS>
static m3_status launch(m3_gpu *g, const part *parts, int n_parts, const m3_gpu_kv_cache *c,
                        const int64_t *d_slots, const int32_t *d_pos, int n_tok, float eps,
                        int rot_dim, float theta, const m3_profile *p) {
    /* passes under 256 tokens (decode; session 8): ONE launch without a table, qw_norm_k's
     * small form (cos / sin per row; fp8 V rows as a part, bf16 V rows as kvw_k's window steps
     * in the same grid), or the K / V writer alone (kvw8_k / kvw_k). H200: fused fp8 sparse +
     * index T=1 18.3 -> 8.6 us, the fp8 writer T=64 10.1 -> 7.7 us (docs/gpu-log/rope.md) */
    const bool small = n_tok < 256;
    if (sizeof(TS) != 2 || (rot_dim != 0 && rot_dim != 64))
        return launch_tiles<TS>(g, parts, n_parts, c, d_slots, d_pos, n_tok, eps, rot_dim, theta, p, NULL);
    M3_ASSERT(g && p);
    kvw_args kv;
    memset(&kv, 0, sizeof kv);
    bool kv_ok = false;
    if (c) {
        kv.page = c->page, kv.fp8 = c->fp8, kv.fp8_max = c->fp8_max, kv.kind = (int)c->kind;
        kv.ovf = (int)c->ovf, kv.dst[0] = c->k, kv.dst[1] = c->v, kv.scl[0] = c->k_scale;
        kv.scl[1] = c->v_scale, kv.slots = d_slots;
        kv_ok = !c->paged;
        if (c->paged) {
            const m3_gpu_attn_paged_src *ps = c->paged;
            const m3_kv_geom &kg = ps->g;
            kv.fp8 = kg.elem == M3_KV_FP8, kv.kind = (int)kg.fp8_kind;
            kv.dst[0] = (void *)ps->k, kv.dst[1] = (void *)ps->v;
            kv.scl[0] = (float *)ps->k_scale, kv.scl[1] = (float *)ps->v_scale;
            kv.bt = ps->bt, kv.bt_block = kg.block, kv.pos = d_pos, kv.slots = NULL;
            const int x = kv.fp8 ? 16 : 8;
            const bool blk = ps->view == M3_KV_VIEW_BLOCK;
            kv_ok = kg.head_dim % x == 0 &&
                    ((blk && kg.block == 128 && kg.v_stride == kg.v_block_dense) ||
                     (!blk && kg.page == 16 && kg.block % 16 == 0 &&
                      kg.v_stride == (int64_t)(kg.block / 16) * kg.v_page));
            kv.page = blk ? 128 : 16;
        }
        kv.lpage = kv.page == 128 ? 7 : kv.page == 16 ? 4 : 0;
        kv.hwcvt = kv.kind == (int)M3_FP8_E4M3FN && c->ovf == M3_FP8_SATURATE;
    }
    part rest[QKV_NSEG];
    int nrest = 0;
    qw_args qa;
    memset(&qa, 0, sizeof qa);
    qa.eps = eps;
    bool rope = false;
    for (int i = 0; i < n_parts; i++) {
        const part &q = parts[i];
        const bool fit16 = q.x && q.dim == 128 && q.ld % 8 == 0 && m3_aligned16(q.x) &&
                           (int64_t)n_tok * q.nh < ((int64_t)1 << 30);
        if (fit16 && q.w &&
            (q.cache == SEG_NONE || (q.cache == SEG_K && kv_ok) || (q.cache == SEG_IDX && c && c->index_k)) &&
            qa.np < 5) {
            qw_part &w = qa.p[qa.np++];
            w.x = (m3_bf16 *)q.x, w.w = q.w, w.ld = q.ld, w.nh = q.nh;
            w.kc = q.cache == SEG_K;
            w.ic = q.cache == SEG_IDX;
            if (w.kc) kv.nh = q.nh;
            w.rows = n_tok * q.nh;
            w.s0 = qa.nstep;
            w.rps = small ? qw_rps(q.nh) : QW_RPS;
            qa.nstep += (w.rows + w.rps - 1) / w.rps;
            rope = rope || rot_dim > 0;
        } else if (fit16 && !q.w && kv_ok && q.cache == SEG_V && small && kv.fp8 && !kv.x[0] &&
                   qa.np > 0 && qa.np < 5) {
            /* small passes: fp8 V rows as a part of the same launch (4 lanes a row as the normed
             * rows; qw_kstore's code for K, the codes stored byte by byte into the V layout:
             * a decode pass's tokens are of different sequences, so there are no 16-token
             * windows to write as chunks; H200, fused sparse T=1: 8.6 us against 11.6 with
             * kvw8_k's window steps in the grid, whose code is 174 KB: instruction fetch
             * stalls, ncu) */
            qw_part &w = qa.p[qa.np++];
            w.x = (m3_bf16 *)q.x, w.w = NULL, w.ld = q.ld, w.nh = q.nh;
            w.vc = true;
            kv.nh = q.nh;
            w.rows = n_tok * q.nh;
            w.s0 = qa.nstep;
            /* one row a step up to 64 tokens (M3's 4 heads: a grid of 120 blocks, still one
             * wave), one token's rows above: the V rows' byte stores (a row's 128 dims are 128
             * bytes 16 apart) of 8 warps an SM were their longest phase (H200, T = 64: 4539 ->
             * 3178 clocks, the step 8.1-8.2 -> 7.6-7.8 us in one batch; docs/gpu-log/rope.md) */
            w.rps = n_tok <= 64 ? 1 : qw_rps(q.nh);
            qa.nstep += (w.rows + w.rps - 1) / w.rps;
        } else if (fit16 && !q.w && kv_ok && (q.cache == SEG_K || q.cache == SEG_V)) {
            const int w = q.cache == SEG_K ? 0 : 1;
            kv.x[w] = (const m3_bf16 *)q.x, kv.ld[w] = q.ld, kv.nh = q.nh;
        } else if (q.x) {
            rest[nrest++] = q;
        }
    }
    const size_t mark = m3_gpu_mark(g);
    const float *cst = NULL;
    if (rope && !small) {
        const size_t tab_bytes = (size_t)n_tok * 64 * sizeof(float);
        if (g->arena_top + tab_bytes + 256 > g->arena_cap) /* no room: the tile kernel alone */
            return launch_tiles<TS>(g, parts, n_parts, c, d_slots, d_pos, n_tok, eps, rot_dim, theta, p, NULL);
        M3_ASSERT(d_pos);
        rope_inv_table inv;
        rope_inv_freq(inv.inv, rot_dim, theta, p->rope_inv);
        float *tab;
        M3_TRY(m3_gpu_alloc(g, (void **)&tab, tab_bytes));
        cs_table_k<<<m3_grid_1d((int64_t)n_tok * 32, 256), 256, 0, g->stream>>>(
            tab, d_pos, n_tok, 32, inv, p->rope_angle == M3_ROPE_ANGLE_F64, p->rope_cs_bf16);
        M3_LAUNCHED(g, "cs_table_k");
        cst = tab;
    }
    const int n_sm = g->n_sm > 0 ? g->n_sm : 132;
    /* Programmatic dependent launches (NVIDIA): qw_norm_k after the table launch (its rows'
     * first loads and the weights before m3_pdl_wait), the K / V writer after qw_norm_k (it
     * reads nothing qw_norm_k writes; it fills the SMs as qw_norm_k's blocks finish, and its
     * blocks wait for qw_norm_k at their end, so the pass ends when both have). Session 7,
     * H200: qkv_cache T=4096 62.9 -> 70.7% of copy (the table's launch and kvw_k's own ramp
     * and tail were ~6 us each); the V writer launched before qw_norm_k instead (concurrent
     * with the table) measured 61.9%. */
    bool prev = cst != NULL; /* the stream's last launch is this pass's */
    /* the raw K / V rows: kvw8_k (fp8: 16 tokens a step, K and V; step numbers are 32-bit;
     * passes under 256 tokens kvw8s_k, M3_WARP / 8 tokens a step) or kvw_k (bf16: 4 tokens a
     * K step, 8-token V windows) */
    /* the K / V writer's steps: kvw8_k's 16 tokens of one head (fp8), kvw_k's M3_WARP / 8
     * tokens (K) and 8-token windows (V) (bf16) */
    kvw_args kl = kv;
    kl.n_tok = n_tok;
    /* kvw8_k's tokens a step: 8 for the writer alone (no normed parts) where that grid fits one
     * wave at its 4 blocks an SM, else K8_T (see k8_step) */
    int t8 = K8_T;
    if (kl.fp8 && qa.np == 0) {
        kvw_args k8 = kl;
        kv_steps(k8, 8, 8);
        if ((k8.nstep + KW_WPB - 1) / KW_WPB <= (int64_t)4 * n_sm) t8 = 8;
    }
    kv_steps(kl, kl.fp8 ? t8 : M3_WARP / 8, kl.fp8 ? t8 : 8);
    if (kl.fp8 && kl.nstep >= ((int64_t)1 << 31)) {
        m3_gpu_release(g, mark);
        return m3_errorf(M3_ERR_UNSUPPORTED, "gpu kv cache write: %d tokens x %d heads of fp8 "
                         "rows (more than 2^31 steps)", n_tok, kl.nh);
    }
    /* the writer is a programmatic dependent launch: after qw_norm_k, or (session 16) launched
     * alone, of whatever launch is before it (kw_enter: pre) */
    auto kv_launch = [&]() -> m3_status {
        kvw_args ka = kl;
        ka.pre = !prev;
        prev = true;
        if (ka.fp8 && n_tok < 256 && ka.page != 0) {
            /* decode passes: kvw8s_k, M3_WARP / 8 tokens a step, K and V */
            kv_steps(ka, M3_WARP / 8, 0);
            M3_TRY(m3_gpu_launch_pdl(g, true, kvw8s_k, (unsigned)((ka.nstep + KW_WPB - 1) / KW_WPB), KW_WPB * M3_WARP, 0, ka));
            M3_LAUNCHED(g, "kvw8s_k");
        } else if (ka.fp8) {
            const int64_t nb8 = (ka.nstep + KW_WPB - 1) / KW_WPB;
            if (t8 == 8) M3_TRY(m3_gpu_launch_pdl(g, true, kvw8_k<8>, (unsigned)nb8, KW_WPB * M3_WARP, 0, ka));
            else M3_TRY(m3_gpu_launch_pdl(g, true, kvw8_k<K8_T>, (unsigned)nb8, KW_WPB * M3_WARP, 0, ka));
            M3_LAUNCHED(g, "kvw8_k");
        } else {
            M3_TRY(m3_gpu_launch_pdl(g, true, kvw_k, (unsigned)((ka.nstep + KW_WPB - 1) / KW_WPB), KW_WPB * M3_WARP, 0, ka));
            M3_LAUNCHED(g, "kvw_k");
        }
        return M3_OK;
    };
    const bool has_kv = kv.x[0] || kv.x[1];
    if (qa.np > 0) {
        qa.cst = cst;
        qa.kv = kv;
        qa.k_src = c ? (int)c->k_src : 0;
        if (c) qa.ic = c->index_k, qa.ifp8 = c->index_fp8, qa.irow0 = c->index_row0;
        if (c && c->index_bt) qa.ibt = c->index_bt, qa.ibt_block = c->index_block, qa.ipos = d_pos;
        bool cp = false;
        for (int i = 0; i < qa.np; i++) cp = cp || qa.p[i].kc || qa.p[i].ic || qa.p[i].vc;
        const int kck = !cp ? 0 : kv.fp8 ? 2 : 1;
        void (*k)(qw_args);
        if (small) {
            /* one launch: the normed rows' steps, then bf16 raw K / V rows' (kl) steps; other
             * raw rows (fp8 K without its norm: no layer makes them) take the tile kernel */
            const int vs = !has_kv ? 0 : kl.fp8 ? -1 : 1;
            if (vs < 0 || (vs == 1 && kck != 1)) {
                m3_gpu_release(g, mark);
                return launch_tiles<TS>(g, parts, n_parts, c, d_slots, d_pos, n_tok, eps, rot_dim, theta, p, NULL);
            }
            qa.rope = rope;
            qa.pos = d_pos;
            qa.angle_f64 = p->rope_angle == M3_ROPE_ANGLE_F64;
            qa.cs_bf16 = p->rope_cs_bf16;
            if (rope) {
                M3_ASSERT(d_pos);
                rope_inv_table inv;
                rope_inv_freq(inv.inv, rot_dim, theta, p->rope_inv);
                memcpy(qa.inv, inv.inv, sizeof qa.inv);
            }
            qa.kv = kl;
#define QW_PICK(QR) (kck == 0 ? qw_norm_k<QR, 0, 0> : vs == 1 ? qw_norm_k<QR, 1, 1> \
                                : kck == 1 ? qw_norm_k<QR, 1, 0> : qw_norm_k<QR, 2, 0>)
            if (p->qk_round == M3_QK_ROUND_PER_OP) k = QW_PICK(M3_QK_ROUND_PER_OP);
            else k = QW_PICK(M3_QK_ROUND_ONCE);
#undef QW_PICK
            const int64_t nst = qa.nstep + (vs ? kl.nstep : 0);
            M3_TRY(m3_gpu_launch_pdl(g, true, k, (unsigned)((nst + QW_WPB - 1) / QW_WPB), QW_WPB * M3_WARP, 0, qa));
            M3_LAUNCHED(g, "qw_norm_k (small)");
            m3_status st = M3_OK;
            if (nrest > 0)
                st = launch_tiles<TS>(g, rest, nrest, c, d_slots, d_pos, n_tok, eps, rot_dim, theta, p, NULL);
            m3_gpu_release(g, mark);
            return st;
        }
#define QW_PICK(QR) (kck == 0 ? qw_norm_k<QR, 0, -1> : kck == 1 ? qw_norm_k<QR, 1, -1> : qw_norm_k<QR, 2, -1>)
        if (p->qk_round == M3_QK_ROUND_PER_OP) k = QW_PICK(M3_QK_ROUND_PER_OP);
        else k = QW_PICK(M3_QK_ROUND_ONCE);
#undef QW_PICK
        int occ = 0;
#if defined(M3_HIP_NVIDIA)
        M3_HIP_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, QW_WPB * M3_WARP, 0));
#endif
        const int64_t need = (qa.nstep + QW_WPB - 1) / QW_WPB;
        const int64_t fit = (int64_t)(occ > 0 ? occ : 4) * n_sm;
        M3_TRY(m3_gpu_launch_pdl(g, prev, k, (unsigned)(need < fit ? need : fit), QW_WPB * M3_WARP, 0, qa));
        M3_LAUNCHED(g, "qw_norm_k");
        prev = true;
    }
    if (has_kv) {
        const m3_status e = kv_launch();
        if (e != M3_OK) {
            m3_gpu_release(g, mark);
            return e;
        }
    }
    m3_status st = M3_OK;
    if (nrest > 0)
        st = launch_tiles<TS>(g, rest, nrest, c, d_slots, d_pos, n_tok, eps, rot_dim, theta, p, cst);
    m3_gpu_release(g, mark);
    return st;
}

/* Cache contract shared with gpu/kvcache.hip's m3_gpu_kv_cache_write. */
static m3_status check_cache(const m3_gpu_kv_cache *c, int n_kv_head, int head_dim, bool has_ik,
                             bool has_kv) {
    if (c->index_k && !has_ik)
        return m3_errorf(M3_ERR_ARG, "gpu kv cache write: index cache needs index_k rows");
    if (c->paged) {
        const m3_gpu_attn_paged_src *ps = c->paged;
        if (has_kv && (ps->g.elem == M3_KV_F32 || ps->g.n_kv != n_kv_head || ps->g.head_dim != head_dim))
            return m3_errorf(M3_ERR_UNSUPPORTED, "gpu kv cache write: paged storage of %s elements, "
                             "Hkv %d, Dh %d for rows of Hkv %d, Dh %d (needs bf16 / fp8 and the "
                             "same heads)", ps->g.elem == M3_KV_F32 ? "fp32" : "bf16/fp8",
                             ps->g.n_kv, ps->g.head_dim, n_kv_head, head_dim);
        if (has_kv && ps->g.elem == M3_KV_FP8 && (!ps->k_scale || !ps->v_scale || !(c->fp8_max > 0.0f)))
            return m3_errorf(M3_ERR_ARG, "gpu kv cache write: fp8 paged storage needs scales and fp8_max");
        M3_ASSERT(ps->bt && (!has_kv || (ps->k && ps->v)));
        return M3_OK;
    }
    const int x = c->fp8 ? 16 : 8;
    if ((c->page != 128 && c->page != 16 && c->page != 0) || (has_kv && head_dim % x))
        return m3_errorf(M3_ERR_UNSUPPORTED,
                         "gpu kv cache write: page %d, head_dim %d (needs page 128, 16 or 0, "
                         "head_dim %% %d == 0)", c->page, head_dim, x);
    if (has_kv && c->fp8 && (c->page == 0 || !c->k_scale || !c->v_scale || !(c->fp8_max > 0.0f)))
        return m3_errorf(M3_ERR_ARG, "gpu kv cache write: fp8 cache needs page 128 or 16, "
                         "scales and fp8_max");
    M3_ASSERT(!has_kv || (c->k && c->v));
    return M3_OK;
}

extern "C" m3_status m3_gpu_qk_norm_rope_cache(m3_gpu *g, const m3_gpu_qkv *x,
                                               const m3_gpu_kv_cache *c, const int64_t *d_slots,
                                               const int32_t *d_pos, int n_tok, float eps,
                                               int rot_dim, float theta, const m3_profile *p) {
    M3_ASSERT(g && x && p);
    if (p->qk_round == M3_QK_ROUND_NONE)
        return m3_errorf(M3_ERR_UNSUPPORTED,
                         "gpu qk_norm_rope_cache: profile %s keeps fp32 q/k (bf16 storage only)",
                         p->name);
    /* K and V written when the cache has K/V storage and the call has rows for it; without
     * (a second call for the indexer's parts, or a cache of index keys only) k is only normed */
    const bool kvw = c && (c->paged || c->k) && (x->k || x->v);
    if (c) {
        if ((kvw && (!x->k || !x->v)) || (!kvw && !c->index_k))
            return m3_errorf(M3_ERR_ARG, "gpu qk_norm_rope_cache: a cache write needs k and v "
                             "(or neither, and an index cache)");
        M3_TRY(check_cache(c, x->n_kv_head, x->head_dim, x->index_k != NULL, kvw));
        if ((c->paged || (c->index_k && c->index_bt)) && !d_pos)
            return m3_errorf(M3_ERR_ARG, "gpu qk_norm_rope_cache: a paged cache needs the positions");
        M3_ASSERT(!c->index_bt || c->index_block > 0);
        if (kvw && !c->paged && !d_slots)
            return m3_errorf(M3_ERR_ARG, "gpu qk_norm_rope_cache: K/V writes need slots (or paged)");
        if (kvw && cache_fp8(c) && c->k_src != M3_GPU_KQ_STORED && !x->k_norm)
            return m3_errorf(M3_ERR_ARG, "gpu qk_norm_rope_cache: fp8 K from the fp32 k needs "
                             "the k norm (no fp32 k exists otherwise)");
    }
    const part parts[] = {
        {x->q, x->ld_q, x->n_head, x->head_dim, x->q_norm, SEG_NONE},
        {x->k, x->ld_k, x->n_kv_head, x->head_dim, x->k_norm, kvw ? SEG_K : SEG_NONE},
        {(void *)x->v, x->ld_v, x->n_kv_head, x->head_dim, NULL, kvw ? SEG_V : SEG_NONE},
        {x->index_q, x->ld_iq, x->n_index_head, x->index_dim, x->index_q_norm, SEG_NONE},
        {x->index_k, x->ld_ik, 1, x->index_dim, x->index_k_norm,
         c && c->index_k ? SEG_IDX : SEG_NONE},
    };
    return launch<m3_bf16>(g, parts, 5, c, d_slots, d_pos, n_tok, eps, rot_dim, theta, p);
}

extern "C" m3_status m3_gpu_qk_norm_rope(m3_gpu *g, m3_bf16 *d_x, int ld, const int32_t *d_pos,
                                         int n_tok, int n_head, int head_dim, const m3_bf16 *d_w,
                                         float eps, int rot_dim, float theta,
                                         const m3_profile *p) {
    if (p->qk_round == M3_QK_ROUND_NONE)
        return m3_errorf(M3_ERR_UNSUPPORTED,
                         "gpu qk_norm_rope: profile %s keeps fp32 q/k: use the _f32 path",
                         p->name);
    M3_ASSERT(d_x && d_w);
    const part q = {d_x, ld, n_head, head_dim, d_w, SEG_NONE};
    return launch<m3_bf16>(g, &q, 1, NULL, NULL, d_pos, n_tok, eps, rot_dim, theta, p);
}

extern "C" m3_status m3_gpu_qk_norm_rope_f32(m3_gpu *g, float *d_x, int ld, const int32_t *d_pos,
                                             int n_tok, int n_head, int head_dim,
                                             const m3_bf16 *d_w, float eps, int rot_dim,
                                             float theta, const m3_profile *p) {
    M3_ASSERT(d_x && d_w);
    const part q = {d_x, ld, n_head, head_dim, d_w, SEG_NONE};
    return launch<float>(g, &q, 1, NULL, NULL, d_pos, n_tok, eps, rot_dim, theta, p);
}

/* gpu/kvcache.hip's entry: the same kernel, K and V rows copied (no norm). */
m3_status m3_gpu_kv_write_rows_(m3_gpu *g, const m3_gpu_kv_cache *c, const m3_bf16 *d_k, int ld_k,
                                const m3_bf16 *d_v, int ld_v, const int64_t *d_slots, int n_tok,
                                int n_kv_head, int head_dim) {
    if (c->paged)
        return m3_errorf(M3_ERR_ARG, "gpu kv_cache_write: paged storage needs the positions "
                         "(m3_gpu_qk_norm_rope_cache)");
    M3_TRY(check_cache(c, n_kv_head, head_dim, false, true));
    if (c->fp8 && c->k_src != M3_GPU_KQ_STORED)
        return m3_errorf(M3_ERR_ARG, "gpu kv_cache_write: only the stored k can be quantized "
                         "here (the fp32 k exists only in m3_gpu_qk_norm_rope_cache)");
    if (c->index_k)
        return m3_errorf(M3_ERR_ARG, "gpu kv_cache_write: no index rows to write");
    const part parts[] = {
        {(void *)d_k, ld_k, n_kv_head, head_dim, NULL, SEG_K},
        {(void *)d_v, ld_v, n_kv_head, head_dim, NULL, SEG_V},
    };
    m3_profile pr; /* no part is normed or roped: only its presence matters */
    memset(&pr, 0, sizeof pr);
    return launch<m3_bf16>(g, parts, 2, c, d_slots, NULL, n_tok, 0.0f, 0, 1.0f, &pr);
}
