/* ref/kvcache.c: see kvcache.h. Plain element addressing; no threads (writers touch one
 * token row, readers one head row). */
#include "ref/kvcache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int m3_kv_elem_bytes(m3_kv_elem e) {
    return e == M3_KV_F32 ? 4 : e == M3_KV_BF16 ? 2 : 1;
}

int m3_kv_default_page(int block) {
    return block % 8 == 0 ? block / 8 : block;
}

static int64_t cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

void m3_kv_geom_init(m3_kv_geom *g, int n_kv, int head_dim, int block, int page, m3_kv_elem elem,
                     m3_fp8_kind kind) {
    M3_ASSERT(n_kv > 0 && head_dim > 0 && block > 0);
    if (page <= 0) page = m3_kv_default_page(block);
    M3_ASSERTF(block % page == 0, "block %d is not a multiple of page %d", block, page);
    memset(g, 0, sizeof *g);
    g->n_kv = n_kv;
    g->head_dim = head_dim;
    g->block = block;
    g->page = page;
    g->elem = elem;
    g->fp8_kind = kind;
    g->elem_bytes = m3_kv_elem_bytes(elem);
    g->x = 16 / g->elem_bytes;
    g->dx = (int)cdiv(head_dim, g->x);
    /* K: Hkv * dx * (tokens) * x per block in either view (Bs = ppb * P) */
    g->k_block = (int64_t)n_kv * g->dx * block * g->x;
    g->v_block_dense = (int64_t)n_kv * cdiv(block, g->x) * head_dim * g->x;
    g->v_page = (int64_t)n_kv * cdiv(page, g->x) * head_dim * g->x;
    int64_t vs = (int64_t)(block / page) * g->v_page;
    g->v_stride = vs > g->v_block_dense ? vs : g->v_block_dense;
}

/* Start of page q of the re-view inside the block regions (spec: q * page size when no
 * padding exists; see the header). */
static int64_t page_base(int64_t q, int ppb, int64_t stride, int64_t page_elems) {
    return (q / ppb) * stride + (q % ppb) * page_elems;
}

int64_t m3_kv_off_k(const m3_kv_geom *g, m3_kv_view view, int64_t slot, int h, int dim) {
    const int x = g->x;
    if (view == M3_KV_VIEW_BLOCK) {
        int64_t b = slot / g->block, t = slot % g->block;
        return ((b * g->n_kv + h) * g->dx + dim / x) * ((int64_t)g->block * x) + t * x + dim % x;
    }
    int ppb = g->block / g->page;
    int64_t q = slot / g->page, t = slot % g->page;
    int64_t pk = (int64_t)g->n_kv * g->dx * g->page * x;
    return page_base(q, ppb, g->k_block, pk) +
           ((int64_t)h * g->dx + dim / x) * ((int64_t)g->page * x) + t * x + dim % x;
}

int64_t m3_kv_off_v(const m3_kv_geom *g, m3_kv_view view, int64_t slot, int h, int dim) {
    const int x = g->x;
    if (view == M3_KV_VIEW_BLOCK) {
        int64_t b = slot / g->block, t = slot % g->block;
        return b * g->v_stride +
               ((int64_t)h * cdiv(g->block, x) + t / x) * ((int64_t)g->head_dim * x) +
               (int64_t)dim * x + t % x;
    }
    int ppb = g->block / g->page;
    int64_t q = slot / g->page, t = slot % g->page;
    return page_base(q, ppb, g->v_stride, g->v_page) +
           ((int64_t)h * cdiv(g->page, x) + t / x) * ((int64_t)g->head_dim * x) + (int64_t)dim * x +
           t % x;
}

int64_t m3_kv_off_scale(const m3_kv_geom *g, m3_kv_view view, int64_t slot, int h) {
    int P = view == M3_KV_VIEW_BLOCK ? g->block : g->page;
    int64_t q = slot / P, t = slot % P;
    return (q * g->n_kv + h) * P + t;
}

/* ---- block table -------------------------------------------------------------------------- */

static m3_status grow_pool(m3_block_table *bt, int need_free) {
    int add = bt->n_pool > 0 ? bt->n_pool : 4;
    if (add < need_free) add = need_free;
    int n = bt->n_pool + add;
    int32_t *f = realloc(bt->free_ids, (size_t)(bt->n_free + add) * sizeof *f);
    if (!f) return m3_errorf(M3_ERR_NOMEM, "block pool of %d blocks: out of memory", n);
    bt->free_ids = f;
    /* the stack top is handed out first: push ascending so that the highest id goes first */
    for (int i = 0; i < add; i++)
        bt->free_ids[bt->n_free++] = bt->n_pool + i;
    bt->n_pool = n;
    return M3_OK;
}

m3_status m3_block_table_reserve(m3_block_table *bt, int n_logical) {
    if (n_logical <= bt->n_logical) return M3_OK;
    if (n_logical > bt->cap_logical) {
        int cap = bt->cap_logical > 0 ? bt->cap_logical : 8;
        while (cap < n_logical)
            cap *= 2;
        int32_t *p = realloc(bt->phys, (size_t)cap * sizeof *p);
        if (!p) return m3_errorf(M3_ERR_NOMEM, "block table of %d blocks: out of memory", cap);
        bt->phys = p;
        bt->cap_logical = cap;
    }
    int need = n_logical - bt->n_logical;
    if (bt->n_free < need) M3_TRY(grow_pool(bt, need - bt->n_free));
    while (bt->n_logical < n_logical)
        bt->phys[bt->n_logical++] = bt->free_ids[--bt->n_free];
    return M3_OK;
}

m3_status m3_block_table_set(m3_block_table *bt, const int32_t *phys, int n, int n_pool) {
    m3_block_table_free(bt);
    bt->phys = malloc((size_t)(n > 0 ? n : 1) * sizeof *bt->phys);
    if (!bt->phys) return m3_errorf(M3_ERR_NOMEM, "block table: out of memory");
    for (int i = 0; i < n; i++) {
        M3_ASSERTF(phys[i] >= 0 && phys[i] < n_pool, "block %d -> %d outside pool %d", i, phys[i],
                   n_pool);
        for (int j = 0; j < i; j++)
            M3_ASSERTF(phys[j] != phys[i], "physical block %d mapped twice", phys[i]);
        bt->phys[i] = phys[i];
    }
    bt->n_logical = bt->cap_logical = n;
    bt->n_pool = n_pool;
    return M3_OK;
}

void m3_block_table_free(m3_block_table *bt) {
    if (!bt) return;
    free(bt->phys);
    free(bt->free_ids);
    memset(bt, 0, sizeof *bt);
}

int64_t m3_block_table_slot(const m3_block_table *bt, int block, int p) {
    int b = p / block;
    M3_ASSERTF(p >= 0 && b < bt->n_logical, "position %d: logical block %d not mapped (%d)", p, b,
               bt->n_logical);
    return (int64_t)bt->phys[b] * block + p % block;
}

/* ---- layer storage -------------------------------------------------------------------------- */

void m3_kv_layer_init(m3_kv_layer *kl, const m3_kv_geom *g, m3_kv_view view, int index_dim,
                      m3_kv_elem index_elem) {
    memset(kl, 0, sizeof *kl);
    kl->g = *g;
    kl->view = view;
    kl->index_dim = index_dim;
    kl->index_elem = index_elem;
}

static m3_status grow(void **p, size_t bytes) {
    void *n = realloc(*p, bytes);
    if (!n) return m3_errorf(M3_ERR_NOMEM, "paged cache of %zu bytes: out of memory", bytes);
    *p = n;
    return M3_OK;
}

m3_status m3_kv_layer_reserve(m3_kv_layer *kl, int n_blocks) {
    if (n_blocks <= kl->n_blocks) return M3_OK;
    const m3_kv_geom *g = &kl->g;
    size_t eb = (size_t)g->elem_bytes, nb = (size_t)n_blocks;
    /* zero-filled growth: padding elements stay 0 and reads of unwritten slots are defined */
    size_t k0 = (size_t)kl->n_blocks * (size_t)g->k_block * eb, k1 = nb * (size_t)g->k_block * eb;
    size_t v0 = (size_t)kl->n_blocks * (size_t)g->v_stride * eb, v1 = nb * (size_t)g->v_stride * eb;
    M3_TRY(grow((void **)&kl->k, k1));
    memset(kl->k + k0, 0, k1 - k0);
    M3_TRY(grow((void **)&kl->v, v1));
    memset(kl->v + v0, 0, v1 - v0);
    if (g->elem == M3_KV_FP8) {
        size_t s0 = (size_t)kl->n_blocks * g->n_kv * g->block, s1 = nb * g->n_kv * g->block;
        M3_TRY(grow((void **)&kl->k_scale, s1 * sizeof(float)));
        M3_TRY(grow((void **)&kl->v_scale, s1 * sizeof(float)));
        for (size_t i = s0; i < s1; i++)
            kl->k_scale[i] = kl->v_scale[i] = 1.0f;
    }
    if (kl->index_dim > 0) {
        size_t ie = (size_t)m3_kv_elem_bytes(kl->index_elem);
        size_t row = (size_t)g->block * (size_t)kl->index_dim * ie;
        M3_TRY(grow((void **)&kl->index_k, nb * row));
        memset(kl->index_k + (size_t)kl->n_blocks * row, 0, (nb - (size_t)kl->n_blocks) * row);
    }
    kl->n_blocks = n_blocks;
    return M3_OK;
}

void m3_kv_layer_free(m3_kv_layer *kl) {
    if (!kl) return;
    free(kl->k);
    free(kl->v);
    free(kl->k_scale);
    free(kl->v_scale);
    free(kl->index_k);
    kl->k = kl->v = kl->index_k = NULL;
    kl->k_scale = kl->v_scale = NULL;
    kl->n_blocks = 0;
}

/* ---- element access ---------------------------------------------------------------------------
 */

static void put(uint8_t *base, m3_kv_elem e, int64_t off, float v, m3_fp8_kind kind,
                m3_fp8_overflow ovf) {
    switch (e) {
    case M3_KV_F32:
        memcpy(base + off * 4, &v, 4);
        break;
    case M3_KV_BF16: {
        m3_bf16 b = m3_f32_to_bf16(v);
        memcpy(base + off * 2, &b, 2);
        break;
    }
    case M3_KV_FP8:
        base[off] = m3_f32_to_fp8(v, kind, ovf);
        break;
    }
}

static float get(const uint8_t *base, m3_kv_elem e, int64_t off, m3_fp8_kind kind) {
    switch (e) {
    case M3_KV_F32: {
        float f;
        memcpy(&f, base + off * 4, 4);
        return f;
    }
    case M3_KV_BF16: {
        m3_bf16 b;
        memcpy(&b, base + off * 2, 2);
        return m3_bf16_to_f32(b);
    }
    case M3_KV_FP8:
        return m3_fp8_to_f32(base[off], kind);
    }
    return NAN;
}

static float amax_of(const float *x, int n) {
    float a = 0.0f;
    for (int i = 0; i < n; i++) {
        float v = fabsf(x[i]);
        if (v > a || isnan(v)) a = v; /* NaN poisons the scale, as max() would */
    }
    return a;
}

/* scale = amax / fp8_max, 1.0 when amax = 0 (§4.7) */
static float fp8_scale(float amax, float fp8_max) {
    return amax == 0.0f ? 1.0f : amax / fp8_max;
}

void m3_kv_write(m3_kv_layer *kl, int64_t slot, const float *k_val, const float *k_amax,
                 const float *v, const m3_kv_writer *w) {
    const m3_kv_geom *g = &kl->g;
    const int Dh = g->head_dim;
    M3_ASSERTF(slot >= 0 && slot < (int64_t)kl->n_blocks * g->block, "slot %lld outside %d blocks",
               (long long)slot, kl->n_blocks);
    m3_fp8_overflow ovf = w ? w->ovf : M3_FP8_SATURATE;
    for (int h = 0; h < g->n_kv; h++) {
        const float *kh = k_val + (size_t)h * Dh, *vh = v + (size_t)h * Dh;
        float ks = 1.0f, vs = 1.0f;
        if (g->elem == M3_KV_FP8) {
            M3_ASSERT(w && w->fp8_max > 0.0f);
            ks = fp8_scale(amax_of(k_amax + (size_t)h * Dh, Dh), w->fp8_max);
            vs = fp8_scale(amax_of(vh, Dh), w->fp8_max);
            int64_t so = m3_kv_off_scale(g, kl->view, slot, h);
            kl->k_scale[so] = ks;
            kl->v_scale[so] = vs;
        }
        for (int d = 0; d < Dh; d++) {
            /* a true fp32 division, then one RNE cast (§4.7) */
            float kv = g->elem == M3_KV_FP8 ? kh[d] / ks : kh[d];
            float vv = g->elem == M3_KV_FP8 ? vh[d] / vs : vh[d];
            put(kl->k, g->elem, m3_kv_off_k(g, kl->view, slot, h, d), kv, g->fp8_kind, ovf);
            put(kl->v, g->elem, m3_kv_off_v(g, kl->view, slot, h, d), vv, g->fp8_kind, ovf);
        }
    }
}

float m3_kv_read_k(const m3_kv_layer *kl, int64_t slot, int h, float *dst) {
    const m3_kv_geom *g = &kl->g;
    for (int d = 0; d < g->head_dim; d++)
        dst[d] = get(kl->k, g->elem, m3_kv_off_k(g, kl->view, slot, h, d), g->fp8_kind);
    return g->elem == M3_KV_FP8 ? kl->k_scale[m3_kv_off_scale(g, kl->view, slot, h)] : 1.0f;
}

float m3_kv_read_v(const m3_kv_layer *kl, int64_t slot, int h, float *dst) {
    const m3_kv_geom *g = &kl->g;
    for (int d = 0; d < g->head_dim; d++)
        dst[d] = get(kl->v, g->elem, m3_kv_off_v(g, kl->view, slot, h, d), g->fp8_kind);
    return g->elem == M3_KV_FP8 ? kl->v_scale[m3_kv_off_scale(g, kl->view, slot, h)] : 1.0f;
}

void m3_kv_index_write(m3_kv_layer *kl, int64_t slot, const float *ik, m3_fp8_overflow ovf) {
    M3_ASSERT(kl->index_dim > 0 && slot >= 0 && slot < (int64_t)kl->n_blocks * kl->g.block);
    for (int d = 0; d < kl->index_dim; d++) {
        /* fp8: the writer rounds to bf16 first, then casts at unit scale (§4.8) */
        float v = kl->index_elem == M3_KV_FP8 ? m3_round_bf16(ik[d]) : ik[d];
        put(kl->index_k, kl->index_elem, slot * kl->index_dim + d, v, kl->g.fp8_kind, ovf);
    }
}

void m3_kv_index_read(const m3_kv_layer *kl, int64_t slot, float *dst) {
    for (int d = 0; d < kl->index_dim; d++)
        dst[d] = get(kl->index_k, kl->index_elem, slot * kl->index_dim + d, kl->g.fp8_kind);
}

/* ---- sparse table ------------------------------------------------------------------------------
 */

int m3_kv_sparse_table(int32_t *table, int *ctx, const int32_t *sel, int width, int p,
                       const m3_block_table *bt, const m3_kv_geom *g, int h, bool position_order) {
    const int B = g->block, ppb = B / g->page, bp = p / B;
    int32_t full[256];
    int n_full = 0;
    bool tail = false;
    M3_ASSERTF(width <= 256, "top-k width %d > 256", width);
    for (int i = 0; i < width; i++) {
        int b = sel[i];
        if (b < 0 || b > bp) continue; /* -1 padding and future blocks are not valid ids */
        if (b == bp)
            tail = true;
        else
            full[n_full++] = b;
    }
    if (position_order) /* insertion sort: the fp32/hf accumulation order */
        for (int a = 1; a < n_full; a++)
            for (int c = a; c > 0 && full[c - 1] > full[c]; c--) {
                int32_t t = full[c];
                full[c] = full[c - 1];
                full[c - 1] = t;
            }
    int n = 0;
    memset(table, 0, (size_t)width * (size_t)ppb * sizeof *table);
    for (int i = 0; i < n_full + (tail ? 1 : 0); i++) {
        int b = i < n_full ? full[i] : bp;
        M3_ASSERTF(b < bt->n_logical, "block %d not mapped", b);
        for (int j = 0; j < ppb; j++)
            table[n++] = (int32_t)(((int64_t)ppb * bt->phys[b] + j) * g->n_kv + h);
    }
    int n_valid = n_full + (tail ? 1 : 0);
    if (tail)
        *ctx = n_full * B + (p - B * bp + 1);
    else
        *ctx = n_valid * B < p + 1 ? n_valid * B : p + 1;
    return n;
}

int64_t m3_kv_table_slot(const int32_t *table, const m3_kv_geom *g, int k) {
    int64_t q = table[k / g->page] / g->n_kv; /* page id -> page q of the re-view */
    return q * g->page + k % g->page;
}
