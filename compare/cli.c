/* compare/cli.c: option-value parsing shared by the m3 subcommands. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "compare/cmd.h"

bool m3_cli_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi) return false;
    *out = x;
    return true;
}

/* Lives here (in libm3.a, not in main.c) so that the tests linking the library get the
 * same one-line error behaviour. */
int m3_cli_fail(const char *fmt, ...) {
    fputs("m3: ", stderr);
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    } else {
        const char *e = m3_last_error();
        fputs(e[0] ? e : "unknown error", stderr);
    }
    fputc('\n', stderr);
    return 2;
}
