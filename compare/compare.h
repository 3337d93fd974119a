/* compare/compare.h: the `m3 compare` engine. Walks two m3-dump/1 files stage by stage
 * in execution order (compare/stages.h), streams each dataset in row chunks (bounded
 * memory: a few chunk buffers of ~8 MiB), computes the metrics of compare/diff.h, judges
 * them against compare/tol.h and records the first stage beyond tolerance. The report
 * writers (report_*.c) render the result; nothing here prints.
 *
 * A = the reference, B = the candidate. Keys are matched by (pass, scope, layer, stage), so
 * "layers/07/x" matches "layers/007/x" and a single-pass root matches "passes/0000/". */
#ifndef M3_COMPARE_H
#define M3_COMPARE_H

#include <stdio.h>

#include "compare/diff.h"
#include "compare/stages.h"
#include "compare/tol.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    M3_CMP_PASS = 0,
    M3_CMP_FAIL,
    M3_CMP_ONLY_A, /* stage present in A only (reported, not a failure) */
    M3_CMP_ONLY_B
} m3_cmp_status;

typedef struct m3_logit_stats {
    int64_t rows, top1_agree, kl_nan;
    double kl_mean, kl_median, kl_p99, kl_max;
    int64_t kl_max_row;
    double dp_mean, dp_max_abs; /* Δp = p_B - p_A at A's argmax */
} m3_logit_stats;

typedef struct m3_cmp_item {
    char key_a[160], key_b[160]; /* "" when absent on that side */
    char stage[64];
    int pass;  /* 0 for a single-pass root */
    m3_stage_scope scope;
    int layer; /* -1 for global stages */
    m3_stage_kind kind;
    const m3_stage *def; /* NULL: a stage the table does not know */
    m3_cmp_status status;
    int rank;
    int64_t shape[M3_MAX_RANK];  /* A's shape */
    int64_t width_b;             /* INDEX_SET: B's last dim (may differ from A's) */
    const m3_tol_row *tol;
    char why[200];               /* the failed criterion, "" when passing */
    m3_diff diff;                /* FLOAT, LOGITS, WEIGHTS_BY_ID */
    m3_setdiff set;              /* INDEX_SET */
    bool set_scored;             /* a reference score stage was used to classify flips */
    m3_logit_stats logit;        /* LOGITS */
    int64_t exact_mismatch, exact_first; /* EXACT */
    int64_t rows_skipped;        /* WEIGHTS_BY_ID: rows left out because the id sets differ */
} m3_cmp_item;

typedef struct m3_cmp_report {
    char path_a[512], path_b[512];
    char producer_a[160], producer_b[160], profile_a[64], profile_b[64];
    char variant_a[1024], variant_b[1024]; /* the dumps' `variant` attributes ("" if none) */
    int tol_class; /* M3_TOL_FP32 / M3_TOL_LOWP */
    double rel_floor;
    m3_cmp_item *items;
    int n_items;
    int n_pass, n_fail, n_only_a, n_only_b;
    int first_fail; /* index into items, -1 when all pass */
    int worst;      /* float-kind item with the largest NMSE (for the |Δ| histogram), -1 */
    int64_t bytes;  /* dataset bytes read from both files */
    double seconds; /* wall time of the comparison */
} m3_cmp_report;

typedef struct m3_cmp_opts {
    int pass; /* compare only this pass; -1 all */
} m3_cmp_opts;

/* Compare two dumps. Returns M3_OK with *out filled (whatever the verdict), or an error
 * status (unreadable file, different token counts, shape mismatch, no common stage) with
 * one m3_errorf line. Free with m3_cmp_report_free. */
m3_status m3_compare_dumps(m3_cmp_report **out, const char *path_a, const char *path_b,
                           const m3_tol *tol, const m3_cmp_opts *opts);
void m3_cmp_report_free(m3_cmp_report *r);
/* 0 all compared stages within tolerance, 1 otherwise (the CLI exit code). */
int m3_cmp_exit_code(const m3_cmp_report *r);

/* Display name of an item: "layers/07/attn_out" (2-digit layers, 3 when >= 100),
 * prefixed "passes/PPPP/" when the report has several passes. */
void m3_cmp_item_name(const m3_cmp_report *r, const m3_cmp_item *it, char *buf, size_t cap);
/* Row-major multi-index idx[0..rank) of flat element index flat >= 0 in the item's shape (a
 * 0-length dimension counts as 1). Returns what is left of flat past the shape: flat itself
 * for a rank-0 item, 0 when flat is inside the shape. */
int64_t m3_cmp_unravel(const m3_cmp_item *it, int64_t flat, int64_t idx[M3_MAX_RANK]);
/* "[t, h]"-style multi-index of a flat index in the item's shape. */
void m3_cmp_format_index(const m3_cmp_item *it, int64_t flat, char *buf, size_t cap);
/* The primary error number of an item for plots: NMSE (float kinds), 1 - agreement (sets),
 * mismatch fraction (exact). */
double m3_cmp_item_error(const m3_cmp_item *it);

/* Report writers. Files are written to PATH.tmp and renamed: never a partial output.
 * Text: a per-stage table and the verdict; colour only when `color`. quiet: verdict only. */
void m3_report_text(FILE *f, const m3_cmp_report *r, bool color, bool quiet);
m3_status m3_report_json(const m3_cmp_report *r, const char *path);
m3_status m3_report_junit(const m3_cmp_report *r, const char *path);
m3_status m3_report_html(const m3_cmp_report *r, const char *path);

/* Shared by the writers: open PATH.tmp, and commit (close + rename) or abort (unlink). */
FILE *m3_report_open(const char *path, char *tmp, size_t cap);
m3_status m3_report_commit(FILE *f, const char *tmp, const char *path);

#ifdef __cplusplus
}
#endif
#endif
