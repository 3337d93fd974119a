/* compare/report_attr.c: the `m3 attribute` reports (docs/attribute.md): a terminal table of
 * layers x factors, a JSON document with every number (format m3-attribute/1) and a
 * self-contained HTML page (heat-map tables, error against layer per factor; inline CSS and
 * SVG through compare/svg.h, no script, no external resource). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/attribute.h"
#include "compare/compare.h"
#include "compare/svg.h"
#include "ref/json.h"

#define UNAVAILABLE "unavailable in this build"

/* "dense"/"sparse" attention and "mlp"/"moe" FFN of a layer */
static const char *layer_kind(const m3_attr_result *r, int L) {
    static const char *k[4] = {"dense/mlp", "dense/moe", "sparse/mlp", "sparse/moe"};
    return k[(r->layer_sparse[L] ? 2 : 0) + (r->layer_moe[L] ? 1 : 0)];
}

static void fmt_nmse(char *b, size_t cap, double e) {
    if (isnan(e))
        snprintf(b, cap, "-");
    else if (e == 0)
        snprintf(b, cap, "0");
    else
        snprintf(b, cap, "%.1e", e);
}

/* ---- text ------------------------------------------------------------------------------ */

#define CW 11 /* cell width */

/* ANSI colour of a cell by magnitude: exact 0 dim, < 1e-6 green, < 1e-4 yellow, else red. */
static const char *cell_color(double e, bool nonfinite) {
    if (nonfinite) return "\033[1;31m";
    if (isnan(e) || e == 0) return "\033[2m";
    if (e < 1e-6) return "\033[32m";
    if (e < 1e-4) return "\033[33m";
    return "\033[31m";
}

/* The stage a factor's column shows in the second table. */
static int acts_stage(const m3_attr_factor *f) {
    int s = m3_attr_stage_find(f->acts);
    return s < 0 ? M3_ATTR_OUTPUT : s;
}

/* One table (layer output, or the stage where each factor acts) for one mode. */
static void text_table(FILE *f, const m3_attr_result *r, int mode, bool acts, bool color) {
    fprintf(f, "%-18s", acts ? "  stage" : "layer");
    for (int k = 0; k < r->n_factor; k++)
        fprintf(f, " %-*s", CW, acts ? r->factor[k]->acts : r->factor[k]->name);
    fputc('\n', f);
    for (int L = 0; L < r->n_layer; L++) {
        /* the dominant single factor of this row is shown bold */
        int top = -1;
        double topv = 0;
        for (int k = 0; k < r->n_factor; k++) {
            if (r->factor[k]->control || r->factor[k]->combined) continue;
            double e =
                m3_attr_nmse(r, k, mode, L, acts ? acts_stage(r->factor[k]) : M3_ATTR_OUTPUT);
            if (!isnan(e) && e > topv) topv = e, top = k;
        }
        fprintf(f, "%0*d %-15s", r->n_layer >= 100 ? 3 : 2, L, layer_kind(r, L));
        bool any_flip = false;
        for (int k = 0; k < r->n_factor; k++) {
            char b[32];
            const m3_attr_run *run = m3_attr_get(r, k, mode);
            int s = acts ? acts_stage(r->factor[k]) : M3_ATTR_OUTPUT;
            double e = NAN;
            bool nf = false;
            if (!r->available[k]) {
                snprintf(b, sizeof b, "n/a");
            } else if (m3_attr_stage_is_set(s)) {
                if (run->layer[L].present[s])
                    snprintf(b, sizeof b, "%lld flips", (long long)m3_attr_flips(r, k, mode, L, s));
                else
                    snprintf(b, sizeof b, "-");
                e = m3_attr_flips(r, k, mode, L, s) ? 1 : 0;
            } else {
                e = m3_attr_nmse(r, k, mode, L, s);
                nf = run->layer[L].present[s] && run->layer[L].diff[s].nonfinite_mismatch;
                fmt_nmse(b, sizeof b, e);
                if (nf) snprintf(b, sizeof b, "NaN/Inf");
            }
            if (r->available[k])
                any_flip |= m3_attr_flips(r, k, mode, L, M3_ATTR_INDEX_TOPK) ||
                            m3_attr_flips(r, k, mode, L, M3_ATTR_EXPERT_IDS);
            if (color)
                fprintf(f, " %s%s%-*s\033[0m", k == top ? "\033[1m" : "",
                        r->available[k] ? cell_color(e, nf) : "\033[2m", CW, b);
            else
                fprintf(f, " %-*s", CW, b);
        }
        fputc('\n', f);
        if (acts || !any_flip) continue;
        /* second line: set flips (rows whose index_topk / expert_ids set differs) */
        fprintf(f, "%-18s", "   flips i/e");
        for (int k = 0; k < r->n_factor; k++) {
            char b[32] = "";
            if (r->available[k]) {
                int64_t fi = m3_attr_flips(r, k, mode, L, M3_ATTR_INDEX_TOPK),
                        fe = m3_attr_flips(r, k, mode, L, M3_ATTR_EXPERT_IDS);
                if (fi || fe) snprintf(b, sizeof b, "%lld/%lld", (long long)fi, (long long)fe);
            }
            fprintf(f, " %s%-*s%s", color ? "\033[35m" : "", CW, b, color ? "\033[0m" : "");
        }
        fputc('\n', f);
    }
}

void m3_attr_report_text(FILE *f, const m3_attr_result *r, bool color) {
    fprintf(f, "m3 attribute: %s, %d tokens, %d layers; baseline fp32 (next token %d)\n", r->model,
            r->n_tok, r->n_layer, r->base_next);
    for (int k = 0; k < r->n_factor; k++) {
        const m3_attr_factor *fa = r->factor[k];
        fprintf(f, "  %-11s %s", fa->name, fa->about);
        if (!r->available[k])
            fprintf(f, "  [%s%s: %s%s]", color ? "\033[2m" : "", UNAVAILABLE, r->why[k],
                    color ? "\033[0m" : "");
        else if (r->left_out[k][0])
            fprintf(f, "  [applied: %s%s%s; left out, %s: %s]", fa->profile,
                    r->applied[k][0] ? " + " : "", r->applied[k], UNAVAILABLE, r->left_out[k]);
        fputc('\n', f);
    }
    for (int mode = 0; mode < M3_ATTR_N_MODE; mode++) {
        if (!r->mode[mode]) continue;
        fprintf(
            f, "\n%s%s%s: %s\n", color ? "\033[1m" : "", m3_attr_mode_name(mode),
            color ? "\033[0m" : "",
            mode == M3_ATTR_FORCED
                ? "every layer starts from the baseline's layers/NN/input: each layer's own error"
                : "ordinary forward: each layer's error includes what earlier layers passed on");
        fputs("NMSE of layers/NN/output against the baseline (n/a: " UNAVAILABLE
              "; flips i/e: rows of index_topk / expert_ids whose set differs)\n",
              f);
        text_table(f, r, mode, false, color);
        fputs("NMSE (or set flips) at the stage where each factor acts (spec)\n", f);
        text_table(f, r, mode, true, color);
        fprintf(f, "%-18s", "logits KL mean");
        for (int k = 0; k < r->n_factor; k++) {
            const m3_attr_run *run = m3_attr_get(r, k, mode);
            char b[32] = "n/a";
            if (run->ran && run->logits.present) fmt_nmse(b, sizeof b, run->logits.kl_mean);
            fprintf(f, " %-*s", CW, b);
        }
        fprintf(f, "\n%-18s", "logits top-1");
        for (int k = 0; k < r->n_factor; k++) {
            const m3_attr_run *run = m3_attr_get(r, k, mode);
            char b[32] = "n/a";
            if (run->ran && run->logits.present)
                snprintf(b, sizeof b, "%.3f",
                         run->logits.rows
                             ? (double)run->logits.top1_agree / (double)run->logits.rows
                             : 1.0);
            fprintf(f, " %-*s", CW, b);
        }
        fputc('\n', f);
    }
    int vm = m3_attr_verdict_mode(r);
    fprintf(f, "\nverdict (%s mode, layer output NMSE of the single factors):\n",
            m3_attr_mode_name(vm));
    for (int L = 0; L < r->n_layer; L++) {
        char b[512];
        m3_attr_verdict(r, vm, L, b, sizeof b);
        fprintf(f, "  %s\n", b);
    }
    fprintf(f, "baseline stages held in memory: %.1f MiB; %.2f s\n",
            (double)r->capture_bytes / 1048576.0, r->seconds);
}

/* ---- JSON ------------------------------------------------------------------------------ */

/* Non-finite numbers are the strings "inf", "-inf", "nan", as in m3-compare/1. */
static void jnum(m3_jw *w, const char *key, double v) {
    if (isnan(v))
        m3_jw_str(w, key, "nan");
    else if (isinf(v))
        m3_jw_str(w, key, v > 0 ? "inf" : "-inf");
    else
        m3_jw_double(w, key, v);
}

static void json_float(m3_jw *w, const char *key, const m3_diff *d) {
    m3_jw_object(w, key);
    m3_jw_int(w, "n", d->n);
    m3_jw_int(w, "n_compared", d->n_cmp);
    jnum(w, "nmse", m3_diff_nmse(d));
    jnum(w, "sqnr_db", m3_diff_sqnr_db(d));
    jnum(w, "cosine", m3_diff_cosine(d));
    jnum(w, "max_abs", d->max_abs);
    m3_jw_int(w, "max_abs_index", d->max_abs_idx);
    jnum(w, "max_abs_base", d->max_abs_a);
    jnum(w, "max_abs_factor", d->max_abs_b);
    jnum(w, "rel_mean", m3_diff_mean_rel(d));
    jnum(w, "rel_max", d->max_rel);
    m3_jw_int(w, "nan_base", d->nan_a);
    m3_jw_int(w, "nan_factor", d->nan_b);
    m3_jw_int(w, "inf_base", d->inf_a);
    m3_jw_int(w, "inf_factor", d->inf_b);
    m3_jw_int(w, "nonfinite_mismatch", d->nonfinite_mismatch);
    jnum(w, "sum_sq_err", d->sse);
    jnum(w, "sum_sq_base", d->saa);
    m3_jw_end(w);
}

static void json_set(m3_jw *w, const char *key, const m3_setdiff *s) {
    m3_jw_object(w, key);
    m3_jw_int(w, "rows", s->rows);
    m3_jw_int(w, "rows_equal", s->rows_equal);
    m3_jw_int(w, "flips", s->rows - s->rows_equal);
    m3_jw_int(w, "flips_near_tie", s->flips_tie);
    m3_jw_int(w, "flips_real", s->flips_real);
    m3_jw_int(w, "flips_unscored", s->flips_unscored);
    jnum(w, "agreement", m3_setdiff_agree(s));
    jnum(w, "jaccard_mean", m3_setdiff_jaccard(s));
    jnum(w, "recall", m3_setdiff_recall(s));
    m3_jw_int(w, "first_flip_row", s->first_flip_row);
    jnum(w, "min_flip_margin", s->min_flip_margin);
    m3_jw_end(w);
}

m3_status m3_attr_report_json(const m3_attr_result *r, const char *path) {
    char tmp[1024];
    FILE *f = m3_report_open(path, tmp, sizeof tmp);
    if (!f) return M3_ERR_IO;
    m3_jw w;
    m3_jw_init(&w, f);
    m3_jw_object(&w, NULL);
    m3_jw_str(&w, "format", "m3-attribute/1");
    m3_jw_str(&w, "model", r->model);
    m3_jw_int(&w, "tokens", r->n_tok);
    m3_jw_int(&w, "n_layer", r->n_layer);
    m3_jw_object(&w, "baseline");
    m3_jw_str(&w, "profile", "fp32");
    m3_jw_str(&w, "variant", "default");
    m3_jw_int(&w, "next_token", r->base_next);
    m3_jw_end(&w);
    m3_jw_array(&w, "modes");
    for (int mode = 0; mode < M3_ATTR_N_MODE; mode++)
        if (r->mode[mode]) m3_jw_str(&w, NULL, m3_attr_mode_name(mode));
    m3_jw_end(&w);
    m3_jw_array(&w, "layers");
    for (int L = 0; L < r->n_layer; L++) {
        m3_jw_object(&w, NULL);
        m3_jw_int(&w, "layer", L);
        m3_jw_bool(&w, "sparse_attention", r->layer_sparse[L]);
        m3_jw_bool(&w, "moe", r->layer_moe[L]);
        m3_jw_end(&w);
    }
    m3_jw_end(&w);
    m3_jw_array(&w, "factors");
    for (int k = 0; k < r->n_factor; k++) {
        const m3_attr_factor *fa = r->factor[k];
        m3_jw_object(&w, NULL);
        m3_jw_str(&w, "name", fa->name);
        m3_jw_str(&w, "profile", fa->profile);
        m3_jw_str(&w, "variant_keys", fa->keys);
        m3_jw_str(&w, "acts_at", fa->acts);
        m3_jw_str(&w, "about", fa->about);
        m3_jw_bool(&w, "control", fa->control);
        m3_jw_bool(&w, "combined", fa->combined);
        m3_jw_bool(&w, "available", r->available[k]);
        m3_jw_str(&w, "status", r->available[k] ? "ok" : UNAVAILABLE);
        if (!r->available[k]) m3_jw_str(&w, "why", r->why[k]);
        m3_jw_str(&w, "applied_keys", r->applied[k]);
        if (fa->combined) m3_jw_str(&w, "left_out_keys", r->left_out[k]);
        m3_jw_object(&w, "modes");
        for (int mode = 0; mode < M3_ATTR_N_MODE; mode++) {
            if (!r->mode[mode]) continue;
            const m3_attr_run *run = m3_attr_get(r, k, mode);
            m3_jw_object(&w, m3_attr_mode_name(mode));
            m3_jw_str(&w, "status", run->ran ? "ok" : UNAVAILABLE);
            if (run->ran) {
                m3_jw_int(&w, "next_token", run->next);
                jnum(&w, "seconds", run->seconds);
                m3_jw_object(&w, "logits");
                if (run->logits.present) {
                    m3_jw_int(&w, "rows", run->logits.rows);
                    m3_jw_int(&w, "top1_agree", run->logits.top1_agree);
                    jnum(&w, "top1_agreement",
                         run->logits.rows
                             ? (double)run->logits.top1_agree / (double)run->logits.rows
                             : 1.0);
                    jnum(&w, "kl_mean", run->logits.kl_mean);
                    jnum(&w, "kl_max", run->logits.kl_max);
                    json_float(&w, "float", &run->logits.diff);
                }
                m3_jw_end(&w);
            }
            m3_jw_array(&w, "layers");
            for (int L = 0; L < r->n_layer; L++) {
                m3_jw_object(&w, NULL);
                m3_jw_int(&w, "layer", L);
                if (!run->ran) {
                    m3_jw_str(&w, "status", UNAVAILABLE);
                    m3_jw_end(&w);
                    continue;
                }
                m3_jw_str(&w, "status", "ok");
                jnum(&w, "output_nmse", m3_attr_nmse(r, k, mode, L, M3_ATTR_OUTPUT));
                m3_jw_int(&w, "index_topk_flips", m3_attr_flips(r, k, mode, L, M3_ATTR_INDEX_TOPK));
                m3_jw_int(&w, "expert_ids_flips", m3_attr_flips(r, k, mode, L, M3_ATTR_EXPERT_IDS));
                m3_jw_object(&w, "stages");
                const m3_attr_cell *c = &run->layer[L];
                for (int s = 0; s < M3_ATTR_N_STAGE; s++) {
                    if (!c->present[s]) continue;
                    if (m3_attr_stage_is_set(s))
                        json_set(&w, m3_attr_stage_name(s), &c->set[s]);
                    else
                        json_float(&w, m3_attr_stage_name(s), &c->diff[s]);
                }
                m3_jw_end(&w);
                m3_jw_end(&w);
            }
            m3_jw_end(&w);
            m3_jw_end(&w);
        }
        m3_jw_end(&w);
        m3_jw_end(&w);
    }
    m3_jw_end(&w);
    int vm = m3_attr_verdict_mode(r);
    m3_jw_object(&w, "verdict");
    m3_jw_str(&w, "mode", m3_attr_mode_name(vm));
    m3_jw_array(&w, "layers");
    for (int L = 0; L < r->n_layer; L++) {
        char b[512];
        m3_attr_verdict(r, vm, L, b, sizeof b);
        m3_jw_str(&w, NULL, b);
    }
    m3_jw_end(&w);
    m3_jw_end(&w);
    m3_jw_int(&w, "capture_bytes", (int64_t)r->capture_bytes);
    jnum(&w, "seconds", r->seconds);
    m3_jw_end(&w);
    return m3_report_commit(f, tmp, path);
}

/* ---- HTML ------------------------------------------------------------------------------ */

/* Background of a heat-map cell: hue 120 (green) at NMSE <= 1e-12 down to 0 (red) at
 * >= 1e-2, on log10; exact zero white-green, n/a grey. */
static void heat_style(FILE *f, double e, bool avail) {
    if (!avail || isnan(e)) {
        fputs(" style=\"background:#eee;color:#888\"", f);
        return;
    }
    if (e == 0) {
        fputs(" style=\"background:#e8f5e9\"", f);
        return;
    }
    double t = isinf(e) ? 1 : (log10(e) + 12) / 10;
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    fprintf(f, " style=\"background:hsl(%.0f,75%%,%.0f%%)\"", 120 * (1 - t), 85 - 20 * t);
}

static void html_table(FILE *f, const m3_attr_result *r, int mode) {
    fputs("<table class=\"heat\"><thead><tr><th>layer</th><th>attention/FFN</th>", f);
    for (int k = 0; k < r->n_factor; k++) {
        fputs("<th>", f);
        m3_html_escape(f, r->factor[k]->name);
        fputs("</th>", f);
    }
    fputs("</tr></thead><tbody>\n", f);
    for (int L = 0; L < r->n_layer; L++) {
        fprintf(f, "<tr><td>%d</td><td>%s</td>", L, layer_kind(r, L));
        for (int k = 0; k < r->n_factor; k++) {
            double e = m3_attr_nmse(r, k, mode, L, M3_ATTR_OUTPUT);
            fputs("<td", f);
            heat_style(f, e, r->available[k]);
            fputs(">", f);
            if (!r->available[k]) {
                fputs("n/a", f);
            } else {
                char b[32];
                fmt_nmse(b, sizeof b, e);
                fputs(b, f);
                int64_t fi = m3_attr_flips(r, k, mode, L, M3_ATTR_INDEX_TOPK),
                        fe = m3_attr_flips(r, k, mode, L, M3_ATTR_EXPERT_IDS);
                if (fi || fe)
                    fprintf(f, "<br><small>flips i %lld / e %lld</small>", (long long)fi,
                            (long long)fe);
                /* where the factor acts, when that is not the output */
                int s = m3_attr_stage_find(r->factor[k]->acts);
                if (s >= 0 && s != M3_ATTR_OUTPUT && !m3_attr_stage_is_set(s)) {
                    fmt_nmse(b, sizeof b, m3_attr_nmse(r, k, mode, L, s));
                    fprintf(f, "<br><small>%s %s</small>", m3_attr_stage_name(s), b);
                }
            }
            fputs("</td>", f);
        }
        fputs("</tr>\n", f);
    }
    fputs("<tr><td colspan=\"2\">logits KL mean / top-1</td>", f);
    for (int k = 0; k < r->n_factor; k++) {
        const m3_attr_run *run = m3_attr_get(r, k, mode);
        if (!run->ran || !run->logits.present) {
            fputs("<td>n/a</td>", f);
            continue;
        }
        fprintf(f, "<td>%.2g / %.3f</td>", run->logits.kl_mean,
                run->logits.rows ? (double)run->logits.top1_agree / (double)run->logits.rows : 1.0);
    }
    fputs("</tr></tbody></table>\n", f);
}

/* log10 of an NMSE for plotting: exact agreement sits at -20, non-finite at +3 */
static double plot_y(double e) {
    return isinf(e) ? 3 : e > 0 ? log10(e) : -20;
}

static void chart(FILE *f, const char *title, m3_svg_series *s, int ns, int n_layer) {
    double ymin = INFINITY, ymax = -INFINITY;
    for (int i = 0; i < ns; i++)
        for (int k = 0; k < s[i].n; k++) {
            if (s[i].y[k] < ymin) ymin = s[i].y[k];
            if (s[i].y[k] > ymax) ymax = s[i].y[k];
        }
    if (ns && ymin <= ymax)
        m3_svg_line_chart(f, title, "log10 NMSE", s, ns, floor(ymin), ceil(ymax), n_layer - 1,
                          "err");
}

/* Append the per-layer log10 NMSE of stage st of factor k in `mode` as one series. */
static void add_series(m3_svg_series *s, int *ns, const m3_attr_result *r, int k, int mode, int st,
                       const char *name) {
    m3_svg_series *x = &s[*ns];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->x = malloc(sizeof(double) * (size_t)r->n_layer);
    x->y = malloc(sizeof(double) * (size_t)r->n_layer);
    x->n = 0;
    if (!x->x || !x->y) {
        free(x->x), free(x->y);
        return;
    }
    for (int L = 0; L < r->n_layer; L++) {
        double e = m3_attr_nmse(r, k, mode, L, st);
        if (isnan(e)) continue;
        x->x[x->n] = L;
        x->y[x->n++] = plot_y(e);
    }
    if (x->n)
        (*ns)++;
    else
        free(x->x), free(x->y);
}

m3_status m3_attr_report_html(const m3_attr_result *r, const char *path) {
    char tmp[1024];
    FILE *f = m3_report_open(path, tmp, sizeof tmp);
    if (!f) return M3_ERR_IO;
    fputs(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>m3 "
        "attribute</title>\n"
        "<style>body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;"
        "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
        "table.heat td{text-align:right;font-family:monospace}figure{margin:1em 0}"
        "figcaption{font-weight:bold;margin-bottom:4px}code{background:#f4f4f4}.na{color:#888}</"
        "style>\n"
        "</head><body>\n<h1>m3 attribute</h1>\n<p>Model <code>",
        f);
    m3_html_escape(f, r->model);
    fprintf(
        f,
        "</code>, %d tokens, %d layers. Baseline: the fp32 reference (next token %d). "
        "Each factor is run alone on top of the baseline; error = NMSE against the baseline.</p>\n",
        r->n_tok, r->n_layer, r->base_next);
    fputs("<h2>Factors</h2>\n<table><thead><tr><th>factor</th><th>profile</th><th>variant keys</th>"
          "<th>acts at</th><th>what</th><th>status</th></tr></thead><tbody>\n",
          f);
    for (int k = 0; k < r->n_factor; k++) {
        const m3_attr_factor *fa = r->factor[k];
        fputs("<tr><td>", f);
        m3_html_escape(f, fa->name);
        fputs("</td><td>", f);
        m3_html_escape(f, fa->profile);
        fputs("</td><td>", f);
        m3_html_escape(f, fa->keys);
        fputs("</td><td>", f);
        m3_html_escape(f, fa->acts);
        fputs("</td><td>", f);
        m3_html_escape(f, fa->about);
        fputs("</td><td>", f);
        if (!r->available[k]) {
            fputs("<span class=\"na\">" UNAVAILABLE ": ", f);
            m3_html_escape(f, r->why[k]);
            fputs("</span>", f);
        } else {
            fputs("ran", f);
            if (r->left_out[k][0]) {
                fputs("; left out (" UNAVAILABLE "): ", f);
                m3_html_escape(f, r->left_out[k]);
            }
        }
        fputs("</td></tr>\n", f);
    }
    fputs("</tbody></table>\n", f);

    int vm = m3_attr_verdict_mode(r);
    fprintf(f, "<h2>Verdict per layer (%s mode)</h2>\n<ul>\n", m3_attr_mode_name(vm));
    for (int L = 0; L < r->n_layer; L++) {
        char b[512];
        m3_attr_verdict(r, vm, L, b, sizeof b);
        fputs("<li>", f);
        m3_html_escape(f, b);
        fputs("</li>\n", f);
    }
    fputs("</ul>\n", f);

    m3_svg_series *s = calloc((size_t)(r->n_factor + 1) * 2 * M3_ATTR_N_STAGE, sizeof *s);
    if (!s) {
        fclose(f);
        remove(tmp);
        return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int mode = 0; mode < M3_ATTR_N_MODE; mode++) {
        if (!r->mode[mode]) continue;
        fprintf(
            f,
            "<h2>%s mode</h2>\n<p>%s Cells: NMSE of <code>layers/NN/output</code>; flips i / e: "
            "rows of index_topk / expert_ids whose set differs; the stage where the factor acts "
            "below.</p>\n",
            m3_attr_mode_name(mode),
            mode == M3_ATTR_FORCED ? "Every layer starts from the baseline's layers/NN/input: each "
                                     "layer's error is its own."
                                   : "Ordinary forward: errors accumulate over the layers.");
        html_table(f, r, mode);
        int ns = 0;
        for (int k = 0; k < r->n_factor; k++)
            if (r->available[k]) add_series(s, &ns, r, k, mode, M3_ATTR_OUTPUT, r->factor[k]->name);
        char title[200];
        snprintf(title, sizeof title,
                 "%s: layer output error against layer, all factors (-20 = exact)",
                 m3_attr_mode_name(mode));
        chart(f, title, s, ns, r->n_layer);
        for (int i = 0; i < ns; i++)
            free(s[i].x), free(s[i].y);
        memset(s, 0, sizeof *s * (size_t)ns);
    }
    fputs("<h2>Error against layer per factor</h2>\n", f);
    for (int k = 0; k < r->n_factor; k++) {
        if (!r->available[k]) {
            fputs("<p class=\"na\">", f);
            m3_html_escape(f, r->factor[k]->name);
            fputs(": " UNAVAILABLE ".</p>\n", f);
            continue;
        }
        int ns = 0;
        for (int mode = 0; mode < M3_ATTR_N_MODE; mode++) {
            if (!r->mode[mode]) continue;
            for (int st = 0; st < M3_ATTR_N_STAGE; st++) {
                if (m3_attr_stage_is_set(st)) continue;
                char name[64];
                snprintf(name, sizeof name, "%s (%s)", m3_attr_stage_name(st),
                         m3_attr_mode_name(mode));
                add_series(s, &ns, r, k, mode, st, name);
            }
        }
        char title[200];
        snprintf(title, sizeof title, "%s: log10 NMSE per stage against layer (-20 = exact)",
                 r->factor[k]->name);
        chart(f, title, s, ns, r->n_layer);
        for (int i = 0; i < ns; i++)
            free(s[i].x), free(s[i].y);
        memset(s, 0, sizeof *s * (size_t)ns);
    }
    free(s);
    fputs("<p>Metrics: docs/compare.md; method: docs/attribute.md. Generated by m3 ", f);
    m3_html_escape(f, m3_version_string());
    fputs(".</p>\n</body></html>\n", f);
    return m3_report_commit(f, tmp, path);
}
