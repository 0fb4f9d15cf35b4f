/*
 * dtrain/plan.h — the planner: which parallel layout to run, and what it
 * will cost, before anything runs.
 *
 * Overview
 * --------
 * A cluster description (dt_cluster: devices per node, peak FLOP/s per
 * precision and an efficiency curve, memory and its bandwidth, the links
 * inside a node and between nodes) and a request (the model, the global
 * batch, the device count, optional fixed degrees) go in; ranked layouts
 * come out, each with its predicted step time, throughput, MFU and memory
 * per device, and every layout that was dropped is counted under the
 * reason it failed. The model is analytic (docs/planner.md gives every
 * equation):
 *
 *   compute   FLOPs of each pass (nn's dt_gpt_flops_per_token) divided by
 *             peak x efficiency(C / tp); recomputation adds a forward;
 *   comm      each strategy's own description of what it sends
 *             (parallel.h, "Planning costs"), priced with the alpha-beta
 *             model of the link its group crosses (a group whose ranks sit
 *             on one node uses the intra-node link, else the inter-node
 *             one), overlapped where the code overlaps it;
 *   pipeline  the schedule the trainer runs, simulated by its checker
 *             (dt_pp_check) with these durations: the bubble comes out;
 *   memory    the trainer's own plan (dt_train_plan_memory) of the first
 *             and last pipeline stages: the plan and the run cannot
 *             disagree.
 *
 * Ownership rules:
 *   1. dt_cluster and dt_plan_request are plain values; the planner keeps
 *      no pointer to them after a call returns.
 *   2. dt_plan_result owns its arrays; dt_plan_result_free releases them
 *      (and is a no-op on a zeroed result).
 *   3. dt_cluster_measure runs computation on this machine (a few seconds;
 *      the peak FLOP/s come from train.h's cache); nothing else here does.
 *   4. Every function that reads input (a file, a request) validates it
 *      first and names the bad field and value in dt_last_error().
 *
 * Example
 * -------
 *     dt_cluster cl;
 *     DT_CHECK(dt_cluster_load("examples/clusters/dgx-a100.json", &cl));
 *     dt_plan_request rq = dt_plan_request_default();
 *     DT_CHECK(dt_gpt_preset("gpt2-350m", &rq.model));
 *     rq.global_batch = 512;
 *     rq.devices = 64;
 *     dt_plan_result res;
 *     DT_CHECK(dt_plan_search(&rq, &cl, &res));
 *     // res.ranked[0].layout: dp x tp x pp ..., res.ranked[0].step_s, ...
 *     dt_plan_result_free(&res);
 */
#ifndef DTRAIN_PLAN_H
#define DTRAIN_PLAN_H

#include "dtrain/core.h"
#include "dtrain/nn.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Cluster description                                                      */
/* ------------------------------------------------------------------------ */
/*
 * A JSON file (docs/planner.md, "Cluster files"; examples/clusters/):
 *
 *   {"name": "dgx-a100", "source": "where the figures come from",
 *    "devices_per_node": 8, "nodes": 0,
 *    "device": {"memory_gib": 80, "memory_bw_gbs": 2039,
 *               "peak_tflops": {"fp32": 19.5, "bf16": 312, "fp16": 312},
 *               "efficiency": {"max": 0.62, "half_width": 160},
 *               "shared_compute": false},
 *    "intra": {"bw_gbs": 300, "latency_us": 3, "topology": "nvswitch"},
 *    "inter": {"bw_gbs": 200, "latency_us": 5, "rails": 8, "topology": "fat-tree"}}
 *
 * Bandwidths are one direction, GB/s (1e9 bytes/s); intra is per device,
 * inter the whole node's (all rails). nodes 0: as many as the request
 * needs. shared_compute (a CPU box): the figures of "device" are the
 * node's, shared by the ranks placed on it.
 */
typedef struct dt_link {
    double bw;         /* bytes/s, one direction (intra: per device; inter: per node) */
    double alpha;      /* seconds per message (latency) */
    int rails;         /* inter: network ports per node */
    char topology[32]; /* documentation only ("nvswitch", "fat-tree", "shm") */
} dt_link;

typedef struct dt_cluster {
    char name[64];
    char source[512];                /* where the figures come from */
    int devices_per_node;            /* >= 1 */
    int nodes;                       /* 0: unlimited */
    bool shared_compute;             /* the device figures are the node's (CPU ranks) */
    double peak[DT_PRECISION_COUNT]; /* FLOP/s per device (shared: per node); 0: unsupported */
    double eff_max;                  /* efficiency(w) = eff_max * w / (w + eff_half), */
    double eff_half;                 /*   w = the model width per tensor-parallel rank */
    double memory;                   /* bytes per device (shared: per node) */
    double memory_usable;            /* fraction a plan may fill (default 0.9) */
    double mem_bw;                   /* bytes/s per device (shared: per node) */
    dt_link intra, inter;
} dt_cluster;

/* Read a cluster file; DT_ERR_INVALID names the file, the field and the value. */
dt_status dt_cluster_load(const char *path, dt_cluster *out);
/* Describe this machine by measuring it (rule 3): the peak of each
 * precision (dt_peak_flops), the efficiency curve from timed forward and
 * backward passes of two GPT widths, the copy bandwidth (memory and the
 * shared-memory link); one node of shared compute. */
dt_status dt_cluster_measure(dt_cluster *out);
/* Write c as a cluster file. */
dt_status dt_cluster_write(const dt_cluster *c, FILE *f);
/* The compute efficiency at width w (model width per tp rank). */
double dt_cluster_efficiency(const dt_cluster *c, double w);

/* ------------------------------------------------------------------------ */
/* Layouts, requests, predictions                                           */
/* ------------------------------------------------------------------------ */

typedef struct dt_plan_layout {
    int dp, tp, pp, cp;  /* degrees, product = devices */
    int chunks;          /* pipeline chunks per rank (1, or V of interleaved:V) */
    dt_pp_kind schedule; /* with pp > 1 */
    int micro_batch;     /* sequences per micro-batch per data-parallel rank */
    int micro;           /* micro-batches per step: global batch / (dp x micro_batch) */
    int zero;            /* ZeRO stage over the replica group */
    int recompute_every; /* 0: none; 1: every block */
    bool sp;             /* sequence parallelism with tp */
    dt_cp_mode cp_mode;  /* with cp > 1 */
    dt_precision precision;
} dt_plan_layout;

/* "dp 8 x tp 4 x pp 12 (1f1b), mb 2 x 128, zero 1, recompute blocks, bf16" */
char *dt_plan_layout_format(const dt_plan_layout *l, char *buf, size_t len);

typedef struct dt_plan_request {
    dt_gpt_config model;
    int global_batch; /* sequences per optimizer step, all replicas */
    int devices;      /* ranks of the job */
    dt_precision precision;
    bool any_precision; /* search every precision the cluster has */
    /* Fixed choices (0, or -1 for zero and recompute: search). */
    int dp, tp, pp, cp, chunks, micro_batch;
    int zero, recompute;
    int pp_kind;             /* -1: search 1f1b, interleaved:2/4 and zb */
    dt_optim_kind optimizer; /* whose state the memory counts (default AdamW) */
    int keep;                /* fitting layouts to evaluate exactly (0: all) */
} dt_plan_request;

dt_plan_request dt_plan_request_default(void);

/* One predicted layout. Times in seconds per optimizer step. */
typedef struct dt_plan_candidate {
    dt_plan_layout layout;
    double step_s;           /* the prediction */
    double passes_s;         /* forwards and backwards (with the pipeline's bubble and
                                the blocking tp/cp communication) */
    double compute_s;        /* of which pure computation on the busiest rank */
    double bubble;           /* pipeline idle fraction (simulated); 0 without pp */
    double model_comm_s;     /* tp/cp/pp communication on the critical path */
    double sync_s;           /* gradient/parameter synchronisation not hidden */
    double optimizer_s;      /* the update */
    double tokens_per_s;     /* the whole job */
    double tflops_device;    /* model FLOPs (3 x forward) per device per second, /1e12 */
    double hw_tflops_device; /* counting recomputation's forward (4 x forward), /1e12 */
    double mfu;              /* model FLOPs / (devices x peak) */
    double memory;           /* bytes of the fullest rank */
    dt_rank_memory mem;      /* its breakdown (dt_train_plan_memory) */
    double assembly;         /* rank 0 after training: the whole model (dt_rank_memory) */
} dt_plan_candidate;

typedef struct dt_plan_pruned {
    char reason[200];       /* the first layout's reason, as text */
    size_t count;           /* layouts that failed for this kind of reason */
    dt_plan_layout example; /* the first of them */
} dt_plan_pruned;

typedef struct dt_plan_result {
    dt_plan_candidate *ranked; /* (n) fastest first */
    size_t n;
    size_t considered;      /* layouts enumerated */
    dt_plan_pruned *pruned; /* (npruned) one per kind of reason */
    size_t npruned;
    double seconds; /* time the search took */
} dt_plan_result;

/* Validate a request against a cluster (DT_ERR_INVALID names the field). */
dt_status dt_plan_request_validate(const dt_plan_request *rq, const dt_cluster *cl);
/* Predict one layout. DT_ERR_INVALID (or DT_ERR_NOMEM for "does not fit")
 * with the reason in dt_last_error() when the layout cannot run. */
dt_status dt_plan_evaluate(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_layout *l,
                           dt_plan_candidate *out);
/* The same from the formulas alone (no memory plan, the theoretical
 * bubble): what the search orders its candidates by. */
dt_status dt_plan_estimate(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_layout *l,
                           dt_plan_candidate *out);
/* Every layout of rq->devices the fixed choices allow, ranked. The search
 * estimates every layout, then evaluates them (memory and the simulated
 * schedule) in the order of their estimates until rq->keep fit; the rest
 * are counted under "not evaluated" (keep 0: evaluate all). */
dt_status dt_plan_search(const dt_plan_request *rq, const dt_cluster *cl, dt_plan_result *out);
void dt_plan_result_free(dt_plan_result *r);

/* The trainer's configuration of a layout (for `dtrain train --layout
 * auto` and `dtrain plan memory`): dp, tp, pp, cp, sp, pp_schedule (a
 * static string), batch, accum, zero, recompute, precision. */
void dt_plan_layout_to_config(const dt_plan_layout *l, dt_train_config *c);

/* The same as `dtrain train` flags ("--dp 2 --tp 1 ... --precision bf16"),
 * made from dt_plan_layout_to_config so the two cannot disagree. */
char *dt_plan_layout_args(const dt_plan_layout *l, char *buf, size_t len);

/* Print a predicted timeline of one step of l (each pipeline rank's
 * forwards, backwards and the synchronisation) as text. */
dt_status dt_plan_timeline(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_layout *l,
                           FILE *f);

/* The step of l as a discrete-event simulation (dtrain/sim.h; src/plan/
 * step_sim.c; docs/planner.md, "The step simulation"): the schedule table
 * action by action, each action's compute and communication from the
 * same inputs as dt_plan_evaluate, the collectives on the links they cross
 * sharing their bandwidth when they overlap. */
typedef struct dt_plan_sim {
    double step_s;     /* the simulated step */
    double alone_s;    /* the same with every transfer alone on its link (no contention) */
    double analytic_s; /* dt_plan_evaluate's step_s */
} dt_plan_sim;

/* Simulate one step of l; with `trace`, write its timeline there as a
 * Chrome trace (the format of `dtrain train --trace`, one process per
 * pipeline stage's first rank: `dtrain report --predicted` overlays it).
 * DT_ERR_INVALID when l cannot run (dt_plan_evaluate's reasons) or has
 * more than 2e6 schedule actions. */
dt_status dt_plan_simulate(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_layout *l,
                           dt_plan_sim *out, FILE *trace);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_PLAN_H */
