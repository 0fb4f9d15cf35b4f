/*
 * mpi_backend.c — DT_BACKEND=mpi: every dtrain collective and point-to-point
 * operation mapped onto MPI, through comm's backend seam (backend.h), so a
 * cluster's MPI brings its own networks (InfiniBand, ...) to dtrain. Also
 * the MPI bootstrap used by DT_BACKEND=native under mpirun: rank 0's store
 * address, port and a fresh job token are broadcast with MPI, so nothing
 * has to be exported by hand.
 *
 * Compiled only when CMake found MPI (DT_HAVE_MPI, src/comm/deps.cmake).
 *
 * Invariants:
 *   - Each group owns one communicator, created from MPI_COMM_WORLD over
 *     g->world[] (the group's ranks in order), so group rank r is
 *     communicator rank r. This needs dtrain's world rank to equal the MPI
 *     world rank, which holds under mpirun (both come from the same
 *     OMPI_COMM_WORLD_RANK / PMI_RANK); init checks it.
 *   - MPI is initialised once per process with MPI_THREAD_MULTIPLE (groups
 *     run their operations on their own progress threads). If dtrain
 *     initialised it, dtrain finalises it: right after the bootstrap when
 *     no group uses the mpi backend, else when the last such group is
 *     destroyed. Never at exit: a rank that fails exits without
 *     MPI_Finalize, so mpirun sees the failure and ends the job at once,
 *     instead of the rank blocking in MPI_Finalize while its peers wait for
 *     it in a collective.
 *   - Every operation is the non-blocking MPI form completed by an
 *     MPI_Test loop bounded by DT_TIMEOUT, so a dead peer ends in
 *     DT_ERR_TIMEOUT instead of a hang (mpirun usually kills the job first).
 *   - 16-bit floats travel as 2-byte elements and are reduced by user
 *     operations calling dt_reduce (f32 accumulate, round once per step),
 *     so they give the same results as the native backend. AVG is reduced
 *     as SUM and divided by group.c.
 *   - Counts above INT_MAX elements are split into pieces (element-wise
 *     operations only; the others refuse them with a clear error).
 */
#include "backend.h"
#include "jobenv.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* MPI initialisation (once per process)                                    */
/* ------------------------------------------------------------------------ */

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static bool we_initialized;
static MPI_Op half_ops[2][DT_REDOP_COUNT]; /* [f16, bf16][redop] */
static MPI_Datatype half_type;             /* 2 contiguous bytes */
static bool half_ready;                    /* half_type and half_ops exist */

static dt_status mpi_error(int rc, const char *what) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    text[len] = '\0';
    return dt_error_set(DT_ERR_PEER, "MPI: %s failed: %s", what, text);
}

static int live_groups; /* groups using the mpi backend (under init_mu) */

/* With init_mu held: finalise MPI if we started it and nothing uses it. */
static void maybe_finalize(void) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (we_initialized && live_groups == 0 && !finalized)
        MPI_Finalize();
}

#define HALF_OP(name, dtype, redop)                                                                \
    static void name(void *in, void *inout, int *len, MPI_Datatype *type) {                        \
        (void)type;                                                                                \
        dt_reduce(inout, in, inout, (size_t)*len, dtype, redop);                                   \
    }
HALF_OP(f16_sum, DT_F16, DT_SUM)
HALF_OP(f16_prod, DT_F16, DT_PROD)
HALF_OP(f16_min, DT_F16, DT_MIN)
HALF_OP(f16_max, DT_F16, DT_MAX)
HALF_OP(bf16_sum, DT_BF16, DT_SUM)
HALF_OP(bf16_prod, DT_BF16, DT_PROD)
HALF_OP(bf16_min, DT_BF16, DT_MIN)
HALF_OP(bf16_max, DT_BF16, DT_MAX)

/* Start MPI if nobody has (the program may have called MPI_Init itself). */
static dt_status ensure_mpi(void) {
    pthread_mutex_lock(&init_mu);
    dt_status st = DT_OK;
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) {
        st = dt_error_set(DT_ERR_UNSUPPORTED, "MPI was already finalized");
        goto out;
    }
    int provided = 0;
    if (!inited) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) {
            st = mpi_error(rc, "MPI_Init_thread");
            goto out;
        }
        we_initialized = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE) {
        st = dt_error_set(DT_ERR_UNSUPPORTED,
                          "DT_BACKEND=mpi needs MPI_THREAD_MULTIPLE (each group has a progress "
                          "thread); this MPI provides level %d",
                          provided);
        goto out;
    }
    if (!half_ready) {
        half_ready = true;
        MPI_Type_contiguous(2, MPI_BYTE, &half_type);
        MPI_Type_commit(&half_type);
        MPI_User_function *fns[2][DT_REDOP_COUNT] = {
            {f16_sum, f16_sum, f16_prod, f16_min, f16_max},
            {bf16_sum, bf16_sum, bf16_prod, bf16_min, bf16_max}};
        for (int t = 0; t < 2; t++)
            for (int o = 0; o < DT_REDOP_COUNT; o++)
                MPI_Op_create(fns[t][o], 1, &half_ops[t][o]);
    }
out:
    pthread_mutex_unlock(&init_mu);
    return st;
}

static MPI_Datatype mpi_type(dt_dtype t) {
    switch (t) {
    case DT_F32: return MPI_FLOAT;
    case DT_F64: return MPI_DOUBLE;
    case DT_F16:
    case DT_BF16: return half_type;
    case DT_I8: return MPI_INT8_T;
    case DT_U8: return MPI_UINT8_T;
    case DT_I32: return MPI_INT32_T;
    case DT_I64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(dt_dtype t, dt_redop op) {
    if (t == DT_F16 || t == DT_BF16)
        return half_ops[t == DT_BF16][op];
    switch (op) {
    case DT_SUM:
    case DT_AVG: return MPI_SUM; /* group.c divides AVG afterwards */
    case DT_PROD: return MPI_PROD;
    case DT_MIN: return MPI_MIN;
    case DT_MAX: return MPI_MAX;
    default: return MPI_OP_NULL;
    }
}

/* ------------------------------------------------------------------------ */
/* Groups                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct mpi_state {
    MPI_Comm comm;
} mpi_state;

static MPI_Comm comm_of(const dt__op *op) { return ((mpi_state *)op->g->backend_state)->comm; }

static dt_status mpi_init(dt_group *g) {
    DT_CHECK(ensure_mpi());
    int wr, ws;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &ws);
    int me = g->world[g->rank];
    if (wr != me || ws < g->size)
        return dt_error_set(DT_ERR_UNSUPPORTED,
                            "DT_BACKEND=mpi: dtrain world rank %d is MPI rank %d of %d; start the "
                            "job with mpirun/srun (not dtrain launch) for the mpi backend",
                            me, wr, ws);
    mpi_state *s = calloc(1, sizeof *s);
    if (!s)
        return dt_error_set(DT_ERR_NOMEM, "mpi backend state");
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    int rc = MPI_Group_incl(world_group, g->size, g->world, &group);
    MPI_Group_free(&world_group);
    if (rc != MPI_SUCCESS) {
        free(s);
        return mpi_error(rc, "MPI_Group_incl");
    }
    /* Groups created concurrently by different members must not match each
     * other's creation: the tag comes from the group's unique id. */
    int tag = (int)(dt_hash64(g->id, strlen(g->id), 0) % 32000);
    rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &s->comm);
    MPI_Group_free(&group);
    if (rc != MPI_SUCCESS) {
        free(s);
        return mpi_error(rc, "MPI_Comm_create_group");
    }
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    g->backend_state = s;
    /* dt_group_transport() says what carries the data: MPI now (the shm/tcp
     * connections only carry failure news, see peer_news). */
    snprintf(g->tpname, sizeof g->tpname, "%s", g->size > 1 ? "mpi" : "self");
    pthread_mutex_lock(&init_mu);
    live_groups++;
    pthread_mutex_unlock(&init_mu);
    return DT_OK;
}

static void mpi_fini(dt_group *g, bool clean) {
    mpi_state *s = g->backend_state;
    if (!s)
        return;
    /* MPI_Comm_free is collective in spirit but local in practice; after a
     * failure the communicator is abandoned rather than risk a hang. */
    if (clean)
        MPI_Comm_free(&s->comm);
    free(s);
    g->backend_state = NULL;
    pthread_mutex_lock(&init_mu);
    live_groups--;
    if (clean)
        maybe_finalize(); /* after a failure, leave it to mpirun */
    pthread_mutex_unlock(&init_mu);
}

/* The group's own shm/tcp connections carry no data under this backend,
 * but they still bring news: an ABORT frame from a peer that gave up
 * (dt_group_abort, a failed operation) and, through their liveness checks,
 * a peer process that died. Polling them now and then gives DT_BACKEND=mpi
 * the same failure reports as the native backend. */
static dt_status peer_news(dt__op *op) {
    dt_group *g = op->g;
    bool progressed = false;
    dt__transport *tps[2] = {g->shm, g->tcp};
    for (int i = 0; i < 2; i++) {
        if (!tps[i])
            continue;
        DT_CHECK(tps[i]->ops->progress(tps[i], &progressed));
        DT_CHECK(tps[i]->ops->check(tps[i], &op->desc));
    }
    return DT_OK;
}

/* Complete a request, bounded by the group's timeout. */
static dt_status wait_req(dt__op *op, MPI_Request *req, MPI_Status *status, const char *what) {
    double deadline = dt_now() + op->g->cfg.timeout, next_news = 0;
    unsigned spins = 0;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, status ? status : MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_error(rc, what);
        if (done)
            return DT_OK;
        if (++spins < 1000)
            continue;
        /* dt_group_abort() from another thread: give up on the request
         * (the group is failed from now on, it is never reused). */
        if (atomic_load(&op->g->aborted))
            return dt_error_set(DT_ERR_ABORTED, "MPI: %s on rank %d: the group was aborted", what,
                                op->g->rank);
        double now = dt_now();
        if (now >= next_news) {
            dt_status st = peer_news(op);
            if (st != DT_OK) {
                dt_error_prefix("MPI: %s on rank %d", what, op->g->rank);
                return st;
            }
            next_news = now + 0.01;
        }
        if (now > deadline)
            return dt_error_set(DT_ERR_TIMEOUT,
                                "MPI: %s (count %zu) on rank %d did not complete within %.0f s "
                                "(DT_TIMEOUT)",
                                what, op->count, op->g->rank, op->g->cfg.timeout);
        sched_yield();
    }
}

#define MPI_TRY(call, what)                                                                        \
    do {                                                                                           \
        int rc__ = (call);                                                                         \
        if (rc__ != MPI_SUCCESS)                                                                   \
            return mpi_error(rc__, what);                                                          \
    } while (0)

static dt_status int_count(const dt__op *op, size_t count, int *out) {
    if (count > INT_MAX)
        return dt_error_set(DT_ERR_UNSUPPORTED,
                            "DT_BACKEND=mpi: %s of %zu elements per rank is above INT_MAX",
                            dt_coll_name(op->coll), count);
    *out = (int)count;
    return DT_OK;
}

static dt_status run_allreduce(dt__op *op) {
    size_t es = dt_dtype_size(op->dtype);
    const char *send = op->send;
    char *recv = op->recv;
    bool inplace = op->send == op->recv;
    for (size_t off = 0; off < op->count || off == 0; off += INT_MAX) {
        size_t n = op->count - off < (size_t)INT_MAX ? op->count - off : (size_t)INT_MAX;
        MPI_Request req;
        MPI_TRY(MPI_Iallreduce(inplace ? MPI_IN_PLACE : send + off * es, recv + off * es, (int)n,
                               mpi_type(op->dtype), mpi_op(op->dtype, op->redop), comm_of(op),
                               &req),
                "MPI_Iallreduce");
        DT_CHECK(wait_req(op, &req, NULL, "MPI_Iallreduce"));
        if (op->count == 0)
            break;
    }
    return DT_OK;
}

static dt_status run_reduce_scatter(dt__op *op) {
    int n = 0;
    DT_CHECK(int_count(op, op->count, &n));
    size_t bytes = op->count * dt_dtype_size(op->dtype);
    bool inplace = op->send == op->recv;
    MPI_Request req;
    MPI_TRY(MPI_Ireduce_scatter_block(inplace ? MPI_IN_PLACE : op->send, op->recv, n,
                                      mpi_type(op->dtype), mpi_op(op->dtype, op->redop),
                                      comm_of(op), &req),
            "MPI_Ireduce_scatter_block");
    DT_CHECK(wait_req(op, &req, NULL, "MPI_Ireduce_scatter_block"));
    /* MPI leaves an in-place result at the front; dtrain's in-place layout
     * keeps it at this rank's block. */
    if (inplace && op->g->rank > 0 && bytes > 0)
        memmove((char *)op->recv + (size_t)op->g->rank * bytes, op->recv, bytes);
    return DT_OK;
}

static dt_status run_allgather(dt__op *op) {
    int n = 0;
    DT_CHECK(int_count(op, op->count, &n));
    MPI_Datatype t = mpi_type(op->dtype);
    MPI_Request req;
    MPI_TRY(MPI_Iallgather(op->send == op->recv ? MPI_IN_PLACE : op->send, n, t, op->recv, n, t,
                           comm_of(op), &req),
            "MPI_Iallgather");
    return wait_req(op, &req, NULL, "MPI_Iallgather");
}

static dt_status run_broadcast(dt__op *op) {
    int n = 0;
    DT_CHECK(int_count(op, op->count, &n));
    MPI_Request req;
    MPI_TRY(MPI_Ibcast(op->recv, n, mpi_type(op->dtype), op->root, comm_of(op), &req),
            "MPI_Ibcast");
    return wait_req(op, &req, NULL, "MPI_Ibcast");
}

static dt_status run_reduce(dt__op *op) {
    int n = 0;
    DT_CHECK(int_count(op, op->count, &n));
    bool root = op->g->rank == op->root;
    const void *send = root && op->send == op->recv ? MPI_IN_PLACE : op->send;
    MPI_Request req;
    MPI_TRY(MPI_Ireduce(send, root ? op->recv : NULL, n, mpi_type(op->dtype),
                        mpi_op(op->dtype, op->redop), op->root, comm_of(op), &req),
            "MPI_Ireduce");
    return wait_req(op, &req, NULL, "MPI_Ireduce");
}

static dt_status run_gather(dt__op *op) {
    int n = 0;
    DT_CHECK(int_count(op, op->count, &n));
    bool root = op->g->rank == op->root;
    MPI_Datatype t = mpi_type(op->dtype);
    MPI_Request req;
    MPI_TRY(MPI_Igather(root && op->send == op->recv ? MPI_IN_PLACE : op->send, n, t,
                        root ? op->recv : NULL, n, t, op->root, comm_of(op), &req),
            "MPI_Igather");
    return wait_req(op, &req, NULL, "MPI_Igather");
}

static dt_status run_scatter(dt__op *op) {
    int n = 0;
    DT_CHECK(int_count(op, op->count, &n));
    bool root = op->g->rank == op->root;
    MPI_Datatype t = mpi_type(op->dtype);
    MPI_Request req;
    MPI_TRY(MPI_Iscatter(root ? op->send : NULL, n, t,
                         root && op->send == op->recv ? MPI_IN_PLACE : op->recv, n, t, op->root,
                         comm_of(op), &req),
            "MPI_Iscatter");
    return wait_req(op, &req, NULL, "MPI_Iscatter");
}

static dt_status run_alltoall(dt__op *op) {
    int n = 0;
    DT_CHECK(int_count(op, op->count, &n));
    MPI_Datatype t = mpi_type(op->dtype);
    MPI_Request req;
    MPI_TRY(MPI_Ialltoall(op->send == op->recv ? MPI_IN_PLACE : op->send, n, t, op->recv, n, t,
                          comm_of(op), &req),
            "MPI_Ialltoall");
    return wait_req(op, &req, NULL, "MPI_Ialltoall");
}

static dt_status run_barrier(dt__op *op) {
    MPI_Request req;
    MPI_TRY(MPI_Ibarrier(comm_of(op), &req), "MPI_Ibarrier");
    return wait_req(op, &req, NULL, "MPI_Ibarrier");
}

static dt_status check_tag(const dt__op *op) {
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(comm_of(op), MPI_TAG_UB, &ub, &flag);
    if (op->tag < 0 || (flag && ub && op->tag > *ub))
        return dt_error_set(DT_ERR_INVALID, "DT_BACKEND=mpi: tag %d is outside MPI's [0, %d]",
                            op->tag, flag && ub ? *ub : 32767);
    return DT_OK;
}

static dt_status run_send(dt__op *op) {
    int n = 0;
    DT_CHECK(int_count(op, op->count, &n));
    DT_CHECK(check_tag(op));
    MPI_Request req;
    MPI_TRY(MPI_Isend(op->send, n, mpi_type(op->dtype), op->root, op->tag, comm_of(op), &req),
            "MPI_Isend");
    return wait_req(op, &req, NULL, "MPI_Isend");
}

static dt_status run_recv(dt__op *op) {
    int n = 0;
    DT_CHECK(int_count(op, op->count, &n));
    DT_CHECK(check_tag(op));
    MPI_Request req;
    MPI_Status status;
    MPI_TRY(MPI_Irecv(op->recv, n, mpi_type(op->dtype), op->root, op->tag, comm_of(op), &req),
            "MPI_Irecv");
    dt_status st = wait_req(op, &req, &status, "MPI_Irecv");
    if (st != DT_OK) {
        if (strstr(dt_last_error(), "truncated"))
            return dt_error_set(DT_ERR_MISMATCH,
                                "rank %d: recv of %zu elements from rank %d (tag %d) got a "
                                "longer message",
                                op->g->rank, op->count, op->root, op->tag);
        return st;
    }
    int got = 0;
    MPI_Get_count(&status, mpi_type(op->dtype), &got);
    if (got != n)
        return dt_error_set(DT_ERR_MISMATCH,
                            "rank %d: recv of %d elements from rank %d (tag %d) got %d elements",
                            op->g->rank, n, op->root, op->tag, got);
    return DT_OK;
}

/* A batch: every transfer posted (MPI matches by source and tag), then
 * each waited for; no transfer waits for another to be posted. */
static dt_status run_batch(dt__op *op) {
    size_t n = op->count;
    if (n == 0)
        return DT_OK;
    MPI_Request *req = malloc(n * sizeof *req);
    if (!req)
        return dt_error_set(DT_ERR_NOMEM, "MPI: sendrecv_batch of %zu transfers", n);
    dt_status st = DT_OK;
    size_t posted = 0;
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(comm_of(op), MPI_TAG_UB, &ub, &flag);
    for (; posted < n && st == DT_OK; posted++) {
        const dt_p2p *p = &op->items[posted].p;
        int cnt = 0, rc;
        st = int_count(op, p->count, &cnt);
        if (st == DT_OK && (p->tag < 0 || (flag && ub && p->tag > *ub)))
            st = dt_error_set(DT_ERR_INVALID, "DT_BACKEND=mpi: tag %d is outside MPI's [0, %d]",
                              p->tag, flag && ub ? *ub : 32767);
        if (st != DT_OK)
            break;
        rc = p->send ? MPI_Isend(p->buf, cnt, mpi_type(p->dtype), p->peer, p->tag, comm_of(op),
                                 &req[posted])
                     : MPI_Irecv(p->buf, cnt, mpi_type(p->dtype), p->peer, p->tag, comm_of(op),
                                 &req[posted]);
        if (rc != MPI_SUCCESS)
            st = mpi_error(rc, p->send ? "MPI_Isend" : "MPI_Irecv");
    }
    /* Requests already posted are completed (or the group fails) before
     * their buffers are given back. */
    for (size_t i = 0; i < posted; i++) {
        MPI_Status status;
        const dt_p2p *p = &op->items[i].p;
        dt_status w = wait_req(op, &req[i], &status, p->send ? "MPI_Isend" : "MPI_Irecv");
        if (w == DT_OK && !p->send) {
            int got = 0;
            MPI_Get_count(&status, mpi_type(p->dtype), &got);
            if ((size_t)got != p->count)
                w = dt_error_set(DT_ERR_MISMATCH,
                                 "rank %d: batched recv of %zu elements from rank %d (tag %d) "
                                 "got %d elements",
                                 op->g->rank, p->count, p->peer, p->tag, got);
        }
        if (st == DT_OK)
            st = w;
    }
    free(req);
    return st;
}

const dt__backend dt__backend_mpi = {
    .name = "mpi",
    .api_version = DT__BACKEND_API,
    .init = mpi_init,
    .fini = mpi_fini,
    .run =
        {
            [DT_COLL_ALLREDUCE] = run_allreduce,
            [DT_COLL_REDUCE_SCATTER] = run_reduce_scatter,
            [DT_COLL_ALLGATHER] = run_allgather,
            [DT_COLL_BROADCAST] = run_broadcast,
            [DT_COLL_REDUCE] = run_reduce,
            [DT_COLL_GATHER] = run_gather,
            [DT_COLL_SCATTER] = run_scatter,
            [DT_COLL_ALLTOALL] = run_alltoall,
            [DT_COLL_BARRIER] = run_barrier,
            [DT_COLL_SEND] = run_send,
            [DT_COLL_RECV] = run_recv,
            [DT_COLL_BATCH] = run_batch,
        },
    .avg_native = false,
};

/* ------------------------------------------------------------------------ */
/* Bootstrap for the native backend under mpirun                            */
/* ------------------------------------------------------------------------ */

/* Rank 0 decides what the environment left open — its address (127.0.0.1
 * when every rank is on one host, else its host name), a free port, a
 * random token (unless the user gave one) — and one MPI_Bcast tells every
 * rank. */
dt_status dt__mpi_bootstrap(dt__jobenv *e) {
    DT_CHECK(ensure_mpi());
    struct {
        char addr[256];
        char token[33];
        char job_id[128];
        int port;
        int status;
        char why[256];
    } b;
    memset(&b, 0, sizeof b);
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != e->size) {
        /* srun without PMI support in MPI: every rank is a singleton and a
         * broadcast would give each its own token. */
        pthread_mutex_lock(&init_mu);
        maybe_finalize();
        pthread_mutex_unlock(&init_mu);
        return dt_error_set(DT_ERR_UNSUPPORTED, "MPI sees %d ranks, %s says %d", size,
                            dt__launcher_name(e->launcher), e->size);
    }
    if (rank == 0) {
        bool one_host = e->local_size == e->size;
        if (e->master_addr[0])
            snprintf(b.addr, sizeof b.addr, "%s", e->master_addr);
        else if (one_host)
            snprintf(b.addr, sizeof b.addr, "127.0.0.1");
        else if (gethostname(b.addr, sizeof b.addr - 1) != 0)
            snprintf(b.why, sizeof b.why, "gethostname failed; set DT_MASTER_ADDR");
        b.port = e->master_port;
        if (b.port == 0) {
            int fd = -1;
            if (dt__net_listen(NULL, 0, &fd, &b.port) == DT_OK)
                close(fd);
            else
                snprintf(b.why, sizeof b.why, "%s", dt_last_error());
        }
        if (e->token[0] && !e->token_derived)
            snprintf(b.token, sizeof b.token, "%s", e->token);
        else if (dt__random_token(b.token) != DT_OK)
            snprintf(b.why, sizeof b.why, "%s", dt_last_error());
        snprintf(b.job_id, sizeof b.job_id, "%s", e->job_id[0] ? e->job_id : "mpi");
        b.status = b.why[0] != 0;
    }
    int rc = MPI_Bcast(&b, (int)sizeof b, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Bcast of the bootstrap address");
    if (b.status != 0)
        return dt_error_set(DT_ERR_SYSTEM, "MPI bootstrap on rank 0: %s", b.why);
    snprintf(e->master_addr, sizeof e->master_addr, "%s", b.addr);
    e->master_port = b.port;
    snprintf(e->token, sizeof e->token, "%s", b.token);
    e->token_derived = false;
    snprintf(e->job_id, sizeof e->job_id, "%s", b.job_id);
    /* The native backend needs nothing more from MPI; DT_BACKEND=mpi
     * groups will be created next and keep it alive. */
    const char *be = getenv("DT_BACKEND");
    if (!(be && strcmp(be, "mpi") == 0)) {
        pthread_mutex_lock(&init_mu);
        maybe_finalize();
        pthread_mutex_unlock(&init_mu);
    }
    return DT_OK;
}
