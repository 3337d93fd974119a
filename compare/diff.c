/* compare/diff.c: metrics (see diff.h for the definitions). */
#include "compare/diff.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void m3_diff_init(m3_diff *d) {
    memset(d, 0, sizeof *d);
    d->first_mismatch = -1;
    d->max_rel_idx = -1;
    d->max_abs_idx = -1;
}

static inline int hist_bin(double ae) {
    if (ae == 0.0) return 0;
    float f = (float)ae;
    uint32_t u;
    memcpy(&u, &f, 4);
    int e = (int)((u >> 23) & 0xff) - 127; /* floor(log2 |Δ|) for normal floats */
    int k = e + 41;
    return k < 1 ? 1 : (k > M3_DIFF_HIST_BINS - 1 ? M3_DIFF_HIST_BINS - 1 : k);
}

double m3_diff_hist_lo(int k) { return k <= 0 ? 0.0 : ldexp(1.0, k - 41); }

/* A position with at least one non-finite side. Returns true when it agrees. */
static inline bool nonfinite_agree(float x, float y) {
    if (isnan(x) && isnan(y)) return true;
    if (isinf(x) && isinf(y) && signbit(x) == signbit(y)) return true;
    return false;
}

void m3_diff_f32_accum(m3_diff *d, const float *a, const float *b, int64_t n, int64_t row_len,
                       int64_t base, double rel_floor) {
    M3_ASSERT(row_len > 0 && n % row_len == 0);
    for (int64_t r0 = 0; r0 < n; r0 += row_len) {
        const float *ar = a + r0, *br = b + r0;
        /* pass 1: the A row's sum of squares (finite elements) for the relative-error floor */
        double saa_row = 0;
        int64_t nf = 0;
        for (int64_t i = 0; i < row_len; i++) {
            double x = ar[i];
            if (isfinite(ar[i])) {
                saa_row += x * x;
                nf++;
            }
        }
        double floor_v = nf ? rel_floor * sqrt(saa_row / (double)nf) : 0.0;
        if (!(floor_v > 1e-30)) floor_v = 1e-30;
        double sse = 0, sbb = 0, sab = 0, sum_rel = 0;
        int64_t ncmp = 0;
        for (int64_t i = 0; i < row_len; i++) {
            float xf = ar[i], yf = br[i];
            if (!(isfinite(xf) && isfinite(yf))) {
                if (isnan(xf)) d->nan_a++;
                if (isinf(xf)) d->inf_a++;
                if (isnan(yf)) d->nan_b++;
                if (isinf(yf)) d->inf_b++;
                if (!nonfinite_agree(xf, yf)) {
                    if (d->first_mismatch < 0) d->first_mismatch = base + r0 + i;
                    d->nonfinite_mismatch++;
                }
                continue;
            }
            double x = xf, y = yf, e = y - x;
            sse += e * e;
            sbb += y * y;
            sab += x * y;
            double ae = fabs(e);
            if (ae > d->max_abs || d->max_abs_idx < 0) {
                d->max_abs = ae;
                d->max_abs_idx = base + r0 + i;
                d->max_abs_a = xf;
                d->max_abs_b = yf;
            }
            double ax = fabs(x);
            double rel = ae / (ax > floor_v ? ax : floor_v);
            sum_rel += rel;
            if (rel > d->max_rel) {
                d->max_rel = rel;
                d->max_rel_idx = base + r0 + i;
            }
            d->hist[hist_bin(ae)]++;
            ncmp++;
        }
        d->sse += sse;
        d->saa += saa_row; /* = Σ a² over finite a; subtract the pairs excluded below */
        if (ncmp != nf) {
            /* rare: some finite a were paired with a non-finite b; keep Σa² over compared
             * pairs only so that NMSE is a ratio over the same elements */
            for (int64_t i = 0; i < row_len; i++)
                if (isfinite(ar[i]) && !isfinite(br[i])) d->saa -= (double)ar[i] * (double)ar[i];
        }
        d->sbb += sbb;
        d->sab += sab;
        d->sum_rel += sum_rel;
        d->n_cmp += ncmp;
    }
    d->n += n;
}

void m3_diff_merge(m3_diff *o, const m3_diff *p) {
    o->n += p->n;
    o->n_cmp += p->n_cmp;
    o->nan_a += p->nan_a;
    o->nan_b += p->nan_b;
    o->inf_a += p->inf_a;
    o->inf_b += p->inf_b;
    if (o->first_mismatch < 0) o->first_mismatch = p->first_mismatch;
    o->nonfinite_mismatch += p->nonfinite_mismatch;
    o->sse += p->sse;
    o->saa += p->saa;
    o->sbb += p->sbb;
    o->sab += p->sab;
    o->sum_rel += p->sum_rel;
    if (p->max_rel > o->max_rel) {
        o->max_rel = p->max_rel;
        o->max_rel_idx = p->max_rel_idx;
    }
    /* strictly greater: on equal values the earlier index wins, as in a single pass */
    if (p->max_abs_idx >= 0 && (o->max_abs_idx < 0 || p->max_abs > o->max_abs)) {
        o->max_abs = p->max_abs;
        o->max_abs_idx = p->max_abs_idx;
        o->max_abs_a = p->max_abs_a;
        o->max_abs_b = p->max_abs_b;
    }
    for (int k = 0; k < M3_DIFF_HIST_BINS; k++) o->hist[k] += p->hist[k];
}

m3_diff m3_diff_f32(const float *a, const float *b, int64_t n, int64_t row_len, double rel_floor) {
    m3_diff d;
    m3_diff_init(&d);
    if (n > 0) m3_diff_f32_accum(&d, a, b, n, row_len > 0 ? row_len : n, 0, rel_floor);
    return d;
}

double m3_diff_nmse(const m3_diff *d) {
    if (d->sse == 0) return 0.0;
    if (d->saa == 0) return INFINITY;
    return d->sse / d->saa;
}

double m3_diff_sqnr_db(const m3_diff *d) {
    double e = m3_diff_nmse(d);
    if (e == 0) return INFINITY;
    if (isinf(e)) return -INFINITY;
    return -10.0 * log10(e);
}

double m3_diff_cosine(const m3_diff *d) {
    if (d->saa == 0 && d->sbb == 0) return 1.0;
    if (d->saa == 0 || d->sbb == 0) return 0.0;
    return d->sab / sqrt(d->saa * d->sbb);
}

double m3_diff_mean_rel(const m3_diff *d) { return d->n_cmp ? d->sum_rel / (double)d->n_cmp : 0.0; }

/* ---- sets ---------------------------------------------------------------------------- */

void m3_setdiff_init(m3_setdiff *s) {
    memset(s, 0, sizeof *s);
    s->first_flip_row = s->first_real_row = -1;
    s->min_flip_margin = INFINITY;
}

/* Copy the ids >= 0 of a row into out, sorted and unique; returns the count. */
static int set_of(int32_t *out, const int32_t *row, int w) {
    int n = 0;
    for (int i = 0; i < w; i++)
        if (row[i] >= 0) out[n++] = row[i];
    /* widths are small (k = 4, K = 16); insertion sort beats qsort's call overhead */
    for (int i = 1; i < n; i++) {
        int32_t v = out[i];
        int j = i - 1;
        while (j >= 0 && out[j] > v) {
            out[j + 1] = out[j];
            j--;
        }
        out[j + 1] = v;
    }
    int u = 0;
    for (int i = 0; i < n; i++)
        if (u == 0 || out[u - 1] != out[i]) out[u++] = out[i];
    return u;
}

bool m3_same_id_set(const int32_t *a, int wa, const int32_t *b, int wb) {
    int32_t sa[64], sb[64];
    if (wa > 64 || wb > 64) {
        /* wide rows: fall back to heap scratch */
        int32_t *ha = malloc(sizeof(int32_t) * (size_t)(wa + wb + 1));
        M3_ASSERT(ha);
        int na = set_of(ha, a, wa), nb = set_of(ha + wa, b, wb);
        bool eq = na == nb && memcmp(ha, ha + wa, sizeof(int32_t) * (size_t)na) == 0;
        free(ha);
        return eq;
    }
    int na = set_of(sa, a, wa), nb = set_of(sb, b, wb);
    return na == nb && memcmp(sa, sb, sizeof(int32_t) * (size_t)na) == 0;
}

void m3_setdiff_rows(m3_setdiff *s, const int32_t *a, int wa, const int32_t *b, int wb,
                     int64_t n_rows, const float *score, int64_t n_score, double tie_abs,
                     double tie_rel, int64_t row_base) {
    int32_t *sa = malloc(sizeof(int32_t) * (size_t)(wa + wb + 2));
    M3_ASSERT(sa);
    int32_t *sb = sa + wa + 1;
    for (int64_t r = 0; r < n_rows; r++) {
        int na = set_of(sa, a + r * wa, wa), nb = set_of(sb, b + r * wb, wb);
        /* merge-walk the two sorted sets */
        int i = 0, j = 0, inter = 0;
        while (i < na && j < nb) {
            if (sa[i] == sb[j]) {
                inter++;
                i++;
                j++;
            } else if (sa[i] < sb[j])
                i++;
            else
                j++;
        }
        int uni = na + nb - inter;
        s->rows++;
        s->inter += inter;
        s->size_a += na;
        s->size_b += nb;
        s->sum_jaccard += uni ? (double)inter / (double)uni : 1.0;
        if (inter == na && inter == nb) {
            s->rows_equal++;
            continue;
        }
        if (s->first_flip_row < 0) s->first_flip_row = row_base + r;
        /* classify: margin = max s(dropped) - min s(added), reference scores */
        bool tie = false, scored = score != NULL;
        if (scored) {
            const float *sr = score + r * n_score;
            double hi = -INFINITY, lo = INFINITY, mag = 0;
            i = j = 0;
            for (int k = 0; k < na && scored; k++) { /* dropped: in A not in B */
                bool inb = false;
                for (int m = 0; m < nb; m++) inb |= sb[m] == sa[k];
                if (inb) continue;
                if (sa[k] >= n_score || !isfinite(sr[sa[k]])) { scored = false; break; }
                double v = sr[sa[k]];
                if (v > hi) hi = v;
                if (fabs(v) > mag) mag = fabs(v);
            }
            for (int k = 0; k < nb && scored; k++) { /* added: in B not in A */
                bool ina = false;
                for (int m = 0; m < na; m++) ina |= sa[m] == sb[k];
                if (ina) continue;
                if (sb[k] >= n_score || !isfinite(sr[sb[k]])) { scored = false; break; }
                double v = sr[sb[k]];
                if (v < lo) lo = v;
                if (fabs(v) > mag) mag = fabs(v);
            }
            /* a pure size change (one side only dropped or only added) has no swapped pair */
            if (scored && isfinite(hi) && isfinite(lo)) {
                double margin = fabs(hi - lo);
                if (margin < s->min_flip_margin) s->min_flip_margin = margin;
                tie = margin <= tie_abs + tie_rel * mag;
            } else {
                scored = false;
            }
        }
        if (tie) {
            s->flips_tie++;
        } else {
            s->flips_real++;
            if (!scored) s->flips_unscored++;
            if (s->first_real_row < 0) s->first_real_row = row_base + r;
        }
    }
    free(sa);
}

void m3_setdiff_merge(m3_setdiff *o, const m3_setdiff *p) {
    o->rows += p->rows;
    o->rows_equal += p->rows_equal;
    o->flips_tie += p->flips_tie;
    o->flips_real += p->flips_real;
    o->flips_unscored += p->flips_unscored;
    o->sum_jaccard += p->sum_jaccard;
    o->inter += p->inter;
    o->size_a += p->size_a;
    o->size_b += p->size_b;
    if (o->first_flip_row < 0) o->first_flip_row = p->first_flip_row;
    if (o->first_real_row < 0) o->first_real_row = p->first_real_row;
    if (p->min_flip_margin < o->min_flip_margin) o->min_flip_margin = p->min_flip_margin;
}

double m3_setdiff_agree(const m3_setdiff *s) {
    return s->rows ? (double)s->rows_equal / (double)s->rows : 1.0;
}
double m3_setdiff_jaccard(const m3_setdiff *s) {
    return s->rows ? s->sum_jaccard / (double)s->rows : 1.0;
}
double m3_setdiff_recall(const m3_setdiff *s) {
    return s->size_a ? (double)s->inter / (double)s->size_a : 1.0;
}

void m3_sort_by_id(int32_t *ids, float *w, int n) {
    for (int i = 1; i < n; i++) {
        int32_t id = ids[i];
        float wv = w[i];
        /* ids < 0 (padding) sort after every real id */
        uint32_t key = id < 0 ? UINT32_MAX : (uint32_t)id;
        int j = i - 1;
        while (j >= 0 && (ids[j] < 0 ? UINT32_MAX : (uint32_t)ids[j]) > key) {
            ids[j + 1] = ids[j];
            w[j + 1] = w[j];
            j--;
        }
        ids[j + 1] = id;
        w[j + 1] = wv;
    }
}

/* ---- logits -------------------------------------------------------------------------- */

static double row_max(const float *x, int64_t n, int64_t *arg) {
    double m = -INFINITY;
    int64_t k = -1;
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        if (isnan(v)) continue; /* NaN never wins; the lowest index wins ties */
        if (k < 0 || v > m) {
            m = v;
            k = i;
        }
    }
    *arg = k < 0 ? 0 : k;
    return k < 0 ? (double)NAN : m;
}

double m3_logits_row(const float *a, const float *b, int64_t V, int64_t *top_a, int64_t *top_b,
                     double *dp) {
    double ma = row_max(a, V, top_a), mb = row_max(b, V, top_b);
    if (!isfinite(ma) || !isfinite(mb)) {
        *dp = NAN;
        return NAN;
    }
    /* With e_i = exp(a_i - ma), S_a = Σ e_i, la = ma + log S_a (and lb likewise):
     * KL = Σ p_a,i (a_i - b_i) - (la - lb) = (Σ e_i (a_i - b_i)) / S_a - (la - lb).
     * Two exps per element; positions with p_a = 0 contribute nothing. */
    double sa = 0, sab = 0, sb = 0;
    for (int64_t i = 0; i < V; i++) {
        double e = exp((double)a[i] - ma);
        sa += e;
        if (e != 0) sab += e * ((double)a[i] - (double)b[i]);
    }
    for (int64_t i = 0; i < V; i++) sb += exp((double)b[i] - mb);
    double la = ma + log(sa), lb = mb + log(sb);
    double kl = sab / sa - (la - lb);
    double pa_top = exp((double)a[*top_a] - la), pb_top = exp((double)b[*top_a] - lb);
    *dp = pb_top - pa_top;
    return kl < 0 ? 0 : kl; /* rounding can leave a tiny negative for identical rows */
}
