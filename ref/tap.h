/* ref/tap.h: how the reference reports intermediate stages (dump taps) and receives
 * teacher-forced values, without knowing anything about HDF5 (ref/ never includes compare/).
 *
 * Stage keys are the m3-dump/1 paths of shared spec/dump-schema.md, relative to the file
 * root, already carrying any multi-pass prefix: "embed", "layers/01/q", "passes/0002/logits".
 * The reference holds every activation in float32; `produced_dtype` says what the profile
 * held ("float32", or "bfloat16" when every value was rounded to bf16 at that point).
 * Index stages (index_topk, expert_ids, tokens, positions) are M3_DT_I32 tensors. */
#ifndef M3_TAP_H
#define M3_TAP_H

#include "ref/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Called once per stage, in execution order. The tensor and its data are borrowed for the
 * duration of the call only. A non-zero return aborts the forward with that status. */
typedef m3_status (*m3_tap_fn)(void *ctx, const char *key, const m3_tensor *t,
                               const char *produced_dtype);

/* Teacher forcing: fetch the reference's value of stage `key`. On success out->data is a
 * malloc'ed buffer the caller frees with free(); float stages come back as M3_DT_F32 and
 * index stages as M3_DT_I32. Returns M3_ERR_MISSING (with an error line) when the stage is
 * absent, any other status on a read failure. */
typedef m3_status (*m3_fetch_fn)(void *ctx, const char *key, m3_tensor *out);

/* What a forward reports to and takes from the outside. Every field may be NULL/false. */
typedef struct m3_hooks {
    m3_tap_fn tap; /* stage sink; NULL: no stage is materialised for reporting */
    void *tap_ctx;
    m3_fetch_fn fetch; /* teacher forcing source; NULL: free-running */
    void *fetch_ctx;
    bool force_input;     /* each layer starts from fetch("layers/NN/input") */
    bool force_selection; /* index_topk and expert_ids come from fetch (teacher forcing of
                             the discrete decisions); the continuous math is still ours */
} m3_hooks;

/* Key helpers: "<prefix>layers/<NN>/<stage>" with NN zero-padded to 2 digits, or 3 when the
 * model has >= 100 layers. `buf` holds at least M3_KEY_MAX bytes. */
#define M3_KEY_MAX 128
void m3_layer_key(char *buf, const char *prefix, int n_layer, int layer, const char *stage);

#ifdef __cplusplus
}
#endif
#endif
