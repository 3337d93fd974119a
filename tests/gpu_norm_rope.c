/* tests/gpu_norm_rope.c: gpu/norm.hip and gpu/rope.hip against their ref twins (ref/norm.c,
 * ref/rope.c) on fresh random inputs, real M3 shapes (D = 6144; q/k/index_k slices of a
 * packed 9856-wide qkv row, Dh = 128, R = 64, theta = 5e6) and odd ones (T = 1, 3, 33;
 * D = 9, 1000; Dh = 80, R = 40), under every profile. fp32 storage paths must agree to
 * GPU_NMSE_F32 when the profile rounds nothing (fp32) and to GPU_NMSE_BF16 when it rounds;
 * bf16 storage paths to GPU_NMSE_BF16. Outputs are guarded and poisoned first.
 * q/k norm + rope is additionally checked BIT FOR BIT (gpu/rope.hip keeps every operation of
 * ref/rope.c), and the fused m3_gpu_qk_norm_rope_cache against the ref composition of
 * ref/layer.c (m3_qk_norm_rope of q, k, index_q, index_k; m3_kv_write, m3_kv_index_write):
 * every byte of q/k/index rows, of the K, V and index caches and of the fp8 scales, for bf16
 * and fp8 caches in the page-128 SHUFFLE, page-16 and plain layouts and each fp8 K writer
 * (§4.7), at M3 shapes (H=64, Hkv=4, Dh=128, R=64, G=4, Di=128) and odd ones, in one launch
 * and split in two (q/k/v, then the indexer's parts with an index-only cache write). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/kvcache.h"
#include "ref/norm.h"
#include "ref/rope.h"
#include "tests/gpu_test.h"

static const float EPS = 9.99999997e-07f;

static void profile_of(m3_profile *p, int which) {
    if (which == 0) m3_profile_fp32(p);
    else if (which == 1) m3_profile_hf(p);
    else m3_profile_atom(p);
}

static double bound_for(const m3_profile *p, bool rounds) {
    return rounds || p->act_bf16 ? GPU_NMSE_BF16 : GPU_NMSE_F32;
}

static void fill_w(m3_rng *r, m3_bf16 *w, int n) {
    for (int i = 0; i < n; i++) w[i] = m3_f32_to_bf16(m3_rng_uniform(r, -0.5f, 0.5f));
}

/* Fail unless got == ref bit for bit (both hold exact bf16 or fp32 values). */
static void expect_bits(const float *ref, const float *got, int64_t n, const char *what) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (m3_f32_bits(ref[i]) != m3_f32_bits(got[i])) {
            if (first < 0) first = i;
            bad++;
        }
    printf("  %-58s %lld elements differ in a bit\n", what, (long long)bad);
    if (bad)
        m3_test_failf("%s: %lld elements differ; first [%lld]: ref %a gpu %a", what, (long long)bad,
                      (long long)first, (double)ref[first], (double)got[first]);
}

/* ---- residual + RMSNorm ---------------------------------------------------------------- */
static void norm_add_case(m3_gpu *g, int T, int D, int prof, bool with_h) {
    m3_profile p;
    profile_of(&p, prof);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 100 + (uint64_t)T * 31 + (uint64_t)D + (uint64_t)prof * 7);
    const int64_t n = (int64_t)T * D;
    float *res = malloc(n * sizeof *res), *h = malloc(n * sizeof *h);
    float *y_ref = malloc(n * sizeof *y_ref), *res_ref = malloc(n * sizeof *res_ref);
    float *y_got = malloc(n * sizeof *y_got), *res_got = malloc(n * sizeof *res_got);
    m3_bf16 *w = malloc(D * sizeof *w);
    m3_fill_normal(&r, res, n, 1.0f);
    m3_fill_normal(&r, h, n, 0.5f);
    fill_w(&r, w, D);
    void *dw;
    GPU_OK(m3_gpu_alloc(g, &dw, D * sizeof *w));
    GPU_OK(m3_gpu_upload(g, dw, w, D * sizeof *w));
    const m3_bf16 *d_w = dw;
    char what[160];

    /* fp32 storage: any profile */
    memcpy(res_ref, res, n * sizeof *res);
    m3_rmsnorm_add(y_ref, res_ref, with_h ? h : NULL, w, T, D, EPS, &p);
    float *d_res = gpu_guard_alloc(g, n * sizeof(float));
    float *d_y = gpu_guard_alloc(g, n * sizeof(float));
    float *d_h = gpu_upload_f32(g, h, n);
    GPU_OK(m3_gpu_upload(g, d_res, res, n * sizeof *res));
    GPU_OK(m3_gpu_rmsnorm_add_f32(g, d_y, d_res, with_h ? d_h : NULL, d_w, T, D, EPS, &p));
    gpu_download_f32(g, y_got, d_y, n);
    gpu_download_f32(g, res_got, d_res, n);
    gpu_guard_check(g, d_y, n * sizeof(float), "rmsnorm_add_f32 y");
    gpu_guard_check(g, d_res, n * sizeof(float), "rmsnorm_add_f32 resid");
    snprintf(what, sizeof what, "rmsnorm_add_f32(%s,T=%d,D=%d,h=%d) y", p.name, T, D, with_h);
    gpu_expect_nmse(y_ref, y_got, n, bound_for(&p, false), what);
    snprintf(what, sizeof what, "rmsnorm_add_f32(%s,T=%d,D=%d,h=%d) resid", p.name, T, D, with_h);
    /* the residual is a single add (and rounding) per element: no reduction involved */
    gpu_expect_nmse(res_ref, res_got, n, bound_for(&p, false), what);

    if (p.act_bf16) { /* bf16 storage: inputs are bf16 values on both sides */
        m3_bf16 *d_rb = gpu_upload_bf16(g, res, n, res_ref);
        m3_bf16 *d_hb = gpu_upload_bf16(g, h, n, h);
        m3_bf16 *d_resb = gpu_guard_alloc(g, n * sizeof(m3_bf16));
        m3_bf16 *d_yb = gpu_guard_alloc(g, n * sizeof(m3_bf16));
        GPU_OK(m3_gpu_copy(g, d_resb, d_rb, n * sizeof(m3_bf16)));
        m3_rmsnorm_add(y_ref, res_ref, with_h ? h : NULL, w, T, D, EPS, &p);
        GPU_OK(m3_gpu_rmsnorm_add(g, d_yb, d_resb, with_h ? d_hb : NULL, d_w, T, D, EPS, &p));
        gpu_download_bf16(g, y_got, d_yb, n);
        gpu_download_bf16(g, res_got, d_resb, n);
        gpu_guard_check(g, d_yb, n * sizeof(m3_bf16), "rmsnorm_add y");
        gpu_guard_check(g, d_resb, n * sizeof(m3_bf16), "rmsnorm_add resid");
        snprintf(what, sizeof what, "rmsnorm_add(%s,T=%d,D=%d,h=%d) y bf16", p.name, T, D, with_h);
        gpu_expect_nmse(y_ref, y_got, n, GPU_NMSE_BF16, what);
        /* the stored residual is bf16(r + h) of identical inputs: bit-identical */
        for (int64_t i = 0; i < n; i++)
            if (m3_f32_bits(res_ref[i]) != m3_f32_bits(res_got[i]))
                m3_test_failf("rmsnorm_add(%s,T=%d,D=%d) resid[%lld]: ref %a gpu %a", p.name, T,
                              D, (long long)i, (double)res_ref[i], (double)res_got[i]);
    }
    free(res); free(h); free(y_ref); free(res_ref); free(y_got); free(res_got); free(w);
}

static void rmsnorm_add_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const int shapes[][2] = {{1, 6144}, {3, 6144}, {33, 6144}, {257, 6144}, {3, 9},
                                    {33, 1000}, {5, 128}};
    for (int prof = 0; prof < 3; prof++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            norm_add_case(g, shapes[s][0], shapes[s][1], prof, true);
            if (s < 2) norm_add_case(g, shapes[s][0], shapes[s][1], prof, false);
        }
}

static void rmsnorm_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const int shapes[][2] = {{1, 6144}, {33, 6144}, {3, 9}, {7, 12288}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int T = shapes[s][0], D = shapes[s][1];
        const int64_t n = (int64_t)T * D;
        m3_rng r;
        m3_rng_init(&r, m3_test_seed(), 200 + s);
        float *x = malloc(n * sizeof *x), *ref = malloc(n * sizeof *ref),
              *got = malloc(n * sizeof *got);
        m3_bf16 *w = malloc(D * sizeof *w);
        m3_fill_uniform(&r, x, n, -3, 3);
        fill_w(&r, w, D);
        void *dw;
        GPU_OK(m3_gpu_alloc(g, &dw, D * sizeof *w));
        GPU_OK(m3_gpu_upload(g, dw, w, D * sizeof *w));
        char what[128];
        /* fp32 */
        m3_rmsnorm(ref, x, w, T, D, EPS);
        float *dx = gpu_upload_f32(g, x, n), *dy = gpu_guard_alloc(g, n * sizeof(float));
        GPU_OK(m3_gpu_rmsnorm_f32(g, dy, dx, dw, T, D, EPS));
        gpu_download_f32(g, got, dy, n);
        gpu_guard_check(g, dy, n * sizeof(float), "rmsnorm_f32");
        snprintf(what, sizeof what, "rmsnorm_f32(T=%d,D=%d)", T, D);
        gpu_expect_nmse(ref, got, n, GPU_NMSE_F32, what);
        /* bf16 in, bf16 out */
        m3_bf16 *dxb = gpu_upload_bf16(g, x, n, x);
        m3_bf16 *dyb = gpu_guard_alloc(g, n * sizeof(m3_bf16));
        m3_rmsnorm(ref, x, w, T, D, EPS);
        for (int64_t i = 0; i < n; i++) ref[i] = m3_round_bf16(ref[i]);
        GPU_OK(m3_gpu_rmsnorm(g, dyb, dxb, dw, T, D, EPS));
        gpu_download_bf16(g, got, dyb, n);
        gpu_guard_check(g, dyb, n * sizeof(m3_bf16), "rmsnorm");
        snprintf(what, sizeof what, "rmsnorm bf16(T=%d,D=%d)", T, D);
        gpu_expect_nmse(ref, got, n, GPU_NMSE_BF16, what);
        free(x); free(ref); free(got); free(w);
    }
}

/* ---- kernel variants: the same bytes ---------------------------------------------------
 * Every m3_gpu_set_elem_variant variant (gpu/norm.hip) must write exactly the bytes of variant
 * 0 (the original kernel): same per-thread order of the sum of squares, same reduction. Shapes
 * cover 1..4 chunks a thread (D = 2048, 4096, 6144, 8192), a D that leaves threads idle (1000),
 * an odd T (a half-empty block of the two-rows variant); hf and atom (norm reads the rounded
 * or the fp32 sum), with and without h, and plain rmsnorm. */
#define ELEM_VARIANTS 6
static void norm_variant_case(m3_gpu *g, int T, int D, int prof, int kind) {
    m3_profile p;
    profile_of(&p, prof);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 250 + (uint64_t)T * 7 + (uint64_t)D + (uint64_t)prof * 3 + kind);
    const int64_t n = (int64_t)T * D;
    float *x = malloc(n * sizeof *x), *h = malloc(n * sizeof *h);
    m3_bf16 *w = malloc(D * sizeof *w), *y0 = malloc(n * 2), *r0 = malloc(n * 2),
            *yv = malloc(n * 2), *rv = malloc(n * 2);
    m3_fill_normal(&r, x, n, 1.0f);
    m3_fill_normal(&r, h, n, 0.5f);
    fill_w(&r, w, D);
    void *dw;
    GPU_OK(m3_gpu_alloc(g, &dw, D * sizeof *w));
    GPU_OK(m3_gpu_upload(g, dw, w, D * sizeof *w));
    m3_bf16 *dx = gpu_upload_bf16(g, x, n, NULL), *dh = gpu_upload_bf16(g, h, n, NULL);
    m3_bf16 *dr = gpu_guard_alloc(g, n * 2), *dy = gpu_guard_alloc(g, n * 2);
    for (int k = 0; k <= ELEM_VARIANTS; k++) { /* 0 first (the reference), then the default */
        const int v = k == 0 ? 0 : k == 1 ? -1 : k - 1;
        m3_gpu_set_elem_variant(v);
        GPU_OK(m3_gpu_memset(g, dy, 0xFF, n * 2));
        if (kind == 0) {
            GPU_OK(m3_gpu_rmsnorm(g, dy, dx, dw, T, D, EPS));
        } else {
            GPU_OK(m3_gpu_copy(g, dr, dx, n * 2));
            GPU_OK(m3_gpu_rmsnorm_add(g, dy, dr, kind == 1 ? dh : NULL, dw, T, D, EPS, &p));
        }
        GPU_OK(m3_gpu_download(g, k ? yv : y0, dy, n * 2));
        GPU_OK(m3_gpu_download(g, k ? rv : r0, dr, n * 2));
        gpu_guard_check(g, dy, n * 2, "rmsnorm variant y");
        gpu_guard_check(g, dr, n * 2, "rmsnorm variant resid");
        for (int64_t i = 0; k && i < n; i++)
            if (yv[i] != y0[i] || (kind && rv[i] != r0[i]))
                m3_test_failf("rmsnorm%s(%s,T=%d,D=%d) variant %d [%lld]: y %04x vs %04x, resid "
                              "%04x vs %04x", kind ? "_add" : "", p.name, T, D, v, (long long)i,
                              yv[i], y0[i], rv[i], r0[i]);
    }
    m3_gpu_set_elem_variant(-1);
    free(x); free(h); free(w); free(y0); free(r0); free(yv); free(rv);
}

static void rmsnorm_variants_same_bytes(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const int shapes[][2] = {{37, 6144}, {5, 1000}, {4, 2048}, {3, 4096}, {2, 8192}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int prof = 1; prof < 3; prof++)
            for (int kind = 0; kind < 3; kind++)
                norm_variant_case(g, shapes[s][0], shapes[s][1], prof, kind);
}

/* ---- q/k norm + RoPE ------------------------------------------------------------------- */
typedef struct { int T, ld, col, n_head, head_dim, rot_dim; const char *name; } rope_shape;

static void rope_case(m3_gpu *g, const rope_shape *sh, int prof) {
    m3_profile p;
    profile_of(&p, prof);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 300 + (uint64_t)sh->T * 13 + (uint64_t)sh->col + prof);
    const int T = sh->T;
    const int64_t n = (int64_t)T * sh->ld;
    float *x = malloc(n * sizeof *x), *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    m3_bf16 *w = malloc(sh->head_dim * sizeof *w);
    int32_t *pos = malloc(T * sizeof *pos);
    m3_fill_normal(&r, x, n, 1.0f);
    fill_w(&r, w, sh->head_dim);
    for (int t = 0; t < T; t++) pos[t] = (int32_t)(m3_rng_u32(&r) % 1048576u);
    pos[0] = 0;
    if (T > 2) pos[1] = 1048575;
    void *dw, *dpos;
    GPU_OK(m3_gpu_alloc(g, &dw, sh->head_dim * sizeof *w));
    GPU_OK(m3_gpu_upload(g, dw, w, sh->head_dim * sizeof *w));
    GPU_OK(m3_gpu_alloc(g, &dpos, T * sizeof *pos));
    GPU_OK(m3_gpu_upload(g, dpos, pos, T * sizeof *pos));
    const float theta = 5e6f;
    char what[200];

    /* fp32 storage */
    memcpy(ref, x, n * sizeof *x);
    m3_qk_norm_rope(ref + sh->col, sh->ld, pos, T, sh->n_head, sh->head_dim, w, EPS, sh->rot_dim,
                    theta, &p);
    float *dx = gpu_guard_alloc(g, n * sizeof(float));
    GPU_OK(m3_gpu_upload(g, dx, x, n * sizeof *x));
    GPU_OK(m3_gpu_qk_norm_rope_f32(g, dx + sh->col, sh->ld, dpos, T, sh->n_head, sh->head_dim, dw,
                                   EPS, sh->rot_dim, theta, &p));
    gpu_download_f32(g, got, dx, n);
    gpu_guard_check(g, dx, n * sizeof(float), "qk_norm_rope_f32");
    snprintf(what, sizeof what, "qk_norm_rope_f32(%s,%s,T=%d,H=%d,Dh=%d,R=%d)", p.name, sh->name,
             T, sh->n_head, sh->head_dim, sh->rot_dim);
    gpu_expect_nmse(ref, got, n, bound_for(&p, p.qk_round != M3_QK_ROUND_NONE), what);
    expect_bits(ref, got, n, what);

    if (p.qk_round != M3_QK_ROUND_NONE) { /* bf16 storage */
        m3_bf16 *dxb0 = gpu_upload_bf16(g, x, n, ref);
        m3_bf16 *dxb = gpu_guard_alloc(g, n * sizeof(m3_bf16));
        GPU_OK(m3_gpu_copy(g, dxb, dxb0, n * sizeof(m3_bf16)));
        m3_qk_norm_rope(ref + sh->col, sh->ld, pos, T, sh->n_head, sh->head_dim, w, EPS,
                        sh->rot_dim, theta, &p);
        GPU_OK(m3_gpu_qk_norm_rope(g, dxb + sh->col, sh->ld, dpos, T, sh->n_head, sh->head_dim,
                                   dw, EPS, sh->rot_dim, theta, &p));
        gpu_download_bf16(g, got, dxb, n);
        gpu_guard_check(g, dxb, n * sizeof(m3_bf16), "qk_norm_rope");
        snprintf(what, sizeof what, "qk_norm_rope bf16(%s,%s,T=%d,H=%d,Dh=%d,R=%d)", p.name,
                 sh->name, T, sh->n_head, sh->head_dim, sh->rot_dim);
        gpu_expect_nmse(ref, got, n, GPU_NMSE_BF16, what);
        expect_bits(ref, got, n, what);
    }
    free(x); free(ref); free(got); free(w); free(pos);
}

static void qk_norm_rope_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    /* q, k, index_q, index_k slices of the packed 9856-wide sparse-layer qkv row (§3.4) */
    static const rope_shape shapes[] = {
        {33, 9856, 0, 64, 128, 64, "q"},      {33, 9856, 8192, 4, 128, 64, "k"},
        {3, 9856, 9216, 4, 128, 64, "index_q"}, {1, 9856, 9728, 1, 128, 64, "index_k"},
        {257, 9856, 0, 64, 128, 64, "q"},     {3, 245, 5, 3, 80, 40, "odd"},
        {2, 128, 0, 1, 128, 0, "no-rope"},
        /* decode steps of one token's rows (qw_rps): 6 rows of 12 heads (lanes of rows 6, 7
         * idle), 7 of 7 */
        {5, 9856, 0, 12, 128, 64, "q12"},     {3, 9856, 128, 7, 128, 64, "q7"},
    };
    for (int prof = 0; prof < 3; prof++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) rope_case(g, &shapes[s], prof);
}

/* ---- fused q/k norm + rope + cache write ---------------------------------------------- */
typedef struct {
    int T, H, Hkv, Dh, G, Di, R, pad; /* pad: extra elements per packed row (odd: scalar path) */
    const char *name;
} fused_shape;
typedef struct {
    int page;  /* -1: no cache; 0 plain rows; 128; 16; -2: ref's paged storage (below) */
    bool fp8, index, index_fp8;
    float fp8_max;
    m3_gpu_kq_src k_src;
    m3_fp8_overflow ovf;
    int bs, pp;  /* page -2: m3_kv_geom block Bs and page P, */
    bool pview;  /* the page-P view (else the page-Bs one) */
} fused_cache;

#define FUSED_FILL 0xEE
#define FUSED_BLOCKS 5 /* physical blocks of 128 slots */

static void expect_bytes(const void *ref, const void *got, size_t n, const char *what) {
    const unsigned char *a = ref, *b = got;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i] && bad++ == 0) first = i;
    printf("  %-58s %zu of %zu bytes differ\n", what, bad, n);
    if (bad)
        m3_test_failf("%s: %zu bytes differ; first at %zu: ref 0x%02x gpu 0x%02x", what, bad, first,
                      a[first], b[first]);
}

static void *dl_bytes(m3_gpu *g, const void *d, size_t n, const char *what) {
    void *h = malloc(n + 1);
    assert_non_null(h);
    GPU_OK(m3_gpu_download(g, h, d, n));
    gpu_guard_check(g, d, n, what);
    return h;
}

static void *guard_fill(m3_gpu *g, size_t n) {
    void *d = gpu_guard_alloc(g, n);
    GPU_OK(m3_gpu_memset(g, d, FUSED_FILL, n));
    return d;
}

/* split: two launches, (q, k, v) then (index_q, index_k), as a layer that keeps ref's stage
 * order runs it; the bytes must be the same as one launch's. */
/* islot (page -2): the paged index cache too (m3_gpu_kv_cache.index_bt: rows slot(pos[t]), as
 * ref's m3_kv_index_write at slot(p)); else the index rows irow0 + t */
static void fused_case(m3_gpu *g, const fused_shape *sh, const fused_cache *fc, bool islot,
                       int prof, bool split) {
    m3_profile p;
    profile_of(&p, prof);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 500 + (uint64_t)sh->T * 7 + (uint64_t)sh->Dh +
                                        (uint64_t)(fc->page + 1) * 3 + (uint64_t)fc->fp8 * 11 +
                                        (uint64_t)fc->k_src * 13 + (uint64_t)prof);
    const int T = sh->T, H = sh->H, Hkv = sh->Hkv, Dh = sh->Dh, G = sh->G, Di = sh->Di;
    const int QW = H * Dh, KW = Hkv * Dh, cq = 0, ck = QW, cv = ck + KW, ciq = cv + KW,
              cik = ciq + G * Di, ld = cik + Di + sh->pad;
    const int64_t n = (int64_t)T * ld;
    const float theta = 5e6f;
    float *x = malloc(n * sizeof *x), *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    m3_bf16 *wq = malloc(Dh * 2), *wk = malloc(Dh * 2), *wiq = malloc(Di * 2), *wik = malloc(Di * 2);
    int32_t *pos = malloc(T * sizeof *pos);
    int64_t *slots = malloc(T * sizeof *slots);
    m3_fill_normal(&r, x, n, 1.0f);
    for (int d = 0; d < Dh; d++) x[(size_t)(T > 1) * ld + ck + d] = 0.0f;   /* a zero k head */
    for (int d = 0; d < Dh; d++) x[(size_t)(T - 1) * ld + cv + d] *= 300.0f; /* a large v head */
    if (T >= 3) { /* a v head on e4m3 rounding midpoints: its amax is the fp8 maximum, so the
                   * scale is 1 and the quotients are the values (ties to even; the fp8 writer's
                   * bracket fails there and takes the exact quotients), signs alternating */
        float *vh = x + (size_t)(T / 2) * ld + cv + (Hkv > 1 ? Dh : 0);
        vh[0] = fc->fp8 ? fc->fp8_max : 240.0f;
        for (int d = 1; d < Dh; d++) {
            const float m = d < Dh - 16 ? (1.0f + (float)(2 * (d % 8) + 1) / 16.0f) * ldexpf(1.0f, (d / 8) % 15 - 8)
                                        : (float)(2 * (d - (Dh - 16)) + 1) * ldexpf(1.0f, -10);
            vh[d] = d & 1 ? -m : m;
        }
    }
    fill_w(&r, wq, Dh), fill_w(&r, wk, Dh), fill_w(&r, wiq, Di), fill_w(&r, wik, Di);
    const int n_slot = FUSED_BLOCKS * 128;
    /* paged: consecutive positions from p0 through a shuffled block table (slot(p) of §4.1,
     * computed by the kernel), the index cache at rows irow0 + t */
    const bool paged = fc->page == -2;
    const int Bs = paged ? fc->bs : 128, p0 = 5, irow0 = 3;
    const int nblk = paged ? (p0 + T + Bs - 1) / Bs : FUSED_BLOCKS;
    int32_t *bt = malloc((size_t)nblk * sizeof *bt);
    for (int b = 0; b < nblk; b++) bt[b] = b;
    for (int b = nblk - 1; b > 0; b--) {
        const int j = (int)(m3_rng_u32(&r) % (uint32_t)(b + 1)), tmp = bt[b];
        bt[b] = bt[j], bt[j] = tmp;
    }
    for (int t = 0; t < T; t++) {
        pos[t] = (int32_t)(m3_rng_u32(&r) % 1048576u);
        /* runs of consecutive slots (as one sequence fills a block) at random places */
        if (t > 0 && t % 4 != 0 && slots[t - 1] + 1 < n_slot) {
            slots[t] = slots[t - 1] + 1;
        } else {
            slots[t] = (int64_t)(m3_rng_u32(&r) % (uint32_t)n_slot);
        }
        for (int u = 0; u < t; u++)
            if (slots[u] == slots[t]) { slots[t] = -2; break; } /* keep slots distinct */
    }
    for (int t = 0; t < T; t++)
        if (slots[t] == -2) slots[t] = -1;
    if (T > 2) slots[2] = -1; /* padding: normed, not written */
    pos[0] = 0;
    if (paged)
        for (int t = 0; t < T; t++)
            pos[t] = p0 + t, slots[t] = (int64_t)bt[pos[t] / Bs] * Bs + pos[t] % Bs;

    /* device inputs: the packed rows (bf16), weights, positions, slots */
    m3_bf16 *d0 = gpu_upload_bf16(g, x, n, x); /* x now holds the bf16 values */
    m3_bf16 *dx = gpu_guard_alloc(g, n * sizeof(m3_bf16));
    GPU_OK(m3_gpu_copy(g, dx, d0, n * sizeof(m3_bf16)));
    void *dwq, *dwk, *dwiq, *dwik, *dpos, *dslots;
    GPU_OK(m3_gpu_alloc(g, &dwq, Dh * 2)); GPU_OK(m3_gpu_upload(g, dwq, wq, Dh * 2));
    GPU_OK(m3_gpu_alloc(g, &dwk, Dh * 2)); GPU_OK(m3_gpu_upload(g, dwk, wk, Dh * 2));
    GPU_OK(m3_gpu_alloc(g, &dwiq, Di * 2)); GPU_OK(m3_gpu_upload(g, dwiq, wiq, Di * 2));
    GPU_OK(m3_gpu_alloc(g, &dwik, Di * 2)); GPU_OK(m3_gpu_upload(g, dwik, wik, Di * 2));
    GPU_OK(m3_gpu_alloc(g, &dpos, T * sizeof *pos)); GPU_OK(m3_gpu_upload(g, dpos, pos, T * sizeof *pos));
    GPU_OK(m3_gpu_alloc(g, &dslots, T * sizeof *slots));
    GPU_OK(m3_gpu_upload(g, dslots, slots, T * sizeof *slots));
    void *dbt;
    GPU_OK(m3_gpu_alloc(g, &dbt, (size_t)nblk * sizeof *bt));
    GPU_OK(m3_gpu_upload(g, dbt, bt, (size_t)nblk * sizeof *bt));

    /* the reference composition (ref/layer.c) */
    memcpy(ref, x, n * sizeof *x);
    const bool cache = fc->page >= 0;
    const bool k_from_f32 = cache && fc->fp8 && fc->k_src != M3_GPU_KQ_STORED;
    float *kf = malloc((size_t)T * KW * sizeof *kf);
    m3_qk_norm_rope(ref + cq, ld, pos, T, H, Dh, wq, EPS, sh->R, theta, &p);
    if (k_from_f32) { /* the fp32 k of the fused norm + rope, then ONCE's rounding */
        m3_profile pn = p;
        pn.qk_round = M3_QK_ROUND_NONE;
        m3_qk_norm_rope(ref + ck, ld, pos, T, Hkv, Dh, wk, EPS, sh->R, theta, &pn);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < KW; i++) {
                kf[(size_t)t * KW + i] = ref[(size_t)t * ld + ck + i];
                ref[(size_t)t * ld + ck + i] = m3_round_bf16(kf[(size_t)t * KW + i]);
            }
    } else {
        m3_qk_norm_rope(ref + ck, ld, pos, T, Hkv, Dh, wk, EPS, sh->R, theta, &p);
    }
    if (G) m3_qk_norm_rope(ref + ciq, ld, pos, T, G, Di, wiq, EPS, sh->R, theta, &p);
    m3_qk_norm_rope(ref + cik, ld, pos, T, 1, Di, wik, EPS, sh->R, theta, &p);

    /* caches: the ref layer storage and the device buffers, both filled with FUSED_FILL */
    m3_kv_layer kl;
    m3_kv_geom kg;
    const m3_kv_elem el = fc->fp8 ? M3_KV_FP8 : M3_KV_BF16;
    const bool pview = paged ? fc->pview : fc->page == 16;
    m3_kv_geom_init(&kg, Hkv, Dh, Bs, paged ? fc->pp : fc->page == 16 ? 16 : 128, el, M3_FP8_E4M3FN);
    m3_kv_layer_init(&kl, &kg, pview ? M3_KV_VIEW_PAGE : M3_KV_VIEW_BLOCK, fc->index ? Di : 0,
                     fc->index_fp8 ? M3_KV_FP8 : M3_KV_BF16);
    GPU_OK(m3_kv_layer_reserve(&kl, nblk));
    const size_t kb = (size_t)nblk * kg.k_block * kg.elem_bytes;
    const size_t vb = (size_t)nblk * kg.v_stride * kg.elem_bytes;
    const size_t sb = (size_t)nblk * Hkv * Bs * sizeof(float);
    const size_t ib = (size_t)nblk * Bs * Di * (fc->index_fp8 ? 1 : 2);
    memset(kl.k, FUSED_FILL, kb), memset(kl.v, FUSED_FILL, vb);
    if (fc->fp8) memset(kl.k_scale, FUSED_FILL, sb), memset(kl.v_scale, FUSED_FILL, sb);
    if (fc->index) memset(kl.index_k, FUSED_FILL, ib);
    m3_gpu_kv_cache c;
    memset(&c, 0, sizeof c);
    m3_gpu_attn_paged_src ps;
    memset(&ps, 0, sizeof ps);
    if (cache) {
        c.page = fc->page, c.fp8 = fc->fp8, c.fp8_max = fc->fp8_max, c.kind = M3_FP8_E4M3FN;
        c.ovf = fc->ovf, c.k_src = fc->k_src;
        c.k = guard_fill(g, kb), c.v = guard_fill(g, vb);
        if (fc->fp8) c.k_scale = guard_fill(g, sb), c.v_scale = guard_fill(g, sb);
        if (fc->index) c.index_k = guard_fill(g, ib), c.index_fp8 = fc->index_fp8;
        if (paged) { /* the same buffers as ref's storage; page / k / ... of c are not read */
            ps.g = kg, ps.view = kl.view, ps.k = c.k, ps.v = c.v;
            ps.k_scale = c.k_scale, ps.v_scale = c.v_scale, ps.bt = dbt, ps.n_logical = nblk;
            c.paged = &ps, c.index_row0 = irow0;
            if (islot) c.index_bt = dbt, c.index_block = Bs;
            c.page = 0, c.fp8 = !fc->fp8; /* ignored: the geometry decides */
        }
        m3_kv_writer wr = {.fp8_max = fc->fp8_max, .ovf = fc->ovf};
        for (int t = 0; t < T; t++) {
            if (slots[t] < 0) continue;
            const float *kr = ref + (size_t)t * ld + ck, *vr = ref + (size_t)t * ld + cv;
            const float *kval = kr, *kamax = kr;
            if (k_from_f32) {
                kamax = kf + (size_t)t * KW;
                if (fc->k_src == M3_GPU_KQ_F32) kval = kamax;
            }
            if (fc->page == 0) { /* plain rows: the stored bf16 values at slot * KW */
                for (int i = 0; i < KW; i++) {
                    const m3_bf16 bk = m3_f32_to_bf16(kr[i]), bv = m3_f32_to_bf16(vr[i]);
                    memcpy(kl.k + ((size_t)slots[t] * KW + i) * 2, &bk, 2);
                    memcpy(kl.v + ((size_t)slots[t] * KW + i) * 2, &bv, 2);
                }
            } else {
                m3_kv_write(&kl, slots[t], kval, kamax, vr, &wr);
            }
            if (fc->index)
                m3_kv_index_write(&kl, paged && !islot ? irow0 + t : slots[t],
                                  ref + (size_t)t * ld + cik, fc->ovf);
        }
    }

    m3_gpu_qkv q;
    memset(&q, 0, sizeof q);
    q.q = dx + cq, q.k = dx + ck, q.v = dx + cv, q.index_k = dx + cik;
    q.index_q = G ? dx + ciq : NULL;
    q.ld_q = q.ld_k = q.ld_v = q.ld_iq = q.ld_ik = ld;
    q.n_head = H, q.n_kv_head = Hkv, q.head_dim = Dh, q.n_index_head = G, q.index_dim = Di;
    q.q_norm = dwq, q.k_norm = dwk, q.index_q_norm = dwiq, q.index_k_norm = dwik;
    if (!split) {
        GPU_OK(m3_gpu_qk_norm_rope_cache(g, &q, cache ? &c : NULL, cache && !paged ? dslots : NULL,
                                         dpos, T, EPS, sh->R, theta, &p));
    } else {
        m3_gpu_qkv q1 = q, q2 = q;
        m3_gpu_kv_cache c1 = c;
        q1.index_q = q1.index_k = NULL, c1.index_k = NULL;
        q2.q = q2.k = NULL, q2.v = NULL;
        GPU_OK(m3_gpu_qk_norm_rope_cache(g, &q1, cache ? &c1 : NULL, cache && !paged ? dslots : NULL,
                                         dpos, T, EPS, sh->R, theta, &p));
        GPU_OK(m3_gpu_qk_norm_rope_cache(g, &q2, cache && fc->index ? &c : NULL,
                                         cache && !paged ? dslots : NULL, dpos, T, EPS, sh->R, theta, &p));
    }
    char what[200];
    const char *src = fc->k_src == M3_GPU_KQ_F32 ? "kf32" : fc->k_src ? "kbf16/amaxf32" : "kstored";
    char pg[48];
    if (paged) snprintf(pg, sizeof pg, "paged Bs%d/P%d/%s", Bs, fc->pp, pview ? "pview" : "bview");
    else snprintf(pg, sizeof pg, "page=%d", fc->page);
    snprintf(what, sizeof what, "fused(%s,%s,T=%d,%s,%s%s,idx=%s%s)", p.name, sh->name, T,
             pg, fc->fp8 ? "fp8 " : cache ? "bf16" : "none", fc->fp8 ? src : "",
             fc->index ? (fc->index_fp8 ? "fp8" : "bf16") : "-", split ? ",split" : "");
    if (islot) strncat(what, " idx-by-slot", sizeof what - strlen(what) - 1);
    gpu_download_bf16(g, got, dx, n);
    gpu_guard_check(g, dx, n * sizeof(m3_bf16), "fused rows");
    for (int64_t i = 0; i < n; i++) ref[i] = m3_round_bf16(ref[i]); /* stored bf16 values */
    char w2[240];
    snprintf(w2, sizeof w2, "%s rows", what);
    expect_bits(ref, got, n, w2);
    if (cache) {
        void *h = dl_bytes(g, c.k, kb, "k cache");
        snprintf(w2, sizeof w2, "%s K", what), expect_bytes(kl.k, h, kb, w2), free(h);
        h = dl_bytes(g, c.v, vb, "v cache");
        snprintf(w2, sizeof w2, "%s V", what), expect_bytes(kl.v, h, vb, w2), free(h);
        if (fc->fp8) {
            h = dl_bytes(g, c.k_scale, sb, "k scales");
            snprintf(w2, sizeof w2, "%s K scales", what), expect_bytes(kl.k_scale, h, sb, w2), free(h);
            h = dl_bytes(g, c.v_scale, sb, "v scales");
            snprintf(w2, sizeof w2, "%s V scales", what), expect_bytes(kl.v_scale, h, sb, w2), free(h);
        }
        if (fc->index) {
            h = dl_bytes(g, c.index_k, ib, "index cache");
            snprintf(w2, sizeof w2, "%s index", what), expect_bytes(kl.index_k, h, ib, w2), free(h);
        }
    }
    m3_kv_layer_free(&kl);
    free(x); free(ref); free(got); free(wq); free(wk); free(wiq); free(wik); free(pos);
    free(slots); free(kf); free(bt);
}

static void qk_norm_rope_cache_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const fused_shape shapes[] = {
        {33, 64, 4, 128, 4, 128, 64, 0, "M3"},  /* packed 9856-wide sparse-layer row */
        {300, 64, 4, 128, 4, 128, 64, 0, "M3-300"}, /* >= 256 tokens: cos/sin table, many tiles */
        {1, 64, 4, 128, 0, 128, 64, 8, "M3-decode"},
        {9, 12, 6, 128, 3, 128, 64, 0, "H12"}, /* decode steps of 6 / 6 / 3 / 1 rows (qw_rps) */
        {80, 64, 4, 128, 4, 128, 64, 0, "M3-80"}, /* > 64 tokens: V rows 4 a step */
        {5, 3, 3, 80, 2, 48, 40, 3, "odd"},    /* odd pitch: the element-wise path */
        {7, 6, 3, 12, 3, 12, 6, 0, "tiny"},    /* the fixtures' heads (Di 12: index cache per element) */
    };
    /* page, fp8, index, index_fp8, fp8_max, k_src, ovf: the §4.7 writers */
    static const fused_cache caches[] = {
        {-1, false, false, false, 0, M3_GPU_KQ_STORED, M3_FP8_SATURATE, 0, 0, false},
        {0, false, true, false, 0, M3_GPU_KQ_STORED, M3_FP8_SATURATE, 0, 0, false},
        {128, false, false, false, 0, M3_GPU_KQ_STORED, M3_FP8_SATURATE, 0, 0, false},
        {16, false, true, false, 0, M3_GPU_KQ_STORED, M3_FP8_SATURATE, 0, 0, false},
        {128, true, false, false, 240, M3_GPU_KQ_F32, M3_FP8_SATURATE, 0, 0, false},           /* dense */
        {16, true, true, true, 448, M3_GPU_KQ_BF16_AMAX_F32, M3_FP8_SATURATE, 0, 0, false},   /* sparse */
        {16, true, true, true, 240, M3_GPU_KQ_F32, M3_FP8_OVF_NAN, 0, 0, false},              /* reuse */
        {128, true, true, true, 448, M3_GPU_KQ_STORED, M3_FP8_SATURATE, 0, 0, false},
        /* ref's paged storage through a block table: the fixtures' tiny geometry (element by
         * element) and M3's (the page-128 / 16 paths) */
        {-2, false, true, false, 0, M3_GPU_KQ_STORED, M3_FP8_SATURATE, 8, 1, false},
        {-2, true, true, true, 240, M3_GPU_KQ_F32, M3_FP8_SATURATE, 8, 1, false},
        {-2, true, true, true, 448, M3_GPU_KQ_BF16_AMAX_F32, M3_FP8_SATURATE, 8, 2, true},
        {-2, true, false, false, 448, M3_GPU_KQ_STORED, M3_FP8_OVF_NAN, 8, 4, true},
        {-2, false, true, true, 0, M3_GPU_KQ_STORED, M3_FP8_SATURATE, 128, 16, true},
        {-2, true, true, true, 240, M3_GPU_KQ_F32, M3_FP8_SATURATE, 128, 16, false},
        {-2, true, true, true, 448, M3_GPU_KQ_BF16_AMAX_F32, M3_FP8_SATURATE, 128, 16, true},
    };
    for (int prof = 1; prof < 3; prof++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t k = 0; k < sizeof caches / sizeof caches[0]; k++) {
                /* the fp32-k writers are atom's (qk_round ONCE) */
                if (caches[k].fp8 && caches[k].k_src != M3_GPU_KQ_STORED && prof != 2) continue;
                /* page 128 / 16 / 0 without ref's geometry need Dh % x == 0 (x = 16 fp8, 8 bf16) */
                if (caches[k].page >= 0 && shapes[s].Dh % (caches[k].fp8 ? 16 : 8)) continue;
                fused_case(g, &shapes[s], &caches[k], false, prof, false);
                if (s == 0 && caches[k].index)
                    fused_case(g, &shapes[s], &caches[k], false, prof, true);
                /* ref's paged storage with the paged index cache (the model's layout) */
                if (caches[k].page == -2 && caches[k].index) {
                    fused_case(g, &shapes[s], &caches[k], true, prof, false);
                    if (s == 0) fused_case(g, &shapes[s], &caches[k], true, prof, true);
                }
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rmsnorm_matches_ref),
        cmocka_unit_test(rmsnorm_add_matches_ref),
        cmocka_unit_test(rmsnorm_variants_same_bytes),
        cmocka_unit_test(qk_norm_rope_matches_ref),
        cmocka_unit_test(qk_norm_rope_cache_matches_ref),
    };
    return M3_RUN_GPU_TESTS(tests);
}
