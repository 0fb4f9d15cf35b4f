/*
 * test_comm_mailbox.c — tagged messages and receives from any source
 * (dt_mailbox, comm.h) as real processes, on shared memory and on TCP:
 *
 *   order_*    rank 0 sends tags 0..11 of every size class (0, 1 byte, odd
 *              counts, the eager limit and one byte past it, 4 MiB) to rank
 *              1, which receives them in reverse tag order; then 50 messages
 *              with one tag arrive in the order sent (no overtaking).
 *   fanin_*    5 ranks: every other rank sends 40 messages with its own
 *              sequence numbers and random tags 0..3 to rank 0, which takes
 *              them with DT_ANY_SOURCE / DT_ANY_TAG: each exactly once, each
 *              source's in order, with the right source, tag and count.
 *   mixed_*    messages and the group's own collectives and in-order
 *              send/recv on the same group, interleaved, with a receive
 *              pending across an allreduce, and a second thread messaging
 *              while the main thread runs collectives.
 *   self       sends to this very rank, before and after the receive.
 *   threads    4 threads per rank send and receive at once (TSan).
 *   truncate   a message larger than its receive: DT_ERR_MISMATCH naming
 *              both sizes, the sender then fails with DT_ERR_PEER; a dtype
 *              mismatch likewise; bad arguments refused naming them.
 *   killed_*   a sender SIGKILLed: a receive from any source and one from
 *              the dead rank fail with DT_ERR_PEER naming it within 3 s.
 *   timeout    DT_TIMEOUT=1: a receive nobody answers fails in ~1 s naming
 *              the rank it waited for.
 *   closed     a rank destroys its mailbox: a receive from it fails ("closed
 *              its mailbox"), messages between the others go on.
 */
#include "harness.h"

#include <pthread.h>
#include <signal.h>

static dt_group *world(void) {
    dt_group *g = NULL;
    ASSERT_OK(dt_group_init_from_env(&g));
    return g;
}

static dt_mailbox *mailbox(dt_group *g) {
    dt_mailbox *mb = NULL;
    ASSERT_OK(dt_mailbox_create(&mb, g));
    ASSERT_EQ(dt_mailbox_rank(mb), dt_group_rank(g));
    ASSERT_EQ(dt_mailbox_size(mb), dt_group_size(g));
    return mb;
}

/* Byte j of message `tag` from `src`. */
static unsigned char pattern(int src, int tag, size_t j) {
    return (unsigned char)(src * 131 + tag * 31 + j * 7 + (j >> 9));
}

static void fill(unsigned char *b, size_t n, int src, int tag) {
    for (size_t j = 0; j < n; j++)
        b[j] = pattern(src, tag, j);
}

static void expect(const unsigned char *b, size_t n, int src, int tag) {
    for (size_t j = 0; j < n; j++)
        if (b[j] != pattern(src, tag, j))
            TEST_FAILF("message tag %d from rank %d: byte %zu is %u, expected %u", tag, src, j,
                       b[j], pattern(src, tag, j));
}

/* Bytes of message tag t: every size class, the rendezvous ones included. */
static const size_t sizes[] = {0, 1, 7, 4001, 65535, 65536, 65537, 100003, 4 << 20, 3, 0, 999};
#define NSIZES ((int)(sizeof sizes / sizeof *sizes))

static void order_case(int rank, int size) {
    (void)size;
    dt_group *g = world();
    dt_mailbox *mb = mailbox(g);
    if (rank == 0) {
        unsigned char *b[NSIZES];
        dt_work *w[NSIZES];
        for (int t = 0; t < NSIZES; t++) {
            b[t] = malloc(sizes[t] + 1);
            fill(b[t], sizes[t], 0, t);
            ASSERT_OK(dt_mailbox_isend(mb, b[t], sizes[t], DT_U8, 1, t, &w[t]));
        }
        for (int t = NSIZES - 1; t >= 0; t--) {
            ASSERT_OK(dt_work_wait(w[t]));
            free(b[t]);
        }
        for (int k = 0; k < 50; k++) {
            int32_t v[3] = {k, -k, 7 * k};
            ASSERT_OK(dt_mailbox_send(mb, v, 3, DT_I32, 1, 99));
        }
    } else if (rank == 1) {
        for (int t = NSIZES - 1; t >= 0; t--) {
            unsigned char *b = malloc(sizes[t] + 16);
            dt_msg_info info;
            ASSERT_OK(dt_mailbox_recv(mb, b, sizes[t] + 16, DT_U8, 0, t, &info));
            ASSERT_EQ(info.source, 0);
            ASSERT_EQ(info.tag, t);
            ASSERT_EQ(info.count, sizes[t]);
            expect(b, sizes[t], 0, t);
            free(b);
        }
        for (int k = 0; k < 50; k++) {
            int32_t v[4] = {0};
            dt_msg_info info;
            ASSERT_OK(dt_mailbox_recv(mb, v, 4, DT_I32, DT_ANY_SOURCE, 99, &info));
            ASSERT_EQ(info.count, 3u);
            ASSERT_EQ(v[0], k);
            ASSERT_EQ(v[2], 7 * k);
        }
    }
    ASSERT_OK(dt_group_barrier(g));
    dt_mailbox_destroy(mb);
    dt_group_destroy(g);
}

enum { FAN_MSGS = 40 };

static void fanin_case(int rank, int size) {
    dt_group *g = world();
    dt_mailbox *mb = mailbox(g);
    if (rank != 0) {
        dt_rng r;
        dt_rng_init(&r, 11, dt_rng_stream_id((uint64_t)rank, 0, DT_RNG_TEST));
        int64_t msg[FAN_MSGS][64];
        dt_work *w[FAN_MSGS];
        for (int k = 0; k < FAN_MSGS; k++) {
            /* count 2 + (k mod 5) * 13 (odd sizes), some past the eager limit */
            size_t count = k % 9 == 8 ? 9000 : 2 + (size_t)(k % 5) * 13;
            int64_t *v = count <= 64 ? msg[k] : malloc(count * sizeof *v);
            v[0] = rank;
            v[1] = k;
            for (size_t j = 2; j < count; j++)
                v[j] = rank * 1000000 + k * 1000 + (int64_t)j;
            int tag = (int)(dt_rng_u64(&r) % 4);
            ASSERT_OK(dt_mailbox_isend(mb, v, count, DT_I64, 0, tag, &w[k]));
            if (count > 64) {
                ASSERT_OK(dt_work_wait(w[k]));
                w[k] = NULL;
                free(v);
            }
        }
        for (int k = 0; k < FAN_MSGS; k++)
            if (w[k])
                ASSERT_OK(dt_work_wait(w[k]));
    } else {
        int next[64] = {0};
        int64_t *v = malloc(9000 * sizeof *v);
        for (int got = 0; got < (size - 1) * FAN_MSGS; got++) {
            dt_msg_info info;
            ASSERT_OK(dt_mailbox_recv(mb, v, 9000, DT_I64, DT_ANY_SOURCE, DT_ANY_TAG, &info));
            int src = info.source, k = (int)v[1];
            ASSERT_TRUE(src >= 1 && src < size);
            ASSERT_EQ(v[0], (int64_t)src);
            ASSERT_TRUE(info.tag >= 0 && info.tag < 4);
            size_t count = k % 9 == 8 ? 9000 : 2 + (size_t)(k % 5) * 13;
            ASSERT_EQ(info.count, count);
            for (size_t j = 2; j < count; j++)
                ASSERT_EQ(v[j], src * 1000000 + k * 1000 + (int64_t)j);
            /* one source's messages: in order (tags aside, each comes once) */
            if (k < next[src])
                TEST_FAILF("message %d of rank %d came twice or out of order", k, src);
            next[src] = k + 1;
        }
        for (int s = 1; s < size; s++)
            ASSERT_EQ(next[s], FAN_MSGS);
        free(v);
    }
    ASSERT_OK(dt_group_barrier(g));
    dt_mailbox_destroy(mb);
    dt_group_destroy(g);
}

typedef struct side {
    dt_mailbox *mb;
    int rank, size, iters;
} side;

/* The second thread of mixed_*: a ring of messages with tag 5. */
static void *ring_thread(void *arg) {
    side *s = arg;
    for (int it = 0; it < s->iters; it++) {
        double out[33], in[40];
        for (int j = 0; j < 33; j++)
            out[j] = s->rank * 100 + it + j * 0.5;
        dt_work *rw, *sw;
        int from = (s->rank + s->size - 1) % s->size;
        ASSERT_OK(dt_mailbox_irecv(s->mb, in, 40, DT_F64, from, 5, NULL, &rw));
        ASSERT_OK(dt_mailbox_isend(s->mb, out, 33, DT_F64, (s->rank + 1) % s->size, 5, &sw));
        ASSERT_OK(dt_work_wait(sw));
        ASSERT_OK(dt_work_wait(rw));
        for (int j = 0; j < 33; j++)
            ASSERT_EQ(in[j], from * 100 + it + j * 0.5);
    }
    return NULL;
}

static void mixed_case(int rank, int size) {
    dt_group *g = world();
    dt_mailbox *mb = mailbox(g);
    side s = {mb, rank, size, 200};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, ring_thread, &s), 0);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (int it = 0; it < 30; it++) {
        /* a receive from any rank pending across the group's collectives */
        int32_t got[2] = {0};
        dt_msg_info info;
        dt_work *rw;
        ASSERT_OK(dt_mailbox_irecv(mb, got, 2, DT_I32, DT_ANY_SOURCE, 7, &info, &rw));
        float v[1000];
        for (int j = 0; j < 1000; j++)
            v[j] = (float)(rank + j);
        ASSERT_OK(dt_group_allreduce(g, v, v, 1000, DT_F32, DT_SUM));
        ASSERT_EQ(v[3], (float)(size * (size - 1) / 2 + 3 * size));
        int32_t mine[2] = {rank, it};
        ASSERT_OK(dt_mailbox_send(mb, mine, 2, DT_I32, right, 7));
        /* the group's in-order point to point in between */
        int32_t a = rank * 10 + it, b = -1;
        dt_p2p ops[2] = {{.send = true, .buf = &a, .count = 1, .dtype = DT_I32, .peer = right},
                         {.send = false, .buf = &b, .count = 1, .dtype = DT_I32, .peer = left}};
        ASSERT_OK(dt_group_sendrecv_batch(g, ops, 2));
        ASSERT_EQ(b, left * 10 + it);
        ASSERT_OK(dt_work_wait(rw));
        ASSERT_EQ(info.source, left);
        ASSERT_EQ(got[0], left);
        ASSERT_EQ(got[1], it);
        ASSERT_OK(dt_group_barrier(g));
    }
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_OK(dt_group_barrier(g));
    dt_mailbox_destroy(mb);
    dt_group_destroy(g);
}

static void self_case(int rank, int size) {
    (void)size;
    dt_group *g = world();
    dt_mailbox *mb = mailbox(g);
    size_t big = 1 << 20;
    unsigned char *a = malloc(big), *b = malloc(big);
    fill(a, big, rank, 3);
    /* small before the receive (copied aside), large before it (waits) */
    dt_work *w1, *w2;
    ASSERT_OK(dt_mailbox_isend(mb, a, 100, DT_U8, rank, 2, &w1));
    ASSERT_OK(dt_work_wait(w1));
    ASSERT_OK(dt_mailbox_isend(mb, a, big, DT_U8, rank, 3, &w2));
    bool done = true;
    ASSERT_OK(dt_work_test(w2, &done));
    ASSERT_TRUE(!done); /* a large send to itself waits for its receive */
    dt_msg_info info;
    ASSERT_OK(dt_mailbox_recv(mb, b, big, DT_U8, rank, 3, &info));
    ASSERT_OK(dt_work_wait(w2));
    expect(b, big, rank, 3);
    ASSERT_OK(dt_mailbox_recv(mb, b, 200, DT_U8, DT_ANY_SOURCE, DT_ANY_TAG, &info));
    ASSERT_EQ(info.count, 100u);
    ASSERT_EQ(info.tag, 2);
    expect(b, 100, rank, 3); /* the first 100 bytes of a */
    /* the receive first */
    ASSERT_OK(dt_mailbox_irecv(mb, b, big, DT_U8, rank, 4, &info, &w1));
    ASSERT_OK(dt_mailbox_send(mb, a, big, DT_U8, rank, 4));
    ASSERT_OK(dt_work_wait(w1));
    expect(b, big, rank, 3);
    free(a);
    free(b);
    ASSERT_OK(dt_group_barrier(g));
    dt_mailbox_destroy(mb);
    dt_group_destroy(g);
}

static void *thread_main(void *arg) {
    side *s = arg;
    int me = s->iters; /* thread index */
    for (int it = 0; it < 100; it++) {
        int to = (s->rank + 1 + it) % s->size; /* a permutation per iteration */
        int64_t out[2] = {s->rank, it}, in[2];
        dt_work *rw, *sw;
        dt_msg_info info;
        ASSERT_OK(dt_mailbox_irecv(s->mb, in, 2, DT_I64, DT_ANY_SOURCE, 10 + me, &info, &rw));
        ASSERT_OK(dt_mailbox_isend(s->mb, out, 2, DT_I64, to, 10 + me, &sw));
        ASSERT_OK(dt_work_wait(sw));
        ASSERT_OK(dt_work_wait(rw));
        ASSERT_EQ(in[0], (int64_t)info.source);
        ASSERT_TRUE(in[1] >= 0 && in[1] < 100);
    }
    return NULL;
}

static void threads_case(int rank, int size) {
    dt_group *g = world();
    dt_mailbox *mb = mailbox(g);
    side s[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        s[i] = (side){mb, rank, size, i};
        ASSERT_EQ(pthread_create(&th[i], NULL, thread_main, &s[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    ASSERT_OK(dt_group_barrier(g));
    dt_mailbox_destroy(mb);
    dt_group_destroy(g);
}

static void truncate_case(int rank, int size) {
    (void)size;
    dt_group *g = world();
    dt_mailbox *mb = mailbox(g);
    /* bad arguments first: refused at once, naming the value */
    float x[4];
    dt_work *w = NULL;
    ASSERT_STATUS(dt_mailbox_isend(mb, x, 4, DT_F32, 7, 0, &w), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "dest 7");
    ASSERT_STATUS(dt_mailbox_isend(mb, x, 4, DT_F32, 0, DT_ANY_TAG, &w), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "tag -1");
    ASSERT_STATUS(dt_mailbox_irecv(mb, x, 4, DT_F32, -5, 0, NULL, &w), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "source -5");
    ASSERT_STATUS(dt_mailbox_irecv(mb, NULL, 4, DT_F32, 0, 0, NULL, &w), DT_ERR_INVALID);
    ASSERT_OK(dt_group_barrier(g));
    if (rank == 0) {
        float big[1000] = {0};
        dt_status st = dt_mailbox_send(mb, big, 1000, DT_F32, 1, 3); /* eager: may complete */
        ASSERT_TRUE(st == DT_OK || st == DT_ERR_MISMATCH);
        /* rank 1's mailbox failed: the next operation here learns it */
        double t0 = dt_now();
        float one;
        st = dt_mailbox_recv(mb, &one, 1, DT_F32, 1, 4, NULL);
        ASSERT_EQ(st, DT_ERR_MISMATCH);
        printf("rank 0 after the truncation (%.2f s): %s\n", dt_now() - t0, dt_last_error());
        ASSERT_CONTAINS(dt_last_error(), "rank 1");
    } else if (rank == 1) {
        float small[100];
        ASSERT_STATUS(dt_mailbox_recv(mb, small, 100, DT_F32, 0, 3, NULL), DT_ERR_MISMATCH);
        printf("rank 1: %s\n", dt_last_error());
        ASSERT_CONTAINS(dt_last_error(), "4000 bytes");
        ASSERT_CONTAINS(dt_last_error(), "room for 400 bytes");
        /* sticky */
        ASSERT_STATUS(dt_mailbox_recv(mb, small, 1, DT_F32, 0, 4, NULL), DT_ERR_MISMATCH);
    }
    ASSERT_OK(dt_group_barrier(g));
    dt_mailbox_destroy(mb);
    /* dtype: f32 sent, i32 expected */
    mb = mailbox(g);
    if (rank == 0) {
        float f[3] = {1, 2, 3};
        dt_status st = dt_mailbox_send(mb, f, 3, DT_F32, 2, 1);
        ASSERT_TRUE(st == DT_OK || st == DT_ERR_MISMATCH);
    } else if (rank == 2) {
        int32_t i[3];
        ASSERT_STATUS(dt_mailbox_recv(mb, i, 3, DT_I32, 0, 1, NULL), DT_ERR_MISMATCH);
        printf("rank 2: %s\n", dt_last_error());
        ASSERT_CONTAINS(dt_last_error(), "3 f32");
        ASSERT_CONTAINS(dt_last_error(), "i32");
    }
    ASSERT_OK(dt_group_barrier(g));
    dt_mailbox_destroy(mb);
    dt_group_destroy(g);
}

enum { VICTIM = 2 };

static void killed_case(int rank, int size) {
    (void)size;
    dt_group *g = world();
    dt_mailbox *mb = mailbox(g);
    int32_t v[256];
    if (rank == VICTIM) {
        for (int k = 0; k < 3; k++) {
            v[0] = k;
            ASSERT_OK(dt_mailbox_send(mb, v, 256, DT_I32, 0, 1));
        }
        dt_sleep_ms(200);
        kill(getpid(), SIGKILL);
    }
    if (rank == 0) {
        for (int k = 0; k < 3; k++) {
            ASSERT_OK(dt_mailbox_recv(mb, v, 256, DT_I32, DT_ANY_SOURCE, 1, NULL));
            ASSERT_EQ(v[0], k);
        }
    }
    /* rank 0 waits for anyone, rank 1 for the victim itself */
    double t0 = dt_now();
    dt_status st = dt_mailbox_recv(mb, v, 256, DT_I32, rank == 0 ? DT_ANY_SOURCE : VICTIM, 2, NULL);
    double took = dt_now() - t0;
    printf("rank %d: %s after %.2f s: %s\n", rank, dt_status_name(st), took, dt_last_error());
    ASSERT_EQ(st, DT_ERR_PEER);
    ASSERT_CONTAINS(dt_last_error(), "rank 2");
    ASSERT_TRUE(took < 3.0);
    /* sticky: a send to a live rank fails too */
    ASSERT_EQ(dt_mailbox_send(mb, v, 1, DT_I32, 1 - rank, 3), DT_ERR_PEER);
    dt_mailbox_destroy(mb);
    /* the world has a dead member too: its next call says so (and the
     * group then leaves without waiting for the dead rank's goodbye) */
    ASSERT_EQ(dt_group_barrier(g), DT_ERR_PEER);
    dt_group_destroy(g);
}

static void timeout_case(int rank, int size) {
    (void)size;
    dt_group *g = world();
    dt_mailbox *mb = mailbox(g);
    if (rank == 0) {
        double t0 = dt_now();
        float v;
        dt_status st = dt_mailbox_recv(mb, &v, 1, DT_F32, 1, 9, NULL);
        double took = dt_now() - t0;
        printf("rank 0: %s after %.2f s: %s\n", dt_status_name(st), took, dt_last_error());
        ASSERT_EQ(st, DT_ERR_TIMEOUT);
        ASSERT_CONTAINS(dt_last_error(), "waiting for rank 1");
        ASSERT_CONTAINS(dt_last_error(), "tag 9");
        ASSERT_TRUE(took >= 0.9 && took < 4.0);
    } else {
        dt_sleep_ms(1500); /* the barrier below has DT_TIMEOUT=1 too */
    }
    ASSERT_OK(dt_group_barrier(g));
    dt_mailbox_destroy(mb);
    dt_group_destroy(g);
}

static void closed_case(int rank, int size) {
    (void)size;
    dt_group *g = world();
    dt_mailbox *mb = mailbox(g);
    if (rank == 1) {
        dt_mailbox_destroy(mb);
        mb = NULL;
    } else {
        float v = 0;
        dt_work *w;
        ASSERT_OK(dt_mailbox_irecv(mb, &v, 1, DT_F32, 1, 0, NULL, &w));
        dt_status st = dt_work_wait(w);
        ASSERT_EQ(st, DT_ERR_PEER);
        ASSERT_CONTAINS(dt_last_error(), "rank 1 closed its mailbox");
        ASSERT_EQ(dt_mailbox_send(mb, &v, 1, DT_F32, 1, 0), DT_ERR_PEER);
        /* the others still talk */
        float mine = (float)rank, got = -1;
        int other = rank == 0 ? 2 : 0;
        ASSERT_OK(dt_mailbox_irecv(mb, &got, 1, DT_F32, DT_ANY_SOURCE, 1, NULL, &w));
        ASSERT_OK(dt_mailbox_send(mb, &mine, 1, DT_F32, other, 1));
        ASSERT_OK(dt_work_wait(w));
        ASSERT_EQ(got, (float)other);
    }
    ASSERT_OK(dt_group_barrier(g));
    dt_mailbox_destroy(mb);
    dt_group_destroy(g);
}

#define SHM "DT_TRANSPORT=shm"
#define TCP "DT_TRANSPORT=tcp"

int main(int argc, char **argv) {
    static const hcase cases[] = {
        {"order_shm", 2, order_case, {SHM}, -1, 60},
        {"order_tcp", 2, order_case, {TCP}, -1, 60},
        {"fanin_shm", 5, fanin_case, {SHM}, -1, 60},
        {"fanin_tcp", 5, fanin_case, {TCP}, -1, 60},
        {"mixed_shm", 3, mixed_case, {SHM}, -1, 60},
        {"mixed_tcp", 3, mixed_case, {TCP, "DT_TCP_SOCKS=2"}, -1, 60},
        {"self", 2, self_case, {0}, -1, 60},
        {"threads", 3, threads_case, {0}, -1, 60},
        {"truncate", 3, truncate_case, {0}, -1, 60},
        {"killed_shm", 3, killed_case, {SHM}, VICTIM, 60},
        {"killed_tcp", 3, killed_case, {TCP}, VICTIM, 60},
        {"timeout", 2, timeout_case, {"DT_TIMEOUT=1"}, -1, 60},
        {"closed", 3, closed_case, {0}, -1, 60},
    };
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof *cases));
}
