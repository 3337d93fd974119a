/* compare/cmd_replay.c: `m3 replay` (shared spec/cli.md; users' doc docs/cli.md): the
 * teacher-forced forward. Every layer starts from REF's layers/NN/input (and, with
 * --ref-select, takes REF's index_topk / expert_ids), over REF's tokens and positions, pass
 * by pass for multi-pass dumps, so each layer's error is its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmd.h"
#include "compare/dump.h"
#include "compare/run_opts.h"
#include "gpu/m3_gpu.h"

/* m3_fetch_fn over the reference dump */
static m3_status fetch_ref(void *ctx, const char *key, m3_tensor *out) {
    m3_dump *d = ctx;
    if (!m3_dump_has(d, key))
        return m3_errorf(M3_ERR_MISSING, "%s: no stage '%s' to teacher-force from", m3_dump_path(d),
                         key);
    return m3_dump_read(d, key, out);
}

/* Read REF's [T] int32 stage `key` (tokens / positions) */
static m3_status read_ids(m3_dump *d, const char *key, int32_t **v, int *n) {
    m3_tensor t = {0};
    M3_TRY(fetch_ref(d, key, &t));
    if (t.dtype != M3_DT_I32 || t.rank != 1 || t.shape[0] < 1 || t.shape[0] > (1 << 30)) {
        m3_tensor_free(&t);
        return m3_errorf(M3_ERR_FORMAT, "%s: stage '%s' is not a non-empty int32 vector",
                         m3_dump_path(d), key);
    }
    *v = t.data;
    *n = (int)t.shape[0];
    return M3_OK;
}

int m3_cmd_replay(int argc, char **argv) {
    m3_run_opts o;
    bool help;
    int rc = m3_run_opts_parse(&o, argc, argv, true, &help);
    if (rc || help) return rc;
    if (!strcmp(o.backend, "gpu") && !m3_gpu_compiled())
        return m3_cli_fail("replay: this m3 was built without a GPU backend (use make gpu)");
    if (o.threads) m3_set_threads(o.threads);
    m3_profile prof;
    if (m3_profile_by_name(&prof, o.profile)) return m3_cli_fail(NULL);

    m3_dump *ref = NULL;
    m3_run_model *m = NULL;
    m3_run_sink *sink = NULL;
    int32_t *tok = NULL, *pos = NULL;
    m3_status s = m3_dump_open(&ref, o.from, M3_DUMP_READ);
    if (!s) s = m3_run_model_open(&m, &o, &prof);
    if (!s) m3_config_emit_warnings(m3_run_model_config(m));
    /* passes: passes/0000, passes/0001, ... or the root alone */
    int n_pass = 0;
    bool multi = !s && m3_dump_has(ref, "passes/0000/tokens");
    if (!s) {
        char key[64];
        if (multi) do
                snprintf(key, sizeof key, "passes/%04d/tokens", ++n_pass);
            while (m3_dump_has(ref, key));
        else if (m3_dump_has(ref, "tokens"))
            n_pass = 1;
        else
            s = m3_errorf(M3_ERR_MISSING,
                          "%s: no 'tokens' stage (neither at the root nor under "
                          "passes/0000/)",
                          o.from);
    }
    /* every pass extends the caches: size them for the whole replay first */
    int n_total = 0;
    for (int p = 0; !s && p < n_pass; p++) {
        char key[64];
        int nt;
        if (multi)
            snprintf(key, sizeof key, "passes/%04d/tokens", p);
        else
            snprintf(key, sizeof key, "tokens");
        s = read_ids(ref, key, &tok, &nt);
        free(tok);
        tok = NULL;
        n_total += s ? 0 : nt;
    }
    if (!s) s = m3_run_model_reserve(m, n_total);
    if (!s) {
        char variant[2048];
        m3_run_opts_variant(&o, &prof, variant, sizeof variant);
        s = m3_run_sink_open(&sink, &o, m3_run_model_config(m)->json_text, prof.name, variant);
    }
    /* every stage passes the finiteness guard on its way to the sink */
    m3_run_guard guard = {.next = m3_run_sink_tap, .next_ctx = sink, .allow = o.allow_nonfinite};
    m3_hooks hk = {.tap = m3_run_guard_tap,
                   .tap_ctx = &guard,
                   .fetch = fetch_ref,
                   .fetch_ctx = ref,
                   .force_input = true,
                   .force_selection = o.ref_select};
    for (int p = 0; !s && p < n_pass; p++) {
        char prefix[32] = "", key[64];
        if (multi) snprintf(prefix, sizeof prefix, "passes/%04d/", p);
        int nt, np;
        snprintf(key, sizeof key, "%stokens", prefix);
        s = read_ids(ref, key, &tok, &nt);
        if (!s) {
            snprintf(key, sizeof key, "%spositions", prefix);
            s = read_ids(ref, key, &pos, &np);
        }
        if (!s && np != nt)
            s = m3_errorf(M3_ERR_FORMAT, "%s: %spositions has %d entries for %d tokens", o.from,
                          prefix, np, nt);
        int32_t next = 0;
        if (!s) s = m3_run_model_forward(m, tok, pos, nt, &hk, prefix, NULL, &next);
        if (s == M3_ERR_NUMERIC && guard.first[0])
            s = m3_run_guard_status(&guard, s); /* ours, not REF's */
        else if (s)
            m3_error_context(s, "%s: replaying %s", o.from, multi ? prefix : "the pass");
        else
            printf("pass %d: %d tokens, next %d\n", p, nt, next);
        free(tok);
        free(pos);
        tok = pos = NULL;
    }
    if (!s) {
        s = m3_run_sink_commit(sink);
        sink = NULL;
        if (!s) printf("dump: %s\n", o.dump);
    }
    if (!s) m3_run_guard_warn(&guard);
    m3_run_sink_abort(sink);
    m3_run_model_close(m);
    m3_dump_close(ref);
    fflush(stdout);
    return s ? m3_cli_fail(NULL) : 0;
}
