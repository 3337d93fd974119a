/* compare/svg.h: the HTML-escaping and inline-SVG chart helpers shared by the
 * self-contained HTML reports (`m3 compare --html`: compare/report_html.c, `m3 attribute
 * --html`: compare/report_attr.c). Plain SVG 1.1 markup written straight to a FILE*: no
 * script, no external resource, so a report opens anywhere and can be archived by CI. */
#ifndef M3_COMPARE_SVG_H
#define M3_COMPARE_SVG_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Chart geometry (pixels): width, height and the plot margins left/right/top/bottom. The
 * right margin holds the legend. */
#define M3_SVG_W  760
#define M3_SVG_H  300
#define M3_SVG_ML 60
#define M3_SVG_MR 170
#define M3_SVG_MT 20
#define M3_SVG_MB 40

/* One polyline of a chart: n points (x[i], y[i]); x and y are malloc'ed (m3_svg_series_free). */
typedef struct m3_svg_series {
    char name[64];
    int n;
    double *x, *y;
} m3_svg_series;

/* Write s with < > & " escaped (text and attribute values alike). */
void m3_html_escape(FILE *f, const char *s);
/* The i-th colour of the chart palette (cycles), "#rrggbb". */
const char *m3_svg_color(int i);
/* A <figure> with a line chart of the series against "layer" on x in [0, xmax]; y is plotted
 * as given (callers pass log10 where wanted) and clamped to [ymin, ymax]. Each point carries
 * a <title> tooltip "name layer x: y". cls is the <svg> class (tests look for it). */
void m3_svg_line_chart(FILE *f, const char *title, const char *ylabel, const m3_svg_series *s,
                       int ns, double ymin, double ymax, double xmax, const char *cls);
/* Free the x/y arrays of n series and the array itself (NULL ok). */
void m3_svg_series_free(m3_svg_series *s, int n);

#ifdef __cplusplus
}
#endif
#endif
