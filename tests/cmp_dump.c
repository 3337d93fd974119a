/* tests/cmp_dump.c: compare/dump: write/read round trips (F32, I32, attributes,
 * produced_dtype), row-range streaming across chunk boundaries, key names (2/3 digits,
 * passes), crash-safe creation (tmp + rename, no overwrite without FORCE, uncommitted
 * dumps leave nothing), and bad files (non-HDF5, truncated, wrong format, missing key). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compare/dump.h"
#include "tests/util.h"

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void round_trip(void **state) {
    (void)state;
    const char *p = m3_tmp_path("rt.h5");
    m3_dump *d;
    assert_int_equal(m3_dump_open(&d, p, M3_DUMP_CREATE), M3_OK);
    assert_int_equal(m3_dump_set_attr_str(d, "producer", "m3 test"), M3_OK);
    assert_int_equal(m3_dump_set_attr_str(d, "profile", "fp32"), M3_OK);
    assert_int_equal(m3_dump_set_attr_int(d, "seed", 42), M3_OK);
    float x[3 * 5];
    for (int i = 0; i < 15; i++) x[i] = (float)i * 0.25f - 1.0f;
    int32_t ids[4] = {3, -1, 7, 0};
    m3_tensor tf = {.dtype = M3_DT_F32, .rank = 2, .shape = {3, 5}, .data = x};
    m3_tensor ti = {.dtype = M3_DT_I32, .rank = 1, .shape = {4}, .data = ids};
    assert_int_equal(m3_dump_write(d, "layers/07/attn_out", &tf, "bfloat16"), M3_OK);
    assert_int_equal(m3_dump_write(d, "tokens", &ti, NULL), M3_OK);
    /* writing a key twice is refused */
    assert_int_equal(m3_dump_write(d, "tokens", &ti, NULL), M3_ERR_ARG);
    assert_false(exists(p)); /* not visible before commit */
    assert_int_equal(m3_dump_commit(d), M3_OK);
    m3_dump_close(d);
    assert_true(exists(p));

    assert_int_equal(m3_dump_open(&d, p, M3_DUMP_READ), M3_OK);
    char *s = NULL;
    assert_int_equal(m3_dump_get_attr_str(d, "format", &s), M3_OK);
    assert_string_equal(s, "m3-dump");
    free(s);
    assert_int_equal(m3_dump_get_attr_str(d, "producer", &s), M3_OK);
    assert_string_equal(s, "m3 test");
    free(s);
    int64_t v = 0;
    assert_int_equal(m3_dump_get_attr_int(d, "format_version", &v), M3_OK);
    assert_int_equal(v, 1);
    assert_int_equal(m3_dump_get_attr_int(d, "seed", &v), M3_OK);
    assert_int_equal(v, 42);
    assert_int_equal(m3_dump_get_attr_str(d, "nope", &s), M3_ERR_MISSING);
    assert_true(m3_dump_has(d, "layers/07/attn_out"));
    assert_false(m3_dump_has(d, "layers/07"));         /* a group is not a dataset */
    assert_false(m3_dump_has(d, "layers/08/attn_out")); /* missing group */
    m3_tensor r;
    assert_int_equal(m3_dump_read(d, "layers/07/attn_out", &r), M3_OK);
    assert_int_equal(r.dtype, M3_DT_F32);
    assert_int_equal(r.rank, 2);
    assert_int_equal(r.shape[0], 3);
    assert_int_equal(r.shape[1], 5);
    assert_memory_equal(r.data, x, sizeof x);
    m3_tensor_free(&r);
    assert_null(r.data);
    assert_int_equal(m3_dump_read(d, "tokens", &r), M3_OK);
    assert_int_equal(r.dtype, M3_DT_I32);
    assert_memory_equal(r.data, ids, sizeof ids);
    m3_tensor_free(&r);
    assert_int_equal(m3_dump_attr_text(d, "layers/07/attn_out", "produced_dtype", &s), M3_OK);
    assert_string_equal(s, "bfloat16");
    free(s);
    assert_int_equal(m3_dump_read(d, "layers/07/q", &r), M3_ERR_MISSING);
    char **keys;
    int n;
    assert_int_equal(m3_dump_list(d, &keys, &n), M3_OK);
    assert_int_equal(n, 2);
    assert_string_equal(keys[0], "layers/07/attn_out");
    assert_string_equal(keys[1], "tokens");
    m3_dump_list_free(keys, n);
    /* writes on a read dump are refused */
    assert_int_equal(m3_dump_set_attr_str(d, "x", "y"), M3_ERR_ARG);
    m3_dump_close(d);
}

static void rows_stream_across_chunks(void **state) {
    (void)state;
    /* 3000 x 130 floats = 1.56 MB: two ~1 MiB chunks along the rows */
    const int R = 3000, C = 130;
    const char *p = m3_tmp_path("rows.h5");
    float *x = malloc(sizeof(float) * (size_t)R * C), *y = malloc(sizeof(float) * (size_t)R * C);
    for (int i = 0; i < R * C; i++) x[i] = (float)(i % 9973) - 17.5f;
    for (int gz = 0; gz < 2; gz++) {
        m3_dump *d;
        assert_int_equal(m3_dump_open(&d, p, M3_DUMP_CREATE | M3_DUMP_FORCE | (gz ? M3_DUMP_GZIP : 0)), M3_OK);
        m3_tensor t = {.dtype = M3_DT_F32, .rank = 2, .shape = {R, C}, .data = x};
        assert_int_equal(m3_dump_write(d, "passes/0001/layers/100/output", &t, NULL), M3_OK);
        assert_int_equal(m3_dump_commit(d), M3_OK);
        m3_dump_close(d);
        assert_int_equal(m3_dump_open(&d, p, M3_DUMP_READ), M3_OK);
        int starts[] = {0, 1, 2047, 2999};
        int counts[] = {3000, 2500, 900, 1};
        for (int k = 0; k < 4; k++) {
            memset(y, 0, sizeof(float) * (size_t)R * C);
            assert_int_equal(m3_dump_read_rows(d, "passes/0001/layers/100/output", starts[k], counts[k], y), M3_OK);
            assert_memory_equal(y, x + (size_t)starts[k] * C, sizeof(float) * (size_t)counts[k] * C);
        }
        assert_int_equal(m3_dump_read_rows(d, "passes/0001/layers/100/output", 2990, 11, y), M3_ERR_ARG);
        m3_dump_close(d);
    }
    free(x);
    free(y);
}

static void key_names(void **state) {
    (void)state;
    char k[128];
    m3_dump_key(k, sizeof k, -1, 7, 60, "attn_out");
    assert_string_equal(k, "layers/07/attn_out");
    m3_dump_key(k, sizeof k, -1, 7, 100, "attn_out");
    assert_string_equal(k, "layers/007/attn_out");
    m3_dump_key(k, sizeof k, 3, 42, 60, "q");
    assert_string_equal(k, "passes/0003/layers/42/q");
    m3_dump_key(k, sizeof k, 0, -1, 60, "logits");
    assert_string_equal(k, "passes/0000/logits");
    m3_dump_key(k, sizeof k, -1, -1, 60, "embed");
    assert_string_equal(k, "embed");
    assert_int_equal(m3_dump_layer_digits(99), 2);
    assert_int_equal(m3_dump_layer_digits(100), 3);
}

static void create_is_crash_safe(void **state) {
    (void)state;
    const char *p = m3_tmp_path("safe.h5");
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    float x[2] = {1, 2};
    m3_tensor t = {.dtype = M3_DT_F32, .rank = 1, .shape = {2}, .data = x};
    m3_dump *d;
    /* closed without commit: nothing is left behind */
    assert_int_equal(m3_dump_open(&d, p, M3_DUMP_CREATE), M3_OK);
    assert_int_equal(m3_dump_write(d, "embed", &t, NULL), M3_OK);
    assert_true(exists(tmp));
    m3_dump_close(d);
    assert_false(exists(tmp));
    assert_false(exists(p));
    /* committed, then creating again without FORCE fails with one line naming the file */
    assert_int_equal(m3_dump_open(&d, p, M3_DUMP_CREATE), M3_OK);
    assert_int_equal(m3_dump_commit(d), M3_OK);
    m3_dump_close(d);
    assert_int_equal(m3_dump_open(&d, p, M3_DUMP_CREATE), M3_ERR_IO);
    assert_null(d);
    assert_non_null(strstr(m3_last_error(), "safe.h5"));
    assert_non_null(strstr(m3_last_error(), "--force"));
    assert_int_equal(m3_dump_open(&d, p, M3_DUMP_CREATE | M3_DUMP_FORCE), M3_OK);
    m3_dump_close(d);
    assert_true(exists(p)); /* the old file survives an uncommitted overwrite */
    m3_dump_close(NULL);
}

static void bad_files(void **state) {
    (void)state;
    m3_dump *d;
    const char *p = m3_tmp_path("text.h5");
    FILE *f = fopen(p, "w");
    fputs("this is not HDF5\n", f);
    fclose(f);
    assert_int_equal(m3_dump_open(&d, p, M3_DUMP_READ), M3_ERR_FORMAT);
    assert_non_null(strstr(m3_last_error(), "not an HDF5 file"));
    p = m3_tmp_path("absent.h5");
    assert_int_equal(m3_dump_open(&d, p, M3_DUMP_READ), M3_ERR_IO);
    /* truncated: the first half of a valid dump */
    const char *full = m3_tmp_path("full.h5");
    float *x = calloc(20000, sizeof(float));
    m3_tensor t = {.dtype = M3_DT_F32, .rank = 2, .shape = {100, 200}, .data = x};
    assert_int_equal(m3_dump_open(&d, full, M3_DUMP_CREATE), M3_OK);
    assert_int_equal(m3_dump_write(d, "embed", &t, NULL), M3_OK);
    assert_int_equal(m3_dump_write(d, "final_norm", &t, NULL), M3_OK);
    assert_int_equal(m3_dump_commit(d), M3_OK);
    m3_dump_close(d);
    free(x);
    f = fopen(full, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    for (int cut = 0; cut < 3; cut++) {
        long keep = cut == 0 ? 1000 : cut == 1 ? n / 2 : n - 100;
        p = m3_tmp_path("trunc.h5");
        f = fopen(p, "wb");
        fwrite(buf, 1, (size_t)keep, f);
        fclose(f);
        m3_status s = m3_dump_open(&d, p, M3_DUMP_READ);
        if (s == M3_OK) { /* the superblock survived: reading must still fail cleanly */
            m3_tensor r;
            m3_status s1 = m3_dump_read(d, "embed", &r), s2 = m3_dump_read(d, "final_norm", &r);
            assert_true(s1 != M3_OK || s2 != M3_OK);
            m3_dump_close(d);
        } else {
            assert_true(s == M3_ERR_FORMAT);
        }
    }
    free(buf);
}

static void reads_the_transformers_fixture(void **state) {
    (void)state;
    char p[512];
    snprintf(p, sizeof p, "%s/fixtures/hf-tiny/hf_bf16.h5", m3_shared_dir());
    if (access(p, R_OK) != 0) skip();
    m3_dump *d;
    assert_int_equal(m3_dump_open(&d, p, M3_DUMP_READ), M3_OK);
    int64_t v;
    assert_int_equal(m3_dump_get_attr_int(d, "format_version", &v), M3_OK); /* int64 there */
    assert_int_equal(v, 1);
    m3_tensor m;
    assert_int_equal(m3_dump_info(d, "layers/01/index_topk", &m), M3_OK);
    assert_int_equal(m.dtype, M3_DT_I32);
    assert_int_equal(m.rank, 3);
    m3_tensor r;
    assert_int_equal(m3_dump_read(d, "logits", &r), M3_OK); /* gzip + shuffle chunks */
    assert_int_equal(r.shape[1], 512);
    m3_tensor_free(&r);
    m3_dump_close(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip),
        cmocka_unit_test(rows_stream_across_chunks),
        cmocka_unit_test(key_names),
        cmocka_unit_test(create_is_crash_safe),
        cmocka_unit_test(bad_files),
        cmocka_unit_test(reads_the_transformers_fixture),
    };
    return M3_RUN_TESTS_IN_TMPDIR(tests);
}
