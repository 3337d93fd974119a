/* compare/report_text.c: the terminal table of `m3 compare`: one line per stage in
 * execution order, the first stage beyond tolerance, and a verdict line. Colour (ANSI) only
 * when the caller says the stream is a terminal. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compare/compare.h"

#define RED "\033[31m"
#define GREEN "\033[32m"
#define YELLOW "\033[33m"
#define BOLD "\033[1m"
#define RESET "\033[0m"

static const char *fmt_g(char *buf, size_t cap, double v) {
    if (isnan(v)) snprintf(buf, cap, "nan");
    else if (isinf(v)) snprintf(buf, cap, v > 0 ? "inf" : "-inf");
    else snprintf(buf, cap, "%.3g", v);
    return buf;
}

static void line(FILE *f, const m3_cmp_report *r, const m3_cmp_item *it, bool color) {
    char name[200], b1[32], b2[32], b3[32], b4[32], b5[32], idx[64];
    m3_cmp_item_name(r, it, name, sizeof name);
    const char *verdict = "ok", *col = GREEN;
    switch (it->status) {
    case M3_CMP_PASS: break;
    case M3_CMP_FAIL: verdict = "FAIL", col = RED; break;
    case M3_CMP_ONLY_A: verdict = "only A", col = YELLOW; break;
    case M3_CMP_ONLY_B: verdict = "only B", col = YELLOW; break;
    }
    fprintf(f, "%-28s %-13s %s%-6s%s ", name, m3_stage_kind_name(it->kind), color ? col : "",
            verdict, color ? RESET : "");
    if (it->status == M3_CMP_ONLY_A || it->status == M3_CMP_ONLY_B) {
        fputc('\n', f);
        return;
    }
    const m3_diff *d = &it->diff;
    switch (it->kind) {
    case M3_STAGE_EXACT:
    {
        int64_t n = 1;
        for (int i = 0; i < it->rank; i++) n *= it->shape[i];
        fprintf(f, "%lld of %lld elements differ", (long long)it->exact_mismatch, (long long)n);
    }
        break;
    case M3_STAGE_INDEX_SET: {
        const m3_setdiff *s = &it->set;
        fprintf(f, "agree %.4f  jaccard %.4f  recall %.4f  flips %lld (near-tie %lld, real %lld%s)",
                m3_setdiff_agree(s), m3_setdiff_jaccard(s), m3_setdiff_recall(s),
                (long long)(s->flips_tie + s->flips_real), (long long)s->flips_tie,
                (long long)s->flips_real, it->set_scored ? "" : ", unscored");
        break;
    }
    default:
        m3_cmp_format_index(it, d->max_abs_idx, idx, sizeof idx);
        fprintf(f, "nmse %-9s sqnr %6s dB  max|d| %-9s at %-14s (%.6g -> %.6g)  cos %.6f  rel %s/%s",
                fmt_g(b1, sizeof b1, m3_diff_nmse(d)), fmt_g(b2, sizeof b2, m3_diff_sqnr_db(d)),
                fmt_g(b3, sizeof b3, d->max_abs), idx, (double)d->max_abs_a, (double)d->max_abs_b,
                m3_diff_cosine(d), fmt_g(b4, sizeof b4, m3_diff_mean_rel(d)),
                fmt_g(b5, sizeof b5, d->max_rel));
        if (d->nan_a || d->nan_b || d->inf_a || d->inf_b)
            fprintf(f, "  nan %lld/%lld inf %lld/%lld", (long long)d->nan_a, (long long)d->nan_b,
                    (long long)d->inf_a, (long long)d->inf_b);
        if (it->kind == M3_STAGE_WEIGHTS_BY_ID && it->rows_skipped)
            fprintf(f, "  (%lld rows with different ids skipped)", (long long)it->rows_skipped);
        if (it->kind == M3_STAGE_LOGITS) {
            const m3_logit_stats *L = &it->logit;
            fprintf(f, "\n%-49s KL mean %s median %s p99 %s max %s  top-1 %.4f  dp mean %+.3g max|dp| %.3g",
                    "", fmt_g(b1, sizeof b1, L->kl_mean), fmt_g(b2, sizeof b2, L->kl_median),
                    fmt_g(b3, sizeof b3, L->kl_p99), fmt_g(b4, sizeof b4, L->kl_max),
                    L->rows ? (double)L->top1_agree / (double)L->rows : 1.0, L->dp_mean, L->dp_max_abs);
        }
    }
    if (it->status == M3_CMP_FAIL) fprintf(f, "\n%-49s %s-> %s%s", "", color ? RED : "", it->why, color ? RESET : "");
    fputc('\n', f);
}

void m3_report_text(FILE *f, const m3_cmp_report *r, bool color, bool quiet) {
    if (!quiet) {
        fprintf(f, "%sA%s %s  (%s, profile %s)\n%sB%s %s  (%s, profile %s)\n", color ? BOLD : "",
                color ? RESET : "", r->path_a, r->producer_a, r->profile_a, color ? BOLD : "",
                color ? RESET : "", r->path_b, r->producer_b, r->profile_b);
        fprintf(f, "tolerance class: %s (rel-error floor %.3g x row RMS)\n\n",
                m3_tol_class_name(r->tol_class), r->rel_floor);
        for (int i = 0; i < r->n_items; i++) line(f, r, &r->items[i], color);
        fputc('\n', f);
    }
    if (r->first_fail >= 0) {
        char name[200];
        const m3_cmp_item *it = &r->items[r->first_fail];
        m3_cmp_item_name(r, it, name, sizeof name);
        fprintf(f, "%sfirst beyond tolerance: %s: %s%s\n", color ? RED : "", name, it->why,
                color ? RESET : "");
    }
    if (r->n_only_a || r->n_only_b) {
        int shown = 0;
        fprintf(f, "stages on one side only:");
        for (int i = 0; i < r->n_items && shown < 8; i++) {
            const m3_cmp_item *it = &r->items[i];
            if (it->status != M3_CMP_ONLY_A && it->status != M3_CMP_ONLY_B) continue;
            char name[200];
            m3_cmp_item_name(r, it, name, sizeof name);
            fprintf(f, " %s (%s)", name, it->status == M3_CMP_ONLY_A ? "A" : "B");
            shown++;
        }
        if (r->n_only_a + r->n_only_b > shown) fprintf(f, " ... and %d more", r->n_only_a + r->n_only_b - shown);
        fputc('\n', f);
    }
    fprintf(f, "%s%s%s: %d stages compared, %d beyond tolerance, %d only in A, %d only in B "
               "(%.1f MB in %.2f s)\n",
            color ? (r->n_fail ? RED : GREEN) : "", r->n_fail ? "DIFFERENT" : "OK", color ? RESET : "",
            r->n_pass + r->n_fail, r->n_fail, r->n_only_a, r->n_only_b, (double)r->bytes / 1e6,
            r->seconds);
}
