/* ref/base.h: status codes, assertions, error messages, logging, dtypes and the I/O-only
 * tensor descriptor. Everything in m3kit includes this first.
 *
 * Errors: library code never exits and never prints an error itself. A failing function
 * records ONE line of context with m3_errorf() and returns a negative m3_status; callers
 * propagate with M3_TRY. Only main() prints (m3_last_error()) and chooses the exit code.
 * Bugs (contract violations) abort through M3_ASSERT with file:line: always compiled in. */
#ifndef M3_BASE_H
#define M3_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    M3_OK = 0,
    M3_ERR_IO = -1,          /* open/read/write/mmap failed */
    M3_ERR_FORMAT = -2,      /* malformed file, JSON, header, dump */
    M3_ERR_NOMEM = -3,       /* allocation failed */
    M3_ERR_DEVICE = -4,      /* GPU runtime / launch failure */
    M3_ERR_UNSUPPORTED = -5, /* valid input we do not implement */
    M3_ERR_ARG = -6,         /* bad argument or option value */
    M3_ERR_SHAPE = -7,       /* tensor shape disagrees with the config */
    M3_ERR_MISSING = -8,     /* required tensor / key / stage absent */
    M3_ERR_NUMERIC = -9      /* NaN / Inf where a finite value is required */
} m3_status;

const char *m3_status_str(m3_status s);

/* Record the error line for the current thread and return `s` (so `return m3_errorf(...)`).
 * The message should name the file or object and the problem, without a trailing newline. */
m3_status m3_errorf(m3_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefix the recorded message with "ctx: " (adds context on the way up). Returns s. */
m3_status m3_error_context(m3_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *m3_last_error(void); /* "" when none */
void m3_clear_error(void);

/* Logging to stderr. Level from M3_LOG (0 quiet, 1 warn [default], 2 info, 3 debug). */
enum { M3_LOG_WARN = 1, M3_LOG_INFO = 2, M3_LOG_DEBUG = 3 };
void m3_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define m3_warn(...) m3_log(M3_LOG_WARN, __VA_ARGS__)
#define m3_info(...) m3_log(M3_LOG_INFO, __VA_ARGS__)

void m3_assert_fail(const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
#define M3_ASSERT(c) ((c) ? (void)0 : m3_assert_fail(__FILE__, __LINE__, #c, NULL))
#define M3_ASSERTF(c, ...) ((c) ? (void)0 : m3_assert_fail(__FILE__, __LINE__, #c, __VA_ARGS__))

#define M3_TRY(expr)                                                                              \
    do {                                                                                          \
        m3_status m3_try_s_ = (expr);                                                             \
        if (m3_try_s_ != M3_OK) return m3_try_s_;                                                 \
    } while (0)

/* Element types, as safetensors names them (m3_dtype_name gives that name). */
typedef enum {
    M3_DT_INVALID = 0,
    M3_DT_BOOL, M3_DT_U8, M3_DT_I8, M3_DT_U16, M3_DT_I16, M3_DT_U32, M3_DT_I32,
    M3_DT_U64, M3_DT_I64, M3_DT_F16, M3_DT_BF16, M3_DT_F32, M3_DT_F64,
    M3_DT_F8_E4M3,     /* e4m3fn (OCP) */
    M3_DT_F8_E4M3FNUZ, /* gfx942 flavour; not a safetensors name, used in memory only */
    M3_DT_F8_E5M2, M3_DT_F8_E8M0,
    M3_DT_F4,          /* e2m1, two per byte, element 2i in the low nibble */
    M3_DT_COUNT
} m3_dtype;

const char *m3_dtype_name(m3_dtype t);
m3_dtype m3_dtype_from_name(const char *name); /* M3_DT_INVALID when unknown */
/* Size in bits of one element (4 for F4) */
int m3_dtype_bits(m3_dtype t);

#define M3_MAX_RANK 8
/* I/O-boundary tensor (dumps, weight lookup). Never appears in op signatures. */
typedef struct m3_tensor {
    m3_dtype dtype;
    int rank;
    int64_t shape[M3_MAX_RANK];
    void *data; /* ownership stated by whoever hands it out */
} m3_tensor;

int64_t m3_tensor_numel(const m3_tensor *t);
/* Free t->data (which the producer allocated with malloc, e.g. m3_dump_read) and set it to
 * NULL. NULL t is a no-op. */
void m3_tensor_free(m3_tensor *t);
/* Element count of a shape with overflow checks: -1 when a dim is negative or the product
 * overflows int64. */
int64_t m3_shape_numel(const int64_t *shape, int rank);

/* Number of worker threads (M3_THREADS env or --threads; default: online CPUs). */
int m3_threads(void);
void m3_set_threads(int n);

/* Run fn(ctx, i) for i in [0, n) over m3_threads() pthreads. Rows are independent by
 * contract, so results never depend on the thread count. Runs inline when n <= 1 or one
 * thread is configured. */
typedef void (*m3_row_fn)(void *ctx, int64_t i);
void m3_parallel_for(int64_t n, m3_row_fn fn, void *ctx);

#define M3_VERSION "0.1.0"
const char *m3_version_string(void); /* "0.1.0 (git abc1234)" */

#ifdef __cplusplus
}
#endif
#endif
