/* tests/ref_base.c: base services: errors, dtypes, shape overflow, parallel_for
 * determinism, and the CLI skeleton (--help, --version, unknown command -> exit 2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/util.h"

static void errors_are_one_line(void **state) {
    (void)state;
    m3_status s = m3_errorf(M3_ERR_FORMAT, "a.json: bad\nthing %d", 3);
    assert_int_equal(s, M3_ERR_FORMAT);
    assert_null(strchr(m3_last_error(), '\n'));
    m3_error_context(s, "ctx");
    assert_string_equal(m3_last_error(), "ctx: a.json: bad thing 3");
    m3_clear_error();
    assert_string_equal(m3_last_error(), "");
}

static void dtype_names_round_trip(void **state) {
    (void)state;
    for (int t = 1; t < M3_DT_COUNT; t++) {
        const char *n = m3_dtype_name((m3_dtype)t);
        assert_int_equal(m3_dtype_from_name(n), t);
        assert_true(m3_dtype_bits((m3_dtype)t) > 0);
    }
    assert_int_equal(m3_dtype_from_name("F33"), M3_DT_INVALID);
}

static void shape_numel_overflow(void **state) {
    (void)state;
    int64_t ok[2] = {200064, 6144}, neg[2] = {3, -1}, big[3] = {1LL << 40, 1LL << 30, 16};
    assert_true(m3_shape_numel(ok, 2) == 200064LL * 6144);
    assert_true(m3_shape_numel(neg, 2) == -1);
    assert_true(m3_shape_numel(big, 3) == -1);
    assert_true(m3_shape_numel(NULL, 0) == 1);
}

typedef struct { double *out; } pf_ctx;
static void pf_row(void *vctx, int64_t i) {
    pf_ctx *c = vctx;
    double s = 0;
    for (int k = 0; k < 1000; k++) s += 1.0 / (double)(i * 1000 + k + 1);
    c->out[i] = s;
}

static void parallel_for_same_for_any_thread_count(void **state) {
    (void)state;
    enum { N = 257 };
    double a[N], b[N];
    m3_set_threads(1);
    m3_parallel_for(N, pf_row, &(pf_ctx){a});
    m3_set_threads(7);
    m3_parallel_for(N, pf_row, &(pf_ctx){b});
    m3_set_threads(0);
    assert_memory_equal(a, b, sizeof a);
}

static void cli_skeleton(void **state) {
    (void)state;
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s --version", m3_bin());
    assert_int_equal(m3_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "m3 " M3_VERSION " (git "));
    free(out);
    snprintf(cmd, sizeof cmd, "%s --help", m3_bin());
    assert_int_equal(m3_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "compare"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s frobnicate", m3_bin());
    assert_int_equal(m3_run_cmd(cmd, &out), 2);
    assert_non_null(strstr(out, "m3: unknown command 'frobnicate'"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(errors_are_one_line),
        cmocka_unit_test(dtype_names_round_trip),
        cmocka_unit_test(shape_numel_overflow),
        cmocka_unit_test(parallel_for_same_for_any_thread_count),
        cmocka_unit_test(cli_skeleton),
    };
    return M3_RUN_TESTS(tests);
}
