/*
 * dtrain/comm.h — groups of processes and the collectives between them.
 *
 * Overview
 * --------
 * A dt_group is a set of processes (ranks 0..size-1) that call the same
 * collective operations in the same order. comm moves and reduces typed flat
 * buffers between them; it knows nothing of tensors or models.
 *
 *   - Bootstrap. dt_group_init_from_env() reads DT_RANK, DT_WORLD_SIZE,
 *     DT_MASTER_ADDR, DT_MASTER_PORT and DT_JOB_TOKEN (set by `dtrain
 *     launch`, or by hand), falling back to OMPI_COMM_WORLD_*, PMI_* and
 *     SLURM_* for rank and size under mpirun/srun. Rank 0 serves a small TCP
 *     key-value store on DT_MASTER_PORT; every rank publishes its host and
 *     addresses there. Every connection — store and data — presents the job
 *     token; a process that does not know it is refused.
 *   - Topology and transports. Ranks on one host (same host name, boot id and
 *     DT_NODE_RANK) talk through POSIX shared memory, others through TCP.
 *     DT_TRANSPORT=auto|shm|tcp forces a choice.
 *   - Algorithms. ring (pipelined reduce-scatter + allgather), rhd (recursive
 *     halving-doubling allreduce, Rabenseifner, any rank count; recursive
 *     doubling allgather, power-of-two rank counts), tree (binomial
 *     broadcast/reduce), direct (one host: each rank reduces its slice by
 *     reading every peer's shared window), hier (reduce-scatter inside each
 *     host, allreduce across hosts, allgather inside each host), torus2d
 *     (the same three phases as rings on an X x Y grid, DT_TORUS_X), ordered
 *     (below). A table in src/comm/tune.c picks one by operation, size and
 *     topology, or by the alpha-beta model once links were measured
 *     (dt_group_probe); DT_ALGO=ring|rhd|tree|direct|hier|torus2d|ordered
 *     forces one (an algorithm that cannot run an operation falls back to
 *     the table's choice).
 *   - Determinism. With DT_DETERMINISTIC=1, allreduce and reduce-scatter
 *     compute every element as the left fold in rank order,
 *     (x0 op x1) op x2 ..., whatever DT_ALGO, the transports, the hosts or
 *     DT_CHUNK_SIZE: the bits depend only on the inputs and the group size
 *     (direct on one host, ordered elsewhere; docs/comm.md).
 *   - Progress. Each group owns one progress thread. Operations run in the
 *     order they were issued on that group; a non-blocking call returns a
 *     dt_work at once and the thread runs it while the caller computes.
 *     Groups are independent: operations on two groups may run concurrently
 *     from different threads.
 *   - Failure. Every wait is bounded by DT_TIMEOUT seconds without progress;
 *     the error names the operation, its sequence number and the rank(s) it
 *     waited for. A peer that dies turns into DT_ERR_PEER on the surviving
 *     ranks within a second or two, naming the operation, its sequence number
 *     and the lost rank. Ranks that call different collectives (op, dtype,
 *     reduction, count, root or order) all get DT_ERR_MISMATCH from that very
 *     call, within milliseconds: every message carries the sender's operation
 *     descriptor, and calls whose data flow would not compare every rank's
 *     (rooted operations, count 0) agree on it first (docs/comm.md). The rank
 *     that sees it names both calls. After any such error the group is
 *     failed: every later call returns the same status (destroy it). With
 *     DT_BACKEND=mpi mismatches are not detected (MPI leaves them undefined).
 *
 * Ownership and rules
 * -------------------
 *   1. The caller owns every buffer. Buffers passed to a non-blocking call
 *      are borrowed until dt_work_wait() returns (or dt_work_test() says
 *      done); do not read the output or write the input before then.
 *   2. send == recv means in place (for reduce_scatter/allgather/gather/
 *      scatter, in place means the usual MPI_IN_PLACE layout: see each call).
 *   3. Every rank of a group issues the same collectives in the same order.
 *      Point-to-point send/recv are queued in the same order as collectives,
 *      so a send must be matched by a recv at the same position; to send
 *      and receive at once without deadlock, batch them
 *      (dt_group_sendrecv_batch).
 *   4. counts are in elements of the dtype; 0 is allowed everywhere (a
 *      collective of count 0 moves nothing but still synchronises like a
 *      barrier: it checks that every rank made the same call).
 *   5. AVG is a SUM divided by the group size; for integer types the
 *      division truncates toward zero. f16/bf16 are reduced in f32 and
 *      rounded once per reduction step (to nearest even).
 *
 * Worked example: average gradients over all ranks
 * ------------------------------------------------
 *     // run as: DT_RANK=r DT_WORLD_SIZE=n DT_MASTER_ADDR=127.0.0.1
 *     //         DT_MASTER_PORT=29500 DT_JOB_TOKEN=<32 hex> ./prog
 *     dt_group *world = NULL;
 *     dt_status st = dt_group_init_from_env(&world);
 *     if (st != DT_OK) { fprintf(stderr, "%s\n", dt_last_error()); return 1; }
 *     float *grads = ...;                              // (n_params)
 *     dt_work *w = NULL;
 *     st = dt_group_iallreduce(world, grads, grads, n_params, DT_F32, DT_AVG, &w);
 *     // ... compute something else while the progress thread reduces ...
 *     if (st == DT_OK) st = dt_work_wait(w);            // frees w
 *     if (st != DT_OK) fprintf(stderr, "rank %d: %s\n", dt_group_rank(world),
 *                              dt_last_error());
 *     dt_group *half = NULL;                           // ranks 0..n/2-1, n/2..n-1
 *     dt_group_split(world, dt_group_rank(world) < n / 2, 0, &half);
 *     dt_group_broadcast(half, grads, n_params, DT_F32, 0);
 *     dt_group_destroy(half);
 *     dt_group_destroy(world);
 */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include "dtrain/core.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. 16-bit floats are stored as IEEE binary16 / bfloat16 bits. */
typedef enum dt_dtype {
    DT_F32,
    DT_F64,
    DT_F16,
    DT_BF16,
    DT_I8,
    DT_U8,
    DT_I32,
    DT_I64,
    DT_DTYPE_COUNT
} dt_dtype;

/* Bytes per element (0 for an invalid dtype). */
size_t dt_dtype_size(dt_dtype dtype);
/* "f32", "bf16", ...; "?" for an invalid dtype. */
const char *dt_dtype_name(dt_dtype dtype);
/* Parse a dtype name; DT_ERR_INVALID naming the text otherwise. */
dt_status dt_dtype_parse(const char *text, dt_dtype *out);

typedef enum dt_redop { DT_SUM, DT_AVG, DT_PROD, DT_MIN, DT_MAX, DT_REDOP_COUNT } dt_redop;
const char *dt_redop_name(dt_redop op);

/* Algorithms, for DT_ALGO / --algo and for reporting what ran. */
typedef enum dt_algo {
    DT_ALGO_AUTO,
    DT_ALGO_RING,
    DT_ALGO_RHD,
    DT_ALGO_TREE,
    DT_ALGO_DIRECT,
    DT_ALGO_HIER,
    DT_ALGO_TORUS2D, /* X x Y grid: rings along rows, then columns, then rows */
    DT_ALGO_ORDERED, /* the rank-ordered reduction of DT_DETERMINISTIC=1 */
    DT_ALGO_COUNT
} dt_algo;
const char *dt_algo_name(dt_algo algo);

/* Operations (for the chooser, benchmarks and error messages). */
typedef enum dt_coll {
    DT_COLL_ALLREDUCE,
    DT_COLL_REDUCE_SCATTER,
    DT_COLL_ALLGATHER,
    DT_COLL_BROADCAST,
    DT_COLL_REDUCE,
    DT_COLL_GATHER,
    DT_COLL_SCATTER,
    DT_COLL_ALLTOALL,
    DT_COLL_BARRIER,
    DT_COLL_SEND,
    DT_COLL_RECV,
    DT_COLL_BATCH, /* dt_group_sendrecv_batch */
    DT_COLL_COUNT
} dt_coll;
const char *dt_coll_name(dt_coll coll);

/* Color for dt_group_split meaning "not in any sub-group". */
#define DT_UNDEFINED (-1)

typedef struct dt_group dt_group;
typedef struct dt_work dt_work;

/* ------------------------------------------------------------------------ */
/* Groups                                                                   */
/* ------------------------------------------------------------------------ */

/* Create the world group from the environment (see the overview). Blocks
 * until every rank has joined (bounded by DT_TIMEOUT). */
dt_status dt_group_init_from_env(dt_group **out);

/* What dt_group_init_from_env() reads from the environment, given
 * explicitly: for programs whose ranks meet through another runtime (the
 * PyTorch backend in bindings/torch exchanges these through a c10d store). */
typedef struct dt_group_options {
    int rank, size;          /* 0 <= rank < size */
    const char *master_addr; /* host or IPv4 where rank 0 serves the store; NULL: 127.0.0.1 */
    int master_port;         /* 1..65535; 0 on rank 0: any free port (see on_listen) */
    const char *token;       /* 32 hex digits, the same on every rank; NULL only if size == 1 */
    const char *job_id;      /* part of shared-memory names; NULL: "dtrain" */
    double timeout;          /* seconds, as DT_TIMEOUT; <= 0: DT_TIMEOUT (default 300) */
    /* Rank 0 of a group of more than one rank: called once its store
     * listens, with the bound port, before it waits for the others (with
     * master_port 0, this is where rank 0 tells them the port). A status
     * other than DT_OK ends dt_group_init with it. May be NULL. */
    dt_status (*on_listen)(void *arg, int port);
    void *on_listen_arg;
} dt_group_options;

/* Create a world group from explicit options (no environment variable is
 * read for membership; DT_TRANSPORT, DT_ALGO and the other knobs still
 * apply). Blocks until every rank has joined. */
dt_status dt_group_init(dt_group **out, const dt_group_options *opt);

/* Who this process is in its job and where the job's ranks meet, as
 * dt_group_init_from_env() would read it: DT_*, then Open MPI, MPICH and
 * Slurm variables (docs/launch.md). Under mpirun in a build with MPI, rank
 * 0 picks the meeting place and broadcasts it, so every rank must call
 * this; the answer is also exported as DT_MASTER_ADDR, DT_MASTER_PORT,
 * DT_JOB_TOKEN and DT_JOB_ID. A process without any launcher is rank 0 of
 * 1. For programs that start another runtime's rendezvous from dtrain's
 * launch environment (the PyTorch backend's dtrain:// init method). */
typedef struct dt_job_info {
    int rank, size;
    int local_rank, local_size; /* on this host; -1 when the launcher does not say */
    char master_addr[256];      /* "" when unknown (no launcher) */
    int master_port;            /* 0 when unknown */
    char token[33];             /* 32 hex digits, or "" */
    char job_id[128];           /* "" when unknown */
} dt_job_info;
dt_status dt_job_info_read(dt_job_info *out);

/* Collective over g: ranks with the same color form a sub-group, ordered by
 * (key, rank in g). A color of DT_UNDEFINED gives *out = NULL. */
dt_status dt_group_split(dt_group *g, int color, int key, dt_group **out);

/* Planning (dtrain plan memory): the shared memory one rank of a group
 * with `local` members on its host has resident for the shm transport,
 * from the layout the transport builds (the DT_SHM_* settings of the
 * environment): the control pages and the pages of the rings small
 * messages touch; with `bulk` traffic (a gradient or model-parallel
 * group) its own window, which large collectives stage through; and with
 * `staged` bulk traffic (messages the direct algorithm moves through the
 * windows rather than single-copy: below DT_SHM_CMA_MIN, a codec's
 * encodings) the peers' windows it reads. The segments are larger (slots
 * of DT_SHM_SLOT x DT_SHM_SLOTS per peer) but resident only where touched.
 * 0 below two local members. */
dt_status dt_comm_plan_shm_bytes(int local, bool bulk, bool staged, size_t *out);

/* Stop the progress thread, close connections, unmap shared memory.
 * Outstanding dt_work handles must have been waited for. NULL-safe. */
void dt_group_destroy(dt_group *g);

/* Fail every current and future operation of g with DT_ERR_ABORTED (peers
 * see DT_ERR_PEER). Safe from any thread, including a signal-free watchdog;
 * the group must still be destroyed. */
void dt_group_abort(dt_group *g);

int dt_group_rank(const dt_group *g);
int dt_group_size(const dt_group *g);
/* Rank in the world group this group was split from. */
int dt_group_world_rank(const dt_group *g, int rank);
/* Ranks of g on this rank's host, and this rank's index among them. */
int dt_group_local_size(const dt_group *g);
int dt_group_local_rank(const dt_group *g);
/* "shm", "tcp", "shm+tcp" or "self": the transports this group uses. */
const char *dt_group_transport(const dt_group *g);
/* The algorithm the chooser (or DT_ALGO) picks for `coll` on `bytes` bytes. */
dt_algo dt_group_algo_for(const dt_group *g, dt_coll coll, size_t bytes);
/* The algorithm the last completed operation on g used (for benchmarks). */
dt_algo dt_group_last_algo(const dt_group *g);

/* ------------------------------------------------------------------------ */
/* Topology discovery                                                       */
/* ------------------------------------------------------------------------ */

/* Link classes: two ranks on one host, or on two hosts. */
typedef enum dt_link_class { DT_LINK_INTRA, DT_LINK_INTER, DT_LINK_CLASS_COUNT } dt_link_class;

/* The alpha-beta model of one link class: an m-byte message takes
 * alpha + m / beta seconds. Medians over the pairs measured. */
typedef struct dt_link_params {
    double alpha; /* seconds (half an 8-byte round trip) */
    double beta;  /* bytes per second (from an m-byte round trip) */
    int pairs;    /* pairs of this class measured (0: none, alpha = beta = 0) */
} dt_link_params;

typedef struct dt_topology {
    int size;           /* ranks */
    int nhosts;         /* hosts (ranks that share memory: one host) */
    int ranks_per_host; /* the same on every host, else 0 */
    /* latency confirms the hosts: inside-host alpha <= half the
     * between-host alpha (false when a class was not measured) */
    bool hosts_confirmed;
    /* groups of hosts whose mutual latency is clearly lower than to the
     * others (a switch each); 1 when latency shows no such level or the
     * probe was quick */
    int switches;
    dt_link_params link[DT_LINK_CLASS_COUNT];
} dt_topology;

/* Collective: measure the links of g by ping-pongs between pairs of ranks,
 * one pair at a time (all_pairs: every pair; else one pair per class),
 * 8 bytes for latency and `bytes` (1 KiB .. 1 GiB) for bandwidth. Fills
 * *out; lat and bw, if not NULL, get size*size matrices (seconds, bytes/s;
 * 0 on the diagonal and for pairs not measured). The class parameters are
 * kept in g, and in groups split from g afterwards, where the algorithm
 * chooser reads them (docs/comm.md); no other thread may use g meanwhile.
 * DT_TOPO_PROBE=1 runs a quick probe when the world group is created. */
dt_status dt_group_probe(dt_group *g, bool all_pairs, size_t bytes, dt_topology *out, double *lat,
                         double *bw);

/* ------------------------------------------------------------------------ */
/* Clocks (for merging the ranks' traces, dtrain/trace.h)                   */
/* ------------------------------------------------------------------------ */

/* This rank's trace clock (dt_trace_now) against world rank 0's, measured
 * through the rendezvous store: a probe reads this clock (t1), asks the
 * store, which rank 0's process serves, for its clock (T), and reads this
 * clock again (t2). T was taken between t1 and t2, so rank 0's clock minus
 * this one lies in [T - t2, T - t1]: the sample keeps the probe with the
 * shortest round trip, its midpoint and half its width. */
typedef struct dt_clock_sample {
    double local_ns;  /* this rank's trace clock at the probe's midpoint */
    double offset_ns; /* rank 0's clock minus this rank's, the interval's midpoint */
    double error_ns;  /* the true offset is within offset_ns +- error_ns */
    bool same_kernel; /* this rank and rank 0 run on one kernel (one boot id), so
                         their CLOCK_MONOTONIC is the same clock */
} dt_clock_sample;

/* Not collective: any rank, any time (rank 0 and a world of one get an
 * offset and error of 0). `probes` round trips (1..10000), the best kept. */
dt_status dt_group_clock_sample(dt_group *g, int probes, dt_clock_sample *out);

/* ------------------------------------------------------------------------ */
/* Non-blocking handles                                                     */
/* ------------------------------------------------------------------------ */

/* Wait until the operation completes (no longer than DT_TIMEOUT seconds
 * without progress), free w, and return the operation's status. */
dt_status dt_work_wait(dt_work *w);
/* *done = whether it completed; never blocks. After done, call wait to
 * collect the status and free the handle. */
dt_status dt_work_test(dt_work *w, bool *done);

/* ------------------------------------------------------------------------ */
/* Collectives. The i-forms return at once with a handle; the plain forms
 * are the i-form followed by dt_work_wait (run inline when the group is
 * idle, so a blocking call costs no thread hand-off).                      */
/* ------------------------------------------------------------------------ */

/* recv[i] = op over ranks of send[i], i < count, on every rank. */
dt_status dt_group_allreduce(dt_group *g, const void *send, void *recv, size_t count,
                             dt_dtype dtype, dt_redop op);
dt_status dt_group_iallreduce(dt_group *g, const void *send, void *recv, size_t count,
                              dt_dtype dtype, dt_redop op, dt_work **work);

/* send holds size*count elements; rank r gets in recv[0..count) the
 * reduction of block r. In place (send == recv): the result lands in
 * recv[r*count .. (r+1)*count). */
dt_status dt_group_reduce_scatter(dt_group *g, const void *send, void *recv, size_t count,
                                  dt_dtype dtype, dt_redop op);
dt_status dt_group_ireduce_scatter(dt_group *g, const void *send, void *recv, size_t count,
                                   dt_dtype dtype, dt_redop op, dt_work **work);

/* send holds count elements; recv gets size*count, block r from rank r.
 * In place (send == recv): rank r's input is already at recv[r*count]. */
dt_status dt_group_allgather(dt_group *g, const void *send, void *recv, size_t count,
                             dt_dtype dtype);
dt_status dt_group_iallgather(dt_group *g, const void *send, void *recv, size_t count,
                              dt_dtype dtype, dt_work **work);

/* buf on root is copied to buf on every rank. */
dt_status dt_group_broadcast(dt_group *g, void *buf, size_t count, dt_dtype dtype, int root);
dt_status dt_group_ibroadcast(dt_group *g, void *buf, size_t count, dt_dtype dtype, int root,
                              dt_work **work);

/* recv on root = op over ranks of send (recv is ignored elsewhere). */
dt_status dt_group_reduce(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                          dt_redop op, int root);
dt_status dt_group_ireduce(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                           dt_redop op, int root, dt_work **work);

/* root's recv (size*count) gets block r from rank r's send (count). In
 * place on root: its block is already at recv[root*count]. */
dt_status dt_group_gather(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                          int root);
dt_status dt_group_igather(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                           int root, dt_work **work);

/* rank r's recv (count) gets block r of root's send (size*count). In place
 * on root: root keeps its block where it is in send. */
dt_status dt_group_scatter(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                           int root);
dt_status dt_group_iscatter(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                            int root, dt_work **work);

/* Block j of rank i's send (count elements) becomes block i of rank j's
 * recv. In place is allowed (send == recv). */
dt_status dt_group_alltoall(dt_group *g, const void *send, void *recv, size_t count,
                            dt_dtype dtype);
dt_status dt_group_ialltoall(dt_group *g, const void *send, void *recv, size_t count,
                             dt_dtype dtype, dt_work **work);

dt_status dt_group_barrier(dt_group *g);
dt_status dt_group_ibarrier(dt_group *g, dt_work **work);

/* Point to point. A send to `peer` with `tag` must meet a recv from this
 * rank with the same tag and count at the same position in peer's queue;
 * anything else is DT_ERR_MISMATCH. */
dt_status dt_group_send(dt_group *g, const void *buf, size_t count, dt_dtype dtype, int peer,
                        int tag);
dt_status dt_group_isend(dt_group *g, const void *buf, size_t count, dt_dtype dtype, int peer,
                         int tag, dt_work **work);
dt_status dt_group_recv(dt_group *g, void *buf, size_t count, dt_dtype dtype, int peer, int tag);
dt_status dt_group_irecv(dt_group *g, void *buf, size_t count, dt_dtype dtype, int peer, int tag,
                         dt_work **work);

/* One transfer of a batch of point-to-point operations. */
typedef struct dt_p2p {
    bool send;      /* true: send buf to peer; false: receive buf from peer */
    void *buf;      /* count elements of dtype (only read for a send) */
    size_t count;   /* elements; 0 is allowed */
    dt_dtype dtype; /* element type */
    int peer;       /* another rank of the group */
    int tag;        /* must equal the peer's tag for the matching transfer */
} dt_p2p;

/* Post every transfer of ops[0..n) at once and complete them together, as
 * one operation in the group's queue. Sends and receives of one batch never
 * wait for each other, so two ranks that each send to and receive from the
 * other in one batch (a pipeline's send-forward / receive-backward) cannot
 * deadlock, whatever the message sizes. Each transfer matches the peer's
 * transfer of the other direction like dt_group_send/recv do: in the order
 * of all point-to-point messages between the two ranks (batched or not),
 * with equal count, dtype and tag (DT_ERR_MISMATCH naming both otherwise).
 * `ops` is copied; the buffers are borrowed until the work completes. n may
 * be 0. A batch does not take a collective's place in the group's order:
 * ranks that are not in it need not call anything. */
dt_status dt_group_sendrecv_batch(dt_group *g, const dt_p2p *ops, size_t n);
dt_status dt_group_isendrecv_batch(dt_group *g, const dt_p2p *ops, size_t n, dt_work **work);

/* ------------------------------------------------------------------------ */
/* Reduction kernels (also used by compress/ and optim/)                    */
/* ------------------------------------------------------------------------ */

/* out[i] = a[i] op b[i]; out may alias a or b. AVG reduces like SUM here.
 * Chooses AVX-512, AVX2 or scalar code at run time. */
void dt_reduce(void *out, const void *a, const void *b, size_t count, dt_dtype dtype, dt_redop op);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_COMM_H */
