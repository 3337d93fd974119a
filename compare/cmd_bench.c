/* compare/cmd_bench.c: `m3 bench ref`: one real-size MiniMax-M3 sparse MoE layer through the
 * CPU reference, weights generated in memory, reporting seconds, GFLOP/s per stage and the
 * ratio to OpenBLAS sgemm measured in the same run, plus peak RSS.
 *
 *   m3 bench ref [--tokens T] [--ctx C] [--threads N] [--profile fp32|hf|atom] [--pool P]
 *                [--reps N]
 * The layer runs N times (default 2: the first warms caches, page tables and OpenBLAS's
 * buffers); each stage reports its best time. The machine may be shared: compare the
 * ratios, which are measured in the same run, not the absolute figures.
 *
 * Defaults: T = 64 new tokens at positions C-T..C-1, C = 4096 (the cached K/V/index keys of
 * the first C-T positions are generated), hidden 6144, 64/4 heads of 128, rotary 64, index
 * 4x128, block 128, top-16 blocks, 128 experts top-4 (F 3072), shared expert 3072.
 * Memory: the 128 routed experts share a pool of P (default 8) distinct weight sets (expert e
 * uses set e mod P): every expert still streams its 113 MB of bf16 weights from DRAM (far
 * more than the caches), but the process needs ~1.3 GB instead of 14.5 GB.
 * Ceiling: cblas_sgemm in fp32 with OpenBLAS's own threads (as many as ours), on the
 * q_proj shape (T x 6144 x 8192), best of 3; and at the mean tokens-per-expert shape for
 * the expert stage (which is weight-bandwidth bound at T = 64). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "compare/cmd.h"
#include "ref/attn.h"
#include "ref/indexer.h"
#include "ref/linear.h"
#include "ref/moe.h"
#include "ref/norm.h"
#include "ref/rope.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* cheap deterministic fill: xorshift, values ~ U(-a, a) */
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static float rnd(float a) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return a * ((float)(rs >> 40) * (1.0f / 8388608.0f) - 1.0f);
}
static m3_bf16 *gen_bf16(size_t n, float a) {
    m3_bf16 *w = malloc(n * sizeof *w);
    if (w)
        for (size_t i = 0; i < n; i++) w[i] = m3_f32_to_bf16(rnd(a));
    return w;
}
static float *gen_f32(size_t n, float a) {
    float *x = malloc(n * sizeof *x);
    if (x)
        for (size_t i = 0; i < n; i++) x[i] = rnd(a);
    return x;
}

typedef struct {
    const char *name;
    double sec, flop;
    bool gemm;
} stage;

/* Best-of-3 cblas_sgemm rates (fp32 weights, OpenBLAS's own threads = ours) at the q_proj
 * shape and at one small expert-projection shape; keeps the max with the values passed in. */
static int measure_ceiling(double *big, double *small, const m3_bf16 *wq, const float *x, int T,
                           int NQ, int D, int ms, int F) {
    float *wf = malloc(sizeof(float) * (size_t)NQ * D), *yc = malloc(sizeof(float) * T * NQ);
    if (!wf || !yc) {
        free(wf), free(yc);
        return -1;
    }
    for (size_t i = 0; i < (size_t)NQ * D; i++) wf[i] = m3_bf16_to_f32(wq[i]);
    m3_blas_threads(m3_threads());
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        m3_sgemm_nt(yc, x, wf, T, NQ, D);
        double gf = m3_linear_flops(T, D, NQ) / (now_s() - t0) * 1e-9;
        if (gf > *big) *big = gf;
    }
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        m3_sgemm_nt(yc, x, wf, ms, F, D);
        double gf = m3_linear_flops(ms, D, F) / (now_s() - t0) * 1e-9;
        if (gf > *small) *small = gf;
    }
    m3_blas_threads(1);
    free(wf), free(yc);
    return 0;
}

static const char bench_usage[] =
    "usage: m3 bench ref [--tokens T] [--ctx C] [--threads N] [--profile fp32|hf|atom] [--pool P]\n"
    "                    [--reps R]\n"
    "One MiniMax-M3-sized sparse MoE layer through the reference (T tokens at positions\n"
    "C-T..C-1, an expert pool of P), timed per component against a cblas_sgemm ceiling\n"
    "measured in the same run. Defaults: T 64, C 4096, P 8, R 2, all cores.\n";

/* strict integer option value in [lo, hi] */
static bool bench_int(const char *v, long lo, long hi, int *out) {
    long x;
    if (!m3_cli_int(v, lo, hi, &x)) return false;
    *out = (int)x;
    return true;
}

int m3_cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(bench_usage, stdout);
            return 0;
        }
    if (argc < 2 || strcmp(argv[1], "ref") != 0)
        return m3_cli_fail("bench: usage: m3 bench ref [--tokens T] [--ctx C] [--threads N] "
                           "[--profile fp32|hf|atom] [--pool P] (see m3 bench --help)");
    int T = 64, C = 4096, pool = 8, reps = 2, threads = 0;
    const char *prof_name = "fp32";
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *dst = !strcmp(a, "--tokens")    ? &T
                   : !strcmp(a, "--ctx")     ? &C
                   : !strcmp(a, "--threads") ? &threads
                   : !strcmp(a, "--pool")    ? &pool
                   : !strcmp(a, "--reps")    ? &reps
                                             : NULL;
        if (!dst && strcmp(a, "--profile"))
            return m3_cli_fail("bench: unknown option '%s' (see m3 bench --help)", a);
        if (!v) return m3_cli_fail("bench: %s needs a value", a);
        i++;
        if (!dst) {
            prof_name = v;
            continue;
        }
        long hi = dst == &threads ? 256 : dst == &pool ? 128 : 1 << 20;
        if (!bench_int(v, 1, hi, dst))
            return m3_cli_fail("bench: %s wants an integer in 1..%ld, got '%s'", a, hi, v);
    }
    if (C < T) return m3_cli_fail("bench: --tokens %d exceeds --ctx %d", T, C);
    if (threads) m3_set_threads(threads);
    m3_profile prof;
    if (m3_profile_by_name(&prof, prof_name) != M3_OK) return m3_cli_fail(NULL);

    /* M3 dimensions */
    const int D = 6144, H = 64, Hkv = 4, Dh = 128, R = 64, G = 4, Di = 128, B = 128, KB = 16;
    const int E = 128, KE = 4, F = 3072, FS = 3072;
    const float eps = 9.99999997e-07f, theta = 5e6f;
    const int NQ = H * Dh, NKV = Hkv * Dh, NIQ = G * Di;
    const int LDP = NQ + 2 * NKV + NIQ + Di; /* packed row q|k|v|index_q|index_k = 9856 */

    printf("m3 bench ref: sparse MoE layer, T=%d tokens at positions %d..%d, threads=%d, "
           "profile=%s, expert pool=%d\n", T, C - T, C - 1, m3_threads(), prof.name, pool);
    double tg = now_s();
    m3_bf16 *wq = gen_bf16((size_t)NQ * D, 0.02f), *wk = gen_bf16((size_t)NKV * D, 0.02f);
    m3_bf16 *wv = gen_bf16((size_t)NKV * D, 0.02f), *wiq = gen_bf16((size_t)NIQ * D, 0.02f);
    m3_bf16 *wik = gen_bf16((size_t)Di * D, 0.02f), *wo = gen_bf16((size_t)D * NQ, 0.02f);
    m3_bf16 *n_in = gen_bf16((size_t)D, 0.1f), *n_post = gen_bf16((size_t)D, 0.1f);
    m3_bf16 *nq = gen_bf16(Dh, 0.1f), *nk = gen_bf16(Dh, 0.1f), *niq = gen_bf16(Di, 0.1f),
            *nik = gen_bf16(Di, 0.1f);
    float *gate = gen_f32((size_t)E * D, 0.02f), *bias = gen_f32((size_t)E, 0.01f);
    m3_bf16 *sw1 = gen_bf16((size_t)FS * D, 0.02f), *sw3 = gen_bf16((size_t)FS * D, 0.02f),
            *sw2 = gen_bf16((size_t)D * FS, 0.02f);
    m3_bf16 **pw = calloc((size_t)pool * 3, sizeof *pw);
    m3_mlp_weights *ex = calloc((size_t)E, sizeof *ex);
    /* history: K/V and index keys of all C positions (the last T get overwritten) */
    float *kc = gen_f32((size_t)C * NKV, 1.0f), *vc = gen_f32((size_t)C * NKV, 1.0f),
          *ikc = gen_f32((size_t)C * Di, 1.0f);
    float *x = gen_f32((size_t)T * D, 1.0f), *h = gen_f32((size_t)T * D, 1.0f);
    float *xn = malloc(sizeof(float) * T * D), *qkv = malloc(sizeof(float) * T * LDP);
    float *att = malloc(sizeof(float) * T * NQ), *ao = malloc(sizeof(float) * T * D);
    float *mn = malloc(sizeof(float) * T * D), *lg = malloc(sizeof(float) * T * E);
    float *wts = malloc(sizeof(float) * T * KE), *ro = malloc(sizeof(float) * T * D),
          *so = malloc(sizeof(float) * T * D);
    int32_t *ids = malloc(sizeof(int32_t) * T * KE), *pos = malloc(sizeof(int32_t) * T);
    m3_indexer_params ip = {G, Di, B, KB, 1, 0};
    m3_attn_params ap;
    m3_attn_params_init(&ap, H, Hkv, Dh);
    int W = m3_indexer_width(C, &ip, &prof);
    int32_t *topk = malloc(sizeof(int32_t) * G * T * W);
    m3_moe_params mp = {E, KE, D, F, FS, 2.0f, 1.702f, 7.0f};
    m3_mlp_params sp = m3_moe_shared_params(&mp);
    size_t sb_att = m3_attn_scratch_bytes(C, &ap), sb_idx = m3_indexer_scratch_bytes(C, &ip);
    size_t sb_moe = m3_moe_scratch_bytes(T, &mp);
    void *s_att = malloc(sb_att), *s_idx = malloc(sb_idx), *s_moe = malloc(sb_moe);
    bool ok = wq && wk && wv && wiq && wik && wo && n_in && n_post && nq && nk && niq && nik &&
              gate && bias && sw1 && sw3 && sw2 && pw && ex && kc && vc && ikc && x && h &&
              xn && qkv && att && ao && mn && lg && wts && ro && so && ids && pos && topk &&
              s_att && s_idx && s_moe;
    for (int i = 0; ok && i < pool * 3; i++) ok = (pw[i] = gen_bf16((size_t)F * D, 0.02f)) != NULL;
    int rc = 0;
    if (!ok) {
        rc = m3_cli_fail("bench: out of memory generating the layer");
        goto done;
    }
    for (int e = 0; e < E; e++) {
        int s = e % pool;
        ex[e] = (m3_mlp_weights){M3_WFMT_BF16, pw[3 * s], pw[3 * s + 1], pw[3 * s + 2]};
    }
    for (int t = 0; t < T; t++) pos[t] = C - T + t;
    printf("weights generated in %.1f s\n", now_s() - tg);

    double ceil_gf = 0, ceil_small = 0;
    double mean_tpe = (double)T * KE / E; /* mean tokens per routed expert */
    int ms = (int)ceil(mean_tpe);
    if (measure_ceiling(&ceil_gf, &ceil_small, wq, x, T, NQ, D, ms, F) != 0) {
        rc = m3_cli_fail("bench: out of memory for the sgemm ceiling");
        goto done;
    }

    /* ---- the layer ---- */
    stage st[16];
    int ns = 0, n_ties = 0, used = 0;
    double t0, total = INFINITY;
    for (int rep = 0; rep < reps; rep++) {
    ns = 0;
    double total0 = now_s();
#define STAGE(nm, fl, gm, ...)                                                                \
    do {                                                                                       \
        t0 = now_s();                                                                          \
        __VA_ARGS__;                                                                           \
        double dt_ = now_s() - t0;                                                             \
        if (rep == 0 || dt_ < st[ns].sec) st[ns] = (stage){nm, dt_, (fl), (gm)};               \
        ns++;                                                                                  \
    } while (0)

    STAGE("input norm", 0, false, m3_rmsnorm_add(xn, x, h, n_in, T, D, eps, &prof));
    STAGE("qkv+index proj", m3_linear_flops(T, D, LDP), true, {
        m3_wmat mq = {M3_WFMT_BF16, wq, NQ, D}, mk = {M3_WFMT_BF16, wk, NKV, D},
                mv = {M3_WFMT_BF16, wv, NKV, D}, miq = {M3_WFMT_BF16, wiq, NIQ, D},
                mik = {M3_WFMT_BF16, wik, Di, D};
        m3_linear_p(qkv, LDP, xn, D, &mq, T, &prof);
        m3_linear_p(qkv + NQ, LDP, xn, D, &mk, T, &prof);
        m3_linear_p(qkv + NQ + NKV, LDP, xn, D, &mv, T, &prof);
        m3_linear_p(qkv + NQ + 2 * NKV, LDP, xn, D, &miq, T, &prof);
        m3_linear_p(qkv + NQ + 2 * NKV + NIQ, LDP, xn, D, &mik, T, &prof);
    });
    STAGE("q/k norm+rope", 0, false, {
        m3_qk_norm_rope(qkv, LDP, pos, T, H, Dh, nq, eps, R, theta, &prof);
        m3_qk_norm_rope(qkv + NQ, LDP, pos, T, Hkv, Dh, nk, eps, R, theta, &prof);
        m3_qk_norm_rope(qkv + NQ + 2 * NKV, LDP, pos, T, G, Di, niq, eps, R, theta, &prof);
        m3_qk_norm_rope(qkv + NQ + 2 * NKV + NIQ, LDP, pos, T, 1, Di, nik, eps, R, theta, &prof);
        for (int t = 0; t < T; t++) { /* append to the caches */
            const float *row = qkv + (size_t)t * LDP;
            memcpy(kc + (size_t)pos[t] * NKV, row + NQ, sizeof(float) * NKV);
            memcpy(vc + (size_t)pos[t] * NKV, row + NQ + NKV, sizeof(float) * NKV);
            memcpy(ikc + (size_t)pos[t] * Di, row + NQ + 2 * NKV + NIQ, sizeof(float) * Di);
        }
    });
    double idx_fl = 0, att_fl = 0;
    for (int t = 0; t < T; t++) {
        idx_fl += 2.0 * G * (pos[t] + 1) * Di;
        int bp = pos[t] / B, nkeys = (bp < KB ? bp : KB - 1) * B + pos[t] % B + 1;
        att_fl += 4.0 * H * nkeys * Dh;
    }
    STAGE("indexer top-k", idx_fl, false,
          m3_indexer_topk(topk, NULL, NULL, &n_ties, qkv + NQ + 2 * NKV, LDP, ikc, pos, T, C,
                          &ip, &prof, s_idx, sb_idx));
    STAGE("sparse attention", att_fl, false,
          m3_attn_sparse(att, qkv, LDP, kc, vc, pos, T, C, topk, W, B, &ap, &prof, s_att,
                         sb_att));
    STAGE("o_proj", m3_linear_flops(T, NQ, D), true, {
        m3_wmat mo = {M3_WFMT_BF16, wo, D, NQ};
        m3_linear_p(ao, D, att, NQ, &mo, T, &prof);
    });
    STAGE("post norm", 0, false, m3_rmsnorm_add(mn, ao, x, n_post, T, D, eps, &prof));
    STAGE("router+route", m3_linear_flops(T, D, E), false, {
        m3_moe_router_logits(lg, mn, T, gate, &mp, &prof, s_moe);
        m3_moe_route(ids, wts, NULL, lg, bias, T, &mp, &prof);
    });
    used = 0;
    {
        bool hit[128] = {false};
        for (int i = 0; i < T * KE; i++) hit[ids[i]] = true;
        for (int e = 0; e < E; e++) used += hit[e];
    }
    m3_moe_weights mw = {gate, bias, ex, {M3_WFMT_BF16, sw1, sw3, sw2}};
    m3_status est = M3_OK;
    STAGE("routed experts", 3.0 * m3_linear_flops(T * KE, D, F), true,
          est = m3_moe_experts(ro, mn, ids, wts, T, &mw, &mp, &prof, s_moe));
    if (est != M3_OK) {
        rc = m3_cli_fail(NULL);
        goto done;
    }
    STAGE("shared expert", 3.0 * m3_linear_flops(T, D, FS), true,
          m3_mlp(so, mn, T, &mw.shared, &sp, &prof, s_moe));
    STAGE("combine", 0, false, m3_moe_add_shared(ro, so, (int64_t)T * D, &prof));
#undef STAGE
    if (now_s() - total0 < total) total = now_s() - total0;
    }

    /* measured again after the layer: the machine may be shared, keep the best */
    if (measure_ceiling(&ceil_gf, &ceil_small, wq, x, T, NQ, D, ms, F) != 0) {
        rc = m3_cli_fail("bench: out of memory for the sgemm ceiling");
        goto done;
    }
    printf("ceiling: cblas_sgemm fp32, %d OpenBLAS threads: %.1f GFLOP/s at %dx%dx%d; "
           "%.1f GFLOP/s at %dx%dx%d (tokens per expert)\n", m3_threads(), ceil_gf, T, D, NQ,
           ceil_small, ms, D, F);
    printf("%-18s %9s %9s %9s %8s\n", "stage", "seconds", "GFLOP", "GFLOP/s", "ceiling");
    double gemm_s = 0, gemm_f = 0;
    for (int i = 0; i < ns; i++) {
        double gf = st[i].flop > 0 ? st[i].flop / st[i].sec * 1e-9 : 0;
        bool small = strcmp(st[i].name, "routed experts") == 0;
        double c = small ? ceil_small : ceil_gf;
        char ratio[32] = "";
        if (st[i].gemm) snprintf(ratio, sizeof ratio, "%5.0f%%%s", 100 * gf / c, small ? "*" : "");
        printf("%-18s %9.4f %9.2f %9.1f %8s\n", st[i].name, st[i].sec, st[i].flop * 1e-9, gf,
               ratio);
        if (st[i].gemm && !small) gemm_s += st[i].sec, gemm_f += st[i].flop;
    }
    printf("%-18s %9.4f   (best of %d)\n", "layer total", total, reps);
    printf("GEMM-bound stages (qkv, o_proj, shared): %.1f GFLOP/s = %.0f%% of the sgemm ceiling\n",
           gemm_f / gemm_s * 1e-9, 100 * gemm_f / gemm_s * 1e-9 / ceil_gf);
    printf("* routed experts: %d experts hit, %.1f tokens each on average: weight-bandwidth "
           "bound, compared with sgemm at the same small shape\n", used, (double)T * KE / used);
    printf("indexer: %d top-%d width, %d rows with a tie at rank K\n", W, KB, n_ties);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak RSS: %.0f MiB\n", (double)ru.ru_maxrss / 1024.0);
done:
    free(wq), free(wk), free(wv), free(wiq), free(wik), free(wo), free(n_in), free(n_post);
    free(nq), free(nk), free(niq), free(nik), free(gate), free(bias), free(sw1), free(sw3);
    free(sw2), free(kc), free(vc), free(ikc), free(x), free(h), free(xn), free(qkv), free(att);
    free(ao), free(mn), free(lg), free(wts), free(ro), free(so), free(ids), free(pos), free(topk);
    free(s_att), free(s_idx), free(s_moe);
    if (pw)
        for (int i = 0; i < pool * 3; i++) free(pw[i]);
    free(pw), free(ex);
    return rc;
}
