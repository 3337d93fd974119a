/* compare/cmd_attribute.c: `m3 attribute` (placeholder until its issue lands). */
#include "compare/cmd.h"

int m3_cmd_attribute(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return m3_cli_fail("attribute: not implemented in this build yet");
}
