/* ref/quant.c: see quant.h. Rows are independent; each row is walked block by block in
 * index order with the scalar rules of ref/num/mx.h and ref/num/fp8.h. */
#include "ref/quant.h"

#include <string.h>

int m3_mx_n_blocks(int cols, const m3_mx_params *p) {
    M3_ASSERTF(cols >= 0 && p->block > 0, "cols=%d block=%d", cols, p->block);
    return (int)(((int64_t)cols + p->block - 1) / p->block);
}

int64_t m3_mx_row_bytes(int cols, const m3_mx_params *p) {
    M3_ASSERT(cols >= 0);
    return m3_mx_elem_is_fp4(p->elem) ? ((int64_t)cols + 1) / 2 : (int64_t)cols;
}

typedef struct {
    uint8_t *codes;
    m3_e8m0 *scales;
    float *y;
    const uint8_t *ccodes;
    const m3_e8m0 *cscales;
    const float *x;
    int cols;
    const m3_mx_params *p;
} mx_ctx;

static void mx_quantize_row(void *vctx, int64_t r) {
    const mx_ctx *c = vctx;
    const m3_mx_params *p = c->p;
    int nb = m3_mx_n_blocks(c->cols, p);
    int64_t rb = m3_mx_row_bytes(c->cols, p);
    const float *x = c->x + r * (int64_t)c->cols;
    uint8_t *q = c->codes + r * rb;
    m3_e8m0 *s = c->scales + r * (int64_t)nb;
    bool fp4 = m3_mx_elem_is_fp4(p->elem);
    if (fp4) memset(q, 0, (size_t)rb); /* the unused nibble of an odd row stays 0 */
    for (int b = 0; b < nb; b++) {
        int j0 = b * p->block, n = c->cols - j0 < p->block ? c->cols - j0 : p->block;
        m3_e8m0 sb = m3_mx_block_scale(x + j0, n, p);
        s[b] = sb;
        for (int j = j0; j < j0 + n; j++) {
            uint8_t code = m3_mx_encode(x[j], sb, p);
            if (fp4) m3_fp4_set(q, j, code, p->high_even_nibble);
            else q[j] = code;
        }
    }
}

void m3_mx_quantize(uint8_t *codes, m3_e8m0 *scales, const float *x, int rows, int cols,
                    const m3_mx_params *p) {
    M3_ASSERTF(rows >= 0 && cols >= 0 && p->block > 0, "rows=%d cols=%d block=%d", rows, cols,
               p->block);
    mx_ctx c = {codes, scales, NULL, NULL, NULL, x, cols, p};
    m3_parallel_for(rows, mx_quantize_row, &c);
}

static void mx_dequantize_row(void *vctx, int64_t r) {
    const mx_ctx *c = vctx;
    const m3_mx_params *p = c->p;
    int nb = m3_mx_n_blocks(c->cols, p);
    int64_t rb = m3_mx_row_bytes(c->cols, p);
    float *y = c->y + r * (int64_t)c->cols;
    const uint8_t *q = c->ccodes + r * rb;
    const m3_e8m0 *s = c->cscales + r * (int64_t)nb;
    bool fp4 = m3_mx_elem_is_fp4(p->elem);
    for (int j = 0; j < c->cols; j++) {
        uint8_t code = fp4 ? m3_fp4_get(q, j, p->high_even_nibble) : q[j];
        y[j] = m3_mx_decode(code, s[j / p->block], p->elem);
    }
}

void m3_mx_dequantize(float *y, const uint8_t *codes, const m3_e8m0 *scales, int rows, int cols,
                      const m3_mx_params *p) {
    M3_ASSERTF(rows >= 0 && cols >= 0 && p->block > 0, "rows=%d cols=%d block=%d", rows, cols,
               p->block);
    mx_ctx c = {NULL, NULL, y, codes, scales, NULL, cols, p};
    m3_parallel_for(rows, mx_dequantize_row, &c);
}

/* ---- ptpc fp8 -------------------------------------------------------------------------- */

m3_fp8q_params m3_fp8q_params_default(m3_fp8_kind kind) {
    m3_fp8q_params p;
    p.kind = kind;
    p.ovf = M3_FP8_SATURATE;
    p.zero_row = M3_PTPC_ZERO_NAN;
    p.arith = M3_FP8Q_DIV;
    p.fp8_max = m3_fp8_max(kind);
    return p;
}

typedef struct {
    m3_fp8 *q;
    float *scale;
    const float *x;
    int cols;
    const m3_fp8q_params *p;
} fp8q_ctx;

static void fp8_quantize_row(void *vctx, int64_t r) {
    const fp8q_ctx *c = vctx;
    const m3_fp8q_params *p = c->p;
    const float *x = c->x + r * (int64_t)c->cols;
    m3_fp8 *q = c->q + r * (int64_t)c->cols;
    float amax = 0.0f;
    for (int j = 0; j < c->cols; j++) {
        float a = x[j] < 0 ? -x[j] : x[j];
        if (a != a || a > amax) amax = a; /* NaN (a != a) sticks: later compares are false */
        if (amax != amax) break;
    }
    float s;
    if (amax == 0.0f && p->zero_row == M3_PTPC_ZERO_ONE) s = 1.0f;
    else if (p->arith == M3_FP8Q_RCP) s = amax * (1.0f / p->fp8_max);
    else s = amax / p->fp8_max;
    c->scale[r] = s;
    if (p->arith == M3_FP8Q_RCP) {
        float rs = 1.0f / s;
        for (int j = 0; j < c->cols; j++) q[j] = m3_f32_to_fp8(x[j] * rs, p->kind, p->ovf);
    } else {
        for (int j = 0; j < c->cols; j++) q[j] = m3_f32_to_fp8(x[j] / s, p->kind, p->ovf);
    }
}

void m3_fp8_quantize_rows(m3_fp8 *q, float *scale, const float *x, int rows, int cols,
                          const m3_fp8q_params *p) {
    M3_ASSERTF(rows >= 0 && cols >= 0 && p->fp8_max > 0, "rows=%d cols=%d fp8_max=%g", rows,
               cols, (double)p->fp8_max);
    fp8q_ctx c = {q, scale, x, cols, p};
    m3_parallel_for(rows, fp8_quantize_row, &c);
}

void m3_fp8_dequantize_rows(float *y, const m3_fp8 *q, const float *scale, int rows, int cols,
                            m3_fp8_kind kind) {
    M3_ASSERTF(rows >= 0 && cols >= 0, "rows=%d cols=%d", rows, cols);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++)
            y[r * cols + j] = m3_fp8_to_f32(q[r * cols + j], kind) * scale[r];
}

/* ---- e4m3fn -> e4m3fnuz ---------------------------------------------------------------- */

m3_fp8 m3_fp8_fn_to_fnuz_code(m3_fp8 c) { return c == 0x80u ? (m3_fp8)0x00u : c; }

void m3_fp8_fn_to_fnuz(m3_fp8 *dst, const m3_fp8 *src, int64_t n) {
    M3_ASSERT(n >= 0);
    for (int64_t i = 0; i < n; i++) dst[i] = m3_fp8_fn_to_fnuz_code(src[i]);
}

void m3_fp8_fn_to_fnuz_scales_f32(float *s, int64_t n) {
    M3_ASSERT(n >= 0);
    for (int64_t i = 0; i < n; i++) s[i] *= 2.0f;
}

m3_status m3_fp8_fn_to_fnuz_scales_e8m0(m3_e8m0 *s, int64_t n) {
    M3_ASSERT(n >= 0);
    for (int64_t i = 0; i < n; i++)
        if (s[i] == 0xFEu)
            return m3_errorf(M3_ERR_NUMERIC,
                             "fn_to_fnuz: e8m0 scale %lld is 2^127; doubling it has no e8m0 code",
                             (long long)i);
    for (int64_t i = 0; i < n; i++)
        if (s[i] != 0xFFu) s[i] = (m3_e8m0)(s[i] + 1u);
    return M3_OK;
}
