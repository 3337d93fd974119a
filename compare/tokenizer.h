/* compare/tokenizer.h: byte-level BPE tokenizer read from a transformers `tokenizer.json`,
 * encoding and decoding exactly as the Hugging Face `tokenizers` library (Rust, 0.23) does.
 * The only file that includes <pcre2.h> (PCRE2 with UTF + UCP stands in for Oniguruma, which
 * `tokenizers` uses for its split regexes). docs/eval.md describes the pipeline.
 *
 * encode(text) = tokenizers' Tokenizer.encode(text, add_special_tokens=False).ids:
 *   1. added tokens: leftmost-longest matches of the non-`normalized` added tokens on the raw
 *      text, then of the `normalized` ones on the remaining pieces, honouring single_word
 *      (no word character, Unicode \w, on either side), lstrip/rstrip (absorb the adjacent
 *      Unicode whitespace); matched pieces become their id and skip steps 2-3;
 *   2. pre-tokenizer: Split (String or Regex pattern; behaviours Removed, Isolated,
 *      MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space,
 *      use_regex with GPT-2's pattern, then bytes -> the GPT-2 unicode alphabet), Digits,
 *      and Sequence of these; regex find_iter with the onig crate's empty-match rule;
 *   3. BPE per piece: ignore_merges (a piece that is a vocab entry is one token), else one
 *      symbol per character (unknown: byte_fallback <0xXX>, else unk_token, else dropped)
 *      and merges applied lowest rank first, leftmost first (tokenizers' priority queue).
 * decode(ids) = Tokenizer.decode(ids, skip_special_tokens): added-token or vocab string per
 *   id (unknown ids dropped), ByteLevel decoder (a token whose characters all belong to the
 *   byte alphabet becomes those bytes, any other token its own UTF-8), then
 *   String::from_utf8_lossy (each maximal invalid subsequence -> U+FFFD).
 * Not supported (open fails with M3_ERR_UNSUPPORTED naming the part): a normalizer, models
 * other than BPE, BPE dropout / continuing_subword_prefix / end_of_word_suffix, decoders
 * other than ByteLevel, pre-tokenizers other than the four above. The post_processor is not
 * applied (add_special_tokens=False); callers add BOS-like tokens themselves.
 * Texts must be valid UTF-8 (Rust strings always are): invalid input -> M3_ERR_ARG.
 *
 * Thread safety: an opened tokenizer is read-only; encode/decode may run concurrently. */
#ifndef M3_TOKENIZER_H
#define M3_TOKENIZER_H

#include "ref/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct m3_tokenizer m3_tokenizer;

/* Read tokenizer.json at path. Malformed -> M3_ERR_FORMAT, unsupported parts ->
 * M3_ERR_UNSUPPORTED, one line naming the file and the problem. Close with
 * m3_tokenizer_close (NULL is a no-op). */
m3_status m3_tokenizer_open(m3_tokenizer **out, const char *path);
void m3_tokenizer_close(m3_tokenizer *t);

/* One more than the largest id of the vocab and the added tokens. */
int32_t m3_tokenizer_n_vocab(const m3_tokenizer *t);

/* Id of a token by its string (added tokens first, then the vocab, as tokenizers'
 * token_to_id); -1 when absent. Used for EOS / stop tokens such as "<|im_end|>". */
int32_t m3_tokenizer_token_id(const m3_tokenizer *t, const char *token);

/* Encode len bytes of UTF-8 text. *ids is malloc'd (free()), *n_ids its length; on error
 * *ids is NULL. */
m3_status m3_tokenizer_encode(const m3_tokenizer *t, const char *text, size_t len,
                              int32_t **ids, int64_t *n_ids);

/* Decode n ids to UTF-8 text. *out is malloc'd and NUL-terminated (free()); *out_len its
 * length in bytes (the text never contains invalid UTF-8; it may contain NUL only if a token
 * decodes to a 0 byte). */
m3_status m3_tokenizer_decode(const m3_tokenizer *t, const int32_t *ids, int64_t n,
                              bool skip_special, char **out, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
