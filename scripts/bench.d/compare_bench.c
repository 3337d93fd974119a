/* scripts/bench.d/compare_bench.c: throughput of the `m3 compare` engine against ceilings
 * measured in the same run on the same bytes: (1) the raw read ceiling, the same datasets
 * read through HDF5 (m3_dump_read_rows, one H5Dread per 8 MiB chunk, as the comparator
 * does) with no arithmetic; (2) memcpy of the same byte count. Built and run by
 * scripts/bench.d/compare.sh. Usage: compare_bench DIR [MiB per file]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compare/compare.h"
#include "compare/dump.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(const char *what) {
    fprintf(stderr, "compare_bench: %s: %s\n", what, m3_last_error());
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: compare_bench DIR [MiB per file]\n"), 2;
    int mib = argc > 2 ? atoi(argv[2]) : 512;
    const int T = 2048, H = 4096; /* 32 MiB per [T,H] stage */
    int n_ds = mib / 32 > 1 ? mib / 32 : 1;
    int n_layers = (n_ds + 3) / 4;
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/bench_a.h5", argv[1]);
    snprintf(pb, sizeof pb, "%s/bench_b.h5", argv[1]);
    float *x = malloc(sizeof(float) * (size_t)T * H);
    if (!x) return 2;
    const char *stages[4] = {"attn_norm", "attn_out", "mlp_out", "output"};
    for (int side = 0; side < 2; side++) {
        m3_dump *d;
        if (m3_dump_open(&d, side ? pb : pa, M3_DUMP_CREATE | M3_DUMP_FORCE)) return die("create");
        m3_dump_set_attr_str(d, "profile", side ? "hf" : "fp32");
        uint32_t s = 12345;
        for (int k = 0; k < n_ds; k++) {
            for (size_t i = 0; i < (size_t)T * H; i++) {
                s = s * 1664525u + 1013904223u;
                float v = (float)(s >> 8) * (1.0f / 8388608.0f) - 1.0f;
                x[i] = side ? v * (1.0f + 1e-3f * (float)((s >> 4) & 7)) : v;
            }
            char key[64];
            m3_dump_key(key, sizeof key, -1, k / 4, n_layers, stages[k % 4]);
            m3_tensor t = {.dtype = M3_DT_F32, .rank = 2, .shape = {T, H}, .data = x};
            if (m3_dump_write(d, key, &t, side ? "bfloat16" : "float32")) return die("write");
        }
        if (m3_dump_commit(d)) return die("commit");
        m3_dump_close(d);
    }
    free(x);
    m3_tol tol;
    m3_tol_builtin(&tol);
    m3_cmp_opts o = {.pass = -1};
    m3_cmp_report *r;
    /* warm-up: page cache, allocator */
    if (m3_compare_dumps(&r, pa, pb, &tol, &o)) return die("compare");
    m3_cmp_report_free(r);
    double best_cmp = 1e30, best_read = 1e30, best_copy = 1e30;
    int64_t bytes = 0;
    size_t chunk = (size_t)8 << 20;
    float *buf = malloc(chunk), *buf2 = malloc(chunk);
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        if (m3_compare_dumps(&r, pa, pb, &tol, &o)) return die("compare");
        double t1 = now();
        bytes = r->bytes;
        m3_cmp_report_free(r);
        if (t1 - t0 < best_cmp) best_cmp = t1 - t0;
        /* raw read ceiling: open, list, read every dataset of both files in 8 MiB chunks */
        t0 = now();
        int64_t rb = 0;
        for (int side = 0; side < 2; side++) {
            m3_dump *d;
            char **keys;
            int nk;
            if (m3_dump_open(&d, side ? pb : pa, M3_DUMP_READ) || m3_dump_list(d, &keys, &nk)) return die("read");
            for (int k = 0; k < nk; k++) {
                m3_tensor m;
                if (m3_dump_info(d, keys[k], &m)) return die("info");
                int64_t rows = m.shape[0], re = m3_tensor_numel(&m) / rows;
                int64_t cr = (int64_t)chunk / (re * 4);
                for (int64_t r0 = 0; r0 < rows; r0 += cr) {
                    int64_t nr = rows - r0 < cr ? rows - r0 : cr;
                    if (m3_dump_read_rows(d, keys[k], r0, nr, buf)) return die("read_rows");
                    rb += nr * re * 4;
                }
            }
            m3_dump_list_free(keys, nk);
            m3_dump_close(d);
        }
        t1 = now();
        if (t1 - t0 < best_read) best_read = t1 - t0;
        /* memcpy of the same byte count through the same chunk size */
        memset(buf, 1, chunk);
        t0 = now();
        for (int64_t done = 0; done < rb; done += (int64_t)chunk) memcpy(buf2, buf, chunk);
        t1 = now();
        if (t1 - t0 < best_copy) best_copy = t1 - t0;
        if (buf2[7] == 12345.0f) puts(""); /* keep the copies */
    }
    printf("dump data: 2 files x %d datasets [%d,%d] f32 = %.2f GB, threads %d\n", n_ds, T, H,
           (double)bytes / 1e9, m3_threads());
    printf("m3 compare engine      %6.2f GB/s  (%.3f s, best of 3)\n", (double)bytes / best_cmp / 1e9, best_cmp);
    printf("raw HDF5 read ceiling  %6.2f GB/s  (%.3f s)\n", (double)bytes / best_read / 1e9, best_read);
    printf("memcpy ceiling         %6.2f GB/s  (%.3f s)\n", (double)bytes / best_copy / 1e9, best_copy);
    printf("compare / read ceiling %6.1f %%\n", 100.0 * best_read / best_cmp);
    free(buf);
    free(buf2);
    remove(pa);
    remove(pb);
    return 0;
}
