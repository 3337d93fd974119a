/* compare/cmd_ls.c: `m3 ls F.h5 [--attrs]`: the file attributes (long values cut to one
 * line), then every dataset (sorted by key) with shape, type and produced_dtype. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmd.h"
#include "compare/dump.h"

static void print_attr(m3_dump *d, const char *key, const char *name, int width, bool full) {
    char *v = NULL;
    if (m3_dump_attr_text(d, key, name, &v) != M3_OK) {
        printf("  %-*s <unreadable>\n", width, name);
        return;
    }
    size_t n = strlen(v);
    for (char *p = v; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    if (!full && n > 100) printf("  %-*s %.97s... (%zu chars)\n", width, name, v, n);
    else printf("  %-*s %s\n", width, name, v);
    free(v);
}

int m3_cmd_ls(int argc, char **argv) {
    const char *path = NULL;
    bool full = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: m3 ls F.h5 [--full]\nLists the file attributes and every dataset "
                   "(shape, type, produced_dtype). --full prints long attributes whole.\n");
            return 0;
        } else if (!strcmp(argv[i], "--full")) full = true;
        else if (argv[i][0] == '-') return m3_cli_fail("ls: unknown option %s", argv[i]);
        else if (!path) path = argv[i];
        else return m3_cli_fail("ls: one file at a time");
    }
    if (!path) return m3_cli_fail("ls: need a dump: m3 ls F.h5");
    m3_dump *d = NULL;
    if (m3_dump_open(&d, path, M3_DUMP_READ) != M3_OK) return m3_cli_fail(NULL);
    char **names = NULL, **keys = NULL;
    int nn = 0, nk = 0, rc = 0;
    if (m3_dump_attr_names(d, "/", &names, &nn) != M3_OK || m3_dump_list(d, &keys, &nk) != M3_OK) {
        rc = m3_cli_fail(NULL);
        goto done;
    }
    printf("%s\nattributes:\n", path);
    for (int i = 0; i < nn; i++) print_attr(d, "/", names[i], 20, full);
    printf("datasets (%d):\n", nk);
    for (int i = 0; i < nk; i++) {
        m3_tensor m;
        if (m3_dump_info(d, keys[i], &m) != M3_OK) {
            rc = m3_cli_fail(NULL);
            goto done;
        }
        char shape[128];
        size_t k = (size_t)snprintf(shape, sizeof shape, "[");
        for (int j = 0; j < m.rank && k < sizeof shape; j++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", j ? "," : "", (long long)m.shape[j]);
        if (k < sizeof shape) snprintf(shape + k, sizeof shape - k, "]");
        char *pd = NULL;
        if (m3_dump_attr_text(d, keys[i], "produced_dtype", &pd) != M3_OK) m3_clear_error();
        printf("  %-34s %-16s %-4s %s\n", keys[i], shape, m.dtype == M3_DT_F32 ? "f32" : "i32",
               pd ? pd : "");
        free(pd);
    }
done:
    m3_dump_list_free(names, nn);
    m3_dump_list_free(keys, nk);
    m3_dump_close(d);
    return rc;
}
