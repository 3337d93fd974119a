/* tests/cmp_attribute.c: `m3 attribute` on the bundled tiny fixtures (tiny-deep: 6 layers,
 * 2 dense + 4 sparse/MoE; tiny-moe: 4 layers) over a 32-token prefix (4 blocks of 8 with
 * top-3 blocks, so block selection matters). The group setup runs the command once per
 * fixture (all factors, both modes, --json and --html) and every test reads those files.
 *
 * Checks: the fp32 control row is exactly zero; hf is non-zero and bounded everywhere; atom
 * differs from hf; forced-mode numbers equal `m3 run` + `m3 replay` + `m3 compare` done by
 * hand (each layer's error is its own); the JSON has every factor x mode x layer; factors
 * this build cannot run are "unavailable in this build" in text, JSON and HTML; the HTML is
 * self-contained and renders in headless Chromium (skip() without /usr/bin/chromium); bad
 * input exits 2 with one line. The variant factors' spec signatures (MX experts in mlp_out
 * and not attn_proj, fp8 KV in attention, index fp8 / reuse in index_topk or sparse-layer
 * attention only) are asserted when the factor is available (every one is, since h/quant and
 * h/cache landed) and skip() in a build that cannot run it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compare/attribute.h"
#include "compare/tol.h"
#include "ref/json.h"
#include "tests/util.h"

#define N_TOK 32

static char dir[64];

typedef struct fixture {
    const char *name;
    char model[128], ids[1024], json[160], html[160], text_path[160];
    char *text;   /* stdout of the run */
    m3_json *doc; /* parsed --json */
    int n_layer;
} fixture;

static fixture fx[2] = {{.name = "tiny-deep"}, {.name = "tiny-moe"}};

static char *slurp(const char *p) {
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

/* The first N_TOK ids of the fixture's tokens.txt, space separated. */
static int read_prefix(fixture *f) {
    char p[160];
    snprintf(p, sizeof p, "fixtures/%s/tokens.txt", f->name);
    char *s = slurp(p);
    if (!s) return -1;
    size_t len = 0;
    int n = 0;
    for (char *save = NULL, *t = strtok_r(s, " \t\r\n,", &save); t && n < N_TOK;
         t = strtok_r(NULL, " \t\r\n,", &save), n++)
        len += (size_t)snprintf(f->ids + len, sizeof f->ids - len, "%s%s", n ? " " : "", t);
    free(s);
    return n == N_TOK ? 0 : -1;
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/m3_cmp_attr_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    for (int i = 0; i < 2; i++) {
        fixture *f = &fx[i];
        snprintf(f->model, sizeof f->model, "fixtures/%s/model", f->name);
        if (read_prefix(f)) return -1;
        snprintf(f->json, sizeof f->json, "%s/%s.json", dir, f->name);
        snprintf(f->html, sizeof f->html, "%s/%s.html", dir, f->name);
        char cmd[2048];
        snprintf(cmd, sizeof cmd,
                 "%s attribute --model %s --ids '%s' --json %s --html %s --threads 2", m3_bin(),
                 f->model, f->ids, f->json, f->html);
        int rc = m3_run_cmd(cmd, &f->text);
        if (rc != 0) {
            fprintf(stderr, "setup: %s -> %d: %s\n", cmd, rc, f->text ? f->text : "");
            return -1;
        }
        if (m3_json_parse_file(&f->doc, f->json, 0, NULL, NULL) != M3_OK) return -1;
        f->n_layer = (int)m3_json_get_int(f->doc, "n_layer", -1);
        if (f->n_layer < 1) return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) {
        m3_json_free(fx[i].doc);
        free(fx[i].text);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- JSON access --------------------------------------------------------------------- */

static const m3_json *factor(const fixture *f, const char *name) {
    const m3_json *fs = m3_json_get(f->doc, "factors");
    for (const m3_json *c = m3_json_first(fs); c; c = m3_json_next(c))
        if (!strcmp(m3_json_get_str(c, "name", ""), name)) return c;
    m3_test_failf("%s: factor %s missing from the JSON", f->name, name);
    return NULL;
}

static bool available(const fixture *f, const char *name) {
    return m3_json_get_bool(factor(f, name), "available", false);
}

static const m3_json *layer(const fixture *f, const char *name, const char *mode, int L) {
    const m3_json *m = m3_json_get(m3_json_get(factor(f, name), "modes"), mode);
    const m3_json *l = m3_json_at(m3_json_get(m, "layers"), L);
    if (!l) m3_test_failf("%s: %s %s layer %d missing", f->name, name, mode, L);
    return l;
}

/* A stage object of layer L, or NULL when the layer has no such stage. */
static const m3_json *stage(const fixture *f, const char *name, const char *mode, int L,
                            const char *st) {
    return m3_json_get(m3_json_get(layer(f, name, mode, L), "stages"), st);
}

/* NMSE of a float stage; fails on a non-number ("inf"/"nan" strings) */
static double nmse(const fixture *f, const char *name, const char *mode, int L, const char *st) {
    const m3_json *s = stage(f, name, mode, L, st);
    double v;
    if (!s || !m3_json_double(m3_json_get(s, "nmse"), &v))
        m3_test_failf("%s: %s %s layer %d %s: no finite nmse", f->name, name, mode, L, st);
    return v;
}

static int64_t flips(const fixture *f, const char *name, const char *mode, int L, const char *st) {
    const m3_json *s = stage(f, name, mode, L, st);
    return s ? m3_json_get_int(s, "flips", -1) : 0;
}

static bool is_sparse(const fixture *f, int L) {
    return m3_json_get_bool(m3_json_at(m3_json_get(f->doc, "layers"), L), "sparse_attention",
                            false);
}
static bool is_moe(const fixture *f, int L) {
    return m3_json_get_bool(m3_json_at(m3_json_get(f->doc, "layers"), L), "moe", false);
}

static const char *const modes[2] = {"free", "forced"};
static const char *const float_stages[] = {"index_scores", "attn_out", "attn_proj", "mlp_out",
                                           "output"};
#define N_FLOAT_STAGES ((int)(sizeof float_stages / sizeof float_stages[0]))

/* ---- tests --------------------------------------------------------------------------- */

/* The control factor reruns the baseline: every number is exactly zero in both modes. */
static void control_row_is_exactly_zero(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) {
        const fixture *f = &fx[i];
        assert_true(available(f, "fp32"));
        for (int m = 0; m < 2; m++) {
            for (int L = 0; L < f->n_layer; L++) {
                int seen = 0;
                for (int s = 0; s < N_FLOAT_STAGES; s++) {
                    if (!stage(f, "fp32", modes[m], L, float_stages[s])) continue;
                    seen++;
                    if (nmse(f, "fp32", modes[m], L, float_stages[s]) != 0)
                        m3_test_failf("%s: control %s layer %d %s NMSE %g != 0", f->name, modes[m],
                                      L, float_stages[s],
                                      nmse(f, "fp32", modes[m], L, float_stages[s]));
                    assert_int_equal(m3_json_get_int(stage(f, "fp32", modes[m], L, float_stages[s]),
                                                     "nonfinite_mismatch", -1),
                                     0);
                }
                assert_true(seen >= 4); /* attn_out, attn_proj, mlp_out, output at least */
                assert_int_equal(flips(f, "fp32", modes[m], L, "index_topk"), 0);
                assert_int_equal(flips(f, "fp32", modes[m], L, "expert_ids"), 0);
                if (is_sparse(f, L)) assert_non_null(stage(f, "fp32", modes[m], L, "index_topk"));
                if (is_moe(f, L)) assert_non_null(stage(f, "fp32", modes[m], L, "expert_ids"));
            }
            const m3_json *lg = m3_json_get(
                m3_json_get(m3_json_get(factor(f, "fp32"), "modes"), modes[m]), "logits");
            assert_true(m3_json_get_double(lg, "kl_mean", -1) == 0);
            assert_int_equal(m3_json_get_int(lg, "top1_agree", -1), N_TOK);
        }
    }
}

/* hf rounds to bf16 at every layer: non-zero error everywhere, bounded. Forced-mode layers
 * without a set flip stay within the lowp NMSE row of compare/tol.c for `output` (what
 * `m3 compare` would accept for a bf16 implementation); a flipped expert or block replaces
 * a whole contribution of a row, so such layers (and free-running accumulation) are only
 * required to stay below NMSE 1 (an error as large as the signal) and finite. */
static void hf_error_is_nonzero_and_bounded(void **state) {
    (void)state;
    m3_tol tol;
    m3_tol_builtin(&tol);
    const double bound = m3_tol_find(&tol, "output")->nmse[M3_TOL_LOWP];
    for (int i = 0; i < 2; i++) {
        const fixture *f = &fx[i];
        for (int m = 0; m < 2; m++)
            for (int L = 0; L < f->n_layer; L++) {
                double e = nmse(f, "hf", modes[m], L, "output");
                bool flipped = flips(f, "hf", modes[m], L, "index_topk") ||
                               flips(f, "hf", modes[m], L, "expert_ids");
                if (!(e > 0 && e < 1))
                    m3_test_failf("%s: hf %s layer %d NMSE %g not in (0, 1)", f->name, modes[m], L,
                                  e);
                if (m == 1 && !flipped && e > bound)
                    m3_test_failf("%s: hf forced layer %d NMSE %g > lowp bound %g", f->name, L, e,
                                  bound);
                assert_int_equal(m3_json_get_int(stage(f, "hf", modes[m], L, "output"),
                                                 "nonfinite_mismatch", -1),
                                 0);
            }
    }
}

/* atom's rounding points are not hf's: the per-layer errors differ. */
static void atom_differs_from_hf(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) {
        const fixture *f = &fx[i];
        assert_true(available(f, "atom"));
        for (int L = 0; L < f->n_layer; L++) {
            double a = nmse(f, "atom", "forced", L, "output"),
                   h = nmse(f, "hf", "forced", L, "output");
            if (!(a > 0) || a == h)
                m3_test_failf("%s: layer %d atom NMSE %g vs hf %g", f->name, L, a, h);
        }
    }
}

/* With nothing before it, layer 0 has the same error free-running and forced. */
static void layer0_is_the_same_in_both_modes(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++)
        for (int s = 0; s < N_FLOAT_STAGES; s++) {
            const fixture *f = &fx[i];
            if (!stage(f, "hf", "free", 0, float_stages[s])) continue;
            assert_true(nmse(f, "hf", "free", 0, float_stages[s]) ==
                        nmse(f, "hf", "forced", 0, float_stages[s]));
        }
}

/* Forced mode is m3 replay: run the baseline to a dump, replay it with the profile, compare,
 * and find the same per-layer numbers. Both sides accumulate the same float32 data in double
 * but m3 compare merges ~64K-element blocks, so agreement is to 1e-9 relative, not bitwise. */
static void forced_equals_replay_by_hand(void **state) {
    (void)state;
    const fixture *f = &fx[0];
    char cmd[4096], base[128], rep[128], cj[128];
    snprintf(base, sizeof base, "%s/base.h5", dir);
    snprintf(cj, sizeof cj, "%s/cmp.json", dir);
    snprintf(cmd, sizeof cmd, "%s run --model %s --ids '%s' --dump %s --force", m3_bin(), f->model,
             f->ids, base);
    assert_int_equal(m3_run_cmd(cmd, NULL), 0);
    const char *profiles[2] = {"hf", "atom"};
    for (int p = 0; p < 2; p++) {
        snprintf(rep, sizeof rep, "%s/replay_%s.h5", dir, profiles[p]);
        snprintf(cmd, sizeof cmd, "%s replay --model %s --from %s --profile %s --dump %s --force",
                 m3_bin(), f->model, base, profiles[p], rep);
        assert_int_equal(m3_run_cmd(cmd, NULL), 0);
        snprintf(cmd, sizeof cmd, "%s compare %s %s --json %s --quiet", m3_bin(), base, rep, cj);
        int rc = m3_run_cmd(cmd, NULL);
        assert_true(rc == 0 || rc == 1);
        m3_json *c = NULL;
        assert_int_equal(m3_json_parse_file(&c, cj, 0, NULL, NULL), M3_OK);
        int checked = 0;
        for (const m3_json *s = m3_json_first(m3_json_get(c, "stages")); s; s = m3_json_next(s)) {
            int L = (int)m3_json_get_int(s, "layer", -1);
            const char *st = m3_json_get_str(s, "stage", "");
            if (L < 0) continue;
            if (!strcmp(st, "index_topk") || !strcmp(st, "expert_ids")) {
                const m3_json *set = m3_json_get(s, "set");
                int64_t fl =
                    m3_json_get_int(set, "rows", 0) - m3_json_get_int(set, "rows_equal", 0);
                if (fl != flips(f, profiles[p], "forced", L, st))
                    m3_test_failf("%s layer %d %s: replay %lld flips, attribute %lld", profiles[p],
                                  L, st, (long long)fl,
                                  (long long)flips(f, profiles[p], "forced", L, st));
                checked++;
                continue;
            }
            bool ours = false;
            for (int k = 0; k < N_FLOAT_STAGES; k++)
                ours |= !strcmp(st, float_stages[k]);
            if (!ours) continue;
            double want;
            assert_true(m3_json_double(m3_json_get(m3_json_get(s, "float"), "nmse"), &want));
            double got = nmse(f, profiles[p], "forced", L, st);
            if (fabs(got - want) > 1e-9 * fabs(want))
                m3_test_failf("%s layer %d %s: replay NMSE %.17g, attribute forced %.17g",
                              profiles[p], L, st, want, got);
            checked++;
        }
        m3_json_free(c);
        assert_true(checked >= 4 * f->n_layer);
    }
}

/* Every factor of the table x every mode x every layer is in the JSON; unavailable factors
 * say so per layer, with a reason, and in the text and HTML too. */
static void json_has_every_factor_and_layer(void **state) {
    (void)state;
    int n;
    const m3_attr_factor *t = m3_attr_factors(&n);
    for (int i = 0; i < 2; i++) {
        const fixture *f = &fx[i];
        assert_string_equal(m3_json_get_str(f->doc, "format", ""), "m3-attribute/1");
        assert_int_equal(m3_json_size(m3_json_get(f->doc, "factors")), n);
        char *html = slurp(f->html);
        assert_non_null(html);
        for (int k = 0; k < n; k++) {
            const m3_json *fa = factor(f, t[k].name);
            bool av = m3_json_get_bool(fa, "available", false);
            for (int m = 0; m < 2; m++) {
                const m3_json *ls =
                    m3_json_get(m3_json_get(m3_json_get(fa, "modes"), modes[m]), "layers");
                assert_int_equal(m3_json_size(ls), f->n_layer);
                for (int L = 0; L < f->n_layer; L++) {
                    const m3_json *l = m3_json_at(ls, L);
                    assert_int_equal(m3_json_get_int(l, "layer", -1), L);
                    assert_string_equal(m3_json_get_str(l, "status", ""),
                                        av ? "ok" : "unavailable in this build");
                    if (av) assert_non_null(m3_json_get(m3_json_get(l, "stages"), "output"));
                }
            }
            if (!av) {
                const char *why = m3_json_get_str(fa, "why", "");
                assert_true(strlen(why) > 10);
                char line[256];
                snprintf(line, sizeof line, "%s", why);
                assert_non_null(strstr(f->text, line)); /* text names the reason */
                assert_non_null(strstr(html, "unavailable in this build"));
            }
            if (t[k].combined && m3_json_get_str(fa, "left_out_keys", "")[0])
                assert_non_null(strstr(f->text, "left out"));
        }
        /* the verdict: one line per layer naming a factor */
        const m3_json *v = m3_json_get(m3_json_get(f->doc, "verdict"), "layers");
        assert_int_equal(m3_json_size(v), f->n_layer);
        for (int L = 0; L < f->n_layer; L++) {
            const char *s = m3_json_str(m3_json_at(v, L));
            assert_non_null(s);
            assert_true(strstr(s, "dominates") || strstr(s, "leads"));
            assert_non_null(strstr(f->text, s));
        }
        free(html);
    }
}

static void html_is_self_contained(void **state) {
    (void)state;
    const fixture *f = &fx[0];
    char *s = slurp(f->html);
    assert_non_null(s);
    int n_av = 0, n;
    const m3_attr_factor *t = m3_attr_factors(&n);
    for (int k = 0; k < n; k++)
        n_av += available(f, t[k].name);
    /* one overview chart per mode + one chart per available factor */
    assert_int_equal(count(s, "<svg"), 2 + n_av);
    assert_true(count(s, "<polyline") >= 2 + n_av);
    assert_int_equal(count(s, "<table class=\"heat\""), 2);
    assert_int_equal(count(s, "<script"), 0);
    assert_int_equal(count(s, "src="), 0);
    assert_int_equal(count(s, "href="), 0);
    assert_int_equal(count(s, "url("), 0);
    assert_int_equal(count(s, "http"), count(s, "http://www.w3.org/2000/svg"));
    free(s);
}

static void html_renders_in_chromium(void **state) {
    (void)state;
    if (access("/usr/bin/chromium", X_OK) != 0) skip();
    const fixture *f = &fx[0];
    char cmd[2048], *out = NULL;
    snprintf(
        cmd, sizeof cmd,
        "prof=$(mktemp -d) && timeout 60 /usr/bin/chromium --headless --no-sandbox --disable-gpu "
        "--disable-quic --no-first-run --disable-background-networking --disable-component-update "
        "--disable-sync --user-data-dir=\"$prof\" --enable-logging=stderr --v=0 --dump-dom "
        "'file://%s' >'%s/dom.html' 2>'%s/chromium.log'; rc=$?; rm -rf \"$prof\"; exit $rc",
        f->html, dir, dir);
    int rc = m3_run_cmd(cmd, &out);
    free(out);
    char p[160];
    snprintf(p, sizeof p, "%s/chromium.log", dir);
    char *log = slurp(p);
    assert_non_null(log);
    if (rc != 0) m3_test_failf("chromium exit %d: %.2000s", rc, log);
    snprintf(p, sizeof p, "%s/dom.html", dir);
    char *dom = slurp(p);
    assert_non_null(dom);
    assert_true(count(dom, "<svg") >= 2);
    assert_true(count(dom, "<circle") >= 2 * f->n_layer);
    assert_non_null(strstr(dom, "Verdict per layer"));
    if (strstr(log, "CONSOLE") || strstr(log, "Uncaught") || strstr(log, "net::ERR"))
        m3_test_failf("console messages while rendering: %.2000s", log);
    free(dom);
    free(log);
}

/* Bad input: exit 2, one line on stderr, no output file. */
static void bad_input_exits_2(void **state) {
    (void)state;
    const fixture *f = &fx[1];
    char out_json[128];
    snprintf(out_json, sizeof out_json, "%s/bad.json", dir);
    const char *bad[] = {
        "--model %s --ids '1 2 3' --factors hf,bogus --json %s",
        "--model %s --ids '1 2 3' --mode sideways --json %s",
        "--model %s --ids '1 2 99999' --json %s",
        "--model %s --json %s",
        "--model %s/nonexistent --ids '1 2' --json %s",
        "--model %s --ids '1 2' --threads 0 --json %s",
        "--model %s --ids '1 2' --override '{\"no_such_key\": 1}' --json %s",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[512], cmd[1024], *out = NULL;
        snprintf(args, sizeof args, bad[i], f->model, out_json);
        snprintf(cmd, sizeof cmd, "%s attribute %s", m3_bin(), args);
        int rc = m3_run_cmd(cmd, &out);
        if (rc != 2 || !out || strncmp(out, "m3: ", 4) || count(out, "\n") != 1)
            m3_test_failf("'%s': exit %d, output '%s'", args, rc, out ? out : "");
        free(out);
        assert_int_not_equal(access(out_json, F_OK), 0);
    }
}

/* ---- the variant factors' signatures (spec §3.9, §4.7, §4.8, §5.4, §5.5) ---------------- */

/* MX experts (forced): the expert output changes on MoE layers, the attention of the same
 * layer does not (it runs before the experts from the same forced input). */
static void mx_experts_act_in_mlp_not_attention(void **state) {
    (void)state;
    const char *names[2] = {"mxfp4", "mxfp8"};
    int ran = 0;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) {
            const fixture *f = &fx[i];
            if (!available(f, names[k])) continue;
            ran++;
            for (int L = 0; L < f->n_layer; L++) {
                assert_true(nmse(f, names[k], "forced", L, "attn_proj") == 0);
                assert_true(nmse(f, names[k], "forced", L, "attn_out") == 0);
                assert_int_equal(flips(f, names[k], "forced", L, "index_topk"), 0);
                if (is_moe(f, L) && !(nmse(f, names[k], "forced", L, "mlp_out") > 0))
                    m3_test_failf("%s: %s layer %d mlp_out unchanged", f->name, names[k], L);
                /* a dense-MLP layer has no experts to quantize */
                if (!is_moe(f, L)) assert_true(nmse(f, names[k], "forced", L, "output") == 0);
            }
        }
    if (!ran) skip(); /* experts=mxfp4/mxfp8 unavailable in this build */
}

/* fp8 KV (forced): attention output changes on the sparse layers (ATOM's prefill reads the
 * cache there, spec §3.10); the index path is untouched (its own cache). */
static void kv_fp8_acts_in_attention(void **state) {
    (void)state;
    int ran = 0;
    for (int i = 0; i < 2; i++) {
        const fixture *f = &fx[i];
        if (!available(f, "kv-fp8")) continue;
        ran++;
        for (int L = 0; L < f->n_layer; L++) {
            assert_int_equal(flips(f, "kv-fp8", "forced", L, "index_topk"), 0);
            /* dense layers attend over the fresh k/v in prefill, not the cache (§3.10) */
            if (!is_sparse(f, L)) assert_true(nmse(f, "kv-fp8", "forced", L, "attn_out") == 0);
            if (is_sparse(f, L)) {
                assert_true(nmse(f, "kv-fp8", "forced", L, "index_scores") == 0);
                if (!(nmse(f, "kv-fp8", "forced", L, "attn_out") > 0))
                    m3_test_failf("%s: kv-fp8 layer %d attn_out unchanged", f->name, L);
            }
        }
    }
    if (!ran) skip();
}

/* fp8 index cache (forced): only sparse layers change, first in index_scores; attention
 * changes only through flipped blocks. */
static void index_fp8_acts_in_the_indexer(void **state) {
    (void)state;
    int ran = 0;
    for (int i = 0; i < 2; i++) {
        const fixture *f = &fx[i];
        if (!available(f, "index-fp8")) continue;
        ran++;
        for (int L = 0; L < f->n_layer; L++) {
            if (!is_sparse(f, L)) {
                assert_true(nmse(f, "index-fp8", "forced", L, "output") == 0);
                continue;
            }
            if (!(nmse(f, "index-fp8", "forced", L, "index_scores") > 0))
                m3_test_failf("%s: index-fp8 layer %d index_scores unchanged", f->name, L);
            if (flips(f, "index-fp8", "forced", L, "index_topk") == 0)
                assert_true(nmse(f, "index-fp8", "forced", L, "attn_out") == 0);
        }
    }
    if (!ran) skip();
}

/* top-k reuse (freq 4, offset 0, spec §3.9): dense layers and the computing sparse layers
 * (ordinal o with o mod 4 == 0) are untouched; some reusing layer selects differently. */
static void topk_reuse_acts_on_reusing_layers(void **state) {
    (void)state;
    int ran = 0;
    for (int i = 0; i < 2; i++) {
        const fixture *f = &fx[i];
        if (!available(f, "topk-reuse")) continue;
        ran++;
        int o = 0, changed = 0;
        for (int L = 0; L < f->n_layer; L++) {
            bool reuse = is_sparse(f, L) && (o++ % 4) != 0;
            double e = nmse(f, "topk-reuse", "forced", L, "output");
            if (!reuse)
                assert_true(e == 0);
            else
                changed += e > 0 || flips(f, "topk-reuse", "forced", L, "index_topk") > 0;
        }
        assert_true(changed > 0);
    }
    if (!ran) skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(control_row_is_exactly_zero),
        cmocka_unit_test(hf_error_is_nonzero_and_bounded),
        cmocka_unit_test(atom_differs_from_hf),
        cmocka_unit_test(layer0_is_the_same_in_both_modes),
        cmocka_unit_test(forced_equals_replay_by_hand),
        cmocka_unit_test(json_has_every_factor_and_layer),
        cmocka_unit_test(html_is_self_contained),
        cmocka_unit_test(html_renders_in_chromium),
        cmocka_unit_test(bad_input_exits_2),
        cmocka_unit_test(mx_experts_act_in_mlp_not_attention),
        cmocka_unit_test(kv_fp8_acts_in_attention),
        cmocka_unit_test(index_fp8_acts_in_the_indexer),
        cmocka_unit_test(topk_reuse_acts_on_reusing_layers),
    };
    cmocka_set_test_filter(getenv("M3_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
