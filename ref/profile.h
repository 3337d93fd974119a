/* ref/profile.h: numerics profiles: a struct of NAMED switches that says where the
 * reference rounds activations to bf16 (or keeps fp32) and which model-convention variant
 * each component follows. Components read the switches; they never test the profile id.
 *
 * Profiles (spec m3-numerics.md §0, per-step tables of §3, divergences §9, names §5.9):
 *   fp32  every activation fp32, no rounding; mirrors transformers run with model.float().
 *   hf    transformers 5.17 eager with the model in bf16: each torch op on bf16 tensors
 *         computes in fp32 and rounds its output once to bf16 (§3.17 lists the points).
 *   atom  ROCm/ATOM at TP=1 as far as it can be emulated on the CPU: roundings at kernel
 *         boundaries (fp32 residual into the norm, one rounding after q/k norm+rope, one
 *         after swiglu, bf16 router, indexer scale s*log2e, local boost 1e29, partition
 *         double rounding, selection-order accumulation). Quantized sub-options (fp8 KV,
 *         MX experts, ptpc) are not switches here yet: they come with the quant issue.
 *
 * Rounding helper: m3_prof_rnd(on, x) = on ? bf16(x) : x, bf16 = RNE (ref/num/bf16.h).
 * See docs/numerics.md §2 for the table of every rounding point per profile. */
#ifndef M3_PROFILE_H
#define M3_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"
#include "ref/num/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { M3_PROFILE_FP32 = 0, M3_PROFILE_HF = 1, M3_PROFILE_ATOM = 2 } m3_profile_id;

/* q/k (and index q/k) norm + RoPE rounding (§3.6). */
typedef enum {
    M3_QK_ROUND_NONE = 0, /* fp32: nothing rounded */
    M3_QK_ROUND_PER_OP,   /* hf: bf16 after the norm, after e*c, after rot(e)*s, after the sum */
    M3_QK_ROUND_ONCE      /* atom: fp32 through norm and rope, one bf16 rounding at the end */
} m3_qk_round;

/* RoPE inverse frequency inv[i] = 1/theta^(2i/R) held in fp32 (§3.6). */
typedef enum {
    M3_ROPE_INV_TORCH = 0, /* torch's fp32 steps: e = f32(f32(2i)/f32(R)), p = f32(theta^e)
                              (pow correctly rounded here; torch's pow is <= 1 ulp), inv =
                              f32(1/p). Default: what transformers computes. */
    M3_ROPE_INV_F64        /* 1/theta^(2i/R) in double, one rounding to fp32 ("exact") */
} m3_rope_inv;

/* RoPE angle a = p*inv (§3.6, named parameter rope_angle). */
typedef enum {
    M3_ROPE_ANGLE_F32 = 0, /* f32(f32(p)*inv[i]): what HF and ATOM do */
    M3_ROPE_ANGLE_F64      /* (double)p*inv[i] kept in double for cos/sin */
} m3_rope_angle;

/* Attention logits (§3.7). */
typedef enum {
    M3_SCORES_F32 = 0,   /* z = f32(q.k) * s in fp32 */
    M3_SCORES_BF16_EAGER /* hf eager: z = bf16(bf16(q.k) * s) */
} m3_attn_scores;

/* Key order of the sparse-attention accumulation (§3.10, §9.13). */
typedef enum {
    M3_ATTN_ORDER_POSITION = 0, /* fp32/hf: keys in position order */
    M3_ATTN_ORDER_SELECTION     /* atom: full blocks in selection order, own block last */
} m3_attn_order;

/* swiglu_oai rounding (§3.13, §9.4). */
typedef enum {
    M3_SWIGLU_F32 = 0,     /* fp32 op by op, no rounding */
    M3_SWIGLU_BF16_PER_OP, /* hf: t1..t4 and a each rounded to bf16 (five roundings) */
    M3_SWIGLU_BF16_ONCE    /* atom: fp32 inside, one bf16 rounding of a */
} m3_swiglu_round;

/* Width of the index_topk output (§3.8). */
typedef enum {
    M3_TOPK_WIDTH_K = 0, /* always K slots, -1 padded (reference default; atom) */
    M3_TOPK_WIDTH_HF     /* min(K, ceil(S_k/B)) slots, as torch.topk in transformers */
} m3_topk_width;

/* NaN index scores (§3.8). */
typedef enum {
    M3_INDEX_NAN_HIGHEST = 0, /* fp32/hf: torch ranks NaN above +inf */
    M3_INDEX_NAN_NEG          /* atom: NaN -> -1e30 */
} m3_index_nan;

typedef struct m3_profile {
    m3_profile_id id;
    const char *name; /* "fp32" | "hf" | "atom"; static string */

    /* ---- storage roundings (§3.2, §3.3, §3.11, §3.16) ---- */
    bool act_bf16;           /* every GEMM output (q/k/v/index/o_proj, MLP gate/up/down, expert
                                outputs, lm_head logits) and every norm output -> bf16 */
    bool residual_bf16;      /* the stored residual sum s = r + h -> bf16 */
    bool norm_reads_f32_sum; /* atom: the norm reads the unrounded fp32 r+h (§9.2); the stored
                                residual is still bf16(s) when residual_bf16 */

    /* ---- q/k norm + rope (§3.5, §3.6) ---- */
    m3_qk_round qk_round;
    bool rope_cs_bf16; /* cos/sin tables rounded to bf16 (hf, atom) */
    m3_rope_inv rope_inv;
    m3_rope_angle rope_angle;

    /* ---- attention (§3.7, §3.10, §4.9) ---- */
    m3_attn_scores attn_scores;
    bool attn_p_bf16;   /* probabilities rounded to bf16 before P.V (denominator unrounded) */
    bool attn_out_bf16; /* attention output rounded to bf16 */
    int attn_partition; /* 0: one pass over the key set. >0 (atom: 256): the key set is split
                           into partitions of that many keys, each partition's normalised
                           output is stored bf16 and merged with fp32 log-sum-exp weights,
                           then rounded again (double rounding, §9.11) */
    m3_attn_order attn_order;

    /* ---- indexer (§3.8) ---- */
    float index_scale;      /* 1 (fp32/hf) or s*log2e = 0.127517432f (atom) */
    float local_boost;      /* score of forced local blocks: +inf (fp32/hf) or 1e29 (atom) */
    float init_boost;       /* score of forced init blocks (atom 1e30) */
    bool index_init_blocks; /* honour init_blocks (atom); HF drops sparse_init_block */
    m3_index_nan index_nan;
    m3_topk_width topk_width;
    float topk_tie_margin; /* a tie straddles rank K when S_(K) - S_(K+1) <= margin (>= 0) */

    /* ---- MoE (§3.12 - §3.14) ---- */
    m3_dtype router_dtype; /* M3_DT_F32 or M3_DT_BF16: the dtype the router gate AND the
                              routing bias are held in; x is cast to it, the GEMM output
                              (logits) is in it. hf default BF16 (from_pretrained(dtype=bf16)
                              casts both, §10); atom BF16 (§9.1); fp32 F32 */
    m3_swiglu_round swiglu;
    bool moe_bf16_combine; /* hf: bf16(y_e * w), bf16 accumulation in ascending expert id,
                              bf16(rsf * R), bf16(rsf*R + S) */
} m3_profile;

void m3_profile_fp32(m3_profile *p);
void m3_profile_hf(m3_profile *p);
void m3_profile_atom(m3_profile *p);

/* Fill *p from "fp32" | "hf" | "atom". M3_ERR_ARG (with a message) for other names. */
m3_status m3_profile_by_name(m3_profile *p, const char *name);

/* Override one named option (the §5.9 names where they exist):
 *   router_dtype=fp32|bf16   rope_angle=f32|f64   rope_inv=torch|f64
 *   attn_impl=eager|fp32     (scores rounding)   attn_order=position|selection
 *   attn_partition=N         index_scale=1|slog2e|<float>   local_boost=inf|1e29|<float>
 *   topk_width=k|hf          topk_tie_margin=<float>   swiglu=fp32|per_op|once
 * M3_ERR_ARG (with a message naming key and value) for anything else. */
m3_status m3_profile_set(m3_profile *p, const char *key, const char *value);

/* Write the profile as a compact JSON object (for a dump's `variant`). Returns the length
 * that snprintf would write; output truncated (NUL-terminated) when n is too small. */
int m3_profile_json(const m3_profile *p, char *buf, size_t n);

/* on ? bf16(x) : x */
static inline float m3_prof_rnd(bool on, float x) { return on ? m3_round_bf16(x) : x; }

/* x[i] = bf16(x[i]) for i < n (RNE). */
void m3_round_bf16_n(float *x, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
