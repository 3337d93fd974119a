/* ref/json.h: the project's only JSON access. A thin, read-only view over cJSON (the only
 * file that includes <cjson/cJSON.h> is ref/json.c) plus a tiny streaming writer for
 * `--json` outputs.
 *
 * Reading: parse text or a file into an opaque tree (m3_json). Nodes are borrowed from the
 * tree and live until m3_json_free(root). Lookups are NULL-safe: m3_json_get(NULL, k) is
 * NULL, and every typed getter takes a default returned when the node is absent, null or of
 * another type, so config code can be written as a flat list of field reads.
 * Parse errors are recorded with m3_errorf as "<what>: invalid JSON at line L column C
 * (byte B)", one line, and M3_ERR_FORMAT is returned.
 *
 * Duplicate member names: m3_json_get returns the last one (Python's json semantics).
 *
 * Numbers: cJSON keeps every number as a double. m3_json_int() accepts only numbers that are
 * integral and below 2^53 in magnitude (exactly representable), so byte offsets of a 854 GB checkpoint
 * (< 2^40) are exact and 1e300 or 1.5 is refused rather than silently truncated.
 *
 * Writing (m3_jw): pretty-prints one JSON document to a FILE*. Strings are escaped per RFC
 * 8259 (control characters as \u00XX), integers are printed exactly (%lld), doubles with
 * %.17g (round-trips binary64); non-finite doubles are written as null (JSON has no NaN). */
#ifndef M3_JSON_H
#define M3_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ref/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct m3_json m3_json; /* opaque: a node of a parsed tree */

/* Parse len bytes of text (need not be NUL-terminated). `what` names the source in errors
 * (a file name). On success *out owns the tree: free with m3_json_free. */
m3_status m3_json_parse(m3_json **out, const char *text, size_t len, const char *what);
/* Read and parse a whole file. When text_out is non-NULL it receives the verbatim file text
 * (NUL-terminated, caller frees with free()) and len_out its length. Files above max_bytes
 * are refused (M3_ERR_FORMAT) before being read; 0 means 256 MiB. */
m3_status m3_json_parse_file(m3_json **out, const char *path, size_t max_bytes, char **text_out,
                             size_t *len_out);
void m3_json_free(m3_json *root); /* NULL ok */

/* Structure. All accept NULL and then return false / 0 / NULL. */
bool m3_json_is_object(const m3_json *j);
bool m3_json_is_array(const m3_json *j);
bool m3_json_is_number(const m3_json *j);
bool m3_json_is_string(const m3_json *j);
bool m3_json_is_bool(const m3_json *j);
bool m3_json_is_null(const m3_json *j);
const m3_json *m3_json_get(const m3_json *obj, const char *key); /* member (case-sensitive) */
int m3_json_size(const m3_json *j);                  /* array length / object member count */
const m3_json *m3_json_at(const m3_json *arr, int i); /* array element, NULL out of range */
/* Iterate children of an array or object: for (c = first(j); c; c = next(c)). */
const m3_json *m3_json_first(const m3_json *j);
const m3_json *m3_json_next(const m3_json *j);
const char *m3_json_key(const m3_json *member); /* member name inside an object, else NULL */

/* Scalars of a node. */
bool m3_json_int(const m3_json *j, int64_t *out);  /* integral number, |v| < 2^53 */
bool m3_json_double(const m3_json *j, double *out); /* any number */
const char *m3_json_str(const m3_json *j);          /* string value or NULL (borrowed) */
/* Typed member getters with defaults (absent, null or wrong type -> def). */
int64_t m3_json_get_int(const m3_json *obj, const char *key, int64_t def);
double m3_json_get_double(const m3_json *obj, const char *key, double def);
const char *m3_json_get_str(const m3_json *obj, const char *key, const char *def);
/* true/false, and also the numbers 0/1 (original configs write flags as 0/1). */
bool m3_json_get_bool(const m3_json *obj, const char *key, bool def);
/* A node that is a boolean, or the number 0 or 1: *out set, returns true. */
bool m3_json_bool(const m3_json *j, bool *out);

/* ---- writer ---------------------------------------------------------------------------- */
#define M3_JW_MAX_DEPTH 32
typedef struct m3_jw {
    FILE *f;
    int depth;
    bool first[M3_JW_MAX_DEPTH]; /* no member written yet at this depth */
    bool array[M3_JW_MAX_DEPTH]; /* container at this depth is an array */
} m3_jw;

/* Every value function takes `key`: the member name inside an object, NULL inside an array
 * or for the top-level value. Nesting deeper than M3_JW_MAX_DEPTH is a bug (asserts). */
void m3_jw_init(m3_jw *w, FILE *f);
void m3_jw_object(m3_jw *w, const char *key); /* open {  */
void m3_jw_array(m3_jw *w, const char *key);  /* open [  */
void m3_jw_end(m3_jw *w);                     /* close the innermost container; at depth 0 ends the line */
void m3_jw_str(m3_jw *w, const char *key, const char *v); /* v NULL -> null */
void m3_jw_int(m3_jw *w, const char *key, int64_t v);
void m3_jw_double(m3_jw *w, const char *key, double v);
void m3_jw_bool(m3_jw *w, const char *key, bool v);
void m3_jw_null(m3_jw *w, const char *key);
/* Write s as a quoted, escaped JSON string. */
void m3_json_write_string(FILE *f, const char *s);

#ifdef __cplusplus
}
#endif
#endif
