/* compare/cmd_info.c: `m3 info` (placeholder until its issue lands). */
#include "compare/cmd.h"

int m3_cmd_info(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return m3_cli_fail("info: not implemented in this build yet");
}
