/*
 * train_internal.h — what the files of the train layer share: the trainer
 * (one rank's whole training state) and the functions each file gives the
 * others.
 *
 *   train.c   the configuration: defaults, validation, dt_train_run
 *   setup.c   everything built before the first step, and its teardown
 *   loop.c    the step loop, evaluation, the test hooks
 *   state.c   checkpoints: save and resume
 *   report.c  the header, the summary and the generated sample
 *
 * Nothing here names a parallel strategy: the loop sees a dt_grad_sync, an
 * optimizer and the mesh's groups.
 */
#ifndef DTRAIN_TRAIN_INTERNAL_H
#define DTRAIN_TRAIN_INTERNAL_H

#include "dtrain/data.h"
#include "dtrain/elastic.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"

/* The largest loss scale applied: 2^126, whose inverse 2^-126 is still a
 * normal float. The engine runs with denormals flushed to zero (tensor
 * layer), so unscaling by a subnormal 1/scale would zero every gradient. */
#define DT__MAX_APPLIED_SCALE 0x1p126f

/* --trace (tracing.c). */
typedef struct run_trace {
    bool on;             /* --trace */
    bool recording;      /* the recorder is on (a step of --trace-steps) */
    int64_t first, last; /* 1-based steps recorded */
    double origin;       /* rank 0's trace clock (ns) when tracing started: time 0 */
    dt_clock_sample c0;  /* this rank's clock against rank 0's then */
    char dir[4200];      /* RUN_DIR/trace */
} run_trace;

/* --offload, parsed: a comma-separated list of optimizer=disk:DIR,
 * optimizer=cpu, params=disk:DIR and params=direct:DIR (O_DIRECT). */
typedef struct dt__offload_spec {
    char optim_dir[1024];  /* the optimizer state's directory; "": memory */
    char params_dir[1024]; /* ZeRO 3's parameter pieces'; "": memory */
    bool params_direct;
} dt__offload_spec;

typedef struct trainer {
    const dt_train_config *c; /* &cfg once set up */
    /* The caller's config with what setup resolved: the run and checkpoint
     * directories of save_default, the bucket size. */
    dt_train_config cfg;
    char run_dir[4096], ckpt_dir[4096];
    dt_model_file init; /* --init-from, open from model_config to make_model */
    dt_group *world;    /* the job's group (owned); NULL for a single process */
    dt_mesh *mesh;      /* its layout; the groups the loop uses come from here */
    int rank, size;     /* in the world */
    int replica, dp;    /* data-parallel coordinate and degree: the loader's share */
    /* In the gradient group (dp x cp, dt_mesh_replica_group): the ranks
     * that average gradients, shard ZeRO's state and hold the same
     * replicated parameters (rank 0 writes them). */
    int sync_rank, sync_size;
    dt_tp *tp;            /* the model shard's communication points (NULL without --tp) */
    dt_cp *cp;            /* the context-parallel ones (NULL without --cp) */
    dt_pp_schedule *pipe; /* the pipeline's schedule (NULL without --pp) */
    int threads;          /* per rank */
    /* Data. */
    dt_token_file *data, *val_data; /* val_data NULL: validation is a split of data */
    const dt_tokenizer *tok;
    dt_bpe *bpe;          /* a bpe tokenizer's files (owned), or NULL */
    dt_tokenizer bpe_tok; /* its tokenizer value */
    dt_loader *train, *val;
    int B, T, K;               /* per-rank batch, sequence, micro-batches per step */
    int32_t *inputs, *targets; /* (K,B,T): a step's micro-batches */
    /* Model and optimization. */
    dt_gpt_config mc;
    dt_gpt *m;
    size_t n; /* parameters of this rank's model */
    dt_optimizer *opt;
    dt_grad_sync *sync;
    dt_runner *runner;        /* the step's forwards and backwards (sequential or a pipeline) */
    dt__offload_spec offload; /* --offload, parsed */
    dt_schedule sched;
    bool scaling; /* dynamic loss scaling (docs/amp.md) */
    /* bf16/fp16: the loop owns the model's 16-bit weight copy (loop.c,
     * weights_changed); w16_fused: the optimizer writes it as it updates. */
    bool w16_owned, w16_fused;
    dt_scaler scaler;
    char *cfg_text; /* config.json: the resolved config (dt__train_config_json) */
    /* Progress of the trajectory (what a checkpoint restores). */
    int64_t step;    /* steps completed */
    int64_t tokens;  /* tokens processed by all ranks so far */
    int64_t skipped; /* steps whose update was skipped (inf/nan gradients) */
    /* Resume bookkeeping. */
    int64_t ckpt_precision; /* dt_precision of the checkpoint resumed from */
    char resumed[4096];     /* the checkpoint resumed from, "" for a fresh start */
    /* Memory: resident bytes before the model was built, and the plan. */
    uint64_t rss_base;
    dt_rank_memory plan;
    /* Test hooks (loop.c): the step at which this rank acts, or -1. */
    int64_t kill_at, perturb_at, overflow_at;
    bool kill_mid; /* DT_FAULT_KILL=RANK:STEP:mid: during the step, not after it */
    /* DT_FAULT_SLOW (loop.c): this rank's slow-down factor (1: none) and
     * its last step's compute time, which sets the next step's sleep. */
    double slow_factor, last_busy_ms;
    /* Observability (tracing.c, breakdown.c; docs/observability.md). */
    run_trace trace;
    double peak_flops;         /* MFU's denominator per rank (FLOP/s), NaN if unknown */
    char peak_from[4400];      /* where it came from */
    dt_step_breakdown *bd;     /* (size) rank 0: the last exchanged step, every rank */
    dt_step_breakdown *bd_sum; /* (size) rank 0: sums over the steps counted */
    int64_t bd_steps;          /* steps in bd_sum */
    int64_t bd_first;          /* the first of them */
    double *rss;               /* (2 size) rank 0: every rank's peak and base resident bytes */
    double *bd_gather;         /* (size x DT_BREAKDOWN_FIELDS) rank 0: the gather's buffer */
    /* --elastic (elastic.c): the membership, NULL otherwise; the per-rank
     * batch at the smallest world size (the model and the batch buffers
     * are sized for it); a newcomer that has no state yet; the loader's
     * position after the last completed step (what a recovery resumes). */
    dt_elastic *elastic;
    int B_max;
    bool newcomer;
    dt_loader_state committed;
    dt_step_metrics last_sm; /* the metrics of the last completed step (loop.c) */
    int trace_fd; /* DT_DATA_TRACE: this process's record of the batches it read, or -1 */
} trainer;

/* A rejected configuration value. */
#define bad(...) dt_error_set(DT_ERR_INVALID, __VA_ARGS__)

/* train.c: the checks that need nothing built. */
dt_status dt__train_check_config(const dt_train_config *c);

/* The loss scale the next step applies (loop.c). */
float dt__train_applied_scale(const trainer *t);

/* shards.c: the global tensor table (the whole model's, dt_gpt_config_tensors)
 * and, for this rank's flat buffer, the box of each tensor it holds (tensor
 * i of this rank's model is whole[i], naming its global entry). */
typedef struct shards {
    dt_ckpt_tensor *tensors; /* (ng) the whole model's tensors */
    size_t ng;
    dt_ckpt_box *whole; /* (nt) the part of each tensor this rank holds */
    bool *owned;        /* (nt) this rank owns that part (not a copy another rank holds) */
    size_t nt;
} shards;

dt_status dt__shards_make(const trainer *t, shards *s);
void dt__shards_free(shards *s);
/* The boxes of this rank's tensors inside the flat ranges r[0..nr) (those
 * it owns, or all), with offsets into a buffer that holds the ranges one
 * after another: the map of a state buffer over those ranges. *out is
 * freed by the caller. */
dt_status dt__shards_boxes(const shards *s, const dt_range *r, size_t nr, bool only_owned,
                           dt_ckpt_box **out, size_t *n);
/* The optimizer's owned ranges (caller frees). */
dt_range *dt__owned_ranges(const dt_optimizer *o);

/* memory.c: what setup builds and `dtrain plan memory` plans, computed once. */
dt_status dt__train_mesh_shape(const dt_train_config *c, int world, dt_mesh_shape *shape);
dt_status dt__train_batch(const dt_train_config *c, int dp, int world, int *B);
/* The pipeline's schedule over K micro-batches, checked (*rep filled). */
dt_status dt__train_schedule(const dt_train_config *c, int K, dt_pp_schedule **out,
                             dt_pp_report *rep);
/* World rank `rank`'s model options: pipeline stage and slots (pipe may be
 * NULL), tensor-parallel shard, context-parallel share (regions and
 * cp_regions NULL in a plan). */
dt_status dt__train_model_options(const dt_train_config *c, const dt_gpt_config *mc,
                                  const dt_mesh_shape *shape, int rank, const dt_pp_schedule *pipe,
                                  const dt_pp_report *rep, const dt_tp_regions *regions,
                                  const dt_cp_regions *cp_regions, dt_gpt_options *o);
/* --cp-mode resolved: auto is Ulysses where the heads (per tp rank) and
 * the sequence divide by cp, else the ring. */
dt_cp_mode dt__train_cp_mode(const dt_train_config *c, const dt_gpt_config *mc);
/* The optimizer's owned ranges of n parameters (ZeRO: the replica's
 * pieces; else all); *out is freed by the caller. */
/* The DDP / ZeRO bucket size for a rank whose part holds n parameters:
 * --bucket-size, else a quarter of the gradient bytes within 1-25 MiB. */
size_t dt__train_bucket_bytes(const dt_train_config *c, size_t n);
dt_status dt__train_owned(const dt_train_config *c, size_t n, int dp, int replica, dt_range **out,
                          size_t *nr);
/* Parse and check --offload (each directory exists and is writable), or
 * the error that names what is wrong with it. */
dt_status dt__train_offload(const dt_train_config *c, dt__offload_spec *out);
/* The optimizer's configuration; its offload_dir points into *off. */
/* The model's tensors as the optimizer sees them ([*n], freed by the caller;
 * NULL: out of memory). */
dt_optim_tensor *dt__train_optim_tensors(const trainer *t, size_t *n);
dt_optim_config dt__train_optim_config(const dt_train_config *c, const dt__offload_spec *off);

/* setup.c. dt__train_model_group: collective over the world, the ranks
 * that hold the first replica's model parts (all of them when the model is
 * not split; NULL elsewhere). */
dt_status dt__train_setup(trainer *t);
void dt__train_free(trainer *t);
/* The optimizer's reduce hook (dt_optim_reduce_fn, user = the trainer): a
 * sum over the gradient group (dp x cp, dt_mesh_replica_group), for an
 * optimizer that owns a share of its replica's parameters (ZeRO) or
 * averages statistics (K-FAC's factors). */
dt_status dt__train_optim_reduce(void *user, double *values, size_t n);
/* Its broadcast over the gradient group (K-FAC's inverses). */
dt_status dt__train_optim_bcast(void *user, float *values, size_t n, int root);

/* dp_mode.c: --dp-mode local, gossip and ps (docs/async.md). The checks made
 * before anything is built; and the gradient synchronisation of those
 * modes over the replica group, with the ranges counted in the norm. */
dt_status dt__train_check_dp_mode(const dt_train_config *c);
dt_status dt__train_make_dp_mode_sync(trainer *t, const dt_ddp_sync_config *ddp);
/* After the run, every rank: the mode's summary line on rank 0 (the
 * parameter server's staleness distribution over all servers). */
dt_status dt__train_dp_mode_report(trainer *t, FILE *f);

/* setup.c: the mesh over t->world and this rank's place in it (replica,
 * dp, gradient group), the loaders of this place, the gradient
 * synchronisation: what a membership change rebuilds. */
dt_status dt__train_layout(trainer *t);
dt_status dt__train_make_loaders(trainer *t);
dt_status dt__train_make_sync(trainer *t);

/* elastic.c (docs/fault-tolerance.md, "Elastic training"). */
/* The checks of --elastic and --join that need nothing built. */
dt_status dt__train_check_elastic(const dt_train_config *c);
/* setup: join the elastic job (a newcomer gets no world yet). */
dt_status dt__train_elastic_join(trainer *t);
/* Whether st, from a step or an end-of-step collective, is a rank lost
 * that an elastic job survives. */
bool dt__train_elastic_recoverable(const trainer *t, dt_status st);
/* Every member: a new membership (after a failure, after agreeing to grow,
 * or a newcomer's first), the layout rebuilt for it and the state of its
 * most advanced member broadcast. It writes the parameters: the caller
 * (loop.c) marks the model's 16-bit copy stale after it. */
dt_status dt__train_elastic_recover(trainer *t, bool failed);
/* After a step: whether newcomers wait (rank 0 looks, every rank learns). */
dt_status dt__train_elastic_poll(trainer *t, bool *grow);
/* DT_DATA_TRACE: record the windows of micro-batch k of this step before
 * it is read. */
void dt__train_trace_batch(trainer *t, int k);

/* state.c: every rank calls both (collective over the world). */
dt_status dt__train_save(trainer *t, char *path, size_t len);
dt_status dt__train_resume(trainer *t);

/* model_io.c, --init-from: the model shape of the file (checked against
 * the flags and the data), and this rank's part of its parameters. */
dt_status dt__train_init_config(trainer *t, dt_gpt_config *mc);
dt_status dt__train_init_params(trainer *t);

/* config_json.c: the text of config.json (malloc'ed), NULL when out of
 * memory. */
char *dt__train_config_json(const trainer *t);

/* report.c (rank 0) */
void dt__train_print_header(const trainer *t, double peak, const char *peak_from, FILE *f);
dt_status dt__train_generate(trainer *t, dt_gpt *m, FILE *out);
/* Collective over the first replica: the unsharded model on rank 0 (t->m
 * itself when the model is not split; otherwise a new one the caller
 * destroys), NULL elsewhere. */
dt_status dt__train_whole_model(trainer *t, dt_gpt **out);
double dt__median(double *v, size_t n);

/* tracing.c: --trace. start: collective over the world (clock samples,
 * time 0); step_begin turns recording on at the first step of
 * --trace-steps and returns the step's region start; step_end records
 * the step and turns recording off after the last; finish: collective,
 * writes RUN_DIR/trace/ (rank-R.json, trace.json and machine.json). */
dt_status dt__trace_start(trainer *t);
uint64_t dt__trace_step_begin(trainer *t);
void dt__trace_step_end(trainer *t, uint64_t t0);
dt_status dt__trace_finish(trainer *t);

/* breakdown.c: every rank's step breakdown on rank 0. exchange: collective
 * over the world (a gather) on the steps where the replicas meet (`meet`;
 * else rank 0 keeps its own), then rank 0 moves what a rank waited for
 * a slower one out of its exposed communication into idle; `count` adds
 * the step to the run's means. *nranks: how many breakdowns t->bd holds. */
dt_status dt__breakdown_init(trainer *t);
/* A new membership (--elastic): the sums start again, ranks renumbered. */
void dt__breakdown_restart(trainer *t);
dt_status dt__breakdown_exchange(trainer *t, const dt_step_breakdown *mine, bool meet, bool count,
                                 int *nranks);
/* Collective at the end of the run: every rank's resident memory to rank 0. */
dt_status dt__breakdown_collect(trainer *t);
/* Rank 0: the means per rank (table) into f. */
void dt__breakdown_print(const trainer *t, FILE *f);
/* Rank 0: RUN_DIR/summary.json (the run's figures for `dtrain report`). */
dt_status dt__train_write_summary(const trainer *t, const dt_train_result *res, double mfu);

/* peak.c: "model name" of /proc/cpuinfo, or "unknown CPU". */
void dt__cpu_model(char *out, size_t len);

#endif
