/* tests/ref_model.c: the whole reference forward (ref/model.h, ref/layer.h) against the
 * transformers oracle fixtures, decode against full forward, and thread determinism.
 *
 * Fixtures: ../shared/fixtures/hf-tiny (always) plus every fixtures/tiny-NAME and
 * ../shared/fixtures/tiny-NAME present (the project's own oracle fixtures): each holds model/,
 * hf_fp32.h5, hf_bf16.h5 and optionally hf_fp32_decode.h5 (multi-pass). Stages are compared
 * at tap time, as the forward produces them, against the stage of the same key in the dump;
 * stages the dump lacks are skipped, and each test requires that the key stages (layer
 * outputs, index_topk, expert_ids, logits) were compared, so nothing passes vacuously.
 *
 * Gates (issue 4's acceptance criteria, where the reasons live):
 *   fp32 run vs transformers float32: every float stage NMSE <= 1e-8 (independent fp32
 *     implementations agree to ~1e-12, spec §10; 1e-8 leaves room for summation order only),
 *     index_topk / expert_ids identical sets on >= 99.5% of rows;
 *   hf replay (teacher-forced) vs transformers bf16: each layer's stages NMSE <= 1e-4 (a few
 *     bf16 ulps of the stage's own roundings, spec §10 measured ~1e-5), sets >= 98% (1 row in
 *     300 flips on a one-ulp router near-tie, spec §10);
 *   decode step vs full forward (fp32): logits NMSE <= 1e-10, same argmax (hf: the bf16
 *   bound above, same argmax). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

#include "compare/diff.h"
#include "compare/dump.h"
#include "ref/model.h"
#include "tests/util.h"

#define GATE_FP32_NMSE   1e-8
#define GATE_FP32_AGREE  0.995
#define GATE_HF_NMSE     1e-4
#define GATE_HF_AGREE    0.98
#define GATE_DECODE_NMSE 1e-10

/* ---- fixtures ---------------------------------------------------------------------------- */

#define MAX_FIX 8
static char fix_dir[MAX_FIX][512];
static int n_fix;

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* hf-tiny first, then every tiny-NAME/ with a model under fixtures/ (the project's own oracle
 * fixtures) and under the shared fixtures, in name order */
static int name_cmp(const void *a, const void *b) {
    return strcmp(a, b);
}

static void scan_dir(const char *root) {
    DIR *d = opendir(root);
    if (!d) return;
    char found[MAX_FIX][512];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_FIX) {
        char p[1024];
        if (strncmp(e->d_name, "tiny-", 5) != 0) continue;
        snprintf(p, sizeof p, "%s/%s/model/config.json", root, e->d_name);
        if (exists(p)) snprintf(found[n++], 512, "%s/%.200s", root, e->d_name);
    }
    closedir(d);
    qsort(found, (size_t)n, sizeof found[0], name_cmp);
    for (int i = 0; i < n && n_fix < MAX_FIX; i++)
        memcpy(fix_dir[n_fix++], found[i], 512);
}

static void find_fixtures(void) {
    if (n_fix) return;
    snprintf(fix_dir[n_fix++], 512, "%s/fixtures/hf-tiny", m3_shared_dir());
    char shared_fx[512];
    snprintf(shared_fx, sizeof shared_fx, "%s/fixtures", m3_shared_dir());
    scan_dir("fixtures");
    scan_dir(shared_fx);
}

/* ---- the comparing tap ------------------------------------------------------------------- */

typedef struct {
    m3_dump *ref;
    double worst_nmse;
    char worst_key[128];
    double worst_agree;
    char worst_set_key[128];
    int n_float, n_set, n_output, n_logits;
    double gate_nmse, gate_agree;
    int n_fail;
    char first_fail[512];
    int32_t *our_ids; /* copy of the last expert_ids we tapped (for expert_weights) */
    int64_t our_ids_n;
} cmp_ctx;

static const char *stage_of(const char *key) {
    const char *s = strrchr(key, '/');
    return s ? s + 1 : key;
}

static void fail_once(cmp_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_once(cmp_ctx *c, const char *fmt, ...) {
    if (c->n_fail++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->first_fail, sizeof c->first_fail, fmt, ap);
        va_end(ap);
    }
}

static m3_status cmp_tap(void *vctx, const char *key, const m3_tensor *t, const char *dt) {
    (void)dt;
    cmp_ctx *c = vctx;
    if (!m3_dump_has(c->ref, key)) return M3_OK;
    m3_tensor r = {0};
    if (m3_dump_read(c->ref, key, &r)) return M3_ERR_IO;
    const char *st = stage_of(key);
    int64_t nr = m3_tensor_numel(&r), nt = m3_tensor_numel(t);
    if (!strcmp(st, "expert_ids")) {
        free(c->our_ids);
        c->our_ids = malloc((size_t)nt * 4);
        memcpy(c->our_ids, t->data, (size_t)nt * 4);
        c->our_ids_n = nt;
    }
    if (!strcmp(st, "index_topk") || !strcmp(st, "expert_ids")) {
        /* sets per row of the last dim; HF's index_topk may be narrower (min(K, blocks)) */
        int wa = (int)r.shape[r.rank - 1], wb = (int)t->shape[t->rank - 1];
        int64_t rows = nr / wa;
        if (rows != nt / wb) {
            fail_once(c, "%s: %lld rows vs %lld", key, (long long)rows, (long long)(nt / wb));
        } else {
            m3_setdiff sd;
            m3_setdiff_init(&sd);
            m3_setdiff_rows(&sd, r.data, wa, t->data, wb, rows, NULL, 0, 0, 0, 0);
            double ag = m3_setdiff_agree(&sd);
            if (ag < c->worst_agree) {
                c->worst_agree = ag;
                snprintf(c->worst_set_key, sizeof c->worst_set_key, "%s", key);
            }
            if (ag < c->gate_agree)
                fail_once(c, "%s: set agreement %.4f < %.4f", key, ag, c->gate_agree);
            c->n_set++;
        }
    } else if (t->dtype == M3_DT_F32 && r.dtype == M3_DT_F32) {
        const float *a = r.data, *b = t->data;
        int64_t n = nr;
        if (!strcmp(st, "logits") && nr < nt)
            b += nt - nr; /* dump kept the last rows */
        else if (nr != nt) {
            fail_once(c, "%s: %lld elements vs %lld", key, (long long)nr, (long long)nt);
            n = 0;
        }
        float *sa = NULL, *sb = NULL;
        if (n && !strcmp(st, "expert_weights")) {
            /* aligned with expert_ids: sort each row by id on both sides, keep rows whose
             * sets agree (a flipped set is counted by the expert_ids check) */
            char ik[160];
            snprintf(ik, sizeof ik, "%.*sexpert_ids", (int)(st - key), key);
            m3_tensor ri = {0};
            int K = (int)r.shape[1];
            if (c->our_ids && c->our_ids_n == n && m3_dump_read(c->ref, ik, &ri) == M3_OK) {
                sa = malloc((size_t)n * sizeof *sa);
                sb = malloc((size_t)n * sizeof *sb);
                int64_t m = 0;
                for (int64_t row = 0; row < n / K; row++) {
                    int32_t *ia = (int32_t *)ri.data + row * K, *ib = c->our_ids + row * K;
                    if (!m3_same_id_set(ia, K, ib, K)) continue;
                    memcpy(sa + m, a + row * K, (size_t)K * sizeof *sa);
                    memcpy(sb + m, b + row * K, (size_t)K * sizeof *sb);
                    m3_sort_by_id(ia, sa + m, K);
                    m3_sort_by_id(ib, sb + m, K);
                    m += K;
                }
                m3_tensor_free(&ri);
                a = sa;
                b = sb;
                n = m;
            }
        }
        if (n) {
            m3_diff d = m3_diff_f32(a, b, n, 1, 0.01);
            double e = d.nonfinite_mismatch ? (double)INFINITY : m3_diff_nmse(&d);
            if (e > c->worst_nmse) {
                c->worst_nmse = e;
                snprintf(c->worst_key, sizeof c->worst_key, "%s", key);
            }
            if (!(e <= c->gate_nmse)) fail_once(c, "%s: NMSE %.3g > %.3g", key, e, c->gate_nmse);
            c->n_float++;
            if (!strcmp(st, "output")) c->n_output++;
            if (!strcmp(st, "logits")) c->n_logits++;
        }
        free(sa);
        free(sb);
    }
    m3_tensor_free(&r);
    return M3_OK;
}

static m3_status fetch_dump(void *ctx, const char *key, m3_tensor *out) {
    m3_dump *d = ctx;
    if (!m3_dump_has(d, key)) return m3_errorf(M3_ERR_MISSING, "no stage %s", key);
    return m3_dump_read(d, key, out);
}

static int32_t *read_i32(m3_dump *d, const char *key, int *n) {
    m3_tensor t = {0};
    if (m3_dump_read(d, key, &t)) return NULL;
    *n = (int)t.shape[0];
    return t.data;
}

/* Run (or replay) the model over every pass of dump `path` with profile `prof`, comparing at
 * tap time. Returns false when the dump is absent. */
static bool check_dump(const char *fdir, const char *file, const char *prof, bool replay,
                       double gate_nmse, double gate_agree, cmp_ctx *c) {
    char path[640], model[640];
    snprintf(path, sizeof path, "%s/%s", fdir, file);
    snprintf(model, sizeof model, "%s/model", fdir);
    if (!exists(path)) return false;
    memset(c, 0, sizeof *c);
    c->worst_agree = 1.0;
    snprintf(c->worst_set_key, sizeof c->worst_set_key, "all equal");
    c->gate_nmse = gate_nmse;
    c->gate_agree = gate_agree;
    if (m3_dump_open(&c->ref, path, M3_DUMP_READ)) fail_msg("%s", m3_last_error());
    m3_profile p;
    assert_int_equal(m3_profile_by_name(&p, prof), M3_OK);
    m3_model *m = NULL;
    if (m3_model_open(&m, model, NULL, &p)) fail_msg("%s", m3_last_error());
    bool multi = m3_dump_has(c->ref, "passes/0000/tokens");
    for (int pass = 0;; pass++) {
        char prefix[32] = "", key[64];
        if (multi)
            snprintf(prefix, sizeof prefix, "passes/%04d/", pass);
        else if (pass)
            break;
        snprintf(key, sizeof key, "%stokens", prefix);
        if (!m3_dump_has(c->ref, key)) break;
        int nt = 0;
        int32_t *tok = read_i32(c->ref, key, &nt);
        assert_non_null(tok);
        m3_hooks hk = {.tap = cmp_tap, .tap_ctx = c};
        if (replay) {
            hk.fetch = fetch_dump;
            hk.fetch_ctx = c->ref;
            hk.force_input = true;
        }
        int32_t next;
        m3_status s = m3_model_forward(m, tok, NULL, nt, &hk, prefix, NULL, &next);
        free(tok);
        if (s) fail_msg("%s %s pass %d: %s", path, prof, pass, m3_last_error());
    }
    m3_model_close(m);
    m3_dump_close(c->ref);
    free(c->our_ids);
    c->our_ids = NULL;
    printf("  %-40s %-5s %-6s: %d float stages, worst NMSE %.3g (%s); %d set stages, worst "
           "agreement %.4f (%s)\n",
           path, prof, replay ? "replay" : "run", c->n_float, c->worst_nmse, c->worst_key, c->n_set,
           c->worst_agree, c->n_set ? c->worst_set_key : "-");
    if (c->n_fail)
        fail_msg("%s (%s): %d failures; first: %s", path, prof, c->n_fail, c->first_fail);
    /* nothing vacuous: layer outputs and logits were compared */
    if (c->n_output == 0 || c->n_logits == 0)
        fail_msg("%s: no layer output / logits stage compared", path);
    return true;
}

static void fp32_run_matches_transformers_fp32(void **state) {
    (void)state;
    find_fixtures();
    int done = 0;
    cmp_ctx c;
    for (int i = 0; i < n_fix; i++) {
        if (check_dump(fix_dir[i], "hf_fp32.h5", "fp32", false, GATE_FP32_NMSE, GATE_FP32_AGREE,
                       &c)) {
            done++;
            if (c.n_set == 0) fail_msg("%s: no index_topk / expert_ids compared", fix_dir[i]);
        }
        /* multi-pass decode dump: every decode pass has every stage */
        if (check_dump(fix_dir[i], "hf_fp32_decode.h5", "fp32", false, GATE_FP32_NMSE,
                       GATE_FP32_AGREE, &c))
            done++;
    }
    assert_true(done >= 1);
}

static void hf_replay_matches_transformers_bf16(void **state) {
    (void)state;
    find_fixtures();
    int done = 0;
    cmp_ctx c;
    for (int i = 0; i < n_fix; i++)
        if (check_dump(fix_dir[i], "hf_bf16.h5", "hf", true, GATE_HF_NMSE, GATE_HF_AGREE, &c)) {
            done++;
            if (c.n_set == 0) fail_msg("%s: no index_topk / expert_ids compared", fix_dir[i]);
        }
    assert_true(done >= 1);
}

static int32_t *fixture_tokens(int *n) {
    char p[512];
    snprintf(p, sizeof p, "%s/fixtures/hf-tiny/hf_fp32.h5", m3_shared_dir());
    m3_dump *d = NULL;
    if (m3_dump_open(&d, p, M3_DUMP_READ)) fail_msg("%s", m3_last_error());
    int32_t *tok = read_i32(d, "tokens", n);
    m3_dump_close(d);
    assert_non_null(tok);
    return tok;
}

static m3_model *open_tiny(const char *prof) {
    char p[512];
    snprintf(p, sizeof p, "%s/fixtures/hf-tiny", m3_shared_dir());
    return m3_test_open_model(p, prof, NULL, NULL);
}

/* Prefill T0 tokens, then decode 5 single tokens; each decode step's logits must equal row
 * T0+i of one full forward over all T0+5 tokens. T0 = 62 with block 16 / top-3: positions
 * 62..66 cross a block boundary and select 3 of 4-5 blocks (really sparse). */
static void decode_equals_full_forward(void **state) {
    (void)state;
    const char *profs[] = {"fp32", "hf"};
    int n_tok;
    int32_t *tok = fixture_tokens(&n_tok);
    const int T0 = 62, N = 5;
    assert_true(n_tok >= T0 + N);
    for (int pi = 0; pi < 2; pi++) {
        m3_model *m = open_tiny(profs[pi]);
        int V = m3_model_config(m)->vocab;
        m3_capture *full = m3_capture_create();
        m3_hooks hk = {.tap = m3_capture_tap, .tap_ctx = full};
        assert_int_equal(m3_model_forward(m, tok, NULL, T0 + N, &hk, "", NULL, NULL), M3_OK);
        const m3_tensor *lg = m3_capture_get(full, "logits");
        assert_non_null(lg);
        m3_model_reset(m);
        float *last = malloc((size_t)V * sizeof *last);
        int32_t next;
        assert_int_equal(m3_model_forward(m, tok, NULL, T0, NULL, "", last, &next), M3_OK);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            assert_int_equal(m3_model_n_past(m), T0 + i);
            assert_int_equal(m3_model_forward(m, &tok[T0 + i], NULL, 1, NULL, "", last, &next),
                             M3_OK);
            const float *row = (const float *)lg->data + (size_t)(T0 + i) * V;
            m3_diff d = m3_diff_f32(row, last, V, V, 0.01);
            double e = m3_diff_nmse(&d);
            if (e > worst) worst = e;
            /* fp32: the gate. hf: a decode GEMM of one row may sum in another order
             * than the prefill GEMM (ref/linear.h streamed-dot path for T <= 4), and one
             * flipped bf16 rounding propagates, so only the per-stage bf16 bound applies */
            double gate = pi == 0 ? GATE_DECODE_NMSE : GATE_HF_NMSE;
            if (!(e <= gate))
                fail_msg("%s decode step %d: logits NMSE %.3g vs full forward", profs[pi], i, e);
            assert_int_equal(next, m3_argmax(row, V));
        }
        printf("  decode vs full forward (%s, T0=%d, %d steps): worst logits NMSE %.3g\n",
               profs[pi], T0, N, worst);
        free(last);
        m3_capture_free(full);
        m3_model_close(m);
    }
    free(tok);
}

/* Every stage bit-identical for 1, 2 and 3 threads (fp32 and hf, prefill + one decode step). */
static void threads_bit_identical(void **state) {
    (void)state;
    int n_tok;
    int32_t *tok = fixture_tokens(&n_tok);
    const char *profs[] = {"fp32", "hf"};
    for (int pi = 0; pi < 2; pi++) {
        m3_capture *ref = m3_capture_create(), *got = m3_capture_create();
        for (int th = 1; th <= 3; th++) {
            m3_set_threads(th);
            m3_capture *c = th == 1 ? ref : got;
            m3_model *m = open_tiny(profs[pi]);
            m3_hooks hk = {.tap = m3_capture_tap, .tap_ctx = c};
            assert_int_equal(m3_model_forward(m, tok, NULL, n_tok - 1, &hk, "p0/", NULL, NULL),
                             M3_OK);
            assert_int_equal(m3_model_forward(m, &tok[n_tok - 1], NULL, 1, &hk, "p1/", NULL, NULL),
                             M3_OK);
            m3_model_close(m);
            if (th == 1) continue;
            assert_int_equal(got->n, ref->n);
            for (int i = 0; i < ref->n; i++) {
                assert_string_equal(got->key[i], ref->key[i]);
                size_t b = (size_t)m3_tensor_numel(&ref->t[i]) * 4;
                assert_int_equal(m3_tensor_numel(&got->t[i]), m3_tensor_numel(&ref->t[i]));
                if (memcmp(got->t[i].data, ref->t[i].data, b))
                    fail_msg("%s: stage %s differs between 1 and %d threads", profs[pi],
                             ref->key[i], th);
            }
            m3_capture_clear(got);
        }
        printf("  %s: %d stages bit-identical for 1, 2, 3 threads\n", profs[pi], ref->n);
        assert_true(ref->n > 50);
        m3_capture_free(ref);
        m3_capture_free(got);
    }
    m3_set_threads(0);
    free(tok);
}

/* A fetch that corrupts the forced selections: mode 0 a wrong row count of index_topk,
 * mode 1 a block id past the key blocks, mode 2 an expert id outside [0, E). */
static int bad_mode;
static m3_status fetch_bad(void *ctx, const char *key, m3_tensor *out) {
    M3_TRY(fetch_dump(ctx, key, out));
    const char *st = stage_of(key);
    if (bad_mode == 0 && !strcmp(st, "index_topk")) out->shape[1] -= 1;
    if (bad_mode == 1 && !strcmp(st, "index_topk")) ((int32_t *)out->data)[5] = 1000;
    if (bad_mode == 2 && !strcmp(st, "expert_ids")) ((int32_t *)out->data)[3] = 8;
    return M3_OK;
}

/* Replay with forced selections: the tapped index_topk / expert_ids are the reference's. */
static void replay_forces_selection(void **state) {
    (void)state;
    char p[512];
    snprintf(p, sizeof p, "%s/fixtures/hf-tiny/hf_bf16.h5", m3_shared_dir());
    m3_dump *d = NULL;
    assert_int_equal(m3_dump_open(&d, p, M3_DUMP_READ), M3_OK);
    int n_tok = 0;
    int32_t *tok = read_i32(d, "tokens", &n_tok);
    m3_model *m = open_tiny("hf");
    m3_capture *c = m3_capture_create();
    m3_hooks hk = {.tap = m3_capture_tap,
                   .tap_ctx = c,
                   .fetch = fetch_dump,
                   .fetch_ctx = d,
                   .force_input = true,
                   .force_selection = true};
    assert_int_equal(m3_model_forward(m, tok, NULL, n_tok, &hk, "", NULL, NULL), M3_OK);
    int checked = 0;
    for (int i = 0; i < c->n; i++) {
        const char *st = stage_of(c->key[i]);
        if (strcmp(st, "index_topk") && strcmp(st, "expert_ids")) continue;
        m3_tensor r = {0};
        assert_int_equal(m3_dump_read(d, c->key[i], &r), M3_OK);
        assert_int_equal(m3_tensor_numel(&r), m3_tensor_numel(&c->t[i]));
        assert_memory_equal(r.data, c->t[i].data, (size_t)m3_tensor_numel(&r) * 4);
        m3_tensor_free(&r);
        checked++;
    }
    assert_int_equal(checked, 6); /* 3 sparse layers, 3 MoE layers */
    /* a forced selection of the wrong shape, or with ids out of range, is an error (not a
     * crash) and leaves the caches as they were */
    int n_past = m3_model_n_past(m);
    hk.tap = NULL;
    hk.fetch = fetch_bad;
    for (bad_mode = 0; bad_mode < 3; bad_mode++) {
        hk.fetch_ctx = d;
        m3_status s = m3_model_forward(m, tok, NULL, n_tok, &hk, "", NULL, NULL);
        if (s == M3_OK) fail_msg("bad forced selection mode %d accepted", bad_mode);
        assert_int_equal(m3_model_n_past(m), n_past);
    }
    m3_capture_free(c);
    free(tok);
    m3_model_close(m);
    m3_dump_close(d);
}

/* Bad token ids are rejected before anything runs, and the caches stay as they were. */
static void bad_tokens_rejected(void **state) {
    (void)state;
    m3_model *m = open_tiny("fp32");
    int32_t ok[3] = {1, 2, 3}, bad[2] = {5, 512}, neg[1] = {-1};
    assert_int_equal(m3_model_forward(m, ok, NULL, 3, NULL, "", NULL, NULL), M3_OK);
    assert_int_equal(m3_model_forward(m, bad, NULL, 2, NULL, "", NULL, NULL), M3_ERR_ARG);
    assert_non_null(strstr(m3_last_error(), "512"));
    assert_int_equal(m3_model_forward(m, neg, NULL, 1, NULL, "", NULL, NULL), M3_ERR_ARG);
    int32_t pos[1] = {7}; /* a gap in positions */
    assert_int_equal(m3_model_forward(m, ok, pos, 1, NULL, "", NULL, NULL), M3_ERR_ARG);
    assert_int_equal(m3_model_n_past(m), 3);
    m3_model_close(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp32_run_matches_transformers_fp32),
        cmocka_unit_test(hf_replay_matches_transformers_bf16),
        cmocka_unit_test(decode_equals_full_forward),
        cmocka_unit_test(threads_bit_identical),
        cmocka_unit_test(replay_forces_selection),
        cmocka_unit_test(bad_tokens_rejected),
    };
    return M3_RUN_TESTS(tests);
}
