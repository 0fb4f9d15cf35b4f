/*
 * plan_internal.h — what the analytic model (model.c) hands the step
 * simulation (step_sim.c): the same durations and the same strategy items,
 * so the two cannot price a layout from different inputs.
 */
#ifndef DTRAIN_PLAN_INTERNAL_H
#define DTRAIN_PLAN_INTERNAL_H

#include "dtrain/plan.h"

/* One step's inputs, for the busiest pipeline rank's share. */
typedef struct dt__plan_step {
    dt_plan_candidate cand;       /* the analytic prediction (dt_plan_evaluate) */
    double f, b, w;               /* compute of one micro-batch (all the rank's chunks) */
    dt_strategy_cost model, sync; /* what the strategies send (parallel.h) */
    int group[DT_AXIS_COUNT];     /* the group size of each axis (dp: the replica group) */
    dt_link link[DT_AXIS_COUNT];  /* the link each axis's group crosses, per rank */
    bool across[DT_AXIS_COUNT];   /* ... and whether it is the inter-node one */
    double intra_bw, inter_bw;    /* one rank's share of each link (bytes/s) */
} dt__plan_step;

/* dt_plan_evaluate, keeping its inputs. */
dt_status dt__plan_step_inputs(const dt_plan_request *rq, const dt_cluster *cl,
                               const dt_plan_layout *l, dt__plan_step *out);
/* A collective's alpha-beta cost split into its latency terms and the
 * bytes its slowest rank moves through the link: time = *latency +
 * *bytes / k->bw (docs/planner.md, "Collectives"). */
void dt__plan_coll_parts(const dt_comm_cost *c, int n, const dt_link *k, double *latency,
                         double *bytes);

#endif
