/* ref/linear.h: linear layers y = x W^T, the only door to cblas (ref/linear.c).
 *
 * Math:   y[t,n] = sum_k x[t,k] * W[n,k]          (no bias: the text model has none, §3.3)
 * Shapes: x [T, K] (row pitch ldx >= K), W [N, K] row-major as stored ([out, in]),
 *         y [T, N] (row pitch ldy >= N). T tokens, K = n_in, N = n_out.
 * Numerics: fp32 accumulation, NO rounding of y (the caller's profile rounds: see
 *   m3_linear_p). bf16 weights are converted exactly to fp32 in tiles of M3_LINEAR_TILE_N
 *   output rows x M3_LINEAR_TILE_K inputs and multiplied with cblas_sgemm (OpenBLAS pinned to
 *   one thread; our threads take whole output-row tiles). The K reduction is never split
 *   across threads and the tile grid does not depend on the thread count, so y is
 *   bit-identical for any thread count. The order is OpenBLAS's (kernel dependent; K is
 *   accumulated tile by tile into y). With T <= M3_LINEAR_SMALL_T each output is
 *   m3_dot_f32's fixed 8-lane order instead (the path depends on T only). M3_NAIVE_GEMM=1 (read at each call) selects plain
 *   loops instead: sum over k = 0..K-1 in index order in fp32, for bit-exact tests.
 *   With integer-valued inputs whose partial sums stay below 2^24 both paths are exact.
 * Aliasing: y must not alias x or W.
 * docs/numerics.md §3.3. */
#ifndef M3_LINEAR_H
#define M3_LINEAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"
#include "ref/num/bf16.h"
#include "ref/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

#define M3_LINEAR_TILE_N 64  /* output rows of W per tile (one tile = one thread task) */
#define M3_LINEAR_TILE_K 1024 /* input columns converted per step (fits L2 with x's block) */
#define M3_LINEAR_SMALL_T 4   /* T <= this: streamed dot products (m3_dot_f32 order), no
                                 sgemm: the GEMM is bound by reading W */

/* Weight formats a component can take. Only the formats listed are implemented; MX/fp8
 * expert weights will add entries (and their dequant in ref/quant) with the quant issue. */
typedef enum {
    M3_WFMT_BF16 = 0, /* m3_bf16 [N, K] (checkpoint storage) */
    M3_WFMT_F32 = 1   /* float [N, K] (fp32 router / converted tensors) */
} m3_wfmt;

/* A borrowed weight matrix view: data points into the weights mmap or a caller buffer. */
typedef struct m3_wmat {
    m3_wfmt fmt;
    const void *data; /* borrowed; [n_out, n_in] row-major */
    int n_out, n_in;
} m3_wmat;

/* y = x W^T, bf16 W. fp32 result, not rounded. */
void m3_linear(float *y, const float *x, const m3_bf16 *w, int n_tok, int n_in, int n_out);

/* Same with row pitches (views into packed rows, e.g. the q|k|v|index_q|index_k row). */
void m3_linear_ld(float *y, int ldy, const float *x, int ldx, const m3_bf16 *w, int n_tok,
                  int n_in, int n_out);

/* y = x W^T with an fp32 W. w_as_bf16: each W element is first rounded to bf16 (a gate held
 * in bf16 while the checkpoint stores fp32: router_dtype=bf16). Not rounded on output. */
void m3_linear_f32(float *y, int ldy, const float *x, int ldx, const float *w, bool w_as_bf16,
                   int n_tok, int n_in, int n_out);

/* y = x W^T for any m3_wmat (dispatch on fmt), then the profile's GEMM-output rounding:
 * y = bf16(y) when p->act_bf16. This is what the model wiring calls for every projection. */
void m3_linear_p(float *y, int ldy, const float *x, int ldx, const m3_wmat *w, int n_tok,
                 const m3_profile *p);

/* The reference dot product used by attention and the indexer (not by the GEMMs):
 * 8 interleaved fp32 partial sums (lane l takes i = l, l+8, ... in order), the tail
 * (i >= n - n%8) goes to lane i%8 as well, then ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)).
 * A fixed order, so results are reproducible; it lets the compiler use SIMD. */
float m3_dot_f32(const float *a, const float *b, int n);

/* True when M3_NAIVE_GEMM=1 is set in the environment (read at each call). */
bool m3_linear_naive(void);

/* FLOPs of a linear: 2*T*K*N (for benchmarks). */
static inline double m3_linear_flops(int n_tok, int n_in, int n_out) {
    return 2.0 * (double)n_tok * (double)n_in * (double)n_out;
}

/* Plain cblas_sgemm C[M,N] = A[M,K] * B[N,K]^T (fp32, row-major) with OpenBLAS threads as
 * configured by m3_blas_threads(): for the benchmark's ceiling only. */
void m3_sgemm_nt(float *c, const float *a, const float *b, int m, int n, int k);
/* Set OpenBLAS's own thread count (the linear paths always reset it to 1). */
void m3_blas_threads(int n);

#ifdef __cplusplus
}
#endif
#endif
