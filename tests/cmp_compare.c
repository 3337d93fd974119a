/* tests/cmp_compare.c: `m3 compare` end to end on dump pairs written here through
 * compare/dump with known differences: identical pairs, an exact NMSE at a known first bad
 * layer, reordered / narrower sets that must agree, a flipped set that must not (and a
 * near-tie flip that is classified as such), NaN in B, stages on one side only, different
 * token counts, 3-digit layer names, multi-pass files, bad files, thread-count
 * independence, and the transformers fixture against itself and its bf16 twin. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compare/compare.h"
#include "compare/dump.h"
#include "ref/variant.h"
#include "tests/util.h"

enum { T0 = 8, HD = 16, E = 8, KE = 2, G = 2, KB = 4, V = 32 };

typedef struct {
    int n_layers, T, passes; /* passes 0: single-pass root */
    int name_layers;         /* n_layers for key digits (0: n_layers) */
    int perturb_layer;       /* B: attn_out += 0.5 at this layer and the residual after it */
    bool b_side;
    bool reorder_sets, narrow_topk, flip_expert, tie_flip, nan_attn, drop_attn1, extra_tap;
    int perturb_logits_pass;  /* -1 none */
    bool minimal;             /* only layers/NN/output */
    float perturb;            /* the amount added at perturb_layer (0: 0.5) */
    const char *variant;      /* `variant` attribute (NULL: none) */
} spec;

static void put(m3_dump *d, int pass, int layer, int nl, const char *stage, m3_dtype dt, int rank,
                const int64_t *shape, void *data) {
    char key[128];
    m3_dump_key(key, sizeof key, pass, layer, nl, stage);
    m3_tensor t = {.dtype = dt, .rank = rank, .data = data};
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)rank);
    assert_int_equal(m3_dump_write(d, key, &t, NULL), M3_OK);
}

/* Top-KE experts of sigmoid(logits) (no bias), ties to the lower id. */
static void route(int32_t *ids, const float *lg) {
    for (int k = 0; k < KE; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool used = false;
            for (int j = 0; j < k; j++) used |= ids[j] == e;
            if (!used && (best < 0 || lg[e] > lg[best])) best = e;
        }
        ids[k] = best;
    }
}

static void write_dump(const char *path, const spec *s) {
    m3_dump *d;
    assert_int_equal(m3_dump_open(&d, path, M3_DUMP_CREATE | M3_DUMP_FORCE), M3_OK);
    assert_int_equal(m3_dump_set_attr_str(d, "producer", s->b_side ? "test B" : "test A"), M3_OK);
    assert_int_equal(m3_dump_set_attr_str(d, "profile", "fp32"), M3_OK);
    if (s->variant) assert_int_equal(m3_dump_set_attr_str(d, "variant", s->variant), M3_OK);
    const float dp = s->perturb != 0 ? s->perturb : 0.5f;
    int T = s->T, nl = s->name_layers ? s->name_layers : s->n_layers;
    m3_rng r;
    float *h = malloc(sizeof(float) * T * HD), *lg = malloc(sizeof(float) * T * E),
          *w = malloc(sizeof(float) * T * KE), *lo = malloc(sizeof(float) * T * V);
    int32_t *ids = malloc(sizeof(int32_t) * T * KE), *tk = malloc(sizeof(int32_t) * G * T * KB),
            *tok = malloc(sizeof(int32_t) * T);
    int np = s->passes ? s->passes : 1;
    for (int p = 0; p < np; p++) {
        int pass = s->passes ? p : -1;
        m3_rng_init(&r, m3_test_seed(), 100 + (uint64_t)p);
        for (int t = 0; t < T; t++) tok[t] = t * 7 + p;
        int64_t sT[1] = {T}, sTH[2] = {T, HD}, sTE[2] = {T, E}, sTK[2] = {T, KE},
                sG[3] = {G, T, s->narrow_topk && s->b_side ? KB - 1 : KB}, sTV[2] = {T, V};
        if (!s->minimal) {
            put(d, pass, -1, nl, "tokens", M3_DT_I32, 1, sT, tok);
            put(d, pass, -1, nl, "positions", M3_DT_I32, 1, sT, tok);
            m3_fill_int(&r, h, T * HD, 3);
            put(d, pass, -1, nl, "embed", M3_DT_F32, 2, sTH, h);
        }
        for (int L = 0; L < s->n_layers; L++) {
            /* integer-valued activations: every sum below is exact, so NMSE is too */
            m3_fill_int(&r, h, T * HD, 3);
            bool bad = s->b_side && s->perturb_layer >= 0;
            if (s->minimal) {
                if (bad && L >= s->perturb_layer)
                    for (int i = 0; i < T * HD; i++) h[i] += dp;
                put(d, pass, L, nl, "output", M3_DT_F32, 2, sTH, h);
                continue;
            }
            if (bad && L > s->perturb_layer)
                for (int i = 0; i < T * HD; i++) h[i] += dp;
            put(d, pass, L, nl, "input", M3_DT_F32, 2, sTH, h);
            m3_fill_int(&r, h, T * HD, 3);
            if (bad && L >= s->perturb_layer)
                for (int i = 0; i < T * HD; i++) h[i] += dp;
            if (s->b_side && s->nan_attn && L == 1) h[3 * HD + 5] = NAN;
            if (!(s->b_side && s->drop_attn1 && L == 1)) put(d, pass, L, nl, "attn_out", M3_DT_F32, 2, sTH, h);
            if (!s->b_side && s->extra_tap && L == 0) put(d, pass, L, nl, "kv_cache_k_fp8", M3_DT_F32, 2, sTH, h);
            /* well-separated router logits: k-th vs (k+1)-th sigmoid gap >= ~0.02 */
            for (int t = 0; t < T; t++)
                for (int e = 0; e < E; e++) lg[t * E + e] = (float)((e * 5 + t * 3) % E) * 0.25f - 1.0f;
            if (s->tie_flip) { /* row 1: experts 0 and 1 nearly tied for 2nd place */
                for (int e = 0; e < E; e++) lg[1 * E + e] = -2.0f;
                lg[1 * E + 5] = 2.0f;
                lg[1 * E + 0] = 1.0f;
                lg[1 * E + 1] = 1.0f - 1e-4f;
            }
            put(d, pass, L, nl, "router_logits", M3_DT_F32, 2, sTE, lg);
            for (int t = 0; t < T; t++) route(ids + t * KE, lg + t * E);
            for (int t = 0; t < T; t++)
                for (int k = 0; k < KE; k++) w[t * KE + k] = (float)(ids[t * KE + k] + 1) / 16.0f;
            if (s->b_side && s->tie_flip) ids[1 * KE + 1] = 1; /* takes the near-tied expert */
            if (s->b_side && s->flip_expert && L == 2) /* row 4 swaps its 2nd expert for a far one */
                for (int e = 0; e < E; e++)
                    if (e != ids[4 * KE] && e != ids[4 * KE + 1] && lg[4 * E + e] < -0.5f) {
                        ids[4 * KE + 1] = e;
                        break;
                    }
            if (s->b_side && s->reorder_sets)
                for (int t = 0; t < T; t++) { /* swap ids and their weights together */
                    int32_t x = ids[t * KE];
                    ids[t * KE] = ids[t * KE + 1], ids[t * KE + 1] = x;
                    float y = w[t * KE];
                    w[t * KE] = w[t * KE + 1], w[t * KE + 1] = y;
                }
            put(d, pass, L, nl, "expert_ids", M3_DT_I32, 2, sTK, ids);
            put(d, pass, L, nl, "expert_weights", M3_DT_F32, 2, sTK, w);
            int kb = (int)sG[2];
            for (int g = 0; g < G; g++)
                for (int t = 0; t < T; t++)
                    for (int k = 0; k < kb; k++) {
                        /* A: KB slots, the last one -1; B narrow: KB-1 slots; B reordered:
                         * reversed valid ids */
                        int val = k < KB - 1 ? (t + g + k) % 5 : -1;
                        if (s->b_side && s->reorder_sets && k < KB - 1) val = (t + g + (KB - 2 - k)) % 5;
                        tk[(g * T + t) * kb + k] = val;
                    }
            put(d, pass, L, nl, "index_topk", M3_DT_I32, 3, sG, tk);
            m3_fill_int(&r, h, T * HD, 3);
            if (bad && L >= s->perturb_layer)
                for (int i = 0; i < T * HD; i++) h[i] += dp;
            put(d, pass, L, nl, "output", M3_DT_F32, 2, sTH, h);
        }
        if (!s->minimal) {
            m3_fill_normal(&r, lo, T * V, 2.0f);
            if (s->b_side && s->perturb_logits_pass == p)
                for (int i = 0; i < T * V; i++) lo[i] += (i % 3 == 0) ? 1.0f : 0.0f;
            put(d, pass, -1, nl, "logits", M3_DT_F32, 2, sTV, lo);
        }
    }
    assert_int_equal(m3_dump_commit(d), M3_OK);
    m3_dump_close(d);
    free(h), free(lg), free(w), free(lo), free(ids), free(tk), free(tok);
}

static spec base(void) {
    spec s = {.n_layers = 4, .T = T0, .perturb_layer = -1, .perturb_logits_pass = -1};
    return s;
}

static m3_cmp_report *run(const char *a, const char *b, int pass) {
    m3_tol tol;
    m3_tol_builtin(&tol);
    m3_cmp_opts o = {.pass = pass};
    m3_cmp_report *r = NULL;
    m3_status st = m3_compare_dumps(&r, a, b, &tol, &o);
    if (st != M3_OK) m3_test_failf("compare %s %s: %s", a, b, m3_last_error());
    return r;
}

static const m3_cmp_item *find(const m3_cmp_report *r, const char *name) {
    char buf[200];
    for (int i = 0; i < r->n_items; i++) {
        m3_cmp_item_name(r, &r->items[i], buf, sizeof buf);
        if (!strcmp(buf, name)) return &r->items[i];
    }
    m3_test_failf("no item %s", name);
    return NULL;
}

static void identical_pair_passes(void **state) {
    (void)state;
    spec a = base(), b = base();
    b.b_side = true;
    write_dump(m3_tmp_path("a.h5"), &a);
    write_dump(m3_tmp_path("b.h5"), &b);
    m3_cmp_report *r = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    assert_int_equal(r->n_fail, 0);
    assert_int_equal(r->first_fail, -1);
    assert_int_equal(r->n_pass, 4 + 4 * 7); /* tokens, positions, embed, logits + 7 per layer */
    assert_int_equal(r->tol_class, M3_TOL_FP32);
    assert_true(r->bytes > 0);
    m3_cmp_report_free(r);
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s compare %s %s --json %s --junit %s", m3_bin(),
             m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), m3_tmp_path("r.json"), m3_tmp_path("r.xml"));
    int rc = m3_run_cmd(cmd, &out);
    if (rc != 0) m3_test_failf("rc %d: %s", rc, out);
    assert_non_null(strstr(out, "OK: 32 stages compared, 0 beyond tolerance"));
    assert_null(strstr(out, "\033[")); /* piped: no colour */
    free(out);
    assert_int_equal(access(m3_tmp_path("r.json"), R_OK), 0);
    assert_int_equal(access(m3_tmp_path("r.xml"), R_OK), 0);
    assert_int_not_equal(access(m3_tmp_path("r.json.tmp"), F_OK), 0);
    /* the JSON parses (python3 is a build dependency) and carries the summary */
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import json,sys; d=json.load(open('%s')); "
             "sys.exit(0 if d['summary']['exit_code']==0 and len(d['stages'])==32 else 1)\"",
             m3_tmp_path("r.json"));
    assert_int_equal(m3_run_cmd(cmd, NULL), 0);
    /* m3 ls lists attributes and datasets with shapes */
    snprintf(cmd, sizeof cmd, "%s ls %s", m3_bin(), m3_tmp_path("a.h5"));
    assert_int_equal(m3_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "producer"));
    assert_non_null(strstr(out, "layers/03/index_topk"));
    assert_non_null(strstr(out, "[2,8,4]"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s ls %s", m3_bin(), m3_tmp_path("r.json"));
    assert_int_equal(m3_run_cmd(cmd, NULL), 2);
}

static void first_bad_layer_exact_nmse(void **state) {
    (void)state;
    spec a = base(), b = base();
    b.b_side = true;
    b.perturb_layer = 2;
    write_dump(m3_tmp_path("a.h5"), &a);
    write_dump(m3_tmp_path("b.h5"), &b);
    m3_cmp_report *r = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    assert_true(r->first_fail >= 0);
    char name[200];
    m3_cmp_item_name(r, &r->items[r->first_fail], name, sizeof name);
    assert_string_equal(name, "layers/02/attn_out");
    /* NMSE = n·0.25 / Σa², exact for integer-valued a: recompute Σa² from the file */
    m3_dump *d;
    m3_tensor t;
    assert_int_equal(m3_dump_open(&d, m3_tmp_path("a.h5"), M3_DUMP_READ), M3_OK);
    assert_int_equal(m3_dump_read(d, "layers/02/attn_out", &t), M3_OK);
    double saa = 0;
    for (int i = 0; i < T0 * HD; i++) saa += (double)((float *)t.data)[i] * (double)((float *)t.data)[i];
    m3_tensor_free(&t);
    m3_dump_close(d);
    const m3_cmp_item *it = find(r, "layers/02/attn_out");
    assert_true(m3_diff_nmse(&it->diff) == (T0 * HD * 0.25) / saa);
    assert_true(it->diff.max_abs == 0.5);
    assert_int_equal(find(r, "layers/01/output")->status, M3_CMP_PASS);
    assert_int_equal(find(r, "layers/03/input")->status, M3_CMP_FAIL);
    assert_int_equal(m3_cmp_exit_code(r), 1);
    m3_cmp_report_free(r);
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s compare %s %s --quiet", m3_bin(), m3_tmp_path("a.h5"),
             m3_tmp_path("b.h5"));
    assert_int_equal(m3_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "first beyond tolerance: layers/02/attn_out: NMSE"));
    free(out);
}

static void reordered_and_narrower_sets_agree(void **state) {
    (void)state;
    spec a = base(), b = base();
    b.b_side = b.reorder_sets = b.narrow_topk = true;
    write_dump(m3_tmp_path("a.h5"), &a);
    write_dump(m3_tmp_path("b.h5"), &b);
    m3_cmp_report *r = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    assert_int_equal(r->n_fail, 0);
    const m3_cmp_item *it = find(r, "layers/01/index_topk");
    assert_int_equal(it->width_b, KB - 1);
    assert_true(m3_setdiff_agree(&it->set) == 1.0 && m3_setdiff_jaccard(&it->set) == 1.0);
    it = find(r, "layers/03/expert_weights"); /* aligned by id, so the swap is invisible */
    assert_true(m3_diff_nmse(&it->diff) == 0);
    assert_int_equal(it->rows_skipped, 0);
    m3_cmp_report_free(r);
}

static void flipped_set_fails_near_tie_does_not(void **state) {
    (void)state;
    spec a = base(), b = base();
    b.b_side = b.flip_expert = true;
    write_dump(m3_tmp_path("a.h5"), &a);
    write_dump(m3_tmp_path("b.h5"), &b);
    m3_cmp_report *r = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    const m3_cmp_item *it = find(r, "layers/02/expert_ids");
    assert_int_equal(it->status, M3_CMP_FAIL);
    assert_int_equal(it->set.flips_real, 1);
    assert_int_equal(it->set.first_real_row, 4);
    assert_true(it->set_scored);
    assert_int_equal(find(r, "layers/02/expert_weights")->rows_skipped, 1);
    assert_int_equal(find(r, "layers/01/expert_ids")->status, M3_CMP_PASS);
    m3_cmp_report_free(r);
    /* near-tie: row 1 takes expert 1 instead of 0, sigmoid gap ~2e-5 < tie_abs */
    spec ta = base(), tb = base();
    ta.tie_flip = true;
    tb.b_side = tb.tie_flip = true;
    write_dump(m3_tmp_path("a.h5"), &ta);
    write_dump(m3_tmp_path("b.h5"), &tb);
    r = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    it = find(r, "layers/00/expert_ids");
    assert_int_equal(it->set.flips_tie, 1);
    assert_int_equal(it->set.flips_real, 0);
    assert_int_equal(it->status, M3_CMP_PASS);
    assert_true(m3_setdiff_agree(&it->set) < 1.0);
    m3_cmp_report_free(r);
}

static void nan_in_b_fails(void **state) {
    (void)state;
    spec a = base(), b = base();
    b.b_side = b.nan_attn = true;
    write_dump(m3_tmp_path("a.h5"), &a);
    write_dump(m3_tmp_path("b.h5"), &b);
    m3_cmp_report *r = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    const m3_cmp_item *it = find(r, "layers/01/attn_out");
    assert_int_equal(it->status, M3_CMP_FAIL);
    assert_int_equal(it->diff.nan_b, 1);
    assert_int_equal(it->diff.nonfinite_mismatch, 1);
    assert_non_null(strstr(it->why, "[3,5]"));
    assert_int_equal(r->n_fail, 1);
    m3_cmp_report_free(r);
}

static void stages_on_one_side_are_reported(void **state) {
    (void)state;
    spec a = base(), b = base();
    a.extra_tap = true;
    b.b_side = b.drop_attn1 = true;
    write_dump(m3_tmp_path("a.h5"), &a);
    write_dump(m3_tmp_path("b.h5"), &b);
    m3_cmp_report *r = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    assert_int_equal(r->n_only_a, 2);
    assert_int_equal(r->n_only_b, 0);
    assert_int_equal(find(r, "layers/01/attn_out")->status, M3_CMP_ONLY_A);
    assert_int_equal(find(r, "layers/00/kv_cache_k_fp8")->status, M3_CMP_ONLY_A);
    assert_int_equal(m3_cmp_exit_code(r), 0);
    m3_cmp_report_free(r);
    /* reversed roles: only in B */
    r = run(m3_tmp_path("b.h5"), m3_tmp_path("a.h5"), -1);
    assert_int_equal(r->n_only_b, 2);
    m3_cmp_report_free(r);
}

static void different_token_counts_exit_2(void **state) {
    (void)state;
    spec a = base(), b = base();
    b.b_side = true;
    b.T = T0 + 3;
    write_dump(m3_tmp_path("a.h5"), &a);
    write_dump(m3_tmp_path("b.h5"), &b);
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s compare %s %s --json %s", m3_bin(), m3_tmp_path("a.h5"),
             m3_tmp_path("b.h5"), m3_tmp_path("t.json"));
    assert_int_equal(m3_run_cmd(cmd, &out), 2);
    assert_non_null(strstr(out, "different token counts"));
    assert_non_null(strstr(out, "T=8"));
    assert_non_null(strstr(out, "T=11"));
    assert_int_equal((int)(strchr(out, '\n') - out) + 1, (int)strlen(out)); /* one line */
    free(out);
    assert_int_not_equal(access(m3_tmp_path("t.json"), F_OK), 0); /* no output file */
}

static void three_digit_layers(void **state) {
    (void)state;
    spec a = base(), b = base();
    a.minimal = b.minimal = true;
    a.n_layers = b.n_layers = 101;
    b.b_side = true;
    b.perturb_layer = 100;
    write_dump(m3_tmp_path("a.h5"), &a);
    write_dump(m3_tmp_path("b.h5"), &b);
    m3_cmp_report *r = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    assert_int_equal(r->n_items, 101);
    char name[200];
    m3_cmp_item_name(r, &r->items[r->first_fail], name, sizeof name);
    assert_string_equal(name, "layers/100/output");
    assert_string_equal(r->items[5].key_a, "layers/005/output");
    m3_cmp_report_free(r);
    /* 12 layers named with 2 digits in A and 3 in B still pair up */
    a.n_layers = b.n_layers = 12;
    b.perturb_layer = -1;
    b.name_layers = 100;
    write_dump(m3_tmp_path("a.h5"), &a);
    write_dump(m3_tmp_path("b.h5"), &b);
    r = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    assert_int_equal(r->n_items, 12);
    assert_int_equal(r->n_pass, 12);
    assert_string_equal(r->items[11].key_b, "layers/011/output");
    m3_cmp_report_free(r);
}

static void multi_pass(void **state) {
    (void)state;
    spec a = base(), b = base();
    a.passes = b.passes = 3;
    a.n_layers = b.n_layers = 2;
    b.b_side = true;
    b.perturb_logits_pass = 1;
    write_dump(m3_tmp_path("a.h5"), &a);
    write_dump(m3_tmp_path("b.h5"), &b);
    m3_cmp_report *r = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    char name[200];
    m3_cmp_item_name(r, &r->items[r->first_fail], name, sizeof name);
    assert_string_equal(name, "passes/0001/logits");
    assert_int_equal(r->n_fail, 1);
    const m3_cmp_item *it = find(r, "passes/0001/logits");
    assert_true(it->logit.kl_mean > 0 && it->logit.rows == T0);
    m3_cmp_report_free(r);
    r = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), 0);
    assert_int_equal(r->n_fail, 0);
    m3_cmp_report_free(r);
    /* a single-pass root is pass 0 of a multi-pass file */
    spec c = base();
    c.n_layers = 2;
    write_dump(m3_tmp_path("c.h5"), &c);
    r = run(m3_tmp_path("c.h5"), m3_tmp_path("a.h5"), -1);
    assert_int_equal(r->n_fail, 0);
    assert_int_equal(r->n_only_b, 2 * (4 + 2 * 7));
    m3_cmp_report_free(r);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s compare %s %s --pass 2 --quiet", m3_bin(), m3_tmp_path("a.h5"),
             m3_tmp_path("b.h5"));
    assert_int_equal(m3_run_cmd(cmd, NULL), 0);
}

static void bad_inputs_exit_2(void **state) {
    (void)state;
    spec a = base();
    write_dump(m3_tmp_path("a.h5"), &a);
    FILE *f = fopen(m3_tmp_path("junk.h5"), "w");
    fputs("<html>not a dump</html>\n", f);
    fclose(f);
    /* truncated copy of a */
    FILE *in = fopen(m3_tmp_path("a.h5"), "rb");
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, in);
    fclose(in);
    f = fopen(m3_tmp_path("trunc.h5"), "wb");
    fwrite(buf, 1, n / 2, f);
    fclose(f);
    const char *bad[] = {"junk.h5", "trunc.h5", "absent.h5"};
    for (int i = 0; i < 3; i++) {
        char cmd[1024], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s compare %s %s --html %s", m3_bin(), m3_tmp_path("a.h5"),
                 m3_tmp_path(bad[i]), m3_tmp_path("x.html"));
        int rc = m3_run_cmd(cmd, &out);
        if (rc != 2) m3_test_failf("%s: rc %d: %s", bad[i], rc, out);
        assert_non_null(strstr(out, bad[i]));
        assert_int_equal(out[0] == 'm' && out[1] == '3' && out[2] == ':', 1);
        assert_int_equal((int)(strchr(out, '\n') - out) + 1, (int)strlen(out));
        free(out);
        assert_int_not_equal(access(m3_tmp_path("x.html"), F_OK), 0);
    }
    char cmd[1024], *out = NULL;
    f = fopen(m3_tmp_path("bad.json"), "w");
    fputs("{\"stages\": {\"attn_out\": {\"nmse_max\": 1}}}", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s compare %s %s --tol %s", m3_bin(), m3_tmp_path("a.h5"),
             m3_tmp_path("a.h5"), m3_tmp_path("bad.json"));
    assert_int_equal(m3_run_cmd(cmd, &out), 2);
    assert_non_null(strstr(out, "nmse_max"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s compare %s", m3_bin(), m3_tmp_path("a.h5"));
    assert_int_equal(m3_run_cmd(cmd, NULL), 2);
    snprintf(cmd, sizeof cmd, "%s compare %s %s --bogus", m3_bin(), m3_tmp_path("a.h5"),
             m3_tmp_path("a.h5"));
    assert_int_equal(m3_run_cmd(cmd, NULL), 2);
}

static void thread_count_does_not_change_numbers(void **state) {
    (void)state;
    spec a = base(), b = base();
    a.T = b.T = 700; /* several parallel blocks per stage */
    b.b_side = true;
    b.perturb_layer = 1;
    write_dump(m3_tmp_path("a.h5"), &a);
    write_dump(m3_tmp_path("b.h5"), &b);
    m3_set_threads(1);
    m3_cmp_report *r1 = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    m3_set_threads(2);
    m3_cmp_report *r2 = run(m3_tmp_path("a.h5"), m3_tmp_path("b.h5"), -1);
    m3_set_threads(0);
    assert_int_equal(r1->n_items, r2->n_items);
    for (int i = 0; i < r1->n_items; i++) {
        const m3_diff *x = &r1->items[i].diff, *y = &r2->items[i].diff;
        assert_memory_equal(&x->sse, &y->sse, sizeof(double) * 4);
        assert_true(x->max_abs_idx == y->max_abs_idx && x->sum_rel == y->sum_rel);
        assert_true(r1->items[i].logit.kl_mean == r2->items[i].logit.kl_mean);
    }
    m3_cmp_report_free(r1);
    m3_cmp_report_free(r2);
}

/* fp32 dumps whose variant quantizes online (MX activations, ptpc, fp8 caches) are judged by
 * the fp32q class: a one-code-step difference (NMSE ~2.5e-5 here, integer data +- 0.01) fails
 * the fp32 class and passes fp32q; the same pair without the variant attribute fails. */
static void fp32q_class_from_variant(void **state) {
    (void)state;
    m3_variant v;
    char vj[2048];
    m3_variant_default(&v);
    assert_int_equal(m3_variant_set(&v, "experts", "mxfp8"), M3_OK);
    m3_variant_json(&v, vj, sizeof vj);
    spec a = base(), b = base();
    b.b_side = true, b.perturb_layer = 1, b.perturb = 0.01f;
    write_dump(m3_tmp_path("q_plain_a.h5"), &a);
    write_dump(m3_tmp_path("q_plain_b.h5"), &b);
    a.variant = b.variant = vj;
    write_dump(m3_tmp_path("q_a.h5"), &a);
    write_dump(m3_tmp_path("q_b.h5"), &b);
    m3_cmp_report *r = run(m3_tmp_path("q_plain_a.h5"), m3_tmp_path("q_plain_b.h5"), -1);
    assert_int_equal(r->tol_class, M3_TOL_FP32);
    assert_true(r->n_fail > 0);
    const m3_cmp_item *ao = find(r, "layers/01/attn_out");
    const double nm = m3_diff_nmse(&ao->diff);
    printf("  layers/01/attn_out NMSE %.3g (fp32 bound 1e-9, fp32q 1e-4)\n", nm);
    assert_true(nm > 1e-6 && nm < 1e-4);
    m3_cmp_report_free(r);
    r = run(m3_tmp_path("q_a.h5"), m3_tmp_path("q_b.h5"), -1);
    assert_int_equal(r->tol_class, M3_TOL_FP32Q);
    assert_int_equal(r->n_fail, 0);
    assert_string_equal(r->variant_a, vj);
    m3_cmp_report_free(r);
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s compare %s %s --json %s", m3_bin(), m3_tmp_path("q_a.h5"),
             m3_tmp_path("q_b.h5"), m3_tmp_path("q.json"));
    int rc = m3_run_cmd(cmd, &out);
    if (rc != 0) m3_test_failf("rc %d: %s", rc, out);
    assert_non_null(strstr(out, "fp32q"));
    free(out);
    static char js[1 << 16];
    FILE *f = fopen(m3_tmp_path("q.json"), "rb");
    assert_non_null(f);
    js[fread(js, 1, sizeof js - 1, f)] = 0;
    fclose(f);
    assert_non_null(strstr(js, "\"tolerance_class\": \"fp32q\""));
    assert_non_null(strstr(js, "\"variant\": \"{"));
}

static void transformers_fixture(void **state) {
    (void)state;
    char f32[512], b16[512], cmd[2048], *out = NULL;
    snprintf(f32, sizeof f32, "%s/fixtures/hf-tiny/hf_fp32.h5", m3_shared_dir());
    snprintf(b16, sizeof b16, "%s/fixtures/hf-tiny/hf_bf16.h5", m3_shared_dir());
    if (access(f32, R_OK) || access(b16, R_OK)) skip();
    m3_cmp_report *r = run(f32, f32, -1);
    assert_int_equal(r->n_fail, 0);
    for (int i = 0; i < r->n_items; i++) {
        const m3_cmp_item *it = &r->items[i];
        if (it->kind == M3_STAGE_FLOAT || it->kind == M3_STAGE_LOGITS)
            assert_true(m3_diff_nmse(&it->diff) == 0 && it->diff.max_abs == 0);
        if (it->kind == M3_STAGE_LOGITS) assert_true(it->logit.kl_max == 0 && it->logit.top1_agree == it->logit.rows);
    }
    m3_cmp_report_free(r);
    snprintf(cmd, sizeof cmd, "%s compare %s %s", m3_bin(), f32, f32);
    assert_int_equal(m3_run_cmd(cmd, NULL), 0);
    /* bf16 against fp32, free-running: the lowp bounds flag the drift (numerics spec §10:
     * NMSE grows to ~1e-2 and sets agree on ~90% of rows by the last layer) */
    r = run(f32, b16, -1);
    assert_int_equal(r->tol_class, M3_TOL_LOWP);
    assert_true(r->n_fail > 0);
    const m3_cmp_item *e0 = find(r, "layers/00/attn_norm");
    assert_int_equal(e0->status, M3_CMP_PASS);
    assert_true(m3_diff_nmse(&e0->diff) > 1e-7 && m3_diff_nmse(&e0->diff) < 1e-4); /* ~1 bf16 rounding */
    const m3_cmp_item *lg = find(r, "logits");
    assert_true(lg->logit.kl_mean > 0 && lg->logit.top1_agree < lg->logit.rows);
    m3_cmp_report_free(r);
    snprintf(cmd, sizeof cmd, "%s compare %s %s --quiet", m3_bin(), f32, b16);
    assert_int_equal(m3_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "first beyond tolerance"));
    free(out);
    /* a --tol file that accepts free-running bf16 drift turns it into exit 0: every stage
     * of the table gets the loose row */
    FILE *f = fopen(m3_tmp_path("loose.json"), "w");
    fputs("{\"comment\": \"accept free-running bf16 drift\", \"class\": \"lowp\", \"stages\": {", f);
    int ns;
    const m3_stage *tab = m3_stages(&ns);
    for (int i = 0; i < ns; i++)
        fprintf(f, "\"%s\": {\"nmse\": 0.1, \"flip\": 0.2, \"kl_mean\": 0.1, \"top1_min\": 0.8}, ",
                tab[i].name);
    fputs("\"*\": {\"nmse\": 0.1}}}", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s compare %s %s --quiet --tol %s", m3_bin(), f32, b16,
             m3_tmp_path("loose.json"));
    int rc = m3_run_cmd(cmd, &out);
    if (rc != 0) m3_test_failf("loose tolerance: rc %d: %s", rc, out);
    free(out);
}

/* A producer may keep only the last t logits rows, naming their absolute positions in the
 * dataset attribute `positions` (dump-schema); tiny-deep's transformers dumps keep 32 of 128.
 * Our full [T,V] logits are aligned to those rows, not refused for their row count. */
static void logits_aligned_by_positions(void **state) {
    (void)state;
    const char *ref = "fixtures/tiny-deep/hf_fp32.h5";
    if (access(ref, R_OK)) skip();
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "%s run --model fixtures/tiny-deep/model --tokens fixtures/tiny-deep/tokens.txt "
             "--dump %s --force",
             m3_bin(), m3_tmp_path("full.h5"));
    assert_int_equal(m3_run_cmd(cmd, NULL), 0);
    m3_cmp_report *r = run(m3_tmp_path("full.h5"), ref, -1);
    const m3_cmp_item *lg = find(r, "logits");
    assert_int_equal(lg->logit.rows, 32);
    assert_int_equal(lg->status, M3_CMP_PASS);
    assert_true(m3_diff_nmse(&lg->diff) > 0 && m3_diff_nmse(&lg->diff) < 1e-10);
    assert_int_equal(lg->logit.top1_agree, 32);
    m3_cmp_report_free(r);
    /* and symmetric: the narrow dump as A */
    r = run(ref, m3_tmp_path("full.h5"), -1);
    assert_int_equal(find(r, "logits")->logit.rows, 32);
    m3_cmp_report_free(r);
    snprintf(cmd, sizeof cmd, "%s compare %s %s --quiet", m3_bin(), m3_tmp_path("full.h5"), ref);
    int rc = m3_run_cmd(cmd, &out);
    if (rc != 0) m3_test_failf("compare full vs last-32 logits: rc %d: %s", rc, out);
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(identical_pair_passes),
        cmocka_unit_test(first_bad_layer_exact_nmse),
        cmocka_unit_test(reordered_and_narrower_sets_agree),
        cmocka_unit_test(flipped_set_fails_near_tie_does_not),
        cmocka_unit_test(nan_in_b_fails),
        cmocka_unit_test(stages_on_one_side_are_reported),
        cmocka_unit_test(different_token_counts_exit_2),
        cmocka_unit_test(three_digit_layers),
        cmocka_unit_test(multi_pass),
        cmocka_unit_test(bad_inputs_exit_2),
        cmocka_unit_test(thread_count_does_not_change_numbers),
        cmocka_unit_test(fp32q_class_from_variant),
        cmocka_unit_test(transformers_fixture),
        cmocka_unit_test(logits_aligned_by_positions),
    };
    return M3_RUN_TESTS_IN_TMPDIR(tests);
}
