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
 * three share one format. bf16 and f32 are implemented; the MX formats of quantized
 * checkpoints will be new m3_wfmt values with the quant issue. */
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

/* Scratch for m3_mlp: 2*T*F floats (g, u; a overwrites g). */
size_t m3_mlp_scratch_bytes(int n_tok, const m3_mlp_params *mp);

/* y = MLP(x). y must not alias x. */
void m3_mlp(float *y, const float *x, int n_tok, const m3_mlp_weights *w, const m3_mlp_params *mp,
            const m3_profile *p, void *scratch);

#ifdef __cplusplus
}
#endif
#endif
