/* compare/cmd_run.c: `m3 run` (shared spec/cli.md; users' doc docs/cli.md): prefill, optional
 * greedy decode, optional m3-dump/1 of every stage. The reference reports stages through
 * its tap callback (ref/tap.h); this file connects the tap to the dump writer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmd.h"
#include "compare/run_opts.h"
#include "gpu/m3_gpu.h"

int m3_cmd_run(int argc, char **argv) {
    m3_run_opts o;
    bool help;
    int rc = m3_run_opts_parse(&o, argc, argv, false, &help);
    if (rc || help) return rc;
    if (!strcmp(o.backend, "gpu") && !m3_gpu_compiled())
        return m3_cli_fail("run: this m3 was built without a GPU backend (use make gpu)");
    if (o.threads) m3_set_threads(o.threads);
    m3_profile prof;
    if (m3_profile_by_name(&prof, o.profile)) return m3_cli_fail(NULL);

    m3_run_model *m = NULL;
    m3_run_sink *sink = NULL;
    int32_t *ids = NULL, *gen = NULL;
    float *logits = NULL;
    int n_ids = 0;
    m3_status s = m3_run_model_open(&m, &o, &prof);
    if (!s) m3_config_emit_warnings(m3_run_model_config(m));
    if (!s) s = m3_run_read_tokens(&o, m3_run_model_config(m)->vocab, &ids, &n_ids);
    /* the whole run must fit the positions: fail now, not after n decode steps */
    if (!s && (int64_t)n_ids + o.generate > m3_run_model_config(m)->max_pos)
        s = m3_errorf(M3_ERR_ARG, "run: %d prompt tokens%s exceed max_position_embeddings %lld",
                      n_ids, o.generate ? " + --generate N" : "",
                      (long long)m3_run_model_config(m)->max_pos);
    if (!s) s = m3_run_model_reserve(m, n_ids + o.generate);
    if (!s && o.dump) {
        char variant[2048];
        m3_run_opts_variant(&o, &prof, variant, sizeof variant);
        s = m3_run_sink_open(&sink, &o, m3_run_model_config(m)->json_text, prof.name, variant);
    }
    int V = s ? 0 : m3_run_model_config(m)->vocab;
    if (!s && o.generate > 0) {
        gen = malloc((size_t)o.generate * sizeof *gen);
        if (!gen) s = m3_errorf(M3_ERR_NOMEM, "out of memory");
    }
    if (!s) {
        logits = malloc((size_t)V * sizeof *logits);
        if (!logits) s = m3_errorf(M3_ERR_NOMEM, "out of memory");
    }
    if (s) goto done;

    /* every dumped stage passes the finiteness guard on its way to the sink */
    m3_run_guard guard = {.next = sink ? m3_run_sink_tap : NULL,
                          .next_ctx = sink,
                          .allow = o.allow_nonfinite};
    m3_hooks hk = {0};
    if (sink) {
        hk.tap = m3_run_guard_tap;
        hk.tap_ctx = &guard;
    }
    /* single pass: stages at the root; prefill + decode: passes/PPPP/ (schema) */
    char prefix[32] = "";
    if (o.generate > 0) snprintf(prefix, sizeof prefix, "passes/%04d/", 0);
    int32_t next = 0;
    s = m3_run_guard_status(&guard,
                            m3_run_model_forward(m, ids, NULL, n_ids, &hk, prefix, logits, &next));
    if (!s) s = m3_run_guard_logits(&guard, prefix, logits, V);
    if (s) goto done;
    printf("prompt: %d tokens; next: %d\n", n_ids, next);
    for (int i = 0; i < o.generate; i++) {
        /* decode step i+1 feeds the greedy token of the previous pass */
        gen[i] = next;
        snprintf(prefix, sizeof prefix, "passes/%04d/", i + 1);
        s = m3_run_guard_status(&guard,
                                m3_run_model_forward(m, &gen[i], NULL, 1, &hk, prefix, logits, &next));
        if (!s) s = m3_run_guard_logits(&guard, prefix, logits, V);
        if (s) goto done;
    }
    if (o.generate > 0) {
        printf("generated:");
        for (int i = 0; i < o.generate; i++)
            printf(" %d", gen[i]);
        printf("\nnext: %d\n", next);
    }
    if (sink) {
        s = m3_run_sink_commit(sink);
        sink = NULL;
        if (!s) printf("dump: %s\n", o.dump);
    }
    if (!s) m3_run_guard_warn(&guard);
done:
    m3_run_sink_abort(sink);
    m3_run_model_close(m);
    free(ids);
    free(gen);
    free(logits);
    fflush(stdout);
    return s ? m3_cli_fail(NULL) : 0;
}
