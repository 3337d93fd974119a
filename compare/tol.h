/* compare/tol.h: the tolerance table. One row per stage (kind), each with a one-line reason;
 * used by `m3 compare` and by tests (tests never hard-code a tolerance). Rows are built in
 * (compare/tol.c, documented in docs/compare.md) and can be overridden per stage from a
 * JSON --tol file.
 *
 * Three numerics classes: "fp32" when both dumps were produced in the fp32 profile (the
 * mathematical content of the checkpoint: independent implementations agree to NMSE ≈ 1e-12),
 * "fp32q" when both are fp32 but either run quantized online (MX or ptpc activations, fp8
 * caches: a last-bit fp32 difference can move a value across a code boundary, one quantization
 * step), "lowp" otherwise (bf16 storage: hf, atom, or a producer's own word). Each bound has
 * one value per class.
 *
 * A stage FAILS when any of these hold (kinds from compare/stages.h):
 *   any kind       a non-finite mismatch (diff.h), or the shapes differ
 *   FLOAT, WEIGHTS NMSE > nmse[class]
 *   EXACT          any element differs
 *   INDEX_SET      flips_real / rows > flip[class] (flips on a near-tie of the reference
 *                  scores, margin <= tie_abs + tie_rel·|score|, are reported, not failed)
 *   LOGITS         NMSE > nmse[class], or mean KL > kl_mean[class], or top-1 agreement <
 *                  top1_min[class] */
#ifndef M3_TOL_H
#define M3_TOL_H

#include "ref/base.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { M3_TOL_FP32 = 0, M3_TOL_LOWP = 1, M3_TOL_FP32Q = 2, M3_TOL_NCLASS = 3 };

typedef struct m3_tol_row {
    char stage[64];    /* stage name as in compare/stages.c, or "*" for every other stage */
    double nmse[M3_TOL_NCLASS];    /* FLOAT / WEIGHTS_BY_ID / LOGITS */
    double flip[M3_TOL_NCLASS];    /* INDEX_SET: max fraction of rows with a real (non-tie) flip */
    double kl_mean[M3_TOL_NCLASS]; /* LOGITS: max mean KL(A||B) in nats */
    double top1_min[M3_TOL_NCLASS];/* LOGITS: min top-1 agreement */
    double tie_abs, tie_rel; /* INDEX_SET near-tie margin (reference score units) */
    char reason[200];
} m3_tol_row;

#define M3_TOL_MAX_ROWS 64

typedef struct m3_tol {
    m3_tol_row row[M3_TOL_MAX_ROWS];
    int n;
    double rel_floor; /* relative error denominator floor, fraction of the A row's RMS */
    int force_class;  /* -1 auto (from profiles and variants), else an M3_TOL_ class */
} m3_tol;

/* Fill t with the built-in table. */
void m3_tol_builtin(m3_tol *t);
/* Built-in table, then the overrides of a JSON file (format in docs/compare.md). Unknown
 * keys are errors (a typo must not silently loosen a gate). */
m3_status m3_tol_load(m3_tol *t, const char *path);
/* Same, from JSON text (name is used in error messages). */
m3_status m3_tol_parse(m3_tol *t, const char *json, const char *name);
/* Row for a stage name: the exact row, else the "*" row. Never NULL. */
const m3_tol_row *m3_tol_find(const m3_tol *t, const char *stage);
/* Class for a pair of dumps from their `profile` and `variant` attributes (NULL = unknown:
 * lowp for a profile, plain for a variant): fp32 when both profiles are "fp32"/"float32" and
 * neither variant quantizes online; fp32q when both are fp32 and one does; else lowp (or the
 * forced class). */
int m3_tol_class(const m3_tol *t, const char *profile_a, const char *profile_b,
                 const char *variant_a, const char *variant_b);
/* Whether a dump's `variant` attribute (ref/variant.h m3_variant_json) quantizes online:
 * MX experts (MXFP8 quantizes activations; MXFP4 from moe_act_bound > 0 tokens on), ptpc fp8,
 * an fp8 KV or index cache. */
bool m3_tol_variant_quantizes(const char *variant_json);
/* "fp32", "lowp" or "fp32q". */
const char *m3_tol_class_name(int cls);

#ifdef __cplusplus
}
#endif
#endif
