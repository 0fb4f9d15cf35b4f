/*
 * gpt_internal.h — the model object shared by gpt.c (layout, memory plan,
 * creation, initialisation) and gpt_pass.c (forward and backward).
 *
 * Sizes used throughout, for a model part (nn.h, "the model as a part"):
 *   N  = B·T      token rows of a batch
 *   Ns = N / tp   rows of the residual stream on this rank with sequence
 *                 parallelism (a contiguous block of the N rows), else N
 *   Ct = C / tp   channels of q, k and v each (NHt = NH / tp heads)
 *   Ft = 4C / tp  MLP hidden channels
 *   Vl = Vp / tp  vocabulary rows of wte here (Vp: V padded to tp)
 * Without tensor parallelism tp = 1 and every one of these is the whole.
 */
#ifndef DTRAIN_NN_GPT_INTERNAL_H
#define DTRAIN_NN_GPT_INTERNAL_H

#include "dtrain/nn.h"

/* Per-block parameter tensors, in buffer order. */
enum {
    P_LN1W,
    P_LN1B,
    P_QKVW,
    P_QKVB,
    P_ATTPROJW,
    P_ATTPROJB,
    P_LN2W,
    P_LN2B,
    P_FCW,
    P_FCB,
    P_FCPROJW,
    P_FCPROJB,
    P_BLOCK_COUNT
};

/* Activations of one block (pointers into the arena). The fields typed
 * void * hold the compute type (fp32, or a16 in bf16/fp16); statistics
 * and the residual stream are fp32 in every precision. A recomputed block
 * owns only res3; its other fields point into the one shared scratch set,
 * refilled by backward just before the block's turn. */
typedef struct block_acts {
    void *ln1;       // (Ns,C)    ln_1 output
    float *ln1_mean; // (Ns)
    float *ln1_rstd; // (Ns)
    void *qkv;       // (N,3Ct)
    void *atty;      // (N,Ct)    attention output (before c_proj)
    float *att_lse;  // (B,NHt,T) flash attention log-sum-exp
    float *res2;     // (Ns,C)    x + attn(...)
    void *ln2;       // (Ns,C)
    float *ln2_mean; // (Ns)
    float *ln2_rstd; // (Ns)
    void *fch;       // (N,Ft)    c_fc output (pre-GELU; fp32: without its bias)
    void *fch_gelu;  // (N,Ft)
    float *res3;     // (Ns,C)    block output = the next block's input (always kept)
} block_acts;

/* What a block's backward hands its weight gradients when they are split
 * off (dt_gpt_options.split_weight_grads): the gradients of the outputs of
 * its linear layers and LayerNorms, per slot and block. void * fields hold
 * the compute type (what the linear backward reads), the LayerNorms' fp32. */
typedef struct block_wgrad {
    void *d_fcproj;  // (N,C)     gradient of the MLP's c_proj output (all N rows)
    void *d_fc;      // (N,Ft)    of c_fc's output (after GELU's backward)
    float *d_ln2;    // (Ns,C)    of ln_2's output
    void *d_attproj; // (N,C)     of attention's c_proj output
    void *d_qkv;     // (N,3Ct)   of c_attn's output
    float *d_ln1;    // (Ns,C)    of ln_1's output
} block_wgrad;

/* The shape of a model part, derived once from config and part. */
typedef struct gpt_dims {
    int nch;                              /* chunks */
    dt_layer_range ch[DT_GPT_MAX_CHUNKS]; /* their blocks */
    int base[DT_GPT_MAX_CHUNKS];          /* blocks held before chunk c */
    int nl;                               /* blocks held */
    bool first;                           /* holds the embeddings (chunk 0 begins at block 0) */
    bool last;     /* holds ln_f and the LM head (the last chunk ends the model) */
    int tp, r;     /* tensor-parallel size and this rank */
    bool sp;       /* sequence parallelism */
    int C, NH, Ct; /* channels, heads; channels of q/k/v here */
    int NHt, Ft;   /* heads here; MLP hidden channels here */
    int V, Vp, Vl; /* vocabulary, padded to tp, rows here */
    int cp, cr;    /* context-parallel size and this rank (1, 0: whole sequences) */
    dt_cp_mode cpm;
} gpt_dims;

/* Scratch of context-parallel attention (gpt_cp.c), in the arena. */
typedef struct cp_scratch {
    /* Ulysses: the all-to-all buffer (N,3Ct), and the gathered dout (fp32)
     * and out of this rank's heads for every token. */
    void *a2a, *g_out;
    float *g_dout;
    /* Ring: the key/value blocks in flight (N,2Ct) x 2; forward's partial
     * out (N,Ct) and lse (B,NHt,Tl); backward's travelling dk|dv x 2
     * (sharing the partials' memory). */
    float *kv[2], *pout, *plse, *acc[2];
    /* Ring in bf16/fp16: fp32 copies of qkv, out and dqkv (N,3Ct|Ct|3Ct). */
    float *w_qkv, *w_out, *w_dqkv;
} cp_scratch;

/* What one micro-batch in flight keeps from its forward to its backward:
 * a model holds `slots` of these (dt_gpt_options.slots: a pipeline stage
 * keeps several micro-batches alive), the scratch once. */
typedef struct gpt_slot {
    int part_chunk, L0, L1; /* the part's chunk it belongs to, and its blocks [L0, L1) */
    bool embeds;            /* the chunk holds block 0: its input is the embedding */
    bool head;              /* the chunk holds the last block: ln_f and the LM head follow */
    block_acts *acts;       /* (L1 - L0) entries, indexed by l - L0 */
    block_wgrad *wg;        /* (L1 - L0) with split_weight_grads, else NULL */
    float *encoded;         // (Ns,C)    the first block's input: embeddings, or the stage input
    void *lnf_out;          // (Ns,C)    compute type: ln_f output (the LM head's input)
    float *lnf_mean;        // (Ns)
    float *lnf_rstd;        // (Ns)
    float *logits;          // (N,Vl)    without recomputation (NULL with); dlogits after backward
    float *chunk;           // (N,Vb)    logits/dlogits of one vocabulary chunk (== logits when
                            //           there is one chunk and no recomputation; else shared)
    float *ce_lse;          // (N)
    float *losses;          // (N)
    int32_t *tokens;        // (N)       copy of the inputs
    int32_t *targets;       // (N)       copy of the targets
    int B, T;               /* sizes of its forward */
    bool have_targets;      /* its forward can be differentiated */
    bool pending_w;         /* split: backward ran, the weight gradients have not */
} gpt_slot;

/* The kinds of work a pass is split into for dt_gpt_take_profile. */
enum { PROF_PRODUCTS, PROF_ATTENTION, PROF_ELEMENTWISE, PROF_CASTS, PROF_COUNT };

struct dt_gpt {
    dt_gpt_config cfg;
    dt_gpt_options opt;    /* precision, recomputation, part */
    gpt_dims d;            /* what this part holds */
    int max_B, max_T;      /* arena planned for these */
    size_t nparams;        /* floats in params and grads */
    float *params, *grads; /* the two flat buffers */
    uint16_t *w16;         /* bf16/fp16: the rounded params (NULL in fp32) */
    dt_gpt_w16 w16_state;  /* when w16 is rounded again (dt_gpt_set_weights16) */
    size_t ntensors;       /* entries of info */
    dt_param_info *info;   /* the tensors, in buffer order */
    size_t wte, wpe;       /* info index of wte / wpe (SIZE_MAX: not here) */
    size_t blocks;         /* info index of the first block's first tensor */
    int *lidx;             /* (layers) local index of each block held, -1 elsewhere */
    size_t lnf;            /* info index of ln_f.weight (SIZE_MAX: not here) */
    char *names;           /* storage of info[i].name */
    char *arena;           /* all activations */
    size_t arena_bytes;
    gpt_slot *slots;      /* (nch x nslots) micro-batches in flight: chunk c's are c*nslots.. */
    int nslots;           /* per chunk */
    gpt_slot *s;          /* the slot of the pass running (or that ran last) */
    block_acts shared;    /* the scratch set of recomputed blocks (res3 unused) */
    void *gathered;       // (N,C)     sequence parallelism: an all-gathered ln output, compute type
    int head_cols;        /* Vb: vocabulary columns per LM-head chunk (== Vl: one chunk) */
    float *last;          // (B,Vl)    the last positions' logits (recomputation, or TP sampling)
    void *lnf_last;       // (B,C)     with recomputation: ln_f rows of the last positions
    float *last_all;      // (B,Vp)    tensor parallelism: the last positions' full logits
    float *ce_stats;      // (N,2)     tensor parallelism: this rank's (lse, target logit) per row
    float *ce_all;        // (tp,N,2)  ... every rank's, for the merge (also the last logits)
    float *dres;          // (Ns,C)    backward: gradient of the residual stream
    float *dbuf;          // (N,C)     scratch: c_proj outputs, dln, a gathered dres
    void *dqkv;           // (N,3Ct)   backward scratch, compute type
    float *dfch;          // (N,Ft)    backward scratch
    uint16_t *dres16;     // (N,C)     16-bit: dres rounded (the c_proj layers' dout; gathered
                          //           to N rows with sequence parallelism)
    uint16_t *row16;      // (Vb)      16-bit: the first row of a dlogits chunk
    float *attn_work;     // 16-bit: dt_attention16_workspace() floats
    float *gscratch;      // sequence parallelism: max(4C, T·C) floats, a replicated tensor's
                          // partial gradient on its way to the group sum
    cp_scratch cp;        /* context parallelism's buffers (all NULL without it) */
    double comm_ms;       /* time spent in the tensor- and context-parallel communication */
    double cp_attn_ms;    /* time in context-parallel attention (compute and communication) */
    dt_param_hooks hooks; /* parameters kept elsewhere (fetch NULL: none) */
    dt_linear_stats_fn lstats; /* the linear layers' statistics (NULL: none) */
    void *lstats_user;
    float lstats_scale; /* this backward's grad_scale / N */

    bool prof_on;               /* dt_gpt_profile_enable: PROF() times its calls */
    double prof_ms[PROF_COUNT]; /* the times by kind (dt_gpt_take_profile) */
};

/* Whether block l drops its activations in forward and recomputes them. */
static inline bool dt__gpt_recomputed(int every, int l) { return every > 0 && l % every == 0; }

/* Block tensor k of layer l (a global layer index of a block held) in
 * buffer `buf` (params or grads), and its 16-bit copy. */
static inline float *bt(const dt_gpt *m, float *buf, int l, int k) {
    return buf + m->info[m->blocks + (size_t)m->lidx[l] * P_BLOCK_COUNT + k].offset;
}
static inline const uint16_t *wt(const dt_gpt *m, int l, int k) {
    return m->w16 + m->info[m->blocks + (size_t)m->lidx[l] * P_BLOCK_COUNT + k].offset;
}
/* First float of block l. */
static inline size_t block_offset(const dt_gpt *m, int l) {
    return m->info[m->blocks + (size_t)m->lidx[l] * P_BLOCK_COUNT].offset;
}
/* The activations of block l in the current slot (l in the slot's chunk). */
static inline block_acts *acts_of(const dt_gpt *m, int l) { return &m->s->acts[l - m->s->L0]; }

/* Bytes of one activation element: fp32, or 16 bits in bf16/fp16. */
static inline size_t dt__act_size(dt_precision p) { return p == DT_PRECISION_FP32 ? 4 : 2; }

/* Time a communication point (the model's exposed tensor- and
 * context-parallel communication); return its error. */
#define REGION(m, call)                                                                            \
    do {                                                                                           \
        double t0_ = dt_now();                                                                     \
        dt_status st_ = (call);                                                                    \
        (m)->comm_ms += (dt_now() - t0_) * 1e3;                                                    \
        if (st_ != DT_OK)                                                                          \
            return st_;                                                                            \
    } while (0)

/* Run `stmt` (a kernel call of kind k), adding its wall time to the
 * model's profile when profiling is on. Never inside a parallel region. */
#define PROF(m, k, stmt)                                                                           \
    do {                                                                                           \
        double p0_ = (m)->prof_on ? dt_now() : 0.0;                                                \
        stmt;                                                                                      \
        if ((m)->prof_on)                                                                          \
            (m)->prof_ms[k] += (dt_now() - p0_) * 1e3;                                             \
    } while (0)

/* The sequence position of local token row i (of Tl = T/cp) on this rank. */
static inline int cp_position(const gpt_dims *d, int Tl, int i) {
    if (d->cp == 1)
        return i;
    if (d->cpm == DT_CP_ULYSSES)
        return d->cr * Tl + i;
    int Tc = Tl / 2; /* zig-zag: chunks cr and 2cp-1-cr */
    return i < Tc ? d->cr * Tc + i : (2 * d->cp - 1 - d->cr) * Tc + (i - Tc);
}

/* gpt_cp.c: attention of block activations a with context parallelism.
 * Forward: qkv_local (N,3Ct), the c_attn output (for Ulysses written to
 * the scratch that dt__gpt_cp_qkv_target names, else a->qkv) into a->atty
 * and a->att_lse. Backward: dout (N,Ct) fp32 into dqkv (N,3Ct), written. */
void *dt__gpt_cp_qkv_target(dt_gpt *m, const block_acts *a);
dt_status dt__gpt_cp_attention_forward(dt_gpt *m, const block_acts *a, const void *qkv_local);
dt_status dt__gpt_cp_attention_backward(dt_gpt *m, const block_acts *a, const float *dout,
                                        void *dqkv);

/* gpt_pass.c: forward of block l from its input x (Ns,C) into its
 * activations (`full` false: stop once what backward reads is there). */
dt_status dt__gpt_block_forward(dt_gpt *m, int l, const float *x, bool full, bool ln1_done);

#endif
