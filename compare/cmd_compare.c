/* compare/cmd_compare.c: `m3 compare` (placeholder until its issue lands). */
#include "compare/cmd.h"

int m3_cmd_compare(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return m3_cli_fail("compare: not implemented in this build yet");
}
