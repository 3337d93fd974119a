/* compare/run_opts.h: the options `m3 run` and `m3 replay` share (shared spec/cli.md), their
 * parsing and validation, and the dump sink both commands write through. Internal to the two
 * commands (compare/cmd_run.c, compare/cmd_replay.c); no other part includes it. */
#ifndef M3_RUN_OPTS_H
#define M3_RUN_OPTS_H

#include <stdio.h>

#include "ref/base.h"
#include "ref/config.h"
#include "ref/profile.h"
#include "ref/tap.h"
#include "ref/variant.h"

typedef struct m3_run_opts {
    const char *model;    /* --model DIR */
    const char *tokens;   /* --tokens FILE */
    const char *ids;      /* --ids "1 2 3" */
    const char *profile;  /* --profile fp32|hf|atom (default fp32) */
    const char *backend;  /* --backend ref|gpu (default ref) */
    const char *dump;     /* --dump OUT.h5 */
    const char *from;     /* replay: --from REF.h5 */
    const char *override; /* --override JSON */
    m3_variant variant; /* every `--<key> value` whose key m3_variant_set accepts */
    int generate;                                                /* --generate N */
    int threads;                                                 /* --threads N (0: default) */
    bool force;         /* --force: overwrite an existing dump */
    bool ref_select;    /* replay: --ref-select, teacher-force index_topk / expert_ids */
    char command[2048]; /* the command line, recorded in the dump */
} m3_run_opts;

/* Parse argv (argv[0] = subcommand). `replay` enables --from / --ref-select and forbids
 * --tokens / --ids / --generate. Prints usage and returns 0 with *help = true on --help.
 * Returns 0 on success, else 2 after printing one error line. */
int m3_run_opts_parse(m3_run_opts *o, int argc, char **argv, bool replay, bool *help);

/* The "variant" JSON attribute of the dump: every run option that changes numerics
 * (m3_variant_json of o->variant plus backend, teacher forcing and the profile switches).
 * Writes at most n bytes into buf. */
void m3_run_opts_variant(const m3_run_opts *o, const m3_profile *p, char *buf, size_t n);

/* Token ids from --tokens FILE or --ids STRING: *ids malloc'ed (caller frees), *n >= 1.
 * Every id must be an integer in [0, vocab). Errors name the file or the flag. */
m3_status m3_run_read_tokens(const m3_run_opts *o, int vocab, int32_t **ids, int *n);

/* The dump sink: an m3-dump/1 file written as OUT.tmp and renamed on commit. Opening fails
 * (M3_ERR_IO) when OUT exists and !force. m3_run_sink_abort removes OUT.tmp; both accept
 * a NULL sink. m3_run_sink_tap matches m3_tap_fn with ctx = the sink. */
typedef struct m3_run_sink m3_run_sink;
m3_status m3_run_sink_open(m3_run_sink **s, const m3_run_opts *o, const char *config_json,
                           const char *profile, const char *variant);
m3_status m3_run_sink_tap(void *ctx, const char *key, const m3_tensor *t, const char *dt);
m3_status m3_run_sink_commit(m3_run_sink *s); /* closes, renames; frees s */
void m3_run_sink_abort(m3_run_sink *s);       /* closes, removes the temp file; frees s */

/* The model behind --backend: ref's m3_model or the GPU's m3_gpu_model (device 0, options
 * from the environment: m3_gpu_model_opts_default), one interface for both commands.
 * Opening the gpu backend in a build without one fails with one line (M3_ERR_UNSUPPORTED). */
typedef struct m3_run_model m3_run_model;
m3_status m3_run_model_open(m3_run_model **rm, const m3_run_opts *o, const m3_profile *p);
const m3_config *m3_run_model_config(const m3_run_model *rm);
/* Size the caches for n_ctx tokens before the first pass (the GPU's caches cannot grow once
 * filled; a no-op for ref). */
m3_status m3_run_model_reserve(m3_run_model *rm, int n_ctx);
m3_status m3_run_model_forward(m3_run_model *rm, const int32_t *tokens, const int32_t *pos,
                               int n_tok, const m3_hooks *hooks, const char *prefix,
                               float *logits_last, int32_t *next);
void m3_run_model_close(m3_run_model *rm); /* NULL ok */

#endif
