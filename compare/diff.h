/* compare/diff.h: comparison metrics between a reference A and a candidate B, one bundle
 * for the tests and the CLI alike. All accumulators are streaming: feed a dataset in
 * chunks (m3_diff_f32_accum), merge partials (m3_diff_merge) in a fixed order, read the
 * derived numbers at the end. Accumulation is in double, element order within a block,
 * blocks merged in index order: results do not depend on the thread count.
 *
 * Float metrics (docs/compare.md §Metrics):
 *   Δ_i = b_i - a_i over the "compared" elements (both finite)
 *   NMSE = Σ Δ² / Σ a²                 (0 when Σa² = 0 and Σ Δ² = 0; +inf when only Σa² = 0)
 *   SQNR = -10·log10(NMSE) dB          (+inf for identical data)
 *   cosine = Σ ab / sqrt(Σa² Σb²)       (1 when both are all zero)
 *   rel_i = |Δ_i| / max(|a_i|, rel_floor · rms(A row), 1e-30)   (row = last dimension)
 *   max |Δ| with its flat index and both values; mean and max rel_i
 *   Non-finite: NaN/Inf counted on each side. A position "agrees" when both are NaN or both
 *   are infinities of the same sign; it is then left out of the metrics. Any other position
 *   where A or B is non-finite is a non-finite mismatch (always a failure: NaN or Inf in B
 *   where A is finite is the common case).
 *   |Δ| histogram: bin 0 holds Δ = 0; bin k in 1..63 holds |Δ| in [2^(k-41), 2^(k-40)),
 *   clamped at both ends (bin 1 also holds everything below 2^-40, bin 63 everything above).
 *
 * Set metrics, one set per row of ids (values < 0 are padding; duplicates count once; the
 * two sides may have different widths, e.g. HF's narrower top-k):
 *   equal rows, mean Jaccard |A∩B|/|A∪B| (1 for two empty sets), recall Σ|A∩B| / Σ|A|.
 *   A row whose sets differ is a "flip"; with a reference score row it is classified as a
 *   near-tie when margin <= tie_abs + tie_rel·max(|s_d|, |s_x|), where
 *   margin = max_{d∈A\B} s(d) - min_{x∈B\A} s(x), s = the reference's score per id
 *   (the gap the worst swapped pair had to overcome); otherwise, or without scores, or when
 *   an id falls outside the score row or a score is non-finite, it is a real disagreement.
 *
 * Logits metrics per position (row of V): p = softmax in double;
 *   KL(A||B) = Σ p_A (log p_A - log p_B); top-1 agreement argmax A == argmax B (lowest index
 *   wins ties); Δp = p_B[argmax A] - p_A[argmax A]. */
#ifndef M3_DIFF_H
#define M3_DIFF_H

#include "ref/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define M3_DIFF_HIST_BINS 64

typedef struct m3_diff {
    int64_t n;        /* elements seen */
    int64_t n_cmp;    /* finite pairs entering the metrics */
    int64_t nan_a, nan_b, inf_a, inf_b;
    int64_t nonfinite_mismatch;
    int64_t first_mismatch; /* flat index of the first non-finite mismatch, -1 if none */
    double sse, saa, sbb, sab; /* Σ Δ², Σ a², Σ b², Σ ab */
    double sum_rel, max_rel;
    int64_t max_rel_idx;
    double max_abs;
    int64_t max_abs_idx; /* -1 while no element was compared */
    float max_abs_a, max_abs_b;
    int64_t hist[M3_DIFF_HIST_BINS];
} m3_diff;

void m3_diff_init(m3_diff *d);
/* Accumulate n elements (a whole number of rows of row_len) whose flat indices start at
 * base. rel_floor: the fraction of the A row's RMS below which |a| is not used as the
 * relative-error denominator. */
void m3_diff_f32_accum(m3_diff *d, const float *a, const float *b, int64_t n, int64_t row_len,
                       int64_t base, double rel_floor);
/* into += part, where part covers indices after everything already in `into`. */
void m3_diff_merge(m3_diff *into, const m3_diff *part);
/* One-shot convenience: init + accum (single block) */
m3_diff m3_diff_f32(const float *a, const float *b, int64_t n, int64_t row_len, double rel_floor);

double m3_diff_nmse(const m3_diff *d);
double m3_diff_sqnr_db(const m3_diff *d);
double m3_diff_cosine(const m3_diff *d);
double m3_diff_mean_rel(const m3_diff *d);
/* Lower edge of histogram bin k (0 for bin 0). */
double m3_diff_hist_lo(int k);

typedef struct m3_setdiff {
    int64_t rows;
    int64_t rows_equal;
    int64_t flips_tie;  /* flips on a near-tie of the reference scores */
    int64_t flips_real; /* flips beyond the margin, or unclassifiable */
    int64_t flips_unscored; /* part of flips_real: no usable score to classify */
    double sum_jaccard;
    int64_t inter, size_a, size_b;
    int64_t first_flip_row;   /* -1 if none */
    int64_t first_real_row;   /* -1 if none */
    double min_flip_margin;   /* smallest classified margin among flips (+inf if none) */
} m3_setdiff;

void m3_setdiff_init(m3_setdiff *s);
/* Accumulate n_rows rows. a: [n_rows, wa], b: [n_rows, wb] int32. score: NULL or
 * [n_rows, n_score] reference scores indexed by id. row_base: index of the first row.
 * Thread-safe on distinct s. */
void m3_setdiff_rows(m3_setdiff *s, const int32_t *a, int wa, const int32_t *b, int wb,
                     int64_t n_rows, const float *score, int64_t n_score, double tie_abs,
                     double tie_rel, int64_t row_base);
void m3_setdiff_merge(m3_setdiff *into, const m3_setdiff *part);
double m3_setdiff_agree(const m3_setdiff *s);   /* rows_equal / rows (1 when rows = 0) */
double m3_setdiff_jaccard(const m3_setdiff *s); /* mean Jaccard (1 when rows = 0) */
double m3_setdiff_recall(const m3_setdiff *s);  /* Σ|A∩B| / Σ|A| (1 when Σ|A| = 0) */

/* Sort one row of (id, weight) pairs by id, ids < 0 last (in place). Used to compare
 * routing weights aligned with expert ids. */
void m3_sort_by_id(int32_t *ids, float *w, int n);
/* True when two rows hold the same set of ids >= 0 (order and padding ignored). */
bool m3_same_id_set(const int32_t *a, int wa, const int32_t *b, int wb);

/* One logits row of length V. Returns KL(A||B) (may be +inf, NaN when a row is all
 * non-finite); *top_a, *top_b the argmaxes; *dp = p_B - p_A at top_a. */
double m3_logits_row(const float *a, const float *b, int64_t V, int64_t *top_a, int64_t *top_b,
                     double *dp);

#ifdef __cplusplus
}
#endif
#endif
