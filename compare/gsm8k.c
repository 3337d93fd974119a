/* compare/gsm8k.c: lm-eval-compatible GSM8K prompts, filters, exact_match, accuracy,
 * McNemar. Contract and sources: compare/gsm8k.h. The two filter regexes are matched by hand
 * (they are small and ASCII-only); each matcher reproduces Python `re` leftmost,
 * ordered-alternation, greedy semantics for its pattern, as the comments explain. */
#include "compare/gsm8k.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/json.h"

const char *m3_gsm8k_filter_name(m3_gsm8k_filter f) {
    M3_ASSERT(f >= 0 && f < M3_GSM8K_N_FILTER);
    return f == M3_GSM8K_STRICT ? "strict-match" : "flexible-extract";
}

size_t m3_gsm8k_extract_bytes(size_t len) {
    return (len > sizeof M3_GSM8K_INVALID ? len : sizeof M3_GSM8K_INVALID) + 1;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
/* strict-match's class [0-9\.\,] */
static bool in_strict_class(char c) { return is_digit(c) || c == '.' || c == ','; }
/* flexible-extract's first class [$0-9.,] */
static bool in_flex_class(char c) { return is_digit(c) || c == '$' || c == '.' || c == ','; }

/* `#### (\-?[0-9\.\,]+)` at position p: returns the group's [b, e) or false.
 * With a '-' present, `\-?` first takes it; if no class character follows, it backtracks to
 * the empty option, where '-' itself is not in the class, so the match fails either way. */
static bool strict_at(const char *s, size_t len, size_t p, size_t *b, size_t *e) {
    if (len - p < 5 || memcmp(s + p, "#### ", 5) != 0) return false;
    size_t q = p + 5, r = q;
    if (r < len && s[r] == '-') r++;
    size_t t = r;
    while (t < len && in_strict_class(s[t])) t++;
    if (t == r) return false;
    *b = q;
    *e = t;
    return true;
}

/* `(-?[$0-9.,]{2,})|(-?[0-9]+)` at p. Alternative 1 first: optional '-' then a greedy run
 * of >= 2 class chars (without the '-' the run would start at '-', which is not in the
 * class). Then alternative 2: optional '-' then digits. Returns match [b, e). */
static bool flex_at(const char *s, size_t len, size_t p, size_t *b, size_t *e) {
    size_t r = p + (s[p] == '-');
    size_t t = r;
    while (t < len && in_flex_class(s[t])) t++;
    if (t - r >= 2) {
        *b = p;
        *e = t;
        return true;
    }
    t = r;
    while (t < len && is_digit(s[t])) t++;
    if (t > r) {
        *b = p;
        *e = t;
        return true;
    }
    return false;
}

/* Python's str.strip() on the match: the matches here contain no whitespace, so it never
 * changes them; kept as a cheap ASCII strip to mirror the filter. */
static void copy_stripped(char *out, const char *s, size_t b, size_t e) {
    while (b < e && (s[b] == ' ' || (s[b] >= '\t' && s[b] <= '\r'))) b++;
    while (e > b && (s[e - 1] == ' ' || (s[e - 1] >= '\t' && s[e - 1] <= '\r'))) e--;
    memcpy(out, s + b, e - b);
    out[e - b] = 0;
}

bool m3_gsm8k_extract(m3_gsm8k_filter f, const char *resp, char *out) {
    M3_ASSERT(resp && out);
    size_t len = strlen(resp), b = 0, e = 0;
    bool found = false;
    if (f == M3_GSM8K_STRICT) {
        /* take_first over findall: the leftmost match */
        for (size_t p = 0; p < len && !found; p++) found = strict_at(resp, len, p, &b, &e);
    } else {
        /* findall scans left to right without overlap; group_select -1 keeps the last */
        size_t p = 0, mb, me;
        while (p < len) {
            if (flex_at(resp, len, p, &mb, &me)) {
                b = mb;
                e = me;
                found = true;
                p = me; /* matches are never empty */
            } else {
                p++;
            }
        }
    }
    if (!found) {
        strcpy(out, M3_GSM8K_INVALID);
        return false;
    }
    copy_stripped(out, resp, b, e);
    return true;
}

void m3_gsm8k_normalize(const char *s, char *out) {
    M3_ASSERT(s && out && s != out);
    /* 1. re.sub(",", "") and 2. re.sub("\$", ""): drop every ',' and '$'. */
    size_t n = 0;
    for (const char *p = s; *p; p++)
        if (*p != ',' && *p != '$') out[n++] = *p;
    out[n] = 0;
    /* 3. re.sub("(?s).*#### ", ""): the greedy .* reaches the LAST "#### "; everything up to
     * and including it goes. A second match cannot follow (no "#### " remains after it). */
    size_t cut = 0;
    for (size_t i = 0; i + 5 <= n; i++)
        if (!memcmp(out + i, "#### ", 5)) cut = i + 5;
    if (cut) {
        memmove(out, out + cut, n - cut + 1);
        n -= cut;
    }
    /* 4. re.sub("\.$", ""): `$` matches at the end and before a final '\n'. The leftmost
     * '.' that qualifies is the one before a final "\n" if present, else a final '.';
     * at most one of them can exist. */
    if (n >= 2 && out[n - 1] == '\n' && out[n - 2] == '.') {
        out[n - 2] = '\n';
        out[n - 1] = 0;
        n--;
    } else if (n >= 1 && out[n - 1] == '.') {
        out[--n] = 0;
    }
    /* ignore_case: lower-case (ASCII; see the header). */
    for (size_t i = 0; i < n; i++)
        if (out[i] >= 'A' && out[i] <= 'Z') out[i] = (char)(out[i] - 'A' + 'a');
}

int m3_gsm8k_exact_match(const char *pred, const char *ref) {
    char *a = malloc(strlen(pred) + 1), *b = malloc(strlen(ref) + 1);
    int r = -1;
    if (a && b) {
        m3_gsm8k_normalize(pred, a);
        m3_gsm8k_normalize(ref, b);
        r = strcmp(a, b) == 0;
    }
    free(a);
    free(b);
    return r;
}

void m3_gsm8k_accuracy(const uint8_t *correct, int64_t n, double *acc, double *stderr_) {
    M3_ASSERT(n >= 0 && (n == 0 || correct));
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += correct[i] != 0;
    double mu = n ? (double)k / (double)n : (double)NAN;
    *acc = mu;
    if (n < 2) {
        *stderr_ = (double)NAN;
        return;
    }
    /* sum (x - mu)^2 over 0/1 outcomes = k (1-mu)^2 + (n-k) mu^2, exactly what the Python
     * loop sums up to rounding; computed per item in index order like Python. */
    double ss = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (correct[i] ? 1.0 : 0.0) - mu;
        ss += d * d;
    }
    *stderr_ = sqrt(ss / (double)(n - 1)) / sqrt((double)n);
}

/* log C(n, i) via lgamma: relative error ~1e-13 at n ~ 1e4, far below what a p-value needs */
static double log_choose(int64_t n, int64_t i) {
    return lgamma((double)n + 1.0) - lgamma((double)i + 1.0) - lgamma((double)(n - i) + 1.0);
}

double m3_binom_two_sided_half(int64_t k, int64_t n) {
    M3_ASSERT(n >= 0 && k >= 0 && k <= n);
    if (n == 0) return 1.0;
    int64_t m = k < n - k ? k : n - k;
    if (2 * m == n) return 1.0; /* the tail includes the mode: 2 * P >= 1 */
    /* P[X <= m] = sum_{i=0}^{m} C(n,i) 2^-n, as a log-sum-exp anchored at the largest term
     * (i = m, since m < n/2 the terms increase with i). */
    double ln2n = (double)n * log(2.0);
    double top = log_choose(n, m) - ln2n, s = 0;
    for (int64_t i = 0; i <= m; i++) s += exp(log_choose(n, i) - ln2n - top);
    double p = 2.0 * exp(top) * s;
    return p < 1.0 ? p : 1.0;
}

m3_mcnemar m3_mcnemar_exact(const uint8_t *a, const uint8_t *b, int64_t n) {
    m3_mcnemar r = {.n = n};
    for (int64_t i = 0; i < n; i++) {
        bool x = a[i] != 0, y = b[i] != 0;
        if (x && y) r.both++;
        else if (x) r.only_a++;
        else if (y) r.only_b++;
        else r.neither++;
    }
    r.p = m3_binom_two_sided_half(r.only_b, r.only_a + r.only_b);
    return r;
}

/* ---- data ----------------------------------------------------------------------------- */

void m3_gsm8k_set_free(m3_gsm8k_set *s) {
    if (!s) return;
    for (int64_t i = 0; i < s->n; i++) {
        free(s->items[i].question);
        free(s->items[i].answer);
    }
    free(s->items);
    s->items = NULL;
    s->n = 0;
}

/* Byte offset of the first invalid UTF-8 sequence in s[0, n) (overlong forms, surrogates and
 * code points above U+10FFFF are invalid, RFC 3629), or -1 when it is all valid. */
static int64_t utf8_bad_at(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        int k = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2
                : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
        if (k < 0 || i + (size_t)k >= n + (k ? 0 : 1)) return (int64_t)i;
        /* the second byte's range excludes overlongs, surrogates and > U+10FFFF */
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
        unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        for (int j = 1; j <= k; j++) {
            unsigned b = s[i + (size_t)j];
            if (b < (j == 1 ? lo : 0x80) || b > (j == 1 ? hi : 0xBF)) return (int64_t)i;
        }
        i += (size_t)k + 1;
    }
    return -1;
}

/* Parse one JSONL line (len bytes) and copy the string fields `keys` into val[0..n_keys).
 * Any parse failure is reported as the line not being a JSON object (the message names the
 * file and line, which is what a user needs to find it). */
static m3_status read_object(const char *line, size_t len, const char *const *keys, int n_keys,
                             char **val, const char *path, int64_t lineno) {
    m3_json *o = NULL;
    m3_status st = M3_OK;
    /* JSON text is UTF-8 (RFC 8259); other bytes would be scored and echoed into --samples */
    int64_t bad = utf8_bad_at((const unsigned char *)line, len);
    if (bad >= 0)
        return m3_errorf(M3_ERR_FORMAT, "%s:%lld: not valid UTF-8 (byte %lld of the line)", path,
                         (long long)lineno, (long long)bad);
    if (m3_json_parse(&o, line, len, path) != M3_OK || !m3_json_is_object(o)) {
        st = m3_errorf(M3_ERR_FORMAT, "%s:%lld: not a JSON object", path, (long long)lineno);
        goto done;
    }
    for (int k = 0; k < n_keys; k++) {
        const char *v = m3_json_str(m3_json_get(o, keys[k]));
        if (!v) {
            st = m3_errorf(M3_ERR_FORMAT, "%s:%lld: missing string field \"%s\"", path,
                           (long long)lineno, keys[k]);
            goto done;
        }
        val[k] = strdup(v);
        if (!val[k]) {
            st = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
    }
done:
    m3_json_free(o);
    return st;
}

void m3_gsm8k_rows_free(m3_gsm8k_rows *r) {
    if (!r) return;
    for (int64_t i = 0; i < r->n * r->n_keys; i++) free(r->val[i]);
    free(r->val);
    *r = (m3_gsm8k_rows){0};
}

m3_status m3_gsm8k_read_jsonl(m3_gsm8k_rows *out, const char *path, const char *const *keys,
                              int n_keys) {
    M3_ASSERT(n_keys >= 1);
    *out = (m3_gsm8k_rows){.n_keys = n_keys};
    FILE *f = fopen(path, "rb");
    if (!f) return m3_errorf(M3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, rows_cap = 0;
    ssize_t len;
    int64_t lineno = 0;
    m3_status st = M3_OK;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (memchr(line, 0, (size_t)len)) {
            st = m3_errorf(M3_ERR_FORMAT, "%s:%lld: NUL byte in line", path, (long long)lineno);
            goto done;
        }
        bool blank = true;
        for (ssize_t i = 0; i < len && blank; i++)
            blank = line[i] == ' ' || line[i] == '\t' || line[i] == '\n' || line[i] == '\r';
        if (blank) continue;
        if ((size_t)out->n == rows_cap) {
            rows_cap = rows_cap ? 2 * rows_cap : 256;
            char **nv = realloc(out->val, rows_cap * (size_t)n_keys * sizeof *nv);
            if (!nv) {
                st = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
                goto done;
            }
            out->val = nv;
        }
        char **v = out->val + out->n * n_keys;
        for (int k = 0; k < n_keys; k++) v[k] = NULL;
        out->n++; /* counted first so a partial row is freed with the rest */
        st = read_object(line, (size_t)len, keys, n_keys, v, path, lineno);
        if (st) goto done;
    }
    if (ferror(f)) st = m3_errorf(M3_ERR_IO, "%s: read error", path);
done:
    free(line);
    fclose(f);
    if (st) m3_gsm8k_rows_free(out);
    return st;
}

m3_status m3_gsm8k_set_read(m3_gsm8k_set *out, const char *path) {
    static const char *const keys[2] = {"question", "answer"};
    m3_gsm8k_rows rows;
    *out = (m3_gsm8k_set){0};
    M3_TRY(m3_gsm8k_read_jsonl(&rows, path, keys, 2));
    out->items = calloc(rows.n ? (size_t)rows.n : 1, sizeof *out->items);
    if (!out->items) {
        m3_gsm8k_rows_free(&rows);
        return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int64_t i = 0; i < rows.n; i++) {
        /* take ownership of the strings */
        out->items[i].question = rows.val[i * 2];
        out->items[i].answer = rows.val[i * 2 + 1];
        rows.val[i * 2] = rows.val[i * 2 + 1] = NULL;
    }
    out->n = rows.n;
    m3_gsm8k_rows_free(&rows);
    return M3_OK;
}

char *m3_gsm8k_prompt(const m3_gsm8k_item *const *shots, int n_shots, const char *question) {
    static const char q0[] = "Question: ", q1[] = "\nAnswer:";
    size_t len = strlen(q0) + strlen(question) + strlen(q1) + 1;
    for (int i = 0; i < n_shots; i++)
        len += strlen(q0) + strlen(shots[i]->question) + strlen(q1) + 1 +
               strlen(shots[i]->answer) + 2;
    char *s = malloc(len), *p = s;
    if (!s) return NULL;
    /* doc_to_text + target_delimiter " " + doc_to_target + fewshot_delimiter "\n\n" */
    for (int i = 0; i < n_shots; i++)
        p += sprintf(p, "%s%s%s %s\n\n", q0, shots[i]->question, q1, shots[i]->answer);
    sprintf(p, "%s%s%s", q0, question, q1);
    return s;
}

/* ---- CPython's random.Random ------------------------------------------------------- */

static void mt_init(m3_pyrandom *r, uint32_t s) {
    r->mt[0] = s;
    for (int i = 1; i < 624; i++)
        r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
    r->mti = 624;
}

void m3_pyrandom_seed(m3_pyrandom *r, uint64_t seed) {
    /* random.seed(int): the key is the absolute value's 32-bit words, least significant
     * first (at least one word), fed to MT19937's init_by_array. */
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    int klen = key[1] ? 2 : 1;
    mt_init(r, 19650218u);
    int i = 1, j = 0;
    for (int k = 624 > klen ? 624 : klen; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1664525u)) + key[j] +
                   (uint32_t)j;
        i++;
        j++;
        if (i >= 624) {
            r->mt[0] = r->mt[623];
            i = 1;
        }
        if (j >= klen) j = 0;
    }
    for (int k = 623; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1566083941u)) -
                   (uint32_t)i;
        i++;
        if (i >= 624) {
            r->mt[0] = r->mt[623];
            i = 1;
        }
    }
    r->mt[0] = 0x80000000u;
    r->mti = 624;
}

uint32_t m3_pyrandom_u32(m3_pyrandom *r) {
    static const uint32_t mag01[2] = {0u, 0x9908b0dfu};
    if (r->mti >= 624) {
        int k;
        for (k = 0; k < 624 - 397; k++) {
            uint32_t y = (r->mt[k] & 0x80000000u) | (r->mt[k + 1] & 0x7fffffffu);
            r->mt[k] = r->mt[k + 397] ^ (y >> 1) ^ mag01[y & 1u];
        }
        for (; k < 623; k++) {
            uint32_t y = (r->mt[k] & 0x80000000u) | (r->mt[k + 1] & 0x7fffffffu);
            r->mt[k] = r->mt[k + (397 - 624)] ^ (y >> 1) ^ mag01[y & 1u];
        }
        uint32_t y = (r->mt[623] & 0x80000000u) | (r->mt[0] & 0x7fffffffu);
        r->mt[623] = r->mt[396] ^ (y >> 1) ^ mag01[y & 1u];
        r->mti = 0;
    }
    uint32_t y = r->mt[r->mti++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint64_t m3_pyrandom_below(m3_pyrandom *r, uint64_t n) {
    M3_ASSERT(n >= 1 && n < (1ull << 32));
    int k = 0; /* n.bit_length() */
    while (k < 64 && (n >> k)) k++;
    for (;;) {
        uint64_t x = m3_pyrandom_u32(r) >> (32 - k); /* getrandbits(k), k <= 32 */
        if (x < n) return x;
    }
}

m3_status m3_pyrandom_sample(m3_pyrandom *r, int64_t n, int k, int64_t *idx) {
    M3_ASSERT(k >= 0 && n >= k && n < (1ll << 31));
    int64_t setsize = 21;
    if (k > 5) setsize += (int64_t)pow(4.0, ceil(log((double)k * 3.0) / log(4.0)));
    if (n <= setsize) {
        int64_t *pool = malloc((size_t)(n ? n : 1) * sizeof *pool);
        if (!pool) return m3_errorf(M3_ERR_NOMEM, "random.sample: out of memory");
        for (int64_t i = 0; i < n; i++) pool[i] = i;
        for (int i = 0; i < k; i++) {
            int64_t j = (int64_t)m3_pyrandom_below(r, (uint64_t)(n - i));
            idx[i] = pool[j];
            pool[j] = pool[n - i - 1];
        }
        free(pool);
    } else {
        for (int i = 0; i < k; i++) {
            int64_t j;
            bool dup;
            do {
                j = (int64_t)m3_pyrandom_below(r, (uint64_t)n);
                dup = false;
                for (int t = 0; t < i; t++) dup |= idx[t] == j;
            } while (dup);
            idx[i] = j;
        }
    }
    return M3_OK;
}

m3_status m3_gsm8k_draw_shots(m3_pyrandom *r, const m3_gsm8k_set *pool, int k,
                              const m3_gsm8k_item *doc, int64_t *idx) {
    M3_ASSERT(k >= 0 && k < 64);
    if (k == 0) return M3_OK; /* lm-eval returns [] without touching the generator */
    int draw = k + (doc != NULL);
    if (pool->n < draw)
        return m3_errorf(M3_ERR_ARG, "few-shot pool has %lld items, %d needed",
                         (long long)pool->n, draw);
    int64_t got[65];
    M3_TRY(m3_pyrandom_sample(r, pool->n, draw, got));
    int n = 0;
    for (int i = 0; i < draw && n < k; i++) {
        const m3_gsm8k_item *x = &pool->items[got[i]];
        /* rm_eval_doc compares the documents as dicts: equal question and answer */
        if (doc && !strcmp(x->question, doc->question) && !strcmp(x->answer, doc->answer))
            continue;
        idx[n++] = got[i];
    }
    if (n < k) /* the eval doc appeared twice in the pool: lm-eval's assert fails here too */
        return m3_errorf(M3_ERR_ARG, "few-shot pool: too many copies of one question");
    return M3_OK;
}
