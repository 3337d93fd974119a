/* compare/cmd_eval.c: `m3 eval` (placeholder until its issue lands). */
#include "compare/cmd.h"

int m3_cmd_eval(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return m3_cli_fail("eval: not implemented in this build yet");
}
