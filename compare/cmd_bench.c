/* compare/cmd_bench.c: `m3 bench` (placeholder until its issue lands). */
#include "compare/cmd.h"

int m3_cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return m3_cli_fail("bench: not implemented in this build yet");
}
