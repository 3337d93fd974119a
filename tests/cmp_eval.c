/* tests/cmp_eval.c: `m3 eval gsm8k --model` (compare/eval_gen.[ch], compare/cmd_eval.c):
 * the variant-name table, greedy generation's stop rules, and the CLI end to end (JSON keys,
 * samples file, resume, settings check, McNemar and divergence blocks, exit 2 paths).
 *
 * Model: fixtures/arith-model when it is committed, else a stand-in made in the test's temp
 * dir from fixtures/tiny-deep/model (random weights, vocab 1024) and
 * fixtures/tokenizer/qwen2.json (vocab 600 < 1024, so every prompt id is valid). The
 * stand-in's answers are wrong, which is fine: these tests check the plumbing, not the
 * accuracy. Generation is deterministic (greedy, bit-identical for any thread count), so
 * the expectations below hold exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compare/eval_gen.h"
#include "tests/util.h"

#define TMP "build/test-tmp/cmp_eval"

static char model_dir[512];

static const char *model(void) {
    if (model_dir[0]) return model_dir;
    struct stat st;
    if (stat("fixtures/arith-model/config.json", &st) == 0) {
        snprintf(model_dir, sizeof model_dir, "fixtures/arith-model");
    } else {
        assert_int_equal(m3_run_cmd("mkdir -p " TMP "/model && cp fixtures/tiny-deep/model/"
                                    "config.json fixtures/tiny-deep/model/model.safetensors "
                                    TMP "/model/ && cp fixtures/tokenizer/qwen2.json " TMP
                                    "/model/tokenizer.json", NULL),
                         0);
        snprintf(model_dir, sizeof model_dir, TMP "/model");
    }
    printf("model: %s\n", model_dir);
    return model_dir;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = calloc(1, (size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return b;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The "tokens": [...] text of the last line of a samples file (malloc'd). */
static char *last_tokens(const char *s) {
    size_t n = strlen(s);
    assert_true(n >= 2 && s[n - 1] == '\n');
    const char *line = s + n - 2;
    while (line > s && line[-1] != '\n') line--;
    const char *a = strstr(line, "\"tokens\": ["), *b = a ? strchr(a, ']') : NULL;
    assert_non_null(b);
    return strndup(a, (size_t)(b - a + 1));
}

/* ---- variant names ------------------------------------------------------------------ */

static void variant_names(void **state) {
    (void)state;
    m3_eval_variant v;
    assert_int_equal(m3_eval_variant_resolve(&v, "fp32"), M3_OK);
    assert_string_equal(v.profile.name, "fp32");
    assert_string_equal(v.keys, "");
    assert_int_equal(m3_eval_variant_resolve(&v, "hf"), M3_OK);
    assert_string_equal(v.profile.name, "hf");
    assert_int_equal(m3_eval_variant_resolve(&v, "atom"), M3_OK);
    assert_string_equal(v.profile.name, "atom");
    /* bad names: M3_ERR_ARG with a line naming the variant */
    static const char *bad[] = {"", "fp16", "hf+", "+mxfp4", "hf++mxfp4", "hf+foo",
                                "topk-reuse0", "topk-reuse", "topk-reusex", "fp32+hf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m3_status s = m3_eval_variant_resolve(&v, bad[i]);
        if (s != M3_ERR_ARG) m3_test_failf("'%s': status %d, want M3_ERR_ARG", bad[i], s);
        if (bad[i][0] && !strstr(m3_last_error(), bad[i]))
            m3_test_failf("'%s': message '%s' does not name it", bad[i], m3_last_error());
    }
    /* modifiers reach ref/variant: either they run, or M3_ERR_UNSUPPORTED naming the
     * variant (this build: MX experts and fp8 caches are not implemented yet) */
    static const char *mods[] = {"mxfp4", "mxfp8", "hf+kv-fp8", "atom+index-fp8",
                                 "mxfp4+kv-fp8", "hf+topk-reuse4"};
    for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) {
        m3_status s = m3_eval_variant_resolve(&v, mods[i]);
        if (s == M3_OK) continue;
        if (s != M3_ERR_UNSUPPORTED || !strstr(m3_last_error(), mods[i]))
            m3_test_failf("'%s': status %d '%s'", mods[i], s, m3_last_error());
    }
}

static void divergence(void **state) {
    (void)state;
    int32_t a[] = {1, 2, 3, 4}, b[] = {1, 2, 9, 4}, c[] = {1, 2};
    assert_int_equal(m3_gen_first_divergence(a, 4, a, 4), -1);
    assert_int_equal(m3_gen_first_divergence(a, 4, b, 4), 2);
    assert_int_equal(m3_gen_first_divergence(a, 4, c, 2), 2);
    assert_int_equal(m3_gen_first_divergence(c, 2, a, 4), 2);
    assert_int_equal(m3_gen_first_divergence(a, 0, c, 0), -1);
    assert_int_equal(m3_gen_first_divergence(b, 1, c, 2), 1);
}

/* ---- generation stop rules ------------------------------------------------------------ */

static void generation_stops(void **state) {
    (void)state;
    m3_tokenizer *tk = NULL;
    m3_model *m = NULL;
    m3_profile p;
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", model());
    assert_int_equal(m3_tokenizer_open(&tk, path), M3_OK);
    m3_profile_fp32(&p);
    assert_int_equal(m3_model_open(&m, model(), NULL, &p), M3_OK);
    const char *q = "Question: Sam has 5 apples and buys 3 more. How many apples does Sam have?"
                    "\nAnswer:";
    int32_t *ids;
    int64_t n;
    assert_int_equal(m3_tokenizer_encode(tk, q, strlen(q), &ids, &n), M3_OK);

    /* no stops: exactly max_gen_toks tokens, max_gen_toks - 1 decode passes */
    m3_gen_opts o = {12, NULL, 0, NULL, 0};
    m3_gen_result base;
    assert_int_equal(m3_generate_greedy(m, tk, ids, (int)n, &o, &base), M3_OK);
    assert_int_equal(base.n_tokens, 12);
    assert_int_equal(base.n_decode, 11);
    assert_int_equal(base.stop, M3_GEN_STOP_MAX);
    char *dec;
    size_t len;
    assert_int_equal(m3_tokenizer_decode(tk, base.tokens, 12, true, &dec, &len), M3_OK);
    assert_string_equal(dec, base.text);
    free(dec);

    /* the same again: greedy is deterministic and the caches are reset per call */
    m3_gen_result again;
    assert_int_equal(m3_generate_greedy(m, tk, ids, (int)n, &o, &again), M3_OK);
    assert_int_equal(m3_gen_first_divergence(base.tokens, 12, again.tokens, 12), -1);
    m3_gen_result_free(&again);

    /* a stop id: the first position where base has a token not seen before ends it there,
     * without keeping that token */
    int at = -1;
    for (int i = 1; i < 12 && at < 0; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= base.tokens[j] == base.tokens[i];
        if (!seen) at = i;
    }
    assert_true(at > 0); /* greedy output with a repeated-only tail would make this vacuous */
    {
        m3_gen_opts os = {12, &base.tokens[at], 1, NULL, 0};
        m3_gen_result r;
        assert_int_equal(m3_generate_greedy(m, tk, ids, (int)n, &os, &r), M3_OK);
        assert_int_equal(r.stop, M3_GEN_STOP_EOS);
        assert_int_equal(r.n_tokens, at);
        assert_int_equal(m3_gen_first_divergence(base.tokens, at, r.tokens, r.n_tokens), -1);
        m3_gen_result_free(&r);
    }
    /* a stop id that is the very first token: an empty response */
    {
        m3_gen_opts os = {12, &base.tokens[0], 1, NULL, 0};
        m3_gen_result r;
        assert_int_equal(m3_generate_greedy(m, tk, ids, (int)n, &os, &r), M3_OK);
        assert_int_equal(r.n_tokens, 0);
        assert_string_equal(r.text, "");
        m3_gen_result_free(&r);
    }
    /* a stop string: the last character of base.text that first appears late; the response
     * is cut right before its first occurrence, and generation ended at the token that
     * completed it */
    size_t tl = strlen(base.text);
    assert_true(tl >= 2);
    {
        char stop[2] = {0, 0};
        size_t first = 0;
        for (size_t i = tl; i-- > 1;) {
            unsigned char c = (unsigned char)base.text[i];
            if (c < 0x80 && c > 0x20 && strchr(base.text, c) - base.text == (ptrdiff_t)i) {
                stop[0] = (char)c;
                first = i;
                break;
            }
        }
        assert_true(stop[0] != 0);
        {
            const char *ss[] = {"never-in-the-text-\x01", stop};
            m3_gen_opts os = {12, NULL, 0, ss, 2};
            m3_gen_result r;
            assert_int_equal(m3_generate_greedy(m, tk, ids, (int)n, &os, &r), M3_OK);
            assert_int_equal(r.stop, M3_GEN_STOP_STRING);
            assert_int_equal(strlen(r.text), first);
            assert_memory_equal(r.text, base.text, first);
            assert_true(r.n_tokens <= 12);
            assert_int_equal(m3_gen_first_divergence(base.tokens, r.n_tokens, r.tokens,
                                                     r.n_tokens), -1);
            m3_gen_result_free(&r);
        }
    }
    m3_gen_result_free(&base);
    free(ids);
    m3_model_close(m);
    m3_tokenizer_close(tk);
}

/* ---- CLI ------------------------------------------------------------------------------ */

static int eval(const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s eval gsm8k --model %s --data fixtures/arith/test.jsonl %s",
             m3_bin(), model(), args);
    return m3_run_cmd(cmd, out);
}

static void cli_generate_and_resume(void **state) {
    (void)state;
    assert_int_equal(m3_run_cmd("mkdir -p " TMP " && rm -f " TMP "/s.jsonl " TMP "/o.json "
                                TMP "/o2.json",
                                NULL),
                     0);
    char *out = NULL;
    const char *args = "--limit 3 --max-gen-toks 16 --num-fewshot 1 --variants fp32,hf "
                       "--samples " TMP "/s.jsonl --json " TMP "/o.json";
    assert_int_equal(eval(args, &out), 0);
    printf("%s", out);
    assert_non_null(strstr(out, "flexible-extract"));
    assert_non_null(strstr(out, "paired against fp32"));
    free(out);
    char *j = slurp(TMP "/o.json");
    assert_non_null(j);
    static const char *keys[] = {
        "{\"n\": 3, \"reference\": \"fp32\", \"settings\": {", "\"variants\": {\"fp32\": {\"n\": 3",
        "\"hf\": {\"n\": 3", "\"strict-match\": {\"correct\": ", "\"flexible-extract\": {",
        "\"invalid\": {\"strict-match\": {\"count\": ", "\"generation\": {\"profile\": \"fp32\"",
        "\"generation\": {\"profile\": \"hf\"", "\"decode_tokens_per_s\": ",
        "\"resumed_items\": 0", "\"mcnemar\": {\"against\": \"fp32\", \"strict-match\": "
        "{\"both_correct\": ", "\"p_value\": ", "\"changed_answers\": ",
        "\"divergence\": {\"against\": \"fp32\", \"diverged_items\": ", "\"max_gen_toks\": 16",
        "\"stop_strings\": [\"Question:\", \"</s>\", \"<|im_end|>\"]"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strstr(j, keys[i])) m3_test_failf("o.json lacks %s:\n%s", keys[i], j);
    /* one mcnemar block: hf's, against fp32 (the reference has none) */
    const char *mc = strstr(j, "\"mcnemar\"");
    assert_non_null(mc);
    assert_null(strstr(mc + 1, "\"mcnemar\""));
    assert_true(mc > strstr(j, "\"hf\": {"));
    free(j);

    /* samples: header + 3 items x 2 variants, each with the per-item fields */
    char *s = slurp(TMP "/s.jsonl");
    assert_non_null(s);
    assert_int_equal(count_lines(s), 7);
    assert_true(!strncmp(s, "{\"format\": \"m3-eval-samples/1\", \"settings\": {", 45));
    static const char *fields[] = {"\"variant\": \"hf\", \"profile\": \"hf\"", "\"doc_id\": 2",
                                   "\"prompt\": \"Question: ", "\"target\": ", "\"response\": ",
                                   "\"tokens\": [", "\"stop\": ",
                                   "\"strict-match\": {\"extracted\": ",
                                   "\"flexible-extract\": {\"extracted\": ", "\"exact_match\": "};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (!strstr(s, fields[i])) m3_test_failf("s.jsonl lacks %s", fields[i]);

    /* resume: a second run generates nothing for the 3 finished items, one new item per
     * variant for --limit 4; the results of the first 3 are the same */
    args = "--limit 4 --max-gen-toks 16 --num-fewshot 1 --variants fp32,hf "
           "--samples " TMP "/s.jsonl --json " TMP "/o2.json";
    assert_int_equal(eval(args, &out), 0);
    free(out);
    char *s2 = slurp(TMP "/s.jsonl");
    assert_int_equal(count_lines(s2), 9);
    assert_memory_equal(s, s2, strlen(s)); /* appended, never rewritten */
    j = slurp(TMP "/o2.json");
    assert_non_null(strstr(j, "{\"n\": 4, "));
    assert_non_null(strstr(j, "\"resumed_items\": 3"));
    free(j);

    /* a cut last line (killed mid-write) is dropped and that item generated again */
    FILE *f = fopen(TMP "/s.jsonl", "wb");
    assert_non_null(f);
    fwrite(s2, 1, strlen(s2) - 20, f);
    fclose(f);
    assert_int_equal(eval(args, &out), 0);
    free(out);
    char *s3 = slurp(TMP "/s.jsonl");
    assert_int_equal(count_lines(s3), 9);
    /* the regenerated line has the same tokens as the original (only timings differ) */
    char *ta = last_tokens(s2), *tb = last_tokens(s3);
    assert_string_equal(ta, tb);
    free(ta);
    free(tb);
    j = slurp(TMP "/o2.json");
    assert_non_null(strstr(j, "\"resumed_items\": 4"));
    assert_non_null(strstr(j, "\"resumed_items\": 3"));
    free(j);
    free(s3);
    free(s2);
    free(s);

    /* other settings: exit 2 with one line, the file untouched */
    s = slurp(TMP "/s.jsonl");
    assert_int_equal(eval("--limit 4 --max-gen-toks 17 --num-fewshot 1 --variants fp32 "
                          "--samples " TMP "/s.jsonl",
                          &out),
                     2);
    assert_non_null(strstr(out, "max_gen_toks differs"));
    assert_true(strchr(out, '\n') == out + strlen(out) - 1);
    free(out);
    s2 = slurp(TMP "/s.jsonl");
    assert_string_equal(s, s2);
    free(s2);
    free(s);
}

static void cli_single_variant_and_errors(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(m3_run_cmd("mkdir -p " TMP " && rm -f " TMP "/one.json " TMP "/u.jsonl",
                                NULL),
                     0);
    /* one variant: the spec's flat object with the variant and settings in front */
    assert_int_equal(eval("--limit 2 --max-gen-toks 4 --num-fewshot 0 --variants fp32 --json "
                          TMP "/one.json",
                          &out),
                     0);
    free(out);
    char *j = slurp(TMP "/one.json");
    assert_non_null(j);
    assert_non_null(strstr(j, "{\"variant\": \"fp32\", \"settings\": {"));
    assert_non_null(strstr(j, "}, \"n\": 2, \"strict-match\": {\"correct\": "));
    assert_null(strstr(j, "\"mcnemar\""));
    free(j);
    /* a variant this build cannot run: exit 2 before generation, no samples file */
    assert_int_equal(eval("--variants fp32,mxfp4 --samples " TMP "/u.jsonl", &out), 2);
    assert_non_null(strstr(out, "variant 'mxfp4'"));
    assert_true(strchr(out, '\n') == out + strlen(out) - 1);
    free(out);
    struct stat st;
    assert_true(stat(TMP "/u.jsonl", &st) != 0);
    assert_int_equal(eval("--variants fp32,fp32", &out), 2);
    assert_non_null(strstr(out, "given twice"));
    free(out);
    assert_int_equal(eval("--backend gpu", &out), 2);
    assert_non_null(strstr(out, "not available in this build"));
    free(out);
    assert_int_equal(eval("--max-gen-toks 0", &out), 2);
    free(out);
    /* a file that is not a samples file is never appended to */
    FILE *f = fopen(TMP "/u.jsonl", "wb");
    fputs("{\"answer\": \"#### 1\", \"response\": \"1\"}\n", f);
    fclose(f);
    assert_int_equal(eval("--limit 1 --max-gen-toks 2 --variants fp32 --samples " TMP
                          "/u.jsonl",
                          &out),
                     2);
    assert_non_null(strstr(out, "not an m3 eval samples file"));
    free(out);
    char *u = slurp(TMP "/u.jsonl");
    assert_string_equal(u, "{\"answer\": \"#### 1\", \"response\": \"1\"}\n");
    free(u);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(variant_names),
        cmocka_unit_test(divergence),
        cmocka_unit_test(generation_stops),
        cmocka_unit_test(cli_generate_and_resume),
        cmocka_unit_test(cli_single_variant_and_errors),
    };
    return M3_RUN_TESTS(tests);
}
