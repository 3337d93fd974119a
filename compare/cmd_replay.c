/* compare/cmd_replay.c: `m3 replay` (placeholder until its issue lands). */
#include "compare/cmd.h"

int m3_cmd_replay(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return m3_cli_fail("replay: not implemented in this build yet");
}
