/* compare/main.c: the `m3` command (contract: shared spec/cli.md). Dispatches to
 * compare/cmd_<name>.c. Exit codes: 0 ok, 1 difference beyond tolerance, 2 could not run. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "compare/cmd.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} cmds[] = {
    {"info", m3_cmd_info, "parameter, checkpoint and KV-cache accounting of a model dir"},
    {"run", m3_cmd_run, "forward pass (prefill, optional greedy decode), dump activations"},
    {"replay", m3_cmd_replay, "teacher-forced per-layer forward from a reference dump"},
    {"compare", m3_cmd_compare, "per-layer divergence report between two dumps"},
    {"attribute", m3_cmd_attribute, "per-layer error contribution of each numerics factor"},
    {"eval", m3_cmd_eval, "accuracy evaluation (gsm8k)"},
    {"bench", m3_cmd_bench, "benchmarks against ceilings measured in the same run"},
    {"ls", m3_cmd_ls, "list the stages of a dump file"},
    {"quantize", m3_cmd_quantize, "write a Quark MXFP4/MXFP8-expert copy of a bf16 checkpoint"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: m3 <command> [options]\n\n"
               "MiniMax-M3 numerics verification toolkit, version %s\n\ncommands:\n",
            m3_version_string());
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "\n`m3 <command> --help` describes each. Exit codes: 0 ok, 1 difference beyond "
               "tolerance, 2 could not run.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("m3 %s\n", m3_version_string());
        return 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        if (strcmp(argv[1], cmds[i].name)) continue;
        /* `m3 X --version` is the binary's version, whatever X parses */
        if (argc == 3 && !strcmp(argv[2], "--version")) {
            printf("m3 %s\n", m3_version_string());
            return 0;
        }
        return cmds[i].fn(argc - 1, argv + 1);
    }
    return m3_cli_fail("unknown command '%s' (see m3 --help)", argv[1]);
}
