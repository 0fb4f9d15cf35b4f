/*
 * test_comm_wire.c — the frame-header decoder under fuzzing, the mismatch
 * checks, the rendezvous store (set/get/wait/add, limits) and the job-token
 * handshake on store and data connections (wrong token refused).
 */
#include "dtrain/comm.h"
#include "test.h"

#include "comm/comm_internal.h"

#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

static dt__wire_hdr valid_hdr(void) {
    return (dt__wire_hdr){.magic = DT__WIRE_MAGIC,
                          .version = DT__WIRE_VERSION,
                          .kind = DT__MSG_DATA,
                          .coll = DT_COLL_ALLREDUCE,
                          .dtype = DT_F32,
                          .redop = DT_SUM,
                          .root = -1,
                          .src = 1,
                          .seq = 5,
                          .count = 1000,
                          .offset = 0,
                          .len = 4000};
}

/* Random bytes, and valid headers with random bytes flipped: the decoder
 * must either refuse or return a header whose every field is in range. */
static void test_fuzz_decoder(void) {
    dt_rng rng;
    dt_rng_init(&rng, 1, dt_rng_stream_id(0, 1, DT_RNG_TEST));
    unsigned char buf[80];
    long accepted = 0;
    for (int it = 0; it < 400000; it++) {
        size_t n = dt_rng_below(&rng, sizeof buf + 1);
        if (it % 2) {
            dt__wire_hdr h = valid_hdr();
            memcpy(buf, &h, sizeof h);
            int flips = 1 + (int)dt_rng_below(&rng, 4);
            for (int f = 0; f < flips; f++)
                buf[dt_rng_below(&rng, sizeof h)] ^= (unsigned char)(1u << dt_rng_below(&rng, 8));
            n = it % 3 ? sizeof h : n;
        } else {
            for (size_t i = 0; i < sizeof buf; i++)
                buf[i] = (unsigned char)dt_rng_u32(&rng);
            if (it % 4 == 0) { /* get past the magic check sometimes */
                uint32_t m = DT__WIRE_MAGIC;
                uint16_t v = DT__WIRE_VERSION;
                memcpy(buf, &m, 4);
                memcpy(buf + 4, &v, 2);
            }
        }
        dt__wire_hdr out;
        dt_status st = dt__wire_decode(buf, n, &out);
        if (st == DT_OK) {
            accepted++;
            ASSERT_TRUE(n >= sizeof out);
            ASSERT_TRUE(out.magic == DT__WIRE_MAGIC && out.version == DT__WIRE_VERSION);
            ASSERT_TRUE(out.kind >= DT__MSG_DATA && out.kind <= DT__MSG_BYE);
            ASSERT_TRUE(out.coll < DT_COLL_COUNT && out.dtype < DT_DTYPE_COUNT);
            ASSERT_TRUE(out.redop < DT_REDOP_COUNT && out.src >= 0);
            ASSERT_TRUE(out.len <= DT__WIRE_MAX_LEN && out.offset <= DT__WIRE_MAX_LEN);
            /* an accepted header still has to match what was posted */
            dt__wire_hdr want = valid_hdr();
            dt_status c = dt__wire_check(&out, &want, 0, out.src, 0, 4000);
            ASSERT_TRUE(c == DT_OK || c == DT_ERR_MISMATCH || c == DT_ERR_PROTOCOL ||
                        c == DT_ERR_PEER || (out.kind == DT__MSG_ABORT));
        } else {
            ASSERT_EQ(st, DT_ERR_PROTOCOL);
        }
    }
    ASSERT_TRUE(accepted > 1000); /* the fuzzer reached the deeper checks */
}

static void test_check(void) {
    dt__wire_hdr want = valid_hdr(), got = valid_hdr();
    want.src = 0;
    ASSERT_OK(dt__wire_check(&got, &want, 0, 1, 0, 4000));
    ASSERT_STATUS(dt__wire_check(&got, &want, 0, 2, 0, 4000), DT_ERR_PROTOCOL); /* wrong link */
    ASSERT_STATUS(dt__wire_check(&got, &want, 0, 1, 0, 3996), DT_ERR_PROTOCOL);
    ASSERT_CONTAINS(dt_last_error(), "expected");
    got.count = 1001;
    ASSERT_STATUS(dt__wire_check(&got, &want, 0, 1, 0, 4000), DT_ERR_MISMATCH);
    ASSERT_CONTAINS(dt_last_error(), "rank 1 called allreduce #5 (count 1001");
    ASSERT_CONTAINS(dt_last_error(), "rank 0 called allreduce #5 (count 1000");
    got = valid_hdr();
    got.coll = DT_COLL_BROADCAST;
    got.root = 0;
    ASSERT_STATUS(dt__wire_check(&got, &want, 0, 1, 0, 4000), DT_ERR_MISMATCH);
    got = valid_hdr();
    got.seq = 6;
    ASSERT_STATUS(dt__wire_check(&got, &want, 0, 1, 0, 4000), DT_ERR_MISMATCH);
    /* early check: a later op is fine, an older or different one is not */
    ASSERT_OK(dt__wire_early(&got, &want, 0, 1));
    got.seq = 4;
    ASSERT_STATUS(dt__wire_early(&got, &want, 0, 1), DT_ERR_MISMATCH);
    got = valid_hdr();
    ASSERT_OK(dt__wire_early(&got, &want, 0, 1));
    got.redop = DT_MAX;
    ASSERT_STATUS(dt__wire_early(&got, &want, 0, 1), DT_ERR_MISMATCH);
    /* send/recv pairing */
    dt__wire_hdr s = valid_hdr(), r = valid_hdr();
    s.coll = DT_COLL_SEND;
    s.root = 0; /* to rank 0 */
    s.tag = 9;
    r.coll = DT_COLL_RECV;
    r.root = 1; /* from rank 1 */
    r.tag = 9;
    r.src = 0;
    ASSERT_OK(dt__wire_check(&s, &r, 0, 1, 0, 4000));
    s.tag = 8;
    ASSERT_STATUS(dt__wire_check(&s, &r, 0, 1, 0, 4000), DT_ERR_MISMATCH);
    /* abort frames carry the sender's status and the lost rank */
    dt__wire_hdr ab = valid_hdr();
    ab.kind = DT__MSG_ABORT;
    ab.status = DT_ERR_PEER;
    ab.root = 3;
    ASSERT_STATUS(dt__wire_check(&ab, &want, 0, 1, 0, 4000), DT_ERR_PEER);
    ASSERT_CONTAINS(dt_last_error(), "rank 3 is lost");
}

static const char TOKEN[] = "00112233445566778899aabbccddeeff";
static const char WRONG[] = "ffeeddccbbaa99887766554433221100";

static void test_store(void) {
    dt__store_server *srv = NULL;
    int port = 0;
    ASSERT_OK(dt__store_server_start("127.0.0.1", 0, TOKEN, &srv, &port));
    dt__store *a = NULL, *b = NULL, *bad = NULL;
    ASSERT_OK(dt__store_connect("127.0.0.1", port, TOKEN, 5, &a));
    ASSERT_OK(dt__store_connect("127.0.0.1", port, TOKEN, 5, &b));
    ASSERT_OK(dt__store_set(a, "k1", "hello", 6));
    void *v = NULL;
    size_t len = 0;
    ASSERT_OK(dt__store_get(b, "k1", &v, &len));
    ASSERT_EQ(len, 6);
    ASSERT_STREQ((char *)v, "hello");
    dt_free(v);
    ASSERT_STATUS(dt__store_get(b, "missing", &v, &len), DT_ERR_NOT_FOUND);
    ASSERT_OK(dt__store_set(a, "k1", "bye", 4)); /* overwrite */
    ASSERT_OK(dt__store_wait(b, "k1", &v, &len));
    ASSERT_STREQ((char *)v, "bye");
    dt_free(v);
    int64_t r = 0;
    ASSERT_OK(dt__store_add(a, "ctr", 5, &r));
    ASSERT_EQ(r, 5);
    ASSERT_OK(dt__store_add(b, "ctr", -2, &r));
    ASSERT_EQ(r, 3);
    /* limits are enforced on the client too */
    char key[2000];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = 0;
    ASSERT_STATUS(dt__store_set(a, key, "x", 1), DT_ERR_INVALID);
    /* wrong token: refused with DT_ERR_AUTH, and the store is untouched */
    ASSERT_STATUS(dt__store_connect("127.0.0.1", port, WRONG, 5, &bad), DT_ERR_AUTH);
    ASSERT_CONTAINS(dt_last_error(), "token");
    ASSERT_TRUE(bad == NULL);
    /* wait gives up after the client's timeout */
    dt__store *quick = NULL;
    ASSERT_OK(dt__store_connect("127.0.0.1", port, TOKEN, 0.3, &quick));
    ASSERT_STATUS(dt__store_wait(quick, "never", &v, &len), DT_ERR_TIMEOUT);
    ASSERT_CONTAINS(dt_last_error(), "never");
    dt__store_close(quick);
    dt__store_close(a);
    dt__store_close(b);
    dt__store_server_stop(srv);
}

/* Raw garbage to the store: the server drops the client and keeps serving. */
static void test_store_garbage(void) {
    dt__store_server *srv = NULL;
    int port = 0, fd;
    ASSERT_OK(dt__store_server_start("127.0.0.1", 0, TOKEN, &srv, &port));
    ASSERT_OK(dt__net_connect("127.0.0.1", port, dt_now() + 5, &fd));
    dt__hs hs = {.purpose = DT__HS_STORE};
    memcpy(hs.token, TOKEN, 32);
    ASSERT_OK(dt__net_hs_client(fd, &hs, dt_now() + 5));
    uint32_t junk[6] = {0x564b5444u, 1, 100000, 0, 0xffffffffu, 0xffffffffu}; /* huge lengths */
    ASSERT_OK(dt__net_write(fd, junk, sizeof junk, dt_now() + 5));
    char c;
    ASSERT_STATUS(dt__net_read(fd, &c, 1, dt_now() + 5), DT_ERR_PEER); /* dropped */
    close(fd);
    dt__store *ok = NULL;
    ASSERT_OK(dt__store_connect("127.0.0.1", port, TOKEN, 5, &ok));
    ASSERT_OK(dt__store_set(ok, "still", "alive", 6));
    dt__store_close(ok);
    dt__store_server_stop(srv);
}

typedef struct srv_arg {
    int lfd;
    dt_status st;
    dt__hs hs;
} srv_arg;

static void *hs_server(void *p) {
    srv_arg *a = p;
    int fd = accept(a->lfd, NULL, NULL);
    a->st = dt__net_hs_server(fd, TOKEN, DT__HS_DATA, &a->hs, dt_now() + 5);
    close(fd);
    return NULL;
}

static void test_data_handshake(void) {
    for (int wrong = 0; wrong < 2; wrong++) {
        int lfd, port, fd;
        ASSERT_OK(dt__net_listen("127.0.0.1", 0, &lfd, &port));
        srv_arg a = {lfd, DT_OK, {0}};
        pthread_t t;
        pthread_create(&t, NULL, hs_server, &a);
        ASSERT_OK(dt__net_connect("127.0.0.1", port, dt_now() + 5, &fd));
        dt__hs hs = {.purpose = DT__HS_DATA, .rank = 3, .index = 1};
        memcpy(hs.token, wrong ? WRONG : TOKEN, 32);
        snprintf(hs.group, sizeof hs.group, "w.0c1");
        dt_status st = dt__net_hs_client(fd, &hs, dt_now() + 5);
        pthread_join(t, NULL);
        close(fd);
        close(lfd);
        if (wrong) {
            ASSERT_STATUS(st, DT_ERR_AUTH);
            ASSERT_EQ(a.st, DT_ERR_AUTH);
        } else {
            ASSERT_OK(st);
            ASSERT_OK(a.st);
            ASSERT_EQ(a.hs.rank, 3);
            ASSERT_STREQ(a.hs.group, "w.0c1");
        }
    }
}

int main(void) {
    RUN(test_fuzz_decoder);
    RUN(test_check);
    RUN(test_store);
    RUN(test_store_garbage);
    RUN(test_data_handshake);
    return TEST_SUMMARY();
}
