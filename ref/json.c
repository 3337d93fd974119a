/* ref/json.c: see json.h. The only file that includes cJSON. */
#include "ref/json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* m3_json is an alias of cJSON: the type stays opaque outside this file. */
#define CJ(j) ((const cJSON *)(const void *)(j))
#define MJ(c) ((const m3_json *)(const void *)(c))

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

m3_status m3_json_parse(m3_json **out, const char *text, size_t len, const char *what) {
    *out = NULL;
    if (!what) what = "JSON";
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t pos = end && end >= text ? (size_t)(end - text) : 0;
    if (pos > len) pos = len;
    if (root) {
        /* trailing bytes after the value: only whitespace (safetensors pads with spaces) */
        size_t i = pos;
        while (i < len && is_ws(text[i])) i++;
        if (i == len) {
            *out = (m3_json *)(void *)root;
            return M3_OK;
        }
        cJSON_Delete(root);
        pos = i;
    }
    long line = 1, col = 1;
    for (size_t i = 0; i < pos; i++) {
        if (text[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    if (root) /* parsed a value, then found garbage */
        return m3_errorf(M3_ERR_FORMAT,
                         "%s: invalid JSON: unexpected data after the value at line %ld column "
                         "%ld (byte %zu)",
                         what, line, col, pos);
    if (pos >= len)
        return m3_errorf(M3_ERR_FORMAT, "%s: invalid JSON: unexpected end of text (byte %zu)",
                         what, pos);
    return m3_errorf(M3_ERR_FORMAT, "%s: invalid JSON at line %ld column %ld (byte %zu)", what,
                     line, col, pos);
}

m3_status m3_json_parse_file(m3_json **out, const char *path, size_t max_bytes, char **text_out,
                             size_t *len_out) {
    *out = NULL;
    if (text_out) *text_out = NULL;
    if (len_out) *len_out = 0;
    if (!max_bytes) max_bytes = (size_t)256 << 20;
    FILE *f = fopen(path, "rb");
    if (!f) return m3_errorf(M3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return m3_errorf(M3_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > (uint64_t)max_bytes) {
        fclose(f);
        return m3_errorf(M3_ERR_FORMAT, "%s: %lld bytes is too large for a JSON file (limit %zu)",
                         path, (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return m3_errorf(M3_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = n ? fread(buf, 1, n, f) : 0;
    int rerr = ferror(f);
    fclose(f);
    if (got != n || rerr) {
        free(buf);
        return m3_errorf(M3_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = 0;
    m3_status s = m3_json_parse(out, buf, n, path);
    if (s == M3_OK && text_out) {
        *text_out = buf;
        if (len_out) *len_out = n;
    } else {
        free(buf);
    }
    return s;
}

void m3_json_free(m3_json *root) {
    if (root) cJSON_Delete((cJSON *)(void *)root);
}

bool m3_json_is_object(const m3_json *j) { return j && cJSON_IsObject(CJ(j)); }
bool m3_json_is_array(const m3_json *j) { return j && cJSON_IsArray(CJ(j)); }
bool m3_json_is_number(const m3_json *j) { return j && cJSON_IsNumber(CJ(j)); }
bool m3_json_is_string(const m3_json *j) { return j && cJSON_IsString(CJ(j)); }
bool m3_json_is_bool(const m3_json *j) { return j && cJSON_IsBool(CJ(j)); }
bool m3_json_is_null(const m3_json *j) { return j && cJSON_IsNull(CJ(j)); }

const m3_json *m3_json_get(const m3_json *obj, const char *key) {
    if (!m3_json_is_object(obj) || !key) return NULL;
    /* the LAST member of that name wins, as in Python's json (which wrote these files) */
    const cJSON *hit = NULL;
    for (const cJSON *c = CJ(obj)->child; c; c = c->next)
        if (c->string && !strcmp(c->string, key)) hit = c;
    return MJ(hit);
}

int m3_json_size(const m3_json *j) {
    if (!j || !(cJSON_IsArray(CJ(j)) || cJSON_IsObject(CJ(j)))) return 0;
    return cJSON_GetArraySize(CJ(j));
}

const m3_json *m3_json_at(const m3_json *arr, int i) {
    if (!m3_json_is_array(arr) || i < 0) return NULL;
    return MJ(cJSON_GetArrayItem(CJ(arr), i));
}

const m3_json *m3_json_first(const m3_json *j) {
    if (!j || !(cJSON_IsArray(CJ(j)) || cJSON_IsObject(CJ(j)))) return NULL;
    return MJ(CJ(j)->child);
}

const m3_json *m3_json_next(const m3_json *j) { return j ? MJ(CJ(j)->next) : NULL; }

const char *m3_json_key(const m3_json *member) { return member ? CJ(member)->string : NULL; }

bool m3_json_int(const m3_json *j, int64_t *out) {
    if (!m3_json_is_number(j)) return false;
    double d = CJ(j)->valuedouble;
    /* from 2^53 on not every integer is representable: the text may have been rounded */
    if (!isfinite(d) || d != floor(d) || fabs(d) >= 9007199254740992.0) return false;
    *out = (int64_t)d;
    return true;
}

bool m3_json_double(const m3_json *j, double *out) {
    if (!m3_json_is_number(j)) return false;
    *out = CJ(j)->valuedouble;
    return true;
}

const char *m3_json_str(const m3_json *j) {
    return m3_json_is_string(j) ? CJ(j)->valuestring : NULL;
}

bool m3_json_bool(const m3_json *j, bool *out) {
    if (m3_json_is_bool(j)) {
        *out = cJSON_IsTrue(CJ(j));
        return true;
    }
    int64_t v;
    if (m3_json_int(j, &v) && (v == 0 || v == 1)) {
        *out = v == 1;
        return true;
    }
    return false;
}

int64_t m3_json_get_int(const m3_json *obj, const char *key, int64_t def) {
    int64_t v;
    return m3_json_int(m3_json_get(obj, key), &v) ? v : def;
}

double m3_json_get_double(const m3_json *obj, const char *key, double def) {
    double v;
    return m3_json_double(m3_json_get(obj, key), &v) ? v : def;
}

const char *m3_json_get_str(const m3_json *obj, const char *key, const char *def) {
    const char *s = m3_json_str(m3_json_get(obj, key));
    return s ? s : def;
}

bool m3_json_get_bool(const m3_json *obj, const char *key, bool def) {
    bool v;
    return m3_json_bool(m3_json_get(obj, key), &v) ? v : def;
}

/* ---- writer ---------------------------------------------------------------------------- */

void m3_json_write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

void m3_jw_init(m3_jw *w, FILE *f) {
    memset(w, 0, sizeof *w);
    w->f = f;
    w->first[0] = true;
}

static void jw_indent(m3_jw *w) {
    fputc('\n', w->f);
    for (int i = 0; i < w->depth; i++) fputs("  ", w->f);
}

/* separator, indentation and key before a value */
static void jw_pre(m3_jw *w, const char *key) {
    if (w->depth == 0) return;
    M3_ASSERTF(w->array[w->depth] ? key == NULL : key != NULL,
               "m3_jw: %s inside an %s", key ? "key" : "missing key",
               w->array[w->depth] ? "array" : "object");
    if (!w->first[w->depth]) fputc(',', w->f);
    w->first[w->depth] = false;
    jw_indent(w);
    if (key) {
        m3_json_write_string(w->f, key);
        fputs(": ", w->f);
    }
}

static void jw_open(m3_jw *w, const char *key, bool array) {
    jw_pre(w, key);
    fputc(array ? '[' : '{', w->f);
    M3_ASSERT(w->depth + 1 < M3_JW_MAX_DEPTH);
    w->depth++;
    w->first[w->depth] = true;
    w->array[w->depth] = array;
}

void m3_jw_object(m3_jw *w, const char *key) { jw_open(w, key, false); }
void m3_jw_array(m3_jw *w, const char *key) { jw_open(w, key, true); }

void m3_jw_end(m3_jw *w) {
    M3_ASSERT(w->depth > 0);
    bool empty = w->first[w->depth], arr = w->array[w->depth];
    w->depth--;
    if (!empty) jw_indent(w);
    fputc(arr ? ']' : '}', w->f);
    if (w->depth == 0) fputc('\n', w->f);
}

void m3_jw_str(m3_jw *w, const char *key, const char *v) {
    jw_pre(w, key);
    if (v)
        m3_json_write_string(w->f, v);
    else
        fputs("null", w->f);
}

void m3_jw_int(m3_jw *w, const char *key, int64_t v) {
    jw_pre(w, key);
    fprintf(w->f, "%lld", (long long)v);
}

void m3_jw_double(m3_jw *w, const char *key, double v) {
    jw_pre(w, key);
    if (isfinite(v))
        fprintf(w->f, "%.17g", v);
    else
        fputs("null", w->f);
}

void m3_jw_bool(m3_jw *w, const char *key, bool v) {
    jw_pre(w, key);
    fputs(v ? "true" : "false", w->f);
}

void m3_jw_null(m3_jw *w, const char *key) {
    jw_pre(w, key);
    fputs("null", w->f);
}
