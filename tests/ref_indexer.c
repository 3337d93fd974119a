/* tests/ref_indexer.c: block scores, forced local / init blocks, top-k with the documented
 * tie rule (score desc, block id asc), -1 padding, output width, tie counting with a margin,
 * the index_scores output, NaN policy and thread-count independence. Integer-valued inputs
 * make the dots exact, so selections and scores match an in-test naive version exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/indexer.h"
#include "tests/util.h"

typedef struct {
    int T, S;
    m3_indexer_params ip;
    float *iq, *ik;
    int32_t *pos;
} icase;

static void icase_make(icase *c, int T, int S, int G, int Di, int B, int K, uint64_t stream) {
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), stream);
    c->T = T;
    c->S = S;
    c->ip = (m3_indexer_params){G, Di, B, K, 1, 0};
    c->iq = malloc(sizeof(float) * T * G * Di);
    c->ik = malloc(sizeof(float) * S * Di);
    c->pos = malloc(sizeof(int32_t) * T);
    m3_fill_int(&r, c->iq, (int64_t)T * G * Di, 2);
    m3_fill_int(&r, c->ik, (int64_t)S * Di, 2);
    for (int t = 0; t < T; t++) c->pos[t] = S - T + t;
}
static void icase_free(icase *c) { free(c->iq), free(c->ik), free(c->pos); }

static void run(const icase *c, const m3_profile *p, int32_t *tk, float *sc, float *mg, int *ties) {
    size_t sb = m3_indexer_scratch_bytes(c->S, &c->ip);
    void *s = m3_guard_alloc(sb);
    m3_indexer_topk(tk, sc, mg, ties, c->iq, c->ip.n_index_head * c->ip.index_head_dim, c->ik,
                    c->pos, c->T, c->S, &c->ip, p, s, sb);
    m3_guard_free(s);
}

/* naive: all block scores, forcing, full sort by (score desc, id asc) */
static void naive(const icase *c, const m3_profile *p, int32_t *tk, int W) {
    const m3_indexer_params *ip = &c->ip;
    int G = ip->n_index_head, Di = ip->index_head_dim, B = ip->block;
    for (int g = 0; g < G; g++)
        for (int t = 0; t < c->T; t++) {
            int nb = c->pos[t] / B + 1;
            float S[256];
            int id[256];
            for (int b = 0; b < nb; b++) {
                float m = -INFINITY;
                for (int j = b * B; j < (b + 1) * B && j <= c->pos[t]; j++) {
                    float d = 0;
                    for (int e = 0; e < Di; e++)
                        d += c->iq[((size_t)t * G + g) * Di + e] * c->ik[(size_t)j * Di + e];
                    if (p->index_scale != 1.0f) d *= p->index_scale;
                    if (d > m) m = d;
                }
                S[b] = m;
                id[b] = b;
            }
            if (p->index_init_blocks)
                for (int b = 0; b < ip->init_blocks && b < nb; b++) S[b] = p->init_boost;
            for (int b = nb - ip->local_blocks < 0 ? 0 : nb - ip->local_blocks; b < nb; b++)
                S[b] = p->local_boost;
            for (int a = 1; a < nb; a++) /* stable insertion sort by score desc: ids ascend */
                for (int k = a; k > 0 && S[k] > S[k - 1]; k--) {
                    float ts = S[k]; S[k] = S[k - 1]; S[k - 1] = ts;
                    int ti = id[k]; id[k] = id[k - 1]; id[k - 1] = ti;
                }
            for (int i = 0; i < W; i++)
                tk[((size_t)g * c->T + t) * W + i] = i < nb && i < ip->topk ? id[i] : -1;
        }
}

static void topk_matches_naive(void **state) {
    (void)state;
    int Ts[] = {1, 3, 33};
    m3_profile ps[2];
    m3_profile_fp32(&ps[0]);
    m3_profile_atom(&ps[1]);
    for (int i = 0; i < 3; i++)
        for (int pi = 0; pi < 2; pi++) {
            icase c;
            icase_make(&c, Ts[i], 45, 2, 8, 4, 3, (uint64_t)(i * 2 + pi));
            if (pi == 1) c.ip.init_blocks = 1; /* atom honours init blocks */
            int W = c.ip.topk;
            size_t n = (size_t)c.ip.n_index_head * c.T * W;
            int32_t *a = m3_guard_alloc(n * 4), *b = malloc(n * 4);
            run(&c, &ps[pi], a, NULL, NULL, NULL);
            naive(&c, &ps[pi], b, W);
            for (size_t k = 0; k < n; k++)
                if (a[k] != b[k])
                    m3_test_failf("indexer(T=%d,%s) slot %zu: %d vs naive %d", c.T, ps[pi].name,
                                  k, a[k], b[k]);
            m3_guard_free(a);
            free(b);
            icase_free(&c);
        }
}

/* crafted: every key scores the same -> all non-local blocks tie; the lower ids win, the
 * own block comes first, and the row counts as a tie straddling rank K */
static void tie_rule_local_first_and_padding(void **state) {
    (void)state;
    icase c;
    icase_make(&c, 3, 40, 1, 4, 4, 3, 7);
    for (int i = 0; i < c.T * 4; i++) c.iq[i] = 1.0f;
    for (int i = 0; i < c.S * 4; i++) c.ik[i] = 1.0f;
    c.pos[0] = 2;  /* nb = 1 */
    c.pos[1] = 9;  /* nb = 3 */
    c.pos[2] = 39; /* nb = 10 */
    int32_t tk[9];
    float sc[30], mg[3];
    int ties = -1;
    m3_profile f;
    m3_profile_fp32(&f);
    run(&c, &f, tk, sc, mg, &ties);
    int32_t want[9] = {0, -1, -1, 2, 0, 1, 9, 0, 1};
    assert_memory_equal(tk, want, sizeof want);
    assert_int_equal(ties, 1); /* only the nb = 10 row has an S_(3) == S_(4) tie */
    assert_true(isinf(mg[0]) && isinf(mg[1]) && mg[2] == 0.0f);
    /* index_scores: forced +inf, visible blocks 4, future blocks -inf */
    assert_true(isinf(sc[10 + 2]) && sc[10 + 2] > 0);
    assert_true(sc[10 + 0] == 4.0f && isinf(sc[10 + 3]) && sc[10 + 3] < 0);
    /* block 5 scores 5: it enters at rank 2; ranks 3 and 4 (blocks 0 and 1) still tie */
    c.ik[5 * 4 * 4] = 2.0f; /* key 20 */
    run(&c, &f, tk, NULL, mg, &ties);
    assert_int_equal(tk[6], 9);
    assert_int_equal(tk[7], 5);
    assert_int_equal(tk[8], 0);
    assert_int_equal(ties, 1);
    /* block 0 scores 4.25: S_(3) - S_(4) = 0.25 is no tie at margin 0, a tie at margin 0.5 */
    c.ik[0] = 1.25f;
    run(&c, &f, tk, NULL, mg, &ties);
    assert_int_equal(tk[8], 0);
    assert_true(mg[2] == 0.25f);
    assert_int_equal(ties, 0);
    m3_profile fm = f;
    fm.topk_tie_margin = 0.5f;
    run(&c, &fm, tk, NULL, mg, &ties);
    assert_int_equal(ties, 1);
    icase_free(&c);
}

static void width_and_scale_options(void **state) {
    (void)state;
    icase c;
    icase_make(&c, 2, 10, 2, 8, 4, 16, 8); /* 3 blocks in the history, K = 16 */
    m3_profile hf, at;
    m3_profile_hf(&hf);
    m3_profile_atom(&at);
    assert_int_equal(m3_indexer_width(10, &c.ip, &at), 16);
    hf.topk_width = M3_TOPK_WIDTH_HF;
    assert_int_equal(m3_indexer_width(10, &c.ip, &hf), 3);
    assert_int_equal(m3_indexer_width(10000, &c.ip, &hf), 16);
    int32_t tk[2 * 2 * 16];
    float sc[2 * 2 * 3];
    run(&c, &hf, tk, sc, NULL, NULL);
    for (int g = 0; g < 2; g++) /* pos 8, 9: nb = 3, all selected, own block first */
        for (int t = 0; t < 2; t++) {
            const int32_t *row = tk + ((size_t)g * 2 + t) * 3;
            assert_int_equal(row[0], 2);
            assert_true((row[1] == 0 && row[2] == 1) || (row[1] == 1 && row[2] == 0));
        }
    /* atom: scaled scores, forced local block at 1e29 */
    run(&c, &at, tk, sc, NULL, NULL);
    assert_true(sc[2] == 1e29f);
    float d = 0, m = -INFINITY;
    for (int j = 0; j < 4; j++) {
        d = 0;
        for (int e = 0; e < 8; e++) d += c.iq[e] * c.ik[j * 8 + e];
        d *= 0.127517432f;
        m = d > m ? d : m;
    }
    assert_true(sc[0] == m);
    for (int i = 3; i < 16; i++) assert_int_equal(tk[i], -1);
    icase_free(&c);
}

/* NaN scores: fp32/hf rank them highest (torch), atom maps them to -1e30 */
static void nan_policy(void **state) {
    (void)state;
    icase c;
    icase_make(&c, 1, 20, 1, 4, 4, 2, 9);
    for (int i = 0; i < 4; i++) c.iq[i] = 1.0f;
    for (int i = 0; i < 20 * 4; i++) c.ik[i] = 1.0f;
    c.ik[1 * 4 * 4 + 1] = NAN; /* block 1 */
    c.ik[2 * 4 * 4] = 3.0f;    /* block 2 is the best finite one */
    int32_t tk[2];
    m3_profile f, at;
    m3_profile_fp32(&f);
    m3_profile_atom(&at);
    run(&c, &f, tk, NULL, NULL, NULL);
    assert_int_equal(tk[0], 1); /* NaN above the forced +inf, as torch.topk ranks it */
    assert_int_equal(tk[1], 4);
    run(&c, &at, tk, NULL, NULL, NULL);
    assert_int_equal(tk[0], 4);
    assert_int_equal(tk[1], 2);
    icase_free(&c);
}

static void same_for_any_thread_count(void **state) {
    (void)state;
    icase c;
    icase_make(&c, 33, 300, 4, 16, 8, 5, 10);
    size_t n = (size_t)4 * 33 * 5, ns = (size_t)4 * 33 * 38;
    int32_t *a = malloc(n * 4), *b = malloc(n * 4);
    float *sa = malloc(ns * 4), *sb = malloc(ns * 4);
    int ta, tb;
    m3_profile f;
    m3_profile_fp32(&f);
    m3_set_threads(1);
    run(&c, &f, a, sa, NULL, &ta);
    m3_set_threads(3);
    run(&c, &f, b, sb, NULL, &tb);
    m3_set_threads(0);
    assert_memory_equal(a, b, n * 4);
    assert_memory_equal(sa, sb, ns * 4);
    assert_int_equal(ta, tb);
    free(a), free(b), free(sa), free(sb);
    icase_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(topk_matches_naive),
        cmocka_unit_test(tie_rule_local_first_and_padding),
        cmocka_unit_test(width_and_scale_options),
        cmocka_unit_test(nan_policy),
        cmocka_unit_test(same_for_any_thread_count),
    };
    return M3_RUN_TESTS(tests);
}
