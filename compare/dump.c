/* compare/dump.c: m3-dump/1 over libhdf5 (see dump.h). The only file that includes hdf5.h.
 * Rules kept here: HDF5's automatic error printing is off (we report one line ourselves),
 * every hid_t opened in a function is closed before it returns (single `done:` label),
 * and the one long-lived dataset handle (the streaming cache) is closed by m3_dump_close. */
#include "compare/dump.h"

#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct m3_dump {
    hid_t file;
    int flags;
    bool committed;
    char *path;     /* final name */
    char *tmp_path; /* CREATE only: PATH.tmp */
    /* streaming cache for m3_dump_read_rows: the last dataset read */
    char *cur_key;
    hid_t cur_dset, cur_space;
    int cur_rank;
    hsize_t cur_dims[M3_MAX_RANK];
    m3_dtype cur_dtype;
};

static void quiet_hdf5(void) {
    /* Idempotent; HDF5's default handler would print a multi-line stack to stderr. */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static void close_cur(m3_dump *d) {
    if (d->cur_space >= 0) H5Sclose(d->cur_space);
    if (d->cur_dset >= 0) H5Dclose(d->cur_dset);
    d->cur_space = d->cur_dset = -1;
    free(d->cur_key);
    d->cur_key = NULL;
}

const char *m3_dump_path(const m3_dump *d) { return d->path; }

/* ---- attributes ---------------------------------------------------------------------- */

/* Open attribute `name` of obj and check that it holds one value of class cls (`what` names
 * it in the error). *a, *t, *sp get what was opened (-1 otherwise); the caller closes them
 * with attr_close on success and failure alike. */
static m3_status attr_open_scalar(m3_dump *d, hid_t obj, const char *name, H5T_class_t cls,
                                  const char *what, hid_t *a, hid_t *t, hid_t *sp) {
    *a = *t = *sp = -1;
    if (H5Aexists(obj, name) <= 0)
        return m3_errorf(M3_ERR_MISSING, "%s: no attribute '%s'", d->path, name);
    *a = H5Aopen(obj, name, H5P_DEFAULT);
    if (*a < 0) return m3_errorf(M3_ERR_FORMAT, "%s: cannot open attribute '%s'", d->path, name);
    *t = H5Aget_type(*a);
    *sp = H5Aget_space(*a);
    if (*t < 0 || *sp < 0 || H5Tget_class(*t) != cls || H5Sget_simple_extent_npoints(*sp) != 1)
        return m3_errorf(M3_ERR_FORMAT, "%s: attribute '%s' is not %s", d->path, name, what);
    return M3_OK;
}

static void attr_close(hid_t a, hid_t t, hid_t sp) {
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
}

static m3_status attr_read_int(m3_dump *d, hid_t obj, const char *name, int64_t *out) {
    hid_t a, t, sp;
    m3_status st = attr_open_scalar(d, obj, name, H5T_INTEGER, "an integer scalar", &a, &t, &sp);
    long long v = 0;
    if (st == M3_OK && H5Aread(a, H5T_NATIVE_LLONG, &v) < 0)
        st = m3_errorf(M3_ERR_FORMAT, "%s: cannot read attribute '%s'", d->path, name);
    if (st == M3_OK) *out = (int64_t)v;
    attr_close(a, t, sp);
    return st;
}

static m3_status attr_read_str(m3_dump *d, hid_t obj, const char *name, char **out) {
    hid_t a, t, sp, mt = -1;
    *out = NULL;
    m3_status st = attr_open_scalar(d, obj, name, H5T_STRING, "a string", &a, &t, &sp);
    if (st != M3_OK) goto done;
    if (H5Tis_variable_str(t) > 0) {
        mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(t));
        char *v = NULL;
        if (H5Aread(a, mt, &v) < 0 || !v) {
            st = m3_errorf(M3_ERR_FORMAT, "%s: cannot read attribute '%s'", d->path, name);
            goto done;
        }
        *out = xstrdup(v);
        H5free_memory(v);
    } else {
        size_t n = H5Tget_size(t);
        mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, n + 1);
        H5Tset_strpad(mt, H5T_STR_NULLTERM);
        char *v = calloc(1, n + 2);
        if (!v) { st = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", d->path); goto done; }
        if (H5Aread(a, mt, v) < 0) {
            free(v);
            st = m3_errorf(M3_ERR_FORMAT, "%s: cannot read attribute '%s'", d->path, name);
            goto done;
        }
        *out = v;
    }
    if (!*out) st = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", d->path);
done:
    if (mt >= 0) H5Tclose(mt);
    attr_close(a, t, sp);
    return st;
}

static m3_status attr_write(m3_dump *d, hid_t obj, const char *name, hid_t type, const void *buf) {
    m3_status st = M3_OK;
    hid_t sp = -1, a = -1;
    if (H5Aexists(obj, name) > 0 && H5Adelete(obj, name) < 0)
        return m3_errorf(M3_ERR_IO, "%s: cannot replace attribute '%s'", d->path, name);
    sp = H5Screate(H5S_SCALAR);
    a = sp < 0 ? -1 : H5Acreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, type, buf) < 0)
        st = m3_errorf(M3_ERR_IO, "%s: cannot write attribute '%s'", d->path, name);
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    return st;
}

static m3_status attr_write_str(m3_dump *d, hid_t obj, const char *name, const char *value) {
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0) return m3_errorf(M3_ERR_IO, "%s: HDF5 type error", d->path);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    m3_status st = attr_write(d, obj, name, t, &value);
    H5Tclose(t);
    return st;
}

static m3_status need_write(m3_dump *d, const char *what) {
    if (!(d->flags & M3_DUMP_CREATE) || d->committed)
        return m3_errorf(M3_ERR_ARG, "%s: %s on a dump not open for writing", d->path, what);
    return M3_OK;
}

m3_status m3_dump_set_attr_str(m3_dump *d, const char *name, const char *value) {
    M3_TRY(need_write(d, "set attribute"));
    return attr_write_str(d, d->file, name, value);
}

m3_status m3_dump_set_attr_int(m3_dump *d, const char *name, int64_t value) {
    M3_TRY(need_write(d, "set attribute"));
    long long v = value;
    return attr_write(d, d->file, name, H5T_STD_I64LE, &v);
}

m3_status m3_dump_get_attr_str(m3_dump *d, const char *name, char **out) {
    return attr_read_str(d, d->file, name, out);
}

m3_status m3_dump_get_attr_int(m3_dump *d, const char *name, int64_t *out) {
    return attr_read_int(d, d->file, name, out);
}

/* ---- open / commit / close ----------------------------------------------------------- */

static bool file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

m3_status m3_dump_open(m3_dump **out, const char *path, int flags) {
    quiet_hdf5();
    *out = NULL;
    m3_status st = M3_OK;
    m3_dump *d = calloc(1, sizeof *d);
    if (!d) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
    d->file = d->cur_dset = d->cur_space = -1;
    d->flags = flags;
    d->path = xstrdup(path);
    if (!d->path) { st = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path); goto fail; }
    if (flags & M3_DUMP_CREATE) {
        struct stat sb;
        if (!path[0]) { st = m3_errorf(M3_ERR_ARG, "empty output file name"); goto fail; }
        /* a directory could never be replaced by the rename at commit: say so before the run */
        if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            st = m3_errorf(M3_ERR_IO, "%s: is a directory", path);
            goto fail;
        }
        if (file_exists(path) && !(flags & M3_DUMP_FORCE)) {
            st = m3_errorf(M3_ERR_IO, "%s: already exists (use --force to overwrite)", path);
            goto fail;
        }
        size_t n = strlen(path) + 5;
        d->tmp_path = malloc(n);
        if (!d->tmp_path) { st = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path); goto fail; }
        snprintf(d->tmp_path, n, "%s.tmp", path);
        errno = 0;
        d->file = H5Fcreate(d->tmp_path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        if (d->file < 0) {
            st = m3_errorf(M3_ERR_IO, "%s: cannot create %s: %s", path, d->tmp_path,
                           errno ? strerror(errno) : "HDF5 error");
            goto fail;
        }
        st = attr_write_str(d, d->file, "format", M3_DUMP_FORMAT);
        if (st == M3_OK) st = m3_dump_set_attr_int(d, "format_version", M3_DUMP_FORMAT_VERSION);
        if (st != M3_OK) goto fail;
        *out = d;
        return M3_OK;
    }
    if (!file_exists(path)) { st = m3_errorf(M3_ERR_IO, "%s: no such file", path); goto fail; }
#if H5_VERSION_GE(1, 12, 0)
    htri_t is_h5 = H5Fis_accessible(path, H5P_DEFAULT);
#else
    htri_t is_h5 = H5Fis_hdf5(path);
#endif
    if (is_h5 <= 0) {
        st = m3_errorf(M3_ERR_FORMAT, "%s: not an HDF5 file (or truncated/corrupt)", path);
        goto fail;
    }
    d->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (d->file < 0) {
        st = m3_errorf(M3_ERR_FORMAT, "%s: cannot open as HDF5 (truncated or corrupt?)", path);
        goto fail;
    }
    char *fmt = NULL;
    st = attr_read_str(d, d->file, "format", &fmt);
    if (st != M3_OK || strcmp(fmt, M3_DUMP_FORMAT) != 0) {
        st = m3_errorf(M3_ERR_FORMAT, "%s: not an m3-dump (attribute format is %s%s%s)", path,
                       fmt ? "'" : "", fmt ? fmt : "missing", fmt ? "'" : "");
        free(fmt);
        goto fail;
    }
    free(fmt);
    int64_t ver = 0;
    st = attr_read_int(d, d->file, "format_version", &ver);
    if (st != M3_OK) goto fail;
    if (ver != M3_DUMP_FORMAT_VERSION) {
        st = m3_errorf(M3_ERR_UNSUPPORTED, "%s: format_version %lld not supported (this reader: %d)",
                       path, (long long)ver, M3_DUMP_FORMAT_VERSION);
        goto fail;
    }
    *out = d;
    return M3_OK;
fail:
    m3_dump_close(d);
    return st;
}

m3_status m3_dump_commit(m3_dump *d) {
    M3_TRY(need_write(d, "commit"));
    close_cur(d);
    m3_status st = M3_OK;
    if (H5Fflush(d->file, H5F_SCOPE_GLOBAL) < 0)
        st = m3_errorf(M3_ERR_IO, "%s: flush failed", d->tmp_path);
    if (H5Fclose(d->file) < 0 && st == M3_OK)
        st = m3_errorf(M3_ERR_IO, "%s: close failed", d->tmp_path);
    d->file = -1;
    if (st == M3_OK && rename(d->tmp_path, d->path) != 0)
        st = m3_errorf(M3_ERR_IO, "%s: cannot rename %s into place: %s", d->path, d->tmp_path,
                       strerror(errno));
    if (st != M3_OK) {
        unlink(d->tmp_path);
        return st;
    }
    d->committed = true;
    return M3_OK;
}

void m3_dump_close(m3_dump *d) {
    if (!d) return;
    close_cur(d);
    if (d->file >= 0) H5Fclose(d->file);
    if ((d->flags & M3_DUMP_CREATE) && !d->committed && d->tmp_path) unlink(d->tmp_path);
    free(d->tmp_path);
    free(d->path);
    free(d);
}

/* ---- datasets ------------------------------------------------------------------------ */

bool m3_dump_has(m3_dump *d, const char *key) {
    if (d->file < 0 || !key[0]) return false;
    /* H5Lexists fails on a missing intermediate group: walk the path one link at a time */
    char buf[512];
    size_t n = strlen(key);
    if (n >= sizeof buf) return false;
    memcpy(buf, key, n + 1);
    for (char *p = buf;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (H5Lexists(d->file, buf, H5P_DEFAULT) <= 0) return false;
            if (!c) break;
            *p = c;
        }
    }
    H5O_info_t info;
#if H5_VERSION_GE(1, 12, 0)
    if (H5Oget_info_by_name3(d->file, key, &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return false;
#else
    if (H5Oget_info_by_name2(d->file, key, &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return false;
#endif
    return info.type == H5O_TYPE_DATASET;
}

/* Make `key` the streaming dataset (d->cur_*). */
static m3_status open_cur(m3_dump *d, const char *key) {
    if (d->cur_key && strcmp(d->cur_key, key) == 0) return M3_OK;
    close_cur(d);
    if (!m3_dump_has(d, key)) return m3_errorf(M3_ERR_MISSING, "%s: no dataset '%s'", d->path, key);
    m3_status st = M3_OK;
    hid_t t = -1;
    d->cur_dset = H5Dopen2(d->file, key, H5P_DEFAULT);
    if (d->cur_dset < 0) { st = m3_errorf(M3_ERR_FORMAT, "%s: cannot open dataset '%s'", d->path, key); goto done; }
    d->cur_space = H5Dget_space(d->cur_dset);
    t = H5Dget_type(d->cur_dset);
    int rank = d->cur_space < 0 ? -1 : H5Sget_simple_extent_ndims(d->cur_space);
    if (t < 0 || rank < 0 || rank > M3_MAX_RANK) {
        st = m3_errorf(M3_ERR_FORMAT, "%s: dataset '%s' has an unreadable shape", d->path, key);
        goto done;
    }
    d->cur_rank = rank;
    H5Sget_simple_extent_dims(d->cur_space, d->cur_dims, NULL);
    H5T_class_t c = H5Tget_class(t);
    if (c == H5T_FLOAT)
        d->cur_dtype = M3_DT_F32;
    else if (c == H5T_INTEGER)
        d->cur_dtype = M3_DT_I32;
    else {
        st = m3_errorf(M3_ERR_FORMAT, "%s: dataset '%s' is neither float nor integer", d->path, key);
        goto done;
    }
    d->cur_key = xstrdup(key);
    if (!d->cur_key) st = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", d->path);
done:
    if (t >= 0) H5Tclose(t);
    if (st != M3_OK) close_cur(d);
    return st;
}

m3_status m3_dump_info(m3_dump *d, const char *key, m3_tensor *meta) {
    M3_TRY(open_cur(d, key));
    memset(meta, 0, sizeof *meta);
    meta->dtype = d->cur_dtype;
    meta->rank = d->cur_rank;
    for (int i = 0; i < d->cur_rank; i++) meta->shape[i] = (int64_t)d->cur_dims[i];
    if (m3_tensor_numel(meta) < 0)
        return m3_errorf(M3_ERR_FORMAT, "%s: dataset '%s' is too large", d->path, key);
    return M3_OK;
}

m3_status m3_dump_read_rows(m3_dump *d, const char *key, int64_t row0, int64_t n_rows, void *buf) {
    M3_TRY(open_cur(d, key));
    int64_t rows = d->cur_rank == 0 ? 1 : (int64_t)d->cur_dims[0];
    if (row0 < 0 || n_rows < 0 || row0 > rows || n_rows > rows - row0)
        return m3_errorf(M3_ERR_ARG, "%s: rows [%lld, %lld) outside '%s' (%lld rows)", d->path,
                         (long long)row0, (long long)(row0 + n_rows), key, (long long)rows);
    if (n_rows == 0) return M3_OK;
    hid_t mtype = d->cur_dtype == M3_DT_F32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT32;
    m3_status st = M3_OK;
    hid_t msp = -1;
    herr_t rc;
    if (d->cur_rank == 0 || (row0 == 0 && n_rows == rows)) {
        rc = H5Dread(d->cur_dset, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    } else {
        hsize_t start[M3_MAX_RANK] = {0}, count[M3_MAX_RANK];
        for (int i = 0; i < d->cur_rank; i++) count[i] = d->cur_dims[i];
        start[0] = (hsize_t)row0;
        count[0] = (hsize_t)n_rows;
        msp = H5Screate_simple(d->cur_rank, count, NULL);
        if (msp < 0 || H5Sselect_hyperslab(d->cur_space, H5S_SELECT_SET, start, NULL, count, NULL) < 0) {
            st = m3_errorf(M3_ERR_FORMAT, "%s: cannot select rows of '%s'", d->path, key);
            goto done;
        }
        rc = H5Dread(d->cur_dset, mtype, msp, d->cur_space, H5P_DEFAULT, buf);
    }
    if (rc < 0)
        st = m3_errorf(M3_ERR_FORMAT, "%s: read of '%s' failed (truncated or corrupt file?)",
                       d->path, key);
done:
    if (msp >= 0) H5Sclose(msp);
    return st;
}

m3_status m3_dump_read(m3_dump *d, const char *key, m3_tensor *out) {
    memset(out, 0, sizeof *out);
    m3_tensor meta;
    M3_TRY(m3_dump_info(d, key, &meta));
    int64_t n = m3_tensor_numel(&meta);
    void *p = malloc(n > 0 ? (size_t)n * 4 : 1);
    if (!p) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory reading '%s'", d->path, key);
    int64_t rows = meta.rank == 0 ? 1 : meta.shape[0];
    m3_status st = m3_dump_read_rows(d, key, 0, rows, p);
    if (st != M3_OK) {
        free(p);
        return st;
    }
    *out = meta;
    out->data = p;
    return M3_OK;
}

m3_status m3_dump_write(m3_dump *d, const char *key, const m3_tensor *t, const char *produced_dtype) {
    M3_TRY(need_write(d, "write"));
    if (t->dtype != M3_DT_F32 && t->dtype != M3_DT_I32)
        return m3_errorf(M3_ERR_ARG, "%s: '%s': dumps hold F32 or I32 only, not %s", d->path, key,
                         m3_dtype_name(t->dtype));
    if (t->rank < 0 || t->rank > M3_MAX_RANK || m3_tensor_numel(t) < 0)
        return m3_errorf(M3_ERR_ARG, "%s: '%s': bad shape", d->path, key);
    if (m3_dump_has(d, key)) return m3_errorf(M3_ERR_ARG, "%s: '%s' written twice", d->path, key);
    close_cur(d);
    m3_status st = M3_OK;
    hid_t sp = -1, lcpl = -1, dcpl = -1, ds = -1;
    hsize_t dims[M3_MAX_RANK], chunk[M3_MAX_RANK];
    bool any_zero = false;
    int64_t row_bytes = 4;
    for (int i = 0; i < t->rank; i++) {
        dims[i] = chunk[i] = (hsize_t)t->shape[i];
        if (t->shape[i] == 0) any_zero = true;
        if (i > 0) row_bytes *= t->shape[i];
    }
    sp = t->rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(t->rank, dims, NULL);
    lcpl = H5Pcreate(H5P_LINK_CREATE);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (sp < 0 || lcpl < 0 || dcpl < 0) { st = m3_errorf(M3_ERR_IO, "%s: HDF5 setup failed", d->path); goto done; }
    H5Pset_create_intermediate_group(lcpl, 1);
    if (t->rank > 0 && !any_zero) {
        /* Chunks of whole rows, about 1 MiB: the streaming reader asks for row ranges, and
         * HDF5 reads whole chunks straight into the caller's buffer when they line up. */
        int64_t cr = (int64_t)1 << 20;
        cr = row_bytes >= cr ? 1 : cr / row_bytes;
        if (cr > t->shape[0]) cr = t->shape[0];
        chunk[0] = (hsize_t)cr;
        /* HDF5 caps a chunk at 4 GiB: halve the widest trailing dim of a gigantic row */
        for (;;) {
            uint64_t bytes = 4;
            int widest = 0;
            for (int j = 0; j < t->rank; j++) {
                bytes *= chunk[j];
                if (j > 0 && (widest == 0 || chunk[j] > chunk[widest])) widest = j;
            }
            if (bytes < ((uint64_t)1 << 31) || widest == 0 || chunk[widest] <= 1) break;
            chunk[widest] = (chunk[widest] + 1) / 2;
        }
        H5Pset_chunk(dcpl, t->rank, chunk);
        if (d->flags & M3_DUMP_GZIP) {
            H5Pset_shuffle(dcpl);
            H5Pset_deflate(dcpl, 1);
        }
    }
    hid_t ftype = t->dtype == M3_DT_F32 ? H5T_IEEE_F32LE : H5T_STD_I32LE;
    hid_t mtype = t->dtype == M3_DT_F32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT32;
    ds = H5Dcreate2(d->file, key, ftype, sp, lcpl, dcpl, H5P_DEFAULT);
    if (ds < 0) { st = m3_errorf(M3_ERR_IO, "%s: cannot create dataset '%s'", d->path, key); goto done; }
    if (m3_tensor_numel(t) > 0 && H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data) < 0) {
        st = m3_errorf(M3_ERR_IO, "%s: write of '%s' failed (disk full?)", d->path, key);
        goto done;
    }
    st = attr_write_str(d, ds, "produced_dtype",
                        produced_dtype ? produced_dtype : (t->dtype == M3_DT_F32 ? "float32" : "int32"));
done:
    if (ds >= 0) H5Dclose(ds);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (lcpl >= 0) H5Pclose(lcpl);
    if (sp >= 0) H5Sclose(sp);
    return st;
}

/* ---- listing ------------------------------------------------------------------------- */

typedef struct {
    char **v;
    int n, cap;
    bool oom;
} strvec;

static void sv_push(strvec *s, const char *x) {
    if (s->oom) return;
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 64;
        char **nv = realloc(s->v, (size_t)nc * sizeof *nv);
        if (!nv) { s->oom = true; return; }
        s->v = nv;
        s->cap = nc;
    }
    char *c = xstrdup(x);
    if (!c) { s->oom = true; return; }
    s->v[s->n++] = c;
}

void m3_dump_list_free(char **keys, int n) {
    if (!keys) return;
    for (int i = 0; i < n; i++) free(keys[i]);
    free(keys);
}

#if H5_VERSION_GE(1, 12, 0)
static herr_t visit_cb(hid_t o, const char *name, const H5O_info2_t *info, void *op) {
#else
static herr_t visit_cb(hid_t o, const char *name, const H5O_info_t *info, void *op) {
#endif
    (void)o;
    if (info->type == H5O_TYPE_DATASET) sv_push(op, name);
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

m3_status m3_dump_list(m3_dump *d, char ***keys, int *n) {
    strvec s = {0};
    *keys = NULL;
    *n = 0;
#if H5_VERSION_GE(1, 12, 0)
    herr_t rc = H5Ovisit3(d->file, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &s, H5O_INFO_BASIC);
#else
    herr_t rc = H5Ovisit2(d->file, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &s, H5O_INFO_BASIC);
#endif
    if (rc < 0 || s.oom) {
        m3_dump_list_free(s.v, s.n);
        return s.oom ? m3_errorf(M3_ERR_NOMEM, "%s: out of memory listing", d->path)
                     : m3_errorf(M3_ERR_FORMAT, "%s: cannot list datasets (corrupt file?)", d->path);
    }
    if (s.n > 1) qsort(s.v, (size_t)s.n, sizeof *s.v, cmp_str);
    *keys = s.v;
    *n = s.n;
    return M3_OK;
}

static herr_t attr_cb(hid_t loc, const char *name, const H5A_info_t *ai, void *op) {
    (void)loc;
    (void)ai;
    sv_push(op, name);
    return 0;
}

/* Open the object a key names ("/" or NULL: the file root). Caller closes with H5Oclose. */
static hid_t open_obj(m3_dump *d, const char *key) {
    if (!key || !key[0] || !strcmp(key, "/")) return H5Oopen(d->file, "/", H5P_DEFAULT);
    if (!m3_dump_has(d, key)) return -1;
    return H5Oopen(d->file, key, H5P_DEFAULT);
}

m3_status m3_dump_attr_names(m3_dump *d, const char *key, char ***names, int *n) {
    strvec s = {0};
    *names = NULL;
    *n = 0;
    hid_t o = open_obj(d, key);
    if (o < 0) return m3_errorf(M3_ERR_MISSING, "%s: no object '%s'", d->path, key ? key : "/");
    hsize_t idx = 0;
    herr_t rc = H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_INC, &idx, attr_cb, &s);
    H5Oclose(o);
    if (rc < 0 || s.oom) {
        m3_dump_list_free(s.v, s.n);
        return m3_errorf(M3_ERR_FORMAT, "%s: cannot list attributes of '%s'", d->path, key ? key : "/");
    }
    *names = s.v;
    *n = s.n;
    return M3_OK;
}

m3_status m3_dump_get_dset_attr_ints(m3_dump *d, const char *key, const char *name,
                                     int64_t **vals, int64_t *n) {
    *vals = NULL;
    *n = 0;
    hid_t o = open_obj(d, key);
    if (o < 0) return m3_errorf(M3_ERR_MISSING, "%s: no dataset '%s'", d->path, key);
    m3_status st = M3_OK;
    hid_t a = -1, t = -1, sp = -1;
    if (H5Aexists(o, name) <= 0) { st = m3_errorf(M3_ERR_MISSING, "%s: '%s' has no attribute '%s'", d->path, key, name); goto done; }
    a = H5Aopen(o, name, H5P_DEFAULT);
    t = a < 0 ? -1 : H5Aget_type(a);
    sp = a < 0 ? -1 : H5Aget_space(a);
    if (t < 0 || sp < 0 || H5Tget_class(t) != H5T_INTEGER) {
        st = m3_errorf(M3_ERR_FORMAT, "%s: '%s' attribute '%s' is not integer", d->path, key, name);
        goto done;
    }
    hssize_t np = H5Sget_simple_extent_npoints(sp);
    if (np < 0) { st = m3_errorf(M3_ERR_FORMAT, "%s: '%s' attribute '%s' unreadable", d->path, key, name); goto done; }
    long long *v = malloc((size_t)(np > 0 ? np : 1) * sizeof *v);
    if (!v) { st = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", d->path); goto done; }
    if (np > 0 && H5Aread(a, H5T_NATIVE_LLONG, v) < 0) {
        free(v);
        st = m3_errorf(M3_ERR_FORMAT, "%s: '%s' attribute '%s' unreadable", d->path, key, name);
        goto done;
    }
    *vals = (int64_t *)v; /* long long and int64_t are both 64-bit here */
    *n = (int64_t)np;
done:
    attr_close(a, t, sp);
    H5Oclose(o);
    return st;
}

m3_status m3_dump_attr_text(m3_dump *d, const char *key, const char *name, char **out) {
    *out = NULL;
    hid_t o = open_obj(d, key);
    if (o < 0) return m3_errorf(M3_ERR_MISSING, "%s: no object '%s'", d->path, key ? key : "/");
    m3_status st = M3_OK;
    hid_t a = -1, t = -1, sp = -1;
    if (H5Aexists(o, name) <= 0) { st = m3_errorf(M3_ERR_MISSING, "%s: no attribute '%s'", d->path, name); goto done; }
    a = H5Aopen(o, name, H5P_DEFAULT);
    t = a < 0 ? -1 : H5Aget_type(a);
    sp = a < 0 ? -1 : H5Aget_space(a);
    if (t < 0 || sp < 0) { st = m3_errorf(M3_ERR_FORMAT, "%s: attribute '%s' unreadable", d->path, name); goto done; }
    H5T_class_t c = H5Tget_class(t);
    hssize_t np = H5Sget_simple_extent_npoints(sp);
    if (c == H5T_STRING) {
        st = attr_read_str(d, o, name, out);
    } else if ((c == H5T_INTEGER || c == H5T_FLOAT) && np >= 0 && np <= 4096) {
        double *v = malloc((size_t)(np > 0 ? np : 1) * sizeof *v);
        size_t cap = (size_t)np * 26 + 8;
        char *s = malloc(cap);
        if (!v || !s || (np > 0 && H5Aread(a, H5T_NATIVE_DOUBLE, v) < 0)) {
            free(v);
            free(s);
            st = m3_errorf(M3_ERR_FORMAT, "%s: attribute '%s' unreadable", d->path, name);
            goto done;
        }
        size_t k = 0;
        bool list = H5Sget_simple_extent_ndims(sp) > 0;
        if (list) k += (size_t)snprintf(s + k, cap - k, "[");
        for (hssize_t i = 0; i < np; i++)
            k += (size_t)snprintf(s + k, cap - k, "%s%.9g", i ? ", " : "", v[i]);
        if (list) snprintf(s + k, cap - k, "]");
        free(v);
        *out = s;
    } else {
        *out = xstrdup("<unsupported attribute type>");
    }
done:
    attr_close(a, t, sp);
    H5Oclose(o);
    return st;
}

/* ---- key names ----------------------------------------------------------------------- */

int m3_dump_layer_digits(int n_layers) { return n_layers >= 100 ? 3 : 2; }

int m3_dump_key(char *buf, size_t cap, int pass, int layer, int n_layers, const char *stage) {
    char pre[32] = "", lay[32] = "";
    if (pass >= 0) snprintf(pre, sizeof pre, "passes/%04d/", pass);
    if (layer >= 0) snprintf(lay, sizeof lay, "layers/%0*d/", m3_dump_layer_digits(n_layers), layer);
    return snprintf(buf, cap, "%s%s%s", pre, lay, stage);
}
