/* compare/cmd_quantize.c: `m3 quantize`: write a Quark-format MXFP4 / MXFP8 copy of a dense
 * (bf16) checkpoint (docs/quantization.md, spec §5.10). Routed and shared expert linears
 * become X.weight (MXFP4: U8 [out, in/2], element 2i in the low nibble; MXFP8: F8_E4M3
 * [out, in]) + X.weight_scale (U8 e8m0 [out, in/32]), quantized by m3_qload_mx_weight: the
 * same function the reference's quantize-on-load uses, so reading the copy back gives the
 * weights `--experts mxfp4` makes, bit for bit. Every other tensor is copied unchanged
 * (name, dtype, shape, bytes). config.json gets a Quark quantization_config with the real
 * MXFP4 checkpoint's exclude globs. The output directory appears only when complete
 * (written as OUT.tmp, then renamed). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compare/cmd.h"
#include "ref/config.h"
#include "ref/qload.h"
#include "ref/st_write.h"
#include "ref/weights.h"

static const char usage[] =
    "usage: m3 quantize --model DIR --out DIR [--experts mxfp4|mxfp8]\n"
    "                   [--scale even|floor|rceil] [--round rne|rna] [--force]\n"
    "Writes a Quark-format copy of a dense checkpoint with the routed and shared experts\n"
    "quantized to MXFP4 (default) or MXFP8 (1x32 blocks along K, e8m0 scales; scale rule\n"
    "default even, Quark's), every other tensor copied unchanged, and config.json with the\n"
    "quantization_config. See docs/quantization.md.\n";

/* the files a quantized directory holds (what --force may replace) */
static const char *out_files[] = {"model.safetensors", "config.json", "generation_config.json"};

/* a routed or shared expert linear weight of the text model (canonical name) */
static bool is_expert_weight(const char *canon) {
    size_t n = strlen(canon);
    return !strncmp(canon, "language_model.model.layers.", 28) && n > 7 &&
           !strcmp(canon + n - 7, ".weight") &&
           (strstr(canon, ".block_sparse_moe.experts.") ||
            strstr(canon, ".block_sparse_moe.shared_experts."));
}

typedef struct {
    int64_t src; /* source tensor index (m3_weights_tensor_at) */
    int kind;    /* 0 copy, 1 quantized weight, 2 its scale */
} qentry;

typedef struct {
    m3_weights *w;
    const m3_variant *v;
    bool fp4;
    qentry *e;
    uint8_t *scale; /* the scale made with the last weight (entry kind 2 follows kind 1) */
    size_t scale_bytes;
} qctx;

static m3_status fill(void *vctx, int64_t i, uint8_t *buf, size_t nbytes) {
    qctx *c = vctx;
    const m3_tensor_info *ti = m3_weights_tensor_at(c->w, c->e[i].src);
    m3_tensor t;
    if (c->e[i].kind == 2) {
        M3_ASSERT(c->scale && nbytes == c->scale_bytes);
        memcpy(buf, c->scale, nbytes);
        return M3_OK;
    }
    M3_TRY(m3_weights_get(c->w, ti->canon, &t));
    if (c->e[i].kind == 0) {
        M3_ASSERT((int64_t)nbytes == ti->nbytes);
        memcpy(buf, t.data, nbytes);
        return M3_OK;
    }
    int rows = (int)ti->shape[0], cols = (int)ti->shape[1];
    float *f = malloc((size_t)rows * (size_t)cols * sizeof *f);
    free(c->scale);
    c->scale_bytes = (size_t)rows * (size_t)(cols / 32);
    c->scale = malloc(c->scale_bytes);
    if (!f || !c->scale) {
        free(f);
        return m3_errorf(M3_ERR_NOMEM, "out of memory");
    }
    m3_status s = m3_tensor_rows_f32(&t, 0, rows, f);
    if (!s) {
        memset(buf, 0, nbytes);
        m3_qload_mx_weight(buf, c->scale, f, rows, cols, c->fp4, c->v);
    }
    free(f);
    return s;
}

/* config.json text with quantization_config inserted as the last top-level member */
static char *quant_config(const char *src, bool fp4, const m3_variant *v) {
    const char *end = strrchr(src, '}');
    if (!end) return NULL;
    const char *scale[] = {"floor", "even", "rceil"};
    char w[1024], in[1024];
    snprintf(w, sizeof w,
             "{\"dtype\": \"%s\", \"qscheme\": \"per_group\", \"group_size\": 32, \"ch_axis\": -1, "
             "\"scale_format\": \"e8m0\", \"is_dynamic\": false, \"round_method\": \"%s\", "
             "\"scale_calculation_mode\": \"%s\"}",
             fp4 ? "fp4" : "fp8_e4m3",
             v->experts_round == M3_MX_ROUND_RNA ? "half_away_from_zero" : "half_even",
             scale[v->experts_scale]);
    /* activations dynamic (A4W4 / A8W8), aiter's rceil */
    snprintf(in, sizeof in,
             "{\"dtype\": \"%s\", \"qscheme\": \"per_group\", \"group_size\": 32, \"ch_axis\": -1, "
             "\"scale_format\": \"e8m0\", \"is_dynamic\": true, \"round_method\": \"half_even\", "
             "\"scale_calculation_mode\": \"rceil\"}",
             fp4 ? "fp4" : "fp8_e4m3");
    const char *fmt =
        ",\n  \"quantization_config\": {\n"
        "    \"quant_method\": \"quark\",\n"
        "    \"global_quant_config\": {\"weight\": %s,\n      \"input_tensors\": %s},\n"
        "    \"exclude\": [\"*lm_head\", \"*vision_tower*\", \"*multi_modal_projector*\", "
        "\"*patch_merge_mlp*\", \"*block_sparse_moe.gate\", \"*self_attn*\", \"*mlp.gate_proj\", "
        "\"*mlp.up_proj\", \"*mlp.down_proj\"],\n"
        "    \"layer_quant_config\": {}, \"layer_type_quant_config\": {},\n"
        "    \"export\": {\"weight_format\": \"real_quantized\", \"pack_method\": \"reorder\"},\n"
        "    \"producer\": \"m3 quantize\"\n  }\n";
    size_t head = (size_t)(end - src);
    /* drop trailing whitespace before the final brace */
    while (head > 0 && strchr(" \t\r\n", src[head - 1]))
        head--;
    size_t cap = head + strlen(fmt) + strlen(w) + strlen(in) + 16;
    char *out = malloc(cap);
    if (!out) return NULL;
    memcpy(out, src, head);
    int k = snprintf(out + head, cap - head, fmt, w, in);
    snprintf(out + head + (size_t)k, cap - head - (size_t)k, "}\n");
    return out;
}

static m3_status write_file(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return m3_errorf(M3_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    bool ok = fwrite(text, 1, n, f) == n;
    if (fclose(f) != 0) ok = false;
    return ok ? M3_OK : m3_errorf(M3_ERR_IO, "%s: write error", path);
}

static m3_status copy_file(const char *from, const char *to) {
    FILE *f = fopen(from, "rb");
    if (!f) return M3_OK; /* optional file */
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    bool big = !feof(f);
    fclose(f);
    if (big) return m3_errorf(M3_ERR_FORMAT, "%s: larger than 64 KiB", from);
    return write_file(to, buf, n);
}

/* M3_OK when `dir` does not exist, or is a directory holding nothing but the files this
 * command writes (out_files): only such a directory may be replaced. Checked before
 * anything is deleted, so a refused --force leaves every file where it was. */
static m3_status check_replaceable(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) return M3_OK;
    if (!S_ISDIR(st.st_mode))
        return m3_errorf(M3_ERR_IO, "%s: not a directory; only a directory written by m3 "
                                    "quantize is replaced", dir);
    DIR *d = opendir(dir);
    if (!d) return m3_errorf(M3_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *e;
    m3_status s = M3_OK;
    while (!s && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        bool ours = false;
        for (size_t i = 0; i < sizeof out_files / sizeof out_files[0]; i++)
            ours |= !strcmp(e->d_name, out_files[i]);
        if (!ours)
            s = m3_errorf(M3_ERR_IO, "%s: holds '%s'; only a directory written by m3 quantize "
                                     "is replaced",
                          dir, e->d_name);
    }
    closedir(d);
    return s;
}

/* remove a directory holding only our files; M3_OK when it does not exist */
static m3_status remove_out(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) return M3_OK;
    M3_TRY(check_replaceable(dir));
    char p[4200];
    for (size_t i = 0; i < sizeof out_files / sizeof out_files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, out_files[i]);
        unlink(p);
    }
    if (rmdir(dir) != 0)
        return m3_errorf(M3_ERR_IO,
                         "%s: cannot replace it (%s; only a directory written by m3 "
                         "quantize is replaced)",
                         dir, strerror(errno));
    return M3_OK;
}

int m3_cmd_quantize(int argc, char **argv) {
    const char *model = NULL, *out = NULL;
    bool force = false;
    m3_variant v;
    m3_variant_default(&v);
    v.experts = M3_EXPERTS_MXFP4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--force")) {
            force = true;
            continue;
        }
        if (i + 1 >= argc) return m3_cli_fail("quantize: option %s needs a value", a);
        const char *val = argv[++i];
        m3_status s = M3_OK;
        if (!strcmp(a, "--model"))
            model = val;
        else if (!strcmp(a, "--out"))
            out = val;
        else if (!strcmp(a, "--experts")) {
            if (strcmp(val, "mxfp4") && strcmp(val, "mxfp8"))
                return m3_cli_fail("quantize: --experts must be mxfp4 or mxfp8, got '%s'", val);
            s = m3_variant_set(&v, "experts", val);
        } else if (!strcmp(a, "--scale"))
            s = m3_variant_set(&v, "experts_scale", val);
        else if (!strcmp(a, "--round"))
            s = m3_variant_set(&v, "experts_round", val);
        else
            return m3_cli_fail("quantize: unknown option '%s' (see m3 quantize --help)", a);
        if (s) return m3_cli_fail("quantize: %s", m3_last_error());
    }
    if (!model || !out) return m3_cli_fail("quantize: --model DIR and --out DIR are required");
    if (!out[0]) return m3_cli_fail("quantize: --out: empty directory name");
    const bool fp4 = v.experts == M3_EXPERTS_MXFP4;

    m3_config *cfg = NULL;
    m3_weights *w = NULL;
    m3_st_writer *sw = NULL;
    qctx c = {.v = &v, .fp4 = fp4};
    char tmp[4096], path[4200], from[4200];
    char *cj = NULL;
    bool made_tmp = false;
    struct stat st;
    m3_status s = m3_config_load(&cfg, model);
    if (!s && cfg->quant.method != M3_QUANT_NONE)
        s = m3_errorf(M3_ERR_UNSUPPORTED, "%s: already quantized (quantization_config present)",
                      cfg->path);
    if (!s) s = m3_weights_open(&w, model);
    if (!s) s = m3_weights_check(w, cfg, NULL);
    if (!s && !force && stat(out, &st) == 0)
        s = m3_errorf(M3_ERR_IO, "%s exists (use --force to replace it)", out);
    /* --force replaces only an earlier output, and never the checkpoint being read */
    struct stat st_model;
    if (!s && stat(out, &st) == 0 && stat(model, &st_model) == 0 && st.st_dev == st_model.st_dev &&
        st.st_ino == st_model.st_ino)
        s = m3_errorf(M3_ERR_ARG, "%s: --out is the --model directory", out);
    if (!s && force) s = check_replaceable(out);
    if (!s) s = m3_st_writer_create(&sw);
    int64_t nt = w ? m3_weights_n_tensors(w) : 0, n_q = 0;
    if (!s && !(c.e = calloc((size_t)(2 * nt + 1), sizeof *c.e)))
        s = m3_errorf(M3_ERR_NOMEM, "out of memory");
    c.w = w;
    for (int64_t i = 0; !s && i < nt; i++) {
        const m3_tensor_info *ti = m3_weights_tensor_at(w, i);
        int64_t k = m3_st_count(sw);
        if (!is_expert_weight(ti->canon)) {
            c.e[k] = (qentry){i, 0};
            s = m3_st_add(sw, ti->name, ti->dtype, ti->rank, ti->shape, (size_t)ti->nbytes);
            continue;
        }
        if (ti->rank != 2 ||
            (ti->dtype != M3_DT_BF16 && ti->dtype != M3_DT_F32 && ti->dtype != M3_DT_F16)) {
            s = m3_errorf(M3_ERR_FORMAT, "%s: tensor %s is not a dense 2-D weight", model,
                          ti->name);
            break;
        }
        int64_t rows = ti->shape[0], cols = ti->shape[1];
        if (cols % 32) {
            s = m3_errorf(M3_ERR_SHAPE,
                          "%s: tensor %s has input width %lld, not a multiple of 32: the Quark "
                          "layout stores whole 1x32 blocks",
                          model, ti->name, (long long)cols);
            break;
        }
        int64_t wsh[2] = {rows, fp4 ? cols / 2 : cols}, ssh[2] = {rows, cols / 32};
        char sname[1100];
        size_t nl = strlen(ti->name);
        snprintf(sname, sizeof sname, "%.*s_scale", (int)nl, ti->name); /* X.weight_scale */
        c.e[k] = (qentry){i, 1};
        s = m3_st_add(sw, ti->name, fp4 ? M3_DT_U8 : M3_DT_F8_E4M3, 2, wsh,
                      (size_t)(wsh[0] * wsh[1]));
        c.e[k + 1] = (qentry){i, 2};
        if (!s) s = m3_st_add(sw, sname, M3_DT_U8, 2, ssh, (size_t)(ssh[0] * ssh[1]));
        n_q++;
    }
    if (!s && n_q == 0) s = m3_errorf(M3_ERR_MISSING, "%s: no expert weights to quantize", model);
    if (!s && snprintf(tmp, sizeof tmp, "%s.tmp", out) >= (int)sizeof tmp)
        s = m3_errorf(M3_ERR_ARG, "--out: path too long");
    if (!s) s = remove_out(tmp); /* a leftover of an interrupted run */
    if (!s && mkdir(tmp, 0777) != 0)
        s = m3_errorf(M3_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    made_tmp = !s;
    if (!s) {
        static const char *const meta[][2] = {{"format", "pt"}, {"producer", "m3 quantize"}};
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        s = m3_st_write(sw, path, meta, 2, fill, &c);
    }
    if (!s && !(cj = quant_config(cfg->json_text, fp4, &v)))
        s = m3_errorf(M3_ERR_FORMAT, "%s: not a JSON object", cfg->path);
    if (!s) {
        snprintf(path, sizeof path, "%s/config.json", tmp);
        s = write_file(path, cj, strlen(cj));
    }
    if (!s) {
        snprintf(from, sizeof from, "%s/generation_config.json", model);
        snprintf(path, sizeof path, "%s/generation_config.json", tmp);
        s = copy_file(from, path);
    }
    if (!s && force) s = remove_out(out);
    if (!s && rename(tmp, out) != 0)
        s = m3_errorf(M3_ERR_IO, "%s: cannot rename into place: %s", out, strerror(errno));
    if (s && made_tmp) remove_out(tmp);
    if (!s)
        printf("quantized %lld expert linears to %s (scale %s): %s\n", (long long)n_q,
               fp4 ? "MXFP4" : "MXFP8",
               v.experts_scale == M3_MX_SCALE_EVEN    ? "even"
               : v.experts_scale == M3_MX_SCALE_FLOOR ? "floor"
                                                      : "rceil",
               out);
    free(cj);
    free(c.e);
    free(c.scale);
    m3_st_writer_free(sw);
    m3_weights_close(w);
    m3_config_free(cfg);
    return s ? m3_cli_fail(NULL) : 0;
}
