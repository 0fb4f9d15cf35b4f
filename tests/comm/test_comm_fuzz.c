/*
 * test_comm_fuzz.c — two randomized tests on real processes (1-5 ranks,
 * shared memory, TCP, two simulated hosts):
 *
 *   fuzz_*      random sequences of every collective, send/recv and
 *               batched send/recv (a ring exchange both ways), every
 *               dtype and reduction, odd and zero counts, in and out of
 *               place, blocking or not (non-blocking ones waited for in a
 *               random order that differs per rank), on sub-groups with
 *               every algorithm forced and on two halves of the world at
 *               once; every output checked against the serial reference
 *               (reference.h), every input left untouched, nothing written
 *               past a buffer's end;
 *   mismatch_*  one rank's call differs from the others' in one field of
 *               its descriptor (op, count, dtype, reduction, root; a count
 *               of 0 on either side included), after a few good calls on a
 *               fresh sub-group: every rank must get DT_ERR_MISMATCH from
 *               that very call, within 10 s (DT_TIMEOUT is 60 s, so a
 *               mismatch noticed only by a timeout fails), and the group
 *               stays failed.
 *
 * Each case runs for DT_TEST_FUZZ_SECONDS (default 1.5 s; the ranks agree
 * on when to stop). The seed is printed; DT_TEST_SEED replays a run.
 */
#include "harness.h"
#include "reference.h"

static double fuzz_seconds(void) {
    const char *s = getenv("DT_TEST_FUZZ_SECONDS");
    return s && atof(s) > 0 ? atof(s) : 1.5;
}

/* The same stream on every rank: the run's seed and the case's name. */
static uint64_t case_seed(void) {
    const char *s = getenv("DT_TEST_SEED");
    uint64_t x = s ? strtoull(s, NULL, 0) : 1;
    for (const char *c = test__current; *c; c++)
        x = mix(x ^ (uint64_t)(unsigned char)*c);
    return x;
}

typedef struct rng {
    uint64_t s;
} rng;
static uint64_t next(rng *r) { return mix(r->s += 0x632be59bd9b4e019ull); }
static size_t below(rng *r, size_t n) { return (size_t)(next(r) % n); }

static size_t pick_count(rng *r) {
    static const size_t small[] = {0, 1, 2, 3, 5, 7, 13, 64, 1000};
    size_t k = below(r, 100);
    if (k < 40)
        return small[below(r, sizeof small / sizeof small[0])];
    if (k < 85)
        return 1 + below(r, 5000);
    if (k < 99)
        return 1 + below(r, 300000);
    return 1000003;
}

static bool reducing(dt_coll c) {
    return c == DT_COLL_ALLREDUCE || c == DT_COLL_REDUCE_SCATTER || c == DT_COLL_REDUCE;
}
static bool rooted(dt_coll c) {
    return c == DT_COLL_BROADCAST || c == DT_COLL_REDUCE || c == DT_COLL_GATHER ||
           c == DT_COLL_SCATTER;
}

/* ------------------------------------------------------------------------ */
/* One operation: its descriptor (equal on every rank) and this rank's part  */
/* ------------------------------------------------------------------------ */

#define CANARY 64

typedef struct fop {
    dt_coll coll;
    dt_dtype dt;
    dt_redop op;
    size_t count;
    int root; /* root, or for send/recv the sender (the receiver is `peer`) */
    int peer;
    int tag;
    bool inplace, blocking;
    uint64_t salt;
    dt_group *g;
    /* this rank's part */
    int n, me;
    bool active; /* this rank takes part (send/recv: sender or receiver) */
    char *in, *out;
    size_t in_elems, out_elems;
    dt_work *w;
    dt_status st;
} fop;

static char *alloc_buf(size_t bytes, int fill) {
    char *p = malloc(bytes + CANARY);
    ASSERT_TRUE(p != NULL);
    memset(p, fill, bytes);
    memset(p + bytes, 0xa5, CANARY);
    return p;
}

static void check_canary(const fop *f, const char *p, size_t bytes, const char *which) {
    for (size_t i = 0; i < CANARY; i++)
        if ((unsigned char)p[bytes + i] != 0xa5)
            TEST_FAILF("%s %s count %zu: byte %zu past the end of %s was written",
                       dt_coll_name(f->coll), dt_dtype_name(f->dt), f->count, i, which);
}

/* A batch is a ring exchange both ways: count elements to the right
 * neighbour (and from the left), batch_back(f) to the left (and from the
 * right), the second pair under another tag and salt. Element i of the
 * two-part buffers is element part_index(f, i) of its part. */
static size_t batch_back(const fop *f) { return (size_t)(f->salt % 3) * f->count / 2 + 1; }
static int right_of(const fop *f) { return (f->me + 1) % f->n; }
static int left_of(const fop *f) { return (f->me + f->n - 1) % f->n; }
static size_t part_index(const fop *f, size_t i) { return i < f->count ? i : i - f->count; }
static uint64_t part_salt(const fop *f, size_t i) { return f->salt ^ (i >= f->count); }

/* Buffers and inputs of this rank for f (in-place layouts as in comm.h). */
static void prepare(fop *f) {
    size_t c = f->count, N = (size_t)f->n, es = dt_dtype_size(f->dt);
    int me = f->me;
    bool root = me == f->root;
    size_t in = 0, out = 0;
    switch (f->coll) {
    case DT_COLL_ALLREDUCE: in = out = c; break;
    case DT_COLL_REDUCE_SCATTER: in = N * c, out = c; break;
    case DT_COLL_ALLGATHER: in = c, out = N * c; break;
    case DT_COLL_BROADCAST: out = c; break;
    case DT_COLL_REDUCE: in = c, out = root ? c : 0; break;
    case DT_COLL_GATHER: in = c, out = root ? N * c : 0; break;
    case DT_COLL_SCATTER: in = root ? N * c : 0, out = c; break;
    case DT_COLL_ALLTOALL: in = out = N * c; break;
    case DT_COLL_SEND: in = c; break;
    case DT_COLL_RECV: out = c; break;
    case DT_COLL_BATCH: in = out = c + batch_back(f); break; /* to the right, to the left */
    default: break;
    }
    /* In place: one buffer, the larger layout (the output's, or the
     * input's for reduce-scatter and scatter). */
    bool ip = f->inplace && (f->coll == DT_COLL_ALLREDUCE || f->coll == DT_COLL_REDUCE_SCATTER ||
                             f->coll == DT_COLL_ALLGATHER || f->coll == DT_COLL_ALLTOALL ||
                             (root && (f->coll == DT_COLL_REDUCE || f->coll == DT_COLL_GATHER ||
                                       f->coll == DT_COLL_SCATTER)));
    f->inplace = ip;
    if (ip) {
        in = out = in > out ? in : out;
        f->in = f->out = alloc_buf(in * es, 0x5a);
    } else {
        f->in = in ? alloc_buf(in * es, 0x5a) : NULL;
        f->out = out ? alloc_buf(out * es, 0x5a) : NULL;
    }
    f->in_elems = in;
    f->out_elems = out;
    /* inputs */
    dt_redop gop = reducing(f->coll) ? f->op : DT_SUM;
    int src = f->coll == DT_COLL_SEND ? f->root : me;
    if (f->coll == DT_COLL_ALLGATHER || (f->coll == DT_COLL_GATHER && ip)) {
        char *mine = ip ? f->out + (size_t)me * c * es : f->in;
        for (size_t i = 0; i < c; i++)
            put(mine, f->dt, i, (double)gen(me, i, f->salt, f->dt, gop));
    } else if (f->coll == DT_COLL_BROADCAST) {
        if (root)
            for (size_t i = 0; i < c; i++)
                put(f->out, f->dt, i, (double)gen(me, i, f->salt, f->dt, gop));
    } else if (f->coll == DT_COLL_BATCH) {
        for (size_t i = 0; i < f->in_elems; i++)
            put(f->in, f->dt, i, (double)gen(me, part_index(f, i), part_salt(f, i), f->dt, gop));
    } else if (f->in) {
        for (size_t i = 0; i < f->in_elems; i++)
            put(f->in, f->dt, i, (double)gen(src, i, f->salt, f->dt, gop));
    }
}

static dt_status issue(fop *f) {
    dt_work **w = f->blocking ? NULL : &f->w;
    dt_group *g = f->g;
    size_t c = f->count;
#define CALL(blocking, nonblocking) (w ? (nonblocking) : (blocking))
    switch (f->coll) {
    case DT_COLL_ALLREDUCE:
        return CALL(dt_group_allreduce(g, f->in, f->out, c, f->dt, f->op),
                    dt_group_iallreduce(g, f->in, f->out, c, f->dt, f->op, w));
    case DT_COLL_REDUCE_SCATTER:
        return CALL(dt_group_reduce_scatter(g, f->in, f->out, c, f->dt, f->op),
                    dt_group_ireduce_scatter(g, f->in, f->out, c, f->dt, f->op, w));
    case DT_COLL_ALLGATHER:
        return CALL(dt_group_allgather(g, f->in, f->out, c, f->dt),
                    dt_group_iallgather(g, f->in, f->out, c, f->dt, w));
    case DT_COLL_BROADCAST:
        return CALL(dt_group_broadcast(g, f->out, c, f->dt, f->root),
                    dt_group_ibroadcast(g, f->out, c, f->dt, f->root, w));
    case DT_COLL_REDUCE:
        return CALL(dt_group_reduce(g, f->in, f->out, c, f->dt, f->op, f->root),
                    dt_group_ireduce(g, f->in, f->out, c, f->dt, f->op, f->root, w));
    case DT_COLL_GATHER:
        return CALL(dt_group_gather(g, f->in, f->out, c, f->dt, f->root),
                    dt_group_igather(g, f->in, f->out, c, f->dt, f->root, w));
    case DT_COLL_SCATTER:
        return CALL(dt_group_scatter(g, f->in, f->out, c, f->dt, f->root),
                    dt_group_iscatter(g, f->in, f->out, c, f->dt, f->root, w));
    case DT_COLL_ALLTOALL:
        return CALL(dt_group_alltoall(g, f->in, f->out, c, f->dt),
                    dt_group_ialltoall(g, f->in, f->out, c, f->dt, w));
    case DT_COLL_BARRIER: return CALL(dt_group_barrier(g), dt_group_ibarrier(g, w));
    case DT_COLL_SEND:
        return CALL(dt_group_send(g, f->in, c, f->dt, f->peer, f->tag),
                    dt_group_isend(g, f->in, c, f->dt, f->peer, f->tag, w));
    case DT_COLL_RECV:
        return CALL(dt_group_recv(g, f->out, c, f->dt, f->root, f->tag),
                    dt_group_irecv(g, f->out, c, f->dt, f->root, f->tag, w));
    case DT_COLL_BATCH: {
        size_t es = dt_dtype_size(f->dt), b = batch_back(f);
        dt_p2p ops[4] = {
            {true, f->in, c, f->dt, right_of(f), f->tag},
            {false, f->out, c, f->dt, left_of(f), f->tag},
            {true, f->in + c * es, b, f->dt, left_of(f), f->tag + 1},
            {false, f->out + c * es, b, f->dt, right_of(f), f->tag + 1},
        };
        if (f->salt & 8) { /* the order inside a batch is free */
            dt_p2p t = ops[0];
            ops[0] = ops[3];
            ops[3] = t;
        }
        return CALL(dt_group_sendrecv_batch(g, ops, 4), dt_group_isendrecv_batch(g, ops, 4, w));
    }
    default: return DT_ERR_INVALID;
    }
#undef CALL
}

static void describe(const fop *f, char *buf, size_t len) {
    snprintf(buf, len, "%s %s %s count %zu root %d %s %s, group of %d, rank %d (salt %llx)",
             dt_coll_name(f->coll), dt_dtype_name(f->dt), dt_redop_name(f->op), f->count, f->root,
             f->inplace ? "in place" : "out of place", f->blocking ? "blocking" : "non-blocking",
             f->n, f->me, (unsigned long long)f->salt);
}

/* Compare every output element with the reference, the inputs with what
 * was put there, and the canaries. */
static void verify(const fop *f) {
    char what[256];
    describe(f, what, sizeof what);
    if (f->st != DT_OK)
        TEST_FAILF("%s: %s: %s", what, dt_status_name(f->st), dt_last_error());
    size_t c = f->count, N = (size_t)f->n, es = dt_dtype_size(f->dt);
    int me = f->me, n = f->n;
    bool root = me == f->root;
    dt_redop op = f->op;
    switch (f->coll) {
    case DT_COLL_ALLREDUCE:
        for (size_t i = 0; i < c; i++)
            check_elem(what, f->out, f->dt, i, ref_reduce(n, i, f->salt, f->dt, op), op);
        break;
    case DT_COLL_REDUCE_SCATTER: {
        const char *res = f->inplace ? f->out + (size_t)me * c * es : f->out;
        for (size_t i = 0; i < c; i++)
            check_elem(what, res, f->dt, i, ref_reduce(n, (size_t)me * c + i, f->salt, f->dt, op),
                       op);
        break;
    }
    case DT_COLL_ALLGATHER:
    case DT_COLL_GATHER:
        if (f->coll == DT_COLL_GATHER && !root)
            break;
        for (size_t j = 0; j < N * c; j++)
            check_elem(what, f->out, f->dt, j,
                       (double)gen((int)(j / c), j % c, f->salt, f->dt, DT_SUM), DT_SUM);
        break;
    case DT_COLL_BROADCAST:
        for (size_t i = 0; i < c; i++)
            check_elem(what, f->out, f->dt, i, (double)gen(f->root, i, f->salt, f->dt, DT_SUM),
                       DT_SUM);
        break;
    case DT_COLL_REDUCE:
        if (root)
            for (size_t i = 0; i < c; i++)
                check_elem(what, f->out, f->dt, i, ref_reduce(n, i, f->salt, f->dt, op), op);
        break;
    case DT_COLL_SCATTER: {
        const char *res = f->inplace ? f->out + (size_t)me * c * es : f->out;
        for (size_t i = 0; i < c; i++)
            check_elem(what, res, f->dt, i,
                       (double)gen(f->root, (size_t)me * c + i, f->salt, f->dt, DT_SUM), DT_SUM);
        break;
    }
    case DT_COLL_ALLTOALL:
        for (size_t j = 0; j < N * c; j++)
            check_elem(what, f->out, f->dt, j,
                       (double)gen((int)(j / c), (size_t)me * c + j % c, f->salt, f->dt, DT_SUM),
                       DT_SUM);
        break;
    case DT_COLL_RECV:
        for (size_t i = 0; i < c; i++)
            check_elem(what, f->out, f->dt, i, (double)gen(f->root, i, f->salt, f->dt, DT_SUM),
                       DT_SUM);
        break;
    case DT_COLL_BATCH:
        for (size_t i = 0; i < f->out_elems; i++)
            check_elem(what, f->out, f->dt, i,
                       (double)gen(i < c ? left_of(f) : right_of(f), part_index(f, i),
                                   part_salt(f, i), f->dt, DT_SUM),
                       DT_SUM);
        break;
    default: break;
    }
    /* out of place: the input is read, never written */
    if (f->in && !f->inplace) {
        dt_redop gop = reducing(f->coll) ? op : DT_SUM;
        int src = f->coll == DT_COLL_SEND ? f->root : me;
        bool two = f->coll == DT_COLL_BATCH;
        for (size_t i = 0; i < f->in_elems; i++)
            if (get(f->in, f->dt, i) != (double)gen(src, two ? part_index(f, i) : i,
                                                    two ? part_salt(f, i) : f->salt, f->dt, gop))
                TEST_FAILF("%s: input element %zu was changed", what, i);
    }
    if (f->in)
        check_canary(f, f->in, f->in_elems * es, "the input");
    if (f->out && f->out != f->in)
        check_canary(f, f->out, f->out_elems * es, "the output");
}

static void release(fop *f) {
    if (f->out != f->in)
        free(f->out);
    free(f->in);
    f->in = f->out = NULL;
}

/* ------------------------------------------------------------------------ */
/* fuzz_*: random operations against the reference                          */
/* ------------------------------------------------------------------------ */

static const dt_coll all_colls[] = {DT_COLL_ALLREDUCE, DT_COLL_REDUCE_SCATTER,
                                    DT_COLL_ALLGATHER, DT_COLL_BROADCAST,
                                    DT_COLL_REDUCE,    DT_COLL_GATHER,
                                    DT_COLL_SCATTER,   DT_COLL_ALLTOALL,
                                    DT_COLL_BARRIER,   DT_COLL_SEND /* a send and its recv */,
                                    DT_COLL_BATCH};
#define NCOLLS (sizeof all_colls / sizeof all_colls[0])

static void random_desc(rng *r, fop *f, int n) {
    f->coll = all_colls[below(r, NCOLLS)];
    f->dt = (dt_dtype)below(r, DT_DTYPE_COUNT);
    f->op = reducing(f->coll) ? (dt_redop)below(r, DT_REDOP_COUNT) : DT_SUM;
    f->count = f->coll == DT_COLL_BARRIER ? 0 : pick_count(r);
    f->root = (int)below(r, (size_t)n);
    f->peer = (int)below(r, (size_t)n);
    f->tag = (int)below(r, 1000);
    f->inplace = below(r, 2);
    f->blocking = below(r, 3) == 0;
    f->salt = next(r);
    if (f->coll == DT_COLL_BARRIER)
        f->dt = DT_U8;
}

/* This rank's part of f on group g (n ranks, me): send/recv become a send
 * on the sender and a recv on the receiver, nothing elsewhere. */
static void bind_op(fop *f, dt_group *g) {
    f->g = g;
    f->n = dt_group_size(g);
    f->me = dt_group_rank(g);
    f->active = true;
    f->w = NULL;
    f->st = DT_OK;
    if (f->coll == DT_COLL_SEND || f->coll == DT_COLL_RECV) {
        f->root %= f->n;
        f->peer %= f->n;
        if (f->n < 2 || f->root == f->peer)
            f->active = false;
        else if (f->me == f->root)
            f->coll = DT_COLL_SEND;
        else if (f->me == f->peer)
            f->coll = DT_COLL_RECV;
        else
            f->active = false;
    } else {
        f->root %= f->n;
        if (f->coll == DT_COLL_BATCH && f->n < 2)
            f->active = false;
    }
}

static void fuzz_case(int rank, int size) {
    const char *nodes = getenv("DT_TEST_NODES");
    if (nodes) { /* several simulated hosts: shm inside each, tcp between */
        char node[16];
        snprintf(node, sizeof node, "%d", rank * atoi(nodes) / size);
        setenv("DT_NODE_RANK", node, 1);
    }
    dt_group *world = NULL;
    ASSERT_OK(dt_group_init_from_env(&world));
    /* one sub-group per forced algorithm, and the two halves of the world */
    enum { NG = DT_ALGO_COUNT + 1 };
    dt_group *groups[NG];
    for (int a = 0; a < DT_ALGO_COUNT; a++) {
        setenv("DT_ALGO", dt_algo_name((dt_algo)a), 1);
        ASSERT_OK(dt_group_split(world, 0, rank, &groups[a]));
    }
    setenv("DT_ALGO", "auto", 1);
    ASSERT_OK(dt_group_split(world, rank % 2, size - rank, &groups[DT_ALGO_COUNT]));
    rng shared = {case_seed()}, mine = {case_seed() ^ mix((uint64_t)rank + 77)};
    double budget = fuzz_seconds(), t0 = dt_now();
    int ops = 0, batches = 0;
    for (int go = 1; go;) {
        fop batch[4];
        int k = 1 + (int)below(&shared, 4);
        for (int j = 0; j < k; j++) {
            fop *f = &batch[j];
            memset(f, 0, sizeof *f);
            int gi = (int)below(&shared, NG);
            random_desc(&shared, f, size);
            bind_op(f, groups[gi]);
            if (!f->active)
                continue;
            prepare(f);
            f->st = issue(f);
            if (f->blocking || f->st != DT_OK) {
                verify(f);
                release(f);
                f->active = false;
            }
        }
        /* wait in an order of this rank's own choosing */
        int order[4] = {0, 1, 2, 3};
        for (int j = k - 1; j > 0; j--) {
            int x = (int)below(&mine, (size_t)j + 1), t = order[j];
            order[j] = order[x];
            order[x] = t;
        }
        for (int j = 0; j < k; j++) {
            fop *f = &batch[order[j]];
            if (!f->active)
                continue;
            if (below(&mine, 2)) { /* sometimes poll first */
                bool done = false;
                ASSERT_OK(dt_work_test(f->w, &done));
            }
            f->st = dt_work_wait(f->w);
            verify(f);
            release(f);
        }
        ops += k;
        batches++;
        int32_t more = dt_now() - t0 < budget;
        ASSERT_OK(dt_group_allreduce(world, &more, &more, 1, DT_I32, DT_MIN));
        go = more;
    }
    for (int a = 0; a < NG; a++) {
        ASSERT_OK(dt_group_barrier(groups[a]));
        dt_group_destroy(groups[a]);
    }
    if (rank == 0)
        printf("rank 0: %d operations in %d batches, %.1f s, transport %s\n", ops, batches,
               dt_now() - t0, dt_group_transport(world));
    dt_group_destroy(world);
}

/* ------------------------------------------------------------------------ */
/* mismatch_*: one rank's call differs in one field                         */
/* ------------------------------------------------------------------------ */

static const dt_coll coll_only[] = {DT_COLL_ALLREDUCE, DT_COLL_REDUCE_SCATTER, DT_COLL_ALLGATHER,
                                    DT_COLL_BROADCAST, DT_COLL_REDUCE,         DT_COLL_GATHER,
                                    DT_COLL_SCATTER,   DT_COLL_ALLTOALL,       DT_COLL_BARRIER};
#define NCOLL_ONLY (sizeof coll_only / sizeof coll_only[0])

static size_t mismatch_count(rng *r) {
    static const size_t counts[] = {0, 1, 2, 7, 100, 1000, 5000, 70000};
    return below(r, 50) ? counts[below(r, 8)] : 300000;
}

/* Change one field of f that takes part in matching (op, count, dtype, the
 * reduction of a reducing op, the root of a rooted one); returns its name. */
static const char *perturb(rng *r, fop *f, int n) {
    for (;;) {
        switch (below(r, 5)) {
        case 0: {
            dt_coll c = coll_only[below(r, NCOLL_ONLY)];
            if (c == f->coll)
                continue;
            if (c == DT_COLL_BARRIER || f->coll == DT_COLL_BARRIER) {
                f->dt = c == DT_COLL_BARRIER ? DT_U8 : DT_F32;
                f->count = c == DT_COLL_BARRIER ? 0 : 1 + f->count;
            }
            f->coll = c;
            f->op = reducing(c) ? f->op : DT_SUM;
            return "op";
        }
        case 1: {
            if (f->coll == DT_COLL_BARRIER)
                continue;
            size_t was = f->count;
            static const size_t alt[] = {0, 1};
            do
                f->count = below(r, 3) ? alt[below(r, 2)] : below(r, 2) ? was + 1 : 2 * was + 3;
            while (f->count == was);
            return "count";
        }
        case 2:
            if (f->coll == DT_COLL_BARRIER)
                continue;
            f->dt = (dt_dtype)((f->dt + 1 + below(r, DT_DTYPE_COUNT - 1)) % DT_DTYPE_COUNT);
            return "dtype";
        case 3:
            if (!reducing(f->coll))
                continue;
            f->op = (dt_redop)((f->op + 1 + below(r, DT_REDOP_COUNT - 1)) % DT_REDOP_COUNT);
            return "reduction";
        default:
            if (!rooted(f->coll))
                continue;
            f->root = (f->root + 1 + (int)below(r, (size_t)n - 1)) % n;
            return "root";
        }
    }
}

static void mismatch_case(int rank, int size) {
    const char *nodes = getenv("DT_TEST_NODES");
    if (nodes) {
        char node[16];
        snprintf(node, sizeof node, "%d", rank * atoi(nodes) / size);
        setenv("DT_NODE_RANK", node, 1);
    }
    dt_group *world = NULL;
    ASSERT_OK(dt_group_init_from_env(&world));
    rng shared = {case_seed()};
    double budget = fuzz_seconds(), t0 = dt_now(), worst = 0;
    int trials = 0;
    for (;;) {
        int32_t more = dt_now() - t0 < budget;
        ASSERT_OK(dt_group_allreduce(world, &more, &more, 1, DT_I32, DT_MIN));
        if (!more)
            break;
        setenv("DT_ALGO", dt_algo_name((dt_algo)below(&shared, DT_ALGO_COUNT)), 1);
        dt_group *g = NULL;
        ASSERT_OK(dt_group_split(world, 0, rank, &g));
        /* a few good calls first, so sequence numbers and algorithms vary */
        for (int j = (int)below(&shared, 3); j > 0; j--) {
            fop f = {0};
            random_desc(&shared, &f, size);
            if (f.coll == DT_COLL_SEND)
                f.coll = DT_COLL_ALLREDUCE;
            f.count = mismatch_count(&shared);
            f.blocking = true;
            bind_op(&f, g);
            prepare(&f);
            f.st = issue(&f);
            verify(&f);
            release(&f);
        }
        fop want = {0};
        random_desc(&shared, &want, size);
        want.coll = coll_only[below(&shared, NCOLL_ONLY)];
        want.op = reducing(want.coll) ? want.op : DT_SUM;
        want.count = want.coll == DT_COLL_BARRIER ? 0 : mismatch_count(&shared);
        if (want.coll == DT_COLL_BARRIER)
            want.dt = DT_U8;
        int victim = (int)below(&shared, (size_t)size);
        fop odd = want;
        const char *field = perturb(&shared, &odd, size);
        fop f = rank == victim ? odd : want;
        bind_op(&f, g);
        prepare(&f);
        char what[600], a[256], b[256];
        describe(&want, a, sizeof a);
        describe(&odd, b, sizeof b);
        snprintf(what, sizeof what, "trial %d (DT_ALGO=%s): rank %d changed the %s: %s -> %s",
                 trials, getenv("DT_ALGO"), victim, field, a, b);
        double t = dt_now();
        f.st = issue(&f);
        if (f.st == DT_OK && !f.blocking)
            f.st = dt_work_wait(f.w);
        t = dt_now() - t;
        if (f.st != DT_ERR_MISMATCH)
            TEST_FAILF("%s: rank %d got %s (expected DT_ERR_MISMATCH): %s", what, rank,
                       dt_status_name(f.st), f.st ? dt_last_error() : "");
        if (t > 10)
            TEST_FAILF("%s: rank %d took %.1f s to report the mismatch", what, rank, t);
        worst = t > worst ? t : worst;
        /* sticky: the group stays failed */
        ASSERT_STATUS(dt_group_barrier(g), DT_ERR_MISMATCH);
        release(&f);
        dt_group_destroy(g);
        trials++;
    }
    if (rank == 0)
        printf("rank 0: %d mismatched calls, all reported on every rank (slowest %.3f s), "
               "transport %s\n",
               trials, worst, dt_group_transport(world));
    dt_group_destroy(world);
}

/* Odd world sizes with tiny chunks, slots and windows (multi-chunk paths
 * at small counts); the single-copy paths forced on in the cma case. */
#define F(name, n, fn, ...)                                                                        \
    { name, n, fn, {__VA_ARGS__}, -1, 120 }
#define TINY "DT_CHUNK_SIZE=4096", "DT_SHM_SLOT=4096", "DT_SHM_WINDOW=64K", "DT_TCP_STRIPE_MIN=8K"
static hcase cases[] = {
    F("fuzz_shm_1", 1, fuzz_case, NULL),
    F("fuzz_shm_2", 2, fuzz_case, NULL),
    F("fuzz_shm_3", 3, fuzz_case, TINY, NULL),
    F("fuzz_shm_4", 4, fuzz_case, NULL),
    F("fuzz_shm_5", 5, fuzz_case, TINY, NULL),
    F("fuzz_cma_3", 3, fuzz_case, "DT_SHM_CMA=on", "DT_SHM_CMA_MIN=1", "DT_SHM_PUSH_MIN=1", NULL),
    F("fuzz_tcp_2", 2, fuzz_case, "DT_TRANSPORT=tcp", NULL),
    F("fuzz_tcp_3", 3, fuzz_case, "DT_TRANSPORT=tcp", TINY, NULL),
    F("fuzz_tcp_4", 4, fuzz_case, "DT_TRANSPORT=tcp", NULL),
    F("fuzz_tcp_5", 5, fuzz_case, "DT_TRANSPORT=tcp", TINY, NULL),
    F("fuzz_hier_4", 4, fuzz_case, "DT_TEST_NODES=2", NULL),
    F("fuzz_hier_5", 5, fuzz_case, "DT_TEST_NODES=2", TINY, NULL),
    F("mismatch_shm_2", 2, mismatch_case, NULL),
    F("mismatch_shm_3", 3, mismatch_case, TINY, NULL),
    F("mismatch_shm_5", 5, mismatch_case, NULL),
    F("mismatch_tcp_2", 2, mismatch_case, "DT_TRANSPORT=tcp", NULL),
    F("mismatch_tcp_3", 3, mismatch_case, "DT_TRANSPORT=tcp", TINY, NULL),
    F("mismatch_tcp_4", 4, mismatch_case, "DT_TRANSPORT=tcp", NULL),
    F("mismatch_tcp_5", 5, mismatch_case, "DT_TRANSPORT=tcp", TINY, NULL),
    F("mismatch_hier_4", 4, mismatch_case, "DT_TEST_NODES=2", NULL),
};

int main(int argc, char **argv) {
    /* one seed for every rank of every case (children inherit it) */
    if (!(argc >= 2 && strcmp(argv[1], "--child") == 0) && !getenv("DT_TEST_SEED")) {
        char s[32];
        snprintf(s, sizeof s, "%llu", (unsigned long long)dt_now_ns());
        setenv("DT_TEST_SEED", s, 1);
    }
    if (!(argc >= 2 && strcmp(argv[1], "--child") == 0))
        printf("DT_TEST_SEED=%s (replays this run), DT_TEST_FUZZ_SECONDS=%.1f per case\n",
               getenv("DT_TEST_SEED"), fuzz_seconds());
    /* a longer run gets a longer deadline */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cases[i].timeout += 2 * fuzz_seconds();
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
