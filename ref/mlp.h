/* ref/mlp.h: the swiglu_oai MLP: dense-layer MLP (spec §3.15), the shared expert (§3.14)
 * and the body of each routed expert (§3.13).
 *
 * Math: g = x Wg^T, u = x Wu^T (F wide each); a = swiglu_oai(g, u) (ref/num/act.h:
 *   gate clamped above at limit, up clamped to [-limit, limit], (u'+1) * g' sigmoid(alpha g'));
 *   y = a Wd^T.
 * Shapes: x [T, D], y [T, D], gate/up [F, D], down [D, F] (checkpoint [out, in]).
 * Numerics: GEMMs per ref/linear.h (fp32 accumulate), each GEMM output rounded to bf16 when
 *   p->act_bf16; the activation per p->swiglu (fp32 / hf five per-op bf16 roundings / atom one
 *   rounding). Threads inside the GEMMs (output-row tiles) and the activation (rows).
 * docs/numerics.md §3.13-3.15. */
#ifndef M3_MLP_H
#define M3_MLP_H

#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"
#include "ref/linear.h"
#include "ref/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Borrowed weights of one swiglu MLP (an expert, the shared expert or a dense MLP). All
 * three share one format (ref/linear.h m3_wfmt). For the quantized formats each pointer is
 * a const m3_wq * (codes, scales and the activation quantization the serving path applies
 * before that GEMM: x before gate/up, the swiglu output a before down;
 * docs/quantization.md). */
typedef struct m3_mlp_weights {
    m3_wfmt fmt;
    const void *gate; /* borrowed [F, D] (w1 / gate_proj) */
    const void *up;   /* borrowed [F, D] (w3 / up_proj) */
    const void *down; /* borrowed [D, F] (w2 / down_proj) */
} m3_mlp_weights;

typedef struct m3_mlp_params {
    int dim;     /* D (6144) */
    int ffn;     /* F (12288 dense, 3072 expert / shared) */
    float alpha; /* swiglu_alpha (1.702f) */
    float limit; /* swiglu_limit (7.0f) */
} m3_mlp_params;

/* a[i] = swiglu_oai(g[i], u[i]) for i < n with p->swiglu's rounding. a may alias g or u. */
void m3_swiglu(float *a, const float *g, const float *u, int64_t n, float alpha, float limit,
               const m3_profile *p);

/* Scratch for m3_mlp / m3_mlp_pass: 2*T*F floats (g, u; a overwrites g) plus the
 * activation-quantization scratch of m3_linear_q for max(D, F) inputs. */
size_t m3_mlp_scratch_bytes(int n_tok, const m3_mlp_params *mp);

/* y = MLP(x). y must not alias x. */
void m3_mlp(float *y, const float *x, int n_tok, const m3_mlp_weights *w, const m3_mlp_params *mp,
            const m3_profile *p, void *scratch);
/* The same for n_tok rows that belong to a forward pass of n_pass tokens (a routed expert's
 * share): activation quantization with a token bound (MXFP4 moe_act_bound) looks at n_pass. */
void m3_mlp_pass(float *y, const float *x, int n_tok, int n_pass, const m3_mlp_weights *w,
                 const m3_mlp_params *mp, const m3_profile *p, void *scratch);

#ifdef __cplusplus
}
#endif
#endif
