/*
 * dtrain/nn.h — a GPT-2 style transformer with hand-written forward and
 * backward passes over flat buffers.
 *
 * Overview
 * --------
 * The model: token + position embeddings, L pre-LayerNorm blocks
 *     x = x + attn(ln_1(x))      causal multi-head self-attention
 *     x = x + mlp(ln_2(x))       Linear(C,4C) -> GELU(tanh) -> Linear(4C,C)
 * a final LayerNorm and an LM head tied to the token embedding (logits =
 * ln_f(x) wte^T). Linear weights are stored (out, in) like torch.nn.Linear.
 *
 * Memory picture
 * --------------
 *  - ONE parameter buffer and ONE gradient buffer of dt_gpt_num_params()
 *    floats, in the same LAYER-MAJOR order:
 *        [wte (V,C), wpe (T,C), block 0, ..., block L-1, ln_f.weight, ln_f.bias]
 *    each block being [ln_1.w, ln_1.b, c_attn.w (3C,C), c_attn.b, attn.c_proj.w
 *    (C,C), attn.c_proj.b, ln_2.w, ln_2.b, c_fc.w (4C,C), c_fc.b, mlp.c_proj.w
 *    (C,4C), mlp.c_proj.b]. dt_gpt_tensor_info() names every view.
 *    Backward finishes gradients from the end of the buffer towards the
 *    front, so a data-parallel layer can reduce the tail while the head is
 *    still being computed (see dt_grad_ready_fn).
 *  - ONE activation arena, sized at create time from (config, max_batch,
 *    max_seq, precision, recomputation). forward/backward never allocate.
 *  - bf16/fp16 (dt_gpt_options.precision): params and grads stay fp32; the
 *    weights are rounded into a 16-bit copy once per forward, or once per
 *    step by its owner (dt_gpt_set_weights16: the optimizer writes it); block
 *    activations are 16-bit; the residual stream, LayerNorm statistics,
 *    logits and loss stay fp32 (docs/engine.md).
 *  - Recomputation (dt_gpt_options.recompute_every): a chosen block keeps
 *    only its output (the next block's input); its other activations live
 *    in one scratch set shared by all chosen blocks and are recomputed by
 *    backward.
 *  - Attention keeps O(T) memory per head (flash attention, see tensor.h).
 *
 * Example
 * -------
 *     dt_gpt_config cfg;
 *     dt_gpt *m;
 *     DT_CHECK(dt_gpt_preset("shakespeare-char", &cfg));
 *     DT_CHECK(dt_gpt_create(&m, &cfg, B, T));
 *     dt_gpt_init_params(m, seed);
 *     for (step...) {
 *         float loss;
 *         DT_CHECK(dt_gpt_forward(m, inputs, targets, B, T, &loss));
 *         // the first (here: only) micro-batch overwrites: no zero_grads
 *         DT_CHECK(dt_gpt_backward_mode(m, 1.0f, DT_GRAD_OVERWRITE, NULL, NULL));
 *         dt_adamw_step(dt_gpt_params(m), dt_gpt_grads(m), ...);
 *     }
 *     dt_gpt_destroy(m);
 */
#ifndef DTRAIN_NN_H
#define DTRAIN_NN_H

#include "dtrain/amp.h"
#include "dtrain/core.h"
#include "dtrain/tensor.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_gpt_config {
    int layers;  /* L: transformer blocks */
    int dim;     /* C: channels; a multiple of heads */
    int heads;   /* NH: attention heads; head size C/NH <= 256 */
    int max_seq; /* T: longest context (rows of wpe) */
    int vocab;   /* V: tokens (rows of wte) */
} dt_gpt_config;

/* Named configurations: "gpt2-124m" (L12 C768 NH12 T1024 V50257),
 * "gpt2-350m" (L24 C1024 NH16 T1024 V50257), "shakespeare-char" (L6 C384 NH6
 * T256 V65; the caller sets vocab from its data), "tiny" (L2 C64 NH4 T64
 * V97, for tests). DT_ERR_INVALID names the choices for an unknown name. */
dt_status dt_gpt_preset(const char *name, dt_gpt_config *out);
/* NULL-terminated list of preset names. */
const char *const *dt_gpt_preset_names(void);
/* Check ranges; DT_ERR_INVALID names the bad field and value. */
dt_status dt_gpt_config_validate(const dt_gpt_config *cfg);
/* Parameter count for a configuration (no allocation). */
size_t dt_gpt_config_num_params(const dt_gpt_config *cfg);

/* One parameter tensor as a view of the flat buffers, and the part of the
 * model's global tensor it holds. */
typedef struct dt_param_info {
    const char *name; /* "h.3.attn.c_attn.weight" (valid while the model lives) */
    size_t offset;    /* first float in dt_gpt_params()/dt_gpt_grads() */
    size_t rows;      /* a matrix is rows x cols; a vector is 1 x cols */
    size_t cols;
    bool decay; /* true for 2-D matrices (weights, embeddings); false for
                   biases and LayerNorm parameters */
    /* The global tensor, as one unsharded model holds it: up to 3
     * dimensions (c_attn's weight is (3, C, C): q, k, v), unused ones 1.
     * This model's part is the box [begin, begin + extent), stored
     * row-major from `offset` (the whole tensor without sharding). */
    int ndim;
    size_t shape[3];
    size_t begin[3], extent[3];
    /* This rank owns this part (a checkpoint writes it, the gradient norm
     * counts it): false for the copies other ranks also hold (the tensors
     * every tensor-parallel rank holds whole, owned by tp rank 0; the last
     * pipeline stage's copy of the tied embedding). */
    bool owner;
    /* Its index in the whole model's table (dt_gpt_config_tensors), the
     * same on every rank whatever the part. */
    int global;
} dt_param_info;

/* The whole model's tensor table (wte, wpe, the blocks' tensors, ln_f), as
 * an unsharded model in one process holds it: what checkpoints name,
 * whatever the layout that writes them. *out (dt_gpt_config_num_tensors
 * entries, names included) is freed with dt_free. */
size_t dt_gpt_config_num_tensors(const dt_gpt_config *cfg);
dt_status dt_gpt_config_tensors(const dt_gpt_config *cfg, dt_param_info **out);

/* Called by backward when grads[ready_from .. num_params) are final for this
 * backward call: after each block (ready_from = the block's first float) and
 * once at the end with ready_from = 0. */
typedef void (*dt_grad_ready_fn)(void *user, size_t ready_from);

/* Bytes of a model for the planned sizes, precision and recomputation.
 * The arena is allocated once at create time and forward/backward never
 * allocate, so `activations` is also the peak activation memory. */
typedef struct dt_memory_report {
    size_t params;          /* bytes of the parameter buffer (fp32 master copy) */
    size_t grads;           /* bytes of the gradient buffer (fp32) */
    size_t weights16;       /* bytes of the bf16/fp16 weight copy (0 in fp32) */
    size_t activations;     /* bytes of the whole activation arena = peak activation memory */
    size_t saved;           /* part of activations the blocks keep from forward to backward:
                               every block's output (the residual stream) and the embedding
                               output, plus all activations of each block not recomputed */
    size_t recompute;       /* part of activations: the one scratch set recomputed blocks
                               share (0 without recomputation) */
    size_t block;           /* one block's full set of activations (not a part: a unit) */
    size_t attention;       /* part of activations held for attention: qkv, out, lse */
    size_t attention_naive; /* what a naive attention would add: (B,NH,T,T) probs/layer */
    size_t wgrad;           /* part of activations: with split_weight_grads, what each
                               slot keeps from a block's backward to its weight gradients */
    size_t logits;          /* part of activations: the LM head's fp32 logits: (B,T,V)
                               without recomputation (+ one (B·T, Vb) vocabulary chunk
                               when V > Vb); with recomputation only the chunk (the
                               (B,V) last positions share the backward scratch) */
    dt_precision precision; /* compute type the arena was planned for */
    int recompute_every;    /* dt_gpt_options.recompute_every */
    int layers;             /* L */
    int batch, seq;         /* the sizes the arena was planned for */
} dt_memory_report;

typedef struct dt_gpt dt_gpt;

/* Allocate parameters, gradients and the activation arena for batches of up
 * to max_batch sequences of up to max_seq (<= cfg->max_seq) tokens.
 * Parameters are zero until dt_gpt_init_params() or a load. */
dt_status dt_gpt_create(dt_gpt **out, const dt_gpt_config *cfg, int max_batch, int max_seq);
void dt_gpt_destroy(dt_gpt *m);

/* ------------------------------------------------------------------------ */
/* The model as a part: pipeline stages and tensor-parallel shards          */
/* ------------------------------------------------------------------------ */
/*
 * A model part holds one or more ranges of blocks, its chunks (a pipeline
 * stage; several with interleaving, Megatron's virtual stages): the part
 * holding block 0 also holds the embeddings, the part holding the last
 * block ln_f and the LM head with a copy of the tied embedding. Its buffers
 * lay out [wte?, wpe?, chunk 0's blocks, chunk 1's blocks, ..., ln_f?];
 * each stage call names the chunk it runs. With tp_size > 1 it is one
 * tensor-parallel shard of them (Megatron-LM): attention split by heads,
 * the MLP's first linear by output rows and both c_proj by input columns,
 * the embedding and the LM head by vocabulary rows (V padded to a multiple
 * of tp_size; the padding's logits are masked out of the loss and of
 * sampling), LayerNorms, wpe and the c_proj biases whole on every rank.
 * With sequence_parallel the residual stream, LayerNorms and residual adds
 * hold only Ns = B·T/tp token rows per rank (a contiguous block of the
 * (B,T) rows), and each all-reduce becomes a reduce-scatter and an
 * all-gather.
 *
 * Where a shard communicates is one table of functions that nn calls and
 * the parallel layer implements over the tensor-parallel group (so nn
 * includes no comm header). Every rank of the group calls them in the same
 * order; counts are elements; buffers are fp32 unless an elem_size of 2
 * says the compute type (bf16/fp16 bits). Megatron's mappings:
 *
 *   copy_to          f: forward identity           backward allreduce
 *   reduce_from      g: forward allreduce           backward identity
 *   gather_from_sp   forward all-gather rows        backward reduce-scatter
 *   scatter_to_sp    forward reduce-scatter rows    backward all-gather
 *
 * (identity halves have no entry). Reduce-scatters work in place: the
 * (tp·count) buffer's block `rank` receives the sum. All-gathers place
 * rank r's `count` elements at block r.
 */
typedef struct dt_tp_regions {
    void *ctx; /* passed to every call */
    /* f backward: sum dx (count) over the group, in place. */
    dt_status (*copy_to_backward)(void *ctx, float *dx, size_t count);
    /* g forward: sum y (count) over the group, in place. */
    dt_status (*reduce_from_forward)(void *ctx, float *y, size_t count);
    /* SP gather forward: full (tp·count) = every rank's local (count). */
    dt_status (*gather_from_sp_forward)(void *ctx, const void *local, void *full, size_t count,
                                        size_t elem_size);
    /* SP gather backward: reduce-scatter dfull (tp·count) in place. */
    dt_status (*gather_from_sp_backward)(void *ctx, float *dfull, size_t count);
    /* SP scatter forward: reduce-scatter full (tp·count) in place. */
    dt_status (*scatter_to_sp_forward)(void *ctx, float *full, size_t count);
    /* SP scatter backward: dfull (tp·count) = every rank's dlocal (count). */
    dt_status (*scatter_to_sp_backward)(void *ctx, const void *dlocal, void *dfull, size_t count,
                                        size_t elem_size);
    /* Vocabulary-parallel cross-entropy and sampling: all (tp·count) =
     * every rank's per-row statistics or last logits. */
    dt_status (*gather_stats)(void *ctx, const float *mine, float *all, size_t count);
    /* SP: the gradient (count) of a replicated parameter, computed from
     * this rank's rows, summed over the group in place. */
    dt_status (*sum_partial_grads)(void *ctx, float *g, size_t count);
} dt_tp_regions;

/*
 * Context parallelism (long sequences): the cp ranks of a group each hold
 * Tl = T/cp tokens of every sequence, through every layer; only attention
 * needs the others' tokens. Two ways, chosen by dt_cp_mode:
 *
 *   ULYSSES  (DeepSpeed-Ulysses) rank r holds the contiguous tokens
 *            [r Tl, (r+1) Tl). Before attention an all-to-all turns this
 *            rank's tokens of all heads into all tokens of NH/cp heads;
 *            attention runs locally; a second all-to-all turns the output
 *            back. The heads (per tensor-parallel rank) must divide by cp.
 *   RING     (ring attention, zig-zag): the sequence is cut into 2 cp
 *            chunks of Tc = T/(2cp) and rank r holds chunks r and 2cp-1-r,
 *            in that order, so every rank has the same share of the causal
 *            triangle. Queries stay; keys and values travel around the
 *            ring, each arriving block attended to while the next one is
 *            in flight, the partial results merged by their log-sum-exp;
 *            backward sends keys and values round again, with their
 *            gradients following one hop behind. T must divide by 2 cp.
 *
 * Forward takes the whole (B,T) inputs and targets of every sequence and
 * uses this rank's tokens; the loss it reports is the mean over all the
 * group's tokens (a sum over the group), while backward gives the gradient
 * of this rank's tokens' mean: averaged over the cp group (as gradient
 * synchronisation over dp x cp does) it is the whole sequence's.
 * The points where a context-parallel part communicates, implemented by
 * the parallel layer over the cp group (counts are bytes):
 */
typedef enum dt_cp_mode { DT_CP_ULYSSES, DT_CP_RING } dt_cp_mode;

typedef struct dt_cp_regions {
    void *ctx; /* passed to every call */
    /* Ulysses: block j (`bytes` long) of buf goes to rank j, and block i
     * of buf becomes rank i's block for this rank (in place). */
    dt_status (*all_to_all)(void *ctx, void *buf, size_t bytes);
    /* Ring: start sending `bytes` of send to the next rank (cp_rank + 1
     * mod cp) while receiving as many from the previous one into recv, on
     * channel 0 or 1 (one transfer per channel in flight); wait ends it.
     * Every rank starts and waits in the same order. */
    dt_status (*shift_start)(void *ctx, int channel, const void *send, void *recv, size_t bytes);
    dt_status (*shift_wait)(void *ctx, int channel);
    /* The loss: x (count) summed over the group, in place. */
    dt_status (*sum)(void *ctx, float *x, size_t count);
} dt_cp_regions;

#define DT_GPT_MAX_CHUNKS 64

typedef struct dt_layer_range {
    int begin, end; /* blocks [begin, end) */
} dt_layer_range;

typedef struct dt_gpt_part {
    int chunks; /* layer ranges held; 0: the whole model as one chunk */
    /* chunk c's blocks: non-empty, increasing, disjoint */
    dt_layer_range layers[DT_GPT_MAX_CHUNKS];
    int tp_rank, tp_size;            /* this shard; tp_size 0 or 1: unsharded */
    bool sequence_parallel;          /* Megatron sequence parallelism (tp_size > 1) */
    const dt_tp_regions *regions;    /* required when tp_size > 1; borrowed */
    int cp_rank, cp_size;            /* context-parallel share; cp_size 0 or 1: whole sequences */
    dt_cp_mode cp_mode;              /* how attention meets the other ranks' tokens */
    const dt_cp_regions *cp_regions; /* required when cp_size > 1; borrowed */
} dt_gpt_part;

/* The position in the sequence (of length T) of local token row i of a
 * context-parallel part (i < T / cp_size; the identity without cp). */
int dt_gpt_cp_position(const dt_gpt_part *part, int T, int i);
/* "ulysses" / "ring"; and the parse (DT_ERR_INVALID names knob and text). */
const char *dt_cp_mode_name(dt_cp_mode mode);
dt_status dt_cp_mode_parse(const char *knob, const char *text, dt_cp_mode *out);

/* Check a part against a configuration and the planned sequence length:
 * DT_ERR_INVALID names the setting (a tp that does not divide the heads, a
 * sequence not divisible by tp under sequence parallelism, ...). */
dt_status dt_gpt_part_validate(const dt_gpt_config *cfg, const dt_gpt_part *part, int max_seq);

/* How a model computes (dt_gpt_create uses the defaults). */
typedef struct dt_gpt_options {
    /* Compute type. Parameters and gradients stay fp32 (the master copy);
     * with bf16/fp16 the weights are cast once per forward, activations are
     * stored in the compute type and matrix multiplies accumulate in fp32. */
    dt_precision precision;
    /* Activation recomputation: 0 keeps every block's activations; K >= 1
     * drops the activations of block l when l % K == 0 in forward (keeping
     * only its input) and recomputes them in backward. 1 = every block. */
    int recompute_every;
    /* Which part of the model this process holds (zeroed: all of it). */
    dt_gpt_part part;
    /* Micro-batches whose activations each chunk keeps at once, each in
     * its own slot (a pipeline stage runs several forwards before their
     * backwards); the scratch is shared. 0 or 1: one. */
    int slots;
    /* Zero-bubble pipelines: dt_gpt_backward_stage computes the input
     * gradient (and the gradients of the embeddings, ln_f and the head)
     * and keeps in the slot what the blocks' weight gradients are made of;
     * dt_gpt_weight_stage computes those later. The two give the bits of
     * one backward. */
    bool split_weight_grads;
} dt_gpt_options;

/* fp32, no recomputation. */
dt_gpt_options dt_gpt_options_default(void);

/* dt_gpt_create with options (NULL: the defaults). DT_ERR_INVALID names a
 * bad option; DT_ERR_UNSUPPORTED if this build cannot run the combination. */
dt_status dt_gpt_create_with(dt_gpt **out, const dt_gpt_config *cfg, int max_batch, int max_seq,
                             const dt_gpt_options *opt);

/* Parse "none" (0), "blocks" (1) or "every:K" (K >= 1) into *every;
 * DT_ERR_INVALID naming knob and text otherwise. */
dt_status dt_recompute_parse(const char *knob, const char *text, int *every);
/* The canonical text of a recompute setting ("none", "blocks", "every:2"); returns buf. */
char *dt_recompute_format(int every, char *buf, size_t len);

const dt_gpt_config *dt_gpt_get_config(const dt_gpt *m);
float *dt_gpt_params(dt_gpt *m);
float *dt_gpt_grads(dt_gpt *m);
size_t dt_gpt_num_params(const dt_gpt *m);
size_t dt_gpt_num_tensors(const dt_gpt *m);
void dt_gpt_tensor_info(const dt_gpt *m, size_t i, dt_param_info *out);

/* GPT-2 initialisation: weights N(0, 0.02), residual projections (c_proj)
 * N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weight 1 and bias 0. Tensor i
 * draws from its own Philox stream (seed, DT_RNG_INIT, i), so the result is
 * independent of thread count and layout changes elsewhere. */
void dt_gpt_init_params(dt_gpt *m, uint64_t seed);
/* Only parameters [begin, end) of the flat buffer (the rest untouched),
 * with the values dt_gpt_init_params gives them: a ZeRO 3 replica
 * initialises its own pieces without ever holding the whole model. */
void dt_gpt_init_params_range(dt_gpt *m, uint64_t seed, size_t begin, size_t end);

/* Forward pass on inputs (B,T). With targets (B,T) the mean cross-entropy
 * loss is written to *mean_loss (may be NULL) and the pass is kept for
 * backward; without targets only logits are computed (with recomputation:
 * only those of the last position of each sequence). */
dt_status dt_gpt_forward(dt_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                         float *mean_loss);
void dt_gpt_zero_grads(dt_gpt *m);
/* Backward of the last forward (which must have had targets). ACCUMULATES
 * grad_scale * d(mean loss)/d(params) into the gradient buffer; hook may be
 * NULL. May overwrite the logits (their memory can hold dlogits). Blocks chosen by
 * recompute_every re-run their forward from their kept input just before
 * their backward; the result is bit-identical to no recomputation. An error
 * (only possible from a 16-bit multiply) leaves the gradients partial. */
dt_status dt_gpt_backward(dt_gpt *m, float grad_scale, dt_grad_ready_fn hook, void *user);
/* dt_gpt_backward with the gradient buffer written per mode:
 * DT_GRAD_ACCUMULATE is dt_gpt_backward; DT_GRAD_OVERWRITE writes every
 * gradient, never reading the buffer's old contents (which may be garbage,
 * even NaN), with the same bits as dt_gpt_zero_grads() followed by an
 * accumulating backward. A step of K micro-batches runs its first backward
 * with DT_GRAD_OVERWRITE and the others with DT_GRAD_ACCUMULATE instead of
 * zeroing the buffer (a 4 bytes/param write) first. */
dt_status dt_gpt_backward_mode(dt_gpt *m, float grad_scale, dt_grad_mode mode,
                               dt_grad_ready_fn hook, void *user);
/* A pipeline stage's forward of a micro-batch through `chunk` (< the
 * part's chunks) into `slot` (< the model's slots; its activations stay
 * there until its backward): the chunk holding block 0 embeds `inputs`
 * (B,T); another takes the residual stream x_in (Ns,C) (copied). The chunk
 * with the head computes the loss when given targets; the others leave
 * their output in dt_gpt_stage_output(chunk, slot). dt_gpt_forward is this
 * with chunk 0, slot 0 and x_in NULL. */
dt_status dt_gpt_forward_stage(dt_gpt *m, int chunk, int slot, const int32_t *inputs,
                               const float *x_in, const int32_t *targets, int B, int T,
                               float *mean_loss);
/* Its backward: the chunk with the head starts from its loss (dx_out
 * NULL), the others from the gradient of their output (Ns,C). The gradient
 * of the chunk's input is then dt_gpt_stage_input_grad() (until the next
 * backward). The hook sees each block's gradients final and, at the end of
 * chunk 0, ready_from 0: with several chunks the caller passes it only
 * when the later chunks' gradients are final already (the last backward of
 * each chunk, in descending chunk order, as every pipeline schedule runs
 * them). With split_weight_grads the blocks' weight gradients wait for
 * dt_gpt_weight_stage and this calls no hook. */
dt_status dt_gpt_backward_stage(dt_gpt *m, int chunk, int slot, const float *dx_out,
                                float grad_scale, dt_grad_mode mode, dt_grad_ready_fn hook,
                                void *user);
/* split_weight_grads: the weight gradients of the chunk's blocks for the
 * micro-batch in `slot`, written per mode, after its backward_stage; frees
 * the slot. The hook as for backward_stage. */
dt_status dt_gpt_weight_stage(dt_gpt *m, int chunk, int slot, dt_grad_mode mode,
                              dt_grad_ready_fn hook, void *user);
/* (Ns,C): a slot's last block output after its forward; d(input) after the
 * last backward. */
const float *dt_gpt_stage_output(const dt_gpt *m, int chunk, int slot);
const float *dt_gpt_stage_input_grad(const dt_gpt *m);
/* Parameters kept elsewhere (ZeRO stage 3 holds only a shard of them):
 * forward, backward and W call fetch before they read params[begin, end)
 * (a block, the embeddings, ln_f, the tied head's wte) and release when
 * done with it; prefetch announces the range the pass reads next, so that
 * its transfer overlaps the compute. Every data-parallel replica makes the
 * same calls in the same order. Ranges overlap only by being the same. */
typedef struct dt_param_hooks {
    void *user;
    dt_status (*fetch)(void *user, size_t begin, size_t end);
    void (*prefetch)(void *user, size_t begin, size_t end);
    void (*release)(void *user, size_t begin, size_t end);
    /* Optional (all three or none), for 16-bit compute: the same for the
     * ranges the model reads through its 16-bit copy w16 (indexed like the
     * parameters: a block, a piece of the tied head's vocabulary). fetch16
     * leaves w16[begin, end) the parameters rounded as the model rounds
     * them (dt_act16_from_f32), and the one-row tensors of the range
     * (biases, LayerNorm parameters, which the model reads in fp32) valid
     * in the parameter buffer; the rest of params[begin, end) need not be.
     * NULL: fetch, prefetch and release, and the model rounds. */
    dt_status (*fetch16)(void *user, size_t begin, size_t end, uint16_t *w16);
    void (*prefetch16)(void *user, size_t begin, size_t end, uint16_t *w16);
    void (*release16)(void *user, size_t begin, size_t end);
} dt_param_hooks;

/* Install (NULL: remove) the parameter hooks; copied. With bf16/fp16
 * compute, a unit's 16-bit weights are cast as it is fetched and their
 * pages given back as it is released (instead of the whole buffer cast at
 * every forward), or come from fetch16. With hooks, the tied embedding is
 * fetched in pieces of the vocabulary (the head's chunks; the embedding's
 * lookup too, without tensor or context parallelism), so no pass holds it
 * whole. */
dt_status dt_gpt_set_param_hooks(dt_gpt *m, const dt_param_hooks *h);

/* The linear layers' statistics (K-FAC): during a backward that writes
 * parameter gradients, for each of a block's four linear layers (c_attn,
 * attn c_proj, c_fc, mlp c_proj), fn gets the layer's input x (N, in) and
 * the gradient of its output dy (N, out), as backward has them, with the
 * weight's offset in the parameter buffer (the weight is (out, in)
 * row-major). dy is d(grad_scale * mean loss) / d(output): dy / scale, with
 * scale = grad_scale / N, is each token's gradient of its own loss. fp32
 * compute without tensor parallelism and without a split weight-gradient
 * pass only (DT_ERR_UNSUPPORTED otherwise). NULL fn: none. */
typedef void (*dt_linear_stats_fn)(void *user, size_t weight_offset, const float *x,
                                   const float *dy, int N, int in, int out, float scale);
dt_status dt_gpt_set_linear_stats(dt_gpt *m, dt_linear_stats_fn fn, void *user);

/* The options the model was created with (its part normalised). */
const dt_gpt_options *dt_gpt_get_options(const dt_gpt *m);
/* The part this model holds (normalised: chunks >= 1, tp_size >= 1). */
const dt_gpt_part *dt_gpt_get_part(const dt_gpt *m);
/* Milliseconds spent in the tensor- and context-parallel communication
 * points since the last call (exposed: a part waits for them; the ring's
 * transfers count only while waited for); resets. */
double dt_gpt_take_comm_ms(dt_gpt *m);
/* Milliseconds in context-parallel attention (its kernels and the
 * communication above, forward and backward) since the last call; resets. */
double dt_gpt_take_attention_ms(dt_gpt *m);

/* Where a model's passes spend their time (dtrain bench train's
 * breakdown): wall milliseconds in the matrix products (linear layers and
 * the LM head), attention, the elementwise kernels (LayerNorm, GELU,
 * residual adds, embedding, the loss's softmax gradient) and 16-bit casts
 * (the weight copy, dlogits, the residual gradient), since the last take.
 * Off by default (then nothing is timed); the rest of a pass (the loss's
 * log-sum-exp, copies, communication) is the difference to its total. */
typedef struct dt_gpt_profile {
    double products_ms, attention_ms, elementwise_ms, casts_ms;
} dt_gpt_profile;
void dt_gpt_profile_enable(dt_gpt *m, bool on);
dt_gpt_profile dt_gpt_take_profile(dt_gpt *m);

/* The 16-bit compute copy of the weights (bf16/fp16 models; fp32 models
 * have none and ignore these calls). By default (DT_GPT_W16_EACH_FORWARD)
 * every forward rounds all parameters into it, since the caller may have
 * changed them. A training loop that knows when parameters change takes
 * the copy over: it sets DT_GPT_W16_STALE after anything that writes
 * parameters without updating the copy (the next forward rounds them once,
 * then the copy is current for every later forward and backward: all
 * micro-batches of a step), or DT_GPT_W16_CURRENT after an optimizer wrote
 * the copy as it updated the master (dt_gpt_write_weights16). With
 * parameter hooks (ZeRO 3) each fetched unit is rounded as it arrives,
 * whatever the state. */
typedef enum dt_gpt_w16 {
    DT_GPT_W16_EACH_FORWARD, /* the default: round at every forward */
    DT_GPT_W16_STALE,        /* round at the next forward, then current */
    DT_GPT_W16_CURRENT       /* the copy equals the rounded parameters */
} dt_gpt_w16;
void dt_gpt_set_weights16(dt_gpt *m, dt_gpt_w16 state);
dt_gpt_w16 dt_gpt_weights16_state(const dt_gpt *m);
/* Round src[0, count), the new values of parameters [begin, begin + count),
 * into the 16-bit copy: the shape of dt_optim_copy_fn (optim.h), `model`
 * being the dt_gpt. Safe on disjoint ranges from several threads; nothing
 * in fp32. Bit-identical to the forward's own rounding. */
void dt_gpt_write_weights16(void *model, const float *src, size_t begin, size_t count);

/* The last forward's logits, fp32, valid until the next backward:
 *  - recompute_every == 0: all of them, (B,T,V);
 *  - recompute_every > 0: only the last position of each sequence, (B,V)
 *    (row b = position T-1 of sequence b). The LM head is then recomputed
 *    in vocabulary chunks like the blocks, and the (B,T,V) logits never
 *    exist at once. Without targets forward computes only these rows (a
 *    smaller GEMM, so they may differ from a pass with targets in the last
 *    bits). */
const float *dt_gpt_logits(const dt_gpt *m);
/* The logits (V) of the last position (T-1) of sequence b of the last
 * forward, in every mode (what a sampler needs). With tensor parallelism:
 * all Vp of them (padding -inf), after a forward WITHOUT targets (which
 * gathers them from the shards; dt_gpt_logits is this rank's Vl columns). */
const float *dt_gpt_last_logits(const dt_gpt *m, int b);

/* Internal, for tests: LM-head chunk width (vocabulary columns) of models
 * created after this call; 0 restores the automatic choice (~2 MiB of fp32
 * logits per chunk, see docs/engine.md). Not thread-safe. */
void dt__gpt_head_cols_override(int cols);

/* Bytes of params, grads and activations for the planned sizes. */
void dt_gpt_memory(const dt_gpt *m, dt_memory_report *out);
/* Plan without allocating (for the T sweep in the memory report), fp32
 * without recomputation. */
void dt_gpt_memory_plan(const dt_gpt_config *cfg, int batch, int seq, dt_memory_report *out);
/* The same for the given options (NULL: the defaults). */
void dt_gpt_memory_plan_with(const dt_gpt_config *cfg, int batch, int seq,
                             const dt_gpt_options *opt, dt_memory_report *out);
/* Print "params ... grads ... optimizer ... activations (saved, recompute, attention ...)" */
void dt_gpt_memory_print(const dt_memory_report *r, size_t optimizer_bytes, FILE *out);

/* Forward FLOPs per token (matmuls + attention, causal), for MFU: a training
 * step costs about 3x this per token. */
double dt_gpt_flops_per_token(const dt_gpt_config *cfg, int T);

/* ------------------------------------------------------------------------ */
/* Plain weights file (for sampling; the full checkpoint comes later)       */
/* ------------------------------------------------------------------------ */
/*
 * Layout, little-endian:
 *   u32 magic "DTGW"   u32 version (1)
 *   i32 layers, dim, heads, max_seq, vocab
 *   u32 vocab_bytes_len (<= vocab, <= 256)   u8 vocab_bytes[vocab_bytes_len]
 *   u64 num_params     f32 params[num_params]
 *   u64 XXH3-64 of everything before it
 * vocab_bytes maps a token id to the byte it stands for (char-level: the
 * corpus's byte values; byte-level: 0..255), so a sampler can decode; a
 * model trained with a vocabulary larger than its tokenizer's (--vocab)
 * has ids past the table, which stand for no byte.
 */
#define DT_GPT_WEIGHTS_MAGIC   0x57475444u /* "DTGW" */
#define DT_GPT_WEIGHTS_VERSION 1u

dt_status dt_gpt_save_weights(const dt_gpt *m, const char *path, const uint8_t *vocab_bytes,
                              int vocab_bytes_len);
/* Create a model from a weights file; vocab_bytes (256) receives the byte
 * table and *vocab_bytes_len its length (0 if the file has none). */
dt_status dt_gpt_load_weights(dt_gpt **out, const char *path, int max_batch, int max_seq,
                              uint8_t vocab_bytes[256], int *vocab_bytes_len);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_NN_H */
