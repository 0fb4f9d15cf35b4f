/*
 * main.c — `dtrain`: dispatch to a subcommand.
 *
 * The table below is the whole list of subcommands; `dtrain --help` prints
 * it. Each subcommand parses its own flags with cli_parse() and calls into
 * the library; nothing here knows what a subcommand does.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

/* clang-format off */
static const cli_cmd *const commands[] = {
    &cli_cmd_train,
    &cli_cmd_launch,
    &cli_cmd_sample,
    &cli_cmd_data,
    &cli_cmd_ckpt,
    &cli_cmd_export,
    &cli_cmd_plan,
    &cli_cmd_report,
    &cli_cmd_bench,
    &cli_cmd_version,
};
/* clang-format on */

#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void print_main_help(FILE *out) {
    fprintf(out,
            "dtrain %s — distributed neural-network training\n\n"
            "usage: dtrain [--help | --version] COMMAND [OPTIONS]\n\n"
            "commands:\n",
            DT_VERSION_STRING);
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
    fprintf(out, "  %-10s %s\n", "help", "show help for a command: dtrain help COMMAND");
    fprintf(out, "\nEvery option can also be set by the DT_* variable shown in the command's "
                 "help;\nthe flag wins. DT_LOG=error|warn|info|debug|trace sets the log level.\n");
}

static const cli_cmd *find_command(const char *name) {
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(commands[i]->name, name) == 0)
            return commands[i];
    return NULL;
}

int main(int argc, char **argv) {
    if (dt_log_init() != DT_OK) {
        fprintf(stderr, "dtrain: error: %s\n", dt_last_error());
        return 2;
    }
    if (argc < 2) {
        print_main_help(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        print_main_help(stdout);
        return 0;
    }
    if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0)
        name = "version";
    if (strcmp(name, "help") == 0) {
        if (argc < 3) {
            print_main_help(stdout);
            return 0;
        }
        const cli_cmd *cmd = find_command(argv[2]);
        if (!cmd) {
            fprintf(stderr, "dtrain: error: unknown command '%s'\n\n", argv[2]);
            print_main_help(stderr);
            return 2;
        }
        /* `dtrain help bench comm`: the action's own help. */
        for (int i = 3; i < argc && cmd->nsubs; i++) {
            const cli_cmd *sub = cli_find_sub(cmd, argv[i]);
            if (!sub) {
                fprintf(stderr, "dtrain: error: 'dtrain %s' has no action '%s'\n\n", cmd->name,
                        argv[i]);
                cli_print_help(cmd, stderr);
                return 2;
            }
            cmd = sub;
        }
        cli_print_help(cmd, stdout);
        return 0;
    }
    const cli_cmd *cmd = find_command(name);
    if (!cmd) {
        fprintf(stderr, "dtrain: error: unknown command '%s'\n\n", name);
        print_main_help(stderr);
        return 2;
    }
    cli_args args;
    cli_parse(cmd, argc - 1, argv + 1, &args);
    return cmd->run(&args);
}
