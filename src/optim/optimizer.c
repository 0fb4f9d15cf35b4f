/*
 * optimizer.c — the optimizer object: every kind of optim.h over the owned
 * ranges of the flat parameter buffer, its state, and the per-tensor
 * statistics that ZeRO sharding sums over ranks.
 *
 * Invariants:
 *   - The caller's tensor table is kept whole (tab): per-tensor statistics
 *     and per-tensor state are laid out by it, identically on every rank
 *     that shares it. Its intersections with the owned ranges are the
 *     pieces (pc, sorted by offset; a tensor's pieces are consecutive).
 *   - A per-parameter state holds its ranges one after another: for the
 *     usual ones the owned ranges (element start[i] + j belongs to parameter
 *     owned[i].begin + j; piece.s is its first element's index), for
 *     Adafactor's v the vector tensors' pieces only (piece.sv).
 *   - Rangewise kinds update each element independently, so any split of an
 *     owned range into update() calls gives the same bits. The others go
 *     through phases: statistics of each piece into lanes (work items of at
 *     most DT__OPTIM_CHUNK elements, summed per tensor in item order so the
 *     thread count never matters), one reduce over the ranks, then the
 *     update. Sharded and unsharded runs differ only by the rounding of
 *     those double sums.
 *   - count is the number of applied updates; bias corrections use count + 1,
 *     the numbering PyTorch's `step` has.
 *   - With offload_dir the owned-layout state (every fp32 state over the
 *     owned ranges; 8-bit AdamW's codes) is a shared mapping of one file
 *     (offload.c), and every pass over it goes in windows of at most
 *     DT__OFFLOAD_PIECE elements, each announced before and reported after,
 *     so that only a window is mapped at a time: update() cuts its range,
 *     the phased kinds group their work items (LAMB walks twice: moments,
 *     then the trust-scaled update), 8-bit AdamW its blocks. The split
 *     changes no bits: windows hold whole items and whole blocks, and
 *     within them every element is updated on its own. What stays in
 *     memory: per-tensor state and statistics, Adafactor's v of vectors,
 *     8-bit block scales. L-BFGS and K-FAC (whole-buffer steps, no owned
 *     ranges) refuse an offload_dir.
 */
#include "optim_internal.h"

#include "dtrain/trace.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

const char *const dt_optim_names[DT_OPTIM_COUNT] = {
    "adamw",       "sgd",         "adafactor", "adamw8bit", "lamb",  "lars",
    "onebit-adam", "onebit-lamb", "radam",     "lookahead", "lbfgs", "kfac"};

#define MAX_STATES 34 /* per-parameter states (L-BFGS: 2 * history + 2, history <= 16) */

typedef struct piece {
    size_t offset, count; /* [offset, offset + count): a tensor inside one owned range */
    size_t t;             /* its tensor in the table */
    size_t s;             /* index of its first element in the owned-layout states */
    size_t sv;            /* Adafactor: index in the vectors' v state; SIZE_MAX: factored */
} piece;

typedef struct item {
    size_t piece;    /* pc index */
    size_t off, len; /* a chunk of it: [pc.offset + off, + len) */
} item;

typedef struct pstate {
    const char *name;
    float *buf;       /* NULL: stored another way (8-bit) */
    dt_range *ranges; /* NULL: the owned ranges */
    size_t nranges, count;
    bool disk; /* buf is in the offload file (the owner's `disk`), not allocated */
} pstate;

struct dt_optimizer {
    dt_optim_config c;
    dt_optim_tensor *tab; /* (ntab) the caller's table */
    size_t ntab;
    piece *pc; /* (npc) */
    size_t npc;
    size_t *tpc; /* (ntab + 1) tensor t's pieces are pc[tpc[t] .. tpc[t + 1]) */
    item *it;    /* (nit) the pieces cut in chunks: the unit of parallel work */
    size_t nit;
    double *ipart; /* (nipart) LAMB, LARS: per-item partial sums, 2 per item */
    size_t nipart;
    dt_range *owned; /* (nowned) sorted, disjoint */
    size_t *start;   /* (nowned + 1) where each range's state begins; start[nowned] = all */
    size_t nowned;
    pstate st[MAX_STATES];
    size_t nstates;
    /* 8-bit AdamW: codes in the owned layout, a scale per block piece. */
    uint8_t *q[2];  /* m, r codes */
    float *qs[2];   /* their block scales */
    size_t *qblock; /* (nowned + 1) first block piece of each owned range */
    /* Per-tensor state: one buffer (Adafactor's factors or 1-bit LAMB's ratios). */
    const char *tname;
    float *tstate;
    size_t *toff, *tlen; /* (ntab) */
    size_t ttotal;
    float *fac; /* Adafactor: the step's 1/sqrt factors, laid out as tstate */
    /* Per-tensor statistics (see the file comment), laid out by the table. */
    double *stats;
    size_t nstats;
    size_t *soff;   /* (ntab) Adafactor: a tensor's [rowsums | colsums] in stats */
    size_t *goff;   /* (ntab) centralisation: a matrix's row sums in gstats */
    double *gstats; /* (ngstats) */
    size_t ngstats;
    dt_optimizer *inner;        /* Lookahead: the wrapped optimizer */
    dt__lbfgs *lbfgs;           /* L-BFGS: its vectors and scalars (lbfgs.c) */
    dt__kfac *kfac;             /* K-FAC: its accumulators (kfac.c); factors in tstate */
    char lname[MAX_STATES][24]; /* L-BFGS: its state names */
    dt__adafactor_k *ak;        /* (ntab) Adafactor: the step's scalars per tensor */
    dt__offload *disk;          /* the owned-layout state in a file (offload_dir), or NULL */
    char dir[1024];             /* offload_dir's copy */
    int64_t count;              /* applied updates */
    int64_t step;               /* the step begun last */
    float lr;                   /* its learning rate */
    bool frozen;                /* AdamW, 1-bit Adam/LAMB: beta2 = 1 for this step */
    dt_optim_copy_fn copy;      /* the compute copy (dt_optimizer_set_copy), or NULL */
    void *copy_user;
};

dt_adafactor_config dt_adafactor_config_default(void) {
    return (dt_adafactor_config){.beta1 = 0.0f,
                                 .decay_rate = -0.8f,
                                 .eps1 = 1e-30f,
                                 .eps2 = 1e-3f,
                                 .clip_threshold = 1.0f,
                                 .relative_step = true,
                                 .scale_parameter = true,
                                 .warmup_init = false};
}

dt_optim_config dt_optim_config_default(void) {
    dt_adamw_config a = dt_adamw_config_default();
    return (dt_optim_config){
        .kind = DT_OPTIM_ADAMW,
        .weight_decay = a.weight_decay,
        .adamw = a,
        .momentum = 0.0f,
        .nesterov = false,
        .freeze_v_from = -1,
        .trust_coeff = 1e-3f,
        .trust_eps = 1e-8f,
        .adafactor = dt_adafactor_config_default(),
        .block = 2048,
        .inner = DT_OPTIM_ADAMW,
        .lookahead_k = 5,
        .lookahead_alpha = 0.5f,
        .lbfgs = {.history = 10,
                  .max_iter = 20,
                  .max_eval = 25,
                  .tolerance_grad = 1e-7f,
                  .tolerance_change = 1e-9f,
                  .line_search = true},
        .centralize = false,
        .reduce = NULL,
        .reduce_user = NULL,
        .kfac = {.damping = 1e-3, .inv_every = 10, .ema = 0.95, .kl_clip = 1e-3},
        .bcast = NULL,
        .rank = 0,
        .nranks = 1,
    };
}

#define bad(...) dt_error_set(DT_ERR_INVALID, __VA_ARGS__)

static bool adam_family(dt_optim_kind k) {
    return k == DT_OPTIM_ADAMW || k == DT_OPTIM_RADAM || k == DT_OPTIM_ADAMW8BIT ||
           k == DT_OPTIM_LAMB || k == DT_OPTIM_ONEBIT_ADAM || k == DT_OPTIM_ONEBIT_LAMB;
}

static bool onebit(dt_optim_kind k) {
    return k == DT_OPTIM_ONEBIT_ADAM || k == DT_OPTIM_ONEBIT_LAMB;
}

static bool in01(float x) { return x >= 0.0f && x < 1.0f; }

dt_status dt_optim_config_validate(const dt_optim_config *c) {
    if ((unsigned)c->kind >= DT_OPTIM_COUNT)
        return bad("optimizer kind %d is not an optimizer", (int)c->kind);
    const char *name = dt_optim_names[c->kind];
    if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
        return bad("%s: weight decay %g must be finite and >= 0", name, (double)c->weight_decay);
    if (adam_family(c->kind) && !(in01(c->adamw.beta1) && in01(c->adamw.beta2) &&
                                  c->adamw.eps > 0 && isfinite(c->adamw.eps)))
        return bad("%s: betas (%g, %g) must be in [0, 1) and eps %g > 0", name,
                   (double)c->adamw.beta1, (double)c->adamw.beta2, (double)c->adamw.eps);
    if ((c->kind == DT_OPTIM_SGD || c->kind == DT_OPTIM_LARS) && !in01(c->momentum))
        return bad("%s: momentum %g must be in [0, 1)", name, (double)c->momentum);
    if (c->kind == DT_OPTIM_LARS && !(c->trust_coeff > 0 && isfinite(c->trust_coeff) &&
                                      c->trust_eps >= 0 && isfinite(c->trust_eps)))
        return bad("lars: trust coefficient %g must be > 0 and trust eps %g >= 0",
                   (double)c->trust_coeff, (double)c->trust_eps);
    if (c->kind == DT_OPTIM_ADAFACTOR) {
        const dt_adafactor_config *a = &c->adafactor;
        if (!in01(a->beta1))
            return bad("adafactor: beta1 %g must be in [0, 1) (0: no first moment)",
                       (double)a->beta1);
        if (!(a->decay_rate >= -1.0f && a->decay_rate < 0.0f))
            return bad("adafactor: decay rate %g must be in [-1, 0) (beta2 at step t is "
                       "1 - t^rate)",
                       (double)a->decay_rate);
        if (!(a->eps1 > 0 && a->eps2 > 0 && isfinite(a->eps1) && isfinite(a->eps2)))
            return bad("adafactor: eps (%g, %g) must be > 0", (double)a->eps1, (double)a->eps2);
        if (!(a->clip_threshold > 0) || !isfinite(a->clip_threshold))
            return bad("adafactor: clip threshold %g must be > 0", (double)a->clip_threshold);
    }
    if (c->kind == DT_OPTIM_ADAMW8BIT &&
        !(c->block >= 16 && c->block <= 4096 && c->block % 16 == 0))
        return bad("adamw8bit: block %zu must be a multiple of 16 in [16, 4096]", c->block);
    if (c->freeze_v_from < -1)
        return bad("%s: freeze_v_from %" PRId64 " must be >= 0 (or -1: never)", name,
                   c->freeze_v_from);
    if (onebit(c->kind) && c->freeze_v_from < 1)
        return bad("%s: the compression stage must start at step >= 1 (freeze_v_from %" PRId64
                   "): the dense warm-up makes the second moment it freezes",
                   name, c->freeze_v_from);
    if (c->kind == DT_OPTIM_LOOKAHEAD) {
        dt_optim_kind in = c->inner;
        if ((unsigned)in >= DT_OPTIM_COUNT || in == DT_OPTIM_LOOKAHEAD || in == DT_OPTIM_LBFGS ||
            in == DT_OPTIM_KFAC || onebit(in))
            return bad("lookahead: inner optimizer %s cannot be wrapped (any of adamw, sgd, "
                       "adafactor, adamw8bit, lamb, lars, radam)",
                       (unsigned)in < DT_OPTIM_COUNT ? dt_optim_names[in] : "?");
        if (c->lookahead_k < 1)
            return bad("lookahead: k %d must be >= 1", c->lookahead_k);
        if (!(c->lookahead_alpha > 0.0f && c->lookahead_alpha <= 1.0f))
            return bad("lookahead: alpha %g must be in (0, 1]", (double)c->lookahead_alpha);
        dt_optim_config ic = *c;
        ic.kind = in;
        DT_CHECK(dt_optim_config_validate(&ic));
    }
    if (c->kind == DT_OPTIM_LBFGS) {
        const dt_lbfgs_config *l = &c->lbfgs;
        if (l->history < 1 || 2 * l->history + 2 > MAX_STATES)
            return bad("lbfgs: history %d must be in [1, %d]", l->history, (MAX_STATES - 2) / 2);
        if (l->max_iter < 1 || l->max_eval < 1)
            return bad("lbfgs: max_iter %d and max_eval %d must be >= 1", l->max_iter, l->max_eval);
        if (!(l->tolerance_grad >= 0) || !(l->tolerance_change >= 0))
            return bad("lbfgs: tolerances (%g, %g) must be >= 0", (double)l->tolerance_grad,
                       (double)l->tolerance_change);
        if (c->centralize)
            return bad("lbfgs: gradient centralisation is for first-order optimizers");
        if (c->weight_decay != 0.0f)
            return bad("lbfgs: weight decay %g: L-BFGS has none (add it to the loss)",
                       (double)c->weight_decay);
        if (c->reduce)
            return bad("lbfgs: does not shard (its tests take maxima over all parameters); "
                       "give it every parameter and no reduce function");
        if (c->offload_dir)
            return bad("lbfgs: its state cannot be offloaded (its two-loop recursion and line "
                       "search read the whole history at every evaluation)");
    }
    if (c->kind == DT_OPTIM_KFAC) {
        const dt_kfac_config *k = &c->kfac;
        if (!(k->damping > 0) || !isfinite(k->damping))
            return bad("kfac: damping %g must be > 0", k->damping);
        if (k->inv_every < 1)
            return bad("kfac: inv_every %d must be >= 1", k->inv_every);
        if (!(k->ema >= 0 && k->ema < 1))
            return bad("kfac: ema %g must be in [0, 1)", k->ema);
        if (!(k->kl_clip > 0) || !isfinite(k->kl_clip))
            return bad("kfac: kl_clip %g must be > 0", k->kl_clip);
        if (!in01(c->momentum))
            return bad("kfac: momentum %g must be in [0, 1)", (double)c->momentum);
        if (c->nranks < 1 || c->rank < 0 || c->rank >= c->nranks)
            return bad("kfac: rank %d of %d ranks", c->rank, c->nranks);
        if (c->nranks > 1 && (!c->reduce || !c->bcast))
            return bad("kfac: %d ranks need the reduce and bcast functions", c->nranks);
        if (c->offload_dir)
            return bad("kfac: its state cannot be offloaded (it preconditions whole weight "
                       "matrices in one step over the whole buffer)");
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Creation                                                                 */
/* ------------------------------------------------------------------------ */

static bool factored(const dt_optim_tensor *t) {
    return t->rows >= 2 && t->cols >= 2 && t->rows * t->cols == t->count;
}

static bool is_matrix(const dt_optim_tensor *t) {
    return t->rows >= 1 && t->cols >= 2 && t->rows * t->cols == t->count;
}

static float *zalloc_f(size_t n) {
    float *p = dt_alloc((n ? n : 1) * sizeof(float));
    if (p)
        memset(p, 0, n * sizeof(float));
    return p;
}

/* A per-parameter state over the owned ranges (with offload_dir: in the
 * file, which open_disk maps once every state is known). */
static dt_status add_state(dt_optimizer *o, const char *name, bool alloc) {
    DT_ASSERT(o->nstates < MAX_STATES);
    pstate *s = &o->st[o->nstates++];
    s->name = name;
    s->count = o->start[o->nowned];
    if (alloc && o->c.offload_dir)
        s->disk = true;
    else if (alloc && !(s->buf = zalloc_f(s->count)))
        return DT_ERR_NOMEM;
    return DT_OK;
}

/* offload_dir: this object's states marked `disk`, one file (the file
 * reads as zeros, as a fresh state must). */
static dt_status open_disk(dt_optimizer *o) {
    void *bufs[MAX_STATES];
    size_t idx[MAX_STATES], nd = 0;
    for (size_t i = o->inner ? o->inner->nstates : 0; i < o->nstates; i++)
        if (o->st[i].disk)
            idx[nd++] = i;
    if (nd == 0)
        return DT_OK;
    DT_CHECK(dt__offload_open(&o->disk, o->dir, nd, o->start[o->nowned], sizeof(float), bufs));
    for (size_t k = 0; k < nd; k++)
        o->st[idx[k]].buf = bufs[k];
    return DT_OK;
}

/* Adafactor's v: the vector tensors' pieces one after another. */
static dt_status add_vector_state(dt_optimizer *o, const char *name) {
    DT_ASSERT(o->nstates < MAX_STATES);
    pstate *s = &o->st[o->nstates++];
    s->name = name;
    s->ranges = dt_calloc(o->npc + 1, sizeof *s->ranges);
    if (!s->ranges)
        return DT_ERR_NOMEM;
    size_t n = 0;
    for (size_t i = 0; i < o->npc; i++) {
        piece *p = &o->pc[i];
        if (factored(&o->tab[p->t])) {
            p->sv = SIZE_MAX;
            continue;
        }
        p->sv = n;
        n += p->count;
        if (s->nranges > 0 && s->ranges[s->nranges - 1].end == p->offset)
            s->ranges[s->nranges - 1].end += p->count;
        else
            s->ranges[s->nranges++] = (dt_range){p->offset, p->offset + p->count};
    }
    s->count = n;
    return (s->buf = zalloc_f(n)) ? DT_OK : DT_ERR_NOMEM;
}

static const char *const names_m[DT_OPTIM_COUNT] = {[DT_OPTIM_ADAMW] = "adamw.m",
                                                    [DT_OPTIM_RADAM] = "radam.m",
                                                    [DT_OPTIM_LAMB] = "lamb.m",
                                                    [DT_OPTIM_ONEBIT_ADAM] = "onebit-adam.m",
                                                    [DT_OPTIM_ONEBIT_LAMB] = "onebit-lamb.m",
                                                    [DT_OPTIM_ADAMW8BIT] = "adamw8bit.m"};
static const char *const names_v[DT_OPTIM_COUNT] = {[DT_OPTIM_ADAMW] = "adamw.v",
                                                    [DT_OPTIM_RADAM] = "radam.v",
                                                    [DT_OPTIM_LAMB] = "lamb.v",
                                                    [DT_OPTIM_ONEBIT_ADAM] = "onebit-adam.v",
                                                    [DT_OPTIM_ONEBIT_LAMB] = "onebit-lamb.v",
                                                    [DT_OPTIM_ADAMW8BIT] = "adamw8bit.r"};

static size_t blocks_in(size_t begin, size_t end, size_t block) {
    return end > begin ? (end - 1) / block - begin / block + 1 : 0;
}

static dt_status make_state(dt_optimizer *o) {
    const dt_optim_config *c = &o->c;
    size_t n = o->start[o->nowned];
    switch (c->kind) {
    case DT_OPTIM_ADAMW:
    case DT_OPTIM_RADAM:
    case DT_OPTIM_LAMB:
    case DT_OPTIM_ONEBIT_ADAM:
    case DT_OPTIM_ONEBIT_LAMB:
        DT_CHECK(add_state(o, names_m[c->kind], true));
        DT_CHECK(add_state(o, names_v[c->kind], true));
        break;
    case DT_OPTIM_SGD:
        if (c->momentum > 0)
            DT_CHECK(add_state(o, "sgd.momentum", true));
        break;
    case DT_OPTIM_LARS:
        if (c->momentum > 0)
            DT_CHECK(add_state(o, "lars.momentum", true));
        break;
    case DT_OPTIM_ADAMW8BIT: {
        DT_CHECK(add_state(o, names_m[c->kind], false));
        DT_CHECK(add_state(o, names_v[c->kind], false));
        o->qblock = dt_calloc(o->nowned + 1, sizeof *o->qblock);
        if (!o->qblock)
            return DT_ERR_NOMEM;
        for (size_t k = 0; k < o->nowned; k++)
            o->qblock[k + 1] =
                o->qblock[k] + blocks_in(o->owned[k].begin, o->owned[k].end, c->block);
        if (c->offload_dir) { /* the codes in the file; the scales stay here */
            void *q[2];
            DT_CHECK(dt__offload_open(&o->disk, o->dir, 2, n, 1, q));
            o->q[0] = q[0];
            o->q[1] = q[1];
        }
        for (int j = 0; j < 2; j++) {
            if (!c->offload_dir && (o->q[j] = dt_alloc(n ? n : 1)) != NULL)
                memset(o->q[j], 0, n);
            o->qs[j] = zalloc_f(o->qblock[o->nowned]);
            if (!o->q[j] || !o->qs[j])
                return DT_ERR_NOMEM;
        }
        break;
    }
    case DT_OPTIM_ADAFACTOR:
        if (c->adafactor.beta1 > 0)
            DT_CHECK(add_state(o, "adafactor.m", true));
        DT_CHECK(add_vector_state(o, "adafactor.v"));
        break;
    case DT_OPTIM_LOOKAHEAD: {
        dt_optim_config ic = *c;
        ic.kind = c->inner;
        ic.centralize = false; /* done once, by the wrapper */
        DT_CHECK(dt_optimizer_create(&o->inner, &ic, o->tab, o->ntab, o->owned, o->nowned));
        for (size_t i = 0; i < o->inner->nstates; i++)
            o->st[o->nstates++] = o->inner->st[i]; /* borrowed: the inner object frees them */
        DT_CHECK(add_state(o, "lookahead.slow", true));
        break;
    }
    case DT_OPTIM_LBFGS: {
        if (o->nowned != 1 || o->owned[0].begin != 0)
            return bad("lbfgs: the optimizer must own the whole parameter buffer [0, n) as one "
                       "range (L-BFGS does not shard)");
        DT_CHECK(dt__lbfgs_create(&o->lbfgs, &c->lbfgs, n));
        for (size_t i = 0; i < dt__lbfgs_num_states(o->lbfgs); i++) {
            dt__lbfgs_state_name(o->lbfgs, i, o->lname[i], sizeof o->lname[i]);
            DT_CHECK(add_state(o, o->lname[i], false));
        }
        break;
    }
    case DT_OPTIM_KFAC:
        if (o->nowned != 1 || o->owned[0].begin != 0)
            return bad("kfac: the optimizer must own the whole parameter buffer as one range "
                       "(K-FAC preconditions whole weight matrices; it does not shard)");
        if (c->momentum > 0)
            DT_CHECK(add_state(o, "kfac.momentum", true));
        break;
    case DT_OPTIM_COUNT: break;
    }
    DT_CHECK(open_disk(o));
    /* Per-tensor state and statistics. */
    o->toff = dt_calloc(o->ntab + 1, sizeof *o->toff);
    o->tlen = dt_calloc(o->ntab + 1, sizeof *o->tlen);
    o->soff = dt_calloc(o->ntab + 1, sizeof *o->soff);
    o->goff = dt_calloc(o->ntab + 1, sizeof *o->goff);
    if (!o->toff || !o->tlen || !o->soff || !o->goff)
        return DT_ERR_NOMEM;
    size_t ns = 0;
    for (size_t t = 0; t < o->ntab; t++) {
        const dt_optim_tensor *tt = &o->tab[t];
        o->toff[t] = o->ttotal;
        if (c->kind == DT_OPTIM_ADAFACTOR && factored(tt))
            o->tlen[t] = tt->rows + tt->cols;
        else if (c->kind == DT_OPTIM_ONEBIT_LAMB)
            o->tlen[t] = 1;
        o->ttotal += o->tlen[t];
        o->soff[t] = ns;
        if (c->kind == DT_OPTIM_ADAFACTOR)
            ns += (factored(tt) ? tt->rows + tt->cols : 0);
        o->goff[t] = o->ngstats;
        if (c->centralize && is_matrix(tt))
            o->ngstats += tt->rows;
    }
    /* Adafactor: [row and column sums | 2 per tensor (p^2, u^2)]; the
     * layer-wise kinds: 2 per tensor (and 2 per work item); the others
     * none. */
    bool layerwise =
        c->kind == DT_OPTIM_LAMB || c->kind == DT_OPTIM_LARS || c->kind == DT_OPTIM_ONEBIT_LAMB;
    o->nstats = c->kind == DT_OPTIM_ADAFACTOR ? ns + 2 * o->ntab : layerwise ? 2 * o->ntab : 0;
    o->nipart = layerwise ? 2 * o->nit : 0;
    if (c->kind == DT_OPTIM_ADAFACTOR) {
        o->tname = "adafactor.rc";
        o->fac = zalloc_f(o->ttotal);
        o->ak = dt_calloc(o->ntab + 1, sizeof *o->ak);
        if (!o->fac || !o->ak)
            return DT_ERR_NOMEM;
    } else if (c->kind == DT_OPTIM_ONEBIT_LAMB) {
        o->tname = "onebit-lamb.ratio";
    } else if (c->kind == DT_OPTIM_KFAC) {
        o->tname = "kfac.factors";
        DT_CHECK(dt__kfac_create(&o->kfac, &c->kfac, o->tab, o->ntab, o->tlen));
        o->ttotal = 0;
        for (size_t t = 0; t < o->ntab; t++) {
            o->toff[t] = o->ttotal;
            o->ttotal += o->tlen[t];
        }
    }
    if (o->ttotal && !(o->tstate = zalloc_f(o->ttotal)))
        return DT_ERR_NOMEM;
    o->stats = dt_calloc(o->nstats + 1, sizeof *o->stats);
    o->gstats = dt_calloc(o->ngstats + 1, sizeof *o->gstats);
    o->ipart = dt_calloc(o->nipart + 1, sizeof *o->ipart);
    if (!o->stats || !o->gstats || !o->ipart)
        return DT_ERR_NOMEM;
    return DT_OK;
}

/* The per-parameter state exactly (8-bit AdamW's codes and block scales,
 * taking each owned range to start a block); not the per-tensor statistics
 * and factors (a few values per tensor or per matrix row and column, which
 * dt_optimizer_state_bytes counts) nor Adafactor's full v of vector tensors
 * (biases and norms: a small share, unknown without the tensor table). */
size_t dt_optimizer_plan_bytes(const dt_optim_config *c, size_t owned_count) {
    size_t n = owned_count, f = sizeof(float);
    switch (c->kind) {
    case DT_OPTIM_ADAMW:
    case DT_OPTIM_RADAM:
    case DT_OPTIM_LAMB:
    case DT_OPTIM_ONEBIT_ADAM:
    case DT_OPTIM_ONEBIT_LAMB: return 2 * n * f;
    case DT_OPTIM_SGD:
    case DT_OPTIM_LARS: return c->momentum > 0 ? n * f : 0;
    case DT_OPTIM_ADAMW8BIT: {
        size_t block = c->block ? c->block : 2048;
        return 2 * (n + (n + block - 1) / block * f);
    }
    case DT_OPTIM_ADAFACTOR: return c->adafactor.beta1 > 0 ? n * f : 0;
    case DT_OPTIM_LOOKAHEAD: {
        dt_optim_config ic = *c;
        ic.kind = c->inner == DT_OPTIM_LOOKAHEAD ? DT_OPTIM_ADAMW : c->inner;
        return dt_optimizer_plan_bytes(&ic, n) + n * f;
    }
    case DT_OPTIM_LBFGS: return (2 * (size_t)c->lbfgs.history + 6) * n * f; /* lbfgs.c */
    case DT_OPTIM_KFAC: return c->momentum > 0 ? n * f : 0;
    case DT_OPTIM_COUNT: break;
    }
    return 0;
}

/* Offloaded: one window of the per-parameter state, and 8-bit AdamW's
 * block scales for the rest (they stay in memory). */
size_t dt_optimizer_plan_resident(const dt_optim_config *c, size_t owned_count) {
    if (!c->offload_dir)
        return dt_optimizer_plan_bytes(c, owned_count);
    size_t w = owned_count < DT__OFFLOAD_PIECE ? owned_count : DT__OFFLOAD_PIECE;
    size_t b = dt_optimizer_plan_bytes(c, w);
    dt_optim_kind k = c->kind == DT_OPTIM_LOOKAHEAD ? c->inner : c->kind;
    if (k == DT_OPTIM_ADAMW8BIT) {
        size_t block = c->block ? c->block : 2048;
        b += 2 * ((owned_count + block - 1) / block - (w + block - 1) / block) * sizeof(float);
    }
    return b;
}

dt_status dt_optimizer_create(dt_optimizer **out, const dt_optim_config *c,
                              const dt_optim_tensor *tensors, size_t ntensors,
                              const dt_range *owned, size_t nowned) {
    *out = NULL;
    DT_CHECK(dt_optim_config_validate(c));
    for (size_t i = 0; i < nowned; i++)
        if (owned[i].begin > owned[i].end || (i > 0 && owned[i].begin < owned[i - 1].end))
            return bad("optimizer: owned range %zu [%zu, %zu) is reversed or overlaps the one "
                       "before",
                       i, owned[i].begin, owned[i].end);
    for (size_t i = 0; i < ntensors; i++) {
        const dt_optim_tensor *t = &tensors[i];
        if (i > 0 && t->offset < tensors[i - 1].offset + tensors[i - 1].count)
            return bad("optimizer: tensor %zu at %zu overlaps tensor %zu ending at %zu", i,
                       t->offset, i - 1, tensors[i - 1].offset + tensors[i - 1].count);
        if ((t->rows || t->cols) && t->rows * t->cols != t->count)
            return bad("optimizer: tensor %zu is %zu x %zu but holds %zu values", i, t->rows,
                       t->cols, t->count);
    }
    dt_optimizer *o = dt_calloc(1, sizeof *o);
    if (!o)
        return DT_ERR_NOMEM;
    o->c = *c;
    if (c->offload_dir) {
        snprintf(o->dir, sizeof o->dir, "%s", c->offload_dir);
        o->c.offload_dir = o->dir;
    }
    o->step = -1;
    o->nowned = nowned;
    o->ntab = ntensors;
    o->tab = dt_calloc(ntensors + 1, sizeof *o->tab);
    o->owned = dt_calloc(nowned + 1, sizeof *o->owned);
    o->start = dt_calloc(nowned + 1, sizeof *o->start);
    /* A tensor split by range boundaries becomes one piece per part. */
    o->pc = dt_calloc(ntensors + nowned + 1, sizeof *o->pc);
    o->tpc = dt_calloc(ntensors + 1, sizeof *o->tpc);
    dt_status st = DT_ERR_NOMEM;
    if (!o->tab || !o->owned || !o->start || !o->pc || !o->tpc)
        goto fail;
    if (ntensors)
        memcpy(o->tab, tensors, ntensors * sizeof *tensors);
    for (size_t k = 0; k < nowned; k++) {
        o->owned[k] = owned[k];
        o->start[k + 1] = o->start[k] + owned[k].end - owned[k].begin;
    }
    for (size_t i = 0, k = 0; i < ntensors; i++) {
        o->tpc[i] = o->npc;
        for (; k < nowned; k++) {
            size_t lo = tensors[i].offset > owned[k].begin ? tensors[i].offset : owned[k].begin;
            size_t hi = tensors[i].offset + tensors[i].count;
            hi = hi < owned[k].end ? hi : owned[k].end;
            if (lo < hi)
                o->pc[o->npc++] = (piece){lo, hi - lo, i, o->start[k] + lo - owned[k].begin, 0};
            if (owned[k].end > tensors[i].offset + tensors[i].count)
                break; /* the next tensor may still lie in range k */
        }
    }
    o->tpc[ntensors] = o->npc;
    for (size_t i = 0; i < o->npc; i++)
        o->nit += (o->pc[i].count + DT__OPTIM_CHUNK - 1) / DT__OPTIM_CHUNK;
    o->it = dt_calloc(o->nit + 1, sizeof *o->it);
    if (!o->it)
        goto fail;
    for (size_t i = 0, j = 0; i < o->npc; i++)
        for (size_t off = 0; off < o->pc[i].count; off += DT__OPTIM_CHUNK)
            o->it[j++] = (item){i, off,
                                o->pc[i].count - off < DT__OPTIM_CHUNK ? o->pc[i].count - off
                                                                       : DT__OPTIM_CHUNK};
    st = make_state(o);
    if (st != DT_OK)
        goto fail;
    *out = o;
    return DT_OK;
fail:
    dt_optimizer_destroy(o);
    if (st == DT_ERR_NOMEM)
        return dt_error_set(DT_ERR_NOMEM, "%s state for the owned parameters",
                            dt_optim_names[c->kind]);
    return st;
}

void dt_optimizer_destroy(dt_optimizer *o) {
    if (!o)
        return;
    size_t borrowed = o->inner ? o->inner->nstates : 0;
    for (size_t k = borrowed; k < o->nstates; k++) {
        if (!o->st[k].disk)
            dt_free(o->st[k].buf);
        dt_free(o->st[k].ranges);
    }
    dt_optimizer_destroy(o->inner);
    dt__lbfgs_destroy(o->lbfgs);
    dt__kfac_destroy(o->kfac);
    for (int j = 0; j < 2; j++) {
        if (!o->disk)
            dt_free(o->q[j]);
        dt_free(o->qs[j]);
    }
    dt__offload_close(o->disk);
    dt_free(o->ak);
    dt_free(o->qblock);
    dt_free(o->tstate);
    dt_free(o->fac);
    dt_free(o->toff);
    dt_free(o->tlen);
    dt_free(o->soff);
    dt_free(o->goff);
    dt_free(o->stats);
    dt_free(o->gstats);
    dt_free(o->it);
    dt_free(o->ipart);
    dt_free(o->tab);
    dt_free(o->pc);
    dt_free(o->tpc);
    dt_free(o->owned);
    dt_free(o->start);
    dt_free(o);
}

/* ------------------------------------------------------------------------ */
/* Steps                                                                    */
/* ------------------------------------------------------------------------ */

static float decay_of(const dt_optimizer *o, size_t t) {
    return o->tab[t].decay ? o->c.weight_decay : 0.0f;
}

/* Offloaded state: [s0, s1) of the owned layout is about to be read or
 * written (mapped in one call), or is done with (written back and
 * dropped). No-ops in memory. */
static void disk_before(dt_optimizer *o, size_t s0, size_t s1) {
    if (o->disk)
        dt__offload_before(o->disk, s0, s1);
}
static void disk_after(dt_optimizer *o, size_t s0, size_t s1) {
    if (o->disk)
        dt__offload_updated(o->disk, s0, s1);
}

/* The window size of a pass over n elements of state: a piece of the file,
 * or all of them in memory. */
static size_t window(const dt_optimizer *o, size_t n) {
    return o->disk && n > DT__OFFLOAD_PIECE ? DT__OFFLOAD_PIECE : n;
}

void dt_optimizer_begin(dt_optimizer *o, int64_t step, float lr) {
    o->step = step;
    o->lr = lr;
    bool freezes = o->c.kind == DT_OPTIM_ADAMW || onebit(o->c.kind);
    o->frozen = freezes && o->c.freeze_v_from >= 0 && step >= o->c.freeze_v_from;
    /* The freeze: v becomes the bias-corrected second moment of the updates
     * so far, which the frozen steps (beta2 = 1, no correction) use as is.
     * A function of the step, so a resume on either side agrees. */
    if (o->frozen && step == o->c.freeze_v_from && o->count > 0) {
        double bc2 = 1.0 - pow((double)o->c.adamw.beta2, (double)o->count);
        size_t n = o->st[1].count, w = window(o, n);
        for (size_t a = 0; a < n; a += w) {
            size_t b = n - a > w ? a + w : n;
            disk_before(o, a, b);
            dt_scale(o->st[1].buf + a, b - a, (float)(1.0 / bc2));
            disk_after(o, a, b);
        }
    }
    if (o->inner)
        dt_optimizer_begin(o->inner, step, lr);
    if (o->lbfgs)
        dt__lbfgs_begin(o->lbfgs, lr);
}

bool dt_optimizer_rangewise(const dt_optimizer *o) {
    if (o->c.centralize)
        return false;
    switch (o->c.kind) {
    case DT_OPTIM_ADAMW:
    case DT_OPTIM_SGD:
    case DT_OPTIM_RADAM:
    case DT_OPTIM_ONEBIT_ADAM: return true;
    case DT_OPTIM_ONEBIT_LAMB: return o->frozen;
    case DT_OPTIM_LOOKAHEAD: return dt_optimizer_rangewise(o->inner);
    default: return false;
    }
}

bool dt_optimizer_premixing(const dt_optimizer *o) { return onebit(o->c.kind) && o->frozen; }

void dt_optimizer_premix(const dt_optimizer *o, float *grads, size_t begin, size_t end,
                         float scale) {
    if (!dt_optimizer_premixing(o) || begin >= end)
        return;
    double b1 = o->c.adamw.beta1;
    float f = (float)((double)scale * b1 / (1.0 - b1));
    const float *m = o->st[0].buf;
    for (size_t k = 0; k < o->nowned; k++) {
        size_t lo = begin > o->owned[k].begin ? begin : o->owned[k].begin;
        size_t hi = end < o->owned[k].end ? end : o->owned[k].end;
        const float *mk = m + o->start[k] - o->owned[k].begin;
        for (size_t i = lo; i < hi; i++)
            grads[i] = grads[i] + f * mk[i];
    }
}

/* The first piece whose range ends after `at` (pieces are sorted). */
static size_t first_piece(const dt_optimizer *o, size_t at) {
    size_t lo = 0, hi = o->npc;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (o->pc[mid].offset + o->pc[mid].count <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The owned range that holds [begin, end). */
static size_t range_of(const dt_optimizer *o, size_t begin, size_t end) {
    size_t lo = 0, hi = o->nowned;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (o->owned[mid].end <= begin)
            lo = mid + 1;
        else
            hi = mid;
    }
    DT_ASSERT(lo < o->nowned && begin >= o->owned[lo].begin && end <= o->owned[lo].end);
    return lo;
}

/* Lookahead on [lo, hi) (state index s): the first update copies the fast
 * weights into the slow ones before it; every k-th update moves the slow
 * weights alpha of the way to the fast ones and restarts the fast ones
 * there. */
static void lookahead_pre(dt_optimizer *o, float *p, size_t lo, size_t hi, size_t s) {
    if (o->count == 0)
        memcpy(o->st[o->nstates - 1].buf + s, p + lo, (hi - lo) * sizeof(float));
}

static void lookahead_post(dt_optimizer *o, float *p, size_t lo, size_t hi, size_t s) {
    if ((o->count + 1) % o->c.lookahead_k != 0)
        return;
    float *slow = o->st[o->nstates - 1].buf + s;
    float a = o->c.lookahead_alpha;
    for (size_t i = 0; i < hi - lo; i++) {
        float si = slow[i] + a * (p[lo + i] - slow[i]);
        slow[i] = si;
        p[lo + i] = si;
    }
}

/* fn (lookahead_pre or _post) over every owned range, in the file's
 * pieces when the slow weights are offloaded. */
static void lookahead_ranges(dt_optimizer *o, float *p,
                             void (*fn)(dt_optimizer *o, float *p, size_t lo, size_t hi,
                                        size_t s)) {
    for (size_t k = 0; k < o->nowned; k++) {
        size_t b = o->owned[k].begin, e = o->owned[k].end, w = window(o, e - b);
        for (size_t lo = b; lo < e; lo += w) {
            size_t hi = e - lo > w ? lo + w : e, s = o->start[k] + lo - b;
            disk_before(o, s, s + hi - lo);
            fn(o, p, lo, hi, s);
            disk_after(o, s, s + hi - lo);
        }
    }
}

/* 1-bit LAMB's frozen-stage update of one piece: m from the premixed x,
 * then the trust ratio frozen at the end of the warm-up. */
static void onebit_lamb_range(dt_optimizer *o, float *p, const float *x, size_t lo, size_t hi,
                              size_t s, size_t t) {
    dt__lamb_k k;
    dt__lamb_k_init(&k, &o->c.adamw, o->count + 1, decay_of(o, t), true);
    float *m = o->st[0].buf + s, *v = o->st[1].buf + s;
    memset(m, 0, (hi - lo) * sizeof(float));
    dt__lanes pp = {{0}}, uu = {{0}};
    bool vec = dt__optim_vec();
    (vec ? dt__lamb_moments_vec : dt__lamb_moments_scalar)(p + lo, x + lo, m, v, hi - lo, &k, &pp,
                                                           &uu);
    float neg = (float)(-(double)o->lr * (double)o->tstate[t]);
    (vec ? dt__lamb_apply_vec : dt__lamb_apply_scalar)(p + lo, m, v, hi - lo, &k, neg);
}

/* Whether this step reads or writes this object's own state: Lookahead's
 * slow weights only at its first update and every k-th. */
static bool touches_state(const dt_optimizer *o) {
    return o->c.kind != DT_OPTIM_LOOKAHEAD || o->count == 0 ||
           (o->count + 1) % o->c.lookahead_k == 0;
}

/* update() on [begin, end) inside owned range k, the state in memory (or
 * the window of it mapped). */
static void update_range(dt_optimizer *o, float *params, const float *grads, size_t begin,
                         size_t end, size_t k) {
    const size_t base = o->start[k] - o->owned[k].begin; /* state index of parameter p: p + base */
    dt_adamw_config frozen = o->c.adamw;
    frozen.beta2 = 1.0f;
    const dt_adamw_config *ac = o->frozen ? &frozen : &o->c.adamw;
    if (o->c.kind == DT_OPTIM_LOOKAHEAD) {
        lookahead_pre(o, params, begin, end, begin + base);
        dt_optimizer_update(o->inner, params, grads, begin, end);
        lookahead_post(o, params, begin, end, begin + base);
        return;
    }
    for (size_t i = first_piece(o, begin); i < o->npc; i++) {
        const piece *pc = &o->pc[i];
        if (pc->offset >= end)
            break;
        size_t lo = pc->offset > begin ? pc->offset : begin;
        size_t hi = pc->offset + pc->count < end ? pc->offset + pc->count : end;
        if (lo >= hi)
            continue;
        float wd = decay_of(o, pc->t);
        size_t s = lo + base;
        const dt__copy cp = {o->copy, o->copy_user, lo};
        switch (o->c.kind) {
        case DT_OPTIM_ONEBIT_ADAM:
            /* Compression stage: grads hold the averaged premix x, and
             * m = (1 - beta1) x is AdamW's moment update from m = 0. */
            if (o->frozen)
                memset(o->st[0].buf + s, 0, (hi - lo) * sizeof(float));
            /* fall through */
        case DT_OPTIM_ADAMW:
            dt__adamw_step_copy(params + lo, grads + lo, o->st[0].buf + s, o->st[1].buf + s,
                                hi - lo, o->lr, ac, o->count + 1, wd, &cp);
            break;
        case DT_OPTIM_RADAM:
            dt__radam_step(params + lo, grads + lo, o->st[0].buf + s, o->st[1].buf + s, hi - lo,
                           o->lr, &o->c.adamw, o->count + 1, wd, &cp);
            break;
        case DT_OPTIM_SGD:
            dt__sgd_step_copy(params + lo, grads + lo, o->nstates ? o->st[0].buf + s : NULL,
                              hi - lo, o->lr, o->c.momentum, o->c.nesterov, wd, &cp);
            break;
        case DT_OPTIM_ONEBIT_LAMB: onebit_lamb_range(o, params, grads, lo, hi, s, pc->t); break;
        default: DT_ASSERT(!"not a rangewise kind");
        }
    }
}

void dt_optimizer_update(dt_optimizer *o, float *params, const float *grads, size_t begin,
                         size_t end) {
    DT_ASSERT(o->step >= 0 && dt_optimizer_rangewise(o));
    if (begin >= end)
        return;
    size_t k = range_of(o, begin, end);
    uint64_t t = dt_trace_begin();
    if (!o->disk || !touches_state(o)) {
        update_range(o, params, grads, begin, end, k);
        dt_trace_end(t, DT_TRACE_OPTIM, "optimizer_update", -1, 0, 0);
        return;
    }
    /* Offloaded: in pieces, each reported, so the file streams through a
     * window (any split gives the same bits). */
    const size_t base = o->start[k] - o->owned[k].begin;
    for (size_t lo = begin; lo < end; lo += DT__OFFLOAD_PIECE) {
        size_t hi = end - lo > DT__OFFLOAD_PIECE ? lo + DT__OFFLOAD_PIECE : end;
        dt__offload_before(o->disk, lo + base, hi + base);
        update_range(o, params, grads, lo, hi, k);
        dt__offload_updated(o->disk, lo + base, hi + base);
    }
    dt_trace_end(t, DT_TRACE_OPTIM, "optimizer_update", -1, 0, 0);
}

static dt_status reduce(dt_optimizer *o, double *v, size_t n) {
    if (!o->c.reduce || n == 0)
        return DT_OK;
    dt_status st = o->c.reduce(o->c.reduce_user, v, n);
    if (st != DT_OK)
        dt_error_prefix("%s: summing per-tensor statistics over the ranks",
                        dt_optim_names[o->c.kind]);
    return st;
}

/* Per-item partial sums into stats[2t], stats[2t + 1], in item order. */
static void gather_items(dt_optimizer *o) {
    memset(o->stats, 0, 2 * o->ntab * sizeof *o->stats);
    for (size_t j = 0; j < o->nit; j++) {
        size_t t = o->pc[o->it[j].piece].t;
        o->stats[2 * t] += o->ipart[2 * j];
        o->stats[2 * t + 1] += o->ipart[2 * j + 1];
    }
}

/* Gradient centralisation: each matrix row's gradient minus its mean. */
static dt_status centralize(dt_optimizer *o, float *g) {
    if (o->ngstats == 0)
        return DT_OK;
    memset(o->gstats, 0, o->ngstats * sizeof *o->gstats);
    long ntab = (long)o->ntab;
#pragma omp parallel for schedule(dynamic, 1)
    for (long t = 0; t < ntab; t++) {
        const dt_optim_tensor *tt = &o->tab[t];
        if (!is_matrix(tt))
            continue;
        for (size_t i = o->tpc[t]; i < o->tpc[t + 1]; i++) {
            const piece *pc = &o->pc[i];
            for (size_t a = pc->offset; a < pc->offset + pc->count;) {
                size_t row = (a - tt->offset) / tt->cols;
                size_t row_end = tt->offset + (row + 1) * tt->cols;
                size_t b = row_end < pc->offset + pc->count ? row_end : pc->offset + pc->count;
                dt__lanes l = {{0}};
                dt__lanes_sum(&l, g + a, b - a, false);
                o->gstats[o->goff[t] + row] += dt__lanes_total(&l);
                a = b;
            }
        }
    }
    DT_CHECK(reduce(o, o->gstats, o->ngstats));
#pragma omp parallel for schedule(dynamic, 1)
    for (long t = 0; t < ntab; t++) {
        const dt_optim_tensor *tt = &o->tab[t];
        if (!is_matrix(tt))
            continue;
        for (size_t i = o->tpc[t]; i < o->tpc[t + 1]; i++) {
            const piece *pc = &o->pc[i];
            for (size_t a = pc->offset; a < pc->offset + pc->count;) {
                size_t row = (a - tt->offset) / tt->cols;
                size_t row_end = tt->offset + (row + 1) * tt->cols;
                size_t b = row_end < pc->offset + pc->count ? row_end : pc->offset + pc->count;
                float mean = (float)(o->gstats[o->goff[t] + row] / (double)tt->cols);
                for (size_t j = a; j < b; j++)
                    g[j] = g[j] - mean;
                a = b;
            }
        }
    }
    return DT_OK;
}

/* Item j's first element in the owned-layout states. */
static size_t item_state(const dt_optimizer *o, size_t j) {
    return o->pc[o->it[j].piece].s + o->it[j].off;
}

/* The step's arguments for an item function. */
typedef struct item_args {
    float *p;
    const float *g;
    const void *k, *kn; /* the kernel's scalars: decayed tensors, the others */
    bool vec;
} item_args;

/* fn(o, j, a) for every work item, over OpenMP threads; offloaded, in
 * windows of items whose state fits one piece of the file (at least one
 * item), each mapped before and written back after. The items' results do
 * not depend on the windows. */
static void for_items(dt_optimizer *o, void (*fn)(dt_optimizer *o, size_t j, const item_args *a),
                      const item_args *a) {
    for (size_t j0 = 0, j1; j0 < o->nit; j0 = j1) {
        size_t s0 = item_state(o, j0);
        j1 = j0 + 1;
        while (j1 < o->nit &&
               (!o->disk || item_state(o, j1) + o->it[j1].len - s0 <= DT__OFFLOAD_PIECE))
            j1++;
        size_t s1 = item_state(o, j1 - 1) + o->it[j1 - 1].len;
        disk_before(o, s0, s1);
        long lo = (long)j0, hi = (long)j1;
#pragma omp parallel for schedule(dynamic, 4)
        for (long j = lo; j < hi; j++)
            fn(o, (size_t)j, a);
        disk_after(o, s0, s1);
    }
}

/* LAMB's first pass on item j: the moments, and its sums of p^2 and u^2. */
static void lamb_moments_item(dt_optimizer *o, size_t j, const item_args *a) {
    const item *it = &o->it[j];
    const piece *pc = &o->pc[it->piece];
    size_t x = pc->offset + it->off, s = pc->s + it->off;
    dt__lanes pp = {{0}}, uu = {{0}};
    (a->vec ? dt__lamb_moments_vec
            : dt__lamb_moments_scalar)(a->p + x, a->g + x, o->st[0].buf + s, o->st[1].buf + s,
                                       it->len, o->tab[pc->t].decay ? a->k : a->kn, &pp, &uu);
    o->ipart[2 * j] = dt__lanes_total(&pp);
    o->ipart[2 * j + 1] = dt__lanes_total(&uu);
}

/* LAMB's second pass on item j: p -= lr * trust * u. */
static void lamb_apply_item(dt_optimizer *o, size_t j, const item_args *a) {
    const item *it = &o->it[j];
    const piece *pc = &o->pc[it->piece];
    size_t x = pc->offset + it->off, s = pc->s + it->off;
    float neg = (float)(-(double)o->lr * o->stats[2 * pc->t]);
    (a->vec ? dt__lamb_apply_vec : dt__lamb_apply_scalar)(a->p + x, o->st[0].buf + s,
                                                          o->st[1].buf + s, it->len,
                                                          o->tab[pc->t].decay ? a->k : a->kn, neg);
}

/* LAMB (and 1-bit LAMB's warm-up): moments and norms, the sums over
 * ranks, then the update with trust ratio |p| / |u| per tensor. */
static dt_status lamb_step(dt_optimizer *o, float *p, const float *g) {
    dt__lamb_k kd, kn;
    dt__lamb_k_init(&kd, &o->c.adamw, o->count + 1, o->c.weight_decay, false);
    dt__lamb_k_init(&kn, &o->c.adamw, o->count + 1, 0.0f, false);
    item_args a = {p, g, &kd, &kn, dt__optim_vec()};
    for_items(o, lamb_moments_item, &a);
    gather_items(o);
    DT_CHECK(reduce(o, o->stats, 2 * o->ntab));
    for (size_t t = 0; t < o->ntab; t++) {
        double pn = sqrt(o->stats[2 * t]), un = sqrt(o->stats[2 * t + 1]);
        double r = o->tab[t].decay && pn > 0 && un > 0 ? pn / un : 1.0;
        o->stats[2 * t] = r;
        if (o->c.kind == DT_OPTIM_ONEBIT_LAMB)
            o->tstate[t] = (float)r; /* frozen when the compression stage starts */
    }
    for_items(o, lamb_apply_item, &a);
    return DT_OK;
}

/* LARS's update of item j: momentum SGD on the trust-scaled gradient. */
static void lars_item(dt_optimizer *o, size_t j, const item_args *a) {
    const item *it = &o->it[j];
    const piece *pc = &o->pc[it->piece];
    size_t x = pc->offset + it->off, s = pc->s + it->off;
    float *b = o->nstates ? o->st[0].buf + s : NULL;
    (a->vec ? dt__lars_range_vec
            : dt__lars_range_scalar)(a->p + x, a->g + x, b, it->len, o->lr, o->c.momentum,
                                     o->c.nesterov, decay_of(o, pc->t), (float)o->stats[2 * pc->t]);
}

/* LARS: norms of p and g (no state read), the sums over ranks, then
 * momentum SGD on the trust-scaled gradient of the adapted (decayed)
 * tensors. */
static dt_status lars_step(dt_optimizer *o, float *p, const float *g) {
    bool vec = dt__optim_vec();
    long nit = (long)o->nit;
#pragma omp parallel for schedule(dynamic, 4)
    for (long j = 0; j < nit; j++) {
        const item *it = &o->it[j];
        size_t a = o->pc[it->piece].offset + it->off;
        dt__lanes pp = {{0}}, gg = {{0}};
        dt__lanes_sum(&pp, p + a, it->len, true);
        dt__lanes_sum(&gg, g + a, it->len, true);
        o->ipart[2 * j] = dt__lanes_total(&pp);
        o->ipart[2 * j + 1] = dt__lanes_total(&gg);
    }
    gather_items(o);
    DT_CHECK(reduce(o, o->stats, 2 * o->ntab));
    for (size_t t = 0; t < o->ntab; t++) {
        double wn = sqrt(o->stats[2 * t]), gn = sqrt(o->stats[2 * t + 1]);
        double wd = o->c.weight_decay;
        double r = o->tab[t].decay && wn > 0 && gn > 0
                       ? o->c.trust_coeff * wn / (gn + wn * wd + o->c.trust_eps)
                       : 1.0;
        o->stats[2 * t] = r;
    }
    item_args a = {p, g, NULL, NULL, vec};
    for_items(o, lars_item, &a);
    return DT_OK;
}

/* ---- Adafactor ------------------------------------------------------------ */

/* Calls f on each row segment of piece pc of factored tensor tt:
 * (row, first column, absolute offset, length). */
#define FOR_ROW_SEGMENTS(tt, pc, row, col, a, len, BODY)                                           \
    for (size_t a_ = (pc)->offset; a_ < (pc)->offset + (pc)->count;) {                             \
        size_t row = (a_ - (tt)->offset) / (tt)->cols;                                             \
        size_t col = (a_ - (tt)->offset) % (tt)->cols;                                             \
        size_t end_ = (tt)->offset + (row + 1) * (tt)->cols;                                       \
        size_t b_ = end_ < (pc)->offset + (pc)->count ? end_ : (pc)->offset + (pc)->count;         \
        size_t a = a_, len = b_ - a_;                                                              \
        BODY;                                                                                      \
        a_ = b_;                                                                                   \
    }

/* Adafactor's update of item j (pass 3), with the tensor's scalars ak
 * and a->k = {beta2 at this step, 1 - it}. */
static void adafactor_item(dt_optimizer *o, size_t j, const item_args *a) {
    const item *it = &o->it[j];
    const piece *pc = &o->pc[it->piece];
    const dt_optim_tensor *tt = &o->tab[pc->t];
    const dt__adafactor_k *k = &o->ak[pc->t];
    const float *b2 = a->k;
    float *m = o->c.adafactor.beta1 > 0 ? o->st[0].buf : NULL;
    const piece sub = {pc->offset + it->off, it->len, pc->t, pc->s + it->off, 0}; /* the item */
    if (factored(tt)) {
        const float *rf = o->fac + o->toff[pc->t], *cf = rf + tt->rows;
        FOR_ROW_SEGMENTS(tt, &sub, row, col, x, len, {
            (a->vec ? dt__adafactor_row_vec : dt__adafactor_row_scalar)(
                a->p + x, a->g + x, m ? m + sub.s + (x - sub.offset) : NULL, len, rf[row], cf + col,
                k, NULL);
        })
    } else {
        float *v = o->st[o->nstates - 1].buf + pc->sv + it->off;
        (a->vec ? dt__adafactor_vec_vec : dt__adafactor_vec_scalar)(
            a->p + sub.offset, a->g + sub.offset, v, m ? m + sub.s : NULL, sub.count, b2[0], b2[1],
            o->c.adafactor.eps1, false, k, NULL);
    }
}

static dt_status adafactor_step(dt_optimizer *o, float *p, const float *g) {
    const dt_adafactor_config *af = &o->c.adafactor;
    double t = (double)(o->count + 1);
    double b2t_d = 1.0 - pow(t, (double)af->decay_rate);
    float b2t = (float)b2t_d, omb2t = (float)(1.0 - b2t_d);
    double rel = o->lr;
    if (af->relative_step)
        rel = fmin(af->warmup_init ? 1e-6 * t : 1e-2, 1.0 / sqrt(t));
    bool vec = dt__optim_vec();
    float *v = o->st[o->nstates - 1].buf;
    /* stats: [row and column sums of the factored tensors | |p|^2 per
     * tensor | |u|^2 per tensor]; the first two parts are summed over the
     * ranks at once, the last after pass 2. */
    size_t nrc = o->nstats - 2 * o->ntab;
    double *rc = o->stats, *pp = o->stats + nrc, *uu = pp + o->ntab;
    long ntab = (long)o->ntab;
    memset(o->stats, 0, o->nstats * sizeof *o->stats);
    /* 1. Row and column sums of g^2, and |p|^2. */
#pragma omp parallel for schedule(dynamic, 1)
    for (long ti = 0; ti < ntab; ti++) {
        const dt_optim_tensor *tt = &o->tab[ti];
        for (size_t i = o->tpc[ti]; i < o->tpc[ti + 1]; i++) {
            const piece *pc = &o->pc[i];
            dt__lanes l = {{0}};
            dt__lanes_sum(&l, p + pc->offset, pc->count, true);
            pp[ti] += dt__lanes_total(&l);
            if (!factored(tt))
                continue;
            double *rs = rc + o->soff[ti], *cs = rs + tt->rows;
            FOR_ROW_SEGMENTS(tt, pc, row, col, a, len, {
                rs[row] += (vec ? dt__adafactor_colsq_vec : dt__adafactor_colsq_scalar)(cs + col,
                                                                                        g + a, len);
            })
        }
    }
    DT_CHECK(reduce(o, o->stats, nrc + o->ntab));
    /* 2. The factors R, C and 1/sqrt of them; v of the vectors; |u|^2. */
#pragma omp parallel for schedule(dynamic, 1)
    for (long ti = 0; ti < ntab; ti++) {
        const dt_optim_tensor *tt = &o->tab[ti];
        if (factored(tt)) {
            float *R = o->tstate + o->toff[ti], *C = R + tt->rows;
            float *rf = o->fac + o->toff[ti], *cf = rf + tt->rows;
            const double *rs = rc + o->soff[ti], *cs = rs + tt->rows;
            double rsum = 0;
            for (size_t i = 0; i < tt->rows; i++) {
                float mean = (float)((rs[i] + (double)tt->cols * af->eps1) / (double)tt->cols);
                R[i] = R[i] * b2t + omb2t * mean;
                rsum += R[i];
            }
            for (size_t j = 0; j < tt->cols; j++) {
                float mean = (float)((cs[j] + (double)tt->rows * af->eps1) / (double)tt->rows);
                C[j] = C[j] * b2t + omb2t * mean;
                cf[j] = 1.0f / sqrtf(C[j]);
            }
            float rmean = (float)(rsum / (double)tt->rows);
            for (size_t i = 0; i < tt->rows; i++)
                rf[i] = 1.0f / sqrtf(R[i] / rmean);
        }
        for (size_t i = o->tpc[ti]; i < o->tpc[ti + 1]; i++) {
            const piece *pc = &o->pc[i];
            dt__lanes l = {{0}};
            if (factored(tt)) {
                const float *rf = o->fac + o->toff[ti], *cf = rf + tt->rows;
                FOR_ROW_SEGMENTS(tt, pc, row, col, a, len, {
                    (vec ? dt__adafactor_row_vec : dt__adafactor_row_scalar)(
                        NULL, g + a, NULL, len, rf[row], cf + col, NULL, &l);
                })
            } else {
                (vec ? dt__adafactor_vec_vec
                     : dt__adafactor_vec_scalar)(NULL, g + pc->offset, v + pc->sv, NULL, pc->count,
                                                 b2t, omb2t, af->eps1, true, NULL, &l);
            }
            uu[ti] += dt__lanes_total(&l);
        }
    }
    DT_CHECK(reduce(o, uu, o->ntab));
    /* 3. The update: u clipped to RMS <= clip_threshold, times the step
     * size lr_t = max(eps2, RMS(p)) * rel (or rel alone); the scalars per
     * tensor, then every item (elementwise: m's windows when offloaded). */
    for (size_t ti = 0; ti < o->ntab; ti++) {
        const dt_optim_tensor *tt = &o->tab[ti];
        o->ak[ti] = (dt__adafactor_k){0};
        if (tt->count == 0 || o->tpc[ti] == o->tpc[ti + 1])
            continue;
        double n = (double)tt->count;
        double lr_t = rel;
        if (af->scale_parameter)
            lr_t *= fmax((double)af->eps2, (double)(float)sqrt(pp[ti] / n));
        double rms_u = (double)(float)sqrt(uu[ti] / n);
        double denom = fmax(1.0, rms_u / (double)af->clip_threshold);
        o->ak[ti] = (dt__adafactor_k){.scale = (float)(lr_t / denom),
                                      .b1 = af->beta1,
                                      .omb1 = (float)(1.0 - (double)af->beta1),
                                      .neg_wd = (float)(-(double)decay_of(o, ti) * lr_t)};
    }
    const float b2[2] = {b2t, omb2t};
    item_args a = {p, g, b2, NULL, vec};
    for_items(o, adafactor_item, &a);
    return DT_OK;
}

/* ---- 8-bit AdamW ------------------------------------------------------------ */

/* Block piece j of owned range k: [*lo, *hi) and its code index. */
static void block_piece(const dt_optimizer *o, size_t k, size_t j, size_t *lo, size_t *hi) {
    size_t bs = o->c.block, b0 = o->owned[k].begin / bs + j;
    *lo = b0 * bs > o->owned[k].begin ? b0 * bs : o->owned[k].begin;
    *hi = (b0 + 1) * bs < o->owned[k].end ? (b0 + 1) * bs : o->owned[k].end;
}

static void q8_block(dt_optimizer *o, float *p, const float *g, size_t k, size_t j,
                     const dt__adamw_k *kd, const dt__adamw_k *kn, bool vec) {
    float mb[4096], rb[4096];
    size_t lo, hi;
    block_piece(o, k, j, &lo, &hi);
    size_t base = o->start[k] - o->owned[k].begin, sb = o->qblock[k] + j;
    uint8_t *qm = o->q[0] + lo + base, *qr = o->q[1] + lo + base;
    float am = o->qs[0][sb], ar = o->qs[1][sb], mmax = 0.0f, rmax = 0.0f;
    size_t a = lo;
    for (size_t i = first_piece(o, lo); a < hi; i++) {
        /* A gap no tensor covers keeps its values: dequantised for the
         * block's new scale. */
        size_t next = i < o->npc && o->pc[i].offset < hi ? o->pc[i].offset : hi;
        if (a < next) {
            dt__q8_dequantise(mb + (a - lo), qm + (a - lo), next - a, am, true);
            dt__q8_dequantise(rb + (a - lo), qr + (a - lo), next - a, ar, false);
            for (size_t e = a - lo; e < next - lo; e++) {
                mmax = fmaxf(mmax, fabsf(mb[e]));
                rmax = fmaxf(rmax, rb[e]);
            }
            a = next;
        }
        if (a >= hi)
            break;
        const piece *pc = &o->pc[i];
        size_t b = pc->offset + pc->count < hi ? pc->offset + pc->count : hi;
        (vec ? dt__q8_step_vec : dt__q8_step_scalar)(p + a, g + a, qm + (a - lo), qr + (a - lo), am,
                                                     ar, b - a, o->tab[pc->t].decay ? kd : kn,
                                                     mb + (a - lo), rb + (a - lo), &mmax, &rmax);
        a = b;
    }
    o->qs[0][sb] = mmax;
    o->qs[1][sb] = rmax;
    (vec ? dt__q8_quantise_vec : dt__q8_quantise_scalar)(qm, mb, hi - lo, mmax, true);
    (vec ? dt__q8_quantise_vec : dt__q8_quantise_scalar)(qr, rb, hi - lo, rmax, false);
}

static void q8_step(dt_optimizer *o, float *p, const float *g) {
    dt__adamw_k kd, kn;
    dt__adamw_k_init(&kd, o->lr, &o->c.adamw, o->count + 1, o->c.weight_decay);
    dt__adamw_k_init(&kn, o->lr, &o->c.adamw, o->count + 1, 0.0f);
    bool vec = dt__optim_vec();
    /* Offloaded: windows of whole blocks, one piece of the file each. */
    size_t per = o->disk ? DT__OFFLOAD_PIECE / o->c.block : SIZE_MAX;
    for (size_t k = 0; k < o->nowned; k++) {
        size_t nb = o->qblock[k + 1] - o->qblock[k];
        for (size_t j0 = 0, j1; j0 < nb; j0 = j1) {
            j1 = nb - j0 > per ? j0 + per : nb;
            size_t lo, hi, unused, base = o->start[k] - o->owned[k].begin;
            block_piece(o, k, j0, &lo, &unused);
            block_piece(o, k, j1 - 1, &unused, &hi);
            disk_before(o, lo + base, hi + base);
            long b0 = (long)j0, b1 = (long)j1;
#pragma omp parallel for schedule(static) if (b1 - b0 > 8)
            for (long j = b0; j < b1; j++)
                q8_block(o, p, g, k, (size_t)j, &kd, &kn, vec);
            disk_after(o, lo + base, hi + base);
        }
    }
}

static float kfac_decay(const void *o, size_t t) { return decay_of(o, t); }

dt_status dt_kfac_accumulate(dt_optimizer *o, size_t weight_offset, const float *x, const float *dy,
                             int N, int in, int out, float scale) {
    if (!o->kfac)
        return DT_OK;
    return dt__kfac_accumulate(o->kfac, weight_offset, x, dy, N, in, out, scale);
}

static dt_status step_untraced(dt_optimizer *o, float *params, float *grads);

dt_status dt_optimizer_step(dt_optimizer *o, float *params, float *grads) {
    uint64_t t = dt_trace_begin();
    dt_status st = step_untraced(o, params, grads);
    dt_trace_end(t, DT_TRACE_OPTIM, "optimizer_step", -1, 0, 0);
    return st;
}

static dt_status step_untraced(dt_optimizer *o, float *params, float *grads) {
    DT_ASSERT(o->step >= 0);
    if (o->c.centralize)
        DT_CHECK(centralize(o, grads));
    switch (o->c.kind) {
    case DT_OPTIM_LAMB: return lamb_step(o, params, grads);
    case DT_OPTIM_ONEBIT_LAMB:
        if (!o->frozen)
            return lamb_step(o, params, grads);
        break;
    case DT_OPTIM_LARS: return lars_step(o, params, grads);
    case DT_OPTIM_ADAFACTOR: return adafactor_step(o, params, grads);
    case DT_OPTIM_ADAMW8BIT: q8_step(o, params, grads); return DT_OK;
    case DT_OPTIM_LBFGS:
        return dt_error_set(DT_ERR_INVALID,
                            "lbfgs: its step is driven by dt_lbfgs_next (it evaluates the loss)");
    case DT_OPTIM_KFAC:
        return dt__kfac_step(o->kfac, &o->c, params, grads, o->tstate, o->toff,
                             o->nstates ? o->st[0].buf : NULL, o->lr, o->count, kfac_decay, o);
    case DT_OPTIM_LOOKAHEAD:
        if (!dt_optimizer_rangewise(o->inner)) {
            bool touches = touches_state(o);
            if (touches)
                lookahead_ranges(o, params, lookahead_pre);
            DT_CHECK(dt_optimizer_step(o->inner, params, grads));
            if (touches)
                lookahead_ranges(o, params, lookahead_post);
            return DT_OK;
        }
        break;
    default: break;
    }
    /* Elementwise this step: update() over each owned range. */
    bool centralized = o->c.centralize;
    o->c.centralize = false; /* update() asserts rangewise */
    for (size_t k = 0; k < o->nowned; k++)
        dt_optimizer_update(o, params, grads, o->owned[k].begin, o->owned[k].end);
    o->c.centralize = centralized;
    return DT_OK;
}

void dt_optimizer_end(dt_optimizer *o, bool applied) {
    if (o->inner)
        dt_optimizer_end(o->inner, applied);
    if (applied)
        o->count++;
    if (o->disk)
        dt__offload_step_end(o->disk);
}

void dt_optimizer_settle(dt_optimizer *o) {
    if (o->inner)
        dt_optimizer_settle(o->inner);
    if (o->disk)
        dt__offload_settle(o->disk);
}

size_t dt_optimizer_offload_bytes(const dt_optimizer *o) {
    return (o->inner ? dt_optimizer_offload_bytes(o->inner) : 0) +
           (o->disk ? dt__offload_file_bytes(o->disk) : 0);
}

/* ------------------------------------------------------------------------ */
/* Accessors and state                                                      */
/* ------------------------------------------------------------------------ */

void dt_optimizer_set_copy(dt_optimizer *o, dt_optim_copy_fn fn, void *user) {
    o->copy = fn;
    o->copy_user = user;
}

bool dt_optimizer_writes_copy(const dt_optimizer *o) {
    switch (o->c.kind) {
    case DT_OPTIM_ADAMW:
    case DT_OPTIM_ONEBIT_ADAM:
    case DT_OPTIM_RADAM:
    case DT_OPTIM_SGD: return true;
    default: return false;
    }
}

const dt_optim_config *dt_optimizer_config(const dt_optimizer *o) { return &o->c; }
size_t dt_optimizer_num_owned(const dt_optimizer *o) { return o->nowned; }
size_t dt_optimizer_owned_count(const dt_optimizer *o) { return o->start[o->nowned]; }

dt_range dt_optimizer_owned(const dt_optimizer *o, size_t i) {
    DT_ASSERT(i < o->nowned);
    return o->owned[i];
}
int64_t dt_optimizer_count(const dt_optimizer *o) { return o->count; }

dt_status dt_optimizer_set_count(dt_optimizer *o, int64_t count) {
    if (count < 0)
        return bad("optimizer: update count %" PRId64 " must be >= 0", count);
    o->count = count;
    if (o->inner)
        o->inner->count = count;
    return DT_OK;
}

size_t dt_optimizer_state_bytes(const dt_optimizer *o) {
    size_t b = 0, borrowed = o->inner ? o->inner->nstates : 0;
    for (size_t i = borrowed; i < o->nstates; i++)
        if (o->st[i].buf)
            b += o->st[i].count * sizeof(float);
    if (o->inner)
        b += dt_optimizer_state_bytes(o->inner);
    if (o->q[0])
        b += 2 * (o->start[o->nowned] + o->qblock[o->nowned] * sizeof(float));
    b += o->ttotal * sizeof(float) * (o->fac ? 2 : 1);
    b += (o->nstats + o->ngstats + o->nipart) * sizeof(double);
    if (o->kfac)
        b += dt__kfac_bytes(o->kfac);
    if (o->lbfgs) /* its 2 m + 2 checkpointed vectors; the others and the scalars */
        b += (2 * (size_t)o->c.lbfgs.history + 2) * o->start[o->nowned] * sizeof(float) +
             dt__lbfgs_scalar_bytes(o->lbfgs);
    return b;
}

size_t dt_optimizer_num_states(const dt_optimizer *o) { return o->nstates; }

float *dt_optimizer_state(dt_optimizer *o, size_t i, const char **name) {
    DT_ASSERT(i < o->nstates);
    if (name)
        *name = o->st[i].name;
    return o->st[i].buf;
}

const dt_range *dt_optimizer_state_ranges(const dt_optimizer *o, size_t i, size_t *nranges) {
    DT_ASSERT(i < o->nstates);
    *nranges = o->st[i].ranges ? o->st[i].nranges : o->nowned;
    return o->st[i].ranges ? o->st[i].ranges : o->owned;
}

size_t dt_optimizer_state_count(const dt_optimizer *o, size_t i) {
    DT_ASSERT(i < o->nstates);
    return o->st[i].count;
}

void dt_optimizer_state_get(const dt_optimizer *o, size_t i, float *dst) {
    DT_ASSERT(i < o->nstates);
    if (o->inner && i < o->inner->nstates) { /* Lookahead: the inner one's (8-bit: its codes) */
        dt_optimizer_state_get(o->inner, i, dst);
        return;
    }
    if (o->lbfgs) {
        dt__lbfgs_state_get(o->lbfgs, i, dst);
        return;
    }
    if (o->st[i].buf) {
        memcpy(dst, o->st[i].buf, o->st[i].count * sizeof(float));
        return;
    }
    /* 8-bit: the codes times their block's scale (exact). */
    for (size_t k = 0; k < o->nowned; k++)
        for (size_t j = 0; j < o->qblock[k + 1] - o->qblock[k]; j++) {
            size_t lo, hi, s;
            block_piece(o, k, j, &lo, &hi);
            s = o->start[k] + lo - o->owned[k].begin;
            dt__q8_dequantise(dst + s, o->q[i] + s, hi - lo, o->qs[i][o->qblock[k] + j], i == 0);
        }
}

void dt_optimizer_state_set(dt_optimizer *o, size_t i, const float *src) {
    DT_ASSERT(i < o->nstates);
    if (o->inner && i < o->inner->nstates) {
        dt_optimizer_state_set(o->inner, i, src);
        return;
    }
    if (o->lbfgs) {
        dt__lbfgs_state_set(o->lbfgs, i, src);
        return;
    }
    if (o->st[i].buf) {
        memcpy(o->st[i].buf, src, o->st[i].count * sizeof(float));
        return;
    }
    /* 8-bit: each block's maximum becomes its scale; since dequantised
     * values hold that maximum exactly (code 1.0), set(get()) restores the
     * same codes and scales. The second moment arrives as r = sqrt(v). */
    for (size_t k = 0; k < o->nowned; k++)
        for (size_t j = 0; j < o->qblock[k + 1] - o->qblock[k]; j++) {
            size_t lo, hi, s;
            block_piece(o, k, j, &lo, &hi);
            s = o->start[k] + lo - o->owned[k].begin;
            float amax = 0.0f;
            for (size_t e = s; e < s + hi - lo; e++)
                amax = fmaxf(amax, i == 0 ? fabsf(src[e]) : src[e]);
            o->qs[i][o->qblock[k] + j] = amax;
            dt__q8_quantise_scalar(o->q[i] + s, src + s, hi - lo, amax, i == 0);
        }
}

size_t dt_optimizer_num_tensor_states(const dt_optimizer *o) { return o->ttotal ? 1 : 0; }

float *dt_optimizer_tensor_state(dt_optimizer *o, size_t k, const char **name, size_t *total) {
    DT_ASSERT(k < dt_optimizer_num_tensor_states(o));
    if (name)
        *name = o->tname;
    if (total)
        *total = o->ttotal;
    return o->tstate;
}

void dt_optimizer_tensor_state_at(const dt_optimizer *o, size_t k, size_t tensor, size_t *offset,
                                  size_t *len) {
    DT_ASSERT(k < dt_optimizer_num_tensor_states(o) && tensor < o->ntab);
    *offset = o->toff[tensor];
    *len = o->tlen[tensor];
}

size_t dt_optimizer_num_scalars(const dt_optimizer *o) {
    return o->lbfgs ? dt__lbfgs_num_scalars(o->lbfgs) : 0;
}

void dt_optimizer_scalars_get(const dt_optimizer *o, double *dst) {
    if (o->lbfgs)
        dt__lbfgs_scalars_get(o->lbfgs, dst);
}

dt_status dt_optimizer_scalars_set(dt_optimizer *o, const double *src) {
    return o->lbfgs ? dt__lbfgs_scalars_set(o->lbfgs, src) : DT_OK;
}

dt_status dt_lbfgs_next(dt_optimizer *o, float *params, const float *grads, double loss,
                        bool *more) {
    DT_ASSERT(o->lbfgs && o->step >= 0);
    return dt__lbfgs_next(o->lbfgs, params, grads, loss, more);
}

int dt_lbfgs_evals(const dt_optimizer *o) { return o->lbfgs ? dt__lbfgs_evals(o->lbfgs) : 0; }
