/* tests/cmp_html.c: the `m3 compare --html` report is self-contained (no script, no
 * external resource) and renders in headless Chromium with its SVG plots present and no
 * console errors. Without /usr/bin/chromium (CI installs it with install-deps.sh
 * --browser) the rendering test calls skip(); the static checks always run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compare/dump.h"
#include "tests/util.h"

/* A small pair with float, set and logits stages over 3 layers; B drifts with depth and
 * flips one expert set in layer 2. */
static void write_pair(const char *pa, const char *pb) {
    enum { T = 6, H = 8, K = 2, V = 16 };
    for (int side = 0; side < 2; side++) {
        m3_dump *d;
        assert_int_equal(m3_dump_open(&d, side ? pb : pa, M3_DUMP_CREATE | M3_DUMP_FORCE), M3_OK);
        assert_int_equal(m3_dump_set_attr_str(d, "profile", side ? "hf" : "fp32"), M3_OK);
        assert_int_equal(m3_dump_set_attr_str(d, "producer", "cmp_html <test & \"quote\">"), M3_OK);
        m3_rng r;
        m3_rng_init(&r, m3_test_seed(), 7);
        float h[T * H], lo[T * V];
        int32_t ids[T * K];
        char key[64];
        for (int L = 0; L < 3; L++) {
            m3_fill_normal(&r, h, T * H, 1.0f);
            if (side)
                for (int i = 0; i < T * H; i++) h[i] *= 1.0f + 1e-3f * (float)(L + 1);
            m3_tensor t = {.dtype = M3_DT_F32, .rank = 2, .shape = {T, H}, .data = h};
            m3_dump_key(key, sizeof key, -1, L, 3, "output");
            assert_int_equal(m3_dump_write(d, key, &t, NULL), M3_OK);
            m3_dump_key(key, sizeof key, -1, L, 3, "mlp_out");
            assert_int_equal(m3_dump_write(d, key, &t, NULL), M3_OK);
            for (int i = 0; i < T * K; i++) ids[i] = i % 5;
            if (side && L == 2) ids[3] = 7;
            m3_tensor ti = {.dtype = M3_DT_I32, .rank = 2, .shape = {T, K}, .data = ids};
            m3_dump_key(key, sizeof key, -1, L, 3, "expert_ids");
            assert_int_equal(m3_dump_write(d, key, &ti, NULL), M3_OK);
        }
        m3_fill_normal(&r, lo, T * V, 2.0f);
        if (side) lo[5] += 0.3f;
        m3_tensor tl = {.dtype = M3_DT_F32, .rank = 2, .shape = {T, V}, .data = lo};
        assert_int_equal(m3_dump_write(d, "logits", &tl, NULL), M3_OK);
        assert_int_equal(m3_dump_commit(d), M3_OK);
        m3_dump_close(d);
    }
}

static char *slurp(const char *p) {
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) n++;
    return n;
}

static void make_report(char *html, size_t cap) {
    char pa[128], pb[128], cmd[1024];
    snprintf(pa, sizeof pa, "%s/a.h5", m3_tmpdir());
    snprintf(pb, sizeof pb, "%s/b.h5", m3_tmpdir());
    snprintf(html, cap, "%s/report.html", m3_tmpdir());
    write_pair(pa, pb);
    snprintf(cmd, sizeof cmd, "%s compare %s %s --html %s --quiet", m3_bin(), pa, pb, html);
    int rc = m3_run_cmd(cmd, NULL);
    assert_int_equal(rc, 1); /* the flipped set is beyond the lowp flip bound */
}

static void report_is_self_contained(void **state) {
    (void)state;
    char html[160];
    make_report(html, sizeof html);
    char *s = slurp(html);
    assert_int_equal(count(s, "<svg"), 3); /* error vs layer, sets vs layer, histogram */
    assert_true(count(s, "<polyline") >= 3);
    assert_int_equal(count(s, "<script"), 0);
    assert_int_equal(count(s, "src="), 0);
    assert_int_equal(count(s, "href="), 0);
    assert_int_equal(count(s, "url("), 0);
    /* the only URL is the SVG namespace */
    assert_int_equal(count(s, "http"), count(s, "http://www.w3.org/2000/svg"));
    assert_non_null(strstr(s, "&lt;test &amp; &quot;quote&quot;&gt;")); /* escaped */
    assert_non_null(strstr(s, "First stage beyond tolerance"));
    free(s);
}

static void renders_in_chromium(void **state) {
    (void)state;
    if (access("/usr/bin/chromium", X_OK) != 0) skip();
    char html[160], cmd[2048], *out = NULL;
    make_report(html, sizeof html);
    /* --dump-dom prints the DOM after load on stdout; console messages and JS errors go to
     * stderr with --enable-logging=stderr */
    snprintf(cmd, sizeof cmd,
             "prof=$(mktemp -d) && timeout 60 /usr/bin/chromium --headless --no-sandbox --disable-gpu "
             "--disable-quic --no-first-run --disable-background-networking --disable-component-update "
             "--disable-sync --user-data-dir=\"$prof\" --enable-logging=stderr --v=0 --dump-dom "
             "'file://%s' >'%s/dom.html' 2>'%s/chromium.log'; rc=$?; rm -rf \"$prof\"; exit $rc",
             html, m3_tmpdir(), m3_tmpdir());
    int rc = m3_run_cmd(cmd, &out);
    free(out);
    char p[160];
    snprintf(p, sizeof p, "%s/chromium.log", m3_tmpdir());
    char *log = slurp(p);
    if (rc != 0) m3_test_failf("chromium exit %d: %.2000s", rc, log);
    snprintf(p, sizeof p, "%s/dom.html", m3_tmpdir());
    char *dom = slurp(p);
    assert_int_equal(count(dom, "<svg"), 3);
    assert_true(count(dom, "<circle") >= 6);
    assert_non_null(strstr(dom, "Set agreement against layer"));
    /* no console output at all from the page (it has no script), in particular no errors */
    if (strstr(log, "CONSOLE") || strstr(log, "Uncaught") || strstr(log, "net::ERR"))
        m3_test_failf("console messages while rendering: %.2000s", log);
    free(dom);
    free(log);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(report_is_self_contained),
        cmocka_unit_test(renders_in_chromium),
    };
    return M3_RUN_TESTS_IN_TMPDIR(tests);
}
