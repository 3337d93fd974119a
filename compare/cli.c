/* compare/cli.c: option-value parsing shared by the m3 subcommands. */
#include <errno.h>
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
