/*
 * gpt.c — the GPT model's layout: configurations, the parameter tensors of
 * a model part (a layer range and a tensor-parallel shard), the activation
 * arena and the memory report (one function plans both), creation and
 * initialisation. Forward and backward are gpt_pass.c.
 *
 * Invariants:
 *  - params and grads are two flat buffers with the same layer-major layout
 *    (see nn.h); every tensor is a view (offset, rows, cols) holding the
 *    box [begin, begin + extent) of its global tensor.
 *  - A tensor-parallel shard splits c_attn by heads (each rank the q, k and
 *    v rows of its heads), c_fc by output rows, both c_proj by input
 *    columns and wte by vocabulary rows (V padded to a multiple of tp, the
 *    padding rows zero and masked); LayerNorms, wpe and the c_proj biases
 *    are held whole by every rank (owner: tp rank 0).
 *  - All activations live in one arena carved at create time for
 *    (max_batch, max_seq, precision, recompute_every, part), in bytes; a
 *    pass with smaller B, T uses the front of each region with compact
 *    strides. forward/backward do not allocate, so the arena is the peak.
 *  - The LM head runs in vocabulary chunks of head_cols columns in every
 *    mode; head_cols depends only on (Vl, max_batch * max_seq), so models
 *    created with the same sizes chunk alike.
 */
#include "gpt_internal.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const block_names[P_BLOCK_COUNT] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias",
};
_Static_assert(sizeof block_names / sizeof block_names[0] == P_BLOCK_COUNT, "block_names");

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

/* The part, normalised: 0 chunks means one chunk of all the blocks,
 * tp_size 0 means 1. */
static dt_gpt_part part_of(const dt_gpt_config *c, const dt_gpt_part *p) {
    dt_gpt_part q = *p;
    if (q.chunks == 0) {
        q.chunks = 1;
        q.layers[0] = (dt_layer_range){0, c->layers};
    }
    if (q.tp_size == 0)
        q.tp_size = 1;
    if (q.cp_size == 0)
        q.cp_size = 1;
    return q;
}

dt_status dt_gpt_part_validate(const dt_gpt_config *c, const dt_gpt_part *part, int max_seq) {
    if (part->chunks < 0 || part->chunks > DT_GPT_MAX_CHUNKS)
        return dt_error_set(DT_ERR_INVALID, "model part: %d chunks (at most %d)", part->chunks,
                            DT_GPT_MAX_CHUNKS);
    dt_gpt_part p = part_of(c, part);
    for (int k = 0; k < p.chunks; k++) {
        dt_layer_range r = p.layers[k];
        int floor = k > 0 ? p.layers[k - 1].end : 0;
        if (r.begin < floor || r.end > c->layers || r.begin >= r.end)
            return dt_error_set(DT_ERR_INVALID,
                                "model part: chunk %d's layers [%d, %d) are not a non-empty range "
                                "of the model's %d after block %d",
                                k, r.begin, r.end, c->layers, floor);
    }
    if (p.tp_size < 1 || p.tp_rank < 0 || p.tp_rank >= p.tp_size)
        return dt_error_set(DT_ERR_INVALID, "model part: tensor-parallel rank %d of %d", p.tp_rank,
                            p.tp_size);
    if (c->heads % p.tp_size != 0)
        return dt_error_set(DT_ERR_INVALID,
                            "--tp %d does not divide the model's %d attention heads (tensor "
                            "parallelism splits attention by heads)",
                            p.tp_size, c->heads);
    if (p.tp_size > 1 && !p.regions)
        return dt_error_set(DT_ERR_INVALID,
                            "model part: tensor parallelism (tp %d) needs its communication "
                            "points (dt_gpt_part.regions)",
                            p.tp_size);
    if (p.sequence_parallel && p.tp_size == 1)
        return dt_error_set(DT_ERR_INVALID,
                            "--sp (sequence parallelism) needs tensor parallelism (--tp > 1)");
    if (p.sequence_parallel && max_seq % p.tp_size != 0)
        return dt_error_set(DT_ERR_INVALID,
                            "--sp: the sequence length %d is not a multiple of --tp %d (sequence "
                            "parallelism gives every rank 1/tp of the tokens)",
                            max_seq, p.tp_size);
    if (p.cp_size < 1 || p.cp_rank < 0 || p.cp_rank >= p.cp_size)
        return dt_error_set(DT_ERR_INVALID, "model part: context-parallel rank %d of %d", p.cp_rank,
                            p.cp_size);
    if (p.cp_size == 1)
        return DT_OK;
    if (!p.cp_regions)
        return dt_error_set(DT_ERR_INVALID,
                            "model part: context parallelism (cp %d) needs its communication "
                            "points (dt_gpt_part.cp_regions)",
                            p.cp_size);
    if (p.cp_mode == DT_CP_ULYSSES && (c->heads / p.tp_size) % p.cp_size != 0)
        return dt_error_set(DT_ERR_INVALID,
                            "--cp-mode ulysses: --cp %d does not divide the %d attention heads%s "
                            "(each rank attends to 1/cp of them); use --cp-mode ring",
                            p.cp_size, c->heads / p.tp_size,
                            p.tp_size > 1 ? " per tensor-parallel rank" : "");
    int split = p.cp_mode == DT_CP_RING ? 2 * p.cp_size : p.cp_size;
    if (max_seq % split != 0)
        return dt_error_set(
            DT_ERR_INVALID, "--cp %d (%s): the sequence length %d is not a multiple of %d (%s)",
            p.cp_size, dt_cp_mode_name(p.cp_mode), max_seq, split,
            p.cp_mode == DT_CP_RING ? "ring attention gives every rank 2 of 2 cp equal chunks"
                                    : "every rank holds T/cp tokens");
    if (p.sequence_parallel && (max_seq / p.cp_size) % p.tp_size != 0)
        return dt_error_set(DT_ERR_INVALID,
                            "--sp with --cp %d: a rank's %d tokens are not a multiple of --tp %d",
                            p.cp_size, max_seq / p.cp_size, p.tp_size);
    return DT_OK;
}

static gpt_dims dims_of(const dt_gpt_config *c, const dt_gpt_part *part) {
    dt_gpt_part p = part_of(c, part);
    gpt_dims d;
    memset(&d, 0, sizeof d);
    d.nch = p.chunks;
    for (int k = 0; k < p.chunks; k++) {
        d.ch[k] = p.layers[k];
        d.base[k] = d.nl;
        d.nl += p.layers[k].end - p.layers[k].begin;
    }
    d.first = d.ch[0].begin == 0;
    d.last = d.ch[d.nch - 1].end == c->layers;
    d.tp = p.tp_size;
    d.r = p.tp_rank;
    d.sp = p.sequence_parallel;
    d.C = c->dim;
    d.NH = c->heads;
    d.Ct = c->dim / d.tp;
    d.NHt = c->heads / d.tp;
    d.Ft = 4 * c->dim / d.tp;
    d.V = c->vocab;
    d.Vp = (c->vocab + d.tp - 1) / d.tp * d.tp;
    d.Vl = d.Vp / d.tp;
    d.cp = p.cp_size;
    d.cr = p.cp_rank;
    d.cpm = p.cp_mode;
    return d;
}

/* Where block tensor k lives in a shard: its flat view here and the box
 * of its global tensor (see the file comment). c_attn is (3, C, C) and
 * (3, C) globally, so that a rank's heads, rows [r Ct, (r+1) Ct) of each of
 * q, k and v, are one box. */
typedef struct tensor_place {
    size_t rows, cols; /* the flat view here */
    int ndim;          /* of the global tensor */
    size_t shape[3], begin[3], extent[3];
} tensor_place;

static tensor_place block_tensor(int k, const gpt_dims *d) {
    const size_t C = (size_t)d->C, Ct = (size_t)d->Ct, Ft = (size_t)d->Ft, r = (size_t)d->r;
    // clang-format off
    switch (k) {
    case P_QKVW:    /* column-parallel by heads */
        return (tensor_place){3 * Ct, C, 3, {3, C, C}, {0, r * Ct, 0}, {3, Ct, C}};
    case P_QKVB:
        return (tensor_place){1, 3 * Ct, 2, {3, C, 1}, {0, r * Ct, 0}, {3, Ct, 1}};
    case P_ATTPROJW: /* row-parallel: input columns */
        return (tensor_place){C, Ct, 2, {C, C, 1}, {0, r * Ct, 0}, {C, Ct, 1}};
    case P_FCW:     /* column-parallel: output rows */
        return (tensor_place){Ft, C, 2, {4 * C, C, 1}, {r * Ft, 0, 0}, {Ft, C, 1}};
    case P_FCB:
        return (tensor_place){1, Ft, 1, {4 * C, 1, 1}, {r * Ft, 0, 0}, {Ft, 1, 1}};
    case P_FCPROJW: /* row-parallel: input columns */
        return (tensor_place){C, Ft, 2, {C, 4 * C, 1}, {0, r * Ft, 0}, {C, Ft, 1}};
    default:        /* LayerNorms and the row-parallel biases: whole on every rank */
        return (tensor_place){1, C, 1, {C, 1, 1}, {0, 0, 0}, {C, 1, 1}};
    }
    // clang-format on
}

/* Whether every tensor-parallel rank holds block tensor k whole. */
static bool block_replicated(int k) {
    return k == P_LN1W || k == P_LN1B || k == P_ATTPROJB || k == P_LN2W || k == P_LN2B ||
           k == P_FCPROJB;
}

static size_t block_params(const gpt_dims *d) {
    size_t n = 0;
    for (int k = 0; k < P_BLOCK_COUNT; k++) {
        tensor_place t = block_tensor(k, d);
        n += t.rows * t.cols;
    }
    return n;
}

/* Parameters of a part: wte on the first stage and (a tied copy) on the
 * last, wpe on the first, its blocks, ln_f on the last. */
static size_t part_params(const dt_gpt_config *c, const gpt_dims *d) {
    size_t C = (size_t)c->dim, n = (size_t)d->nl * block_params(d);
    if (d->first || d->last)
        n += (size_t)d->Vl * C;
    if (d->first)
        n += (size_t)c->max_seq * C;
    if (d->last)
        n += 2 * C;
    return n;
}

size_t dt_gpt_config_num_params(const dt_gpt_config *c) {
    dt_gpt_part whole = {0};
    gpt_dims d = dims_of(c, &whole);
    return part_params(c, &d);
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
    size_t wgrad;     /* bytes kept from backward to the weight gradients (split) */
    size_t recompute; /* bytes of the shared scratch set of recomputed blocks */
    size_t block;     /* bytes of one block's full set of activations */
} plan;

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

/* Take `bytes` from the arena (or only count them when base is NULL);
 * regions are 64-byte aligned. */
static void *take(char *base, size_t *off, size_t bytes) {
    void *p = base ? base + *off : NULL;
    *off += dt_align_up(bytes, 64);
    return p;
}

/* The sizes a plan needs. */
typedef struct sizes {
    size_t B, T, N, Ns, C, Ct, NHt, Ft, A;
} sizes;

/* The activations of one block except res3; returns the attention bytes. */
static size_t take_block(char *base, size_t *off, block_acts *a, const sizes *z) {
    size_t before;
    a->ln1 = take(base, off, z->Ns * z->C * z->A);
    a->ln1_mean = take(base, off, z->Ns * 4);
    a->ln1_rstd = take(base, off, z->Ns * 4);
    before = *off;
    a->qkv = take(base, off, z->N * 3 * z->Ct * z->A);
    a->atty = take(base, off, z->N * z->Ct * z->A);
    a->att_lse = take(base, off, z->B * z->NHt * z->T * 4);
    size_t att = *off - before;
    a->res2 = take(base, off, z->Ns * z->C * 4);
    a->ln2 = take(base, off, z->Ns * z->C * z->A);
    a->ln2_mean = take(base, off, z->Ns * 4);
    a->ln2_rstd = take(base, off, z->Ns * 4);
    a->fch = take(base, off, z->N * z->Ft * z->A);
    a->fch_gelu = take(base, off, z->N * z->Ft * z->A);
    return att;
}

/* Lay the activations out in m's arena, or, with m == NULL, only count the
 * bytes (every pointer is then NULL and written to a scratch model).
 * Order: per slot (a micro-batch in flight) its blocks' saved sets (or only
 * res3 when recomputed), its stage input, ln_f output, logits and loss rows;
 * then, once, the shared scratch set of recomputed blocks, the head's
 * chunk and the backward scratch. */
static plan carve(dt_gpt *m, const dt_gpt_config *c, int B_, int T_, const dt_gpt_options *o) {
    gpt_dims d = dims_of(c, &o->part);
    /* Context parallelism: a rank's share of each sequence through every
     * layer; attention's scratch below. */
    sizes z = {.B = (size_t)B_,
               .T = (size_t)(T_ / d.cp),
               .C = (size_t)c->dim,
               .Ct = (size_t)d.Ct,
               .NHt = (size_t)d.NHt,
               .Ft = (size_t)d.Ft,
               .A = dt__act_size(o->precision)};
    z.N = z.B * z.T;
    z.Ns = d.sp ? z.N / (size_t)d.tp : z.N;
    const size_t B = z.B, N = z.N, Ns = z.Ns, C = z.C, A = z.A, Vl = (size_t)d.Vl;
    const size_t tp = (size_t)d.tp;
    const int nslots = o->slots > 1 ? o->slots : 1;
    bool low = o->precision != DT_PRECISION_FP32;
    /* The LM head: without recomputation the full (N,Vl) logits (the
     * contract of dt_gpt_logits); with it only the (N,Vb) chunk that
     * forward and backward (re)compute (and the last positions' logits,
     * in the scratch below). */
    bool chunked = o->recompute_every > 0;
    size_t Vb = (size_t)head_cols(d.Vl, N);
    bool own_chunk = chunked || Vb < Vl; /* else a slot's chunk is its logits */
    size_t off = 0;
    plan p = {0};
    block_acts one;         /* every layer of a plan */
    block_wgrad wone = {0}; /* the same, for the wgrad sets */
    gpt_slot none = {0};
    char *base = m ? m->arena : NULL;
    bool any = false;
    for (int h = 0; h < d.nch; h++) {
        bool embeds = h == 0 && d.first, head = h == d.nch - 1 && d.last;
        for (int k = 0; k < nslots; k++) {
            gpt_slot *sl = m ? &m->slots[h * nslots + k] : &none;
            for (int l = d.ch[h].begin; l < d.ch[h].end; l++) {
                int i = l - d.ch[h].begin;
                // cppcheck-suppress uninitvar ; `one` is only written here (planning pass)
                block_acts *a = m ? &sl->acts[i] : &one;
                size_t before = off;
                if (dt__gpt_recomputed(o->recompute_every, l))
                    any = true;
                else
                    p.attention += take_block(base, &off, a, &z);
                a->res3 = take(base, &off, Ns * C * 4);
                p.saved += off - before;
                if (o->split_weight_grads) {
                    block_wgrad *w = m ? &sl->wg[i] : &wone;
                    before = off;
                    w->d_fcproj = take(base, &off, N * C * A);
                    w->d_fc = take(base, &off, N * z.Ft * A);
                    w->d_ln2 = take(base, &off, Ns * C * 4);
                    w->d_attproj = take(base, &off, N * C * A);
                    w->d_qkv = take(base, &off, N * 3 * z.Ct * A);
                    w->d_ln1 = take(base, &off, Ns * C * 4);
                    p.wgrad += off - before;
                }
            }
            sl->encoded = take(base, &off, Ns * C * 4);
            p.saved += dt_align_up(Ns * C * 4, 64);
            if (head) {
                sl->lnf_out = take(base, &off, Ns * C * A);
                sl->lnf_mean = take(base, &off, Ns * 4);
                sl->lnf_rstd = take(base, &off, Ns * 4);
                size_t before = off;
                sl->logits = chunked ? NULL : take(base, &off, N * Vl * 4);
                sl->chunk = sl->logits;
                p.logits += off - before;
                sl->ce_lse = take(base, &off, N * 4);
                sl->losses = take(base, &off, N * 4);
                sl->targets = take(base, &off, N * 4);
            }
            if (embeds)
                sl->tokens = take(base, &off, N * 4);
        }
    }
    if (any) {
        size_t before = off;
        p.attention += take_block(base, &off, m ? &m->shared : &one, &z);
        p.recompute = off - before;
        for (int h = 0; m && h < d.nch; h++)
            for (int k = 0; k < nslots; k++)
                for (int l = d.ch[h].begin; l < d.ch[h].end; l++)
                    if (dt__gpt_recomputed(o->recompute_every, l)) {
                        block_acts *a = &m->slots[h * nslots + k].acts[l - d.ch[h].begin];
                        float *res3 = a->res3;
                        *a = m->shared;
                        a->res3 = res3;
                    }
    }
    {
        size_t o2 = 0;
        take_block(NULL, &o2, &one, &z);
        p.block = o2 + dt_align_up(Ns * C * 4, 64);
    }
    dt_gpt scratch = {0};
    if (!m)
        m = &scratch;
    m->gathered = d.sp ? take(base, &off, N * C * A) : NULL;
    if (d.last) {
        if (own_chunk) {
            size_t before = off;
            float *chunk = take(base, &off, N * Vb * 4);
            p.logits += off - before;
            for (int k = 0; m->slots && k < nslots; k++)
                m->slots[(d.nch - 1) * nslots + k].chunk = chunk;
        }
        if (tp > 1) {
            size_t all = tp * N * 2 > tp * B * Vl ? tp * N * 2 : tp * B * Vl;
            m->ce_stats = take(base, &off, N * 2 * 4);
            m->ce_all = take(base, &off, all * 4);
            m->last_all = take(base, &off, B * (size_t)d.Vp * 4);
        }
    }
    m->dres = take(base, &off, Ns * C * 4);
    m->dbuf = take(base, &off, N * C * 4);
    /* Three lifetimes share one scratch region: dfch is only live in the
     * MLP part of a block's backward (and holds a part of dlnf in the
     * head's backward); dqkv (and the 16-bit attention workspace, also
     * used by forward and recomputation) only outside it; the last
     * positions' logits (and their ln_f rows) from the head's forward
     * until the next backward or block forward, which is what
     * dt_gpt_logits() promises. */
    size_t phase = off, end;
    m->dfch = take(base, &off, N * z.Ft * 4);
    end = off;
    off = phase;
    m->dqkv = take(base, &off, N * 3 * z.Ct * A);
    /* Ulysses attends NHt/cp heads over all T tokens. */
    int acp = d.cp > 1 && d.cpm == DT_CP_ULYSSES ? d.cp : 1;
    m->attn_work =
        low ? take(base, &off,
                   dt_attention16_workspace(B_, T_ / d.cp * acp, d.Ct / acp, d.NHt / acp) * 4)
            : NULL;
    /* The ring's travelling dk|dv blocks live only in attention's backward,
     * next to its dqkv; forward's partials take the same place (neither
     * outlives the attention call). */
    cp_scratch *cs = &m->cp;
    const bool ring = d.cp > 1 && d.cpm == DT_CP_RING;
    const size_t kvb = N * 2 * z.Ct * 4;
    if (ring) {
        size_t at = off;
        cs->acc[0] = take(base, &off, kvb);
        cs->acc[1] = take(base, &off, kvb);
        end = off > end ? off : end;
        off = at;
        cs->pout = take(base, &off, N * z.Ct * 4);
        cs->plse = take(base, &off, B * z.NHt * z.T * 4);
    }
    end = off > end ? off : end;
    off = phase;
    bool last_rows = d.last && (chunked || tp > 1);
    m->last = last_rows ? take(base, &off, B * Vl * 4) : NULL;
    m->lnf_last = d.last && chunked ? take(base, &off, B * C * A) : NULL;
    off = off > end ? off : end;
    m->dres16 = low ? take(base, &off, N * C * 2) : NULL;
    m->row16 = low && d.last ? take(base, &off, Vb * 2) : NULL;
    /* SP: wpe's partial gradient covers the positions of every rank's tokens. */
    size_t Tg = (size_t)T_;
    m->gscratch = d.sp ? take(base, &off, (4 * C > Tg * C ? 4 * C : Tg * C) * 4) : NULL;
    /* Context parallelism's attention scratch (gpt_cp.c): Ulysses' one
     * all-to-all buffer and the gathered dout and out; the ring's two
     * key/value blocks in flight (and in 16 bits its fp32 copies). */
    if (d.cp > 1 && d.cpm == DT_CP_ULYSSES) {
        cs->a2a = take(base, &off, N * 3 * z.Ct * A); /* >= dout's N Ct fp32 */
        cs->g_dout = take(base, &off, N * z.Ct * 4);
        cs->g_out = take(base, &off, N * z.Ct * A);
    } else if (ring) {
        cs->kv[0] = take(base, &off, kvb);
        cs->kv[1] = take(base, &off, kvb);
        if (low) {
            cs->w_qkv = take(base, &off, N * 3 * z.Ct * 4);
            cs->w_out = take(base, &off, N * z.Ct * 4);
            cs->w_dqkv = take(base, &off, N * 3 * z.Ct * 4);
        }
    }
    p.total = off;
    return p;
}

void dt_gpt_memory_plan_with(const dt_gpt_config *c, int batch, int seq, const dt_gpt_options *opt,
                             dt_memory_report *r) {
    dt_gpt_options o = opt ? *opt : dt_gpt_options_default();
    gpt_dims d = dims_of(c, &o.part);
    plan p = carve(NULL, c, batch, seq, &o);
    size_t np = part_params(c, &d);
    r->params = np * sizeof(float);
    r->grads = np * sizeof(float);
    r->weights16 = o.precision == DT_PRECISION_FP32 ? 0 : np * 2;
    r->activations = p.total;
    r->attention = p.attention;
    r->attention_naive =
        (size_t)d.nl * batch * d.NHt * (size_t)seq * seq * dt__act_size(o.precision);
    r->logits = p.logits;
    r->wgrad = p.wgrad;
    r->saved = p.saved;
    r->recompute = p.recompute;
    r->block = p.block;
    r->precision = o.precision;
    r->recompute_every = o.recompute_every;
    r->layers = d.nl;
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

/* Where a table puts things: the tensors (`info`, `names`, 48 bytes
 * each) and the indices of wte, wpe, the first block and ln_f in it. */
typedef struct table {
    dt_param_info *info;
    char *names;
    size_t wte, wpe, blocks, lnf;
} table;

/* The tensor table of a part, in buffer order: each tensor's flat view,
 * its global shape and box, whether this rank owns it (the copy a
 * checkpoint writes) and its index in the unsharded model's table.
 * Returns the number of floats. */
static size_t build_table(const dt_gpt_config *cfg, const gpt_dims *d, table *tb) {
    const size_t C = (size_t)cfg->dim, L = (size_t)cfg->layers;
    size_t off = 0, t = 0;
    tb->wte = tb->wpe = tb->lnf = SIZE_MAX;
/* global index: wte 0, wpe 1, block l tensor k 2 + 12 l + k, ln_f 2 + 12 L */
#define ADD(nm, glob, own, pl, dec)                                                                \
    do {                                                                                           \
        char *s_ = tb->names + t * 48;                                                             \
        snprintf(s_, 48, "%s", nm);                                                                \
        tensor_place p_ = (pl);                                                                    \
        tb->info[t] = (dt_param_info){.name = s_,                                                  \
                                      .offset = off,                                               \
                                      .rows = p_.rows,                                             \
                                      .cols = p_.cols,                                             \
                                      .decay = (dec),                                              \
                                      .ndim = p_.ndim,                                             \
                                      .owner = (own),                                              \
                                      .global = (glob)};                                           \
        memcpy(tb->info[t].shape, p_.shape, sizeof p_.shape);                                      \
        memcpy(tb->info[t].begin, p_.begin, sizeof p_.begin);                                      \
        memcpy(tb->info[t].extent, p_.extent, sizeof p_.extent);                                   \
        off += p_.rows * p_.cols;                                                                  \
        t++;                                                                                       \
    } while (0)
    /* wte's shard: vocabulary rows [r Vl, (r+1) Vl), of which those below V
     * are the global tensor's (the rest is padding, zero, in no box). */
    size_t v0 = (size_t)d->r * (size_t)d->Vl;
    size_t vrows = v0 < (size_t)d->V
                       ? ((size_t)d->V - v0 < (size_t)d->Vl ? (size_t)d->V - v0 : (size_t)d->Vl)
                       : 0;
    tensor_place wte = {(size_t)d->Vl, C, 2, {(size_t)d->V, C, 1}, {v0, 0, 0}, {vrows, C, 1}};
    tensor_place whole_2d = {(size_t)cfg->max_seq,         C,         2,
                             {(size_t)cfg->max_seq, C, 1}, {0, 0, 0}, {(size_t)cfg->max_seq, C, 1}};
    tensor_place vec = {1, C, 1, {C, 1, 1}, {0, 0, 0}, {C, 1, 1}};
    if (d->first || d->last) {
        tb->wte = t;
        /* The last stage's copy of the tied embedding is the first stage's
         * to write; a shard with only padding rows writes nothing. */
        ADD("wte", 0, d->first && vrows > 0, wte, true);
    }
    if (d->first) {
        tb->wpe = t;
        ADD("wpe", 1, d->r == 0, whole_2d, true);
    }
    tb->blocks = t;
    for (int c = 0; c < d->nch; c++)
        for (int l = d->ch[c].begin; l < d->ch[c].end; l++)
            for (int k = 0; k < P_BLOCK_COUNT; k++) {
                char nm[48];
                snprintf(nm, sizeof nm, "h.%d.%s", l, block_names[k]);
                tensor_place p = block_tensor(k, d);
                ADD(nm, 2 + P_BLOCK_COUNT * l + k, !block_replicated(k) || d->r == 0, p,
                    p.rows > 1);
            }
    if (d->last) {
        tb->lnf = t;
        ADD("ln_f.weight", (int)(2 + P_BLOCK_COUNT * L), d->r == 0, vec, false);
        ADD("ln_f.bias", (int)(3 + P_BLOCK_COUNT * L), d->r == 0, vec, false);
    }
#undef ADD
    return off;
}

/* Tensors of a part. */
static size_t part_tensors(const gpt_dims *d) {
    return (size_t)P_BLOCK_COUNT * d->nl + (d->first || d->last) + d->first + 2 * d->last;
}

size_t dt_gpt_config_num_tensors(const dt_gpt_config *cfg) {
    dt_gpt_part whole = {0};
    gpt_dims d = dims_of(cfg, &whole);
    return part_tensors(&d);
}

dt_status dt_gpt_config_tensors(const dt_gpt_config *cfg, dt_param_info **out) {
    *out = NULL;
    DT_CHECK(dt_gpt_config_validate(cfg));
    dt_gpt_part whole = {0};
    gpt_dims d = dims_of(cfg, &whole);
    size_t n = part_tensors(&d);
    /* One block: the entries, then their names. */
    char *mem = dt_calloc(1, n * (sizeof(dt_param_info) + 48));
    if (!mem)
        return DT_ERR_NOMEM;
    table tb = {.info = (dt_param_info *)(void *)mem, .names = mem + n * sizeof(dt_param_info)};
    build_table(cfg, &d, &tb);
    *out = tb.info;
    return DT_OK;
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
    if (o.slots < 0 || o.slots > 4096)
        return dt_error_set(DT_ERR_INVALID, "slots %d must be in [0, 4096]", o.slots);
    DT_CHECK(dt_gpt_config_validate(cfg));
    if (max_batch < 1 || max_batch > (1 << 20))
        return dt_error_set(DT_ERR_INVALID, "batch size %d must be in [1, 1048576]", max_batch);
    if (max_seq < 1 || max_seq > cfg->max_seq)
        return dt_error_set(DT_ERR_INVALID,
                            "sequence length %d must be in [1, %d] (the model's max_seq)", max_seq,
                            cfg->max_seq);
    DT_CHECK(dt_gpt_part_validate(cfg, &o.part, max_seq));
    (void)dt_tensor_threads(); /* first use: apply DT_THREADS, one thread pool */
    dt_gpt *m = dt_calloc(1, sizeof *m);
    if (!m)
        return DT_ERR_NOMEM;
    m->cfg = *cfg;
    m->opt = o;
    m->opt.part = part_of(cfg, &o.part);
    m->d = dims_of(cfg, &o.part);
    m->max_B = max_batch;
    m->max_T = max_seq;
    const gpt_dims *d = &m->d;
    m->nparams = part_params(cfg, d);
    m->ntensors = part_tensors(d);
    m->info = dt_calloc(m->ntensors, sizeof *m->info);
    m->names = dt_calloc(m->ntensors, 48);
    m->lidx = dt_calloc((size_t)cfg->layers, sizeof *m->lidx);
    m->nslots = o.slots > 1 ? o.slots : 1;
    size_t nslot = (size_t)d->nch * m->nslots, nacts = (size_t)d->nl * m->nslots;
    m->slots = dt_calloc(nslot, sizeof *m->slots);
    block_acts *acts = dt_calloc(nacts, sizeof *acts);
    block_wgrad *wg = o.split_weight_grads ? dt_calloc(nacts, sizeof *wg) : NULL;
    for (int l = 0; m->lidx && l < cfg->layers; l++)
        m->lidx[l] = -1;
    /* Chunk c's slots take their blocks' entries one after another. */
    for (int c = 0; m->slots && m->lidx && acts && c < d->nch; c++) {
        int L0 = d->ch[c].begin, L1 = d->ch[c].end;
        for (int l = L0; l < L1; l++)
            m->lidx[l] = d->base[c] + (l - L0);
        for (int k = 0; k < m->nslots; k++) {
            gpt_slot *sl = &m->slots[(size_t)c * m->nslots + k];
            size_t first = (size_t)m->nslots * d->base[c] + (size_t)k * (L1 - L0);
            *sl = (gpt_slot){.part_chunk = c,
                             .L0 = L0,
                             .L1 = L1,
                             .embeds = c == 0 && d->first,
                             .head = c == d->nch - 1 && d->last,
                             .acts = acts + first,
                             .wg = wg ? wg + first : NULL};
        }
    }
    m->s = m->slots;
    m->params = dt_alloc(m->nparams * sizeof(float));
    m->grads = dt_alloc(m->nparams * sizeof(float));
    bool low = o.precision != DT_PRECISION_FP32;
    m->w16 = low ? dt_alloc(m->nparams * sizeof(uint16_t)) : NULL;
    plan p = carve(NULL, cfg, max_batch, max_seq, &m->opt);
    m->arena_bytes = p.total;
    m->arena = dt_alloc(p.total);
    if (!m->info || !m->names || !m->lidx || !m->slots || !acts || (o.split_weight_grads && !wg) ||
        !m->params || !m->grads || !m->arena || (low && !m->w16)) {
        char a[32];
        size_t np = m->nparams;
        dt_gpt_destroy(m);
        return dt_error_set(DT_ERR_NOMEM,
                            "cannot allocate a GPT with %zu parameters and %s of "
                            "activations",
                            np, dt_format_bytes((double)p.total, a, sizeof a));
    }
    /* Zero but not resident: a strategy that shards them (ZeRO) never
     * touches the pages it does not own. */
    dt_mem_zero(m->params, m->nparams * sizeof(float));
    dt_mem_zero(m->grads, m->nparams * sizeof(float));
    carve(m, cfg, max_batch, max_seq, &m->opt);
    m->head_cols = head_cols(m->d.Vl, (size_t)max_batch * max_seq);
    table tb = {.info = m->info, .names = m->names};
    DT_ASSERT(build_table(cfg, d, &tb) == m->nparams);
    m->wte = tb.wte;
    m->wpe = tb.wpe;
    m->blocks = tb.blocks;
    m->lnf = tb.lnf;
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
    if (m->slots) {
        dt_free(m->slots[0].acts);
        dt_free(m->slots[0].wg);
    }
    dt_free(m->slots);
    dt_free(m->names);
    dt_free(m->lidx);
    dt_free(m->info);
    dt_free(m);
}

const dt_gpt_config *dt_gpt_get_config(const dt_gpt *m) { return &m->cfg; }
const dt_gpt_part *dt_gpt_get_part(const dt_gpt *m) { return &m->opt.part; }
const dt_gpt_options *dt_gpt_get_options(const dt_gpt *m) { return &m->opt; }

dt_status dt_gpt_set_param_hooks(dt_gpt *m, const dt_param_hooks *h) {
    if (h && (!h->fetch || !h->prefetch || !h->release))
        return dt_error_set(DT_ERR_INVALID, "parameter hooks: fetch, prefetch and release needed");
    if (h && (!h->fetch16 != !h->prefetch16 || !h->fetch16 != !h->release16))
        return dt_error_set(DT_ERR_INVALID,
                            "parameter hooks: fetch16, prefetch16 and release16 go together");
    m->hooks = h ? *h : (dt_param_hooks){0};
    return DT_OK;
}
dt_status dt_gpt_set_linear_stats(dt_gpt *m, dt_linear_stats_fn fn, void *user) {
    if (fn && (m->opt.precision != DT_PRECISION_FP32 || m->opt.part.tp_size > 1 ||
               m->opt.split_weight_grads))
        return dt_error_set(DT_ERR_UNSUPPORTED,
                            "linear-layer statistics (K-FAC) need fp32 compute, no tensor "
                            "parallelism and no split weight-gradient pass");
    m->lstats = fn;
    m->lstats_user = user;
    return DT_OK;
}
float *dt_gpt_params(dt_gpt *m) { return m->params; }
float *dt_gpt_grads(dt_gpt *m) { return m->grads; }
size_t dt_gpt_num_params(const dt_gpt *m) { return m->nparams; }
size_t dt_gpt_num_tensors(const dt_gpt *m) { return m->ntensors; }
const float *dt_gpt_logits(const dt_gpt *m) { return m->s->logits ? m->s->logits : m->last; }

const float *dt_gpt_last_logits(const dt_gpt *m, int b) {
    DT_ASSERT(m->d.last && b >= 0 && b < m->s->B);
    if (m->d.tp > 1)
        return m->last_all + (size_t)b * (size_t)m->d.Vp;
    size_t V = (size_t)m->cfg.vocab;
    const gpt_slot *s = m->s;
    return s->logits ? s->logits + ((size_t)b * s->T + (size_t)s->T - 1) * V
                     : m->last + (size_t)b * V;
}

void dt_gpt_tensor_info(const dt_gpt *m, size_t i, dt_param_info *out) {
    DT_ASSERT(i < m->ntensors);
    *out = m->info[i];
}

void dt_gpt_zero_grads(dt_gpt *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

double dt_gpt_take_comm_ms(dt_gpt *m) {
    double ms = m->comm_ms;
    m->comm_ms = 0;
    return ms;
}

void dt_gpt_profile_enable(dt_gpt *m, bool on) { m->prof_on = on; }

dt_gpt_profile dt_gpt_take_profile(dt_gpt *m) {
    dt_gpt_profile p = {m->prof_ms[PROF_PRODUCTS], m->prof_ms[PROF_ATTENTION],
                        m->prof_ms[PROF_ELEMENTWISE], m->prof_ms[PROF_CASTS]};
    memset(m->prof_ms, 0, sizeof m->prof_ms);
    return p;
}

void dt_gpt_set_weights16(dt_gpt *m, dt_gpt_w16 state) { m->w16_state = state; }
dt_gpt_w16 dt_gpt_weights16_state(const dt_gpt *m) { return m->w16_state; }

void dt_gpt_write_weights16(void *model, const float *src, size_t begin, size_t count) {
    dt_gpt *m = model;
    if (m->w16 && count > 0) {
        DT_ASSERT(begin <= m->nparams && count <= m->nparams - begin);
        dt_act16_from_f32(m->opt.precision, m->w16 + begin, src, count);
    }
}

double dt_gpt_take_attention_ms(dt_gpt *m) {
    double ms = m->cp_attn_ms;
    m->cp_attn_ms = 0;
    return ms;
}

/* GPT-2 initialisation of tensor i: each global tensor draws from its own
 * Philox stream (seed, DT_RNG_INIT, global index), element e of the global
 * tensor from position 2e of the stream (a normal takes two 32-bit
 * draws), so a shard draws exactly the values the unsharded model has in
 * its box, and padding rows stay zero. */
/* Tensor i's values at flat offsets [lo, hi) of the buffer (the rest of
 * it untouched): each value from its own place in the tensor's stream, so
 * any cut gives the bits of the whole. */
static void init_tensor(dt_gpt *m, size_t i, uint64_t seed, size_t lo, size_t hi) {
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)m->cfg.layers);
    const dt_param_info *p = &m->info[i];
    size_t n = p->rows * p->cols, t0 = p->offset;
    lo = lo > t0 ? lo : t0;
    hi = hi < t0 + n ? hi : t0 + n;
    if (lo >= hi)
        return;
    memset(m->params + lo, 0, (hi - lo) * sizeof(float));
    const char *nm = p->name;
    size_t len = strlen(nm);
    bool is_bias = len >= 4 && strcmp(nm + len - 4, "bias") == 0;
    bool is_ln = strstr(nm, "ln_") != NULL;
    if (is_bias)
        return;
    if (is_ln) {
        for (size_t j = 0; j < p->extent[0]; j++)
            if (t0 + j >= lo && t0 + j < hi)
                m->params[t0 + j] = 1.0f;
        return;
    }
    float s = strstr(nm, "c_proj") ? proj_std : std;
    dt_rng r;
    dt_rng_init(&r, seed, dt_rng_stream_id(0, (uint64_t)p->global, DT_RNG_INIT));
    /* The box, one run along the last dimension at a time, stored from t0
     * in order. */
    size_t f = t0;
    for (size_t i0 = 0; i0 < p->extent[0]; i0++)
        for (size_t i1 = 0; i1 < p->extent[1]; i1++, f += p->extent[2]) {
            size_t a = f > lo ? f : lo, b = f + p->extent[2] < hi ? f + p->extent[2] : hi;
            if (a >= b)
                continue;
            size_t e =
                ((p->begin[0] + i0) * p->shape[1] + p->begin[1] + i1) * p->shape[2] + p->begin[2];
            dt_rng_seek(&r, 2 * (uint64_t)(e + (a - f)));
            for (size_t k = a; k < b; k++)
                m->params[k] = s * dt_rng_normal(&r);
        }
}

void dt_gpt_init_params(dt_gpt *m, uint64_t seed) {
    dt_gpt_init_params_range(m, seed, 0, m->nparams);
}

void dt_gpt_init_params_range(dt_gpt *m, uint64_t seed, size_t begin, size_t end) {
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < m->ntensors; i++)
        init_tensor(m, i, seed, begin, end);
}
