/* compare/eval_gen.h: what `m3 eval gsm8k` needs between the tokenizer and the model: the
 * table that turns a variant name ("fp32", "hf", "mxfp4+kv-fp8", ...) into a numerics
 * profile plus variant keys, and greedy generation with lm-eval's stopping rules.
 * docs/eval.md; spec m3-numerics.md §8.
 *
 * Variant names: an optional base profile, then '+'-joined modifiers:
 *   base       fp32 | hf | atom        (ref/profile.h); absent -> atom, because the
 *                                      published MX / fp8 numbers are ATOM runs
 *   modifiers  mxfp8       experts=mxfp8        mxfp4      experts=mxfp4
 *              kv-fp8      kv_cache=fp8         index-fp8  index_cache=fp8
 *              topk-reuseN topk_reuse=N (N >= 1)
 * e.g. "fp32", "hf", "atom", "mxfp4" (= atom+mxfp4), "hf+mxfp8+kv-fp8".
 * Keys go through m3_variant_set (ref/variant.h), so a key that this build does not know
 * fails there with M3_ERR_UNSUPPORTED. Whether a backend can RUN the variant is its own
 * decision, made when the variant is applied to the model (m3_run_model_open /
 * m3_run_model_set_variant: the GPU refuses what its forward does not implement yet).
 *
 * Generation (lm-eval HFLM generate_until with greedy decoding) through either backend
 * (compare/run_opts.h's m3_run_model: ref's m3_model or the GPU's m3_gpu_model): reserve
 * the caches for prompt + max_gen_toks, prefill the prompt ids from an empty cache, then one
 * decode step per new token. Before a token is kept it is
 * checked against the stop ids (EOS and the stop strings that are single special tokens):
 * such a token ends generation and is not part of the output. After each kept token the
 * generated ids are decoded (skip_special_tokens, as lm-eval's tok_decode) and the text is
 * searched for every stop string; at a hit generation ends and the response is cut at the
 * earliest occurrence of any stop string (lm-eval: s.split(term)[0] for each term). At
 * max_gen_toks kept tokens generation ends. The last token is never fed to the model
 * (nothing reads its logits).
 * Timing: wall clock around each forward call, which returns only when the logits are on
 * the host (the GPU forward synchronises its stream), so prefill_s / decode_s are
 * end-to-end pass times on either backend: prefill tokens/s = n_prompt / prefill_s, decode
 * tokens/s = n_decode / decode_s (batch 1, one token per pass). */
#ifndef M3_EVAL_GEN_H
#define M3_EVAL_GEN_H

#include <stdint.h>

#include "compare/run_opts.h"
#include "compare/tokenizer.h"
#include "ref/base.h"
#include "ref/profile.h"
#include "ref/variant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char name[64];       /* as given */
    m3_profile profile;  /* the base profile */
    m3_variant variant;  /* the modifiers applied on m3_variant_default */
    char keys[256];      /* "experts=mxfp4 kv_cache=fp8" (for messages and records) */
} m3_eval_variant;

/* Resolve a variant name (grammar above). Unknown base or modifier, bad N, a modifier given
 * twice: M3_ERR_ARG; a key ref/variant.h does not know: M3_ERR_UNSUPPORTED; a combination
 * m3_variant_check refuses: its status. Errors are one line naming the variant. Whether a
 * backend runs it is checked when it is applied (m3_eval_variant_apply). */
m3_status m3_eval_variant_resolve(m3_eval_variant *out, const char *name);

/* Open the model of --backend for variant v (its profile and keys; backend "ref" or
 * "gpu"): m3_run_model_open with a m3_run_opts built here. A backend that cannot run the
 * variant fails with its one line (M3_ERR_UNSUPPORTED on the GPU, M3_ERR_ARG for a top-k
 * schedule ref rejects), prefixed by "variant 'NAME': "; other errors (checkpoint, device)
 * come unprefixed. *rm is NULL on error. */
m3_status m3_eval_model_open(m3_run_model **rm, const char *model_dir, const char *backend,
                             const m3_eval_variant *v);

typedef enum {
    M3_GEN_STOP_MAX = 0,    /* max_gen_toks reached */
    M3_GEN_STOP_EOS = 1,    /* a stop id came */
    M3_GEN_STOP_STRING = 2  /* a stop string appeared in the decoded text */
} m3_gen_stop;

const char *m3_gen_stop_name(m3_gen_stop s); /* "max_gen_toks" | "eos" | "stop_string" */

typedef struct {
    int max_gen_toks;               /* >= 1 */
    const int32_t *stop_ids;        /* ids that end generation (not kept) */
    int n_stop_ids;
    const char *const *stop_strings; /* non-empty strings */
    int n_stop_strings;
} m3_gen_opts;

typedef struct {
    int32_t *tokens;   /* malloc'd: the kept generated ids (free with m3_gen_result_free) */
    int n_tokens;
    char *text;        /* malloc'd, NUL-terminated: decoded, cut at the first stop string */
    m3_gen_stop stop;
    double prefill_s;  /* wall seconds of the prefill pass */
    double decode_s;   /* wall seconds of the decode passes */
    int n_decode;      /* decode passes run (n_tokens - 1 at most) */
} m3_gen_result;

/* Greedy generation for one prompt (m3_run_model_reset, then m3_run_model_reserve of
 * n_prompt + max_gen_toks first). n_prompt >= 1. On error the result is freed and zeroed;
 * the model's caches must be reset before reuse. */
m3_status m3_generate_greedy(m3_run_model *m, const m3_tokenizer *t, const int32_t *prompt,
                             int n_prompt, const m3_gen_opts *o, m3_gen_result *r);
void m3_gen_result_free(m3_gen_result *r);

/* First index where a[] and b[] differ; the shorter length when one is a prefix of the
 * other; -1 when identical. */
int m3_gen_first_divergence(const int32_t *a, int na, const int32_t *b, int nb);

#ifdef __cplusplus
}
#endif
#endif
