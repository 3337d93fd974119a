/* compare/cmd_run.c: `m3 run` (placeholder until its issue lands). */
#include "compare/cmd.h"

int m3_cmd_run(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return m3_cli_fail("run: not implemented in this build yet");
}
