/* compare/svg.c: see svg.h. (Moved out of compare/report_html.c so that every HTML report
 * draws its charts the same way.) */
#include "compare/svg.h"

#include <stdlib.h>

void m3_html_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

static const char *palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
                                "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173",
                                "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363"};
#define N_PAL ((int)(sizeof palette / sizeof palette[0]))

#define W  M3_SVG_W
#define H  M3_SVG_H
#define ML M3_SVG_ML
#define MR M3_SVG_MR
#define MT M3_SVG_MT
#define MB M3_SVG_MB

const char *m3_svg_color(int i) {
    return palette[(i % N_PAL + N_PAL) % N_PAL];
}

void m3_svg_line_chart(FILE *f, const char *title, const char *ylabel, const m3_svg_series *s,
                       int ns, double ymin, double ymax, double xmax, const char *cls) {
    if (ymax <= ymin) ymax = ymin + 1;
    if (xmax <= 0) xmax = 1;
    double pw = W - ML - MR, ph = H - MT - MB;
    fprintf(f, "<figure><figcaption>");
    m3_html_escape(f, title);
    fprintf(f,
            "</figcaption>\n<svg class=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
            "height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n",
            cls, W, H, W, H);
    fprintf(
        f,
        "<rect x=\"%d\" y=\"%d\" width=\"%g\" height=\"%g\" fill=\"#fafafa\" stroke=\"#999\"/>\n",
        ML, MT, pw, ph);
    for (int k = 0; k <= 4; k++) { /* y ticks */
        double v = ymin + (ymax - ymin) * k / 4.0, y = MT + ph - ph * k / 4.0;
        fprintf(f,
                "<line x1=\"%d\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%.3g</text>\n",
                ML, ML + pw, y, y, ML - 4, y + 4, v);
    }
    int xt = (int)xmax < 10 ? (int)xmax : 10;
    for (int k = 0; k <= xt; k++) { /* x ticks */
        double v = xmax * k / (xt ? xt : 1), x = ML + pw * v / xmax;
        fprintf(f,
                "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%.0f</text>\n",
                x, MT + (int)ph + 14, v);
    }
    fprintf(f, "<text x=\"%g\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">layer</text>\n",
            ML + pw / 2, H - 6);
    fprintf(f,
            "<text x=\"14\" y=\"%g\" font-size=\"12\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 14 %g)\">",
            MT + ph / 2, MT + ph / 2);
    m3_html_escape(f, ylabel);
    fputs("</text>\n", f);
    for (int i = 0; i < ns; i++) {
        const char *c = m3_svg_color(i);
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", c);
        for (int k = 0; k < s[i].n; k++) {
            double yv = s[i].y[k] < ymin ? ymin : s[i].y[k] > ymax ? ymax : s[i].y[k];
            fprintf(f, "%.1f,%.1f ", ML + pw * s[i].x[k] / xmax,
                    MT + ph - ph * (yv - ymin) / (ymax - ymin));
        }
        fputs("\"/>\n", f);
        for (int k = 0; k < s[i].n; k++) {
            double yv = s[i].y[k] < ymin ? ymin : s[i].y[k] > ymax ? ymax : s[i].y[k];
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"><title>",
                    ML + pw * s[i].x[k] / xmax, MT + ph - ph * (yv - ymin) / (ymax - ymin), c);
            m3_html_escape(f, s[i].name);
            fprintf(f, " layer %.0f: %.4g</title></circle>\n", s[i].x[k], s[i].y[k]);
        }
        fprintf(f,
                "<rect x=\"%g\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                "<text x=\"%g\" y=\"%d\" font-size=\"11\">",
                ML + pw + 10, MT + 14 * i, c, ML + pw + 24, MT + 14 * i + 9);
        m3_html_escape(f, s[i].name);
        fputs("</text>\n", f);
    }
    fputs("</svg></figure>\n", f);
}

void m3_svg_series_free(m3_svg_series *s, int n) {
    if (!s) return;
    for (int i = 0; i < n; i++)
        free(s[i].x), free(s[i].y);
    free(s);
}
