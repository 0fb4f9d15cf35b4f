/*
 * dtrain/sim.h — a small discrete-event simulator of tasks on lanes and
 * transfers on shared links, the engine of `dtrain plan --timeline-json`
 * (the planner builds a step out of it: src/plan/step_sim.c).
 *
 * Overview
 * --------
 * A simulation holds lanes, links and tasks:
 *
 *   lane   a stream that runs its tasks one at a time, in the order they
 *          were added (a rank's compute stream, its gradient-sync stream,
 *          its pipeline sends); named (pid, tid, name) as a trace thread.
 *   link   a resource of bandwidth B bytes/s. Every transfer that is
 *          moving bytes on a link at a time gets an equal share of it:
 *          n transfers at once move at B / n each (processor sharing), so
 *          two collectives that overlap on one link both slow down.
 *   task   on one lane, after its dependencies (up to DT_SIM_DEPS other
 *          tasks) have finished and the task before it on the lane has.
 *          A compute task lasts `seconds`. A transfer on link k first
 *          waits `seconds` (its latency terms, which use no bandwidth),
 *          then moves `bytes` at its share of k's bandwidth.
 *
 * A collective is one transfer of its alpha-beta cost: a ring allreduce of
 * S bytes over n ranks is 2 (n-1) alpha seconds and 2 (n-1)/n S bytes, so
 * alone on its link it takes exactly the analytic model's time
 * (docs/planner.md) and with company longer. dt_sim_run advances from event
 * to event (a task ends, a latency ends, a transfer finishes); each event
 * recomputes the shares. The result is each task's start and end, and
 * dt_sim_write_trace writes them as a Chrome-trace / Perfetto JSON file in
 * the format of `dtrain train --trace` (one event per line; `dtrain
 * report --predicted` overlays it on a measured run).
 *
 * Ownership rules
 * ---------------
 *   1. dt_sim_create returns a simulation the caller destroys with
 *      dt_sim_destroy (NULL-safe); it owns every lane, link and task.
 *   2. Names are copied (truncated to 31 bytes); the simulation keeps no
 *      pointer the caller passed in.
 *   3. Lanes, links and tasks are numbered from 0 in the order they were
 *      added; a task may depend only on tasks added before it, so the graph
 *      has no cycle by construction.
 *   4. dt_sim_run runs once; after it, dt_sim_task_time reads the times and
 *      nothing more may be added (DT_ERR_INVALID).
 *   5. Bad input (a negative duration, an unknown lane, link or dependency,
 *      a link of no bandwidth) is refused when it is added, naming the
 *      field and the value in dt_last_error().
 *
 * Example: two 100 MB transfers on one 10 GB/s link, the second starting
 * 5 ms later. The first moves 50 MB alone, then both share the link: it
 * ends at 15 ms, the second at 20 ms (alone each would take 10 ms).
 *
 *     dt_sim *s;
 *     DT_CHECK(dt_sim_create(&s));
 *     int a = dt_sim_lane(s, 0, 1, "sync a"), b = dt_sim_lane(s, 0, 2, "sync b");
 *     int k = dt_sim_link(s, "nic", 10e9);
 *     int wait = dt_sim_add(s, &(dt_sim_task){.lane = b, .link = -1, .seconds = 5e-3,
 *                                             .name = "idle", .cat = "wait"});
 *     dt_sim_add(s, &(dt_sim_task){.lane = a, .link = k, .bytes = 100e6, .name = "allreduce",
 *                                  .cat = "comm"});
 *     dt_sim_add(s, &(dt_sim_task){.lane = b, .link = k, .bytes = 100e6, .name = "allreduce",
 *                                  .cat = "comm", .deps = {wait}, .ndeps = 1});
 *     double makespan;
 *     DT_CHECK(dt_sim_run(s, &makespan));   // 0.020
 *     dt_sim_destroy(s);
 */
#ifndef DTRAIN_SIM_H
#define DTRAIN_SIM_H

#include "dtrain/core.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DT_SIM_DEPS 4

typedef struct dt_sim dt_sim;

typedef struct dt_sim_task {
    int lane;              /* dt_sim_lane's number */
    int link;              /* -1: compute (or a wait); else the link the bytes cross */
    double seconds;        /* compute: its duration; transfer: its latency before the bytes */
    double bytes;          /* transfer: bytes through the link (0 for compute) */
    int deps[DT_SIM_DEPS]; /* tasks that must end before this one starts (rule 3) */
    int ndeps;
    const char *name; /* the trace event's name ("F3", "dp allreduce") */
    const char *cat;  /* its category: "compute", "comm", "optim", ... (trace.h's names) */
    int idx;          /* the event's index argument (micro-batch, bucket), -1: none */
} dt_sim_task;

dt_status dt_sim_create(dt_sim **out);
void dt_sim_destroy(dt_sim *s);
/* A lane drawn as thread `tid` of process `pid` (the rank). Returns its
 * number, or -1 with dt_last_error() set. */
int dt_sim_lane(dt_sim *s, int pid, int tid, const char *name);
/* A link of bw bytes/s (> 0). Returns its number, or -1. */
int dt_sim_link(dt_sim *s, const char *name, double bw);
/* Add a task (rule 5). Returns its number, or -1. */
int dt_sim_add(dt_sim *s, const dt_sim_task *t);
/* Run the simulation (rule 4); *makespan gets the last end. */
dt_status dt_sim_run(dt_sim *s, double *makespan);
/* Times of task `id` after the run (seconds from 0). */
void dt_sim_task_time(const dt_sim *s, int id, double *start, double *end);
/* The run as a Chrome trace: one process per pid ("predicted rank N"),
 * one thread per lane, one complete event per task (µs). other_json, if
 * not NULL, is a JSON object written as "otherData". */
dt_status dt_sim_write_trace(const dt_sim *s, FILE *f, const char *other_json);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SIM_H */
