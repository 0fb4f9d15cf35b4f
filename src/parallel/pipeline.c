/*
 * pipeline.c — pipeline schedules as data: the generators (GPipe, 1F1B,
 * interleaved 1F1B, zero-bubble ZB-H1), the checker that simulates a table
 * before it runs, and the timeline (text and SVG). See parallel.h.
 *
 * Invariants of a table the checker accepts:
 *   - rank r's list holds F(mb, c), B(mb, c) (and W(mb, c) when split) once
 *     for every micro-batch mb < M and chunk c < V, in that order for each
 *     (mb, c), each framed by the transfers its virtual stage needs:
 *     recv-act before F and send-act after it (unless the stage is the
 *     first / last), recv-grad before B and send-grad after it (unless the
 *     stage is the last / first), every peer the rank of the neighbouring
 *     virtual stage;
 *   - between any two ranks, the k-th send one way matches the k-th receive
 *     the other way (the comm layer numbers point-to-point messages per
 *     direction and peer), same kind, micro-batch and stage;
 *   - the simulation of blocking batches (consecutive transfers of a list)
 *     reaches the end of every list.
 */
#include "dtrain/parallel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const dt_pp_kind_names[DT_PP_KIND_COUNT] = {"gpipe", "1f1b", "interleaved", "zb"};
const char *const dt_pp_op_names[DT_PP_OP_COUNT] = {"F",        "B",         "W",        "send-act",
                                                    "recv-act", "send-grad", "recv-grad"};

#define bad(...) dt_error_set(DT_ERR_INVALID, __VA_ARGS__)

dt_status dt_pp_kind_parse(const char *knob, const char *text, dt_pp_kind *kind, int *chunks) {
    *chunks = 1;
    for (int k = 0; text && k < DT_PP_KIND_COUNT; k++)
        if (k != DT_PP_INTERLEAVED && strcmp(text, dt_pp_kind_names[k]) == 0) {
            *kind = (dt_pp_kind)k;
            return DT_OK;
        }
    if (text && strncmp(text, "interleaved:", 12) == 0) {
        char *end;
        long v = strtol(text + 12, &end, 10);
        if (text[12] >= '0' && text[12] <= '9' && !*end && v >= 2 && v <= 1024) {
            *kind = DT_PP_INTERLEAVED;
            *chunks = (int)v;
            return DT_OK;
        }
    }
    return bad("%s \"%s\": expected gpipe, 1f1b, interleaved:V (V in [2, 1024]) or zb", knob,
               text ? text : "(null)");
}

int dt_pp_stage_of(const dt_pp_schedule *s, int rank, int chunk) {
    return chunk * s->stages + rank;
}

void dt_pp_place(const dt_pp_schedule *s, int stage, int *rank, int *chunk) {
    *rank = stage % s->stages;
    *chunk = stage / s->stages;
}

dt_pp_costs dt_pp_costs_default(void) { return (dt_pp_costs){.f = 1, .b = 1, .w = 1, .comm = 0}; }

static bool is_transfer(int op) { return op >= DT_PP_SEND_ACT; }

/* ------------------------------------------------------------------------ */
/* Generators                                                               */
/* ------------------------------------------------------------------------ */

/* A growing action list. */
typedef struct list {
    dt_pp_action *a;
    size_t n, cap;
    bool failed;
} list;

static void push(list *l, int op, int mb, int chunk, int peer) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        dt_pp_action *a = realloc(l->a, cap * sizeof *a);
        if (!a) {
            l->failed = true;
            return;
        }
        l->a = a;
        l->cap = cap;
    }
    l->a[l->n++] = (dt_pp_action){(uint8_t)op, 0, (uint16_t)chunk, (uint32_t)mb, peer};
}

/* A compute action of rank r with the transfers its virtual stage needs
 * around it (parallel.h). */
static void emit(list *l, const dt_pp_schedule *s, int r, int op, int mb, int c) {
    int st = dt_pp_stage_of(s, r, c), S = s->stages * s->chunks, pr, pc;
    if (op == DT_PP_F && st > 0) {
        dt_pp_place(s, st - 1, &pr, &pc);
        push(l, DT_PP_RECV_ACT, mb, c, pr);
    }
    if (op == DT_PP_B && st < S - 1) {
        dt_pp_place(s, st + 1, &pr, &pc);
        push(l, DT_PP_RECV_GRAD, mb, c, pr);
    }
    push(l, op, mb, c, -1);
    if (op == DT_PP_F && st < S - 1) {
        dt_pp_place(s, st + 1, &pr, &pc);
        push(l, DT_PP_SEND_ACT, mb, c, pr);
    }
    if (op == DT_PP_B && st > 0) {
        dt_pp_place(s, st - 1, &pr, &pc);
        push(l, DT_PP_SEND_GRAD, mb, c, pr);
    }
}

/* Interleaved 1F1B's k-th forward (backward: reversed chunks) of rank
 * order: groups of P micro-batches per chunk (Megatron). */
static void interleaved_at(const dt_pp_schedule *s, int k, bool backward, int *mb, int *c) {
    int P = s->stages, V = s->chunks;
    *c = (k / P) % V;
    if (backward)
        *c = V - 1 - *c;
    *mb = (k / (P * V)) * P + k % P;
}

/* GPipe, 1F1B, interleaved: the classic warm-up / steady / cool-down. */
static void gen_1f1b(list *l, const dt_pp_schedule *s, int r) {
    int P = s->stages, V = s->chunks, M = s->micro, total = M * V, warm;
    if (s->kind == DT_PP_GPIPE)
        warm = total;
    else if (s->kind == DT_PP_1F1B)
        warm = P - r - 1;
    else
        warm = (P - r - 1) * 2 + (V - 1) * P;
    warm = warm < total ? warm : total;
    int mb, c;
    for (int k = 0; k < warm; k++) {
        interleaved_at(s, k, false, &mb, &c);
        emit(l, s, r, DT_PP_F, mb, c);
    }
    for (int i = 0; i < total - warm; i++) {
        interleaved_at(s, warm + i, false, &mb, &c);
        emit(l, s, r, DT_PP_F, mb, c);
        interleaved_at(s, i, true, &mb, &c);
        emit(l, s, r, DT_PP_B, mb, c);
    }
    for (int k = total - warm; k < total; k++) {
        interleaved_at(s, k, true, &mb, &c);
        emit(l, s, r, DT_PP_B, mb, c);
    }
}

/* ZB-H1 by list scheduling in unit time slots: a rank runs the next ready
 * B (the critical path) first, else the next forward if its input arrived
 * and its live activations stay within 1F1B's P - r, else a pending W
 * (which frees an activation), else idles. W thus fills the bubbles 1F1B
 * leaves at the end of a step, at 1F1B's peak memory. */
static dt_status gen_zb(list *lists, const dt_pp_schedule *s) {
    const int P = s->stages, M = s->micro;
    /* done_f / done_b: the slot in which F / B of (rank, mb) finished, or -1 */
    int *done_f = malloc((size_t)P * M * sizeof *done_f);
    int *done_b = malloc((size_t)P * M * sizeof *done_b);
    int *nf = calloc((size_t)P, sizeof *nf), *nb = calloc((size_t)P, sizeof *nb);
    int *nw = calloc((size_t)P, sizeof *nw);
    dt_status st = DT_OK;
    if (!done_f || !done_b || !nf || !nb || !nw) {
        st = DT_ERR_NOMEM;
        goto out;
    }
    for (int i = 0; i < P * M; i++)
        done_f[i] = done_b[i] = -1;
    int left = 3 * P * M;
    for (int t = 0; left > 0; t++) {
        for (int r = 0; r < P; r++) {
            int b = nb[r], f = nf[r], w = nw[r];
            bool b_ready =
                b < M && done_f[r * M + b] >= 0 && done_f[r * M + b] < t &&
                (r == P - 1 || (done_b[(r + 1) * M + b] >= 0 && done_b[(r + 1) * M + b] < t));
            bool f_ready =
                f < M && f - w < P - r &&
                (r == 0 || (done_f[(r - 1) * M + f] >= 0 && done_f[(r - 1) * M + f] < t));
            if (b_ready) {
                emit(&lists[r], s, r, DT_PP_B, b, 0);
                done_b[r * M + b] = t;
                nb[r]++;
            } else if (f_ready) {
                emit(&lists[r], s, r, DT_PP_F, f, 0);
                done_f[r * M + f] = t;
                nf[r]++;
            } else if (w < b) {
                emit(&lists[r], s, r, DT_PP_W, w, 0);
                nw[r]++;
            } else {
                continue;
            }
            left--;
        }
        if (t > 16 * (P + M) + 64) { /* cannot happen: every slot some rank progresses */
            st = dt_error_set(DT_ERR_INTERNAL, "zb generator did not finish (P %d, M %d)", P, M);
            break;
        }
    }
out:
    free(done_f);
    free(done_b);
    free(nf);
    free(nb);
    free(nw);
    return st;
}

static dt_status alloc_schedule(dt_pp_schedule **out, dt_pp_kind kind, int P, int V, int M,
                                bool split_w, size_t total) {
    dt_pp_schedule *s = dt_calloc(1, sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->kind = kind;
    s->stages = P;
    s->chunks = V;
    s->micro = M;
    s->split_w = split_w;
    s->start = dt_calloc((size_t)P + 1, sizeof *s->start);
    s->actions = dt_calloc(total ? total : 1, sizeof *s->actions);
    if (!s->start || !s->actions) {
        dt_pp_schedule_destroy(s);
        return DT_ERR_NOMEM;
    }
    *out = s;
    return DT_OK;
}

dt_status dt_pp_schedule_create(dt_pp_schedule **out, dt_pp_kind kind, int P, int V, int M) {
    *out = NULL;
    if ((unsigned)kind >= DT_PP_KIND_COUNT)
        return bad("pipeline schedule kind %d is not a schedule", (int)kind);
    if (P < 1 || P > 4096 || M < 1 || M > (1 << 20))
        return bad("pipeline: %d stage(s) and %d micro-batch(es): each must be at least 1 "
                   "(stages at most 4096, micro-batches at most 2^20)",
                   P, M);
    if (kind == DT_PP_INTERLEAVED) {
        if (V < 2 || V > 1024)
            return bad("interleaved:%d: needs 2 to 1024 chunks per rank", V);
        if (P < 2)
            return bad("interleaved:%d needs at least 2 pipeline stages (one rank would hold "
                       "every chunk)",
                       V);
        if (M % P != 0)
            return bad("interleaved:%d: --micro-batches %d must be a multiple of the %d stages "
                       "(Megatron's interleaved schedule runs micro-batches in groups of P)",
                       V, M, P);
    } else if (V != 1) {
        return bad("%s: %d chunks per rank; only interleaved places several",
                   dt_pp_kind_names[kind], V);
    }
    dt_pp_schedule proto = {
        .kind = kind, .stages = P, .chunks = V, .micro = M, .split_w = kind == DT_PP_ZB};
    list *lists = dt_calloc((size_t)P, sizeof *lists);
    if (!lists)
        return DT_ERR_NOMEM;
    dt_status st = DT_OK;
    if (kind == DT_PP_ZB)
        st = gen_zb(lists, &proto);
    else
        for (int r = 0; r < P; r++)
            gen_1f1b(&lists[r], &proto, r);
    size_t total = 0;
    for (int r = 0; r < P; r++) {
        if (lists[r].failed)
            st = DT_ERR_NOMEM;
        total += lists[r].n;
    }
    dt_pp_schedule *s = NULL;
    if (st == DT_OK)
        st = alloc_schedule(&s, kind, P, V, M, proto.split_w, total);
    for (int r = 0; r < P; r++) {
        if (st == DT_OK) {
            memcpy(s->actions + s->start[r], lists[r].a, lists[r].n * sizeof *lists[r].a);
            s->start[r + 1] = s->start[r] + lists[r].n;
        }
        free(lists[r].a);
    }
    dt_free(lists);
    if (st != DT_OK)
        return st;
    *out = s;
    return DT_OK;
}

dt_status dt_pp_schedule_from(dt_pp_schedule **out, dt_pp_kind kind, int P, int V, int M,
                              bool split_w, const size_t *counts, const dt_pp_action *actions) {
    *out = NULL;
    if (P < 1 || V < 1 || M < 1)
        return bad("pipeline table: %d stages, %d chunks, %d micro-batches (each >= 1)", P, V, M);
    size_t total = 0;
    for (int r = 0; r < P; r++)
        total += counts[r];
    dt_pp_schedule *s;
    DT_CHECK(alloc_schedule(&s, kind, P, V, M, split_w, total));
    for (int r = 0; r < P; r++)
        s->start[r + 1] = s->start[r] + counts[r];
    memcpy(s->actions, actions, total * sizeof *actions);
    *out = s;
    return DT_OK;
}

void dt_pp_schedule_destroy(dt_pp_schedule *s) {
    if (!s)
        return;
    dt_free(s->start);
    dt_free(s->actions);
    dt_free(s);
}

dt_status dt_pp_model_part(const dt_pp_schedule *s, int layers, int rank, dt_gpt_part *part) {
    const int S = s->stages * s->chunks;
    if (layers < S)
        return dt_error_set(DT_ERR_INVALID,
                            "pipeline: %d stage(s) x %d chunk(s) = %d virtual stages, but the "
                            "model has %d layers (every stage needs one)",
                            s->stages, s->chunks, S, layers);
    if (rank < 0 || rank >= s->stages)
        return dt_error_set(DT_ERR_INVALID, "pipeline: rank %d of %d stages", rank, s->stages);
    if (s->chunks > DT_GPT_MAX_CHUNKS)
        return dt_error_set(DT_ERR_INVALID, "pipeline: %d chunks per rank (at most %d)", s->chunks,
                            DT_GPT_MAX_CHUNKS);
    part->chunks = s->chunks;
    for (int c = 0; c < s->chunks; c++) {
        long stg = dt_pp_stage_of(s, rank, c);
        part->layers[c] = (dt_layer_range){(int)(layers * stg / S), (int)(layers * (stg + 1) / S)};
    }
    return DT_OK;
}

int dt_pp_slots(const dt_pp_schedule *s, const dt_pp_report *r, int rank) {
    int n = 1;
    for (int c = 0; c < s->chunks; c++) {
        int k = r->chunk_live[(size_t)rank * s->chunks + c];
        n = k > n ? k : n;
    }
    return n;
}

double dt_pp_theoretical_bubble(dt_pp_kind kind, int P, int V, int M) {
    if (kind == DT_PP_INTERLEAVED)
        return (double)(P - 1) / ((double)V * M + P - 1);
    return (double)(P - 1) / ((double)M + P - 1);
}

/* ------------------------------------------------------------------------ */
/* The checker                                                              */
/* ------------------------------------------------------------------------ */

/* "rank 1 action #7 (send-act mb 3 chunk 0 to rank 2)" */
static const char *describe(const dt_pp_schedule *s, size_t i, char *buf, size_t len) {
    int r = 0;
    while (s->start[r + 1] <= i)
        r++;
    const dt_pp_action *a = &s->actions[i];
    int n = snprintf(buf, len, "rank %d action #%zu (%s mb %u chunk %u", r, i - s->start[r],
                     a->op < DT_PP_OP_COUNT ? dt_pp_op_names[a->op] : "?", a->mb, a->chunk);
    if (n > 0 && (size_t)n < len && is_transfer(a->op))
        n += snprintf(buf + n, len - (size_t)n, " %s rank %d",
                      a->op == DT_PP_SEND_ACT || a->op == DT_PP_SEND_GRAD ? "to" : "from", a->peer);
    if (n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, ")");
    return buf;
}

#define refuse(i, ...)                                                                             \
    do {                                                                                           \
        char what_[160], msg_[256];                                                                \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                                  \
        st = bad("pipeline schedule: %s: %s", describe(s, (i), what_, sizeof what_), msg_);        \
        goto out;                                                                                  \
    } while (0)

/* Where (mb, chunk)'s action `op` sits in rank r's list, per kind. */
enum { SLOT_F, SLOT_B, SLOT_W, SLOT_SA, SLOT_RA, SLOT_SG, SLOT_RG, SLOT_COUNT };

/* The transfers a stage needs, by op: whether stage st has one. */
static bool needs(int op, int st, int S) {
    switch (op) {
    case DT_PP_RECV_ACT:
    case DT_PP_SEND_GRAD: return st > 0;
    case DT_PP_SEND_ACT:
    case DT_PP_RECV_GRAD: return st < S - 1;
    default: return true;
    }
}

/* The rank a transfer must name: the neighbouring stage's. */
static int expected_peer(const dt_pp_schedule *s, int op, int st) {
    int r, c;
    dt_pp_place(s, op == DT_PP_RECV_ACT || op == DT_PP_SEND_GRAD ? st - 1 : st + 1, &r, &c);
    return r;
}

/* The key two matching transfers share: kind, micro-batch and the stage of
 * the sender. */
static uint64_t transfer_key(const dt_pp_schedule *s, int r, const dt_pp_action *a) {
    int st = dt_pp_stage_of(s, r, a->chunk);
    bool act = a->op == DT_PP_SEND_ACT || a->op == DT_PP_RECV_ACT;
    int sender = a->op == DT_PP_SEND_ACT || a->op == DT_PP_SEND_GRAD ? st : act ? st - 1 : st + 1;
    return ((uint64_t)act << 63) | ((uint64_t)a->mb << 24) | (uint64_t)sender;
}

/* The comm flow of transfer i: 0 activations (forward), 1 gradients. */
static int flow_of(const dt_pp_schedule *s, size_t i) {
    int op = s->actions[i].op;
    return op == DT_PP_SEND_ACT || op == DT_PP_RECV_ACT ? 0 : 1;
}

dt_status dt_pp_check(const dt_pp_schedule *s, const dt_pp_costs *costs, dt_pp_report *out) {
    memset(out, 0, sizeof *out);
    const int P = s->stages, V = s->chunks, M = s->micro, S = P * V;
    const size_t n = s->start[P];
    const dt_pp_costs c = costs ? *costs : dt_pp_costs_default();
    dt_status st = DT_OK;
    /* slot[(r, c, mb, kind)] = action index + 1 */
    size_t nslots = (size_t)P * V * M * SLOT_COUNT;
    size_t *slot = calloc(nslots, sizeof *slot);
    size_t *match = malloc((n ? n : 1) * sizeof *match);
    double *posted = malloc((n ? n : 1) * sizeof *posted);
    double *done_at = malloc((n ? n : 1) * sizeof *done_at);
    size_t *pc = calloc((size_t)P, sizeof *pc); /* next action of each rank (absolute) */
    size_t *qhead =
        calloc(2 * (size_t)P, sizeof *qhead); /* per rank and flow: first open transfer */
    double *qlast = calloc(2 * (size_t)P, sizeof *qlast); /* ... when its last batch completed */
    double *clock = calloc((size_t)P, sizeof *clock);
    out->peak_live = dt_calloc((size_t)P, sizeof *out->peak_live);
    out->chunk_live = dt_calloc((size_t)P * V, sizeof *out->chunk_live);
    int *live_c = calloc((size_t)V, sizeof *live_c);
    out->busy = dt_calloc((size_t)P, sizeof *out->busy);
    out->start = dt_calloc(n ? n : 1, sizeof *out->start);
    out->end = dt_calloc(n ? n : 1, sizeof *out->end);
    if (!slot || !match || !posted || !done_at || !pc || !qhead || !qlast || !clock ||
        !out->peak_live || !out->chunk_live || !live_c || !out->busy || !out->start || !out->end) {
        st = DT_ERR_NOMEM;
        goto out;
    }
#define SLOT(r, ch, mb, k) slot[((((size_t)(r)*V + (ch)) * M + (mb)) * SLOT_COUNT) + (k)]
    /* 1. Every action well formed, once, in order, framed by its transfers. */
    for (int r = 0; r < P; r++) {
        int live = 0;
        memset(live_c, 0, (size_t)V * sizeof *live_c);
        for (size_t i = s->start[r]; i < s->start[r + 1]; i++) {
            const dt_pp_action *a = &s->actions[i];
            if (a->op >= DT_PP_OP_COUNT || a->chunk >= V || a->mb >= (uint32_t)M)
                refuse(i, "outside the table (ops, %d chunk(s), %d micro-batch(es))", V, M);
            int stg = dt_pp_stage_of(s, r, a->chunk), k = a->op;
            if (k == DT_PP_W && !s->split_w)
                refuse(i, "a W action in a schedule whose B computes the weight gradient");
            if (is_transfer(k)) {
                if (!needs(k, stg, S))
                    refuse(i, "stage %d has no %s neighbour", stg,
                           k == DT_PP_RECV_ACT || k == DT_PP_SEND_GRAD ? "previous" : "next");
                if (a->peer != expected_peer(s, k, stg))
                    refuse(i, "stage %d's neighbour is on rank %d", stg, expected_peer(s, k, stg));
            } else if (a->peer != -1) {
                refuse(i, "a compute action names peer %d", a->peer);
            }
            if (SLOT(r, a->chunk, a->mb, k))
                refuse(i, "repeats action #%zu", SLOT(r, a->chunk, a->mb, k) - 1 - s->start[r]);
            /* Order: recv-act < F < send-act, F < B, recv-grad < B < send-grad, B < W. */
            size_t *sl = &SLOT(r, a->chunk, a->mb, 0);
            bool ok = true;
            switch (k) {
            case DT_PP_F: ok = !needs(DT_PP_RECV_ACT, stg, S) || sl[SLOT_RA]; break;
            case DT_PP_SEND_ACT: ok = sl[SLOT_F]; break;
            case DT_PP_B:
                ok = sl[SLOT_F] && (!needs(DT_PP_RECV_GRAD, stg, S) || sl[SLOT_RG]);
                break;
            case DT_PP_SEND_GRAD: ok = sl[SLOT_B]; break;
            case DT_PP_W: ok = sl[SLOT_B]; break;
            default: break;
            }
            if (!ok)
                refuse(i, "comes before what it needs (its %s)",
                       k == DT_PP_F          ? "recv-act"
                       : k == DT_PP_B        ? "F and recv-grad"
                       : k == DT_PP_W        ? "B"
                       : k == DT_PP_SEND_ACT ? "F"
                                             : "B");
            sl[k] = i + 1;
            int delta = k == DT_PP_F ? 1 : k == (s->split_w ? DT_PP_W : DT_PP_B) ? -1 : 0;
            live += delta;
            live_c[a->chunk] += delta;
            out->peak_live[r] = live > out->peak_live[r] ? live : out->peak_live[r];
            int *cl = &out->chunk_live[(size_t)r * V + a->chunk];
            *cl = live_c[a->chunk] > *cl ? live_c[a->chunk] : *cl;
        }
        /* Nothing missing. */
        for (int ch = 0; ch < V; ch++)
            for (int mb = 0; mb < M; mb++)
                for (int k = 0; k < SLOT_COUNT; k++) {
                    int stg = dt_pp_stage_of(s, r, ch);
                    bool want = k == SLOT_W ? s->split_w : needs(k, stg, S);
                    if (want && !SLOT(r, ch, mb, k)) {
                        st = bad("pipeline schedule: rank %d lacks %s of micro-batch %d chunk "
                                 "%d (stage %d)",
                                 r, dt_pp_op_names[k], mb, ch, stg);
                        goto out;
                    }
                }
    }
    /* 2. Sends and receives pair up per direction, in order. */
    for (int a = 0; a < P; a++)
        for (int b = 0; b < P; b++) {
            if (a == b)
                continue;
            size_t i = s->start[a], j = s->start[b];
            for (;;) {
                while (i < s->start[a + 1] && !((s->actions[i].op == DT_PP_SEND_ACT ||
                                                 s->actions[i].op == DT_PP_SEND_GRAD) &&
                                                s->actions[i].peer == b))
                    i++;
                while (j < s->start[b + 1] && !((s->actions[j].op == DT_PP_RECV_ACT ||
                                                 s->actions[j].op == DT_PP_RECV_GRAD) &&
                                                s->actions[j].peer == a))
                    j++;
                bool si = i < s->start[a + 1], rj = j < s->start[b + 1];
                if (!si && !rj)
                    break;
                if (!si)
                    refuse(j, "no send from rank %d is left to match it", a);
                if (!rj)
                    refuse(i, "no receive on rank %d is left to match it", b);
                if (transfer_key(s, a, &s->actions[i]) != transfer_key(s, b, &s->actions[j])) {
                    char other[160];
                    refuse(i, "meets %s: every pair of ranks matches transfers in order",
                           describe(s, j, other, sizeof other));
                }
                match[i] = j;
                match[j] = i;
                i++, j++;
            }
        }
#define flow(i) flow_of(s, (i))
    /* 3. Simulate the executor. A run of consecutive transfers is posted at
     * once and the rank moves on: activations go through one comm group,
     * gradients through another, so each run is up to two batches, one per
     * flow. A group completes a rank's batches in order, each once every
     * transfer in it met its partner (+ comm). A compute action waits for
     * the batch that brings its input; the step ends when every batch is
     * done. */
    for (size_t i = 0; i < n; i++)
        posted[i] = done_at[i] = -1;
    for (int r = 0; r < P; r++)
        for (int q = 0; q < 2; q++) {
            qhead[2 * r + q] = s->start[r];
            qlast[2 * r + q] = 0;
        }
    for (int r = 0; r < P; r++)
        pc[r] = s->start[r];
    size_t done = 0;
    for (;;) {
        bool progressed = false;
        for (int r = 0; r < P; r++) {
            /* Complete this rank's posted batches, per flow in order. */
            for (int q = 0; q < 2; q++) {
                size_t *h = &qhead[2 * r + q];
                for (;;) {
                    while (*h < pc[r] && !(is_transfer(s->actions[*h].op) && flow(*h) == q))
                        (*h)++;
                    if (*h >= pc[r])
                        break;
                    /* The batch: this flow's transfers of the run that holds *h. */
                    size_t e = *h;
                    while (e < pc[r] && is_transfer(s->actions[e].op))
                        e++;
                    double t = qlast[2 * r + q];
                    bool known = true;
                    for (size_t k = *h; k < e && known; k++)
                        if (flow(k) == q) {
                            if (posted[match[k]] < 0)
                                known = false;
                            else
                                t = fmax(t, fmax(posted[k], posted[match[k]]));
                        }
                    if (!known)
                        break;
                    t += c.comm;
                    for (size_t k = *h; k < e; k++)
                        if (flow(k) == q) {
                            out->start[k] = posted[k];
                            out->end[k] = done_at[k] = t;
                            done++;
                        }
                    qlast[2 * r + q] = t;
                    *h = e;
                    progressed = true;
                }
            }
            while (pc[r] < s->start[r + 1]) {
                size_t i = pc[r];
                const dt_pp_action *a = &s->actions[i];
                if (is_transfer(a->op)) {
                    while (pc[r] < s->start[r + 1] && is_transfer(s->actions[pc[r]].op))
                        posted[pc[r]++] = clock[r];
                    progressed = true;
                    break; /* complete what it can first */
                }
                /* The transfer that brings this action's input, if any. */
                size_t need = 0;
                int stg = dt_pp_stage_of(s, r, a->chunk);
                if (a->op == DT_PP_F && needs(DT_PP_RECV_ACT, stg, S))
                    need = slot[((((size_t)r * V + a->chunk) * M + a->mb) * SLOT_COUNT) + SLOT_RA];
                if (a->op == DT_PP_B && needs(DT_PP_RECV_GRAD, stg, S))
                    need = slot[((((size_t)r * V + a->chunk) * M + a->mb) * SLOT_COUNT) + SLOT_RG];
                if (need && done_at[need - 1] < 0)
                    break; /* waits for its input */
                /* An action covers one chunk: 1/V of the rank's layers. */
                double d = (a->op == DT_PP_F   ? c.f
                            : a->op == DT_PP_W ? c.w
                                               : c.b + (s->split_w ? 0 : c.w)) /
                           V;
                double t0 = need ? fmax(clock[r], done_at[need - 1]) : clock[r];
                out->start[i] = t0;
                out->end[i] = clock[r] = t0 + d;
                out->busy[r] += d;
                pc[r]++, done++;
                progressed = true;
            }
        }
        if (done == n)
            break;
        if (!progressed) {
            /* A batch cannot complete: name its first transfer that meets
             * nothing. */
            for (int r = 0; r < P; r++)
                for (size_t k = s->start[r]; k < pc[r]; k++)
                    if (is_transfer(s->actions[k].op) && done_at[k] < 0 && posted[match[k]] < 0) {
                        char other[160];
                        refuse(k, "deadlock: it waits for %s, which that rank never reaches",
                               describe(s, match[k], other, sizeof other));
                    }
            st = dt_error_set(DT_ERR_INTERNAL, "pipeline schedule: the simulation stalled");
            goto out;
        }
    }
    /* A rank's step ends when its computation and its transfers are done. */
    for (int r = 0; r < P; r++)
        clock[r] = fmax(clock[r], fmax(qlast[2 * r], qlast[2 * r + 1]));
    for (int r = 0; r < P; r++)
        out->makespan = fmax(out->makespan, clock[r]);
    double busy = 0;
    for (int r = 0; r < P; r++)
        busy += out->busy[r];
    out->bubble = out->makespan > 0 ? 1.0 - busy / (P * out->makespan) : 0;
#undef SLOT
#undef flow
out:
    free(slot);
    free(live_c);
    free(match);
    free(posted);
    free(done_at);
    free(pc);
    free(qhead);
    free(qlast);
    free(clock);
    if (st != DT_OK)
        dt_pp_report_free(out);
    return st;
}

void dt_pp_report_free(dt_pp_report *r) {
    dt_free(r->peak_live);
    dt_free(r->chunk_live);
    dt_free(r->busy);
    dt_free(r->start);
    dt_free(r->end);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------------------ */
/* Timelines                                                                */
/* ------------------------------------------------------------------------ */

void dt_pp_timeline_text(const dt_pp_schedule *s, const dt_pp_report *r, double unit, FILE *f) {
    int cols = (int)ceil(r->makespan / unit);
    char *row = malloc((size_t)cols * 4 + 1);
    if (!row)
        return;
    for (int p = 0; p < s->stages; p++) {
        memset(row, ' ', (size_t)cols * 4);
        for (int k = 0; k < cols; k++)
            memcpy(row + 4 * k, ".   ", 4);
        for (size_t i = s->start[p]; i < s->start[p + 1]; i++) {
            const dt_pp_action *a = &s->actions[i];
            if (is_transfer(a->op))
                continue;
            int k0 = (int)floor(r->start[i] / unit + 1e-9), k1 = (int)ceil(r->end[i] / unit - 1e-9);
            for (int k = k0; k < k1 && k < cols; k++) {
                char cell[8];
                snprintf(cell, sizeof cell, "%s%u%s", dt_pp_op_names[a->op], a->mb % 100,
                         s->chunks > 1 ? (char[]){(char)('a' + a->chunk % 26), 0} : "");
                memset(row + 4 * k, ' ', 4);
                memcpy(row + 4 * k, cell, strlen(cell) < 4 ? strlen(cell) : 4);
            }
        }
        row[(size_t)cols * 4] = '\0';
        fprintf(f, "rank %-3d |%s|\n", p, row);
    }
    free(row);
}

dt_status dt_pp_timeline_svg(const dt_pp_schedule *s, const dt_pp_report *r, const char *path) {
    DT_CHECK(dt_file_check_replaceable(path));
    FILE *f = fopen(path, "w");
    if (!f)
        return dt_error_set(DT_ERR_IO, "cannot write %s", path);
    const double px = 36, row = 30, left = 70, top = 30;
    double width = left + r->makespan * px + 20, height = top + s->stages * row + 40;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"monospace\" font-size=\"11\">\n"
            "<text x=\"%.0f\" y=\"18\">%s, %d stages x %d chunk(s), %d micro-batches: bubble "
            "%.1f%%</text>\n",
            width, height, left, dt_pp_kind_names[s->kind], s->stages, s->chunks, s->micro,
            100 * r->bubble);
    static const char *const fill[] = {"#4e79a7", "#59a14f", "#f28e2b"};
    for (int p = 0; p < s->stages; p++) {
        double y = top + p * row;
        fprintf(f, "<text x=\"4\" y=\"%.0f\">rank %d</text>\n", y + row * 0.6, p);
        for (size_t i = s->start[p]; i < s->start[p + 1]; i++) {
            const dt_pp_action *a = &s->actions[i];
            if (is_transfer(a->op))
                continue;
            double x = left + r->start[i] * px, w = (r->end[i] - r->start[i]) * px;
            fprintf(f,
                    "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" "
                    "stroke=\"white\"/><text x=\"%.1f\" y=\"%.1f\" fill=\"white\">%s%u</text>\n",
                    x, y + 2, w, row - 4, fill[a->op], x + 3, y + row * 0.65, dt_pp_op_names[a->op],
                    a->mb);
        }
    }
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0)
        return dt_error_set(DT_ERR_IO, "cannot write %s", path);
    return DT_OK;
}

/* The planner's view (parallel.h, "Planning costs"): per micro-batch and
 * chunk, a stage sends its (B,T,C) fp32 output forward and receives the
 * gradient of it backward: one message each way per stage boundary it
 * owns. The executor posts them non-blocking and a compute action waits
 * only for its input, so they count on the schedule's critical path (the
 * simulator's transfer cost, dt_pp_costs.comm), not here as overlap. The
 * tied embedding's gradient is summed over the first and last stages once
 * per step (blocking). */
void dt_pp_plan_cost(const dt_cost_query *q, dt_strategy_cost *out) {
    const int pp = q->degree[DT_AXIS_PP];
    if (pp <= 1)
        return;
    double stream = (double)q->B * q->T / q->degree[DT_AXIS_CP] * q->model->dim * sizeof(float);
    dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_SEND,
                                             .axis = DT_AXIS_PP,
                                             .bytes = stream,
                                             .calls = q->chunks,
                                             .per_micro = true,
                                             .what = "pp activation send"});
    dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_SEND,
                                             .axis = DT_AXIS_PP,
                                             .bytes = stream,
                                             .calls = q->chunks,
                                             .per_micro = true,
                                             .backward = true,
                                             .what = "pp gradient send"});
    double wte = (double)q->model->vocab / q->degree[DT_AXIS_TP] * q->model->dim * sizeof(float);
    dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_ALLREDUCE,
                                             .axis = DT_AXIS_PP,
                                             .bytes = wte,
                                             .calls = 1,
                                             .what = "pp tied-embedding gradient sum"});
}
