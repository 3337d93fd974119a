/* compare/report_junit.c: `m3 compare --junit`: one JUnit testcase per stage (classname =
 * pass/layer group, name = stage); a stage beyond tolerance is a <failure>, a stage on one
 * side only is <skipped>. For CI systems that render JUnit XML. */
#include <stdio.h>
#include <string.h>

#include "compare/compare.h"

static void xesc(FILE *f, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if (*p < 0x20 && *p != '\t') fputc(' ', f);
            else fputc(*p, f);
        }
    }
}

m3_status m3_report_junit(const m3_cmp_report *r, const char *path) {
    char tmp[1024];
    FILE *f = m3_report_open(path, tmp, sizeof tmp);
    if (!f) return M3_ERR_IO;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<testsuites tests=\"%d\" failures=\"%d\" skipped=\"%d\" time=\"%.3f\">\n",
            r->n_items, r->n_fail, r->n_only_a + r->n_only_b, r->seconds);
    fputs("  <testsuite name=\"m3 compare ", f);
    xesc(f, r->path_a);
    fputs(" vs ", f);
    xesc(f, r->path_b);
    fprintf(f, "\" tests=\"%d\" failures=\"%d\" errors=\"0\" skipped=\"%d\" time=\"%.3f\">\n",
            r->n_items, r->n_fail, r->n_only_a + r->n_only_b, r->seconds);
    for (int i = 0; i < r->n_items; i++) {
        const m3_cmp_item *it = &r->items[i];
        char name[200], cls[224];
        m3_cmp_item_name(r, it, name, sizeof name);
        /* classname: the key without its last component, dots for slashes */
        snprintf(cls, sizeof cls, "m3compare.%s", name);
        char *slash = strrchr(cls, '/');
        if (slash) *slash = 0;
        else snprintf(cls, sizeof cls, "m3compare.global");
        for (char *p = cls; *p; p++)
            if (*p == '/') *p = '.';
        fputs("    <testcase classname=\"", f);
        xesc(f, cls);
        fputs("\" name=\"", f);
        xesc(f, it->stage);
        fputs("\" time=\"0\"", f);
        if (it->status == M3_CMP_PASS) {
            fputs("/>\n", f);
        } else if (it->status == M3_CMP_FAIL) {
            fputs(">\n      <failure message=\"", f);
            xesc(f, it->why);
            fputs("\" type=\"tolerance\">", f);
            xesc(f, name);
            fputs(": ", f);
            xesc(f, it->why);
            fputs("</failure>\n    </testcase>\n", f);
        } else {
            fprintf(f, ">\n      <skipped message=\"present in %s only\"/>\n    </testcase>\n",
                    it->status == M3_CMP_ONLY_A ? "A" : "B");
        }
    }
    fputs("  </testsuite>\n</testsuites>\n", f);
    return m3_report_commit(f, tmp, path);
}
