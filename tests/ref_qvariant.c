/* tests/ref_qvariant.c: the quantization variants (ref/variant.h, ref/qload.h,
 * docs/quantization.md) on the committed fixtures: each variant alone against the fp32
 * baseline (teacher-forced from the baseline's own layer inputs, so each layer's error is its
 * own), the Quark round trip of `m3 quantize`, the MXFP4 activation switch at the bound, the
 * shared-expert fusion and the ptpc GEMM formula.
 *
 * Expected error sizes (NMSE of a stage against the fp32 baseline, teacher-forced): see the
 * table in docs/quantization.md (measured on these fixtures; bounds are the measured range
 * widened by 4x both ways: the error of a quantizer is a property of its grid, so a change
 * of 4x means a different grid or a missing/extra quantization point, not noise). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ref/linear.h"
#include "ref/model.h"
#include "ref/qload.h"
#include "ref/weights.h"
#include "tests/util.h"

/* bounds on the per-layer NMSE of the stage a variant changes (see the header comment) */
#define MXFP4_MLP_LO 7e-3 /* measured 3.0e-2 .. 3.6e-2 (weights only: T < 256) */
#define MXFP4_MLP_HI 1.5e-1
#define MXFP8_MLP_LO 9e-4 /* measured 3.7e-3 .. 4.4e-3 (weights + e4m3 activations) */
#define MXFP8_MLP_HI 1.8e-2
#define PTPC_PROJ_LO 2.5e-4 /* q_proj: measured 1.15e-3 .. 1.33e-3 (two e4m3 roundings) */
#define PTPC_PROJ_HI 5.5e-3
#define PTPC_ATTN_LO 7.5e-4 /* attn_proj: 3.2e-3 (dense) .. 5.1e-2 (sparse: the quantized */
#define PTPC_ATTN_HI 2.1e-1 /* index projections flip near-tie top-k blocks) */

/* ---- fixtures and runs ----------------------------------------------------------------------- */

static void fixture_path(char *buf, size_t n, int i) {
    if (i == 0)
        snprintf(buf, n, "fixtures/tiny-moe");
    else if (i == 1)
        snprintf(buf, n, "fixtures/tiny-deep");
    else
        snprintf(buf, n, "%s/fixtures/hf-tiny", m3_shared_dir());
}
#define N_FIX 3

/* One pass of tokens under profile/variant; captures every stage. base: teacher-forcing
 * source (NULL: free-running). */
static void run(m3_capture *c, const char *fx, const char *prof, const m3_variant *v,
                const int32_t *tok, int T, m3_capture *base) {
    m3_model *m = m3_test_open_model(fx, prof, NULL, v);
    m3_hooks hk = {.tap = m3_capture_tap, .tap_ctx = c};
    if (base) {
        hk.fetch = m3_capture_fetch;
        hk.fetch_ctx = base;
        hk.force_input = true;
    }
    m3_capture_clear(c);
    if (m3_model_forward(m, tok, NULL, T, &hk, "", NULL, NULL)) fail_msg("%s", m3_last_error());
    m3_model_close(m);
}

/* NMSE of stage key of b against a (a is the reference); -1 when a stage is missing */
static double nmse(const m3_capture *a, const m3_capture *b, const char *key) {
    const m3_tensor *x = m3_capture_get(a, key), *y = m3_capture_get(b, key);
    if (!x || !y) return -1;
    assert_int_equal(m3_tensor_numel(x), m3_tensor_numel(y));
    double num = 0, den = 0;
    const float *p = x->data, *q = y->data;
    for (int64_t i = 0; i < m3_tensor_numel(x); i++) {
        double d = (double)q[i] - (double)p[i];
        num += d * d;
        den += (double)p[i] * (double)p[i];
    }
    assert_true(den > 0); /* no vacuous comparisons */
    return num / den;
}

static bool identical(const m3_capture *a, const m3_capture *b, const char *key) {
    const m3_tensor *x = m3_capture_get(a, key), *y = m3_capture_get(b, key);
    assert_non_null(x);
    assert_non_null(y);
    return m3_tensor_numel(x) == m3_tensor_numel(y) &&
           !memcmp(x->data, y->data, (size_t)m3_tensor_numel(x) * 4);
}

static void layer_key(char *k, size_t n, const m3_config *c, int L, const char *stage) {
    snprintf(k, n, "layers/%0*d/%s", c->n_layer >= 100 ? 3 : 2, L, stage);
}

static m3_config *load_cfg(const char *fx) {
    char p[600];
    snprintf(p, sizeof p, "%s/model", fx);
    m3_config *c = NULL;
    if (m3_config_load(&c, p)) fail_msg("%s", m3_last_error());
    return c;
}

static bool verbose(void) {
    const char *e = getenv("M3_QV_VERBOSE");
    return e && e[0] == '1';
}

/* ---- each variant alone ------------------------------------------------------------------ */

/* Teacher-forced from the fp32 baseline: returns the mean over layers of the NMSE of stage
 * `stage` (MoE layers only when moe_only) and checks that `still` stays bit-identical on
 * every layer where the variant cannot act before it. */
static double variant_error(const char *fx, const m3_variant *v, const char *stage, bool moe_only,
                            const char *still, double lo, double hi, const char *what) {
    int T;
    int32_t *tok = m3_read_tokens(fx, &T);
    m3_config *cfg = load_cfg(fx);
    m3_capture *base = m3_capture_create(), *var = m3_capture_create();
    run(base, fx, "fp32", NULL, tok, T, NULL);
    run(var, fx, "fp32", v, tok, T, base);
    double sum = 0;
    int n = 0;
    char k[128];
    for (int L = 0; L < cfg->n_layer; L++) {
        if (moe_only && !cfg->layer_moe[L]) continue;
        layer_key(k, sizeof k, cfg, L, stage);
        double e = nmse(base, var, k);
        if (verbose()) printf("  %s %s %s nmse %.3g\n", fx, what, k, e);
        if (!(e >= lo && e <= hi))
            fail_msg("%s %s: %s NMSE %.3g outside [%g, %g]", fx, what, k, e, lo, hi);
        sum += e;
        n++;
        if (still) {
            layer_key(k, sizeof k, cfg, L, still);
            if (!identical(base, var, k)) fail_msg("%s %s: %s changed", fx, what, k);
        }
    }
    assert_true(n > 0);
    m3_capture_free(base);
    m3_capture_free(var);
    free(tok);
    m3_config_free(cfg);
    return sum / n;
}

static void experts_mx_change_mlp_not_attention(void **state) {
    (void)state;
    for (int f = 0; f < N_FIX; f++) {
        char fx[512];
        fixture_path(fx, sizeof fx, f);
        m3_variant v4, v8;
        m3_variant_default(&v4);
        m3_variant_default(&v8);
        assert_int_equal(m3_variant_set(&v4, "experts", "mxfp4"), M3_OK);
        assert_int_equal(m3_variant_set(&v8, "experts", "mxfp8"), M3_OK);
        double e4 = variant_error(fx, &v4, "mlp_out", true, "attn_proj", MXFP4_MLP_LO, MXFP4_MLP_HI,
                                  "mxfp4");
        double e8 = variant_error(fx, &v8, "mlp_out", true, "attn_proj", MXFP8_MLP_LO, MXFP8_MLP_HI,
                                  "mxfp8");
        printf("%s: mean MoE mlp_out NMSE mxfp4 %.3g, mxfp8 %.3g\n", fx, e4, e8);
        assert_true(e8 < e4 / 4); /* 3 mantissa bits vs 1: far smaller */
    }
}

static void ptpc_changes_attention_projections(void **state) {
    (void)state;
    for (int f = 0; f < N_FIX; f++) {
        char fx[512];
        fixture_path(fx, sizeof fx, f);
        m3_variant v;
        m3_variant_default(&v);
        assert_int_equal(m3_variant_set(&v, "ptpc", "fp8"), M3_OK);
        /* attn_proj changes on every layer; q_proj too; attn_norm (its input) does not */
        double eq =
            variant_error(fx, &v, "q_proj", false, "attn_norm", PTPC_PROJ_LO, PTPC_PROJ_HI, "ptpc");
        double e =
            variant_error(fx, &v, "attn_proj", false, NULL, PTPC_ATTN_LO, PTPC_ATTN_HI, "ptpc");
        printf("%s: mean attn_proj NMSE ptpc %.3g (q_proj %.3g)\n", fx, e, eq);
    }
}

/* ---- round trip -------------------------------------------------------------------------- */

static char tmpdir[256];

static void quantize_to(const char *fx, const char *exp, char *out, size_t n) {
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/m3_qv_XXXXXX");
        assert_non_null(mkdtemp(tmpdir));
    }
    static int k;
    snprintf(out, n, "%s/q%d", tmpdir, k++);
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "%s quantize --model %s/model --out %s --experts %s", m3_bin(), fx,
             out, exp);
    int rc = m3_run_cmd(cmd, &o);
    if (rc != 0) fail_msg("%s: rc %d: %s", cmd, rc, o ? o : "");
    free(o);
}

/* every expert linear: the written Quark tensors decode to exactly the weights that
 * quantize-on-load makes (the stored form is read through the same loader as a real MXFP4
 * checkpoint) */
static void quark_roundtrip_same_weights(void **state) {
    (void)state;
    const char *fmts[] = {"mxfp4", "mxfp8"};
    for (int f = 0; f < N_FIX; f += 2) { /* tiny-deep has D = 48: no whole 1x32 blocks */
        char fx[512], q[512], p[600];
        fixture_path(fx, sizeof fx, f);
        for (int fi = 0; fi < 2; fi++) {
            quantize_to(fx, fmts[fi], q, sizeof q);
            m3_config *cfg = load_cfg(fx);
            m3_weights *wa = NULL, *wb = NULL;
            snprintf(p, sizeof p, "%s/model", fx);
            assert_int_equal(m3_weights_open(&wa, p), M3_OK);
            assert_int_equal(m3_weights_open(&wb, q), M3_OK);
            m3_config *cq = NULL; /* config.json of the copy */
            if (m3_config_load(&cq, q)) fail_msg("%s", m3_last_error());
            assert_int_equal(cq->quant.method, M3_QUANT_QUARK);
            assert_int_equal(cq->quant.weight_dtype, fi ? M3_DT_F8_E4M3 : M3_DT_F4);
            assert_int_equal(m3_weights_check(wb, cq, NULL), M3_OK);
            assert_int_equal(m3_weights_quant_mismatch(wb, cq, NULL, 0), 0);
            m3_variant v;
            m3_variant_default(&v);
            assert_int_equal(m3_variant_set(&v, "experts", fmts[fi]), M3_OK);
            int checked = 0;
            for (int L = 0; L < cfg->n_layer; L++) {
                if (!cfg->layer_moe[L]) continue;
                m3_layer_weights la, lb;
                assert_int_equal(m3_layer_weights_load_v(&la, wa, cfg, L, &v, NULL), M3_OK);
                assert_int_equal(m3_layer_weights_load_v(&lb, wb, cq, L, NULL, NULL), M3_OK);
                for (int e = 0; e <= cfg->n_expert; e++) {
                    const m3_mlp_weights *ma =
                        e < cfg->n_expert ? &la.moe.experts[e] : &la.moe.shared;
                    const m3_mlp_weights *mb =
                        e < cfg->n_expert ? &lb.moe.experts[e] : &lb.moe.shared;
                    assert_int_equal(ma->fmt, fi ? M3_WFMT_MXFP8 : M3_WFMT_MXFP4);
                    assert_int_equal(mb->fmt, ma->fmt);
                    int F = e < cfg->n_expert ? cfg->expert_inter : cfg->shared_inter;
                    const void *pa[3] = {ma->gate, ma->up, ma->down};
                    const void *pb[3] = {mb->gate, mb->up, mb->down};
                    for (int j = 0; j < 3; j++) {
                        int rows = j < 2 ? F : cfg->hidden, cols = j < 2 ? cfg->hidden : F;
                        const m3_wq *a = pa[j], *b = pb[j];
                        size_t cb = (size_t)rows * (size_t)(fi ? cols : cols / 2);
                        assert_memory_equal(a->codes, b->codes, cb);
                        assert_memory_equal(a->scale, b->scale, (size_t)rows * (cols / 32));
                        checked++;
                    }
                }
                m3_layer_weights_free(&la);
                m3_layer_weights_free(&lb);
            }
            assert_true(checked > 0);
            m3_weights_close(wa);
            m3_weights_close(wb);
            m3_config_free(cfg);
            m3_config_free(cq);
        }
    }
}

/* m3 run on the quantized checkpoint (stored) == --experts mxfp4 on the bf16 one, every
 * stage bit for bit */
static void quark_roundtrip_same_run(void **state) {
    (void)state;
    for (int f = 0; f < N_FIX; f += 2) {
        char fx[512], q[512];
        fixture_path(fx, sizeof fx, f);
        quantize_to(fx, "mxfp4", q, sizeof q);
        int T;
        int32_t *tok = m3_read_tokens(fx, &T);
        m3_variant v;
        m3_variant_default(&v);
        assert_int_equal(m3_variant_set(&v, "experts", "mxfp4"), M3_OK);
        assert_int_equal(m3_variant_set(&v, "moe_act_bound", "64"), M3_OK); /* A4W4 too */
        m3_capture *a = m3_capture_create(), *b = m3_capture_create();
        run(a, fx, "atom", &v, tok, T, NULL);
        /* the copy, as stored (the default variant), with the same bound */
        m3_variant vs;
        m3_variant_default(&vs);
        assert_int_equal(m3_variant_set(&vs, "moe_act_bound", "64"), M3_OK);
        char qfx[600];
        snprintf(qfx, sizeof qfx, "%s", q);
        /* run() appends /model: point it at the parent by a symlink-free path trick */
        char link[700];
        snprintf(link, sizeof link, "%s_fx", q);
        mkdir(link, 0777);
        char lm[800];
        snprintf(lm, sizeof lm, "%s/model", link);
        if (symlink(q, lm) != 0) fail_msg("symlink %s", lm);
        run(b, link, "atom", &vs, tok, T, NULL);
        assert_int_equal(a->n, b->n);
        for (int i = 0; i < a->n; i++) {
            assert_string_equal(a->key[i], b->key[i]);
            if (!identical(a, b, a->key[i])) fail_msg("%s: stage %s differs", fx, a->key[i]);
        }
        m3_capture_free(a);
        m3_capture_free(b);
        free(tok);
    }
}

/* ---- MXFP4 activation switch ------------------------------------------------------------- */

/* A pass of bound-1 tokens keeps bf16/fp32 activations (equal to bound 0 = never); a pass of
 * bound tokens quantizes them (equal to bound 1 = always, different from never). */
static void mxfp4_activation_switch_at_bound(void **state) {
    (void)state;
    const char *fx = "fixtures/tiny-moe";
    const int B = 16;
    int T;
    int32_t *tok = m3_read_tokens(fx, &T);
    m3_config *cfg = load_cfg(fx);
    int L = 0;
    while (!cfg->layer_moe[L])
        L++;
    char k[128];
    layer_key(k, sizeof k, cfg, L, "mlp_out");
    m3_capture *c[3];
    for (int i = 0; i < 3; i++)
        c[i] = m3_capture_create();
    for (int n = B - 1; n <= B; n++) {
        const char *bounds[3] = {"16", "0", "1"};
        for (int i = 0; i < 3; i++) {
            m3_variant v;
            m3_variant_default(&v);
            assert_int_equal(m3_variant_set(&v, "experts", "mxfp4"), M3_OK);
            assert_int_equal(m3_variant_set(&v, "moe_act_bound", bounds[i]), M3_OK);
            run(c[i], fx, "fp32", &v, tok, n, NULL);
        }
        bool never = identical(c[0], c[1], k), always = identical(c[0], c[2], k);
        if (verbose()) printf("  pass of %d tokens: ==never %d ==always %d\n", n, never, always);
        assert_true(n < B ? never : always);
        assert_false(n < B ? always : never);
        for (int i = 0; i < 3; i++)
            m3_capture_clear(c[i]);
    }
    for (int i = 0; i < 3; i++)
        m3_capture_free(c[i]);
    free(tok);
    m3_config_free(cfg);
}

/* ---- shared fusion ----------------------------------------------------------------------- */

/* fp32: fused == unfused bit for bit (x rsf = 2 is exact, the sums only regroup by an exact
 * scale); atom: they differ only by the extra bf16 rounding of 2R in the unfused path:
 * |fused - unfused| <= ulp_bf16(2R)/2 + ulp_bf16(y) per element. auto = on under atom. */
static void shared_fusion_equals_unfused(void **state) {
    (void)state;
    const char *fx = "fixtures/tiny-moe";
    int T;
    int32_t *tok = m3_read_tokens(fx, &T);
    m3_config *cfg = load_cfg(fx);
    const char *profs[2] = {"fp32", "atom"};
    for (int pi = 0; pi < 2; pi++) {
        m3_capture *base = m3_capture_create(), *on = m3_capture_create(),
                *off = m3_capture_create(), *au = m3_capture_create();
        m3_variant v;
        m3_variant_default(&v);
        assert_int_equal(m3_variant_set(&v, "experts", "mxfp4"), M3_OK);
        run(base, fx, profs[pi], &v, tok, T, NULL);
        assert_int_equal(m3_variant_set(&v, "shared_fused", "on"), M3_OK);
        run(on, fx, profs[pi], &v, tok, T, base);
        assert_int_equal(m3_variant_set(&v, "shared_fused", "off"), M3_OK);
        run(off, fx, profs[pi], &v, tok, T, base);
        assert_int_equal(m3_variant_set(&v, "shared_fused", "auto"), M3_OK);
        run(au, fx, profs[pi], &v, tok, T, base);
        int n = 0;
        for (int L = 0; L < cfg->n_layer; L++) {
            if (!cfg->layer_moe[L]) continue;
            char k[128], ks[128];
            layer_key(k, sizeof k, cfg, L, "mlp_out");
            layer_key(ks, sizeof ks, cfg, L, "shared_out");
            assert_null(m3_capture_get(on, ks)); /* fused: no separate shared expert stage */
            assert_non_null(m3_capture_get(off, ks));
            /* auto: fused under atom only */
            assert_true(pi == 1 ? identical(au, on, k) : identical(au, off, k));
            const m3_tensor *a = m3_capture_get(on, k), *b = m3_capture_get(off, k),
                            *s = m3_capture_get(off, ks);
            const float *ya = a->data, *yb = b->data, *ys = s->data;
            int64_t nd = 0;
            for (int64_t i = 0; i < m3_tensor_numel(a); i++) {
                if (pi == 0) {
                    if (ya[i] != yb[i]) nd++;
                    continue;
                }
                /* |2R| <= |y| + |S|; bf16 has 8 significant bits: ulp(v) = 2^(ilogb v - 7) */
                float r2 = fabsf(yb[i]) + fabsf(ys[i]), ym = fmaxf(fabsf(ya[i]), fabsf(yb[i]));
                double tol = ldexp(1.0, ilogbf(r2) - 8) + ldexp(1.0, ilogbf(ym) - 7);
                if (fabs((double)ya[i] - (double)yb[i]) > tol) nd++;
            }
            if (nd)
                fail_msg("%s: %s: %lld elements beyond the fusion rounding", profs[pi], k,
                         (long long)nd);
            n++;
        }
        assert_true(n > 0);
        m3_capture_free(base);
        m3_capture_free(on);
        m3_capture_free(off);
        m3_capture_free(au);
    }
    free(tok);
    m3_config_free(cfg);
}

/* ---- ptpc GEMM --------------------------------------------------------------------------- */

/* y = (sum q_x q_w) s_x s_w with the §5.6 quantizers, an all-zero activation row NaN under
 * ptpc_zero_row=nan and 0 under one. Reference in double from the same codes. */
static void ptpc_gemm_formula_and_zero_row(void **state) {
    (void)state;
    enum { T = 5, K = 70, N = 9 };
    m3_rng rng;
    m3_rng_init(&rng, m3_test_seed(), 11);
    float x[T * K], w[N * K];
    for (int i = 0; i < T * K; i++)
        x[i] = m3_rng_uniform(&rng, -3.0f, 3.0f);
    for (int i = 0; i < N * K; i++)
        w[i] = m3_rng_uniform(&rng, -0.5f, 0.5f);
    for (int k = 0; k < K; k++)
        x[2 * K + k] = 0.0f; /* row 2: all zero */
    for (int z = 0; z < 2; z++) {
        m3_variant v;
        m3_variant_default(&v);
        assert_int_equal(m3_variant_set(&v, "ptpc_zero_row", z ? "one" : "nan"), M3_OK);
        m3_qstore *q = NULL;
        assert_int_equal(m3_qstore_create(&q, &v), M3_OK);
        m3_wmat wm = {M3_WFMT_F32, w, N, K};
        assert_int_equal(m3_qload_ptpc(&wm, q), M3_OK);
        assert_int_equal(wm.fmt, M3_WFMT_FP8_ROW);
        const m3_wq *wq = wm.data;
        float y[T * N];
        void *sc = malloc(m3_linear_q_scratch_bytes(T, K));
        m3_profile p;
        m3_profile_fp32(&p);
        m3_linear_q(y, N, x, K, &wm, T, T, &p, sc);
        uint8_t qx[K];
        float sx;
        for (int t = 0; t < T; t++) {
            m3_fp8_quantize_rows(qx, &sx, x + t * K, 1, K, &q->ptpc.fp8);
            for (int n = 0; n < N; n++) {
                double acc = 0;
                for (int k = 0; k < K; k++)
                    acc += (double)m3_fp8_to_f32(qx[k], M3_FP8_E4M3FN) *
                           (double)m3_fp8_to_f32(((const uint8_t *)wq->codes)[n * K + k],
                                                 M3_FP8_E4M3FN);
                double want = acc * (double)sx * (double)((const float *)wq->scale)[n];
                float got = y[t * N + n];
                if (t == 2) {
                    if (z == 0)
                        assert_true(isnan(got));
                    else
                        assert_true(got == 0.0f); /* codes 0, s_x = 1 */
                    continue;
                }
                /* fp32 accumulation of K products of 4-bit significands: a few ulps */
                if (fabs((double)got - want) > 1e-5 * (fabs(want) + 1e-3))
                    fail_msg("t %d n %d: %g vs %g (seed %llu)", t, n, (double)got, want,
                             (unsigned long long)m3_test_seed());
            }
        }
        free(sc);
        m3_qstore_free(q);
    }
}

/* MX weights through the GEMM equal the dequantized fp32 weights (naive order: exact). */
static void mx_gemm_equals_dequantized(void **state) {
    (void)state;
    enum { T = 3, K = 80, N = 7 };
    m3_rng rng;
    m3_rng_init(&rng, m3_test_seed(), 11);
    float x[T * K], w[N * K], wd[N * K], y1[T * N], y2[T * N];
    for (int i = 0; i < T * K; i++)
        x[i] = m3_rng_uniform(&rng, -2.0f, 2.0f);
    for (int i = 0; i < N * K; i++)
        w[i] = m3_rng_uniform(&rng, -1.0f, 1.0f);
    setenv("M3_NAIVE_GEMM", "1", 1);
    for (int fp4 = 0; fp4 < 2; fp4++) {
        m3_variant v;
        m3_variant_default(&v);
        m3_mx_params mp = m3_mx_params_default(fp4 ? M3_MX_E2M1 : M3_MX_E4M3FN);
        uint8_t codes[N * K];
        m3_e8m0 sc[N * 3];
        memset(codes, 0, sizeof codes);
        m3_qload_mx_weight(codes, sc, w, N, K, fp4, &v);
        m3_mx_dequantize(wd, codes, sc, N, K, &mp);
        m3_wq wq = {codes, sc, NULL};
        m3_wmat a = {fp4 ? M3_WFMT_MXFP4 : M3_WFMT_MXFP8, &wq, N, K}, b = {M3_WFMT_F32, wd, N, K};
        m3_profile p;
        m3_profile_fp32(&p);
        m3_linear_q(y1, N, x, K, &a, T, T, &p, NULL);
        m3_linear_p(y2, N, x, K, &b, T, &p);
        assert_memory_equal(y1, y2, sizeof y1);
    }
    unsetenv("M3_NAIVE_GEMM");
}

static void variant_keys_and_json(void **state) {
    (void)state;
    m3_variant v;
    m3_variant_default(&v);
    assert_int_equal(m3_variant_set(&v, "experts-scale", "floor"), M3_OK);
    assert_int_equal(m3_variant_set(&v, "moe-act-bound", "0"), M3_OK);
    assert_int_equal(m3_variant_set(&v, "ptpc", "fp8"), M3_OK);
    assert_int_equal(m3_variant_set(&v, "experts", "mxfp7"), M3_ERR_ARG);
    assert_int_equal(m3_variant_set(&v, "moe_act_bound", "-1"), M3_ERR_ARG);
    char j[2048];
    m3_variant_json(&v, j, sizeof j);
    assert_non_null(strstr(j, "\"experts_scale\":\"floor\""));
    assert_non_null(strstr(j, "\"moe_act_bound\":0"));
    assert_non_null(strstr(j, "\"ptpc\":\"fp8\""));
    assert_false(m3_variant_is_default(&v));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(variant_keys_and_json),
        cmocka_unit_test(mx_gemm_equals_dequantized),
        cmocka_unit_test(ptpc_gemm_formula_and_zero_row),
        cmocka_unit_test(experts_mx_change_mlp_not_attention),
        cmocka_unit_test(ptpc_changes_attention_projections),
        cmocka_unit_test(mxfp4_activation_switch_at_bound),
        cmocka_unit_test(shared_fusion_equals_unfused),
        cmocka_unit_test(quark_roundtrip_same_weights),
        cmocka_unit_test(quark_roundtrip_same_run),
    };
    int rc = M3_RUN_TESTS(tests);
    if (tmpdir[0]) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return rc;
}
