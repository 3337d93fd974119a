/* compare/cmd_eval.c: `m3 eval gsm8k` (contract: shared spec/cli.md; method: compare/gsm8k.h,
 * compare/eval_gen.h, docs/eval.md).
 *
 *   m3 eval gsm8k --responses FILE.jsonl [--responses FILE2.jsonl ...] [--json OUT.json]
 *                 [--samples OUT.jsonl] [--min-accuracy X]
 *       Scores responses produced elsewhere ({"answer", "response"} per line) with lm-eval's
 *       filters. Several files (same questions, same order) are compared against the first:
 *       exact McNemar per filter and the count of changed extracted answers.
 *   m3 eval gsm8k --model DIR --data test.jsonl [--num-fewshot 5] [--limit N]
 *                 [--variants fp32,hf,...] [--backend ref|gpu] [--samples OUT.jsonl]
 *                 [--json OUT.json] [--max-gen-toks 256] [--fewshot train.jsonl]
 *                 [--threads N] [--min-accuracy X]
 *       Greedy generation for every variant through --backend (ref: the CPU reference
 *       model; gpu: the device model, compare/run_opts.h), then the same scoring and pairing,
 *       plus the first token position where two variants' generations diverge, and per
 *       variant the prefill / decode tokens per second and wall time. Every variant is
 *       applied to the backend before anything is written: one it refuses is exit 2. The samples file is appended per item (header line = the settings); a rerun
 *       with the same --samples skips the items it already holds.
 *   m3 eval gsm8k --data test.jsonl [--fewshot F] [--num-fewshot K] [--limit N]
 *                 --write-prompts OUT.jsonl
 *       Writes the lm-eval prompts with their shot indices (no model needed).
 *
 * Exit: 0 ok; 1 when --min-accuracy is given and a strict-match accuracy is below it;
 * 2 bad arguments or input (one line on stderr). --json and --write-prompts are written to a
 * temporary name and renamed; the generation samples file is appended line by line (whole
 * lines only: a cut last line is dropped on resume). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "compare/cmd.h"
#include "compare/eval_gen.h"
#include "compare/gsm8k.h"
#include "compare/tokenizer.h"
#include "gpu/m3_gpu.h"
#include "ref/json.h"
#include "ref/model.h"

#define MAX_FILES 16
#define SAMPLES_FORMAT "m3-eval-samples/1"

static const char *const usage_text =
    "usage: m3 eval gsm8k --responses FILE.jsonl [--responses FILE2.jsonl ...]\n"
    "                     [--json OUT.json] [--samples OUT.jsonl] [--min-accuracy X]\n"
    "       m3 eval gsm8k --model DIR --data test.jsonl [--num-fewshot 5] [--limit N]\n"
    "                     [--variants fp32,hf,...] [--backend ref|gpu] [--samples OUT.jsonl]\n"
    "                     [--json OUT.json] [--max-gen-toks 256] [--fewshot train.jsonl]\n"
    "                     [--threads N] [--min-accuracy X]\n"
    "       m3 eval gsm8k --data test.jsonl [--fewshot F] [--num-fewshot K] [--limit N]\n"
    "                     --write-prompts OUT.jsonl\n"
    "--responses: JSONL with \"answer\" (reference answer text) and \"response\" (generated\n"
    "text after its stop sequences) per line, scored with lm-eval's gsm8k filters\n"
    "(strict-match, flexible-extract) and exact_match. Several files are compared with the\n"
    "first (exact McNemar test on paired outcomes, changed answers).\n"
    "--model: greedy generation with DIR's tokenizer.json through --backend (ref: the CPU\n"
    "reference, default; gpu: the device model of a `make gpu` build), stop at \"Question:\"\n"
    "/ EOS / --max-gen-toks. Variants: fp32, hf, atom and '+'-joined modifiers mxfp8,\n"
    "mxfp4, kv-fp8, index-fp8, topk-reuseN (default base atom); a variant the backend does\n"
    "not run is refused before anything is written. Prints per variant the prefill and\n"
    "decode tokens per second and the wall time. --samples is appended per item and resumed\n"
    "when rerun with the same settings (backend included).\n";

/* ---- output helpers ----------------------------------------------------------------- */

/* JSON string literal. Bytes >= 0x80 pass through (the inputs are UTF-8 already). */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p == '\r') fputs("\\r", f);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.17g", x);
    else fputs("null", f);
}

/* Open "path.tmp.PID" for an atomic write; out_commit renames it (or removes it on error). */
typedef struct {
    FILE *f;
    char tmp[4096];
    const char *path;
} out_file;

/* An output path that can never be written (empty, a directory, in a missing directory):
 * found before the evaluation runs, not when its result is written hours later. */
static m3_status out_check(const char *path) {
    if (!path) return M3_OK;
    if (!path[0]) return m3_errorf(M3_ERR_ARG, "empty output file name");
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return m3_errorf(M3_ERR_IO, "%s: is a directory", path);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        slash[slash == dir ? 1 : 0] = 0;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            return m3_errorf(M3_ERR_IO, "%s: cannot create: %s is not a directory", path, dir);
    }
    return M3_OK;
}

static m3_status out_open(out_file *o, const char *path) {
    o->path = path;
    if (snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof o->tmp)
        return m3_errorf(M3_ERR_ARG, "%s: path too long", path);
    o->f = fopen(o->tmp, "wb");
    if (!o->f) return m3_errorf(M3_ERR_IO, "%s: cannot create: %s", o->tmp, strerror(errno));
    return M3_OK;
}

static m3_status out_commit(out_file *o, bool ok) {
    if (!o->f) return M3_OK;
    bool bad = ferror(o->f) != 0;
    bad |= fclose(o->f) != 0;
    o->f = NULL;
    if (!ok || bad) {
        remove(o->tmp);
        return ok ? m3_errorf(M3_ERR_IO, "%s: write failed", o->path) : M3_OK;
    }
    if (rename(o->tmp, o->path) != 0) {
        m3_status s = m3_errorf(M3_ERR_IO, "%s: cannot rename into place: %s", o->path,
                                strerror(errno));
        remove(o->tmp);
        return s;
    }
    return M3_OK;
}

/* ---- scoring ------------------------------------------------------------------------ */

/* One variant's (or responses file's) items scored with both filters. ans/resp point into
 * storage owned elsewhere (the rows of a --responses file, or the generation records). */
typedef struct {
    const char *name;
    int64_t n;
    const char **ans, **resp;              /* owned arrays of borrowed strings */
    char **pred[M3_GSM8K_N_FILTER];        /* extracted answer per item (owned) */
    char **norm[M3_GSM8K_N_FILTER];        /* its exact_match normalisation (owned) */
    uint8_t *correct[M3_GSM8K_N_FILTER];   /* per item */
    int64_t n_correct[M3_GSM8K_N_FILTER], n_invalid[M3_GSM8K_N_FILTER];
    double acc[M3_GSM8K_N_FILTER], se[M3_GSM8K_N_FILTER];
} scored;

static void scored_free(scored *s) {
    for (int f = 0; f < M3_GSM8K_N_FILTER; f++) {
        for (int64_t i = 0; s->pred[f] && i < s->n; i++) free(s->pred[f][i]);
        for (int64_t i = 0; s->norm[f] && i < s->n; i++) free(s->norm[f][i]);
        free(s->pred[f]);
        free(s->norm[f]);
        free(s->correct[f]);
    }
    free(s->ans);
    free(s->resp);
    memset(s, 0, sizeof *s);
}

/* Allocate the borrowed-string arrays for n items. */
static m3_status scored_init(scored *s, const char *name, int64_t n) {
    memset(s, 0, sizeof *s);
    s->name = name;
    s->n = n;
    s->ans = calloc(n ? (size_t)n : 1, sizeof *s->ans);
    s->resp = calloc(n ? (size_t)n : 1, sizeof *s->resp);
    if (!s->ans || !s->resp) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", name);
    return M3_OK;
}

/* Score s->ans / s->resp (filled by the caller). */
static m3_status score_items(scored *s) {
    int64_t n = s->n;
    for (int f = 0; f < M3_GSM8K_N_FILTER; f++) {
        s->pred[f] = calloc(n ? (size_t)n : 1, sizeof(char *));
        s->norm[f] = calloc(n ? (size_t)n : 1, sizeof(char *));
        s->correct[f] = calloc(n ? (size_t)n : 1, 1);
        if (!s->pred[f] || !s->norm[f] || !s->correct[f])
            return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", s->name);
        for (int64_t i = 0; i < n; i++) {
            const char *ans = s->ans[i], *resp = s->resp[i];
            size_t len = strlen(resp);
            char *p = malloc(m3_gsm8k_extract_bytes(len));
            char *np = malloc(m3_gsm8k_extract_bytes(len));
            char *na = malloc(strlen(ans) + 1);
            s->pred[f][i] = p;
            s->norm[f][i] = np;
            if (!p || !np || !na) {
                free(na);
                return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", s->name);
            }
            if (!m3_gsm8k_extract((m3_gsm8k_filter)f, resp, p)) s->n_invalid[f]++;
            m3_gsm8k_normalize(p, np);
            m3_gsm8k_normalize(ans, na);
            s->correct[f][i] = strcmp(np, na) == 0;
            s->n_correct[f] += s->correct[f][i];
            free(na);
        }
        m3_gsm8k_accuracy(s->correct[f], n, &s->acc[f], &s->se[f]);
    }
    return M3_OK;
}

/* Token-level divergence of two variants' generations (generation path only). */
typedef struct {
    bool have;
    int64_t diverged;       /* items whose generated ids differ */
    int64_t min, median, max; /* of the first differing position over those items */
} divergence;

typedef struct {
    m3_mcnemar mc[M3_GSM8K_N_FILTER];
    int64_t changed[M3_GSM8K_N_FILTER]; /* items whose normalised extracted answer differs */
    divergence div;
} paired;

static paired pair_with(const scored *a, const scored *b) {
    paired p;
    memset(&p, 0, sizeof p);
    for (int f = 0; f < M3_GSM8K_N_FILTER; f++) {
        p.mc[f] = m3_mcnemar_exact(a->correct[f], b->correct[f], a->n);
        p.changed[f] = 0;
        for (int64_t i = 0; i < a->n; i++)
            p.changed[f] += strcmp(a->norm[f][i], b->norm[f][i]) != 0;
    }
    return p;
}

/* Generation figures of one variant (generation path only). prefill_s / decode_s sum the
 * per-item pass times, resumed items with their recorded times (the samples file ties them
 * to the same backend); load_s and wall_s are this run's: opening the model (weights
 * uploaded on the GPU) and the variant's whole generation loop. */
typedef struct {
    bool have;
    const char *profile, *keys, *backend;
    char device[128];
    int64_t prompt_tokens, gen_tokens, decode_passes, resumed;
    int64_t stops[3]; /* by m3_gen_stop */
    double prefill_s, decode_s, load_s, wall_s;
} gen_stats;

/* a / b, NaN when b is 0 (json_num writes null, the table "-") */
static double rate(double a, double b) { return b > 0 ? a / b : (double)NAN; }

static void json_variant(FILE *f, const scored *s, const gen_stats *g, const paired *p,
                         const char *ref_name) {
    int64_t n = s->n;
    fprintf(f, "{\"n\": %lld", (long long)n);
    for (int k = 0; k < M3_GSM8K_N_FILTER; k++) {
        fprintf(f, ", \"%s\": {\"correct\": %lld, \"accuracy\": ", m3_gsm8k_filter_name(k),
                (long long)s->n_correct[k]);
        json_num(f, s->acc[k]);
        fputs(", \"stderr\": ", f);
        json_num(f, s->se[k]);
        fputc('}', f);
    }
    fputs(", \"invalid\": {", f);
    for (int k = 0; k < M3_GSM8K_N_FILTER; k++) {
        fprintf(f, "%s\"%s\": {\"count\": %lld, \"rate\": ", k ? ", " : "",
                m3_gsm8k_filter_name(k), (long long)s->n_invalid[k]);
        json_num(f, (double)s->n_invalid[k] / (double)n);
        fputc('}', f);
    }
    fputc('}', f);
    if (g && g->have) {
        fputs(", \"generation\": {\"profile\": ", f);
        json_str(f, g->profile);
        fputs(", \"variant_keys\": ", f);
        json_str(f, g->keys);
        fputs(", \"backend\": ", f);
        json_str(f, g->backend);
        fputs(", \"device\": ", f);
        json_str(f, g->device);
        fprintf(f, ", \"prompt_tokens\": %lld, \"generated_tokens\": %lld, \"decode_passes\": "
                "%lld, \"resumed_items\": %lld, \"stops\": {\"eos\": %lld, \"stop_string\": "
                "%lld, \"max_gen_toks\": %lld}, \"prefill_s\": ",
                (long long)g->prompt_tokens, (long long)g->gen_tokens,
                (long long)g->decode_passes, (long long)g->resumed,
                (long long)g->stops[M3_GEN_STOP_EOS], (long long)g->stops[M3_GEN_STOP_STRING],
                (long long)g->stops[M3_GEN_STOP_MAX]);
        json_num(f, g->prefill_s);
        fputs(", \"decode_s\": ", f);
        json_num(f, g->decode_s);
        fputs(", \"prefill_tokens_per_s\": ", f);
        json_num(f, rate((double)g->prompt_tokens, g->prefill_s));
        fputs(", \"decode_tokens_per_s\": ", f);
        json_num(f, rate((double)g->decode_passes, g->decode_s));
        fputs(", \"generated_tokens_per_s\": ", f);
        json_num(f, rate((double)g->gen_tokens, g->prefill_s + g->decode_s));
        fputs(", \"load_s\": ", f);
        json_num(f, g->load_s);
        fputs(", \"wall_s\": ", f);
        json_num(f, g->wall_s);
        fputc('}', f);
    }
    if (p) {
        fputs(", \"mcnemar\": {\"against\": ", f);
        json_str(f, ref_name);
        for (int k = 0; k < M3_GSM8K_N_FILTER; k++) {
            const m3_mcnemar *m = &p->mc[k];
            fprintf(f,
                    ", \"%s\": {\"both_correct\": %lld, \"only_reference_correct\": %lld, "
                    "\"only_this_correct\": %lld, \"both_wrong\": %lld, \"p_value\": ",
                    m3_gsm8k_filter_name(k), (long long)m->both, (long long)m->only_a,
                    (long long)m->only_b, (long long)m->neither);
            json_num(f, m->p);
            fprintf(f, ", \"changed_answers\": %lld}", (long long)p->changed[k]);
        }
        fputc('}', f);
        if (p->div.have) {
            fprintf(f, ", \"divergence\": {\"against\": ");
            json_str(f, ref_name);
            fprintf(f, ", \"diverged_items\": %lld", (long long)p->div.diverged);
            if (p->div.diverged)
                fprintf(f, ", \"first_position\": {\"min\": %lld, \"median\": %lld, \"max\": "
                        "%lld}}", (long long)p->div.min, (long long)p->div.median,
                        (long long)p->div.max);
            else
                fputs(", \"first_position\": null}", f);
        }
    }
    fputc('}', f);
}

/* settings: a JSON object text (generation path) or NULL. */
static m3_status write_json(const char *path, scored *s, const gen_stats *g, int n_files,
                            const paired *pr, const char *settings) {
    out_file o = {0};
    M3_TRY(out_open(&o, path));
    FILE *f = o.f;
    if (n_files == 1 && !settings) {
        json_variant(f, &s[0], NULL, NULL, NULL);
    } else if (n_files == 1) {
        /* one variant: the spec's flat object, with the variant and settings in front */
        char *buf = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        if (!m) {
            out_commit(&o, false);
            return m3_errorf(M3_ERR_NOMEM, "out of memory");
        }
        json_variant(m, &s[0], &g[0], NULL, NULL);
        fclose(m);
        fputs("{\"variant\": ", f);
        json_str(f, s[0].name);
        fprintf(f, ", \"settings\": %s, %s", settings, buf + 1);
        free(buf);
    } else {
        fprintf(f, "{\"n\": %lld, \"reference\": ", (long long)s[0].n);
        json_str(f, s[0].name);
        if (settings) fprintf(f, ", \"settings\": %s", settings);
        fputs(", \"variants\": {", f);
        for (int v = 0; v < n_files; v++) {
            if (v) fputs(", ", f);
            json_str(f, s[v].name);
            fputs(": ", f);
            json_variant(f, &s[v], g ? &g[v] : NULL, v ? &pr[v] : NULL, s[0].name);
        }
        fputs("}}", f);
    }
    fputc('\n', f);
    return out_commit(&o, true);
}

/* ---- --responses -------------------------------------------------------------------- */

static m3_status write_samples(const char *path, scored *s, int n_files) {
    out_file o = {0};
    M3_TRY(out_open(&o, path));
    FILE *f = o.f;
    for (int v = 0; v < n_files; v++)
        for (int64_t i = 0; i < s[v].n; i++) {
            fputs("{\"variant\": ", f);
            json_str(f, s[v].name);
            fprintf(f, ", \"doc_id\": %lld, \"target\": ", (long long)i);
            json_str(f, s[v].ans[i]);
            fputs(", \"response\": ", f);
            json_str(f, s[v].resp[i]);
            for (int k = 0; k < M3_GSM8K_N_FILTER; k++) {
                fprintf(f, ", \"%s\": {\"extracted\": ", m3_gsm8k_filter_name(k));
                json_str(f, s[v].pred[k][i]);
                fprintf(f, ", \"exact_match\": %d}", s[v].correct[k][i]);
            }
            fputs("}\n", f);
        }
    return out_commit(&o, true);
}

static void print_table(const scored *s, int n_files, const paired *pr) {
    printf("gsm8k: %lld items, lm-eval filters (strict-match: first \"#### N\"; "
           "flexible-extract: last number)\n",
           (long long)s[0].n);
    printf("%-32s %-17s %8s %9s %8s %8s\n", "responses", "filter", "correct", "accuracy",
           "stderr", "invalid");
    for (int v = 0; v < n_files; v++)
        for (int k = 0; k < M3_GSM8K_N_FILTER; k++)
            printf("%-32s %-17s %8lld %9.4f %8.4f %8lld\n", k ? "" : s[v].name,
                   m3_gsm8k_filter_name(k), (long long)s[v].n_correct[k], s[v].acc[k],
                   s[v].se[k], (long long)s[v].n_invalid[k]);
    if (n_files < 2) return;
    printf("\npaired against %s (exact McNemar, two-sided):\n", s[0].name);
    printf("%-32s %-17s %9s %9s %10s %8s\n", "responses", "filter", "only_ref", "only_this",
           "p", "changed");
    for (int v = 1; v < n_files; v++)
        for (int k = 0; k < M3_GSM8K_N_FILTER; k++)
            printf("%-32s %-17s %9lld %9lld %10.4g %8lld\n", k ? "" : s[v].name,
                   m3_gsm8k_filter_name(k), (long long)pr[v].mc[k].only_a,
                   (long long)pr[v].mc[k].only_b, pr[v].mc[k].p, (long long)pr[v].changed[k]);
}

/* --min-accuracy: exit 1 when any strict-match accuracy is below it. */
static int gate(const scored *s, int n_files, double min_acc) {
    int rc = 0;
    if (!isnan(min_acc))
        for (int v = 0; v < n_files; v++)
            if (!(s[v].acc[M3_GSM8K_STRICT] >= min_acc)) {
                printf("gate: %s strict-match accuracy %.4f < %.4f\n", s[v].name,
                       s[v].acc[M3_GSM8K_STRICT], min_acc);
                rc = 1;
            }
    return rc;
}

static int run_responses(const char **files, int n_files, const char *json, const char *samples,
                         double min_acc) {
    static const char *const keys[2] = {"answer", "response"};
    scored s[MAX_FILES];
    m3_gsm8k_rows rows[MAX_FILES];
    paired pr[MAX_FILES];
    memset(s, 0, sizeof s);
    memset(rows, 0, sizeof rows);
    int rc = 2;
    for (int v = 0; v < n_files; v++) {
        if (m3_gsm8k_read_jsonl(&rows[v], files[v], keys, 2)) goto done;
        if (rows[v].n == 0) {
            m3_errorf(M3_ERR_FORMAT, "%s: no responses", files[v]);
            goto done;
        }
        if (scored_init(&s[v], files[v], rows[v].n)) goto done;
        for (int64_t i = 0; i < rows[v].n; i++) {
            s[v].ans[i] = rows[v].val[2 * i];
            s[v].resp[i] = rows[v].val[2 * i + 1];
        }
        if (score_items(&s[v])) goto done;
    }
    for (int v = 1; v < n_files; v++) {
        if (s[v].n != s[0].n) {
            m3_errorf(M3_ERR_FORMAT, "%s: %lld responses, %s has %lld; paired files must list "
                      "the same questions in the same order", files[v], (long long)s[v].n,
                      files[0], (long long)s[0].n);
            goto done;
        }
        for (int64_t i = 0; i < s[0].n; i++)
            if (strcmp(s[v].ans[i], s[0].ans[i])) {
                m3_errorf(M3_ERR_FORMAT, "%s: item %lld: \"answer\" differs from %s's; paired "
                          "files must list the same questions in the same order", files[v],
                          (long long)i + 1, files[0]);
                goto done;
            }
        pr[v] = pair_with(&s[0], &s[v]);
    }
    if (json && write_json(json, s, NULL, n_files, pr, NULL)) goto done;
    if (samples && write_samples(samples, s, n_files)) goto done;
    print_table(s, n_files, pr);
    rc = gate(s, n_files, min_acc);
done:
    for (int v = 0; v < n_files; v++) {
        scored_free(&s[v]);
        m3_gsm8k_rows_free(&rows[v]);
    }
    return rc == 2 ? m3_cli_fail(NULL) : rc;
}

/* ---- prompts -------------------------------------------------------------------------- */

/* The n prompts of the evaluated items with their shots (lm-eval's sampler, in order). */
typedef struct {
    int64_t n;
    int k;
    char **prompt;  /* owned */
    int64_t *shots; /* [n * k] */
} prompt_set;

static void prompt_set_free(prompt_set *p) {
    for (int64_t i = 0; p->prompt && i < p->n; i++) free(p->prompt[i]);
    free(p->prompt);
    free(p->shots);
    memset(p, 0, sizeof *p);
}

/* Without a separate few-shot file the shots come from the evaluated file itself, and
 * lm-eval then draws k+1 and drops the document being asked. */
static m3_status build_prompts(prompt_set *p, const m3_gsm8k_set *test, const m3_gsm8k_set *train,
                               const char *pool_path, int k, int64_t n) {
    memset(p, 0, sizeof *p);
    const m3_gsm8k_set *pool = train ? train : test;
    p->n = n;
    p->k = k;
    p->prompt = calloc((size_t)n, sizeof *p->prompt);
    p->shots = calloc((size_t)(n * k + 1), sizeof *p->shots);
    if (!p->prompt || !p->shots) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    m3_pyrandom r;
    m3_pyrandom_seed(&r, M3_GSM8K_FEWSHOT_SEED);
    for (int64_t i = 0; i < n; i++) {
        const m3_gsm8k_item *shots[64];
        int64_t *idx = &p->shots[i * k];
        m3_status s = m3_gsm8k_draw_shots(&r, pool, k, train ? NULL : &test->items[i], idx);
        if (s) return m3_error_context(s, "%s", pool_path);
        for (int j = 0; j < k; j++) shots[j] = &pool->items[idx[j]];
        p->prompt[i] = m3_gsm8k_prompt(shots, k, test->items[i].question);
        if (!p->prompt[i]) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    }
    return M3_OK;
}

static int write_prompts(const char *data, const char *fewshot, int k, int64_t limit,
                         const char *path) {
    m3_gsm8k_set test = {0}, train = {0};
    prompt_set ps = {0};
    out_file o = {0};
    int rc = 2;
    if (m3_gsm8k_set_read(&test, data)) goto done;
    if (fewshot && m3_gsm8k_set_read(&train, fewshot)) goto done;
    int64_t n = limit > 0 && limit < test.n ? limit : test.n;
    if (build_prompts(&ps, &test, fewshot ? &train : NULL, fewshot ? fewshot : data, k, n))
        goto done;
    if (out_open(&o, path)) goto done;
    for (int64_t i = 0; i < n; i++) {
        fprintf(o.f, "{\"doc_id\": %lld, \"shots\": [", (long long)i);
        for (int j = 0; j < k; j++)
            fprintf(o.f, "%s%lld", j ? ", " : "", (long long)ps.shots[i * k + j]);
        fputs("], \"prompt\": ", o.f);
        json_str(o.f, ps.prompt[i]);
        fputs(", \"target\": ", o.f);
        json_str(o.f, test.items[i].answer);
        fputs("}\n", o.f);
    }
    if (out_commit(&o, true)) goto done;
    printf("wrote %lld prompts (%d-shot, shots from %s, sampler seed %d) to %s\n", (long long)n,
           k, fewshot ? fewshot : data, M3_GSM8K_FEWSHOT_SEED, path);
    rc = 0;
done:
    out_commit(&o, false);
    prompt_set_free(&ps);
    m3_gsm8k_set_free(&test);
    m3_gsm8k_set_free(&train);
    return rc ? m3_cli_fail(NULL) : 0;
}

/* ---- generation --------------------------------------------------------------------- */

typedef struct {
    const char *model, *data, *fewshot, *samples, *json, *backend, *variants;
    int num_fewshot, max_gen_toks, threads;
    int64_t limit;
    double min_acc;
} gen_args;

/* One variant's generations, per item (resp NULL: not generated yet). */
typedef struct {
    char **resp;
    int32_t **tok;
    int *ntok, *n_decode;
    uint8_t *stop;
    double *prefill_s, *decode_s;
    uint8_t *resumed;
} records;

static void records_free(records *r, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (r->resp) free(r->resp[i]);
        if (r->tok) free(r->tok[i]);
    }
    free(r->resp);
    free(r->tok);
    free(r->ntok);
    free(r->n_decode);
    free(r->stop);
    free(r->prefill_s);
    free(r->decode_s);
    free(r->resumed);
    memset(r, 0, sizeof *r);
}

static m3_status records_init(records *r, int64_t n) {
    size_t k = (size_t)n;
    r->resp = calloc(k, sizeof *r->resp);
    r->tok = calloc(k, sizeof *r->tok);
    r->ntok = calloc(k, sizeof *r->ntok);
    r->n_decode = calloc(k, sizeof *r->n_decode);
    r->stop = calloc(k, 1);
    r->prefill_s = calloc(k, sizeof(double));
    r->decode_s = calloc(k, sizeof(double));
    r->resumed = calloc(k, 1);
    if (!r->resp || !r->tok || !r->ntok || !r->n_decode || !r->stop || !r->prefill_s ||
        !r->decode_s || !r->resumed)
        return m3_errorf(M3_ERR_NOMEM, "out of memory");
    return M3_OK;
}

/* 64-bit FNV-1a, as hex in the samples header: enough to tell two inputs apart. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
#define FNV0 0xcbf29ce484222325ull

/* Hash of a file's first max_bytes bytes and its size (max_bytes 0: all). */
static m3_status file_hash(const char *path, size_t max_bytes, uint64_t *h) {
    FILE *f = fopen(path, "rb");
    if (!f) return m3_errorf(M3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char buf[1 << 16];
    size_t got, total = 0;
    *h = FNV0;
    while ((!max_bytes || total < max_bytes) && (got = fread(buf, 1, sizeof buf, f)) > 0) {
        if (max_bytes && total + got > max_bytes) got = max_bytes - total;
        *h = fnv1a(*h, buf, got);
        total += got;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    bool bad = ferror(f) != 0;
    fclose(f);
    if (bad) return m3_errorf(M3_ERR_IO, "%s: read failed", path);
    *h = fnv1a(*h, &size, sizeof size);
    return M3_OK;
}

/* The settings a samples file is tied to, as one JSON object on one line. The weights
 * fingerprint covers model.safetensors' size and first MiB (its header and the first
 * tensors), or the index file of a sharded checkpoint: a fingerprint, not a full hash,
 * so that an 854 GB checkpoint is not read twice. */
static m3_status make_settings(char **out, const gen_args *a, const m3_config *cfg,
                               const int32_t *stop_ids, int n_stop_ids,
                               const char *const *stop_strings, int n_stop) {
    char path[4096];
    uint64_t h_data, h_shots = 0, h_tok, h_w;
    M3_TRY(file_hash(a->data, 0, &h_data));
    if (a->fewshot) M3_TRY(file_hash(a->fewshot, 0, &h_shots));
    snprintf(path, sizeof path, "%s/tokenizer.json", a->model);
    M3_TRY(file_hash(path, 0, &h_tok));
    snprintf(path, sizeof path, "%s/model.safetensors", a->model);
    if (access(path, R_OK) != 0)
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", a->model);
    M3_TRY(file_hash(path, 1 << 20, &h_w));
    uint64_t h_cfg = fnv1a(FNV0, cfg->json_text, cfg->json_len);
    size_t len = 0;
    FILE *f = open_memstream(out, &len);
    if (!f) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    fprintf(f, "{\"data_fnv1a64\": \"%016llx\", \"fewshot\": ",
            (unsigned long long)h_data);
    if (a->fewshot) fprintf(f, "\"%016llx\"", (unsigned long long)h_shots);
    else fputs("\"data\"", f);
    fprintf(f, ", \"num_fewshot\": %d, \"fewshot_seed\": %d, \"max_gen_toks\": %d, "
            "\"backend\": ", a->num_fewshot, M3_GSM8K_FEWSHOT_SEED, a->max_gen_toks);
    json_str(f, a->backend);
    fprintf(f, ", \"config_fnv1a64\": \"%016llx\", \"tokenizer_fnv1a64\": \"%016llx\", "
            "\"weights_fingerprint\": \"%016llx\", \"stop_strings\": [",
            (unsigned long long)h_cfg, (unsigned long long)h_tok, (unsigned long long)h_w);
    for (int i = 0; i < n_stop; i++) {
        if (i) fputs(", ", f);
        json_str(f, stop_strings[i]);
    }
    fputs("], \"stop_ids\": [", f);
    for (int i = 0; i < n_stop_ids; i++) fprintf(f, "%s%d", i ? ", " : "", stop_ids[i]);
    fputs("]}", f);
    fclose(f);
    return *out ? M3_OK : m3_errorf(M3_ERR_NOMEM, "out of memory");
}

/* Structural equality of two parsed JSON values (objects: same keys, any order). */
static bool json_equal(const m3_json *a, const m3_json *b) {
    if (!a || !b) return a == b;
    if (m3_json_is_string(a) || m3_json_is_string(b))
        return m3_json_str(a) && m3_json_str(b) && !strcmp(m3_json_str(a), m3_json_str(b));
    if (m3_json_is_number(a) || m3_json_is_number(b)) {
        double x, y;
        return m3_json_double(a, &x) && m3_json_double(b, &y) && x == y;
    }
    if (m3_json_is_bool(a) || m3_json_is_bool(b)) {
        bool x, y;
        return m3_json_bool(a, &x) && m3_json_bool(b, &y) && x == y;
    }
    if (m3_json_is_null(a) || m3_json_is_null(b)) return m3_json_is_null(a) && m3_json_is_null(b);
    if (m3_json_size(a) != m3_json_size(b)) return false;
    if (m3_json_is_array(a) != m3_json_is_array(b)) return false;
    if (m3_json_is_array(a)) {
        for (int i = 0; i < m3_json_size(a); i++)
            if (!json_equal(m3_json_at(a, i), m3_json_at(b, i))) return false;
        return true;
    }
    for (const m3_json *m = m3_json_first(a); m; m = m3_json_next(m))
        if (!json_equal(m, m3_json_get(b, m3_json_key(m)))) return false;
    return true;
}

/* Append one finished item to the samples file (one write of one whole line). */
static m3_status append_sample(FILE *f, const char *path, const m3_eval_variant *v,
                               const char *backend, int64_t doc, const prompt_set *ps,
                               const char *target, const records *r, int n_prompt) {
    char *line = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&line, &len);
    if (!m) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    fputs("{\"variant\": ", m);
    json_str(m, v->name);
    fputs(", \"profile\": ", m);
    json_str(m, v->profile.name);
    fputs(", \"variant_keys\": ", m);
    json_str(m, v->keys);
    fputs(", \"backend\": ", m);
    json_str(m, backend);
    fprintf(m, ", \"doc_id\": %lld, \"shots\": [", (long long)doc);
    for (int j = 0; j < ps->k; j++)
        fprintf(m, "%s%lld", j ? ", " : "", (long long)ps->shots[doc * ps->k + j]);
    fputs("], \"prompt\": ", m);
    json_str(m, ps->prompt[doc]);
    fputs(", \"target\": ", m);
    json_str(m, target);
    fputs(", \"response\": ", m);
    json_str(m, r->resp[doc]);
    fputs(", \"tokens\": [", m);
    for (int j = 0; j < r->ntok[doc]; j++) fprintf(m, "%s%d", j ? ", " : "", r->tok[doc][j]);
    fprintf(m, "], \"n_prompt_tokens\": %d, \"stop\": \"%s\", \"n_decode\": %d, \"prefill_s\": ",
            n_prompt, m3_gen_stop_name((m3_gen_stop)r->stop[doc]), r->n_decode[doc]);
    json_num(m, r->prefill_s[doc]);
    fputs(", \"decode_s\": ", m);
    json_num(m, r->decode_s[doc]);
    for (int k = 0; k < M3_GSM8K_N_FILTER; k++) {
        size_t rl = strlen(r->resp[doc]);
        char *p = malloc(m3_gsm8k_extract_bytes(rl));
        if (!p) {
            fclose(m);
            free(line);
            return m3_errorf(M3_ERR_NOMEM, "out of memory");
        }
        m3_gsm8k_extract((m3_gsm8k_filter)k, r->resp[doc], p);
        fprintf(m, ", \"%s\": {\"extracted\": ", m3_gsm8k_filter_name(k));
        json_str(m, p);
        fprintf(m, ", \"exact_match\": %d}", m3_gsm8k_exact_match(p, target) == 1);
        free(p);
    }
    fputs("}\n", m);
    fclose(m);
    bool ok = line && fwrite(line, 1, len, f) == len && fflush(f) == 0;
    free(line);
    return ok ? M3_OK : m3_errorf(M3_ERR_IO, "%s: write failed: %s", path, strerror(errno));
}

/* Read an existing samples file: check its header against `settings`, load the finished
 * items of the variants being run (others are kept in the file, unused), drop a cut last
 * line. Then (or for a new file) open it for appending. */
static m3_status samples_open(FILE **out, const char *path, const char *settings,
                              const m3_eval_variant *vars, records *rec, int n_var,
                              const m3_gsm8k_set *test, int64_t n) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size == 0) {
        FILE *f = fopen(path, "wb");
        if (!f) return m3_errorf(M3_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        fprintf(f, "{\"format\": \"%s\", \"settings\": %s}\n", SAMPLES_FORMAT, settings);
        if (fflush(f) != 0) {
            fclose(f);
            return m3_errorf(M3_ERR_IO, "%s: write failed", path);
        }
        *out = f;
        return M3_OK;
    }
    FILE *f = fopen(path, "rb");
    if (!f) return m3_errorf(M3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *text = malloc((size_t)st.st_size + 1);
    size_t len = text ? fread(text, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (!text) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    text[len] = 0;
    m3_status s = M3_OK;
    m3_json *want = NULL, *j = NULL;
    /* a cut last line (a run killed mid-write) is dropped */
    char *last_nl = memrchr(text, '\n', len);
    size_t keep = last_nl ? (size_t)(last_nl - text) + 1 : 0;
    if (keep == 0) {
        s = m3_errorf(M3_ERR_FORMAT, "%s: not an m3 eval samples file (no complete header "
                      "line); refusing to append", path);
        goto done;
    }
    if (m3_json_parse(&want, settings, strlen(settings), "settings")) {
        s = M3_ERR_FORMAT;
        goto done;
    }
    int64_t line_no = 0;
    for (char *p = text; p < text + keep;) {
        char *nl = memchr(p, '\n', (size_t)(text + keep - p));
        line_no++;
        char ctx[4200];
        snprintf(ctx, sizeof ctx, "%.4000s:%lld", path, (long long)line_no);
        s = m3_json_parse(&j, p, (size_t)(nl - p), ctx);
        p = nl + 1;
        if (s) goto done;
        if (line_no == 1) {
            if (!m3_json_is_object(j) ||
                strcmp(m3_json_get_str(j, "format", ""), SAMPLES_FORMAT) != 0) {
                s = m3_errorf(M3_ERR_FORMAT, "%s: not an m3 eval samples file (%s header "
                              "expected); refusing to append", path, SAMPLES_FORMAT);
                goto done;
            }
            const m3_json *have = m3_json_get(j, "settings");
            for (const m3_json *m = m3_json_first(want); m; m = m3_json_next(m))
                if (!json_equal(m, m3_json_get(have, m3_json_key(m)))) {
                    s = m3_errorf(M3_ERR_ARG, "%s: written with other settings (%s differs); "
                                  "use another --samples file or remove it", path,
                                  m3_json_key(m));
                    goto done;
                }
            m3_json_free(j);
            j = NULL;
            continue;
        }
        const char *vname = m3_json_get_str(j, "variant", NULL);
        const char *resp = m3_json_get_str(j, "response", NULL);
        const char *target = m3_json_get_str(j, "target", NULL);
        const m3_json *toks = m3_json_get(j, "tokens");
        int64_t doc = m3_json_get_int(j, "doc_id", -1);
        if (!vname || !resp || !target || !m3_json_is_array(toks) || doc < 0) {
            s = m3_errorf(M3_ERR_FORMAT, "%s: variant, doc_id, target, response or tokens "
                          "missing", ctx);
            goto done;
        }
        if (doc >= test->n || strcmp(target, test->items[doc].answer)) {
            s = m3_errorf(M3_ERR_FORMAT, "%s: doc_id %lld does not match the data file's item",
                          ctx, (long long)doc);
            goto done;
        }
        int v = 0;
        while (v < n_var && strcmp(vars[v].name, vname)) v++;
        if (v == n_var || doc >= n || rec[v].resp[doc]) { /* not run now, or a duplicate */
            m3_json_free(j);
            j = NULL;
            continue;
        }
        if (strcmp(m3_json_get_str(j, "profile", ""), vars[v].profile.name) ||
            strcmp(m3_json_get_str(j, "variant_keys", ""), vars[v].keys)) {
            s = m3_errorf(M3_ERR_ARG, "%s: variant '%s' was run as profile %s [%s], now it "
                          "means %s [%s]", ctx, vname, m3_json_get_str(j, "profile", ""),
                          m3_json_get_str(j, "variant_keys", ""), vars[v].profile.name,
                          vars[v].keys);
            goto done;
        }
        records *r = &rec[v];
        int nt = m3_json_size(toks);
        r->tok[doc] = malloc((size_t)(nt + 1) * sizeof(int32_t));
        r->resp[doc] = strdup(resp);
        if (!r->tok[doc] || !r->resp[doc]) {
            s = m3_errorf(M3_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int t = 0; t < nt; t++) {
            int64_t id;
            if (!m3_json_int(m3_json_at(toks, t), &id) || id < 0 || id > INT32_MAX) {
                s = m3_errorf(M3_ERR_FORMAT, "%s: tokens[%d] is not a token id", ctx, t);
                goto done;
            }
            r->tok[doc][t] = (int32_t)id;
        }
        r->ntok[doc] = nt;
        r->n_decode[doc] = (int)m3_json_get_int(j, "n_decode", 0);
        r->prefill_s[doc] = m3_json_get_double(j, "prefill_s", 0);
        r->decode_s[doc] = m3_json_get_double(j, "decode_s", 0);
        const char *stop = m3_json_get_str(j, "stop", "");
        for (int k = 0; k < 3; k++)
            if (!strcmp(stop, m3_gen_stop_name((m3_gen_stop)k))) r->stop[doc] = (uint8_t)k;
        r->resumed[doc] = 1;
        m3_json_free(j);
        j = NULL;
    }
    if (keep < len && truncate(path, (off_t)keep) != 0) {
        s = m3_errorf(M3_ERR_IO, "%s: cannot drop the cut last line: %s", path, strerror(errno));
        goto done;
    }
    *out = fopen(path, "ab");
    if (!*out) s = m3_errorf(M3_ERR_IO, "%s: cannot append: %s", path, strerror(errno));
done:
    m3_json_free(j);
    m3_json_free(want);
    free(text);
    return s;
}

/* Progress on a TTY: one line rewritten in place; nothing when stderr is not a terminal. */
static void progress(bool on, const char *name, int64_t done, int64_t n, int64_t correct,
                     int64_t scored_n, double tok_s) {
    if (!on) return;
    int w = 30, fill = n ? (int)(done * w / n) : w;
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = 0;
    fprintf(stderr, "\r%-16.16s %6lld/%-6lld [%s] strict %.3f  %.1f tok/s ", name,
            (long long)done, (long long)n, bar, scored_n ? (double)correct / (double)scored_n : 0.0,
            tok_s);
    if (done == n) fputc('\n', stderr);
    fflush(stderr);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Apply every variant to the backend before anything is written, so that a variant it
 * refuses (the GPU's forward does not implement every key yet) ends the run with that one
 * line and no output file. Variants of one profile share an open model (set_variant); the
 * order is reversed so that the model left open is a fresh open of vars[0], the first one
 * generated (*fresh true), which then needs no second open. The probe model's state after
 * set_variant is not used for generation: every generated variant runs on a fresh open. */
static m3_status probe_variants(m3_run_model **m, const gen_args *a, const m3_eval_variant *vars,
                                int n_var, bool *fresh, double *load_s) {
    *m = NULL;
    *fresh = false;
    for (int v = n_var - 1; v >= 0; v--) {
        if (*m && !strcmp(vars[v].profile.name, vars[v + 1].profile.name)) {
            m3_status s = m3_run_model_set_variant(*m, &vars[v].variant);
            if (s) return m3_error_context(s, "variant '%s'", vars[v].name);
            *fresh = false;
            continue;
        }
        m3_run_model_close(*m);
        *m = NULL;
        double t0 = now_s();
        M3_TRY(m3_eval_model_open(m, a->model, a->backend, &vars[v]));
        *load_s = now_s() - t0;
        *fresh = true;
    }
    return M3_OK;
}

static int run_generate(const gen_args *a) {
    /* a build without the GPU backend: one line, before any input is read */
    if (!strcmp(a->backend, "gpu") && !m3_gpu_compiled())
        return m3_cli_fail("eval gsm8k: --backend gpu: this m3 was built without a GPU backend "
                           "(make gpu builds one)");
    /* every variant is resolved before anything else happens */
    m3_eval_variant vars[MAX_FILES];
    int n_var = 0;
    {
        const char *p = a->variants;
        while (*p) {
            size_t l = strcspn(p, ",");
            char name[128];
            if (n_var == MAX_FILES)
                return m3_cli_fail("eval gsm8k: at most %d variants", MAX_FILES);
            if (l >= sizeof name) return m3_cli_fail("eval gsm8k: variant name too long");
            memcpy(name, p, l);
            name[l] = 0;
            p += l + (p[l] == ',');
            if (m3_eval_variant_resolve(&vars[n_var], name)) return m3_cli_fail(NULL);
            for (int v = 0; v < n_var; v++)
                if (!strcmp(vars[v].name, name))
                    return m3_cli_fail("eval gsm8k: variant '%s' given twice", name);
            n_var++;
        }
    }
    if (a->threads) m3_set_threads(a->threads);

    m3_gsm8k_set test = {0}, train = {0};
    prompt_set ps = {0};
    m3_tokenizer *tk = NULL;
    m3_run_model *m = NULL;
    int32_t **pids = NULL;
    int *npids = NULL;
    char *settings = NULL;
    FILE *sf = NULL;
    records rec[MAX_FILES];
    scored sc[MAX_FILES];
    gen_stats gs[MAX_FILES];
    paired pr[MAX_FILES];
    memset(rec, 0, sizeof rec);
    memset(sc, 0, sizeof sc);
    memset(gs, 0, sizeof gs);
    memset(pr, 0, sizeof pr);
    int64_t n = 0;
    int rc = 2;
    char path[4096];

    if (m3_gsm8k_set_read(&test, a->data)) goto done;
    if (test.n == 0) {
        m3_errorf(M3_ERR_FORMAT, "%s: no items", a->data);
        goto done;
    }
    if (a->fewshot && m3_gsm8k_set_read(&train, a->fewshot)) goto done;
    n = a->limit > 0 && a->limit < test.n ? a->limit : test.n;
    if (build_prompts(&ps, &test, a->fewshot ? &train : NULL, a->fewshot ? a->fewshot : a->data,
                      a->num_fewshot, n))
        goto done;
    snprintf(path, sizeof path, "%s/tokenizer.json", a->model);
    if (m3_tokenizer_open(&tk, path)) goto done;
    bool fresh;
    double load0 = 0;
    if (probe_variants(&m, a, vars, n_var, &fresh, &load0)) goto done;
    if (!fresh) {
        m3_run_model_close(m);
        m = NULL;
        double t0 = now_s();
        if (m3_eval_model_open(&m, a->model, a->backend, &vars[0])) goto done;
        load0 = now_s() - t0;
    }
    const m3_config *cfg = m3_run_model_config(m); /* valid while m is (used before the loop) */
    m3_config_emit_warnings(cfg);

    /* stops as lm-eval's gsm8k task: the strings, and EOS (HF generate stops at it) */
    static const char *const stop_strings[] = {"Question:", "</s>", "<|im_end|>"};
    int32_t stop_ids[4];
    int n_stop_ids = 0;
    if (cfg->eos_id >= 0 && cfg->eos_id < cfg->vocab) stop_ids[n_stop_ids++] = cfg->eos_id;
    for (int i = 1; i < 3; i++) {
        int32_t id = m3_tokenizer_token_id(tk, stop_strings[i]);
        bool dup = false;
        for (int j = 0; j < n_stop_ids; j++) dup |= stop_ids[j] == id;
        if (id >= 0 && !dup) stop_ids[n_stop_ids++] = id;
    }

    /* every prompt is tokenized and checked before generation starts */
    pids = calloc((size_t)n, sizeof *pids);
    npids = calloc((size_t)n, sizeof *npids);
    if (!pids || !npids) {
        m3_errorf(M3_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t k;
        if (m3_tokenizer_encode(tk, ps.prompt[i], strlen(ps.prompt[i]), &pids[i], &k)) goto done;
        npids[i] = (int)k;
        if (k < 1 || k + a->max_gen_toks > cfg->max_pos) {
            m3_errorf(M3_ERR_ARG, "%s: item %lld: prompt of %lld tokens + --max-gen-toks %d "
                      "does not fit max_position_embeddings %lld", a->data, (long long)i,
                      (long long)k, a->max_gen_toks, (long long)cfg->max_pos);
            goto done;
        }
        for (int64_t t = 0; t < k; t++)
            if (pids[i][t] >= cfg->vocab) {
                m3_errorf(M3_ERR_ARG, "%s/tokenizer.json: token id %d is outside the model's "
                          "vocab %d", a->model, pids[i][t], cfg->vocab);
                goto done;
            }
    }
    int max_prompt = 0;
    for (int64_t i = 0; i < n; i++) max_prompt = npids[i] > max_prompt ? npids[i] : max_prompt;
    /* the longest item's context once, so that no item makes the GPU re-lay its caches */
    if (m3_run_model_reserve(m, max_prompt + a->max_gen_toks)) {
        m3_error_context(M3_ERR_IO, "variant '%s'", vars[0].name);
        goto done;
    }
    if (make_settings(&settings, a, cfg, stop_ids, n_stop_ids, stop_strings, 3)) goto done;
    for (int v = 0; v < n_var; v++)
        if (records_init(&rec[v], n)) goto done;
    if (a->samples && samples_open(&sf, a->samples, settings, vars, rec, n_var, &test, n))
        goto done;

    m3_gen_opts go = {a->max_gen_toks, stop_ids, n_stop_ids, stop_strings, 3};
    bool tty = isatty(STDERR_FILENO);
    for (int v = 0; v < n_var; v++) {
        records *r = &rec[v];
        gen_stats *gv = &gs[v];
        double t_var = now_s();
        gv->load_s = load0;
        if (v > 0) {
            m3_run_model_close(m);
            m = NULL;
            if (m3_eval_model_open(&m, a->model, a->backend, &vars[v])) goto done;
            gv->load_s = now_s() - t_var;
            if (m3_run_model_reserve(m, max_prompt + a->max_gen_toks)) {
                m3_error_context(M3_ERR_IO, "variant '%s'", vars[v].name);
                goto done;
            }
        }
        gv->backend = m3_run_model_backend(m);
        snprintf(gv->device, sizeof gv->device, "%s", m3_run_model_device(m));
        int64_t done_n = 0, correct = 0, toks = 0;
        double secs = 0;
        for (int64_t i = 0; i < n; i++) {
            if (!r->resp[i]) {
                m3_gen_result g;
                if (m3_generate_greedy(m, tk, pids[i], npids[i], &go, &g)) {
                    m3_error_context(M3_ERR_IO, "variant %s, item %lld", vars[v].name,
                                     (long long)i);
                    goto done;
                }
                r->resp[i] = g.text;
                r->tok[i] = g.tokens;
                r->ntok[i] = g.n_tokens;
                r->n_decode[i] = g.n_decode;
                r->stop[i] = (uint8_t)g.stop;
                r->prefill_s[i] = g.prefill_s;
                r->decode_s[i] = g.decode_s;
                toks += g.n_tokens;
                secs += g.prefill_s + g.decode_s;
                if (sf && append_sample(sf, a->samples, &vars[v], gv->backend, i, &ps,
                                        test.items[i].answer, r, npids[i]))
                    goto done;
            }
            done_n++;
            char *pbuf = malloc(m3_gsm8k_extract_bytes(strlen(r->resp[i])));
            if (pbuf) {
                m3_gsm8k_extract(M3_GSM8K_STRICT, r->resp[i], pbuf);
                correct += m3_gsm8k_exact_match(pbuf, test.items[i].answer) == 1;
                free(pbuf);
            }
            progress(tty, vars[v].name, done_n, n, correct, done_n, secs > 0 ? toks / secs : 0);
        }
        gv->wall_s = now_s() - t_var + (v == 0 ? load0 : 0); /* vars[0] opened before */
    }

    /* scoring, pairing, figures */
    for (int v = 0; v < n_var; v++) {
        if (scored_init(&sc[v], vars[v].name, n)) goto done;
        gen_stats *g = &gs[v];
        g->have = true;
        g->profile = vars[v].profile.name;
        g->keys = vars[v].keys;
        for (int64_t i = 0; i < n; i++) {
            sc[v].ans[i] = test.items[i].answer;
            sc[v].resp[i] = rec[v].resp[i];
            g->prompt_tokens += npids[i];
            g->gen_tokens += rec[v].ntok[i];
            g->decode_passes += rec[v].n_decode[i];
            g->resumed += rec[v].resumed[i];
            g->stops[rec[v].stop[i] < 3 ? rec[v].stop[i] : 0]++;
            g->prefill_s += rec[v].prefill_s[i];
            g->decode_s += rec[v].decode_s[i];
        }
        if (score_items(&sc[v])) goto done;
    }
    for (int v = 1; v < n_var; v++) {
        pr[v] = pair_with(&sc[0], &sc[v]);
        int64_t *pos = malloc((size_t)n * sizeof *pos), k = 0;
        if (!pos) {
            m3_errorf(M3_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int64_t i = 0; i < n; i++) {
            int d = m3_gen_first_divergence(rec[0].tok[i], rec[0].ntok[i], rec[v].tok[i],
                                            rec[v].ntok[i]);
            if (d >= 0) pos[k++] = d;
        }
        qsort(pos, (size_t)k, sizeof *pos, cmp_i64);
        pr[v].div.have = true;
        pr[v].div.diverged = k;
        if (k) {
            pr[v].div.min = pos[0];
            pr[v].div.median = pos[(k - 1) / 2];
            pr[v].div.max = pos[k - 1];
        }
        free(pos);
    }
    if (a->json && write_json(a->json, sc, gs, n_var, pr, settings)) goto done;

    printf("gsm8k: %lld items of %s, %d-shot (shots from %s), greedy, max_gen_toks %d, "
           "model %s, backend %s\n",
           (long long)n, a->data, a->num_fewshot, a->fewshot ? a->fewshot : "the data file",
           a->max_gen_toks, a->model, a->backend);
    printf("%-20s %-20s %-20s %9s %11s %10s %8s\n", "variant", "flexible-extract",
           "strict-match", "invalid", "prefill/s", "decode/s", "wall s");
    for (int v = 0; v < n_var; v++) {
        char fx[32], st[32];
        snprintf(fx, sizeof fx, "%.4f ± %.4f", sc[v].acc[M3_GSM8K_FLEXIBLE],
                 sc[v].se[M3_GSM8K_FLEXIBLE]);
        snprintf(st, sizeof st, "%.4f ± %.4f", sc[v].acc[M3_GSM8K_STRICT],
                 sc[v].se[M3_GSM8K_STRICT]);
        printf("%-20s %-21s %-21s %9lld %11.1f %10.1f %8.2f\n", vars[v].name, fx, st,
               (long long)sc[v].n_invalid[M3_GSM8K_STRICT],
               rate((double)gs[v].prompt_tokens, gs[v].prefill_s),
               rate((double)gs[v].decode_passes, gs[v].decode_s), gs[v].wall_s);
    }
    printf("(stderr = sample std / sqrt(n); invalid = no \"#### N\" in the response;\n"
           " prefill/s = prompt tokens per second of the prefill passes, decode/s = tokens per\n"
           " second of the batch-1 decode passes, over all items, resumed ones with their\n"
           " recorded times; wall s = this run's model open + generation; device: %s)\n",
           gs[0].device);
    if (n_var > 1) {
        printf("\npaired against %s (exact McNemar, two-sided; changed = extracted answer "
               "differs; diverged = generated ids differ):\n", vars[0].name);
        printf("%-20s %-17s %8s %9s %10s %8s %9s %s\n", "variant", "filter", "only_ref",
               "only_this", "p", "changed", "diverged", "first divergence min/median/max");
        for (int v = 1; v < n_var; v++)
            for (int k = 0; k < M3_GSM8K_N_FILTER; k++) {
                printf("%-20s %-17s %8lld %9lld %10.4g %8lld", k ? "" : vars[v].name,
                       m3_gsm8k_filter_name(k), (long long)pr[v].mc[k].only_a,
                       (long long)pr[v].mc[k].only_b, pr[v].mc[k].p,
                       (long long)pr[v].changed[k]);
                if (k == 0 && pr[v].div.diverged)
                    printf(" %9lld %lld/%lld/%lld", (long long)pr[v].div.diverged,
                           (long long)pr[v].div.min, (long long)pr[v].div.median,
                           (long long)pr[v].div.max);
                else if (k == 0)
                    printf(" %9d -", 0);
                putchar('\n');
            }
    }
    rc = gate(sc, n_var, a->min_acc);
done:
    if (sf && fclose(sf) != 0 && rc != 2) {
        m3_errorf(M3_ERR_IO, "%s: write failed", a->samples);
        rc = 2;
    }
    for (int v = 0; v < n_var; v++) {
        scored_free(&sc[v]);
        records_free(&rec[v], n);
    }
    for (int64_t i = 0; pids && i < n; i++) free(pids[i]);
    free(pids);
    free(npids);
    free(settings);
    m3_run_model_close(m);
    m3_tokenizer_close(tk);
    prompt_set_free(&ps);
    m3_gsm8k_set_free(&test);
    m3_gsm8k_set_free(&train);
    return rc == 2 ? m3_cli_fail(NULL) : rc;
}

/* ---- arguments ---------------------------------------------------------------------- */

static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

int m3_cmd_eval(int argc, char **argv) {
    if (argc < 2) return m3_cli_fail("eval: need a task: m3 eval gsm8k ... (see m3 eval --help)");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (strcmp(argv[1], "gsm8k"))
        return m3_cli_fail("eval: unknown task '%s' (only gsm8k)", argv[1]);
    const char *files[MAX_FILES];
    int n_files = 0;
    const char *prompts = NULL;
    gen_args a = {.backend = "ref", .variants = "hf", .num_fewshot = 5, .max_gen_toks = 256,
                  .min_acc = (double)NAN};
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        int64_t x;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (o[0] != '-' || o[1] != '-')
            return m3_cli_fail("eval gsm8k: unexpected argument '%s' (see --help)", o);
        if (i + 1 >= argc) return m3_cli_fail("eval gsm8k: %s needs a value", o);
        const char *v = argv[++i];
        if (!strcmp(o, "--responses")) {
            if (n_files == MAX_FILES)
                return m3_cli_fail("eval gsm8k: at most %d --responses files", MAX_FILES);
            files[n_files++] = v;
        } else if (!strcmp(o, "--json")) {
            a.json = v;
        } else if (!strcmp(o, "--samples")) {
            a.samples = v;
        } else if (!strcmp(o, "--model")) {
            a.model = v;
        } else if (!strcmp(o, "--data")) {
            a.data = v;
        } else if (!strcmp(o, "--fewshot")) {
            a.fewshot = v;
        } else if (!strcmp(o, "--write-prompts")) {
            prompts = v;
        } else if (!strcmp(o, "--variants")) {
            a.variants = v;
            if (!v[0] || strstr(v, ",,") || v[0] == ',' || v[strlen(v) - 1] == ',')
                return m3_cli_fail("eval gsm8k: --variants '%s': expected a comma-separated "
                                   "list such as fp32,hf,mxfp4", v);
        } else if (!strcmp(o, "--backend")) {
            a.backend = v;
            if (strcmp(v, "ref") && strcmp(v, "gpu"))
                return m3_cli_fail("eval gsm8k: --backend '%s': expected ref or gpu", v);
        } else if (!strcmp(o, "--num-fewshot")) {
            if (!parse_i64(v, 0, 63, &x))
                return m3_cli_fail("eval gsm8k: --num-fewshot '%s': expected 0..63", v);
            a.num_fewshot = (int)x;
        } else if (!strcmp(o, "--max-gen-toks")) {
            if (!parse_i64(v, 1, 1 << 20, &x))
                return m3_cli_fail("eval gsm8k: --max-gen-toks '%s': expected 1..1048576", v);
            a.max_gen_toks = (int)x;
        } else if (!strcmp(o, "--threads")) {
            if (!parse_i64(v, 1, 1024, &x))
                return m3_cli_fail("eval gsm8k: --threads '%s': expected 1..1024", v);
            a.threads = (int)x;
        } else if (!strcmp(o, "--limit")) {
            if (!parse_i64(v, 1, INT64_MAX, &a.limit))
                return m3_cli_fail("eval gsm8k: --limit '%s': expected a positive integer", v);
        } else if (!strcmp(o, "--min-accuracy")) {
            char *end;
            a.min_acc = strtod(v, &end);
            if (end == v || *end || !(a.min_acc >= 0 && a.min_acc <= 1))
                return m3_cli_fail("eval gsm8k: --min-accuracy '%s': expected 0..1", v);
        } else {
            return m3_cli_fail("eval gsm8k: unknown option '%s' (see --help)", o);
        }
    }
    if (out_check(a.json) || out_check(a.samples) || out_check(prompts)) return m3_cli_fail(NULL);
    if (n_files) {
        if (a.model || a.data || prompts)
            return m3_cli_fail("eval gsm8k: --responses scores existing responses; it takes "
                               "no --model/--data/--write-prompts");
        return run_responses(files, n_files, a.json, a.samples, a.min_acc);
    }
    if (!a.data)
        return m3_cli_fail("eval gsm8k: need --responses FILE, or --model DIR --data FILE");
    if (prompts) return write_prompts(a.data, a.fewshot, a.num_fewshot, a.limit, prompts);
    if (!a.model) return m3_cli_fail("eval gsm8k: --data needs --model DIR");
    return run_generate(&a);
}
