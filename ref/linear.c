/* ref/linear.c: see linear.h. The only file that includes <cblas.h>.
 *
 * Determinism: OpenBLAS is pinned to one thread whenever our linear paths run; our threads
 * (m3_parallel_for) take whole tiles of M3_LINEAR_TILE_N output rows, and every tile walks
 * K in the same fixed M3_LINEAR_TILE_K chunks with beta = 1 after the first chunk. The shape
 * of every cblas call is therefore a function of (T, K, N) only, never of the thread count,
 * so y is bit-identical for any m3_threads(). */
#include "ref/linear.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

bool m3_linear_naive(void) {
    const char *e = getenv("M3_NAIVE_GEMM");
    return e && e[0] == '1';
}

static atomic_int blas_threads_now; /* 0 = unknown */

static void blas_pin(int n) {
    if (atomic_load(&blas_threads_now) != n) {
        openblas_set_num_threads(n);
        atomic_store(&blas_threads_now, n);
    }
}

void m3_blas_threads(int n) { blas_pin(n > 0 ? n : 1); }

void m3_sgemm_nt(float *c, const float *a, const float *b, int m, int n, int k) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
}

float m3_dot_f32(const float *a, const float *b, int n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += a[i + l] * b[i + l];
    for (; i < n; i++) s[i & 7] += a[i] * b[i];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* m3_dot_f32's order with bf16 weights converted on the fly */
static float dot_bf16(const float *a, const m3_bf16 *b, int n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += a[i + l] * m3_bits_f32((uint32_t)b[i + l] << 16);
    for (; i < n; i++) s[i & 7] += a[i] * m3_bf16_to_f32(b[i]);
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* m3_dot_f32's order with fp32 weights rounded to bf16 on the fly */
static float dot_f32_rounded(const float *a, const float *b, int n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < n; i++) s[i & 7] += a[i] * m3_round_bf16(b[i]);
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

typedef struct {
    float *y;
    const float *x;
    const void *w;
    const void *scale;   /* MX: e8m0 [n_out, nb]; FP8_ROW: unused here (epilogue) */
    m3_fp8_kind fp8kind; /* FP8_ROW codes */
    m3_wfmt fmt;
    bool round_w; /* f32 weights rounded to bf16 on the fly */
    int ldy, ldx, n_tok, n_in, n_out;
    bool naive;
    float lut[256]; /* quantized formats: the element value of every code (filled by
                       lin_job_lut), so a tile decodes with one lookup and one multiply
                       per element, the same product as m3_mx_decode */
} lin_job;

static void lin_job_lut(lin_job *j) {
    for (int c = 0; c < 256; c++)
        j->lut[c] = j->fmt == M3_WFMT_FP8_ROW ? m3_fp8_to_f32((uint8_t)c, j->fp8kind)
                    : j->fmt == M3_WFMT_MXFP4 ? m3_mx_elem_decode((uint8_t)(c & 0xF), M3_MX_E2M1)
                    : j->fmt == M3_WFMT_MXFP8 ? m3_mx_elem_decode((uint8_t)c, M3_MX_E4M3FN)
                                              : 0.0f;
}

/* Row n, elements [k0, k0 + kc) of a quantized weight, decoded exactly into out: per MX block
 * one scale (m3_e8m0_to_f32) times the code values; bit-identical to wq_at element by
 * element. k0 is a multiple of 32. */
static void wq_row(const lin_job *j, int n, int k0, int kc, float *out) {
    if (j->fmt == M3_WFMT_FP8_ROW) {
        const uint8_t *row = (const uint8_t *)j->w + (size_t)n * j->n_in + k0;
        for (int k = 0; k < kc; k++) out[k] = j->lut[row[k]];
        return;
    }
    const int nb = (j->n_in + 31) / 32;
    const m3_e8m0 *sc = (const m3_e8m0 *)j->scale + (size_t)n * nb;
    for (int b0 = 0; b0 < kc; b0 += 32) {
        const int k = k0 + b0, m = kc - b0 < 32 ? kc - b0 : 32;
        const float s = m3_e8m0_to_f32(sc[k / 32]);
        if (j->fmt == M3_WFMT_MXFP4) {
            const uint8_t *row = (const uint8_t *)j->w + (size_t)n * (size_t)((j->n_in + 1) / 2);
            for (int i = 0; i < m; i++) out[b0 + i] = j->lut[m3_fp4_get(row, k + i, false)] * s;
        } else {
            const uint8_t *row = (const uint8_t *)j->w + (size_t)n * j->n_in + k;
            for (int i = 0; i < m; i++) out[b0 + i] = j->lut[row[i]] * s;
        }
    }
}

/* bf16 -> fp32 bits, 16 at a time so that -O2's SLP vectoriser takes it. */
static void cvt_bf16_row(uint32_t *d, const m3_bf16 *s, int n) {
    int j = 0;
    for (; j + 16 <= n; j += 16)
        for (int l = 0; l < 16; l++) d[j + l] = (uint32_t)s[j + l] << 16;
    for (; j < n; j++) d[j] = (uint32_t)s[j] << 16;
}

/* Exact fp32 value of a quantized weight element (MX: code x 2^scale; FP8_ROW: the code's
 * value, the per-channel scale comes in the epilogue). */
static float wq_at(const lin_job *j, int n, int k) {
    if (j->fmt == M3_WFMT_FP8_ROW)
        return m3_fp8_to_f32(((const uint8_t *)j->w)[(size_t)n * j->n_in + k], j->fp8kind);
    int nb = (j->n_in + 31) / 32;
    m3_e8m0 b = ((const m3_e8m0 *)j->scale)[(size_t)n * nb + k / 32];
    if (j->fmt == M3_WFMT_MXFP4) {
        const uint8_t *row = (const uint8_t *)j->w + (size_t)n * (size_t)((j->n_in + 1) / 2);
        return m3_mx_decode(m3_fp4_get(row, k, false), b, M3_MX_E2M1);
    }
    return m3_mx_decode(((const uint8_t *)j->w)[(size_t)n * j->n_in + k], b, M3_MX_E4M3FN);
}

static bool fmt_quantized(m3_wfmt f) { return f != M3_WFMT_BF16 && f != M3_WFMT_F32; }

static float w_at(const lin_job *j, int n, int k) {
    size_t o = (size_t)n * (size_t)j->n_in + (size_t)k;
    if (j->fmt == M3_WFMT_BF16) return m3_bf16_to_f32(((const m3_bf16 *)j->w)[o]);
    if (fmt_quantized(j->fmt)) return wq_at(j, n, k);
    float v = ((const float *)j->w)[o];
    return j->round_w ? m3_round_bf16(v) : v;
}

static void lin_tile(void *vctx, int64_t tile) {
    const lin_job *j = vctx;
    int n0 = (int)tile * M3_LINEAR_TILE_N;
    int nt = j->n_out - n0 < M3_LINEAR_TILE_N ? j->n_out - n0 : M3_LINEAR_TILE_N;
    if (j->naive) {
        /* plain loops: fp32, k in index order (bit-exact reference for tests) */
        for (int t = 0; t < j->n_tok; t++) {
            const float *xr = j->x + (size_t)t * j->ldx;
            for (int n = n0; n < n0 + nt; n++) {
                float acc = 0.0f;
                for (int k = 0; k < j->n_in; k++) acc += xr[k] * w_at(j, n, k);
                j->y[(size_t)t * j->ldy + n] = acc;
            }
        }
        return;
    }
    if (j->n_tok <= M3_LINEAR_SMALL_T && !fmt_quantized(j->fmt)) {
        /* few tokens (decode, routed experts at ~2 tokens each): the GEMM is bound by reading
         * W, so stream each bf16 row once and dot it with every token (m3_dot order with the
         * conversion fused); converting to fp32 and packing for sgemm would triple the
         * traffic. Chosen by T only: still independent of the thread count. */
        for (int n = n0; n < n0 + nt; n++)
            for (int t = 0; t < j->n_tok; t++) {
                const float *xr = j->x + (size_t)t * j->ldx;
                size_t o = (size_t)n * j->n_in;
                float v;
                if (j->fmt == M3_WFMT_BF16) v = dot_bf16(xr, (const m3_bf16 *)j->w + o, j->n_in);
                else if (j->round_w) v = dot_f32_rounded(xr, (const float *)j->w + o, j->n_in);
                else v = m3_dot_f32(xr, (const float *)j->w + o, j->n_in);
                j->y[(size_t)t * j->ldy + n] = v;
            }
        return;
    }
    /* one tile of W converted to fp32, chunk by chunk along K: 256 KiB per thread in
     * thread-local storage (not malloc'd per call, not on the stack) */
    static _Thread_local uint32_t buf[M3_LINEAR_TILE_N * M3_LINEAR_TILE_K];
    for (int k0 = 0; k0 < j->n_in; k0 += M3_LINEAR_TILE_K) {
        int kc = j->n_in - k0 < M3_LINEAR_TILE_K ? j->n_in - k0 : M3_LINEAR_TILE_K;
        const float *b;
        int ldb;
        if (j->fmt == M3_WFMT_BF16) {
            const m3_bf16 *w = j->w;
            for (int r = 0; r < nt; r++)
                cvt_bf16_row(buf + (size_t)r * kc, w + (size_t)(n0 + r) * j->n_in + k0, kc);
            b = (const float *)(const void *)buf;
            ldb = kc;
        } else if (fmt_quantized(j->fmt)) {
            /* quantized weights: decoded exactly, element by element (k0 is a multiple of
             * the MX block: M3_LINEAR_TILE_K is a multiple of 32) */
            float *fb = (float *)(void *)buf;
            for (int r = 0; r < nt; r++) wq_row(j, n0 + r, k0, kc, fb + (size_t)r * kc);
            b = fb;
            ldb = kc;
        } else if (j->round_w) {
            const float *w = j->w;
            float *fb = (float *)(void *)buf;
            for (int r = 0; r < nt; r++)
                for (int k = 0; k < kc; k++)
                    fb[(size_t)r * kc + k] = m3_round_bf16(w[(size_t)(n0 + r) * j->n_in + k0 + k]);
            b = fb;
            ldb = kc;
        } else {
            b = (const float *)j->w + (size_t)n0 * j->n_in + k0;
            ldb = j->n_in;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->n_tok, nt, kc, 1.0f,
                    j->x + k0, j->ldx, b, ldb, k0 == 0 ? 0.0f : 1.0f, j->y + n0, j->ldy);
    }
}

static void lin_run(lin_job *j) {
    M3_ASSERT(j->n_tok >= 0 && j->n_in > 0 && j->n_out > 0);
    M3_ASSERTF(j->ldx >= j->n_in && j->ldy >= j->n_out, "ldx %d n_in %d ldy %d n_out %d",
               j->ldx, j->n_in, j->ldy, j->n_out);
    if (j->n_tok == 0) return;
    j->naive = m3_linear_naive();
    if (!j->naive) blas_pin(1);
    int64_t n_tiles = (j->n_out + M3_LINEAR_TILE_N - 1) / M3_LINEAR_TILE_N;
    m3_parallel_for(n_tiles, lin_tile, j);
}

void m3_linear_ld(float *y, int ldy, const float *x, int ldx, const m3_bf16 *w, int n_tok,
                  int n_in, int n_out) {
    lin_job j = {.y = y, .x = x, .w = w, .fmt = M3_WFMT_BF16, .ldy = ldy, .ldx = ldx,
                 .n_tok = n_tok, .n_in = n_in, .n_out = n_out};
    lin_run(&j);
}

void m3_linear(float *y, const float *x, const m3_bf16 *w, int n_tok, int n_in, int n_out) {
    m3_linear_ld(y, n_out, x, n_in, w, n_tok, n_in, n_out);
}

void m3_linear_f32(float *y, int ldy, const float *x, int ldx, const float *w, bool w_as_bf16,
                   int n_tok, int n_in, int n_out) {
    lin_job j = {.y = y, .x = x, .w = w, .fmt = M3_WFMT_F32, .round_w = w_as_bf16, .ldy = ldy,
                 .ldx = ldx, .n_tok = n_tok, .n_in = n_in, .n_out = n_out};
    lin_run(&j);
}

bool m3_actq_applies(const m3_actq *a, int n_pass) {
    return a && a->kind != M3_ACTQ_NONE && n_pass >= a->min_pass;
}

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t m3_linear_q_scratch_bytes(int n_tok, int n_in) {
    size_t T = (size_t)n_tok, K = (size_t)n_in;
    return al64(T * K * sizeof(float)) + al64(T * sizeof(float)) + al64(T * K) + 64;
}

typedef struct {
    float *xq;       /* [T, K] dense */
    float *sx;       /* [T] (PTPC) */
    uint8_t *codes;  /* [T, K] fp8 codes (PTPC) */
    const float *x;
    int ldx, K;
    const m3_actq *a;
} actq_job;

/* One row of x: MX quantize-dequantize block by block, or ptpc codes (as values) + scale. */
static void actq_row(void *vctx, int64_t t) {
    const actq_job *j = vctx;
    const float *xr = j->x + (size_t)t * j->ldx;
    float *qr = j->xq + (size_t)t * j->K;
    if (j->a->kind == M3_ACTQ_MX) {
        const m3_mx_params *mp = &j->a->mx;
        uint8_t c[256];
        M3_ASSERT(mp->block >= 1 && mp->block <= 256);
        for (int k0 = 0; k0 < j->K; k0 += mp->block) {
            int n = j->K - k0 < mp->block ? j->K - k0 : mp->block;
            m3_e8m0 b = m3_mx_quantize_block(c, xr + k0, n, mp);
            for (int i = 0; i < n; i++) qr[k0 + i] = m3_mx_decode(c[i], b, mp->elem);
        }
    } else {
        uint8_t *cr = j->codes + (size_t)t * j->K;
        m3_fp8_quantize_rows(cr, &j->sx[t], xr, 1, j->K, &j->a->fp8);
        for (int k = 0; k < j->K; k++) qr[k] = m3_fp8_to_f32(cr[k], j->a->fp8.kind);
    }
}

void m3_linear_q(float *y, int ldy, const float *x, int ldx, const m3_wmat *w, int n_tok,
                 int n_pass, const m3_profile *p, void *scratch) {
    M3_ASSERT(w && p && w->data);
    const int K = w->n_in, N = w->n_out;
    const bool quant = fmt_quantized(w->fmt);
    const m3_wq *wq = quant ? w->data : NULL;
    const m3_actq *act = wq ? wq->act : NULL;
    const float *xg = x;
    int ldg = ldx;
    const float *sx = NULL;
    if (m3_actq_applies(act, n_pass) && n_tok > 0) {
        M3_ASSERTF(scratch, "m3_linear_q: activation quantization needs scratch");
        size_t T = (size_t)n_tok;
        char *sc = scratch;
        actq_job aj = {.xq = (float *)(void *)sc,
                       .sx = (float *)(void *)(sc + al64(T * K * sizeof(float))),
                       .codes = (uint8_t *)(sc + al64(T * K * sizeof(float)) +
                                            al64(T * sizeof(float))),
                       .x = x, .ldx = ldx, .K = K, .a = act};
        /* ptpc rows are quantized one by one (m3_fp8_quantize_rows threads internally) */
        if (act->kind == M3_ACTQ_PTPC)
            for (int64_t t = 0; t < n_tok; t++) actq_row(&aj, t);
        else
            m3_parallel_for(n_tok, actq_row, &aj);
        xg = aj.xq;
        ldg = K;
        if (act->kind == M3_ACTQ_PTPC) sx = aj.sx;
    }
    if (w->fmt == M3_WFMT_FP8_ROW)
        M3_ASSERTF(act && act->kind == M3_ACTQ_PTPC, "FP8_ROW weight without ptpc activations");
    lin_job j = {.y = y, .x = xg, .w = wq ? wq->codes : w->data, .scale = wq ? wq->scale : NULL,
                 .fmt = w->fmt, .fp8kind = act ? act->fp8.kind : M3_FP8_E4M3FN, .ldy = ldy,
                 .ldx = ldg, .n_tok = n_tok, .n_in = K, .n_out = N};
    if (fmt_quantized(w->fmt)) lin_job_lut(&j);
    lin_run(&j);
    if (w->fmt == M3_WFMT_FP8_ROW) {
        /* epilogue: (acc * s_x[t]) * s_w[n], fp32 (spec §5.6; order UNVERIFIED) */
        const float *sw = wq->scale;
        for (int t = 0; t < n_tok; t++) {
            float *yr = y + (size_t)t * ldy;
            float s = sx ? sx[t] : 1.0f;
            for (int n = 0; n < N; n++) yr[n] = (yr[n] * s) * sw[n];
        }
    }
    if (p->act_bf16)
        for (int t = 0; t < n_tok; t++) m3_round_bf16_n(y + (size_t)t * ldy, N);
}

void m3_linear_p(float *y, int ldy, const float *x, int ldx, const m3_wmat *w, int n_tok,
                 const m3_profile *p) {
    M3_ASSERT(w && p && w->data);
    if (w->fmt == M3_WFMT_BF16) {
        m3_linear_ld(y, ldy, x, ldx, w->data, n_tok, w->n_in, w->n_out);
        if (p->act_bf16)
            for (int t = 0; t < n_tok; t++) m3_round_bf16_n(y + (size_t)t * ldy, w->n_out);
        return;
    }
    m3_linear_q(y, ldy, x, ldx, w, n_tok, n_tok, p, NULL);
}
