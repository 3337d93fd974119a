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
#include "ref/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

#define M3_LINEAR_TILE_N 64  /* output rows of W per tile (one tile = one thread task) */
#define M3_LINEAR_TILE_K 1024 /* input columns converted per step (fits L2 with x's block) */
#define M3_LINEAR_SMALL_T 4   /* T <= this: streamed dot products (m3_dot_f32 order), no
                                 sgemm: the GEMM is bound by reading W */

/* Weight formats a component can take (docs/quantization.md). Quantized formats are decoded
 * exactly to fp32 tile by tile inside the GEMM (ref/num/mx.h, ref/num/fp8.h): the GEMM sees
 * the same fp32 values as a dense weight holding the dequantized numbers. */
typedef enum {
    M3_WFMT_BF16 = 0,   /* m3_bf16 [N, K] (checkpoint storage) */
    M3_WFMT_F32 = 1,    /* float [N, K] (fp32 router / converted tensors) */
    M3_WFMT_MXFP4 = 2,  /* uint8 [N, ceil(K/2)] e2m1 pairs (element 2j in the low nibble) +
                           scale e8m0 [N, ceil(K/32)] (spec §5.4) */
    M3_WFMT_MXFP8 = 3,  /* e4m3fn bytes [N, K] + scale e8m0 [N, ceil(K/32)] (spec §5.5) */
    M3_WFMT_FP8_ROW = 4 /* ptpc weight: fp8 codes [N, K] (kind act->fp8.kind) + scale float [N]
                           (spec §5.6); its act must be M3_ACTQ_PTPC */
} m3_wfmt;

/* Activation quantization applied to x right before a GEMM (the serving path's dynamic
 * activation quant). Rows of x are quantized along K (the contracted dim):
 *   M3_ACTQ_MX    quantize-dequantize each row with mx (1x32 blocks, rceil in the serving
 *                 paths): the GEMM then reads values exactly representable in the MX format.
 *   M3_ACTQ_PTPC  per-token fp8 (fp8 params; spec §5.6): codes q_x and one scale s_x per row;
 *                 the GEMM reads the code values and the epilogue scales:
 *                 y = (sum_k q_x q_w) * s_x[t] * s_w[n], in that order (UNVERIFIED order).
 * min_pass: the quantization applies only when the forward pass has >= min_pass tokens
 *   (MXFP4's moe_act_bound, spec §5.11; 0 = always, INT_MAX = never). */
typedef enum { M3_ACTQ_NONE = 0, M3_ACTQ_MX = 1, M3_ACTQ_PTPC = 2 } m3_actq_kind;
typedef struct m3_actq {
    m3_actq_kind kind;
    int min_pass;
    m3_mx_params mx;    /* M3_ACTQ_MX */
    m3_fp8q_params fp8; /* M3_ACTQ_PTPC */
} m3_actq;

/* The stored form of a quantized weight matrix: what m3_wmat.data (and each matrix pointer
 * of m3_mlp_weights) points to when the format is MXFP4 / MXFP8 / FP8_ROW. */
typedef struct m3_wq {
    const void *codes;  /* borrowed; MX / FP8_ROW codes as described at m3_wfmt */
    const void *scale;  /* borrowed; MX: e8m0 [n_out, ceil(n_in/32)]; FP8_ROW: float [n_out] */
    const m3_actq *act; /* borrowed; activation quantization before this GEMM; NULL = none */
} m3_wq;

/* A borrowed weight matrix view: data points into the weights mmap or a caller buffer;
 * for the quantized formats it points to an m3_wq. */
typedef struct m3_wmat {
    m3_wfmt fmt;
    const void *data; /* borrowed; [n_out, n_in] row-major (BF16 / F32), or const m3_wq * */
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

/* Scratch for m3_linear_q with n_tok rows of n_in inputs (activation quantization). */
size_t m3_linear_q_scratch_bytes(int n_tok, int n_in);

/* m3_linear_p for any format and activation quantization: when the m3_wq's act applies
 * (its kind is not NONE and n_pass >= act->min_pass) x is quantized into scratch first (x itself is not
 * changed); FP8_ROW applies the per-channel (and per-token) scales after the fp32 GEMM; then
 * the profile's output rounding. n_pass: tokens of the whole forward pass (not of one
 * expert's share). scratch: m3_linear_q_scratch_bytes(n_tok, w->n_in) bytes (may be NULL
 * when nothing is quantized). */
void m3_linear_q(float *y, int ldy, const float *x, int ldx, const m3_wmat *w, int n_tok,
                 int n_pass, const m3_profile *p, void *scratch);

/* True when a quantizes activations in a pass of n_pass tokens (a may be NULL). */
bool m3_actq_applies(const m3_actq *a, int n_pass);

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
