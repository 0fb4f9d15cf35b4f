/*
 * dtrain/launch.h — start a job: N local processes with the DT_* environment.
 *
 * Overview
 * --------
 * A dtrain job is one process per rank. This layer starts those processes on
 * one machine (or on each of a few machines, by hand) the way torchrun does,
 * and is what `dtrain launch` and `dtrain train --nproc N` run:
 *
 *   1. It checks the options, that the program can be executed, and that the
 *      master port is free, before anything is started.
 *   2. With --nnodes M > 1 the launchers of all nodes meet on the master
 *      (ADDR:PORT): node 0 listens, the others connect (retrying until
 *      DT_TIMEOUT). Node 0 checks that every node agrees on the number of
 *      nodes, ranks per node and job token, then hands out the job id, the
 *      token (unless one was given in DT_JOB_TOKEN) and the store port
 *      (PORT + 1). The connection stays open: a failure on any node stops
 *      the job on every node, and restarts happen on all nodes together.
 *   3. It forks the ranks. Each rank gets DT_RANK (node_rank * nproc +
 *      local rank), DT_WORLD_SIZE, DT_LOCAL_RANK, DT_LOCAL_WORLD_SIZE,
 *      DT_NODE_RANK, DT_NNODES, DT_MASTER_ADDR, DT_MASTER_PORT (rank 0 serves
 *      the rendezvous store there), DT_JOB_ID, DT_JOB_TOKEN (32 hex chars
 *      from /dev/urandom) and DT_RESTART_COUNT. Ranks > 0 read stdin from
 *      /dev/null. An exec failure ("no such file") travels back through a
 *      close-on-exec pipe, so it is reported as a launch error, not as a
 *      rank that exited with 127.
 *   4. It relays each rank's stdout and stderr line by line (a line is
 *      written with one write(), so lines of different ranks never mix),
 *      optionally prefixed with "[rank] ", and keeps the last few stderr
 *      lines of every rank for the failure summary.
 *   5. SIGINT/SIGTERM sent to the launcher are forwarded to every rank (a
 *      second one sends SIGKILL). The first rank that fails (non-zero exit
 *      or a signal) stops the others: SIGTERM, then SIGKILL after the grace
 *      period. With max_restarts K the whole job is started again, up to K
 *      times, with DT_RESTART_COUNT = 1, 2, ...
 *   6. No process outlives the launcher: every rank leads its own process
 *      group (signals go to the group, so a rank's own children are reached
 *      too), has PR_SET_PDEATHSIG(SIGKILL) set in case the launcher itself
 *      is killed, and is reaped before dt_launch_run returns.
 *
 * Example: `dtrain launch -n 4 ./prog`
 * ----------------------------------
 *     dt_launch_options o;
 *     dt_launch_options_init(&o);
 *     o.nproc = 4;
 *     o.argv = (char *const[]){"./prog", NULL};
 *     int code;
 *     dt_status st = dt_launch_run(&o, &code);
 *     if (st != DT_OK)
 *         fprintf(stderr, "%s\n", dt_last_error()); // "rank 2 exited with code 3; ..."
 *     return code;
 *
 * Example: a subcommand that launches itself (`dtrain train --nproc 4 ...`)
 * ------------------------------------------------------------------------
 *     // in cmd_train.c, before anything else:
 *     if (nproc > 1 && !dt_launch_in_job()) {
 *         dt_launch_options o;
 *         dt_launch_options_init(&o);
 *         o.nproc = nproc;
 *         int code;
 *         dt_status st = dt_launch_self(&o, argc, argv, "--nproc", &code);
 *         if (st != DT_OK)
 *             fprintf(stderr, "dtrain: error: %s\n", dt_last_error());
 *         return code;
 *     }
 *     // ... we are one rank of the job: dt_group_init_from_env(), train ...
 *
 * dt_launch_self re-executes /proc/self/exe with the same argv minus the
 * flag and its value (both the "--nproc 4" and "--nproc=4" forms; nothing
 * after a "--" is touched), so each rank parses the same command line and
 * finds itself inside a job. The children also have
 * DT_NPROC removed from their environment, so a job started with
 * DT_NPROC=4 does not launch again.
 */
#ifndef DTRAIN_LAUNCH_H
#define DTRAIN_LAUNCH_H

#include "dtrain/core.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DT_LAUNCH_MAX_NPROC  4096 /* ranks per node */
#define DT_LAUNCH_MAX_NNODES 65536
#define DT_LAUNCH_TOKEN_HEX  32 /* DT_JOB_TOKEN: 128 random bits as hex */

typedef struct dt_launch_options {
    int nproc;                    /* ranks on this node, in [1, DT_LAUNCH_MAX_NPROC] */
    int nnodes;                   /* nodes in the job (default 1) */
    int node_rank;                /* this node, in [0, nnodes) (default 0) */
    const char *master;           /* "ADDR:PORT"; NULL: 127.0.0.1 and a free port
                                     (one node only). Multi-node: the launchers meet
                                     on PORT, rank 0's store listens on PORT + 1. */
    bool tag_output;              /* prefix every output line with "[rank] " */
    int max_restarts;             /* restart the whole job up to this many times */
    double grace;                 /* seconds between SIGTERM and SIGKILL (default 5) */
    double timeout;               /* bound on the multi-node meeting; 0: DT_TIMEOUT
                                     or 300 s */
    char *const *argv;            /* PROGRAM ARGS..., NULL-terminated; PROGRAM is
                                     looked up in PATH when it has no '/' */
    const char *const *env_unset; /* NULL-terminated names removed from the
                                     ranks' environment, or NULL */
    /* An elastic job (docs/fault-tolerance.md, "Elastic training"): with
     * elastic_max > 0 a rank that fails does not stop the others (they form
     * a new membership themselves), the job succeeds when a rank finishes
     * successfully, and the ranks get DT_ELASTIC=MIN:MAX. */
    int elastic_min, elastic_max;
    /* "ADDR:PORT": start newcomers for the running elastic job whose store
     * is there (DT_JOIN, DT_MASTER_ADDR/PORT set to it; DT_JOB_TOKEN must
     * be given, the job's). NULL: a job of its own. */
    const char *join;
} dt_launch_options;

/* Defaults: nproc 1, nnodes 1, node_rank 0, master NULL, no tagging, no
 * restarts, grace 5 s, timeout from DT_TIMEOUT. */
void dt_launch_options_init(dt_launch_options *o);

/* Run the job to completion (including restarts). *exit_code (always set)
 * is what a launcher process should exit with: 0 on success, the failing
 * rank's exit code, 128 + signal for a rank killed by a signal or for a
 * launcher that was interrupted, 1 for a launch error (2 for bad options).
 * Returns DT_OK when every rank exited 0; DT_ERR_PEER when a rank failed,
 * with a summary in dt_last_error() naming the rank, its exit code or
 * signal and its last stderr lines; DT_ERR_ABORTED when interrupted;
 * DT_ERR_INVALID for bad options; DT_ERR_NOT_FOUND when the program cannot
 * be executed; DT_ERR_IO/DT_ERR_TIMEOUT/DT_ERR_MISMATCH for a port in use,
 * an unreachable master or nodes that disagree. Not thread-safe: it installs
 * SIGINT/SIGTERM/SIGCHLD handlers for its duration (restored on return). */
dt_status dt_launch_run(const dt_launch_options *o, int *exit_code);

/* Re-execute this program (/proc/self/exe) as o->nproc ranks with argv[1..]
 * minus `flag` and its value (see above); o->argv is ignored. */
dt_status dt_launch_self(const dt_launch_options *o, int argc, char *const *argv, const char *flag,
                         int *exit_code);

/* True when this process is already a rank of a job: DT_RANK is set, or
 * mpirun/srun started it (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK). */
bool dt_launch_in_job(void);

/* Fill out[DT_LAUNCH_TOKEN_HEX + 1] with a fresh token from /dev/urandom. */
dt_status dt_launch_new_token(char *out);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_LAUNCH_H */
