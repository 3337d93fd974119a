/* tests/ref_attn.c: dense and block-sparse causal GQA attention over a K/V history.
 * Integer-valued q/k/v make every dot product exact, so the reference must match an
 * in-test naive loop (sequential sums, same formula and rounding points) bit for bit.
 * Also: softmax rows sum to 1, sparse == dense when every block is selected, decode row ==
 * prefill row, thread-count independence, atom partitions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/attn.h"
#include "tests/util.h"

typedef struct {
    int T, H, Hkv, Dh, S, B; /* tokens, heads, kv heads, head dim, history, block */
    float *q, *k, *v;
    int32_t *pos;
} acase;

static void case_make(acase *c, int T, int H, int Hkv, int Dh, int S, int B, uint64_t stream,
                      bool ints) {
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), stream);
    *c = (acase){T, H, Hkv, Dh, S, B, NULL, NULL, NULL, NULL};
    c->q = malloc(sizeof(float) * T * H * Dh);
    c->k = malloc(sizeof(float) * S * Hkv * Dh);
    c->v = malloc(sizeof(float) * S * Hkv * Dh);
    c->pos = malloc(sizeof(int32_t) * T);
    if (ints) {
        m3_fill_int(&r, c->q, (int64_t)T * H * Dh, 1);
        m3_fill_int(&r, c->k, (int64_t)S * Hkv * Dh, 1);
        m3_fill_int(&r, c->v, (int64_t)S * Hkv * Dh, 3);
    } else {
        m3_fill_normal(&r, c->q, (int64_t)T * H * Dh, 1.0f);
        m3_fill_normal(&r, c->k, (int64_t)S * Hkv * Dh, 1.0f);
        m3_fill_normal(&r, c->v, (int64_t)S * Hkv * Dh, 1.0f);
    }
    for (int t = 0; t < T; t++) c->pos[t] = S - T + t; /* the pass is the tail of the history */
}

static void case_free(acase *c) { free(c->q), free(c->k), free(c->v), free(c->pos); }

/* naive row: keys in the given order; sequential dot; same rounding points */
static void naive_row(float *out, const acase *c, int t, int h, const int *keys, int n,
                      const m3_profile *p, float scale) {
    int g = h / (c->H / c->Hkv);
    const float *q = c->q + ((size_t)t * c->H + h) * c->Dh;
    float *z = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) {
        const float *kk = c->k + ((size_t)keys[i] * c->Hkv + g) * c->Dh;
        float d = 0;
        for (int e = 0; e < c->Dh; e++) d += q[e] * kk[e];
        z[i] = p->attn_scores == M3_SCORES_BF16_EAGER ? m3_round_bf16(m3_round_bf16(d) * scale)
                                                      : d * scale;
    }
    float m = -INFINITY, den = 0;
    for (int i = 0; i < n; i++) m = z[i] > m ? z[i] : m;
    for (int i = 0; i < n; i++) den += (z[i] = expf(z[i] - m));
    for (int e = 0; e < c->Dh; e++) out[e] = 0;
    for (int i = 0; i < n; i++) {
        float pr = m3_prof_rnd(p->attn_p_bf16, z[i] / den);
        const float *vv = c->v + ((size_t)keys[i] * c->Hkv + g) * c->Dh;
        for (int e = 0; e < c->Dh; e++) out[e] += pr * vv[e];
    }
    for (int e = 0; e < c->Dh; e++) out[e] = m3_prof_rnd(p->attn_out_bf16, out[e]);
    free(z);
}

/* the key list of a row: dense (topk NULL) or sparse in position / selection order */
static int row_keys(int *keys, const acase *c, int t, int g, const int32_t *topk, int W,
                    bool selection_order) {
    int p = c->pos[t], n = 0;
    if (!topk) {
        for (int kk = 0; kk <= p; kk++) keys[n++] = kk;
        return n;
    }
    int bp = p / c->B;
    bool *seen = calloc((size_t)bp + 1, 1);
    int order[64], no = 0;
    for (int i = 0; i < W; i++) {
        int b = topk[((size_t)g * c->T + t) * W + i];
        if (b >= 0 && b < bp && !seen[b]) seen[b] = true, order[no++] = b;
    }
    if (!selection_order) {
        no = 0;
        for (int b = 0; b < bp; b++)
            if (seen[b]) order[no++] = b;
    }
    order[no++] = bp;
    for (int i = 0; i < no; i++)
        for (int kk = order[i] * c->B; kk < (order[i] + 1) * c->B && kk <= p; kk++) keys[n++] = kk;
    free(seen);
    return n;
}

static void run_ref(float *out, const acase *c, const int32_t *topk, int W, const m3_profile *p) {
    m3_attn_params ap;
    m3_attn_params_init(&ap, c->H, c->Hkv, c->Dh);
    size_t sb = m3_attn_scratch_bytes(c->S, &ap);
    void *scr = m3_guard_alloc(sb);
    if (topk)
        m3_attn_sparse(out, c->q, c->H * c->Dh, c->k, c->v, c->pos, c->T, c->S, topk, W, c->B,
                       &ap, p, scr, sb);
    else
        m3_attn_dense(out, c->q, c->H * c->Dh, c->k, c->v, c->pos, c->T, c->S, &ap, p, scr, sb);
    m3_guard_free(scr);
}

static void check_vs_naive(const acase *c, const int32_t *topk, int W, const m3_profile *p,
                           const char *what) {
    size_t n = (size_t)c->T * c->H * c->Dh;
    float *out = m3_guard_alloc(n * 4), *ref = malloc(n * 4);
    run_ref(out, c, topk, W, p);
    int *keys = malloc(sizeof(int) * c->S);
    float scale = (float)(1.0 / sqrt((double)c->Dh));
    double nrm = 0;
    for (int t = 0; t < c->T; t++)
        for (int h = 0; h < c->H; h++) {
            int nk = row_keys(keys, c, t, h / (c->H / c->Hkv), topk, W,
                              p->attn_order == M3_ATTN_ORDER_SELECTION);
            float *o = ref + ((size_t)t * c->H + h) * c->Dh;
            naive_row(o, c, t, h, keys, nk, p, scale);
        }
    for (size_t i = 0; i < n; i++) {
        nrm += (double)ref[i] * (double)ref[i];
        if (memcmp(&out[i], &ref[i], 4) != 0)
            m3_test_failf("%s(T=%d,H=%d,Hkv=%d,Dh=%d,S=%d) %s: elem %zu ref %.9g got %.9g", what,
                          c->T, c->H, c->Hkv, c->Dh, c->S, p->name, i, (double)ref[i],
                          (double)out[i]);
    }
    if (nrm == 0) m3_test_failf("vacuous attention case");
    m3_guard_free(out);
    free(ref), free(keys);
}

static void dense_matches_naive(void **state) {
    (void)state;
    int Ts[] = {1, 3, 33};
    m3_profile f, hf;
    m3_profile_fp32(&f);
    m3_profile_hf(&hf);
    for (int i = 0; i < 3; i++) {
        acase c;
        case_make(&c, Ts[i], 6, 2, 9, 40, 4, (uint64_t)i, true);
        check_vs_naive(&c, NULL, 0, &f, "dense");
        check_vs_naive(&c, NULL, 0, &hf, "dense");
        case_free(&c);
    }
}

static int32_t *random_topk(const acase *c, int W, uint64_t stream) {
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), stream);
    int32_t *tk = malloc(sizeof(int32_t) * c->Hkv * c->T * W);
    for (int i = 0; i < c->Hkv * c->T * W; i++) {
        int nbk = c->S / c->B + 2;
        int v = (int)(m3_rng_u32(&r) % (uint32_t)(nbk + 1)) - 1; /* -1 .. beyond b_p */
        tk[i] = v;
    }
    return tk;
}

static void sparse_matches_naive(void **state) {
    (void)state;
    m3_profile f, hf, sel;
    m3_profile_fp32(&f);
    m3_profile_hf(&hf);
    m3_profile_fp32(&sel);
    sel.attn_order = M3_ATTN_ORDER_SELECTION;
    int Ts[] = {1, 3, 33};
    for (int i = 0; i < 3; i++) {
        acase c;
        case_make(&c, Ts[i], 4, 2, 8, 45, 4, 10 + (uint64_t)i, true);
        int32_t *tk = random_topk(&c, 3, 20 + (uint64_t)i);
        check_vs_naive(&c, tk, 3, &f, "sparse");
        check_vs_naive(&c, tk, 3, &hf, "sparse");
        check_vs_naive(&c, tk, 3, &sel, "sparse-selection-order");
        free(tk);
        case_free(&c);
    }
}

/* every visible block selected (nb <= topk): sparse equals dense bit for bit */
static void sparse_equals_dense_when_all_selected(void **state) {
    (void)state;
    acase c;
    case_make(&c, 33, 8, 2, 16, 64, 8, 30, false);
    int W = 8; /* 64/8 = 8 blocks */
    int32_t *tk = malloc(sizeof(int32_t) * c.Hkv * c.T * W);
    for (int g = 0; g < c.Hkv; g++)
        for (int t = 0; t < c.T; t++)
            for (int i = 0; i < W; i++) /* descending, -1 beyond b_p, like the indexer */
                tk[((size_t)g * c.T + t) * W + i] = i <= c.pos[t] / c.B ? c.pos[t] / c.B - i : -1;
    size_t n = (size_t)c.T * c.H * c.Dh;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    m3_profile f, hf;
    m3_profile_fp32(&f);
    m3_profile_hf(&hf);
    const m3_profile *ps[2] = {&f, &hf};
    for (int i = 0; i < 2; i++) {
        run_ref(a, &c, NULL, 0, ps[i]);
        run_ref(b, &c, tk, W, ps[i]);
        assert_memory_equal(a, b, n * 4);
    }
    free(a), free(b), free(tk);
    case_free(&c);
}

/* V = 1 everywhere: the output is sum_k P_k = 1 up to fp32 rounding of n terms */
static void softmax_rows_sum_to_one(void **state) {
    (void)state;
    acase c;
    case_make(&c, 3, 4, 1, 8, 300, 128, 40, false);
    for (int i = 0; i < c.S * c.Hkv * c.Dh; i++) c.v[i] = 1.0f;
    for (int i = 0; i < c.T * c.H * c.Dh; i++) c.q[i] *= 4.0f; /* peaky rows too */
    size_t n = (size_t)c.T * c.H * c.Dh;
    float *o = malloc(n * 4);
    m3_profile f;
    m3_profile_fp32(&f);
    run_ref(o, &c, NULL, 0, &f);
    for (size_t i = 0; i < n; i++) {
        int t = (int)(i / ((size_t)c.H * c.Dh));
        double tol = (c.pos[t] + 2) * ldexp(1.0, -23); /* n-term fp32 sums, P = e/den */
        if (fabs((double)o[i] - 1.0) > tol) m3_test_failf("softmax sum %.9g", (double)o[i]);
    }
    free(o);
    case_free(&c);
}

/* a decode step (one query at the last position over the whole history) gives exactly the
 * last row of the prefill: the rows are computed the same way */
static void decode_row_equals_prefill_row(void **state) {
    (void)state;
    acase c;
    case_make(&c, 33, 4, 2, 16, 50, 8, 50, false);
    size_t row = (size_t)c.H * c.Dh, n = (size_t)c.T * row;
    float *a = malloc(n * 4), *b = malloc(row * 4);
    m3_profile hf;
    m3_profile_hf(&hf);
    run_ref(a, &c, NULL, 0, &hf);
    acase d = c;
    d.T = 1;
    d.q = c.q + (size_t)(c.T - 1) * row;
    d.pos = c.pos + c.T - 1;
    run_ref(b, &d, NULL, 0, &hf);
    assert_memory_equal(a + (size_t)(c.T - 1) * row, b, row * 4);
    free(a), free(b);
    case_free(&c);
}

static void same_for_any_thread_count(void **state) {
    (void)state;
    acase c;
    case_make(&c, 33, 8, 2, 32, 300, 16, 60, false);
    int32_t *tk = random_topk(&c, 5, 61);
    size_t n = (size_t)c.T * c.H * c.Dh;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    m3_profile ps[3];
    m3_profile_fp32(&ps[0]);
    m3_profile_hf(&ps[1]);
    m3_profile_atom(&ps[2]);
    ps[2].attn_partition = 64;
    for (int i = 0; i < 3; i++)
        for (int sp = 0; sp < 2; sp++) {
            m3_set_threads(1);
            run_ref(a, &c, sp ? tk : NULL, 5, &ps[i]);
            m3_set_threads(3);
            run_ref(b, &c, sp ? tk : NULL, 5, &ps[i]);
            assert_memory_equal(a, b, n * 4);
        }
    m3_set_threads(0);
    free(a), free(b), free(tk);
    case_free(&c);
}

/* partitions: one partition == unpartitioned (bit for bit); several partitions merged
 * with log-sum-exp weights give the same function (fp32: tiny differences; with bf16
 * partition outputs within a couple of bf16 ulps) */
static void partitions_merge(void **state) {
    (void)state;
    acase c;
    case_make(&c, 3, 2, 1, 16, 300, 128, 70, false);
    size_t n = (size_t)c.T * c.H * c.Dh;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    m3_profile f, fp;
    m3_profile_fp32(&f);
    fp = f;
    fp.attn_partition = 1024; /* > every key set: a single partition */
    run_ref(a, &c, NULL, 0, &f);
    run_ref(b, &c, NULL, 0, &fp);
    assert_memory_equal(a, b, n * 4);
    fp.attn_partition = 64; /* 298..300 keys: 5 partitions */
    run_ref(b, &c, NULL, 0, &fp);
    for (size_t i = 0; i < n; i++)
        if (fabs((double)a[i] - (double)b[i]) > 1e-5 * (1.0 + fabs((double)a[i])))
            m3_test_failf("partitioned fp32 %zu: %g vs %g", i, (double)a[i], (double)b[i]);
    m3_profile at;
    m3_profile_atom(&at);
    at.attn_partition = 64;
    run_ref(b, &c, NULL, 0, &at);
    for (size_t i = 0; i < n; i++) {
        assert_true(b[i] == m3_round_bf16(b[i]));
        /* bf16 P, bf16 partition outputs, bf16 merge: a few 2^-8 relative roundings */
        if (fabs((double)a[i] - (double)b[i]) > 4 * ldexp(1.0, -8) * (0.1 + fabs((double)a[i])))
            m3_test_failf("atom partitioned %zu: %g vs %g", i, (double)a[i], (double)b[i]);
    }
    free(a), free(b);
    case_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dense_matches_naive),
        cmocka_unit_test(sparse_matches_naive),
        cmocka_unit_test(sparse_equals_dense_when_all_selected),
        cmocka_unit_test(softmax_rows_sum_to_one),
        cmocka_unit_test(decode_row_equals_prefill_row),
        cmocka_unit_test(same_for_any_thread_count),
        cmocka_unit_test(partitions_merge),
    };
    return M3_RUN_TESTS(tests);
}
