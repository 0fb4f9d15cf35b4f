/*
 * state.c — checkpoints of a run: what each rank writes, how rank 0 commits
 * it, and how any layout resumes from it (docs/checkpoints.md).
 *
 * A checkpoint is a set (dtrain/ckpt.h): rank 0's manifest, holding the
 * training state (step, data position, schedule, loss scaler, the config)
 * and the global tensor table, and the sharded state of every rank that
 * owns some: parameters and optimizer state as boxes of global tensors, and
 * the gradient synchronisation's own per-rank state (codec residuals).
 *
 * Who writes what:
 *   - parameters: the first data-parallel replica (all replicas hold the
 *     same values), each rank the boxes of its model part; tensors that
 *     every tensor-parallel rank holds whole are written by one of them;
 *   - optimizer state: likewise over the optimizer's owned range, by every
 *     replica when replicas own different ranges;
 *   - the synchronisation state: every rank that has one.
 * Shard files first, then (once every rank reported success) the manifest,
 * whose appearance commits the checkpoint; every rank learns the outcome.
 *
 * Resume: rank 0 picks the newest checkpoint whose files all validate and
 * sends the training state to every rank; the first replica of each
 * data-parallel group reads its boxes (in its own layout, from whichever
 * files hold them) and sends them to its replicas. The synchronisation
 * state is restored only into the layout that wrote it.
 */
#include "train_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRAIN_STATE_VERSION 2

/* ------------------------------------------------------------------------ */
/* Saving                                                                   */
/* ------------------------------------------------------------------------ */

/* A growing list of sections and the buffers they point to. */
typedef struct sections {
    dt_ckpt_section s[160];
    size_t n;
    void *owned[96]; /* freed with the list */
    size_t nowned;
} sections;

/* A buffer the list frees. */
static void *own(sections *l, void *p) {
    DT_ASSERT(l->nowned < sizeof l->owned / sizeof l->owned[0]);
    if (p)
        l->owned[l->nowned++] = p;
    return p;
}

static void add(sections *l, const char *name, dt_ckpt_type type, const void *data, size_t count) {
    DT_ASSERT(l->n < sizeof l->s / sizeof l->s[0]);
    l->s[l->n++] = (dt_ckpt_section){name, type, data, count};
}

static void sections_free(sections *l) {
    for (size_t i = 0; i < l->nowned; i++)
        dt_free(l->owned[i]);
}

/* One sharded state: its buffer (the flat ranges r one after another) and
 * its map. */
static dt_status add_state(sections *l, const shards *sh, const char *name, const float *buf,
                           const dt_range *r, size_t nr, char (*map_name)[DT_CKPT_NAME_MAX]) {
    dt_ckpt_box *boxes;
    size_t nb, count = 0;
    DT_CHECK(dt__shards_boxes(sh, r, nr, true, &boxes, &nb));
    for (size_t k = 0; k < nr; k++)
        count += r[k].end - r[k].begin;
    own(l, boxes);
    snprintf(*map_name, sizeof *map_name, "%s%s", name, DT_CKPT_MAP_SUFFIX);
    add(l, name, DT_CKPT_F32, buf, count);
    add(l, *map_name, DT_CKPT_BYTES, boxes, nb * sizeof *boxes);
    return DT_OK;
}

/* The values a resumed run must share with the checkpoint. */
static void idents(const trainer *t, int64_t v[DT_TRAIN_IDENT_COUNT]) {
    int64_t x[DT_TRAIN_IDENT_COUNT] = {t->mc.layers,          t->mc.dim,   t->mc.heads,
                                       t->mc.max_seq,         t->mc.vocab, t->c->optimizer,
                                       (int64_t)t->B * t->dp, t->K,        (int64_t)t->c->seed};
    memcpy(v, x, sizeof x);
}

/* The layout a checkpoint was written from: world size, the degrees of dp,
 * tp, pp, cp, then the axis order. */
#define LAYOUT_COUNT (1 + 2 * DT_AXIS_COUNT)

static void layout(const trainer *t, int64_t v[LAYOUT_COUNT]) {
    const dt_mesh_shape *s = dt_mesh_get_shape(t->mesh);
    v[0] = t->size;
    for (int a = 0; a < DT_AXIS_COUNT; a++) {
        v[1 + a] = s->degree[a];
        v[1 + DT_AXIS_COUNT + a] = s->order[a];
    }
}

/* Everything this rank writes: its shards and its synchronisation state. */
#define MAX_OPTIM_STATES 40
typedef struct rank_part {
    sections l;
    char map_names[1 + MAX_OPTIM_STATES][DT_CKPT_NAME_MAX];
    char tix_name[DT_CKPT_NAME_MAX];
    uint8_t *sync_state;
    double sync_unit;
} rank_part;

/* The optimizer's per-tensor state: its buffer (the table's tensors one
 * after another) and, in NAME.tix, a record (global tensor, offset, length)
 * per tensor that has some, so that a reader in any layout finds each
 * tensor's part by its global index. */
static dt_status add_tensor_state(trainer *t, const shards *sh, rank_part *p) {
    for (size_t k = 0; k < dt_optimizer_num_tensor_states(t->opt); k++) {
        const char *name;
        size_t total;
        float *buf = dt_optimizer_tensor_state(t->opt, k, &name, &total);
        int64_t *rec = own(&p->l, dt_calloc(3 * sh->nt + 1, sizeof *rec));
        if (!rec)
            return DT_ERR_NOMEM;
        size_t nr = 0;
        for (size_t i = 0; i < sh->nt; i++) {
            size_t off, len;
            dt_optimizer_tensor_state_at(t->opt, k, i, &off, &len);
            if (len == 0)
                continue;
            rec[3 * nr] = sh->whole[i].tensor;
            rec[3 * nr + 1] = (int64_t)off;
            rec[3 * nr + 2] = (int64_t)len;
            nr++;
        }
        snprintf(p->tix_name, sizeof p->tix_name, "%s.tix", name);
        add(&p->l, name, DT_CKPT_F32, buf, total);
        add(&p->l, p->tix_name, DT_CKPT_I64, rec, 3 * nr);
    }
    return DT_OK;
}

/* The ranges r[0..nr) of buf one after another, in a new buffer (the
 * layout of a sharded state), and back. */
static float *pack(const float *buf, const dt_range *r, size_t nr) {
    size_t count = 0;
    for (size_t k = 0; k < nr; k++)
        count += r[k].end - r[k].begin;
    float *out = dt_alloc((count + 1) * sizeof(float)), *o = out;
    for (size_t k = 0; out && k < nr; k++) {
        memcpy(o, buf + r[k].begin, (r[k].end - r[k].begin) * sizeof(float));
        o += r[k].end - r[k].begin;
    }
    return out;
}
static void unpack(float *buf, const float *packed, const dt_range *r, size_t nr) {
    for (size_t k = 0; k < nr; k++) {
        memcpy(buf + r[k].begin, packed, (r[k].end - r[k].begin) * sizeof(float));
        packed += r[k].end - r[k].begin;
    }
}

static dt_status rank_part_make(trainer *t, const shards *sh, rank_part *p, const float *model) {
    dt_sync_layout sl;
    dt_grad_sync_layout(t->sync, &sl);
    dt_range all = {0, t->n};
    if (sl.params_sharded) {
        /* ZeRO 3: this replica holds only the pieces its optimizer owns. */
        dt_range *owned = dt__owned_ranges(t->opt);
        size_t nown = dt_optimizer_num_owned(t->opt);
        /* (With --offload params they come from their file for the copy.) */
        dt_status st = dt_grad_sync_hold_params(t->sync, true, false);
        float *mine =
            owned && st == DT_OK ? own(&p->l, pack(dt_gpt_params(t->m), owned, nown)) : NULL;
        dt_status back = dt_grad_sync_hold_params(t->sync, false, false);
        st = st != DT_OK ? st : back;
        if (st == DT_OK)
            st = mine ? add_state(&p->l, sh, "params", mine, owned, nown, &p->map_names[0])
                      : DT_ERR_NOMEM;
        dt_free(owned);
        DT_CHECK(st);
    } else if (!sl.params_replicated || t->sync_rank == 0) {
        const float *src = model ? model : dt_gpt_params(t->m);
        DT_CHECK(add_state(&p->l, sh, "params", src, &all, 1, &p->map_names[0]));
    }
    /* Optimizer state: each per-parameter state over its own ranges (a
     * state kept another way, 8-bit codes, is written as the fp32 values
     * it holds), the per-tensor state keyed by tensor, the scalars once
     * (rank 0, in the manifest). */
    /* An optimizer that owns nothing (the parameter server's workers: the
     * servers keep theirs in the sync state) writes no empty sections. */
    bool writes =
        (!sl.optim_replicated || t->sync_rank == 0) && dt_optimizer_owned_count(t->opt) > 0;
    size_t ns = dt_optimizer_num_states(t->opt);
    DT_ASSERT(ns <= MAX_OPTIM_STATES);
    for (size_t i = 0; writes && i < ns; i++) {
        const char *name;
        float *buf = dt_optimizer_state(t->opt, i, &name);
        size_t count = dt_optimizer_state_count(t->opt, i), nr;
        if (!buf) {
            if (!(buf = own(&p->l, dt_alloc((count ? count : 1) * sizeof(float)))))
                return dt_error_set(DT_ERR_NOMEM, "%s: %zu values for the checkpoint", name, count);
            dt_optimizer_state_get(t->opt, i, buf);
        }
        const dt_range *r = dt_optimizer_state_ranges(t->opt, i, &nr);
        DT_CHECK(add_state(&p->l, sh, name, buf, r, nr, &p->map_names[1 + i]));
    }
    if (writes)
        DT_CHECK(add_tensor_state(t, sh, p));
    size_t nsc = dt_optimizer_num_scalars(t->opt);
    if (t->rank == 0 && nsc > 0) {
        double *sc = own(&p->l, dt_calloc(nsc, sizeof *sc));
        if (!sc)
            return DT_ERR_NOMEM;
        dt_optimizer_scalars_get(t->opt, sc);
        add(&p->l, "optim.scalars", DT_CKPT_F64, sc, nsc);
    }
    size_t bytes = dt_grad_sync_state_bytes(t->sync);
    if (bytes) {
        float unit;
        if (!(p->sync_state = dt_alloc(bytes)))
            return dt_error_set(DT_ERR_NOMEM, "gradient-sync state: %zu bytes", bytes);
        DT_CHECK(dt_grad_sync_get_state(t->sync, p->sync_state, bytes, &unit));
        p->sync_unit = unit;
        const char *ident = dt_grad_sync_state_ident(t->sync);
        add(&p->l, "sync.ident", DT_CKPT_TEXT, ident, strlen(ident));
        add(&p->l, "sync.unit", DT_CKPT_F64, &p->sync_unit, 1);
        add(&p->l, "sync.state", DT_CKPT_BYTES, p->sync_state, bytes);
    }
    return DT_OK;
}

/* Rank 0: the manifest's own sections (the training state), then its
 * shards, then the commit. */
static dt_status write_manifest(trainer *t, const shards *sh, rank_part *p,
                                const dt_ckpt_file_rec *files, size_t nfiles, char *path,
                                size_t len) {
    const dt_train_config *c = t->c;
    int64_t idv[DT_TRAIN_IDENT_COUNT], lay[LAYOUT_COUNT];
    idents(t, idv);
    layout(t, lay);
    int64_t version = TRAIN_STATE_VERSION, step = t->step, tokens = t->tokens;
    dt_loader_state ls = dt_loader_get_state(t->train);
    uint64_t loader[2] = {ls.epoch, ls.step};
    double sched[5] = {(double)t->sched.kind, t->sched.base_lr, t->sched.min_lr,
                       (double)t->sched.warmup, (double)t->sched.total};
    uint64_t rng[2] = {c->seed, (uint64_t)DT_RNG_SAMPLE};
    int64_t tokinfo[2] = {t->tok->kind, t->tok->vocab_size};
    int64_t prec = c->precision, skipped = t->skipped;
    dt_scaler_state ss;
    dt_scaler_get_state(&t->scaler, &ss);
    double scaler[4] = {ss.scale, (double)ss.growth_tracker, (double)ss.skipped, (double)ss.steps};
    sections m = {0};
    add(&m, "train_state_version", DT_CKPT_I64, &version, 1);
    add(&m, "ident", DT_CKPT_I64, idv, DT_TRAIN_IDENT_COUNT);
    add(&m, "layout", DT_CKPT_I64, lay, LAYOUT_COUNT);
    add(&m, "step", DT_CKPT_I64, &step, 1);
    add(&m, "tokens", DT_CKPT_I64, &tokens, 1);
    add(&m, "loader", DT_CKPT_U64, loader, 2);
    add(&m, "schedule", DT_CKPT_F64, sched, 5);
    add(&m, "rng", DT_CKPT_U64, rng, 2);
    add(&m, "tokenizer", DT_CKPT_I64, tokinfo, 2);
    /* The byte table; a bpe tokenizer is named by its hash. */
    if (t->tok->kind == DT_TOKENIZER_BPE)
        add(&m, "vocab", DT_CKPT_BYTES, &t->tok->bpe_hash, sizeof t->tok->bpe_hash);
    else
        add(&m, "vocab", DT_CKPT_BYTES, t->tok->id_to_byte, (size_t)t->tok->vocab_size);
    /* Mixed precision: the compute type (informational: a resume may change
     * it), the skipped steps (AdamW's step count is step - skipped_steps),
     * and the loss scaler when it is on. */
    add(&m, "precision", DT_CKPT_I64, &prec, 1);
    add(&m, "skipped_steps", DT_CKPT_I64, &skipped, 1);
    if (t->scaling)
        add(&m, "scaler", DT_CKPT_F64, scaler, 4);
    add(&m, "config", DT_CKPT_TEXT, t->cfg_text, strlen(t->cfg_text));
    add(&m, DT_CKPT_TENSORS_SECTION, DT_CKPT_BYTES, sh->tensors, sh->ng * sizeof *sh->tensors);
    for (size_t i = 0; i < p->l.n; i++)
        add(&m, p->l.s[i].name, p->l.s[i].type, p->l.s[i].data, p->l.s[i].count);
    return dt_ckpt_save_set(c->ckpt_dir, t->step, m.s, m.n, files, nfiles, c->keep, path, len);
}

/* What each rank reports after writing its shard file. */
typedef struct report {
    int64_t status; /* dt_status */
    int64_t wrote;  /* a shard file exists */
    dt_ckpt_file_rec rec;
    char msg[448];
} report;

dt_status dt__train_save(trainer *t, char *path, size_t len) {
    const dt_train_config *c = t->c;
    double t0 = dt_now();
    shards sh;
    DT_CHECK(dt__shards_make(t, &sh));
    rank_part p = {0};
    report mine = {.status = DT_OK, .rec = {.rank = t->rank}}, *all = NULL;
    /* The strategy's parameters at this step (the parameter server's
     * servers'), else the model's: collective. */
    const float *model = NULL;
    dt_status st = dt_grad_sync_save_params(t->sync, &model);
    if (st == DT_OK)
        st = rank_part_make(t, &sh, &p, model);
    if (st == DT_OK && t->rank != 0 && p.l.n > 0) {
        char shard[4096 + 64];
        dt_ckpt_shard_path(shard, sizeof shard, c->ckpt_dir, t->step, t->rank);
        st = dt_mkdir_p(c->ckpt_dir);
        if (st == DT_OK)
            st = dt_ckpt_write_file_sum(shard, p.l.s, p.l.n, &mine.rec);
        mine.wrote = st == DT_OK;
    }
    if (st != DT_OK) {
        mine.status = st;
        snprintf(mine.msg, sizeof mine.msg, "%s", dt_last_error());
    }
    /* Every rank's outcome reaches rank 0 (and everyone, so that all agree). */
    if (!(all = dt_calloc((size_t)t->size, sizeof *all))) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    if (t->world) {
        st = dt_group_allgather(t->world, &mine, all, sizeof mine, DT_U8);
        if (st != DT_OK)
            goto done;
    } else {
        all[0] = mine;
    }
    int64_t outcome = DT_OK;
    char msg[1024] = "";
    for (int r = 0; r < t->size && outcome == DT_OK; r++)
        if (all[r].status != DT_OK) {
            outcome = all[r].status;
            snprintf(msg, sizeof msg, "rank %d: %.*s", r, (int)sizeof all[r].msg, all[r].msg);
        }
    if (t->rank == 0 && outcome == DT_OK) {
        dt_ckpt_file_rec *files = dt_calloc((size_t)t->size, sizeof *files);
        size_t nf = 0;
        for (int r = 1; files && r < t->size; r++)
            if (all[r].wrote)
                files[nf++] = all[r].rec;
        outcome = files ? write_manifest(t, &sh, &p, files, nf, path, len) : DT_ERR_NOMEM;
        if (outcome != DT_OK)
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        else
            DT_INFO("saved %s in %.3f s", path, dt_now() - t0);
        dt_free(files);
    }
    if (t->world)
        st = dt_group_broadcast(t->world, &outcome, 1, DT_I64, 0);
    if (st == DT_OK && outcome != DT_OK) {
        if (t->rank == 0 || msg[0])
            st = dt_error_set((dt_status)outcome,
                              "checkpoint at step %" PRId64 " failed: %s (the previous "
                              "checkpoint is intact)",
                              t->step, msg);
        else
            st = dt_error_set(DT_ERR_ABORTED,
                              "rank 0 failed to save the checkpoint of step %" PRId64, t->step);
    }
done:
    dt_optimizer_settle(t->opt); /* offloaded state: back to its file */
    dt_free(all);
    dt_free(p.sync_state);
    sections_free(&p.l);
    dt__shards_free(&sh);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Resuming                                                                 */
/* ------------------------------------------------------------------------ */

/* "adamw" for the optimizer field, the number otherwise. */
static const char *ident_text(char *buf, size_t len, int i, int64_t v) {
    if (i == 5 && v >= 0 && v < DT_OPTIM_COUNT)
        return dt_optim_names[v];
    snprintf(buf, len, "%" PRId64, v);
    return buf;
}

/* Read a section that older checkpoints lack: absent leaves dst alone and
 * sets *found = false; present with another shape is the read's error. */
static dt_status read_optional(const dt_ckpt *ck, const char *name, dt_ckpt_type type, void *dst,
                               size_t count, bool *found) {
    dt_ckpt_info info;
    *found = dt_ckpt_find(ck, name, &info) == DT_OK;
    return *found ? dt_ckpt_read(ck, name, type, dst, count) : DT_OK;
}

/* What rank 0 reads from the manifest and sends to everyone. */
typedef struct header {
    int64_t status, found, step, tokens, epoch, loader_step, skipped, precision;
    double scaler[4]; /* scale (0: none in the checkpoint), growth tracker, skipped, steps */
    int64_t layout[LAYOUT_COUNT];
} header;

/* Rank 0: the training state of the manifest, refusing a mismatched one. */
static dt_status load_train_state(trainer *t, const dt_ckpt *ck, header *h) {
    const char *f = dt_ckpt_file(ck);
    int64_t version;
    DT_CHECK(dt_ckpt_read(ck, "train_state_version", DT_CKPT_I64, &version, 1));
    if (version != 1 && version != TRAIN_STATE_VERSION)
        return dt_error_set(DT_ERR_MISMATCH,
                            "checkpoint %s holds training state version %" PRId64
                            ", this build reads versions 1 and %d",
                            f, version, TRAIN_STATE_VERSION);
    int64_t want[DT_TRAIN_IDENT_COUNT], got[DT_TRAIN_IDENT_COUNT];
    idents(t, want);
    DT_CHECK(dt_ckpt_read(ck, "ident", DT_CKPT_I64, got, DT_TRAIN_IDENT_COUNT));
    for (int i = 0; i < DT_TRAIN_IDENT_COUNT; i++) {
        char a[32], b[32];
        if (got[i] != want[i])
            return dt_error_set(DT_ERR_MISMATCH,
                                "checkpoint %s was written with %s %s, this run has %s %s (use "
                                "the same configuration, or another --ckpt-dir)",
                                f, dt_train_ident_names[i], ident_text(a, sizeof a, i, got[i]),
                                dt_train_ident_names[i], ident_text(b, sizeof b, i, want[i]));
    }
    int64_t tokinfo[2];
    DT_CHECK(dt_ckpt_read(ck, "tokenizer", DT_CKPT_I64, tokinfo, 2));
    dt_ckpt_info vi;
    DT_CHECK(dt_ckpt_find(ck, "vocab", &vi));
    bool bpe = t->tok->kind == DT_TOKENIZER_BPE;
    const void *table = bpe ? (const void *)&t->tok->bpe_hash : (const void *)t->tok->id_to_byte;
    size_t tlen = bpe ? sizeof t->tok->bpe_hash : (size_t)t->tok->vocab_size;
    if (tokinfo[0] != t->tok->kind || tokinfo[1] != t->tok->vocab_size || vi.bytes != tlen ||
        memcmp(vi.data, table, vi.bytes) != 0)
        return dt_error_set(
            DT_ERR_MISMATCH,
            "checkpoint %s: vocabulary mismatch (%s tokenizer with %" PRId64
            " tokens in the checkpoint, %s with %d in the data %s)",
            f,
            tokinfo[0] >= 0 && tokinfo[0] < DT_TOKENIZER_COUNT ? dt_tokenizer_names[tokinfo[0]]
                                                               : "?",
            tokinfo[1], dt_tokenizer_names[t->tok->kind], t->tok->vocab_size, t->c->data);
    uint64_t loader[2];
    DT_CHECK(dt_ckpt_read(ck, "step", DT_CKPT_I64, &h->step, 1));
    DT_CHECK(dt_ckpt_read(ck, "tokens", DT_CKPT_I64, &h->tokens, 1));
    DT_CHECK(dt_ckpt_read(ck, "loader", DT_CKPT_U64, loader, 2));
    if (h->step < 0 || h->step > t->c->steps)
        return dt_error_set(DT_ERR_MISMATCH,
                            "checkpoint %s is at step %" PRId64 ", beyond --steps %" PRId64, f,
                            h->step, t->c->steps);
    /* A run resumed with another --steps gets another schedule: the decay
     * is stretched (or squeezed) to the new length, which moves the lr at
     * once. Allowed, since it is how a run is extended, but said. */
    double sched[5];
    if (dt_ckpt_read(ck, "schedule", DT_CKPT_F64, sched, 5) == DT_OK &&
        (int64_t)sched[4] != t->c->steps && h->step < t->c->steps) {
        dt_schedule old = t->sched;
        old.total = (int64_t)sched[4];
        float was = dt_schedule_lr(&old, h->step), now = dt_schedule_lr(&t->sched, h->step);
        if (was != now)
            DT_WARN("--resume: the checkpoint's run had --steps %" PRId64 ", this one %" PRId64
                    ": the %s schedule is stretched to the new length, so the learning rate of "
                    "step %" PRId64 " becomes %.3g instead of %.3g",
                    (int64_t)sched[4], t->c->steps, dt_schedule_names[t->sched.kind], h->step + 1,
                    (double)now, (double)was);
    }
    h->epoch = (int64_t)loader[0];
    h->loader_step = (int64_t)loader[1];
    /* Mixed precision: the compute type may differ from this run's (bf16 ->
     * fp32 is a legitimate way to finish a run). */
    bool found;
    h->skipped = 0;
    h->precision = DT_PRECISION_FP32;
    DT_CHECK(read_optional(ck, "skipped_steps", DT_CKPT_I64, &h->skipped, 1, &found));
    if (h->skipped < 0 || h->skipped > h->step)
        return dt_error_set(DT_ERR_CORRUPT,
                            "checkpoint %s: skipped_steps %" PRId64 " not in [0, step %" PRId64 "]",
                            f, h->skipped, h->step);
    DT_CHECK(read_optional(ck, "precision", DT_CKPT_I64, &h->precision, 1, &found));
    if (h->precision < 0 || h->precision >= DT_PRECISION_COUNT)
        return dt_error_set(DT_ERR_CORRUPT, "checkpoint %s: precision %" PRId64 " is unknown", f,
                            h->precision);
    DT_CHECK(read_optional(ck, "scaler", DT_CKPT_F64, h->scaler, 4, &found));
    if (!found)
        h->scaler[0] = 0;
    DT_CHECK(read_optional(ck, "layout", DT_CKPT_I64, h->layout, LAYOUT_COUNT, &found));
    if (!found) { /* format 1: one data-parallel group over the whole world */
        memset(h->layout, 0, sizeof h->layout);
    }
    return DT_OK;
}

/* All ranks: the scaler from the header. A checkpoint without one (written
 * without loss scaling) starts the scaler afresh; a shorter
 * --loss-scale-interval than the checkpoint's run had makes the scale grow
 * at the next clean step. */
static dt_status restore_scaler(trainer *t, const header *h) {
    if (!t->scaling)
        return DT_OK;
    if (h->scaler[0] <= 0) {
        if (t->rank == 0)
            DT_INFO("%s holds no loss-scaler state (written without loss scaling): the scale "
                    "starts at %g",
                    t->resumed, t->scaler.cfg.init_scale);
        return DT_OK;
    }
    int64_t interval = t->scaler.cfg.growth_interval;
    dt_scaler_state ss = {(float)h->scaler[0],
                          h->scaler[1] >= (double)interval ? interval - 1 : (int64_t)h->scaler[1],
                          (int64_t)h->scaler[2], (int64_t)h->scaler[3]};
    dt_status st = dt_scaler_set_state(&t->scaler, &ss);
    if (st != DT_OK)
        dt_error_prefix("checkpoint %s", t->resumed);
    return st;
}

/* The optimizer's per-tensor state: each tensor's part from whichever file
 * holds a record of its global tensor with the same length (the values
 * are the same in every file that has one). */
static dt_status read_tensor_state(trainer *t, const dt_ckpt_set *set, const shards *sh) {
    for (size_t k = 0; k < dt_optimizer_num_tensor_states(t->opt); k++) {
        const char *name;
        size_t total, missing = 0;
        float *buf = dt_optimizer_tensor_state(t->opt, k, &name, &total);
        char tix[DT_CKPT_NAME_MAX];
        snprintf(tix, sizeof tix, "%s.tix", name);
        for (size_t i = 0; i < sh->nt; i++) {
            size_t off, len;
            bool found = false;
            dt_optimizer_tensor_state_at(t->opt, k, i, &off, &len);
            for (size_t f = 0; len > 0 && !found && f < dt_ckpt_set_num_files(set); f++) {
                const dt_ckpt *ck = dt_ckpt_set_file(set, f);
                dt_ckpt_info ri, vi;
                if (dt_ckpt_find(ck, tix, &ri) != DT_OK || dt_ckpt_find(ck, name, &vi) != DT_OK)
                    continue;
                if (ri.type != DT_CKPT_I64 || ri.count % 3 != 0 || vi.type != DT_CKPT_F32)
                    return dt_error_set(DT_ERR_CORRUPT, "%s: %s or %s has the wrong type",
                                        dt_ckpt_file(ck), tix, name);
                const int64_t *rec = ri.data;
                for (size_t j = 0; j < ri.count / 3 && !found; j++) {
                    if (rec[3 * j] != (int64_t)sh->whole[i].tensor ||
                        rec[3 * j + 2] != (int64_t)len)
                        continue;
                    if (rec[3 * j + 1] < 0 || (uint64_t)rec[3 * j + 1] + len > vi.count)
                        return dt_error_set(DT_ERR_CORRUPT,
                                            "%s: %s names values %" PRId64 "..+%zu of %zu",
                                            dt_ckpt_file(ck), tix, rec[3 * j + 1], len, vi.count);
                    memcpy(buf + off, (const float *)vi.data + rec[3 * j + 1], len * sizeof(float));
                    found = true;
                }
            }
            missing += len > 0 && !found;
        }
        if (missing)
            DT_WARN("--resume: %s holds no %s for %zu tensor(s): it starts from zero there",
                    dt_ckpt_file(dt_ckpt_set_manifest(set)), name, missing);
    }
    return DT_OK;
}

/* The optimizer's scalars, from the manifest. */
static dt_status read_scalars(trainer *t, const dt_ckpt_set *set) {
    size_t n = dt_optimizer_num_scalars(t->opt);
    if (n == 0)
        return DT_OK;
    double v[64];
    DT_ASSERT(n <= 64);
    const dt_ckpt *ck = dt_ckpt_set_manifest(set);
    dt_ckpt_info info;
    if (dt_ckpt_find(ck, "optim.scalars", &info) != DT_OK) {
        DT_WARN("--resume: %s holds no optimizer scalars: they start afresh", dt_ckpt_file(ck));
        return DT_OK;
    }
    DT_CHECK(dt_ckpt_read(ck, "optim.scalars", DT_CKPT_F64, v, n));
    dt_status st = dt_optimizer_scalars_set(t->opt, v);
    if (st != DT_OK)
        dt_error_prefix("checkpoint %s", dt_ckpt_file(ck));
    return st;
}

/* This rank's boxes, in its own layout, of the parameters (`params`: the
 * first replica of each data-parallel group when replicas hold the same)
 * and of the optimizer state (`optim`: likewise, or every replica when
 * each owns its own piece, as under ZeRO). */
static dt_status read_shards(trainer *t, const dt_ckpt_set *set, bool params, bool optim) {
    shards sh;
    DT_CHECK(dt__shards_make(t, &sh));
    dt_ckpt_box *boxes = NULL;
    size_t nb;
    dt_range all = {0, t->n}, *owned = dt__owned_ranges(t->opt);
    size_t nown = dt_optimizer_num_owned(t->opt);
    dt_sync_layout sl;
    dt_grad_sync_layout(t->sync, &sl);
    dt_status st = owned ? DT_OK : DT_ERR_NOMEM;
    /* ZeRO 3 reads only its own pieces (packed, then put in place). */
    const dt_range *pr = sl.params_sharded ? owned : &all;
    size_t npr = sl.params_sharded ? nown : 1;
    float *packed = NULL;
    if (st == DT_OK && params && sl.params_sharded &&
        !(packed = pack(dt_gpt_params(t->m), pr, npr)))
        st = DT_ERR_NOMEM;
    if (st == DT_OK && params)
        st = dt__shards_boxes(&sh, pr, npr, false, &boxes, &nb);
    if (st == DT_OK && params)
        st = dt_ckpt_set_read_boxes(set, "params", sh.tensors, sh.ng, boxes, nb,
                                    packed ? packed : dt_gpt_params(t->m));
    /* ZeRO 3: the pieces written in place, then stored (--offload params:
     * in their file) and what replicas keep whole re-shared. */
    if (st == DT_OK && packed) {
        st = dt_grad_sync_hold_params(t->sync, true, false);
        if (st == DT_OK)
            unpack(dt_gpt_params(t->m), packed, pr, npr);
        dt_status back = dt_grad_sync_hold_params(t->sync, false, st == DT_OK);
        st = st != DT_OK ? st : back;
    }
    dt_free(packed);
    dt_free(boxes);
    boxes = NULL;
    for (size_t i = 0; st == DT_OK && optim && i < dt_optimizer_num_states(t->opt); i++) {
        const char *name;
        float *buf = dt_optimizer_state(t->opt, i, &name), *tmp = NULL;
        if (!dt_ckpt_set_has_state(set, name)) {
            DT_WARN("--resume: %s holds no %s: it starts from zero",
                    dt_ckpt_file(dt_ckpt_set_manifest(set)), name);
            continue;
        }
        size_t nr, count = dt_optimizer_state_count(t->opt, i);
        const dt_range *r = dt_optimizer_state_ranges(t->opt, i, &nr);
        if (!buf) { /* kept another way: read as fp32, then converted */
            if (!(buf = tmp = dt_alloc((count ? count : 1) * sizeof(float)))) {
                st = DT_ERR_NOMEM;
                break;
            }
            dt_optimizer_state_get(t->opt, i, tmp);
        }
        st = dt__shards_boxes(&sh, r, nr, false, &boxes, &nb);
        if (st == DT_OK)
            st = dt_ckpt_set_read_boxes(set, name, sh.tensors, sh.ng, boxes, nb, buf);
        if (st == DT_OK && tmp)
            dt_optimizer_state_set(t->opt, i, tmp);
        dt_free(tmp);
        dt_free(boxes);
        boxes = NULL;
    }
    dt_free(owned);
    if (st == DT_OK && optim)
        st = read_tensor_state(t, set, &sh);
    dt__shards_free(&sh);
    if (st == DT_OK && optim)
        st = read_scalars(t, set);
    return st;
}

/* This rank's synchronisation state from its own file, when the checkpoint
 * was written by this layout with the same strategy settings. Returns
 * whether it was restored; *why says why not. */
static dt_status read_sync_state(trainer *t, const dt_ckpt_set *set, const header *h, bool *done,
                                 const char **why) {
    *done = false;
    int64_t lay[LAYOUT_COUNT];
    layout(t, lay);
    const dt_ckpt *f = dt_ckpt_set_file_of(set, t->rank);
    const char *ident = dt_grad_sync_state_ident(t->sync);
    size_t bytes = dt_grad_sync_state_bytes(t->sync);
    dt_ckpt_info ii, si;
    double unit;
    if (memcmp(lay, h->layout, sizeof lay) != 0) {
        *why = "it was written by another layout";
    } else if (!f || dt_ckpt_find(f, "sync.ident", &ii) != DT_OK) {
        *why = "the checkpoint has none";
    } else if (ii.bytes != strlen(ident) || memcmp(ii.data, ident, ii.bytes) != 0) {
        *why = "it was written with another codec or bucket layout";
    } else if (dt_ckpt_find(f, "sync.state", &si) != DT_OK || si.bytes != bytes ||
               dt_ckpt_read(f, "sync.unit", DT_CKPT_F64, &unit, 1) != DT_OK) {
        *why = "its size does not match";
    } else {
        DT_CHECK(dt_grad_sync_set_state(t->sync, si.data, si.bytes, (float)unit));
        *done = true;
    }
    return DT_OK;
}

/* Every rank: an error on any rank becomes an error on all of them. */
static dt_status agree(trainer *t, dt_status st, const char *what) {
    char msg[1024] = "";
    if (st != DT_OK)
        snprintf(msg, sizeof msg, "%s", dt_last_error());
    /* The lowest failing rank's message goes to every rank (see resume). */
    int64_t first = st != DT_OK ? t->rank : INT64_MAX;
    if (t->world)
        DT_CHECK(dt_group_allreduce(t->world, &first, &first, 1, DT_I64, DT_MIN));
    if (first == INT64_MAX)
        return DT_OK;
    if (t->world)
        DT_CHECK(dt_group_broadcast(t->world, msg, sizeof msg, DT_U8, (int)first));
    if (st != DT_OK)
        return dt_error_set(st, "--resume: %s: %s", what, msg);
    return dt_error_set(DT_ERR_ABORTED, "--resume: rank %d failed to read the %s: %s", (int)first,
                        what, msg);
}

/* The first replica's optimizer state to the others of its gradient group
 * (dp x cp). */
static dt_status broadcast_optimizer(trainer *t, dt_group *dp) {
    for (size_t i = 0; i < dt_optimizer_num_states(t->opt); i++) {
        float *buf = dt_optimizer_state(t->opt, i, NULL);
        size_t count = dt_optimizer_state_count(t->opt, i);
        if (buf) {
            DT_CHECK(dt_group_broadcast(dp, buf, count, DT_F32, 0));
            continue;
        }
        float *tmp = dt_alloc((count ? count : 1) * sizeof(float));
        if (!tmp)
            return DT_ERR_NOMEM;
        dt_optimizer_state_get(t->opt, i, tmp);
        dt_status st = dt_group_broadcast(dp, tmp, count, DT_F32, 0);
        if (st == DT_OK)
            dt_optimizer_state_set(t->opt, i, tmp);
        dt_free(tmp);
        DT_CHECK(st);
    }
    for (size_t k = 0; k < dt_optimizer_num_tensor_states(t->opt); k++) {
        size_t total;
        float *buf = dt_optimizer_tensor_state(t->opt, k, NULL, &total);
        DT_CHECK(dt_group_broadcast(dp, buf, total, DT_F32, 0));
    }
    size_t n = dt_optimizer_num_scalars(t->opt);
    if (n > 0) {
        double v[64];
        DT_ASSERT(n <= 64);
        dt_optimizer_scalars_get(t->opt, v);
        DT_CHECK(dt_group_broadcast(dp, v, n, DT_F64, 0));
        DT_CHECK(dt_optimizer_scalars_set(t->opt, v));
    }
    return DT_OK;
}

dt_status dt__train_resume(trainer *t) {
    const dt_train_config *c = t->c;
    t->resumed[0] = '\0';
    header h = {.status = DT_OK};
    char msg[1024] = "";
    dt_ckpt_set *set = NULL;
    if (t->rank == 0) {
        dt_status st = dt_ckpt_set_open_latest(&set, c->ckpt_dir);
        if (st == DT_ERR_NOT_FOUND) {
            DT_INFO("--resume: no checkpoint in %s yet, starting from step 0", c->ckpt_dir);
        } else if (st == DT_OK) {
            st = load_train_state(t, dt_ckpt_set_manifest(set), &h);
            h.found = st == DT_OK;
        }
        if (st != DT_OK && st != DT_ERR_NOT_FOUND) {
            h.status = st;
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        }
    }
    if (t->world)
        DT_CHECK(dt_group_broadcast(t->world, &h, sizeof h, DT_U8, 0));
    if (h.status != DT_OK) {
        /* Every rank reports rank 0's reason, so that whichever exits first
         * (and is quoted by a launcher) names the cause. */
        dt_ckpt_set_close(set);
        if (t->world)
            DT_CHECK(dt_group_broadcast(t->world, msg, sizeof msg, DT_U8, 0));
        return dt_error_set((dt_status)h.status, "--resume: %s", msg);
    }
    if (!h.found)
        return DT_OK;
    dt_ckpt_path(t->resumed, sizeof t->resumed, c->ckpt_dir, h.step);

    /* Every rank that reads opens the same checkpoint (rank 0 verified it). */
    dt_sync_layout sl;
    dt_grad_sync_layout(t->sync, &sl);
    bool reads_params = !sl.params_replicated || t->sync_rank == 0;
    bool reads_optim = !sl.optim_replicated || t->sync_rank == 0;
    bool reads = reads_params || reads_optim;
    bool has_sync = dt_grad_sync_state_bytes(t->sync) > 0;
    dt_status st = DT_OK, open_st = DT_OK;
    char open_msg[512] = "";
    if (!set && (reads || has_sync)) {
        open_st = dt_ckpt_set_open(&set, t->resumed, false);
        if (open_st != DT_OK)
            snprintf(open_msg, sizeof open_msg, "%s", dt_last_error());
    }
    if (reads)
        st = open_st != DT_OK ? dt_error_set(open_st, "%s", open_msg)
                              : read_shards(t, set, reads_params, reads_optim);
    DT_CHECK_GOTO(agree(t, st, "parameters and optimizer state"), st, fail);
    if (sl.params_replicated) {
        DT_CHECK_GOTO(dt_grad_sync_replicate(t->sync), st, fail);
        dt_group *dp = dt_mesh_replica_group(t->mesh);
        if (dp && sl.optim_replicated)
            DT_CHECK_GOTO(broadcast_optimizer(t, dp), st, fail);
    }
    /* The synchronisation state: restored where the layout and settings
     * match, everywhere or nowhere. A rank that cannot see the checkpoint
     * (no shared directory) starts with zero residuals, as all then do. */
    if (has_sync) {
        bool done = false;
        const char *why = "this rank cannot open the checkpoint";
        if (open_st == DT_OK)
            st = read_sync_state(t, set, &h, &done, &why);
        DT_CHECK_GOTO(agree(t, st, "gradient codec state"), st, fail);
        int64_t all_done = done;
        if (t->world)
            DT_CHECK_GOTO(dt_group_allreduce(t->world, &all_done, &all_done, 1, DT_I64, DT_MIN), st,
                          fail);
        if (!all_done) {
            if (!done)
                DT_WARN("--resume: gradient codec state not restored (%s): residuals start "
                        "from zero",
                        why);
            dt_grad_sync_reset_state(t->sync);
        }
    }
    dt_ckpt_set_close(set);
    set = NULL;
    dt_optimizer_settle(t->opt); /* offloaded state: back to its file */
    t->step = h.step;
    t->tokens = h.tokens;
    t->skipped = h.skipped;
    t->ckpt_precision = h.precision;
    DT_CHECK(dt_optimizer_set_count(t->opt, h.step - h.skipped));
    DT_CHECK(restore_scaler(t, &h));
    return dt_loader_set_state(t->train,
                               (dt_loader_state){(uint64_t)h.epoch, (uint64_t)h.loader_step});
fail:
    dt_ckpt_set_close(set);
    return st;
}
