/*
 * test_trace.c — the recorder of dtrain/trace.h: nothing is recorded while
 * it is off; regions come back in order with their fields; a full ring
 * keeps the newest events and counts the dropped ones; threads record
 * into rings of their own, concurrently (the test runs under TSan too);
 * only the outermost kernel outside parallel regions is a region; the
 * injected clock skew; collectives and their waits as comm events with
 * the group's number, sequence, bytes and algorithm.
 */
#include "dtrain/comm.h"
#include "dtrain/trace.h"
#include "test.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void test_off_records_nothing(void) {
    dt_trace_reset();
    dt_trace_enable(false);
    ASSERT_EQ(dt_trace_begin(), 0);
    dt_trace_end(dt_trace_begin(), DT_TRACE_COMPUTE, "x", -1, 1, 1);
    dt_trace_thread th[4];
    ASSERT_EQ(dt_trace_threads(th, 4), 0);
}

static void test_regions_in_order(void) {
    dt_trace_reset();
    ASSERT_OK(dt_trace_configure(1024));
    dt_trace_enable(true);
    dt_trace_name_thread("tester");
    for (int i = 0; i < 10; i++) {
        uint64_t t = dt_trace_begin();
        ASSERT_TRUE(t != 0);
        dt_trace_end(t, DT_TRACE_COMPUTE, "kernel", i, 100u * (uint64_t)i, 7);
    }
    dt_trace_enable(false);
    dt_trace_thread th[4];
    ASSERT_EQ(dt_trace_threads(th, 4), 1);
    ASSERT_STREQ(th[0].name, "tester");
    ASSERT_EQ(th[0].recorded, 10);
    ASSERT_EQ(th[0].dropped, 0);
    dt_trace_event *ev;
    size_t n;
    ASSERT_OK(dt_trace_copy(th[0].index, &ev, &n));
    ASSERT_EQ(n, 10);
    for (size_t i = 0; i < n; i++) {
        ASSERT_STREQ(ev[i].name, "kernel");
        ASSERT_EQ(ev[i].idx, (int32_t)i);
        ASSERT_EQ(ev[i].flops, 100u * i);
        ASSERT_EQ(ev[i].bytes, 7);
        ASSERT_EQ(ev[i].cat, DT_TRACE_COMPUTE);
        ASSERT_TRUE(ev[i].t1 >= ev[i].t0);
        if (i)
            ASSERT_TRUE(ev[i].t0 >= ev[i - 1].t1);
    }
    free(ev);
    ASSERT_STATUS(dt_trace_copy(5, &ev, &n), DT_ERR_NOT_FOUND);
    ASSERT_STATUS(dt_trace_configure(10), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "10 events");
}

static void test_ring_keeps_newest(void) {
    dt_trace_reset();
    ASSERT_OK(dt_trace_configure(64));
    dt_trace_enable(true);
    for (int i = 0; i < 200; i++)
        dt_trace_end(dt_trace_begin(), DT_TRACE_DATA, "batch", i, 0, 0);
    dt_trace_enable(false);
    dt_trace_thread th[2];
    ASSERT_EQ(dt_trace_threads(th, 2), 1);
    ASSERT_EQ(th[0].recorded, 200);
    ASSERT_EQ(th[0].dropped, 136);
    dt_trace_event *ev;
    size_t n;
    ASSERT_OK(dt_trace_copy(0, &ev, &n));
    ASSERT_EQ(n, 64);
    for (size_t i = 0; i < n; i++)
        ASSERT_EQ(ev[i].idx, (int32_t)(136 + i));
    free(ev);
}

#define THREADS 4
#define PER     5000

static void *recorder(void *arg) {
    char name[16];
    snprintf(name, sizeof name, "worker %d", (int)(intptr_t)arg);
    dt_trace_name_thread(name);
    for (int i = 0; i < PER; i++)
        dt_trace_end(dt_trace_begin(), DT_TRACE_COMPUTE, "work", (int)(intptr_t)arg, (uint64_t)i,
                     0);
    return NULL;
}

static void test_threads(void) {
    dt_trace_reset();
    ASSERT_OK(dt_trace_configure(PER));
    dt_trace_enable(true);
    pthread_t t[THREADS];
    for (intptr_t i = 0; i < THREADS; i++)
        ASSERT_EQ(pthread_create(&t[i], NULL, recorder, (void *)i), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    dt_trace_enable(false);
    dt_trace_thread th[THREADS + 1];
    ASSERT_EQ(dt_trace_threads(th, THREADS + 1), THREADS);
    bool seen[THREADS] = {false};
    for (int i = 0; i < THREADS; i++) {
        ASSERT_EQ(th[i].recorded, PER);
        ASSERT_EQ(th[i].dropped, 0);
        dt_trace_event *ev;
        size_t n;
        ASSERT_OK(dt_trace_copy(th[i].index, &ev, &n));
        ASSERT_EQ(n, PER);
        int who = ev[0].idx;
        ASSERT_TRUE(who >= 0 && who < THREADS && !seen[who]);
        seen[who] = true;
        char want[16];
        snprintf(want, sizeof want, "worker %d", who);
        ASSERT_STREQ(th[i].name, want);
        for (size_t k = 0; k < n; k++) {
            ASSERT_EQ(ev[k].idx, who);
            ASSERT_EQ(ev[k].flops, k);
        }
        free(ev);
    }
}

static void test_kernel_nesting(void) {
    dt_trace_reset();
    ASSERT_OK(dt_trace_configure(64));
    dt_trace_enable(true);
    uint64_t outer = dt_trace_kernel_enter(dt_trace_begin(), false);
    ASSERT_TRUE(outer != 0);
    ASSERT_EQ(dt_trace_kernel_enter(dt_trace_begin(), false), 0); /* nested: not recorded */
    dt_trace_kernel_end(outer, DT_TRACE_COMPUTE, "outer", 10, 20);
    ASSERT_EQ(dt_trace_kernel_enter(dt_trace_begin(), true), 0); /* in a parallel region */
    uint64_t again = dt_trace_kernel_enter(dt_trace_begin(), false);
    ASSERT_TRUE(again != 0); /* the depth went back to 0 */
    dt_trace_kernel_end(again, DT_TRACE_CAST, "cast", 0, 6);
    dt_trace_enable(false);
    dt_trace_event *ev;
    size_t n;
    ASSERT_OK(dt_trace_copy(0, &ev, &n));
    ASSERT_EQ(n, 2);
    ASSERT_STREQ(ev[0].name, "outer");
    ASSERT_EQ(ev[0].flops, 10);
    ASSERT_EQ(ev[1].cat, DT_TRACE_CAST);
    free(ev);
}

static void test_clock_fault(void) {
    uint64_t a = dt_trace_now();
    dt_trace_set_clock_fault(1000000000, 0);
    uint64_t b = dt_trace_now();
    dt_trace_set_clock_fault(0, 0);
    uint64_t c = dt_trace_now();
    ASSERT_TRUE(b > a + 999000000u && b < a + 1100000000u);
    ASSERT_TRUE(c < b && c >= a);
    /* 1e5 ppm: 0.1 ns per ns */
    dt_trace_set_clock_fault(0, 1e5);
    uint64_t r0 = dt_now_ns(), d0 = dt_trace_now();
    dt_sleep_ms(20);
    uint64_t d1 = dt_trace_now(), r1 = dt_now_ns();
    dt_trace_set_clock_fault(0, 0);
    double ratio = (double)(d1 - d0) / (double)(r1 - r0);
    ASSERT_NEAR(ratio, 1.1, 0.01, 0);
}

/* A collective, a non-blocking one and its wait on a world of one. */
static void test_comm_events(void) {
    dt_group *g;
    ASSERT_OK(dt_group_init(&g, &(dt_group_options){.rank = 0, .size = 1}));
    dt_trace_reset();
    ASSERT_OK(dt_trace_configure(256));
    dt_trace_enable(true);
    float x[100] = {0};
    ASSERT_OK(dt_group_allreduce(g, x, x, 100, DT_F32, DT_SUM));
    dt_work *w;
    ASSERT_OK(dt_group_iallreduce(g, x, x, 50, DT_F32, DT_SUM, &w));
    ASSERT_OK(dt_work_wait(w));
    dt_trace_enable(false);
    dt_trace_thread th[8];
    size_t nt = dt_trace_threads(th, 8);
    int comm = 0;
    for (size_t i = 0; i < nt && i < 8; i++) {
        dt_trace_event *ev;
        size_t n;
        ASSERT_OK(dt_trace_copy(th[i].index, &ev, &n));
        for (size_t k = 0; k < n; k++) {
            if (ev[k].cat != DT_TRACE_COMM)
                continue;
            ASSERT_STREQ(ev[k].name, "allreduce");
            ASSERT_TRUE(ev[k].bytes == 400 || ev[k].bytes == 200);
            ASSERT_EQ(ev[k].seq, ev[k].bytes == 400 ? 1 : 2);
            ASSERT_EQ(ev[k].ranks, 1);
            ASSERT_EQ(ev[k].link, DT_TRACE_LINK_SELF);
            ASSERT_TRUE(ev[k].t_issue != 0 && ev[k].t_issue <= ev[k].t0);
            comm++;
        }
        free(ev);
    }
    ASSERT_EQ(comm, 2);
    dt_group_destroy(g);
    dt_trace_reset();
}

int main(void) {
    RUN(test_off_records_nothing);
    RUN(test_regions_in_order);
    RUN(test_ring_keeps_newest);
    RUN(test_threads);
    RUN(test_kernel_nesting);
    RUN(test_clock_fault);
    RUN(test_comm_events);
    return TEST_SUMMARY();
}
