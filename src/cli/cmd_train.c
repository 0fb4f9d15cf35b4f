/*
 * cmd_train.c — `dtrain train`: train a GPT data-parallel on a text file.
 *
 * Only argument handling lives here; the loop is src/train/train.c. With
 * --nproc N > 1 outside a job, the command relaunches itself as N ranks
 * (dt_launch_self) and each rank parses the same command line.
 */
#include "cli.h"
#include "dtrain/data.h"
#include "dtrain/launch.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/parallel.h"
#include "dtrain/plan.h"
#include "dtrain/train.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* dt_optim_names, in dt_optim_kind order. */
static const char *const optimizers[] = {
    "adamw",       "sgd",   "adafactor", "adamw8bit", "lamb", "lars", "onebit-adam",
    "onebit-lamb", "radam", "lookahead", "lbfgs",     "kfac", NULL};
_Static_assert(sizeof optimizers / sizeof optimizers[0] == DT_OPTIM_COUNT + 1,
               "one name per optimizer kind");
static const char *const on_off[] = {"on", "off", NULL};
static const char *const schedules[] = {"constant", "linear", "cosine", "invsqrt", NULL};
static const char *const progress_modes[] = {"auto", "plain", "live", NULL};
static const char *const precisions[] = {"fp32", "bf16", "fp16", NULL};
static const char *const grad_dtypes[] = {"fp32", "bf16", "fp16", NULL};
static const char *const on_off_auto[] = {"auto", "on", "off", NULL};
static const char *const layouts[] = {"manual", "auto", NULL};
/* In the order of dt_dp_mode, dt_outer_kind and dt_gossip_topology. */
static const char *const dp_modes[] = {"ddp", "local", "gossip", "ps", NULL};
static const char *const delay_comps[] = {"none", "seed", "dcasgd", NULL};
static const char *const outer_kinds[] = {"sgd", "slowmo", "nesterov", NULL};
static const char *const gossip_topologies[] = {"ring", "exp", "random", "hypercube", NULL};
_Static_assert(sizeof dp_modes / sizeof *dp_modes == DT_DP_MODE_COUNT + 1, "dp modes");
_Static_assert(sizeof delay_comps / sizeof *delay_comps == DT_DELAY_COMP_COUNT + 1, "delay comp");
_Static_assert(sizeof outer_kinds / sizeof *outer_kinds == DT_OUTER_COUNT + 1, "outer kinds");
_Static_assert(sizeof gossip_topologies / sizeof *gossip_topologies == DT_GOSSIP_COUNT + 1,
               "gossip topologies");

/* clang-format off */
static const cli_opt train_opts[] = {
    {"config", 'c', CLI_STRING, "FILE", NULL, "DT_CONFIG", "read defaults from 'key = value' lines or JSON (a run's config.json); keys: these long option names", NULL, 0, 0},
    {"model", 'm', CLI_STRING, "PRESET", "tiny", "DT_MODEL", "model preset: tiny, shakespeare-char, gpt2-124m, gpt2-350m", NULL, 0, 0},
    {"layers", 0, CLI_INT, "L", "0", "DT_LAYERS", "transformer blocks (0: the preset's)", NULL, 0, 1024},
    {"dim", 0, CLI_INT, "C", "0", "DT_DIM", "channels (0: the preset's)", NULL, 0, 65536},
    {"heads", 0, CLI_INT, "NH", "0", "DT_HEADS", "attention heads (0: the preset's)", NULL, 0, 4096},
    {"seq", 's', CLI_INT, "T", "0", "DT_SEQ", "sequence length (0: the preset's)", NULL, 0, 1 << 20},
    {"vocab", 0, CLI_INT, "V", "0", "DT_VOCAB", "vocabulary size (0: the data's)", NULL, 0, 1 << 24},
    {"data", 0, CLI_STRING, "FILE", NULL, "DT_DATA", "training text (.txt, tokenized on the fly) or token file (.tok)", NULL, 0, 0},
    {"val-data", 0, CLI_STRING, "FILE", NULL, "DT_VAL_DATA", "validation file (default: split off --data)", NULL, 0, 0},
    {"val-split", 0, CLI_DOUBLE, "F", "0.05", "DT_VAL_SPLIT", "fraction of --data held out for validation (0: none)", NULL, 0, 0.99},
    {"tokenizer", 0, CLI_STRING, "KIND", "char", "DT_TOKENIZER", "tokenizer for .txt data: char, byte, gpt2 (GPT-2's BPE, V=50257) or a folder with encoder.json and vocab.bpe", NULL, 0, 0},
    {"nproc", 'n', CLI_INT, "N", "1", "DT_NPROC", "ranks to start on this machine", NULL, 1, 4096},
    {"batch", 'b', CLI_INT, "B", "8", "DT_BATCH", "sequences per rank per micro-batch (with --global-batch: G / ranks)", NULL, 1, 1 << 20},
    {"global-batch", 0, CLI_INT, "G", "0", "DT_GLOBAL_BATCH", "sequences per micro-batch over all ranks; must divide by the ranks", NULL, 0, 1 << 24},
    {"steps", 0, CLI_INT, "S", "100", "DT_STEPS", "optimizer steps of the whole run", NULL, 1, 1e15},
    {"accum", 0, CLI_INT, "K", "1", "DT_ACCUM", "micro-batches accumulated per optimizer step", NULL, 1, 1 << 20},
    {"optimizer", 0, CLI_ENUM, "NAME", "adamw", "DT_OPTIMIZER", "optimizer", optimizers, 0, 0},
    {"lr", 0, CLI_DOUBLE, "X", "1e-3", "DT_LR", "peak learning rate", NULL, 1e-12, 1e6},
    {"min-lr", 0, CLI_DOUBLE, "X", "0", "DT_MIN_LR", "floor of the decay", NULL, 0, 100},
    {"weight-decay", 0, CLI_DOUBLE, "X", "0.1", "DT_WEIGHT_DECAY", "decoupled weight decay (matrices only)", NULL, 0, 10},
    {"momentum", 0, CLI_DOUBLE, "X", "0.9", "DT_MOMENTUM", "SGD, LARS and K-FAC momentum", NULL, 0, 0.9999},
    {"nesterov", 0, CLI_FLAG, NULL, NULL, "DT_NESTEROV", "Nesterov momentum (SGD, LARS)", NULL, 0, 0},
    {"beta1", 0, CLI_DOUBLE, "X", "0.9", "DT_BETA1", "first-moment decay (AdamW, RAdam, adamw8bit, LAMB, 1-bit)", NULL, 0, 0.99999},
    {"beta2", 0, CLI_DOUBLE, "X", "0.95", "DT_BETA2", "second-moment decay (AdamW, RAdam, adamw8bit, LAMB, 1-bit)", NULL, 0, 0.99999},
    {"eps", 0, CLI_DOUBLE, "X", "1e-8", "DT_EPS", "epsilon of the Adam family", NULL, 1e-30, 1},
    {"trust-coeff", 0, CLI_DOUBLE, "X", "0.001", "DT_TRUST_COEFF", "LARS trust coefficient (eta)", NULL, 1e-12, 1e6},
    {"trust-eps", 0, CLI_DOUBLE, "X", "1e-8", "DT_TRUST_EPS", "LARS: added to the trust ratio's denominator", NULL, 0, 1},
    {"adafactor-beta1", 0, CLI_DOUBLE, "X", "0", "DT_ADAFACTOR_BETA1", "Adafactor first moment of the update (0: none, no state)", NULL, 0, 0.99999},
    {"adafactor-decay", 0, CLI_DOUBLE, "X", "-0.8", "DT_ADAFACTOR_DECAY", "Adafactor: beta2 at step t is 1 - t^X", NULL, -1, -1e-6},
    {"adafactor-eps1", 0, CLI_DOUBLE, "X", "1e-30", "DT_ADAFACTOR_EPS1", "Adafactor: added to g^2", NULL, 1e-38, 1},
    {"adafactor-eps2", 0, CLI_DOUBLE, "X", "1e-3", "DT_ADAFACTOR_EPS2", "Adafactor: floor of the parameter scale RMS(p)", NULL, 1e-38, 1},
    {"adafactor-clip", 0, CLI_DOUBLE, "X", "1.0", "DT_ADAFACTOR_CLIP", "Adafactor: the update is scaled down to RMS <= X", NULL, 1e-6, 1e6},
    {"adafactor-relative-step", 0, CLI_ENUM, "MODE", "on", "DT_ADAFACTOR_RELATIVE_STEP", "Adafactor step size min(1e-2, 1/sqrt(t)) (off: the --lr schedule)", on_off, 0, 0},
    {"adafactor-scale-parameter", 0, CLI_ENUM, "MODE", "on", "DT_ADAFACTOR_SCALE_PARAMETER", "Adafactor: multiply the step size by max(eps2, RMS(p))", on_off, 0, 0},
    {"adafactor-warmup-init", 0, CLI_FLAG, NULL, NULL, "DT_ADAFACTOR_WARMUP_INIT", "Adafactor relative step min(1e-6 t, 1/sqrt(t))", NULL, 0, 0},
    {"adamw8bit-block", 0, CLI_INT, "N", "2048", "DT_ADAMW8BIT_BLOCK", "8-bit AdamW: values per quantisation block (a multiple of 16)", NULL, 16, 4096},
    {"lookahead-inner", 0, CLI_ENUM, "NAME", "adamw", "DT_LOOKAHEAD_INNER", "the optimizer Lookahead wraps (not lookahead, lbfgs, kfac or the 1-bit kinds)", optimizers, 0, 0},
    {"lookahead-k", 0, CLI_INT, "K", "5", "DT_LOOKAHEAD_K", "Lookahead: fast steps per slow step", NULL, 1, 1e6},
    {"lookahead-alpha", 0, CLI_DOUBLE, "X", "0.5", "DT_LOOKAHEAD_ALPHA", "Lookahead: slow step size", NULL, 1e-6, 1},
    {"lbfgs-history", 0, CLI_INT, "M", "10", "DT_LBFGS_HISTORY", "L-BFGS: (s, y) pairs kept", NULL, 1, 16},
    {"lbfgs-max-iter", 0, CLI_INT, "N", "20", "DT_LBFGS_MAX_ITER", "L-BFGS: iterations per step", NULL, 1, 1e6},
    {"lbfgs-max-eval", 0, CLI_INT, "N", "0", "DT_LBFGS_MAX_EVAL", "L-BFGS: loss evaluations per step (0: max-iter * 5/4)", NULL, 0, 1e6},
    {"lbfgs-tolerance-grad", 0, CLI_DOUBLE, "X", "1e-7", "DT_LBFGS_TOLERANCE_GRAD", "L-BFGS: stop when max |g| <= X", NULL, 0, 1e6},
    {"lbfgs-tolerance-change", 0, CLI_DOUBLE, "X", "1e-9", "DT_LBFGS_TOLERANCE_CHANGE", "L-BFGS: stop when a step or loss change is below X", NULL, 0, 1e6},
    {"lbfgs-line-search", 0, CLI_ENUM, "MODE", "on", "DT_LBFGS_LINE_SEARCH", "L-BFGS strong-Wolfe line search (off: fixed steps of --lr)", on_off, 0, 0},
    {"kfac-damping", 0, CLI_DOUBLE, "X", "1e-3", "DT_KFAC_DAMPING", "K-FAC: Tikhonov damping, split between the factors", NULL, 1e-12, 1e6},
    {"kfac-inv-every", 0, CLI_INT, "N", "10", "DT_KFAC_INV_EVERY", "K-FAC: steps between inverse computations", NULL, 1, 1e6},
    {"kfac-ema", 0, CLI_DOUBLE, "X", "0.95", "DT_KFAC_EMA", "K-FAC: running-average decay of the factors", NULL, 0, 0.99999},
    {"kfac-kl-clip", 0, CLI_DOUBLE, "X", "1e-3", "DT_KFAC_KL_CLIP", "K-FAC: bound on lr^2 <update, gradient> (scales the preconditioned step)", NULL, 1e-12, 1e6},
    {"grad-centralization", 0, CLI_FLAG, NULL, NULL, "DT_GRAD_CENTRALIZATION", "subtract each matrix row's mean from its gradient (with any optimizer)", NULL, 0, 0},
    {"schedule", 0, CLI_ENUM, "KIND", "cosine", "DT_SCHEDULE", "learning-rate schedule after warmup", schedules, 0, 0},
    {"warmup", 0, CLI_INT, "W", "0", "DT_WARMUP", "steps of linear warmup", NULL, 0, 1e15},
    {"clip", 0, CLI_DOUBLE, "C", "1.0", "DT_CLIP", "clip the global gradient norm to C (0: off)", NULL, 0, 1e9},
    {"eval-every", 0, CLI_INT, "E", "0", "DT_EVAL_EVERY", "validate every E steps (0: only at the end)", NULL, 0, 1e15},
    {"eval-batches", 0, CLI_INT, "N", "8", "DT_EVAL_BATCHES", "validation batches per evaluation", NULL, 1, 1 << 20},
    {"ckpt-dir", 0, CLI_STRING, "DIR", NULL, "DT_CKPT_DIR", "write checkpoints here (none if unset)", NULL, 0, 0},
    {"ckpt-every", 0, CLI_INT, "N", "0", "DT_CKPT_EVERY", "checkpoint every N steps (0: only at the end)", NULL, 0, 1e15},
    {"keep", 0, CLI_INT, "K", "3", "DT_KEEP", "checkpoints kept in --ckpt-dir", NULL, 1, 1000000},
    {"resume", 0, CLI_FLAG, NULL, NULL, "DT_RESUME", "continue from the newest good checkpoint in --ckpt-dir, if any", NULL, 0, 0},
    {"stop-after", 0, CLI_INT, "N", "0", "DT_STOP_AFTER", "stop with a checkpoint after N steps of this invocation (0: off)", NULL, 0, 1e15},
    {"seed", 0, CLI_INT, "X", "1337", "DT_SEED", "seed of initialisation, data order and sampling", NULL, 0, 9.2e18},
    {"deterministic", 0, CLI_FLAG, NULL, NULL, "DT_DETERMINISTIC", "rank-ordered gradient reductions: the same bits on every algorithm, transport and host layout (docs/comm.md)", NULL, 0, 0},
    {"threads", 't', CLI_INT, "K", "0", "DT_THREADS", "threads per rank (0: OMP_NUM_THREADS, else CPUs / ranks on this machine)", NULL, 0, 1024},
    {"run-dir", 0, CLI_STRING, "DIR", NULL, "DT_RUN_DIR", "write config.json, metrics.jsonl, model.dtgw and ckpt/ here (default: runs/MODEL-YYYYmmdd-HHMMSS)", NULL, 0, 0},
    {"no-save", 0, CLI_FLAG, NULL, NULL, "DT_NO_SAVE", "write no run directory and no checkpoint unless --run-dir / --ckpt-dir ask for one", NULL, 0, 0},
    {"init-from", 0, CLI_STRING, "PATH", NULL, "DT_INIT_FROM", "start from these weights: a .dtgw, a checkpoint, a run folder, a GPT-2 .safetensors or llm.c .bin (the shape comes from the file)", NULL, 0, 0},
    {"bucket-size", 0, CLI_SIZE, "SIZE", "0", "DT_BUCKET_SIZE", "gradient bucket size for the overlapped allreduce (0: a quarter of the gradient bytes, 1M-25M)", NULL, 0, 1e12},
    {"check-every", 0, CLI_INT, "N", "0", "DT_CHECK_EVERY", "compare parameter hashes across ranks every N steps (0: off; 50 with DT_LOG=debug)", NULL, 0, 1e15},
    {"peak-flops", 0, CLI_DOUBLE, "X", "0", "DT_PEAK_FLOPS", "per-rank peak FLOP/s for MFU (0: this machine's, measured once and cached; dtrain bench peak)", NULL, 0, 1e18},
    {"sample-tokens", 0, CLI_INT, "N", "256", "DT_SAMPLE_TOKENS", "tokens generated at the end (0: none)", NULL, 0, 1 << 20},
    {"log-every", 0, CLI_INT, "N", "0", "DT_LOG_EVERY", "plain progress line every N steps (0: about 20 per run)", NULL, 0, 1e15},
    {"progress", 0, CLI_ENUM, "MODE", "auto", "DT_PROGRESS", "live line on a terminal, plain lines otherwise", progress_modes, 0, 0},
    {"precision", 0, CLI_ENUM, "TYPE", "fp32", "DT_PRECISION", "compute type (master weights, grads and optimizer stay fp32)", precisions, 0, 0},
    {"recompute", 0, CLI_STRING, "MODE", "none", "DT_RECOMPUTE", "activation recomputation: none, blocks, every:K", NULL, 0, 0},
    {"loss-scaling", 0, CLI_ENUM, "MODE", "auto", "DT_LOSS_SCALING", "dynamic loss scaling (auto: on for fp16 only)", on_off_auto, 0, 0},
    {"loss-scale-init", 0, CLI_DOUBLE, "X", "65536", "DT_LOSS_SCALE_INIT", "initial loss scale", NULL, 1e-30, 1e38},
    {"loss-scale-growth", 0, CLI_DOUBLE, "X", "2", "DT_LOSS_SCALE_GROWTH", "scale multiplier after --loss-scale-interval clean steps", NULL, 1.000001, 1e6},
    {"loss-scale-backoff", 0, CLI_DOUBLE, "X", "0.5", "DT_LOSS_SCALE_BACKOFF", "scale multiplier after an overflow", NULL, 1e-6, 0.999999},
    {"loss-scale-interval", 0, CLI_INT, "N", "2000", "DT_LOSS_SCALE_INTERVAL", "clean steps before the scale grows", NULL, 1, 1e15},
    {"isa", 0, CLI_STRING, "LEVEL", NULL, "DT_ISA", "cap the kernels' instruction set: scalar, avx2, avx512, avx512bf16, amx (default: the CPU's best)", NULL, 0, 0},
    {"grad-dtype", 0, CLI_ENUM, "TYPE", "fp32", "DT_GRAD_DTYPE", "dtype of the gradient allreduce (sums accumulate in fp32)", grad_dtypes, 0, 0},
    {"compress", 0, CLI_STRING, "CODEC", "none", "DT_COMPRESS", "gradient codec: none, fp16, bf16, int8, qsgd:BITS, sign, topk:F, randk:F, powersgd:RANK", NULL, 0, 0},
    {"compress-ef", 0, CLI_STRING, "MODE", "auto", "DT_COMPRESS_EF", "error feedback: auto (on for sign, topk, randk, powersgd), on, off", NULL, 0, 0},
    {"compress-freeze-v", 0, CLI_FLAG, NULL, NULL, "DT_COMPRESS_FREEZE_V", "freeze AdamW's second moment when compression starts (1-bit Adam)", NULL, 0, 0},
    {"compress-start", 0, CLI_INT, "N", "0", "DT_COMPRESS_START", "dense warm-up: the first N steps send uncompressed fp32 gradients", NULL, 0, 1e15},
    {"compress-ramp", 0, CLI_INT, "N", "0", "DT_COMPRESS_RAMP", "topk density ramp: the N steps after the warm-up keep 25% falling exponentially to F", NULL, 0, 1e15},
    {"tp", 0, CLI_INT, "N", "1", "DT_TP", "tensor-parallel degree: heads, MLP and vocabulary split over N ranks (Megatron)", NULL, 1, 4096},
    {"sp", 0, CLI_FLAG, NULL, NULL, "DT_SP", "sequence parallelism with --tp: LayerNorm, residual and their activations on 1/tp of the tokens", NULL, 0, 0},
    {"pp", 0, CLI_INT, "N", "1", "DT_PP", "pipeline-parallel degree: the layers split into N stages", NULL, 1, 4096},
    {"pp-schedule", 0, CLI_STRING, "KIND", "1f1b", "DT_PP_SCHEDULE", "pipeline schedule: gpipe, 1f1b, interleaved:V or zb (dtrain plan pipeline draws it)", NULL, 0, 0},
    {"zero", 0, CLI_INT, "S", "0", "DT_ZERO", "ZeRO stage on the dp axis: 0 (replicated), 1 (optimizer state sharded), 2 (and gradients), 3 (and parameters; gathered in 16 bits under bf16/fp16)", NULL, 0, 3},
    {"offload", 0, CLI_STRING, "WHAT", NULL, "DT_OFFLOAD", "where the optimizer state and (zero 3) the parameter pieces live, comma-separated: optimizer=disk:DIR (a file in DIR, streamed through memory; every optimizer but kfac and lbfgs), optimizer=cpu (memory), params=disk:DIR or params=direct:DIR (O_DIRECT)", NULL, 0, 0},
    {"micro-batches", 0, CLI_INT, "M", "1", "DT_MICRO_BATCHES", "micro-batches per optimizer step (the same as --accum)", NULL, 1, 1 << 20},
    {"cp", 0, CLI_INT, "N", "1", "DT_CP", "context-parallel degree: every rank of a cp group holds 1/cp of each sequence", NULL, 1, 4096},
    {"cp-mode", 0, CLI_STRING, "MODE", "auto", "DT_CP_MODE", "context parallelism's attention: ulysses (all-to-all by heads), ring (keys and values around the ring, zig-zag chunks) or auto", NULL, 0, 0},
    {"layout", 0, CLI_ENUM, "MODE", "manual", "DT_LAYOUT", "auto: the planner chooses dp x tp x pp x cp, micro-batches, ZeRO and recomputation for --nproc ranks and the samples per step the flags give (layout flags given by hand stay fixed; docs/planner.md)", layouts, 0, 0},
    {"cluster", 0, CLI_STRING, "FILE", "this", "DT_CLUSTER", "--layout auto plans for this cluster file (docs/planner.md), or 'this': this machine, measured (a few seconds)", NULL, 0, 0},
    {"dp", 0, CLI_INT, "N", "0", "DT_DP", "data-parallel degree (0: ranks / (tp x pp x cp))", NULL, 0, 1 << 20},
    {"mesh-order", 0, CLI_STRING, "ORDER", "tp-cp-dp-pp", "DT_MESH_ORDER", "rank order of the mesh axes, fastest-varying first", NULL, 0, 0},
    {"dp-mode", 0, CLI_ENUM, "MODE", "ddp", "DT_DP_MODE", "how replicas combine their work: ddp (average gradients every step), local (local SGD: average parameters every --sync-every steps), gossip (mix parameters with a few peers), ps (asynchronous parameter server); docs/async.md", dp_modes, 0, 0},
    {"sync-every", 0, CLI_INT, "H", "8", "DT_SYNC_EVERY", "--dp-mode local: local steps between parameter averages (1 with plain averaging: DDP)", NULL, 1, 1e15},
    {"post-local-after", 0, CLI_INT, "N", "0", "DT_POST_LOCAL_AFTER", "--dp-mode local: the first N steps average gradients (post-local SGD)", NULL, 0, 1e15},
    {"outer", 0, CLI_ENUM, "KIND", "sgd", "DT_OUTER", "--dp-mode local: outer optimizer on the averaged delta: sgd, slowmo, nesterov (DiLoCo)", outer_kinds, 0, 0},
    {"outer-lr", 0, CLI_DOUBLE, "X", "1", "DT_OUTER_LR", "--dp-mode local: outer learning rate (sgd 1: plain averaging)", NULL, 1e-6, 100},
    {"outer-momentum", 0, CLI_DOUBLE, "X", "0.9", "DT_OUTER_MOMENTUM", "--dp-mode local: outer momentum of slowmo and nesterov", NULL, 0, 0.999999},
    {"sync-optim-state", 0, CLI_FLAG, NULL, NULL, "DT_SYNC_OPTIM_STATE", "--dp-mode local: average the optimizer state with the parameters", NULL, 0, 0},
    {"gossip-topology", 0, CLI_ENUM, "KIND", "ring", "DT_GOSSIP_TOPOLOGY", "--dp-mode gossip: peers of each round: ring, exp (2^k apart), random (a matching per round), hypercube (exact average, log2 N rounds)", gossip_topologies, 0, 0},
    {"gossip-every", 0, CLI_INT, "K", "1", "DT_GOSSIP_EVERY", "--dp-mode gossip: mix parameters after every K-th step", NULL, 1, 1e15},
    {"ps-servers", 0, CLI_INT, "K", "1", "DT_PS_SERVERS", "--dp-mode ps: parameter shards, served by ranks 0..K-1 (threads beside their workers)", NULL, 1, 64},
    {"staleness", 0, CLI_INT, "S", "4", "DT_STALENESS", "--dp-mode ps: SSP bound, a worker more than S steps ahead of the slowest waits", NULL, 0, 62},
    {"delay-comp", 0, CLI_ENUM, "KIND", "none", "DT_DELAY_COMP", "--dp-mode ps: delay compensation: none, seed (g / (1 + tau)), dcasgd (g + lambda g*g*(w - w_read))", delay_comps, 0, 0},
    {"dc-lambda", 0, CLI_DOUBLE, "X", "0.04", "DT_DC_LAMBDA", "--dp-mode ps --delay-comp dcasgd: lambda", NULL, 0, 100},
    {"compress-dense-below", 0, CLI_INT, "N", "0", "DT_COMPRESS_DENSE_BELOW", "tensors of fewer than N values (biases, LayerNorm) are averaged exactly (fp32)", NULL, 0, 1e15},
    {"trace", 0, CLI_FLAG, NULL, NULL, "DT_TRACE", "record every rank's timeline (kernels, collectives, waits, data, optimizer) into RUN_DIR/trace/ (Perfetto / chrome://tracing; dtrain report)", NULL, 0, 0},
    {"trace-steps", 0, CLI_STRING, "A:B", "all", "DT_TRACE_STEPS", "--trace: record steps A to B (1-based), or all", NULL, 0, 0},
    {"trace-buffer", 0, CLI_INT, "N", "16384", "DT_TRACE_BUFFER", "--trace: events kept per thread (64 bytes each; the newest are kept)", NULL, 64, 1 << 26},
    {0},
};
/* clang-format on */

static const char train_description[] =
    "Trains a GPT on a text file over --nproc ranks (or the ranks of the job started by\n"
    "`dtrain launch` / mpirun), laid out as a mesh of data-parallel replicas (--dp) of\n"
    "tensor-parallel shards (--tp, with --sp for sequence parallelism). Gradients are\n"
    "averaged with bucketed allreduces that overlap backward. Checkpoints are written\n"
    "atomically, each rank its own shards, and --resume continues bit-identically, also\n"
    "in another layout. Every run is saved in a run directory (config.json, which\n"
    "--config reads back; metrics.jsonl; model.dtgw; ckpt/), by default\n"
    "runs/MODEL-YYYYmmdd-HHMMSS; --no-save writes nothing. See docs/train.md and\n"
    "docs/parallel.md.\n"
    "Example:\n"
    "  dtrain train --model shakespeare-char --data input.txt --nproc 2 --batch 8 \\\n"
    "               --steps 500 --warmup 50 --eval-every 100 --ckpt-every 100 --run-dir run\n"
    "  dtrain train --config run/config.json --run-dir run --resume --steps 1000";

/* --trace-steps: "all" (0, 0) or "A:B" with 1 <= A <= B. */
static dt_status parse_trace_steps(const char *text, int64_t *first, int64_t *last) {
    *first = *last = 0;
    if (!text || !strcmp(text, "all"))
        return DT_OK;
    char a[64];
    const char *colon = strchr(text, ':');
    if (!colon || (size_t)(colon - text) >= sizeof a)
        return dt_error_set(DT_ERR_INVALID, "--trace-steps: \"%s\" is not A:B or all", text);
    snprintf(a, sizeof a, "%.*s", (int)(colon - text), text);
    DT_CHECK(dt_config_parse_int("--trace-steps", a, 1, INT64_MAX, first));
    DT_CHECK(dt_config_parse_int("--trace-steps", colon + 1, *first, INT64_MAX, last));
    return DT_OK;
}

/* SIGINT/SIGTERM (also forwarded by a launcher) ask the run to finish its
 * step, save a checkpoint and stop; a second one ends the process at once.
 * They are blocked in this thread and in every thread it starts, and taken
 * by one thread waiting in sigwait(), so they never interrupt the compute
 * threads. Threads that a library started before main (OpenBLAS's pool)
 * still accept them: the handler below is what runs there. (With only an
 * asynchronous handler, test_sigint_saves aborted about once in 60 runs
 * under load, glibc heap corruption detected inside oneDNN's sgemm the step
 * after the signal; not seen since.) */
static atomic_int stop_signal; /* the signal that asked to stop, or 0 */
static sigset_t stop_signals;

/* The first stop signal is recorded; a second gets its default action
 * (ends the process), raised here and delivered as soon as the signal is
 * not blocked in this thread: when the handler returns, or in the waiting
 * thread once it unblocks it. Returns whether it was the second. */
static bool stop_requested(int sig) {
    if (!atomic_load(&stop_signal)) {
        atomic_store(&stop_signal, sig);
        return false;
    }
    signal(sig, SIG_DFL);
    raise(sig);
    return true;
}

static void on_stop_signal(int sig) { (void)stop_requested(sig); }

static void *stop_signal_main(void *arg) {
    (void)arg;
    for (;;) {
        int sig;
        if (sigwait(&stop_signals, &sig) == 0 && stop_requested(sig))
            pthread_sigmask(SIG_UNBLOCK, &stop_signals, NULL);
    }
    return NULL;
}

static void catch_stop_signals(void) {
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    /* A handler also replaces SIG_IGN, which a shell gives SIGINT in
     * background jobs: an ignored signal is discarded, never waited for. */
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    static dt_thread *thread; /* lives until the process exits, never joined */
    if (dt_thread_create(&thread, "dt-signals", stop_signal_main, NULL) != DT_OK) {
        pthread_sigmask(SIG_UNBLOCK, &stop_signals, NULL); /* the handler alone, then */
        DT_WARN("%s; stop signals are taken by a handler", dt_last_error());
    }
}

/* --nproc N outside a job: start N ranks of this command line, plus the
 * layout chosen here for --layout auto (as flags, which win over the
 * user's: cli args keep the last value). */
static int launch_ranks(cli_args *a, int nproc, const char *layout_args) {
    char extra[512];
    snprintf(extra, sizeof extra, "%s", layout_args ? layout_args : "");
    char *words[64];
    int nw = 0;
    for (char *w = strtok(extra, " "); w && nw < 62; w = strtok(NULL, " "))
        words[nw++] = w;
    if (layout_args) {
        words[nw++] = "--layout";
        words[nw++] = "manual";
    }
    /* dt_launch_self drops argv[0]: give it "dtrain train ARGS...". */
    char **argv = calloc((size_t)a->raw_argc + (size_t)nw + 2, sizeof *argv);
    if (!argv)
        return cli_fail(DT_ERR_NOMEM);
    argv[0] = "dtrain";
    for (int i = 0; i < a->raw_argc; i++)
        argv[i + 1] = a->raw_argv[i];
    for (int i = 0; i < nw; i++)
        argv[a->raw_argc + 1 + i] = words[i];
    /* The ranks' stderr is a pipe: tell rank 0 a terminal is watching,
     * so it draws the live progress line there (see train.c). */
    if (isatty(STDERR_FILENO) && !getenv("DT_PROGRESS"))
        setenv("DT_PROGRESS", "live", 1);
    dt_launch_options o;
    dt_launch_options_init(&o);
    o.nproc = nproc;
    int code = 1;
    dt_status st = dt_launch_self(&o, a->raw_argc + 1 + nw, argv, "--nproc", &code);
    free(argv);
    if (st != DT_OK)
        fprintf(stderr, "dtrain train: error: %s\n", dt_last_error());
    return code;
}

static int run_train(cli_args *a) {
    if (a->argc > 0)
        cli_usage_error(a->cmd, "unexpected argument '%s'", a->argv[0]);
    if (cli_bool(a, "deterministic")) /* comm reads it when the groups are made */
        setenv("DT_DETERMINISTIC", "1", 1);
    dt_train_config c;
    dt_train_config_init(&c);
    c.model = cli_str(a, "model");
    c.layers = (int)cli_int(a, "layers");
    c.dim = (int)cli_int(a, "dim");
    c.heads = (int)cli_int(a, "heads");
    c.seq = (int)cli_int(a, "seq");
    c.vocab = (int)cli_int(a, "vocab");
    c.data = cli_str(a, "data");
    c.val_data = cli_str(a, "val-data");
    c.val_split = cli_double(a, "val-split");
    const char *tk = cli_str(a, "tokenizer");
    c.tokenizer = strcmp(tk, "char") == 0   ? DT_TOKENIZER_CHAR
                  : strcmp(tk, "byte") == 0 ? DT_TOKENIZER_BYTE
                                            : DT_TOKENIZER_BPE;
    if (c.tokenizer == DT_TOKENIZER_BPE)
        c.tokenizer_files = tk;
    c.global_batch = (int)cli_int(a, "global-batch");
    /* The default batch yields to --global-batch; a given one must agree. */
    c.batch = c.global_batch && !cli_is_set(a, "batch") ? 0 : (int)cli_int(a, "batch");
    c.steps = cli_int(a, "steps");
    c.accum = (int)cli_int(a, "accum");
    c.optimizer = (dt_optim_kind)cli_enum(a, "optimizer");
    c.lr = cli_double(a, "lr");
    c.min_lr = cli_double(a, "min-lr");
    c.weight_decay = cli_double(a, "weight-decay");
    c.momentum = cli_double(a, "momentum");
    c.nesterov = cli_bool(a, "nesterov");
    c.beta1 = cli_double(a, "beta1");
    c.beta2 = cli_double(a, "beta2");
    c.eps = cli_double(a, "eps");
    c.trust_coeff = cli_double(a, "trust-coeff");
    c.trust_eps = cli_double(a, "trust-eps");
    c.adafactor.beta1 = (float)cli_double(a, "adafactor-beta1");
    c.adafactor.decay_rate = (float)cli_double(a, "adafactor-decay");
    c.adafactor.eps1 = (float)cli_double(a, "adafactor-eps1");
    c.adafactor.eps2 = (float)cli_double(a, "adafactor-eps2");
    c.adafactor.clip_threshold = (float)cli_double(a, "adafactor-clip");
    c.adafactor.relative_step = cli_enum(a, "adafactor-relative-step") == 0;
    c.adafactor.scale_parameter = cli_enum(a, "adafactor-scale-parameter") == 0;
    c.adafactor.warmup_init = cli_bool(a, "adafactor-warmup-init");
    c.quant_block = (int)cli_int(a, "adamw8bit-block");
    c.lookahead_inner = (dt_optim_kind)cli_enum(a, "lookahead-inner");
    c.lookahead_k = (int)cli_int(a, "lookahead-k");
    c.lookahead_alpha = cli_double(a, "lookahead-alpha");
    c.lbfgs.history = (int)cli_int(a, "lbfgs-history");
    c.lbfgs.max_iter = (int)cli_int(a, "lbfgs-max-iter");
    c.lbfgs.max_eval = (int)cli_int(a, "lbfgs-max-eval");
    c.lbfgs.tolerance_grad = (float)cli_double(a, "lbfgs-tolerance-grad");
    c.lbfgs.tolerance_change = (float)cli_double(a, "lbfgs-tolerance-change");
    c.lbfgs.line_search = cli_enum(a, "lbfgs-line-search") == 0;
    c.grad_centralization = cli_bool(a, "grad-centralization");
    c.kfac.damping = cli_double(a, "kfac-damping");
    c.kfac.inv_every = (int)cli_int(a, "kfac-inv-every");
    c.kfac.ema = cli_double(a, "kfac-ema");
    c.kfac.kl_clip = cli_double(a, "kfac-kl-clip");
    c.schedule = cli_enum(a, "schedule");
    c.warmup = cli_int(a, "warmup");
    c.clip = cli_double(a, "clip");
    c.eval_every = cli_int(a, "eval-every");
    c.eval_batches = (int)cli_int(a, "eval-batches");
    c.ckpt_dir = cli_str(a, "ckpt-dir");
    c.ckpt_every = cli_int(a, "ckpt-every");
    c.keep = (int)cli_int(a, "keep");
    c.resume = cli_bool(a, "resume");
    c.stop_after = cli_int(a, "stop-after");
    c.seed = (uint64_t)cli_int(a, "seed");
    c.threads = (int)cli_int(a, "threads");
    c.run_dir = cli_str(a, "run-dir");
    c.save_default = !cli_bool(a, "no-save");
    c.init_from = cli_str(a, "init-from");
    c.bucket_bytes = cli_size(a, "bucket-size");
    c.check_every = cli_int(a, "check-every");
    c.peak_gflops = cli_double(a, "peak-flops") * 1e-9;
    c.sample_tokens = (int)cli_int(a, "sample-tokens");
    c.log_every = cli_int(a, "log-every");
    int pm = cli_enum(a, "progress");
    c.progress = pm == 0 ? -1 : pm == 2;
    c.precision = (dt_precision)cli_enum(a, "precision");
    if (dt_recompute_parse("--recompute", cli_str(a, "recompute"), &c.recompute_every) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    const char *isa = cli_str(a, "isa");
    if (isa && *isa) {
        dt_isa_level level;
        if (dt_isa_parse("--isa", isa, &level) != DT_OK || dt_isa_set(level) != DT_OK)
            cli_usage_error(a->cmd, "%s", dt_last_error());
    }
    int ls = cli_enum(a, "loss-scaling");
    c.loss_scaling = ls == 0 ? -1 : ls == 1;
    c.scaler.init_scale = cli_double(a, "loss-scale-init");
    c.scaler.growth_factor = cli_double(a, "loss-scale-growth");
    c.scaler.backoff_factor = cli_double(a, "loss-scale-backoff");
    c.scaler.growth_interval = cli_int(a, "loss-scale-interval");
    static const dt_dtype grad_types[] = {DT_F32, DT_BF16, DT_F16};
    c.grad_dtype = grad_types[cli_enum(a, "grad-dtype")];
    /* 1-bit Adam/LAMB compress the momentum to signs unless told otherwise. */
    bool onebit = c.optimizer == DT_OPTIM_ONEBIT_ADAM || c.optimizer == DT_OPTIM_ONEBIT_LAMB;
    const char *codec = onebit && !cli_is_set(a, "compress") ? "sign" : cli_str(a, "compress");
    if (dt_codec_parse("--compress", codec, &c.compress) != DT_OK ||
        dt_ef_parse("--compress-ef", cli_str(a, "compress-ef"), &c.compress_ef) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    c.compress_start = cli_int(a, "compress-start");
    c.compress_freeze_v = cli_bool(a, "compress-freeze-v");
    c.compress_ramp = cli_int(a, "compress-ramp");
    c.compress_dense_below = cli_int(a, "compress-dense-below");
    c.tp = (int)cli_int(a, "tp");
    c.sp = cli_bool(a, "sp");
    c.pp = (int)cli_int(a, "pp");
    c.zero = (int)cli_int(a, "zero");
    c.offload = cli_str(a, "offload");
    if (cli_is_set(a, "pp-schedule"))
        c.pp_schedule = cli_str(a, "pp-schedule");
    if (cli_is_set(a, "micro-batches")) {
        int m = (int)cli_int(a, "micro-batches");
        /* Both given by hand must agree; a --config file's accum yields. */
        if (cli_is_set(a, "accum") && strcmp(cli_get(a, "accum")->from, "config") != 0 &&
            c.accum != m)
            cli_usage_error(a->cmd,
                            "--micro-batches %d and --accum %d: they are the same "
                            "setting (give one)",
                            m, c.accum);
        c.accum = m;
    }
    c.cp = (int)cli_int(a, "cp");
    c.cp_mode = cli_str(a, "cp-mode");
    c.dp = (int)cli_int(a, "dp");
    c.mesh_order = cli_str(a, "mesh-order");
    c.dp_mode = (dt_dp_mode)cli_enum(a, "dp-mode");
    c.sync_every = cli_int(a, "sync-every");
    c.post_local_after = cli_int(a, "post-local-after");
    c.outer = cli_enum(a, "outer");
    c.outer_lr = cli_double(a, "outer-lr");
    c.outer_momentum = cli_double(a, "outer-momentum");
    c.sync_optim_state = cli_bool(a, "sync-optim-state");
    c.gossip_topology = cli_enum(a, "gossip-topology");
    c.gossip_every = cli_int(a, "gossip-every");
    c.ps_servers = (int)cli_int(a, "ps-servers");
    c.staleness = cli_int(a, "staleness");
    c.delay_comp = cli_enum(a, "delay-comp");
    c.dc_lambda = cli_double(a, "dc-lambda");
    c.trace = cli_bool(a, "trace");
    c.trace_buffer = (size_t)cli_int(a, "trace-buffer");
    if (parse_trace_steps(cli_str(a, "trace-steps"), &c.trace_first, &c.trace_last) != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    if (!c.data)
        cli_usage_error(a->cmd, "--data FILE is required (a .txt corpus or a .tok file)");
    if (c.min_lr > c.lr)
        cli_usage_error(a->cmd, "--min-lr %g is above --lr %g", c.min_lr, c.lr);
    bool auto_layout = cli_enum(a, "layout") == 1;
    int nproc = (int)cli_int(a, "nproc"), rc;
    dt_plan_layout layout;
    char args[320];
    if (nproc > 1 && !dt_launch_in_job()) {
        if (auto_layout && (rc = cli_train_plan_layout(a, &c, nproc, false, &layout)) != 0)
            return rc;
        return launch_ranks(a, nproc,
                            auto_layout ? dt_plan_layout_args(&layout, args, sizeof args) : NULL);
    }
    if (auto_layout) {
        int world = 1, rank = 0;
        if (dt_launch_in_job() && (rc = cli_train_job_world(a, &world, &rank)) != 0)
            return rc;
        if ((rc = cli_train_plan_layout(a, &c, world, rank != 0, &layout)) != 0)
            return rc;
        dt_plan_layout_to_config(&layout, &c);
    }
    catch_stop_signals();
    c.stop = &stop_signal;
    dt_train_result r;
    dt_status st = dt_train_run(&c, &r);
    int sig = atomic_load(&stop_signal);
    if (st == DT_ERR_ABORTED && sig) {
        fprintf(stderr, "dtrain train: %s\n", dt_last_error());
        return 128 + sig;
    }
    if (st != DT_OK)
        return cli_fail(st);
    return 0;
}

const cli_cmd cli_cmd_train = {
    .name = "train",
    .summary = "train a GPT on a text file (data and tensor parallel)",
    .usage = "dtrain train --data FILE [--batch B | --global-batch G] [--nproc N] [OPTIONS]",
    .description = train_description,
    .opts = train_opts,
    .run = run_train,
};
