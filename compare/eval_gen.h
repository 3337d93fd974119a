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
 * Keys go through m3_variant_set (ref/variant.h), so a variant that this build cannot run
 * yet fails there with M3_ERR_UNSUPPORTED before any generation starts.
 *
 * Generation (lm-eval HFLM generate_until with greedy decoding): prefill the prompt ids
 * from an empty cache, then one decode step per new token. Before a token is kept it is
 * checked against the stop ids (EOS and the stop strings that are single special tokens):
 * such a token ends generation and is not part of the output. After each kept token the
 * generated ids are decoded (skip_special_tokens, as lm-eval's tok_decode) and the text is
 * searched for every stop string; at a hit generation ends and the response is cut at the
 * earliest occurrence of any stop string (lm-eval: s.split(term)[0] for each term). At
 * max_gen_toks kept tokens generation ends. The last token is never fed to the model
 * (nothing reads its logits). */
#ifndef M3_EVAL_GEN_H
#define M3_EVAL_GEN_H

#include <stdint.h>

#include "compare/tokenizer.h"
#include "ref/base.h"
#include "ref/model.h"
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
 * twice: M3_ERR_ARG; a key this build cannot run: M3_ERR_UNSUPPORTED (m3_variant_set's).
 * Then checks that the reference model can apply the result: ref/model.h takes a profile
 * only, so any non-default variant is M3_ERR_UNSUPPORTED until the model takes variants.
 * Errors are one line naming the variant. */
m3_status m3_eval_variant_resolve(m3_eval_variant *out, const char *name);

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

/* Greedy generation for one prompt (m3_model_reset first). n_prompt >= 1. On error the
 * result is freed and zeroed; the model's caches must be reset before reuse. */
m3_status m3_generate_greedy(m3_model *m, const m3_tokenizer *t, const int32_t *prompt,
                             int n_prompt, const m3_gen_opts *o, m3_gen_result *r);
void m3_gen_result_free(m3_gen_result *r);

/* First index where a[] and b[] differ; the shorter length when one is a prefix of the
 * other; -1 when identical. */
int m3_gen_first_divergence(const int32_t *a, int na, const int32_t *b, int nb);

#ifdef __cplusplus
}
#endif
#endif
