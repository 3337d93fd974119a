/* tests/gpu_model.c: the whole model on the device (gpu/model.hip, gpu/layer.hip) against the
 * CPU reference (ref/model.c), through the comparison engine (compare/compare.h) and its
 * built-in tolerance table (compare/tol.c: the gates live there, none is hard-coded here).
 *
 * Fixtures: fixtures/tiny-moe and fixtures/tiny-deep (M3_FIXTURES=DIR to look elsewhere):
 * hidden 64 / 48, head_dim 16 / 12, expert width 32 / 16, so the generic expert path and the
 * CUDA-core indexer run next to the tiled / tensor-core ones. For each fixture and case both
 * backends write an m3-dump/1 file of every stage (same tap protocol), then
 * m3_compare_dumps(ref, gpu) must pass (exit code 0), every stage must be on both sides (no
 * stage only in one dump) and the key stages (layer outputs, index_topk, expert_ids,
 * logits) must have been compared, so nothing passes vacuously. One line per stage class
 * with its worst NMSE (float stages) or lowest set agreement (index sets) is printed.
 * Cases: prefill under hf (bf16 storage, and fp32 storage), fp32 profile; prefill + 4 decode
 * steps (hf, fp32) over the same token sequence; teacher-forced replay from the fixture's
 * transformers dump (hf, hf --ref-select, fp32); flash attention (hf; over paged caches: hf
 * bf16 and atom fp8 KV); argument errors; the
 * CLI (`m3 run/replay --backend gpu --dump`, then `m3 compare` exit 0: run under fp32 and
 * under hf with fp32 storage, replay under hf with bf16 storage). Variant cases (numerics
 * variants, ref/variant.h): MX experts and activations, top-k reuse, fp8 / paged caches under
 * hf and atom (atom's paged fp8 KV cache: the three §4.7 writers and the §4.9 emulation), the
 * tiled expert path on a generated hidden-128 checkpoint, and their CLI runs.
 * Without a device every test skips. M3_GPU_MODEL_HARNESS=ref swaps the GPU model for a
 * second reference model, which checks this file's own plumbing on a CPU box. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compare/compare.h"
#include "compare/dump.h"
#include "ref/model.h"
#include "ref/qload.h"
#include "ref/st_write.h"
#include "ref/quant.h"
#include "ref/variant.h"
#include "tests/gpu_test.h"

static char tmpdir[256];
static bool harness_ref; /* candidate = ref (plumbing check without a device) */
static const char *fixtures[] = {"tiny-moe", "tiny-deep"};
#define N_FIX 2

static const char *fix_root_override; /* the generated checkpoints of the tiled cases */

static const char *fix_root(void) {
    if (fix_root_override) return fix_root_override;
    const char *e = getenv("M3_FIXTURES");
    return e && *e ? e : "fixtures";
}

static void fix_path(char *buf, size_t cap, const char *fx, const char *what) {
    snprintf(buf, cap, "%s/%s/%s", fix_root(), fx, what);
}

static int setup(void **state) {
    gpu_group_setup(state);
    const char *h = getenv("M3_GPU_MODEL_HARNESS");
    harness_ref = h && !strcmp(h, "ref");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/m3_gpu_model_XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    return 0;
}

static int teardown(void **state) {
    gpu_group_teardown(state);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The device context, or skip; with the harness switch a NULL context is fine. */
static m3_gpu *need_gpu(void **state) {
    if (harness_ref) {
        if (*state) m3_gpu_release((m3_gpu *)*state, 0);
        return (m3_gpu *)*state;
    }
    return gpu_or_skip(state);
}

/* ---- one model of either backend ---------------------------------------------------------- */
typedef struct {
    m3_model *ref;
    m3_gpu_model *gm;
} model;

static void model_open_v(model *m, m3_gpu *g, bool gpu, const char *fx, const char *profile,
                         const m3_gpu_model_opts *o, const m3_variant *v) {
    memset(m, 0, sizeof *m);
    char dir[512];
    fix_path(dir, sizeof dir, fx, "model");
    m3_profile p;
    GPU_OK(m3_profile_by_name(&p, profile));
    if (gpu && !harness_ref) {
        m3_gpu_model_opts d;
        m3_gpu_model_opts_default(&d);
        GPU_OK(m3_gpu_model_open(&m->gm, g, dir, NULL, &p, o ? o : &d));
        if (v) GPU_OK(m3_gpu_model_set_variant(m->gm, v));
    } else {
        GPU_OK(m3_model_open(&m->ref, dir, NULL, &p));
        if (v) GPU_OK(m3_model_set_variant(m->ref, v));
    }
}

static void model_open(model *m, m3_gpu *g, bool gpu, const char *fx, const char *profile,
                       const m3_gpu_model_opts *o) {
    model_open_v(m, g, gpu, fx, profile, o, NULL);
}

static void model_close(model *m) {
    m3_gpu_model_close(m->gm);
    m3_model_close(m->ref);
}

static m3_status model_forward(model *m, const int32_t *tok, int T, const m3_hooks *hk,
                               const char *prefix, int32_t *next) {
    if (m->gm) return m3_gpu_model_forward(m->gm, tok, NULL, T, hk, prefix, NULL, next);
    return m3_model_forward(m->ref, tok, NULL, T, hk, prefix, NULL, next);
}

/* ---- dumps ------------------------------------------------------------------------------- */
static m3_status dump_tap(void *ctx, const char *key, const m3_tensor *t, const char *dt) {
    return m3_dump_write((m3_dump *)ctx, key, t, dt);
}

static m3_status fetch_dump(void *ctx, const char *key, m3_tensor *out) {
    m3_dump *d = ctx;
    if (!m3_dump_has(d, key))
        return m3_errorf(M3_ERR_MISSING, "%s: no stage '%s'", m3_dump_path(d), key);
    return m3_dump_read(d, key, out);
}

static m3_dump *dump_create(const char *path, const char *producer, const char *profile) {
    m3_dump *d = NULL;
    GPU_OK(m3_dump_open(&d, path, M3_DUMP_CREATE | M3_DUMP_FORCE));
    GPU_OK(m3_dump_set_attr_str(d, "producer", producer));
    GPU_OK(m3_dump_set_attr_str(d, "profile", profile));
    return d;
}

/* int32 vector stage of a dump (tokens) */
static int32_t *read_ids(const char *path, const char *key, int *n) {
    m3_dump *d = NULL;
    GPU_OK(m3_dump_open(&d, path, M3_DUMP_READ));
    m3_tensor t = {0};
    GPU_OK(m3_dump_read(d, key, &t));
    m3_dump_close(d);
    if (t.dtype != M3_DT_I32 || t.rank != 1) m3_test_failf("%s %s: not an int32 vector", path, key);
    *n = (int)t.shape[0];
    return t.data;
}

/* The fixture's prompt (the transformers dump's tokens), plus n_gen decode tokens chosen by
 * the reference under `profile` (both backends then run the same sequence). */
static int32_t *prompt(const char *fx, int *n) {
    char p[512];
    fix_path(p, sizeof p, fx, "hf_bf16.h5");
    return read_ids(p, "tokens", n);
}

/* Run the sequence (prefill of n_prompt tokens, then one pass per remaining token) on one
 * backend, writing every stage to `path`. */
static void run_to_dump(m3_gpu *g, bool gpu, const char *fx, const char *profile,
                        const m3_gpu_model_opts *o, const m3_variant *v, const int32_t *tok,
                        int n_prompt, int n_total, const char *sel_from, bool force_input,
                        const char *path) {
    model m;
    model_open_v(&m, g, gpu, fx, profile, o, v);
    if (m.gm) GPU_OK(m3_gpu_model_reserve(m.gm, n_total));
    m3_dump *d = dump_create(path, gpu && !harness_ref ? "m3 gpu test" : "m3 ref test", profile);
    if (v) { /* as m3 run records it: m3_compare_dumps picks the tolerance class from it */
        char vj[2048];
        m3_variant_json(v, vj, sizeof vj);
        GPU_OK(m3_dump_set_attr_str(d, "variant", vj));
    }
    m3_hooks hk = {.tap = dump_tap, .tap_ctx = d};
    m3_dump *src = NULL;
    if (sel_from) { /* the discrete choices (index_topk, expert_ids) of another run */
        GPU_OK(m3_dump_open(&src, sel_from, M3_DUMP_READ));
        hk.fetch = fetch_dump;
        hk.fetch_ctx = src;
        hk.force_selection = true;
        hk.force_input = force_input;
    }
    char prefix[32] = "";
    if (n_total > n_prompt) snprintf(prefix, sizeof prefix, "passes/%04d/", 0);
    int32_t next = -1;
    GPU_OK(model_forward(&m, tok, n_prompt, &hk, prefix, &next));
    for (int i = n_prompt; i < n_total; i++) {
        snprintf(prefix, sizeof prefix, "passes/%04d/", i - n_prompt + 1);
        GPU_OK(model_forward(&m, &tok[i], 1, &hk, prefix, &next));
    }
    GPU_OK(m3_dump_commit(d));
    m3_dump_close(d);
    m3_dump_close(src);
    model_close(&m);
}

/* Teacher-forced replay of the single-pass dump `from` on one backend. */
static void replay_to_dump(m3_gpu *g, bool gpu, const char *fx, const char *profile,
                           const char *from, bool ref_select, const m3_gpu_model_opts *o,
                           const char *path) {
    int T;
    int32_t *tok = read_ids(from, "tokens", &T);
    model m;
    model_open(&m, g, gpu, fx, profile, o);
    m3_dump *src = NULL;
    GPU_OK(m3_dump_open(&src, from, M3_DUMP_READ));
    m3_dump *d = dump_create(path, gpu && !harness_ref ? "m3 gpu test" : "m3 ref test", profile);
    m3_hooks hk = {.tap = dump_tap,
                   .tap_ctx = d,
                   .fetch = fetch_dump,
                   .fetch_ctx = src,
                   .force_input = true,
                   .force_selection = ref_select};
    int32_t next;
    GPU_OK(model_forward(&m, tok, T, &hk, "", &next));
    GPU_OK(m3_dump_commit(d));
    m3_dump_close(d);
    m3_dump_close(src);
    model_close(&m);
    free(tok);
}

/* ---- the verdict ------------------------------------------------------------------------- */
typedef struct {
    char stage[64];
    int n;
    double worst; /* NMSE, or lowest agreement for sets */
    bool is_set;
} stage_sum;

/* until_tie: a free run under bf16 storage may flip a selection on a near-tie of the
 * reference scores (the comparator reports it as a tie flip, not a failure); the flipped
 * (head, token) row then attends over other blocks and every later stage legitimately moves
 * (measured on the H200: layer 1 of tiny-moe, one row of 256, attn_out NMSE 3.1e-3). Such a
 * run is gated up to and including the first index-set stage with a tie flip, and reported
 * after it. The same sequence teacher-forced by the reference run (every layer's input and
 * its index_topk / expert_ids fetched from the ref dump, in every pass, as replay does) is
 * gated in full: it measures each layer's own error. Forcing the selections alone is not
 * enough for decode: the free-running bf16 drift of earlier layers and passes accumulates
 * (measured on the H200: tiny-deep passes/0004/layers/05/mlp_out, one row, NMSE 1.04e-3). */
/* GATE_REPORT: nothing gated but the dump's structure (every stage on both sides, the key
 * stages compared); the stage classes and the tolerance verdict are printed. For free runs
 * whose drift MX activation codes amplify beyond the lowp bounds (tiled_case). */
typedef enum { GATE_FULL = 0, GATE_UNTIL_TIE, GATE_UNTIL_FLIP, GATE_REPORT } gate_mode;

/* GATE_UNTIL_FLIP: as until_tie, but up to (not including) the first set stage with any
 * flip. Variant runs quantize (MX / fp8 codes): a 1-ulp bf16 difference of an input can become
 * a whole code step, so a flipped selection of a free run need not be a near-tie by the bf16
 * rule (measured on the H200: fp8 index cache, tiny-moe, free hf run: 4 of 256 rows with real
 * flips at layer 3 while every earlier stage agreed); the teacher-forced run of the same
 * sequence is the strict gate there. */
/* Activation quantization under the fp32 profile: the GPU's fp32 sums differ from ref's in
 * the last bit and an MX code on a rounding boundary takes its neighbour (measured on the
 * H200: tiny-deep --experts mxfp8, shared_out NMSE 5.5e-8 in-process, 1.29e-5 in the CLI free
 * run). run_to_dump records the variant in the dump as `m3 run` does, so m3_compare_dumps
 * judges these pairs by the fp32q class (compare/tol.c: NMSE / KL floors 1e-4), not by a
 * tolerance of this test's own. */
static void tol_for_case(m3_tol *tol) { m3_tol_builtin(tol); }

static void expect_agree_mode(const char *ref_path, const char *gpu_path, const char *what,
                              gate_mode mode) {
    const bool until_tie = mode == GATE_UNTIL_TIE || mode == GATE_UNTIL_FLIP;
    m3_tol tol;
    tol_for_case(&tol);
    m3_cmp_opts co = {.pass = -1};
    m3_cmp_report *r = NULL;
    GPU_OK(m3_compare_dumps(&r, ref_path, gpu_path, &tol, &co));
    stage_sum sum[64];
    int ns = 0, n_output = 0, n_logits = 0, n_topk = 0, n_ids = 0, n_gated_fail = 0;
    char tie_at[200] = "";
    for (int i = 0; i < r->n_items; i++) {
        const m3_cmp_item *it = &r->items[i];
        if (it->status != M3_CMP_PASS && it->status != M3_CMP_FAIL) continue;
        const bool flip_here =
            until_tie && !tie_at[0] && it->kind == M3_STAGE_INDEX_SET &&
            (it->set.flips_tie > 0 || (mode == GATE_UNTIL_FLIP && it->set.flips_real > 0));
        /* until_flip: the flipped set stage itself is reported, not gated */
        if (it->status == M3_CMP_FAIL && !tie_at[0] && !(flip_here && mode == GATE_UNTIL_FLIP))
            n_gated_fail++;
        if (flip_here) m3_cmp_item_name(r, it, tie_at, sizeof tie_at);
        if (!strcmp(it->stage, "output")) n_output++;
        if (!strcmp(it->stage, "logits")) n_logits++;
        if (!strcmp(it->stage, "index_topk")) n_topk++;
        if (!strcmp(it->stage, "expert_ids")) n_ids++;
        if (it->kind == M3_STAGE_EXACT) continue;
        const bool is_set = it->kind == M3_STAGE_INDEX_SET;
        const double v = is_set ? m3_setdiff_agree(&it->set) : m3_diff_nmse(&it->diff);
        int j = 0;
        while (j < ns && strcmp(sum[j].stage, it->stage)) j++;
        if (j == ns) {
            if (ns == 64) continue;
            snprintf(sum[ns].stage, sizeof sum[ns].stage, "%s", it->stage);
            sum[ns].n = 0;
            sum[ns].worst = is_set ? 1.0 : 0.0;
            sum[ns].is_set = is_set;
            ns++;
        }
        sum[j].n++;
        if (is_set ? v < sum[j].worst : !(v <= sum[j].worst)) sum[j].worst = v;
    }
    printf("  %s: %d stages compared, %d failed (tolerance class %s)\n", what,
           r->n_pass + r->n_fail, r->n_fail, m3_tol_class_name(r->tol_class));
    for (int j = 0; j < ns; j++)
        printf("    %-16s x%-3d %s %.3e\n", sum[j].stage, sum[j].n,
               sum[j].is_set ? "min agreement" : "worst nmse   ", sum[j].worst);
    fflush(stdout);
    int rc = m3_cmp_exit_code(r);
    if (mode == GATE_REPORT) {
        printf("    report only (not gated): %d stages beyond tolerance\n", r->n_fail);
        rc = 0;
    }
    if (until_tie && tie_at[0]) {
        printf("    gated up to %s (first %sselection flip): %d failed before it; %d "
               "stages beyond tolerance in all (reported)\n",
               tie_at, mode == GATE_UNTIL_TIE ? "near-tie " : "", n_gated_fail, r->n_fail);
        rc = n_gated_fail ? 1 : 0;
    }
    if (rc != 0 || r->n_only_a || r->n_only_b) m3_report_text(stdout, r, false, false);
    const int n_fail = r->n_fail, only_a = r->n_only_a, only_b = r->n_only_b;
    m3_cmp_report_free(r);
    if (rc != 0) m3_test_failf("%s: m3 compare verdict %d (%d stages failed)", what, rc, n_fail);
    if (only_a || only_b)
        m3_test_failf("%s: %d stages only in ref, %d only in gpu", what, only_a, only_b);
    if (!n_output || !n_logits || !n_topk || !n_ids)
        m3_test_failf("%s: key stages not compared (output %d, logits %d, index_topk %d, "
                      "expert_ids %d)",
                      what, n_output, n_logits, n_topk, n_ids);
}

static void expect_agree(const char *ref_path, const char *gpu_path, const char *what) {
    expect_agree_mode(ref_path, gpu_path, what, GATE_FULL);
}

/* ---- cases ------------------------------------------------------------------------------- */
/* forced_pair: the teacher-forced candidate run is compared with the reference forced the
 * same way, not with the free reference run. Under atom the fused add + norm normalises the
 * fp32 sum r + h (norm_reads_f32_sum) while a forced layer input is the stored bf16 residual,
 * so a forced run differs from the free one by bf16 ulps of every norm input even on ref
 * itself; an fp8 KV cache turns those into code steps: ref forced against ref free measured
 * attn_out NMSE 1.1e-3..2.3e-3 at reusing / decode layers of tiny-moe (kv_cache fp8
 * topk_reuse 2, CPU, 2026-11-29), beyond the lowp 1e-3. Both forced runs take the same
 * inputs and selections, so they measure each layer's own device error. */
static bool forced_pair;

/* free: gate the free run in full (fp32 storage, fp32 profile) or until its first near-tie
 * flip plus a run teacher-forced by the reference run, gated in full (bf16 storage). */
static void run_case_v(void **state, const char *profile, const m3_gpu_model_opts *o,
                       const m3_variant *v, const char *tag, int n_gen, bool free_full) {
    m3_gpu *g = need_gpu(state);
    for (int f = 0; f < N_FIX; f++) {
        const char *fx = fixtures[f];
        int n;
        int32_t *p = prompt(fx, &n);
        int32_t *tok = malloc((size_t)(n + n_gen) * sizeof *tok);
        assert_non_null(tok);
        memcpy(tok, p, (size_t)n * sizeof *tok);
        free(p);
        if (n_gen > 0) { /* the reference's greedy continuation, fed to both backends */
            model m;
            model_open_v(&m, g, false, fx, profile, NULL, v);
            int32_t next;
            GPU_OK(model_forward(&m, tok, n, NULL, NULL, &next));
            for (int i = 0; i < n_gen; i++) {
                tok[n + i] = next;
                GPU_OK(model_forward(&m, &tok[n + i], 1, NULL, NULL, &next));
            }
            model_close(&m);
        }
        char a[512], b[512], what[160];
        snprintf(a, sizeof a, "%s/%s_%s_ref.h5", tmpdir, fx, tag);
        snprintf(b, sizeof b, "%s/%s_%s_gpu.h5", tmpdir, fx, tag);
        snprintf(what, sizeof what, "%s %s (%d tokens + %d decode steps)", fx, tag, n, n_gen);
        run_to_dump(g, false, fx, profile, o, v, tok, n, n + n_gen, NULL, false, a);
        run_to_dump(g, true, fx, profile, o, v, tok, n, n + n_gen, NULL, false, b);
        expect_agree_mode(a, b, what, free_full ? GATE_FULL : v ? GATE_UNTIL_FLIP : GATE_UNTIL_TIE);
        if (!free_full) {
            char c[512], cr[512];
            snprintf(c, sizeof c, "%s/%s_%s_gpu_forced.h5", tmpdir, fx, tag);
            snprintf(what, sizeof what, "%s %s, teacher-forced by the ref run (every pass)%s", fx,
                     tag, forced_pair ? ", against ref forced the same way" : "");
            run_to_dump(g, true, fx, profile, o, v, tok, n, n + n_gen, a, true, c);
            if (forced_pair) {
                snprintf(cr, sizeof cr, "%s/%s_%s_ref_forced.h5", tmpdir, fx, tag);
                run_to_dump(g, false, fx, profile, o, v, tok, n, n + n_gen, a, true, cr);
                expect_agree(cr, c, what);
            } else {
                expect_agree(a, c, what);
            }
        }
        free(tok);
    }
}

static void run_case(void **state, const char *profile, const m3_gpu_model_opts *o,
                     const char *tag, int n_gen, bool free_full) {
    run_case_v(state, profile, o, NULL, tag, n_gen, free_full);
}

static void model_run_hf(void **state) {
    run_case(state, "hf", NULL, "run_hf", 0, false);
}

static void model_run_hf_f32_storage(void **state) {
    m3_gpu_model_opts o;
    m3_gpu_model_opts_default(&o);
    o.f32_storage = true;
    run_case(state, "hf", &o, "run_hf_f32storage", 0, true);
}

static void model_run_fp32(void **state) {
    run_case(state, "fp32", NULL, "run_fp32", 0, true);
}

static void model_decode_hf(void **state) {
    run_case(state, "hf", NULL, "decode_hf", 4, false);
}

static void model_decode_fp32(void **state) {
    run_case(state, "fp32", NULL, "decode_fp32", 4, true);
}

static void model_run_hf_flash(void **state) {
    m3_gpu_model_opts o;
    m3_gpu_model_opts_default(&o);
    o.flash = true;
    run_case(state, "hf", &o, "run_hf_flash", 0, false);
}

static void model_run_hf_streamed(void **state) {
    m3_gpu_model_opts o;
    m3_gpu_model_opts_default(&o);
    o.resident = 0;
    run_case(state, "hf", &o, "run_hf_streamed", 2, false);
}

static void replay_case(void **state, const char *profile, const char *src, bool sel,
                        const char *tag) {
    m3_gpu *g = need_gpu(state);
    for (int f = 0; f < N_FIX; f++) {
        const char *fx = fixtures[f];
        char from[512], a[512], b[512], what[160];
        fix_path(from, sizeof from, fx, src);
        snprintf(a, sizeof a, "%s/%s_%s_ref.h5", tmpdir, fx, tag);
        snprintf(b, sizeof b, "%s/%s_%s_gpu.h5", tmpdir, fx, tag);
        snprintf(what, sizeof what, "%s %s (teacher-forced from %s)", fx, tag, src);
        replay_to_dump(g, false, fx, profile, from, sel, NULL, a);
        replay_to_dump(g, true, fx, profile, from, sel, NULL, b);
        expect_agree(a, b, what);
    }
}

static void model_replay_hf(void **state) {
    replay_case(state, "hf", "hf_bf16.h5", false, "replay_hf");
}

static void model_replay_hf_ref_select(void **state) {
    replay_case(state, "hf", "hf_bf16.h5", true, "replay_hf_refselect");
}

static void model_replay_fp32(void **state) {
    replay_case(state, "fp32", "hf_fp32.h5", false, "replay_fp32");
}

/* ---- numerics variants (ref/variant.h) ---------------------------------------------------- */

/* a variant from "key=value key=value ..." (CLI keys, '_' or '-') */
static void variant_from(m3_variant *v, const char *spec) {
    m3_variant_default(v);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *kv = strtok_r(buf, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(kv, '=');
        assert_non_null(eq);
        *eq = 0;
        GPU_OK(m3_variant_set(v, kv, eq + 1));
    }
    GPU_OK(m3_variant_check(v));
}

/* n device bytes at d equal to the host bytes h */
static size_t cmp_dev(m3_gpu *g, const void *d, const void *h, size_t n, const char *what, int L,
                      int e) {
    unsigned char *tmp = malloc(n + 1);
    assert_non_null(tmp);
    GPU_OK(m3_gpu_download(g, tmp, d, n));
    const unsigned char *hb = h;
    for (size_t i = 0; i < n; i++)
        if (tmp[i] != hb[i])
            m3_test_failf("layer %d expert slot %d %s: byte %zu is 0x%02x on the device, 0x%02x in "
                          "ref's quantized weights", L, e, what, i, tmp[i], hb[i]);
    free(tmp);
    return n;
}

/* one MX matrix of ref (an m3_wq, [rows, cols]) against slot `slot` of a device array */
static size_t cmp_mx(m3_gpu *g, const void *dcodes, const m3_e8m0 *dscales, const void *wq_p,
                     bool fp4, int rows, int cols, int slot, const char *what, int L) {
    const m3_wq *q = wq_p;
    const size_t rb = fp4 ? (size_t)(cols + 1) / 2 : (size_t)cols, nb = (size_t)(cols + 31) / 32;
    const size_t r = (size_t)rows;
    size_t n = cmp_dev(g, (const uint8_t *)dcodes + (size_t)slot * r * rb, q->codes, r * rb, what,
                       L, slot);
    return n + cmp_dev(g, dscales + (size_t)slot * r * nb, q->scale, r * nb, what, L, slot);
}

/* *lo / *hi widened to the e8m0 scale bytes of ref's MX matrix wq_p ([rows, cols]) */
static void sc_range(const void *wq_p, int rows, int cols, int *lo, int *hi) {
    const m3_wq *q = wq_p;
    const uint8_t *sc = q->scale;
    const size_t n = (size_t)rows * (size_t)((cols + 31) / 32);
    for (size_t i = 0; i < n; i++) {
        *lo = sc[i] < *lo ? sc[i] : *lo;
        *hi = sc[i] > *hi ? sc[i] : *hi;
    }
}

/* the device's activation quantization equals ref's m3_wq.act (NULL = none) */
static void check_act(const m3_actq *d, const m3_actq *r, const char *what) {
    if (!r || r->kind == M3_ACTQ_NONE) {
        if (d) m3_test_failf("%s: the device quantizes activations, ref does not", what);
        return;
    }
    if (!d) m3_test_failf("%s: ref quantizes activations, the device does not", what);
    if (d->kind != r->kind || d->min_pass != r->min_pass || d->mx.elem != r->mx.elem ||
        d->mx.scale != r->mx.scale || d->mx.round != r->mx.round || d->mx.zero != r->mx.zero ||
        d->mx.block != r->mx.block || d->mx.ovf != r->mx.ovf ||
        d->mx.high_even_nibble != r->mx.high_even_nibble)
        m3_test_failf("%s: activation quantization differs from ref's", what);
}

/* Quantize-on-load: the device holds ref's own codes and e8m0 scales, bit for bit, for every
 * routed expert, the shared expert (own arrays, or slot E when fused at the routed width), and
 * ref's activation quantization of the pass. */
/* One MXFP8 layer uploaded again with an e4m3 NaN code (0x7F / 0xFF) planted into a copy of
 * one matrix's codes (ref's own stay untouched), in turn: the first byte of the first expert's
 * gate, the last byte of the last slot's down (the end of the stacked array), and, when the
 * shared expert has its own arrays, its up. The scan must flag exactly the set that holds it
 * (finite_codes 0 there, 1 elsewhere). Returns the number of plantings checked. */
static int nan_code_upload(m3_gpu *g, m3_layer_weights *hw, const m3_config *c,
                           const m3_profile *p, bool slot, int FS, int F, int D) {
    const int E = c->n_expert;
    const int last = slot ? E : E - 1;
    /* hw's expert array is ref's (const in the view); its matrix pointers are swapped here
     * and restored below, the bytes they point to are never written */
    m3_mlp_weights *ex = (m3_mlp_weights *)hw->moe.experts;
    m3_mlp_weights *targets[3] = {&ex[0], last < E ? &ex[last] : &hw->moe.shared,
                                  (!slot && FS > 0) ? &hw->moe.shared : NULL};
    int done = 0;
    for (int t = 0; t < 3; t++) {
        m3_mlp_weights *x = targets[t];
        if (!x) continue;
        const void **mat = t == 0 ? &x->gate : t == 1 ? &x->down : &x->up;
        const int rows = t == 1 ? D : (t == 2 ? FS : F), cols = t == 1 ? (last < E ? F : FS) : D;
        const m3_wq *orig = (const m3_wq *)*mat;
        const size_t n = (size_t)rows * (size_t)cols; /* MXFP8: one byte a code */
        uint8_t *codes = malloc(n);
        assert_non_null(codes);
        memcpy(codes, orig->codes, n);
        codes[t == 1 ? n - 1 : 0] = t == 1 ? 0xFF : 0x7F;
        m3_wq planted = *orig;
        planted.codes = codes;
        *mat = &planted;
        const size_t mark = m3_gpu_mark(g);
        m3_gpu_layer_weights *gw = NULL;
        m3_gpu_experts ew, sw;
        int nslot = 0;
        GPU_OK(m3_gpu_layer_weights_upload(g, &gw, hw, c, p, true));
        GPU_OK(m3_gpu_layer_weights_experts(gw, &ew, &nslot, &sw));
        assert_int_equal(ew.finite_codes, t == 2 ? 1 : 0);
        if (!slot && FS > 0) assert_int_equal(sw.finite_codes, t == 2 ? 0 : 1);
        m3_gpu_layer_weights_free(gw);
        m3_gpu_release(g, mark);
        *mat = orig;
        free(codes);
        done++;
    }
    return done;
}

static void variant_codes_identical(void **state) {
    m3_gpu *g = need_gpu(state);
    if (harness_ref) skip();
    static const char *specs[] = {
        "experts=mxfp4",
        "experts=mxfp8 experts_scale=floor",
        "experts=mxfp4 experts_scale=rceil experts_round=rna shared_fused=on moe_act_bound=1 "
        "moe_stage2_act=none",
    };
    m3_profile p;
    GPU_OK(m3_profile_by_name(&p, "hf"));
    for (int f = 0; f < N_FIX; f++)
        for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
            m3_variant v;
            variant_from(&v, specs[k]);
            char dir[512];
            fix_path(dir, sizeof dir, fixtures[f], "model");
            m3_config *c = NULL;
            m3_weights *w = NULL;
            GPU_OK(m3_config_load(&c, dir));
            GPU_OK(m3_weights_open(&w, dir));
            const bool fp4 = v.experts == M3_EXPERTS_MXFP4;
            const int E = c->n_expert, D = c->hidden, F = c->expert_inter, FS = c->shared_inter;
            size_t bytes = 0;
            int n_moe = 0, n_slot_total = 0, n_nan_checks = 0, n_fast = 0;
            for (int L = 0; L < c->n_layer; L++) {
                if (!c->layer_moe[L]) continue;
                m3_layer_weights hw;
                GPU_OK(m3_layer_weights_load_v(&hw, w, c, L, &v, &p));
                const size_t mark = m3_gpu_mark(g);
                m3_gpu_layer_weights *gw = NULL;
                GPU_OK(m3_gpu_layer_weights_upload(g, &gw, &hw, c, &p, true));
                m3_gpu_experts ew, sw;
                int nslot = 0;
                GPU_OK(m3_gpu_layer_weights_experts(gw, &ew, &nslot, &sw));
                assert_int_equal(ew.fmt, fp4 ? M3_GPU_W_MXFP4 : M3_GPU_W_MXFP8);
                const bool slot = hw.shared_fused && FS == F;
                assert_int_equal(nslot, E + (slot ? 1 : 0));
                int lo = 255, hi = 0, slo = 255, shi = 0; /* ref's scale bytes */
                for (int e = 0; e < nslot; e++) {
                    const m3_mlp_weights *x = e < E ? &hw.moe.experts[e] : &hw.moe.shared;
                    assert_int_equal(x->fmt, fp4 ? M3_WFMT_MXFP4 : M3_WFMT_MXFP8);
                    sc_range(x->gate, F, D, &lo, &hi);
                    sc_range(x->up, F, D, &lo, &hi);
                    sc_range(x->down, D, F, &lo, &hi);
                    bytes += cmp_mx(g, ew.gate, ew.gate_s, x->gate, fp4, F, D, e, "gate_proj", L);
                    bytes += cmp_mx(g, ew.up, ew.up_s, x->up, fp4, F, D, e, "up_proj", L);
                    bytes += cmp_mx(g, ew.down, ew.down_s, x->down, fp4, D, F, e, "down_proj", L);
                }
                if (!slot && FS > 0) {
                    const m3_mlp_weights *x = &hw.moe.shared;
                    assert_non_null(sw.gate);
                    assert_int_equal(sw.fmt, ew.fmt);
                    bytes += cmp_mx(g, sw.gate, sw.gate_s, x->gate, fp4, FS, D, 0, "shared gate", L);
                    bytes += cmp_mx(g, sw.up, sw.up_s, x->up, fp4, FS, D, 0, "shared up", L);
                    bytes += cmp_mx(g, sw.down, sw.down_s, x->down, fp4, D, FS, 0, "shared down", L);
                    sc_range(x->gate, FS, D, &slo, &shi);
                    sc_range(x->up, FS, D, &slo, &shi);
                    sc_range(x->down, D, FS, &slo, &shi);
                    assert_int_equal(sw.mx_scale_lo, slo);
                    assert_int_equal(sw.mx_scale_hi, shi);
                }
                /* the upload's scale scan: exactly ref's range (m3_gpu_experts.mx_scale_lo /
                 * hi), and with it MXFP4's one-multiply decode (every byte <= 128 here: the
                 * fixtures' weights are far below 2) */
                assert_int_equal(ew.mx_scale_lo, lo);
                assert_int_equal(ew.mx_scale_hi, hi);
                assert_int_equal(m3_gpu_moe_mx4_fast(&ew), fp4 && hi <= 128 ? 1 : 0);
                if (fp4) assert_true(hi <= 128);
                n_fast += m3_gpu_moe_mx4_fast(&ew);
                const m3_wq *qg = hw.moe.experts[0].gate, *qd = hw.moe.experts[0].down;
                check_act(ew.act_in, qg->act, "act_in");
                check_act(ew.act_mid, qd->act, "act_mid");
                if (!fp4) assert_non_null(ew.act_in); /* MXFP8: e4m3 activations always */
                m3_gpu_layer_weights_free(gw);
                m3_gpu_release(g, mark);
                if (!fp4) { /* the upload's NaN-code scan (m3_gpu_experts.finite_codes) */
                    assert_int_equal(ew.finite_codes, 1); /* quantized finite weights: none */
                    n_nan_checks += nan_code_upload(g, &hw, c, &p, slot, FS, F, D);
                }
                m3_layer_weights_free(&hw);
                n_moe++;
                n_slot_total += nslot;
            }
            printf("  %s {%s}: %zu bytes of codes + scales (%d MoE layers, %d expert slots) "
                   "bit-identical to ref's; %d planted NaN codes found by the upload scan; "
                   "scale range as ref's, MXFP4 one-multiply decode in %d layers\n",
                   fixtures[f], specs[k], bytes, n_moe, n_slot_total, n_nan_checks, n_fast);
            assert_true(n_moe > 0 && bytes > 0);
            m3_weights_close(w);
            m3_config_free(c);
        }
}

/* Whole-model runs under a variant, both backends, compared as the plain cases are: prefill +
 * decode steps, the free run gated to its first selection flip (bf16 storage) or in full, and
 * the same sequence teacher-forced by the ref run, gated in full.
 * Activation quantization (MX act_in / act_mid) is checked under the fp32 profile only: under
 * hf a 1-ulp bf16 difference of a MoE input flips a 4-bit (or fp8) activation code, and ref
 * itself turns 5% of its mlp_norm elements moved by one bf16 ulp (input NMSE 1.5e-6) into an
 * expert output NMSE of 5e-4..1.9e-3 (MXFP4 act) or 1e-4..2e-4 (MXFP8 act), against ~1.5e-5
 * without activation quantization (tiny-moe layer 2: m3_moe_experts and m3_mlp on the
 * dumped mlp_norm and on a copy with 5% of its elements moved by +-1 ulp, 2026-11-29); the
 * H200 free hf runs then failed the 1e-3 lowp bound one MoE layer later (tiny-deep
 * layers/03/mlp_out 2.5e-3, tiny-moe --experts mxfp8 layers/03/mlp_out 4.8e-3) while the
 * teacher-forced tiny-moe run passed. Under fp32, one-fp32-ulp moves of half the inputs never
 * changed an output (0 of 320 ref trials), so the fp32 class gates them in full. */
static void variant_decode_hf(void **state) {
    /* MXFP4 weights (no activation quantization below 256 tokens), the shared expert fused,
     * top-k reuse */
    m3_variant v;
    variant_from(&v, "experts=mxfp4 shared_fused=on topk_reuse=2");
    run_case_v(state, "hf", NULL, &v, "variant_mxfp4_hf", 3, false);
}

static void variant_decode_fp32(void **state) {
    /* MXFP4 weights and activations from 2 tokens on (the prefill quantizes, the 1-token
     * decode passes do not: n_pass gating), the shared expert fused, top-k reuse */
    m3_variant v;
    variant_from(&v, "experts=mxfp4 moe_act_bound=2 experts_scale=floor shared_fused=on "
                     "topk_reuse=3");
    run_case_v(state, "fp32", NULL, &v, "variant_mxfp4_fp32", 3, true);
}

static void variant_mxfp8_fp32(void **state) {
    /* MXFP8 weights, e4m3 activations on every pass before gate/up, none before down */
    m3_variant v;
    variant_from(&v, "experts=mxfp8 experts_scale=floor moe_stage2_act=none");
    run_case_v(state, "fp32", NULL, &v, "variant_mxfp8_fp32", 1, true);
}

static void variant_run_hf_f32_storage(void **state) {
    m3_gpu_model_opts o;
    m3_gpu_model_opts_default(&o);
    o.f32_storage = true;
    m3_variant v;
    variant_from(&v, "experts=mxfp4 experts_round=rna topk_reuse=2 cache_layout=paged");
    run_case_v(state, "hf", &o, &v, "variant_mxfp4_hf_f32storage", 0, true);
}

static void variant_caches_hf(void **state) {
    /* fp8 KV (dense decode and sparse layers read it) and fp8 index cache, paged reads */
    m3_variant v;
    variant_from(&v, "kv_cache=fp8 index_cache=fp8");
    run_case_v(state, "hf", NULL, &v, "variant_fp8caches_hf", 3, false);
}

static void variant_caches_hf_f32_storage(void **state) {
    /* e4m3fnuz elements with a forced FP8_MAX; bf16 index cache with the prefill's fp8 query */
    m3_gpu_model_opts o;
    m3_gpu_model_opts_default(&o);
    o.f32_storage = true;
    m3_variant v;
    variant_from(&v, "kv_cache=fp8 fp8_kind=e4m3fnuz kv_fp8max=448 index_q_fp8_prefill=on "
                     "topk_reuse=2");
    run_case_v(state, "hf", &o, &v, "variant_fp8kv_fnuz_hf_f32storage", 2, false);
}

static void variant_ptpc_hf(void **state) {
    /* per-token / per-channel fp8 of every dense projection (attention, indexer, dense MLP) */
    m3_variant v;
    variant_from(&v, "ptpc=fp8 ptpc_zero_row=one");
    run_case_v(state, "hf", NULL, &v, "variant_ptpc_hf", 2, false);
}

/* The atom profile on the device: the plain caches (the baseline of the atom variant cases
 * below), then ATOM's paged KV cache (gpu/layer.hip + m3_gpu_attn_paged: page-Bs SHUFFLE view
 * of dense layers, page-P re-view of sparse ones, read through a block table) with bf16
 * elements, and with fp8 elements: all three §4.7 writers (dense layers and reusing sparse
 * layers quantize the unrounded fp32 k with FP8_MAX 240, computing sparse layers bf16(k) with
 * the kind's maximum and the fp32 amax: topk_reuse 2 makes reusing layers) and the §4.9
 * fp8 paged-attention emulation of every sparse layer and every dense decode pass. Free
 * runs gated to the first selection flip (fp8 codes turn a 1-ulp difference into a code
 * step, see GATE_UNTIL_FLIP), the same sequence teacher-forced by the ref run gated in full. */
static void model_decode_atom(void **state) {
    forced_pair = true;
    run_case(state, "atom", NULL, "decode_atom", 2, false);
    forced_pair = false;
}

static void variant_paged_atom(void **state) {
    m3_variant v;
    variant_from(&v, "cache_layout=paged");
    forced_pair = true;
    run_case_v(state, "atom", NULL, &v, "variant_paged_atom", 3, false);
    forced_pair = false;
}

static void variant_fp8kv_atom(void **state) {
    m3_variant v;
    variant_from(&v, "kv_cache=fp8 topk_reuse=2");
    forced_pair = true;
    run_case_v(state, "atom", NULL, &v, "variant_fp8kv_atom", 3, false);
    forced_pair = false;
}

static void variant_fp8caches_atom_f32_storage(void **state) {
    /* the fp32-storage path (the _f32 twins), fp8 index cache too, e4m3fnuz (FP8_MAX 240
     * for every writer) */
    m3_gpu_model_opts o;
    m3_gpu_model_opts_default(&o);
    o.f32_storage = true;
    m3_variant v;
    variant_from(&v, "kv_cache=fp8 index_cache=fp8 fp8_kind=e4m3fnuz topk_reuse=2");
    forced_pair = true;
    run_case_v(state, "atom", &o, &v, "variant_fp8caches_fnuz_atom_f32storage", 2, false);
    forced_pair = false;
}

/* The fast paged kernel (m3_gpu_attn_paged_flash, M3_GPU_ATTN=flash / opts.flash) in a
 * whole model: every sparse layer and dense decode pass reads the paged cache through it (the
 * fixtures' Dh 12 / 16, Bs 8, P 1 geometry: its element-gather path). hf with bf16 elements
 * (paged, top-k reuse), atom with fp8 elements (the §4.9 emulation, all three writers),
 * compared with ref under the built-in tolerances as the faithful cases above. */
static void variant_paged_flash_hf(void **state) {
    m3_gpu_model_opts o;
    m3_gpu_model_opts_default(&o);
    o.flash = true;
    m3_variant v;
    variant_from(&v, "cache_layout=paged topk_reuse=2");
    run_case_v(state, "hf", &o, &v, "variant_paged_flash_hf", 3, false);
}

static void variant_fp8kv_flash_atom(void **state) {
    m3_gpu_model_opts o;
    m3_gpu_model_opts_default(&o);
    o.flash = true;
    m3_variant v;
    variant_from(&v, "kv_cache=fp8 topk_reuse=2");
    forced_pair = true;
    run_case_v(state, "atom", &o, &v, "variant_fp8kv_flash_atom", 3, false);
    forced_pair = false;
}

/* ---- the tiled expert path in a whole model --------------------------------------------
 * The fixtures (hidden 64 / 48, expert width 32 / 16) take the generic expert path; the tiled
 * / GEMV kernels of m3_gpu_moe_experts need D % 128 == 0 and F % 64 == 0 (bf16 storage). So a
 * random checkpoint with tiny-moe's layout but hidden 128, expert and shared width 64 (the
 * shared expert can ride as slot E), three MoE layers of four (full, sparse x3), is written
 * into the test's temp dir (ref/st_write.h; config.json = tiny-moe's with those sizes), and
 * runs ref vs gpu under MX experts with MX activation quantization: a 40-token prefill
 * (T*K = 80 > 4E: the tensor-core tiles) and 2 decode steps (T*K = 2: the GEMV kernels).
 * Gate: the teacher-forced runs of both backends (every layer input and selection from the
 * free ref run) in full; the free run is reported, not gated: a 1-ulp bf16 difference of a MoE
 * input can flip an MX activation code (see variant_decode_hf), and the free hf runs moved
 * past the lowp bound with no flipped selection (H200, 2026-11-29: --experts mxfp8 passes/0001
 * layers/03/shared_out NMSE 1.6e-3; mxfp4 act from 1 token, passes/0000/layers/03/mlp_out
 * 5.5e-3, one element 1.97 -> 3.75) while the forced atom run agreed to mlp_out 1.5e-8. */
#define TL_D 128
#define TL_F 64
#define TL_V 512
#define TL_L 4

typedef struct {
    int64_t n;
    m3_dtype dt;
    float sd, mean;
} tl_tensor;

static m3_status tl_fill(void *ctx, int64_t i, uint8_t *buf, size_t nbytes) {
    const tl_tensor *t = (const tl_tensor *)ctx + i;
    m3_rng r;
    m3_rng_init(&r, 4242, 1000 + (uint64_t)i);
    float *x = malloc((size_t)t->n * sizeof *x);
    if (!x) return m3_errorf(M3_ERR_NOMEM, "tiled checkpoint: out of memory");
    m3_fill_normal(&r, x, t->n, t->sd);
    for (int64_t j = 0; j < t->n; j++) {
        x[j] += t->mean;
        if (t->dt == M3_DT_BF16) {
            m3_bf16 b = m3_f32_to_bf16(x[j]);
            memcpy(buf + 2 * j, &b, 2);
        } else {
            memcpy(buf + 4 * j, &x[j], 4);
        }
    }
    (void)nbytes;
    free(x);
    return M3_OK;
}

/* replace the first occurrence of `from` in the heap string *s by `to` (must exist) */
static void str_sub(char **s, const char *from, const char *to) {
    char *at = strstr(*s, from);
    if (!at) m3_test_failf("tiny-moe config.json: '%s' not found", from);
    size_t a = (size_t)(at - *s), n = strlen(*s) + strlen(to) - strlen(from) + 1;
    char *r = malloc(n);
    assert_non_null(r);
    memcpy(r, *s, a);
    strcpy(r + a, to);
    strcat(r, at + strlen(from));
    free(*s);
    *s = r;
}

/* tmpdir/tiled/model: config.json + model.safetensors (written once per test binary run) */
static const char *tiled_checkpoint(void) {
    static char root[300];
    if (root[0]) return root;
    char dir[400], path[500];
    snprintf(root, sizeof root, "%s/fx", tmpdir);
    snprintf(dir, sizeof dir, "%s/tiled", root);
    mkdir(root, 0755);
    mkdir(dir, 0755);
    snprintf(dir, sizeof dir, "%s/tiled/model", root);
    mkdir(dir, 0755);
    /* config: tiny-moe's, with the tiled sizes */
    char src[512];
    snprintf(src, sizeof src, "%s/tiny-moe/model/config.json", getenv("M3_FIXTURES") && *getenv("M3_FIXTURES") ? getenv("M3_FIXTURES") : "fixtures");
    FILE *f = fopen(src, "rb");
    if (!f) m3_test_failf("%s: cannot open", src);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *cfg = calloc((size_t)n + 1, 1);
    assert_non_null(cfg);
    if (fread(cfg, 1, (size_t)n, f) != (size_t)n) m3_test_failf("%s: short read", src);
    fclose(f);
    str_sub(&cfg, "\"hidden_size\": 64,", "\"hidden_size\": 128,");
    str_sub(&cfg, "\"intermediate_size\": 32,", "\"intermediate_size\": 64,");
    str_sub(&cfg, "\"shared_intermediate_size\": 32,", "\"shared_intermediate_size\": 64,");
    str_sub(&cfg, "\"dense\",\n      \"dense\",", "\"dense\",\n      \"sparse\",");
    /* text only: without vision_config the checkpoint needs no vision tensors (the last
     * top-level member of tiny-moe's config) */
    char *vis = strstr(cfg, ",\n  \"vision_config\"");
    if (!vis) m3_test_failf("tiny-moe config.json: no vision_config member");
    strcpy(vis, "\n}\n");
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "wb");
    assert_non_null(f);
    fputs(cfg, f);
    fclose(f);
    free(cfg);
    /* tensors: names and shapes as tiny-moe's language model, random values */
    const int D = TL_D, F = TL_F, H = 8, Hkv = 2, Dh = 16, G = 2, Di = 16, E = 8;
    const bool sparse[TL_L] = {false, true, true, true}, moe[TL_L] = {false, true, true, true};
    m3_st_writer *w = NULL;
    GPU_OK(m3_st_writer_create(&w));
    tl_tensor ts[200];
    int nt = 0;
    char name[200];
    const char *lm = "language_model.model.";
#define TL_ADD(dt_, sd_, mean_, rank_, d0_, d1_, ...)                                              \
    do {                                                                                          \
        snprintf(name, sizeof name, __VA_ARGS__);                                                 \
        const int64_t shp_[2] = {(d0_), (d1_)};                                                   \
        const int64_t n_ = (d0_) * ((rank_) > 1 ? (d1_) : 1);                                     \
        ts[nt] = (tl_tensor){n_, (dt_), (sd_), (mean_)};                                           \
        GPU_OK(m3_st_add(w, name, (dt_), (rank_), shp_,                                           \
                         (size_t)n_ * ((dt_) == M3_DT_BF16 ? 2 : 4)));                            \
        nt++;                                                                                     \
    } while (0)
    const float sdD = 1.0f / sqrtf((float)D), sdF = 1.0f / sqrtf((float)F);
    TL_ADD(M3_DT_BF16, 1.0f, 0.0f, 2, TL_V, D, "%sembed_tokens.weight", lm);
    TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, TL_V, D, "language_model.lm_head.weight");
    TL_ADD(M3_DT_BF16, 0.1f, 0.0f, 1, D, 0, "%snorm.weight", lm);
    for (int L = 0; L < TL_L; L++) {
        char pl[96];
        snprintf(pl, sizeof pl, "%slayers.%d.", lm, L);
        TL_ADD(M3_DT_BF16, 0.1f, 0.0f, 1, D, 0, "%sinput_layernorm.weight", pl);
        TL_ADD(M3_DT_BF16, 0.1f, 0.0f, 1, D, 0, "%spost_attention_layernorm.weight", pl);
        TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, H * Dh, D, "%sself_attn.q_proj.weight", pl);
        TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, Hkv * Dh, D, "%sself_attn.k_proj.weight", pl);
        TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, Hkv * Dh, D, "%sself_attn.v_proj.weight", pl);
        TL_ADD(M3_DT_BF16, 1.0f / sqrtf((float)(H * Dh)), 0.0f, 2, D, H * Dh,
               "%sself_attn.o_proj.weight", pl);
        TL_ADD(M3_DT_BF16, 0.1f, 0.0f, 1, Dh, 0, "%sself_attn.q_norm.weight", pl);
        TL_ADD(M3_DT_BF16, 0.1f, 0.0f, 1, Dh, 0, "%sself_attn.k_norm.weight", pl);
        if (sparse[L]) {
            TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, G * Di, D, "%sself_attn.index_q_proj.weight", pl);
            TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, Di, D, "%sself_attn.index_k_proj.weight", pl);
            TL_ADD(M3_DT_BF16, 0.1f, 0.0f, 1, Di, 0, "%sself_attn.index_q_norm.weight", pl);
            TL_ADD(M3_DT_BF16, 0.1f, 0.0f, 1, Di, 0, "%sself_attn.index_k_norm.weight", pl);
        }
        if (!moe[L]) {
            /* dense_intermediate_size 128 (tiny-moe's) */
            TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, 128, D, "%sblock_sparse_moe.gate_proj.weight", pl);
            TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, 128, D, "%sblock_sparse_moe.up_proj.weight", pl);
            TL_ADD(M3_DT_BF16, 1.0f / sqrtf(128.0f), 0.0f, 2, D, 128,
                   "%sblock_sparse_moe.down_proj.weight", pl);
            continue;
        }
        TL_ADD(M3_DT_F32, sdD, 0.0f, 2, E, D, "%sblock_sparse_moe.gate.weight", pl);
        TL_ADD(M3_DT_F32, 0.01f, 0.0f, 1, E, 0, "%sblock_sparse_moe.e_score_correction_bias", pl);
        for (int e = 0; e < E; e++) {
            TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, F, D, "%sblock_sparse_moe.experts.%d.w1.weight", pl, e);
            TL_ADD(M3_DT_BF16, sdF, 0.0f, 2, D, F, "%sblock_sparse_moe.experts.%d.w2.weight", pl, e);
            TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, F, D, "%sblock_sparse_moe.experts.%d.w3.weight", pl, e);
        }
        TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, F, D, "%sblock_sparse_moe.shared_experts.gate_proj.weight", pl);
        TL_ADD(M3_DT_BF16, sdD, 0.0f, 2, F, D, "%sblock_sparse_moe.shared_experts.up_proj.weight", pl);
        TL_ADD(M3_DT_BF16, sdF, 0.0f, 2, D, F, "%sblock_sparse_moe.shared_experts.down_proj.weight", pl);
    }
#undef TL_ADD
    static const char *const meta[1][2] = {{"format", "pt"}};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    GPU_OK(m3_st_write(w, path, meta, 1, tl_fill, ts));
    m3_st_writer_free(w);
    return root;
}

static void tiled_case(void **state, const char *profile, const char *spec, const char *tag) {
    m3_gpu *g = need_gpu(state);
    fix_root_override = tiled_checkpoint();
    m3_variant v;
    variant_from(&v, spec);
    const int n = 40, n_gen = 2;
    int32_t tok[64];
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 77);
    for (int i = 0; i < n; i++) tok[i] = 3 + (int32_t)(m3_rng_u32(&r) % (TL_V - 3));
    model m; /* the reference's greedy continuation, fed to both backends */
    model_open_v(&m, g, false, "tiled", profile, NULL, &v);
    int32_t next;
    GPU_OK(model_forward(&m, tok, n, NULL, NULL, &next));
    for (int i = 0; i < n_gen; i++) {
        tok[n + i] = next;
        GPU_OK(model_forward(&m, &tok[n + i], 1, NULL, NULL, &next));
    }
    model_close(&m);
    char a[512], b[512], c[512], cr[512], what[200];
    snprintf(a, sizeof a, "%s/tiled_%s_ref.h5", tmpdir, tag);
    snprintf(b, sizeof b, "%s/tiled_%s_gpu.h5", tmpdir, tag);
    snprintf(c, sizeof c, "%s/tiled_%s_gpu_forced.h5", tmpdir, tag);
    snprintf(cr, sizeof cr, "%s/tiled_%s_ref_forced.h5", tmpdir, tag);
    snprintf(what, sizeof what, "tiled D=%d F=%d %s %s (%d tokens + %d decode steps)", TL_D, TL_F,
             profile, spec, n, n_gen);
    run_to_dump(g, false, "tiled", profile, NULL, &v, tok, n, n + n_gen, NULL, false, a);
    run_to_dump(g, true, "tiled", profile, NULL, &v, tok, n, n + n_gen, NULL, false, b);
    expect_agree_mode(a, b, what, GATE_REPORT);
    snprintf(what, sizeof what, "tiled D=%d F=%d %s %s, teacher-forced (every pass), both sides",
             TL_D, TL_F, profile, spec);
    run_to_dump(g, true, "tiled", profile, NULL, &v, tok, n, n + n_gen, a, true, c);
    /* compared with ref forced the same way (forced_pair: needed under atom, the same as the
     * free ref run under hf) */
    run_to_dump(g, false, "tiled", profile, NULL, &v, tok, n, n + n_gen, a, true, cr);
    expect_agree(cr, c, what);
    fix_root_override = NULL;
}

static void tiled_mxfp8_hf(void **state) {
    /* MXFP8 weights, e4m3 activations before gate/up and down (every pass) */
    tiled_case(state, "hf", "experts=mxfp8", "mxfp8_hf");
}

static void tiled_mxfp4_hf(void **state) {
    /* MXFP4 weights and activations from 1 token on, the shared expert fused as slot E */
    tiled_case(state, "hf", "experts=mxfp4 moe_act_bound=1 shared_fused=on", "mxfp4_hf");
}

static void tiled_mxfp4_atom(void **state) {
    /* atom: shared expert fused (auto under MX experts), fp32 combine, activations on */
    tiled_case(state, "atom", "experts=mxfp4 moe_act_bound=1", "mxfp4_atom");
}

/* Bad arguments: one error line, status returned, caches untouched. */
static void model_errors(void **state) {
    m3_gpu *g = need_gpu(state);
    if (harness_ref) skip();
    model m;
    model_open(&m, g, true, "tiny-moe", "hf", NULL);
    int32_t tok[4] = {1, 2, 3, 4}, bad = 1 << 20, next;
    assert_int_equal(m3_gpu_model_forward(m.gm, &bad, NULL, 1, NULL, NULL, NULL, &next),
                     M3_ERR_ARG);
    printf("  bad token: %s\n", m3_last_error());
    int32_t pos[2] = {0, 5};
    assert_int_equal(m3_gpu_model_forward(m.gm, tok, pos, 2, NULL, NULL, NULL, &next), M3_ERR_ARG);
    printf("  bad positions: %s\n", m3_last_error());
    GPU_OK(m3_gpu_model_reserve(m.gm, 3));
    GPU_OK(m3_gpu_model_forward(m.gm, tok, NULL, 2, NULL, NULL, NULL, &next));
    assert_int_equal(m3_gpu_model_n_past(m.gm), 2);
    /* the reserve rounds up to 64 rows: fill them, then one more must be refused */
    int32_t *many = calloc(64, sizeof *many);
    assert_non_null(many);
    GPU_OK(m3_gpu_model_forward(m.gm, many, NULL, 62, NULL, NULL, NULL, &next));
    assert_int_equal(m3_gpu_model_n_past(m.gm), 64);
    assert_int_equal(m3_gpu_model_forward(m.gm, tok, NULL, 1, NULL, NULL, NULL, &next), M3_ERR_ARG);
    printf("  past the cache: %s\n", m3_last_error());
    assert_int_equal(m3_gpu_model_n_past(m.gm), 64);
    m3_gpu_model_reset(m.gm);
    GPU_OK(m3_gpu_model_forward(m.gm, tok, NULL, 4, NULL, NULL, NULL, &next));
    free(many);
    model_close(&m);
}

/* ---- the command line -------------------------------------------------------------------- */
static void expect_rc0(int rc, char *out, const char *what) {
    if (rc != 0) m3_test_failf("%s: exit %d: %s", what, rc, out);
    free(out);
}

static void cli_run_replay_compare(void **state) {
    need_gpu(state);
    const char *be = harness_ref ? "ref" : "gpu";
    for (int f = 0; f < N_FIX; f++) {
        const char *fx = fixtures[f];
        char model_dir[512], toks[512], from[512], a[512], b[512], ra[512], rb[512];
        fix_path(model_dir, sizeof model_dir, fx, "model");
        fix_path(toks, sizeof toks, fx, "tokens.txt");
        fix_path(from, sizeof from, fx, "hf_bf16.h5");
        snprintf(a, sizeof a, "%s/%s_cli_ref.h5", tmpdir, fx);
        snprintf(b, sizeof b, "%s/%s_cli_gpu.h5", tmpdir, fx);
        snprintf(ra, sizeof ra, "%s/%s_cli_replay_ref.h5", tmpdir, fx);
        snprintf(rb, sizeof rb, "%s/%s_cli_replay_gpu.h5", tmpdir, fx);
        /* free runs gated in full: the fp32 profile, and hf through the fp32-storage path
         * (the bf16-storage free run can flip a selection on a near-tie, see until_tie) */
        char *out;
        int rc;
        const char *profs[2] = {"fp32", "hf"};
        for (int k = 0; k < 2; k++) {
            if (k == 1) setenv("M3_GPU_STORAGE", "f32", 1);
            rc = m3_run_m3(&out, "run --model %s --tokens %s --profile %s --dump %s --force",
                       model_dir, toks, profs[k], a);
            expect_rc0(rc, out, "m3 run --backend ref");
            rc = m3_run_m3(&out, "run --backend %s --model %s --tokens %s --profile %s --dump %s --force",
                       be, model_dir, toks, profs[k], b);
            expect_rc0(rc, out, "m3 run --backend gpu");
            unsetenv("M3_GPU_STORAGE");
            rc = m3_run_m3(&out, "compare %s %s --quiet", a, b);
            printf("  %s: m3 compare ref gpu (run, %s%s): exit %d: %s", fx, profs[k],
                   k ? ", M3_GPU_STORAGE=f32" : "", rc, out);
            expect_rc0(rc, out, "m3 compare (run)");
        }
        rc = m3_run_m3(&out, "replay --model %s --from %s --profile hf --dump %s --force",
                         model_dir, from, ra);
        expect_rc0(rc, out, "m3 replay --backend ref");
        rc = m3_run_m3(&out, "replay --backend %s --model %s --from %s --profile hf --dump %s --force",
                         be, model_dir, from, rb);
        expect_rc0(rc, out, "m3 replay --backend gpu");
        rc = m3_run_m3(&out, "compare %s %s --quiet", ra, rb);
        printf("  %s: m3 compare ref gpu (replay): exit %d: %s", fx, rc, out);
        expect_rc0(rc, out, "m3 compare (replay)");
        /* the producer names the backend */
        m3_dump *d = NULL;
        char *prod = NULL;
        GPU_OK(m3_dump_open(&d, b, M3_DUMP_READ));
        GPU_OK(m3_dump_get_attr_str(d, "producer", &prod));
        m3_dump_close(d);
        char want[16];
        snprintf(want, sizeof want, "m3 %s ", be);
        if (strncmp(prod, want, strlen(want)) != 0)
            m3_test_failf("producer '%s' does not start with '%s'", prod, want);
        free(prod);
        /* decode from the command line */
        rc = m3_run_m3(&out, "run --backend %s --model %s --tokens %s --profile hf --generate 3",
                   be, model_dir, toks);
        printf("  %s: m3 run --generate 3: %s", fx, out);
        expect_rc0(rc, out, "m3 run --generate");
    }
}

/* `m3 run` and `m3 replay` under a variant with --backend ref and gpu, then `m3 compare`
 * (exit 0 under the built-in tolerances: fp32 class for the fp32 profile, lowp for hf). Free
 * runs under hf go through the fp32-storage path (the bf16-storage free run can flip a
 * near-tie selection, see until_tie); replays run the bf16 storage. */

static void cli_variants(void **state) {
    need_gpu(state);
    const char *be = harness_ref ? "ref" : "gpu";
    /* activation quantization under fp32 only (see variant_decode_hf); the fp8-cache replay
     * takes the transformers dump's selections (--ref-select) on both sides, since an fp8
     * index cache can turn a 1-ulp difference into a real selection flip */
    /* run_report: the free run's compare is printed, not gated: atom's fp8 paged attention
     * casts Q to fp8 without a scale and P' to fp8, so the last-bit GEMM differences of the
     * fp32-storage path become code steps (H200, 2026-11-29, tiny-moe --kv-cache fp8
     * --topk-reuse 2: layers/03/attn_out NMSE 1.58e-3, tiny-deep within tolerance); its replay
     * takes the transformers selections and is gated */
    static const struct {
        const char *tag, *profile, *flags, *from, *replay_flags;
        bool run_report;
    } vc[] = {
        {"mxfp8_fp32", "fp32", "--experts mxfp8 --experts-scale floor", "hf_fp32.h5", "", false},
        {"mxfp4_act_fused_fp32", "fp32", "--experts mxfp4 --moe-act-bound 1 --shared-fused on",
         "hf_fp32.h5", "", false},
        {"mxfp4_reuse_paged_hf", "hf", "--experts mxfp4 --topk-reuse 2 --cache-layout paged",
         "hf_bf16.h5", "", false},
        {"fp8_caches_ptpc_hf", "hf", "--kv-cache fp8 --index-cache fp8 --ptpc fp8", "hf_bf16.h5",
         "--ref-select", false},
        {"fp8kv_reuse_atom", "atom", "--kv-cache fp8 --topk-reuse 2", "hf_bf16.h5",
         "--ref-select", true},
    };
    for (int f = 0; f < N_FIX; f++)
        for (size_t i = 0; i < sizeof vc / sizeof vc[0]; i++) {
            const char *fx = fixtures[f];
            char model_dir[512], toks[512], from[512], a[512], b[512], ra[512], rb[512];
            fix_path(model_dir, sizeof model_dir, fx, "model");
            fix_path(toks, sizeof toks, fx, "tokens.txt");
            fix_path(from, sizeof from, fx, vc[i].from);
            snprintf(a, sizeof a, "%s/%s_cli_%s_ref.h5", tmpdir, fx, vc[i].tag);
            snprintf(b, sizeof b, "%s/%s_cli_%s_gpu.h5", tmpdir, fx, vc[i].tag);
            snprintf(ra, sizeof ra, "%s/%s_cli_%s_replay_ref.h5", tmpdir, fx, vc[i].tag);
            snprintf(rb, sizeof rb, "%s/%s_cli_%s_replay_gpu.h5", tmpdir, fx, vc[i].tag);
            const bool f32st = strcmp(vc[i].profile, "fp32") != 0;
            char *out;
            int rc = m3_run_m3(&out, "run --model %s --tokens %s --profile %s %s --dump %s --force",
                           model_dir, toks, vc[i].profile, vc[i].flags, a);
            expect_rc0(rc, out, "m3 run --backend ref (variant)");
            if (f32st) setenv("M3_GPU_STORAGE", "f32", 1);
            rc = m3_run_m3(&out, "run --backend %s --model %s --tokens %s --profile %s %s --dump %s "
                       "--force", be, model_dir, toks, vc[i].profile, vc[i].flags, b);
            unsetenv("M3_GPU_STORAGE");
            expect_rc0(rc, out, "m3 run --backend gpu (variant)");
            /* no --tol: the fp32 cases quantize activations, and m3 compare takes the fp32q
             * class from the dumps' variant attribute */
            rc = m3_run_m3(&out, "compare %s %s --quiet", a, b);
            printf("  %s %s (%s%s): m3 compare ref gpu (run%s): exit %d: %s", fx, vc[i].flags,
                   vc[i].profile, f32st ? ", M3_GPU_STORAGE=f32" : "",
                   vc[i].run_report ? ", reported" : "", rc, out);
            if (vc[i].run_report && rc == 1) rc = 0; /* beyond tolerance: reported above */
            expect_rc0(rc, out, "m3 compare (variant run)");
            rc = m3_run_m3(&out, "replay --model %s --from %s --profile %s %s %s --dump %s --force",
                       model_dir, from, vc[i].profile, vc[i].flags, vc[i].replay_flags, ra);
            expect_rc0(rc, out, "m3 replay --backend ref (variant)");
            rc = m3_run_m3(&out, "replay --backend %s --model %s --from %s --profile %s %s %s --dump "
                       "%s --force", be, model_dir, from, vc[i].profile, vc[i].flags,
                       vc[i].replay_flags, rb);
            expect_rc0(rc, out, "m3 replay --backend gpu (variant)");
            rc = m3_run_m3(&out, "compare %s %s --quiet", ra, rb);
            printf("  %s %s (%s%s%s): m3 compare ref gpu (replay): exit %d: %s", fx, vc[i].flags,
                   vc[i].profile, vc[i].replay_flags[0] ? ", " : "", vc[i].replay_flags, rc, out);
            expect_rc0(rc, out, "m3 compare (variant replay)");
        }
}

/* ---- the attention-input step without taps --------------------------------------------
 * gpu/layer.hip makes ONE m3_gpu_qk_norm_rope_cache launch per layer when no tap needs ref's
 * stage order (the indexer's projections run first), and two when taps are on (every dump
 * test above). Both must give the same bytes: the last-token logits of every pass of a run
 * without hooks equal those of the tapped run bit for bit, and so do the greedy tokens (hf
 * contiguous caches; atom with paged fp8 KV, the fp8 index cache and top-k reuse, bf16
 * storage: the fused kernel's paged path through ref's tiny geometry). */
static m3_status null_tap(void *ctx, const char *key, const m3_tensor *t, const char *dt) {
    (void)ctx, (void)key, (void)t, (void)dt;
    return M3_OK;
}

static void untapped_case(m3_gpu *g, const char *fx, const char *profile, const char *spec,
                          int n_gen) {
    m3_variant v;
    if (spec) variant_from(&v, spec);
    int n;
    int32_t *tok = prompt(fx, &n);
    model r;
    model_open_v(&r, g, false, fx, profile, NULL, spec ? &v : NULL);
    const int V = m3_model_config(r.ref)->vocab;
    model_close(&r);
    /* one model at a time (the models share the context's arena): the tapped run's logits
     * of every pass first, then the untapped run against them */
    float *la = malloc((size_t)V * (n_gen + 1) * sizeof *la), *lb = malloc((size_t)V * sizeof *lb);
    int32_t *na = malloc((size_t)(n_gen + 1) * sizeof *na);
    assert_non_null(la);
    assert_non_null(lb);
    assert_non_null(na);
    const m3_hooks hk = {.tap = null_tap};
    for (int run = 0; run < 2; run++) {
        model m;
        model_open_v(&m, g, true, fx, profile, NULL, spec ? &v : NULL);
        GPU_OK(m3_gpu_model_reserve(m.gm, n + n_gen));
        int32_t cur = -1, nb = -1;
        for (int pass = 0; pass <= n_gen; pass++) {
            const int32_t *t = pass == 0 ? tok : &cur;
            const int T = pass == 0 ? n : 1;
            if (run == 0) {
                GPU_OK(m3_gpu_model_forward(m.gm, t, NULL, T, &hk, "", la + (size_t)pass * V, &na[pass]));
                cur = na[pass];
                continue;
            }
            GPU_OK(m3_gpu_model_forward(m.gm, t, NULL, T, NULL, NULL, lb, &nb));
            size_t bad = 0;
            for (int i = 0; i < V; i++) bad += memcmp(&la[(size_t)pass * V + i], &lb[i], sizeof *lb) != 0;
            printf("  %s %s%s%s pass %d: %zu of %d logits differ (untapped vs tapped), next %d / %d\n",
                   fx, profile, spec ? " " : "", spec ? spec : "", pass, bad, V, nb, na[pass]);
            if (bad || nb != na[pass])
                m3_test_failf("%s %s %s pass %d: the untapped run differs from the tapped one", fx,
                              profile, spec ? spec : "", pass);
            cur = na[pass];
        }
        model_close(&m);
    }
    free(la), free(lb), free(na), free(tok);
}

/* ---- the paged index cache's bytes --------------------------------------------------------
 * Under cache_layout paged a sparse layer's index keys live in ATOM's paged index cache
 * (m3_gpu_layer_cache.ix: [n_blocks, Bs, Di] rows by slot through the block table, bf16 / fp32
 * / fp8 elements as ref/model.c chooses them). After a prefill and decode passes, every
 * position's row on the device must hold exactly the bytes ref's writer (m3_kv_index_write,
 * into ref's m3_kv_layer at ref's own slot of the position) makes of the same keys: the
 * device's own index_k stage (the keys the device wrote, normed + roped; the continuous math
 * is checked against ref by the whole-model cases). A second, untapped run (the single fused
 * launch writes the keys) must leave the same bytes. Reusing layers insert nothing: their
 * rows must stay zero. */
typedef struct {
    int n_layer, Di, cap, n0;
    float *keys;         /* [n_layer, cap, Di] */
    unsigned char *seen; /* [n_layer, cap] */
} ik_sink;

static m3_status ik_tap(void *ctx, const char *key, const m3_tensor *t, const char *dt) {
    (void)dt;
    ik_sink *k = ctx;
    const char *lp = strstr(key, "layers/");
    const size_t n = strlen(key);
    if (!lp || n < 8 || strcmp(key + n - 8, "/index_k") != 0) return M3_OK;
    const int L = atoi(lp + 7);
    assert_true(L >= 0 && L < k->n_layer && t->dtype == M3_DT_F32 && t->rank == 2);
    assert_int_equal(t->shape[1], k->Di);
    for (int64_t r = 0; r < t->shape[0]; r++) {
        const int j = k->n0 + (int)r;
        assert_true(j < k->cap);
        memcpy(k->keys + ((size_t)L * k->cap + j) * k->Di, (const float *)t->data + r * k->Di,
               (size_t)k->Di * sizeof(float));
        k->seen[(size_t)L * k->cap + j] = 1;
    }
    return M3_OK;
}

/* the device rows of positions 0..n-1 of every sparse layer against `want` (per layer:
 * [n, Di] elements of eb bytes; NULL rows: zero) */
static void ik_expect(m3_gpu *g, m3_gpu_model *gm, const m3_config *c, int n, unsigned char **want,
                      size_t eb, const char *what) {
    const int Bs = c->index_block, Di = c->index_head_dim, nl = (n + Bs - 1) / Bs;
    int32_t *bt = malloc((size_t)nl * sizeof *bt);
    unsigned char *row = malloc((size_t)Di * eb), *zero = calloc((size_t)Di, eb);
    size_t n_rows = 0;
    for (int L = 0; L < c->n_layer; L++) {
        if (!c->layer_sparse[L]) continue;
        const m3_gpu_layer_cache *lc = m3_gpu_model_layer_cache(gm, L);
        assert_non_null(lc);
        if (!lc->ix.k) m3_test_failf("%s layer %d: no paged index cache", what, L);
        assert_int_equal(lc->ix.block, Bs);
        assert_int_equal((int)m3_kv_elem_bytes(lc->ix.elem), (int)eb);
        GPU_OK(m3_gpu_download(g, bt, lc->ix.bt, (size_t)nl * sizeof *bt));
        for (int j = 0; j < n; j++) {
            const int64_t slot = (int64_t)bt[j / Bs] * Bs + j % Bs;
            GPU_OK(m3_gpu_download(g, row, (const unsigned char *)lc->ix.k + (size_t)slot * Di * eb,
                                   (size_t)Di * eb));
            const unsigned char *w = want[L] ? want[L] + (size_t)j * Di * eb : zero;
            if (memcmp(row, w, (size_t)Di * eb) != 0) {
                size_t i = 0;
                while (row[i] == w[i])
                    i++;
                m3_test_failf("%s layer %d position %d (slot %lld): byte %zu of the index row is "
                              "0x%02x on the device, 0x%02x from ref's writer",
                              what, L, j, (long long)slot, i, row[i], w[i]);
            }
            n_rows++;
        }
    }
    printf("  %-70s %zu index rows identical\n", what, n_rows);
    free(bt), free(row), free(zero);
}

static void index_cache_case(m3_gpu *g, const char *fx, const char *profile, bool f32_storage,
                             const char *spec, int n_gen) {
    m3_variant v;
    variant_from(&v, spec);
    m3_gpu_model_opts o;
    m3_gpu_model_opts_default(&o);
    o.f32_storage = f32_storage;
    int n;
    int32_t *tok = prompt(fx, &n);
    const int N = n + n_gen;
    tok = realloc(tok, (size_t)N * sizeof *tok);
    assert_non_null(tok);
    model m;
    model_open_v(&m, g, true, fx, profile, &o, &v);
    const m3_config *c = m3_gpu_model_config(m.gm);
    const int n_layer = c->n_layer;
    GPU_OK(m3_gpu_model_reserve(m.gm, N));
    ik_sink k = {c->n_layer, c->index_head_dim, N, 0, NULL, NULL};
    k.keys = calloc((size_t)c->n_layer * N * k.Di, sizeof(float));
    k.seen = calloc((size_t)c->n_layer * N, 1);
    assert_non_null(k.keys);
    assert_non_null(k.seen);
    const m3_hooks hk = {.tap = ik_tap, .tap_ctx = &k};
    int32_t next = -1;
    for (int pass = 0; pass <= n_gen; pass++) { /* prefill, then greedy decode passes */
        const int j0 = pass == 0 ? 0 : n + pass - 1, T = pass == 0 ? n : 1;
        if (pass > 0) tok[j0] = next;
        k.n0 = m3_gpu_model_n_past(m.gm);
        assert_int_equal(k.n0, j0);
        GPU_OK(m3_gpu_model_forward(m.gm, tok + j0, NULL, T, &hk, "", NULL, &next));
    }
    /* ref's writer over those keys, into ref's paged storage at ref's slots */
    m3_profile p;
    GPU_OK(m3_profile_by_name(&p, profile));
    const m3_kv_elem el = v.index_cache == M3_CACHE_FP8    ? M3_KV_FP8
                          : p.qk_round != M3_QK_ROUND_NONE ? M3_KV_BF16
                                                           : M3_KV_F32;
    const size_t eb = (size_t)m3_kv_elem_bytes(el);
    m3_kv_geom kg;
    m3_kv_geom_init(&kg, c->n_kv_head, c->head_dim, c->index_block, 0, M3_KV_BF16, v.fp8_kind);
    m3_block_table rbt;
    memset(&rbt, 0, sizeof rbt);
    GPU_OK(m3_block_table_reserve(&rbt, (N + c->index_block - 1) / c->index_block));
    unsigned char **want = calloc((size_t)c->n_layer, sizeof *want);
    int n_written = 0;
    for (int L = 0; L < c->n_layer; L++) {
        if (!c->layer_sparse[L]) continue;
        bool any = false;
        for (int j = 0; j < N; j++)
            any |= k.seen[(size_t)L * N + j] != 0;
        if (!any) continue; /* a reusing layer: rows stay zero */
        m3_kv_layer kl;
        m3_kv_layer_init(&kl, &kg, M3_KV_VIEW_PAGE, k.Di, el);
        GPU_OK(m3_kv_layer_reserve(&kl, rbt.n_pool));
        want[L] = malloc((size_t)N * k.Di * eb);
        for (int j = 0; j < N; j++) {
            if (!k.seen[(size_t)L * N + j])
                m3_test_failf("%s layer %d: no index_k row for position %d", fx, L, j);
            const int64_t slot = m3_block_table_slot(&rbt, c->index_block, j);
            m3_kv_index_write(&kl, slot, k.keys + ((size_t)L * N + j) * k.Di, v.fp8_overflow);
            memcpy(want[L] + (size_t)j * k.Di * eb, kl.index_k + (size_t)slot * k.Di * eb,
                   (size_t)k.Di * eb);
        }
        m3_kv_layer_free(&kl);
        n_written++;
    }
    if (n_written == 0) m3_test_failf("%s: no sparse layer wrote its index cache", fx);
    char what[200];
    snprintf(what, sizeof what, "%s %s%s %s (%d + %d passes), tapped", fx, profile,
             f32_storage ? " f32-storage" : "", spec, n, n_gen);
    ik_expect(g, m.gm, c, N, want, eb, what);
    model_close(&m); /* c is gone with it */
    /* the untapped run over the same tokens */
    model_open_v(&m, g, true, fx, profile, &o, &v);
    GPU_OK(m3_gpu_model_reserve(m.gm, N));
    for (int pass = 0; pass <= n_gen; pass++) {
        const int j0 = pass == 0 ? 0 : n + pass - 1, T = pass == 0 ? n : 1;
        GPU_OK(m3_gpu_model_forward(m.gm, tok + j0, NULL, T, NULL, NULL, NULL, &next));
    }
    snprintf(what, sizeof what, "%s %s%s %s (%d + %d passes), untapped", fx, profile,
             f32_storage ? " f32-storage" : "", spec, n, n_gen);
    ik_expect(g, m.gm, m3_gpu_model_config(m.gm), N, want, eb, what);
    model_close(&m);
    for (int L = 0; L < n_layer; L++)
        free(want[L]);
    free(want), free(k.keys), free(k.seen), free(tok);
    m3_block_table_free(&rbt);
}

static void variant_index_cache_bytes(void **state) {
    m3_gpu *g = need_gpu(state);
    if (harness_ref) skip();
    for (int f = 0; f < N_FIX; f++) {
        /* bf16 elements, the fused writer; reusing layers */
        index_cache_case(g, fixtures[f], "hf", false, "cache_layout=paged topk_reuse=2", 2);
        /* fp8 elements (e4m3fn), the fused writer, atom */
        index_cache_case(g, fixtures[f], "atom", false, "kv_cache=fp8 index_cache=fp8", 2);
        /* the separate-launch writer: fp32 storage with bf16 / fp8 (e4m3fnuz, nan overflow)
         * elements, and the fp32 profile's fp32 elements */
        index_cache_case(g, fixtures[f], "hf", true, "cache_layout=paged", 1);
        index_cache_case(g, fixtures[f], "atom", true,
                         "index_cache=fp8 fp8_kind=e4m3fnuz fp8_overflow=nan topk_reuse=2", 1);
        index_cache_case(g, fixtures[f], "fp32", false, "cache_layout=paged", 1);
    }
}

static void model_untapped_same(void **state) {
    m3_gpu *g = need_gpu(state);
    if (harness_ref) skip();
    for (int f = 0; f < N_FIX; f++) {
        untapped_case(g, fixtures[f], "hf", NULL, 2);
        untapped_case(g, fixtures[f], "atom", "cache_layout=paged kv_cache=fp8 index_cache=fp8 topk_reuse=2", 2);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(model_run_hf),
        cmocka_unit_test(model_run_hf_f32_storage),
        cmocka_unit_test(model_run_fp32),
        cmocka_unit_test(model_decode_hf),
        cmocka_unit_test(model_decode_fp32),
        cmocka_unit_test(model_replay_hf),
        cmocka_unit_test(model_replay_hf_ref_select),
        cmocka_unit_test(model_replay_fp32),
        cmocka_unit_test(model_run_hf_flash),
        cmocka_unit_test(model_run_hf_streamed),
        cmocka_unit_test(model_errors),
        cmocka_unit_test(cli_run_replay_compare),
        cmocka_unit_test(variant_codes_identical),
        cmocka_unit_test(variant_decode_hf),
        cmocka_unit_test(variant_decode_fp32),
        cmocka_unit_test(variant_mxfp8_fp32),
        cmocka_unit_test(variant_run_hf_f32_storage),
        cmocka_unit_test(variant_caches_hf),
        cmocka_unit_test(variant_caches_hf_f32_storage),
        cmocka_unit_test(variant_ptpc_hf),
        cmocka_unit_test(model_decode_atom),
        cmocka_unit_test(variant_paged_atom),
        cmocka_unit_test(variant_index_cache_bytes),
        cmocka_unit_test(variant_fp8kv_atom),
        cmocka_unit_test(variant_fp8caches_atom_f32_storage),
        cmocka_unit_test(variant_paged_flash_hf),
        cmocka_unit_test(variant_fp8kv_flash_atom),
        cmocka_unit_test(cli_variants),
        cmocka_unit_test(tiled_mxfp8_hf),
        cmocka_unit_test(tiled_mxfp4_hf),
        cmocka_unit_test(tiled_mxfp4_atom),
        cmocka_unit_test(model_untapped_same),
    };
    cmocka_set_test_filter(getenv("M3_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
