/* ref/st_write.c: see st_write.h. */
#include "ref/st_write.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *name;
    m3_dtype dt;
    int rank;
    int64_t shape[M3_MAX_RANK];
    size_t nbytes;
} st_entry;

struct m3_st_writer {
    st_entry *e;
    int64_t n, cap;
};

m3_status m3_st_writer_create(m3_st_writer **w) {
    *w = calloc(1, sizeof **w);
    return *w ? M3_OK : m3_errorf(M3_ERR_NOMEM, "out of memory");
}

void m3_st_writer_free(m3_st_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n; i++)
        free(w->e[i].name);
    free(w->e);
    free(w);
}

int64_t m3_st_count(const m3_st_writer *w) {
    return w->n;
}

m3_status m3_st_add(m3_st_writer *w, const char *name, m3_dtype dt, int rank, const int64_t *shape,
                    size_t nbytes) {
    M3_ASSERT(rank >= 0 && rank <= M3_MAX_RANK && name && name[0]);
    if (w->n == w->cap) {
        int64_t nc = w->cap ? 2 * w->cap : 256;
        st_entry *ne = realloc(w->e, (size_t)nc * sizeof *ne);
        if (!ne) return m3_errorf(M3_ERR_NOMEM, "out of memory");
        w->e = ne;
        w->cap = nc;
    }
    st_entry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return m3_errorf(M3_ERR_NOMEM, "out of memory");
    e->dt = dt;
    e->rank = rank;
    for (int i = 0; i < rank; i++)
        e->shape[i] = shape[i];
    e->nbytes = nbytes;
    w->n++;
    return M3_OK;
}

/* growable string */
typedef struct {
    char *s;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->s && b->len + (size_t)k < b->cap) {
            b->len += (size_t)k;
            return;
        }
        size_t nc = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
        char *ns = realloc(b->s, nc);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = nc;
    }
}

/* JSON string literal (names are plain ASCII in practice; escape what JSON requires) */
static void sb_str(sbuf *b, const char *s) {
    sb_put(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            sb_put(b, "\\%c", c);
        else if (c < 0x20)
            sb_put(b, "\\u%04x", c);
        else
            sb_put(b, "%c", c);
    }
    sb_put(b, "\"");
}

m3_status m3_st_write(m3_st_writer *w, const char *path, const char *const (*meta)[2], int n_meta,
                      m3_st_fill_fn fill, void *ctx) {
    for (int64_t i = 0; i < w->n; i++)
        for (int64_t j = 0; j < i; j++)
            if (!strcmp(w->e[i].name, w->e[j].name))
                return m3_errorf(M3_ERR_ARG, "%s: tensor %s added twice", path, w->e[i].name);
    sbuf h = {0};
    sb_put(&h, "{");
    if (n_meta > 0) {
        sb_put(&h, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i) sb_put(&h, ",");
            sb_str(&h, meta[i][0]);
            sb_put(&h, ":");
            sb_str(&h, meta[i][1]);
        }
        sb_put(&h, "}");
    }
    size_t off = 0, maxb = 1;
    for (int64_t i = 0; i < w->n; i++) {
        const st_entry *e = &w->e[i];
        if (i || n_meta > 0) sb_put(&h, ",");
        sb_str(&h, e->name);
        sb_put(&h, ":{\"dtype\":\"%s\",\"shape\":[", m3_dtype_name(e->dt));
        for (int r = 0; r < e->rank; r++)
            sb_put(&h, "%s%lld", r ? "," : "", (long long)e->shape[r]);
        sb_put(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + e->nbytes);
        off += e->nbytes;
        if (e->nbytes > maxb) maxb = e->nbytes;
    }
    sb_put(&h, "}");
    while (!h.oom && (h.len % 8) != 0)
        sb_put(&h, " ");
    if (h.oom) {
        free(h.s);
        return m3_errorf(M3_ERR_NOMEM, "%s: out of memory building the header", path);
    }
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(h.s);
        return m3_errorf(M3_ERR_ARG, "%s: path too long", path);
    }
    m3_status s = M3_OK;
    uint8_t *buf = malloc(maxb);
    FILE *f = buf ? fopen(tmp, "wb") : NULL;
    if (!buf)
        s = m3_errorf(M3_ERR_NOMEM, "%s: out of memory (%zu bytes)", path, maxb);
    else if (!f)
        s = m3_errorf(M3_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    if (!s) {
        uint8_t len8[8];
        uint64_t hl = h.len;
        for (int i = 0; i < 8; i++)
            len8[i] = (uint8_t)(hl >> (8 * i));
        if (fwrite(len8, 1, 8, f) != 8 || fwrite(h.s, 1, h.len, f) != h.len)
            s = m3_errorf(M3_ERR_IO, "%s: write error: %s", tmp, strerror(errno));
    }
    for (int64_t i = 0; !s && i < w->n; i++) {
        size_t nb = w->e[i].nbytes;
        s = fill(ctx, i, buf, nb);
        if (s)
            m3_error_context(s, "%s: tensor %s", path, w->e[i].name);
        else if (nb && fwrite(buf, 1, nb, f) != nb)
            s = m3_errorf(M3_ERR_IO, "%s: write error: %s", tmp, strerror(errno));
    }
    if (f && fclose(f) != 0 && !s) s = m3_errorf(M3_ERR_IO, "%s: close: %s", tmp, strerror(errno));
    if (!s && rename(tmp, path) != 0)
        s = m3_errorf(M3_ERR_IO, "%s: cannot rename into place: %s", path, strerror(errno));
    if (s && f) unlink(tmp);
    free(buf);
    free(h.s);
    return s;
}
