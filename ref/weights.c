/* ref/weights.c: see weights.h. */
#include "ref/weights.h"
#include "ref/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ref/json.h"
#include "ref/num/bf16.h"

#define HEADER_MAX ((int64_t)100 << 20) /* the safetensors library's own limit */
#define NAME_MAX_LEN 1024

typedef struct {
    char *path;
    int64_t size;
    int64_t data_off; /* 8 + header length */
    void *map;        /* NULL until first access */
} wfile;

struct m3_weights {
    char *dir;
    char *index_path; /* NULL for a single file */
    int64_t index_total;
    int n_files;
    wfile *files;
    int64_t n, cap;
    m3_tensor_info *t; /* sorted by canon after open */
    int64_t bytes;
    int n_warn;
    char **warn;
    pthread_mutex_t mu; /* guards lazy mapping */
    m3_json *index_root; /* the parsed index, only during open */
};

static void w_warn(m3_weights *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void w_warn(m3_weights *w, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char **nw = realloc(w->warn, (size_t)(w->n_warn + 1) * sizeof *nw);
    if (!nw) return;
    w->warn = nw;
    if ((w->warn[w->n_warn] = strdup(buf))) w->n_warn++;
}

/* ---- canonical names ------------------------------------------------------------------- */

static bool starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static bool is_num(const char *s) {
    if (!*s) return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return false;
    return true;
}

/* Map a stored or alias name to the canonical original name (weights.h). Returns false when
 * the name is too long or has too many components. */
static bool canon_name(const char *in, char *out, size_t cap) {
    char buf[NAME_MAX_LEN + 32];
    const char *pre = "", *rest = in;
    if (starts(in, "model.language_model.")) {
        pre = "language_model.model.";
        rest = in + strlen("model.language_model.");
    } else if (starts(in, "model.layers.") || starts(in, "model.embed_tokens.") ||
               starts(in, "model.norm.") || starts(in, "lm_head.")) {
        pre = "language_model."; /* text-only checkpoint (ForCausalLM) */
    }
    if (strlen(rest) > NAME_MAX_LEN) return false;
    snprintf(buf, sizeof buf, "%s%s", pre, rest);
    enum { MAXTOK = 64 };
    char *tok[MAXTOK];
    int nt = 0;
    for (char *p = buf, *s; (s = strsep(&p, "."));) {
        if (nt == MAXTOK) return false;
        tok[nt++] = s;
    }
    for (int i = 0; i < nt; i++) {
        const char *nx = i + 1 < nt ? tok[i + 1] : "";
        if (!strcmp(tok[i], "block_sparse_moe") && i >= 2 && is_num(tok[i - 1]) &&
            !strcmp(tok[i - 2], "layers") &&
            (!strcmp(nx, "gate_proj") || !strcmp(nx, "up_proj") || !strcmp(nx, "down_proj") ||
             !strcmp(nx, "fc1") || !strcmp(nx, "fc2"))) {
            tok[i] = "mlp"; /* transformers 5.17 save_pretrained quirk (dense MLP, vision MLP) */
        } else if (!strcmp(tok[i], "experts") && i + 2 < nt && is_num(nx)) {
            const char *m = tok[i + 2];
            if (!strcmp(m, "gate_proj")) tok[i + 2] = "w1";
            else if (!strcmp(m, "down_proj")) tok[i + 2] = "w2";
            else if (!strcmp(m, "up_proj")) tok[i + 2] = "w3";
        } else if (!strcmp(tok[i], "indexer") && i >= 1 && !strcmp(tok[i - 1], "self_attn") &&
                   i + 1 < nt) {
            const char *m = nx;
            const char *r = !strcmp(m, "q_proj")   ? "index_q_proj"
                            : !strcmp(m, "k_proj") ? "index_k_proj"
                            : !strcmp(m, "q_norm") ? "index_q_norm"
                            : !strcmp(m, "k_norm") ? "index_k_norm"
                                                   : NULL;
            if (r) {
                tok[i + 1] = (char *)r;
                tok[i] = NULL; /* dropped */
            }
        }
    }
    if (nt > 0 && tok[nt - 1] && !strcmp(tok[nt - 1], "weight_scale_inv"))
        tok[nt - 1] = "weight_scale";
    size_t len = 0;
    bool first = true;
    for (int i = 0; i < nt; i++) {
        if (!tok[i]) continue;
        size_t k = strlen(tok[i]);
        if (len + k + 2 > cap) return false;
        if (!first) out[len++] = '.';
        memcpy(out + len, tok[i], k);
        len += k;
        first = false;
    }
    out[len] = 0;
    return true;
}

/* ---- header parsing -------------------------------------------------------------------- */

static m3_status push_tensor(m3_weights *w, m3_tensor_info **out) {
    if (w->n == w->cap) {
        int64_t nc = w->cap ? w->cap * 2 : 1024;
        m3_tensor_info *nt = realloc(w->t, (size_t)nc * sizeof *nt);
        if (!nt) return m3_errorf(M3_ERR_NOMEM, "out of memory reading safetensors headers");
        w->t = nt;
        w->cap = nc;
    }
    *out = &w->t[w->n++];
    memset(*out, 0, sizeof **out);
    return M3_OK;
}

typedef struct {
    int64_t begin, end;
    const char *name;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static void fmt_shape(char *buf, size_t cap, const int64_t *shape, int rank) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int i = 0; i < rank && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* Validate one header entry and append it. */
static m3_status parse_entry(m3_weights *w, int fi, const char *path, const m3_json *e,
                             int64_t data_len) {
    const char *name = m3_json_key(e);
    if (!m3_json_is_object(e))
        return m3_errorf(M3_ERR_FORMAT, "%s: header entry '%.200s' is not an object", path, name);
    if (!name[0]) return m3_errorf(M3_ERR_FORMAT, "%s: header has an empty tensor name", path);
    if (strlen(name) > NAME_MAX_LEN)
        return m3_errorf(M3_ERR_FORMAT, "%s: tensor name of %zu bytes is too long", path,
                         strlen(name));
    const char *dts = m3_json_get_str(e, "dtype", NULL);
    if (!dts) return m3_errorf(M3_ERR_FORMAT, "%s: tensor '%.200s': dtype missing", path, name);
    m3_dtype dt = m3_dtype_from_name(dts);
    /* F8_E4M3FNUZ is an in-memory kind of ours, not a safetensors dtype */
    if (dt == M3_DT_INVALID || dt == M3_DT_F8_E4M3FNUZ)
        return m3_errorf(M3_ERR_FORMAT, "%s: tensor '%.200s': unknown dtype '%.32s'", path, name,
                         dts);
    const m3_json *sh = m3_json_get(e, "shape");
    if (!m3_json_is_array(sh))
        return m3_errorf(M3_ERR_FORMAT, "%s: tensor '%.200s': shape missing or not a list", path,
                         name);
    int rank = m3_json_size(sh);
    if (rank > M3_MAX_RANK)
        return m3_errorf(M3_ERR_FORMAT, "%s: tensor '%.200s': rank %d exceeds %d", path, name,
                         rank, M3_MAX_RANK);
    int64_t shape[M3_MAX_RANK];
    int i = 0;
    for (const m3_json *d = m3_json_first(sh); d; d = m3_json_next(d), i++) {
        if (!m3_json_int(d, &shape[i]) || shape[i] < 0)
            return m3_errorf(M3_ERR_FORMAT,
                             "%s: tensor '%.200s': shape[%d] is not a non-negative integer",
                             path, name, i);
    }
    int64_t numel = m3_shape_numel(shape, rank);
    int bits = m3_dtype_bits(dt);
    if (numel < 0 || numel > INT64_MAX / 8)
        return m3_errorf(M3_ERR_FORMAT, "%s: tensor '%.200s': element count overflows", path,
                         name);
    if ((numel * bits) % 8)
        return m3_errorf(M3_ERR_FORMAT, "%s: tensor '%.200s': %lld %s elements are not whole bytes",
                         path, name, (long long)numel, dts);
    int64_t nbytes = numel * bits / 8;
    const m3_json *off = m3_json_get(e, "data_offsets");
    int64_t b, en;
    if (m3_json_size(off) != 2 || !m3_json_is_array(off) || !m3_json_int(m3_json_at(off, 0), &b) ||
        !m3_json_int(m3_json_at(off, 1), &en))
        return m3_errorf(M3_ERR_FORMAT,
                         "%s: tensor '%.200s': data_offsets must be two integers [begin, end]",
                         path, name);
    if (b < 0 || en < b || en > data_len)
        return m3_errorf(M3_ERR_FORMAT,
                         "%s: tensor '%.200s': data_offsets [%lld, %lld] outside the data region "
                         "of %lld bytes",
                         path, name, (long long)b, (long long)en, (long long)data_len);
    if (en - b != nbytes) {
        char s[160];
        fmt_shape(s, sizeof s, shape, rank);
        return m3_errorf(M3_ERR_FORMAT,
                         "%s: tensor '%.200s': %lld bytes in data_offsets, but %s %s needs %lld",
                         path, name, (long long)(en - b), dts, s, (long long)nbytes);
    }
    m3_tensor_info *t = NULL;
    M3_TRY(push_tensor(w, &t));
    char cn[NAME_MAX_LEN + 64];
    t->name = strdup(name);
    bool ok = canon_name(name, cn, sizeof cn);
    t->canon = ok ? strdup(cn) : NULL;
    if (!t->name || !t->canon) {
        free((void *)t->name);
        free((void *)t->canon);
        w->n--;
        return ok ? m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path)
                  : m3_errorf(M3_ERR_FORMAT, "%s: tensor name '%.200s' is malformed", path, name);
    }
    t->dtype = dt;
    t->rank = rank;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
    t->numel = numel;
    t->params = numel;
    t->nbytes = nbytes;
    t->file = fi;
    t->offset = w->files[fi].data_off + b;
    return M3_OK;
}

/* Read and validate the header of shard fi; append its tensors. */
static m3_status load_shard(m3_weights *w, int fi) {
    wfile *f = &w->files[fi];
    const char *path = f->path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return m3_errorf(M3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    m3_status s = M3_OK;
    char *hdr = NULL;
    m3_json *root = NULL;
    span *sp = NULL;
    int64_t first = w->n;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = m3_errorf(M3_ERR_IO, "%s: not a regular file", path);
        goto done;
    }
    f->size = st.st_size;
    unsigned char lb[8];
    if (f->size < 8 || pread(fd, lb, 8, 0) != 8) {
        s = m3_errorf(M3_ERR_FORMAT, "%s: %lld bytes is too short for a safetensors header", path,
                      (long long)f->size);
        goto done;
    }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | lb[i]; /* little-endian u64 */
    if (hl > (uint64_t)(f->size - 8)) {
        s = m3_errorf(M3_ERR_FORMAT, "%s: header length %llu exceeds file size %lld", path,
                      (unsigned long long)hl, (long long)f->size);
        goto done;
    }
    if ((int64_t)hl > HEADER_MAX) {
        s = m3_errorf(M3_ERR_FORMAT, "%s: header length %llu exceeds the %lld-byte limit", path,
                      (unsigned long long)hl, (long long)HEADER_MAX);
        goto done;
    }
    if (hl < 2) {
        s = m3_errorf(M3_ERR_FORMAT, "%s: header length %llu is too short for a JSON object",
                      path, (unsigned long long)hl);
        goto done;
    }
    hdr = malloc(hl);
    if (!hdr) {
        s = m3_errorf(M3_ERR_NOMEM, "%s: out of memory for a %llu-byte header", path,
                      (unsigned long long)hl);
        goto done;
    }
    for (size_t got = 0; got < hl;) {
        ssize_t k = pread(fd, hdr + got, hl - got, (off_t)(8 + got));
        if (k <= 0) {
            s = m3_errorf(M3_ERR_IO, "%s: read error in the header", path);
            goto done;
        }
        got += (size_t)k;
    }
    char what[4200];
    snprintf(what, sizeof what, "%s: header", path);
    s = m3_json_parse(&root, hdr, hl, what);
    if (s) goto done;
    free(hdr);
    hdr = NULL;
    if (!m3_json_is_object(root)) {
        s = m3_errorf(M3_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    f->data_off = 8 + (int64_t)hl;
    int64_t data_len = f->size - f->data_off;
    for (const m3_json *e = m3_json_first(root); e; e = m3_json_next(e)) {
        if (!strcmp(m3_json_key(e), "__metadata__")) {
            if (!m3_json_is_object(e)) {
                s = m3_errorf(M3_ERR_FORMAT, "%s: __metadata__ is not an object", path);
                goto done;
            }
            continue;
        }
        s = parse_entry(w, fi, path, e, data_len);
        if (s) goto done;
    }
    /* overlaps: sort this shard's spans by begin; empty tensors may share an offset */
    int64_t cnt = w->n - first;
    if (cnt > 1) {
        sp = malloc((size_t)cnt * sizeof *sp);
        if (!sp) {
            s = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        for (int64_t i = 0; i < cnt; i++) {
            const m3_tensor_info *t = &w->t[first + i];
            sp[i].begin = t->offset;
            sp[i].end = t->offset + t->nbytes;
            sp[i].name = t->name;
        }
        qsort(sp, (size_t)cnt, sizeof *sp, span_cmp);
        int64_t prev = 0;
        const char *pn = NULL;
        for (int64_t i = 0; i < cnt; i++) {
            if (sp[i].end == sp[i].begin) continue;
            if (pn && sp[i].begin < prev) {
                s = m3_errorf(M3_ERR_FORMAT, "%s: tensors '%.200s' and '%.200s' overlap", path,
                              pn, sp[i].name);
                goto done;
            }
            prev = sp[i].end;
            pn = sp[i].name;
        }
    }
done:
    free(sp);
    free(hdr);
    m3_json_free(root);
    close(fd);
    return s;
}

static int canon_cmp(const void *a, const void *b) {
    const m3_tensor_info *x = a, *y = b;
    return strcmp(x->canon, y->canon);
}

static const m3_tensor_info *find_canon(const m3_weights *w, const char *canon) {
    int64_t lo = 0, hi = w->n - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(w->t[mid].canon, canon);
        if (!c) return &w->t[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

const m3_tensor_info *m3_weights_find(const m3_weights *w, const char *name) {
    char cn[NAME_MAX_LEN + 64];
    if (!canon_name(name, cn, sizeof cn)) return NULL;
    return find_canon(w, cn);
}

static m3_status add_file(m3_weights *w, const char *path) {
    wfile *nf = realloc(w->files, (size_t)(w->n_files + 1) * sizeof *nf);
    if (!nf) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    w->files = nf;
    memset(&nf[w->n_files], 0, sizeof *nf);
    nf[w->n_files].path = strdup(path);
    if (!nf[w->n_files].path) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    w->n_files++;
    return M3_OK;
}

static int str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sharded: read the index, open the shards it names, cross-check the weight_map. */
static m3_status open_index(m3_weights *w, const char *index_path) {
    m3_json *root = NULL;
    M3_TRY(m3_json_parse_file(&root, index_path, (size_t)64 << 20, NULL, NULL));
    m3_status s = M3_OK;
    const char **names = NULL;
    const m3_json *wm = m3_json_get(root, "weight_map");
    if (!m3_json_is_object(root) || !m3_json_is_object(wm)) {
        s = m3_errorf(M3_ERR_FORMAT, "%s: no weight_map object", index_path);
        goto done;
    }
    const m3_json *md = m3_json_get(root, "metadata");
    const m3_json *ts = m3_json_get(md, "total_size");
    w->index_total = -1;
    if (ts && !m3_json_int(ts, &w->index_total)) {
        s = m3_errorf(M3_ERR_FORMAT, "%s: metadata.total_size is not an integer", index_path);
        goto done;
    }
    int nm = m3_json_size(wm);
    if (nm == 0) {
        s = m3_errorf(M3_ERR_FORMAT, "%s: weight_map is empty", index_path);
        goto done;
    }
    names = malloc((size_t)nm * sizeof *names);
    if (!names) {
        s = m3_errorf(M3_ERR_NOMEM, "out of memory");
        goto done;
    }
    int k = 0;
    for (const m3_json *e = m3_json_first(wm); e; e = m3_json_next(e)) {
        const char *fn = m3_json_str(e);
        if (!fn || !fn[0] || strchr(fn, '/') || !strcmp(fn, ".") || !strcmp(fn, "..") ||
            strlen(fn) > 255) {
            s = m3_errorf(M3_ERR_FORMAT,
                          "%s: weight_map['%.200s'] must be a plain file name in the model "
                          "directory",
                          index_path, m3_json_key(e));
            goto done;
        }
        names[k++] = fn;
    }
    qsort(names, (size_t)nm, sizeof *names, str_cmp);
    char p[4400];
    for (int i = 0; i < nm; i++) {
        if (i && !strcmp(names[i], names[i - 1])) continue;
        snprintf(p, sizeof p, "%s/%s", w->dir, names[i]);
        if ((s = add_file(w, p))) goto done;
    }
    for (int i = 0; i < w->n_files; i++)
        if ((s = load_shard(w, i))) goto done;
done:
    free(names);
    if (s == M3_OK)
        w->index_root = root; /* cross-checked against the shards in check_index() */
    else
        m3_json_free(root);
    return s;
}

/* Every tensor listed in weight_map must be in its shard (after finish(): lookups need the
 * sorted table). Frees the index tree. */
static m3_status check_index(m3_weights *w) {
    m3_status s = M3_OK;
    const m3_json *wm = m3_json_get(w->index_root, "weight_map");
    const char *index_path = w->index_path;
    int64_t listed_found = 0;
    for (const m3_json *e = m3_json_first(wm); e; e = m3_json_next(e)) {
        const char *tn = m3_json_key(e);
        const m3_tensor_info *t = m3_weights_find(w, tn);
        const char *fn = m3_json_str(e);
        size_t dl = strlen(w->dir);
        bool ok = t && !strcmp(t->name, tn) && !strcmp(w->files[t->file].path + dl + 1, fn);
        if (!ok) {
            s = m3_errorf(M3_ERR_FORMAT, "%s: tensor '%.200s' listed in weight_map is not in %s",
                          index_path, tn, fn);
            break;
        }
        listed_found++;
    }
    if (!s && listed_found < w->n)
        w_warn(w, "%s: %lld tensors in the shards are not listed in weight_map", index_path,
               (long long)(w->n - listed_found));
    m3_json_free(w->index_root);
    w->index_root = NULL;
    return s;
}

static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool ends(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

/* After all shards: sort by canonical name, refuse duplicates, set logical param counts. */
static m3_status finish(m3_weights *w) {
    if (w->n == 0)
        return m3_errorf(M3_ERR_FORMAT, "%s: the checkpoint holds no tensors",
                         w->n_files == 1 ? w->files[0].path : w->dir);
    qsort(w->t, (size_t)w->n, sizeof *w->t, canon_cmp);
    w->bytes = 0;
    for (int64_t i = 0; i < w->n; i++) {
        w->bytes += w->t[i].nbytes;
        if (i && !strcmp(w->t[i].canon, w->t[i - 1].canon)) {
            if (!strcmp(w->t[i].name, w->t[i - 1].name))
                return m3_errorf(M3_ERR_FORMAT, "%s: tensor '%.200s' is stored twice",
                                 w->files[w->t[i].file].path, w->t[i].name);
            return m3_errorf(M3_ERR_FORMAT,
                             "%s: tensors '%.200s' and '%.200s' are the same tensor under "
                             "aliases",
                             w->files[w->t[i].file].path, w->t[i - 1].name, w->t[i].name);
        }
    }
    /* MX scales are not parameters; an MXFP4-packed U8 weight holds two per byte */
    char buf[NAME_MAX_LEN + 64];
    for (int64_t i = 0; i < w->n; i++) {
        m3_tensor_info *t = &w->t[i];
        if (!ends(t->canon, ".weight_scale")) continue;
        t->params = 0;
        snprintf(buf, sizeof buf, "%.*s", (int)(strlen(t->canon) - strlen("_scale")), t->canon);
        m3_tensor_info *wt = (m3_tensor_info *)find_canon(w, buf);
        if (wt && wt->dtype == M3_DT_U8) wt->params = wt->numel * 2;
    }
    return M3_OK;
}

m3_status m3_weights_open(m3_weights **out, const char *model_dir) {
    *out = NULL;
    m3_weights *w = calloc(1, sizeof *w);
    if (!w) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&w->mu, NULL);
    w->index_total = -1;
    m3_status s = M3_OK;
    char p[4400];
    struct stat st;
    if (stat(model_dir, &st) != 0) {
        s = m3_errorf(M3_ERR_IO, "%s: no such file or directory", model_dir);
        goto done;
    }
    if (S_ISDIR(st.st_mode)) {
        size_t n = strlen(model_dir);
        while (n > 1 && model_dir[n - 1] == '/') n--;
        w->dir = strndup(model_dir, n);
        if (!w->dir) {
            s = m3_errorf(M3_ERR_NOMEM, "out of memory");
            goto done;
        }
        snprintf(p, sizeof p, "%s/model.safetensors", w->dir);
        if (is_file(p)) {
            if (!(s = add_file(w, p))) s = load_shard(w, 0);
        } else {
            snprintf(p, sizeof p, "%s/model.safetensors.index.json", w->dir);
            if (!is_file(p)) {
                s = m3_errorf(M3_ERR_MISSING,
                              "%s: no model.safetensors or model.safetensors.index.json",
                              w->dir);
                goto done;
            }
            w->index_path = strdup(p);
            s = w->index_path ? open_index(w, p) : m3_errorf(M3_ERR_NOMEM, "out of memory");
        }
    } else {
        const char *sl = strrchr(model_dir, '/');
        w->dir = sl ? strndup(model_dir, (size_t)(sl - model_dir)) : strdup(".");
        if (!w->dir) {
            s = m3_errorf(M3_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (ends(model_dir, ".json")) {
            w->index_path = strdup(model_dir);
            s = w->index_path ? open_index(w, model_dir) : m3_errorf(M3_ERR_NOMEM, "out of memory");
        } else {
            if (!(s = add_file(w, model_dir))) s = load_shard(w, 0);
        }
    }
    if (!s) s = finish(w);
    if (!s && w->index_root) s = check_index(w);
done:
    if (s) {
        m3_weights_close(w);
        return s;
    }
    *out = w;
    return M3_OK;
}

void m3_weights_close(m3_weights *w) {
    if (!w) return;
    for (int i = 0; i < w->n_files; i++) {
        if (w->files[i].map) munmap(w->files[i].map, (size_t)w->files[i].size);
        free(w->files[i].path);
    }
    free(w->files);
    for (int64_t i = 0; i < w->n; i++) {
        free((void *)w->t[i].name);
        free((void *)w->t[i].canon);
    }
    free(w->t);
    for (int i = 0; i < w->n_warn; i++) free(w->warn[i]);
    free(w->warn);
    free(w->dir);
    free(w->index_path);
    m3_json_free(w->index_root);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

int m3_weights_n_files(const m3_weights *w) { return w->n_files; }
const char *m3_weights_file_path(const m3_weights *w, int i) {
    M3_ASSERT(i >= 0 && i < w->n_files);
    return w->files[i].path;
}
int64_t m3_weights_n_tensors(const m3_weights *w) { return w->n; }
const m3_tensor_info *m3_weights_tensor_at(const m3_weights *w, int64_t i) {
    M3_ASSERT(i >= 0 && i < w->n);
    return &w->t[i];
}
int64_t m3_weights_bytes(const m3_weights *w) { return w->bytes; }
int64_t m3_weights_index_total_size(const m3_weights *w) { return w->index_total; }
const char *m3_weights_index_path(const m3_weights *w) { return w->index_path; }
int m3_weights_n_warnings(const m3_weights *w) { return w->n_warn; }
const char *m3_weights_warning(const m3_weights *w, int i) {
    M3_ASSERT(i >= 0 && i < w->n_warn);
    return w->warn[i];
}

static m3_status map_file(m3_weights *w, int fi) {
    m3_status s = M3_OK;
    pthread_mutex_lock(&w->mu);
    wfile *f = &w->files[fi];
    if (!f->map) {
        int fd = open(f->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            s = m3_errorf(M3_ERR_IO, "%s: cannot open: %s", f->path, strerror(errno));
        } else {
            struct stat st;
            if (fstat(fd, &st) != 0 || st.st_size != f->size) {
                s = m3_errorf(M3_ERR_IO, "%s: file changed size since its header was read",
                              f->path);
            } else {
                void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE | MAP_NORESERVE,
                               fd, 0);
                if (m == MAP_FAILED)
                    s = m3_errorf(M3_ERR_IO, "%s: mmap failed: %s", f->path, strerror(errno));
                else
                    f->map = m;
            }
            close(fd);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return s;
}

static m3_status view(m3_weights *w, const m3_tensor_info *ti, m3_tensor *t) {
    M3_TRY(map_file(w, ti->file));
    memset(t, 0, sizeof *t);
    t->dtype = ti->dtype;
    t->rank = ti->rank;
    memcpy(t->shape, ti->shape, sizeof(int64_t) * (size_t)ti->rank);
    t->data = (char *)w->files[ti->file].map + ti->offset;
    return M3_OK;
}

m3_status m3_weights_get(m3_weights *w, const char *name, m3_tensor *t) {
    const m3_tensor_info *ti = m3_weights_find(w, name);
    if (!ti) return m3_errorf(M3_ERR_MISSING, "%s: missing tensor %.300s", w->dir, name);
    return view(w, ti, t);
}

m3_status m3_weights_drop(m3_weights *w, const char *name_prefix) {
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) pg = 4096;
    size_t n = strlen(name_prefix);
    for (int64_t i = 0; i < w->n; i++) {
        const m3_tensor_info *t = &w->t[i];
        if (strncmp(t->canon, name_prefix, n) || !w->files[t->file].map || !t->nbytes) continue;
        /* whole pages covering the tensor; a neighbour's shared page is only re-read later */
        int64_t b = t->offset / pg * pg, e = t->offset + t->nbytes;
        char *base = (char *)w->files[t->file].map;
        if (madvise(base + b, (size_t)(e - b), MADV_DONTNEED) != 0)
            return m3_errorf(M3_ERR_IO, "%s: madvise failed: %s", w->files[t->file].path,
                             strerror(errno));
    }
    return M3_OK;
}

/* ---- roles ----------------------------------------------------------------------------- */

enum { SC_GLOBAL, SC_LAYER, SC_EXPERT, SC_VLAYER };
static const struct {
    const char *fmt;
    int scope;
} roles[M3_W_ROLE_COUNT] = {
    [M3_W_EMBED] = {"language_model.model.embed_tokens.weight", SC_GLOBAL},
    [M3_W_FINAL_NORM] = {"language_model.model.norm.weight", SC_GLOBAL},
    [M3_W_LM_HEAD] = {"language_model.lm_head.weight", SC_GLOBAL},
#define TL "language_model.model.layers.%d."
    [M3_W_IN_NORM] = {TL "input_layernorm.weight", SC_LAYER},
    [M3_W_POST_NORM] = {TL "post_attention_layernorm.weight", SC_LAYER},
    [M3_W_Q_PROJ] = {TL "self_attn.q_proj.weight", SC_LAYER},
    [M3_W_K_PROJ] = {TL "self_attn.k_proj.weight", SC_LAYER},
    [M3_W_V_PROJ] = {TL "self_attn.v_proj.weight", SC_LAYER},
    [M3_W_O_PROJ] = {TL "self_attn.o_proj.weight", SC_LAYER},
    [M3_W_Q_NORM] = {TL "self_attn.q_norm.weight", SC_LAYER},
    [M3_W_K_NORM] = {TL "self_attn.k_norm.weight", SC_LAYER},
    [M3_W_INDEX_Q_PROJ] = {TL "self_attn.index_q_proj.weight", SC_LAYER},
    [M3_W_INDEX_K_PROJ] = {TL "self_attn.index_k_proj.weight", SC_LAYER},
    [M3_W_INDEX_Q_NORM] = {TL "self_attn.index_q_norm.weight", SC_LAYER},
    [M3_W_INDEX_K_NORM] = {TL "self_attn.index_k_norm.weight", SC_LAYER},
    [M3_W_MLP_GATE] = {TL "mlp.gate_proj.weight", SC_LAYER},
    [M3_W_MLP_UP] = {TL "mlp.up_proj.weight", SC_LAYER},
    [M3_W_MLP_DOWN] = {TL "mlp.down_proj.weight", SC_LAYER},
    [M3_W_ROUTER] = {TL "block_sparse_moe.gate.weight", SC_LAYER},
    [M3_W_ROUTER_BIAS] = {TL "block_sparse_moe.e_score_correction_bias", SC_LAYER},
    [M3_W_SHARED_GATE] = {TL "block_sparse_moe.shared_experts.gate_proj.weight", SC_LAYER},
    [M3_W_SHARED_UP] = {TL "block_sparse_moe.shared_experts.up_proj.weight", SC_LAYER},
    [M3_W_SHARED_DOWN] = {TL "block_sparse_moe.shared_experts.down_proj.weight", SC_LAYER},
    [M3_W_EXPERT_GATE] = {TL "block_sparse_moe.experts.%d.w1.weight", SC_EXPERT},
    [M3_W_EXPERT_UP] = {TL "block_sparse_moe.experts.%d.w3.weight", SC_EXPERT},
    [M3_W_EXPERT_DOWN] = {TL "block_sparse_moe.experts.%d.w2.weight", SC_EXPERT},
#undef TL
#define VT "vision_tower.vision_model."
#define VL VT "encoder.layers.%d."
    [M3_W_VIS_PATCH_EMBED] = {VT "embeddings.patch_embedding.weight", SC_GLOBAL},
    [M3_W_VIS_PRE_NORM_W] = {VT "pre_layrnorm.weight", SC_GLOBAL},
    [M3_W_VIS_PRE_NORM_B] = {VT "pre_layrnorm.bias", SC_GLOBAL},
    [M3_W_VIS_LN1_W] = {VL "layer_norm1.weight", SC_VLAYER},
    [M3_W_VIS_LN1_B] = {VL "layer_norm1.bias", SC_VLAYER},
    [M3_W_VIS_LN2_W] = {VL "layer_norm2.weight", SC_VLAYER},
    [M3_W_VIS_LN2_B] = {VL "layer_norm2.bias", SC_VLAYER},
    [M3_W_VIS_Q_W] = {VL "self_attn.q_proj.weight", SC_VLAYER},
    [M3_W_VIS_Q_B] = {VL "self_attn.q_proj.bias", SC_VLAYER},
    [M3_W_VIS_K_W] = {VL "self_attn.k_proj.weight", SC_VLAYER},
    [M3_W_VIS_K_B] = {VL "self_attn.k_proj.bias", SC_VLAYER},
    [M3_W_VIS_V_W] = {VL "self_attn.v_proj.weight", SC_VLAYER},
    [M3_W_VIS_V_B] = {VL "self_attn.v_proj.bias", SC_VLAYER},
    [M3_W_VIS_OUT_W] = {VL "self_attn.out_proj.weight", SC_VLAYER},
    [M3_W_VIS_OUT_B] = {VL "self_attn.out_proj.bias", SC_VLAYER},
    [M3_W_VIS_FC1_W] = {VL "mlp.fc1.weight", SC_VLAYER},
    [M3_W_VIS_FC1_B] = {VL "mlp.fc1.bias", SC_VLAYER},
    [M3_W_VIS_FC2_W] = {VL "mlp.fc2.weight", SC_VLAYER},
    [M3_W_VIS_FC2_B] = {VL "mlp.fc2.bias", SC_VLAYER},
#undef VL
#undef VT
    [M3_W_PROJ1_W] = {"multi_modal_projector.linear_1.weight", SC_GLOBAL},
    [M3_W_PROJ1_B] = {"multi_modal_projector.linear_1.bias", SC_GLOBAL},
    [M3_W_PROJ2_W] = {"multi_modal_projector.linear_2.weight", SC_GLOBAL},
    [M3_W_PROJ2_B] = {"multi_modal_projector.linear_2.bias", SC_GLOBAL},
    [M3_W_MERGE1_W] = {"patch_merge_mlp.linear_1.weight", SC_GLOBAL},
    [M3_W_MERGE1_B] = {"patch_merge_mlp.linear_1.bias", SC_GLOBAL},
    [M3_W_MERGE2_W] = {"patch_merge_mlp.linear_2.weight", SC_GLOBAL},
    [M3_W_MERGE2_B] = {"patch_merge_mlp.linear_2.bias", SC_GLOBAL},
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
int m3_weight_name(char *buf, size_t cap, m3_wrole role, int layer, int expert) {
    M3_ASSERT(role >= 0 && role < M3_W_ROLE_COUNT);
    int n;
    switch (roles[role].scope) {
    case SC_GLOBAL: n = snprintf(buf, cap, "%s", roles[role].fmt); break;
    case SC_EXPERT: n = snprintf(buf, cap, roles[role].fmt, layer, expert); break;
    default: n = snprintf(buf, cap, roles[role].fmt, layer); break;
    }
    M3_ASSERTF(n >= 0 && (size_t)n < cap, "weight name buffer of %zu bytes too small", cap);
    return n;
}
#pragma GCC diagnostic pop

bool m3_wrole_is_linear(m3_wrole r) {
    switch (r) {
    case M3_W_LM_HEAD: case M3_W_Q_PROJ: case M3_W_K_PROJ: case M3_W_V_PROJ: case M3_W_O_PROJ:
    case M3_W_INDEX_Q_PROJ: case M3_W_INDEX_K_PROJ: case M3_W_MLP_GATE: case M3_W_MLP_UP:
    case M3_W_MLP_DOWN: case M3_W_ROUTER: case M3_W_SHARED_GATE: case M3_W_SHARED_UP:
    case M3_W_SHARED_DOWN: case M3_W_EXPERT_GATE: case M3_W_EXPERT_UP: case M3_W_EXPERT_DOWN:
    case M3_W_VIS_Q_W: case M3_W_VIS_K_W: case M3_W_VIS_V_W: case M3_W_VIS_OUT_W:
    case M3_W_VIS_FC1_W: case M3_W_VIS_FC2_W: case M3_W_PROJ1_W: case M3_W_PROJ2_W:
    case M3_W_MERGE1_W: case M3_W_MERGE2_W: return true;
    default: return false;
    }
}

static bool set2(int64_t *s, int *r, int64_t a, int64_t b) {
    s[0] = a;
    s[1] = b;
    *r = 2;
    return true;
}
static bool set1(int64_t *s, int *r, int64_t a) {
    s[0] = a;
    *r = 1;
    return true;
}

bool m3_weight_shape(const m3_config *c, m3_wrole role, int L, int64_t *s, int *r) {
    const int64_t D = c->hidden, Dh = c->head_dim;
    bool text_layer = L >= 0 && L < c->n_layer;
    bool sparse = text_layer && c->layer_sparse[L], moe = text_layer && c->layer_moe[L];
    const m3_vision_config *v = &c->vision;
    const int64_t Dv = v->hidden, P = c->projector_hidden;
    switch (role) {
    case M3_W_EMBED: return set2(s, r, c->vocab, D);
    case M3_W_FINAL_NORM: return set1(s, r, D);
    case M3_W_LM_HEAD: return !c->tie_word_embeddings && set2(s, r, c->vocab, D);
    case M3_W_IN_NORM:
    case M3_W_POST_NORM: return text_layer && set1(s, r, D);
    case M3_W_Q_PROJ: return text_layer && set2(s, r, (int64_t)c->n_head * Dh, D);
    case M3_W_K_PROJ:
    case M3_W_V_PROJ: return text_layer && set2(s, r, (int64_t)c->n_kv_head * Dh, D);
    case M3_W_O_PROJ: return text_layer && set2(s, r, D, (int64_t)c->n_head * Dh);
    case M3_W_Q_NORM:
    case M3_W_K_NORM: return text_layer && set1(s, r, Dh);
    case M3_W_INDEX_Q_PROJ:
        return sparse && set2(s, r, (int64_t)c->index_n_heads * c->index_head_dim, D);
    case M3_W_INDEX_K_PROJ: return sparse && set2(s, r, c->index_head_dim, D);
    case M3_W_INDEX_Q_NORM:
    case M3_W_INDEX_K_NORM: return sparse && set1(s, r, c->index_head_dim);
    case M3_W_MLP_GATE:
    case M3_W_MLP_UP: return text_layer && !moe && set2(s, r, c->dense_inter, D);
    case M3_W_MLP_DOWN: return text_layer && !moe && set2(s, r, D, c->dense_inter);
    case M3_W_ROUTER: return moe && set2(s, r, c->n_expert, D);
    case M3_W_ROUTER_BIAS: return moe && set1(s, r, c->n_expert);
    case M3_W_SHARED_GATE:
    case M3_W_SHARED_UP: return moe && c->n_shared_experts > 0 && set2(s, r, c->shared_inter, D);
    case M3_W_SHARED_DOWN:
        return moe && c->n_shared_experts > 0 && set2(s, r, D, c->shared_inter);
    case M3_W_EXPERT_GATE:
    case M3_W_EXPERT_UP: return moe && set2(s, r, c->expert_inter, D);
    case M3_W_EXPERT_DOWN: return moe && set2(s, r, D, c->expert_inter);
    default: break;
    }
    if (!v->present) return false;
    bool vl = L >= 0 && L < v->n_layer;
    switch (role) {
    case M3_W_VIS_PATCH_EMBED:
        s[0] = Dv;
        s[1] = v->n_channels;
        s[2] = v->temporal_patch;
        s[3] = s[4] = v->patch;
        *r = 5;
        return true;
    case M3_W_VIS_PRE_NORM_W:
    case M3_W_VIS_PRE_NORM_B: return set1(s, r, Dv);
    case M3_W_VIS_LN1_W: case M3_W_VIS_LN1_B: case M3_W_VIS_LN2_W: case M3_W_VIS_LN2_B:
    case M3_W_VIS_Q_B: case M3_W_VIS_K_B: case M3_W_VIS_V_B: case M3_W_VIS_OUT_B:
    case M3_W_VIS_FC2_B: return vl && set1(s, r, Dv);
    case M3_W_VIS_Q_W: case M3_W_VIS_K_W: case M3_W_VIS_V_W:
    case M3_W_VIS_OUT_W: return vl && set2(s, r, Dv, Dv);
    case M3_W_VIS_FC1_W: return vl && set2(s, r, v->inter, Dv);
    case M3_W_VIS_FC1_B: return vl && set1(s, r, v->inter);
    case M3_W_VIS_FC2_W: return vl && set2(s, r, Dv, v->inter);
    case M3_W_PROJ1_W: return set2(s, r, P, Dv);
    case M3_W_PROJ1_B: case M3_W_MERGE1_B: return set1(s, r, P);
    /* linear_2 maps the projector width back to the text width (checked on a fixture whose
     * projector_hidden_size differs from hidden_size: linear_2 is [hidden, projector]) */
    case M3_W_PROJ2_W: return set2(s, r, D, P);
    case M3_W_PROJ2_B: return set1(s, r, D);
    case M3_W_MERGE1_W: return set2(s, r, P, c->merged_hidden);
    case M3_W_MERGE2_W: return set2(s, r, D, P);
    case M3_W_MERGE2_B: return set1(s, r, D);
    default: return false;
    }
}

m3_status m3_weights_role_get(m3_weights *w, m3_wrole role, int layer, int expert, m3_tensor *t) {
    char name[512];
    m3_weight_name(name, sizeof name, role, layer, expert);
    return m3_weights_get(w, name, t);
}

static bool is_float_dt(m3_dtype d) { return d == M3_DT_F32 || d == M3_DT_BF16 || d == M3_DT_F16; }
static bool is_e8m0_dt(m3_dtype d) { return d == M3_DT_U8 || d == M3_DT_F8_E8M0; }

static bool same_shape(const m3_tensor_info *t, const int64_t *s, int r) {
    if (t->rank != r) return false;
    for (int i = 0; i < r; i++)
        if (t->shape[i] != s[i]) return false;
    return true;
}

/* Classify and validate a linear weight (and its scale) against logical [out, in]. */
static m3_status check_linear(const m3_weights *w, const m3_tensor_info *t, const int64_t *s,
                              m3_wformat *fmt, const m3_tensor_info **scale) {
    char a[160], b[160];
    const char *fp = w->files[t->file].path;
    int64_t out = s[0], in = s[1];
    *scale = NULL;
    int64_t want[2] = {out, in};
    if (is_float_dt(t->dtype)) {
        *fmt = M3_WF_DENSE;
    } else if (t->dtype == M3_DT_U8 || t->dtype == M3_DT_F4) {
        *fmt = M3_WF_MXFP4;
        if (t->dtype == M3_DT_U8) want[1] = in / 2;
    } else if (t->dtype == M3_DT_F8_E4M3) {
        *fmt = M3_WF_MXFP8;
    } else {
        return m3_errorf(M3_ERR_FORMAT,
                         "%s: tensor %s has dtype %s, expected F32/BF16/F16 or an MXFP4/MXFP8 "
                         "weight",
                         fp, t->name, m3_dtype_name(t->dtype));
    }
    if (*fmt != M3_WF_DENSE && in % 32)
        return m3_errorf(M3_ERR_SHAPE, "%s: tensor %s is MX-quantized but its input width %lld is "
                                       "not a multiple of 32",
                         fp, t->name, (long long)in);
    if (!same_shape(t, want, 2)) {
        fmt_shape(a, sizeof a, t->shape, t->rank);
        fmt_shape(b, sizeof b, want, 2);
        return m3_errorf(M3_ERR_SHAPE, "%s: tensor %s has shape %s, config implies %s%s", fp,
                         t->name, a, b,
                         *fmt == M3_WF_MXFP4 ? " (MXFP4: [out, in/2])" : "");
    }
    if (*fmt == M3_WF_DENSE) return M3_OK;
    char sn[NAME_MAX_LEN + 64];
    snprintf(sn, sizeof sn, "%s_scale", t->canon);
    const m3_tensor_info *st = find_canon(w, sn);
    if (!st)
        return m3_errorf(M3_ERR_MISSING, "%s: missing tensor %s (the e8m0 scale of %s)", w->dir,
                         sn, t->name);
    int64_t ws[2] = {out, in / 32};
    if (!is_e8m0_dt(st->dtype) || !same_shape(st, ws, 2)) {
        fmt_shape(a, sizeof a, st->shape, st->rank);
        fmt_shape(b, sizeof b, ws, 2);
        return m3_errorf(M3_ERR_SHAPE, "%s: tensor %s is %s %s, expected U8/F8_E8M0 %s",
                         w->files[st->file].path, st->name, m3_dtype_name(st->dtype), a, b);
    }
    *scale = st;
    return M3_OK;
}

m3_status m3_weights_linear(m3_weights *w, m3_wrole role, int layer, int expert,
                            m3_linear_w *lw) {
    M3_ASSERT(m3_wrole_is_linear(role));
    memset(lw, 0, sizeof *lw);
    char name[512];
    m3_weight_name(name, sizeof name, role, layer, expert);
    const m3_tensor_info *t = find_canon(w, name);
    if (!t) return m3_errorf(M3_ERR_MISSING, "%s: missing tensor %s", w->dir, name);
    if (t->rank != 2)
        return m3_errorf(M3_ERR_SHAPE, "%s: tensor %s has rank %d, expected 2",
                         w->files[t->file].path, t->name, t->rank);
    int64_t s[2] = {t->shape[0], t->shape[1]};
    if (t->dtype == M3_DT_U8) s[1] *= 2; /* MXFP4 packs two elements per byte */
    const m3_tensor_info *st = NULL;
    M3_TRY(check_linear(w, t, s, &lw->fmt, &st));
    lw->rows = s[0];
    lw->cols = s[1];
    M3_TRY(view(w, t, &lw->w));
    if (st) M3_TRY(view(w, st, &lw->scale));
    return M3_OK;
}

m3_status m3_weights_check(const m3_weights *w, const m3_config *cfg, int64_t *n_unused) {
    unsigned char *used = calloc((size_t)w->n, 1);
    if (!used) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    m3_status s = M3_OK;
    char name[512], a[160], b[160];
    for (int role = 0; role < M3_W_ROLE_COUNT && !s; role++) {
        int sc = roles[role].scope;
        int nl = sc == SC_GLOBAL ? 1 : sc == SC_VLAYER ? cfg->vision.n_layer : cfg->n_layer;
        int ne = sc == SC_EXPERT ? cfg->n_expert : 1;
        for (int L = 0; L < nl && !s; L++) {
            int64_t shp[M3_MAX_RANK];
            int rank;
            if (!m3_weight_shape(cfg, (m3_wrole)role, L, shp, &rank)) continue;
            for (int e = 0; e < ne && !s; e++) {
                m3_weight_name(name, sizeof name, (m3_wrole)role, L, e);
                const m3_tensor_info *t = find_canon(w, name);
                if (!t) {
                    fmt_shape(a, sizeof a, shp, rank);
                    s = m3_errorf(M3_ERR_MISSING, "%s: missing tensor %s (config implies %s)",
                                  w->dir, name, a);
                    break;
                }
                used[t - w->t] = 1;
                if (m3_wrole_is_linear((m3_wrole)role)) {
                    m3_wformat fmt;
                    const m3_tensor_info *st = NULL;
                    s = check_linear(w, t, shp, &fmt, &st);
                    if (st) used[st - w->t] = 1;
                } else if (!is_float_dt(t->dtype)) {
                    s = m3_errorf(M3_ERR_FORMAT, "%s: tensor %s has dtype %s, expected F32/BF16/F16",
                                  w->files[t->file].path, t->name, m3_dtype_name(t->dtype));
                } else if (!same_shape(t, shp, rank)) {
                    fmt_shape(a, sizeof a, t->shape, t->rank);
                    fmt_shape(b, sizeof b, shp, rank);
                    s = m3_errorf(M3_ERR_SHAPE, "%s: tensor %s has shape %s, config implies %s",
                                  w->files[t->file].path, t->name, a, b);
                }
            }
        }
    }
    if (!s && n_unused) {
        int64_t k = 0;
        for (int64_t i = 0; i < w->n; i++)
            if (!used[i] && !starts(w->t[i].canon, "mtp.")) k++;
        *n_unused = k;
    }
    free(used);
    return s;
}

int64_t m3_weights_quant_mismatch(const m3_weights *w, const m3_config *cfg, char *first,
                                  size_t cap) {
    int64_t k = 0;
    char name[512];
    if (first && cap) first[0] = 0;
    for (int role = 0; role < M3_W_ROLE_COUNT; role++) {
        if (!m3_wrole_is_linear((m3_wrole)role)) continue;
        int sc = roles[role].scope;
        int nl = sc == SC_GLOBAL ? 1 : sc == SC_VLAYER ? cfg->vision.n_layer : cfg->n_layer;
        int ne = sc == SC_EXPERT ? cfg->n_expert : 1;
        for (int L = 0; L < nl; L++) {
            int64_t shp[M3_MAX_RANK];
            int rank;
            if (!m3_weight_shape(cfg, (m3_wrole)role, L, shp, &rank)) continue;
            for (int e = 0; e < ne; e++) {
                int n = m3_weight_name(name, sizeof name, (m3_wrole)role, L, e);
                const m3_tensor_info *t = find_canon(w, name);
                if (!t) continue;
                name[n - (int)strlen(".weight")] = 0; /* module name */
                bool stored_q = !is_float_dt(t->dtype);
                if (stored_q != m3_config_module_quantized(cfg, name)) {
                    if (!k && first) snprintf(first, cap, "%s", name);
                    k++;
                }
            }
        }
    }
    return k;
}

/* ---- conversion ------------------------------------------------------------------------ */

/* IEEE binary16 -> binary32, exact (every half is representable in float). */
static float half_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    uint32_t bits;
    if (e == 0x1F) {
        bits = sign | 0x7F800000u | (m << 13); /* inf / NaN (payload kept) */
    } else if (e) {
        bits = sign | ((e + 112) << 23) | (m << 13);
    } else if (!m) {
        bits = sign;
    } else { /* subnormal half: normalise */
        int sh = 0;
        while (!(m & 0x400)) {
            m <<= 1;
            sh++;
        }
        bits = sign | ((uint32_t)(113 - sh) << 23) | ((m & 0x3FF) << 13);
    }
    return m3_bits_f32(bits);
}

m3_status m3_tensor_rows_f32(const m3_tensor *t, int64_t row0, int64_t n_rows, float *out) {
    M3_ASSERT(t->rank >= 1);
    int64_t numel = m3_tensor_numel(t);
    int64_t rows = t->shape[0], cols = rows ? numel / rows : 0;
    M3_ASSERTF(row0 >= 0 && n_rows >= 0 && row0 + n_rows <= rows, "rows [%lld, +%lld) of %lld",
               (long long)row0, (long long)n_rows, (long long)rows);
    int64_t n = n_rows * cols, o = row0 * cols;
    switch (t->dtype) {
    case M3_DT_F32: memcpy(out, (const float *)t->data + o, (size_t)n * sizeof(float)); break;
    case M3_DT_BF16: {
        const uint16_t *p = (const uint16_t *)t->data + o;
        for (int64_t i = 0; i < n; i++) out[i] = m3_bf16_to_f32(p[i]);
        break;
    }
    case M3_DT_F16: {
        const uint16_t *p = (const uint16_t *)t->data + o;
        for (int64_t i = 0; i < n; i++) out[i] = half_to_f32(p[i]);
        break;
    }
    default:
        return m3_errorf(M3_ERR_UNSUPPORTED, "conversion of %s to f32 is not supported",
                         m3_dtype_name(t->dtype));
    }
    return M3_OK;
}

m3_status m3_linear_rows_f32(const m3_linear_w *lw, int64_t row0, int64_t n_rows, float *out) {
    if (lw->fmt == M3_WF_DENSE) return m3_tensor_rows_f32(&lw->w, row0, n_rows, out);
    /* MX: w[n,k] = elem(code[n,k]) * 2^(scale[n, k/32] - 127), exact in f32 (spec §5.4-5.5).
     * Decoding goes through the one format definition (ref/quant.c -> ref/num/mx.h). */
    if (row0 < 0 || n_rows < 0 || row0 + n_rows > lw->rows)
        return m3_errorf(M3_ERR_ARG, "linear rows [%lld, %lld) outside [0, %lld)", (long long)row0,
                         (long long)(row0 + n_rows), (long long)lw->rows);
    if (lw->cols > INT32_MAX || n_rows > INT32_MAX)
        return m3_errorf(M3_ERR_UNSUPPORTED, "MX linear too large for one call");
    m3_mx_params p = m3_mx_params_default(lw->fmt == M3_WF_MXFP4 ? M3_MX_E2M1 : M3_MX_E4M3FN);
    const int64_t code_row = m3_mx_row_bytes((int)lw->cols, &p);
    const int64_t scale_row = m3_mx_n_blocks((int)lw->cols, &p);
    const uint8_t *codes = (const uint8_t *)lw->w.data + row0 * code_row;
    const m3_e8m0 *scales = (const m3_e8m0 *)lw->scale.data + row0 * scale_row;
    m3_mx_dequantize(out, codes, scales, (int)n_rows, (int)lw->cols, &p);
    return M3_OK;
}
