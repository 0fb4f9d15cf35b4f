/*
 * gpt.c — the GPT model: parameter layout, activation arena, forward and
 * backward, initialisation and the memory report.
 *
 * Invariants:
 *  - params and grads are two flat buffers with the same layer-major layout
 *    (see nn.h); every tensor is a view (offset, rows, cols).
 *  - All activations live in one arena carved at create time for
 *    (max_batch, max_seq, precision, recompute_every), in bytes; a pass with
 *    smaller B, T uses the front of each region with compact strides.
 *    forward/backward do not allocate, so the arena is the peak.
 *  - Backward accumulates into grads, or overwrites them (DT_GRAD_OVERWRITE:
 *    every parameter gradient is written, each by the first kernel that
 *    produces it, as 0 + g, so the bits equal zeroing then accumulating;
 *    wte's token-embedding part then adds to what the tied head wrote);
 *    scratch regions are overwritten.
 *  - bf16/fp16: params/grads stay fp32; w16 is the 16-bit copy of ALL params,
 *    rewritten by every forward; the residual stream, statistics, logits and
 *    losses are fp32 (the dt_gpt struct comments say which pointer is which).
 *  - Recomputation: a recomputed block's acts[l] point into `shared` except
 *    res3, which every block owns (it is the next block's kept input).
 *    Backward refills `shared` by re-running the block's forward with the
 *    same calls, so gradients are bit-identical to no recomputation.
 *  - The LM head runs in vocabulary chunks of head_cols columns in every
 *    mode (see "LM head in vocabulary chunks"); head_cols depends only on
 *    (V, max_batch * max_seq), so models created with the same sizes chunk
 *    alike. With recomputation the (B,T,V) logits never exist: backward
 *    recomputes each chunk with forward's GEMM call.
 */
#include "dtrain/nn.h"

#include "../tensor/simd.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static const char *const block_names[P_BLOCK_COUNT] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias",
};
_Static_assert(sizeof block_names / sizeof block_names[0] == P_BLOCK_COUNT, "block_names");

/* Activations of one block (pointers into the arena). The fields typed
 * void * hold the compute type (fp32, or a16 in bf16/fp16: see act_size);
 * statistics and the residual stream are fp32 in every precision. A
 * recomputed block owns only res3; its other fields point into the one
 * shared scratch set, refilled by backward just before the block's turn. */
typedef struct block_acts {
    void *ln1;       // (B,T,C)   ln_1 output
    float *ln1_mean; // (B,T)
    float *ln1_rstd; // (B,T)
    void *qkv;       // (B,T,3C)
    void *atty;      // (B,T,C)   attention output (before c_proj)
    float *att_lse;  // (B,NH,T)  flash attention log-sum-exp
    float *res2;     // (B,T,C)   x + attn(...)
    void *ln2;       // (B,T,C)
    float *ln2_mean; // (B,T)
    float *ln2_rstd; // (B,T)
    void *fch;       // (B,T,4C)  c_fc output (pre-GELU; fp32: without its bias)
    void *fch_gelu;  // (B,T,4C)
    float *res3;     // (B,T,C)   block output = the next block's input (always kept)
} block_acts;

struct dt_gpt {
    dt_gpt_config cfg;
    dt_gpt_options opt;    /* precision and recomputation */
    int max_B, max_T;      /* arena planned for these */
    size_t nparams;        /* floats in params and grads */
    float *params, *grads; /* the two flat buffers */
    uint16_t *w16;         /* bf16/fp16: params cast once per forward (NULL in fp32) */
    size_t ntensors;       /* 2 + 12 L + 2 */
    dt_param_info *info;   /* ntensors views */
    char *names;           /* storage of info[i].name */
    char *arena;           /* all activations */
    size_t arena_bytes;
    block_acts *acts;  /* L entries */
    block_acts shared; /* the scratch set of recomputed blocks (res3 unused) */
    float *encoded;    // (B,T,C)
    void *lnf;         // (B,T,C)   compute type (the LM head's input)
    float *lnf_mean;   // (B,T)
    float *lnf_rstd;   // (B,T)
    int head_cols;     /* Vb: vocabulary columns per LM-head chunk (== V: one chunk) */
    int head_cols_max; /* what the arena was carved for */
    float *logits;     // (B,T,V) without recomputation (NULL with); dlogits after backward
                       // when there is one chunk (a16 dlogits in 16-bit)
    float *chunk;      // (B·T,Vb) logits/dlogits of one vocabulary chunk (== logits when
                       // there is one chunk and no recomputation)
    float *last;       // (B,V)     with recomputation: the last position's logits
    void *lnf_last;    // (B,C)     with recomputation: ln_f rows of the last positions
    float *ce_lse;     // (B,T)
    float *losses;     // (B,T)
    float *dres;       // (B,T,C)   backward: gradient of the residual stream
    float *dbuf;       // (B,T,C)   scratch: c_proj outputs, dln, datty
    void *dqkv;        // (B,T,3C)  backward scratch, compute type
    float *dfch;       // (B,T,4C)  backward scratch
    uint16_t *dres16;  // (B,T,C)   16-bit: dres rounded (the c_proj layers' dout)
    uint16_t *row16;   // (Vb)      16-bit: the first row of a dlogits chunk (see head_dout16)
    float *attn_work;  // 16-bit: dt_attention16_workspace() floats (dqkv, attn_work share
                       // their memory with dfch: see carve)
    int32_t *tokens;   // (B,T)     copy of the last inputs
    int32_t *targets;  // (B,T)     copy of the last targets
    int B, T;          /* sizes of the last forward */
    bool have_targets; /* the last forward can be differentiated */
};

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */
/* ------------------------------------------------------------------------ */

typedef struct preset {
    const char *name;
    dt_gpt_config cfg;
} preset;

static const preset presets[] = {
    {"gpt2-124m", {12, 768, 12, 1024, 50257}},
    {"gpt2-350m", {24, 1024, 16, 1024, 50257}},
    {"shakespeare-char", {6, 384, 6, 256, 65}},
    {"tiny", {2, 64, 4, 64, 97}},
};
#define NPRESETS (sizeof presets / sizeof presets[0])
static const char *const preset_names[NPRESETS + 1] = {"gpt2-124m", "gpt2-350m", "shakespeare-char",
                                                       "tiny", NULL};

const char *const *dt_gpt_preset_names(void) { return preset_names; }

dt_status dt_gpt_preset(const char *name, dt_gpt_config *out) {
    for (size_t i = 0; i < NPRESETS; i++)
        if (name && strcmp(name, presets[i].name) == 0) {
            *out = presets[i].cfg;
            return DT_OK;
        }
    return dt_error_set(DT_ERR_INVALID,
                        "model preset \"%s\" is unknown (choices: gpt2-124m, gpt2-350m, "
                        "shakespeare-char, tiny)",
                        name ? name : "(null)");
}

dt_status dt_gpt_config_validate(const dt_gpt_config *c) {
    if (c->layers < 1 || c->layers > 1024)
        return dt_error_set(DT_ERR_INVALID, "model layers = %d, must be in [1, 1024]", c->layers);
    if (c->heads < 1 || c->heads > 1024)
        return dt_error_set(DT_ERR_INVALID, "model heads = %d, must be in [1, 1024]", c->heads);
    if (c->dim < 1 || c->dim > 65536 || c->dim % c->heads != 0)
        return dt_error_set(DT_ERR_INVALID,
                            "model dim = %d, must be in [1, 65536] and a multiple of heads (%d)",
                            c->dim, c->heads);
    if (c->dim / c->heads > 256)
        return dt_error_set(DT_ERR_INVALID, "model head size dim/heads = %d, must be <= 256",
                            c->dim / c->heads);
    if (c->max_seq < 1 || c->max_seq > (1 << 20))
        return dt_error_set(DT_ERR_INVALID, "model max_seq = %d, must be in [1, 1048576]",
                            c->max_seq);
    if (c->vocab < 1 || c->vocab > (1 << 24))
        return dt_error_set(DT_ERR_INVALID, "model vocab = %d, must be in [1, 16777216]", c->vocab);
    return DT_OK;
}

/* Shape of block tensor k for channels C: matrices are (rows C, cols C)
 * multiples, vectors are (1, cols C). */
static void block_shape(int k, size_t C, size_t *rows, size_t *cols) {
    // clang-format off
    //                                       ln1w ln1b qkvw qkvb apw apb ln2w ln2b fcw fcb fpw fpb
    static const size_t rm[P_BLOCK_COUNT] = {0,   0,   3,   0,   1,  0,  0,   0,   4,  0,  1,  0};
    static const size_t cm[P_BLOCK_COUNT] = {1,   1,   1,   3,   1,  1,  1,   1,   1,  4,  4,  1};
    // clang-format on
    *rows = rm[k] ? rm[k] * C : 1;
    *cols = cm[k] * C;
}

/* The global shape of block tensor k: vectors 1-D, matrices 2-D (out,
 * in), and c_attn split into its q, k and v parts, (3, C, C) and (3, C),
 * so that a tensor-parallel shard (some heads of each) is one box.
 * Returns the dimensions. */
static int block_global_shape(int k, size_t C, size_t shape[3]) {
    size_t r, c;
    block_shape(k, C, &r, &c);
    shape[1] = shape[2] = 1;
    if (k == P_QKVW) {
        shape[0] = 3, shape[1] = C, shape[2] = C;
        return 3;
    }
    if (k == P_QKVB) {
        shape[0] = 3, shape[1] = C;
        return 2;
    }
    if (r > 1) {
        shape[0] = r, shape[1] = c;
        return 2;
    }
    shape[0] = c;
    return 1;
}

static size_t block_params(size_t C) {
    size_t n = 0;
    for (int k = 0; k < P_BLOCK_COUNT; k++) {
        size_t r, c;
        block_shape(k, C, &r, &c);
        n += r * c;
    }
    return n; /* 12 C^2 + 13 C */
}

size_t dt_gpt_config_num_params(const dt_gpt_config *c) {
    size_t C = (size_t)c->dim;
    return (size_t)c->vocab * C + (size_t)c->max_seq * C + (size_t)c->layers * block_params(C) +
           2 * C;
}

/* ------------------------------------------------------------------------ */
/* Activation plan: one function computes the layout for both the arena    */
/* carving and the memory report, so they cannot disagree.                  */
/* ------------------------------------------------------------------------ */

typedef struct plan {
    size_t total;     /* bytes of the arena */
    size_t attention; /* bytes held for attention (qkv, out, lse) */
    size_t logits;    /* bytes of the logits */
    size_t saved;     /* bytes of block activations kept from forward to backward */
    size_t recompute; /* bytes of the shared scratch set of recomputed blocks */
    size_t block;     /* bytes of one block's full set of activations */
} plan;

/* Bytes of one activation element: fp32, or 16 bits in bf16/fp16. */
static size_t act_size(dt_precision p) { return p == DT_PRECISION_FP32 ? 4 : 2; }

/* LM head chunks: about this many bytes of fp32 logits per chunk. */
#define HEAD_CHUNK_BYTES ((size_t)2 << 20)

/* Vocabulary columns per LM-head chunk for N rows: a multiple of 64 (at
 * least 64) keeping the (N, Vb) fp32 chunk near HEAD_CHUNK_BYTES; V when
 * that covers the vocabulary (one chunk: the unchunked computation). */
static int head_cols_override; /* tests: dt__gpt_head_cols_override() */

void dt__gpt_head_cols_override(int cols) { head_cols_override = cols > 0 ? cols : 0; }

static int head_cols(int V, size_t N) {
    if (head_cols_override)
        return head_cols_override < V ? head_cols_override : V;
    size_t w = HEAD_CHUNK_BYTES / (N * 4) / 64 * 64;
    w = w < 64 ? 64 : w;
    return w >= (size_t)V ? V : (int)w;
}

/* Whether block l drops its activations in forward and recomputes them. */
static bool recomputed(int every, int l) { return every > 0 && l % every == 0; }

/* Take `bytes` from the arena (or only count them when base is NULL);
 * regions are 64-byte aligned. */
static void *take(char *base, size_t *off, size_t bytes) {
    void *p = base ? base + *off : NULL;
    *off += dt_align_up(bytes, 64);
    return p;
}

/* The activations of one block except res3; returns the attention bytes. */
static size_t take_block(char *base, size_t *off, block_acts *a, size_t B, size_t T, size_t C,
                         size_t NH, size_t A) {
    size_t BT = B * T, before;
    a->ln1 = take(base, off, BT * C * A);
    a->ln1_mean = take(base, off, BT * 4);
    a->ln1_rstd = take(base, off, BT * 4);
    before = *off;
    a->qkv = take(base, off, BT * 3 * C * A);
    a->atty = take(base, off, BT * C * A);
    a->att_lse = take(base, off, B * NH * T * 4);
    size_t att = *off - before;
    a->res2 = take(base, off, BT * C * 4);
    a->ln2 = take(base, off, BT * C * A);
    a->ln2_mean = take(base, off, BT * 4);
    a->ln2_rstd = take(base, off, BT * 4);
    a->fch = take(base, off, BT * 4 * C * A);
    a->fch_gelu = take(base, off, BT * 4 * C * A);
    return att;
}

/* Lay the activations out in m's arena, or, with m == NULL, only count the
 * bytes (every pointer is then NULL and written to a scratch model).
 * Order: per block its saved set (or only res3 when recomputed), the shared
 * scratch set, then the model's head and the backward scratch. */
static plan carve(dt_gpt *m, const dt_gpt_config *c, int B_, int T_, const dt_gpt_options *o) {
    size_t B = (size_t)B_, T = (size_t)T_, C = (size_t)c->dim, NH = (size_t)c->heads;
    size_t V = (size_t)c->vocab, BT = B * T, off = 0, A = act_size(o->precision);
    bool low = o->precision != DT_PRECISION_FP32;
    plan p = {0};
    dt_gpt scratch = {0};
    block_acts one; /* every layer of the scratch model */
    if (!m)
        m = &scratch;
    char *base = m->arena;
    bool any = false;
    for (int l = 0; l < c->layers; l++) {
        // cppcheck-suppress uninitvar ; `one` is only written here (planning pass)
        block_acts *a = m->acts ? &m->acts[l] : &one;
        size_t before = off;
        if (recomputed(o->recompute_every, l))
            any = true;
        else
            p.attention += take_block(base, &off, a, B, T, C, NH, A);
        a->res3 = take(base, &off, BT * C * 4);
        p.saved += off - before;
    }
    if (any) {
        size_t before = off;
        p.attention += take_block(base, &off, &m->shared, B, T, C, NH, A);
        p.recompute = off - before;
        for (int l = 0; m->acts && l < c->layers; l++)
            if (recomputed(o->recompute_every, l)) {
                float *res3 = m->acts[l].res3;
                m->acts[l] = m->shared;
                m->acts[l].res3 = res3;
            }
    }
    {
        size_t o2 = 0;
        take_block(NULL, &o2, &one, B, T, C, NH, A);
        p.block = o2 + dt_align_up(BT * C * 4, 64);
    }
    m->encoded = take(base, &off, BT * C * 4);
    p.saved += dt_align_up(BT * C * 4, 64);
    m->lnf = take(base, &off, BT * C * A);
    m->lnf_mean = take(base, &off, BT * 4);
    m->lnf_rstd = take(base, &off, BT * 4);
    /* The LM head: without recomputation the full (B,T,V) logits (the
     * contract of dt_gpt_logits); with it only the (B,T,Vb) chunk that
     * forward and backward (re)compute (and the last positions' logits,
     * in the scratch below). */
    bool chunked = o->recompute_every > 0;
    size_t Vb = (size_t)head_cols(c->vocab, BT), before = off;
    m->logits = chunked ? NULL : take(base, &off, BT * V * 4);
    m->chunk = chunked || Vb < V ? take(base, &off, BT * Vb * 4) : m->logits;
    p.logits = off - before;
    m->ce_lse = take(base, &off, BT * 4);
    m->losses = take(base, &off, BT * 4);
    m->dres = take(base, &off, BT * C * 4);
    m->dbuf = take(base, &off, BT * C * 4);
    /* Three lifetimes share one scratch region: dfch is only live in the
     * MLP part of a block's backward (and holds a part of dlnf in the
     * head's backward); dqkv (and the 16-bit attention workspace, also
     * used by forward and recomputation) only outside it; with
     * recomputation the last positions' logits (and their ln_f rows) from
     * the head's forward until the next backward or block forward, which
     * is what dt_gpt_logits() promises. */
    size_t phase = off, end;
    m->dfch = take(base, &off, BT * 4 * C * 4);
    end = off;
    off = phase;
    m->dqkv = take(base, &off, BT * 3 * C * A);
    m->attn_work =
        low ? take(base, &off, dt_attention16_workspace(B_, T_, c->dim, c->heads) * 4) : NULL;
    end = off > end ? off : end;
    off = phase;
    m->last = chunked ? take(base, &off, B * V * 4) : NULL;
    m->lnf_last = chunked ? take(base, &off, B * C * A) : NULL;
    off = off > end ? off : end;
    m->dres16 = low ? take(base, &off, BT * C * 2) : NULL;
    m->row16 = low ? take(base, &off, Vb * 2) : NULL;
    m->tokens = take(base, &off, BT * 4);
    m->targets = take(base, &off, BT * 4);
    p.total = off;
    return p;
}

void dt_gpt_memory_plan_with(const dt_gpt_config *c, int batch, int seq, const dt_gpt_options *opt,
                             dt_memory_report *r) {
    dt_gpt_options o = opt ? *opt : dt_gpt_options_default();
    plan p = carve(NULL, c, batch, seq, &o);
    size_t np = dt_gpt_config_num_params(c);
    r->params = np * sizeof(float);
    r->grads = np * sizeof(float);
    r->weights16 = o.precision == DT_PRECISION_FP32 ? 0 : np * 2;
    r->activations = p.total;
    r->attention = p.attention;
    r->attention_naive =
        (size_t)c->layers * batch * c->heads * (size_t)seq * seq * act_size(o.precision);
    r->logits = p.logits;
    r->saved = p.saved;
    r->recompute = p.recompute;
    r->block = p.block;
    r->precision = o.precision;
    r->recompute_every = o.recompute_every;
    r->layers = c->layers;
    r->batch = batch;
    r->seq = seq;
}

void dt_gpt_memory_plan(const dt_gpt_config *c, int batch, int seq, dt_memory_report *r) {
    dt_gpt_memory_plan_with(c, batch, seq, NULL, r);
}

void dt_gpt_memory(const dt_gpt *m, dt_memory_report *out) {
    dt_gpt_memory_plan_with(&m->cfg, m->max_B, m->max_T, &m->opt, out);
}

void dt_gpt_memory_print(const dt_memory_report *r, size_t optimizer_bytes, FILE *out) {
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], i[32], j[32], k[32], rc[32];
    fprintf(out,
            "memory (B=%d T=%d %s recompute %s): params %s, grads %s, optimizer %s%s%s, "
            "activations %s (saved by blocks %s, recompute scratch %s, one block %s, "
            "attention %s, logits %s; naive attention would add %s)\n",
            r->batch, r->seq, dt_precision_name(r->precision),
            dt_recompute_format(r->recompute_every, rc, sizeof rc),
            dt_format_bytes((double)r->params, a, sizeof a),
            dt_format_bytes((double)r->grads, b, sizeof b),
            dt_format_bytes((double)optimizer_bytes, c, sizeof c),
            r->weights16 ? ", 16-bit weights " : "",
            r->weights16 ? dt_format_bytes((double)r->weights16, j, sizeof j) : "",
            dt_format_bytes((double)r->activations, d, sizeof d),
            dt_format_bytes((double)r->saved, h, sizeof h),
            dt_format_bytes((double)r->recompute, i, sizeof i),
            dt_format_bytes((double)r->block, g, sizeof g),
            dt_format_bytes((double)r->attention, e, sizeof e),
            dt_format_bytes((double)r->logits, f, sizeof f),
            dt_format_bytes((double)r->attention_naive, k, sizeof k));
}

double dt_gpt_flops_per_token(const dt_gpt_config *c, int T) {
    /* 2 FLOPs per multiply-add. Per token and layer: qkv 6C^2, proj 2C^2,
     * mlp 16C^2; attention (causal, on average (T+1)/2 keys): scores and
     * weighted sum 2 * 2 * C * (T+1)/2. LM head 2 C V. */
    double C = c->dim, L = c->layers, V = c->vocab;
    return L * (24.0 * C * C + 2.0 * C * (T + 1)) + 2.0 * C * V;
}

/* ------------------------------------------------------------------------ */
/* Create / destroy / accessors                                             */
/* ------------------------------------------------------------------------ */

dt_gpt_options dt_gpt_options_default(void) {
    return (dt_gpt_options){.precision = DT_PRECISION_FP32, .recompute_every = 0};
}

dt_status dt_recompute_parse(const char *knob, const char *text, int *every) {
    long k;
    char *end;
    if (text && strcmp(text, "none") == 0) {
        *every = 0;
        return DT_OK;
    }
    if (text && strcmp(text, "blocks") == 0) {
        *every = 1;
        return DT_OK;
    }
    if (text && strncmp(text, "every:", 6) == 0 && text[6] >= '0' && text[6] <= '9') {
        errno = 0;
        k = strtol(text + 6, &end, 10);
        if (!*end && errno == 0 && k >= 1 && k <= (1 << 20)) {
            *every = (int)k;
            return DT_OK;
        }
    }
    return dt_error_set(DT_ERR_INVALID,
                        "%s '%s': expected none, blocks or every:K with K in [1, 1048576]", knob,
                        text ? text : "(null)");
}

char *dt_recompute_format(int every, char *buf, size_t len) {
    if (every <= 0)
        snprintf(buf, len, "none");
    else if (every == 1)
        snprintf(buf, len, "blocks");
    else
        snprintf(buf, len, "every:%d", every);
    return buf;
}

dt_status dt_gpt_create(dt_gpt **out, const dt_gpt_config *cfg, int max_batch, int max_seq) {
    return dt_gpt_create_with(out, cfg, max_batch, max_seq, NULL);
}

dt_status dt_gpt_create_with(dt_gpt **out, const dt_gpt_config *cfg, int max_batch, int max_seq,
                             const dt_gpt_options *opt) {
    *out = NULL;
    dt_gpt_options o = opt ? *opt : dt_gpt_options_default();
    if ((unsigned)o.precision >= DT_PRECISION_COUNT)
        return dt_error_set(DT_ERR_INVALID, "precision %d is not a dt_precision", (int)o.precision);
    if (o.recompute_every < 0)
        return dt_error_set(DT_ERR_INVALID, "recompute_every %d must be >= 0", o.recompute_every);
    if (o.recompute_every > (1 << 20))
        return dt_error_set(DT_ERR_INVALID, "recompute_every %d must be <= 1048576",
                            o.recompute_every);
    DT_CHECK(dt_gpt_config_validate(cfg));
    if (max_batch < 1 || max_batch > (1 << 20))
        return dt_error_set(DT_ERR_INVALID, "batch size %d must be in [1, 1048576]", max_batch);
    if (max_seq < 1 || max_seq > cfg->max_seq)
        return dt_error_set(DT_ERR_INVALID,
                            "sequence length %d must be in [1, %d] (the model's max_seq)", max_seq,
                            cfg->max_seq);
    (void)dt_tensor_threads(); /* first use: apply DT_THREADS, one thread pool */
    dt_gpt *m = dt_calloc(1, sizeof *m);
    if (!m)
        return DT_ERR_NOMEM;
    m->cfg = *cfg;
    m->opt = o;
    m->max_B = max_batch;
    m->max_T = max_seq;
    int L = cfg->layers;
    size_t C = (size_t)cfg->dim;
    m->nparams = dt_gpt_config_num_params(cfg);
    m->ntensors = 2 + (size_t)P_BLOCK_COUNT * L + 2;
    m->info = dt_calloc(m->ntensors, sizeof *m->info);
    m->names = dt_calloc(m->ntensors, 48);
    m->acts = dt_calloc((size_t)L, sizeof *m->acts);
    m->params = dt_alloc(m->nparams * sizeof(float));
    m->grads = dt_alloc(m->nparams * sizeof(float));
    bool low = o.precision != DT_PRECISION_FP32;
    m->w16 = low ? dt_alloc(m->nparams * sizeof(uint16_t)) : NULL;
    plan p = carve(NULL, cfg, max_batch, max_seq, &o);
    m->arena_bytes = p.total;
    m->arena = dt_alloc(p.total);
    if (!m->info || !m->names || !m->acts || !m->params || !m->grads || !m->arena ||
        (low && !m->w16)) {
        char a[32];
        dt_gpt_destroy(m);
        return dt_error_set(DT_ERR_NOMEM,
                            "cannot allocate a GPT with %zu parameters and %s of "
                            "activations",
                            dt_gpt_config_num_params(cfg),
                            dt_format_bytes((double)p.total, a, sizeof a));
    }
    memset(m->params, 0, m->nparams * sizeof(float));
    memset(m->grads, 0, m->nparams * sizeof(float));
    carve(m, cfg, max_batch, max_seq, &o);
    m->head_cols = head_cols(cfg->vocab, (size_t)max_batch * max_seq);

    /* The tensor table, in buffer order: each tensor's flat view (rows,
     * cols) and its global shape (the box is the whole tensor). */
    size_t off = 0, t = 0;
#define ADD(nm, r, c, dec, nd, d0, d1, d2)                                                         \
    do {                                                                                           \
        char *s = m->names + t * 48;                                                               \
        snprintf(s, 48, "%s", nm);                                                                 \
        m->info[t] = (dt_param_info){.name = s,                                                    \
                                     .offset = off,                                                \
                                     .rows = (r),                                                  \
                                     .cols = (c),                                                  \
                                     .decay = (dec),                                               \
                                     .ndim = (nd),                                                 \
                                     .shape = {(d0), (d1), (d2)},                                  \
                                     .extent = {(d0), (d1), (d2)}};                                \
        off += (size_t)(r) * (c);                                                                  \
        t++;                                                                                       \
    } while (0)
    ADD("wte", (size_t)cfg->vocab, C, true, 2, (size_t)cfg->vocab, C, 1);
    ADD("wpe", (size_t)cfg->max_seq, C, true, 2, (size_t)cfg->max_seq, C, 1);
    for (int l = 0; l < L; l++)
        for (int k = 0; k < P_BLOCK_COUNT; k++) {
            size_t r, c, shape[3];
            int nd = block_global_shape(k, C, shape);
            char nm[48];
            block_shape(k, C, &r, &c);
            snprintf(nm, sizeof nm, "h.%d.%s", l, block_names[k]);
            ADD(nm, r, c, r > 1, nd, shape[0], shape[1], shape[2]);
        }
    ADD("ln_f.weight", 1, C, false, 1, C, 1, 1);
    ADD("ln_f.bias", 1, C, false, 1, C, 1, 1);
#undef ADD
    DT_ASSERT(off == m->nparams && t == m->ntensors);
    *out = m;
    return DT_OK;
}

void dt_gpt_destroy(dt_gpt *m) {
    if (!m)
        return;
    dt_free(m->arena);
    dt_free(m->w16);
    dt_free(m->grads);
    dt_free(m->params);
    dt_free(m->acts);
    dt_free(m->names);
    dt_free(m->info);
    dt_free(m);
}

const dt_gpt_config *dt_gpt_get_config(const dt_gpt *m) { return &m->cfg; }
float *dt_gpt_params(dt_gpt *m) { return m->params; }
float *dt_gpt_grads(dt_gpt *m) { return m->grads; }
size_t dt_gpt_num_params(const dt_gpt *m) { return m->nparams; }
size_t dt_gpt_num_tensors(const dt_gpt *m) { return m->ntensors; }
const float *dt_gpt_logits(const dt_gpt *m) { return m->logits ? m->logits : m->last; }

const float *dt_gpt_last_logits(const dt_gpt *m, int b) {
    DT_ASSERT(b >= 0 && b < m->B);
    size_t V = (size_t)m->cfg.vocab;
    return m->logits ? m->logits + ((size_t)b * m->T + (size_t)m->T - 1) * V
                     : m->last + (size_t)b * V;
}

void dt_gpt_tensor_info(const dt_gpt *m, size_t i, dt_param_info *out) {
    DT_ASSERT(i < m->ntensors);
    *out = m->info[i];
}

void dt_gpt_zero_grads(dt_gpt *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

/* Pointer to block tensor k of layer l in buffer `buf` (params or grads). */
static inline float *bt(const dt_gpt *m, float *buf, int l, int k) {
    return buf + m->info[2 + (size_t)l * P_BLOCK_COUNT + k].offset;
}
/* First float of block l (or of ln_f when l == L). */
static inline size_t block_offset(const dt_gpt *m, int l) {
    return m->info[2 + (size_t)l * P_BLOCK_COUNT].offset;
}

void dt_gpt_init_params(dt_gpt *m, uint64_t seed) {
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)m->cfg.layers);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < m->ntensors; i++) {
        const dt_param_info *p = &m->info[i];
        float *w = m->params + p->offset;
        size_t n = p->rows * p->cols;
        const char *nm = p->name;
        size_t len = strlen(nm);
        bool is_bias = len >= 4 && strcmp(nm + len - 4, "bias") == 0;
        bool is_ln = strstr(nm, "ln_") != NULL;
        if (is_bias) {
            memset(w, 0, n * sizeof(float));
        } else if (is_ln) {
            for (size_t j = 0; j < n; j++)
                w[j] = 1.0f;
        } else {
            float s = strstr(nm, "c_proj") ? proj_std : std;
            dt_rng r;
            dt_rng_init(&r, seed, dt_rng_stream_id(0, i, DT_RNG_INIT));
            for (size_t j = 0; j < n; j++)
                w[j] = s * dt_rng_normal(&r);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Forward                                                                  */
/* ------------------------------------------------------------------------ */

/* The 16-bit copy of block tensor k of layer l (bf16/fp16 only). */
static inline const uint16_t *wt(const dt_gpt *m, int l, int k) {
    return m->w16 + m->info[2 + (size_t)l * P_BLOCK_COUNT + k].offset;
}

/* bf16/fp16: round all parameters into w16, once per forward (the master
 * copy may have changed since). Chunks in parallel; each chunk's rounding
 * is exact per element, so the thread count cannot change the result. */
static void cast_weights(dt_gpt *m) {
    const size_t chunk = (size_t)1 << 16, n = m->nparams;
    const long nchunks = (long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < nchunks; i++) {
        size_t o = (size_t)i * chunk, k = n - o < chunk ? n - o : chunk;
        dt_act16_from_f32(m->opt.precision, m->w16 + o, m->params + o, k);
    }
}

/* Block l's forward from its input x (the residual stream) into m->acts[l].
 * With `full` false it stops once everything backward reads is there: a
 * recomputation skips the MLP's c_proj and res3 (already kept). The calls
 * and their arguments are the same in both cases, so a recomputed
 * activation is bit-identical to the one forward produced.
 * fp32: each residual add also runs the LayerNorm that reads its sum next
 * (dt_residual_layernorm_forward): res2 with ln_2, and res3 with the next
 * block's ln_1 (or ln_f after the last block), so a full forward of block
 * l + 1 finds its ln_1 done (ln1_done). A recomputation computes ln_1 from
 * the kept input with dt_layernorm_forward: the same bits. */
static dt_status block_forward(dt_gpt *m, int l, const float *x, bool full, bool ln1_done) {
    const int B = m->B, T = m->T, C = m->cfg.dim, NH = m->cfg.heads, N = B * T;
    const dt_precision pr = m->opt.precision;
    float *p = m->params;
    const block_acts *a = &m->acts[l];
    if (pr == DT_PRECISION_FP32) {
        if (!ln1_done)
            dt_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, bt(m, p, l, P_LN1W),
                                 bt(m, p, l, P_LN1B), N, C);
        dt_matmul_forward(a->qkv, a->ln1, bt(m, p, l, P_QKVW), bt(m, p, l, P_QKVB), N, C, 3 * C);
        dt_attention_forward(a->atty, a->att_lse, a->qkv, B, T, C, NH);
        /* The biases of c_proj and c_fc are added by the pass that reads
         * the product next (residual add, GELU), not seeded into the
         * product's output: one write and one read of that output fewer. */
        dt_matmul_forward(m->dbuf, a->atty, bt(m, p, l, P_ATTPROJW), NULL, N, C, C);
        dt_residual_layernorm_forward(a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, x, m->dbuf,
                                      bt(m, p, l, P_ATTPROJB), bt(m, p, l, P_LN2W),
                                      bt(m, p, l, P_LN2B), N, C);
        dt_matmul_forward(a->fch, a->ln2, bt(m, p, l, P_FCW), NULL, N, C, 4 * C);
        dt_gelu_bias_forward(a->fch_gelu, a->fch, bt(m, p, l, P_FCB), N, 4 * C);
        if (!full)
            return DT_OK;
        dt_matmul_forward(m->dbuf, a->fch_gelu, bt(m, p, l, P_FCPROJW), NULL, N, 4 * C, C);
        if (l + 1 < m->cfg.layers) {
            const block_acts *nx = &m->acts[l + 1];
            dt_residual_layernorm_forward(a->res3, nx->ln1, nx->ln1_mean, nx->ln1_rstd, a->res2,
                                          m->dbuf, bt(m, p, l, P_FCPROJB), bt(m, p, l + 1, P_LN1W),
                                          bt(m, p, l + 1, P_LN1B), N, C);
        } else {
            const size_t lnw = m->info[m->ntensors - 2].offset,
                         lnb = m->info[m->ntensors - 1].offset;
            dt_residual_layernorm_forward(a->res3, m->lnf, m->lnf_mean, m->lnf_rstd, a->res2,
                                          m->dbuf, bt(m, p, l, P_FCPROJB), p + lnw, p + lnb, N, C);
        }
        return DT_OK;
    }
    /* bf16/fp16: a16 activations, fp32 residual stream and statistics; the
     * c_proj outputs are fp32 so the residual adds are exact fp32 adds. */
    dt_layernorm16_forward(pr, a->ln1, a->ln1_mean, a->ln1_rstd, x, bt(m, p, l, P_LN1W),
                           bt(m, p, l, P_LN1B), N, C);
    DT_CHECK(dt_linear16_forward(pr, a->qkv, false, a->ln1, wt(m, l, P_QKVW), bt(m, p, l, P_QKVB),
                                 N, C, 3 * C));
    dt_attention16_forward(pr, a->atty, a->att_lse, a->qkv, B, T, C, NH, m->attn_work);
    DT_CHECK(dt_linear16_forward(pr, m->dbuf, true, a->atty, wt(m, l, P_ATTPROJW),
                                 bt(m, p, l, P_ATTPROJB), N, C, C));
    dt_residual_forward(a->res2, x, m->dbuf, (size_t)N * C);
    dt_layernorm16_forward(pr, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, bt(m, p, l, P_LN2W),
                           bt(m, p, l, P_LN2B), N, C);
    DT_CHECK(dt_linear16_forward(pr, a->fch, false, a->ln2, wt(m, l, P_FCW), bt(m, p, l, P_FCB), N,
                                 C, 4 * C));
    dt_gelu16_forward(pr, a->fch_gelu, a->fch, (size_t)N * 4 * C);
    if (!full)
        return DT_OK;
    DT_CHECK(dt_linear16_forward(pr, m->dbuf, true, a->fch_gelu, wt(m, l, P_FCPROJW),
                                 bt(m, p, l, P_FCPROJB), N, 4 * C, C));
    dt_residual_forward(a->res3, a->res2, m->dbuf, (size_t)N * C);
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* LM head in vocabulary chunks                                             */
/* ------------------------------------------------------------------------ */
/*
 * The tied head, logits (N,V) = lnf (N,C) wte^T, runs over column chunks
 * [v0, v0 + w) of the vocabulary (w = head_cols; the last chunk may be
 * narrower) in EVERY mode, so that recomputation is bit-identical to none by
 * construction:
 *  - each chunk is the same GEMM call on the same inputs, whether forward
 *    writes it (and, without recomputation, copies it into the full logits)
 *    or backward recomputes it;
 *  - the loss's log-sum-exp of a row merges the chunks' in chunk order;
 *  - backward turns a chunk into dlogits in place and does its two GEMMs:
 *    dwte rows [v0, v0+w) += dchunk^T lnf (a whole K = N reduction: each
 *    dwte row is written by one GEMM, as without chunks), and dlnf +=
 *    dchunk wte[v0:v0+w) (a split of the V reduction, summed in chunk order
 *    into an (N,C) buffer: cheap, N·C per chunk).
 * Chunking rows instead would split dwte's K = N reduction and read and
 * write the whole (V,C) dwte once per chunk (~300 MB for gpt2-124m).
 * With one chunk (V <= head_cols: tiny, shakespeare-char) every call is
 * the unchunked one: the same kernels, the same bits as before chunking.
 * The per-chunk loops between the GEMMs (copies, log-sum-exp, dlogits) are
 * serial on purpose: an OpenMP region there leaves its threads spinning
 * while OpenBLAS's own threads run the next chunk's GEMM; with 50 chunks
 * that made the gpt2-124m fp32 head forward 4.6x slower. Serial, they
 * cost ~N·V exponentials per pass, small next to the GEMMs' 2·N·V·C FLOPs.
 */

/* The chunk [v0, v0+w) of the logits of the N ln_f rows `in` (m->lnf, or
 * the last positions' rows), into out (N,w). */
static dt_status head_gemm(dt_gpt *m, float *out, const void *in, int N, int v0, int w) {
    const int C = m->cfg.dim;
    size_t off = m->info[0].offset + (size_t)v0 * C;
    if (m->opt.precision == DT_PRECISION_FP32) {
        dt_matmul_forward(out, in, m->params + off, NULL, N, C, w);
        return DT_OK;
    }
    return dt_linear16_forward(m->opt.precision, out, true, in, m->w16 + off, NULL, N, C, w);
}

/* Forward of the head: logits chunk by chunk; with targets the loss rows
 * (ce_lse, losses) and their mean. Without recomputation the full logits
 * are kept; with it, the last positions' logits. */
static dt_status head_forward(dt_gpt *m, bool targets, float *mean_loss) {
    const int B = m->B, T = m->T, N = B * T, V = m->cfg.vocab, hc = m->head_cols;
    *mean_loss = 0.0f;
    if (hc >= V) { /* one chunk: the unchunked computation */
        DT_CHECK(head_gemm(m, m->chunk, m->lnf, N, 0, V));
        if (targets)
            *mean_loss = dt_crossentropy_forward(m->losses, m->ce_lse, m->chunk, m->targets, N, V);
        for (int b = 0; m->last && b < B; b++)
            memcpy(m->last + (size_t)b * V, m->chunk + ((size_t)b * T + T - 1) * V,
                   sizeof(float) * V);
        return DT_OK;
    }
    for (int v0 = 0; v0 < V; v0 += hc) {
        const int w = V - v0 < hc ? V - v0 : hc;
        const float *x = m->chunk;
        DT_CHECK(head_gemm(m, m->chunk, m->lnf, N, v0, w));
        if (m->logits) {
            for (int i = 0; i < N; i++)
                memcpy(m->logits + (size_t)i * V + v0, x + (size_t)i * w, sizeof(float) * w);
        }
        for (int b = 0; m->last && b < B; b++)
            memcpy(m->last + (size_t)b * V + v0, x + ((size_t)b * T + T - 1) * w,
                   sizeof(float) * w);
        if (!targets)
            continue;
        /* ce_lse: the running log-sum-exp; losses: the target's logit. */
        for (int i = 0; i < N; i++) {
            float l = dt__lse(x + (size_t)i * w, (size_t)w);
            if (v0 == 0) {
                m->ce_lse[i] = l;
            } else {
                float a = m->ce_lse[i], hi = a > l ? a : l;
                m->ce_lse[i] = hi + log1pf(expf(-fabsf(a - l)));
            }
            int t = m->targets[i] - v0;
            if (t >= 0 && t < w)
                m->losses[i] = x[(size_t)i * w + t];
        }
    }
    if (targets) {
        double total = 0.0;
        for (int i = 0; i < N; i++) {
            m->losses[i] = m->ce_lse[i] - m->losses[i];
            total += m->losses[i];
        }
        *mean_loss = (float)(total / N);
    }
    return DT_OK;
}

dt_status dt_gpt_forward(dt_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                         float *mean_loss) {
    const int L = m->cfg.layers, C = m->cfg.dim, V = m->cfg.vocab;
    const dt_precision pr = m->opt.precision;
    if (B < 1 || B > m->max_B || T < 1 || T > m->max_T)
        return dt_error_set(
            DT_ERR_INVALID,
            "forward with B=%d T=%d, but the model was created for B <= %d, T <= %d", B, T,
            m->max_B, m->max_T);
    const int N = B * T;
    for (int i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return dt_error_set(DT_ERR_INVALID, "input token %d at position %d is outside [0, %d)",
                                inputs[i], i, V);
        if (targets && (targets[i] < 0 || targets[i] >= V))
            return dt_error_set(DT_ERR_INVALID, "target token %d at position %d is outside [0, %d)",
                                targets[i], i, V);
    }
    m->B = B;
    m->T = T;
    m->have_targets = false;
    memcpy(m->tokens, inputs, sizeof(int32_t) * N);
    float *p = m->params;
    if (pr != DT_PRECISION_FP32)
        cast_weights(m);

    dt_embedding_forward(m->encoded, m->tokens, p + m->info[0].offset, p + m->info[1].offset, B, T,
                         C);
    const float *x = m->encoded; // (B,T,C) residual stream entering the block
    for (int l = 0; l < L; l++) {
        /* fp32: block l - 1 wrote block l's ln_1 (and the last block ln_f). */
        DT_CHECK(block_forward(m, l, x, true, pr == DT_PRECISION_FP32 && l > 0));
        x = m->acts[l].res3;
    }
    const dt_param_info *lnw = &m->info[m->ntensors - 2], *lnb = &m->info[m->ntensors - 1];
    if (pr != DT_PRECISION_FP32)
        dt_layernorm16_forward(pr, m->lnf, m->lnf_mean, m->lnf_rstd, x, p + lnw->offset,
                               p + lnb->offset, N, C);
    if (!targets && !m->logits) {
        /* Recomputation, no loss: only the last positions' logits. */
        size_t row = (size_t)C * act_size(pr);
        for (int b = 0; b < B; b++)
            memcpy((char *)m->lnf_last + (size_t)b * row,
                   (const char *)m->lnf + ((size_t)b * T + (size_t)T - 1) * row, row);
        return head_gemm(m, m->last, m->lnf_last, B, 0, V);
    }
    if (targets)
        memcpy(m->targets, targets, sizeof(int32_t) * N);
    float loss;
    DT_CHECK(head_forward(m, targets != NULL, &loss));
    if (targets) {
        if (mean_loss)
            *mean_loss = loss;
        m->have_targets = true;
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                 */
/* ------------------------------------------------------------------------ */

/* bf16/fp16: round a dlogits chunk (N,V), fp32, to a16 packed at
 * the front of the same memory, without a second (N,V) buffer. Row 0's
 * destination overlaps its source, so it goes through row16. After that,
 * rows [r, 2r) are written to bytes [2rV, 4rV) and read from [4rV, 8rV):
 * destination and source of a call never overlap, and what a call
 * overwrites are the sources of rows < r, already converted. */
static const uint16_t *head_dout16(dt_gpt *m, float *buf, size_t N, size_t V) {
    const dt_precision pr = m->opt.precision;
    const float *in = buf;
    uint16_t *out = (uint16_t *)(void *)buf;
    dt_act16_from_f32(pr, m->row16, in, V);
    memcpy(out, m->row16, V * sizeof(uint16_t));
    for (size_t r = 1; r < N; r *= 2) {
        size_t e = 2 * r < N ? 2 * r : N;
        dt_act16_from_f32(pr, out + r * V, in + r * V, (e - r) * V);
    }
    return out;
}

/* dlogits of chunk x (N,w) = columns [v0, v0+w), in place: scale *
 * (softmax - onehot), with dt_crossentropy_backward's row kernel. */
static void chunk_dlogits(dt_gpt *m, float *x, int N, int v0, int w, float scale) {
    for (int i = 0; i < N; i++) {
        float *d = x + (size_t)i * w;
        dt__exp_shift_scale(d, d, m->ce_lse[i], scale, (size_t)w);
        int t = m->targets[i] - v0;
        if (t >= 0 && t < w)
            d[t] -= scale;
    }
}

/* Backward of the head, chunk by chunk: m->dbuf receives dlnf (N,C) and
 * dwte accumulates. A chunk's logits come from the full logits (no
 * recomputation) or are recomputed by the forward's GEMM call. dfch, idle
 * until the blocks' backward, holds one chunk's part of dlnf. */
static dt_status head_backward(dt_gpt *m, float scale, dt_grad_mode mode) {
    const int N = m->B * m->T, V = m->cfg.vocab, C = m->cfg.dim, hc = m->head_cols;
    const dt_precision pr = m->opt.precision;
    const size_t wte = m->info[0].offset;
    for (int v0 = 0; v0 < V; v0 += hc) {
        const int w = V - v0 < hc ? V - v0 : hc;
        float *x = m->chunk, *dst = v0 == 0 ? m->dbuf : m->dfch;
        if (!m->logits)
            DT_CHECK(head_gemm(m, x, m->lnf, N, v0, w));
        else if (x != m->logits)
            for (int i = 0; i < N; i++)
                memcpy(x + (size_t)i * w, m->logits + (size_t)i * V + v0, sizeof(float) * w);
        if (w == V)
            dt_crossentropy_backward(x, x, m->ce_lse, m->targets, scale, N, V);
        else
            chunk_dlogits(m, x, N, v0, w, scale);
        /* dlnf (N,C) (+)= dchunk @ wte[v0:v0+w); dwte[v0:v0+w) += dchunk^T @ lnf. */
        if (pr == DT_PRECISION_FP32)
            dt_matmul_backward_mode(dst, m->grads + wte + (size_t)v0 * C, NULL, x, m->lnf,
                                    m->params + wte + (size_t)v0 * C, N, C, w, mode);
        else
            DT_CHECK(dt_linear16_backward_mode(pr, dst, m->grads + wte + (size_t)v0 * C, NULL,
                                               head_dout16(m, x, (size_t)N, (size_t)w), m->lnf,
                                               m->w16 + wte + (size_t)v0 * C, N, C, w, mode));
        if (v0 > 0)
            for (size_t k = 0; k < (size_t)N * C; k++)
                m->dbuf[k] += dst[k];
    }
    return DT_OK;
}

/* Block l's backward: m->dres holds d(res3) on entry and d(x) on return;
 * parameter gradients are written into m->grads per mode. */
static dt_status block_backward(dt_gpt *m, int l, const float *x, dt_grad_mode mode) {
    const int B = m->B, T = m->T, C = m->cfg.dim, NH = m->cfg.heads, N = B * T;
    const dt_precision pr = m->opt.precision;
    float *p = m->params, *g = m->grads;
    const block_acts *a = &m->acts[l];
    if (pr == DT_PRECISION_FP32) {
        /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))). */
        dt_matmul_backward_mode(m->dfch, bt(m, g, l, P_FCPROJW), bt(m, g, l, P_FCPROJB), m->dres,
                                a->fch_gelu, bt(m, p, l, P_FCPROJW), N, 4 * C, C, mode);
        dt_gelu_bias_backward(m->dfch, a->fch, bt(m, p, l, P_FCB), m->dfch, N, 4 * C);
        dt_matmul_backward_mode(m->dbuf, bt(m, g, l, P_FCW), bt(m, g, l, P_FCB), m->dfch, a->ln2,
                                bt(m, p, l, P_FCW), N, C, 4 * C, mode);
        dt_layernorm_backward_mode(m->dres, bt(m, g, l, P_LN2W), bt(m, g, l, P_LN2B), m->dbuf,
                                   a->res2, bt(m, p, l, P_LN2W), a->ln2_mean, a->ln2_rstd, N, C,
                                   mode);
        /* m->dres now holds d(res2). Attention: res2 = x + c_proj(attn(c_attn(ln_1(x)))). */
        dt_matmul_backward_mode(m->dbuf, bt(m, g, l, P_ATTPROJW), bt(m, g, l, P_ATTPROJB), m->dres,
                                a->atty, bt(m, p, l, P_ATTPROJW), N, C, C, mode);
        dt_attention_backward(m->dqkv, m->dbuf, a->qkv, a->atty, a->att_lse, B, T, C, NH);
        dt_matmul_backward_mode(m->dbuf, bt(m, g, l, P_QKVW), bt(m, g, l, P_QKVB), m->dqkv, a->ln1,
                                bt(m, p, l, P_QKVW), N, C, 3 * C, mode);
        dt_layernorm_backward_mode(m->dres, bt(m, g, l, P_LN1W), bt(m, g, l, P_LN1B), m->dbuf, x,
                                   bt(m, p, l, P_LN1W), a->ln1_mean, a->ln1_rstd, N, C, mode);
        return DT_OK;
    }
    /* bf16/fp16: the same steps; a gradient entering a 16-bit multiply is
     * rounded to a16 (dres16, dfch16, dqkv), the others stay fp32. Backward
     * runs once per forward, so a saved activation that is dead may be
     * overwritten. */
    dt_act16_from_f32(pr, m->dres16, m->dres, (size_t)N * C);
    DT_CHECK(dt_linear16_backward_mode(pr, m->dfch, bt(m, g, l, P_FCPROJW), bt(m, g, l, P_FCPROJB),
                                       m->dres16, a->fch_gelu, wt(m, l, P_FCPROJW), N, 4 * C, C,
                                       mode));
    /* The GELU output was only needed for c_proj's weight gradient: its
     * memory now takes the rounded gradient of the c_fc output. */
    uint16_t *dfch16 = a->fch_gelu;
    dt_gelu16_backward(pr, dfch16, a->fch, m->dfch, (size_t)N * 4 * C);
    DT_CHECK(dt_linear16_backward_mode(pr, m->dbuf, bt(m, g, l, P_FCW), bt(m, g, l, P_FCB), dfch16,
                                       a->ln2, wt(m, l, P_FCW), N, C, 4 * C, mode));
    dt_layernorm_backward_mode(m->dres, bt(m, g, l, P_LN2W), bt(m, g, l, P_LN2B), m->dbuf, a->res2,
                               bt(m, p, l, P_LN2W), a->ln2_mean, a->ln2_rstd, N, C, mode);
    dt_act16_from_f32(pr, m->dres16, m->dres, (size_t)N * C);
    DT_CHECK(dt_linear16_backward_mode(pr, m->dbuf, bt(m, g, l, P_ATTPROJW),
                                       bt(m, g, l, P_ATTPROJB), m->dres16, a->atty,
                                       wt(m, l, P_ATTPROJW), N, C, C, mode));
    dt_attention16_backward(pr, m->dqkv, m->dbuf, a->qkv, a->atty, a->att_lse, B, T, C, NH,
                            m->attn_work);
    DT_CHECK(dt_linear16_backward_mode(pr, m->dbuf, bt(m, g, l, P_QKVW), bt(m, g, l, P_QKVB),
                                       m->dqkv, a->ln1, wt(m, l, P_QKVW), N, C, 3 * C, mode));
    dt_layernorm_backward_mode(m->dres, bt(m, g, l, P_LN1W), bt(m, g, l, P_LN1B), m->dbuf, x,
                               bt(m, p, l, P_LN1W), a->ln1_mean, a->ln1_rstd, N, C, mode);
    return DT_OK;
}

dt_status dt_gpt_backward(dt_gpt *m, float grad_scale, dt_grad_ready_fn hook, void *user) {
    return dt_gpt_backward_mode(m, grad_scale, DT_GRAD_ACCUMULATE, hook, user);
}

dt_status dt_gpt_backward_mode(dt_gpt *m, float grad_scale, dt_grad_mode mode,
                               dt_grad_ready_fn hook, void *user) {
    if ((unsigned)mode > DT_GRAD_OVERWRITE)
        return dt_error_set(DT_ERR_INVALID, "backward: grad mode %d is not a dt_grad_mode",
                            (int)mode);
    if (!m->have_targets)
        return dt_error_set(DT_ERR_INVALID,
                            "backward needs a preceding forward with targets (and only one "
                            "backward per forward)");
    m->have_targets = false; /* the logits are about to become dlogits */
    const int L = m->cfg.layers, C = m->cfg.dim;
    const int B = m->B, T = m->T, N = B * T;
    float *p = m->params, *g = m->grads;
    const dt_param_info *wte = &m->info[0], *wpe = &m->info[1];
    const dt_param_info *lnw = &m->info[m->ntensors - 2], *lnb = &m->info[m->ntensors - 1];

    DT_CHECK(head_backward(m, grad_scale / (float)N, mode));
    const float *xL = L > 0 ? m->acts[L - 1].res3 : m->encoded;
    memset(m->dres, 0, sizeof(float) * (size_t)N * C);
    dt_layernorm_backward_mode(m->dres, g + lnw->offset, g + lnb->offset, m->dbuf, xL,
                               p + lnw->offset, m->lnf_mean, m->lnf_rstd, N, C, mode);

    for (int l = L - 1; l >= 0; l--) {
        const float *x = l > 0 ? m->acts[l - 1].res3 : m->encoded;
        /* A recomputed block refills the shared set from its kept input. */
        if (recomputed(m->opt.recompute_every, l))
            DT_CHECK(block_forward(m, l, x, false, false));
        DT_CHECK(block_backward(m, l, x, mode));
        /* m->dres holds d(x); every gradient from block l onwards is final. */
        if (hook)
            hook(user, block_offset(m, l));
    }
    /* wte: the head wrote it (per mode), the token embedding adds to it. wpe:
     * rows [0,T) per mode; overwriting, the rows past T get their zero
     * gradient here (no kernel writes them). */
    dt_embedding_backward_mode(g + wte->offset, g + wpe->offset, m->dres, m->tokens, B, T, C, mode);
    if (mode == DT_GRAD_OVERWRITE)
        memset(g + wpe->offset + (size_t)T * C, 0,
               sizeof(float) * ((size_t)m->cfg.max_seq - (size_t)T) * C);
    if (hook)
        hook(user, 0);
    return DT_OK;
}
