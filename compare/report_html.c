/* compare/report_html.c: `m3 compare --html`: one self-contained HTML file (inline CSS and
 * SVG, no script, no external resource) with: the verdict, error (log10 NMSE) against layer
 * per stage, set agreement against layer for index_topk / expert_ids, the |Δ| histogram of
 * the worst float stage, and the full per-stage table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/compare.h"
#include "compare/svg.h"

#define W M3_SVG_W
#define H M3_SVG_H
#define ML M3_SVG_ML
#define MT M3_SVG_MT
#define MB M3_SVG_MB

/* Collect per-layer series of one pass: float-like stages (sets = false) or set stages. */
static int collect_series(const m3_cmp_report *r, int pass, bool sets, m3_svg_series **out, double *ymin,
                          double *ymax, double *xmax) {
    m3_svg_series *s = calloc((size_t)r->n_items + 1, sizeof *s);
    int ns = 0;
    *ymin = INFINITY, *ymax = -INFINITY, *xmax = 0;
    for (int i = 0; i < r->n_items; i++) {
        const m3_cmp_item *it = &r->items[i];
        if (it->pass != pass || it->scope != M3_SCOPE_LAYER) continue;
        if (it->status != M3_CMP_PASS && it->status != M3_CMP_FAIL) continue;
        bool is_set = it->kind == M3_STAGE_INDEX_SET;
        if (is_set != sets || it->kind == M3_STAGE_EXACT) continue;
        int k = 0;
        while (k < ns && strcmp(s[k].name, it->stage)) k++;
        if (k == ns) {
            snprintf(s[ns].name, sizeof s[ns].name, "%s", it->stage);
            s[ns].x = malloc(sizeof(double) * (size_t)r->n_items);
            s[ns].y = malloc(sizeof(double) * (size_t)r->n_items);
            ns++;
        }
        double y;
        if (sets) {
            y = m3_setdiff_agree(&it->set);
        } else {
            double e = m3_diff_nmse(&it->diff);
            y = e > 0 ? log10(e) : -20; /* exact agreement sits at the floor */
            if (isinf(e)) y = 3;
        }
        s[k].x[s[k].n] = it->layer;
        s[k].y[s[k].n++] = y;
        if (y < *ymin) *ymin = y;
        if (y > *ymax) *ymax = y;
        if (it->layer > *xmax) *xmax = it->layer;
    }
    *out = s;
    return ns;
}

static void histogram(FILE *f, const m3_cmp_report *r) {
    if (r->worst < 0) return;
    const m3_cmp_item *it = &r->items[r->worst];
    char name[200];
    m3_cmp_item_name(r, it, name, sizeof name);
    const int64_t *h = it->diff.hist;
    int lo = M3_DIFF_HIST_BINS, hi = -1;
    int64_t mx = 0;
    for (int k = 0; k < M3_DIFF_HIST_BINS; k++)
        if (h[k]) {
            if (k < lo) lo = k;
            hi = k;
            if (h[k] > mx) mx = h[k];
        }
    if (hi < 0) return;
    int nb = hi - lo + 1;
    double pw = W - ML - 20, ph = H - MT - MB, bw = pw / nb;
    fputs("<figure><figcaption>Histogram of |&#916;| (log2 bins) for the worst stage: ", f);
    m3_html_escape(f, name);
    fprintf(f, " (NMSE %.3g)</figcaption>\n<svg class=\"hist\" xmlns=\"http://www.w3.org/2000/svg\" "
               "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n",
            m3_diff_nmse(&it->diff), W, H, W, H);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%g\" height=\"%g\" fill=\"#fafafa\" stroke=\"#999\"/>\n",
            ML, MT, pw, ph);
    for (int k = lo; k <= hi; k++) {
        double bh = ph * (double)h[k] / (double)mx, x = ML + bw * (k - lo);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#1f77b4\">"
                   "<title>|d| %s 2^%d: %lld</title></rect>\n",
                x + 1, MT + ph - bh, bw > 2 ? bw - 2 : bw, bh, k == 0 ? "=" : ">=", k == 0 ? 0 : k - 41,
                (long long)h[k]);
        if (nb <= 24 || (k - lo) % 4 == 0)
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%s%d</text>\n",
                    x + bw / 2, MT + (int)ph + 14, k == 0 ? "0" : "2^", k == 0 ? 0 : k - 41);
    }
    fprintf(f, "<text x=\"14\" y=\"%g\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 14 %g)\">"
               "count (max %lld)</text>\n", MT + ph / 2, MT + ph / 2, (long long)mx);
    fputs("</svg></figure>\n", f);
}

static void table(FILE *f, const m3_cmp_report *r) {
    fputs("<table><thead><tr><th>stage</th><th>kind</th><th>verdict</th><th>NMSE</th><th>SQNR dB</th>"
          "<th>max |&#916;| (index: A &#8594; B)</th><th>cosine</th><th>rel mean / max</th>"
          "<th>sets / logits</th><th>why</th></tr></thead><tbody>\n", f);
    for (int i = 0; i < r->n_items; i++) {
        const m3_cmp_item *it = &r->items[i];
        char name[200], idx[64];
        m3_cmp_item_name(r, it, name, sizeof name);
        const char *cls = it->status == M3_CMP_FAIL ? "fail" : it->status == M3_CMP_PASS ? "ok" : "miss";
        const char *v = it->status == M3_CMP_FAIL ? "FAIL" : it->status == M3_CMP_PASS ? "ok"
                      : it->status == M3_CMP_ONLY_A ? "only in A" : "only in B";
        fprintf(f, "<tr class=\"%s\"><td>", cls);
        m3_html_escape(f, name);
        fprintf(f, "</td><td>%s</td><td>%s</td>", m3_stage_kind_name(it->kind), v);
        if (it->status == M3_CMP_ONLY_A || it->status == M3_CMP_ONLY_B) {
            fputs("<td colspan=\"7\"></td></tr>\n", f);
            continue;
        }
        const m3_diff *d = &it->diff;
        if (it->kind == M3_STAGE_INDEX_SET) {
            const m3_setdiff *s = &it->set;
            fprintf(f, "<td colspan=\"5\"></td><td>agree %.4f, Jaccard %.4f, recall %.4f, flips: %lld near-tie, "
                       "%lld real%s</td>",
                    m3_setdiff_agree(s), m3_setdiff_jaccard(s), m3_setdiff_recall(s), (long long)s->flips_tie,
                    (long long)s->flips_real, it->set_scored ? "" : " (unscored)");
        } else if (it->kind == M3_STAGE_EXACT) {
            fprintf(f, "<td colspan=\"5\"></td><td>%lld elements differ</td>", (long long)it->exact_mismatch);
        } else {
            m3_cmp_format_index(it, d->max_abs_idx, idx, sizeof idx);
            fprintf(f, "<td>%.3g</td><td>%.1f</td><td>%.3g at %s: %.6g &#8594; %.6g</td><td>%.6f</td>"
                       "<td>%.3g / %.3g</td><td>",
                    m3_diff_nmse(d), isinf(m3_diff_sqnr_db(d)) ? 999.0 : m3_diff_sqnr_db(d), d->max_abs, idx,
                    (double)d->max_abs_a, (double)d->max_abs_b, m3_diff_cosine(d), m3_diff_mean_rel(d), d->max_rel);
            if (d->nan_a || d->nan_b || d->inf_a || d->inf_b)
                fprintf(f, "NaN %lld/%lld, Inf %lld/%lld ", (long long)d->nan_a, (long long)d->nan_b,
                        (long long)d->inf_a, (long long)d->inf_b);
            if (it->kind == M3_STAGE_LOGITS) {
                const m3_logit_stats *L = &it->logit;
                fprintf(f, "KL mean %.3g, median %.3g, p99 %.3g, max %.3g; top-1 %.4f; &#916;p mean %+.3g",
                        L->kl_mean, L->kl_median, L->kl_p99, L->kl_max,
                        L->rows ? (double)L->top1_agree / (double)L->rows : 1.0, L->dp_mean);
            }
            fputs("</td>", f);
        }
        fputs("<td>", f);
        m3_html_escape(f, it->why);
        fputs("</td></tr>\n", f);
    }
    fputs("</tbody></table>\n", f);
}

m3_status m3_report_html(const m3_cmp_report *r, const char *path) {
    char tmp[1024];
    FILE *f = m3_report_open(path, tmp, sizeof tmp);
    if (!f) return M3_ERR_IO;
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>m3 compare</title>\n"
          "<style>body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;"
          "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}tr.fail{background:#fdd}"
          "tr.miss{background:#ffe}.verdict-ok{color:#080}.verdict-fail{color:#c00}figure{margin:1em 0}"
          "figcaption{font-weight:bold;margin-bottom:4px}code{background:#f4f4f4}</style>\n</head><body>\n"
          "<h1>m3 compare</h1>\n<p>A (reference): <code>", f);
    m3_html_escape(f, r->path_a);
    fputs("</code> &#8212; ", f);
    m3_html_escape(f, r->producer_a);
    fputs(", profile ", f);
    m3_html_escape(f, r->profile_a);
    fputs("<br>B: <code>", f);
    m3_html_escape(f, r->path_b);
    fputs("</code> &#8212; ", f);
    m3_html_escape(f, r->producer_b);
    fputs(", profile ", f);
    m3_html_escape(f, r->profile_b);
    fprintf(f, "<br>tolerance class %s</p>\n", m3_tol_class_name(r->tol_class));
    fprintf(f, "<h2 class=\"%s\">%s: %d stages compared, %d beyond tolerance, %d only in A, %d only in B</h2>\n",
            r->n_fail ? "verdict-fail" : "verdict-ok", r->n_fail ? "DIFFERENT" : "OK", r->n_pass + r->n_fail,
            r->n_fail, r->n_only_a, r->n_only_b);
    if (r->first_fail >= 0) {
        char name[200];
        m3_cmp_item_name(r, &r->items[r->first_fail], name, sizeof name);
        fputs("<p>First stage beyond tolerance: <b>", f);
        m3_html_escape(f, name);
        fputs("</b>: ", f);
        m3_html_escape(f, r->items[r->first_fail].why);
        fputs("</p>\n", f);
    }
    /* one pair of plots per pass (the first 8 passes) */
    int shown = 0;
    for (int i = 0; i < r->n_items && shown < 8; i++) {
        int pass = r->items[i].pass;
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= r->items[j].pass == pass;
        if (seen) continue;
        shown++;
        char title[160];
        m3_svg_series *s;
        double ymin, ymax, xmax;
        int ns = collect_series(r, pass, false, &s, &ymin, &ymax, &xmax);
        if (ns) {
            snprintf(title, sizeof title, "Error against layer, pass %d: log10 NMSE per stage (-20 = exact)", pass);
            m3_svg_line_chart(f, title, "log10 NMSE", s, ns, floor(ymin), ceil(ymax), xmax, "err");
        }
        m3_svg_series_free(s, ns);
        ns = collect_series(r, pass, true, &s, &ymin, &ymax, &xmax);
        if (ns) {
            snprintf(title, sizeof title, "Set agreement against layer, pass %d: fraction of identical rows", pass);
            m3_svg_line_chart(f, title, "agreement", s, ns, ymin < 0.9 ? floor(ymin * 10) / 10 : 0.9, 1.0, xmax, "sets");
        }
        m3_svg_series_free(s, ns);
    }
    histogram(f, r);
    fputs("<h2>All stages (execution order)</h2>\n", f);
    table(f, r);
    fputs("<p>Metrics: docs/compare.md. Generated by m3 ", f);
    m3_html_escape(f, m3_version_string());
    fputs(".</p>\n</body></html>\n", f);
    return m3_report_commit(f, tmp, path);
}
