/*
 * report_internal.h — a loaded run (dtrain/report.h) as the files of the
 * report layer share it:
 *
 *   load.c    reading a run directory, aggregating its trace
 *   advice.c  the bottleneck rules
 *   html.c    the page: the data it embeds and the markup around it
 *
 * Every array is owned by the dt_run and freed by dt_run_destroy.
 */
#ifndef DTRAIN_REPORT_INTERNAL_H
#define DTRAIN_REPORT_INTERNAL_H

#include "dtrain/report.h"
#include "dtrain/train.h"

#include <jansson.h>

/* One line of metrics.jsonl. */
typedef struct run_step {
    int64_t step;
    double loss, val_loss, tokens_per_s, mfu, step_ms, pp_bubble;
    int nranks; /* breakdowns in bd (0: none) */
    double *bd; /* (nranks x DT_BREAKDOWN_FIELDS) ms, rank-major */
} run_step;

/* A kernel (trace events of one name with FLOPs or bytes), summed. */
typedef struct run_kernel {
    char name[48];
    char cat[16];
    int64_t count;
    double us, flops, bytes; /* over every rank and traced step */
    double min;              /* the fastest call (µs) */
    double best_rate;        /* the most FLOPs (else bytes) per µs of a call */
} run_kernel;

/* Collectives of one operation, transport, group size and message size. */
typedef struct run_coll {
    char op[24], link[12], algo[16];
    int ranks;
    double size;    /* the nccl-tests size: whole buffer of allgather etc. (bytes) */
    int64_t count;  /* events */
    double us, min; /* total and shortest duration (µs) */
    double model;   /* the alpha-beta model's time (µs), NaN without one */
} run_coll;

/* One event of the timeline window. */
typedef struct run_event {
    int pid, tid;
    double ts, dur; /* µs on the merged clock */
    char name[32];
    char cat[12];
    int idx;      /* layer, step, ... or -1 */
    double bytes; /* comm: payload */
} run_event;

typedef struct run_thread {
    int pid, tid;
    char name[32];
} run_thread;

/* A fitted link model of machine.json. */
typedef struct run_link {
    char transport[16], op[24];
    int ranks;
    double alpha, beta; /* s, bytes/s */
} run_link;

struct dt_run {
    char dir[4096];
    char name[256];  /* the directory's last component */
    json_t *config;  /* config.json (NULL if missing) */
    json_t *summary; /* summary.json (NULL if missing) */
    json_t *machine; /* trace/machine.json (NULL if missing) */
    run_step *steps; /* metrics.jsonl, in file order */
    size_t nsteps;
    int world;
    /* Mean breakdown per rank (summary.json, else the metrics' lines). */
    double *bd_mean; /* (bd_ranks x DT_BREAKDOWN_FIELDS) */
    int bd_ranks;
    int64_t bd_steps;
    /* The trace (none: traced false). */
    bool traced;
    int64_t traced_steps;  /* step events of rank 0 */
    double clock_error_us; /* the largest alignment error of a rank */
    run_kernel *kernels;
    size_t nkernels;
    run_coll *colls;
    size_t ncolls;
    run_event *events; /* the window: the last few steps of rank 0 */
    size_t nevents;
    double win0, win1; /* its bounds (µs) */
    int64_t win_steps;
    run_thread *threads;
    size_t nthreads;
    /* Machine: the run's peak (its precision), memory bandwidth, links. */
    double peak_flops, mem_bw;
    char precision[8];
    run_link *links;
    size_t nlinks;
    /* A predicted step (dtrain plan --timeline-json), none: npred 0. */
    run_event *pred;
    size_t npred;
    run_thread *pred_threads;
    size_t npred_threads;
    double pred_step_us; /* its simulated step */
    char pred_layout[200];
    char pred_path[4400];
};

/* A number of a JSON object, NaN when missing or null. */
double dt__rj_num(json_t *o, const char *key);
/* The config's value of option `key` as an integer (def when missing). */
int64_t dt__rj_cfg_int(const dt_run *r, const char *key, int64_t def);
const char *dt__rj_cfg_str(const dt_run *r, const char *key, const char *def);
/* The mean of field k of rank r's breakdown (NaN when unknown). */
double dt__run_bd(const dt_run *r, int rank, int k);
/* Mean step time of the run (ms): the ranks' mean of their step field,
 * else the metrics' median step_ms. */
double dt__run_step_ms(const dt_run *r);
/* The model's time (s) for a collective (NaN without a link fit). */
double dt__run_model_s(const dt_run *r, const char *op, const char *link, int ranks, double size);

#endif
