/* compare/run_opts.h: the options `m3 run` and `m3 replay` share (shared spec/cli.md), their
 * parsing and validation, and the dump sink both commands write through. Internal to the
 * commands (compare/cmd_run.c, compare/cmd_replay.c, compare/cmd_attribute.c; `m3 eval`
 * opens its models through m3_run_model, compare/eval_gen.h). */
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
    bool allow_nonfinite; /* --allow-nonfinite: NaN / Inf in a stage or the logits is a
                             warning, not an error (the dump is written) */
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

/* The finiteness guard. A run whose activations turn NaN (NaN / Inf weights, overflow) must
 * not end in a plausible-looking success: by default it fails with one line naming the first
 * non-finite stage. m3_run_guard_tap wraps the dump sink's tap (next may be NULL) and checks
 * every float stage as it is produced: NaN anywhere, or +-Inf anywhere but index_scores
 * (whose forced blocks are +Inf by construction). Without a dump no stage is tapped (tapping
 * makes the reference materialise every logits row), so only the last position's logits are
 * checked, by m3_run_guard_logits. With allow (--allow-nonfinite) both only record the first
 * finding; m3_run_guard_warn prints it as one warning line. */
typedef struct m3_run_guard {
    m3_tap_fn next; /* the sink's tap, or NULL */
    void *next_ctx;
    bool allow;
    char first[192]; /* "NaN in stage KEY at flat index i of [shape]"; "" while all finite */
} m3_run_guard;
m3_status m3_run_guard_tap(void *ctx, const char *key, const m3_tensor *t, const char *dt);
/* logits: the last position's V logits of the pass under `prefix` ("" or "passes/PPPP/") */
m3_status m3_run_guard_logits(m3_run_guard *g, const char *prefix, const float *logits, int V);
/* s after a failed forward: the guard's own line again when the guard stopped it (the
 * forward adds context that would misplace the finding), else s unchanged */
m3_status m3_run_guard_status(const m3_run_guard *g, m3_status s);
void m3_run_guard_warn(const m3_run_guard *g);

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
int m3_run_model_n_past(const m3_run_model *rm); /* tokens in the caches */
void m3_run_model_reset(m3_run_model *rm);        /* empty the caches (next pass at 0) */
const char *m3_run_model_backend(const m3_run_model *rm); /* "ref" or "gpu" */
/* Apply another numerics variant to the open model (m3_model_set_variant or
 * m3_gpu_model_set_variant; the caches are emptied). A variant the backend refuses fails
 * with its one line and the model keeps its previous variant, so `m3 eval` can try every
 * variant of a run before it writes anything. */
m3_status m3_run_model_set_variant(m3_run_model *rm, const m3_variant *v);
/* One line for records: "cpu reference, N threads" or the device (m3_gpu_describe). */
const char *m3_run_model_device(const m3_run_model *rm);
void m3_run_model_close(m3_run_model *rm); /* NULL ok */

#endif
