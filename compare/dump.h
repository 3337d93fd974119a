/* compare/dump.h: read and write m3-dump/1 activation dumps (HDF5; contract:
 * shared spec/dump-schema.md). The only door to libhdf5: hdf5.h is included by dump.c alone
 * and no hid_t ever leaves it, so the rest of m3kit sees an opaque m3_dump.
 *
 * Data model: every dataset is float32 (M3_DT_F32) or int32 (M3_DT_I32) with rank 0..8 and
 * a path key such as "layers/07/attn_out" or "passes/0001/logits". A "row" for the
 * streaming reader is one index of the FIRST dimension (shape[0]); a row holds
 * prod(shape[1:]) elements. Writers chunk along the first dimension (about 1 MiB per
 * chunk), optionally gzip+shuffle; readers do not care how a file was chunked or filtered.
 *
 * Writing is crash-safe: CREATE writes PATH.tmp and m3_dump_commit renames it to PATH, so a
 * dump that exists under its final name is complete. A CREATE dump closed without commit
 * deletes its tmp file. Creating over an existing PATH fails unless M3_DUMP_FORCE.
 *
 * Errors: every failure returns a status with one m3_errorf line naming the file and key;
 * HDF5's own error printing is switched off. Not thread-safe: one m3_dump per thread. */
#ifndef M3_DUMP_H
#define M3_DUMP_H

#include "ref/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct m3_dump m3_dump;

enum {
    M3_DUMP_READ = 0,   /* open an existing dump read-only */
    M3_DUMP_CREATE = 1, /* new dump: writes PATH.tmp, renamed on m3_dump_commit */
    M3_DUMP_FORCE = 2,  /* with CREATE: allow replacing an existing PATH */
    M3_DUMP_GZIP = 4    /* with CREATE: deflate(1)+shuffle every dataset (smaller, slower) */
};

#define M3_DUMP_FORMAT "m3-dump"
#define M3_DUMP_FORMAT_VERSION 1

/* Open or create. READ checks that PATH is HDF5 with format="m3-dump" and a
 * format_version this reader knows (1). CREATE writes format and format_version itself.
 * On failure *d is NULL. Close with m3_dump_close. */
m3_status m3_dump_open(m3_dump **d, const char *path, int flags);
/* CREATE dumps: flush, close, rename PATH.tmp -> PATH. The handle stays valid for
 * m3_dump_close only (which then does nothing more). */
m3_status m3_dump_commit(m3_dump *d);
/* NULL is a no-op. A CREATE dump that was not committed has its tmp file deleted. */
void m3_dump_close(m3_dump *d);
/* The final path given to m3_dump_open (borrowed, lives as long as d). */
const char *m3_dump_path(const m3_dump *d);

/* File-level attributes on "/" (format, format_version, producer, profile, model_config,
 * variant, ...). Strings are variable-length UTF-8; ints are int64. Setting replaces. */
m3_status m3_dump_set_attr_str(m3_dump *d, const char *name, const char *value);
m3_status m3_dump_set_attr_int(m3_dump *d, const char *name, int64_t value);
/* *out is malloc'd (caller frees). M3_ERR_MISSING when absent, M3_ERR_FORMAT when not a
 * string. */
m3_status m3_dump_get_attr_str(m3_dump *d, const char *name, char **out);
/* M3_ERR_MISSING when absent, M3_ERR_FORMAT when not an integer scalar. */
m3_status m3_dump_get_attr_int(m3_dump *d, const char *name, int64_t *out);
/* Attribute names on "/" (key NULL or "/") or on dataset `key`, in creation/name order.
 * *names is malloc'd; free with m3_dump_list_free. */
m3_status m3_dump_attr_names(m3_dump *d, const char *key, char ***names, int *n);
/* An attribute of any scalar or 1-D type rendered as text ("bfloat16", "1", "[3, 4]");
 * long values are kept whole. *out malloc'd. For `m3 ls` and reports. */
m3_status m3_dump_attr_text(m3_dump *d, const char *key, const char *name, char **out);
/* Integer list attribute on a dataset (e.g. logits "positions"): *vals malloc'd, *n set.
 * A scalar gives n = 1. M3_ERR_MISSING when absent. */
m3_status m3_dump_get_dset_attr_ints(m3_dump *d, const char *key, const char *name,
                                     int64_t **vals, int64_t *n);

/* Write a whole dataset. t->dtype is M3_DT_F32 or M3_DT_I32; t->data holds numel elements.
 * Missing groups are created. produced_dtype (may be NULL: "float32"/"int32") becomes the
 * dataset attribute "produced_dtype". Writing an existing key fails (M3_ERR_ARG). */
m3_status m3_dump_write(m3_dump *d, const char *key, const m3_tensor *t, const char *produced_dtype);

/* Shape and element type of a dataset without reading it: meta->data = NULL,
 * meta->dtype = M3_DT_F32 (any float class) or M3_DT_I32 (any integer class). */
m3_status m3_dump_info(m3_dump *d, const char *key, m3_tensor *meta);
/* Read a whole dataset: out->data is malloc'd float or int32 (per m3_dump_info); free with
 * m3_tensor_free. */
m3_status m3_dump_read(m3_dump *d, const char *key, m3_tensor *out);
/* Read rows [row0, row0 + n_rows) of the first dimension into buf (caller-owned, n_rows *
 * row elements of the dataset's dtype: float or int32). Datasets of rank 0 have one row.
 * Sequential calls on the same key reuse the open dataset (streaming). */
m3_status m3_dump_read_rows(m3_dump *d, const char *key, int64_t row0, int64_t n_rows, void *buf);
bool m3_dump_has(m3_dump *d, const char *key);

/* Every dataset path in the file ("embed", "layers/00/input", ...), sorted bytewise.
 * *keys malloc'd; free with m3_dump_list_free. */
m3_status m3_dump_list(m3_dump *d, char ***keys, int *n);
void m3_dump_list_free(char **keys, int n);

/* Layer group name width: 2 digits, 3 when n_layers >= 100 (schema rule). */
int m3_dump_layer_digits(int n_layers);
/* Build a key: [passes/PPPP/][layers/NN/]stage. pass < 0: single-pass root; layer < 0:
 * global stage. Returns what snprintf returns (>= cap means truncated). */
int m3_dump_key(char *buf, size_t cap, int pass, int layer, int n_layers, const char *stage);

#ifdef __cplusplus
}
#endif
#endif
