/* compare/cmd_attribute.c: `m3 attribute` (docs/attribute.md): which numerics factor causes
 * which layer's error. The engine is compare/attribute.c, the reports compare/report_attr.c;
 * this file parses flags and reads tokens. Exit 0 ok, 2 could not run (one line). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compare/attribute.h"
#include "compare/cmd.h"
#include "compare/run_opts.h"
#include "ref/config.h"

static void usage(FILE *f) {
    int n;
    const m3_attr_factor *t = m3_attr_factors(&n);
    fprintf(
        f,
        "usage: m3 attribute --model DIR (--tokens FILE | --ids \"1 2 3\")\n"
        "                    [--factors NAME,...] [--mode free|forced|both] [--json OUT.json]\n"
        "                    [--html OUT.html] [--threads N] [--override JSON]\n"
        "                    [--color auto|always|never]\n"
        "Runs the reference at the fp32 baseline and with each factor alone (and all together),\n"
        "free-running and teacher-forced (every layer from the baseline's input), and reports per\n"
        "layer how much each factor changes the layer output and the stages it acts on.\n"
        "factors (default: all of them):\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "  %-11s %s\n", t[i].name, t[i].about);
    fputs("See docs/attribute.md.\n", f);
}

static bool parse_threads(const char *s, int *out) {
    long v;
    if (!m3_cli_int(s, 1, 256, &v)) return false;
    *out = (int)v;
    return true;
}

int m3_cmd_attribute(int argc, char **argv) {
    const char *model = NULL, *tokens = NULL, *ids = NULL, *factors = NULL, *mode = "both";
    const char *json = NULL, *html = NULL, *override = NULL, *color = "auto";
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0)
            return m3_cli_fail("attribute: unexpected argument '%s' (see m3 attribute --help)", a);
        /* --flag value or --flag=value */
        char name[64];
        const char *val;
        const char *eq = strchr(a, '=');
        if (eq) {
            size_t n = (size_t)(eq - a);
            if (n >= sizeof name) return m3_cli_fail("attribute: unknown option '%s'", a);
            memcpy(name, a, n);
            name[n] = 0;
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
            if (i + 1 >= argc) return m3_cli_fail("attribute: option %s needs a value", a);
            val = argv[++i];
        }
        if (!strcmp(name, "--model"))
            model = val;
        else if (!strcmp(name, "--tokens"))
            tokens = val;
        else if (!strcmp(name, "--ids"))
            ids = val;
        else if (!strcmp(name, "--factors"))
            factors = val;
        else if (!strcmp(name, "--mode"))
            mode = val;
        else if (!strcmp(name, "--json"))
            json = val;
        else if (!strcmp(name, "--html"))
            html = val;
        else if (!strcmp(name, "--override"))
            override = val;
        else if (!strcmp(name, "--color"))
            color = val;
        else if (!strcmp(name, "--threads")) {
            if (!parse_threads(val, &threads))
                return m3_cli_fail("attribute: --threads wants an integer in 1..256, got '%s'",
                                   val);
        } else
            return m3_cli_fail("attribute: unknown option '%s' (see m3 attribute --help)", name);
    }
    if (!model) return m3_cli_fail("attribute: --model DIR is required");
    if (!tokens == !ids)
        return m3_cli_fail("attribute: give exactly one of --tokens FILE and --ids \"1 2 3\"");
    m3_attr_opts o = {.model = model, .override_json = override};
    if (!strcmp(mode, "free") || !strcmp(mode, "both")) o.mode[M3_ATTR_FREE] = true;
    if (!strcmp(mode, "forced") || !strcmp(mode, "both")) o.mode[M3_ATTR_FORCED] = true;
    if (!o.mode[M3_ATTR_FREE] && !o.mode[M3_ATTR_FORCED])
        return m3_cli_fail("attribute: --mode must be free, forced or both, got '%s'", mode);
    if (strcmp(color, "auto") && strcmp(color, "always") && strcmp(color, "never"))
        return m3_cli_fail("attribute: --color wants auto, always or never, got '%s'", color);

    /* --factors a,b,c: names checked here so a typo is one clear line */
    char fbuf[512];
    const char *names[64];
    int nf = 0;
    if (factors) {
        if (strlen(factors) >= sizeof fbuf) return m3_cli_fail("attribute: --factors too long");
        snprintf(fbuf, sizeof fbuf, "%s", factors);
        for (char *save = NULL, *t = strtok_r(fbuf, ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            if (!m3_attr_factor_find(t))
                return m3_cli_fail(
                    "attribute: --factors: unknown factor '%s' (see m3 attribute --help)", t);
            for (int k = 0; k < nf; k++)
                if (!strcmp(names[k], t))
                    return m3_cli_fail("attribute: --factors: '%s' given twice", t);
            if (nf == 64) return m3_cli_fail("attribute: --factors: too many");
            names[nf++] = t;
        }
        if (!nf) return m3_cli_fail("attribute: --factors: no factor named");
        o.factors = names;
        o.n_factors = nf;
    }
    if (threads) m3_set_threads(threads);

    /* tokens, checked against the vocabulary before anything runs */
    m3_config *cfg = NULL;
    if (m3_config_load(&cfg, model) != M3_OK) return m3_cli_fail(NULL);
    m3_run_opts ro;
    memset(&ro, 0, sizeof ro);
    ro.tokens = tokens;
    ro.ids = ids;
    int32_t *tok = NULL;
    m3_status s = m3_run_read_tokens(&ro, cfg->vocab, &tok, &o.n_tok);
    m3_config_free(cfg);
    if (s) return m3_cli_fail(NULL);
    o.tokens = tok;

    m3_attr_result *r = NULL;
    s = m3_attribute(&r, &o);
    free(tok);
    if (s) return m3_cli_fail(NULL);
    bool col = !strcmp(color, "always") ||
               (!strcmp(color, "auto") && isatty(STDOUT_FILENO) && !getenv("NO_COLOR"));
    m3_attr_report_text(stdout, r, col);
    fflush(stdout);
    int rc = 0;
    if ((json && m3_attr_report_json(r, json) != M3_OK) ||
        (html && m3_attr_report_html(r, html) != M3_OK))
        rc = m3_cli_fail(NULL);
    m3_attr_result_free(r);
    return rc;
}
