/* compare/attribute.h: the `m3 attribute` engine (docs/attribute.md). For one model and one
 * token sequence it runs the CPU reference at the fp32 baseline and once per FACTOR (a
 * profile and/or numerics-variant keys, alone or all together), free-running and/or
 * teacher-forced, and measures per layer how far each run is from the baseline.
 *
 *   free    every run is an ordinary forward: layer L's error includes everything inherited
 *           from layers 0..L-1.
 *   forced  every layer L starts from the BASELINE's layers/NN/input (as `m3 replay` does;
 *           the final norm from its last layers/NN/output), so layer L's error is its own.
 *           The discrete choices (index_topk, expert_ids) are NOT forced: their flips are
 *           part of what a factor does.
 *
 * Metrics (compare/diff.h, the same definitions as `m3 compare`): per layer, for the float
 * stages index_scores, attn_out, attn_proj, mlp_out and output: NMSE, SQNR, max |Δ|,
 * cosine, relative error, non-finite counts; for the set stages index_topk and expert_ids:
 * rows whose set differs from the baseline's ("flips"), split into near-ties and real
 * flips with the baseline's own scores (index_scores; sigmoid(router_logits)) and the
 * tie rows of compare/tol.c; and for the logits: NMSE, KL(baseline || factor) mean / max,
 * top-1 agreement.
 *
 * Memory: the baseline's stages that are compared (and its layer inputs, for forcing) are
 * held in memory, about n_layer * T * (3 D + H Dh + E + G NB + ...) floats plus T * V for
 * the logits (reported as capture_bytes). A factor run keeps nothing: each stage is compared
 * inside the tap callback, one stage at a time, and dropped. No temporary files.
 *
 * Availability: a factor whose variant keys this build cannot run (m3_variant_set, the model
 * or a forward returning M3_ERR_UNSUPPORTED) is "unavailable in this build", with the
 * reason, in every output; it is not an error. The combined factor ("all") leaves such keys
 * out instead, and says which. */
#ifndef M3_ATTRIBUTE_H
#define M3_ATTRIBUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "compare/diff.h"
#include "ref/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One factor: a row of the factor table (compare/attribute.c). Adding a factor is one row. */
typedef struct m3_attr_factor {
    const char *name;    /* CLI name: "hf", "mxfp4", "kv-fp8", ... */
    const char *profile; /* "fp32" | "hf" | "atom" */
    const char *keys;    /* m3_variant_set keys, "key=value,key=value"; "" for none */
    const char *acts;    /* the stage where the spec says the factor acts first (the second
                            terminal table shows it) */
    const char *about;   /* one line: what it is, with the spec section */
    bool control;        /* the fp32-vs-fp32 control row (must be exactly 0) */
    bool combined;       /* "all": unsupported keys are left out, not fatal to the row */
} m3_attr_factor;

/* The factor table, in display order; *n its length. Static storage. */
const m3_attr_factor *m3_attr_factors(int *n);
/* Row by CLI name, or NULL. */
const m3_attr_factor *m3_attr_factor_find(const char *name);

enum { M3_ATTR_FREE = 0, M3_ATTR_FORCED = 1, M3_ATTR_N_MODE = 2 };
const char *m3_attr_mode_name(int mode); /* "free" | "forced" */

/* The compared layer stages, in execution order. */
typedef enum {
    M3_ATTR_INDEX_SCORES = 0,
    M3_ATTR_INDEX_TOPK,
    M3_ATTR_ATTN_OUT,
    M3_ATTR_ATTN_PROJ,
    M3_ATTR_EXPERT_IDS,
    M3_ATTR_MLP_OUT,
    M3_ATTR_OUTPUT,
    M3_ATTR_N_STAGE
} m3_attr_stage;
const char *m3_attr_stage_name(int s);    /* "index_scores", ... */
bool m3_attr_stage_is_set(int s);         /* index_topk, expert_ids */
int m3_attr_stage_find(const char *name); /* -1 when not a compared stage */

/* One factor x mode x layer. */
typedef struct m3_attr_cell {
    bool present[M3_ATTR_N_STAGE];   /* the run reported the stage and the baseline has it */
    m3_diff diff[M3_ATTR_N_STAGE];   /* float stages */
    m3_setdiff set[M3_ATTR_N_STAGE]; /* set stages */
} m3_attr_cell;

typedef struct m3_attr_logits {
    bool present;
    m3_diff diff;
    int64_t rows, top1_agree;
    double kl_mean, kl_max; /* KL(baseline || factor) in nats, over the rows */
} m3_attr_logits;

/* One factor in one mode. */
typedef struct m3_attr_run {
    bool ran;
    m3_attr_cell *layer; /* [n_layer] */
    m3_attr_logits logits;
    int32_t next; /* greedy next token after the prompt */
    double seconds;
} m3_attr_run;

typedef struct m3_attr_result {
    char model[512];
    int n_layer, n_tok;
    bool *layer_sparse, *layer_moe; /* [n_layer] */
    bool mode[M3_ATTR_N_MODE];      /* which modes ran */
    int n_factor;
    const m3_attr_factor **factor; /* [n_factor] rows of the table */
    bool *available;               /* [n_factor] */
    char (*why)[256];              /* [n_factor] unavailable: the reason */
    char (*applied)[256];          /* [n_factor] the keys actually applied ("" none) */
    char (*left_out)[256];         /* [n_factor] combined row: keys left out, "" none */
    m3_attr_run *run;              /* [n_factor * M3_ATTR_N_MODE], run[f * 2 + mode] */
    int32_t base_next;
    size_t capture_bytes; /* baseline stages held in memory */
    double seconds;       /* wall time of everything */
} m3_attr_result;

typedef struct m3_attr_opts {
    const char *model;         /* checkpoint directory */
    const char *override_json; /* --override, may be NULL */
    const int32_t *tokens;
    int n_tok;
    const char *const *factors; /* names (m3_attr_factor_find); NULL: the whole table */
    int n_factors;
    bool mode[M3_ATTR_N_MODE]; /* which modes to run (at least one) */
} m3_attr_opts;

/* Run the attribution. M3_OK with *out (free with m3_attr_result_free), or an error line:
 * unreadable model, unknown factor, token out of range, a run failing for any reason other
 * than M3_ERR_UNSUPPORTED. */
m3_status m3_attribute(m3_attr_result **out, const m3_attr_opts *o);
void m3_attr_result_free(m3_attr_result *r); /* NULL ok */

const m3_attr_run *m3_attr_get(const m3_attr_result *r, int factor, int mode);
/* NMSE of stage s of layer L of a run; NAN when the stage is absent or the run did not run. */
double m3_attr_nmse(const m3_attr_result *r, int factor, int mode, int layer, int s);
/* Rows of a set stage that differ from the baseline (0 when absent). */
int64_t m3_attr_flips(const m3_attr_result *r, int factor, int mode, int layer, int s);

/* The per-layer verdict: which single factor (not the control, not the combined row)
 * contributes most to layer L's output NMSE in `mode`, e.g.
 * "layer 41: index-fp8 (NMSE 3.0e-04) dominates; mxfp4 2.0e-06, hf 1.1e-06".
 * Writes into buf (NUL-terminated, truncated to cap). */
void m3_attr_verdict(const m3_attr_result *r, int mode, int layer, char *buf, size_t cap);
/* The mode verdicts are drawn from: forced when it ran, else free. */
int m3_attr_verdict_mode(const m3_attr_result *r);

/* Writers (compare/report_attr.c). Files go to PATH.tmp and are renamed: never partial. */
void m3_attr_report_text(FILE *f, const m3_attr_result *r, bool color);
m3_status m3_attr_report_json(const m3_attr_result *r, const char *path);
m3_status m3_attr_report_html(const m3_attr_result *r, const char *path);

#ifdef __cplusplus
}
#endif
#endif
