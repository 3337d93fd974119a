/* compare/cmd_eval.c: `m3 eval gsm8k` (contract: shared spec/cli.md; method: compare/gsm8k.h,
 * docs/eval.md).
 *
 *   m3 eval gsm8k --responses FILE.jsonl [--responses FILE2.jsonl ...] [--json OUT.json]
 *                 [--samples OUT.jsonl] [--min-accuracy X]
 *       Scores responses produced elsewhere ({"answer", "response"} per line) with lm-eval's
 *       filters. Several files (same questions, same order) are compared against the first:
 *       exact McNemar per filter and the count of changed extracted answers.
 *   m3 eval gsm8k --model DIR --data test.jsonl [--num-fewshot 5] [--limit N]
 *                 [--variants a,b] [--backend ref|gpu] [--samples OUT] [--json OUT]
 *                 [--fewshot train.jsonl] [--write-prompts OUT.jsonl]
 *       Generation needs the model forward, which this build does not have yet: after the
 *       arguments are checked it exits 2 saying so. --write-prompts (no --model needed)
 *       writes the lm-eval prompts, with their shot indices, and exits 0.
 *
 * Exit: 0 ok; 1 when --min-accuracy is given and a strict-match accuracy is below it;
 * 2 bad arguments or input (one line on stderr). Output files are written to a temporary
 * name and renamed, so a failed run never leaves a partial file. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compare/cmd.h"
#include "compare/gsm8k.h"

#define MAX_FILES 16

static const char *const usage_text =
    "usage: m3 eval gsm8k --responses FILE.jsonl [--responses FILE2.jsonl ...]\n"
    "                     [--json OUT.json] [--samples OUT.jsonl] [--min-accuracy X]\n"
    "       m3 eval gsm8k --model DIR --data test.jsonl [--num-fewshot 5] [--limit N]\n"
    "                     [--variants fp32,hf,...] [--backend ref|gpu] [--samples OUT.jsonl]\n"
    "                     [--json OUT.json] [--fewshot train.jsonl] [--write-prompts OUT.jsonl]\n"
    "--responses: JSONL with \"answer\" (reference answer text) and \"response\" (generated\n"
    "text after its stop sequences) per line, scored with lm-eval's gsm8k filters\n"
    "(strict-match, flexible-extract) and exact_match. Several files are compared with the\n"
    "first (exact McNemar test on paired outcomes, changed answers).\n";

/* ---- output helpers ----------------------------------------------------------------- */

/* JSON string literal. Bytes >= 0x80 pass through (the inputs are UTF-8 JSON already). */
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

/* Open "path.tmp.PID" for an atomic write; commit_file renames it (or removes it on error). */
typedef struct {
    FILE *f;
    char tmp[4096];
    const char *path;
} out_file;

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

typedef struct {
    const char *path;
    m3_gsm8k_rows rows;                    /* val[2i] answer, val[2i+1] response */
    char **pred[M3_GSM8K_N_FILTER];        /* extracted answer per item (owned) */
    char **norm[M3_GSM8K_N_FILTER];        /* its exact_match normalisation (owned) */
    uint8_t *correct[M3_GSM8K_N_FILTER];   /* per item */
    int64_t n_correct[M3_GSM8K_N_FILTER], n_invalid[M3_GSM8K_N_FILTER];
    double acc[M3_GSM8K_N_FILTER], se[M3_GSM8K_N_FILTER];
} scored;

static void scored_free(scored *s) {
    for (int f = 0; f < M3_GSM8K_N_FILTER; f++) {
        for (int64_t i = 0; s->pred[f] && i < s->rows.n; i++) free(s->pred[f][i]);
        for (int64_t i = 0; s->norm[f] && i < s->rows.n; i++) free(s->norm[f][i]);
        free(s->pred[f]);
        free(s->norm[f]);
        free(s->correct[f]);
    }
    m3_gsm8k_rows_free(&s->rows);
}

static m3_status score_file(scored *s, const char *path) {
    static const char *const keys[2] = {"answer", "response"};
    s->path = path;
    M3_TRY(m3_gsm8k_read_jsonl(&s->rows, path, keys, 2));
    int64_t n = s->rows.n;
    if (n == 0) return m3_errorf(M3_ERR_FORMAT, "%s: no responses", path);
    for (int f = 0; f < M3_GSM8K_N_FILTER; f++) {
        s->pred[f] = calloc((size_t)n, sizeof(char *));
        s->norm[f] = calloc((size_t)n, sizeof(char *));
        s->correct[f] = calloc((size_t)n, 1);
        if (!s->pred[f] || !s->norm[f] || !s->correct[f])
            return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
        for (int64_t i = 0; i < n; i++) {
            const char *ans = s->rows.val[2 * i], *resp = s->rows.val[2 * i + 1];
            size_t len = strlen(resp);
            char *p = malloc(m3_gsm8k_extract_bytes(len));
            char *np = malloc(m3_gsm8k_extract_bytes(len));
            char *na = malloc(strlen(ans) + 1);
            s->pred[f][i] = p;
            s->norm[f][i] = np;
            if (!p || !np || !na) {
                free(na);
                return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
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

typedef struct {
    m3_mcnemar mc[M3_GSM8K_N_FILTER];
    int64_t changed[M3_GSM8K_N_FILTER]; /* items whose normalised extracted answer differs */
} paired;

static paired pair_with(const scored *a, const scored *b) {
    paired p;
    for (int f = 0; f < M3_GSM8K_N_FILTER; f++) {
        p.mc[f] = m3_mcnemar_exact(a->correct[f], b->correct[f], a->rows.n);
        p.changed[f] = 0;
        for (int64_t i = 0; i < a->rows.n; i++)
            p.changed[f] += strcmp(a->norm[f][i], b->norm[f][i]) != 0;
    }
    return p;
}

static void json_variant(FILE *f, const scored *s, const paired *p, const char *ref_name) {
    int64_t n = s->rows.n;
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
    }
    fputc('}', f);
}

static m3_status write_json(const char *path, scored *s, int n_files, const paired *pr) {
    out_file o = {0};
    M3_TRY(out_open(&o, path));
    FILE *f = o.f;
    if (n_files == 1) {
        json_variant(f, &s[0], NULL, NULL);
    } else {
        fprintf(f, "{\"n\": %lld, \"reference\": ", (long long)s[0].rows.n);
        json_str(f, s[0].path);
        fputs(", \"variants\": {", f);
        for (int v = 0; v < n_files; v++) {
            if (v) fputs(", ", f);
            json_str(f, s[v].path);
            fputs(": ", f);
            json_variant(f, &s[v], v ? &pr[v] : NULL, s[0].path);
        }
        fputs("}}", f);
    }
    fputc('\n', f);
    return out_commit(&o, true);
}

static m3_status write_samples(const char *path, scored *s, int n_files) {
    out_file o = {0};
    M3_TRY(out_open(&o, path));
    FILE *f = o.f;
    for (int v = 0; v < n_files; v++)
        for (int64_t i = 0; i < s[v].rows.n; i++) {
            fputs("{\"variant\": ", f);
            json_str(f, s[v].path);
            fprintf(f, ", \"doc_id\": %lld, \"target\": ", (long long)i);
            json_str(f, s[v].rows.val[2 * i]);
            fputs(", \"response\": ", f);
            json_str(f, s[v].rows.val[2 * i + 1]);
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
           (long long)s[0].rows.n);
    printf("%-32s %-17s %8s %9s %8s %8s\n", "responses", "filter", "correct", "accuracy",
           "stderr", "invalid");
    for (int v = 0; v < n_files; v++)
        for (int k = 0; k < M3_GSM8K_N_FILTER; k++)
            printf("%-32s %-17s %8lld %9.4f %8.4f %8lld\n", k ? "" : s[v].path,
                   m3_gsm8k_filter_name(k), (long long)s[v].n_correct[k], s[v].acc[k],
                   s[v].se[k], (long long)s[v].n_invalid[k]);
    if (n_files < 2) return;
    printf("\npaired against %s (exact McNemar, two-sided):\n", s[0].path);
    printf("%-32s %-17s %9s %9s %10s %8s\n", "responses", "filter", "only_ref", "only_this",
           "p", "changed");
    for (int v = 1; v < n_files; v++)
        for (int k = 0; k < M3_GSM8K_N_FILTER; k++)
            printf("%-32s %-17s %9lld %9lld %10.4g %8lld\n", k ? "" : s[v].path,
                   m3_gsm8k_filter_name(k), (long long)pr[v].mc[k].only_a,
                   (long long)pr[v].mc[k].only_b, pr[v].mc[k].p, (long long)pr[v].changed[k]);
}

static int run_responses(const char **files, int n_files, const char *json, const char *samples,
                         double min_acc) {
    scored s[MAX_FILES];
    paired pr[MAX_FILES];
    memset(s, 0, sizeof s);
    int rc = 2;
    for (int v = 0; v < n_files; v++)
        if (score_file(&s[v], files[v])) goto done;
    for (int v = 1; v < n_files; v++) {
        if (s[v].rows.n != s[0].rows.n) {
            m3_errorf(M3_ERR_FORMAT, "%s: %lld responses, %s has %lld; paired files must list "
                      "the same questions in the same order", files[v], (long long)s[v].rows.n,
                      files[0], (long long)s[0].rows.n);
            goto done;
        }
        for (int64_t i = 0; i < s[0].rows.n; i++)
            if (strcmp(s[v].rows.val[2 * i], s[0].rows.val[2 * i])) {
                m3_errorf(M3_ERR_FORMAT, "%s: item %lld: \"answer\" differs from %s's; paired "
                          "files must list the same questions in the same order", files[v],
                          (long long)i + 1, files[0]);
                goto done;
            }
        pr[v] = pair_with(&s[0], &s[v]);
    }
    if (json && write_json(json, s, n_files, pr)) goto done;
    if (samples && write_samples(samples, s, n_files)) goto done;
    print_table(s, n_files, pr);
    rc = 0;
    if (!isnan(min_acc))
        for (int v = 0; v < n_files; v++)
            if (!(s[v].acc[M3_GSM8K_STRICT] >= min_acc)) {
                printf("gate: %s strict-match accuracy %.4f < %.4f\n", files[v],
                       s[v].acc[M3_GSM8K_STRICT], min_acc);
                rc = 1;
            }
done:
    for (int v = 0; v < n_files; v++) scored_free(&s[v]);
    return rc == 2 ? m3_cli_fail(NULL) : rc;
}

/* ---- prompts (generation path) -------------------------------------------------------- */

static int write_prompts(const char *data, const char *fewshot, int k, int64_t limit,
                         const char *path) {
    m3_gsm8k_set test = {0}, train = {0};
    out_file o = {0};
    char *prompt = NULL;
    int rc = 2;
    if (m3_gsm8k_set_read(&test, data)) goto done;
    if (fewshot && m3_gsm8k_set_read(&train, fewshot)) goto done;
    /* without a separate few-shot file the shots come from the evaluated file itself, and
     * lm-eval then draws k+1 and drops the document being asked */
    const m3_gsm8k_set *pool = fewshot ? &train : &test;
    m3_pyrandom r;
    m3_pyrandom_seed(&r, M3_GSM8K_FEWSHOT_SEED);
    if (out_open(&o, path)) goto done;
    int64_t n = limit > 0 && limit < test.n ? limit : test.n;
    for (int64_t i = 0; i < n; i++) {
        int64_t idx[64];
        const m3_gsm8k_item *shots[64];
        if (m3_gsm8k_draw_shots(&r, pool, k, fewshot ? NULL : &test.items[i], idx)) {
            m3_error_context(M3_ERR_ARG, "%s", fewshot ? fewshot : data);
            goto done;
        }
        for (int j = 0; j < k; j++) shots[j] = &pool->items[idx[j]];
        prompt = m3_gsm8k_prompt(shots, k, test.items[i].question);
        if (!prompt) {
            m3_errorf(M3_ERR_NOMEM, "out of memory");
            goto done;
        }
        fprintf(o.f, "{\"doc_id\": %lld, \"shots\": [", (long long)i);
        for (int j = 0; j < k; j++) fprintf(o.f, "%s%lld", j ? ", " : "", (long long)idx[j]);
        fputs("], \"prompt\": ", o.f);
        json_str(o.f, prompt);
        fputs(", \"target\": ", o.f);
        json_str(o.f, test.items[i].answer);
        fputs("}\n", o.f);
        free(prompt);
        prompt = NULL;
    }
    if (out_commit(&o, true)) goto done;
    printf("wrote %lld prompts (%d-shot, shots from %s, sampler seed %d) to %s\n", (long long)n,
           k, fewshot ? fewshot : data, M3_GSM8K_FEWSHOT_SEED, path);
    rc = 0;
done:
    out_commit(&o, false);
    free(prompt);
    m3_gsm8k_set_free(&test);
    m3_gsm8k_set_free(&train);
    return rc ? m3_cli_fail(NULL) : 0;
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
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage_text, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "gsm8k"))
        return m3_cli_fail("eval: unknown task '%s' (only gsm8k)", argv[1]);
    const char *files[MAX_FILES];
    int n_files = 0;
    const char *json = NULL, *samples = NULL, *model = NULL, *data = NULL, *variants = NULL;
    const char *backend = "ref", *fewshot = NULL, *prompts = NULL;
    int64_t num_fewshot = 5, limit = 0;
    double min_acc = (double)NAN;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (a[0] != '-' || a[1] != '-')
            return m3_cli_fail("eval gsm8k: unexpected argument '%s' (see --help)", a);
        if (i + 1 >= argc) return m3_cli_fail("eval gsm8k: %s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--responses")) {
            if (n_files == MAX_FILES)
                return m3_cli_fail("eval gsm8k: at most %d --responses files", MAX_FILES);
            files[n_files++] = v;
        } else if (!strcmp(a, "--json")) {
            json = v;
        } else if (!strcmp(a, "--samples")) {
            samples = v;
        } else if (!strcmp(a, "--model")) {
            model = v;
        } else if (!strcmp(a, "--data")) {
            data = v;
        } else if (!strcmp(a, "--fewshot")) {
            fewshot = v;
        } else if (!strcmp(a, "--write-prompts")) {
            prompts = v;
        } else if (!strcmp(a, "--variants")) {
            variants = v;
            if (!v[0] || strstr(v, ",,") || v[0] == ',' || v[strlen(v) - 1] == ',')
                return m3_cli_fail("eval gsm8k: --variants '%s': expected a comma-separated "
                                   "list such as fp32,hf,mxfp4", v);
        } else if (!strcmp(a, "--backend")) {
            backend = v;
            if (strcmp(v, "ref") && strcmp(v, "gpu"))
                return m3_cli_fail("eval gsm8k: --backend '%s': expected ref or gpu", v);
        } else if (!strcmp(a, "--num-fewshot")) {
            if (!parse_i64(v, 0, 63, &num_fewshot))
                return m3_cli_fail("eval gsm8k: --num-fewshot '%s': expected 0..63", v);
        } else if (!strcmp(a, "--limit")) {
            if (!parse_i64(v, 1, INT64_MAX, &limit))
                return m3_cli_fail("eval gsm8k: --limit '%s': expected a positive integer", v);
        } else if (!strcmp(a, "--min-accuracy")) {
            char *end;
            min_acc = strtod(v, &end);
            if (end == v || *end || !(min_acc >= 0 && min_acc <= 1))
                return m3_cli_fail("eval gsm8k: --min-accuracy '%s': expected 0..1", v);
        } else {
            return m3_cli_fail("eval gsm8k: unknown option '%s' (see --help)", a);
        }
    }
    (void)backend;
    (void)variants;
    if (n_files) {
        if (model || data || prompts)
            return m3_cli_fail("eval gsm8k: --responses scores existing responses; it takes "
                               "no --model/--data/--write-prompts");
        return run_responses(files, n_files, json, samples, min_acc);
    }
    if (!data)
        return m3_cli_fail("eval gsm8k: need --responses FILE, or --model DIR --data FILE");
    if (prompts) return write_prompts(data, fewshot, (int)num_fewshot, limit, prompts);
    if (!model) return m3_cli_fail("eval gsm8k: --data needs --model DIR");
    return m3_cli_fail("eval gsm8k: generation needs the model forward, not in this build yet");
}
