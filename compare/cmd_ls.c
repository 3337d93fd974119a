/* compare/cmd_ls.c: `m3 ls` (placeholder until its issue lands). */
#include "compare/cmd.h"

int m3_cmd_ls(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return m3_cli_fail("ls: not implemented in this build yet");
}
