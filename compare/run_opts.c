/* compare/run_opts.c: see run_opts.h. */
#include "compare/run_opts.h"
#include "ref/variant.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compare/cmd.h"

static const char run_usage[] =
    "usage: m3 run --model DIR (--tokens FILE | --ids \"1 2 3\") [--profile fp32|hf|atom]\n"
    "              [--backend ref|gpu] [--dump OUT.h5] [--generate N] [--threads N]\n"
    "              [--force] [--allow-nonfinite] [--override JSON]\n"
    "              [variant flags: --<key> VALUE]\n"
    "One forward pass over the tokens (prefill), then N greedy decode steps (--generate);\n"
    "prints the greedy next token of the prefill and the generated ids. --dump writes every\n"
    "stage (m3-dump/1; multi-pass runs under passes/PPPP/). Variant flags (ref/variant.h,\n"
    "docs/quantization.md): --experts bf16|mxfp4|mxfp8|stored, --experts-scale\n"
    "floor|even|rceil, --experts-round rne|rna, --moe-act-bound N, --shared-fused\n"
    "auto|on|off, --moe-stage2-act same|none, --ptpc off|fp8, --ptpc-zero-row nan|one, and\n"
    "the cache keys (--kv-cache, --index-cache, --topk-reuse, ...: docs/caches.md). A NaN or\n"
    "Inf in a dumped stage or in the last logits exits 2 naming it, unless --allow-nonfinite.\n"
    "See docs/cli.md.\n";

static const char replay_usage[] =
    "usage: m3 replay --model DIR --from REF.h5 --dump OUT.h5 [--profile fp32|hf|atom]\n"
    "                 [--backend ref|gpu] [--ref-select] [--threads N] [--force]\n"
    "                 [--allow-nonfinite] [--override JSON]\n"
    "                 [variant flags as for m3 run]\n"
    "Teacher-forced: every layer starts from REF's layers/NN/input (same tokens and\n"
    "positions), so each layer's error is its own. --ref-select also takes REF's index_topk\n"
    "and expert_ids. OUT has the same stages as a run. See docs/cli.md.\n";


int m3_run_opts_parse(m3_run_opts *o, int argc, char **argv, bool replay, bool *help) {
    memset(o, 0, sizeof *o);
    m3_variant_default(&o->variant);
    *help = false;
    o->profile = "fp32";
    o->backend = "ref";
    /* the command line, for the dump's `command` attribute */
    size_t len = (size_t)snprintf(o->command, sizeof o->command, "m3");
    for (int i = 0; i < argc && len < sizeof o->command; i++)
        len += (size_t)snprintf(o->command + len, sizeof o->command - len, " %s", argv[i]);

    const char *cmd = replay ? "replay" : "run";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(replay ? replay_usage : run_usage, stdout);
            *help = true;
            return 0;
        }
        if (!strcmp(a, "--force")) {
            o->force = true;
            continue;
        }
        if (!strcmp(a, "--allow-nonfinite")) {
            o->allow_nonfinite = true;
            continue;
        }
        if (replay && !strcmp(a, "--ref-select")) {
            o->ref_select = true;
            continue;
        }
        if (strncmp(a, "--", 2) != 0)
            return m3_cli_fail("%s: unexpected argument '%s' (see m3 %s --help)", cmd, a, cmd);
        /* --flag value or --flag=value */
        char name[64];
        const char *val = NULL;
        const char *eq = strchr(a, '=');
        if (eq) {
            size_t n = (size_t)(eq - a);
            if (n >= sizeof name) return m3_cli_fail("%s: unknown option '%s'", cmd, a);
            memcpy(name, a, n);
            name[n] = 0;
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
            if (i + 1 >= argc) return m3_cli_fail("%s: option %s needs a value", cmd, a);
            val = argv[++i];
        }
        long v;
        if (!strcmp(name, "--model"))
            o->model = val;
        else if (!replay && !strcmp(name, "--tokens"))
            o->tokens = val;
        else if (!replay && !strcmp(name, "--ids"))
            o->ids = val;
        else if (replay && !strcmp(name, "--from"))
            o->from = val;
        else if (!strcmp(name, "--profile"))
            o->profile = val;
        else if (!strcmp(name, "--backend"))
            o->backend = val;
        else if (!strcmp(name, "--dump"))
            o->dump = val;
        else if (!strcmp(name, "--override"))
            o->override = val;
        else if (!replay && !strcmp(name, "--generate")) {
            if (!m3_cli_int(val, 0, 1 << 20, &v))
                return m3_cli_fail("%s: --generate wants an integer >= 0, got '%s'", cmd, val);
            o->generate = (int)v;
        } else if (!strcmp(name, "--threads")) {
            if (!m3_cli_int(val, 1, 256, &v))
                return m3_cli_fail("%s: --threads wants an integer in 1..256, got '%s'", cmd, val);
            o->threads = (int)v;
        } else {
            /* anything else: a numerics variant key (ref/variant.h), '-' == '_' */
            m3_status vs = m3_variant_set(&o->variant, name + 2, val);
            if (vs == M3_ERR_ARG && strstr(m3_last_error(), "unknown variant option"))
                return m3_cli_fail("%s: unknown option '%s' (see m3 %s --help)", cmd, name, cmd);
            if (vs) return m3_cli_fail("%s: %s", cmd, m3_last_error());
        }
    }

    if (!o->model) return m3_cli_fail("%s: --model DIR is required", cmd);
    if (replay) {
        if (!o->from) return m3_cli_fail("replay: --from REF.h5 is required");
        if (!o->dump) return m3_cli_fail("replay: --dump OUT.h5 is required");
    } else {
        if (!o->tokens == !o->ids)
            return m3_cli_fail("run: give exactly one of --tokens FILE and --ids \"1 2 3\"");
    }
    if (strcmp(o->profile, "fp32") && strcmp(o->profile, "hf") && strcmp(o->profile, "atom"))
        return m3_cli_fail("%s: --profile must be fp32, hf or atom, got '%s'", cmd, o->profile);
    if (strcmp(o->backend, "ref") && strcmp(o->backend, "gpu"))
        return m3_cli_fail("%s: --backend must be ref or gpu, got '%s'", cmd, o->backend);

    if (m3_variant_check(&o->variant)) return m3_cli_fail("%s: %s", cmd, m3_last_error());
    return 0;
}

void m3_run_opts_variant(const m3_run_opts *o, const m3_profile *p, char *buf, size_t n) {
    char sw[1024], va[2048];
    m3_profile_json(p, sw, sizeof sw);
    m3_variant_json(&o->variant, va, sizeof va);
    /* va is "{...}": splice its members in front of the run's own */
    size_t k = strlen(va);
    if (k >= 2) va[k - 1] = 0;
    snprintf(buf, n, "%s%s\"backend\":\"%s\",\"teacher_forced\":%s,\"ref_select\":%s,"
                     "\"profile_switches\":%s}",
             va, k > 2 ? "," : "", o->backend, o->from ? "true" : "false",
             o->ref_select ? "true" : "false", sw);
}

/* Parse whitespace-separated integers from `text`; `what` names the source in errors. */
static m3_status parse_ids(const char *text, const char *what, int vocab, int32_t **ids, int *n) {
    size_t cap = 64;
    int cnt = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", what);
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',')
            p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || (*end && !strchr(" \t\r\n,", *end))) {
            free(v);
            return m3_errorf(M3_ERR_FORMAT, "%s: token %d is not an integer", what, cnt);
        }
        if (x < 0 || x >= vocab) {
            free(v);
            return m3_errorf(M3_ERR_ARG,
                             "%s: token id %lld at position %d is outside the vocabulary [0, %d)",
                             what, x, cnt, vocab);
        }
        if ((size_t)cnt == cap) {
            int32_t *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) {
                free(v);
                return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", what);
            }
            v = nv;
            cap *= 2;
        }
        v[cnt++] = (int32_t)x;
        p = end;
    }
    if (cnt == 0) {
        free(v);
        return m3_errorf(M3_ERR_FORMAT, "%s: no token ids", what);
    }
    *ids = v;
    *n = cnt;
    return M3_OK;
}

m3_status m3_run_read_tokens(const m3_run_opts *o, int vocab, int32_t **ids, int *n) {
    if (o->ids) return parse_ids(o->ids, "--ids", vocab, ids, n);
    FILE *f = fopen(o->tokens, "rb");
    if (!f) return m3_errorf(M3_ERR_IO, "%s: cannot open: %s", o->tokens, strerror(errno));
    size_t cap = 1 << 16, len = 0, k;
    char *buf = malloc(cap);
    while (buf && (k = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += k;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", o->tokens);
    if (err) {
        free(buf);
        return m3_errorf(M3_ERR_IO, "%s: read error", o->tokens);
    }
    buf[len] = 0;
    m3_status s = parse_ids(buf, o->tokens, vocab, ids, n);
    free(buf);
    return s;
}

/* ---- dump sink ---------------------------------------------------------------------- */

#include "compare/dump.h"

struct m3_run_sink {
    m3_dump *d;
};

m3_status m3_run_sink_open(m3_run_sink **out, const m3_run_opts *o, const char *config_json,
                           const char *profile, const char *variant) {
    *out = NULL;
    m3_run_sink *s = calloc(1, sizeof *s);
    if (!s) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", o->dump);
    m3_status st = m3_dump_open(&s->d, o->dump, M3_DUMP_CREATE | (o->force ? M3_DUMP_FORCE : 0));
    if (st) {
        free(s);
        return st;
    }
    char producer[160];
    snprintf(producer, sizeof producer, "m3 %s %s", o->backend, m3_version_string());
    if ((st = m3_dump_set_attr_str(s->d, "producer", producer)) ||
        (st = m3_dump_set_attr_str(s->d, "profile", profile)) ||
        (st = m3_dump_set_attr_str(s->d, "model_config", config_json)) ||
        (st = m3_dump_set_attr_str(s->d, "variant", variant)) ||
        (st = m3_dump_set_attr_str(s->d, "command", o->command))) {
        m3_run_sink_abort(s);
        return st;
    }
    *out = s;
    return M3_OK;
}

m3_status m3_run_sink_tap(void *ctx, const char *key, const m3_tensor *t, const char *dt) {
    m3_run_sink *s = ctx;
    return m3_dump_write(s->d, key, t, dt);
}

m3_status m3_run_sink_commit(m3_run_sink *s) {
    m3_status st = m3_dump_commit(s->d);
    m3_dump_close(s->d); /* after a failed commit this deletes the tmp file */
    free(s);
    return st;
}

void m3_run_sink_abort(m3_run_sink *s) {
    if (!s) return;
    m3_dump_close(s->d);
    free(s);
}

/* ---- finiteness guard -------------------------------------------------------------- */

#include <math.h>

static bool note_nonfinite(m3_run_guard *g, const char *key, const float *x, int rank,
                           const int64_t *shape) {
    int64_t n = m3_shape_numel(shape, rank);
    bool inf_ok = strstr(key, "index_scores") != NULL;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]) || (!inf_ok && isinf(x[i]))) {
            if (g->first[0]) return true; /* keep the first */
            char sh[64] = "";
            size_t k = 0;
            for (int r = 0; r < rank && k < sizeof sh; r++)
                k += (size_t)snprintf(sh + k, sizeof sh - k, "%s%lld", r ? ", " : "",
                                      (long long)shape[r]);
            snprintf(g->first, sizeof g->first, "%s in stage %s at flat index %lld of [%s]",
                     isnan(x[i]) ? "NaN" : x[i] > 0 ? "+Inf" : "-Inf", key, (long long)i, sh);
            return true;
        }
    }
    return false;
}

static m3_status guard_fail(const m3_run_guard *g) {
    return m3_errorf(M3_ERR_NUMERIC, "non-finite activations: the first is %s (%s--allow-nonfinite "
                     "runs on)", g->first, g->next ? "" : "--dump finds the first such stage; ");
}

m3_status m3_run_guard_tap(void *ctx, const char *key, const m3_tensor *t, const char *dt) {
    m3_run_guard *g = ctx;
    if (t->dtype == M3_DT_F32 && note_nonfinite(g, key, t->data, t->rank, t->shape) && !g->allow)
        return guard_fail(g);
    return g->next ? g->next(g->next_ctx, key, t, dt) : M3_OK;
}

m3_status m3_run_guard_logits(m3_run_guard *g, const char *prefix, const float *logits, int V) {
    char key[64];
    snprintf(key, sizeof key, "%slogits (last position)", prefix);
    int64_t shape[1] = {V};
    if (note_nonfinite(g, key, logits, 1, shape) && !g->allow) return guard_fail(g);
    return M3_OK;
}

m3_status m3_run_guard_status(const m3_run_guard *g, m3_status s) {
    /* the forward prefixes context ("stage X: ", the REF file) that would misplace it */
    return s == M3_ERR_NUMERIC && g->first[0] && !g->allow ? guard_fail(g) : s;
}

void m3_run_guard_warn(const m3_run_guard *g) {
    if (g->first[0]) m3_warn("non-finite activations: the first is %s", g->first);
}

/* ---- the model behind --backend ------------------------------------------------------ */

#include "gpu/m3_gpu.h"
#include "ref/model.h"

struct m3_run_model {
    m3_model *ref;
    m3_gpu *g;
    m3_gpu_model *gm;
    char device[64]; /* m3_run_model_device of the ref backend (set at open) */
};

m3_status m3_run_model_open(m3_run_model **out, const m3_run_opts *o, const m3_profile *p) {
    *out = NULL;
    /* a file here would be read as config.json or an index and fail with a puzzling message */
    struct stat st;
    if (stat(o->model, &st) == 0 && !S_ISDIR(st.st_mode))
        return m3_errorf(M3_ERR_ARG, "--model %s: not a directory (give the checkpoint directory "
                         "holding config.json and the safetensors)", o->model);
    m3_run_model *rm = calloc(1, sizeof *rm);
    if (!rm) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    m3_status s;
    if (!strcmp(o->backend, "gpu")) {
        m3_gpu_model_opts go;
        m3_gpu_model_opts_default(&go);
        s = m3_gpu_open(&rm->g, 0);
        if (!s) s = m3_gpu_model_open(&rm->gm, rm->g, o->model, o->override, p, &go);
        if (!s) s = m3_gpu_model_set_variant(rm->gm, &o->variant);
    } else {
        s = m3_model_open(&rm->ref, o->model, o->override, p);
        if (!s) s = m3_model_set_variant(rm->ref, &o->variant);
        snprintf(rm->device, sizeof rm->device, "cpu reference, %d thread%s", m3_threads(),
                 m3_threads() == 1 ? "" : "s");
    }
    if (s) {
        m3_run_model_close(rm);
        return s;
    }
    *out = rm;
    return M3_OK;
}

const m3_config *m3_run_model_config(const m3_run_model *rm) {
    return rm->gm ? m3_gpu_model_config(rm->gm) : m3_model_config(rm->ref);
}

m3_status m3_run_model_reserve(m3_run_model *rm, int n_ctx) {
    return rm->gm ? m3_gpu_model_reserve(rm->gm, n_ctx) : M3_OK;
}

m3_status m3_run_model_forward(m3_run_model *rm, const int32_t *tokens, const int32_t *pos,
                               int n_tok, const m3_hooks *hooks, const char *prefix,
                               float *logits_last, int32_t *next) {
    if (rm->gm)
        return m3_gpu_model_forward(rm->gm, tokens, pos, n_tok, hooks, prefix, logits_last, next);
    return m3_model_forward(rm->ref, tokens, pos, n_tok, hooks, prefix, logits_last, next);
}

int m3_run_model_n_past(const m3_run_model *rm) {
    return rm->gm ? m3_gpu_model_n_past(rm->gm) : m3_model_n_past(rm->ref);
}

void m3_run_model_reset(m3_run_model *rm) {
    if (rm->gm) m3_gpu_model_reset(rm->gm);
    else m3_model_reset(rm->ref);
}

const char *m3_run_model_backend(const m3_run_model *rm) { return rm->gm ? "gpu" : "ref"; }

m3_status m3_run_model_set_variant(m3_run_model *rm, const m3_variant *v) {
    return rm->gm ? m3_gpu_model_set_variant(rm->gm, v) : m3_model_set_variant(rm->ref, v);
}

const char *m3_run_model_device(const m3_run_model *rm) {
    return rm->g ? m3_gpu_describe(rm->g) : rm->device;
}

void m3_run_model_close(m3_run_model *rm) {
    if (!rm) return;
    m3_gpu_model_close(rm->gm);
    m3_gpu_close(rm->g);
    m3_model_close(rm->ref);
    free(rm);
}
