/*
 * cmd_launch.c — `dtrain launch`: start a job of N local ranks (torchrun-like).
 *
 * Only argument handling lives here; the launcher is src/launch/launch.c.
 * Options end at the first positional argument (or "--"), so the program's
 * own flags are never taken for ours.
 */
#include "cli.h"
#include "dtrain/launch.h"

#include <stdio.h>

static const cli_opt launch_opts[] = {
    {"nproc", 'n', CLI_INT, "N", "1", "DT_NPROC", "ranks to start on this node", NULL, 1,
     DT_LAUNCH_MAX_NPROC},
    {"nnodes", 0, CLI_INT, "M", "1", "DT_NNODES", "nodes in the job", NULL, 1,
     DT_LAUNCH_MAX_NNODES},
    {"node-rank", 0, CLI_INT, "R", "0", "DT_NODE_RANK", "this node's rank, in [0, M)", NULL, 0,
     DT_LAUNCH_MAX_NNODES - 1},
    {"master", 0, CLI_STRING, "ADDR:PORT", NULL, "DT_MASTER",
     "node 0's address and port (default 127.0.0.1 and a free port; required with --nnodes > 1)",
     NULL, 0, 0},
    {"tag-output", 0, CLI_FLAG, NULL, NULL, "DT_TAG_OUTPUT", "prefix output lines with [rank]",
     NULL, 0, 0},
    {"max-restarts", 0, CLI_INT, "K", "0", "DT_MAX_RESTARTS",
     "restart the whole job after a failure, up to K times", NULL, 0, 1000000},
    {"grace", 0, CLI_DOUBLE, "SECONDS", "5", "DT_GRACE",
     "after a failure, wait this long between SIGTERM and SIGKILL", NULL, 0, 3600},
    {"elastic", 0, CLI_STRING, "MIN:MAX", NULL, "DT_ELASTIC",
     "elastic job: a rank that fails does not stop the others (they go on at MIN..MAX ranks); "
     "the ranks get DT_ELASTIC",
     NULL, 0, 0},
    {"join", 0, CLI_STRING, "ADDR:PORT", NULL, "DT_JOIN",
     "start newcomers for the running elastic job whose master address is ADDR:PORT "
     "(DT_JOB_TOKEN: the job's)",
     NULL, 0, 0},
    {0},
};

static const char launch_description[] =
    "Starts N processes of PROGRAM on this node with DT_RANK, DT_WORLD_SIZE, DT_LOCAL_RANK,\n"
    "DT_LOCAL_WORLD_SIZE, DT_NODE_RANK, DT_NNODES, DT_MASTER_ADDR, DT_MASTER_PORT, DT_JOB_ID,\n"
    "DT_JOB_TOKEN and DT_RESTART_COUNT set. The first rank that fails stops the others and\n"
    "the launcher exits with its code and a summary of its last stderr lines.\n"
    "Several machines: run the same command on each with --nnodes M --node-rank R\n"
    "--master ADDR:PORT (node 0's address); global rank = R * N + local rank.\n"
    "See docs/launch.md.";

static int run_launch(cli_args *a) {
    if (a->argc < 1)
        cli_usage_error(a->cmd, "which program? (dtrain launch -n N PROGRAM [ARGS...])");
    static const char *const unset[] = {"DT_NPROC", "DT_MASTER", NULL};
    dt_launch_options o;
    dt_launch_options_init(&o);
    o.nproc = (int)cli_int(a, "nproc");
    o.nnodes = (int)cli_int(a, "nnodes");
    o.node_rank = (int)cli_int(a, "node-rank");
    o.master = cli_str(a, "master");
    o.tag_output = cli_bool(a, "tag-output");
    o.max_restarts = (int)cli_int(a, "max-restarts");
    o.grace = cli_double(a, "grace");
    const char *elastic = cli_str(a, "elastic");
    if (elastic && *elastic) {
        char tail;
        if (sscanf(elastic, "%d:%d%c", &o.elastic_min, &o.elastic_max, &tail) != 2 ||
            o.elastic_min < 1 || o.elastic_max < o.elastic_min || o.elastic_max > 65536)
            cli_usage_error(a->cmd, "--elastic %s: expected MIN:MAX with 1 <= MIN <= MAX <= 65536",
                            elastic);
    }
    o.join = cli_str(a, "join");
    o.argv = a->argv;
    o.env_unset = unset;
    if (o.node_rank >= o.nnodes)
        cli_usage_error(a->cmd, "--node-rank %d is not below --nnodes %d", o.node_rank, o.nnodes);
    int code = 1;
    dt_status st = dt_launch_run(&o, &code);
    if (st != DT_OK)
        fprintf(stderr, "dtrain launch: error: %s\n", dt_last_error());
    return code;
}

const cli_cmd cli_cmd_launch = {
    .name = "launch",
    .summary = "start N ranks of a program with the DT_* environment",
    .usage = "dtrain launch -n N [--nnodes M --node-rank R --master ADDR:PORT] [--tag-output]\n"
             "                    [--max-restarts K] [--grace SECONDS] [--elastic MIN:MAX [--join "
             "ADDR:PORT]]\n"
             "                    [--] PROGRAM [ARGS...]",
    .description = launch_description,
    .opts = launch_opts,
    .run = run_launch,
    .stop_at_positional = true,
};
