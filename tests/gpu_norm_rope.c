/* tests/gpu_norm_rope.c: gpu/norm.hip and gpu/rope.hip against their ref twins (ref/norm.c,
 * ref/rope.c) on fresh random inputs, real M3 shapes (D = 6144; q/k/index_k slices of a
 * packed 9856-wide qkv row, Dh = 128, R = 64, theta = 5e6) and odd ones (T = 1, 3, 33;
 * D = 9, 1000; Dh = 80, R = 40), under every profile. fp32 storage paths must agree to
 * GPU_NMSE_F32 when the profile rounds nothing (fp32) and to GPU_NMSE_BF16 when it rounds;
 * bf16 storage paths to GPU_NMSE_BF16. Outputs are guarded and poisoned first. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    };
    for (int prof = 0; prof < 3; prof++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) rope_case(g, &shapes[s], prof);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rmsnorm_matches_ref),
        cmocka_unit_test(rmsnorm_add_matches_ref),
        cmocka_unit_test(rmsnorm_variants_same_bytes),
        cmocka_unit_test(qk_norm_rope_matches_ref),
    };
    return M3_RUN_GPU_TESTS(tests);
}
