/* compare/cmd_compare.c: `m3 compare A.h5 B.h5` (contract: shared spec/cli.md; usage and
 * metric definitions: docs/compare.md). A is the reference. Exit 0 within tolerance, 1 a
 * stage beyond tolerance, 2 could not run (one line on stderr). Output files are written
 * only after the comparison succeeded, each via NAME.tmp + rename. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compare/cmd.h"
#include "compare/compare.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: m3 compare A.h5 B.h5 [--tol FILE] [--json OUT.json] [--html OUT.html]\n"
            "                  [--junit OUT.xml] [--quiet] [--pass N] [--color auto|always|never]\n"
            "A is the reference. Per stage and layer: NMSE, SQNR, max |d|, cosine, relative error,\n"
            "NaN/Inf counts; index sets (index_topk, expert_ids) as sets; logits KL, top-1, dp.\n"
            "Exit 0 within tolerance, 1 beyond tolerance, 2 could not run. See docs/compare.md.\n");
}

int m3_cmd_compare(int argc, char **argv) {
    const char *pa = NULL, *pb = NULL, *tolf = NULL, *json = NULL, *html = NULL, *junit = NULL;
    const char *color = "auto";
    bool quiet = false;
    m3_cmp_opts opts = {.pass = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tol") && has) tolf = argv[++i];
        else if (!strcmp(a, "--json") && has) json = argv[++i];
        else if (!strcmp(a, "--html") && has) html = argv[++i];
        else if (!strcmp(a, "--junit") && has) junit = argv[++i];
        else if (!strcmp(a, "--color") && has) color = argv[++i];
        else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) quiet = true;
        else if (!strcmp(a, "--pass") && has) {
            long v;
            if (!m3_cli_int(argv[++i], 0, 9999, &v)) return m3_cli_fail("compare: --pass wants 0..9999, got '%s'", argv[i]);
            opts.pass = (int)v;
        } else if (a[0] == '-' && a[1]) {
            return m3_cli_fail("compare: unknown option or missing value: %s (see m3 compare --help)", a);
        } else if (!pa) pa = a;
        else if (!pb) pb = a;
        else return m3_cli_fail("compare: unexpected argument '%s' (two dumps: A.h5 B.h5)", a);
    }
    if (!pa || !pb) return m3_cli_fail("compare: need two dumps: m3 compare A.h5 B.h5 (see --help)");
    if (strcmp(color, "auto") && strcmp(color, "always") && strcmp(color, "never"))
        return m3_cli_fail("compare: --color wants auto, always or never");
    m3_tol tol;
    if (tolf) {
        if (m3_tol_load(&tol, tolf) != M3_OK) return m3_cli_fail(NULL);
    } else {
        m3_tol_builtin(&tol);
    }
    m3_cmp_report *r = NULL;
    if (m3_compare_dumps(&r, pa, pb, &tol, &opts) != M3_OK) return m3_cli_fail(NULL);
    bool col = !strcmp(color, "always") || (!strcmp(color, "auto") && isatty(STDOUT_FILENO) &&
                                            !getenv("NO_COLOR"));
    m3_report_text(stdout, r, col, quiet);
    fflush(stdout);
    int rc = m3_cmp_exit_code(r);
    if ((json && m3_report_json(r, json) != M3_OK) || (junit && m3_report_junit(r, junit) != M3_OK) ||
        (html && m3_report_html(r, html) != M3_OK))
        rc = m3_cli_fail(NULL);
    m3_cmp_report_free(r);
    return rc;
}
