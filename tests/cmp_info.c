/* tests/cmp_info.c: `m3 info` end to end. A header-only sparse copy of the real 59-shard
 * MiniMax-M3 layout is generated into <build>/m3layout by scripts/mk_layout.py (python3;
 * the data regions are holes, so 854 GB take ~6 MB), then every number the issue fixes is
 * checked in --json and in the human table. The committed malformed corpus
 * (fixtures/malformed/cases.tsv) must give exit 2 and exactly one stderr line naming the
 * file and the problem. */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/json.h"
#include "tests/util.h"

static char layout[1024];

static int setup(void **state) {
    (void)state;
    char bin[1024];
    snprintf(bin, sizeof bin, "%s", m3_bin());
    snprintf(layout, sizeof layout, "%s/m3layout", dirname(bin));
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "python3 scripts/mk_layout.py '%s' --shared '%s'", layout,
             m3_shared_dir());
    int rc = m3_run_cmd(cmd, &out);
    if (rc != 0) fprintf(stderr, "mk_layout.py failed (%d): %s\n", rc, out ? out : "");
    free(out);
    return rc == 0 ? 0 : -1;
}

/* Run `m3 info ARGS`; returns exit code, *out holds stdout+stderr (caller frees). */
static int info(const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout 20 '%s' info %s", m3_bin(), args);
    return m3_run_cmd(cmd, out);
}

static int64_t jint(const m3_json *o, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const m3_json *j = o;
    for (char *p = buf, *k; (k = strsep(&p, "."));) j = m3_json_get(j, k);
    int64_t v;
    if (!m3_json_int(j, &v)) m3_test_failf("--json: %s missing or not an integer", path);
    return v;
}

static void real_layout_json(void **state) {
    (void)state;
    char args[1100], *out = NULL;
    snprintf(args, sizeof args, "'%s' --json 2>/dev/null", layout);
    int rc = info(args, &out);
    if (rc != 0) m3_test_failf("m3 info --json exit %d: %s", rc, out);
    m3_json *j = NULL;
    if (m3_json_parse(&j, out, strlen(out), "m3 info --json")) m3_test_failf("%s", m3_last_error());
    assert_string_equal(m3_json_get_str(j, "model_type", ""), "minimax_m3_vl");
    assert_true(jint(j, "params.total") == INT64_C(427040140160));
    int64_t act = jint(j, "params.active_per_token");
    assert_true(act == INT64_C(24733280640));
    assert_true(act >= INT64_C(24725000000) && act < INT64_C(24735000000)); /* 24.73 B */
    const char *comps[] = {"routed_experts", "shared_experts", "attention", "sparse_indexer",
                           "dense_mlp", "embed_tokens", "lm_head", "router_and_norms",
                           "vision_tower", "projector"};
    const m3_json *bc = m3_json_get(m3_json_get(j, "params"), "by_component");
    int64_t sum = 0;
    for (size_t i = 0; i < sizeof comps / sizeof comps[0]; i++) {
        int64_t v;
        if (!m3_json_int(m3_json_get(bc, comps[i]), &v) || v <= 0)
            m3_test_failf("by_component.%s missing or zero", comps[i]);
        sum += v;
    }
    sum += m3_json_get_int(bc, "other", 0);
    assert_true(sum == INT64_C(427040140160));
    /* component values from the shape table (spec §2.1) */
    assert_true(jint(j, "params.by_component.routed_experts") == INT64_C(57) * 128 * 3 * 3072 * 6144);
    assert_true(jint(j, "params.by_component.attention") == INT64_C(60) * 6144 * (8192 * 2 + 1024));
    assert_true(jint(j, "params.by_component.sparse_indexer") == INT64_C(57) * 640 * 6144);
    assert_true(jint(j, "params.by_component.lm_head") == INT64_C(200064) * 6144);
    assert_true(jint(j, "checkpoint.files") == 59);
    assert_true(jint(j, "checkpoint.tensors") == 23416);
    assert_true(jint(j, "checkpoint.bytes") == INT64_C(854172958720));
    assert_true(jint(j, "checkpoint.index_total_size") == INT64_C(869157462016));
    assert_true(jint(j, "kv_cache.bytes_per_token.bf16") == 137472);
    assert_true(jint(j, "kv_cache.bytes_per_token.fp8") == 76032);
    assert_true(jint(j, "kv_cache.bytes_per_token.fp8_scales") == 1920);
    const m3_json *w = m3_json_get(m3_json_get(j, "checkpoint"), "warnings");
    assert_true(m3_json_is_array(w));
    bool total_warned = false;
    for (const m3_json *e = m3_json_first(w); e; e = m3_json_next(e))
        if (strstr(m3_json_str(e), "total_size 869157462016 != the tensors' 854172958720"))
            total_warned = true;
    assert_true(total_warned);
    m3_json_free(j);
    free(out);
}

static void expect_in(const char *out, const char *s) {
    if (!strstr(out, s)) m3_test_failf("'%s' not in output:\n%s", s, out);
}

static void real_layout_table_and_overrides(void **state) {
    (void)state;
    char args[1200], *out = NULL;
    snprintf(args, sizeof args, "'%s'", layout);
    assert_int_equal(info(args, &out), 0);
    expect_in(out, "427,040,140,160");
    expect_in(out, "24,733,280,640  (24.73 B)");
    expect_in(out, "59 files, 23,416 tensors, 854,172,958,720 bytes");
    expect_in(out, "bf16 137,472 B (134.25 KiB)");
    expect_in(out, "76,032 B (74.25 KiB)");
    expect_in(out, "fp8 scales 1,920 B");
    expect_in(out, "index total_size 869,157,462,016");
    free(out);
    snprintf(args, sizeof args,
             "'%s' --json --override '{\"use_index_cache\": true, \"index_topk_freq\": 4}'",
             layout);
    assert_int_equal(info(args, &out), 0);
    m3_json *j = NULL;
    assert_int_equal(m3_json_parse(&j, out, strlen(out), "json"), M3_OK);
    assert_true(jint(j, "text.topk_computing_layers") == 15);
    m3_json_free(j);
    free(out);
    snprintf(args, sizeof args, "'%s' --override '{\"index_topk_pattern\": \"S\", \"use_index_cache\": true}'", layout);
    assert_int_equal(info(args, &out), 2);
    expect_in(out, "pattern[0]");
    free(out);
    /* the tiny transformers fixture: HF dialect and aliases */
    snprintf(args, sizeof args, "'%s/fixtures/hf-tiny/model' --json", m3_shared_dir());
    assert_int_equal(info(args, &out), 0);
    assert_int_equal(m3_json_parse(&j, out, strlen(out), "json"), M3_OK);
    assert_true(jint(j, "params.total") == 1179736); /* sum of the fixture's tensor sizes */
    assert_true(jint(j, "checkpoint.tensors") == 180);
    assert_true(m3_json_is_null(m3_json_get(m3_json_get(j, "checkpoint"), "index_total_size")));
    m3_json_free(j);
    free(out);
    /* usage errors */
    assert_int_equal(info("--bogus", &out), 2);
    expect_in(out, "unknown option '--bogus'");
    free(out);
    assert_int_equal(info("", &out), 2);
    free(out);
}

static void malformed_corpus(void **state) {
    (void)state;
    FILE *f = fopen("fixtures/malformed/cases.tsv", "r");
    if (!f) m3_test_failf("fixtures/malformed/cases.tsv: cannot open (run from the repo root)");
    char line[1024];
    int n = 0;
    assert_non_null(fgets(line, sizeof line, f)); /* header */
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *p = line, *dir = strsep(&p, "\t"), *file = strsep(&p, "\t"), *prob = p;
        if (!dir || !file || !prob) m3_test_failf("cases.tsv: bad line '%s'", line);
        char args[1200], *out = NULL;
        snprintf(args, sizeof args, "'fixtures/malformed/%s'", dir);
        int rc = info(args, &out);
        size_t len = strlen(out);
        bool one_line = len > 0 && out[len - 1] == '\n' && strchr(out, '\n') == out + len - 1;
        if (rc != 2 || !one_line || strncmp(out, "m3: ", 4) || !strstr(out, file) ||
            !strstr(out, prob))
            m3_test_failf("malformed/%s: exit %d, output '%s' (want exit 2, one line naming '%s' "
                          "and '%s')",
                          dir, rc, out, file, prob);
        free(out);
        n++;
    }
    fclose(f);
    assert_true(n >= 25);
    char *out = NULL;
    assert_int_equal(info("fixtures/malformed/valid", &out), 0);
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(real_layout_json),
        cmocka_unit_test(real_layout_table_and_overrides),
        cmocka_unit_test(malformed_corpus),
    };
    cmocka_set_test_filter(getenv("M3_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, NULL);
}
