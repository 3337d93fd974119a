/* tests/cmp_gsm8k.c: lm-eval-compatible GSM8K scoring (compare/gsm8k.[ch]) and
 * `m3 eval gsm8k` end to end.
 * Expected filter outputs and normalisations were produced by Python's `re` running the exact
 * patterns of lm-eval's gsm8k.yaml (findall, group_select, first non-empty group, strip; the
 * regexes_to_ignore chain then lower()). McNemar p-values are exact binomial sums computed with
 * Python fractions; accuracy/stderr with lm-eval's mean_stderr formula. The sampler indices
 * are CPython 3.11 random.Random(seed).sample / getrandbits outputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compare/gsm8k.h"
#include "tests/util.h"

static const struct {
    const char *resp, *strict, *flex;
} filter_cases[] = {
    {"The answer is 18.\n#### 18", "18", "18"},
    {"#### 1,234", "1,234", "1,234"},
    {"#### -5", "-5", "-5"},
    {"#### $5", "[invalid]", "$5"},
    {"#### 3.50.", "3.50.", "3.50."},
    {"#### 7\n#### 8", "7", "8"},
    {"no number here", "[invalid]", "[invalid]"},
    {"", "[invalid]", "[invalid]"},
    {"x #### y", "[invalid]", "[invalid]"},
    {"####5", "[invalid]", "5"},
    {"##### 42", "42", "42"},
    {"#### -", "[invalid]", "[invalid]"},
    {"#### -.", "-.", "[invalid]"},
    {"-#### 9", "9", "9"},
    {"a -3 b -4.5 c", "[invalid]", "-4.5"},
    {"costs $1,000.50 total", "[invalid]", "$1,000.50"},
    {"1.", "[invalid]", "1."},
    {"5 apples and 6.", "[invalid]", "6."},
    {"I have 2 then 3", "[invalid]", "3"},
    {"-", "[invalid]", "[invalid]"},
    {"$", "[invalid]", "[invalid]"},
    {"$$", "[invalid]", "$$"},
    {"-$5", "[invalid]", "-$5"},
    {"-5x", "[invalid]", "-5"},
    {"7 - 8", "[invalid]", "8"},
    {"12,345,678", "[invalid]", "12,345,678"},
    {"answer: 0.", "[invalid]", "0."},
    {"#### 72\nbut maybe 73", "72", "73"},
    {"the result 1e5", "[invalid]", "5"},
    {"3/4 of 12 is 9", "[invalid]", "9"},
    {"v1.2.3", "[invalid]", "1.2.3"},
    {"#### 1 000", "1", "000"},
    {"Total: 42.\n", "[invalid]", "42."},
    {"abc123def", "[invalid]", "123"},
    {"--5", "[invalid]", "-5"},
    {"..", "[invalid]", ".."},
    {"-.-", "[invalid]", "[invalid]"},
    {"#### 10\n\nQuestion: 1+1?", "10", "1"},
    {"\xd9\xa1\xd9\xa2\xd9\xa3 45", "[invalid]", "45"},
};

static void filters_match_lm_eval(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof filter_cases / sizeof filter_cases[0]; i++) {
        const char *r = filter_cases[i].resp;
        char *out = malloc(m3_gsm8k_extract_bytes(strlen(r)));
        assert_non_null(out);
        bool ok = m3_gsm8k_extract(M3_GSM8K_STRICT, r, out);
        if (strcmp(out, filter_cases[i].strict))
            m3_test_failf("strict-match(case %zu) = '%s', lm-eval '%s'", i, out,
                          filter_cases[i].strict);
        assert_int_equal(ok, strcmp(filter_cases[i].strict, M3_GSM8K_INVALID) != 0);
        ok = m3_gsm8k_extract(M3_GSM8K_FLEXIBLE, r, out);
        if (strcmp(out, filter_cases[i].flex))
            m3_test_failf("flexible-extract(case %zu) = '%s', lm-eval '%s'", i, out,
                          filter_cases[i].flex);
        assert_int_equal(ok, strcmp(filter_cases[i].flex, M3_GSM8K_INVALID) != 0);
        free(out);
    }
}

static const struct {
    const char *in, *out;
} norm_cases[] = {
    {"1,234", "1234"},
    {"$5", "5"},
    {"#### 72", "72"},
    {"a #### b #### 12.", "12"},
    {"12.\n", "12\n"},
    {"12..", "12."},
    {"ABC", "abc"},
    {"$1,000.", "1000"},
    {"[invalid]", "[invalid]"},
    {"x\n#### 5\n", "5\n"},
    {".", ""},
    {"3.0", "3.0"},
    {"Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"},
    {"#### #### 5", "5"},
    {"5.\n\n", "5.\n\n"},
    {"#,### 1", "1"},
};

static void normalisation_matches_lm_eval(void **state) {
    (void)state;
    char buf[256];
    for (size_t i = 0; i < sizeof norm_cases / sizeof norm_cases[0]; i++) {
        m3_gsm8k_normalize(norm_cases[i].in, buf);
        if (strcmp(buf, norm_cases[i].out))
            m3_test_failf("normalize(case %zu) = '%s', lm-eval '%s'", i, buf, norm_cases[i].out);
    }
    /* exact_match on whole pairs: gold answer text against extracted predictions */
    const char *gold = "She sold 48/2 = <<48/2=24>>24 clips.\n#### 1,072";
    assert_int_equal(m3_gsm8k_exact_match("1072", gold), 1);
    assert_int_equal(m3_gsm8k_exact_match("1,072", gold), 1);
    assert_int_equal(m3_gsm8k_exact_match("$1,072.", gold), 1);
    assert_int_equal(m3_gsm8k_exact_match("1072.0", gold), 0); /* no numeric equivalence */
    assert_int_equal(m3_gsm8k_exact_match("-1072", gold), 0);
    assert_int_equal(m3_gsm8k_exact_match(M3_GSM8K_INVALID, gold), 0);
    assert_int_equal(m3_gsm8k_exact_match("-3.5", "#### -3.5"), 1);
}

static void accuracy_and_stderr(void **state) {
    (void)state;
    const uint8_t a[4] = {1, 0, 1, 1};
    double acc, se;
    m3_gsm8k_accuracy(a, 4, &acc, &se);
    assert_true(acc == 0.75 && se == 0.25); /* var (3*.0625 + .5625)/3 = .25: exact */
    uint8_t b[20];
    for (int i = 0; i < 20; i++) b[i] = i < 13;
    m3_gsm8k_accuracy(b, 20, &acc, &se);
    /* Python: sqrt(sum((x-mu)^2)/19)/sqrt(20); same operations, 1 ulp slack for libm sqrt */
    assert_true(acc == 0.65 && fabs(se - 0.1094243309804831) < 1e-16);
    m3_gsm8k_accuracy(b, 1, &acc, &se);
    assert_true(acc == 1.0 && isnan(se));
}

static void mcnemar_known_tables(void **state) {
    (void)state;
    static const struct {
        int b, c;
        double p;
    } t[] = {{3, 5, 186.0 / 256}, {0, 0, 1.0}, {0, 6, 2.0 / 64}, {1, 9, 22.0 / 1024},
             {10, 10, 1.0}, {2, 12, 212.0 / 16384}, {5, 1, 0.21875},
             {30, 60, 0.002060265680963076}, {400, 500, 0.0009564441369189461},
             {61, 79, 0.1505276971716133}, {0, 1500, 0.0}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int n = t[i].b + t[i].c + 7; /* plus 4 both-correct, 3 both-wrong pairs */
        uint8_t *x = calloc((size_t)n, 1), *y = calloc((size_t)n, 1);
        int k = 0;
        for (int j = 0; j < t[i].b; j++, k++) x[k] = 1;
        for (int j = 0; j < t[i].c; j++, k++) y[k] = 1;
        for (int j = 0; j < 4; j++, k++) x[k] = y[k] = 1;
        m3_mcnemar m = m3_mcnemar_exact(x, y, n);
        assert_true(m.only_a == t[i].b && m.only_b == t[i].c && m.both == 4 && m.neither == 3);
        /* log-space binomial sum via lgamma: relative error ~1e-12 at n = 900 */
        if (!(fabs(m.p - t[i].p) <= 1e-10 * t[i].p + 1e-300))
            m3_test_failf("mcnemar(b=%d, c=%d) p = %.17g, exact %.17g", t[i].b, t[i].c, m.p,
                          t[i].p);
        /* symmetric in the two variants */
        assert_true(m3_mcnemar_exact(y, x, n).p == m.p);
        free(x);
        free(y);
    }
}

static void python_random_sampler(void **state) {
    (void)state;
    m3_pyrandom r;
    m3_pyrandom_seed(&r, 1234);
    assert_true(m3_pyrandom_u32(&r) == 4150886329u);
    assert_true(m3_pyrandom_u32(&r) == 3342196574u);
    assert_true(m3_pyrandom_u32(&r) == 1892932127u);
    static const int64_t want[3][5] = {{6374, 3610, 957, 61, 742},
                                       {7462, 6610, 4769, 286, 5501},
                                       {5677, 687, 806, 6279, 2905}};
    m3_pyrandom_seed(&r, M3_GSM8K_FEWSHOT_SEED);
    for (int d = 0; d < 3; d++) { /* one generator shared by the documents, as in lm-eval */
        int64_t idx[5];
        assert_int_equal(m3_pyrandom_sample(&r, 7473, 5, idx), M3_OK);
        assert_memory_equal(idx, want[d], sizeof idx);
    }
    m3_pyrandom_seed(&r, (1ull << 40) + 5); /* two-word key; pool branch (n <= 21) */
    int64_t a[4], b[5];
    const int64_t wa[4] = {8, 9, 4, 5}, wb[5] = {14, 271, 23, 84, 40};
    assert_int_equal(m3_pyrandom_sample(&r, 10, 4, a), M3_OK);
    assert_int_equal(m3_pyrandom_sample(&r, 300, 5, b), M3_OK);
    assert_memory_equal(a, wa, sizeof a);
    assert_memory_equal(b, wb, sizeof b);
}

static void prompt_layout(void **state) {
    (void)state;
    m3_gsm8k_item s0 = {"Q one?", "A one.\n#### 1"}, s1 = {"Q two?", "A two.\n#### 2"};
    const m3_gsm8k_item *shots[2] = {&s0, &s1};
    char *p = m3_gsm8k_prompt(shots, 2, "Q three?");
    assert_string_equal(p, "Question: Q one?\nAnswer: A one.\n#### 1\n\n"
                           "Question: Q two?\nAnswer: A two.\n#### 2\n\n"
                           "Question: Q three?\nAnswer:");
    free(p);
    p = m3_gsm8k_prompt(NULL, 0, "Q?");
    assert_string_equal(p, "Question: Q?\nAnswer:");
    free(p);
}

/* ---- end to end through build/m3 ---- */

static char tmpdir[256];

static void write_file(const char *name, const char *text, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = calloc(1, 1 << 16);
    size_t n = fread(b, 1, (1 << 16) - 1, f);
    b[n] = 0;
    fclose(f);
    return b;
}

static int run(const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s eval gsm8k %s", m3_bin(), args);
    return m3_run_cmd(cmd, out);
}

static void cli_responses(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "build/test-tmp/cmp_gsm8k");
    assert_int_equal(m3_run_cmd("mkdir -p build/test-tmp/cmp_gsm8k", NULL), 0);
    char a[512], b[512], js[512], cmd[2048], *out = NULL;
    /* 4 items: A right on 0,1,2 (strict) ; B right on 0,3 */
    write_file("a.jsonl",
               "{\"answer\": \"x\\n#### 1,000\", \"response\": \"so #### 1000\"}\n"
               "{\"answer\": \"#### 5\", \"response\": \"#### $5.\"}\n"
               "\n"
               "{\"answer\": \"#### -2\", \"response\": \"#### -2\\n#### 3\"}\n"
               "{\"answer\": \"#### 7\", \"response\": \"I think 7\"}\n",
               a, sizeof a);
    write_file("b.jsonl",
               "{\"answer\": \"x\\n#### 1,000\", \"response\": \"#### 1,000.\"}\n"
               "{\"answer\": \"#### 5\", \"response\": \"#### 6\"}\n"
               "{\"answer\": \"#### -2\", \"response\": \"no idea\"}\n"
               "{\"answer\": \"#### 7\", \"response\": \"#### 7\"}\n",
               b, sizeof b);
    snprintf(js, sizeof js, "%s/out.json", tmpdir);
    remove(js);
    snprintf(cmd, sizeof cmd, "--responses %s --json %s", a, js);
    assert_int_equal(run(cmd, &out), 0);
    assert_non_null(strstr(out, "strict-match"));
    free(out);
    char *j = slurp(js);
    assert_non_null(j);
    /* the keys and shape of spec/cli.md. strict: items 0 and 2 right ("#### $5." is invalid:
     * '$' is not in the strict class; "I think 7" has no "####"). flexible: last numbers
     * "1000", "$5." (-> 5), "3" (wrong), "7" -> 3/4 */
    assert_non_null(strstr(j, "{\"n\": 4, \"strict-match\": {\"correct\": 2, \"accuracy\": 0.5, "
                              "\"stderr\": 0.28867513459481287}"));
    assert_non_null(strstr(j, "\"flexible-extract\": {\"correct\": 3, \"accuracy\": 0.75, "
                              "\"stderr\": 0.25}"));
    assert_non_null(strstr(j, "\"invalid\": {\"strict-match\": {\"count\": 2, \"rate\": 0.5}, "
                              "\"flexible-extract\": {\"count\": 0, \"rate\": 0}}"));
    free(j);
    /* paired: McNemar and changed answers under "variants" */
    snprintf(cmd, sizeof cmd, "--responses %s --responses %s --json %s", a, b, js);
    assert_int_equal(run(cmd, &out), 0);
    free(out);
    j = slurp(js);
    assert_non_null(strstr(j, "\"variants\": {"));
    assert_non_null(strstr(j, "\"mcnemar\": {\"against\": "));
    /* strict: A right {0,2}, B right {0,3} -> both 1, only A 1, only B 1, p = 1 */
    assert_non_null(strstr(j, "\"strict-match\": {\"both_correct\": 1, \"only_reference_correct\":"
                              " 1, \"only_this_correct\": 1, \"both_wrong\": 1, \"p_value\": 1, "
                              "\"changed_answers\": 3}"));
    free(j);
    /* gate */
    snprintf(cmd, sizeof cmd, "--responses %s --min-accuracy 0.6", a);
    assert_int_equal(run(cmd, &out), 1);
    free(out);
}

static void cli_bad_input(void **state) {
    (void)state;
    char p[512], cmd[2048], js[512], *out = NULL;
    snprintf(js, sizeof js, "%s/never.json", tmpdir);
    remove(js);
    static const char *bad[] = {"{\"answer\": \"#### 1\", \"response\": \"1\"}\n{oops\n",
                                "{\"answer\": \"#### 1\"}\n", "[1, 2]\n",
                                "{\"answer\": 3, \"response\": \"1\"}\n", "\n\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file("bad.jsonl", bad[i], p, sizeof p);
        snprintf(cmd, sizeof cmd, "--responses %s --json %s", p, js);
        assert_int_equal(run(cmd, &out), 2);
        /* exactly one line, naming the file */
        assert_non_null(strstr(out, "m3: "));
        assert_non_null(strstr(out, "bad.jsonl"));
        assert_true(strchr(out, '\n') == out + strlen(out) - 1);
        free(out);
        struct stat st;
        assert_true(stat(js, &st) != 0); /* no partial output */
    }
    assert_int_equal(run("--responses /nonexistent/x.jsonl", &out), 2);
    free(out);
    assert_int_equal(run("--model m --data d.jsonl --num-fewshot x", &out), 2);
    free(out);
    assert_int_equal(run("--model m --data d.jsonl --backend tpu", &out), 2);
    free(out);
    snprintf(cmd, sizeof cmd, "--model m --data fixtures/arith/test.jsonl --variants "
             "fp32,mxfp4+mxfp8");
    assert_int_equal(run(cmd, &out), 2);
    /* variants are resolved before anything is read (mxfp4+mxfp8 sets experts twice) */
    assert_non_null(strstr(out, "variant 'mxfp4+mxfp8'"));
    free(out);
}

static void arith_fixture_scores_itself(void **state) {
    (void)state;
    m3_gsm8k_set s;
    assert_int_equal(m3_gsm8k_set_read(&s, "fixtures/arith/test.jsonl"), M3_OK);
    assert_true(s.n >= 200);
    for (int64_t i = 0; i < s.n; i++) {
        char *out = malloc(m3_gsm8k_extract_bytes(strlen(s.items[i].answer)));
        assert_true(m3_gsm8k_extract(M3_GSM8K_STRICT, s.items[i].answer, out));
        assert_int_equal(m3_gsm8k_exact_match(out, s.items[i].answer), 1);
        free(out);
    }
    m3_gsm8k_set_free(&s);
    /* prompts through the CLI: 5 shots from the same file, the asked item excluded */
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "--data fixtures/arith/test.jsonl --limit 3 --write-prompts %s/p.jsonl",
             tmpdir);
    assert_int_equal(run(cmd, &out), 0);
    free(out);
    snprintf(cmd, sizeof cmd, "%s/p.jsonl", tmpdir);
    char *p = slurp(cmd);
    assert_non_null(p);
    assert_non_null(strstr(p, "{\"doc_id\": 0, \"shots\": ["));
    assert_non_null(strstr(p, "\\nAnswer:\", \"target\": "));
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(filters_match_lm_eval),
        cmocka_unit_test(normalisation_matches_lm_eval),
        cmocka_unit_test(accuracy_and_stderr),
        cmocka_unit_test(mcnemar_known_tables),
        cmocka_unit_test(python_random_sampler),
        cmocka_unit_test(prompt_layout),
        cmocka_unit_test(cli_responses),
        cmocka_unit_test(cli_bad_input),
        cmocka_unit_test(arith_fixture_scores_itself),
    };
    return M3_RUN_TESTS(tests);
}
