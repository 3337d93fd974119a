/* compare/compare.c: the comparison engine (see compare.h). */
#include "compare/compare.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "compare/dump.h"

/* Bytes of each side read per chunk. Large enough that HDF5 call overhead vanishes, small
 * enough that memory stays bounded (a few of these buffers exist at once). */
#define CHUNK_BYTES ((int64_t)8 << 20)
/* Elements per parallel block: blocks are fixed by the data, not by the thread count, and
 * merged in order, so the numbers do not depend on M3_THREADS. */
#define BLOCK_ELEMS ((int64_t)1 << 16)

/* ---- keys ---------------------------------------------------------------------------- */

typedef struct {
    const char *key; /* borrowed from the dump's list */
    int pass;
    bool explicit_pass;
    m3_stage_scope scope;
    int layer;
    char stage[64];
    const m3_stage *def;
    int phase, order;
} keyinfo;

static bool parse_num(const char **p, int *out) {
    const char *s = *p;
    int v = 0, n = 0;
    while (*s >= '0' && *s <= '9' && n < 8) v = v * 10 + (*s++ - '0'), n++;
    if (n == 0 || *s != '/') return false;
    *out = v;
    *p = s + 1;
    return true;
}

static bool parse_key(const char *key, keyinfo *k) {
    memset(k, 0, sizeof *k);
    k->key = key;
    k->layer = -1;
    const char *p = key;
    if (!strncmp(p, "passes/", 7)) {
        p += 7;
        if (!parse_num(&p, &k->pass)) return false;
        k->explicit_pass = true;
    }
    if (!strncmp(p, "layers/", 7)) {
        p += 7;
        if (!parse_num(&p, &k->layer)) return false;
        k->scope = M3_SCOPE_LAYER;
    } else if (!strncmp(p, "vision/layers/", 14)) {
        p += 14;
        if (!parse_num(&p, &k->layer)) return false;
        k->scope = M3_SCOPE_VISION;
    } else {
        k->scope = M3_SCOPE_GLOBAL;
    }
    if (!*p || strlen(p) >= sizeof k->stage) return false;
    strcpy(k->stage, p);
    k->def = m3_stage_find(k->stage, k->scope);
    k->order = m3_stage_order(k->def);
    k->phase = k->def ? k->def->phase
                      : (k->scope == M3_SCOPE_LAYER ? 3 : k->scope == M3_SCOPE_VISION ? 1 : 5);
    return true;
}

static int keyinfo_cmp(const keyinfo *a, const keyinfo *b) {
    if (a->pass != b->pass) return a->pass < b->pass ? -1 : 1;
    if (a->phase != b->phase) return a->phase < b->phase ? -1 : 1;
    if (a->layer != b->layer) return a->layer < b->layer ? -1 : 1;
    if (a->order != b->order) return a->order < b->order ? -1 : 1;
    int c = strcmp(a->stage, b->stage);
    if (c) return c;
    return (int)a->scope - (int)b->scope;
}

static int keyinfo_qcmp(const void *x, const void *y) { return keyinfo_cmp(x, y); }

/* Parse and sort a dump's keys; keys outside the schema's shape are skipped. Detects a
 * stage stored both at the root and under passes/0000. */
static m3_status collect(m3_dump *d, char **keys, int n, keyinfo **out, int *n_out) {
    keyinfo *v = calloc((size_t)(n > 0 ? n : 1), sizeof *v);
    if (!v) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    int m = 0;
    for (int i = 0; i < n; i++)
        if (parse_key(keys[i], &v[m])) m++;
        else m3_info("%s: '%s' is not a stage key; ignored", m3_dump_path(d), keys[i]);
    qsort(v, (size_t)m, sizeof *v, keyinfo_qcmp);
    for (int i = 1; i < m; i++)
        if (keyinfo_cmp(&v[i - 1], &v[i]) == 0) {
            m3_status s = m3_errorf(M3_ERR_FORMAT, "%s: '%s' and '%s' are the same stage (a root "
                                    "stage is pass 0)", m3_dump_path(d), v[i - 1].key, v[i].key);
            free(v);
            return s;
        }
    *out = v;
    *n_out = m;
    return M3_OK;
}

/* ---- helpers ------------------------------------------------------------------------- */

typedef struct {
    m3_dump *a, *b;
    const m3_tol *tol;
    int cls;
    float *ba, *bb, *bs; /* chunk buffers (A, B, A's scores) */
    int32_t *ia, *ib;    /* second pair of buffers for WEIGHTS_BY_ID ids */
    size_t cap_a, cap_b, cap_s, cap_ia, cap_ib;
    m3_diff *parts;
    int64_t cap_parts;
    double *kl, *dp; /* per logits row of the whole dataset */
    int64_t *ta, *tb;
    int64_t bytes;
    int64_t off_a, off_b; /* first row read from A / B (logits aligned by position) */
} ctx;

static m3_status grow(void **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return M3_OK;
    void *n = realloc(*p, bytes);
    if (!n) return m3_errorf(M3_ERR_NOMEM, "out of memory (%zu bytes for a chunk)", bytes);
    *p = n;
    *cap = bytes;
    return M3_OK;
}

/* Rows per streamed chunk when one row takes row_bytes: CHUNK_BYTES worth, within [1, rows]. */
static int64_t chunk_rows_of(int64_t rows, int64_t row_bytes) {
    int64_t k = CHUNK_BYTES / (row_bytes > 0 ? row_bytes : 1);
    if (k < 1) k = 1;
    if (k > rows) k = rows;
    return k;
}

/* Plan for streaming a stage of rows x row_elems 4-byte values from A and B: rows per chunk,
 * with both chunk buffers grown to hold one chunk (its size in *bytes unless NULL). */
static m3_status plan_chunks(ctx *c, int64_t rows, int64_t row_elems, int64_t *chunk_rows,
                             size_t *bytes) {
    *chunk_rows = chunk_rows_of(rows, row_elems * 4);
    size_t b = (size_t)(*chunk_rows * row_elems) * 4;
    if (bytes) *bytes = b;
    M3_TRY(grow((void **)&c->ba, &c->cap_a, b));
    return grow((void **)&c->bb, &c->cap_b, b);
}

static void shape_str(const m3_tensor *t, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->rank && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

static bool same_shape(const m3_tensor *x, const m3_tensor *y) {
    if (x->rank != y->rank) return false;
    for (int i = 0; i < x->rank; i++)
        if (x->shape[i] != y->shape[i]) return false;
    return true;
}

static m3_status shape_error(const char *what, const m3_tensor *x, const m3_tensor *y,
                             const char *pa, const char *pb) {
    char sa[96], sb[96];
    shape_str(x, sa, sizeof sa);
    shape_str(y, sb, sizeof sb);
    return m3_errorf(M3_ERR_SHAPE, "%s: shape %s in %s but %s in %s", what, sa, pa, sb, pb);
}

static int64_t rows_of(const m3_tensor *t) { return t->rank ? t->shape[0] : 1; }

/* ---- float and logits ---------------------------------------------------------------- */

typedef struct {
    const float *a, *b;
    int64_t n, inner, block, base;
    double rel_floor;
    m3_diff *parts;
    bool logits;
    int64_t row0; /* global index of the chunk's first logits row */
    double *kl, *dp;
    int64_t *ta, *tb;
} float_job;

static void float_block(void *p, int64_t i) {
    float_job *j = p;
    int64_t lo = i * j->block, hi = lo + j->block < j->n ? lo + j->block : j->n;
    m3_diff_init(&j->parts[i]);
    m3_diff_f32_accum(&j->parts[i], j->a + lo, j->b + lo, hi - lo, j->inner, j->base + lo,
                      j->rel_floor);
    if (j->logits) /* one block = one logits row */
        j->kl[j->row0 + i] = m3_logits_row(j->a + lo, j->b + lo, j->inner, &j->ta[j->row0 + i],
                                           &j->tb[j->row0 + i], &j->dp[j->row0 + i]);
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static m3_status cmp_float(ctx *c, m3_cmp_item *it, const m3_tensor *ma, bool logits) {
    int64_t numel = m3_tensor_numel(ma), rows = rows_of(ma);
    m3_diff_init(&it->diff);
    if (numel == 0) return M3_OK;
    int64_t row_elems = numel / rows;
    int64_t inner = ma->rank ? ma->shape[ma->rank - 1] : 1;
    int64_t chunk_rows;
    M3_TRY(plan_chunks(c, rows, row_elems, &chunk_rows, NULL));
    int64_t block = logits ? inner : (BLOCK_ELEMS / inner) * inner;
    if (block < inner) block = inner;
    int64_t max_parts = (chunk_rows * row_elems + block - 1) / block;
    if (max_parts > c->cap_parts) {
        m3_diff *np = realloc(c->parts, (size_t)max_parts * sizeof *np);
        if (!np) return m3_errorf(M3_ERR_NOMEM, "out of memory");
        c->parts = np;
        c->cap_parts = max_parts;
    }
    int64_t n_lrows = numel / inner;
    if (logits) {
        free(c->kl), free(c->dp), free(c->ta), free(c->tb);
        c->kl = malloc(sizeof(double) * (size_t)n_lrows);
        c->dp = malloc(sizeof(double) * (size_t)n_lrows);
        c->ta = malloc(sizeof(int64_t) * (size_t)n_lrows);
        c->tb = malloc(sizeof(int64_t) * (size_t)n_lrows);
        if (!c->kl || !c->dp || !c->ta || !c->tb) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    }
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
        int64_t nr = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
        M3_TRY(m3_dump_read_rows(c->a, it->key_a, c->off_a + r0, nr, c->ba));
        M3_TRY(m3_dump_read_rows(c->b, it->key_b, c->off_b + r0, nr, c->bb));
        int64_t n = nr * row_elems;
        c->bytes += 2 * n * 4;
        float_job j = {.a = c->ba, .b = c->bb, .n = n, .inner = inner, .block = block,
                       .base = r0 * row_elems, .rel_floor = c->tol->rel_floor, .parts = c->parts,
                       .logits = logits, .row0 = r0 * row_elems / inner, .kl = c->kl, .dp = c->dp,
                       .ta = c->ta, .tb = c->tb};
        int64_t nb = (n + block - 1) / block;
        m3_parallel_for(nb, float_block, &j);
        for (int64_t i = 0; i < nb; i++) m3_diff_merge(&it->diff, &c->parts[i]);
    }
    if (logits) {
        m3_logit_stats *L = &it->logit;
        memset(L, 0, sizeof *L);
        L->rows = n_lrows;
        double sum = 0, sdp = 0;
        int64_t m = 0;
        L->kl_max_row = -1;
        for (int64_t r = 0; r < n_lrows; r++) {
            if (c->ta[r] == c->tb[r]) L->top1_agree++;
            if (isnan(c->kl[r])) {
                L->kl_nan++;
                continue;
            }
            sum += c->kl[r];
            if (L->kl_max_row < 0 || c->kl[r] > L->kl_max) L->kl_max = c->kl[r], L->kl_max_row = r;
            if (!isnan(c->dp[r])) {
                sdp += c->dp[r];
                if (fabs(c->dp[r]) > L->dp_max_abs) L->dp_max_abs = fabs(c->dp[r]);
            }
            c->kl[m++] = c->kl[r]; /* compact the non-NaN values for the percentiles */
        }
        if (m) {
            L->kl_mean = sum / (double)m;
            L->dp_mean = sdp / (double)m;
            qsort(c->kl, (size_t)m, sizeof(double), cmp_double);
            L->kl_median = m % 2 ? c->kl[m / 2] : 0.5 * (c->kl[m / 2 - 1] + c->kl[m / 2]);
            /* nearest-rank 99th percentile */
            int64_t k = (int64_t)ceil(0.99 * (double)m) - 1;
            L->kl_p99 = c->kl[k < 0 ? 0 : k];
        }
    }
    return M3_OK;
}

/* ---- exact --------------------------------------------------------------------------- */

static m3_status cmp_exact(ctx *c, m3_cmp_item *it, const m3_tensor *ma) {
    int64_t numel = m3_tensor_numel(ma), rows = rows_of(ma);
    it->exact_mismatch = 0;
    it->exact_first = -1;
    if (numel == 0) return M3_OK;
    int64_t row_elems = numel / rows, chunk_rows;
    M3_TRY(plan_chunks(c, rows, row_elems, &chunk_rows, NULL));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
        int64_t nr = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
        M3_TRY(m3_dump_read_rows(c->a, it->key_a, r0, nr, c->ba));
        M3_TRY(m3_dump_read_rows(c->b, it->key_b, r0, nr, c->bb));
        c->bytes += 2 * nr * row_elems * 4;
        /* bitwise: for int32 data that is equality; for float data NaN payloads aside */
        const uint32_t *x = (const uint32_t *)(void *)c->ba, *y = (const uint32_t *)(void *)c->bb;
        for (int64_t i = 0; i < nr * row_elems; i++)
            if (x[i] != y[i]) {
                if (it->exact_first < 0) it->exact_first = r0 * row_elems + i;
                it->exact_mismatch++;
            }
    }
    return M3_OK;
}

/* ---- sets ---------------------------------------------------------------------------- */

/* Key of a sibling stage in the same pass/layer: replace the last path component. */
static void sibling(char *out, size_t cap, const char *key, const char *stage) {
    const char *s = strrchr(key, '/');
    int pre = s ? (int)(s - key + 1) : 0;
    snprintf(out, cap, "%.*s%s", pre, key, stage);
}

static m3_status cmp_set(ctx *c, m3_cmp_item *it, const m3_tensor *ma, const m3_tensor *mb) {
    m3_setdiff_init(&it->set);
    int wa = ma->rank ? (int)ma->shape[ma->rank - 1] : 1;
    int wb = mb->rank ? (int)mb->shape[mb->rank - 1] : 1;
    it->width_b = wb;
    int64_t numel = m3_tensor_numel(ma);
    if (numel == 0 || wa == 0) return M3_OK;
    int64_t rows = rows_of(ma), set_rows = numel / wa; /* first-dim rows, set rows */
    int64_t sets_per_row = set_rows / rows;
    /* Reference scores for near-tie classification (A's own): router_logits for experts
     * (score = sigmoid(l) + router_bias when the dump has layers/NN/router_bias [E]; the
     * schema does not require the bias, see docs/compare.md), index_scores for top-k. */
    char skey[200] = "", bkey[200] = "";
    int64_t n_score = 0;
    float *bias = NULL;
    bool expert = it->def && it->def->pair && !strcmp(it->def->pair, "router_logits");
    if (it->def && it->def->pair) {
        sibling(skey, sizeof skey, it->key_a, it->def->pair);
        m3_tensor ms;
        if (m3_dump_has(c->a, skey) && m3_dump_info(c->a, skey, &ms) == M3_OK &&
            ms.dtype == M3_DT_F32 && ms.rank == ma->rank) {
            bool ok = true;
            for (int i = 0; i + 1 < ma->rank; i++) ok &= ms.shape[i] == ma->shape[i];
            if (ok) n_score = ms.shape[ms.rank - 1];
        }
        if (!n_score) skey[0] = 0;
        if (n_score && expert) {
            sibling(bkey, sizeof bkey, it->key_a, "router_bias");
            m3_tensor mt;
            if (m3_dump_has(c->a, bkey) && m3_dump_info(c->a, bkey, &mt) == M3_OK &&
                mt.dtype == M3_DT_F32 && m3_tensor_numel(&mt) == n_score) {
                bias = malloc(sizeof(float) * (size_t)n_score);
                if (!bias) return m3_errorf(M3_ERR_NOMEM, "out of memory");
                m3_status s = m3_dump_read_rows(c->a, bkey, 0, rows_of(&mt), bias);
                if (s != M3_OK) {
                    free(bias);
                    return s;
                }
            }
        }
    }
    it->set_scored = n_score > 0;
    int64_t per_row_bytes = sets_per_row * (wa + wb + n_score) * 4;
    int64_t chunk_rows = chunk_rows_of(rows, per_row_bytes);
    m3_status st = M3_OK;
    if ((st = grow((void **)&c->ba, &c->cap_a, (size_t)(chunk_rows * sets_per_row * wa) * 4)) ||
        (st = grow((void **)&c->bb, &c->cap_b, (size_t)(chunk_rows * sets_per_row * wb) * 4)) ||
        (st = grow((void **)&c->bs, &c->cap_s, (size_t)(chunk_rows * sets_per_row * (n_score + 1)) * 4)))
        goto done;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
        int64_t nr = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
        if ((st = m3_dump_read_rows(c->a, it->key_a, r0, nr, c->ba)) ||
            (st = m3_dump_read_rows(c->b, it->key_b, r0, nr, c->bb)))
            goto done;
        c->bytes += nr * sets_per_row * (wa + wb) * 4;
        if (n_score) {
            if ((st = m3_dump_read_rows(c->a, skey, r0, nr, c->bs))) goto done;
            c->bytes += nr * sets_per_row * n_score * 4;
            if (expert) /* selection score of §3.12: sigmoid(logit) + bias */
                for (int64_t i = 0; i < nr * sets_per_row * n_score; i++) {
                    double l = c->bs[i];
                    c->bs[i] = (float)(1.0 / (1.0 + exp(-l)) + (bias ? (double)bias[i % n_score] : 0.0));
                }
        }
        m3_setdiff_rows(&it->set, (const int32_t *)(void *)c->ba, wa, (const int32_t *)(void *)c->bb,
                        wb, nr * sets_per_row, n_score ? c->bs : NULL, n_score, it->tol->tie_abs,
                        it->tol->tie_rel, r0 * sets_per_row);
    }
done:
    free(bias);
    return st;
}

/* ---- routing weights aligned with ids ------------------------------------------------ */

static m3_status cmp_weights(ctx *c, m3_cmp_item *it, const m3_tensor *ma) {
    m3_diff_init(&it->diff);
    it->rows_skipped = 0;
    char ida[200], idb[200];
    sibling(ida, sizeof ida, it->key_a, it->def->pair);
    sibling(idb, sizeof idb, it->key_b, it->def->pair);
    m3_tensor mia, mib;
    if (!m3_dump_has(c->a, ida) || !m3_dump_has(c->b, idb) || m3_dump_info(c->a, ida, &mia) ||
        m3_dump_info(c->b, idb, &mib) || !same_shape(&mia, ma) || !same_shape(&mib, ma) ||
        mia.dtype != M3_DT_I32 || mib.dtype != M3_DT_I32 || ma->rank < 1) {
        /* no usable ids: compare position by position */
        m3_clear_error();
        return cmp_float(c, it, ma, false);
    }
    int64_t numel = m3_tensor_numel(ma), rows = rows_of(ma);
    if (numel == 0) return M3_OK;
    int w = (int)ma->shape[ma->rank - 1];
    int64_t row_elems = numel / rows, chunk_rows;
    size_t bytes;
    M3_TRY(plan_chunks(c, rows, row_elems, &chunk_rows, &bytes));
    M3_TRY(grow((void **)&c->ia, &c->cap_ia, bytes));
    M3_TRY(grow((void **)&c->ib, &c->cap_ib, bytes));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
        int64_t nr = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
        M3_TRY(m3_dump_read_rows(c->a, it->key_a, r0, nr, c->ba));
        M3_TRY(m3_dump_read_rows(c->b, it->key_b, r0, nr, c->bb));
        M3_TRY(m3_dump_read_rows(c->a, ida, r0, nr, c->ia));
        M3_TRY(m3_dump_read_rows(c->b, idb, r0, nr, c->ib));
        c->bytes += 4 * nr * row_elems * 4;
        int64_t n_sets = nr * row_elems / w;
        for (int64_t s = 0; s < n_sets; s++) {
            int32_t *xa = c->ia + s * w, *xb = c->ib + s * w;
            float *wa = c->ba + s * w, *wb = c->bb + s * w;
            if (!m3_same_id_set(xa, w, xb, w)) {
                it->rows_skipped++;
                continue;
            }
            m3_sort_by_id(xa, wa, w);
            m3_sort_by_id(xb, wb, w);
            int nv = 0;
            while (nv < w && xa[nv] >= 0) nv++;
            if (nv && memcmp(xa, xb, sizeof(int32_t) * (size_t)nv) != 0) { /* duplicate ids */
                it->rows_skipped++;
                continue;
            }
            if (nv) m3_diff_f32_accum(&it->diff, wa, wb, nv, nv, r0 * row_elems + s * w,
                                      c->tol->rel_floor);
        }
    }
    return M3_OK;
}

/* ---- judging ------------------------------------------------------------------------- */

static void judge(const m3_cmp_report *r, m3_cmp_item *it, int cls) {
    const m3_tol_row *t = it->tol;
    it->status = M3_CMP_PASS;
    it->why[0] = 0;
    char idx[64];
#define FAILF(...)                                                                                \
    do {                                                                                          \
        it->status = M3_CMP_FAIL;                                                                 \
        snprintf(it->why, sizeof it->why, __VA_ARGS__);                                           \
        return;                                                                                   \
    } while (0)
    (void)r;
    switch (it->kind) {
    case M3_STAGE_EXACT:
        if (it->exact_mismatch) {
            m3_cmp_format_index(it, it->exact_first, idx, sizeof idx);
            FAILF("%lld elements differ (first at %s)", (long long)it->exact_mismatch, idx);
        }
        return;
    case M3_STAGE_INDEX_SET: {
        double f = it->set.rows ? (double)it->set.flips_real / (double)it->set.rows : 0;
        if (f > t->flip[cls])
            FAILF("%lld of %lld rows have real set flips (%.4g > %.4g)%s",
                  (long long)it->set.flips_real, (long long)it->set.rows, f, t->flip[cls],
                  it->set_scored ? "" : "; no reference scores to spot near-ties");
        return;
    }
    default:
        break;
    }
    if (it->diff.nonfinite_mismatch) {
        m3_cmp_format_index(it, it->diff.first_mismatch, idx, sizeof idx);
        FAILF("%lld non-finite mismatches (NaN/Inf in one side only), first at %s",
              (long long)it->diff.nonfinite_mismatch, idx);
    }
    double e = m3_diff_nmse(&it->diff);
    if (e > t->nmse[cls]) FAILF("NMSE %.3g > %.3g", e, t->nmse[cls]);
    if (it->kind == M3_STAGE_LOGITS) {
        const m3_logit_stats *L = &it->logit;
        if (L->kl_nan) FAILF("KL undefined on %lld positions", (long long)L->kl_nan);
        if (L->kl_mean > t->kl_mean[cls]) FAILF("mean KL %.3g > %.3g", L->kl_mean, t->kl_mean[cls]);
        double top1 = L->rows ? (double)L->top1_agree / (double)L->rows : 1.0;
        if (top1 < t->top1_min[cls]) FAILF("top-1 agreement %.4g < %.4g", top1, t->top1_min[cls]);
    }
#undef FAILF
}

double m3_cmp_item_error(const m3_cmp_item *it) {
    switch (it->kind) {
    case M3_STAGE_INDEX_SET: return 1.0 - m3_setdiff_agree(&it->set);
    case M3_STAGE_EXACT: {
        int64_t n = 1;
        for (int i = 0; i < it->rank; i++) n *= it->shape[i];
        return n ? (double)it->exact_mismatch / (double)n : 0.0;
    }
    default: return m3_diff_nmse(&it->diff);
    }
}

/* ---- driver -------------------------------------------------------------------------- */

static void get_attr(m3_dump *d, const char *name, char *out, size_t cap) {
    char *s = NULL;
    if (m3_dump_get_attr_str(d, name, &s) == M3_OK) {
        snprintf(out, cap, "%s", s);
        free(s);
    } else {
        snprintf(out, cap, "?");
    }
    m3_clear_error();
}

/* The absolute positions of a logits dataset's rows: its "positions" attribute when the
 * producer kept only some rows (dump-schema: [t,V] with attribute positions), else the
 * pass's `positions` stage, else 0..rows-1. *pos malloc'd. */
static m3_status logit_positions(m3_dump *d, const char *key, int64_t rows, int64_t **pos) {
    int64_t n = 0;
    *pos = NULL;
    if (m3_dump_get_dset_attr_ints(d, key, "positions", pos, &n) == M3_OK) {
        if (n != rows) {
            free(*pos);
            *pos = NULL;
            return m3_errorf(M3_ERR_FORMAT, "%s: attribute positions has %lld entries for %lld rows",
                             key, (long long)n, (long long)rows);
        }
        return M3_OK;
    }
    m3_clear_error();
    *pos = malloc(sizeof(int64_t) * (size_t)(rows ? rows : 1));
    if (!*pos) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    char pkey[512];
    sibling(pkey, sizeof pkey, key, "positions");
    m3_tensor t = {0};
    if (m3_dump_has(d, pkey) && m3_dump_read(d, pkey, &t) == M3_OK && t.dtype == M3_DT_I32 &&
        t.rank == 1 && t.shape[0] == rows) {
        for (int64_t i = 0; i < rows; i++) (*pos)[i] = ((const int32_t *)t.data)[i];
    } else {
        for (int64_t i = 0; i < rows; i++) (*pos)[i] = i;
    }
    m3_tensor_free(&t);
    m3_clear_error();
    return M3_OK;
}

/* Logits of different row counts: compare the rows whose positions both dumps hold. They must
 * form one run of consecutive positions on both sides (a producer keeps the last t rows);
 * sets c->off_a / c->off_b and shrinks ma to the common rows. */
static m3_status align_logits(ctx *c, m3_cmp_report *r, m3_cmp_item *it, m3_tensor *ma,
                              const m3_tensor *mb) {
    int64_t *pa = NULL, *pb = NULL;
    m3_status st = logit_positions(c->a, it->key_a, ma->shape[0], &pa);
    if (!st) st = logit_positions(c->b, it->key_b, mb->shape[0], &pb);
    int64_t ia = -1, ib = -1, n = 0;
    if (!st) { /* first common position, then the common run */
        for (int64_t i = 0; i < ma->shape[0] && ia < 0; i++)
            for (int64_t k = 0; k < mb->shape[0]; k++)
                if (pa[i] == pb[k]) {
                    ia = i, ib = k;
                    break;
                }
        while (ia >= 0 && ia + n < ma->shape[0] && ib + n < mb->shape[0] &&
               pa[ia + n] == pb[ib + n])
            n++;
        int64_t common = 0; /* every shared position must lie in that run */
        for (int64_t i = 0; i < ma->shape[0]; i++)
            for (int64_t k = 0; k < mb->shape[0]; k++) common += pa[i] == pb[k];
        if (n == 0)
            st = m3_errorf(M3_ERR_SHAPE, "%s: the logits of %s and %s share no position", it->key_a,
                           r->path_a, r->path_b);
        else if (common != n)
            st = m3_errorf(M3_ERR_SHAPE, "%s: the positions the two dumps' logits share are not "
                           "one consecutive run", it->key_a);
    }
    if (!st) {
        c->off_a = ia;
        c->off_b = ib;
        ma->shape[0] = n;
        it->shape[0] = n;
    }
    free(pa);
    free(pb);
    return st;
}

static m3_status compare_item(ctx *c, m3_cmp_report *r, m3_cmp_item *it) {
    m3_tensor ma, mb;
    M3_TRY(m3_dump_info(c->a, it->key_a, &ma));
    M3_TRY(m3_dump_info(c->b, it->key_b, &mb));
    it->rank = ma.rank;
    memcpy(it->shape, ma.shape, sizeof it->shape);
    it->kind = it->def ? it->def->kind : M3_STAGE_FLOAT;
    /* the data decides where the table cannot: int32 data is compared exactly, and a
     * set stage holding floats is a producer bug */
    if (it->kind == M3_STAGE_INDEX_SET) {
        if (ma.dtype != M3_DT_I32 || mb.dtype != M3_DT_I32)
            return m3_errorf(M3_ERR_FORMAT, "%s: '%s' must be int32 in both dumps", it->stage,
                             ma.dtype != M3_DT_I32 ? r->path_a : r->path_b);
        bool lead = ma.rank == mb.rank && ma.rank >= 1;
        for (int i = 0; lead && i + 1 < ma.rank; i++) lead = ma.shape[i] == mb.shape[i];
        if (!lead) return shape_error(it->key_a, &ma, &mb, r->path_a, r->path_b);
        return cmp_set(c, it, &ma, &mb);
    }
    if (ma.dtype != mb.dtype)
        return m3_errorf(M3_ERR_FORMAT, "%s: %s in %s but %s in %s", it->key_a,
                         ma.dtype == M3_DT_F32 ? "float" : "int32", r->path_a,
                         mb.dtype == M3_DT_F32 ? "float" : "int32", r->path_b);
    c->off_a = c->off_b = 0;
    if (it->kind == M3_STAGE_LOGITS && ma.rank == 2 && mb.rank == 2 &&
        ma.shape[1] == mb.shape[1] && ma.shape[0] != mb.shape[0]) {
        M3_TRY(align_logits(c, r, it, &ma, &mb));
        return cmp_float(c, it, &ma, true);
    }
    if (!same_shape(&ma, &mb)) {
        if (!strcmp(it->stage, "tokens") && ma.rank == 1 && mb.rank == 1)
            return m3_errorf(M3_ERR_SHAPE, "different token counts: %s has T=%lld, %s has T=%lld "
                             "(%s); dumps of different inputs cannot be compared",
                             r->path_a, (long long)ma.shape[0], r->path_b, (long long)mb.shape[0],
                             it->key_a);
        return shape_error(it->key_a, &ma, &mb, r->path_a, r->path_b);
    }
    if (ma.dtype == M3_DT_I32) it->kind = M3_STAGE_EXACT;
    switch (it->kind) {
    case M3_STAGE_EXACT: return cmp_exact(c, it, &ma);
    case M3_STAGE_LOGITS: return cmp_float(c, it, &ma, true);
    case M3_STAGE_WEIGHTS_BY_ID: return cmp_weights(c, it, &ma);
    default: return cmp_float(c, it, &ma, false);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill_item(m3_cmp_item *it, const keyinfo *k) {
    snprintf(it->stage, sizeof it->stage, "%s", k->stage);
    it->pass = k->pass;
    it->scope = k->scope;
    it->layer = k->layer;
    it->def = k->def;
    it->kind = k->def ? k->def->kind : M3_STAGE_FLOAT;
}

m3_status m3_compare_dumps(m3_cmp_report **out, const char *path_a, const char *path_b,
                           const m3_tol *tol, const m3_cmp_opts *opts) {
    *out = NULL;
    double t0 = now_s();
    m3_status st = M3_OK;
    ctx c = {.tol = tol};
    char **ka = NULL, **kb = NULL;
    int nka = 0, nkb = 0, na = 0, nb = 0;
    keyinfo *ia = NULL, *ib = NULL;
    m3_cmp_report *r = calloc(1, sizeof *r);
    if (!r) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    snprintf(r->path_a, sizeof r->path_a, "%s", path_a);
    snprintf(r->path_b, sizeof r->path_b, "%s", path_b);
    r->first_fail = r->worst = -1;
    r->rel_floor = tol->rel_floor;
    if ((st = m3_dump_open(&c.a, path_a, M3_DUMP_READ)) || (st = m3_dump_open(&c.b, path_b, M3_DUMP_READ)))
        goto done;
    get_attr(c.a, "producer", r->producer_a, sizeof r->producer_a);
    get_attr(c.b, "producer", r->producer_b, sizeof r->producer_b);
    get_attr(c.a, "profile", r->profile_a, sizeof r->profile_a);
    get_attr(c.b, "profile", r->profile_b, sizeof r->profile_b);
    get_attr(c.a, "variant", r->variant_a, sizeof r->variant_a);
    get_attr(c.b, "variant", r->variant_b, sizeof r->variant_b);
    r->tol_class = m3_tol_class(tol, r->profile_a, r->profile_b, r->variant_a, r->variant_b);
    if ((st = m3_dump_list(c.a, &ka, &nka)) || (st = m3_dump_list(c.b, &kb, &nkb))) goto done;
    if ((st = collect(c.a, ka, nka, &ia, &na)) || (st = collect(c.b, kb, nkb, &ib, &nb))) goto done;
    r->items = calloc((size_t)(na + nb + 1), sizeof *r->items);
    if (!r->items) { st = m3_errorf(M3_ERR_NOMEM, "out of memory"); goto done; }
    /* merge the two sorted key lists: execution order, union of both */
    for (int i = 0, j = 0; i < na || j < nb;) {
        int cmp = i >= na ? 1 : j >= nb ? -1 : keyinfo_cmp(&ia[i], &ib[j]);
        const keyinfo *k = cmp <= 0 ? &ia[i] : &ib[j];
        if (opts && opts->pass >= 0 && k->pass != opts->pass) {
            if (cmp <= 0) i++;
            if (cmp >= 0) j++;
            continue;
        }
        m3_cmp_item *it = &r->items[r->n_items++];
        fill_item(it, k);
        it->tol = m3_tol_find(tol, it->stage);
        if (cmp <= 0) snprintf(it->key_a, sizeof it->key_a, "%s", ia[i++].key);
        if (cmp >= 0) snprintf(it->key_b, sizeof it->key_b, "%s", ib[j++].key);
    }
    /* inputs first: different token counts make every other number meaningless */
    int n_both = 0;
    for (int i = 0; i < r->n_items; i++) {
        m3_cmp_item *it = &r->items[i];
        if (!it->key_a[0] || !it->key_b[0]) continue;
        n_both++;
        if (it->scope == M3_SCOPE_GLOBAL && !strcmp(it->stage, "tokens")) {
            if ((st = compare_item(&c, r, it))) goto done;
            if (it->exact_mismatch) {
                char idx[64];
                m3_cmp_format_index(it, it->exact_first, idx, sizeof idx);
                st = m3_errorf(M3_ERR_SHAPE, "%s: token ids differ from %s at %s (%lld positions): "
                               "dumps of different inputs cannot be compared", path_b, path_a, idx,
                               (long long)it->exact_mismatch);
                goto done;
            }
        }
    }
    if (n_both == 0) {
        st = m3_errorf(M3_ERR_MISSING, "%s and %s have no stage in common%s", path_a, path_b,
                       opts && opts->pass >= 0 ? " in the selected pass" : "");
        goto done;
    }
    double worst = -1;
    for (int i = 0; i < r->n_items; i++) {
        m3_cmp_item *it = &r->items[i];
        if (!it->key_b[0]) {
            it->status = M3_CMP_ONLY_A;
            r->n_only_a++;
            continue;
        }
        if (!it->key_a[0]) {
            it->status = M3_CMP_ONLY_B;
            r->n_only_b++;
            continue;
        }
        if (!(it->scope == M3_SCOPE_GLOBAL && !strcmp(it->stage, "tokens")))
            if ((st = compare_item(&c, r, it))) {
                /* most messages name the stage already */
                if (!strstr(m3_last_error(), it->key_a)) m3_error_context(st, "%s", it->key_a);
                goto done;
            }
        judge(r, it, r->tol_class);
        if (it->status == M3_CMP_FAIL) {
            r->n_fail++;
            if (r->first_fail < 0) r->first_fail = i;
        } else {
            r->n_pass++;
        }
        if (it->kind == M3_STAGE_FLOAT || it->kind == M3_STAGE_LOGITS || it->kind == M3_STAGE_WEIGHTS_BY_ID) {
            double e = m3_diff_nmse(&it->diff);
            if (it->diff.n_cmp && (e > worst || r->worst < 0)) worst = e, r->worst = i;
        }
    }
done:
    m3_dump_close(c.a);
    m3_dump_close(c.b);
    m3_dump_list_free(ka, nka);
    m3_dump_list_free(kb, nkb);
    free(ia);
    free(ib);
    free(c.ba), free(c.bb), free(c.bs), free(c.ia), free(c.ib), free(c.parts);
    free(c.kl), free(c.dp), free(c.ta), free(c.tb);
    if (st != M3_OK) {
        m3_cmp_report_free(r);
        return st;
    }
    r->bytes = c.bytes;
    r->seconds = now_s() - t0;
    *out = r;
    return M3_OK;
}

void m3_cmp_report_free(m3_cmp_report *r) {
    if (!r) return;
    free(r->items);
    free(r);
}

int m3_cmp_exit_code(const m3_cmp_report *r) { return r->n_fail ? 1 : 0; }

void m3_cmp_item_name(const m3_cmp_report *r, const m3_cmp_item *it, char *buf, size_t cap) {
    bool multi = false;
    for (int i = 0; i < r->n_items && !multi; i++) multi = r->items[i].pass != 0;
    int max_layer = 0;
    for (int i = 0; i < r->n_items; i++)
        if (r->items[i].layer > max_layer) max_layer = r->items[i].layer;
    char pre[24] = "";
    if (multi) snprintf(pre, sizeof pre, "passes/%04d/", it->pass);
    int dig = m3_dump_layer_digits(max_layer + 1);
    if (it->scope == M3_SCOPE_LAYER)
        snprintf(buf, cap, "%slayers/%0*d/%s", pre, dig, it->layer, it->stage);
    else if (it->scope == M3_SCOPE_VISION)
        snprintf(buf, cap, "%svision/layers/%0*d/%s", pre, dig, it->layer, it->stage);
    else
        snprintf(buf, cap, "%s%s", pre, it->stage);
}

int64_t m3_cmp_unravel(const m3_cmp_item *it, int64_t flat, int64_t idx[M3_MAX_RANK]) {
    for (int i = it->rank - 1; i >= 0; i--) {
        int64_t d = it->shape[i] > 0 ? it->shape[i] : 1;
        idx[i] = flat % d;
        flat /= d;
    }
    return flat;
}

void m3_cmp_format_index(const m3_cmp_item *it, int64_t flat, char *buf, size_t cap) {
    if (flat < 0) {
        snprintf(buf, cap, "-");
        return;
    }
    int64_t idx[M3_MAX_RANK];
    flat = m3_cmp_unravel(it, flat, idx);
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < it->rank && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)idx[i]);
    if (it->rank == 0 && k < cap) k += (size_t)snprintf(buf + k, cap - k, "%lld", (long long)flat);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* ---- output files -------------------------------------------------------------------- */

FILE *m3_report_open(const char *path, char *tmp, size_t cap) {
    struct stat sb;
    if (!path[0]) {
        m3_errorf(M3_ERR_ARG, "empty output file name");
        return NULL;
    }
    /* a directory could never be replaced by the rename at commit: say so now */
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        m3_errorf(M3_ERR_IO, "%s: is a directory", path);
        return NULL;
    }
    snprintf(tmp, cap, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) m3_errorf(M3_ERR_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    return f;
}

m3_status m3_report_commit(FILE *f, const char *tmp, const char *path) {
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = true;
    if (bad) {
        unlink(tmp);
        return m3_errorf(M3_ERR_IO, "%s: write failed (disk full?)", tmp);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return m3_errorf(M3_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp, strerror(e));
    }
    return M3_OK;
}
