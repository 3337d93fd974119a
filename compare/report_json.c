/* compare/report_json.c: `m3 compare --json`: every number of the report as one JSON
 * object (schema in docs/compare.md). JSON has no infinities: non-finite numbers are
 * written as the strings "inf", "-inf", "nan". */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compare/compare.h"

static void jstr(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void jnum(FILE *f, double v) {
    if (isnan(v)) fputs("\"nan\"", f);
    else if (isinf(v)) fputs(v > 0 ? "\"inf\"" : "\"-inf\"", f);
    else fprintf(f, "%.17g", v);
}

static void jidx(FILE *f, const m3_cmp_item *it, int64_t flat) {
    if (flat < 0) {
        fputs("null", f);
        return;
    }
    int64_t idx[M3_MAX_RANK];
    m3_cmp_unravel(it, flat, idx);
    fputc('[', f);
    for (int i = 0; i < it->rank; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)idx[i]);
    fputc(']', f);
}

/* `, "key": value` */
static void jfield(FILE *f, const char *key, double v) {
    fprintf(f, ", \"%s\": ", key);
    jnum(f, v);
}

static void jfield_idx(FILE *f, const m3_cmp_item *it, const char *key, int64_t flat) {
    fprintf(f, ", \"%s\": ", key);
    jidx(f, it, flat);
}

static const char *status_name(m3_cmp_status s) {
    switch (s) {
    case M3_CMP_PASS: return "pass";
    case M3_CMP_FAIL: return "fail";
    case M3_CMP_ONLY_A: return "only_a";
    case M3_CMP_ONLY_B: return "only_b";
    }
    return "?";
}

static void item(FILE *f, const m3_cmp_report *r, const m3_cmp_item *it) {
    char name[200];
    m3_cmp_item_name(r, it, name, sizeof name);
    fputs("    {\"name\": ", f);
    jstr(f, name);
    fputs(", \"stage\": ", f);
    jstr(f, it->stage);
    fprintf(f, ", \"pass\": %d, \"layer\": %d, \"scope\": \"%s\", \"kind\": \"%s\", \"status\": \"%s\"",
            it->pass, it->layer,
            it->scope == M3_SCOPE_LAYER ? "layer" : it->scope == M3_SCOPE_VISION ? "vision" : "global",
            m3_stage_kind_name(it->kind), status_name(it->status));
    fputs(", \"key_a\": ", f);
    jstr(f, it->key_a);
    fputs(", \"key_b\": ", f);
    jstr(f, it->key_b);
    if (it->status == M3_CMP_ONLY_A || it->status == M3_CMP_ONLY_B) {
        fputs("}", f);
        return;
    }
    fputs(", \"shape\": [", f);
    for (int i = 0; i < it->rank; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)it->shape[i]);
    fputs("], \"why\": ", f);
    jstr(f, it->why);
    const m3_tol_row *t = it->tol;
    int c = r->tol_class;
    fputs(", \"tolerance\": {\"row\": ", f);
    jstr(f, t->stage);
    jfield(f, "nmse", t->nmse[c]);
    jfield(f, "flip", t->flip[c]);
    jfield(f, "kl_mean", t->kl_mean[c]);
    jfield(f, "top1_min", t->top1_min[c]);
    jfield(f, "tie_abs", t->tie_abs);
    jfield(f, "tie_rel", t->tie_rel);
    fputs(", \"reason\": ", f);
    jstr(f, t->reason);
    fputs("}", f);
    if (it->kind == M3_STAGE_EXACT) {
        fprintf(f, ", \"exact\": {\"mismatches\": %lld, \"first\": ", (long long)it->exact_mismatch);
        jidx(f, it, it->exact_first);
        fputs("}}", f);
        return;
    }
    if (it->kind == M3_STAGE_INDEX_SET) {
        const m3_setdiff *s = &it->set;
        fprintf(f, ", \"set\": {\"rows\": %lld, \"rows_equal\": %lld, \"agreement\": ", (long long)s->rows,
                (long long)s->rows_equal);
        jnum(f, m3_setdiff_agree(s));
        jfield(f, "jaccard_mean", m3_setdiff_jaccard(s));
        jfield(f, "recall", m3_setdiff_recall(s));
        fprintf(f, ", \"width_a\": %lld, \"width_b\": %lld, \"flips_near_tie\": %lld, \"flips_real\": %lld, "
                   "\"flips_unscored\": %lld, \"scored\": %s, \"first_flip_row\": %lld, "
                   "\"first_real_row\": %lld, \"min_flip_margin\": ",
                (long long)(it->rank ? it->shape[it->rank - 1] : 1), (long long)it->width_b,
                (long long)s->flips_tie, (long long)s->flips_real, (long long)s->flips_unscored,
                it->set_scored ? "true" : "false", (long long)s->first_flip_row,
                (long long)s->first_real_row);
        jnum(f, s->min_flip_margin);
        fputs("}}", f);
        return;
    }
    const m3_diff *d = &it->diff;
    fprintf(f, ", \"float\": {\"n\": %lld, \"n_compared\": %lld, \"nmse\": ", (long long)d->n,
            (long long)d->n_cmp);
    jnum(f, m3_diff_nmse(d));
    jfield(f, "sqnr_db", m3_diff_sqnr_db(d));
    jfield(f, "cosine", m3_diff_cosine(d));
    jfield(f, "max_abs", d->max_abs);
    jfield_idx(f, it, "max_abs_index", d->max_abs_idx);
    jfield(f, "max_abs_a", (double)d->max_abs_a);
    jfield(f, "max_abs_b", (double)d->max_abs_b);
    jfield(f, "rel_mean", m3_diff_mean_rel(d));
    jfield(f, "rel_max", d->max_rel);
    jfield_idx(f, it, "rel_max_index", d->max_rel_idx);
    fprintf(f, ", \"nan_a\": %lld, \"nan_b\": %lld, \"inf_a\": %lld, \"inf_b\": %lld, "
               "\"nonfinite_mismatch\": %lld, \"first_nonfinite_mismatch\": ",
            (long long)d->nan_a, (long long)d->nan_b, (long long)d->inf_a, (long long)d->inf_b,
            (long long)d->nonfinite_mismatch);
    jidx(f, it, d->first_mismatch);
    jfield(f, "sum_sq_err", d->sse);
    jfield(f, "sum_sq_a", d->saa);
    fputs(", \"abs_diff_hist_log2\": [", f);
    for (int k = 0; k < M3_DIFF_HIST_BINS; k++) fprintf(f, "%s%lld", k ? ", " : "", (long long)d->hist[k]);
    fputs("]", f);
    if (it->kind == M3_STAGE_WEIGHTS_BY_ID) fprintf(f, ", \"rows_skipped\": %lld", (long long)it->rows_skipped);
    fputs("}", f);
    if (it->kind == M3_STAGE_LOGITS) {
        const m3_logit_stats *L = &it->logit;
        fprintf(f, ", \"logits\": {\"positions\": %lld, \"top1_agree\": %lld, \"top1_agreement\": ",
                (long long)L->rows, (long long)L->top1_agree);
        jnum(f, L->rows ? (double)L->top1_agree / (double)L->rows : 1.0);
        jfield(f, "kl_mean", L->kl_mean);
        jfield(f, "kl_median", L->kl_median);
        jfield(f, "kl_p99", L->kl_p99);
        jfield(f, "kl_max", L->kl_max);
        fprintf(f, ", \"kl_max_position\": %lld, \"kl_nan\": %lld, \"dp_mean\": ", (long long)L->kl_max_row,
                (long long)L->kl_nan);
        jnum(f, L->dp_mean);
        jfield(f, "dp_max_abs", L->dp_max_abs);
        fputs("}", f);
    }
    fputs("}", f);
}

m3_status m3_report_json(const m3_cmp_report *r, const char *path) {
    char tmp[1024];
    FILE *f = m3_report_open(path, tmp, sizeof tmp);
    if (!f) return M3_ERR_IO;
    fputs("{\n  \"format\": \"m3-compare/1\",\n  \"a\": {\"path\": ", f);
    jstr(f, r->path_a);
    fputs(", \"producer\": ", f);
    jstr(f, r->producer_a);
    fputs(", \"profile\": ", f);
    jstr(f, r->profile_a);
    fputs(", \"variant\": ", f);
    jstr(f, r->variant_a);
    fputs("},\n  \"b\": {\"path\": ", f);
    jstr(f, r->path_b);
    fputs(", \"producer\": ", f);
    jstr(f, r->producer_b);
    fputs(", \"profile\": ", f);
    jstr(f, r->profile_b);
    fputs(", \"variant\": ", f);
    jstr(f, r->variant_b);
    fprintf(f, "},\n  \"tolerance_class\": \"%s\", \"rel_floor\": ", m3_tol_class_name(r->tol_class));
    jnum(f, r->rel_floor);
    fprintf(f, ",\n  \"summary\": {\"compared\": %d, \"passed\": %d, \"failed\": %d, \"only_a\": %d, "
               "\"only_b\": %d, \"exit_code\": %d, \"first_fail\": ",
            r->n_pass + r->n_fail, r->n_pass, r->n_fail, r->n_only_a, r->n_only_b, m3_cmp_exit_code(r));
    if (r->first_fail >= 0) {
        char name[200];
        m3_cmp_item_name(r, &r->items[r->first_fail], name, sizeof name);
        jstr(f, name);
        fputs(", \"first_fail_why\": ", f);
        jstr(f, r->items[r->first_fail].why);
    } else {
        fputs("null", f);
    }
    fprintf(f, ", \"bytes\": %lld, \"seconds\": ", (long long)r->bytes);
    jnum(f, r->seconds);
    fputs("},\n  \"stages\": [\n", f);
    for (int i = 0; i < r->n_items; i++) {
        item(f, r, &r->items[i]);
        fputs(i + 1 < r->n_items ? ",\n" : "\n", f);
    }
    fputs("  ]\n}\n", f);
    return m3_report_commit(f, tmp, path);
}
