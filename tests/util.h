/* tests/util.h: shared test helpers. pcg32 PRNG (seed from M3_SEED, printed on failure),
 * fillers, guarded host buffers, the test-filter hook, and fixture paths. */
#ifndef M3_TEST_UTIL_H
#define M3_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ref/base.h"

typedef struct { uint64_t state, inc; } m3_rng;

uint64_t m3_test_seed(void);                 /* M3_SEED or a fixed default, printed once */
void m3_rng_init(m3_rng *r, uint64_t seed, uint64_t stream);
uint32_t m3_rng_u32(m3_rng *r);
float m3_rng_uniform(m3_rng *r, float lo, float hi); /* [lo, hi) */
float m3_rng_normal(m3_rng *r);                      /* Box-Muller, mean 0 sd 1 */
void m3_fill_uniform(m3_rng *r, float *x, int64_t n, float lo, float hi);
void m3_fill_normal(m3_rng *r, float *x, int64_t n, float sd);
/* integer-valued in [-2^scale_bits, 2^scale_bits] (exact sums: CUTLASS int_scale) */
void m3_fill_int(m3_rng *r, float *x, int64_t n, int scale_bits);

/* Guarded buffer: canary words before and after; m3_guard_check() fails the test if
 * either was overwritten. Poisoned (0xFF bytes: NaN for floats) on allocation. */
void *m3_guard_alloc(size_t bytes);
void m3_guard_check(const void *p);
void m3_guard_free(void *p);

/* Root of the shared material (spec, oracle fixture): M3_SHARED or ../shared. */
const char *m3_shared_dir(void);
/* Path of the built m3 binary: M3 env or build/m3. */
const char *m3_bin(void);

/* cmocka runner honouring M3_TEST_FILTER. */
#define M3_RUN_TESTS(tests)                                                                       \
    (cmocka_set_test_filter(getenv("M3_TEST_FILTER")),                                            \
     cmocka_run_group_tests(tests, NULL, NULL))

/* Fail the current test with a formatted message that includes the seed. */
void m3_test_failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Run a shell command, capture stdout+stderr (caller frees *out, may be NULL), return the
 * exit status (or -1). */
int m3_run_cmd(const char *cmd, char **out);
/* Run "<m3 binary> <printf-formatted args>" through m3_run_cmd. */
int m3_run_m3(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- scratch directory (one per test binary) ------------------------------------------ */

/* cmocka group setup / teardown: create /tmp/m3_<binary>_XXXXXX, and remove it with all it
 * holds. m3_tmp_path("x") is "<dir>/x" in one of 8 rotating static buffers (so a call may
 * use up to 8 paths at once). */
int m3_tmpdir_setup(void **state);
int m3_tmpdir_teardown(void **state);
const char *m3_tmpdir(void);
const char *m3_tmp_path(const char *name);

/* M3_RUN_TESTS with the scratch directory made before the first test, removed after the last */
#define M3_RUN_TESTS_IN_TMPDIR(tests)                                                             \
    (cmocka_set_test_filter(getenv("M3_TEST_FILTER")),                                            \
     cmocka_run_group_tests(tests, m3_tmpdir_setup, m3_tmpdir_teardown))

/* ---- running the reference model over a fixture --------------------------------------- */

struct m3_model;
struct m3_variant;

/* <dir>/tokens.txt: whitespace-separated token ids (at most 4096). Fails the test when the
 * file is missing or holds none; *n gets the count; the caller frees. */
int32_t *m3_read_tokens(const char *dir, int *n);

/* <dir>/model under profile `prof`, with an inference override (JSON text, may be NULL) and,
 * when v is not NULL, that numerics variant. Fails the test on any error. */
struct m3_model *m3_test_open_model(const char *dir, const char *prof, const char *override,
                                    const struct m3_variant *v);

/* In-memory stage capture: m3_capture_tap is an m3_tap_fn (ref/tap.h) that copies every
 * tapped stage (4-byte elements: float32 or int32) under its key, in tap order;
 * m3_capture_fetch is an m3_fetch_fn over the copies, for teacher forcing from a capture. */
typedef struct {
    int n, cap;
    char (*key)[128]; /* M3_KEY_MAX of ref/tap.h */
    m3_tensor *t;
} m3_capture;

m3_capture *m3_capture_create(void);
void m3_capture_clear(m3_capture *c); /* drop every stage, keep the capture */
void m3_capture_free(m3_capture *c);
m3_status m3_capture_tap(void *ctx, const char *key, const m3_tensor *t, const char *dt);
m3_status m3_capture_fetch(void *ctx, const char *key, m3_tensor *out);
const m3_tensor *m3_capture_get(const m3_capture *c, const char *key); /* NULL: absent */

#endif
