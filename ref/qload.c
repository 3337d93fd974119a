/* ref/qload.c: see qload.h. */
#include "ref/qload.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static void mx_act(m3_actq *a, m3_mx_elem elem, int min_pass, const m3_variant *v) {
    memset(a, 0, sizeof *a);
    a->kind = M3_ACTQ_MX;
    a->min_pass = min_pass;
    a->mx = m3_mx_params_default(elem);
    a->mx.scale = M3_MX_SCALE_RCEIL; /* aiter's runtime activation rule (spec §5.4, §5.11) */
    a->mx.ovf = v->fp8_overflow;
}

m3_status m3_qstore_create(m3_qstore **out, const m3_variant *v) {
    m3_qstore *q = calloc(1, sizeof *q);
    if (!q) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    /* MXFP4 (A16W4 below the bound, A4W4 at or above it; 0 = never) */
    int b4 = v->moe_act_bound > 0 ? v->moe_act_bound : INT_MAX;
    mx_act(&q->mx4_in, M3_MX_E2M1, b4, v);
    q->mx4_mid = q->mx4_in;
    /* MXFP8: e4m3 activations always (fnuz when the fp8 kind says so) */
    m3_mx_elem e8 = v->fp8_kind == M3_FP8_E4M3FNUZ ? M3_MX_E4M3FNUZ : M3_MX_E4M3FN;
    mx_act(&q->mx8_in, e8, 0, v);
    q->mx8_mid = q->mx8_in;
    if (v->moe_stage2_plain) q->mx4_mid.kind = q->mx8_mid.kind = M3_ACTQ_NONE;
    q->ptpc.kind = M3_ACTQ_PTPC;
    q->ptpc.min_pass = 0;
    q->ptpc.fp8 = m3_fp8q_params_default(v->fp8_kind);
    q->ptpc.fp8.ovf = v->fp8_overflow;
    q->ptpc.fp8.zero_row = v->ptpc_zero_row;
    q->ptpc.fp8.arith = M3_FP8Q_RCP; /* s = amax * (1/FP8_MAX), q = cvt(x * rcp(s)) (§5.6) */
    *out = q;
    return M3_OK;
}

void m3_qstore_free(m3_qstore *q) {
    if (!q) return;
    for (int i = 0; i < q->n_own; i++)
        free(q->own[i]);
    free(q->own);
    free(q);
}

/* malloc owned by q */
static void *qalloc(m3_qstore *q, size_t bytes) {
    if (q->n_own == q->cap_own) {
        int nc = q->cap_own ? 2 * q->cap_own : 64;
        void **np = realloc(q->own, (size_t)nc * sizeof *np);
        if (!np) return NULL;
        q->own = np;
        q->cap_own = nc;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p) q->own[q->n_own++] = p;
    return p;
}

m3_status m3_qload_mlp_fmt(m3_weights *w, m3_wrole rg, int L, int e, const m3_variant *v,
                           m3_wfmt *fmt) {
    m3_linear_w lw;
    M3_TRY(m3_weights_linear(w, rg, L, e, &lw));
    bool mx = lw.fmt != M3_WF_DENSE;
    switch (v->experts) {
    case M3_EXPERTS_MXFP4:
        *fmt = M3_WFMT_MXFP4;
        break;
    case M3_EXPERTS_MXFP8:
        *fmt = M3_WFMT_MXFP8;
        break;
    case M3_EXPERTS_BF16:
        *fmt = mx ? M3_WFMT_F32 : M3_WFMT_BF16;
        break;
    default: /* stored: whatever the checkpoint holds */
        *fmt = lw.fmt == M3_WF_MXFP4   ? M3_WFMT_MXFP4
               : lw.fmt == M3_WF_MXFP8 ? M3_WFMT_MXFP8
                                       : M3_WFMT_BF16;
    }
    return M3_OK;
}

void m3_qload_mx_weight(uint8_t *codes, m3_e8m0 *scales, const float *x, int rows, int cols,
                        bool fp4, const m3_variant *v) {
    m3_mx_params p = m3_mx_params_default(fp4 ? M3_MX_E2M1 : M3_MX_E4M3FN);
    p.scale = v->experts_scale;
    p.round = v->experts_round;
    m3_mx_quantize(codes, scales, x, rows, cols, &p);
}

/* One linear [rows, cols] in format fmt: borrowed when stored so, else converted. */
static m3_status load_one(m3_qstore *q, m3_weights *w, m3_wrole role, int L, int e, int rows,
                          int cols, m3_wfmt fmt, const m3_variant *v, const m3_actq *act,
                          const void **data) {
    m3_linear_w lw;
    char name[512];
    m3_weight_name(name, sizeof name, role, L, e);
    M3_TRY(m3_weights_linear(w, role, L, e, &lw));
    if (lw.rows != rows || lw.cols != cols)
        return m3_errorf(M3_ERR_SHAPE, "tensor %s has shape [%lld, %lld], config implies [%d, %d]",
                         name, (long long)lw.rows, (long long)lw.cols, rows, cols);
    bool as_stored = (fmt == M3_WFMT_MXFP4 && lw.fmt == M3_WF_MXFP4) ||
                     (fmt == M3_WFMT_MXFP8 && lw.fmt == M3_WF_MXFP8 && lw.w.dtype == M3_DT_F8_E4M3);
    if (as_stored) {
        if (lw.fmt == M3_WF_MXFP4 && lw.w.dtype != M3_DT_U8 && lw.w.dtype != M3_DT_F4)
            return m3_errorf(M3_ERR_FORMAT, "tensor %s: unexpected MXFP4 storage", name);
        m3_wq *d = qalloc(q, sizeof *d);
        if (!d) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", name);
        *d = (m3_wq){.codes = lw.w.data, .scale = lw.scale.data, .act = act};
        *data = d;
        return M3_OK;
    }
    size_t n = (size_t)rows * (size_t)cols;
    float *f = fmt == M3_WFMT_F32 ? qalloc(q, n * sizeof *f) : malloc(n * sizeof *f);
    if (!f) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", name);
    /* the dense (or MX-decoded) weights, exactly in fp32 */
    m3_status s = m3_linear_rows_f32(&lw, 0, rows, f);
    if (s || fmt == M3_WFMT_F32) {
        if (s && fmt != M3_WFMT_F32) free(f);
        if (!s) *data = f;
        return s ? m3_error_context(s, "%s", name) : M3_OK;
    }
    bool fp4 = fmt == M3_WFMT_MXFP4;
    m3_mx_params mp = m3_mx_params_default(fp4 ? M3_MX_E2M1 : M3_MX_E4M3FN);
    size_t cb = (size_t)rows * (size_t)m3_mx_row_bytes(cols, &mp);
    size_t sb = (size_t)rows * (size_t)m3_mx_n_blocks(cols, &mp);
    uint8_t *codes = qalloc(q, cb);
    m3_e8m0 *sc = codes ? qalloc(q, sb) : NULL;
    m3_wq *d = sc ? qalloc(q, sizeof *d) : NULL;
    if (!d) {
        free(f);
        return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", name);
    }
    memset(codes, 0, cb); /* the unused high nibble of an odd row stays 0 */
    m3_qload_mx_weight(codes, sc, f, rows, cols, fp4, v);
    free(f);
    *d = (m3_wq){.codes = codes, .scale = sc, .act = act};
    *data = d;
    return M3_OK;
}

m3_status m3_qload_mlp(m3_mlp_weights *out, m3_qstore *q, m3_weights *w, m3_wrole rg, m3_wrole ru,
                       m3_wrole rd, int L, int e, int dim, int ffn, m3_wfmt fmt,
                       const m3_variant *v) {
    M3_ASSERT(fmt != M3_WFMT_BF16 && fmt != M3_WFMT_FP8_ROW);
    memset(out, 0, sizeof *out);
    out->fmt = fmt;
    const m3_actq *in = fmt == M3_WFMT_MXFP4 ? &q->mx4_in : &q->mx8_in;
    const m3_actq *mid = fmt == M3_WFMT_MXFP4 ? &q->mx4_mid : &q->mx8_mid;
    M3_TRY(load_one(q, w, rg, L, e, ffn, dim, fmt, v, in, &out->gate));
    M3_TRY(load_one(q, w, ru, L, e, ffn, dim, fmt, v, in, &out->up));
    M3_TRY(load_one(q, w, rd, L, e, dim, ffn, fmt, v, mid, &out->down));
    return M3_OK;
}

/* fp8 per-output-channel form of a dense matrix: codes [N, K], s_w [N]. */
static m3_status ptpc_weight(m3_qstore *q, m3_wfmt fmt, const void *data, int N, int K,
                             const void **out) {
    size_t n = (size_t)N * (size_t)K;
    float *f = malloc(n * sizeof *f);
    uint8_t *codes = qalloc(q, n);
    float *s = codes ? qalloc(q, (size_t)N * sizeof *s) : NULL;
    m3_wq *d = s ? qalloc(q, sizeof *d) : NULL;
    if (!f || !d) {
        free(f);
        return m3_errorf(M3_ERR_NOMEM, "ptpc weights [%d, %d]: out of memory", N, K);
    }
    if (fmt == M3_WFMT_BF16)
        for (size_t i = 0; i < n; i++)
            f[i] = m3_bf16_to_f32(((const m3_bf16 *)data)[i]);
    else if (fmt == M3_WFMT_F32)
        memcpy(f, data, n * sizeof *f);
    else {
        free(f);
        return m3_errorf(M3_ERR_UNSUPPORTED, "ptpc of a quantized projection is not supported");
    }
    /* the weight rule of §5.6; a zero weight channel keeps scale 1 (codes 0) rather than
     * poisoning every token (UNVERIFIED; does not occur in real checkpoints) */
    m3_fp8q_params wp = q->ptpc.fp8;
    wp.zero_row = M3_PTPC_ZERO_ONE;
    m3_fp8_quantize_rows(codes, s, f, N, K, &wp);
    free(f);
    *d = (m3_wq){.codes = codes, .scale = s, .act = &q->ptpc};
    *out = d;
    return M3_OK;
}

m3_status m3_qload_ptpc(m3_wmat *wm, m3_qstore *q) {
    const void *d;
    M3_TRY(ptpc_weight(q, wm->fmt, wm->data, wm->n_out, wm->n_in, &d));
    wm->fmt = M3_WFMT_FP8_ROW;
    wm->data = d;
    return M3_OK;
}

m3_status m3_qload_ptpc_mlp(m3_mlp_weights *mw, m3_qstore *q, int D, int F) {
    m3_mlp_weights o = *mw;
    M3_TRY(ptpc_weight(q, mw->fmt, mw->gate, F, D, &o.gate));
    M3_TRY(ptpc_weight(q, mw->fmt, mw->up, F, D, &o.up));
    M3_TRY(ptpc_weight(q, mw->fmt, mw->down, D, F, &o.down));
    o.fmt = M3_WFMT_FP8_ROW;
    *mw = o;
    return M3_OK;
}
