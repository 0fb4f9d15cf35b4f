/*
 * dtrain/train.h — the training layer: metrics, progress and the training
 * loop (the checkpoint container is dtrain/ckpt.h).
 *
 * Overview
 * --------
 * The training loop. dt_train_run() is `dtrain train` without the flag
 * parsing: it joins the job described by the environment (or runs alone),
 * opens the data, builds the model, averages gradients with the DDP of
 * parallel.h, steps the optimizer, evaluates, checkpoints, resumes, writes
 * metrics and draws progress on rank 0 (docs/train.md).
 *
 * Metrics and progress. dt_metrics writes RUN_DIR/metrics.jsonl, one JSON
 * object per step, and config.json; dt_progress draws a live line on a
 * terminal or prints plain periodic lines elsewhere.
 *
 */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/amp.h"
#include "dtrain/ckpt.h"
#include "dtrain/comm.h"
#include "dtrain/compress.h"
#include "dtrain/core.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"

#include <stdatomic.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Metrics: RUN_DIR/metrics.jsonl and RUN_DIR/config.json                   */
/* ------------------------------------------------------------------------ */

/* Where one step's time went on one rank (docs/observability.md, "Step
 * breakdown"), in ms. compute + exposed_comm + data + optimizer + idle =
 * step; overlapped_comm ran at the same time as compute and is not in
 * the sum. */
typedef struct dt_step_breakdown {
    double compute;         /* forward and backward (a DT_FAULT_SLOW straggler's sleep too) */
    double exposed_comm;    /* communication the rank waited for: the gradient
                               synchronisation after backward, tensor- and
                               context-parallel communication */
    double overlapped_comm; /* gradient communication hidden behind backward */
    double data;            /* reading the step's micro-batches */
    double optimizer;       /* the update and what goes with it (unscaling, clipping), not
                               waiting for communication */
    double idle;            /* the rest: waiting for other ranks (a straggler, the pipeline's
                               bubble, the step's agreement) */
    double step;            /* this rank's step time */
} dt_step_breakdown;

/* The order dt_step_breakdown's fields are written in, and their names in
 * metrics.jsonl ("compute", "exposed_comm", ...). */
#define DT_BREAKDOWN_FIELDS 7
extern const char *const dt_breakdown_names[DT_BREAKDOWN_FIELDS];

/* What one optimizer step measured. A NaN double is written as null (for
 * example val_loss on steps without evaluation). */
typedef struct dt_step_metrics {
    int64_t step;           /* 1-based optimizer step */
    int64_t total_steps;    /* steps of the whole run */
    double loss;            /* training loss, averaged over ranks */
    double val_loss;        /* validation loss, NaN if not evaluated */
    double lr;              /* learning rate used by this step */
    double grad_norm;       /* global gradient norm before clipping */
    double tokens_per_s;    /* tokens of all ranks per second of this step */
    double step_ms;         /* wall time of the step */
    double compute_ms;      /* forward + backward + optimizer (step minus exposed comm) */
    double comm_ms;         /* time gradient communication was in flight */
    double exposed_comm_ms; /* communication not hidden behind compute */
    double tp_comm_ms;      /* time in the model's tensor- and context-parallel communication
                               (exposed: a part waits for it, bar the ring's overlapped
                               transfers); NaN without either */
    double cp_attention_ms; /* context parallelism: time in attention, its communication
                               included; NaN without cp */
    double pp_bubble;       /* pipeline: measured idle fraction of the stages in the step's
                               forwards and backwards (parallel.h, dt_run_result); NaN
                               without a pipeline */
    int pp_peak_live;       /* pipeline: most micro-batches this rank kept alive; 0 without */
    double mfu;             /* model FLOPs utilisation in [0, 1], NaN if unknown */
    uint64_t bytes_sent;    /* gradient bytes this rank sent in the step */
    int64_t tokens;         /* tokens processed so far (all ranks) */
    double loss_scale;      /* loss scale this step used, NaN when scaling is off */
    int64_t skipped_steps;  /* steps skipped for inf/nan gradients so far (cumulative) */
    bool skipped;           /* this step's update was skipped */
    bool has_staleness;     /* --dp-mode ps (written then): */
    int64_t staleness;      /* the largest staleness of rank 0's pushes in the step */
    bool has_consensus;     /* --dp-mode gossip measured (every 10 steps, written then): */
    double consensus;       /* the replicas' mean squared distance to their average */
    /* Every rank's breakdown (ranks[r] of world rank r), written as
     * "breakdown": {"compute": [r0, r1, ...], ...}; nranks 0: not written.
     * A step on which the replicas do not meet (local SGD, gossip) has
     * rank 0's only (nranks 1). */
    const dt_step_breakdown *ranks;
    int nranks;
} dt_step_metrics;

typedef struct dt_metrics dt_metrics;

/* Create RUN_DIR (and parents) and open RUN_DIR/metrics.jsonl. A run that
 * resumed from step resume_step > 0 keeps the lines of steps up to it (and
 * drops later ones, which the resumed run replays), so the file always
 * holds one line per step of the trajectory; 0 starts an empty file. */
dt_status dt_metrics_create(dt_metrics **out, const char *run_dir, int64_t resume_step);
/* Append one JSON object line and flush it. */
dt_status dt_metrics_log(dt_metrics *m, const dt_step_metrics *s);
void dt_metrics_destroy(dt_metrics *m);

/* Write `json` (a complete JSON document) to RUN_DIR/config.json atomically.
 * A run's config.json holds every option of `dtrain train` under its flag's
 * name with the value the run used, so `dtrain train --config` reads it back
 * and reproduces the run; what the run observed (parameter count, world
 * size, buckets, version, directories) sits in its "info" object. */
dt_status dt_metrics_write_config(const char *run_dir, const char *json);

/* Format one metrics object as a JSON line (with '\n') into buf; returns the
 * length, or -1 if it does not fit. */
int dt_metrics_format(char *buf, size_t len, const dt_step_metrics *s);

/* ------------------------------------------------------------------------ */
/* Progress display (rank 0)                                                */
/* ------------------------------------------------------------------------ */

typedef struct dt_progress dt_progress;

/* `out` is typically stderr. With tty (usually isatty(fileno(out))) one
 * live line is redrawn in place; otherwise a plain line is printed every
 * `every` steps (0: about 20 lines per run) and on the last step. */
dt_status dt_progress_create(dt_progress **out, FILE *f, bool tty, int64_t total_steps,
                             int64_t every);
void dt_progress_update(dt_progress *p, const dt_step_metrics *s);
/* End the live line (newline) so that later output starts clean. */
void dt_progress_finish(dt_progress *p);
void dt_progress_destroy(dt_progress *p);

/* Render the sparkline of `n` values (newest last) into buf as UTF-8 block
 * characters (3 bytes each); returns buf. */
char *dt_sparkline(char *buf, size_t len, const double *values, size_t n);

/* ------------------------------------------------------------------------ */
/* Model files                                                              */
/* ------------------------------------------------------------------------ */

typedef enum dt_model_format {
    DT_MODEL_WEIGHTS,     /* dtrain's weights file (RUN_DIR/model.dtgw) */
    DT_MODEL_CHECKPOINT,  /* a dtrain checkpoint (any layout) */
    DT_MODEL_SAFETENSORS, /* Hugging Face GPT-2 names and layouts */
    DT_MODEL_LLMC,        /* llm.c's gpt2_124M.bin (versions 3, fp32, and 5, bf16) */
    DT_MODEL_FORMAT_COUNT
} dt_model_format;

extern const char *const dt_model_format_names[DT_MODEL_FORMAT_COUNT];

/* A whole GPT read from a file, and what the file says of its tokenizer. */
typedef struct dt_model_file {
    dt_gpt *model;          /* the unsharded model (batch 1), owned */
    dt_model_format format; /* what the file was */
    char path[4096];        /* the file read (a folder resolved to it) */
    int64_t step;           /* a checkpoint's step, else -1 */
    int tok_kind;           /* dt_tokenizer_kind of the stored table, -1: none */
    uint8_t vocab[256];     /* the char/byte tokenizer's table */
    int vocab_len;          /* its length, 0 when the file holds none */
} dt_model_file;

/* Read a model from `path`, whatever it is: a weights file, a checkpoint
 * file, a checkpoint folder (its newest valid checkpoint), a run folder
 * (model.dtgw, else ckpt/), a safetensors file with Hugging Face GPT-2
 * names, or llm.c's model file. The format is found from the first bytes,
 * never the name; anything else is DT_ERR_INVALID naming what was
 * expected. max_seq > 0 caps the positions the model is built for; heads
 * > 0 gives the head count a safetensors file does not record (default:
 * the file's dtrain.heads, else dim / 64 as in every GPT-2). */
dt_status dt_model_open(dt_model_file *out, const char *path, int max_seq, int heads);
void dt_model_close(dt_model_file *f);

/* Write f's model as safetensors with Hugging Face GPT-2 names and
 * layouts (Conv1D weights transposed), F32, atomically. Deterministic:
 * open + export of the result gives the same bytes. */
dt_status dt_model_export_safetensors(const dt_model_file *f, const char *path);

/* ------------------------------------------------------------------------ */
/* Peak FLOP/s, the denominator of MFU                                      */
/* ------------------------------------------------------------------------ */

/* The peak of one rank (docs/train.md, "MFU"): the best of several bursts
 * of a square matrix multiply in the compute type `p` (fp32: sgemm; bf16:
 * the bf16 GEMM, on AMX where the CPU has it; fp16: the fp16 GEMM) with the
 * current dt_tensor_threads(). It is measured once per machine (CPU model,
 * ISA level, threads, compute type) and cached in
 * $XDG_CACHE_HOME/dtrain/peak.json (default ~/.cache/dtrain/peak.json), so
 * MFU compares runs against one fixed number instead of a timing taken at
 * each start under whatever load. `remeasure` measures longer (2048^3,
 * best of 10; `dtrain bench peak`) and replaces the cached value. `from`
 * (len bytes, may be NULL) says where the number came from. An unwritable
 * cache is not an error: the value is then measured again next time. */
dt_status dt_peak_flops(dt_precision p, bool remeasure, double *flops, char *from, size_t len);

/* The cache file's path ($XDG_CACHE_HOME or $HOME/.cache, then
 * dtrain/peak.json) into buf; DT_ERR_NOT_FOUND without either variable. */
dt_status dt_peak_cache_path(char *buf, size_t len);

/* ------------------------------------------------------------------------ */
/* The machine profile: measured peaks, memory bandwidth, link models       */
/* ------------------------------------------------------------------------ */
/*
 * The peak cache above is this machine's profile (docs/observability.md,
 * "Machine profile"): besides the peaks it keeps the memory bandwidth
 * (`dtrain bench memcpy`, or measured once by a traced run) and, per
 * transport, collective and rank count, the alpha-beta model of the
 * collective fitted to `dtrain bench comm`'s timings. A traced run copies
 * the figures of this machine into RUN_DIR/trace/machine.json for its
 * report (the roofline and the collectives against their model); the
 * planner's `--cluster this` takes its link figures from here.
 */

/* One collective's alpha-beta model on one transport: a call on m bytes
 * (the nccl-tests "size": the whole buffer of an allgather, reduce-scatter
 * or alltoall) takes alpha + m / beta seconds. link_alpha and link_bw are
 * the same fit read as the ring model of a link (allreduce: 2(n-1) steps
 * of latency and 2(n-1)/n of the bytes per rank; allgather, reduce-scatter,
 * alltoall: n-1 and (n-1)/n; broadcast: log2 n and 1), the form the
 * planner's link figures take. */
typedef struct dt_link_fit {
    char transport[16]; /* "shm", "tcp", "shm+tcp", "mpi" */
    char op[24];        /* dt_coll_name: "allreduce", ... */
    int ranks;          /* group size it was measured on */
    double alpha;       /* seconds */
    double beta;        /* bytes per second */
    double link_alpha;  /* seconds per step of the ring model */
    double link_bw;     /* bytes per second of one link in the ring model */
    int points;         /* sizes fitted */
    double max_error;   /* largest |fit - measured| / measured over them */
    double lo, hi;      /* smallest and largest size fitted (bytes) */
} dt_link_fit;

/* Fit a model to n (bytes, seconds) points (n >= 2, two distinct sizes):
 * least squares of the relative error, alpha >= 0, beta > 0. Fills every
 * numeric field of *out (transport, op and ranks as given). */
dt_status dt_link_fit_points(const char *transport, const char *op, int ranks, const double *bytes,
                             const double *seconds, size_t n, dt_link_fit *out);
/* Store a fit for this machine (replacing the one of the same transport,
 * op and ranks). `where` (len bytes, may be NULL) gets the file's path. */
dt_status dt_profile_save_link(const dt_link_fit *f, char *where, size_t len);
/* This machine's fits: up to max into out[], *n the count stored. */
dt_status dt_profile_links(dt_link_fit *out, size_t max, size_t *n);
/* The fit for (transport, op, ranks): the stored one with that transport
 * and op and the nearest rank count; DT_ERR_NOT_FOUND without. */
dt_status dt_profile_link(const char *transport, const char *op, int ranks, dt_link_fit *out);
/* Memory bandwidth of `threads` concurrent copies (bytes read + written per
 * second: what the memory sustains), from the profile, else measured now
 * (about 0.1 s) and stored. `from` (may be NULL) says which. */
dt_status dt_profile_mem_bw(int threads, double *traffic, char *from, size_t len);
/* Store a measured bandwidth (dtrain bench memcpy). */
dt_status dt_profile_save_mem_bw(int threads, double traffic);

/* ------------------------------------------------------------------------ */
/* The training loop                                                        */
/* ------------------------------------------------------------------------ */

/* The configuration a checkpoint's "ident" section records (i64 each, in
 * this order) and a resuming run must match: "layers", "dim", "heads",
 * "seq", "vocab", "optimizer", "global batch", "accum", "seed". */
#define DT_TRAIN_IDENT_COUNT 9
extern const char *const dt_train_ident_names[DT_TRAIN_IDENT_COUNT];

/* Everything a run needs; `dtrain train` fills it from flags, env and
 * --config. Strings are borrowed. 0 / NULL means "not given" where noted. */
/* Top-k density at the first step of --compress-ramp (DGC's first stage). */
#define DT_TRAIN_RAMP_START 0.25

/* How the data-parallel replicas combine their work (docs/async.md). */
typedef enum dt_dp_mode {
    DT_DP_MODE_DDP,    /* average the gradients every step */
    DT_DP_MODE_LOCAL,  /* local SGD: average the parameters every H steps */
    DT_DP_MODE_GOSSIP, /* mix the parameters with a few peers */
    DT_DP_MODE_PS,     /* an asynchronous parameter server with bounded staleness */
    DT_DP_MODE_COUNT
} dt_dp_mode;
/* "ddp", "local", "gossip", "ps" (indexable by dt_dp_mode). */
extern const char *const dt_dp_mode_names[DT_DP_MODE_COUNT];

typedef struct dt_train_config {
    const char *model;           /* preset name ("tiny", "shakespeare-char", ...) */
    int layers, dim, heads;      /* override the preset when > 0 */
    int seq;                     /* T: sequence length; 0: the preset's max_seq */
    int vocab;                   /* 0: the data's vocabulary size */
    const char *data;            /* training text (.txt, tokenized on the fly) or .tok */
    const char *val_data;        /* validation file, or NULL to split off val_split */
    double val_split;            /* fraction of `data` held out for validation, [0, 1) */
    int tokenizer;               /* dt_tokenizer_kind for .txt files */
    const char *tokenizer_files; /* kind bpe: "gpt2" or a folder (dt_bpe_open) */
    int batch;                   /* B per rank (0: global_batch / world) */
    int global_batch;            /* world * B (0: batch * world); must divide by world */
    int accum;                   /* K micro-batches per optimizer step */
    int64_t steps;               /* optimizer steps of the whole run */
    dt_optim_kind optimizer;
    double lr, min_lr, weight_decay, momentum, clip;
    double beta1, beta2, eps; /* AdamW and the Adam family (RAdam, 8-bit, LAMB, 1-bit) */
    /* The other optimizers' hyper-parameters (docs/optim.md); defaults as
     * dt_optim_config_default(). 1-bit Adam/LAMB take their warm-up from
     * compress_start and compress with the codec (sign: 1 bit). */
    bool nesterov;                 /* SGD, LARS */
    double trust_coeff, trust_eps; /* LARS: eta and the denominator's epsilon */
    dt_adafactor_config adafactor; /* Adafactor */
    int quant_block;               /* 8-bit AdamW: values per quantisation block */
    dt_optim_kind lookahead_inner; /* Lookahead: the wrapped optimizer, k, alpha */
    int lookahead_k;
    double lookahead_alpha;
    dt_lbfgs_config lbfgs;    /* L-BFGS (max_eval 0: max_iter * 5 / 4) */
    bool grad_centralization; /* subtract each matrix row's mean from its gradient */
    dt_kfac_config kfac;      /* K-FAC (the linear layers; SGD momentum and decay as --momentum) */
    int schedule;             /* dt_schedule_kind */
    int64_t warmup;
    int64_t eval_every;   /* 0: only at the end */
    int eval_batches;     /* validation batches per evaluation */
    const char *ckpt_dir; /* NULL: no checkpoints */
    int64_t ckpt_every;   /* 0: only at the end */
    int keep;             /* checkpoints kept */
    bool resume;          /* continue from the newest good checkpoint, if any */
    int64_t stop_after;   /* stop (with a checkpoint) after this many steps of this run; 0: off */
    uint64_t seed;
    int threads;         /* per rank; 0: CPUs / ranks on this host */
    const char *run_dir; /* metrics.jsonl, config.json, model.dtgw; NULL: none */
    /* With run_dir NULL: rank 0 names a new run directory
     * "runs/<model>-<YYYYmmdd-HHMMSS>" (suffixed -2, -3, ... if taken), and
     * checkpoints go to RUN_DIR/ckpt unless ckpt_dir is given; with resume,
     * the newest such directory of the model that holds a checkpoint is
     * continued instead. The CLI's default (--no-save turns it off). */
    bool save_default;
    /* Start from these weights instead of a random initialisation: a
     * weights file, a checkpoint (file, folder or run folder), a Hugging
     * Face GPT-2 safetensors file or llm.c's gpt2_124M.bin
     * (dt_model_open). The model's shape comes from the file; NULL: none. */
    const char *init_from;
    size_t bucket_bytes; /* DDP bucket size; 0: a quarter of the gradient bytes, 1-25 MiB */
    int64_t check_every; /* hash-compare parameters across ranks every N steps; 0: off */
    double peak_gflops;  /* per rank, for MFU; 0: dt_peak_flops (measured once, cached) */
    int sample_tokens;   /* generated at the end; 0: none */
    int64_t log_every;   /* plain progress lines; 0: about 20 per run */
    int progress;        /* -1: auto (TTY), 0: plain lines, 1: live line */
    /* Mixed precision (docs/amp.md): compute type, activation recomputation
     * (dt_gpt_options.recompute_every), loss scaling (-1: auto = on for
     * fp16 only, 0: off, 1: on) and its schedule. */
    dt_precision precision;
    int recompute_every;
    int loss_scaling;
    dt_scaler_config scaler;
    /* Gradient communication (docs/compress.md): the dtype of the bucket
     * allreduce (DT_F32, DT_BF16 or DT_F16; sums accumulate in fp32), or a
     * codec with its error-feedback mode (codec none: plain allreduce). */
    dt_dtype grad_dtype;
    dt_codec_spec compress;
    dt_ef_mode compress_ef;
    /* Dense warm-up: the first compress_start steps average plain fp32
     * gradients; the codec (with zero residuals) takes over from step
     * compress_start + 1. 0: compress from the first step. */
    int64_t compress_start;
    /* AdamW's second moment frozen from step compress_start + 1 (1-bit
     * Adam's compression stage): the update becomes linear in the gradient,
     * so what error feedback delivers late moves the weights as much as if
     * it had come on time. Needs AdamW and compress_start > 0. */
    bool compress_freeze_v;
    /* Top-k density ramp (Deep Gradient Compression): for compress_ramp
     * steps after the dense warm-up, top-k keeps an exponentially falling
     * fraction, DT_TRAIN_RAMP_START (25%) down to the codec's own. Needs
     * topk:F. 0: off. */
    int64_t compress_ramp;
    /* Tensors of fewer values than this (biases, LayerNorm gains, small
     * embeddings) are averaged exactly, as fp32, whatever the codec
     * (dt_ddp_options.dense_below); with grad_dtype bf16/fp16 they stay
     * fp32. No effect on a plain fp32 allreduce. 0: off. */
    int64_t compress_dense_below;
    /* The layout (docs/parallel.md): degrees of the mesh axes (dp 0: the
     * ranks left over by tp x pp x cp), Megatron sequence parallelism with
     * tp, and the rank order of the axes (NULL: tp-cp-dp-pp). */
    int dp, tp, pp, cp;
    bool sp;
    /* Context parallelism's attention with cp > 1 (docs/context-parallel.md):
     * "ulysses", "ring" or "auto" (NULL: auto, Ulysses where the heads per
     * tp rank divide by cp). */
    const char *cp_mode;
    const char *mesh_order;
    /* The pipeline schedule with pp > 1 (docs/pipeline.md): "gpipe",
     * "1f1b", "interleaved:V" or "zb" (NULL: 1f1b); its micro-batches are
     * the step's `accum`. */
    const char *pp_schedule;
    /* ZeRO stage on the dp axis (docs/zero.md): 0 (DDP: everything
     * replicated), 1 (the optimizer state sharded), 2 (and the gradients),
     * 3 (and the parameters; fp32 only). */
    int zero;
    /* Where the optimizer state lives (docs/zero.md, "Offload"): NULL or
     * "optimizer=cpu" (memory), "optimizer=disk:DIR" (a file in DIR,
     * streamed through a window of memory). "params=disk:DIR" is not built
     * yet. */
    const char *offload;
    /* Data parallelism beyond synchronous gradient averaging (docs/async.md,
     * parallel.h "Beyond synchronous data parallelism"): DT_DP_MODE_DDP
     * (the default), DT_DP_MODE_LOCAL (local SGD: sync_every,
     * post_local_after, the outer optimizer, sync_optim_state) or
     * DT_DP_MODE_GOSSIP (gossip_topology, gossip_every) or DT_DP_MODE_PS
     * (ps_servers, staleness, delay_comp, dc_lambda). */
    dt_dp_mode dp_mode;
    int64_t sync_every;       /* H >= 1 (default 8) */
    int64_t post_local_after; /* synchronous steps first (default 0) */
    int outer;                /* dt_outer_kind (default sgd) */
    double outer_lr;          /* default 1 */
    double outer_momentum;    /* slowmo, nesterov (default 0.9) */
    bool sync_optim_state;    /* average the optimizer state with the parameters */
    int gossip_topology;      /* dt_gossip_topology (default ring) */
    int64_t gossip_every;     /* default 1 */
    int ps_servers;           /* shards, on ranks 0..K-1 (default 1) */
    int64_t staleness;        /* SSP bound S (default 4) */
    int delay_comp;           /* dt_delay_comp (default none) */
    double dc_lambda;         /* DC-ASGD's lambda (default 0.04) */
    /* Tracing (docs/observability.md): record every rank's timeline of
     * steps trace_first..trace_last (1-based; 0, 0: every step) into rings
     * of trace_buffer events per thread (0: 16384), written at the end as
     * RUN_DIR/trace/rank-R.json and the merged RUN_DIR/trace/trace.json
     * (Chrome trace / Perfetto JSON, the ranks' clocks aligned). Needs a
     * run directory. */
    bool trace;
    int64_t trace_first, trace_last;
    size_t trace_buffer;
    /* Polled once a step; non-zero on any rank stops every rank after that
     * step, with a checkpoint (the CLI sets it from SIGINT/SIGTERM). May be
     * NULL. dt_train_run then returns DT_ERR_ABORTED. Set from any thread
     * (the CLI's signal thread); the loop only reads it. */
    const atomic_int *stop;
} dt_train_config;

/* Defaults of `dtrain train`. */
void dt_train_config_init(dt_train_config *c);

/* What a run achieved (rank 0's view; losses are averaged over ranks). */
typedef struct dt_train_result {
    int64_t first_step, last_step;   /* steps run by this invocation: first..last */
    double first_loss, last_loss;    /* training loss of those steps */
    double val_loss;                 /* last validation loss, NaN if none */
    double tokens_per_s;             /* median over the steps after the first */
    double comm_ms, exposed_comm_ms; /* per step, medians */
    double tp_comm_ms;               /* per step, median; NaN without tp or cp */
    double cp_attention_ms;          /* per step, median; NaN without cp */
    double pp_bubble;                /* per step, median; NaN without a pipeline */
    double seconds;                  /* wall time of the loop */
    char checkpoint[4096];           /* last checkpoint written, "" if none */
} dt_train_result;

/* What one rank of a job holds, planned from the configuration by the code
 * that lays it out (the trainer builds exactly this): `dtrain plan memory`
 * and the trainer's header. grads is the resident peak (ZeRO 2 returns the
 * memory outside a replica's pieces as each bucket is reduced: its pieces
 * plus two buckets in flight). */
typedef struct dt_rank_memory {
    int world, rank;
    size_t params, grads, weights16, optimizer, activations;
    size_t optimizer_file; /* --offload optimizer=disk: the state's file (not in total) */
    size_t params_file;    /* --offload params (ZeRO 3): the pieces' file (not in total) */
    /* The communication buffers (transport segments, the gradient codec's
     * buffers and state, ZeRO 2's shard sum) and the kernels' workspace
     * (GEMM packing, attention scratch, the BLAS's buffers). */
    size_t comm, workspace;
    size_t comm_shm; /* of comm: the transports' shared-memory segments */
    /* Rank 0 at the end of a run whose model is split (tp, cp, pp) and
     * that writes a weights file or samples: the whole model's parameters,
     * one received part and, with a sample, its activations (not in total:
     * it comes after training, on top of it). */
    size_t assembly;
    size_t total;
    dt_memory_report model; /* the model part's own report */
} dt_rank_memory;

/* The model c trains, resolved as the run resolves it (the preset, the
 * flags that override it, the data's vocabulary or --init-from's model):
 * opens c->data to read its vocabulary and closes it again. For planning
 * before the run (`dtrain train --layout auto`). */
dt_status dt_train_model_config(const dt_train_config *c, dt_gpt_config *out);

/* Plan world rank `rank` of a job of `world` ranks training model mc under
 * c (its mesh, batch, pipeline, ZeRO stage, optimizer, precision,
 * recomputation). DT_ERR_INVALID for a layout the trainer would refuse. */
dt_status dt_train_plan_memory(const dt_train_config *c, const dt_gpt_config *mc, int world,
                               int rank, dt_rank_memory *out);
/* "params 1.2 MiB, grads ..., optimizer ..., activations ...: TOTAL" */
void dt_rank_memory_print(const dt_rank_memory *m, FILE *f);

/* Train as one rank of the job described by the environment (or alone when
 * there is none). Every rank calls it with the same config. Returns
 * DT_ERR_NUMERIC naming the step when the loss becomes NaN or infinite
 * (the last good checkpoint is kept), DT_ERR_INVALID / DT_ERR_MISMATCH for
 * bad input, and I/O, communication or checkpoint errors as they come. */
dt_status dt_train_run(const dt_train_config *c, dt_train_result *res);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TRAIN_H */
