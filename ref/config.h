/* ref/config.h: m3_config, the model description read from config.json.
 *
 * Both dialects of spec/m3-numerics.md §1.1 are read: the original checkpoint's
 * (`sparse_attention_config{...}`, `moe_layer_freq`, top-level `rope_theta`,
 * `partial_rotary_factor`) and the one transformers 5.17 `save_pretrained` writes
 * (`layer_types`, `mlp_layer_types`, `index_*`, `rope_parameters`). Resolution is per
 * field, never per file, with the precedence table of §1.1:
 *   - text fields are read from `text_config` when present, else from the top level
 *     (a flat text-only config), falling back to the top level per field;
 *   - index geometry: the legacy key inside `sparse_attention_config` OVERRIDES the flat
 *     `index_*` key (defaults 4, 128, 128, 16, 1; init blocks 0);
 *   - attention layout: `layer_types`, then `sparse_attention_freq`; default all
 *     full_attention (with a warning: that is not M3);
 *   - MLP layout: `mlp_layer_types`, then `moe_layer_freq`; default all sparse (warning);
 *   - rope theta: `rope_parameters.rope_theta`, then `rope_theta`, default 5e6;
 *   - rot_dim = int(head_dim * f), f = `rope_parameters.partial_rotary_factor`, then
 *     `partial_rotary_factor`, else 1.0. `rotary_dim` is never used (warning if it disagrees);
 *   - the activation is always swiglu-oai; `hidden_act` is ignored.
 * Inference-time overrides (§1.4: use_index_cache, index_topk_freq, index_topk_pattern,
 * index_skip_topk_offset) are accepted at the top level or inside text_config, and from
 * m3_config_apply_overrides (the CLI's --override JSON).
 *
 * Validation (M3_ERR_FORMAT, one line naming config.json and the field): positive sizes,
 * n_head % n_kv_head == 0, per-layer arrays of length n_layer, index_n_heads == n_kv_head
 * when a sparse layer exists, rot_dim even and <= head_dim, top_k <= n_expert,
 * sparse_score_type == "max", sparse_disable_index_value == 1 on sparse layers, pattern[0]
 * != 'S', a known quant_method. Non-fatal disagreements are collected in `warnings`
 * (never printed by the loader: m3_config_emit_warnings prints them through m3_warn).
 *
 * Numerics: rms_eps, swiglu_alpha, swiglu_limit and routed_scale are stored as the fp32
 * values the model uses (f32(1e-6) = 9.99999997e-07, f32(1.702) = 1.70200002193).
 * rope_theta stays double; the RoPE code decides how to round it (§3.6). */
#ifndef M3_CONFIG_H
#define M3_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Vision tower and projector (spec §1.3, §6). present == false for a text-only config. */
typedef struct m3_vision_config {
    bool present;
    int hidden;         /* 1280 */
    int n_head;         /* 16 (head dim = hidden / n_head = 80) */
    int n_layer;        /* 32 */
    int inter;          /* fc1 width 5120 */
    int patch;          /* 14 */
    int n_channels;     /* 3 */
    int merge;          /* spatial merge 2 */
    int temporal_patch; /* 2 */
    float layer_norm_eps; /* f32(1e-5) */
    double rope_theta;    /* 10000 */
} m3_vision_config;

typedef enum {
    M3_QUANT_NONE = 0, /* bf16 checkpoint */
    M3_QUANT_QUARK,    /* quant_method "quark" (AMD Quark, MXFP4 or MXFP8 elements) */
    M3_QUANT_MXFP8,    /* quant_method "mxfp8" (weight_block_size [1,32], ignored_layers) */
} m3_quant_method;

/* quantization_config (spec §5.10). Module names are matched without the ".weight" suffix,
 * against the checkpoint's original names. */
typedef struct m3_quant_config {
    m3_quant_method method;
    m3_dtype weight_dtype;  /* M3_DT_F4 (Quark "fp4") or M3_DT_F8_E4M3 ("fp8", mxfp8) */
    int group_size;         /* elements per e8m0 scale along K: 32 */
    char scale_format[16];  /* "e8m0" */
    bool has_input_quant;   /* input_tensors given (A4W4 / A8W8), false for weight-only */
    bool input_dynamic;     /* input_tensors.is_dynamic */
    char round_method[32];  /* weight round_method, e.g. "half_even" ("" when absent) */
    char scale_mode[32];    /* weight scale_calculation_mode, e.g. "even" ("" when absent) */
    int n_exclude;
    char **exclude;         /* owned: Quark `exclude` or mxfp8 `ignored_layers`, fnmatch globs */
} m3_quant_config;

typedef struct m3_config {
    /* source */
    char *path;      /* owned: config.json path */
    char *json_text; /* owned: verbatim config.json text (dumps store it), NUL-terminated */
    size_t json_len;
    char model_type[64]; /* top-level model_type, e.g. "minimax_m3_vl" */

    /* text model (legend: D hidden, H heads, Hkv kv heads, Dh head dim, R rot dims) */
    int hidden;     /* D 6144 */
    int n_layer;    /* 60 */
    int n_head;     /* H 64 */
    int n_kv_head;  /* Hkv 4 */
    int head_dim;   /* Dh 128 */
    int vocab;      /* 200064 */
    int64_t max_pos; /* 1048576 */
    float rms_eps;   /* f32(1e-6) */
    double rope_theta;      /* 5e6 */
    double partial_rotary;  /* f = 0.5 */
    int rot_dim;            /* R = int(Dh * f) = 64 */
    int rotary_dim_key;     /* the informational `rotary_dim` key, -1 when absent */
    float swiglu_alpha;     /* 1.702 */
    float swiglu_limit;     /* 7.0 */
    int dense_inter;        /* dense MLP width 12288 */
    int expert_inter;       /* F, routed expert width 3072 */
    int shared_inter;       /* shared expert width 3072 */
    int n_shared_experts;   /* 1 */
    int n_expert;           /* E 128 */
    int top_k;              /* K 4 */
    float routed_scale;     /* 2.0 */
    bool *layer_sparse;     /* owned [n_layer]: attention type minimax_m3_sparse */
    bool *layer_moe;        /* owned [n_layer]: MLP type sparse (MoE) */
    int n_sparse;           /* number of sparse-attention layers (57) */
    int n_moe;              /* number of MoE layers (57) */
    int index_n_heads;      /* 4 */
    int index_head_dim;     /* 128 */
    int index_block;        /* Bs 128 */
    int index_topk;         /* 16 blocks */
    int index_local;        /* 1 */
    int index_init;         /* 0 (ATOM's sparse_init_block) */
    bool tie_word_embeddings;
    int bos_id, eos_id;     /* HF defaults 200034, 200020 when absent */

    /* inference overrides (§1.4, §3.9) */
    bool use_index_cache;       /* false */
    int index_topk_freq;        /* 1 */
    char *index_topk_pattern;   /* owned, NULL when not set */
    int index_skip_topk_offset; /* 0 */

    /* multimodal */
    int image_token_id, video_token_id; /* 200025, 200026 */
    int projector_hidden;               /* P 6144 */
    int merged_hidden;                  /* P * merge^2 = 24576 */
    m3_vision_config vision;

    m3_quant_config quant;

    /* non-fatal findings, one line each (owned) */
    int n_warnings;
    char **warnings;
} m3_config;

/* Load MODEL_DIR/config.json (or the given .json file) and validate it. *out is owned by the
 * caller: m3_config_free. Errors name the file and the field. */
m3_status m3_config_load(m3_config **out, const char *model_dir_or_file);
/* Parse a config from memory (path is used in messages only). */
m3_status m3_config_parse(m3_config **out, const char *json_text, size_t len, const char *path);
/* Apply inference overrides from a JSON object, e.g. {"use_index_cache": true,
 * "index_topk_freq": 4}. Accepted keys: use_index_cache, index_topk_freq,
 * index_topk_pattern (string or null), index_skip_topk_offset. An unknown key or a wrong type
 * is an error (M3_ERR_ARG) and leaves cfg unchanged. Re-validates the schedule. */
m3_status m3_config_apply_overrides(m3_config *cfg, const char *json_text);
void m3_config_free(m3_config *cfg); /* NULL ok */

/* Print the collected warnings through m3_warn (one line each). */
void m3_config_emit_warnings(const m3_config *cfg);

/* Append one formatted line to a list of owned strings (*list of *n entries), the form of
 * m3_config.warnings; also used by other collectors of non-fatal findings (m3 info). A line
 * that cannot be allocated is dropped: a lost warning is not worth failing a load for. */
void m3_warnings_addf(char ***list, int *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Top-k reuse schedule (spec §3.9). computes[L] (caller-owned, n_layer entries) is true when
 * layer L is a sparse layer that computes its own top-k, false for reuse layers and for
 * full-attention layers. Without use_index_cache every sparse layer computes.
 * Error (M3_ERR_FORMAT) when the first sparse layer would reuse (pattern[0] == 'S'). */
m3_status m3_config_topk_schedule(const m3_config *cfg, bool *computes);
/* Sparse ordinal of layer L (rank among sparse layers), -1 for a full-attention layer. */
int m3_config_sparse_ordinal(const m3_config *cfg, int layer);

/* True when module `name` (original naming, no ".weight" suffix, e.g.
 * "language_model.model.layers.3.block_sparse_moe.experts.7.w1") is quantized according
 * to quantization_config: a method is set and no exclude glob matches. Only meaningful for
 * linear modules. For mxfp8 `ignored_layers` an entry also matches as a dotted suffix. */
bool m3_config_module_quantized(const m3_config *cfg, const char *module_name);

/* KV-cache bytes per token for the whole model (spec §4.6). */
typedef struct m3_kv_bytes {
    int64_t bf16;       /* main K,V bf16 + index K bf16: 137472 */
    int64_t fp8;        /* main K,V fp8 + index K bf16: 76032 */
    int64_t fp8_scales; /* fp32 per token per KV head, K and V: 1920 */
    int64_t fp8_all;    /* fp8 main + fp8 index + scales: 70656 */
} m3_kv_bytes;
m3_kv_bytes m3_config_kv_bytes(const m3_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
