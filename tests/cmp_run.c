/* tests/cmp_run.c: `m3 run` and `m3 replay` at the command line (shared spec/cli.md): the
 * dump they write (attributes, stages, passes), atomic output, and every bad input giving
 * exit 2 with one line on stderr and no output file. Uses the hf-tiny oracle fixture. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compare/dump.h"
#include "tests/util.h"

static char tmp[256];
static char fx[512]; /* fixture dir */

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static int setup(void **state) {
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/m3_cmp_run_XXXXXX");
    if (!mkdtemp(tmp)) return -1;
    snprintf(fx, sizeof fx, "%s/fixtures/hf-tiny", m3_shared_dir());
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* exit 2, exactly one line, starting "m3: " and containing `what` */
static void expect_fail(const char *what, int rc, char *out) {
    if (rc != 2 || strncmp(out, "m3: ", 4) != 0 || !strstr(out, what) ||
        strchr(out, '\n') != out + strlen(out) - 1)
        fail_msg("expected exit 2 with one 'm3: ...%s...' line, got exit %d: %s", what, rc, out);
    free(out);
}

static void run_writes_dump(void **state) {
    (void)state;
    char *out, path[400];
    snprintf(path, sizeof path, "%s/run.h5", tmp);
    int rc =
        m3_run_m3(&out, "run --model %s/model --tokens %s/tokens.txt --dump %s --threads 2", fx, fx, path);
    if (rc) fail_msg("exit %d: %s", rc, out);
    assert_non_null(strstr(out, "next: "));
    free(out);
    char tmpf[420];
    snprintf(tmpf, sizeof tmpf, "%s.tmp", path);
    assert_false(exists(tmpf));
    m3_dump *d;
    assert_int_equal(m3_dump_open(&d, path, M3_DUMP_READ), M3_OK);
    char *s;
    assert_int_equal(m3_dump_get_attr_str(d, "producer", &s), M3_OK);
    assert_int_equal(strncmp(s, "m3 ref ", 7), 0);
    free(s);
    assert_int_equal(m3_dump_get_attr_str(d, "profile", &s), M3_OK);
    assert_string_equal(s, "fp32");
    free(s);
    assert_int_equal(m3_dump_get_attr_str(d, "variant", &s), M3_OK);
    /* the default variant (ref/variant.h): experts as stored, bf16 contiguous caches */
    assert_non_null(strstr(s, "\"experts\":\"stored\""));
    assert_non_null(strstr(s, "\"kv_cache\":\"bf16\""));
    assert_non_null(strstr(s, "\"cache_layout\":\"contiguous\""));
    free(s);
    assert_int_equal(m3_dump_get_attr_str(d, "command", &s), M3_OK);
    assert_non_null(strstr(s, "m3 run --model"));
    free(s);
    /* model_config is config.json verbatim */
    assert_int_equal(m3_dump_get_attr_str(d, "model_config", &s), M3_OK);
    char cfgp[600];
    snprintf(cfgp, sizeof cfgp, "%s/model/config.json", fx);
    FILE *f = fopen(cfgp, "rb");
    assert_non_null(f);
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    fclose(f);
    assert_int_equal(strlen(s), n);
    assert_memory_equal(s, buf, n);
    free(buf);
    free(s);
    int64_t v;
    assert_int_equal(m3_dump_get_attr_int(d, "format_version", &v), M3_OK);
    assert_int_equal(v, 1);
    const char *keys[] = {"tokens",
                          "positions",
                          "embed",
                          "layers/00/input",
                          "layers/00/q",
                          "layers/01/index_topk",
                          "layers/01/index_q",
                          "layers/03/expert_ids",
                          "layers/03/expert_weights",
                          "layers/03/shared_out",
                          "layers/03/output",
                          "final_norm",
                          "logits"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!m3_dump_has(d, keys[i])) fail_msg("dump lacks %s", keys[i]);
    m3_tensor t;
    assert_int_equal(m3_dump_info(d, "layers/01/index_topk", &t), M3_OK);
    assert_int_equal(t.rank, 3);
    assert_int_equal(t.shape[0], 2);
    assert_int_equal(t.shape[1], 160);
    m3_dump_close(d);

    /* the run agrees with transformers per m3 compare's own table (exit 0) */
    rc = m3_run_m3(&out, "compare %s/hf_fp32.h5 %s --quiet", fx, path);
    if (rc) fail_msg("m3 compare exit %d: %s", rc, out);
    free(out);

    /* an existing dump is never replaced without --force; the file is untouched */
    struct stat st0, st1;
    assert_int_equal(stat(path, &st0), 0);
    rc = m3_run_m3(&out, "run --model %s/model --ids '1 2 3' --dump %s", fx, path);
    expect_fail("exists", rc, out);
    assert_int_equal(stat(path, &st1), 0);
    assert_true(st0.st_size == st1.st_size && st0.st_mtime == st1.st_mtime);
    rc = m3_run_m3(&out, "run --model %s/model --ids '1 2 3' --dump %s --force", fx, path);
    if (rc) fail_msg("--force: exit %d: %s", rc, out);
    free(out);
}

static void generate_writes_passes(void **state) {
    (void)state;
    char *out, path[400];
    snprintf(path, sizeof path, "%s/gen.h5", tmp);
    int rc = m3_run_m3(&out, "run --model %s/model --ids '5 17 42 99 7' --generate 3 --dump %s", fx, path);
    if (rc) fail_msg("exit %d: %s", rc, out);
    assert_non_null(strstr(out, "generated:"));
    free(out);
    m3_dump *d;
    assert_int_equal(m3_dump_open(&d, path, M3_DUMP_READ), M3_OK);
    assert_true(m3_dump_has(d, "passes/0000/logits"));
    assert_true(m3_dump_has(d, "passes/0003/layers/03/output"));
    assert_false(m3_dump_has(d, "passes/0004/tokens"));
    assert_false(m3_dump_has(d, "logits"));
    m3_tensor t;
    assert_int_equal(m3_dump_read(d, "passes/0002/positions", &t), M3_OK);
    assert_int_equal(t.shape[0], 1);
    assert_int_equal(((int32_t *)t.data)[0], 6); /* 5 prompt tokens, second decode step */
    m3_tensor_free(&t);
    m3_dump_close(d);

    /* replaying the multi-pass dump from itself reproduces it (fp32, same code) */
    char rp[400];
    snprintf(rp, sizeof rp, "%s/gen_replay.h5", tmp);
    rc = m3_run_m3(&out, "replay --model %s/model --from %s --dump %s", fx, path, rp);
    if (rc) fail_msg("replay exit %d: %s", rc, out);
    free(out);
    rc = m3_run_m3(&out, "compare %s %s --quiet", path, rp);
    if (rc) fail_msg("compare of replay vs run: exit %d: %s", rc, out);
    free(out);
}

static void replay_hf_against_bf16(void **state) {
    (void)state;
    char *out, path[400];
    snprintf(path, sizeof path, "%s/replay.h5", tmp);
    int rc = m3_run_m3(&out,
                "replay --model %s/model --from %s/hf_bf16.h5 --profile hf --ref-select "
                "--dump %s",
                fx, fx, path);
    if (rc) fail_msg("exit %d: %s", rc, out);
    free(out);
    rc = m3_run_m3(&out, "compare %s/hf_bf16.h5 %s --quiet", fx, path);
    if (rc) fail_msg("m3 compare exit %d: %s", rc, out);
    free(out);
    /* a replay source without layer inputs cannot teacher-force: exit 2, no output */
    char src[400], bp[400];
    snprintf(src, sizeof src, "%s/tokens_only.h5", tmp);
    snprintf(bp, sizeof bp, "%s/noinput.h5", tmp);
    m3_dump *d;
    assert_int_equal(m3_dump_open(&d, src, M3_DUMP_CREATE), M3_OK);
    int32_t tok[2] = {3, 4}, pos[2] = {0, 1};
    m3_tensor t = {.dtype = M3_DT_I32, .rank = 1, .shape = {2}, .data = tok};
    assert_int_equal(m3_dump_write(d, "tokens", &t, NULL), M3_OK);
    t.data = pos;
    assert_int_equal(m3_dump_write(d, "positions", &t, NULL), M3_OK);
    assert_int_equal(m3_dump_commit(d), M3_OK);
    m3_dump_close(d);
    rc = m3_run_m3(&out, "replay --model %s/model --from %s --dump %s", fx, src, bp);
    expect_fail("layers/00/input", rc, out);
    assert_false(exists(bp));
}

static void bad_inputs_exit_2(void **state) {
    (void)state;
    char *out, path[400], tmpf[420];
    snprintf(path, sizeof path, "%s/bad.h5", tmp);
    snprintf(tmpf, sizeof tmpf, "%s.tmp", path);
    int rc;
    rc = m3_run_m3(&out, "run --model %s/no-such-dir --ids '1 2' --dump %s", tmp, path);
    expect_fail("no-such-dir", rc, out);
    rc = m3_run_m3(&out, "run --model %s/model --ids '1 512' --dump %s", fx, path);
    expect_fail("512", rc, out);
    rc = m3_run_m3(&out, "run --model %s/model --ids '1 x' --dump %s", fx, path);
    expect_fail("--ids", rc, out);
    rc = m3_run_m3(&out, "run --model %s/model --tokens %s/none.txt --dump %s", fx, tmp, path);
    expect_fail("none.txt", rc, out);
    rc = m3_run_m3(&out, "run --model %s/model --ids '1' --experts mxfp5 --dump %s", fx, path);
    expect_fail("mxfp5", rc, out);
    rc = m3_run_m3(&out, "run --model %s/model --ids '1' --kv-cache fp9", fx);
    expect_fail("fp9", rc, out);
    rc = m3_run_m3(&out, "run --model %s/model --ids '1' --topk-reuse 0", fx);
    expect_fail("topk", rc, out);
    rc = m3_run_m3(&out,
            "run --model %s/model --ids '1' --override '{\"use_index_cache\": true, "
            "\"index_topk_pattern\": \"Sx\"}'",
            fx);
    expect_fail("index_topk_pattern", rc, out);
    rc = m3_run_m3(&out, "run --model %s/model --ids '1' --override '{\"no_such_key\": 1}'", fx);
    expect_fail("no_such_key", rc, out);
    rc = m3_run_m3(&out, "run --model %s/model --ids '1' --profile bf17", fx);
    expect_fail("bf17", rc, out);
    rc = m3_run_m3(&out, "run --model %s/model", fx);
    expect_fail("--ids", rc, out);
    rc = m3_run_m3(&out, "run --model %s/model --ids 1 --bogus 3", fx);
    expect_fail("--bogus", rc, out);
    rc = m3_run_m3(&out, "replay --model %s/model --from %s/none.h5 --dump %s", fx, tmp, path);
    expect_fail("none.h5", rc, out);

    /* a checkpoint missing a tensor the config implies: layer 0 declared MoE, so its router
     * and experts are missing */
    char md[300], cmd[4096];
    snprintf(md, sizeof md, "%s/broken", tmp);
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && ln -sf \"$(realpath '%s/model/model.safetensors')\" '%s/' && "
             "sed 's/\"dense\",/\"sparse\",/' '%s/model/config.json' > '%s/config.json'",
             md, fx, md, fx, md);
    assert_int_equal(system(cmd), 0);
    rc = m3_run_m3(&out, "run --model %s --ids '1 2' --dump %s", md, path);
    expect_fail("missing tensor", rc, out);
    rc = m3_run_m3(&out, "replay --model %s --from %s/hf_fp32.h5 --dump %s", md, fx, path);
    expect_fail("missing tensor", rc, out);

    assert_false(exists(path));
    assert_false(exists(tmpf));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(run_writes_dump),
        cmocka_unit_test(generate_writes_passes),
        cmocka_unit_test(replay_hf_against_bf16),
        cmocka_unit_test(bad_inputs_exit_2),
    };
    cmocka_set_test_filter(getenv("M3_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
