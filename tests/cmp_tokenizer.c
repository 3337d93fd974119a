/* tests/cmp_tokenizer.c: compare/tokenizer against ids and decodes produced by the Hugging Face
 * `tokenizers` library (0.23.2) on the GPU machine (scripts/make_tokenizer_fixture.py,
 * fixtures/tokenizer/). For every committed case: encode(text) == ids exactly,
 * decode(ids) == tokenizers' decode (== text for the main tokenizer: a round trip), and the
 * decode of the first half of the ids == tokenizers' (partial UTF-8 -> U+FFFD as Rust's
 * from_utf8_lossy). Three configurations: cl100k-style Split + ByteLevel (list merges),
 * GPT-2 ByteLevel (legacy "a b" merges, added tokens with lstrip/rstrip/single_word/
 * normalized), a Sequence of every Split behaviour + Digits + ignore_merges, and the
 * o200k-style and Qwen2-style split regexes.
 * The fixture lines are json.dumps output; a small reader below parses exactly that shape
 * (object of strings, integers and integer lists), keeping cJSON out of the tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/tokenizer.h"
#include "tests/util.h"

/* ---- minimal JSON reader for the case lines ---- */

typedef struct {
    char *text, *decoded, *half_decoded; /* decoded NULL: equal to text */
    size_t text_len, decoded_len, half_decoded_len;
    int32_t *ids;
    int64_t n_ids, half;
} jcase;

static void put_utf8(char **o, uint32_t cp) {
    char *p = *o;
    if (cp < 0x80) *p++ = (char)cp;
    else if (cp < 0x800) {
        *p++ = (char)(0xc0 | (cp >> 6));
        *p++ = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        *p++ = (char)(0xe0 | (cp >> 12));
        *p++ = (char)(0x80 | ((cp >> 6) & 0x3f));
        *p++ = (char)(0x80 | (cp & 0x3f));
    } else {
        *p++ = (char)(0xf0 | (cp >> 18));
        *p++ = (char)(0x80 | ((cp >> 12) & 0x3f));
        *p++ = (char)(0x80 | ((cp >> 6) & 0x3f));
        *p++ = (char)(0x80 | (cp & 0x3f));
    }
    *o = p;
}

/* parse a JSON string at *s (pointing at '"'); returns malloc'd bytes */
static char *jstring(const char **s, size_t *len) {
    const char *p = *s + 1;
    char *out = malloc(strlen(p) + 1), *o = out;
    while (*p != '"') {
        if (*p != '\\') {
            *o++ = *p++;
            continue;
        }
        p++;
        char c = *p++;
        switch (c) {
        case 'n': *o++ = '\n'; break;
        case 't': *o++ = '\t'; break;
        case 'r': *o++ = '\r'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'u': {
            uint32_t cp = (uint32_t)strtoul((char[5]){p[0], p[1], p[2], p[3], 0}, NULL, 16);
            p += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && p[0] == '\\' && p[1] == 'u') {
                uint32_t lo = (uint32_t)strtoul((char[5]){p[2], p[3], p[4], p[5], 0}, NULL, 16);
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                p += 6;
            }
            put_utf8(&o, cp);
            break;
        }
        default: *o++ = c; break; /* \" \\ \/ */
        }
    }
    *o = 0;
    *len = (size_t)(o - out);
    *s = p + 1;
    return out;
}

static bool parse_case(const char *line, jcase *c) {
    memset(c, 0, sizeof *c);
    const char *p = line;
    while (*p && *p != '}') {
        p = strchr(p, '"');
        if (!p) return false;
        size_t kl;
        char *key = jstring(&p, &kl);
        p = strchr(p, ':') + 1;
        if (*p == '"') {
            size_t l;
            char *v = jstring(&p, &l);
            if (!strcmp(key, "text")) c->text = v, c->text_len = l;
            else if (!strcmp(key, "decoded")) c->decoded = v, c->decoded_len = l;
            else if (!strcmp(key, "half_decoded")) c->half_decoded = v, c->half_decoded_len = l;
            else free(v);
        } else if (*p == '[') {
            size_t cap = 16;
            c->ids = malloc(cap * sizeof *c->ids);
            p++;
            while (*p != ']') {
                char *end;
                long v = strtol(p, &end, 10);
                if (end == p) break;
                if ((size_t)c->n_ids == cap) c->ids = realloc(c->ids, (cap *= 2) * sizeof *c->ids);
                c->ids[c->n_ids++] = (int32_t)v;
                p = end;
                if (*p == ',') p++;
            }
            p++;
        } else {
            char *end;
            long v = strtol(p, &end, 10);
            if (!strcmp(key, "half")) c->half = v;
            p = end;
        }
        free(key);
        while (*p == ',' || *p == ' ') p++;
    }
    return c->text != NULL;
}

static void case_free(jcase *c) {
    free(c->text);
    free(c->decoded);
    free(c->half_decoded);
    free(c->ids);
}

static void show(const char *what, const char *s, size_t n) {
    fprintf(stderr, "%s: \"", what);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == '"' || ch == '\\' || ch >= 0x7f) fprintf(stderr, "\\x%02x", ch);
        else fputc(ch, stderr);
    }
    fprintf(stderr, "\"\n");
}

/* Run every case of one fixture; returns the number of cases. */
static int64_t check_fixture(const char *tok_path, const char *cases_path, bool round_trip) {
    m3_tokenizer *t = NULL;
    if (m3_tokenizer_open(&t, tok_path)) m3_test_failf("%s", m3_last_error());
    FILE *f = fopen(cases_path, "rb");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int64_t n = 0, bad = 0, lineno = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        jcase c;
        if (!parse_case(line, &c)) m3_test_failf("%s:%lld: unparsable", cases_path, (long long)lineno);
        int32_t *ids = NULL;
        int64_t nid = 0;
        m3_status st = m3_tokenizer_encode(t, c.text, c.text_len, &ids, &nid);
        if (st) m3_test_failf("%s:%lld: encode: %s", cases_path, (long long)lineno, m3_last_error());
        bool ok = nid == c.n_ids && !memcmp(ids, c.ids, (size_t)nid * sizeof *ids);
        char *dec = NULL, *hdec = NULL;
        size_t dl = 0, hl = 0;
        assert_int_equal(m3_tokenizer_decode(t, c.ids, c.n_ids, false, &dec, &dl), M3_OK);
        assert_int_equal(m3_tokenizer_decode(t, c.ids, c.half, false, &hdec, &hl), M3_OK);
        const char *want = c.decoded ? c.decoded : c.text;
        size_t wl = c.decoded ? c.decoded_len : c.text_len;
        bool dok = dl == wl && !memcmp(dec, want, wl);
        bool hok = hl == c.half_decoded_len && !memcmp(hdec, c.half_decoded, hl);
        if (round_trip) dok &= !c.decoded; /* tokenizers itself round-trips these */
        if (!ok || !dok || !hok) {
            if (bad++ < 5) {
                fprintf(stderr, "%s:%lld: %s%s%s\n", cases_path, (long long)lineno,
                        ok ? "" : "ids differ ", dok ? "" : "decode differs ",
                        hok ? "" : "half decode differs");
                show("text", c.text, c.text_len);
                fprintf(stderr, "  got  %lld ids:", (long long)nid);
                for (int64_t i = 0; i < nid && i < 40; i++) fprintf(stderr, " %d", ids[i]);
                fprintf(stderr, "\n  want %lld ids:", (long long)c.n_ids);
                for (int64_t i = 0; i < c.n_ids && i < 40; i++) fprintf(stderr, " %d", c.ids[i]);
                fprintf(stderr, "\n");
                if (!dok) show("decoded", dec, dl);
            }
        }
        free(ids);
        free(dec);
        free(hdec);
        case_free(&c);
        n++;
    }
    free(line);
    fclose(f);
    m3_tokenizer_close(t);
    if (bad) m3_test_failf("%s: %lld of %lld cases differ from tokenizers", cases_path,
                           (long long)bad, (long long)n);
    return n;
}

static void main_tokenizer_matches(void **state) {
    (void)state;
    int64_t n = check_fixture("fixtures/tokenizer/tokenizer.json",
                              "fixtures/tokenizer/cases.jsonl", true);
    assert_true(n >= 3000);
}

static void gpt2_added_tokens_match(void **state) {
    (void)state;
    int64_t n = check_fixture("fixtures/tokenizer/gpt2.json", "fixtures/tokenizer/gpt2_cases.jsonl",
                              false);
    assert_true(n >= 500);
}

static void split_behaviours_match(void **state) {
    (void)state;
    int64_t n = check_fixture("fixtures/tokenizer/split.json",
                              "fixtures/tokenizer/split_cases.jsonl", false);
    assert_true(n >= 500);
}

/* other split regexes over the vocab-600 model: o200k-style letter-case classes with
 * optional contraction suffixes (plus flagged added tokens), and Qwen2-style single digits */
static void o200k_regex_matches(void **state) {
    (void)state;
    int64_t n = check_fixture("fixtures/tokenizer/o200k.json",
                              "fixtures/tokenizer/o200k_cases.jsonl", false);
    assert_true(n >= 500);
}

static void qwen2_regex_matches(void **state) {
    (void)state;
    int64_t n = check_fixture("fixtures/tokenizer/qwen2.json",
                              "fixtures/tokenizer/qwen2_cases.jsonl", true);
    assert_true(n >= 500);
}

static void api_edges(void **state) {
    (void)state;
    m3_tokenizer *t = NULL;
    assert_int_equal(m3_tokenizer_open(&t, "fixtures/tokenizer/tokenizer.json"), M3_OK);
    assert_int_equal(m3_tokenizer_n_vocab(t), 2048);
    int32_t eot = m3_tokenizer_token_id(t, "<|endoftext|>");
    assert_true(eot >= 0);
    assert_int_equal(m3_tokenizer_token_id(t, "no such token"), -1);
    /* invalid UTF-8 input is refused, not guessed at */
    int32_t *ids = NULL;
    int64_t n = 0;
    assert_int_equal(m3_tokenizer_encode(t, "a\xff", 2, &ids, &n), M3_ERR_ARG);
    assert_null(ids);
    assert_int_equal(m3_tokenizer_encode(t, "", 0, &ids, &n), M3_OK);
    assert_int_equal(n, 0);
    free(ids);
    /* skip_special drops special tokens; unknown ids are dropped like tokenizers does */
    int32_t x[4] = {eot, 67, 99999, -3};
    char *s = NULL;
    assert_int_equal(m3_tokenizer_decode(t, x, 4, true, &s, NULL), M3_OK);
    assert_string_equal(s, "a");
    free(s);
    assert_int_equal(m3_tokenizer_decode(t, x, 2, false, &s, NULL), M3_OK);
    assert_string_equal(s, "<|endoftext|>a");
    free(s);
    m3_tokenizer_close(t);
    m3_tokenizer_close(NULL);
}

static void bad_files_fail_cleanly(void **state) {
    (void)state;
    assert_int_equal(m3_run_cmd("mkdir -p build/test-tmp/cmp_tokenizer", NULL), 0);
    static const struct {
        const char *json;
        m3_status st;
        const char *msg;
    } cases[] = {
        {"{", M3_ERR_FORMAT, "not a JSON object"},
        {"{\"normalizer\": {\"type\": \"NFC\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
         M3_ERR_UNSUPPORTED, "normalizer 'NFC'"},
        {"{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": "
         "{\"a\": 0}, \"merges\": [\"a b\"]}}",
         M3_ERR_FORMAT, "'b' is not in the vocab"},
        {"{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": "
         "{\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}",
         M3_ERR_UNSUPPORTED, "regex not accepted"},
        {"{\"decoder\": {\"type\": \"WordPiece\"}}", M3_ERR_UNSUPPORTED, "decoder 'WordPiece'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = "build/test-tmp/cmp_tokenizer/bad.json";
        FILE *f = fopen(p, "wb");
        fputs(cases[i].json, f);
        fclose(f);
        m3_tokenizer *t = (m3_tokenizer *)1;
        assert_int_equal(m3_tokenizer_open(&t, p), cases[i].st);
        assert_null(t);
        if (!strstr(m3_last_error(), cases[i].msg) || !strstr(m3_last_error(), "bad.json"))
            m3_test_failf("case %zu: error '%s'", i, m3_last_error());
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(main_tokenizer_matches),
        cmocka_unit_test(gpt2_added_tokens_match),
        cmocka_unit_test(split_behaviours_match),
        cmocka_unit_test(o200k_regex_matches),
        cmocka_unit_test(qwen2_regex_matches),
        cmocka_unit_test(api_edges),
        cmocka_unit_test(bad_files_fail_cleanly),
    };
    return M3_RUN_TESTS(tests);
}
