/* compare/gsm8k.h: GSM8K evaluation as lm-evaluation-harness's `gsm8k` task (version 3) does
 * it: prompts, answer filters, exact_match, accuracy with its standard error, and the paired
 * exact McNemar test between two variants. Spec: shared spec/m3-numerics.md §8; docs/eval.md.
 *
 * Sources checked (EleutherAI/lm-evaluation-harness 4e7e0d47, 2026-08):
 *   lm_eval/tasks/gsm8k/gsm8k.yaml   prompt, filters, exact_match settings
 *   lm_eval/filters/extraction.py    RegexFilter: re.findall, match[group_select], a tuple
 *                                    gives its first non-empty group, .strip(), "[invalid]"
 *   lm_eval/api/metrics.py           exact_match_hf_evaluate, mean_stderr
 *   lm_eval/api/samplers.py, task.py the few-shot sampler and the plain-text prompt layout
 *
 * Filters (applied to the model's response text, after its stop sequences):
 *   strict-match      regex `#### (\-?[0-9\.\,]+)`, first match, group 1
 *   flexible-extract  regex `(-?[$0-9.,]{2,})|(-?[0-9]+)`, LAST match, first non-empty group
 *   no match          the string "[invalid]"
 * exact_match(pred, ref) with regexes_to_ignore [",", "\$", "(?s).*#### ", "\.$"] applied in
 *   that order with re.sub to both sides, then ignore_case (lower-casing), then string ==.
 *   "(?s).*#### " is greedy: it removes everything up to and including the LAST "#### ".
 *   "\.$" removes a final '.', or a '.' just before a final '\n' (Python's `$`).
 *   Lower-casing here is ASCII only; Python lower-cases all of Unicode. The two differ only
 *   for non-ASCII cased letters, which a GSM8K number never contains.
 * Accuracy = mean of 0/1 outcomes; stderr = sample std (n-1) / sqrt(n), lm-eval's
 *   mean_stderr (NaN for n < 2, where Python raises).
 *
 * Text is UTF-8 bytes; all matching is on ASCII bytes, so multi-byte characters never match
 * a pattern character (the same as Python's str regexes for these ASCII-only patterns). */
#ifndef M3_GSM8K_H
#define M3_GSM8K_H

#include "ref/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define M3_GSM8K_INVALID "[invalid]"

typedef enum { M3_GSM8K_STRICT = 0, M3_GSM8K_FLEXIBLE = 1, M3_GSM8K_N_FILTER = 2 } m3_gsm8k_filter;

/* "strict-match" / "flexible-extract": lm-eval's filter names (also the --json keys). */
const char *m3_gsm8k_filter_name(m3_gsm8k_filter f);

/* Bytes `out` needs for m3_gsm8k_extract on a response of length len (the match is a
 * substring of the response, or "[invalid]"). */
size_t m3_gsm8k_extract_bytes(size_t len);

/* Apply filter f to response resp (NUL-terminated). Writes the extracted answer (or
 * "[invalid]") to out, which holds at least m3_gsm8k_extract_bytes(strlen(resp)) bytes.
 * Returns true when the regex matched (false: out is "[invalid]"). */
bool m3_gsm8k_extract(m3_gsm8k_filter f, const char *resp, char *out);

/* exact_match's normalisation of one side (see the top comment). out holds at least
 * strlen(s) + 1 bytes; out may not alias s. */
void m3_gsm8k_normalize(const char *s, char *out);

/* exact_match(pred, ref): both normalised, then compared. Returns -1 only when out of
 * memory, else 0 or 1. */
int m3_gsm8k_exact_match(const char *pred, const char *ref);

/* Mean of n 0/1 outcomes and lm-eval's stderr (sample std / sqrt(n); NaN when n < 2). */
void m3_gsm8k_accuracy(const uint8_t *correct, int64_t n, double *acc, double *stderr_);

/* Exact McNemar test on paired outcomes a[i], b[i] in {0,1}: two-sided binomial test of
 * b01 successes in b01 + b10 trials at p = 1/2, p = min(1, 2 * P[X <= min(b01, b10)]).
 * p = 1 when there are no discordant pairs. */
typedef struct {
    int64_t n;       /* pairs */
    int64_t both;    /* a = 1, b = 1 */
    int64_t only_a;  /* a = 1, b = 0 (b10) */
    int64_t only_b;  /* a = 0, b = 1 (b01) */
    int64_t neither; /* a = 0, b = 0 */
    double p;        /* exact two-sided p-value */
} m3_mcnemar;
m3_mcnemar m3_mcnemar_exact(const uint8_t *a, const uint8_t *b, int64_t n);

/* Two-sided exact binomial p-value at p = 1/2 for k successes in n trials:
 * min(1, 2 * sum_{i <= min(k, n-k)} C(n, i) / 2^n), summed in log space (no underflow for
 * any n). Equals scipy.stats.binomtest(k, n, 0.5).pvalue. */
double m3_binom_two_sided_half(int64_t k, int64_t n);

/* ---- prompts ------------------------------------------------------------------------ */

typedef struct {
    char *question; /* owned */
    char *answer;   /* owned: the worked answer ending "#### N" */
} m3_gsm8k_item;

typedef struct {
    m3_gsm8k_item *items; /* owned */
    int64_t n;
} m3_gsm8k_set;

/* Read a JSONL file: one JSON object per line (blank lines skipped) with the string fields
 * keys[0..n_keys); row i's field k is out->val[i * n_keys + k] (owned). Bad JSON, a
 * non-object or a missing/non-string field -> M3_ERR_FORMAT naming "file:line". Free with
 * m3_gsm8k_rows_free. */
typedef struct {
    char **val;
    int64_t n;
    int n_keys;
} m3_gsm8k_rows;
m3_status m3_gsm8k_read_jsonl(m3_gsm8k_rows *out, const char *path, const char *const *keys,
                              int n_keys);
void m3_gsm8k_rows_free(m3_gsm8k_rows *r);

/* Read a GSM8K JSONL file: one object per line with string fields `question` and `answer`;
 * blank lines are skipped. Bad JSON or a missing field -> M3_ERR_FORMAT naming file:line.
 * Free with m3_gsm8k_set_free. */
m3_status m3_gsm8k_set_read(m3_gsm8k_set *out, const char *path);
void m3_gsm8k_set_free(m3_gsm8k_set *s);

/* lm-eval's plain-text (no chat template) few-shot prompt:
 *   for each shot: "Question: {q}\nAnswer:" + " " + {answer} + "\n\n"
 *   then:          "Question: {q}\nAnswer:"
 * Returns a malloc'd string (free()), NULL when out of memory. */
char *m3_gsm8k_prompt(const m3_gsm8k_item *const *shots, int n_shots, const char *question);

/* The few-shot sampler: lm-eval draws the shots of each test document, in document order,
 * with random.Random(1234).sample(train_docs, num_fewshot) from ONE generator shared by all
 * documents (fewshot_random_seed default 1234). This reproduces CPython's Mersenne Twister
 * seeding (init_by_array of the seed's 32-bit words), getrandbits, _randbelow and
 * random.sample (set-based branch for n > setsize, pool-based otherwise), so the indices
 * equal Python's. */
typedef struct {
    uint32_t mt[624];
    int mti;
} m3_pyrandom;
void m3_pyrandom_seed(m3_pyrandom *r, uint64_t seed);
uint32_t m3_pyrandom_u32(m3_pyrandom *r);       /* genrand_uint32 */
uint64_t m3_pyrandom_below(m3_pyrandom *r, uint64_t n); /* _randbelow(n), n >= 1, n < 2^32 */
/* random.sample(range(n), k) into idx[k]; k <= n, n < 2^31. Returns M3_ERR_NOMEM only. */
m3_status m3_pyrandom_sample(m3_pyrandom *r, int64_t n, int k, int64_t *idx);

#define M3_GSM8K_FEWSHOT_SEED 1234

/* The shots of the next document, as lm-eval's ContextSampler.sample draws them: k indices
 * into pool from r.sample(range(pool->n), k). When the pool is the evaluated split itself,
 * pass the document as doc: then k+1 are drawn and those equal to doc (question and answer)
 * dropped, keeping the first k. doc = NULL otherwise (gsm8k: shots from train). k < 64.
 * A pool smaller than needed -> M3_ERR_ARG. */
m3_status m3_gsm8k_draw_shots(m3_pyrandom *r, const m3_gsm8k_set *pool, int k,
                              const m3_gsm8k_item *doc, int64_t *idx);

#ifdef __cplusplus
}
#endif
#endif
