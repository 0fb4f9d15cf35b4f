/*
 * comm_internal.h — the pieces of comm that talk to each other, and nothing
 * that a user of dtrain/comm.h needs.
 *
 * Layering inside comm (arrows point down only):
 *
 *   group.c      public API, work queue, progress thread, split, abort
 *     |
 *   backend.h    per-group table of collective entry points
 *     |              native.c (ours), mpi.c (later, DT_BACKEND=mpi)
 *   native.c + tune.c    choose an algorithm per op
 *     |
 *   ring.c rhd.c tree.c direct.c hier.c     schedules, written against...
 *     |
 *   engine.c     post send / post recv / wait over the transports of a group
 *     |
 *   transport vtable:  shm.c   tcp.c        (know nothing of algorithms)
 *     |
 *   wire.c (frame header), net.c (sockets + token handshake), store.c
 */
#ifndef DTRAIN_COMM_INTERNAL_H
#define DTRAIN_COMM_INTERNAL_H

#include "dtrain/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* Wire header: every message (and every fragment of one) starts with it.  */
/* ------------------------------------------------------------------------ */

#define DT__WIRE_MAGIC   0x4e525444u /* "DTRN" little-endian */
#define DT__WIRE_VERSION 1
/* Upper bound on one message's payload; anything larger on the wire is
 * hostile or corrupt, and is refused before it can size a copy. */
#define DT__WIRE_MAX_LEN ((uint64_t)1 << 40)

enum { DT__MSG_DATA = 1, DT__MSG_ABORT = 2, DT__MSG_BYE = 3 };

/* The sender's operation descriptor plus where this frame's payload goes.
 * Host byte order: dtrain ranks of one job run the same build. */
typedef struct dt__wire_hdr {
    uint32_t magic;   /* DT__WIRE_MAGIC */
    uint16_t version; /* DT__WIRE_VERSION */
    uint8_t kind;     /* DT__MSG_* */
    uint8_t coll;     /* dt_coll of the operation */
    uint8_t dtype;    /* dt_dtype */
    uint8_t redop;    /* dt_redop */
    uint16_t flags;   /* reserved, 0 */
    int32_t root;     /* root, or peer for send/recv, or -1 */
    int32_t tag;      /* user tag (send/recv), else 0 */
    int32_t src;      /* sender's rank in the group */
    int32_t status;   /* DT__MSG_ABORT: the sender's dt_status; else 0 */
    uint64_t seq;     /* operation sequence number in the group, from 1 */
    uint64_t count;   /* operation's element count */
    uint64_t offset;  /* byte offset of this frame's payload in its message */
    uint64_t len;     /* payload bytes that follow this header */
} dt__wire_hdr;
_Static_assert(sizeof(dt__wire_hdr) == 64, "wire header must be 64 bytes");

/* Validate n raw bytes as a header (magic, version, kind, enum ranges,
 * lengths); DT_ERR_PROTOCOL naming the bad field otherwise. */
dt_status dt__wire_decode(const void *buf, size_t n, dt__wire_hdr *out);
/* Compare a received data header with what this rank expects: a different
 * operation is DT_ERR_MISMATCH naming both calls; a descriptor that agrees
 * but a frame that does not fit the posted buffer is DT_ERR_PROTOCOL. An
 * ABORT frame turns into the sender's status. */
dt_status dt__wire_check(const dt__wire_hdr *got, const dt__wire_hdr *want, int me, int from,
                         uint64_t expect_offset, uint64_t expect_len);
/* A frame found queued (no receive posted for it) while this rank runs
 * `cur`: DT_ERR_MISMATCH if it can only belong to a different call. */
dt_status dt__wire_early(const dt__wire_hdr *got, const dt__wire_hdr *cur, int me, int from);
/* Can `cur` still complete here although a peer gave up in collective
 * `seq` (0: unknown, or a point-to-point call)? For a collective `cur`: if
 * the peer failed in a later collective, every byte of `cur` it was to send
 * was sent before it failed. For a point-to-point `cur` (not ordered against
 * collectives): if the peer failed in a collective and `cur` has nothing in
 * flight with it (`busy` false); a receive posted later reads the failure
 * itself, and a send waiting on the peer must not wait for a rank that gave
 * up. */
bool dt__abort_later(uint64_t seq, const dt__wire_hdr *cur, bool busy);
/* Send, recv and batches: numbered per (direction, peer), not in the
 * group's sequence of collectives. */
bool dt__is_p2p(unsigned coll);
/* The error of a rank told that peer `from` gave up with status st (an
 * ABORT frame, an abort word, a store record): "rank 2 gave up
 * (DT_ERR_PEER): rank 3 is lost" when lost is a rank below size. Returns
 * st. */
dt_status dt__abort_error(int from, dt_status st, int lost, int size, bool from_store);
/* "allreduce #7 (count 1000, f32, sum)" */
void dt__desc_format(const dt__wire_hdr *d, char *buf, size_t n);

/* ------------------------------------------------------------------------ */
/* Sockets and the job-token handshake (net.c)                              */
/* ------------------------------------------------------------------------ */

#define DT__TOKEN_LEN 32
enum { DT__HS_STORE = 1, DT__HS_DATA = 2 };

typedef struct dt__hs {
    uint32_t magic;            /* "DTHS" */
    uint16_t version;          /* 1 */
    uint16_t purpose;          /* DT__HS_* */
    char token[DT__TOKEN_LEN]; /* the job token, not NUL-terminated */
    char group[64];            /* group id (data connections) */
    int32_t rank;              /* connecting rank in that group */
    int32_t index;             /* socket index for that pair */
} dt__hs;

/* Listen on addr:port (port 0: any); returns the fd and the bound port. */
dt_status dt__net_listen(const char *addr, int port, int *fd, int *bound_port);
/* Connect with retries until the deadline (the listener may not be up yet). */
dt_status dt__net_connect(const char *host, int port, double deadline, int *fd);
/* Blocking full read/write with a deadline; EINTR and partial I/O handled. */
dt_status dt__net_read(int fd, void *buf, size_t n, double deadline);
dt_status dt__net_write(int fd, const void *buf, size_t n, double deadline);
/* Client side: send the handshake and wait for the verdict. */
dt_status dt__net_hs_client(int fd, const dt__hs *hs, double deadline);
/* Server side: read a handshake, check magic/version/purpose/token, reply.
 * A wrong token is DT_ERR_AUTH and the peer is told so. */
dt_status dt__net_hs_server(int fd, const char *token, int purpose, dt__hs *out, double deadline);
void dt__net_tune(int fd, size_t bufsize);
dt_status dt__net_set_nonblocking(int fd);
/* This host's address as seen by others (DT_IFADDR, else from the route to
 * the master, else 127.0.0.1). */
void dt__net_local_addr(const char *master, char *out, size_t n);

/* ------------------------------------------------------------------------ */
/* Rendezvous store (store.c)                                               */
/* ------------------------------------------------------------------------ */

typedef struct dt__store dt__store;               /* a client connection */
typedef struct dt__store_server dt__store_server; /* rank 0's server thread */

dt_status dt__store_server_start(const char *addr, int port, const char *token,
                                 dt__store_server **out, int *bound_port);
void dt__store_server_stop(dt__store_server *s);
dt_status dt__store_connect(const char *host, int port, const char *token, double timeout,
                            dt__store **out);
void dt__store_close(dt__store *s);
dt_status dt__store_set(dt__store *s, const char *key, const void *val, size_t len);
/* DT_ERR_NOT_FOUND if absent. *val is dt_alloc'ed (caller frees). */
dt_status dt__store_get(dt__store *s, const char *key, void **val, size_t *len);
/* The same with a deadline of `seconds` instead of DT_TIMEOUT (failure paths
 * that must answer fast even when the store's host is gone). */
dt_status dt__store_set_within(dt__store *s, const char *key, const void *val, size_t len,
                               double seconds);
dt_status dt__store_get_within(dt__store *s, const char *key, void **val, size_t *len,
                               double seconds);
/* Wait until key exists (bounded by the store's timeout), then get it. */
dt_status dt__store_wait(dt__store *s, const char *key, void **val, size_t *len);
/* Atomically add delta to the integer at key (absent = 0); *result = new. */
dt_status dt__store_add(dt__store *s, const char *key, int64_t delta, int64_t *result);
/* The server's trace clock (dt_trace_now of rank 0's process), bracketed
 * by this process's readings just before the request and after the reply. */
dt_status dt__store_time(dt__store *s, uint64_t *sent, uint64_t *server, uint64_t *received);

/* For elastic jobs (elastic.c). */
/* Serve on sockets already listening (1 or 2; the server closes them). */
dt_status dt__store_server_adopt(const int *lfds, int n, const char *token, dt__store_server **out);
/* The integer at key becomes max(it, value) (absent: value); *result = new. */
dt_status dt__store_max(dt__store *s, const char *key, int64_t value, int64_t *result);
/* Set key unless it exists; *stored (dt_alloc'ed) = the value it now has,
 * ours or the earlier one. */
dt_status dt__store_set_if_absent(dt__store *s, const char *key, const void *val, size_t len,
                                  void **stored, size_t *stored_len);
/* Set key until this connection closes (the process died or left). */
dt_status dt__store_set_ephemeral(dt__store *s, const char *key, const void *val, size_t len);
/* Move the client to the server at host:port (one connection attempt, the
 * handshake bounded by `seconds`); on success the earlier connection is
 * closed and the client usable again, ephemeral keys must be set anew. */
dt_status dt__store_reconnect(dt__store *s, const char *host, int port, double seconds);
/* While set, waits call watch(arg) every 20 ms and end with its status
 * when that is not DT_OK; dt__store_watch runs it from other polling loops. */
void dt__store_set_watch(dt__store *s, dt_status (*watch)(void *arg), void *arg);
dt_status dt__store_watch(dt__store *s);

/* A world group whose ranks meet through `store`, a connected client the
 * caller keeps (it must outlive the group; nothing is served or closed
 * here), with its keys and group id under `prefix` (1..15 characters, one
 * per membership of an elastic job: elastic.c). o->master_port is unused;
 * o->master_addr only picks the local address others reach us at. */
dt_status dt__group_init_on_store(dt__store *store, const char *prefix, const dt_group_options *o,
                                  dt_group **out);

/* ------------------------------------------------------------------------ */
/* Transfers and transports                                                 */
/* ------------------------------------------------------------------------ */

#define DT__MAX_SOCKS 8

typedef struct dt__xfer dt__xfer;

/* One frame stream piece of a transfer on one TCP socket. */
typedef struct dt__part {
    dt__xfer *x;           /* owner */
    struct dt__part *next; /* FIFO on its socket */
    uint64_t offset, len;  /* payload range of the message */
    uint64_t done;         /* payload bytes moved */
    unsigned hdr_done;     /* header bytes moved (0..64) */
    dt__wire_hdr hdr;      /* send: to send; recv: received */
} dt__part;

/* A posted send or receive of one message to/from one peer. The algorithm
 * owns the memory; the transport links it into its queues until done. */
struct dt__xfer {
    int peer; /* rank in the group */
    bool is_send;
    bool done;
    char *buf;             /* payload (const for sends) */
    uint64_t len;          /* payload bytes */
    uint64_t moved;        /* bytes moved so far (all parts) */
    dt__wire_hdr hdr;      /* send: header to stamp; recv: expected desc */
    struct dt__xfer *next; /* transport queue link */
    int nparts, parts_done;
    dt__part parts[DT__MAX_SOCKS];
    /* Receive-and-reduce: on completion red_out = red_in op payload. A
     * transport that can (shm) reduces fragment by fragment straight from
     * its slots and sets reduced; otherwise the engine does it once. */
    bool reduce, reduced;
    void *red_out;
    const void *red_in;
    dt_dtype dtype;
    dt_redop redop;
};

typedef struct dt__transport dt__transport;

/* What a transport knows about a peer. A transport that shares memory with
 * the peer exposes the peer's window (used by the direct algorithm). */
/* One cache line per rank and epoch parity for the direct algorithm's
 * small-message path: the payload and the op's identity travel with the
 * epoch that publishes them, so a waiter needs one line per peer. */
#define DT__SMALL_BYTES 40
typedef struct dt__small_line {
    _Alignas(64) _Atomic uint64_t epoch; /* written last (release) */
    uint64_t id[2];                      /* coll/dtype/redop/seq, count */
    unsigned char data[DT__SMALL_BYTES];
} dt__small_line;
_Static_assert(sizeof(dt__small_line) == 64, "small line must be one cache line");

typedef struct dt__peer_info {
    bool shared;            /* peer's memory is mapped here */
    char *window;           /* peer's window (2 halves of window_size) */
    size_t window_size;     /* bytes per half */
    _Atomic uint64_t *flag; /* peer's phase counter */
    dt__wire_hdr *desc;     /* peer's published op descriptors [2] */
    /* Single copy (cross-memory attach): when cma is set on every member,
     * a rank may publish buffer addresses in addr[parity][0..1] and peers
     * pull from them with ops->read_peer. cma_min is the group-wide
     * threshold in bytes, push_min the allgather output from which peers
     * write instead (write_peer). Same for every member (agreed at
     * creation). */
    bool cma;
    size_t cma_min, push_min;
    uint64_t *addr; /* peer's published addresses [2][2] */
    /* Peer's progress word for the single-copy pipelines: pieces of its
     * slice finished in the current op, tagged with the op's epoch (direct.c). */
    _Atomic uint64_t *progress;
    dt__small_line *small; /* peer's small-message lines [2], by epoch parity */
    /* Push allgather (direct.c): the epoch whose writes the peer accepts
     * into its output (0: closed), and which rank + 1 it is writing into. */
    _Atomic uint64_t *gate;
    _Atomic int32_t *pushing;
} dt__peer_info;

/* The transport interface. Algorithms never call it: engine.c does. */
typedef struct dt__transport_ops {
    const char *name;
    dt_status (*post_send)(dt__transport *t, dt__xfer *x);
    dt_status (*post_recv)(dt__transport *t, dt__xfer *x);
    /* Move whatever can move without blocking; *progressed if anything did. */
    dt_status (*progress)(dt__transport *t, bool *progressed);
    /* Sleeping without lost wake-ups: arm() announces that the caller is
     * about to sleep and returns a token; the caller then looks for work
     * once more (progress + its predicate) and calls block(token, ms),
     * which sleeps up to ms unless an event arrived after arm(). Every
     * arm() is followed by one block(); ms == 0 withdraws without sleeping
     * (the last look found work). Notifiers only pay for a wake-up when
     * the peer has armed. */
    uint64_t (*arm)(dt__transport *t);
    void (*block)(dt__transport *t, uint64_t token, int ms);
    /* Liveness of every peer: DT_ERR_PEER naming a dead one. */
    /* Early mismatch detection too: a frame waiting where nothing is posted
     * that belongs to the current operation `cur` (or an older one) but
     * disagrees with it is DT_ERR_MISMATCH. */
    dt_status (*check)(dt__transport *t, const dt__wire_hdr *cur);
    /* Optional: the caller has waited in `cur` past its yields; make that
     * visible to peers' check(), so that two ranks waiting for each other
     * in different calls without a message between them (a shared flag
     * against a receive) see the mismatch. */
    void (*waiting)(dt__transport *t, const dt__wire_hdr *cur);
    /* Group ranks with a posted transfer still unfinished (at most max);
     * returns how many. For the timeout message. */
    int (*pending)(dt__transport *t, int *ranks, int max);
    void (*peer_info)(dt__transport *t, int peer, dt__peer_info *out);
    /* Copy len bytes at address addr of peer's process into dst (single
     * copy, process_vm_readv). Only when peer_info says cma. A failure is
     * DT_ERR_PEER naming the peer. */
    dt_status (*read_peer)(dt__transport *t, int peer, void *dst, uint64_t addr, size_t len);
    /* The other direction (process_vm_writev): len bytes of src to address
     * addr of peer's process, which the peer published for this purpose. */
    dt_status (*write_peer)(dt__transport *t, int peer, uint64_t addr, const void *src, size_t len);
    /* Has peer's process exited? Sets no error. */
    bool (*peer_dead)(dt__transport *t, int peer);
    /* Tell every peer this rank gives up (best effort, never blocks). With
     * owner = false it is called from a thread that does not drive the
     * transport and must only touch thread-safe state. seq is the
     * collective it failed in (0: not a collective, or unknown): a peer
     * still finishing an earlier collective has all it needs from this
     * rank for it, finishes it, and fails at the next. */
    void (*abort)(dt__transport *t, dt_status st, int lost_rank, uint64_t seq, bool owner);
    /* Drop queued transfers after a failure (they point into user memory). */
    void (*reset)(dt__transport *t);
    /* wake local waiters on peer (after publishing a flag); peer == this
     * rank: end this rank's own block() early, from any thread (the
     * mailbox's callers wake its thread so) */
    void (*notify)(dt__transport *t, int peer);
    void (*destroy)(dt__transport *t, bool clean);
} dt__transport_ops;

struct dt__transport {
    const dt__transport_ops *ops;
};

/* ------------------------------------------------------------------------ */
/* Groups                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct dt__backend dt__backend;

/* Measured link classes (topo.c), indexed by dt_link_class. */
typedef struct dt__links {
    bool valid; /* a probe ran */
    double alpha[DT_LINK_CLASS_COUNT], beta[DT_LINK_CLASS_COUNT];
} dt__links;

/* Job-wide state shared by the world group and every group split from it. */
typedef struct dt__job {
    char token[DT__TOKEN_LEN + 1];
    char job_id[64];
    char master[256];
    int master_port;
    int world_rank, world_size;
    char host[320];   /* host key: ranks with equal keys share memory */
    char addr[64];    /* address other hosts reach us at */
    char **host_keys; /* [world_size] */
    int *pids;        /* [world_size] */
    dt__store *store;
    bool store_borrowed;      /* elastic: the store client is the caller's (not closed here) */
    char prefix[16];          /* the world group's id and its store keys' prefix ("w") */
    pthread_mutex_t store_mu; /* groups may split concurrently */
    dt__store_server *server;
    _Atomic int refs;
    double timeout; /* DT_TIMEOUT */
} dt__job;

/* Settings read once per group from DT_* variables. */
typedef struct dt__config {
    double timeout;      /* DT_TIMEOUT seconds */
    int transport;       /* 0 auto, 1 shm, 2 tcp */
    dt_algo algo;        /* DT_ALGO */
    bool deterministic;  /* DT_DETERMINISTIC: rank-ordered allreduce/reduce-scatter */
    int torus_x;         /* DT_TORUS_X: torus2d grid columns (0: ranks per host) */
    bool topo_probe;     /* DT_TOPO_PROBE: quick link probe when the world is created */
    size_t chunk;        /* DT_CHUNK_SIZE: ring pipeline chunk */
    size_t shm_slot;     /* DT_SHM_SLOT */
    int shm_slots;       /* DT_SHM_SLOTS */
    size_t shm_window;   /* DT_SHM_WINDOW (bytes per half) */
    int shm_cma;         /* DT_SHM_CMA: 0 auto, 1 on, 2 off */
    size_t shm_cma_min;  /* DT_SHM_CMA_MIN bytes */
    size_t shm_push_min; /* DT_SHM_PUSH_MIN bytes (allgather output) */
    int spin;            /* DT_SPIN microseconds of polling before sleeping */
    int yield;           /* DT_YIELD sched_yield()s before sleeping */
    int tcp_socks;       /* DT_TCP_SOCKS */
    size_t tcp_buffer;   /* DT_TCP_BUFFER */
    size_t tcp_stripe;   /* DT_TCP_STRIPE_MIN */
} dt__config;

dt_status dt__config_read(dt__config *c);

struct dt_group {
    dt__job *job;
    char id[64]; /* store key prefix, unique per group */
    int rank, size;
    int *world; /* [size] world rank of each group rank */
    int *host;  /* [size] host index (0..nhosts) of each rank */
    int nhosts;
    int local_rank, local_size;
    int *local;           /* [local_size] group ranks on my host, ascending */
    int *leaders;         /* [nhosts] lowest group rank of each host */
    int **host_ranks;     /* [nhosts][host_size[h]] group ranks per host */
    int *host_size;       /* [nhosts] */
    int *ident;           /* [size] 0..size-1, the whole-group team */
    _Atomic int lost;     /* a rank a transport saw die, or -1 */
    double last_progress; /* when an op last started or finished */
    dt__config cfg;

    dt__transport *shm, *tcp;
    dt__transport **tp; /* [size] transport for each peer, NULL for self */
    char tpname[16];

    const dt__backend *backend;
    void *backend_state;

    /* progress */
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* progress thread: work queued, idle again, stop */
    pthread_cond_t done_cv; /* waiters: an operation completed */
    dt_work *head, *tail;   /* queued, not yet started */
    bool busy;              /* an op is executing (thread or inline) */
    bool stop;
    dt_thread *thread;
    uint64_t issued;       /* last collective sequence number handed out */
    uint64_t *sent, *rcvd; /* [size] point-to-point sequence numbers per peer */
    _Atomic int failed;    /* sticky dt_status after a failure */
    char failmsg[768];
    _Atomic int aborted;
    _Atomic int last_algo;
    int splits;            /* how many splits of this group so far */
    uint64_t direct_epoch; /* direct algorithm's phase counter */
    uint64_t direct_chunk; /* direct algorithm's chunks, for window halves */
    char *scratch;         /* per-op temporary, grown on demand */
    size_t scratch_size;
    /* Measured link classes for the chooser (topo.c): equal on every member
     * (probed together, or inherited from the group split), so every rank
     * picks the same algorithm. */
    dt__links links;
    /* Tracing (dtrain/trace.h): a number for this group that every member
     * computes alike (a hash of id), and the transport its events cross. */
    uint32_t trace_id;
    uint8_t trace_link; /* dt_trace_link */
};

/* The running operation: its descriptor and arguments. */
/* A transfer of a batch and the per-(direction, peer) sequence number its
 * messages carry. */
typedef struct dt__p2p_item {
    dt_p2p p;
    uint64_t seq;
} dt__p2p_item;

typedef struct dt__op {
    dt_group *g;
    dt__wire_hdr desc; /* kind DATA, coll..count, src = my rank */
    dt_coll coll;
    const void *send;
    void *recv;
    size_t count;
    dt_dtype dtype;
    dt_redop redop;
    int root; /* root, or peer for send/recv */
    int tag;
    dt_algo algo;        /* what ran */
    dt__p2p_item *items; /* DT_COLL_BATCH: the transfers (count of them) */
} dt__op;

struct dt_work {
    dt__op op;
    dt_work *next;
    uint64_t t_issue; /* trace clock when issued; 0: not traced */
    bool done;
    bool inline_run;
    dt_status status;
    char err[768];
};

/* Scratch memory owned by the group, valid until the next call. */
dt_status dt__scratch(dt_group *g, size_t bytes, void **out);

/* ------------------------------------------------------------------------ */
/* Engine: what algorithms call (engine.c)                                  */
/* ------------------------------------------------------------------------ */

/* A team is a subset of the group's ranks an algorithm runs over (the whole
 * group, the ranks of one host, one rank per host). */
typedef struct dt__team {
    int n;            /* members */
    int me;           /* my index */
    const int *ranks; /* [n] group ranks */
} dt__team;

void dt__team_all(dt_group *g, dt__team *t, int *buf);

dt_status dt__post_send(dt__op *op, dt__xfer *x, int peer, const void *buf, size_t len);
dt_status dt__post_recv(dt__op *op, dt__xfer *x, int peer, void *buf, size_t len);
/* Post transfer `it` of a batch: its messages carry the item's own
 * descriptor (send or recv, peer, tag, count, dtype, sequence). */
dt_status dt__post_item(dt__op *op, dt__xfer *x, const dt__p2p_item *it);
/* Receive len bytes from peer and, on completion, out = in op payload
 * (count = len / dtype size). tmp (len bytes) is used only by transports
 * that cannot reduce in place; out may equal in. */
dt_status dt__post_recv_reduce(dt__op *op, dt__xfer *x, int peer, void *tmp, size_t len, void *out,
                               const void *in);
dt_status dt__wait(dt__op *op, dt__xfer *x);
dt_status dt__waitall(dt__op *op, dt__xfer *xs, int n);
/* Send and receive at once (either peer may be -1). */
dt_status dt__sendrecv(dt__op *op, int to, const void *sbuf, size_t slen, int from, void *rbuf,
                       size_t rlen);
/* Wait until pred(arg) is true, driving every transport meanwhile. */
dt_status dt__wait_pred(dt__op *op, bool (*pred)(void *), void *arg);
/* The same, for a predicate on shared memory rather than on transfers:
 * behind(arg, ranks, max) lists the group ranks it still waits for, which
 * a timeout names (transfers name their own peers). */
dt_status dt__wait_pred_from(dt__op *op, bool (*pred)(void *), int (*behind)(void *, int *, int),
                             void *arg);
/* Prefix the current error with the call it happened in ("allreduce #7
 * (count ...) on rank 2: ..."); returns st. Waits do it themselves; an
 * algorithm calls it for a failure outside a wait. */
dt_status dt__op_error(dt__op *op, dt_status st);

/* ------------------------------------------------------------------------ */
/* Reduction helpers (reduce.c)                                             */
/* ------------------------------------------------------------------------ */

/* buf[i] /= n (AVG finalisation), dtype-aware. */
void dt__scale_avg(void *buf, size_t n, dt_dtype dtype, int ranks);

/* ------------------------------------------------------------------------ */
/* Transports (shm.c, tcp.c)                                                */
/* ------------------------------------------------------------------------ */

/* Connect to `peers` (group ranks, sorted, excluding me) through the store. */
dt_status dt__shm_create(dt_group *g, const int *peers, int npeers, dt__transport **out);
dt_status dt__tcp_create(dt_group *g, const int *peers, int npeers, dt__transport **out);

/* ------------------------------------------------------------------------ */
/* Algorithms                                                               */
/* ------------------------------------------------------------------------ */

/* Allreduce over a team; send may equal recv. AVG is summed (the caller
 * scales once). */
dt_status dt__ring_allreduce(dt__op *op, const dt__team *t, const void *send, void *recv,
                             size_t count);
/* Reduce-scatter over a team: send holds t->n blocks described by
 * counts/displs (elements); rank me's reduced block lands in recv. */
dt_status dt__ring_reduce_scatter(dt__op *op, const dt__team *t, const void *send, void *recv,
                                  const size_t *counts, const size_t *displs);
/* Allgather over a team: buf holds all blocks, mine already in place. */
dt_status dt__ring_allgather(dt__op *op, const dt__team *t, void *buf, const size_t *counts,
                             const size_t *displs);
dt_status dt__rhd_allreduce(dt__op *op, const dt__team *t, const void *send, void *recv,
                            size_t count);
/* Allgather by recursive doubling over a power-of-two team: block b
 * (`block` bytes) of buf comes from rank b; mine (may be buf's own block)
 * is this rank's. */
dt_status dt__rhd_allgather(dt__op *op, const dt__team *t, const void *mine, void *buf,
                            size_t block);
/* Broadcast along a binomial tree; with `agree`, every rank also hears
 * every other's descriptor on the way (tree.c), so no rank finishes a call
 * that another made differently. */
dt_status dt__tree_broadcast(dt__op *op, const dt__team *t, void *buf, size_t bytes, int root,
                             bool agree);
dt_status dt__tree_reduce(dt__op *op, const dt__team *t, const void *send, void *recv, size_t count,
                          int root);
dt_status dt__direct_allreduce(dt__op *op, const dt__team *t, const void *send, void *recv,
                               size_t count);
dt_status dt__direct_reduce_scatter(dt__op *op, const dt__team *t, const void *send, void *recv,
                                    size_t count);
dt_status dt__direct_allgather(dt__op *op, const dt__team *t, const void *send, void *recv,
                               size_t count);
dt_status dt__direct_broadcast(dt__op *op, const dt__team *t, void *buf, size_t bytes, int root);
dt_status dt__hier_allreduce(dt__op *op, const void *send, void *recv, size_t count);
/* 2D torus over the grid of DT_TORUS_X, or of hosts x ranks per host
 * (torus2d.c); _ok says whether a grid fits the group. */
dt_status dt__torus2d_allreduce(dt__op *op, const void *send, void *recv, size_t count);
bool dt__torus2d_ok(const dt_group *g);
/* Rank-ordered reductions (ordered.c): bits depend only on the inputs and
 * the team size. Reduce-scatter has the group layout (count per rank). */
dt_status dt__ordered_allreduce(dt__op *op, const dt__team *t, const void *send, void *recv,
                                size_t count);
dt_status dt__ordered_reduce_scatter(dt__op *op, const dt__team *t, const void *send, void *recv,
                                     size_t count);
/* True if every member of the team shares memory with me. */
dt_status dt__direct_barrier(dt__op *op, const dt__team *t);
bool dt__team_shared(dt__op *op, const dt__team *t);
bool dt__hier_ok(const dt_group *g);

/* Chooser (tune.c). */
dt_algo dt__tune_choose(const dt_group *g, dt_coll coll, size_t bytes);

#endif /* DTRAIN_COMM_INTERNAL_H */
