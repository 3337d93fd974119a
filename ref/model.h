/* ref/model.h: the whole MiniMax-M3 text forward on the CPU reference (spec §3): embedding,
 * the decoder layers streamed from the checkpoint one at a time, final norm, lm_head and the
 * greedy next token; KV and index caches so that a prefill can be followed by decode steps.
 *
 * Math: x_0 = Embed(ids); x_{L+1} = Layer_L(x_L) (ref/layer.h); y = Norm_final(x_n);
 *   logits = y W_lm^T; next = argmax over the last row (ties: the lowest id).
 * Streaming: a layer's weights are viewed (m3_layer_weights_load) just before it runs and
 *   their pages released (m3_weights_drop) right after, so peak memory is about one layer's
 *   weights plus activations and caches, whatever the checkpoint size. Same for the
 *   embedding and lm_head. A checkpoint of at most 512 MiB (or any, with M3_REF_RESIDENT=1;
 *   never with M3_REF_RESIDENT=0) keeps its loaded layers across passes instead: the same
 *   views, so the same numbers, without re-reading the file per decode step.
 * Caches: contiguous per layer, held as attention reads them; with a paged variant
 *   (m3_model_set_variant) also the paged SHUFFLE layouts of spec §4 with one block table
 *   (ref/kvcache.h, docs/caches.md). Top-k reuse (config use_index_cache or the variant's
 *   topk_* keys, spec §3.9): reusing sparse layers take the top-k of the most recent
 *   computing sparse layer of the same pass. A pass at positions n_past..n_past+T-1 extends them; a decode
 *   step is a pass of one token. Because every row of every component is computed the same
 *   way whatever T is, a decode step's logits equal those of a full forward over the longer
 *   sequence up to GEMM blocking effects (fp32: NMSE <= 1e-10 in the tests).
 * Teacher forcing (m3 replay): with hooks->force_input each layer starts from
 *   fetch("<prefix>layers/NN/input") instead of our previous layer's output, and the final
 *   norm from fetch("<prefix>layers/<last>/output"); with hooks->force_selection the discrete
 *   choices come from the reference too (ref/layer.h).
 * Numerics: all rounding per the profile inside the components; logits are bf16 under
 *   act_bf16 (hf), fp32 otherwise. Threads inside the components only: bit-identical results
 *   for any thread count. docs/numerics.md §3, docs/cli.md. */
#ifndef M3_MODEL_H
#define M3_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"
#include "ref/config.h"
#include "ref/layer.h"
#include "ref/profile.h"
#include "ref/tap.h"
#include "ref/variant.h"
#include "ref/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct m3_model m3_model;

/* Open a checkpoint directory: config.json (+ the --override JSON object, may be NULL) and
 * the safetensors headers; checks that every tensor the config implies is present with its
 * shape (m3_weights_check) before anything runs. The profile is copied. Close with
 * m3_model_close. */
m3_status m3_model_open(m3_model **m, const char *model_dir, const char *override_json,
                        const m3_profile *p);
void m3_model_close(m3_model *m); /* NULL ok */

/* Run the model under a numerics variant (ref/variant.h; default: m3_variant_default). The
 * variant is copied and m3_variant_check'ed. The quantized-expert / ptpc parts act through
 * m3_layer_weights_load_v from the next forward pass (weights are loaded per pass;
 * docs/quantization.md). The cache keys take effect here (paged layout, fp8 KV / index
 * caches, top-k reuse flags, which override the config's use_index_cache schedule) and the
 * caches are emptied: call it before the first forward (docs/caches.md). Errors:
 * m3_variant_check, or a schedule whose first sparse layer would reuse (M3_ERR_ARG). */
m3_status m3_model_set_variant(m3_model *m, const m3_variant *v);
const m3_variant *m3_model_variant(const m3_model *m);

const m3_config *m3_model_config(const m3_model *m);
const m3_profile *m3_model_profile(const m3_model *m);
/* Tokens held by the caches (the next absolute position). */
int m3_model_n_past(const m3_model *m);
/* Empty the caches (the next pass starts at position 0). */
void m3_model_reset(m3_model *m);

/* One forward pass over n_tok >= 1 tokens at positions n_past..n_past+n_tok-1 (pos may be
 * NULL; when given it must be exactly those positions: the contiguous cache has no gaps).
 * Stages go to hooks->tap as "<prefix><stage>" (prefix "" or "passes/PPPP/"): tokens,
 * positions, embed, every layer's stages, final_norm, logits [T, V]. logits_last [V]
 * (may be NULL) receives the last row; *next (may be NULL) the greedy next token.
 * Token ids outside [0, vocab): M3_ERR_ARG. On error the caches are left as they were before
 * the call only for argument errors; after a failure inside the layers, m3_model_reset. */
m3_status m3_model_forward(m3_model *m, const int32_t *tokens, const int32_t *pos, int n_tok,
                           const m3_hooks *hooks, const char *prefix, float *logits_last,
                           int32_t *next);

/* Greedy argmax of a logits row (first maximum: the lowest id wins ties; NaN never wins). */
int32_t m3_argmax(const float *x, int n);

#ifdef __cplusplus
}
#endif
#endif
