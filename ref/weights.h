/* ref/weights.h: safetensors checkpoints (single file or sharded), mmapped lazily, with
 * borrowed views by checkpoint name or by role.
 *
 * Opening reads and validates every header eagerly and never touches tensor data: `m3 info`
 * on the 59-shard 854 GB checkpoint reads ~10 MB of headers. A shard file is mmapped
 * (PROT_READ, MAP_PRIVATE|MAP_NORESERVE) on the first access to one of its tensors; views
 * point into that mapping and stay valid until m3_weights_close. m3_weights_drop(prefix)
 * releases the resident pages of the tensors under a name prefix (madvise DONTNEED), so a
 * forward pass can walk the model one layer at a time without the whole model resident.
 *
 * Header validation (each failure: M3_ERR_FORMAT, one line "<file>: <problem>"): the 8-byte
 * length within the file (and <= 100 MiB), a JSON object, known dtypes (safetensors names:
 * BOOL U8 I8 U16 I16 U32 I32 U64 I64 F16 BF16 F32 F64 F8_E4M3 F8_E5M2 F8_E8M0 F4), rank
 * <= 8, non-negative dims with an overflow-checked product, data_offsets [begin, end] inside
 * the data region, end - begin == numel * element size (F4: numel / 2, numel even), no two
 * tensors overlapping, no duplicate names; `__metadata__` is allowed (an object).
 * Sharded checkpoints: model.safetensors.index.json `weight_map` names the shards (plain file
 * names only); every listed tensor must be in its shard. metadata.total_size is reported, not
 * trusted (the real index's is wrong, spec §2.1).
 *
 * Names. Lookups take the canonical ORIGINAL name (spec §2.1, e.g.
 * "language_model.model.layers.3.self_attn.q_proj.weight"). Stored names are mapped to that
 * form on open, so the aliases of §2.2 resolve:
 *   layers.L.block_sparse_moe.{gate,up,down}_proj.*   -> layers.L.mlp.{gate,up,down}_proj.*
 *   encoder.layers.L.block_sparse_moe.fc{1,2}.*       -> encoder.layers.L.mlp.fc{1,2}.*
 *   experts.E.{gate_proj,down_proj,up_proj}.*         -> experts.E.{w1,w2,w3}.*
 *   model.language_model.* / model.layers.* (text-only) -> language_model.model.*
 *   lm_head.* (no prefix)                             -> language_model.lm_head.*
 *   self_attn.indexer.{q,k}_proj / {q,k}_norm         -> self_attn.index_{q,k}_proj / _norm
 *   *.weight_scale_inv (MXFP8)                        -> *.weight_scale
 * (transformers 5.17 save_pretrained writes the original names with the two
 * block_sparse_moe quirks; the tiny fixture shows exactly that.) Two stored tensors that map
 * to the same canonical name are an error. Names under `mtp.` are ignored by the model.
 * The role API (m3_weight_name / m3_weights_linear) builds the names, so model code never
 * formats strings itself.
 *
 * Quantized linears (spec §5.4, §5.5, §5.10): MXFP4 = weight U8 [out, in/2] (element 2i in
 * the low nibble) + weight_scale U8/F8_E8M0 [out, in/32]; MXFP8 = weight F8_E4M3 [out, in] +
 * weight_scale(_inv) U8/F8_E8M0 [out, in/32]. The form is read from the stored dtype. */
#ifndef M3_WEIGHTS_H
#define M3_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"
#include "ref/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct m3_weights m3_weights;

typedef struct m3_tensor_info {
    const char *name;  /* as stored in the file (borrowed; lives with the m3_weights) */
    const char *canon; /* canonical original name (borrowed) */
    m3_dtype dtype;
    int rank;
    int64_t shape[M3_MAX_RANK];
    int64_t numel;  /* stored elements */
    int64_t params; /* logical parameters: numel, x2 for MXFP4-packed U8, 0 for MX scales */
    int64_t nbytes;
    int file;       /* shard index (m3_weights_file_path) */
    int64_t offset; /* absolute byte offset of the data in the shard file */
} m3_tensor_info;

/* Open model_dir (containing model.safetensors or model.safetensors.index.json), or a
 * .safetensors file, or an index .json file. Headers only. Close with m3_weights_close. */
m3_status m3_weights_open(m3_weights **w, const char *model_dir);
void m3_weights_close(m3_weights *w); /* NULL ok; unmaps everything */

int m3_weights_n_files(const m3_weights *w);
const char *m3_weights_file_path(const m3_weights *w, int i);
int64_t m3_weights_n_tensors(const m3_weights *w);
/* Tensors in canonical-name order, i in [0, n_tensors). */
const m3_tensor_info *m3_weights_tensor_at(const m3_weights *w, int64_t i);
int64_t m3_weights_bytes(const m3_weights *w);            /* sum of tensor byte sizes */
int64_t m3_weights_index_total_size(const m3_weights *w); /* metadata.total_size, -1 if none */
/* Index path when sharded, else NULL. */
const char *m3_weights_index_path(const m3_weights *w);
/* Non-fatal findings of open (e.g. tensors a shard holds but weight_map does not list). */
int m3_weights_n_warnings(const m3_weights *w);
const char *m3_weights_warning(const m3_weights *w, int i);

/* Header entry of a tensor by canonical or alias name; NULL when absent. */
const m3_tensor_info *m3_weights_find(const m3_weights *w, const char *name);
/* Borrowed view of a tensor (maps its shard on first use). t->data points into the mapping,
 * valid until m3_weights_close. Missing name: M3_ERR_MISSING naming the tensor. */
m3_status m3_weights_get(m3_weights *w, const char *name, m3_tensor *t);
/* Release resident pages of every tensor whose canonical name starts with name_prefix (e.g.
 * "language_model.model.layers.3."). Views stay valid: a later access pages back in. */
m3_status m3_weights_drop(m3_weights *w, const char *name_prefix);

/* ---- roles ----------------------------------------------------------------------------- */
typedef enum {
    /* global */
    M3_W_EMBED, M3_W_FINAL_NORM, M3_W_LM_HEAD,
    /* per text layer (layer = L) */
    M3_W_IN_NORM, M3_W_POST_NORM,
    M3_W_Q_PROJ, M3_W_K_PROJ, M3_W_V_PROJ, M3_W_O_PROJ, M3_W_Q_NORM, M3_W_K_NORM,
    M3_W_INDEX_Q_PROJ, M3_W_INDEX_K_PROJ, M3_W_INDEX_Q_NORM, M3_W_INDEX_K_NORM, /* sparse */
    M3_W_MLP_GATE, M3_W_MLP_UP, M3_W_MLP_DOWN,                                 /* dense */
    M3_W_ROUTER, M3_W_ROUTER_BIAS,                                             /* MoE */
    M3_W_SHARED_GATE, M3_W_SHARED_UP, M3_W_SHARED_DOWN,                        /* MoE */
    M3_W_EXPERT_GATE, M3_W_EXPERT_UP, M3_W_EXPERT_DOWN, /* MoE, per expert: w1, w3, w2 */
    /* vision tower (global) */
    M3_W_VIS_PATCH_EMBED, M3_W_VIS_PRE_NORM_W, M3_W_VIS_PRE_NORM_B,
    /* per vision layer (layer = vision layer) */
    M3_W_VIS_LN1_W, M3_W_VIS_LN1_B, M3_W_VIS_LN2_W, M3_W_VIS_LN2_B,
    M3_W_VIS_Q_W, M3_W_VIS_Q_B, M3_W_VIS_K_W, M3_W_VIS_K_B, M3_W_VIS_V_W, M3_W_VIS_V_B,
    M3_W_VIS_OUT_W, M3_W_VIS_OUT_B, M3_W_VIS_FC1_W, M3_W_VIS_FC1_B, M3_W_VIS_FC2_W,
    M3_W_VIS_FC2_B,
    /* projector (global): multi_modal_projector.linear_{1,2}, patch_merge_mlp.linear_{1,2} */
    M3_W_PROJ1_W, M3_W_PROJ1_B, M3_W_PROJ2_W, M3_W_PROJ2_B,
    M3_W_MERGE1_W, M3_W_MERGE1_B, M3_W_MERGE2_W, M3_W_MERGE2_B,
    M3_W_ROLE_COUNT
} m3_wrole;

/* Canonical checkpoint name of a role into buf (e.g. M3_W_EXPERT_GATE, 3, 7 ->
 * "language_model.model.layers.3.block_sparse_moe.experts.7.w1.weight"). layer/expert are
 * ignored where the role has none. Returns the length (as snprintf), asserts it fits. */
int m3_weight_name(char *buf, size_t cap, m3_wrole role, int layer, int expert);
/* Shape the config implies for a role at a layer (logical [out, in] for linears). Returns
 * false when the role does not exist there (index weights on a full-attention layer, experts
 * on a dense layer, lm_head with tied embeddings, vision without a vision config, ...). */
bool m3_weight_shape(const m3_config *cfg, m3_wrole role, int layer, int64_t *shape, int *rank);
/* True for 2-D weight matrices that may be stored quantized (every linear; not the embedding,
 * norms, biases or the conv patch embedding). */
bool m3_wrole_is_linear(m3_wrole role);

/* Plain view of a role's tensor (norms, biases, embedding, or a dense linear). */
m3_status m3_weights_role_get(m3_weights *w, m3_wrole role, int layer, int expert, m3_tensor *t);

typedef enum { M3_WF_DENSE = 0, M3_WF_MXFP4, M3_WF_MXFP8 } m3_wformat;
/* A linear weight in its stored form. rows/cols are the logical [out, in]. */
typedef struct m3_linear_w {
    m3_wformat fmt;
    int64_t rows, cols;
    m3_tensor w;     /* dense: F32/BF16/F16 [out, in]; MXFP4: U8 [out, in/2]; MXFP8: F8_E4M3 [out, in] */
    m3_tensor scale; /* MX only: U8 or F8_E8M0 e8m0 [out, in/32]; dtype INVALID for dense */
} m3_linear_w;
m3_status m3_weights_linear(m3_weights *w, m3_wrole role, int layer, int expert, m3_linear_w *lw);

/* Verify that every tensor the config implies is present with the implied shape (or its
 * MXFP4/MXFP8 form) and a sensible dtype. The first problem is the error: M3_ERR_MISSING
 * "<dir>: missing tensor NAME (config implies [a, b])" or M3_ERR_SHAPE "<file>: tensor NAME
 * has shape [..], config implies [..]". *n_unused (may be NULL) receives the number of stored
 * tensors the model does not use (mtp.* excluded from that count). */
m3_status m3_weights_check(const m3_weights *w, const m3_config *cfg, int64_t *n_unused);

/* Number of linear modules whose stored form (dense vs MX) disagrees with the config's
 * quantization_config (m3_config_module_quantized); the first one's module name goes to
 * first (may be NULL). Informational: the stored form is what the model uses. */
int64_t m3_weights_quant_mismatch(const m3_weights *w, const m3_config *cfg, char *first,
                                  size_t cap);

/* ---- conversion ------------------------------------------------------------------------ */
/* Rows [row0, row0 + n_rows) of a tensor viewed as [shape[0], prod(shape[1:])] to f32
 * (caller-owned out, n_rows * cols floats). BF16, F16, F32: exact. Other dtypes:
 * M3_ERR_UNSUPPORTED. */
m3_status m3_tensor_rows_f32(const m3_tensor *t, int64_t row0, int64_t n_rows, float *out);
/* Rows of a linear weight to f32 [n_rows, cols]. Dense: as m3_tensor_rows_f32.
 * MXFP4/MXFP8: TODO(h/formats) - dequantization must go through ref/num/mx.h and fp8.h,
 * which are not merged yet; until then this returns M3_ERR_UNSUPPORTED for MX formats. */
m3_status m3_linear_rows_f32(const m3_linear_w *lw, int64_t row0, int64_t n_rows, float *out);

#ifdef __cplusplus
}
#endif
#endif
