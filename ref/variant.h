/* ref/variant.h: the run options that change numerics beyond the profile (issue: quantized
 * experts, paged fp8 caches, top-k reuse, ptpc). A variant is applied ON TOP of a profile
 * (ref/profile.h): the profile says where activations round, the variant which quantized
 * paths run. Every field is recorded in the dump's `variant` attribute (m3_variant_json),
 * so two dumps say exactly how they differ. Spec m3-numerics.md §3-§5, §5.9 (named
 * convention parameters), §5.11 (runtime recipes).
 *
 * Keys (m3_variant_set, also the CLI flags `--<key> value` with '_' written '-'):
 *   experts        bf16 | mxfp4 | mxfp8 | stored   routed + shared experts (ref/variant_quant.c)
 *   experts_scale  floor | even | rceil           weight quantize-on-load scale rule (even)
 *   experts_round  rne | rna                       weight element rounding (rne)
 *   moe_act_bound  N                               MXFP4: activations MXFP4 when a pass has
 *                                                  >= N tokens, bf16 below; 0 = never (256)
 *   shared_fused   auto | on | off                 atom: shared expert as expert E, w=1, x rsf
 *                                                  folded into routing weights (auto: on when
 *                                                  experts are quantized under atom)
 *   moe_stage2_act same | none                    down input quantized like gate/up (same)
 *   ptpc           off | fp8                        online per-token/per-channel fp8 of the
 *                                                  dense projections (attention, dense MLP)
 *   ptpc_zero_row  nan | one
 *   kv_cache       bf16 | fp8                       main KV cache (ref/variant_cache.c)
 *   index_cache    bf16 | fp8                       index-key cache (unit scale when fp8)
 *   fp8_kind       e4m3fn | e4m3fnuz                element type of fp8 caches / ptpc
 *   fp8_overflow   saturate | nan
 *   kv_fp8max      table | 240 | 448               per-writer maximum (spec §4.7) or forced
 *   cache_layout   contiguous | paged              attention reads through the paged
 *                                                  SHUFFLE layouts (spec §4.1-4.4)
 *   index_q_fp8_prefill  auto | on | off           (auto: on when index_cache is fp8)
 *   topk_reuse     N                               compute top-k on every N-th sparse layer
 *   topk_pattern   S...                             per sparse ordinal: 'S' reuse, else compute
 *   topk_skip_offset N                             shifts the freq schedule (spec §3.9)
 */
#ifndef M3_VARIANT_H
#define M3_VARIANT_H

#include <stdbool.h>
#include <stddef.h>

#include "ref/base.h"
#include "ref/num/fp8.h"
#include "ref/num/mx.h"
#include "ref/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { M3_EXPERTS_BF16 = 0, M3_EXPERTS_MXFP4, M3_EXPERTS_MXFP8, M3_EXPERTS_STORED } m3_experts_mode;
typedef enum { M3_TRI_AUTO = 0, M3_TRI_ON, M3_TRI_OFF } m3_tri;
typedef enum { M3_CACHE_BF16 = 0, M3_CACHE_FP8 } m3_cache_dtype;
typedef enum { M3_LAYOUT_CONTIGUOUS = 0, M3_LAYOUT_PAGED } m3_cache_layout;

typedef struct m3_variant {
    /* quantized experts and online quantization (ref/variant_quant.c) */
    m3_experts_mode experts;
    m3_mx_scale_rule experts_scale;
    m3_mx_round experts_round;
    int moe_act_bound;
    m3_tri shared_fused;
    bool moe_stage2_plain; /* moe_stage2_act: false "same" (the down-projection input is
                              quantized like the gate/up input, UNVERIFIED assumption), true
                              "none" (it stays in the profile's precision) */
    bool ptpc;
    m3_ptpc_zero_row ptpc_zero_row;
    /* caches (ref/variant_cache.c) */
    m3_cache_dtype kv_cache, index_cache;
    m3_fp8_kind fp8_kind;
    m3_fp8_overflow fp8_overflow;
    int kv_fp8max; /* 0: per writer table (spec §4.7); else the forced maximum */
    m3_cache_layout cache_layout;
    m3_tri index_q_fp8_prefill;
    /* top-k reuse (ref/variant_cache.c); 0 / "" = not set (every sparse layer computes) */
    int topk_reuse;
    char topk_pattern[128];
    int topk_skip_offset;
} m3_variant;

/* The plain variant: bf16 experts as stored, bf16 caches, contiguous layout, no reuse. */
void m3_variant_default(m3_variant *v);
/* Set one key (see the table above; '-' and '_' are the same). Unknown key or bad value:
 * M3_ERR_ARG with one line naming both. */
m3_status m3_variant_set(m3_variant *v, const char *key, const char *value);
/* Cross-field validation after all keys are set (e.g. topk_reuse and topk_pattern both). */
m3_status m3_variant_check(const m3_variant *v);
/* JSON object of every field (the dump's `variant`), without backend; returns the length
 * written (snprintf semantics). */
int m3_variant_json(const m3_variant *v, char *buf, size_t n);
/* true when nothing differs from m3_variant_default */
bool m3_variant_is_default(const m3_variant *v);

/* Per-part setters, each in its own file; m3_variant_set tries them in turn. They return
 * M3_ERR_MISSING (without recording an error) for a key that is not theirs. */
m3_status m3_variant_set_quant(m3_variant *v, const char *key, const char *value);
m3_status m3_variant_set_cache(m3_variant *v, const char *key, const char *value);
int m3_variant_json_quant(const m3_variant *v, char *buf, size_t n);
int m3_variant_json_cache(const m3_variant *v, char *buf, size_t n);
/* Cross-field checks of the cache keys (called by m3_variant_check). */
m3_status m3_variant_check_cache(const m3_variant *v);
/* index_q_fp8_prefill resolved: auto -> on exactly when index_cache is fp8. */
bool m3_variant_index_q_fp8(const m3_variant *v);

#ifdef __cplusplus
}
#endif
#endif
