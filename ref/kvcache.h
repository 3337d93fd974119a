/* ref/kvcache.h: the paged KV and index caches of ATOM (spec m3-numerics.md §4): physical
 * blocks of Bs tokens, a block table per sequence, the page-Bs SHUFFLE layout of dense layers
 * and its zero-copy page-P re-view of sparse layers, per-token per-head fp8 scales, the
 * single-head index cache, and the expansion of selected blocks into page entries (§4.4).
 *
 * Addressing (§4.1-§4.3; M3: Bs = 128, P = 16, Dh = 128, x = 16 / elem_bytes):
 *   slot(p) = bt[p / Bs] * Bs + p % Bs                      (bt: logical -> physical block)
 *   page-Bs view (dense layers), b = slot / Bs, t = slot % Bs:
 *     K [N, Hkv, Dh/x, Bs, x]  off = ((b*Hkv + h)*(Dh/x) + dim/x)*(Bs*x) + t*x + dim%x
 *     V [N, Hkv, Bs/x, Dh, x]  off = ((b*Hkv + h)*(Bs/x) + t/x)*(Dh*x) + dim*x + t%x
 *     scale [N, Hkv, Bs]       off = (b*Hkv + h)*Bs + t
 *   page-P view (sparse layers), q = slot / P, t = slot % P (block b holds pages
 *   (Bs/P)*b + 0..Bs/P-1): the same formulas with Bs -> P and b -> q.
 * Those are the spec's formulas exactly whenever x divides Dh and P (M3: always). For the
 * tiny test geometries (Dh = 12, P = 1, ...) the divided dims are rounded UP (Dh/x ->
 * ceil(Dh/x), P/x -> ceil(P/x)) with unused padding elements, and a physical block's region
 * is the larger of the two views' footprints, page q of the re-view starting at
 * (q / (Bs/P)) * block_stride + (q % (Bs/P)) * page_size; without padding that is q * page_size,
 * the spec's formula. The default sparse page is P = Bs / 8 (M3: 16; 8 pages per block as in
 * ATOM) when Bs % 8 == 0, else P = Bs.
 * Index cache (§4.5): [N, Bs, Di], one head, page-Bs; element (slot, dim) at slot*Di + dim.
 *
 * Elements: M3_KV_F32 (x = 4; the "bf16" cache of the fp32 profile, whose K/V are fp32: the
 * layout never changes a number), M3_KV_BF16 (x = 8), M3_KV_FP8 (x = 16; e4m3fn or e4m3fnuz).
 * fp8 K/V (§4.7): per (slot, head) scale = amax / fp8_max (1.0 when amax = 0), byte =
 *   cvt_fp8(value / scale) (fp32 division, RNE, overflow policy); dequant = fp32(byte) * scale.
 *   The writer chooses fp8_max, the value quantized and the amax source (m3_kv_writer).
 * fp8 index keys (§4.8): byte = cvt_fp8(f32(bf16(value))), unit scale, no scale array.
 *
 * Ownership: m3_kv_layer and m3_block_table own their arrays (create by zero-init + reserve,
 * release with *_free). Offsets are element indices (int64_t) into one layer's K or V array.
 * docs/caches.md. */
#ifndef M3_KVCACHE_H
#define M3_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"
#include "ref/num/bf16.h"
#include "ref/num/fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { M3_KV_F32 = 0, M3_KV_BF16 = 1, M3_KV_FP8 = 2 } m3_kv_elem;

/* Which view a layer's K/V use: page-Bs (dense layers) or the page-P re-view (sparse). */
typedef enum { M3_KV_VIEW_BLOCK = 0, M3_KV_VIEW_PAGE = 1 } m3_kv_view;

typedef struct m3_kv_geom {
    int n_kv;     /* Hkv */
    int head_dim; /* Dh */
    int block;    /* Bs: tokens per physical block (the page of the dense view) */
    int page;     /* P: tokens per page of the sparse re-view; block % page == 0 */
    m3_kv_elem elem;
    m3_fp8_kind fp8_kind; /* elem == M3_KV_FP8 */
    /* derived by m3_kv_geom_init */
    int elem_bytes, x;     /* 4/2/1 and 16 / elem_bytes */
    int dx;                /* ceil(Dh / x) */
    int64_t k_block;       /* K elements per physical block (both views agree) */
    int64_t v_block_dense; /* V elements of one block in the page-Bs view */
    int64_t v_page;        /* V elements of one page-P page */
    int64_t v_stride;      /* V elements per physical block region: max of the two views */
} m3_kv_geom;

/* Fill g (page = 0 picks the default P). Asserts positive dims and block % page == 0. */
void m3_kv_geom_init(m3_kv_geom *g, int n_kv, int head_dim, int block, int page, m3_kv_elem elem,
                     m3_fp8_kind kind);
int m3_kv_default_page(int block);
int m3_kv_elem_bytes(m3_kv_elem e);

/* Element offsets into one layer's K / V array and its scale array, for physical slot s. */
int64_t m3_kv_off_k(const m3_kv_geom *g, m3_kv_view view, int64_t slot, int h, int dim);
int64_t m3_kv_off_v(const m3_kv_geom *g, m3_kv_view view, int64_t slot, int h, int dim);
int64_t m3_kv_off_scale(const m3_kv_geom *g, m3_kv_view view, int64_t slot, int h);

/* ---- block table ------------------------------------------------------------------------ */

/* One sequence's logical -> physical block map over a pool of physical blocks. New pool
 * blocks enter the free list so that they are handed out in DESCENDING id order (logical 0
 * of a fresh pool of n gets block n-1): a reader that confuses logical and physical block
 * ids reads the wrong bytes at once instead of by luck. */
typedef struct m3_block_table {
    int n_logical, cap_logical;
    int32_t *phys; /* [cap_logical] */
    int n_pool;    /* physical blocks in the pool (layer storage must hold this many) */
    int n_free;
    int32_t *free_ids; /* stack; the top is handed out next */
} m3_block_table;

/* Map logical blocks 0..n_logical-1 (allocating the missing ones; the pool grows by at least
 * doubling). M3_ERR_NOMEM on failure (the table is left valid). */
m3_status m3_block_table_reserve(m3_block_table *bt, int n_logical);
/* Use an explicit map (tests): phys[0..n-1], each < n_pool, distinct (asserted). */
m3_status m3_block_table_set(m3_block_table *bt, const int32_t *phys, int n, int n_pool);
void m3_block_table_free(m3_block_table *bt); /* NULL ok */
/* slot(p) = bt[p / block] * block + p % block; p must be mapped (asserted). */
int64_t m3_block_table_slot(const m3_block_table *bt, int block, int p);

/* ---- one layer's storage ------------------------------------------------------------------ */

typedef struct m3_kv_layer {
    m3_kv_geom g;
    m3_kv_view view;
    int n_blocks;             /* physical blocks allocated */
    uint8_t *k, *v;           /* [n_blocks * k_block], [n_blocks * v_stride] elements */
    float *k_scale, *v_scale; /* [n_blocks, Hkv, Bs] (fp8 only, else NULL) */
    /* index cache (sparse layers; index_dim 0 = none) */
    int index_dim;         /* Di */
    m3_kv_elem index_elem; /* F32, BF16 or FP8 (unit scale, g.fp8_kind) */
    uint8_t *index_k;      /* [n_blocks, Bs, Di] */
} m3_kv_layer;

/* Set up an empty layer (no storage yet). */
void m3_kv_layer_init(m3_kv_layer *kl, const m3_kv_geom *g, m3_kv_view view, int index_dim,
                      m3_kv_elem index_elem);
/* Grow to hold n_blocks physical blocks (contents kept: block regions never move). */
m3_status m3_kv_layer_reserve(m3_kv_layer *kl, int n_blocks);
void m3_kv_layer_free(m3_kv_layer *kl); /* NULL ok */

/* How an fp8 writer quantizes K (§4.7); V always takes amax over its own values. */
typedef struct m3_kv_writer {
    float fp8_max; /* FP8_MAX of this writer: 240 or 448 (or the forced value) */
    m3_fp8_overflow ovf;
} m3_kv_writer;

/* Write token slot s of every head: k_val, v [Hkv*Dh] are the values stored (k after norm +
 * rope in the writer's precision), k_amax [Hkv*Dh] the values whose amax sets K's scale
 * (may equal k_val). Non-fp8 elements store k_val / v (bf16: RNE). w may be NULL unless fp8. */
void m3_kv_write(m3_kv_layer *kl, int64_t slot, const float *k_val, const float *k_amax,
                 const float *v, const m3_kv_writer *w);
/* Read head h of slot s: the decoded element values (fp8: fp32(byte), NOT scaled) into
 * dst [Dh]; the return value is the scale (1.0 for non-fp8 elements). */
float m3_kv_read_k(const m3_kv_layer *kl, int64_t slot, int h, float *dst);
float m3_kv_read_v(const m3_kv_layer *kl, int64_t slot, int h, float *dst);

/* Index cache: write / read one slot's Di values (fp8: fp8(bf16(v)) unit scale; bf16: RNE). */
void m3_kv_index_write(m3_kv_layer *kl, int64_t slot, const float *ik, m3_fp8_overflow ovf);
void m3_kv_index_read(const m3_kv_layer *kl, int64_t slot, float *dst);

/* ---- sparse block table expansion (§4.4) --------------------------------------------------- */

/* For the query at position p and KV head h, from one row sel[width] of selected logical
 * block ids: valid ids 0 <= b <= p/Bs (others, -1 included, dropped); full blocks (b < b_p)
 * first in selection order (ascending id when position_order: the fp32/hf accumulation
 * order), the own block b_p last; each block b expands to Bs/P page ids
 * (pages_per_block*bt[b] + j)*Hkv + h, j = 0..; table[width * Bs/P] (unused entries 0).
 * ctx: n_full*Bs + (p - Bs*b_p + 1) when the own block is selected, else
 * min(n_valid*Bs, p+1). Key k < ctx is entry k / P, in-page offset k % P. Returns the number
 * of entries written. Duplicated ids are kept (the indexer never emits them). */
int m3_kv_sparse_table(int32_t *table, int *ctx, const int32_t *sel, int width, int p,
                       const m3_block_table *bt, const m3_kv_geom *g, int h, bool position_order);
/* The physical slot of key k < ctx through such a table (page view). */
int64_t m3_kv_table_slot(const int32_t *table, const m3_kv_geom *g, int k);

#ifdef __cplusplus
}
#endif
#endif
