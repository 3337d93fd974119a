/* compare/cmd.h: the m3 subcommands. Each returns the process exit code (0 ok, 1 difference
 * beyond tolerance, 2 could not run) and prints its own single error line via m3_cli_fail().
 * argv[0] is the subcommand name. */
#ifndef M3_CMD_H
#define M3_CMD_H

#include "ref/base.h"

int m3_cmd_info(int argc, char **argv);
int m3_cmd_run(int argc, char **argv);
int m3_cmd_replay(int argc, char **argv);
int m3_cmd_compare(int argc, char **argv);
int m3_cmd_attribute(int argc, char **argv);
int m3_cmd_eval(int argc, char **argv);
int m3_cmd_bench(int argc, char **argv);
int m3_cmd_ls(int argc, char **argv);
int m3_cmd_quantize(int argc, char **argv);

/* Strict integer option value: the whole string is a base-10 integer in [lo, hi]. */
bool m3_cli_int(const char *s, long lo, long hi, long *out);

/* Print "m3: <msg>" (msg from m3_last_error() when fmt is NULL) as one line on stderr,
 * return 2. */
int m3_cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
